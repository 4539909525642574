/* The integer product of an int8 linear layer (attnlab/nn/int8.py) on CPUs with AVX512-VNNI but no AMX (Intel
 * Cascade Lake to Emerald Rapids guests without tiles, AMD Zen 4 and later), with the scaling, the bias and
 * the GELU fused into the store. Part of attnlab; built with the other kernels and called through the checked
 * door of attnlab/nn/kernels.py.
 *
 * y_mn = (sum_k a_mk b_kn) * (s_m * w_n) + bias_n, then GELU if asked (a feed-forward block's up projection),
 * with a (M, K) symmetric int8 activation codes (one scale s_m per row: int8_rows.c's `int8_quantize_rows`,
 * the codes the AMX kernel and `_int_mm` take) and b (K, N) int8 weights (one scale w_n per column), packed
 * once by int8_gemm.c's `int8_pack_b` (with each column's sum).
 *
 * Why not torch's `_int_mm`, which runs oneDNN's VNNI code: as with AMX (int8_amx.c), it packs the weights
 * again on every call and returns int32 sums that another pass scales (and a third applies GELU).
 *
 * vpdpbusd multiplies unsigned bytes by signed bytes, four products summed into each int32 lane, exactly (no
 * int16 step to saturate). The signed codes become unsigned by adding 128 (a flip of the top bit, done once
 * when a chunk of rows is copied), and the sums lose that offset again at the store: sum_k (a_mk + 128) b_kn -
 * 128 colsum_n, still exact in int32 (K * 255 * 128 is far below 2^31 for any layer width here).
 *
 * The packed layout: panels of 16 columns, each quad of k's as 16 columns x 4 bytes, one 64-byte vector. The
 * micro-tile is MR = 6 rows x 64 columns (NB = 4 panels): 24 accumulators, four weight vectors and the
 * broadcast quad in the 32 vector registers, one broadcast load per four products (a tile of 8-12 rows x 32
 * columns, one per two and more row pointers than general registers, ran ~6% slower than `_int_mm` over the
 * MiniLM encoder; this one ~5% faster). Rows go in chunks of ~128 KB, which stay in L2 while every panel
 * passes over them (int8_gemm.c's AVX2 loop, widened).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "int8_chunk.h" /* the argument check, K in quads, rows per chunk */

#define NP 16 /* columns per packed panel */
#define MR 6  /* rows per micro-tile */
#define NB 4  /* panels per micro-tile: 64 columns */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>
#include "gelu512.h" /* gelu_erf16: GELU on 16 lanes */

int int8_vnni_supported(void) { return 1; }

/* one output row's 16 columns n .. n + 15 (the first `cols` of them stored): the offset removed, scaled, bias,
 * GELU if asked */
static inline void store16(__m512i acc, float s, const int32_t *colsum, const float *wscale, const float *bias,
                           int64_t n, int64_t cols, float *out, int32_t act) {
    const __mmask16 keep = cols >= NP ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1);
    const __m512i cs = _mm512_maskz_loadu_epi32(keep, colsum + n);
    const __m512 w = _mm512_maskz_loadu_ps(keep, wscale + n);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + n) : _mm512_setzero_ps();
    const __m512i exact = _mm512_sub_epi32(acc, _mm512_slli_epi32(cs, 7)); /* minus 128 colsum */
    __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(_mm512_set1_ps(s), w), b);
    if (act) v = gelu_erf16(v);
    _mm512_mask_storeu_ps(out + n, keep, v);
}

/* rows [start, end) of y (M, N) = a (M, K) x packed b, scaled: the door splits the rows over threads.
 * Returns -1 on arguments the door would have refused, -2 if the rows' buffer cannot be allocated. */
int int8_vnni_gemm(const int8_t *a, const float *ascale, int64_t M, int64_t K, const int8_t *bp,
                   const int32_t *colsum, const float *wscale, const float *bias, int64_t N, float *y, int32_t act,
                   int64_t start, int64_t end) {
    if (int8_bad_args(M, K, N, act, start, end)) return -1;
    if (start == end || N == 0) return 0;
    const int64_t kq = int8_quads(K), chunk = int8_row_chunk(kq, MR);
    /* a chunk's rows as unsigned codes, each padded to kq quads (code 128 = 0 there: the packed weights are 0
     * past K, so the padding adds nothing), and MR - 1 rows more, which a last partial tile reads and does not
     * store: the tile then takes no branch */
    uint8_t *rows = malloc((size_t)((chunk + MR - 1) * (kq ? kq : 1) * 4));
    if (!rows) return -2;
    memset(rows, 0x80, (size_t)((chunk + MR - 1) * (kq ? kq : 1) * 4));
    const int64_t panel = kq * 4 * NP; /* bytes of one packed 16-column panel */
    for (int64_t mc = start; mc < end; mc += chunk) {
        const int64_t mend = end - mc < chunk ? end : mc + chunk;
        for (int64_t m = mc; m < mend; m++) {
            const int8_t *src = a + m * K;
            uint8_t *dst = rows + (m - mc) * kq * 4;
            int64_t k = 0;
            for (; k + 64 <= K; k += 64)
                _mm512_storeu_si512(dst + k, _mm512_xor_si512(_mm512_loadu_si512(src + k), _mm512_set1_epi8((char)0x80)));
            for (; k < K; k++) dst[k] = (uint8_t)(src[k] ^ 0x80);
        }
        for (int64_t n = 0; n < N; n += NB * NP) {
            /* NB panels at a time; past N's last panel the tile reads that panel again and stores nothing */
            const int8_t *pb[NB];
            int64_t cols[NB];
            for (int j = 0; j < NB; j++) {
                const int64_t first = n + j * NP, have = first < N ? first : N - 1;
                pb[j] = bp + (have / NP) * panel;
                cols[j] = first < N ? (N - first < NP ? N - first : NP) : 0;
            }
            for (int64_t m = mc; m < mend; m += MR) {
                const int tile = mend - m < MR ? (int)(mend - m) : MR;
                const int32_t *r = (const int32_t *)(rows + (m - mc) * kq * 4);
                __m512i c[MR][NB];
                for (int i = 0; i < MR; i++)
                    for (int j = 0; j < NB; j++) c[i][j] = _mm512_setzero_si512();
                for (int64_t q = 0; q < kq; q++) {
                    __m512i b[NB];
                    for (int j = 0; j < NB; j++) b[j] = _mm512_loadu_si512(pb[j] + q * 64);
                    for (int i = 0; i < MR; i++) {
                        const __m512i x = _mm512_set1_epi32(r[i * kq + q]);
                        for (int j = 0; j < NB; j++) c[i][j] = _mm512_dpbusd_epi32(c[i][j], x, b[j]);
                    }
                }
                /* the sums leave the registers in a loop of constant length (int8_gemm.c: with the epilogue in
                 * reach of the loop above, the compiler may keep accumulators on the stack through it) */
                int32_t sums[MR][NB][NP] __attribute__((aligned(64)));
                for (int i = 0; i < MR; i++)
                    for (int j = 0; j < NB; j++) _mm512_store_si512(sums[i][j], c[i][j]);
                for (int i = 0; i < tile; i++)
                    for (int j = 0; j < NB && cols[j]; j++)
                        store16(_mm512_load_si512(sums[i][j]), ascale[m + i], colsum, wscale, bias, n + j * NP,
                                cols[j], y + (m + i) * N, act);
            }
        }
    }
    free(rows);
    return 0;
}
#else
int int8_vnni_supported(void) { return 0; }

int int8_vnni_gemm(const int8_t *a, const float *ascale, int64_t M, int64_t K, const int8_t *bp,
                   const int32_t *colsum, const float *wscale, const float *bias, int64_t N, float *y, int32_t act,
                   int64_t start, int64_t end) {
    (void)a; (void)ascale; (void)M; (void)K; (void)bp; (void)colsum; (void)wscale; (void)bias; (void)N; (void)y;
    (void)act; (void)start; (void)end;
    return -1;
}
#endif
