/* libFuzzer target: a --checkpoint-dir laid out by the input (directories
 * named like checkpoints or their temporaries, files, links into a sentinel
 * directory outside, links between entries, children of every kind), then
 * everything ckpt_dir.h does to such a directory: list, clean stale
 * temporaries, remove every canonical checkpoint with and without a
 * manifest requirement. Whatever the layout:
 *   - the sentinel directory outside keeps every file, byte for byte;
 *   - an entry is removed only when it was a real directory holding nothing
 *     but regular files with pipedec's names; a directory that stays keeps
 *     every child; nothing that is not a directory is ever removed;
 *   - list reports exactly the real directories with canonical names.
 * PD_FUZZ_SOURCES: cluster/runtime/ops/ckpt_dir.c cluster/runtime/ops/ckpt_manifest.c cluster/runtime/pipeline/stream.c cluster/runtime/pipeline/digest.c cluster/model/sample.c cache/attn.c cache/attn_avx512.c comm/rd.c comm/crc32c.c base/fp16.c base/cpu.c base/status.c base/fnv.c */
#include "cluster/runtime/ops/ckpt_dir.h"

#include <dirent.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_ASSERT(c)                                                                     \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "fuzz_ckpt_dir: %s:%d: %s\n", __FILE__, __LINE__, #c);       \
            abort();                                                                     \
        }                                                                                \
    } while (0)

#define MAX_ENT 12
#define MAX_KID 6

/* Names the input picks from (and can extend with a few bytes of its own). */
static const char *const top_names[] = {
    "ckpt-1", "ckpt-2", "ckpt-3", "ckpt-10", "ckpt-18446744073709551615", "ckpt-18446744073709551616",
    "ckpt--1", "ckpt-01", "ckpt-", ".ckpt-1.tmp", ".ckpt-2.AbCdEf", ".ckpt-3.zzzzzz", ".ckpt-4.toolong1",
    ".ckpt-01.abcdef", "notes", "ckpt-7x"};
static const char *const kid_names[] = {"manifest.pdck", "layer-00000.cmfb", "layer-00001.cmfb", "layer-1.cmfb",
                                        "manifest.pdck.tmp.AbCdEf", "thesis.tex", "layer-00002.cmfbx", ".hidden"};

typedef struct snap_ent {
    char name[64];
    int kind;          /* 0 dir, 1 file, 2 link */
    int n_kids;
    char kids[MAX_KID][64];
    int kid_kind[MAX_KID];
    int kid_ours[MAX_KID]; /* a regular file with a pipedec name and, for a bundle, the magic */
} snap_ent;

static char root[64], dir[96], outside[96];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)f;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static void put(const char *path, const uint8_t *b, size_t n)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
        return;
    if (n && write(fd, b, n) != (ssize_t)n)
        abort();
    close(fd);
}

static int is_pipedec_kid(const char *name, const uint8_t *content, size_t n)
{
    if (!strcmp(name, "manifest.pdck") || !strcmp(name, "manifest.pdck.tmp.AbCdEf"))
        return 1;
    if (!strncmp(name, "layer-", 6) && strlen(name) == 16 && !strcmp(name + 11, ".cmfb"))
        return n == 0 || (n >= 4 && !memcmp(content, "CMFB", 4));
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!root[0]) {
        snprintf(root, sizeof root, "/tmp/fuzz_ckpt_dir_XXXXXX");
        if (!mkdtemp(root))
            abort();
        snprintf(dir, sizeof dir, "%s/d", root);
        snprintf(outside, sizeof outside, "%s/outside", root);
    }
    nftw(dir, rm_one, 8, FTW_DEPTH | FTW_PHYS);
    nftw(outside, rm_one, 8, FTW_DEPTH | FTW_PHYS);
    FZ_ASSERT(mkdir(dir, 0755) == 0 && mkdir(outside, 0755) == 0);
    char p[512], q[512];
    static const uint8_t keep[] = "CMFB precious";
    snprintf(p, sizeof p, "%s/precious.cmfb", outside);
    put(p, keep, sizeof keep);
    snprintf(p, sizeof p, "%s/layer-00000.cmfb", outside);
    put(p, keep, sizeof keep);

    /* build the layout */
    snap_ent ent[MAX_ENT];
    int n_ent = 0;
    size_t at = 0;
    while (at + 2 <= size && n_ent < MAX_ENT) {
        snap_ent *e = &ent[n_ent];
        memset(e, 0, sizeof *e);
        uint8_t k = data[at++], nm = data[at++];
        snprintf(e->name, sizeof e->name, "%s", top_names[nm % (sizeof top_names / sizeof top_names[0])]);
        int dup = 0;
        for (int i = 0; i < n_ent; i++)
            dup |= !strcmp(ent[i].name, e->name);
        if (dup)
            continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->name);
        e->kind = k % 4 == 3 ? 2 : k % 4 == 2 ? 1 : 0;
        if (e->kind == 1) {
            put(p, data + at, at < size ? 1 : 0);
        } else if (e->kind == 2) {
            if (symlink((k & 4) ? outside : "outside-does-not-exist", p) != 0)
                continue;
        } else {
            FZ_ASSERT(mkdir(p, 0755) == 0);
            int kids = (k >> 2) % (MAX_KID + 1);
            for (int c = 0; c < kids && at + 2 <= size; c++) {
                uint8_t ck = data[at++], cn = data[at++];
                const char *kn = kid_names[cn % (sizeof kid_names / sizeof kid_names[0])];
                int seen = 0;
                for (int i = 0; i < e->n_kids; i++)
                    seen |= !strcmp(e->kids[i], kn);
                if (seen)
                    continue;
                snprintf(q, sizeof q, "%s/%s", p, kn);
                int kk = ck % 3; /* 0 file, 1 link outside, 2 directory */
                size_t clen = (ck >> 2) % 8;
                if (clen > size - at)
                    clen = size - at;
                if (kk == 0) {
                    put(q, data + at, clen);
                    at += clen;
                } else if (kk == 1) {
                    char t[256];
                    snprintf(t, sizeof t, "%s/layer-00000.cmfb", outside);
                    if (symlink((ck & 8) ? t : outside, q) != 0)
                        continue;
                } else if (mkdir(q, 0755) != 0)
                    continue;
                snprintf(e->kids[e->n_kids], sizeof e->kids[0], "%s", kn);
                e->kid_kind[e->n_kids] = kk == 0 ? 1 : kk == 1 ? 2 : 0;
                e->kid_ours[e->n_kids] = kk == 0 && is_pipedec_kid(kn, data + at - clen, clen);
                e->n_kids++;
            }
        }
        n_ent++;
    }

    /* list: exactly the real directories with canonical names */
    ckpt_dir_scan sc;
    pd_err err = {0};
    FZ_ASSERT(ckpt_dir_list(dir, &sc, &err) == PD_OK);
    uint32_t want = 0;
    for (int i = 0; i < n_ent; i++) {
        uint64_t s;
        want += ent[i].kind == 0 && ckpt_dir_parse_name(ent[i].name, &s);
    }
    FZ_ASSERT(sc.n == want);
    ckpt_dir_scan_free(&sc);

    /* everything that removes */
    ckpt_dir_clean_stale(dir);
    for (int i = 0; i < n_ent; i++) {
        uint64_t s;
        if (ckpt_dir_parse_name(ent[i].name, &s)) {
            pd_err e1 = {0};
            (void)ckpt_dir_remove(dir, ent[i].name, s, &e1);
        }
    }
    for (int i = 0; i < n_ent; i++) {
        pd_err e2 = {0};
        (void)ckpt_dir_remove(dir, ent[i].name, 0, &e2);
    }

    /* the sentinel is intact */
    uint8_t got[64];
    snprintf(p, sizeof p, "%s/precious.cmfb", outside);
    int fd = open(p, O_RDONLY);
    FZ_ASSERT(fd >= 0 && read(fd, got, sizeof got) == (ssize_t)sizeof keep && !memcmp(got, keep, sizeof keep));
    close(fd);
    snprintf(p, sizeof p, "%s/layer-00000.cmfb", outside);
    fd = open(p, O_RDONLY);
    FZ_ASSERT(fd >= 0 && read(fd, got, sizeof got) == (ssize_t)sizeof keep);
    close(fd);
    /* what went, went whole and was pipedec's; what stayed kept everything */
    for (int i = 0; i < n_ent; i++) {
        snap_ent *e = &ent[i];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, e->name);
        int gone = lstat(p, &sb) != 0;
        if (gone) {
            FZ_ASSERT(e->kind == 0);
            for (int c = 0; c < e->n_kids; c++)
                FZ_ASSERT(e->kid_ours[c]);
        } else {
            FZ_ASSERT((e->kind == 0) == (S_ISDIR(sb.st_mode) != 0));
            for (int c = 0; c < e->n_kids; c++) {
                snprintf(q, sizeof q, "%s/%s", p, e->kids[c]);
                FZ_ASSERT(lstat(q, &sb) == 0);
            }
        }
    }
    return 0;
}
