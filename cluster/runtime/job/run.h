/* run: one rank's part of `pipedec run` — start-up (rank.h, head.h), the
 * loop of its role (head.h on rank 0, follow.h elsewhere), and the report
 * (report.h).
 *
 * Rank 0 is the head (scheduler, embeddings, output file), rank N-1 the tail
 * (final norm, output projection, sampling); one rank is both and sends no
 * message. Start-up errors on any rank are agreed on collectively so every
 * rank exits non-zero with the cause printed by the rank that saw it. Errors
 * after start-up cannot be agreed on (a peer may be blocked in a receive):
 * run_main reports them and returns RUN_EXIT_ABORT, and the CLI ends the
 * whole job. The stream protocol between head, stages and tail is in
 * sched.h; docs/ARCHITECTURE.md draws the whole. */
#ifndef PD_RUN_H
#define PD_RUN_H

#include "cluster/runtime/rank/run_opts.h"

#include <mpi.h>

/* Runs this rank. Returns RUN_EXIT_OK, RUN_EXIT_FAIL (start-up failed on
 * some rank; every rank returns it, nothing was decoded) or RUN_EXIT_ABORT
 * (this rank failed after start-up; the caller must end the job, e.g.
 * pipe_abort / MPI_Abort). hooks may be NULL. */
int run_main(const run_opts *o, MPI_Comm world, const run_hooks *hooks);

#endif
