/* ocrmeta: what the OCR tools (render, mkmodel --from-weights) need to know
 * of a model: its hidden size, BOS / EOS, and the page layout it was trained
 * on, kept in GGUF keys of its own:
 *   pipedec.ocr.cells    u32          cells per page (render.h)
 *   pipedec.ocr.prompt   i32 array    the prompt tokens after the cells
 * A model without them (a synthetic one) gets RENDER_DEFAULT_CELLS and the
 * bytes of "OCR:" as tokens when its vocabulary is byte-level (token id =
 * byte, as --from-weights writes), else no prompt. */
#ifndef PD_OCRMETA_H
#define PD_OCRMETA_H

#include "base/status.h"
#include "cluster/format/render.h"

#include <stdint.h>

typedef struct ocrmeta {
    uint32_t hidden, vocab, bos, eos;
    uint32_t cells;
    uint32_t prompt[RENDER_MAX_PROMPT];
    uint32_t n_prompt;
} ocrmeta;

#define OCRMETA_KEY_CELLS "pipedec.ocr.cells"
#define OCRMETA_KEY_PROMPT "pipedec.ocr.prompt"

/* Reads the model's hyperparameters and OCR keys; a key of the wrong type or
 * out of range (cells 1..65536, at most RENDER_MAX_PROMPT prompt tokens, each
 * inside the vocabulary) is refused by name. */
pd_status ocrmeta_read(const char *model_path, ocrmeta *out, pd_err *err);

/* The prompt as text, for a {"text": ...} segment: the pieces of m's prompt
 * ids (control tokens as their own text), kept only when the model's own
 * tokenizer (special tokens parsed, no BOS) turns that text back into
 * exactly those ids. On PD_OK *text is owned (free()); otherwise *text is
 * NULL and err says why the prompt must stay token ids (no prompt, a
 * tokenizer pipedec cannot load, or text that tokenizes differently). */
pd_status ocrmeta_prompt_text(const char *model_path, const ocrmeta *m, char **text, pd_err *err);

#endif
