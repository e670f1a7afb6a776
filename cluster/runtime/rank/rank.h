/* rank: what one rank of `pipedec run` computes with, and its start-up —
 * the kernel ISA agreement, the layer map, NUMA placement, the model slice,
 * the stage (and on the last rank the tail), the transport, and the counters
 * of its work. The head's own part (pages, scheduler, output) is head.h; the
 * loops are head.h and follow.h; run.h ties them together.
 *
 * Start-up order and why:
 *   1. node-local rank and the ISA level all ranks support, and the page
 *      manifest's work mix the default layer map is balanced for
 *      (collectives every rank reaches whatever fails later in its own
 *      start-up);
 *   2. everything that can fail on one rank (model file, manifest, output
 *      file, placement, memory) — failures are then agreed on collectively
 *      (run.c), so every rank exits non-zero with the cause printed by the
 *      rank that saw it, and nothing was decoded or written.
 *
 * INV (after rank_start succeeded): layers lm.first[rank] .. + lm.count[rank]
 *      are loaded in m and run by st; tl != NULL exactly on the last rank;
 *      tokens/digests hold max_logits entries; x is the rank's transport. */
#ifndef PD_RUNTIME_RANK_H
#define PD_RUNTIME_RANK_H

#include "base/status.h"
#include "cache/arena.h"
#include "cache/numa.h"
#include "cluster/format/pages.h"
#include "cluster/model/model.h"
#include "cluster/model/pool.h"
#include "cluster/runtime/plan/layermap.h"
#include "cluster/runtime/rank/run_opts.h"
#include "cluster/runtime/pipeline/stage.h"
#include "cluster/runtime/pipeline/tail.h"
#include "cluster/runtime/pipeline/trace.h"
#include "cluster/runtime/pipeline/xport.h"
#include "comm/msg.h"
#include "comm/pipe.h"

#include <stdbool.h>
#include <stdint.h>

/* Sizes every buffer of the run is made for; the same on every rank started
 * with the same options. */
typedef struct rank_sizes {
    uint32_t max_streams;    /* --batch: streams alive at once */
    uint32_t max_rows;       /* rows one micro-batch can hold */
    uint32_t max_logits;     /* logits rows one micro-batch can hold */
    uint32_t rows_per_batch; /* the scheduler's row budget per micro-batch */
    uint32_t n_inflight;     /* micro-batches the head keeps in flight */
    uint32_t prefill_chunk;  /* prefill rows of one stream per micro-batch */
} rank_sizes;

typedef struct rank {
    const run_opts *o;       /* borrowed */
    pipe_link *p;            /* borrowed */
    int rank, size;
    int local_rank, local_size; /* among the ranks on this node */
    bool is_head, is_tail;
    bool turns;              /* stages take turns, one micro-batch in flight (rank_start) */
    bool placed;             /* rank_place done */
    bool bells;              /* ...and wake each other by doorbells (pipe_bells_open) */
    uint32_t threads;        /* this rank's pool: --threads, times the ranks sharing its node
                                when the stages take turns */
    rank_sizes sz;
    layermap lm;
    /* the manifest's pages, their prefill rows and max_new_tokens, summed
     * (rank_agree_work; all 0 when not known or on one rank) */
    double work_pages, work_prefill_rows, work_new_tokens;
    char lm_basis[128];      /* what the default layer map was balanced for (start-up line) */
    model_hparams hp;
    numa_topo *topo;
    numa_choice nc;
    arena *ar;               /* weights and caches, on the rank's NUMA node */
    model *m;                /* this rank's layers (+ embeddings on the head, output on the tail) */
    pool *pool;
    stage *st;
    tail *tl;                /* last rank only */
    xport *x;
    trace *tr;               /* --trace-hidden, else NULL */
    uint32_t *tokens;        /* [max_logits] the last sampled tokens */
    uint64_t *digests;       /* [max_logits] their logits rows' digests */
    msg_stats stats;         /* busy, micro-batches, rows, peaks (traffic is in x) */
    double busy_cpu_s;       /* process CPU seconds spent where stats.busy_s counts wall time:
                                what --rebalance weighs (a rank preempted by a neighbour's
                                work loses wall time, not CPU time) */
} rank;

/* Step 1 of start-up: r->o and r->p set, everything else zero. Agrees on
 * the kernels' ISA and on whether the stages take turns (r->turns; the
 * topology it loads stays in r->topo). Collective. */
pd_status rank_agree_isa(rank *r, pd_err *err);
/* Step 1, after rank_agree_isa: the head reads the page manifest's totals
 * (pages, prefill rows, max_new_tokens; headers of embedding files only) and
 * every rank receives them for the default layer map. A manifest the head
 * cannot read counts as empty here: head_open reports it. One rank: no-op.
 * Text segments count the tokens the model's tokenizer makes of them, as
 * head_open's load tokenizes them (tok_pages, cluster/format/tokenizer.h).
 * image_rows / image_ctx (read on the head only; NULL: none): count an image
 * segment's rows (pages_opts.image_rows), so image pages weigh the rows they
 * prefill; without them they count 0 rows. Collective. */
pd_status rank_agree_work(rank *r, pages_image_rows_fn image_rows, void *image_ctx, pd_err *err);
/* Step 2 for this rank's compute part. On failure *r holds what was made so
 * far: rank_stop frees it. */
pd_status rank_start(rank *r, pd_err *err);
/* Binds this rank by the placement rule (cache/numa.h) at its node-local
 * slot, or, when the stages take turns (rank_agree_isa), to every CPU of its
 * NUMA node with the threads of all the decoding ranks there; sets
 * r->threads. After rank_agree_isa; rank_start calls it when not done yet
 * (run_begin does it first, so that what the head loads before rank_start,
 * the --mmproj encoder, lands on its node). */
pd_status rank_place(rank *r, pd_err *err);

/* One rank's placement text (the report's line) and JSON: capacity of each. */
#define RANK_PLACEMENT_CHARS 768

/* An encoder rank's placement (run --encoder-ranks; it holds no layers):
 * bound by the decoding ranks' rule at its slot among every rank of the
 * launch on its node (run_opts.node_slot), so the encoders take cores of
 * their own. Writes its report line ("encoder K, rank R on HOST: ...") to
 * line[cap] and its JSON to json[cap]. A failure to place is not fatal: the
 * encoder runs unbound and both say why. */
void rank_place_encoder(const run_opts *o, int world_rank, int encoder, char *line, char *json, size_t cap);
/* Collective, after a successful start-up on every rank: every rank must
 * run the same model (file fingerprint, layer count, shape), the same layer
 * map and every option that affects tokens or message sizes (policy,
 * sampling, seed, n-gram ban, GEMM backend, wire dtype, batch, prefill
 * chunk). An MPMD launch that gives one rank another model or flag fails on
 * every rank with PD_ERR_MISMATCH naming the first rank and field that
 * differ from rank 0. */
pd_status rank_agree_run(rank *r, pd_err *err);
/* Collective: every rank's cache budget (--mem-limit, or the automatic one
 * measured now that every rank loaded its weights) and layer range, on
 * every rank: limit/first/layers[size], owned by the caller (free). */
pd_status rank_gather_budgets(rank *r, uint64_t **limit, uint32_t **first, uint32_t **layers, pd_err *err);

/* --trace-hidden: opens this rank's trace (pg: the manifest, on the head). */
pd_status rank_open_trace(rank *r, const pages *pg, pd_err *err);
void rank_stop(rank *r);

/* Applies a micro-batch header: retirements, then admissions, on the stage,
 * the tail and the trace. */
pd_status rank_lifecycle(rank *r, const mb_admit *admit, uint32_t na, const uint64_t *retire, uint32_t nr,
                         pd_err *err);
/* The stage's forward pass over rows [n] (x overwritten), counted. */
pd_status rank_forward(rank *r, const mb_row *rows, uint32_t n, float *x, pd_err *err);
/* Tail only: samples the rows that want logits into r->tokens / r->digests. */
pd_status rank_sample(rank *r, const mb_row *rows, uint32_t n, const float *x, uint32_t *n_tokens, pd_err *err);

/* This rank's counters with the transport's folded in. */
msg_stats rank_stats(const rank *r);

#endif
