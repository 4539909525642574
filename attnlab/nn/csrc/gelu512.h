/* GELU, erf form (BERT's), on 16 fp32 lanes, for the int8 products' stores (int8_amx.c, int8_vnni.c):
 * x/2 (1 + erf(x / sqrt 2)), erf by Abramowitz & Stegun 7.1.26 (|error| <= 1.5e-7), as int8_gemm.c's AVX2
 * version. Include only where __AVX512F__ is defined. */
#ifndef ATTNLAB_GELU512_H
#define ATTNLAB_GELU512_H
#include <immintrin.h>
#include "exp512.h" /* exp512: e^x on 16 lanes */

static inline __m512 gelu_erf16(__m512 x) {
    const __m512 z = _mm512_abs_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f)));
    const __m512 t = _mm512_div_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(z, _mm512_set1_ps(0.3275911f),
                                                                         _mm512_set1_ps(1.0f)));
    __m512 q = _mm512_set1_ps(1.061405429f);
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(-1.453152027f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(1.421413741f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(-0.284496736f));
    q = _mm512_fmadd_ps(q, t, _mm512_set1_ps(0.254829592f));
    const __m512 tail = _mm512_mul_ps(_mm512_mul_ps(q, t), exp512(_mm512_mul_ps(_mm512_mul_ps(z, z),
                                                                               _mm512_set1_ps(-1.0f))));
    __m512 erf = _mm512_sub_ps(_mm512_set1_ps(1.0f), tail);
    erf = _mm512_mask_sub_ps(erf, _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), _mm512_setzero_ps(), erf);
    return _mm512_mul_ps(_mm512_mul_ps(x, _mm512_set1_ps(0.5f)), _mm512_add_ps(erf, _mm512_set1_ps(1.0f)));
}
#endif
