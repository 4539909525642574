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
 * as 4 vectors of 8 columns x 4 k's. The micro-tile is MR = 4 rows x 16 columns (half a panel): see
 * int8_gemm. On one Zen 3 core it makes ~58 GMAC/s, ~1.07x the 2 x 32 tile it replaced (MiniLM's shapes; 3-10%
 * of the int8 encoder end to end).
 */
#include <stdint.h>
#include <string.h>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define NR 32   /* columns per packed panel */
#define HALF 16 /* columns per micro-tile */
#define MR 4
#define ACHUNK (128 * 1024)

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

/* scale and store one row of a tile: HALF columns n0 .. n0 + cols - 1 (cols <= HALF) */
static inline void store_row(const __m256i acc[2], float s, const float *wscale, const float *bias, int64_t n0,
                             int64_t cols, float *out) {
    if (cols == HALF) {
        const __m256 vs = _mm256_set1_ps(s);
        for (int j = 0; j < 2; j++) {
            __m256 f = _mm256_mul_ps(vs, _mm256_loadu_ps(wscale + n0 + 8 * j));
            __m256 v = _mm256_cvtepi32_ps(acc[j]);
            v = bias ? _mm256_fmadd_ps(v, f, _mm256_loadu_ps(bias + n0 + 8 * j)) : _mm256_mul_ps(v, f);
            _mm256_storeu_ps(out + n0 + 8 * j, v);
        }
        return;
    }
    int32_t tmp[HALF];
    for (int j = 0; j < 2; j++) _mm256_storeu_si256((__m256i *)(tmp + 8 * j), acc[j]);
    for (int64_t c = 0; c < cols; c++) {
        /* the same operations as the vector path: (s * w) first, then one fused multiply-add */
        const float f = s * wscale[n0 + c];
        out[n0 + c] = bias ? __builtin_fmaf((float)tmp[c], f, bias[n0 + c]) : (float)tmp[c] * f;
    }
}

/* One row's step into its two accumulators: |x| x (sign(x) b), pairs widened by vpmaddwd with ones. */
#define ROW_STEP(acc, x)                                                                                          \
    do {                                                                                                          \
        const __m256i ax_ = _mm256_sign_epi8(x, x);                                                               \
        acc[0] = _mm256_add_epi32(acc[0], _mm256_madd_epi16(_mm256_maddubs_epi16(ax_, _mm256_sign_epi8(b0, x)),  \
                                                            ones));                                               \
        acc[1] = _mm256_add_epi32(acc[1], _mm256_madd_epi16(_mm256_maddubs_epi16(ax_, _mm256_sign_epi8(b1, x)),  \
                                                            ones));                                               \
    } while (0)

/* rows [start, end) of y (M, N) = a (M, K) x packed b, scaled: the door splits the rows over threads.
 * A 32-column panel is done as two halves of 16 columns with MR = 4 rows: 8 accumulators, 2 weight vectors,
 * the broadcast activation, its absolute value, a product and the ones stay within the 16 vector registers
 * (a 2 x 32 tile needs 17, and the compiler spilled 5 accumulators to the stack on every step). */
int int8_gemm(const int8_t *a, const float *ascale, int64_t M, int64_t K, const int8_t *bp, const float *wscale,
              const float *bias, int64_t N, float *y, int64_t start, int64_t end) {
    if (M < 0 || K < 0 || N < 0 || start < 0 || end > M || start > end) return -1;
    const int64_t kq = round_up(K, 4) / 4, kfull = K / 4;
    const __m256i ones = _mm256_set1_epi16(1);
    /* rows in chunks of ~128 KB of activations, which stay in L2 while every panel passes over them (a long K
     * would otherwise stream all of a from L3 once per 16 columns) */
    const int64_t chunk = K * MR > ACHUNK ? MR : ACHUNK / K / MR * MR;
    for (int64_t mc = start; mc < end; mc += chunk) {
    const int64_t mend = end - mc < chunk ? end : mc + chunk;
    for (int64_t n0 = 0; n0 < N; n0 += NR) {
        const int8_t *panel = bp + n0 * kq * 4;
        for (int h = 0; h < 2; h++) {
            const int64_t c0 = n0 + HALF * h;
            if (c0 >= N) break;
            const int64_t cols = N - c0 < HALF ? N - c0 : HALF;
            for (int64_t m = mc; m < mend; m += MR) {
                const int rows = mend - m < MR ? (int)(mend - m) : MR;
                const int8_t *r[MR];
                for (int i = 0; i < MR; i++) r[i] = a + (m + (i < rows ? i : 0)) * K;
                __m256i acc0[2], acc1[2], acc2[2], acc3[2];
                acc0[0] = acc0[1] = acc1[0] = acc1[1] = _mm256_setzero_si256();
                acc2[0] = acc2[1] = acc3[0] = acc3[1] = _mm256_setzero_si256();
                const int8_t *line = panel + 2 * 32 * h;
                for (int64_t q = 0; q < kq; q++, line += 4 * NR) {
                    const __m256i b0 = _mm256_loadu_si256((const __m256i *)line);
                    const __m256i b1 = _mm256_loadu_si256((const __m256i *)(line + 32));
                    __m256i x;
                    if (q < kfull) {
                        int32_t v;
                        memcpy(&v, r[0] + 4 * q, 4); x = _mm256_set1_epi32(v); ROW_STEP(acc0, x);
                        memcpy(&v, r[1] + 4 * q, 4); x = _mm256_set1_epi32(v); ROW_STEP(acc1, x);
                        memcpy(&v, r[2] + 4 * q, 4); x = _mm256_set1_epi32(v); ROW_STEP(acc2, x);
                        memcpy(&v, r[3] + 4 * q, 4); x = _mm256_set1_epi32(v); ROW_STEP(acc3, x);
                    } else { /* the last, partial group of 4 k's */
                        x = _mm256_set1_epi32(quad(r[0], q, K)); ROW_STEP(acc0, x);
                        x = _mm256_set1_epi32(quad(r[1], q, K)); ROW_STEP(acc1, x);
                        x = _mm256_set1_epi32(quad(r[2], q, K)); ROW_STEP(acc2, x);
                        x = _mm256_set1_epi32(quad(r[3], q, K)); ROW_STEP(acc3, x);
                    }
                }
                float *yo = y + m * N;
                store_row(acc0, ascale[m], wscale, bias, c0, cols, yo);
                if (rows > 1) store_row(acc1, ascale[m + 1], wscale, bias, c0, cols, yo + N);
                if (rows > 2) store_row(acc2, ascale[m + 2], wscale, bias, c0, cols, yo + 2 * N);
                if (rows > 3) store_row(acc3, ascale[m + 3], wscale, bias, c0, cols, yo + 3 * N);
            }
        }
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
