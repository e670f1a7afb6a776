/* LD_PRELOAD shim for end-to-end tests: makes the file named by
 * PD_FULL_DISK_PATH (a shell pattern, fnmatch(3), matched against the open
 * file's absolute path) behave like a disk that fills up after
 * PD_FULL_DISK_BYTES bytes: a write that crosses the limit writes what fits,
 * the next one fails with ENOSPC. Every other file is untouched. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fnmatch.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

ssize_t write(int fd, const void *buf, size_t n);

static int is_target(int fd, off_t *size)
{
    const char *want = getenv("PD_FULL_DISK_PATH");
    if (!want)
        return 0;
    char link[64], got[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t k = readlink(link, got, sizeof got - 1);
    if (k <= 0)
        return 0;
    got[k] = '\0';
    struct stat sb;
    if (fnmatch(want, got, FNM_PATHNAME) != 0 || fstat(fd, &sb) != 0)
        return 0;
    *size = sb.st_size;
    return 1;
}

ssize_t write(int fd, const void *buf, size_t n)
{
    static ssize_t (*real)(int, const void *, size_t);
    if (!real)
        real = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    off_t size;
    if (n > 0 && is_target(fd, &size)) {
        off_t limit = (off_t)atoll(getenv("PD_FULL_DISK_BYTES") ? getenv("PD_FULL_DISK_BYTES") : "0");
        if (size >= limit) {
            errno = ENOSPC;
            return -1;
        }
        if ((off_t)n > limit - size)
            n = (size_t)(limit - size);
    }
    return real(fd, buf, n);
}
