/* model: a transformer decoder read from a GGUF v3 file.
 *
 * Holds the hyperparameters (llama.cpp metadata keys of the file's
 * architecture) and, for one contiguous layer range, the layer weights packed
 * for the GEMM (gemm.h) plus the norms and biases as f32. The head stage also
 * holds the token embeddings, the tail stage the final norm and the output
 * projection (tied to the embeddings when the file has no output.weight).
 * Tensors outside the range are never read, so their pages are never mapped
 * in: a stage costs the memory of its own layers.
 *
 * Supported: architectures "llama" (RoPE normal: pairs (2i, 2i+1)) and
 * "qwen2" (RoPE NeoX: pairs (i, i + d/2), Q/K/V biases); RMSNorm, GQA,
 * SwiGLU MLP; tensor types F32, F16, BF16, Q8_0. Anything else is refused
 * with its name. */
#ifndef PD_MODEL_H
#define PD_MODEL_H

#include "base/alloc.h"
#include "base/status.h"
#include "cluster/model/gemm.h"
#include "cluster/model/pool.h"

#include <stdint.h>

typedef enum model_arch { MODEL_ARCH_LLAMA, MODEL_ARCH_QWEN2, MODEL_ARCH_COUNT } model_arch;
typedef enum model_rope { MODEL_ROPE_NORM, MODEL_ROPE_NEOX } model_rope;
typedef enum model_vocab_kind { MODEL_VOCAB_LLAMA, MODEL_VOCAB_GPT2 } model_vocab_kind;

typedef struct model_hparams {
    model_arch arch;
    model_rope rope;
    uint32_t n_layers;
    uint32_t hidden;     /* embedding_length */
    uint32_t n_heads;    /* attention.head_count */
    uint32_t n_kv_heads; /* attention.head_count_kv */
    uint32_t head_dim;   /* hidden / n_heads */
    uint32_t ffn;        /* feed_forward_length */
    uint32_t vocab;
    uint32_t ctx;        /* context_length */
    float rope_base;     /* rope.freq_base, default 10000 */
    float rms_eps;       /* attention.layer_norm_rms_epsilon, default 1e-5 */
    int qkv_bias;
    int tied_output;
    uint32_t bos, eos;
    model_vocab_kind vocab_kind;
} model_hparams;

/* One layer's weights. Matrices are [out x in] as in GGUF. */
typedef struct model_layer {
    gemm_w *wq, *wk, *wv, *wo;      /* [n_heads*hd x hidden], [n_kv*hd x hidden] x2, [hidden x n_heads*hd] */
    gemm_w *wgate, *wup, *wdown;    /* [ffn x hidden] x2, [hidden x ffn] */
    float *attn_norm, *ffn_norm;    /* [hidden] */
    float *bq, *bk, *bv;            /* [n_heads*hd], [n_kv*hd] x2, or NULL */
} model_layer;

typedef struct model_load_opts {
    uint32_t first_layer;  /* layer range [first_layer, first_layer + n_layers) */
    uint32_t n_layers;     /* 0 loads no layer (see want_embed / want_output) */
    int all_layers;        /* every layer of the file; first_layer and n_layers ignored */
    int want_embed;        /* head stage */
    int want_output;       /* tail stage */
    gemm_backend backend;
    const pd_alloc *alloc; /* weights' working copies (NULL = malloc) */
} model_load_opts;

typedef struct model model;

/* Reads hyperparameters and the requested weights. Returns owned *out (free
 * with model_free). Errors name the file, the key or tensor and the problem. */
pd_status model_load(const char *path, const model_load_opts *opts, model **out, pd_err *err);
void model_free(model *m);

/* Only the hyperparameters (for tools and validation before a load). */
pd_status model_read_hparams(const char *path, model_hparams *out, pd_err *err);

const model_hparams *model_hp(const model *m);
uint32_t model_first_layer(const model *m);
uint32_t model_layer_count(const model *m);
/* Layer `layer` (absolute index) of this model's range. */
const model_layer *model_layer_get(const model *m, uint32_t layer);
/* 64-bit digest of the whole file's tensor data and metadata (cached). */
uint64_t model_digest(const model *m);
/* Bytes of packed weights this model holds. */
uint64_t model_weight_bytes(const model *m);

/* Token embedding rows (head only): out[i] = embedding of tokens[i]. */
void model_embed(const model *m, const uint32_t *tokens, uint32_t n, float *out);
/* Final RMSNorm + output projection (tail only): x [n x hidden] -> logits [n x vocab].
 * x is overwritten with the normed rows. */
void model_logits(const model *m, float *x, uint32_t n, float *logits, pool *p);

/* Token vocabulary strings (borrowed from the mapped file). */
pd_status model_token(const model *m, uint32_t id, const char **s, size_t *len, pd_err *err);
/* Token type of id (GGUF tokenizer.ggml.token_type; 1 when absent). */
int32_t model_token_type(const model *m, uint32_t id);

/* ---- row-local math (fixed order, shared by every stage) ---------------- */

/* y = x * (1 / sqrt(mean(x^2) + eps)) * w, per row of n; mean via attn_dot8. */
void model_rmsnorm(const float *x, const float *w, uint32_t n, float eps, float *y);
/* Rotates one row of n_heads heads of head_dim in place for absolute position pos. */
void model_rope_row(float *x, uint32_t n_heads, uint32_t head_dim, uint64_t pos, float base,
                    model_rope style);
/* a[i] = silu(g[i]) * u[i] with silu(x) = x / (1 + pd_expf(-x)). */
void model_swiglu(const float *g, const float *u, uint32_t n, float *a);

#endif
