/* precopy: the pre-copy phase of a live layer migration (migrate.h) — the
 * moving layers' cache rows travel while decoding goes on, so the switch
 * sends only what changed since.
 *
 * Owns: a communicator duplicated from the pipeline's (pre-copy messages
 * never meet the pipeline's pre-posted receives nor the switch's bundles),
 * the source's send buffers and progress per (layer, stream), and the
 * receiver's copies (one kv container per layer and stream, built outside
 * the stage: stage_spare_cache) with their receive buffers.
 *
 * Applies to full attention without eviction (kv layers whose rows, once
 * final, only grow): those are the caches that grow with the context. Every
 * other policy keeps a bounded state (a ring, a window, an eviction budget)
 * and moves whole at the switch.
 *
 * Phases (every rank; the protocol of ARCHITECTURE.md §10):
 *   start    at a drain point after the plan was agreed: the ranks that give
 *            layers list them, the ranks that take layers post receives;
 *   progress between micro-batches: a source sends rows of its moving layers
 *            that no rollback can touch any more (below lcache_rollback_limit),
 *            at most PRECOPY_BUDGET bytes per call, as comm/kv_chunk.h
 *            chunks; a receiver applies the chunks that arrived to its
 *            copies. Rows a source sent that changed since (a q8 freeze, a
 *            truncation below them: kv_layer_marked_rows) are sent again
 *            from row 0. A receiver that cannot keep a copy (a bad chunk, its
 *            --mem-limit) drops every copy, keeps receiving into nothing and
 *            reports the reason at the switch;
 *   finish   at the switch's drain point, streams settled: each source sends
 *            the rest of every stream the plan names (the rows since its
 *            last chunk, the importance and recurrent records: FINAL) and an
 *            end mark; each receiver takes everything up to the end marks
 *            and checks that it holds a complete copy of every (layer,
 *            stream) it takes;
 *   install  the receiver adds the layers to its stage with its copies as
 *            their containers (stage_add_layers_from: no row is copied
 *            again, no storage allocated in the pause);
 *   stop     drops what is left (after the switch or a refusal).
 *
 * Digests: every chunk's CRC32C and length are folded per layer as sent and
 * as received; migrate's ack compares them.
 *
 * INV: a source's chunks for one (layer, stream) arrive in the order sent
 *      (one communicator, one tag, receives completed in posting order). */
#ifndef PD_RUNTIME_PRECOPY_H
#define PD_RUNTIME_PRECOPY_H

#include "base/status.h"
#include "cluster/runtime/plan/layermap.h"
#include "cluster/model/model.h"
#include "cluster/runtime/rank/rank.h"

#include <stdbool.h>
#include <stdint.h>

#define PRECOPY_BUDGET ((size_t)2 << 20)  /* bytes a source sends per call */
#define PRECOPY_CHUNK ((size_t)4 << 20)   /* the largest message */

typedef struct precopy precopy;

/* Collective (every rank, after rank_start). r borrowed. precopy_free
 * does not wait for peers (after a failed run they may never answer): a
 * run that ends well calls precopy_stop first. */
pd_status precopy_new(rank *r, precopy **out, pd_err *err);
void precopy_free(precopy *pc);

/* Whether the job's cache policy grows with the context (full attention,
 * no eviction): only then is pre-copy worth its traffic. */
bool precopy_applies(const rank *r);

/* Every rank at the drain point that starts a migration to `to` (agreed by
 * every rank). corrupt: flip one byte of the first chunk this rank sends,
 * after its CRC (the --migrate-fault corrupt test hook). */
pd_status precopy_start(precopy *pc, const layermap *to, bool corrupt, pd_err *err);
bool precopy_active(const precopy *pc);

/* Between micro-batches: a bounded amount of sending and applying. *busy:
 * this rank has work left (rows not sent yet, sends in flight, chunks not
 * applied). A failure is an MPI failure (the job cannot go on); a copy that
 * cannot be kept is not a failure here (it is reported at finish). */
pd_status precopy_progress(precopy *pc, bool *busy, pd_err *err);

/* Figures of the current pre-copy. */
typedef struct precopy_stats {
    uint64_t chunks_sent, bytes_sent;       /* before finish */
    uint64_t final_chunks, final_bytes;     /* in finish */
    uint64_t resets;                        /* (layer, stream) copies restarted from row 0 */
    double started;                         /* MPI_Wtime at start */
    double send_s, recv_s;                  /* seconds spent encoding + sending / taking +
                                               applying chunks, before finish */
    double alloc_s;                         /* of recv_s: allocating the copies' caches */
} precopy_stats;
void precopy_get_stats(const precopy *pc, precopy_stats *out);

/* At the switch's drain point, every stream of ids settled. Sources send the
 * rest and their end marks; receivers take everything sent to them. dg[L] /
 * dg[NL + L] get the digest of layer L's chunks as sent / received.
 * *local: this rank's verdict (PD_OK, or why it cannot take the layers, in
 * why). Returns an error only when the link failed. */
pd_status precopy_finish(precopy *pc, const uint64_t *ids, uint32_t n_ids, uint64_t *dg, pd_status *local,
                         pd_err *why, pd_err *err);

/* After finish: adds layers [first, first + n) to the stage with weights
 * (stage_add_layers_from), each stream of ids taking its copy as the
 * layer's container (the stage owns it from then on: no row copied, no
 * storage allocated). Errors and what stays as stage_add_layers_from. */
/* The install checks of every copy of the streams ids (stage_check_copy),
 * before the vote. */
pd_status precopy_check(precopy *pc, const uint64_t *ids, uint32_t n_ids, pd_err *err);
pd_status precopy_add_layers(precopy *pc, uint32_t first, uint32_t n, const model *weights, const uint64_t *ids,
                             uint32_t n_ids, pd_err *err);

/* Ends the pre-copy: withdraws posted receives, completes sends, frees
 * every copy. */
pd_status precopy_stop(precopy *pc, pd_err *err);

#endif
