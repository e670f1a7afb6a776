/* layermap: which contiguous layer range each pipeline stage (rank) owns.
 *
 * Explicit maps are written "0-3,4-7,8-11" (one range per rank, in rank order;
 * "5" is the one-layer range 5-5). They must cover 0..n_layers-1 exactly once,
 * in order, with no gap or overlap, one non-empty range per rank.
 * Without a map the layers are split to minimize the most expensive stage,
 * where a stage costs the bytes of its layers' weights (per-token work is
 * proportional to them in a dense model) plus, on the last stage, the output
 * projection (vocab x hidden). */
#ifndef PD_LAYERMAP_H
#define PD_LAYERMAP_H

#include "base/status.h"

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

/* Balanced split: layer_cost (same for every layer) and tail_cost added to the
 * last stage. PD_ERR_ARG when there are fewer layers than stages. */
pd_status layermap_balance(uint32_t n_stages, uint32_t n_layers, uint64_t layer_cost,
                           uint64_t tail_cost, layermap *out, pd_err *err);

/* "0-3,4-7,8-11" */
void layermap_format(const layermap *m, char *buf, size_t cap);

#endif
