/* State bundles (bundle.h): whole-bundle validation, all-or-nothing install,
 * and the streaming writer. */
#include "comm/bundle.h"

#include "base/check.h"
#include "comm/crc32c.h"

#include <stdlib.h>
#include <string.h>

/* ---- validation: the streaming reader ------------------------------------ */

/* The units a bundle is read in: the header, then per entry its head (stream
 * id, record length) and its body (record and CRC). A unit that lies whole in
 * the bytes pushed is read in place; one split between pushes is gathered
 * (the body into rec, grown to the largest record). */
enum { BR_HEADER, BR_HEAD, BR_BODY, BR_DONE };

/* Stream ids seen so far: open addressing, key+1 (0 = empty slot). */
typedef struct id_set {
    uint64_t *key;
    uint64_t *index; /* entry index of each key */
    size_t cap;      /* power of two, > 2 * stream count */
} id_set;

/* INV: off <= vr.len (the announced bytes); have < need while gathering;
 * state BR_DONE only when off == vr.len and every entry was read. */
struct bundle_reader {
    bundle_reader_ops ops;
    void *ctx;
    rd vr;           /* the announced bytes as a reader: offsets, counts and
                        messages only (nothing is read through it) */
    pd_err e;        /* the first failure (sticky) */
    int state;
    uint64_t off;    /* bytes consumed */
    size_t need, have;
    uint8_t small[BUNDLE_HEADER_BYTES];
    uint8_t *rec;    /* [rec_cap] a body split between pushes */
    size_t rec_cap;
    bundle_view hdr; /* the header's fields (entries NULL) */
    uint64_t i;      /* entries read */
    uint64_t stream; /* the current entry's */
    uint32_t crc;    /* the current entry's, over its head so far */
    id_set ids;
};

static pd_status br_fail(bundle_reader *br, pd_err *err)
{
    if (br->vr.status == PD_OK)
        br->vr.status = br->e.status;
    if (err)
        *err = br->e;
    return br->e.status;
}

pd_status bundle_reader_new(uint64_t bytes, const bundle_reader_ops *ops, void *ctx, bundle_reader **out,
                            pd_err *err)
{
    if (!out || !ops)
        return pd_err_set(err, PD_ERR_ARG, "bundle: reader needs ops and out");
    if (bytes > SIZE_MAX)
        return pd_err_set(err, PD_ERR_RANGE, "bundle: %llu bytes overflow the address space",
                          (unsigned long long)bytes);
    bundle_reader *br = calloc(1, sizeof *br);
    if (!br)
        return pd_err_set(err, PD_ERR_NOMEM, "bundle: no memory for a reader");
    br->ops = *ops;
    br->ctx = ctx;
    rd_init(&br->vr, NULL, 0, 0, "bundle", &br->e);
    br->vr.len = (size_t)bytes;
    br->state = BR_HEADER;
    br->need = BUNDLE_HEADER_BYTES;
    if (bytes < BUNDLE_HEADER_BYTES) /* reported by the first push or the finish */
        rd_fail(&br->vr, PD_ERR_TRUNCATED, "header needs %u bytes, %llu announced", BUNDLE_HEADER_BYTES,
                (unsigned long long)bytes);
    *out = br;
    return PD_OK;
}

void bundle_reader_free(bundle_reader *br)
{
    if (!br)
        return;
    free(br->rec);
    free(br->ids.key);
    free(br->ids.index);
    free(br);
}

/* Adds stream (entry i) to the set; a repeated id fails the reader. */
static pd_status ids_add(bundle_reader *br, uint64_t stream, size_t at)
{
    id_set *s = &br->ids;
    size_t h = (size_t)((stream * 0x9e3779b97f4a7c15ull) >> 17) & (s->cap - 1);
    while (s->key[h]) {
        if (s->key[h] == stream + 1)
            return rd_fail_at(&br->vr, at, PD_ERR_FORMAT, "duplicate stream id %llu (entries %llu and %llu)",
                              (unsigned long long)stream, (unsigned long long)s->index[h],
                              (unsigned long long)br->i);
        h = (h + 1) & (s->cap - 1);
    }
    s->key[h] = stream + 1;
    s->index[h] = br->i;
    return PD_OK;
}

/* The next unit starts here: an entry's head, or the end. */
static pd_status next_entry(bundle_reader *br)
{
    if (br->i < br->hdr.n_streams) {
        br->state = BR_HEAD;
        br->need = 16;
        if (rd_remaining(&br->vr) < 16)
            return rd_fail(&br->vr, PD_ERR_TRUNCATED, "entry %llu needs 16 bytes for its stream id and length, %zu "
                           "remain", (unsigned long long)br->i, rd_remaining(&br->vr));
        return PD_OK;
    }
    br->state = BR_DONE;
    br->need = 0;
    return rd_expect_end(&br->vr);
}

static pd_status read_header(bundle_reader *br, const uint8_t *p)
{
    rd *r = &br->vr;
    if (memcmp(p, BUNDLE_MAGIC, 4) != 0)
        return rd_fail_at(r, 0, PD_ERR_FORMAT, "magic %02x %02x %02x %02x is not \"CMFB\"", p[0], p[1], p[2],
                          p[3]);
    uint32_t version = rd_le32(p + 4), crc = rd_le32(p + 32), want = crc32c_update(0, p, 32);
    if (version != BUNDLE_VERSION)
        return rd_fail_at(r, 4, PD_ERR_VERSION, "bundle version %u, this build reads version %u", version,
                          BUNDLE_VERSION);
    if (crc != want)
        return rd_fail_at(r, 32, PD_ERR_CHECKSUM, "header crc %08x, bytes 0..32 give %08x", crc, want);
    uint32_t reserved = rd_le32(p + 20);
    if (reserved != 0)
        return rd_fail_at(r, 20, PD_ERR_FORMAT, "reserved field %u is not 0", reserved);
    uint64_t count = rd_le64(p + 24);
    size_t min_bytes = 0;
    if (rd_check_count(r, "stream count", count, BUNDLE_ENTRY_OVERHEAD, &min_bytes) != PD_OK)
        return r->status;
    br->hdr = (bundle_view){.version = version, .identity = rd_le64(p + 8), .layer = rd_le32(p + 16),
                            .n_streams = count, .bytes = r->len};
    size_t cap = 4;
    while (cap <= 2 * (size_t)count)
        cap *= 2;
    br->ids = (id_set){.key = calloc(cap, sizeof(uint64_t)), .index = calloc(cap, sizeof(uint64_t)), .cap = cap};
    if (!br->ids.key || !br->ids.index)
        return pd_err_set(&br->e, PD_ERR_NOMEM, "bundle: no memory for %llu stream ids", (unsigned long long)count);
    if (br->ops.header && br->ops.header(br->ctx, &br->hdr, &br->e) != PD_OK)
        return br->e.status;
    return next_entry(br);
}

static pd_status read_head(bundle_reader *br, const uint8_t *p)
{
    char f[64];
    snprintf(f, sizeof f, "entry %llu record length", (unsigned long long)br->i);
    br->stream = rd_le64(p);
    uint64_t rlen = rd_le64(p + 8);
    size_t n = 0;
    /* the record and its CRC must fit in what is left of the announced bytes */
    if (rd_check_count(&br->vr, f, rlen, 1, &n) != PD_OK)
        return br->vr.status;
    if (rd_remaining(&br->vr) - n < 4)
        return rd_fail(&br->vr, PD_ERR_TRUNCATED, "%s %zu leaves no room for its crc (%zu bytes remain)", f, n,
                       rd_remaining(&br->vr));
    br->crc = crc32c_update(0, p, 16);
    br->state = BR_BODY;
    br->need = n + 4;
    return PD_OK;
}

static pd_status read_body(bundle_reader *br, const uint8_t *p)
{
    size_t len = br->need - 4, at = (size_t)br->off - br->need; /* the record's first byte */
    uint32_t ecrc = rd_le32(p + len), got = crc32c_update(br->crc, p, len);
    unsigned long long i = br->i, stream = br->stream;
    if (got != ecrc)
        return rd_fail_at(&br->vr, at + len, PD_ERR_CHECKSUM, "entry %llu (stream %llu) crc %08x, its bytes give %08x",
                          i, stream, ecrc, got);
    bundle_entry e = {.stream = br->stream, .record = p, .len = len, .offset = at};
    if (wire_inspect(p, len, 0, at, &e.info, &br->e) != PD_OK) {
        pd_err_prefix(&br->e, "bundle: entry %llu (stream %llu)", i, stream);
        return br->e.status;
    }
    if (e.info.identity != br->hdr.identity || e.info.layer != br->hdr.layer)
        return rd_fail_at(&br->vr, at + 8, PD_ERR_MISMATCH,
                          "entry %llu (stream %llu): record identity %016llx layer %u, the bundle is %016llx layer %u",
                          i, stream, (unsigned long long)e.info.identity, e.info.layer,
                          (unsigned long long)br->hdr.identity, br->hdr.layer);
    if (ids_add(br, br->stream, at - 16) != PD_OK)
        return br->vr.status;
    if (br->ops.entry && br->ops.entry(br->ctx, &e, &br->e) != PD_OK)
        return br->e.status;
    br->i++;
    return PD_OK;
}

/* Reads the unit at p (the state's need bytes, consumed already). */
static pd_status read_unit(bundle_reader *br, const uint8_t *p)
{
    if (br->state == BR_HEADER)
        return read_header(br, p);
    if (br->state == BR_HEAD)
        return read_head(br, p);
    pd_status s = read_body(br, p);
    return s == PD_OK ? next_entry(br) : s;
}

/* Where a unit split between pushes is gathered. */
static uint8_t *gather_buf(bundle_reader *br)
{
    if (br->state != BR_BODY)
        return br->small;
    if (br->rec_cap < br->need) {
        uint8_t *b = realloc(br->rec, br->need);
        if (!b)
            return NULL;
        br->rec = b;
        br->rec_cap = br->need;
    }
    return br->rec;
}

pd_status bundle_reader_push(bundle_reader *br, const void *bytes, size_t n, pd_err *err)
{
    if (br->e.status != PD_OK)
        return br_fail(br, err);
    size_t arrived = (size_t)br->off + br->have;
    if (n > br->vr.len - arrived) {
        rd_fail_at(&br->vr, br->vr.len, PD_ERR_FORMAT, "%zu bytes arrived past the %zu announced",
                   n - (br->vr.len - arrived), br->vr.len);
        return br_fail(br, err);
    }
    const uint8_t *p = bytes;
    while (n > 0 && br->state != BR_DONE) {
        size_t k = br->need - br->have < n ? br->need - br->have : n;
        const uint8_t *unit = p;
        if (br->have > 0 || k < br->need) { /* split between pushes: gathered */
            uint8_t *dst = gather_buf(br);
            if (!dst) {
                pd_err_set(&br->e, PD_ERR_NOMEM, "bundle: no memory for a record of %zu bytes", br->need);
                return br_fail(br, err);
            }
            memcpy(dst + br->have, p, k);
            br->have += k;
            unit = br->have == br->need ? dst : NULL;
        }
        p += k;
        n -= k;
        if (!unit)
            break;
        br->off += br->need;
        br->vr.off = (size_t)br->off;
        br->have = 0;
        if (read_unit(br, unit) != PD_OK)
            return br_fail(br, err);
    }
    return PD_OK;
}

pd_status bundle_reader_finish(bundle_reader *br, pd_err *err)
{
    if (br->e.status == PD_OK && br->state != BR_DONE)
        rd_fail(&br->vr, PD_ERR_TRUNCATED, "%llu of the %zu announced bytes arrived",
                (unsigned long long)(br->off + br->have), br->vr.len);
    return br->e.status == PD_OK ? PD_OK : br_fail(br, err);
}

/* ---- validation of a whole bundle in memory ------------------------------ */

/* bundle_parse's reader callbacks: the entries borrow the buffer. */
typedef struct parse_to {
    bundle_view *v;
    size_t n; /* entries filled */
} parse_to;

static pd_status parse_header(void *ctx, const bundle_view *h, pd_err *err)
{
    bundle_view *v = ((parse_to *)ctx)->v;
    *v = *h;
    v->entries = h->n_streams ? calloc((size_t)h->n_streams, sizeof *v->entries) : NULL;
    if (h->n_streams && !v->entries)
        return pd_err_set(err, PD_ERR_NOMEM, "bundle: no memory for %llu entries", (unsigned long long)h->n_streams);
    return PD_OK;
}

static pd_status parse_entry(void *ctx, const bundle_entry *e, pd_err *err)
{
    (void)err;
    parse_to *to = ctx; /* the reader calls at most n_streams times */
    to->v->entries[to->n++] = *e;
    return PD_OK;
}

pd_status bundle_parse(const void *buf, size_t len, bundle_view **out, pd_err *err)
{
    if (!out)
        return pd_err_set(err, PD_ERR_ARG, "bundle: out is NULL");
    bundle_view *v = calloc(1, sizeof *v);
    bundle_reader *br = NULL;
    if (!v)
        return pd_err_set(err, PD_ERR_NOMEM, "bundle: no memory for a view");
    static const bundle_reader_ops ops = {.header = parse_header, .entry = parse_entry};
    parse_to to = {.v = v}; /* outlives br */
    pd_status s = bundle_reader_new(len, &ops, &to, &br, err);
    if (s == PD_OK && (s = bundle_reader_push(br, buf, len, err)) == PD_OK)
        s = bundle_reader_finish(br, err);
    bundle_reader_free(br);
    if (s != PD_OK) {
        bundle_view_free(v);
        return s;
    }
    *out = v;
    return PD_OK;
}

void bundle_view_free(bundle_view *v)
{
    if (!v)
        return;
    free(v->entries);
    free(v);
}

/* One entry's pending install, whichever kind of target it resolved to. */
typedef struct install_slot {
    const void *target; /* for the duplicate check */
    lcache_wire_pending *lp;
    wire_pending *wp;
} install_slot;

static const void *target_of(const bundle_target *t)
{
    return t->c ? (const void *)t->c : t->ref.kv ? (const void *)t->ref.kv : (const void *)t->ref.ring;
}

static pd_status install_prepare(const bundle_entry *e, const bundle_target *t, install_slot *slot, pd_err *err)
{
    if (!slot->target)
        return pd_err_set(err, PD_ERR_ARG, "bundle: the resolver named no target");
    if (t->c)
        return lcache_wire_prepare(t->c, t->ref.identity, t->ref.layer, t->pos, e->record, e->len, e->offset,
                                   &slot->lp, err);
    return wire_import_prepare(&t->ref, e->record, e->len, 0, e->offset, &slot->wp, err);
}

pd_status bundle_install(const bundle_view *v, bundle_resolve_fn resolve, void *ctx, pd_err *err)
{
    if (!v || !resolve)
        return pd_err_set(err, PD_ERR_ARG, "bundle: install needs a view and a resolver");
    size_t n = (size_t)v->n_streams;
    install_slot *slot = n ? calloc(n, sizeof *slot) : NULL;
    if (n && !slot)
        return pd_err_set(err, PD_ERR_NOMEM, "bundle: no memory for %zu pending imports", n);
    pd_status s = PD_OK;
    for (size_t i = 0; i < n && s == PD_OK; i++) {
        const bundle_entry *e = &v->entries[i];
        bundle_target t = {0};
        if ((s = resolve(ctx, e->stream, &t, err)) != PD_OK)
            break;
        slot[i].target = target_of(&t);
        for (size_t j = 0; j < i && s == PD_OK; j++)
            if (slot[j].target == slot[i].target)
                s = pd_err_set(err, PD_ERR_ARG, "bundle: streams %llu and %llu resolve to the same layer",
                               (unsigned long long)v->entries[j].stream, (unsigned long long)e->stream);
        if (s == PD_OK)
            s = install_prepare(e, &t, &slot[i], err);
        if (s != PD_OK)
            pd_err_prefix(err, "bundle: stream %llu", (unsigned long long)e->stream);
    }
    for (size_t i = 0; i < n; i++) {
        if (s == PD_OK && slot[i].lp)
            lcache_wire_commit(slot[i].lp);
        else if (s == PD_OK)
            wire_import_commit(slot[i].wp);
        else {
            lcache_wire_pending_free(slot[i].lp);
            wire_pending_free(slot[i].wp);
        }
    }
    free(slot);
    return s;
}

/* ---- writer -------------------------------------------------------------- */

#define BUNDLE_STAGING (64u * 1024u)

/* INV: written <= n_streams; ids[0..written) are distinct. */
struct bundle_writer {
    wr w;
    uint8_t *staging; /* [BUNDLE_STAGING] */
    uint64_t identity;
    uint32_t layer;
    uint64_t n_streams, written;
    uint64_t *ids; /* [n_streams]: stream ids written so far */
};

pd_status bundle_writer_new(wr_sink_fn sink, void *sink_ctx, uint64_t identity, uint32_t layer,
                            uint64_t n_streams, bundle_writer **out, pd_err *err)
{
    if (!sink || !out)
        return pd_err_set(err, PD_ERR_ARG, "bundle: writer needs a sink and out");
    if (n_streams > SIZE_MAX / sizeof(uint64_t))
        return pd_err_set(err, PD_ERR_ARG, "bundle: %llu streams", (unsigned long long)n_streams);
    bundle_writer *bw = calloc(1, sizeof *bw);
    if (!bw)
        return pd_err_set(err, PD_ERR_NOMEM, "bundle: no memory for a writer");
    bw->staging = malloc(BUNDLE_STAGING);
    bw->ids = n_streams ? malloc((size_t)n_streams * sizeof *bw->ids) : NULL;
    if (!bw->staging || (n_streams && !bw->ids)) {
        bundle_writer_free(bw);
        return pd_err_set(err, PD_ERR_NOMEM, "bundle: no memory for a writer");
    }
    bw->identity = identity;
    bw->layer = layer;
    bw->n_streams = n_streams;
    wr_init_sink(&bw->w, sink, sink_ctx, bw->staging, BUNDLE_STAGING, err);
    wr_crc_begin(&bw->w);
    wr_bytes(&bw->w, BUNDLE_MAGIC, 4);
    wr_u32(&bw->w, BUNDLE_VERSION);
    wr_u64(&bw->w, identity);
    wr_u32(&bw->w, layer);
    wr_u32(&bw->w, 0);
    wr_u64(&bw->w, n_streams);
    wr_u32(&bw->w, wr_crc_end(&bw->w));
    if (bw->w.status != PD_OK) {
        pd_status s = bw->w.status;
        bundle_writer_free(bw);
        return s;
    }
    *out = bw;
    return PD_OK;
}

static pd_status writer_admit(bundle_writer *bw, uint64_t stream, pd_err *err)
{
    if (bw->w.status != PD_OK)
        return pd_err_set(err, bw->w.status, "bundle: the writer already failed");
    if (bw->written >= bw->n_streams)
        return pd_err_set(err, PD_ERR_ARG, "bundle: all %llu announced streams are written",
                          (unsigned long long)bw->n_streams);
    for (uint64_t i = 0; i < bw->written; i++)
        if (bw->ids[i] == stream)
            return pd_err_set(err, PD_ERR_ARG, "bundle: stream %llu written twice",
                              (unsigned long long)stream);
    return PD_OK;
}

pd_status bundle_writer_add(bundle_writer *bw, uint64_t stream, const wire_layer_ref *ref, int f16,
                            pd_err *err)
{
    pd_status s = writer_admit(bw, stream, err);
    if (s != PD_OK)
        return s;
    if (!ref)
        return pd_err_set(err, PD_ERR_ARG, "bundle: ref is NULL");
    if (ref->identity != bw->identity || ref->layer != bw->layer)
        return pd_err_set(err, PD_ERR_MISMATCH,
                          "bundle: stream %llu is identity %016llx layer %u, the bundle is "
                          "%016llx layer %u",
                          (unsigned long long)stream, (unsigned long long)ref->identity, ref->layer,
                          (unsigned long long)bw->identity, bw->layer);
    size_t size = 0;
    if ((s = wire_record_size(ref, f16, &size, err)) != PD_OK)
        return s;
    uint64_t before = bw->w.total;
    wr_crc_begin(&bw->w);
    wr_u64(&bw->w, stream);
    wr_u64(&bw->w, size);
    if ((s = wire_encode(ref, f16, &bw->w, err)) != PD_OK)
        return s;
    uint32_t crc = wr_crc_end(&bw->w);
    CHECKF(bw->w.status != PD_OK || bw->w.total - before == 16 + size,
           "record size %zu, encoded %llu", size, (unsigned long long)(bw->w.total - before - 16));
    if (wr_u32(&bw->w, crc) != PD_OK)
        return bw->w.status;
    bw->ids[bw->written++] = stream;
    return PD_OK;
}

pd_status bundle_writer_add_record(bundle_writer *bw, uint64_t stream, const void *record,
                                   size_t len, pd_err *err)
{
    pd_status s = writer_admit(bw, stream, err);
    if (s != PD_OK)
        return s;
    wire_info info;
    if ((s = wire_inspect(record, len, 0, 0, &info, err)) != PD_OK)
        return s;
    if (info.identity != bw->identity || info.layer != bw->layer)
        return pd_err_set(err, PD_ERR_MISMATCH,
                          "bundle: record of stream %llu is identity %016llx layer %u, the "
                          "bundle is %016llx layer %u",
                          (unsigned long long)stream, (unsigned long long)info.identity,
                          info.layer, (unsigned long long)bw->identity, bw->layer);
    wr_crc_begin(&bw->w);
    wr_u64(&bw->w, stream);
    wr_u64(&bw->w, len);
    wr_bytes(&bw->w, record, len);
    uint32_t crc = wr_crc_end(&bw->w);
    if (wr_u32(&bw->w, crc) != PD_OK)
        return bw->w.status;
    bw->ids[bw->written++] = stream;
    return PD_OK;
}

pd_status bundle_writer_finish(bundle_writer *bw, pd_err *err)
{
    if (bw->written != bw->n_streams)
        return pd_err_set(err, PD_ERR_ARG, "bundle: %llu of %llu announced streams written",
                          (unsigned long long)bw->written, (unsigned long long)bw->n_streams);
    return wr_flush(&bw->w);
}

pd_status bundle_entry_bytes(const wire_layer_ref *ref, int f16, uint64_t *bytes, pd_err *err)
{
    size_t size = 0;
    pd_status s = wire_record_size(ref, f16, &size, err);
    if (s == PD_OK)
        *bytes = BUNDLE_ENTRY_OVERHEAD + (uint64_t)size;
    return s;
}

uint64_t bundle_writer_bytes(const bundle_writer *bw) { return bw->w.total; }

void bundle_writer_free(bundle_writer *bw)
{
    if (!bw)
        return;
    free(bw->staging);
    free(bw->ids);
    free(bw);
}
