/* layermap: which contiguous layer range each pipeline stage (rank) owns.
 *
 * Explicit maps are written "0-3,4-7,8-11" (one range per rank, in rank order;
 * "5" is the one-layer range 5-5). They must cover 0..n_layers-1 exactly once,
 * in order, with no gap or overlap, one non-empty range per rank.
 *
 * Without a map the layers are split to minimize the most expensive stage
 * (the pipeline runs at the pace of its slowest stage, ARCHITECTURE.md §7).
 * A stage costs the sum of its layers' costs, plus the head's extra (the
 * embedding lookup) on stage 0 and the tail's extra (final norm, output
 * projection, sampling) on the last stage. layermap_for_model takes the costs
 * from the model file (cluster/model/cost.h: predicted step times of each
 * layer at its real tensor types); docs/ARCHITECTURE-cost.md explains both. */
#ifndef PD_LAYERMAP_H
#define PD_LAYERMAP_H

#include "base/status.h"
#include "cluster/model/cost.h"

#include <stddef.h>
#include <stdint.h>

#define LAYERMAP_MAX_STAGES 256u

typedef struct layermap {
    uint32_t n_stages;
    uint32_t first[LAYERMAP_MAX_STAGES]; /* first layer of stage s */
    uint32_t count[LAYERMAP_MAX_STAGES]; /* layers of stage s (>= 1) */
} layermap;

/* Parses an explicit map for n_stages ranks and n_layers layers; *out is
 * written only on success; errors name the offending part. */
pd_status layermap_parse(const char *s, uint32_t n_stages, uint32_t n_layers, layermap *out,
                         pd_err *err);

/* Balanced split for per-layer costs: layer_cost[0 .. n_layers) (any unit, e.g.
 * picoseconds from cost_table_units), head_cost added to stage 0 and
 * tail_cost to stage n_stages - 1. *out is written only on success.
 *
 * Result: among all maps (contiguous, in order, >= 1 layer per stage) it has
 * the smallest bottleneck, the largest stage cost; among those, the smallest
 * sum of squared stage costs (the load is spread as evenly as the bottleneck
 * allows, so a stage is not left nearly idle; compared in double precision,
 * the bottleneck itself exactly); remaining ties give later stages
 * fewer layers (the last stage takes the fewest it can, then the one before
 * it, ...). Deterministic: every rank computes the same map from the same costs.
 *
 * Algorithm: stage 0 always holds layer 0 and the last stage layer n-1, so the
 * extras are folded into those layers' costs. The bottleneck B is found
 * exactly (integers) by binary search over [max cost, total]: B is feasible
 * iff greedy front-to-back packing (a stage takes layers while its sum stays
 * <= B) needs <= n_stages stages, and then exactly n_stages non-empty stages
 * also fit (splitting never raises a sum). Then a dynamic program over
 * (stage, last layer) minimizes the sum of squares using only stages whose
 * cost is <= B: O(n_stages x n_layers x w) time, w the most layers one stage
 * can hold under B (n_layers at worst), and n_stages x n_layers x 4 bytes.
 *
 * Errors: PD_ERR_ARG when n_stages is 0 or above LAYERMAP_MAX_STAGES, or
 * there are fewer layers than stages ("fewer than"); PD_ERR_RANGE when the
 * costs add up past 2^64; PD_ERR_NOMEM. */
pd_status layermap_balance_costs(uint32_t n_stages, uint32_t n_layers, const uint64_t *layer_cost,
                                 uint64_t head_cost, uint64_t tail_cost, layermap *out, pd_err *err);

/* Cost of stage s of m under the same costs (saturates at UINT64_MAX). */
uint64_t layermap_stage_cost(const layermap *m, uint32_t s, const uint64_t *layer_cost, uint64_t head_cost,
                             uint64_t tail_cost);

/* The same split with one cost for every layer and none on the head.
 * Transitional: the start-up's current call; it goes once the start-up calls
 * layermap_for_model. */
pd_status layermap_balance(uint32_t n_stages, uint32_t n_layers, uint64_t layer_cost,
                           uint64_t tail_cost, layermap *out, pd_err *err);

/* The default map of a run: reads model_path's cost table (cost_table_read),
 * predicts each part's cost under rule (NULL = cost_rule_default) and
 * balances them over n_stages with layermap_balance_costs. The cost is one
 * step at the rule's operating point (rows, depth) when mix is NULL, else
 * what an average page of the run's mix brings to the part
 * (cost_table_mix_units: its prefill micro-batches and its decode
 * micro-batches, weighed by how many of each it needs). Errors name the
 * file, the tensor or the reason (e.g. fewer layers than ranks). */
pd_status layermap_for_model(const char *model_path, uint32_t n_stages, const cost_rule *rule, const cost_mix *mix,
                             layermap *out, pd_err *err);

/* "0-3,4-7,8-11" */
void layermap_format(const layermap *m, char *buf, size_t cap);

/* The stage that holds `layer` (which must be in the map: CHECK). */
uint32_t layermap_owner(const layermap *m, uint32_t layer);

#endif
