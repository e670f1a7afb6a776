/* rebalance: the rule `--rebalance auto` (and slurm/rebalance) moves layers
 * by — from each stage's busy time over a window, propose the layer map
 * that minimises the slowest stage's predicted time, and say whether the
 * predicted gain is worth a migration.
 *
 * Model: a stage's busy time is spread evenly over its layers (a layer of
 * stage s costs busy[s] / count[s]; what the head and tail do besides their
 * layers is folded into their layers' cost, which overrates those layers a
 * little, so a move towards an end rank is predicted a little too good and
 * the next window corrects it). The proposal is layermap_balance_costs over
 * those costs; its predicted bottleneck is the largest sum of its stages'
 * layer costs. A move is proposed when
 *     (measured bottleneck - predicted bottleneck) / measured bottleneck
 *         > threshold
 * Hysteresis is the caller's: --rebalance auto waits `hold` windows after a
 * move before it measures again (a move changes what the window measured).
 * Pure computation: no MPI, same answer everywhere. */
#ifndef PD_RUNTIME_REBALANCE_H
#define PD_RUNTIME_REBALANCE_H

#include "base/status.h"
#include "cluster/runtime/plan/layermap.h"

#include <stdbool.h>

typedef struct rebalance_decision {
    bool move;               /* propose is worth migrating to */
    layermap propose;        /* the best map under the model (may equal cur) */
    double bottleneck;       /* measured: the largest busy time of cur */
    double predicted;        /* predicted largest stage time under propose */
    double gain;             /* (bottleneck - predicted) / bottleneck, 0 when idle */
} rebalance_decision;

/* busy[s]: seconds stage s computed during the window (>= 0). PD_ERR_ARG for
 * a negative or non-finite time; PD_ERR_NOMEM. */
pd_status rebalance_decide(const layermap *cur, const double *busy, double threshold, rebalance_decision *out,
                           pd_err *err);

#endif
