/* Tests for cluster/format/npy.h: golden bytes assembled by hand, every-offset
 * truncation, refused dtypes/orders/shapes/headers, version 2.0 and 3.0
 * headers, row reads, the atomic writer. */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster/format/npy.h"
#include "pd_test.h"

/* NumPy 1.x's exact bytes for np.array([[1, 2, 3], [4, 5, 6]], '<f4'). */
static const char GOLDEN_DICT[] = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
static const float GOLDEN_VALUES[6] = {1, 2, 3, 4, 5, 6};

/* Assembles a file: magic, version, length field (u16 for v1, u32 else),
 * the header text padded with spaces + '\n' to `pad` alignment (0 = none),
 * then data. Returns the length written into out. */
static size_t build(uint8_t *out, size_t cap, int major, const char *dict, size_t pad,
                    const void *data, size_t data_len)
{
    size_t start = major == 1 ? 10 : 12;
    size_t dl = strlen(dict);
    size_t total = start + dl + 1;
    if (pad)
        total = (total + pad - 1) / pad * pad;
    ck_assert_uint_le(total + data_len, cap);
    memcpy(out, "\x93NUMPY", 6);
    out[6] = (uint8_t)major;
    out[7] = 0;
    size_t hlen = total - start;
    out[8] = (uint8_t)hlen;
    out[9] = (uint8_t)(hlen >> 8);
    if (major != 1) {
        out[10] = (uint8_t)(hlen >> 16);
        out[11] = (uint8_t)(hlen >> 24);
    }
    memcpy(out + start, dict, dl);
    memset(out + start + dl, ' ', total - start - dl - 1);
    out[total - 1] = '\n';
    if (data_len)
        memcpy(out + total, data, data_len);
    return total + data_len;
}


static void path_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", pd_tmpdir, name);
}

static void write_file(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

static size_t golden(uint8_t *out, size_t cap)
{
    return build(out, cap, 1, GOLDEN_DICT, 64, GOLDEN_VALUES, sizeof GOLDEN_VALUES);
}

START_TEST(npy_golden_v1_bytes_parse_and_read)
{
    uint8_t b[256];
    size_t n = golden(b, sizeof b);
    ck_assert_uint_eq(n, 128 + 24);
    ck_assert_uint_eq(b[8], 118); /* NumPy writes 'v' here for small arrays */
    npy_info info;
    pd_err err = {0};
    ck_assert_int_eq(npy_parse_header(b, n, n, "g.npy", &info, &err), PD_OK);
    ck_assert_uint_eq(info.major, 1);
    ck_assert_uint_eq(info.rows, 2);
    ck_assert_uint_eq(info.cols, 3);
    ck_assert_uint_eq(info.data_offset, 128);
    ck_assert_uint_eq(info.file_size, n);

    char p[512];
    path_in(p, sizeof p, "g.npy");
    write_file(p, b, n);
    float *v = NULL;
    ck_assert_int_eq(npy_load(p, &info, &v, &err), PD_OK);
    ck_assert_mem_eq(v, GOLDEN_VALUES, sizeof GOLDEN_VALUES);
    free(v);
    float dst[6] = {0};
    ck_assert_int_eq(npy_read_into(p, dst, 6, NULL, &err), PD_OK);
    ck_assert_mem_eq(dst, GOLDEN_VALUES, sizeof GOLDEN_VALUES);
}
END_TEST

START_TEST(npy_writer_emits_numpy_golden_bytes)
{
    uint8_t want[256];
    size_t n = golden(want, sizeof want);
    char p[512];
    path_in(p, sizeof p, "w.npy");
    pd_err err = {0};
    ck_assert_int_eq(npy_write_f32(p, 2, 3, GOLDEN_VALUES, &err), PD_OK);
    uint8_t got[512];
    FILE *f = fopen(p, "rb");
    ck_assert_ptr_nonnull(f);
    size_t m = fread(got, 1, sizeof got, f);
    fclose(f);
    ck_assert_uint_eq(m, n);
    ck_assert_mem_eq(got, want, n);
}
END_TEST

START_TEST(npy_writer_replaces_atomically_and_leaves_no_temp)
{
    char p[512];
    path_in(p, sizeof p, "a.npy");
    pd_err err = {0};
    float big[40 * 7];
    pd_rng r = {.s = 11};
    pd_rng_fill(&r, big, 40 * 7, -3, 3);
    ck_assert_int_eq(npy_write_f32(p, 2, 3, GOLDEN_VALUES, &err), PD_OK);
    ck_assert_int_eq(npy_write_f32(p, 40, 7, big, &err), PD_OK);
    npy_info info;
    float *v = NULL;
    ck_assert_int_eq(npy_load(p, &info, &v, &err), PD_OK);
    ck_assert_uint_eq(info.rows, 40);
    ck_assert_uint_eq(info.cols, 7);
    ck_assert_mem_eq(v, big, sizeof big);
    free(v);
    DIR *d = opendir(pd_tmpdir);
    ck_assert_ptr_nonnull(d);
    int files = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (e->d_name[0] != '.') {
            files++;
            ck_assert_msg(strstr(e->d_name, ".tmp") == NULL, "left %s", e->d_name);
        }
    closedir(d);
    ck_assert_int_eq(files, 1);
}
END_TEST

START_TEST(npy_version2_and_version3_headers_accepted)
{
    for (int major = 2; major <= 3; major++) {
        uint8_t b[256];
        size_t n = build(b, sizeof b, major, GOLDEN_DICT, 64, GOLDEN_VALUES, sizeof GOLDEN_VALUES);
        npy_info info;
        pd_err err = {0};
        ck_assert_int_eq(npy_parse_header(b, n, n, "v.npy", &info, &err), PD_OK);
        ck_assert_uint_eq(info.major, major);
        ck_assert_uint_eq(info.data_offset, 128);
        ck_assert_uint_eq(info.header_len, 116);
        char p[512];
        path_in(p, sizeof p, "v.npy");
        write_file(p, b, n);
        float dst[6];
        ck_assert_int_eq(npy_read_into(p, dst, 6, &info, &err), PD_OK);
        ck_assert_mem_eq(dst, GOLDEN_VALUES, sizeof dst);
    }
}
END_TEST

START_TEST(npy_truncation_at_every_offset_refused)
{
    uint8_t b[256];
    size_t n = golden(b, sizeof b);
    char p[512];
    path_in(p, sizeof p, "t.npy");
    for (size_t k = 0; k < n; k++) {
        npy_info info = {.rows = 77};
        pd_err err = {0};
        pd_status st = npy_parse_header(b, k, k, "t.npy", &info, &err);
        ck_assert_msg(st == PD_ERR_TRUNCATED, "k=%zu: %d %s", k, st, err.msg);
        ck_assert_uint_eq(info.rows, 77); /* untouched */
        write_file(p, b, k);
        pd_err_clear(&err);
        st = npy_probe(p, &info, &err);
        ck_assert_msg(st == PD_ERR_TRUNCATED, "file k=%zu: %d %s", k, st, err.msg);
        ck_assert_ptr_nonnull(strstr(err.msg, "t.npy"));
    }
    /* The whole-file buffer must also be whole: a short buffer over a long file. */
    npy_info info;
    pd_err err = {0};
    ck_assert_int_eq(npy_parse_header(b, 60, n, "t.npy", &info, &err), PD_ERR_TRUNCATED);
}
END_TEST

START_TEST(npy_trailing_bytes_refused)
{
    uint8_t b[256];
    size_t n = golden(b, sizeof b);
    b[n] = 0;
    npy_info info;
    pd_err err = {0};
    ck_assert_int_eq(npy_parse_header(b, n + 1, n + 1, "x.npy", &info, &err), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "trailing"));
    ck_assert_ptr_nonnull(strstr(err.msg, "offset 152"));
}
END_TEST

START_TEST(npy_header_length_beyond_file_names_offset_8)
{
    uint8_t b[512];
    memset(b, ' ', sizeof b);
    memcpy(b, "\x93NUMPY\x02\x00", 8);
    uint32_t h = 70000;
    b[8] = (uint8_t)h;
    b[9] = (uint8_t)(h >> 8);
    b[10] = (uint8_t)(h >> 16);
    b[11] = 0;
    npy_info info;
    pd_err err = {0};
    ck_assert_int_eq(npy_parse_header(b, 500, 500, "p3.npy", &info, &err), PD_ERR_TRUNCATED);
    ck_assert_str_eq(err.msg, "npy: p3.npy: offset 8: header length 70000 exceeds file size 500");
}
END_TEST

START_TEST(npy_bad_magic_and_versions_refused)
{
    uint8_t b[256];
    size_t n = golden(b, sizeof b);
    npy_info info;
    pd_err err = {0};
    b[1] = 'n';
    ck_assert_int_eq(npy_parse_header(b, n, n, "m.npy", &info, &err), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "offset 1"));
    b[1] = 'N';
    const uint8_t bad[][2] = {{0, 0}, {4, 0}, {1, 1}, {2, 1}, {255, 0}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        b[6] = bad[i][0];
        b[7] = bad[i][1];
        pd_err_clear(&err);
        ck_assert_int_eq(npy_parse_header(b, n, n, "m.npy", &info, &err), PD_ERR_VERSION);
        ck_assert_ptr_nonnull(strstr(err.msg, "version"));
    }
}
END_TEST

/* Builds a v1 file around dict with data for rows x cols and parses it. */
static pd_status parse_dict(const char *dict, size_t data_len, pd_err *err, npy_info *info)
{
    static uint8_t b[4096];
    static const uint8_t zeros[1024];
    ck_assert_uint_le(data_len, sizeof zeros);
    size_t n = build(b, sizeof b, 1, dict, 64, zeros, data_len);
    pd_err_clear(err);
    return npy_parse_header(b, n, n, "h.npy", info, err);
}

START_TEST(npy_other_dtypes_refused_by_name)
{
    const char *dt[] = {"<f8", ">f4", "<f2", "<i4", "|u1", "|b1", "=f4", "f4", "<c8"};
    for (size_t i = 0; i < sizeof dt / sizeof dt[0]; i++) {
        char dict[128];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (2, 3), }",
                 dt[i]);
        pd_err err;
        npy_info info;
        ck_assert_int_eq(parse_dict(dict, 24, &err, &info), PD_ERR_UNSUPPORTED);
        char want[32];
        snprintf(want, sizeof want, "dtype '%s'", dt[i]);
        ck_assert_msg(strstr(err.msg, want), "%s", err.msg);
    }
    pd_err err;
    npy_info info;
    ck_assert_int_eq(parse_dict("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (2,), }",
                                8, &err, &info),
                     PD_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "structured"));
}
END_TEST

START_TEST(npy_fortran_order_and_non_2d_shapes_refused)
{
    pd_err err;
    npy_info info;
    ck_assert_int_eq(parse_dict("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }", 24,
                                &err, &info),
                     PD_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "fortran_order"));
    ck_assert_int_eq(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", 24,
                                &err, &info),
                     PD_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "1 dimension;"));
    ck_assert_int_eq(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1, 2, 3), }",
                                24, &err, &info),
                     PD_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "3 dimensions"));
    ck_assert_int_eq(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4, &err,
                                &info),
                     PD_ERR_UNSUPPORTED);
}
END_TEST

START_TEST(npy_malformed_headers_refused_with_offset)
{
    /* Each is malformed at the byte where `at` begins (offsets from the header start at 10). */
    struct {
        const char *dict, *at, *msg;
    } cases[] = {
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'x': 1}", "'x'", "unknown key"},
        {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}", "'descr': '<f4', 'f",
         "twice"},
        {"{'descr': '<f4', 'shape': (2, 3)}", NULL, "missing key fortran_order"},
        {"{'descr': '<f4' 'fortran_order': False, 'shape': (2, 3)}", "'fortran_order'", "expected ','"},
        {"{'descr': '<f4', 'fortran_order': 0, 'shape': (2, 3)}", "0,", "True or False"},
        {"{'descr': '<f4', 'fortran_order': false, 'shape': (2, 3)}", "false", "True or False"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, -3)}", "-3", "signed"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 03)}", "03", "leading zeros"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3L)}", "L)", "plain decimal"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 1_0)}", "_0", "plain decimal"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (6)}", ")}", "not a tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': [2, 3]}", "[2", "tuple"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2 3)}", "3)", "expected ',' or ')'"},
        {"{'descr': '<f\\4', 'fortran_order': False, 'shape': (2, 3)}", "\\4", "escape"},
        {"{'descr': '<f4, 'fortran_order': False, 'shape': (2, 3)}", "fortran_order': F", "expected ','"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)} x", "x", "after the dict"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)", NULL, "expected ',' or '}'"},
        {"['descr', '<f4']", "['", "expected a dict"},
        {"{descr: '<f4', 'fortran_order': False, 'shape': (2, 3)}", "descr:", "quoted string"},
        {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 99999999999999999999)}", "9999",
         "overflows"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        pd_err err;
        npy_info info = {.rows = 5};
        pd_status st = parse_dict(cases[i].dict, 0, &err, &info);
        ck_assert_msg(st == PD_ERR_FORMAT, "case %zu: %d %s", i, st, err.msg);
        ck_assert_msg(strstr(err.msg, cases[i].msg), "case %zu: %s", i, err.msg);
        ck_assert_uint_eq(info.rows, 5);
        if (cases[i].at) {
            char want[48];
            snprintf(want, sizeof want, "offset %zu:",
                     10 + (size_t)(strstr(cases[i].dict, cases[i].at) - cases[i].dict));
            ck_assert_msg(strstr(err.msg, want), "case %zu: want %s in %s", i, want, err.msg);
        }
    }
}
END_TEST

START_TEST(npy_python_literal_variants_accepted)
{
    const char *ok[] = {
        "{\"descr\": \"<f4\", \"fortran_order\": False, \"shape\": (2, 3)}",
        "{'shape':(2,3),'fortran_order':False,'descr':'<f4'}",
        "{ 'descr' : '<f4' ,\n\t'fortran_order' : False ,\n 'shape' : ( 2 , 3 , ) , }",
        "  {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3)}  \r\n",
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        pd_err err;
        npy_info info;
        ck_assert_msg(parse_dict(ok[i], 24, &err, &info) == PD_OK, "case %zu: %s", i, err.msg);
        ck_assert_uint_eq(info.rows, 2);
        ck_assert_uint_eq(info.cols, 3);
    }
    /* No padding at all is fine too (NumPy does not require alignment on read). */
    uint8_t b[256];
    size_t n = build(b, sizeof b, 1, GOLDEN_DICT, 0, GOLDEN_VALUES, 24);
    pd_err err = {0};
    npy_info info;
    ck_assert_int_eq(npy_parse_header(b, n, n, "np.npy", &info, &err), PD_OK);
    ck_assert_uint_eq(info.data_offset, 10 + strlen(GOLDEN_DICT) + 1);
}
END_TEST

START_TEST(npy_size_overflow_refused)
{
    pd_err err;
    npy_info info;
    ck_assert_int_eq(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': "
                                "(4294967296, 4294967296), }", 0, &err, &info),
                     PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "overflows"));
    ck_assert_int_eq(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': "
                                "(4611686018427387904, 1), }", 0, &err, &info),
                     PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "too large"));
    ck_assert_int_eq(parse_dict("{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 1000), }",
                                24, &err, &info),
                     PD_ERR_TRUNCATED);
    ck_assert_ptr_nonnull(strstr(err.msg, "needs 4000000 data bytes"));
}
END_TEST

START_TEST(npy_zero_rows_is_a_valid_file)
{
    char p[512];
    path_in(p, sizeof p, "z.npy");
    pd_err err = {0};
    ck_assert_int_eq(npy_write_f32(p, 0, 5, NULL, &err), PD_OK);
    npy_info info;
    float *v = (float *)&info; /* must be replaced by NULL */
    ck_assert_int_eq(npy_load(p, &info, &v, &err), PD_OK);
    ck_assert_ptr_null(v);
    ck_assert_uint_eq(info.rows, 0);
    ck_assert_uint_eq(info.cols, 5);
}
END_TEST

START_TEST(npy_read_rows_reads_a_range_and_refuses_a_changed_file)
{
    char p[512];
    path_in(p, sizeof p, "r.npy");
    float data[10 * 4];
    for (int i = 0; i < 40; i++)
        data[i] = (float)i * 0.5f;
    pd_err err = {0};
    ck_assert_int_eq(npy_write_f32(p, 10, 4, data, &err), PD_OK);
    npy_info info;
    ck_assert_int_eq(npy_probe(p, &info, &err), PD_OK);
    float dst[3 * 4];
    ck_assert_int_eq(npy_read_rows(p, &info, 6, 3, dst, &err), PD_OK);
    ck_assert_mem_eq(dst, data + 24, sizeof dst);
    ck_assert_int_eq(npy_read_rows(p, &info, 8, 3, dst, &err), PD_ERR_RANGE);
    pd_err_clear(&err);
    ck_assert_int_eq(npy_write_f32(p, 8, 5, data, &err), PD_OK);
    ck_assert_int_eq(npy_read_rows(p, &info, 0, 1, dst, &err), PD_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(err.msg, "changed"));
    pd_err_clear(&err);
    ck_assert_int_eq(npy_read_into(p, dst, 12, NULL, &err), PD_ERR_RANGE);
    pd_err_clear(&err);
    char missing[512];
    path_in(missing, sizeof missing, "nope.npy");
    ck_assert_int_eq(npy_probe(missing, &info, &err), PD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "nope.npy"));
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("npy");
    TCase *tc = tcase_create("npy");
    tcase_add_checked_fixture(tc, pd_test_dir_setup, pd_test_dir_teardown);
    tcase_add_test(tc, npy_golden_v1_bytes_parse_and_read);
    tcase_add_test(tc, npy_writer_emits_numpy_golden_bytes);
    tcase_add_test(tc, npy_writer_replaces_atomically_and_leaves_no_temp);
    tcase_add_test(tc, npy_version2_and_version3_headers_accepted);
    tcase_add_test(tc, npy_truncation_at_every_offset_refused);
    tcase_add_test(tc, npy_trailing_bytes_refused);
    tcase_add_test(tc, npy_header_length_beyond_file_names_offset_8);
    tcase_add_test(tc, npy_bad_magic_and_versions_refused);
    tcase_add_test(tc, npy_other_dtypes_refused_by_name);
    tcase_add_test(tc, npy_fortran_order_and_non_2d_shapes_refused);
    tcase_add_test(tc, npy_malformed_headers_refused_with_offset);
    tcase_add_test(tc, npy_python_literal_variants_accepted);
    tcase_add_test(tc, npy_size_overflow_refused);
    tcase_add_test(tc, npy_zero_rows_is_a_valid_file);
    tcase_add_test(tc, npy_read_rows_reads_a_range_and_refuses_a_changed_file);
    suite_add_tcase(s, tc);
    return s;
}
