/* e^x in portable C for the kernels of csrc/ (fused_rows.c, paged_attention.c). Part of attnlab.
 * Written so that `cc -O3 -march=native` vectorizes a loop that calls it. Needs AI (always inline) and
 * <string.h>, <stdint.h> included before it. */
#ifndef ATTNLAB_EXP_POLY_H
#define ATTNLAB_EXP_POLY_H

/* e^x, x clamped to [-87, 88] (the result stays a normal float): Cephes' expf polynomial on x - n ln2, times
 * 2^n built in the exponent bits. n is rounded with the 1.5 * 2^23 trick, which vectorizes everywhere. */
AI float exp_poly(float x) {
    x = x < -87.0f ? -87.0f : (x > 88.0f ? 88.0f : x);
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + (r + 1.0f);
    int32_t e = ((int32_t)n + 127) << 23;
    float scale; memcpy(&scale, &e, 4);
    return p * scale;
}

#endif
