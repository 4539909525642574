/* The integer product of an int8 linear layer (attnlab/nn/int8.py) on CPUs with AMX-INT8 (Intel Sapphire
 * Rapids and later), with the scaling, the bias and the GELU fused into the store. Part of attnlab; built with
 * the other kernels and called through the checked door of attnlab/nn/kernels.py.
 *
 * y_mn = (sum_k a_mk b_kn) * (s_m * w_n) + bias_n, then GELU if asked (a feed-forward block's up projection),
 * with a (M, K) symmetric int8 activation codes (one scale s_m per row: int8_rows.c's `int8_quantize_rows`)
 * and b (K, N) int8 weights (one scale w_n per column), packed once by int8_gemm.c's `int8_pack_b`.
 *
 * Why not torch's `_int_mm`, which runs oneDNN's AMX code too: it packs the weights again on every call and
 * returns int32 sums that another pass scales (and a third applies GELU). On MiniLM's length-sorted batches
 * (a few hundred rows per product) that made the products ~240 GMAC/s against the tiles' ~700 on large
 * shapes, and the two passes as long again. Here the weights are packed once, and the sums leave the tiles
 * only to be scaled and stored.
 *
 * The packed layout is AMX's B tile as it stands: `int8_pack_b` writes panels of 16 columns, within a panel
 * each quad of k's as 16 columns x 4 bytes; 16 consecutive quads (64 k's) are one 16 x 64-byte B tile. The
 * block is 32 rows x 32 columns: two A tiles (16 rows x 64 k's each), two B tiles, four int32 C tiles.
 * Requires K a multiple of 64 and N of 16 (the door checks it; every BERT-family width is); a last block
 * of fewer than 32 rows is copied into a zero-padded scratch block first, since tiles load whole rows.
 *
 * The tiles need the OS's permission (Linux >= 5.16: arch_prctl ARCH_REQ_XCOMP_PERM), asked once; where it
 * is refused, `int8_amx_supported` says 0 and the layer keeps `_int_mm`.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AMX_TILE__) && defined(__AMX_INT8__) && defined(__AVX512F__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "gelu512.h" /* gelu_erf16: GELU on 16 lanes */

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static int tiles_permitted(void) {
    static volatile int state = 0; /* 0 unknown, 1 yes, -1 no: the request is idempotent, a race is harmless */
    if (!state) state = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 ? 1 : -1;
    return state == 1;
}

int int8_amx_supported(void) { return tiles_permitted(); }

/* palette 1; tiles 0-3: C (16 rows x 16 int32), 4-5: A (16 rows x 64 bytes), 6-7: B (16 quads x 64 bytes) */
typedef struct {
    uint8_t palette_id, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

static void configure_tiles(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette_id = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
}

/* scale, bias, GELU and store `rows` rows of one 16 x 16 C tile (sums) at output rows m.., columns n.. */
static inline void store_tile(const int32_t *sums, int64_t rows, const float *ascale, const float *wscale,
                              const float *bias, int64_t N, int64_t m, int64_t n, float *y, int32_t act) {
    const __m512 w = _mm512_loadu_ps(wscale + n);
    const __m512 b = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
    for (int64_t i = 0; i < rows; i++) {
        const __m512 f = _mm512_mul_ps(_mm512_set1_ps(ascale[m + i]), w);
        __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(sums + 16 * i)), f, b);
        _mm512_storeu_ps(y + (m + i) * N + n, act ? gelu_erf16(v) : v);
    }
}

/* rows [start, end) of y (M, N) = a (M, K) x packed b, scaled: the door splits the rows over threads.
 * Returns -1 on arguments the door would have refused, -2 without the tiles' permission. */
int int8_amx_gemm(const int8_t *a, const float *ascale, int64_t M, int64_t K, const int8_t *bp, const float *wscale,
                  const float *bias, int64_t N, float *y, int32_t act, int64_t start, int64_t end) {
    if (M < 0 || K < 0 || N < 0 || K % 64 || N % 16 || start < 0 || end > M || start > end || act < 0 || act > 1)
        return -1;
    if (start == end || N == 0) return 0;
    if (K == 0) { /* no products: the bias (or zeros), through GELU if asked */
        for (int64_t m = start; m < end; m++)
            for (int64_t n = 0; n < N; n += 16) {
                const __m512 v = bias ? _mm512_loadu_ps(bias + n) : _mm512_setzero_ps();
                _mm512_storeu_ps(y + m * N + n, act ? gelu_erf16(v) : v);
            }
        return 0;
    }
    if (!tiles_permitted()) return -2;
    int8_t *pad = NULL; /* the last block's rows, zero-padded to 32 */
    if ((end - start) % 32) {
        pad = calloc((size_t)(32 * K), 1);
        if (!pad) return -2;
    }
    configure_tiles();
    const int64_t panel = K * 16; /* bytes of one 16-column panel (K is a multiple of 4) */
    int32_t sums[4][256] __attribute__((aligned(64)));
    for (int64_t m = start; m < end; m += 32) {
        const int64_t rows = end - m < 32 ? end - m : 32;
        const int8_t *ab = a + m * K;
        if (rows < 32) {
            memcpy(pad, ab, (size_t)(rows * K));
            ab = pad;
        }
        for (int64_t n = 0; n < N; n += 32) {
            const int two = N - n >= 32; /* a last panel alone when N is an odd number of panels */
            const int8_t *b0 = bp + (n / 16) * panel, *b1 = b0 + panel;
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int64_t k = 0; k < K; k += 64) {
                _tile_loadd(4, ab + k, K);
                _tile_loadd(5, ab + 16 * K + k, K);
                _tile_loadd(6, b0 + k * 16, 64);
                _tile_dpbssd(0, 4, 6);
                _tile_dpbssd(2, 5, 6);
                if (two) {
                    _tile_loadd(7, b1 + k * 16, 64);
                    _tile_dpbssd(1, 4, 7);
                    _tile_dpbssd(3, 5, 7);
                }
            }
            _tile_stored(0, sums[0], 64);
            _tile_stored(2, sums[2], 64);
            if (two) {
                _tile_stored(1, sums[1], 64);
                _tile_stored(3, sums[3], 64);
            }
            const int64_t top = rows < 16 ? rows : 16, low = rows - top;
            store_tile(sums[0], top, ascale, wscale, bias, N, m, n, y, act);
            if (low > 0) store_tile(sums[2], low, ascale, wscale, bias, N, m + 16, n, y, act);
            if (two) {
                store_tile(sums[1], top, ascale, wscale, bias, N, m, n + 16, y, act);
                if (low > 0) store_tile(sums[3], low, ascale, wscale, bias, N, m + 16, n + 16, y, act);
            }
        }
    }
    _tile_release();
    free(pad);
    return 0;
}
#else
int int8_amx_supported(void) { return 0; }

int int8_amx_gemm(const int8_t *a, const float *ascale, int64_t M, int64_t K, const int8_t *bp, const float *wscale,
                  const float *bias, int64_t N, float *y, int32_t act, int64_t start, int64_t end) {
    (void)a; (void)ascale; (void)M; (void)K; (void)bp; (void)wscale; (void)bias; (void)N; (void)y; (void)act;
    (void)start; (void)end;
    return -1;
}
#endif
