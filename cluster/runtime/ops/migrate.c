/* migrate: the plan / copy / ack / switch protocol of a live layer migration
 * at a drain point (contract in migrate.h). */
#include "cluster/runtime/ops/migrate.h"

#include "base/check.h"
#include "comm/bundle.h"
#include "comm/lcache_wire.h"
#include "comm/crc32c.h"
#include "cluster/runtime/ops/precopy.h"

#include "cluster/format/gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MIGRATE_FAULT_PATH "/nonexistent/pipedec-migrate-fault.gguf"
/* A bundle travels in pieces of this many bytes (the last one shorter). The
 * source encodes it straight into MIGRATE_SLOTS piece buffers and reuses a
 * buffer once its send completed, so what it holds besides the caches is
 * bounded by these, whatever the state it moves (docs/performance.md). */
#define MIGRATE_PIECE ((uint64_t)4 << 20)
#define MIGRATE_SLOTS 2u

struct migrate {
    rank *r;                 /* borrowed */
    pipe_link *link;         /* duplicated from the pipeline's communicator */
    migrate_fault fault;
    uint32_t n_layers;
    const model **src;       /* [n_layers] weights a layer of the stage runs on (NULL = r->m) */
    model **slices;          /* [n_layers] weight slices loaded for received layers (NULL = free slot) */
    precopy *pc;             /* the pre-copy phase (precopy.h) */
    /* weights of the layers the current pre-copy brings here, loaded by the
     * first migrate_progress (not in a pause) */
    bool pre_w_done;
    pd_status pre_w_status;
    pd_err pre_w_err;
    uint32_t pre_np, pre_pf[2], pre_pn[2];
    const model *pre_pw[2];
    model *pre_pl[2];
    double pre_w_s;
    layermap pre_to;         /* the map the current pre-copy moves to */
    double pre_w_mpi;        /* weight bytes that came over MPI */
};

static const char *const fault_names[MIGRATE_FAULT_COUNT] = {"none", "corrupt", "weights", "cut"};

pd_status migrate_fault_parse(const char *s, migrate_fault *out, pd_err *err)
{
    for (int i = 0; i < MIGRATE_FAULT_COUNT; i++)
        if (strcmp(s, fault_names[i]) == 0) {
            *out = (migrate_fault)i;
            return PD_OK;
        }
    return pd_err_set(err, PD_ERR_ARG, "--migrate-fault '%s': expected none, corrupt, weights or cut", s);
}

pd_status migrate_new(rank *r, migrate_fault fault, migrate **out, pd_err *err)
{
    migrate *mg = calloc(1, sizeof *mg);
    pd_status st = mg ? PD_OK : pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    if (st == PD_OK) {
        mg->r = r;
        mg->fault = fault;
        mg->n_layers = r->hp.n_layers;
        mg->src = calloc(mg->n_layers, sizeof *mg->src);
        mg->slices = calloc(mg->n_layers, sizeof *mg->slices);
        if (!mg->src || !mg->slices)
            st = pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    }
    /* collective: every rank reaches it whatever failed above */
    pd_status ls = pipe_open(pipe_comm(r->p), mg ? &mg->link : &(pipe_link *){NULL}, err);
    if (st == PD_OK)
        st = ls;
    if (st) {
        migrate_free(mg);
        return st;
    }
    /* a peer that stops mid-migration is named like one that stops mid-decode */
    pipe_set_stall_timeout(mg->link, r->o->stall_timeout);
    if ((st = precopy_new(r, &mg->pc, err))) { /* collective */
        migrate_free(mg);
        return st;
    }
    *out = mg;
    return PD_OK;
}

void migrate_free(migrate *mg)
{
    if (!mg)
        return;
    precopy_free(mg->pc);
    for (uint32_t i = 0; i < 2; i++)
        model_free(mg->pre_pl[i]);
    /* the stage may still run on the slices: only rank_stop's stage_free
     * comes later, and it does not touch weights */
    for (uint32_t i = 0; mg->slices && i < mg->n_layers; i++)
        model_free(mg->slices[i]);
    free(mg->slices);
    free(mg->src);
    pipe_close(mg->link);
    free(mg);
}

/* ---- maps -------------------------------------------------------------------- */

uint32_t migrate_layers_moved(const layermap *a, const layermap *b)
{
    uint32_t n = 0, total = a->first[a->n_stages - 1] + a->count[a->n_stages - 1];
    for (uint32_t L = 0; L < total; L++)
        n += layermap_owner(a, L) != layermap_owner(b, L);
    return n;
}

pd_status migrate_map_for_layer(const layermap *cur, uint32_t layer, uint32_t to, layermap *out, pd_err *err)
{
    uint32_t total = cur->first[cur->n_stages - 1] + cur->count[cur->n_stages - 1];
    if (layer >= total)
        return pd_err_set(err, PD_ERR_ARG, "layer %u: the model has layers 0-%u", layer, total - 1);
    if (to >= cur->n_stages)
        return pd_err_set(err, PD_ERR_ARG, "rank %u: the job has ranks 0-%u", to, cur->n_stages - 1);
    uint32_t from = layermap_owner(cur, layer);
    if (to == from)
        return pd_err_set(err, PD_ERR_ARG, "layer %u is on rank %u already", layer, to);
    layermap m = *cur;
    if (to + 1 == from && layer == cur->first[from]) {
        m.first[from]++;
        m.count[from]--;
        m.count[to]++;
    } else if (to == from + 1 && layer == cur->first[from] + cur->count[from] - 1) {
        m.count[from]--;
        m.first[to]--;
        m.count[to]++;
    } else
        return pd_err_set(err, PD_ERR_ARG,
                          "layer %u (rank %u holds %u-%u) can move only to a neighbour on its side: the first layer "
                          "of a rank to the rank before, the last to the rank after",
                          layer, from, cur->first[from], cur->first[from] + cur->count[from] - 1);
    if (m.count[from] == 0)
        return pd_err_set(err, PD_ERR_ARG, "rank %u would hold no layer (it holds only layer %u)", from, layer);
    *out = m;
    return PD_OK;
}

/* ---- a bundle's pieces as a bundle sink ---------------------------------------- */

/* The source's side of one bundle on the link. The sink copies the writer's
 * bytes into the slot being filled and sends it when full; before a slot is
 * filled again its previous send is completed. crc runs over the bytes as
 * encoded (the ack digest), before the CORRUPT test hook flips one.
 * INV: fill <= MIGRATE_PIECE; req[i] is MPI_REQUEST_NULL or buf[i]'s send. */
typedef struct piece_out {
    pipe_link *link;         /* borrowed */
    int peer;
    uint8_t *buf[MIGRATE_SLOTS]; /* [MIGRATE_PIECE] each, owned */
    MPI_Request req[MIGRATE_SLOTS];
    uint32_t slot;           /* the one being filled */
    size_t fill;
    uint64_t sent;           /* bytes of this bundle passed to the sink */
    uint64_t corrupt_at;     /* the byte the hook flips (UINT64_MAX: none) */
    uint64_t cut_at;         /* the CUT hook: no byte from here on travels (UINT64_MAX: none) */
    uint64_t shipped;        /* bytes of this bundle handed to the sends */
    uint32_t crc;
    pd_status ms;            /* an MPI failure: nothing can be agreed on */
    pd_err *merr;            /* its words (migrate_run's err) */
} piece_out;

/* Sends the slot being filled and moves to the next one. */
static pd_status piece_ship(piece_out *po)
{
    if (po->fill == 0)
        return PD_OK;
    size_t n = po->fill; /* the CUT hook: the piece ends early, or goes empty */
    if (po->cut_at < po->shipped + n)
        n = po->cut_at > po->shipped ? (size_t)(po->cut_at - po->shipped) : 0;
    po->shipped += po->fill;
    po->ms = pipe_isend(po->link, po->peer, po->buf[po->slot], n, &po->req[po->slot], po->merr);
    po->slot = (po->slot + 1) % MIGRATE_SLOTS;
    po->fill = 0;
    if (po->ms == PD_OK && !po->buf[po->slot] && !(po->buf[po->slot] = malloc(MIGRATE_PIECE)))
        po->ms = pd_err_set(po->merr, PD_ERR_NOMEM, "migration: out of memory for a piece buffer");
    if (po->ms == PD_OK)
        po->ms = pipe_wait(po->link, &po->req[po->slot], NULL, po->merr);
    return po->ms;
}

static pd_status piece_sink(void *ctx, const void *bytes, size_t n, pd_err *err)
{
    piece_out *po = ctx;
    const uint8_t *p = bytes;
    if (po->ms == PD_OK && !po->buf[po->slot] && !(po->buf[po->slot] = malloc(MIGRATE_PIECE)))
        po->ms = pd_err_set(po->merr, PD_ERR_NOMEM, "migration: out of memory for a piece buffer");
    if (p)
        po->crc = crc32c_update(po->crc, p, n);
    while (n > 0 && po->ms == PD_OK) {
        size_t k = MIGRATE_PIECE - po->fill < n ? MIGRATE_PIECE - po->fill : n;
        uint8_t *dst = po->buf[po->slot] + po->fill;
        if (p)
            memcpy(dst, p, k);
        else
            memset(dst, 0, k);
        if (po->corrupt_at >= po->sent && po->corrupt_at - po->sent < k)
            dst[po->corrupt_at - po->sent] ^= 0x40; /* test hook: after the CRC */
        po->fill += k;
        po->sent += k;
        n -= k;
        p = p ? p + k : NULL;
        if (po->fill == MIGRATE_PIECE)
            piece_ship(po);
    }
    if (po->ms != PD_OK)
        *err = *po->merr;
    return po->ms;
}

/* Completes every piece still in flight and frees the buffers. */
static pd_status piece_out_close(piece_out *po, pd_status ms)
{
    for (uint32_t i = 0; i < MIGRATE_SLOTS; i++) {
        if (ms == PD_OK)
            ms = pipe_wait(po->link, &po->req[i], NULL, po->merr);
        free(po->buf[i]);
        po->buf[i] = NULL;
    }
    return ms;
}

/* ---- the protocol --------------------------------------------------------------- */

/* What the head broadcasts (plain bytes: every rank runs the same binary). */
typedef struct migrate_plan {
    int32_t refused;         /* the head refused the plan: nothing to do */
    uint32_t n_streams;
    layermap to;
} migrate_plan;

/* Every rank's verdict, gathered after the copy. */
typedef struct migrate_verdict {
    int32_t status;
    char msg[512];
    double copy_s, export_s, weights_s, transfer_s;
    uint64_t bytes;          /* bundle bytes this rank sent */
    uint64_t precopy_bytes, final_bytes, resets;
    double weights_mpi_bytes;
    uint64_t release_bytes;  /* weights this rank frees at the switch */
    double precopy_send_s, precopy_recv_s, precopy_alloc_s;
} migrate_verdict;

/* One layer travelling through this rank. */
typedef struct migrate_move {
    uint32_t layer;
    int peer;                /* the other end */
    uint64_t len;            /* 0: the source could not export it */
    MPI_Request len_req;     /* sender: the length's send */
} migrate_move;

static uint64_t n_pieces(uint64_t len)
{
    return (len + MIGRATE_PIECE - 1) / MIGRATE_PIECE;
}

static uint64_t stream_next_pos(const stream_state *s)
{
    return s->n_tokens ? s->prefill_rows + s->n_tokens - 1 : s->fed;
}

/* Pieces of [nf, ne) not in [of, oe): up to two ranges, or all of it when
 * the two do not meet. Returns how many (first[i], n[i]). */
static uint32_t pieces(uint32_t nf, uint32_t ne, uint32_t of, uint32_t oe, uint32_t first[2], uint32_t n[2])
{
    uint32_t lo = nf > of ? nf : of, hi = ne < oe ? ne : oe;
    if (lo >= hi) {
        first[0] = nf;
        n[0] = ne - nf;
        return ne > nf;
    }
    uint32_t k = 0;
    if (nf < lo) {
        first[k] = nf;
        n[k++] = lo - nf;
    }
    if (hi < ne) {
        first[k] = hi;
        n[k++] = ne - hi;
    }
    return k;
}

/* The head's budget for map m over the streams the scheduler holds:
 * checked only (dry) or put in force. */
static pd_status budget_for_map(budget *bud, sched *sc, const layermap *m, bool dry, pd_err *err)
{
    stream_table *t = sched_streams(sc);
    uint32_t cap = stream_table_capacity(t), n = 0;
    uint64_t *pr = calloc(cap + 1, sizeof *pr);
    uint32_t *mn = calloc(cap + 1, sizeof *mn);
    pd_status st = (pr && mn) ? PD_OK : pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    for (uint32_t i = 0; st == PD_OK && i < cap; i++)
        if (stream_table_at(t, i)) {
            pr[n] = stream_table_at(t, i)->prefill_rows;
            mn[n++] = stream_table_at(t, i)->max_new;
        }
    if (st == PD_OK)
        st = budget_remap(bud, m->first, m->count, pr, mn, n, dry, err);
    free(pr);
    free(mn);
    return st;
}

/* The head's half of step 1: is the target acceptable? */
static pd_status plan_check(migrate *mg, sched *sc, budget *bud, const layermap *target, pd_err *err)
{
    const layermap *cur = &mg->r->lm;
    if (target->n_stages != cur->n_stages)
        return pd_err_set(err, PD_ERR_ARG, "the map has %u ranges, the job %u ranks", target->n_stages, cur->n_stages);
    if (migrate_layers_moved(cur, target) == 0)
        return pd_err_set(err, PD_ERR_ARG, "that map is in force already");
    return bud ? budget_for_map(bud, sc, target, true, err) : PD_OK;
}

/* Loads (or finds) the weights of [first, first + n) for the stage. */
static pd_status weights_for(migrate *mg, uint32_t first, uint32_t n, const model **w, model **loaded, pd_err *err)
{
    rank *r = mg->r;
    *loaded = NULL;
    if (model_holds_layers(r->m, first, n) && mg->fault != MIGRATE_FAULT_WEIGHTS) {
        *w = NULL; /* the rank's own model holds them */
        return PD_OK;
    }
    model_load_opts mo = {.first_layer = first,
                          .n_layers = n,
                          .backend = r->o->backend,
                          .alloc = arena_alloc_iface(r->ar),
                          .share_rope = r->m};
    const char *path = mg->fault == MIGRATE_FAULT_WEIGHTS ? MIGRATE_FAULT_PATH : r->o->model_path;
    pd_status st = model_load(path, &mo, loaded, err);
    if (st) {
        pd_err_prefix(err, "weights of layers %u-%u are not readable here", first, first + n - 1);
        return st;
    }
    /* the same file as the rank's own model (fingerprint): its digest
     * holds, no need to read the whole file again; another file keeps its
     * own digest and stage_add_layers refuses it */
    (void)model_digest_inherit(*loaded, r->m);
    *w = *loaded;
    return PD_OK;
}

/* ---- weights over MPI (--weights-over-mpi, or the file unreadable here) ------- */

/* One message of a layer's weights: this header, then len bytes of the file
 * at file offset off. The first message of a layer (len = 0) carries in off
 * the number of messages that follow and in crc the CRC32C of the source
 * file's header bytes (metadata and tensor directory). */
typedef struct wpiece {
    uint64_t off, len;
    uint32_t crc, layer;
} wpiece;

#define WPIECE_MAX ((uint64_t)4 << 20)

/* The file bytes of layer L's tensors ("blk.L.*") in f, in file order
 * (callback per tensor). */
static uint64_t layer_tensor_bytes(const gguf_file *f, uint32_t L, uint64_t *pieces)
{
    char pre[32];
    int pn = snprintf(pre, sizeof pre, "blk.%u.", L);
    uint64_t b = 0, n = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (strncmp(t->name, pre, (size_t)pn) != 0)
            continue;
        b += t->bytes;
        n += (t->bytes + WPIECE_MAX - 1) / WPIECE_MAX;
    }
    *pieces = n;
    return b;
}

/* Does this rank take its new layers' weights over MPI? */
static bool wants_mpi_weights(const migrate *mg)
{
    return mg->r->o->weights_over_mpi || access(mg->r->o->model_path, R_OK) != 0;
}

/* One weights exchange on this rank: what its steps share. */
typedef struct wx {
    migrate *mg;
    const layermap *from, *to;
    uint32_t me, NL;
    const gguf_file *f;      /* the rank's own model file */
    const uint8_t *base;     /* its bytes */
    uint64_t size, data;     /* its length, where its tensor data begins */
    uint32_t hcrc;           /* CRC32C of its header bytes [0, data) */
    uint8_t *buf;            /* one message: a wpiece and up to WPIECE_MAX bytes */
    bool corrupt;            /* the CORRUPT test hook has yet to fire */
    bool sent;               /* a piece went out */
    double bytes;            /* weight bytes sent and received */
    uint8_t *img[2];         /* receiver: a file image per new range */
    pd_status v;             /* receiver: why the weights are not usable here */
    pd_err ve;               /* its words */
} wx;

/* A source's layer L for rank b: a header message (how many pieces follow,
 * the header CRC), then every tensor "blk.L.*" in file order, in pieces. */
static pd_status wx_give_layer(wx *x, uint32_t L, uint32_t b, pd_err *err)
{
    uint64_t n;
    layer_tensor_bytes(x->f, L, &n);
    wpiece h = {.off = n, .len = 0, .crc = x->hcrc, .layer = L};
    MPI_Request q = MPI_REQUEST_NULL;
    pd_status st = pipe_isend(x->mg->link, (int)b, &h, sizeof h, &q, err);
    if (st == PD_OK)
        st = pipe_wait(x->mg->link, &q, NULL, err);
    char pre[32];
    int plen = snprintf(pre, sizeof pre, "blk.%u.", L);
    for (uint64_t i = 0; i < gguf_tensor_count(x->f) && st == PD_OK; i++) {
        const gguf_tensor *t = gguf_tensor_at(x->f, i);
        if (strncmp(t->name, pre, (size_t)plen) != 0)
            continue;
        uint64_t toff = (uint64_t)((const uint8_t *)t->data - x->base);
        for (uint64_t o = 0; o < t->bytes && st == PD_OK; o += WPIECE_MAX) {
            uint64_t len = t->bytes - o < WPIECE_MAX ? t->bytes - o : WPIECE_MAX;
            wpiece *w = (wpiece *)(void *)x->buf;
            *w = (wpiece){.off = toff + o, .len = len, .crc = crc32c_update(0, x->base + toff + o, (size_t)len),
                          .layer = L};
            memcpy(x->buf + sizeof *w, x->base + toff + o, (size_t)len);
            if (x->corrupt) { /* test hook: after the CRC */
                x->buf[sizeof *w + len / 2] ^= 0x40;
                x->corrupt = false;
            }
            if ((st = pipe_isend(x->mg->link, (int)b, x->buf, sizeof *w + (size_t)len, &q, err)) == PD_OK)
                st = pipe_wait(x->mg->link, &q, NULL, err);
            x->bytes += (double)len;
            x->sent = true;
        }
    }
    return st;
}

/* A receiver's layer L from rank a into img[which]: every piece is received
 * (the link stays in step) and checked (header, bounds, CRC) while the
 * weights are still usable here. Errors are MPI failures; the rest is x->v. */
static pd_status wx_take_layer(wx *x, uint32_t L, uint32_t a, uint32_t which, pd_err *err)
{
    size_t got_len;
    wpiece h;
    pd_status st = pipe_recv(x->mg->link, (int)a, &h, sizeof h, &got_len, NULL, NULL, err);
    if (st)
        return st;
    if (x->v == PD_OK && (got_len != sizeof h || h.len != 0 || h.layer != L))
        x->v = pd_err_set(&x->ve, PD_ERR_FORMAT, "rank %u: the weights of layer %u from rank %u begin with a bad header",
                          x->me, L, a);
    if (x->v == PD_OK && h.crc != x->hcrc)
        x->v = pd_err_set(&x->ve, PD_ERR_MISMATCH, "rank %u: rank %u sends layer %u's weights from another model file "
                          "(header CRC32C %08x, this rank's %08x)", x->me, a, L, h.crc, x->hcrc);
    uint64_t count = h.off;
    for (uint64_t k = 0; k < count; k++) {
        if ((st = pipe_recv(x->mg->link, (int)a, x->buf, sizeof(wpiece) + WPIECE_MAX, &got_len, NULL, NULL, err)))
            return st;
        const wpiece *w = (const wpiece *)(const void *)x->buf;
        if (x->v != PD_OK)
            continue;
        if (got_len < sizeof *w || w->len != got_len - sizeof *w || w->layer != L || w->off < x->data ||
            w->off > x->size || w->len > x->size - w->off)
            x->v = pd_err_set(&x->ve, PD_ERR_FORMAT, "rank %u: weights piece %llu of layer %u from rank %u: %zu bytes "
                              "for offset %llu, length %llu in a %llu-byte file", x->me, (unsigned long long)k, L, a,
                              got_len, (unsigned long long)w->off, (unsigned long long)w->len,
                              (unsigned long long)x->size);
        else if (crc32c_update(0, x->buf + sizeof *w, (size_t)w->len) != w->crc)
            x->v = pd_err_set(&x->ve, PD_ERR_CHECKSUM, "rank %u: weights piece %llu of layer %u from rank %u (file "
                              "offset %llu): CRC32C %08x, the bytes give %08x", x->me, (unsigned long long)k, L, a,
                              (unsigned long long)w->off, w->crc,
                              crc32c_update(0, x->buf + sizeof *w, (size_t)w->len));
        else {
            memcpy(x->img[which] + w->off, x->buf + sizeof *w, (size_t)w->len);
            x->bytes += (double)w->len;
        }
    }
    return PD_OK;
}

/* The receiver's images become weight slices of its np new ranges (pw / pl),
 * or none when one is not usable (x->v). */
static void wx_load(wx *x, uint32_t np, const uint32_t *pf, const uint32_t *pn, const model **pw, model **pl)
{
    rank *r = x->mg->r;
    for (uint32_t i = 0; i < np && x->v == PD_OK; i++) {
        model_load_opts mo = {.first_layer = pf[i],
                              .n_layers = pn[i],
                              .backend = r->o->backend,
                              .alloc = arena_alloc_iface(r->ar),
                              .share_rope = r->m};
        char name[1100];
        snprintf(name, sizeof name, "%s (layers %u-%u over MPI)", r->o->model_path, pf[i], pf[i] + pn[i] - 1);
        x->v = model_load_image(x->img[i], (size_t)x->size, name, &mo, &pl[i], &x->ve);
        x->img[i] = NULL; /* the model owns it now, or freed it */
        if (x->v == PD_OK && !model_digest_inherit_header(pl[i], r->m))
            x->v = pd_err_set(&x->ve, PD_ERR_MISMATCH, "%s: not the job's model file", name);
        if (x->v == PD_OK)
            pw[i] = pl[i];
    }
}

/* Collective at a drain point (every rank, the same maps): every rank that
 * takes layers and wants their weights over MPI gets them from their old
 * owners; *got says whether this rank did (then pw / pl hold the slices of
 * its np new ranges, or *local / why say why not). Errors are MPI failures. */
static pd_status weights_exchange(migrate *mg, const layermap *from, const layermap *to, uint32_t np,
                                  const uint32_t *pf, const uint32_t *pn, const model **pw, model **pl, bool *got,
                                  bool *sent, double *bytes, pd_status *local, pd_err *why, pd_err *err)
{
    rank *r = mg->r;
    int32_t mine = wants_mpi_weights(mg), *need = calloc((size_t)r->size, sizeof *need);
    if (!need)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    pd_status st = pipe_allgather(r->p, &mine, sizeof mine, need, err);
    wx x = {.mg = mg, .from = from, .to = to, .me = (uint32_t)r->rank, .NL = r->hp.n_layers, .f = model_gguf(r->m),
            .corrupt = mg->fault == MIGRATE_FAULT_CORRUPT};
    x.base = gguf_bytes(x.f);
    x.size = gguf_file_size(x.f);
    x.data = gguf_data_offset(x.f);
    x.hcrc = crc32c_update(0, x.base, (size_t)x.data);
    *got = false;
    x.buf = st == PD_OK ? malloc(sizeof(wpiece) + WPIECE_MAX) : NULL;
    if (st == PD_OK && !x.buf)
        st = pd_err_set(err, PD_ERR_NOMEM, "out of memory for a weights buffer");
    /* sources: every layer they give to a rank that wants it, in layer order */
    for (uint32_t L = 0; L < x.NL && st == PD_OK; L++) {
        uint32_t a = layermap_owner(from, L), b = layermap_owner(to, L);
        if (a != x.me || b == x.me || !need[b])
            continue;
        st = wx_give_layer(&x, L, b, err);
    }
    /* receivers: one file image per new range, filled layer by layer */
    bool takes = false;
    for (uint32_t L = 0; L < x.NL; L++)
        takes |= layermap_owner(to, L) == x.me && layermap_owner(from, L) != x.me;
    if (mine && takes && st == PD_OK) {
        *got = true;
        for (uint32_t i = 0; i < np && x.v == PD_OK; i++)
            if (!(x.img[i] = model_image_new((size_t)x.size)))
                x.v = pd_err_set(&x.ve, PD_ERR_NOMEM, "rank %u: no memory for an image of the %llu-byte model file",
                                 x.me, (unsigned long long)x.size);
            else
                memcpy(x.img[i], x.base, (size_t)x.data);
    }
    for (uint32_t L = 0; L < x.NL && st == PD_OK && mine; L++) {
        uint32_t a = layermap_owner(from, L), b = layermap_owner(to, L);
        if (b == x.me && a != x.me)
            st = wx_take_layer(&x, L, a, np > 1 && L >= pf[1] && L < pf[1] + pn[1], err);
    }
    free(x.buf);
    free(need);
    if (*got && st == PD_OK)
        wx_load(&x, np, pf, pn, pw, pl);
    for (uint32_t i = 0; i < 2; i++)
        model_image_free(x.img[i], (size_t)x.size);
    if (x.v != PD_OK)
        for (uint32_t i = 0; i < 2; i++) {
            model_free(pl[i]);
            pl[i] = NULL;
            pw[i] = NULL;
        }
    *sent = x.sent;
    *bytes = x.bytes;
    *local = x.v;
    *why = x.ve;
    return st;
}

static void slice_keep(migrate *mg, model *m)
{
    for (uint32_t i = 0; i < mg->n_layers; i++)
        if (!mg->slices[i]) {
            mg->slices[i] = m;
            return;
        }
    CHECK(0 && "more weight slices than layers");
}

/* Frees the slices no layer of the stage runs on any more. */
static void slices_prune(migrate *mg)
{
    uint32_t first, n;
    stage_layers(mg->r->st, &first, &n);
    for (uint32_t i = 0; i < mg->n_layers; i++) {
        if (!mg->slices[i])
            continue;
        bool used = false;
        for (uint32_t L = first; L < first + n; L++)
            used |= mg->src[L] == mg->slices[i];
        if (!used) {
            model_free(mg->slices[i]);
            mg->slices[i] = NULL;
        }
    }
}

/* Step 1 on every rank: the head checks the target and names the streams
 * (ids / pos: [max_streams + 1], owned by the caller). Returns an MPI
 * failure only; a refused plan is plan->refused with rep->why. */
static pd_status plan_agree(migrate *mg, sched *sc, budget *bud, const layermap *target, migrate_plan *plan,
                            uint64_t *ids, uint64_t *pos, migrate_report *rep, pd_err *err)
{
    rank *r = mg->r;
    pd_err e = {0};
    pd_status st = PD_OK;
    int have = ids && pos;
    memset(plan, 0, sizeof *plan);
    if (r->is_head) {
        if (!have)
            st = pd_err_set(&e, PD_ERR_NOMEM, "out of memory");
        else
            st = plan_check(mg, sc, bud, target, &e);
        plan->refused = st != PD_OK;
        plan->to = st == PD_OK ? *target : r->lm;
        if (st == PD_OK) {
            stream_table *t = sched_streams(sc);
            for (uint32_t i = 0; i < stream_table_capacity(t); i++)
                if (stream_table_at(t, i)) {
                    pos[plan->n_streams] = stream_next_pos(stream_table_at(t, i));
                    ids[plan->n_streams++] = stream_table_at(t, i)->id;
                }
        }
    }
    pd_status bs = pipe_bcast(r->p, plan, sizeof *plan, err);
    if (bs == PD_OK)
        bs = pipe_agree(r->p, have ? PD_OK : PD_ERR_NOMEM, err);
    if (bs == PD_OK && plan->n_streams) {
        bs = pipe_bcast(r->p, ids, (size_t)plan->n_streams * sizeof *ids, err);
        if (bs == PD_OK)
            bs = pipe_bcast(r->p, pos, (size_t)plan->n_streams * sizeof *pos, err);
    }
    rep->to = plan->to;
    rep->streams = plan->n_streams;
    if (!bs && plan->refused)
        snprintf(rep->why, sizeof rep->why, "%s", r->is_head ? e.msg : "the head refused the plan");
    return bs;
}

pd_status migrate_finish(migrate *mg, pd_err *err)
{
    return precopy_active(mg->pc) ? precopy_stop(mg->pc, err) : PD_OK;
}

bool migrate_precopying(const migrate *mg)
{
    return precopy_active(mg->pc);
}

bool migrate_uses_precopy(const migrate *mg)
{
    return precopy_applies(mg->r);
}

pd_status migrate_begin(migrate *mg, sched *sc, budget *bud, const layermap *target, migrate_report *rep,
                        pd_err *err)
{
    rank *r = mg->r;
    double t0 = MPI_Wtime();
    memset(rep, 0, sizeof *rep);
    rep->from = r->lm;
    migrate_plan plan;
    uint32_t cap = r->sz.max_streams + 1;
    uint64_t *ids = calloc(cap, sizeof *ids), *pos = calloc(cap, sizeof *pos);
    pd_status st = plan_agree(mg, sc, bud, target, &plan, ids, pos, rep, err);
    free(ids);
    free(pos);
    if (st == PD_OK && !plan.refused) {
        for (uint32_t i = 0; i < 2; i++) {
            model_free(mg->pre_pl[i]);
            mg->pre_pl[i] = NULL;
            mg->pre_pw[i] = NULL;
        }
        mg->pre_w_done = false;
        mg->pre_w_status = PD_OK;
        mg->pre_w_err = (pd_err){0};
        mg->pre_w_s = 0;
        mg->pre_w_mpi = 0;
        mg->pre_to = plan.to;
        /* weights over MPI travel now (both ends are at this drain point);
         * from the file, the first migrate_progress loads them */
        uint32_t me = (uint32_t)r->rank, of = r->lm.first[me], oe = of + r->lm.count[me];
        uint32_t nf = plan.to.first[me], ne = nf + plan.to.count[me];
        mg->pre_np = pieces(nf, ne, of, oe, mg->pre_pf, mg->pre_pn);
        bool got = false, sent = false;
        double t = MPI_Wtime(), wb = 0;
        st = weights_exchange(mg, &r->lm, &plan.to, mg->pre_np, mg->pre_pf, mg->pre_pn, mg->pre_pw, mg->pre_pl, &got,
                              &sent, &wb, &mg->pre_w_status, &mg->pre_w_err, err);
        if (got) {
            mg->pre_w_done = true;
            mg->pre_w_s = MPI_Wtime() - t;
            mg->pre_w_mpi = wb;
        }
        pd_status ls = st ? st : precopy_start(mg->pc, &plan.to, mg->fault == MIGRATE_FAULT_CORRUPT && !sent, err);
        st = pipe_agree(r->p, ls, err); /* every rank pre-copies, or none */
        if (st && ls == PD_OK)
            (void)precopy_stop(mg->pc, &(pd_err){0});
        rep->started = st == PD_OK;
    }
    rep->total_s = MPI_Wtime() - t0;
    return st;
}

/* The weights of the layers this rank takes, loaded once per migration. */
static void precopy_weights(migrate *mg, const layermap *to)
{
    if (mg->pre_w_done)
        return;
    rank *r = mg->r;
    uint32_t me = (uint32_t)r->rank, of = r->lm.first[me], oe = of + r->lm.count[me];
    uint32_t nf = to->first[me], ne = nf + to->count[me];
    double t = MPI_Wtime();
    mg->pre_np = pieces(nf, ne, of, oe, mg->pre_pf, mg->pre_pn);
    for (uint32_t i = 0; i < mg->pre_np && mg->pre_w_status == PD_OK; i++)
        mg->pre_w_status = weights_for(mg, mg->pre_pf[i], mg->pre_pn[i], &mg->pre_pw[i], &mg->pre_pl[i], &mg->pre_w_err);
    mg->pre_w_s = MPI_Wtime() - t;
    mg->pre_w_done = true;
}

pd_status migrate_progress(migrate *mg, bool *busy, pd_err *err)
{
    *busy = false;
    if (!precopy_active(mg->pc))
        return PD_OK;
    if (!mg->pre_w_done) {
        precopy_weights(mg, &mg->pre_to);
        *busy = true;
        return PD_OK;
    }
    return precopy_progress(mg->pc, busy, err);
}

/* A receiver's copies of the layers it takes at the switch (bundle path). */
typedef struct spare_set {
    uint32_t n;
    uint32_t *layer;
    uint64_t *stream;
    lcache **c;
} spare_set;

static void spares_free(spare_set *ss)
{
    for (uint32_t i = 0; i < ss->n; i++)
        lcache_free(ss->c[i]);
    free(ss->layer);
    free(ss->stream);
    free(ss->c);
    *ss = (spare_set){0};
}

/* The stage owns the copies of layers [first, first + n) now. */
static void spares_taken(spare_set *ss, uint32_t first, uint32_t n)
{
    for (uint32_t i = 0; i < ss->n; i++)
        if (ss->layer[i] >= first && ss->layer[i] - first < n)
            ss->c[i] = NULL;
}

static lcache *spare_offer(void *ctx, uint64_t stream, uint32_t layer)
{
    spare_set *ss = ctx;
    for (uint32_t i = 0; i < ss->n; i++)
        if (ss->layer[i] == layer && ss->stream[i] == stream)
            return ss->c[i];
    return NULL;
}

/* ---- migrate_run: the four steps over one transfer ------------------------------ */

/* One migration on this rank: everything migrate_run's steps share, freed
 * once (xfer_free) on every path out of it, the early returns of a broken
 * link included. The steps keep this rank's first local failure in st / e
 * (what it votes in step 3: the job refuses the move, the old map stays) and
 * return only MPI failures (nothing can be agreed on: the job stops).
 * INV: give / take hold n_give / n_take moves when not NULL. */
typedef struct xfer {
    migrate *mg;             /* borrowed */
    rank *r;                 /* borrowed: mg->r */
    migrate_report *rep;     /* borrowed: the caller's */
    bool pre;                /* the switch of a pre-copy (precopy.h): no bundles */
    double t0;               /* the action's start */
    migrate_plan plan;
    uint64_t *ids, *pos;     /* [max_streams + 1]: the plan's streams, the head's positions */
    uint32_t me, NL, cnt;    /* this rank, the model's layers, the plan's streams */
    uint32_t of, oe, nf, ne; /* this rank's layers [of, oe) before, [nf, ne) after */
    uint32_t np, pf[2], pn[2]; /* the new ranges it takes (pieces) */
    uint32_t ng, gf[2], gn[2]; /* the old ranges it gives */
    const model *pw[2];      /* [np] weights each new range runs on (NULL: the rank's own model) */
    model *pl[2];            /* [np] slices loaded for them (owned until slice_keep) */
    bool mpi_w;              /* those weights came over MPI */
    bool corrupted;          /* the CORRUPT or CUT test hook fired already */
    uint8_t *piece;          /* [MIGRATE_PIECE] a receiver's piece buffer */
    migrate_move *give, *take; /* [n_give] layers sent, [n_take] layers received */
    uint32_t n_give, n_take;
    uint64_t *dg;            /* [2 * NL]: [L] digest sent, [NL + L] received */
    uint64_t *all_dg;        /* [size * 2 * NL]: every rank's dg */
    migrate_verdict *vd;     /* [size]: every rank's verdict */
    spare_set ss;            /* a receiver's copies of the layers it takes, decoded as
                                their bundles arrive, the stage's once installed */
    bool early;              /* the new layers were installed before the vote */
    uint32_t added;          /* of the new ranges, how many were installed early */
    uint64_t sent_bytes;
    double t_xfer, export_s, weights_s, install_s, transfer_s;
    pd_status st;            /* this rank's verdict: the first local failure */
    pd_err e;                /* its words */
} xfer;

/* Records a local failure unless one is recorded already (the first sticks). */
static void xfer_fail(xfer *x, pd_status st, const pd_err *e)
{
    if (x->st == PD_OK && st != PD_OK) {
        x->st = st;
        x->e = *e;
    }
}

static void xfer_free(xfer *x)
{
    spares_free(&x->ss);
    for (uint32_t i = 0; i < 2; i++) {
        model_free(x->pl[i]);
        x->pl[i] = NULL;
    }
    free(x->piece);
    x->piece = NULL;
    free(x->give);
    free(x->take);
    free(x->dg);
    free(x->all_dg);
    free(x->vd);
    free(x->ids);
    free(x->pos);
    x->give = x->take = NULL;
    x->dg = x->all_dg = x->ids = x->pos = NULL;
    x->vd = NULL;
}

/* Step 1 on every rank: the head checks the target and names the streams.
 * A pre-copy's switch also refuses a map other than the one it copied to. */
static pd_status xfer_plan(xfer *x, sched *sc, budget *bud, const layermap *target, pd_err *err)
{
    uint32_t cap = x->r->sz.max_streams + 1;
    x->ids = calloc(cap, sizeof *x->ids);
    x->pos = calloc(cap, sizeof *x->pos);
    pd_status st = plan_agree(x->mg, sc, bud, target, &x->plan, x->ids, x->pos, x->rep, err);
    if (st == PD_OK && x->pre && !x->plan.refused && migrate_layers_moved(&x->plan.to, &x->mg->pre_to) != 0) {
        x->plan.refused = 1; /* every rank sees the same maps */
        snprintf(x->rep->why, sizeof x->rep->why, "the map changed since the pre-copy started");
    }
    return st;
}

/* Which layers this rank gives and takes, the buffers for them, and the
 * streams settled at the plan's positions. */
static void xfer_layout(xfer *x)
{
    rank *r = x->r;
    const layermap *from = &r->lm, *to = &x->plan.to;
    x->me = (uint32_t)r->rank;
    x->NL = r->hp.n_layers;
    x->cnt = x->plan.n_streams;
    x->of = from->first[x->me];
    x->oe = x->of + from->count[x->me];
    x->nf = to->first[x->me];
    x->ne = x->nf + to->count[x->me];
    x->np = pieces(x->nf, x->ne, x->of, x->oe, x->pf, x->pn);
    x->ng = pieces(x->of, x->oe, x->nf, x->ne, x->gf, x->gn);
    for (uint32_t L = 0; L < x->NL; L++) {
        x->n_give += layermap_owner(from, L) == x->me && layermap_owner(to, L) != x->me;
        x->n_take += layermap_owner(to, L) == x->me && layermap_owner(from, L) != x->me;
    }
    x->give = calloc(x->n_give + 1, sizeof *x->give);
    x->take = calloc(x->n_take + 1, sizeof *x->take);
    x->dg = calloc(2 * (size_t)x->NL, sizeof *x->dg);
    x->all_dg = calloc(2 * (size_t)x->NL * (size_t)r->size, sizeof *x->all_dg);
    x->vd = calloc((size_t)r->size, sizeof *x->vd);
    size_t spares = (size_t)x->n_take * x->cnt + 1;
    x->ss.layer = calloc(spares, sizeof *x->ss.layer);
    x->ss.stream = calloc(spares, sizeof *x->ss.stream);
    x->ss.c = calloc(spares, sizeof *x->ss.c);
    if (!x->give || !x->take || !x->dg || !x->all_dg || !x->vd || !x->ss.layer || !x->ss.stream || !x->ss.c)
        x->st = pd_err_set(&x->e, PD_ERR_NOMEM, "out of memory");
    /* the rows up to the head's positions become final on every rank (what
     * the next micro-batch would do), so records hold final rows only */
    for (uint32_t i = 0; x->st == PD_OK && i < x->cnt; i++)
        x->st = stage_settle(r->st, x->ids[i], x->pos[i], &x->e);
}

/* Weights over MPI first (the link carries them before any bundle), when
 * this is not a pre-copy's switch (that one's came at migrate_begin). */
static pd_status xfer_weights_mpi(xfer *x, pd_err *err)
{
    double t = MPI_Wtime(), bytes = 0;
    if (!x->pre) {
        pd_status local = PD_OK;
        pd_err why = {0};
        pd_status st = weights_exchange(x->mg, &x->r->lm, &x->plan.to, x->np, x->pf, x->pn, x->pw, x->pl, &x->mpi_w,
                                        &x->corrupted, &bytes, &local, &why, err);
        if (st)
            return st;
        if (x->mpi_w)
            xfer_fail(x, local, &why);
    }
    x->weights_s = MPI_Wtime() - t; /* the figure when they came over MPI */
    x->rep->weights_mpi_bytes = x->pre ? x->mg->pre_w_mpi : bytes;
    return PD_OK;
}

/* The length of a source's bundle of one layer, from the records' exact
 * sizes (nothing encoded yet). 0 when one of them cannot be exported (the
 * failure is this rank's verdict). Called while x->st is PD_OK. */
static uint64_t bundle_length(xfer *x, uint32_t L)
{
    uint64_t len = BUNDLE_HEADER_BYTES;
    for (uint32_t i = 0; x->st == PD_OK && i < x->cnt; i++) {
        kv_layer_config kc;
        wire_layer_ref ref;
        uint64_t b = 0;
        pd_status st = stage_export_ref(x->r->st, x->ids[i], L, &ref, &kc, &x->e);
        if (st == PD_OK && (st = bundle_entry_bytes(&ref, 0, &b, &x->e)) != PD_OK)
            stage_export_refused(x->r->st, x->ids[i], L, st, &x->e);
        len += b;
        x->st = st;
    }
    if (x->st != PD_OK)
        pd_err_prefix(&x->e, "rank %u exporting layer %u", x->me, L);
    return x->st == PD_OK ? len : 0;
}

/* Encodes the bundle of mv->len bytes straight into pieces on the link. A
 * local failure half way is this rank's verdict, and the rest of the
 * announced bytes go as zeros so the link stays in step (the receiver's
 * bundle then fails its CRCs). Returns only MPI failures. */
static pd_status give_bundle(xfer *x, migrate_move *mv, piece_out *po)
{
    rank *r = x->r;
    uint32_t L = mv->layer;
    pd_err e = {0};
    po->peer = mv->peer;
    po->sent = 0;
    po->crc = 0;
    po->shipped = 0;
    po->corrupt_at = x->mg->fault == MIGRATE_FAULT_CORRUPT && !x->corrupted ? mv->len / 2 : UINT64_MAX;
    po->cut_at = x->mg->fault == MIGRATE_FAULT_CUT && !x->corrupted ? mv->len / 2 : UINT64_MAX;
    bundle_writer *bw = NULL;
    pd_status st = bundle_writer_new(piece_sink, po, stage_layer_identity(r->st, L), L, x->cnt, &bw, &e);
    for (uint32_t i = 0; st == PD_OK && i < x->cnt; i++) {
        kv_layer_config kc;
        wire_layer_ref ref;
        if ((st = stage_export_ref(r->st, x->ids[i], L, &ref, &kc, &e)) == PD_OK &&
            (st = bundle_writer_add(bw, x->ids[i], &ref, 0, &e)) != PD_OK)
            stage_export_refused(r->st, x->ids[i], L, st, &e);
    }
    if (st == PD_OK)
        st = bundle_writer_finish(bw, &e);
    bundle_writer_free(bw);
    if (po->ms != PD_OK)
        return po->ms;
    if (st != PD_OK) {
        pd_err_prefix(&e, "rank %u exporting layer %u", x->me, L);
        xfer_fail(x, st, &e);
    }
    CHECKF(po->sent <= mv->len, "layer %u: %llu bytes encoded, %llu announced", L, (unsigned long long)po->sent,
           (unsigned long long)mv->len);
    if (po->sent < mv->len && piece_sink(po, NULL, (size_t)(mv->len - po->sent), &e) != PD_OK)
        return po->ms;
    if (piece_ship(po) != PD_OK)
        return po->ms;
    x->corrupted |= po->corrupt_at != UINT64_MAX || po->cut_at != UINT64_MAX;
    x->dg[L] = (uint64_t)po->crc | mv->len << 32; /* bundle_digest of the bytes encoded */
    x->sent_bytes += mv->len;
    return PD_OK;
}

/* Sources: per layer they give, its length and then its bundle, encoded
 * while it is sent (a layer whose export failed is announced with length 0).
 * Returns only MPI failures. */
static pd_status xfer_send(xfer *x, pd_err *err)
{
    pd_status ms = PD_OK;
    x->t_xfer = MPI_Wtime();
    piece_out po = {.link = x->mg->link, .merr = err};
    for (uint32_t i = 0; i < MIGRATE_SLOTS; i++)
        po.req[i] = MPI_REQUEST_NULL;
    uint32_t k = 0;
    for (uint32_t L = x->of; x->give && !x->pre && L < x->oe && ms == PD_OK; L++) {
        if (layermap_owner(&x->plan.to, L) == x->me)
            continue;
        migrate_move *mv = &x->give[k++];
        mv->layer = L;
        mv->peer = (int)layermap_owner(&x->plan.to, L);
        mv->len_req = MPI_REQUEST_NULL;
        mv->len = x->st == PD_OK ? bundle_length(x, L) : 0;
        ms = pipe_isend(x->mg->link, mv->peer, &mv->len, sizeof mv->len, &mv->len_req, err);
        if (ms == PD_OK && mv->len)
            ms = give_bundle(x, mv, &po);
    }
    ms = piece_out_close(&po, ms);
    x->export_s = MPI_Wtime() - x->t_xfer;
    return ms;
}

/* Receivers' weights when they did not come over MPI: the pre-copy's (loaded
 * during it, or now), or the file's. */
static void xfer_weights(xfer *x)
{
    migrate *mg = x->mg;
    if (x->st != PD_OK)
        x->np = 0;
    double t = MPI_Wtime();
    if (x->pre) {
        if (x->st == PD_OK) {
            precopy_weights(mg, &x->plan.to);
            for (uint32_t i = 0; i < 2; i++) {
                x->pw[i] = mg->pre_pw[i];
                x->pl[i] = mg->pre_pl[i];
                mg->pre_pl[i] = NULL;
            }
            xfer_fail(x, mg->pre_w_status, &mg->pre_w_err);
        }
        x->weights_s = mg->pre_w_s;
    } else if (!x->mpi_w) {
        for (uint32_t i = 0; i < x->np && x->st == PD_OK; i++)
            x->st = weights_for(mg, x->pf[i], x->pn[i], &x->pw[i], &x->pl[i], &x->e);
        x->weights_s = MPI_Wtime() - t;
    }
}

/* A pre-copy's switch: the rows since its last chunks travel now. */
static pd_status xfer_precopy_finish(xfer *x, pd_err *err)
{
    if (!x->pre)
        return PD_OK;
    migrate_report *rep = x->rep;
    pd_status local = PD_OK;
    pd_err why = {0};
    pd_status ms = precopy_finish(x->mg->pc, x->ids, x->cnt, x->dg, &local, &why, err);
    if (ms == PD_OK)
        xfer_fail(x, local, &why);
    precopy_stats ps;
    precopy_get_stats(x->mg->pc, &ps);
    x->sent_bytes = ps.bytes_sent + ps.final_bytes;
    rep->precopy_bytes = ps.bytes_sent;
    rep->final_bytes = ps.final_bytes;
    rep->resets = ps.resets;
    rep->precopy_s = x->t0 - ps.started;
    rep->precopy_send_s = ps.send_s;
    rep->precopy_recv_s = ps.recv_s;
    rep->precopy_alloc_s = ps.alloc_s;
    return ms;
}

/* The receiver's own memory check, on the bytes announced so far (the head
 * checked the predicted reservations already), before any of them is
 * decoded. */
static void xfer_mem_check(xfer *x)
{
    uint64_t lim = x->r->o->mem_limit, incoming = 0;
    for (uint32_t i = 0; x->take && !x->pre && i < x->n_take; i++)
        incoming += x->take[i].len;
    stage_mem sm;
    stage_memory(x->r->st, &sm);
    if (x->st == PD_OK && lim != 0 && lim != UINT64_MAX && sm.cache_bytes + incoming > lim)
        x->st = pd_err_set(&x->e, PD_ERR_RANGE,
                           "rank %u: its caches hold %llu bytes; the %llu bytes of state arriving would pass its "
                           "--mem-limit of %llu", x->me, (unsigned long long)sm.cache_bytes,
                           (unsigned long long)incoming, (unsigned long long)lim);
}

/* A receiver's bundle of one layer as it arrives (bundle_reader's
 * callbacks): checked against the plan, each entry decoded into a copy of
 * its own (x->ss, held aside: the stage is not touched) as soon as it is
 * checked, so the bundle itself is never held. */
typedef struct take_to {
    xfer *x;
    uint32_t layer;
} take_to;

static pd_status take_header(void *ctx, const bundle_view *h, pd_err *e)
{
    const take_to *to = ctx;
    const xfer *x = to->x;
    uint64_t id = stage_layer_identity(x->r->st, to->layer);
    if (h->identity != id)
        return pd_err_set(e, PD_ERR_MISMATCH, "identity %016llx, expected %016llx (another model or policy)",
                          (unsigned long long)h->identity, (unsigned long long)id);
    if (h->layer != to->layer)
        return pd_err_set(e, PD_ERR_FORMAT, "holds layer %u", h->layer);
    if (h->n_streams != x->cnt)
        return pd_err_set(e, PD_ERR_FORMAT, "holds %llu streams, the plan %u", (unsigned long long)h->n_streams,
                          x->cnt);
    return PD_OK;
}

/* One entry into a copy of its own: the checks of an import
 * (lcache_wire_import: geometry, kind, position) and the stage's against
 * the copy (stage_check_copy); a refused copy is freed at once. */
static pd_status take_entry(void *ctx, const bundle_entry *en, pd_err *e)
{
    const take_to *to = ctx;
    xfer *x = to->x;
    stage *st = x->r->st;
    bool known = false;
    for (uint32_t j = 0; j < x->cnt; j++)
        known |= x->ids[j] == en->stream;
    if (!known)
        return pd_err_set(e, PD_ERR_FORMAT, "stream %llu is not in the plan", (unsigned long long)en->stream);
    uint32_t prefill, max_new;
    uint64_t pos = 0;
    lcache *c = NULL;
    pd_status s = stage_stream_shape(st, en->stream, &prefill, &max_new, e);
    if (s == PD_OK)
        s = stage_stream_pos(st, en->stream, &pos, e);
    if (s == PD_OK)
        s = stage_spare_cache(st, prefill, max_new, &c, e);
    if (s == PD_OK)
        s = lcache_wire_import(c, stage_layer_identity(st, to->layer), to->layer, pos, en->record, en->len,
                               en->offset, e);
    if (s == PD_OK)
        s = stage_check_copy(st, en->stream, to->layer, c, e);
    if (s != PD_OK) {
        lcache_free(c);
        pd_err_prefix(e, "stream %llu", (unsigned long long)en->stream);
        return s;
    }
    spare_set *ss = &x->ss;
    ss->layer[ss->n] = to->layer;
    ss->stream[ss->n] = en->stream;
    ss->c[ss->n++] = c;
    return PD_OK;
}

static const bundle_reader_ops take_ops = {.header = take_header, .entry = take_entry};

/* The pieces of a receiver's bundle of one layer, each checked and decoded
 * as it arrives (take_ops) into one piece buffer. A bundle nobody wants
 * (this rank failed already, or has no memory for it) is still received,
 * into nothing, so the link stays in step. */
static pd_status take_pieces(xfer *x, migrate_move *mv, bundle_reader *br, pd_err *err)
{
    pd_status ms = PD_OK;
    uint32_t crc = 0;
    uint64_t arrived = 0;
    for (uint64_t q = 0; ms == PD_OK && q < n_pieces(mv->len); q++) {
        uint64_t off = q * MIGRATE_PIECE, n = mv->len - off < MIGRATE_PIECE ? mv->len - off : MIGRATE_PIECE;
        size_t got = 0;
        pd_status rs = pipe_recv(x->mg->link, mv->peer, x->piece, x->piece ? (size_t)n : 0, &got, NULL, NULL, err);
        if (rs != PD_OK && x->piece)
            ms = rs;
        if (ms != PD_OK || !br || x->st != PD_OK)
            continue;
        crc = crc32c_update(crc, x->piece, got);
        arrived += got;
        x->st = bundle_reader_push(br, x->piece, got, &x->e);
    }
    if (ms == PD_OK && br && x->st == PD_OK)
        x->st = bundle_reader_finish(br, &x->e);
    if (ms == PD_OK && br && x->st == PD_OK)
        x->dg[x->NL + mv->layer] = (uint64_t)crc | arrived << 32; /* the ack digest of the bytes received */
    return ms;
}

/* A receiver's bundle of one layer: its length (checked against
 * --mem-limit with the ones before it), then its pieces. */
static pd_status take_bundle(xfer *x, migrate_move *mv, pd_err *err)
{
    size_t got;
    pd_status ms = pipe_recv(x->mg->link, mv->peer, &mv->len, sizeof mv->len, &got, NULL, NULL, err);
    if (ms)
        return ms;
    if (mv->len == 0) {
        if (x->st == PD_OK)
            x->st = pd_err_set(&x->e, PD_ERR_REFUSED, "rank %d could not export layer %u", mv->peer, mv->layer);
        return PD_OK;
    }
    xfer_mem_check(x);
    if (!x->piece && !(x->piece = malloc(MIGRATE_PIECE)) && x->st == PD_OK)
        x->st = pd_err_set(&x->e, PD_ERR_NOMEM, "rank %u: no memory for a piece buffer", x->me);
    bool mine = x->st == PD_OK; /* a failure from here on is this layer's */
    bundle_reader *br = NULL;
    take_to to = {.x = x, .layer = mv->layer}; /* outlives br */
    if (x->st == PD_OK)
        x->st = bundle_reader_new(mv->len, &take_ops, &to, &br, &x->e);
    ms = take_pieces(x, mv, br, err);
    bundle_reader_free(br);
    if (mine && x->st != PD_OK)
        pd_err_prefix(&x->e, "rank %u: layer %u from rank %d", x->me, mv->layer, mv->peer);
    return ms;
}

/* Receivers: each bundle of a layer they take, from its old owner. */
static pd_status xfer_receive(xfer *x, pd_err *err)
{
    const layermap *from = &x->r->lm;
    pd_status ms = PD_OK;
    uint32_t k = 0;
    for (uint32_t L = x->nf; x->take && !x->pre && L < x->ne && ms == PD_OK; L++) {
        if (layermap_owner(from, L) == x->me)
            continue;
        migrate_move *mv = &x->take[k++];
        mv->layer = L;
        mv->peer = (int)layermap_owner(from, L);
        ms = take_bundle(x, mv, err);
    }
    return ms;
}

/* Back to exactly the layers the stage held before the early install. */
static void xfer_remove_added(xfer *x)
{
    for (uint32_t i = 0; i < x->added; i++)
        CHECK(stage_remove_layers(x->r->st, x->pf[i], x->pn[i], &(pd_err){0}) == PD_OK);
    x->added = 0;
    x->early = false;
}

/* The layers taken, with the copies their bundles were decoded into as
 * they arrived (checked then: lcache_wire_import's geometry, kind and
 * position, stage_check_copy) or the pre-copy's, become the stage's
 * (stage_add_layers_from) before the vote when they sit next to the ones
 * held (every move between neighbours), and a refusal only removes the
 * added layers again. A rank whose new range does not meet its old one
 * cannot hold both: the switch hands them over, and a pre-copy's copies
 * are checked against the stage now. */
static void xfer_install(xfer *x)
{
    rank *r = x->r;
    double t = MPI_Wtime();
    uint32_t lo = x->nf > x->of ? x->nf : x->of, hi = x->ne < x->oe ? x->ne : x->oe;
    x->early = x->st == PD_OK && x->np > 0 && lo < hi;
    for (uint32_t i = 0; x->early && x->st == PD_OK && i < x->np; i++) {
        x->st = x->pre ? precopy_add_layers(x->mg->pc, x->pf[i], x->pn[i], x->pw[i], x->ids, x->cnt, &x->e)
                       : stage_add_layers_from(r->st, x->pf[i], x->pn[i], x->pw[i], spare_offer, &x->ss, &x->e);
        if (x->st == PD_OK) {
            spares_taken(&x->ss, x->pf[i], x->pn[i]);
            x->added++;
        } else {
            pd_err_prefix(&x->e, "rank %u: installing layers %u-%u", x->me, x->pf[i], x->pf[i] + x->pn[i] - 1);
        }
    }
    if (x->early && x->st != PD_OK)
        xfer_remove_added(x);
    if (!x->early && x->pre && x->st == PD_OK && x->np > 0)
        x->st = precopy_check(x->mg->pc, x->ids, x->cnt, &x->e);
    x->install_s = MPI_Wtime() - t;
}

static pd_status xfer_wait_sends(xfer *x, pd_err *err)
{
    pd_status ms = PD_OK;
    for (uint32_t i = 0; x->give && !x->pre && i < x->n_give && ms == PD_OK; i++) {
        ms = pipe_wait(x->mg->link, &x->give[i].len_req, NULL, err);
    }
    return ms;
}

/* Step 2 on every rank: weights, bundles out, bundles in (decoded as they arrive, held aside),
 * installed early or checked for the switch. */
static pd_status xfer_copy(xfer *x, pd_err *err)
{
    xfer_layout(x);
    pd_status ms = xfer_weights_mpi(x, err);
    if (ms == PD_OK)
        ms = xfer_send(x, err);
    if (ms == PD_OK) {
        xfer_weights(x);
        ms = xfer_precopy_finish(x, err);
    }
    if (ms == PD_OK)
        ms = xfer_receive(x, err);
    if (ms == PD_OK) {
        xfer_install(x);
        ms = xfer_wait_sends(x, err);
    }
    x->transfer_s = MPI_Wtime() - x->t_xfer - x->weights_s - x->install_s;
    return ms;
}

/* The weight bytes this rank frees at the switch: the layers it gives, in
 * its own model and in slices received earlier. */
static uint64_t xfer_release_bytes(const xfer *x)
{
    uint64_t b = 0;
    for (uint32_t i = 0; i < x->ng; i++) {
        b += model_layers_bytes(x->r->m, x->gf[i], x->gn[i]);
        for (uint32_t q = 0; q < x->mg->n_layers; q++)
            if (x->mg->slices[q])
                b += model_layers_bytes(x->mg->slices[q], x->gf[i], x->gn[i]);
    }
    return b;
}

/* The job's verdict from every rank's: the first failing rank's words, or
 * a layer whose two ends hold state of different digests. */
static pd_status xfer_verdict(xfer *x)
{
    migrate_report *rep = x->rep;
    const layermap *from = &x->r->lm, *to = &x->plan.to;
    uint32_t NL = x->NL;
    pd_status verdict = PD_OK;
    for (int q = 0; q < x->r->size && verdict == PD_OK; q++)
        if (x->vd[q].status) {
            verdict = (pd_status)x->vd[q].status;
            snprintf(rep->why, sizeof rep->why, "%s", x->vd[q].msg);
        }
    for (uint32_t L = 0; L < NL && verdict == PD_OK; L++) {
        uint32_t a = layermap_owner(from, L), b = layermap_owner(to, L);
        if (a == b)
            continue;
        rep->layers_moved++;
        uint64_t sent = x->all_dg[(size_t)a * 2 * NL + L], got = x->all_dg[(size_t)b * 2 * NL + NL + L];
        if (sent != got) {
            verdict = PD_ERR_CHECKSUM;
            snprintf(rep->why, sizeof rep->why,
                     "layer %u: rank %u holds state of digest %016llx, rank %u sent %016llx", L, b,
                     (unsigned long long)got, a, (unsigned long long)sent);
        }
    }
    return verdict;
}

/* The report's figures become the job's: sums, and maxima over ranks. */
static void report_sum(migrate_report *rep, const migrate_verdict *vd, int size)
{
    rep->precopy_bytes = rep->final_bytes = rep->resets = 0;
    rep->weights_mpi_bytes = 0;
    rep->weights_released = 0;
    rep->precopy_send_s = rep->precopy_recv_s = rep->precopy_alloc_s = 0; /* the job's: the maximum over ranks */
    for (int q = 0; q < size; q++) {
        rep->bytes += vd[q].bytes;
        rep->precopy_bytes += vd[q].precopy_bytes;
        rep->final_bytes += vd[q].final_bytes;
        rep->resets += vd[q].resets;
        rep->weights_mpi_bytes += vd[q].weights_mpi_bytes / 2; /* counted at both ends */
        rep->weights_released += vd[q].release_bytes;
        rep->precopy_send_s = vd[q].precopy_send_s > rep->precopy_send_s ? vd[q].precopy_send_s : rep->precopy_send_s;
        if (vd[q].precopy_recv_s > rep->precopy_recv_s) {
            rep->precopy_recv_s = vd[q].precopy_recv_s;
            rep->precopy_alloc_s = vd[q].precopy_alloc_s;
        }
        if (vd[q].copy_s > rep->copy_s)
            rep->copy_s = vd[q].copy_s;
        if (vd[q].export_s > rep->export_s)
            rep->export_s = vd[q].export_s;
        if (vd[q].weights_s > rep->weights_s)
            rep->weights_s = vd[q].weights_s;
        if (vd[q].transfer_s > rep->transfer_s)
            rep->transfer_s = vd[q].transfer_s;
    }
}

/* Step 3 on every rank: verdicts and digests gathered, *verdict the job's. */
static pd_status xfer_ack(xfer *x, pd_status *verdict, pd_err *err)
{
    rank *r = x->r;
    migrate_report *rep = x->rep;
    uint64_t release_bytes = xfer_release_bytes(x);
    migrate_verdict mine = {.status = x->st, .copy_s = MPI_Wtime() - x->t0, .export_s = x->export_s,
                            .weights_s = x->weights_s, .transfer_s = x->transfer_s, .bytes = x->sent_bytes,
                            .precopy_bytes = rep->precopy_bytes, .final_bytes = rep->final_bytes,
                            .resets = rep->resets, .weights_mpi_bytes = rep->weights_mpi_bytes,
                            .release_bytes = release_bytes, .precopy_send_s = rep->precopy_send_s,
                            .precopy_recv_s = rep->precopy_recv_s, .precopy_alloc_s = rep->precopy_alloc_s};
    if (x->st)
        snprintf(mine.msg, sizeof mine.msg, "%s", x->e.msg);
    pd_status st = pipe_allgather(r->p, &mine, sizeof mine, x->vd, err);
    if (st == PD_OK)
        st = pipe_allgather(r->p, x->dg, 2 * (size_t)x->NL * sizeof *x->dg, x->all_dg, err);
    if (st)
        return st;
    *verdict = xfer_verdict(x);
    report_sum(rep, x->vd, r->size);
    return PD_OK;
}

/* The switch on a rank, every rank having agreed: the layers given go (and
 * the giver keeps no weights of them), the layers taken come in, the map and
 * the head's budget follow. */
static pd_status xfer_commit(xfer *x, sched *sc, budget *bud, pd_err *err)
{
    rank *r = x->r;
    migrate *mg = x->mg;
    pd_status st = PD_OK;
    for (uint32_t i = 0; i < x->ng && st == PD_OK; i++)
        st = stage_remove_layers(r->st, x->gf[i], x->gn[i], err);
    /* slices go in slices_prune below, the rank's own model's layers here */
    for (uint32_t i = 0; i < x->ng && st == PD_OK; i++) {
        model_release_layers(r->m, x->gf[i], x->gn[i]);
        for (uint32_t q = 0; q < mg->n_layers; q++)
            if (mg->slices[q])
                model_release_layers(mg->slices[q], x->gf[i], x->gn[i]);
        for (uint32_t L = x->gf[i]; L < x->gf[i] + x->gn[i]; L++)
            mg->src[L] = NULL;
    }
    for (uint32_t i = 0; i < x->np && st == PD_OK; i++) {
        if (!x->early)
            st = x->pre ? precopy_add_layers(mg->pc, x->pf[i], x->pn[i], x->pw[i], x->ids, x->cnt, err)
                        : stage_add_layers_from(r->st, x->pf[i], x->pn[i], x->pw[i], spare_offer, &x->ss, err);
        if (!x->early && !x->pre && st == PD_OK)
            spares_taken(&x->ss, x->pf[i], x->pn[i]);
        if (st == PD_OK && x->pl[i]) {
            slice_keep(mg, x->pl[i]);
            x->pl[i] = NULL;
        }
        for (uint32_t L = x->pf[i]; st == PD_OK && L < x->pf[i] + x->pn[i]; L++)
            mg->src[L] = x->pw[i];
    }
    if (st == PD_OK) {
        r->lm = x->plan.to;
        slices_prune(mg);
        if (bud)
            st = budget_for_map(bud, sc, &x->plan.to, false, err);
    }
    if (st)
        pd_err_prefix(err, "migration: switching to the new map failed on rank %u after every rank agreed", x->me);
    return st;
}

/* Step 4: switch, or drop what was prepared. */
static pd_status xfer_switch(xfer *x, sched *sc, budget *bud, pd_status verdict, pd_err *err)
{
    double t = MPI_Wtime();
    pd_status st = PD_OK;
    if (verdict != PD_OK && x->early) /* refused elsewhere: drop what this rank added */
        xfer_remove_added(x);
    if (verdict == PD_OK) {
        st = xfer_commit(x, sc, bud, err);
        x->rep->moved = st == PD_OK;
    }
    x->rep->switch_s = MPI_Wtime() - t + x->install_s; /* installing early is part of the switch */
    return st;
}

pd_status migrate_run(migrate *mg, sched *sc, budget *bud, const layermap *target, migrate_report *rep, pd_err *err)
{
    xfer x = {.mg = mg, .r = mg->r, .rep = rep, .pre = precopy_active(mg->pc), .t0 = MPI_Wtime()};
    memset(rep, 0, sizeof *rep);
    rep->from = mg->r->lm;
    pd_status st = xfer_plan(&x, sc, bud, target, err);
    /* ended with the same outcome on every rank (refused at the plan, or
     * after the vote): a pre-copy's copies are left to drop */
    bool agreed = st == PD_OK && x.plan.refused;
    if (st == PD_OK && !x.plan.refused) {
        pd_status verdict = PD_OK;
        st = xfer_copy(&x, err);
        if (st == PD_OK)
            st = xfer_ack(&x, &verdict, err);
        if (st == PD_OK) {
            st = xfer_switch(&x, sc, bud, verdict, err);
            agreed = true;
        }
    }
    xfer_free(&x);
    if (agreed && x.pre) { /* moved or refused: the copies left go */
        pd_status ps = precopy_stop(mg->pc, err);
        if (st == PD_OK)
            st = ps;
    }
    if (agreed && !x.plan.refused && st == PD_OK)
        st = pipe_max_double(mg->r->p, rep->switch_s, &rep->switch_s, err);
    rep->total_s = MPI_Wtime() - x.t0;
    return st;
}
