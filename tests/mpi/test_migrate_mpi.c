/* Live layer migration across real ranks, through run.h: random contiguous
 * maps at random steps (a seeded schedule, the same on every rank) move
 * layers with every stream's cache while decoding goes on; out.jsonl,
 * digests included, stays byte-identical to a one-map run and the run ends
 * on the last map (--stats "layers"). With a corrupted bundle every
 * migration is refused and the run ends on its first map, again with the
 * same bytes. Verdicts are combined with MPI_Allreduce; rank 0 reports.
 * PD_MPI_RANKS: 2 3 4 */
#include "pd_test.h"
#include "fixture.h"

#include "cluster/runtime/ops/migrate.h"
#include "cluster/runtime/job/run.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define N_LAYERS 8
#define N_MOVES 4

static char dir[256];

static void make_inputs(void)
{
    const mkpages_opts po = {.count = 8, .embed_rows = 6, .prompt_tokens = 3, .max_new = 24, .seed = 5, .mixed = true};
    pd_mpi_make_inputs(dir, sizeof dir, "migrate", N_LAYERS, 23, &po);
}

static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A random contiguous map of N_LAYERS over n stages, as text. */
static void random_map(uint64_t *h, int n, char *out, size_t cap)
{
    uint32_t cut[16], k = 0, left = N_LAYERS, first = 0;
    for (int s = 0; s < n; s++) {
        *h = mix(*h + 1);
        uint32_t room = left - (uint32_t)(n - s - 1); /* leave one layer per later stage */
        cut[k++] = s == n - 1 ? left : 1 + (uint32_t)(*h % room);
        left -= cut[k - 1];
    }
    size_t w = 0;
    for (int s = 0; s < n; s++) {
        w += (size_t)snprintf(out + w, cap - w, "%s%u-%u", s ? "," : "", first, first + cut[s] - 1);
        first += cut[s];
    }
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

/* Runs the job; at[] are "STEP:MAP" (n_at of them), layers the first map
 * (NULL = balanced). */
static int run_once(const char *out, const char *stats, const char *layers, char at[][64], uint32_t n_at, int fault)
{
    run_opts o;
    run_opts_default(&o);
    char mpath[300], ppath[300];
    snprintf(mpath, sizeof mpath, "%s/m.gguf", dir);
    snprintf(ppath, sizeof ppath, "%s/pages/pages.jsonl", dir);
    o.model_path = mpath;
    o.pages_path = ppath;
    o.out_path = out;
    o.stats_path = stats;
    o.layers = layers;
    o.batch = 3;
    o.digest = true;
    o.no_bind = true;
    for (uint32_t i = 0; i < n_at; i++)
        o.migrate_at[o.n_migrate_at++] = at[i];
    o.migrate_fault = fault;
    return run_main(&o, MPI_COMM_WORLD, NULL);
}

/* rank 0: out equals ref byte for byte (with digests) and stats says map */
static int check(const char *ref, const char *out, const char *stats, const char *map)
{
    size_t na = 0, nb = 0, ns = 0;
    char *a = slurp(ref, &na), *b = slurp(out, &nb), *s = slurp(stats, &ns);
    char want[200];
    snprintf(want, sizeof want, "\"layers\":\t\"%s\"", map);
    int same = a && b && na == nb && na > 0 && memcmp(a, b, na) == 0 && strstr(a, "\"digest\"") != NULL;
    int mapped = s && strstr(s, want) != NULL;
    if (!same)
        fprintf(stderr, "test_migrate: %s differs from %s\n", out, ref);
    if (!mapped)
        fprintf(stderr, "test_migrate: %s does not end on map %s\n", stats, map);
    free(a);
    free(b);
    free(s);
    return same && mapped;
}

START_TEST(migrations_at_random_steps_keep_the_output)
{
    make_inputs();
    int me, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    char ref[300], out[300], stats[300];
    snprintf(ref, sizeof ref, "%s/ref.jsonl", dir);
    int rc_ref = run_once(ref, NULL, NULL, NULL, 0, 0);
    int all_ok = rc_ref == RUN_EXIT_OK;
    for (uint64_t seed = 1; seed <= 3; seed++) {
        uint64_t h = mix(seed * 1000 + (uint64_t)size);
        char first[64], at[N_MOVES][64], last[64];
        random_map(&h, size, first, sizeof first);
        uint64_t step = 0;
        for (int i = 0; i < N_MOVES; i++) {
            h = mix(h);
            step += 1 + h % 8;
            char m[48];
            random_map(&h, size, m, sizeof m);
            snprintf(at[i], sizeof at[i], "%llu:%s", (unsigned long long)step, m);
        }
        snprintf(out, sizeof out, "%s/mig%llu.jsonl", dir, (unsigned long long)seed);
        snprintf(stats, sizeof stats, "%s/mig%llu.stats", dir, (unsigned long long)seed);
        int rc = run_once(out, stats, first, at, N_MOVES, 0);
        /* the last map the schedule asks for that differs from the one
         * before it is the one in force at the end (a map equal to the
         * current one is refused, changing nothing) */
        snprintf(last, sizeof last, "%s", strchr(at[N_MOVES - 1], ':') + 1);
        int ok = rc == RUN_EXIT_OK;
        if (me == 0)
            ok = ok && check(ref, out, stats, last);
        all_ok = all_ok && ok;
    }
    /* a corrupted bundle: every migration refused, the first map stays */
    char at[1][64];
    char first[64];
    uint64_t h = mix(77 + (uint64_t)size);
    random_map(&h, size, first, sizeof first);
    char other[48];
    do
        random_map(&h, size, other, sizeof other);
    while (strcmp(other, first) == 0);
    snprintf(at[0], sizeof at[0], "3:%s", other);
    snprintf(out, sizeof out, "%s/fault.jsonl", dir);
    snprintf(stats, sizeof stats, "%s/fault.stats", dir);
    int rc = run_once(out, stats, first, at, 1, MIGRATE_FAULT_CORRUPT);
    int ok = rc == RUN_EXIT_OK;
    if (me == 0)
        ok = ok && check(ref, out, stats, first);
    all_ok = all_ok && ok;
    int all;
    MPI_Allreduce(&all_ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    pd_mpi_remove_inputs(dir, "migrate", all);
    ck_assert_msg(all, "rank %d of %d: a migrating run failed, changed the output or ended on another map", me,
                  size);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("migrate_mpi");
    TCase *tc = tcase_create("mpi");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, migrations_at_random_steps_keep_the_output);
    suite_add_tcase(s, tc);
    return s;
}
