/* xport: send-buffer ring, pre-posted receives and traffic counters of one
 * rank (contract in xport.h). */
#include "cluster/runtime/pipeline/xport.h"

#include "base/check.h"

#include <stdlib.h>

struct xport {
    pipe_link *p;
    xport_peers peers;
    xport_counters cnt;
    uint8_t **sbuf;       /* [n_send] of send_cap bytes */
    MPI_Request *sreq;    /* [n_send] */
    uint32_t n_send, next_send;
    bool settle;          /* xport_settle_sends */
    size_t send_cap;
    uint8_t *rbuf[2];     /* recv_cap bytes each */
    MPI_Request rreq[2];
    size_t recv_cap;
    uint32_t cur;         /* the receive xport_wait_next completes next */
    pd_status progress_st; /* first failure seen by xport_progress */
    pd_err progress_err;
};

pd_status xport_new(pipe_link *p, size_t send_cap, uint32_t n_send, xport **out, pd_err *err)
{
    xport *x = calloc(1, sizeof *x);
    if (!x)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory for the transport");
    int rank = pipe_rank(p), size = pipe_size(p);
    x->p = p;
    x->peers = (xport_peers){.rank = rank,
                             .size = size,
                             .prev = rank > 0 ? rank - 1 : -1,
                             .next = rank + 1 < size ? rank + 1 : -1,
                             .head = 0,
                             .tail = size - 1};
    x->n_send = n_send;
    x->send_cap = send_cap;
    x->rreq[0] = x->rreq[1] = MPI_REQUEST_NULL;
    x->sbuf = calloc(n_send, sizeof *x->sbuf);
    x->sreq = calloc(n_send, sizeof *x->sreq);
    if (!x->sbuf || !x->sreq) {
        xport_free(x);
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory for message buffers");
    }
    for (uint32_t i = 0; i < n_send; i++) {
        x->sreq[i] = MPI_REQUEST_NULL;
        if (!(x->sbuf[i] = malloc(send_cap))) {
            xport_free(x);
            return pd_err_set(err, PD_ERR_NOMEM, "out of memory for %u message buffers of %zu bytes", n_send,
                              send_cap);
        }
    }
    *out = x;
    return PD_OK;
}

void xport_free(xport *x)
{
    if (!x)
        return;
    for (uint32_t i = 0; x->sbuf && i < x->n_send; i++)
        free(x->sbuf[i]);
    free(x->sbuf);
    free(x->sreq);
    free(x->rbuf[0]);
    free(x->rbuf[1]);
    free(x);
}

void xport_settle_sends(xport *x, bool on)
{
    x->settle = on;
}

const xport_peers *xport_peers_get(const xport *x)
{
    return &x->peers;
}

const xport_counters *xport_counters_get(const xport *x)
{
    return &x->cnt;
}

size_t xport_send_cap(const xport *x)
{
    return x->send_cap;
}

pd_status xport_agree_caps(xport *x, pd_err *err)
{
    double most = (double)x->send_cap;
    pd_status st = pipe_max_double(x->p, most, &most, err);
    if (st)
        return st;
    x->recv_cap = (size_t)most;
    for (int k = 0; k < 2; k++)
        if (!(x->rbuf[k] = malloc(x->recv_cap)))
            return pd_err_set(err, PD_ERR_NOMEM, "out of memory for %zu-byte receive buffers", x->recv_cap);
    return PD_OK;
}

pd_status xport_sendbuf(xport *x, uint8_t **buf, uint32_t *slot, pd_err *err)
{
    uint32_t i = x->next_send;
    x->next_send = (x->next_send + 1) % x->n_send;
    pd_status st = pipe_wait(x->p, &x->sreq[i], &x->cnt.wait_send_s, err);
    if (st)
        return st;
    *buf = x->sbuf[i];
    *slot = i;
    return PD_OK;
}

pd_status xport_send(xport *x, int dest, uint32_t slot, size_t len, pd_err *err)
{
    CHECK(slot < x->n_send && len <= x->send_cap && dest >= 0 && dest < x->peers.size);
    pd_status st = pipe_isend(x->p, dest, x->sbuf[slot], len, &x->sreq[slot], err);
    if (st)
        return st;
    x->cnt.messages_sent += 1;
    x->cnt.bytes_sent += (double)len;
    return x->settle ? pipe_wait(x->p, &x->sreq[slot], &x->cnt.wait_send_s, err) : PD_OK;
}

pd_status xport_recv(xport *x, int src, const uint8_t **buf, size_t *len, pd_err *err)
{
    int from;
    pd_status st = pipe_recv(x->p, src, x->rbuf[0], x->recv_cap, len, &from, &x->cnt.wait_input_s, err);
    if (st == PD_ERR_STALLED)
        pd_err_prefix(err, "rank %d, waiting for results from the tail", x->peers.rank);
    if (st)
        return st;
    *buf = x->rbuf[0];
    return PD_OK;
}

pd_status xport_post_prev(xport *x, pd_err *err)
{
    CHECK(x->peers.prev >= 0);
    for (int k = 0; k < 2; k++) {
        pd_status st = pipe_irecv(x->p, x->peers.prev, x->rbuf[k], x->recv_cap, &x->rreq[k], err);
        if (st)
            return st;
    }
    x->cur = 0;
    return PD_OK;
}

pd_status xport_wait_next(xport *x, const uint8_t **buf, size_t *len, pd_err *err)
{
    int from;
    pd_status st = pipe_wait_recv(x->p, &x->rreq[x->cur], len, &from, &x->cnt.wait_input_s, err);
    if (st == PD_ERR_STALLED)
        pd_err_prefix(err, "rank %d, waiting for rank %d (the previous stage)", x->peers.rank, x->peers.prev);
    if (st)
        return st;
    *buf = x->rbuf[x->cur];
    return PD_OK;
}

pd_status xport_repost(xport *x, pd_err *err)
{
    pd_status st = pipe_irecv(x->p, x->peers.prev, x->rbuf[x->cur], x->recv_cap, &x->rreq[x->cur], err);
    x->cur ^= 1;
    return st;
}

pd_status xport_cancel_other(xport *x, pd_err *err)
{
    return pipe_cancel_recv(x->p, &x->rreq[x->cur ^ 1], err);
}

void xport_progress(void *ctx)
{
    xport *x = ctx;
    pd_err e = {0};
    pd_status st = pipe_progress(x->p, (int)x->n_send, x->sreq, &e);
    if (st && x->progress_st == PD_OK) {
        x->progress_st = st;
        x->progress_err = e;
    }
}

pd_status xport_flush(xport *x, pd_err *err)
{
    if (x->progress_st) {
        *err = x->progress_err;
        return x->progress_st;
    }
    for (uint32_t i = 0; i < x->n_send; i++) {
        pd_status st = pipe_wait(x->p, &x->sreq[i], &x->cnt.wait_send_s, err);
        if (st)
            return st;
    }
    return PD_OK;
}
