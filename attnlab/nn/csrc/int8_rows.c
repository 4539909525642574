/* The element-wise ends of an int8 linear layer (attnlab/nn/int8.py): quantize activations one row (token)
 * at a time, and turn the int32 products back into floats. Part of attnlab; built with the other kernels and
 * called through the checked door of attnlab/nn/kernels.py.
 *
 * Why in C: done with torch ops, each end is 4-5 passes over the activations (multiply by the smoothing
 * factors, abs, max, divide, round, cast; cast, outer product of scales, multiply-add), which cost as much
 * as the int8 matrix product itself on MiniLM's small matrices. Here each is one pass, with the row still
 * in L1 for the second read.
 *
 * quantize: s_m = max_k |x_mk * f_k| / 127, q_mk = round_half_even(x_mk * f_k / s_m)  (f = 1 without
 *           smoothing factors; a row of zeros gets s_m = 1 and all-zero q)
 * dequant:  y_mn = acc_mn * (s_m * w_n) + b_n, written over acc
 * quantize_u7: the AVX2 product's 7-bit codes with a zero point per row (below)
 */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

int int8_quantize_rows(const float *x, const float *f, int64_t rows, int64_t cols, int8_t *q, float *scale) {
    if (rows < 0 || cols < 0) return -1;
    for (int64_t m = 0; m < rows; m++) {
        const float *xr = x + m * cols;
        int8_t *qr = q + m * cols;
        int64_t k = 0;
        float amax = 0.0f;
#if defined(__AVX512F__)
        __m512 vmax = _mm512_setzero_ps();
        for (; k + 16 <= cols; k += 16) {
            __m512 v = _mm512_loadu_ps(xr + k);
            if (f) v = _mm512_mul_ps(v, _mm512_loadu_ps(f + k));
            vmax = _mm512_max_ps(vmax, _mm512_abs_ps(v));
        }
        amax = _mm512_reduce_max_ps(vmax);
#elif defined(__AVX2__)
        const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
        __m256 vmax = _mm256_setzero_ps();
        for (; k + 8 <= cols; k += 8) {
            __m256 v = _mm256_loadu_ps(xr + k);
            if (f) v = _mm256_mul_ps(v, _mm256_loadu_ps(f + k));
            vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, absmask));
        }
        float lanes[8];
        _mm256_storeu_ps(lanes, vmax);
        for (int i = 0; i < 8; i++) amax = lanes[i] > amax ? lanes[i] : amax;
#endif
        for (; k < cols; k++) {
            float v = fabsf(f ? xr[k] * f[k] : xr[k]);
            if (v > amax) amax = v;
        }
        float s = amax > 0.0f ? amax / 127.0f : 1.0f;
        float r = 1.0f / s;
        scale[m] = s;
        k = 0;
#if defined(__AVX512F__)
        __m512 vr = _mm512_set1_ps(r);
        for (; k + 16 <= cols; k += 16) {
            __m512 v = _mm512_loadu_ps(xr + k);
            if (f) v = _mm512_mul_ps(v, _mm512_loadu_ps(f + k));
            /* round to nearest even (the default MXCSR mode), then saturate to int8 */
            __m512i i = _mm512_cvtps_epi32(_mm512_mul_ps(v, vr));
            _mm_storeu_si128((__m128i *)(qr + k), _mm512_cvtsepi32_epi8(i));
        }
#elif defined(__AVX2__)
        __m256 vr = _mm256_set1_ps(r);
        for (; k + 16 <= cols; k += 16) {
            __m256 v0 = _mm256_loadu_ps(xr + k), v1 = _mm256_loadu_ps(xr + k + 8);
            if (f) {
                v0 = _mm256_mul_ps(v0, _mm256_loadu_ps(f + k));
                v1 = _mm256_mul_ps(v1, _mm256_loadu_ps(f + k + 8));
            }
            /* round to nearest even, then saturate 32 -> 16 -> 8 bits (the packs interleave 128-bit lanes:
             * the permute puts the 16 bytes back in order) */
            __m256i i16 = _mm256_packs_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v0, vr)),
                                             _mm256_cvtps_epi32(_mm256_mul_ps(v1, vr)));
            i16 = _mm256_permute4x64_epi64(i16, 0xD8);
            __m128i i8 = _mm_packs_epi16(_mm256_castsi256_si128(i16), _mm256_extracti128_si256(i16, 1));
            _mm_storeu_si128((__m128i *)(qr + k), i8);
        }
#endif
        for (; k < cols; k++) {
            float v = nearbyintf((f ? xr[k] * f[k] : xr[k]) * r);
            qr[k] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
    }
    return 0;
}

/* For the AVX2 product (int8_gemm.c): 7-bit codes with a zero point, so that 0 stays exact.
 * lo = min(0, min_k x_mk f_k), hi = max(0, max_k x_mk f_k), s_m = (hi - lo) / 127 (1 for a row of zeros),
 * z_m = round(-lo / s_m), q_mk = clamp(round(x_mk f_k / s_m) + z_m, 0, 127). */
int int8_quantize_rows_u7(const float *x, const float *f, int64_t rows, int64_t cols, uint8_t *q, float *scale,
                          int32_t *zero) {
    if (rows < 0 || cols < 0) return -1;
    for (int64_t m = 0; m < rows; m++) {
        const float *xr = x + m * cols;
        uint8_t *qr = q + m * cols;
        int64_t k = 0;
        float lo = 0.0f, hi = 0.0f;
#if defined(__AVX2__)
        __m256 vlo = _mm256_setzero_ps(), vhi = _mm256_setzero_ps();
        for (; k + 8 <= cols; k += 8) {
            __m256 v = _mm256_loadu_ps(xr + k);
            if (f) v = _mm256_mul_ps(v, _mm256_loadu_ps(f + k));
            vlo = _mm256_min_ps(vlo, v);
            vhi = _mm256_max_ps(vhi, v);
        }
        float lanes_lo[8], lanes_hi[8];
        _mm256_storeu_ps(lanes_lo, vlo);
        _mm256_storeu_ps(lanes_hi, vhi);
        for (int i = 0; i < 8; i++) {
            lo = lanes_lo[i] < lo ? lanes_lo[i] : lo;
            hi = lanes_hi[i] > hi ? lanes_hi[i] : hi;
        }
#endif
        for (; k < cols; k++) {
            const float v = f ? xr[k] * f[k] : xr[k];
            lo = v < lo ? v : lo;
            hi = v > hi ? v : hi;
        }
        const float s = hi > lo ? (hi - lo) / 127.0f : 1.0f;
        const float r = 1.0f / s;
        float zf = nearbyintf(-lo * r);
        zf = zf > 127.0f ? 127.0f : zf;
        const int32_t z = (int32_t)zf;
        scale[m] = s;
        zero[m] = z;
        k = 0;
#if defined(__AVX2__)
        const __m256 vr = _mm256_set1_ps(r);
        const __m256i vz = _mm256_set1_epi32(z);
        const __m128i top = _mm_set1_epi8(127);
        for (; k + 16 <= cols; k += 16) {
            __m256 v0 = _mm256_loadu_ps(xr + k), v1 = _mm256_loadu_ps(xr + k + 8);
            if (f) {
                v0 = _mm256_mul_ps(v0, _mm256_loadu_ps(f + k));
                v1 = _mm256_mul_ps(v1, _mm256_loadu_ps(f + k + 8));
            }
            /* round to nearest even, add the zero point, saturate 32 -> 16 bits (signed) -> 8 bits (unsigned,
             * so below 0 becomes 0), then cap at 127 (the packs interleave 128-bit lanes: the permute puts
             * the 16 values back in order) */
            __m256i i16 = _mm256_packs_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v0, vr)), vz),
                                             _mm256_add_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(v1, vr)), vz));
            i16 = _mm256_permute4x64_epi64(i16, 0xD8);
            __m128i u8 = _mm_packus_epi16(_mm256_castsi256_si128(i16), _mm256_extracti128_si256(i16, 1));
            _mm_storeu_si128((__m128i *)(qr + k), _mm_min_epu8(u8, top));
        }
#endif
        for (; k < cols; k++) {
            const float v = nearbyintf((f ? xr[k] * f[k] : xr[k]) * r) + zf;
            qr[k] = (uint8_t)(v > 127.0f ? 127.0f : v >= 0.0f ? v : 0.0f); /* NaN -> 0 */
        }
    }
    return 0;
}

/* In place: the int32 products are overwritten by their float values (same size). A fresh 4 MB output
 * for each of MiniLM's FFN products would cost page faults and write-allocate traffic on top of the pass. */
int int8_dequant_rows(int32_t *acc, const float *restrict scale, const float *restrict wscale,
                       const float *restrict bias, int64_t rows, int64_t cols) {
    if (rows < 0 || cols < 0) return -1;
    for (int64_t m = 0; m < rows; m++) {
        int32_t *ar = acc + m * cols;
        const float s = scale[m];
        int64_t n = 0;
#if defined(__AVX512F__)
        const __m512 vs = _mm512_set1_ps(s);
        for (; n + 16 <= cols; n += 16) {
            __m512 v = _mm512_cvtepi32_ps(_mm512_loadu_si512((const void *)(ar + n)));
            __m512 f = _mm512_mul_ps(vs, _mm512_loadu_ps(wscale + n));
            v = bias ? _mm512_fmadd_ps(v, f, _mm512_loadu_ps(bias + n)) : _mm512_mul_ps(v, f);
            _mm512_storeu_ps((float *)(ar + n), v);
        }
#endif
        for (; n < cols; n++) {
            float v = (float)ar[n] * (s * wscale[n]);
            if (bias) v += bias[n];
            memcpy(ar + n, &v, sizeof v);
        }
    }
    return 0;
}
