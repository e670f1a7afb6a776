/* follow: the stage / tail loop of ranks 1..N-1 (contract in follow.h). */
#include "cluster/runtime/loop/follow.h"

#include "cluster/runtime/rank/signals.h"

#include <stdlib.h>
#include <string.h>

/* Decode buffers for one batch message, sized by the rank's limits. */
typedef struct follow_bufs {
    msg_batch in;
} follow_bufs;

static pd_status follow_bufs_new(const rank *r, follow_bufs *b, pd_err *err)
{
    b->in = (msg_batch){.admit = calloc(r->sz.max_streams, sizeof(mb_admit)),
                        .retire = calloc(r->sz.max_streams, sizeof(uint64_t)),
                        .rows = calloc(r->sz.max_rows, sizeof(mb_row)),
                        .x = malloc((size_t)r->sz.max_rows * r->hp.hidden * sizeof(float))};
    if (!b->in.admit || !b->in.retire || !b->in.rows || !b->in.x)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory for message buffers");
    return PD_OK;
}

static void follow_bufs_free(follow_bufs *b)
{
    free(b->in.admit);
    free(b->in.retire);
    free(b->in.rows);
    free(b->in.x);
}

/* Forwards a message as received (stop, drain) to the next stage. */
static pd_status follow_pass_on(rank *r, const uint8_t *in, size_t len, pd_err *err)
{
    uint8_t *buf;
    uint32_t slot;
    pd_status st = xport_sendbuf(r->x, &buf, &slot, err);
    if (st)
        return st;
    memcpy(buf, in, len);
    return xport_send(r->x, xport_peers_get(r->x)->next, slot, len, err);
}

static pd_status follow_batch(rank *r, const run_hooks *hk, msg_batch *b, pd_err *err)
{
    const xport_peers *pe = xport_peers_get(r->x);
    pd_status st;
    uint32_t add = 0;
    if ((st = rank_lifecycle(r, b->admit, b->n_admit, b->retire, b->n_retire, err)) ||
        (st = rank_forward(r, b->rows, b->n_rows, b->x, err)) ||
        (hk->progress && (st = hk->progress(hk->ctx, b->flags, &add, err))))
        return st;
    uint8_t *buf;
    uint32_t slot;
    size_t len;
    if (r->is_tail) {
        uint32_t nt = 0;
        if ((st = rank_sample(r, b->rows, b->n_rows, b->x, &nt, err)) ||
            (st = xport_sendbuf(r->x, &buf, &slot, err)) ||
            (st = msg_encode_results(b->seq, b->flags | sig_take() | add, r->tokens, r->digests, nt, buf,
                                     xport_send_cap(r->x), &len, err)))
            return st;
        return xport_send(r->x, pe->head, slot, len, err);
    }
    if ((st = xport_sendbuf(r->x, &buf, &slot, err)))
        return st;
    msg_batch out = *b;
    out.dtype = r->o->wire_dtype;
    out.flags = b->flags | sig_take() | add; /* this rank's signals travel on towards the head */
    if ((st = msg_encode_batch(&out, buf, xport_send_cap(r->x), &len, err)))
        return st;
    return xport_send(r->x, pe->next, slot, len, err);
}

static pd_status follow_drain(rank *r, const run_hooks *hk, const uint8_t *in, size_t len, uint64_t ran,
                              pd_err *err)
{
    uint64_t step;
    uint32_t action, number;
    pd_status st = msg_decode_drain(in, len, &step, &action, &number, err);
    if (st)
        return st;
    if (step != ran)
        return pd_err_set(err, PD_ERR_FORMAT, "drain point after micro-batch %llu, but this stage ran %llu",
                          (unsigned long long)step, (unsigned long long)ran);
    /* pass it on first: every rank is then at the drain point together */
    if (!r->is_tail && (st = follow_pass_on(r, in, len, err)))
        return st;
    run_drain d = {.step = step, .action = action, .number = number, .rank = r->rank, .size = r->size,
                   .comm = pipe_comm(r->p)};
    st = hk->at_drain ? hk->at_drain(hk->ctx, &d, err) : PD_OK;
    pd_err ae = {0};
    pd_status all = pipe_agree(r->p, st, &ae);
    if (st)
        return st;
    if (all)
        return pd_err_set(err, all, "drain point %u (action %u) failed on another rank", number, action);
    return PD_OK;
}

pd_status follow_loop(rank *r, const run_hooks *hooks, pd_err *err)
{
    static const run_hooks none = {0};
    const run_hooks *hk = hooks ? hooks : &none;
    follow_bufs fb = {0};
    pd_status st = follow_bufs_new(r, &fb, err);
    if (st == PD_OK)
        st = xport_post_prev(r->x, err);
    uint64_t ran = 0;
    while (st == PD_OK) {
        const uint8_t *in;
        size_t len;
        msg_kind kind;
        uint64_t seq;
        pool_park(r->pool); /* the pool's threads sleep while the next batch comes */
        if ((st = xport_wait_next(r->x, &in, &len, err)) || (st = msg_peek(in, len, &kind, &seq, err)))
            break;
        if (kind == MSG_KIND_STOP) {
            /* nothing follows a stop: withdraw the other posted receive */
            if ((st = xport_cancel_other(r->x, err)) == PD_OK && !r->is_tail)
                st = follow_pass_on(r, in, len, err);
            break;
        }
        if (kind == MSG_KIND_DRAIN) {
            if ((st = follow_drain(r, hk, in, len, ran, err)) == PD_OK)
                st = xport_repost(r->x, err);
            continue;
        }
        if (kind != MSG_KIND_BATCH) {
            st = pd_err_set(err, PD_ERR_FORMAT, "unexpected message kind %d from the previous stage", (int)kind);
            break;
        }
        msg_limits lim = {.max_admit = r->sz.max_streams,
                          .max_retire = r->sz.max_streams,
                          .max_rows = r->sz.max_rows,
                          .hidden = r->hp.hidden};
        if ((st = msg_decode_batch(in, len, &lim, &fb.in, err)))
            break;
        if (fb.in.seq != ran) {
            st = pd_err_set(err, PD_ERR_FORMAT, "micro-batch %llu arrived, expected %llu",
                            (unsigned long long)fb.in.seq, (unsigned long long)ran);
            break;
        }
        /* decoded: the buffer takes the message after next */
        if ((st = xport_repost(r->x, err)) || (st = follow_batch(r, hk, &fb.in, err)))
            break;
        ran++;
    }
    follow_bufs_free(&fb);
    return st;
}
