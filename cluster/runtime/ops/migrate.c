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
/* A bundle travels in pieces of at most this many bytes (an MPI count is an
 * int). */
#define MIGRATE_PIECE ((uint64_t)1 << 30)

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

static const char *const fault_names[MIGRATE_FAULT_COUNT] = {"none", "corrupt", "weights"};

pd_status migrate_fault_parse(const char *s, migrate_fault *out, pd_err *err)
{
    for (int i = 0; i < MIGRATE_FAULT_COUNT; i++)
        if (strcmp(s, fault_names[i]) == 0) {
            *out = (migrate_fault)i;
            return PD_OK;
        }
    return pd_err_set(err, PD_ERR_ARG, "--migrate-fault '%s': expected none, corrupt or weights", s);
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

/* ---- a growable byte buffer as a bundle sink ------------------------------------ */

typedef struct membuf {
    uint8_t *p;
    size_t n, cap;
} membuf;

static pd_status membuf_sink(void *ctx, const void *bytes, size_t n, pd_err *err)
{
    membuf *b = ctx;
    if (n > b->cap - b->n) {
        size_t nc = b->cap ? b->cap : 4096;
        while (nc - b->n < n) {
            if (nc > SIZE_MAX / 2)
                return pd_err_set(err, PD_ERR_NOMEM, "migration: a bundle past the address space");
            nc *= 2;
        }
        uint8_t *np = realloc(b->p, nc);
        if (!np)
            return pd_err_set(err, PD_ERR_NOMEM, "migration: out of memory for a bundle of %zu bytes", nc);
        b->p = np;
        b->cap = nc;
    }
    memcpy(b->p + b->n, bytes, n);
    b->n += n;
    return PD_OK;
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
    uint8_t *buf;            /* the bundle (owned) */
    bundle_view *v;          /* receiver: the validated bundle */
    MPI_Request len_req;
    MPI_Request *req;        /* sender: one per piece of the bundle */
    uint64_t n_req;
} migrate_move;

static uint64_t n_pieces(uint64_t len)
{
    return (len + MIGRATE_PIECE - 1) / MIGRATE_PIECE;
}

/* The ack digest of a bundle as sent or received: its CRC32C (hardware,
 * one pass at memory speed) and its length. */
static uint64_t bundle_digest(const uint8_t *p, size_t n)
{
    return (uint64_t)crc32c_update(0, p, n) | (uint64_t)n << 32;
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

/* The head's half of step 1: is the target acceptable? */
static pd_status plan_check(migrate *mg, sched *sc, budget *bud, const layermap *target, pd_err *err)
{
    const layermap *cur = &mg->r->lm;
    if (target->n_stages != cur->n_stages)
        return pd_err_set(err, PD_ERR_ARG, "the map has %u ranges, the job %u ranks", target->n_stages, cur->n_stages);
    if (migrate_layers_moved(cur, target) == 0)
        return pd_err_set(err, PD_ERR_ARG, "that map is in force already");
    if (!bud)
        return PD_OK;
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
        st = budget_remap(bud, target->first, target->count, pr, mn, n, true, err);
    free(pr);
    free(mn);
    return st;
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

/* Collective at a drain point (every rank, the same maps): every rank that
 * takes layers and wants their weights over MPI gets them from their old
 * owners; *got says whether this rank did (then pw / pl hold the slices of
 * its np new ranges, or *local / why say why not). Errors are MPI failures. */
static pd_status weights_exchange(migrate *mg, const layermap *from, const layermap *to, uint32_t np,
                                  const uint32_t *pf, const uint32_t *pn, const model **pw, model **pl, bool *got,
                                  bool *sent, double *bytes, pd_status *local, pd_err *why, pd_err *err)
{
    rank *r = mg->r;
    uint32_t me = (uint32_t)r->rank, NL = r->hp.n_layers;
    int32_t mine = wants_mpi_weights(mg), *need = calloc((size_t)r->size, sizeof *need);
    if (!need)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    pd_status st = pipe_allgather(r->p, &mine, sizeof mine, need, err);
    *got = false;
    *sent = false;
    *bytes = 0;
    const gguf_file *f = model_gguf(r->m);
    const uint8_t *base = gguf_bytes(f);
    uint64_t size = gguf_file_size(f), data = gguf_data_offset(f);
    uint32_t hcrc = crc32c_update(0, base, (size_t)data);
    uint8_t *buf = st == PD_OK ? malloc(sizeof(wpiece) + WPIECE_MAX) : NULL;
    if (st == PD_OK && !buf)
        st = pd_err_set(err, PD_ERR_NOMEM, "out of memory for a weights buffer");
    bool corrupt = mg->fault == MIGRATE_FAULT_CORRUPT;
    /* sources: every layer they give to a rank that wants it, in layer order */
    for (uint32_t L = 0; L < NL && st == PD_OK; L++) {
        uint32_t a = layermap_owner(from, L), b = layermap_owner(to, L);
        if (a != me || b == me || !need[b])
            continue;
        uint64_t n;
        layer_tensor_bytes(f, L, &n);
        wpiece h = {.off = n, .len = 0, .crc = hcrc, .layer = L};
        MPI_Request q = MPI_REQUEST_NULL;
        if ((st = pipe_isend(mg->link, (int)b, &h, sizeof h, &q, err)) || (st = pipe_wait(mg->link, &q, NULL, err)))
            break;
        char pre[32];
        int plen = snprintf(pre, sizeof pre, "blk.%u.", L);
        for (uint64_t i = 0; i < gguf_tensor_count(f) && st == PD_OK; i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            if (strncmp(t->name, pre, (size_t)plen) != 0)
                continue;
            uint64_t toff = (uint64_t)((const uint8_t *)t->data - base);
            for (uint64_t o = 0; o < t->bytes && st == PD_OK; o += WPIECE_MAX) {
                uint64_t len = t->bytes - o < WPIECE_MAX ? t->bytes - o : WPIECE_MAX;
                wpiece *w = (wpiece *)(void *)buf;
                *w = (wpiece){.off = toff + o, .len = len, .crc = crc32c_update(0, base + toff + o, (size_t)len),
                              .layer = L};
                memcpy(buf + sizeof *w, base + toff + o, (size_t)len);
                if (corrupt) { /* test hook: after the CRC */
                    buf[sizeof *w + len / 2] ^= 0x40;
                    corrupt = false;
                }
                if ((st = pipe_isend(mg->link, (int)b, buf, sizeof *w + (size_t)len, &q, err)) == PD_OK)
                    st = pipe_wait(mg->link, &q, NULL, err);
                *bytes += (double)len;
                *sent = true;
            }
        }
    }
    /* receivers: one file image per new range, filled layer by layer */
    pd_status v = PD_OK;
    pd_err ve = {0};
    uint8_t *img[2] = {NULL, NULL};
    bool takes = false;
    for (uint32_t L = 0; L < NL; L++)
        takes |= layermap_owner(to, L) == me && layermap_owner(from, L) != me;
    if (mine && takes && st == PD_OK) {
        *got = true;
        for (uint32_t i = 0; i < np && v == PD_OK; i++)
            if (!(img[i] = model_image_new((size_t)size)))
                v = pd_err_set(&ve, PD_ERR_NOMEM, "rank %u: no memory for an image of the %llu-byte model file", me,
                               (unsigned long long)size);
            else
                memcpy(img[i], base, (size_t)data);
    }
    for (uint32_t L = 0; L < NL && st == PD_OK && mine; L++) {
        uint32_t a = layermap_owner(from, L), b = layermap_owner(to, L);
        if (b != me || a == me)
            continue;
        uint32_t which = np > 1 && L >= pf[1] && L < pf[1] + pn[1];
        size_t got_len;
        wpiece h;
        if ((st = pipe_recv(mg->link, (int)a, &h, sizeof h, &got_len, NULL, NULL, err)))
            break;
        if (v == PD_OK && (got_len != sizeof h || h.len != 0 || h.layer != L))
            v = pd_err_set(&ve, PD_ERR_FORMAT, "rank %u: the weights of layer %u from rank %u begin with a bad header",
                           me, L, a);
        if (v == PD_OK && h.crc != hcrc)
            v = pd_err_set(&ve, PD_ERR_MISMATCH, "rank %u: rank %u sends layer %u's weights from another model file "
                           "(header CRC32C %08x, this rank's %08x)", me, a, L, h.crc, hcrc);
        uint64_t count = h.off;
        for (uint64_t k = 0; k < count && st == PD_OK; k++) {
            if ((st = pipe_recv(mg->link, (int)a, buf, sizeof(wpiece) + WPIECE_MAX, &got_len, NULL, NULL, err)))
                break;
            const wpiece *w = (const wpiece *)(const void *)buf;
            if (v != PD_OK)
                continue;
            if (got_len < sizeof *w || w->len != got_len - sizeof *w || w->layer != L || w->off < data ||
                w->off > size || w->len > size - w->off)
                v = pd_err_set(&ve, PD_ERR_FORMAT, "rank %u: weights piece %llu of layer %u from rank %u: %zu bytes "
                               "for offset %llu, length %llu in a %llu-byte file", me, (unsigned long long)k, L, a,
                               got_len, (unsigned long long)w->off, (unsigned long long)w->len,
                               (unsigned long long)size);
            else if (crc32c_update(0, buf + sizeof *w, (size_t)w->len) != w->crc)
                v = pd_err_set(&ve, PD_ERR_CHECKSUM, "rank %u: weights piece %llu of layer %u from rank %u (file offset "
                               "%llu): CRC32C %08x, the bytes give %08x", me, (unsigned long long)k, L, a,
                               (unsigned long long)w->off, w->crc, crc32c_update(0, buf + sizeof *w, (size_t)w->len));
            else {
                memcpy(img[which] + w->off, buf + sizeof *w, (size_t)w->len);
                *bytes += (double)w->len;
            }
        }
    }
    free(buf);
    free(need);
    for (uint32_t i = 0; i < np && *got && v == PD_OK && st == PD_OK; i++) {
        model_load_opts mo = {.first_layer = pf[i],
                              .n_layers = pn[i],
                              .backend = r->o->backend,
                              .alloc = arena_alloc_iface(r->ar),
                              .share_rope = r->m};
        char name[1100];
        snprintf(name, sizeof name, "%s (layers %u-%u over MPI)", r->o->model_path, pf[i], pf[i] + pn[i] - 1);
        v = model_load_image(img[i], (size_t)size, name, &mo, &pl[i], &ve);
        img[i] = NULL; /* the model owns it now, or freed it */
        if (v == PD_OK && !model_digest_inherit_header(pl[i], r->m))
            v = pd_err_set(&ve, PD_ERR_MISMATCH, "%s: not the job's model file", name);
        if (v == PD_OK)
            pw[i] = pl[i];
    }
    for (uint32_t i = 0; i < 2; i++)
        model_image_free(img[i], (size_t)size);
    if (v != PD_OK)
        for (uint32_t i = 0; i < 2; i++) {
            model_free(pl[i]);
            pl[i] = NULL;
            pw[i] = NULL;
        }
    *local = v;
    *why = ve;
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

/* Everything migrate_run allocates for one migration, freed on every path
 * out of it (the early returns of a broken link included). ss may be NULL. */
static void run_buffers_free(migrate_move *give, uint32_t n_give, migrate_move *take, uint32_t n_take, model *pl[2],
                             spare_set *ss, uint64_t *dg, uint64_t *all_dg, migrate_verdict *vd, uint64_t *ids,
                             uint64_t *pos)
{
    if (ss)
        spares_free(ss);
    for (uint32_t i = 0; i < 2; i++)
        model_free(pl[i]);
    for (uint32_t i = 0; give && i < n_give; i++) {
        free(give[i].buf);
        free(give[i].req);
    }
    for (uint32_t i = 0; take && i < n_take; i++) {
        bundle_view_free(take[i].v);
        free(take[i].buf);
    }
    free(give);
    free(take);
    free(dg);
    free(all_dg);
    free(vd);
    free(ids);
    free(pos);
}

/* The stage owns them now. */
static void spares_taken(spare_set *ss)
{
    for (uint32_t i = 0; i < ss->n; i++)
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

/* Imports every record taken into a copy of its own (the checks of an
 * import, before the vote), and checks each copy against the stage. */
static pd_status spares_import(migrate *mg, const migrate_move *take, uint32_t n_take, spare_set *ss, pd_err *err)
{
    rank *r = mg->r;
    uint64_t total = 0;
    for (uint32_t i = 0; i < n_take; i++)
        total += take[i].v ? take[i].v->n_streams : 0;
    ss->layer = calloc(total + 1, sizeof *ss->layer);
    ss->stream = calloc(total + 1, sizeof *ss->stream);
    ss->c = calloc(total + 1, sizeof *ss->c);
    if (!ss->layer || !ss->stream || !ss->c)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    pd_status st = PD_OK;
    for (uint32_t i = 0; i < n_take && st == PD_OK; i++)
        for (uint64_t j = 0; take[i].v && j < take[i].v->n_streams && st == PD_OK; j++) {
            const bundle_entry *en = &take[i].v->entries[j];
            uint32_t prefill, max_new;
            uint64_t pos = 0;
            st = stage_stream_shape(r->st, en->stream, &prefill, &max_new, err);
            lcache *c = NULL;
            if (st == PD_OK)
                st = stage_spare_cache(r->st, prefill, max_new, &c, err);
            if (st == PD_OK) {
                ss->layer[ss->n] = take[i].layer;
                ss->stream[ss->n] = en->stream;
                ss->c[ss->n++] = c;
                st = stage_stream_pos(r->st, en->stream, &pos, err);
                if (st == PD_OK)
                    st = lcache_wire_import(c, stage_layer_identity(r->st, take[i].layer), take[i].layer, pos,
                                            en->record, en->len, 0, err);
                if (st == PD_OK)
                    st = stage_check_copy(r->st, en->stream, take[i].layer, c, err);
            }
            if (st)
                pd_err_prefix(err, "rank %d: layer %u stream %llu", r->rank, take[i].layer,
                              (unsigned long long)en->stream);
        }
    return st;
}

pd_status migrate_run(migrate *mg, sched *sc, budget *bud, const layermap *target, migrate_report *rep, pd_err *err)
{
    rank *r = mg->r;
    double t0 = MPI_Wtime();
    memset(rep, 0, sizeof *rep);
    rep->from = r->lm;
    pd_err e = {0};
    pd_status st = PD_OK;
    bool pre = precopy_active(mg->pc);

    /* 1. plan: the head checks the target and names the streams */
    migrate_plan plan;
    uint32_t cap = r->sz.max_streams + 1;
    uint64_t *ids = calloc(cap, sizeof *ids), *pos = calloc(cap, sizeof *pos);
    pd_status bs = plan_agree(mg, sc, bud, target, &plan, ids, pos, rep, err);
    if (bs == PD_OK && pre && !plan.refused && migrate_layers_moved(&plan.to, &mg->pre_to) != 0) {
        plan.refused = 1; /* every rank sees the same maps */
        snprintf(rep->why, sizeof rep->why, "the map changed since the pre-copy started");
    }
    if (bs || plan.refused) {
        free(ids);
        free(pos);
        if (bs == PD_OK && pre)
            bs = precopy_stop(mg->pc, err);
        rep->total_s = MPI_Wtime() - t0;
        return bs;
    }

    /* 2. copy */
    const layermap *from = &r->lm, *to = &plan.to;
    uint32_t me = (uint32_t)r->rank, NL = r->hp.n_layers, cnt = plan.n_streams;
    uint32_t of = from->first[me], oe = of + from->count[me], nf = to->first[me], ne = nf + to->count[me];
    uint32_t n_give = 0, n_take = 0;
    for (uint32_t L = 0; L < NL; L++) {
        n_give += layermap_owner(from, L) == me && layermap_owner(to, L) != me;
        n_take += layermap_owner(to, L) == me && layermap_owner(from, L) != me;
    }
    migrate_move *give = calloc(n_give + 1, sizeof *give), *take = calloc(n_take + 1, sizeof *take);
    uint64_t *dg = calloc(2 * (size_t)NL, sizeof *dg);                         /* [L] sent, [NL + L] received */
    uint64_t *all_dg = calloc(2 * (size_t)NL * (size_t)r->size, sizeof *all_dg);
    migrate_verdict *vd = calloc((size_t)r->size, sizeof *vd);
    if (!give || !take || !dg || !all_dg || !vd)
        st = pd_err_set(&e, PD_ERR_NOMEM, "out of memory");
    /* the rows up to the head's positions become final on every rank (what
     * the next micro-batch would do), so records hold final rows only */
    for (uint32_t i = 0; st == PD_OK && i < cnt; i++)
        st = stage_settle(r->st, ids[i], pos[i], &e);
    uint64_t sent_bytes = 0;
    bool corrupted = false;
    /* weights over MPI first (the link carries them before any bundle) */
    uint32_t pf[2], pn[2], np = pieces(nf, ne, of, oe, pf, pn);
    const model *pw[2] = {NULL, NULL};
    model *pl[2] = {NULL, NULL};
    bool mpi_w = false;
    double t_w = MPI_Wtime(), w_mpi = 0;
    if (!pre) {
        pd_status wl = PD_OK;
        pd_err we = {0};
        pd_status xs = weights_exchange(mg, from, to, np, pf, pn, pw, pl, &mpi_w, &corrupted, &w_mpi, &wl, &we, err);
        if (xs) { /* the link is broken: nothing can be agreed on */
            run_buffers_free(give, n_give, take, n_take, pl, NULL, dg, all_dg, vd, ids, pos);
            rep->total_s = MPI_Wtime() - t0;
            return xs;
        }
        if (mpi_w && wl && st == PD_OK) {
            st = wl;
            e = we;
        }
    }
    double w_mpi_s = MPI_Wtime() - t_w;
    double t_exp = MPI_Wtime();
    /* sources: one bundle per layer they give, sent without waiting (a
     * layer whose export failed is announced with length 0) */
    uint32_t k = 0;
    for (uint32_t L = of; give && !pre && L < oe; L++) {
        if (layermap_owner(to, L) == me)
            continue;
        migrate_move *mv = &give[k++];
        mv->layer = L;
        mv->peer = (int)layermap_owner(to, L);
        mv->len_req = MPI_REQUEST_NULL;
        if (st == PD_OK) {
            /* every record first: the bundle's size is then known and its
             * buffer is allocated once (no growth copies, one set of page
             * faults) */
            uint8_t **recs = calloc(cnt + 1, sizeof *recs);
            size_t *lens = calloc(cnt + 1, sizeof *lens), total = BUNDLE_HEADER_BYTES;
            if (!recs || !lens)
                st = pd_err_set(&e, PD_ERR_NOMEM, "out of memory");
            for (uint32_t i = 0; st == PD_OK && i < cnt; i++)
                if ((st = stage_export_layer(r->st, ids[i], L, &recs[i], &lens[i], &e)) == PD_OK)
                    total += BUNDLE_ENTRY_OVERHEAD + lens[i];
            membuf mb = {0};
            if (st == PD_OK && !(mb.p = malloc(total)))
                st = pd_err_set(&e, PD_ERR_NOMEM, "out of memory for layer %u's bundle of %zu bytes", L, total);
            mb.cap = mb.p ? total : 0;
            bundle_writer *bw = NULL;
            if (st == PD_OK)
                st = bundle_writer_new(membuf_sink, &mb, stage_layer_identity(r->st, L), L, cnt, &bw, &e);
            for (uint32_t i = 0; st == PD_OK && i < cnt; i++)
                st = bundle_writer_add_record(bw, ids[i], recs[i], lens[i], &e);
            for (uint32_t i = 0; recs && i < cnt; i++)
                free(recs[i]);
            free(recs);
            free(lens);
            if (st == PD_OK)
                st = bundle_writer_finish(bw, &e);
            bundle_writer_free(bw);
            if (st == PD_OK) {
                mv->buf = mb.p;
                mv->len = mb.n;
                dg[L] = bundle_digest(mb.p, mb.n);
                sent_bytes += mb.n;
                if (mg->fault == MIGRATE_FAULT_CORRUPT && !corrupted) {
                    mv->buf[mv->len / 2] ^= 0x40; /* test hook: after the CRC */
                    corrupted = true;
                }
            } else {
                free(mb.p);
                pd_err_prefix(&e, "rank %u exporting layer %u", me, L);
            }
        }
    }
    double export_s = MPI_Wtime() - t_exp, t_xfer = MPI_Wtime();
    pd_status ms = PD_OK; /* MPI failures: the job cannot go on */
    for (uint32_t i = 0; i < k && ms == PD_OK; i++) {
        migrate_move *mv = &give[i];
        ms = pipe_isend(mg->link, mv->peer, &mv->len, sizeof mv->len, &mv->len_req, err);
        if (ms == PD_OK && mv->len) {
            mv->req = calloc(n_pieces(mv->len), sizeof *mv->req);
            if (!mv->req) /* the receiver expects the pieces: nothing can be agreed on */
                ms = pd_err_set(err, PD_ERR_NOMEM, "migration: out of memory for send requests");
        }
        for (uint64_t q = 0; ms == PD_OK && q < n_pieces(mv->len); q++) {
            uint64_t off = q * MIGRATE_PIECE, n = mv->len - off < MIGRATE_PIECE ? mv->len - off : MIGRATE_PIECE;
            ms = pipe_isend(mg->link, mv->peer, mv->buf + off, (size_t)n, &mv->req[q], err);
            mv->n_req = q + 1;
        }
    }
    /* receivers: weights first (the file, not the wire), then each bundle,
     * validated whole */
    if (st != PD_OK)
        np = 0;
    t_w = MPI_Wtime();
    if (pre) {
        /* the weights came during the pre-copy (or come now), the rows
         * since its last chunks come now */
        if (st == PD_OK) {
            precopy_weights(mg, to);
            for (uint32_t i = 0; i < 2; i++) {
                pw[i] = mg->pre_pw[i];
                pl[i] = mg->pre_pl[i];
                mg->pre_pl[i] = NULL;
            }
            if (mg->pre_w_status) {
                st = mg->pre_w_status;
                e = mg->pre_w_err;
            }
        }
    } else if (!mpi_w)
        for (uint32_t i = 0; i < np && st == PD_OK; i++)
            st = weights_for(mg, pf[i], pn[i], &pw[i], &pl[i], &e);
    double weights_s = pre ? mg->pre_w_s : mpi_w ? w_mpi_s : MPI_Wtime() - t_w;
    rep->weights_mpi_bytes = pre ? mg->pre_w_mpi : w_mpi;
    if (pre && ms == PD_OK) {
        pd_status local = PD_OK;
        pd_err why = {0};
        ms = precopy_finish(mg->pc, ids, cnt, dg, &local, &why, err);
        if (ms == PD_OK && local != PD_OK && st == PD_OK) {
            st = local;
            e = why;
        }
        precopy_stats ps;
        precopy_get_stats(mg->pc, &ps);
        sent_bytes = ps.bytes_sent + ps.final_bytes;
        rep->precopy_bytes = ps.bytes_sent;
        rep->final_bytes = ps.final_bytes;
        rep->resets = ps.resets;
        rep->precopy_s = t0 - ps.started;
        rep->precopy_send_s = ps.send_s;
        rep->precopy_recv_s = ps.recv_s;
        rep->precopy_alloc_s = ps.alloc_s;
    }
    k = 0;
    for (uint32_t L = nf; take && !pre && L < ne && ms == PD_OK; L++) {
        if (layermap_owner(from, L) == me)
            continue;
        migrate_move *mv = &take[k++];
        mv->layer = L;
        mv->peer = (int)layermap_owner(from, L);
        size_t got;
        ms = pipe_recv(mg->link, mv->peer, &mv->len, sizeof mv->len, &got, NULL, NULL, err);
        if (ms)
            break;
        if (mv->len == 0) {
            if (st == PD_OK)
                st = pd_err_set(&e, PD_ERR_REFUSED, "rank %d could not export layer %u", mv->peer, L);
            continue;
        }
        mv->buf = (st == PD_OK && mv->len <= SIZE_MAX) ? malloc((size_t)mv->len) : NULL;
        if (!mv->buf && st == PD_OK)
            st = pd_err_set(&e, PD_ERR_NOMEM, "rank %u: no memory for layer %u's %llu bytes", me, L,
                            (unsigned long long)mv->len);
        /* a bundle nobody wants is still received (into nothing) so the
         * link stays in step */
        for (uint64_t q = 0; ms == PD_OK && q < n_pieces(mv->len); q++) {
            uint64_t off = q * MIGRATE_PIECE, n = mv->len - off < MIGRATE_PIECE ? mv->len - off : MIGRATE_PIECE;
            pd_status rs = pipe_recv(mg->link, mv->peer, mv->buf ? mv->buf + off : NULL, mv->buf ? (size_t)n : 0, &got,
                                     NULL, NULL, err);
            if (rs != PD_OK && mv->buf)
                ms = rs;
        }
        if (ms)
            break;
        if (st != PD_OK || !mv->buf)
            continue;
        dg[NL + L] = bundle_digest(mv->buf, (size_t)mv->len);
        st = bundle_parse(mv->buf, (size_t)mv->len, &mv->v, &e);
        if (st == PD_OK && mv->v->identity != stage_layer_identity(r->st, L))
            st = pd_err_set(&e, PD_ERR_MISMATCH, "identity %016llx, expected %016llx (another model or policy)",
                            (unsigned long long)mv->v->identity, (unsigned long long)stage_layer_identity(r->st, L));
        else if (st == PD_OK && mv->v->layer != L)
            st = pd_err_set(&e, PD_ERR_FORMAT, "holds layer %u", mv->v->layer);
        else if (st == PD_OK && mv->v->n_streams != cnt)
            st = pd_err_set(&e, PD_ERR_FORMAT, "holds %llu streams, the plan %u", (unsigned long long)mv->v->n_streams,
                            cnt);
        for (uint64_t i = 0; st == PD_OK && i < mv->v->n_streams; i++) {
            bool known = false;
            for (uint32_t j = 0; j < cnt; j++)
                known |= ids[j] == mv->v->entries[i].stream;
            if (!known)
                st = pd_err_set(&e, PD_ERR_FORMAT, "stream %llu is not in the plan",
                                (unsigned long long)mv->v->entries[i].stream);
        }
        if (st)
            pd_err_prefix(&e, "rank %u: layer %u from rank %d", me, L, mv->peer);
    }
    /* the receiver's own memory check, on the bytes that arrived (the head
     * checked the predicted reservations already) */
    uint64_t lim = r->o->mem_limit, incoming = 0;
    for (uint32_t i = 0; take && !pre && i < n_take; i++)
        incoming += take[i].len;
    stage_mem sm;
    stage_memory(r->st, &sm);
    if (st == PD_OK && lim != 0 && lim != UINT64_MAX && sm.cache_bytes + incoming > lim)
        st = pd_err_set(&e, PD_ERR_RANGE,
                        "rank %u: its caches hold %llu bytes; the %llu bytes of state arriving would pass its "
                        "--mem-limit of %llu", me, (unsigned long long)sm.cache_bytes, (unsigned long long)incoming,
                        (unsigned long long)lim);
    /* Install before the vote when the layers taken sit next to the ones
     * held (every move between neighbours): the caches' own install
     * validation (geometry against this stage's configuration) then runs
     * before this rank votes, and a refusal only removes the added layers
     * again. A rank whose new range does not meet its old one cannot hold
     * both: it installs at the switch. */
    uint32_t lo = nf > of ? nf : of, hi = ne < oe ? ne : oe, added = 0;
    bool early = st == PD_OK && ms == PD_OK && np > 0 && lo < hi;
    double t_inst = MPI_Wtime();
    for (uint32_t i = 0; early && st == PD_OK && i < np; i++)
        if ((st = pre ? precopy_add_layers(mg->pc, pf[i], pn[i], pw[i], ids, cnt, &e)
                      : stage_add_layers(r->st, pf[i], pn[i], pw[i], &e)) == PD_OK)
            added++;
    for (uint32_t i = 0; early && !pre && st == PD_OK && i < n_take; i++)
        for (uint64_t j = 0; st == PD_OK && j < take[i].v->n_streams; j++)
            if ((st = stage_import_layer(r->st, take[i].v->entries[j].stream, take[i].layer,
                                         take[i].v->entries[j].record, take[i].v->entries[j].len, &e)) != PD_OK)
                pd_err_prefix(&e, "rank %u: installing layer %u", me, take[i].layer);
    if (early && st != PD_OK) { /* back to exactly what it held */
        for (uint32_t i = 0; i < added; i++)
            CHECK(stage_remove_layers(r->st, pf[i], pn[i], &(pd_err){0}) == PD_OK);
        early = false;
    }
    /* A rank that installs at the switch validates now what it will install:
     * pre-copied copies against the stage (stage_check_copy), bundle records
     * imported into copies of its own (lcache_wire_import: geometry, kind,
     * position), which the switch then hands to the stage. */
    spare_set ss = {0};
    if (!early && st == PD_OK && ms == PD_OK && np > 0) {
        if (pre)
            st = precopy_check(mg->pc, ids, cnt, &e);
        else
            st = spares_import(mg, take, n_take, &ss, &e);
    }
    double install_s = MPI_Wtime() - t_inst;
    for (uint32_t i = 0; give && !pre && i < n_give && ms == PD_OK; i++) {
        ms = pipe_wait(mg->link, &give[i].len_req, NULL, err);
        for (uint64_t q = 0; ms == PD_OK && q < give[i].n_req; q++)
            ms = pipe_wait(mg->link, &give[i].req[q], NULL, err);
    }
    double transfer_s = MPI_Wtime() - t_xfer - weights_s - install_s;
    if (ms) { /* the link is broken: nothing can be agreed on */
        run_buffers_free(give, n_give, take, n_take, pl, &ss, dg, all_dg, vd, ids, pos);
        rep->total_s = MPI_Wtime() - t0;
        return ms;
    }

    /* 3. ack: verdicts and digests on every rank */
    uint64_t release_bytes = 0;
    {
        uint32_t gf[2], gn[2], ng = pieces(of, oe, nf, ne, gf, gn);
        for (uint32_t i = 0; i < ng; i++) {
            release_bytes += model_layers_bytes(r->m, gf[i], gn[i]);
            for (uint32_t q = 0; q < mg->n_layers; q++) /* and of slices received earlier */
                if (mg->slices[q])
                    release_bytes += model_layers_bytes(mg->slices[q], gf[i], gn[i]);
        }
    }
    migrate_verdict mine = {.status = st, .copy_s = MPI_Wtime() - t0, .export_s = export_s, .weights_s = weights_s,
                            .transfer_s = transfer_s, .bytes = sent_bytes, .precopy_bytes = rep->precopy_bytes,
                            .final_bytes = rep->final_bytes, .resets = rep->resets,
                            .weights_mpi_bytes = rep->weights_mpi_bytes,
                            .release_bytes = release_bytes,
                            .precopy_send_s = rep->precopy_send_s,
                            .precopy_recv_s = rep->precopy_recv_s,
                            .precopy_alloc_s = rep->precopy_alloc_s};
    if (st)
        snprintf(mine.msg, sizeof mine.msg, "%s", e.msg);
    pd_status gs = pipe_allgather(r->p, &mine, sizeof mine, vd, err);
    if (gs == PD_OK)
        gs = pipe_allgather(r->p, dg, 2 * (size_t)NL * sizeof *dg, all_dg, err);
    if (gs) {
        run_buffers_free(give, n_give, take, n_take, pl, &ss, dg, all_dg, vd, ids, pos);
        rep->total_s = MPI_Wtime() - t0;
        return gs;
    }
    pd_status verdict = PD_OK;
    for (int q = 0; q < r->size && verdict == PD_OK; q++)
        if (vd[q].status) {
            verdict = (pd_status)vd[q].status;
            snprintf(rep->why, sizeof rep->why, "%s", vd[q].msg);
        }
    for (uint32_t L = 0; L < NL && verdict == PD_OK; L++) {
        uint32_t a = layermap_owner(from, L), b = layermap_owner(to, L);
        if (a == b)
            continue;
        rep->layers_moved++;
        uint64_t sent = all_dg[(size_t)a * 2 * NL + L], got = all_dg[(size_t)b * 2 * NL + NL + L];
        if (sent != got) {
            verdict = PD_ERR_CHECKSUM;
            snprintf(rep->why, sizeof rep->why,
                     "layer %u: rank %u holds state of digest %016llx, rank %u sent %016llx", L, b,
                     (unsigned long long)got, a, (unsigned long long)sent);
        }
    }
    rep->precopy_bytes = rep->final_bytes = rep->resets = 0;
    rep->weights_mpi_bytes = 0;
    rep->weights_released = 0;
    rep->precopy_send_s = rep->precopy_recv_s = rep->precopy_alloc_s = 0; /* the job's: the maximum over ranks */
    for (int q = 0; q < r->size; q++) {
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

    /* 4. switch, or drop what was prepared */
    double t1 = MPI_Wtime();
    pd_status cs = PD_OK;
    if (verdict != PD_OK && early) /* refused elsewhere: drop what this rank added */
        for (uint32_t i = 0; i < added; i++)
            CHECK(stage_remove_layers(r->st, pf[i], pn[i], &(pd_err){0}) == PD_OK);
    if (verdict == PD_OK) {
        uint32_t gf[2], gn[2], ng = pieces(of, oe, nf, ne, gf, gn);
        for (uint32_t i = 0; i < ng && cs == PD_OK; i++)
            cs = stage_remove_layers(r->st, gf[i], gn[i], err);
        /* the giver keeps no weights of what it gave (slices go in
         * slices_prune below, its own model's layers here) */
        for (uint32_t i = 0; i < ng && cs == PD_OK; i++) {
            model_release_layers(r->m, gf[i], gn[i]);
            for (uint32_t q = 0; q < mg->n_layers; q++)
                if (mg->slices[q])
                    model_release_layers(mg->slices[q], gf[i], gn[i]);
            for (uint32_t L = gf[i]; L < gf[i] + gn[i]; L++)
                mg->src[L] = NULL;
        }
        for (uint32_t i = 0; i < np && cs == PD_OK; i++) {
            if (!early)
                cs = pre ? precopy_add_layers(mg->pc, pf[i], pn[i], pw[i], ids, cnt, err)
                         : stage_add_layers_from(r->st, pf[i], pn[i], pw[i], spare_offer, &ss, err);
            if (cs == PD_OK && pl[i]) {
                slice_keep(mg, pl[i]);
                pl[i] = NULL;
            }
            for (uint32_t L = pf[i]; cs == PD_OK && L < pf[i] + pn[i]; L++)
                mg->src[L] = pw[i];
        }
        if (!early && !pre && cs == PD_OK)
            spares_taken(&ss);
        if (cs == PD_OK) {
            r->lm = plan.to;
            slices_prune(mg);
            if (bud) {
                stream_table *t = sched_streams(sc);
                uint32_t n = 0;
                uint64_t *prv = calloc(stream_table_capacity(t) + 1, sizeof *prv);
                uint32_t *mnv = calloc(stream_table_capacity(t) + 1, sizeof *mnv);
                if (!prv || !mnv)
                    cs = pd_err_set(err, PD_ERR_NOMEM, "out of memory");
                for (uint32_t i = 0; cs == PD_OK && i < stream_table_capacity(t); i++)
                    if (stream_table_at(t, i)) {
                        prv[n] = stream_table_at(t, i)->prefill_rows;
                        mnv[n++] = stream_table_at(t, i)->max_new;
                    }
                if (cs == PD_OK)
                    cs = budget_remap(bud, plan.to.first, plan.to.count, prv, mnv, n, false, err);
                free(prv);
                free(mnv);
            }
        }
        if (cs)
            pd_err_prefix(err, "migration: switching to the new map failed on rank %u after every rank agreed", me);
        rep->moved = cs == PD_OK;
    }
    rep->switch_s = MPI_Wtime() - t1 + install_s; /* installing early is part of the switch */
    run_buffers_free(give, n_give, take, n_take, pl, &ss, dg, all_dg, vd, ids, pos);
    if (pre) { /* moved or refused: the copies left go */
        pd_status ps = precopy_stop(mg->pc, err);
        if (cs == PD_OK)
            cs = ps;
    }
    if (cs == PD_OK)
        cs = pipe_max_double(r->p, rep->switch_s, &rep->switch_s, err);
    rep->total_s = MPI_Wtime() - t0;
    return cs;
}
