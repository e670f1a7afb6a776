/* tail: logits for the rows that want them, then per-stream sampling. */
#include "cluster/runtime/pipeline/tail.h"

#include "cluster/runtime/pipeline/digest.h"
#include "cluster/runtime/pipeline/stream.h"
#include "comm/msg.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct tail {
    tail_config cfg;
    uint32_t hidden, vocab;
    stream_table *streams; /* per stream: key, max_new, sampled tokens (stream.h) */
    sampler *smp;
    float *xs;     /* [max_rows x hidden] gathered rows */
    float *logits; /* [max_rows x vocab] */
    uint32_t *row_of; /* [max_rows] */
    FILE *margins;    /* PD_TRACE_MARGINS (testing aid), or NULL */
};

pd_status tail_new(const tail_config *cfg, tail **out, pd_err *err)
{
    tail *t = calloc(1, sizeof *t);
    if (!t)
        return pd_err_set(err, PD_ERR_NOMEM, "tail: out of memory");
    t->cfg = *cfg;
    t->hidden = model_hp(cfg->m)->hidden;
    t->vocab = model_hp(cfg->m)->vocab;
    pd_status st = stream_table_new(cfg->max_streams, &t->streams, err);
    if (st) {
        tail_free(t);
        return st;
    }
    t->xs = malloc((size_t)cfg->max_rows * t->hidden * sizeof(float));
    t->logits = malloc((size_t)cfg->max_rows * t->vocab * sizeof(float));
    t->row_of = malloc((size_t)cfg->max_rows * sizeof(uint32_t));
    if (!t->xs || !t->logits || !t->row_of) {
        uint32_t vocab = t->vocab;
        tail_free(t);
        return pd_err_set(err, PD_ERR_NOMEM, "tail: out of memory for %u rows x %u logits", cfg->max_rows, vocab);
    }
    st = sampler_new(t->vocab, &cfg->sample, &cfg->ngram, cfg->seed, &t->smp, err);
    if (st) {
        tail_free(t);
        return st;
    }
    const char *mp = getenv("PD_TRACE_MARGINS");
    if (mp && *mp && !(t->margins = fopen(mp, "a"))) {
        tail_free(t);
        return pd_err_set(err, PD_ERR_IO, "tail: cannot open PD_TRACE_MARGINS file %s", mp);
    }
    *out = t;
    return PD_OK;
}

void tail_free(tail *t)
{
    if (!t)
        return;
    stream_table_free(t->streams);
    free(t->xs);
    free(t->logits);
    free(t->row_of);
    sampler_free(t->smp);
    if (t->margins)
        fclose(t->margins);
    free(t);
}

/* PD_TRACE_MARGINS=FILE (a testing aid, docs/digests.md): per sampled token
 * a line "KEY INDEX TOKEN MARGIN", KEY the page's sampling key in hex
 * (FNV-1a 64 of its id), MARGIN the best logit minus the second best, so
 * where two arithmetics first pick different tokens the trace says how
 * close to a tie the choice was. */
static void tail_trace_margin(const tail *t, const stream_state *s, const float *lg, int32_t tok)
{
    float b1 = -INFINITY, b2 = -INFINITY;
    for (uint32_t v = 0; v < t->vocab; v++) {
        if (lg[v] > b1) {
            b2 = b1;
            b1 = lg[v];
        } else if (lg[v] > b2) {
            b2 = lg[v];
        }
    }
    fprintf(t->margins, "%016llx %u %d %.9g\n", (unsigned long long)s->key, s->n_tokens, (int)tok,
            (double)(b1 - b2));
}

pd_status tail_admit(tail *t, const mb_admit *a, pd_err *err)
{
    if (stream_table_find(t->streams, a->stream))
        return pd_err_set(err, PD_ERR_ARG, "tail: stream %llu admitted twice", (unsigned long long)a->stream);
    if (stream_table_count(t->streams) == stream_table_capacity(t->streams))
        return pd_err_set(err, PD_ERR_RANGE, "tail: %u streams already alive", t->cfg.max_streams);
    stream_state s;
    pd_status st = stream_init_keyed(&s, a->stream, a->sample_key, a->max_new, err);
    s.prefill_rows = a->prefill_rows; /* where its first sampled token sits */
    if (st == PD_OK && (st = stream_table_put(t->streams, &s, NULL, err)))
        stream_release(&s);
    if (st)
        pd_err_prefix(err, "tail");
    return st;
}

pd_status tail_restore(tail *t, const stream_state *s, pd_err *err)
{
    mb_admit a = {.stream = s->id, .prefill_rows = (uint32_t)s->prefill_rows, .max_new = s->max_new,
                  .sample_key = s->key};
    pd_status st = tail_admit(t, &a, err);
    if (st)
        return st;
    stream_state *d = stream_table_find(t->streams, s->id);
    memcpy(d->tokens, s->tokens, (size_t)s->n_tokens * sizeof *d->tokens);
    d->n_tokens = s->n_tokens;
    d->digest = s->digest;
    return PD_OK;
}

void tail_retire(tail *t, uint64_t stream)
{
    stream_table_drop(t->streams, stream);
}

/* Whether verify row r, the first of its stream in a batch, carries the
 * stream's last sampled token at the position that token takes. */
static bool continues(const stream_state *s, const mb_row *r, uint32_t eos)
{
    if (s->n_tokens == 0 || s->n_tokens >= s->max_new)
        return false;
    uint32_t last = s->tokens[s->n_tokens - 1];
    return last != eos && r->token == last && r->pos == s->prefill_rows + s->n_tokens - 1;
}

pd_status tail_sample(tail *t, const mb_row *rows, uint32_t n, const float *x, uint32_t *tokens,
                      uint64_t *row_digests, uint32_t *n_tokens, pd_err *err)
{
    uint32_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (rows[i].wants_logits) {
            if (m >= t->cfg.max_rows)
                return pd_err_set(err, PD_ERR_RANGE, "tail: more than %u logits rows", t->cfg.max_rows);
            memcpy(t->xs + (size_t)m * t->hidden, x + (size_t)i * t->hidden, t->hidden * sizeof(float));
            t->row_of[m++] = i;
        }
    *n_tokens = 0;
    if (m == 0)
        return PD_OK;
    model_logits(t->cfg.m, t->xs, m, t->logits, t->cfg.pool);
    /* speculation: a verify row's draft is accepted iff it equals the token
     * sampled from the row before (and that was not EOS); from the first
     * rejection on, the stream's rows in this batch sample nothing */
    uint64_t rejected = UINT64_MAX;
    bool any_rejected = false;
    const uint32_t eos = model_hp(t->cfg.m)->eos;
    for (uint32_t j = 0; j < m; j++) {
        const mb_row *r = &rows[t->row_of[j]];
        if (any_rejected && r->stream == rejected) {
            tokens[j] = MSG_TOKEN_REJECTED;
            row_digests[j] = 0;
            continue;
        }
        stream_state *s = stream_table_find(t->streams, r->stream);
        if (!s)
            return pd_err_set(err, PD_ERR_FORMAT, "tail: row of unknown stream %llu", (unsigned long long)r->stream);
        /* asynchronous speculation: verify rows that open their stream's rows
         * in a batch continue the stream's previous batch as if all its
         * drafts were accepted; they stand only if the first carries the
         * last sampled token at that token's position (and the stream goes
         * on). Otherwise the whole run of them samples nothing. */
        bool opens = j == 0 || rows[t->row_of[j - 1]].stream != r->stream;
        if (opens && r->role == MB_ROLE_VERIFY && !continues(s, r, eos)) {
            tokens[j] = MSG_TOKEN_REJECTED;
            row_digests[j] = 0;
            rejected = r->stream;
            any_rejected = true;
            continue;
        }
        if (s->n_tokens >= s->max_new)
            return pd_err_set(err, PD_ERR_FORMAT, "tail: stream %llu asks for token %u beyond max_new %u",
                              (unsigned long long)r->stream, s->n_tokens + 1, s->max_new);
        const float *lg = t->logits + (size_t)j * t->vocab;
        int32_t tok;
        /* the sampled history is the n-gram ban's window and the sampling index */
        pd_status st = sampler_next_key(t->smp, lg, (const int32_t *)s->tokens, s->n_tokens, s->key, s->n_tokens,
                                        &tok, err);
        if (st)
            return st;
        tokens[j] = (uint32_t)tok;
        row_digests[j] = digest_f32(lg, t->vocab);
        if (t->margins)
            tail_trace_margin(t, s, lg, tok);
        if ((st = stream_push(s, (uint32_t)tok, row_digests[j], err)))
            return st;
        const mb_row *nx = j + 1 < m ? &rows[t->row_of[j + 1]] : NULL;
        if (nx && nx->stream == r->stream && nx->role == MB_ROLE_VERIFY &&
            (nx->token != (uint32_t)tok || (uint32_t)tok == eos || s->n_tokens >= s->max_new)) {
            rejected = r->stream;
            any_rejected = true;
        }
    }
    *n_tokens = m;
    return PD_OK;
}
