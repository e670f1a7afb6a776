/* rebalance: proposing a layer map from measured stage times (rebalance.h). */
#include "cluster/runtime/plan/rebalance.h"

#include <math.h>
#include <stdlib.h>

pd_status rebalance_decide(const layermap *cur, const double *busy, double threshold, rebalance_decision *out,
                           pd_err *err)
{
    uint32_t S = cur->n_stages, NL = cur->first[S - 1] + cur->count[S - 1];
    double worst = 0;
    for (uint32_t s = 0; s < S; s++) {
        if (!(busy[s] >= 0) || !isfinite(busy[s]))
            return pd_err_set(err, PD_ERR_ARG, "rebalance: stage %u's busy time %g is not a time", s, busy[s]);
        if (busy[s] > worst)
            worst = busy[s];
    }
    rebalance_decision d = {.propose = *cur, .bottleneck = worst, .predicted = worst};
    if (worst <= 0) {
        *out = d;
        return PD_OK;
    }
    uint64_t *cost = calloc(NL, sizeof *cost);
    if (!cost)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    /* nanoseconds, at least 1 so every layer weighs something */
    for (uint32_t s = 0; s < S; s++)
        for (uint32_t L = cur->first[s]; L < cur->first[s] + cur->count[s]; L++) {
            double c = busy[s] / cur->count[s] * 1e9;
            cost[L] = c < 1 ? 1 : (uint64_t)c;
        }
    pd_status st = layermap_balance_costs(S, NL, cost, 0, 0, &d.propose, err);
    if (st == PD_OK) {
        double pred = 0;
        for (uint32_t s = 0; s < S; s++) {
            double t = (double)layermap_stage_cost(&d.propose, s, cost, 0, 0) * 1e-9;
            if (t > pred)
                pred = t;
        }
        d.predicted = pred;
        d.gain = (worst - pred) / worst;
        bool differs = false;
        for (uint32_t s = 0; s < S; s++)
            differs |= d.propose.first[s] != cur->first[s] || d.propose.count[s] != cur->count[s];
        d.move = differs && d.gain > threshold;
        *out = d;
    }
    free(cost);
    return st;
}
