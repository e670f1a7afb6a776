/* cli: what the subcommands share for their command lines: parsing flag
 * values, so every bad value is reported the same way ("--batch 'x':
 * expected an integer in 1..4096"), and the option prologue (flags, --help,
 * the refusal and usage) written once in cli_parse. */
#ifndef PD_CLI_H
#define PD_CLI_H

#include "base/status.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

pd_status cli_u32(const char *flag, const char *s, uint32_t lo, uint32_t hi, uint32_t *out, pd_err *err);
pd_status cli_u64(const char *flag, const char *s, uint64_t *out, pd_err *err);
/* s as one of names[0..n) (n >= 1): *out its index, else PD_ERR_ARG
 * ("--gemm 'x': expected invariant or openblas") and *out unchanged. */
pd_status cli_choice(const char *flag, const char *s, const char *const *names, int n, int *out, pd_err *err);

/* One flag of a subcommand into its options (ctx): getopt_long's code ch and
 * its value arg (NULL for a flag without one); PD_ERR_ARG with err naming
 * the flag on a bad value. Every code of the option table has its case; any
 * other code is an internal error (CHECK), never a silent default. */
typedef pd_status cli_flag_fn(void *ctx, int ch, const char *arg, pd_err *err);

/* A subcommand's command line, what cli_parse needs to run its prologue. */
typedef struct cli_cmd {
    const char *name;          /* "shard": messages read "pipedec shard: ..." */
    const struct option *opts; /* getopt_long table, long options only; code 'h' is --help */
    cli_flag_fn *flag;         /* one flag into ctx */
    /* NULL, or what no single flag can check (the required flags, flags that
     * need another), run once every flag is in: PD_ERR_ARG and why */
    pd_status (*check)(void *ctx, pd_err *err);
    void (*usage)(FILE *f); /* the --help text */
} cli_cmd;

/* cli_parse's "carry on"; any other value is the subcommand's exit status. */
enum { CLI_GO = -1 };

/* The prologue every subcommand runs: argv[1..argc) by getopt_long over
 * cmd->opts (getopt's own messages off), each flag through cmd->flag(ctx,
 * ...) until one fails, then cmd->check(ctx). --help stops the parse: the
 * usage on out, CMD_EXIT_OK. A refusal prints "pipedec <name>: <why>" and
 * the usage on err and gives CMD_EXIT_USAGE; getopt's refusals read
 * "unknown or incomplete option 'X'" (an unknown flag, or one missing its
 * value) and "unexpected argument 'X'" (an argument after the flags).
 * Otherwise CLI_GO. out or err NULL: that stream stays silent (the ranks of
 * `run` but rank 0). */
int cli_parse(const cli_cmd *cmd, int argc, char **argv, void *ctx, FILE *out, FILE *err);

#endif
