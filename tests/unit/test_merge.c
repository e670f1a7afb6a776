/* Tests for cluster/format/merge.h: outputs joined in manifest order byte for
 * byte; an error line superseded by a later retry; a torn last line ignored;
 * missing, failed, duplicated and unknown ids each listed and failing the
 * merge without touching the final file; corrupt lines named by file:line;
 * refusing to overwrite an input. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/format/merge.h"
#include "pd_test.h"


static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *b = calloc(1, 1 << 20);
    size_t n = fread(b, 1, (1 << 20) - 1, f);
    b[n] = '\0';
    fclose(f);
    return b;
}

/* Runs a merge of the two outputs "o0.jsonl", "o1.jsonl" into "final.jsonl";
 * the log text (owned) in *log. */
static pd_status run_merge(merge_report *rep, pd_err *err, char **log)
{
    const char *outs[] = {"o0.jsonl", "o1.jsonl"};
    FILE *f = fopen("merge.log", "w+b");
    pd_err_clear(err);
    pd_status st = merge_outputs("pages.jsonl", outs, 2, "final.jsonl", f, rep, err);
    fclose(f);
    *log = slurp("merge.log");
    return st;
}

static void put_manifest(int n)
{
    FILE *f = fopen("pages.jsonl", "wb");
    for (int i = 0; i < n; i++)
        fprintf(f, "{\"id\":\"p%d\",\"prefill\":[{\"tokens\":[1]}],\"max_new_tokens\":1}\n", i);
    fclose(f);
}

START_TEST(merge_joins_outputs_in_manifest_order_byte_for_byte)
{
    put_manifest(4);
    /* p1 failed first and was retried in the same file; o1 ends in a torn line */
    put("o0.jsonl", "{\"id\":\"p2\",\"tokens\":[2],\"digest\":\"x\"}\n"
                    "{\"id\":\"p1\",\"error\":\"it broke\"}\n"
                    "\n"
                    "{\"id\":\"p1\",  \"tokens\":[1]}\n");
    put("o1.jsonl", "{\"id\":\"p3\",\"tokens\":[3]}\n{\"id\":\"p0\",\"tokens\":[0]}\n{\"id\":\"p9\",\"tok");
    merge_report rep;
    pd_err err;
    char *log = NULL;
    ck_assert_msg(run_merge(&rep, &err, &log) == PD_OK, "%s", err.msg);
    char *got = slurp("final.jsonl");
    ck_assert_str_eq(got, "{\"id\":\"p0\",\"tokens\":[0]}\n{\"id\":\"p1\",  \"tokens\":[1]}\n"
                          "{\"id\":\"p2\",\"tokens\":[2],\"digest\":\"x\"}\n{\"id\":\"p3\",\"tokens\":[3]}\n");
    ck_assert_uint_eq(rep.pages, 4);
    ck_assert_uint_eq(rep.written, 4);
    ck_assert_uint_eq(rep.torn, 1);
    ck_assert_uint_eq(rep.missing + rep.duplicated + rep.unknown, 0);
    ck_assert_ptr_nonnull(strstr(log, "o1.jsonl: a partial last line"));
    free(got);
    free(log);
}
END_TEST

START_TEST(merge_lists_missing_failed_duplicated_unknown_and_writes_nothing)
{
    put_manifest(5);
    put("final.jsonl", "earlier\n");
    put("o0.jsonl", "{\"id\":\"p0\",\"tokens\":[0]}\n{\"id\":\"p1\",\"error\":\"pages.jsonl:2: bad npy\"}\n"
                    "{\"id\":\"p3\",\"tokens\":[3]}\n");
    put("o1.jsonl", "{\"id\":\"zz\",\"tokens\":[9]}\n{\"id\":\"p3\",\"tokens\":[3]}\n");
    merge_report rep;
    pd_err err;
    char *log = NULL;
    ck_assert_int_eq(run_merge(&rep, &err, &log), PD_ERR_MISMATCH);
    ck_assert_str_eq(log, "unknown: zz (o1.jsonl:1)\n"
                          "failed: p1: o0.jsonl:2: pages.jsonl:2: bad npy\n"
                          "missing: p2\n"
                          "duplicated: p3 (o0.jsonl:3, o1.jsonl:2)\n"
                          "missing: p4\n");
    ck_assert_uint_eq(rep.missing, 3);
    ck_assert_uint_eq(rep.failed, 1);
    ck_assert_uint_eq(rep.duplicated, 1);
    ck_assert_uint_eq(rep.unknown, 1);
    ck_assert_uint_eq(rep.written, 0);
    ck_assert_str_eq(err.msg, "merge: 3 of 5 pages missing (1 of them failed), 1 duplicated, 1 unknown ids "
                              "in 2 outputs; final.jsonl not written");
    char *f = slurp("final.jsonl");
    ck_assert_str_eq(f, "earlier\n");
    free(f);
    free(log);
}
END_TEST

START_TEST(merge_caps_each_list_and_counts_the_rest)
{
    put_manifest((int)MERGE_LIST_MAX + 7);
    put("o0.jsonl", "");
    put("o1.jsonl", "");
    merge_report rep;
    pd_err err;
    char *log = NULL;
    ck_assert_int_eq(run_merge(&rep, &err, &log), PD_ERR_MISMATCH);
    ck_assert_uint_eq(rep.missing, MERGE_LIST_MAX + 7);
    ck_assert_ptr_nonnull(strstr(log, "missing: ... and 7 more\n"));
    free(log);
}
END_TEST

START_TEST(merge_names_a_corrupt_line_by_file_and_line)
{
    put_manifest(2);
    put("o0.jsonl", "{\"id\":\"p0\",\"tokens\":[0]}\n");
    put("o1.jsonl", "{\"id\":\"p1\",\"tokens\":[1]}\n[1, 2]\n");
    merge_report rep;
    pd_err err;
    char *log = NULL;
    ck_assert_int_eq(run_merge(&rep, &err, &log), PD_ERR_FORMAT);
    ck_assert_str_eq(err.msg, "merge: o1.jsonl:2: not a JSON object with a non-empty string \"id\" (an output line)");
    ck_assert_int_ne(access("final.jsonl", F_OK), 0);
    free(log);
    /* the manifest too; and a duplicate id in it */
    put("pages.jsonl", "{\"id\":\"p0\"}\n{\"id\":\"\"}\n");
    ck_assert_int_eq(run_merge(&rep, &err, &log), PD_ERR_FORMAT);
    ck_assert_str_eq(err.msg, "merge: pages.jsonl:2: not a JSON object with a non-empty string \"id\" (a page of "
                              "the manifest)");
    free(log);
    put("pages.jsonl", "{\"id\":\"p0\"}\n\n{\"id\":\"p0\"}");
    ck_assert_int_eq(run_merge(&rep, &err, &log), PD_ERR_FORMAT);
    ck_assert_str_eq(err.msg, "merge: pages.jsonl:3: page \"p0\": id: already used by the page on line 1");
    free(log);
}
END_TEST

START_TEST(merge_refuses_to_overwrite_an_input)
{
    put_manifest(1);
    put("o0.jsonl", "{\"id\":\"p0\",\"tokens\":[0]}\n");
    const char *outs[] = {"o0.jsonl"};
    pd_err err = {0};
    ck_assert_int_eq(merge_outputs("pages.jsonl", outs, 1, "./o0.jsonl", NULL, NULL, &err), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(err.msg, "would overwrite the output o0.jsonl"));
    pd_err_clear(&err);
    ck_assert_int_eq(merge_outputs("pages.jsonl", outs, 1, "pages.jsonl", NULL, NULL, &err), PD_ERR_REFUSED);
    char *o = slurp("o0.jsonl");
    ck_assert_str_eq(o, "{\"id\":\"p0\",\"tokens\":[0]}\n");
    free(o);
    /* no outputs at all, an empty manifest: an empty final file */
    put("pages.jsonl", "");
    pd_err_clear(&err);
    ck_assert_int_eq(merge_outputs("pages.jsonl", NULL, 0, "final.jsonl", NULL, NULL, &err), PD_OK);
    o = slurp("final.jsonl");
    ck_assert_str_eq(o, "");
    free(o);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("merge");
    TCase *tc = tcase_create("merge");
    tcase_add_checked_fixture(tc, pd_test_dir_setup_cd, pd_test_dir_teardown);
    tcase_add_test(tc, merge_joins_outputs_in_manifest_order_byte_for_byte);
    tcase_add_test(tc, merge_lists_missing_failed_duplicated_unknown_and_writes_nothing);
    tcase_add_test(tc, merge_caps_each_list_and_counts_the_rest);
    tcase_add_test(tc, merge_names_a_corrupt_line_by_file_and_line);
    tcase_add_test(tc, merge_refuses_to_overwrite_an_input);
    suite_add_tcase(s, tc);
    return s;
}
