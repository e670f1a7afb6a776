/* cli: small helpers the subcommands share for parsing flag values, so every
 * bad value is reported the same way ("--batch 'x': expected an integer in
 * 1..4096"). */
#ifndef PD_CLI_H
#define PD_CLI_H

#include "base/status.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdint.h>

pd_status cli_u32(const char *flag, const char *s, uint32_t lo, uint32_t hi, uint32_t *out, pd_err *err);
pd_status cli_u64(const char *flag, const char *s, uint64_t *out, pd_err *err);
/* s as one of names[0..n) (n >= 1): *out its index, else PD_ERR_ARG
 * ("--gemm 'x': expected invariant or openblas") and *out unchanged. */
pd_status cli_choice(const char *flag, const char *s, const char *const *names, int n, int *out, pd_err *err);

/* One flag of a subcommand into its options (ctx): getopt_long's code ch and
 * its value arg (NULL for a flag without one); PD_ERR_ARG with err naming
 * the flag on a bad value. */
typedef pd_status cli_flag_fn(void *ctx, int ch, const char *arg, pd_err *err);

/* The option loop every subcommand runs: argv[1..argc) by getopt_long over
 * opts (long options only, getopt's own messages off), each flag through
 * flag(ctx, ...) until one fails. Code 'h' is --help: *help is set and the
 * parse stops with PD_OK. An unknown flag or one missing its value is
 * PD_ERR_ARG "unknown or incomplete option 'X'", an argument after the flags
 * PD_ERR_ARG "unexpected argument 'X'". */
pd_status cli_parse(int argc, char **argv, const struct option *opts, cli_flag_fn *flag, void *ctx, bool *help,
                    pd_err *err);

#endif
