/* follow: the loop of every rank but the head — receive the next message
 * from the previous stage, apply its admissions and retirements, run the
 * rows through this rank's layers, and pass the rows on (a middle stage) or
 * sample them and send the results to the head (the tail). Drain messages
 * are passed on first, then the drain action runs here; a stop message is
 * passed on and ends the loop.
 *
 * Owns nothing between calls but the decode buffers of one batch; receives
 * go through the rank's transport (two pre-posted, so the next micro-batch
 * arrives while this one computes).
 *
 * INV: micro-batches arrive and run in the order the head formed them
 *      (seq 0, 1, 2, ...); a drain message's step equals the batches run so
 *      far (checked: a stage that missed a batch fails the run). */
#ifndef PD_RUNTIME_FOLLOW_H
#define PD_RUNTIME_FOLLOW_H

#include "base/status.h"
#include "cluster/runtime/rank/rank.h"
#include "cluster/runtime/rank/run_opts.h"

/* Runs until the stop message. hooks may be NULL. */
pd_status follow_loop(rank *r, const run_hooks *hooks, pd_err *err);

#endif
