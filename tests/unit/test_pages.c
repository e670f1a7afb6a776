/* Tests for cluster/format/pages.h: the manifest format, every validation error with
 * its exact line/page/field message, relative and absolute embedding paths,
 * lazy row reads equal to the file, and refusal of files changed after load. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/format/npy.h"
#include "cluster/format/pages.h"
#include "pd_test.h"

#define VOCAB 1000u
#define HIDDEN 16u

static char tmpdir[256];
static char oldcwd[PATH_MAX];

static void setup_dir(void)
{
    strcpy(tmpdir, "/tmp/pd_test_pages.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    ck_assert_ptr_nonnull(getcwd(oldcwd, sizeof oldcwd));
    ck_assert_int_eq(chdir(tmpdir), 0);
}

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}

static void teardown_dir(void)
{
    ck_assert_int_eq(chdir(oldcwd), 0);
    nftw(tmpdir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
}

static void put(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    ck_assert_int_eq(fclose(f), 0);
}

/* Writes an [rows x cols] block whose value at (r, c) is seed + r + c / 100. */
static void put_npy(const char *path, uint32_t rows, uint32_t cols, float seed)
{
    float *v = malloc((size_t)rows * cols * sizeof *v + 4);
    for (uint32_t r = 0; r < rows; r++)
        for (uint32_t c = 0; c < cols; c++)
            v[(size_t)r * cols + c] = seed + (float)r + (float)c / 100.0f;
    pd_err err = {0};
    ck_assert_msg(npy_write_f32(path, rows, cols, v, &err) == PD_OK, "%s", err.msg);
    free(v);
}

static pd_status load(const char *path, pages **out, pd_err *err)
{
    pd_err_clear(err);
    return pages_load(path, VOCAB, HIDDEN, NULL, out, err);
}

/* A stand-in tokenizer: one id per byte (the byte value), "EMPTY" gives no
 * ids, "FAIL" fails, "BIG" gives an id outside the vocabulary. */
static pd_status fake_tokenize(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n,
                               pd_err *err)
{
    (*(int *)ctx)++;
    if (!strcmp(text, "FAIL"))
        return pd_err_set(err, PD_ERR_FORMAT, "tokenizer: byte offset 2: invalid UTF-8");
    size_t k = !strcmp(text, "EMPTY") ? 0 : len;
    *ids = malloc((k ? k : 1) * sizeof **ids);
    for (size_t i = 0; i < k; i++)
        (*ids)[i] = !strcmp(text, "BIG") ? 100000 : (unsigned char)text[i];
    *n = k;
    return PD_OK;
}

START_TEST(pages_text_segments_are_tokenized_or_refused_naming_the_page)
{
    int calls = 0;
    pages_opts o = {.tokenize = fake_tokenize, .tokenize_ctx = &calls};
    put("pages.jsonl", "{\"id\": \"t\", \"prefill\": [{\"tokens\": [1]}, {\"text\": \"ab\"}], "
                       "\"max_new_tokens\": 5}\n");
    pages *p = NULL;
    pd_err err = {0};
    ck_assert_msg(pages_load("pages.jsonl", VOCAB, HIDDEN, &o, &p, &err) == PD_OK, "%s", err.msg);
    pages_check(p);
    const pages_page *pg = pages_get(p, 0);
    ck_assert_uint_eq(pg->n_segs, 2);
    ck_assert_int_eq(pg->segs[1].kind, PAGES_SEG_TOKENS);
    ck_assert_uint_eq(pg->segs[1].rows, 2);
    ck_assert_int_eq(pg->segs[1].tokens[0], 'a');
    ck_assert_int_eq(pg->segs[1].tokens[1], 'b');
    ck_assert_uint_eq(pg->prefill_rows, 3);
    ck_assert_int_eq(calls, 1);
    pages_free(p);
    /* without a tokenizer (tools): kept as text, no rows */
    ck_assert_msg(pages_load("pages.jsonl", VOCAB, 0, NULL, &p, &err) == PD_OK, "%s", err.msg);
    pages_check(p);
    pg = pages_get(p, 0);
    ck_assert_int_eq(pg->segs[1].kind, PAGES_SEG_TEXT);
    ck_assert_str_eq(pg->segs[1].text, "ab");
    ck_assert_uint_eq(pg->prefill_rows, 1);
    pages_free(p);
    static const struct { const char *seg; pd_status st; const char *msg; } bad[] = {
        {"{\"text\": \"EMPTY\"}", PD_ERR_FORMAT,
         "pages.jsonl:1: page \"t\": prefill[0].text: tokenizes to 0 tokens (need 1..16777216)"},
        {"{\"text\": \"FAIL\"}", PD_ERR_FORMAT,
         "pages.jsonl:1: page \"t\": prefill[0].text: tokenizer: byte offset 2: invalid UTF-8"},
        {"{\"text\": \"BIG\"}", PD_ERR_RANGE,
         "pages.jsonl:1: page \"t\": prefill[0].text: token 0 is id 100000, outside the vocabulary "
         "[0, 1000)"},
        {"{\"text\": \"\"}", PD_ERR_FORMAT,
         "pages.jsonl:1: page \"t\": prefill[0].text: must be a non-empty string"},
        {"{\"text\": 5}", PD_ERR_FORMAT,
         "pages.jsonl:1: page \"t\": prefill[0].text: must be a non-empty string"},
        {"{\"text\": \"a\xff\"}", PD_ERR_FORMAT,
         "pages.jsonl:1: page \"t\": prefill[0].text: byte offset 1: not valid UTF-8"},
        {"{\"text\": \"a\", \"tokens\": [1]}", PD_ERR_FORMAT,
         "pages.jsonl:1: page \"t\": prefill[0]: has more than one of \"tokens\", \"text\", "
         "\"embeddings\" and \"image\"; a segment is one of them"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[512];
        snprintf(text, sizeof text, "{\"id\": \"t\", \"prefill\": [%s], \"max_new_tokens\": 5}\n",
                 bad[i].seg);
        put("pages.jsonl", text);
        p = (pages *)&text;
        pd_err_clear(&err);
        pd_status st = pages_load("pages.jsonl", VOCAB, HIDDEN, &o, &p, &err);
        ck_assert_msg(st == bad[i].st, "case %zu: status %d: %s", i, st, err.msg);
        ck_assert_msg(!strcmp(err.msg, bad[i].msg), "case %zu:\n got  %s\n want %s", i, err.msg,
                      bad[i].msg);
        ck_assert_ptr_eq(p, (pages *)&text);
    }
}
END_TEST

START_TEST(pages_load_reads_tokens_and_embedding_segments)
{
    put_npy("e1.npy", 7, HIDDEN, 1.0f);
    put_npy("e2.npy", 3, HIDDEN, 2.0f);
    put("pages.jsonl",
        "{\"id\": \"p1\", \"prefill\": [{\"tokens\": [1, 2, 999]}], \"max_new_tokens\": 5}\n"
        "\n"
        "   \n"
        "{\"prefill\": [{\"embeddings\": \"e1.npy\"}, {\"tokens\": [0]}, {\"embeddings\": \"e2.npy\"}],"
        " \"max_new_tokens\": 0, \"id\": \"p2\"}\r\n"
        "{\"id\": \"p\\u00e9\", \"prefill\": [{\"tokens\": [7.0]}], \"max_new_tokens\": 1048576}");
    pages *p = NULL;
    pd_err err;
    ck_assert_msg(load("pages.jsonl", &p, &err) == PD_OK, "%s", err.msg);
    pages_check(p);
    ck_assert_uint_eq(pages_count(p), 3);
    const pages_page *a = pages_get(p, 0);
    ck_assert_str_eq(a->id, "p1");
    ck_assert_uint_eq(a->line, 1);
    ck_assert_uint_eq(a->max_new_tokens, 5);
    ck_assert_uint_eq(a->prefill_rows, 3);
    ck_assert_uint_eq(a->n_segs, 1);
    ck_assert_int_eq(a->segs[0].kind, PAGES_SEG_TOKENS);
    ck_assert_int_eq(a->segs[0].tokens[2], 999);
    const pages_page *b = pages_get(p, 1);
    ck_assert_str_eq(b->id, "p2");
    ck_assert_uint_eq(b->line, 4);
    ck_assert_uint_eq(b->max_new_tokens, 0);
    ck_assert_uint_eq(b->n_segs, 3);
    ck_assert_uint_eq(b->prefill_rows, 7 + 1 + 3);
    ck_assert_int_eq(b->segs[0].kind, PAGES_SEG_EMBEDDINGS);
    ck_assert_uint_eq(b->segs[0].rows, 7);
    ck_assert_str_eq(b->segs[0].file, "e1.npy");
    ck_assert_int_eq(b->segs[1].tokens[0], 0);
    ck_assert_uint_eq(b->segs[2].rows, 3);
    const pages_page *c = pages_get(p, 2);
    ck_assert_str_eq(c->id, "p\xc3\xa9");
    ck_assert_uint_eq(c->line, 5);
    ck_assert_uint_eq(c->max_new_tokens, 1u << 20);
    ck_assert_int_eq(pages_find(p, "p2"), 1);
    ck_assert_int_eq(pages_find(p, "p\xc3\xa9"), 2);
    ck_assert_int_eq(pages_find(p, "p3"), -1);
    pages_free(p);
    pages_free(NULL);
}
END_TEST

START_TEST(pages_relative_paths_resolve_against_the_manifest_dir)
{
    ck_assert_int_eq(mkdir("sub", 0755), 0);
    ck_assert_int_eq(mkdir("sub/emb", 0755), 0);
    put_npy("sub/emb/a.npy", 4, HIDDEN, 3.0f);
    put_npy("abs.npy", 2, HIDDEN, 4.0f);
    char absnpy[512], manifest[512];
    snprintf(absnpy, sizeof absnpy, "%s/abs.npy", tmpdir);
    snprintf(manifest, sizeof manifest, "%s/sub/m.jsonl", tmpdir);
    char line[1200];
    snprintf(line, sizeof line,
             "{\"id\": \"r\", \"prefill\": [{\"embeddings\": \"emb/a.npy\"}, {\"embeddings\": \"%s\"}],"
             " \"max_new_tokens\": 3}\n", absnpy);
    put("sub/m.jsonl", line);
    /* Load from another working directory, through absolute and relative manifest paths. */
    ck_assert_int_eq(chdir("/"), 0);
    pages *p = NULL;
    pd_err err;
    ck_assert_msg(load(manifest, &p, &err) == PD_OK, "%s", err.msg);
    pages_check(p);
    const pages_page *g = pages_get(p, 0);
    ck_assert_uint_eq(g->prefill_rows, 6);
    char want[600];
    snprintf(want, sizeof want, "%s/sub/emb/a.npy", tmpdir);
    ck_assert_str_eq(g->segs[0].path, want);
    ck_assert_str_eq(g->segs[1].path, absnpy);
    pages_free(p);
    ck_assert_int_eq(chdir(tmpdir), 0);
    ck_assert_msg(load("sub/m.jsonl", &p, &err) == PD_OK, "%s", err.msg);
    ck_assert_str_eq(pages_get(p, 0)->segs[0].path, "sub/emb/a.npy");
    pages_free(p);
    ck_assert_int_eq(chdir("sub"), 0);
    ck_assert_msg(load("m.jsonl", &p, &err) == PD_OK, "%s", err.msg);
    ck_assert_str_eq(pages_get(p, 0)->segs[0].path, "emb/a.npy");
    pages_free(p);
    /* Relative to the manifest, not to the working directory. */
    ck_assert_int_eq(chdir(tmpdir), 0);
    put("sub/m2.jsonl", "{\"id\": \"r\", \"prefill\": [{\"embeddings\": \"abs.npy\"}], "
                        "\"max_new_tokens\": 3}\n");
    ck_assert_int_eq(load("sub/m2.jsonl", &p, &err), PD_ERR_IO);
    ck_assert_str_eq(err.msg, "sub/m2.jsonl:1: page \"r\": prefill[0].embeddings: npy: "
                              "sub/abs.npy: cannot open: No such file or directory");
}
END_TEST

START_TEST(pages_lazy_embed_read_equals_the_file)
{
    put_npy("e.npy", 9, HIDDEN, 0.25f);
    put("pages.jsonl", "{\"id\": \"x\", \"prefill\": [{\"tokens\": [5]}, {\"embeddings\": \"e.npy\"}],"
                       " \"max_new_tokens\": 1}\n");
    pages *p = NULL;
    pd_err err;
    ck_assert_msg(load("pages.jsonl", &p, &err) == PD_OK, "%s", err.msg);
    float *ref = NULL;
    npy_info info;
    ck_assert_int_eq(npy_load("e.npy", &info, &ref, &err), PD_OK);
    float all[9 * HIDDEN];
    ck_assert_int_eq(pages_embed_read(p, 0, 1, 0, 9, all, &err), PD_OK);
    ck_assert_mem_eq(all, ref, sizeof all);
    for (uint32_t r0 = 0; r0 < 9; r0++)
        for (uint32_t n = 0; r0 + n <= 9; n++) {
            float part[9 * HIDDEN];
            memset(part, 0xff, sizeof part);
            ck_assert_int_eq(pages_embed_read(p, 0, 1, r0, n, part, &err), PD_OK);
            ck_assert_mem_eq(part, ref + (size_t)r0 * HIDDEN, (size_t)n * HIDDEN * sizeof(float));
        }
    ck_assert_int_eq(pages_embed_read(p, 0, 1, 5, 5, all, &err), PD_ERR_RANGE);
    ck_assert_str_eq(err.msg, "pages.jsonl:1: page \"x\": prefill[1].embeddings: rows [5, 10) "
                              "outside the 9 rows");
    pd_err_clear(&err);
    ck_assert_int_eq(pages_embed_read(p, 0, 0, 0, 1, all, &err), PD_ERR_ARG);
    ck_assert_str_eq(err.msg, "pages.jsonl:1: page \"x\": prefill[0]: not an embeddings segment");
    /* A file replaced after load is refused, not misread. */
    put_npy("e.npy", 10, HIDDEN, 0.25f);
    pd_err_clear(&err);
    ck_assert_int_eq(pages_embed_read(p, 0, 1, 0, 1, all, &err), PD_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(err.msg, "pages.jsonl:1: page \"x\": prefill[1].embeddings: npy: "));
    ck_assert_ptr_nonnull(strstr(err.msg, "changed"));
    free(ref);
    pages_free(p);
}
END_TEST

static void put_nan_npy(const char *path)
{
    float v[4 * HIDDEN];
    for (size_t i = 0; i < 4 * HIDDEN; i++)
        v[i] = (float)i;
    v[2 * HIDDEN + 3] = NAN;
    pd_err err = {0};
    ck_assert_int_eq(npy_write_f32(path, 4, HIDDEN, v, &err), PD_OK);
}

START_TEST(pages_header_only_defers_the_finite_check_to_reads)
{
    put_nan_npy("nan.npy");
    put("pages.jsonl", "{\"id\": \"n\", \"prefill\": [{\"embeddings\": \"nan.npy\"}], "
                       "\"max_new_tokens\": 1}\n");
    pages *p = NULL;
    pd_err err = {0};
    pages_opts o = {.header_only = true};
    ck_assert_int_eq(pages_load("pages.jsonl", VOCAB, HIDDEN, &o, &p, &err), PD_OK);
    float buf[4 * HIDDEN];
    ck_assert_int_eq(pages_embed_read(p, 0, 0, 0, 2, buf, &err), PD_OK);
    ck_assert_int_eq(pages_embed_read(p, 0, 0, 1, 2, buf, &err), PD_ERR_FORMAT);
    ck_assert_str_eq(err.msg, "pages.jsonl:1: page \"n\": prefill[0].embeddings: nan.npy: row 2 "
                              "column 3 is not finite (nan)");
    pages_free(p);
}
END_TEST

/* Line 1 valid, line 2 blank, line 3 the case; the exact error message. */
typedef struct bad_case {
    const char *line3;
    pd_status st;
    const char *msg;
} bad_case;

static const bad_case BAD[] = {
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1, 2]}], \"max_new_token\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": unknown key \"max_new_token\" (a page has id, prefill, "
     "max_new_tokens)"},
    {"{\"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: missing key \"id\""},
    {"{\"id\": \"\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: id: must be a non-empty string"},
    {"{\"id\": 7, \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: id: must be a non-empty string"},
    {"{\"id\": \"p\xff\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 5}",
     PD_ERR_FORMAT, "pages.jsonl:3: id: not valid UTF-8"},
    {"{\"id\": \"p1\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p1\": id: already used by the page on line 1"},
    {"{\"id\": \"p3\", \"id\": \"p4\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 5}",
     PD_ERR_FORMAT, "pages.jsonl:3: page \"p3\": key \"id\" given twice"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1]}]}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": missing key \"max_new_tokens\""},
    {"{\"id\": \"p3\", \"max_new_tokens\": 1}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": missing key \"prefill\""},
    {"{\"id\": \"p3\", \"prefill\": [], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill: must be a non-empty array of segments"},
    {"{\"id\": \"p3\", \"prefill\": {\"tokens\": [1]}, \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill: must be a non-empty array of segments"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1, 2]}, {\"tokens\": [3, 1000]}], "
     "\"max_new_tokens\": 5}", PD_ERR_RANGE,
     "pages.jsonl:3: page \"p3\": prefill[1].tokens[1]: token id 1000 is outside the vocabulary "
     "[0, 1000)"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [-1]}], \"max_new_tokens\": 5}", PD_ERR_RANGE,
     "pages.jsonl:3: page \"p3\": prefill[0].tokens[0]: token id -1 is outside the vocabulary "
     "[0, 1000)"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1, 1.5]}], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0].tokens[1]: must be an integer"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [\"1\"]}], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0].tokens[0]: must be an integer"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": []}], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0].tokens: must be a non-empty array of token ids"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1], \"embeddings\": \"e.npy\"}], "
     "\"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0]: has more than one of \"tokens\", \"text\", "
     "\"embeddings\" and \"image\"; a segment is one of them"},
    {"{\"id\": \"p3\", \"prefill\": [{\"image\": \"a.png\", \"text\": \"x\"}], "
     "\"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0]: has more than one of \"tokens\", \"text\", "
     "\"embeddings\" and \"image\"; a segment is one of them"},
    {"{\"id\": \"p3\", \"prefill\": [{\"image\": \"\"}], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0].image: must be a non-empty file path (string)"},
    {"{\"id\": \"p3\", \"prefill\": [{\"image\": [\"a.png\"]}], \"max_new_tokens\": 5}",
     PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0].image: must be a non-empty file path (string)"},
    {"{\"id\": \"p3\", \"prefill\": [{}], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0]: empty segment (expected \"tokens\", \"text\", "
     "\"embeddings\" or \"image\")"},
    {"{\"id\": \"p3\", \"prefill\": [[1]], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0]: a segment must be an object"},
    {"{\"id\": \"p3\", \"prefill\": [{\"token\": [1]}], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0]: unknown key \"token\" (a segment has tokens, text, "
     "embeddings or image)"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1], \"tokens\": [2]}], \"max_new_tokens\": 5}",
     PD_ERR_FORMAT, "pages.jsonl:3: page \"p3\": prefill[0]: key \"tokens\" given twice"},
    {"{\"id\": \"p3\", \"prefill\": [{\"embeddings\": 5}], \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0].embeddings: must be a non-empty file path (string)"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1]}, {\"embeddings\": \"e8.npy\"}], "
     "\"max_new_tokens\": 5}", PD_ERR_MISMATCH,
     "pages.jsonl:3: page \"p3\": prefill[1].embeddings: e8.npy: shape [5, 8] does not match "
     "hidden size 16"},
    {"{\"id\": \"p3\", \"prefill\": [{\"embeddings\": \"missing.npy\"}], \"max_new_tokens\": 5}",
     PD_ERR_IO,
     "pages.jsonl:3: page \"p3\": prefill[0].embeddings: npy: missing.npy: cannot open: No such "
     "file or directory"},
    {"{\"id\": \"p3\", \"prefill\": [{\"embeddings\": \"nan.npy\"}], \"max_new_tokens\": 5}",
     PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0].embeddings: nan.npy: row 2 column 3 is not finite "
     "(nan)"},
    {"{\"id\": \"p3\", \"prefill\": [{\"embeddings\": \"zero.npy\"}], \"max_new_tokens\": 5}",
     PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": prefill[0].embeddings: zero.npy: shape [0, 16] has no rows"},
    {"{\"id\": \"p3\", \"prefill\": [{\"embeddings\": \"f8.npy\"}], \"max_new_tokens\": 5}",
     PD_ERR_UNSUPPORTED,
     "pages.jsonl:3: page \"p3\": prefill[0].embeddings: npy: f8.npy: header: dtype '<f8' is not "
     "supported (only '<f4', little-endian float32)"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": -1}", PD_ERR_RANGE,
     "pages.jsonl:3: page \"p3\": max_new_tokens: must be an integer in [0, 1048576]"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 1048577}", PD_ERR_RANGE,
     "pages.jsonl:3: page \"p3\": max_new_tokens: must be an integer in [0, 1048576]"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": \"5\"}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"p3\": max_new_tokens: must be an integer in [0, 1048576]"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 2.5}", PD_ERR_RANGE,
     "pages.jsonl:3: page \"p3\": max_new_tokens: must be an integer in [0, 1048576]"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1]}], ", PD_ERR_FORMAT,
     "pages.jsonl:3: not valid JSON (column 43)"},
    {"[1, 2]", PD_ERR_FORMAT, "pages.jsonl:3: a page must be a JSON object"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 5} {\"id\": \"p4\"}",
     PD_ERR_FORMAT,
     "pages.jsonl:3: unexpected text after the JSON object (column 65); one page a line"},
    {"{\"id\": \"a\\\"b\\n\", \"prefill\": 3, \"max_new_tokens\": 5}", PD_ERR_FORMAT,
     "pages.jsonl:3: page \"a\\\"b\\x0a\": prefill: must be a non-empty array of segments"},
    /* a NUL would cut the text: "p1\u0000x" would silently be the id "p1" and
     * collide with line 1; a key or a path would mean another one */
    {"{\"id\": \"p1\\u0000x\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 5}",
     PD_ERR_FORMAT, "pages.jsonl:3: id: contains a NUL character (\\u0000) at column 11"},
    {"{\"id\": \"\\u0000\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 5}",
     PD_ERR_FORMAT, "pages.jsonl:3: id: contains a NUL character (\\u0000) at column 9"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1]}, {\"embeddings\": \"e8.npy\\u0000.x\"}], "
     "\"max_new_tokens\": 5}",
     PD_ERR_FORMAT,
     "pages.jsonl:3: prefill[1].embeddings: contains a NUL character (\\u0000) at column 65"},
    {"{\"id\": \"p3\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\\u0000x\": 5}",
     PD_ERR_FORMAT,
     "pages.jsonl:3: key \"max_new_tokens\\u0000x\": contains a NUL character (\\u0000) at column "
     "59"},
};

START_TEST(pages_every_validation_error_names_line_page_and_field)
{
    put_npy("e8.npy", 5, 8, 0.0f);
    put_npy("zero.npy", 0, HIDDEN, 0.0f);
    put_nan_npy("nan.npy");
    /* A '<f8' file of shape (1, 16): a real .npy, just the wrong dtype. */
    {
        char hdr[128];
        int n = snprintf(hdr, sizeof hdr,
                         "{'descr': '<f8', 'fortran_order': False, 'shape': (1, 16), }");
        unsigned char b[256 + 128];
        memcpy(b, "\x93NUMPY\x01\x00", 8);
        size_t total = 128;
        b[8] = (unsigned char)(total - 10);
        b[9] = 0;
        memcpy(b + 10, hdr, (size_t)n);
        memset(b + 10 + n, ' ', total - 10 - (size_t)n - 1);
        b[total - 1] = '\n';
        memset(b + total, 0, 128);
        FILE *f = fopen("f8.npy", "wb");
        ck_assert_uint_eq(fwrite(b, 1, total + 128, f), total + 128);
        fclose(f);
    }
    for (size_t i = 0; i < sizeof BAD / sizeof BAD[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "{\"id\": \"p1\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 5}\n\n%s\n"
                 "{\"id\": \"p4\", \"prefill\": [{\"tokens\": [1]}], \"max_new_tokens\": 5}\n",
                 BAD[i].line3);
        put("pages.jsonl", text);
        pages *p = (pages *)&text; /* sentinel: must stay untouched */
        pd_err err;
        pd_status st = load("pages.jsonl", &p, &err);
        ck_assert_msg(st == BAD[i].st, "case %zu: status %d: %s", i, st, err.msg);
        ck_assert_msg(!strcmp(err.msg, BAD[i].msg), "case %zu:\n got  %s\n want %s", i, err.msg,
                      BAD[i].msg);
        ck_assert_ptr_eq(p, (pages *)&text);
    }
}
END_TEST

START_TEST(pages_line_check_validates_without_files)
{
    pd_err err = {0};
    const char *ok = "{\"id\": \"q\", \"prefill\": [{\"embeddings\": \"not/there.npy\"}, "
                     "{\"tokens\": [3]}], \"max_new_tokens\": 2}";
    ck_assert_int_eq(pages_line_check(ok, strlen(ok), 10, &err), PD_OK);
    const char *bad = "{\"id\": \"q\", \"prefill\": [{\"tokens\": [10]}], \"max_new_tokens\": 2}";
    ck_assert_int_eq(pages_line_check(bad, strlen(bad), 10, &err), PD_ERR_RANGE);
    ck_assert_str_eq(err.msg, "line:1: page \"q\": prefill[0].tokens[0]: token id 10 is outside "
                              "the vocabulary [0, 10)");
    pd_err_clear(&err);
    /* The length bounds the parse: a valid prefix of a longer buffer. */
    ck_assert_int_eq(pages_line_check(ok, 10, 10, &err), PD_ERR_FORMAT);
    pd_err_clear(&err);
    ck_assert_int_eq(pages_line_check("", 0, 10, &err), PD_ERR_FORMAT);
}
END_TEST

/* A raw 0x00 byte inside a string cuts the text like the \u0000 escape does
 * (cJSON accepts it): refused the same way, with its column. */
START_TEST(pages_refuse_a_raw_nul_byte_in_a_string)
{
    static const char line[] = "{\"id\": \"q\0r\", \"prefill\": [{\"tokens\": [3]}], "
                               "\"max_new_tokens\": 2}";
    pd_err err = {0};
    ck_assert_int_eq(pages_line_check(line, sizeof line - 1, 10, &err), PD_ERR_FORMAT);
    ck_assert_str_eq(err.msg, "line:1: id: contains a NUL character (\\u0000) at column 10");
    /* the same id without the byte is fine */
    static const char ok[] = "{\"id\": \"q\", \"prefill\": [{\"tokens\": [3]}], \"max_new_tokens\": 2}";
    pd_err_clear(&err);
    ck_assert_int_eq(pages_line_check(ok, sizeof ok - 1, 10, &err), PD_OK);
}
END_TEST

START_TEST(pages_empty_manifest_has_no_pages)
{
    put("empty.jsonl", "");
    put("blank.jsonl", "\n  \n\t\r\n");
    pages *p = NULL;
    pd_err err;
    ck_assert_int_eq(load("empty.jsonl", &p, &err), PD_OK);
    ck_assert_uint_eq(pages_count(p), 0);
    pages_check(p);
    pages_free(p);
    ck_assert_int_eq(load("blank.jsonl", &p, &err), PD_OK);
    ck_assert_uint_eq(pages_count(p), 0);
    ck_assert_int_eq(pages_find(p, "x"), -1);
    pages_free(p);
    ck_assert_int_eq(load("absent.jsonl", &p, &err), PD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "absent.jsonl"));
}
END_TEST

START_TEST(pages_thousands_of_pages_load_and_find)
{
    enum { N = 3000 };
    FILE *f = fopen("many.jsonl", "wb");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < N; i++)
        fprintf(f, "{\"id\": \"page-%05d\", \"prefill\": [{\"tokens\": [%d, %d]}], "
                   "\"max_new_tokens\": %d}\n", i, i % VOCAB, (i * 7) % VOCAB, i % 100);
    fclose(f);
    pages *p = NULL;
    pd_err err;
    ck_assert_msg(load("many.jsonl", &p, &err) == PD_OK, "%s", err.msg);
    pages_check(p);
    ck_assert_uint_eq(pages_count(p), N);
    for (int i = 0; i < N; i++) {
        char id[32];
        snprintf(id, sizeof id, "page-%05d", i);
        ck_assert_int_eq(pages_find(p, id), i);
        const pages_page *g = pages_get(p, (size_t)i);
        ck_assert_uint_eq(g->line, (uint32_t)i + 1);
        ck_assert_int_eq(g->segs[0].tokens[1], (i * 7) % (int)VOCAB);
    }
    pages_free(p);
}
END_TEST

START_TEST(pages_load_without_a_model_checks_headers_not_widths)
{
    /* hidden 0 (a tool with no model, e.g. pipedec shard): any width, rows counted, reads refused */
    put_npy("wide.npy", 3, HIDDEN * 2, 1.0f);
    put("pages.jsonl", "{\"id\": \"w\", \"prefill\": [{\"embeddings\": \"wide.npy\"}], \"max_new_tokens\": 1}\n");
    pages *p = NULL;
    pd_err err = {0};
    ck_assert_msg(pages_load("pages.jsonl", VOCAB, 0, NULL, &p, &err) == PD_OK, "%s", err.msg);
    pages_check(p);
    ck_assert_uint_eq(pages_get(p, 0)->prefill_rows, 3);
    float row[2 * HIDDEN];
    ck_assert_int_eq(pages_embed_read(p, 0, 0, 0, 1, row, &err), PD_ERR_ARG);
    pages_free(p);
    /* a missing file is still refused */
    put("pages.jsonl", "{\"id\": \"m\", \"prefill\": [{\"embeddings\": \"none.npy\"}], \"max_new_tokens\": 1}\n");
    pd_err_clear(&err);
    ck_assert_int_eq(pages_load("pages.jsonl", VOCAB, 0, NULL, &p, &err), PD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "pages.jsonl:1: page \"m\": prefill[0].embeddings"));
}
END_TEST

START_TEST(pages_image_segments_resolve_their_path_and_carry_no_rows)
{
    ck_assert_int_eq(mkdir("sub", 0755), 0);
    put("sub/m.jsonl", "{\"id\": \"i\", \"prefill\": [{\"tokens\": [1]}, {\"image\": \"scan.png\"}, "
                       "{\"image\": \"/abs/p.jpg\"}, {\"tokens\": [2, 3]}], \"max_new_tokens\": 3}\n");
    pages *p = NULL;
    pd_err err = {0};
    /* the image files are not read at load: the vision encoder reads them */
    ck_assert_msg(load("sub/m.jsonl", &p, &err) == PD_OK, "%s", err.msg);
    pages_check(p);
    const pages_page *g = pages_get(p, 0);
    ck_assert_uint_eq(g->n_segs, 4);
    ck_assert_int_eq(g->segs[1].kind, PAGES_SEG_IMAGE);
    ck_assert_uint_eq(g->segs[1].rows, 0);
    ck_assert_str_eq(g->segs[1].file, "scan.png");
    ck_assert_str_eq(g->segs[1].path, "sub/scan.png");
    ck_assert_str_eq(g->segs[2].path, "/abs/p.jpg");
    ck_assert_uint_eq(g->prefill_rows, 3);
    pd_err_clear(&err);
    ck_assert_int_eq(pages_embed_read(p, 0, 1, 0, 1, NULL, &err), PD_ERR_ARG);
    pages_free(p);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("pages");
    TCase *tc = tcase_create("pages");
    tcase_add_checked_fixture(tc, setup_dir, teardown_dir);
    tcase_add_test(tc, pages_load_reads_tokens_and_embedding_segments);
    tcase_add_test(tc, pages_text_segments_are_tokenized_or_refused_naming_the_page);
    tcase_add_test(tc, pages_relative_paths_resolve_against_the_manifest_dir);
    tcase_add_test(tc, pages_image_segments_resolve_their_path_and_carry_no_rows);
    tcase_add_test(tc, pages_lazy_embed_read_equals_the_file);
    tcase_add_test(tc, pages_header_only_defers_the_finite_check_to_reads);
    tcase_add_test(tc, pages_every_validation_error_names_line_page_and_field);
    tcase_add_test(tc, pages_line_check_validates_without_files);
    tcase_add_test(tc, pages_refuse_a_raw_nul_byte_in_a_string);
    tcase_add_test(tc, pages_empty_manifest_has_no_pages);
    tcase_add_test(tc, pages_thousands_of_pages_load_and_find);
    tcase_add_test(tc, pages_load_without_a_model_checks_headers_not_widths);
    suite_add_tcase(s, tc);
    return s;
}
