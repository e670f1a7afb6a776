/* ckpt_dir: names, listing, probing and safe removal in a --checkpoint-dir
 * (rules in ckpt_dir.h). Every removal goes through directory descriptors
 * opened with O_NOFOLLOW, never through a path that a link could redirect. */
#include "cluster/runtime/ops/ckpt_dir.h"

#include "comm/bundle.h"
#include "cluster/runtime/ops/ckpt_manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef RENAME_NOREPLACE
#define RENAME_NOREPLACE (1 << 0)
#endif

#define CKPT_PREFIX "ckpt-"
#define CKPT_TMP_PREFIX ".ckpt-"

/* Canonical decimal 1..UINT64_MAX: digits only, no leading zero. */
static bool parse_seq(const char *s, const char **end, uint64_t *out)
{
    if (*s < '1' || *s > '9')
        return false;
    uint64_t v = 0;
    for (; *s >= '0' && *s <= '9'; s++) {
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *end = s;
    *out = v;
    return true;
}

bool ckpt_dir_parse_name(const char *name, uint64_t *seq)
{
    const char *end;
    uint64_t v;
    if (strncmp(name, CKPT_PREFIX, sizeof CKPT_PREFIX - 1) != 0 ||
        !parse_seq(name + sizeof CKPT_PREFIX - 1, &end, &v) || *end)
        return false;
    *seq = v;
    return true;
}

/* ".ckpt-SEQ." followed by mkdtemp's 6 characters, or the ".ckpt-SEQ.tmp"
 * of earlier versions. */
static bool is_tmp_name(const char *name)
{
    const char *end;
    uint64_t v;
    if (strncmp(name, CKPT_TMP_PREFIX, sizeof CKPT_TMP_PREFIX - 1) != 0 ||
        !parse_seq(name + sizeof CKPT_TMP_PREFIX - 1, &end, &v) || *end != '.')
        return false;
    if (strcmp(end, ".tmp") == 0)
        return true;
    if (strlen(end + 1) != 6)
        return false;
    for (const char *c = end + 1; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9')))
            return false;
    return true;
}

static const char *kind_of(mode_t m)
{
    return S_ISLNK(m) ? "a symbolic link" : S_ISREG(m) ? "a regular file" : S_ISDIR(m) ? "a directory" : "a special file";
}

/* ---- listing -------------------------------------------------------------------- */

static void note_foreign(ckpt_dir_scan *s, const char *name, const char *why)
{
    if (s->n_foreign < sizeof s->foreign / sizeof s->foreign[0])
        snprintf(s->foreign[s->n_foreign], sizeof s->foreign[0], "%.160s (%s)", name, why);
    s->n_foreign++;
}

pd_status ckpt_dir_list(const char *dir, ckpt_dir_scan *out, pd_err *err)
{
    *out = (ckpt_dir_scan){0};
    DIR *d = opendir(dir);
    if (!d)
        return PD_OK;
    int dfd = dirfd(d);
    uint32_t cap = 0;
    pd_status st = PD_OK;
    struct dirent *de;
    while (st == PD_OK && (de = readdir(d))) {
        uint64_t seq;
        bool canon = ckpt_dir_parse_name(de->d_name, &seq);
        if (!canon) {
            if (strncmp(de->d_name, CKPT_PREFIX, sizeof CKPT_PREFIX - 1) == 0)
                note_foreign(out, de->d_name, "not a canonical checkpoint number");
            continue;
        }
        if (seq > out->max_seq)
            out->max_seq = seq;
        struct stat sb;
        if (fstatat(dfd, de->d_name, &sb, AT_SYMLINK_NOFOLLOW) != 0)
            continue; /* gone since readdir */
        if (!S_ISDIR(sb.st_mode)) {
            note_foreign(out, de->d_name, kind_of(sb.st_mode));
            continue;
        }
        if (out->n == cap) {
            cap = cap ? 2 * cap : 8;
            uint64_t *ns = cap <= UINT32_MAX / 2 ? realloc(out->seqs, (size_t)cap * sizeof *ns) : NULL;
            if (!ns) {
                st = pd_err_set(err, PD_ERR_NOMEM, "checkpoint: %s: out of memory listing it", dir);
                break;
            }
            out->seqs = ns;
        }
        out->seqs[out->n++] = seq;
    }
    closedir(d);
    if (st) {
        ckpt_dir_scan_free(out);
        return st;
    }
    for (uint32_t i = 1; i < out->n; i++) /* newest first */
        for (uint32_t j = i; j > 0 && out->seqs[j] > out->seqs[j - 1]; j--) {
            uint64_t t = out->seqs[j];
            out->seqs[j] = out->seqs[j - 1];
            out->seqs[j - 1] = t;
        }
    return PD_OK;
}

void ckpt_dir_scan_free(ckpt_dir_scan *s)
{
    free(s->seqs);
    *s = (ckpt_dir_scan){0};
}

/* ---- start-up check ---------------------------------------------------------------- */

pd_status ckpt_dir_check(const char *dir, pd_err *err)
{
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        if (errno != ENOENT)
            return pd_err_set(err, PD_ERR_IO, "--checkpoint-dir %s: %s", dir, strerror(errno));
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return pd_err_set(err, PD_ERR_IO, "--checkpoint-dir %s: cannot create it: %s", dir, strerror(errno));
        if (stat(dir, &sb) != 0)
            return pd_err_set(err, PD_ERR_IO, "--checkpoint-dir %s: %s", dir, strerror(errno));
    }
    if (!S_ISDIR(sb.st_mode))
        return pd_err_set(err, PD_ERR_ARG, "--checkpoint-dir %s: is %s, not a directory", dir, kind_of(sb.st_mode));
    /* a probe file: created, written, fsynced, removed */
    char probe[PATH_MAX];
    char host[64] = "host";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = 0;
    if ((size_t)snprintf(probe, sizeof probe, "%s/.pipedec-probe-%s-%ld-XXXXXX", dir, host, (long)getpid()) >=
        sizeof probe)
        return pd_err_set(err, PD_ERR_ARG, "--checkpoint-dir %s: path too long", dir);
    int fd = mkostemp(probe, O_CLOEXEC);
    if (fd < 0)
        return pd_err_set(err, PD_ERR_IO, "--checkpoint-dir %s: cannot write there: %s", dir, strerror(errno));
    static const char text[] = "pipedec checkpoint-dir probe\n";
    int e = 0;
    if (write(fd, text, sizeof text - 1) != (ssize_t)(sizeof text - 1))
        e = errno ? errno : EIO;
    else if (fsync(fd) != 0)
        e = errno;
    if (close(fd) != 0 && !e)
        e = errno;
    unlink(probe);
    if (e)
        return pd_err_set(err, PD_ERR_IO, "--checkpoint-dir %s: writing a probe file failed: %s", dir, strerror(e));
    ckpt_dir_scan s;
    pd_status st = ckpt_dir_list(dir, &s, err);
    if (st == PD_OK && s.max_seq == UINT64_MAX)
        st = pd_err_set(err, PD_ERR_RANGE,
                        "--checkpoint-dir %s: ckpt-%llu leaves no number for the next checkpoint; move it away",
                        dir, (unsigned long long)UINT64_MAX);
    ckpt_dir_scan_free(&s);
    return st;
}

/* ---- removal ------------------------------------------------------------------------ */

/* A layer bundle name: layer-NNNNN.cmfb (5 or more digits). */
static bool is_layer_name(const char *n)
{
    if (strncmp(n, "layer-", 6) != 0)
        return false;
    size_t digits = strspn(n + 6, "0123456789");
    return digits >= 5 && strcmp(n + 6 + digits, ".cmfb") == 0;
}

static bool is_manifest_tmp(const char *n)
{
    return strncmp(n, "manifest.pdck.tmp.", 18) == 0 && strlen(n) == 24;
}

/* Reads the first len bytes of dfd/name (a regular file, no link followed). */
static ssize_t read_head(int dfd, const char *name, void *buf, size_t len)
{
    int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, len);
    close(fd);
    return n;
}

/* Does dfd/manifest.pdck (a regular file) decode and say seq? */
static bool manifest_says(int dfd, uint64_t seq)
{
    int fd = openat(dfd, "manifest.pdck", O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return false;
    struct stat sb;
    bool ok = false;
    if (fstat(fd, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size > 0 && sb.st_size < (1 << 30)) {
        size_t n = (size_t)sb.st_size;
        uint8_t *b = malloc(n);
        size_t got = 0;
        while (b && got < n) {
            ssize_t r = read(fd, b + got, n - got);
            if (r <= 0)
                break;
            got += (size_t)r;
        }
        if (b && got == n) {
            stream_limits lim = {.max_new = UINT32_MAX - 1, .max_prefill = UINT64_MAX};
            ckpt_manifest m = {0};
            pd_err e = {0};
            if (ckpt_manifest_decode(b, n, &lim, 1u << 20, &m, &e) == PD_OK) {
                ok = m.seq == seq;
                ckpt_manifest_free(&m);
            }
        }
        free(b);
    }
    close(fd);
    return ok;
}

bool ckpt_dir_is_checkpoint(const char *dir, uint64_t seq)
{
    char name[32];
    snprintf(name, sizeof name, CKPT_PREFIX "%llu", (unsigned long long)seq);
    int pfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0)
        return false;
    int dfd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    close(pfd);
    if (dfd < 0)
        return false;
    bool ok = manifest_says(dfd, seq);
    close(dfd);
    return ok;
}

pd_status ckpt_dir_remove(const char *dir, const char *name, uint64_t expect_seq, pd_err *err)
{
    int pfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0)
        return pd_err_set(err, PD_ERR_IO, "checkpoint: %s: %s", dir, strerror(errno));
    struct stat sb;
    if (fstatat(pfd, name, &sb, AT_SYMLINK_NOFOLLOW) != 0) {
        int e = errno;
        close(pfd);
        return e == ENOENT ? PD_OK : pd_err_set(err, PD_ERR_IO, "checkpoint: %s/%s: %s", dir, name, strerror(e));
    }
    if (!S_ISDIR(sb.st_mode)) {
        close(pfd);
        return pd_err_set(err, PD_ERR_REFUSED, "%s/%s is %s, not a directory pipedec wrote: left in place", dir,
                          name, kind_of(sb.st_mode));
    }
    int dfd = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (dfd < 0) {
        int e = errno;
        close(pfd);
        return pd_err_set(err, e == ELOOP || e == ENOTDIR ? PD_ERR_REFUSED : PD_ERR_IO,
                          "%s/%s: cannot open it without following a link: %s; left in place", dir, name,
                          strerror(e));
    }
    pd_status st = PD_OK;
    if (expect_seq && !manifest_says(dfd, expect_seq))
        st = pd_err_set(err, PD_ERR_REFUSED,
                        "%s/%s has no manifest of checkpoint %llu that pipedec can read: not removed", dir, name,
                        (unsigned long long)expect_seq);
    /* first pass: is every entry one of ours? nothing is removed otherwise */
    DIR *d = NULL;
    int lfd = st == PD_OK ? dup(dfd) : -1;
    if (st == PD_OK && (lfd < 0 || !(d = fdopendir(lfd)))) {
        if (lfd >= 0)
            close(lfd);
        st = pd_err_set(err, PD_ERR_IO, "checkpoint: %s/%s: %s", dir, name, strerror(errno));
    }
    struct dirent *de;
    while (st == PD_OK && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        struct stat fb;
        bool ours = fstatat(dfd, de->d_name, &fb, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(fb.st_mode) &&
                    (!strcmp(de->d_name, "manifest.pdck") || is_manifest_tmp(de->d_name) ||
                     is_layer_name(de->d_name));
        if (ours && is_layer_name(de->d_name) && fb.st_size > 0) {
            char magic[4];
            ours = read_head(dfd, de->d_name, magic, 4) == 4 && memcmp(magic, BUNDLE_MAGIC, 4) == 0;
        }
        if (!ours)
            st = pd_err_set(err, PD_ERR_REFUSED, "%s/%s holds %s, which pipedec did not write there: not removed", dir,
                            name, de->d_name);
    }
    /* second pass: remove them, then the directory */
    if (st == PD_OK) {
        rewinddir(d);
        while (st == PD_OK && (de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && unlinkat(dfd, de->d_name, 0) != 0 &&
                errno != ENOENT)
                st = pd_err_set(err, PD_ERR_IO, "checkpoint: %s/%s/%s: unlink: %s", dir, name, de->d_name,
                                strerror(errno));
        if (st == PD_OK && unlinkat(pfd, name, AT_REMOVEDIR) != 0)
            st = pd_err_set(err, PD_ERR_IO, "checkpoint: %s/%s: rmdir: %s", dir, name, strerror(errno));
    }
    if (d)
        closedir(d);
    close(dfd);
    close(pfd);
    return st;
}

/* ---- temporary directories and publishing --------------------------------------------- */

pd_status ckpt_dir_make_tmp(const char *dir, uint64_t seq, char *out, size_t cap, pd_err *err)
{
    if ((size_t)snprintf(out, cap, "%s/" CKPT_TMP_PREFIX "%llu.XXXXXX", dir, (unsigned long long)seq) >= cap)
        return pd_err_set(err, PD_ERR_ARG, "checkpoint: %s: path too long", dir);
    if (!mkdtemp(out))
        return pd_err_set(err, PD_ERR_IO, "checkpoint: %s: cannot create a temporary directory: %s", dir,
                          strerror(errno));
    return PD_OK;
}

pd_status ckpt_dir_publish(const char *tmp, const char *dir, const char *name, pd_err *err)
{
    int pfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pfd < 0)
        return pd_err_set(err, PD_ERR_IO, "checkpoint: %s: %s", dir, strerror(errno));
    int rc = renameat2(AT_FDCWD, tmp, pfd, name, RENAME_NOREPLACE);
    if (rc != 0 && (errno == EINVAL || errno == ENOSYS)) {
        /* no RENAME_NOREPLACE here (NFS, old kernels): check, then rename */
        struct stat sb;
        if (fstatat(pfd, name, &sb, AT_SYMLINK_NOFOLLOW) == 0)
            errno = EEXIST;
        else
            rc = renameat(AT_FDCWD, tmp, pfd, name);
    }
    int e = errno;
    close(pfd);
    if (rc != 0)
        return pd_err_set(err, PD_ERR_IO, "checkpoint: publishing %s as %s/%s: %s%s", tmp, dir, name, strerror(e),
                          e == EEXIST ? " (an entry of that name appeared; it is left as it is)" : "");
    return PD_OK;
}

void ckpt_dir_clean_stale(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    char (*names)[256] = NULL;
    size_t n = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (is_tmp_name(de->d_name) && strlen(de->d_name) < 256) {
            if (n == cap) {
                size_t nc = cap ? 2 * cap : 4;
                void *nn = nc < 4096 ? realloc(names, nc * sizeof *names) : NULL;
                if (!nn)
                    break;
                names = nn;
                cap = nc;
            }
            snprintf(names[n++], 256, "%s", de->d_name);
        }
    closedir(d);
    for (size_t i = 0; i < n; i++) {
        pd_err e = {0};
        if (ckpt_dir_remove(dir, names[i], 0, &e) != PD_OK)
            fprintf(stderr, "pipedec: checkpoint-dir: %s\n", e.msg);
        else
            fprintf(stderr, "pipedec: checkpoint-dir: removed %s/%s, left by an interrupted checkpoint\n", dir,
                    names[i]);
    }
    free(names);
}
