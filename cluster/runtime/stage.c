/* stage: per-stream caches of a layer range and the micro-batch forward pass.
 *
 * Forward of one layer for rows [n]:
 *   h = rmsnorm(x) * attn_norm; q, k, v = h W^T (+ bias); RoPE at each row's
 *   absolute position; per stream: append its rows' K/V, then row j attends
 *   the first r0 + j + 1 rows (window: the last W of them); x += att Wo^T;
 *   h = rmsnorm(x) * ffn_norm; x += (silu(h Wg^T) * h Wu^T) Wd^T.
 * The GEMMs take all rows at once; attention runs one task per stream. */
#include "cluster/runtime/stage.h"

#include "base/check.h"
#include "base/fp16.h"
#include "cache/kv_layer.h"
#include "cache/ring_layer.h"
#include "comm/wire.h"

#include <stdlib.h>
#include <string.h>

/* INV: used slots hold caches[n_layers] of the policy's kind; pos is the next
 * position the stream's rows will take (drafts included); ring_drafts is the
 * number of pending verify rows in every ring layer of the stream. */
typedef struct stage_stream {
    int used;
    uint64_t id;
    uint64_t pos;
    uint32_t prefill_rows, max_new;
    uint32_t ring_drafts;
    void **caches; /* kv_layer* or ring_layer* per layer */
} stage_stream;

/* A contiguous run of rows of one stream inside a micro-batch. */
typedef struct stage_group {
    uint32_t row0, n;
    stage_stream *st;
} stage_group;

struct stage {
    stage_config cfg;
    model_hparams hp;
    uint32_t first, n_layers;
    uint32_t group; /* Q heads per KV head */
    stage_stream *streams;
    uint32_t alive;
    /* scratch [max_rows x width] */
    float *h, *q, *k, *v, *att, *o, *g, *u;
    uint16_t *half; /* [max_rows x hidden] (round_f16) */
    stage_group *groups;
    uint32_t n_groups;
    /* per-forward context for the attention tasks */
    const mb_row *rows;
    uint32_t layer;
    pd_status task_status;
    pd_err task_err;
};

static int is_ring(const stage *s)
{
    return s->cfg.policy.attn == POLICY_ATTN_RSWA;
}

static void *xalloc_f(uint64_t n)
{
    return n ? aligned_alloc(64, ((n * sizeof(float)) + 63) & ~(uint64_t)63) : NULL;
}

pd_status stage_new(const stage_config *cfg, stage **out, pd_err *err)
{
    if (!cfg->m || cfg->max_rows == 0 || cfg->max_streams == 0)
        return pd_err_set(err, PD_ERR_ARG, "stage: model, max_rows and max_streams are required");
    pd_status st = policy_validate(&cfg->policy, err);
    if (st)
        return st;
    stage *s = calloc(1, sizeof *s);
    if (!s)
        return pd_err_set(err, PD_ERR_NOMEM, "stage: out of memory");
    s->cfg = *cfg;
    s->hp = *model_hp(cfg->m);
    s->first = model_first_layer(cfg->m);
    s->n_layers = model_layer_count(cfg->m);
    s->group = s->hp.n_heads / s->hp.n_kv_heads;
    uint64_t R = cfg->max_rows, qd = (uint64_t)s->hp.n_heads * s->hp.head_dim,
             kvd = (uint64_t)s->hp.n_kv_heads * s->hp.head_dim;
    s->streams = calloc(cfg->max_streams, sizeof *s->streams);
    s->groups = calloc(cfg->max_rows, sizeof *s->groups);
    s->h = xalloc_f(R * s->hp.hidden);
    s->o = xalloc_f(R * s->hp.hidden);
    s->q = xalloc_f(R * qd);
    s->att = xalloc_f(R * qd);
    s->k = xalloc_f(R * kvd);
    s->v = xalloc_f(R * kvd);
    s->g = xalloc_f(R * s->hp.ffn);
    s->u = xalloc_f(R * s->hp.ffn);
    s->half = cfg->round_f16 ? malloc(R * s->hp.hidden * sizeof(uint16_t)) : NULL;
    if ((cfg->round_f16 && !s->half) || !s->streams || !s->groups || !s->h || !s->o || !s->q || !s->att || !s->k || !s->v || !s->g ||
        !s->u) {
        stage_free(s);
        return pd_err_set(err, PD_ERR_NOMEM, "stage: out of memory for %u-row scratch", cfg->max_rows);
    }
    *out = s;
    return PD_OK;
}

static void stream_free_caches(stage *s, stage_stream *st)
{
    if (!st->caches)
        return;
    for (uint32_t l = 0; l < s->n_layers; l++) {
        if (is_ring(s))
            ring_layer_free(st->caches[l]);
        else
            kv_layer_free(st->caches[l]);
    }
    free(st->caches);
    st->caches = NULL;
}

void stage_free(stage *s)
{
    if (!s)
        return;
    for (uint32_t i = 0; s->streams && i < s->cfg.max_streams; i++)
        if (s->streams[i].used)
            stream_free_caches(s, &s->streams[i]);
    free(s->streams);
    free(s->groups);
    free(s->h);
    free(s->o);
    free(s->q);
    free(s->att);
    free(s->k);
    free(s->v);
    free(s->g);
    free(s->u);
    free(s->half);
    free(s);
}

static stage_stream *stream_find(const stage *s, uint64_t id)
{
    for (uint32_t i = 0; i < s->cfg.max_streams; i++)
        if (s->streams[i].used && s->streams[i].id == id)
            return &s->streams[i];
    return NULL;
}

/* Rows a KV layer of this stream may need: prefill + generated + drafts. */
static uint32_t kv_capacity(const stage *s, uint32_t prefill, uint32_t max_new)
{
    const cache_policy *p = &s->cfg.policy;
    uint64_t rows = (uint64_t)prefill + max_new + p->max_drafts + 1;
    if (p->attn == POLICY_ATTN_WINDOW && rows > 2ull * p->window + p->max_drafts + 2)
        rows = 2ull * p->window + p->max_drafts + 2;
    if (p->evict != POLICY_EVICT_NONE && rows > (uint64_t)p->evict_budget + prefill + p->max_drafts + 1)
        rows = (uint64_t)p->evict_budget + prefill + p->max_drafts + 1;
    return rows > UINT32_MAX - 2 ? UINT32_MAX - 2 : (uint32_t)rows;
}

pd_status stage_admit(stage *s, const mb_admit *a, pd_err *err)
{
    if (stream_find(s, a->stream))
        return pd_err_set(err, PD_ERR_ARG, "stage: stream %llu admitted twice",
                          (unsigned long long)a->stream);
    if (a->prefill_rows == 0)
        return pd_err_set(err, PD_ERR_ARG, "stage: stream %llu has no prefill rows",
                          (unsigned long long)a->stream);
    stage_stream *st = NULL;
    for (uint32_t i = 0; i < s->cfg.max_streams && !st; i++)
        if (!s->streams[i].used)
            st = &s->streams[i];
    if (!st)
        return pd_err_set(err, PD_ERR_RANGE, "stage: %u streams already alive", s->cfg.max_streams);
    void **caches = calloc(s->n_layers ? s->n_layers : 1, sizeof *caches);
    if (!caches)
        return pd_err_set(err, PD_ERR_NOMEM, "stage: out of memory");
    pd_status rc = PD_OK;
    for (uint32_t l = 0; l < s->n_layers && rc == PD_OK; l++) {
        if (is_ring(s)) {
            ring_layer_config rc_cfg = {.n_kv_heads = s->hp.n_kv_heads,
                                        .head_dim = s->hp.head_dim,
                                        .window = s->cfg.policy.window,
                                        .ref_capacity = a->prefill_rows,
                                        .max_drafts = s->cfg.policy.max_drafts,
                                        .alloc = s->cfg.cache_alloc,
                                        .max_group = s->group};
            rc = ring_layer_new(&rc_cfg, (ring_layer **)&caches[l], err);
        } else {
            kv_layer_config kc = {.n_kv_heads = s->hp.n_kv_heads,
                                  .head_dim = s->hp.head_dim,
                                  .mode = s->cfg.policy.kv,
                                  .capacity_rows = kv_capacity(s, a->prefill_rows, a->max_new),
                                  .alloc = s->cfg.cache_alloc,
                                  .spec_depth = s->cfg.policy.max_drafts + 1,
                                  .max_q_per_kv = s->group};
            rc = kv_layer_new(&kc, (kv_layer **)&caches[l], err);
        }
    }
    *st = (stage_stream){.used = 1,
                         .id = a->stream,
                         .pos = 0,
                         .prefill_rows = a->prefill_rows,
                         .max_new = a->max_new,
                         .caches = caches};
    if (rc != PD_OK) {
        pd_err_prefix(err, "stage: admitting stream %llu", (unsigned long long)a->stream);
        stream_free_caches(s, st);
        st->used = 0;
        return rc;
    }
    s->alive++;
    return PD_OK;
}

void stage_retire(stage *s, uint64_t stream)
{
    stage_stream *st = stream_find(s, stream);
    if (!st)
        return;
    stream_free_caches(s, st);
    st->used = 0;
    s->alive--;
}

uint32_t stage_streams(const stage *s)
{
    return s->alive;
}

/* How far back a stream's next row may start (position-driven rollback): a
 * ring only drops its pending verify rows; a kv layer rolls back at most
 * max_drafts + 1 rows (a decode row and its verify rows, the query positions
 * the kv layer's importance log keeps undoable: spec_depth). */
static int rollback_allowed(const stage *s, const stage_stream *st, uint64_t back)
{
    return is_ring(s) ? back <= st->ring_drafts : back <= (uint64_t)s->cfg.policy.max_drafts + 1;
}

/* Checks the rows and splits them into per-stream groups; changes nothing. */
static pd_status forward_plan(stage *s, const mb_row *rows, uint32_t n, pd_err *err)
{
    s->n_groups = 0;
    for (uint32_t i = 0; i < n; i++) {
        const mb_row *r = &rows[i];
        if (r->role >= MB_ROLE_COUNT)
            return pd_err_set(err, PD_ERR_FORMAT, "row %u: role %u is not prefill/decode/verify", i, r->role);
        if (i > 0 && rows[i - 1].stream == r->stream) {
            if (r->pos != rows[i - 1].pos + 1)
                return pd_err_set(err, PD_ERR_FORMAT, "row %u: stream %llu position %llu does not follow %llu",
                                  i, (unsigned long long)r->stream, (unsigned long long)r->pos,
                                  (unsigned long long)rows[i - 1].pos);
            s->groups[s->n_groups - 1].n++;
            continue;
        }
        stage_stream *st = stream_find(s, r->stream);
        if (!st)
            return pd_err_set(err, PD_ERR_FORMAT, "row %u: stream %llu was never admitted", i,
                              (unsigned long long)r->stream);
        for (uint32_t g = 0; g < s->n_groups; g++)
            if (s->groups[g].st == st)
                return pd_err_set(err, PD_ERR_FORMAT, "row %u: stream %llu appears twice in one micro-batch",
                                  i, (unsigned long long)r->stream);
        if (r->pos > st->pos)
            return pd_err_set(err, PD_ERR_FORMAT, "row %u: stream %llu skips to position %llu, next is %llu",
                              i, (unsigned long long)r->stream, (unsigned long long)r->pos,
                              (unsigned long long)st->pos);
        uint64_t back = st->pos - r->pos;
        if (!rollback_allowed(s, st, back))
            return pd_err_set(err, PD_ERR_FORMAT,
                              "row %u: stream %llu rolls back %llu positions, more than speculation allows",
                              i, (unsigned long long)r->stream, (unsigned long long)back);
        s->groups[s->n_groups++] = (stage_group){.row0 = i, .n = 1, .st = st};
    }
    for (uint32_t g = 0; g < s->n_groups; g++) {
        const stage_group *gr = &s->groups[g];
        for (uint32_t j = 0; j < gr->n; j++) {
            const mb_row *r = &rows[gr->row0 + j];
            int prefill_pos = r->pos < gr->st->prefill_rows;
            if ((r->role == MB_ROLE_PREFILL) != prefill_pos)
                return pd_err_set(err, PD_ERR_FORMAT,
                                  "row %u: stream %llu position %llu has role %u but the prefill is %u rows",
                                  gr->row0 + j, (unsigned long long)r->stream, (unsigned long long)r->pos,
                                  r->role, gr->st->prefill_rows);
            if (is_ring(s) && r->role == MB_ROLE_VERIFY && j > 0 && rows[gr->row0 + j - 1].role == MB_ROLE_PREFILL)
                return pd_err_set(err, PD_ERR_FORMAT, "row %u: verify row right after prefill rows", gr->row0 + j);
        }
    }
    return PD_OK;
}

/* Position-driven rollback to p and confirmation of every row before p, in
 * every layer of the stream: what a micro-batch whose first row is at p does
 * before anything else. Running it twice for the same p changes nothing the
 * second time (confirm is idempotent, no drafts are left), which is what
 * lets stage_settle run it ahead of the next micro-batch. */
static pd_status stream_settle(stage *s, stage_stream *st, uint64_t p, pd_err *err)
{
    uint64_t back = st->pos - p;
    for (uint32_t l = 0; l < s->n_layers; l++) {
        pd_status rc = PD_OK;
        if (is_ring(s)) {
            ring_layer *r = st->caches[l];
            if (st->ring_drafts)
                rc = ring_layer_draft_commit(r, st->ring_drafts - (uint32_t)back, err);
        } else {
            kv_layer *kl = st->caches[l];
            if (back)
                rc = kv_layer_truncate_last(kl, back, err);
            if (rc == PD_OK)
                kv_layer_confirm(kl, kv_layer_base(kl) + kv_layer_rows(kl));
        }
        if (rc != PD_OK) {
            pd_err_prefix(err, "stream %llu layer %u", (unsigned long long)st->id, s->first + l);
            return rc;
        }
    }
    st->ring_drafts = 0;
    st->pos = p;
    return PD_OK;
}

/* Position-driven rollback, confirmation and eviction before the rows of a
 * group are appended. Runs once per forward per stream (all layers). */
static pd_status group_prepare(stage *s, const stage_group *gr, const mb_row *rows, pd_err *err)
{
    stage_stream *st = gr->st;
    const cache_policy *pol = &s->cfg.policy;
    pd_status rc = stream_settle(s, st, rows[gr->row0].pos, err);
    if (rc != PD_OK || is_ring(s) || pol->evict == POLICY_EVICT_NONE || rows[gr->row0].role == MB_ROLE_PREFILL)
        return rc;
    for (uint32_t l = 0; l < s->n_layers; l++) {
        kv_layer *kl = st->caches[l];
        if (kv_layer_rows(kl) + gr->n > pol->evict_budget && pol->evict_budget > gr->n) {
            uint64_t keep = pol->evict_budget - gr->n;
            /* sinks up to the budget, the library's own clamp: with S = N - 1
             * a decode step keeps N - 1 rows, all of them sinks */
            uint64_t sinks = pol->evict_sinks < keep ? pol->evict_sinks : keep;
            if (pol->evict == POLICY_EVICT_RECENT)
                kv_layer_evict_recent(kl, keep);
            else
                kv_layer_evict_importance(kl, keep, sinks, keep / 2 ? keep / 2 : 1);
        }
    }
    return PD_OK;
}

/* Appends and attends the rows of group g for layer s->layer. */
static pd_status group_attend(stage *s, const stage_group *gr, pd_err *err)
{
    const model_hparams *hp = &s->hp;
    const uint32_t hd = hp->head_dim, G = s->group;
    const uint64_t qd = (uint64_t)hp->n_heads * hd, kvd = (uint64_t)hp->n_kv_heads * hd;
    const mb_row *rows = s->rows + gr->row0;
    void *cache = gr->st->caches[s->layer - s->first];
    const float *k = s->k + gr->row0 * kvd, *v = s->v + gr->row0 * kvd;
    const float *q = s->q + gr->row0 * qd;
    float *att = s->att + gr->row0 * qd;
    pd_status rc = PD_OK;

    if (is_ring(s)) {
        ring_layer *r = cache;
        ring_attend_opts opts = {.group = G};
        uint32_t j = 0;
        /* prefill rows: append the chunk, then row i attends reference [0, i] */
        uint32_t np = 0;
        while (np < gr->n && rows[np].role == MB_ROLE_PREFILL)
            np++;
        if (np) {
            uint32_t ref0 = (uint32_t)rows[0].pos;
            rc = ring_layer_prefill(r, k, v, np, err);
            for (; rc == PD_OK && j < np; j++)
                rc = ring_layer_attend_prefill(r, ref0 + j, q + j * qd, &opts, att + j * qd, NULL, err);
        }
        for (; rc == PD_OK && j < gr->n; j++) {
            if (rows[j].role == MB_ROLE_DECODE) {
                rc = ring_layer_write(r, k + j * kvd, v + j * kvd, NULL, err);
                if (rc == PD_OK)
                    rc = ring_layer_attend(r, q + j * qd, &opts, att + j * qd, NULL, err);
            } else {
                uint32_t i = ring_layer_drafts(r);
                rc = ring_layer_draft_put(r, k + j * kvd, v + j * kvd, err);
                if (rc == PD_OK)
                    rc = ring_layer_draft_attend(r, i, q + j * qd, &opts, att + j * qd, NULL, err);
            }
        }
        return rc;
    }

    kv_layer *kl = cache;
    const cache_policy *pol = &s->cfg.policy;
    uint64_t r0 = kv_layer_rows(kl);
    rc = kv_layer_append_rows(kl, gr->n, k, v, err);
    for (uint32_t j = 0; rc == PD_OK && j < gr->n; j++) {
        uint64_t upto = r0 + j + 1;
        uint64_t first = pol->attn == POLICY_ATTN_WINDOW && upto > pol->window ? upto - pol->window : 0;
        for (uint32_t h = 0; rc == PD_OK && h < hp->n_kv_heads; h++) {
            kv_attend a = {.kv_head = h,
                           .q_head0 = h * G,
                           .n_q = G,
                           .q = q + j * qd + (uint64_t)h * G * hd,
                           .first = (uint32_t)first,
                           .upto = (uint32_t)upto,
                           .track_imp = pol->evict == POLICY_EVICT_IMPORTANCE,
                           .out = att + j * qd + (uint64_t)h * G * hd};
            rc = kv_layer_attend(kl, &a, NULL, err);
        }
    }
    if (rc == PD_OK && pol->attn == POLICY_ATTN_WINDOW)
        kv_layer_trim_window(kl, pol->window, pol->max_drafts + 1, 1);
    return rc;
}

static void attend_task(void *ctx, uint32_t task, uint32_t thread)
{
    (void)thread;
    stage *s = ctx;
    pd_err e = {0};
    pd_status rc = group_attend(s, &s->groups[task], &e);
    if (rc != PD_OK) {
        /* first failure wins; the pool runs tasks on several threads */
        if (__atomic_exchange_n(&s->task_status, rc, __ATOMIC_ACQ_REL) == PD_OK)
            s->task_err = e;
    }
}

static void stage_progress(const stage *s)
{
    if (s->cfg.progress)
        s->cfg.progress(s->cfg.progress_ctx);
}

static void add_bias(float *x, const float *b, uint32_t n, uint32_t width)
{
    if (!b)
        return;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t c = 0; c < width; c++)
            x[(uint64_t)i * width + c] += b[c];
}

pd_status stage_forward(stage *s, const mb_row *rows, uint32_t n, float *x, pd_err *err)
{
    if (n == 0)
        return PD_OK;
    if (n > s->cfg.max_rows)
        return pd_err_set(err, PD_ERR_RANGE, "stage: %u rows exceed the micro-batch limit %u", n,
                          s->cfg.max_rows);
    pd_status rc = forward_plan(s, rows, n, err);
    if (rc)
        return rc;
    for (uint32_t g = 0; g < s->n_groups; g++)
        if ((rc = group_prepare(s, &s->groups[g], rows, err)))
            return rc;

    const model_hparams *hp = &s->hp;
    const uint32_t H = hp->hidden, hd = hp->head_dim;
    const uint32_t qd = hp->n_heads * hd, kvd = hp->n_kv_heads * hd;
    pool *p = s->cfg.pool;
    s->rows = rows;
    if (s->cfg.trace && s->first == 0)
        s->cfg.trace(s->cfg.trace_ctx, 0, rows, n, x);
    for (uint32_t L = s->first; L < s->first + s->n_layers; L++) {
        const model_layer *ly = model_layer_get(s->cfg.m, L);
        for (uint32_t i = 0; i < n; i++)
            model_rmsnorm(x + (uint64_t)i * H, ly->attn_norm, H, hp->rms_eps, s->h + (uint64_t)i * H);
        gemm_run(ly->wq, s->h, n, s->q, p);
        gemm_run(ly->wk, s->h, n, s->k, p);
        gemm_run(ly->wv, s->h, n, s->v, p);
        stage_progress(s);
        add_bias(s->q, ly->bq, n, qd);
        add_bias(s->k, ly->bk, n, kvd);
        add_bias(s->v, ly->bv, n, kvd);
        for (uint32_t i = 0; i < n; i++) {
            model_rope_row(s->q + (uint64_t)i * qd, hp->n_heads, hd, rows[i].pos, hp->rope_base, hp->rope);
            model_rope_row(s->k + (uint64_t)i * kvd, hp->n_kv_heads, hd, rows[i].pos, hp->rope_base, hp->rope);
        }
        s->layer = L;
        s->task_status = PD_OK;
        pd_err_clear(&s->task_err);
        pool_run(p, s->n_groups, attend_task, s);
        if (s->task_status != PD_OK) {
            /* A cache refused mid-layer: the stage's state is no longer
             * consistent across layers, so the run must stop. */
            pd_err_set(err, s->task_status, "layer %u: %s", L, s->task_err.msg);
            return s->task_status;
        }
        stage_progress(s);
        gemm_run(ly->wo, s->att, n, s->o, p);
        for (uint64_t i = 0; i < (uint64_t)n * H; i++)
            x[i] = x[i] + s->o[i];
        for (uint32_t i = 0; i < n; i++)
            model_rmsnorm(x + (uint64_t)i * H, ly->ffn_norm, H, hp->rms_eps, s->h + (uint64_t)i * H);
        gemm_run(ly->wgate, s->h, n, s->g, p);
        gemm_run(ly->wup, s->h, n, s->u, p);
        stage_progress(s);
        model_swiglu(s->g, s->u, n * hp->ffn, s->g);
        gemm_run(ly->wdown, s->g, n, s->o, p);
        stage_progress(s);
        for (uint64_t i = 0; i < (uint64_t)n * H; i++)
            x[i] = x[i] + s->o[i];
        if (s->half) {
            pd_f32_to_f16_n(x, s->half, (size_t)n * H);
            pd_f16_to_f32_n(s->half, x, (size_t)n * H);
        }
        if (s->cfg.trace)
            s->cfg.trace(s->cfg.trace_ctx, L + 1, rows, n, x);
    }
    for (uint32_t g = 0; g < s->n_groups; g++) {
        stage_group *gr = &s->groups[g];
        gr->st->pos = rows[gr->row0 + gr->n - 1].pos + 1;
        uint32_t drafts = 0;
        for (uint32_t j = 0; j < gr->n; j++)
            drafts += rows[gr->row0 + j].role == MB_ROLE_VERIFY;
        gr->st->ring_drafts = is_ring(s) ? drafts : 0;
    }
    return PD_OK;
}

void stage_memory(const stage *s, stage_mem *out)
{
    memset(out, 0, sizeof *out);
    for (uint32_t i = 0; i < s->cfg.max_streams; i++) {
        const stage_stream *st = &s->streams[i];
        if (!st->used)
            continue;
        for (uint32_t l = 0; l < s->n_layers; l++) {
            if (is_ring(s)) {
                ring_layer_mem m;
                ring_layer_mem_get(st->caches[l], &m);
                out->cache_bytes += m.allocated;
                out->attention_bytes += m.live;
            } else {
                kv_memory m;
                kv_layer_memory(st->caches[l], &m);
                out->cache_bytes += m.allocated;
                out->attention_bytes += m.attention + m.recurrent;
            }
        }
    }
}

uint64_t stage_stream_bytes_estimate(const model_hparams *hp, const cache_policy *p,
                                     uint32_t n_layers, uint32_t prefill_rows, uint32_t max_new)
{
    uint64_t rows;
    if (p->attn == POLICY_ATTN_RSWA)
        rows = (uint64_t)prefill_rows + p->window + p->max_drafts;
    else {
        rows = (uint64_t)prefill_rows + max_new + p->max_drafts + 1;
        if (p->attn == POLICY_ATTN_WINDOW && rows > 2ull * p->window + p->max_drafts + 2)
            rows = 2ull * p->window + p->max_drafts + 2;
    }
    uint64_t per_row_head = (p->kv & KV_MODE_Q8K ? hp->head_dim + 4ull * ((hp->head_dim + 31) / 32)
                                                  : 4ull * hp->head_dim) +
                            (p->kv & KV_MODE_Q8V ? hp->head_dim + 4ull : 4ull * hp->head_dim);
    return (uint64_t)n_layers * rows * (hp->n_kv_heads * per_row_head + 4);
}

/* ---- one stream's cache state (checkpoint, migration) -------------------- */

uint64_t stage_layer_identity(const stage *s, uint32_t layer)
{
    /* speculation changes no token (DESIGN.md section 1), so the draft limit
     * is not part of what makes a record meaningful */
    cache_policy pol = s->cfg.policy;
    pol.max_drafts = 0;
    char desc[160];
    policy_describe(&pol, desc, sizeof desc);
    uint64_t d = model_digest(s->cfg.m);
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(d >> (8 * i));
    return wire_identity(le, sizeof le, layer, desc);
}

pd_status stage_settle(stage *s, uint64_t stream, uint64_t pos, pd_err *err)
{
    stage_stream *st = stream_find(s, stream);
    if (!st)
        return pd_err_set(err, PD_ERR_ARG, "stage: settle: stream %llu was never admitted",
                          (unsigned long long)stream);
    if (pos > st->pos)
        return pd_err_set(err, PD_ERR_RANGE, "stage: settle: stream %llu is at position %llu, not %llu",
                          (unsigned long long)stream, (unsigned long long)st->pos,
                          (unsigned long long)pos);
    if (!rollback_allowed(s, st, st->pos - pos))
        return pd_err_set(err, PD_ERR_RANGE,
                          "stage: settle: stream %llu cannot roll back from %llu to %llu, more than "
                          "speculation allows",
                          (unsigned long long)stream, (unsigned long long)st->pos,
                          (unsigned long long)pos);
    pd_status rc = stream_settle(s, st, pos, err);
    if (rc != PD_OK)
        pd_err_prefix(err, "stage: settle");
    return rc;
}

pd_status stage_export_layer(const stage *s, uint64_t stream, uint32_t layer, uint8_t **out,
                             size_t *len, pd_err *err)
{
    const stage_stream *st = stream_find(s, stream);
    if (!st)
        return pd_err_set(err, PD_ERR_ARG, "stage: export: stream %llu was never admitted",
                          (unsigned long long)stream);
    if (layer < s->first || layer - s->first >= s->n_layers)
        return pd_err_set(err, PD_ERR_RANGE, "stage: export: layer %u is not in this stage's layers [%u, %u)",
                          layer, s->first, s->first + s->n_layers);
    wire_layer_ref ref = {.identity = stage_layer_identity(s, layer), .layer = layer};
    kv_layer_config kc;
    if (is_ring(s)) {
        ref.ring = st->caches[layer - s->first];
    } else {
        ref.kv = st->caches[layer - s->first];
        kv_layer_config_get(ref.kv, &kc);
        ref.kv_cfg = &kc;
    }
    pd_status rc = wire_export(&ref, 0, out, len, err);
    if (rc == PD_ERR_REFUSED && !is_ring(s) && s->cfg.policy.evict == POLICY_EVICT_IMPORTANCE)
        pd_err_prefix(err, "stage: export: stream %llu layer %u (its last micro-batch is not final "
                           "yet: stage_settle first)",
                      (unsigned long long)stream, layer);
    else if (rc != PD_OK)
        pd_err_prefix(err, "stage: export: stream %llu layer %u", (unsigned long long)stream, layer);
    return rc;
}
