/* Tests for cluster/format/outfile.h: exact line format and escaping, resume that
 * skips finished ids, the partial last line cut at every offset, corrupt
 * complete lines refused without touching the file, the run lock. */
#define _XOPEN_SOURCE 700
#include <cjson/cJSON.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/resource.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/format/outfile.h"
#include "pd_test.h"

static char path[512];

static void setup_dir(void)
{
    pd_test_dir_setup();
    snprintf(path, sizeof path, "%s/out.jsonl", pd_tmpdir);
}

static void put(const char *text, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(text, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

/* The whole file; *n its length. Caller frees. */
static char *slurp(size_t *n)
{
    FILE *f = fopen(path, "rb");
    ck_assert_ptr_nonnull(f);
    char *b = malloc(1 << 16);
    *n = fread(b, 1, (1 << 16) - 1, f);
    b[*n] = '\0';
    fclose(f);
    return b;
}

static outfile *open_ok(void)
{
    outfile *o = NULL;
    pd_err err = {0};
    ck_assert_msg(outfile_open(path, &o, &err) == PD_OK, "%s", err.msg);
    outfile_check(o);
    return o;
}

static void write_ok(outfile *o, const char *id, const int32_t *tok, size_t n, const char *text,
                     outfile_stop stop)
{
    outfile_page pg = {.id = id,
                       .tokens = tok,
                       .n_tokens = n,
                       .text = text,
                       .text_len = strlen(text),
                       .prefill_rows = 273,
                       .generated = n,
                       .stop = stop};
    pd_err err = {0};
    ck_assert_msg(outfile_write_page(o, &pg, &err) == PD_OK, "%s", err.msg);
    outfile_check(o);
}

static const int32_t TOK[3] = {12, 99, 2};
#define LINE_P1 "{\"id\":\"p1\",\"tokens\":[12,99,2],\"text\":\"Hello\",\"prefill_rows\":273,\"generated\":3,\"stop\":\"eos\"}\n"
#define LINE_P2 "{\"id\":\"p2\",\"tokens\":[12],\"text\":\"\",\"prefill_rows\":273,\"generated\":1,\"stop\":\"length\"}\n"

START_TEST(outfile_writes_one_exact_json_line_per_page)
{
    outfile *o = open_ok();
    ck_assert_uint_eq(outfile_count(o), 0);
    write_ok(o, "p1", TOK, 3, "Hello", OUTFILE_STOP_EOS);
    write_ok(o, "p2", TOK, 1, "", OUTFILE_STOP_LENGTH);
    ck_assert_uint_eq(outfile_count(o), 2);
    size_t n;
    char *b = slurp(&n);
    ck_assert_str_eq(b, LINE_P1 LINE_P2);
    free(b);
    outfile_free(o);
    outfile_free(NULL);
}
END_TEST

START_TEST(outfile_writes_the_digest_last_as_16_hex_digits)
{
    outfile *o = open_ok();
    outfile_page pg = {.id = "d", .text = "", .prefill_rows = 5, .stop = OUTFILE_STOP_EOS,
                       .has_digest = true, .digest = 0x00ab00cd00ef0012ull};
    pd_err err = {0};
    ck_assert_int_eq(outfile_write_page(o, &pg, &err), PD_OK);
    pg = (outfile_page){.id = "z", .text = "", .stop = OUTFILE_STOP_LENGTH, .has_digest = true, .digest = 0};
    ck_assert_int_eq(outfile_write_page(o, &pg, &err), PD_OK);
    size_t n;
    char *b = slurp(&n);
    ck_assert_str_eq(b, "{\"id\":\"d\",\"tokens\":[],\"text\":\"\",\"prefill_rows\":5,\"generated\":0,"
                        "\"stop\":\"eos\",\"digest\":\"00ab00cd00ef0012\"}\n"
                        "{\"id\":\"z\",\"tokens\":[],\"text\":\"\",\"prefill_rows\":0,\"generated\":0,"
                        "\"stop\":\"length\",\"digest\":\"0000000000000000\"}\n");
    free(b);
    outfile_free(o);
}
END_TEST

START_TEST(outfile_error_lines_are_not_done_and_a_rerun_retries_them)
{
    outfile *o = open_ok();
    outfile_page bad = {.id = "p\"1", .error = "pages.jsonl:2: page \"p1\": p1.npy changed\n"};
    pd_err err = {0};
    ck_assert_int_eq(outfile_write_page(o, &bad, &err), PD_OK);
    ck_assert(!outfile_has(o, "p\"1"));
    ck_assert_uint_eq(outfile_error_lines(o), 1);
    outfile_check(o);
    outfile_free(o);
    size_t n;
    char *b = slurp(&n);
    ck_assert_str_eq(b, "{\"id\":\"p\\\"1\",\"error\":\"pages.jsonl:2: page \\\"p1\\\": p1.npy changed\\n\"}\n");
    free(b);
    /* reopened: the failed id is not done; its retry is appended after it */
    o = open_ok();
    ck_assert(!outfile_has(o, "p\"1"));
    ck_assert_uint_eq(outfile_error_lines(o), 1);
    write_ok(o, "p\"1", NULL, 0, "ok", OUTFILE_STOP_EOS);
    ck_assert(outfile_has(o, "p\"1"));
    /* once done, neither a success nor an error line may follow */
    pd_err_clear(&err);
    ck_assert_int_eq(outfile_write_page(o, &bad, &err), PD_ERR_REFUSED);
    outfile_check(o);
    outfile_free(o);
    o = open_ok();
    ck_assert(outfile_has(o, "p\"1"));
    ck_assert_uint_eq(outfile_count(o), 1);
    outfile_free(o);
}
END_TEST

START_TEST(outfile_reports_the_real_error_of_a_short_write_and_cuts_it)
{
    /* a file size limit makes the kernel write what fits and then refuse:
     * the same shape as a full disk. The error must say why (EFBIG here,
     * ENOSPC on a full disk), not "Input/output error", and no partial line
     * may stay behind. (Check forks each test: the limit ends with it.) */
    outfile *o = open_ok();
    write_ok(o, "first", NULL, 0, "ok", OUTFILE_STOP_EOS);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit rl = {.rlim_cur = (rlim_t)sb.st_size + 20, .rlim_max = RLIM_INFINITY};
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    static char text[400];
    memset(text, 'x', sizeof text - 1);
    outfile_page pg = {.id = "second", .text = text, .text_len = sizeof text - 1, .stop = OUTFILE_STOP_EOS};
    pd_err err = {0};
    ck_assert_int_eq(outfile_write_page(o, &pg, &err), PD_ERR_IO);
    ck_assert_msg(strstr(err.msg, strerror(EFBIG)) != NULL, "%s", err.msg);
    ck_assert(!outfile_has(o, "second"));
    struct stat sa;
    ck_assert_int_eq(stat(path, &sa), 0);
    ck_assert_int_eq(sa.st_size, sb.st_size);
    outfile_check(o);
    outfile_free(o);
}
END_TEST

START_TEST(outfile_escapes_strings_and_repairs_utf8)
{
    outfile *o = open_ok();
    static const char text[] = "a\"b\\c\nd\te\x01\x7f\xc3\xa9\xf0\x9f\x98\x80\xff!";
    outfile_page pg = {.id = "q\"\\\n\xe2\x82\xac",
                       .tokens = NULL,
                       .n_tokens = 0,
                       .text = "x\0y",
                       .text_len = 3,
                       .prefill_rows = 0,
                       .generated = 0,
                       .stop = OUTFILE_STOP_LENGTH};
    pd_err err = {0};
    ck_assert_int_eq(outfile_write_page(o, &pg, &err), PD_OK);
    write_ok(o, "t", TOK, 0, text, OUTFILE_STOP_EOS);
    size_t n;
    char *b = slurp(&n);
    ck_assert_str_eq(b, "{\"id\":\"q\\\"\\\\\\n\xe2\x82\xac\",\"tokens\":[],\"text\":\"x\\u0000y\","
                        "\"prefill_rows\":0,\"generated\":0,\"stop\":\"length\"}\n"
                        "{\"id\":\"t\",\"tokens\":[],\"text\":\"a\\\"b\\\\c\\nd\\te\\u0001\x7f"
                        "\xc3\xa9\xf0\x9f\x98\x80\xef\xbf\xbd!\",\"prefill_rows\":273,"
                        "\"generated\":0,\"stop\":\"eos\"}\n");
    /* Both lines are JSON that reads back to the (repaired) strings. */
    char *nl = strchr(b, '\n');
    cJSON *j = cJSON_ParseWithLength(nl + 1, strlen(nl + 1));
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "text")->valuestring,
                     "a\"b\\c\nd\te\x01\x7f\xc3\xa9\xf0\x9f\x98\x80\xef\xbf\xbd!");
    cJSON_Delete(j);
    free(b);
    outfile_free(o);
    /* The escaped id reads back as itself on a rerun. */
    o = open_ok();
    ck_assert(outfile_has(o, "q\"\\\n\xe2\x82\xac"));
    /* An id that is not UTF-8 could not be found again: refused. */
    outfile_page bad = {.id = "r\xe2\x82", .text = "", .stop = OUTFILE_STOP_EOS};
    pd_err_clear(&err);
    ck_assert_int_eq(outfile_write_page(o, &bad, &err), PD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "not valid UTF-8 (byte 1)"));
    outfile_check(o);
    outfile_free(o);
}
END_TEST

START_TEST(outfile_resume_skips_finished_ids_and_refuses_duplicates)
{
    outfile *o = open_ok();
    write_ok(o, "p1", TOK, 3, "Hello", OUTFILE_STOP_EOS);
    write_ok(o, "p2", TOK, 1, "", OUTFILE_STOP_LENGTH);
    outfile_free(o);
    o = open_ok();
    ck_assert_uint_eq(outfile_count(o), 2);
    ck_assert(outfile_has(o, "p1") && outfile_has(o, "p2"));
    ck_assert(!outfile_has(o, "p3") && !outfile_has(o, "p"));
    ck_assert_uint_eq(outfile_cut_bytes(o), 0);
    outfile_page again = {.id = "p1", .text = "", .stop = OUTFILE_STOP_EOS};
    pd_err err = {0};
    ck_assert_int_eq(outfile_write_page(o, &again, &err), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(err.msg, "page \"p1\" is already written"));
    write_ok(o, "p3", TOK, 2, "x", OUTFILE_STOP_EOS);
    outfile_free(o);
    size_t n;
    char *b = slurp(&n);
    ck_assert_str_eq(b, LINE_P1 LINE_P2 "{\"id\":\"p3\",\"tokens\":[12,99],\"text\":\"x\","
                        "\"prefill_rows\":273,\"generated\":2,\"stop\":\"eos\"}\n");
    free(b);
}
END_TEST

START_TEST(outfile_partial_last_line_is_cut_at_every_offset)
{
    static const char full[] = LINE_P1 LINE_P2;
    size_t l1 = strlen(LINE_P1), total = strlen(full);
    /* A kill anywhere inside the second line's write: bytes [0, l1 + k). */
    for (size_t k = 0; k < total - l1; k++) {
        put(full, l1 + k);
        outfile *o = open_ok();
        ck_assert_uint_eq(outfile_count(o), 1);
        ck_assert(outfile_has(o, "p1"));
        ck_assert(!outfile_has(o, "p2"));
        ck_assert_uint_eq(outfile_cut_bytes(o), k);
        write_ok(o, "p2", TOK, 1, "", OUTFILE_STOP_LENGTH);
        outfile_free(o);
        size_t n;
        char *b = slurp(&n);
        ck_assert_msg(!strcmp(b, full), "k=%zu: %s", k, b);
        free(b);
    }
    /* A complete JSON object without its '\n' is still a partial line. */
    put(full, total - 1);
    outfile *o = open_ok();
    ck_assert(!outfile_has(o, "p2"));
    ck_assert_uint_eq(outfile_cut_bytes(o), total - 1 - l1);
    outfile_free(o);
}
END_TEST

START_TEST(outfile_blank_lines_are_ignored)
{
    put("\n" LINE_P1 "  \n\r\n" LINE_P2, strlen("\n" LINE_P1 "  \n\r\n" LINE_P2));
    outfile *o = open_ok();
    ck_assert_uint_eq(outfile_count(o), 2);
    ck_assert(outfile_has(o, "p2"));
    outfile_free(o);
}
END_TEST

START_TEST(outfile_corrupt_complete_line_is_refused_without_modification)
{
    const struct {
        const char *line, *msg;
    } bad[] = {
        {"not json\n", ":2: not valid JSON; refusing to append"},
        {"{\"id\": \"p9\"} trailing\n", ":2: not valid JSON; refusing to append"},
        {"{\"name\": \"x\"}\n", ":2: not a JSON object with a string \"id\""},
        {"[1, 2]\n", ":2: not a JSON object with a string \"id\""},
        {"{\"id\": \"\"}\n", ":2: not a JSON object with a string \"id\""},
        {"{\"id\": 5}\n", ":2: not a JSON object with a string \"id\""},
        {"{\"id\": \"p9\", \n", ":2: not valid JSON; refusing to append"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        int n = snprintf(text, sizeof text, "%s%s%s", LINE_P1, bad[i].line, "{\"id\":\"p3\",\"tok");
        put(text, (size_t)n);
        struct stat before;
        ck_assert_int_eq(stat(path, &before), 0);
        outfile *o = (outfile *)text;
        pd_err err = {0};
        ck_assert_int_eq(outfile_open(path, &o, &err), PD_ERR_FORMAT);
        ck_assert_msg(strstr(err.msg, bad[i].msg), "case %zu: %s", i, err.msg);
        ck_assert_ptr_nonnull(strstr(err.msg, path));
        ck_assert_ptr_eq(o, (outfile *)text);
        size_t got;
        char *b = slurp(&got);
        ck_assert_uint_eq(got, (size_t)n);
        ck_assert_mem_eq(b, text, got);
        free(b);
        struct stat after;
        ck_assert_int_eq(stat(path, &after), 0);
        ck_assert(after.st_mtim.tv_sec == before.st_mtim.tv_sec &&
                  after.st_mtim.tv_nsec == before.st_mtim.tv_nsec);
    }
}
END_TEST

START_TEST(outfile_second_open_is_refused_while_locked)
{
    outfile *a = open_ok();
    outfile *b = NULL;
    pd_err err = {0};
    ck_assert_int_eq(outfile_open(path, &b, &err), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(err.msg, "in use by another run"));
    ck_assert_ptr_null(b);
    outfile_free(a);
    b = open_ok();
    outfile_free(b);
}
END_TEST

START_TEST(outfile_write_refuses_bad_fields_without_writing)
{
    outfile *o = open_ok();
    pd_err err = {0};
    outfile_page noid = {.id = "", .text = "", .stop = OUTFILE_STOP_EOS};
    ck_assert_int_eq(outfile_write_page(o, &noid, &err), PD_ERR_ARG);
    pd_err_clear(&err);
    outfile_page badstop = {.id = "x", .text = "", .stop = OUTFILE_STOP_COUNT};
    ck_assert_int_eq(outfile_write_page(o, &badstop, &err), PD_ERR_ARG);
    pd_err_clear(&err);
    outfile_page notok = {.id = "x", .n_tokens = 2, .text = "", .stop = OUTFILE_STOP_EOS};
    ck_assert_int_eq(outfile_write_page(o, &notok, &err), PD_ERR_ARG);
    ck_assert(!outfile_has(o, "x"));
    outfile_check(o);
    outfile_free(o);
    size_t n;
    char *b = slurp(&n);
    ck_assert_uint_eq(n, 0);
    free(b);
    pd_err_clear(&err);
    outfile *x = NULL;
    ck_assert_int_eq(outfile_open("/nonexistent-dir/out.jsonl", &x, &err), PD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "/nonexistent-dir/out.jsonl"));
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("outfile");
    TCase *tc = tcase_create("outfile");
    tcase_add_checked_fixture(tc, setup_dir, pd_test_dir_teardown);
    tcase_add_test(tc, outfile_writes_one_exact_json_line_per_page);
    tcase_add_test(tc, outfile_escapes_strings_and_repairs_utf8);
    tcase_add_test(tc, outfile_reports_the_real_error_of_a_short_write_and_cuts_it);
    tcase_add_test(tc, outfile_error_lines_are_not_done_and_a_rerun_retries_them);
    tcase_add_test(tc, outfile_writes_the_digest_last_as_16_hex_digits);
    tcase_add_test(tc, outfile_resume_skips_finished_ids_and_refuses_duplicates);
    tcase_add_test(tc, outfile_partial_last_line_is_cut_at_every_offset);
    tcase_add_test(tc, outfile_blank_lines_are_ignored);
    tcase_add_test(tc, outfile_corrupt_complete_line_is_refused_without_modification);
    tcase_add_test(tc, outfile_second_open_is_refused_while_locked);
    tcase_add_test(tc, outfile_write_refuses_bad_fields_without_writing);
    suite_add_tcase(s, tc);
    return s;
}
