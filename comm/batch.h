/* The rows of a micro-batch as every stage sees them (types only; the byte
 * encoding between ranks lives in comm/msg.h).
 *
 * A micro-batch is a set of rows; each row is one position of one stream.
 * Rows of a stream are contiguous and in increasing position order; a row's
 * absolute position drives rollback: a stage holding a stream's state beyond
 * it rolls back first (ARCHITECTURE.md §2). */
#ifndef PD_BATCH_H
#define PD_BATCH_H

#include <stdint.h>

typedef enum mb_role {
    MB_ROLE_PREFILL = 0, /* a prompt / embedding row */
    MB_ROLE_DECODE = 1,  /* a generated token */
    MB_ROLE_VERIFY = 2,  /* a speculative draft token */
    MB_ROLE_COUNT
} mb_role;

typedef struct mb_row {
    uint64_t stream;      /* stream id (the head's admission counter) */
    uint64_t pos;         /* absolute position */
    uint8_t role;         /* mb_role */
    uint8_t wants_logits; /* the tail computes logits and samples for this row */
    uint32_t token;       /* decode / verify: the token this row feeds (a verify row's
                           * is its draft: the tail accepts it iff it equals the token
                           * sampled from the row before); prefill: 0 */
} mb_row;

/* Admission of a stream, announced on the micro-batch header before its first row. */
typedef struct mb_admit {
    uint64_t stream;
    uint32_t prefill_rows; /* reference rows (ring capacity) */
    uint32_t max_new;      /* generated tokens at most */
    uint64_t sample_key;   /* the page's sampling key (the tail seeds per (seed, key, token index)) */
} mb_admit;

#endif
