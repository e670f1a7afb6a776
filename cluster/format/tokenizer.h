/* tokenizer: text -> token ids with the tokenizer a GGUF file carries
 * (tokenizer.ggml.*), producing the ids llama.cpp's llama_tokenize produces.
 *
 * Models (tokenizer.ggml.model):
 *   "gpt2"   byte-level BPE: tokens, merges ("a b", rank = index), token_type;
 *            the text is first split by the pre-tokenizer tokenizer.ggml.pre:
 *              deepseek-v3   digits in groups of 1..3; runs of CJK ideographs
 *                            U+4E00..U+9FA5 and kana U+3040..U+30FF; then
 *                            DeepSeek-V3's word / punctuation / whitespace rule
 *              deepseek-llm  CR/LF alone; letters; ASCII and full-width
 *                            punctuation; trailing whitespace; CJK; digit runs
 *              llama-bpe     Llama 3 (contractions, letters, digits 1..3, ...),
 *                            whole words found in the vocabulary kept as is
 *              qwen2         Llama 3's rule with digits one by one
 *              gpt-2         GPT-2's rule
 *              default       punctuation runs, GPT-2's rule, digit runs, ASCII
 *                            digit triples (also used when tokenizer.ggml.pre
 *                            is absent, as llama.cpp does)
 *            any other value is refused by name (PD_ERR_UNSUPPORTED).
 *            Each piece's bytes go through GPT-2's bytes_to_unicode and are
 *            merged by rank (lowest first, leftmost among equal ranks).
 *   "llama"  SentencePiece BPE: spaces become U+2581, a space is prefixed to
 *            each text fragment when add_space_prefix (default true), pieces
 *            are merged by score (highest first), and characters without a
 *            token fall back to their <0xNN> byte tokens.
 * The split rules follow llama.cpp's unicode.cpp, including its reading of
 * \p{..} classes through a one-byte-per-code-point "collapsed" text and C
 * locale \s (non-ASCII White_Space counts as \s; U+001C..U+001F do not).
 * Unicode classes come from ucd.h (version ucd_unicode_version).
 *
 * Special tokens: with parse_special, every CONTROL, USER_DEFINED and UNKNOWN
 * token's text is cut out of the input before pre-tokenization, longest text
 * first (equal lengths: lower id first), each leftmost-first over what the
 * longer ones left; without parse_special only USER_DEFINED ones are.
 * add_special adds BOS / EOS as tokenizer.ggml.add_bos_token /
 * add_eos_token say, else llama.cpp's defaults (gpt2: no BOS unless the pre
 * is llama-bpe; llama: BOS; neither adds EOS).
 *
 * Input text must be valid UTF-8 without NUL bytes: anything else is refused
 * naming the byte offset. */
#ifndef PD_TOKENIZER_H
#define PD_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cluster/format/gguf.h"

typedef enum tok_model { TOK_MODEL_LLAMA, TOK_MODEL_GPT2, TOK_MODEL_COUNT } tok_model;

typedef enum tok_pre {
    TOK_PRE_DEFAULT,
    TOK_PRE_DEEPSEEK_V3,
    TOK_PRE_DEEPSEEK_LLM,
    TOK_PRE_LLAMA3,
    TOK_PRE_QWEN2,
    TOK_PRE_GPT2,
    TOK_PRE_COUNT
} tok_pre;

/* Everything tok_new reads; arrays are borrowed for the call only. Token
 * types are GGUF's (vocab.h vocab_ttype: 1 normal, 2 unknown, 3 control,
 * 4 user-defined, 5 unused, 6 byte). */
typedef struct tok_desc {
    const char *model;          /* "gpt2" or "llama" */
    const char *pre;            /* gpt2: tokenizer.ggml.pre; NULL = "default" */
    uint32_t n_tokens;          /* 1..INT32_MAX */
    const char *const *tokens;  /* [n_tokens] */
    const uint32_t *token_lens; /* [n_tokens] byte lengths, or NULL: NUL-terminated */
    const int32_t *types;       /* [n_tokens] or NULL: all normal */
    const float *scores;        /* llama: [n_tokens] or NULL: all 0 */
    uint64_t n_merges;          /* gpt2 */
    const char *const *merges;  /* [n_merges] "left right" */
    const uint32_t *merge_lens; /* [n_merges] or NULL: NUL-terminated */
    int32_t bos, eos, unk;      /* -1 = none */
    int add_bos, add_eos;       /* -1 = absent (model default), 0, 1 */
    int add_space_prefix;       /* llama: -1 = absent (true), 0, 1 */
} tok_desc;

typedef struct tok tok;

/* Builds a tokenizer. On PD_OK *out is owned by the caller (tok_free); on
 * failure *out is untouched. Refuses unknown models and pre-tokenizers by
 * name, token types outside 0..6, bos/eos/unk outside [-1, n_tokens),
 * llama byte-typed tokens not of the form <0xNN>. */
pd_status tok_new(const tok_desc *d, tok **out, pd_err *err);

/* Reads the tokenizer.ggml.* keys of f (only metadata: no tensor bytes are
 * touched) and builds the tokenizer. Errors name the key. */
pd_status tok_new_gguf(const gguf_file *f, tok **out, pd_err *err);

/* tok_free(NULL) is a no-op. */
void tok_free(tok *t);

tok_model tok_model_of(const tok *t);
tok_pre tok_pre_of(const tok *t);
uint32_t tok_n_tokens(const tok *t);
int32_t tok_bos(const tok *t);
int32_t tok_eos(const tok *t);
bool tok_adds_bos(const tok *t);
bool tok_adds_eos(const tok *t);
/* The token's text as stored in the vocabulary (borrowed); NULL out of range. */
const char *tok_text(const tok *t, int32_t id, size_t *len);
/* GGUF token type of id (1 normal, 3 control, ...); id must be in range. */
int32_t tok_token_type(const tok *t, int32_t id);

typedef struct tok_opts {
    bool add_special;   /* BOS/EOS as the model says */
    bool parse_special; /* special token texts become their ids */
} tok_opts;

/* Tokenizes text[0..len). On PD_OK *ids is owned by the caller (free()),
 * *n_ids ids (*ids may be NULL when *n_ids == 0). On failure (invalid UTF-8
 * or NUL: PD_ERR_FORMAT naming the byte offset; no memory) nothing is
 * returned. */
pd_status tok_encode(const tok *t, const char *text, size_t len, tok_opts o, int32_t **ids,
                     size_t *n_ids, pd_err *err);

/* The pieces tok_encode would merge, as byte lengths in text order: special
 * tokens (parse_special on) one piece each; gpt2: the pre-tokenizer's pieces;
 * llama: each text fragment whole. *lens owned by the caller (free()). For
 * tests and debugging. Refuses what tok_encode refuses. */
pd_status tok_split(const tok *t, const char *text, size_t len, size_t **lens, size_t *n,
                    pd_err *err);

/* A detokenizing vocabulary (vocab.h) over t's own token texts, types, BOS
 * and EOS (no space prefix removed; control tokens as their text when
 * `special`). On PD_OK *out is owned by the caller (vocab_free). */
struct vocab;
pd_status tok_vocab_new(const tok *t, bool special, struct vocab **out, pd_err *err);

/* Aborts (CHECK) if an invariant of t is broken. */
void tok_check(const tok *t);

/* A page manifest's "text" segments as every run prefills them
 * (pages_opts.tokenize, cluster/format/pages.h): the model's own tokenizer,
 * no BOS, special tokens parsed. The tokenizer is built on the first text
 * segment, so a manifest of ids never builds it (models whose tokenizer this
 * build cannot run still decode id manifests). The head's load and the
 * work-mix count before it (rank_agree_work) both use it, so the rows agreed
 * on are the rows prefilled. Fill .gguf or .path, zero the rest; free with
 * tok_pages_free once the manifest is loaded. */
typedef struct tok_pages {
    const gguf_file *gguf; /* the model's file (borrowed), or NULL: */
    const char *path;      /* the model's path, opened on the first text segment */
    tok *t;                /* built on the first text segment */
} tok_pages;

/* pages_opts.tokenize with ctx a tok_pages. Errors say "the model's tokenizer". */
pd_status tok_pages_encode(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n,
                           pd_err *err);

/* Frees what tok_pages_encode built (tp stays reusable); NULL is a no-op. */
void tok_pages_free(tok_pages *tp);

#endif
