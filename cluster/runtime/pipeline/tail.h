/* tail: the last stage's output step — final norm, output projection for the
 * rows that want logits, and per-stream sampling.
 *
 * Per stream it keeps what sampling is a function of: the page's sampling key
 * (from the admission header), the tokens generated so far (for the n-gram
 * ban and the token index). Nothing depends on which rows share a batch. */
#ifndef PD_TAIL_H
#define PD_TAIL_H

#include "base/status.h"
#include "cluster/model/model.h"
#include "cluster/model/pool.h"
#include "cluster/model/sample.h"
#include "cluster/runtime/pipeline/stream.h"
#include "comm/batch.h"

#include <stdint.h>

typedef struct tail tail;

typedef struct tail_config {
    const model *m;          /* borrowed: holds the output weights */
    sample_params sample;
    sample_ngram ngram;
    uint64_t seed;
    uint32_t max_streams;
    uint32_t max_rows;       /* rows per micro-batch */
    pool *pool;              /* borrowed, may be NULL */
} tail_config;

pd_status tail_new(const tail_config *cfg, tail **out, pd_err *err);
void tail_free(tail *t);

pd_status tail_admit(tail *t, const mb_admit *a, pd_err *err);
void tail_retire(tail *t, uint64_t stream);
/* Admits a stream restored from a checkpoint with its sampled history
 * (tokens, digest) copied from s, so sampling continues exactly. */
pd_status tail_restore(tail *t, const stream_state *s, pd_err *err);

/* For rows with wants_logits (in row order): logits of x's row, sample.
 * x [n x hidden] is read only. tokens gets one token per logits row and
 * row_digests the digest_f32 of that logits row (the exact bits the token
 * was sampled from; the head chains them into the page's digest);
 * *n_tokens their count. Verify rows: a draft (the row's token) is accepted
 * iff it equals the token sampled from the stream's row before; the rows of
 * that stream after a rejection get MSG_TOKEN_REJECTED and digest 0 and
 * change nothing (only accepted tokens enter the history). Verify rows
 * that open their stream's rows in the batch (asynchronous speculation)
 * stand only if the first carries the stream's last sampled token at that
 * token's position, the stream not ended; else all of them are rejected. */
pd_status tail_sample(tail *t, const mb_row *rows, uint32_t n, const float *x, uint32_t *tokens,
                      uint64_t *row_digests, uint32_t *n_tokens, pd_err *err);

#endif
