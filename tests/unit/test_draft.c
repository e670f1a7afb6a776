/* Tests for cluster/runtime/spec/draft.h: the --draft parser (ngram and model
 * forms) and the n-gram
 * prompt lookup (latest earlier occurrence, at most K, nothing when the
 * suffix never occurred). */
#include "pd_test.h"

#include "cluster/runtime/spec/draft.h"

#include <stdio.h>
#include <string.h>

START_TEST(draft_parse_accepts_the_documented_forms_and_refuses_others)
{
    draft_config c;
    pd_err e = {0};
    ck_assert_int_eq(draft_parse("none", &c, &e), PD_OK);
    ck_assert_int_eq(c.mode, DRAFT_NONE);
    ck_assert_int_eq(draft_parse("ngram", &c, &e), PD_OK);
    ck_assert(c.mode == DRAFT_NGRAM && c.n == 3 && c.k == 4);
    ck_assert_int_eq(draft_parse("ngram:2", &c, &e), PD_OK);
    ck_assert(c.n == 2 && c.k == 4);
    ck_assert_int_eq(draft_parse("ngram:1:16", &c, &e), PD_OK);
    ck_assert(c.n == 1 && c.k == 16);
    /* model:FILE[:K]: K is the digits after the last colon, if any */
    ck_assert_int_eq(draft_parse("model:small.gguf", &c, &e), PD_OK);
    ck_assert(c.mode == DRAFT_MODEL && c.k == 4 && strcmp(c.path, "small.gguf") == 0);
    ck_assert_int_eq(draft_parse("model:/d/a:b.gguf:7", &c, &e), PD_OK);
    ck_assert(c.mode == DRAFT_MODEL && c.k == 7 && strcmp(c.path, "/d/a:b.gguf") == 0);
    /* one rule for K: empty, zero, too large or too long all get one message */
    static const char *bad_k[] = {"model:x.gguf:", "model:x.gguf:0", "model:x.gguf:17", "model:x.gguf:99999",
                                  "model:x.gguf:00004"};
    for (size_t i = 0; i < sizeof bad_k / sizeof bad_k[0]; i++) {
        pd_err_clear(&e);
        ck_assert_msg(draft_parse(bad_k[i], &c, &e) == PD_ERR_ARG, "'%s' accepted", bad_k[i]);
        char want[128];
        snprintf(want, sizeof want, "--draft '%s': K must be an integer 1..16 (model:FILE[:K])", bad_k[i]);
        ck_assert_str_eq(e.msg, want);
    }
    ck_assert_int_eq(draft_parse("model:x.gguf:k4", &c, &e), PD_OK); /* not digits: part of the name */
    ck_assert(c.k == 4 && strcmp(c.path, "x.gguf:k4") == 0);
    char long_name[1200] = "model:";
    memset(long_name + 6, 'a', 1100);
    long_name[1106] = '\0';
    const char *bad[] = {"", "ngram:", "ngram:0", "ngram:65", "ngram:3:0", "ngram:3:17", "ngram:3:4:5", "ngram:x",
                         "ngram:3:", "ngrams", "model", "ngram:99999", "model:", "model::4", "model:m.gguf:0",
                         "model:m.gguf:17", long_name};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pd_err_clear(&e);
        ck_assert_msg(draft_parse(bad[i], &c, &e) == PD_ERR_ARG, "'%s' accepted", bad[i]);
        ck_assert_msg(strstr(e.msg, "--draft") != NULL, "%s", e.msg);
    }
}
END_TEST

START_TEST(draft_ngram_proposes_what_followed_the_latest_occurrence)
{
    /* ... 5 6 7 8 ... 5 6 9 1 ... 5 6 : the latest "5 6" is followed by 9 1 */
    const uint32_t h[] = {5, 6, 7, 8, 2, 5, 6, 9, 1, 3, 5, 6};
    uint32_t out[8];
    ck_assert_uint_eq(draft_ngram(h, 12, 2, 4, out), 4);
    ck_assert(out[0] == 9 && out[1] == 1 && out[2] == 3 && out[3] == 5);
    ck_assert_uint_eq(draft_ngram(h, 12, 2, 2, out), 2); /* at most K */
    ck_assert(out[0] == 9 && out[1] == 1);
    ck_assert_uint_eq(draft_ngram(h, 12, 3, 4, out), 0); /* "3 5 6" never occurred before */
    ck_assert_uint_eq(draft_ngram(h, 2, 2, 4, out), 0);  /* too short to have an earlier occurrence */
    ck_assert_uint_eq(draft_ngram(h, 12, 0, 4, out), 0);
    /* an occurrence ending right before the suffix proposes the suffix's own start */
    const uint32_t loop[] = {4, 4, 4};
    ck_assert_uint_eq(draft_ngram(loop, 3, 1, 4, out), 1);
    ck_assert_uint_eq(out[0], 4);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("draft");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, draft_parse_accepts_the_documented_forms_and_refuses_others);
    tcase_add_test(tc, draft_ngram_proposes_what_followed_the_latest_occurrence);
    suite_add_tcase(s, tc);
    return s;
}
