/* stage: the per-(stream, layer) cache containers of a layer range and the
 * scheduling of a micro-batch through them: it checks the rows, splits them
 * into one group per stream, and hands each layer its groups' containers;
 * the layer math itself is the model's (model_layer_forward), which runs
 * the GEMMs over all rows at once and one attention task per group. */
#include "cluster/runtime/pipeline/stage.h"

#include "base/check.h"
#include "base/fp16.h"
#include "cache/layer_cache.h"
#include "cache/ring_layer.h"
#include "comm/bundle.h"
#include "comm/lcache_wire.h"
#include "comm/wire.h"

#include <stdlib.h>
#include <string.h>

/* INV: a used slot holds caches[L] (a container of the stage's policy) for
 * exactly the absolute layers L in [first, first + n_layers), NULL elsewhere;
 * pos is the next position the stream's rows take (drafts included), and
 * every container of the stream is at pos. */
typedef struct stage_stream {
    int used;
    uint64_t id;
    uint64_t pos;
    uint32_t prefill_rows, max_new;
    lcache **caches; /* [hp.n_layers], indexed by absolute layer */
} stage_stream;

/* A contiguous run of rows of one stream inside a micro-batch. */
typedef struct stage_group {
    uint32_t row0, n;
    stage_stream *st;
} stage_group;

/* INV: weights[L] holds absolute layer L exactly for L in [first, first +
 * n_layers), NULL elsewhere; first + n_layers <= hp.n_layers. */
struct stage {
    stage_config cfg;
    model_hparams hp;
    uint32_t first, n_layers;
    const model **weights; /* [hp.n_layers] the model holding each layer's weights */
    uint32_t group; /* Q heads per KV head */
    stage_stream *streams;
    uint32_t alive;
    model_scratch *scratch; /* the layer math's buffers, max_rows rows */
    uint16_t *half;         /* [max_rows x hidden] (round_f16) */
    uint8_t *roles;         /* [max_rows] the rows' roles as lcache_role values */
    uint64_t *pos;          /* [max_rows] the rows' positions */
    stage_group *groups;    /* [max_rows] */
    model_group *mgroups;   /* [max_rows] the groups with one layer's containers */
    uint32_t n_groups;
    uint64_t rows_rolled_back; /* rows dropped by position-driven rollback or settle */
};

/* mb_role and lcache_role are the same numbers (cache/ cannot include
 * comm/batch.h), so a row's role goes to its container unchanged. */
_Static_assert(MB_ROLE_PREFILL == (int)LCACHE_ROLE_PREFILL && MB_ROLE_DECODE == (int)LCACHE_ROLE_DECODE &&
                   MB_ROLE_VERIFY == (int)LCACHE_ROLE_VERIFY && MB_ROLE_COUNT == (int)LCACHE_ROLE_COUNT,
               "mb_role and lcache_role disagree");

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
    uint64_t R = cfg->max_rows;
    if ((st = model_scratch_new(&s->hp, cfg->max_rows, &s->scratch, err)) != PD_OK) {
        stage_free(s);
        return st;
    }
    s->weights = calloc(s->hp.n_layers, sizeof *s->weights);
    s->streams = calloc(cfg->max_streams, sizeof *s->streams);
    s->groups = calloc(R, sizeof *s->groups);
    s->mgroups = calloc(R, sizeof *s->mgroups);
    s->roles = calloc(R, sizeof *s->roles);
    s->pos = calloc(R, sizeof *s->pos);
    s->half = cfg->round_f16 ? malloc(R * s->hp.hidden * sizeof(uint16_t)) : NULL;
    if ((cfg->round_f16 && !s->half) || !s->weights || !s->streams || !s->groups || !s->mgroups || !s->roles ||
        !s->pos) {
        stage_free(s);
        return pd_err_set(err, PD_ERR_NOMEM, "stage: out of memory for %u-row scratch", cfg->max_rows);
    }
    for (uint32_t L = s->first; L < s->first + s->n_layers; L++)
        s->weights[L] = cfg->m;
    *out = s;
    return PD_OK;
}

static void stream_free_caches(stage_stream *st, uint32_t n_model_layers)
{
    if (!st->caches)
        return;
    for (uint32_t L = 0; L < n_model_layers; L++)
        lcache_free(st->caches[L]);
    free(st->caches);
    st->caches = NULL;
}

void stage_free(stage *s)
{
    if (!s)
        return;
    for (uint32_t i = 0; s->streams && i < s->cfg.max_streams; i++)
        if (s->streams[i].used)
            stream_free_caches(&s->streams[i], s->hp.n_layers);
    free(s->weights);
    free(s->streams);
    free(s->groups);
    free(s->mgroups);
    free(s->roles);
    free(s->pos);
    free(s->half);
    model_scratch_free(s->scratch);
    free(s);
}

static stage_stream *stream_find(const stage *s, uint64_t id)
{
    for (uint32_t i = 0; i < s->cfg.max_streams; i++)
        if (s->streams[i].used && s->streams[i].id == id)
            return &s->streams[i];
    return NULL;
}

/* The container configuration of one of the stream's layers. */
static lcache_config stream_cache_config(const stage *s, const stage_stream *st)
{
    lcache_config c;
    policy_lcache_config(&s->cfg.policy, &c);
    c.n_kv_heads = s->hp.n_kv_heads;
    c.head_dim = s->hp.head_dim;
    c.q_per_kv = s->group;
    c.prefill_rows = st->prefill_rows;
    c.max_new = st->max_new;
    c.alloc = s->cfg.cache_alloc;
    return c;
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
    lcache **caches = calloc(s->hp.n_layers, sizeof *caches);
    if (!caches)
        return pd_err_set(err, PD_ERR_NOMEM, "stage: out of memory");
    *st = (stage_stream){.used = 1,
                         .id = a->stream,
                         .pos = 0,
                         .prefill_rows = a->prefill_rows,
                         .max_new = a->max_new,
                         .caches = caches};
    lcache_config cc = stream_cache_config(s, st);
    pd_status rc = PD_OK;
    for (uint32_t L = s->first; L < s->first + s->n_layers && rc == PD_OK; L++)
        rc = lcache_new(&cc, &caches[L], err);
    if (rc != PD_OK) {
        pd_err_prefix(err, "stage: admitting stream %llu", (unsigned long long)a->stream);
        stream_free_caches(st, s->hp.n_layers);
        st->used = 0;
        return rc;
    }
    s->alive++;
    return PD_OK;
}

pd_status stage_admit_at(stage *s, const mb_admit *a, uint64_t pos, pd_err *err)
{
    pd_status rc = stage_admit(s, a, err);
    if (rc == PD_OK)
        stream_find(s, a->stream)->pos = pos;
    return rc;
}

uint32_t stage_stream_list(const stage *s, uint64_t *ids, uint64_t *pos, uint32_t cap)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < s->cfg.max_streams; i++)
        if (s->streams[i].used) {
            if (n < cap) {
                ids[n] = s->streams[i].id;
                pos[n] = s->streams[i].pos;
            }
            n++;
        }
    return n;
}

void stage_retire(stage *s, uint64_t stream)
{
    stage_stream *st = stream_find(s, stream);
    if (!st)
        return;
    stream_free_caches(st, s->hp.n_layers);
    st->used = 0;
    s->alive--;
}

uint32_t stage_streams(const stage *s)
{
    return s->alive;
}

/* Checks the rows and splits them into per-stream groups; fills s->roles;
 * changes nothing else. Each group is checked against every container of
 * its stream (they agree; a layer added without its import does not). */
static pd_status forward_plan(stage *s, const mb_row *rows, uint32_t n, pd_err *err)
{
    s->n_groups = 0;
    for (uint32_t i = 0; i < n; i++) {
        const mb_row *r = &rows[i];
        if (r->role >= MB_ROLE_COUNT)
            return pd_err_set(err, PD_ERR_FORMAT, "row %u: role %u is not prefill/decode/verify", i, r->role);
        s->roles[i] = r->role;
        s->pos[i] = r->pos;
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
        }
        lcache_group lg = {.pos = rows[gr->row0].pos, .n = gr->n, .roles = s->roles + gr->row0};
        for (uint32_t L = s->first; L < s->first + s->n_layers; L++) {
            const lcache *c = gr->st->caches[L];
            if (lcache_position(c) != gr->st->pos)
                return pd_err_set(err, PD_ERR_FORMAT,
                                  "row %u: stream %llu: layer %u holds %llu positions, the stream %llu (a layer "
                                  "added without its import)",
                                  gr->row0, (unsigned long long)gr->st->id, L,
                                  (unsigned long long)lcache_position(c), (unsigned long long)gr->st->pos);
            uint32_t bad = 0;
            pd_err e = {0};
            if (lcache_group_check(c, &lg, &bad, &e) != PD_OK)
                return pd_err_set(err, PD_ERR_FORMAT, "row %u: stream %llu layer %u: %s", gr->row0 + bad,
                                  (unsigned long long)gr->st->id, L, e.msg);
        }
    }
    return PD_OK;
}

static void stage_progress(void *ctx)
{
    const stage *s = ctx;
    s->cfg.progress(s->cfg.progress_ctx);
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
    const uint32_t H = s->hp.hidden;
    const model_hooks hooks = {.progress = s->cfg.progress ? stage_progress : NULL, .ctx = s};
    const model_batch b = {.n = n, .pos = s->pos, .roles = s->roles, .groups = s->mgroups, .n_groups = s->n_groups};
    if (s->cfg.trace && s->first == 0)
        s->cfg.trace(s->cfg.trace_ctx, 0, rows, n, x);
    for (uint32_t L = s->first; L < s->first + s->n_layers; L++) {
        for (uint32_t g = 0; g < s->n_groups; g++)
            s->mgroups[g] = (model_group){.row0 = s->groups[g].row0, .n = s->groups[g].n,
                                          .cache = s->groups[g].st->caches[L]};
        /* A cache refused mid-layer: the stage's state is no longer
         * consistent across layers, so the run must stop. */
        if ((rc = model_layer_forward(s->weights[L], L, &b, x, s->scratch, s->cfg.pool, &hooks, err)) != PD_OK)
            return rc;
        if (s->half) {
            pd_f32_to_f16_n(x, s->half, (size_t)n * H);
            pd_f16_to_f32_n(s->half, x, (size_t)n * H);
        }
        if (s->cfg.trace)
            s->cfg.trace(s->cfg.trace_ctx, L + 1, rows, n, x);
    }
    for (uint32_t g = 0; g < s->n_groups; g++) {
        stage_group *gr = &s->groups[g];
        uint64_t p0 = rows[gr->row0].pos;
        if (p0 < gr->st->pos) /* rejected verify rows (or a stale batch) rolled back */
            s->rows_rolled_back += gr->st->pos - p0;
        gr->st->pos = rows[gr->row0 + gr->n - 1].pos + 1;
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
        uint64_t mine = 0;
        for (uint32_t L = s->first; L < s->first + s->n_layers; L++) {
            lcache_mem m;
            lcache_memory(st->caches[L], &m);
            out->cache_bytes += m.allocated;
            out->attention_bytes += m.live;
            mine += m.allocated;
        }
        if (mine > out->stream_bytes_max) {
            out->stream_bytes_max = mine;
            out->stream_estimate = stage_stream_bytes_estimate(&s->hp, &s->cfg.policy, s->n_layers,
                                                               st->prefill_rows, st->max_new);
        }
    }
}

uint64_t stage_stream_bytes_estimate(const model_hparams *hp, const cache_policy *p,
                                     uint32_t n_layers, uint32_t prefill_rows, uint32_t max_new)
{
    lcache_config c;
    policy_lcache_config(p, &c);
    c.n_kv_heads = hp->n_kv_heads;
    c.head_dim = hp->head_dim;
    c.q_per_kv = hp->n_heads / hp->n_kv_heads;
    c.prefill_rows = prefill_rows;
    c.max_new = max_new;
    return (uint64_t)n_layers * lcache_bytes_estimate(&c);
}

/* ---- one stream's cache state (checkpoint, migration) -------------------- */

uint64_t stage_layer_identity(const stage *s, uint32_t layer)
{
    /* speculation changes no token (ARCHITECTURE.md §1), so the draft limit
     * is not part of what makes a record meaningful */
    cache_policy pol = s->cfg.policy;
    pol.max_drafts = 0;
    pol.spec_async = false;
    char desc[160];
    policy_describe(&pol, desc, sizeof desc);
    uint64_t d = model_digest(s->cfg.m);
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(d >> (8 * i));
    return wire_identity(le, sizeof le, layer, desc);
}

/* The lowest position layer L lets st roll back to: st->pos less what the
 * layer can still undo. A layer added but not imported yet holds nothing of
 * the stream and does not limit it (its import will bring final rows). */
static uint64_t layer_floor(const stage_stream *st, uint32_t L)
{
    if (lcache_position(st->caches[L]) != st->pos)
        return 0;
    uint64_t lim = lcache_rollback_limit(st->caches[L]);
    return st->pos > lim ? st->pos - lim : 0;
}

pd_status stage_undo_floor(const stage *s, uint64_t stream, uint64_t *floor, pd_err *err)
{
    const stage_stream *st = stream_find(s, stream);
    if (!st)
        return pd_err_set(err, PD_ERR_ARG, "stage: undo floor: stream %llu was never admitted",
                          (unsigned long long)stream);
    *floor = 0;
    for (uint32_t L = s->first; L < s->first + s->n_layers; L++) {
        uint64_t f = layer_floor(st, L);
        if (f > *floor)
            *floor = f;
    }
    return PD_OK;
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
    for (uint32_t L = s->first; L < s->first + s->n_layers; L++)
        if (pos < layer_floor(st, L))
            return pd_err_set(err, PD_ERR_RANGE,
                              "stage: settle: stream %llu cannot roll back from %llu to %llu in layer %u, more "
                              "than speculation allows",
                              (unsigned long long)stream, (unsigned long long)st->pos,
                              (unsigned long long)pos, L);
    for (uint32_t L = s->first; L < s->first + s->n_layers; L++) {
        if (lcache_position(st->caches[L]) != st->pos)
            continue;
        pd_status rc = lcache_settle(st->caches[L], pos, err);
        /* checked above: every container takes it */
        CHECKF(rc == PD_OK, "stage: settle: stream %llu layer %u: %s", (unsigned long long)stream, L,
               err ? err->msg : "");
    }
    s->rows_rolled_back += st->pos - pos;
    st->pos = pos;
    return PD_OK;
}

uint64_t stage_rows_rolled_back(const stage *s)
{
    return s->rows_rolled_back;
}

pd_status stage_export_ref(const stage *s, uint64_t stream, uint32_t layer, wire_layer_ref *ref, kv_layer_config *kc,
                           pd_err *err)
{
    const stage_stream *st = stream_find(s, stream);
    if (!st)
        return pd_err_set(err, PD_ERR_ARG, "stage: export: stream %llu was never admitted",
                          (unsigned long long)stream);
    if (layer < s->first || layer - s->first >= s->n_layers)
        return pd_err_set(err, PD_ERR_RANGE, "stage: export: layer %u is not in this stage's layers [%u, %u)",
                          layer, s->first, s->first + s->n_layers);
    const lcache *c = st->caches[layer];
    if (lcache_position(c) != st->pos)
        return pd_err_set(err, PD_ERR_REFUSED, "stage: export: stream %llu layer %u awaits its import",
                          (unsigned long long)stream, layer);
    *ref = lcache_wire_ref(c, stage_layer_identity(s, layer), layer, kc);
    return PD_OK;
}

void stage_export_refused(const stage *s, uint64_t stream, uint32_t layer, pd_status rc, pd_err *err)
{
    const stage_stream *st = stream_find(s, stream);
    const lcache *c = st && layer >= s->first && layer - s->first < s->n_layers ? st->caches[layer] : NULL;
    if (rc == PD_ERR_REFUSED && c && lcache_pending(c))
        pd_err_prefix(err, "stage: export: stream %llu layer %u (its last micro-batch is not final "
                           "yet: stage_settle first)",
                      (unsigned long long)stream, layer);
    else if (rc != PD_OK)
        pd_err_prefix(err, "stage: export: stream %llu layer %u", (unsigned long long)stream, layer);
}

pd_status stage_export_layer(const stage *s, uint64_t stream, uint32_t layer, uint8_t **out,
                             size_t *len, pd_err *err)
{
    kv_layer_config kc;
    wire_layer_ref ref;
    pd_status rc = stage_export_ref(s, stream, layer, &ref, &kc, err);
    if (rc != PD_OK)
        return rc;
    if ((rc = wire_export(&ref, 0, out, len, err)) != PD_OK)
        stage_export_refused(s, stream, layer, rc, err);
    return rc;
}

/* ---- the layer range ------------------------------------------------------ */

void stage_layers(const stage *s, uint32_t *first, uint32_t *n)
{
    *first = s->first;
    *n = s->n_layers;
}

/* A copy the caller offers for (stream, layer) passes the install checks:
 * a container of the stage's kind whose state stands for exactly the
 * stream's position, nothing pending. */
static pd_status copy_check(const stage *s, const stage_stream *st, uint32_t layer, const lcache *copy, pd_err *err)
{
    lcache_config want = stream_cache_config(s, st), have;
    lcache_config_get(copy, &have);
    if (want.kind != have.kind)
        return pd_err_set(err, PD_ERR_MISMATCH, "stage: stream %llu layer %u: the copy is another kind of container",
                          (unsigned long long)st->id, layer);
    if (lcache_group_open(copy) || lcache_pending(copy))
        return pd_err_set(err, PD_ERR_ARG, "stage: stream %llu layer %u: the copy has rows pending",
                          (unsigned long long)st->id, layer);
    uint64_t depth = lcache_kv(copy) ? kv_layer_pos_len(lcache_kv(copy))
                                     : ring_layer_position(lcache_ring(copy)) + ring_layer_drafts(lcache_ring(copy));
    pd_status rc = lcache_adopt_check(copy, depth, st->pos, err);
    if (rc != PD_OK)
        pd_err_prefix(err, "stage: stream %llu layer %u", (unsigned long long)st->id, layer);
    return rc;
}

pd_status stage_check_copy(const stage *s, uint64_t stream, uint32_t layer, const lcache *copy, pd_err *err)
{
    stage_stream *st = stream_find((stage *)s, stream);
    if (!st)
        return pd_err_set(err, PD_ERR_ARG, "stage: stream %llu was never admitted", (unsigned long long)stream);
    return copy_check(s, st, layer, copy, err);
}

pd_status stage_add_layers(stage *s, uint32_t first, uint32_t n, const model *weights, pd_err *err)
{
    return stage_add_layers_from(s, first, n, weights, NULL, NULL, err);
}

pd_status stage_add_layers_from(stage *s, uint32_t first, uint32_t n, const model *weights, stage_copy_fn copy,
                                void *ctx, pd_err *err)
{
    if (n == 0)
        return pd_err_set(err, PD_ERR_ARG, "stage: adding 0 layers");
    if (first > s->hp.n_layers || n > s->hp.n_layers - first)
        return pd_err_set(err, PD_ERR_RANGE, "stage: layers [%u, %u) are past the model's %u layers", first,
                          first + n, s->hp.n_layers);
    if (s->n_layers && first + n != s->first && first != s->first + s->n_layers)
        return pd_err_set(err, PD_ERR_RANGE, "stage: layers [%u, %u) are not next to this stage's [%u, %u)",
                          first, first + n, s->first, s->first + s->n_layers);
    const model *w = weights ? weights : s->cfg.m;
    if (!model_holds_layers(w, first, n))
        return pd_err_set(err, PD_ERR_RANGE, "stage: the weights hold layers [%u, %u) (less any released), not [%u, %u)",
                          model_first_layer(w), model_first_layer(w) + model_layer_count(w), first, first + n);
    if (w != s->cfg.m && model_digest(w) != model_digest(s->cfg.m))
        return pd_err_set(err, PD_ERR_MISMATCH, "stage: the weights of layers [%u, %u) come from another model file",
                          first, first + n);
    /* the copies' checks, then every new container, so a failure leaves
     * nothing behind (and every copy with the caller) */
    pd_status rc = PD_OK;
    for (uint32_t i = 0; i < s->cfg.max_streams && rc == PD_OK && copy; i++)
        for (uint32_t L = first; s->streams[i].used && L < first + n && rc == PD_OK; L++) {
            const lcache *c = copy(ctx, s->streams[i].id, L);
            if (c)
                rc = copy_check(s, &s->streams[i], L, c, err);
        }
    for (uint32_t i = 0; i < s->cfg.max_streams && rc == PD_OK; i++) {
        stage_stream *st = &s->streams[i];
        if (!st->used)
            continue;
        lcache_config cc = stream_cache_config(s, st);
        for (uint32_t L = first; L < first + n && rc == PD_OK; L++)
            if (!copy || !copy(ctx, st->id, L))
                rc = lcache_new(&cc, &st->caches[L], err);
    }
    if (rc != PD_OK) {
        for (uint32_t i = 0; i < s->cfg.max_streams; i++)
            for (uint32_t L = first; s->streams[i].used && L < first + n; L++) {
                lcache_free(s->streams[i].caches[L]);
                s->streams[i].caches[L] = NULL;
            }
        pd_err_prefix(err, "stage: adding layers [%u, %u)", first, first + n);
        return rc;
    }
    /* nothing below fails: the copies become the stage's */
    for (uint32_t i = 0; i < s->cfg.max_streams && copy; i++)
        for (uint32_t L = first; s->streams[i].used && L < first + n; L++) {
            lcache *c = copy(ctx, s->streams[i].id, L);
            if (c) {
                s->streams[i].caches[L] = c;
                lcache_adopt(c, s->streams[i].pos);
            }
        }
    for (uint32_t L = first; L < first + n; L++)
        s->weights[L] = w;
    if (s->n_layers == 0 || first < s->first)
        s->first = first;
    s->n_layers += n;
    return PD_OK;
}

pd_status stage_remove_layers(stage *s, uint32_t first, uint32_t n, pd_err *err)
{
    if (n == 0)
        return pd_err_set(err, PD_ERR_ARG, "stage: removing 0 layers");
    uint32_t end = s->first + s->n_layers;
    if (first < s->first || first > end || n > end - first || (first != s->first && first + n != end))
        return pd_err_set(err, PD_ERR_RANGE, "stage: layers [%u, %u) are not at an end of this stage's [%u, %u)",
                          first, first + n, s->first, end);
    for (uint32_t i = 0; i < s->cfg.max_streams; i++)
        for (uint32_t L = first; s->streams[i].used && L < first + n; L++) {
            lcache_free(s->streams[i].caches[L]);
            s->streams[i].caches[L] = NULL;
        }
    for (uint32_t L = first; L < first + n; L++)
        s->weights[L] = NULL;
    if (first == s->first)
        s->first += n;
    s->n_layers -= n;
    return PD_OK;
}

pd_status stage_import_target(stage *s, uint64_t stream, uint32_t layer, bundle_target *t, pd_err *err)
{
    stage_stream *st = stream_find(s, stream);
    if (!st)
        return pd_err_set(err, PD_ERR_ARG, "stage: import: stream %llu was never admitted",
                          (unsigned long long)stream);
    if (layer < s->first || layer - s->first >= s->n_layers)
        return pd_err_set(err, PD_ERR_RANGE, "stage: import: layer %u is not in this stage's layers [%u, %u)",
                          layer, s->first, s->first + s->n_layers);
    for (uint32_t L = s->first; L < s->first + s->n_layers; L++)
        if (L != layer && lcache_pending(st->caches[L]))
            return pd_err_set(err, PD_ERR_REFUSED,
                              "stage: import: stream %llu has rows that are not final yet (layer %u): "
                              "stage_settle first",
                              (unsigned long long)stream, L);
    *t = (bundle_target){.ref = {.identity = stage_layer_identity(s, layer), .layer = layer},
                         .c = st->caches[layer],
                         .pos = st->pos};
    return PD_OK;
}

pd_status stage_import_layer(stage *s, uint64_t stream, uint32_t layer, const void *buf, size_t len, pd_err *err)
{
    bundle_target t;
    pd_status rc = stage_import_target(s, stream, layer, &t, err);
    if (rc != PD_OK)
        return rc;
    rc = lcache_wire_import(t.c, t.ref.identity, layer, t.pos, buf, len, 0, err);
    if (rc != PD_OK)
        pd_err_prefix(err, "stage: import: stream %llu layer %u", (unsigned long long)stream, layer);
    return rc;
}

typedef struct install_to {
    stage *s;
    uint32_t layer;
} install_to;

static pd_status install_resolve(void *ctx, uint64_t stream, bundle_target *t, pd_err *err)
{
    const install_to *to = ctx;
    return stage_import_target(to->s, stream, to->layer, t, err);
}

pd_status stage_install_bundle(stage *s, const bundle_view *v, pd_err *err)
{
    return bundle_install(v, install_resolve, &(install_to){.s = s, .layer = v->layer}, err);
}

lcache *stage_cache(stage *s, uint64_t stream, uint32_t layer)
{
    stage_stream *st = stream_find(s, stream);
    if (!st || layer < s->first || layer - s->first >= s->n_layers)
        return NULL;
    return st->caches[layer];
}

pd_status stage_stream_shape(const stage *s, uint64_t stream, uint32_t *prefill_rows, uint32_t *max_new, pd_err *err)
{
    stage_stream *st = stream_find((stage *)s, stream);
    if (!st)
        return pd_err_set(err, PD_ERR_ARG, "stage: stream %llu was never admitted", (unsigned long long)stream);
    *prefill_rows = st->prefill_rows;
    *max_new = st->max_new;
    return PD_OK;
}

pd_status stage_stream_pos(const stage *s, uint64_t stream, uint64_t *pos, pd_err *err)
{
    stage_stream *st = stream_find((stage *)s, stream);
    if (!st)
        return pd_err_set(err, PD_ERR_ARG, "stage: stream %llu was never admitted", (unsigned long long)stream);
    *pos = st->pos;
    return PD_OK;
}

pd_status stage_spare_cache(const stage *s, uint32_t prefill_rows, uint32_t max_new, lcache **out, pd_err *err)
{
    stage_stream shape = {.prefill_rows = prefill_rows, .max_new = max_new};
    lcache_config cc = stream_cache_config(s, &shape);
    return lcache_new(&cc, out, err);
}

void stage_moe_stats(const stage *s, uint64_t *layer_runs, uint64_t *experts)
{
    model_scratch_moe_stats(s->scratch, layer_runs, experts);
}
