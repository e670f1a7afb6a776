/* Tests for cluster/format/render.h: the font, page splitting and its
 * refusals, the exact and deterministic projection, the manifest writer. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/format/npy.h"
#include "cluster/format/render.h"
#include "pd_test.h"

#define RENDER_TEST_GOLDEN 0xd40e545dc9799383ull

static render_doc *parse_ok(const char *s)
{
    render_doc *d = NULL;
    pd_err e = {0};
    ck_assert_msg(render_doc_parse(s, strlen(s), &d, &e) == PD_OK, "%s", e.msg);
    return d;
}

static void parse_fails(const char *s, size_t len, const char *needle)
{
    render_doc *d = (render_doc *)0x1;
    pd_err e = {0};
    ck_assert_int_ne(render_doc_parse(s, len, &d, &e), PD_OK);
    ck_assert_ptr_eq(d, (render_doc *)0x1); /* untouched */
    ck_assert_msg(strstr(e.msg, needle), "'%s' lacks '%s'", e.msg, needle);
}

START_TEST(render_glyphs_are_distinct_and_space_is_blank)
{
    for (int a = 32; a <= 126; a++) {
        ck_assert_ptr_nonnull(render_glyph(a));
        for (int b = a + 1; b <= 126; b++)
            ck_assert_msg(memcmp(render_glyph(a), render_glyph(b), 5) != 0, "'%c' and '%c' look alike", a, b);
        for (int c = 0; c < 5; c++)
            ck_assert_uint_lt(render_glyph(a)[c], 0x80); /* 7 rows */
    }
    static const uint8_t blank[5];
    ck_assert_mem_eq(render_glyph(' '), blank, 5);
    ck_assert_ptr_null(render_glyph(31));
    ck_assert_ptr_null(render_glyph(127));
    ck_assert_ptr_null(render_glyph('\n'));
}
END_TEST

START_TEST(render_pages_split_at_form_feeds_with_a_final_newline)
{
    render_doc *d = parse_ok("ab\ncd\n\fxyz\f");
    ck_assert_uint_eq(render_doc_pages(d), 2);
    size_t len;
    ck_assert_str_eq(render_page_truth(d, 0, &len), "ab\ncd\n");
    ck_assert_uint_eq(len, 6);
    ck_assert_str_eq(render_page_truth(d, 1, &len), "xyz\n"); /* the missing '\n' added */
    ck_assert_uint_eq(render_page_cells(d, 0), 6);
    ck_assert_uint_eq(render_page_cells(d, 1), 4);
    render_doc_free(d);
    d = parse_ok("a\f\n"); /* a trailing "\f\n" is not a page */
    ck_assert_uint_eq(render_doc_pages(d), 1);
    render_doc_free(d);
    d = parse_ok("\n\n"); /* two empty lines: one page of two cells */
    ck_assert_uint_eq(render_page_cells(d, 0), 2);
    render_doc_free(d);
    render_doc_free(NULL);
}
END_TEST

START_TEST(render_refuses_bad_text_naming_page_line_and_column)
{
    parse_fails("ok\n\fab\n\tc\n", 11, "page 2, line 2, column 1: byte 0x09");
    parse_fails("a\r\n", 3, "byte 0x0d");
    parse_fails("caf\xc3\xa9\n", 6, "page 1, line 1, column 4: byte 0xc3");
    parse_fails("x\0y\n", 4, "byte 0x00");
    parse_fails("", 0, "page 1 is empty");
    parse_fails("a\f\fb", 4, "page 2 is empty");
    char line[RENDER_MAX_COLS + 3];
    memset(line, 'x', RENDER_MAX_COLS + 1);
    line[RENDER_MAX_COLS + 1] = '\n';
    line[RENDER_MAX_COLS + 2] = 0;
    parse_fails(line, strlen(line), "longer than");
    char many[2 * RENDER_MAX_LINES + 8];
    size_t n = 0;
    for (int i = 0; i <= RENDER_MAX_LINES; i++) {
        many[n++] = 'a';
        many[n++] = '\n';
    }
    parse_fails(many, n, "more than 64 lines");
    line[RENDER_MAX_COLS] = '\n';
    line[RENDER_MAX_COLS + 1] = 0;
    render_doc_free(parse_ok(line)); /* exactly the limit is fine */
}
END_TEST

START_TEST(render_features_follow_the_documented_layout)
{
    render_doc *d = parse_ok("Hi\n\nZ\n");
    float f[RENDER_FEATURES];
    render_cell_features(d, 0, 1, f); /* 'i' at line 0, column 1 */
    for (int r = 0; r < 7; r++)
        for (int c = 0; c < 5; c++)
            ck_assert_float_eq(f[5 * r + c], (render_glyph('i')[c] >> r) & 1 ? 1.0f : 0.0f);
    ck_assert_float_eq(f[35], -1.0f);
    ck_assert_float_eq(f[41], 1.0f); /* column 1: bit 0 set */
    ck_assert_float_eq(f[42], -1.0f);
    ck_assert_float_eq(f[48], 1.0f);
    ck_assert_float_eq(f[51], 1.0f);
    render_cell_features(d, 0, 2, f); /* end of line 0, column 2 */
    ck_assert_float_eq(f[49], 1.0f);
    ck_assert_float_eq(f[48], 0.0f);
    ck_assert_float_eq(f[42], 1.0f);
    for (int k = 0; k < 35; k++)
        ck_assert_float_eq(f[k], 0.0f);
    render_cell_features(d, 0, 4, f); /* 'Z' on line 2 */
    ck_assert_float_eq(f[36], 1.0f);
    ck_assert_float_eq(f[35], -1.0f);
    render_cell_features(d, 0, 6, f); /* padding */
    ck_assert_float_eq(f[50], 1.0f);
    ck_assert_float_eq(f[51], 1.0f);
    render_doc_free(d);
}
END_TEST

START_TEST(render_embedding_is_exact_deterministic_and_bounded)
{
    render_doc *d = parse_ok("The quick brown fox\njumps over 13 lazy dogs.\n");
    enum { CELLS = 64, H = 48 };
    float *a = malloc(sizeof(float) * CELLS * H), *b = malloc(sizeof(float) * CELLS * H);
    pd_err e = {0};
    ck_assert_int_eq(render_page_embed(d, 0, CELLS, H, a, &e), PD_OK);
    ck_assert_int_eq(render_page_embed(d, 0, CELLS, H, b, &e), PD_OK);
    ck_assert_mem_eq(a, b, sizeof(float) * CELLS * H);
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < (size_t)CELLS * H; i++) {
        float q = a[i] * 4.0f; /* multiples of 0.25 */
        ck_assert_float_eq(q, (float)(int)q);
        ck_assert(a[i] >= -13.0f && a[i] <= 13.0f);
        uint32_t bits;
        memcpy(&bits, &a[i], 4);
        h = (h ^ bits) * 1099511628211ull;
    }
    /* the bytes are part of the shipped model's contract: pinned */
    ck_assert_msg(h == RENDER_TEST_GOLDEN, "embedding hash %016llx", (unsigned long long)h);
    ck_assert_int_eq(render_page_embed(d, 0, 40, H, a, &e), PD_ERR_RANGE);
    ck_assert(strstr(e.msg, "uses 45 cells"));
    free(a);
    free(b);
    render_doc_free(d);
}
END_TEST

START_TEST(render_write_emits_manifest_and_rows)
{
    render_doc *d = parse_ok("ab\n\fc\n");
    render_opts o = {.hidden = 16, .cells = 8, .bos = 256, .prompt = {79, 67}, .n_prompt = 2, .max_new_extra = 8,
                     .id_prefix = "t"};
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/out", pd_tmpdir);
    pd_err e = {0};
    ck_assert_msg(render_write(d, &o, dir, &e) == PD_OK, "%s", e.msg);
    snprintf(path, sizeof path, "%s/pages.jsonl", dir);
    FILE *f = fopen(path, "r");
    char line[256];
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_str_eq(line, "{\"id\":\"t00000\",\"prefill\":[{\"tokens\":[256]},{\"embeddings\":\"t00000.npy\"},"
                           "{\"tokens\":[79,67]}],\"max_new_tokens\":11}\n");
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_ptr_null(fgets(line, sizeof line, f));
    fclose(f);
    snprintf(path, sizeof path, "%s/t00001.npy", dir);
    npy_info info;
    ck_assert_int_eq(npy_probe(path, &info, &e), PD_OK);
    ck_assert_uint_eq(info.rows, 8);
    ck_assert_uint_eq(info.cols, 16);
    render_doc_free(d);

    /* a page over capacity: refused before anything is written */
    d = parse_ok("0123456789\n");
    snprintf(dir, sizeof dir, "%s/over", pd_tmpdir);
    ck_assert_int_eq(render_write(d, &o, dir, &e), PD_ERR_RANGE);
    ck_assert(strstr(e.msg, "page 1 uses 11 cells"));
    struct stat st;
    ck_assert_int_ne(stat(dir, &st), 0);
    render_doc_free(d);
}
END_TEST

START_TEST(render_write_emits_a_text_prompt_escaped)
{
    render_doc *d = parse_ok("ab\n");
    render_opts o = {.hidden = 16, .cells = 8, .bos = 256, .prompt = {1, 2}, .n_prompt = 2, .max_new_extra = 8,
                     .prompt_text = "<image>\n\"Free\\OCR\".\t\xc3\xa9", .id_prefix = "t"};
    char dir[300], path[400];
    snprintf(dir, sizeof dir, "%s/text", pd_tmpdir);
    pd_err e = {0};
    ck_assert_msg(render_write(d, &o, dir, &e) == PD_OK, "%s", e.msg);
    snprintf(path, sizeof path, "%s/pages.jsonl", dir);
    FILE *f = fopen(path, "r");
    char line[256];
    ck_assert_ptr_nonnull(fgets(line, sizeof line, f));
    ck_assert_str_eq(line, "{\"id\":\"t00000\",\"prefill\":[{\"tokens\":[256]},{\"embeddings\":\"t00000.npy\"},"
                           "{\"text\":\"<image>\\n\\\"Free\\\\OCR\\\".\\u0009\xc3\xa9\"}],\"max_new_tokens\":11}\n");
    fclose(f);
    render_doc_free(d);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("render");
    TCase *tc = tcase_create("render");
    tcase_add_checked_fixture(tc, pd_test_dir_setup, pd_test_dir_teardown);
    tcase_add_test(tc, render_glyphs_are_distinct_and_space_is_blank);
    tcase_add_test(tc, render_pages_split_at_form_feeds_with_a_final_newline);
    tcase_add_test(tc, render_refuses_bad_text_naming_page_line_and_column);
    tcase_add_test(tc, render_features_follow_the_documented_layout);
    tcase_add_test(tc, render_embedding_is_exact_deterministic_and_bounded);
    tcase_add_test(tc, render_write_emits_manifest_and_rows);
    tcase_add_test(tc, render_write_emits_a_text_prompt_escaped);
    suite_add_tcase(s, tc);
    return s;
}
