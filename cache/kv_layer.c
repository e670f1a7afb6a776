/* kv_layer: the per-(stream, layer) KV cache (see kv_layer.h).
 * Owns head-major K/V rows (f32 or q8_2f), importance with its pending undo
 * log, the freeze undo snapshot, attend scratch and the recurrent records. */
#include "cache/kv_layer.h"

#include "cache/attn.h"
#include "base/check.h"
#include "cache/quant.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

/* Rows are uint32 in attn_seg; one value is kept free for "upto = all". */
#define KV_MAX_ROWS (UINT32_MAX - 1u)
#define KV_MAX_HEADS (1u << 16)
#define KV_MAX_HEAD_DIM (1u << 16)
#define KV_MAX_SPEC_DEPTH 4096u
#define KV_MAX_FREEZE_ROWS (1u << 24)
#define KV_MAX_Q_PER_KV 4096u
#define KV_MAX_RING_FLOATS ((size_t)1 << 30) /* per K or V buffer */
#define KV_FIELD_FLOOR 1e-6f
#define KV_SCALE_FLOOR 1e-12f

/* The four per-row storages of one KV head, by index. */
enum { KV_ST_K = 0, KV_ST_KS, KV_ST_V, KV_ST_VS, KV_ST_COUNT };

/* One KV head. INV: a dead head holds no pointer at all; an alive head holds
 * st[i] (capacity rows) exactly for the storages its mode uses, col[0] / col[1]
 * ([head_dim]) for each quantized component, and snap[i] (freeze_rows rows)
 * for each quantized storage. */
typedef struct kv_head {
    void *st[KV_ST_COUNT]; /* K: f32 [cap x hd] or int8 [cap x hd]; KS: [cap x ngk];
                              V: f32 or int8 [cap x hd]; VS: [cap] */
    float *col[2];         /* per-channel field of K and V (valid iff frozen) */
    void *snap[KV_ST_COUNT]; /* pre-freeze copy of the quantized storages */
} kv_head;

/* A pending importance entry: the mass every attend of query position qpos
 * added, over rows [0, len) with len = qpos - base + 1. */
typedef struct kv_pend {
    uint64_t qpos;
    uint32_t len;
    uint32_t used;
} kv_pend;

/* Everything kv_layer_swap exchanges (all but the object and its sinks).
 * INV: rows <= cap <= KV_MAX_ROWS; base + rows does not overflow.
 * INV: q8 mode and !frozen => rows <= freeze_rows (an append at freeze_rows
 *      freezes first); F32 mode => !frozen.
 * INV: every used pend slot: folded_to <= qpos, base <= qpos < base + rows,
 *      len == qpos - base + 1; qpos values distinct; n_pend == used count.
 * INV: snap_valid => frozen and rows > freeze_rows (the freezing append, row
 *      freeze_rows, is still stored); base unchanged since the freeze.
 * INV: bounded ring present iff bwin > 0; its cursor is blen mod bwin.
 * INV: held == bytes currently allocated through alloc for this state. */
typedef struct kv_core {
    const pd_alloc *alloc;
    uint32_t n_kv, hd, ngk, freeze_rows, spec_depth, max_q;
    kv_mode mode;
    uint8_t *alive; /* [n_kv] 0/1 */
    uint32_t n_alive;
    kv_head *heads; /* [n_kv] */
    uint32_t rows, cap;
    uint64_t base;
    uint64_t tail; /* 0 = not a tail layer */
    int frozen;
    uint64_t gen;
    uint32_t mark;    /* rows [0, mark) unchanged since kv_layer_mark */
    float *imp;       /* [cap] stored (folded) importance */
    float *pend_mass; /* [spec_depth x cap] */
    kv_pend *pend;    /* [spec_depth] */
    uint32_t n_pend;
    uint64_t folded_to; /* query positions below it are folded (or direct) */
    int snap_valid;
    float *scratch; /* [scratch_n] attn_run scratch, also freeze temp row */
    size_t scratch_n;
    uint32_t *idx; /* [cap] eviction order */
    uint8_t *keep; /* [cap] eviction marks */
    float *linear;
    uint64_t n_linear;
    uint32_t bwin;
    uint64_t blen;
    float *bk, *bv; /* [n_kv x bwin x hd] */
    uint64_t held;
} kv_core;

struct kv_layer {
    kv_core c;
    const pd_alloc *obj_alloc; /* the object and its sinks */
    float *sinks;              /* [n_sinks] learned sink logits (weights) */
    uint32_t n_sinks;
};

/* The process-wide generation source: an atomic counter, because the value
 * must be unique across every layer of the process (a derived copy keyed on
 * (generation, rows) must never mistake one layer's rows for another's); it
 * carries no answer-relevant state. */
static _Atomic uint64_t kv_gen_source = 1;

static uint64_t kv_next_gen(void)
{
    return atomic_fetch_add_explicit(&kv_gen_source, 1, memory_order_relaxed);
}

/* A mutation other than an append: a new generation, and rows from `kept`
 * on are no longer the rows kv_layer_mark saw (0: any row may have
 * changed). */
static void kv_changed(kv_core *c, uint32_t kept)
{
    c->gen = kv_next_gen();
    if (c->mark > kept)
        c->mark = kept;
}

/* ---- geometry helpers ---------------------------------------------------- */

static int kv_qk(const kv_core *c) { return (c->mode & KV_MODE_Q8K) != 0; }
static int kv_qv(const kv_core *c) { return (c->mode & KV_MODE_Q8V) != 0; }

/* Bytes per row of storage i (0 when the mode does not hold it). */
static size_t kv_st_row_bytes(const kv_core *c, int i)
{
    switch (i) {
    case KV_ST_K: return kv_qk(c) ? c->hd : (size_t)4 * c->hd;
    case KV_ST_KS: return kv_qk(c) ? (size_t)4 * c->ngk : 0;
    case KV_ST_V: return kv_qv(c) ? c->hd : (size_t)4 * c->hd;
    case KV_ST_VS: return kv_qv(c) ? 4 : 0;
    }
    return 0;
}

/* Storage i is quantized data (kept in the freeze snapshot). */
static int kv_st_quant(const kv_core *c, int i)
{
    return i < KV_ST_V ? kv_qk(c) : kv_qv(c);
}

static size_t kv_row_bytes_all(const kv_core *c)
{
    size_t b = 0;
    for (int i = 0; i < KV_ST_COUNT; i++)
        b += kv_st_row_bytes(c, i);
    return b;
}

static size_t kv_fields_bytes(const kv_core *c)
{
    return (size_t)4 * c->hd * (size_t)(kv_qk(c) + kv_qv(c));
}

static size_t kv_snap_bytes(const kv_core *c)
{
    size_t b = 0;
    for (int i = 0; i < KV_ST_COUNT; i++)
        if (kv_st_quant(c, i))
            b += kv_st_row_bytes(c, i);
    return b * c->freeze_rows;
}

/* a * b into *out, 0 on overflow. */
static int kv_mul(size_t a, size_t b, size_t *out)
{
    if (a && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

/* ---- allocation through the core's allocator ---------------------------- */

static void *kv_get(kv_core *c, size_t bytes)
{
    if (bytes == 0)
        return NULL;
    void *p = pd_alloc_bytes(c->alloc, bytes);
    if (p)
        c->held += bytes;
    return p;
}

static void kv_put(kv_core *c, void *p, size_t bytes)
{
    if (!p)
        return;
    pd_free_bytes(c->alloc, p, bytes);
    CHECK(c->held >= bytes);
    c->held -= bytes;
}

/* Bytes of every capacity-sized buffer for cap rows; 0 on overflow. */
static size_t kv_cap_bytes(const kv_core *c, uint32_t cap, size_t *scratch_n)
{
    size_t per_row = (size_t)c->n_alive * kv_row_bytes_all(c) + 4 /* imp */ +
                     (size_t)4 * c->spec_depth /* pending log */ + 4 /* idx */ + 1 /* keep */;
    size_t total, sn = attn_scratch_floats(c->max_q, c->hd, cap);
    if (!kv_mul(per_row, cap, &total) || sn > SIZE_MAX / 4 - total / 4 - 1)
        return 0;
    if (scratch_n)
        *scratch_n = sn;
    return total + 4 * sn;
}

/* Capacity buffers of one size, allocated together so growth is atomic. */
typedef struct kv_capbuf {
    void **st;    /* [n_kv x KV_ST_COUNT] */
    float *imp, *pend_mass, *scratch;
    uint32_t *idx;
    uint8_t *keep;
    size_t scratch_n;
} kv_capbuf;

static void kv_capbuf_free(kv_core *c, kv_capbuf *b, uint32_t cap)
{
    for (uint32_t h = 0; h < c->n_kv; h++)
        for (int i = 0; i < KV_ST_COUNT; i++)
            if (b->st[h * KV_ST_COUNT + i])
                kv_put(c, b->st[h * KV_ST_COUNT + i], kv_st_row_bytes(c, i) * cap);
    kv_put(c, b->imp, (size_t)4 * cap);
    kv_put(c, b->pend_mass, (size_t)4 * c->spec_depth * cap);
    kv_put(c, b->scratch, 4 * b->scratch_n);
    kv_put(c, b->idx, (size_t)4 * cap);
    kv_put(c, b->keep, cap);
}

/* Allocates every capacity buffer for cap rows into b (b->st must have room
 * for n_kv x KV_ST_COUNT pointers, zeroed). 0 on failure (all freed). */
static int kv_capbuf_alloc(kv_core *c, kv_capbuf *b, uint32_t cap)
{
    if (kv_cap_bytes(c, cap, &b->scratch_n) == 0)
        return 0;
    int ok = 1;
    for (uint32_t h = 0; h < c->n_kv && ok; h++) {
        if (!c->alive[h])
            continue;
        for (int i = 0; i < KV_ST_COUNT && ok; i++) {
            size_t rb = kv_st_row_bytes(c, i);
            if (rb && !(b->st[h * KV_ST_COUNT + i] = kv_get(c, rb * cap)))
                ok = 0;
        }
    }
    ok = ok && (b->imp = kv_get(c, (size_t)4 * cap));
    ok = ok && (b->pend_mass = kv_get(c, (size_t)4 * c->spec_depth * cap));
    ok = ok && (b->scratch = kv_get(c, 4 * b->scratch_n));
    ok = ok && (b->idx = kv_get(c, (size_t)4 * cap));
    ok = ok && (b->keep = kv_get(c, cap));
    if (!ok) {
        kv_capbuf_free(c, b, cap);
        return 0;
    }
    return 1;
}

/* Moves the core onto capacity new_cap (> rows), copying every row and the
 * pending log. 0 (core unchanged) when an allocation fails. */
static int kv_regrow(kv_core *c, uint32_t new_cap)
{
    CHECK(new_cap >= c->rows && new_cap > 0);
    size_t nst = (size_t)c->n_kv * KV_ST_COUNT;
    void **st = kv_get(c, sizeof(void *) * nst);
    if (!st)
        return 0;
    memset(st, 0, sizeof(void *) * nst);
    kv_capbuf nb = {.st = st};
    if (!kv_capbuf_alloc(c, &nb, new_cap)) {
        kv_put(c, st, sizeof(void *) * nst);
        return 0;
    }
    kv_capbuf old = {.st = st, .imp = c->imp, .pend_mass = c->pend_mass,
                     .scratch = c->scratch, .idx = c->idx, .keep = c->keep,
                     .scratch_n = c->scratch_n};
    for (uint32_t h = 0; h < c->n_kv; h++)
        for (int i = 0; i < KV_ST_COUNT; i++) {
            void *np = st[h * KV_ST_COUNT + i];
            void *op = c->heads[h].st[i];
            if (op && c->rows)
                memcpy(np, op, kv_st_row_bytes(c, i) * c->rows);
            c->heads[h].st[i] = np;
            st[h * KV_ST_COUNT + i] = op; /* old pointers, freed below */
        }
    if (c->rows)
        memcpy(nb.imp, c->imp, (size_t)4 * c->rows);
    for (uint32_t s = 0; s < c->spec_depth; s++)
        if (c->pend[s].used)
            memcpy(nb.pend_mass + (size_t)s * new_cap, c->pend_mass + (size_t)s * c->cap,
                   (size_t)4 * c->pend[s].len);
    c->imp = nb.imp;
    c->pend_mass = nb.pend_mass;
    c->scratch = nb.scratch;
    c->scratch_n = nb.scratch_n;
    c->idx = nb.idx;
    c->keep = nb.keep;
    uint32_t old_cap = c->cap;
    c->cap = new_cap;
    if (old_cap)
        kv_capbuf_free(c, &old, old_cap);
    kv_put(c, st, sizeof(void *) * nst);
    return 1;
}

/* Frees everything the core holds (the core struct itself belongs to its
 * layer). */
static void kv_core_release(kv_core *c)
{
    if (c->heads) {
        for (uint32_t h = 0; h < c->n_kv; h++) {
            kv_head *hh = &c->heads[h];
            for (int i = 0; i < KV_ST_COUNT; i++) {
                kv_put(c, hh->st[i], kv_st_row_bytes(c, i) * c->cap);
                kv_put(c, hh->snap[i], kv_st_row_bytes(c, i) * c->freeze_rows);
            }
            kv_put(c, hh->col[0], (size_t)4 * c->hd);
            kv_put(c, hh->col[1], (size_t)4 * c->hd);
        }
        kv_put(c, c->heads, sizeof(kv_head) * c->n_kv);
    }
    kv_put(c, c->imp, (size_t)4 * c->cap);
    kv_put(c, c->pend_mass, (size_t)4 * c->spec_depth * c->cap);
    kv_put(c, c->scratch, 4 * c->scratch_n);
    kv_put(c, c->idx, (size_t)4 * c->cap);
    kv_put(c, c->keep, c->cap);
    kv_put(c, c->pend, sizeof(kv_pend) * c->spec_depth);
    kv_put(c, c->alive, c->n_kv);
    kv_put(c, c->linear, (size_t)4 * c->n_linear);
    if (c->bwin) {
        size_t n = (size_t)c->n_kv * c->bwin * c->hd * 4;
        kv_put(c, c->bk, n);
        kv_put(c, c->bv, n);
    }
    CHECK(c->held == 0);
}

/* ---- creation ------------------------------------------------------------ */

static pd_status kv_config_check(const kv_layer_config *cfg, pd_err *err)
{
    if (!cfg)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer: config is NULL");
    if (cfg->n_kv_heads == 0 || cfg->n_kv_heads > KV_MAX_HEADS)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer: n_kv_heads %u not in 1..%u",
                          cfg->n_kv_heads, KV_MAX_HEADS);
    if (cfg->head_dim == 0 || cfg->head_dim > KV_MAX_HEAD_DIM)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer: head_dim %u not in 1..%u", cfg->head_dim,
                          KV_MAX_HEAD_DIM);
    if ((unsigned)cfg->mode >= KV_MODE_COUNT)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer: mode %u unknown", (unsigned)cfg->mode);
    if (cfg->freeze_rows > KV_MAX_FREEZE_ROWS)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer: freeze_rows %u above %u", cfg->freeze_rows,
                          KV_MAX_FREEZE_ROWS);
    if (cfg->spec_depth > KV_MAX_SPEC_DEPTH)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer: spec_depth %u above %u", cfg->spec_depth,
                          KV_MAX_SPEC_DEPTH);
    if (cfg->max_q_per_kv > KV_MAX_Q_PER_KV)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer: max_q_per_kv %u above %u",
                          cfg->max_q_per_kv, KV_MAX_Q_PER_KV);
    if (cfg->capacity_rows > KV_MAX_ROWS)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer: capacity_rows %u above %u",
                          cfg->capacity_rows, KV_MAX_ROWS);
    return PD_OK;
}

/* Builds an empty layer with capacity cap (>= cfg's hint). */
static pd_status kv_create(const kv_layer_config *cfg, uint32_t cap, kv_layer **out, pd_err *err)
{
    const pd_alloc *a = cfg->alloc;
    kv_layer *l = pd_alloc_bytes(a, sizeof *l);
    if (!l)
        return pd_err_set(err, PD_ERR_NOMEM, "kv_layer: no memory for the layer object");
    *l = (kv_layer){.obj_alloc = a};
    kv_core *c = &l->c;
    *c = (kv_core){
        .alloc = a,
        .n_kv = cfg->n_kv_heads,
        .hd = cfg->head_dim,
        .ngk = quant_groups(cfg->head_dim, KV_K_GROUP),
        .freeze_rows = cfg->freeze_rows ? cfg->freeze_rows : KV_FREEZE_ROWS_DEFAULT,
        .spec_depth = cfg->spec_depth ? cfg->spec_depth : KV_SPEC_DEPTH_DEFAULT,
        .max_q = cfg->max_q_per_kv ? cfg->max_q_per_kv : 1,
        .mode = cfg->mode,
        .gen = kv_next_gen(),
    };
    int ok = (c->heads = kv_get(c, sizeof(kv_head) * c->n_kv)) != NULL;
    if (ok)
        memset(c->heads, 0, sizeof(kv_head) * c->n_kv);
    ok = ok && (c->alive = kv_get(c, c->n_kv)) && (c->pend = kv_get(c, sizeof(kv_pend) * c->spec_depth));
    if (ok) {
        memset(c->pend, 0, sizeof(kv_pend) * c->spec_depth);
        for (uint32_t h = 0; h < c->n_kv; h++) {
            c->alive[h] = cfg->alive ? (cfg->alive[h] != 0) : 1;
            c->n_alive += c->alive[h];
        }
        for (uint32_t h = 0; h < c->n_kv && ok; h++) {
            if (!c->alive[h])
                continue;
            kv_head *hh = &c->heads[h];
            if (kv_qk(c) && !(hh->col[0] = kv_get(c, (size_t)4 * c->hd)))
                ok = 0;
            if (ok && kv_qv(c) && !(hh->col[1] = kv_get(c, (size_t)4 * c->hd)))
                ok = 0;
            for (int i = 0; i < KV_ST_COUNT && ok; i++)
                if (kv_st_quant(c, i) &&
                    !(hh->snap[i] = kv_get(c, kv_st_row_bytes(c, i) * c->freeze_rows)))
                    ok = 0;
        }
    }
    if (ok && cap > 0)
        ok = kv_regrow(c, cap);
    if (!ok) {
        kv_core_release(c);
        pd_free_bytes(a, l, sizeof *l);
        return pd_err_set(err, PD_ERR_NOMEM, "kv_layer: no memory for %u rows of %u x %u", cap,
                          cfg->n_kv_heads, cfg->head_dim);
    }
    *out = l;
    return PD_OK;
}

uint64_t kv_layer_bytes_for(const kv_layer_config *cfg)
{
    pd_err e = {0};
    if (kv_config_check(cfg, &e) != PD_OK)
        return 0;
    /* the same core kv_create builds, without allocating */
    kv_core c = {.n_kv = cfg->n_kv_heads,
                 .hd = cfg->head_dim,
                 .ngk = quant_groups(cfg->head_dim, KV_K_GROUP),
                 .freeze_rows = cfg->freeze_rows ? cfg->freeze_rows : KV_FREEZE_ROWS_DEFAULT,
                 .spec_depth = cfg->spec_depth ? cfg->spec_depth : KV_SPEC_DEPTH_DEFAULT,
                 .max_q = cfg->max_q_per_kv ? cfg->max_q_per_kv : 1,
                 .mode = cfg->mode};
    for (uint32_t h = 0; h < c.n_kv; h++)
        c.n_alive += cfg->alive ? (cfg->alive[h] != 0) : 1;
    uint64_t b = sizeof(kv_layer) + sizeof(kv_head) * (uint64_t)c.n_kv + c.n_kv + sizeof(kv_pend) * (uint64_t)c.spec_depth;
    b += (uint64_t)c.n_alive * (kv_fields_bytes(&c) + kv_snap_bytes(&c));
    if (cfg->capacity_rows > 0) {
        size_t sn;
        size_t cap = kv_cap_bytes(&c, cfg->capacity_rows, &sn);
        if (cap == 0)
            return 0;
        b += cap; /* (kv_regrow's pointer table is freed before it returns) */
    }
    return b;
}

pd_status kv_layer_new(const kv_layer_config *cfg, kv_layer **out, pd_err *err)
{
    pd_status st = kv_config_check(cfg, err);
    if (st != PD_OK)
        return st;
    if (!out)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer: out is NULL");
    return kv_create(cfg, cfg->capacity_rows, out, err);
}

void kv_layer_free(kv_layer *l)
{
    if (!l)
        return;
    kv_core_release(&l->c);
    if (l->sinks)
        pd_free_bytes(l->obj_alloc, l->sinks, (size_t)4 * l->n_sinks);
    pd_free_bytes(l->obj_alloc, l, sizeof *l);
}

/* ---- pending importance log --------------------------------------------- */

/* Slot of the oldest pending query position, or -1. */
static int kv_pend_oldest(const kv_core *c)
{
    int best = -1;
    for (uint32_t s = 0; s < c->spec_depth; s++)
        if (c->pend[s].used && (best < 0 || c->pend[s].qpos < c->pend[best].qpos))
            best = (int)s;
    return best;
}

/* Adds slot s's mass into the stored importance (rows in order) and frees it. */
static void kv_pend_fold_slot(kv_core *c, uint32_t s)
{
    kv_pend *p = &c->pend[s];
    const float *m = c->pend_mass + (size_t)s * c->cap;
    CHECK(p->used && p->len <= c->rows);
    for (uint32_t r = 0; r < p->len; r++)
        c->imp[r] += m[r];
    if (c->folded_to < p->qpos + 1)
        c->folded_to = p->qpos + 1;
    p->used = 0;
    c->n_pend--;
}

/* Folds every pending query position below pos, oldest first. */
static void kv_pend_fold_below(kv_core *c, uint64_t pos)
{
    for (;;) {
        int s = kv_pend_oldest(c);
        if (s < 0 || c->pend[s].qpos >= pos)
            return;
        kv_pend_fold_slot(c, (uint32_t)s);
    }
}

/* Where an attend of query position qpos adds its mass: its pending entry
 * (claimed and zeroed on first use), or the stored importance directly for a
 * position already folded (or older than a full log). */
static float *kv_imp_target(kv_core *c, uint64_t qpos)
{
    if (qpos < c->folded_to)
        return c->imp;
    for (uint32_t s = 0; s < c->spec_depth; s++)
        if (c->pend[s].used && c->pend[s].qpos == qpos)
            return c->pend_mass + (size_t)s * c->cap;
    if (c->n_pend == c->spec_depth) {
        int o = kv_pend_oldest(c);
        if (c->pend[o].qpos > qpos)
            return c->imp;
        kv_pend_fold_slot(c, (uint32_t)o);
    }
    for (uint32_t s = 0; s < c->spec_depth; s++) {
        if (c->pend[s].used)
            continue;
        uint64_t len = qpos - c->base + 1;
        CHECK(len <= c->rows);
        c->pend[s] = (kv_pend){.qpos = qpos, .len = (uint32_t)len, .used = 1};
        c->n_pend++;
        float *m = c->pend_mass + (size_t)s * c->cap;
        memset(m, 0, sizeof(float) * len);
        return m;
    }
    CHECK(!"no free pending slot");
    return NULL;
}

/* Folds the whole log and drops the freeze undo: what consumers of the
 * importance (eviction) and layout rewrites need. */
static void kv_consume(kv_core *c)
{
    kv_pend_fold_below(c, UINT64_MAX);
    c->snap_valid = 0;
}

/* ---- the q8 field freeze ------------------------------------------------- */

static void kv_freeze(kv_core *c)
{
    const uint32_t n = c->rows, hd = c->hd;
    CHECK(n > 0 && n == c->freeze_rows && c->scratch_n >= hd);
    float *row = c->scratch;
    for (uint32_t h = 0; h < c->n_kv; h++) {
        if (!c->alive[h])
            continue;
        kv_head *hh = &c->heads[h];
        for (int i = 0; i < KV_ST_COUNT; i++)
            if (kv_st_quant(c, i))
                memcpy(hh->snap[i], hh->st[i], kv_st_row_bytes(c, i) * n);
        for (int comp = 0; comp < 2; comp++) {
            if (!(comp ? kv_qv(c) : kv_qk(c)))
                continue;
            int8_t *q = hh->st[comp ? KV_ST_V : KV_ST_K];
            float *s = hh->st[comp ? KV_ST_VS : KV_ST_KS];
            uint32_t group = comp ? hd : KV_K_GROUP, ng = comp ? 1 : c->ngk;
            float *col = hh->col[comp];
            memset(col, 0, sizeof(float) * hd);
            for (uint32_t p = 0; p < n; p++) {
                quant_q8_row_dequant(q + (size_t)p * hd, s + (size_t)p * ng, NULL, hd, group, row);
                for (uint32_t d = 0; d < hd; d++)
                    col[d] += row[d] * row[d];
            }
            for (uint32_t d = 0; d < hd; d++)
                col[d] = fmaxf(sqrtf(col[d] / (float)n), KV_FIELD_FLOOR);
            for (uint32_t p = 0; p < n; p++) {
                quant_q8_row_dequant(q + (size_t)p * hd, s + (size_t)p * ng, NULL, hd, group, row);
                quant_q8_row(row, col, hd, group, q + (size_t)p * hd, s + (size_t)p * ng);
            }
        }
    }
    c->frozen = 1;
    c->snap_valid = 1;
    kv_changed(c, 0);
}

/* Undoes the freeze for a rollback to rows <= freeze_rows. */
static void kv_unfreeze(kv_core *c, uint32_t rows)
{
    CHECK(c->snap_valid && rows <= c->freeze_rows);
    for (uint32_t h = 0; h < c->n_kv; h++) {
        if (!c->alive[h])
            continue;
        for (int i = 0; i < KV_ST_COUNT; i++)
            if (kv_st_quant(c, i) && rows)
                memcpy(c->heads[h].st[i], c->heads[h].snap[i], kv_st_row_bytes(c, i) * rows);
    }
    c->frozen = 0;
    c->snap_valid = 0;
    kv_changed(c, 0); /* every stored row went back to its pre-freeze bytes */
}

/* ---- appending ----------------------------------------------------------- */

pd_status kv_layer_append(kv_layer *l, const float *k, const float *v, pd_err *err)
{
    if (!l || !k || !v)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_append: NULL layer or rows");
    kv_core *c = &l->c;
    if (c->rows >= KV_MAX_ROWS)
        return pd_err_set(err, PD_ERR_RANGE, "kv_layer_append: %u rows is the limit", c->rows);
    if (c->rows == c->cap) {
        uint64_t nc = c->cap ? (uint64_t)c->cap * 2 : 16;
        if (nc > KV_MAX_ROWS)
            nc = KV_MAX_ROWS;
        if (!kv_regrow(c, (uint32_t)nc))
            return pd_err_set(err, PD_ERR_NOMEM, "kv_layer_append: cannot grow to %llu rows",
                              (unsigned long long)nc);
    }
    /* Freeze at the START of an append: only rows that are already stored
     * (and, once confirmed, survived verify) shape the field. */
    if (c->mode != KV_MODE_F32 && !c->frozen && c->rows >= c->freeze_rows)
        kv_freeze(c);
    const uint32_t r = c->rows, hd = c->hd;
    for (uint32_t h = 0; h < c->n_kv; h++) {
        if (!c->alive[h])
            continue;
        kv_head *hh = &c->heads[h];
        const float *kr = k + (size_t)h * hd, *vr = v + (size_t)h * hd;
        if (kv_qk(c))
            quant_q8_row(kr, c->frozen ? hh->col[0] : NULL, hd, KV_K_GROUP,
                         (int8_t *)hh->st[KV_ST_K] + (size_t)r * hd,
                         (float *)hh->st[KV_ST_KS] + (size_t)r * c->ngk);
        else
            memcpy((float *)hh->st[KV_ST_K] + (size_t)r * hd, kr, sizeof(float) * hd);
        if (kv_qv(c))
            quant_q8_row(vr, c->frozen ? hh->col[1] : NULL, hd, hd,
                         (int8_t *)hh->st[KV_ST_V] + (size_t)r * hd, (float *)hh->st[KV_ST_VS] + r);
        else
            memcpy((float *)hh->st[KV_ST_V] + (size_t)r * hd, vr, sizeof(float) * hd);
    }
    c->imp[r] = 0.0f;
    c->rows++;
    return PD_OK;
}

pd_status kv_layer_append_rows(kv_layer *l, uint32_t n, const float *k, const float *v,
                               pd_err *err)
{
    if (!l || (n && (!k || !v)))
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_append_rows: NULL layer or rows");
    size_t stride = (size_t)l->c.n_kv * l->c.hd;
    for (uint32_t i = 0; i < n; i++) {
        pd_status st = kv_layer_append(l, k + i * stride, v + i * stride, err);
        if (st != PD_OK) {
            pd_err_prefix(err, "row %u of %u (earlier rows stay appended)", i, n);
            return st;
        }
    }
    return PD_OK;
}

/* ---- attending ----------------------------------------------------------- */

size_t kv_layer_scratch_floats(const kv_layer *l, uint32_t n_q)
{
    return attn_scratch_floats(n_q ? n_q : 1, l->c.hd, l->c.rows);
}

/* kv_layer_attend over a list of stored rows (kv_attend.rows): one segment
 * per run of consecutive rows, the importance of the listed rows gathered
 * into imp_rows around the reduction so each p_r lands on its row with the
 * arithmetic of a layer holding only those rows. */
static pd_status kv_attend_rows(kv_layer *l, const kv_attend *a, uint32_t held, uint32_t *span_out,
                                pd_err *err)
{
    kv_core *c = &l->c;
    const uint32_t n = a->n_rows;
    if (n == 0 || !a->segs || (a->track_imp && !a->imp_rows) || a->probs)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_attend: a row list needs rows, segs (and imp_rows "
                                           "to track importance), and no probs");
    for (uint32_t i = 0; i < n; i++)
        if (a->rows[i] >= held || (i && a->rows[i] <= a->rows[i - 1]))
            return pd_err_set(err, PD_ERR_RANGE, "kv_layer_attend: row list entry %u (row %u) is not "
                                                 "increasing within %u rows", i, a->rows[i], held);
    float *scr = a->scratch ? a->scratch : c->scratch;
    size_t have = a->scratch ? a->scratch_floats : c->scratch_n;
    size_t need = attn_scratch_floats(a->n_q, c->hd, n);
    if (have < need)
        return pd_err_set(err, PD_ERR_RANGE, "kv_layer_attend: scratch of %zu floats, %u heads over %u rows need %zu",
                          have, a->n_q, n, need);
    const kv_head *hh = &c->heads[a->kv_head];
    const uint32_t upto = a->rows[n - 1] + 1;
    const int pre = c->snap_valid && upto <= c->freeze_rows; /* as the contiguous attend */
    const uint8_t *st[KV_ST_COUNT];
    for (int i = 0; i < KV_ST_COUNT; i++)
        st[i] = (const uint8_t *)(pre && kv_st_quant(c, i) ? hh->snap[i] : hh->st[i]);
    uint32_t ns = 0;
    for (uint32_t i = 0; i < n;) {
        uint32_t e = i + 1;
        while (e < n && a->rows[e] == a->rows[e - 1] + 1)
            e++;
        const size_t r = a->rows[i];
        attn_seg sg = {.rows = e - i};
        if (kv_qk(c)) {
            sg.kq = (const int8_t *)(st[KV_ST_K] + r * kv_st_row_bytes(c, KV_ST_K));
            sg.ks = (const float *)(const void *)(st[KV_ST_KS] + r * kv_st_row_bytes(c, KV_ST_KS));
        } else {
            sg.k = (const float *)(const void *)(st[KV_ST_K] + r * kv_st_row_bytes(c, KV_ST_K));
        }
        if (kv_qv(c)) {
            sg.vq = (const int8_t *)(st[KV_ST_V] + r * kv_st_row_bytes(c, KV_ST_V));
            sg.vs = (const float *)(const void *)(st[KV_ST_VS] + r * kv_st_row_bytes(c, KV_ST_VS));
        } else {
            sg.v = (const float *)(const void *)(st[KV_ST_V] + r * kv_st_row_bytes(c, KV_ST_V));
        }
        a->segs[ns++] = sg;
        i = e;
    }
    attn_kv kv = {.head_dim = c->hd,
                  .k_group = KV_K_GROUP,
                  .v_group = c->hd,
                  .kcol = c->frozen && !pre ? hh->col[0] : NULL,
                  .vcol = c->frozen && !pre ? hh->col[1] : NULL,
                  .segs = a->segs,
                  .n_segs = ns};
    attn_query q = {.n_heads = a->n_q,
                    .q = a->q,
                    .scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)c->hd),
                    .softcap = a->softcap,
                    .sinks = l->sinks ? l->sinks + a->q_head0 : NULL,
                    .first = 0,
                    .upto = n};
    float *target = a->track_imp ? kv_imp_target(c, c->base + upto - 1) : NULL;
    if (target)
        for (uint32_t i = 0; i < n; i++)
            a->imp_rows[i] = target[a->rows[i]];
    uint32_t span = attn_run(&kv, &q, a->out, NULL, target ? a->imp_rows : NULL, scr);
    if (target)
        for (uint32_t i = 0; i < n; i++)
            target[a->rows[i]] = a->imp_rows[i];
    if (span_out)
        *span_out = span;
    return PD_OK;
}

pd_status kv_layer_attend(kv_layer *l, const kv_attend *a, uint32_t *span_out, pd_err *err)
{
    if (!l || !a || !a->q || !a->out)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_attend: NULL layer, args, q or out");
    kv_core *c = &l->c;
    if (a->kv_head >= c->n_kv)
        return pd_err_set(err, PD_ERR_RANGE, "kv_layer_attend: kv_head %u of %u", a->kv_head,
                          c->n_kv);
    if (a->n_q == 0)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_attend: n_q is 0");
    if (l->sinks && (uint64_t)a->q_head0 + a->n_q > l->n_sinks)
        return pd_err_set(err, PD_ERR_RANGE,
                          "kv_layer_attend: Q heads %u..%u but the layer has %u sink logits",
                          a->q_head0, a->q_head0 + a->n_q - 1, l->n_sinks);
    const kv_head *hh = &c->heads[a->kv_head];
    uint32_t held = c->alive[a->kv_head] ? c->rows : 0;
    if (a->rows && held)
        return kv_attend_rows(l, a, held, span_out, err);
    uint32_t upto = (a->upto == 0 || a->upto > held) ? held : a->upto;
    uint32_t first = upto == 0 ? 0 : (a->first < upto ? a->first : upto - 1);
    float *scr = a->scratch ? a->scratch : c->scratch;
    size_t have = a->scratch ? a->scratch_floats : c->scratch_n;
    if (upto > 0) {
        size_t need = attn_scratch_floats(a->n_q, c->hd, upto - first);
        if (have < need)
            return pd_err_set(err, PD_ERR_RANGE,
                              "kv_layer_attend: scratch of %zu floats, %u heads over %u rows "
                              "need %zu",
                              have, a->n_q, upto - first, need);
    }
    attn_seg seg = {.rows = upto};
    /* A query that sees only rows before the freeze point while the freeze
     * can still be undone reads them as they were before it: the sequential
     * step at that position ran before the freeze, so a prefill or verify
     * chunk straddling the freeze gives the same bits. */
    const int pre = c->snap_valid && upto <= c->freeze_rows;
    if (pre && upto > 0) {
        if (kv_qk(c)) {
            seg.kq = hh->snap[KV_ST_K];
            seg.ks = hh->snap[KV_ST_KS];
        } else {
            seg.k = hh->st[KV_ST_K];
        }
        if (kv_qv(c)) {
            seg.vq = hh->snap[KV_ST_V];
            seg.vs = hh->snap[KV_ST_VS];
        } else {
            seg.v = hh->st[KV_ST_V];
        }
    } else if (upto > 0) {
        if (kv_qk(c)) {
            seg.kq = hh->st[KV_ST_K];
            seg.ks = hh->st[KV_ST_KS];
        } else {
            seg.k = hh->st[KV_ST_K];
        }
        if (kv_qv(c)) {
            seg.vq = hh->st[KV_ST_V];
            seg.vs = hh->st[KV_ST_VS];
        } else {
            seg.v = hh->st[KV_ST_V];
        }
    }
    attn_kv kv = {
        .head_dim = c->hd,
        .k_group = KV_K_GROUP,
        .v_group = c->hd,
        .kcol = c->frozen && !pre ? hh->col[0] : NULL,
        .vcol = c->frozen && !pre ? hh->col[1] : NULL,
        .segs = &seg,
        .n_segs = 1,
    };
    attn_query q = {
        .n_heads = a->n_q,
        .q = a->q,
        .scale = a->scale != 0.0f ? a->scale : 1.0f / sqrtf((float)c->hd),
        .softcap = a->softcap,
        .sinks = l->sinks ? l->sinks + a->q_head0 : NULL,
        .first = first,
        .upto = upto,
    };
    float *imp = NULL;
    if (a->track_imp && upto > 0)
        imp = kv_imp_target(c, c->base + upto - 1);
    uint32_t span = attn_run(&kv, &q, a->out, a->probs, imp, scr);
    if (span_out)
        *span_out = span;
    return PD_OK;
}

pd_status kv_layer_set_sinks(kv_layer *l, const float *sinks, uint32_t n_q_heads, pd_err *err)
{
    if (!l)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_set_sinks: NULL layer");
    float *ns = NULL;
    if (sinks && n_q_heads) {
        ns = pd_alloc_bytes(l->obj_alloc, (size_t)4 * n_q_heads);
        if (!ns)
            return pd_err_set(err, PD_ERR_NOMEM, "kv_layer_set_sinks: %u logits", n_q_heads);
        memcpy(ns, sinks, (size_t)4 * n_q_heads);
    }
    if (l->sinks)
        pd_free_bytes(l->obj_alloc, l->sinks, (size_t)4 * l->n_sinks);
    l->sinks = ns;
    l->n_sinks = ns ? n_q_heads : 0;
    return PD_OK;
}

/* ---- importance, speculation --------------------------------------------- */

void kv_layer_importance(const kv_layer *l, float *out)
{
    const kv_core *c = &l->c;
    if (c->rows)
        memcpy(out, c->imp, sizeof(float) * c->rows);
    /* the pending entries in position order, as folding would add them */
    uint64_t after = 0;
    int have_after = 0;
    for (;;) {
        int best = -1;
        for (uint32_t s = 0; s < c->spec_depth; s++) {
            const kv_pend *p = &c->pend[s];
            if (!p->used || (have_after && p->qpos <= after))
                continue;
            if (best < 0 || p->qpos < c->pend[best].qpos)
                best = (int)s;
        }
        if (best < 0)
            return;
        const float *m = c->pend_mass + (size_t)best * c->cap;
        for (uint32_t r = 0; r < c->pend[best].len; r++)
            out[r] += m[r];
        after = c->pend[best].qpos;
        have_after = 1;
    }
}

pd_status kv_layer_add_importance(kv_layer *l, const float *mass, pd_err *err)
{
    if (!l || (!mass && l->c.rows))
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_add_importance: NULL layer or mass");
    for (uint32_t r = 0; r < l->c.rows; r++)
        l->c.imp[r] += mass[r];
    return PD_OK;
}

void kv_layer_confirm(kv_layer *l, uint64_t pos)
{
    kv_core *c = &l->c;
    uint64_t end = c->base + c->rows;
    if (pos > end)
        pos = end;
    kv_pend_fold_below(c, pos);
    if (c->folded_to < pos)
        c->folded_to = pos;
    /* the append that froze wrote row freeze_rows (position base + freeze_rows) */
    if (c->snap_valid && pos > c->base + c->freeze_rows)
        c->snap_valid = 0;
}

pd_status kv_layer_truncate_last(kv_layer *l, uint64_t n, pd_err *err)
{
    if (!l)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_truncate_last: NULL layer");
    kv_core *c = &l->c;
    if (n > c->rows)
        return pd_err_set(err, PD_ERR_RANGE, "kv_layer_truncate_last: %llu rows of %u",
                          (unsigned long long)n, c->rows);
    if (n == 0)
        return PD_OK;
    uint32_t rows = c->rows - (uint32_t)n;
    uint64_t end = c->base + rows;
    for (uint32_t s = 0; s < c->spec_depth; s++)
        if (c->pend[s].used && c->pend[s].qpos >= end) {
            c->pend[s].used = 0;
            c->n_pend--;
        }
    if (c->folded_to > end)
        c->folded_to = end;
    if (c->snap_valid && rows <= c->freeze_rows)
        kv_unfreeze(c, rows);
    c->rows = rows;
    kv_changed(c, rows);
    return PD_OK;
}

void kv_layer_clear(kv_layer *l)
{
    kv_core *c = &l->c;
    c->rows = 0;
    c->base = 0;
    c->frozen = 0;
    c->snap_valid = 0;
    for (uint32_t s = 0; s < c->spec_depth; s++)
        c->pend[s].used = 0;
    c->n_pend = 0;
    c->folded_to = 0;
    kv_put(c, c->linear, (size_t)4 * c->n_linear);
    c->linear = NULL;
    c->n_linear = 0;
    if (c->bwin) {
        size_t n = (size_t)c->n_kv * c->bwin * c->hd;
        memset(c->bk, 0, sizeof(float) * n);
        memset(c->bv, 0, sizeof(float) * n);
        c->blen = 0;
    }
    kv_changed(c, 0);
}

/* ---- eviction and sliding tail ------------------------------------------ */

/* Keeps rows kept[0..n) (strictly increasing) of every storage, in order.
 * Each storage is gathered on its own with the same list, so mixed modes
 * stay consistent. */
static void kv_gather(kv_core *c, const uint32_t *kept, uint32_t n)
{
    for (uint32_t h = 0; h < c->n_kv; h++)
        for (int i = 0; i < KV_ST_COUNT; i++) {
            uint8_t *p = c->heads[h].st[i];
            size_t rb = kv_st_row_bytes(c, i);
            if (!p)
                continue;
            for (uint32_t j = 0; j < n; j++)
                if (kept[j] != j)
                    memmove(p + j * rb, p + (size_t)kept[j] * rb, rb);
        }
    for (uint32_t j = 0; j < n; j++)
        c->imp[j] = c->imp[kept[j]];
    c->rows = n;
}

static int kv_evict_blocked(const kv_core *c)
{
    /* a sliding tail is its own bound (a gather would break its contiguous
     * window); a bounded ring evicts itself */
    return c->tail != 0 || c->bwin != 0;
}

/* After an eviction: the depth shrank with the rows (as the seed). */
static void kv_after_evict(kv_core *c)
{
    c->folded_to = c->base + c->rows;
    kv_changed(c, 0);
}

uint64_t kv_layer_evict_recent(kv_layer *l, uint64_t keep_last)
{
    kv_core *c = &l->c;
    if (kv_evict_blocked(c) || c->rows <= keep_last)
        return 0;
    kv_consume(c);
    uint32_t d = c->rows - (uint32_t)keep_last, n = (uint32_t)keep_last;
    for (uint32_t j = 0; j < n; j++)
        c->idx[j] = d + j;
    kv_gather(c, c->idx, n);
    kv_after_evict(c);
    return d;
}

/* Eviction order: higher importance first (NaN as the lowest), then the
 * older row. */
static int kv_before(const float *imp, uint32_t a, uint32_t b)
{
    float ka = isnan(imp[a]) ? -INFINITY : imp[a], kb = isnan(imp[b]) ? -INFINITY : imp[b];
    return ka > kb || (ka == kb && a < b);
}

static void kv_sift(uint32_t *x, uint32_t n, uint32_t i, const float *imp)
{
    for (;;) {
        uint32_t m = i, lc = 2 * i + 1, rc = 2 * i + 2;
        if (lc < n && kv_before(imp, x[m], x[lc]))
            m = lc;
        if (rc < n && kv_before(imp, x[m], x[rc]))
            m = rc;
        if (m == i)
            return;
        uint32_t t = x[i];
        x[i] = x[m];
        x[m] = t;
        i = m;
    }
}

/* Heap sort of x[0..n) into kv_before order (no allocation). */
static void kv_sort(uint32_t *x, uint32_t n, const float *imp)
{
    for (uint32_t i = n / 2; i-- > 0;)
        kv_sift(x, n, i, imp);
    for (uint32_t e = n; e > 1; e--) {
        uint32_t t = x[0];
        x[0] = x[e - 1];
        x[e - 1] = t;
        kv_sift(x, e - 1, 0, imp);
    }
}

uint32_t kv_select_importance(const float *imp, uint32_t rows, uint64_t budget, uint64_t sinks,
                              uint64_t recent, uint32_t *idx, uint8_t *flag)
{
    if (rows <= budget) {
        for (uint32_t r = 0; r < rows; r++)
            idx[r] = r;
        return rows;
    }
    uint32_t sink_n = (uint32_t)(sinks < budget ? sinks : budget);
    uint32_t recent_n = (uint32_t)(recent < budget - sink_n ? recent : budget - sink_n);
    uint32_t fill = (uint32_t)budget - sink_n - recent_n;
    memset(flag, 0, rows);
    for (uint32_t r = 0; r < sink_n; r++)
        flag[r] = 1;
    for (uint32_t r = rows - recent_n; r < rows; r++)
        flag[r] = 1;
    uint32_t m = 0;
    for (uint32_t r = sink_n; r < rows - recent_n; r++)
        idx[m++] = r;
    kv_sort(idx, m, imp);
    for (uint32_t j = 0; j < fill && j < m; j++)
        flag[idx[j]] = 1;
    uint32_t n = 0;
    for (uint32_t r = 0; r < rows; r++)
        if (flag[r])
            idx[n++] = r;
    CHECK(n <= budget);
    return n;
}

uint64_t kv_layer_evict_importance(kv_layer *l, uint64_t budget, uint64_t sinks, uint64_t recent)
{
    kv_core *c = &l->c;
    if (kv_evict_blocked(c) || c->rows <= budget)
        return 0;
    kv_consume(c);
    const uint32_t rows = c->rows;
    uint32_t n = kv_select_importance(c->imp, rows, budget, sinks, recent, c->idx, c->keep);
    kv_gather(c, c->idx, n);
    kv_after_evict(c);
    return rows - n;
}

pd_status kv_layer_keep_rows(kv_layer *l, const uint32_t *rows, uint32_t n, pd_err *err)
{
    kv_core *c = &l->c;
    if (kv_evict_blocked(c))
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_keep_rows: a tail or bounded layer does not evict");
    if (n && !rows)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_keep_rows: NULL list");
    for (uint32_t i = 0; i < n; i++)
        if (rows[i] >= c->rows || (i && rows[i] <= rows[i - 1]))
            return pd_err_set(err, PD_ERR_RANGE,
                              "kv_layer_keep_rows: entry %u (row %u) is not increasing within %u rows", i,
                              rows[i], c->rows);
    if (n == c->rows)
        return PD_OK; /* every row, in order: nothing to drop */
    kv_consume(c);
    memcpy(c->idx, rows, sizeof(uint32_t) * n);
    kv_gather(c, c->idx, n);
    kv_after_evict(c);
    return PD_OK;
}

pd_status kv_layer_keep_rows_below(kv_layer *l, const uint32_t *rows, uint32_t n, uint64_t below, pd_err *err)
{
    kv_core *c = &l->c;
    if (kv_evict_blocked(c))
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_keep_rows_below: a tail or bounded layer does not evict");
    if (below > c->rows || n > below || (n && !rows))
        return pd_err_set(err, PD_ERR_RANGE, "kv_layer_keep_rows_below: %u rows below %llu of %u", n,
                          (unsigned long long)below, c->rows);
    for (uint32_t i = 0; i < n; i++)
        if (rows[i] >= below || (i && rows[i] <= rows[i - 1]))
            return pd_err_set(err, PD_ERR_RANGE,
                              "kv_layer_keep_rows_below: entry %u (row %u) is not increasing below %llu", i,
                              rows[i], (unsigned long long)below);
    if (n == below)
        return PD_OK;
    if (c->snap_valid)
        return pd_err_set(err, PD_ERR_REFUSED, "kv_layer_keep_rows_below: a q8 freeze can still be undone");
    const uint64_t cut = c->base + below;
    kv_pend_fold_below(c, cut);
    if (c->folded_to < cut)
        c->folded_to = cut;
    const uint32_t removed = (uint32_t)below - n, m = c->rows - removed;
    memcpy(c->idx, rows, sizeof(uint32_t) * n);
    for (uint32_t r = (uint32_t)below; r < c->rows; r++)
        c->idx[n + r - (uint32_t)below] = r;
    /* the entries still pending move with their rows (idx[i] >= i: forward) */
    for (uint32_t s = 0; s < c->spec_depth; s++) {
        kv_pend *p = &c->pend[s];
        if (!p->used)
            continue;
        CHECK(p->qpos >= cut && p->len > below);
        float *ms = c->pend_mass + (size_t)s * c->cap;
        uint32_t len = p->len - removed;
        for (uint32_t i = 0; i < len; i++)
            ms[i] = ms[c->idx[i]];
        p->len = len;
        p->qpos -= removed;
    }
    kv_gather(c, c->idx, m);
    c->folded_to -= removed;
    kv_changed(c, 0);
    return PD_OK;
}

void kv_layer_importance_below(const kv_layer *l, uint64_t row, float *out)
{
    const kv_core *c = &l->c;
    CHECK(row <= c->rows);
    const uint64_t end = c->base + row;
    if (row)
        memcpy(out, c->imp, sizeof(float) * row);
    /* the pending entries below end in position order, as folding adds them
     * (an entry of position q covers rows [0, q - base], all below row) */
    uint64_t after = 0;
    int have_after = 0;
    for (;;) {
        int best = -1;
        for (uint32_t s = 0; s < c->spec_depth; s++) {
            const kv_pend *p = &c->pend[s];
            if (!p->used || p->qpos >= end || (have_after && p->qpos <= after))
                continue;
            if (best < 0 || p->qpos < c->pend[best].qpos)
                best = (int)s;
        }
        if (best < 0)
            return;
        const float *m = c->pend_mass + (size_t)best * c->cap;
        for (uint32_t r = 0; r < c->pend[best].len; r++)
            out[r] += m[r];
        after = c->pend[best].qpos;
        have_after = 1;
    }
}

uint64_t kv_layer_trim_window(kv_layer *l, uint64_t w, uint64_t slack, uint64_t align)
{
    return kv_layer_trim_window_anchored(l, w, slack, align, UINT64_MAX);
}

uint64_t kv_layer_trim_window_anchored(kv_layer *l, uint64_t w, uint64_t slack, uint64_t align,
                                       uint64_t anchor)
{
    kv_core *c = &l->c;
    if (c->bwin || w == 0)
        return 0;
    c->tail = w;
    if (w >= ((uint64_t)c->rows + 1) / 2) /* rows <= 2w */
        return 0;
    /* the freeze reads every stored row: no trim before it. While it can be
     * undone the snapshot indexes rows from row 0: no trim either, until the
     * freezing append is more than spec_depth rows deep (then no rollback
     * within spec_depth reaches it and the snapshot goes). */
    if (c->mode != KV_MODE_F32 && !c->frozen)
        return 0;
    if (c->snap_valid) {
        if (c->rows <= (uint64_t)c->freeze_rows + c->spec_depth)
            return 0;
        c->snap_valid = 0;
    }
    if (align == 0)
        align = 1;
    uint64_t ws = w + slack < w ? UINT64_MAX : w + slack;
    uint64_t end = c->base + c->rows;
    uint64_t a = end > ws ? end - ws : 0, b = anchor > ws ? anchor - ws : 0;
    uint64_t new_base = (a < b ? a : b) / align * align;
    if (new_base <= c->base)
        return 0;
    uint32_t d = (uint32_t)(new_base - c->base);
    CHECK(d < c->rows);
    kv_pend_fold_below(c, new_base); /* their mass lands on dropped rows only */
    for (uint32_t h = 0; h < c->n_kv; h++)
        for (int i = 0; i < KV_ST_COUNT; i++) {
            uint8_t *p = c->heads[h].st[i];
            size_t rb = kv_st_row_bytes(c, i);
            if (p)
                memmove(p, p + (size_t)d * rb, (size_t)(c->rows - d) * rb);
        }
    memmove(c->imp, c->imp + d, sizeof(float) * (c->rows - d));
    for (uint32_t s = 0; s < c->spec_depth; s++) {
        kv_pend *p = &c->pend[s];
        if (!p->used)
            continue;
        CHECK(p->len > d);
        float *m = c->pend_mass + (size_t)s * c->cap;
        memmove(m, m + d, sizeof(float) * (p->len - d));
        p->len -= d;
    }
    c->base = new_base;
    c->rows -= d;
    if (c->folded_to < new_base)
        c->folded_to = new_base;
    kv_changed(c, 0);
    return d;
}

/* ---- recurrent records ----------------------------------------------------- */

pd_status kv_layer_set_linear(kv_layer *l, const float *x, uint64_t n, pd_err *err)
{
    if (!l || (n && !x))
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_set_linear: NULL layer or vector");
    kv_core *c = &l->c;
    if (n > SIZE_MAX / 8)
        return pd_err_set(err, PD_ERR_NOMEM, "kv_layer_set_linear: %llu floats",
                          (unsigned long long)n);
    float *nx = NULL;
    if (n) {
        nx = kv_get(c, (size_t)4 * n);
        if (!nx)
            return pd_err_set(err, PD_ERR_NOMEM, "kv_layer_set_linear: %llu floats",
                              (unsigned long long)n);
        memcpy(nx, x, (size_t)4 * n);
    }
    kv_put(c, c->linear, (size_t)4 * c->n_linear);
    c->linear = nx;
    c->n_linear = n;
    kv_changed(c, c->rows); /* no row changes */
    return PD_OK;
}

/* Floats of one bounded ring buffer (K or V) with window w; 0 past the
 * limit. */
static size_t kv_ring_floats(const kv_core *c, uint32_t w)
{
    size_t n;
    if (!kv_mul((size_t)c->n_kv * c->hd, w, &n) || n > KV_MAX_RING_FLOATS)
        return 0;
    return n;
}

pd_status kv_layer_install_bounded(kv_layer *l, uint32_t window, pd_err *err)
{
    if (!l || window == 0)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_install_bounded: NULL layer or window 0");
    kv_core *c = &l->c;
    size_t n = kv_ring_floats(c, window);
    if (n == 0)
        return pd_err_set(err, PD_ERR_RANGE,
                          "kv_layer_install_bounded: window %u x %u heads x %u exceeds %zu floats",
                          window, c->n_kv, c->hd, KV_MAX_RING_FLOATS);
    float *k = kv_get(c, 4 * n);
    float *v = k ? kv_get(c, 4 * n) : NULL;
    if (!v) {
        kv_put(c, k, 4 * n);
        return pd_err_set(err, PD_ERR_NOMEM, "kv_layer_install_bounded: window %u", window);
    }
    memset(k, 0, 4 * n);
    memset(v, 0, 4 * n);
    if (c->bwin) {
        size_t on = kv_ring_floats(c, c->bwin);
        kv_put(c, c->bk, 4 * on);
        kv_put(c, c->bv, 4 * on);
    }
    c->bk = k;
    c->bv = v;
    c->bwin = window;
    c->blen = 0;
    kv_changed(c, 0);
    return PD_OK;
}

pd_status kv_layer_bounded_insert(kv_layer *l, const float *k, const float *v, pd_err *err)
{
    if (!l || !k || !v)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_bounded_insert: NULL layer or rows");
    kv_core *c = &l->c;
    if (!c->bwin)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_bounded_insert: no bounded ring installed");
    if (c->blen == UINT64_MAX)
        return pd_err_set(err, PD_ERR_RANGE, "kv_layer_bounded_insert: insert count at its limit");
    uint32_t slot = (uint32_t)(c->blen % c->bwin);
    for (uint32_t h = 0; h < c->n_kv; h++) {
        size_t at = ((size_t)h * c->bwin + slot) * c->hd;
        memcpy(c->bk + at, k + (size_t)h * c->hd, sizeof(float) * c->hd);
        memcpy(c->bv + at, v + (size_t)h * c->hd, sizeof(float) * c->hd);
    }
    c->blen++;
    return PD_OK;
}

/* ---- accessors ------------------------------------------------------------ */

uint64_t kv_layer_rows(const kv_layer *l) { return l->c.rows; }
uint64_t kv_layer_base(const kv_layer *l) { return l->c.base; }
uint64_t kv_layer_pos_len(const kv_layer *l) { return l->c.base + l->c.rows; }
uint64_t kv_layer_tail_window(const kv_layer *l) { return l->c.tail; }
kv_mode kv_layer_mode(const kv_layer *l) { return l->c.mode; }
int kv_layer_frozen(const kv_layer *l) { return l->c.frozen; }
uint64_t kv_layer_generation(const kv_layer *l) { return l->c.gen; }

void kv_layer_memory(const kv_layer *l, kv_memory *out)
{
    const kv_core *c = &l->c;
    uint64_t att = (uint64_t)c->rows * (4 + (uint64_t)c->n_alive * kv_row_bytes_all(c));
    if (c->frozen)
        att += (uint64_t)c->n_alive * kv_fields_bytes(c);
    uint64_t rec = (uint64_t)4 * c->n_linear;
    if (c->bwin)
        rec += (uint64_t)8 * kv_ring_floats(c, c->bwin);
    *out = (kv_memory){
        .attention = att,
        .recurrent = rec,
        .allocated = c->held + sizeof *l + (uint64_t)4 * l->n_sinks,
    };
}

/* ---- invariants ------------------------------------------------------------ */

/* Bytes the core must hold from its allocator, recomputed from its shape. */
static uint64_t kv_expected_held(const kv_core *c)
{
    uint64_t b = c->n_kv + sizeof(kv_head) * (uint64_t)c->n_kv +
                 sizeof(kv_pend) * (uint64_t)c->spec_depth +
                 (uint64_t)c->n_alive * (kv_fields_bytes(c) + kv_snap_bytes(c));
    if (c->cap)
        b += kv_cap_bytes(c, c->cap, NULL);
    b += (uint64_t)4 * c->n_linear;
    if (c->bwin)
        b += (uint64_t)8 * kv_ring_floats(c, c->bwin);
    return b;
}

void kv_layer_check(const kv_layer *l)
{
    const kv_core *c = &l->c;
    CHECK(c->n_kv >= 1 && c->hd >= 1 && (unsigned)c->mode < KV_MODE_COUNT);
    CHECK(c->ngk == quant_groups(c->hd, KV_K_GROUP));
    CHECK(c->freeze_rows >= 1 && c->spec_depth >= 1 && c->max_q >= 1);
    CHECK(c->rows <= c->cap && c->cap <= KV_MAX_ROWS);
    CHECK(c->base <= UINT64_MAX - c->rows);
    const uint64_t end = c->base + c->rows;
    uint32_t n_alive = 0;
    for (uint32_t h = 0; h < c->n_kv; h++) {
        const kv_head *hh = &c->heads[h];
        CHECK(c->alive[h] == 0 || c->alive[h] == 1);
        n_alive += c->alive[h];
        for (int i = 0; i < KV_ST_COUNT; i++) {
            int held = c->alive[h] && kv_st_row_bytes(c, i) && c->cap;
            CHECKF(held == (hh->st[i] != NULL), "head %u storage %d", h, i);
            int snap = c->alive[h] && kv_st_quant(c, i) && kv_st_row_bytes(c, i);
            CHECKF(snap == (hh->snap[i] != NULL), "head %u snapshot %d", h, i);
        }
        CHECK((c->alive[h] && kv_qk(c)) == (hh->col[0] != NULL));
        CHECK((c->alive[h] && kv_qv(c)) == (hh->col[1] != NULL));
        if (!c->alive[h])
            continue;
        for (int comp = 0; comp < 2; comp++) {
            if (!(comp ? kv_qv(c) : kv_qk(c)))
                continue;
            const int8_t *q = hh->st[comp ? KV_ST_V : KV_ST_K];
            const float *s = hh->st[comp ? KV_ST_VS : KV_ST_KS];
            size_t ns = (size_t)c->rows * (comp ? 1 : c->ngk);
            for (size_t j = 0; j < (size_t)c->rows * c->hd; j++)
                CHECKF(q[j] != -128, "head %u %c int8 value -128 at %zu", h, comp ? 'V' : 'K', j);
            for (size_t j = 0; j < ns; j++)
                CHECKF(s[j] >= KV_SCALE_FLOOR, "head %u %c scale %zu = %g", h, comp ? 'V' : 'K',
                       j, (double)s[j]);
            if (c->frozen)
                for (uint32_t d = 0; d < c->hd; d++)
                    CHECKF(hh->col[comp][d] >= KV_FIELD_FLOOR, "head %u field %u", h, d);
        }
    }
    CHECK(n_alive == c->n_alive);
    CHECK(!(c->mode == KV_MODE_F32 && c->frozen));
    if (c->mode != KV_MODE_F32 && !c->frozen)
        CHECKF(c->rows <= c->freeze_rows, "unfrozen q8 layer with %u rows", c->rows);
    if (c->snap_valid)
        CHECK(c->frozen && c->rows > c->freeze_rows);
    CHECK(c->folded_to <= end);
    uint32_t used = 0;
    for (uint32_t s = 0; s < c->spec_depth; s++) {
        const kv_pend *p = &c->pend[s];
        if (!p->used)
            continue;
        used++;
        CHECK(p->used == 1);
        CHECKF(p->qpos >= c->folded_to && p->qpos >= c->base && p->qpos < end,
               "pending qpos %llu, folded_to %llu, rows [%llu, %llu)",
               (unsigned long long)p->qpos, (unsigned long long)c->folded_to,
               (unsigned long long)c->base, (unsigned long long)end);
        CHECK(p->len == p->qpos - c->base + 1);
        for (uint32_t t = 0; t < s; t++)
            CHECK(!c->pend[t].used || c->pend[t].qpos != p->qpos);
    }
    CHECK(used == c->n_pend && used <= c->spec_depth);
    CHECK((c->n_linear == 0) == (c->linear == NULL));
    if (c->bwin)
        CHECK(c->bk && c->bv);
    else
        CHECK(!c->bk && !c->bv && c->blen == 0);
    if (c->cap)
        CHECK(c->imp && c->pend_mass && c->scratch && c->idx && c->keep &&
              c->scratch_n == attn_scratch_floats(c->max_q, c->hd, c->cap));
    CHECKF(c->held == kv_expected_held(c), "held %llu bytes, shape says %llu",
           (unsigned long long)c->held, (unsigned long long)kv_expected_held(c));
    CHECK(l->n_sinks == 0 || l->sinks);
}

/* ---- state view / install ----------------------------------------------------- */

void kv_layer_state(const kv_layer *l, kv_state *out, kv_head_state *heads)
{
    const kv_core *c = &l->c;
    for (uint32_t h = 0; h < c->n_kv; h++) {
        const kv_head *hh = &c->heads[h];
        heads[h] = (kv_head_state){0};
        if (!c->alive[h])
            continue;
        if (kv_qk(c)) {
            heads[h].kq = hh->st[KV_ST_K];
            heads[h].ks = hh->st[KV_ST_KS];
            heads[h].kcol = c->frozen ? hh->col[0] : NULL;
        } else {
            heads[h].k = hh->st[KV_ST_K];
        }
        if (kv_qv(c)) {
            heads[h].vq = hh->st[KV_ST_V];
            heads[h].vs = hh->st[KV_ST_VS];
            heads[h].vcol = c->frozen ? hh->col[1] : NULL;
        } else {
            heads[h].v = hh->st[KV_ST_V];
        }
    }
    *out = (kv_state){
        .n_kv_heads = c->n_kv,
        .head_dim = c->hd,
        .k_group = KV_K_GROUP,
        .freeze_rows = c->freeze_rows,
        .mode = c->mode,
        .alive = c->alive,
        .rows = c->rows,
        .base = c->base,
        .tail_window = (uint32_t)(c->tail > UINT32_MAX ? UINT32_MAX : c->tail),
        .frozen = c->frozen,
        .imp = c->rows ? c->imp : NULL,
        .n_imp = c->rows,
        .linear = c->linear,
        .n_linear = c->n_linear,
        .has_bounded = c->bwin != 0,
        .bounded = {.window = c->bwin, .len = c->blen,
                    .head = c->bwin ? (uint32_t)(c->blen % c->bwin) : 0,
                    .k = c->bk, .v = c->bv},
        .heads = heads,
        .imp_pending = c->n_pend,
    };
}

/* One storage pointer of a head in a state: must be NULL when the layer
 * does not hold it, present when it does and there are rows. */
static pd_status kv_state_ptr(const void *p, int held, uint64_t rows, uint32_t h, const char *name,
                              pd_err *err)
{
    if (!held && p)
        return pd_err_set(err, PD_ERR_FORMAT,
                          "kv state: heads[%u].%s given but this mode / alive mask / freeze "
                          "state does not hold it",
                          h, name);
    if (held && rows && !p)
        return pd_err_set(err, PD_ERR_FORMAT, "kv state: heads[%u].%s missing for %llu rows", h,
                          name, (unsigned long long)rows);
    return PD_OK;
}

static pd_status kv_state_q8(const int8_t *q, const float *s, uint64_t rows, uint32_t hd,
                             uint32_t ng, uint32_t h, char which, pd_err *err)
{
    for (uint64_t j = 0; j < rows * hd; j++)
        if (q[j] == -128)
            return pd_err_set(err, PD_ERR_FORMAT,
                              "kv state: heads[%u].%cq[%llu] = -128 is outside the q8 range", h,
                              which, (unsigned long long)j);
    for (uint64_t j = 0; j < rows * ng; j++)
        if (!(s[j] >= KV_SCALE_FLOOR))
            return pd_err_set(err, PD_ERR_FORMAT,
                              "kv state: heads[%u].%cs[%llu] = %g is below the scale floor", h,
                              which, (unsigned long long)j, (double)s[j]);
    return PD_OK;
}

static pd_status kv_state_check(const kv_layer_config *cfg, const kv_state *s, pd_err *err)
{
    const uint32_t fr = cfg->freeze_rows ? cfg->freeze_rows : KV_FREEZE_ROWS_DEFAULT;
    if (s->n_kv_heads != cfg->n_kv_heads)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv state: n_kv_heads %u, the layer has %u",
                          s->n_kv_heads, cfg->n_kv_heads);
    if (s->head_dim != cfg->head_dim)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv state: head_dim %u, the layer has %u",
                          s->head_dim, cfg->head_dim);
    if (s->mode != cfg->mode)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv state: mode %u, the layer has %u",
                          (unsigned)s->mode, (unsigned)cfg->mode);
    if (s->k_group != KV_K_GROUP)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv state: k_group %u, this build uses %u",
                          s->k_group, KV_K_GROUP);
    if (s->freeze_rows != fr)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv state: freeze_rows %u, the layer has %u",
                          s->freeze_rows, fr);
    if (!s->alive || !s->heads)
        return pd_err_set(err, PD_ERR_ARG, "kv state: alive or heads is NULL");
    for (uint32_t h = 0; h < s->n_kv_heads; h++) {
        int want = cfg->alive ? cfg->alive[h] != 0 : 1;
        if ((s->alive[h] != 0) != want)
            return pd_err_set(err, PD_ERR_MISMATCH, "kv state: alive[%u] = %u, the layer says %d",
                              h, s->alive[h], want);
    }
    if (s->rows > KV_MAX_ROWS)
        return pd_err_set(err, PD_ERR_RANGE, "kv state: rows %llu above %u",
                          (unsigned long long)s->rows, KV_MAX_ROWS);
    if (s->base > UINT64_MAX - s->rows)
        return pd_err_set(err, PD_ERR_RANGE, "kv state: base %llu + rows %llu overflows",
                          (unsigned long long)s->base, (unsigned long long)s->rows);
    if (s->frozen != 0 && s->frozen != 1)
        return pd_err_set(err, PD_ERR_FORMAT, "kv state: frozen = %d", s->frozen);
    if (s->frozen && s->mode == KV_MODE_F32)
        return pd_err_set(err, PD_ERR_FORMAT, "kv state: frozen on an f32 layer (no field)");
    if (s->mode != KV_MODE_F32 && !s->frozen && s->rows > fr)
        return pd_err_set(err, PD_ERR_FORMAT,
                          "kv state: frozen = 0 with %llu rows; a q8 layer freezes at %u",
                          (unsigned long long)s->rows, fr);
    if (s->n_imp != 0 && s->n_imp != s->rows)
        return pd_err_set(err, PD_ERR_FORMAT, "kv state: n_imp %llu for %llu rows",
                          (unsigned long long)s->n_imp, (unsigned long long)s->rows);
    if (s->n_imp && !s->imp)
        return pd_err_set(err, PD_ERR_ARG, "kv state: imp is NULL for n_imp %llu",
                          (unsigned long long)s->n_imp);
    if (s->imp_pending)
        return pd_err_set(err, PD_ERR_REFUSED,
                          "kv state: imp_pending %u (confirm the layer before exporting)",
                          s->imp_pending);
    if (s->n_linear > SIZE_MAX / 8)
        return pd_err_set(err, PD_ERR_RANGE, "kv state: n_linear %llu",
                          (unsigned long long)s->n_linear);
    if (s->n_linear && !s->linear)
        return pd_err_set(err, PD_ERR_ARG, "kv state: linear is NULL for n_linear %llu",
                          (unsigned long long)s->n_linear);
    if (s->has_bounded != 0 && s->has_bounded != 1)
        return pd_err_set(err, PD_ERR_FORMAT, "kv state: has_bounded = %d", s->has_bounded);
    if (s->has_bounded) {
        const kv_bounded_state *b = &s->bounded;
        size_t n;
        if (b->window == 0)
            return pd_err_set(err, PD_ERR_FORMAT, "kv state: bounded.window is 0");
        if (!kv_mul((size_t)s->n_kv_heads * s->head_dim, b->window, &n) ||
            n > KV_MAX_RING_FLOATS)
            return pd_err_set(err, PD_ERR_RANGE,
                              "kv state: bounded.window %u x %u heads x %u exceeds %zu floats",
                              b->window, s->n_kv_heads, s->head_dim, KV_MAX_RING_FLOATS);
        if (b->head != b->len % b->window)
            return pd_err_set(err, PD_ERR_FORMAT,
                              "kv state: bounded.head %u, len %llu mod window %u says %llu",
                              b->head, (unsigned long long)b->len, b->window,
                              (unsigned long long)(b->len % b->window));
        if (!b->k || !b->v)
            return pd_err_set(err, PD_ERR_ARG, "kv state: bounded.k or bounded.v is NULL");
    }
    const int qk = (s->mode & KV_MODE_Q8K) != 0, qv = (s->mode & KV_MODE_Q8V) != 0;
    const uint32_t hd = s->head_dim, ngk = quant_groups(hd, KV_K_GROUP);
    for (uint32_t h = 0; h < s->n_kv_heads; h++) {
        const kv_head_state *hs = &s->heads[h];
        int al = s->alive[h] != 0;
        pd_status st;
        if ((st = kv_state_ptr(hs->k, al && !qk, s->rows, h, "k", err)) ||
            (st = kv_state_ptr(hs->kq, al && qk, s->rows, h, "kq", err)) ||
            (st = kv_state_ptr(hs->ks, al && qk, s->rows, h, "ks", err)) ||
            (st = kv_state_ptr(hs->v, al && !qv, s->rows, h, "v", err)) ||
            (st = kv_state_ptr(hs->vq, al && qv, s->rows, h, "vq", err)) ||
            (st = kv_state_ptr(hs->vs, al && qv, s->rows, h, "vs", err)) ||
            (st = kv_state_ptr(hs->kcol, al && qk && s->frozen, 1, h, "kcol", err)) ||
            (st = kv_state_ptr(hs->vcol, al && qv && s->frozen, 1, h, "vcol", err)))
            return st;
        if (!al || !s->rows)
            continue;
        if (qk && (st = kv_state_q8(hs->kq, hs->ks, s->rows, hd, ngk, h, 'k', err)))
            return st;
        if (qv && (st = kv_state_q8(hs->vq, hs->vs, s->rows, hd, 1, h, 'v', err)))
            return st;
        for (int comp = 0; comp < 2 && s->frozen; comp++) {
            const float *col = comp ? hs->vcol : hs->kcol;
            for (uint32_t d = 0; col && d < hd; d++)
                if (!(col[d] >= KV_FIELD_FLOOR))
                    return pd_err_set(err, PD_ERR_FORMAT,
                                      "kv state: heads[%u].%s[%u] = %g is below the 1e-6 floor",
                                      h, comp ? "vcol" : "kcol", d, (double)col[d]);
        }
    }
    return PD_OK;
}

/* Copies a validated state's rows, fields and importance into c, whose
 * storage already holds s->rows rows (kv_state_check passed). */
static void kv_copy_rows_from_state(kv_core *c, const kv_state *s)
{
    const uint32_t rows = (uint32_t)s->rows;
    for (uint32_t h = 0; h < c->n_kv && rows; h++) {
        if (!c->alive[h])
            continue;
        const kv_head_state *hs = &s->heads[h];
        kv_head *hh = &c->heads[h];
        const void *src[KV_ST_COUNT] = {
            kv_qk(c) ? (const void *)hs->kq : (const void *)hs->k, hs->ks,
            kv_qv(c) ? (const void *)hs->vq : (const void *)hs->v, hs->vs};
        for (int i = 0; i < KV_ST_COUNT; i++)
            if (hh->st[i])
                memcpy(hh->st[i], src[i], kv_st_row_bytes(c, i) * rows);
    }
    for (uint32_t h = 0; h < c->n_kv && s->frozen; h++) {
        if (!c->alive[h])
            continue;
        if (kv_qk(c))
            memcpy(c->heads[h].col[0], s->heads[h].kcol, sizeof(float) * c->hd);
        if (kv_qv(c))
            memcpy(c->heads[h].col[1], s->heads[h].vcol, sizeof(float) * c->hd);
    }
    if (s->n_imp)
        memcpy(c->imp, s->imp, sizeof(float) * rows);
    else if (rows)
        memset(c->imp, 0, sizeof(float) * rows);
    c->rows = rows;
    c->base = s->base;
    c->tail = s->tail_window;
    c->frozen = s->frozen;
}

pd_status kv_layer_new_from_state(const kv_layer_config *cfg, const kv_state *s, kv_layer **out,
                                  pd_err *err)
{
    pd_status st = kv_config_check(cfg, err);
    if (st != PD_OK)
        return st;
    if (!s || !out)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_new_from_state: NULL state or out");
    if ((st = kv_state_check(cfg, s, err)) != PD_OK)
        return st;
    uint32_t cap = cfg->capacity_rows > s->rows ? cfg->capacity_rows : (uint32_t)s->rows;
    kv_layer *l = NULL;
    if ((st = kv_create(cfg, cap, &l, err)) != PD_OK)
        return st;
    kv_core *c = &l->c;
    if (s->n_linear && (c->linear = kv_get(c, (size_t)4 * s->n_linear)))
        c->n_linear = s->n_linear;
    if ((s->n_linear && !c->linear) ||
        (s->has_bounded && kv_layer_install_bounded(l, s->bounded.window, NULL) != PD_OK)) {
        kv_layer_free(l);
        return pd_err_set(err, PD_ERR_NOMEM, "kv_layer_new_from_state: recurrent records");
    }
    kv_copy_rows_from_state(c, s);
    c->folded_to = s->base + s->rows; /* fully confirmed: no undo data */
    if (s->n_linear)
        memcpy(c->linear, s->linear, (size_t)4 * s->n_linear);
    if (s->has_bounded) {
        size_t n = kv_ring_floats(c, c->bwin);
        memcpy(c->bk, s->bounded.k, 4 * n);
        memcpy(c->bv, s->bounded.v, 4 * n);
        c->blen = s->bounded.len;
    }
    kv_changed(c, 0);
    *out = l;
    return PD_OK;
}

void kv_layer_config_get(const kv_layer *l, kv_layer_config *out)
{
    const kv_core *c = &l->c;
    *out = (kv_layer_config){.n_kv_heads = c->n_kv,
                             .head_dim = c->hd,
                             .mode = c->mode,
                             .alive = c->alive,
                             .capacity_rows = c->cap,
                             .freeze_rows = c->freeze_rows,
                             .spec_depth = c->spec_depth,
                             .alloc = c->alloc,
                             .max_q_per_kv = c->max_q};
}

pd_status kv_layer_assign_state(kv_layer *l, const kv_state *s, pd_err *err)
{
    if (!l || !s)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_assign_state: NULL layer or state");
    kv_layer_config cfg;
    kv_layer_config_get(l, &cfg);
    pd_status st = kv_state_check(&cfg, s, err);
    if (st != PD_OK)
        return st;
    kv_core *c = &l->c;
    if (s->rows > c->cap || s->n_linear || s->has_bounded || c->bwin || c->n_linear) {
        kv_layer *fresh = NULL;
        if ((st = kv_layer_new_from_state(&cfg, s, &fresh, err)) != PD_OK)
            return st;
        kv_layer_swap(l, fresh);
        kv_layer_free(fresh);
        return PD_OK;
    }
    /* in place: every check passed, nothing below can fail */
    kv_layer_clear(l);
    kv_copy_rows_from_state(c, s);
    c->folded_to = s->base + s->rows;
    kv_changed(c, 0);
    return PD_OK;
}

void kv_layer_mark(kv_layer *l) { l->c.mark = l->c.rows; }

uint64_t kv_layer_marked_rows(const kv_layer *l) { return l->c.mark < l->c.rows ? l->c.mark : l->c.rows; }

pd_status kv_layer_append_state(kv_layer *l, const kv_state *s, pd_err *err)
{
    if (!l || !s)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_append_state: NULL layer or state");
    kv_layer_config cfg;
    kv_layer_config_get(l, &cfg);
    pd_status st = kv_state_check(&cfg, s, err);
    if (st != PD_OK)
        return st;
    kv_core *c = &l->c;
    if (s->n_linear || s->has_bounded || c->bwin)
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_append_state: recurrent records or a bounded ring");
    if (c->n_pend)
        return pd_err_set(err, PD_ERR_REFUSED, "kv_layer_append_state: %u query positions of importance pending",
                          c->n_pend);
    if (s->base != c->base)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv state: base %llu, the layer's is %llu",
                          (unsigned long long)s->base, (unsigned long long)c->base);
    if ((uint64_t)s->tail_window != c->tail)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv state: tail_window %u, the layer's is %llu", s->tail_window,
                          (unsigned long long)c->tail);
    if (s->frozen != c->frozen)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv state: frozen = %d, the layer's is %d", s->frozen, c->frozen);
    if (s->rows > KV_MAX_ROWS - c->rows)
        return pd_err_set(err, PD_ERR_RANGE, "kv state: %llu rows after %u pass the limit of %u",
                          (unsigned long long)s->rows, c->rows, KV_MAX_ROWS);
    if (c->mode != KV_MODE_F32 && !c->frozen && c->rows + s->rows > c->freeze_rows)
        return pd_err_set(err, PD_ERR_FORMAT, "kv state: %llu unfrozen rows after %u; a q8 layer freezes at %u",
                          (unsigned long long)s->rows, c->rows, c->freeze_rows);
    for (uint32_t h = 0; h < c->n_kv && c->frozen; h++) {
        if (!c->alive[h])
            continue;
        if ((kv_qk(c) && memcmp(c->heads[h].col[0], s->heads[h].kcol, sizeof(float) * c->hd) != 0) ||
            (kv_qv(c) && memcmp(c->heads[h].col[1], s->heads[h].vcol, sizeof(float) * c->hd) != 0))
            return pd_err_set(err, PD_ERR_MISMATCH, "kv state: head %u's frozen field differs from the layer's", h);
    }
    const uint32_t n = (uint32_t)s->rows, r = c->rows;
    if (r + n > c->cap) {
        uint64_t nc = c->cap ? c->cap : 16;
        while (nc < (uint64_t)r + n)
            nc *= 2;
        if (nc > KV_MAX_ROWS)
            nc = KV_MAX_ROWS;
        if (!kv_regrow(c, (uint32_t)nc))
            return pd_err_set(err, PD_ERR_NOMEM, "kv_layer_append_state: cannot grow to %llu rows",
                              (unsigned long long)nc);
    }
    /* every check passed, nothing below can fail */
    for (uint32_t h = 0; h < c->n_kv && n; h++) {
        if (!c->alive[h])
            continue;
        const kv_head_state *hs = &s->heads[h];
        const void *src[KV_ST_COUNT] = {kv_qk(c) ? (const void *)hs->kq : (const void *)hs->k, hs->ks,
                                        kv_qv(c) ? (const void *)hs->vq : (const void *)hs->v, hs->vs};
        for (int i = 0; i < KV_ST_COUNT; i++) {
            size_t rb = kv_st_row_bytes(c, i);
            if (c->heads[h].st[i])
                memcpy((uint8_t *)c->heads[h].st[i] + rb * r, src[i], rb * n);
        }
    }
    if (s->n_imp)
        memcpy(c->imp + r, s->imp, sizeof(float) * n);
    else if (n)
        memset(c->imp + r, 0, sizeof(float) * n);
    c->rows = r + n;
    c->folded_to = c->base + c->rows; /* fully confirmed: no undo data */
    c->snap_valid = 0;
    return PD_OK;
}

pd_status kv_layer_set_importance(kv_layer *l, const float *imp, uint64_t n, pd_err *err)
{
    if (!l || (n && !imp))
        return pd_err_set(err, PD_ERR_ARG, "kv_layer_set_importance: NULL layer or vector");
    kv_core *c = &l->c;
    if (n != c->rows)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv_layer_set_importance: %llu values for %u rows",
                          (unsigned long long)n, c->rows);
    if (c->n_pend)
        return pd_err_set(err, PD_ERR_REFUSED, "kv_layer_set_importance: %u query positions of importance pending",
                          c->n_pend);
    if (n)
        memcpy(c->imp, imp, sizeof(float) * n);
    return PD_OK;
}

void kv_layer_swap(kv_layer *a, kv_layer *b)
{
    CHECK(a->c.n_kv == b->c.n_kv && a->c.hd == b->c.hd && a->c.mode == b->c.mode);
    CHECK(memcmp(a->c.alive, b->c.alive, a->c.n_kv) == 0);
    kv_core t = a->c;
    a->c = b->c;
    b->c = t;
    kv_changed(&a->c, 0);
    kv_changed(&b->c, 0);
}
