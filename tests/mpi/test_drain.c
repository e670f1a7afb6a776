/* The drain point across real ranks: the head drains at pseudo-random steps,
 * every rank runs the action at the same step boundary with the same step,
 * action and number (checked with a collective inside the action, which
 * must therefore be safe there), the pipeline resumes, and out.jsonl,
 * digests included, is byte-identical to a run that never drained.
 * Assertions run after every collective is done, so a failed check cannot
 * leave a peer blocked.
 * PD_MPI_RANKS: 1 2 3 */
#include "pd_test.h"
#include "fixture.h"

#include "cluster/runtime/job/run.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_DRAINS 256

static char dir[256];

/* Rank 0 makes a 4-layer model and 9 pages in a fresh directory; everyone
 * learns its name. */
static void make_inputs(void)
{
    const mkpages_opts po = {.count = 9, .embed_rows = 6, .prompt_tokens = 3, .max_new = 14, .seed = 4, .mixed = true};
    pd_mpi_make_inputs(dir, sizeof dir, "drain", 4, 17, &po);
}

/* What every rank saw at its drain points. */
typedef struct drain_log {
    uint64_t seed;
    int n;
    run_drain seen[MAX_DRAINS];
    int agreed;    /* every drain's (step, action, number) equal on all ranks */
    int sizes_ok;  /* d->rank / d->size are this process's */
} drain_log;

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint32_t want(void *ctx, uint64_t step)
{
    drain_log *l = ctx;
    uint64_t h = mix(l->seed ^ (step * 0x9E3779B97F4A7C15ull));
    return h % 4 == 0 ? (uint32_t)(1 + h % 7) : 0; /* about every 4th step, action 1..7 */
}

static pd_status at_drain(void *ctx, const run_drain *d, pd_err *err)
{
    drain_log *l = ctx;
    int rank, size;
    MPI_Comm_rank(d->comm, &rank);
    MPI_Comm_size(d->comm, &size);
    if (rank != d->rank || size != d->size)
        l->sizes_ok = 0;
    /* every rank is here together: a collective must complete, and every
     * rank must see the same drain */
    long mine[3] = {(long)d->step, (long)d->action, (long)d->number}, lo[3], hi[3];
    MPI_Allreduce(mine, lo, 3, MPI_LONG, MPI_MIN, d->comm);
    MPI_Allreduce(mine, hi, 3, MPI_LONG, MPI_MAX, d->comm);
    if (memcmp(lo, hi, sizeof lo) != 0)
        l->agreed = 0;
    if (l->n < MAX_DRAINS)
        l->seen[l->n] = *d;
    l->n++;
    (void)err;
    return PD_OK;
}

static char *slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *b = malloc(1 << 20);
    *n = fread(b, 1, (1 << 20) - 1, f);
    b[*n] = 0;
    fclose(f);
    return b;
}

static int run_once(const char *out, uint32_t batch, const run_hooks *hooks)
{
    run_opts o;
    run_opts_default(&o);
    char mpath[300], pages[300];
    snprintf(mpath, sizeof mpath, "%s/m.gguf", dir);
    snprintf(pages, sizeof pages, "%s/pages/pages.jsonl", dir);
    o.model_path = mpath;
    o.pages_path = pages;
    o.out_path = out;
    o.batch = batch;
    o.digest = true;
    o.no_bind = true;
    return run_main(&o, MPI_COMM_WORLD, hooks);
}

START_TEST(drain_at_random_steps_resumes_with_identical_output)
{
    make_inputs();
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char ref[300];
    snprintf(ref, sizeof ref, "%s/ref.jsonl", dir);
    int rc_ref = run_once(ref, 3, NULL);
    int all_ok = 1, drained_total = 0;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        drain_log *l = calloc(1, sizeof *l);
        l->seed = seed;
        l->agreed = l->sizes_ok = 1;
        run_hooks hk = {.want_drain = want, .at_drain = at_drain, .ctx = l};
        char out[300];
        snprintf(out, sizeof out, "%s/drain%llu.jsonl", dir, (unsigned long long)seed);
        int rc = run_once(out, (uint32_t)(2 + seed), &hk);
        /* every rank held the same number of drain points */
        int n_lo, n_hi;
        MPI_Allreduce(&l->n, &n_lo, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
        MPI_Allreduce(&l->n, &n_hi, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
        int ok = rc == RUN_EXIT_OK && l->agreed && l->sizes_ok && n_lo == n_hi && l->n > 0;
        /* numbers count up, steps never go back, actions are the head's */
        for (int i = 0; i < l->n && i < MAX_DRAINS; i++) {
            ok = ok && l->seen[i].number == (uint32_t)i && l->seen[i].action >= 1 && l->seen[i].action <= 7;
            ok = ok && (i == 0 || l->seen[i].step >= l->seen[i - 1].step);
        }
        if (rank == 0) {
            size_t na = 0, nb = 0;
            char *a = slurp(ref, &na), *b = slurp(out, &nb);
            int same = a && b && na == nb && na > 0 && memcmp(a, b, na) == 0 && strstr(a, "\"digest\"") != NULL;
            if (!same)
                fprintf(stderr, "test_drain: %s differs from %s\n", out, ref);
            ok = ok && same;
            free(a);
            free(b);
        }
        drained_total += l->n;
        all_ok = all_ok && ok;
        free(l);
    }
    int all;
    MPI_Allreduce(&all_ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    pd_mpi_remove_inputs(dir, "drain", all && rc_ref == RUN_EXIT_OK);
    ck_assert_int_eq(rc_ref, RUN_EXIT_OK);
    ck_assert_msg(all, "rank %d of %d: drains disagreed, failed, or changed the output", rank, size);
    if (rank == 0)
        printf("test_drain: %d ranks, %d drain points held in 3 runs\n", size, drained_total);
    ck_assert_int_gt(drained_total, 3);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("drain");
    TCase *tc = tcase_create("mpi");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, drain_at_random_steps_resumes_with_identical_output);
    suite_add_tcase(s, tc);
    return s;
}
