/* merge: joins the output files of a sharded run (cluster/format/shard.h)
 * into one output in manifest order (`pipedec merge`), and proves it
 * complete: every page of the manifest has exactly one finished line.
 *
 * Reading the outputs (never modified, never locked):
 *   - lines follow cluster/format/outfile.h; blank lines are skipped; a
 *     complete line that is not a JSON object with a non-empty string "id"
 *     is refused naming "file:line";
 *   - a last line without '\n' (a run killed mid-write; the next run cuts it)
 *     is ignored, with a note;
 *   - an error line ({"id", "error"}) does not finish its page; within one
 *     file a later finished line of the same id supersedes it (a rerun
 *     retried the page), as for every reader of outfile.h.
 * Then, per page of the manifest: finished in no file -> missing (failed,
 * when its last line in some file is an error line, with that error);
 * finished in two places -> duplicated; an id no page of the manifest has ->
 * unknown. Any of these fails the merge (PD_ERR_MISMATCH), lists the ids on
 * the log (at most MERGE_LIST_MAX of each kind, then a count) and writes
 * nothing. Otherwise `final` is published atomically (base/file.h) with each
 * page's finished line, byte for byte, in manifest order.
 *
 * The manifest is read for its ids only (one JSON object with a string "id"
 * per non-blank line, ids unique); its embedding files need not exist. */
#ifndef PD_MERGE_H
#define PD_MERGE_H

#include <stddef.h>
#include <stdio.h>

#include "base/status.h"

/* Ids listed per kind of problem before "... and N more". */
#define MERGE_LIST_MAX 100u

/* What a merge found. */
typedef struct merge_report {
    size_t pages;      /* in the manifest */
    size_t written;    /* lines in final (== pages on success, else 0) */
    size_t missing;    /* pages with no finished line (failed ones included) */
    size_t failed;     /* of those, pages whose last line is an error line */
    size_t duplicated; /* pages finished more than once */
    size_t unknown;    /* output lines whose id is not in the manifest */
    size_t torn;       /* outputs with a partial last line (ignored) */
} merge_report;

/* Merges outputs[0..n_outputs) (paths, borrowed) against the manifest into
 * final. Refuses (PD_ERR_REFUSED) a final that is the manifest or one of the
 * outputs. Problems are listed on log (may be NULL), one per line:
 *   missing: p7
 *   failed: p9: out/shard-1.jsonl:4: pages.jsonl:9: page "p9": ...
 *   duplicated: p3 (out/shard-0.jsonl:3, out/shard-1.jsonl:1)
 *   unknown: zz (out/shard-2.jsonl:5)
 * On PD_OK final holds rep->pages lines; on failure final is untouched and
 * err says what (the counts, or the first unreadable line). rep may be NULL. */
pd_status merge_outputs(const char *manifest, const char *const *outputs, size_t n_outputs,
                        const char *final, FILE *log, merge_report *rep, pd_err *err);

#endif
