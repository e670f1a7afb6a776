/* The R-SWA ring cache of one (stream, layer): a read-only reference block,
 * a W-slot ring per KV head, K_max draft spill slots, an optional int8 mirror
 * and the attention scratch, all carved from one block allocated at creation.
 * Attention always goes through attn_run (attn.h). */
#include "cache/ring_layer.h"

#include "cache/attn.h"
#include "base/check.h"
#include "cache/quant.h"

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* The one process-wide counter the module keeps: identities must be unique
 * across every layer of the process (they tell which state a handle holds,
 * e.g. after ring_layer_swap), so they cannot come from a caller-held context.
 * 0 is never issued. */
static _Atomic uint64_t ring_next_id = 1;

static uint64_t ring_new_id(void)
{
    uint64_t id = atomic_fetch_add_explicit(&ring_next_id, 1, memory_order_relaxed);
    CHECKF(id != 0, "ring_layer: identity space exhausted");
    return id;
}

/* Where a run of visible rows lives. */
typedef enum ring_region {
    RING_REGION_REF = 0,
    RING_REGION_RING,
    RING_REGION_DRAFT,
    RING_REGION_COUNT
} ring_region;

/* Row storage of one region: head-major, head h's rows start at row h * cap.
 * A component stored int8 (cfg.mode) has no f32 rows; with the mirror on
 * both are kept. */
typedef struct ring_rows {
    uint32_t cap;   /* rows per head */
    float *k, *v;   /* f32 [H x cap x D] or NULL (component stored int8) */
    int8_t *kq, *vq; /* int8 mirror or storage [H x cap x D] or NULL */
    float *ks, *vs; /* scales [H x cap x kgs] / [H x cap] or NULL */
} ring_rows;

/* Everything ring_layer_swap exchanges.
 * INV: 1 <= ref_rows <= cfg.ref_capacity whenever writes > 0 or n_drafts > 0
 *      (ref_rows <= cfg.ref_capacity always).
 * INV: ring_len <= window and ring_len == min(writes, window).
 * INV: ring_pos < window and ring_pos == writes % window (so during warm-up
 *      ring_pos == ring_len, and once full the oldest slot is ring_pos).
 * INV: live ring rows are slots [0, ring_len); age order starts at slot 0
 *      during warm-up and at ring_pos once full.
 * INV: n_drafts <= cfg.max_drafts; drafts are never part of writes or the
 *      cursors.
 * INV: decoding == 0 implies writes == 0; once set it never clears.
 * INV: id != 0.
 * INV: with the mirror on, every live row's int8 copy and scale equal
 *      quant_sym_row of its f32 row (f32 is the source of truth).
 * INV: with int8 storage, every live row of a quantized component has codes
 *      in [-127, 127] and scales >= RING_SCALE_FLOOR (what quant_q8_row
 *      writes); the f32 pointers of that component are NULL.
 * INV: p_ref_k[h] == rows[REF].k + h * cap * D (likewise v and ring): the
 *      pointer tables the state view hands out. */
typedef struct ring_core {
    ring_layer_config cfg; /* alloc resolved, max_group >= 1 */
    uint64_t id;
    uint64_t writes;
    uint32_t ref_rows;
    uint32_t ring_len;
    uint32_t ring_pos;
    uint32_t n_drafts;
    int decoding;
    ring_rows rows[RING_REGION_COUNT];
    float *scratch; /* attn scratch for max_group heads over C + W + K rows */
    size_t scratch_floats;
    const float **p_ref_k, **p_ref_v, **p_ring_k, **p_ring_v;
    /* int8 storage only (else NULL): per-head codes and scales of ref / ring */
    const int8_t **p_ref_kq, **p_ref_vq, **p_ring_kq, **p_ring_vq;
    const float **p_ref_ks, **p_ref_vs, **p_ring_ks, **p_ring_vs;
    void *block;
    size_t storage;
} ring_core;

/* The handle: shell_alloc made the handle itself and stays with it across
 * swaps; core (with its own allocator and block) is what moves. */
struct ring_layer {
    const pd_alloc *shell_alloc;
    ring_core c;
};

/* ---- sizes and layout --------------------------------------------------- */

static int ring_mul(size_t a, size_t b, size_t *out)
{
    if (a != 0 && b > SIZE_MAX / a)
        return 0;
    *out = a * b;
    return 1;
}

static int ring_add(size_t a, size_t b, size_t *out)
{
    if (b > SIZE_MAX - a)
        return 0;
    *out = a + b;
    return 1;
}

static int ring_round64(size_t a, size_t *out)
{
    if (a > SIZE_MAX - 63)
        return 0;
    *out = (a + 63) & ~(size_t)63;
    return 1;
}

/* quant_q8_row's smallest scale (a row of zeros). */
#define RING_SCALE_FLOOR 1e-12f

static int ring_qk(const ring_layer_config *cfg) { return (cfg->mode & KV_MODE_Q8K) != 0; }
static int ring_qv(const ring_layer_config *cfg) { return (cfg->mode & KV_MODE_Q8V) != 0; }

/* K scales per row: ceil(D / RING_K_GROUP) with int8 K storage, 1 with the
 * mirror, 0 otherwise. */
static uint32_t ring_kgs(const ring_layer_config *cfg)
{
    if (ring_qk(cfg))
        return quant_groups(cfg->head_dim, RING_K_GROUP);
    return cfg->int8_mirror ? 1 : 0;
}

enum {
    RING_SLOT_K = 0,
    RING_SLOT_V,
    RING_SLOT_KQ,
    RING_SLOT_VQ,
    RING_SLOT_KS,
    RING_SLOT_VS,
    RING_SLOT_COUNT
};
#define RING_N_REGIONS (RING_REGION_COUNT * RING_SLOT_COUNT + 2) /* + scratch + pointers */

/* Byte size of every region of the block and the total, with offsets. */
typedef struct ring_plan {
    size_t bytes[RING_N_REGIONS];
    size_t off[RING_N_REGIONS];
    size_t total;
    size_t scratch_floats;
} ring_plan;

static pd_status ring_cfg_validate(const ring_layer_config *cfg, pd_err *err)
{
    if (!cfg)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: config is NULL");
    if (cfg->n_kv_heads == 0)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: n_kv_heads is 0");
    if (cfg->head_dim == 0)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: head_dim is 0");
    if (cfg->window == 0)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: window is 0");
    if (cfg->ref_capacity == 0)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: ref_capacity is 0");
    if ((unsigned)cfg->mode >= KV_MODE_COUNT)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: mode %u is unknown", (unsigned)cfg->mode);
    if (cfg->mode != KV_MODE_F32 && cfg->int8_mirror)
        return pd_err_set(err, PD_ERR_ARG,
                          "ring_layer: int8 storage (mode %u) and the int8 mirror exclude each other",
                          (unsigned)cfg->mode);
    uint64_t span = (uint64_t)cfg->ref_capacity + cfg->window + cfg->max_drafts;
    if (span > UINT32_MAX)
        return pd_err_set(err, PD_ERR_NOMEM,
                          "ring_layer: ref_capacity + window + max_drafts = %llu exceeds 2^32-1",
                          (unsigned long long)span);
    return PD_OK;
}

static pd_status ring_plan_make(const ring_layer_config *cfg, ring_plan *p, pd_err *err)
{
    memset(p, 0, sizeof *p);
    const size_t H = cfg->n_kv_heads, D = cfg->head_dim;
    const uint32_t caps[RING_REGION_COUNT] = {cfg->ref_capacity, cfg->window, cfg->max_drafts};
    int ok = 1;
    for (int g = 0; g < RING_REGION_COUNT; g++) {
        size_t hr = 0, elems = 0;
        ok = ok && ring_mul(H, caps[g], &hr) && ring_mul(hr, D, &elems);
        size_t *b = &p->bytes[g * RING_SLOT_COUNT], f32 = 0, hrs = 0;
        ok = ok && ring_mul(elems, sizeof(float), &f32) && ring_mul(hr, sizeof(float), &hrs);
        b[RING_SLOT_K] = ring_qk(cfg) ? 0 : f32;
        b[RING_SLOT_V] = ring_qv(cfg) ? 0 : f32;
        if (cfg->int8_mirror || ring_qk(cfg)) {
            b[RING_SLOT_KQ] = elems;
            ok = ok && ring_mul(hrs, ring_kgs(cfg), &b[RING_SLOT_KS]);
        }
        if (cfg->int8_mirror || ring_qv(cfg)) {
            b[RING_SLOT_VQ] = elems;
            b[RING_SLOT_VS] = hrs;
        }
    }
    uint32_t group = cfg->max_group ? cfg->max_group : 1;
    uint32_t span = cfg->ref_capacity + cfg->window + cfg->max_drafts;
    size_t nh_span = 0, nh_d = 0;
    ok = ok && ring_mul(group, span, &nh_span) && ring_mul(group, D, &nh_d);
    if (ok)
        p->scratch_floats = attn_scratch_floats(group, cfg->head_dim, span);
    ok = ok && ring_mul(p->scratch_floats, sizeof(float), &p->bytes[RING_N_REGIONS - 2]);
    size_t tabs = sizeof(float *) + (cfg->mode != KV_MODE_F32 ? sizeof(int8_t *) + sizeof(float *) : 0);
    ok = ok && ring_mul(4 * H, tabs, &p->bytes[RING_N_REGIONS - 1]);
    size_t total = 0;
    for (int i = 0; ok && i < RING_N_REGIONS; i++) {
        size_t r;
        p->off[i] = total;
        ok = ring_round64(p->bytes[i], &r) && ring_add(total, r, &total);
    }
    if (!ok)
        return pd_err_set(err, PD_ERR_NOMEM,
                          "ring_layer: storage size overflows (heads %u, head_dim %u, "
                          "capacity %u, window %u, drafts %u)",
                          cfg->n_kv_heads, cfg->head_dim, cfg->ref_capacity, cfg->window,
                          cfg->max_drafts);
    p->total = total;
    return PD_OK;
}

static size_t ring_row_bytes(const ring_core *c)
{
    const size_t D = c->cfg.head_dim;
    if (c->cfg.int8_mirror)
        return 2 * D * sizeof(float) + 2 * D + 2 * sizeof(float);
    size_t kb = ring_qk(&c->cfg) ? D + ring_kgs(&c->cfg) * sizeof(float) : D * sizeof(float);
    size_t vb = ring_qv(&c->cfg) ? D + sizeof(float) : D * sizeof(float);
    return kb + vb;
}

/* ---- creation ----------------------------------------------------------- */

/* The pointer of head h's first row in an array of region rw with `per`
 * elements per row, or NULL when the array is absent. */
static const float *ring_fp(const float *a, const ring_rows *rw, uint32_t h, size_t per)
{
    return a ? a + (size_t)h * rw->cap * per : NULL;
}

static const int8_t *ring_qp(const int8_t *a, const ring_rows *rw, uint32_t h, size_t per)
{
    return a ? a + (size_t)h * rw->cap * per : NULL;
}

/* Fills the per-head pointer tables the state view hands out (INV above). */
static void ring_tables_set(ring_core *c)
{
    const size_t D = c->cfg.head_dim, G = ring_kgs(&c->cfg);
    const ring_rows *rf = &c->rows[RING_REGION_REF], *rg = &c->rows[RING_REGION_RING];
    for (uint32_t h = 0; h < c->cfg.n_kv_heads; h++) {
        c->p_ref_k[h] = ring_fp(rf->k, rf, h, D);
        c->p_ref_v[h] = ring_fp(rf->v, rf, h, D);
        c->p_ring_k[h] = ring_fp(rg->k, rg, h, D);
        c->p_ring_v[h] = ring_fp(rg->v, rg, h, D);
        if (c->cfg.mode == KV_MODE_F32)
            continue;
        c->p_ref_kq[h] = ring_qp(rf->kq, rf, h, D);
        c->p_ref_vq[h] = ring_qp(rf->vq, rf, h, D);
        c->p_ring_kq[h] = ring_qp(rg->kq, rg, h, D);
        c->p_ring_vq[h] = ring_qp(rg->vq, rg, h, D);
        c->p_ref_ks[h] = ring_fp(rf->ks, rf, h, G);
        c->p_ref_vs[h] = ring_fp(rf->vs, rf, h, 1);
        c->p_ring_ks[h] = ring_fp(rg->ks, rg, h, G);
        c->p_ring_vs[h] = ring_fp(rg->vs, rg, h, 1);
    }
}

pd_status ring_layer_new(const ring_layer_config *cfg, ring_layer **out, pd_err *err)
{
    if (!out)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: out is NULL");
    pd_status st = ring_cfg_validate(cfg, err);
    if (st != PD_OK)
        return st;
    ring_plan p;
    if ((st = ring_plan_make(cfg, &p, err)) != PD_OK)
        return st;
    const pd_alloc *a = cfg->alloc ? cfg->alloc : pd_alloc_default();
    ring_layer *r = pd_alloc_bytes(a, sizeof *r);
    if (!r)
        return pd_err_set(err, PD_ERR_NOMEM, "ring_layer: handle allocation failed");
    char *block = pd_alloc_bytes(a, p.total);
    if (!block) {
        pd_free_bytes(a, r, sizeof *r);
        return pd_err_set(err, PD_ERR_NOMEM, "ring_layer: %zu bytes of storage not available",
                          p.total);
    }
    /* Zeroed so dead slots and the mirror never hold uninitialized bytes. */
    memset(block, 0, p.total);

    *r = (ring_layer){.shell_alloc = a};
    ring_core *c = &r->c;
    c->cfg = *cfg;
    c->cfg.alloc = a;
    c->cfg.max_group = cfg->max_group ? cfg->max_group : 1;
    c->id = ring_new_id();
    c->block = block;
    c->storage = p.total;
    const uint32_t caps[RING_REGION_COUNT] = {cfg->ref_capacity, cfg->window, cfg->max_drafts};
    for (int g = 0; g < RING_REGION_COUNT; g++) {
        const size_t *o = &p.off[g * RING_SLOT_COUNT];
        const size_t *b = &p.bytes[g * RING_SLOT_COUNT];
        ring_rows *rw = &c->rows[g];
        rw->cap = caps[g];
        rw->k = b[RING_SLOT_K] ? (float *)(block + o[RING_SLOT_K]) : NULL;
        rw->v = b[RING_SLOT_V] ? (float *)(block + o[RING_SLOT_V]) : NULL;
        rw->kq = b[RING_SLOT_KQ] ? (int8_t *)(block + o[RING_SLOT_KQ]) : NULL;
        rw->vq = b[RING_SLOT_VQ] ? (int8_t *)(block + o[RING_SLOT_VQ]) : NULL;
        rw->ks = b[RING_SLOT_KS] ? (float *)(block + o[RING_SLOT_KS]) : NULL;
        rw->vs = b[RING_SLOT_VS] ? (float *)(block + o[RING_SLOT_VS]) : NULL;
    }
    c->scratch = (float *)(block + p.off[RING_N_REGIONS - 2]);
    c->scratch_floats = p.scratch_floats;
    char *tab = block + p.off[RING_N_REGIONS - 1];
    const float **ptrs = (const float **)(void *)tab;
    const size_t H = cfg->n_kv_heads;
    c->p_ref_k = ptrs;
    c->p_ref_v = ptrs + H;
    c->p_ring_k = ptrs + 2 * H;
    c->p_ring_v = ptrs + 3 * H;
    if (cfg->mode != KV_MODE_F32) {
        const int8_t **qp = (const int8_t **)(void *)(tab + 4 * H * sizeof(float *));
        const float **sp = (const float **)(void *)(tab + 4 * H * (sizeof(float *) + sizeof(int8_t *)));
        c->p_ref_kq = qp;
        c->p_ref_vq = qp + H;
        c->p_ring_kq = qp + 2 * H;
        c->p_ring_vq = qp + 3 * H;
        c->p_ref_ks = sp;
        c->p_ref_vs = sp + H;
        c->p_ring_ks = sp + 2 * H;
        c->p_ring_vs = sp + 3 * H;
    }
    ring_tables_set(c);
    *out = r;
    return PD_OK;
}

void ring_layer_free(ring_layer *r)
{
    if (!r)
        return;
    pd_free_bytes(r->c.cfg.alloc, r->c.block, r->c.storage);
    pd_free_bytes(r->shell_alloc, r, sizeof *r);
}

void ring_layer_config_get(const ring_layer *r, ring_layer_config *out)
{
    *out = r->c.cfg;
}

/* ---- row movement ------------------------------------------------------- */

static size_t ring_row_off(const ring_rows *rw, uint32_t h, uint32_t row, uint32_t D)
{
    return ((size_t)h * rw->cap + row) * D;
}

/* Stores one token's K/V ([H x D] each) at row `row` of region g. */
static void ring_store(ring_core *c, ring_region g, uint32_t row, const float *k, const float *v)
{
    const uint32_t H = c->cfg.n_kv_heads, D = c->cfg.head_dim;
    ring_rows *rw = &c->rows[g];
    CHECK(row < rw->cap);
    const int qk = ring_qk(&c->cfg), qv = ring_qv(&c->cfg);
    const size_t G = ring_kgs(&c->cfg);
    for (uint32_t h = 0; h < H; h++) {
        size_t o = ring_row_off(rw, h, row, D), so = (size_t)h * rw->cap + row;
        if (qk)
            quant_q8_row(k + (size_t)h * D, NULL, D, RING_K_GROUP, rw->kq + o, rw->ks + so * G);
        else
            memcpy(rw->k + o, k + (size_t)h * D, sizeof(float) * D);
        if (qv)
            quant_q8_row(v + (size_t)h * D, NULL, D, D, rw->vq + o, rw->vs + so);
        else
            memcpy(rw->v + o, v + (size_t)h * D, sizeof(float) * D);
        if (c->cfg.int8_mirror) {
            rw->ks[so] = quant_sym_row(rw->k + o, D, rw->kq + o);
            rw->vs[so] = quant_sym_row(rw->v + o, D, rw->vq + o);
        }
    }
}

/* Copies draft j into ring slot s (f32 and mirror: the same bytes a
 * sequential write of that row would produce, since quant is deterministic). */
static void ring_draft_to_slot(ring_core *c, uint32_t j, uint32_t s)
{
    const uint32_t H = c->cfg.n_kv_heads, D = c->cfg.head_dim;
    const ring_rows *dr = &c->rows[RING_REGION_DRAFT];
    ring_rows *rg = &c->rows[RING_REGION_RING];
    const size_t G = ring_kgs(&c->cfg);
    for (uint32_t h = 0; h < H; h++) {
        size_t od = ring_row_off(dr, h, j, D), os = ring_row_off(rg, h, s, D);
        size_t sd = (size_t)h * dr->cap + j, ss = (size_t)h * rg->cap + s;
        if (rg->k)
            memcpy(rg->k + os, dr->k + od, sizeof(float) * D);
        if (rg->v)
            memcpy(rg->v + os, dr->v + od, sizeof(float) * D);
        if (rg->kq) {
            memcpy(rg->kq + os, dr->kq + od, D);
            memcpy(rg->ks + ss * G, dr->ks + sd * G, sizeof(float) * G);
        }
        if (rg->vq) {
            memcpy(rg->vq + os, dr->vq + od, D);
            rg->vs[ss] = dr->vs[sd];
        }
    }
}

/* The slot the next sequential write lands in, and the cursor step after it. */
static uint32_t ring_next_slot(const ring_core *c)
{
    return c->ring_len < c->cfg.window ? c->ring_len : c->ring_pos;
}

static void ring_advance(ring_core *c)
{
    const uint32_t W = c->cfg.window;
    uint32_t slot = ring_next_slot(c);
    if (c->ring_len < W)
        c->ring_len++;
    c->ring_pos = (slot + 1) % W;
    c->writes++;
    c->decoding = 1;
    CHECK(c->ring_pos == c->writes % W);
}

/* ---- reference ---------------------------------------------------------- */

pd_status ring_layer_prefill(ring_layer *r, const float *k, const float *v, uint32_t n,
                             pd_err *err)
{
    ring_core *c = &r->c;
    if (n == 0)
        return PD_OK;
    if (!k || !v)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: prefill rows are NULL");
    if (c->decoding)
        return pd_err_set(err, PD_ERR_REFUSED,
                          "ring_layer: reference sealed: decoding started after %u prefill rows",
                          c->ref_rows);
    if (c->n_drafts)
        return pd_err_set(err, PD_ERR_REFUSED,
                          "ring_layer: prefill while %u drafts are pending", c->n_drafts);
    if (n > c->cfg.ref_capacity - c->ref_rows)
        return pd_err_set(err, PD_ERR_RANGE,
                          "ring_layer: prefill of %u rows after %u exceeds ref_capacity %u", n,
                          c->ref_rows, c->cfg.ref_capacity);
    const size_t tok = (size_t)c->cfg.n_kv_heads * c->cfg.head_dim;
    for (uint32_t i = 0; i < n; i++)
        ring_store(c, RING_REGION_REF, c->ref_rows + i, k + i * tok, v + i * tok);
    c->ref_rows += n;
    return PD_OK;
}

/* ---- attention ---------------------------------------------------------- */

/* A run of visible rows: `rows` rows of region g from row `start`. */
typedef struct ring_span {
    ring_region g;
    uint32_t start, rows;
} ring_span;

#define RING_MAX_SPANS 4

/* Appends the ring rows of age index [a0, ring_len) (oldest first) as up to
 * two spans. */
static uint32_t ring_age_spans(const ring_core *c, uint32_t a0, ring_span *sp, uint32_t n)
{
    const uint32_t W = c->cfg.window, L = c->ring_len;
    if (a0 >= L)
        return n;
    uint32_t oldest = L == W ? c->ring_pos : 0;
    uint32_t s0 = (uint32_t)(((uint64_t)oldest + a0) % W);
    uint32_t cnt = L - a0;
    uint32_t first = cnt < W - s0 ? cnt : W - s0;
    sp[n++] = (ring_span){.g = RING_REGION_RING, .start = s0, .rows = first};
    if (cnt > first)
        sp[n++] = (ring_span){.g = RING_REGION_RING, .start = 0, .rows = cnt - first};
    return n;
}

size_t ring_layer_scratch_floats(const ring_layer *r, uint32_t group)
{
    const ring_layer_config *cfg = &r->c.cfg;
    return attn_scratch_floats(group ? group : 1, cfg->head_dim,
                               cfg->ref_capacity + cfg->window + cfg->max_drafts);
}

/* Runs attn_run for every KV head over the spans (visible rows [0, upto)). */
static pd_status ring_attend_spans(const ring_core *c, const ring_span *sp, uint32_t n_sp,
                                   uint32_t upto, const float *q, const ring_attend_opts *opts,
                                   float *out, float *scratch, pd_err *err)
{
    if (!q || !out)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: attend q/out is NULL");
    const uint32_t H = c->cfg.n_kv_heads, D = c->cfg.head_dim;
    uint32_t group = opts && opts->group ? opts->group : 1;
    if (!scratch) {
        if (group > c->cfg.max_group)
            return pd_err_set(err, PD_ERR_RANGE,
                              "ring_layer: group %u exceeds the owned scratch (max_group %u); "
                              "pass scratch",
                              group, c->cfg.max_group);
        scratch = c->scratch;
    }
    float scale = opts && opts->scale != 0.0f ? opts->scale : 1.0f / sqrtf((float)D);
    CHECK(n_sp <= RING_MAX_SPANS);
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_sp; i++)
        total += sp[i].rows;
    if (total == 0 || upto == 0)
        return pd_err_set(err, PD_ERR_RANGE, "ring_layer: no rows to attend");
    /* int8 K rows: the mirror's (one scale per row) or the storage's (one
     * per RING_K_GROUP channels); int8 V rows: one scale per row either way. */
    const int mir = c->cfg.int8_mirror;
    const int ik = mir || ring_qk(&c->cfg), iv = mir || ring_qv(&c->cfg);
    const size_t G = ring_kgs(&c->cfg);
    const uint32_t kgroup = ring_qk(&c->cfg) ? RING_K_GROUP : D;
    for (uint32_t h = 0; h < H; h++) {
        attn_seg segs[RING_MAX_SPANS];
        uint32_t ns = 0;
        for (uint32_t i = 0; i < n_sp; i++) {
            if (sp[i].rows == 0)
                continue;
            const ring_rows *rw = &c->rows[sp[i].g];
            CHECK(sp[i].start + sp[i].rows <= rw->cap);
            size_t o = ring_row_off(rw, h, sp[i].start, D);
            size_t so = (size_t)h * rw->cap + sp[i].start;
            segs[ns++] = (attn_seg){.rows = sp[i].rows,
                                    .k = ik ? NULL : rw->k + o,
                                    .kq = ik ? rw->kq + o : NULL,
                                    .ks = ik ? rw->ks + so * G : NULL,
                                    .v = iv ? NULL : rw->v + o,
                                    .vq = iv ? rw->vq + o : NULL,
                                    .vs = iv ? rw->vs + so : NULL};
        }
        attn_kv kv = {.head_dim = D, .k_group = kgroup, .v_group = D, .segs = segs, .n_segs = ns};
        attn_query aq = {.n_heads = group,
                         .q = q + (size_t)h * group * D,
                         .scale = scale,
                         .softcap = opts ? opts->softcap : 0.0f,
                         .sinks = opts && opts->sinks ? opts->sinks + (size_t)h * group : NULL,
                         .first = 0,
                         .upto = upto};
        attn_run(&kv, &aq, out + (size_t)h * group * D, NULL, NULL, scratch);
    }
    return PD_OK;
}

pd_status ring_layer_attend_prefill(const ring_layer *r, uint32_t row, const float *q,
                                    const ring_attend_opts *opts, float *out, float *scratch,
                                    pd_err *err)
{
    const ring_core *c = &r->c;
    if (row >= c->ref_rows)
        return pd_err_set(err, PD_ERR_RANGE, "ring_layer: prefill row %u of %u reference rows",
                          row, c->ref_rows);
    ring_span sp = {.g = RING_REGION_REF, .start = 0, .rows = c->ref_rows};
    return ring_attend_spans(c, &sp, 1, row + 1, q, opts, out, scratch, err);
}

pd_status ring_layer_attend(const ring_layer *r, const float *q, const ring_attend_opts *opts,
                            float *out, float *scratch, pd_err *err)
{
    const ring_core *c = &r->c;
    ring_span sp[RING_MAX_SPANS];
    uint32_t n = 0;
    sp[n++] = (ring_span){.g = RING_REGION_REF, .start = 0, .rows = c->ref_rows};
    n = ring_age_spans(c, 0, sp, n);
    return ring_attend_spans(c, sp, n, UINT32_MAX, q, opts, out, scratch, err);
}

/* ---- decode writes ------------------------------------------------------ */

pd_status ring_layer_write(ring_layer *r, const float *k, const float *v, uint32_t *slot,
                           pd_err *err)
{
    ring_core *c = &r->c;
    if (!k || !v)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: decode rows are NULL");
    if (c->ref_rows == 0)
        return pd_err_set(err, PD_ERR_RANGE, "ring_layer: decode write before any prefill row");
    if (c->n_drafts)
        return pd_err_set(err, PD_ERR_REFUSED,
                          "ring_layer: decode write while %u drafts are pending (commit or "
                          "discard them first)",
                          c->n_drafts);
    uint32_t s = ring_next_slot(c);
    ring_store(c, RING_REGION_RING, s, k, v);
    ring_advance(c);
    if (slot)
        *slot = s;
    return PD_OK;
}

/* ---- drafts ------------------------------------------------------------- */

pd_status ring_layer_draft_put(ring_layer *r, const float *k, const float *v, pd_err *err)
{
    ring_core *c = &r->c;
    if (!k || !v)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: draft rows are NULL");
    if (c->ref_rows == 0)
        return pd_err_set(err, PD_ERR_RANGE, "ring_layer: draft before any prefill row");
    if (c->n_drafts >= c->cfg.max_drafts)
        return pd_err_set(err, PD_ERR_RANGE, "ring_layer: draft %u exceeds max_drafts %u",
                          c->n_drafts, c->cfg.max_drafts);
    ring_store(c, RING_REGION_DRAFT, c->n_drafts, k, v);
    c->n_drafts++;
    return PD_OK;
}

uint32_t ring_layer_drafts(const ring_layer *r)
{
    return r->c.n_drafts;
}

pd_status ring_layer_draft_attend(const ring_layer *r, uint32_t i, const float *q,
                                  const ring_attend_opts *opts, float *out, float *scratch,
                                  pd_err *err)
{
    const ring_core *c = &r->c;
    if (i >= c->n_drafts)
        return pd_err_set(err, PD_ERR_RANGE, "ring_layer: draft %u of %u pending", i,
                          c->n_drafts);
    /* After i + 1 sequential writes the ring holds the last min(W, L + i + 1)
     * rows of (ring in age order ++ drafts[0..i]); the first `drop` are gone. */
    const uint64_t W = c->cfg.window, L = c->ring_len, total = L + i + 1;
    const uint64_t drop = total > W ? total - W : 0;
    ring_span sp[RING_MAX_SPANS];
    uint32_t n = 0;
    sp[n++] = (ring_span){.g = RING_REGION_REF, .start = 0, .rows = c->ref_rows};
    uint32_t d0 = 0;
    if (drop <= L)
        n = ring_age_spans(c, (uint32_t)drop, sp, n);
    else
        d0 = (uint32_t)(drop - L);
    sp[n++] = (ring_span){.g = RING_REGION_DRAFT, .start = d0, .rows = i + 1 - d0};
    return ring_attend_spans(c, sp, n, UINT32_MAX, q, opts, out, scratch, err);
}

pd_status ring_layer_draft_commit(ring_layer *r, uint32_t a, pd_err *err)
{
    ring_core *c = &r->c;
    if (a > c->n_drafts)
        return pd_err_set(err, PD_ERR_RANGE, "ring_layer: commit of %u drafts, %u pending", a,
                          c->n_drafts);
    for (uint32_t j = 0; j < a; j++) {
        ring_draft_to_slot(c, j, ring_next_slot(c));
        ring_advance(c);
    }
    c->n_drafts = 0;
    return PD_OK;
}

void ring_layer_draft_discard(ring_layer *r)
{
    r->c.n_drafts = 0;
}

/* ---- state view and install --------------------------------------------- */

void ring_layer_state(const ring_layer *r, ring_state *out)
{
    const ring_core *c = &r->c;
    *out = (ring_state){.n_kv_heads = c->cfg.n_kv_heads,
                        .head_dim = c->cfg.head_dim,
                        .window = c->cfg.window,
                        .ref_rows = c->ref_rows,
                        .ring_len = c->ring_len,
                        .ring_pos = c->ring_pos,
                        .writes = c->writes,
                        .decoding = c->decoding,
                        .int8_mirror = c->cfg.int8_mirror,
                        .mode = c->cfg.mode,
                        .ref_k = ring_qk(&c->cfg) ? NULL : c->p_ref_k,
                        .ref_v = ring_qv(&c->cfg) ? NULL : c->p_ref_v,
                        .ring_k = ring_qk(&c->cfg) ? NULL : c->p_ring_k,
                        .ring_v = ring_qv(&c->cfg) ? NULL : c->p_ring_v,
                        .ref_kq = ring_qk(&c->cfg) ? c->p_ref_kq : NULL,
                        .ref_ks = ring_qk(&c->cfg) ? c->p_ref_ks : NULL,
                        .ring_kq = ring_qk(&c->cfg) ? c->p_ring_kq : NULL,
                        .ring_ks = ring_qk(&c->cfg) ? c->p_ring_ks : NULL,
                        .ref_vq = ring_qv(&c->cfg) ? c->p_ref_vq : NULL,
                        .ref_vs = ring_qv(&c->cfg) ? c->p_ref_vs : NULL,
                        .ring_vq = ring_qv(&c->cfg) ? c->p_ring_vq : NULL,
                        .ring_vs = ring_qv(&c->cfg) ? c->p_ring_vs : NULL};
}

/* Codes in [-127, 127] and scales >= RING_SCALE_FLOOR (NaN fails) for `rows`
 * rows of one head: what quant_q8_row writes. */
static pd_status ring_q8_valid(const int8_t *q, const float *sc, uint32_t rows, uint32_t D,
                               uint32_t G, const char *what, uint32_t h, pd_err *err)
{
    for (size_t j = 0; j < (size_t)rows * D; j++)
        if (q[j] == -128)
            return pd_err_set(err, PD_ERR_FORMAT,
                              "ring_state: %s[%u] code %zu is -128, outside the q8 range", what, h, j);
    for (size_t j = 0; j < (size_t)rows * G; j++)
        if (!(sc[j] >= RING_SCALE_FLOOR) || isinf(sc[j]))
            return pd_err_set(err, PD_ERR_FORMAT,
                              "ring_state: %s[%u] scale %zu = %g is not a finite scale >= 1e-12", what,
                              h, j, (double)sc[j]);
    return PD_OK;
}

static pd_status ring_state_validate(const ring_layer_config *cfg, const ring_state *s,
                                     pd_err *err)
{
    if (!s)
        return pd_err_set(err, PD_ERR_ARG, "ring_state: state is NULL");
    if (s->n_kv_heads != cfg->n_kv_heads)
        return pd_err_set(err, PD_ERR_MISMATCH, "ring_state: n_kv_heads %u, config %u",
                          s->n_kv_heads, cfg->n_kv_heads);
    if (s->head_dim != cfg->head_dim)
        return pd_err_set(err, PD_ERR_MISMATCH, "ring_state: head_dim %u, config %u",
                          s->head_dim, cfg->head_dim);
    if (s->window != cfg->window)
        return pd_err_set(err, PD_ERR_MISMATCH, "ring_state: window %u, config %u", s->window,
                          cfg->window);
    if (!s->int8_mirror != !cfg->int8_mirror)
        return pd_err_set(err, PD_ERR_MISMATCH, "ring_state: int8_mirror %d, config %d",
                          s->int8_mirror, cfg->int8_mirror);
    if (s->mode != cfg->mode)
        return pd_err_set(err, PD_ERR_MISMATCH, "ring_state: mode %u, config %u", (unsigned)s->mode,
                          (unsigned)cfg->mode);
    if (s->ref_rows > cfg->ref_capacity)
        return pd_err_set(err, PD_ERR_RANGE, "ring_state: ref_rows %u exceeds ref_capacity %u",
                          s->ref_rows, cfg->ref_capacity);
    if (s->ring_len > s->window)
        return pd_err_set(err, PD_ERR_RANGE, "ring_state: ring_len %u exceeds window %u",
                          s->ring_len, s->window);
    if (s->ring_pos >= s->window)
        return pd_err_set(err, PD_ERR_RANGE, "ring_state: ring_pos %u outside window %u",
                          s->ring_pos, s->window);
    if (s->writes > UINT64_MAX - s->ref_rows)
        return pd_err_set(err, PD_ERR_RANGE, "ring_state: writes %llu overflow the position",
                          (unsigned long long)s->writes);
    uint64_t want_len = s->writes < s->window ? s->writes : s->window;
    if (s->ring_len != want_len)
        return pd_err_set(err, PD_ERR_FORMAT,
                          "ring_state: ring_len %u inconsistent with writes %llu (window %u)",
                          s->ring_len, (unsigned long long)s->writes, s->window);
    if (s->ring_pos != s->writes % s->window)
        return pd_err_set(err, PD_ERR_FORMAT,
                          "ring_state: ring_pos %u inconsistent with writes %llu (window %u)",
                          s->ring_pos, (unsigned long long)s->writes, s->window);
    if (!s->decoding && s->writes)
        return pd_err_set(err, PD_ERR_FORMAT,
                          "ring_state: decoding is 0 but writes is %llu",
                          (unsigned long long)s->writes);
    if (s->writes && s->ref_rows == 0)
        return pd_err_set(err, PD_ERR_FORMAT, "ring_state: ref_rows is 0 but writes is %llu",
                          (unsigned long long)s->writes);
    /* f32 tables of the components kept in f32; codes and scales of the
     * quantized ones. */
    const int qk = ring_qk(cfg), qv = ring_qv(cfg);
    const char *names[4] = {"ref_k", "ref_v", "ring_k", "ring_v"};
    const float *const *tabs[4] = {s->ref_k, s->ref_v, s->ring_k, s->ring_v};
    const int8_t *const *qtabs[4] = {s->ref_kq, s->ref_vq, s->ring_kq, s->ring_vq};
    const float *const *stabs[4] = {s->ref_ks, s->ref_vs, s->ring_ks, s->ring_vs};
    const uint32_t need[4] = {s->ref_rows, s->ref_rows, s->ring_len, s->ring_len};
    for (int t = 0; t < 4; t++) {
        const int q = t % 2 == 0 ? qk : qv;
        if (need[t] == 0)
            continue;
        if (!q) {
            if (!tabs[t])
                return pd_err_set(err, PD_ERR_ARG, "ring_state: %s is NULL", names[t]);
            for (uint32_t h = 0; h < s->n_kv_heads; h++)
                if (!tabs[t][h])
                    return pd_err_set(err, PD_ERR_ARG, "ring_state: %s[%u] is NULL", names[t], h);
            continue;
        }
        if (!qtabs[t] || !stabs[t])
            return pd_err_set(err, PD_ERR_ARG, "ring_state: %s codes or scales are NULL", names[t]);
        const uint32_t G = t % 2 == 0 ? ring_kgs(cfg) : 1;
        for (uint32_t h = 0; h < s->n_kv_heads; h++) {
            if (!qtabs[t][h] || !stabs[t][h])
                return pd_err_set(err, PD_ERR_ARG, "ring_state: %s[%u] codes or scales are NULL",
                                  names[t], h);
            pd_status st = ring_q8_valid(qtabs[t][h], stabs[t][h], need[t], cfg->head_dim, G,
                                         names[t], h, err);
            if (st != PD_OK)
                return st;
        }
    }
    return PD_OK;
}

pd_status ring_layer_new_from_state(const ring_layer_config *cfg, const ring_state *s,
                                    ring_layer **out, pd_err *err)
{
    if (!out)
        return pd_err_set(err, PD_ERR_ARG, "ring_layer: out is NULL");
    pd_status st = ring_cfg_validate(cfg, err);
    if (st != PD_OK)
        return st;
    if ((st = ring_state_validate(cfg, s, err)) != PD_OK)
        return st;
    ring_layer *r;
    if ((st = ring_layer_new(cfg, &r, err)) != PD_OK)
        return st;
    ring_core *c = &r->c;
    const uint32_t H = cfg->n_kv_heads, D = cfg->head_dim;
    /* The state is head-major like the storage: copy per head (int8 storage:
     * codes and scales exactly), then rebuild the int8 mirror from the f32
     * rows (it is not carried). */
    const size_t G = ring_kgs(cfg);
    for (int g = 0; g < 2; g++) {
        ring_rows *rw = &c->rows[g == 0 ? RING_REGION_REF : RING_REGION_RING];
        const float *const *sk = g == 0 ? s->ref_k : s->ring_k;
        const float *const *sv = g == 0 ? s->ref_v : s->ring_v;
        const int8_t *const *skq = g == 0 ? s->ref_kq : s->ring_kq;
        const int8_t *const *svq = g == 0 ? s->ref_vq : s->ring_vq;
        const float *const *sks = g == 0 ? s->ref_ks : s->ring_ks;
        const float *const *svs = g == 0 ? s->ref_vs : s->ring_vs;
        uint32_t rows = g == 0 ? s->ref_rows : s->ring_len;
        for (uint32_t h = 0; h < H && rows; h++) {
            const size_t o = ring_row_off(rw, h, 0, D), so = (size_t)h * rw->cap;
            if (ring_qk(cfg)) {
                memcpy(rw->kq + o, skq[h], (size_t)rows * D);
                memcpy(rw->ks + so * G, sks[h], sizeof(float) * rows * G);
            } else {
                memcpy(rw->k + o, sk[h], sizeof(float) * rows * D);
            }
            if (ring_qv(cfg)) {
                memcpy(rw->vq + o, svq[h], (size_t)rows * D);
                memcpy(rw->vs + so, svs[h], sizeof(float) * rows);
            } else {
                memcpy(rw->v + o, sv[h], sizeof(float) * rows * D);
            }
            if (!cfg->int8_mirror)
                continue;
            for (uint32_t i = 0; i < rows; i++) {
                size_t oi = ring_row_off(rw, h, i, D), si = (size_t)h * rw->cap + i;
                rw->ks[si] = quant_sym_row(rw->k + oi, D, rw->kq + oi);
                rw->vs[si] = quant_sym_row(rw->v + oi, D, rw->vq + oi);
            }
        }
    }
    c->ref_rows = s->ref_rows;
    c->ring_len = s->ring_len;
    c->ring_pos = s->ring_pos;
    c->writes = s->writes;
    c->decoding = s->decoding != 0;
    *out = r;
    return PD_OK;
}

void ring_layer_swap(ring_layer *a, ring_layer *b)
{
    ring_core t = a->c;
    a->c = b->c;
    b->c = t;
}

/* ---- bookkeeping -------------------------------------------------------- */

uint64_t ring_layer_id(const ring_layer *r)
{
    return r->c.id;
}

uint64_t ring_layer_position(const ring_layer *r)
{
    return r->c.ref_rows + r->c.writes;
}

uint64_t ring_layer_bytes_for(const ring_layer_config *cfg)
{
    pd_err e = {0};
    ring_plan p;
    if (ring_cfg_validate(cfg, &e) != PD_OK || ring_plan_make(cfg, &p, &e) != PD_OK)
        return 0;
    return (uint64_t)p.total + sizeof(ring_layer);
}

void ring_layer_mem_get(const ring_layer *r, ring_layer_mem *out)
{
    const ring_core *c = &r->c;
    size_t rows = (size_t)c->ref_rows + c->ring_len + c->n_drafts;
    *out = (ring_layer_mem){.storage = c->storage,
                            .handle = sizeof *r,
                            .allocated = c->storage + sizeof *r,
                            .live = (size_t)c->cfg.n_kv_heads * rows * ring_row_bytes(c)};
}

/* Checks that the live rows [0, n) of region g have a faithful int8 mirror. */
static pd_status ring_check_mirror(const ring_core *c, ring_region g, uint32_t n, int8_t *tmp,
                                   pd_err *err)
{
    const uint32_t H = c->cfg.n_kv_heads, D = c->cfg.head_dim;
    const ring_rows *rw = &c->rows[g];
    for (uint32_t h = 0; h < H; h++)
        for (uint32_t i = 0; i < n; i++) {
            size_t o = ring_row_off(rw, h, i, D), so = (size_t)h * rw->cap + i;
            for (int kv = 0; kv < 2; kv++) {
                float s = quant_sym_row((kv ? rw->v : rw->k) + o, D, tmp);
                float have = kv ? rw->vs[so] : rw->ks[so];
                if (memcmp(&s, &have, sizeof s) != 0 ||
                    memcmp(tmp, (kv ? rw->vq : rw->kq) + o, D) != 0)
                    return pd_err_set(err, PD_ERR_FORMAT,
                                      "ring_layer: int8 mirror of region %d head %u row %u (%s) "
                                      "does not match its f32 row",
                                      (int)g, h, i, kv ? "V" : "K");
            }
        }
    return PD_OK;
}

pd_status ring_layer_check(const ring_layer *r, pd_err *err)
{
    const ring_core *c = &r->c;
    const ring_layer_config *cfg = &c->cfg;
    const uint64_t W = cfg->window;
#define RING_INV(cond)                                                                       \
    do {                                                                                     \
        if (!(cond))                                                                         \
            return pd_err_set(err, PD_ERR_FORMAT, "ring_layer: invariant broken: %s", #cond); \
    } while (0)
    RING_INV(c->id != 0);
    RING_INV(cfg->alloc != NULL && cfg->max_group >= 1);
    RING_INV(c->ref_rows <= cfg->ref_capacity);
    RING_INV(c->ring_len <= cfg->window);
    RING_INV(c->ring_pos < cfg->window);
    RING_INV(c->ring_len == (c->writes < W ? c->writes : W));
    RING_INV(c->ring_pos == c->writes % W);
    RING_INV(c->ring_len == cfg->window || c->ring_pos == c->ring_len);
    RING_INV(c->n_drafts <= cfg->max_drafts);
    RING_INV(c->decoding || c->writes == 0);
    RING_INV(c->ref_rows >= 1 || (c->writes == 0 && c->n_drafts == 0));
    RING_INV(c->rows[RING_REGION_REF].cap == cfg->ref_capacity);
    RING_INV(c->rows[RING_REGION_RING].cap == cfg->window);
    RING_INV(c->rows[RING_REGION_DRAFT].cap == cfg->max_drafts);
    RING_INV(c->scratch_floats == ring_layer_scratch_floats(r, cfg->max_group));
    RING_INV(cfg->mode == KV_MODE_F32 || !cfg->int8_mirror);
    const ring_rows *rf = &c->rows[RING_REGION_REF], *rg = &c->rows[RING_REGION_RING];
    for (uint32_t h = 0; h < cfg->n_kv_heads; h++) {
        const size_t D = cfg->head_dim, G = ring_kgs(cfg);
        RING_INV(c->p_ref_k[h] == ring_fp(rf->k, rf, h, D));
        RING_INV(c->p_ref_v[h] == ring_fp(rf->v, rf, h, D));
        RING_INV(c->p_ring_k[h] == ring_fp(rg->k, rg, h, D));
        RING_INV(c->p_ring_v[h] == ring_fp(rg->v, rg, h, D));
        RING_INV((rf->k == NULL) == ring_qk(cfg) && (rf->v == NULL) == ring_qv(cfg));
        if (cfg->mode == KV_MODE_F32)
            continue;
        RING_INV(c->p_ref_kq[h] == ring_qp(rf->kq, rf, h, D) && c->p_ring_kq[h] == ring_qp(rg->kq, rg, h, D));
        RING_INV(c->p_ref_vq[h] == ring_qp(rf->vq, rf, h, D) && c->p_ring_vq[h] == ring_qp(rg->vq, rg, h, D));
        RING_INV(c->p_ref_ks[h] == ring_fp(rf->ks, rf, h, G) && c->p_ring_ks[h] == ring_fp(rg->ks, rg, h, G));
        RING_INV(c->p_ref_vs[h] == ring_fp(rf->vs, rf, h, 1) && c->p_ring_vs[h] == ring_fp(rg->vs, rg, h, 1));
    }
    ring_plan p;
    RING_INV(ring_plan_make(cfg, &p, NULL) == PD_OK && p.total == c->storage);
#undef RING_INV
    if (cfg->mode != KV_MODE_F32) {
        /* every live row of a quantized component holds what quant_q8_row writes */
        const uint32_t live[RING_REGION_COUNT] = {c->ref_rows, c->ring_len, c->n_drafts};
        for (int g = 0; g < RING_REGION_COUNT; g++)
            for (uint32_t h = 0; h < cfg->n_kv_heads && live[g] > 0; h++) { /* an empty region may have no storage */
                const ring_rows *rw = &c->rows[g];
                const size_t o = ring_row_off(rw, h, 0, cfg->head_dim), so = (size_t)h * rw->cap;
                pd_status st = PD_OK;
                if (ring_qk(cfg))
                    st = ring_q8_valid(rw->kq + o, rw->ks + so * ring_kgs(cfg), live[g], cfg->head_dim,
                                       ring_kgs(cfg), "K region", (uint32_t)g, err);
                if (st == PD_OK && ring_qv(cfg))
                    st = ring_q8_valid(rw->vq + o, rw->vs + so, live[g], cfg->head_dim, 1, "V region",
                                       (uint32_t)g, err);
                if (st != PD_OK)
                    return st;
            }
        return PD_OK;
    }
    if (!cfg->int8_mirror)
        return PD_OK;
    int8_t *tmp = malloc(cfg->head_dim); /* test-time check, not a per-token path */
    CHECK(tmp != NULL);
    pd_status st = ring_check_mirror(c, RING_REGION_REF, c->ref_rows, tmp, err);
    if (st == PD_OK)
        st = ring_check_mirror(c, RING_REGION_RING, c->ring_len, tmp, err);
    if (st == PD_OK)
        st = ring_check_mirror(c, RING_REGION_DRAFT, c->n_drafts, tmp, err);
    free(tmp);
    return st;
}
