/* mmproj: what pipedec reads itself of a vision projector GGUF (clip.* keys,
 * written by llama.cpp's converter for mtmd), without llama.cpp.
 *
 * The rows a projector makes must be exactly as wide as the decoder's hidden
 * size. mtmd compares the two only against a fully loaded text model, and the
 * encoder opens the decoder vocabulary-only (its weights belong to pipedec's
 * ranks), so pipedec checks the width itself, from the files: for
 * DeepSeek-OCR's projectors (clip.projector_type "deepseekocr",
 * "deepseekocr2") it is the output dimension ne[1] of mm.model.fc.weight, as
 * clip_n_mmproj_embd reads it. Other projector types are refused by name.
 * Everything here reads the header (keys and tensor directory) only. */
#ifndef PD_MMPROJ_H
#define PD_MMPROJ_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

/* cluster/format/gguf.h's reader, declared here rather than included:
 * vision/venc.c includes this header beside llama.cpp's own gguf.h, whose
 * functions share names with pipedec's reader. */
typedef struct gguf_file gguf_file;

/* What the header of a projector file says (mmproj_describe). A field whose
 * key is absent is 0 (false for the flags); the file's values are reported
 * as written, although clip fixes some of them for DeepSeek-OCR (1024-pixel
 * overview, 16-pixel patches: docs/mmproj.md). */
typedef struct mmproj_info {
    char projector[64];     /* clip.projector_type (or clip.vision.projector_type), NUL-terminated */
    bool known;             /* a projector pipedec reads: deepseekocr, deepseekocr2 */
    bool has_vision;        /* clip.has_vision_encoder */
    uint32_t image_size;    /* clip.vision.image_size */
    uint32_t patch_size;    /* clip.vision.patch_size */
    uint32_t clip_width, clip_layers, clip_heads;   /* clip.vision.{embedding_length,block_count,attention.head_count} */
    uint32_t sam_width, sam_layers, sam_heads;      /* clip.vision.sam.* (DeepSeek-OCR's SAM encoder) */
    uint32_t window;        /* clip.vision.window_size: SAM's local window */
    uint64_t fc_in;         /* mm.model.fc.weight ne[0]: [CLIP row ; SAM row] */
    uint64_t width;         /* mm.model.fc.weight ne[1]: the rows' width = the decoder hidden size it fits */
} mmproj_info;

/* 1 when the open GGUF f is a projector file: it has clip.projector_type
 * (or clip.vision.projector_type) or general.architecture "clip". */
bool mmproj_is(const gguf_file *f);

/* Fills *out from the keys and tensor directory of f (path names it in
 * messages). PD_OK when pipedec can use it; otherwise *out holds what could
 * be read and the status says why not: no projector type (PD_ERR_FORMAT),
 * a projector other than DeepSeek-OCR's (PD_ERR_UNSUPPORTED),
 * mm.model.fc.weight missing or not a matrix (PD_ERR_FORMAT). */
pd_status mmproj_describe(const gguf_file *f, const char *path, mmproj_info *out, pd_err *err);

/* Reads the mmproj's projector type and row width and the model's hidden
 * size; PD_OK and *width when they agree, else a status and a message naming
 * both files and both widths (PD_ERR_MISMATCH), the unknown projector type
 * (PD_ERR_UNSUPPORTED) or what is missing (PD_ERR_FORMAT, PD_ERR_IO). */
pd_status mmproj_check(const char *mmproj, const char *model_path, uint32_t *width, pd_err *err);

#endif
