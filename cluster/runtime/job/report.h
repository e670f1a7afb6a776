/* report: what a run tells its user — every rank's placement at start, and
 * at the end the summary line and the --stats JSON (per stage: layers,
 * busy / waiting times, messages, bytes, micro-batches, rows, cache peaks,
 * placement; overall pages, tokens, tokens/s).
 *
 * Every rank's figures travel to rank 0 as fixed-size records gathered
 * through comm/ (placement text, msg_stats): collectives every rank calls. */
#ifndef PD_RUNTIME_REPORT_H
#define PD_RUNTIME_REPORT_H

#include "base/status.h"
#include "cluster/runtime/loop/head.h"
#include "cluster/runtime/rank/rank.h"

/* Placement lines of every rank, printed by rank 0 in rank order with the
 * run's header line, then those of the encoder ranks (img: the head's
 * encoder, NULL elsewhere or without --mmproj; each encoder rank's line
 * comes from rank_place_encoder through pageimg_placements). Collective.
 * The JSON form of each placement is kept for report_end's --stats
 * ("stages"[k].placement, "encoders"[k].placement; owned by rep,
 * report_free). */
typedef struct report report;
pd_status report_start(rank *r, pageimg *img, report **out, pd_err *err);

/* Gathers every rank's counters; rank 0 (h != NULL) writes --stats (with
 * "exit_status": the status the run is about to exit with, exit_status) and
 * prints the summary line. Collective, and no rank returns before rank 0 has
 * written both: a launcher that ends the job when the first rank exits with
 * a non-zero status (srun --kill-on-bad-exit) can cut only rank 0's teardown
 * short, never its record of how the run ended. */
pd_status report_end(report *rep, rank *r, head *h, int exit_status, pd_err *err);
void report_free(report *rep);

#endif
