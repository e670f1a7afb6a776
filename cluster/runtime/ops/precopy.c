/* precopy: pre-copy of a live layer migration (contract in precopy.h). */
#include "cluster/runtime/ops/precopy.h"

#include "base/check.h"
#include "comm/crc32c.h"
#include "comm/kv_chunk.h"
#include "comm/pipe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Every message: this envelope, then (CHUNK) a kv chunk.
 *   0  4  magic "PDPC"      4  4  u32 type (1 chunk, 2 end)
 *   8  4  u32 the stream's prefill rows   12 4  u32 its max new tokens
 *   16 4  u32 status (end: the source's pd_status)   20 4 u32 reserved
 *   24 8  u64 messages sent before this one to this receiver (end) */
#define ENV_BYTES 32u
#define ENV_CHUNK 1u
#define ENV_END 2u
#define N_SEND 4    /* source buffers in flight */
#define N_RECV 4    /* receiver buffers posted */
#define LAG_ROWS 16 /* a source that is this close to its final rows is not busy */

typedef struct pc_src {
    uint32_t layer;
    int peer;
    uint64_t stream;
    uint64_t sent;    /* rows [0, sent) are in the receiver's copy */
    bool used;
} pc_src;

typedef struct pc_copy {
    uint32_t layer;
    uint64_t stream;
    lcache *c;
    bool final;
    bool used;
} pc_copy;

typedef struct pc_buf {
    uint8_t *p;
    MPI_Request req;
} pc_buf;

struct precopy {
    rank *r;
    pipe_link *link;
    bool active, corrupt;
    bool ends_sent;          /* this rank's end marks went out */
    uint64_t *ids, *pos;     /* [max_streams + 1] scratch */
    layermap from, to;
    uint32_t NL;
    /* source */
    pc_src *src;             /* [n_src_cap] */
    uint32_t n_src, n_src_cap;
    pc_buf sb[N_SEND];
    uint32_t sb_next;
    uint64_t *sent_to;       /* [size] messages sent to each rank */
    pd_status src_status;    /* a chunk this rank could not encode */
    pd_err src_err;
    /* receiver */
    pc_copy *cp;             /* [n_cp_cap] */
    uint32_t n_cp, n_cp_cap;
    pc_buf rb[N_RECV];       /* posted in ring order from rb_head */
    uint32_t rb_head;
    bool posted;
    uint64_t *got_from;      /* [size] messages taken from each rank */
    bool *ended;             /* [size] end marks taken */
    pd_status rcv_status;    /* why the copies were dropped */
    pd_err rcv_err;
    uint64_t *dg;            /* [2 NL] per-layer digests as sent / received */
    precopy_stats stats;
};

static void put32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void put64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static uint32_t get32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}
static uint64_t get64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

/* A chunk's digest folded into a layer's: CRC32C over (chunk CRC, length). */
static void fold(uint64_t *d, const uint8_t *chunk, size_t len)
{
    uint8_t b[12];
    memcpy(b, chunk + len - 4, 4);
    put64(b + 4, len);
    uint32_t c = crc32c_update((uint32_t)*d, b, sizeof b);
    *d = (uint64_t)c | (((*d >> 32) + len) & 0xffffffffu) << 32;
}

bool precopy_applies(const rank *r)
{
    return r->o->policy.attn == POLICY_ATTN_FULL && r->o->policy.evict == POLICY_EVICT_NONE;
}

pd_status precopy_new(rank *r, precopy **out, pd_err *err)
{
    precopy *pc = calloc(1, sizeof *pc);
    pd_status st = pc ? PD_OK : pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    if (pc) {
        pc->r = r;
        pc->NL = r->hp.n_layers;
        pc->n_src_cap = pc->n_cp_cap = pc->NL * (r->sz.max_streams + 1);
        pc->src = calloc(pc->n_src_cap, sizeof *pc->src);
        pc->cp = calloc(pc->n_cp_cap, sizeof *pc->cp);
        pc->sent_to = calloc((size_t)r->size, sizeof *pc->sent_to);
        pc->got_from = calloc((size_t)r->size, sizeof *pc->got_from);
        pc->ended = calloc((size_t)r->size, sizeof *pc->ended);
        pc->dg = calloc(2 * (size_t)pc->NL, sizeof *pc->dg);
        pc->ids = calloc(r->sz.max_streams + 1, sizeof *pc->ids);
        pc->pos = calloc(r->sz.max_streams + 1, sizeof *pc->pos);
        if (!pc->src || !pc->cp || !pc->sent_to || !pc->got_from || !pc->ended || !pc->dg || !pc->ids || !pc->pos)
            st = pd_err_set(err, PD_ERR_NOMEM, "out of memory");
        for (int i = 0; i < N_SEND; i++)
            pc->sb[i].req = MPI_REQUEST_NULL;
        for (int i = 0; i < N_RECV; i++)
            pc->rb[i].req = MPI_REQUEST_NULL;
        /* a job that may migrate touches its message buffers now: their
         * first-touch page faults (about 1 GB/s here) would otherwise land
         * in its first pre-copy. Not with zeros: this kernel (6.18) takes
         * zero-filled pages back (the THP shrinker), and the first copy
         * into them faulted again at 1.4 GB/s */
        bool may = r->o->control_path || r->o->rebalance || r->o->n_migrate_at;
        for (int i = 0; st == PD_OK && may && i < N_SEND + N_RECV; i++) {
            uint8_t **b = i < N_SEND ? &pc->sb[i].p : &pc->rb[i - N_SEND].p;
            if (!(*b = malloc(PRECOPY_CHUNK)))
                st = pd_err_set(err, PD_ERR_NOMEM, "pre-copy: out of memory for message buffers");
            else
                memset(*b, 0x5a, PRECOPY_CHUNK);
        }
    }
    /* collective: every rank reaches it whatever failed above */
    pd_status ls = pipe_open(pipe_comm(r->p), pc ? &pc->link : &(pipe_link *){NULL}, err);
    if (st == PD_OK)
        st = ls;
    if (st) {
        precopy_free(pc);
        return st;
    }
    pipe_set_stall_timeout(pc->link, r->o->stall_timeout);
    *out = pc;
    return PD_OK;
}

static void drop_copies(precopy *pc)
{
    for (uint32_t i = 0; i < pc->n_cp; i++)
        lcache_free(pc->cp[i].c);
    memset(pc->cp, 0, sizeof *pc->cp * pc->n_cp_cap);
    pc->n_cp = 0;
}

void precopy_free(precopy *pc)
{
    if (!pc)
        return;
    /* no waiting here (a run that failed may have peers that never answer):
     * withdraw the receives, let go of the sends */
    for (int i = 0; pc->link && i < N_RECV; i++)
        (void)pipe_cancel_recv(pc->link, &pc->rb[i].req, &(pd_err){0});
    for (int i = 0; i < N_SEND; i++) {
        pd_err fe = {0};
        if (pipe_release_send(&pc->sb[i].req, &fe) != PD_OK)
            fprintf(stderr, "pipedec: pre-copy: letting go of a send: %s\n", fe.msg);
    }
    drop_copies(pc);
    for (int i = 0; i < N_SEND; i++)
        free(pc->sb[i].p);
    for (int i = 0; i < N_RECV; i++)
        free(pc->rb[i].p);
    free(pc->src);
    free(pc->cp);
    free(pc->sent_to);
    free(pc->got_from);
    free(pc->ended);
    free(pc->dg);
    free(pc->ids);
    free(pc->pos);
    pipe_close(pc->link);
    free(pc);
}

bool precopy_active(const precopy *pc) { return pc && pc->active; }

void precopy_get_stats(const precopy *pc, precopy_stats *out) { *out = pc->stats; }

/* Ranks that give this rank layers / that this rank gives layers to. */
static bool takes_from(const precopy *pc, uint32_t q)
{
    uint32_t me = (uint32_t)pc->r->rank;
    for (uint32_t L = 0; L < pc->NL; L++)
        if (layermap_owner(&pc->to, L) == me && layermap_owner(&pc->from, L) == q && q != me)
            return true;
    return false;
}

static bool takes_any(const precopy *pc)
{
    for (uint32_t q = 0; q < (uint32_t)pc->r->size; q++)
        if (takes_from(pc, q))
            return true;
    return false;
}

static pd_status post(precopy *pc, pc_buf *b, pd_err *err)
{
    return pipe_irecv(pc->link, MPI_ANY_SOURCE, b->p, PRECOPY_CHUNK, &b->req, err);
}

pd_status precopy_start(precopy *pc, const layermap *to, bool corrupt, pd_err *err)
{
    CHECK(!pc->active);
    rank *r = pc->r;
    pc->from = r->lm;
    pc->to = *to;
    pc->corrupt = corrupt;
    pc->n_src = 0;
    pc->src_status = pc->rcv_status = PD_OK;
    pc->src_err = pc->rcv_err = (pd_err){0};
    memset(pc->sent_to, 0, sizeof *pc->sent_to * (size_t)r->size);
    memset(pc->got_from, 0, sizeof *pc->got_from * (size_t)r->size);
    memset(pc->ended, 0, sizeof *pc->ended * (size_t)r->size);
    memset(pc->dg, 0, 2 * sizeof *pc->dg * pc->NL);
    memset(&pc->stats, 0, sizeof pc->stats);
    pc->stats.started = MPI_Wtime();
    for (int i = 0; i < N_SEND; i++)
        if (!pc->sb[i].p && !(pc->sb[i].p = malloc(PRECOPY_CHUNK)))
            return pd_err_set(err, PD_ERR_NOMEM, "pre-copy: out of memory for send buffers");
    pc->posted = takes_any(pc);
    for (int i = 0; pc->posted && i < N_RECV; i++) {
        if (!pc->rb[i].p && !(pc->rb[i].p = malloc(PRECOPY_CHUNK)))
            return pd_err_set(err, PD_ERR_NOMEM, "pre-copy: out of memory for receive buffers");
        pd_status st = post(pc, &pc->rb[i], err);
        if (st)
            return st;
    }
    pc->rb_head = 0;
    pc->ends_sent = false;
    pc->active = true;
    return PD_OK;
}

/* ---- source ------------------------------------------------------------------ */

static pc_src *src_entry(precopy *pc, uint32_t layer, uint64_t stream)
{
    for (uint32_t i = 0; i < pc->n_src; i++)
        if (pc->src[i].used && pc->src[i].layer == layer && pc->src[i].stream == stream)
            return &pc->src[i];
    for (uint32_t i = 0; i < pc->n_src_cap; i++)
        if (!pc->src[i].used) {
            pc->src[i] = (pc_src){.layer = layer, .stream = stream, .peer = (int)layermap_owner(&pc->to, layer), .used = true};
            if (i >= pc->n_src)
                pc->n_src = i + 1;
            return &pc->src[i];
        }
    return NULL;
}

/* A free send buffer (waits for the oldest send when all are in flight). */
static pd_status send_buffer(precopy *pc, bool wait, pc_buf **out, pd_err *err)
{
    for (int k = 0; k < N_SEND; k++) {
        pc_buf *b = &pc->sb[(pc->sb_next + (uint32_t)k) % N_SEND];
        if (b->req != MPI_REQUEST_NULL) {
            pd_status st = pipe_progress(pc->link, 1, &b->req, err);
            if (st)
                return st;
        }
        if (b->req == MPI_REQUEST_NULL) {
            pc->sb_next = (pc->sb_next + (uint32_t)k + 1) % N_SEND;
            *out = b;
            return PD_OK;
        }
    }
    *out = NULL;
    if (!wait)
        return PD_OK;
    pc_buf *b = &pc->sb[pc->sb_next];
    pd_status st = pipe_wait(pc->link, &b->req, NULL, err);
    if (st)
        return st;
    pc->sb_next = (pc->sb_next + 1) % N_SEND;
    *out = b;
    return PD_OK;
}

static void envelope(uint8_t *p, uint32_t type, uint32_t prefill, uint32_t max_new, uint32_t status, uint64_t count)
{
    memcpy(p, "PDPC", 4);
    put32(p + 4, type);
    put32(p + 8, prefill);
    put32(p + 12, max_new);
    put32(p + 16, status);
    put32(p + 20, 0);
    put64(p + 24, count);
}

/* The rows of e's container that no rollback can touch any more. */
static uint64_t final_rows(lcache *c)
{
    kv_layer *kv = lcache_kv(c);
    uint64_t pos = lcache_position(c), lim = lcache_rollback_limit(c), base = kv_layer_base(kv);
    uint64_t fin = pos > lim ? pos - lim : 0;
    fin = fin > base ? fin - base : 0;
    return fin < kv_layer_rows(kv) ? fin : kv_layer_rows(kv);
}

/* Sends one chunk of e: rows [e->sent, e->sent + n) (FINAL: with the
 * importance and records). A failure to encode is recorded, not returned. */
static pd_status send_chunk(precopy *pc, pc_src *e, lcache *c, uint64_t n, uint32_t flags, bool wait, bool *sent,
                            pd_err *err)
{
    rank *r = pc->r;
    *sent = false;
    double t0 = MPI_Wtime();
    pc_buf *b;
    pd_status st = send_buffer(pc, wait, &b, err);
    if (st || !b)
        return st;
    kv_layer *kv = lcache_kv(c);
    if (e->sent == 0)
        flags |= KV_CHUNK_RESET;
    uint32_t prefill = 0, max_new = 0;
    size_t len = 0;
    pd_err le = {0};
    pd_status es = stage_stream_shape(r->st, e->stream, &prefill, &max_new, &le);
    if (es == PD_OK)
        es = kv_chunk_encode(kv, stage_layer_identity(r->st, e->layer), e->layer, e->stream, e->sent, n, flags,
                             b->p + ENV_BYTES, PRECOPY_CHUNK - ENV_BYTES, &len, &le);
    if (es) {
        if (pc->src_status == PD_OK) {
            pc->src_status = es;
            pc->src_err = le;
            pd_err_prefix(&pc->src_err, "rank %d: pre-copy of layer %u stream %llu", r->rank, e->layer,
                          (unsigned long long)e->stream);
        }
        return PD_OK;
    }
    envelope(b->p, ENV_CHUNK, prefill, max_new, 0, pc->sent_to[e->peer]);
    fold(&pc->dg[e->layer], b->p + ENV_BYTES, len);
    if (pc->corrupt) { /* test hook: after the CRC */
        b->p[ENV_BYTES + len / 2] ^= 0x40;
        pc->corrupt = false;
    }
    if ((st = pipe_isend(pc->link, e->peer, b->p, ENV_BYTES + len, &b->req, err)))
        return st;
    pc->sent_to[e->peer]++;
    kv_layer_mark(kv);
    e->sent += n;
    *sent = true;
    if (flags & KV_CHUNK_FINAL) {
        pc->stats.final_chunks++;
        pc->stats.final_bytes += len;
    } else {
        pc->stats.chunks_sent++;
        pc->stats.bytes_sent += len;
        pc->stats.send_s += MPI_Wtime() - t0;
    }
    return PD_OK;
}

/* Rows of one chunk at most (what fits next to the envelope, header and, for
 * FINAL, the importance of every row). */
static uint64_t rows_per_chunk(kv_layer *kv, uint64_t row0, uint64_t want, uint32_t flags)
{
    size_t one = 0, none = 0;
    pd_err e = {0};
    uint64_t have = kv_layer_rows(kv) - row0;
    if (kv_chunk_size(kv, row0, 0, flags, &none, &e) != PD_OK || (have && kv_chunk_size(kv, row0, 1, flags, &one, &e) != PD_OK))
        return 0;
    size_t room = PRECOPY_CHUNK - ENV_BYTES;
    if (none > room)
        return 0;
    uint64_t per = one > none ? one - none : 1;
    uint64_t n = (room - none) / per;
    return n < want ? n : want;
}

/* One pass over the moving layers: sends what is final and not sent, up to
 * the budget. *busy: something is left. */
static pd_status source_pass(precopy *pc, bool *busy, pd_err *err)
{
    rank *r = pc->r;
    uint32_t me = (uint32_t)r->rank;
    uint64_t *ids = pc->ids;
    uint32_t ns = stage_stream_list(r->st, ids, pc->pos, r->sz.max_streams + 1);
    size_t budget = PRECOPY_BUDGET;
    /* entries of streams that left */
    for (uint32_t i = 0; i < pc->n_src; i++) {
        bool alive = false;
        for (uint32_t j = 0; j < ns && pc->src[i].used; j++)
            alive |= ids[j] == pc->src[i].stream;
        if (!alive)
            pc->src[i].used = false;
    }
    for (uint32_t L = pc->from.first[me]; L < pc->from.first[me] + pc->from.count[me]; L++) {
        if (layermap_owner(&pc->to, L) == me)
            continue;
        for (uint32_t j = 0; j < ns; j++) {
            lcache *c = stage_cache(r->st, ids[j], L);
            if (!c || !lcache_kv(c) || pc->src_status)
                continue;
            pc_src *e = src_entry(pc, L, ids[j]);
            if (!e)
                continue;
            kv_layer *kv = lcache_kv(c);
            if (kv_layer_marked_rows(kv) < e->sent) { /* rows it holds changed: start again */
                e->sent = 0;
                pc->stats.resets++;
            }
            uint64_t fin = final_rows(c);
            while (fin > e->sent && budget > 0) {
                if (fin - e->sent < LAG_ROWS && e->sent > 0)
                    break; /* the switch takes a short rest */
                uint64_t k = rows_per_chunk(kv, e->sent, fin - e->sent, 0);
                if (k == 0)
                    break;
                bool sent;
                pd_status st = send_chunk(pc, e, c, k, 0, false, &sent, err);
                if (st)
                    return st;
                if (!sent)
                    break;
                size_t used = (size_t)k * 4 * r->hp.head_dim * r->hp.n_kv_heads * 2;
                budget = used >= budget ? 0 : budget - used;
            }
            if (fin >= e->sent + LAG_ROWS || (e->sent == 0 && fin > 0))
                *busy = true;
        }
    }
    for (int i = 0; i < N_SEND; i++)
        if (pc->sb[i].req != MPI_REQUEST_NULL) {
            pd_status st = pipe_progress(pc->link, 1, &pc->sb[i].req, err);
            if (st)
                return st;
            *busy |= pc->sb[i].req != MPI_REQUEST_NULL;
        }
    return PD_OK;
}

/* ---- receiver ---------------------------------------------------------------- */

static pc_copy *copy_entry(precopy *pc, uint32_t layer, uint64_t stream, bool create)
{
    for (uint32_t i = 0; i < pc->n_cp; i++)
        if (pc->cp[i].used && pc->cp[i].layer == layer && pc->cp[i].stream == stream)
            return &pc->cp[i];
    if (!create)
        return NULL;
    for (uint32_t i = 0; i < pc->n_cp_cap; i++)
        if (!pc->cp[i].used) {
            pc->cp[i] = (pc_copy){.layer = layer, .stream = stream, .used = true};
            if (i >= pc->n_cp)
                pc->n_cp = i + 1;
            return &pc->cp[i];
        }
    return NULL;
}

static void rcv_fail(precopy *pc, pd_status st, const pd_err *e)
{
    if (pc->rcv_status)
        return;
    pc->rcv_status = st;
    pc->rcv_err = *e;
    drop_copies(pc); /* the memory goes back at once */
}

/* Applies one message from rank `from`. */
static void take(precopy *pc, const uint8_t *m, size_t len, int from)
{
    rank *r = pc->r;
    uint32_t me = (uint32_t)r->rank;
    pd_err e = {0};
    pd_status st = PD_OK;
    if (from < 0 || from >= r->size || !takes_from(pc, (uint32_t)from))
        st = pd_err_set(&e, PD_ERR_FORMAT, "a pre-copy message from rank %d, which gives this rank no layer", from);
    else if (len < ENV_BYTES || memcmp(m, "PDPC", 4) != 0 ||
             (get32(m + 4) != ENV_CHUNK && get32(m + 4) != ENV_END))
        st = pd_err_set(&e, PD_ERR_FORMAT, "a pre-copy message of %zu bytes from rank %d without its envelope", len,
                        from);
    else if (get64(m + 24) != pc->got_from[from])
        st = pd_err_set(&e, PD_ERR_FORMAT, "pre-copy message %llu from rank %d arrived as number %llu",
                        (unsigned long long)get64(m + 24), from, (unsigned long long)pc->got_from[from]);
    if (st == PD_OK)
        pc->got_from[from]++;
    if (st == PD_OK && get32(m + 4) == ENV_END) {
        pc->ended[from] = true;
        if (get32(m + 16) != PD_OK && !pc->rcv_status) {
            st = (pd_status)get32(m + 16);
            pd_err_set(&e, st, "rank %d could not send its layers (its own verdict says why)", from);
        }
    }
    kv_chunk_info in = {0};
    if (st == PD_OK && get32(m + 4) == ENV_CHUNK) {
        const uint8_t *ch = m + ENV_BYTES;
        size_t cl = len - ENV_BYTES;
        st = kv_chunk_peek(ch, cl, &in, &e);
        bool named = st == PD_OK; /* the chunk says which layer and stream it is */
        if (st == PD_OK && (in.layer >= pc->NL || layermap_owner(&pc->to, in.layer) != me ||
                            layermap_owner(&pc->from, in.layer) != (uint32_t)from))
            st = pd_err_set(&e, PD_ERR_FORMAT, "a chunk of layer %u from rank %d, which does not give it here",
                            in.layer, from);
        if (st == PD_OK && in.identity != stage_layer_identity(r->st, in.layer))
            st = pd_err_set(&e, PD_ERR_MISMATCH, "identity %016llx, expected %016llx (another model or policy)",
                            (unsigned long long)in.identity,
                            (unsigned long long)stage_layer_identity(r->st, in.layer));
        if (st == PD_OK)
            fold(&pc->dg[pc->NL + in.layer], ch, cl);
        if (st == PD_OK && !pc->rcv_status) {
            pc_copy *cp = copy_entry(pc, in.layer, in.stream, true);
            if (!cp)
                st = pd_err_set(&e, PD_ERR_RANGE, "more copies than streams");
            if (st == PD_OK && !cp->c) { /* the receiver's cache: allocated (and populated) once */
                double ta = MPI_Wtime();
                st = stage_spare_cache(r->st, get32(m + 8), get32(m + 12), &cp->c, &e);
                pc->stats.alloc_s += MPI_Wtime() - ta;
            }
            kv_layer_config cfg;
            kv_head_state *hs = NULL;
            kv_chunk_view v;
            if (st == PD_OK) {
                lcache_kv_config(cp->c, &cfg);
                if (!lcache_kv(cp->c) || !(hs = calloc(cfg.n_kv_heads, sizeof *hs)))
                    st = pd_err_set(&e, PD_ERR_NOMEM, "out of memory");
            }
            if (st == PD_OK)
                st = kv_chunk_decode(ch, cl, &cfg, hs, &v, &e);
            if (st == PD_OK)
                st = kv_chunk_apply(lcache_kv(cp->c), &v, &e);
            free(hs);
            if (st == PD_OK)
                cp->final = (in.flags & KV_CHUNK_FINAL) != 0;
            /* the receiver's own memory check on what it holds */
            uint64_t lim = r->o->mem_limit;
            if (st == PD_OK && lim != 0 && lim != UINT64_MAX) {
                stage_mem sm;
                stage_memory(r->st, &sm);
                uint64_t held = sm.cache_bytes;
                for (uint32_t i = 0; i < pc->n_cp; i++)
                    if (pc->cp[i].used && pc->cp[i].c) {
                        lcache_mem lm;
                        lcache_memory(pc->cp[i].c, &lm);
                        held += lm.allocated;
                    }
                if (held > lim)
                    st = pd_err_set(&e, PD_ERR_RANGE,
                                    "rank %u: its caches and the copies of the layers arriving hold %llu bytes, past "
                                    "its --mem-limit of %llu",
                                    me, (unsigned long long)held, (unsigned long long)lim);
            }
        }
        if (st && !named)
            pd_err_prefix(&e, "rank %u: pre-copy message %llu from rank %d", me,
                          (unsigned long long)(pc->got_from[from] - 1), from);
        else if (st)
            pd_err_prefix(&e, "rank %u: layer %u stream %llu from rank %d", me, in.layer, (unsigned long long)in.stream,
                          from);
    }
    if (st)
        rcv_fail(pc, st, &e);
}

/* Takes the messages that arrived, oldest posted first; with wait, waits
 * for one. *n: messages taken. */
static pd_status receive(precopy *pc, bool wait, uint32_t max, uint32_t *n, pd_err *err)
{
    *n = 0;
    while (*n < max) {
        pc_buf *b = &pc->rb[pc->rb_head];
        int done = 0, from = -1;
        size_t len = 0;
        pd_status st;
        if (wait) {
            st = pipe_wait_recv(pc->link, &b->req, &len, &from, NULL, err);
            done = 1;
        } else
            st = pipe_test_recv(pc->link, &b->req, &done, &len, &from, err);
        if (st)
            return st;
        if (!done)
            return PD_OK;
        double t0 = MPI_Wtime();
        take(pc, b->p, len, from);
        if (!wait)
            pc->stats.recv_s += MPI_Wtime() - t0;
        if ((st = post(pc, b, err)))
            return st;
        pc->rb_head = (pc->rb_head + 1) % N_RECV;
        (*n)++;
        if (wait)
            return PD_OK;
    }
    return PD_OK;
}

pd_status precopy_progress(precopy *pc, bool *busy, pd_err *err)
{
    *busy = false;
    if (!pc->active)
        return PD_OK;
    pd_status st = source_pass(pc, busy, err);
    if (st == PD_OK && pc->posted) {
        uint32_t n;
        st = receive(pc, false, N_RECV, &n, err);
        *busy |= n == N_RECV; /* more may be waiting */
    }
    return st;
}

/* ---- the switch ---------------------------------------------------------------- */

/* Sends this rank's end marks (once) and takes every message up to each
 * source's end mark; then no message of this pre-copy is in flight. */
static pd_status end_marks(precopy *pc, pd_err *err)
{
    rank *r = pc->r;
    uint32_t me = (uint32_t)r->rank;
    pd_status st = PD_OK;
    for (uint32_t q = 0; q < (uint32_t)r->size && st == PD_OK && !pc->ends_sent; q++) {
        bool gives = false;
        for (uint32_t L = 0; L < pc->NL; L++)
            gives |= layermap_owner(&pc->from, L) == me && layermap_owner(&pc->to, L) == q && q != me;
        if (!gives)
            continue;
        pc_buf *b;
        if ((st = send_buffer(pc, true, &b, err)))
            break;
        envelope(b->p, ENV_END, 0, 0, (uint32_t)pc->src_status, pc->sent_to[q]);
        st = pipe_isend(pc->link, (int)q, b->p, ENV_BYTES, &b->req, err);
        pc->sent_to[q]++;
    }
    pc->ends_sent = true;
    for (uint32_t q = 0; q < (uint32_t)r->size && st == PD_OK && pc->posted; q++)
        while (takes_from(pc, q) && !pc->ended[q] && st == PD_OK) {
            uint32_t n;
            st = receive(pc, true, 1, &n, err);
        }
    for (int i = 0; i < N_SEND && st == PD_OK; i++)
        st = pipe_wait(pc->link, &pc->sb[i].req, NULL, err);
    return st;
}

static bool in_ids(const uint64_t *ids, uint32_t n, uint64_t id)
{
    for (uint32_t i = 0; i < n; i++)
        if (ids[i] == id)
            return true;
    return false;
}

pd_status precopy_finish(precopy *pc, const uint64_t *ids, uint32_t n_ids, uint64_t *dg, pd_status *local,
                         pd_err *why, pd_err *err)
{
    CHECK(pc->active);
    rank *r = pc->r;
    uint32_t me = (uint32_t)r->rank;
    pd_status st = PD_OK;
    /* sources: the rest of every stream of the plan, then the end marks */
    for (uint32_t L = pc->from.first[me]; L < pc->from.first[me] + pc->from.count[me] && st == PD_OK; L++) {
        if (layermap_owner(&pc->to, L) == me)
            continue;
        for (uint32_t j = 0; j < n_ids && st == PD_OK && pc->src_status == PD_OK; j++) {
            lcache *c = stage_cache(r->st, ids[j], L);
            pc_src *e = c ? src_entry(pc, L, ids[j]) : NULL;
            if (!c || !e || !lcache_kv(c)) {
                pd_err_set(&pc->src_err, PD_ERR_NOMEM, "rank %u: layer %u stream %llu has no pre-copy entry", me, L,
                           (unsigned long long)ids[j]);
                pc->src_status = PD_ERR_NOMEM;
                break;
            }
            kv_layer *kv = lcache_kv(c);
            if (kv_layer_marked_rows(kv) < e->sent) {
                e->sent = 0;
                pc->stats.resets++;
            }
            for (;;) {
                uint64_t rest = kv_layer_rows(kv) - e->sent;
                uint64_t k = rows_per_chunk(kv, e->sent, rest, KV_CHUNK_FINAL);
                uint32_t flags = k == rest ? KV_CHUNK_FINAL : 0;
                if (!flags)
                    k = rows_per_chunk(kv, e->sent, rest, 0);
                if (k == 0 && !flags) {
                    pd_err_set(&pc->src_err, PD_ERR_RANGE,
                               "rank %u: layer %u stream %llu: its importance does not fit in a %zu-byte message", me,
                               L, (unsigned long long)ids[j], PRECOPY_CHUNK);
                    pc->src_status = PD_ERR_RANGE;
                    break;
                }
                bool sent;
                if ((st = send_chunk(pc, e, c, k, flags, true, &sent, err)) || !sent || flags)
                    break;
            }
        }
    }
    if (st == PD_OK)
        st = end_marks(pc, err);
    if (st)
        return st;
    /* a complete copy of every (layer, stream) taken */
    pd_status v = pc->src_status ? pc->src_status : pc->rcv_status;
    *why = pc->src_status ? pc->src_err : pc->rcv_err;
    for (uint32_t L = pc->to.first[me]; v == PD_OK && L < pc->to.first[me] + pc->to.count[me]; L++) {
        if (layermap_owner(&pc->from, L) == me)
            continue;
        for (uint32_t j = 0; j < n_ids && v == PD_OK; j++) {
            pc_copy *cp = copy_entry(pc, L, ids[j], false);
            if (!cp || !cp->final)
                v = pd_err_set(why, PD_ERR_FORMAT, "rank %u: layer %u stream %llu: the pre-copy ended without its "
                               "final rows", me, L, (unsigned long long)ids[j]);
        }
        for (uint32_t i = 0; i < pc->n_cp; i++) /* copies of streams that left meanwhile */
            if (pc->cp[i].used && pc->cp[i].layer == L && !in_ids(ids, n_ids, pc->cp[i].stream)) {
                lcache_free(pc->cp[i].c);
                pc->cp[i] = (pc_copy){0};
            }
    }
    for (uint32_t L = 0; L < pc->NL; L++) {
        dg[L] = pc->dg[L];
        dg[pc->NL + L] = pc->dg[pc->NL + L];
    }
    *local = v;
    return PD_OK;
}

typedef struct pc_offer {
    precopy *pc;
    const uint64_t *ids;
    uint32_t n_ids;
} pc_offer;

static lcache *offer(void *ctx, uint64_t stream, uint32_t layer)
{
    pc_offer *o = ctx;
    if (!in_ids(o->ids, o->n_ids, stream))
        return NULL;
    pc_copy *cp = copy_entry(o->pc, layer, stream, false);
    return cp && cp->final ? cp->c : NULL;
}

pd_status precopy_check(precopy *pc, const uint64_t *ids, uint32_t n_ids, pd_err *err)
{
    for (uint32_t i = 0; i < pc->n_cp; i++) {
        const pc_copy *cp = &pc->cp[i];
        if (!cp->used || !cp->final || !in_ids(ids, n_ids, cp->stream))
            continue;
        pd_status st = stage_check_copy(pc->r->st, cp->stream, cp->layer, cp->c, err);
        if (st)
            return st;
    }
    return PD_OK;
}

pd_status precopy_add_layers(precopy *pc, uint32_t first, uint32_t n, const model *weights, const uint64_t *ids,
                             uint32_t n_ids, pd_err *err)
{
    pc_offer o = {.pc = pc, .ids = ids, .n_ids = n_ids};
    pd_status st = stage_add_layers_from(pc->r->st, first, n, weights, offer, &o, err);
    if (st)
        return st;
    for (uint32_t i = 0; i < pc->n_cp; i++) /* the stage owns them now */
        if (pc->cp[i].used && pc->cp[i].layer >= first && pc->cp[i].layer < first + n && pc->cp[i].final &&
            in_ids(ids, n_ids, pc->cp[i].stream))
            pc->cp[i] = (pc_copy){0};
    return PD_OK;
}

pd_status precopy_stop(precopy *pc, pd_err *err)
{
    /* a pre-copy that never reached its switch (the run ended, or the plan
     * was refused at the switch): the same end marks, so nothing stays in
     * flight */
    pd_status st = pc->active ? end_marks(pc, err) : PD_OK;
    for (int i = 0; i < N_RECV; i++) {
        pd_status cs = pipe_cancel_recv(pc->link, &pc->rb[i].req, err);
        if (st == PD_OK)
            st = cs;
    }
    for (int i = 0; i < N_SEND; i++) {
        pd_status ws = pipe_wait(pc->link, &pc->sb[i].req, NULL, err);
        if (st == PD_OK)
            st = ws;
    }
    drop_copies(pc);
    memset(pc->src, 0, sizeof *pc->src * pc->n_src_cap);
    pc->n_src = 0;
    pc->posted = false;
    pc->active = false;
    return st;
}
