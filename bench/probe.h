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

/* The int8 arithmetic's compute limit on 1 thread (gemm.h, GEMM_BACKEND_INT8):
 * independent chains of AVX-512 VNNI vpdpbusd (64 u8 x s8 multiply-adds
 * each) from registers, as operations per second (2 a multiply-add, the unit
 * of the GEMMs' GFLOP/s); the best of `reps` rounds of about 0.1-0.5 s.
 * 0 when the CPU has no AVX-512 VNNI (int8 then runs the portable tile). */
double probe_int8_peak(int reps);

#endif
