/* IEEE half (fp16) to float for the kernels of csrc/ (ggml_blocks.c's block scales, paged_attention.c's fp16
 * cache). Part of attnlab. Needs <stdint.h> and <string.h> included before it. */
#ifndef ATTNLAB_HALF_H
#define ATTNLAB_HALF_H
#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline float h2f(uint16_t h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0) {            /* zero or subnormal */
        if (man == 0) bits = sign;
        else { exp = 127 - 15 + 1; while (!(man & 0x400)) { man <<= 1; exp--; } man &= 0x3ff;
               bits = sign | (exp << 23) | (man << 13); }
    } else if (exp == 31) bits = sign | 0x7f800000u | (man << 13);
    else bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    float f; memcpy(&f, &bits, 4); return f;
#endif
}

#endif
