/* Bandwidth probes for the benchmarks (see probe.h). */
#include "probe.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
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
#else
static float probe_sum(const float *p, size_t n)
{
    float a[4] = {0};
    for (size_t i = 0; i + 4 <= n; i += 4)
        for (int j = 0; j < 4; j++)
            a[j] += p[i + j];
    return a[0] + a[1] + a[2] + a[3];
}
#endif

struct probe_job {
    const float *p;
    size_t n;
    float sink;
};

static void *probe_worker(void *arg)
{
    struct probe_job *j = arg;
    j->sink = probe_sum(j->p, j->n);
    return NULL;
}

double probe_read_bw(int threads, int reps)
{
    if (threads < 1)
        threads = 1;
    float *buf = aligned_alloc(64, PROBE_BYTES);
    if (!buf)
        return 0.0;
    size_t n = PROBE_BYTES / sizeof(float);
    for (size_t i = 0; i < n; i++)
        buf[i] = (float)(i & 1023);
    double best = 0.0;
    volatile float sink = 0.0f;
    for (int r = 0; r < reps; r++) {
        pthread_t tid[64];
        struct probe_job jobs[64];
        size_t part = (n / (size_t)threads) & ~(size_t)31;
        double t0 = probe_now();
        for (int t = 0; t < threads; t++) {
            jobs[t] = (struct probe_job){.p = buf + (size_t)t * part, .n = part};
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
    free(buf);
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
