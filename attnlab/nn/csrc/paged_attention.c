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
 * by chunk) and e^x from a Cephes polynomial (~1 ulp), so results differ from SDPA's by rounding. With AVX2
 * and FMA the kernel is written in intrinsics (below, why); elsewhere portable C whose loops `cc -O3` vectorizes.
 */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))
#define CHUNK 64       /* keys per chunk: the scores of G heads x 64 keys stay in L1 */
#define MAX_GD 4096    /* G x D floats of queries and accumulators on the stack (e.g. 16 heads of 256) */
#define MAX_H 256      /* AVX2 path: at most this many query heads of a row taken together (>= MAX_GD / 16) ... */
#define MAX_HD 4096    /* ... and at most this many of their floats (>= MAX_GD): the stack stays at the portable
                        * path's ~96 KB, which fits the smallest thread stacks (musl's 128 KB) */

#include "exp_poly.h"  /* e^x: exp(-inf) is never asked for */
#include "half.h"      /* h2f (the portable path's fp16 cache) */
#include "thread_pool.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>
/* AVX2 + FMA (Zen, Haswell and later): the same online softmax with the work laid out for the memory. A
 * thread's items of one row are taken together, so each slot's keys (all its heads, contiguous in the pool)
 * are read once and every query head of the row scores against them; the slots `PREFETCH_AHEAD` keys on are
 * prefetched (a row's blocks lie anywhere in the pool, so the hardware's stream prefetcher loses the trail
 * at each block edge). Serving SmolLM2 with 64 rows of ~300 keys on a 2-core AVX2 EPYC, the portable loops
 * (the #else branch) took 17 ms a layer (1.6 GB/s): their 16-lane partial sums are added one by one (float addition is
 * not reassociated without -ffast-math), and each (row, head) pass read every slot anew. */
#define PREFETCH_AHEAD 6

AI float hsum8(__m256 v) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

/* 8 cache elements from element `i` on, as floats: fp32 as they are, fp16 widened (F16C) */
AI __m256 load8(const void *base, int64_t i, const int F16) {
    return F16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)base + i)))
               : _mm256_loadu_ps((const float *)base + i);
}

/* acc (D floats) += sum over the chunk's n keys of p[j] * v_j (v_j at element slots[j] * stride + at of the
 * values), NV vectors of 8 at a time held in registers */
AI void add_values(float *acc, const float *p, const void *values, int64_t at, const int64_t *slots, int64_t n,
                   int64_t stride, int64_t D, const int NV, const int F16) {
    for (int64_t d0 = 0; d0 < D; d0 += 8 * NV) {
        __m256 a[8];
        for (int i = 0; i < NV; i++) a[i] = _mm256_loadu_ps(acc + d0 + 8 * i);
        for (int64_t j = 0; j < n; j++) {
            const __m256 pj = _mm256_broadcast_ss(p + j);
            const int64_t v = slots[j] * stride + at + d0;
            for (int i = 0; i < NV; i++) a[i] = _mm256_fmadd_ps(pj, load8(values, v + 8 * i, F16), a[i]);
        }
        for (int i = 0; i < NV; i++) _mm256_storeu_ps(acc + d0 + 8 * i, a[i]);
    }
}

AI void prefetch_slot(const void *keys, const void *values, int64_t at, int64_t bytes, const int F16) {
    const char *k = (const char *)keys + at * (F16 ? 2 : 4), *v = (const char *)values + at * (F16 ? 2 : 4);
    for (int64_t o = 0; o < bytes; o += 64) {
        _mm_prefetch(k + o, _MM_HINT_T0);
        _mm_prefetch(v + o, _MM_HINT_T0);
    }
}

AI int attend(const float *q, const void *keys, const void *values, int64_t S, int64_t B, int64_t Hq, int64_t Hk,
             int64_t D, const int64_t *slots, const int64_t *offsets, int64_t N, float scale, float *out,
             int64_t start, int64_t end, const int F16) {
    if (Hk <= 0 || Hq % Hk || D <= 0 || D % 16 || (Hq / Hk) * D > MAX_GD || start < 0 || end > B * Hk)
        return -1;  /* the door's checks failed to hold: read nothing */
    const int64_t G = Hq / Hk, stride = Hk * D;
    const int NV = D % 64 == 0 ? 8 : D % 32 == 0 ? 4 : 2;
    /* key heads per pass: as many as fit the scratch; G <= MAX_GD / 16 <= MAX_H and G x D <= MAX_GD <= MAX_HD,
     * so at least one */
    const int64_t by_heads = MAX_H / G, by_floats = MAX_HD / (G * D);
    const int64_t per_pass = by_heads < by_floats ? by_heads : by_floats;
    float qs[MAX_HD], acc[MAX_HD], s[CHUNK * MAX_H], m[MAX_H], l[MAX_H];
    for (int64_t item = start; item < end;) {
        /* the items of one row in [start, end): key heads hk0 .. hk1 - 1, query heads h0 .. h0 + H - 1 */
        const int64_t b = item / Hk, hk0 = item % Hk;
        int64_t hk1 = (b + 1) * Hk <= end ? Hk : end - b * Hk;
        hk1 = hk1 - hk0 > per_pass ? hk0 + per_pass : hk1;
        const int64_t H = (hk1 - hk0) * G, h0 = hk0 * G;
        item = b * Hk + hk1;
        const int64_t n0 = offsets[b], n1 = offsets[b + 1];
        if (n0 < 0 || n1 > N || n1 <= n0)
            return -1;
        for (int64_t j = n0; j < n1; j++)
            if (slots[j] < 0 || slots[j] >= S)
                return -1;
        const __m256 vs = _mm256_set1_ps(scale);
        for (int64_t i = 0; i < H * D; i += 8)
            _mm256_storeu_ps(qs + i, _mm256_mul_ps(_mm256_loadu_ps(q + (b * Hq + h0) * D + i), vs));
        for (int64_t h = 0; h < H; h++) { m[h] = -INFINITY; l[h] = 0.0f; }
        memset(acc, 0, sizeof(float) * H * D);
        const int64_t head_bytes = (hk1 - hk0) * D * (F16 ? 2 : 4), first = hk0 * D;
        for (int64_t c0 = n0; c0 < n1; c0 += CHUNK) {
            const int64_t n = n1 - c0 < CHUNK ? n1 - c0 : CHUNK;
            for (int64_t j = 0; j < n; j++) {
                if (c0 + j + PREFETCH_AHEAD < n1)
                    prefetch_slot(keys, values, slots[c0 + j + PREFETCH_AHEAD] * stride + first, head_bytes, F16);
                const int64_t k = slots[c0 + j] * stride + first;
                for (int64_t h = 0; h < H; h++) {
                    const int64_t kh = k + (h / G) * D;
                    const float *qh = qs + h * D;
                    __m256 a0 = _mm256_mul_ps(_mm256_loadu_ps(qh), load8(keys, kh, F16));
                    __m256 a1 = _mm256_mul_ps(_mm256_loadu_ps(qh + 8), load8(keys, kh + 8, F16));
                    for (int64_t d = 16; d < D; d += 16) {
                        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), load8(keys, kh + d, F16), a0);
                        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d + 8), load8(keys, kh + d + 8, F16), a1);
                    }
                    s[h * CHUNK + j] = hsum8(_mm256_add_ps(a0, a1));
                }
            }
            for (int64_t h = 0; h < H; h++) {
                float *sh = s + h * CHUNK, mx = m[h];
                for (int64_t j = 0; j < n; j++) mx = sh[j] > mx ? sh[j] : mx;
                const float corr = m[h] == -INFINITY ? 0.0f : exp_poly(m[h] - mx);
                const __m256 vmx = _mm256_set1_ps(mx);
                __m256 vsum = _mm256_setzero_ps();
                int64_t j = 0;
                for (; j + 8 <= n; j += 8) {
                    const __m256 e = exp_poly8(_mm256_sub_ps(_mm256_loadu_ps(sh + j), vmx));
                    _mm256_storeu_ps(sh + j, e);
                    vsum = _mm256_add_ps(vsum, e);
                }
                float sum = hsum8(vsum);
                for (; j < n; j++) {
                    sh[j] = exp_poly(sh[j] - mx);
                    sum += sh[j];
                }
                l[h] = l[h] * corr + sum;
                m[h] = mx;
                if (corr != 1.0f) {
                    const __m256 vc = _mm256_set1_ps(corr);
                    for (int64_t d = 0; d < D; d += 8)
                        _mm256_storeu_ps(acc + h * D + d, _mm256_mul_ps(_mm256_loadu_ps(acc + h * D + d), vc));
                }
                const int64_t at = first + (h / G) * D;
                if (NV == 8) add_values(acc + h * D, sh, values, at, slots + c0, n, stride, D, 8, F16);
                else if (NV == 4) add_values(acc + h * D, sh, values, at, slots + c0, n, stride, D, 4, F16);
                else add_values(acc + h * D, sh, values, at, slots + c0, n, stride, D, 2, F16);
            }
        }
        for (int64_t h = 0; h < H; h++) {
            float *o = out + (b * Hq + h0 + h) * D;
            const __m256 inv = _mm256_set1_ps(1.0f / l[h]);
            for (int64_t d = 0; d < D; d += 8)
                _mm256_storeu_ps(o + d, _mm256_mul_ps(_mm256_loadu_ps(acc + h * D + d), inv));
        }
    }
    return 0;
}

#else
/* sum of a[i] * b[i] over D (a multiple of 16): 16 partial sums, so the loop vectorizes */
AI float dot16(const float *restrict a, const float *restrict b, int64_t D) {
    float acc[16] = {0};
    for (int64_t i = 0; i < D; i += 16)
        for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
    float s = 0.0f;
    for (int l = 0; l < 16; l++) s += acc[l];
    return s;
}

/* D cache elements from element `i` on as floats: fp32 in place, fp16 widened into `buf` */
AI const float *row(const void *base, int64_t i, int64_t D, float *buf, const int F16) {
    if (!F16) return (const float *)base + i;
    for (int64_t d = 0; d < D; d++) buf[d] = h2f(((const uint16_t *)base)[i + d]);
    return buf;
}

AI int attend(const float *q, const void *keys, const void *values, int64_t S, int64_t B, int64_t Hq, int64_t Hk,
              int64_t D, const int64_t *slots, const int64_t *offsets, int64_t N, float scale, float *out,
              int64_t start, int64_t end, const int F16) {
    if (Hk <= 0 || Hq % Hk || D <= 0 || D % 16 || (Hq / Hk) * D > MAX_GD || start < 0 || end > B * Hk)
        return -1;  /* the door's checks failed to hold: read nothing */
    const int64_t G = Hq / Hk;
    float qs[MAX_GD], acc[MAX_GD], s[CHUNK * (MAX_GD / 16)];
    float m[MAX_GD / 16], l[MAX_GD / 16], buf[MAX_GD];
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
                const float *k = row(keys, (slot * Hk + hk) * D, D, buf, F16);
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
                const float *v = row(values, (slots[c0 + j] * Hk + hk) * D, D, buf, F16);
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

#endif

int paged_decode_attention(const float *q, const float *keys, const float *values, int64_t S, int64_t B,
                           int64_t Hq, int64_t Hk, int64_t D, const int64_t *slots, const int64_t *offsets,
                           int64_t N, float scale, float *out, int64_t start, int64_t end) {
    return attend(q, keys, values, S, B, Hq, Hk, D, slots, offsets, N, scale, out, start, end, 0);
}

int paged_decode_attention_f16(const float *q, const uint16_t *keys, const uint16_t *values, int64_t S, int64_t B,
                               int64_t Hq, int64_t Hk, int64_t D, const int64_t *slots, const int64_t *offsets,
                               int64_t N, float scale, float *out, int64_t start, int64_t end) {
    return attend(q, keys, values, S, B, Hq, Hk, D, slots, offsets, N, scale, out, start, end, 1);
}

/* The two entry points with their (row, key head) items [start, end) split over `parts` threads of
 * thread_pool.c (the door's split, without a Python thread per part). */
typedef struct {
    const float *q;
    const void *keys, *values;
    int64_t S, B, Hq, Hk, D;
    const int64_t *slots, *offsets;
    int64_t N;
    float scale;
    float *out;
    int f16;
    atomic_int rc;
} attend_job;

/* one function per cache dtype, so that attend() is specialised (F16 a constant) as in the entry points */
static void attend_part_f32(void *ctx, int64_t start, int64_t end) {
    attend_job *j = ctx;
    const int rc = attend(j->q, j->keys, j->values, j->S, j->B, j->Hq, j->Hk, j->D, j->slots, j->offsets, j->N,
                          j->scale, j->out, start, end, 0);
    if (rc) atomic_store(&j->rc, rc);
}

static void attend_part_f16(void *ctx, int64_t start, int64_t end) {
    attend_job *j = ctx;
    const int rc = attend(j->q, j->keys, j->values, j->S, j->B, j->Hq, j->Hk, j->D, j->slots, j->offsets, j->N,
                          j->scale, j->out, start, end, 1);
    if (rc) atomic_store(&j->rc, rc);
}

static int attend_par(attend_job *j, int64_t start, int64_t end, int parts) {
    if (start < 0 || start > end || end > j->B * j->Hk) return -1;
    pool_run(j->f16 ? attend_part_f16 : attend_part_f32, j, start, end, parts);
    return atomic_load(&j->rc);
}

int paged_decode_attention_par(const float *q, const float *keys, const float *values, int64_t S, int64_t B,
                               int64_t Hq, int64_t Hk, int64_t D, const int64_t *slots, const int64_t *offsets,
                               int64_t N, float scale, float *out, int64_t start, int64_t end, int parts) {
    attend_job j = {q, keys, values, S, B, Hq, Hk, D, slots, offsets, N, scale, out, 0, 0};
    return attend_par(&j, start, end, parts);
}

int paged_decode_attention_f16_par(const float *q, const uint16_t *keys, const uint16_t *values, int64_t S,
                                   int64_t B, int64_t Hq, int64_t Hk, int64_t D, const int64_t *slots,
                                   const int64_t *offsets, int64_t N, float scale, float *out, int64_t start,
                                   int64_t end, int parts) {
    attend_job j = {q, keys, values, S, B, Hq, Hk, D, slots, offsets, N, scale, out, 1, 0};
    return attend_par(&j, start, end, parts);
}
