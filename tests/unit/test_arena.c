/* arena: bound memory verified on this machine's node 0, the unbound
 * fallback on synthetic topologies, exact accounting, and a pd_alloc client
 * that allocates and frees many sizes without losing or overlapping bytes. */
#include "pd_test.h"

#include "cache/arena.h"

#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>

static numa_topo *this_machine(void)
{
    numa_topo *t = NULL;
    pd_err err = {0};
    ck_assert_msg(numa_topo_load(&t, &err) == PD_OK, "%s", err.msg);
    return t;
}

static numa_topo *synth(const char *desc)
{
    numa_topo *t = NULL;
    pd_err err = {0};
    ck_assert_msg(numa_topo_synthetic(desc, &t, &err) == PD_OK, "%s", err.msg);
    return t;
}

static arena *make(numa_topo *t, unsigned node, unsigned flags)
{
    arena *a = NULL;
    pd_err err = {0};
    ck_assert_msg(arena_new(t, node, flags, &a, &err) == PD_OK, "%s", err.msg);
    ck_assert_ptr_nonnull(a);
    arena_check(a);
    return a;
}

static arena_stats stats(arena *a)
{
    arena_stats s;
    arena_stats_get(a, &s);
    return s;
}

START_TEST(arena_on_this_machine_places_and_verifies_node_0)
{
    numa_topo *t = this_machine();
    arena *a = make(t, 0, 0);
    ck_assert_msg(arena_is_bound(a), "%s", arena_placement(a));
    ck_assert_str_eq(arena_placement(a), "bound to numa node 0 (os 0)");
    ck_assert_uint_eq(arena_node(a), 0);

    arena_verdict v;
    pd_err err = {0};
    ck_assert_int_eq(arena_verify(a, &v, &err), PD_OK);
    ck_assert(v.verified); /* nothing placed yet: vacuously on the node */
    ck_assert_uint_eq(v.bytes_checked, 0);

    const pd_alloc *al = arena_alloc_iface(a);
    size_t big = (size_t)5 << 20; /* spans more than two 2 MiB query spans */
    unsigned char *p = pd_alloc_bytes(al, big);
    unsigned char *q = pd_alloc_bytes(al, 300);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(q);
    memset(p, 0xab, big);
    memset(q, 0xcd, 300);
    arena_check(a);

    ck_assert_msg(arena_verify(a, &v, &err) == PD_OK, "%s", err.msg);
    arena_stats s = stats(a);
    ck_assert_msg(v.verified, "%s", v.reason);
    ck_assert_str_eq(v.reason, "");
    ck_assert_uint_eq(s.bytes_placed, big + ARENA_CHUNK_BYTES);
    ck_assert_uint_eq(v.bytes_checked, s.bytes_placed);
    ck_assert_uint_eq(v.bytes_on_node, s.bytes_placed);
    ck_assert_uint_eq(v.bytes_wrong, 0);
    ck_assert_uint_eq(v.bytes_unknown, 0);
    ck_assert_uint_eq(s.bytes_verified, s.bytes_placed);

    /* the rank's report line, as the runtime will print it */
    numa_choice c;
    ck_assert_int_eq(numa_select(t, NULL, 0, 1, &c, &err), PD_OK);
    numa_report_info info = {.rank = 0, .host = "here", .bytes_placed = s.bytes_placed,
                             .verified = v.verified, .placement = arena_placement(a)};
    char line[NUMA_REPORT_CHARS];
    ck_assert_int_eq(numa_report_line(&c, &info, line, sizeof line, &err), PD_OK);
    ck_assert_ptr_nonnull(strstr(line, "numa node 0 (os 0)"));
    ck_assert_ptr_nonnull(strstr(line, "6291456 bytes placed (bound to numa node 0 (os 0)), verified yes"));

    pd_free_bytes(al, p, big);
    pd_free_bytes(al, q, 300);
    arena_check(a);
    arena_free(a);
    numa_topo_free(t);
}
END_TEST

START_TEST(arena_unbound_flag_on_this_machine_is_reported_and_not_verified)
{
    numa_topo *t = this_machine();
    arena *a = make(t, 0, ARENA_UNBOUND);
    ck_assert(!arena_is_bound(a));
    ck_assert_str_eq(arena_placement(a), "unbound (requested)");
    const pd_alloc *al = arena_alloc_iface(a);
    void *p = pd_alloc_bytes(al, 100000);
    ck_assert_ptr_nonnull(p);
    memset(p, 1, 100000);
    arena_verdict v;
    pd_err err = {0};
    ck_assert_int_eq(arena_verify(a, &v, &err), PD_OK);
    ck_assert(!v.verified); /* where it lands is luck, not placement */
    ck_assert_uint_eq(v.bytes_checked, ARENA_SLAB_BYTES); /* a medium block: its slab is placed */
    ck_assert_uint_eq(v.bytes_on_node + v.bytes_wrong + v.bytes_unknown, v.bytes_checked);
    ck_assert_ptr_nonnull(strstr(v.reason, "unbound (requested)"));
    pd_free_bytes(al, p, 100000);
    arena_free(a);
    numa_topo_free(t);
}
END_TEST

START_TEST(arena_on_a_synthetic_topology_falls_back_to_aligned_unbound_memory)
{
    numa_topo *t = synth("pack:2 numa:2 core:4 pu:1");
    arena *a = make(t, 3, 0);
    ck_assert(!arena_is_bound(a));
    ck_assert_str_eq(arena_placement(a), "unbound (synthetic or XML topology)");
    ck_assert_uint_eq(arena_node(a), 3);
    const pd_alloc *al = arena_alloc_iface(a);
    size_t sizes[] = {1, 63, 64, 65, 4000, 16384, 16385, 70000, 1 << 20};
    void *ps[sizeof sizes / sizeof sizes[0]];
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        ps[i] = pd_alloc_bytes(al, sizes[i]);
        ck_assert_ptr_nonnull(ps[i]);
        ck_assert_uint_eq((uintptr_t)ps[i] % 64, 0);
        memset(ps[i], (int)i + 1, sizes[i]);
    }
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        const unsigned char *b = ps[i];
        ck_assert_uint_eq(b[0], i + 1);
        ck_assert_uint_eq(b[sizes[i] - 1], i + 1);
    }
    arena_check(a);
    arena_verdict v;
    pd_err err = {0};
    ck_assert_int_eq(arena_verify(a, &v, &err), PD_OK);
    ck_assert(!v.verified);
    ck_assert_uint_eq(v.bytes_checked, 0);
    ck_assert_ptr_nonnull(strstr(v.reason, "unbound (synthetic or XML topology)"));
    ck_assert_uint_eq(stats(a).bytes_verified, 0);

    numa_choice c;
    ck_assert_int_eq(numa_select(t, NULL, 7, 8, &c, &err), PD_OK);
    numa_report_info info = {.rank = 7, .host = "h", .bytes_placed = stats(a).bytes_placed,
                             .verified = v.verified, .placement = arena_placement(a)};
    char json[NUMA_REPORT_CHARS];
    ck_assert_int_eq(numa_report_json(&c, &info, json, sizeof json, &err), PD_OK);
    ck_assert_ptr_nonnull(strstr(json, "\"verified\":false,\"placement\":\"unbound (synthetic or XML topology)\""));

    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        pd_free_bytes(al, ps[i], sizes[i]);
    ck_assert_uint_eq(stats(a).blocks, 0);
    arena_free(a);
    numa_topo_free(t);
}
END_TEST

START_TEST(arena_rejects_a_node_out_of_range_and_unknown_flags)
{
    numa_topo *t = synth("pack:2 numa:2 core:4 pu:1");
    arena *a = (arena *)&a; /* sentinel */
    arena *const before = a;
    pd_err err = {0};
    ck_assert_int_eq(arena_new(t, 4, 0, &a, &err), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(err.msg, "node 4"));
    ck_assert_ptr_eq(a, before);
    pd_err_clear(&err);
    ck_assert_int_eq(arena_new(t, 0, 0x80, &a, &err), PD_ERR_ARG);
    ck_assert_ptr_eq(a, before);
    pd_err_clear(&err);
    ck_assert_int_eq(arena_new(NULL, 0, 0, &a, &err), PD_ERR_ARG);
    ck_assert_ptr_eq(a, before);
    arena_free(NULL);
    numa_topo_free(t);
}
END_TEST

/* Accounting is the same bound or not; run it on both kinds of arena. */
static void stats_are_exact(numa_topo *t, unsigned flags)
{
    arena *a = make(t, 0, flags);
    const pd_alloc *al = arena_alloc_iface(a);
    const size_t C = ARENA_CHUNK_BYTES;

    void *s100 = pd_alloc_bytes(al, 100); /* class 128, first chunk */
    arena_stats s = stats(a);
    ck_assert_uint_eq(s.blocks, 1);
    ck_assert_uint_eq(s.bytes_live, 100);
    ck_assert_uint_eq(s.bytes_placed, C);
    ck_assert_uint_eq(s.regions, 1);

    void *l20k = pd_alloc_bytes(al, 20000); /* large, rounded to 20480 */
    void *s16k = pd_alloc_bytes(al, 16384); /* largest small class */
    arena_check(a);
    s = stats(a);
    ck_assert_uint_eq(s.blocks, 3);
    ck_assert_uint_eq(s.bytes_live, 100 + 20000 + 16384);
    ck_assert_uint_eq(s.bytes_placed, C + 20480);
    ck_assert_uint_eq(s.regions, 2);

    pd_free_bytes(al, l20k, 20000); /* large blocks go back at once */
    arena_check(a);
    s = stats(a);
    ck_assert_uint_eq(s.bytes_placed, C);
    ck_assert_uint_eq(s.regions, 1);
    ck_assert_uint_eq(s.peak_placed, C + 20480);
    ck_assert_uint_eq(s.peak_live, 100 + 20000 + 16384);
    ck_assert_uint_eq(s.bytes_live, 100 + 16384);

    /* 128 + 16384 bytes of the chunk are used: 62 more 16 KiB blocks fit,
     * the 63rd opens a second chunk. */
    void *fill[63];
    for (int i = 0; i < 62; i++)
        fill[i] = pd_alloc_bytes(al, 16384);
    ck_assert_uint_eq(stats(a).bytes_placed, C);
    fill[62] = pd_alloc_bytes(al, 16384);
    arena_check(a);
    s = stats(a);
    ck_assert_uint_eq(s.bytes_placed, 2 * C);
    ck_assert_uint_eq(s.regions, 2);
    ck_assert_uint_eq(s.blocks, 2 + 63);

    /* The first chunk's 16256-byte remainder became free blocks of 8192,
     * 4096, ..., 128: these sizes are served without a new chunk, and the
     * second chunk's remainder still serves the rest. */
    size_t tail[] = {8192, 4096, 2048, 1024, 512, 256, 128};
    void *tp[7];
    for (int i = 0; i < 7; i++) {
        tp[i] = pd_alloc_bytes(al, tail[i]);
        ck_assert_ptr_nonnull(tp[i]);
        /* s100 was the first block of the first chunk */
        uintptr_t off = (uintptr_t)tp[i] - (uintptr_t)s100;
        ck_assert_msg(off < C, "%zu-byte block not from the first chunk's remainder", tail[i]);
    }
    arena_check(a);
    ck_assert_uint_eq(stats(a).bytes_placed, 2 * C);

    for (int i = 0; i < 7; i++)
        pd_free_bytes(al, tp[i], tail[i]);
    for (int i = 0; i < 63; i++)
        pd_free_bytes(al, fill[i], 16384);
    pd_free_bytes(al, s100, 100);
    pd_free_bytes(al, s16k, 16384);
    arena_check(a);
    s = stats(a);
    ck_assert_uint_eq(s.blocks, 0);
    ck_assert_uint_eq(s.bytes_live, 0);
    ck_assert_uint_eq(s.bytes_placed, 2 * C); /* chunks are kept until arena_free */
    ck_assert_uint_eq(s.peak_placed, 2 * C);
    ck_assert_uint_eq(s.alloc_failures, 0);

    /* freed blocks are reused: no growth for the same pattern again */
    void *again = pd_alloc_bytes(al, 16384);
    ck_assert_ptr_nonnull(again);
    ck_assert_uint_eq(stats(a).bytes_placed, 2 * C);
    pd_free_bytes(al, again, 16384);
    arena_free(a);
}

START_TEST(arena_stats_are_exact_bound_and_unbound)
{
    numa_topo *real = this_machine(), *fake = synth("numa:2 core:2 pu:1");
    stats_are_exact(real, 0);
    stats_are_exact(fake, 0);
    numa_topo_free(fake);
    numa_topo_free(real);
}
END_TEST

START_TEST(arena_refuses_zero_and_impossible_sizes)
{
    numa_topo *t = synth("numa:1 core:1 pu:1");
    arena *a = make(t, 0, 0);
    const pd_alloc *al = arena_alloc_iface(a);
    ck_assert_ptr_null(pd_alloc_bytes(al, 0));
    ck_assert_ptr_null(al->alloc(al->ctx, 0));
    ck_assert_uint_eq(stats(a).alloc_failures, 0);
    ck_assert_ptr_null(al->alloc(al->ctx, SIZE_MAX));
    ck_assert_ptr_null(al->alloc(al->ctx, SIZE_MAX - 100));
    arena_stats s = stats(a);
    ck_assert_uint_eq(s.alloc_failures, 2);
    ck_assert_uint_eq(s.blocks, 0);
    ck_assert_uint_eq(s.bytes_placed, 0);
    pd_free_bytes(al, NULL, 100); /* no-op */
    arena_check(a);
    arena_free(a);
    numa_topo_free(t);
}
END_TEST

/* A client of the pd_alloc interface: many sizes, interleaved frees, each
 * block filled with its own byte pattern and checked before it is freed (an
 * overlap between live blocks would corrupt one). */
static void client_churn(const pd_alloc *al, uint64_t seed, int rounds)
{
    enum { SLOTS = 64 };
    unsigned char *p[SLOTS] = {0};
    size_t n[SLOTS] = {0};
    pd_rng rng = {.s = seed};
    for (int i = 0; i < rounds; i++) {
        unsigned k = pd_rng_below(&rng, SLOTS);
        if (p[k]) {
            unsigned char tag = (unsigned char)(k * 37 + n[k]);
            for (size_t j = 0; j < n[k]; j += 1 + n[k] / 97)
                ck_assert_uint_eq(p[k][j], tag);
            ck_assert_uint_eq(p[k][n[k] - 1], tag);
            pd_free_bytes(al, p[k], n[k]);
            p[k] = NULL;
            continue;
        }
        /* mostly small, some just over the small limit, a few large */
        unsigned pick = pd_rng_below(&rng, 16);
        size_t sz = pick < 11   ? 1 + pd_rng_below(&rng, 2048)
                    : pick < 14 ? 1 + pd_rng_below(&rng, ARENA_SMALL_MAX + 4096)
                                : 1 + pd_rng_below(&rng, 300000);
        p[k] = pd_alloc_bytes(al, sz);
        ck_assert_ptr_nonnull(p[k]);
        ck_assert_uint_eq((uintptr_t)p[k] % ARENA_ALIGN, 0);
        n[k] = sz;
        memset(p[k], (unsigned char)(k * 37 + sz), sz);
    }
    for (unsigned k = 0; k < SLOTS; k++)
        pd_free_bytes(al, p[k], n[k]);
}

START_TEST(arena_serves_a_pd_alloc_client_of_many_sizes_without_leaks)
{
    numa_topo *real = this_machine(), *fake = synth("numa:2 core:2 pu:1");
    numa_topo *topos[] = {real, fake};
    for (int i = 0; i < 2; i++) {
        arena *a = make(topos[i], i, 0);
        client_churn(arena_alloc_iface(a), 42 + (uint64_t)i, 3000);
        arena_check(a);
        arena_stats s = stats(a);
        ck_assert_uint_eq(s.blocks, 0);
        ck_assert_uint_eq(s.bytes_live, 0);
        ck_assert_uint_gt(s.peak_live, 0);
        /* only chunks remain; every large region went back */
        ck_assert_uint_eq(s.bytes_placed % ARENA_CHUNK_BYTES, 0);
        ck_assert_uint_eq(s.regions, s.bytes_placed / ARENA_CHUNK_BYTES);
        arena_free(a);
    }
    numa_topo_free(fake);
    numa_topo_free(real);
}
END_TEST

typedef struct churn_job {
    const pd_alloc *al;
    uint64_t seed;
} churn_job;

static void *churn_thread(void *arg)
{
    churn_job *j = arg;
    client_churn(j->al, j->seed, 1500);
    return NULL;
}

START_TEST(arena_allocates_from_several_threads_at_once)
{
    numa_topo *t = this_machine();
    arena *a = make(t, 0, 0);
    churn_job jobs[3];
    pthread_t th[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (churn_job){.al = arena_alloc_iface(a), .seed = 100 + (uint64_t)i};
        ck_assert_int_eq(pthread_create(&th[i], NULL, churn_thread, &jobs[i]), 0);
    }
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(pthread_join(th[i], NULL), 0);
    arena_check(a);
    arena_stats s = stats(a);
    ck_assert_uint_eq(s.blocks, 0);
    ck_assert_uint_eq(s.bytes_live, 0);
    arena_verdict v;
    pd_err err = {0};
    ck_assert_int_eq(arena_verify(a, &v, &err), PD_OK);
    ck_assert_msg(v.verified, "%s", v.reason);
    ck_assert_uint_eq(v.bytes_on_node, s.bytes_placed);
    arena_free(a);
    numa_topo_free(t);
}
END_TEST

/* With a retain budget a freed large region is kept placed and handed out
 * again for the same or a slightly smaller size; beyond the budget the oldest
 * goes back; lowering the budget returns the rest. Bound and unbound. */
static void retains_within_budget(numa_topo *t, unsigned flags)
{
    arena *a = make(t, 0, flags);
    const pd_alloc *al = arena_alloc_iface(a);
    arena_set_retain(a, 100000);
    unsigned char *x = pd_alloc_bytes(al, 40000); /* region 40960 */
    ck_assert_ptr_nonnull(x);
    memset(x, 7, 40000);
    pd_free_bytes(al, x, 40000);
    arena_check(a);
    arena_stats s = stats(a);
    ck_assert_uint_eq(s.blocks, 0);
    ck_assert_uint_eq(s.bytes_live, 0);
    ck_assert_uint_eq(s.bytes_retained, 40960);
    ck_assert_uint_eq(s.bytes_placed, 40960);
    ck_assert_uint_eq(s.regions, 1);

    /* same size, and a quarter smaller: the kept region comes back */
    unsigned char *y = pd_alloc_bytes(al, 40960);
    ck_assert_ptr_eq(y, x);
    ck_assert_uint_eq(stats(a).bytes_retained, 0);
    pd_free_bytes(al, y, 40960);
    unsigned char *z = pd_alloc_bytes(al, 32768 + 1); /* rounds to 36864: 4096 short of 40960 */
    ck_assert_ptr_eq(z, x);
    ck_assert_uint_eq(stats(a).bytes_live, 32769);
    ck_assert_uint_eq(stats(a).bytes_placed, 40960);
    arena_check(a);
    pd_free_bytes(al, z, 32769);
    /* much smaller, or larger: a new region; the kept one stays kept */
    unsigned char *small = pd_alloc_bytes(al, 20000);
    unsigned char *big = pd_alloc_bytes(al, 50000);
    ck_assert_ptr_ne(small, x);
    ck_assert_ptr_ne(big, x);
    s = stats(a);
    ck_assert_uint_eq(s.bytes_retained, 40960);
    ck_assert_uint_eq(s.bytes_placed, 40960 + 20480 + 53248);
    ck_assert_uint_eq(s.regions, 3);
    arena_check(a);

    /* over budget: the oldest kept region (x) goes back to the system */
    pd_free_bytes(al, small, 20000);
    pd_free_bytes(al, big, 50000);
    s = stats(a);
    ck_assert_uint_eq(s.bytes_retained, 20480 + 53248);
    ck_assert_uint_eq(s.bytes_placed, 20480 + 53248);
    arena_check(a);
    /* kept regions are placed memory: verify counts them */
    arena_verdict v;
    pd_err err = {0};
    ck_assert_int_eq(arena_verify(a, &v, &err), PD_OK);
    if (arena_is_bound(a)) {
        ck_assert(v.verified);
        ck_assert_uint_eq(v.bytes_checked, 20480 + 53248);
    }
    /* a block larger than the whole budget is never kept */
    unsigned char *huge = pd_alloc_bytes(al, 200000);
    ck_assert_ptr_nonnull(huge);
    pd_free_bytes(al, huge, 200000);
    ck_assert_uint_eq(stats(a).bytes_placed, 20480 + 53248);
    /* a budget of 0 returns everything */
    arena_set_retain(a, 0);
    s = stats(a);
    ck_assert_uint_eq(s.bytes_retained, 0);
    ck_assert_uint_eq(s.bytes_placed, 0);
    ck_assert_uint_eq(s.regions, 0);
    arena_check(a);
    arena_free(a);
}

/* Medium blocks (ARENA_MEDIUM_MIN, ARENA_MEDIUM_MAX] share slabs that start
 * on a huge-page boundary (so a KV block of a few hundred KiB sits on huge
 * pages); a freed block is reused by the next request of its rounded size;
 * an emptied slab starts over, and goes back to the system unless the retain
 * budget keeps it. */
static void medium_blocks_share_slabs(numa_topo *t, unsigned flags)
{
    arena *a = make(t, 0, flags);
    const pd_alloc *al = arena_alloc_iface(a);
    enum { N = 40 };
    size_t sz[N];
    unsigned char *p[N];
    size_t rounded = 0;
    for (int i = 0; i < N; i++) {
        sz[i] = ARENA_MEDIUM_MIN + 1 + (size_t)i * 40000; /* up to ~1.6 MiB */
        p[i] = pd_alloc_bytes(al, sz[i]);
        ck_assert_ptr_nonnull(p[i]);
        memset(p[i], i + 1, sz[i]);
        rounded += (sz[i] + ARENA_LARGE_ROUND - 1) / ARENA_LARGE_ROUND * ARENA_LARGE_ROUND;
    }
    arena_check(a);
    arena_stats s = stats(a);
    size_t slabs = (rounded + ARENA_SLAB_BYTES - 1) / ARENA_SLAB_BYTES;
    ck_assert_uint_ge(s.regions, slabs); /* a block never straddles two slabs */
    ck_assert_uint_le(s.regions, slabs + 1);
    ck_assert_uint_eq(s.bytes_placed, s.regions * ARENA_SLAB_BYTES);
    ck_assert_uint_eq(s.bytes_retained, 0);
    /* the first block of the first slab starts on a huge page */
    ck_assert_uint_eq((uintptr_t)p[0] % ARENA_HUGE_PAGE, 0);
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N; j++)
            ck_assert(p[i] + sz[i] <= p[j] || p[j] + sz[j] <= p[i]);
    /* a freed block is reused whole by its size; the others are unharmed */
    unsigned char *old = p[7];
    pd_free_bytes(al, p[7], sz[7]);
    arena_check(a);
    p[7] = pd_alloc_bytes(al, sz[7]);
    ck_assert_ptr_eq(p[7], old);
    memset(p[7], 8, sz[7]);
    ck_assert_uint_eq(stats(a).bytes_placed, s.bytes_placed);
    for (int i = 0; i < N; i++)
        ck_assert_uint_eq(p[i][sz[i] - 1], (unsigned char)(i + 1));
    /* freeing everything returns the slabs (no retain budget) */
    for (int i = 0; i < N; i++)
        pd_free_bytes(al, p[i], sz[i]);
    arena_check(a);
    s = stats(a);
    ck_assert_uint_eq(s.bytes_placed, 0);
    ck_assert_uint_eq(s.regions, 0);
    ck_assert_uint_eq(s.blocks, 0);
    /* with a budget an emptied slab is kept, counted as retained, and reused */
    arena_set_retain(a, ARENA_SLAB_BYTES);
    unsigned char *q = pd_alloc_bytes(al, 300000);
    ck_assert_ptr_nonnull(q);
    pd_free_bytes(al, q, 300000);
    arena_check(a);
    s = stats(a);
    ck_assert_uint_eq(s.bytes_placed, ARENA_SLAB_BYTES);
    ck_assert_uint_eq(s.bytes_retained, ARENA_SLAB_BYTES);
    unsigned char *r = pd_alloc_bytes(al, 500000);
    ck_assert_ptr_eq(r, q); /* the empty slab started over */
    ck_assert_uint_eq(stats(a).bytes_retained, 0);
    ck_assert_uint_eq(stats(a).bytes_placed, ARENA_SLAB_BYTES);
    pd_free_bytes(al, r, 500000);
    /* lowering the budget returns it */
    arena_set_retain(a, 0);
    arena_check(a);
    ck_assert_uint_eq(stats(a).bytes_placed, 0);
    /* the bounds: ARENA_MEDIUM_MIN is a region of its own, ARENA_MEDIUM_MAX a slab's */
    void *lo = pd_alloc_bytes(al, ARENA_MEDIUM_MIN), *hi = pd_alloc_bytes(al, ARENA_MEDIUM_MAX);
    ck_assert_uint_eq(stats(a).bytes_placed, ARENA_MEDIUM_MIN + ARENA_SLAB_BYTES);
    pd_free_bytes(al, lo, ARENA_MEDIUM_MIN);
    pd_free_bytes(al, hi, ARENA_MEDIUM_MAX);
    arena_check(a);
    ck_assert_uint_eq(stats(a).bytes_placed, 0);
    if (arena_is_bound(a)) {
        void *b = pd_alloc_bytes(al, 200000);
        arena_verdict v;
        pd_err err = {0};
        ck_assert_msg(arena_verify(a, &v, &err) == PD_OK, "%s", err.msg);
        ck_assert_msg(v.verified, "%s", v.reason);
        ck_assert_uint_eq(v.bytes_on_node, ARENA_SLAB_BYTES);
        pd_free_bytes(al, b, 200000);
    }
    arena_free(a);
}

/* Runs check on a bound arena, an unbound one, and one on a synthetic
 * topology (the fallback). */
static void on_every_placement(void (*check)(numa_topo *, unsigned))
{
    numa_topo *real = this_machine(), *fake = synth("numa:2 core:2 pu:1");
    check(real, 0);
    check(real, ARENA_UNBOUND);
    check(fake, 0);
    numa_topo_free(fake);
    numa_topo_free(real);
}

START_TEST(arena_medium_blocks_share_huge_page_aligned_slabs)
{
    on_every_placement(medium_blocks_share_slabs);
}
END_TEST

START_TEST(arena_retains_freed_large_regions_within_its_budget)
{
    on_every_placement(retains_within_budget);
}
END_TEST

START_TEST(arena_churn_with_a_retain_budget_stays_consistent)
{
    numa_topo *t = this_machine();
    arena *a = make(t, 0, 0);
    arena_set_retain(a, (size_t)4 << 20);
    client_churn(arena_alloc_iface(a), 7, 3000);
    arena_check(a);
    arena_stats s = stats(a);
    ck_assert_uint_eq(s.blocks, 0);
    ck_assert_uint_le(s.bytes_retained, (size_t)4 << 20);
    ck_assert_uint_eq(s.bytes_placed % ARENA_CHUNK_BYTES, s.bytes_retained % ARENA_CHUNK_BYTES);
    arena_free(a);
    numa_topo_free(t);
}
END_TEST

/* Allocates two blocks of `bytes` under a retain budget and frees the first
 * twice: the arena must CHECK-abort. */
static void free_twice(size_t bytes, size_t retain)
{
    numa_topo *t = synth("numa:1 core:1 pu:1");
    arena *a = make(t, 0, 0);
    arena_set_retain(a, retain);
    const pd_alloc *al = arena_alloc_iface(a);
    unsigned char *p = pd_alloc_bytes(al, bytes);
    unsigned char *q = pd_alloc_bytes(al, bytes);
    ck_assert_ptr_nonnull(p);
    ck_assert_ptr_nonnull(q);
    pd_free_bytes(al, p, bytes);
    pd_free_bytes(al, p, bytes);
}

START_TEST(arena_aborts_on_freeing_a_retained_block_twice)
{
    free_twice(50000, 1 << 20); /* a large block kept for reuse, not live */
}
END_TEST

START_TEST(arena_aborts_on_freeing_a_medium_block_twice)
{
    free_twice(100000, 0); /* on its slab's free list */
}
END_TEST

START_TEST(arena_aborts_on_freeing_a_large_block_it_does_not_hold)
{
    numa_topo *t = synth("numa:1 core:1 pu:1");
    arena *a = make(t, 0, 0);
    const pd_alloc *al = arena_alloc_iface(a);
    unsigned char *p = pd_alloc_bytes(al, 50000);
    ck_assert_ptr_nonnull(p);
    pd_free_bytes(al, p + 4096, 50000); /* not a block start: CHECK aborts */
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("arena");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, arena_on_this_machine_places_and_verifies_node_0);
    tcase_add_test(tc, arena_unbound_flag_on_this_machine_is_reported_and_not_verified);
    tcase_add_test(tc, arena_on_a_synthetic_topology_falls_back_to_aligned_unbound_memory);
    tcase_add_test(tc, arena_rejects_a_node_out_of_range_and_unknown_flags);
    tcase_add_test(tc, arena_stats_are_exact_bound_and_unbound);
    tcase_add_test(tc, arena_refuses_zero_and_impossible_sizes);
    tcase_add_test(tc, arena_serves_a_pd_alloc_client_of_many_sizes_without_leaks);
    tcase_add_test(tc, arena_allocates_from_several_threads_at_once);
    tcase_add_test(tc, arena_retains_freed_large_regions_within_its_budget);
    tcase_add_test(tc, arena_medium_blocks_share_huge_page_aligned_slabs);
    tcase_add_test(tc, arena_churn_with_a_retain_budget_stays_consistent);
    tcase_add_test_raise_signal(tc, arena_aborts_on_freeing_a_retained_block_twice, SIGABRT);
    tcase_add_test_raise_signal(tc, arena_aborts_on_freeing_a_medium_block_twice, SIGABRT);
    tcase_add_test_raise_signal(tc, arena_aborts_on_freeing_a_large_block_it_does_not_hold,
                                SIGABRT);
    suite_add_tcase(s, tc);
    return s;
}
