/* Tests for cluster/cli/score.h: edit distance, per-page scoring of an output
 * file against the truth, and the refusals (missing, failed or malformed
 * pages, page counts that differ). */
#define _XOPEN_SOURCE 700
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster/cli/score.h"
#include "pd_test.h"

START_TEST(score_edit_distance_counts_insertions_deletions_substitutions)
{
    ck_assert_uint_eq(score_edit_distance("kitten", 6, "sitting", 7), 3);
    ck_assert_uint_eq(score_edit_distance("", 0, "abc", 3), 3);
    ck_assert_uint_eq(score_edit_distance("abc", 3, "", 0), 3);
    ck_assert_uint_eq(score_edit_distance("same\n", 5, "same\n", 5), 0);
    ck_assert_uint_eq(score_edit_distance("ab\ncd\n", 6, "abcd\n", 5), 1);
}
END_TEST

static char dir[64], pages_path[128], out_path[128];

static void put(const char *path, const char *s)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(s, f);
    fclose(f);
}

static void setup(void)
{
    pd_test_tmpdir(dir, sizeof dir, "score");
    snprintf(pages_path, sizeof pages_path, "%s/pages.jsonl", dir);
    snprintf(out_path, sizeof out_path, "%s/out.jsonl", dir);
    put(pages_path, "{\"id\":\"a\",\"prefill\":[]}\n\n{\"id\":\"b\",\"prefill\":[]}\n");
}

static void teardown(void)
{
    unlink(pages_path);
    unlink(out_path);
    rmdir(dir);
}

static const char *const truth[] = {"hello\n", "world\n"};
static const size_t truth_len[] = {6, 6};

START_TEST(score_run_scores_each_page_and_takes_the_last_line_of_an_id)
{
    put(out_path, "{\"id\":\"b\",\"error\":\"x\"}\n{\"id\":\"a\",\"text\":\"hallo\\n\"}\n"
                  "{\"id\":\"b\",\"text\":\"world\\n\"}\n{\"id\":\"zz\",\"text\":\"\"}\n");
    score_result *r = NULL;
    pd_err e = {0};
    ck_assert_msg(score_run(pages_path, out_path, truth, truth_len, 2, &r, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(score_count(r), 2);
    ck_assert_str_eq(score_get(r, 0)->id, "a");
    ck_assert_uint_eq(score_get(r, 0)->edits, 1);
    ck_assert_uint_eq(score_get(r, 0)->ref_chars, 6);
    ck_assert_uint_eq(score_get(r, 1)->edits, 0);
    ck_assert_ptr_null(score_get(r, 2));
    score_free(r);
    score_free(NULL);
}
END_TEST

static void refused(const char *out, size_t n_truth, const char *needle)
{
    put(out_path, out);
    score_result *r = (score_result *)0x1;
    pd_err e = {0};
    ck_assert_int_ne(score_run(pages_path, out_path, truth, truth_len, n_truth, &r, &e), PD_OK);
    ck_assert_ptr_eq(r, (score_result *)0x1);
    ck_assert_msg(strstr(e.msg, needle), "'%s' lacks '%s'", e.msg, needle);
}

START_TEST(score_run_refuses_missing_failed_and_malformed_pages)
{
    refused("{\"id\":\"a\",\"text\":\"hello\\n\"}\n", 2, "page \"b\" has no line");
    refused("{\"id\":\"a\",\"text\":\"x\"}\n{\"id\":\"b\",\"error\":\"disk gone\"}\n", 2, "page \"b\" failed: disk gone");
    refused("{\"id\":\"a\",\"text\":\"x\"}\n{\"id\":\"b\",\"text\":7}\n", 2, "no string \"text\"");
    refused("{\"id\":\"a\",\"text\":\"x\"}\nnot json\n", 2, "out.jsonl:2: not a JSON object");
    refused("{\"id\":\"a\",\"text\":\"x\"}\n", 3, "holds 2 pages, the truth text 3");
    put(pages_path, "{\"id\":\"a\"}\n[1]\n");
    refused("", 2, "pages.jsonl:2: not a JSON object");
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("score");
    TCase *tc = tcase_create("score");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, score_edit_distance_counts_insertions_deletions_substitutions);
    tcase_add_test(tc, score_run_scores_each_page_and_takes_the_last_line_of_an_id);
    tcase_add_test(tc, score_run_refuses_missing_failed_and_malformed_pages);
    suite_add_tcase(s, tc);
    return s;
}
