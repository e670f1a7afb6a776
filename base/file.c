/* Files on disk (file.h): checked opening and exact reads. */
#include "base/file.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
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
