/* Files on disk (file.h): checked opening, exact reads and atomic publishing.
 * Owns nothing beyond a pd_publish between its begin and commit / abort. */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "CTX: " or "" for messages, and the path as named in them. */
#define FILE_CTX(ctx) (ctx) ? (ctx) : "", (ctx) ? ": " : ""
#define FILE_NAME(path) ((path) ? (path) : "<file>")

pd_status pd_file_check_regular(int fd, const char *path, const char *ctx, uint64_t *size,
                                pd_err *err)
{
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return pd_err_set(err, PD_ERR_IO, "%s%s%s: stat: %s", FILE_CTX(ctx), FILE_NAME(path),
                          strerror(errno));
    if (!S_ISREG(sb.st_mode))
        return pd_err_set(err, PD_ERR_IO, "%s%s%s: not a regular file", FILE_CTX(ctx),
                          FILE_NAME(path));
    *size = (uint64_t)sb.st_size;
    return PD_OK;
}

pd_status pd_file_open_read(const char *path, const char *ctx, int *fd, uint64_t *size,
                            pd_err *err)
{
    if (!path || !fd || !size)
        return pd_err_set(err, PD_ERR_ARG, "%s%sopen needs a path, a descriptor and a size",
                          FILE_CTX(ctx));
    /* O_NONBLOCK: opening a fifo must not wait for a writer before the
     * check below refuses it; it is cleared again for the regular file. */
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0)
        return pd_err_set(err, PD_ERR_IO, "%s%s%s: cannot open: %s", FILE_CTX(ctx), path,
                          strerror(errno));
    uint64_t sz = 0;
    pd_status st = pd_file_check_regular(f, path, ctx, &sz, err);
    int fl = st == PD_OK ? fcntl(f, F_GETFL) : 0;
    if (st == PD_OK && (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0))
        st = pd_err_set(err, PD_ERR_IO, "%s%s%s: fcntl: %s", FILE_CTX(ctx), path, strerror(errno));
    if (st != PD_OK) {
        close(f);
        return st;
    }
    *fd = f;
    *size = sz;
    return PD_OK;
}

pd_status pd_file_read_at(int fd, void *dst, size_t n, uint64_t off, const char *path,
                          const char *ctx, pd_err *err)
{
    unsigned char *p = dst;
    while (n) {
        /* pread takes at most SSIZE_MAX; 1 GiB steps stay far below it */
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t r = pread(fd, p, chunk, (off_t)off);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return pd_err_set(err, PD_ERR_IO, "%s%s%s: offset %" PRIu64 ": read: %s", FILE_CTX(ctx),
                              FILE_NAME(path), off, strerror(errno));
        }
        if (r == 0)
            return pd_err_set(err, PD_ERR_TRUNCATED,
                              "%s%s%s: offset %" PRIu64 ": file ended early (changed while read?)",
                              FILE_CTX(ctx), FILE_NAME(path), off);
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return PD_OK;
}

/* ---- atomic publish -------------------------------------------------------- */

struct pd_publish {
    int fd;           /* the temporary file; owned by stream once that is set */
    FILE *stream;     /* fdopen(fd) once pd_file_publish_stream was called */
    char *path;       /* the target (owned copy) */
    char *tmp;        /* the temporary file's path (owned) */
    const char *ctx;  /* message prefix (borrowed) or NULL */
    pd_status status; /* first failed write: commit refuses to publish after it */
};

pd_status pd_file_publish_begin(const char *path, unsigned mode, const char *ctx,
                                pd_publish **out, pd_err *err)
{
    if (!path || !path[0] || !out)
        return pd_err_set(err, PD_ERR_ARG, "%s%spublish needs a path and an output",
                          FILE_CTX(ctx));
    static const char suffix[] = ".tmp.XXXXXX";
    size_t plen = strlen(path);
    pd_publish *p = calloc(1, sizeof *p);
    char *tmp = plen < SIZE_MAX - sizeof suffix ? malloc(plen + sizeof suffix) : NULL;
    char *copy = strdup(path);
    if (!p || !tmp || !copy) {
        free(p);
        free(tmp);
        free(copy);
        return pd_err_set(err, PD_ERR_NOMEM, "%s%s%s: no memory to publish it", FILE_CTX(ctx), path);
    }
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, suffix, sizeof suffix);
    /* Same directory as the target: rename(2) is atomic only within one
     * file system. A unique name: two writers never share a temporary file. */
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        pd_status st = pd_err_set(err, PD_ERR_IO, "%s%s%s: create a temporary file beside it: %s",
                                  FILE_CTX(ctx), path, strerror(errno));
        free(p);
        free(tmp);
        free(copy);
        return st;
    }
    if (fchmod(fd, (mode_t)(mode & 07777)) != 0) {
        pd_status st = pd_err_set(err, PD_ERR_IO, "%s%s%s: chmod %s: %s", FILE_CTX(ctx), path, tmp,
                                  strerror(errno));
        close(fd);
        unlink(tmp);
        free(p);
        free(tmp);
        free(copy);
        return st;
    }
    *p = (pd_publish){.fd = fd, .path = copy, .tmp = tmp, .ctx = ctx, .status = PD_OK};
    *out = p;
    return PD_OK;
}

int pd_file_publish_fd(const pd_publish *p) { return p->fd; }

const char *pd_file_publish_tmp_path(const pd_publish *p) { return p->tmp; }

pd_status pd_file_publish_write(pd_publish *p, const void *bytes, size_t n, pd_err *err)
{
    if (p->status != PD_OK)
        return p->status;
    const unsigned char *b = bytes;
    while (n) {
        size_t chunk = n > ((size_t)1 << 30) ? ((size_t)1 << 30) : n;
        ssize_t w = write(p->fd, b, chunk);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return p->status = pd_err_set(err, PD_ERR_IO, "%s%s%s: write %s: %s", FILE_CTX(p->ctx),
                                          p->path, p->tmp,
                                          w < 0 ? strerror(errno) : "no progress");
        b += w;
        n -= (size_t)w;
    }
    return PD_OK;
}

FILE *pd_file_publish_stream(pd_publish *p, pd_err *err)
{
    if (!p->stream) {
        p->stream = fdopen(p->fd, "wb");
        if (!p->stream)
            pd_err_set(err, PD_ERR_IO, "%s%s%s: open a stream on %s: %s", FILE_CTX(p->ctx), p->path,
                       p->tmp, strerror(errno));
    }
    return p->stream;
}

static void publish_free(pd_publish *p)
{
    free(p->path);
    free(p->tmp);
    free(p);
}

/* Closes the temporary file (through its stream if it has one); errno on failure. */
static int publish_close(pd_publish *p)
{
    int rc = p->stream ? fclose(p->stream) : close(p->fd);
    p->stream = NULL;
    p->fd = -1;
    return rc;
}

void pd_file_publish_abort(pd_publish *p)
{
    if (!p)
        return;
    if (p->fd >= 0)
        (void)publish_close(p);
    unlink(p->tmp);
    publish_free(p);
}

/* fsyncs the directory holding path, so a rename in it survives a crash. */
static pd_status publish_sync_dir(const pd_publish *p, pd_err *err)
{
    const char *slash = strrchr(p->path, '/');
    char *dir = slash ? strndup(p->path, slash == p->path ? 1 : (size_t)(slash - p->path))
                      : strdup(".");
    if (!dir)
        return pd_err_set(err, PD_ERR_NOMEM, "%s%s%s: no memory", FILE_CTX(p->ctx), p->path);
    pd_status st = PD_OK;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    /* EINVAL: a file system that cannot sync a directory (nothing to do). */
    if (fd < 0 || (fsync(fd) != 0 && errno != EINVAL))
        st = pd_err_set(err, PD_ERR_IO,
                        "%s%s%s: fsync directory %s: %s (the new file is in place; its rename "
                        "may not survive a crash)",
                        FILE_CTX(p->ctx), p->path, dir, strerror(errno));
    if (fd >= 0)
        close(fd);
    free(dir);
    return st;
}

pd_status pd_file_publish_commit(pd_publish *p, pd_err *err)
{
    if (!p)
        return pd_err_set(err, PD_ERR_ARG, "publish: commit without a begin");
    pd_status st = p->status;
    const char *step = NULL;
    int e = 0;
    if (st == PD_OK && p->stream) {
        errno = 0;
        if (fflush(p->stream) != 0 || ferror(p->stream))
            step = "write", e = errno;
    }
    if (st == PD_OK && !step && fsync(p->fd) != 0)
        step = "fsync", e = errno;
    if (step)
        st = pd_err_set(err, PD_ERR_IO, "%s%s%s: %s %s: %s", FILE_CTX(p->ctx), p->path, step,
                        p->tmp, e ? strerror(e) : "stream error");
    if (publish_close(p) != 0 && st == PD_OK)
        st = pd_err_set(err, PD_ERR_IO, "%s%s%s: close %s: %s", FILE_CTX(p->ctx), p->path, p->tmp,
                        strerror(errno));
    if (st == PD_OK && rename(p->tmp, p->path) != 0)
        st = pd_err_set(err, PD_ERR_IO, "%s%s%s: rename %s over it: %s", FILE_CTX(p->ctx), p->path,
                        p->tmp, strerror(errno));
    if (st != PD_OK) {
        unlink(p->tmp);
        publish_free(p);
        return st;
    }
    st = publish_sync_dir(p, err);
    publish_free(p);
    return st;
}

/* The absolute path of p with its directory resolved (the file itself need
 * not exist); NULL when the directory cannot be resolved. Owned. */
static char *file_canonical(const char *p)
{
    const char *slash = strrchr(p, '/');
    char *dir = slash ? strndup(p, (size_t)(slash - p) + (slash == p)) : strdup(".");
    const char *base = slash ? slash + 1 : p;
    char *real = dir ? realpath(dir, NULL) : NULL;
    free(dir);
    if (!real)
        return NULL;
    size_t n = strlen(real) + strlen(base) + 2;
    char *out = malloc(n);
    if (out)
        snprintf(out, n, "%s%s%s", real, strcmp(real, "/") == 0 ? "" : "/", base);
    free(real);
    return out;
}

bool pd_file_same(const char *a, const char *b)
{
    struct stat sa, sb;
    if (stat(a, &sa) == 0 && stat(b, &sb) == 0)
        return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
    char *ca = file_canonical(a), *cb = file_canonical(b);
    bool same = ca && cb && strcmp(ca, cb) == 0;
    free(ca);
    free(cb);
    return same;
}

pd_status pd_file_read_all(const char *path, const char *ctx, uint8_t **out, size_t *len, pd_err *err)
{
    int fd = -1;
    uint64_t size = 0;
    pd_status st = pd_file_open_read(path, ctx, &fd, &size, err);
    if (st != PD_OK)
        return st;
    uint8_t *b = size < SIZE_MAX ? malloc((size_t)size + 1) : NULL;
    if (!b) {
        close(fd);
        return pd_err_set(err, PD_ERR_NOMEM, "%s%s%s: no memory for %" PRIu64 " bytes", ctx ? ctx : "",
                          ctx ? ": " : "", path, size);
    }
    st = pd_file_read_at(fd, b, (size_t)size, 0, path, ctx, err);
    close(fd);
    if (st != PD_OK) {
        free(b);
        return st;
    }
    b[size] = '\0';
    *out = b;
    *len = (size_t)size;
    return PD_OK;
}
