/* fromweights: assembles a GGUF model from a directory of trained weights
 * (what scripts/train_ocr.py exports), with the project's GGUF writer.
 *
 * DIR/config.json:
 *   {"arch": "llama", "layers": L, "hidden": H, "heads": NH, "kv_heads": NKV,
 *    "ffn": F, "ctx": C, "rope_base": 10000.0, "rms_eps": 1e-5,
 *    "vocab": "bytes", "ocr_cells": 256, "ocr_prompt": [79, 67, 82, 58],
 *    "name": "..."}
 * DIR/<tensor name>.npy: float32, 2-D, shape [rows, cols] = [out, in] of
 *   each matrix (GGUF ne = [cols, rows]); vectors as [1, n]. Names are the
 *   ones cluster/model/model.c loads: token_embd.weight [V, H],
 *   blk.N.attn_norm.weight [1, H], blk.N.attn_{q,k,v}.weight,
 *   blk.N.attn_output.weight, blk.N.ffn_norm.weight [1, H],
 *   blk.N.ffn_{gate,up}.weight [F, H], blk.N.ffn_down.weight [H, F],
 *   output_norm.weight [1, H], output.weight [V, H] (untied).
 *
 * "arch": "deepseek" (DeepSeek V1 mixture of experts, MODEL_FFN_MOE in
 * cluster/model/model.h; RoPE on adjacent pairs) or "deepseek2-ocr" (the
 * same layers as DeepSeek-OCR's decoder is written by llama.cpp's converter:
 * NEOX RoPE on (i, i + d/2), MHA, plus its vocab_size, rope.dimension_count
 * 0 and expert_gating_func keys) adds to the config
 *   "dense_layers": D, "experts": E, "experts_used": K, "expert_ffn": FE,
 *   "shared_experts": S, "expert_gating": "softmax",
 *   "expert_weights_norm": false, "expert_weights_scale": 1
 * (the last three are the only math the loader runs, so they must be said
 * as such; they become deepseek.* keys with the others). Layers below D are
 * dense as above (ffn F); each later layer has, instead of ffn_{gate,up,down}:
 *   blk.N.ffn_gate_inp.weight [E, H] (the router; kept f32 whatever the dtype,
 *     so the top-K choice is the trainer's),
 *   blk.N.ffn_{gate,up}_exps.weight [E * FE, H], blk.N.ffn_down_exps.weight
 *     [E * H, FE]: the E experts' matrices stacked by rows (expert e is rows
 *     [e * FE, (e + 1) * FE), resp. [e * H, (e + 1) * H)), written as the 3-D
 *     GGUF stacks [H, FE, E] / [FE, H, E],
 *   blk.N.ffn_{gate,up}_shexp.weight [S * FE, H],
 *   blk.N.ffn_down_shexp.weight [H, S * FE].
 *
 * "vocab": "bytes" is the only vocabulary: 258 tokens, token b < 256 is the
 * byte b (GPT-2 byte-level pieces, tokenizer.ggml.model "gpt2"), 256 is BOS
 * "<|bos|>", 257 is EOS "<|endoftext|>" (both control); tokenizer.ggml.merges
 * is empty and tokenizer.ggml.pre "default", so text tokenizes to its bytes
 * in pipedec and in llama.cpp alike (a {"text": ...} segment, pipedec
 * tokenize, llama-tokenize). Matrices are stored
 * as `dtype` (f32 or f16), norms as f32. ocr_cells / ocr_prompt become the
 * pipedec.ocr.* keys (cluster/cli/ocrmeta.h). Every file and field is
 * checked (shape against the config, finite values) before anything is
 * written; the GGUF is published atomically. */
#ifndef PD_FROMWEIGHTS_H
#define PD_FROMWEIGHTS_H

#include "base/status.h"

#define FROMWEIGHTS_VOCAB 258
#define FROMWEIGHTS_BOS 256
#define FROMWEIGHTS_EOS 257

pd_status fromweights_write(const char *dir, int f16, const char *out_path, pd_err *err);

/* `mkmodel --revocab IN --out OUT`: rewrites the tokenizer.ggml.* keys of a
 * byte-vocabulary model (258 tokens as above; an older file lacks merges and
 * pre) as fromweights_write writes them today, copying every other key in
 * file order and every tensor byte for byte (no retraining, no weight
 * changes). Anything but the byte vocabulary is refused by name. OUT may be
 * IN: it is published atomically. Running it on its own output gives the
 * same bytes. */
pd_status fromweights_revocab(const char *in_path, const char *out_path, pd_err *err);

/* `mkmodel --to-ocr IN --out OUT`: a `deepseek` (V1) file rewritten as the
 * same network in `deepseek2-ocr` form, without retraining. The two differ
 * only in RoPE: deepseek rotates adjacent pairs (2i, 2i+1), deepseek2-ocr
 * (NEOX) rotates (i, i + d/2), both at angle pos * base^(-2i/d). So each
 * head's q and k rows (and biases, if any) are reordered, new row i = old
 * row 2i and new row i + d/2 = old row 2i + 1: NEOX then rotates the same
 * pairs by the same angles, and every q.k score has the same terms (summed
 * in another order, so a float may differ in its last bits: tokens can
 * differ where two logits all but tie). Keys: every deepseek.* key as
 * deepseek2-ocr.* (rope.dimension_count 0), plus what llama.cpp's converter
 * writes for DeepSeek-OCR (vocab_size, expert_gating_func softmax); other
 * keys and tensors copied byte for byte. Refused, by name: another
 * architecture, GQA (deepseek2-ocr is MHA), an expert_weights_scale that V1
 * ignores but deepseek2-ocr would apply (not 0 or 1), an odd head size. OUT
 * may be IN: it is published atomically. */
pd_status fromweights_to_ocr(const char *in_path, const char *out_path, pd_err *err);

#endif
