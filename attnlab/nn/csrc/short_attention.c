/* Softmax attention over short sequences on a CPU core, fp32, with a key-padding mask (attnlab/nn/cpu_attention.py).
 * Part of attnlab; built with the other kernels and called through the checked door of attnlab/nn/kernels.py.
 *
 * Why: an encoder over sentences runs attention on many small (T x T) problems: MiniLM on length-sorted
 * batches of 32 sentences is 384 heads of T ~ 10-60 per layer. torch's CPU flash kernel and batched GEMMs
 * pay a fixed cost per head that dwarfs the arithmetic there (ONNX Runtime spends about half as long on
 * the same attention). Here one (batch, head) is: K transposed into a scratch tile (D x T, zero-padded to
 * 16 keys), then 8 queries at a time: their scores 16 keys at a time (8 independent FMA chains), each
 * row's softmax with a vectorized exp, and P V accumulated in registers; the output is written as (B, Tq, H, D), the layout
 * the output projection reads.
 *
 * q (B, Hq, Tq, D), k / v (B, Hk, Tk, D) given by element strides {batch, head, position} (the last
 * dimension contiguous); query head h reads key/value head h / (Hq / Hk) (GQA). keep: (B, Tk) uint8,
 * 1 = a real key, or NULL; the caller guarantees every row keeps at least one key. Rows [start, end) of
 * the flattened (batch, head) index: callers split the work across threads.
 * Requires D a multiple of 16 (D <= 128) and AVX-512 (16 keys per vector) or AVX2 + FMA (the same steps on
 * 8-key halves: MiniLM's attention on 1,024 sentences, one thread, Zen 3, took ~490 ms in torch's flash
 * kernel); `short_attention_supported` says whether this build has either.
 */
#include <math.h>
#include <stdint.h>

#define QB 8          /* queries at a time: 8 independent FMA chains hide the FMA latency, and each key
                         tile load serves 8 queries */
#define MAX_TILE 16384 /* D x padded Tk floats of transposed keys: 64 KB of stack */

/* The door's checks (nn/kernel_signatures.py) held again: when they fail, read nothing. */
static inline int bad_args(int64_t B, int64_t Hq, int64_t Hk, int64_t Tk, int64_t D, int64_t start, int64_t end) {
    return Hk <= 0 || Hq % Hk || D <= 0 || D % 16 || D > 128 || Tk <= 0
           || D * ((Tk + 15) & ~(int64_t)15) > MAX_TILE || start < 0 || end > B * Hq;
}

/* (batch, head) bh: its queries and values, and its keys transposed into kt (D x tp, zero past Tk) */
static inline void load_head(const float *q, const int64_t *qs, const float *k, const int64_t *ks, const float *v,
                      const int64_t *vs, int64_t bh, int64_t Hq, int64_t Hk, int64_t Tk, int64_t tp, int64_t D,
                      const float **qb, const float **vb, float *kt) {
    const int64_t b = bh / Hq, h = bh % Hq, hk = h / (Hq / Hk);
    const float *kb = k + b * ks[0] + hk * ks[1];
    *qb = q + b * qs[0] + h * qs[1];
    *vb = v + b * vs[0] + hk * vs[1];
    for (int64_t j = 0; j < tp; j++)
        for (int64_t c = 0; c < D; c++) kt[c * tp + j] = j < Tk ? kb[j * ks[2] + c] : 0.0f;
}

#if defined(__AVX512F__)
#include <immintrin.h>

int short_attention_supported(void) { return 1; }

#include "exp512.h"

int short_attention(const float *q, const int64_t *qs, const float *k, const int64_t *ks, const float *v,
                     const int64_t *vs, int64_t B, int64_t Hq, int64_t Hk, int64_t Tq, int64_t Tk, int64_t D,
                     const uint8_t *keep, float scale, float *out, int64_t start, int64_t end) {
    if (bad_args(B, Hq, Hk, Tk, D, start, end)) return -1;
    const int64_t tp = (Tk + 15) & ~(int64_t)15, chunks = tp / 16, dc = D / 16;
    float kt[MAX_TILE];
    float s[QB][MAX_TILE / 16];
    __mmask16 valid[MAX_TILE / 256];
    for (int64_t bh = start; bh < end; bh++) {
        const int64_t b = bh / Hq, h = bh % Hq;
        const float *qb, *vb;
        load_head(q, qs, k, ks, v, vs, bh, Hq, Hk, Tk, tp, D, &qb, &vb, kt);
        for (int64_t jc = 0; jc < chunks; jc++) {
            __mmask16 m = 0;
            for (int64_t t = 0; t < 16; t++) {
                int64_t j = jc * 16 + t;
                if (j < Tk && (!keep || keep[b * Tk + j])) m |= (__mmask16)(1u << t);
            }
            valid[jc] = m;
        }
        const __m512 vscale = _mm512_set1_ps(scale);
        for (int64_t i0 = 0; i0 < Tq; i0 += QB) {
            const int64_t nq = Tq - i0 < QB ? Tq - i0 : QB;
            const float *qi[QB];
            for (int r = 0; r < QB; r++) qi[r] = qb + (i0 + (r < nq ? r : nq - 1)) * qs[2]; /* tail: repeat */
            /* scores, and each row's max over its allowed keys */
            __m512 vmax[QB];
            for (int r = 0; r < QB; r++) vmax[r] = _mm512_set1_ps(-INFINITY);
            for (int64_t jc = 0; jc < chunks; jc++) {
                __m512 acc[QB];
                for (int r = 0; r < QB; r++) acc[r] = _mm512_setzero_ps();
                for (int64_t c = 0; c < D; c++) {
                    const __m512 kv = _mm512_loadu_ps(kt + c * tp + jc * 16);
                    for (int r = 0; r < QB; r++) acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(qi[r][c]), kv, acc[r]);
                }
                for (int r = 0; r < QB; r++) {
                    acc[r] = _mm512_mul_ps(acc[r], vscale);
                    _mm512_storeu_ps(s[r] + jc * 16, acc[r]);
                    vmax[r] = _mm512_mask_max_ps(vmax[r], valid[jc], vmax[r], acc[r]);
                }
            }
            /* softmax numerators in place; padding keys get exactly 0 */
            __m512 inv[QB];
            for (int r = 0; r < QB; r++) {
                const __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(vmax[r]));
                __m512 vsum = _mm512_setzero_ps();
                for (int64_t jc = 0; jc < chunks; jc++) {
                    __m512 e = _mm512_maskz_mov_ps(valid[jc], exp512(_mm512_sub_ps(_mm512_loadu_ps(s[r] + jc * 16), mx)));
                    _mm512_storeu_ps(s[r] + jc * 16, e);
                    vsum = _mm512_add_ps(vsum, e);
                }
                inv[r] = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum));
            }
            /* P V, 16 output dimensions at a time */
            for (int64_t c = 0; c < dc; c++) {
                __m512 o[QB];
                for (int r = 0; r < QB; r++) o[r] = _mm512_setzero_ps();
                for (int64_t j = 0; j < Tk; j++) {
                    const __m512 vj = _mm512_loadu_ps(vb + j * vs[2] + c * 16);
                    for (int r = 0; r < QB; r++) o[r] = _mm512_fmadd_ps(_mm512_set1_ps(s[r][j]), vj, o[r]);
                }
                for (int r = 0; r < nq; r++)
                    _mm512_storeu_ps(out + ((b * Tq + i0 + r) * Hq + h) * D + c * 16, _mm512_mul_ps(o[r], inv[r]));
            }
        }
    }
    return 0;
}
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <string.h>

int short_attention_supported(void) { return 1; }

#define AI static inline __attribute__((always_inline))
#include "exp_poly.h"

AI float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

AI float hsum8(__m256 v) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_add_ss(m, _mm_movehdup_ps(m)));
}

/* As the AVX-512 path, 8 keys / 8 output dimensions per vector; a key's mask is a float of all-one bits
 * (kept) or zero, so that max takes -inf and exp takes 0 where it is zero. */
int short_attention(const float *q, const int64_t *qs, const float *k, const int64_t *ks, const float *v,
                     const int64_t *vs, int64_t B, int64_t Hq, int64_t Hk, int64_t Tq, int64_t Tk, int64_t D,
                     const uint8_t *keep, float scale, float *out, int64_t start, int64_t end) {
    if (bad_args(B, Hq, Hk, Tk, D, start, end)) return -1;
    const int64_t tp = (Tk + 15) & ~(int64_t)15, chunks = tp / 8, dc = D / 8;
    float kt[MAX_TILE];
    float s[QB][MAX_TILE / 16];
    float valid[MAX_TILE / 16];
    const uint32_t ones = 0xffffffffu;
    float all;
    memcpy(&all, &ones, 4);
    for (int64_t bh = start; bh < end; bh++) {
        const int64_t b = bh / Hq, h = bh % Hq;
        const float *qb, *vb;
        load_head(q, qs, k, ks, v, vs, bh, Hq, Hk, Tk, tp, D, &qb, &vb, kt);
        for (int64_t j = 0; j < tp; j++) valid[j] = j < Tk && (!keep || keep[b * Tk + j]) ? all : 0.0f;
        const __m256 vscale = _mm256_set1_ps(scale), ninf = _mm256_set1_ps(-INFINITY);
        for (int64_t i0 = 0; i0 < Tq; i0 += QB) {
            const int64_t nq = Tq - i0 < QB ? Tq - i0 : QB;
            const float *qi[QB];
            for (int r = 0; r < QB; r++) qi[r] = qb + (i0 + (r < nq ? r : nq - 1)) * qs[2]; /* tail: repeat */
            __m256 vmax[QB];
            for (int r = 0; r < QB; r++) vmax[r] = ninf;
            for (int64_t jc = 0; jc < chunks; jc++) {
                __m256 acc[QB];
                for (int r = 0; r < QB; r++) acc[r] = _mm256_setzero_ps();
                for (int64_t c = 0; c < D; c++) {
                    const __m256 kv = _mm256_loadu_ps(kt + c * tp + jc * 8);
                    for (int r = 0; r < QB; r++) acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(qi[r] + c), kv, acc[r]);
                }
                const __m256 m = _mm256_loadu_ps(valid + jc * 8);
                for (int r = 0; r < QB; r++) {
                    acc[r] = _mm256_mul_ps(acc[r], vscale);
                    _mm256_storeu_ps(s[r] + jc * 8, acc[r]);
                    vmax[r] = _mm256_max_ps(vmax[r], _mm256_blendv_ps(ninf, acc[r], m));
                }
            }
            /* softmax numerators in place; padding keys get exactly 0 */
            float inv[QB];
            for (int r = 0; r < QB; r++) {
                const __m256 mx = _mm256_set1_ps(hmax8(vmax[r]));
                __m256 vsum = _mm256_setzero_ps();
                for (int64_t jc = 0; jc < chunks; jc++) {
                    const __m256 e = _mm256_and_ps(_mm256_loadu_ps(valid + jc * 8),
                                                   exp_poly8(_mm256_sub_ps(_mm256_loadu_ps(s[r] + jc * 8), mx)));
                    _mm256_storeu_ps(s[r] + jc * 8, e);
                    vsum = _mm256_add_ps(vsum, e);
                }
                inv[r] = 1.0f / hsum8(vsum);
            }
            /* P V, 8 output dimensions at a time */
            for (int64_t c = 0; c < dc; c++) {
                __m256 o[QB];
                for (int r = 0; r < QB; r++) o[r] = _mm256_setzero_ps();
                for (int64_t j = 0; j < Tk; j++) {
                    const __m256 vj = _mm256_loadu_ps(vb + j * vs[2] + c * 8);
                    for (int r = 0; r < QB; r++) o[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(s[r] + j), vj, o[r]);
                }
                for (int r = 0; r < nq; r++)
                    _mm256_storeu_ps(out + ((b * Tq + i0 + r) * Hq + h) * D + c * 8,
                                     _mm256_mul_ps(o[r], _mm256_set1_ps(inv[r])));
            }
        }
    }
    return 0;
}
#else
int short_attention_supported(void) { return 0; }

int short_attention(const float *q, const int64_t *qs, const float *k, const int64_t *ks, const float *v,
                     const int64_t *vs, int64_t B, int64_t Hq, int64_t Hk, int64_t Tq, int64_t Tk, int64_t D,
                     const uint8_t *keep, float scale, float *out, int64_t start, int64_t end) {
    (void)q; (void)qs; (void)k; (void)ks; (void)v; (void)vs; (void)B; (void)Hq; (void)Hk; (void)Tq; (void)Tk;
    (void)D; (void)keep; (void)scale; (void)out; (void)start; (void)end;
    return -1;
}
#endif
