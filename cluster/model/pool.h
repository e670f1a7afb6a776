/* A small persistent thread pool for the compute kernels (GEMM, per-head
 * attention, per-row math): pool_run hands out n_tasks task indices to the
 * caller and n_threads - 1 parked worker threads, and returns when every task
 * has run.
 *
 * Results must never depend on which thread runs which task or in what order
 * (ARCHITECTURE.md §1): the pool only promises that every task index in
 * [0, n_tasks) runs exactly once before pool_run returns. Tasks are claimed
 * dynamically, so a worker that the OS has descheduled never holds up tasks it
 * has not claimed yet.
 *
 * Dispatch latency matters (several calls per layer per micro-batch): workers
 * poll the job word for a while after each job (pool_set_poll), then sleep
 * on a condition variable; pool_park sends them to sleep at once. pool_run
 * allocates nothing. */
#ifndef PD_POOL_H
#define PD_POOL_H

#include "base/status.h"

#include <stdint.h>

typedef struct pool pool;

/* A task: `task` is the task index in [0, n_tasks), `thread` the index of the
 * thread running it in [0, pool_threads) (0 = the caller), e.g. to pick a
 * per-thread scratch buffer. */
typedef void (*pool_fn)(void *ctx, uint32_t task, uint32_t thread);

/* Upper bound on n_threads (a sanity limit, not a tuning knob). */
#define POOL_MAX_THREADS 256u

/* Creates a pool of n_threads threads in total, counting the caller of
 * pool_run (so n_threads = 1 starts no thread). n_threads must be in
 * [1, POOL_MAX_THREADS]. Returns owned, free with pool_free. */
pd_status pool_new(uint32_t n_threads, pool **out, pd_err *err);

/* Stops and joins the workers. pool_free(NULL) is a no-op. Must not run
 * concurrently with pool_run on the same pool. */
void pool_free(pool *p);

/* Total threads including the caller; 1 for a NULL pool. */
uint32_t pool_threads(const pool *p);

/* Runs fn(ctx, t, thread) for every t in [0, n_tasks), each exactly once, and
 * returns when all have finished (their writes are then visible to the
 * caller). The calling thread runs tasks too. p == NULL runs every task inline
 * on the caller, in increasing order. Tasks may run in any order and
 * concurrently; fn must not call pool_run on the same pool. One caller at a
 * time per pool. */
void pool_run(pool *p, uint32_t n_tasks, pool_fn fn, void *ctx);

/* How long workers poll for the next job after one ends before they sleep:
 * 80 us by default, enough between the GEMMs of one layer without taking a
 * core from another rank for long; an owner alone on its CPUs may set more
 * (a batch-1 step's serial work between two jobs can be longer, and a sleep
 * costs a wake-up). Takes effect from the next poll; NULL is a no-op. */
void pool_set_poll(pool *p, uint32_t us);

/* Tells the workers that no job comes soon (the owner is about to wait for
 * a message, or to hand the CPUs to another rank): they sleep now instead of
 * polling. The next pool_run wakes them as usual. Only the thread that calls
 * pool_run calls it; NULL is a no-op. */
void pool_park(pool *p);

/* Checks the pool's internal invariants (idle between jobs); aborts through
 * CHECK on violation. For tests. */
void pool_check(const pool *p);

#endif
