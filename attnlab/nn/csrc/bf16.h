/* bfloat16 <-> float for the kernels of csrc/ (fused_rows.c, dropout.c). Part of attnlab. Needs <stdint.h> and
 * <string.h> included before it. */
#ifndef ATTNLAB_BF16_H
#define ATTNLAB_BF16_H

static inline __attribute__((always_inline)) float bf2f(uint16_t h) {
    uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f;
}

/* fp32 -> bf16 rounding to nearest even, NaN kept a (quiet) NaN: torch's cast */
static inline __attribute__((always_inline)) uint16_t f2bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return (uint16_t)((f != f) ? ((u >> 16) | 0x40u) : rounded);
}

#endif
