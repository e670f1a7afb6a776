/* pages: the page manifest a decode run reads (JSON Lines, one page a line).
 *
 * A page is a JSON object on one line; lines holding only whitespace are
 * skipped; a trailing '\r' (CRLF files) counts as whitespace:
 *   {"id": "p7", "prefill": [{"tokens": [1, 2, 3]}, {"embeddings": "p7.npy"}],
 *    "max_new_tokens": 256}
 *   id              non-empty string, valid UTF-8, at most PAGES_MAX_ID_BYTES
 *                   bytes, unique within the manifest
 *   prefill         non-empty array of segments, in order; each segment is an
 *                   object with exactly one key:
 *                     "tokens": non-empty array of integers in [0, vocab_size)
 *                               (integral JSON numbers such as 5 or 5.0)
 *                     "text": non-empty UTF-8 string, tokenized with the
 *                               model's own tokenizer (pages_opts.tokenize:
 *                               no BOS, special tokens parsed) into a tokens
 *                               segment; one that gives no tokens is refused
 *                     "embeddings": path of a '<f4' .npy file of shape
 *                               [rows >= 1, hidden] with finite values; a
 *                               relative path is relative to the manifest's
 *                               directory, an absolute path is used as is
 *                     "image": path of a page image (PNG, JPEG, PPM),
 *                               resolved as embeddings paths are; its rows
 *                               come from the vision encoder
 *                               (cluster/vision/venc.h): pages_load resolves
 *                               the path and counts the rows through
 *                               pages_opts.image_rows when given (run
 *                               --mmproj), else leaves rows 0 (`pipedec
 *                               encode` turns such pages into embeddings pages)
 *   max_new_tokens  integer in [0, PAGES_MAX_NEW_TOKENS]
 * Every key is required. Unknown keys, in a page or a segment, are refused
 * (a typo such as "max_new_token" must not silently mean a default), and so
 * are keys given twice. No string (id, key, path) may contain a NUL character
 * (\u0000 or a raw 0x00 byte): the parsed text would end there, so "a\u0000b"
 * would silently be the id "a". A page's prefill has at most PAGES_MAX_PREFILL_ROWS
 * rows in total.
 *
 * Errors name the manifest (as the caller spelled its path), the 1-based line,
 * the page id once known, and the field:
 *   pages.jsonl:7: page "p7": prefill[1].embeddings: p7.npy: shape [273, 640]
 *   does not match hidden size 1280
 *
 * Embedding blocks are validated at load (header, shape, size, and by default
 * every value finite, scanned in bounded chunks) but not kept in memory: the
 * caller reads rows on demand with pages_embed_read, so thousands of pages do
 * not sit in memory. No MPI, no GGUF: the caller passes vocab and hidden size. */
#ifndef PD_PAGES_H
#define PD_PAGES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cluster/format/npy.h"

#define PAGES_MAX_ID_BYTES 256u
#define PAGES_MAX_NEW_TOKENS (1u << 20)
#define PAGES_MAX_PREFILL_ROWS (1u << 24)

typedef enum pages_seg_kind {
    PAGES_SEG_TOKENS,
    PAGES_SEG_EMBEDDINGS,
    PAGES_SEG_TEXT,  /* only when loaded without pages_opts.tokenize: rows 0, text set */
    PAGES_SEG_IMAGE, /* rows 0, file and path set: for the vision encoder */
    PAGES_SEG_KIND_COUNT
} pages_seg_kind;

/* One prefill segment (borrowed from its pages object).
 * INV: rows >= 1 except for PAGES_SEG_TEXT (rows 0, text set: loaded without a
 *      tokenizer) and PAGES_SEG_IMAGE (file and path set; rows 0 unless counted
 *      by pages_opts.image_rows); tokens set
 *      iff kind == PAGES_SEG_TOKENS; npy set iff kind == PAGES_SEG_EMBEDDINGS,
 *      with npy.rows == rows and
 *      npy.cols == the hidden size given to pages_load. */
typedef struct pages_seg {
    pages_seg_kind kind;
    uint32_t rows;         /* token count, or embedding rows */
    const int32_t *tokens; /* [rows] token ids in [0, vocab_size) */
    const char *file;      /* the path as written in the manifest */
    const char *path;      /* the path that is opened (resolved against the manifest dir) */
    npy_info npy;          /* the header validated at load */
    const char *text;      /* PAGES_SEG_TEXT: the text as written */
    const char *error;     /* PAGES_SEG_IMAGE counted by pages_opts.image_rows and refused
                            * by it: why (the page fails with it when decoded; rows 1) */
} pages_seg;

/* One page (borrowed from its pages object).
 * INV: n_segs >= 1; prefill_rows == sum of segs[].rows <= PAGES_MAX_PREFILL_ROWS. */
typedef struct pages_page {
    const char *id;          /* NUL-terminated UTF-8 */
    uint32_t line;           /* 1-based manifest line */
    uint32_t max_new_tokens; /* <= PAGES_MAX_NEW_TOKENS */
    uint64_t prefill_rows;
    uint32_t n_segs;
    const pages_seg *segs;   /* [n_segs] in prefill order */
} pages_page;

/* pages_opts.image_rows: the prefill rows the image at path becomes. */
typedef pd_status (*pages_image_rows_fn)(void *ctx, const char *path, uint32_t *rows, pd_err *err);

typedef struct pages_opts {
    /* Validate embeddings by header only (skip the finite-value scan at load;
     * pages_embed_read still checks every value it returns). */
    bool header_only;
    /* Tokenizes a "text" segment (valid UTF-8, NUL-free, len bytes): on PD_OK
     * *ids is owned by the caller (free()), *n ids; on failure err says why.
     * NULL: text segments are kept as PAGES_SEG_TEXT (tools without a model). */
    pd_status (*tokenize)(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n,
                          pd_err *err);
    void *tokenize_ctx;
    /* Counts the prefill rows an "image" segment's file becomes (the vision
     * encoder, venc.h, from the image's header); NULL: image segments keep
     * rows 0. A refusal does not fail the load: the segment gets rows 1 and
     * error set, so that page alone fails when it is decoded. */
    pages_image_rows_fn image_rows;
    void *image_ctx;
} pages_opts;

typedef struct pages pages;

/* Loads and validates the manifest at path for a model with vocab_size tokens
 * and hidden-size rows. hidden == 0 means no model is at hand (a tool that
 * splits a manifest): embedding files are checked by header only and their
 * width is not compared, and pages_embed_read refuses to read. opts may be NULL (defaults: full validation). On PD_OK
 * *out is owned by the caller (free with pages_free); on failure nothing is
 * allocated, *out is untouched and err names line, page and field. An empty
 * manifest (no pages) loads fine. */
pd_status pages_load(const char *path, uint32_t vocab_size, uint32_t hidden,
                     const pages_opts *opts, pages **out, pd_err *err);

/* Frees p; pages_free(NULL) is a no-op. */
void pages_free(pages *p);

/* Number of pages, in manifest order. */
size_t pages_count(const pages *p);

/* Page i (< pages_count); borrowed, valid until pages_free. */
const pages_page *pages_get(const pages *p, size_t i);

/* Index of the page with this id, or -1. */
long pages_find(const pages *p, const char *id);

/* Reads rows [row0, row0 + n) of embeddings segment `seg` of page `page` into
 * dst [n x hidden] (caller-owned). The file must still be the one validated
 * at load (same header and size) and every value read must be finite; else a
 * status and an error naming line, page and field. */
pd_status pages_embed_read(const pages *p, size_t page, size_t seg, uint32_t row0, uint32_t n,
                           float *dst, pd_err *err);

/* Validates one manifest line's JSON and fields (everything except what needs
 * files: embeddings existence/shape, id uniqueness), without allocating
 * anything that survives the call. For tools and fuzzing. Messages read
 * "line: ..." / "line: page \"id\": ...". */
pd_status pages_line_check(const char *text, size_t len, uint32_t vocab_size, pd_err *err);

/* Aborts (CHECK) if an invariant of p is broken; tests call it after loads. */
void pages_check(const pages *p);

#endif
