/* cli: flag values are taken whole or refused with one message shape that
 * names the flag, the value and what was expected. */
#include "pd_test.h"

#include "cluster/cli/cli.h"

#include <stdio.h>
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

/* cli_parse: a recording flag handler */
typedef struct seen {
    char log[256];
    int fail_on;
} seen;

static pd_status seen_flag(void *ctx, int ch, const char *arg, pd_err *err)
{
    seen *s = ctx;
    size_t n = strlen(s->log);
    snprintf(s->log + n, sizeof s->log - n, "%c=%s;", ch, arg ? arg : "-");
    if (ch == s->fail_on)
        return pd_err_set(err, PD_ERR_ARG, "--%c '%s': bad", ch, arg ? arg : "");
    return PD_OK;
}

static const struct option parse_opts[] = {{"alpha", required_argument, 0, 'a'},
                                           {"beta", no_argument, 0, 'b'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};

static pd_status parse(int argc, const char *const *args, seen *s, bool *help, pd_err *e)
{
    char *argv[8];
    for (int i = 0; i < argc; i++)
        argv[i] = (char *)args[i];
    argv[argc] = NULL;
    return cli_parse(argc, argv, parse_opts, seen_flag, s, help, e);
}

START_TEST(cli_parse_hands_every_flag_over_in_order)
{
    static const char *const a[] = {"cmd", "--alpha", "1", "--beta", "--alpha=2"};
    seen s = {.fail_on = -1};
    bool help = true;
    pd_err e = {0};
    ck_assert_int_eq(parse(5, a, &s, &help, &e), PD_OK);
    ck_assert_str_eq(s.log, "a=1;b=-;a=2;");
    ck_assert(!help);
    /* argv parsed twice in one process: the loop starts over each time */
    s.log[0] = 0;
    ck_assert_int_eq(parse(5, a, &s, &help, &e), PD_OK);
    ck_assert_str_eq(s.log, "a=1;b=-;a=2;");
}
END_TEST

START_TEST(cli_parse_stops_at_help_and_names_what_it_refuses)
{
    seen s = {.fail_on = -1};
    bool help = false;
    pd_err e = {0};
    static const char *const h[] = {"cmd", "--beta", "--help", "--alpha"};
    ck_assert_int_eq(parse(4, h, &s, &help, &e), PD_OK);
    ck_assert(help);
    ck_assert_str_eq(s.log, "b=-;");
    static const char *const unknown[] = {"cmd", "--gamma"};
    ck_assert_int_eq(parse(2, unknown, &s, &help, &e), PD_ERR_ARG);
    ck_assert_str_eq(e.msg, "unknown or incomplete option '--gamma'");
    ck_assert(!help);
    e = (pd_err){0};
    static const char *const missing[] = {"cmd", "--alpha"};
    ck_assert_int_eq(parse(2, missing, &s, &help, &e), PD_ERR_ARG);
    ck_assert_str_eq(e.msg, "unknown or incomplete option '--alpha'");
    e = (pd_err){0};
    static const char *const stray[] = {"cmd", "--beta", "stray"};
    ck_assert_int_eq(parse(3, stray, &s, &help, &e), PD_ERR_ARG);
    ck_assert_str_eq(e.msg, "unexpected argument 'stray'");
    e = (pd_err){0};
    s = (seen){.fail_on = 'a'};
    static const char *const bad[] = {"cmd", "--alpha", "x", "--beta"};
    ck_assert_int_eq(parse(4, bad, &s, &help, &e), PD_ERR_ARG);
    ck_assert_str_eq(e.msg, "--a 'x': bad");
    ck_assert_str_eq(s.log, "a=x;"); /* nothing after the failing flag */
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
    tcase_add_test(tc, cli_parse_hands_every_flag_over_in_order);
    tcase_add_test(tc, cli_parse_stops_at_help_and_names_what_it_refuses);
    suite_add_tcase(s, tc);
    return s;
}
