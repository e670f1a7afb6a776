/* sched: page queue, admission, micro-batch formation and results. */
#include "cluster/runtime/sched/sched.h"

#include "base/check.h"
#include "cluster/runtime/pipeline/stream.h"
#include "comm/msg.h"

#define SCHED_MAX_DRAFTS 16u /* draft.h's largest K */
#define SCHED_SPEC_PROBE 8u      /* passes a stream that stopped drafting waits before it probes, */
#define SCHED_SPEC_PROBE_MAX 256u /* doubled after every probe that fails, up to this */
#define SCHED_CHAIN_CAP (2u * SCHED_MAX_DRAFTS + 2u) /* assumed tokens of two batches in flight */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One outstanding micro-batch's buffers. */
/* A stream in a micro-batch in flight. */
typedef struct slot_member {
    uint32_t slot; /* its stream-table slot */
    uint64_t id;   /* the stream it was (a slot may be reused by a new stream
                      while an old one's batch travels) */
    uint32_t sent; /* drafts it carries */
    uint8_t chain; /* 1: verify rows only, continuing its previous
                      micro-batch (asynchronous speculation) */
} slot_member;

typedef struct sched_slot {
    bool busy;
    mb_row *rows;
    float *x;
    mb_admit *admit;
    uint64_t *retire;
    uint32_t *logit_stream; /* [max_rows] stream slot of each logits row */
    uint32_t *logit_member; /* [max_rows] its member index */
    slot_member *members;   /* [max_streams] the streams in this batch */
    uint32_t n_members;
    uint64_t seq;
} sched_slot;

/* The newest micro-batch in flight of a stream, for asynchronous
 * speculation: nothing to build on, its drafts to build on (assuming every
 * one is accepted), or known to be rejected before it was verified. */
enum { FL_WAIT, FL_CHAIN, FL_STALE };

/* A decoding stream's rows in the micro-batch being formed. */
typedef struct spec_entry {
    uint32_t slot;
    uint8_t chained;   /* verify rows only (FL_CHAIN on its newest batch) */
    uint32_t k;        /* drafts asked for */
    uint32_t got;      /* drafts made */
    uint32_t *drafts;  /* [SCHED_MAX_DRAFTS] */
    int32_t q;         /* its draft-model request, or -1 */
} spec_entry;

/* What the scheduler keeps for the stream in one stream-table slot (the
 * same index as the table's), reset when a stream takes the slot. */
typedef struct slot_state {
    /* the outstanding micro-batches holding the stream as a member (at most
     * 1, or 2 under asynchronous speculation) */
    uint8_t in_flight;
    bool reserved; /* admitted through cfg.admit */
    /* speculation: current K, idle passes while stopped, drafts sent in the
     * outstanding pass */
    uint32_t spec_k, spec_idle, spec_wait, spec_sent;
    /* asynchronous speculation: the state of the newest batch in flight
     * (FL_*), its seq, the seq of a batch known stale; chain_n tokens (in
     * the scheduler's chain buffer at this slot) assumed past the stream's
     * sampled ones if every batch in flight is accepted, chain_y where the
     * newest batch's own guesses start (0 when one batch is in flight) */
    uint8_t fl_state;
    uint64_t fl_seq, stale_seq;
    uint32_t chain_n, chain_y;
} slot_state;

struct sched {
    sched_config cfg;
    uint32_t hidden;
    uint32_t eos;
    /* INV: every stream in the table has page < pages_count and is not yet
     * finished (a finished stream leaves at once); ss[i].in_flight counts
     * the outstanding slots that hold table slot i's current stream as a
     * member. */
    stream_table *streams;
    slot_state *ss;           /* [max_streams] by table slot */
    uint32_t *chain;          /* [max_streams][SCHED_CHAIN_CAP]: ss[i].chain_n tokens each */
    bool *taken;              /* [pages] restored from a checkpoint: never admitted again */
    spec_entry *forms;        /* [max_streams] the batch being formed */
    uint32_t *hist_buf, *draft_buf;
    size_t hist_cap;
    /* --draft model: the proposals asked for in the batch being formed; the
     * drafts of its entries (SCHED_MAX_DRAFTS each) */
    drafter_req *mreq;
    uint32_t *mdrafts;
    sched_slot *slots;
    uint32_t n_slots;
    uint64_t *pending_retire;
    uint32_t n_pending_retire;
    size_t next_page;
    uint64_t next_id;
    uint64_t seq;
    uint32_t inflight;
    sched_progress prog;
};

void sched_free(sched *s)
{
    if (!s)
        return;
    stream_table_free(s->streams);
    free(s->ss);
    free(s->taken);
    free(s->chain);
    free(s->forms);
    free(s->hist_buf);
    free(s->draft_buf);
    free(s->mreq);
    free(s->mdrafts);
    for (uint32_t i = 0; s->slots && i < s->n_slots; i++) {
        sched_slot *sl = &s->slots[i];
        free(sl->rows);
        free(sl->x);
        free(sl->admit);
        free(sl->retire);
        free(sl->logit_stream);
        free(sl->logit_member);
        free(sl->members);
    }
    free(s->slots);
    free(s->pending_retire);
    free(s);
}

pd_status sched_new(const sched_config *cfg, uint32_t max_inflight, sched **out, pd_err *err)
{
    if (!cfg->pg || !cfg->m || cfg->max_streams == 0 || cfg->max_rows == 0 || max_inflight == 0)
        return pd_err_set(err, PD_ERR_ARG, "sched: pages, model, batch, rows and in-flight limit are required");
    if (cfg->max_rows < cfg->max_streams)
        return pd_err_set(err, PD_ERR_ARG, "sched: row budget %u is below the stream count %u", cfg->max_rows,
                          cfg->max_streams);
    sched *s = calloc(1, sizeof *s);
    if (!s)
        return pd_err_set(err, PD_ERR_NOMEM, "sched: out of memory");
    s->cfg = *cfg;
    s->hidden = model_hp(cfg->m)->hidden;
    s->eos = model_hp(cfg->m)->eos;
    s->n_slots = max_inflight;
    pd_status st = stream_table_new(cfg->max_streams, &s->streams, err);
    if (st) {
        sched_free(s);
        return st;
    }
    s->ss = calloc(cfg->max_streams, sizeof *s->ss);
    s->taken = calloc(pages_count(cfg->pg) ? pages_count(cfg->pg) : 1, sizeof *s->taken);
    s->slots = calloc(max_inflight, sizeof *s->slots);
    s->pending_retire = calloc(cfg->max_streams, sizeof *s->pending_retire);
    s->chain = calloc((size_t)cfg->max_streams * SCHED_CHAIN_CAP, sizeof *s->chain);
    s->forms = calloc(cfg->max_streams, sizeof *s->forms);
    s->draft_buf = calloc(SCHED_MAX_DRAFTS + 1, sizeof *s->draft_buf);
    /* lookups see every prompt token and every generated one */
    for (size_t p = 0; p < pages_count(cfg->pg); p++) {
        const pages_page *pg = pages_get(cfg->pg, p);
        size_t h = (size_t)pg->prefill_rows + pg->max_new_tokens + 1;
        if (h > s->hist_cap)
            s->hist_cap = h;
    }
    s->hist_buf = calloc(s->hist_cap ? s->hist_cap : 1, sizeof *s->hist_buf);
    s->mreq = calloc(cfg->max_streams, sizeof *s->mreq);
    s->mdrafts = calloc((size_t)cfg->max_streams * SCHED_MAX_DRAFTS, sizeof *s->mdrafts);
    bool ok = s->ss && s->chain && s->taken && s->slots && s->pending_retire && s->forms && s->draft_buf &&
              s->hist_buf && s->mreq && s->mdrafts;
    for (uint32_t i = 0; ok && i < max_inflight; i++) {
        sched_slot *sl = &s->slots[i];
        sl->rows = calloc(cfg->max_rows, sizeof *sl->rows);
        sl->x = malloc((size_t)cfg->max_rows * s->hidden * sizeof(float));
        sl->admit = calloc(cfg->max_streams, sizeof *sl->admit);
        sl->retire = calloc(cfg->max_streams, sizeof *sl->retire);
        sl->logit_stream = calloc(cfg->max_rows, sizeof *sl->logit_stream);
        sl->logit_member = calloc(cfg->max_rows, sizeof *sl->logit_member);
        sl->members = calloc(cfg->max_streams, sizeof *sl->members);
        ok = sl->rows && sl->x && sl->admit && sl->retire && sl->logit_stream && sl->logit_member && sl->members;
    }
    if (!ok) {
        sched_free(s);
        return pd_err_set(err, PD_ERR_NOMEM, "sched: out of memory");
    }
    size_t n = pages_count(cfg->pg);
    s->prog.pages_total = n;
    for (size_t i = 0; cfg->skip && i < n; i++)
        s->prog.pages_skipped += cfg->skip[i];
    *out = s;
    return PD_OK;
}

/* Hands the page to on_done and frees the stream; stages learn of it on the
 * next header when `admitted` (a page that never reached them is not announced). */
static pd_status stream_finish(sched *s, stream_state *st, sched_stop stop, bool admitted, const char *error,
                               pd_err *err)
{
    sched_result r = {.page = (size_t)st->page,
                      .id = st->page_id,
                      .tokens = st->tokens,
                      .n_tokens = st->n_tokens - (stop == SCHED_STOP_EOS), /* the EOS is not text */
                      .prefill_rows = st->prefill_rows,
                      .stop = stop,
                      .digest = st->digest,
                      .error = error};
    pd_status rc = s->cfg.on_done ? s->cfg.on_done(s->cfg.on_done_ctx, &r, err) : PD_OK;
    for (uint32_t i = 0; i < s->cfg.max_streams; i++) {
        if (stream_table_at(s->streams, i) != st)
            continue;
        if (s->ss[i].reserved) {
            s->ss[i].reserved = false;
            s->cfg.release(s->cfg.admit_ctx, (size_t)st->page, st->prefill_rows, st->max_new);
        }
        /* a batch of it still in flight (asynchronous speculation) is
         * recognised by its stream id when it returns */
        s->ss[i].in_flight = 0;
        s->ss[i].chain_n = 0;
        s->ss[i].fl_state = FL_WAIT;
    }
    s->prog.pages_done++;
    s->prog.pages_failed += stop == SCHED_STOP_ERROR;
    if (admitted)
        s->pending_retire[s->n_pending_retire++] = st->id;
    if (s->cfg.drafter)
        drafter_retire(s->cfg.drafter, st->id);
    stream_table_drop(s->streams, st->id);
    return rc;
}

/* Embeds prefill rows [from, from + n) of stream st into x, the prompt
 * tokens through em's embedding table (the target's, or the draft model's). */
static pd_status prefill_rows(sched *s, const stream_state *st, const model *em, uint64_t from, uint32_t n,
                              float *x, pd_err *err)
{
    const pages_page *pg = pages_get(s->cfg.pg, st->page);
    uint64_t seg0 = 0;
    uint32_t done = 0;
    for (uint32_t k = 0; k < pg->n_segs && done < n; k++) {
        const pages_seg *sg = &pg->segs[k];
        uint64_t seg_end = seg0 + sg->rows;
        uint64_t at = from + done;
        if (at < seg_end) {
            uint32_t off = (uint32_t)(at - seg0);
            uint32_t cnt = sg->rows - off;
            if (cnt > n - done)
                cnt = n - done;
            float *dst = x + (size_t)done * s->hidden;
            if (sg->kind == PAGES_SEG_TOKENS) {
                for (uint32_t i = 0; i < cnt; i++) {
                    uint32_t t = (uint32_t)sg->tokens[off + i];
                    model_embed(em, &t, 1, dst + (size_t)i * s->hidden);
                }
            } else if (sg->kind == PAGES_SEG_IMAGE) {
                if (sg->error)
                    return pd_err_set(err, PD_ERR_FORMAT, "%s", sg->error);
                CHECKF(s->cfg.image, "page %zu has an image segment and no encoder", (size_t)st->page);
                pd_status rc = s->cfg.image(s->cfg.image_ctx, (size_t)st->page, k, sg->path, sg->rows,
                                            em, off, cnt, dst, err);
                if (rc) {
                    pd_err_prefix(err, "prefill[%" PRIu32 "].image", k);
                    return rc;
                }
            } else {
                pd_status rc = pages_embed_read(s->cfg.pg, st->page, k, off, cnt, dst, err);
                if (rc)
                    return rc;
            }
            done += cnt;
        }
        seg0 = seg_end;
    }
    CHECK(done == n);
    return PD_OK;
}

/* A new stream's speculation: one draft at first (a stream whose drafts
 * are never right costs one verify row before it stops), doubled up to K
 * while every draft is accepted, halved when none is. */
static void spec_start(sched *s, uint32_t i)
{
    s->ss[i] = (slot_state){.reserved = s->ss[i].reserved, .spec_k = 1, .spec_wait = SCHED_SPEC_PROBE,
                            .fl_state = FL_WAIT, .stale_seq = UINT64_MAX};
}

/* Takes the next page of the manifest into a free stream slot: its index in
 * *slot, or UINT32_MAX when no slot is free or no page is left. A page that
 * asks for no tokens finishes at once and the next one is tried. */
static pd_status admit_next(sched *s, sched_slot *sl, uint32_t *na, uint32_t *slot, pd_err *err)
{
    size_t n_pages = pages_count(s->cfg.pg);
    for (;;) {
        *slot = UINT32_MAX;
        while (s->next_page < n_pages && ((s->cfg.skip && s->cfg.skip[s->next_page]) || s->taken[s->next_page]))
            s->next_page++;
        if (stream_table_count(s->streams) == s->cfg.max_streams || s->next_page >= n_pages)
            return PD_OK;
        /* its images still on an encoder rank: decode the others meanwhile */
        if (s->cfg.ready && stream_table_count(s->streams) > 0 && !s->cfg.ready(s->cfg.image_ctx, s->next_page))
            return PD_OK;
        const pages_page *pg = pages_get(s->cfg.pg, s->next_page);
        stream_state fresh;
        uint32_t free_slot;
        pd_status rc = stream_init(&fresh, s->next_id, s->next_page, pg->id, pg->prefill_rows, pg->max_new_tokens, err);
        if (rc == PD_OK && (rc = stream_table_put(s->streams, &fresh, &free_slot, err)))
            stream_release(&fresh);
        if (rc)
            return rc;
        s->next_id++;
        s->next_page++;
        stream_state *st = stream_table_at(s->streams, free_slot);
        spec_start(s, free_slot);
        uint32_t ctx = model_hp(s->cfg.m)->ctx;
        if (ctx && s->cfg.past_context && st->prefill_rows + st->max_new > ctx)
            s->prog.pages_past_context++;
        if (ctx && !s->cfg.past_context && st->prefill_rows + st->max_new > ctx) {
            char why[512];
            snprintf(why, sizeof why,
                     "page \"%s\": %llu prefill rows + max_new_tokens %u = %llu positions exceed the model's "
                     "context of %u (--past-context runs past it)",
                     st->page_id, (unsigned long long)st->prefill_rows, st->max_new,
                     (unsigned long long)(st->prefill_rows + st->max_new), ctx);
            if ((rc = stream_finish(s, st, SCHED_STOP_ERROR, false, why, err)))
                return rc;
            continue;
        }
        if (st->max_new == 0) {
            if ((rc = stream_finish(s, st, SCHED_STOP_LENGTH, false, NULL, err)))
                return rc;
            continue;
        }
        if (s->cfg.admit) {
            char why[512] = "";
            sched_admit a = s->cfg.admit(s->cfg.admit_ctx, (size_t)st->page, st->prefill_rows, st->max_new, why,
                                         sizeof why);
            if (a == SCHED_ADMIT_WAIT) {
                /* not yet: the page stays first in the queue */
                stream_table_drop(s->streams, st->id);
                s->next_id--;
                s->next_page--;
                return PD_OK;
            }
            if (a == SCHED_ADMIT_NEVER) {
                if ((rc = stream_finish(s, st, SCHED_STOP_ERROR, false, why, err)))
                    return rc;
                continue;
            }
            s->ss[free_slot].reserved = true;
        }
        sl->admit[(*na)++] = (mb_admit){.stream = st->id,
                                        .prefill_rows = (uint32_t)st->prefill_rows,
                                        .max_new = st->max_new,
                                        .sample_key = st->key};
        s->prog.prefill_rows += st->prefill_rows;
        *slot = free_slot;
        return PD_OK;
    }
}

/* A page whose input failed mid-run ends by itself. If its admission rides
 * on this very micro-batch (the last admit), the admission is withdrawn and
 * no stage ever hears of the stream; otherwise its retirement rides on the
 * next header like any finished stream's. */
static pd_status page_fail(sched *s, sched_slot *sl, stream_state *st, uint32_t *na, const char *why, pd_err *err)
{
    bool admitted = true;
    if (*na > 0 && sl->admit[*na - 1].stream == st->id) {
        (*na)--;
        s->prog.prefill_rows -= st->prefill_rows;
        admitted = false;
    }
    return stream_finish(s, st, SCHED_STOP_ERROR, admitted, why, err);
}

/* Appends the next prefill chunk of stream i (at most `room` rows) to the
 * micro-batch. */
static pd_status add_prefill(sched *s, sched_slot *sl, uint32_t i, uint32_t room, uint32_t *nr, uint32_t *nl,
                             uint32_t *na, pd_err *err)
{
    stream_state *st = stream_table_at(s->streams, i);
    uint64_t rest = st->prefill_rows - st->fed;
    uint32_t chunk = s->cfg.prefill_chunk ? s->cfg.prefill_chunk : UINT32_MAX;
    uint32_t n = rest < chunk ? (uint32_t)rest : chunk;
    if (n > room)
        n = room;
    pd_err pe = {0};
    pd_status rc = prefill_rows(s, st, s->cfg.m, st->fed, n, sl->x + (size_t)*nr * s->hidden, &pe);
    if (rc == PD_ERR_NOMEM) {
        *err = pe;
        return rc;
    }
    if (rc)
        return page_fail(s, sl, st, na, pe.msg, err);
    bool last_row = false;
    for (uint32_t j = 0; j < n; j++) {
        uint64_t pos = st->fed + j;
        bool last = pos + 1 == st->prefill_rows;
        last_row = last_row || last;
        sl->rows[*nr + j] = (mb_row){.stream = st->id, .pos = pos, .role = MB_ROLE_PREFILL, .wants_logits = last};
        if (last)
            sl->logit_stream[(*nl)++] = i;
    }
    st->fed += n;
    s->ss[i].in_flight++;
    if (last_row)
        sl->logit_member[*nl - 1] = sl->n_members;
    sl->members[sl->n_members++] = (slot_member){.slot = i, .id = st->id};
    *nr += n;
    return PD_OK;
}

/* The tokens assumed past stream slot i's sampled ones when its rows build
 * on the batches in flight (asynchronous speculation), else none. */
static uint32_t chain_len(const sched *s, const spec_entry *e)
{
    return e->chained ? s->ss[e->slot].chain_n : 0;
}

static const uint32_t *chain_of(const sched *s, uint32_t i)
{
    return s->chain + (size_t)i * SCHED_CHAIN_CAP;
}

/* The token history drafts are looked up in: the page's prompt tokens,
 * then the stream's sampled tokens, then the tokens e's rows assume; into
 * s->hist_buf, returns its length. */
static size_t spec_history(sched *s, const stream_state *st, const spec_entry *e)
{
    const pages_page *pg = pages_get(s->cfg.pg, (size_t)st->page);
    size_t n = 0;
    for (uint32_t k = 0; k < pg->n_segs; k++)
        if (pg->segs[k].kind == PAGES_SEG_TOKENS)
            for (uint32_t j = 0; j < pg->segs[k].rows && n < s->hist_cap; j++)
                s->hist_buf[n++] = (uint32_t)pg->segs[k].tokens[j];
    for (uint32_t j = 0; j < st->n_tokens && n < s->hist_cap; j++)
        s->hist_buf[n++] = st->tokens[j];
    for (uint32_t j = 0; j < chain_len(s, e) && n < s->hist_cap; j++)
        s->hist_buf[n++] = chain_of(s, e->slot)[j];
    return n;
}

/* How many drafts stream slot i may carry: no more than its adaptive K,
 * the tokens it may still generate after this row (after the assumed ones
 * when `assumed` tokens and the in-flight batch's own next token come
 * first), and the room left. */
static uint32_t spec_budget(sched *s, uint32_t i, const stream_state *st, uint32_t assumed, bool chained,
                            uint32_t room)
{
    if (s->cfg.draft.mode == DRAFT_NONE)
        return 0;
    slot_state *q = &s->ss[i];
    if (q->spec_k == 0) {
        /* stopped after rejections: probe again with one draft later */
        if (++q->spec_idle < q->spec_wait)
            return 0;
        q->spec_idle = 0;
        q->spec_k = 1;
    }
    uint32_t k = q->spec_k;
    /* tokens still to come: this row's included, or (chained) after the
     * in-flight batch's assumed tokens and its own next one */
    uint64_t done = (uint64_t)st->n_tokens + (chained ? assumed + 1 : 1);
    uint64_t left = st->max_new > done ? st->max_new - done : 0;
    if (k > left)
        k = (uint32_t)left;
    if (k > room)
        k = room;
    return k;
}

/* The prompt tokens of a page (its token segments, in order). */
static uint64_t prompt_tokens(const pages_page *pg)
{
    uint64_t n = 0;
    for (uint32_t k = 0; k < pg->n_segs; k++)
        if (pg->segs[k].kind == PAGES_SEG_TOKENS)
            n += pg->segs[k].rows;
    return n;
}

static uint32_t prompt_token_at(const pages_page *pg, uint64_t j)
{
    for (uint32_t k = 0; k < pg->n_segs; k++) {
        if (pg->segs[k].kind != PAGES_SEG_TOKENS)
            continue;
        if (j < pg->segs[k].rows)
            return (uint32_t)pg->segs[k].tokens[j];
        j -= pg->segs[k].rows;
    }
    CHECKF(0, "prompt token %llu past the page's prompt", (unsigned long long)j);
    return 0;
}

/* The draft model's context of a stream (drafter.h): the prefill rows then
 * the generated tokens when it reads embeddings, else the prompt tokens
 * then the generated ones. */
static pd_status draft_ctx(void *ctx, const drafter_req *r, uint64_t from, uint32_t n, float *x, pd_err *err)
{
    sched *s = ctx;
    const spec_entry *e = r->user;
    const stream_state *st = stream_table_at(s->streams, e->slot);
    const model *dm = drafter_model(s->cfg.drafter);
    const uint32_t H = model_hp(dm)->hidden;
    const pages_page *pg = pages_get(s->cfg.pg, (size_t)st->page);
    bool emb = drafter_sees_embeddings(s->cfg.drafter);
    uint64_t P = emb ? st->prefill_rows : prompt_tokens(pg);
    uint32_t np = from < P ? (uint32_t)(P - from < n ? P - from : n) : 0;
    if (np && emb) {
        pd_status rc = prefill_rows(s, st, dm, from, np, x, err);
        if (rc)
            return rc;
    }
    for (uint32_t j = 0; j < n; j++) {
        if (j < np && emb)
            continue;
        uint64_t p = from + j;
        uint32_t t = p < P                       ? prompt_token_at(pg, p)
                     : p - P < st->n_tokens      ? st->tokens[p - P]
                                                 : chain_of(s, e->slot)[p - P - st->n_tokens];
        model_embed(dm, &t, 1, x + (size_t)j * H);
    }
    return PD_OK;
}

/* A draft-model proposal for entry e (its stream's sampled tokens and the
 * tokens e assumes): queued in s->mreq[*nq] and run for the whole batch at
 * once. Returns k cut to what the draft model's context length allows. */
static uint32_t draft_model_queue(sched *s, const stream_state *st, spec_entry *e, uint32_t k, uint32_t *nq)
{
    const pages_page *pg = pages_get(s->cfg.pg, (size_t)st->page);
    uint32_t cn = chain_len(s, e);
    uint64_t P = drafter_sees_embeddings(s->cfg.drafter) ? st->prefill_rows : prompt_tokens(pg);
    uint64_t n_ctx = P + st->n_tokens + cn - 1, ctx_len = drafter_ctx_len(s->cfg.drafter);
    if (n_ctx + k > ctx_len)
        k = ctx_len > n_ctx ? (uint32_t)(ctx_len - n_ctx) : 0;
    if (k == 0)
        return 0;
    uint32_t q = (*nq)++;
    s->mreq[q] = (drafter_req){.stream = st->id,
                               .n_ctx = n_ctx,
                               .n_prefill = P,
                               .last = cn ? chain_of(s, e->slot)[cn - 1] : st->tokens[st->n_tokens - 1],
                               .k = k,
                               .max_rows = (uint32_t)(P + st->max_new + SCHED_CHAIN_CAP),
                               .out = e->drafts,
                               .user = e};
    e->q = (int32_t)q;
    return k;
}

/* The current stream of member m of sl, or NULL when it has finished
 * since (its table slot may hold another stream by now). */
static stream_state *member_stream(sched *s, const sched_slot *sl, uint32_t m)
{
    stream_state *st = stream_table_at(s->streams, sl->members[m].slot);
    return st && st->id == sl->members[m].id ? st : NULL;
}

/* After a pass: per speculating member, its drafts accepted (a decode row's
 * drafts: the rows that sampled minus the decode row; a chained member's:
 * every row that sampled), and its stream's next K (all accepted: doubled
 * up to K; none: halved). A chained member known stale counts its rows as
 * stale and changes no K: its rejection says nothing of its drafts. */
static void spec_account(sched *s, const sched_slot *sl, const sched_batch *b, const uint32_t *tokens,
                         const bool *stale)
{
    if (s->cfg.draft.mode == DRAFT_NONE)
        return;
    for (uint32_t m = 0; m < sl->n_members; m++) {
        uint32_t sent = sl->members[m].sent, i = sl->members[m].slot;
        if (sent == 0 || !member_stream(s, sl, m))
            continue;
        uint32_t ok = 0;
        for (uint32_t l = 0; l < b->n_logits; l++)
            ok += sl->logit_member[l] == m && tokens[l] != MSG_TOKEN_REJECTED;
        if (stale[m]) {
            s->prog.stale_rows += sent;
            continue;
        }
        uint32_t accepted = sl->members[m].chain ? ok : ok - 1;
        s->prog.spec_passes++;
        s->prog.accepted += accepted;
        slot_state *q = &s->ss[i];
        if (accepted == sent) {
            q->spec_k = q->spec_k * 2 < s->cfg.draft.k ? q->spec_k * 2 : s->cfg.draft.k;
            q->spec_wait = SCHED_SPEC_PROBE;
        } else if (accepted == 0) {
            if (q->spec_k == 1 && q->spec_wait < SCHED_SPEC_PROBE_MAX)
                q->spec_wait *= 2; /* the smallest draft failed: probe less often */
            q->spec_k /= 2;
        } else {
            q->spec_wait = SCHED_SPEC_PROBE;
        }
    }
}

/* What a decoding stream's rows in the next batch can be: none (it waits
 * for a result), a decode row from its sampled tokens (plus drafts), or —
 * asynchronous speculation — verify rows only, continuing the batch in
 * flight as if all its drafts were accepted. With its newest batch known
 * stale, a new decode row may go before the stale batch returns. */
typedef enum { FORM_SKIP, FORM_DECODE, FORM_CHAIN } form_kind;

static form_kind spec_form(const sched *s, uint32_t i)
{
    const slot_state *q = &s->ss[i];
    if (q->in_flight == 0)
        return FORM_DECODE;
    if (!s->cfg.spec_async || q->in_flight >= 2)
        return FORM_SKIP;
    return q->fl_state == FL_STALE ? FORM_DECODE : q->fl_state == FL_CHAIN ? FORM_CHAIN : FORM_SKIP;
}

/* The decode and verify rows of the streams that can have rows in this
 * batch (first pass: what they are and, for n-gram drafting, the drafts;
 * the draft model then proposes for all of them at once; second pass:
 * the rows). Returns the rows written in *nr, *nl and members in sl. */
static pd_status form_decode_rows(sched *s, sched_slot *sl, uint32_t R, uint32_t member_cap, uint32_t *nr,
                                  uint32_t *nl, pd_err *err)
{
    const uint32_t H = s->hidden;
    uint32_t nf = 0, nq = 0, reserved = 0;
    for (uint32_t i = 0; i < s->cfg.max_streams && reserved < R && nf < member_cap; i++) {
        stream_state *st = stream_table_at(s->streams, i);
        if (!st || st->fed < st->prefill_rows)
            continue;
        form_kind fk = spec_form(s, i);
        if (fk == FORM_SKIP)
            continue;
        spec_entry *e = &s->forms[nf];
        *e = (spec_entry){.slot = i, .chained = fk == FORM_CHAIN, .q = -1,
                          .drafts = s->mdrafts + (size_t)nf * SCHED_MAX_DRAFTS};
        uint32_t room = R - reserved - (e->chained ? 0 : 1);
        uint32_t k = spec_budget(s, i, st, chain_len(s, e), e->chained, room);
        if (k && s->cfg.draft.mode == DRAFT_NGRAM)
            k = e->got = draft_ngram(s->hist_buf, spec_history(s, st, e), s->cfg.draft.n, k, e->drafts);
        else if (k)
            k = draft_model_queue(s, st, e, k, &nq);
        if (e->chained && k == 0)
            continue; /* nothing to continue with */
        e->k = k;
        reserved += (e->chained ? 0 : 1) + k;
        nf++;
    }
    if (nq) {
        pd_status rc = drafter_propose(s->cfg.drafter, s->mreq, nq, draft_ctx, s, err);
        if (rc)
            return rc;
        for (uint32_t f = 0; f < nf; f++)
            if (s->forms[f].q >= 0)
                s->forms[f].got = s->mreq[s->forms[f].q].got;
    }
    for (uint32_t f = 0; f < nf; f++) {
        spec_entry *e = &s->forms[f];
        uint32_t i = e->slot, m = sl->n_members;
        stream_state *st = stream_table_at(s->streams, i);
        if (e->chained && e->got == 0)
            continue; /* the draft model stopped before its first guess */
        uint32_t *chain = s->chain + (size_t)i * SCHED_CHAIN_CAP;
        /* the position of the stream's last sampled token, and of the tokens
         * the in-flight batches assume after it */
        uint64_t p = st->prefill_rows + st->n_tokens - 1 + chain_len(s, e);
        if (!e->chained) {
            uint32_t last = st->tokens[st->n_tokens - 1];
            sl->rows[*nr] = (mb_row){.stream = st->id, .pos = p, .role = MB_ROLE_DECODE, .wants_logits = 1,
                                     .token = last};
            model_embed(s->cfg.m, &last, 1, sl->x + (size_t)*nr * H);
            sl->logit_stream[*nl] = i;
            sl->logit_member[(*nl)++] = m;
            (*nr)++;
        }
        for (uint32_t d = 0; d < e->got; d++) {
            sl->rows[*nr] = (mb_row){.stream = st->id, .pos = p + 1 + d, .role = MB_ROLE_VERIFY, .wants_logits = 1,
                                     .token = e->drafts[d]};
            model_embed(s->cfg.m, &e->drafts[d], 1, sl->x + (size_t)*nr * H);
            sl->logit_stream[*nl] = i;
            sl->logit_member[(*nl)++] = m;
            (*nr)++;
        }
        sl->members[sl->n_members++] = (slot_member){.slot = i, .id = st->id, .sent = e->got, .chain = e->chained};
        slot_state *q = &s->ss[i];
        q->spec_sent = e->got;
        s->prog.drafted += e->got;
        /* asynchronous speculation: what a next batch of the stream may
         * assume; a decode row starts afresh from the sampled tokens */
        if (!e->chained)
            q->chain_n = q->chain_y = 0;
        q->chain_y = q->chain_n;
        CHECK(q->chain_n + e->got <= SCHED_CHAIN_CAP);
        memcpy(chain + q->chain_n, e->drafts, e->got * sizeof *chain);
        q->chain_n += e->got;
        if (!e->chained)
            q->chain_y = 0;
        q->fl_state = e->got ? FL_CHAIN : FL_WAIT;
        q->fl_seq = s->seq;
        s->ss[i].in_flight++;
    }
    return PD_OK;
}

pd_status sched_next(sched *s, sched_batch *b, pd_err *err)
{
    memset(b, 0, sizeof *b);
    sched_slot *sl = NULL;
    uint32_t slot_i = 0;
    for (uint32_t i = 0; i < s->n_slots && !sl; i++)
        if (!s->slots[i].busy) {
            sl = &s->slots[i];
            slot_i = i;
        }
    if (!sl)
        return PD_OK;
    const uint32_t R = s->cfg.rows_per_batch && s->cfg.rows_per_batch < s->cfg.max_rows ? s->cfg.rows_per_batch
                                                                                         : s->cfg.max_rows;
    /* with several micro-batches in flight each carries its share of the
     * streams, so the batches in flight cost about the same and every stage
     * stays busy */
    const uint32_t member_cap = (s->cfg.max_streams + s->n_slots - 1) / s->n_slots;
    uint32_t nr = 0, nl = 0, na = 0;
    sl->n_members = 0;
    sl->seq = s->seq;

    /* decode rows: the last sampled token of decoding streams, drafts
     * behind them as verify rows */
    pd_status rc = form_decode_rows(s, sl, R, member_cap, &nr, &nl, err);
    if (rc)
        return rc;
    /* prefill chunks of admitted streams, then of pages admitted now: a page
     * is admitted when its first rows fit, so its stages allocate its state
     * in the micro-batch that first uses it */
    for (uint32_t i = 0; i < s->cfg.max_streams && nr < R && sl->n_members < member_cap; i++) {
        stream_state *st = stream_table_at(s->streams, i);
        if (!st || s->ss[i].in_flight || st->fed >= st->prefill_rows)
            continue;
        if ((rc = add_prefill(s, sl, i, R - nr, &nr, &nl, &na, err)))
            return rc;
    }
    while (nr < R && sl->n_members < member_cap) {
        uint32_t i;
        if ((rc = admit_next(s, sl, &na, &i, err)))
            return rc;
        if (i == UINT32_MAX)
            break;
        if ((rc = add_prefill(s, sl, i, R - nr, &nr, &nl, &na, err)))
            return rc;
    }
    /* retirements decided since the last batch ride on this header, those of
     * pages that failed while it was formed included */
    memcpy(sl->retire, s->pending_retire, s->n_pending_retire * sizeof *sl->retire);
    uint32_t n_retire = s->n_pending_retire;
    s->n_pending_retire = 0;
    if (nr == 0 && na == 0 && n_retire == 0)
        return PD_OK;
    sl->busy = true;
    s->inflight++;
    *b = (sched_batch){.seq = s->seq++,
                       .slot = slot_i,
                       .n_admit = na,
                       .admit = sl->admit,
                       .n_retire = n_retire,
                       .retire = sl->retire,
                       .n_rows = nr,
                       .rows = sl->rows,
                       .x = sl->x,
                       .n_logits = nl};
    return PD_OK;
}

/* Asynchronous speculation, after member m's tokens were taken: its
 * stream's batch still in flight (if any) was built assuming all of this
 * batch's drafts accepted and its first guess being this batch's last
 * token; it stays good only if both hold, else it is stale (the tail
 * rejects it, and a new decode row may go out before it returns). */
static void chain_advance(sched *s, const sched_slot *sl, uint32_t m, const uint32_t *tokens, uint32_t n_logits,
                          bool stale)
{
    uint32_t i = sl->members[m].slot;
    slot_state *q = &s->ss[i];
    stream_state *st = member_stream(s, sl, m);
    if (!st || q->in_flight == 0) {
        if (st)
            q->chain_n = q->chain_y = 0;
        return;
    }
    if (stale || q->fl_state == FL_STALE)
        return; /* the batch in flight was formed from the sampled tokens */
    uint32_t ok = 0, rows = 0;
    for (uint32_t l = 0; l < n_logits; l++)
        if (sl->logit_member[l] == m) {
            rows++;
            ok += tokens[l] != MSG_TOKEN_REJECTED;
        }
    uint32_t *chain = s->chain + (size_t)i * SCHED_CHAIN_CAP, y = q->chain_y;
    bool holds = ok == rows && y < q->chain_n && chain[y] == st->tokens[st->n_tokens - 1];
    if (!holds) {
        q->fl_state = FL_STALE;
        q->stale_seq = q->fl_seq;
        q->chain_n = q->chain_y = 0;
        return;
    }
    /* the newest batch's first guess is now a sampled token */
    memmove(chain, chain + y + 1, (q->chain_n - y - 1) * sizeof *chain);
    q->chain_n -= y + 1;
    q->chain_y = 0;
}

pd_status sched_complete(sched *s, const sched_batch *b, const uint32_t *tokens, const uint64_t *row_digests,
                         pd_err *err)
{
    sched_slot *sl = &s->slots[b->slot];
    CHECK(sl->busy);
    pd_status rc = PD_OK;
    bool stale[sl->n_members ? sl->n_members : 1];
    for (uint32_t m = 0; m < sl->n_members; m++) {
        uint32_t i = sl->members[m].slot;
        stale[m] = false;
        if (!member_stream(s, sl, m))
            continue; /* finished since; the slot may be another stream's */
        s->ss[i].in_flight--;
        stale[m] = s->ss[i].stale_seq == sl->seq;
        if (stale[m])
            s->ss[i].stale_seq = UINT64_MAX;
    }
    spec_account(s, sl, b, tokens, stale);
    for (uint32_t l = 0; l < b->n_logits; l++) {
        uint32_t m = sl->logit_member[l];
        stream_state *st = member_stream(s, sl, m);
        if (!st)
            continue;
        uint32_t t = tokens[l];
        if (t == MSG_TOKEN_REJECTED)
            continue; /* a rejected draft's row: nothing was sampled there */
        CHECKF(!stale[m], "stream %llu: the tail sampled a row of a stale batch", (unsigned long long)st->id);
        s->prog.tokens_generated++;
        pd_status r2 = stream_push(st, t, row_digests[l], err);
        if (r2 == PD_OK && t == s->eos)
            r2 = stream_finish(s, st, SCHED_STOP_EOS, true, NULL, err);
        else if (r2 == PD_OK && st->n_tokens >= st->max_new)
            r2 = stream_finish(s, st, SCHED_STOP_LENGTH, true, NULL, err);
        if (r2 && rc == PD_OK)
            rc = r2;
    }
    if (s->cfg.spec_async)
        for (uint32_t m = 0; m < sl->n_members; m++)
            if (sl->members[m].sent || sl->members[m].chain)
                chain_advance(s, sl, m, tokens, b->n_logits, stale[m]);
    sl->busy = false;
    s->inflight--;
    return rc;
}

stream_table *sched_streams(sched *s)
{
    return s->streams;
}

uint64_t sched_next_id(const sched *s)
{
    return s->next_id;
}

pd_status sched_restore(sched *s, stream_state *restored, uint32_t n, uint64_t next_id, pd_err *err)
{
    CHECK(s->seq == 0);
    size_t n_pages = pages_count(s->cfg.pg);
    for (uint32_t i = 0; i < n; i++) {
        if (restored[i].page >= n_pages)
            return pd_err_set(err, PD_ERR_FORMAT, "restored stream %llu names page %llu of %zu",
                              (unsigned long long)restored[i].id, (unsigned long long)restored[i].page, n_pages);
        s->taken[restored[i].page] = true;
        s->prog.prefill_rows += restored[i].prefill_rows;
        s->prog.tokens_generated += restored[i].n_tokens;
        uint32_t slot;
        pd_status st = stream_table_put(s->streams, &restored[i], &slot, err);
        if (st)
            return st;
        spec_start(s, slot);
        if (s->cfg.admit) {
            char why[512];
            stream_state *rs = stream_table_at(s->streams, slot);
            /* the budget counts them too; a restored stream always runs */
            if (s->cfg.admit(s->cfg.admit_ctx, (size_t)rs->page, rs->prefill_rows, rs->max_new, why, sizeof why) ==
                SCHED_ADMIT_OK)
                s->ss[slot].reserved = true;
        }
    }
    s->next_id = next_id;
    return PD_OK;
}

void sched_set_admit(sched *s, sched_admit_fn admit, sched_release_fn release, void *ctx)
{
    CHECK(s->seq == 0);
    s->cfg.admit = admit;
    s->cfg.release = release;
    s->cfg.admit_ctx = ctx;
}

bool sched_finished(const sched *s)
{
    if (s->inflight || s->n_pending_retire)
        return false;
    if (stream_table_count(s->streams))
        return false;
    size_t n = pages_count(s->cfg.pg);
    for (size_t p = s->next_page; p < n; p++)
        if ((!s->cfg.skip || !s->cfg.skip[p]) && !s->taken[p])
            return false;
    return true;
}

void sched_get_progress(const sched *s, sched_progress *out)
{
    *out = s->prog;
    out->streams_alive = stream_table_count(s->streams);
}
