/* The integer product of an int8 linear layer (attnlab/nn/int8.py) on CPUs with AVX2 but no int8 dot
 * product instruction (no VNNI, no AMX), where torch's `_int_mm` is a plain loop slower than fp32. Part of
 * attnlab; built with the other kernels and called through the checked door of attnlab/nn/kernels.py.
 *
 * y_mn = (sum_k (a_mk - z_m) b_kn) * (s_m * w_n) + bias_n, then GELU if asked (a feed-forward block's up
 * projection), with a (M, K) 7-bit activation codes 0..127 (one scale s_m and integer zero point z_m per
 * row: int8_rows.c's `int8_quantize_rows_u7`), b (K, N) int8 weights (one scale w_n per column). The sum is exact in int32: sum_k a_mk b_kn in the loop,
 * minus z_m * colsum_n (colsum_n = sum_k b_kn, from the packing) before the scaling, which is fused in, so
 * the int32 products never leave the registers.
 *
 * Why 7-bit codes: vpmaddubsw multiplies unsigned bytes by signed bytes and adds adjacent pairs into int16,
 * 32 products per instruction; a pair of 127 * 127 products is 32,258, so with codes below 128 it can never
 * saturate (with full 8-bit codes it can: ONNX Runtime's AVX2 path accepts that). vpmaddwd by ones then adds
 * the pairs' pairs into int32. Against the exact int16 route (both sides widened to int16, one vpmaddwd and
 * one vpaddd per 16 products, plus the widening and broadcasts) this is about half the vector operations
 * per product: 75-92 against 44-50 GMAC/s on one Zen 3 core at MiniLM's shapes. The price is the activation grid: 128 levels over [min, max] of a row instead of 255
 * over [-max|x|, max|x|]; on all-MiniLM-L6-v2 with SmoothQuant the embeddings' cosine to fp32 stays above
 * 0.99 (min) / 0.998 (mean) on real sentences (tests/test_int8.py holds it to that).
 *
 * b is packed once (`int8_pack_b`): panels of NP = 16 columns; within a panel, for each quad of k's (K
 * rounded up to a multiple of 4, zeros past K and past N), the 16 columns' 4 bytes: 64 bytes, two vectors
 * of 8 columns x 4 k's. The micro-tile is MR = 5 rows x 16 columns: 10 accumulators, 2 weight vectors, the
 * broadcast quad, the ones and a temporary in the 16 vector registers. Rows go in chunks of ~128 KB (the
 * rows' codes copied with K padded to the quad), which stay in L2 while every panel passes over them.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "int8_chunk.h" /* the argument check, K in quads, rows per chunk */
#define AI static inline __attribute__((always_inline))
#include "exp_poly.h" /* exp_poly8: e^x on 8 lanes (AVX2 + FMA) */

#define NP 16 /* columns per packed panel and per micro-tile */
#define MR 5

/* out: round_up(N, 16) * round_up(K, 4) bytes (nn/kernel_signatures.py's `int8_packed_bytes`); colsum: N
 * int32, each column's sum (the zero points' correction) */
int int8_pack_b(const int8_t *b, int64_t K, int64_t N, int8_t *out, int32_t *colsum) {
    if (K < 0 || N < 0) return -1;
    const int64_t kq = int8_quads(K);
    for (int64_t n0 = 0; n0 < N; n0 += NP)
        for (int64_t p = 0; p < kq; p++)
            for (int64_t c = 0; c < NP; c++)
                for (int64_t j = 0; j < 4; j++) {
                    const int64_t k = 4 * p + j, n = n0 + c;
                    *out++ = (k < K && n < N) ? b[k * N + n] : 0;
                }
    for (int64_t n = 0; n < N; n++) {
        int32_t s = 0;
        for (int64_t k = 0; k < K; k++) s += b[k * N + n];
        colsum[n] = s;
    }
    return 0;
}

#if defined(__AVX2__) && defined(__FMA__)
int int8_gemm_supported(void) { return 1; }

/* GELU, erf form (BERT's): x/2 (1 + erf(x / sqrt 2)), erf by Abramowitz & Stegun 7.1.26 (absolute error
 * <= 1.5e-7): erf(z) = 1 - t (a1 + t (a2 + ... a5)) e^(-z^2), t = 1 / (1 + p z), z >= 0, odd in z. Applied
 * in the up projection's store, it saves the separate pass torch's GELU makes over the 1,536-wide hidden;
 * e^x is exp_poly.h's. */
AI __m256 gelu_erf(__m256 x) {
    const __m256 sign = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)));
    const __m256 z = _mm256_andnot_ps(_mm256_castsi256_ps(_mm256_set1_epi32((int)0x80000000u)),
                                      _mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f)));
    const __m256 t = _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(z, _mm256_set1_ps(0.3275911f),
                                                                         _mm256_set1_ps(1.0f)));
    __m256 q = _mm256_set1_ps(1.061405429f);
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(-1.453152027f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(1.421413741f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(-0.284496736f));
    q = _mm256_fmadd_ps(q, t, _mm256_set1_ps(0.254829592f));
    const __m256 tail = _mm256_mul_ps(_mm256_mul_ps(q, t), exp_poly8(_mm256_mul_ps(_mm256_mul_ps(z, z),
                                                                                  _mm256_set1_ps(-1.0f))));
    const __m256 erf = _mm256_xor_ps(_mm256_sub_ps(_mm256_set1_ps(1.0f), tail), sign);
    return _mm256_mul_ps(_mm256_mul_ps(x, _mm256_set1_ps(0.5f)), _mm256_add_ps(erf, _mm256_set1_ps(1.0f)));
}

/* correct, scale and store one row of a tile: columns n0 .. n0 + cols - 1 (cols <= NP); act 1: then GELU */
static inline void store_row(const int32_t *sums, int32_t z, float s, const int32_t *colsum, const float *wscale,
                             const float *bias, int64_t n0, int64_t cols, float *out, int32_t act) {
    if (cols == NP) {
        const __m256 vs = _mm256_set1_ps(s);
        const __m256i vz = _mm256_set1_epi32(z);
        for (int j = 0; j < 2; j++) {
            const __m256i corr = _mm256_mullo_epi32(vz, _mm256_loadu_si256((const __m256i *)(colsum + n0 + 8 * j)));
            const __m256i acc = _mm256_loadu_si256((const __m256i *)(sums + 8 * j));
            __m256 v = _mm256_cvtepi32_ps(_mm256_sub_epi32(acc, corr));
            const __m256 f = _mm256_mul_ps(vs, _mm256_loadu_ps(wscale + n0 + 8 * j));
            v = bias ? _mm256_fmadd_ps(v, f, _mm256_loadu_ps(bias + n0 + 8 * j)) : _mm256_mul_ps(v, f);
            _mm256_storeu_ps(out + n0 + 8 * j, act ? gelu_erf(v) : v);
        }
        return;
    }
    float row[NP];
    for (int64_t c = 0; c < cols; c++) {
        /* the same operations as the vector path: (s * w) first, then one fused multiply-add */
        const float f = s * wscale[n0 + c];
        const float v = (float)(sums[c] - z * colsum[n0 + c]);
        row[c] = bias ? __builtin_fmaf(v, f, bias[n0 + c]) : v * f;
    }
    if (act) { /* the last panel's few columns: the vector form too, so that every column has the same GELU */
        float buf[8];
        for (int64_t c0 = 0; c0 < cols; c0 += 8) {
            const int64_t k = cols - c0 < 8 ? cols - c0 : 8;
            for (int64_t c = 0; c < 8; c++) buf[c] = c < k ? row[c0 + c] : 0.0f;
            _mm256_storeu_ps(buf, gelu_erf(_mm256_loadu_ps(buf)));
            for (int64_t c = 0; c < k; c++) row[c0 + c] = buf[c];
        }
    }
    for (int64_t c = 0; c < cols; c++) out[n0 + c] = row[c];
}

/* rows [start, end) of y (M, N) = (a (M, K) - zero) x packed b, scaled: the door splits the rows over threads.
 * Returns -2 if the rows' buffer cannot be allocated. */
int int8_gemm(const uint8_t *a, const float *ascale, const int32_t *zero, int64_t M, int64_t K, const int8_t *bp,
              const int32_t *colsum, const float *wscale, const float *bias, int64_t N, float *y, int32_t act,
              int64_t start, int64_t end) {
    if (int8_bad_args(M, K, N, act, start, end)) return -1;
    if (start == end || N == 0) return 0;
    const int64_t kq = int8_quads(K), chunk = int8_row_chunk(kq, MR);
    /* a chunk's rows, each padded to kq quads with zeros (the packed weights are zero there too), and MR - 1
     * rows more, which a last partial tile reads and does not store: the tile then takes no branch */
    int32_t *rows = calloc((size_t)((chunk + MR - 1) * (kq ? kq : 1)), sizeof(int32_t));
    if (!rows) return -2;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t mc = start; mc < end; mc += chunk) {
        const int64_t mend = end - mc < chunk ? end : mc + chunk;
        for (int64_t m = mc; m < mend; m++) memcpy(rows + (m - mc) * kq, a + m * K, (size_t)K);
        for (int64_t n0 = 0; n0 < N; n0 += NP) {
            const int8_t *panel = bp + n0 * kq * 4;
            const int64_t cols = N - n0 < NP ? N - n0 : NP;
            for (int64_t m = mc; m < mend; m += MR) {
                const int tile = mend - m < MR ? (int)(mend - m) : MR;
                const int32_t *r = rows + (m - mc) * kq;
                __m256i c[MR][2];
                for (int i = 0; i < MR; i++) c[i][0] = c[i][1] = _mm256_setzero_si256();
                const int8_t *line = panel;
                for (int64_t p = 0; p < kq; p++, line += 4 * NP) {
                    const __m256i b0 = _mm256_loadu_si256((const __m256i *)line);
                    const __m256i b1 = _mm256_loadu_si256((const __m256i *)(line + 32));
                    for (int i = 0; i < MR; i++) {
                        const __m256i x = _mm256_set1_epi32(r[i * kq + p]);
                        c[i][0] = _mm256_add_epi32(c[i][0], _mm256_madd_epi16(_mm256_maddubs_epi16(x, b0), ones));
                        c[i][1] = _mm256_add_epi32(c[i][1], _mm256_madd_epi16(_mm256_maddubs_epi16(x, b1), ones));
                    }
                }
                /* the sums leave the registers once, in a loop of constant length: with the epilogue's work
                 * (or a bound of the partial tile's count) in reach of the loop above, the compiler kept
                 * half the accumulators on the stack through it (~35% slower) */
                int32_t sums[MR][NP];
                for (int i = 0; i < MR; i++) {
                    _mm256_storeu_si256((__m256i *)sums[i], c[i][0]);
                    _mm256_storeu_si256((__m256i *)(sums[i] + 8), c[i][1]);
                }
                for (int i = 0; i < tile; i++)
                    store_row(sums[i], zero[m + i], ascale[m + i], colsum, wscale, bias, n0, cols, y + (m + i) * N,
                              act);
            }
        }
    }
    free(rows);
    return 0;
}
#else
int int8_gemm_supported(void) { return 0; }

int int8_gemm(const uint8_t *a, const float *ascale, const int32_t *zero, int64_t M, int64_t K, const int8_t *bp,
              const int32_t *colsum, const float *wscale, const float *bias, int64_t N, float *y, int32_t act,
              int64_t start, int64_t end) {
    (void)a; (void)ascale; (void)zero; (void)M; (void)K; (void)bp; (void)colsum; (void)wscale; (void)bias; (void)N;
    (void)y; (void)act; (void)start; (void)end;
    return -1;
}
#endif
