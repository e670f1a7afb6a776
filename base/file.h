/* file: files on disk the way every reader and writer of the project needs
 * them, so each check is written once.
 *
 * Reading: pd_file_open_read opens an existing file and refuses anything that
 * is not a regular file (a directory reads as garbage or EISDIR, a fifo blocks
 * and has no size, a device has a meaningless size), and hands back its size
 * so a parser can check counts against it (a fifo is refused without waiting
 * for a writer). pd_file_read_at reads an exact byte range and tells a short
 * file from an i/o error.
 *
 * Errors name the caller's context, the path and the failing step:
 *   "npy: emb/p3.npy: cannot open: No such file or directory"
 *   "npy: emb/p3.npy: offset 128: file ended early (changed while read?)"
 * The "CTX: " part is left out when ctx is NULL. POSIX only; no allocation. */
#ifndef PD_FILE_H
#define PD_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Opens path read-only (close-on-exec) and checks that it is a regular file.
 * On PD_OK *fd is an open descriptor the caller closes and *size the file's
 * size in bytes. On failure nothing stays open, *fd and *size are untouched,
 * and err says "CTX: PATH: cannot open: <reason>", "...: stat: <reason>" or
 * "...: not a regular file" (PD_ERR_IO, or PD_ERR_ARG for a NULL argument). */
pd_status pd_file_open_read(const char *path, const char *ctx, int *fd, uint64_t *size,
                            pd_err *err);

/* The same checks on a descriptor the caller opened itself (for instance
 * read-write): PD_OK and *size when fd is a regular file; path and ctx only
 * name it in messages. Closes nothing. */
pd_status pd_file_check_regular(int fd, const char *path, const char *ctx, uint64_t *size,
                                pd_err *err);

/* Reads exactly n bytes at byte offset off into dst, retrying short reads and
 * EINTR. PD_ERR_TRUNCATED "CTX: PATH: offset O: file ended early (changed
 * while read?)" when the file ends first (O is where it ended), PD_ERR_IO
 * "CTX: PATH: offset O: read: <reason>" on an error. dst's contents are
 * unspecified on failure. */
pd_status pd_file_read_at(int fd, void *dst, size_t n, uint64_t off, const char *path,
                          const char *ctx, pd_err *err);

#endif
