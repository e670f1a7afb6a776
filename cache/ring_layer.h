/* The R-SWA ring cache of one (stream, layer) (seed: franken_ocr rswa.rs).
 *
 * The whole prefill is a read-only REFERENCE block; generated tokens live in a
 * W-slot RING per KV head (warm-up append, then overwrite slot ring_pos).
 * Decode attends reference ++ ring in age order with no causal mask, through
 * attn_run (attn.h), the project's one reduction. Speculative verify runs
 * without copying the cache: up to max_drafts draft rows sit in spill slots
 * beside the ring, each draft attends what the matching sequential step would
 * see, and accepted drafts are committed into the ring in order; rejected
 * ones are discarded, which is how a ring rolls speculation back.
 *
 * Everything (rows, optional int8 mirror, attention scratch) is allocated at
 * creation from the layer's pd_alloc; prefill, decode, verify and commit
 * never allocate.
 *
 * Row layout of every K/V input: token-major, one token's row is
 * [n_kv_heads x head_dim] (KV head h at offset h * head_dim); a prefill chunk
 * of n rows is [n x n_kv_heads x head_dim]. Queries and outputs are
 * [n_kv_heads * group x head_dim]: Q head j reads KV head j / group.
 * RoPE is the caller's (true absolute positions); the layer only counts
 * positions (position = ref_rows + writes).
 *
 * Thread safety: mutators need exclusive access. Attend calls that pass their
 * own scratch may run concurrently on one layer; with scratch == NULL they use
 * the layer's owned scratch and must not overlap. */
#ifndef PD_RING_LAYER_H
#define PD_RING_LAYER_H

#include "base/alloc.h"
#include "base/status.h"
#include "cache/kv_layer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct ring_layer ring_layer;

/* Geometry and policy, fixed at creation. */
typedef struct ring_layer_config {
    uint32_t n_kv_heads;   /* >= 1 */
    uint32_t head_dim;     /* >= 1 */
    uint32_t window;       /* W ring slots per KV head, >= 1 */
    uint32_t ref_capacity; /* max reference (prefill) rows, >= 1 */
    uint32_t max_drafts;   /* K_max spill slots for verify rows, may be 0 */
    int int8_mirror;       /* keep a symmetric per-row int8 copy; attention reads it */
    kv_mode mode;          /* int8 STORAGE (--kv): bit 0 K, bit 1 V; see below.
                              Exclusive with int8_mirror. */
    const pd_alloc *alloc; /* borrowed, must outlive the layer; NULL = pd_alloc_default() */
    uint32_t max_group;    /* Q heads per KV head the OWNED scratch serves (0 = 1);
                              larger groups need caller scratch */
} ring_layer_config;

/* int8 storage (mode != KV_MODE_F32). The rows of a quantized component (K
 * when mode bit 0, V when bit 1) are stored ONLY as int8, in every region
 * (reference, ring, draft spill slots), quantized as the kv layer's q8_2f
 * quantizes a row before its per-channel field freezes (quant_q8_row with
 * no field): K with one scale per RING_K_GROUP channels, V with one scale
 * per row. Quantization is row-local, so a reference appended in chunks
 * holds the bytes of one whole append, a committed draft the bytes of the
 * sequential write, and an installed record the bytes it carries. There is
 * no per-channel field: it is fit to the first rows and requantizes them
 * when it freezes, which a read-only reference written chunk by chunk (and
 * attended row by row while it is written) cannot do without the kv
 * layer's undo machinery. The f32 rows of such a component are not kept:
 * that is the memory saving (D + 4 * D / 32 bytes per K row, D + 4 per V
 * row, against 4 * D). */
#define RING_K_GROUP KV_K_GROUP

/* Creates an empty layer (no rows, not decoding, fresh identity).
 * On success *out is owned by the caller, free with ring_layer_free.
 * PD_ERR_ARG for a zero dimension, an unknown mode or a mode with the int8
 * mirror, PD_ERR_NOMEM for overflow or allocation failure; nothing is
 * created on failure. */
pd_status ring_layer_new(const ring_layer_config *cfg, ring_layer **out, pd_err *err);

/* Releases everything the layer owns. ring_layer_free(NULL) is a no-op. */
void ring_layer_free(ring_layer *r);

/* The configuration the layer was created with (alloc resolved, max_group >= 1). */
void ring_layer_config_get(const ring_layer *r, ring_layer_config *out);

/* ---- reference block (prefill) ---------------------------------------- */

/* Appends n prefill rows (k, v: [n x n_kv_heads x head_dim]) to the reference.
 * Chunked prefill: call repeatedly until decoding starts; the result is the
 * same bytes as one call with all rows. n == 0 is a no-op.
 * Refused (target unchanged): PD_ERR_ARG null rows; PD_ERR_RANGE beyond
 * ref_capacity; PD_ERR_REFUSED once decoding started (reference sealed) or
 * while drafts are pending. */
pd_status ring_layer_prefill(ring_layer *r, const float *k, const float *v, uint32_t n,
                             pd_err *err);

/* ---- attention ---------------------------------------------------------- */

/* What the queries of one call look like. Fill with designated initializers. */
typedef struct ring_attend_opts {
    uint32_t group;      /* Q heads per KV head (GQA), 0 = 1 */
    float scale;         /* score scale; 0 = 1 / sqrtf(head_dim) */
    float softcap;       /* 0 = off (attn.h) */
    const float *sinks;  /* learned sink logit per Q head [n_kv_heads * group] or NULL */
} ring_attend_opts;

/* Floats of caller scratch any attend call of this layer needs for `group`
 * Q heads per KV head (0 = 1). */
size_t ring_layer_scratch_floats(const ring_layer *r, uint32_t group);

/* Prefill row `row` (< ref_rows) attends reference rows [0, row] (attend_upto):
 * the same bits whether the reference was appended in one call or in chunks.
 * q, out: [n_kv_heads * group x head_dim]. scratch: NULL = owned scratch
 * (needs group <= max_group), else ring_layer_scratch_floats(r, group) floats.
 * PD_ERR_RANGE for row >= ref_rows or group beyond the owned scratch;
 * PD_ERR_ARG for null q/out. out is written only on success. */
pd_status ring_layer_attend_prefill(const ring_layer *r, uint32_t row, const float *q,
                                    const ring_attend_opts *opts, float *out, float *scratch,
                                    pd_err *err);

/* Decode attend: reference ++ ring in age order (oldest ring row first), no
 * causal mask, via attn_run with segments [reference, ring older part, ring
 * newer part] (int8 rows when the mirror or int8 storage is on). Pending
 * drafts are not seen.
 * Same arguments and errors as ring_layer_attend_prefill; PD_ERR_RANGE when no
 * row is held. */
pd_status ring_layer_attend(const ring_layer *r, const float *q, const ring_attend_opts *opts,
                            float *out, float *scratch, pd_err *err);

/* ---- decode writes ------------------------------------------------------ */

/* Writes one generated token's K/V ([n_kv_heads x head_dim] each) into the
 * ring and seals the reference: warm-up appends at slot ring_len; a full ring
 * overwrites slot ring_pos; then ring_pos = (ring_pos + 1) % W. *slot (may be
 * NULL) receives the physical slot written.
 * Refused (unchanged): PD_ERR_ARG null rows; PD_ERR_RANGE empty reference;
 * PD_ERR_REFUSED while drafts are pending. */
pd_status ring_layer_write(ring_layer *r, const float *k, const float *v, uint32_t *slot,
                           pd_err *err);

/* ---- speculative verify without cloning --------------------------------- */

/* Puts the next draft row (index ring_layer_drafts(r) before the call) into a
 * spill slot. The ring, cursors and write count do not change.
 * Refused (unchanged): PD_ERR_ARG null rows; PD_ERR_RANGE empty reference or
 * max_drafts reached. */
pd_status ring_layer_draft_put(ring_layer *r, const float *k, const float *v, pd_err *err);

/* Pending draft rows. */
uint32_t ring_layer_drafts(const ring_layer *r);

/* Draft i (< drafts) attends reference ++ (ring minus the slots that i + 1
 * sequential writes would have overwritten, in age order) ++ drafts[0..i]
 * (only the last W of ring ++ drafts when i + 1 > W): bit-identical to
 * writing drafts 0..i sequentially and then calling ring_layer_attend, at
 * every fill level including a full, wrapped ring. Arguments and errors as
 * ring_layer_attend; PD_ERR_RANGE for i >= drafts. */
pd_status ring_layer_draft_attend(const ring_layer *r, uint32_t i, const float *q,
                                  const ring_attend_opts *opts, float *out, float *scratch,
                                  pd_err *err);

/* Commits drafts [0, a) into the ring in order, exactly as a sequential
 * ring_layer_write calls would (write count, cursors, int8 mirror, sealing),
 * and discards drafts [a, drafts). PD_ERR_RANGE (unchanged) for a > drafts. */
pd_status ring_layer_draft_commit(ring_layer *r, uint32_t a, pd_err *err);

/* Drops every pending draft; leaves no trace in the readable state. */
void ring_layer_draft_discard(ring_layer *r);

/* ---- state view and install (the CMFS wire) ----------------------------- */

/* The readable state. Pending drafts are not part of it (speculation never
 * migrates). The int8 mirror is not carried: it is a deterministic function
 * of the f32 rows (quant_sym_row) and is recomputed on install. A component
 * stored int8 (mode) is carried as its int8 rows and scales: its f32 tables
 * (ref_k / ring_k for K, ref_v / ring_v for V) are NULL and the q8 tables
 * below are set; otherwise the q8 tables are NULL.
 * INV of a valid state: ring_len == min(writes, window), ring_pos == writes %
 * window; decoding == 0 implies writes == 0; live ring rows are slots
 * [0, ring_len) (all slots once full); the bytes of dead slots are stale and
 * must not be read or exported. */
typedef struct ring_state {
    uint32_t n_kv_heads, head_dim, window;
    uint32_t ref_rows;
    uint32_t ring_len, ring_pos;
    uint64_t writes;
    int decoding; /* reference sealed */
    int int8_mirror;
    kv_mode mode;
    const float *const *ref_k, *const *ref_v;   /* per head [ref_rows x head_dim] */
    const float *const *ring_k, *const *ring_v; /* per head [window x head_dim], slot order */
    /* int8 storage, per head; scales: K [rows x ceil(head_dim / RING_K_GROUP)],
     * V [rows] (one per row), row-major like the rows. */
    const int8_t *const *ref_kq, *const *ref_vq, *const *ring_kq, *const *ring_vq;
    const float *const *ref_ks, *const *ref_vs, *const *ring_ks, *const *ring_vs;
} ring_state;

/* Fills *out with a view of r. Borrowed: valid until the next mutation of r
 * (or ring_layer_swap / ring_layer_free). */
void ring_layer_state(const ring_layer *r, ring_state *out);

/* Builds a fresh layer (NEW identity, no drafts) holding state s, after
 * validating everything: geometry, int8_mirror and mode against cfg
 * (PD_ERR_MISMATCH), int8 codes in [-127, 127] and scales >= 1e-12
 * (PD_ERR_FORMAT, what quantization produces), ref_rows <= ref_capacity, cursors within the window and
 * consistent with writes, decoding flag vs writes, ref_rows >= 1 when writes
 * > 0 (PD_ERR_RANGE / PD_ERR_FORMAT), null row pointers (PD_ERR_ARG). err names
 * the field. s is only read; on failure nothing is created. On success *out is
 * owned by the caller (ring_layer_free). */
pd_status ring_layer_new_from_state(const ring_layer_config *cfg, const ring_state *s,
                                    ring_layer **out, pd_err *err);

/* Exchanges the whole states (rows, cursors, identity, drafts, storage)
 * of a and b; each handle stays valid. Used by import: build with
 * ring_layer_new_from_state, swap into the live handle, free the other. */
void ring_layer_swap(ring_layer *a, ring_layer *b);

/* ---- bookkeeping -------------------------------------------------------- */

/* Process-unique identity (never 0). */
uint64_t ring_layer_id(const ring_layer *r);

/* Absolute position count: ref_rows + committed writes. */
uint64_t ring_layer_position(const ring_layer *r);

/* Exact memory figures.
 * storage = Σ over the regions below of round_up(bytes, 64), with
 *   C = ref_capacity, W = window, K = max_drafts, H = n_kv_heads, D = head_dim:
 *   f32 K and V of reference, ring, drafts: H * (C, W, K) * D * 4 each, for
 *     each component not stored int8;
 *   int8 mirror (when on), for reference, ring, drafts: K and V rows
 *     H * rows * D bytes each, K and V scales H * rows * 4 bytes each;
 *   int8 storage (mode), per quantized component and region: rows
 *     H * rows * D bytes, scales H * rows * G * 4 bytes (K: G =
 *     ceil(D / RING_K_GROUP); V: G = 1);
 *   scratch: attn_scratch_floats(max_group, D, C + W + K) * 4;
 *   per-head row pointers: 4 * H * sizeof(float *), with int8 storage
 *     4 * H * (sizeof(float *) + sizeof(int8_t *) + sizeof(float *)) more.
 *   (zero-byte regions take nothing)
 * handle = bytes of the handle (allocated separately).
 * allocated = storage + handle: every byte asked of the allocator.
 * live = H * (ref_rows + ring_len + drafts) * per-row bytes, per-row bytes =
 *   2 * D * 4 (+ 2 * D + 2 * 4 with the int8 mirror); with int8 storage a
 *   quantized K row counts D + 4 * G bytes, a quantized V row D + 4. */
typedef struct ring_layer_mem {
    size_t allocated;
    size_t storage;
    size_t handle;
    size_t live;
} ring_layer_mem;

void ring_layer_mem_get(const ring_layer *r, ring_layer_mem *out);

/* Exactly the `allocated` bytes ring_layer_new(cfg) would hold (everything
 * is allocated at creation); 0 for a configuration it would refuse. */
uint64_t ring_layer_bytes_for(const ring_layer_config *cfg);

/* Validates every invariant (see the INV comments in ring_layer.c, including
 * the int8 mirror matching the f32 rows). PD_OK, or PD_ERR_FORMAT naming the
 * broken invariant. Tests call it after every mutation. */
pd_status ring_layer_check(const ring_layer *r, pd_err *err);

#endif
