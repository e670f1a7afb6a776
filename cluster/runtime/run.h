/* run: one rank's part of `pipedec run` — start-up (layer map, NUMA
 * placement, model slice, pages), the pipeline loop, and the report.
 *
 * Rank 0 is the head (scheduler, embeddings, output file), rank N-1 the tail
 * (final norm, output projection, sampling); one rank is both and sends no
 * message. Start-up errors on any rank are agreed on collectively so every
 * rank exits non-zero with the cause printed by the rank that saw it; errors
 * after start-up abort the whole job (MPI_Abort) so no rank is left hanging. */
#ifndef PD_RUN_H
#define PD_RUN_H

#include "cluster/model/gemm.h"
#include "cluster/runtime/policy.h"
#include "cluster/model/sample.h"
#include "comm/msg.h"

#include <mpi.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct run_opts {
    const char *model_path;
    const char *pages_path;
    const char *out_path;
    const char *stats_path;   /* NULL = none */
    const char *layers;       /* explicit layer map, NULL = balanced */
    uint32_t batch;           /* streams decoding at once */
    uint32_t threads;         /* compute threads per rank */
    uint32_t prefill_chunk;   /* 0 = whole prefill in one micro-batch */
    cache_policy policy;
    sample_params sample;
    sample_ngram ngram;
    uint64_t seed;
    gemm_backend backend;
    msg_dtype wire_dtype;
    bool progress;            /* progress line on stderr even when not a terminal */
    bool no_bind;             /* do not bind ranks to cores / NUMA nodes */
    bool digest;              /* each output line carries the page's logits digest */
    const char *trace_path;   /* --trace-hidden: per-rank residual-row hashes, NULL = off
                                 (rank 0 writes the path itself, rank r > 0 path.r) */
} run_opts;

void run_opts_default(run_opts *o);

/* Runs this rank. Returns the process exit status (0 = success). */
int run_main(const run_opts *o, MPI_Comm world);

#endif
