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
 * Supported: architectures "llama" (RoPE normal: pairs (2i, 2i+1)),
 * "qwen2" (RoPE NeoX: pairs (i, i + d/2), Q/K/V biases) and "deepseek"
 * (DeepSeek MoE without MLA, as llama.cpp stores it: RoPE normal, untied
 * output, leading_dense_block_count dense SwiGLU layers, then
 * mixture-of-experts layers, see MODEL_FFN_MOE); RMSNorm, GQA; tensor types
 * F32, F16, BF16, Q8_0 for every matrix, expert tensors included. Anything
 * else is refused with its name, and so is a file holding a tensor the
 * architecture does not read (a renamed output.weight must not silently mean
 * tied embeddings).
 *
 * The model also computes: model_layer_forward runs one layer for the rows of
 * a micro-batch, attending through each stream's layer cache container
 * (cache/layer_cache.h); the stage only decides which rows, groups, caches
 * and threads. */
#ifndef PD_MODEL_H
#define PD_MODEL_H

#include "base/alloc.h"
#include "base/status.h"
#include "cache/layer_cache.h"
#include "cluster/model/gemm.h"
#include "cluster/model/pool.h"
#include "cluster/model/rope.h"

#include <stdint.h>

typedef enum model_arch {
    MODEL_ARCH_LLAMA,
    MODEL_ARCH_QWEN2,
    MODEL_ARCH_DEEPSEEK,
    /* DeepSeek-OCR's language decoder as llama.cpp reads it (deepseek2 graph,
     * OCR branch): the deepseek layers with NEOX RoPE over the whole head,
     * full MHA, the router of build_moe_ffn (gating function, selection
     * bias exp_probs_b, expert_weights_norm, expert_weights_scale) and an
     * output tied to token_embd.weight when output.weight is absent. */
    MODEL_ARCH_DEEPSEEK2_OCR,
    MODEL_ARCH_COUNT
} model_arch;

/* 1 for the mixture-of-experts architectures (deepseek, deepseek2-ocr). */
static inline int model_arch_is_moe(model_arch a) { return a == MODEL_ARCH_DEEPSEEK || a == MODEL_ARCH_DEEPSEEK2_OCR; }
/* The GGUF name of an architecture ("deepseek2-ocr"); "unknown" out of range. */
const char *model_arch_name(model_arch a);

/* The router's gating function (llama.cpp's expert_gating_func). */
typedef enum model_moe_gating { MODEL_MOE_SOFTMAX, MODEL_MOE_SIGMOID } model_moe_gating;

/* How a router turns logits into experts and weights (build_moe_ffn): */
typedef struct model_moe_opts {
    model_moe_gating gating; /* p = softmax(logits) or sigmoid(logits) */
    const float *sel_bias;   /* [n_expert] added to p for the top-k selection only (exp_probs_b), or NULL */
    int norm_w;              /* w_r /= max(sum_r w_r (in double, to f32), 6.103515625e-5) */
    float scale_w;           /* w_r *= scale_w unless it is 0 or 1 */
} model_moe_opts;
typedef enum model_rope { MODEL_ROPE_NORM, MODEL_ROPE_NEOX } model_rope;

/* rope.scaling.type as llama.cpp reads it ("linear" when the key is absent). */
typedef enum model_rope_scaling {
    MODEL_ROPE_SCALING_NONE,
    MODEL_ROPE_SCALING_LINEAR,
    MODEL_ROPE_SCALING_YARN,
    MODEL_ROPE_SCALING_COUNT
} model_rope_scaling;

/* deepseek2-ocr's attention scale factor: llama.cpp's deepseek2 graph (OCR
 * branch) scores q.k * kq_scale with kq_scale = mscale^2 / sqrt(head_dim);
 * this returns mscale^2, computed in float as llama.cpp does from the file's
 * rope.scaling.type `t`, rope.scaling.factor `factor` (0 = absent) and
 * rope.scaling.attn_factor `attn_factor` (1 when absent):
 *   freq_scale  = factor == 0 ? 1 : 1 / factor;   1 when t is NONE
 *   a           = 1                  (hparams.yarn_attn_factor)
 *   if t is YARN (ext_factor 1): f = 1 / freq_scale;
 *                 a = (f <= 1 ? 1 : 0.1 ln f + 1) / (1 + 0.1 ln f)
 *   a          *= attn_factor
 *   mscale      = a * (1 + 0.1 ln(1 / freq_scale))   (attn_factor_org; the
 *                 yarn_log_multiplier term is 0: llama.cpp's deepseek2-ocr
 *                 loader does not read that key)
 * The OCR branch ropes with freq_scale 1 and ext_factor 0 whatever the keys
 * say, so the rope itself never changes; rope.scaling.original_context_length
 * plays no part. ln is rope_ln rounded to float (logf, without libm). 1
 * exactly without scaling keys. */
float model_ocr_kq_mul(model_rope_scaling t, float factor, float attn_factor);
typedef enum model_vocab_kind { MODEL_VOCAB_LLAMA, MODEL_VOCAB_GPT2 } model_vocab_kind;

/* Optional metadata keys a file may leave out; the hyperparameters then hold
 * a default (bit 1u << k of model_hparams.defaulted for key k). */
typedef enum model_hp_key {
    MODEL_HP_KEY_KV_HEADS,   /* <arch>.attention.head_count_kv: head_count (no GQA) */
    MODEL_HP_KEY_CTX,        /* <arch>.context_length: 4096 */
    MODEL_HP_KEY_ROPE_BASE,  /* <arch>.rope.freq_base: 10000 */
    MODEL_HP_KEY_RMS_EPS,    /* <arch>.attention.layer_norm_rms_epsilon: 1e-5 */
    MODEL_HP_KEY_ALIGNMENT,  /* general.alignment: 32 (GGUF_DEFAULT_ALIGNMENT) */
    MODEL_HP_KEY_TOKEN_TYPE, /* tokenizer.ggml.token_type: every token normal (1) */
    MODEL_HP_KEY_COUNT
} model_hp_key;

/* Bytes of model_hparams.assumed, terminator included. */
#define MODEL_ASSUMED_BYTES 512

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
    /* Mixture of experts (deepseek; all 0 for llama and qwen2). Layers
     * [0, n_dense_lead) are dense SWIGLU of width ffn, the rest MOE. */
    uint32_t n_dense_lead;   /* deepseek.leading_dense_block_count */
    uint32_t n_expert;       /* deepseek.expert_count (routed experts) */
    uint32_t n_expert_used;  /* deepseek.expert_used_count (top-k), 1..n_expert */
    uint32_t n_expert_shared;/* deepseek.expert_shared_count (>= 1) */
    uint32_t ffn_exp;        /* deepseek.expert_feed_forward_length: one expert's width */
    float expert_weights_scale; /* deepseek.expert_weights_scale: read, NOT applied (llama.cpp's
                                   deepseek graph passes scale_w = false); deepseek2-ocr: applied
                                   unless 0 (absent) or 1 */
    /* deepseek2-ocr's router (deepseek: softmax, no norm, scale not applied) */
    model_moe_gating moe_gating; /* expert_gating_func: 1 softmax (also when absent), 2 sigmoid */
    int expert_weights_norm;     /* expert_weights_norm (bool, default false) */
    int has_exp_probs_b;         /* MoE layers carry blk.N.exp_probs_b.bias */
    /* deepseek2-ocr's rope-scaling keys (others: NONE / 0 / 1 / 0, kq_mul 1) */
    model_rope_scaling rope_scaling; /* rope.scaling.type, LINEAR when absent */
    float rope_scaling_factor;       /* rope.scaling.factor, 0 when absent */
    float rope_scaling_attn_factor;  /* rope.scaling.attn_factor, 1 when absent */
    uint32_t rope_scaling_orig_ctx;  /* rope.scaling.original_context_length, 0 when
                                        absent (reported only: it changes nothing) */
    float kq_mul; /* model_ocr_kq_mul of the keys: every query row is multiplied by
                     it after RoPE (when not 1), so a score is q.k * mscale^2 /
                     sqrt(head_dim) as llama.cpp's kq_scale makes it */
    uint32_t defaulted;  /* bit 1u << k for each model_hp_key the file lacks */
    /* The same for people, so a run can say what it assumed, in model_hp_key
     * order: "rope base 10000 (llama.rope.freq_base absent), rms epsilon
     * 1e-05 (llama.attention.layer_norm_rms_epsilon absent)"; "" when the
     * file gives every optional key. */
    char assumed[MODEL_ASSUMED_BYTES];
} model_hparams;

/* The feed-forward of a layer, chosen per layer at load (an architecture
 * may mix kinds, e.g. a dense first layer before mixture-of-experts layers).
 * Each kind names the weights of model_layer it uses and one routine
 * (model_ffn dispatches). */
typedef enum model_ffn_kind {
    MODEL_FFN_SWIGLU, /* dense: (silu(h Wgate^T) * h Wup^T) Wdown^T */
    /* DeepSeek mixture of experts, llama.cpp's build_moe_ffn with softmax
     * gating, norm_w = false, scale_w = false, plus the shared experts:
     *   p = softmax(h Wrouter^T) over all n_expert experts (max, exp(l - max)
     *       in expert order, the sum in expert order in double, p_e = e_e *
     *       (float)(1 / sum), as ggml's soft_max);
     *   top-k: the n_expert_used largest p_e in decreasing order, ties to the
     *       lower expert index; weight w_r = p_{e_r} (no renormalisation, no
     *       expert_weights_scale, as llama.cpp's deepseek graph);
     *   y_r = SwiGLU of expert e_r on h (its own gate/up/down);
     *   out = ((w_0 y_0 + w_1 y_1) + ... + w_{k-1} y_{k-1}) + shared(h)
     * summed per element in RANK order (the top-k order, as llama.cpp's
     * aggregation), each w_r y_r a separate multiply then an add (no FMA),
     * the shared experts' SwiGLU (one of width ffn_exp x n_expert_shared)
     * added last. Batch invariance: the rows routed to an expert are gathered
     * (in row order) and run through that expert's GEMMs at once (row-
     * invariant kernels), so a row's y_r and thus its sum do not depend on
     * which other rows share its experts. */
    MODEL_FFN_MOE,
    MODEL_FFN_KIND_COUNT
} model_ffn_kind;

/* "swiglu", "moe"; "unknown" out of range. */
const char *model_ffn_kind_name(model_ffn_kind k);

/* One layer's weights. Matrices are [out x in] as in GGUF. */
typedef struct model_layer {
    gemm_w *wq, *wk, *wv, *wo;      /* [n_heads*hd x hidden], [n_kv*hd x hidden] x2, [hidden x n_heads*hd] */
    model_ffn_kind ffn;             /* which feed-forward runs, and which weights below it uses */
    gemm_w *wgate, *wup, *wdown;    /* SWIGLU: [ffn x hidden] x2, [hidden x ffn];
                                       MOE: the shared experts, F = ffn_exp x n_expert_shared:
                                       [F x hidden] x2, [hidden x F] */
    gemm_w *router;                 /* MOE: ffn_gate_inp [n_expert x hidden] */
    gemm_w **egate, **eup, **edown; /* MOE: [n_expert] each, expert e packed on its own from
                                       ffn_{gate,up,down}_exps: [ffn_exp x hidden] x2,
                                       [hidden x ffn_exp] */
    float *attn_norm, *ffn_norm;    /* [hidden] */
    float *bq, *bk, *bv;            /* [n_heads*hd], [n_kv*hd] x2, or NULL */
    float *exp_probs_b;             /* MOE: [n_expert] selection bias, or NULL */
} model_layer;

typedef struct model_load_opts {
    uint32_t first_layer;  /* layer range [first_layer, first_layer + n_layers) */
    uint32_t n_layers;     /* 0 loads no layer (see want_embed / want_output) */
    int all_layers;        /* every layer of the file; first_layer and n_layers ignored */
    int want_embed;        /* head stage */
    int want_output;       /* tail stage */
    gemm_backend backend;
    const pd_alloc *alloc; /* weights' working copies (NULL = malloc) */
    const struct model *share_rope; /* borrow this model's RoPE table instead of building one (a
                                layer slice of the same file, loaded during a live
                                migration; NULL = build). It must outlive this model; used
                                only when its table was built for the same base, head size
                                and positions */
} model_load_opts;

typedef struct model model;

/* Reads hyperparameters and the requested weights. Returns owned *out (free
 * with model_free). Errors name the file, the key or tensor and the problem. */
pd_status model_load(const char *path, const model_load_opts *opts, model **out, pd_err *err);
void model_free(model *m);

/* Weights that arrive over MPI (a live migration with --weights-over-mpi):
 * the receiver builds an image of the model file — an anonymous mapping of
 * the file's size (pages never written cost nothing), the file's header
 * bytes and the tensors it needs at their offsets — and loads from it as
 * from the file. model_image_new: NULL on failure. model_load_image owns the
 * image from the call on (freed with the model, or at once on failure);
 * name stands for the file in messages. */
void *model_image_new(size_t len);
void model_image_free(void *image, size_t len);
pd_status model_load_image(void *image, size_t len, const char *name, const model_load_opts *opts, model **out,
                           pd_err *err);
/* m's file has exactly from's size and header bytes (metadata and tensor
 * directory): m takes from's digest (model_digest) without reading its
 * data, and 1 is returned; else 0. For an image whose tensor bytes came,
 * CRC-checked, from a rank that loaded the same file. */
int model_digest_inherit_header(model *m, const model *from);
/* The GGUF file the model was read from (borrowed). */
const struct gguf_file *model_gguf(const model *m);

/* Frees the weights of layers [first, first + n) (those of them the model
 * loaded): a rank that gave the layers away in a live migration keeps no
 * copy. model_layer_get of a released layer is an internal error (CHECK). */
void model_release_layers(model *m, uint32_t first, uint32_t n);
/* 1 when the model loaded every layer of [first, first + n) and released
 * none of them. */
int model_holds_layers(const model *m, uint32_t first, uint32_t n);
/* Weight bytes (packed GEMM matrices) the model holds for the layers of
 * [first, first + n) it loaded and did not release. */
uint64_t model_layers_bytes(const model *m, uint32_t first, uint32_t n);

/* Only the hyperparameters (for tools and validation before a load). */
pd_status model_read_hparams(const char *path, model_hparams *out, pd_err *err);

const model_hparams *model_hp(const model *m);
uint32_t model_first_layer(const model *m);
uint32_t model_layer_count(const model *m);
/* Layer `layer` (absolute index) of this model's range. */
const model_layer *model_layer_get(const model *m, uint32_t layer);
/* Positions a model's RoPE table covers at most: min(ctx, this). Rows past
 * it are computed by the same routine (the same bits, slower). With
 * head_dim 128 the full table takes 64 MiB. */
#define MODEL_ROPE_TABLE_POSITIONS (1u << 17)
/* 64-bit digest of the whole file's tensor data and metadata (cached). */
uint64_t model_digest(const model *m);
/* Gives m the cached digest of `from` when both come from files with the
 * same fingerprint (a layer slice loaded later from the same path, during a
 * live migration): the whole file need not be read again. Returns 0 and
 * changes nothing when the fingerprints differ. */
int model_digest_inherit(model *m, const model *from);
/* A cheap 64-bit fingerprint of the file (size, header and tensor directory,
 * 12 KiB sampled from every tensor) for ranks to check they run the same
 * model; reads about 12 KiB per tensor, not the whole file. */
uint64_t model_fingerprint(const model *m);
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

/* ---- one layer of a micro-batch ------------------------------------------ */

/* The rows of one stream inside a micro-batch: rows [row0, row0 + n), at
 * consecutive increasing positions, attending through `cache`, that stream's
 * container of the layer being computed (borrowed). */
typedef struct model_group {
    uint32_t row0, n;
    lcache *cache;
} model_group;

/* A micro-batch as one layer sees it (all borrowed for the call). */
typedef struct model_batch {
    uint32_t n;                /* rows */
    const uint64_t *pos;       /* [n] absolute positions (RoPE) */
    const uint8_t *roles;      /* [n] lcache_role values */
    const model_group *groups; /* [n_groups]: disjoint, every row in exactly one */
    uint32_t n_groups;
} model_batch;

/* Called between the GEMMs of a layer (progress may be NULL). */
typedef struct model_hooks {
    void (*progress)(void *ctx);
    void *ctx;
} model_hooks;

/* Per-row work buffers of the layer math for up to max_rows rows, sized from
 * the hyperparameters for every feed-forward kind (MOE: max_rows x
 * n_expert_used gathered rows). Opaque; owned, free with
 * model_scratch_free. One forward at a time per scratch. */
typedef struct model_scratch model_scratch;
pd_status model_scratch_new(const model_hparams *hp, uint32_t max_rows, model_scratch **out, pd_err *err);
void model_scratch_free(model_scratch *s);
uint32_t model_scratch_rows(const model_scratch *s);
/* MoE layer runs through s so far, and the distinct experts they used in
 * all (experts / calls: experts each micro-batch read per layer). */
void model_scratch_moe_stats(const model_scratch *s, uint64_t *calls, uint64_t *experts);

/* One layer (absolute index `layer`, held by m) for the rows of b, x
 * [n x hidden] in place:
 *   h = rmsnorm(x) * attn_norm;  q, k, v = h Wq^T, h Wk^T, h Wv^T (+ biases);
 *   RoPE on q and k at each row's absolute position;
 *   per group, one pool task each: lcache_append(k, v), row j attends
 *   (lcache_attend), lcache_end; with fewer groups than p's threads, the
 *   groups whose container allows it attend by ranges of KV heads, a task
 *   per (group, range) (lcache_attend_heads, the same bits);
 *   x += att Wo^T;  h = rmsnorm(x) * ffn_norm;  x += model_ffn(h).
 * The GEMMs take every row at once (row-invariant kernels), so a row's bits
 * do not depend on the other rows. hooks->progress runs after the QKV GEMMs,
 * after attention and between the feed-forward's GEMMs.
 * Errors: a container's refusal (e.g. a kv layer that cannot grow), as
 * "layer L: ...". The layer is then half done: x and the containers of this
 * and later layers no longer agree, and the caller must stop using them. */
pd_status model_layer_forward(const model *m, uint32_t layer, const model_batch *b, float *x,
                              model_scratch *s, pool *p, const model_hooks *hooks, pd_err *err);

/* The feed-forward of layer `layer`, dispatched on its kind: out [n x hidden]
 * from the normed rows h [n x hidden] (out may not alias h). n <= the
 * scratch's rows; hooks may be NULL. hooks->progress runs twice per call
 * (SWIGLU: after gate/up and after down; MOE: after the router and the shared
 * experts' gate/up, and after the experts and the shared down). MOE spreads
 * the routed experts over p's threads, one task per expert used by some row
 * (each expert's weights are read once for all its rows). */
void model_ffn(const model *m, uint32_t layer, const float *h, uint32_t n, float *out, model_scratch *s,
               pool *p, const model_hooks *hooks);

/* ---- row-local math (fixed order, shared by every stage) ---------------- */

/* y = x * (1 / sqrt(mean(x^2) + eps)) * w, per row of n; mean via attn_dot8. */
void model_rmsnorm(const float *x, const float *w, uint32_t n, float eps, float *y);
/* Rotates one row of n_heads heads of head_dim in place for absolute
 * position pos, with angles from rope_freq / rope_angle computed for this
 * call (no table): the bits a model's table gives. */
void model_rope_row(float *x, uint32_t n_heads, uint32_t head_dim, uint64_t pos, float base,
                    model_rope style);
/* a[i] = silu(g[i]) * u[i] with silu(x) = x / (1 + pd_expf(-x)). */
void model_swiglu(const float *g, const float *u, uint32_t n, float *a);
/* The MOE router for one row: p[e] = softmax(logits)[e] over n_expert
 * (MODEL_FFN_MOE's formula), then the k largest in decreasing order, ties to
 * the lower index: sel[r] = expert, w[r] = p[sel[r]] for r < k. p may alias
 * logits. 1 <= k <= n_expert. */
void model_moe_route(const float *logits, uint32_t n_expert, uint32_t k, float *p, uint32_t *sel,
                     float *w);
/* The same with a router's options (o NULL = model_moe_route): p is the
 * gating function's output; the selection compares p[e] + sel_bias[e]
 * (f32 adds), ties to the lower index; w[r] = p[sel[r]], then normalised and
 * scaled as o says (sigmoid: p = 1 / (1 + pd_expf(-l))). */
void model_moe_route_ex(const float *logits, uint32_t n_expert, uint32_t k, const model_moe_opts *o, float *p,
                        uint32_t *sel, float *w);

#endif
