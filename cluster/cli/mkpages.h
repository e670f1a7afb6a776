/* mkpages: deterministic synthetic page manifests (an OCR page is BOS, R
 * embedding rows from the "vision encoder", and a P-token prompt).
 * Same options -> the same files. */
#ifndef PD_MKPAGES_H
#define PD_MKPAGES_H

#include "base/status.h"
#include "cluster/model/model.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct mkpages_opts {
    uint32_t count;        /* pages */
    uint32_t embed_rows;   /* embedding rows per page (0 = none) */
    uint32_t prompt_tokens;/* prompt tokens after the embeddings */
    uint32_t max_new;      /* max_new_tokens per page */
    uint64_t seed;
    bool mixed;            /* vary embed rows and max_new per page (down to about half) */
} mkpages_opts;

/* Writes dir/pages.jsonl and dir/pNNNNN.npy for a model with hyperparameters
 * hp (vocabulary, hidden size, BOS). Creates dir if missing. */
pd_status mkpages_write(const mkpages_opts *o, const model_hparams *hp, const char *dir, pd_err *err);

#endif
