/* The project-wide status code and error-detail buffer.
 *
 * Every function that can fail on bad input returns a pd_status and, when it
 * fails, fills a caller-owned pd_err with what went wrong and where
 * ("wire: offset 132: head 3 claims 4096 values, 512 bytes remain").
 * Failure leaves the target unchanged (ARCHITECTURE.md §9). Broken internal
 * invariants are not statuses: they abort through CHECK (check.h). */
#ifndef PD_STATUS_H
#define PD_STATUS_H

#include <stddef.h>

typedef enum pd_status {
    PD_OK = 0,
    PD_ERR_ARG,         /* a caller passed an invalid argument or flag */
    PD_ERR_NOMEM,       /* an allocation failed or a size overflowed */
    PD_ERR_IO,          /* a file or device operation failed */
    PD_ERR_FORMAT,      /* bytes do not follow the format (bad magic, field, count) */
    PD_ERR_TRUNCATED,   /* the input ended before the format said it would */
    PD_ERR_VERSION,     /* a format version this build does not read */
    PD_ERR_UNSUPPORTED, /* a well-formed request this build does not implement */
    PD_ERR_MISMATCH,    /* identity, layer or geometry does not match the target */
    PD_ERR_RANGE,       /* an index, count or capacity is out of range */
    PD_ERR_CHECKSUM,    /* a checksum does not match the bytes it covers */
    PD_ERR_REFUSED,     /* a valid request refused to keep state lossless */
    PD_ERR_MPI,         /* an MPI call failed */
    PD_ERR_TOPOLOGY,    /* hwloc could not bind, place or verify */
    PD_ERR_STALLED,     /* a peer made no progress within the stall timeout */
    PD_STATUS_COUNT
} pd_status;

/* Error detail: a status and a message. Zero-initialize before use. */
typedef struct pd_err {
    pd_status status;
    char msg[512];
} pd_err;

/* Short constant name of a status ("format error"); never NULL. */
const char *pd_status_str(pd_status s);

/* Records the status and a printf-style message in err (which may be NULL)
 * and returns s, so failures read `return pd_err_set(err, PD_ERR_FORMAT, ...)`.
 * The first failure sticks: a later call on an err that already holds a
 * failure keeps the earlier message unless pd_err_clear ran in between. */
pd_status pd_err_set(pd_err *err, pd_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes the existing message with "ctx: " (used when a caller adds where). */
void pd_err_prefix(pd_err *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Resets err to PD_OK with an empty message. */
void pd_err_clear(pd_err *err);

#endif
