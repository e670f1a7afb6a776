/* mkmmproj: a deterministic random DeepSeek-OCR vision projector ("mmproj")
 * in the GGUF layout llama.cpp's clip loader reads for
 * clip.projector_type = "deepseekocr" (tools/mtmd/clip.cpp, the graph in
 * tools/mtmd/models/deepseekocr.cpp), with small widths so that
 * llama-mtmd-cli encodes a page in seconds on two cores. It exists for the
 * anchor tests of issue 38: pipedec's vision stage against libmtmd on the
 * same random weights.
 *
 * Same options and seed -> the same bytes. Weights are uniform, scaled so
 * each matrix keeps unit variance (residual branches damped by
 * 1/sqrt(2 * layers)), norms near one: every embedding row is finite.
 *
 * The encoder, as the graph runs it (ggml shapes, ne[0] first):
 *
 *   page 1024x1024 (and rows of 640x640 tiles), RGB, (x/255 - 0.5) / 0.5
 *   SAM   v.sam.patch_embd   conv 16x16 stride 16, 3 -> S       [16,16,3,S]
 *         + v.sam.pos_embd   [S,64,64,1] (bicubic-resized for 640 tiles)
 *         L_sam blocks (pre-LN, fused qkv, rel-pos attention, GELU MLP 4S);
 *         blocks 2, 5, 8, 11 attend globally (clip hard-codes the list),
 *         the others in window x window windows; rel-pos tables
 *         [S/heads, 2*span-1] with span = window or 64
 *         neck: conv 1x1 S -> N, LN2d, conv 3x3 N -> N, LN2d (eps 1e-6)
 *         net_2: conv 3x3 stride 2 N -> 2N; net_3: conv 3x3 stride 2 2N -> D
 *   CLIP  takes SAM's D x 16x16 grid as its patch embeddings (so D is both
 *         net_3's output and CLIP's width): [CLS]+grid + position_embd
 *         [D,257], pre-LN, L_clip blocks (fused qkv, quick-GELU MLP 4D,
 *         eps 1e-5), no post-LN
 *   proj  concat(CLIP rows without CLS, SAM rows) -> mm.model.fc [2D,H] + bias
 *         overview: 16 rows of 16 + v.image_newline each, then
 *         v.view_seperator: 273 rows of width H; a row of k tiles:
 *         10 rows of 10k + newline.
 *
 * N = D/4 and 2N = D/2 as in DeepSeek-OCR (256, 512, 1024). */
#ifndef PD_MKMMPROJ_H
#define PD_MKMMPROJ_H

#include "base/status.h"
#include "cluster/cli/mkmodel.h"

#include <stdint.h>

typedef struct mkmmproj_opts {
    uint32_t hidden;      /* projector output width: the decoder's hidden (H) */
    uint32_t sam_layers;  /* L_sam; 3 reaches clip's first global block (2) */
    uint32_t sam_width;   /* S */
    uint32_t sam_heads;   /* S / sam_heads is the rel-pos table width */
    uint32_t clip_layers; /* L_clip */
    uint32_t clip_width;  /* D, a multiple of 4 */
    uint32_t clip_heads;
    uint32_t window;      /* SAM's local attention window (DeepSeek-OCR: 14) */
    mk_dtype dtype;       /* matrices: MK_F32 or MK_F16; vectors, embeddings,
                             rel-pos tables and the neck stay F32, as the
                             converter forces them */
    uint64_t seed;
} mkmmproj_opts;

/* Defaults: hidden 64, SAM 3 layers x width 32 (2 heads of 16), CLIP 2 layers
 * x width 64 (4 heads), window 14, f32, seed 1. Callers set hidden to their
 * decoder's. */
void mkmmproj_defaults(mkmmproj_opts *o);

/* Validates the options (naming the bad flag: "--sam-width 30 must be a
 * multiple of --sam-heads 4") and writes the mmproj to path atomically
 * (gguf_writer_write). */
pd_status mkmmproj_write(const mkmmproj_opts *o, const char *path, pd_err *err);

/* The same bytes into memory: *buf is owned by the caller (free with free()). */
pd_status mkmmproj_to_mem(const mkmmproj_opts *o, void **buf, size_t *len, pd_err *err);

#endif
