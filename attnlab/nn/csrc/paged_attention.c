/* One decoding step's attention read straight from a paged KV cache, fp32 (attnlab/nn/paged_attention.py).
 * Part of attnlab; built with the other kernels and called through the checked door of attnlab/nn/kernels.py.
 *
 * Why: the serving engine keeps keys and values in fixed-size blocks of a pool (vLLM's PagedAttention, Kwon
 * et al. 2023, §4.1). Through torch, a decoding step gathers every row's keys and values into a padded
 * (B, K, H, D) copy (index_select), then runs SDPA over the padding too: three passes over the bytes of
 * the cache, and up to max/mean times the work when rows have different lengths. Serving SmolLM2 on two
 * cores, the gather and SDPA took a quarter of the time. Here each row's own slots are read once, in
 * place, with no padding.
 *
 * One work item is (row b, key/value head hk): its G = Hq / Hk query heads (GQA) share each key and value
 * read. Keys are taken CHUNK at a time: scores for the chunk, then the running maximum, the correction of
 * the sums so far and the weighted values (the online softmax of Milakov & Gimelshein 2018, as
 * FlashAttention uses it), so the scratch is bounded whatever the length.
 *
 * q (B, Hq, D) contiguous; keys / values (S, Hk, D) contiguous, the pool's slots; row b reads the slots
 * slots[offsets[b] .. offsets[b+1]) (at least one). out (B, Hq, D). Items [start, end) of B * Hk: callers
 * split the work across threads. The door checks the shapes and every slot index before the call; the
 * kernel checks them again as it reads and returns -1 without writing past a bad one.
 *
 * Numbers: softmax(q k^T * scale) v as torch computes it, summed in another order (16 lanes wide, chunk
 * by chunk) and e^x from a Cephes polynomial (~1 ulp), so results differ from SDPA's by rounding. Portable
 * C: the loops are written so that `cc -O3 -march=native` vectorizes them.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#define CHUNK 64       /* keys per chunk: the scores of G heads x 64 keys stay in L1 */
#define MAX_GD 4096    /* G x D floats of queries and accumulators on the stack (e.g. 16 heads of 256) */

#include "exp_poly.h"  /* e^x: exp(-inf) is never asked for */

/* sum of a[i] * b[i] over D (a multiple of 16): 16 partial sums, so the loop vectorizes */
AI float dot16(const float *restrict a, const float *restrict b, int64_t D) {
    float acc[16] = {0};
    for (int64_t i = 0; i < D; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    float s = 0.0f;
    for (int l = 0; l < 16; l++) s += acc[l];
    return s;
}

int paged_decode_attention(const float *q, const float *keys, const float *values, int64_t S, int64_t B,
                           int64_t Hq, int64_t Hk, int64_t D, const int64_t *slots, const int64_t *offsets,
                           int64_t N, float scale, float *out, int64_t start, int64_t end) {
    if (Hk <= 0 || Hq % Hk || D <= 0 || D % 16 || (Hq / Hk) * D > MAX_GD || start < 0 || end > B * Hk)
        return -1;  /* the door's checks failed to hold: read nothing */
    const int64_t G = Hq / Hk;
    float qs[MAX_GD], acc[MAX_GD], s[CHUNK * (MAX_GD / 16)];
    float m[MAX_GD / 16], l[MAX_GD / 16];
    for (int64_t item = start; item < end; item++) {
        const int64_t b = item / Hk, hk = item % Hk;
        const int64_t n0 = offsets[b], n1 = offsets[b + 1];
        if (n0 < 0 || n1 > N || n1 <= n0)
            return -1;
        for (int64_t g = 0; g < G; g++) {
            const float *qg = q + (b * Hq + hk * G + g) * D;
            for (int64_t d = 0; d < D; d++) qs[g * D + d] = qg[d] * scale;
            m[g] = -INFINITY;
            l[g] = 0.0f;
        }
        memset(acc, 0, sizeof(float) * G * D);
        for (int64_t c0 = n0; c0 < n1; c0 += CHUNK) {
            const int64_t n = n1 - c0 < CHUNK ? n1 - c0 : CHUNK;
            for (int64_t j = 0; j < n; j++) {
                const int64_t slot = slots[c0 + j];
                if (slot < 0 || slot >= S)
                    return -1;
                const float *k = keys + (slot * Hk + hk) * D;
                for (int64_t g = 0; g < G; g++) s[g * CHUNK + j] = dot16(qs + g * D, k, D);
            }
            for (int64_t g = 0; g < G; g++) {
                float *sg = s + g * CHUNK, mx = m[g];
                for (int64_t j = 0; j < n; j++) mx = sg[j] > mx ? sg[j] : mx;
                const float corr = m[g] == -INFINITY ? 0.0f : exp_poly(m[g] - mx);
                float sum = 0.0f;
                for (int64_t j = 0; j < n; j++) {
                    sg[j] = exp_poly(sg[j] - mx);
                    sum += sg[j];
                }
                l[g] = l[g] * corr + sum;
                m[g] = mx;
                if (corr != 1.0f)
                    for (int64_t d = 0; d < D; d++) acc[g * D + d] *= corr;
            }
            for (int64_t j = 0; j < n; j++) {
                const float *v = values + (slots[c0 + j] * Hk + hk) * D;
                for (int64_t g = 0; g < G; g++) {
                    const float p = s[g * CHUNK + j];
                    float *a = acc + g * D;
                    for (int64_t d = 0; d < D; d++) a[d] += p * v[d];
                }
            }
        }
        for (int64_t g = 0; g < G; g++) {
            float *o = out + (b * Hq + hk * G + g) * D;
            const float inv = 1.0f / l[g];
            for (int64_t d = 0; d < D; d++) o[d] = acc[g * D + d] * inv;
        }
    }
    return 0;
}
