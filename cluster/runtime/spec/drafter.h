/* drafter: the draft model of --draft model:FILE[:K] — a smaller GGUF with
 * the target's vocabulary, run on the head with its own per-stream caches
 * and the same batch-invariant kernels, proposing each stream's next K
 * tokens by greedy decoding. The tail accepts a draft only when it equals
 * the target's own token (draft.h), so the draft model changes how many
 * tokens come per pass, never which (ARCHITECTURE.md §1).
 *
 * What the draft model reads of a stream (its context): when its hidden size
 * equals the target's, the page's prefill rows as the target reads them
 * (embedding rows as they are, prompt tokens through the draft model's own
 * embedding table) at the target's positions; otherwise only the prompt
 * tokens, at positions 0, 1, ... Then the stream's generated tokens.
 *
 * Its caches hold the stream's context and, between proposals, the last
 * proposal's guesses: a proposal runs the rows added to the context since
 * the last one, then K single-row steps feeding each guess back in. Its
 * first row rolls back what the caches hold past the rows the contexts
 * share (the guesses; with --draft-async also the tokens of a refuted
 * continuation: the context went back) by the stage's position-driven
 * rollback, the one the target's stages use under --draft-async: the
 * draft's stage takes spec_async with max_drafts = max_k, so its layers undo
 * 2 x (max_k + 1) positions across micro-batches (full attention, f32 KV, no
 * eviction whatever the target's policy). A context that went back further
 * (stage_undo_floor) retires the stream's caches and runs its whole context
 * again, which gives the same rows (batch invariance). Rows of every stream
 * asking at once share each step's GEMMs. The draft model's caches are not
 * part of --mem-limit's budget. */
#ifndef PD_RUNTIME_DRAFTER_H
#define PD_RUNTIME_DRAFTER_H

#include "base/status.h"
#include "cluster/model/gemm.h"
#include "cluster/model/model.h"
#include "cluster/model/pool.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct drafter drafter;

typedef struct drafter_config {
    const char *path;      /* the draft model's GGUF file */
    const model *target;   /* borrowed: the vocabulary to match, its hidden size */
    uint32_t max_streams;  /* streams drafting at once */
    uint32_t max_rows;     /* rows per forward of the draft model (>= max_streams) */
    uint32_t max_k;        /* the largest K a request may name (>= 1; --draft
                              model:FILE:K): the stage is made before any
                              request, and its caches undo 2 x (max_k + 1)
                              positions */
    gemm_backend backend;  /* the target's --gemm */
    pool *pool;            /* borrowed, may be NULL */
} drafter_config;

/* Loads the draft model and checks its vocabulary against the target's
 * (size, every token's text, EOS): PD_ERR_MISMATCH naming the first
 * difference; the model loader's errors name the file. Nothing is kept on
 * error. */
pd_status drafter_open(const drafter_config *cfg, drafter **out, pd_err *err);
void drafter_free(drafter *d);

/* Whether the context includes the page's embedding rows (equal hidden
 * sizes); the draft model, for embedding the context's tokens. */
bool drafter_sees_embeddings(const drafter *d);
const model *drafter_model(const drafter *d);
/* The draft model's context length: a proposal may reach position
 * n_ctx + k - 1 only below it. */
uint64_t drafter_ctx_len(const drafter *d);

/* One stream's proposal. Context positions [0, n_ctx) hold committed rows,
 * n_prefill of them prefill rows; `last` is the last committed token, at
 * position n_ctx. Drafts go to out[0..k). */
typedef struct drafter_req {
    uint64_t stream;
    uint64_t n_ctx;
    uint64_t n_prefill;
    uint32_t last;
    uint32_t k;          /* >= 1 */
    uint32_t max_rows;   /* the stream's context rows at most (cache sizing) */
    uint32_t *out;       /* [k] */
    uint32_t got;        /* set by drafter_propose: drafts in out, k or fewer:
                            they stop before an end-of-sequence guess (the
                            pass that samples it ends the stream, so a draft
                            of it is never accepted) */
    const void *user;    /* handed back to the context callback */
} drafter_req;

/* Writes context rows [from, from + n) of r's stream into x [n x the draft
 * model's hidden size]. */
typedef pd_status (*drafter_ctx_fn)(void *ctx, const drafter_req *r, uint64_t from, uint32_t n, float *x,
                                    pd_err *err);

/* Proposes drafts for reqs[0..n) (distinct streams, each 1 <= k <= max_k
 * and n_ctx + k <= drafter_ctx_len). A stream seen for the first time gets
 * caches and its whole context; one whose context went back (a refuted
 * --draft-async continuation) is rolled back to it, or, further back than
 * the caches undo, gets new caches and its whole context again. A
 * stream's context below both this n_ctx and its last proposal's n_ctx + 1
 * must be the one that proposal read. Errors: the context callback's, PD_ERR_NOMEM, PD_ERR_RANGE more
 * than max_streams streams alive. */
pd_status drafter_propose(drafter *d, drafter_req *reqs, uint32_t n, drafter_ctx_fn fn, void *ctx,
                          pd_err *err);

/* Frees a finished stream's caches; unknown ids are ignored. */
void drafter_retire(drafter *d, uint64_t stream);

/* Rows the draft model ran and proposals made so far (stats). */
typedef struct drafter_stats {
    uint64_t rows;       /* context and guess rows forwarded */
    uint64_t proposals;  /* streams proposed for */
} drafter_stats;
void drafter_get_stats(const drafter *d, drafter_stats *out);

#endif
