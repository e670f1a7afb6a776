/* clock: monotonic and process CPU time (contract in clock.h). */
#include "base/clock.h"

#include <time.h>

static double clock_seconds(const struct timespec *ts)
{
    return (double)ts->tv_sec + 1e-9 * (double)ts->tv_nsec;
}

double pd_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return clock_seconds(&ts);
}

int64_t pd_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

double pd_cpu_s(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts) != 0)
        return 0;
    return clock_seconds(&ts);
}
