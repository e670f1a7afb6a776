/* head: rank 0's part of a run — the page manifest, the scheduler, the
 * output file, and the loop that forms micro-batches, sends them down the
 * pipeline (or runs them itself on one rank), takes the tail's results back,
 * writes finished pages in manifest order, and holds drain points.
 *
 * Owns: pages, vocabulary (detokenizer), outfile, sched, the finished pages
 * waiting for their turn in manifest order, the in-flight micro-batches.
 *
 * INV: at most sz.n_inflight micro-batches are in flight; inflight[slot] is
 *      the batch sched handed out in that slot while it is in flight.
 * INV: pages are written in manifest order: pending holds finished pages
 *      whose turn has not come (at most --batch of them, since pages are
 *      admitted in manifest order); next_write is the first page not written
 *      and not skipped.
 * INV: a drain point is held only with nothing in flight (drain_due is
 *      set, no new micro-batch is formed until the drain ran). */
#ifndef PD_RUNTIME_HEAD_H
#define PD_RUNTIME_HEAD_H

#include "base/status.h"
#include "cluster/format/pages.h"
#include "cluster/runtime/loop/pageimg.h"
#include "cluster/runtime/sched/budget.h"
#include "cluster/runtime/rank/rank.h"
#include "cluster/runtime/rank/run_opts.h"
#include "cluster/runtime/sched/sched.h"

typedef struct head head;

/* The head's start-up, after rank_start: loads and validates the manifest,
 * builds the detokenizer, opens (locks, repairs) the output file, marks the
 * pages already written, creates the scheduler. On failure *out holds what
 * was made (head_free frees it); nothing was written to the output. */
/* Finds the checkpoint to resume (*seq, 0 = none; *newest: the highest
 * checkpoint number there) and cuts the output back to what it recorded:
 * the drain-point operations provide it (ckpt_resume_find), head_open calls
 * it after the manifest and the paths were checked and before the output is
 * opened, when --checkpoint-dir is given. */
typedef pd_status (*head_resume_fn)(const run_opts *o, const model *m, uint32_t n_layers, uint64_t *seq,
                                    uint64_t *newest, pd_err *err);
/* img (--mmproj, else NULL): the run's encoder (pageimg_open), borrowed
 * until head_free; head_open reserves its room for the run's streams. */
pd_status head_open(rank *r, pageimg *img, head_resume_fn resume, head **out, pd_err *err);
void head_free(head *h);

const pages *head_pages(const head *h);
sched *head_sched(head *h);
/* Drain points held so far. */
uint32_t head_drains(const head *h);
/* Durable bytes of out.jsonl (what a checkpoint records). */
uint64_t head_out_size(const head *h);
/* The checkpoint this run resumes (0 = none), chosen at head_open when
 * --checkpoint-dir is given: out.jsonl was cut back to its recorded size
 * before it was opened. *newest: the highest checkpoint number in the
 * directory (the next one written is newest + 1). */
uint64_t head_resume_seq(const head *h, uint64_t *newest);
/* After the checkpoint's streams were restored into head_sched (before
 * head_loop): the images of restored streams whose prefill is done are
 * never read again, so encoder ranks are not asked for them (a checkpoint
 * holds no image rows; pages still mid-prefill are encoded again). No-op
 * without image pages. */
pd_status head_restored(head *h, pd_err *err);

/* Takes ownership of b: pages are admitted only while every rank's
 * predicted cache bytes fit its budget (budget.h). Before head_loop. */
void head_use_budget(head *h, budget *b);
const budget *head_budget(const head *h);
/* The same budget for changing (a migration remaps it; NULL = none). */
budget *head_budget_rw(head *h);

/* Runs the pipeline from the head until every page is finished, then sends
 * the stop message. hooks may be NULL. Returns the first failure (the job
 * must then end: peers may be blocked in a receive). */
pd_status head_loop(head *h, const run_hooks *hooks, pd_err *err);

/* Progress figures (pages, tokens) so far. */
void head_progress(const head *h, sched_progress *out);
/* The progress line on stderr (when --progress or a terminal); final = the
 * last one, with a newline. */
void head_progress_line(head *h, bool final);

#endif
