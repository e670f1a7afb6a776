/* cost: what one decode step of each part of a model costs, read from the
 * model file's tensor directory without loading a weight.
 *
 * A part is a layer, the head's embedding lookup or the tail's output step
 * (final norm, output projection, sampling). Its work is counted from the
 * tensors the stage really holds, at their stored GGUF types (F32 4 bytes per
 * weight, F16/BF16 2, Q8_0 34 per 32), so a quantized or mixed-precision file
 * gets its own numbers; cost_part_seconds turns the counts into a predicted
 * time (docs/ARCHITECTURE-cost.md has the rule, its constants and why).
 *
 * The rule, for R rows in a step and D attended rows per row:
 *
 *   bytes = weight_bytes + R * (row_bytes + D * attn_values * kv_value_bytes)
 *   flops = 2 * R * (macs + D * attn_macs)
 *   time  = max(bytes / bandwidth, flops / peak)
 *
 * Weights are read once per step for all its rows; cache rows and activation
 * rows once per row. All arithmetic is IEEE double with no library call, so
 * every rank that reads the same file computes the same bits. */
#ifndef PD_COST_H
#define PD_COST_H

#include "base/status.h"

#include <stdint.h>

/* Counts for one part of the model; every field is a pure function of the
 * file's tensor directory and hyperparameters. */
typedef struct cost_part {
    uint64_t weight_bytes; /* weights read once per step: matrices at their stored type,
                              norms and biases at 4 bytes (they are kept as f32) */
    uint64_t macs;         /* multiply-adds per row outside attention: ne0 x ne1 per matrix
                              (dense: every weight is active), ne0 per norm or bias; an
                              MoE layer's routed experts count expert_used_count experts
                              (the active parameters), their weight_bytes all experts */
    uint64_t row_bytes;    /* other bytes per row: the embedding row the head reads,
                              the logits row the tail writes and sampling reads */
    uint64_t attn_values;  /* cache values read per row per attended row:
                              K and V of every KV head (2 x kv_heads x head_dim) */
    uint64_t attn_macs;    /* multiply-adds per row per attended row:
                              q.k and p.v of every query head (2 x heads x head_dim) */
} cost_part;

/* The machine and the operating point a prediction is made for. */
typedef struct cost_rule {
    double bandwidth;      /* bytes/s read from memory */
    double peak;           /* FLOP/s of the GEMM at large batch */
    uint32_t rows;         /* rows per micro-batch step (>= 1) */
    uint32_t depth;        /* attended rows per row; clipped to the model's context */
    double kv_value_bytes; /* bytes per cached K/V value (f32 cache: 4) */
} cost_rule;

/* Defaults (ARCHITECTURE.md §7, measured on one core of the CI machine):
 * bandwidth 19.6e9 B/s, peak 82e9 FLOP/s, rows 4, depth 512, kv_value_bytes 4. */
#define COST_BANDWIDTH 19.6e9
#define COST_PEAK 82e9
#define COST_ROWS 4u
#define COST_DEPTH 512u
#define COST_KV_VALUE_BYTES 4.0

void cost_rule_default(cost_rule *r);

/* PD_ERR_ARG naming the field when bandwidth, peak or kv_value_bytes is not a
 * positive finite number or rows is 0. */
pd_status cost_rule_validate(const cost_rule *r, pd_err *err);

/* Predicted seconds of one step of p under r with `depth` attended rows (the
 * caller clips it; cost_table_units uses min(r->depth, context)). r must be
 * valid (cost_rule_validate). */
double cost_part_seconds(const cost_part *p, const cost_rule *r, uint32_t depth);

/* The per-part counts of one model file; opaque, immutable once read. */
typedef struct cost_table cost_table;

/* Opens path, reads the hyperparameters (as model_read_hparams does) and the
 * tensor directory, and counts every part. Refuses what model_load would
 * refuse for the parts it counts: a missing tensor, a shape other than the
 * hyperparameters say, a type other than F32/F16/BF16/Q8_0 (naming the
 * tensor). Returns owned *out (free with cost_table_free); *out untouched on
 * failure. */
pd_status cost_table_read(const char *path, cost_table **out, pd_err *err);
/* cost_table_free(NULL) is a no-op. */
void cost_table_free(cost_table *t);

uint32_t cost_table_layers(const cost_table *t);
/* context_length of the model (the most rows a row can attend). */
uint32_t cost_table_ctx(const cost_table *t);
/* Layer i (0-based, < cost_table_layers); borrowed from t. */
const cost_part *cost_table_layer(const cost_table *t, uint32_t i);
/* Embedding lookup on the head stage; borrowed from t. */
const cost_part *cost_table_head(const cost_table *t);
/* Final norm, output projection (output.weight, or token_embd.weight when
 * tied) and sampling on the last stage; borrowed from t. */
const cost_part *cost_table_tail(const cost_table *t);

/* Predicted step times in integer picoseconds (rounded to nearest), the unit
 * layermap_balance_costs takes: layer[0 .. cost_table_layers) (caller array),
 * *head, *tail. PD_ERR_ARG for an invalid rule, PD_ERR_RANGE when a time does
 * not fit in 2^62 ps (53 days); outputs untouched on failure. */
pd_status cost_table_units(const cost_table *t, const cost_rule *r, uint64_t *layer, uint64_t *head,
                           uint64_t *tail, pd_err *err);

/* What the run's average page asks of the pipeline, from its page manifest:
 * the rows it prefills and the tokens it may generate (max_new_tokens, an
 * upper bound: a page may stop early). A page's prefill passes in micro-batches
 * of prefill_rows_per_batch rows (its chunk plus the decode rows riding along);
 * its decoding shares micro-batches of decode_rows rows with
 * decode_streams - 1 other streams, one micro-batch per generated token. */
typedef struct cost_mix {
    double prefill_rows;             /* mean prefill rows per page (>= 0) */
    double new_tokens;               /* mean max_new_tokens per page (>= 0) */
    uint32_t prefill_rows_per_batch; /* rows of a prefill micro-batch (>= 1) */
    uint32_t decode_rows;            /* rows of a decode micro-batch (>= 1; drafts included) */
    uint32_t decode_streams;         /* streams of a decode micro-batch (1 .. decode_rows) */
} cost_mix;

/* Predicted time one average page of mix brings to each part, in integer
 * picoseconds (the unit layermap_balance_costs takes), under r's machine
 * (bandwidth, peak, kv_value_bytes; r->rows and r->depth are not used: the
 * mix gives both):
 *
 *   part = prefill_rows / prefill_rows_per_batch x step(prefill_rows_per_batch
 *                                                     rows, depth prefill_rows / 2)
 *        + new_tokens / decode_streams x step(decode_rows rows,
 *                                             depth prefill_rows + new_tokens / 2)
 *
 * except that the tail's prefill share is one step of one row: a page's
 * prefill needs logits only for its last row. Depths are clipped to the
 * model's context. A mix with no rows at all (both means 0) is refused:
 * the caller falls back to cost_table_units. Outputs untouched on failure;
 * PD_ERR_RANGE when a time does not fit in 2^62 ps. */
pd_status cost_table_mix_units(const cost_table *t, const cost_rule *r, const cost_mix *mix, uint64_t *layer,
                               uint64_t *head, uint64_t *tail, pd_err *err);

#endif
