/* Tests for cluster/runtime/pipeline/stream.h: the per-stream state's invariants, its
 * table, and its byte encoding — round trip, the golden layout, and the
 * decoder's refusals (every truncation, every byte flip, version + 1, huge
 * counts, inconsistent fields) leaving the output untouched. */
#include "pd_test.h"

#include "cluster/model/sample.h"
#include "cluster/runtime/pipeline/digest.h"
#include "cluster/runtime/pipeline/stream.h"

#include <stdlib.h>
#include <string.h>

static const stream_limits LIM = {.max_new = 1000, .max_prefill = 1u << 20};

static stream_state make(uint64_t id, const char *page_id, uint32_t n_tokens)
{
    stream_state s;
    pd_err e = {0};
    ck_assert_int_eq(stream_init(&s, id, 7, page_id, 12, 20, &e), PD_OK);
    s.fed = n_tokens ? 12 : 5;
    for (uint32_t i = 0; i < n_tokens; i++)
        ck_assert_int_eq(stream_push(&s, 100 + i, 0x1111 * (i + 1), &e), PD_OK);
    stream_check(&s);
    return s;
}

static uint8_t *encode(const stream_state *s, size_t *len)
{
    wr w;
    pd_err e = {0};
    ck_assert_int_eq(wr_init_buffer(&w, 0, &e), PD_OK);
    ck_assert_int_eq(stream_encode(s, &w), PD_OK);
    uint8_t *b = wr_take(&w, len);
    ck_assert_ptr_nonnull(b);
    ck_assert_uint_eq(*len, stream_encoded_size(s));
    return b;
}

static pd_status decode(const uint8_t *b, size_t len, stream_state *out, pd_err *e)
{
    rd r;
    rd_init(&r, b, len, 0, "stream", e);
    return stream_decode(&r, &LIM, out);
}

START_TEST(stream_round_trips_every_field)
{
    stream_state s = make(42, "page-\xc3\xa9", 5);
    size_t len;
    uint8_t *b = encode(&s, &len);
    stream_state o;
    pd_err e = {0};
    ck_assert_msg(decode(b, len, &o, &e) == PD_OK, "%s", e.msg);
    stream_check(&o);
    ck_assert_uint_eq(o.id, 42);
    ck_assert_uint_eq(o.page, 7);
    ck_assert_str_eq(o.page_id, "page-\xc3\xa9");
    ck_assert_uint_eq(o.key, sample_page_key("page-\xc3\xa9"));
    ck_assert_uint_eq(o.prefill_rows, 12);
    ck_assert_uint_eq(o.fed, 12);
    ck_assert_uint_eq(o.max_new, 20);
    ck_assert_uint_eq(o.n_tokens, 5);
    ck_assert_uint_eq(o.digest, s.digest);
    ck_assert_int_eq(memcmp(o.tokens, s.tokens, 5 * sizeof *o.tokens), 0);
    /* a decoded state goes on exactly like the original */
    ck_assert_int_eq(stream_push(&o, 9, 3, &e), PD_OK);
    ck_assert_int_eq(stream_push(&s, 9, 3, &e), PD_OK);
    ck_assert_uint_eq(o.digest, s.digest);
    stream_release(&o);
    stream_release(&s);
    free(b);
}
END_TEST

START_TEST(stream_layout_is_the_documented_one)
{
    stream_state s = make(0x0102030405060708ull, "ab", 1);
    size_t len;
    uint8_t *b = encode(&s, &len);
    ck_assert_uint_eq(len, 68 + 2 + 4);
    ck_assert_int_eq(memcmp(b, "PDSS\x01\x00\x00\x00", 8), 0);
    ck_assert_uint_eq(b[8], 0x08);  /* id, little-endian */
    ck_assert_uint_eq(b[15], 0x01);
    ck_assert_uint_eq(b[16], 7);    /* page */
    ck_assert_uint_eq(b[32], 12);   /* prefill_rows */
    ck_assert_uint_eq(b[40], 12);   /* fed */
    ck_assert_uint_eq(b[48], 20);   /* max_new */
    ck_assert_uint_eq(b[52], 1);    /* n_tokens */
    ck_assert_uint_eq(b[64], 2);    /* id_len */
    ck_assert_int_eq(memcmp(b + 68, "ab", 2), 0);
    ck_assert_uint_eq(b[70], 100);  /* the token */
    stream_release(&s);
    free(b);
}
END_TEST

START_TEST(stream_decoder_refuses_every_truncation_and_flip_untouched)
{
    stream_state s = make(9, "p00001", 3);
    size_t len;
    uint8_t *b = encode(&s, &len);
    stream_state sentinel;
    memset(&sentinel, 0xA5, sizeof sentinel);
    pd_err e = {0};
    for (size_t cut = 0; cut < len; cut++) {
        stream_state o = sentinel;
        pd_err_clear(&e);
        ck_assert_msg(decode(b, cut, &o, &e) != PD_OK, "accepted %zu of %zu bytes", cut, len);
        ck_assert_int_eq(memcmp(&o, &sentinel, sizeof o), 0);
    }
    /* every single-bit flip either fails or decodes into a state that is
     * still consistent (a flipped token, page or digest is just another
     * valid record: the bundle's CRC, not this record, guards integrity) */
    for (size_t i = 0; i < len; i++)
        for (int bit = 0; bit < 8; bit++) {
            b[i] ^= (uint8_t)(1u << bit);
            stream_state o = sentinel;
            pd_err_clear(&e);
            if (decode(b, len, &o, &e) == PD_OK) {
                stream_check(&o);
                ck_assert_msg(i >= 8 && (i < 24 || (i >= 40 && i < 64) || i >= 68),
                              "flip of byte %zu bit %d accepted", i, bit);
                stream_release(&o);
            } else {
                ck_assert_int_eq(memcmp(&o, &sentinel, sizeof o), 0);
                ck_assert_msg(e.msg[0] != '\0', "no message for byte %zu", i);
            }
            b[i] ^= (uint8_t)(1u << bit);
        }
    stream_release(&s);
    free(b);
}
END_TEST

START_TEST(stream_decoder_names_inconsistent_fields)
{
    stream_state s = make(1, "pg", 2);
    size_t len;
    uint8_t *b = encode(&s, &len);
    stream_state o;
    pd_err e = {0};
    struct {
        size_t off;
        uint8_t val;
        pd_status want;
        const char *says;
    } cases[] = {
        {4, 2, PD_ERR_VERSION, "version 2"},
        {6, 1, PD_ERR_FORMAT, "reserved"},
        {24, 0x55, PD_ERR_FORMAT, "key"},
        {40, 3, PD_ERR_FORMAT, "tokens before the prefill"},
        {40, 13, PD_ERR_FORMAT, "fed 13 exceeds"},
        {48, 0, PD_ERR_FORMAT, "n_tokens 2 exceeds max_new 0"},
        {51, 0xff, PD_ERR_RANGE, "max_new"},
        {55, 0x7f, PD_ERR_FORMAT, "n_tokens"},
        {64, 0, PD_ERR_FORMAT, "page id of 0 bytes"},
        {67, 0x10, PD_ERR_FORMAT, "page id of"},
        {68, 0, PD_ERR_FORMAT, "NUL"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        uint8_t saved = b[cases[k].off];
        b[cases[k].off] = cases[k].val;
        pd_err_clear(&e);
        pd_status st = decode(b, len, &o, &e);
        ck_assert_msg(st == cases[k].want && strstr(e.msg, cases[k].says), "case %zu: %d %s", k, (int)st, e.msg);
        b[cases[k].off] = saved;
    }
    /* trailing bytes and a huge prefill */
    uint8_t *longer = malloc(len + 1);
    memcpy(longer, b, len);
    longer[len] = 0;
    pd_err_clear(&e);
    ck_assert_int_eq(decode(longer, len + 1, &o, &e), PD_ERR_FORMAT);
    free(longer);
    b[39] = 0x40;
    pd_err_clear(&e);
    ck_assert_int_eq(decode(b, len, &o, &e), PD_ERR_RANGE);
    ck_assert_msg(strstr(e.msg, "prefill_rows") && strstr(e.msg, "offset 32"), "%s", e.msg);
    stream_release(&s);
    free(b);
}
END_TEST

START_TEST(stream_push_stops_after_max_new_plus_eos)
{
    stream_state s;
    pd_err e = {0};
    ck_assert_int_eq(stream_init(&s, 1, 0, "x", 1, 2, &e), PD_OK);
    s.fed = 1;
    uint64_t d = DIGEST_CHAIN_INIT;
    for (uint32_t i = 0; i < 3; i++) {
        ck_assert_int_eq(stream_push(&s, i, i + 10, &e), PD_OK);
        d = digest_chain(d, i + 10);
    }
    ck_assert_uint_eq(s.digest, d);
    ck_assert_int_eq(stream_push(&s, 3, 0, &e), PD_ERR_RANGE);
    ck_assert_uint_eq(s.n_tokens, 3);
    ck_assert_uint_eq(s.digest, d);
    stream_release(&s);
    stream_release(&s); /* a released state is zeroed: releasing again is safe */
    ck_assert_int_eq(stream_init(&s, 1, 0, "", 1, 2, &e), PD_ERR_ARG);
}
END_TEST

START_TEST(stream_table_keeps_distinct_ids_in_lowest_free_slots)
{
    stream_table *t;
    pd_err e = {0};
    ck_assert_int_eq(stream_table_new(3, &t, &e), PD_OK);
    uint32_t slot;
    for (uint64_t id = 0; id < 3; id++) {
        stream_state s = make(id, "p", 0);
        ck_assert_int_eq(stream_table_put(t, &s, &slot, &e), PD_OK);
        ck_assert_uint_eq(slot, id);
        ck_assert_ptr_null(s.tokens); /* taken over */
    }
    stream_state extra = make(9, "q", 0);
    ck_assert_int_eq(stream_table_put(t, &extra, &slot, &e), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(extra.tokens); /* left with the caller */
    stream_table_drop(t, 1);
    ck_assert_ptr_null(stream_table_at(t, 1));
    ck_assert_uint_eq(stream_table_count(t), 2);
    stream_state dup = make(2, "r", 0);
    ck_assert_int_eq(stream_table_put(t, &dup, &slot, &e), PD_ERR_ARG);
    stream_release(&dup);
    ck_assert_int_eq(stream_table_put(t, &extra, &slot, &e), PD_OK);
    ck_assert_uint_eq(slot, 1);
    ck_assert_uint_eq(stream_table_find(t, 9)->id, 9);
    ck_assert_ptr_null(stream_table_find(t, 1));
    stream_table_drop(t, 12345); /* absent: no-op */
    ck_assert_uint_eq(stream_table_count(t), 3);
    stream_table_free(t);
    stream_table_free(NULL);
}
END_TEST

START_TEST(stream_keyed_state_serves_the_tail)
{
    stream_state s;
    pd_err e = {0};
    ck_assert_int_eq(stream_init_keyed(&s, 5, 0xabcdefull, 4, &e), PD_OK);
    ck_assert_ptr_null(s.page_id);
    ck_assert_int_eq(stream_push(&s, 1, 2, &e), PD_OK);
    stream_check(&s);
    stream_release(&s);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("stream");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, stream_round_trips_every_field);
    tcase_add_test(tc, stream_layout_is_the_documented_one);
    tcase_add_test(tc, stream_decoder_refuses_every_truncation_and_flip_untouched);
    tcase_add_test(tc, stream_decoder_names_inconsistent_fields);
    tcase_add_test(tc, stream_push_stops_after_max_new_plus_eos);
    tcase_add_test(tc, stream_table_keeps_distinct_ids_in_lowest_free_slots);
    tcase_add_test(tc, stream_keyed_state_serves_the_tail);
    suite_add_tcase(s, tc);
    return s;
}
