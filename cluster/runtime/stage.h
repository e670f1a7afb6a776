/* stage: one pipeline stage — a contiguous layer range, the per-stream caches
 * of those layers, and the forward pass of a micro-batch through them.
 *
 * With one rank the stage holds every layer (head and tail are the same
 * process). Each stream gets, per layer, a kv_layer (full / window policies)
 * or a ring_layer (rswa) at admission; caches come from the stage's allocator
 * (a NUMA arena in the cluster). All scratch is sized at creation from
 * max_rows: stage_forward never allocates.
 *
 * Exactness: rows of many streams share each GEMM (row-invariant kernel);
 * attention runs per stream against its own cache; a prefill chunk's row i
 * attends exactly the first i + 1 rows. So a stream's hidden states never
 * depend on which other rows share the micro-batch or how its prefill was
 * chunked. */
#ifndef PD_STAGE_H
#define PD_STAGE_H

#include "base/status.h"
#include "cluster/model/model.h"
#include "cluster/runtime/policy.h"
#include "cluster/model/pool.h"
#include "comm/batch.h"

#include <stdint.h>

typedef struct stage stage;

typedef struct stage_config {
    const model *m;           /* borrowed: the layers this stage runs */
    cache_policy policy;
    uint32_t max_rows;        /* rows per micro-batch */
    uint32_t max_streams;     /* streams alive at once */
    pool *pool;               /* borrowed, may be NULL (single thread) */
    const pd_alloc *cache_alloc; /* borrowed: cache memory (NULL = malloc) */
    /* Called between the GEMMs of a forward pass (may be NULL). The runtime
     * uses it to let MPI move its outstanding non-blocking messages while
     * the stage computes: without it a large Isend only progresses when the
     * sender next enters MPI, which stalls the next stage. */
    void (*progress)(void *ctx);
    void *progress_ctx;
    /* Testing aid (--trace-hidden), may be NULL: called with the residual
     * rows x [n x hidden] at every layer boundary this stage produces —
     * boundary L + 1 after layer L (after the f16 rounding, i.e. what goes
     * to the next layer), and boundary 0 (the input rows) on the stage that
     * holds layer 0 — so across a pipeline every boundary is reported once. */
    void (*trace)(void *ctx, uint32_t boundary, const mb_row *rows, uint32_t n, const float *x);
    void *trace_ctx;
    int round_f16;            /* round the residual stream to f16 after every layer
                                 (--wire-dtype f16): then sending hidden states as
                                 f16 loses nothing more, wherever the rank
                                 boundaries fall */
} stage_config;

pd_status stage_new(const stage_config *cfg, stage **out, pd_err *err);
void stage_free(stage *s);

/* Creates the stream's caches for every layer of the stage.
 * PD_ERR_RANGE when max_streams are alive, PD_ERR_ARG for a duplicate id. */
pd_status stage_admit(stage *s, const mb_admit *a, pd_err *err);
/* Frees the stream's caches; unknown ids are ignored. */
void stage_retire(stage *s, uint64_t stream);
uint32_t stage_streams(const stage *s);

/* Runs rows [n] with hidden states x [n x hidden] (overwritten with the
 * output of the stage's last layer). Validates the rows first (known
 * streams, contiguous increasing positions, no position beyond what the
 * stage holds): PD_ERR_FORMAT naming the row, nothing changed. */
pd_status stage_forward(stage *s, const mb_row *rows, uint32_t n, float *x, pd_err *err);

/* Cache bytes of every alive stream (attention state + recurrent state). */
typedef struct stage_mem {
    uint64_t cache_bytes;     /* bytes the caches hold from the allocator */
    uint64_t attention_bytes; /* bytes of live rows */
} stage_mem;
void stage_memory(const stage *s, stage_mem *out);

/* Bytes one stream's caches take at admission (for admission budgets). */
uint64_t stage_stream_bytes_estimate(const model_hparams *hp, const cache_policy *p,
                                     uint32_t n_layers, uint32_t prefill_rows, uint32_t max_new);

#endif
