/* Bandwidth probes for the benchmarks (see probe.h). */
#include "probe.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define PROBE_BYTES ((size_t)512 << 20)

double probe_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Two ways of reading a thread's part, the best of which is the limit: one
 * stream, and four streams at once with a software prefetch ahead (the
 * access pattern of the GEMM row kernels, which read up to 20 % more than
 * one stream did on some hosts). */
#define PROBE_STREAMS 4
#define PROBE_CHUNK ((size_t)20480) /* floats per stream in one round (80 KiB) */
#define PROBE_PREFETCH 4096         /* bytes */

#if defined(__x86_64__)
__attribute__((target("avx2"))) static float probe_sum(const float *p, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

/* n is a multiple of PROBE_STREAMS * PROBE_CHUNK. */
__attribute__((target("avx2"))) static float probe_sum_streams(const float *p, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t base = 0; base < n; base += PROBE_STREAMS * PROBE_CHUNK) {
        const float *q0 = p + base, *q1 = q0 + PROBE_CHUNK, *q2 = q1 + PROBE_CHUNK, *q3 = q2 + PROBE_CHUNK;
        for (size_t i = 0; i < PROBE_CHUNK; i += 16) {
            _mm_prefetch((const char *)(q0 + i) + PROBE_PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)(q1 + i) + PROBE_PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)(q2 + i) + PROBE_PREFETCH, _MM_HINT_T0);
            _mm_prefetch((const char *)(q3 + i) + PROBE_PREFETCH, _MM_HINT_T0);
            a0 = _mm256_add_ps(a0, _mm256_add_ps(_mm256_load_ps(q0 + i), _mm256_load_ps(q0 + i + 8)));
            a1 = _mm256_add_ps(a1, _mm256_add_ps(_mm256_load_ps(q1 + i), _mm256_load_ps(q1 + i + 8)));
            a2 = _mm256_add_ps(a2, _mm256_add_ps(_mm256_load_ps(q2 + i), _mm256_load_ps(q2 + i + 8)));
            a3 = _mm256_add_ps(a3, _mm256_add_ps(_mm256_load_ps(q3 + i), _mm256_load_ps(q3 + i + 8)));
        }
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float out[8];
    _mm256_storeu_ps(out, s);
    return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}
#else
static float probe_sum(const float *p, size_t n)
{
    float a[4] = {0};
    for (size_t i = 0; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            a[j] += p[i + j];
    return a[0] + a[1] + a[2] + a[3];
}

static float probe_sum_streams(const float *p, size_t n)
{
    float a[PROBE_STREAMS] = {0};
    for (size_t base = 0; base < n; base += PROBE_STREAMS * PROBE_CHUNK)
        for (size_t i = 0; i < PROBE_CHUNK; i++)
            for (int j = 0; j < PROBE_STREAMS; j++)
                a[j] += p[base + (size_t)j * PROBE_CHUNK + i];
    return a[0] + a[1] + a[2] + a[3];
}
#endif

struct probe_job {
    const float *p;
    size_t n;
    bool streams;
    float sink;
};

static void *probe_worker(void *arg)
{
    struct probe_job *j = arg;
    j->sink = j->streams ? probe_sum_streams(j->p, j->n) : probe_sum(j->p, j->n);
    return NULL;
}

/* The probes' buffer: made once per process on 2 MiB pages and kept (a
 * benchmark's lifetime). A fresh 512 MiB on 4 KiB pages for every probe, as
 * before, left the weights a benchmark reads next 5-40x slower on this VM
 * (bench_gemm's qs types read 0.6-9 GB/s after a probe and 13-40 without
 * one, same kernels): the probe measured the machine and disturbed it. */
static float *probe_buffer(void)
{
    static float *buf;
    if (buf)
        return buf;
    const size_t huge = (size_t)2 << 20;
    float *b = aligned_alloc(huge, PROBE_BYTES);
    if (!b)
        return NULL;
    (void)madvise(b, PROBE_BYTES, MADV_HUGEPAGE); /* advice: 4 KiB pages still work */
    for (size_t i = 0; i < PROBE_BYTES / sizeof(float); i++)
        b[i] = (float)(i & 1023);
    buf = b;
    return buf;
}

double probe_read_bw(int threads, int reps)
{
    if (threads < 1)
        threads = 1;
    float *buf = probe_buffer();
    if (!buf)
        return 0.0;
    size_t n = PROBE_BYTES / sizeof(float);
    double best = 0.0;
    volatile float sink = 0.0f;
    for (int r = 0; r < 2 * reps; r++) {
        pthread_t tid[64];
        struct probe_job jobs[64];
        bool streams = r & 1;
        size_t round = streams ? PROBE_STREAMS * PROBE_CHUNK : 32;
        size_t part = n / (size_t)threads / round * round;
        double t0 = probe_now();
        for (int t = 0; t < threads; t++) {
            jobs[t] = (struct probe_job){.p = buf + (size_t)t * part, .n = part, .streams = streams};
            if (t > 0)
                pthread_create(&tid[t], NULL, probe_worker, &jobs[t]);
        }
        probe_worker(&jobs[0]);
        for (int t = 1; t < threads; t++)
            pthread_join(tid[t], NULL);
        double dt = probe_now() - t0;
        for (int t = 0; t < threads; t++)
            sink += jobs[t].sink;
        double bw = (double)part * (double)threads * sizeof(float) / dt;
        if (bw > best)
            best = bw;
    }
    (void)sink;
    return best;
}

double probe_memcpy_bw(int reps)
{
    size_t bytes = (size_t)256 << 20;
    char *a = aligned_alloc(64, bytes), *b = aligned_alloc(64, bytes);
    if (!a || !b) {
        free(a);
        free(b);
        return 0.0;
    }
    memset(a, 1, bytes);
    memset(b, 2, bytes);
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        double t0 = probe_now();
        memcpy(b, a, bytes);
        double dt = probe_now() - t0;
        if ((double)bytes / dt > best)
            best = (double)bytes / dt;
        a[r % bytes] ^= b[(r * 7) % bytes];
    }
    free(a);
    free(b);
    return best;
}

/* 16 independent vpdpbusd chains: more than its latency (5 cycles) times
 * its throughput (up to 2 a cycle) needs to keep every port busy. */
#define PROBE_I8_CHAINS 16
#define PROBE_I8_ITERS 4000000L

#if defined(__x86_64__)
__attribute__((target("avx512f,avx512bw,avx512vnni"))) static double probe_int8_round(void)
{
    __m512i acc[PROBE_I8_CHAINS];
    const __m512i u = _mm512_set1_epi8(3), s = _mm512_set1_epi8(-5);
    for (int i = 0; i < PROBE_I8_CHAINS; i++)
        acc[i] = _mm512_set1_epi32(i);
    double t0 = probe_now();
    for (long it = 0; it < PROBE_I8_ITERS; it++) {
#pragma GCC unroll 16
        for (int i = 0; i < PROBE_I8_CHAINS; i++)
            acc[i] = _mm512_dpbusd_epi32(acc[i], u, s);
        /* the chains stay in registers: nothing for the compiler to fold */
        __asm__ volatile("" : "+v"(acc[0]), "+v"(acc[1]), "+v"(acc[2]), "+v"(acc[3]), "+v"(acc[4]), "+v"(acc[5]),
                         "+v"(acc[6]), "+v"(acc[7]));
        __asm__ volatile("" : "+v"(acc[8]), "+v"(acc[9]), "+v"(acc[10]), "+v"(acc[11]), "+v"(acc[12]),
                         "+v"(acc[13]), "+v"(acc[14]), "+v"(acc[15]));
    }
    double dt = probe_now() - t0;
    __m512i sum = acc[0];
    for (int i = 1; i < PROBE_I8_CHAINS; i++)
        sum = _mm512_add_epi32(sum, acc[i]);
    volatile int sink = _mm512_reduce_add_epi32(sum);
    (void)sink;
    /* 64 multiply-adds per instruction, 2 operations each */
    return (double)PROBE_I8_ITERS * PROBE_I8_CHAINS * 64 * 2 / dt;
}
#endif

double probe_int8_peak(int reps)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
        !__builtin_cpu_supports("avx512vnni"))
        return 0.0;
    double best = 0.0;
    for (int r = 0; r < reps; r++) {
        double x = probe_int8_round();
        best = x > best ? x : best;
    }
    return best;
#else
    (void)reps;
    return 0.0;
#endif
}
