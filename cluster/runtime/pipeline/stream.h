/* stream: everything about one page-stream that is not attention cache —
 * which page it decodes, how far its prefill has gone, what it generated,
 * its sampling key and its logit digest so far — as one type with one owner
 * table and one byte encoding, so a checkpoint or a migration carries a
 * stream without reaching into the scheduler, the stages and the tail.
 *
 * Who holds what (the stream protocol; sched.h has the message-level rules):
 *   head (sched)  a stream_table: the authoritative state of every stream;
 *   tail          a stream_table of the same type: key, max_new and the
 *                 sampled tokens (the n-gram ban's history and the sampling
 *                 index) — the same values the head has for those fields;
 *   every stage   the stream's cache containers (stage.h), keyed by id; its
 *                 position is the caches' depth.
 * Sampling has no other state: the random draw of token i is a pure function
 * of (seed, key, i) (sample.h), so tokens + key restore a sampler exactly.
 *
 * Encoding (little-endian, through comm/rd; version 1):
 *   0   magic "PDSS", u16 version = 1, u16 reserved 0
 *   8   u64 id, u64 page (index in the manifest), u64 key,
 *       u64 prefill_rows, u64 fed, u32 max_new, u32 n_tokens, u64 digest,
 *       u32 id_len, id_len bytes of page id (UTF-8, not NUL-terminated),
 *       n_tokens x u32 token
 * The decoder checks magic, version, reserved, fed <= prefill_rows,
 * n_tokens <= max_new + 1 (+1: the EOS that ended it), tokens only after the
 * whole prefill was fed, key == FNV-1a 64 of the id, the limits the caller
 * gives, every count against the bytes that remain, trailing bytes; and
 * writes nothing on failure.
 *
 * INV (stream_check): fed <= prefill_rows; n_tokens <= max_new + 1 and
 *      tokens has room for max_new + 1; n_tokens > 0 only when fed ==
 *      prefill_rows; key == sample_page_key(page_id) when page_id is set.
 *      Only states with a page_id are encoded (the head's). */
#ifndef PD_RUNTIME_STREAM_H
#define PD_RUNTIME_STREAM_H

#include "base/status.h"
#include "comm/rd.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define STREAM_VERSION 1u
#define STREAM_MAX_ID 4096u /* page id bytes a record may carry */

typedef struct stream_state {
    uint64_t id;           /* stream id: the head's admission counter */
    uint64_t page;         /* index of the page in the manifest */
    char *page_id;         /* owned, NUL-terminated; NULL on the tail (stream_init_keyed) */
    uint64_t key;          /* sampling key: FNV-1a 64 of page_id */
    uint64_t prefill_rows; /* rows of the page's prefill */
    uint64_t fed;          /* prefill rows sent down the pipeline */
    uint32_t max_new;      /* tokens to generate at most */
    uint32_t n_tokens;     /* tokens sampled so far (EOS included if it came) */
    uint32_t *tokens;      /* owned, room for max_new + 1 */
    uint64_t digest;       /* digest_chain over the logits rows sampled so far */
} stream_state;

/* Fills s for a newly admitted page (tokens allocated, digest at its chain's
 * start). PD_ERR_NOMEM, PD_ERR_ARG (id too long or empty). */
pd_status stream_init(stream_state *s, uint64_t id, uint64_t page, const char *page_id, uint64_t prefill_rows,
                      uint32_t max_new, pd_err *err);
/* The tail's copy: it knows a stream by id and key (the admission header
 * carries no page id), so page_id stays NULL and page/prefill_rows 0. */
pd_status stream_init_keyed(stream_state *s, uint64_t id, uint64_t key, uint32_t max_new, pd_err *err);
/* Frees what s owns and zeroes it; safe on a zeroed state. */
void stream_release(stream_state *s);
/* Aborts (CHECK) on a broken invariant. */
void stream_check(const stream_state *s);

/* Records a sampled token and its logits row digest. PD_ERR_RANGE past
 * max_new + 1 tokens (state unchanged). */
pd_status stream_push(stream_state *s, uint32_t token, uint64_t row_digest, pd_err *err);

/* Exact encoded size, and the encoding written into w. */
size_t stream_encoded_size(const stream_state *s);
pd_status stream_encode(const stream_state *s, wr *w);

typedef struct stream_limits {
    uint32_t max_new;       /* largest max_new accepted */
    uint64_t max_prefill;   /* largest prefill_rows accepted */
} stream_limits;
/* Decodes one record from r into *out (fresh: owned fields allocated) after
 * validating all of it; on failure *out is untouched and r's status says
 * where and why. */
pd_status stream_decode(rd *r, const stream_limits *lim, stream_state *out);

/* A fixed-capacity table of streams by id (the head's and the tail's).
 * INV: ids of used entries are distinct; count = used entries. */
typedef struct stream_table stream_table;
pd_status stream_table_new(uint32_t capacity, stream_table **out, pd_err *err);
void stream_table_free(stream_table *t);
uint32_t stream_table_capacity(const stream_table *t);
uint32_t stream_table_count(const stream_table *t);
/* Entry i (0 <= i < capacity) or NULL when unused: for iteration in slot
 * order, which is admission-independent only through the slot reuse rule
 * (lowest free slot first). */
stream_state *stream_table_at(stream_table *t, uint32_t i);
stream_state *stream_table_find(stream_table *t, uint64_t id);
/* Takes over *s (its owned fields) into the lowest free slot; *slot its
 * index. PD_ERR_ARG duplicate id, PD_ERR_RANGE full (s untouched). */
pd_status stream_table_put(stream_table *t, stream_state *s, uint32_t *slot, pd_err *err);
/* Releases the entry of id (no-op when absent). */
void stream_table_drop(stream_table *t, uint64_t id);

#endif
