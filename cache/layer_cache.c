/* layer_cache: one interface over a kv_layer or a ring_layer (see
 * layer_cache.h). Owns the implementation object and the bookkeeping both
 * need the same way: the stream position, the pending rows of the last
 * group, and the open group between lcache_append and lcache_end. */
#include "cache/layer_cache.h"

#include "base/check.h"
#include "cache/attn.h"

#include <string.h>

/* The group between lcache_append and lcache_end.
 * INV (open): 1 <= n; next_attend <= n; kv: r0 + n == rows of the layer;
 * ring: written <= n, rows [0, written) are in the ring (decode) or in spill
 * slots (verify), prefill rows are all written at append. */
typedef struct lcache_open {
    int open;
    uint32_t n;
    const uint8_t *roles; /* borrowed until lcache_end */
    const float *k, *v;   /* borrowed until lcache_end */
    uint32_t next_attend; /* the next j an attend may name is >= it */
    uint64_t r0;          /* kv: stored rows before the group's rows */
    uint32_t ref0;        /* ring: reference rows before the group's prefill rows */
    uint32_t written;     /* ring: rows of the group in the cache so far */
    uint32_t vkept;       /* kv, importance eviction: rows of the kept set
                             (lcache.spec.keep) of group row vrow */
    uint32_t vrow;
} lcache_open;

/* Eviction under speculation (kv layer with --evict and drafts). A group
 * [decode p, verify p+1 .. p+K] must see, row by row, what K + 1 sequential
 * steps would: each step evicts down to budget - 1 rows before its row is
 * appended, deciding from the importance of the steps before it. The
 * decode row's eviction is made (its position is final); the verify rows'
 * evictions are only decided: their rows are appended without evicting, and
 * each attends the KEPT SET its sequential step would hold (recent: the
 * newest rows, a window; importance: kv_select_importance over the previous
 * kept set, with kv_layer_importance_below). Once the next group (or a
 * settle) says how many verify rows were accepted, the rejected rows are
 * truncated (their importance mass goes with them) and the kept set of the
 * last accepted row is made real (kv_layer_evict_recent / keep_rows): the
 * layer is then what the sequential steps left.
 * Scratch, cap entries each (spec_cap: importance eviction with drafts,
 * budget + drafts + 1; any eviction with --draft-async, the kv capacity + 1,
 * since a kept set replayed from the final rows may hold a whole prefill):
 * keep (the kept set, stored row indices), next, sel, idx, flag, imp,
 * imp_rows, segs; counted in lcache_memory and lcache_bytes_estimate. */
typedef struct lcache_spec {
    uint32_t cap;
    uint32_t *keep, *next, *idx;
    float *sel, *imp, *imp_rows;
    uint8_t *flag;
    attn_seg *segs;
    struct lcache_ugroup *ugrp; /* asynchronous: [ugrp_cap] */
    uint32_t ugrp_cap;
    void *block;
    size_t bytes;
} lcache_spec;

/* Asynchronous speculation with eviction (undo_rows > 0): the same, across
 * groups. Rows [0, r_fin) hold the final positions [0, fin) as the
 * sequential steps left them; rows from r_fin are the pending positions fin,
 * fin + 1, ... in order, none of their evictions made; each attends the
 * kept set of its step, replayed from the final rows (cached in spec.keep
 * for pending row vt). Rows become final once undo_rows newer positions
 * follow them (at lcache_end, after the group attended) or at a settle,
 * and their eviction is then made with kv_layer_keep_rows_below, which
 * leaves the pending rows and their importance undoable. */
typedef struct lcache_ugroup {
    uint64_t pos;
    uint32_t n;
    uint8_t gen; /* its rows evict (a group that does not start with prefill) */
} lcache_ugroup;

/* INV: exactly one of kv / ring is set, of cfg.kind.
 * INV: pending <= pos; kv: base + rows (the depth) <= pos, == pos without
 *      eviction; ring: position + drafts == pos, drafts <= pending.
 * INV: no open group => drafts of a ring are the verify rows of the last
 *      group (all of them pending).
 * INV: cfg.undo_rows > 0 => a kv layer, pending == pos - fin <= undo_rows
 *      (plus the open group's rows, which turn final at lcache_end); without
 *      eviction the kv layer is confirmed up to fin; with eviction (f32)
 *      rows [0, r_fin) are the final positions, evicted as the sequential
 *      steps did, and r_fin + pos - fin == rows (lcache_ugroup). */
struct lcache {
    lcache_config cfg;
    kv_layer *kv;
    kv_layer_config kv_cfg;
    ring_layer *ring;
    uint64_t pos;
    uint32_t pending;
    uint64_t fin; /* undo_rows > 0: rows before it are final */
    lcache_open g;
    lcache_spec spec;
    /* the last group, for its settle: kv eviction with verify rows decided
     * but not made (lg_deferred), its rows before (lg_r0) and its size */
    int lg_deferred;
    uint64_t lg_r0;
    uint32_t lg_n;
    /* asynchronous speculation with eviction (lcache_ugroup) */
    uint64_t r_fin;
    uint32_t n_ugrp;
    int64_t vt;
    uint32_t vn;
};

static int u_on(const lcache *c)
{
    return c->kv && c->cfg.undo_rows && c->cfg.evict != LCACHE_EVICT_NONE;
}

/* ---- creation -------------------------------------------------------------- */

/* Rows a kv layer of this stream may need: prefill + generated + drafts (a
 * window keeps about two windows, eviction the budget past the prefill). */
static uint32_t kv_capacity(const lcache_config *c)
{
    uint64_t rows = (uint64_t)c->prefill_rows + c->max_new + c->max_drafts + 1 + c->undo_rows;
    if (c->window && rows > 2ull * c->window + c->max_drafts + 2 + c->undo_rows)
        rows = 2ull * c->window + c->max_drafts + 2 + c->undo_rows;
    if (c->evict != LCACHE_EVICT_NONE &&
        rows > (uint64_t)c->evict_budget + c->prefill_rows + c->max_drafts + 1 + c->undo_rows)
        rows = (uint64_t)c->evict_budget + c->prefill_rows + c->max_drafts + 1 + c->undo_rows;
    return rows > UINT32_MAX - 2 ? UINT32_MAX - 2 : (uint32_t)rows;
}

static pd_status config_check(const lcache_config *c, pd_err *err)
{
    if (c->kind >= LCACHE_KIND_COUNT)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: kind %u is unknown", (unsigned)c->kind);
    if (c->n_kv_heads == 0 || c->head_dim == 0 || c->q_per_kv == 0)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: n_kv_heads %u, head_dim %u, q_per_kv %u must be >= 1",
                          c->n_kv_heads, c->head_dim, c->q_per_kv);
    if (c->prefill_rows == 0)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: prefill_rows must be >= 1");
    if (c->evict >= LCACHE_EVICT_COUNT)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: eviction %u is unknown", (unsigned)c->evict);
    if (c->evict != LCACHE_EVICT_NONE && c->evict_budget == 0)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: eviction needs a budget >= 1");
    if (c->kind == LCACHE_KIND_RING) {
        if (c->window == 0)
            return pd_err_set(err, PD_ERR_ARG, "layer cache: a ring needs window >= 1");
        if (c->evict != LCACHE_EVICT_NONE)
            return pd_err_set(err, PD_ERR_ARG, "layer cache: a ring bounds itself (no eviction)");
        if ((unsigned)c->mode >= KV_MODE_COUNT)
            return pd_err_set(err, PD_ERR_ARG, "layer cache: mode %u is unknown", (unsigned)c->mode);
    } else if (c->window && c->evict != LCACHE_EVICT_NONE) {
        return pd_err_set(err, PD_ERR_ARG, "layer cache: a kv window trims itself (no eviction)");
    }
    if (c->undo_rows && (c->kind != LCACHE_KIND_KV || (c->evict != LCACHE_EVICT_NONE && c->mode != KV_MODE_F32)))
        return pd_err_set(err, PD_ERR_ARG, "layer cache: undo across groups (undo_rows) needs a kv layer "
                                           "without eviction");
    return PD_OK;
}

/* The implementation configurations a container of cfg is built from (the
 * estimate below asks the same questions of them). */
static ring_layer_config ring_config_of(const lcache_config *cfg)
{
    return (ring_layer_config){.n_kv_heads = cfg->n_kv_heads,
                               .head_dim = cfg->head_dim,
                               .window = cfg->window,
                               .ref_capacity = cfg->prefill_rows,
                               .max_drafts = cfg->max_drafts,
                               .mode = cfg->mode,
                               .alloc = cfg->alloc,
                               .max_group = cfg->q_per_kv};
}

/* Entries of each eviction scratch array (0: none needed). */
static uint32_t spec_cap(const lcache_config *cfg)
{
    if (cfg->kind != LCACHE_KIND_KV || cfg->evict == LCACHE_EVICT_NONE)
        return 0;
    if (cfg->undo_rows) /* a kept set may hold every row (the prefill's) */
        return kv_capacity(cfg) + 1;
    if (cfg->evict != LCACHE_EVICT_IMPORTANCE || cfg->max_drafts == 0)
        return 0;
    return cfg->evict_budget + cfg->max_drafts + 1;
}

/* Pending groups an asynchronous layer tracks (each holds a pending row). */
static uint32_t ugrp_cap(const lcache_config *cfg)
{
    return cfg->kind == LCACHE_KIND_KV && cfg->evict != LCACHE_EVICT_NONE && cfg->undo_rows
               ? cfg->undo_rows + cfg->max_drafts + 3
               : 0;
}

static size_t spec_round(size_t b) { return (b + 63) & ~(size_t)63; }

/* Bytes of the eviction scratch block (in the estimate and the memory). */
static size_t spec_bytes_of(uint32_t cap, uint32_t ucap)
{
    if (!cap)
        return 0;
    return 3 * spec_round((size_t)4 * cap) + 3 * spec_round((size_t)4 * cap) + spec_round(cap) +
           spec_round(sizeof(attn_seg) * cap) + spec_round(sizeof(lcache_ugroup) * ucap);
}

static size_t spec_bytes(const lcache_config *cfg)
{
    return spec_bytes_of(spec_cap(cfg), ugrp_cap(cfg));
}

static pd_status spec_alloc(lcache *c, pd_err *err)
{
    uint32_t cap = spec_cap(&c->cfg), ucap = ugrp_cap(&c->cfg);
    c->vt = -1;
    if (!cap)
        return PD_OK;
    size_t bytes = spec_bytes(&c->cfg);
    char *b = pd_alloc_bytes(c->cfg.alloc, bytes);
    if (!b)
        return pd_err_set(err, PD_ERR_NOMEM, "layer cache: %zu bytes of eviction scratch", bytes);
    memset(b, 0, bytes);
    lcache_spec *s = &c->spec;
    size_t at = 0, u = spec_round((size_t)4 * cap);
    *s = (lcache_spec){.cap = cap, .block = b, .bytes = bytes};
    s->keep = (uint32_t *)(void *)(b + at), at += u;
    s->next = (uint32_t *)(void *)(b + at), at += u;
    s->idx = (uint32_t *)(void *)(b + at), at += u;
    s->sel = (float *)(void *)(b + at), at += u;
    s->imp = (float *)(void *)(b + at), at += u;
    s->imp_rows = (float *)(void *)(b + at), at += u;
    s->segs = (attn_seg *)(void *)(b + at), at += spec_round(sizeof(attn_seg) * cap);
    s->flag = (uint8_t *)(b + at), at += spec_round(cap);
    s->ugrp = (lcache_ugroup *)(void *)(b + at), at += spec_round(sizeof(lcache_ugroup) * ucap);
    s->ugrp_cap = ucap;
    CHECK(at == bytes);
    return PD_OK;
}

static kv_layer_config kv_config_of(const lcache_config *cfg)
{
    return (kv_layer_config){.n_kv_heads = cfg->n_kv_heads,
                             .head_dim = cfg->head_dim,
                             .mode = cfg->mode,
                             .capacity_rows = kv_capacity(cfg),
                             .alloc = cfg->alloc,
                             /* asynchronous eviction keeps every pending
                                position's importance undoable */
                             .spec_depth = cfg->max_drafts + 1 +
                                           (cfg->evict != LCACHE_EVICT_NONE && cfg->undo_rows
                                                ? cfg->undo_rows + 1 : 0),
                             .max_q_per_kv = cfg->q_per_kv};
}

pd_status lcache_new(const lcache_config *cfg, lcache **out, pd_err *err)
{
    pd_status st = config_check(cfg, err);
    if (st != PD_OK)
        return st;
    lcache *c = pd_alloc_bytes(cfg->alloc, sizeof *c);
    if (!c)
        return pd_err_set(err, PD_ERR_NOMEM, "layer cache: out of memory");
    memset(c, 0, sizeof *c);
    c->cfg = *cfg;
    if (cfg->kind == LCACHE_KIND_RING) {
        ring_layer_config rc = ring_config_of(cfg);
        st = ring_layer_new(&rc, &c->ring, err);
    } else {
        c->kv_cfg = kv_config_of(cfg);
        st = kv_layer_new(&c->kv_cfg, &c->kv, err);
        if (st == PD_OK && (st = spec_alloc(c, err)) != PD_OK)
            kv_layer_free(c->kv);
    }
    if (st != PD_OK) {
        pd_free_bytes(cfg->alloc, c, sizeof *c);
        return st;
    }
    *out = c;
    return PD_OK;
}

void lcache_free(lcache *c)
{
    if (!c)
        return;
    kv_layer_free(c->kv);
    ring_layer_free(c->ring);
    if (c->spec.block)
        pd_free_bytes(c->cfg.alloc, c->spec.block, c->spec.bytes);
    pd_free_bytes(c->cfg.alloc, c, sizeof *c);
}

void lcache_config_get(const lcache *c, lcache_config *out)
{
    *out = c->cfg;
}

lcache_kind lcache_kind_of(const lcache *c)
{
    return c->cfg.kind;
}

/* ---- positions, rollback ---------------------------------------------------- */

uint64_t lcache_position(const lcache *c)
{
    return c->pos;
}

uint32_t lcache_pending(const lcache *c)
{
    return c->pending;
}

/* Eviction under speculation (lcache_spec above). The kept set of group row
 * t, from that of row t - 1 (spec.keep[0..n)): the sequential step's
 * eviction down to budget - 1 rows when n + 1 rows would pass the budget,
 * then the row itself (stored row r0 + t). Returns the new size. */
static uint32_t spec_decide(lcache *c, uint64_t row, uint32_t n)
{
    lcache_spec *s = &c->spec;
    const lcache_config *p = &c->cfg;
    if ((uint64_t)n + 1 > p->evict_budget) {
        uint64_t keep = p->evict_budget > 1 ? p->evict_budget - 1 : 0;
        if (p->evict == LCACHE_EVICT_RECENT) {
            memmove(s->keep, s->keep + (n - keep), sizeof(uint32_t) * keep);
            return (uint32_t)keep;
        }
        uint64_t sinks = p->evict_sinks < keep ? p->evict_sinks : keep;
        kv_layer_importance_below(c->kv, row, s->imp);
        for (uint32_t i = 0; i < n; i++)
            s->sel[i] = s->imp[s->keep[i]];
        uint32_t m = kv_select_importance(s->sel, n, keep, sinks, keep / 2 ? keep / 2 : 1, s->idx, s->flag);
        for (uint32_t i = 0; i < m; i++)
            s->next[i] = s->keep[s->idx[i]];
        uint32_t *t_ = s->keep;
        s->keep = s->next;
        s->next = t_;
        n = m;
    }
    return n;
}

static uint32_t spec_step(lcache *c, uint64_t r0, uint32_t t, uint32_t n)
{
    n = spec_decide(c, r0 + t, n);
    CHECK(n < c->spec.cap);
    c->spec.keep[n++] = (uint32_t)(r0 + t);
    return n;
}

/* ---- asynchronous speculation with eviction (lcache_ugroup) ---- */

static int u_gen(const lcache *c, uint64_t q)
{
    for (uint32_t i = 0; i < c->n_ugrp; i++) {
        const lcache_ugroup *g = &c->spec.ugrp[i];
        if (q >= g->pos && q < g->pos + g->n)
            return g->gen;
    }
    CHECKF(0, "layer cache: position %llu is in no pending group", (unsigned long long)q);
    return 0;
}

/* The kept set of pending row t (stored row r_fin + t) in spec.keep. */
static uint32_t u_kept(lcache *c, uint64_t t)
{
    lcache_spec *s = &c->spec;
    if (c->vt < 0 || (uint64_t)c->vt > t) {
        CHECK(c->r_fin < s->cap);
        for (uint32_t i = 0; i < c->r_fin; i++)
            s->keep[i] = i;
        c->vn = (uint32_t)c->r_fin;
        c->vt = -1;
    }
    for (uint64_t u = (uint64_t)(c->vt + 1); u <= t; u++) {
        uint64_t row = c->r_fin + u;
        if (u_gen(c, c->fin + u))
            c->vn = spec_decide(c, row, c->vn);
        CHECK(c->vn < s->cap);
        s->keep[c->vn++] = (uint32_t)row;
    }
    c->vt = (int64_t)t;
    return c->vn;
}

/* Positions before nf become final: their evictions are made. */
static pd_status u_finalize(lcache *c, uint64_t nf, pd_err *err)
{
    if (nf <= c->fin)
        return PD_OK;
    uint64_t t = nf - c->fin - 1;
    uint32_t n = u_kept(c, t);
    pd_status rc = kv_layer_keep_rows_below(c->kv, c->spec.keep, n, c->r_fin + t + 1, err);
    if (rc != PD_OK)
        return rc;
    /* the final rows' importance is final too (a settle exports it) */
    kv_layer_confirm(c->kv, kv_layer_base(c->kv) + n);
    c->r_fin = n;
    c->fin = nf;
    c->vt = -1;
    uint32_t k = 0;
    for (uint32_t i = 0; i < c->n_ugrp; i++)
        if (c->spec.ugrp[i].pos + c->spec.ugrp[i].n > nf)
            c->spec.ugrp[k++] = c->spec.ugrp[i];
    c->n_ugrp = k;
    return PD_OK;
}

/* A rollback to pos dropped the pending rows from it. */
static void u_truncate(lcache *c, uint64_t pos)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < c->n_ugrp; i++) {
        lcache_ugroup *g = &c->spec.ugrp[i];
        if (g->pos >= pos)
            continue;
        if (g->pos + g->n > pos)
            g->n = (uint32_t)(pos - g->pos);
        c->spec.ugrp[k++] = *g;
    }
    c->n_ugrp = k;
    c->vt = -1;
}

/* The kept set of group row `to`, from row 0's (every stored row up to it). */
static uint32_t spec_replay(lcache *c, uint64_t r0, uint32_t to)
{
    CHECK(r0 + 1 <= c->spec.cap);
    for (uint32_t i = 0; i <= r0; i++)
        c->spec.keep[i] = i;
    uint32_t n = (uint32_t)r0 + 1;
    for (uint32_t t = 1; t <= to; t++)
        n = spec_step(c, r0, t, n);
    return n;
}

/* Settle of a deferred group whose rows [0, a] survived (the rest was
 * truncated): makes row a's kept set real, as the sequential steps made it. */
static pd_status spec_make_real(lcache *c, uint32_t a, pd_err *err)
{
    if (c->cfg.evict == LCACHE_EVICT_RECENT) {
        kv_layer_evict_recent(c->kv, c->cfg.evict_budget);
        return PD_OK;
    }
    uint32_t n = spec_replay(c, c->lg_r0, a);
    return kv_layer_keep_rows(c->kv, c->spec.keep, n, err);
}

uint64_t lcache_rollback_limit(const lcache *c)
{
    if (c->cfg.undo_rows)
        return c->pos - c->fin;
    if (c->ring)
        return ring_layer_drafts(c->ring);
    /* the importance log keeps max_drafts + 1 query positions undoable, and
     * rows before the last group are confirmed */
    uint64_t lim = (uint64_t)c->cfg.max_drafts + 1;
    return c->pending < lim ? c->pending : lim;
}

pd_status lcache_settle(lcache *c, uint64_t pos, pd_err *err)
{
    if (c->g.open)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: settle while a group is open");
    if (pos > c->pos)
        return pd_err_set(err, PD_ERR_RANGE, "layer cache: settle at position %llu, the cache is at %llu",
                          (unsigned long long)pos, (unsigned long long)c->pos);
    uint64_t back = c->pos - pos;
    if (back > lcache_rollback_limit(c))
        return pd_err_set(err, PD_ERR_RANGE,
                          "layer cache: rolling back %llu positions (from %llu to %llu), at most %llu may be",
                          (unsigned long long)back, (unsigned long long)c->pos, (unsigned long long)pos,
                          (unsigned long long)lcache_rollback_limit(c));
    pd_status rc = PD_OK;
    if (u_on(c)) {
        if (back)
            rc = kv_layer_truncate_last(c->kv, back, err);
        u_truncate(c, pos);
        if (rc == PD_OK)
            rc = u_finalize(c, pos, err);
    } else if (c->cfg.undo_rows) {
        if (back)
            rc = kv_layer_truncate_last(c->kv, back, err);
        if (rc == PD_OK)
            kv_layer_confirm(c->kv, pos);
        c->fin = pos;
    } else if (c->ring) {
        uint32_t drafts = ring_layer_drafts(c->ring);
        if (drafts)
            rc = ring_layer_draft_commit(c->ring, drafts - (uint32_t)back, err);
    } else {
        if (back)
            rc = kv_layer_truncate_last(c->kv, back, err);
        if (rc == PD_OK && c->lg_deferred && c->pending - back >= 2)
            rc = spec_make_real(c, (uint32_t)(c->pending - back) - 1, err);
        if (rc == PD_OK)
            kv_layer_confirm(c->kv, kv_layer_pos_len(c->kv));
    }
    c->lg_deferred = 0;
    /* the checks above are what both implementations refuse on */
    CHECKF(rc == PD_OK, "layer cache: settle refused after validation: %s", err ? err->msg : "");
    c->pos = pos;
    c->pending = 0;
    return PD_OK;
}

/* ---- groups --------------------------------------------------------------- */

pd_status lcache_group_check(const lcache *c, const lcache_group *g, uint32_t *row, pd_err *err)
{
    uint32_t bad = 0;
    pd_status rc = PD_OK;
    if (g->n == 0) {
        rc = pd_err_set(err, PD_ERR_FORMAT, "empty group");
    } else if (g->pos > c->pos) {
        rc = pd_err_set(err, PD_ERR_FORMAT, "position %llu skips ahead of %llu", (unsigned long long)g->pos,
                        (unsigned long long)c->pos);
    } else if (c->pos - g->pos > lcache_rollback_limit(c)) {
        rc = pd_err_set(err, PD_ERR_RANGE, "rolls back %llu positions, more than speculation allows (%llu)",
                        (unsigned long long)(c->pos - g->pos), (unsigned long long)lcache_rollback_limit(c));
    }
    uint32_t verify = 0;
    for (uint32_t j = 0; rc == PD_OK && j < g->n; j++) {
        uint8_t r = g->roles[j], prev = j ? g->roles[j - 1] : LCACHE_ROLE_PREFILL;
        bad = j;
        if (r >= LCACHE_ROLE_COUNT)
            rc = pd_err_set(err, PD_ERR_FORMAT, "role %u is not prefill/decode/verify", r);
        else if (r == LCACHE_ROLE_PREFILL && prev != LCACHE_ROLE_PREFILL)
            rc = pd_err_set(err, PD_ERR_FORMAT, "a prefill row after generated rows");
        else if (c->ring && r == LCACHE_ROLE_VERIFY && j > 0 && prev == LCACHE_ROLE_PREFILL)
            rc = pd_err_set(err, PD_ERR_FORMAT, "verify row right after prefill rows");
        else if (c->ring && r == LCACHE_ROLE_DECODE && prev == LCACHE_ROLE_VERIFY)
            rc = pd_err_set(err, PD_ERR_FORMAT, "decode row after verify rows");
        else if (c->ring && r == LCACHE_ROLE_VERIFY && ++verify > c->cfg.max_drafts)
            rc = pd_err_set(err, PD_ERR_FORMAT, "more than %u verify rows", c->cfg.max_drafts);
    }
    if (rc != PD_OK && row)
        *row = bad;
    return rc;
}

/* kv eviction before a group that does not start with a prefill row: room
 * for its n rows within the budget (see lcache_append). */
static void kv_evict_for(lcache *c, const lcache_group *g)
{
    const lcache_config *p = &c->cfg;
    if (p->evict == LCACHE_EVICT_NONE || g->roles[0] == LCACHE_ROLE_PREFILL)
        return;
    /* every budget >= 1 holds: with budget N and a group of n rows the
     * stored rows are cut to N - n first (0 with recent:1 and one decode
     * row: the row attends only itself); policy_validate refuses budgets
     * below a verify group's rows */
    if (kv_layer_rows(c->kv) + 1 > p->evict_budget) {
        /* the first row's own step; the group's later rows decide theirs
         * without making them (lcache_spec) */
        uint64_t keep = p->evict_budget > 1 ? p->evict_budget - 1 : 0;
        /* sinks up to the budget, the library's own clamp: with S = N - 1 a
         * decode step keeps N - 1 rows, all of them sinks */
        uint64_t sinks = p->evict_sinks < keep ? p->evict_sinks : keep;
        if (p->evict == LCACHE_EVICT_RECENT)
            kv_layer_evict_recent(c->kv, keep);
        else
            kv_layer_evict_importance(c->kv, keep, sinks, keep / 2 ? keep / 2 : 1);
    }
}

pd_status lcache_append(lcache *c, const lcache_group *g, const float *k, const float *v, pd_err *err)
{
    if (c->g.open)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: append while a group is open");
    if (!k || !v)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: append without rows");
    pd_status rc = lcache_group_check(c, g, NULL, err);
    if (rc != PD_OK)
        return rc;
    if (c->cfg.undo_rows) {
        /* back to the group's start; what stays is final only once undo_rows
         * newer positions follow it (below) */
        uint64_t back = c->pos - g->pos;
        if (back && (rc = kv_layer_truncate_last(c->kv, back, err)) != PD_OK)
            return rc;
        if (u_on(c))
            u_truncate(c, g->pos);
        c->pos = g->pos;
    } else if ((rc = lcache_settle(c, g->pos, err)) != PD_OK) {
        return rc;
    }
    c->g = (lcache_open){.open = 1, .n = g->n, .roles = g->roles, .k = k, .v = v};
    if (c->ring) {
        uint32_t np = 0;
        while (np < g->n && g->roles[np] == LCACHE_ROLE_PREFILL)
            np++;
        c->g.ref0 = (uint32_t)ring_layer_position(c->ring);
        if (np)
            rc = ring_layer_prefill(c->ring, k, v, np, err);
        c->g.written = np;
    } else if (u_on(c)) {
        /* every eviction waits until its row is final (lcache_ugroup) */
        c->g.r0 = kv_layer_rows(c->kv);
        rc = kv_layer_append_rows(c->kv, g->n, k, v, err);
        if (rc == PD_OK) {
            CHECK(c->n_ugrp < c->spec.ugrp_cap);
            c->spec.ugrp[c->n_ugrp++] =
                (lcache_ugroup){.pos = g->pos, .n = g->n, .gen = g->roles[0] != LCACHE_ROLE_PREFILL};
        }
    } else {
        kv_evict_for(c, g);
        c->g.r0 = kv_layer_rows(c->kv);
        rc = kv_layer_append_rows(c->kv, g->n, k, v, err);
        if (rc == PD_OK && c->cfg.evict != LCACHE_EVICT_NONE && g->roles[0] != LCACHE_ROLE_PREFILL) {
            c->lg_deferred = g->n > 1;
            c->lg_r0 = c->g.r0;
            c->lg_n = g->n;
            if (c->spec.cap)
                c->g.vkept = spec_replay(c, c->g.r0, 0);
        }
    }
    if (rc != PD_OK) {
        /* a kv layer that could not grow keeps the rows it took: the
         * container no longer matches its stream, which must stop */
        c->g.open = 0;
        return rc;
    }
    c->pos = g->pos + g->n;
    c->pending = g->n;
    if (u_on(c)) {
        c->pending = (uint32_t)(c->pos - c->fin); /* rows turn final at lcache_end */
    } else if (c->cfg.undo_rows) {
        if (c->pos - c->fin > c->cfg.undo_rows) {
            c->fin = c->pos - c->cfg.undo_rows;
            kv_layer_confirm(c->kv, c->fin);
        }
        c->pending = (uint32_t)(c->pos - c->fin);
    }
    return PD_OK;
}

/* Ring: writes group rows [written, upto) — decode rows into the ring,
 * verify rows into spill slots. */
static pd_status ring_write_upto(lcache *c, uint32_t upto, pd_err *err)
{
    const uint64_t kvd = (uint64_t)c->cfg.n_kv_heads * c->cfg.head_dim;
    pd_status rc = PD_OK;
    for (; rc == PD_OK && c->g.written < upto; c->g.written++) {
        uint32_t j = c->g.written;
        const float *k = c->g.k + j * kvd, *v = c->g.v + j * kvd;
        if (c->g.roles[j] == LCACHE_ROLE_DECODE)
            rc = ring_layer_write(c->ring, k, v, NULL, err);
        else
            rc = ring_layer_draft_put(c->ring, k, v, err);
    }
    return rc;
}

/* Row j of the open group on a kv layer, KV heads [h0, h1) (Q heads
 * [h0 * G, h1 * G)), each through kv_layer_attend in head order; scratch
 * NULL = the layer's own. */
static pd_status kv_attend_heads(lcache *c, uint32_t j, uint32_t h0, uint32_t h1, const float *q, float *out,
                                 float *scratch, size_t scratch_floats, pd_err *err)
{
    const uint32_t hd = c->cfg.head_dim, G = c->cfg.q_per_kv;
    uint64_t upto = c->g.r0 + j + 1;
    uint64_t first = c->cfg.window && upto > c->cfg.window ? upto - c->cfg.window : 0;
    if (u_on(c)) {
        CHECK(!scratch); /* whole rows (lcache_attend_splits) */
        uint32_t n = u_kept(c, upto - 1 - c->r_fin);
        CHECK(c->spec.keep[n - 1] == upto - 1);
        pd_status rc = PD_OK;
        for (uint32_t h = h0; rc == PD_OK && h < h1; h++) {
            kv_attend a = {.kv_head = h,
                           .q_head0 = h * G,
                           .n_q = G,
                           .q = q + (uint64_t)h * G * hd,
                           .track_imp = c->cfg.evict == LCACHE_EVICT_IMPORTANCE,
                           .out = out + (uint64_t)h * G * hd,
                           .rows = c->spec.keep,
                           .n_rows = n,
                           .segs = c->spec.segs,
                           .imp_rows = c->spec.imp_rows};
            rc = kv_layer_attend(c->kv, &a, NULL, err);
        }
        return rc;
    }
    const int gen = c->cfg.evict != LCACHE_EVICT_NONE && c->g.roles[0] != LCACHE_ROLE_PREFILL;
    /* recent eviction under speculation: row j's sequential step keeps the
     * newest budget rows (its own included): a window */
    if (gen && c->cfg.evict == LCACHE_EVICT_RECENT && upto > c->cfg.evict_budget)
        first = upto - c->cfg.evict_budget;
    /* importance: the kept set its sequential step would hold */
    const int listed = gen && c->spec.cap && c->g.n > 1;
    if (listed) {
        CHECK(!scratch); /* whole rows (lcache_attend_splits) */
        for (uint32_t t = c->g.vrow + 1; t <= j; t++)
            c->g.vkept = spec_step(c, c->g.r0, t, c->g.vkept);
        if (j > c->g.vrow)
            c->g.vrow = j;
        CHECK(c->spec.keep[c->g.vkept - 1] == c->g.r0 + j);
    }
    pd_status rc = PD_OK;
    for (uint32_t h = h0; rc == PD_OK && h < h1; h++) {
        kv_attend a = {.kv_head = h,
                       .q_head0 = h * G,
                       .n_q = G,
                       .q = q + (uint64_t)h * G * hd,
                       .first = (uint32_t)first,
                       .upto = (uint32_t)upto,
                       .track_imp = c->cfg.evict == LCACHE_EVICT_IMPORTANCE,
                       .out = out + (uint64_t)h * G * hd,
                       .scratch = scratch,
                       .scratch_floats = scratch_floats,
                       .rows = listed ? c->spec.keep : NULL,
                       .n_rows = listed ? c->g.vkept : 0,
                       .segs = listed ? c->spec.segs : NULL,
                       .imp_rows = listed ? c->spec.imp_rows : NULL};
        rc = kv_layer_attend(c->kv, &a, NULL, err);
    }
    return rc;
}

pd_status lcache_attend(lcache *c, uint32_t j, const float *q, float *out, pd_err *err)
{
    if (!c->g.open)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: attend without an open group");
    if (j >= c->g.n || j < c->g.next_attend)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: attend of row %u (group of %u, next row %u)", j,
                          c->g.n, c->g.next_attend);
    c->g.next_attend = j + 1;
    if (c->ring) {
        ring_attend_opts opts = {.group = c->cfg.q_per_kv};
        uint8_t role = c->g.roles[j];
        if (role == LCACHE_ROLE_PREFILL)
            return ring_layer_attend_prefill(c->ring, c->g.ref0 + j, q, &opts, out, NULL, err);
        pd_status rc = ring_write_upto(c, j + 1, err);
        if (rc != PD_OK)
            return rc;
        if (role == LCACHE_ROLE_DECODE)
            return ring_layer_attend(c->ring, q, &opts, out, NULL, err);
        return ring_layer_draft_attend(c->ring, ring_layer_drafts(c->ring) - 1, q, &opts, out, NULL, err);
    }
    return kv_attend_heads(c, j, 0, c->cfg.n_kv_heads, q, out, NULL, 0, err);
}

int lcache_attend_splits(const lcache *c)
{
    return !c->ring && c->cfg.evict != LCACHE_EVICT_IMPORTANCE && !u_on(c);
}

size_t lcache_attend_heads_scratch(const lcache *c)
{
    return c->ring ? 0 : kv_layer_scratch_floats(c->kv, c->cfg.q_per_kv);
}

pd_status lcache_attend_heads(lcache *c, uint32_t j, uint32_t h0, uint32_t h1, const float *q, float *out,
                              float *scratch, size_t scratch_floats, pd_err *err)
{
    if (!lcache_attend_splits(c))
        return pd_err_set(err, PD_ERR_ARG, "layer cache: a %s attends whole rows, not KV-head ranges",
                          c->ring ? "ring" : "kv layer tracking importance");
    if (!c->g.open)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: attend without an open group");
    if (c->g.next_attend)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: attend of KV heads in a group attended by whole rows");
    if (j >= c->g.n)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: attend of row %u (group of %u)", j, c->g.n);
    if (h0 >= h1 || h1 > c->cfg.n_kv_heads)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: KV heads [%u, %u) of %u", h0, h1, c->cfg.n_kv_heads);
    if (!scratch)
        return pd_err_set(err, PD_ERR_ARG, "layer cache: attend of KV heads without scratch");
    return kv_attend_heads(c, j, h0, h1, q, out, scratch, scratch_floats, err);
}

pd_status lcache_end(lcache *c, pd_err *err)
{
    if (!c->g.open)
        return PD_OK;
    pd_status rc = PD_OK;
    if (c->ring)
        rc = ring_write_upto(c, c->g.n, err);
    else if (u_on(c) && c->pos - c->fin > c->cfg.undo_rows) {
        rc = u_finalize(c, c->pos - c->cfg.undo_rows, err);
        c->pending = (uint32_t)(c->pos - c->fin);
    } else if (c->cfg.window)
        kv_layer_trim_window(c->kv, c->cfg.window, c->cfg.undo_rows ? c->cfg.undo_rows : c->cfg.max_drafts + 1, 1);
    c->g = (lcache_open){0};
    return rc;
}

int lcache_group_open(const lcache *c)
{
    return c->g.open;
}

/* ---- memory, invariants --------------------------------------------------- */

void lcache_memory(const lcache *c, lcache_mem *out)
{
    if (c->ring) {
        ring_layer_mem m;
        ring_layer_mem_get(c->ring, &m);
        out->allocated = m.allocated + sizeof *c;
        out->live = m.live;
    } else {
        kv_memory m;
        kv_layer_memory(c->kv, &m);
        out->allocated = m.allocated + sizeof *c + c->spec.bytes;
        out->live = m.attention + m.recurrent;
    }
}

uint64_t lcache_bytes_estimate(const lcache_config *c)
{
    /* exactly what the implementation allocates at creation, asked of the
     * implementation (it allocates everything up front: its capacity
     * covers the whole page) */
    if (c->kind == LCACHE_KIND_RING) {
        ring_layer_config rc = ring_config_of(c);
        return sizeof(lcache) + ring_layer_bytes_for(&rc);
    }
    kv_layer_config kc = kv_config_of(c);
    return sizeof(lcache) + kv_layer_bytes_for(&kc) + spec_bytes(c);
}

void lcache_check(const lcache *c)
{
    CHECK((c->kv != NULL) != (c->ring != NULL));
    CHECK(c->cfg.kind == (c->ring ? LCACHE_KIND_RING : LCACHE_KIND_KV));
    CHECK(c->pending <= c->pos);
    if (c->ring) {
        pd_err e = {0};
        CHECKF(ring_layer_check(c->ring, &e) == PD_OK, "%s", e.msg);
        if (!c->g.open) {
            CHECK(ring_layer_position(c->ring) + ring_layer_drafts(c->ring) == c->pos);
            CHECK(ring_layer_drafts(c->ring) <= c->pending);
        }
    } else {
        kv_layer_check(c->kv);
        uint64_t depth = kv_layer_pos_len(c->kv);
        CHECK(depth <= c->pos);
        CHECK(c->cfg.evict != LCACHE_EVICT_NONE || depth == c->pos);
        CHECK(!c->g.open || c->g.r0 + c->g.n == kv_layer_rows(c->kv));
        CHECK(!c->cfg.undo_rows || (c->fin <= c->pos && c->pending == c->pos - c->fin &&
                                    c->pos - c->fin <= c->cfg.undo_rows + (c->g.open ? c->g.n : 0)));
        CHECK(!u_on(c) || c->r_fin + (c->pos - c->fin) == kv_layer_rows(c->kv));
    }
    CHECK(!c->g.open || (c->g.n >= 1 && c->g.next_attend <= c->g.n && c->g.written <= c->g.n));
}

/* ---- the implementation object ------------------------------------------ */

kv_layer *lcache_kv(const lcache *c)
{
    return c->kv;
}

ring_layer *lcache_ring(const lcache *c)
{
    return c->ring;
}

void lcache_kv_config(const lcache *c, kv_layer_config *out)
{
    CHECK(c->kv);
    kv_layer_config_get(c->kv, out);
}

pd_status lcache_adopt_check(const lcache *c, uint64_t depth, uint64_t pos, pd_err *err)
{
    int ok = c->ring || c->cfg.evict == LCACHE_EVICT_NONE ? depth == pos : depth <= pos;
    if (!ok)
        return pd_err_set(err, PD_ERR_MISMATCH, "layer cache: a state of depth %llu cannot stand for position %llu%s",
                          (unsigned long long)depth, (unsigned long long)pos,
                          c->ring || c->cfg.evict == LCACHE_EVICT_NONE ? "" : " (eviction keeps at most that many)");
    return PD_OK;
}

void lcache_adopt(lcache *c, uint64_t pos)
{
    uint64_t depth = c->ring ? ring_layer_position(c->ring) + ring_layer_drafts(c->ring) : kv_layer_pos_len(c->kv);
    CHECK(lcache_adopt_check(c, depth, pos, NULL) == PD_OK);
    c->g = (lcache_open){0};
    c->pos = pos;
    c->fin = pos;
    c->pending = 0;
    c->lg_deferred = 0;
    c->n_ugrp = 0;
    c->vt = -1;
    c->r_fin = c->kv ? kv_layer_rows(c->kv) : 0;
}
