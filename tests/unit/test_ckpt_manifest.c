/* Tests for cluster/runtime/ops/ckpt_manifest.h, the checkpoint manifest: round trip,
 * and the decoder's refusals — every truncation, every byte flip (the CRC
 * covers all of it), version + 1, huge counts, inconsistent streams —
 * leaving the output untouched. The checkpoint protocol itself (write,
 * publish, resume on other rank counts) is tests/e2e/checkpoint.sh. */
#include "pd_test.h"

#include "cluster/runtime/ops/ckpt_manifest.h"
#include "comm/crc32c.h"

#include <stdlib.h>
#include <string.h>

static const stream_limits LIM = {.max_new = 1000, .max_prefill = 1u << 20};

static ckpt_manifest sample(void)
{
    ckpt_manifest m = {.seq = 7, .model_fp = 0x1111, .pages_digest = 0x2222, .out_size = 4096, .next_id = 9,
                       .n_layers = 3, .n_streams = 2};
    m.settings = strdup("policy attn=full; seed 0");
    m.layer_map = strdup("0-1,2-2");
    m.bundles = calloc(3, sizeof *m.bundles);
    for (uint32_t L = 0; L < 3; L++)
        m.bundles[L] = (ckpt_bundle_info){.layer = L, .bytes = 100 + L, .crc = 0xabc0 + L};
    m.streams = calloc(2, sizeof *m.streams);
    pd_err e = {0};
    ck_assert_int_eq(stream_init(&m.streams[0], 3, 4, "p4", 12, 20, &e), PD_OK);
    m.streams[0].fed = 12;
    ck_assert_int_eq(stream_push(&m.streams[0], 55, 1, &e), PD_OK);
    ck_assert_int_eq(stream_init(&m.streams[1], 8, 9, "p9", 5, 3, &e), PD_OK);
    m.streams[1].fed = 2;
    return m;
}

static uint8_t *encode(const ckpt_manifest *m, size_t *len)
{
    wr w;
    pd_err e = {0};
    ck_assert_int_eq(wr_init_buffer(&w, 0, &e), PD_OK);
    ck_assert_int_eq(ckpt_manifest_encode(m, &w), PD_OK);
    uint8_t *b = wr_take(&w, len);
    ck_assert_ptr_nonnull(b);
    return b;
}

START_TEST(ckpt_manifest_round_trips)
{
    ckpt_manifest m = sample();
    size_t len;
    uint8_t *b = encode(&m, &len);
    ckpt_manifest o;
    pd_err e = {0};
    ck_assert_msg(ckpt_manifest_decode(b, len, &LIM, 3, &o, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(o.seq, 7);
    ck_assert_uint_eq(o.model_fp, 0x1111);
    ck_assert_uint_eq(o.pages_digest, 0x2222);
    ck_assert_uint_eq(o.out_size, 4096);
    ck_assert_uint_eq(o.next_id, 9);
    ck_assert_str_eq(o.settings, m.settings);
    ck_assert_str_eq(o.layer_map, m.layer_map);
    ck_assert_uint_eq(o.bundles[2].bytes, 102);
    ck_assert_uint_eq(o.bundles[2].crc, 0xabc2);
    ck_assert_uint_eq(o.n_streams, 2);
    ck_assert_str_eq(o.streams[1].page_id, "p9");
    ck_assert_uint_eq(o.streams[0].tokens[0], 55);
    ck_assert_uint_eq(o.streams[0].digest, m.streams[0].digest);
    /* the CRC closes it: the last 4 bytes are CRC32C of all before */
    uint32_t crc = crc32c_update(0, b, len - 4);
    ck_assert_int_eq(memcmp(b + len - 4, &crc, 4), 0);
    ckpt_manifest_free(&o);
    ckpt_manifest_free(&m);
    free(b);
}
END_TEST

START_TEST(ckpt_manifest_refuses_every_truncation_and_flip_untouched)
{
    ckpt_manifest m = sample();
    size_t len;
    uint8_t *b = encode(&m, &len);
    ckpt_manifest sentinel, o;
    memset(&sentinel, 0xA5, sizeof sentinel);
    pd_err e = {0};
    for (size_t cut = 0; cut < len; cut++) {
        o = sentinel;
        pd_err_clear(&e);
        ck_assert_msg(ckpt_manifest_decode(b, cut, &LIM, 3, &o, &e) != PD_OK, "accepted %zu of %zu bytes", cut, len);
        ck_assert_int_eq(memcmp(&o, &sentinel, sizeof o), 0);
    }
    for (size_t i = 0; i < len; i++) {
        b[i] ^= 0x40;
        o = sentinel;
        pd_err_clear(&e);
        ck_assert_msg(ckpt_manifest_decode(b, len, &LIM, 3, &o, &e) != PD_OK, "flip of byte %zu accepted", i);
        ck_assert_int_eq(memcmp(&o, &sentinel, sizeof o), 0);
        ck_assert(e.msg[0] != '\0');
        b[i] ^= 0x40;
    }
    ckpt_manifest_free(&m);
    free(b);
}
END_TEST

/* Re-encodes with one field changed so the CRC is right and only the
 * field's own check can refuse it. */
static pd_status decode_changed(void (*change)(ckpt_manifest *), uint32_t max_layers, pd_err *e)
{
    ckpt_manifest m = sample();
    change(&m);
    size_t len;
    uint8_t *b = encode(&m, &len);
    ckpt_manifest o;
    pd_status st = ckpt_manifest_decode(b, len, &LIM, max_layers, &o, e);
    if (st == PD_OK)
        ckpt_manifest_free(&o);
    ckpt_manifest_free(&m);
    free(b);
    return st;
}

static void dup_id(ckpt_manifest *m) { m->streams[1].id = m->streams[0].id; }
static void dup_page(ckpt_manifest *m) { m->streams[1].page = m->streams[0].page; }
static void id_past_next(ckpt_manifest *m) { m->next_id = 8; }
static void layer_order(ckpt_manifest *m) { m->bundles[1].layer = 2; }
static void no_change(ckpt_manifest *m) { (void)m; }

START_TEST(ckpt_manifest_names_inconsistent_fields)
{
    pd_err e = {0};
    ck_assert_int_eq(decode_changed(dup_id, 3, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "repeats the id or page"), "%s", e.msg);
    pd_err_clear(&e);
    ck_assert_int_eq(decode_changed(dup_page, 3, &e), PD_ERR_FORMAT);
    pd_err_clear(&e);
    ck_assert_int_eq(decode_changed(id_past_next, 3, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "not below the next id"), "%s", e.msg);
    pd_err_clear(&e);
    ck_assert_int_eq(decode_changed(layer_order, 3, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "names layer 2"), "%s", e.msg);
    pd_err_clear(&e);
    ck_assert_int_eq(decode_changed(no_change, 2, &e), PD_ERR_RANGE); /* more layers than the model */
    ck_assert_msg(strstr(e.msg, "layer count 3"), "%s", e.msg);
}
END_TEST

START_TEST(ckpt_manifest_refuses_versions_and_huge_counts)
{
    ckpt_manifest m = sample();
    size_t len;
    uint8_t *b = encode(&m, &len);
    ckpt_manifest o;
    pd_err e = {0};
    /* version + 1 with a correct CRC */
    b[4] = 2;
    uint32_t crc = crc32c_update(0, b, len - 4);
    memcpy(b + len - 4, &crc, 4);
    ck_assert_int_eq(ckpt_manifest_decode(b, len, &LIM, 3, &o, &e), PD_ERR_VERSION);
    b[4] = 1;
    /* a stream count the bytes cannot hold, CRC fixed */
    b[52] = 0xff;
    b[53] = 0xff;
    b[54] = 0xff;
    crc = crc32c_update(0, b, len - 4);
    memcpy(b + len - 4, &crc, 4);
    pd_err_clear(&e);
    ck_assert_int_eq(ckpt_manifest_decode(b, len, &LIM, 3, &o, &e), PD_ERR_TRUNCATED);
    ckpt_manifest_free(&m);
    free(b);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("ckpt_manifest");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, ckpt_manifest_round_trips);
    tcase_add_test(tc, ckpt_manifest_refuses_every_truncation_and_flip_untouched);
    tcase_add_test(tc, ckpt_manifest_names_inconsistent_fields);
    tcase_add_test(tc, ckpt_manifest_refuses_versions_and_huge_counts);
    suite_add_tcase(s, tc);
    return s;
}
