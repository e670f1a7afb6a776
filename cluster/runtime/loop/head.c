/* head: the manifest, the scheduler's loop, results and the output file on
 * rank 0 (contract in head.h). */
#include "cluster/runtime/loop/head.h"
#include "cluster/runtime/loop/pageimg.h"

#include "base/check.h"
#include "base/file.h"
#include "cluster/runtime/rank/signals.h"

#include <errno.h>
#include <sys/stat.h>
#include "cluster/format/outfile.h"
#include "cluster/format/tokenizer.h"
#include "cluster/format/vocab.h"

#include <stdio.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A finished page waiting for its turn in manifest order. */
typedef struct head_pending {
    size_t page;
    uint32_t *tokens;
    uint32_t n_tokens;
    uint64_t prefill_rows;
    sched_stop stop;
    uint64_t digest;
    char *error;              /* SCHED_STOP_ERROR: owned message */
} head_pending;

struct head {
    rank *r;                  /* borrowed */
    pages *pg;
    vocab *vb;
    outfile *of;
    sched *sc;
    drafter *dr;              /* --draft model: the draft model, else NULL */
    pageimg *img;             /* --mmproj: image pages' encoder, else NULL */
    budget *bud;              /* NULL: no admission budget */
    bool *skip;               /* [pages] already in the output file */
    head_pending *pending;
    size_t n_pending, cap_pending, next_write;
    sched_batch *inflight;    /* [n_inflight] by sched slot */
    uint32_t n_inflight;
    uint64_t formed;          /* micro-batches formed (= the next one's seq) */
    uint64_t asked;           /* the step want_drain was last asked about */
    uint32_t drains;          /* drain points held */
    uint64_t resume_seq;      /* checkpoint resumed (0 = none) */
    uint64_t ckpt_newest;     /* highest checkpoint number in --checkpoint-dir */
    double t_start, t_progress;
};

/* ---- start-up ----------------------------------------------------------- */

static pd_status head_vocab(head *h, pd_err *err)
{
    const model_hparams *hp = &h->r->hp;
    uint32_t V = hp->vocab;
    const char **toks = calloc(V, sizeof *toks);
    uint32_t *lens = calloc(V, sizeof *lens);
    int32_t *types = calloc(V, sizeof *types);
    pd_status st = (toks && lens && types) ? PD_OK : pd_err_set(err, PD_ERR_NOMEM, "vocab: out of memory");
    for (uint32_t i = 0; st == PD_OK && i < V; i++) {
        size_t len;
        st = model_token(h->r->m, i, &toks[i], &len, err);
        lens[i] = (uint32_t)len;
        types[i] = model_token_type(h->r->m, i);
    }
    if (st == PD_OK) {
        vocab_desc d = {.model = hp->vocab_kind == MODEL_VOCAB_LLAMA ? "llama" : "gpt2",
                        .n_tokens = V,
                        .tokens = toks,
                        .token_lens = lens,
                        .types = types,
                        .bos = (int32_t)hp->bos,
                        .eos = (int32_t)hp->eos,
                        .special = h->r->o->special};
        st = vocab_new(&d, &h->vb, err);
    }
    free(toks);
    free(lens);
    free(types);
    return st;
}

static pd_status head_on_done(void *ctx, const sched_result *r, pd_err *err);

/* No output may land on an input or on another output: --stats naming the
 * output replaced the results, naming the model overwrote it, and --out
 * naming the manifest "skipped" every page. Checked before any output is
 * opened, so a refused run touches nothing. */
static pd_status head_check_paths(const head *h, pd_err *err)
{
    const run_opts *o = h->r->o;
    struct {
        const char *flag, *path;
    } outs[] = {{"--out", o->out_path}, {"--stats", o->stats_path}, {"--trace-hidden", o->trace_path}};
    enum { N_OUT = sizeof outs / sizeof outs[0] };
    for (int i = 0; i < N_OUT; i++) {
        if (!outs[i].path)
            continue;
        if (pd_file_same(outs[i].path, o->model_path))
            return pd_err_set(err, PD_ERR_ARG, "%s %s is the model file (--model %s): refusing to overwrite it",
                              outs[i].flag, outs[i].path, o->model_path);
        if (o->draft.mode == DRAFT_MODEL && pd_file_same(outs[i].path, o->draft.path))
            return pd_err_set(err, PD_ERR_ARG, "%s %s is the draft model (--draft model:%s): refusing to overwrite it",
                              outs[i].flag, outs[i].path, o->draft.path);
        if (pd_file_same(outs[i].path, o->pages_path))
            return pd_err_set(err, PD_ERR_ARG, "%s %s is the page manifest (--pages %s): refusing to overwrite it",
                              outs[i].flag, outs[i].path, o->pages_path);
        for (int j = 0; j < i; j++)
            if (outs[j].path && pd_file_same(outs[i].path, outs[j].path))
                return pd_err_set(err, PD_ERR_ARG, "%s and %s name the same file %s: each output needs its own",
                                  outs[j].flag, outs[i].flag, outs[i].path);
        for (size_t p = 0; p < pages_count(h->pg); p++) {
            const pages_page *pg = pages_get(h->pg, p);
            for (uint32_t k = 0; k < pg->n_segs; k++)
                if (pg->segs[k].path && pd_file_same(outs[i].path, pg->segs[k].path))
                    return pd_err_set(err, PD_ERR_ARG,
                                      "%s %s is page \"%s\"'s embeddings file: refusing to overwrite it",
                                      outs[i].flag, outs[i].path, pg->id);
        }
    }
    return PD_OK;
}

/* Image segments need the vision encoder; a run decodes rows, so a manifest
 * with images is refused before anything decodes, saying what to do. */
static pd_status head_no_images(const head *h, pd_err *err)
{
    for (size_t p = 0; p < pages_count(h->pg); p++) {
        const pages_page *pg = pages_get(h->pg, p);
        for (uint32_t k = 0; k < pg->n_segs; k++)
            if (pg->segs[k].kind == PAGES_SEG_IMAGE)
                return pd_err_set(err, PD_ERR_UNSUPPORTED,
                                  "%s:%" PRIu32 ": page \"%s\": prefill[%" PRIu32 "].image: %s: "
                                  "image pages need the vision encoder: run --mmproj MM, or "
                                  "pipedec encode --mmproj MM --model M --pages %s --out DIR first "
                                  "and run DIR/pages.jsonl",
                                  h->r->o->pages_path, pg->line, pg->id, k, pg->segs[k].file,
                                  h->r->o->pages_path);
    }
    return PD_OK;
}

pd_status head_open(rank *r, pageimg *img, head_resume_fn resume, head **out, pd_err *err)
{
    head *h = calloc(1, sizeof *h);
    if (!h)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    *out = h;
    h->r = r;
    h->n_inflight = r->sz.n_inflight;
    const run_opts *o = r->o;
    pd_status st;
    tok_pages tc = {.gguf = model_gguf(r->m)};
    pages_opts po = {.tokenize = tok_pages_encode, .tokenize_ctx = &tc};
    if (img) {
        if ((st = pageimg_reserve(img, r->sz.max_streams, err)))
            return st;
        h->img = img;
        po.image_rows = pageimg_count;
        po.image_ctx = img;
    }
    st = pages_load(o->pages_path, r->hp.vocab, r->hp.hidden, &po, &h->pg, err);
    tok_pages_free(&tc);
    if (st)
        return st;
    if (!h->img && (st = head_no_images(h, err)))
        return st;
    if ((st = head_vocab(h, err)))
        return st;
    if ((st = head_check_paths(h, err)))
        return st;
    if (o->checkpoint_dir && resume &&
        (st = resume(o, r->m, r->hp.n_layers, &h->resume_seq, &h->ckpt_newest, err)))
        return st;
    if (o->draft.mode == DRAFT_MODEL) {
        /* a draft model of another vocabulary is refused before any output */
        drafter_config dc = {.path = o->draft.path,
                             .target = r->m,
                             .max_streams = r->sz.max_streams,
                             .max_rows = r->sz.max_rows,
                             .max_k = o->draft.k,
                             .backend = o->backend,
                             .pool = r->pool};
        if ((st = drafter_open(&dc, &h->dr, err)))
            return st;
    }
    if ((st = outfile_open(o->out_path, &h->of, err)))
        return st;
    size_t n = pages_count(h->pg);
    h->skip = calloc(n ? n : 1, sizeof *h->skip);
    h->inflight = calloc(h->n_inflight, sizeof *h->inflight);
    if (!h->skip || !h->inflight)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n; i++)
        h->skip[i] = outfile_has(h->of, pages_get(h->pg, i)->id);
    if (h->img && (st = pageimg_plan(h->img, h->pg, h->skip, err)))
        return st;
    sched_config cfg = {.pg = h->pg,
                        .m = r->m,
                        .max_streams = r->sz.max_streams,
                        .prefill_chunk = r->sz.prefill_chunk,
                        .max_rows = r->sz.max_rows,
                        .rows_per_batch = r->sz.rows_per_batch,
                        .skip = h->skip,
                        .past_context = o->past_context,
                        .draft = o->draft,
                        .drafter = h->dr,
                        .spec_async = o->policy.spec_async,
                        .on_done = head_on_done,
                        .on_done_ctx = h,
                        .image = h->img ? pageimg_read : NULL,
                        .image_ctx = h->img,
                        .ready = h->img ? pageimg_ready : NULL};
    return sched_new(&cfg, h->n_inflight, &h->sc, err);
}

void head_free(head *h)
{
    if (!h)
        return;
    for (size_t i = 0; i < h->n_pending; i++) {
        free(h->pending[i].tokens);
        free(h->pending[i].error);
    }
    free(h->pending);
    free(h->inflight);
    free(h->skip);
    sched_free(h->sc);
    drafter_free(h->dr);
    budget_free(h->bud);
    outfile_free(h->of);
    vocab_free(h->vb);
    pages_free(h->pg);
    free(h);
}

const pages *head_pages(const head *h)
{
    return h->pg;
}

sched *head_sched(head *h)
{
    return h->sc;
}

uint64_t head_out_size(const head *h)
{
    return outfile_size(h->of);
}

uint64_t head_resume_seq(const head *h, uint64_t *newest)
{
    *newest = h->ckpt_newest;
    return h->resume_seq;
}

pd_status head_restored(head *h, pd_err *err)
{
    if (!h->img)
        return PD_OK;
    size_t n = pages_count(h->pg);
    bool *skip = malloc(n ? n * sizeof *skip : 1);
    if (!skip)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    memcpy(skip, h->skip, n * sizeof *skip);
    stream_table *t = sched_streams(h->sc);
    for (uint32_t i = 0; i < stream_table_capacity(t); i++) {
        const stream_state *s = stream_table_at(t, i);
        if (s && s->page < n && s->fed >= s->prefill_rows)
            skip[s->page] = true;
    }
    pd_status st = pageimg_plan(h->img, h->pg, skip, err);
    free(skip);
    return st;
}


void head_use_budget(head *h, budget *b)
{
    budget_free(h->bud);
    h->bud = b;
    sched_set_admit(h->sc, budget_admit, budget_release, b);
}

const budget *head_budget(const head *h)
{
    return h->bud;
}

budget *head_budget_rw(head *h)
{
    return h->bud;
}

/* ---- output --------------------------------------------------------------- */

static pd_status head_write_one(head *h, const head_pending *p, pd_err *err)
{
    if (p->stop == SCHED_STOP_ERROR) {
        const char *id = pages_get(h->pg, p->page)->id;
        fprintf(stderr, "pipedec: page \"%s\" failed and was skipped (a rerun retries it): %s\n", id, p->error);
        outfile_page pg = {.id = id, .error = p->error};
        return outfile_write_page(h->of, &pg, err);
    }
    char *text = NULL;
    size_t tlen = 0;
    pd_status st = vocab_detok(h->vb, (const int32_t *)p->tokens, p->n_tokens, &text, &tlen, err);
    if (st)
        return st;
    outfile_page pg = {.id = pages_get(h->pg, p->page)->id,
                       .tokens = (const int32_t *)p->tokens,
                       .n_tokens = p->n_tokens,
                       .text = text,
                       .text_len = tlen,
                       .prefill_rows = p->prefill_rows,
                       .generated = p->n_tokens,
                       .stop = p->stop == SCHED_STOP_EOS ? OUTFILE_STOP_EOS : OUTFILE_STOP_LENGTH,
                       .has_digest = h->r->o->digest,
                       .digest = p->digest};
    st = outfile_write_page(h->of, &pg, err);
    free(text);
    return st;
}

/* Finished pages are written in manifest order, so out.jsonl is the same
 * bytes whatever the batch size, rank count or completion order. */
static pd_status head_on_done(void *ctx, const sched_result *r, pd_err *err)
{
    head *h = ctx;
    if (h->n_pending == h->cap_pending) {
        size_t nc = h->cap_pending ? 2 * h->cap_pending : 16;
        head_pending *np = realloc(h->pending, nc * sizeof *np);
        if (!np)
            return pd_err_set(err, PD_ERR_NOMEM, "out of memory holding finished pages");
        h->pending = np;
        h->cap_pending = nc;
    }
    head_pending *p = &h->pending[h->n_pending];
    p->tokens = malloc(((size_t)r->n_tokens + 1) * sizeof *p->tokens);
    p->error = r->error ? strdup(r->error) : NULL;
    if (!p->tokens || (r->error && !p->error)) {
        free(p->tokens);
        free(p->error);
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory holding finished pages");
    }
    memcpy(p->tokens, r->tokens, (size_t)r->n_tokens * sizeof *p->tokens);
    p->page = r->page;
    p->n_tokens = r->n_tokens;
    p->prefill_rows = r->prefill_rows;
    p->stop = r->stop;
    p->digest = r->digest;
    h->n_pending++;
    /* write every page that is next in manifest order */
    size_t n_pages = pages_count(h->pg);
    for (;;) {
        while (h->next_write < n_pages && h->skip[h->next_write])
            h->next_write++;
        size_t i = 0;
        while (i < h->n_pending && h->pending[i].page != h->next_write)
            i++;
        if (i == h->n_pending)
            return PD_OK;
        head_pending done = h->pending[i];
        h->pending[i] = h->pending[--h->n_pending];
        pd_status st = head_write_one(h, &done, err);
        free(done.tokens);
        free(done.error);
        if (st)
            return st;
        h->next_write++;
    }
}

void head_progress(const head *h, sched_progress *out)
{
    sched_get_progress(h->sc, out);
    out->images_encoded = pageimg_encoded(h->img);
    out->images_counted = pageimg_counted(h->img);
    out->images_wait_s = pageimg_wait_s(h->img, &out->images_waits);
    out->images_head_s = pageimg_encoded_head(h->img, &out->images_head);
    if (h->dr) {
        drafter_stats ds;
        drafter_get_stats(h->dr, &ds);
        out->draft_rows = ds.rows;
        out->draft_proposals = ds.proposals;
    }
}

void head_progress_line(head *h, bool final)
{
    if (!(h->r->o->progress || isatty(2)))
        return;
    double t = MPI_Wtime();
    if (!final && t - h->t_progress < 1.0)
        return;
    h->t_progress = t;
    sched_progress pr;
    sched_get_progress(h->sc, &pr);
    double el = t - h->t_start;
    double tps = el > 0 ? (double)pr.tokens_generated / el : 0.0;
    uint64_t todo = pr.pages_total - pr.pages_skipped;
    double eta = pr.pages_done > 0 ? el / (double)pr.pages_done * (double)(todo - pr.pages_done) : 0.0;
    fprintf(stderr, "%spipedec: %llu/%llu pages, %llu tokens, %.1f tokens/s, ETA %.0f s%s",
            isatty(2) ? "\r" : "", (unsigned long long)pr.pages_done, (unsigned long long)todo,
            (unsigned long long)pr.tokens_generated, tps, eta, (final || !isatty(2)) ? "\n" : "");
    fflush(stderr);
}

/* ---- the loop --------------------------------------------------------------- */

static pd_status head_send_batch(head *h, const sched_batch *b, pd_err *err)
{
    rank *r = h->r;
    uint8_t *buf;
    uint32_t slot;
    pd_status st = xport_sendbuf(r->x, &buf, &slot, err);
    if (st)
        return st;
    msg_batch m = {.seq = b->seq,
                   .dtype = r->o->wire_dtype,
                   .hidden = r->hp.hidden,
                   .n_admit = b->n_admit,
                   .n_retire = b->n_retire,
                   .n_rows = b->n_rows,
                   .admit = (mb_admit *)b->admit,
                   .retire = (uint64_t *)b->retire,
                   .rows = (mb_row *)b->rows,
                   .x = b->x};
    size_t len;
    if ((st = msg_encode_batch(&m, buf, xport_send_cap(r->x), &len, err)))
        return st;
    return xport_send(r->x, xport_peers_get(r->x)->next, slot, len, err);
}

/* Takes the results of one in-flight micro-batch back from the tail. */
static pd_status head_take_results(head *h, uint32_t *flags_out, pd_err *err)
{
    rank *r = h->r;
    const uint8_t *buf;
    size_t len;
    pool_park(r->pool); /* the pool's threads sleep while the results come */
    pd_status st = xport_recv(r->x, xport_peers_get(r->x)->tail, &buf, &len, err);
    if (st)
        return st;
    msg_limits lim = {.max_tokens = r->sz.max_logits, .hidden = r->hp.hidden};
    uint64_t seq;
    uint32_t nt, flags;
    if ((st = msg_decode_results(buf, len, &lim, &seq, &flags, r->tokens, r->digests, &nt, err)))
        return st;
    sig_note(flags); /* a signal another rank received */
    *flags_out = flags;
    sched_batch *done = NULL;
    for (uint32_t s = 0; s < h->n_inflight; s++)
        if (h->inflight[s].seq == seq &&
            (h->inflight[s].n_rows || h->inflight[s].n_admit || h->inflight[s].n_retire))
            done = &h->inflight[s];
    if (!done || nt != done->n_logits)
        return pd_err_set(err, PD_ERR_FORMAT, "results for micro-batch %llu do not match what was sent",
                          (unsigned long long)seq);
    sched_batch copy = *done;
    memset(done, 0, sizeof *done);
    return sched_complete(h->sc, &copy, r->tokens, r->digests, err);
}

/* With nothing in flight: tells every stage, runs the action here, and has
 * every rank agree it succeeded before the pipeline resumes. */
static pd_status head_drain(head *h, const run_hooks *hk, uint32_t action, pd_err *err)
{
    rank *r = h->r;
    const xport_peers *pe = xport_peers_get(r->x);
    pd_status st = PD_OK;
    if (pe->next >= 0) {
        uint8_t *buf;
        uint32_t slot;
        size_t len;
        st = xport_sendbuf(r->x, &buf, &slot, err);
        if (st == PD_OK)
            st = msg_encode_drain(h->formed, action, h->drains, buf, xport_send_cap(r->x), &len, err);
        if (st == PD_OK)
            st = xport_send(r->x, pe->next, slot, len, err);
        if (st)
            return st;
    }
    run_drain d = {.step = h->formed, .action = action, .number = h->drains, .rank = r->rank, .size = r->size,
                   .comm = pipe_comm(r->p)};
    st = hk->at_drain ? hk->at_drain(hk->ctx, &d, err) : PD_OK;
    pd_err ae = {0};
    pd_status all = pipe_agree(r->p, st, &ae);
    if (st)
        return st;
    if (all)
        return pd_err_set(err, all, "drain point %u (action %u) failed on another rank", h->drains, action);
    h->drains++;
    return PD_OK;
}

pd_status head_loop(head *h, const run_hooks *hooks, pd_err *err)
{
    static const run_hooks none = {0};
    const run_hooks *hk = hooks ? hooks : &none;
    rank *r = h->r;
    bool alone = r->size == 1;
    uint32_t inflight = 0, drain_action = 0;
    pd_status st;
    h->t_start = MPI_Wtime();
    h->asked = UINT64_MAX;
    for (;;) {
        if (h->img && (st = pageimg_pump(h->img, err)))
            return st;
        if (!drain_action && hk->want_drain && inflight < h->n_inflight && h->asked != h->formed &&
            !sched_finished(h->sc)) {
            h->asked = h->formed;
            drain_action = hk->want_drain(hk->ctx, h->formed);
        }
        if (drain_action && inflight == 0) {
            if ((st = head_drain(h, hk, drain_action, err)))
                return st;
            drain_action = 0;
            if (hk->stop_after_drain && hk->stop_after_drain(hk->ctx))
                break;
            continue;
        }
        sched_batch b;
        memset(&b, 0, sizeof b);
        if (!drain_action && inflight < h->n_inflight && (st = sched_next(h->sc, &b, err)))
            return st;
        if (b.n_rows || b.n_admit || b.n_retire) {
            h->formed++;
            if ((st = rank_lifecycle(r, b.admit, b.n_admit, b.retire, b.n_retire, err)) ||
                (st = rank_forward(r, b.rows, b.n_rows, b.x, err)))
                return st;
            if (alone) {
                uint32_t nt = 0;
                if ((st = rank_sample(r, b.rows, b.n_rows, b.x, &nt, err)))
                    return st;
                CHECK(nt == b.n_logits);
                if ((st = sched_complete(h->sc, &b, r->tokens, r->digests, err)))
                    return st;
            } else {
                if ((st = head_send_batch(h, &b, err)))
                    return st;
                h->inflight[b.slot] = b;
                inflight++;
            }
            uint32_t add;
            if (hk->progress && (st = hk->progress(hk->ctx, 0, &add, err)))
                return st;
            head_progress_line(h, false);
            continue;
        }
        if (inflight == 0) {
            CHECK(sched_finished(h->sc));
            break;
        }
        CHECK(inflight > 0);
        /* wait for the oldest results from the tail */
        uint32_t flags = 0, add;
        if ((st = head_take_results(h, &flags, err)))
            return st;
        inflight--;
        if (hk->progress && (st = hk->progress(hk->ctx, flags | RUN_SEEN_RESULTS, &add, err)))
            return st;
        head_progress_line(h, false);
    }
    if (h->img && (st = pageimg_finish(h->img, err)))
        return st;
    if (!alone) {
        uint8_t *buf;
        uint32_t slot;
        size_t len;
        if ((st = xport_sendbuf(r->x, &buf, &slot, err)) ||
            (st = msg_encode_stop(0, buf, xport_send_cap(r->x), &len, err)) ||
            (st = xport_send(r->x, xport_peers_get(r->x)->next, slot, len, err)))
            return st;
    }
    return PD_OK;
}

uint32_t head_drains(const head *h)
{
    return h->drains;
}
