/* Status names and the error-detail buffer. */
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char *const pd_status_names[] = {
    [PD_OK] = "ok",
    [PD_ERR_ARG] = "invalid argument",
    [PD_ERR_NOMEM] = "out of memory",
    [PD_ERR_IO] = "i/o error",
    [PD_ERR_FORMAT] = "format error",
    [PD_ERR_TRUNCATED] = "truncated input",
    [PD_ERR_VERSION] = "unsupported version",
    [PD_ERR_UNSUPPORTED] = "unsupported",
    [PD_ERR_MISMATCH] = "mismatch",
    [PD_ERR_RANGE] = "out of range",
    [PD_ERR_CHECKSUM] = "checksum mismatch",
    [PD_ERR_REFUSED] = "refused",
    [PD_ERR_MPI] = "mpi error",
    [PD_ERR_TOPOLOGY] = "topology error",
    [PD_ERR_STALLED] = "stalled",
};
_Static_assert(sizeof pd_status_names / sizeof pd_status_names[0] == PD_STATUS_COUNT,
               "pd_status_names must name every pd_status");

const char *pd_status_str(pd_status s)
{
    if ((unsigned)s >= PD_STATUS_COUNT || !pd_status_names[s])
        return "unknown status";
    return pd_status_names[s];
}

pd_status pd_err_set(pd_err *err, pd_status s, const char *fmt, ...)
{
    if (!err || s == PD_OK)
        return s;
    if (err->status != PD_OK)
        return s; /* the first failure sticks */
    err->status = s;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return s;
}

void pd_err_prefix(pd_err *err, const char *fmt, ...)
{
    if (!err)
        return;
    char head[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(head, sizeof head, fmt, ap);
    va_end(ap);
    char tmp[sizeof err->msg];
    _Static_assert(sizeof head + 2 < sizeof tmp, "the head and \": \" fit whole");
    size_t hl = strnlen(head, sizeof head);
    if (hl > sizeof head - 1) /* never: vsnprintf terminated it (said for the optimiser) */
        hl = sizeof head - 1;
    memcpy(tmp, head, hl);
    memcpy(tmp + hl, ": ", 2);
    size_t rest = sizeof tmp - hl - 3;
    size_t ml = strnlen(err->msg, sizeof err->msg);
    if (ml > rest)
        ml = rest;
    memcpy(tmp + hl + 2, err->msg, ml);
    tmp[hl + 2 + ml] = '\0';
    memcpy(err->msg, tmp, sizeof tmp);
}

void pd_err_clear(pd_err *err)
{
    if (!err)
        return;
    err->status = PD_OK;
    err->msg[0] = '\0';
}
