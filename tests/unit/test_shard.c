/* Tests for cluster/format/shard.h: the cost split (contiguous, balanced,
 * deterministic, every page once), relative embedding paths rewritten to
 * name the same file from the shard directory, lines kept byte for byte
 * otherwise, and refusals (duplicate ids, malformed lines naming file:line,
 * stale shards, overwriting the manifest) that write nothing. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/format/npy.h"
#include "cluster/format/pages.h"
#include "cluster/format/shard.h"
#include "pd_test.h"

static char tmpdir[256];
static char oldcwd[PATH_MAX];

static void setup_dir(void)
{
    strcpy(tmpdir, "/tmp/pd_test_shard.XXXXXX");
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

/* The whole file as a string (owned), or NULL when absent. */
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

static void put_npy(const char *path, uint32_t rows, uint32_t cols)
{
    float *v = calloc((size_t)rows * cols, sizeof *v);
    pd_err err = {0};
    ck_assert_msg(npy_write_f32(path, rows, cols, v, &err) == PD_OK, "%s", err.msg);
    free(v);
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; s && *s; s++)
        n += *s == '\n';
    return n;
}

START_TEST(shard_of_is_contiguous_and_balanced)
{
    /* 100 pages of cost 1 into 7 shards: monotone, each 14 or 15 pages */
    uint32_t prev = 0, count[7] = {0};
    for (uint64_t i = 0; i < 100; i++) {
        uint32_t k = shard_of(i, 1, 100, 7);
        ck_assert_uint_ge(k, prev);
        ck_assert_uint_lt(k, 7);
        prev = k;
        count[k]++;
    }
    for (int k = 0; k < 7; k++)
        ck_assert_msg(count[k] == 14 || count[k] == 15, "shard %d: %u pages", k, count[k]);
    /* one shard, an empty total, huge costs without overflow */
    ck_assert_uint_eq(shard_of(5, 1, 10, 1), 0);
    ck_assert_uint_eq(shard_of(0, 0, 0, 4), 0);
    ck_assert_uint_eq(shard_of(UINT64_MAX / 2, UINT64_MAX / 2, UINT64_MAX, SHARD_MAX), SHARD_MAX * 3 / 4 - 1);
    ck_assert_uint_eq(shard_of(UINT64_MAX - 1, 1, UINT64_MAX, SHARD_MAX), SHARD_MAX - 1);
    ck_assert_uint_eq(shard_of(0, 1, UINT64_MAX, SHARD_MAX), 0);
}
END_TEST

START_TEST(shard_split_balances_cost_and_keeps_every_page_once)
{
    /* page i has 1 prompt token and max_new_tokens 10 * (i % 3): costs 1, 11, 21 */
    FILE *f = fopen("pages.jsonl", "wb");
    for (int i = 0; i < 30; i++)
        fprintf(f, "{\"id\":\"q%02d\",\"prefill\":[{\"tokens\":[1]}],\"max_new_tokens\":%d}\n", i, 10 * (i % 3));
    fclose(f);
    size_t n[4];
    uint64_t cost[4];
    pd_err err = {0};
    ck_assert_msg(shard_split("pages.jsonl", 4, "sh", &(shard_counts){.pages = n, .cost = cost}, &err) == PD_OK,
                  "%s", err.msg);
    uint64_t total = 0;
    size_t n_pages = 0;
    for (int k = 0; k < 4; k++) {
        total += cost[k];
        n_pages += n[k];
    }
    ck_assert_uint_eq(n_pages, 30);
    ck_assert_uint_eq(total, 10 * (1 + 11 + 21));
    for (int k = 0; k < 4; k++) /* within one page's cost of total / 4 */
        ck_assert_msg(cost[k] + 21 >= total / 4 && cost[k] <= total / 4 + 21, "shard %d: cost %llu", k,
                      (unsigned long long)cost[k]);
    /* the shards, concatenated in order, are the manifest byte for byte */
    char *all = slurp("pages.jsonl");
    size_t off = 0;
    for (int k = 0; k < 4; k++) {
        char path[64];
        snprintf(path, sizeof path, "sh/shard-%d.jsonl", k);
        char *s = slurp(path);
        ck_assert_ptr_nonnull(s);
        ck_assert_uint_eq(count_lines(s), n[k]);
        ck_assert_int_eq(strncmp(all + off, s, strlen(s)), 0);
        off += strlen(s);
        free(s);
    }
    ck_assert_uint_eq(off, strlen(all));
    free(all);
    /* deterministic: a second split writes the same files */
    char *first = slurp("sh/shard-2.jsonl");
    ck_assert_int_eq(shard_split("pages.jsonl", 4, "sh", NULL, &err), PD_OK);
    char *again = slurp("sh/shard-2.jsonl");
    ck_assert_str_eq(first, again);
    free(first);
    free(again);
}
END_TEST

START_TEST(shard_rewrites_relative_embedding_paths_to_name_the_same_file)
{
    ck_assert_int_eq(mkdir("in", 0777), 0);
    ck_assert_int_eq(mkdir("in/emb", 0777), 0);
    ck_assert_int_eq(mkdir("deep", 0777), 0);
    put_npy("in/emb/a.npy", 4, 8);
    char abs[PATH_MAX + 32];
    snprintf(abs, sizeof abs, "%s/in/emb/a.npy", tmpdir);
    char text[PATH_MAX * 2];
    snprintf(text, sizeof text,
             "{\"id\":\"rel\",\"prefill\":[{\"tokens\":[1]},{\"embeddings\":\"emb/a.npy\"}],\"max_new_tokens\":2}\n"
             "{\"id\":\"abs\", \"prefill\": [{\"embeddings\": \"%s\"}], \"max_new_tokens\": 2}\n"
             "{\"id\":\"tok\", \"prefill\": [{\"tokens\": [5.0]}], \"max_new_tokens\": 2}\n"
             "{\"id\":\"img\",\"prefill\":[{\"image\":\"scans/p1.png\"},{\"text\":\"Free OCR.\"}],"
             "\"max_new_tokens\":2}\n", abs);
    put("in/pages.jsonl", text);
    pd_err err = {0};
    ck_assert_msg(shard_split("in/pages.jsonl", 1, "deep/sh", NULL, &err) == PD_OK, "%s", err.msg);
    char *s = slurp("deep/sh/shard-0.jsonl");
    ck_assert_ptr_nonnull(strstr(s, "\"embeddings\":\"../../in/emb/a.npy\""));
    ck_assert_ptr_nonnull(strstr(s, "{\"image\":\"../../in/scans/p1.png\"},{\"text\":\"Free OCR.\"}"));
    /* lines without a relative path are copied byte for byte */
    ck_assert_ptr_nonnull(strstr(s, "{\"id\":\"abs\", \"prefill\": [{\"embeddings\": \""));
    ck_assert_ptr_nonnull(strstr(s, "{\"id\":\"tok\", \"prefill\": [{\"tokens\": [5.0]}], \"max_new_tokens\": 2}\n"));
    free(s);
    /* and the shard loads, its embeddings resolving to the same file */
    pages *p = NULL;
    ck_assert_msg(pages_load("deep/sh/shard-0.jsonl", 1000, 8, NULL, &p, &err) == PD_OK, "%s", err.msg);
    ck_assert_uint_eq(pages_count(p), 4);
    ck_assert_uint_eq(pages_get(p, 0)->prefill_rows, 5);
    ck_assert_str_eq(pages_get(p, 3)->segs[0].path, "deep/sh/../../in/scans/p1.png");
    pages_free(p);
    /* the shard directory beside the manifest: the path is kept as written */
    ck_assert_msg(shard_split("in/pages.jsonl", 1, "in", NULL, &err) == PD_OK, "%s", err.msg);
    s = slurp("in/shard-0.jsonl");
    char *orig = slurp("in/pages.jsonl");
    ck_assert_str_eq(s, orig);
    free(s);
    free(orig);
}
END_TEST

START_TEST(shard_refuses_bad_input_naming_file_and_line_and_writes_nothing)
{
    pd_err err = {0};
    put("dup.jsonl", "{\"id\":\"a\",\"prefill\":[{\"tokens\":[1]}],\"max_new_tokens\":1}\n"
                     "\n"
                     "{\"id\":\"a\",\"prefill\":[{\"tokens\":[2]}],\"max_new_tokens\":1}\n");
    ck_assert_int_ne(shard_split("dup.jsonl", 2, "out", NULL, &err), PD_OK);
    ck_assert_str_eq(err.msg, "dup.jsonl:3: page \"a\": id: already used by the page on line 1");
    ck_assert_int_ne(access("out", F_OK), 0);

    pd_err_clear(&err);
    put("bad.jsonl", "{\"id\":\"a\",\"prefill\":[{\"tokens\":[1]}],\"max_new_tokens\":1}\n"
                     "{\"id\":\"b\",\"prefill\":[{\"tokens\":[-1]}],\"max_new_tokens\":1}\n");
    ck_assert_int_ne(shard_split("bad.jsonl", 2, "out", NULL, &err), PD_OK);
    ck_assert_msg(strncmp(err.msg, "bad.jsonl:2: page \"b\": prefill[0].tokens", 40) == 0, "%s", err.msg);

    pd_err_clear(&err);
    put("miss.jsonl", "{\"id\":\"m\",\"prefill\":[{\"embeddings\":\"nope.npy\"}],\"max_new_tokens\":1}\n");
    ck_assert_int_ne(shard_split("miss.jsonl", 1, "out", NULL, &err), PD_OK);
    ck_assert_msg(strstr(err.msg, "miss.jsonl:1: page \"m\": prefill[0].embeddings") == err.msg, "%s", err.msg);
    ck_assert_int_ne(access("out", F_OK), 0);

    pd_err_clear(&err);
    ck_assert_int_eq(shard_split("dup.jsonl", 0, "out", NULL, &err), PD_ERR_ARG);
    pd_err_clear(&err);
    ck_assert_int_eq(shard_split("absent.jsonl", 1, "out", NULL, &err), PD_ERR_IO);
}
END_TEST

START_TEST(shard_refuses_stale_shards_and_overwriting_the_manifest)
{
    put("pages.jsonl", "{\"id\":\"a\",\"prefill\":[{\"tokens\":[1]}],\"max_new_tokens\":1}\n");
    pd_err err = {0};
    ck_assert_int_eq(shard_split("pages.jsonl", 3, "sh", NULL, &err), PD_OK);
    /* 3 shards of one page: two are empty files */
    char *e = slurp("sh/shard-2.jsonl");
    ck_assert_ptr_nonnull(e);
    free(e);
    ck_assert_int_eq(shard_split("pages.jsonl", 2, "sh", NULL, &err), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(err.msg, "sh/shard-2.jsonl is left from a split into more shards"));
    /* the manifest named like a shard in the output directory */
    ck_assert_int_eq(rename("pages.jsonl", "shard-0.jsonl"), 0);
    pd_err_clear(&err);
    ck_assert_int_eq(shard_split("shard-0.jsonl", 1, ".", NULL, &err), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(err.msg, "would overwrite the manifest"));
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("shard");
    TCase *tc = tcase_create("shard");
    tcase_add_checked_fixture(tc, setup_dir, teardown_dir);
    tcase_add_test(tc, shard_of_is_contiguous_and_balanced);
    tcase_add_test(tc, shard_split_balances_cost_and_keeps_every_page_once);
    tcase_add_test(tc, shard_rewrites_relative_embedding_paths_to_name_the_same_file);
    tcase_add_test(tc, shard_refuses_bad_input_naming_file_and_line_and_writes_nothing);
    tcase_add_test(tc, shard_refuses_stale_shards_and_overwriting_the_manifest);
    suite_add_tcase(s, tc);
    return s;
}
