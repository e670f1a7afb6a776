/* draft: proposing speculative tokens on the head (--draft). A stream's
 * drafts ride as verify rows behind its decode row; the tail accepts the
 * longest prefix that equals what it samples itself, plus that token, so a
 * draft never changes a token (ARCHITECTURE.md §1), only how many come per
 * pass through the pipeline.
 *
 *   ngram[:N[:K]]  prompt lookup: the latest earlier occurrence of the
 *                  stream's last N tokens (prompt tokens, then generated) and
 *                  up to K tokens that followed it (default N 3, K 4)
 *   model:FILE[:K] a draft model (drafter.h): a smaller GGUF with the same
 *                  vocabulary, run greedily on the head (default K 4; a FILE
 *                  whose name ends in ":DIGITS" needs the :K spelled out)
 *   none           no speculation (default)
 *
 * Per stream K adapts to the acceptance history (sched.c): a stream starts
 * with one draft, all accepted doubles it up to K, none accepted halves it,
 * and a stream at 0 stops drafting for a while (8 passes, doubled after
 * every failed probe up to 256) before it probes with one draft again. */
#ifndef PD_RUNTIME_DRAFT_H
#define PD_RUNTIME_DRAFT_H

#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

typedef enum draft_mode { DRAFT_NONE, DRAFT_NGRAM, DRAFT_MODEL } draft_mode;

typedef struct draft_config {
    draft_mode mode;
    uint32_t n; /* ngram: tokens matched */
    uint32_t k; /* drafts at most per pass (1..16) */
    char path[1024];  /* model: the draft model's file */
} draft_config;

/* "none", "ngram", "ngram:N", "ngram:N:K", "model:FILE", "model:FILE:K";
 * PD_ERR_ARG naming the flag. */
pd_status draft_parse(const char *s, draft_config *out, pd_err *err);

/* Prompt lookup over hist[0..n_hist): writes up to k drafts into out and
 * returns how many (0 when the last n tokens never occurred before). */
uint32_t draft_ngram(const uint32_t *hist, size_t n_hist, uint32_t n, uint32_t k, uint32_t *out);

#endif
