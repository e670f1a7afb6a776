/* trace: the --trace-hidden writer of one rank — a hash of every residual row
 * at every layer boundary this rank's stage produces, keyed by page, so two
 * runs can be compared layer by layer (scripts/trace_diff.py; the file format
 * is in docs/digests.md).
 *
 * Owns its FILE and a table stream id -> page key for the streams this rank
 * holds. Writes go through stdio's buffer; nothing is written when tracing
 * is off (trace_open is not called). */
#ifndef PD_RUNTIME_TRACE_H
#define PD_RUNTIME_TRACE_H

#include "base/status.h"
#include "cluster/format/pages.h"
#include "comm/batch.h"

#include <stdint.h>

typedef struct trace trace;

/* Creates path (rank 0) or path.RANK (rank > 0) and writes the header; rank 0
 * (pg != NULL) also lists every page of the manifest with its key. */
pd_status trace_open(const char *path, int rank, int size, uint32_t hidden, uint32_t max_streams,
                     const pages *pg, trace **out, pd_err *err);
/* Flushes and closes; reports a failed write on stderr. NULL is a no-op. */
void trace_close(trace *t);

/* Follows a micro-batch header: forgets retired streams, learns admitted ones. */
void trace_lifecycle(trace *t, const mb_admit *admit, uint32_t na, const uint64_t *retire, uint32_t nr);

/* stage_config.trace: one line per row of x at `boundary`. */
void trace_rows(void *t, uint32_t boundary, const mb_row *rows, uint32_t n, const float *x);

#endif
