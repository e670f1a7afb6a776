/* The persistent thread pool behind pool_run (see pool.h): one job word that
 * workers claim task indices from, a brief spin, then a condition variable.
 * Owns its worker threads and nothing else. */
#include "cluster/model/pool.h"

#include "base/check.h"
#include "base/clock.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define POOL_PAUSE() _mm_pause()
#else
#define POOL_PAUSE() ((void)0)
#endif

/* Job word: generation in the high 32 bits, next unclaimed task index in the
 * low 32. While the caller rewrites the job fields, the index holds
 * POOL_SETUP so no claim can succeed with a stale field. */
#define POOL_SETUP 0xffffffffu
#define POOL_GEN(s) ((uint32_t)((s) >> 32))
#define POOL_IDX(s) ((uint32_t)(s))
#define POOL_WORD(gen, idx) (((uint64_t)(gen) << 32) | (uint64_t)(idx))

/* How long a worker polls for the next job before it sleeps, by default
 * (pool_set_poll changes it): ~80 us, enough to catch the next pool_run of
 * the same layer without burning a core another rank may need. A rank that
 * owns its CPUs polls for 1 ms (rank.c): a layer's serial work (attention
 * that does not split, norms, a stage's bookkeeping) was longer than 80 us
 * on the 2-core machine, and every sleep cost a futex wake-up with one
 * thread streaming the next GEMM alone meanwhile (19 per batch-1 decode
 * step, 2-4 % of it). A worker stops polling at once when the owner parks
 * the pool (pool_park: it will wait for a message). The clock is read every
 * POOL_SPIN_CHECK polls. */
#define POOL_POLL_US_DEFAULT 80u
#define POOL_SPIN_CHECK 256
/* How long the caller polls for the last task's end before it sleeps. */
#define POOL_SPIN_CALLER 4096

/* INV: between pool_run calls, POOL_GEN(state) == gen, POOL_IDX(state) ==
 *      n_tasks == done (every task of the last job was claimed and finished).
 * INV: a task index is claimed only by a successful CAS of state from
 *      (gen, i) to (gen, i + 1) with i < n_tasks, so each runs exactly once;
 *      the job fields of generation g are rewritten only after all of g's
 *      tasks finished, and only while the index holds POOL_SETUP.
 * INV: n_workers == n_threads - 1; worker w runs with thread index w + 1. */
struct pool {
    uint32_t n_threads;
    uint32_t n_workers;   /* threads started (0 when creation failed midway) */
    uint32_t gen;         /* caller-side copy of the current generation */
    _Atomic uint64_t state;
    _Atomic(pool_fn) fn;
    _Atomic(void *) ctx;
    atomic_uint n_tasks;
    atomic_uint done;     /* tasks of the current job finished */
    atomic_uint sleepers; /* workers waiting on work_cv */
    atomic_bool stop;
    atomic_bool park;     /* pool_park: workers sleep now, not after polling */
    atomic_long poll_ns;  /* how long a worker polls for the next job */
    bool caller_waiting;  /* guarded by mu */
    pthread_mutex_t mu;
    pthread_cond_t work_cv;
    pthread_cond_t done_cv;
    pthread_t *tids;
};

struct pool_worker_arg {
    pool *p;
    uint32_t thread;
};

/* Claims and runs tasks of generation gen until none is left (or a newer
 * generation is published). */
static void pool_drain(pool *p, uint32_t gen, uint32_t thread)
{
    for (;;) {
        uint64_t s = atomic_load(&p->state);
        if (POOL_GEN(s) != gen)
            return;
        uint32_t idx = POOL_IDX(s);
        if (idx == POOL_SETUP) { /* the caller is still writing the job fields */
            POOL_PAUSE();
            continue;
        }
        uint32_t n = atomic_load(&p->n_tasks);
        if (idx >= n)
            return;
        if (!atomic_compare_exchange_weak(&p->state, &s, s + 1))
            continue;
        /* The job cannot finish (so its fields cannot change) before this
         * task's done increment below. */
        pool_fn fn = atomic_load(&p->fn);
        fn(atomic_load(&p->ctx), idx, thread);
        if (atomic_fetch_add(&p->done, 1) + 1 == n) {
            pthread_mutex_lock(&p->mu);
            if (p->caller_waiting)
                pthread_cond_signal(&p->done_cv);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *pool_worker(void *argp)
{
    struct pool_worker_arg a = *(struct pool_worker_arg *)argp;
    free(argp);
    pool *p = a.p;
    /* Generation 0 is the one the pool was created with: a worker that starts
     * late must still take part in job 1. */
    uint32_t seen = 0;
    for (;;) {
        uint64_t s = atomic_load(&p->state);
        long t0 = -1;
        for (uint32_t i = 1; POOL_GEN(s) == seen && !atomic_load(&p->stop) && !atomic_load(&p->park); i++) {
            POOL_PAUSE();
            s = atomic_load(&p->state);
            if (i % POOL_SPIN_CHECK == 0) {
                long t = (long)pd_now_ns();
                if (t0 < 0)
                    t0 = t;
                else if (t - t0 > atomic_load(&p->poll_ns))
                    break;
            }
        }
        if (POOL_GEN(s) == seen && !atomic_load(&p->stop)) {
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (POOL_GEN(atomic_load(&p->state)) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->work_cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            s = atomic_load(&p->state);
        }
        if (atomic_load(&p->stop))
            return NULL;
        seen = POOL_GEN(s);
        pool_drain(p, seen, a.thread);
    }
}

static void pool_stop_workers(pool *p)
{
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->work_cv);
    pthread_mutex_unlock(&p->mu);
    for (uint32_t w = 0; w < p->n_workers; w++)
        pthread_join(p->tids[w], NULL);
    p->n_workers = 0;
}

pd_status pool_new(uint32_t n_threads, pool **out, pd_err *err)
{
    if (!out)
        return pd_err_set(err, PD_ERR_ARG, "pool: out is NULL");
    if (n_threads < 1 || n_threads > POOL_MAX_THREADS)
        return pd_err_set(err, PD_ERR_ARG, "pool: %u threads, want 1..%u", n_threads,
                          POOL_MAX_THREADS);
    pool *p = calloc(1, sizeof *p);
    pthread_t *tids = n_threads > 1 ? calloc(n_threads - 1, sizeof *tids) : NULL;
    if (!p || (n_threads > 1 && !tids)) {
        free(p);
        free(tids);
        return pd_err_set(err, PD_ERR_NOMEM, "pool: cannot allocate %u threads", n_threads);
    }
    *p = (pool){.n_threads = n_threads, .tids = tids};
    atomic_init(&p->state, POOL_WORD(0, 0));
    atomic_init(&p->fn, NULL);
    atomic_init(&p->ctx, NULL);
    atomic_init(&p->n_tasks, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->stop, false);
    atomic_init(&p->park, false);
    atomic_init(&p->poll_ns, (long)POOL_POLL_US_DEFAULT * 1000L);
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->work_cv, NULL);
    pthread_cond_init(&p->done_cv, NULL);
    for (uint32_t w = 0; w + 1 < n_threads; w++) {
        struct pool_worker_arg *a = malloc(sizeof *a);
        int rc = -1;
        if (a) {
            *a = (struct pool_worker_arg){.p = p, .thread = w + 1};
            rc = pthread_create(&p->tids[w], NULL, pool_worker, a);
            if (rc != 0)
                free(a);
        }
        if (rc != 0) {
            pool_free(p);
            return pd_err_set(err, PD_ERR_NOMEM, "pool: cannot start worker %u of %u", w + 1,
                              n_threads - 1);
        }
        p->n_workers = w + 1;
    }
    *out = p;
    return PD_OK;
}

void pool_free(pool *p)
{
    if (!p)
        return;
    pool_stop_workers(p);
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->work_cv);
    pthread_mutex_destroy(&p->mu);
    free(p->tids);
    free(p);
}

uint32_t pool_threads(const pool *p)
{
    return p ? p->n_threads : 1;
}

void pool_run(pool *p, uint32_t n_tasks, pool_fn fn, void *ctx)
{
    if (n_tasks == 0)
        return;
    CHECK(fn != NULL);
    if (!p || p->n_workers == 0 || n_tasks == 1) {
        for (uint32_t t = 0; t < n_tasks; t++)
            fn(ctx, t, 0);
        return;
    }
    CHECKF(n_tasks < POOL_SETUP, "pool: %u tasks", n_tasks);
    uint32_t gen = p->gen + 1;
    p->gen = gen;
    atomic_store(&p->park, false);
    atomic_store(&p->state, POOL_WORD(gen, POOL_SETUP));
    atomic_store(&p->fn, fn);
    atomic_store(&p->ctx, ctx);
    atomic_store(&p->n_tasks, n_tasks);
    atomic_store(&p->done, 0);
    atomic_store(&p->state, POOL_WORD(gen, 0));
    /* Pairs with the worker's sleepers increment before it re-reads state
     * (both sequentially consistent): either it sees the new generation or we
     * see it asleep. */
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->work_cv);
        pthread_mutex_unlock(&p->mu);
    }
    pool_drain(p, gen, 0);
    for (int i = 0; i < POOL_SPIN_CALLER && atomic_load(&p->done) != n_tasks; i++)
        POOL_PAUSE();
    if (atomic_load(&p->done) != n_tasks) {
        pthread_mutex_lock(&p->mu);
        p->caller_waiting = true;
        while (atomic_load(&p->done) != n_tasks)
            pthread_cond_wait(&p->done_cv, &p->mu);
        p->caller_waiting = false;
        pthread_mutex_unlock(&p->mu);
    }
}

void pool_set_poll(pool *p, uint32_t us)
{
    if (p)
        atomic_store(&p->poll_ns, (long)us * 1000L);
}

void pool_park(pool *p)
{
    if (p)
        atomic_store(&p->park, true);
}

void pool_check(const pool *p)
{
    if (!p)
        return;
    CHECK(p->n_threads >= 1 && p->n_threads <= POOL_MAX_THREADS);
    CHECK(p->n_workers == p->n_threads - 1);
    uint64_t s = atomic_load(&p->state);
    uint32_t n = atomic_load(&p->n_tasks);
    CHECK(POOL_GEN(s) == p->gen);
    CHECK(POOL_IDX(s) == n);
    CHECK(atomic_load(&p->done) == n);
    CHECK(!atomic_load(&p->stop));
}
