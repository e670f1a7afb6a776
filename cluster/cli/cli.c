/* cli: flag value parsing shared by the subcommands. */
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

pd_status cli_u32(const char *flag, const char *s, uint32_t lo, uint32_t hi, uint32_t *out, pd_err *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = (s && *s && *s != '-' && *s != '+') ? strtoull(s, &end, 10) : 0;
    if (!s || !*s || *s == '-' || *s == '+' || errno || !end || *end || v < lo || v > hi)
        return pd_err_set(err, PD_ERR_ARG, "%s '%s': expected an integer in %u..%u", flag, s ? s : "", lo, hi);
    *out = (uint32_t)v;
    return PD_OK;
}

pd_status cli_u64(const char *flag, const char *s, uint64_t *out, pd_err *err)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = (s && *s && *s != '-' && *s != '+') ? strtoull(s, &end, 10) : 0;
    if (!s || !*s || *s == '-' || *s == '+' || errno || !end || *end)
        return pd_err_set(err, PD_ERR_ARG, "%s '%s': expected a non-negative integer", flag, s ? s : "");
    *out = (uint64_t)v;
    return PD_OK;
}

pd_status cli_choice(const char *flag, const char *s, const char *const *names, int n, int *out, pd_err *err)
{
    for (int i = 0; s && i < n; i++)
        if (strcmp(s, names[i]) == 0) {
            *out = i;
            return PD_OK;
        }
    char list[256] = "";
    for (int i = 0, k = 0; i < n && (size_t)k < sizeof list; i++)
        k += snprintf(list + k, sizeof list - (size_t)k, "%s%s", i == 0 ? "" : i + 1 < n ? ", " : " or ", names[i]);
    return pd_err_set(err, PD_ERR_ARG, "%s '%s': expected %s", flag, s ? s : "", list);
}

/* The getopt loop: every flag into ctx, then cmd->check; *help on --help. */
static pd_status cli_flags(const cli_cmd *cmd, int argc, char **argv, void *ctx, bool *help, pd_err *err)
{
    *help = false;
    optind = 1;
    opterr = 0;
    int ch;
    while ((ch = getopt_long(argc, argv, "", cmd->opts, NULL)) != -1) {
        if (ch == 'h') {
            *help = true;
            return PD_OK;
        }
        if (ch == '?' || ch == ':')
            return pd_err_set(err, PD_ERR_ARG, "unknown or incomplete option '%s'", argv[optind - 1]);
        pd_status st = cmd->flag(ctx, ch, optarg, err);
        if (st != PD_OK)
            return st;
    }
    if (optind < argc)
        return pd_err_set(err, PD_ERR_ARG, "unexpected argument '%s'", argv[optind]);
    return cmd->check ? cmd->check(ctx, err) : PD_OK;
}

int cli_parse(const cli_cmd *cmd, int argc, char **argv, void *ctx, FILE *out, FILE *err)
{
    bool help = false;
    pd_err e = {0};
    if (cli_flags(cmd, argc, argv, ctx, &help, &e) != PD_OK) {
        if (err) {
            fprintf(err, "pipedec %s: %s\n", cmd->name, e.msg);
            cmd->usage(err);
        }
        return CMD_EXIT_USAGE;
    }
    if (help) {
        if (out)
            cmd->usage(out);
        return CMD_EXIT_OK;
    }
    return CLI_GO;
}
