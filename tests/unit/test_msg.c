/* msg: pipeline messages round-trip exactly; every truncation, byte flip,
 * huge count and bad field is refused without writing the caller's arrays. */
#include "pd_test.h"

#include "comm/msg.h"

#include <stdlib.h>
#include <string.h>

#define HID 8

static mb_admit g_admit[2] = {{.stream = 7, .prefill_rows = 5, .max_new = 9, .sample_key = 0x1122334455667788ull},
                              {.stream = 8, .prefill_rows = 1, .max_new = 1, .sample_key = 3}};
static uint64_t g_retire[1] = {4};
static mb_row g_rows[3] = {{.stream = 7, .pos = 0, .role = MB_ROLE_PREFILL, .wants_logits = 0},
                           {.stream = 7, .pos = 1, .role = MB_ROLE_PREFILL, .wants_logits = 1},
                           {.stream = 2, .pos = 40, .role = MB_ROLE_DECODE, .wants_logits = 1}};
static float g_x[3 * HID];

static msg_limits lim(void)
{
    return (msg_limits){.max_admit = 4, .max_retire = 4, .max_rows = 8, .max_tokens = 8, .hidden = HID};
}

static size_t encode(msg_dtype dt, uint8_t *buf, size_t cap)
{
    for (int i = 0; i < 3 * HID; i++)
        g_x[i] = (float)i * 0.25f - 2.0f;
    msg_batch b = {.seq = 42, .dtype = dt, .hidden = HID, .n_admit = 2, .n_retire = 1, .n_rows = 3,
                   .admit = g_admit, .retire = g_retire, .rows = g_rows, .x = g_x};
    size_t len = 0;
    pd_err e = {0};
    ck_assert_int_eq(msg_encode_batch(&b, buf, cap, &len, &e), PD_OK);
    ck_assert_uint_eq(len, msg_batch_bytes(&b));
    return len;
}

typedef struct dec {
    mb_admit admit[4];
    uint64_t retire[4];
    mb_row rows[8];
    float x[8 * HID];
    msg_batch b;
} dec;

static void dec_init(dec *d)
{
    memset(d, 0xAB, sizeof *d);
    d->b = (msg_batch){.admit = d->admit, .retire = d->retire, .rows = d->rows, .x = d->x};
}

START_TEST(msg_batch_round_trips_exactly_in_f32_and_f16)
{
    uint8_t buf[1024];
    for (int dt = 0; dt < 2; dt++) {
        size_t len = encode((msg_dtype)dt, buf, sizeof buf);
        dec d;
        dec_init(&d);
        msg_limits l = lim();
        pd_err e = {0};
        ck_assert_int_eq(msg_decode_batch(buf, len, &l, &d.b, &e), PD_OK);
        ck_assert_uint_eq(d.b.seq, 42);
        ck_assert_uint_eq(d.b.n_admit, 2);
        ck_assert_uint_eq(d.b.n_rows, 3);
        ck_assert_uint_eq(d.admit[0].sample_key, g_admit[0].sample_key);
        ck_assert_uint_eq(d.admit[1].max_new, 1);
        ck_assert_uint_eq(d.retire[0], 4);
        ck_assert_uint_eq(d.rows[2].pos, 40);
        ck_assert_uint_eq(d.rows[2].role, MB_ROLE_DECODE);
        ck_assert_uint_eq(d.rows[1].wants_logits, 1);
        /* the test values are exact in f16, so both dtypes round-trip */
        ck_assert_int_eq(memcmp(d.x, g_x, sizeof g_x), 0);
        msg_kind k;
        uint64_t seq;
        ck_assert_int_eq(msg_peek(buf, len, &k, &seq, &e), PD_OK);
        ck_assert_int_eq(k, MSG_KIND_BATCH);
    }
}
END_TEST

START_TEST(msg_batch_truncated_anywhere_is_refused_untouched)
{
    uint8_t buf[1024];
    size_t len = encode(MSG_DTYPE_F32, buf, sizeof buf);
    for (size_t cut = 0; cut < len; cut++) {
        dec d;
        dec_init(&d);
        dec ref = d;
        msg_limits l = lim();
        pd_err e = {0};
        ck_assert_int_ne(msg_decode_batch(buf, cut, &l, &d.b, &e), PD_OK);
        ck_assert_msg(strstr(e.msg, "offset") != NULL, "no offset in '%s'", e.msg);
        ck_assert_int_eq(memcmp(&d, &ref, sizeof d), 0);
    }
}
END_TEST

START_TEST(msg_batch_with_trailing_bytes_is_refused)
{
    uint8_t buf[1024];
    size_t len = encode(MSG_DTYPE_F32, buf, sizeof buf);
    buf[len] = 0;
    dec d;
    dec_init(&d);
    msg_limits l = lim();
    pd_err e = {0};
    ck_assert_int_eq(msg_decode_batch(buf, len + 1, &l, &d.b, &e), PD_ERR_FORMAT);
}
END_TEST

START_TEST(msg_batch_flipped_header_and_row_bytes_are_refused)
{
    uint8_t buf[1024];
    size_t len = encode(MSG_DTYPE_F32, buf, sizeof buf);
    /* every byte of the fixed header, counts, and row flags/reserved: any
     * change there must be refused (stream ids, positions and hidden values
     * are free-form and decode to other valid values) */
    size_t rows_at = 36 + 2 * 24 + 8;
    for (size_t i = 0; i < len; i++) {
        /* a row is 24 bytes: stream, pos, then role, logits, reserved (structural), then a free-form token */
        int structural = i < 36 || (i >= rows_at && i < rows_at + 3 * 24 && ((i - rows_at) % 24) >= 16 &&
                                    ((i - rows_at) % 24) < 20);
        if (!structural || (i >= 8 && i < 16))
            continue; /* seq is free-form */
        for (int bit = 0; bit < 8; bit++) {
            uint8_t c[1024];
            memcpy(c, buf, len);
            c[i] ^= (uint8_t)(1u << bit);
            dec d;
            dec_init(&d);
            dec ref = d;
            msg_limits l = lim();
            pd_err e = {0};
            pd_status st = msg_decode_batch(c, len, &l, &d.b, &e);
            if (st == PD_OK) {
                /* only a role flip to another valid role or logits 0<->1 can pass */
                int ok_flip = i >= rows_at && ((i - rows_at) % 24) == 16 && c[i] < MB_ROLE_COUNT;
                ok_flip |= i == 32 && (c[i] & ~MSG_FLAGS_KNOWN) == 0; /* another valid flags value */
                ok_flip |= i >= rows_at && ((i - rows_at) % 24) == 17 && c[i] <= 1;
                ck_assert_msg(ok_flip, "flip at byte %zu bit %d accepted", i, bit);
            } else {
                ck_assert_int_eq(memcmp(&d, &ref, sizeof d), 0);
            }
        }
    }
}
END_TEST

START_TEST(msg_batch_counts_beyond_limits_are_refused)
{
    uint8_t buf[1024];
    size_t len = encode(MSG_DTYPE_F32, buf, sizeof buf);
    const size_t count_at[3] = {16, 20, 24};
    const uint32_t huge[3] = {5, 0xffffffffu, 0x80000000u};
    for (int c = 0; c < 3; c++)
        for (int h = 0; h < 3; h++) {
            uint8_t m[1024];
            memcpy(m, buf, len);
            m[count_at[c]] = (uint8_t)huge[h];
            m[count_at[c] + 1] = (uint8_t)(huge[h] >> 8);
            m[count_at[c] + 2] = (uint8_t)(huge[h] >> 16);
            m[count_at[c] + 3] = (uint8_t)(huge[h] >> 24);
            dec d;
            dec_init(&d);
            msg_limits l = lim();
            pd_err e = {0};
            ck_assert_int_ne(msg_decode_batch(m, len, &l, &d.b, &e), PD_OK);
        }
    /* a receiver with another hidden size refuses */
    dec d;
    dec_init(&d);
    msg_limits l = lim();
    l.hidden = HID + 1;
    pd_err e = {0};
    ck_assert_int_eq(msg_decode_batch(buf, len, &l, &d.b, &e), PD_ERR_MISMATCH);
    ck_assert_msg(strstr(e.msg, "hidden") != NULL, "%s", e.msg);
}
END_TEST

START_TEST(msg_version_and_kind_are_checked)
{
    uint8_t buf[1024];
    size_t len = encode(MSG_DTYPE_F32, buf, sizeof buf);
    dec d;
    dec_init(&d);
    msg_limits l = lim();
    pd_err e = {0};
    buf[4]++;
    ck_assert_int_eq(msg_decode_batch(buf, len, &l, &d.b, &e), PD_ERR_VERSION);
    buf[4]--;
    buf[6] = 9;
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_batch(buf, len, &l, &d.b, &e), PD_ERR_FORMAT);
}
END_TEST

START_TEST(msg_results_and_stop_round_trip_and_refuse_damage)
{
    uint8_t buf[256];
    uint32_t toks[3] = {5, 0, 4000000000u};
    uint64_t dig[3] = {0x0123456789abcdefull, 0, UINT64_MAX};
    size_t len;
    pd_err e = {0};
    ck_assert_int_eq(msg_encode_results(9, MSG_FLAG_STOP, toks, dig, 3, buf, sizeof buf, &len, &e), PD_OK);
    ck_assert_uint_eq(len, msg_results_bytes(3));
    ck_assert_uint_eq(len, 16 + 8 + 3 * 4 + 3 * 8);
    /* little-endian, tokens first, then the digests */
    ck_assert_uint_eq(buf[24 + 12], 0xef);
    ck_assert_uint_eq(buf[24 + 12 + 7], 0x01);
    msg_limits l = lim();
    uint32_t out[8] = {0};
    uint64_t dout[8] = {0};
    uint32_t n = 0, flags = 0;
    uint64_t seq = 0;
    ck_assert_int_eq(msg_decode_results(buf, len, &l, &seq, &flags, out, dout, &n, &e), PD_OK);
    ck_assert_uint_eq(flags, MSG_FLAG_STOP);
    ck_assert_uint_eq(seq, 9);
    ck_assert_uint_eq(n, 3);
    ck_assert_int_eq(memcmp(out, toks, sizeof toks), 0);
    ck_assert_int_eq(memcmp(dout, dig, sizeof dig), 0);
    for (size_t cut = 0; cut < len; cut++) {
        pd_err_clear(&e);
        ck_assert_int_ne(msg_decode_results(buf, cut, &l, &seq, &flags, out, dout, &n, &e), PD_OK);
    }
    /* one byte more is a trailing byte, not a longer message */
    buf[len] = 0;
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_results(buf, len + 1, &l, &seq, &flags, out, dout, &n, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "trailing") != NULL, "%s", e.msg);
    /* a count the bytes cannot hold is refused before anything is read */
    buf[16] = 0xff;
    l.max_tokens = 1000;
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_results(buf, len, &l, &seq, &flags, out, dout, &n, &e), PD_ERR_TRUNCATED);
    buf[16] = 3;
    /* unknown flag bits are refused */
    buf[20] = 0x80;
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_results(buf, len, &l, &seq, &flags, out, dout, &n, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "flags") != NULL, "%s", e.msg);
    buf[20] = MSG_FLAG_STOP;
    l.max_tokens = 2;
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_results(buf, len, &l, &seq, &flags, out, dout, &n, &e), PD_ERR_RANGE);
    ck_assert_int_eq(msg_encode_stop(11, buf, sizeof buf, &len, &e), PD_OK);
    msg_kind k;
    ck_assert_int_eq(msg_peek(buf, len, &k, &seq, &e), PD_OK);
    ck_assert_int_eq(k, MSG_KIND_STOP);
    ck_assert_uint_eq(seq, 11);
    /* a batch buffer that is too small is an error, not an overflow */
    msg_batch b = {.seq = 1, .hidden = HID, .n_rows = 3, .rows = g_rows, .x = g_x};
    pd_err_clear(&e);
    ck_assert_int_eq(msg_encode_batch(&b, buf, 40, &len, &e), PD_ERR_RANGE);
}
END_TEST

START_TEST(msg_drain_round_trips_and_refuses_damage)
{
    uint8_t buf[64];
    size_t len;
    pd_err e = {0};
    ck_assert_int_eq(msg_encode_drain(1234, 7, 2, buf, sizeof buf, &len, &e), PD_OK);
    ck_assert_uint_eq(len, MSG_DRAIN_BYTES);
    msg_kind k;
    uint64_t seq = 0;
    ck_assert_int_eq(msg_peek(buf, len, &k, &seq, &e), PD_OK);
    ck_assert_int_eq(k, MSG_KIND_DRAIN);
    uint32_t action = 0, number = 0;
    ck_assert_int_eq(msg_decode_drain(buf, len, &seq, &action, &number, &e), PD_OK);
    ck_assert_uint_eq(seq, 1234);
    ck_assert_uint_eq(action, 7);
    ck_assert_uint_eq(number, 2);
    for (size_t cut = 0; cut < len; cut++) {
        pd_err_clear(&e);
        ck_assert_int_ne(msg_decode_drain(buf, cut, &seq, &action, &number, &e), PD_OK);
    }
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_drain(buf, len + 1, &seq, &action, &number, &e), PD_ERR_FORMAT);
    /* a drain is not a batch or results message, and they are not drains */
    msg_limits l = lim();
    uint32_t toks[4];
    uint64_t dig[4];
    uint32_t n;
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_results(buf, len, &l, &seq, &n, toks, dig, &n, &e), PD_ERR_FORMAT);
    ck_assert_int_eq(msg_encode_stop(3, buf, sizeof buf, &len, &e), PD_OK);
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_drain(buf, len, &seq, &action, &number, &e), PD_ERR_FORMAT);
    /* kind 5 is unknown to this version */
    ck_assert_int_eq(msg_encode_drain(1, 1, 0, buf, sizeof buf, &len, &e), PD_OK);
    buf[6] = 5;
    pd_err_clear(&e);
    ck_assert_int_eq(msg_peek(buf, len, &k, &seq, &e), PD_ERR_FORMAT);
}
END_TEST

START_TEST(msg_stats_round_trip_exactly_and_refuse_damage)
{
    msg_stats s = {.busy_s = 1.5, .wait_input_s = 1e-9, .wait_send_s = 0.0, .wall_s = 12345.678,
                   .messages_sent = 3e9, .bytes_sent = 7.0e12, .micro_batches = 42, .rows = 4242,
                   .cache_bytes_peak = 1.0 / 3.0, .attention_bytes_peak = -0.0, .rows_rolled_back = 17,
                   .prefill_rows = 4000, .decode_rows = 242, .prefill_s = 1.25, .decode_s = 0.25,
                   .stream_cache_bytes_peak = 123456, .stream_cache_estimate = 123456.5};
    uint8_t b[MSG_STATS_BYTES];
    msg_encode_stats(&s, b);
    ck_assert_int_eq(memcmp(b, "PDST", 4), 0);
    msg_stats o;
    pd_err e = {0};
    ck_assert_int_eq(msg_decode_stats(b, sizeof b, &o, &e), PD_OK);
    ck_assert_int_eq(memcmp(&o, &s, sizeof s), 0); /* every bit, -0.0 included */
    for (size_t cut = 0; cut < sizeof b; cut++) {
        pd_err_clear(&e);
        ck_assert_int_ne(msg_decode_stats(b, cut, &o, &e), PD_OK);
    }
    b[4] = 5;
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_stats(b, sizeof b, &o, &e), PD_ERR_VERSION);
    b[4] = 3; /* the version before the per-stream cache figures */
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_stats(b, sizeof b, &o, &e), PD_ERR_VERSION);
    b[4] = 4;
    b[6] = 16;
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_stats(b, sizeof b, &o, &e), PD_ERR_FORMAT);
    b[6] = 17;
    b[0] = 'X';
    pd_err_clear(&e);
    ck_assert_int_eq(msg_decode_stats(b, sizeof b, &o, &e), PD_ERR_FORMAT);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("msg");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, msg_batch_round_trips_exactly_in_f32_and_f16);
    tcase_add_test(tc, msg_batch_truncated_anywhere_is_refused_untouched);
    tcase_add_test(tc, msg_batch_with_trailing_bytes_is_refused);
    tcase_add_test(tc, msg_batch_flipped_header_and_row_bytes_are_refused);
    tcase_add_test(tc, msg_batch_counts_beyond_limits_are_refused);
    tcase_add_test(tc, msg_version_and_kind_are_checked);
    tcase_add_test(tc, msg_drain_round_trips_and_refuses_damage);
    tcase_add_test(tc, msg_stats_round_trip_exactly_and_refuse_damage);
    tcase_add_test(tc, msg_results_and_stop_round_trip_and_refuse_damage);
    suite_add_tcase(s, tc);
    return s;
}
