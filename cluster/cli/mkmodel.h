/* mkmodel: a deterministic synthetic GGUF model for tests, the demo and the
 * benchmarks.
 *
 * Same options and seed -> the same bytes. Weights are uniform with scales
 * chosen so activations stay well-conditioned for hundreds of tokens: the
 * projections keep unit variance, the residual branches are damped by
 * 1/sqrt(2 * layers), norms are near one. The vocabulary detokenizes to
 * printable text: llama-style models get SentencePiece pieces ("▁" word marks,
 * 256 <0xNN> byte tokens, <unk>/<s>/</s>), qwen2-style models get GPT-2
 * byte-level BPE pieces ("Ġ" for a space) and <|endoftext|>. */
#ifndef PD_MKMODEL_H
#define PD_MKMODEL_H

#include "base/status.h"
#include "cluster/model/model.h"

#include <stdint.h>

typedef struct mkmodel_opts {
    model_arch arch;
    uint32_t layers, hidden, heads, kv_heads, ffn, vocab, ctx;
    int f16;           /* matrices stored as F16 instead of F32 */
    uint64_t seed;
    float eos_boost;   /* multiplies the output row of EOS (1 = none) */
} mkmodel_opts;

/* Defaults: llama, 4 layers, hidden 64, 4 heads, 2 kv heads, ffn 128,
 * vocab 512, ctx 2048, f32, seed 1. */
void mkmodel_defaults(mkmodel_opts *o);

/* Validates the options (names the bad one) and writes the model to path
 * atomically (gguf_writer_write: a temporary file renamed over path). */
pd_status mkmodel_write(const mkmodel_opts *o, const char *path, pd_err *err);

#endif
