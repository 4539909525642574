/* Matrix products straight from llama.cpp's block-quantized weights (GGUF Q4_0, Q4_1, Q8_0), fp32 activations.
 *
 * Part of attnlab (built with the machine's C compiler and called through the checked door of attnlab/nn/kernels.py).
 * Written from the published GGUF block layouts, 32 weights per block:
 *   Q4_0: fp16 d, 16 bytes of nibbles          w = d * (q - 8)    q in 0..15
 *   Q4_1: fp16 d, fp16 m, 16 bytes of nibbles  w = d * q + m      q in 0..15
 *   Q8_0: fp16 d, 32 int8                      w = d * q
 * Nibble order: byte j holds weight j (low 4 bits) and weight j + 16 (high 4 bits).
 *
 * Why a kernel of our own: a decoding step reads every weight once, so its speed is bytes moved. Each
 * weight is read as its 4.5-8.5 bits and widened in registers; the dot product runs in fp32 on the
 * fp32 activations (no activation quantization), so results match the dequantized fp32 model to
 * rounding. The per-block offset folds out of the inner loop: sum_j (d q_j + m) x_j = d (q . x) + m sum(x).
 *
 * out (M, N) = x (M, K) @ W^T, W (N, K) given as N rows of K/32 blocks.
 */
#include <stdatomic.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

#include "half.h"  /* h2f */
#include "thread_pool.h"

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }


#if defined(__AVX512F__)
#define AI static inline __attribute__((always_inline))
#define HAVE_SIMD 1
/* At batch 1 each weight row is read once, straight from memory, and the products wait on it: a software
 * prefetch 256 bytes ahead of each of the 4 rows in flight took the 30 MB Q8_0 LM head of SmolLM2 from 5.0
 * to 2.1 ms (128 ahead: 3.1 ms, 1024: 2.7 ms) ... */
#define PREFETCH 256
/* ... and the same block of the next tile of rows (`tile_bytes` on): the rows of a matrix follow each other,
 * so this keeps the stream ahead across the ends of rows, which the 256-byte lookahead alone does not. Over
 * SmolLM2's 30 layers of small matrices (66 MB of Q4_1 per token) it took the products from 9.0 to 6.1 ms. */
AI void prefetch_ahead(const uint8_t *blk, size_t tile_bytes) {
    _mm_prefetch((const char *)blk + PREFETCH, _MM_HINT_T0);
    _mm_prefetch((const char *)blk + tile_bytes, _MM_HINT_T0);
}
/* One block's 32 weights as two fp32 vectors (weights 0..15, 16..31). For 4-bit blocks the 16 possible
 * values d*q + m form a 16-float table and vpermps picks from it by the nibble (it reads only the low 4
 * bits of each index), so dequantizing costs one fma, one widen and two permutes per block. */
AI void unpack(int kind, const uint8_t *blk, __m512 iota, __m512 *w0, __m512 *w1) {
    if (kind == 8) {
        const float d = h2f(rd16(blk));
        const __m512 vd = _mm512_set1_ps(d);
        *w0 = _mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)))));
        *w1 = _mm512_mul_ps(vd, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 18)))));
        return;
    }
    __m512 table;
    if (kind == 3) {  /* d and m are adjacent halves: one conversion for both */
        uint32_t dm; memcpy(&dm, blk, 4);
        const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm));
        table = _mm512_fmadd_ps(_mm512_broadcastss_ps(f), iota, _mm512_broadcastss_ps(_mm_movehdup_ps(f)));
    } else {
        const float d = h2f(rd16(blk));
        table = _mm512_fmadd_ps(_mm512_set1_ps(d), iota, _mm512_set1_ps(-8.f * d));
    }
    const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + (kind == 3 ? 4 : 2))));
    *w0 = _mm512_permutexvar_ps(v, table);
    *w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), table);
}

/* NR weight rows x MR activation rows at once: NR*MR independent accumulators hide the fma latency
 * (batch 1 uses 4 weight rows; longer inputs reuse each unpacked block for 8 activation rows). */
AI void tile(int kind, const uint8_t *w, size_t row_bytes, int bs, int nb, const float *x, int64_t K,
             float *out, int64_t N, const int NR, const int MR) {
    const __m512 iota = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512 acc[4][8];
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++) acc[r][i] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        for (int r = 0; r < NR; r++) {
            __m512 w0, w1;
            if (MR == 1) prefetch_ahead(w + r * row_bytes + (size_t)b * bs, NR * row_bytes);
            unpack(kind, w + r * row_bytes + (size_t)b * bs, iota, &w0, &w1);
            for (int i = 0; i < MR; i++) {
                const float *xb = x + i * K + 32 * b;
                acc[r][i] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(xb + 16), _mm512_fmadd_ps(w0, _mm512_loadu_ps(xb), acc[r][i]));
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < MR; i++) out[i * N + r] = _mm512_reduce_add_ps(acc[r][i]);
}

#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
/* Integer dot products for rows of x taken one at a time (batch-1 decoding), as llama.cpp does: x is
 * quantized to int8 in blocks of 32 (one scale each, round to nearest), and each weight block meets its x
 * block in one vpdpbusd (unsigned x signed bytes -> 8 int32 sums), scaled once per block:
 *   Q4_0: d_w d_x (sum q_w q_x - 8 sum q_x)    Q4_1: d_w d_x sum q_w q_x + m_w d_x sum q_x
 *   Q8_0: d_w d_x sum q_w q_x (|q_w| unsigned, its sign moved onto q_x)
 * Unpacking a 4-bit block costs a shift and a mask instead of widening it to 32 floats, which is what
 * bounded the fp32 path at ~16.5 G weights/s. The price is x's rounding (1/254 of each block's range):
 * results are no longer the dequantized fp32 product to rounding, so only the batch-1 decode step takes
 * this path (`ggml_exact(1)` turns it off), with its 4-bit matrices repacked (ggml_x16.c, VNNI or AVX2):
 * prompts and the LM head, called from Python, stay exact. The head is bound by bytes, not arithmetic: with
 * int8 activations it decoded SmolLM2 no faster (AMX Xeon, 1 and 2 threads, 2026-11-30). */
#define HAVE_DOT_I8 1

static void quantize_x(const float *x, int nb, int8_t *q, float *dx, int32_t *sq) {
    for (int b = 0; b < nb; b++) {
        const __m512 x0 = _mm512_loadu_ps(x + 32 * b), x1 = _mm512_loadu_ps(x + 32 * b + 16);
        const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(x0), _mm512_abs_ps(x1)));
        const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        const __m512i i0 = _mm512_cvtps_epi32(_mm512_mul_ps(x0, _mm512_set1_ps(inv)));
        const __m512i i1 = _mm512_cvtps_epi32(_mm512_mul_ps(x1, _mm512_set1_ps(inv)));
        _mm_storeu_si128((__m128i *)(q + 32 * b), _mm512_cvtsepi32_epi8(i0));
        _mm_storeu_si128((__m128i *)(q + 32 * b + 16), _mm512_cvtsepi32_epi8(i1));
        dx[b] = d;
        sq[b] = _mm512_reduce_add_epi32(_mm512_add_epi32(i0, i1));
    }
}

/* 4 weight rows (row_bytes apart) against one quantized x: 4 independent accumulators. */
AI void dot4_i8(const int kind, const uint8_t *w, size_t row_bytes, int nb, const int8_t *xq, const float *dx,
                const int32_t *sq, float *out, const int NR) {
    const int bs = kind == 2 ? 18 : kind == 3 ? 20 : 34;
    const __m256i low = _mm256_set1_epi8(0x0F);
    __m256 acc[4];
    float extra[4] = {0.f, 0.f, 0.f, 0.f};
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + 32 * b));
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + r * row_bytes + (size_t)b * bs;
            prefetch_ahead(blk, NR * row_bytes);
            __m256i dot;
            float dw;
            if (kind == 8) {
                const __m256i wq = _mm256_loadu_si256((const __m256i *)(blk + 2));
                dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xv, wq));
                dw = h2f(rd16(blk));
            } else {
                const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (kind == 3 ? 4 : 2)));
                const __m256i wq = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
                dot = _mm256_dpbusd_epi32(_mm256_setzero_si256(), wq, xv);
                if (kind == 3) {
                    uint32_t dm; memcpy(&dm, blk, 4);
                    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm));
                    dw = _mm_cvtss_f32(f);
                    extra[r] += _mm_cvtss_f32(_mm_movehdup_ps(f)) * dx[b] * (float)sq[b];
                } else {
                    dw = h2f(rd16(blk));
                    extra[r] -= 8.f * dw * dx[b] * (float)sq[b];
                }
            }
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * dx[b]), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) {
        const __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc[r]), _mm256_extractf128_ps(acc[r], 1));
        const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
        out[r] = _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2))) + extra[r];
    }
}
#endif
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
/* The same kernels 8 floats wide, for CPUs with AVX2 but no AVX512 (AMD Zen 1-3, most Intel client parts). */
#define AI static inline __attribute__((always_inline))
#define HAVE_SIMD 1
/* Prefetching as above: over SmolLM2-sized Q4_1 matrices (66 MB) the integer products of one token took 26 ms
 * without it, 17-18 with it (2-core AVX2 EPYC under load; 128..1024 bytes ahead measured alike). */
#define PREFETCH 256
AI void prefetch_ahead(const uint8_t *blk, size_t tile_bytes) {
    _mm_prefetch((const char *)blk + PREFETCH, _MM_HINT_T0);
    _mm_prefetch((const char *)blk + tile_bytes, _MM_HINT_T0);
}

AI float hsum8(__m256 v) {
    const __m128 h = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 h2 = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h2, _mm_movehdup_ps(h2)));
}

/* One block's 32 weights as four fp32 vectors (weights 0..7, 8..15, 16..23, 24..31). AVX2 has no 16-entry
 * permute, so a table lookup would cost two permutes and a blend per 8 weights: widening the codes, converting
 * and one fma d*q + m is fewer instructions. */
AI void unpack(int kind, const uint8_t *blk, __m256 w[4]) {
    if (kind == 8) {
        const __m256 vd = _mm256_set1_ps(h2f(rd16(blk)));
        for (int i = 0; i < 4; i++)
            w[i] = _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(
                       _mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * i)))));
        return;
    }
    __m256 vd, vm;
    if (kind == 3) {  /* d and m are adjacent halves: one conversion for both */
        uint32_t dm; memcpy(&dm, blk, 4);
        const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm));
        vd = _mm256_broadcastss_ps(f);
        vm = _mm256_broadcastss_ps(_mm_movehdup_ps(f));
    } else {
        const float d = h2f(rd16(blk));
        vd = _mm256_set1_ps(d);
        vm = _mm256_set1_ps(-8.f * d);
    }
    const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (kind == 3 ? 4 : 2))), low = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(raw, low), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), low);
    w[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(lo)), vd, vm);
    w[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(lo, 8))), vd, vm);
    w[2] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(hi)), vd, vm);
    w[3] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(hi, 8))), vd, vm);
}

/* NR weight rows x MR activation rows, as above. With 16 vector registers, a single activation row keeps two
 * accumulators per weight row (chains of 2 fmas per block, not 4); MR rows keep one each. */
AI void tile(int kind, const uint8_t *w, size_t row_bytes, int bs, int nb, const float *x, int64_t K,
             float *out, int64_t N, const int NR, const int MR) {
    __m256 acc[4][8];
    for (int r = 0; r < NR; r++)
        for (int i = 0; i < (MR == 1 ? 2 : MR); i++) acc[r][i] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        for (int r = 0; r < NR; r++) {
            __m256 wv[4];
            if (MR == 1) prefetch_ahead(w + r * row_bytes + (size_t)b * bs, NR * row_bytes);
            unpack(kind, w + r * row_bytes + (size_t)b * bs, wv);
            if (MR == 1) {
                const float *xb = x + 32 * b;
                acc[r][0] = _mm256_fmadd_ps(wv[1], _mm256_loadu_ps(xb + 8),
                                            _mm256_fmadd_ps(wv[0], _mm256_loadu_ps(xb), acc[r][0]));
                acc[r][1] = _mm256_fmadd_ps(wv[3], _mm256_loadu_ps(xb + 24),
                                            _mm256_fmadd_ps(wv[2], _mm256_loadu_ps(xb + 16), acc[r][1]));
            } else {
                for (int i = 0; i < MR; i++) {
                    const float *xb = x + i * K + 32 * b;
                    __m256 a = acc[r][i];
                    for (int j = 0; j < 4; j++) a = _mm256_fmadd_ps(wv[j], _mm256_loadu_ps(xb + 8 * j), a);
                    acc[r][i] = a;
                }
            }
        }
    }
    for (int r = 0; r < NR; r++) {
        if (MR == 1) out[r] = hsum8(_mm256_add_ps(acc[r][0], acc[r][1]));
        else for (int i = 0; i < MR; i++) out[i * N + r] = hsum8(acc[r][i]);
    }
}

/* Integer dot products for single rows without VNNI, the idea of llama.cpp's AVX2 path: x quantized to int8 per
 * block of 32 as above; vpmaddubsw multiplies unsigned weight bytes by signed x bytes and adds pairs into int16,
 * vpmaddwd with ones adds pairs of those into 8 int32 sums. No int16 sum can saturate: 4-bit codes give at
 * most 2*15*127, and Q8_0 (|q_w| unsigned, its sign moved onto q_x) 2*128*127 < 32767, since x is quantized
 * to [-127, 127]. Same exactness contract as the VNNI path: only the decode step takes it by default. */
#define HAVE_DOT_I8 1

static void quantize_x(const float *x, int nb, int8_t *q, float *dx, int32_t *sq) {
    const __m256 sign = _mm256_set1_ps(-0.f);
    const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for (int b = 0; b < nb; b++) {
        __m256 v[4];
        for (int j = 0; j < 4; j++) v[j] = _mm256_loadu_ps(x + 32 * b + 8 * j);
        const __m256 m8 = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                                        _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
        __m128 m = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
        m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        const float amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
        const float d = amax / 127.f, inv = amax > 0.f ? 127.f / amax : 0.f;
        __m256i i[4];
        for (int j = 0; j < 4; j++) i[j] = _mm256_cvtps_epi32(_mm256_mul_ps(v[j], _mm256_set1_ps(inv)));
        /* packs work within 128-bit lanes: the permute puts the 4-byte groups back in order */
        const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
        _mm256_storeu_si256((__m256i *)(q + 32 * b), _mm256_permutevar8x32_epi32(p, order));
        const __m256i s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
        dx[b] = d;
        sq[b] = _mm_cvtsi128_si32(s4);
    }
}

/* 4 weight rows (row_bytes apart) against one quantized x: 4 independent accumulators. */
AI void dot4_i8(const int kind, const uint8_t *w, size_t row_bytes, int nb, const int8_t *xq, const float *dx,
                const int32_t *sq, float *out, const int NR) {
    const int bs = kind == 2 ? 18 : kind == 3 ? 20 : 34;
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256 acc[4];
    float extra[4] = {0.f, 0.f, 0.f, 0.f};
    for (int r = 0; r < NR; r++) acc[r] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const __m256i xv = _mm256_loadu_si256((const __m256i *)(xq + 32 * b));
        for (int r = 0; r < NR; r++) {
            const uint8_t *blk = w + r * row_bytes + (size_t)b * bs;
            prefetch_ahead(blk, NR * row_bytes);
            __m256i pairs;
            float dw;
            if (kind == 8) {
                const __m256i wq = _mm256_loadu_si256((const __m256i *)(blk + 2));
                pairs = _mm256_maddubs_epi16(_mm256_sign_epi8(wq, wq), _mm256_sign_epi8(xv, wq));
                dw = h2f(rd16(blk));
            } else {
                const __m128i raw = _mm_loadu_si128((const __m128i *)(blk + (kind == 3 ? 4 : 2)));
                const __m256i wq = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(raw, 4), raw), low);
                pairs = _mm256_maddubs_epi16(wq, xv);
                if (kind == 3) {
                    uint32_t dm; memcpy(&dm, blk, 4);
                    const __m128 f = _mm_cvtph_ps(_mm_cvtsi32_si128((int)dm));
                    dw = _mm_cvtss_f32(f);
                    extra[r] += _mm_cvtss_f32(_mm_movehdup_ps(f)) * dx[b] * (float)sq[b];
                } else {
                    dw = h2f(rd16(blk));
                    extra[r] -= 8.f * dw * dx[b] * (float)sq[b];
                }
            }
            const __m256i dot = _mm256_madd_epi16(pairs, ones);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_set1_ps(dw * dx[b]), acc[r]);
        }
    }
    for (int r = 0; r < NR; r++) out[r] = hsum8(acc[r]) + extra[r];
}
#endif

#ifdef HAVE_SIMD
#ifdef HAVE_DOT_I8
static int exact_activations = 0;

/* x's quantization for the repacked 4-bit product too (ggml_x16.c): one rounding for both layouts. */
void ggml_quantize_x(const float *x, int nb, int8_t *q, float *dx, int32_t *sq) { quantize_x(x, nb, q, dx, sq); }
#endif

AI void matmul_kind(const int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N,
                    int64_t ldo, float *out, const int int8_rows) {
    const int nb = (int)(K / 32), bs = kind == 2 ? 18 : kind == 3 ? 20 : 34;
    const size_t rb = (size_t)nb * bs;
    int64_t m0 = 0;
    for (; m0 + 8 <= M; m0 += 8)  /* x rows outer: 8 rows of x stay in L1 while W streams */
        for (int64_t n = 0; n < N; n++) tile(kind, w + n * rb, rb, bs, nb, x + m0 * K, K, out + m0 * ldo + n, ldo, 1, 8);
    /* 2..7 rows left: one pass over W for 4 or 2 of them, not a pass each (2 weight rows for more chains) */
    for (int mr = 4; mr >= 2; mr /= 2)
        for (; m0 + mr <= M; m0 += mr) {
            int64_t n = 0;
            for (; n + 2 <= N; n += 2)
                if (mr == 4) tile(kind, w + n * rb, rb, bs, nb, x + m0 * K, K, out + m0 * ldo + n, ldo, 2, 4);
                else tile(kind, w + n * rb, rb, bs, nb, x + m0 * K, K, out + m0 * ldo + n, ldo, 2, 2);
            for (; n < N; n++)
                if (mr == 4) tile(kind, w + n * rb, rb, bs, nb, x + m0 * K, K, out + m0 * ldo + n, ldo, 1, 4);
                else tile(kind, w + n * rb, rb, bs, nb, x + m0 * K, K, out + m0 * ldo + n, ldo, 1, 2);
        }
#ifdef HAVE_DOT_I8
    if (int8_rows && M == 1 && nb <= 2048) {
        int8_t xq[32 * 2048];
        float dx[2048];
        int32_t sq[2048];
        for (; m0 < M; m0++) {
            quantize_x(x + m0 * K, nb, xq, dx, sq);
            float *o = out + m0 * ldo;
            int64_t n = 0;
            for (; n + 4 <= N; n += 4) dot4_i8(kind, w + n * rb, rb, nb, xq, dx, sq, o + n, 4);
            for (; n < N; n++) dot4_i8(kind, w + n * rb, rb, nb, xq, dx, sq, o + n, 1);
        }
    }
#endif
    for (; m0 < M; m0++) {
        int64_t n = 0;
        for (; n + 4 <= N; n += 4) tile(kind, w + n * rb, rb, bs, nb, x + m0 * K, K, out + m0 * ldo + n, ldo, 4, 1);
        for (; n < N; n++) tile(kind, w + n * rb, rb, bs, nb, x + m0 * K, K, out + m0 * ldo + n, ldo, 1, 1);
    }
}

/* 1: rows of x multiply in fp32 against widened weights everywhere (the dequantized product to rounding);
 * 0 (default where the CPU has AVX512-VNNI or AVX2): single rows take the integer path above. Returns the old value. */
int ggml_exact(int on) {
#ifdef HAVE_DOT_I8
    const int old = exact_activations;
    if (on >= 0) exact_activations = on != 0;
    return old;
#else
    (void)on;
    return 1;
#endif
}

static int matmul_cols(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, int64_t ldo,
                       float *out, int int8_rows) {
    if (K % 32) return -1;
    if (kind == 2) matmul_kind(2, x, M, K, w, N, ldo, out, int8_rows);
    else if (kind == 3) matmul_kind(3, x, M, K, w, N, ldo, out, int8_rows);
    else if (kind == 8) matmul_kind(8, x, M, K, w, N, ldo, out, int8_rows);
    else return -1;
    return 0;
}

static int matmul_rows(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *out,
                       int int8_rows) {
    return matmul_cols(kind, x, M, K, w, N, N, out, int8_rows);
}

/* Output columns [start, end) of the product (weight rows start..end-1): the door splits N over threads, each
 * thread reading its own rows of W against all of x (ggml_matmul_cols_par below splits in C). Batches of many
 * rows (a server's decode step) are compute-bound, so they scale with threads; one row does too, less. */
int ggml_matmul_cols(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *out,
                     int64_t start, int64_t end) {
    if (start < 0 || end > N || start > end || K % 32) return -1;
    const int64_t rb = K / 32 * (kind == 2 ? 18 : kind == 3 ? 20 : 34);
    return matmul_cols(kind, x, M, K, w + start * rb, end - start, N, out + start, 0);
}

/* The product for callers from Python (prompts, the LM head, other architectures): always fp32 activations,
 * the dequantized product to rounding. Only the decode step below takes the integer path. */
int ggml_matmul(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *out) {
    return matmul_rows(kind, x, M, K, w, N, out, 0);
}

/* One row through the path the decode step takes (integer unless exact): for tests. */
int ggml_matvec_step(int kind, const float *x, int64_t K, const uint8_t *w, int64_t N, float *out) {
    return matmul_rows(kind, x, 1, K, w, N, out, !ggml_exact(-1));
}
#else  /* portable C: the compiler vectorizes what it can */
static inline float row_q4(const uint8_t *row, const float *x, int nb, int q41) {
    const int bs = q41 ? 20 : 18;
    float s = 0.f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)b * bs;
        const float d = h2f(rd16(blk));
        const uint8_t *qs = blk + (q41 ? 4 : 2);
        const float *xb = x + 32 * b;
        float t = 0.f, xs = 0.f;  /* sum(q_j x_j) with q unsigned 0..15, and sum(x_j) */
        for (int j = 0; j < 16; j++) {
            t += (float)(qs[j] & 15) * xb[j] + (float)(qs[j] >> 4) * xb[j + 16];
            xs += xb[j] + xb[j + 16];
        }
        s += d * t + (q41 ? h2f(rd16(blk + 2)) : -8.f * d) * xs;
    }
    return s;
}

static inline float row_q8(const uint8_t *row, const float *x, int nb) {
    float s = 0.f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = row + (size_t)b * 34;
        const int8_t *q = (const int8_t *)(blk + 2);
        float t = 0.f;
        for (int j = 0; j < 32; j++) t += (float)q[j] * x[32 * b + j];
        s += h2f(rd16(blk)) * t;
    }
    return s;
}

int ggml_exact(int on) { (void)on; return 1; }  /* this build always multiplies in fp32 */
int ggml_matmul(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *out);
int ggml_matvec_step(int kind, const float *x, int64_t K, const uint8_t *w, int64_t N, float *out) {
    return ggml_matmul(kind, x, 1, K, w, N, out);
}
static int matmul_rows(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *out,
                       int int8_rows) {
    (void)int8_rows;
    return ggml_matmul(kind, x, M, K, w, N, out);
}

/* kind: 2 = Q4_0, 3 = Q4_1, 8 = Q8_0 (GGML type ids); output columns [start, end). Returns 0 or -1. */
int ggml_matmul_cols(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *out,
                     int64_t start, int64_t end) {
    if (K % 32 || start < 0 || end > N || start > end) return -1;
    const int nb = (int)(K / 32);
    if (kind == 2 || kind == 3) {
        const int q41 = kind == 3;
        const size_t row_bytes = (size_t)nb * (q41 ? 20 : 18);
        /* rows of W outer so each weight row is read from memory once and reused by all M inputs */
        for (int64_t n = start; n < end; n++) {
            const uint8_t *row = w + n * row_bytes;
            for (int64_t m = 0; m < M; m++) out[m * N + n] = row_q4(row, x + m * K, nb, q41);
        }
        return 0;
    }
    if (kind == 8) {
        const size_t row_bytes = (size_t)nb * 34;
        for (int64_t n = start; n < end; n++) {
            const uint8_t *row = w + n * row_bytes;
            for (int64_t m = 0; m < M; m++) out[m * N + n] = row_q8(row, x + m * K, nb);
        }
        return 0;
    }
    return -1;
}

int ggml_matmul(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *out) {
    return ggml_matmul_cols(kind, x, M, K, w, N, out, 0, N);
}
#endif

/* ggml_matmul_cols with its columns [start, end) split over `parts` threads of thread_pool.c (the door's
 * split, without a Python thread per part). */
typedef struct {
    int kind;
    const float *x;
    int64_t M, K;
    const uint8_t *w;
    int64_t N;
    float *out;
    atomic_int rc;
    int int8_rows; /* the batch-1 step's one row: integer products unless exact (matmul_rows) */
} matmul_job;

static void matmul_part(void *ctx, int64_t start, int64_t end) {
    matmul_job *j = ctx;
    const int64_t rb = j->K / 32 * (j->kind == 2 ? 18 : j->kind == 3 ? 20 : 34);
    const int rc = j->int8_rows ? matmul_rows(j->kind, j->x, 1, j->K, j->w + start * rb, end - start, j->out + start, 1)
                                : ggml_matmul_cols(j->kind, j->x, j->M, j->K, j->w, j->N, j->out, start, end);
    if (rc) atomic_store(&j->rc, rc);
}

/* One row of the batch-1 step: its N weight rows split over `parts` pool threads (64 rows a part at least:
 * SmolLM2's 576-wide Q4_1 rows take ~0.1 us each, and a hand-off costs a few). Bits do not depend on parts. */
static int step_product(int kind, const float *x, int64_t K, const uint8_t *w, int64_t N, float *out, int i8,
                        int parts) {
    if (parts > N / 64) parts = (int)(N / 64);
    if (parts <= 1 || K % 32) return matmul_rows(kind, x, 1, K, w, N, out, i8);
    matmul_job j = {kind, x, 1, K, w, N, out, 0, i8};
    pool_run(matmul_part, &j, 0, N, parts);
    return atomic_load(&j.rc);
}

int ggml_matmul_cols_par(int kind, const float *x, int64_t M, int64_t K, const uint8_t *w, int64_t N, float *out,
                         int64_t start, int64_t end, int parts) {
    if (start < 0 || end > N || start > end) return -1;
    matmul_job j = {kind, x, M, K, w, N, out, 0, 0};
    pool_run(matmul_part, &j, start, end, parts);
    return atomic_load(&j.rc);
}

/* fp32 -> bf16, rounding to nearest even as torch's cast does (finite inputs: d and m are fp16 values). */
static inline uint16_t f2bf(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline void put(void *out, int64_t i, float v, int bf16) {
    if (bf16) ((uint16_t *)out)[i] = f2bf(v); else ((float *)out)[i] = v;
}

/* Dequantize rows `ids` (n of them) of a (rows, K) quantized matrix into out (n, K), fp32 or bf16: an embedding
 * lookup, or a weight tile for a GEMM (bf16 written directly: no fp32 tile to allocate and cast). */
static int rows_to(int kind, const uint8_t *w, int64_t rows, int64_t K, const int64_t *ids, int64_t n, void *out,
                   int bf16) {
    if (K % 32) return -1;
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= rows) return -2;  /* nothing written */
    const int nb = (int)(K / 32);
    const int bs = kind == 2 ? 18 : kind == 3 ? 20 : kind == 8 ? 34 : 0;
    if (!bs) return -1;
    for (int64_t i = 0; i < n; i++) {
        const uint8_t *row = w + ids[i] * (int64_t)nb * bs;
        const int64_t o = i * K;
        for (int b = 0; b < nb; b++) {
            const uint8_t *blk = row + (size_t)b * bs;
            const float d = h2f(rd16(blk));
            if (kind == 8) {
                const int8_t *q = (const int8_t *)(blk + 2);
                for (int j = 0; j < 32; j++) put(out, o + 32 * b + j, d * (float)q[j], bf16);
            } else {
                const float m = kind == 3 ? h2f(rd16(blk + 2)) : -8.f * d;
                const uint8_t *qs = blk + (kind == 3 ? 4 : 2);
                for (int j = 0; j < 16; j++) {
                    put(out, o + 32 * b + j, d * (float)(qs[j] & 15) + m, bf16);
                    put(out, o + 32 * b + j + 16, d * (float)(qs[j] >> 4) + m, bf16);
                }
            }
        }
    }
    return 0;
}

int ggml_rows(int kind, const uint8_t *w, int64_t rows, int64_t K, const int64_t *ids, int64_t n, float *out) {
    return rows_to(kind, w, rows, K, ids, n, out, 0);
}

int ggml_rows_bf16(int kind, const uint8_t *w, int64_t rows, int64_t K, const int64_t *ids, int64_t n,
                   uint16_t *out) {
    return rows_to(kind, w, rows, K, ids, n, out, 1);
}

/* ---------------------------------------------------------------------------------------------------
 * One decoding step of a LLaMA-style stack (pre-RMSNorm, rotary "rotate half" positions, grouped-query
 * attention, SwiGLU) for one token, every layer in one call: at batch 1 a step is ~300 small operations,
 * and dispatching each from Python costs more than its arithmetic. Same math as attnlab's modules, in fp32:
 *   h = x + W_o attn(rope(W_q n1), rope(W_k n1), W_v n1),  n1 = rmsnorm(x)
 *   x' = h + W_down (silu(W_gate n2) * W_up n2),            n2 = rmsnorm(h)
 * ptrs holds 11 pointers per layer: attn_norm, ffn_norm, the blocks of q, k, v, o, gate, up, down, and the
 * layer's key and value caches, each (kv_heads, cap, head_dim) fp32; kinds holds the 7 GGML types.
 * The new key/value go to column `pos`; attention spans columns 0..pos. cos/sin: head_dim values at pos.
 * scratch: at least 2*hidden + 2*heads*hd + 2*kv_heads*hd + cap + 2*ffn floats. Each product's weight rows
 * split over `parts` threads of thread_pool.c (1: this thread alone); the rest is a few thousand flops.
 */
#include <math.h>

/* (also the engine's batched step, paged_step.c) */
void attnlab_rmsnorm(const float *x, const float *w, float eps, int n, float *out) {
    float ss = 0.f;
    for (int i = 0; i < n; i++) ss += x[i] * x[i];
    const float r = 1.f / sqrtf(ss / (float)n + eps);
    for (int i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

void attnlab_rope(float *v, int nh, int hd, const float *cs, const float *sn) {
    const int h2 = hd / 2;
    for (int h = 0; h < nh; h++) {
        float *p = v + h * hd;
        for (int i = 0; i < h2; i++) {
            const float a = p[i], b = p[i + h2];
            p[i] = a * cs[i] - b * sn[i];
            p[i + h2] = b * cs[i + h2] + a * sn[i + h2];
        }
    }
}

/* Attention scores: one head_dim-long dot product per cached position and head. A scalar sum is a chain of
 * dependent adds that the compiler may not reorder: at 400 cached tokens SmolLM2's scores (30 layers, 9
 * heads of 64) took 3.7 ms per token that way, 0.5 ms 8 lanes wide (AVX2 EPYC, one thread). */
static inline float dotf(const float *a, const float *b, int n) {
    float s = 0.f;
    int i = 0;
#if defined(__AVX2__) && defined(__FMA__)
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
    for (; i + 16 <= n; i += 16) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s0 = _mm256_add_ps(s0, s1);
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    s = _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
#endif
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* Attention of heads [h0, h1) of the batch-1 step over cache columns 0..pos (softmax in fp32); sc: pos + 1 floats. */
typedef struct {
    const float *q, *kc, *vc;
    float *att;
    int groups, hd;
    int64_t cap, pos;
    float scale;
    atomic_int rc;
} attn_job;

static void attend_heads(const attn_job *j, int64_t h0, int64_t h1, float *sc) {
    const int hd = j->hd;
    const int64_t cap = j->cap, pos = j->pos;
    for (int64_t h = h0; h < h1; h++) {
        const float *kh = j->kc + (h / j->groups) * cap * hd, *vh = j->vc + (h / j->groups) * cap * hd;
        const float *qh = j->q + h * hd;
        float mx = -INFINITY, sum = 0.f;
        for (int64_t t = 0; t <= pos; t++) { sc[t] = j->scale * dotf(qh, kh + t * hd, hd); if (sc[t] > mx) mx = sc[t]; }
        for (int64_t t = 0; t <= pos; t++) { sc[t] = expf(sc[t] - mx); sum += sc[t]; }
        float *ah = j->att + h * hd;
        for (int i = 0; i < hd; i++) ah[i] = 0.f;
        for (int64_t t = 0; t <= pos; t++) {
            const float p = sc[t] / sum, *vt = vh + t * hd;
            for (int i = 0; i < hd; i++) ah[i] += p * vt[i];
        }
    }
}

static void attn_part(void *ctx, int64_t start, int64_t end) {  /* a pool thread's heads, its own scores */
    attn_job *j = ctx;
    float *sc = malloc((size_t)(j->pos + 1) * sizeof(float));
    if (!sc) { atomic_store(&j->rc, -1); return; }
    attend_heads(j, start, end, sc);
    free(sc);
}

int ggml_x16_step(const uint8_t *w, const float *x, int64_t K, int64_t N, float *out, int parts);  /* ggml_x16.c */

/* A matrix of the step: on its 16-row repacked copy `wp` (ggml_x16.c) where there is one and the step is not
 * exact, else on the GGUF blocks. */
static int step_matrix(int kind, const float *x, int64_t K, const void *w, const void *wp, int64_t N, float *out,
                       int i8, int parts) {
    if (i8 && wp) return ggml_x16_step((const uint8_t *)wp, x, K, N, out, parts);
    return step_product(kind, x, K, (const uint8_t *)w, N, out, i8, parts);
}

/* packed: NULL, or 7 pointers a layer (q, k, v, o, gate, up, down), each NULL or the matrix repacked by
 * ggml_x16_pack (the Python side packs where `ggml_x16_supported`). */
int llama_decode_step(int n_layers, float *x, void **ptrs, const int *kinds, int hidden, int heads, int kv_heads,
                      int hd, int ffn, float eps, float scale, int64_t cap, int64_t pos, const float *cs,
                      const float *sn, float *scratch, int parts, void **packed) {
    if (pos >= cap || heads % kv_heads) return -1;
    float *n1 = scratch, *q = n1 + hidden, *k = q + heads * hd, *v = k + kv_heads * hd, *att = v + kv_heads * hd,
          *o = att + heads * hd, *sc = o + hidden, *g = sc + cap, *u = g + ffn;
    const int groups = heads / kv_heads, qn = heads * hd, kn = kv_heads * hd, i8 = !ggml_exact(-1);
    for (int l = 0; l < n_layers; l++) {
        void **P = ptrs + 11 * l, *none[7] = {0}, **W = packed ? packed + 7 * l : none;
        const int *K = kinds + 7 * l;
        float *kc = (float *)P[9], *vc = (float *)P[10];
        attnlab_rmsnorm(x, (const float *)P[0], eps, hidden, n1);
        if (step_matrix(K[0], n1, hidden, P[2], W[0], qn, q, i8, parts) ||
            step_matrix(K[1], n1, hidden, P[3], W[1], kn, k, i8, parts) ||
            step_matrix(K[2], n1, hidden, P[4], W[2], kn, v, i8, parts)) return -1;
        attnlab_rope(q, heads, hd, cs, sn);
        attnlab_rope(k, kv_heads, hd, cs, sn);
        for (int gi = 0; gi < kv_heads; gi++) {
            memcpy(kc + (gi * cap + pos) * hd, k + gi * hd, hd * sizeof(float));
            memcpy(vc + (gi * cap + pos) * hd, v + gi * hd, hd * sizeof(float));
        }
        attn_job aj = {q, kc, vc, att, groups, hd, cap, pos, scale, 0};
        if (parts > 1 && pos >= 64) {  /* short contexts: less work than a hand-off */
            pool_run(attn_part, &aj, 0, heads, parts < heads ? parts : heads);
            if (atomic_load(&aj.rc)) return -1;
        } else {
            attend_heads(&aj, 0, heads, sc);
        }
        if (step_matrix(K[3], att, qn, P[5], W[3], hidden, o, i8, parts)) return -1;
        for (int i = 0; i < hidden; i++) x[i] += o[i];
        attnlab_rmsnorm(x, (const float *)P[1], eps, hidden, n1);
        if (step_matrix(K[4], n1, hidden, P[6], W[4], ffn, g, i8, parts) ||
            step_matrix(K[5], n1, hidden, P[7], W[5], ffn, u, i8, parts)) return -1;
        for (int i = 0; i < ffn; i++) g[i] = g[i] / (1.f + expf(-g[i])) * u[i];
        if (step_matrix(K[6], g, ffn, P[8], W[6], hidden, o, i8, parts)) return -1;
        for (int i = 0; i < hidden; i++) x[i] += o[i];
    }
    return 0;
}
