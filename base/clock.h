/* clock: the process's clocks, read one way everywhere. Monotonic time for
 * intervals and timeouts (never wall-clock time, which jumps), and the CPU
 * time the process has used. Not for anything an output depends on: a token
 * is a pure function of its inputs (ARCHITECTURE.md §1), never of a clock. */
#ifndef PD_CLOCK_H
#define PD_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in seconds (an arbitrary origin: only differences mean
 * anything). Never decreases. */
double pd_now_s(void);

/* CLOCK_MONOTONIC in nanoseconds, for spin timeouts checked in a tight loop. */
int64_t pd_now_ns(void);

/* CPU seconds every thread of this process has used
 * (CLOCK_PROCESS_CPUTIME_ID); 0 when the system does not keep it. */
double pd_cpu_s(void);

#endif
