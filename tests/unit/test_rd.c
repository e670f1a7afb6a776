/* rd / wr: every read is bounds checked and names its offset, failures stick,
 * counts are checked before allocation, and the three writer modes emit the
 * same bytes. */
#include "pd_test.h"

#include "base/cpu.h"
#include "base/fp16.h"
#include "comm/crc32c.h"
#include "comm/rd.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

START_TEST(rd_reads_little_endian_fields_in_order)
{
    const uint8_t b[] = {0x7f, 0x34, 0x12, 0x78, 0x56, 0x34, 0x12, 0x08, 0x07, 0x06,
                         0x05, 0x04, 0x03, 0x02, 0x01};
    rd r;
    rd_init(&r, b, sizeof b, 0, "t", NULL);
    uint8_t u8 = 0;
    uint16_t u16 = 0;
    uint32_t u32 = 0;
    uint64_t u64 = 0;
    ck_assert_int_eq(rd_u8(&r, "a", &u8), PD_OK);
    ck_assert_int_eq(rd_u16(&r, "b", &u16), PD_OK);
    ck_assert_int_eq(rd_u32(&r, "c", &u32), PD_OK);
    ck_assert_int_eq(rd_u64(&r, "d", &u64), PD_OK);
    ck_assert_uint_eq(u8, 0x7f);
    ck_assert_uint_eq(u16, 0x1234);
    ck_assert_uint_eq(u32, 0x12345678u);
    ck_assert_uint_eq(u64, 0x0102030405060708ull);
    ck_assert_uint_eq(rd_remaining(&r), 0);
    ck_assert_int_eq(rd_expect_end(&r), PD_OK);
}
END_TEST

START_TEST(rd_truncated_read_names_offset_and_field_and_leaves_output)
{
    const uint8_t b[6] = {1, 2, 3, 4, 5, 6};
    pd_err e = {0};
    rd r;
    rd_init(&r, b, sizeof b, 100, "wire", &e);
    uint32_t a = 0, c = 0xdeadbeef;
    ck_assert_int_eq(rd_u32(&r, "layer", &a), PD_OK);
    ck_assert_int_eq(rd_u32(&r, "kind", &c), PD_ERR_TRUNCATED);
    ck_assert_uint_eq(c, 0xdeadbeef);
    ck_assert_int_eq(e.status, PD_ERR_TRUNCATED);
    ck_assert_str_eq(e.msg, "wire: offset 104: kind needs 4 bytes, 2 remain");
    /* sticky: a later read that would fit fails the same way */
    uint8_t x = 9;
    ck_assert_int_eq(rd_u8(&r, "x", &x), PD_ERR_TRUNCATED);
    ck_assert_uint_eq(x, 9);
    ck_assert_uint_eq(rd_offset(&r), 104);
}
END_TEST

START_TEST(rd_count_is_checked_against_remaining_and_overflow)
{
    uint8_t b[512] = {0};
    pd_err e = {0};
    rd r;
    rd_init(&r, b, sizeof b, 132, "wire", &e);
    size_t bytes = 0;
    ck_assert_int_eq(rd_check_count(&r, "head 3 k count", 128, 4, &bytes), PD_OK);
    ck_assert_uint_eq(bytes, 512);
    ck_assert_int_eq(rd_check_count(&r, "head 3 k count", 4096, 4, &bytes), PD_ERR_TRUNCATED);
    ck_assert_str_eq(e.msg, "wire: offset 132: head 3 k count 4096 (16384 bytes) exceeds 512 "
                            "remaining bytes");
    pd_err e2 = {0};
    rd_init(&r, b, sizeof b, 0, "wire", &e2);
    ck_assert_int_eq(rd_check_count(&r, "n", UINT64_MAX / 2, 4, &bytes), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e2.msg, "overflows"));
    pd_err e3 = {0};
    rd_init(&r, b, sizeof b, 0, "wire", &e3);
    ck_assert_int_eq(rd_check_count(&r, "n", UINT32_MAX, 4, &bytes), PD_ERR_TRUNCATED);
}
END_TEST

START_TEST(rd_arrays_decode_f32_f16_i8_and_skip_with_null)
{
    float src[5] = {1.5f, -2.25f, 0.0f, 65504.0f, 0x1p-24f};
    uint8_t b[5 * 4 + 5 * 2 + 3];
    memcpy(b, src, sizeof src); /* little-endian host in CI; checked below by value */
    uint16_t h[5];
    for (int i = 0; i < 5; i++)
        h[i] = pd_f32_to_f16(src[i]);
    for (int i = 0; i < 5; i++) {
        b[20 + 2 * i] = (uint8_t)h[i];
        b[21 + 2 * i] = (uint8_t)(h[i] >> 8);
    }
    b[30] = 0x80;
    b[31] = 0x7f;
    b[32] = 0xff;
    rd r;
    rd_init(&r, b, sizeof b, 0, "t", NULL);
    float f[5], g[5];
    int8_t q[3];
    ck_assert_int_eq(rd_f32_n(&r, "f", f, 5), PD_OK);
    ck_assert_int_eq(rd_f16_n(&r, "g", g, 5), PD_OK);
    ck_assert_int_eq(rd_i8_n(&r, "q", q, 3), PD_OK);
    ck_assert_int_eq(rd_expect_end(&r), PD_OK);
    for (int i = 0; i < 5; i++) {
        ck_assert_float_eq(f[i], src[i]);
        ck_assert_float_eq(g[i], src[i]); /* all exactly representable in f16 */
    }
    ck_assert_int_eq(q[0], -128);
    ck_assert_int_eq(q[1], 127);
    ck_assert_int_eq(q[2], -1);
    rd_init(&r, b, sizeof b, 0, "t", NULL);
    ck_assert_int_eq(rd_f32_n(&r, "f", NULL, 5), PD_OK);
    ck_assert_uint_eq(rd_offset(&r), 20);
    ck_assert_int_eq(rd_f32_n(&r, "f", NULL, 4), PD_ERR_TRUNCATED);
}
END_TEST

START_TEST(rd_peek_looks_ahead_without_consuming)
{
    const uint8_t b[2] = {0x93, 'N'};
    pd_err e = {0};
    rd r;
    rd_init(&r, b, sizeof b, 0, "t", &e);
    ck_assert_int_eq(rd_peek(&r), 0x93); /* a byte, not a negative char */
    ck_assert_int_eq(rd_peek(&r), 0x93);
    ck_assert_int_eq(rd_skip(&r, "a", 1), PD_OK);
    ck_assert_int_eq(rd_peek(&r), 'N');
    ck_assert_int_eq(rd_skip(&r, "b", 1), PD_OK);
    ck_assert_int_eq(rd_peek(&r), -1); /* the end */
    rd_init(&r, b, sizeof b, 0, "t", &e);
    uint32_t v;
    ck_assert_int_eq(rd_u32(&r, "c", &v), PD_ERR_TRUNCATED);
    ck_assert_int_eq(rd_peek(&r), -1); /* a failed reader has nothing to show */
}
END_TEST

START_TEST(rd_until_splits_lines_and_reports_the_last_unterminated_one)
{
    const char text[] = "ab\n\ncd";
    rd r;
    rd_init(&r, text, sizeof text - 1, 0, "t", NULL);
    const uint8_t *s = NULL;
    size_t n = 99;
    bool found = false;
    ck_assert_int_eq(rd_until(&r, '\n', &s, &n, &found), PD_OK);
    ck_assert(found && n == 2 && memcmp(s, "ab", 2) == 0);
    ck_assert_uint_eq(rd_offset(&r), 3);
    ck_assert_int_eq(rd_until(&r, '\n', &s, &n, &found), PD_OK);
    ck_assert(found && n == 0);
    ck_assert_int_eq(rd_until(&r, '\n', &s, &n, &found), PD_OK);
    ck_assert(!found && n == 2 && memcmp(s, "cd", 2) == 0);
    ck_assert_uint_eq(rd_remaining(&r), 0);
    ck_assert_int_eq(rd_until(&r, '\n', &s, &n, &found), PD_OK);
    ck_assert(!found && n == 0);
    /* a failed reader refuses and leaves the outputs alone */
    uint8_t x;
    ck_assert_int_eq(rd_u8(&r, "x", &x), PD_ERR_TRUNCATED);
    n = 7;
    ck_assert_int_eq(rd_until(&r, '\n', &s, &n, &found), PD_ERR_TRUNCATED);
    ck_assert_uint_eq(n, 7);
}
END_TEST

START_TEST(rd_trailing_bytes_are_an_error)
{
    uint8_t b[3] = {0};
    pd_err e = {0};
    rd r;
    rd_init(&r, b, sizeof b, 0, "wire", &e);
    uint8_t x;
    rd_u8(&r, "x", &x);
    ck_assert_int_eq(rd_expect_end(&r), PD_ERR_FORMAT);
    ck_assert_str_eq(e.msg, "wire: offset 1: 2 trailing byte(s) after the end");
}
END_TEST

START_TEST(rd_fail_reports_first_failure_only)
{
    uint8_t b[8] = {0};
    pd_err e = {0};
    rd r;
    rd_init(&r, b, sizeof b, 10, "wire", &e);
    ck_assert_int_eq(rd_fail_at(&r, 12, PD_ERR_MISMATCH, "layer %u", 3u), PD_ERR_MISMATCH);
    ck_assert_int_eq(rd_fail(&r, PD_ERR_FORMAT, "later"), PD_ERR_MISMATCH);
    ck_assert_str_eq(e.msg, "wire: offset 12: layer 3");
}
END_TEST

START_TEST(rd_span_borrows_input_without_copy)
{
    uint8_t b[10] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
    rd r;
    rd_init(&r, b, sizeof b, 0, "t", NULL);
    const uint8_t *p = NULL;
    ck_assert_int_eq(rd_skip(&r, "s", 2), PD_OK);
    ck_assert_int_eq(rd_span(&r, "p", 4, &p), PD_OK);
    ck_assert_ptr_eq(p, b + 2);
    uint8_t c[4];
    ck_assert_int_eq(rd_bytes(&r, "c", c, 4), PD_OK);
    ck_assert_uint_eq(c[3], 9);
    ck_assert_int_eq(rd_span(&r, "p", 1, &p), PD_ERR_TRUNCATED);
}
END_TEST

/* Writes one fixed mixed sequence into w. */
static void wr_sample(wr *w, const float *x, size_t n)
{
    wr_u8(w, 0xab);
    wr_u16(w, 0x1234);
    wr_u32(w, 0xdeadbeefu);
    wr_u64(w, 0x0102030405060708ull);
    wr_f32_n(w, x, n);
    wr_f16_n(w, x, n);
    int8_t q[3] = {-1, 0, 127};
    wr_i8_n(w, q, 3);
}

static uint8_t *sink_buf;
static size_t sink_len, sink_calls;

static pd_status sink_collect(void *ctx, const void *p, size_t n, pd_err *err)
{
    (void)ctx;
    (void)err;
    sink_buf = realloc(sink_buf, sink_len + n);
    memcpy(sink_buf + sink_len, p, n);
    sink_len += n;
    sink_calls++;
    return PD_OK;
}

START_TEST(wr_modes_emit_identical_bytes_and_crc)
{
    enum { N = 3000 };
    float *x = malloc(N * sizeof *x);
    pd_rng g = {.s = 7};
    pd_rng_fill(&g, x, N, -4.0f, 4.0f);

    wr c;
    wr_init_count(&c, NULL);
    wr_sample(&c, x, N);
    size_t expect = 1 + 2 + 4 + 8 + 4 * N + 2 * N + 3;
    ck_assert_uint_eq(c.total, expect);

    wr b;
    ck_assert_int_eq(wr_init_buffer(&b, 0, NULL), PD_OK);
    wr_crc_begin(&b);
    wr_sample(&b, x, N);
    uint32_t crc_b = wr_crc_end(&b);
    size_t len = 0;
    uint8_t *bytes = wr_take(&b, &len);
    ck_assert_uint_eq(len, expect);
    ck_assert_uint_eq(crc_b, crc32c_update(0, bytes, len));
    ck_assert_uint_eq(bytes[0], 0xab);
    ck_assert_uint_eq(bytes[1], 0x34);
    ck_assert_uint_eq(bytes[2], 0x12);
    ck_assert_uint_eq(bytes[3], 0xef);
    ck_assert_uint_eq(bytes[7], 0x08);

    sink_buf = NULL;
    sink_len = sink_calls = 0;
    uint8_t staging[100];
    wr s;
    wr_init_sink(&s, sink_collect, NULL, staging, sizeof staging, NULL);
    wr_crc_begin(&s);
    wr_sample(&s, x, N);
    uint32_t crc_s = wr_crc_end(&s);
    ck_assert_int_eq(wr_flush(&s), PD_OK);
    ck_assert_uint_eq(sink_len, expect);
    ck_assert_int_eq(memcmp(sink_buf, bytes, expect), 0);
    ck_assert_uint_eq(crc_s, crc_b);
    ck_assert_uint_gt(sink_calls, 1);

    /* Reading back gives the values (f16 values are the rounded ones). */
    rd r;
    rd_init(&r, bytes, len, 0, "t", NULL);
    ck_assert_int_eq(rd_skip(&r, "hdr", 15), PD_OK);
    float *y = malloc(N * sizeof *y);
    ck_assert_int_eq(rd_f32_n(&r, "f", y, N), PD_OK);
    ck_assert_int_eq(memcmp(x, y, N * sizeof *y), 0);
    ck_assert_int_eq(rd_f16_n(&r, "h", y, N), PD_OK);
    for (size_t i = 0; i < N; i++)
        ck_assert_float_eq(y[i], pd_f16_to_f32(pd_f32_to_f16(x[i])));
    free(y);
    free(bytes);
    free(sink_buf);
    free(x);
}
END_TEST

static pd_status sink_fail(void *ctx, const void *p, size_t n, pd_err *err)
{
    (void)ctx;
    (void)p;
    (void)n;
    return pd_err_set(err, PD_ERR_IO, "disk full");
}

START_TEST(wr_sink_failure_sticks)
{
    pd_err e = {0};
    uint8_t staging[64];
    wr s;
    wr_init_sink(&s, sink_fail, NULL, staging, sizeof staging, &e);
    uint8_t big[200] = {0};
    ck_assert_int_eq(wr_bytes(&s, big, sizeof big), PD_ERR_IO);
    ck_assert_int_eq(wr_u32(&s, 1), PD_ERR_IO);
    ck_assert_str_eq(e.msg, "disk full");
}
END_TEST

START_TEST(wr_file_and_fd_sinks_write_everything)
{
    char path[] = "/tmp/pd_test_rd_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    uint8_t staging[64];
    wr s;
    wr_init_sink(&s, wr_sink_fd, &fd, staging, sizeof staging, NULL);
    uint8_t big[300];
    for (int i = 0; i < 300; i++)
        big[i] = (uint8_t)i;
    ck_assert_int_eq(wr_bytes(&s, big, 10), PD_OK);
    ck_assert_int_eq(wr_bytes(&s, big, 300), PD_OK);
    ck_assert_int_eq(wr_flush(&s), PD_OK);
    close(fd);
    FILE *f = fopen(path, "rb");
    uint8_t back[400];
    ck_assert_uint_eq(fread(back, 1, sizeof back, f), 310);
    fclose(f);
    ck_assert_int_eq(memcmp(back, big, 10), 0);
    ck_assert_int_eq(memcmp(back + 10, big, 300), 0);

    f = fopen(path, "wb");
    wr_init_sink(&s, wr_sink_file, f, staging, sizeof staging, NULL);
    ck_assert_int_eq(wr_u64(&s, 42), PD_OK);
    ck_assert_int_eq(wr_flush(&s), PD_OK);
    fclose(f);
    f = fopen(path, "rb");
    ck_assert_uint_eq(fread(back, 1, sizeof back, f), 8);
    fclose(f);
    ck_assert_uint_eq(back[0], 42);
    unlink(path);
}
END_TEST

START_TEST(wr_f16_refuses_values_that_would_become_inf_or_nan)
{
    const float ok[3] = {65504.0f, -65504.0f, 65519.0f}; /* 65519 rounds down to 65504 */
    const float bad[3] = {1.0f, 65520.0f, 2.0f};
    pd_err e = {0};
    wr w;
    ck_assert_int_eq(wr_init_buffer(&w, 0, &e), PD_OK);
    ck_assert_int_eq(wr_f16_n(&w, ok, 3), PD_OK);
    ck_assert_int_eq(wr_f16_n(&w, bad, 3), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "65520"));
    ck_assert_int_eq(wr_u8(&w, 1), PD_ERR_RANGE); /* sticky */
    wr_dispose(&w);
    const float nan[1] = {__builtin_nanf("")};
    ck_assert_int_eq(wr_init_buffer(&w, 0, NULL), PD_OK);
    ck_assert_int_eq(wr_f16_n(&w, nan, 1), PD_ERR_RANGE);
    wr_dispose(&w);
    /* counting needs no conversion and so cannot tell */
    wr_init_count(&w, NULL);
    ck_assert_int_eq(wr_f16_n(&w, bad, 3), PD_OK);
    ck_assert_uint_eq(w.total, 6);
}
END_TEST

START_TEST(rd_max_abs_bits_avx2_path_equals_portable_path)
{
    enum { N = 300 };
    float x[N];
    pd_rng g = {.s = 21};
    pd_isa was = pd_cpu_isa();
    for (int trial = 0; trial < 40; trial++) {
        pd_rng_fill(&g, x, N, -1000.0f, 1000.0f);
        if (trial % 3 == 1)
            x[pd_rng_below(&g, N)] = -__builtin_inff();
        if (trial % 3 == 2)
            x[pd_rng_below(&g, N)] = __builtin_nanf("");
        for (size_t n = 0; n <= N; n += 1 + n / 8)
            for (size_t off = 0; off < 3 && off <= n; off++) {
                pd_cpu_set_isa(PD_ISA_SCALAR);
                uint32_t a = rd_f32_max_abs_bits(x + off, n - off);
                pd_cpu_set_isa(PD_ISA_AVX2);
                uint32_t b = rd_f32_max_abs_bits(x + off, n - off);
                ck_assert_uint_eq(a, b);
                uint32_t want = 0;
                for (size_t i = off; i < n; i++) {
                    uint32_t u;
                    memcpy(&u, x + i, 4);
                    u &= 0x7fffffffu;
                    want = u > want ? u : want;
                }
                ck_assert_uint_eq(a, want);
            }
    }
    pd_cpu_set_isa(was);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("rd");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, rd_reads_little_endian_fields_in_order);
    tcase_add_test(tc, rd_truncated_read_names_offset_and_field_and_leaves_output);
    tcase_add_test(tc, rd_count_is_checked_against_remaining_and_overflow);
    tcase_add_test(tc, rd_arrays_decode_f32_f16_i8_and_skip_with_null);
    tcase_add_test(tc, rd_peek_looks_ahead_without_consuming);
    tcase_add_test(tc, rd_until_splits_lines_and_reports_the_last_unterminated_one);
    tcase_add_test(tc, rd_trailing_bytes_are_an_error);
    tcase_add_test(tc, rd_fail_reports_first_failure_only);
    tcase_add_test(tc, rd_span_borrows_input_without_copy);
    tcase_add_test(tc, wr_modes_emit_identical_bytes_and_crc);
    tcase_add_test(tc, wr_sink_failure_sticks);
    tcase_add_test(tc, wr_file_and_fd_sinks_write_everything);
    tcase_add_test(tc, wr_f16_refuses_values_that_would_become_inf_or_nan);
    tcase_add_test(tc, rd_max_abs_bits_avx2_path_equals_portable_path);
    suite_add_tcase(s, tc);
    return s;
}
