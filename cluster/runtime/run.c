/* run: start-up, the pipeline loop of every rank, and the report. */
#include "cluster/runtime/run.h"

#include "cache/arena.h"
#include "base/check.h"
#include "base/cpu.h"
#include "cache/numa.h"
#include "cluster/runtime/digest.h"
#include "cluster/runtime/layermap.h"
#include "cluster/model/model.h"
#include "cluster/format/outfile.h"
#include "cluster/format/pages.h"
#include "cluster/model/pool.h"
#include "cluster/runtime/sched.h"
#include "cluster/runtime/stage.h"
#include "cluster/runtime/tail.h"
#include "cluster/format/vocab.h"
#include "comm/pipe.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define RUN_WHOLE_PREFILL_ROWS 1024u
#define RUN_LINE 768
#define RUN_CACHE_RETAIN ((size_t)512 << 20) /* freed cache bytes kept per rank */

void run_opts_default(run_opts *o)
{
    *o = (run_opts){.batch = 8, .threads = 1, .seed = 0, .backend = GEMM_BACKEND_INVARIANT,
                    .wire_dtype = MSG_DTYPE_F32};
    policy_default(&o->policy);
    o->sample = (sample_params){.mode = SAMPLE_GREEDY, .temperature = 1.0f, .top_p = 1.0f};
    o->ngram = (sample_ngram){.n = 0};
}

/* Per-rank counters; sent to rank 0 at the end as an array of doubles. */
typedef struct run_stats {
    double busy, wait_in, wait_send, wall;
    double msgs, bytes, batches, rows;
    double cache_peak, attn_peak;
} run_stats;
#define RUN_STATS_N 10

typedef struct run_ctx {
    const run_opts *o;
    pipe_link *p;
    int rank, size;
    int local_rank, local_size; /* among the ranks on this node */
    bool head, tailr;
    layermap lm;
    model_hparams hp;
    numa_topo *topo;
    numa_choice nc;
    arena *ar;
    model *m;
    pool *pool;
    stage *st;
    tail *tl;
    uint32_t max_rows, max_streams, max_logits, rows_per_batch;
    uint32_t n_inflight; /* micro-batches the head keeps in flight */
    /* head */
    pages *pg;
    outfile *of;
    vocab *vb;
    sched *sc;
    bool *skip;
    struct run_pending *pending;
    size_t n_pending, cap_pending, next_write;
    /* messaging */
    uint8_t **sbuf;
    MPI_Request *sreq;
    uint32_t n_sbuf, next_sbuf;
    size_t scap;
    /* receive buffers of rcap bytes, sized after start-up to the largest
     * message any rank may send; the head receives into rbuf[0], a follower
     * keeps a receive posted on each so the next micro-batch arrives while
     * this one is computed */
    uint8_t *rbuf[2];
    size_t rcap;
    MPI_Request rreq[2];
    msg_batch in;
    sched_batch *inflight; /* by sched slot */
    uint32_t *tokens;
    uint64_t *digests; /* [max_logits] logits row digests beside tokens */
    /* --trace-hidden: this rank's trace file and the page key of each
     * stream this rank holds (streams[i] -> keys[i], n_keys used) */
    FILE *trace;
    uint64_t *trace_streams, *trace_keys;
    uint32_t n_trace;
    run_stats stats;
    double t_start, t_progress;
    char place_line[RUN_LINE];
    char place_json[RUN_LINE];
} run_ctx;

static double now(void)
{
    return MPI_Wtime();
}

/* After start-up nothing can be agreed on any more: print and end the job. */
static _Noreturn void run_fatal(run_ctx *c, const pd_err *e)
{
    fprintf(stderr, "pipedec: rank %d: %s: %s\n", c->rank, pd_status_str(e->status), e->msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

/* ---- output (head) ------------------------------------------------------ */

/* Finished pages are written in manifest order, so out.jsonl is the same
 * bytes whatever the batch size, rank count or completion order. Pages are
 * admitted in manifest order, so at most `batch` finished pages wait here. */
typedef struct run_pending {
    size_t page;
    uint32_t *tokens;
    uint32_t n_tokens;
    uint64_t prefill_rows;
    sched_stop stop;
    uint64_t digest;
} run_pending;

static pd_status run_write_one(run_ctx *c, const run_pending *r, pd_err *err)
{
    char *text = NULL;
    size_t tlen = 0;
    pd_status st = vocab_detok(c->vb, (const int32_t *)r->tokens, r->n_tokens, &text, &tlen, err);
    if (st)
        return st;
    outfile_page pg = {.id = pages_get(c->pg, r->page)->id,
                       .tokens = (const int32_t *)r->tokens,
                       .n_tokens = r->n_tokens,
                       .text = text,
                       .text_len = tlen,
                       .prefill_rows = r->prefill_rows,
                       .generated = r->n_tokens,
                       .stop = r->stop == SCHED_STOP_EOS ? OUTFILE_STOP_EOS : OUTFILE_STOP_LENGTH,
                       .has_digest = c->o->digest,
                       .digest = r->digest};
    st = outfile_write_page(c->of, &pg, err);
    free(text);
    return st;
}

static pd_status run_on_done(void *ctx, const sched_result *r, pd_err *err)
{
    run_ctx *c = ctx;
    if (c->n_pending == c->cap_pending) {
        size_t nc = c->cap_pending ? 2 * c->cap_pending : 16;
        run_pending *np = realloc(c->pending, nc * sizeof *np);
        if (!np)
            return pd_err_set(err, PD_ERR_NOMEM, "out of memory holding finished pages");
        c->pending = np;
        c->cap_pending = nc;
    }
    run_pending *p = &c->pending[c->n_pending];
    p->tokens = malloc(((size_t)r->n_tokens + 1) * sizeof *p->tokens);
    if (!p->tokens)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory holding finished pages");
    memcpy(p->tokens, r->tokens, (size_t)r->n_tokens * sizeof *p->tokens);
    p->page = r->page;
    p->n_tokens = r->n_tokens;
    p->prefill_rows = r->prefill_rows;
    p->stop = r->stop;
    p->digest = r->digest;
    c->n_pending++;
    /* write every page that is next in manifest order */
    size_t n_pages = pages_count(c->pg);
    for (;;) {
        while (c->next_write < n_pages && c->skip[c->next_write])
            c->next_write++;
        size_t i = 0;
        while (i < c->n_pending && c->pending[i].page != c->next_write)
            i++;
        if (i == c->n_pending)
            return PD_OK;
        run_pending done = c->pending[i];
        c->pending[i] = c->pending[--c->n_pending];
        pd_status st = run_write_one(c, &done, err);
        free(done.tokens);
        if (st)
            return st;
        c->next_write++;
    }
}

static void run_progress(run_ctx *c, bool final)
{
    if (!c->head || !(c->o->progress || isatty(2)))
        return;
    double t = now();
    if (!final && t - c->t_progress < 1.0)
        return;
    c->t_progress = t;
    sched_progress pr;
    sched_get_progress(c->sc, &pr);
    double el = t - c->t_start;
    double tps = el > 0 ? (double)pr.tokens_generated / el : 0.0;
    uint64_t todo = pr.pages_total - pr.pages_skipped;
    double eta = pr.pages_done > 0 ? el / (double)pr.pages_done * (double)(todo - pr.pages_done) : 0.0;
    fprintf(stderr, "%spipedec: %llu/%llu pages, %llu tokens, %.1f tokens/s, ETA %.0f s%s",
            isatty(2) ? "\r" : "", (unsigned long long)pr.pages_done, (unsigned long long)todo,
            (unsigned long long)pr.tokens_generated, tps, eta, (final || !isatty(2)) ? "\n" : "");
    fflush(stderr);
}

/* Lets MPI progress the outstanding sends while this rank computes. */
static void run_mpi_progress(void *ctx)
{
    run_ctx *c = ctx;
    int done = 0;
    MPI_Testall((int)c->n_sbuf, c->sreq, &done, MPI_STATUSES_IGNORE);
}

/* ---- --trace-hidden ------------------------------------------------------ */

/* Trace file, text, one line per record (docs/digests.md):
 *   # pipedec trace-hidden 1 rank R of N
 *   p KEY ID            (rank 0: every page of the manifest, KEY = its page key)
 *   t KEY POS B HASH    (a residual row of page KEY at position POS entering
 *                        layer B, i.e. after layer B-1; B = layers: the last
 *                        layer's output; HASH = digest_f32 of the row)
 * Keys and hashes are 16 hex digits. scripts/trace_diff.py merges the ranks'
 * files of two runs and prints the first difference. */
static void run_trace_rows(void *ctx, uint32_t boundary, const mb_row *rows, uint32_t n, const float *x)
{
    run_ctx *c = ctx;
    uint32_t H = c->hp.hidden;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t key = 0;
        for (uint32_t k = 0; k < c->n_trace; k++)
            if (c->trace_streams[k] == rows[i].stream)
                key = c->trace_keys[k];
        fprintf(c->trace, "t %016llx %llu %u %016llx\n", (unsigned long long)key,
                (unsigned long long)rows[i].pos, boundary, (unsigned long long)digest_f32(x + (size_t)i * H, H));
    }
}

static pd_status run_trace_open(run_ctx *c, pd_err *err)
{
    char path[4096];
    if (c->rank == 0)
        snprintf(path, sizeof path, "%s", c->o->trace_path);
    else
        snprintf(path, sizeof path, "%s.%d", c->o->trace_path, c->rank);
    c->trace_streams = calloc(c->max_streams, sizeof *c->trace_streams);
    c->trace_keys = calloc(c->max_streams, sizeof *c->trace_keys);
    if (!c->trace_streams || !c->trace_keys)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory for the hidden-state trace");
    if (!(c->trace = fopen(path, "w")))
        return pd_err_set(err, PD_ERR_IO, "--trace-hidden: cannot create %s: %s", path, strerror(errno));
    fprintf(c->trace, "# pipedec trace-hidden 1 rank %d of %d\n", c->rank, c->size);
    for (size_t i = 0; c->head && i < pages_count(c->pg); i++) {
        const char *id = pages_get(c->pg, i)->id;
        fprintf(c->trace, "p %016llx %s\n", (unsigned long long)sample_page_key(id), id);
    }
    return PD_OK;
}

/* Records which page a stream admitted on this rank belongs to (and forgets
 * retired streams), so trace lines name pages, not run-local stream ids. */
static void run_trace_lifecycle(run_ctx *c, const mb_admit *admit, uint32_t na, const uint64_t *retire,
                                uint32_t nr)
{
    for (uint32_t i = 0; i < nr; i++)
        for (uint32_t k = 0; k < c->n_trace; k++)
            if (c->trace_streams[k] == retire[i]) {
                c->trace_streams[k] = c->trace_streams[c->n_trace - 1];
                c->trace_keys[k] = c->trace_keys[--c->n_trace];
                break;
            }
    for (uint32_t i = 0; i < na && c->n_trace < c->max_streams; i++) {
        c->trace_streams[c->n_trace] = admit[i].stream;
        c->trace_keys[c->n_trace++] = admit[i].sample_key;
    }
}

/* ---- start-up ----------------------------------------------------------- */

static pd_status run_vocab(run_ctx *c, pd_err *err)
{
    uint32_t V = c->hp.vocab;
    const char **toks = calloc(V, sizeof *toks);
    uint32_t *lens = calloc(V, sizeof *lens);
    int32_t *types = calloc(V, sizeof *types);
    pd_status st = (toks && lens && types) ? PD_OK : pd_err_set(err, PD_ERR_NOMEM, "vocab: out of memory");
    for (uint32_t i = 0; st == PD_OK && i < V; i++) {
        size_t len;
        st = model_token(c->m, i, &toks[i], &len, err);
        lens[i] = (uint32_t)len;
        types[i] = model_token_type(c->m, i);
    }
    if (st == PD_OK) {
        vocab_desc d = {.model = c->hp.vocab_kind == MODEL_VOCAB_LLAMA ? "llama" : "gpt2",
                        .n_tokens = V,
                        .tokens = toks,
                        .token_lens = lens,
                        .types = types,
                        .bos = (int32_t)c->hp.bos,
                        .eos = (int32_t)c->hp.eos};
        st = vocab_new(&d, &c->vb, err);
    }
    free(toks);
    free(lens);
    free(types);
    return st;
}

static pd_status run_startup(run_ctx *c, pd_err *err)
{
    const run_opts *o = c->o;
    pd_status st = model_read_hparams(o->model_path, &c->hp, err);
    if (st)
        return st;
    if (o->layers)
        st = layermap_parse(o->layers, (uint32_t)c->size, c->hp.n_layers, &c->lm, err);
    else {
        uint64_t layer_cost = 4ull * ((uint64_t)c->hp.hidden * c->hp.hidden * 2 +
                                      2ull * c->hp.hidden * c->hp.n_kv_heads * c->hp.head_dim +
                                      3ull * c->hp.hidden * c->hp.ffn);
        uint64_t tail_cost = 4ull * c->hp.hidden * c->hp.vocab;
        st = layermap_balance((uint32_t)c->size, c->hp.n_layers, layer_cost, tail_cost, &c->lm, err);
    }
    if (st)
        return st;

    /* NUMA: bind by node-local rank, place weights and caches there */
    if ((st = numa_topo_load(&c->topo, err)))
        return st;
    if ((st = numa_place(c->topo, (unsigned)c->local_rank, (unsigned)c->local_size, o->no_bind ? NUMA_NO_BIND : 0, &c->nc, err)))
        return st;
    if ((st = arena_new(c->topo, c->nc.node, 0, &c->ar, err)))
        return st;
    /* a retired stream's cache memory is kept for the next admission: no page
     * faults and no munmap on the decode path */
    arena_set_retain(c->ar, RUN_CACHE_RETAIN);
    if ((st = pool_new(o->threads, &c->pool, err)))
        return st;

    model_load_opts mo = {.first_layer = c->lm.first[c->rank],
                          .n_layers = c->lm.count[c->rank],
                          .want_embed = c->head,
                          .want_output = c->tailr,
                          .backend = o->backend,
                          .alloc = arena_alloc_iface(c->ar)};
    if ((st = model_load(o->model_path, &mo, &c->m, err)))
        return st;

    uint32_t chunk = o->prefill_chunk ? o->prefill_chunk : RUN_WHOLE_PREFILL_ROWS;
    /* one micro-batch per stage, plus one so the head computes the next
     * while a result travels back (with one rank: one) */
    c->n_inflight = c->size == 1 ? 1 : (uint32_t)c->size + 1;
    c->max_streams = o->batch;
    c->max_rows = o->batch * (1 + o->policy.max_drafts) + chunk;
    c->max_logits = o->batch * (1 + o->policy.max_drafts);
    /* a micro-batch's share of the streams' rows, plus one prefill chunk */
    c->rows_per_batch = (o->batch + c->n_inflight - 1) / c->n_inflight * (1 + o->policy.max_drafts) + chunk;
    stage_config sc = {.m = c->m,
                       .policy = o->policy,
                       .max_rows = c->max_rows,
                       .max_streams = c->max_streams,
                       .pool = c->pool,
                       .cache_alloc = arena_alloc_iface(c->ar),
                       .round_f16 = o->wire_dtype == MSG_DTYPE_F16,
                       .progress = c->size > 1 ? run_mpi_progress : NULL,
                       .progress_ctx = c,
                       .trace = o->trace_path ? run_trace_rows : NULL,
                       .trace_ctx = c};
    if ((st = stage_new(&sc, &c->st, err)))
        return st;
    if (c->tailr) {
        tail_config tc = {.m = c->m,
                          .sample = o->sample,
                          .ngram = o->ngram,
                          .seed = o->seed,
                          .max_streams = c->max_streams,
                          .max_rows = c->max_logits,
                          .pool = c->pool};
        if ((st = tail_new(&tc, &c->tl, err)))
            return st;
    }
    if (c->head) {
        if ((st = pages_load(o->pages_path, c->hp.vocab, c->hp.hidden, NULL, &c->pg, err)))
            return st;
        if ((st = run_vocab(c, err)))
            return st;
        if ((st = outfile_open(o->out_path, &c->of, err)))
            return st;
        size_t n = pages_count(c->pg);
        c->skip = calloc(n ? n : 1, sizeof *c->skip);
        if (!c->skip)
            return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
        for (size_t i = 0; i < n; i++)
            c->skip[i] = outfile_has(c->of, pages_get(c->pg, i)->id);
        sched_config cfg = {.pg = c->pg,
                            .m = c->m,
                            .max_streams = c->max_streams,
                            .prefill_chunk = chunk,
                            .max_rows = c->max_rows,
                            .rows_per_batch = c->rows_per_batch,
                            .skip = c->skip,
                            .on_done = run_on_done,
                            .on_done_ctx = c};
        if ((st = sched_new(&cfg, c->n_inflight, &c->sc, err)))
            return st;
        c->inflight = calloc(c->n_inflight, sizeof *c->inflight);
        if (!c->inflight)
            return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    }
    /* message buffers */
    msg_batch worst = {.dtype = o->wire_dtype,
                       .hidden = c->hp.hidden,
                       .n_admit = c->max_streams,
                       .n_retire = c->max_streams,
                       .n_rows = c->max_rows};
    size_t batch_bytes = msg_batch_bytes(&worst);
    if (batch_bytes < msg_batch_bytes(&(msg_batch){.hidden = c->hp.hidden, .n_rows = c->max_rows}))
        batch_bytes = msg_batch_bytes(&(msg_batch){.hidden = c->hp.hidden, .n_rows = c->max_rows});
    size_t res_bytes = msg_results_bytes(c->max_logits);
    c->scap = batch_bytes > res_bytes ? batch_bytes : res_bytes;
    c->n_sbuf = c->n_inflight + 1;
    c->sbuf = calloc(c->n_sbuf, sizeof *c->sbuf);
    c->sreq = calloc(c->n_sbuf, sizeof *c->sreq);
    c->rreq[0] = c->rreq[1] = MPI_REQUEST_NULL;
    c->in = (msg_batch){.admit = calloc(c->max_streams, sizeof(mb_admit)),
                        .retire = calloc(c->max_streams, sizeof(uint64_t)),
                        .rows = calloc(c->max_rows, sizeof(mb_row)),
                        .x = malloc((size_t)c->max_rows * c->hp.hidden * sizeof(float))};
    c->tokens = calloc(c->max_logits ? c->max_logits : 1, sizeof *c->tokens);
    c->digests = calloc(c->max_logits ? c->max_logits : 1, sizeof *c->digests);
    if (!c->sbuf || !c->sreq || !c->in.admit || !c->in.retire || !c->in.rows || !c->in.x || !c->tokens ||
        !c->digests)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory for message buffers");
    for (uint32_t i = 0; i < c->n_sbuf; i++) {
        c->sbuf[i] = malloc(c->scap);
        c->sreq[i] = MPI_REQUEST_NULL;
        if (!c->sbuf[i])
            return pd_err_set(err, PD_ERR_NOMEM, "out of memory for message buffers");
    }
    if (o->trace_path && (st = run_trace_open(c, err)))
        return st;
    return PD_OK;
}

static void run_teardown(run_ctx *c)
{
    for (uint32_t i = 0; c->sbuf && i < c->n_sbuf; i++)
        free(c->sbuf[i]);
    free(c->sbuf);
    free(c->sreq);
    free(c->rbuf[0]);
    free(c->rbuf[1]);
    free(c->in.admit);
    free(c->in.retire);
    free(c->in.rows);
    free(c->in.x);
    free(c->tokens);
    free(c->digests);
    if (c->trace && fclose(c->trace) != 0)
        fprintf(stderr, "pipedec: rank %d: --trace-hidden: writing the trace failed: %s\n", c->rank,
                strerror(errno));
    free(c->trace_streams);
    free(c->trace_keys);
    free(c->inflight);
    free(c->skip);
    for (size_t i = 0; i < c->n_pending; i++)
        free(c->pending[i].tokens);
    free(c->pending);
    sched_free(c->sc);
    outfile_free(c->of);
    vocab_free(c->vb);
    pages_free(c->pg);
    tail_free(c->tl);
    stage_free(c->st);
    model_free(c->m);
    pool_free(c->pool);
    arena_free(c->ar);
    numa_topo_free(c->topo);
}

/* ---- the loop ------------------------------------------------------------ */

/* Applies a header's retirements and admissions to this rank's stage / tail. */
static void run_lifecycle(run_ctx *c, const mb_admit *admit, uint32_t na, const uint64_t *retire, uint32_t nr)
{
    pd_err e = {0};
    if (c->trace)
        run_trace_lifecycle(c, admit, na, retire, nr);
    for (uint32_t i = 0; i < nr; i++) {
        stage_retire(c->st, retire[i]);
        if (c->tl)
            tail_retire(c->tl, retire[i]);
    }
    for (uint32_t i = 0; i < na; i++) {
        if (stage_admit(c->st, &admit[i], &e) != PD_OK)
            run_fatal(c, &e);
        if (c->tl && tail_admit(c->tl, &admit[i], &e) != PD_OK)
            run_fatal(c, &e);
    }
}

static void run_compute(run_ctx *c, const mb_row *rows, uint32_t n, float *x)
{
    pd_err e = {0};
    double t0 = now();
    if (stage_forward(c->st, rows, n, x, &e) != PD_OK)
        run_fatal(c, &e);
    c->stats.busy += now() - t0;
    c->stats.batches += 1;
    c->stats.rows += n;
    stage_mem sm;
    stage_memory(c->st, &sm);
    if ((double)sm.cache_bytes > c->stats.cache_peak)
        c->stats.cache_peak = (double)sm.cache_bytes;
    if ((double)sm.attention_bytes > c->stats.attn_peak)
        c->stats.attn_peak = (double)sm.attention_bytes;
}

/* A free send buffer (waits for the oldest send when all are in use). */
static uint8_t *run_sendbuf(run_ctx *c, uint32_t *idx)
{
    pd_err e = {0};
    uint32_t i = c->next_sbuf;
    c->next_sbuf = (c->next_sbuf + 1) % c->n_sbuf;
    if (pipe_wait(c->p, &c->sreq[i], &c->stats.wait_send, &e) != PD_OK)
        run_fatal(c, &e);
    *idx = i;
    return c->sbuf[i];
}

static void run_send(run_ctx *c, int dest, uint32_t idx, size_t len)
{
    pd_err e = {0};
    if (pipe_isend(c->p, dest, c->sbuf[idx], len, &c->sreq[idx], &e) != PD_OK)
        run_fatal(c, &e);
    c->stats.msgs += 1;
    c->stats.bytes += (double)len;
}

static void run_send_batch(run_ctx *c, int dest, uint64_t seq, const mb_admit *admit, uint32_t na,
                           const uint64_t *retire, uint32_t nt, const mb_row *rows, uint32_t nr, float *x)
{
    pd_err e = {0};
    uint32_t idx;
    uint8_t *buf = run_sendbuf(c, &idx);
    msg_batch b = {.seq = seq, .dtype = c->o->wire_dtype, .hidden = c->hp.hidden, .n_admit = na,
                   .n_retire = nt, .n_rows = nr, .admit = (mb_admit *)admit, .retire = (uint64_t *)retire,
                   .rows = (mb_row *)rows, .x = x};
    size_t len;
    if (msg_encode_batch(&b, buf, c->scap, &len, &e) != PD_OK)
        run_fatal(c, &e);
    run_send(c, dest, idx, len);
}

static void run_head(run_ctx *c)
{
    pd_err e = {0};
    uint32_t inflight = 0;
    for (;;) {
        sched_batch b;
        if (inflight < c->n_inflight) {
            if (sched_next(c->sc, &b, &e) != PD_OK)
                run_fatal(c, &e);
        } else {
            memset(&b, 0, sizeof b);
        }
        bool formed = b.n_rows || b.n_admit || b.n_retire;
        if (formed) {
            run_lifecycle(c, b.admit, b.n_admit, b.retire, b.n_retire);
            run_compute(c, b.rows, b.n_rows, b.x);
            if (c->size == 1) {
                uint32_t nt = 0;
                double t0 = now();
                if (tail_sample(c->tl, b.rows, b.n_rows, b.x, c->tokens, c->digests, &nt, &e) != PD_OK)
                    run_fatal(c, &e);
                c->stats.busy += now() - t0;
                CHECK(nt == b.n_logits);
                if (sched_complete(c->sc, &b, c->tokens, c->digests, &e) != PD_OK)
                    run_fatal(c, &e);
            } else {
                run_send_batch(c, 1, b.seq, b.admit, b.n_admit, b.retire, b.n_retire, b.rows, b.n_rows, b.x);
                c->inflight[b.slot] = b;
                inflight++;
            }
            run_progress(c, false);
            continue;
        }
        if (inflight == 0) {
            CHECK(sched_finished(c->sc));
            break;
        }
        /* wait for the oldest results from the tail */
        size_t len;
        int from;
        if (pipe_recv(c->p, c->size - 1, c->rbuf[0], c->rcap, &len, &from, &c->stats.wait_in, &e) != PD_OK)
            run_fatal(c, &e);
        msg_limits lim = {.max_tokens = c->max_logits, .hidden = c->hp.hidden};
        uint64_t seq;
        uint32_t nt;
        if (msg_decode_results(c->rbuf[0], len, &lim, &seq, c->tokens, c->digests, &nt, &e) != PD_OK)
            run_fatal(c, &e);
        sched_batch *done = NULL;
        for (uint32_t s = 0; s < c->n_inflight; s++)
            if (c->inflight[s].seq == seq && (c->inflight[s].n_rows || c->inflight[s].n_admit ||
                                              c->inflight[s].n_retire))
                done = &c->inflight[s];
        if (!done || nt != done->n_logits) {
            pd_err_set(&e, PD_ERR_FORMAT, "results for micro-batch %llu do not match what was sent",
                       (unsigned long long)seq);
            run_fatal(c, &e);
        }
        sched_batch copy = *done;
        memset(done, 0, sizeof *done);
        if (sched_complete(c->sc, &copy, c->tokens, c->digests, &e) != PD_OK)
            run_fatal(c, &e);
        inflight--;
        run_progress(c, false);
    }
    if (c->size > 1) {
        uint32_t idx;
        uint8_t *buf = run_sendbuf(c, &idx);
        size_t len;
        if (msg_encode_stop(0, buf, c->scap, &len, &e) != PD_OK)
            run_fatal(c, &e);
        run_send(c, 1, idx, len);
    }
}

static void run_follower(run_ctx *c)
{
    pd_err e = {0};
    for (int k = 0; k < 2; k++)
        if (pipe_irecv(c->p, c->rank - 1, c->rbuf[k], c->rcap, &c->rreq[k], &e) != PD_OK)
            run_fatal(c, &e);
    for (uint32_t next = 0;; next ^= 1) {
        size_t len;
        int from;
        if (pipe_wait_recv(c->p, &c->rreq[next], &len, &from, &c->stats.wait_in, &e) != PD_OK)
            run_fatal(c, &e);
        const uint8_t *in = c->rbuf[next];
        msg_kind kind;
        uint64_t seq;
        if (msg_peek(in, len, &kind, &seq, &e) != PD_OK)
            run_fatal(c, &e);
        if (kind == MSG_KIND_STOP) {
            /* nothing follows a stop: withdraw the other posted receive */
            if (pipe_cancel_recv(c->p, &c->rreq[next ^ 1], &e) != PD_OK)
                run_fatal(c, &e);
            if (!c->tailr) {
                uint32_t idx;
                uint8_t *buf = run_sendbuf(c, &idx);
                memcpy(buf, in, len);
                run_send(c, c->rank + 1, idx, len);
            }
            break;
        }
        msg_limits lim = {.max_admit = c->max_streams,
                          .max_retire = c->max_streams,
                          .max_rows = c->max_rows,
                          .hidden = c->hp.hidden};
        if (msg_decode_batch(in, len, &lim, &c->in, &e) != PD_OK)
            run_fatal(c, &e);
        /* decoded into c->in: the buffer takes the message after next */
        if (pipe_irecv(c->p, c->rank - 1, c->rbuf[next], c->rcap, &c->rreq[next], &e) != PD_OK)
            run_fatal(c, &e);
        msg_batch *b = &c->in;
        run_lifecycle(c, b->admit, b->n_admit, b->retire, b->n_retire);
        run_compute(c, b->rows, b->n_rows, b->x);
        if (c->tailr) {
            uint32_t nt = 0;
            double t0 = now();
            if (tail_sample(c->tl, b->rows, b->n_rows, b->x, c->tokens, c->digests, &nt, &e) != PD_OK)
                run_fatal(c, &e);
            c->stats.busy += now() - t0;
            uint32_t idx;
            uint8_t *buf = run_sendbuf(c, &idx);
            size_t rl;
            if (msg_encode_results(b->seq, c->tokens, c->digests, nt, buf, c->scap, &rl, &e) != PD_OK)
                run_fatal(c, &e);
            run_send(c, 0, idx, rl);
        } else {
            run_send_batch(c, c->rank + 1, b->seq, b->admit, b->n_admit, b->retire, b->n_retire, b->rows,
                           b->n_rows, b->x);
        }
    }
}

/* ---- report ------------------------------------------------------------- */

static void run_report(run_ctx *c, const char *all_lines, const double *all_stats)
{
    const run_opts *o = c->o;
    sched_progress pr;
    sched_get_progress(c->sc, &pr);
    double wall = c->stats.wall;
    double tps = wall > 0 ? (double)pr.tokens_generated / wall : 0.0;
    char pol[160];
    policy_describe(&o->policy, pol, sizeof pol);
    if (o->stats_path) {
        cJSON *j = cJSON_CreateObject();
        cJSON_AddNumberToObject(j, "ranks", c->size);
        cJSON_AddNumberToObject(j, "pages_total", (double)pr.pages_total);
        cJSON_AddNumberToObject(j, "pages_done", (double)pr.pages_done);
        cJSON_AddNumberToObject(j, "pages_skipped", (double)pr.pages_skipped);
        cJSON_AddNumberToObject(j, "tokens", (double)pr.tokens_generated);
        cJSON_AddNumberToObject(j, "prefill_rows", (double)pr.prefill_rows);
        cJSON_AddNumberToObject(j, "wall_s", wall);
        cJSON_AddNumberToObject(j, "tokens_per_s", tps);
        cJSON_AddStringToObject(j, "policy", pol);
        cJSON_AddStringToObject(j, "gemm", o->backend == GEMM_BACKEND_OPENBLAS ? "openblas" : "invariant");
        cJSON_AddStringToObject(j, "wire_dtype", o->wire_dtype == MSG_DTYPE_F16 ? "f16" : "f32");
        cJSON_AddNumberToObject(j, "threads", o->threads);
        cJSON_AddNumberToObject(j, "batch", o->batch);
        char lmap[512];
        layermap_format(&c->lm, lmap, sizeof lmap);
        cJSON_AddStringToObject(j, "layers", lmap);
        cJSON *stages = cJSON_AddArrayToObject(j, "stages");
        for (int r = 0; r < c->size; r++) {
            const double *s = all_stats + (size_t)r * RUN_STATS_N;
            const char *pj = all_lines + (size_t)r * 2 * RUN_LINE + RUN_LINE;
            cJSON *st = cJSON_CreateObject();
            cJSON_AddNumberToObject(st, "rank", r);
            char lr[64];
            snprintf(lr, sizeof lr, "%u-%u", c->lm.first[r], c->lm.first[r] + c->lm.count[r] - 1);
            cJSON_AddStringToObject(st, "layers", lr);
            cJSON_AddNumberToObject(st, "busy_s", s[0]);
            cJSON_AddNumberToObject(st, "wait_input_s", s[1]);
            cJSON_AddNumberToObject(st, "wait_send_s", s[2]);
            cJSON_AddNumberToObject(st, "messages_sent", s[4]);
            cJSON_AddNumberToObject(st, "bytes_sent", s[5]);
            cJSON_AddNumberToObject(st, "micro_batches", s[6]);
            cJSON_AddNumberToObject(st, "rows", s[7]);
            cJSON_AddNumberToObject(st, "cache_bytes_peak", s[8]);
            cJSON_AddNumberToObject(st, "attention_bytes_peak", s[9]);
            cJSON *pl = cJSON_Parse(pj);
            if (pl)
                cJSON_AddItemToObject(st, "placement", pl);
            cJSON_AddItemToArray(stages, st);
        }
        char *txt = cJSON_Print(j);
        FILE *f = fopen(o->stats_path, "w");
        if (!f || !txt || fputs(txt, f) < 0 || fputc('\n', f) < 0)
            fprintf(stderr, "pipedec: cannot write stats to %s\n", o->stats_path);
        if (f)
            fclose(f);
        free(txt);
        cJSON_Delete(j);
    }
    printf("pipedec: %llu pages decoded (%llu skipped as already done), %llu tokens in %.2f s = %.1f tokens/s "
           "over %d rank%s; output %s\n",
           (unsigned long long)pr.pages_done, (unsigned long long)pr.pages_skipped,
           (unsigned long long)pr.tokens_generated, wall, tps, c->size, c->size == 1 ? "" : "s", o->out_path);
    fflush(stdout);
}

int run_main(const run_opts *o, MPI_Comm world)
{
    run_ctx c = {.o = o};
    pd_err e = {0};
    pd_status st = pipe_open(world, &c.p, &e);
    if (st) {
        fprintf(stderr, "pipedec: %s\n", e.msg);
        return 1;
    }
    c.rank = pipe_rank(c.p);
    c.size = pipe_size(c.p);
    c.head = c.rank == 0;
    c.tailr = c.rank == c.size - 1;
    c.t_start = now();

    /* the only collectives before the agreement: every rank reaches them
     * whatever fails later in its own start-up. Every rank runs the kernels
     * of the ISA level all ranks support (DESIGN.md section 1); the paths
     * are bit-identical, so this is about one code path, not answers. */
    st = pipe_node_local(c.p, &c.local_rank, &c.local_size, &e);
    double neg_isa = -(double)pd_cpu_isa();
    if (st == PD_OK)
        st = pipe_max_double(c.p, neg_isa, &neg_isa, &e);
    if (st == PD_OK) {
        pd_cpu_set_isa((pd_isa)(int)-neg_isa);
        st = run_startup(&c, &e);
    }
    if (st)
        fprintf(stderr, "pipedec: rank %d: %s\n", c.rank, e.msg);
    pd_err ae = {0};
    pd_status all = pipe_agree(c.p, st, &ae);
    if (all != PD_OK) {
        if (c.rank == 0 && st == PD_OK)
            fprintf(stderr, "pipedec: start-up failed on another rank (see its message); nothing was decoded\n");
        run_teardown(&c);
        pipe_close(c.p);
        return 1;
    }

    /* placement report: every rank's line, printed by rank 0 in rank order */
    arena_verdict av = {0};
    pd_err ve = {0};
    arena_verify(c.ar, &av, &ve);
    arena_stats as;
    arena_stats_get(c.ar, &as);
    char lr[64];
    snprintf(lr, sizeof lr, "layers %u-%u", c.lm.first[c.rank], c.lm.first[c.rank] + c.lm.count[c.rank] - 1);
    numa_report_info ri = {.rank = c.rank, .bytes_placed = as.bytes_placed, .verified = av.verified,
                           .placement = arena_placement(c.ar)};
    char line[RUN_LINE - 96];
    char both[2 * RUN_LINE];
    memset(both, 0, sizeof both);
    numa_report_line(&c.nc, &ri, line, sizeof line, &ve);
    snprintf(both, RUN_LINE, "%s, %s", lr, line);
    numa_report_json(&c.nc, &ri, both + RUN_LINE, RUN_LINE, &ve);
    char *all_lines = c.rank == 0 ? calloc((size_t)c.size, sizeof both) : NULL;
    if (pipe_gather(c.p, both, sizeof both, all_lines, &e) != PD_OK)
        run_fatal(&c, &e);
    if (c.rank == 0) {
        char pol[160];
        policy_describe(&o->policy, pol, sizeof pol);
        printf("pipedec: %d rank%s, model %s (%u layers, hidden %u), %s, kernels %s on every rank\n", c.size,
               c.size == 1 ? "" : "s", o->model_path, c.hp.n_layers, c.hp.hidden, pol, pd_isa_name(pd_cpu_isa()));
        for (int r = 0; r < c.size; r++)
            printf("pipedec: placement: %s\n", all_lines + (size_t)r * sizeof both);
        fflush(stdout);
    }

    /* every receive buffer holds the largest message any rank may send (ranks
     * started with different options size theirs differently): a truncated
     * pre-posted receive is not safe in every MPI transport (pipe.h) */
    double most = (double)c.scap;
    if (pipe_max_double(c.p, most, &most, &e) != PD_OK)
        run_fatal(&c, &e);
    c.rcap = (size_t)most;
    for (int k = 0; k < 2; k++)
        if (!(c.rbuf[k] = malloc(c.rcap))) {
            pd_err_set(&e, PD_ERR_NOMEM, "out of memory for %zu-byte receive buffers", c.rcap);
            run_fatal(&c, &e);
        }

    c.t_start = now();
    if (c.head)
        run_head(&c);
    else
        run_follower(&c);
    for (uint32_t i = 0; i < c.n_sbuf; i++)
        if (pipe_wait(c.p, &c.sreq[i], &c.stats.wait_send, &e) != PD_OK)
            run_fatal(&c, &e);
    c.stats.wall = now() - c.t_start;
    if (c.head)
        run_progress(&c, true);

    double mine[RUN_STATS_N] = {c.stats.busy, c.stats.wait_in, c.stats.wait_send, c.stats.wall,
                                c.stats.msgs,  c.stats.bytes,   c.stats.batches,   c.stats.rows,
                                c.stats.cache_peak, c.stats.attn_peak};
    double *all_stats = c.rank == 0 ? calloc((size_t)c.size * RUN_STATS_N, sizeof(double)) : NULL;
    if (pipe_gather(c.p, mine, sizeof mine, all_stats, &e) != PD_OK)
        run_fatal(&c, &e);
    if (c.rank == 0)
        run_report(&c, all_lines, all_stats);
    free(all_lines);
    free(all_stats);
    run_teardown(&c);
    pipe_close(c.p);
    return 0;
}
