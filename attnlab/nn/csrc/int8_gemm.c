/* The int8 x int8 product of an int8 linear layer (attnlab/nn/int8.py) on CPUs with AVX2 but no int8 dot
 * product instruction (no VNNI, no AMX), where torch's `_int_mm` is a plain loop slower than fp32. Part of
 * attnlab; built with the other kernels and called through the checked door of attnlab/nn/kernels.py.
 *
 * y_mn = (sum_k a_mk b_kn) * (s_m * w_n) + bias_n, with a (M, K) int8 activations (one scale s_m per row),
 * b (K, N) int8 weights (one scale w_n per column), the sum exact in int32 and the scaling fused in, so the
 * int32 products never leave the registers.
 *
 * The multiply is vpmaddubsw (unsigned bytes x signed bytes, adjacent pairs added into int16) with the sign
 * trick llama.cpp uses for its AVX2 dot products: a*b = |a| * (sign(a) b). Both sides lie in [-127, 127]
 * (activations may reach -128, whose |a| = 128 is still read right as unsigned), so a pair is at most
 * 2 * 128 * 127 = 32512 and never saturates int16: the sum is the exact integer one, unlike a u8 x s8
 * product of offset activations, whose pairs can saturate. vpmaddwd with ones then widens pairs into int32.
 * On Zen 3 this runs at ~1.5x the fp32 product of the same shape (two multiplies per 32 products against
 * FMA's one per 8, on one multiply pipe).
 *
 * b is packed once (`int8_pack_b`): panels of NR = 32 columns; within a panel, for each group of 4 k's (K
 * rounded up to a multiple of 4, zeros past K and past N), the 32 columns' 4 bytes: one 128-byte line, read
 * as 4 vectors of 8 columns x 4 k's. A micro-tile of MR = 2 rows x 32 columns keeps 8 accumulators, 4
 * weight vectors and the broadcast activation in the 16 vector registers.
 */
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define NR 32
#define MR 2

static int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

/* out: round_up(N, 32) * round_up(K, 4) bytes (nn/int8.py's `packed_bytes`) */
int int8_pack_b(const int8_t *b, int64_t K, int64_t N, int8_t *out) {
    if (K < 0 || N < 0) return -1;
    const int64_t kq = round_up(K, 4) / 4;
    for (int64_t n0 = 0; n0 < N; n0 += NR)
        for (int64_t q = 0; q < kq; q++)
            for (int64_t c = 0; c < NR; c++)
                for (int64_t j = 0; j < 4; j++) {
                    const int64_t k = 4 * q + j, n = n0 + c;
                    *out++ = (k < K && n < N) ? b[k * N + n] : 0;
                }
    return 0;
}

#if defined(__AVX2__)
int int8_gemm_supported(void) { return 1; }

/* The 4 activations a[4q .. 4q+3] of one row as one int32; past K they are zeros (the packed weights there
 * are zeros too; the copy keeps the read inside the row). A constant-size memcpy is one load. */
static inline int32_t quad(const int8_t *row, int64_t q, int64_t K) {
    int32_t v = 0;
    if (4 * q + 4 <= K) {
        memcpy(&v, row + 4 * q, 4);
        return v;
    }
    for (int64_t k = 4 * q; k < K; k++) ((int8_t *)&v)[k - 4 * q] = row[k];
    return v;
}

/* scale and store one row of a tile: columns n0 .. n0 + cols - 1 (cols <= NR) */
static inline void store_row(const __m256i acc[4], float s, const float *wscale, const float *bias, int64_t n0,
                             int64_t cols, float *out) {
    if (cols == NR) {
        const __m256 vs = _mm256_set1_ps(s);
        for (int j = 0; j < 4; j++) {
            __m256 f = _mm256_mul_ps(vs, _mm256_loadu_ps(wscale + n0 + 8 * j));
            __m256 v = _mm256_cvtepi32_ps(acc[j]);
            v = bias ? _mm256_fmadd_ps(v, f, _mm256_loadu_ps(bias + n0 + 8 * j)) : _mm256_mul_ps(v, f);
            _mm256_storeu_ps(out + n0 + 8 * j, v);
        }
        return;
    }
    int32_t tmp[NR];
    for (int j = 0; j < 4; j++) _mm256_storeu_si256((__m256i *)(tmp + 8 * j), acc[j]);
    for (int64_t c = 0; c < cols; c++) {
        /* the same operations as the vector path: (s * w) first, then one fused multiply-add */
        const float f = s * wscale[n0 + c];
        out[n0 + c] = bias ? __builtin_fmaf((float)tmp[c], f, bias[n0 + c]) : (float)tmp[c] * f;
    }
}

/* rows [start, end) of y (M, N) = a (M, K) x packed b, scaled: the door splits the rows over threads */
int int8_gemm(const int8_t *a, const float *ascale, int64_t M, int64_t K, const int8_t *bp, const float *wscale,
              const float *bias, int64_t N, float *y, int64_t start, int64_t end) {
    if (M < 0 || K < 0 || N < 0 || start < 0 || end > M || start > end) return -1;
    const int64_t kq = round_up(K, 4) / 4;
    const __m256i ones = _mm256_set1_epi16(1);
    for (int64_t n0 = 0; n0 < N; n0 += NR) {
        const int8_t *panel = bp + n0 * kq * 4;
        const int64_t cols = N - n0 < NR ? N - n0 : NR;
        for (int64_t m = start; m < end; m += MR) {
            const int rows = end - m < MR ? (int)(end - m) : MR;
            const int8_t *r0 = a + m * K, *r1 = rows > 1 ? r0 + K : r0;
            __m256i acc[MR][4];
            for (int i = 0; i < MR; i++)
                for (int j = 0; j < 4; j++) acc[i][j] = _mm256_setzero_si256();
            for (int64_t q = 0; q < kq; q++) {
                const int8_t *line = panel + q * 4 * NR;
                __m256i b[4];
                for (int j = 0; j < 4; j++) b[j] = _mm256_loadu_si256((const __m256i *)(line + 32 * j));
                const __m256i x0 = _mm256_set1_epi32(quad(r0, q, K)), x1 = _mm256_set1_epi32(quad(r1, q, K));
                const __m256i ax0 = _mm256_sign_epi8(x0, x0), ax1 = _mm256_sign_epi8(x1, x1);
                for (int j = 0; j < 4; j++) {
                    acc[0][j] = _mm256_add_epi32(acc[0][j], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(ax0, _mm256_sign_epi8(b[j], x0)), ones));
                    acc[1][j] = _mm256_add_epi32(acc[1][j], _mm256_madd_epi16(
                        _mm256_maddubs_epi16(ax1, _mm256_sign_epi8(b[j], x1)), ones));
                }
            }
            for (int i = 0; i < rows; i++)
                store_row(acc[i], ascale[m + i], wscale, bias, n0, cols, y + (m + i) * N);
        }
    }
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
