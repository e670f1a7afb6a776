/* rebalance: the --rebalance auto rule proposes the map that minimises the
 * slowest stage under per-layer costs spread from measured busy times, and
 * moves only when the predicted gain passes the threshold. */
#include "pd_test.h"

#include "cluster/runtime/plan/rebalance.h"

#include <math.h>
#include <string.h>

static layermap map_of(const char *s, uint32_t stages, uint32_t layers)
{
    layermap m;
    pd_err e = {0};
    ck_assert_int_eq(layermap_parse(s, stages, layers, &m, &e), PD_OK);
    return m;
}

START_TEST(rebalance_moves_a_lopsided_map_to_the_balanced_one)
{
    /* one layer on rank 0 costs what one of rank 1's eleven costs */
    layermap cur = map_of("0-0,1-11", 2, 12);
    double busy[2] = {1.0, 11.0};
    rebalance_decision d;
    pd_err e = {0};
    ck_assert_int_eq(rebalance_decide(&cur, busy, 0.10, &d, &e), PD_OK);
    ck_assert(d.move);
    char buf[64];
    layermap_format(&d.propose, buf, sizeof buf);
    ck_assert_str_eq(buf, "0-5,6-11");
    ck_assert(fabs(d.predicted - 6.0) < 1e-6);
    ck_assert(fabs(d.bottleneck - 11.0) < 1e-12);
    ck_assert(fabs(d.gain - 5.0 / 11.0) < 1e-6);
}
END_TEST

START_TEST(rebalance_stays_on_a_balanced_map_and_below_the_threshold)
{
    layermap cur = map_of("0-5,6-11", 2, 12);
    double even[2] = {6.0, 6.0};
    rebalance_decision d;
    pd_err e = {0};
    ck_assert_int_eq(rebalance_decide(&cur, even, 0.10, &d, &e), PD_OK);
    ck_assert(!d.move);
    ck_assert(d.gain == 0.0);
    /* 6 vs 9: rank 1's layers cost 1.5 each; moving layer 6 predicts 7.5 on
     * both, a gain of 1.5 / 9 = 16.7 % */
    double skew[2] = {6.0, 9.0};
    ck_assert_int_eq(rebalance_decide(&cur, skew, 0.20, &d, &e), PD_OK);
    ck_assert(!d.move);
    ck_assert(fabs(d.gain - 1.5 / 9.0) < 1e-6);
    ck_assert_int_eq(rebalance_decide(&cur, skew, 0.10, &d, &e), PD_OK);
    ck_assert(d.move);
    char buf[64];
    layermap_format(&d.propose, buf, sizeof buf);
    ck_assert_str_eq(buf, "0-6,7-11");
    /* 6 vs 7: no map beats the current one (moving a layer gives 7.17) */
    double near[2] = {6.0, 7.0};
    ck_assert_int_eq(rebalance_decide(&cur, near, 0.0, &d, &e), PD_OK);
    ck_assert(!d.move);
}
END_TEST

START_TEST(rebalance_idle_window_and_bad_times)
{
    layermap cur = map_of("0-3,4-7,8-11", 3, 12);
    double idle[3] = {0, 0, 0};
    rebalance_decision d;
    pd_err e = {0};
    ck_assert_int_eq(rebalance_decide(&cur, idle, 0.10, &d, &e), PD_OK);
    ck_assert(!d.move);
    double bad[3] = {1, -1, 1};
    ck_assert_int_eq(rebalance_decide(&cur, bad, 0.10, &d, &e), PD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(e.msg, "stage 1"));
    double nan_[3] = {1, NAN, 1};
    ck_assert_int_eq(rebalance_decide(&cur, nan_, 0.10, &d, &e), PD_ERR_ARG);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("rebalance");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, rebalance_moves_a_lopsided_map_to_the_balanced_one);
    tcase_add_test(tc, rebalance_stays_on_a_balanced_map_and_below_the_threshold);
    tcase_add_test(tc, rebalance_idle_window_and_bad_times);
    suite_add_tcase(s, tc);
    return s;
}
