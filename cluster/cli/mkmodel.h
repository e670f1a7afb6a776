/* mkmodel: a deterministic synthetic GGUF model for tests, the demo and the
 * benchmarks.
 *
 * Same options and seed -> the same bytes. Weights are uniform with scales
 * chosen so activations stay well-conditioned for hundreds of tokens: the
 * projections keep unit variance, the residual branches are damped by
 * 1/sqrt(2 * layers), norms are near one. The vocabulary detokenizes to
 * printable text: llama-style models get SentencePiece pieces ("▁" word marks,
 * 256 <0xNN> byte tokens, <unk>/<s>/</s>), qwen2-style models get GPT-2
 * byte-level BPE pieces ("Ġ" for a space) and <|endoftext|>; deepseek models
 * the same pieces with DeepSeek's specials (BOS 0, EOS 1).
 *
 * deepseek: llama.cpp's keys and tensor names (model.h): `dense_lead` dense
 * layers, then MoE layers with `experts` routed experts of width
 * `expert_ffn` (top `experts_used`) and `shared` shared experts. The router
 * weights are scaled so that the softmax is neither flat nor one-hot. */
#ifndef PD_MKMODEL_H
#define PD_MKMODEL_H

#include "base/status.h"
#include "cluster/model/model.h"

#include <stdint.h>

/* Matrix storage: F32, F16, BF16 or Q8_0 (blocks of 32 along a row: an f16
 * scale amax / 127 and 32 rounded int8, as llama.cpp quantizes; every
 * matrix's row length must then be a multiple of 32), or ggml's Q4_0, Q5_0,
 * Q4_K, Q5_K, Q6_K blocks (simple round-to-nearest quantizers with ggml's
 * byte layouts, not ggml's search for the best scales). A K-type matrix
 * whose row is not a multiple of 256 takes llama-quantize's fallback type
 * (Q4_K -> Q5_0, Q5_K -> Q5_0 here (llama.cpp: Q5_1), Q6_K -> Q8_0). */
typedef enum mk_dtype { MK_F32, MK_F16, MK_BF16, MK_Q8_0, MK_Q4_0, MK_Q5_0, MK_Q4_K, MK_Q5_K, MK_Q6_K, MK_DTYPE_COUNT } mk_dtype;

/* "f32" .. "q6_k" (the --dtype spellings); NULL out of range. */
const char *mk_dtype_name(mk_dtype t);

typedef struct mkmodel_opts {
    model_arch arch;
    uint32_t layers, hidden, heads, kv_heads, ffn, vocab, ctx;
    mk_dtype dtype;    /* how matrices are stored (vectors are always F32) */
    uint64_t seed;
    float eos_boost;   /* multiplies the output row of EOS (1 = none) */
    uint32_t repeat;   /* > 0: greedy text cycles through the last `repeat`
                          tokens of the vocabulary (benchmarks of speculation):
                          each token's embedding is added, scaled, to the
                          output row of its successor in the cycle (a token
                          outside it leads into it) */
    /* deepseek only */
    uint32_t dense_lead, experts, experts_used, expert_ffn, shared;
    float expert_scale; /* deepseek.expert_weights_scale */
    /* deepseek2-ocr only: rope-scaling keys as llama.cpp's converter writes
     * them for a YaRN model (model_ocr_kq_mul); NULL / 0: not written */
    const char *rope_scaling; /* rope.scaling.type: "none", "linear" or "yarn" */
    float rope_factor;        /* rope.scaling.factor */
    uint32_t rope_orig_ctx;   /* rope.scaling.original_context_length */
    float yarn_log_mul;       /* rope.scaling.yarn_log_multiplier (the converter's
                                 0.1 * mscale_all_dim; llama.cpp's deepseek2-ocr
                                 does not read it) */
} mkmodel_opts;

/* Defaults: llama, 4 layers, hidden 64, 4 heads, 2 kv heads, ffn 128,
 * vocab 512, ctx 2048, f32, seed 1. */
void mkmodel_defaults(mkmodel_opts *o);
/* Defaults for --arch deepseek and deepseek2-ocr (set o->arch after):
 * DeepSeek-OCR's decoder shape, 12 layers,
 * hidden 1280, 10 x 128 heads (MHA), 1 dense layer of ffn 6848, 64 experts
 * (top 6) of ffn 896, 2 shared, vocab 129280, ctx 8192, expert scale 1,
 * f32, seed 1. */
void mkmodel_defaults_deepseek(mkmodel_opts *o);

/* Validates the options (names the bad one) and writes the model to path
 * atomically (gguf_writer_write: a temporary file renamed over path). */
pd_status mkmodel_write(const mkmodel_opts *o, const char *path, pd_err *err);

#endif
