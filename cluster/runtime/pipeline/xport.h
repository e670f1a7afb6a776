/* xport: one rank's pipeline traffic — who its neighbours are, the ring of
 * send buffers, the receive buffers, and the counters of what it sent and
 * how long it waited. Bytes only: message contents are comm/msg's.
 *
 * Owns: n_send buffers of send_cap bytes (each free again once its Isend
 * completed), two receive buffers of recv_cap bytes, their MPI requests.
 * Borrows the pipe_link.
 *
 * INV: a send buffer is written only after its previous Isend completed
 *      (xport_sendbuf waits for it); a posted receive buffer is read only
 *      after xport_wait_next completed it.
 * INV: recv_cap >= the largest message any rank may send (xport_agree_caps
 *      sets it collectively), so a pre-posted receive is never truncated. */
#ifndef PD_RUNTIME_XPORT_H
#define PD_RUNTIME_XPORT_H

#include "base/status.h"
#include "comm/pipe.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Ranks this rank talks to: prev/next in the pipeline (-1 at the ends), the
 * head (rank 0) and the tail (rank size - 1). */
typedef struct xport_peers {
    int rank, size;
    int prev, next, head, tail;
} xport_peers;

typedef struct xport_counters {
    double wait_input_s, wait_send_s;
    double messages_sent, bytes_sent;
} xport_counters;

typedef struct xport xport;

/* n_send send buffers of send_cap bytes. Receive buffers come with
 * xport_agree_caps. Returns owned *out (xport_free). */
pd_status xport_new(pipe_link *p, size_t send_cap, uint32_t n_send, xport **out, pd_err *err);
/* Completes outstanding sends is the caller's job (xport_flush); frees. */
void xport_free(xport *x);

const xport_peers *xport_peers_get(const xport *x);
const xport_counters *xport_counters_get(const xport *x);
size_t xport_send_cap(const xport *x);

/* Collective: every rank's receive buffers hold the largest send_cap of all
 * ranks (ranks started with different options size theirs differently). */
pd_status xport_agree_caps(xport *x, pd_err *err);

/* A free send buffer of xport_send_cap bytes (waits for the oldest send when
 * all are in use); *slot names it for xport_send. */
pd_status xport_sendbuf(xport *x, uint8_t **buf, uint32_t *slot, pd_err *err);
/* Stages taking turns: every xport_send completes its send before it
 * returns. The sender has nothing else to do, and a large message moves
 * only while both ends are in MPI: a sender asleep in its next wait would
 * hold the woken receiver up (pipe_bells_open). */
void xport_settle_sends(xport *x, bool on);
/* Starts sending len bytes of buffer slot to dest (and, with
 * xport_settle_sends, finishes). */
pd_status xport_send(xport *x, int dest, uint32_t slot, size_t len, pd_err *err);

/* Receives the next message from src into the first receive buffer
 * (blocking); *buf stays valid until the next receive. */
pd_status xport_recv(xport *x, int src, const uint8_t **buf, size_t *len, pd_err *err);

/* Followers: keeps two receives from prev posted, so the next message
 * arrives while this one is computed. xport_post_prev posts both;
 * xport_wait_next completes the oldest (*buf valid until xport_repost);
 * xport_repost posts it again once its bytes were decoded;
 * xport_cancel_other withdraws the other (nothing may follow a stop). */
pd_status xport_post_prev(xport *x, pd_err *err);
pd_status xport_wait_next(xport *x, const uint8_t **buf, size_t *len, pd_err *err);
pd_status xport_repost(xport *x, pd_err *err);
pd_status xport_cancel_other(xport *x, pd_err *err);

/* Lets MPI move the outstanding sends (a stage calls it between GEMMs;
 * void * for the stage's callback type). Failures are kept and returned by
 * the next xport_flush. */
void xport_progress(void *x);

/* Waits for every outstanding send. */
pd_status xport_flush(xport *x, pd_err *err);

#endif
