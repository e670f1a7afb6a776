/* sample: picks the next token of a page-stream from the final logits.
 *
 * Every choice is a pure function of (logits, the stream's generated tokens,
 * the settings, global seed, page id, token index): the random number of a
 * step is a hash of (seed, page id, index) — never a shared RNG — so a token
 * does not depend on which other pages share a batch, the rank count, or a
 * restart (ARCHITECTURE.md §1).
 *
 * Order of operations for one step:
 *   1. no-repeat n-gram ban (when on): with L = tokens generated so far and
 *      the last n-1 of them as the prefix, every token t such that
 *      prefix ++ [t] already occurs as an n-gram lying entirely within the
 *      last WINDOW generated tokens is banned (logit -inf). This is
 *      DeepSeek-OCR's windowed NoRepeatNGramLogitsProcessor (HF's
 *      no_repeat_ngram_size restricted to a window); n = 1 bans every token
 *      of the window. The OCR setting is 35:128.
 *   2. greedy: the highest logit, lowest index on ties.
 *   3. temperature: candidates = tokens whose logit is not -inf (nor banned),
 *      sorted by (logit desc, index asc); z = logit / T; kept = the first
 *      top_k (0 = all); e_j = pd_expf(z_j - z_0) (attn.h: the project's one
 *      exponential), summed in sorted order into cum_j; top_p keeps the
 *      shortest prefix whose cum reaches top_p * cum(kept) (at least one);
 *      u = sample_uniform(seed, id, index) in [0, 1); the token is the first
 *      j with cum_{j+1} > u * cum(prefix).
 *    Only the candidates that can change a sum or be drawn are sorted (a
 *    threshold pass, and a radix selection for top_k; sample.c says why the
 *    draw is the same bits as sorting them all).
 * Logits must be finite or -inf (NaN and +inf are refused); a step where no
 * token is allowed is refused. All scratch is allocated by sampler_new:
 * sampler_next never allocates. */
#ifndef PD_SAMPLE_H
#define PD_SAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define SAMPLE_MAX_TEMP 100.0f
#define SAMPLE_MAX_NGRAM_WINDOW (1u << 20)

typedef enum sample_mode { SAMPLE_GREEDY, SAMPLE_TEMP, SAMPLE_MODE_COUNT } sample_mode;

typedef struct sample_params {
    sample_mode mode;
    float temperature; /* SAMPLE_TEMP: in (0, SAMPLE_MAX_TEMP] */
    float top_p;       /* SAMPLE_TEMP: in (0, 1]; 1 = off */
    uint32_t top_k;    /* SAMPLE_TEMP: 0 = off */
} sample_params;

typedef struct sample_ngram {
    uint32_t n;      /* 0 = off */
    uint32_t window; /* n <= window <= SAMPLE_MAX_NGRAM_WINDOW when on */
} sample_ngram;

/* Parses the CLI sampling string: "greedy", or "temp:T" optionally followed
 * by ",top_p:P" and/or ",top_k:K" (any order, each once). */
pd_status sample_parse(const char *s, sample_params *out, pd_err *err);

/* Parses the CLI no-repeat n-gram string: "N:WINDOW" (e.g. "35:128") or "off". */
pd_status sample_parse_ngram(const char *s, sample_ngram *out, pd_err *err);

/* The uniform number of step `index` of page `page_id`: a splitmix64-style
 * hash of (seed, FNV-1a of the id bytes, index), top 24 bits scaled into
 * [0, 1) — exactly representable, same on every machine. */
float sample_uniform(uint64_t seed, const char *page_id, uint64_t index);

/* The page key sample_uniform hashes an id into (FNV-1a 64 of its bytes), and
 * sample_uniform of an already hashed id: stages that only carry the key (the
 * tail rank) sample exactly as if they had the id. */
uint64_t sample_page_key(const char *page_id);
float sample_uniform_key(uint64_t seed, uint64_t page_key, uint64_t index);

/* Writes to out[0..cap) the tokens the n-gram rule bans after hist[0..n_hist)
 * and returns how many (a token may repeat; at most window - n + 1, so
 * cap >= window always suffices; more are dropped, never overrun). */
size_t sample_ngram_ban(const sample_ngram *ng, const int32_t *hist, size_t n_hist, int32_t *out,
                        size_t cap);

typedef struct sampler sampler;

/* A sampler for vocab_size logits with its scratch preallocated. ng may be
 * NULL (no ban). On PD_OK *out is owned by the caller (sampler_free). */
pd_status sampler_new(uint32_t vocab_size, const sample_params *p, const sample_ngram *ng,
                      uint64_t seed, sampler **out, pd_err *err);

/* sampler_free(NULL) is a no-op. */
void sampler_free(sampler *s);

/* Picks the token at step `index` of page `page_id` (normally index == n_hist)
 * from logits [vocab_size] (read only). hist: the page's generated tokens so
 * far (the n-gram ban looks at them). Not thread-safe per sampler (scratch);
 * use one sampler per thread. */
pd_status sampler_next(sampler *s, const float *logits, const int32_t *hist, size_t n_hist,
                       const char *page_id, uint64_t index, int32_t *token, pd_err *err);

/* sampler_next for a page known by its key (sample_page_key of its id). */
pd_status sampler_next_key(sampler *s, const float *logits, const int32_t *hist, size_t n_hist,
                           uint64_t page_key, uint64_t index, int32_t *token, pd_err *err);

/* Aborts (CHECK) if an invariant of s is broken (scratch mask not clean, ...). */
void sampler_check(const sampler *s);

#endif
