/* mmproj: what pipedec reads itself of a vision projector GGUF (clip.* keys,
 * written by llama.cpp's converter for mtmd), without llama.cpp.
 *
 * The rows a projector makes must be exactly as wide as the decoder's hidden
 * size. mtmd compares the two only against a fully loaded text model, and the
 * encoder opens the decoder vocabulary-only (its weights belong to pipedec's
 * ranks), so pipedec checks the width itself, from the files: for
 * DeepSeek-OCR's projectors (clip.projector_type "deepseekocr",
 * "deepseekocr2") it is the output dimension ne[1] of mm.model.fc.weight, as
 * clip_n_mmproj_embd reads it. Other projector types are refused by name. */
#ifndef PD_MMPROJ_H
#define PD_MMPROJ_H

#include <stdint.h>

#include "base/status.h"

/* Reads the mmproj's projector type and row width and the model's hidden
 * size; PD_OK and *width when they agree, else a status and a message naming
 * both files and both widths (PD_ERR_MISMATCH), the unknown projector type
 * (PD_ERR_UNSUPPORTED) or what is missing (PD_ERR_FORMAT, PD_ERR_IO). */
pd_status mmproj_check(const char *mmproj, const char *model_path, uint32_t *width, pd_err *err);

#endif
