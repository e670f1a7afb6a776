/* bundle: many records in one container. Streams written through the
 * streaming writer come back answering identically; every corrupted byte,
 * truncation, newer version, duplicate id or foreign record is refused before
 * anything is installed; install is all or nothing. The streaming reader,
 * fed in any pieces, hands over what parse gives and refuses what parse
 * refuses with the same words; a cut transfer is truncated. */
#include "pd_test.h"

#include "cache/kv_layer.h"
#include "cache/layer_cache.h"
#include "cache/ring_layer.h"
#include "comm/bundle.h"
#include "comm/crc32c.h"
#include "comm/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ID 0xfeedbeef00c0ffeeull
#define LAYER 5u
#define NS 3

/* ---- fixtures ------------------------------------------------------------ */

static ring_layer *ring_mk(uint32_t W)
{
    ring_layer_config cfg = {.n_kv_heads = 2, .head_dim = 4, .window = W, .ref_capacity = 8};
    ring_layer *r = NULL;
    pd_err e = {0};
    ck_assert_msg(ring_layer_new(&cfg, &r, &e) == PD_OK, "%s", e.msg);
    return r;
}

static void ring_grow(ring_layer *r, uint32_t ref, uint32_t writes, pd_rng *g)
{
    float k[8 * 8], v[8 * 8];
    pd_rng_fill(g, k, sizeof k / sizeof k[0], -1, 1);
    pd_rng_fill(g, v, sizeof v / sizeof v[0], -1, 1);
    pd_err e = {0};
    if (ref)
        ck_assert_msg(ring_layer_prefill(r, k, v, ref, &e) == PD_OK, "%s", e.msg);
    for (uint32_t i = 0; i < writes; i++) {
        pd_rng_fill(g, k, 8, -1, 1);
        ck_assert_msg(ring_layer_write(r, k, v, NULL, &e) == PD_OK, "%s", e.msg);
    }
}

static wire_layer_ref ref_of(ring_layer *r)
{
    return (wire_layer_ref){.identity = ID, .layer = LAYER, .ring = r};
}

/* A growable in-memory sink that also records its largest single write. */
typedef struct memsink {
    uint8_t *b;
    size_t n, calls, largest;
} memsink;

static pd_status memsink_write(void *ctx, const void *p, size_t n, pd_err *err)
{
    (void)err;
    memsink *m = ctx;
    m->b = realloc(m->b, m->n + n);
    memcpy(m->b + m->n, p, n);
    m->n += n;
    m->calls++;
    if (n > m->largest)
        m->largest = n;
    return PD_OK;
}

/* Writes streams ids[i] -> layers[i] (f16 optional) into a memory bundle. */
static memsink write_bundle(ring_layer **layers, const uint64_t *ids, int n, int f16)
{
    memsink m = {0};
    bundle_writer *bw = NULL;
    pd_err e = {0};
    ck_assert_msg(bundle_writer_new(memsink_write, &m, ID, LAYER, (uint64_t)n, &bw, &e) == PD_OK,
                  "%s", e.msg);
    for (int i = 0; i < n; i++) {
        wire_layer_ref r = ref_of(layers[i]);
        ck_assert_msg(bundle_writer_add(bw, ids[i], &r, f16, &e) == PD_OK, "%s", e.msg);
    }
    ck_assert_msg(bundle_writer_finish(bw, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(bundle_writer_bytes(bw), m.n);
    bundle_writer_free(bw);
    return m;
}

/* Resolver over parallel arrays of stream ids and layers. */
typedef struct table {
    const uint64_t *ids;
    ring_layer **layers;
    int n;
} table;

static pd_status table_resolve(void *ctx, uint64_t stream, bundle_target *bt, pd_err *err)
{
    table *t = ctx;
    for (int i = 0; i < t->n; i++)
        if (t->ids[i] == stream) {
            bt->ref = ref_of(t->layers[i]);
            return PD_OK;
        }
    return pd_err_set(err, PD_ERR_RANGE, "no layer for stream %llu", (unsigned long long)stream);
}

static void same_answers(ring_layer *a, ring_layer *b, pd_rng *g)
{
    ck_assert_uint_eq(ring_layer_position(a), ring_layer_position(b));
    float q[8], oa[8], ob[8];
    pd_rng_fill(g, q, 8, -1, 1);
    pd_err e = {0};
    ck_assert_msg(ring_layer_attend(a, q, NULL, oa, NULL, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(ring_layer_attend(b, q, NULL, ob, NULL, &e) == PD_OK, "%s", e.msg);
    ck_assert_int_eq(memcmp(oa, ob, sizeof oa), 0);
}

/* Three source layers at different fill levels and three empty targets. */
typedef struct world {
    ring_layer *src[NS], *dst[NS];
    uint64_t ids[NS];
} world;

static void world_mk(world *w, pd_rng *g)
{
    const uint64_t ids[NS] = {7, 1ull << 40, 3};
    for (int i = 0; i < NS; i++) {
        w->src[i] = ring_mk(3);
        ring_grow(w->src[i], 1 + (uint32_t)i, 2 * (uint32_t)i, g);
        w->dst[i] = ring_mk(3);
        w->ids[i] = ids[i];
    }
}

static void world_free(world *w)
{
    for (int i = 0; i < NS; i++) {
        ring_layer_free(w->src[i]);
        ring_layer_free(w->dst[i]);
    }
}

/* Parses and expects failure with `want` (any failure when want == PD_OK). */
static void refused(const uint8_t *b, size_t n, pd_status want, const char *needle)
{
    bundle_view *v = NULL;
    pd_err e = {0};
    pd_status got = bundle_parse(b, n, &v, &e);
    ck_assert_ptr_null(v);
    if (want == PD_OK)
        ck_assert_int_ne(got, PD_OK);
    else
        ck_assert_msg(got == want, "status %s (want %s): %s", pd_status_str(got),
                      pd_status_str(want), e.msg);
    ck_assert_ptr_nonnull(strstr(e.msg, "offset "));
    if (needle)
        ck_assert_msg(strstr(e.msg, needle) != NULL, "'%s' lacks '%s'", e.msg, needle);
}

/* ---- cases --------------------------------------------------------------- */

START_TEST(bundle_round_trip_installs_every_stream_answering_identically)
{
    pd_rng g = {.s = 1};
    world w;
    world_mk(&w, &g);
    for (int f16 = 0; f16 < 2; f16++) {
        memsink m = write_bundle(w.src, w.ids, NS, f16);
        bundle_view *v = NULL;
        pd_err e = {0};
        ck_assert_msg(bundle_parse(m.b, m.n, &v, &e) == PD_OK, "%s", e.msg);
        ck_assert_uint_eq(v->n_streams, NS);
        ck_assert_uint_eq(v->identity, ID);
        ck_assert_uint_eq(v->layer, LAYER);
        ck_assert_uint_eq(v->bytes, m.n);
        for (int i = 0; i < NS; i++) {
            ck_assert_uint_eq(v->entries[i].stream, w.ids[i]);
            ck_assert_uint_eq(v->entries[i].info.kind, WIRE_KIND_RING);
            ck_assert_uint_eq(v->entries[i].info.f16, f16);
            ck_assert_ptr_eq(v->entries[i].record, m.b + v->entries[i].offset);
        }
        table t = {.ids = w.ids, .layers = w.dst, .n = NS};
        ck_assert_msg(bundle_install(v, table_resolve, &t, &e) == PD_OK, "%s", e.msg);
        if (!f16)
            for (int i = 0; i < NS; i++)
                same_answers(w.src[i], w.dst[i], &g);
        else
            for (int i = 0; i < NS; i++)
                ck_assert_uint_eq(ring_layer_position(w.src[i]), ring_layer_position(w.dst[i]));
        bundle_view_free(v);
        free(m.b);
    }
    bundle_view_free(NULL);
    world_free(&w);
}
END_TEST

START_TEST(bundle_layout_is_the_documented_one)
{
    pd_rng g = {.s = 2};
    world w;
    world_mk(&w, &g);
    memsink m = write_bundle(w.src, w.ids, 1, 0);
    wire_layer_ref r = ref_of(w.src[0]);
    size_t rlen = 0;
    ck_assert_int_eq(wire_record_size(&r, 0, &rlen, NULL), PD_OK);
    ck_assert_uint_eq(m.n, BUNDLE_HEADER_BYTES + BUNDLE_ENTRY_OVERHEAD + rlen);
    ck_assert_int_eq(memcmp(m.b, "CMFB", 4), 0);
    ck_assert_uint_eq(m.b[4], 1);
    ck_assert_uint_eq(m.b[8], 0xee);  /* identity, little-endian */
    ck_assert_uint_eq(m.b[16], LAYER);
    ck_assert_uint_eq(m.b[24], 1);    /* stream count */
    uint32_t hcrc = crc32c_update(0, m.b, 32);
    ck_assert_uint_eq(m.b[32] | m.b[33] << 8 | m.b[34] << 16 | (uint32_t)m.b[35] << 24, hcrc);
    ck_assert_uint_eq(m.b[36], 7);    /* stream id */
    ck_assert_uint_eq(m.b[44] | m.b[45] << 8, rlen);
    ck_assert_int_eq(memcmp(m.b + 52, "CMFS", 4), 0);
    uint32_t ecrc = crc32c_update(0, m.b + 36, 16 + rlen);
    const uint8_t *c = m.b + 52 + rlen;
    ck_assert_uint_eq(c[0] | c[1] << 8 | c[2] << 16 | (uint32_t)c[3] << 24, ecrc);
    /* the record inside is what wire_export gives */
    uint8_t *rec = NULL;
    size_t n = 0;
    ck_assert_int_eq(wire_export(&r, 0, &rec, &n, NULL), PD_OK);
    ck_assert_int_eq(memcmp(m.b + 52, rec, n), 0);
    free(rec);
    free(m.b);
    world_free(&w);
}
END_TEST

START_TEST(bundle_every_flipped_byte_is_rejected)
{
    pd_rng g = {.s = 3};
    world w;
    world_mk(&w, &g);
    memsink m = write_bundle(w.src, w.ids, 2, 1);
    uint8_t *c = malloc(m.n);
    const uint8_t masks[3] = {0x01, 0x80, 0xff};
    for (size_t i = 0; i < m.n; i++)
        for (int k = 0; k < 3; k++) {
            memcpy(c, m.b, m.n);
            c[i] ^= masks[k];
            bundle_view *v = NULL;
            pd_status s = bundle_parse(c, m.n, &v, NULL);
            ck_assert_msg(s != PD_OK, "flip of byte %zu by %02x accepted", i, masks[k]);
            ck_assert_ptr_null(v);
        }
    free(c);
    free(m.b);
    world_free(&w);
}
END_TEST

START_TEST(bundle_truncation_at_every_offset_is_rejected)
{
    pd_rng g = {.s = 4};
    world w;
    world_mk(&w, &g);
    memsink m = write_bundle(w.src, w.ids, NS, 0);
    for (size_t cut = 0; cut < m.n; cut++) {
        uint8_t *c = malloc(cut + 1);
        memcpy(c, m.b, cut);
        bundle_view *v = NULL;
        pd_status s = bundle_parse(c, cut, &v, NULL);
        ck_assert_msg(s == PD_ERR_TRUNCATED || s == PD_ERR_CHECKSUM,
                      "cut %zu: %s", cut, pd_status_str(s));
        ck_assert_ptr_null(v);
        free(c);
    }
    /* and a trailing byte */
    uint8_t *c = malloc(m.n + 1);
    memcpy(c, m.b, m.n);
    c[m.n] = 0;
    refused(c, m.n + 1, PD_ERR_FORMAT, "trailing");
    free(c);
    free(m.b);
    world_free(&w);
}
END_TEST

/* Rewrites the header CRC after an edit (to reach checks behind it). */
static void fix_header_crc(uint8_t *b)
{
    uint32_t c = crc32c_update(0, b, 32);
    for (int i = 0; i < 4; i++)
        b[32 + i] = (uint8_t)(c >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

START_TEST(bundle_header_faults_are_refused)
{
    pd_rng g = {.s = 5};
    world w;
    world_mk(&w, &g);
    memsink m = write_bundle(w.src, w.ids, 2, 0);
    uint8_t *c = malloc(m.n);
#define EDIT(stmt, want, needle)                                                                   \
    do {                                                                                           \
        memcpy(c, m.b, m.n);                                                                       \
        stmt;                                                                                      \
        refused(c, m.n, want, needle);                                                             \
    } while (0)
    EDIT(c[0] = 'X', PD_ERR_FORMAT, "offset 0: magic");
    EDIT((c[4] = 2, fix_header_crc(c)), PD_ERR_VERSION, "offset 4: bundle version 2");
    EDIT(c[4] = 2, PD_ERR_VERSION, "bundle version 2");
    EDIT(c[9] ^= 1, PD_ERR_CHECKSUM, "offset 32: header crc");
    EDIT((c[20] = 1, fix_header_crc(c)), PD_ERR_FORMAT, "offset 20: reserved");
    EDIT((put64(c + 24, UINT64_MAX), fix_header_crc(c)), PD_ERR_RANGE, "stream count");
    EDIT((put64(c + 24, (uint64_t)UINT32_MAX), fix_header_crc(c)), PD_ERR_TRUNCATED,
         "stream count 4294967295");
    EDIT((put64(c + 24, 3), fix_header_crc(c)), PD_ERR_TRUNCATED, NULL);
    EDIT((put64(c + 24, 1), fix_header_crc(c)), PD_ERR_FORMAT, "trailing");
    /* every record must carry the bundle's identity and layer */
    EDIT((c[16] = LAYER + 1, fix_header_crc(c)), PD_ERR_MISMATCH, "layer 5, the bundle is");
    EDIT((c[8] ^= 2, fix_header_crc(c)), PD_ERR_MISMATCH, "identity");
    /* a huge record length */
    EDIT(put64(c + 44, UINT64_MAX - 3), PD_ERR_TRUNCATED, "entry 0 record length");
#undef EDIT
    free(c);
    free(m.b);
    world_free(&w);
}
END_TEST

/* Assembles a bundle by hand from (id, record) pairs with correct CRCs. */
static size_t assemble(uint8_t *out, const uint64_t *ids, uint8_t *const *recs, const size_t *lens,
                       int n)
{
    memcpy(out, "CMFB", 4);
    memset(out + 4, 0, 32);
    out[4] = 1;
    put64(out + 8, ID);
    out[16] = LAYER;
    put64(out + 24, (uint64_t)n);
    fix_header_crc(out);
    size_t o = 36;
    for (int i = 0; i < n; i++) {
        put64(out + o, ids[i]);
        put64(out + o + 8, lens[i]);
        memcpy(out + o + 16, recs[i], lens[i]);
        uint32_t c = crc32c_update(0, out + o, 16 + lens[i]);
        o += 16 + lens[i];
        for (int b = 0; b < 4; b++)
            out[o + b] = (uint8_t)(c >> (8 * b));
        o += 4;
    }
    return o;
}

START_TEST(bundle_duplicate_stream_ids_are_refused)
{
    pd_rng g = {.s = 6};
    world w;
    world_mk(&w, &g);
    uint8_t *recs[3];
    size_t lens[3];
    for (int i = 0; i < 3; i++) {
        wire_layer_ref r = ref_of(w.src[i]);
        ck_assert_int_eq(wire_export(&r, 0, &recs[i], &lens[i], NULL), PD_OK);
    }
    uint8_t *buf = malloc(36 + 3 * 20 + lens[0] + lens[1] + lens[2]);
    const uint64_t ok_ids[3] = {9, 4, 2}, dup_ids[3] = {9, 4, 9};
    size_t n = assemble(buf, ok_ids, recs, lens, 3);
    bundle_view *v = NULL;
    pd_err e = {0};
    ck_assert_msg(bundle_parse(buf, n, &v, &e) == PD_OK, "%s", e.msg);
    bundle_view_free(v);
    n = assemble(buf, dup_ids, recs, lens, 3);
    refused(buf, n, PD_ERR_FORMAT, "duplicate stream id 9 (entries 0 and 2)");
    /* a corrupt record inside a correctly checksummed entry is still refused */
    recs[1][4] = 3;
    n = assemble(buf, ok_ids, recs, lens, 3);
    refused(buf, n, PD_ERR_VERSION, "stream 4");
    for (int i = 0; i < 3; i++)
        free(recs[i]);
    free(buf);
    world_free(&w);
}
END_TEST

/* A record whose K holds a NaN, inside an entry whose CRC is right: import
 * would refuse it, so validating the bundle refuses it too, naming the
 * value's offset in the bundle (an infinity in V the same). */
START_TEST(bundle_non_finite_values_are_refused_before_install)
{
    pd_rng g = {.s = 9};
    world w;
    world_mk(&w, &g);
    uint8_t *recs[2];
    size_t lens[2];
    for (int i = 0; i < 2; i++) {
        wire_layer_ref r = ref_of(w.src[i]);
        ck_assert_int_eq(wire_export(&r, 0, &recs[i], &lens[i], NULL), PD_OK);
    }
    uint8_t *buf = malloc(36 + 2 * 20 + lens[0] + lens[1]);
    const uint64_t ids[2] = {9, 4};
    /* record 1 (ring, 2 reference rows): header 32, ring fields 36, then head
     * 0's reference K count and its values; value 1 at record offset 76 */
    const size_t k1 = 32 + 36 + 4 + 4;
    const float nan = __builtin_nanf(""), inf = __builtin_inff();
    memcpy(recs[1] + k1, &nan, 4);
    size_t n = assemble(buf, ids, recs, lens, 2);
    const size_t at = 36 + 20 + lens[0] + 16 + k1; /* in the bundle */
    char want[96];
    snprintf(want, sizeof want, "offset %zu: head 0 ref k value 1 is not finite", at);
    refused(buf, n, PD_ERR_FORMAT, want);
    refused(buf, n, PD_ERR_FORMAT, "stream 4");
    /* an infinity in head 0's reference V (each head: K count + 8 values, then V) */
    float one = 1.0f;
    memcpy(recs[1] + k1, &one, 4);
    const size_t v0 = 32 + 36 + 4 + 2 * 4 * 4 + 4; /* head 0 ref v value 0 */
    memcpy(recs[1] + v0, &inf, 4);
    n = assemble(buf, ids, recs, lens, 2);
    snprintf(want, sizeof want, "offset %zu: head 0 ref v value 0 is not finite (inf)",
             36 + 20 + lens[0] + 16 + v0);
    refused(buf, n, PD_ERR_FORMAT, want);
    for (int i = 0; i < 2; i++)
        free(recs[i]);
    free(buf);
    world_free(&w);
}
END_TEST

/* The world, its sources written as one bundle (*m, owned) and parsed (owned). */
static bundle_view *world_bundle(world *w, pd_rng *g, memsink *m)
{
    world_mk(w, g);
    *m = write_bundle(w->src, w->ids, NS, 0);
    bundle_view *v = NULL;
    pd_err e = {0};
    ck_assert_msg(bundle_parse(m->b, m->n, &v, &e) == PD_OK, "%s", e.msg);
    return v;
}

START_TEST(bundle_install_is_all_or_nothing)
{
    pd_rng g = {.s = 7};
    world w;
    memsink m;
    bundle_view *v = world_bundle(&w, &g, &m);
    pd_err e = {0};
    /* the last stream's target has another window: its decode fails */
    ring_layer_free(w.dst[NS - 1]);
    w.dst[NS - 1] = ring_mk(4);
    uint64_t before[NS];
    for (int i = 0; i < NS; i++)
        before[i] = ring_layer_id(w.dst[i]);
    table t = {.ids = w.ids, .layers = w.dst, .n = NS};
    ck_assert_int_eq(bundle_install(v, table_resolve, &t, &e), PD_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(e.msg, "stream 3"));
    for (int i = 0; i < NS; i++) {
        ck_assert_uint_eq(ring_layer_id(w.dst[i]), before[i]);
        ck_assert_uint_eq(ring_layer_position(w.dst[i]), 0);
    }
    /* an unresolvable stream: same */
    t.n = NS - 1;
    pd_err_clear(&e);
    ck_assert_int_eq(bundle_install(v, table_resolve, &t, &e), PD_ERR_RANGE);
    for (int i = 0; i < NS; i++)
        ck_assert_uint_eq(ring_layer_id(w.dst[i]), before[i]);
    /* two streams into one layer */
    ring_layer *same[NS] = {w.dst[0], w.dst[0], w.dst[1]};
    table t2 = {.ids = w.ids, .layers = same, .n = NS};
    pd_err_clear(&e);
    ck_assert_int_eq(bundle_install(v, table_resolve, &t2, &e), PD_ERR_ARG);
    ck_assert_uint_eq(ring_layer_id(w.dst[0]), before[0]);
    bundle_view_free(v);
    free(m.b);
    world_free(&w);
}
END_TEST

/* Containers as targets (the runtime's path): each at a stream position. */
typedef struct ctable {
    const uint64_t *ids;
    lcache **c;
    uint64_t pos[NS];
    int n;
} ctable;

static pd_status ctable_resolve(void *ctx, uint64_t stream, bundle_target *bt, pd_err *err)
{
    ctable *t = ctx;
    for (int i = 0; i < t->n; i++)
        if (t->ids[i] == stream) {
            *bt = (bundle_target){.ref = {.identity = ID, .layer = LAYER}, .c = t->c[i], .pos = t->pos[i]};
            return PD_OK;
        }
    return pd_err_set(err, PD_ERR_RANGE, "no container for stream %llu", (unsigned long long)stream);
}

static lcache *ring_container(void)
{
    lcache_config cfg = {.kind = LCACHE_KIND_RING, .n_kv_heads = 2, .head_dim = 4, .q_per_kv = 1, .window = 3,
                         .prefill_rows = 8, .max_new = 16};
    lcache *c = NULL;
    pd_err e = {0};
    ck_assert_msg(lcache_new(&cfg, &c, &e) == PD_OK, "%s", e.msg);
    return c;
}

START_TEST(bundle_install_into_containers_is_all_or_nothing)
{
    pd_rng g = {.s = 11};
    world w;
    memsink m;
    bundle_view *v = world_bundle(&w, &g, &m);
    pd_err e = {0};
    lcache *c[NS];
    ctable t = {.ids = w.ids, .c = c, .n = NS};
    for (int i = 0; i < NS; i++) {
        c[i] = ring_container();
        t.pos[i] = ring_layer_position(w.src[i]);
    }
    /* a bad record for its target (the last stream's position is not the
     * one its record stands for): nothing installed, the stream named */
    t.pos[NS - 1] += 1;
    ck_assert_int_eq(bundle_install(v, ctable_resolve, &t, &e), PD_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(e.msg, "stream 3"));
    for (int i = 0; i < NS; i++)
        ck_assert_uint_eq(lcache_position(c[i]), 0);
    /* an unresolvable stream: same */
    t.pos[NS - 1] -= 1;
    t.ids = (const uint64_t[NS]){w.ids[0], w.ids[1], 99};
    pd_err_clear(&e);
    ck_assert_int_eq(bundle_install(v, ctable_resolve, &t, &e), PD_ERR_RANGE);
    for (int i = 0; i < NS; i++)
        ck_assert_uint_eq(lcache_position(c[i]), 0);
    /* a resolver that names no target */
    t.ids = w.ids;
    lcache *none[NS] = {c[0], NULL, c[2]};
    t.c = none;
    pd_err_clear(&e);
    ck_assert_int_eq(bundle_install(v, ctable_resolve, &t, &e), PD_ERR_ARG);
    ck_assert_uint_eq(lcache_position(c[0]), 0);
    /* all good: every container at its stream's position, answering as the source */
    t.c = c;
    pd_err_clear(&e);
    ck_assert_msg(bundle_install(v, ctable_resolve, &t, &e) == PD_OK, "%s", e.msg);
    for (int i = 0; i < NS; i++) {
        ck_assert_uint_eq(lcache_position(c[i]), t.pos[i]);
        same_answers(w.src[i], lcache_ring(c[i]), &g);
        lcache_free(c[i]);
    }
    bundle_view_free(v);
    free(m.b);
    world_free(&w);
}
END_TEST

START_TEST(bundle_writer_refuses_what_would_make_an_invalid_bundle)
{
    pd_rng g = {.s = 8};
    world w;
    world_mk(&w, &g);
    memsink m = {0};
    bundle_writer *bw = NULL;
    pd_err e = {0};
    ck_assert_int_eq(bundle_writer_new(memsink_write, &m, ID, LAYER, 2, &bw, &e), PD_OK);
    wire_layer_ref r = ref_of(w.src[0]);
    ck_assert_int_eq(bundle_writer_add(bw, 1, &r, 0, &e), PD_OK);
    ck_assert_int_eq(bundle_writer_add(bw, 1, &r, 0, &e), PD_ERR_ARG); /* duplicate */
    pd_err_clear(&e);
    ck_assert_int_eq(bundle_writer_finish(bw, &e), PD_ERR_ARG); /* 1 of 2 */
    wire_layer_ref foreign = r;
    foreign.layer = LAYER + 1;
    pd_err_clear(&e);
    ck_assert_int_eq(bundle_writer_add(bw, 2, &foreign, 0, &e), PD_ERR_MISMATCH);
    uint8_t junk[8] = {0};
    pd_err_clear(&e);
    ck_assert_int_ne(bundle_writer_add_record(bw, 2, junk, sizeof junk, &e), PD_OK);
    uint8_t *rec = NULL;
    size_t n = 0;
    ck_assert_int_eq(wire_export(&r, 1, &rec, &n, NULL), PD_OK);
    pd_err_clear(&e);
    ck_assert_msg(bundle_writer_add_record(bw, 2, rec, n, &e) == PD_OK, "%s", e.msg);
    ck_assert_int_eq(bundle_writer_add_record(bw, 3, rec, n, &e), PD_ERR_ARG); /* too many */
    pd_err_clear(&e);
    ck_assert_msg(bundle_writer_finish(bw, &e) == PD_OK, "%s", e.msg);
    bundle_writer_free(bw);
    bundle_writer_free(NULL);
    bundle_view *v = NULL;
    ck_assert_msg(bundle_parse(m.b, m.n, &v, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(v->entries[1].info.f16, 1);
    bundle_view_free(v);
    free(rec);
    free(m.b);
    world_free(&w);
}
END_TEST

START_TEST(bundle_streams_large_states_without_holding_them)
{
    /* one ring layer with 64 KiB+ of rows per head: the writer hands large
     * arrays straight to the sink and never gathers the bundle */
    ring_layer_config cfg = {.n_kv_heads = 2, .head_dim = 128, .window = 64, .ref_capacity = 200};
    ring_layer *a = NULL, *b = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ring_layer_new(&cfg, &a, &e), PD_OK);
    ck_assert_int_eq(ring_layer_new(&cfg, &b, &e), PD_OK);
    float *k = malloc(sizeof(float) * 200 * 2 * 128), *v = malloc(sizeof(float) * 200 * 2 * 128);
    pd_rng g = {.s = 9};
    pd_rng_fill(&g, k, 200 * 2 * 128, -1, 1);
    pd_rng_fill(&g, v, 200 * 2 * 128, -1, 1);
    ck_assert_int_eq(ring_layer_prefill(a, k, v, 200, &e), PD_OK);
    memsink m = {0};
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    bundle_writer *bw = NULL, *bf = NULL;
    wire_layer_ref r = ref_of(a);
    ck_assert_int_eq(bundle_writer_new(memsink_write, &m, ID, LAYER, 1, &bw, &e), PD_OK);
    ck_assert_int_eq(bundle_writer_add(bw, 42, &r, 0, &e), PD_OK);
    ck_assert_int_eq(bundle_writer_finish(bw, &e), PD_OK);
    ck_assert_int_eq(bundle_writer_new(wr_sink_file, f, ID, LAYER, 1, &bf, &e), PD_OK);
    ck_assert_int_eq(bundle_writer_add(bf, 42, &r, 0, &e), PD_OK);
    ck_assert_int_eq(bundle_writer_finish(bf, &e), PD_OK);
    ck_assert_uint_gt(m.calls, 2);
    ck_assert_uint_lt(m.largest, m.n / 2);
    ck_assert_uint_eq(bundle_writer_bytes(bf), m.n);
    /* the FILE sink wrote the same bytes */
    uint8_t *fb = malloc(m.n);
    rewind(f);
    ck_assert_uint_eq(fread(fb, 1, m.n, f), m.n);
    ck_assert_int_eq(memcmp(fb, m.b, m.n), 0);
    fclose(f);
    bundle_view *view = NULL;
    ck_assert_msg(bundle_parse(fb, m.n, &view, &e) == PD_OK, "%s", e.msg);
    ring_layer *dst[1] = {b};
    const uint64_t ids[1] = {42};
    table t = {.ids = ids, .layers = dst, .n = 1};
    ck_assert_msg(bundle_install(view, table_resolve, &t, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(ring_layer_position(b), 200);
    bundle_view_free(view);
    bundle_writer_free(bw);
    bundle_writer_free(bf);
    free(fb);
    free(m.b);
    free(k);
    free(v);
    ring_layer_free(a);
    ring_layer_free(b);
}
END_TEST

START_TEST(bundle_with_no_streams_is_valid)
{
    memsink m = {0};
    bundle_writer *bw = NULL;
    pd_err e = {0};
    ck_assert_int_eq(bundle_writer_new(memsink_write, &m, ID, LAYER, 0, &bw, &e), PD_OK);
    ck_assert_int_eq(bundle_writer_finish(bw, &e), PD_OK);
    bundle_writer_free(bw);
    ck_assert_uint_eq(m.n, BUNDLE_HEADER_BYTES);
    bundle_view *v = NULL;
    ck_assert_int_eq(bundle_parse(m.b, m.n, &v, &e), PD_OK);
    ck_assert_uint_eq(v->n_streams, 0);
    ck_assert_int_eq(bundle_install(v, table_resolve, &(table){0}, &e), PD_OK);
    bundle_view_free(v);
    free(m.b);
}
END_TEST

/* ---- the streaming reader ------------------------------------------------ */

/* What a reader handed over: the header, each entry's id, offset and record
 * (copied: the reader's pointer is valid during the call only), and each
 * record decoded into a container of its own, held aside (what a
 * migration's receiver does). */
typedef struct seen {
    int headers;
    bundle_view h;
    int n;
    uint64_t stream[NS];
    size_t offset[NS], len[NS];
    uint8_t *rec[NS];
    lcache *c[NS];
    uint64_t pos[NS]; /* the position each stream's record stands for */
    int refuse;       /* the entry callback refuses entry `refuse` (-1: none) */
} seen;

static pd_status seen_header(void *ctx, const bundle_view *h, pd_err *err)
{
    (void)err;
    seen *s = ctx;
    s->headers++;
    s->h = *h;
    return PD_OK;
}

static pd_status seen_entry(void *ctx, const bundle_entry *e, pd_err *err)
{
    seen *s = ctx;
    if (s->n == s->refuse)
        return pd_err_set(err, PD_ERR_REFUSED, "entry %d refused by its caller", s->n);
    ck_assert_int_lt(s->n, NS);
    int i = s->n++;
    s->stream[i] = e->stream;
    s->offset[i] = e->offset;
    s->len[i] = e->len;
    s->rec[i] = malloc(e->len);
    memcpy(s->rec[i], e->record, e->len);
    s->c[i] = ring_container();
    return lcache_wire_import(s->c[i], ID, LAYER, s->pos[i], e->record, e->len, e->offset, err);
}

static void seen_free(seen *s)
{
    for (int i = 0; i < s->n; i++) {
        free(s->rec[i]);
        lcache_free(s->c[i]);
    }
}

/* Pushes b[0..n) in pieces of `piece` bytes into a reader announced as
 * `announced` bytes long: the finish's status (a failed push's, which the
 * finish repeats), *e its words. */
static pd_status stream_in(const uint8_t *b, size_t n, size_t announced, size_t piece, seen *s, pd_err *e)
{
    static const bundle_reader_ops ops = {.header = seen_header, .entry = seen_entry};
    bundle_reader *br = NULL;
    ck_assert_int_eq(bundle_reader_new(announced, &ops, s, &br, e), PD_OK);
    pd_status st = PD_OK;
    for (size_t o = 0; o < n && st == PD_OK; o += piece)
        st = bundle_reader_push(br, b + o, n - o < piece ? n - o : piece, e);
    pd_err again = {0};
    pd_status fin = bundle_reader_finish(br, st == PD_OK ? e : &again);
    if (st != PD_OK) {
        ck_assert_int_eq(fin, st);
        ck_assert_str_eq(again.msg, e->msg);
    }
    bundle_reader_free(br);
    return fin;
}

static void seen_positions(seen *s, const world *w)
{
    *s = (seen){.refuse = -1};
    for (int i = 0; i < NS; i++)
        s->pos[i] = ring_layer_position(w->src[i]);
}

START_TEST(bundle_reader_in_any_pieces_hands_over_what_parse_gives)
{
    pd_rng g = {.s = 12};
    world w;
    memsink m;
    bundle_view *v = world_bundle(&w, &g, &m);
    const size_t pieces[] = {1, 2, 5, 16, 17, 36, 100, 4096, m.n};
    for (size_t k = 0; k < sizeof pieces / sizeof pieces[0]; k++) {
        seen s;
        seen_positions(&s, &w);
        pd_err e = {0};
        ck_assert_msg(stream_in(m.b, m.n, m.n, pieces[k], &s, &e) == PD_OK, "pieces of %zu: %s", pieces[k], e.msg);
        ck_assert_int_eq(s.headers, 1);
        ck_assert_uint_eq(s.h.identity, ID);
        ck_assert_uint_eq(s.h.layer, LAYER);
        ck_assert_uint_eq(s.h.n_streams, NS);
        ck_assert_uint_eq(s.h.bytes, m.n);
        ck_assert_int_eq(s.n, NS);
        for (int i = 0; i < NS; i++) {
            ck_assert_uint_eq(s.stream[i], v->entries[i].stream);
            ck_assert_uint_eq(s.offset[i], v->entries[i].offset);
            ck_assert_uint_eq(s.len[i], v->entries[i].len);
            ck_assert_int_eq(memcmp(s.rec[i], v->entries[i].record, s.len[i]), 0);
            /* a record gathered from several pieces decodes as the source */
            ck_assert_uint_eq(lcache_position(s.c[i]), s.pos[i]);
            same_answers(w.src[i], lcache_ring(s.c[i]), &g);
        }
        seen_free(&s);
    }
    bundle_view_free(v);
    free(m.b);
    world_free(&w);
}
END_TEST

/* Every flipped byte: the reader refuses it in any pieces with parse's
 * status and words; a flip in the last record comes after the entries
 * before it were handed over (why a receiver holds them aside). */
START_TEST(bundle_reader_refuses_as_parse_does_whatever_the_pieces)
{
    pd_rng g = {.s = 13};
    world w;
    memsink m;
    bundle_view *v = world_bundle(&w, &g, &m);
    uint8_t *c = malloc(m.n);
    const size_t pieces[] = {7, 4096};
    for (size_t i = 0; i < m.n; i++)
        for (size_t k = 0; k < 2; k++) {
            memcpy(c, m.b, m.n);
            c[i] ^= 0x01;
            bundle_view *pv = NULL;
            pd_err pe = {0}, e = {0};
            pd_status want = bundle_parse(c, m.n, &pv, &pe);
            ck_assert_int_ne(want, PD_OK);
            seen s;
            seen_positions(&s, &w);
            ck_assert_int_eq(stream_in(c, m.n, m.n, pieces[k], &s, &e), want);
            ck_assert_str_eq(e.msg, pe.msg);
            if (i >= v->entries[NS - 1].offset)
                ck_assert_int_eq(s.n, NS - 1);
            seen_free(&s);
        }
    free(c);
    bundle_view_free(v);
    free(m.b);
    world_free(&w);
}
END_TEST

/* A transfer cut anywhere: the finish says how many of the announced bytes
 * arrived; bytes past the announced length, a caller's refusal and a
 * header longer than the announcement fail the reader, and stick. */
START_TEST(bundle_reader_cut_mid_stream_is_truncated)
{
    pd_rng g = {.s = 14};
    world w;
    memsink m;
    bundle_view *v = world_bundle(&w, &g, &m);
    char want[96];
    for (size_t cut = 0; cut < m.n; cut++) {
        seen s;
        seen_positions(&s, &w);
        pd_err e = {0};
        ck_assert_int_eq(stream_in(m.b, cut, m.n, 7, &s, &e), PD_ERR_TRUNCATED);
        snprintf(want, sizeof want, "%zu of the %zu announced bytes arrived", cut, m.n);
        ck_assert_msg(strstr(e.msg, want) != NULL, "cut %zu: %s", cut, e.msg);
        int whole = 0; /* entries that arrived whole */
        for (int i = 0; i < NS; i++)
            whole += v->entries[i].offset + v->entries[i].len + 4 <= cut;
        ck_assert_int_eq(s.n, whole);
        seen_free(&s);
    }
    /* one byte more than announced */
    uint8_t *c = malloc(m.n + 1);
    memcpy(c, m.b, m.n);
    c[m.n] = 0;
    seen s;
    seen_positions(&s, &w);
    pd_err e = {0};
    ck_assert_int_eq(stream_in(c, m.n + 1, m.n, 5, &s, &e), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "past the"));
    seen_free(&s);
    /* the caller refuses the second entry */
    seen_positions(&s, &w);
    s.refuse = 1;
    pd_err_clear(&e);
    ck_assert_int_eq(stream_in(m.b, m.n, m.n, 9, &s, &e), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.msg, "entry 1 refused by its caller"));
    ck_assert_int_eq(s.n, 1);
    seen_free(&s);
    /* announced shorter than a header */
    seen_positions(&s, &w);
    pd_err_clear(&e);
    ck_assert_int_eq(stream_in(m.b, 10, 10, 4, &s, &e), PD_ERR_TRUNCATED);
    ck_assert_ptr_nonnull(strstr(e.msg, "header needs 36 bytes"));
    ck_assert_int_eq(s.headers, 0);
    free(c);
    bundle_view_free(v);
    free(m.b);
    world_free(&w);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("bundle");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, bundle_round_trip_installs_every_stream_answering_identically);
    tcase_add_test(tc, bundle_layout_is_the_documented_one);
    tcase_add_test(tc, bundle_every_flipped_byte_is_rejected);
    tcase_add_test(tc, bundle_truncation_at_every_offset_is_rejected);
    tcase_add_test(tc, bundle_header_faults_are_refused);
    tcase_add_test(tc, bundle_duplicate_stream_ids_are_refused);
    tcase_add_test(tc, bundle_install_is_all_or_nothing);
    tcase_add_test(tc, bundle_install_into_containers_is_all_or_nothing);
    tcase_add_test(tc, bundle_non_finite_values_are_refused_before_install);
    tcase_add_test(tc, bundle_writer_refuses_what_would_make_an_invalid_bundle);
    tcase_add_test(tc, bundle_streams_large_states_without_holding_them);
    tcase_add_test(tc, bundle_with_no_streams_is_valid);
    tcase_add_test(tc, bundle_reader_in_any_pieces_hands_over_what_parse_gives);
    tcase_add_test(tc, bundle_reader_refuses_as_parse_does_whatever_the_pieces);
    tcase_add_test(tc, bundle_reader_cut_mid_stream_is_truncated);
    suite_add_tcase(s, tc);
    return s;
}
