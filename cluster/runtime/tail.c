/* tail: logits for the rows that want them, then per-stream sampling. */
#include "cluster/runtime/tail.h"

#include "cluster/runtime/digest.h"

#include <stdlib.h>
#include <string.h>

/* INV: used streams have hist[max_new] and n_hist <= max_new. */
typedef struct tail_stream {
    int used;
    uint64_t id, key;
    uint32_t max_new, n_hist;
    int32_t *hist;
} tail_stream;

struct tail {
    tail_config cfg;
    uint32_t hidden, vocab;
    tail_stream *streams;
    sampler *smp;
    float *xs;     /* [max_rows x hidden] gathered rows */
    float *logits; /* [max_rows x vocab] */
    uint32_t *row_of; /* [max_rows] */
};

pd_status tail_new(const tail_config *cfg, tail **out, pd_err *err)
{
    tail *t = calloc(1, sizeof *t);
    if (!t)
        return pd_err_set(err, PD_ERR_NOMEM, "tail: out of memory");
    t->cfg = *cfg;
    t->hidden = model_hp(cfg->m)->hidden;
    t->vocab = model_hp(cfg->m)->vocab;
    t->streams = calloc(cfg->max_streams, sizeof *t->streams);
    t->xs = malloc((size_t)cfg->max_rows * t->hidden * sizeof(float));
    t->logits = malloc((size_t)cfg->max_rows * t->vocab * sizeof(float));
    t->row_of = malloc((size_t)cfg->max_rows * sizeof(uint32_t));
    if (!t->streams || !t->xs || !t->logits || !t->row_of) {
        tail_free(t);
        return pd_err_set(err, PD_ERR_NOMEM, "tail: out of memory for %u rows x %u logits", cfg->max_rows, t->vocab);
    }
    pd_status st = sampler_new(t->vocab, &cfg->sample, &cfg->ngram, cfg->seed, &t->smp, err);
    if (st) {
        tail_free(t);
        return st;
    }
    *out = t;
    return PD_OK;
}

void tail_free(tail *t)
{
    if (!t)
        return;
    for (uint32_t i = 0; t->streams && i < t->cfg.max_streams; i++)
        free(t->streams[i].hist);
    free(t->streams);
    free(t->xs);
    free(t->logits);
    free(t->row_of);
    sampler_free(t->smp);
    free(t);
}

static tail_stream *tail_find(tail *t, uint64_t id)
{
    for (uint32_t i = 0; i < t->cfg.max_streams; i++)
        if (t->streams[i].used && t->streams[i].id == id)
            return &t->streams[i];
    return NULL;
}

pd_status tail_admit(tail *t, const mb_admit *a, pd_err *err)
{
    if (tail_find(t, a->stream))
        return pd_err_set(err, PD_ERR_ARG, "tail: stream %llu admitted twice", (unsigned long long)a->stream);
    for (uint32_t i = 0; i < t->cfg.max_streams; i++) {
        tail_stream *s = &t->streams[i];
        if (s->used)
            continue;
        int32_t *h = malloc(((size_t)a->max_new + 1) * sizeof *h);
        if (!h)
            return pd_err_set(err, PD_ERR_NOMEM, "tail: out of memory");
        *s = (tail_stream){.used = 1, .id = a->stream, .key = a->sample_key, .max_new = a->max_new, .hist = h};
        return PD_OK;
    }
    return pd_err_set(err, PD_ERR_RANGE, "tail: %u streams already alive", t->cfg.max_streams);
}

void tail_retire(tail *t, uint64_t stream)
{
    tail_stream *s = tail_find(t, stream);
    if (!s)
        return;
    free(s->hist);
    memset(s, 0, sizeof *s);
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
    for (uint32_t j = 0; j < m; j++) {
        const mb_row *r = &rows[t->row_of[j]];
        tail_stream *s = tail_find(t, r->stream);
        if (!s)
            return pd_err_set(err, PD_ERR_FORMAT, "tail: row of unknown stream %llu", (unsigned long long)r->stream);
        if (s->n_hist >= s->max_new)
            return pd_err_set(err, PD_ERR_FORMAT, "tail: stream %llu asks for token %u beyond max_new %u",
                              (unsigned long long)r->stream, s->n_hist + 1, s->max_new);
        const float *lg = t->logits + (size_t)j * t->vocab;
        int32_t tok;
        pd_status st = sampler_next_key(t->smp, lg, s->hist, s->n_hist, s->key, s->n_hist, &tok, err);
        if (st)
            return st;
        s->hist[s->n_hist++] = tok;
        tokens[j] = (uint32_t)tok;
        row_digests[j] = digest_f32(lg, t->vocab);
    }
    *n_tokens = m;
    return PD_OK;
}
