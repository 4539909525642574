/* The kernels' worker threads (thread_pool.c): fn(ctx, s, e) over [start, end) in `parts` equal pieces. */
#ifndef ATTNLAB_THREAD_POOL_H
#define ATTNLAB_THREAD_POOL_H
#include <stdint.h>

typedef void (*range_fn)(void *ctx, int64_t start, int64_t end);
void pool_run(range_fn fn, void *ctx, int64_t start, int64_t end, int parts);

#endif
