/* kv_chunk: a copy of a kv layer grown chunk by chunk while the original
 * keeps changing (appends, truncations, the q8 freeze and its undo,
 * importance) equals the original byte for byte once the FINAL chunk is
 * applied, for f32 and every q8 mode; kv_layer_mark says which rows a copy
 * may keep; and the decoder refuses every truncation, every flipped bit,
 * huge counts, non-finite values and mismatched geometry without touching
 * the copy. */
#include "pd_test.h"

#include "cache/kv_layer.h"
#include "comm/crc32c.h"
#include "comm/kv_chunk.h"

#include <stdlib.h>
#include <string.h>

enum { NKV = 3, HD = 40, FREEZE = 12 };
static const uint8_t ALIVE[NKV] = {1, 0, 1};
static const uint64_t ID = 0x0123456789abcdefull;

static kv_layer *make(kv_mode mode)
{
    kv_layer_config cfg = {.n_kv_heads = NKV, .head_dim = HD, .mode = mode, .alive = ALIVE,
                           .capacity_rows = 4, .freeze_rows = FREEZE, .spec_depth = 4};
    kv_layer *l = NULL;
    pd_err e = {0};
    ck_assert_msg(kv_layer_new(&cfg, &l, &e) == PD_OK, "%s", e.msg);
    return l;
}

static void append(kv_layer *l, pd_rng *r, uint32_t n)
{
    float k[NKV * HD], v[NKV * HD];
    pd_err e = {0};
    for (uint32_t i = 0; i < n; i++) {
        pd_rng_fill(r, k, NKV * HD, -2, 2);
        pd_rng_fill(r, v, NKV * HD, -2, 2);
        ck_assert_msg(kv_layer_append(l, k, v, &e) == PD_OK, "%s", e.msg);
    }
}

/* Every stored byte of a and b (rows, scales, fields, importance, records,
 * base, frozen) is the same. */
static void assert_same(const kv_layer *a, const kv_layer *b, const char *what)
{
    kv_state sa, sb;
    kv_head_state ha[NKV], hb[NKV];
    kv_layer_state(a, &sa, ha);
    kv_layer_state(b, &sb, hb);
    ck_assert_msg(sa.rows == sb.rows && sa.base == sb.base && sa.frozen == sb.frozen, "%s: rows %llu/%llu frozen %d/%d",
                  what, (unsigned long long)sa.rows, (unsigned long long)sb.rows, sa.frozen, sb.frozen);
    ck_assert_msg(sa.imp_pending == 0 && sb.imp_pending == 0, "%s: importance pending", what);
    size_t n = sa.rows;
    for (uint32_t h = 0; h < NKV; h++) {
        if (!ALIVE[h])
            continue;
#define SAME(f, bytes) \
    ck_assert_msg((ha[h].f == NULL) == (hb[h].f == NULL) && (!ha[h].f || memcmp(ha[h].f, hb[h].f, bytes) == 0), \
                  "%s: head %u " #f " differs", what, h)
        SAME(k, 4 * n * HD);
        SAME(v, 4 * n * HD);
        SAME(kq, n * HD);
        SAME(vq, n * HD);
        SAME(ks, 4 * n * ((HD + 31) / 32));
        SAME(vs, 4 * n);
        SAME(kcol, 4 * HD);
        SAME(vcol, 4 * HD);
#undef SAME
    }
    ck_assert_msg(n == 0 || memcmp(sa.imp, sb.imp, 4 * n) == 0, "%s: importance differs", what);
    ck_assert_msg(sa.n_linear == sb.n_linear && (!sa.n_linear || memcmp(sa.linear, sb.linear, 4 * sa.n_linear) == 0),
                  "%s: recurrent records differ", what);
}

/* The source's side of a pre-copy (precopy.c's rule): rows the copy holds
 * survive while kv_layer_marked_rows covers them; otherwise the copy
 * restarts. One chunk of rows [*sent, upto) is sent and applied. */
static void send_chunk(kv_layer *src, kv_layer *dst, uint64_t *sent, uint64_t upto, uint32_t flags, size_t *bytes)
{
    pd_err e = {0};
    if (kv_layer_marked_rows(src) < *sent)
        *sent = 0;
    if (upto > kv_layer_rows(src))
        upto = kv_layer_rows(src);
    if (upto < *sent)
        upto = *sent;
    uint32_t f = flags | (*sent == 0 ? KV_CHUNK_RESET : 0);
    size_t size = 0, len = 0;
    ck_assert_msg(kv_chunk_size(src, *sent, upto - *sent, f, &size, &e) == PD_OK, "%s", e.msg);
    void *buf = malloc(size + 8);
    ck_assert_msg(kv_chunk_encode(src, ID, 5, 77, *sent, upto - *sent, f, buf, size + 8, &len, &e) == PD_OK, "%s",
                  e.msg);
    ck_assert_uint_eq(len, size);
    kv_layer_config cfg;
    kv_layer_config_get(dst, &cfg);
    kv_head_state hs[NKV];
    kv_chunk_view v;
    ck_assert_msg(kv_chunk_decode(buf, len, &cfg, hs, &v, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(v.info.stream, 77);
    ck_assert_uint_eq(v.info.layer, 5);
    ck_assert_msg(kv_chunk_apply(dst, &v, &e) == PD_OK, "%s", e.msg);
    kv_layer_check(dst);
    free(buf);
    kv_layer_mark(src);
    *sent = upto;
    if (bytes)
        *bytes += len;
}

static const kv_mode MODES[] = {KV_MODE_F32, KV_MODE_Q8K, KV_MODE_Q8V, KV_MODE_Q8K | KV_MODE_Q8V};

/* A copy grown while the source appends, truncates (speculation's rollback)
 * and freezes equals the source after the FINAL chunk; importance added
 * after the rows were sent travels in the FINAL chunk. */
START_TEST(kv_chunk_copy_equals_the_source)
{
    kv_mode mode = MODES[_i % 4];
    pd_rng r = {.s = 1000 + (uint64_t)_i};
    kv_layer *src = make(mode), *dst = make(mode);
    uint64_t sent = 0;
    pd_err e = {0};
    kv_layer_mark(src);
    for (int step = 0; step < 40; step++) {
        append(src, &r, 1 + pd_rng_below(&r, 5));
        uint32_t what = pd_rng_below(&r, 4);
        if (what == 0 && kv_layer_rows(src) > 2) /* a rejected draft */
            ck_assert_int_eq(kv_layer_truncate_last(src, 1 + pd_rng_below(&r, 2), &e), PD_OK);
        if (what == 1) {
            float mass[4096];
            for (uint64_t i = 0; i < kv_layer_rows(src); i++)
                mass[i] = pd_rng_uniform(&r, 0, 1);
            ck_assert_int_eq(kv_layer_add_importance(src, mass, &e), PD_OK);
        }
        kv_layer_confirm(src, kv_layer_pos_len(src) - 1); /* the last row stays undoable */
        if (pd_rng_below(&r, 3) == 0)
            send_chunk(src, dst, &sent, sent + 1 + pd_rng_below(&r, 9), 0, NULL);
    }
    kv_layer_confirm(src, kv_layer_pos_len(src));
    send_chunk(src, dst, &sent, kv_layer_rows(src), KV_CHUNK_FINAL, NULL);
    assert_same(src, dst, "after FINAL");
    ck_assert(mode == KV_MODE_F32 || kv_layer_frozen(dst));
    kv_layer_free(src);
    kv_layer_free(dst);
}
END_TEST

/* Pre-copied rows are not sent again: after the copy caught up, the FINAL
 * chunk holds only the rows appended since (plus importance), whatever the
 * length of the layer. */
START_TEST(kv_chunk_final_is_the_delta)
{
    pd_rng r = {.s = 5};
    kv_layer *src = make(KV_MODE_F32), *dst = make(KV_MODE_F32);
    uint64_t sent = 0;
    size_t pre = 0, fin = 0;
    kv_layer_mark(src);
    append(src, &r, 300);
    send_chunk(src, dst, &sent, 300, 0, &pre);
    append(src, &r, 3);
    send_chunk(src, dst, &sent, kv_layer_rows(src), KV_CHUNK_FINAL, &fin);
    assert_same(src, dst, "delta");
    /* 3 rows of 2 alive heads x (K + V) x 40 floats, importance of 303 rows, header */
    size_t want = 3 * 2 * 2 * 4 * HD + 4 * 303;
    ck_assert_msg(fin < want + 256, "FINAL chunk %zu bytes, its rows and importance are %zu", fin, want);
    ck_assert(pre > 300 * 2 * 2 * 4 * HD);
    kv_layer_free(src);
    kv_layer_free(dst);
}
END_TEST

/* What kv_layer_marked_rows keeps: appends all, a truncation the rows before
 * its cut, a freeze or a clear none, recurrent records all. */
START_TEST(kv_chunk_mark_rules)
{
    pd_rng r = {.s = 9};
    pd_err e = {0};
    kv_layer *l = make(KV_MODE_Q8K);
    append(l, &r, 5);
    kv_layer_mark(l);
    append(l, &r, 3);
    ck_assert_uint_eq(kv_layer_marked_rows(l), 5);
    ck_assert_int_eq(kv_layer_truncate_last(l, 4, &e), PD_OK);
    ck_assert_uint_eq(kv_layer_marked_rows(l), 4);
    append(l, &r, 4);
    ck_assert_uint_eq(kv_layer_marked_rows(l), 4);
    kv_layer_mark(l);
    float lin[3] = {1, 2, 3};
    ck_assert_int_eq(kv_layer_set_linear(l, lin, 3, &e), PD_OK);
    ck_assert_uint_eq(kv_layer_marked_rows(l), 8);
    append(l, &r, FREEZE); /* the append at FREEZE rows freezes: every row requantized */
    ck_assert(kv_layer_frozen(l));
    ck_assert_uint_eq(kv_layer_marked_rows(l), 0);
    kv_layer_mark(l);
    kv_layer_clear(l);
    ck_assert_uint_eq(kv_layer_marked_rows(l), 0);
    kv_layer_free(l);
}
END_TEST

static void *chunk_of(kv_layer *src, uint64_t row0, uint64_t n, uint32_t flags, size_t *len)
{
    pd_err e = {0};
    size_t size;
    ck_assert_int_eq(kv_chunk_size(src, row0, n, flags, &size, &e), PD_OK);
    void *buf = malloc(size);
    ck_assert_msg(kv_chunk_encode(src, ID, 5, 77, row0, n, flags, buf, size, len, &e) == PD_OK, "%s", e.msg);
    return buf;
}

static void recrc(uint8_t *b, size_t len)
{
    uint32_t c = crc32c_update(0, b, len - 4);
    memcpy(b + len - 4, &c, 4);
}

/* A chunk that fails to decode or apply leaves the copy as it was. */
static void assert_refused(kv_layer *dst, const kv_layer *twin, const void *buf, size_t len, const char *what)
{
    kv_layer_config cfg;
    kv_layer_config_get(dst, &cfg);
    kv_head_state hs[NKV];
    kv_chunk_view v;
    pd_err e = {0};
    void *al = malloc(len + 4); /* aligned copy: the decoder takes 4-byte aligned buffers */
    memcpy(al, buf, len);
    pd_status st = kv_chunk_decode(al, len, &cfg, hs, &v, &e);
    if (st == PD_OK)
        st = kv_chunk_apply(dst, &v, &e);
    ck_assert_msg(st != PD_OK, "%s: accepted", what);
    ck_assert_msg(e.msg[0] != '\0', "%s: no message", what);
    assert_same(dst, twin, what);
    free(al);
}

START_TEST(kv_chunk_refuses_bad_bytes)
{
    pd_rng r = {.s = 3};
    pd_err e = {0};
    kv_layer *src = make(KV_MODE_Q8K), *dst = make(KV_MODE_Q8K), *twin = make(KV_MODE_Q8K);
    append(src, &r, FREEZE + 4);
    /* the copy holds the first rows */
    uint64_t s1 = 0, s2 = 0;
    send_chunk(src, dst, &s1, FREEZE + 2, 0, NULL);
    send_chunk(src, twin, &s2, FREEZE + 2, 0, NULL);
    assert_same(dst, twin, "twins");
    size_t len;
    uint8_t *b = chunk_of(src, FREEZE + 2, 2, KV_CHUNK_FINAL, &len);
    for (size_t cut = 0; cut < len; cut++)
        assert_refused(dst, twin, b, cut, "truncated");
    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit += 3) {
            b[i] ^= (uint8_t)(1u << bit);
            assert_refused(dst, twin, b, len, "bit flip");
            b[i] ^= (uint8_t)(1u << bit);
        }
    /* huge and inconsistent counts with a valid CRC */
    static const size_t count_at[] = {32, 40, 80, 88};
    static const uint64_t huge[] = {UINT64_MAX, UINT64_MAX / 3, 1ull << 40, 3};
    for (size_t i = 0; i < 4; i++)
        for (size_t j = 0; j < 4; j++) {
            uint8_t *c = malloc(len);
            memcpy(c, b, len);
            memcpy(c + count_at[i], &huge[j], 8);
            recrc(c, len);
            assert_refused(dst, twin, c, len, "count");
            free(c);
        }
    /* a NaN in the rows' scales with a valid CRC (offset after header + mask + fields) */
    {
        uint8_t *c = malloc(len);
        memcpy(c, b, len);
        float nan = __builtin_nanf("");
        size_t off = KV_CHUNK_HEADER + 8 + 2 * 4 * HD + 2 * HD; /* head 0's K scales */
        memcpy(c + off, &nan, 4);
        recrc(c, len);
        assert_refused(dst, twin, c, len, "NaN");
        free(c);
    }
    /* rows that do not continue the copy */
    free(b);
    b = chunk_of(src, FREEZE + 3, 1, 0, &len);
    assert_refused(dst, twin, b, len, "a gap");
    free(b);
    /* another geometry */
    kv_layer *f32 = make(KV_MODE_F32);
    b = chunk_of(src, 0, 2, KV_CHUNK_RESET, &len);
    assert_refused(f32, f32, b, len, "another mode");
    free(b);
    /* the good FINAL chunk still applies after all that */
    uint64_t s = FREEZE + 2;
    kv_layer_confirm(src, kv_layer_pos_len(src));
    send_chunk(src, dst, &s, kv_layer_rows(src), KV_CHUNK_FINAL, NULL);
    assert_same(src, dst, "final");
    uint8_t small[8];
    ck_assert_int_eq(kv_chunk_encode(src, ID, 5, 77, 0, 1, 0, small, 0, &len, &e), PD_ERR_ARG); /* RESET missing */
    kv_layer_free(f32);
    kv_layer_free(src);
    kv_layer_free(dst);
    kv_layer_free(twin);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("kv_chunk");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_loop_test(tc, kv_chunk_copy_equals_the_source, 0, 24);
    tcase_add_test(tc, kv_chunk_final_is_the_delta);
    tcase_add_test(tc, kv_chunk_mark_rules);
    tcase_add_test(tc, kv_chunk_refuses_bad_bytes);
    suite_add_tcase(s, tc);
    return s;
}
