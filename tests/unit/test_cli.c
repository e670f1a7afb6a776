/* cli: flag values are taken whole or refused with one message shape that
 * names the flag, the value and what was expected. */
#include "pd_test.h"

#include "cluster/cli/cli.h"

#include <string.h>

START_TEST(cli_choice_takes_a_name_and_gives_its_index)
{
    static const char *const names[] = {"invariant", "openblas"};
    int v = -1;
    pd_err e = {0};
    ck_assert_int_eq(cli_choice("--gemm", "openblas", names, 2, &v, &e), PD_OK);
    ck_assert_int_eq(v, 1);
    ck_assert_int_eq(cli_choice("--gemm", "invariant", names, 2, &v, &e), PD_OK);
    ck_assert_int_eq(v, 0);
}
END_TEST

START_TEST(cli_choice_refuses_other_values_naming_every_choice)
{
    static const char *const two[] = {"off", "auto"}, *const three[] = {"a", "b", "c"};
    int v = 7;
    pd_err e = {0};
    ck_assert_int_eq(cli_choice("--rebalance", "Auto", two, 2, &v, &e), PD_ERR_ARG);
    ck_assert_str_eq(e.msg, "--rebalance 'Auto': expected off or auto");
    ck_assert_int_eq(v, 7);
    e = (pd_err){0}; /* the first failure sticks in a pd_err */
    ck_assert_int_eq(cli_choice("--x", "", three, 3, &v, &e), PD_ERR_ARG);
    ck_assert_str_eq(e.msg, "--x '': expected a, b or c");
    e = (pd_err){0};
    ck_assert_int_eq(cli_choice("--x", NULL, three, 1, &v, &e), PD_ERR_ARG);
    ck_assert_str_eq(e.msg, "--x '': expected a");
    ck_assert_int_eq(cli_choice("--x", "auto2", two, 2, &v, &e), PD_ERR_ARG); /* no prefix match */
    ck_assert_int_eq(v, 7);
}
END_TEST

START_TEST(cli_u32_takes_whole_integers_in_range_only)
{
    uint32_t v = 5;
    pd_err e = {0};
    ck_assert_int_eq(cli_u32("--batch", "4096", 1, 4096, &v, &e), PD_OK);
    ck_assert_uint_eq(v, 4096);
    static const char *const bad[] = {"", "0", "4097", "-1", "+3", "3x", "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        e = (pd_err){0}; /* the first failure sticks in a pd_err */
        ck_assert_int_eq(cli_u32("--batch", bad[i], 1, 4096, &v, &e), PD_ERR_ARG);
        ck_assert_uint_eq(v, 4096);
    }
    ck_assert_str_eq(e.msg, "--batch '99999999999999999999': expected an integer in 1..4096");
}
END_TEST

START_TEST(cli_u64_takes_non_negative_integers_only)
{
    uint64_t v = 0;
    pd_err e = {0};
    ck_assert_int_eq(cli_u64("--seed", "18446744073709551615", &v, &e), PD_OK);
    ck_assert_uint_eq(v, UINT64_MAX);
    ck_assert_int_eq(cli_u64("--seed", "-1", &v, &e), PD_ERR_ARG);
    ck_assert_str_eq(e.msg, "--seed '-1': expected a non-negative integer");
    e = (pd_err){0};
    ck_assert_int_eq(cli_u64("--seed", "18446744073709551616", &v, &e), PD_ERR_ARG);
    ck_assert_uint_eq(v, UINT64_MAX);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("cli");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, cli_choice_takes_a_name_and_gives_its_index);
    tcase_add_test(tc, cli_choice_refuses_other_values_naming_every_choice);
    tcase_add_test(tc, cli_u32_takes_whole_integers_in_range_only);
    tcase_add_test(tc, cli_u64_takes_non_negative_integers_only);
    suite_add_tcase(s, tc);
    return s;
}
