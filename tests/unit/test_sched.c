/* Tests for cluster/runtime/sched/sched.h: the tests play the pipeline (hold micro-batches
 * in flight, complete them in any order with made-up sampled tokens) while a
 * shadow of every page checks each micro-batch, each completion and each
 * finished-page callback against the contract in sched.h. Deterministic cases
 * pin single properties; a randomized driver checks all of them after every
 * step over many configurations. */
#define _XOPEN_SOURCE 700
#include "pd_test.h"

#include "cluster/runtime/pipeline/digest.h"
#include "cluster/cli/mkmodel.h"
#include "cluster/model/model.h"
#include "cluster/format/npy.h"
#include "cluster/format/pages.h"
#include "cluster/model/sample.h"
#include "cluster/runtime/sched/sched.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- fixture: one tiny model and a few embedding files, shared by every test
 * (an unchecked fixture runs once; forked tests inherit it). Each test writes
 * its own manifest to tmpdir/pages.jsonl. */

enum { N_EMB_FILES = 3 };
static const uint32_t emb_file_rows[N_EMB_FILES] = {1, 3, 5};

static char tmpdir[256];
static model *mdl;
static uint32_t V, H, EOS;

static void emb_file_path(uint32_t k, char *out, size_t cap)
{
    snprintf(out, cap, "%s/e%u.npy", tmpdir, k);
}

static void fixture_setup(void)
{
    pd_test_tmpdir(tmpdir, sizeof tmpdir, "sched");
    char path[300];
    snprintf(path, sizeof path, "%s/m.gguf", tmpdir);
    mkmodel_opts o;
    mkmodel_defaults(&o);
    o.layers = 1;
    o.hidden = 16;
    o.heads = 2;
    o.kv_heads = 1;
    o.ffn = 16;
    o.vocab = 300;
    o.seed = 3;
    pd_err e = {0};
    ck_assert_msg(mkmodel_write(&o, path, &e) == PD_OK, "%s", e.msg);
    model_load_opts lo = {.all_layers = 1, .want_embed = 1};
    ck_assert_msg(model_load(path, &lo, &mdl, &e) == PD_OK, "%s", e.msg);
    V = model_hp(mdl)->vocab;
    H = model_hp(mdl)->hidden;
    EOS = model_hp(mdl)->eos;
    ck_assert_uint_lt(EOS, V);
    /* file k holds rows whose value at (r, c) is 1000 (k + 1) + r + c / 100,
     * so a row read from the wrong file, row or column shows */
    for (uint32_t k = 0; k < N_EMB_FILES; k++) {
        float *v = malloc((size_t)emb_file_rows[k] * H * sizeof *v);
        ck_assert_ptr_nonnull(v);
        for (uint32_t r = 0; r < emb_file_rows[k]; r++)
            for (uint32_t c = 0; c < H; c++)
                v[(size_t)r * H + c] = 1000.0f * (float)(k + 1) + (float)r + (float)c / 100.0f;
        emb_file_path(k, path, sizeof path);
        ck_assert_msg(npy_write_f32(path, emb_file_rows[k], H, v, &e) == PD_OK, "%s", e.msg);
        free(v);
    }
}

static void fixture_teardown(void)
{
    model_free(mdl);
    mdl = NULL;
    pd_test_rmtree(tmpdir);
}

/* Writes text as the manifest and loads it. */
static pages *manifest_load(const char *text)
{
    char path[300];
    snprintf(path, sizeof path, "%s/pages.jsonl", tmpdir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
    pages *pg = NULL;
    pd_err e = {0};
    ck_assert_msg(pages_load(path, V, H, NULL, &pg, &e) == PD_OK, "%s", e.msg);
    return pg;
}

/* A growing manifest text. */
typedef struct text_buf {
    char *text;
    size_t len, cap;
} text_buf;

static void text_put(text_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_put(text_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(b->text + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    ck_assert(n >= 0 && (size_t)n < b->cap - b->len);
    b->len += (size_t)n;
}

/* n pages of `prefill` prompt tokens each, all asking for max_new tokens. */
static pages *manifest_uniform(size_t n, uint32_t prefill, uint32_t max_new)
{
    text_buf b = {.cap = 64 + n * (96 + prefill * 8)};
    b.text = malloc(b.cap);
    ck_assert_ptr_nonnull(b.text);
    b.text[0] = 0;
    for (size_t i = 0; i < n; i++) {
        text_put(&b, "{\"id\":\"u%zu\",\"prefill\":[{\"tokens\":[", i);
        for (uint32_t j = 0; j < prefill; j++)
            text_put(&b, "%s%u", j ? "," : "", (uint32_t)(10 + i + j));
        text_put(&b, "]}],\"max_new_tokens\":%u}\n", max_new);
    }
    pages *pg = manifest_load(b.text);
    free(b.text);
    return pg;
}

/* A manifest of n pages with random segments (tokens or one of the embedding
 * files), random prefill lengths and random max_new_tokens, some of them 0. */
static pages *manifest_random(pd_rng *r, size_t n)
{
    text_buf b = {.cap = 256 + n * 512};
    b.text = malloc(b.cap);
    ck_assert_ptr_nonnull(b.text);
    b.text[0] = 0;
    for (size_t i = 0; i < n; i++) {
        text_put(&b, "{\"id\":\"p%zu\",\"prefill\":[", i);
        uint32_t n_segs = 1 + pd_rng_below(r, 3);
        for (uint32_t k = 0; k < n_segs; k++) {
            if (pd_rng_below(r, 3) == 0) {
                text_put(&b, "%s{\"embeddings\":\"e%u.npy\"}", k ? "," : "", pd_rng_below(r, N_EMB_FILES));
                continue;
            }
            text_put(&b, "%s{\"tokens\":[", k ? "," : "");
            uint32_t n_tok = 1 + pd_rng_below(r, 9);
            for (uint32_t j = 0; j < n_tok; j++)
                text_put(&b, "%s%u", j ? "," : "", pd_rng_below(r, V));
            text_put(&b, "]}");
        }
        uint32_t max_new = pd_rng_below(r, 7) == 0 ? 0 : 1 + pd_rng_below(r, 8);
        text_put(&b, "],\"max_new_tokens\":%u}\n", max_new);
    }
    pages *pg = manifest_load(b.text);
    free(b.text);
    ck_assert_uint_eq(pages_count(pg), n);
    return pg;
}

/* ---- the harness: a shadow of every page, and the micro-batches in flight */

/* Fails the test with where the harness is: the run's seed and the next
 * micro-batch number. (A passing ck_assert costs a pipe write in fork mode;
 * these checks run thousands of times per test.) */
#define EXPECT(h, cond, ...)                                                                          \
    do {                                                                                             \
        if (!(cond)) {                                                                               \
            char what_[768];                                                                         \
            snprintf(what_, sizeof what_, __VA_ARGS__);                                              \
            ck_abort_msg("seed %llu, micro-batch %llu: %s (%s)", (unsigned long long)(h)->seed,      \
                         (unsigned long long)(h)->next_seq, what_, #cond);                           \
        }                                                                                            \
    } while (0)

/* What the scheduler must have done with one page.
 * INV: fed <= prefill_rows; n_tok <= max_new; retired implies admitted and ended. */
typedef struct track {
    const pages_page *pg;
    bool skip;
    bool admitted;
    uint64_t stream;      /* its stream id once admitted */
    uint64_t admit_seq;   /* the micro-batch that admitted it */
    uint64_t fed;         /* prefill rows sent */
    uint32_t *tok;        /* [max_new] tokens fed back, EOS excluded */
    uint32_t n_tok;
    uint64_t digest;      /* digest_chain of the row digests fed back, in order */
    bool ended;           /* EOS or max_new tokens fed back (or max_new 0 and on_done came) */
    sched_stop stop;
    bool in_flight;       /* in an outstanding micro-batch */
    uint64_t stamp;       /* seq + 1 of the last micro-batch it appeared in */
    bool retired;         /* its retirement rode on a header */
    uint32_t n_done;      /* on_done calls */
    bool order_due;       /* finished without admission; manifest order not checked yet */
} track;

/* A micro-batch the test holds "in the pipeline", with the tokens it will
 * feed back for the batch's logits rows. */
typedef struct flight {
    sched_batch b;
    uint32_t *tokens; /* [max_rows] */
} flight;

typedef struct harness {
    uint64_t seed;
    sched_config cfg;
    uint32_t K;           /* max_inflight */
    const pages *pg;
    sched *s;
    track *t;             /* [n] */
    size_t n;
    bool *skip;           /* [n] or NULL */
    flight *fl;           /* [K] outstanding, oldest first */
    uint32_t n_fl;
    pd_rng rng;
    uint32_t eos_per_mille; /* chance that a sampled token is EOS */
    uint64_t next_seq;
    bool any_admit;
    size_t last_admit_page;
    uint64_t last_stream;
    uint32_t alive;       /* admitted and not yet retired on a header (what the stages hold) */
    uint32_t last_streams; /* distinct streams in the last micro-batch formed */
    float *want;          /* [hidden] scratch */
    pd_status done_status; /* what on_done returns */
} harness;

static pd_status h_on_done(void *ctx, const sched_result *r, pd_err *err);

/* Builds the harness and its sched. skip (borrowed) may be NULL. */
static void h_init(harness *h, const pages *pg, uint32_t K, uint32_t max_streams, uint32_t max_rows,
                   uint32_t rows_per_batch, uint32_t chunk, bool *skip, uint64_t seed)
{
    memset(h, 0, sizeof *h);
    h->seed = seed;
    h->rng.s = seed * 7919u + 1u;
    h->pg = pg;
    h->K = K;
    h->n = pages_count(pg);
    h->skip = skip;
    h->cfg = (sched_config){.pg = pg,
                            .m = mdl,
                            .max_streams = max_streams,
                            .prefill_chunk = chunk,
                            .max_rows = max_rows,
                            .rows_per_batch = rows_per_batch,
                            .skip = skip,
                            .on_done = h_on_done,
                            .on_done_ctx = h};
    h->t = calloc(h->n ? h->n : 1, sizeof *h->t);
    h->fl = calloc(K, sizeof *h->fl);
    h->want = malloc(H * sizeof *h->want);
    ck_assert(h->t && h->fl && h->want);
    for (size_t i = 0; i < h->n; i++) {
        track *t = &h->t[i];
        t->pg = pages_get(pg, i);
        t->digest = DIGEST_CHAIN_INIT;
        t->skip = skip && skip[i];
        t->tok = malloc((t->pg->max_new_tokens + 1) * sizeof *t->tok);
        ck_assert_ptr_nonnull(t->tok);
    }
    for (uint32_t k = 0; k < K; k++) {
        h->fl[k].tokens = malloc(max_rows * sizeof *h->fl[k].tokens);
        ck_assert_ptr_nonnull(h->fl[k].tokens);
    }
    pd_err e = {0};
    ck_assert_msg(sched_new(&h->cfg, K, &h->s, &e) == PD_OK, "%s", e.msg);
}

static void h_free(harness *h)
{
    sched_free(h->s);
    for (size_t i = 0; i < h->n; i++)
        free(h->t[i].tok);
    for (uint32_t k = 0; k < h->K; k++)
        free(h->fl[k].tokens);
    free(h->t);
    free(h->fl);
    free(h->want);
}

static track *h_by_stream(harness *h, uint64_t stream)
{
    for (size_t i = 0; i < h->n; i++)
        if (h->t[i].admitted && h->t[i].stream == stream)
            return &h->t[i];
    return NULL;
}

/* Every page before `page` in the manifest is skipped, admitted or finished
 * without admission: pages are taken in manifest order. */
static void h_expect_taken_before(harness *h, size_t page)
{
    for (size_t i = 0; i < page; i++) {
        const track *t = &h->t[i];
        EXPECT(h, t->skip || t->admitted || t->n_done == 1, "page %zu taken before page %zu", page, i);
    }
}

static pd_status h_on_done(void *ctx, const sched_result *r, pd_err *err)
{
    harness *h = ctx;
    EXPECT(h, r->page < h->n, "on_done for page %zu of %zu", r->page, h->n);
    track *t = &h->t[r->page];
    EXPECT(h, !t->skip, "on_done for skipped page %zu", r->page);
    EXPECT(h, t->n_done == 0, "second on_done for page %zu", r->page);
    EXPECT(h, r->id && strcmp(r->id, t->pg->id) == 0, "on_done id of page %zu", r->page);
    EXPECT(h, r->prefill_rows == t->pg->prefill_rows, "on_done prefill_rows of page %zu", r->page);
    if (!t->admitted) {
        /* a page that asks for no tokens finishes when its turn comes,
         * without a stream */
        EXPECT(h, t->pg->max_new_tokens == 0, "page %zu finished without admission", r->page);
        t->order_due = true; /* checked once this micro-batch's admissions are known */
        t->ended = true;
        t->stop = SCHED_STOP_LENGTH;
    }
    EXPECT(h, t->ended, "on_done for page %zu, which has %u of %u tokens and no EOS", r->page, t->n_tok,
           t->pg->max_new_tokens);
    EXPECT(h, r->stop == t->stop, "page %zu stop %d, want %d", r->page, (int)r->stop, (int)t->stop);
    EXPECT(h, r->n_tokens == t->n_tok, "page %zu has %u tokens, want %u", r->page, r->n_tokens, t->n_tok);
    EXPECT(h, t->n_tok == 0 || memcmp(r->tokens, t->tok, t->n_tok * sizeof *t->tok) == 0,
           "page %zu tokens differ from those fed back", r->page);
    EXPECT(h, r->digest == t->digest, "page %zu digest %016llx, want the chain of its rows %016llx", r->page,
           (unsigned long long)r->digest, (unsigned long long)t->digest);
    t->n_done++;
    if (h->done_status)
        return pd_err_set(err, h->done_status, "test: on_done refuses page %s", r->id);
    return PD_OK;
}

/* The hidden state prefill row `pos` of page `page` must carry. */
static void h_want_prefill_row(harness *h, size_t page, uint64_t pos)
{
    const pages_page *pg = h->t[page].pg;
    uint64_t seg0 = 0;
    for (uint32_t k = 0; k < pg->n_segs; k++) {
        const pages_seg *sg = &pg->segs[k];
        if (pos < seg0 + sg->rows) {
            uint32_t off = (uint32_t)(pos - seg0);
            if (sg->kind == PAGES_SEG_TOKENS) {
                uint32_t tok = (uint32_t)sg->tokens[off];
                model_embed(mdl, &tok, 1, h->want);
            } else {
                pd_err e = {0};
                EXPECT(h, pages_embed_read(h->pg, page, k, off, 1, h->want, &e) == PD_OK, "%s", e.msg);
            }
            return;
        }
        seg0 += sg->rows;
    }
    ck_abort_msg("page %zu has no prefill row %llu", page, (unsigned long long)pos);
}

/* Checks the retirements, admissions and rows of a micro-batch just formed
 * and records them in the shadow. */
static void h_check_batch(harness *h, const sched_batch *b)
{
    const sched_config *c = &h->cfg;
    EXPECT(h, b->seq == h->next_seq, "seq %llu", (unsigned long long)b->seq);
    EXPECT(h, b->slot < h->K, "slot %u of %u", b->slot, h->K);
    for (uint32_t k = 0; k < h->n_fl; k++)
        EXPECT(h, h->fl[k].b.slot != b->slot, "slot %u is already in flight", b->slot);

    /* retirements: admitted streams that finished, each once, and all of
     * those finished since the last header */
    for (uint32_t k = 0; k < b->n_retire; k++) {
        track *t = h_by_stream(h, b->retire[k]);
        EXPECT(h, t, "retires unknown stream %llu", (unsigned long long)b->retire[k]);
        EXPECT(h, t->ended && t->n_done == 1, "retires stream %llu before it finished",
               (unsigned long long)b->retire[k]);
        EXPECT(h, !t->retired, "retires stream %llu twice", (unsigned long long)b->retire[k]);
        t->retired = true;
        h->alive--;
    }
    for (size_t i = 0; i < h->n; i++)
        EXPECT(h, !(h->t[i].admitted && h->t[i].n_done && !h->t[i].retired),
               "page %zu finished but its retirement is not on this header", i);

    /* admissions: in manifest order, increasing stream ids, never more
     * streams alive than max_streams */
    for (uint32_t k = 0; k < b->n_admit; k++) {
        const mb_admit *a = &b->admit[k];
        size_t p = h->any_admit ? h->last_admit_page + 1 : 0;
        while (p < h->n && (h->t[p].skip || h->t[p].n_done))
            p++;
        EXPECT(h, p < h->n, "admits stream %llu with no page left", (unsigned long long)a->stream);
        track *t = &h->t[p];
        h_expect_taken_before(h, p);
        EXPECT(h, t->pg->max_new_tokens > 0, "admits page %zu, which asks for no tokens", p);
        EXPECT(h, !h->any_admit || a->stream > h->last_stream, "stream id %llu after %llu",
               (unsigned long long)a->stream, (unsigned long long)h->last_stream);
        EXPECT(h, !h_by_stream(h, a->stream), "stream id %llu reused", (unsigned long long)a->stream);
        EXPECT(h, a->prefill_rows == t->pg->prefill_rows && a->max_new == t->pg->max_new_tokens,
               "admission of page %zu: prefill %u max_new %u", p, a->prefill_rows, a->max_new);
        EXPECT(h, a->sample_key == sample_page_key(t->pg->id), "sample key of page %zu", p);
        t->admitted = true;
        t->stream = a->stream;
        t->admit_seq = b->seq;
        h->any_admit = true;
        h->last_admit_page = p;
        h->last_stream = a->stream;
        h->alive++;
        EXPECT(h, h->alive <= c->max_streams, "%u streams alive, max %u", h->alive, c->max_streams);
    }

    /* rows: the budget, decode rows first, each stream in one run of rows and
     * in no other micro-batch in flight, prefill in order and in chunks */
    uint32_t budget = c->rows_per_batch && c->rows_per_batch < c->max_rows ? c->rows_per_batch : c->max_rows;
    EXPECT(h, b->n_rows <= budget, "%u rows, budget %u", b->n_rows, budget);
    uint32_t n_streams = 0, n_logits = 0, run = 0;
    bool seen_prefill = false;
    track *cur = NULL;
    for (uint32_t r = 0; r < b->n_rows; r++) {
        const mb_row *row = &b->rows[r];
        track *t = h_by_stream(h, row->stream);
        EXPECT(h, t, "row %u: unknown stream %llu", r, (unsigned long long)row->stream);
        EXPECT(h, !t->ended && !t->retired, "row %u: stream %llu has finished", r,
               (unsigned long long)row->stream);
        if (t != cur) {
            EXPECT(h, t->stamp != b->seq + 1, "row %u: stream %llu has two runs of rows", r,
                   (unsigned long long)row->stream);
            EXPECT(h, !t->in_flight, "row %u: stream %llu is in another micro-batch in flight", r,
                   (unsigned long long)row->stream);
            t->stamp = b->seq + 1;
            t->in_flight = true;
            cur = t;
            run = 0;
            n_streams++;
        }
        run++;
        size_t page = (size_t)(t - h->t);
        n_logits += row->wants_logits != 0;
        if (row->role == MB_ROLE_DECODE) {
            EXPECT(h, !seen_prefill, "row %u: decode row after a prefill row", r);
            EXPECT(h, run == 1, "row %u: second decode row of stream %llu", r, (unsigned long long)row->stream);
            EXPECT(h, t->fed == t->pg->prefill_rows && t->n_tok >= 1, "row %u: decode row of page %zu before "
                   "its first token", r, page);
            EXPECT(h, row->pos == t->pg->prefill_rows + t->n_tok - 1, "row %u: decode pos %llu of page %zu", r,
                   (unsigned long long)row->pos, page);
            EXPECT(h, row->wants_logits, "row %u: decode row without logits", r);
            model_embed(mdl, &t->tok[t->n_tok - 1], 1, h->want);
        } else {
            EXPECT(h, row->role == MB_ROLE_PREFILL, "row %u: role %u", r, row->role);
            seen_prefill = true;
            EXPECT(h, t->fed < t->pg->prefill_rows, "row %u: page %zu's prefill was all sent", r, page);
            EXPECT(h, row->pos == t->fed, "row %u: prefill pos %llu of page %zu, want %llu", r,
                   (unsigned long long)row->pos, page, (unsigned long long)t->fed);
            EXPECT(h, row->pos != 0 || t->admit_seq == b->seq, "row %u: page %zu's first prefill row "
                   "and its admission are in different micro-batches", r, page);
            EXPECT(h, !!row->wants_logits == (row->pos + 1 == t->pg->prefill_rows),
                   "row %u: wants_logits %u at prefill pos %llu of %llu", r, row->wants_logits,
                   (unsigned long long)row->pos, (unsigned long long)t->pg->prefill_rows);
            EXPECT(h, c->prefill_chunk == 0 || run <= c->prefill_chunk, "row %u: prefill chunk of %u rows",
                   r, run);
            h_want_prefill_row(h, page, row->pos);
            t->fed++;
        }
        EXPECT(h, memcmp(b->x + (size_t)r * H, h->want, H * sizeof *h->want) == 0,
               "row %u: hidden state is not page %zu's row at pos %llu", r, page, (unsigned long long)row->pos);
    }
    for (uint32_t k = 0; k < b->n_admit; k++)
        EXPECT(h, h_by_stream(h, b->admit[k].stream)->stamp == b->seq + 1,
               "stream %llu admitted without its first prefill row", (unsigned long long)b->admit[k].stream);
    EXPECT(h, b->n_logits == n_logits, "n_logits %u, rows want %u", b->n_logits, n_logits);
    uint32_t share = (c->max_streams + h->K - 1) / h->K;
    EXPECT(h, n_streams <= share, "%u streams in one micro-batch, share %u", n_streams, share);
    h->last_streams = n_streams;
    h->next_seq++;
}

/* One sched_next. Returns the micro-batch now in flight, or NULL when none
 * was formed (then nothing may have changed but no-token pages finishing). */
static flight *h_next(harness *h)
{
    sched_batch b;
    pd_err e = {0};
    EXPECT(h, sched_next(h->s, &b, &e) == PD_OK, "sched_next: %s", e.msg);
    bool formed = b.n_rows || b.n_admit || b.n_retire;
    if (formed) {
        EXPECT(h, h->n_fl < h->K, "a micro-batch formed with all %u slots in flight", h->K);
        h_check_batch(h, &b);
    } else {
        EXPECT(h, b.n_logits == 0, "empty micro-batch with %u logits", b.n_logits);
    }
    /* pages that asked for no tokens were finished in manifest order among
     * this micro-batch's admissions */
    for (size_t i = 0; i < h->n; i++)
        if (h->t[i].order_due) {
            h_expect_taken_before(h, i);
            h->t[i].order_due = false;
        }
    if (!formed)
        return NULL;
    flight *f = &h->fl[h->n_fl++];
    f->b = b;
    for (uint32_t l = 0; l < b.n_logits; l++) {
        if (pd_rng_below(&h->rng, 1000) < h->eos_per_mille) {
            f->tokens[l] = EOS;
            continue;
        }
        uint32_t tok = pd_rng_below(&h->rng, V - 1);
        f->tokens[l] = tok >= EOS ? tok + 1 : tok; /* any token but EOS */
    }
    return f;
}

/* Feeds back the tokens of outstanding micro-batch k (0 = oldest). */
static void h_complete(harness *h, uint32_t k)
{
    ck_assert_uint_lt(k, h->n_fl);
    flight f = h->fl[k];
    memmove(&h->fl[k], &h->fl[k + 1], (h->n_fl - k - 1) * sizeof *h->fl);
    h->fl[--h->n_fl].tokens = f.tokens; /* keep every token buffer owned by some entry */
    const sched_batch *b = &f.b;
    for (uint32_t r = 0; r < b->n_rows; r++)
        h_by_stream(h, b->rows[r].stream)->in_flight = false;
    uint64_t *dig = malloc(((size_t)b->n_logits + 1) * sizeof *dig);
    ck_assert_ptr_nonnull(dig);
    uint32_t l = 0;
    for (uint32_t r = 0; r < b->n_rows; r++) {
        if (!b->rows[r].wants_logits)
            continue;
        track *t = h_by_stream(h, b->rows[r].stream);
        dig[l] = pd_rng_next(&h->rng); /* stands in for the logits row's digest */
        t->digest = digest_chain(t->digest, dig[l]);
        uint32_t tok = f.tokens[l++];
        if (tok == EOS) {
            t->ended = true;
            t->stop = SCHED_STOP_EOS;
        } else {
            t->tok[t->n_tok++] = tok;
            if (t->n_tok == t->pg->max_new_tokens) {
                t->ended = true;
                t->stop = SCHED_STOP_LENGTH;
            }
        }
    }
    pd_err e = {0};
    pd_status want = h->done_status;
    pd_status rc = sched_complete(h->s, b, f.tokens, dig, &e);
    free(dig);
    bool any_done = false;
    for (size_t i = 0; i < h->n; i++) {
        const track *t = &h->t[i];
        if (t->admitted) {
            EXPECT(h, t->n_done == (t->ended ? 1u : 0u), "page %zu: %u on_done calls, ended %d", i, t->n_done,
                   (int)t->ended);
            any_done |= t->ended && t->stamp == b->seq + 1;
        }
    }
    EXPECT(h, rc == (any_done ? want : PD_OK), "sched_complete: %s", e.msg);
}

/* The scheduler's progress and sched_finished against the shadow. */
static void h_check_global(harness *h)
{
    sched_progress pr;
    sched_get_progress(h->s, &pr);
    uint64_t skipped = 0, done = 0;
    uint32_t alive = 0;
    bool all_done = true, pending_retire = false;
    for (size_t i = 0; i < h->n; i++) {
        const track *t = &h->t[i];
        skipped += t->skip;
        done += t->n_done;
        alive += t->admitted && !t->ended;
        all_done &= t->skip || t->n_done == 1;
        pending_retire |= t->admitted && t->ended && !t->retired;
        EXPECT(h, !(t->skip && (t->admitted || t->n_done)), "skipped page %zu was taken", i);
    }
    EXPECT(h, pr.pages_total == h->n && pr.pages_skipped == skipped, "progress: total %llu skipped %llu",
           (unsigned long long)pr.pages_total, (unsigned long long)pr.pages_skipped);
    EXPECT(h, pr.pages_done == done, "progress: %llu pages done, want %llu", (unsigned long long)pr.pages_done,
           (unsigned long long)done);
    EXPECT(h, pr.streams_alive == alive && alive <= h->cfg.max_streams, "progress: %u streams alive, want %u",
           pr.streams_alive, alive);
    bool fin = sched_finished(h->s);
    if (fin)
        EXPECT(h, all_done && h->n_fl == 0, "finished with pages left or %u micro-batches in flight", h->n_fl);
    if (all_done && h->n_fl == 0 && !pending_retire)
        EXPECT(h, fin, "everything is done and nothing in flight, but not finished");
}

/* Runs the schedule to the end: forms micro-batches while slots are free
 * (sometimes completing first), completes a random outstanding one
 * otherwise; checks every invariant after each step. */
static void h_drive(harness *h)
{
    for (uint64_t step = 0;; step++) {
        EXPECT(h, step < 1000000, "no end after %llu steps", (unsigned long long)step);
        if (h->n_fl == h->K && pd_rng_below(&h->rng, 4) == 0)
            EXPECT(h, h_next(h) == NULL, "formed a micro-batch with every slot in flight");
        bool form = h->n_fl < h->K && (h->n_fl == 0 || pd_rng_below(&h->rng, 3) != 0);
        if (form && h_next(h)) {
            h_check_global(h);
            continue;
        }
        if (h->n_fl == 0)
            break;
        h_complete(h, pd_rng_below(&h->rng, h->n_fl));
        h_check_global(h);
    }
    EXPECT(h, sched_finished(h->s), "nothing formed and nothing in flight, but not finished");
    for (size_t i = 0; i < h->n; i++) {
        const track *t = &h->t[i];
        if (t->skip)
            continue;
        EXPECT(h, t->n_done == 1, "page %zu never finished", i);
        EXPECT(h, t->admitted == (t->pg->max_new_tokens > 0), "page %zu admitted %d", i, (int)t->admitted);
        EXPECT(h, !t->admitted || (t->retired && t->fed == t->pg->prefill_rows),
               "page %zu: retired %d, %llu prefill rows sent", i, (int)t->retired, (unsigned long long)t->fed);
    }
    EXPECT(h, h->alive == 0, "%u streams never retired", h->alive);
}

/* Completes every outstanding micro-batch, oldest first. */
static void h_complete_all(harness *h)
{
    while (h->n_fl)
        h_complete(h, 0);
}

/* ---- deterministic cases ----------------------------------------------- */

START_TEST(sched_new_refuses_missing_parts_and_a_buffer_below_the_stream_count)
{
    pages *pg = manifest_load("{\"id\":\"a\",\"prefill\":[{\"tokens\":[1]}],\"max_new_tokens\":1}\n");
    sched_config ok = {.pg = pg, .m = mdl, .max_streams = 4, .max_rows = 4};
    sched *s = NULL;
    pd_err e = {0};
    ck_assert_int_eq(sched_new(&ok, 0, &s, &e), PD_ERR_ARG);
    sched_config c = ok;
    c.max_rows = 3;
    pd_err_clear(&e);
    ck_assert_int_eq(sched_new(&c, 1, &s, &e), PD_ERR_ARG);
    ck_assert_msg(strstr(e.msg, "3") && strstr(e.msg, "4"), "%s", e.msg);
    c = ok;
    c.max_streams = 0;
    ck_assert_int_eq(sched_new(&c, 1, &s, &e), PD_ERR_ARG);
    c = ok;
    c.pg = NULL;
    ck_assert_int_eq(sched_new(&c, 1, &s, &e), PD_ERR_ARG);
    ck_assert_ptr_null(s);
    ck_assert_int_eq(sched_new(&ok, 1, &s, &e), PD_OK);
    sched_free(s);
    sched_free(NULL);
    pages_free(pg);
}
END_TEST

/* Three slots and seven streams: each micro-batch takes at most three, and
 * the three in flight share the seven without overlap. */
START_TEST(sched_in_flight_micro_batches_split_the_streams_into_shares)
{
    pages *pg = manifest_uniform(7, 2, 4);
    harness h;
    h_init(&h, pg, 3, 7, 64, 0, 0, NULL, 1);
    uint32_t want[3] = {3, 3, 1};
    for (int round = 0; round < 3; round++) {
        for (int k = 0; k < 3; k++) {
            ck_assert_ptr_nonnull(h_next(&h));
            ck_assert_uint_eq(h.last_streams, want[k]);
            ck_assert_uint_eq(h.fl[k].b.n_rows, want[k] * (round == 0 ? 2u : 1u));
            ck_assert_uint_eq(h.fl[k].b.n_admit, round == 0 ? want[k] : 0u);
        }
        ck_assert_ptr_null(h_next(&h)); /* no slot left */
        h_complete_all(&h);
        h_check_global(&h);
    }
    h_drive(&h);
    h_free(&h);
    pages_free(pg);
}
END_TEST

/* rows_per_batch caps a micro-batch below its buffer, prefill goes in chunks
 * of prefill_chunk rows, and a decode row goes before prefill rows. */
START_TEST(sched_row_budget_and_prefill_chunks_bound_each_micro_batch)
{
    pages *pg = manifest_load("{\"id\":\"a\",\"prefill\":[{\"tokens\":[1,2,3,4,5,6,7]}],\"max_new_tokens\":3}\n"
                              "{\"id\":\"b\",\"prefill\":[{\"tokens\":[8,9,10,11]}],\"max_new_tokens\":3}\n"
                              "{\"id\":\"c\",\"prefill\":[{\"tokens\":[12,13]}],\"max_new_tokens\":3}\n");
    harness h;
    h_init(&h, pg, 1, 2, 16, 6, 3, NULL, 2);
    flight *f = h_next(&h); /* a 0..2, b 0..2 */
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(f->b.n_rows, 6);
    ck_assert_uint_eq(f->b.n_admit, 2);
    h_complete(&h, 0);
    f = h_next(&h); /* a 3..5, b 3 (with logits); c waits for a free stream */
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(f->b.n_rows, 4);
    ck_assert_uint_eq(f->b.n_admit, 0);
    ck_assert_uint_eq(f->b.n_logits, 1);
    h_complete(&h, 0);
    f = h_next(&h); /* b decodes, then a's last prefill row */
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(f->b.n_rows, 2);
    ck_assert_int_eq(f->b.rows[0].role, MB_ROLE_DECODE);
    ck_assert_uint_eq(f->b.rows[0].pos, 4);
    ck_assert_int_eq(f->b.rows[1].role, MB_ROLE_PREFILL);
    ck_assert_uint_eq(f->b.rows[1].pos, 6);
    h_complete(&h, 0);
    h_drive(&h);
    h_free(&h);

    /* without chunks the budget still cuts a's prefill, and b waits */
    h_init(&h, pg, 1, 2, 16, 5, 0, NULL, 3);
    f = h_next(&h);
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(f->b.n_rows, 5);
    ck_assert_uint_eq(f->b.n_admit, 1);
    h_drive(&h);
    h_free(&h);

    /* rows_per_batch 0 or above max_rows means max_rows */
    uint32_t rpb[2] = {0, 100};
    for (int k = 0; k < 2; k++) {
        h_init(&h, pg, 1, 3, 7, rpb[k], 0, NULL, 3);
        f = h_next(&h); /* all of a's 7 rows */
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(f->b.n_rows, 7);
        h_drive(&h);
        h_free(&h);
    }
    pages_free(pg);
}
END_TEST

/* Pages are taken in manifest order when a stream is free and their rows
 * fit; a page asking for no tokens finishes (on_done) without a stream; a
 * finished stream's retirement rides on the next header. */
START_TEST(sched_admits_lazily_in_manifest_order_and_finishes_empty_pages_without_a_stream)
{
    pages *pg = manifest_load("{\"id\":\"z0\",\"prefill\":[{\"tokens\":[1]}],\"max_new_tokens\":0}\n"
                              "{\"id\":\"a\",\"prefill\":[{\"tokens\":[2,3]}],\"max_new_tokens\":2}\n"
                              "{\"id\":\"z1\",\"prefill\":[{\"tokens\":[4]}],\"max_new_tokens\":0}\n"
                              "{\"id\":\"b\",\"prefill\":[{\"tokens\":[5]}],\"max_new_tokens\":3}\n");
    harness h;
    h_init(&h, pg, 1, 1, 4, 0, 0, NULL, 4);
    ck_assert(!sched_finished(h.s));
    flight *f = h_next(&h);
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(h.t[0].n_done, 1); /* z0 */
    ck_assert_uint_eq(f->b.n_admit, 1);
    ck_assert(h.t[1].admitted);
    ck_assert_uint_eq(f->b.n_rows, 2);
    uint64_t a_stream = h.t[1].stream;
    h_complete(&h, 0); /* a's first token */
    ck_assert_ptr_nonnull(h_next(&h));
    ck_assert_uint_eq(h.t[2].n_done, 0); /* z1 is not taken while a holds the only stream */
    h_complete(&h, 0); /* a's second token: a finishes */
    ck_assert_uint_eq(h.t[1].n_done, 1);
    ck_assert_int_eq(h.t[1].stop, SCHED_STOP_LENGTH);
    f = h_next(&h); /* retires a, finishes z1, admits b */
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(f->b.n_retire, 1);
    ck_assert_uint_eq(f->b.retire[0], a_stream);
    ck_assert_uint_eq(h.t[2].n_done, 1);
    ck_assert(!h.t[2].admitted);
    ck_assert_uint_eq(f->b.n_admit, 1);
    ck_assert_uint_gt(f->b.admit[0].stream, a_stream);
    f->tokens[0] = EOS; /* b ends at once */
    h_complete(&h, 0);
    ck_assert_uint_eq(h.t[3].n_done, 1);
    ck_assert_int_eq(h.t[3].stop, SCHED_STOP_EOS);
    ck_assert_uint_eq(h.t[3].n_tok, 0);
    f = h_next(&h); /* a header with only b's retirement */
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(f->b.n_rows, 0);
    ck_assert_uint_eq(f->b.n_admit, 0);
    ck_assert_uint_eq(f->b.n_retire, 1);
    ck_assert_uint_eq(f->b.retire[0], h.t[3].stream);
    h_complete(&h, 0);
    ck_assert_ptr_null(h_next(&h));
    ck_assert(sched_finished(h.s));
    h_check_global(&h);
    h_free(&h);
    pages_free(pg);
}
END_TEST

START_TEST(sched_never_admits_skipped_pages)
{
    pages *pg = manifest_uniform(6, 3, 2);
    bool skip[6] = {true, false, true, true, false, true};
    harness h;
    h_init(&h, pg, 2, 2, 8, 0, 2, skip, 5);
    h_drive(&h);
    ck_assert(h.t[1].admitted && h.t[4].admitted);
    sched_progress pr;
    sched_get_progress(h.s, &pr);
    ck_assert_uint_eq(pr.pages_skipped, 4);
    ck_assert_uint_eq(pr.pages_done, 2);
    h_free(&h);

    /* everything skipped: finished before the first micro-batch */
    bool all[6] = {true, true, true, true, true, true};
    h_init(&h, pg, 1, 2, 8, 0, 0, all, 6);
    ck_assert(sched_finished(h.s));
    ck_assert_ptr_null(h_next(&h));
    h_check_global(&h);
    h_free(&h);
    pages_free(pg);
}
END_TEST

/* One slot and a budget far above the work: every stream rides in every
 * micro-batch, up to max_streams of them. */
START_TEST(sched_one_slot_with_a_large_budget_carries_every_stream_at_once)
{
    pages *pg = manifest_uniform(6, 5, 3);
    harness h;
    h_init(&h, pg, 1, 4, 1000, 0, 0, NULL, 7);
    flight *f = h_next(&h);
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(f->b.n_admit, 4);
    ck_assert_uint_eq(f->b.n_rows, 4 * 5);
    ck_assert_uint_eq(f->b.n_logits, 4);
    ck_assert_ptr_null(h_next(&h));
    h_complete(&h, 0);
    for (int step = 0; step < 2; step++) {
        f = h_next(&h); /* four decode rows */
        ck_assert_ptr_nonnull(f);
        ck_assert_uint_eq(f->b.n_rows, 4);
        ck_assert_uint_eq(h.last_streams, 4);
        h_complete(&h, 0);
    }
    /* all four reached max_new: retired on the next header, which admits the
     * last two pages */
    f = h_next(&h);
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(f->b.n_retire, 4);
    ck_assert_uint_eq(f->b.n_admit, 2);
    ck_assert_uint_eq(f->b.n_rows, 2 * 5);
    h_drive(&h);
    h_free(&h);
    pages_free(pg);
}
END_TEST

START_TEST(sched_finished_turns_true_only_when_the_last_page_is_done_and_back)
{
    pages *pg = manifest_load("{\"id\":\"a\",\"prefill\":[{\"tokens\":[1,2]}],\"max_new_tokens\":2}\n"
                              "{\"id\":\"b\",\"prefill\":[{\"tokens\":[3]}],\"max_new_tokens\":1}\n");
    harness h;
    h_init(&h, pg, 2, 1, 4, 0, 0, NULL, 8);
    ck_assert(!sched_finished(h.s));
    while (h.t[1].n_done == 0) {
        if (!h_next(&h))
            h_complete(&h, 0);
        h_check_global(&h);
        ck_assert(!sched_finished(h.s) || (h.t[1].n_done && h.n_fl == 0));
    }
    h_complete_all(&h);
    h_drive(&h);
    h_free(&h);

    /* no pages, or only pages that ask for no tokens: done without a batch */
    pages *empty = manifest_load("");
    h_init(&h, empty, 1, 1, 1, 0, 0, NULL, 9);
    ck_assert(sched_finished(h.s));
    ck_assert_ptr_null(h_next(&h));
    h_free(&h);
    pages_free(empty);
    pages *zero = manifest_load("{\"id\":\"z0\",\"prefill\":[{\"tokens\":[1]}],\"max_new_tokens\":0}\n"
                                "{\"id\":\"z1\",\"prefill\":[{\"tokens\":[2]}],\"max_new_tokens\":0}\n");
    h_init(&h, zero, 1, 1, 1, 0, 0, NULL, 10);
    ck_assert(!sched_finished(h.s));
    ck_assert_ptr_null(h_next(&h));
    ck_assert_uint_eq(h.t[0].n_done + h.t[1].n_done, 2);
    ck_assert(sched_finished(h.s));
    h_check_global(&h);
    h_free(&h);
    pages_free(zero);
    pages_free(pg);
}
END_TEST

/* sched.h: "True when every page is finished and nothing is in flight or
 * pending retirement": the last streams' retirements still have to go out. */
START_TEST(sched_finished_waits_for_the_last_retirements_to_go_out)
{
    pages *pg = manifest_load("{\"id\":\"a\",\"prefill\":[{\"tokens\":[1]}],\"max_new_tokens\":1}\n");
    harness h;
    h_init(&h, pg, 1, 1, 1, 0, 0, NULL, 11);
    ck_assert_ptr_nonnull(h_next(&h));
    h_complete(&h, 0);
    ck_assert_uint_eq(h.t[0].n_done, 1);
    ck_assert_msg(!sched_finished(h.s), "finished while stream a's retirement is still pending");
    flight *f = h_next(&h);
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(f->b.n_retire, 1);
    h_complete(&h, 0);
    ck_assert(sched_finished(h.s));
    h_free(&h);
    pages_free(pg);
}
END_TEST

START_TEST(sched_complete_returns_the_on_done_failure)
{
    pages *pg = manifest_load("{\"id\":\"a\",\"prefill\":[{\"tokens\":[1]}],\"max_new_tokens\":1}\n"
                              "{\"id\":\"b\",\"prefill\":[{\"tokens\":[2]}],\"max_new_tokens\":1}\n");
    harness h;
    h_init(&h, pg, 1, 1, 1, 0, 0, NULL, 12);
    ck_assert_ptr_nonnull(h_next(&h));
    h.done_status = PD_ERR_IO;
    h_complete(&h, 0); /* expects sched_complete to return PD_ERR_IO */
    ck_assert_uint_eq(h.t[0].n_done, 1);
    h.done_status = PD_OK;
    h_drive(&h);
    h_free(&h);
    pages_free(pg);
}
END_TEST

/* A prefill row that cannot be read fails sched_next, naming the page. */
/* What on_done saw, for the page-failure cases. */
typedef struct done_log {
    int n;
    char ids[8][16];
    sched_stop stop[8];
    char error[8][256];
} done_log;

static pd_status log_done(void *ctx, const sched_result *r, pd_err *err)
{
    (void)err;
    done_log *l = ctx;
    if (l->n < 8) {
        snprintf(l->ids[l->n], sizeof l->ids[0], "%s", r->id);
        l->stop[l->n] = r->stop;
        snprintf(l->error[l->n], sizeof l->error[0], "%s", r->error ? r->error : "");
    }
    l->n++;
    return PD_OK;
}

static bool batch_has_stream(const sched_batch *b, uint64_t id)
{
    for (uint32_t i = 0; i < b->n_rows; i++)
        if (b->rows[i].stream == id)
            return true;
    for (uint32_t i = 0; i < b->n_admit; i++)
        if (b->admit[i].stream == id)
            return true;
    return false;
}

START_TEST(sched_page_whose_input_fails_at_admission_fails_alone_unannounced)
{
    char path[300];
    snprintf(path, sizeof path, "%s/bad.npy", tmpdir);
    float v[3 * 16] = {0};
    ck_assert_uint_eq(H, 16);
    pd_err e = {0};
    ck_assert_int_eq(npy_write_f32(path, 2, H, v, &e), PD_OK);
    pages *pg = manifest_load("{\"id\":\"g1\",\"prefill\":[{\"tokens\":[5,6]}],\"max_new_tokens\":1}\n"
                              "{\"id\":\"pbad\",\"prefill\":[{\"embeddings\":\"bad.npy\"}],\"max_new_tokens\":1}\n"
                              "{\"id\":\"g2\",\"prefill\":[{\"tokens\":[7]}],\"max_new_tokens\":1}\n");
    ck_assert_int_eq(npy_write_f32(path, 3, H, v, &e), PD_OK); /* changed after load */
    done_log log = {0};
    sched_config c = {.pg = pg, .m = mdl, .max_streams = 3, .max_rows = 8, .on_done = log_done, .on_done_ctx = &log};
    sched *s;
    ck_assert_int_eq(sched_new(&c, 1, &s, &e), PD_OK);
    sched_batch b;
    ck_assert_msg(sched_next(s, &b, &e) == PD_OK, "%s", e.msg);
    /* the batch goes on with the two good pages; pbad (stream 1) is never announced */
    ck_assert_int_eq(log.n, 1);
    ck_assert_str_eq(log.ids[0], "pbad");
    ck_assert_int_eq(log.stop[0], SCHED_STOP_ERROR);
    ck_assert_msg(strstr(log.error[0], "pbad") && strstr(log.error[0], "bad.npy"), "%s", log.error[0]);
    ck_assert_uint_eq(b.n_admit, 2);
    ck_assert(!batch_has_stream(&b, 1));
    ck_assert_uint_eq(b.n_rows, 3);
    uint32_t toks[2] = {EOS, EOS};
    uint64_t dig[2] = {1, 2};
    ck_assert_int_eq(sched_complete(s, &b, toks, dig, &e), PD_OK);
    ck_assert_int_eq(log.n, 3);
    ck_assert_str_eq(log.ids[1], "g1");
    ck_assert_str_eq(log.ids[2], "g2");
    /* the good pages' retirements go out; the failed page's never does */
    ck_assert_int_eq(sched_next(s, &b, &e), PD_OK);
    ck_assert_uint_eq(b.n_retire, 2);
    ck_assert(b.retire[0] != 1 && b.retire[1] != 1);
    sched_progress pr;
    sched_get_progress(s, &pr);
    ck_assert_uint_eq(pr.pages_failed, 1);
    ck_assert_uint_eq(pr.pages_done, 3);
    ck_assert_int_eq(sched_complete(s, &b, toks, dig, &e), PD_OK);
    ck_assert(sched_finished(s));
    sched_free(s);
    pages_free(pg);
    unlink(path);
}
END_TEST

START_TEST(sched_page_whose_input_fails_after_its_first_chunk_is_retired)
{
    char path[300];
    snprintf(path, sizeof path, "%s/bad2.npy", tmpdir);
    float v[3 * 16] = {0};
    pd_err e = {0};
    ck_assert_int_eq(npy_write_f32(path, 2, H, v, &e), PD_OK);
    pages *pg = manifest_load("{\"id\":\"pbad\",\"prefill\":[{\"embeddings\":\"bad2.npy\"}],\"max_new_tokens\":2}\n");
    done_log log = {0};
    sched_config c = {.pg = pg, .m = mdl, .max_streams = 1, .max_rows = 4, .prefill_chunk = 1,
                      .on_done = log_done, .on_done_ctx = &log};
    sched *s;
    ck_assert_int_eq(sched_new(&c, 1, &s, &e), PD_OK);
    sched_batch b;
    ck_assert_int_eq(sched_next(s, &b, &e), PD_OK);
    ck_assert_uint_eq(b.n_admit, 1);
    ck_assert_uint_eq(b.n_rows, 1);
    ck_assert_int_eq(sched_complete(s, &b, NULL, NULL, &e), PD_OK);
    ck_assert_int_eq(npy_write_f32(path, 3, H, v, &e), PD_OK); /* the file changes mid-prefill */
    ck_assert_int_eq(sched_next(s, &b, &e), PD_OK);
    ck_assert_int_eq(log.n, 1);
    ck_assert_int_eq(log.stop[0], SCHED_STOP_ERROR);
    ck_assert_msg(strstr(log.error[0], "pbad"), "%s", log.error[0]);
    /* stages hold its first row: its retirement rides on this very header */
    ck_assert_uint_eq(b.n_rows, 0);
    ck_assert_uint_eq(b.n_retire, 1);
    ck_assert_uint_eq(b.retire[0], 0);
    ck_assert_int_eq(sched_complete(s, &b, NULL, NULL, &e), PD_OK);
    ck_assert(sched_finished(s));
    sched_free(s);
    pages_free(pg);
    unlink(path);
}
END_TEST

/* ---- randomized -------------------------------------------------------- */

/* Random slots, streams, chunk, buffer, budget, manifest, skips, EOS rate
 * and completion order; every invariant after every step. */
START_TEST(sched_random_schedules_keep_every_invariant)
{
    pd_rng r = {.s = 0x5eedull + (uint64_t)_i * 1000003u};
    uint32_t K = 1 + pd_rng_below(&r, 4);
    uint32_t max_streams = 1 + pd_rng_below(&r, 9);
    uint32_t chunk = pd_rng_below(&r, 8);
    uint32_t max_rows = max_streams + pd_rng_below(&r, 12);
    uint32_t rpb = pd_rng_below(&r, 4) == 0 ? 0 : 1 + pd_rng_below(&r, max_rows + 4);
    size_t n = pd_rng_below(&r, 41);
    pages *pg = manifest_random(&r, n);
    bool *skip = NULL;
    if (pd_rng_below(&r, 2)) {
        skip = calloc(n ? n : 1, sizeof *skip);
        ck_assert_ptr_nonnull(skip);
        for (size_t i = 0; i < n; i++)
            skip[i] = pd_rng_below(&r, 6) == 0;
    }
    harness h;
    h_init(&h, pg, K, max_streams, max_rows, rpb, chunk, skip, (uint64_t)_i);
    h.eos_per_mille = pd_rng_below(&r, 300);
    h_drive(&h);
    h_free(&h);
    free(skip);
    pages_free(pg);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("sched");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_unchecked_fixture(tc, fixture_setup, fixture_teardown);
    tcase_add_test(tc, sched_new_refuses_missing_parts_and_a_buffer_below_the_stream_count);
    tcase_add_test(tc, sched_in_flight_micro_batches_split_the_streams_into_shares);
    tcase_add_test(tc, sched_row_budget_and_prefill_chunks_bound_each_micro_batch);
    tcase_add_test(tc, sched_admits_lazily_in_manifest_order_and_finishes_empty_pages_without_a_stream);
    tcase_add_test(tc, sched_never_admits_skipped_pages);
    tcase_add_test(tc, sched_one_slot_with_a_large_budget_carries_every_stream_at_once);
    tcase_add_test(tc, sched_finished_turns_true_only_when_the_last_page_is_done_and_back);
    tcase_add_test(tc, sched_finished_waits_for_the_last_retirements_to_go_out);
    tcase_add_test(tc, sched_complete_returns_the_on_done_failure);
    tcase_add_test(tc, sched_page_whose_input_fails_at_admission_fails_alone_unannounced);
    tcase_add_test(tc, sched_page_whose_input_fails_after_its_first_chunk_is_retired);
    tcase_add_loop_test(tc, sched_random_schedules_keep_every_invariant, 0, 400);
    suite_add_tcase(s, tc);
    return s;
}
