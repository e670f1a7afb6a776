/* stage: one pipeline stage — a contiguous layer range, the per-stream caches
 * of those layers, and the scheduling of a micro-batch through them (the
 * layer math is the model's: model_layer_forward).
 *
 * With one rank the stage holds every layer (head and tail are the same
 * process). Each stream gets, per layer, a layer cache container
 * (cache/layer_cache.h: a kv layer for the full / window policies, a ring for
 * rswa) at admission; the stage holds them as a table per (stream, layer) and
 * never asks which kind it holds. Caches come from the stage's allocator (a
 * NUMA arena in the cluster). All scratch is sized at creation from max_rows:
 * stage_forward never allocates.
 *
 * Exactness: rows of many streams share each GEMM (row-invariant kernel);
 * attention runs per stream against its own cache; a prefill chunk's row i
 * attends exactly the first i + 1 rows. So a stream's hidden states never
 * depend on which other rows share the micro-batch or how its prefill was
 * chunked. */
#ifndef PD_STAGE_H
#define PD_STAGE_H

#include "base/status.h"
#include "cache/layer_cache.h"
#include "cluster/model/model.h"
#include "cluster/runtime/plan/policy.h"
#include "cluster/model/pool.h"
#include "comm/batch.h"

#include <stddef.h>
#include <stdint.h>

/* comm/wire.h and comm/bundle.h (only their names here: this header is
 * included where rd.h's names would collide) */
struct wire_layer_ref;
struct bundle_target;
struct bundle_view;

typedef struct stage stage;

typedef struct stage_config {
    const model *m;           /* borrowed: the layers this stage starts with (the
                                 range can change: stage_add_layers) */
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
/* Admits a stream restored from a checkpoint at position pos (the next
 * position its rows take): every layer of the stage must then get the
 * stream's record through stage_import_layer before the stream runs. */
pd_status stage_admit_at(stage *s, const mb_admit *a, uint64_t pos, pd_err *err);

/* The alive streams: up to cap ids and positions, in slot order; returns
 * how many are alive. */
uint32_t stage_stream_list(const stage *s, uint64_t *ids, uint64_t *pos, uint32_t cap);

/* Frees the stream's caches; unknown ids are ignored. */
void stage_retire(stage *s, uint64_t stream);
uint32_t stage_streams(const stage *s);

/* Runs rows [n] with hidden states x [n x hidden] (overwritten with the
 * output of the stage's last layer). Validates the rows first (known
 * streams, contiguous increasing positions, no position beyond what the
 * stage holds, rollbacks and role sequences every container of the stream
 * accepts (lcache_group_check), no layer awaiting its import):
 * PD_ERR_FORMAT naming the row, nothing changed. */
pd_status stage_forward(stage *s, const mb_row *rows, uint32_t n, float *x, pd_err *err);

/* Cache bytes of every alive stream (attention state + recurrent state). */
typedef struct stage_mem {
    uint64_t cache_bytes;     /* bytes the caches hold from the allocator */
    uint64_t attention_bytes; /* bytes of live rows */
    uint64_t stream_bytes_max;   /* the most cache_bytes of one stream */
    uint64_t stream_estimate;    /* stage_stream_bytes_estimate of that stream
                                    (its prefill rows and max_new, this stage's
                                    layers): what admission reserved for it,
                                    less the budget's allocator slack */
} stage_mem;
void stage_memory(const stage *s, stage_mem *out);

/* ---- one stream's cache state (checkpoint, migration) --------------------
 *
 * When rows become final. A micro-batch's rows are not final when
 * stage_forward returns: the stream's next micro-batch may start at an earlier
 * position (rejected verify rows), and only that position says how many
 * survive. The stage therefore rolls back and confirms a stream's rows when
 * its next micro-batch arrives (lcache_settle: a kv layer truncates and
 * confirms, a ring commits its accepted verify rows), or earlier when the
 * caller, who knows the accepted position, calls stage_settle. */

/* The CMFS identity (comm/wire.h) of this stage's records for absolute layer
 * `layer`: wire_identity(model_digest as 8 little-endian bytes, layer,
 * policy_describe of the stage's policy with max_drafts = 0). The draft limit
 * is left out because speculation changes no token, so a record moves
 * between runs that draft differently; the kv mode, attention and eviction
 * are in. The first call computes the model digest (reads the whole model
 * file once; model_digest caches it, so do not call concurrently with
 * another first use on the same model). */
uint64_t stage_layer_identity(const stage *s, uint32_t layer);

/* Makes the stream's rows before position pos final and drops the rows at
 * positions >= pos, exactly as the stream's next micro-batch starting at pos
 * will do before it appends: forwarding after a settle gives the same bits
 * (hidden states and cache bytes) as forwarding without it. pos is at most
 * the stream's next position and at most as far back as forward accepts
 * (lcache_rollback_limit: a ring's pending verify rows; a kv layer's rows of
 * the last micro-batch, at most max_drafts + 1; with spec_async, any of the
 * last 2 x (max_drafts + 1) positions not yet settled, across micro-batches;
 * stage_undo_floor).
 * Afterwards every layer of the stream exports. Calling it with pos = the
 * stream's next position is the "nothing was rejected" settle. A layer added
 * but not imported yet (stage_add_layers) holds nothing of the stream and is
 * left alone.
 * Errors: PD_ERR_ARG unknown stream; PD_ERR_RANGE pos ahead of the stream or
 * further back than speculation allows (nothing changed on either). */
pd_status stage_settle(stage *s, uint64_t stream, uint64_t pos, pd_err *err);

/* The lowest position the stream's next micro-batch (or a settle) may start
 * at: its position less what every layer can still undo (the bound
 * stage_settle and stage_forward check). With spec_async that spans the rows
 * of several micro-batches, and a micro-batch starting there rolls back
 * without making earlier rows final: the head's draft model drops its
 * guesses this way (drafter.h). PD_ERR_ARG unknown stream. */
pd_status stage_undo_floor(const stage *s, uint64_t stream, uint64_t *floor, pd_err *err);

/* Rows this stage dropped so far because a stream's next micro-batch (or a
 * settle) started before its position: rejected drafts and stale batches. */
uint64_t stage_rows_rolled_back(const stage *s);

/* The CMFS record (comm/wire.h, f32 payload) of one stream's cache for
 * absolute layer `layer` (model numbering, in [first, first + n_layers) of
 * the stage's model), header identity stage_layer_identity(s, layer).
 * Returns owned *out of *len bytes, free with free(); the stage is not
 * changed. Kind: FULL / FULL_TAIL (f32 kv, base > 0 after a window trim),
 * Q8 (q8 modes) or RING (rswa). What it holds between micro-batches:
 *   - kv: every stored row, including the last micro-batch's rows that may
 *     still be rolled back (verify rows); settle first for a record of final
 *     rows only. The record's position is the layer's depth (base + stored
 *     rows): the stream's position, except after eviction dropped rows,
 *     so the stream's position must travel beside the record;
 *   - ring: committed rows only; pending verify rows are never part of a
 *     ring record (the wire does not carry speculation).
 * Refusal: under --evict importance the importance mass of the last
 * micro-batch's query positions is pending until its rows are final, and
 * the wire format has no place for pending mass, so the export is refused
 * (PD_ERR_REFUSED) until stage_settle or the next micro-batch confirms it.
 * Export does not confirm by itself: confirming verify rows that are later
 * rejected would keep their importance, which would make eviction depend on
 * speculation.
 * Errors (nothing allocated): PD_ERR_ARG unknown stream; PD_ERR_RANGE layer
 * outside the stage; PD_ERR_REFUSED as above or for state the wire cannot
 * describe; PD_ERR_NOMEM. */
pd_status stage_export_layer(const stage *s, uint64_t stream, uint32_t layer, uint8_t **out,
                             size_t *len, pd_err *err);

/* The same checks without encoding: the wire's view of the layer (ref), for
 * a streaming writer (bundle_writer_add; checkpoints and migrations write
 * through it and never hold a record). kc receives the kv configuration ref
 * points to and must outlive it. The wire's own refusals (pending
 * importance, above) come when ref is sized or encoded; pass such a failure
 * to stage_export_refused for the words stage_export_layer would add. */
pd_status stage_export_ref(const stage *s, uint64_t stream, uint32_t layer, struct wire_layer_ref *ref, kv_layer_config *kc,
                           pd_err *err);
void stage_export_refused(const stage *s, uint64_t stream, uint32_t layer, pd_status rc, pd_err *err);

/* ---- the layer range of a running stage (live migration) ----------------
 *
 * A stage runs a contiguous range of absolute layers, at first the range of
 * its model. Layers can leave either end and join either end while streams
 * are alive; a moving layer's cache state travels as one CMFS record per
 * stream (stage_export_layer or, streamed into a bundle, stage_export_ref on
 * the giver; stage_import_layer, a layer's bundle all or nothing with
 * stage_install_bundle, or copies decoded as a bundle arrives
 * (stage_spare_cache, stage_check_copy) that stage_add_layers_from adopts,
 * on the receiver). Protocol at a step boundary: stage_settle every stream at its
 * accepted position on both stages (records then hold final rows only, and
 * the receiver's other layers have nothing pending); export; add on the
 * receiver; import; remove on the giver. Forwarding a stream whose new layer
 * has not been imported yet is refused, so a half-done move cannot silently
 * compute with an empty cache. */

/* The stage's current range: layers [*first, *first + *n). */
void stage_layers(const stage *s, uint32_t *first, uint32_t *n);

/* Adds layers [first, first + n) next to the range (first + n == the range's
 * first, or first == its end; a stage without layers takes any range). Their
 * weights come from `weights`, which must hold them and be loaded from the
 * same file (model_digest) with the same GEMM backend as the stage's model;
 * NULL = the stage's own model. Borrowed: must outlive the stage or the
 * layers' removal. Every alive stream gets an empty container per new layer:
 * a stream still at position 0 goes on as it is, any other needs
 * stage_import_layer for each new layer before its next micro-batch (until
 * then stage_forward refuses its rows, stage_export_layer refuses that
 * layer, and stage_settle leaves it alone).
 * Errors, nothing changed: PD_ERR_ARG n == 0; PD_ERR_RANGE not adjacent, past
 * the model's layers or not held by weights; PD_ERR_MISMATCH weights of
 * another file; PD_ERR_NOMEM. */
pd_status stage_add_layers(stage *s, uint32_t first, uint32_t n, const model *weights, pd_err *err);

/* Removes layers [first, first + n) at either end of the range (all of them
 * is allowed: the stage then passes rows through unchanged) and frees every
 * stream's containers of those layers (export them first). PD_ERR_ARG n == 0,
 * PD_ERR_RANGE a range not at an end (nothing changed). */
pd_status stage_remove_layers(stage *s, uint32_t first, uint32_t n, pd_err *err);

/* Replaces stream's cache state of absolute layer `layer` with a record
 * written by stage_export_layer on any stage of the same model file and
 * policy (identity stage_layer_identity(s, layer), the record's layer, kind
 * and geometry are checked). The stream's position on this stage is what the
 * record stands for (a kv depth below it is accepted only under eviction).
 * Errors, nothing changed: PD_ERR_ARG unknown stream; PD_ERR_RANGE layer
 * outside the range; PD_ERR_REFUSED the stream has rows not yet final in
 * another layer (stage_settle first); the wire's refusals (PD_ERR_MISMATCH,
 * PD_ERR_FORMAT, PD_ERR_TRUNCATED, ...). */
pd_status stage_import_layer(stage *s, uint64_t stream, uint32_t layer, const void *buf, size_t len,
                             pd_err *err);

/* Where stream's record of absolute layer `layer` installs, for bundle_install
 * (a bundle_resolve_fn calls it): the checks of stage_import_layer that come
 * before the record's, then t's container, position, identity and layer.
 * The record's own checks run in bundle_install's prepare. Same errors as
 * stage_import_layer's first three. */
pd_status stage_import_target(stage *s, uint64_t stream, uint32_t layer, struct bundle_target *t, pd_err *err);

/* Installs a validated bundle (bundle_parse) of one layer, v->layer, into
 * the containers of its streams through bundle_install: every record
 * prepared, then all swapped in, or none (errors as stage_import_layer,
 * naming the stream; nothing changed). */
pd_status stage_install_bundle(stage *s, const struct bundle_view *v, pd_err *err);

/* ---- copies built outside the stage (live migration's pre-copy) ----------
 *
 * A receiver grows a copy of a stream's layer container while decoding goes
 * on (rows arrive as comm/kv_chunk.h chunks) and hands it to the stage at
 * the switch (stage_add_layers_from), so the switch copies no row again. */

/* The container of stream's absolute layer `layer` (borrowed; NULL for an
 * unknown stream or a layer outside the range). The pre-copy's source reads
 * it and marks its kv layer (kv_layer_mark); nothing else changes it. */
lcache *stage_cache(stage *s, uint64_t stream, uint32_t layer);

/* The sizes a stream was admitted with, and its position (PD_ERR_ARG
 * unknown stream). */
pd_status stage_stream_shape(const stage *s, uint64_t stream, uint32_t *prefill_rows, uint32_t *max_new, pd_err *err);
pd_status stage_stream_pos(const stage *s, uint64_t stream, uint64_t *pos, pd_err *err);

/* A new empty container configured as the containers of a stream of that
 * shape are (same policy, geometry, sizes and allocator): the receiver's
 * copy, which may be started before the stream reaches this stage. Owned
 * *out (lcache_free). */
pd_status stage_spare_cache(const stage *s, uint32_t prefill_rows, uint32_t max_new, lcache **out, pd_err *err);

/* stage_add_layers, except that a stream's container of a new layer is
 * the caller's copy where copy(ctx, stream, layer) returns one (a
 * container of the stage's kind whose state stands for exactly the stream's
 * position, nothing pending; checked first): on success the stage owns every copy copy() returned (the caller
 * forgets them) and each is at its stream's position. No row is copied and
 * no storage allocated for those. Errors as stage_add_layers, plus the
 * copies' checks; nothing changed and no copy taken on error. copy is
 * called several times with the same arguments and must answer the same. */
typedef lcache *(*stage_copy_fn)(void *ctx, uint64_t stream, uint32_t layer);
/* The checks stage_add_layers_from runs on a copy, on their own (before a
 * migration's vote). */
pd_status stage_check_copy(const stage *s, uint64_t stream, uint32_t layer, const lcache *copy, pd_err *err);
pd_status stage_add_layers_from(stage *s, uint32_t first, uint32_t n, const model *weights, stage_copy_fn copy,
                                void *ctx, pd_err *err);


/* MoE layers run by this stage so far and the distinct experts they used
 * in all (model_scratch_moe_stats). */
void stage_moe_stats(const stage *s, uint64_t *layer_runs, uint64_t *experts);

/* Bytes one stream's caches take at admission (for admission budgets). */
uint64_t stage_stream_bytes_estimate(const model_hparams *hp, const cache_policy *p,
                                     uint32_t n_layers, uint32_t prefill_rows, uint32_t max_new);

#endif
