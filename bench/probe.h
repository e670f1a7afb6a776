/* Machine limits measured inside a benchmark run, so every benchmark reports a
 * ratio against a limit of the same machine at the same moment (never a bare
 * time). */
#ifndef PD_BENCH_PROBE_H
#define PD_BENCH_PROBE_H

#include <stddef.h>

/* Monotonic seconds. */
double probe_now(void);

/* Read bandwidth in bytes/s over a buffer far larger than the last-level
 * cache, `threads` threads each reading its own part: the best of `reps`
 * rounds of each of two patterns, one stream per thread (AVX2 loads into 4
 * independent accumulators), and four streams per thread with a software
 * prefetch 4 KiB ahead (how the GEMM row kernels read). */
double probe_read_bw(int threads, int reps);

/* memcpy bandwidth in bytes/s (bytes copied, i.e. counted once), 1 thread. */
double probe_memcpy_bw(int reps);

#endif
