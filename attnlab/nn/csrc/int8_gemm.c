/* The int8 x int8 product of an int8 linear layer (attnlab/nn/int8.py) on CPUs with AVX2 but no int8 dot
 * product instruction (no VNNI, no AMX), where torch's `_int_mm` is a plain loop slower than fp32. Part of
 * attnlab; built with the other kernels and called through the checked door of attnlab/nn/kernels.py.
 *
 * y_mn = (sum_k a_mk b_kn) * (s_m * w_n) + bias_n, with a (M, K) int8 activations (one scale s_m per row),
 * b (K, N) int8 weights (one scale w_n per column), the sum exact in int32 and the scaling fused in, so the
 * int32 products never leave the registers.
 *
 * The multiply is vpmaddwd on int16: each 32-bit lane holds a pair of k's, a (a_k, a_k+1) pair broadcast
 * against 8 columns' (b_k, b_k+1) pairs gives a_k b_k + a_k+1 b_k+1 in int32, exactly. Both sides are int8
 * widened to int16: the activations once per call (a row as int32 pairs), the weights as they are loaded
 * (vpmovsxbw, shared by the tile's 6 rows). 16 products cost two operations (vpmaddwd, vpaddd) and nothing
 * can saturate; the byte product (vpmaddubsw) needs the sign trick to stay exact, 4.75 operations per 32
 * products, and ran ~10% slower on Zen 3 (~59 against ~65 GMAC/s on one core, MiniLM's shapes).
 *
 * b is packed once (`int8_pack_b`): panels of NP = 16 columns; within a panel, for each pair of k's (K
 * rounded up to even, zeros past K and past N), the 16 columns' 2 bytes: 32 bytes, widened as two vectors
 * of 8 columns x 2 k's. The micro-tile is MR = 6 rows x 16 columns: 12 accumulators, 2 weight vectors and
 * the broadcast pair in the 16 vector registers. Rows go in chunks of ~128 KB of widened activations,
 * which stay in L2 while every panel passes over them.
 */
#include <stdint.h>
#include <stdlib.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define NP 16 /* columns per packed panel and per micro-tile */
#define MR 6
#define ACHUNK (128 * 1024)

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* out: round_up(N, 16) * round_up(K, 2) bytes (nn/kernel_signatures.py's `int8_packed_bytes`) */
int int8_pack_b(const int8_t *b, int64_t K, int64_t N, int8_t *out) {
    if (K < 0 || N < 0) return -1;
    const int64_t kp = round_up(K, 2) / 2;
    for (int64_t n0 = 0; n0 < N; n0 += NP)
        for (int64_t p = 0; p < kp; p++)
            for (int64_t c = 0; c < NP; c++)
                for (int64_t j = 0; j < 2; j++) {
                    const int64_t k = 2 * p + j, n = n0 + c;
                    *out++ = (k < K && n < N) ? b[k * N + n] : 0;
                }
    return 0;
}

#if defined(__AVX2__)
int int8_gemm_supported(void) { return 1; }

/* scale and store one row of a tile: columns n0 .. n0 + cols - 1 (cols <= NP) */
static inline void store_row(__m256i acc0, __m256i acc1, float s, const float *wscale, const float *bias,
                             int64_t n0, int64_t cols, float *out) {
    const __m256i acc[2] = {acc0, acc1};
    if (cols == NP) {
        const __m256 vs = _mm256_set1_ps(s);
        for (int j = 0; j < 2; j++) {
            __m256 f = _mm256_mul_ps(vs, _mm256_loadu_ps(wscale + n0 + 8 * j));
            __m256 v = _mm256_cvtepi32_ps(acc[j]);
            v = bias ? _mm256_fmadd_ps(v, f, _mm256_loadu_ps(bias + n0 + 8 * j)) : _mm256_mul_ps(v, f);
            _mm256_storeu_ps(out + n0 + 8 * j, v);
        }
        return;
    }
    int32_t tmp[NP];
    for (int j = 0; j < 2; j++) _mm256_storeu_si256((__m256i *)(tmp + 8 * j), acc[j]);
    for (int64_t c = 0; c < cols; c++) {
        /* the same operations as the vector path: (s * w) first, then one fused multiply-add */
        const float f = s * wscale[n0 + c];
        out[n0 + c] = bias ? __builtin_fmaf((float)tmp[c], f, bias[n0 + c]) : (float)tmp[c] * f;
    }
}

/* row i of the tile: its (a_2p, a_2p+1) pair against both weight vectors */
#define STEP(i)                                                                                                   \
    do {                                                                                                          \
        const __m256i x = _mm256_set1_epi32(r[i][p]);                                                             \
        c##i##0 = _mm256_add_epi32(c##i##0, _mm256_madd_epi16(x, b0));                                            \
        c##i##1 = _mm256_add_epi32(c##i##1, _mm256_madd_epi16(x, b1));                                            \
    } while (0)

/* rows [start, end) of y (M, N) = a (M, K) x packed b, scaled: the door splits the rows over threads.
 * Returns -2 if the widened rows' buffer cannot be allocated. */
int int8_gemm(const int8_t *a, const float *ascale, int64_t M, int64_t K, const int8_t *bp, const float *wscale,
              const float *bias, int64_t N, float *y, int64_t start, int64_t end) {
    if (M < 0 || K < 0 || N < 0 || start < 0 || end > M || start > end) return -1;
    if (start == end || N == 0) return 0;
    const int64_t kp = round_up(K, 2) / 2;
    int64_t chunk = kp ? ACHUNK / (4 * kp) / MR * MR : MR;
    if (chunk < MR) chunk = MR;
    int32_t *wide = malloc((size_t)(chunk * (kp ? kp : 1)) * sizeof(int32_t)); /* a row's int16 pairs */
    if (!wide) return -2;
    for (int64_t mc = start; mc < end; mc += chunk) {
        const int64_t mend = end - mc < chunk ? end : mc + chunk;
        for (int64_t m = mc; m < mend; m++) {
            const int8_t *row = a + m * K;
            int32_t *w = wide + (m - mc) * kp;
            for (int64_t p = 0; p < kp; p++) {
                const int16_t lo = row[2 * p], hi = 2 * p + 1 < K ? row[2 * p + 1] : 0;
                w[p] = (int32_t)((uint32_t)(uint16_t)lo | ((uint32_t)(uint16_t)hi << 16));
            }
        }
        for (int64_t n0 = 0; n0 < N; n0 += NP) {
            const int8_t *panel = bp + n0 * kp * 2;
            const int64_t cols = N - n0 < NP ? N - n0 : NP;
            for (int64_t m = mc; m < mend; m += MR) {
                const int rows = mend - m < MR ? (int)(mend - m) : MR;
                const int32_t *r[MR];
                for (int i = 0; i < MR; i++) r[i] = wide + (m - mc + (i < rows ? i : 0)) * kp;
                __m256i c00 = _mm256_setzero_si256(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
                        c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
                const int8_t *line = panel;
                for (int64_t p = 0; p < kp; p++, line += 2 * NP) {
                    const __m256i b0 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)line));
                    const __m256i b1 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(line + 16)));
                    STEP(0); STEP(1); STEP(2); STEP(3); STEP(4); STEP(5);
                }
                float *yo = y + m * N;
                store_row(c00, c01, ascale[m], wscale, bias, n0, cols, yo);
                if (rows > 1) store_row(c10, c11, ascale[m + 1], wscale, bias, n0, cols, yo + N);
                if (rows > 2) store_row(c20, c21, ascale[m + 2], wscale, bias, n0, cols, yo + 2 * N);
                if (rows > 3) store_row(c30, c31, ascale[m + 3], wscale, bias, n0, cols, yo + 3 * N);
                if (rows > 4) store_row(c40, c41, ascale[m + 4], wscale, bias, n0, cols, yo + 4 * N);
                if (rows > 5) store_row(c50, c51, ascale[m + 5], wscale, bias, n0, cols, yo + 5 * N);
            }
        }
    }
    free(wide);
    return 0;
}
#else
int int8_gemm_supported(void) { return 0; }

int int8_gemm(const int8_t *a, const float *ascale, int64_t M, int64_t K, const int8_t *bp, const float *wscale,
              const float *bias, int64_t N, float *y, int64_t start, int64_t end) {
    (void)a; (void)ascale; (void)M; (void)K; (void)bp; (void)wscale; (void)bias; (void)N; (void)y; (void)start;
    (void)end;
    return -1;
}
#endif
