/* What the int8 products that copy their activation rows share (int8_gemm.c for AVX2, int8_vnni.c for
 * AVX512-VNNI): the argument check the door already made, K in quads of 4 bytes (the packed weights'
 * layout), and how many rows a chunk copies: ~128 KB, which stays in L2 while every weight panel passes
 * over it, a multiple of the micro-tile's rows. */
#ifndef ATTNLAB_INT8_CHUNK_H
#define ATTNLAB_INT8_CHUNK_H
#include <stdint.h>

#define INT8_ROW_CHUNK_BYTES (128 * 1024)

static inline int64_t int8_quads(int64_t K) { return (K + 3) / 4; }

/* 1 if the arguments are ones the door would have refused (rows [start, end) of M, act 0 or 1) */
static inline int int8_bad_args(int64_t M, int64_t K, int64_t N, int32_t act, int64_t start, int64_t end) {
    return M < 0 || K < 0 || N < 0 || start < 0 || end > M || start > end || act < 0 || act > 1;
}

/* rows per chunk for rows of kq quads and a micro-tile of mr rows (at least one tile) */
static inline int64_t int8_row_chunk(int64_t kq, int64_t mr) {
    const int64_t chunk = kq ? INT8_ROW_CHUNK_BYTES / (4 * kq) / mr * mr : mr;
    return chunk < mr ? mr : chunk;
}
#endif
