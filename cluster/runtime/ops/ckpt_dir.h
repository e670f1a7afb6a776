/* ckpt_dir: the --checkpoint-dir D as a place pipedec shares with its user.
 *
 * D holds checkpoints ckpt-SEQ/ (published) and .ckpt-SEQ.XXXXXX/ (being
 * written), and whatever else the user keeps there. pipedec must never
 * harm the latter, so every rule here is about what it may touch:
 *
 * - Names: a checkpoint is exactly "ckpt-" and a canonical decimal SEQ
 *   (1 .. UINT64_MAX, no sign, no leading zero). Anything else ("ckpt--1",
 *   "ckpt-007", a 21-digit number) is a foreign name: listed as such and
 *   never used to decide what is resumed, numbered or removed.
 * - Links: nothing is followed. A checkpoint name that is a symbolic link,
 *   a file or anything but a real directory is foreign.
 * - Removal: only a real directory holding nothing but files pipedec writes
 *   there (manifest.pdck, layer-NNNNN.cmfb starting with the bundle magic,
 *   and the publish temporaries manifest.pdck.tmp.XXXXXX), each a regular
 *   file, removed through directory descriptors (unlinkat), so a link
 *   swapped in meanwhile is never followed. A published checkpoint is
 *   removed only when its manifest decodes and names its own SEQ. Anything
 *   else is left in place and the reason is returned.
 * - Numbers: the next checkpoint is one past the highest canonical SEQ of
 *   any entry (link, file or directory), so it never collides; a SEQ of
 *   UINT64_MAX leaves no next one and is refused at start-up.
 */
#ifndef PD_RUNTIME_CKPT_DIR_H
#define PD_RUNTIME_CKPT_DIR_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The published checkpoints of D and what else is there. */
typedef struct ckpt_dir_scan {
    uint64_t *seqs;     /* [n] real directories named ckpt-SEQ, newest first; owned */
    uint32_t n;
    uint64_t max_seq;   /* the highest canonical SEQ of any entry (0: none) */
    uint32_t n_foreign; /* entries named like checkpoints that are not (links, files, odd names) */
    char foreign[8][256]; /* the first few of them with why, for messages */
} ckpt_dir_scan;

/* true when name is "ckpt-" and a canonical decimal 1..UINT64_MAX (*seq). */
bool ckpt_dir_parse_name(const char *name, uint64_t *seq);

/* Start-up check of D on a rank that writes there: created when absent
 * (its parent must exist), a directory, and writable: a probe file is
 * written, fsynced and removed. Also refuses a D whose highest SEQ leaves
 * no room for the next checkpoint. The error names D and what is wrong. */
pd_status ckpt_dir_check(const char *dir, pd_err *err);

/* Lists D (see above). A D that cannot be opened lists nothing; only an
 * allocation failure is an error. Free with ckpt_dir_scan_free. */
pd_status ckpt_dir_list(const char *dir, ckpt_dir_scan *out, pd_err *err);
void ckpt_dir_scan_free(ckpt_dir_scan *s);

/* Makes a new, empty temporary directory D/.ckpt-SEQ.XXXXXX (mkdtemp: a
 * name nobody else holds) and writes its path to out. */
pd_status ckpt_dir_make_tmp(const char *dir, uint64_t seq, char *out, size_t cap, pd_err *err);

/* true when D/ckpt-SEQ is a real directory whose manifest decodes and says
 * SEQ: a checkpoint pipedec wrote. */
bool ckpt_dir_is_checkpoint(const char *dir, uint64_t seq);

/* Removes D/name when it is pipedec's (see above): expect_seq > 0 also
 * requires a manifest.pdck that decodes and says expect_seq. Returns
 * PD_ERR_REFUSED with the reason when it leaves the entry in place. */
pd_status ckpt_dir_remove(const char *dir, const char *name, uint64_t expect_seq, pd_err *err);

/* Renames the temporary directory tmp (a path) to D/name without ever
 * replacing an existing entry (renameat2 RENAME_NOREPLACE; where the file
 * system lacks it, a check just before the rename). */
pd_status ckpt_dir_publish(const char *tmp, const char *dir, const char *name, pd_err *err);

/* Removes leftover temporary directories of killed runs that are entirely
 * pipedec's, and says on stderr what it leaves (foreign entries). */
void ckpt_dir_clean_stale(const char *dir);

#endif
