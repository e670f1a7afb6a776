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
 * Publishing: a new file appears at its path complete or not at all, even
 * across a crash or power loss. pd_file_publish_begin creates a temporary
 * file beside the target ("<path>.tmp.XXXXXX", same directory so the rename
 * is atomic); the caller writes it; pd_file_publish_commit flushes and fsyncs
 * it, renames it over the target and fsyncs the directory so the rename
 * itself is durable; pd_file_publish_abort (or any failure) removes it. The
 * target holds the old file or the complete new one, never a mix.
 *
 * Errors name the caller's context, the path and the failing step:
 *   "npy: emb/p3.npy: cannot open: No such file or directory"
 *   "npy: emb/p3.npy: offset 128: file ended early (changed while read?)"
 *   "gguf writer: out/m.gguf: fsync out/m.gguf.tmp.Xa31Qz: No space left on device"
 * The "CTX: " part is left out when ctx is NULL. POSIX only. */
#ifndef PD_FILE_H
#define PD_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

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

/* ---- atomic publish -------------------------------------------------------- */

/* A file being written for publishing: the open temporary file and the
 * target's name.
 * INV: between begin and commit / abort the temporary file exists, its
 *      descriptor is open (owned by the stream once one was asked for), and
 *      the target is untouched. */
/* The whole regular file at path in a new buffer (owned, free()), with a NUL
 * after its *len bytes so text parsers may treat it as a string; the same
 * checks and messages as pd_file_open_read and pd_file_read_at (ctx may be
 * NULL). */
pd_status pd_file_read_all(const char *path, const char *ctx, uint8_t **out, size_t *len, pd_err *err);

typedef struct pd_publish pd_publish;

/* Creates the temporary file for publishing at path with permission bits
 * mode (applied exactly, the umask does not narrow them; 0644 for ordinary
 * output). ctx (borrowed: a string that outlives *out, e.g. a literal) starts
 * every message. On PD_OK *out is owned: end it with exactly one
 * pd_file_publish_commit or pd_file_publish_abort. On failure nothing is
 * created and *out is untouched. */
pd_status pd_file_publish_begin(const char *path, unsigned mode, const char *ctx,
                                pd_publish **out, pd_err *err);

/* The temporary file's descriptor, for writers that take one (write(2),
 * comm/rd.h's wr_sink_fd). Borrowed: do not close it. Do not mix with the
 * stream below. */
int pd_file_publish_fd(const pd_publish *p);

/* The temporary file's path (borrowed, valid until commit / abort). */
const char *pd_file_publish_tmp_path(const pd_publish *p);

/* Writes all of bytes[0..n) at the end of the temporary file (retrying short
 * writes and EINTR). A failure fails the publish: commit then only cleans up
 * and returns it. */
pd_status pd_file_publish_write(pd_publish *p, const void *bytes, size_t n, pd_err *err);

/* A stdio stream on the temporary file for formatted output (fprintf);
 * borrowed, closed by commit / abort (do not fclose it). The same stream on
 * every call; NULL and err set when it cannot be made. Stream errors are
 * caught at commit (fflush / ferror). */
FILE *pd_file_publish_stream(pd_publish *p, pd_err *err);

/* Publishes: flushes the stream if any, fsyncs and closes the temporary file,
 * renames it over the target and fsyncs the target's directory. Always frees
 * p. On a failure before the rename the temporary file is removed and the
 * target is untouched. If only the final directory fsync fails, the new file
 * is already in place (PD_ERR_IO says so: the rename may not survive a crash).
 * A file system that cannot sync directories at all (fsync EINVAL) is not
 * an error: there is nothing more to do there. */
pd_status pd_file_publish_commit(pd_publish *p, pd_err *err);

/* Gives up: closes and removes the temporary file, leaves the target as it
 * was, frees p. pd_file_publish_abort(NULL) is a no-op. */
void pd_file_publish_abort(pd_publish *p);

/* True when paths a and b name the same file: the same device and inode
 * when both exist, else the same absolute path once each one's directory is
 * resolved (symlinks, "..", relative paths), so an output that does not
 * exist yet is still caught when it would land on an input. */
bool pd_file_same(const char *a, const char *b);

#endif
