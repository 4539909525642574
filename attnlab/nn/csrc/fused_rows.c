/* One-pass element-wise kernels for inference on a CPU, fp32 or bf16 rows (attnlab/nn/fused.py).
 * Part of attnlab; built with the other kernels and called through the checked door of attnlab/nn/kernels.py.
 *
 * Why: in a LLaMA-style model evaluated in bf16 on a CPU the GEMMs and attention are torch's, but torch's
 * RMSNorm (pow, mean, rsqrt, two multiplies and casts, each a pass over the activations) and SiLU-gate
 * (silu, then a multiply) took ~8% of SmolLM2's time on 4 x 1,024-token windows. Here each is one pass.
 *
 * Numbers: the same operations in the same order as torch's ops (bf16 rounded where torch rounds: F.rms_norm
 * rounds w * x * rsqrt(mean(x^2) + eps) once; silu(gate) is rounded before it multiplies up). What differs: the sum of
 * squares is accumulated 16 lanes wide (another order than torch's), and e^x is a Cephes polynomial (~1
 * ulp in fp32), so an fp32 result differs from torch's by rounding and a bf16 one at most by one bf16 ulp,
 * rarely. Portable C: the loops are written so that `cc -O3 -march=native` vectorizes them (AVX2 or AVX-512).
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

#include "bf16.h"

AI float round_as(float v, int bf16) { return bf16 ? bf2f(f2bf16(v)) : v; }

AI float load(const void *p, int64_t i, int bf16) {
    return bf16 ? bf2f(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

AI void store(void *p, int64_t i, float v, int bf16) {
    if (bf16) ((uint16_t *)p)[i] = f2bf16(v); else ((float *)p)[i] = v;
}

#include "exp_poly.h"

/* out[i] = silu(gate[i]) * up[i] for elements [start, end) (out may be gate: in place). */
AI void silu_mul(const void *gate, const void *up, void *out, int bf16, int64_t start, int64_t end) {
    for (int64_t i = start; i < end; i++) {
        float g = load(gate, i, bf16);
        float s = round_as(g / (1.0f + exp_poly(-g)), bf16);
        store(out, i, s * load(up, i, bf16), bf16);
    }
}

#if defined(__AVX2__) && defined(__FMA__)
/* fp32, 8 lanes: gcc leaves the loop above scalar ("control flow in loop": exp_poly's clamp), ~7 ns an
 * element on a Zen 3 core, slower than torch's two passes. The same steps (exp_poly8 is exp_poly's), so the
 * same numbers; the last few elements go through the loop above. */
static void silu_mul_f32(const float *gate, const float *up, float *out, int64_t start, int64_t end) {
    const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
    int64_t i = start;
    for (; i + 8 <= end; i += 8) {
        const __m256 g = _mm256_loadu_ps(gate + i);
        const __m256 s = _mm256_div_ps(g, _mm256_add_ps(one, exp_poly8(_mm256_sub_ps(zero, g))));
        _mm256_storeu_ps(out + i, _mm256_mul_ps(s, _mm256_loadu_ps(up + i)));
    }
    silu_mul(gate, up, out, 0, i, end);
}
#endif

int silu_mul_rows(const void *gate, const void *up, void *out, int bf16, int64_t start, int64_t end) {
#if defined(__AVX2__) && defined(__FMA__)
    if (!bf16) {
        silu_mul_f32(gate, up, out, start, end);
        return 0;
    }
#endif
    if (bf16) silu_mul(gate, up, out, 1, start, end); else silu_mul(gate, up, out, 0, start, end);
    return 0;
}

/* RMSNorm of rows [start, end) of x (rows of `cols`, contiguous): out = w * (x / sqrt(mean(x^2) + eps)),
 * rounded once, as torch's F.rms_norm does. */
AI void rms_norm(const void *x, const void *w, void *out, int64_t cols, float eps, int bf16,
                 int64_t start, int64_t end) {
    for (int64_t r = start; r < end; r++) {
        const int64_t o = r * cols;
        float acc[16] = {0};
        int64_t j = 0;
        for (; j + 16 <= cols; j += 16)
            for (int l = 0; l < 16; l++) { float v = load(x, o + j + l, bf16); acc[l] += v * v; }
        float sum = 0.0f;
        for (; j < cols; j++) { float v = load(x, o + j, bf16); sum += v * v; }
        for (int l = 0; l < 16; l++) sum += acc[l];
        const float inv = 1.0f / sqrtf(sum / (float)cols + eps);
        for (j = 0; j < cols; j++)
            store(out, o + j, load(w, j, bf16) * (load(x, o + j, bf16) * inv), bf16);
    }
}

int rms_norm_rows(const void *x, const void *w, void *out, int64_t cols, float eps, int bf16,
                   int64_t start, int64_t end) {
    if (cols <= 0) return -1;
    if (bf16) rms_norm(x, w, out, cols, eps, 1, start, end); else rms_norm(x, w, out, cols, eps, 0, start, end);
    return 0;
}

/* Rotary embedding (Su et al. 2021) of rows [start, end) of x (B, H, T, D), flattened over (B, H, T); x and
 * out are given by element strides {batch, head, position}, the last dimension contiguous. cos / sin are
 * (B or 1, T, D) contiguous rows, `cs_batch` their batch stride (0: shared), fp32 or of x's dtype.
 * out = x * cos + rotate_half(x) * sin with torch's roundings: cos and sin cast to x's dtype, each product
 * rounded, then the sum (rotate_half(x) = (-x2, x1) over the two halves of D). */
AI void rope(const void *x, const int64_t *xs, const void *cos, const void *sin, int64_t cs_batch, int cs_bf16,
             void *out, const int64_t *os, int64_t H, int64_t T, int64_t D, int bf16, int64_t start, int64_t end) {
    const int64_t half = D / 2;
    for (int64_t r = start; r < end; r++) {
        const int64_t b = r / (H * T), h = (r / T) % H, t = r % T;
        const int64_t xo = b * xs[0] + h * xs[1] + t * xs[2], oo = b * os[0] + h * os[1] + t * os[2];
        const int64_t co = b * cs_batch + t * D;
        for (int64_t d = 0; d < half; d++) {
            const float x1 = load(x, xo + d, bf16), x2 = load(x, xo + d + half, bf16);
            const float c1 = round_as(load(cos, co + d, cs_bf16), bf16);
            const float c2 = round_as(load(cos, co + d + half, cs_bf16), bf16);
            const float s1 = round_as(load(sin, co + d, cs_bf16), bf16);
            const float s2 = round_as(load(sin, co + d + half, cs_bf16), bf16);
            store(out, oo + d, round_as(x1 * c1, bf16) + round_as(-x2 * s1, bf16), bf16);
            store(out, oo + d + half, round_as(x2 * c2, bf16) + round_as(x1 * s2, bf16), bf16);
        }
    }
}

int rope_rows(const void *x, const int64_t *xs, const void *cos, const void *sin, int64_t cs_batch, int cs_bf16,
               void *out, const int64_t *os, int64_t H, int64_t T, int64_t D, int bf16, int64_t start, int64_t end) {
    if (D % 2 || H <= 0 || T <= 0 || (!bf16 && cs_bf16)) return -1;
    if (bf16 && cs_bf16) rope(x, xs, cos, sin, cs_batch, 1, out, os, H, T, D, 1, start, end);
    else if (bf16) rope(x, xs, cos, sin, cs_batch, 0, out, os, H, T, D, 1, start, end);
    else rope(x, xs, cos, sin, cs_batch, 0, out, os, H, T, D, 0, start, end);
    return 0;
}

/* One vocabulary tile of a language model's log-softmax, rows [start, end) of `logits` (rows of `cols`, fp32 or
 * bf16): the running max m and sum s of e^(x - m) of every row take in this tile (the online softmax of Milakov
 * & Gimelshein 2018), and picked[r] takes the logit of target[r] when it falls in this tile (target - v0 in
 * [0, cols)). After the last tile, log-sum-exp = m + log(s). Start from m = -inf, s = 0. One read of the tile,
 * where torch's logsumexp and the fp32 cast took five passes (amax, sub, exp, sum, copy). */
AI void lse_tile(const void *logits, int64_t cols, int bf16, const int64_t *target, int64_t v0,
                 float *run_max, float *run_sum, float *picked, int64_t start, int64_t end) {
    for (int64_t r = start; r < end; r++) {
        const int64_t o = r * cols;
        float mx[16], acc[16];
        for (int l = 0; l < 16; l++) { mx[l] = -INFINITY; acc[l] = 0.0f; }
        int64_t j = 0;
        for (; j + 16 <= cols; j += 16)
            for (int l = 0; l < 16; l++) { float v = load(logits, o + j + l, bf16); mx[l] = v > mx[l] ? v : mx[l]; }
        float m = run_max[r];
        for (int64_t k = j; k < cols; k++) { float v = load(logits, o + k, bf16); m = v > m ? v : m; }
        for (int l = 0; l < 16; l++) m = mx[l] > m ? mx[l] : m;
        for (j = 0; j + 16 <= cols; j += 16)
            for (int l = 0; l < 16; l++) acc[l] += exp_poly(load(logits, o + j + l, bf16) - m);
        float s = 0.0f;
        for (int64_t k = j; k < cols; k++) s += exp_poly(load(logits, o + k, bf16) - m);
        for (int l = 0; l < 16; l++) s += acc[l];
        run_sum[r] = (run_sum[r] > 0.0f ? run_sum[r] * exp_poly(run_max[r] - m) : 0.0f) + s;
        run_max[r] = m;
        const int64_t t = target[r] - v0;
        if (t >= 0 && t < cols) picked[r] = load(logits, o + t, bf16);
    }
}

int lse_tile_rows(const void *logits, int64_t cols, int bf16, const int64_t *target, int64_t v0,
                   float *run_max, float *run_sum, float *picked, int64_t start, int64_t end) {
    if (bf16) lse_tile(logits, cols, 1, target, v0, run_max, run_sum, picked, start, end);
    else lse_tile(logits, cols, 0, target, v0, run_max, run_sum, picked, start, end);
    return 0;
}
