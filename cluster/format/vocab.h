/* vocab: turns generated token ids back into text (detokenization).
 *
 * Built from what the caller read from GGUF (tokenizer.ggml.tokens, optional
 * tokenizer.ggml.token_type, tokenizer.ggml.model, bos/eos ids); knows nothing
 * of GGUF itself. Each token's bytes are decoded once at vocab_new:
 *
 * "llama" (SentencePiece):
 *   normal / undefined   text with every U+2581 '▁' replaced by ' '
 *   byte (<0xNN>)        the single raw byte 0xNN (a multi-byte UTF-8
 *                        character split over byte tokens reassembles because
 *                        bytes are concatenated before UTF-8 is checked)
 *   user-defined         the text as is
 *   unknown              U+2585 '▅' (what llama.cpp prints for <unk>)
 *   control, unused      nothing (BOS, EOS, pad, ...)
 * "gpt2" (byte-level BPE):
 *   normal / undefined   each character mapped back to its byte through the
 *                        inverse of GPT-2's bytes_to_unicode table; a
 *                        character outside the table is kept as its UTF-8
 *   byte (<0xNN>)        the raw byte; any other byte-typed text as normal
 *   user-defined, unknown the text as is
 *   control, unused      nothing
 * Without token types, "<0xNN>" texts are byte tokens in llama vocabularies
 * and everything else is normal. BOS and EOS always emit nothing.
 *
 * Leading space (llama only): like llama.cpp's detokenize with
 * add_space_prefix (the SentencePiece default), one leading ' ' is removed
 * from the piece of the FIRST token of a text (token index 0 only, even when
 * that token emits nothing), so generated "▁Hello▁world" reads "Hello world".
 * vocab_desc.no_space_prefix (GGUF tokenizer.ggml.add_space_prefix = false)
 * keeps it. No other clean-up of spaces is done.
 *
 * Output text is valid UTF-8: each maximal ill-formed subsequence (a stray
 * continuation byte, a truncated sequence, an overlong form, a surrogate, a
 * code point above U+10FFFF) becomes one U+FFFD, following the Unicode
 * "maximal subpart" practice. NUL bytes (token <0x00>) are kept: texts carry
 * an explicit length (and are NUL-terminated too for convenience). */
#ifndef PD_VOCAB_H
#define PD_VOCAB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef enum vocab_kind { VOCAB_LLAMA, VOCAB_GPT2, VOCAB_KIND_COUNT } vocab_kind;

/* GGUF token types (tokenizer.ggml.token_type). */
typedef enum vocab_ttype {
    VOCAB_TT_UNDEFINED = 0,
    VOCAB_TT_NORMAL = 1,
    VOCAB_TT_UNKNOWN = 2,
    VOCAB_TT_CONTROL = 3,
    VOCAB_TT_USER_DEFINED = 4,
    VOCAB_TT_UNUSED = 5,
    VOCAB_TT_BYTE = 6,
    VOCAB_TT_COUNT
} vocab_ttype;

/* Everything vocab_new reads; all arrays are borrowed for the call only. */
typedef struct vocab_desc {
    const char *model;             /* "llama" or "gpt2" */
    uint32_t n_tokens;             /* >= 1, <= INT32_MAX */
    const char *const *tokens;     /* [n_tokens] token texts */
    const uint32_t *token_lens;    /* [n_tokens] byte lengths, or NULL: NUL-terminated */
    const int32_t *types;          /* [n_tokens] vocab_ttype values, or NULL: inferred */
    int32_t bos;                   /* -1 = none */
    int32_t eos;                   /* -1 = none */
    bool no_space_prefix;          /* llama: keep the first piece's leading space */
    bool special;                  /* control tokens decode to their own text (llama.cpp's
                                      token_to_piece with special = true; run --special);
                                      false: to nothing */
} vocab_desc;

typedef struct vocab vocab;

/* Builds a vocabulary. On PD_OK *out is owned by the caller (vocab_free);
 * on failure *out is untouched. Refuses unknown models by name, type codes
 * outside vocab_ttype, byte-typed llama tokens whose text is not <0xNN>,
 * bos/eos outside [-1, n_tokens). */
pd_status vocab_new(const vocab_desc *d, vocab **out, pd_err *err);

/* The byte a SentencePiece byte token's text "<0xNN>" (hex, either case)
 * names, or -1 for any other text (also the tokenizer's byte fallback). */
int vocab_byte_token(const char *t, size_t n);

/* vocab_free(NULL) is a no-op. */
void vocab_free(vocab *v);

uint32_t vocab_size(const vocab *v);
vocab_ttype vocab_token_type(const vocab *v, int32_t token); /* token must be in range */

/* The raw bytes token emits (before the leading-space rule and UTF-8 repair),
 * *len set; borrowed until vocab_free. NULL when token is out of range. */
const char *vocab_piece(const vocab *v, int32_t token, size_t *len);

/* Longest piece in bytes (for sizing buffers). */
size_t vocab_max_piece(const vocab *v);

/* A text being built token by token (streaming). Caller-owned; zero-initialize
 * ({0}), release with vocab_text_free. Holds raw bytes: a character split over
 * byte tokens may be incomplete until its last byte arrives.
 * INV: len <= cap; n_tokens counts the tokens appended. */
typedef struct vocab_text {
    char *buf;
    size_t len, cap;
    uint64_t n_tokens;
} vocab_text;

/* Makes room for `bytes` more bytes, so appends that fit never allocate
 * (e.g. max_new_tokens * vocab_max_piece(v) before a page's decode loop). */
pd_status vocab_text_reserve(vocab_text *t, size_t bytes, pd_err *err);

/* Appends token's piece to t (allocating only when t must grow). A token out
 * of range returns PD_ERR_RANGE and leaves t unchanged. */
pd_status vocab_detok_append(const vocab *v, vocab_text *t, int32_t token, pd_err *err);

/* The text so far as valid UTF-8 (see above): *out owned by the caller, free
 * with free(), NUL-terminated, *out_len bytes (optional). */
pd_status vocab_text_finish(const vocab_text *t, char **out, size_t *out_len, pd_err *err);

void vocab_text_free(vocab_text *t);

/* Detokenizes tokens[0..n) as one text: the same bytes as appending each token
 * to an empty vocab_text and finishing it. *out owned by the caller (free()),
 * NUL-terminated; *out_len optional. On failure *out is untouched. */
pd_status vocab_detok(const vocab *v, const int32_t *tokens, size_t n, char **out,
                      size_t *out_len, pd_err *err);

/* Writes in[0..n) to out as valid UTF-8 (ill-formed subsequences -> U+FFFD);
 * out must hold 3 * n bytes. Returns the bytes written. */
size_t vocab_utf8_repair(const char *in, size_t n, char *out);

/* Aborts (CHECK) if an invariant of v is broken. */
void vocab_check(const vocab *v);

#endif
