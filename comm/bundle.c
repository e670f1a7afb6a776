/* State bundles (bundle.h): whole-bundle validation, all-or-nothing install,
 * and the streaming writer. */
#include "comm/bundle.h"

#include "base/check.h"
#include "comm/crc32c.h"

#include <stdlib.h>
#include <string.h>

/* ---- validation ---------------------------------------------------------- */

static int cmp_u64_idx(const void *a, const void *b, void *ids)
{
    const uint64_t *v = ids;
    uint64_t x = v[*(const size_t *)a], y = v[*(const size_t *)b];
    if (x != y)
        return x < y ? -1 : 1;
    /* equal ids: file order, so the report names the later one */
    return *(const size_t *)a < *(const size_t *)b ? -1 : 1;
}

/* Finds a duplicate stream id; returns 1 with the two entry indices. */
static int find_duplicate(const bundle_entry *e, size_t n, size_t *first, size_t *second)
{
    if (n < 2)
        return 0;
    uint64_t *ids = malloc(n * sizeof *ids);
    size_t *idx = malloc(n * sizeof *idx);
    int found = -1;
    if (ids && idx) {
        for (size_t i = 0; i < n; i++) {
            ids[i] = e[i].stream;
            idx[i] = i;
        }
        qsort_r(idx, n, sizeof *idx, cmp_u64_idx, ids);
        found = 0;
        for (size_t i = 1; i < n && !found; i++)
            if (ids[idx[i]] == ids[idx[i - 1]]) {
                *first = idx[i - 1];
                *second = idx[i];
                found = 1;
            }
    }
    free(ids);
    free(idx);
    return found; /* -1: no memory */
}

pd_status bundle_parse(const void *buf, size_t len, bundle_view **out, pd_err *err)
{
    if (!out)
        return pd_err_set(err, PD_ERR_ARG, "bundle: out is NULL");
    rd r;
    rd_init(&r, buf, len, 0, "bundle", err);
    uint8_t magic[4];
    uint32_t version = 0, layer = 0, reserved = 0, crc = 0;
    uint64_t identity = 0, count = 0;
    if (rd_bytes(&r, "magic", magic, 4) != PD_OK)
        return r.status;
    if (memcmp(magic, BUNDLE_MAGIC, 4) != 0)
        return rd_fail_at(&r, 0, PD_ERR_FORMAT, "magic %02x %02x %02x %02x is not \"CMFB\"",
                          magic[0], magic[1], magic[2], magic[3]);
    if (rd_u32(&r, "version", &version) != PD_OK)
        return r.status;
    if (version != BUNDLE_VERSION)
        return rd_fail_at(&r, 4, PD_ERR_VERSION, "bundle version %u, this build reads version %u",
                          version, BUNDLE_VERSION);
    if (rd_skip(&r, "header", 24) != PD_OK || rd_u32(&r, "header crc", &crc) != PD_OK)
        return r.status;
    const uint8_t *p = buf;
    uint32_t want = crc32c_update(0, p, 32);
    if (crc != want)
        return rd_fail_at(&r, 32, PD_ERR_CHECKSUM, "header crc %08x, bytes 0..32 give %08x", crc,
                          want);
    identity = rd_le64(p + 8);
    layer = rd_le32(p + 16);
    reserved = rd_le32(p + 20);
    count = rd_le64(p + 24);
    if (reserved != 0)
        return rd_fail_at(&r, 20, PD_ERR_FORMAT, "reserved field %u is not 0", reserved);
    size_t min_bytes = 0;
    if (rd_check_count(&r, "stream count", count, BUNDLE_ENTRY_OVERHEAD, &min_bytes) != PD_OK)
        return r.status;

    bundle_view *v = calloc(1, sizeof *v);
    bundle_entry *e = count ? calloc((size_t)count, sizeof *e) : NULL;
    if (!v || (count && !e)) {
        free(v);
        free(e);
        return pd_err_set(err, PD_ERR_NOMEM, "bundle: no memory for %llu entries",
                          (unsigned long long)count);
    }
    pd_status s = PD_OK;
    char f[64];
    for (uint64_t i = 0; i < count && s == PD_OK; i++) {
        size_t at = rd_offset(&r);
        uint64_t stream = 0, rlen = 0;
        const uint8_t *rec = NULL;
        uint32_t ecrc = 0;
        snprintf(f, sizeof f, "entry %llu record length", (unsigned long long)i);
        if (rd_u64(&r, "stream id", &stream) != PD_OK || rd_u64(&r, f, &rlen) != PD_OK ||
            rd_check_count(&r, f, rlen, 1, &(size_t){0}) != PD_OK ||
            rd_span(&r, f, (size_t)rlen, &rec) != PD_OK || rd_u32(&r, "entry crc", &ecrc) != PD_OK) {
            s = r.status;
            break;
        }
        uint32_t got = crc32c_update(0, p + at, 16 + (size_t)rlen);
        if (got != ecrc) {
            s = rd_fail_at(&r, at + 16 + (size_t)rlen, PD_ERR_CHECKSUM,
                           "entry %llu (stream %llu) crc %08x, its bytes give %08x",
                           (unsigned long long)i, (unsigned long long)stream, ecrc, got);
            break;
        }
        e[i] = (bundle_entry){.stream = stream, .record = rec, .len = (size_t)rlen, .offset = at + 16};
        if ((s = wire_inspect(rec, (size_t)rlen, 0, at + 16, &e[i].info, err)) != PD_OK) {
            pd_err_prefix(err, "bundle: entry %llu (stream %llu)", (unsigned long long)i,
                          (unsigned long long)stream);
            break;
        }
        if (e[i].info.identity != identity || e[i].info.layer != layer) {
            s = rd_fail_at(&r, at + 16 + 8, PD_ERR_MISMATCH,
                           "entry %llu (stream %llu): record identity %016llx layer %u, the "
                           "bundle is %016llx layer %u",
                           (unsigned long long)i, (unsigned long long)stream,
                           (unsigned long long)e[i].info.identity, e[i].info.layer,
                           (unsigned long long)identity, layer);
            break;
        }
    }
    if (s == PD_OK)
        s = rd_expect_end(&r);
    if (s == PD_OK) {
        size_t a = 0, b = 0;
        int dup = find_duplicate(e, (size_t)count, &a, &b);
        if (dup < 0)
            s = pd_err_set(err, PD_ERR_NOMEM, "bundle: no memory to check stream ids");
        else if (dup)
            s = rd_fail_at(&r, e[b].offset - 16, PD_ERR_FORMAT,
                           "duplicate stream id %llu (entries %zu and %zu)",
                           (unsigned long long)e[b].stream, a, b);
    }
    if (s != PD_OK) {
        free(e);
        free(v);
        return s;
    }
    *v = (bundle_view){
        .version = version,
        .identity = identity,
        .layer = layer,
        .n_streams = count,
        .entries = e,
        .bytes = len,
    };
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
