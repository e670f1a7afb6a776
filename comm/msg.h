/* msg: the pipeline's MPI messages, encoded field by field little-endian and
 * decoded through the bounds-checked reader (rd.h). Never a raw struct.
 *
 * Every message starts with a 16-byte header:
 *   0   magic "PDMB"
 *   4   u16 version = 2
 *   6   u8  kind: 1 batch, 2 results, 3 stop, 4 drain
 *   7   u8  dtype of hidden states: 0 f32, 1 f16 (0 for non-batch kinds)
 *   8   u64 seq (micro-batch number)
 * batch (kind 1), head -> next stage -> ... -> tail:
 *   16  u32 n_admit, u32 n_retire, u32 n_rows, u32 hidden, u32 flags (MSG_FLAG_*)
 *   36  n_admit x (u64 stream, u32 prefill_rows, u32 max_new, u64 sample_key)   24 B each
 *       n_retire x u64 stream
 *       n_rows x (u64 stream, u64 pos, u8 role, u8 wants_logits, u16 reserved 0,
 *                 u32 token: the token a decode/verify row feeds, 0 for prefill) 24 B each
 *       n_rows x hidden x (f32 | f16)
 * results (kind 2), tail -> head:
 *   16  u32 n_tokens, u32 flags (MSG_FLAG_*)
 *   24  n_tokens x u32 token (the sampled token of each wants_logits row, in row order;
 *       MSG_TOKEN_REJECTED for a row after a rejected draft: nothing was sampled there)
 *       n_tokens x u64 digest (digest_f32 of the logits row each token was sampled from)
 * stop (kind 3): the header only; travels head -> ... -> tail when the run ends.
 * drain (kind 4), head -> next stage -> ... -> tail, sent when nothing is in
 * flight (seq = the number of micro-batches sent before it, so a stage can
 * check it has run every one of them):
 *   16  u32 action (what every rank runs at the drain point; the runtime's
 *       numbering, cluster/runtime/ops/jobctl.h: 1 checkpoint, 2 checkpoint and
 *       stop, 3 migrate, 4 status gather), u32 drain number (0, 1, ...)
 *       Migration state does not travel in pipeline messages: bundles go
 *       point to point on a communicator of their own (docs/wire.md §9).
 * Every rank forwards it before it runs the action, so all ranks are at the
 * drain point together and the action may use collectives.
 *
 * Rank statistics (gathered to rank 0 at the end of a run; not a pipeline
 * message, its own fixed layout, MSG_STATS_BYTES bytes):
 *   0   magic "PDST", u16 version = 4, u16 field count = 17
 *   8   17 x f64 (IEEE-754 binary64 bits as u64): busy_s, wait_input_s,
 *       wait_send_s, wall_s, messages_sent, bytes_sent, micro_batches, rows,
 *       cache_bytes_peak, attention_bytes_peak, rows_rolled_back,
 *       prefill_rows, decode_rows, prefill_s, decode_s,
 *       stream_cache_bytes_peak, stream_cache_estimate
 *   (version 3 added the prefill / decode split, version 4 the per-stream
 *   cache figures)
 * The decoder checks magic, version, kind, dtype, every count against the
 * bytes that remain and against the receiver's limits, roles, flags,
 * reserved bytes, hidden size, and trailing bytes. */
#ifndef PD_COMM_MSG_H
#define PD_COMM_MSG_H

#include "base/status.h"
#include "comm/batch.h"

#include <stddef.h>
#include <stdint.h>

#define MSG_VERSION 2u /* 2: results carry the logits row digests */
#define MSG_HEADER_BYTES 16u
#define MSG_TOKEN_REJECTED 0xFFFFFFFFu /* results: the row's draft was not accepted */
/* Requests a rank learned of (a signal) on their way to the head, riding on
 * batches (down the pipeline) and results (tail -> head): whichever rank a
 * signal reaches, the head acts on it for every rank. Other bits refused. */
#define MSG_FLAG_CKPT 1u /* checkpoint at the next step boundary and go on */
#define MSG_FLAG_STOP 2u /* checkpoint, then end the run (resumable) */
/* Not a signal: a rank the message passed still had live-migration pre-copy
 * work (the head waits for a result without it before the switch). */
#define MSG_FLAG_BUSY 4u
#define MSG_FLAGS_KNOWN (MSG_FLAG_CKPT | MSG_FLAG_STOP | MSG_FLAG_BUSY)

typedef enum msg_kind {
    MSG_KIND_BATCH = 1,
    MSG_KIND_RESULTS = 2,
    MSG_KIND_STOP = 3,
    MSG_KIND_DRAIN = 4,
    MSG_KIND_END_ /* one past the last kind */
} msg_kind;
typedef enum msg_dtype { MSG_DTYPE_F32 = 0, MSG_DTYPE_F16 = 1, MSG_DTYPE_COUNT } msg_dtype;

/* A batch message's content. For encoding the arrays are read; for decoding
 * they are caller-preallocated with the capacities in msg_limits. */
typedef struct msg_batch {
    uint64_t seq;
    msg_dtype dtype;
    uint32_t hidden;
    uint32_t n_admit, n_retire, n_rows;
    uint32_t flags; /* MSG_FLAG_* */
    mb_admit *admit;
    uint64_t *retire;
    mb_row *rows;
    float *x; /* [n_rows x hidden] */
} msg_batch;

typedef struct msg_limits {
    uint32_t max_admit, max_retire, max_rows, max_tokens;
    uint32_t hidden; /* the receiver's hidden size: must match */
} msg_limits;

/* Exact encoded size of a batch / results message. */
size_t msg_batch_bytes(const msg_batch *b);
size_t msg_results_bytes(uint32_t n_tokens);

/* Encode into buf[0..cap) (cap >= the size above); returns bytes written in *len. */
pd_status msg_encode_batch(const msg_batch *b, void *buf, size_t cap, size_t *len, pd_err *err);
pd_status msg_encode_results(uint64_t seq, uint32_t flags, const uint32_t *tokens, const uint64_t *digests,
                             uint32_t n, void *buf, size_t cap, size_t *len, pd_err *err);
pd_status msg_encode_stop(uint64_t seq, void *buf, size_t cap, size_t *len, pd_err *err);
pd_status msg_encode_drain(uint64_t seq, uint32_t action, uint32_t number, void *buf, size_t cap, size_t *len,
                           pd_err *err);
#define MSG_DRAIN_BYTES (MSG_HEADER_BYTES + 8u)

/* Reads the header (magic, version, kind, dtype) only. */
pd_status msg_peek(const void *buf, size_t len, msg_kind *kind, uint64_t *seq, pd_err *err);

/* Full decoders: the whole message is validated before *out is written
 * (arrays are filled only on success). */
pd_status msg_decode_batch(const void *buf, size_t len, const msg_limits *lim, msg_batch *out,
                           pd_err *err);
pd_status msg_decode_results(const void *buf, size_t len, const msg_limits *lim, uint64_t *seq, uint32_t *flags,
                             uint32_t *tokens, uint64_t *digests, uint32_t *n, pd_err *err);
pd_status msg_decode_drain(const void *buf, size_t len, uint64_t *seq, uint32_t *action, uint32_t *number,
                           pd_err *err);

/* One rank's counters for the run's report. */
typedef struct msg_stats {
    double busy_s;          /* computing (stage forward, tail sampling) */
    double wait_input_s;    /* waiting for the next message to arrive */
    double wait_send_s;     /* waiting for a send buffer to come free */
    double wall_s;          /* the loop's wall time */
    double messages_sent, bytes_sent;
    double micro_batches, rows;
    double cache_bytes_peak, attention_bytes_peak;
    double rows_rolled_back; /* rows the stage dropped by rollback (speculation) */
    /* The prefill / decode split of rows and busy_s. decode rows are decode
     * and verify rows (rejected drafts included). A micro-batch's forward time
     * goes to prefill_s and decode_s in proportion to its rows of each; the
     * tail's sampling time and micro-batches without rows go to decode_s. prefill_s + decode_s == busy_s
     * up to rounding; prefill_rows + decode_rows == rows. */
    double prefill_rows, decode_rows;
    double prefill_s, decode_s;
    /* The most cache bytes one stream held on this rank (its layers' caches,
     * allocated), and the admission estimate of that same stream
     * (stage_stream_bytes_estimate): equal for caches that allocate their
     * whole capacity up front (rings, windows, kv layers within capacity). */
    double stream_cache_bytes_peak, stream_cache_estimate;
} msg_stats;
#define MSG_STATS_BYTES (8u + 17u * 8u)
void msg_encode_stats(const msg_stats *s, uint8_t out[MSG_STATS_BYTES]);
/* Checks magic, version, field count and length. */
pd_status msg_decode_stats(const void *buf, size_t len, msg_stats *out, pd_err *err);

#endif
