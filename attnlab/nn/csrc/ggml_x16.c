/* The batch-1 decode step's 4-bit products on weights repacked 16 rows at a time (AVX512-VNNI, or AVX2).
 *
 * Part of attnlab (built with the other kernels; `ggml_x16_pack` through the checked door of
 * attnlab/nn/kernels.py, the product from `llama_decode_step` in ggml_blocks.c).
 *
 * Why: in the GGUF layout each row is its own run of blocks, so a one-row product (ggml_blocks.c's
 * dot4_i8) spends a dozen instructions on every 32 weights of every row (unpack, one 256-bit vpdpbusd,
 * scalar scales and offsets). Repacked so that one 64-byte load holds 4 weights of each of 16 rows, a block
 * of 32 weights x 16 rows is 4 loads, 8 vpdpbusd on 4 broadcast bytes of x, and one fma for the 16 scales
 * (a fp16 vector) and one for the 16 offsets: four times fewer instructions per weight. SmolLM2's 1536 x 576
 * Q4_1 matrix, warm in L2, took 49 us by dot4_i8 and 14 here (AMX Xeon, one core); a whole step's 66 MB of
 * 4-bit layers went from ~11.6 to ~8.9 ms, where a core streams ~10 GB/s from memory: the step is now bound
 * by bytes, not instructions. The same idea as llama.cpp's repacked CPU layouts; written from the GGUF block
 * format and the VNNI instruction.
 *
 * One repacked group-block (16 rows x 32 weights, 320 bytes, as 16 Q4_1 blocks):
 *   16 fp16 d, 16 fp16 m, then 4 x 64 bytes: byte 4r + t of part i holds row r's weight 4i + t in its low
 *   nibble and weight 16 + 4i + t in its high nibble (t = 0..3), so (part & 15) and (part >> 4 & 15) are
 *   the unsigned operands of vpdpbusd against x's bytes 4i..4i+3 and 16+4i..16+4i+3 broadcast.
 * Q4_0 blocks (w = d (q - 8)) repack as Q4_1 with m = -8 d, exact in fp16 (refused if it overflows).
 * The groups follow each other for g = 0 .. N/16-1, each its K/32 blocks in order.
 *
 * Arithmetic: as dot4_i8's, x quantized to int8 per block of 32 (round to nearest, one scale) and
 *   out[r] = sum_b d_rb dx_b (q_rb . qx_b) + m_rb (dx_b sum qx_b)
 * with the integer dot products exact; only the fp32 accumulation order differs from the unpacked path.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#include "half.h"  /* h2f */
#include "thread_pool.h"

#define GROUP_BYTES 320  /* 16 rows x 32 weights */

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

/* fp16 bits of -8 * h (Q4_0's offset), or -1 where it does not fit (|8 d| beyond fp16's range). Multiplying by
 * a power of two changes the exponent only: a normal value gains 3, a subnormal shifts its mantissa. */
static int32_t neg8(uint16_t h) {
    const uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint16_t out;
    if (exp == 31) return -1;
    if (exp == 0) {
        uint32_t m = man << 3, e = 0;  /* subnormal: value man * 2^-24, times 8 */
        while (m >= 0x800) { m >>= 1; e++; }  /* (never loses bits: at most 3 shifts back) */
        if (m >= 0x400) { e++; m &= 0x3ff; }
        out = (uint16_t)((e << 10) | m);
    } else {
        if (exp + 3 >= 31) return -1;
        out = (uint16_t)(((exp + 3) << 10) | man);
    }
    return (uint16_t)(out | ((h & 0x8000) ^ 0x8000));
}

typedef struct {
    int kind;
    const uint8_t *w;
    int64_t nb;
    uint8_t *out;
    atomic_int rc;
} pack_job;

/* Groups [g0, g1) of a pack (each group: 16 rows of the GGUF blocks in, 16-row group-blocks out). */
static void pack_groups(void *ctx, int64_t g0, int64_t g1) {
    pack_job *j = ctx;
    const int64_t nb = j->nb, bs = j->kind == 3 ? 20 : 18;
    for (int64_t g = g0; g < g1; g++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = j->out + (g * nb + b) * GROUP_BYTES;
            for (int r = 0; r < 16; r++) {
                const uint8_t *blk = j->w + ((g * 16 + r) * nb + b) * bs;
                const uint16_t d = rd16(blk);
                const int32_t m = j->kind == 3 ? rd16(blk + 2) : neg8(d);
                if (m < 0) { atomic_store(&j->rc, -1); return; }
                const uint16_t m16 = (uint16_t)m;
                memcpy(o + 2 * r, &d, 2);
                memcpy(o + 32 + 2 * r, &m16, 2);
                const uint8_t *qs = blk + (j->kind == 3 ? 4 : 2);  /* byte j: weight j (low), j + 16 (high) */
                for (int i = 0; i < 4; i++) memcpy(o + 64 + 64 * i + 4 * r, qs + 4 * i, 4);
            }
        }
}

/* Repack an (N, K) matrix of Q4_0 (kind 2) or Q4_1 (kind 3) blocks; N % 16 == 0 and K % 32 == 0 (the door
 * checks). out: N * K / 32 * 20 bytes; the groups split over `parts` pool threads (a model's worth of
 * matrices is repacked as it loads: ~60 ms for SmolLM2's 66 MB on one core). Returns 0, or -1 (nothing
 * usable written) for another kind or a Q4_0 scale whose offset overflows fp16. */
int ggml_x16_pack(int kind, const uint8_t *w, int64_t N, int64_t K, uint8_t *out, int parts) {
    if ((kind != 2 && kind != 3) || N % 16 || K % 32) return -1;
    pack_job j = {kind, w, K / 32, out, 0};
    const int64_t groups = N / 16;
    if (parts > groups) parts = (int)groups;
    if (parts <= 1) pack_groups(&j, 0, groups);
    else pool_run(pack_groups, &j, 0, groups, parts);
    return atomic_load(&j.rc);
}

/* The two builds with an integer step in ggml_blocks.c (its quantize_x): AVX512-VNNI, and AVX2 without AVX512. */
#if (defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__) && defined(__AVX512VL__)) || \
    (!defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
#define HAVE_X16 1
int ggml_x16_supported(void) { return 1; }

void ggml_quantize_x(const float *x, int nb, int8_t *q, float *dx, int32_t *sq);  /* ggml_blocks.c's, as dot4_i8 */

/* x quantized once per product, shared by the threads. */
typedef struct {
    const uint8_t *w;
    int64_t nb;
    const int8_t *xq;
    const float *dx, *sx;  /* per block: x's scale, and scale x sum of its codes */
    float *out;
} x16_job;

#if defined(__AVX512F__)
/* Rows of groups [g0, g1). The two sums of a block are reset at each block, so the core overlaps blocks. */
static void x16_groups(void *ctx, int64_t g0, int64_t g1) {
    const x16_job *j = ctx;
    const __m512i low = _mm512_set1_epi8(0x0F);
    const int64_t nb = j->nb;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *w = j->w + g * nb * GROUP_BYTES;
        __m512 acc = _mm512_setzero_ps(), accm = _mm512_setzero_ps();
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * GROUP_BYTES;
            for (int c = 0; c < 5; c++) _mm_prefetch((const char *)blk + 4 * GROUP_BYTES + 64 * c, _MM_HINT_T0);
            const int8_t *xb = j->xq + 32 * b;
            __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
            for (int i = 0; i < 4; i++) {
                const __m512i p = _mm512_loadu_si512((const void *)(blk + 64 + 64 * i));
                int32_t lo4, hi4;
                memcpy(&lo4, xb + 4 * i, 4);
                memcpy(&hi4, xb + 16 + 4 * i, 4);
                s0 = _mm512_dpbusd_epi32(s0, _mm512_and_si512(p, low), _mm512_set1_epi32(lo4));
                s1 = _mm512_dpbusd_epi32(s1, _mm512_and_si512(_mm512_srli_epi16(p, 4), low), _mm512_set1_epi32(hi4));
            }
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
            const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk + 32)));
            acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(s0, s1)),
                                  _mm512_mul_ps(d, _mm512_set1_ps(j->dx[b])), acc);
            accm = _mm512_fmadd_ps(m, _mm512_set1_ps(j->sx[b]), accm);
        }
        _mm512_storeu_ps(j->out + 16 * g, _mm512_add_ps(acc, accm));
    }
}
#else
/* The same on AVX2, each 64-byte part as two halves of 8 rows: vpmaddubsw (unsigned nibble x signed x byte,
 * pairs added into int16: at most 2 x 15 x 128, no saturation) then vpmaddwd by ones (int32 lanes of 4 k's)
 * stand in for vpdpbusd. */
static void x16_groups(void *ctx, int64_t g0, int64_t g1) {
    const x16_job *j = ctx;
    const __m256i low = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    const int64_t nb = j->nb;
    for (int64_t g = g0; g < g1; g++) {
        const uint8_t *w = j->w + g * nb * GROUP_BYTES;
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, accm[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *blk = w + b * GROUP_BYTES;
            for (int c = 0; c < 5; c++) _mm_prefetch((const char *)blk + 4 * GROUP_BYTES + 64 * c, _MM_HINT_T0);
            const int8_t *xb = j->xq + 32 * b;
            __m256i s[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
            for (int i = 0; i < 4; i++) {
                int32_t lo4, hi4;
                memcpy(&lo4, xb + 4 * i, 4);
                memcpy(&hi4, xb + 16 + 4 * i, 4);
                const __m256i xl = _mm256_set1_epi32(lo4), xh = _mm256_set1_epi32(hi4);
                for (int h = 0; h < 2; h++) {  /* rows 0-7, 8-15 */
                    const __m256i p = _mm256_loadu_si256((const __m256i *)(blk + 64 + 64 * i + 32 * h));
                    const __m256i lo = _mm256_maddubs_epi16(_mm256_and_si256(p, low), xl);
                    const __m256i hi = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(p, 4), low), xh);
                    s[h] = _mm256_add_epi32(s[h], _mm256_madd_epi16(_mm256_add_epi16(lo, hi), ones));
                }
            }
            const __m256 dxb = _mm256_set1_ps(j->dx[b]), sxb = _mm256_set1_ps(j->sx[b]);
            for (int h = 0; h < 2; h++) {
                const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16 * h)));
                const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 32 + 16 * h)));
                acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[h]), _mm256_mul_ps(d, dxb), acc[h]);
                accm[h] = _mm256_fmadd_ps(m, sxb, accm[h]);
            }
        }
        for (int h = 0; h < 2; h++) _mm256_storeu_ps(j->out + 16 * g + 8 * h, _mm256_add_ps(acc[h], accm[h]));
    }
}
#endif

/* out (N) = W x for one fp32 row x (K), W repacked by ggml_x16_pack; the groups split over `parts` pool
 * threads (4 groups = 64 rows a part at least). Returns -1 for K beyond 65,536 (the stack buffers). */
int ggml_x16_step(const uint8_t *w, const float *x, int64_t K, int64_t N, float *out, int parts) {
    if (K % 32 || N % 16 || K > 32 * 2048) return -1;
    const int nb = (int)(K / 32);
    int8_t xq[32 * 2048];
    float dx[2048], sx[2048];
    int32_t sq[2048];
    ggml_quantize_x(x, nb, xq, dx, sq);
    for (int b = 0; b < nb; b++) sx[b] = dx[b] * (float)sq[b];
    x16_job j = {w, nb, xq, dx, sx, out};
    const int64_t groups = N / 16;
    if (parts > groups / 4) parts = (int)(groups / 4);
    if (parts <= 1) x16_groups(&j, 0, groups);
    else pool_run(x16_groups, &j, 0, groups, parts);
    return 0;
}
#else
int ggml_x16_supported(void) { return 0; }

int ggml_x16_step(const uint8_t *w, const float *x, int64_t K, int64_t N, float *out, int parts) {
    (void)w; (void)x; (void)K; (void)N; (void)out; (void)parts;
    return -1;
}
#endif
