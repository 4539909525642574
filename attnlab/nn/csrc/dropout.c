/* Dropout for training on a CPU, fp32 or bf16 rows (attnlab/nn/dropout.py).
 * Part of attnlab; built with the other kernels and called through the checked door of attnlab/nn/kernels.py.
 *
 * Why: torch draws a CPU dropout mask with bernoulli_ at ~8-11 ns an element, a pass of its own before the
 * multiply. Fine-tuning MiniLM on sentence pairs spent ~6% of a step there, and the attention-probability
 * dropout sends scaled_dot_product_attention to its math path. Here the mask is a hash of the element's
 * (row, column) and a seed (a counter-based generator, like Philox in cuRAND and JAX), computed and applied
 * in the same pass; the backward pass recomputes it from the seed, so no mask is stored.
 *
 * The hash: splitmix64 of (seed, row) gives a row key; murmur3's 32-bit finalizer of (column x golden ratio +
 * key) gives the element's draw, kept when it is >= threshold (p x 2^32). Both mixers are bijections with full
 * avalanche; the draws pass the tests in tests/test_dropout.py (keep rate, independence of neighbours and of
 * rows). Portable C written so that `cc -O3 -march=native` vectorizes the inner loop (AVX2 or AVX-512).
 */
#include <stdint.h>
#include <string.h>

#define AI static inline __attribute__((always_inline))

#include "bf16.h"

AI uint32_t fmix32(uint32_t h) {
    h ^= h >> 16; h *= 0x85EBCA6Bu; h ^= h >> 13; h *= 0xC2B2AE35u; h ^= h >> 16;
    return h;
}

AI uint32_t row_key(uint64_t seed, int64_t row) {
    uint64_t z = seed + (uint64_t)(row + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)(z ^ (z >> 31));
}

/* out = x * scale where the element's draw >= threshold, else 0, over rows [start, end) of `cols` elements.
 * The same (seed, threshold) over the same shape gives the same mask, whatever the split into row ranges. */
int dropout_rows(const void *x, void *out, int64_t cols, int64_t seed, int64_t threshold, float scale, int bf16,
                 int64_t start, int64_t end) {
    if (cols <= 0 || threshold < 0 || threshold > 0xFFFFFFFFll) return -1;
    const uint32_t cut = (uint32_t)threshold;
    for (int64_t r = start; r < end; r++) {
        const uint32_t key = row_key((uint64_t)seed, r);
        if (bf16) {
            const uint16_t *xr = (const uint16_t *)x + r * cols;
            uint16_t *o = (uint16_t *)out + r * cols;
            for (int64_t j = 0; j < cols; j++) {
                uint32_t h = fmix32((uint32_t)j * 0x9E3779B1u + key);
                o[j] = f2bf16(bf2f(xr[j]) * (h >= cut ? scale : 0.0f));  /* NaN stays NaN, as in torch */
            }
        } else {
            const float *xr = (const float *)x + r * cols;
            float *o = (float *)out + r * cols;
            for (int64_t j = 0; j < cols; j++) {
                uint32_t h = fmix32((uint32_t)j * 0x9E3779B1u + key);
                o[j] = xr[j] * (h >= cut ? scale : 0.0f);
            }
        }
    }
    return 0;
}
