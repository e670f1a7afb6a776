/* sched: the head's scheduler — page queue, admission, micro-batch
 * formation, results, and the finished-page callback.
 *
 * Every step it builds a micro-batch from the streams that are not in flight:
 * one decode row per decoding stream (its last sampled token), then prefill
 * rows of prefilling streams in chunks of at most prefill_chunk rows, within
 * the row budget; then queued pages, in manifest order, are admitted while
 * fewer than max_streams streams are alive and the batch has room for at
 * least one of their rows (the first chunk is cut to the room left). With
 * K micro-batches in flight each takes at most ceil(max_streams / K)
 * streams. A stream is in at most one micro-batch at a time, so several
 * micro-batches can be in flight (one per pipeline stage, plus one).
 * Admissions and retirements ride on the micro-batch header so every stage
 * creates and frees per-stream state in step with the head.
 *
 * The stream protocol — how the head, the stages and the tail keep their
 * per-stream state in agreement (who holds what: stream.h):
 *   1. Admission: the head assigns the next stream id (admission order =
 *      manifest order, skipped pages excluded) and announces (id,
 *      prefill_rows, max_new, page key) on the header of the micro-batch
 *      that carries the stream's first rows. Every stage creates the
 *      stream's caches, the tail its sampling state, before running rows.
 *   2. Rows: a stream's rows in one micro-batch are contiguous, in position
 *      order, and it is in at most one micro-batch in flight — two under
 *      asynchronous speculation, the second made only of verify rows that
 *      continue the first as if all its drafts were accepted (or a new
 *      decode row once the second is known to be refuted). A row's
 *      absolute position is the only rollback signal: a stage holding the
 *      stream beyond it rolls back first (across both batches). Prefill
 *      rows come in chunks; the last prefill row and every decode and
 *      verify row want logits.
 *   3. Results: the tail samples the rows that want logits, in row order,
 *      and returns (token, logits row digest) per row; the head appends each
 *      token and digest to the stream (stream_push) in the same order the
 *      tail did, so the two copies of the sampled history stay equal.
 *   4. Finish: EOS or max_new tokens ends a stream on the head; its
 *      retirement rides on the next micro-batch header, and every stage and
 *      the tail free the stream's state when they apply that header.
 *   5. Micro-batches travel and are applied in the order they were formed;
 *      a drain point (run.h) comes only when none is in flight.
 * The head's stream_state is the authoritative copy: a checkpoint writes it,
 * a restart rebuilds the tail's copy from it.
 *
 * Nothing here depends on MPI or on how many stages run the batch. */
#ifndef PD_SCHED_H
#define PD_SCHED_H

#include "base/status.h"
#include "cluster/model/model.h"
#include "cluster/format/pages.h"
#include "cluster/runtime/spec/draft.h"
#include "cluster/runtime/spec/drafter.h"
#include "cluster/runtime/pipeline/stream.h"
#include "comm/batch.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum sched_stop {
    SCHED_STOP_EOS,
    SCHED_STOP_LENGTH,
    SCHED_STOP_ERROR /* the page failed by itself (error says why); the run goes on */
} sched_stop;

/* A finished page, handed to the on_done callback (tokens borrowed for the
 * duration of the call). tokens exclude the EOS token. */
typedef struct sched_result {
    size_t page;              /* index in the manifest */
    const char *id;
    const uint32_t *tokens;
    uint32_t n_tokens;
    uint64_t prefill_rows;
    sched_stop stop;
    uint64_t digest;          /* digest_chain over the logits row digests of every sampled
                               * token in position order, EOS included (digest.h) */
    const char *error;        /* SCHED_STOP_ERROR: what failed, naming the page and field */
} sched_result;

typedef pd_status (*sched_done_fn)(void *ctx, const sched_result *r, pd_err *err);

/* Admission control (the memory budget): asked before a page becomes a
 * stream, in manifest order. WAIT keeps the page (and every later one)
 * queued until a stream ends; NEVER fails the page by itself with `why`. */
typedef enum sched_admit { SCHED_ADMIT_OK, SCHED_ADMIT_WAIT, SCHED_ADMIT_NEVER } sched_admit;
typedef sched_admit (*sched_admit_fn)(void *ctx, size_t page, uint64_t prefill_rows, uint32_t max_new, char *why,
                                      size_t why_cap);
/* A stream that admit let in has ended (any reason). */
typedef void (*sched_release_fn)(void *ctx, size_t page, uint64_t prefill_rows, uint32_t max_new);

/* Rows [off, off + n) of image segment `seg` of page `page` (its file at
 * path, seg_rows rows in all) into dst [n x hidden]: image rows as the vision
 * encoder makes them, the text pieces it places around them through em's
 * embedding table (the target's, or the draft model's). Failure ends that
 * page alone (its error line says why). */
typedef pd_status (*sched_image_fn)(void *ctx, size_t page, uint32_t seg, const char *path,
                                    uint32_t seg_rows, const model *em, uint32_t off, uint32_t n,
                                    float *dst, pd_err *err);

typedef struct sched_config {
    const pages *pg;          /* borrowed */
    const model *m;           /* borrowed: embeddings (head), hparams */
    uint32_t max_streams;     /* --batch: streams decoding at once */
    uint32_t prefill_chunk;   /* rows of one stream's prefill per micro-batch (0 = whole) */
    uint32_t max_rows;        /* rows a micro-batch can hold (buffer size) */
    uint32_t rows_per_batch;  /* row budget of one micro-batch (0 or > max_rows: max_rows); with
                               * several in flight, about one in-flight share of the streams'
                               * decode rows plus one prefill chunk keeps their costs even */
    const bool *skip;         /* [pages_count] pages already complete, or NULL */
    bool past_context;        /* admit pages whose prefill + max_new_tokens exceed the model's
                               * context_length (else such a page fails by itself at admission) */
    sched_done_fn on_done;
    void *on_done_ctx;
    draft_config draft;       /* speculation (draft.h): verify rows behind decode rows */
    drafter *drafter;         /* borrowed: the draft model when draft.mode is DRAFT_MODEL */
    bool spec_async;          /* asynchronous speculation: a stream whose micro-batch carries
                               * drafts may get a second one in flight, verify rows only,
                               * built as if every draft were accepted (the tail rejects it
                               * when not; the stages roll it back) */
    sched_image_fn image;     /* rows of "image" segments (run --mmproj), NULL: none in the pages */
    void *image_ctx;
    bool (*ready)(void *ctx, size_t page); /* whether a page's input is at hand (its images
                               * encoded): a page that is not waits while other streams decode
                               * (admitted anyway when none does); NULL: always */
    sched_admit_fn admit;     /* NULL: admit whenever a stream slot is free */
    sched_release_fn release;
    void *admit_ctx;
} sched_config;

/* A micro-batch produced by sched_next. All arrays are owned by the sched and
 * valid until the same batch is passed to sched_complete. */
typedef struct sched_batch {
    uint64_t seq;             /* micro-batch number */
    uint32_t slot;            /* the sched's buffer slot (internal) */
    uint32_t n_admit;
    const mb_admit *admit;
    uint32_t n_retire;
    const uint64_t *retire;
    uint32_t n_rows;
    const mb_row *rows;
    float *x;                 /* [n_rows x hidden] input hidden states */
    uint32_t n_logits;        /* rows with wants_logits */
} sched_batch;

typedef struct sched sched;

/* Checkpoints: the authoritative stream table (borrowed), the next stream
 * id; and, before the first sched_next, the streams a resumed run restores
 * (taken over from restored[0..n): their pages are never admitted again). */
stream_table *sched_streams(sched *s);
uint64_t sched_next_id(const sched *s);
pd_status sched_restore(sched *s, stream_state *restored, uint32_t n, uint64_t next_id, pd_err *err);

/* Sets (or replaces) the admission control before the first sched_next. */
void sched_set_admit(sched *s, sched_admit_fn admit, sched_release_fn release, void *ctx);

/* max_inflight: micro-batches that may be out at once (>= 1). */
pd_status sched_new(const sched_config *cfg, uint32_t max_inflight, sched **out, pd_err *err);
void sched_free(sched *s);

/* Forms the next micro-batch. *b->n_rows == 0 (and no admits/retires) means
 * nothing can run until an in-flight batch completes (or everything is done).
 * A page whose embeddings cannot be read any more (the .npy changed or
 * became unreadable after start-up) fails by itself: on_done gets it with
 * SCHED_STOP_ERROR and the message, its stages free it on the next header
 * (or never hear of it, if it was being admitted), and the batch goes on
 * without it. Errors returned: out of memory, or the on_done callback
 * failed; after an error the sched is only fit for sched_free. */
pd_status sched_next(sched *s, sched_batch *b, pd_err *err);

/* Records the tokens sampled for batch b's logits rows, in row order
 * (tokens[n_logits]), and chains each row's logits digest
 * (row_digests[n_logits]) into its page's digest; finishes streams (EOS or
 * max_new_tokens) through on_done, and frees the batch's slot. */
pd_status sched_complete(sched *s, const sched_batch *b, const uint32_t *tokens, const uint64_t *row_digests,
                         pd_err *err);

/* True when every page is finished and nothing is in flight or pending
 * retirement. */
bool sched_finished(const sched *s);

typedef struct sched_progress {
    uint64_t pages_total, pages_done, pages_skipped;
    uint64_t tokens_generated, prefill_rows; /* tokens sampled, EOS included (it costs a step) */
    uint64_t pages_failed;    /* finished with SCHED_STOP_ERROR (counted in pages_done too) */
    uint64_t pages_past_context; /* admitted past the model's context (past_context) */
    uint64_t drafted, accepted, spec_passes; /* speculation: drafts sent, accepted, passes that carried drafts */
    uint64_t stale_rows;      /* asynchronous speculation: verify rows sent on an assumption a
                               * result then refuted (the stages rolled them back) */
    uint32_t streams_alive;
    uint64_t images_encoded;  /* run --mmproj: page images encoded (filled by the head, loop/pageimg.h) */
    uint64_t images_counted;  /* ... row counts the head ran at load: distinct image sizes (pageimg_counted) */
    double images_wait_s;     /* ... with encoder ranks: the head waiting for rows (pageimg_wait_s) */
    uint64_t images_waits;
    uint64_t images_head;     /* ... with encoder ranks: images the head encoded itself, in */
    double images_head_s;     /* images_head_s seconds (pageimg_encoded_head) */
    uint64_t draft_rows, draft_proposals; /* --draft model: rows the draft model ran, streams it
                               * proposed for (filled by the head, spec/drafter.h) */
} sched_progress;
void sched_get_progress(const sched *s, sched_progress *out);

#endif
