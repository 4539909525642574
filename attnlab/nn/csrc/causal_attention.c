/* Causal self-attention in bf16 for inference on a CPU with AVX512-BF16 (attnlab/nn/cpu_attention.py).
 * Part of attnlab; built with the other kernels and called through the checked door of attnlab/nn/kernels.py.
 *
 * Why: scoring long windows in bf16 (`evaluate lm`, a prompt's prefill), torch's CPU flash kernel ran at
 * ~26 GFLOP/s on SmolLM2's heads (T = 512, d = 64, one thread) while its GEMMs ran at ~210: attention was 21%
 * of the time for ~4% of the FLOPs. Here the dot products are VDPBF16PS (two bf16 products summed into each
 * fp32 lane) on keys and values packed once per (batch, key head) so that every instruction does full work:
 *   scores: 16 keys a register, as (k[2p], k[2p+1]) pairs; a query's pair is broadcast; NR rows x 32 keys a step;
 *   values: 16 dimensions a register, as (v_j[d], v_j+1[d]) pairs; a row's two probabilities are broadcast.
 * The NR query rows of a step are consecutive (position, head-of-the-group) rows: a GQA group's heads share
 * the packed keys and values. The masked upper triangle is skipped (up to the step's last position).
 *
 * Numbers, as torch's flash kernel for bf16 computes them: scores in fp32 from bf16 products (exact) summed in
 * fp32, times the scale; softmax in fp32 (e^x: the Cephes polynomial of exp512.h, ~1 ulp); the
 * unnormalized probabilities rounded to bf16 for the value product, which accumulates in fp32; the row divided
 * by its fp32 sum at the end, rounded once to bf16. The summation order differs from torch's, so results differ
 * by bf16 rounding. Without AVX512-BF16 at compile time the kernel says so and torch's path runs instead.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#include <immintrin.h>

#define AI static inline __attribute__((always_inline))

int causal_attention_supported(void) { return 1; }

#include "exp512.h"  /* exp512: e^x for x <= 0 */

AI uint32_t pair_at(const uint16_t *row, int64_t p) { uint32_t u; memcpy(&u, row + 2 * p, 4); return u; }

/* Keys [0, T) of one head, rows `ks` elements apart, into blocks of 16 keys: kp[(jb * D/2 + p) * 16 + l] holds
 * key 16 jb + l's dimensions 2p and 2p + 1; keys from T to Tp are zeros. */
static void pack_keys(const uint16_t *k, int64_t ks, int64_t T, int64_t Tp, int64_t D, uint32_t *kp) {
    for (int64_t jb = 0; jb < Tp / 16; jb++)
        for (int64_t p = 0; p < D / 2; p++)
            for (int64_t l = 0; l < 16; l++) {
                const int64_t j = jb * 16 + l;
                kp[(jb * (D / 2) + p) * 16 + l] = j < T ? pair_at(k + j * ks, p) : 0u;
            }
}

/* Values [0, T) into pairs of keys: vp[((jp * D/16 + c) * 16 + l) * 2 + s] is key 2 jp + s's dimension 16 c + l. */
static void pack_values(const uint16_t *v, int64_t vs, int64_t T, int64_t Tp, int64_t D, uint16_t *vp) {
    for (int64_t jp = 0; jp < Tp / 2; jp++)
        for (int64_t d = 0; d < D; d++)
            for (int64_t s = 0; s < 2; s++) {
                const int64_t j = 2 * jp + s;
                vp[((jp * (D / 16) + d / 16) * 16 + d % 16) * 2 + s] = j < T ? v[j * vs + d] : 0;
            }
}

/* One (batch, key head): every query row of its group, NR rows a step. DC = D / 16. */
AI void attend_group(const uint16_t *q, const int64_t *qs, const uint32_t *kp, const uint16_t *vp, uint16_t *out,
                     const int64_t *os, int64_t b, int64_t kvh, int64_t G, int64_t T, int64_t Tp, float scale,
                     float *S, uint16_t *P, const int NR, const int DC) {
    const int64_t D = 16 * DC, rows = T * G;
    uint32_t qpair[8][64];  /* NR <= 8 rows, D <= 128 */
    int64_t pos[8], head[8];
    for (int64_t r0 = 0; r0 < rows; r0 += NR) {
        for (int r = 0; r < NR; r++) {  /* rows past the end repeat the last (computed, not stored) */
            const int64_t row = r0 + r < rows ? r0 + r : rows - 1;
            pos[r] = row / G;
            head[r] = kvh * G + row % G;
            const uint16_t *qrow = q + b * qs[0] + head[r] * qs[1] + pos[r] * qs[2];
            for (int64_t p = 0; p < D / 2; p++) qpair[r][p] = pair_at(qrow, p);
        }
        const int64_t last = pos[NR - 1], kend = (last + 32) / 32 * 32, pend = (last + 2) / 2 * 2;
        /* scores of keys [0, kend), 32 at a time */
        for (int64_t j = 0; j < kend; j += 32) {
            __m512 a0[8], a1[8];
            for (int r = 0; r < NR; r++) { a0[r] = _mm512_setzero_ps(); a1[r] = _mm512_setzero_ps(); }
            const uint32_t *k0 = kp + (j / 16) * (D / 2) * 16, *k1 = k0 + (D / 2) * 16;
            for (int64_t p = 0; p < D / 2; p++) {
                const __m512bh kz0 = (__m512bh)_mm512_loadu_si512(k0 + p * 16);
                const __m512bh kz1 = (__m512bh)_mm512_loadu_si512(k1 + p * 16);
                for (int r = 0; r < NR; r++) {
                    const __m512bh qz = (__m512bh)_mm512_set1_epi32((int)qpair[r][p]);
                    a0[r] = _mm512_dpbf16_ps(a0[r], qz, kz0);
                    a1[r] = _mm512_dpbf16_ps(a1[r], qz, kz1);
                }
            }
            const __m512 sc = _mm512_set1_ps(scale);
            for (int r = 0; r < NR; r++) {
                _mm512_storeu_ps(S + r * Tp + j, _mm512_mul_ps(a0[r], sc));
                _mm512_storeu_ps(S + r * Tp + j + 16, _mm512_mul_ps(a1[r], sc));
            }
        }
        /* softmax over keys [0, pos]: max, e^(s - max) summed in fp32, rounded to bf16 for the value product */
        float sum[8];
        for (int r = 0; r < NR; r++) {
            float *s = S + r * Tp;
            const int64_t n = pos[r] + 1;
            __m512 mx = _mm512_set1_ps(-INFINITY);
            int64_t j = 0;
            for (; j + 16 <= n; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
            float m = _mm512_reduce_max_ps(mx);
            for (; j < n; j++) m = s[j] > m ? s[j] : m;
            const __m512 mv = _mm512_set1_ps(m);
            __m512 acc = _mm512_setzero_ps();
            uint16_t *pr = P + r * Tp;
            for (j = 0; j < pend; j += 16) {
                const int64_t left = n - j;
                const __mmask16 keep = left >= 16 ? 0xFFFF : (left <= 0 ? 0 : (__mmask16)((1u << left) - 1u));
                const __m512 e = _mm512_maskz_mov_ps(keep, exp512(_mm512_sub_ps(_mm512_loadu_ps(s + j), mv)));
                acc = _mm512_add_ps(acc, e);
                _mm256_storeu_si256((__m256i *)(pr + j), (__m256i)_mm512_cvtneps_pbh(e));  /* j + 16 <= kend */
            }
            sum[r] = _mm512_reduce_add_ps(acc);
        }
        /* values: keys [0, pend) two at a time */
        __m512 o[8][8];
        for (int r = 0; r < NR; r++)
            for (int c = 0; c < DC; c++) o[r][c] = _mm512_setzero_ps();
        for (int64_t jp = 0; jp < pend / 2; jp++) {
            __m512bh vz[8];
            for (int c = 0; c < DC; c++) vz[c] = (__m512bh)_mm512_loadu_si512(vp + (jp * DC + c) * 32);
            for (int r = 0; r < NR; r++) {
                uint32_t pp; memcpy(&pp, P + r * Tp + 2 * jp, 4);
                const __m512bh pz = (__m512bh)_mm512_set1_epi32((int)pp);
                for (int c = 0; c < DC; c++) o[r][c] = _mm512_dpbf16_ps(o[r][c], pz, vz[c]);
            }
        }
        for (int r = 0; r < NR && r0 + r < rows; r++) {
            const __m512 inv = _mm512_set1_ps(1.0f / sum[r]);
            uint16_t *orow = out + b * os[0] + head[r] * os[1] + pos[r] * os[2];
            for (int c = 0; c < DC; c++) {
                const __m256i ob = (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(o[r][c], inv));
                _mm256_storeu_si256((__m256i *)(orow + 16 * c), ob);
            }
        }
    }
}

/* q (B, H, T, D), k / v (B, Hk, T, D), out (B, H, T, D), all bf16, given by element strides {batch, head,
 * position} with the last dimension contiguous; D = 64 or 128, H a multiple of Hk. Computes the (batch, key
 * head) pairs [start, end) of B x Hk. Returns 0, or -1 when scratch memory could not be had (nothing written). */
int causal_attention_bf16(const void *q, const int64_t *qs, const void *k, const int64_t *ks, const void *v,
                          const int64_t *vs, void *out, const int64_t *os, int64_t H, int64_t Hk, int64_t T,
                          int64_t D, float scale, int64_t start, int64_t end) {
    const int64_t Tp = (T + 31) / 32 * 32, G = H / Hk;
    uint32_t *kp = malloc((size_t)(Tp * D / 2) * 4);
    uint16_t *vp = malloc((size_t)(Tp * D) * 2);
    float *S = malloc((size_t)(8 * Tp) * 4);
    uint16_t *P = malloc((size_t)(8 * Tp) * 2);
    int status = (kp && vp && S && P) ? 0 : -1;
    for (int64_t item = start; item < end && status == 0; item++) {
        const int64_t b = item / Hk, kvh = item % Hk;
        pack_keys((const uint16_t *)k + b * ks[0] + kvh * ks[1], ks[2], T, Tp, D, kp);
        pack_values((const uint16_t *)v + b * vs[0] + kvh * vs[1], vs[2], T, Tp, D, vp);
        if (D == 64)
            attend_group(q, qs, kp, vp, out, os, b, kvh, G, T, Tp, scale, S, P, 6, 4);
        else
            attend_group(q, qs, kp, vp, out, os, b, kvh, G, T, Tp, scale, S, P, 3, 8);
    }
    free(kp); free(vp); free(S); free(P);
    return status;
}

#else
int causal_attention_supported(void) { return 0; }

int causal_attention_bf16(const void *q, const int64_t *qs, const void *k, const int64_t *ks, const void *v,
                          const int64_t *vs, void *out, const int64_t *os, int64_t H, int64_t Hk, int64_t T,
                          int64_t D, float scale, int64_t start, int64_t end) {
    (void)q; (void)qs; (void)k; (void)ks; (void)v; (void)vs; (void)out; (void)os; (void)H; (void)Hk; (void)T;
    (void)D; (void)scale; (void)start; (void)end;
    return -1;
}
#endif
