/* layer_cache: the attention state of one (stream, layer) behind one
 * interface, so a stage and the layer math never ask which cache they hold.
 *
 * Two implementations, chosen at creation by lcache_config.kind:
 *   LCACHE_KIND_KV    a kv_layer (kv_layer.h): full attention, a sliding
 *                     window of visible rows, f32 / q8 storage, eviction;
 *   LCACHE_KIND_RING  a ring_layer (ring_layer.h): R-SWA, the prefill as a
 *                     reference block and a W-slot ring of generated rows.
 * Both attend through attn_run (attn.h), so the bits of an answer are the
 * implementation's own: a container adds no arithmetic.
 *
 * A stream's rows reach a container as GROUPS: the consecutive rows of one
 * stream inside a micro-batch, in increasing positions, each with a role.
 * Per group, in this order:
 *   lcache_append(c, group, k, v)   position-driven rollback to the group's
 *                                   first position (lcache_settle), eviction
 *                                   (kv), then the group's rows;
 *   lcache_attend(c, j, q, out)     row j of the group attends exactly what a
 *                                   decode step at its position would see
 *                                   (prefill row i: positions [0, i]; a verify
 *                                   row: the rows before it, drafts included),
 *                                   for j in increasing order;
 *   lcache_end(c)                   closes the group (ring: writes the rows no
 *                                   attend needed yet; kv: trims the window).
 * The group's k and v stay borrowed until lcache_end: a ring writes a decode
 * row only when the row attends (the next decode row's write must not be
 * visible to it), so its rows are copied in as the attends advance.
 *
 * Positions. A container counts the positions of its stream: lcache_position
 * is the position the next row takes, pending rows included. Rows of the last
 * group are PENDING until the next group (or lcache_settle) starts at a
 * position that says how many survive: a kv layer truncates and confirms, a
 * ring commits its verify rows (spill slots) and drops the rejected ones.
 * How far back a group may start is lcache_rollback_limit: a ring's pending
 * verify rows; a kv layer's pending rows, at most max_drafts + 1 (the query
 * positions its importance log keeps undoable), or with undo_rows every
 * position not yet final, across groups.
 *
 * State as bytes (the CMFS wire) lives above cache/: comm/lcache_wire.h
 * reads and replaces the implementation object through lcache_kv /
 * lcache_ring and lcache_adopt below.
 *
 * Threading: a container is used by one thread at a time; different
 * containers are independent. Nothing here allocates after lcache_new except
 * a kv layer growing past its capacity. */
#ifndef PD_LAYER_CACHE_H
#define PD_LAYER_CACHE_H

#include "base/alloc.h"
#include "base/status.h"
#include "cache/kv_layer.h"
#include "cache/ring_layer.h"

#include <stddef.h>
#include <stdint.h>

typedef enum lcache_kind { LCACHE_KIND_KV, LCACHE_KIND_RING, LCACHE_KIND_COUNT } lcache_kind;

/* The role of a row (the values of comm/batch.h's mb_role, which cache/
 * cannot include: the stage converts). */
typedef enum lcache_role {
    LCACHE_ROLE_PREFILL = 0, /* a prompt / embedding row: a kv row, a ring reference row */
    LCACHE_ROLE_DECODE = 1,  /* a generated token: final once the next group starts past it */
    LCACHE_ROLE_VERIFY = 2,  /* a speculative draft: may be rolled back */
    LCACHE_ROLE_COUNT
} lcache_role;

typedef enum lcache_evict {
    LCACHE_EVICT_NONE,
    LCACHE_EVICT_RECENT,     /* keep the newest rows */
    LCACHE_EVICT_IMPORTANCE, /* sinks + recents + highest attention mass */
    LCACHE_EVICT_COUNT
} lcache_evict;

/* Creation parameters (designated initializers; fields an implementation
 * does not use must be 0). */
typedef struct lcache_config {
    lcache_kind kind;
    uint32_t n_kv_heads;   /* >= 1 */
    uint32_t head_dim;     /* >= 1 */
    uint32_t q_per_kv;     /* Q heads per KV head (GQA fan-out), >= 1 */
    uint32_t window;       /* kv: rows a query sees, 0 = all (full attention);
                              ring: W ring slots, >= 1 */
    kv_mode mode;          /* storage: kv layer (q8_2f), or a ring's int8 storage
                              (ring_layer.h: reference, ring and drafts alike) */
    lcache_evict evict;    /* kv without a window only */
    uint32_t evict_budget; /* rows kept (evict != NONE), >= 1 */
    uint32_t evict_sinks;  /* importance: oldest rows always kept */
    uint32_t max_drafts;   /* verify rows a group may carry */
    uint32_t undo_rows;    /* 0: a group may roll back only rows of the last
                              group (at most max_drafts + 1). > 0 (asynchronous
                              speculation; a kv layer, with eviction only on
                              f32 rows):
                              any of the last undo_rows positions, across
                              groups — a row becomes final once undo_rows newer
                              positions follow it, or at lcache_settle */
    uint32_t prefill_rows; /* the stream's prefill (ring: reference capacity), >= 1 */
    uint32_t max_new;      /* generated rows at most (kv preallocation) */
    const pd_alloc *alloc; /* borrowed, must outlive the container; NULL = malloc */
} lcache_config;

typedef struct lcache lcache;

/* Creates an empty container (position 0). Returns owned *out, free with
 * lcache_free. PD_ERR_ARG for a bad or contradictory configuration (the
 * message names the field), PD_ERR_NOMEM; nothing is created on failure. */
pd_status lcache_new(const lcache_config *cfg, lcache **out, pd_err *err);

/* Frees the container and its implementation; NULL is a no-op. */
void lcache_free(lcache *c);

/* The configuration c was created with. */
void lcache_config_get(const lcache *c, lcache_config *out);
lcache_kind lcache_kind_of(const lcache *c);

/* ---- groups --------------------------------------------------------------- */

/* The rows of one stream in a micro-batch: positions pos, pos + 1, ...,
 * pos + n - 1, roles[j] for row j. Borrowed for the call. */
typedef struct lcache_group {
    uint64_t pos;
    uint32_t n;
    const uint8_t *roles; /* [n] lcache_role values */
} lcache_group;

/* Whether group g may run next: n >= 1, known roles, pos <= position and
 * position - pos <= lcache_rollback_limit; a ring also refuses a verify row
 * right after prefill rows, a decode row after a verify row, and more verify
 * rows than max_drafts. Changes nothing. PD_ERR_FORMAT (or PD_ERR_RANGE for
 * the rollback) naming the offending row of the group in *row (may be NULL). */
pd_status lcache_group_check(const lcache *c, const lcache_group *g, uint32_t *row, pd_err *err);

/* Starts group g: lcache_settle(c, g->pos), then, on a kv layer with
 * eviction and a group that does not start with a prefill row, keeps
 * budget - 1 rows when rows + 1 would exceed the budget: the newest
 * (recent) or sinks + recents + most attended (importance, sinks clamped to
 * what is kept), then appends the n rows. k, v are
 * [n x n_kv_heads x head_dim]; borrowed until lcache_end. Validates g as
 * lcache_group_check first (nothing changed on refusal). Afterwards the
 * position is g->pos + n and the n rows are pending. PD_ERR_NOMEM when a kv
 * layer cannot grow (the rows appended before stay: the stream must stop).
 * Eviction under speculation is exact: the group's later rows
 * ([decode p, verify p+1 .. p+K]) each attend the rows their own sequential
 * step would keep (evicting down to budget - 1 before it, from the
 * importance of the steps before it), decided without being made; the
 * settle that says how many verify rows were accepted drops the rejected
 * ones (and their importance) and makes the last accepted row's eviction,
 * so the layer is what the accepted rows decoded one by one leave
 * (layer_cache.c, lcache_spec). */
pd_status lcache_append(lcache *c, const lcache_group *g, const float *k, const float *v,
                        pd_err *err);

/* Row j of the open group attends: q [n_kv_heads * q_per_kv x head_dim]
 * (Q head h reads KV head h / q_per_kv), out the same shape. j must be above
 * the previous attend's j of this group (PD_ERR_ARG otherwise). Never
 * allocates. */
pd_status lcache_attend(lcache *c, uint32_t j, const float *q, float *out, pd_err *err);

/* Attending by KV heads on several threads (one stream's decode step or
 * prefill would otherwise attend on one thread while the others wait).
 * lcache_attend_splits says whether the container allows it: a kv layer
 * that tracks no importance. A ring writes its rows as the attends advance
 * and importance adds up over the heads in head order, so those attend
 * whole rows (lcache_attend). */
int lcache_attend_splits(const lcache *c);

/* Floats of scratch one lcache_attend_heads call needs in the open group
 * (after lcache_append); 0 for a ring. */
size_t lcache_attend_heads_scratch(const lcache *c);

/* Row j of the open group attends with KV heads [h0, h1) only: reads q's
 * Q heads [h0 * q_per_kv, h1 * q_per_kv) and writes the same slices of out
 * (q and out are whole rows as in lcache_attend). It changes nothing in the
 * container, so calls for disjoint head ranges, each with its own scratch,
 * may run at once on different threads, for the rows in any order; calls
 * covering [0, n_kv_heads) give out the bits of lcache_attend (each head runs
 * the same attn_run). A group attends either way, not both. PD_ERR_ARG when
 * the container does not split, no group is open, the group was attended by
 * rows, j or the range is out of bounds, or scratch is NULL; PD_ERR_RANGE when
 * scratch_floats is below lcache_attend_heads_scratch. Never allocates. */
pd_status lcache_attend_heads(lcache *c, uint32_t j, uint32_t h0, uint32_t h1, const float *q, float *out,
                              float *scratch, size_t scratch_floats, pd_err *err);

/* Closes the open group: a ring writes the rows no attend reached; a kv
 * layer with a window drops rows no later query can see (trim_window with
 * max_drafts + 1 rows of slack). PD_OK when no group is open. */
pd_status lcache_end(lcache *c, pd_err *err);

/* Whether a group is open (between lcache_append and lcache_end). */
int lcache_group_open(const lcache *c);

/* ---- positions, rollback ---------------------------------------------------- */

/* The position the next row takes (pending rows included). */
uint64_t lcache_position(const lcache *c);
/* Rows of the last group that a settle may still roll back or confirm
 * (0 after lcache_settle). */
uint32_t lcache_pending(const lcache *c);
/* How many positions back the next group or settle may start. */
uint64_t lcache_rollback_limit(const lcache *c);

/* Rolls back to pos and makes every row before pos final: a kv layer drops
 * its last position - pos rows and confirms the rest (their importance
 * becomes stored importance); a ring commits its first drafts - (position -
 * pos) verify rows into the ring and discards the others. Running it twice
 * with the same pos changes nothing the second time. PD_ERR_RANGE (nothing
 * changed) when pos > position or position - pos > lcache_rollback_limit;
 * PD_ERR_ARG while a group is open. */
pd_status lcache_settle(lcache *c, uint64_t pos, pd_err *err);

/* ---- memory, invariants --------------------------------------------------- */

typedef struct lcache_mem {
    uint64_t allocated; /* bytes the implementation holds from its allocator */
    uint64_t live;      /* bytes of the rows (and records) it holds now */
} lcache_mem;
void lcache_memory(const lcache *c, lcache_mem *out);

/* Bytes one container of cfg holds for a stream whose prefill and generation
 * are cfg->prefill_rows and cfg->max_new (admission budgets): exactly what
 * lcache_memory reports as allocated after lcache_new, asked of the
 * implementation (kv_layer_bytes_for / ring_layer_bytes_for), since both
 * allocate their whole capacity up front; 0 for a refused configuration. */
uint64_t lcache_bytes_estimate(const lcache_config *cfg);

/* Validates the container's and the implementation's invariants; aborts
 * through CHECK on a broken one. Tests call it after every mutation. */
void lcache_check(const lcache *c);

/* ---- the implementation object (for the CMFS wire: comm/lcache_wire.h) ---- */

/* Exactly one is non-NULL: the object behind c. Borrowed, valid until
 * lcache_free. Code outside the container only reads it, or replaces its
 * state wholesale (wire_import) and then calls lcache_adopt. */
kv_layer *lcache_kv(const lcache *c);
ring_layer *lcache_ring(const lcache *c);
/* The configuration the implementation object was created with. */
void lcache_kv_config(const lcache *c, kv_layer_config *out);

/* Whether a state whose own position (a CMFS record's header position: the
 * layer's depth) is `depth` can stand for a stream at position pos in c:
 * a ring must hold exactly pos positions; a kv layer too, except that
 * eviction keeps only some rows (depth <= pos). PD_ERR_MISMATCH otherwise. */
pd_status lcache_adopt_check(const lcache *c, uint64_t depth, uint64_t pos, pd_err *err);

/* After the implementation's state was replaced wholesale (an import): the
 * stream is at position pos with nothing pending and no open group. The new
 * state must pass lcache_adopt_check (CHECK). */
void lcache_adopt(lcache *c, uint64_t pos);

#endif
