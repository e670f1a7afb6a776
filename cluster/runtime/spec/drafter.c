/* drafter: the head's draft model (contract in drafter.h). */
#include "cluster/runtime/spec/drafter.h"

#include "base/check.h"
#include "cluster/runtime/plan/policy.h"
#include "cluster/runtime/pipeline/stage.h"
#include "comm/batch.h"

#include <stdlib.h>
#include <string.h>

/* INV: slot i is used iff used[i]; its stream then has its context's rows
 * [0, fed[i]) in the stage, followed by the last proposal's guesses (at most
 * max_k - 1 rows, undoable: the stream's next forward rolls them back). */
struct drafter {
    drafter_config cfg;
    model *m;
    model_hparams hp;
    bool sees_embeddings;
    stage *st;
    uint64_t *ids, *fed;
    bool *used;
    uint64_t *cursor;  /* [max_streams] per request: the next context row to run */
    mb_row *rows;      /* [max_rows] */
    float *x;          /* [max_rows x hidden] */
    uint32_t *lreq;    /* [max_rows] the request of each logits row */
    uint32_t *lrow;    /* [max_rows] its row in the forward */
    float *xl;         /* [max_rows x hidden] the rows that want logits */
    float *logits;     /* [max_rows x vocab] */
    drafter_stats stats;
};

/* The target's and the draft model's vocabularies must be the same list. */
static pd_status vocab_match(const model *t, const model *d, const char *path, pd_err *err)
{
    const model_hparams *ht = model_hp(t), *hd = model_hp(d);
    if (ht->vocab != hd->vocab)
        return pd_err_set(err, PD_ERR_MISMATCH, "--draft model:%s: vocabulary of %u tokens, the model's has %u",
                          path, hd->vocab, ht->vocab);
    if (ht->eos != hd->eos)
        return pd_err_set(err, PD_ERR_MISMATCH, "--draft model:%s: end-of-sequence token %u, the model's is %u",
                          path, hd->eos, ht->eos);
    for (uint32_t i = 0; i < ht->vocab; i++) {
        const char *a, *b;
        size_t la, lb;
        pd_status rc = model_token(t, i, &a, &la, err);
        if (rc == PD_OK)
            rc = model_token(d, i, &b, &lb, err);
        if (rc) {
            pd_err_prefix(err, "--draft model:%s: token %u", path, i);
            return rc;
        }
        if (la != lb || memcmp(a, b, la) != 0)
            return pd_err_set(err, PD_ERR_MISMATCH,
                              "--draft model:%s: token %u is '%.*s', the model's is '%.*s': not the same vocabulary",
                              path, i, (int)(lb > 40 ? 40 : lb), b, (int)(la > 40 ? 40 : la), a);
    }
    return PD_OK;
}

pd_status drafter_open(const drafter_config *cfg, drafter **out, pd_err *err)
{
    *out = NULL;
    if (!cfg->path || !cfg->target || cfg->max_streams == 0 || cfg->max_rows < cfg->max_streams ||
        cfg->max_k == 0)
        return pd_err_set(err, PD_ERR_ARG, "drafter: bad configuration");
    drafter *d = calloc(1, sizeof *d);
    if (!d)
        return pd_err_set(err, PD_ERR_NOMEM, "drafter: out of memory");
    d->cfg = *cfg;
    model_load_opts mo = {.all_layers = 1, .want_embed = 1, .want_output = 1, .backend = cfg->backend};
    pd_status rc = model_load(cfg->path, &mo, &d->m, err);
    if (rc) {
        pd_err_prefix(err, "--draft model:%s", cfg->path);
        free(d);
        return rc;
    }
    d->hp = *model_hp(d->m);
    d->sees_embeddings = d->hp.hidden == model_hp(cfg->target)->hidden;
    if ((rc = vocab_match(cfg->target, d->m, cfg->path, err))) {
        drafter_free(d);
        return rc;
    }
    /* full attention, f32, no eviction, and undo across micro-batches: the
     * guesses of a proposal (max_k - 1 single-row steps) and a refuted
     * --draft-async continuation (up to max_k assumed tokens) roll back as
     * the target's stages roll back under --draft-async */
    cache_policy pol;
    policy_default(&pol);
    pol.max_drafts = cfg->max_k;
    pol.spec_async = true;
    stage_config sc = {.m = d->m, .policy = pol, .max_rows = cfg->max_rows, .max_streams = cfg->max_streams,
                       .pool = cfg->pool};
    if ((rc = stage_new(&sc, &d->st, err))) {
        drafter_free(d);
        return rc;
    }
    size_t R = cfg->max_rows, S = cfg->max_streams, H = d->hp.hidden, V = d->hp.vocab;
    d->ids = calloc(S, sizeof *d->ids);
    d->fed = calloc(S, sizeof *d->fed);
    d->used = calloc(S, sizeof *d->used);
    d->cursor = calloc(S, sizeof *d->cursor);
    d->rows = calloc(R, sizeof *d->rows);
    d->x = malloc(R * H * sizeof *d->x);
    d->lreq = calloc(R, sizeof *d->lreq);
    d->lrow = calloc(R, sizeof *d->lrow);
    d->xl = malloc(R * H * sizeof *d->xl);
    d->logits = malloc(R * V * sizeof *d->logits);
    if (!d->ids || !d->fed || !d->used || !d->cursor || !d->rows || !d->x || !d->lreq || !d->lrow || !d->xl ||
        !d->logits) {
        drafter_free(d);
        return pd_err_set(err, PD_ERR_NOMEM, "drafter: out of memory");
    }
    *out = d;
    return PD_OK;
}

void drafter_free(drafter *d)
{
    if (!d)
        return;
    stage_free(d->st);
    model_free(d->m);
    free(d->ids);
    free(d->fed);
    free(d->used);
    free(d->cursor);
    free(d->rows);
    free(d->x);
    free(d->lreq);
    free(d->lrow);
    free(d->xl);
    free(d->logits);
    free(d);
}

bool drafter_sees_embeddings(const drafter *d)
{
    return d->sees_embeddings;
}

const model *drafter_model(const drafter *d)
{
    return d->m;
}

uint64_t drafter_ctx_len(const drafter *d)
{
    return d->hp.ctx;
}

void drafter_get_stats(const drafter *d, drafter_stats *out)
{
    *out = d->stats;
}

static int32_t slot_of(const drafter *d, uint64_t stream)
{
    for (uint32_t i = 0; i < d->cfg.max_streams; i++)
        if (d->used[i] && d->ids[i] == stream)
            return (int32_t)i;
    return -1;
}

void drafter_retire(drafter *d, uint64_t stream)
{
    int32_t i = slot_of(d, stream);
    if (i < 0)
        return;
    stage_retire(d->st, stream);
    d->used[i] = false;
}

/* The stream's prefill rows as its caches count them: a stream needs at
 * least one, so a context without prompt tokens counts its first
 * generated token as prefill (roles only; the rows are the same). */
static uint32_t prefill_of(const drafter_req *r)
{
    return r->n_prefill ? (uint32_t)r->n_prefill : 1;
}

/* The slot of r's stream, admitted if new; *slot its index. A known stream
 * keeps the rows its context still shares: its first row in this proposal
 * starts there, and the stage rolls back what follows (the last proposal's
 * guesses, a refuted continuation's tokens) as the target's stages roll back
 * under --draft-async — without making the kept rows final, since they may
 * be tokens an in-flight batch only assumes. Further back than the caches
 * undo, the stream is retired and admitted again: its whole context runs
 * once more and gives the same rows (batch invariance). */
static pd_status stream_slot(drafter *d, const drafter_req *r, uint32_t *slot, pd_err *err)
{
    int32_t i = slot_of(d, r->stream);
    if (i >= 0) {
        uint64_t keep = d->fed[i] < r->n_ctx ? d->fed[i] : r->n_ctx, floor = 0;
        pd_status rc = stage_undo_floor(d->st, r->stream, &floor, err);
        if (rc)
            return rc;
        if (keep >= floor) {
            d->fed[i] = keep;
        } else {
            drafter_retire(d, r->stream);
            i = -1;
        }
    }
    if (i < 0) {
        for (uint32_t j = 0; j < d->cfg.max_streams && i < 0; j++)
            if (!d->used[j])
                i = (int32_t)j;
        if (i < 0)
            return pd_err_set(err, PD_ERR_RANGE, "drafter: %u streams already alive", d->cfg.max_streams);
        mb_admit a = {.stream = r->stream, .prefill_rows = prefill_of(r), .max_new = r->max_rows + r->k};
        pd_status rc = stage_admit(d->st, &a, err);
        if (rc)
            return rc;
        d->used[i] = true;
        d->ids[i] = r->stream;
        d->fed[i] = 0;
    }
    *slot = (uint32_t)i;
    return PD_OK;
}

/* Token with the largest logit (the lowest id among equals). */
static uint32_t argmax(const float *l, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

/* Runs rows [n] and writes the argmax of logits row j (of nl, row lrow[j])
 * into reqs[lreq[j]].out[step]. */
static pd_status run_rows(drafter *d, const drafter_req *reqs, uint32_t n, uint32_t nl, uint32_t step, pd_err *err)
{
    const uint32_t H = d->hp.hidden, V = d->hp.vocab;
    pd_status rc = stage_forward(d->st, d->rows, n, d->x, err);
    if (rc) {
        pd_err_prefix(err, "draft model");
        return rc;
    }
    d->stats.rows += n;
    for (uint32_t j = 0; j < nl; j++)
        memcpy(d->xl + (size_t)j * H, d->x + (size_t)d->lrow[j] * H, H * sizeof *d->x);
    model_logits(d->m, d->xl, nl, d->logits, d->cfg.pool);
    for (uint32_t j = 0; j < nl; j++)
        reqs[d->lreq[j]].out[step] = argmax(d->logits + (size_t)j * V, V);
    return PD_OK;
}

pd_status drafter_propose(drafter *d, drafter_req *reqs, uint32_t n, drafter_ctx_fn fn, void *ctx,
                          pd_err *err)
{
    CHECK(n <= d->cfg.max_streams);
    const uint32_t R = d->cfg.max_rows, H = d->hp.hidden;
    pd_status rc;
    uint32_t kmax = 0;
    for (uint32_t i = 0; i < n; i++) {
        CHECK(reqs[i].k >= 1 && reqs[i].k <= d->cfg.max_k && reqs[i].n_ctx + reqs[i].k <= d->hp.ctx);
        uint32_t slot = 0;
        if ((rc = stream_slot(d, &reqs[i], &slot, err)))
            return rc;
        d->cursor[i] = d->fed[slot];
        if (reqs[i].k > kmax)
            kmax = reqs[i].k;
    }
    /* the committed rows each stream lacks, then its last token: its first
     * guess; a stream's rows may span several forwards */
    for (uint32_t i = 0; i < n;) {
        uint32_t nr = 0, nl = 0;
        for (; i < n && nr < R; i++) {
            const drafter_req *r = &reqs[i];
            if (d->cursor[i] < r->n_ctx) {
                uint64_t left = r->n_ctx - d->cursor[i];
                uint32_t c = left < R - nr ? (uint32_t)left : R - nr;
                if ((rc = fn(ctx, r, d->cursor[i], c, d->x + (size_t)nr * H, err)))
                    return rc;
                for (uint32_t j = 0; j < c; j++) {
                    uint64_t p = d->cursor[i] + j;
                    d->rows[nr + j] = (mb_row){.stream = r->stream, .pos = p,
                                               .role = p < prefill_of(r) ? MB_ROLE_PREFILL : MB_ROLE_DECODE};
                }
                d->cursor[i] += c;
                nr += c;
            }
            if (d->cursor[i] < r->n_ctx || nr == R)
                break; /* the forward is full: this stream goes on in the next one */
            model_embed(d->m, &r->last, 1, d->x + (size_t)nr * H);
            d->rows[nr] = (mb_row){.stream = r->stream,
                                   .pos = r->n_ctx,
                                   .role = r->n_ctx < prefill_of(r) ? MB_ROLE_PREFILL : MB_ROLE_DECODE,
                                   .wants_logits = 1};
            d->lreq[nl] = i;
            d->lrow[nl++] = nr++;
            d->cursor[i]++;
        }
        if (nr && (rc = run_rows(d, reqs, nr, nl, 0, err)))
            return rc;
    }
    /* each guess fed back in, one row per stream and step, up to k guesses
     * or an end-of-sequence guess: a stream stops at its end of sequence,
     * so nothing behind it can be accepted and it is not drafted either
     * (the pass that samples it ends the stream). cursor[i] is how many
     * drafts stream i gets */
    for (uint32_t i = 0; i < n; i++)
        d->cursor[i] = reqs[i].out[0] == d->hp.eos ? 0 : reqs[i].k;
    for (uint32_t step = 1; step < kmax; step++) {
        for (uint32_t i = 0; i < n;) {
            uint32_t nr = 0;
            for (; i < n && nr < R; i++) {
                const drafter_req *r = &reqs[i];
                if (step >= d->cursor[i])
                    continue;
                model_embed(d->m, &r->out[step - 1], 1, d->x + (size_t)nr * H);
                d->rows[nr] = (mb_row){.stream = r->stream, .pos = r->n_ctx + step, .role = MB_ROLE_DECODE,
                                       .wants_logits = 1};
                d->lreq[nr] = i;
                d->lrow[nr] = nr;
                nr++;
            }
            if (nr && (rc = run_rows(d, reqs, nr, nr, step, err)))
                return rc;
        }
        for (uint32_t i = 0; i < n; i++)
            if (step < d->cursor[i] && reqs[i].out[step] == d->hp.eos)
                d->cursor[i] = step;
    }
    /* the context ends at the last token; the guesses after it stay until
     * the stream's next forward rolls them back (stream_slot) */
    for (uint32_t i = 0; i < n; i++) {
        reqs[i].got = (uint32_t)d->cursor[i];
        d->fed[slot_of(d, reqs[i].stream)] = reqs[i].n_ctx + 1;
    }
    d->stats.proposals += n;
    return PD_OK;
}
