/* cli: small helpers the subcommands share for parsing flag values, so every
 * bad value is reported the same way ("--batch 'x': expected an integer in
 * 1..4096"). */
#ifndef PD_CLI_H
#define PD_CLI_H

#include "base/status.h"

#include <stdint.h>

pd_status cli_u32(const char *flag, const char *s, uint32_t lo, uint32_t hi, uint32_t *out, pd_err *err);
pd_status cli_u64(const char *flag, const char *s, uint64_t *out, pd_err *err);
/* s as one of names[0..n) (n >= 1): *out its index, else PD_ERR_ARG
 * ("--gemm 'x': expected invariant or openblas") and *out unchanged. */
pd_status cli_choice(const char *flag, const char *s, const char *const *names, int n, int *out, pd_err *err);

#endif
