/* clock: the monotonic clock never goes back, its two units agree, a sleep
 * shows in it and not in the CPU clock, work shows in the CPU clock. */
#include "pd_test.h"

#include "base/clock.h"

#include <time.h>

static void nap_ms(long ms)
{
    struct timespec ts = {.tv_sec = 0, .tv_nsec = ms * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

START_TEST(clock_monotonic_never_goes_back)
{
    double s = pd_now_s();
    int64_t ns = pd_now_ns();
    for (int i = 0; i < 100000; i++) {
        double s2 = pd_now_s();
        int64_t ns2 = pd_now_ns();
        ck_assert(s2 >= s);
        ck_assert(ns2 >= ns);
        s = s2;
        ns = ns2;
    }
}
END_TEST

START_TEST(clock_seconds_and_nanoseconds_read_the_same_clock)
{
    /* read in between: the nanoseconds lie within the two readings in seconds
     * (a millisecond of slack for the double's rounding, never near it) */
    double a = pd_now_s();
    int64_t ns = pd_now_ns();
    double b = pd_now_s();
    ck_assert(ns > 0);
    ck_assert((double)ns * 1e-9 >= a - 1e-3);
    ck_assert((double)ns * 1e-9 <= b + 1e-3);
}
END_TEST

START_TEST(clock_a_sleep_passes_monotonic_time_not_cpu_time)
{
    double t0 = pd_now_s(), c0 = pd_cpu_s();
    int64_t n0 = pd_now_ns();
    nap_ms(50);
    double dt = pd_now_s() - t0, dc = pd_cpu_s() - c0;
    int64_t dn = pd_now_ns() - n0;
    ck_assert_msg(dt >= 0.049 && dt < 5, "slept 50 ms, the clock says %.6f s", dt);
    ck_assert_msg(dn >= 49000000 && dn < 5000000000LL, "slept 50 ms, the clock says %lld ns", (long long)dn);
    ck_assert_msg(dc >= 0 && dc < 0.045, "a sleep used %.6f CPU seconds", dc);
}
END_TEST

START_TEST(clock_cpu_time_counts_work)
{
    double c0 = pd_cpu_s();
    ck_assert(c0 > 0);
    volatile double x = 0;
    while (pd_cpu_s() - c0 < 0.02)
        x += 1; /* spins until 20 ms of CPU time have passed: it must move */
    ck_assert(pd_cpu_s() >= c0 + 0.02);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("clock");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, clock_monotonic_never_goes_back);
    tcase_add_test(tc, clock_seconds_and_nanoseconds_read_the_same_clock);
    tcase_add_test(tc, clock_a_sleep_passes_monotonic_time_not_cpu_time);
    tcase_add_test(tc, clock_cpu_time_counts_work);
    suite_add_tcase(s, tc);
    return s;
}
