/* cli: flag values are taken whole or refused with one message shape that
 * names the flag, the value and what was expected; the option prologue
 * (flags, check, --help, refusal and usage) as every subcommand runs it. */
#include "pd_test.h"

#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"

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

/* cli_parse: a recording flag handler, a check and a usage text */
typedef struct seen {
    char log[256];
    int fail_on;
    int refuse; /* the check refuses */
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

static pd_status seen_check(void *ctx, pd_err *err)
{
    seen *s = ctx;
    size_t n = strlen(s->log);
    snprintf(s->log + n, sizeof s->log - n, "check;");
    return s->refuse ? pd_err_set(err, PD_ERR_ARG, "--alpha is required") : PD_OK;
}

static void seen_usage(FILE *f) { fputs("usage: pipedec t --alpha A [--beta]\n", f); }

static const struct option parse_opts[] = {{"alpha", required_argument, 0, 'a'},
                                           {"beta", no_argument, 0, 'b'},
                                           {"help", no_argument, 0, 'h'},
                                           {0, 0, 0, 0}};

static const cli_cmd parse_cmd = {
    .name = "t", .opts = parse_opts, .flag = seen_flag, .check = seen_check, .usage = seen_usage};

/* What cli_parse printed on out and err, and its verdict. */
typedef struct parsed {
    int rc;
    char out[256], err[256];
} parsed;

static parsed parse(int argc, const char *const *args, seen *s)
{
    char *argv[8];
    for (int i = 0; i < argc; i++)
        argv[i] = (char *)args[i];
    argv[argc] = NULL;
    FILE *out = tmpfile(), *err = tmpfile();
    ck_assert(out && err);
    parsed p = {.rc = cli_parse(&parse_cmd, argc, argv, s, out, err)};
    pd_test_slurp(out, p.out, sizeof p.out);
    pd_test_slurp(err, p.err, sizeof p.err);
    return p;
}

START_TEST(cli_parse_hands_every_flag_over_in_order_then_checks)
{
    static const char *const a[] = {"t", "--alpha", "1", "--beta", "--alpha=2"};
    seen s = {.fail_on = -1};
    parsed p = parse(5, a, &s);
    ck_assert_int_eq(p.rc, CLI_GO);
    ck_assert_str_eq(s.log, "a=1;b=-;a=2;check;");
    ck_assert_str_eq(p.out, "");
    ck_assert_str_eq(p.err, "");
    /* argv parsed twice in one process: the loop starts over each time */
    s.log[0] = 0;
    ck_assert_int_eq(parse(5, a, &s).rc, CLI_GO);
    ck_assert_str_eq(s.log, "a=1;b=-;a=2;check;");
}
END_TEST

START_TEST(cli_parse_stops_at_help_and_names_what_it_refuses)
{
    static const char *const usage = "usage: pipedec t --alpha A [--beta]\n";
    seen s = {.fail_on = -1};
    static const char *const h[] = {"t", "--beta", "--help", "--alpha"};
    parsed p = parse(4, h, &s);
    ck_assert_int_eq(p.rc, CMD_EXIT_OK);
    ck_assert_str_eq(p.out, usage);
    ck_assert_str_eq(p.err, "");
    ck_assert_str_eq(s.log, "b=-;"); /* no check after --help */
    static const char *const unknown[] = {"t", "--gamma"};
    p = parse(2, unknown, &s);
    ck_assert_int_eq(p.rc, CMD_EXIT_USAGE);
    ck_assert_str_eq(p.out, "");
    ck_assert_str_eq(p.err, "pipedec t: unknown or incomplete option '--gamma'\nusage: pipedec t --alpha A [--beta]\n");
    static const char *const missing[] = {"t", "--alpha"};
    p = parse(2, missing, &s);
    ck_assert_int_eq(p.rc, CMD_EXIT_USAGE);
    ck_assert_str_eq(p.err, "pipedec t: unknown or incomplete option '--alpha'\nusage: pipedec t --alpha A [--beta]\n");
    static const char *const stray[] = {"t", "--beta", "stray"};
    p = parse(3, stray, &s);
    ck_assert_int_eq(p.rc, CMD_EXIT_USAGE);
    ck_assert_str_eq(p.err, "pipedec t: unexpected argument 'stray'\nusage: pipedec t --alpha A [--beta]\n");
    s = (seen){.fail_on = 'a'};
    static const char *const bad[] = {"t", "--alpha", "x", "--beta"};
    p = parse(4, bad, &s);
    ck_assert_int_eq(p.rc, CMD_EXIT_USAGE);
    ck_assert_str_eq(p.err, "pipedec t: --a 'x': bad\nusage: pipedec t --alpha A [--beta]\n");
    ck_assert_str_eq(s.log, "a=x;"); /* nothing after the failing flag, no check */
    /* the check's refusal reads the same way */
    s = (seen){.fail_on = -1, .refuse = 1};
    static const char *const none[] = {"t", "--beta"};
    p = parse(2, none, &s);
    ck_assert_int_eq(p.rc, CMD_EXIT_USAGE);
    ck_assert_str_eq(p.out, "");
    ck_assert_str_eq(p.err, "pipedec t: --alpha is required\nusage: pipedec t --alpha A [--beta]\n");
    ck_assert_str_eq(s.log, "b=-;check;");
}
END_TEST

START_TEST(cli_parse_with_null_streams_prints_nothing)
{
    /* the ranks of `run` but rank 0: the same verdicts, silently */
    static const char *const h[] = {"t", "--help"}, *const bad[] = {"t", "--gamma"},
                             *const ok[] = {"t", "--alpha", "1"};
    seen s = {.fail_on = -1};
    char *argv[4];
    ck_assert_int_eq(cli_parse(&parse_cmd, 2, (memcpy(argv, h, sizeof h), argv), &s, NULL, NULL), CMD_EXIT_OK);
    ck_assert_int_eq(cli_parse(&parse_cmd, 2, (memcpy(argv, bad, sizeof bad), argv), &s, NULL, NULL),
                     CMD_EXIT_USAGE);
    ck_assert_int_eq(cli_parse(&parse_cmd, 3, (memcpy(argv, ok, sizeof ok), argv), &s, NULL, NULL), CLI_GO);
    ck_assert_str_eq(s.log, "a=1;check;");
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
    tcase_add_test(tc, cli_parse_hands_every_flag_over_in_order_then_checks);
    tcase_add_test(tc, cli_parse_stops_at_help_and_names_what_it_refuses);
    tcase_add_test(tc, cli_parse_with_null_streams_prints_nothing);
    suite_add_tcase(s, tc);
    return s;
}
