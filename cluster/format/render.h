/* render: the OCR page encoder that stands in for a vision encoder.
 *
 * Turns text (lines separated by '\n', pages by '\f') into page manifests
 * whose embedding rows a decoder can transcribe: each page is BOS, a fixed
 * number of glyph cells (one row per character, one "end of line" row after
 * every line, blank padding rows up to the page's capacity, as a vision
 * encoder emits a fixed number of tokens per image), then a short prompt.
 * A cell's row is a fixed projection of 52 features to the model's hidden
 * size:
 *
 *   feature    meaning
 *   0..34      the character's 5x7 bitmap from the built-in font, row-major
 *              (row r, column c at 5r + c): 1 = ink, 0 = paper
 *   35..40     line index, 6 bits (bit b at 35 + b): +1 set, -1 clear
 *   41..47     column index, 7 bits (bit b at 41 + b): +1 set, -1 clear
 *   48, 49, 50 kind: glyph, end of line, padding (one of them 1, others 0)
 *   51         1 (a bias)
 *
 *   row[h] = sum over f = 0..51, in order, of P[h][f] * feature[f]
 *   P[h][f] = +0.25 or -0.25: the low bit of render_mix(RENDER_SEED ^
 *             render_mix(h * 64 + f)) (1 = minus)
 *
 * Every term is a multiple of 0.25 below 2^10, so each sum is exact: the
 * bytes do not depend on the compiler, the host or the summation order.
 * Padding cells have line 0, column 0; an end-of-line cell has the column
 * after the line's last character. Text must be printable ASCII (32..126)
 * plus '\n' and '\f'; a page holds at most RENDER_MAX_LINES lines of at most
 * RENDER_MAX_COLS characters. The transcription of a page is its lines,
 * each followed by '\n' (render_page_truth). */
#ifndef PD_RENDER_H
#define PD_RENDER_H

#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

#define RENDER_FEATURES 52
#define RENDER_GLYPH_W 5
#define RENDER_GLYPH_H 7
#define RENDER_MAX_LINES 64
#define RENDER_MAX_COLS 126 /* the end-of-line cell takes column 126 at most (7 bits) */
#define RENDER_SEED 0x0c5e4d3a2b1f7081ull
/* Default page capacity in cells and the default prompt ("OCR:" as bytes)
 * for models that do not name their own (GGUF keys pipedec.ocr.*). */
#define RENDER_DEFAULT_CELLS 384
#define RENDER_MAX_PROMPT 16

/* A text split into pages. Opaque; owned, free with render_doc_free.
 * INV: every page's text is printable ASCII and '\n' only, ends with '\n',
 * fits the line limits, and n_pages >= 1. */
typedef struct render_doc render_doc;

/* Splits text[0..len) into pages at '\f' (a final empty page after a
 * trailing '\f', or a trailing "\f\n", is dropped; any other empty page is
 * refused) and validates it. A page's last line may lack its '\n'. Errors
 * name the page, line and column in 1-based numbers, e.g.
 * "page 2, line 3, column 17: byte 0x09 is not printable ASCII". */
pd_status render_doc_parse(const char *text, size_t len, render_doc **out, pd_err *err);
void render_doc_free(render_doc *d);
size_t render_doc_pages(const render_doc *d);
/* Page i's transcription: its lines each ending in '\n'; borrowed until
 * render_doc_free. */
const char *render_page_truth(const render_doc *d, size_t i, size_t *len);
/* Cells page i uses (characters plus one per line), before padding. */
uint32_t render_page_cells(const render_doc *d, size_t i);

/* The 5 column bytes of a printable ASCII character's glyph (bit r = row r,
 * top row bit 0); NULL outside 32..126. */
const uint8_t *render_glyph(int ch);

/* The features of page i's cell `cell` (0 <= cell < capacity; cells past
 * render_page_cells are padding) into f[RENDER_FEATURES]. */
void render_cell_features(const render_doc *d, size_t i, uint32_t cell, float f[RENDER_FEATURES]);

/* Page i as `cells` embedding rows of `hidden` into out [cells x hidden].
 * Refuses (PD_ERR_RANGE) a page that uses more than `cells` cells. */
pd_status render_page_embed(const render_doc *d, size_t i, uint32_t cells, uint32_t hidden, float *out,
                            pd_err *err);

/* How render_write lays pages out. */
typedef struct render_opts {
    uint32_t hidden;              /* the model's hidden size */
    uint32_t cells;               /* cells per page (capacity) */
    uint32_t bos;                 /* BOS token id */
    uint32_t prompt[RENDER_MAX_PROMPT];
    uint32_t n_prompt;            /* 0..RENDER_MAX_PROMPT */
    const char *prompt_text;      /* non-NULL: the prompt is written as {"text": prompt_text}
                                     (the caller checked it tokenizes to prompt[]); NULL: as
                                     {"tokens": prompt[]} */
    uint32_t max_new_extra;       /* max_new_tokens = cells used + this (room for EOS) */
    const char *id_prefix;        /* page ids are <prefix><5 digits from 0> */
} render_opts;

/* Writes dir/pages.jsonl (one line per page, in order) and dir/<id>.npy;
 * creates dir if missing. Every page is checked against the capacity before
 * anything is written; the manifest is published atomically after its .npy
 * files. */
pd_status render_write(const render_doc *d, const render_opts *o, const char *dir, pd_err *err);

#endif
