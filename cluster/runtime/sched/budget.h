/* budget: the admission memory budget (--mem-limit) — how many cache bytes
 * each rank may hold for its streams, and the head's accounting of what the
 * admitted streams will take on every rank, so a page waits for memory
 * instead of overcommitting, and a page that cannot fit even alone fails by
 * itself instead of killing the job.
 *
 * A stream's cache bytes on a rank are predicted from the page's prefill
 * rows and max_new_tokens, the rank's layer count and the cache policy
 * (stage_stream_bytes_estimate, plus a fixed per-layer allowance for the
 * allocator's rounding); the prediction is reserved on every rank at
 * admission and released when the stream ends.
 *
 * INV: reserved[r] <= limit[r] for every rank r; peak[r] >= reserved[r]. */
#ifndef PD_RUNTIME_BUDGET_H
#define PD_RUNTIME_BUDGET_H

#include "base/status.h"
#include "cluster/model/model.h"
#include "cluster/runtime/plan/policy.h"
#include "cluster/runtime/sched/sched.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct budget budget;

/* Per rank r of n: limit[r] cache bytes (UINT64_MAX = unlimited), and its
 * layers first[r] .. first[r] + layers[r] - 1. Copies the arrays. */
pd_status budget_new(const model_hparams *hp, const cache_policy *pol, int n, const uint64_t *limit,
                     const uint32_t *first, const uint32_t *layers, budget **out, pd_err *err);
void budget_free(budget *b);

/* Cache bytes a stream of this page needs on rank r. */
uint64_t budget_stream_bytes(const budget *b, int r, uint64_t prefill_rows, uint32_t max_new);

/* sched_admit_fn / sched_release_fn over a budget (ctx = the budget). */
sched_admit budget_admit(void *ctx, size_t page, uint64_t prefill_rows, uint32_t max_new, char *why, size_t cap);
void budget_release(void *ctx, size_t page, uint64_t prefill_rows, uint32_t max_new);

/* A new layer map (live migration): first/layers[n] replace the ranks'
 * ranges, and every alive stream's reservation (prefill_rows[i],
 * max_new[i], i < n_streams: exactly the streams admitted and not yet
 * released) is recomputed under them. PD_ERR_RANGE when some rank's
 * reservations would pass its limit (why names the rank, its new layers,
 * the bytes and the limit): then nothing changed. dry_run checks only. */
pd_status budget_remap(budget *b, const uint32_t *first, const uint32_t *layers, const uint64_t *prefill_rows,
                       const uint32_t *max_new, uint32_t n_streams, bool dry_run, pd_err *err);

/* Largest reservation seen on rank r, and its limit. */
uint64_t budget_peak(const budget *b, int r);
uint64_t budget_limit(const budget *b, int r);

/* --mem-limit: "auto", "none" or a byte count with an optional K/M/G/T
 * suffix (powers of 1024). *out: 0 = auto, UINT64_MAX = none. */
pd_status budget_parse(const char *s, uint64_t *out, pd_err *err);

/* The automatic per-rank cache budget: 85 % of the node's available memory
 * (MemAvailable, read now: after every rank of the node loaded its weights)
 * shared by the node's ranks. PD_ERR_IO when /proc/meminfo cannot be read. */
pd_status budget_auto(int ranks_on_node, uint64_t *out, pd_err *err);

#endif
