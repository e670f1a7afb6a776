/* run_opts: what `pipedec run` was asked to do (run_opts), the drain
 * point every rank reaches together (run_drain), the hooks that act there
 * (run_hooks) and the exit codes. The vocabulary every part of a run shares,
 * below the rank, the loops and the drain-point operations; run.h runs it. */
#ifndef PD_RUNTIME_RUN_OPTS_H
#define PD_RUNTIME_RUN_OPTS_H

#include "cluster/model/gemm.h"
#include "cluster/runtime/spec/draft.h"
#include "cluster/runtime/plan/policy.h"
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
    bool special;             /* --special: control tokens (BOS, EOS, <image>, ...) appear in the
                                 output text as their own text; default: they decode to nothing */
    bool past_context;        /* run pages past the model's context_length (counted in --stats) */
    uint64_t mem_limit;       /* cache bytes per rank: 0 = auto (budget.h), UINT64_MAX = none */
    draft_config draft;       /* --draft: speculation (draft.h); policy.max_drafts = its K */
    const char *checkpoint_dir; /* checkpoints and resume (ckpt.h), NULL = off */
    double checkpoint_every;  /* seconds between checkpoints, 0 = only on a signal */
    double stall_timeout;     /* seconds a rank waits on a peer without progress before the job
                                 ends naming it (0 = forever) */
    const char *control_path; /* --control: the control socket on rank 0 (ctl.h), NULL = none */
    bool rebalance;           /* --rebalance auto (rebalance.h) */
    uint32_t rebalance_window; /* micro-batches per measuring window */
    double rebalance_threshold; /* predicted gain (fraction) that makes a move */
    uint32_t rebalance_hold;  /* windows measured but not acted on after a move (hysteresis) */
#define RUN_MIGRATE_AT_MAX 16
    const char *migrate_at[RUN_MIGRATE_AT_MAX]; /* --migrate-at STEP:MAP (testing aid, jobctl.h) */
    uint32_t n_migrate_at;
    int migrate_fault;        /* --migrate-fault (test hook, migrate.h), 0 = none */
    uint32_t micro_batches;   /* --micro-batches K: a pipeline of K micro-batches in flight (0 = the
                                 default: stages take turns when every rank shares one NUMA node,
                                 else N or N + 1, rank.c) */
    bool turns;               /* --micro-batches turns: stages take turns wherever the ranks are */
    bool pipeline;            /* --micro-batches pipeline: never turns; K = N or N + 1 (rank.c) */
    bool weights_over_mpi;    /* --weights-over-mpi: a rank taking layers in a live migration gets
                                 their weights from the giving rank, not from the model file (also
                                 done when the file is not readable on that rank any more) */
    const char *trace_path;   /* --trace-hidden: per-rank residual-row hashes, NULL = off
                                 (rank 0 writes the path itself, rank r > 0 path.r) */
    const char *mmproj_path;  /* --mmproj: image pages encoded at the head (loop/pageimg.h), NULL = none */
    uint32_t encoder_threads; /* --encoder-threads: the encoder's threads (0 = --threads) */
    uint32_t encoder_ranks;   /* --encoder-ranks E: the last E ranks of the launch encode images */
    MPI_Comm enc_world;       /* set by cmd_run with encoder ranks: the launch's communicator */
    int enc_first;            /* ... and the first encoder's rank in it */
    uint32_t node_slot, node_slots; /* set by cmd_run with encoder ranks: this rank's index among
                                 every rank of the launch on its node, and their count, which
                                 placement goes by (rank_place); 0 slots: not set */
    const char *pid_path;     /* --pid-file: rank 0 writes "rank pid host" per rank once every
                                 rank started, removes it at exit; NULL = none */
} run_opts;

/* A micro-batch of the largest shapes takes seconds per stage; ten minutes
 * without any message means a rank stopped (SIGSTOP, a hung file system, a
 * dead node MPI did not notice). */
#define RUN_STALL_DEFAULT_S 600.0

void run_opts_default(run_opts *o);

/* A drain point: the head stopped forming micro-batches, every one in flight
 * finished on every rank, and every rank is at the same step boundary. */
typedef struct run_drain {
    uint64_t step;    /* micro-batches sent before the drain point */
    uint32_t action;  /* what the head's want_drain asked for (non-zero) */
    uint32_t number;  /* 0, 1, ... drain points within this run */
    int rank, size;
    MPI_Comm comm;    /* every rank is in the action: collectives on it are
                         safe (no point-to-point: the pipeline's receives are
                         posted on it) */
} run_drain;

#define RUN_SEEN_RESULTS 0x80000000u

/* Hooks for the features that stop the pipeline (checkpoint, migration) and
 * for tests. Every rank passes the same hooks. */
typedef struct run_hooks {
    /* Head only: asked before each new micro-batch is formed (step = the
     * micro-batches formed so far); non-zero = drain now and run that action. */
    uint32_t (*want_drain)(void *ctx, uint64_t step);
    /* Every rank, at the drain point. A failure on any rank ends the run
     * (all ranks agree on it before the pipeline resumes). */
    pd_status (*at_drain)(void *ctx, const run_drain *d, pd_err *err);
    /* Head only, after a drain point: true = stop the run now (a checkpoint
     * before exit): no new micro-batch, every rank ends its loop. */
    bool (*stop_after_drain)(void *ctx);
    /* Every rank, once per micro-batch it ran (the head also once per results
     * message it took), with the flags of the message it took; returns in
     * *add the flags this rank adds to what it sends on (MSG_FLAG_BUSY while
     * it has background work: a migration's pre-copy). A failure ends the
     * run as a failed micro-batch does. */
    pd_status (*progress)(void *ctx, uint32_t seen, uint32_t *add, pd_err *err);
    /* seen | RUN_SEEN_RESULTS: the head took a results message */
    void *ctx;
} run_hooks;

/* RUN_EXIT_PAGES: the job ran to its end, but some pages have error lines
 * instead of tokens (a bad image, an embeddings file that changed): rank 0
 * exits with it, a rerun retries those pages. */
enum { RUN_EXIT_OK = 0, RUN_EXIT_FAIL = 1, RUN_EXIT_ABORT = 3, RUN_EXIT_PAGES = 4, RUN_EXIT_RESUMABLE = 75 };

#endif
