/* kv_layer: the per-(stream, layer) KV cache (seed: cortiq LayerKvCache).
 *
 * Owns, for one stream and one transformer layer: head-major K/V rows (one
 * contiguous [rows x head_dim] block per alive KV head, f32 or q8_2f int8 with
 * scales and a per-channel field), the attention importance of every stored
 * row, the sliding-tail bookkeeping (base, tail window), and two opaque
 * recurrent records the CMFS wire carries (a linear-recurrent f32 vector and a
 * bounded ring). All attention goes through attn_run (attn.h).
 *
 * Rows and positions. Stored row 0 is absolute position `base`; only the
 * sliding-tail trim advances base. pos_len = base + rows is the depth, the
 * position the next append will hold. Windows, upto and evictions index
 * stored rows, never positions.
 *
 * Speculation. truncate_last(n) is the rollback of rejected draft rows.
 * kv_layer_confirm(pos) promises that rows before absolute position pos are
 * final. As long as a rollback does not go past the last confirm point (and
 * not deeper than spec_depth query positions), the layer after truncate_last(n)
 * is byte-identical (every storage, field, importance; not the generation) to
 * a layer that never appended those n rows nor attended from them:
 *   - importance mass is logged per query position (at most spec_depth
 *     pending positions) and folded into the stored importance in position
 *     order when the position is confirmed, when the log is full and a newer
 *     position needs a slot (the oldest ages out), or when the importance is
 *     consumed (eviction); the mass of rolled-back query positions is dropped
 *     with them. The stored state is exact when at most spec_depth query
 *     positions are unconfirmed; kv_layer_importance (the folded view) is
 *     exact whenever the rolled-back positions were still pending;
 *   - the q8 field freeze keeps a snapshot of the rows it requantized until
 *     the freezing append is confirmed (or a trim finds it more than
 *     spec_depth rows deep, or an eviction / clear); a rollback of that
 *     append restores them and unfreezes, so the field is frozen only from
 *     rows that survived verify. While the snapshot is kept, an attend whose
 *     upto is at most freeze_rows reads the pre-freeze rows, so a prefill or
 *     verify chunk straddling the freeze equals the sequential steps.
 * Importance bits do not depend on the call order of attends as long as every
 * attend of a query position happens while that position is among the
 * spec_depth most recent logged positions (a prefill chunk longer than
 * spec_depth attends position-major: all heads of row i, then row i + 1).
 *
 * Threading: a kv_layer is used by one thread at a time. The only shared state
 * is the process-wide generation source (an atomic counter, see
 * kv_layer_generation). */
#ifndef PD_KV_LAYER_H
#define PD_KV_LAYER_H

#include "base/alloc.h"
#include "base/status.h"
#include "cache/attn.h"

#include <stddef.h>
#include <stdint.h>

/* Channels per K scale in q8 storage (V has one scale per row). */
#define KV_K_GROUP 32u
/* Defaults for kv_layer_config fields left 0. */
#define KV_FREEZE_ROWS_DEFAULT 64u
#define KV_SPEC_DEPTH_DEFAULT 16u

/* Storage mode: bit 0 = K stored as int8, bit 1 = V stored as int8. */
typedef enum kv_mode {
    KV_MODE_F32 = 0,
    KV_MODE_Q8K = 1,
    KV_MODE_Q8V = 2,
    KV_MODE_Q8 = 3,
    KV_MODE_COUNT
} kv_mode;

typedef struct kv_layer kv_layer;

/* Creation parameters (fill with designated initializers; 0 = default). */
typedef struct kv_layer_config {
    uint32_t n_kv_heads;    /* >= 1 */
    uint32_t head_dim;      /* >= 1 */
    kv_mode mode;
    const uint8_t *alive;   /* [n_kv_heads], nonzero = alive; NULL = all alive.
                               Copied: fixed for the layer's life. Dead heads
                               store nothing and cost nothing. */
    uint32_t capacity_rows; /* rows preallocated; beyond it storage grows
                               geometrically through alloc */
    uint32_t freeze_rows;   /* q8: the field freezes when an append starts
                               with >= freeze_rows rows stored; 0 = 64 */
    uint32_t spec_depth;    /* pending (undoable) query positions of the
                               importance log; also how deep past the freeze
                               a trim still keeps its undo; 0 = 16 */
    const pd_alloc *alloc;  /* borrowed, must outlive the layer; NULL = malloc */
    uint32_t max_q_per_kv;  /* Q heads per KV head the layer's own attend
                               scratch serves; 0 = 1. Larger groups pass
                               their own scratch (kv_attend.scratch). */
} kv_layer_config;

/* Creates an empty layer. Returns owned in *out (free with kv_layer_free).
 * PD_ERR_ARG on bad geometry or mode, PD_ERR_NOMEM on allocation failure
 * (then *out is left unchanged). */
pd_status kv_layer_new(const kv_layer_config *cfg, kv_layer **out, pd_err *err);

/* The `allocated` bytes (kv_layer_memory) a layer new from cfg holds at its
 * capacity_rows, without creating it: what admission budgets reserve. The
 * layer grows beyond it only when rows exceed capacity_rows. 0 for a
 * configuration kv_layer_new would refuse. */
uint64_t kv_layer_bytes_for(const kv_layer_config *cfg);

/* Frees the layer and everything it owns; NULL is a no-op. */
void kv_layer_free(kv_layer *l);

/* ---- appending ---------------------------------------------------------- */

/* Appends one position. k and v are [n_kv_heads x head_dim]; dead heads'
 * slices are not read. In q8 modes the field is frozen first when the layer
 * holds >= freeze_rows rows and is not frozen yet (all stored rows are then
 * requantized against it; the generation changes). No allocation while rows
 * < capacity; beyond it storage grows geometrically: PD_ERR_NOMEM (layer
 * unchanged) when that fails, PD_ERR_RANGE past 2^32 - 2 rows. */
pd_status kv_layer_append(kv_layer *l, const float *k, const float *v, pd_err *err);

/* Appends n positions (k, v: [n x n_kv_heads x head_dim]) exactly as n
 * kv_layer_append calls would. On failure the rows appended before the
 * failing one stay (err says how many). */
pd_status kv_layer_append_rows(kv_layer *l, uint32_t n, const float *k, const float *v,
                               pd_err *err);

/* ---- attending ---------------------------------------------------------- */

/* One attend call: the Q heads [q_head0, q_head0 + n_q) that share kv_head.
 * n_q = 1 is the per-head attend, n_q = fan-out the grouped attend; both give
 * the same bits for every head (attn_run's order). */
typedef struct kv_attend {
    uint32_t kv_head;
    uint32_t q_head0;     /* global index of the first Q head (selects sinks) */
    uint32_t n_q;         /* Q heads in q; >= 1 */
    const float *q;       /* [n_q x head_dim] */
    float scale;          /* score scale; 0 = 1/sqrtf(head_dim) */
    float softcap;        /* 0 = off */
    uint32_t first;       /* first visible stored row (window) */
    uint32_t upto;        /* only the first upto stored rows; 0 = all */
    int track_imp;        /* accumulate importance for this query position */
    float *out;           /* [n_q x head_dim], written */
    float *probs;         /* optional [n_q x span] (attn_run's probs) */
    float *scratch;       /* optional caller scratch; NULL = the layer's own */
    size_t scratch_floats;/* floats at scratch */
    /* Optional: the visible rows as a list instead of [first, upto): n_rows
     * stored row indices, strictly increasing, the last one the query's own
     * row (its query position: base + rows[n_rows - 1]). They are attended
     * in that order as if they were the only rows stored, so the bits are
     * those of a layer holding exactly these rows (an eviction not yet made:
     * speculation). Importance mass lands on the listed rows. segs: caller
     * scratch of n_rows segments; imp_rows: n_rows floats (track_imp).
     * probs is not supported with a list. */
    const uint32_t *rows;
    uint32_t n_rows;
    attn_seg *segs;
    float *imp_rows;
} kv_attend;

/* Floats of scratch an attend of n_q heads over the current rows needs. */
size_t kv_layer_scratch_floats(const kv_layer *l, uint32_t n_q);

/* Runs the attend. The query position is base + min(upto, rows) - 1 (the
 * newest visible row): importance mass (track_imp) is logged under it.
 * Learned sinks set with kv_layer_set_sinks join every head's softmax.
 * Visible rows [first, upto) are clamped as in attn_run; with no row stored
 * the output is zeros. Returns the span used in *span_out (may be NULL).
 * PD_ERR_ARG / PD_ERR_RANGE (layer and out unchanged) on a bad head, missing
 * sinks for the Q heads, or too small scratch. Never allocates. */
pd_status kv_layer_attend(kv_layer *l, const kv_attend *a, uint32_t *span_out, pd_err *err);

/* Learned per-Q-head sink logits (weights of the layer): copied; NULL or
 * n_q_heads == 0 removes them. Kept by clear, truncate, eviction and import
 * (kv_layer_swap does not move them). PD_ERR_NOMEM on allocation failure. */
pd_status kv_layer_set_sinks(kv_layer *l, const float *sinks, uint32_t n_q_heads, pd_err *err);

/* ---- importance, speculation -------------------------------------------- */

/* Writes the importance of every stored row to out[0..rows): the stored
 * importance with the pending log folded in position order, i.e. exactly
 * what the stored importance will be once everything is confirmed. Does not
 * change the layer. */
void kv_layer_importance(const kv_layer *l, float *out);

/* Adds mass[r] (r < rows) to the stored importance, as already-confirmed
 * mass (the seed's accumulate_imp: a caller that computed attention
 * probabilities elsewhere). Not undone by truncate_last. */
pd_status kv_layer_add_importance(kv_layer *l, const float *mass, pd_err *err);

/* Promises rows before absolute position pos are final: folds the pending
 * importance of query positions < pos and drops the freeze undo snapshot
 * once pos covers the freeze rows. pos beyond pos_len is clamped. */
void kv_layer_confirm(kv_layer *l, uint64_t pos);

/* Rolls back the last n rows of every storage (and their query positions'
 * pending importance; a freeze that read any of them is undone while its
 * snapshot is kept). PD_ERR_RANGE when n > rows (layer unchanged). The
 * recurrent records (linear vector, bounded ring) are not touched. */
pd_status kv_layer_truncate_last(kv_layer *l, uint64_t n, pd_err *err);

/* Empties the per-position storage, importance, field, base and the
 * recurrent records (the bounded ring is zeroed in place, keeping its
 * window). Keeps sinks, the tail window and capacity. */
void kv_layer_clear(kv_layer *l);

/* ---- eviction and sliding tail ------------------------------------------ */

/* Keeps the last keep_last rows. No-op on a trimmed (tail) layer, on a layer
 * holding a bounded ring, or when rows <= keep_last. Eviction consumes the
 * importance (folds the pending log) and drops undo data: a confirm point.
 * Returns the rows dropped. */
uint64_t kv_layer_evict_recent(kv_layer *l, uint64_t keep_last);

/* Keeps the `sinks` oldest rows, the `recent` newest rows (both clamped to
 * budget, sinks first) and fills the rest of budget with the middle rows of
 * highest importance (ties: the older row), all in original order; never
 * more than budget rows. Every storage is gathered independently with the
 * same kept-row list. Same no-op cases and confirm effect as evict_recent.
 * Returns the rows dropped. */
uint64_t kv_layer_evict_importance(kv_layer *l, uint64_t budget, uint64_t sinks,
                                   uint64_t recent);

/* The rows kv_layer_evict_importance(budget, sinks, recent) keeps of `rows`
 * rows of importance imp[0..rows) (ascending indices into idx; returns how
 * many; all rows when rows <= budget). idx: [rows] out and workspace, flag:
 * [rows] workspace. Pure: speculation decides the same eviction over a
 * subset of rows without making it. */
uint32_t kv_select_importance(const float *imp, uint32_t rows, uint64_t budget, uint64_t sinks,
                              uint64_t recent, uint32_t *idx, uint8_t *flag);

/* The importance of stored rows [0, row) as it will be once every query
 * position below base + row is folded (the stored importance plus those
 * pending positions, in position order): what an eviction decided right
 * before row `row` was appended sees. out[0..row). row <= rows. */
void kv_layer_importance_below(const kv_layer *l, uint64_t row, float *out);

/* Keeps exactly the stored rows rows[0..n) (strictly increasing, < rows)
 * of every storage and the importance, in order: an eviction decided
 * elsewhere (kv_select_importance over the rows a speculative group saw).
 * Same confirm effect as the evictions (folds the pending log first).
 * PD_ERR_ARG / PD_ERR_RANGE (layer unchanged) for a list that is not
 * increasing or out of range, or on a tail / bounded layer. */
pd_status kv_layer_keep_rows(kv_layer *l, const uint32_t *rows, uint32_t n, pd_err *err);

/* The same for the rows below `below` only: keeps rows[0..n) (increasing,
 * < below) and every row from `below` on, which stay undoable: the pending
 * importance of query positions below base + below is folded first, that of
 * the later ones keeps its entries, moved with their rows (asynchronous
 * speculation: rows become final, and their eviction real, while newer
 * verify rows are still pending). PD_ERR_RANGE / PD_ERR_ARG (unchanged) as
 * keep_rows, below > rows; PD_ERR_REFUSED while a q8 freeze can be undone. */
pd_status kv_layer_keep_rows_below(kv_layer *l, const uint32_t *rows, uint32_t n, uint64_t below, pd_err *err);

/* Sliding-window tail (seed trim_window): sets the tail window to w, then,
 * once more than 2w rows are stored, drops front rows down to w + slack,
 * the cut rounded down to an absolute position that is a multiple of align
 * (align 0 = 1). No-op when w == 0, with a bounded ring, on a q8 layer whose
 * field is not frozen yet, or whose freeze can still be undone and lies
 * within spec_depth rows of the newest (beyond that the trim drops the undo
 * snapshot and proceeds). Returns the rows dropped. */
uint64_t kv_layer_trim_window(kv_layer *l, uint64_t w, uint64_t slack, uint64_t align);

/* trim_window whose cut never passes anchor - w - slack (keeps every row a
 * rollback to anchor - slack still reads); UINT64_MAX = the plain trim. */
uint64_t kv_layer_trim_window_anchored(kv_layer *l, uint64_t w, uint64_t slack, uint64_t align,
                                       uint64_t anchor);

/* ---- recurrent records (state the wire carries) -------------------------- */

/* Sets the linear-recurrent vector (copied; n == 0 removes it). Counted as
 * recurrent bytes. PD_ERR_NOMEM on allocation failure (layer unchanged). */
pd_status kv_layer_set_linear(kv_layer *l, const float *x, uint64_t n, pd_err *err);

/* Installs a zeroed bounded ring of `window` slots per KV head (every head,
 * dead ones included: [n_kv_heads x window x head_dim] K and V), len = 0,
 * replacing any previous ring. PD_ERR_ARG for window 0, PD_ERR_RANGE past
 * 2^30 floats per buffer, PD_ERR_NOMEM (layer unchanged on every failure). */
pd_status kv_layer_install_bounded(kv_layer *l, uint32_t window, pd_err *err);

/* Inserts one position into the bounded ring: k, v [n_kv_heads x head_dim]
 * go to slot len mod window; len += 1; head = len mod window (the next slot
 * to overwrite). PD_ERR_ARG without a ring. */
pd_status kv_layer_bounded_insert(kv_layer *l, const float *k, const float *v, pd_err *err);

/* ---- accessors ----------------------------------------------------------- */

uint64_t kv_layer_rows(const kv_layer *l);
uint64_t kv_layer_base(const kv_layer *l);
uint64_t kv_layer_pos_len(const kv_layer *l);    /* base + rows */
uint64_t kv_layer_tail_window(const kv_layer *l); /* 0 = not a tail layer */
kv_mode kv_layer_mode(const kv_layer *l);
int kv_layer_frozen(const kv_layer *l);

/* Storage generation: a process-unique value refreshed on every mutation
 * other than append (truncate, evict, trim, clear, freeze, install, import,
 * restore, set_linear). Anything derived from the stored rows and kept
 * elsewhere (a copy, a precomputed view) can be keyed on (generation, rows):
 * an append only grows rows, every other change issues a new generation.
 * Nothing in the tree keys on it yet; the tests pin the rule. The source is
 * one process-wide atomic counter: uniqueness across every layer of the
 * process is the point, and it carries no answer-relevant state. */
uint64_t kv_layer_generation(const kv_layer *l);

/* Exact memory figures in bytes.
 *   attention: bytes used by stored rows of every storage (f32 K/V, int8 K/V,
 *              K scales, V scales, importance) plus frozen fields:
 *              rows * (4 [imp] + alive * per_row) + frozen * alive * field
 *              with per_row = K: 4*hd or hd + 4*ceil(hd/32); V: 4*hd or hd + 4
 *              and field = 4*hd per quantized component.
 *   recurrent: 4 * n_linear + (ring ? 2 * 4 * n_kv_heads * window * hd : 0)
 *   allocated: every byte the layer holds from its allocator (capacity of
 *              all storages, undo log and snapshot, scratch, sinks, records). */
typedef struct kv_memory {
    uint64_t attention;
    uint64_t recurrent;
    uint64_t allocated;
} kv_memory;
void kv_layer_memory(const kv_layer *l, kv_memory *out);

/* Validates every invariant (aborts through CHECK on a broken one): lengths
 * per storage vs rows, dead heads empty, field present iff frozen, base and
 * pos_len, capacity, pending log and snapshot bounds. Tests call it after
 * every mutation. */
void kv_layer_check(const kv_layer *l);

/* ---- state view / install (for the CMFS wire) ----------------------------- */

/* One KV head's storage. NULL for what the mode or alive mask does not hold;
 * kcol / vcol NULL until frozen. Layouts (rows = kv_state.rows):
 *   k, v   [rows x head_dim] f32      kq, vq [rows x head_dim] int8
 *   ks     [rows x ceil(head_dim / k_group)]   vs [rows] (one per row)
 *   kcol, vcol [head_dim] */
typedef struct kv_head_state {
    const float *k, *v;
    const int8_t *kq, *vq;
    const float *ks, *vs;
    const float *kcol, *vcol;
} kv_head_state;

/* A bounded ring: len = inserts so far (the seed's `seen`), head = len mod
 * window (the next slot an insert overwrites). k, v [n_kv_heads x window x
 * head_dim]; slot s of head h at (h * window + s) * head_dim. */
typedef struct kv_bounded_state {
    uint32_t window;
    uint64_t len;
    uint32_t head;
    const float *k, *v;
} kv_bounded_state;

/* The whole layer state (everything but sinks, which are weights, and undo
 * data). imp_pending counts query positions whose importance is still in
 * the pending log and NOT in imp: a complete export needs imp_pending == 0
 * (kv_layer_confirm(l, kv_layer_pos_len(l)) first); new_from_state requires
 * it. n_imp is 0 or rows. */
typedef struct kv_state {
    uint32_t n_kv_heads, head_dim, k_group, freeze_rows;
    kv_mode mode;
    const uint8_t *alive; /* [n_kv_heads], 1 = alive */
    uint64_t rows, base;
    uint32_t tail_window; /* 0 = none */
    int frozen;
    const float *imp;
    uint64_t n_imp;
    const float *linear;
    uint64_t n_linear;
    int has_bounded;
    kv_bounded_state bounded;
    const kv_head_state *heads; /* [n_kv_heads] */
    uint32_t imp_pending;
} kv_state;

/* Fills *out and heads[0..n_kv_heads) (a caller array) with borrowed
 * pointers into l, valid until the next mutation of l. */
void kv_layer_state(const kv_layer *l, kv_state *out, kv_head_state *heads);

/* Builds a fresh layer (cfg: geometry, mode, alive, capacity, alloc) holding
 * state s, copied. Validates everything first: geometry and mode equal cfg,
 * k_group, freeze_rows, alive mask, rows and base vs overflow, storages
 * present exactly as mode and alive say, importance length 0 or rows, field
 * only when frozen (and only for q8 components), an unfrozen q8 layer holds
 * <= freeze_rows rows, bounded cursors within the window, imp_pending == 0.
 * On failure nothing is created and err names the field. The new layer is
 * fully confirmed (no undo data) and has a fresh generation. */
pd_status kv_layer_new_from_state(const kv_layer_config *cfg, const kv_state *s, kv_layer **out,
                                  pd_err *err);

/* Replaces l's state with a copy of s, validated exactly as
 * kv_layer_new_from_state validates it against l's own configuration. When
 * l's capacity holds s's rows and s carries no recurrent records, the copy
 * reuses l's storage (no allocation, no fresh pages to fault in): this is how
 * a receiver that keeps a spare layer installs a record at copy speed. Else
 * a fresh layer is built and swapped in. On failure l is unchanged. Sinks
 * stay. Afterwards l is fully confirmed and has a fresh generation. */
pd_status kv_layer_assign_state(kv_layer *l, const kv_state *s, pd_err *err);

/* ---- incremental copies (live migration's pre-copy) ----------------------- */

/* Marks the rows held now: afterwards kv_layer_marked_rows says how many of
 * them are still byte-identical in every storage. An append keeps them; a
 * truncation keeps the rows before its cut; every other change of stored
 * rows (freeze and its undo, eviction, trims, clear, install, import, swap)
 * keeps none. Importance, recurrent records and rings are not rows: they
 * are not covered. */
void kv_layer_mark(kv_layer *l);
uint64_t kv_layer_marked_rows(const kv_layer *l);

/* Appends the s->rows rows of s after l's rows, bytes copied as stored (a
 * q8 row stays the int8 row and scales it was; no requantization, no
 * freeze). s is checked as kv_layer_new_from_state checks a state against
 * l's configuration, and must continue l: same base, tail window and frozen
 * flag, the same frozen field bytes, no recurrent records or ring, an
 * unfrozen q8 layer staying <= freeze_rows rows; l must have no importance
 * pending. s's importance (n_imp = rows) is appended, else zeros. On
 * failure l is unchanged and err names the field. Afterwards l is fully
 * confirmed. The result equals a layer built from the concatenated state. */
pd_status kv_layer_append_state(kv_layer *l, const kv_state *s, pd_err *err);

/* Replaces the stored importance of all n == rows rows (no importance
 * pending). PD_ERR_MISMATCH for another count. */
pd_status kv_layer_set_importance(kv_layer *l, const float *imp, uint64_t n, pd_err *err);

/* The configuration l was created with (alive borrowed from l; capacity_rows
 * is the current capacity). */
void kv_layer_config_get(const kv_layer *l, kv_layer_config *out);

/* Exchanges the states (storage, importance, undo data, records, base, tail,
 * capacity, the allocator they came from) of two layers of the same geometry,
 * mode and alive mask; the sinks stay with the object they were set on. An
 * import decodes into a fresh layer and swaps on success, so a failed import
 * leaves the target untouched. Both layers then get a fresh generation (new
 * storage for each). Mismatched geometry is an internal error (CHECK). */
void kv_layer_swap(kv_layer *a, kv_layer *b);

#endif
