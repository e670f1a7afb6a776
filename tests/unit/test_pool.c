/* Tests for cluster/model/pool.h: every task index runs exactly once, on a valid
 * thread index, for any task count and thread count, repeatedly; NULL pools
 * run inline; workers really run concurrently. */
#include "pd_test.h"

#include "base/clock.h"
#include "cluster/model/pool.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_TASKS 1001

typedef struct count_ctx {
    atomic_uint runs[MAX_TASKS];
    atomic_uint bad_thread;
    uint32_t n_threads;
    uint32_t plain[MAX_TASKS]; /* written without atomics: checks visibility */
} count_ctx;

static void count_task(void *ctxp, uint32_t task, uint32_t thread)
{
    count_ctx *c = ctxp;
    atomic_fetch_add(&c->runs[task], 1);
    if (thread >= c->n_threads)
        atomic_fetch_add(&c->bad_thread, 1);
    c->plain[task] = task * 3u + 1u;
}

static void count_reset(count_ctx *c, uint32_t n_threads)
{
    for (uint32_t i = 0; i < MAX_TASKS; i++)
        atomic_store(&c->runs[i], 0);
    atomic_store(&c->bad_thread, 0);
    memset(c->plain, 0, sizeof c->plain);
    c->n_threads = n_threads;
}

/* Asserts once per call (each ck_assert costs a pipe write in fork mode). */
static void count_expect(count_ctx *c, uint32_t n_tasks)
{
    uint32_t wrong_runs = 0, wrong_plain = 0, first_bad = MAX_TASKS;
    for (uint32_t i = 0; i < MAX_TASKS; i++) {
        uint32_t want = i < n_tasks ? 1u : 0u;
        int bad = 0;
        if (atomic_load(&c->runs[i]) != want)
            wrong_runs++, bad = 1;
        if (c->plain[i] != (i < n_tasks ? i * 3u + 1u : 0u))
            wrong_plain++, bad = 1;
        if (bad && first_bad == MAX_TASKS)
            first_bad = i;
    }
    ck_assert_msg(wrong_runs == 0 && wrong_plain == 0 && atomic_load(&c->bad_thread) == 0,
                  "n_tasks %u: %u tasks ran != once (first %u), %u writes lost, %u bad threads",
                  n_tasks, wrong_runs, first_bad, wrong_plain, atomic_load(&c->bad_thread));
}

START_TEST(pool_new_rejects_bad_thread_counts)
{
    pool *p = (pool *)&p; /* sentinel: must stay untouched */
    pd_err err = {0};
    ck_assert_int_eq(pool_new(0, &p, &err), PD_ERR_ARG);
    ck_assert_ptr_eq(p, (pool *)&p);
    pd_err_clear(&err);
    ck_assert_int_eq(pool_new(POOL_MAX_THREADS + 1, &p, &err), PD_ERR_ARG);
    ck_assert_ptr_eq(p, (pool *)&p);
    ck_assert_int_eq(pool_new(2, NULL, NULL), PD_ERR_ARG);
}
END_TEST

START_TEST(pool_every_task_runs_exactly_once)
{
    static count_ctx c;
    for (uint32_t nt = 1; nt <= 4; nt++) {
        pool *p = NULL;
        pd_err err = {0};
        ck_assert_int_eq(pool_new(nt, &p, &err), PD_OK);
        ck_assert_uint_eq(pool_threads(p), nt);
        for (uint32_t n = 0; n < MAX_TASKS; n++) {
            count_reset(&c, nt);
            pool_run(p, n, count_task, &c);
            count_expect(&c, n);
            pool_check(p);
        }
        pool_free(p);
    }
}
END_TEST

typedef struct sum_ctx {
    atomic_ullong sum;
} sum_ctx;

static void sum_task(void *ctxp, uint32_t task, uint32_t thread)
{
    sum_ctx *s = ctxp;
    atomic_fetch_add(&s->sum, (unsigned long long)task + 1);
}

START_TEST(pool_repeated_runs_keep_counting)
{
    pool *p = NULL;
    ck_assert_int_eq(pool_new(3, &p, NULL), PD_OK);
    sum_ctx s;
    unsigned long long want = 0;
    atomic_init(&s.sum, 0);
    for (uint32_t r = 0; r < 20000; r++) {
        uint32_t n = r % 9;
        pool_run(p, n, sum_task, &s);
        want += (unsigned long long)n * (n + 1) / 2;
        if (atomic_load(&s.sum) != want)
            ck_abort_msg("run %u: sum %llu, want %llu", r, atomic_load(&s.sum), want);
    }
    pool_check(p);
    pool_free(p);
}
END_TEST

static void nap_ms(long ms)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

/* After a job the workers poll for the next one (here 5 ms each:
 * pool_set_poll), so a pause right after it costs CPU; a parked pool's
 * workers sleep at once: the process uses (almost) no CPU while its caller
 * naps, and the next run still runs every task. 3 workers polling for 5 ms
 * take several ms of CPU on a machine of 2 cores or more (at least 1 ms in
 * one of five tries, however busy); parked, they take microseconds. */
START_TEST(pool_park_sends_the_workers_to_sleep_at_once)
{
    pool *p = NULL;
    ck_assert_int_eq(pool_new(4, &p, NULL), PD_OK);
    pool_set_poll(p, 5000);
    pool_set_poll(NULL, 5000);
    sum_ctx s;
    atomic_init(&s.sum, 0);
    unsigned long long want = 0;
    double polled = 0, parked = 1e9;
    for (int r = 0; r < 5; r++) {
        pool_run(p, 64, sum_task, &s);
        double t0 = pd_cpu_s();
        nap_ms(20);
        double a = pd_cpu_s() - t0;
        polled = a > polled ? a : polled;
        pool_run(p, 64, sum_task, &s);
        pool_park(p);
        t0 = pd_cpu_s();
        nap_ms(20);
        double b = pd_cpu_s() - t0;
        parked = b < parked ? b : parked;
        want += 2ull * 64 * 65 / 2;
    }
    ck_assert_uint_eq(atomic_load(&s.sum), want);
    ck_assert_msg(parked < 0.0005, "parked workers used %.3f ms of CPU in 20 ms", parked * 1e3);
    ck_assert_msg(polled > 0.001, "workers polling for 5 ms used %.3f ms of CPU", polled * 1e3);
    pool_park(NULL);
    pool_check(p);
    pool_free(p);
}
END_TEST

typedef struct order_ctx {
    uint32_t next;
    uint32_t misordered;
    uint32_t nonzero_thread;
} order_ctx;

static void order_task(void *ctxp, uint32_t task, uint32_t thread)
{
    order_ctx *o = ctxp;
    if (task != o->next)
        o->misordered++;
    if (thread != 0)
        o->nonzero_thread++;
    o->next = task + 1;
}

START_TEST(pool_null_runs_inline_in_order)
{
    ck_assert_uint_eq(pool_threads(NULL), 1);
    order_ctx o = {0};
    pool_run(NULL, 500, order_task, &o);
    ck_assert_uint_eq(o.next, 500);
    ck_assert_uint_eq(o.misordered, 0);
    ck_assert_uint_eq(o.nonzero_thread, 0);
    pool_run(NULL, 0, order_task, &o);
    ck_assert_uint_eq(o.next, 500);
    pool_free(NULL);
}
END_TEST

typedef struct meet_ctx {
    atomic_uint arrived;
    atomic_uint thread_mask;
} meet_ctx;

/* Each task waits until every task of the job has started: only possible
 * when the tasks run on distinct threads at the same time. */
static void meet_task(void *ctxp, uint32_t task, uint32_t thread)
{
    meet_ctx *m = ctxp;
    atomic_fetch_add(&m->arrived, 1);
    atomic_fetch_or(&m->thread_mask, 1u << thread);
    while (atomic_load(&m->arrived) < 3)
        ;
}

START_TEST(pool_workers_run_tasks_concurrently)
{
    pool *p = NULL;
    ck_assert_int_eq(pool_new(3, &p, NULL), PD_OK);
    for (int r = 0; r < 5; r++) {
        meet_ctx m;
        atomic_init(&m.arrived, 0);
        atomic_init(&m.thread_mask, 0);
        pool_run(p, 3, meet_task, &m);
        ck_assert_uint_eq(atomic_load(&m.arrived), 3);
        ck_assert_uint_eq(atomic_load(&m.thread_mask), 7u);
    }
    pool_check(p);
    pool_free(p);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("pool");
    TCase *tc = tcase_create("pool");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, pool_new_rejects_bad_thread_counts);
    tcase_add_test(tc, pool_every_task_runs_exactly_once);
    tcase_add_test(tc, pool_repeated_runs_keep_counting);
    tcase_add_test(tc, pool_null_runs_inline_in_order);
    tcase_add_test(tc, pool_workers_run_tasks_concurrently);
    tcase_add_test(tc, pool_park_sends_the_workers_to_sleep_at_once);
    suite_add_tcase(s, tc);
    return s;
}
