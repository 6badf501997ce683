/* The host GEMM's blocks on a pool of C threads, loaded with ctypes by engine/blas.py.
 *
 * engine/blas.py splits every product into blocks chosen from its shapes and the run's
 * partition only (never from the thread count), so the bits do not depend on how many threads
 * compute them; it hands one call here a product's *plan* (the layout and each block's offsets,
 * worked out once per shapes and strides) and its three base pointers. The calling thread and
 * up to ``workers`` - 1 pool threads take the blocks from a shared counter and call OpenBLAS's
 * cblas_?gemm (caffe8's own OpenBLAS, running on one thread) on each: no Python between the
 * blocks, and one ctypes call a product (a product run block by block from Python cost ~20 us of
 * dispatch, more than LeNet's small products themselves).
 *
 * Plan layout (int64): [0] dtype (0 float32, 1 float64)  [1] transA  [2] transB  [3] K
 *                      [4] lda  [5] ldb  [6] ldc  [7] beta (0 or 1)  [8] block count B,
 *                      then B blocks of 5: rows M_i, cols N_i, byte offsets into A, B and C.
 *
 * A plain C99 library with POSIX threads (no Python C API): ctypes releases the GIL for the
 * call. The pool starts threads as needed and keeps them; a forked child starts with none.
 */
#define _POSIX_C_SOURCE 200809L
#include "c8_kernels.h"           /* idx, C8_ABI: engine/csrc/c8_kernels.h */

#include <pthread.h>
#include <stdint.h>

#define C8B_ABI_VERSION 1
#define C8B_MAX_THREADS 256
#define ROW_MAJOR 101

C8_ABI(c8b_abi_version, C8B_ABI_VERSION)

typedef void (*sgemm_fn)(int, int, int, int, int, int, float, const float *, int, const float *,
                         int, float, float *, int);
typedef void (*dgemm_fn)(int, int, int, int, int, int, double, const double *, int,
                         const double *, int, double, double *, int);

/* one product in flight: what every thread reads, and the counter they take blocks from */
struct job {
    void *gemm;
    const int64_t *plan;
    char *a, *b, *c;
    int64_t next;                 /* the next block to take (atomic) */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t wake = PTHREAD_COND_INITIALIZER, done = PTHREAD_COND_INITIALIZER;
static pthread_mutex_t call_lock = PTHREAD_MUTEX_INITIALIZER;   /* one product at a time */
static struct job current;
static uint64_t generation;       /* bumped for each product handed to the pool */
static int started;               /* pool threads running */
static int wanted;                /* pool threads asked to work on the current product */
static int working;               /* of those, still working on it */
static int at_fork_set;

static void run_block(const struct job *j, int64_t i)
{
    const int64_t *p = j->plan, *blk = p + 9 + 5 * i;
    const int ta = (int)p[1], tb = (int)p[2], k = (int)p[3];
    const int lda = (int)p[4], ldb = (int)p[5], ldc = (int)p[6];
    const int m = (int)blk[0], n = (int)blk[1];
    if (p[0] == 0)
        ((sgemm_fn)j->gemm)(ROW_MAJOR, ta, tb, m, n, k, 1.0f, (const float *)(j->a + blk[2]),
                            lda, (const float *)(j->b + blk[3]), ldb, (float)p[7],
                            (float *)(j->c + blk[4]), ldc);
    else
        ((dgemm_fn)j->gemm)(ROW_MAJOR, ta, tb, m, n, k, 1.0, (const double *)(j->a + blk[2]),
                            lda, (const double *)(j->b + blk[3]), ldb, (double)p[7],
                            (double *)(j->c + blk[4]), ldc);
}

static void take_blocks(struct job *j)
{
    const int64_t count = j->plan[8];
    for (int64_t i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED); i < count;
         i = __atomic_fetch_add(&j->next, 1, __ATOMIC_RELAXED))
        run_block(j, i);
}

static void *worker(void *arg)
{
    const int index = (int)(intptr_t)arg;
    uint64_t seen = 0;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (generation == seen || index >= wanted)
        {
            seen = generation;          /* a product not meant for this thread: skip it */
            pthread_cond_wait(&wake, &lock);
        }
        seen = generation;
        pthread_mutex_unlock(&lock);
        take_blocks(&current);
        pthread_mutex_lock(&lock);
        if (--working == 0)
            pthread_cond_signal(&done);
    }
    return NULL;
}

static void forked_child(void)
{
    /* the pool's threads do not exist in a forked child: start again from none */
    pthread_mutex_init(&lock, NULL);
    pthread_mutex_init(&call_lock, NULL);
    pthread_cond_init(&wake, NULL);
    pthread_cond_init(&done, NULL);
    started = wanted = working = 0;
}

/* Threads that help the caller: as many as asked (and could be started), at most
 * C8B_MAX_THREADS - 1. Called with ``lock`` held. */
static int helpers(int asked)
{
    if (!at_fork_set) {
        pthread_atfork(NULL, NULL, forked_child);
        at_fork_set = 1;
    }
    if (asked > C8B_MAX_THREADS - 1)
        asked = C8B_MAX_THREADS - 1;
    while (started < asked) {
        pthread_t t;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&t, &attr, worker, (void *)(intptr_t)started);
        pthread_attr_destroy(&attr);
        if (failed)
            break;                   /* fewer helpers: the same blocks, the same bits */
        ++started;
    }
    return asked < started ? asked : started;
}

/* Run every block of ``plan`` on the caller and up to ``workers`` - 1 pool threads. */
void c8b_gemm(void *gemm, const int64_t *plan, char *a, char *b, char *c, int workers)
{
    const int64_t count = plan[8];
    struct job j = {gemm, plan, a, b, c, 0};
    if (workers <= 1 || count <= 1) {
        take_blocks(&j);
        return;
    }
    pthread_mutex_lock(&call_lock);
    pthread_mutex_lock(&lock);
    int help = helpers((int)(count < workers ? count : workers) - 1);
    current = j;
    wanted = working = help;
    ++generation;
    pthread_cond_broadcast(&wake);
    pthread_mutex_unlock(&lock);
    take_blocks(&current);
    pthread_mutex_lock(&lock);
    while (working > 0)
        pthread_cond_wait(&done, &lock);
    wanted = 0;
    pthread_mutex_unlock(&lock);
    pthread_mutex_unlock(&call_lock);
}

/* Pool threads started so far (tests). */
int c8b_pool_threads(void)
{
    pthread_mutex_lock(&lock);
    int n = started;
    pthread_mutex_unlock(&lock);
    return n;
}
