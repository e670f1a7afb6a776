/* GEMM benchmark: the invariant kernel against OpenBLAS sgemm on the decoder's
 * shape (K = 1280, N = 3584), one thread, M = 1 .. 256, measured in the same
 * run; plus the bandwidth the M = 1 case achieves against the machine's read
 * bandwidth (probe.h), 16-bit / Q8_0 figures, and each type's M = 1 compute
 * rate with its weights in L2 (m1_hot). Prints one JSON object.
 *
 * Weights are "cold" as in a real stage, whose layers far exceed the last
 * level cache: each call uses the next of several weight copies whose total
 * size exceeds the cache. Every figure is the best of several repetitions,
 * and the two backends alternate repetitions so background load hits both.
 * On a shared machine wall time includes time the thread was preempted, so
 * each figure is also given on the thread's CPU clock (*_cpu); the goals are
 * judged on wall time.
 *
 * Batch-1 decode runs on two threads, so each quantized type's M = 1 is
 * also timed cold on a 2-thread pool against a 2-thread read-bandwidth probe
 * of the same run (m1_two_threads), on the packed bytes and on the bytes the
 * type takes in its GGUF file; since a shared host's bandwidth moves within
 * seconds, also in paired rounds, each batch of calls against the probes
 * right before and after it, the median of the rounds' ratios
 * (file_vs_probe_paired_median, the issue-36 measure; bench_m1_paired);
 * and its M = 64 GFLOP/s against the f32 peak
 * of the same run (the best of the invariant kernel and OpenBLAS at M >= 64,
 * the invariant kernel on the configured threads, OpenBLAS on one), and
 * against its compute limit (m64_vs_compute_limit): that f32 peak, or under
 * PD_BENCH_GEMM=int8 for Q8_0 and the qs types the int8 peak of probe.h
 * (vpdpbusd from registers, 1 thread).
 *
 * PD_BENCH_GEMM=int8 packs the quantized types' and the hot section's
 * weights for the int8 arithmetic (gemm.h) instead of the exact one; the
 * JSON's "quantized_backend" says which. f32 is always the exact kernel.
 *
 * usage: bench_gemm [reps]   (default 7) */
#include "probe.h"

#include "base/cpu.h"
#include "base/fp16.h"
#include "cluster/model/gemm.h"

#include <cblas.h>
#include <stdbool.h>
#include <stdio.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define BK 1280u
#define BN 3584u
#define BMAX 256u
/* Copies of the weights cycled through: at least BCOLD_BYTES of packed
 * weights per type (8 x 18.4 MB in f32, 16 in f16, 30 in Q8_0), well beyond
 * the last-level cache this VM can use. */
#define BCOLD_BYTES ((size_t)144 << 20)
#define BCOPIES_MAX 40

typedef struct bench_set {
    int n;
    int next; /* the copy the next call uses, cycling across batches */
    gemm_w *inv[BCOPIES_MAX];
    gemm_w *blas[BCOPIES_MAX];
} bench_set;

/* PD_BENCH_THREADS=T (T >= 2): the invariant kernel's timed runs use a pool
 * of T threads (the OpenBLAS runs stay on one thread); the JSON's "threads"
 * says which. */
static pool *bench_pool;

/* The backend of the quantized and hot sections (PD_BENCH_GEMM). */
static gemm_backend bench_qbackend = GEMM_BACKEND_INVARIANT;

static void bench_die(const char *what, const pd_err *err)
{
    fprintf(stderr, "bench_gemm: %s: %s\n", what, err ? err->msg : "");
    exit(1);
}

static uint8_t *bench_weights(gemm_wtype type, uint64_t seed)
{
    size_t row = gemm_row_bytes(type, BK);
    uint8_t *w = malloc(row * BN);
    if (!w)
        bench_die("out of memory", NULL);
    uint64_t s = seed;
    if (gemm_wtype_is_qs(type)) {
        /* random integer data, f16 scale fields 0.01 (Q4_1, Q5_1, Q4_K,
         * Q5_K: d and m / dmin at the block start; Q6_K: d at its end) */
        const uint32_t qk = gemm_wtype_block(type), bb = (uint32_t)gemm_row_bytes(type, qk);
        const uint16_t h = pd_f32_to_f16(0.01f);
        for (size_t i = 0; i < row * BN; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            w[i] = (uint8_t)(s >> 56);
        }
        for (size_t b = 0; b < row * BN / bb; b++) {
            uint8_t *blk = w + b * bb;
            if (type == GEMM_W_Q6_K) {
                memcpy(blk + 208, &h, 2);
            } else {
                memcpy(blk, &h, 2);
                if (type != GEMM_W_Q4_0 && type != GEMM_W_Q5_0)
                    memcpy(blk + 2, &h, 2); /* m or dmin */
            }
        }
        return w;
    }
    for (uint32_t j = 0; j < BN; j++) {
        uint8_t *r = w + row * j;
        for (uint32_t k = 0; k < BK; k++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            float v = (float)((int32_t)(s >> 40) - (1 << 23)) * (1.0f / (float)(1 << 23));
            uint16_t h;
            switch (type) {
            case GEMM_W_F32: memcpy(r + 4 * k, &v, 4); break;
            case GEMM_W_F16: h = pd_f32_to_f16(v); memcpy(r + 2 * k, &h, 2); break;
            case GEMM_W_BF16: h = pd_f32_to_bf16(v); memcpy(r + 2 * k, &h, 2); break;
            case GEMM_W_Q8_0:
                if (k % 32 == 0) {
                    h = pd_f32_to_f16(0.01f);
                    memcpy(r + 34 * (k / 32), &h, 2);
                }
                r[34 * (k / 32) + 2 + k % 32] = (uint8_t)(int8_t)(v * 127.0f);
                break;
            default: break;
            }
        }
    }
    return w;
}

/* Packed copies on transparent huge pages, as a stage places its weights
 * (cache/arena.c): the default allocator asks for them only from 4 MiB up,
 * so a 2.6 MB Q4_0 copy would sit on 4 KiB pages that a stage's weights
 * never use. */
#define BENCH_HUGE ((size_t)2 << 20)

static void *bench_huge_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    const size_t rounded = (bytes + BENCH_HUGE - 1) & ~(BENCH_HUGE - 1);
    void *p = aligned_alloc(BENCH_HUGE, rounded);
    if (p)
        (void)madvise(p, rounded, MADV_HUGEPAGE); /* advice: 4 KiB pages still work */
    return p;
}

static void bench_huge_free(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    free(p);
}

static const pd_alloc bench_huge = {.alloc = bench_huge_alloc, .free = bench_huge_free};

static void bench_pack(bench_set *s, gemm_wtype type, int with_blas)
{
    memset(s, 0, sizeof *s);
    size_t one = gemm_row_bytes(type, BK) * BN;
    s->n = (int)((BCOLD_BYTES + one - 1) / one);
    if (s->n > BCOPIES_MAX)
        s->n = BCOPIES_MAX;
    for (int c = 0; c < s->n; c++) {
        uint8_t *w = bench_weights(type, 1234 + (uint64_t)c);
        pd_err err = {0};
        const gemm_backend be = type == GEMM_W_F32 ? GEMM_BACKEND_INVARIANT : bench_qbackend;
        if (gemm_pack(w, type, BN, BK, be, &bench_huge, &s->inv[c], &err) != PD_OK)
            bench_die("pack", &err);
        if (with_blas &&
            gemm_pack(w, type, BN, BK, GEMM_BACKEND_OPENBLAS, NULL, &s->blas[c], &err) != PD_OK)
            bench_die("pack openblas", &err);
        free(w);
    }
}

static void bench_unpack(bench_set *s)
{
    for (int c = 0; c < s->n; c++) {
        gemm_free(s->inv[c]);
        gemm_free(s->blas[c]);
    }
}

static double bench_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct bench_best {
    double wall, cpu; /* seconds per call */
} bench_best;

/* Times a batch of calls cycling the copies; keeps the best per-call time. */
static void bench_time_on(bench_set *s, int blas, const float *a, uint32_t m, float *c, int calls,
                          bench_best *best, pool *p)
{
    gemm_w *const *ws = blas ? s->blas : s->inv;
    double c0 = bench_cpu_now(), t0 = probe_now();
    for (int i = 0; i < calls; i++) {
        gemm_run(ws[s->next], a, m, c, p);
        s->next = (s->next + 1) % s->n;
    }
    double wall = (probe_now() - t0) / calls, cpu = (bench_cpu_now() - c0) / calls;
    if (wall < best->wall)
        best->wall = wall;
    if (cpu < best->cpu)
        best->cpu = cpu;
}

static void bench_time(bench_set *s, int blas, const float *a, uint32_t m, float *c, int calls,
                       bench_best *best)
{
    bench_time_on(s, blas, a, m, c, calls, best, bench_pool);
}

static void bench_nop(void *ctx, uint32_t task, uint32_t thread)
{
    volatile uint32_t *sink = ctx;
    *sink = task + thread;
}

/* Microseconds per pool_run of 8 empty tasks on a 2-thread pool (best batch
 * of 2000 back-to-back runs, workers hot). */
static double bench_pool_dispatch_us(int reps)
{
    pool *p = NULL;
    if (pool_new(2, &p, NULL) != PD_OK)
        return -1.0;
    volatile uint32_t sink = 0;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = probe_now();
        for (int i = 0; i < 2000; i++)
            pool_run(p, 8, bench_nop, (void *)&sink);
        double t = (probe_now() - t0) / 2000;
        best = t < best ? t : best;
    }
    pool_free(p);
    return best * 1e6;
}

/* The M = 1 kernels' compute rate: one thread, one small W (K = BK,
 * N = BHOT_N) run back to back, so its weights stay in the thread's L2 and
 * memory does not bound the call. Bytes of packed weights per second (best
 * batch); a decode step's GEMMs can read no faster than this, whatever the
 * bandwidth. */
#define BHOT_N 128u
#define BHOT_CALLS 2000

static double bench_m1_hot_gbs(gemm_wtype type, const float *a, float *c, int reps, double *wps, double *wps_cpu)
{
    uint8_t *w = bench_weights(type, 99);
    gemm_w *g = NULL;
    pd_err err = {0};
    /* bench_weights makes BN rows; the first BHOT_N are W */
    if (gemm_pack(w, type, BHOT_N, BK, type == GEMM_W_F32 ? GEMM_BACKEND_INVARIANT : bench_qbackend, NULL, &g,
                  &err) != PD_OK)
        bench_die("pack hot", &err);
    free(w);
    for (int i = 0; i < 100; i++)
        gemm_run(g, a, 1, c, NULL);
    double best = 1e30, best_cpu = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = probe_now(), c0 = bench_cpu_now();
        for (int i = 0; i < BHOT_CALLS; i++)
            gemm_run(g, a, 1, c, NULL);
        double t = (probe_now() - t0) / BHOT_CALLS, tc = (bench_cpu_now() - c0) / BHOT_CALLS;
        best = t < best ? t : best;
        best_cpu = tc < best_cpu ? tc : best_cpu;
    }
    double gbs = (double)gemm_bytes(g) / best / 1e9;
    *wps = (double)BHOT_N * BK / best;
    *wps_cpu = (double)BHOT_N * BK / best_cpu; /* on the thread's CPU clock: preemption left out */
    gemm_free(g);
    return gbs;
}

static double bench_load(void)
{
    double l[1] = {-1.0};
    return getloadavg(l, 1) == 1 ? l[0] : -1.0;
}

static int bench_calls(uint32_t m)
{
    return m <= 16 ? 16 : m <= 64 ? 8 : 3;
}

/* The M of every table; 8: decode with 8 streams, or a pipeline micro-batch
 * of a few more. */
static const uint32_t ms[] = {1, 4, 8, 16, 64, 256};

/* The f32 weights against OpenBLAS at every M, and M = 1 against the
 * 1-thread probe; *all_met and *peak (the best GFLOP/s at M >= 64) for the
 * caller. Consumes (frees) the set. */
static void bench_f32(bench_set *set_, const float *a, float *c, int reps, double bw, int *all_met_out,
                      double *peak_out)
{
    bench_set set = *set_;
    printf("  \"f32\": [\n");
    int all_met = 1;
    double m1_inv_s = 0.0, m1_inv_cpu = 0.0, f32_peak = 0.0;
    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
        uint32_t m = ms[mi];
        int calls = bench_calls(m);
        bench_best bi = {1e30, 1e30}, bb = {1e30, 1e30};
        for (int r = 0; r < reps; r++) {
            bench_time(&set, 0, a, m, c, calls, &bi);
            bench_time(&set, 1, a, m, c, calls, &bb);
        }
        if (m == 1) {
            m1_inv_s = bi.wall;
            m1_inv_cpu = bi.cpu;
        }
        double flop = 2.0 * m * BN * BK;
        double gi = flop / bi.wall / 1e9, gb = flop / bb.wall / 1e9;
        double gic = flop / bi.cpu / 1e9, gbc = flop / bb.cpu / 1e9;
        if (m >= 64) {
            f32_peak = gi > f32_peak ? gi : f32_peak;
            f32_peak = gb > f32_peak ? gb : f32_peak;
        }
        double goal = m <= 16 ? 1.0 : 0.85;
        int met = gi / gb >= goal;
        all_met &= met;
        printf("    {\"m\": %u, \"invariant_gflops\": %.2f, \"openblas_gflops\": %.2f, "
               "\"ratio\": %.3f, \"goal\": %.2f, \"goal_met\": %s, "
               "\"invariant_gflops_cpu\": %.2f, \"openblas_gflops_cpu\": %.2f, "
               "\"ratio_cpu\": %.3f}%s\n",
               m, gi, gb, gi / gb, goal, met ? "true" : "false", gic, gbc, gic / gbc,
               mi + 1 < sizeof ms / sizeof ms[0] ? "," : "");
    }
    printf("  ],\n");
    double m1_bytes = (double)gemm_bytes(set.inv[0]) + 4.0 * (BK + BN);
    double m1_bw = m1_bytes / m1_inv_s;
    printf("  \"m1_bandwidth\": {\"invariant_gbs\": %.2f, \"read_bw_gbs\": %.2f, \"ratio\": %.3f, "
           "\"invariant_gbs_cpu\": %.2f},\n",
           m1_bw / 1e9, bw / 1e9, m1_bw / bw, m1_bytes / m1_inv_cpu / 1e9);
    bench_unpack(&set);
    *all_met_out = all_met;
    *peak_out = f32_peak;
}

/* Quartiles of a sample. */
typedef struct bench_quart {
    double p25, median, p75;
} bench_quart;

static int bench_cmp_double(const void *x, const void *y)
{
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static bench_quart bench_quartiles(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return (bench_quart){v[n / 4], v[n / 2], v[3 * n / 4]};
}

/* Paired rounds of M = 1 on two threads: the host's bandwidth moves from
 * second to second when it is shared, and a best-of-few GEMM time against
 * a best-of-few probe minutes apart moved the ratio by up to 0.3 between
 * runs. So each of BENCH_PAIRS rounds is an untimed pass over every copy
 * (below), one timed batch of calls and a short 2-thread probe; round i's
 * ratio is its batch's file bytes per second against the better of the
 * probes right before and after it, and the figure is the median of the
 * rounds (quartiles beside it). *best_s and *best_bw: the best call time
 * and the best probe of all rounds. */
#define BENCH_PAIRS 41

static void bench_m1_paired(bench_set *set, const float *a, float *c, pool *pool2, double file_bytes,
                            double *best_s, double *best_bw, bench_quart *q)
{
    double probe[BENCH_PAIRS + 1], ratio[BENCH_PAIRS];
    bench_best best = {1e30, 1e30};
    probe[0] = probe_read_bw(2, 1);
    *best_bw = probe[0];
    for (int r = 0; r < BENCH_PAIRS; r++) {
        bench_best one = {1e30, 1e30};
        /* one untimed pass over every copy first: the probe evicts the
         * host's page-table entries of the weights along with their lines
         * (this VM's guest pages sit on 4 KiB host pages), and a stage
         * streaming its layers token after token keeps those entries
         * cached while the weights themselves stay cold; without the pass
         * Q4_0 calls took 58 us after a probe against 45 us in a loop */
        for (int i = 0; i < set->n; i++)
            gemm_run(set->inv[i], a, 1, c, pool2);
        bench_time_on(set, 0, a, 1, c, bench_calls(1), &one, pool2);
        probe[r + 1] = probe_read_bw(2, 1);
        const double adj = probe[r] > probe[r + 1] ? probe[r] : probe[r + 1];
        ratio[r] = file_bytes / one.wall / adj;
        best.wall = one.wall < best.wall ? one.wall : best.wall;
        *best_bw = probe[r + 1] > *best_bw ? probe[r + 1] : *best_bw;
    }
    *best_s = best.wall;
    *q = bench_quartiles(ratio, BENCH_PAIRS);
}

/* The 16-bit, Q8_0 and qs weights: invariant kernel only (OpenBLAS has no
 * such type), M = 1 cold on two threads against the 2-thread probes and every
 * M on the bench's threads; then the two-thread summary. */
/* The compute limit of a type's M = 64 rate: the int8 peak (probe.h) when
 * the type runs the int8 arithmetic on its VNNI kernels, else the f32 peak
 * (16-bit weights, and every type under the exact arithmetic, multiply in
 * f32). */
static bool bench_int8_limited(gemm_wtype type, double i8_peak)
{
    return bench_qbackend == GEMM_BACKEND_INT8 && i8_peak > 0.0 &&
           (type == GEMM_W_Q8_0 || gemm_wtype_is_qs(type));
}

static void bench_quantized(const float *a, float *c, int reps, double bw, double bw2, double f32_peak,
                            double i8_peak, pool *pool2)
{
    bench_set set;
    /* 16-bit and Q8_0 weights: invariant kernel only (OpenBLAS has no such
     * type); GFLOP/s and the weight bandwidth at M = 1. */
    static const gemm_wtype qt[] = {GEMM_W_F16,  GEMM_W_BF16, GEMM_W_Q8_0, GEMM_W_Q4_0, GEMM_W_Q4_1, GEMM_W_Q5_0,
                                    GEMM_W_Q5_1, GEMM_W_Q4_K, GEMM_W_Q5_K, GEMM_W_Q6_K};
    enum { NQT = sizeof qt / sizeof qt[0] };
    const size_t nqt = NQT;
    /* per type: M = 1 cold on two threads (packed and file bytes, seconds
     * per call) and M = 64 GFLOP/s */
    double m1_2t[NQT], m64[NQT], packed_b[NQT], file_b[NQT], bw2_adj[NQT];
    bench_quart paired[NQT];
    printf("  \"quantized\": [\n");
    for (size_t ti = 0; ti < nqt; ti++) {
        bench_pack(&set, qt[ti], 0);
        for (int c2 = 0; c2 < set.n; c2++)
            gemm_run(set.inv[c2], a, 1, c, NULL);
        packed_b[ti] = (double)gemm_bytes(set.inv[0]);
        file_b[ti] = (double)gemm_row_bytes(qt[ti], BK) * BN;
        bench_m1_paired(&set, a, c, pool2, file_b[ti], &m1_2t[ti], &bw2_adj[ti], &paired[ti]);
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
            uint32_t m = ms[mi];
            bench_best bt = {1e30, 1e30};
            for (int r = 0; r < reps; r++)
                bench_time(&set, 0, a, m, c, bench_calls(m), &bt);
            double best = bt.wall;
            double flop = 2.0 * m * BN * BK;
            /* weight_gbs: packed bytes read; file_gbs: the same time on
             * the bytes the type takes in a GGUF file (the qs types are
             * packed wider than they are stored) */
            const double file_bytes = (double)gemm_row_bytes(qt[ti], BK) * BN;
            if (m == 64)
                m64[ti] = flop / best / 1e9;
            printf("    {\"type\": \"%s\", \"copies\": %d, \"m\": %u, \"invariant_gflops\": %.2f, "
                   "\"weight_gbs\": %.2f, \"bw_ratio\": %.3f, \"file_gbs\": %.2f}%s\n",
                   gemm_wtype_name(qt[ti]), set.n, m, flop / best / 1e9,
                   (double)gemm_bytes(set.inv[0]) / best / 1e9,
                   (double)gemm_bytes(set.inv[0]) / best / bw, file_bytes / best / 1e9,
                   ti + 1 < nqt || mi + 1 < sizeof ms / sizeof ms[0] ? "," : "");
        }
        bench_unpack(&set);
    }
    printf("  ],\n");
    /* the issue-36 goal: M = 1 on two threads reads >= 0.8 of the 2-thread
     * probe on the type's file bytes */
    printf("  \"m1_two_threads\": [\n");
    for (size_t ti = 0; ti < nqt; ti++)
        printf("    {\"type\": \"%s\", \"packed_bytes_per_512\": %.0f, \"file_bytes_per_512\": %.0f, "
               "\"packed_gbs\": %.2f, \"file_gbs\": %.2f, \"packed_vs_read_bw_2t\": %.3f, "
               "\"file_vs_read_bw_2t\": %.3f, \"read_bw_2t_adjacent_gbs\": %.2f, \"file_vs_adjacent_probe\": %.3f, "
               "\"packed_vs_adjacent_probe\": %.3f, \"paired_rounds\": %d, \"file_vs_probe_paired_median\": %.3f, "
               "\"file_vs_probe_paired_p25\": %.3f, \"file_vs_probe_paired_p75\": %.3f, \"m64_gflops\": %.2f, \"m64_vs_f32_peak\": %.3f, "
               "\"compute_limit\": \"%s\", \"m64_vs_compute_limit\": %.3f}%s\n",
               gemm_wtype_name(qt[ti]), packed_b[ti] * 512.0 / ((double)BN * BK),
               file_b[ti] * 512.0 / ((double)BN * BK), packed_b[ti] / m1_2t[ti] / 1e9, file_b[ti] / m1_2t[ti] / 1e9,
               packed_b[ti] / m1_2t[ti] / bw2, file_b[ti] / m1_2t[ti] / bw2, bw2_adj[ti] / 1e9,
               file_b[ti] / m1_2t[ti] / bw2_adj[ti], packed_b[ti] / m1_2t[ti] / bw2_adj[ti], BENCH_PAIRS,
               paired[ti].median, paired[ti].p25, paired[ti].p75, m64[ti], m64[ti] / f32_peak,
               bench_int8_limited(qt[ti], i8_peak) ? "int8_peak" : "f32_peak",
               m64[ti] / (bench_int8_limited(qt[ti], i8_peak) ? i8_peak / 1e9 : f32_peak), ti + 1 < nqt ? "," : "");
    printf("  ],\n  \"f32_peak_gflops\": %.2f,\n", f32_peak);
}

/* Each type's M = 1 compute rate with W in L2 (m1_hot). */
static void bench_hot(const float *a, float *c, int reps, double bw)
{
    /* hot / read_bw_1t below 1 (or near it) means the M = 1 kernel, not
     * memory, bounds a thread at batch 1 */
    static const gemm_wtype ht[] = {GEMM_W_F32,  GEMM_W_F16,  GEMM_W_BF16, GEMM_W_Q8_0, GEMM_W_Q4_0, GEMM_W_Q4_1,
                                    GEMM_W_Q5_0, GEMM_W_Q5_1, GEMM_W_Q4_K, GEMM_W_Q5_K, GEMM_W_Q6_K};
    const size_t nht = sizeof ht / sizeof ht[0];
    printf("  \"m1_hot\": [\n");
    for (size_t ti = 0; ti < nht; ti++) {
        double wps = 0.0, wps_cpu = 0.0;
        double gbs = bench_m1_hot_gbs(ht[ti], a, c, reps, &wps, &wps_cpu);
        printf("    {\"type\": \"%s\", \"n\": %u, \"weight_gbs\": %.2f, \"gweights_per_s\": %.2f, "
               "\"gweights_per_s_cpu\": %.2f, \"vs_read_bw_1t\": %.3f}%s\n",
               gemm_wtype_name(ht[ti]), BHOT_N, gbs, wps / 1e9, wps_cpu / 1e9, gbs * 1e9 / bw,
               ti + 1 < nht ? "," : "");
    }
    printf("  ],\n");
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 7;
    if (reps < 1)
        reps = 1;
    const char *bench_threads = getenv("PD_BENCH_THREADS");
    uint32_t threads = bench_threads ? (uint32_t)atoi(bench_threads) : 1;
    const char *qbe = getenv("PD_BENCH_GEMM");
    if (qbe && strcmp(qbe, "int8") == 0)
        bench_qbackend = GEMM_BACKEND_INT8;
    else if (qbe && strcmp(qbe, "invariant") != 0)
        bench_die("PD_BENCH_GEMM must be invariant or int8", NULL);
    if (threads >= 2 && pool_new(threads, &bench_pool, NULL) != PD_OK)
        bench_die("pool", NULL);
    if (!bench_pool)
        threads = 1;
    openblas_set_num_threads(1);
    float *a = malloc(sizeof(float) * BMAX * BK);
    float *c = malloc(sizeof(float) * BMAX * BN);
    if (!a || !c)
        bench_die("out of memory", NULL);
    for (size_t i = 0; i < (size_t)BMAX * BK; i++)
        a[i] = (float)((i * 2654435761u) % 2001u) / 1000.0f - 1.0f;

    double load0 = bench_load();
    double bw = probe_read_bw(1, 5);
    double bw2 = probe_read_bw(2, 5);
    pool *pool2 = NULL;
    if (pool_new(2, &pool2, NULL) != PD_OK)
        bench_die("pool of 2", NULL);
    bench_set set;
    bench_pack(&set, GEMM_W_F32, 1);
    /* warm-up: page in every copy, let OpenBLAS start */
    for (int c2 = 0; c2 < set.n; c2++) {
        gemm_run(set.inv[c2], a, 1, c, NULL);
        gemm_run(set.blas[c2], a, 1, c, NULL);
    }

    printf("{\n  \"bench\": \"gemm\",\n  \"threads\": %u,\n  \"isa\": \"%s\",\n", threads,
           pd_isa_name(pd_cpu_isa()));
    printf("  \"k\": %u,\n  \"n\": %u,\n  \"reps\": %d,\n  \"weight_copies\": %d,\n", BK, BN, reps,
           set.n);
    printf("  \"openblas\": \"%s\",\n", openblas_get_config());
    printf("  \"quantized_backend\": \"%s\",\n", gemm_backend_name(bench_qbackend));
    printf("  \"read_bw_1t_gbs\": %.2f,\n  \"read_bw_2t_gbs\": %.2f,\n", bw / 1e9, bw2 / 1e9);
    int all_met = 1;
    double f32_peak = 0.0;
    bench_f32(&set, a, c, reps, bw, &all_met, &f32_peak);
    /* the int8 arithmetic's limit, 1 thread as f32_peak */
    double i8_peak = probe_int8_peak(3);
    printf("  \"int8_peak_gops_1t\": %.2f,\n", i8_peak / 1e9);
    bench_quantized(a, c, reps, bw, bw2, f32_peak, i8_peak, pool2);
    bench_hot(a, c, reps, bw);
    printf("  \"pool_dispatch_us_2threads_8tasks\": %.2f,\n", bench_pool_dispatch_us(reps));
    printf("  \"loadavg_1m\": [%.2f, %.2f],\n", load0, bench_load());
    printf("  \"goal_met\": %s\n}\n", all_met ? "true" : "false");
    free(a);
    free(c);
    pool_free(bench_pool);
    pool_free(pool2);
    return 0;
}
