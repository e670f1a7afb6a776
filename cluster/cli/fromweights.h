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
 * "vocab": "bytes" is the only vocabulary: 258 tokens, token b < 256 is the
 * byte b (GPT-2 byte-level pieces, tokenizer.ggml.model "gpt2"), 256 is BOS
 * "<|bos|>", 257 is EOS "<|endoftext|>" (both control). Matrices are stored
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

#endif
