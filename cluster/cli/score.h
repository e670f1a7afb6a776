/* score: character error rate of decoded pages against their text.
 *
 * CER of a page = Levenshtein distance (insertions, deletions and
 * substitutions of bytes, each costing 1) between the decoded text and the
 * reference, divided by the reference's length; overall = the sum of the
 * distances over the sum of the reference lengths. */
#ifndef PD_SCORE_H
#define PD_SCORE_H

#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

/* Edit distance between a[0..na) and b[0..nb), O(na * nb) time, O(nb)
 * memory. Returns SIZE_MAX when the work buffer cannot be allocated. */
size_t score_edit_distance(const char *a, size_t na, const char *b, size_t nb);

/* One scored page (id borrowed from the caller). */
typedef struct score_page {
    const char *id;
    size_t ref_chars, hyp_chars, edits;
} score_page;

/* Scores the pages of manifest `pages_path` (ids in manifest order) found in
 * the output file `out_path` (the last line of an id counts) against
 * truth[i] (page i of the text, in manifest order). Every page must have a
 * text line: a missing page, an error line, a line that is not a JSON
 * object with string "id" and "text", or a page count that differs from the
 * truth is refused, naming the file, line and id. On PD_OK *out (owned,
 * free with score_free) holds n pages. */
typedef struct score_result score_result;
pd_status score_run(const char *pages_path, const char *out_path, const char *const *truth, const size_t *truth_len,
                    size_t n_truth, score_result **out, pd_err *err);
size_t score_count(const score_result *r);
const score_page *score_get(const score_result *r, size_t i);
void score_free(score_result *r);

#endif
