/* ckpt: checkpoints of a running job, and resuming from them.
 *
 * A checkpoint is taken at a drain point (run.h: nothing in flight, every
 * rank at the same step boundary) into D/ckpt-SEQ/:
 *   layer-LLLLL.cmfb   one state bundle per model layer (comm/bundle.h), written
 *                      by the rank that owns the layer: every alive stream's
 *                      record of that layer
 *   manifest.pdck      written by the head last (layout below)
 * Every rank writes its bundles into D/.ckpt-SEQ.XXXXXX (made by the head) and fsyncs them; only
 * when every rank succeeded does the head write the manifest, fsync the
 * directory, rename it to ckpt-SEQ and fsync D (atomic publish). Any failure
 * removes the temporary directory, is reported, and decoding goes on: the
 * previous checkpoint stays the newest. The last two are kept. What pipedec
 * may remove, follow or number in D, which it shares with its user, is
 * ckpt_dir.h's to decide.
 * D must be on a file system every rank sees (a shared or node-local
 * directory when all ranks share a node).
 *
 * Resuming (the same command line): the head takes the newest checkpoint
 * whose manifest and bundle files all check (size and CRC32C), walking back
 * past broken ones with the reason on stderr; the model fingerprint, the
 * manifest digest and the token-affecting settings must match (else a clear
 * error). out.jsonl is cut back to the size recorded durable, every rank
 * restores the alive streams (the head's stream records, the stages' layer
 * records for the layers each rank owns now — any rank count, any map) and
 * decoding continues where it stood, byte for byte.
 *
 * The manifest's layout is in ckpt_manifest.h.
 */
#ifndef PD_RUNTIME_CKPT_H
#define PD_RUNTIME_CKPT_H

#include "base/status.h"
#include "cluster/runtime/ops/ckpt_manifest.h"
#include "cluster/runtime/rank/rank.h"
#include "cluster/runtime/sched/sched.h"
#include "cluster/runtime/pipeline/stream.h"

#include <stdint.h>

/* Head, at start-up (head.h's head_resume_fn): the checkpoint of
 * o->checkpoint_dir to resume (*seq, 0 = none) and the highest number there
 * (*newest); out.jsonl is cut back to the size that checkpoint recorded
 * durable (lines written after it are decoded again). A missing or shorter
 * output is an error naming both sizes. */
pd_status ckpt_resume_find(const run_opts *o, const model *mdl, uint32_t n_layers, uint64_t *seq, uint64_t *newest,
                           pd_err *err);

/* Validates one checkpoint directory (D/ckpt-SEQ) without a model: the
 * manifest, every layer bundle's size, CRC32C and structure (bundle_parse),
 * and that every bundle holds exactly the manifest's streams. On success
 * *m is filled (owned: ckpt_manifest_free). path may also be D: then the
 * newest checkpoint in it is checked (*seq says which). */
pd_status ckpt_inspect(const char *path, ckpt_manifest *m, uint64_t *seq, pd_err *err);

/* The number of the newest checkpoint directory in dir (0 when none). */
uint64_t ckpt_newest(const char *dir);

/* The drain action: writes checkpoint seq of every rank's state (collective;
 * h: the head's scheduler, NULL elsewhere; out_size: the head's durable
 * output bytes). Returns PD_OK when the checkpoint was published; a failure
 * is returned on every rank alike, after cleaning up, so the caller can
 * report it and go on decoding. */
pd_status ckpt_write(rank *r, sched *sc, const char *dir, uint64_t seq, uint64_t out_size, pd_err *err);

/* Every rank, at start-up, after ckpt_find on the head: restores the
 * streams of checkpoint seq into this rank's stage (the layers it owns) and
 * tail; the head also gets the stream records into its scheduler (sc).
 * Collective verdict. */
pd_status ckpt_restore(rank *r, sched *sc, const char *dir, uint64_t seq, pd_err *err);

#endif
