/* ckpt_dir: only canonical names count, links are never followed, a
 * directory is removed only when everything in it is pipedec's (and an old
 * checkpoint only with a manifest naming it), publishing never replaces an
 * entry, and the start-up check refuses files, unwritable places and
 * numbers that would wrap. */
#include "pd_test.h"

#include "cluster/runtime/ops/ckpt_dir.h"
#include "cluster/runtime/ops/ckpt_manifest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64], outside[64];

static void setup(void)
{
    pd_test_tmpdir(dir, sizeof dir, "ckpt_dir");
    pd_test_tmpdir(outside, sizeof outside, "ckpt_dir_outside");
}

static void teardown(void)
{
    pd_test_rmtree(dir);
    pd_test_rmtree(outside);
}

static void put(const char *d, const char *name, const void *b, size_t n)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", d, name);
    FILE *f = fopen(p, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

static void sub(const char *name)
{
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    ck_assert_int_eq(mkdir(p, 0755), 0);
}

static bool exists(const char *d, const char *name)
{
    char p[1024];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", d, name);
    return lstat(p, &sb) == 0;
}

/* A manifest of checkpoint seq (no layers, no streams) in dir/name. */
static void put_manifest(const char *name, uint64_t seq)
{
    ckpt_bundle_info b0 = {.layer = 0, .bytes = 8};
    ckpt_manifest m = {.seq = seq, .settings = "s", .layer_map = "0", .n_layers = 1, .bundles = &b0, .next_id = 1};
    wr w;
    pd_err e = {0};
    ck_assert_int_eq(wr_init_buffer(&w, 256, &e), PD_OK);
    ck_assert_int_eq(ckpt_manifest_encode(&m, &w), PD_OK);
    size_t n;
    uint8_t *b = wr_take(&w, &n);
    char d[256];
    snprintf(d, sizeof d, "%s/%s", dir, name);
    put(d, "manifest.pdck", b, n);
    free(b);
    wr_dispose(&w);
}

START_TEST(ckpt_dir_names_are_canonical_decimals_only)
{
    static const struct { const char *name; uint64_t seq; } good[] = {
        {"ckpt-1", 1}, {"ckpt-10", 10}, {"ckpt-18446744073709551615", UINT64_MAX}};
    static const char *bad[] = {"ckpt-0", "ckpt--1", "ckpt-+1", "ckpt-01", "ckpt- 1", "ckpt-1x", "ckpt-",
                                "ckpt-18446744073709551616", "ckpt-99999999999999999999", "Ckpt-1", ".ckpt-1",
                                "ckpt-1 ", "ckpt-0x10"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        uint64_t s = 0;
        ck_assert_msg(ckpt_dir_parse_name(good[i].name, &s), "%s", good[i].name);
        ck_assert_uint_eq(s, good[i].seq);
    }
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t s = 7;
        ck_assert_msg(!ckpt_dir_parse_name(bad[i], &s), "%s accepted", bad[i]);
        ck_assert_uint_eq(s, 7);
    }
}
END_TEST

START_TEST(ckpt_dir_list_takes_real_directories_and_numbers_past_every_name)
{
    sub("ckpt-2");
    sub("ckpt-10");
    sub("ckpt--1");
    sub("ckpt-007");
    char p[1024];
    snprintf(p, sizeof p, "%s/ckpt-40", dir);
    ck_assert_int_eq(symlink(outside, p), 0);
    put(dir, "ckpt-12", "x", 1);
    ckpt_dir_scan s;
    pd_err e = {0};
    ck_assert_int_eq(ckpt_dir_list(dir, &s, &e), PD_OK);
    ck_assert_uint_eq(s.n, 2);
    ck_assert_uint_eq(s.seqs[0], 10);
    ck_assert_uint_eq(s.seqs[1], 2);
    ck_assert_uint_eq(s.max_seq, 40);
    ck_assert_uint_eq(s.n_foreign, 4);
    bool link_named = false;
    for (uint32_t i = 0; i < s.n_foreign; i++)
        link_named |= strcmp(s.foreign[i], "ckpt-40 (a symbolic link)") == 0;
    ck_assert(link_named);
    ckpt_dir_scan_free(&s);
}
END_TEST

START_TEST(ckpt_dir_remove_never_follows_a_link)
{
    put(outside, "precious.txt", "keep", 4);
    char p[1024];
    snprintf(p, sizeof p, "%s/ckpt-3", dir);
    ck_assert_int_eq(symlink(outside, p), 0);
    pd_err e = {0};
    ck_assert_int_eq(ckpt_dir_remove(dir, "ckpt-3", 3, &e), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.msg, "a symbolic link"));
    ck_assert(exists(outside, "precious.txt"));
    ck_assert(exists(dir, "ckpt-3"));
    pd_err_clear(&e);
    ck_assert_int_eq(ckpt_dir_remove(dir, "ckpt-3", 0, &e), PD_ERR_REFUSED);
    ck_assert(exists(outside, "precious.txt"));
}
END_TEST

START_TEST(ckpt_dir_remove_leaves_a_directory_with_anything_foreign)
{
    sub("ckpt-4");
    put_manifest("ckpt-4", 4);
    char d[256];
    snprintf(d, sizeof d, "%s/ckpt-4", dir);
    put(d, "layer-00000.cmfb", "CMFB....", 8);
    put(d, "notes.txt", "mine", 4);
    pd_err e = {0};
    ck_assert_int_eq(ckpt_dir_remove(dir, "ckpt-4", 4, &e), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.msg, "holds notes.txt"));
    ck_assert(exists(d, "manifest.pdck") && exists(d, "layer-00000.cmfb") && exists(d, "notes.txt"));
    /* a link inside, even with one of pipedec's names */
    char l[1024];
    snprintf(l, sizeof l, "%s/notes.txt", d);
    ck_assert_int_eq(unlink(l), 0);
    snprintf(l, sizeof l, "%s/layer-00001.cmfb", d);
    put(outside, "target.cmfb", "CMFB", 4);
    char t[1024];
    snprintf(t, sizeof t, "%s/target.cmfb", outside);
    ck_assert_int_eq(symlink(t, l), 0);
    pd_err_clear(&e);
    ck_assert_int_eq(ckpt_dir_remove(dir, "ckpt-4", 4, &e), PD_ERR_REFUSED);
    ck_assert(exists(outside, "target.cmfb") && exists(d, "manifest.pdck"));
    /* a bundle name without the bundle magic */
    unlink(l);
    put(d, "layer-00002.cmfb", "JPEG", 4);
    pd_err_clear(&e);
    ck_assert_int_eq(ckpt_dir_remove(dir, "ckpt-4", 4, &e), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.msg, "layer-00002.cmfb"));
}
END_TEST

START_TEST(ckpt_dir_remove_needs_a_manifest_naming_the_checkpoint)
{
    sub("ckpt-5");
    char d[256];
    snprintf(d, sizeof d, "%s/ckpt-5", dir);
    put(d, "layer-00000.cmfb", "CMFB....", 8);
    pd_err e = {0};
    ck_assert_int_eq(ckpt_dir_remove(dir, "ckpt-5", 5, &e), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.msg, "no manifest of checkpoint 5"));
    ck_assert(!ckpt_dir_is_checkpoint(dir, 5));
    put_manifest("ckpt-5", 6); /* another checkpoint's manifest */
    pd_err_clear(&e);
    ck_assert_int_eq(ckpt_dir_remove(dir, "ckpt-5", 5, &e), PD_ERR_REFUSED);
    ck_assert(!ckpt_dir_is_checkpoint(dir, 5));
    put_manifest("ckpt-5", 5);
    ck_assert(ckpt_dir_is_checkpoint(dir, 5));
    put(d, "manifest.pdck.tmp.AbCdEf", "", 0);
    pd_err_clear(&e);
    ck_assert_msg(ckpt_dir_remove(dir, "ckpt-5", 5, &e) == PD_OK, "%s", e.msg);
    ck_assert(!exists(dir, "ckpt-5"));
    /* an entry that is not there is not an error */
    ck_assert_int_eq(ckpt_dir_remove(dir, "ckpt-5", 5, &e), PD_OK);
}
END_TEST

START_TEST(ckpt_dir_publish_never_replaces_an_entry)
{
    char tmp[512];
    pd_err e = {0};
    ck_assert_int_eq(ckpt_dir_make_tmp(dir, 1, tmp, sizeof tmp, &e), PD_OK);
    ck_assert_ptr_nonnull(strstr(tmp, "/.ckpt-1."));
    sub("ckpt-1"); /* an empty directory: rename(2) would replace it */
    ck_assert_int_eq(ckpt_dir_publish(tmp, dir, "ckpt-1", &e), PD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.msg, "File exists"));
    char p[1024];
    snprintf(p, sizeof p, "%s/ckpt-2", dir);
    ck_assert_int_eq(symlink(outside, p), 0);
    pd_err_clear(&e);
    ck_assert_int_eq(ckpt_dir_publish(tmp, dir, "ckpt-2", &e), PD_ERR_IO);
    pd_err_clear(&e);
    ck_assert_msg(ckpt_dir_publish(tmp, dir, "ckpt-3", &e) == PD_OK, "%s", e.msg);
    ck_assert(exists(dir, "ckpt-3"));
    /* the temporary is empty and ours: removable without a manifest */
    ck_assert_int_eq(ckpt_dir_make_tmp(dir, 4, tmp, sizeof tmp, &e), PD_OK);
    ck_assert_int_eq(ckpt_dir_remove(dir, strrchr(tmp, '/') + 1, 0, &e), PD_OK);
    ck_assert(access(tmp, F_OK) != 0);
}
END_TEST

START_TEST(ckpt_dir_check_refuses_files_and_wrapping_numbers)
{
    char p[1024];
    pd_err e = {0};
    snprintf(p, sizeof p, "%s/new", dir);
    ck_assert_msg(ckpt_dir_check(p, &e) == PD_OK, "%s", e.msg);
    ck_assert(exists(dir, "new"));
    put(dir, "afile", "x", 1);
    snprintf(p, sizeof p, "%s/afile", dir);
    ck_assert_int_eq(ckpt_dir_check(p, &e), PD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(e.msg, "is a regular file, not a directory"));
    pd_err_clear(&e);
    snprintf(p, sizeof p, "%s/afile/sub", dir);
    ck_assert_int_eq(ckpt_dir_check(p, &e), PD_ERR_IO);
    pd_err_clear(&e);
    sub("ckpt-18446744073709551615");
    ck_assert_int_eq(ckpt_dir_check(dir, &e), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "leaves no number for the next checkpoint"));
    /* the probe file is gone */
    ckpt_dir_scan s;
    ck_assert_int_eq(ckpt_dir_list(dir, &s, &e), PD_OK);
    ckpt_dir_scan_free(&s);
    ck_assert(!exists(dir, ".pipedec-probe"));
}
END_TEST

START_TEST(ckpt_dir_clean_stale_removes_only_pipedecs_temporaries)
{
    sub(".ckpt-3.AbCdEf");
    sub(".ckpt-4.tmp");
    sub(".ckpt-5.zzzzzz");
    sub(".ckpt-6.toolong1");
    char d[256];
    snprintf(d, sizeof d, "%s/.ckpt-3.AbCdEf", dir);
    put(d, "layer-00003.cmfb", "CMFB", 4);
    snprintf(d, sizeof d, "%s/.ckpt-5.zzzzzz", dir);
    put(d, "thesis.tex", "x", 1);
    char p[1024];
    snprintf(p, sizeof p, "%s/.ckpt-7.tmp", dir);
    ck_assert_int_eq(symlink(outside, p), 0);
    put(outside, "precious.txt", "keep", 4);
    ckpt_dir_clean_stale(dir);
    ck_assert(!exists(dir, ".ckpt-3.AbCdEf"));
    ck_assert(!exists(dir, ".ckpt-4.tmp"));
    ck_assert(exists(dir, ".ckpt-5.zzzzzz"));
    ck_assert(exists(dir, ".ckpt-6.toolong1"));
    ck_assert(exists(dir, ".ckpt-7.tmp"));
    ck_assert(exists(outside, "precious.txt"));
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("ckpt_dir");
    TCase *tc = tcase_create("names");
    tcase_add_test(tc, ckpt_dir_names_are_canonical_decimals_only);
    suite_add_tcase(s, tc);
    tc = tcase_create("directory");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, ckpt_dir_list_takes_real_directories_and_numbers_past_every_name);
    tcase_add_test(tc, ckpt_dir_remove_never_follows_a_link);
    tcase_add_test(tc, ckpt_dir_remove_leaves_a_directory_with_anything_foreign);
    tcase_add_test(tc, ckpt_dir_remove_needs_a_manifest_naming_the_checkpoint);
    tcase_add_test(tc, ckpt_dir_publish_never_replaces_an_entry);
    tcase_add_test(tc, ckpt_dir_check_refuses_files_and_wrapping_numbers);
    tcase_add_test(tc, ckpt_dir_clean_stale_removes_only_pipedecs_temporaries);
    suite_add_tcase(s, tc);
    return s;
}
