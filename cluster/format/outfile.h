/* outfile: the JSON Lines result file of a decode run, safe to resume.
 *
 * One line per finished page, fields in this order:
 *   {"id":"p7","tokens":[12,99,2],"text":"...","prefill_rows":273,
 *    "generated":3,"stop":"eos","digest":"9c0f1e2d3b4a5968"}
 * stop is "eos" or "length"; digest (only when the page has one: `run
 * --digest`) is 16 lower-case hex digits (cluster/runtime/pipeline/digest.h).
 * A page that failed by itself (its input became unreadable mid-run) gets
 *   {"id":"p7","error":"pages.jsonl:7: page \"p7\": ..."}
 * instead; such a line does not count as done, so a rerun retries the page
 * and appends its line after the error line (readers take the last line of
 * an id). Strings are JSON-escaped (quote, backslash,
 * control bytes); invalid UTF-8 in the text is written as U+FFFD (one per
 * maximal ill-formed subpart) and an id that is not valid UTF-8 is refused (it
 * could not be found again on resume), so every line is valid JSON in valid
 * UTF-8.
 *
 * Crash safety: a line goes out with one write() on an O_APPEND descriptor
 * (continued only after a short write, e.g. on a full disk, so the error
 * that follows is the real one: ENOSPC, not "I/O error"), then fdatasync, so
 * a line is complete or absent — except after a kill in the middle of that
 * write, which can leave a partial last line. outfile_open
 * therefore reads the existing file: every complete line (ending in '\n') must
 * be a JSON object with a non-empty string "id" (blank lines are ignored), its
 * id counts as done; a partial last line is cut off (ftruncate + fsync) before
 * anything is appended. A complete line that is not such an object is refused
 * with an error naming the line, and the file is left untouched. The file is
 * locked (flock, exclusive) while open so two runs cannot append to it at once.
 * A rerun skips ids for which outfile_has is true; writing an id that is
 * done is refused (an error line never makes an id done). */
#ifndef PD_OUTFILE_H
#define PD_OUTFILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum outfile_stop { OUTFILE_STOP_EOS, OUTFILE_STOP_LENGTH, OUTFILE_STOP_COUNT } outfile_stop;

/* One finished page (all borrowed for the call). */
typedef struct outfile_page {
    const char *id;         /* non-empty, NUL-terminated, valid UTF-8 */
    const int32_t *tokens;  /* [n_tokens] generated token ids */
    size_t n_tokens;
    const char *text;       /* [text_len] bytes of detokenized text (may hold NUL) */
    size_t text_len;
    uint64_t prefill_rows;
    uint64_t generated;     /* tokens generated (the caller's count) */
    outfile_stop stop;
    bool has_digest;        /* write "digest" */
    uint64_t digest;
    const char *error;      /* non-NULL: the page failed; only id and error are written */
} outfile_page;

typedef struct outfile outfile;

/* Opens (creating if absent) the output file at path, collects the ids of its
 * complete lines and cuts a partial last line. On PD_OK *out is owned by the
 * caller (outfile_free closes it); on failure *out is untouched and nothing
 * in an existing file has changed. PD_ERR_REFUSED: locked by another run. */
pd_status outfile_open(const char *path, outfile **out, pd_err *err);

/* Closes the file and frees o; outfile_free(NULL) is a no-op. */
void outfile_free(outfile *o);

/* True if a line with this id is in the file (from before or written since). */
bool outfile_has(const outfile *o, const char *id);

/* Number of distinct ids done. */
size_t outfile_count(const outfile *o);

/* Bytes of a partial last line cut off by outfile_open (0 when none). */
uint64_t outfile_cut_bytes(const outfile *o);

/* Bytes of complete lines in the file (all durable once a write returned). */
uint64_t outfile_size(const outfile *o);

/* Lines reporting failed pages, found by outfile_open or written since. */
size_t outfile_error_lines(const outfile *o);

/* Appends pg as one line (one write + fdatasync). Refuses (PD_ERR_REFUSED) an
 * id already in the file and bad fields (PD_ERR_ARG) without writing. If the
 * write fails part-way, the partial bytes are cut off again and PD_ERR_IO is
 * returned with the id not recorded. If only fdatasync fails, the line is in
 * the file and its id recorded, and PD_ERR_IO is returned. Allocates only to
 * grow its reusable line buffer. */
pd_status outfile_write_page(outfile *o, const outfile_page *pg, pd_err *err);

/* Aborts (CHECK) if an invariant of o is broken (id set, file size). */
void outfile_check(const outfile *o);

#endif
