/* Worker threads for the kernels' row ranges.
 *
 * The door (nn/kernels.py) splits a kernel's rows over threads. Through Python threads a hand-off costs
 * ~100 us (the GIL changes hands twice per call), which is as much as a whole product at the few rows of a
 * serving step's tail, where each decoding step makes ~240 kernel calls. Here the calling thread publishes
 * the job, wakes the workers (each polls for a while after its last job, then sleeps on a condition
 * variable), runs the first part itself and spins until every worker has acknowledged the job: the parts are
 * equal, so that wait is short. Every started worker acknowledges every job, taking part or not, so no
 * worker can still be reading a job's fields when the next one is written.
 *
 * One job at a time: a caller that finds the pool busy (another Python thread's job) runs its range alone.
 * A worker that cannot be started means fewer parts, never an error. After fork() the child has no workers:
 * they start again on first use. */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>

#include "thread_pool.h"

#define MAX_WORKERS 63
#define SPIN_NS 200000  /* how long a worker polls for the next job before it sleeps: a step's calls come closer */

static pthread_mutex_t busy = PTHREAD_MUTEX_INITIALIZER;  /* held while a job runs */
static pthread_mutex_t sleep_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static atomic_uint generation;  /* bumped once per job */
static atomic_int pending;      /* started workers that have not yet acknowledged the current job */
static int started;             /* workers 1..started are running */
static unsigned first_seen[MAX_WORKERS + 1];  /* the generation before a worker's first job */
static range_fn job_fn;
static void *job_ctx;
static int64_t job_start, job_end;
static int job_parts;

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static void piece(int id, int parts, int64_t start, int64_t end, int64_t *s, int64_t *e) {
    const int64_t n = end - start;
    *s = start + n * id / parts;
    *e = start + n * (id + 1) / parts;
}

static void *worker(void *arg) {
    const int id = (int)(intptr_t)arg;
    unsigned seen = first_seen[id], g;
    for (;;) {
        const int64_t until = now_ns() + SPIN_NS;
        unsigned polls = 0;
        /* plain polling, no PAUSE: under a hypervisor a PAUSE loop can make the vCPU exit to the host */
        while ((g = atomic_load_explicit(&generation, memory_order_acquire)) == seen) {
            if ((++polls & 255) || now_ns() < until) continue;
            pthread_mutex_lock(&sleep_lock);
            while ((g = atomic_load_explicit(&generation, memory_order_acquire)) == seen)
                pthread_cond_wait(&wake, &sleep_lock);
            pthread_mutex_unlock(&sleep_lock);
            break;
        }
        seen = g;
        if (id < job_parts) {
            int64_t s, e;
            piece(id, job_parts, job_start, job_end, &s, &e);
            job_fn(job_ctx, s, e);
        }
        atomic_fetch_sub_explicit(&pending, 1, memory_order_acq_rel);
    }
    return NULL;
}

static void after_fork_in_child(void) {
    /* only the forking thread exists in the child: no workers, and no job in flight */
    started = 0;
    pthread_mutex_init(&busy, NULL);
    pthread_mutex_init(&sleep_lock, NULL);
    pthread_cond_init(&wake, NULL);
    atomic_store(&pending, 0);
}

static void register_fork_handler(void) { pthread_atfork(NULL, NULL, after_fork_in_child); }

void pool_run(range_fn fn, void *ctx, int64_t start, int64_t end, int parts) {
    if (parts > MAX_WORKERS + 1) parts = MAX_WORKERS + 1;
    if (parts > end - start) parts = (int)(end - start);
    if (parts < 2) {
        fn(ctx, start, end);
        return;
    }
    pthread_once(&once, register_fork_handler);
    if (pthread_mutex_trylock(&busy) != 0) {
        fn(ctx, start, end);
        return;
    }
    while (started < parts - 1) {
        pthread_t t;
        pthread_attr_t attr;
        const int id = started + 1;
        first_seen[id] = atomic_load(&generation);
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int rc = pthread_create(&t, &attr, worker, (void *)(intptr_t)id);
        pthread_attr_destroy(&attr);
        if (rc != 0) break;
        started = id;
    }
    if (parts > started + 1) parts = started + 1;
    job_fn = fn;
    job_ctx = ctx;
    job_start = start;
    job_end = end;
    job_parts = parts;
    atomic_store_explicit(&pending, started, memory_order_relaxed);
    pthread_mutex_lock(&sleep_lock);
    atomic_fetch_add_explicit(&generation, 1, memory_order_release);
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&sleep_lock);
    int64_t s, e;
    piece(0, parts, start, end, &s, &e);
    fn(ctx, s, e);
    for (unsigned polls = 0; atomic_load_explicit(&pending, memory_order_acquire) > 0; polls++)
        if (polls >= (1u << 20)) sched_yield();  /* a worker descheduled: let it run */
    pthread_mutex_unlock(&busy);
}
