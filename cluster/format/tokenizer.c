/* tokenizer: the GGUF's tokenizer (see tokenizer.h). Owns a copy of the token
 * texts, a string table (token texts, merge parts and merge results, each a
 * "string id"), the merge map (left sid, right sid) -> (rank, result sid),
 * the special-token list and the per-code-point Unicode classes. Encoding
 * allocates its scratch per call; nothing is shared between calls. */
#include "cluster/format/tokenizer.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/fnv.h"
#include "base/utf8.h"
#include "cluster/format/ucd.h"
#include "cluster/format/vocab.h"

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };

/* --- string table: interned byte strings, sid = insertion order */

typedef struct tok_strtab {
    char *pool;
    size_t pool_len, pool_cap;
    size_t *off;      /* [n + 1] */
    uint32_t n, cap;  /* entries, capacity of off */
    uint32_t *slots;  /* open addressing: sid + 1, 0 = empty */
    uint32_t n_slots; /* power of two, >= 2 * cap */
} tok_strtab;

static uint64_t tok_hash(const char *s, size_t n) { return pd_fnv_bytes(PD_FNV_OFFSET, s, n); }

static bool strtab_init(tok_strtab *st, uint32_t cap, size_t pool_cap)
{
    memset(st, 0, sizeof *st);
    uint32_t ns = 16;
    while (ns < 2u * cap)
        ns *= 2;
    st->cap = cap;
    st->n_slots = ns;
    st->pool_cap = pool_cap ? pool_cap : 1;
    st->pool = malloc(st->pool_cap);
    st->off = malloc(((size_t)cap + 1) * sizeof *st->off);
    st->slots = calloc(ns, sizeof *st->slots);
    if (!st->pool || !st->off || !st->slots)
        return false;
    st->off[0] = 0;
    return true;
}

static void strtab_free(tok_strtab *st)
{
    free(st->pool);
    free(st->off);
    free(st->slots);
}

static int64_t strtab_find(const tok_strtab *st, const char *s, size_t n)
{
    uint32_t mask = st->n_slots - 1;
    for (uint32_t h = (uint32_t)tok_hash(s, n) & mask;; h = (h + 1) & mask) {
        uint32_t v = st->slots[h];
        if (!v)
            return -1;
        uint32_t sid = v - 1;
        size_t len = st->off[sid + 1] - st->off[sid];
        if (len == n && !memcmp(st->pool + st->off[sid], s, n))
            return sid;
    }
}

/* Returns the sid of s (interning it when new), -1 when out of room. */
static int64_t strtab_intern(tok_strtab *st, const char *s, size_t n)
{
    uint32_t mask = st->n_slots - 1;
    uint32_t h = (uint32_t)tok_hash(s, n) & mask;
    for (;; h = (h + 1) & mask) {
        uint32_t v = st->slots[h];
        if (!v)
            break;
        uint32_t sid = v - 1;
        size_t len = st->off[sid + 1] - st->off[sid];
        if (len == n && !memcmp(st->pool + st->off[sid], s, n))
            return sid;
    }
    if (st->n >= st->cap)
        return -1;
    if (n > st->pool_cap - st->pool_len) {
        size_t cap = st->pool_cap;
        while (n > cap - st->pool_len)
            cap *= 2;
        char *p = realloc(st->pool, cap);
        if (!p)
            return -1;
        st->pool = p;
        st->pool_cap = cap;
    }
    memcpy(st->pool + st->pool_len, s, n);
    st->pool_len += n;
    st->off[st->n + 1] = st->pool_len;
    st->slots[h] = st->n + 1;
    return st->n++;
}

/* --- merge map: (left sid, right sid) -> rank, result sid */

typedef struct tok_merge_slot {
    uint64_t key; /* left << 32 | right; UINT64_MAX = empty */
    int32_t rank;
    int32_t result;
} tok_merge_slot;

static uint64_t tok_mix(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

/* --- the tokenizer */

/* INV: strs.n >= n_tokens and sid i < n_tokens is token i's text when that
 *      text is unique (duplicates: the sid maps to the last id, as llama.cpp's
 *      token_to_id does); sid_tok[sid] is that id or -1;
 *      specials[] sorted by text length descending, then id ascending;
 *      cls[cp] = ucd class | whitespace bit for every code point. */
struct tok {
    tok_model model;
    tok_pre pre;
    uint32_t n;
    int32_t bos, eos, unk;
    bool add_bos, add_eos, add_space_prefix;
    char *texts;           /* token texts, concatenated */
    size_t *text_off;      /* [n + 1] */
    uint8_t *types;        /* [n] */
    float *scores;         /* [n] llama */
    tok_strtab strs;
    int32_t *sid_tok;      /* [strs.cap] token id of a string, or -1 */
    tok_merge_slot *merges;
    uint64_t n_merge_slots; /* power of two, 0 when no merges */
    int32_t byte_sid[256]; /* gpt2: sid of bytes_to_unicode(b), or -1 */
    int32_t byte_tok[256]; /* llama: id of <0xNN>, or -1 */
    int32_t *specials;     /* token ids */
    uint32_t n_specials;
    int32_t *spec_head;    /* [65536] first special with those two leading bytes, -1 */
    int32_t *spec_next;    /* [n_specials] chain */
    int32_t spec_head1[256]; /* one-byte specials */
    uint8_t *cls;          /* [UCD_CODEPOINTS] */
};

static bool tok_pre_parse(const char *s, tok_pre *out)
{
    static const struct { const char *name; tok_pre pre; } alias[] = {
        {"default", TOK_PRE_DEFAULT},       {"deepseek-v3", TOK_PRE_DEEPSEEK_V3},
        {"deepseek-llm", TOK_PRE_DEEPSEEK_LLM}, {"llama-bpe", TOK_PRE_LLAMA3},
        {"llama3", TOK_PRE_LLAMA3},         {"llama-v3", TOK_PRE_LLAMA3},
        {"qwen2", TOK_PRE_QWEN2},           {"deepseek-r1-qwen", TOK_PRE_QWEN2},
        {"gpt-2", TOK_PRE_GPT2},
    };
    for (size_t i = 0; i < sizeof alias / sizeof alias[0]; i++)
        if (!strcmp(s, alias[i].name)) {
            *out = alias[i].pre;
            return true;
        }
    return false;
}

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the other 68
 * to U+0100.. in byte order. Writes the UTF-8 (1 or 2 bytes), returns length. */
static size_t tok_gpt2_char(int b, char out[2])
{
    bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    uint32_t cp;
    if (printable) {
        cp = (uint32_t)b;
    } else {
        uint32_t k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174))
                k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}


void tok_free(tok *t)
{
    if (!t)
        return;
    free(t->texts);
    free(t->text_off);
    free(t->types);
    free(t->scores);
    strtab_free(&t->strs);
    free(t->sid_tok);
    free(t->merges);
    free(t->specials);
    free(t->spec_head);
    free(t->spec_next);
    free(t->cls);
    free(t);
}

static size_t tok_len_of(const char *const *s, const uint32_t *lens, uint64_t i)
{
    return lens ? lens[i] : strlen(s[i]);
}

static int tok_special_cmp_ctx_len(const tok *t, int32_t a, int32_t b)
{
    size_t la = t->text_off[a + 1] - t->text_off[a], lb = t->text_off[b + 1] - t->text_off[b];
    if (la != lb)
        return la > lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* insertion-free merge sort of the special ids (n is small: hundreds) */
static void tok_sort_specials(const tok *t, int32_t *v, int32_t *tmp, uint32_t n)
{
    if (n < 2)
        return;
    uint32_t h = n / 2;
    tok_sort_specials(t, v, tmp, h);
    tok_sort_specials(t, v + h, tmp, n - h);
    uint32_t i = 0, j = h, k = 0;
    while (i < h && j < n)
        tmp[k++] = tok_special_cmp_ctx_len(t, v[i], v[j]) <= 0 ? v[i++] : v[j++];
    while (i < h)
        tmp[k++] = v[i++];
    while (j < n)
        tmp[k++] = v[j++];
    memcpy(v, tmp, n * sizeof *v);
}

/* The description's checks, before anything is allocated: model and
 * pre-tokenizer known, counts in range, every text present, types known,
 * special ids in range. Fills *model, *pre, the token text bytes and the
 * string table's capacity. */
static pd_status tok_desc_check(const tok_desc *d, tok_model *model, tok_pre *pre, size_t *text_bytes,
                                uint32_t *str_cap, pd_err *err)
{
    if (d->model && !strcmp(d->model, "gpt2"))
        *model = TOK_MODEL_GPT2;
    else if (d->model && !strcmp(d->model, "llama"))
        *model = TOK_MODEL_LLAMA;
    else
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "tokenizer: tokenizer.ggml.model \"%s\" is not supported (gpt2, llama)",
                          d->model ? d->model : "(none)");
    *pre = TOK_PRE_DEFAULT;
    if (*model == TOK_MODEL_GPT2 && d->pre && !tok_pre_parse(d->pre, pre))
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "tokenizer: pre-tokenizer tokenizer.ggml.pre \"%s\" is not supported "
                          "(deepseek-v3, deepseek-llm, llama-bpe, qwen2, gpt-2, default)",
                          d->pre);
    if (d->n_tokens == 0 || d->n_tokens > (uint32_t)INT32_MAX || !d->tokens)
        return pd_err_set(err, PD_ERR_ARG, "tokenizer: %u tokens (need 1..INT32_MAX)", d->n_tokens);
    if (d->n_merges && !d->merges)
        return pd_err_set(err, PD_ERR_ARG, "tokenizer: %llu merges without an array",
                          (unsigned long long)d->n_merges);
    if (d->n_merges > (uint64_t)INT32_MAX)
        return pd_err_set(err, PD_ERR_RANGE, "tokenizer: %llu merges (at most INT32_MAX)",
                          (unsigned long long)d->n_merges);
    int32_t n = (int32_t)d->n_tokens;
    if (d->bos < -1 || d->bos >= n || d->eos < -1 || d->eos >= n || d->unk < -1 || d->unk >= n)
        return pd_err_set(err, PD_ERR_RANGE, "tokenizer: bos %d / eos %d / unk %d outside [-1, %d)",
                          d->bos, d->eos, d->unk, n);
    *text_bytes = 0;
    for (int32_t i = 0; i < n; i++) {
        if (!d->tokens[i])
            return pd_err_set(err, PD_ERR_ARG, "tokenizer: token %d: NULL text", i);
        size_t len = tok_len_of(d->tokens, d->token_lens, (uint64_t)i);
        if (d->types && (d->types[i] < 0 || d->types[i] > TT_BYTE))
            return pd_err_set(err, PD_ERR_FORMAT, "tokenizer: token %d: unknown token type %d", i,
                              d->types[i]);
        if (*model == TOK_MODEL_LLAMA && d->types && d->types[i] == TT_BYTE &&
            vocab_byte_token(d->tokens[i], len) < 0)
            return pd_err_set(err, PD_ERR_FORMAT,
                              "tokenizer: token %d: byte token text is not of the form <0xNN>", i);
        if (*text_bytes > SIZE_MAX / 4 - len)
            return pd_err_set(err, PD_ERR_NOMEM, "tokenizer: token texts overflow");
        *text_bytes += len;
    }
    for (uint64_t i = 0; i < d->n_merges; i++)
        if (!d->merges[i])
            return pd_err_set(err, PD_ERR_ARG, "tokenizer: merge %llu: NULL text",
                              (unsigned long long)i);
    if ((uint64_t)n + 3 * d->n_merges + 256 > UINT32_MAX / 4)
        return pd_err_set(err, PD_ERR_RANGE, "tokenizer: %d tokens and %llu merges are too many",
                          n, (unsigned long long)d->n_merges);
    *str_cap = (uint32_t)((uint64_t)n + 3 * d->n_merges + 256);
    return PD_OK;
}

/* The token texts, types and scores copied in, each text interned (the last
 * id of a text wins, as in llama.cpp). */
static pd_status tok_fill_tokens(tok *t, const tok_desc *d, uint32_t str_cap, pd_err *err)
{
    int32_t n = (int32_t)t->n;
    size_t o = 0;
    for (int32_t i = 0; i < n; i++) {
        size_t len = tok_len_of(d->tokens, d->token_lens, (uint64_t)i);
        t->text_off[i] = o;
        memcpy(t->texts + o, d->tokens[i], len);
        o += len;
        t->types[i] = (uint8_t)(d->types ? d->types[i] : TT_NORMAL);
        if (t->scores && d->scores)
            t->scores[i] = d->scores[i];
    }
    t->text_off[n] = o;
    for (uint32_t i = 0; i < str_cap; i++)
        t->sid_tok[i] = -1;
    for (int32_t i = 0; i < n; i++) {
        int64_t sid = strtab_intern(&t->strs, t->texts + t->text_off[i],
                                    t->text_off[i + 1] - t->text_off[i]);
        if (sid < 0)
            return pd_err_set(err, PD_ERR_NOMEM, "tokenizer: no memory for the string table");
        t->sid_tok[sid] = i; /* the last id of a text wins, as in llama.cpp */
    }
    return PD_OK;
}

/* Each byte's GPT-2 character string, and (llama) its token. */
static void tok_fill_bytes(tok *t)
{
    for (int b = 0; b < 256; b++) {
        char c[2];
        size_t k = tok_gpt2_char(b, c);
        int64_t sid = strtab_find(&t->strs, c, k);
        t->byte_sid[b] = (int32_t)sid;
        t->byte_tok[b] = -1;
    }
    if (t->model == TOK_MODEL_LLAMA) /* llama.cpp's byte_to_token: "<0xXX>", else the byte itself */
        for (int c = 0; c < 256; c++) {
            static const char hex[] = "0123456789ABCDEF";
            char name[6] = {'<', '0', 'x', hex[c >> 4], hex[c & 15], '>'}, one = (char)c;
            int64_t sid = strtab_find(&t->strs, name, 6);
            if (sid < 0 || t->sid_tok[sid] < 0)
                sid = strtab_find(&t->strs, &one, 1);
            t->byte_tok[c] = sid >= 0 ? t->sid_tok[sid] : -1;
        }
}

/* GPT-2 merges: "left right" split at the first space after the first byte,
 * into an open-addressing table of (left, right) -> (rank, result). */
static pd_status tok_fill_merges(tok *t, const tok_desc *d, pd_err *err)
{
    uint64_t ns = 16;
    while (ns < 2 * d->n_merges)
        ns *= 2;
    t->merges = malloc(ns * sizeof *t->merges);
    if (!t->merges)
        return pd_err_set(err, PD_ERR_NOMEM, "tokenizer: no memory for %llu merges",
                          (unsigned long long)d->n_merges);
    t->n_merge_slots = ns;
    for (uint64_t i = 0; i < ns; i++)
        t->merges[i].key = UINT64_MAX;
    char *cat = NULL;
    size_t cat_cap = 0;
    pd_status st = PD_OK;
    for (uint64_t i = 0; st == PD_OK && i < d->n_merges; i++) {
        const char *m = d->merges[i];
        size_t len = tok_len_of(d->merges, d->merge_lens, i);
        const char *sp = len > 1 ? memchr(m + 1, ' ', len - 1) : NULL;
        if (!sp)
            continue; /* llama.cpp pairs ("", ""): never matches a symbol */
        size_t la = (size_t)(sp - m), lb = len - la - 1;
        if (lb == 0)
            continue;
        if (len > cat_cap) {
            char *c2 = realloc(cat, len * 2);
            if (!c2) {
                st = pd_err_set(err, PD_ERR_NOMEM, "tokenizer: no memory");
                break;
            }
            cat = c2;
            cat_cap = len * 2;
        }
        memcpy(cat, m, la);
        memcpy(cat + la, sp + 1, lb);
        int64_t a = strtab_intern(&t->strs, m, la);
        int64_t b = strtab_intern(&t->strs, sp + 1, lb);
        int64_t r = strtab_intern(&t->strs, cat, la + lb);
        if (a < 0 || b < 0 || r < 0) {
            st = pd_err_set(err, PD_ERR_NOMEM, "tokenizer: no memory for the merges");
            break;
        }
        uint64_t key = (uint64_t)a << 32 | (uint64_t)b;
        uint64_t mask = ns - 1;
        for (uint64_t h = tok_mix(key) & mask;; h = (h + 1) & mask) {
            if (t->merges[h].key == key)
                break; /* the first rank of a pair wins */
            if (t->merges[h].key == UINT64_MAX) {
                t->merges[h] = (tok_merge_slot){.key = key, .rank = (int32_t)i, .result = (int32_t)r};
                break;
            }
        }
    }
    free(cat);
    return st;
}

/* Special tokens (control, user-defined, unknown; not empty), longest
 * first, chained by their first one or two bytes. */
static void tok_fill_specials(tok *t)
{
    uint32_t ns = 0;
    for (int32_t i = 0; i < (int32_t)t->n; i++) {
        uint8_t ty = t->types[i];
        if ((ty == TT_CONTROL || ty == TT_USER || ty == TT_UNKNOWN) &&
            t->text_off[i + 1] > t->text_off[i])
            t->specials[ns++] = i;
    }
    t->n_specials = ns;
    tok_sort_specials(t, t->specials, t->spec_next, ns);
    for (int i = 0; i < 65536; i++)
        t->spec_head[i] = -1;
    for (int i = 0; i < 256; i++)
        t->spec_head1[i] = -1;
    for (int32_t k = (int32_t)ns - 1; k >= 0; k--) {
        int32_t id = t->specials[k];
        const unsigned char *s = (const unsigned char *)t->texts + t->text_off[id];
        size_t len = t->text_off[id + 1] - t->text_off[id];
        if (len == 1) {
            t->spec_next[k] = t->spec_head1[s[0]];
            t->spec_head1[s[0]] = k;
        } else {
            t->spec_next[k] = t->spec_head[s[0] << 8 | s[1]];
            t->spec_head[s[0] << 8 | s[1]] = k;
        }
    }
}

pd_status tok_new(const tok_desc *d, tok **out, pd_err *err)
{
    if (!d || !out)
        return pd_err_set(err, PD_ERR_ARG, "tokenizer: NULL description or output");
    tok_model model = TOK_MODEL_GPT2;
    tok_pre pre = TOK_PRE_DEFAULT;
    size_t text_bytes = 0;
    uint32_t str_cap = 0;
    pd_status st = tok_desc_check(d, &model, &pre, &text_bytes, &str_cap, err);
    if (st)
        return st;
    int32_t n = (int32_t)d->n_tokens;
    tok *t = calloc(1, sizeof *t);
    if (!t)
        return pd_err_set(err, PD_ERR_NOMEM, "tokenizer: no memory");
    t->model = model;
    t->pre = pre;
    t->n = (uint32_t)n;
    t->bos = d->bos;
    t->eos = d->eos;
    t->unk = d->unk;
    bool def_bos = model == TOK_MODEL_LLAMA || pre == TOK_PRE_LLAMA3;
    t->add_bos = d->add_bos < 0 ? def_bos : d->add_bos != 0;
    t->add_eos = d->add_eos < 0 ? false : d->add_eos != 0;
    t->add_space_prefix = model == TOK_MODEL_LLAMA && (d->add_space_prefix < 0 || d->add_space_prefix);
    t->texts = malloc(text_bytes ? text_bytes : 1);
    t->text_off = malloc(((size_t)n + 1) * sizeof *t->text_off);
    t->types = malloc((size_t)n);
    t->scores = model == TOK_MODEL_LLAMA ? calloc((size_t)n, sizeof *t->scores) : NULL;
    t->sid_tok = malloc((size_t)str_cap * sizeof *t->sid_tok);
    t->cls = malloc(UCD_CODEPOINTS);
    t->specials = malloc(((size_t)n + 1) * sizeof *t->specials);
    t->spec_next = malloc(((size_t)n + 1) * sizeof *t->spec_next);
    t->spec_head = malloc(65536 * sizeof *t->spec_head);
    bool ok = t->texts && t->text_off && t->types && (model != TOK_MODEL_LLAMA || t->scores) &&
              t->sid_tok && t->cls && t->specials && t->spec_next && t->spec_head &&
              strtab_init(&t->strs, str_cap, text_bytes * 2 + 64);
    if (!ok)
        st = pd_err_set(err, PD_ERR_NOMEM, "tokenizer: no memory for %d tokens", n);
    if (st == PD_OK) {
        ucd_fill(t->cls);
        st = tok_fill_tokens(t, d, str_cap, err);
    }
    if (st == PD_OK) {
        tok_fill_bytes(t);
        if (model == TOK_MODEL_GPT2 && d->n_merges)
            st = tok_fill_merges(t, d, err);
    }
    if (st) {
        tok_free(t);
        return st;
    }
    tok_fill_specials(t);
    *out = t;
    return PD_OK;
}

tok_model tok_model_of(const tok *t) { return t->model; }
tok_pre tok_pre_of(const tok *t) { return t->pre; }
uint32_t tok_n_tokens(const tok *t) { return t->n; }
int32_t tok_bos(const tok *t) { return t->bos; }
int32_t tok_eos(const tok *t) { return t->eos; }
bool tok_adds_bos(const tok *t) { return t->add_bos; }
bool tok_adds_eos(const tok *t) { return t->add_eos; }

int32_t tok_token_type(const tok *t, int32_t id)
{
    CHECKF(id >= 0 && (uint32_t)id < t->n, "token %d of %u", id, t->n);
    return t->types[id];
}

const char *tok_text(const tok *t, int32_t id, size_t *len)
{
    if (!t || id < 0 || (uint32_t)id >= t->n)
        return NULL;
    *len = t->text_off[id + 1] - t->text_off[id];
    return t->texts + t->text_off[id];
}

/* ===================================================================== encode */

typedef struct tok_ids {
    int32_t *v;
    size_t n, cap;
    bool oom;
} tok_ids;

static void ids_push(tok_ids *o, int32_t id)
{
    if (o->oom)
        return;
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 64;
        int32_t *v = realloc(o->v, cap * sizeof *v);
        if (!v) {
            o->oom = true;
            return;
        }
        o->v = v;
        o->cap = cap;
    }
    o->v[o->n++] = id;
}

/* One raw fragment being pre-tokenized: its code points, their byte offsets
 * and the collapsed byte llama.cpp's regexes see for each. Piece boundaries
 * are kept as piece end positions (code point indices). */
typedef struct tok_frag {
    const tok *t;
    const char *bytes; /* the fragment's bytes */
    size_t ncp;
    uint32_t *cp;      /* [ncp] */
    size_t *boff;      /* [ncp + 1] byte offset of each code point */
    uint8_t *cb;       /* [ncp] collapsed byte */
    size_t *ends, *ends2; /* [ncp] piece ends, two buffers */
    size_t n_ends;
} tok_frag;

static uint8_t tok_cls(const tok *t, uint32_t cp) { return cp < UCD_CODEPOINTS ? t->cls[cp] : 0; }

/* llama.cpp's collapsed representation: ASCII as is; other White_Space 0x0B;
 * N, L, P, M, S -> 0xD1..0xD5; anything else 0xD0. */
static uint8_t tok_collapse(const tok *t, uint32_t cp)
{
    if (cp < 128)
        return (uint8_t)cp;
    uint8_t c = tok_cls(t, cp);
    if (c & UCD_WHITESPACE)
        return 0x0B;
    switch (c & UCD_CLASS_MASK) {
    case UCD_NUMBER: return 0xD1;
    case UCD_LETTER: return 0xD2;
    case UCD_PUNCT: return 0xD3;
    case UCD_MARK: return 0xD4;
    case UCD_SYMBOL: return 0xD5;
    default: return 0xD0;
    }
}

/* Predicates on collapsed bytes, as std::regex evaluates the collapsed classes */
static bool cb_asc_alpha(uint8_t c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }
static bool cb_asc_digit(uint8_t c) { return c >= '0' && c <= '9'; }
static bool cb_asc_punsym(uint8_t c)
{
    return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
           (c >= 0x7B && c <= 0x7E);
}
static bool cb_asc_sym(uint8_t c)
{
    return c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' || c == '`' ||
           c == '|' || c == '~';
}
static bool cb_N(uint8_t c) { return cb_asc_digit(c) || c == 0xD1; }
static bool cb_L(uint8_t c) { return cb_asc_alpha(c) || c == 0xD2; }
static bool cb_P(uint8_t c) { return (cb_asc_punsym(c) && !cb_asc_sym(c)) || c == 0xD3; }
static bool cb_S(uint8_t c) { return cb_asc_sym(c) || c == 0xD5; }
static bool cb_M(uint8_t c) { return c == 0xD4; }
static bool cb_WS(uint8_t c) { return (c >= 0x09 && c <= 0x0D) || c == ' '; }
static bool cb_CRLF(uint8_t c) { return c == '\r' || c == '\n'; }

/* Per-code-point flags as llama.cpp's hand-written splitters read them. */
static bool f_letter(const tok_frag *f, size_t i, size_t e)
{
    return i < e && (tok_cls(f->t, f->cp[i]) & UCD_CLASS_MASK) == UCD_LETTER;
}
static bool f_number(const tok_frag *f, size_t i, size_t e)
{
    return i < e && (tok_cls(f->t, f->cp[i]) & UCD_CLASS_MASK) == UCD_NUMBER;
}
static bool f_ws(const tok_frag *f, size_t i, size_t e)
{
    return i < e && (tok_cls(f->t, f->cp[i]) & UCD_WHITESPACE);
}
/* in range and none of whitespace, letter, number (llama.cpp's flags are
 * never 0 in range) */
static bool f_other(const tok_frag *f, size_t i, size_t e)
{
    return i < e && !f_ws(f, i, e) && !f_letter(f, i, e) && !f_number(f, i, e);
}
static uint32_t f_cp(const tok_frag *f, size_t i, size_t e) { return i < e ? f->cp[i] : 0xFFFFFFFFu; }
static uint32_t ascii_lower(uint32_t c) { return c >= 'A' && c <= 'Z' ? c + 32 : c; }

typedef struct tok_cuts {
    size_t *v;
    size_t n;
} tok_cuts;

static void cut(tok_cuts *c, size_t end)
{
    if (c->n == 0 ? end > 0 : c->v[c->n - 1] < end) /* no empty pieces */
        c->v[c->n++] = end;
}

/* A regex pass: the match starting at p within [s, e) ends at the returned
 * position, or p when nothing matches there. */
typedef size_t (*tok_match_fn)(const tok_frag *f, size_t p, size_t e);

/* std::regex_iterator over [s, e): matches and the gaps between them. */
static void split_regex(const tok_frag *f, size_t s, size_t e, tok_match_fn m, tok_cuts *out)
{
    size_t p = s;
    while (p < e) {
        size_t q = m(f, p, e);
        if (q > p) {
            cut(out, p); /* a gap before it, if any (no-op when p is a cut) */
            cut(out, q);
            p = q;
        } else {
            p++;
        }
    }
    cut(out, e);
}

/* \p{N}{1,3} */
static size_t m_digits3(const tok_frag *f, size_t p, size_t e)
{
    size_t q = p;
    while (q < e && q - p < 3 && cb_N(f->cb[q]))
        q++;
    return q;
}

/* \p{N}+ */
static size_t m_digits(const tok_frag *f, size_t p, size_t e)
{
    size_t q = p;
    while (q < e && cb_N(f->cb[q]))
        q++;
    return q;
}

/* [0-9][0-9][0-9] on the code points */
static size_t m_ascii3(const tok_frag *f, size_t p, size_t e)
{
    if (p + 3 <= e && f->cp[p] - '0' < 10 && f->cp[p + 1] - '0' < 10 && f->cp[p + 2] - '0' < 10)
        return p + 3;
    return p;
}

/* [一-龥぀-ゟ゠-ヿ]+ */
static bool cjk_v3(uint32_t c) { return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x3040 && c <= 0x30FF); }
static size_t m_cjk_v3(const tok_frag *f, size_t p, size_t e)
{
    size_t q = p;
    while (q < e && cjk_v3(f->cp[q]))
        q++;
    return q;
}

/* DeepSeek-V3: [!-/:-@[-`{-~][A-Za-z]+ | [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ |
 * ?[\p{P}\p{S}]+[\r\n]* | \s*[\r\n]+ | \s+(?!\S) | \s+  (ordered alternatives) */
static bool cb_LM(uint8_t c) { return cb_L(c) || cb_M(c); }
static bool cb_PS(uint8_t c) { return cb_P(c) || cb_S(c); }
static size_t m_dsv3(const tok_frag *f, size_t p, size_t e)
{
    const uint8_t *cb = f->cb;
    uint8_t c = cb[p];
    size_t q;
    if (cb_asc_punsym(c) && p + 1 < e && cb_asc_alpha(cb[p + 1])) {
        for (q = p + 2; q < e && cb_asc_alpha(cb[q]); q++) {}
        return q;
    }
    bool x = !(cb_CRLF(c) || cb_L(c) || cb_P(c) || cb_S(c));
    if ((x && p + 1 < e && cb_LM(cb[p + 1])) || cb_LM(c)) {
        for (q = p + 1; q < e && cb_LM(cb[q]); q++) {}
        return q;
    }
    q = p;
    if (c == ' ' && p + 1 < e && cb_PS(cb[p + 1]))
        q = p + 1;
    if (cb_PS(cb[q])) {
        for (q++; q < e && cb_PS(cb[q]); q++) {}
        for (; q < e && cb_CRLF(cb[q]); q++) {}
        return q;
    }
    if (!cb_WS(c))
        return p;
    size_t w = p, last = 0;
    for (; w < e && cb_WS(cb[w]); w++)
        if (cb_CRLF(cb[w]))
            last = w + 1;
    if (last)
        return last;
    if (w == e)
        return w;
    return w - p >= 2 ? w - 1 : w;
}

/* default's first pass: [\p{P}\$\+<=>\^~\|]+ */
static bool cb_def_p(uint8_t c)
{
    return cb_P(c) || c == '$' || c == '+' || c == '<' || c == '=' || c == '>' || c == '^' ||
           c == '~' || c == '|';
}
static size_t m_def_p(const tok_frag *f, size_t p, size_t e)
{
    size_t q = p;
    while (q < e && cb_def_p(f->cb[q]))
        q++;
    return q;
}

/* deepseek-llm: [\r\n] on code points */
static size_t m_crlf(const tok_frag *f, size_t p, size_t e)
{
    (void)e;
    return f->cp[p] == '\r' || f->cp[p] == '\n' ? p + 1 : p;
}

/* std::wregex \s in the C locale over wtext (non-ASCII White_Space became 0x0B) */
static bool w_ws(const tok_frag *f, size_t i)
{
    uint32_t c = f->cp[i];
    if (c < 128)
        return (c >= 0x09 && c <= 0x0D) || c == ' ';
    return (tok_cls(f->t, c) & UCD_WHITESPACE) != 0;
}

/* deepseek-llm's letter class (from its tokenizer.json, as llama.cpp lists it) */
static const uint32_t dsllm_letters[][2] = {
    {0x41, 0x5A}, {0x61, 0x7A}, {0xB5, 0xB5}, {0xC0, 0xD6}, {0xD8, 0xF6}, {0xF8, 0x1BA},
    {0x1BC, 0x1BF}, {0x1C4, 0x293}, {0x295, 0x2AF}, {0x370, 0x373}, {0x376, 0x377},
    {0x37B, 0x37D}, {0x37F, 0x37F}, {0x386, 0x386}, {0x388, 0x38A}, {0x38C, 0x38C},
    {0x38E, 0x3A1}, {0x3A3, 0x3F5}, {0x3F7, 0x481}, {0x48A, 0x52F}, {0x531, 0x556},
    {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA}, {0x1CBD, 0x1CBF},
    {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D},
    {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59}, {0x1F5B, 0x1F5B},
    {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x1FBE, 0x1FBE},
    {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB}, {0x1FE0, 0x1FEC},
    {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107}, {0x210A, 0x2113},
    {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126}, {0x2128, 0x2128},
    {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F}, {0x2145, 0x2149},
    {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4}, {0x2CEB, 0x2CEE},
    {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F}, {0xA771, 0xA787},
    {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17}, {0xFF21, 0xFF3A},
    {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB},
    {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF}, {0x1E900, 0x1E943},
};
static bool in_ranges(uint32_t c, const uint32_t (*r)[2], size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (c >= r[i][0] && c <= r[i][1])
            return true;
    return false;
}
static bool dsllm_letter(uint32_t c)
{
    if (c < 128)
        return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z');
    return in_ranges(c, dsllm_letters, sizeof dsllm_letters / sizeof dsllm_letters[0]);
}
static bool dsllm_punct(uint32_t c)
{
    return (c >= '!' && c <= '/') || (c >= ':' && c <= '~') || (c >= 0xFF01 && c <= 0xFF0F) ||
           (c >= 0xFF1A && c <= 0xFF5E) || (c >= 0x2018 && c <= 0x201F) ||
           (c >= 0x3000 && c <= 0x3002);
}
static bool dsllm_cjk(uint32_t c)
{
    return (c >= 0x4E00 && c <= 0x9FA5) || (c >= 0x0800 && c <= 0x4E00) ||
           (c >= 0xAC00 && c <= 0xD7FF);
}
/* \s?[class]+ : optional whitespace then a run */
static size_t m_opt_ws_run(const tok_frag *f, size_t p, size_t e, bool (*in)(uint32_t))
{
    if (w_ws(f, p) && p + 1 < e && in(f->cp[p + 1])) {
        size_t q = p + 2;
        while (q < e && in(f->cp[q]))
            q++;
        return q;
    }
    size_t q = p;
    while (q < e && in(f->cp[q]))
        q++;
    return q;
}
static size_t m_dsllm_letters(const tok_frag *f, size_t p, size_t e)
{
    return m_opt_ws_run(f, p, e, dsllm_letter);
}
static size_t m_dsllm_punct(const tok_frag *f, size_t p, size_t e)
{
    return m_opt_ws_run(f, p, e, dsllm_punct);
}
static size_t m_dsllm_cjk(const tok_frag *f, size_t p, size_t e)
{
    size_t q = p;
    while (q < e && dsllm_cjk(f->cp[q]))
        q++;
    return q;
}

/* \s+$ : whitespace reaching the end of the fragment piece */
static void split_ws_end(const tok_frag *f, size_t s, size_t e, tok_cuts *out)
{
    size_t w = e;
    while (w > s && w_ws(f, w - 1))
        w--;
    cut(out, w);
    cut(out, e);
}

/* GPT-2 (llama.cpp's unicode_regex_split_custom_gpt2) */
static void split_gpt2(const tok_frag *f, size_t s, size_t e, tok_cuts *out)
{
    size_t pos = s;
    while (pos < e) {
        uint32_t c = f->cp[pos];
        if (c == '\'' && pos + 1 < e) {
            uint32_t n1 = f->cp[pos + 1];
            if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
                pos += 2;
                cut(out, pos);
                continue;
            }
            if (pos + 2 < e) {
                uint32_t n2 = f->cp[pos + 2];
                if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
                    pos += 3;
                    cut(out, pos);
                    continue;
                }
            }
        }
        size_t p2 = c == ' ' ? pos + 1 : pos;
        if (f_letter(f, p2, e)) {
            pos = p2;
            while (f_letter(f, pos, e))
                pos++;
            cut(out, pos);
            continue;
        }
        if (f_number(f, p2, e)) {
            pos = p2;
            while (f_number(f, pos, e))
                pos++;
            cut(out, pos);
            continue;
        }
        if (f_other(f, p2, e)) {
            pos = p2;
            while (f_other(f, pos, e))
                pos++;
            cut(out, pos);
            continue;
        }
        size_t nws = 0;
        while (f_ws(f, pos + nws, e))
            nws++;
        if (nws > 1 && pos + nws < e) {
            pos += nws - 1;
            cut(out, pos);
            continue;
        }
        pos += nws ? nws : 1;
        cut(out, pos);
    }
    cut(out, e);
}

/* Llama 3 / Qwen2 (llama.cpp's unicode_regex_split_custom_llama3 / _qwen2):
 * max_digits 3 or 1 */
static void split_llama3(const tok_frag *f, size_t s, size_t e, tok_cuts *out, size_t max_digits)
{
    size_t pos = s;
    while (pos < e) {
        uint32_t c = f->cp[pos];
        if (c == '\'' && pos + 1 < e) {
            uint32_t n1 = ascii_lower(f->cp[pos + 1]);
            if (n1 == 's' || n1 == 't' || n1 == 'm' || n1 == 'd') {
                pos += 2;
                cut(out, pos);
                continue;
            }
            if (pos + 2 < e) {
                uint32_t n2 = ascii_lower(f->cp[pos + 2]);
                if ((n1 == 'r' && n2 == 'e') || (n1 == 'v' && n2 == 'e') || (n1 == 'l' && n2 == 'l')) {
                    pos += 3;
                    cut(out, pos);
                    continue;
                }
            }
        }
        if (!(c == '\r' || c == '\n' || f_number(f, pos, e)) &&
            (f_letter(f, pos, e) || f_letter(f, pos + 1, e))) {
            pos++;
            while (f_letter(f, pos, e))
                pos++;
            cut(out, pos);
            continue;
        }
        if (f_number(f, pos, e)) {
            size_t ini = pos;
            while (f_number(f, pos, e)) {
                if (++pos - ini >= max_digits) {
                    cut(out, pos);
                    ini = pos;
                }
            }
            cut(out, pos);
            continue;
        }
        /* <space>?[^\s\p{L}\p{N}]+[\r\n]* : the code point itself is in range */
        size_t p2 = c == ' ' ? pos + 1 : pos;
        if (!(f_ws(f, p2, e) || f_letter(f, p2, e) || f_number(f, p2, e))) {
            pos = p2;
            while (f_other(f, pos, e))
                pos++;
            while (f_cp(f, pos, e) == '\r' || f_cp(f, pos, e) == '\n')
                pos++;
            cut(out, pos);
            continue;
        }
        size_t nws = 0, last_crlf = 0;
        while (f_ws(f, pos + nws, e)) {
            uint32_t c2 = f->cp[pos + nws];
            if (c2 == '\r' || c2 == '\n')
                last_crlf = pos + nws + 1;
            nws++;
        }
        if (last_crlf > 0) {
            pos = last_crlf;
            cut(out, pos);
            continue;
        }
        if (nws > 1 && pos + nws < e) {
            pos += nws - 1;
            cut(out, pos);
            continue;
        }
        pos += nws ? nws : 1;
        cut(out, pos);
    }
    cut(out, e);
}

typedef enum tok_pass_kind {
    PASS_REGEX,
    PASS_GPT2,
    PASS_LLAMA3,
    PASS_QWEN2,
    PASS_WS_END
} tok_pass_kind;

typedef struct tok_pass {
    tok_pass_kind kind;
    tok_match_fn m;
} tok_pass;

/* Applies one pass to every current piece. */
static void run_pass(tok_frag *f, tok_pass p)
{
    tok_cuts out = {.v = f->ends2, .n = 0};
    size_t s = 0;
    for (size_t i = 0; i < f->n_ends; i++) {
        size_t e = f->ends[i];
        switch (p.kind) {
        case PASS_REGEX: split_regex(f, s, e, p.m, &out); break;
        case PASS_GPT2: split_gpt2(f, s, e, &out); break;
        case PASS_LLAMA3: split_llama3(f, s, e, &out, 3); break;
        case PASS_QWEN2: split_llama3(f, s, e, &out, 1); break;
        case PASS_WS_END: split_ws_end(f, s, e, &out); break;
        }
        s = e;
    }
    size_t *tmp = f->ends;
    f->ends = f->ends2;
    f->ends2 = tmp;
    f->n_ends = out.n;
}

static void pretokenize(tok_frag *f)
{
    f->n_ends = 0;
    if (f->ncp == 0)
        return;
    f->ends[0] = f->ncp;
    f->n_ends = 1;
    switch (f->t->pre) {
    case TOK_PRE_DEEPSEEK_V3:
        run_pass(f, (tok_pass){PASS_REGEX, m_digits3});
        run_pass(f, (tok_pass){PASS_REGEX, m_cjk_v3});
        run_pass(f, (tok_pass){PASS_REGEX, m_dsv3});
        break;
    case TOK_PRE_DEEPSEEK_LLM:
        run_pass(f, (tok_pass){PASS_REGEX, m_crlf});
        run_pass(f, (tok_pass){PASS_REGEX, m_dsllm_letters});
        run_pass(f, (tok_pass){PASS_REGEX, m_dsllm_punct});
        run_pass(f, (tok_pass){PASS_WS_END, NULL});
        run_pass(f, (tok_pass){PASS_REGEX, m_dsllm_cjk});
        run_pass(f, (tok_pass){PASS_REGEX, m_digits});
        break;
    case TOK_PRE_LLAMA3: run_pass(f, (tok_pass){PASS_LLAMA3, NULL}); break;
    case TOK_PRE_QWEN2: run_pass(f, (tok_pass){PASS_QWEN2, NULL}); break;
    case TOK_PRE_GPT2: run_pass(f, (tok_pass){PASS_GPT2, NULL}); break;
    case TOK_PRE_DEFAULT:
    default:
        run_pass(f, (tok_pass){PASS_REGEX, m_def_p});
        run_pass(f, (tok_pass){PASS_GPT2, NULL});
        run_pass(f, (tok_pass){PASS_REGEX, m_digits});
        run_pass(f, (tok_pass){PASS_REGEX, m_ascii3});
        break;
    }
}

/* --- byte-level BPE of one word */

typedef struct tok_sym {
    int32_t sid;  /* string id, -1 when the text is in no table */
    int32_t prev, next;
    uint32_t start, len; /* original bytes of the word */
} tok_sym;

typedef struct tok_bigram {
    int32_t rank, left, right;
    uint32_t size;
} tok_bigram;

typedef struct tok_scratch {
    tok_sym *sym;
    size_t sym_cap;
    tok_bigram *heap;
    size_t heap_n, heap_cap;
    char *enc;
    size_t enc_cap;
    bool oom;
} tok_scratch;

static bool bigram_less(const tok_bigram *a, const tok_bigram *b)
{
    return a->rank < b->rank || (a->rank == b->rank && a->left < b->left);
}

static void heap_push(tok_scratch *s, tok_bigram b)
{
    if (s->heap_n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 64;
        tok_bigram *h = realloc(s->heap, cap * sizeof *h);
        if (!h) {
            s->oom = true;
            return;
        }
        s->heap = h;
        s->heap_cap = cap;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!bigram_less(&b, &s->heap[p]))
            break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = b;
}

static tok_bigram heap_pop(tok_scratch *s)
{
    tok_bigram top = s->heap[0];
    tok_bigram last = s->heap[--s->heap_n];
    size_t n = s->heap_n, i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const tok_bigram *mv = &last;
        if (l < n && bigram_less(&s->heap[l], mv)) {
            m = l;
            mv = &s->heap[l];
        }
        if (r < n && bigram_less(&s->heap[r], mv))
            m = r;
        if (m == i)
            break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (n)
        s->heap[i] = last;
    return top;
}

static const tok_merge_slot *merge_find(const tok *t, int32_t a, int32_t b)
{
    if (!t->n_merge_slots || a < 0 || b < 0)
        return NULL;
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b, mask = t->n_merge_slots - 1;
    for (uint64_t h = tok_mix(key) & mask;; h = (h + 1) & mask) {
        if (t->merges[h].key == key)
            return &t->merges[h];
        if (t->merges[h].key == UINT64_MAX)
            return NULL;
    }
}

static void bigram_add(const tok *t, tok_scratch *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const tok_merge_slot *m = merge_find(t, s->sym[l].sid, s->sym[r].sid);
    if (m)
        heap_push(s, (tok_bigram){.rank = m->rank, .left = l, .right = r,
                                  .size = s->sym[l].len + s->sym[r].len});
}

/* Emits the ids of one symbol's bytes w[start..start+len): its token, or
 * (llama.cpp's fallback) the single-byte tokens of its encoded text. */
static void bpe_emit(const tok *t, const unsigned char *w, const tok_sym *y, tok_ids *out)
{
    int32_t id = y->sid >= 0 ? t->sid_tok[y->sid] : -1;
    if (id >= 0) {
        ids_push(out, id);
        return;
    }
    for (uint32_t i = 0; i < y->len; i++) {
        char c[2];
        size_t k = tok_gpt2_char(w[y->start + i], c);
        for (size_t j = 0; j < k; j++) {
            int64_t sid = strtab_find(&t->strs, c + j, 1);
            if (sid >= 0 && t->sid_tok[sid] >= 0)
                ids_push(out, t->sid_tok[sid]);
        }
    }
}

static void bpe_word(const tok *t, tok_scratch *s, const unsigned char *w, size_t n, tok_ids *out)
{
    if (n == 0)
        return;
    if (t->pre == TOK_PRE_LLAMA3) { /* ignore_merges: a word in the vocabulary is its token */
        if (2 * n > s->enc_cap) {
            char *e = realloc(s->enc, 2 * n);
            if (!e) {
                s->oom = true;
                return;
            }
            s->enc = e;
            s->enc_cap = 2 * n;
        }
        size_t k = 0;
        for (size_t i = 0; i < n; i++)
            k += tok_gpt2_char(w[i], s->enc + k);
        int64_t sid = strtab_find(&t->strs, s->enc, k);
        if (sid >= 0 && t->sid_tok[sid] >= 0) {
            ids_push(out, t->sid_tok[sid]);
            return;
        }
    }
    if (n > s->sym_cap) {
        tok_sym *y = realloc(s->sym, n * sizeof *y);
        if (!y) {
            s->oom = true;
            return;
        }
        s->sym = y;
        s->sym_cap = n;
    }
    for (size_t i = 0; i < n; i++)
        s->sym[i] = (tok_sym){.sid = t->byte_sid[w[i]], .prev = (int32_t)i - 1,
                              .next = i + 1 < n ? (int32_t)i + 1 : -1, .start = (uint32_t)i,
                              .len = 1};
    s->heap_n = 0;
    for (size_t i = 1; i < n; i++)
        bigram_add(t, s, (int32_t)i - 1, (int32_t)i);
    while (s->heap_n && !s->oom) {
        tok_bigram b = heap_pop(s);
        tok_sym *l = &s->sym[b.left], *r = &s->sym[b.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.size)
            continue; /* outdated */
        const tok_merge_slot *m = merge_find(t, l->sid, r->sid);
        CHECK(m);
        l->sid = m->result;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            s->sym[r->next].prev = b.left;
        bigram_add(t, s, l->prev, b.left);
        bigram_add(t, s, b.left, l->next);
    }
    for (int32_t i = 0; i >= 0; i = s->sym[i].next)
        bpe_emit(t, w, &s->sym[i], out);
}

/* --- SentencePiece BPE (llama): llama.cpp's llm_tokenizer_spm */

typedef struct spm_bigram {
    float score;
    int32_t left, right;
    uint32_t size;
} spm_bigram;

/* Tokenizes one fragment's text (spaces already U+2581). Symbols are UTF-8
 * characters; the best-scored adjacent pair whose concatenation is a token is
 * merged first (equal scores: leftmost); leftovers resegment through merges
 * recorded on the way or fall back to byte tokens. */
typedef struct spm_state {
    const tok *t;
    const char *text;
    tok_sym *sym; /* start/len in bytes of text; sid unused */
    size_t nsym;
    spm_bigram *heap;
    size_t heap_n, heap_cap;
    /* rev_merge: text span -> the two spans merged into it (by start/len) */
    bool oom;
} spm_state;

static bool spm_less(const spm_bigram *a, const spm_bigram *b)
{
    return a->score > b->score || (a->score == b->score && a->left < b->left);
}

static void spm_push(spm_state *s, spm_bigram b)
{
    if (s->heap_n == s->heap_cap) {
        size_t cap = s->heap_cap ? s->heap_cap * 2 : 64;
        spm_bigram *h = realloc(s->heap, cap * sizeof *h);
        if (!h) {
            s->oom = true;
            return;
        }
        s->heap = h;
        s->heap_cap = cap;
    }
    size_t i = s->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!spm_less(&b, &s->heap[p]))
            break;
        s->heap[i] = s->heap[p];
        i = p;
    }
    s->heap[i] = b;
}

static spm_bigram spm_pop(spm_state *s)
{
    spm_bigram top = s->heap[0];
    spm_bigram last = s->heap[--s->heap_n];
    size_t n = s->heap_n, i = 0;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        const spm_bigram *mv = &last;
        if (l < n && spm_less(&s->heap[l], mv)) {
            m = l;
            mv = &s->heap[l];
        }
        if (r < n && spm_less(&s->heap[r], mv))
            m = r;
        if (m == i)
            break;
        s->heap[i] = s->heap[m];
        i = m;
    }
    if (n)
        s->heap[i] = last;
    return top;
}

static int32_t spm_token(const tok *t, const char *s, size_t n)
{
    int64_t sid = strtab_find(&t->strs, s, n);
    return sid >= 0 ? t->sid_tok[sid] : -1;
}

static void spm_try_add(spm_state *s, int32_t l, int32_t r)
{
    if (l < 0 || r < 0)
        return;
    const tok_sym *a = &s->sym[l], *b = &s->sym[r];
    int32_t id = spm_token(s->t, s->text + a->start, a->len + b->len);
    if (id < 0 || (uint32_t)id >= s->t->n)
        return;
    spm_push(s, (spm_bigram){.score = s->t->scores[id], .left = l, .right = r,
                             .size = a->len + b->len});
}

/* llama.cpp's resegment: a symbol with a token is emitted; one without was
 * never merged (a merge needs its result to be a token), so it is a single
 * character and falls back to its byte tokens. A byte without one is <unk>
 * here (llama.cpp throws on it). */
static void spm_emit(const tok *t, const char *text, uint32_t start, uint32_t len, tok_ids *out)
{
    int32_t id = spm_token(t, text + start, len);
    if (id >= 0) {
        ids_push(out, id);
        return;
    }
    for (uint32_t i = 0; i < len; i++) {
        int32_t b = t->byte_tok[(unsigned char)text[start + i]];
        if (b >= 0)
            ids_push(out, b);
        else if (t->unk >= 0)
            ids_push(out, t->unk);
    }
}

static void spm_text(const tok *t, tok_scratch *sc, const char *text, size_t n, tok_ids *out)
{
    if (n == 0)
        return;
    if (n > sc->sym_cap) {
        tok_sym *y = realloc(sc->sym, n * sizeof *y);
        if (!y) {
            sc->oom = true;
            return;
        }
        sc->sym = y;
        sc->sym_cap = n;
    }
    spm_state s = {.t = t, .text = text, .sym = sc->sym};
    size_t off = 0;
    int32_t k = 0;
    while (off < n) {
        size_t bad = 0;
        size_t cl = pd_utf8_decode(text + off, n - off, NULL, &bad);
        if (!cl)
            cl = 1;
        s.sym[k] = (tok_sym){.sid = 0, .prev = k - 1, .next = -1, .start = (uint32_t)off,
                             .len = (uint32_t)cl};
        if (k > 0)
            s.sym[k - 1].next = k;
        off += cl;
        k++;
    }
    s.nsym = (size_t)k;
    for (int32_t i = 1; i < k; i++)
        spm_try_add(&s, i - 1, i);
    while (s.heap_n && !s.oom) {
        spm_bigram b = spm_pop(&s);
        tok_sym *l = &s.sym[b.left], *r = &s.sym[b.right];
        if (l->len == 0 || r->len == 0 || l->len + r->len != b.size)
            continue;
        l->len += r->len;
        r->len = 0;
        l->next = r->next;
        if (r->next >= 0)
            s.sym[r->next].prev = b.left;
        spm_try_add(&s, l->prev, b.left);
        spm_try_add(&s, b.left, l->next);
    }
    if (s.oom)
        sc->oom = true;
    for (int32_t i = 0; i >= 0 && k > 0; i = s.sym[i].next)
        spm_emit(t, text, s.sym[i].start, s.sym[i].len, out);
    free(s.heap);
}

/* --- special tokens */

typedef struct tok_occ {
    uint32_t order; /* index in specials[] */
    size_t pos;
} tok_occ;

static int occ_cmp(const void *a, const void *b)
{
    const tok_occ *x = a, *y = b;
    if (x->order != y->order)
        return x->order < y->order ? -1 : 1;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

static bool special_on(const tok *t, int32_t id, bool parse_special)
{
    return parse_special || t->types[id] == TT_USER;
}

/* A fragment: raw text [s, e) or a special token. */
typedef struct tok_piece {
    size_t s, e;
    int32_t id; /* -1: raw text */
} tok_piece;

static int occ_pos_cmp(const void *a, const void *b)
{
    const tok_occ *x = a, *y = b;
    return x->pos < y->pos ? -1 : x->pos > y->pos;
}

/* The fragments llama.cpp's tokenizer_st_partition produces: for each special
 * token, longest first, its leftmost non-overlapping occurrences inside what
 * is still raw text become tokens. Here: every occurrence is found in one
 * scan (two-byte buckets), then accepted in (token order, position) order
 * when its bytes are still raw. Returns the fragments (owned, free()), or
 * NULL with *oom on no memory. */
static tok_piece *partition(const tok *t, const char *text, size_t len, bool parse_special,
                            size_t *n_out, bool *oom)
{
    const unsigned char *u = (const unsigned char *)text;
    tok_occ *occ = NULL;
    size_t n_occ = 0, cap = 0;
    *n_out = 0;
    *oom = false;
    for (size_t i = 0; i < len && t->n_specials; i++) {
        int32_t heads[2] = {t->spec_head1[u[i]],
                            i + 1 < len ? t->spec_head[u[i] << 8 | u[i + 1]] : -1};
        for (int h = 0; h < 2; h++)
            for (int32_t k = heads[h]; k >= 0; k = t->spec_next[k]) {
                int32_t id = t->specials[k];
                size_t sl = t->text_off[id + 1] - t->text_off[id];
                if (sl > len - i || !special_on(t, id, parse_special) ||
                    memcmp(text + i, t->texts + t->text_off[id], sl))
                    continue;
                if (n_occ == cap) {
                    size_t c2 = cap ? cap * 2 : 16;
                    tok_occ *o2 = realloc(occ, c2 * sizeof *o2);
                    if (!o2) {
                        free(occ);
                        *oom = true;
                        return NULL;
                    }
                    occ = o2;
                    cap = c2;
                }
                occ[n_occ++] = (tok_occ){.order = (uint32_t)k, .pos = i};
            }
    }
    size_t n_acc = 0;
    if (n_occ) {
        qsort(occ, n_occ, sizeof *occ, occ_cmp);
        uint8_t *taken = calloc(len, 1);
        if (!taken) {
            free(occ);
            *oom = true;
            return NULL;
        }
        for (size_t j = 0; j < n_occ; j++) {
            int32_t id = t->specials[occ[j].order];
            size_t sl = t->text_off[id + 1] - t->text_off[id], p = occ[j].pos;
            bool raw = true;
            for (size_t q = p; q < p + sl && raw; q++)
                raw = !taken[q];
            if (!raw)
                continue;
            memset(taken + p, 1, sl);
            occ[n_acc++] = occ[j];
        }
        free(taken);
        qsort(occ, n_acc, sizeof *occ, occ_pos_cmp);
    }
    tok_piece *pc = malloc((2 * n_acc + 1) * sizeof *pc);
    if (!pc) {
        free(occ);
        *oom = true;
        return NULL;
    }
    size_t np = 0, at = 0;
    for (size_t j = 0; j < n_acc; j++) {
        int32_t id = t->specials[occ[j].order];
        size_t sl = t->text_off[id + 1] - t->text_off[id];
        if (occ[j].pos > at)
            pc[np++] = (tok_piece){.s = at, .e = occ[j].pos, .id = -1};
        pc[np++] = (tok_piece){.s = occ[j].pos, .e = occ[j].pos + sl, .id = id};
        at = occ[j].pos + sl;
    }
    if (at < len)
        pc[np++] = (tok_piece){.s = at, .e = len, .id = -1};
    free(occ);
    *n_out = np;
    return pc;
}

/* Pre-tokenizes and BPE-encodes one raw gpt2 fragment. */
static void gpt2_fragment(const tok *t, tok_frag *f, tok_scratch *sc, const char *s, size_t n,
                          tok_ids *out)
{
    f->bytes = s;
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp = 0;
        size_t l = pd_utf8_decode(s + i, n - i, &cp, NULL);
        CHECK(l > 0); /* validated by tok_encode */
        f->cp[k] = cp;
        f->boff[k] = i;
        f->cb[k] = tok_collapse(t, cp);
        k++;
        i += l;
    }
    f->boff[k] = n;
    f->ncp = k;
    pretokenize(f);
    size_t st = 0;
    for (size_t i = 0; i < f->n_ends; i++) {
        size_t e = f->ends[i];
        bpe_word(t, sc, (const unsigned char *)s + f->boff[st], f->boff[e] - f->boff[st], out);
        st = e;
    }
}

/* llama: ' ' -> U+2581 with an optional leading space, then SentencePiece. */
static void spm_fragment(const tok *t, tok_scratch *sc, const char *s, size_t n, bool prefix,
                         tok_ids *out)
{
    size_t spaces = 0;
    for (size_t i = 0; i < n; i++)
        spaces += s[i] == ' ';
    size_t m = n + 2 * spaces + (prefix ? 3 : 0); /* each space grows from 1 to 3 bytes */
    char *buf = malloc(m ? m : 1);
    if (!buf) {
        sc->oom = true;
        return;
    }
    size_t o = 0;
    if (prefix) {
        memcpy(buf, "\xe2\x96\x81", 3);
        o = 3;
    }
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(buf + o, "\xe2\x96\x81", 3);
            o += 3;
        } else {
            buf[o++] = s[i];
        }
    }
    spm_text(t, sc, buf, o, out);
    free(buf);
}

pd_status tok_encode(const tok *t, const char *text, size_t len, tok_opts o, int32_t **ids,
                     size_t *n_ids, pd_err *err)
{
    if (!t || !ids || !n_ids || (!text && len))
        return pd_err_set(err, PD_ERR_ARG, "tokenizer: NULL argument");
    size_t bad = 0;
    const char *nul = len ? memchr(text, 0, len) : NULL;
    bool valid = pd_utf8_valid(text, len, &bad);
    if (nul && (valid || (size_t)(nul - text) < bad))
        return pd_err_set(err, PD_ERR_FORMAT, "tokenizer: byte offset %zu: NUL byte in text",
                          (size_t)(nul - text));
    if (!valid)
        return pd_err_set(err, PD_ERR_FORMAT, "tokenizer: byte offset %zu: invalid UTF-8", bad);
    tok_ids out = {0};
    tok_scratch sc = {0};
    tok_frag f = {.t = t};
    size_t np = 0;
    bool oom = false;
    tok_piece *pc = len ? partition(t, text, len, o.parse_special, &np, &oom) : NULL;
    if (!oom && t->model == TOK_MODEL_GPT2 && np) {
        size_t maxn = 0;
        for (size_t i = 0; i < np; i++)
            if (pc[i].id < 0 && pc[i].e - pc[i].s > maxn)
                maxn = pc[i].e - pc[i].s;
        f.cp = malloc((maxn + 1) * sizeof *f.cp);
        f.boff = malloc((maxn + 1) * sizeof *f.boff);
        f.cb = malloc(maxn + 1);
        f.ends = malloc((maxn + 1) * sizeof *f.ends);
        f.ends2 = malloc((maxn + 1) * sizeof *f.ends2);
        oom = !f.cp || !f.boff || !f.cb || !f.ends || !f.ends2;
    }
    if (!oom && o.add_special && t->add_bos && t->bos >= 0)
        ids_push(&out, t->bos);
    bool prev_special = true; /* llama: prefix a space to the first fragment and after specials */
    for (size_t i = 0; i < np && !oom; i++) {
        if (pc[i].id >= 0) {
            ids_push(&out, pc[i].id);
            prev_special = true;
        } else if (t->model == TOK_MODEL_GPT2) {
            gpt2_fragment(t, &f, &sc, text + pc[i].s, pc[i].e - pc[i].s, &out);
        } else {
            spm_fragment(t, &sc, text + pc[i].s, pc[i].e - pc[i].s,
                         t->add_space_prefix && prev_special, &out);
            prev_special = false;
        }
        oom = sc.oom || out.oom;
    }
    if (!oom && o.add_special && t->add_eos && t->eos >= 0)
        ids_push(&out, t->eos);
    oom = oom || out.oom;
    free(pc);
    free(f.cp);
    free(f.boff);
    free(f.cb);
    free(f.ends);
    free(f.ends2);
    free(sc.sym);
    free(sc.heap);
    free(sc.enc);
    if (oom) {
        free(out.v);
        return pd_err_set(err, PD_ERR_NOMEM, "tokenizer: no memory for a text of %zu bytes", len);
    }
    *ids = out.v;
    *n_ids = out.n;
    return PD_OK;
}

pd_status tok_split(const tok *t, const char *text, size_t len, size_t **lens, size_t *n,
                    pd_err *err)
{
    if (!t || !lens || !n || (!text && len))
        return pd_err_set(err, PD_ERR_ARG, "tokenizer: NULL argument");
    size_t bad = 0;
    const char *nul = len ? memchr(text, 0, len) : NULL;
    bool valid = pd_utf8_valid(text, len, &bad);
    if (nul && (valid || (size_t)(nul - text) < bad))
        return pd_err_set(err, PD_ERR_FORMAT, "tokenizer: byte offset %zu: NUL byte in text",
                          (size_t)(nul - text));
    if (!valid)
        return pd_err_set(err, PD_ERR_FORMAT, "tokenizer: byte offset %zu: invalid UTF-8", bad);
    size_t np = 0;
    bool oom = false;
    tok_piece *pc = len ? partition(t, text, len, true, &np, &oom) : NULL;
    size_t *out = oom ? NULL : malloc((len + 1) * sizeof *out);
    tok_frag f = {.t = t};
    if (out && t->model == TOK_MODEL_GPT2) {
        f.cp = malloc((len + 1) * sizeof *f.cp);
        f.boff = malloc((len + 1) * sizeof *f.boff);
        f.cb = malloc(len + 1);
        f.ends = malloc((len + 1) * sizeof *f.ends);
        f.ends2 = malloc((len + 1) * sizeof *f.ends2);
        oom = !f.cp || !f.boff || !f.cb || !f.ends || !f.ends2;
    }
    size_t k = 0;
    for (size_t i = 0; out && !oom && i < np; i++) {
        if (pc[i].id >= 0 || t->model != TOK_MODEL_GPT2) {
            out[k++] = pc[i].e - pc[i].s;
            continue;
        }
        const char *s = text + pc[i].s;
        size_t m = pc[i].e - pc[i].s, c = 0;
        for (size_t j = 0; j < m;) {
            uint32_t cp = 0;
            size_t l = pd_utf8_decode(s + j, m - j, &cp, NULL);
            f.cp[c] = cp;
            f.boff[c] = j;
            f.cb[c] = tok_collapse(t, cp);
            c++;
            j += l;
        }
        f.boff[c] = m;
        f.ncp = c;
        pretokenize(&f);
        size_t st = 0;
        for (size_t q = 0; q < f.n_ends; q++) {
            out[k++] = f.boff[f.ends[q]] - f.boff[st];
            st = f.ends[q];
        }
    }
    free(pc);
    free(f.cp);
    free(f.boff);
    free(f.cb);
    free(f.ends);
    free(f.ends2);
    if (!out || oom) {
        free(out);
        return pd_err_set(err, PD_ERR_NOMEM, "tokenizer: no memory for a text of %zu bytes", len);
    }
    *lens = out;
    *n = k;
    return PD_OK;
}

/* ================================================================ from GGUF */

static pd_status tok_gguf_str_arr(const gguf_file *f, const char *key, uint64_t *count,
                                  const char ***strs, uint32_t **lens, pd_err *err)
{
    gguf_vtype et;
    const void *data;
    pd_status st = gguf_get_arr(f, key, &et, count, &data, err);
    if (st)
        return st;
    if (et != GGUF_VTYPE_STRING)
        return pd_err_set(err, PD_ERR_MISMATCH, "%s: expected an array of strings", key);
    if (*count > SIZE_MAX / sizeof(char *) || *count > UINT32_MAX)
        return pd_err_set(err, PD_ERR_RANGE, "%s: %llu strings", key, (unsigned long long)*count);
    *strs = malloc((*count ? *count : 1) * sizeof **strs);
    *lens = malloc((*count ? *count : 1) * sizeof **lens);
    if (!*strs || !*lens) {
        free(*strs);
        free(*lens);
        return pd_err_set(err, PD_ERR_NOMEM, "%s: no memory for %llu strings", key,
                          (unsigned long long)*count);
    }
    for (uint64_t i = 0; i < *count; i++) {
        size_t l;
        if ((st = gguf_get_str_arr(f, key, i, &(*strs)[i], &l, err)) == PD_OK && l > UINT32_MAX)
            st = pd_err_set(err, PD_ERR_RANGE, "%s[%llu]: %zu bytes", key, (unsigned long long)i, l);
        if (st) {
            free(*strs);
            free(*lens);
            return st;
        }
        (*lens)[i] = (uint32_t)l;
    }
    return PD_OK;
}

/* An optional integer id key: absent -> dflt. */
static pd_status tok_gguf_id(const gguf_file *f, const char *key, int32_t dflt, uint32_t n,
                             int32_t *out, pd_err *err)
{
    *out = dflt;
    if (gguf_find_key(f, key) < 0)
        return PD_OK;
    uint32_t v;
    pd_status st = gguf_get_u32(f, key, &v, err);
    if (st)
        return st;
    /* llama.cpp ignores an id outside the vocabulary, keeping the default */
    if (v < n)
        *out = (int32_t)v;
    return PD_OK;
}

static pd_status tok_gguf_flag(const gguf_file *f, const char *key, int *out, pd_err *err)
{
    *out = -1;
    if (gguf_find_key(f, key) < 0)
        return PD_OK;
    bool b;
    pd_status st = gguf_get_bool(f, key, &b, err);
    if (st == PD_OK)
        *out = b;
    return st;
}

pd_status tok_new_gguf(const gguf_file *f, tok **out, pd_err *err)
{
    if (!f || !out)
        return pd_err_set(err, PD_ERR_ARG, "tokenizer: NULL file or output");
    const char *model = NULL, *pre = NULL;
    pd_status st = gguf_get_str(f, "tokenizer.ggml.model", &model, NULL, err);
    if (st)
        return st;
    if (gguf_find_key(f, "tokenizer.ggml.pre") >= 0 &&
        (st = gguf_get_str(f, "tokenizer.ggml.pre", &pre, NULL, err)))
        return st;
    tok_desc d = {.model = model, .pre = pre, .bos = -1, .eos = -1, .unk = -1};
    uint64_t n_tok = 0, n_merges = 0;
    const char **toks = NULL, **merges = NULL;
    uint32_t *tok_lens = NULL, *merge_lens = NULL;
    int32_t *types = NULL;
    float *scores = NULL;
    if ((st = tok_gguf_str_arr(f, "tokenizer.ggml.tokens", &n_tok, &toks, &tok_lens, err)))
        return st;
    if (n_tok == 0 || n_tok > INT32_MAX) {
        st = pd_err_set(err, PD_ERR_FORMAT, "tokenizer.ggml.tokens: %llu tokens",
                        (unsigned long long)n_tok);
        goto done;
    }
    d.n_tokens = (uint32_t)n_tok;
    d.tokens = toks;
    d.token_lens = tok_lens;
    if (!strcmp(model, "gpt2")) {
        if (gguf_find_key(f, "tokenizer.ggml.merges") < 0) {
            st = pd_err_set(err, PD_ERR_FORMAT,
                            "tokenizer.ggml.merges: missing (a gpt2 tokenizer needs its merges)");
            goto done;
        }
        if ((st = tok_gguf_str_arr(f, "tokenizer.ggml.merges", &n_merges, &merges, &merge_lens,
                                   err)))
            goto done;
        d.n_merges = n_merges;
        d.merges = merges;
        d.merge_lens = merge_lens;
    }
    const void *data;
    gguf_vtype et;
    uint64_t cnt;
    if (gguf_find_key(f, "tokenizer.ggml.token_type") >= 0) {
        if ((st = gguf_get_arr(f, "tokenizer.ggml.token_type", &et, &cnt, &data, err)))
            goto done;
        if (et != GGUF_VTYPE_INT32 || cnt != n_tok) {
            st = pd_err_set(err, PD_ERR_FORMAT, "tokenizer.ggml.token_type: expected %llu int32 values",
                            (unsigned long long)n_tok);
            goto done;
        }
        types = malloc(n_tok * sizeof *types);
        if (!types) {
            st = pd_err_set(err, PD_ERR_NOMEM, "tokenizer: no memory");
            goto done;
        }
        for (uint64_t i = 0; i < n_tok; i++)
            types[i] = gguf_arr_i32_at(data, i);
        d.types = types;
    }
    if (gguf_find_key(f, "tokenizer.ggml.scores") >= 0) {
        if ((st = gguf_get_arr(f, "tokenizer.ggml.scores", &et, &cnt, &data, err)))
            goto done;
        if (et != GGUF_VTYPE_FLOAT32 || cnt != n_tok) {
            st = pd_err_set(err, PD_ERR_FORMAT, "tokenizer.ggml.scores: expected %llu float32 values",
                            (unsigned long long)n_tok);
            goto done;
        }
        scores = malloc(n_tok * sizeof *scores);
        if (!scores) {
            st = pd_err_set(err, PD_ERR_NOMEM, "tokenizer: no memory");
            goto done;
        }
        for (uint64_t i = 0; i < n_tok; i++)
            scores[i] = gguf_arr_f32_at(data, i);
        d.scores = scores;
    }
    bool llama = !strcmp(model, "llama");
    if ((st = tok_gguf_id(f, "tokenizer.ggml.bos_token_id", llama ? 1 : 11, d.n_tokens, &d.bos, err)) ||
        (st = tok_gguf_id(f, "tokenizer.ggml.eos_token_id", llama ? 2 : 11, d.n_tokens, &d.eos, err)) ||
        (st = tok_gguf_id(f, "tokenizer.ggml.unknown_token_id", llama ? 0 : -1, d.n_tokens, &d.unk, err)) ||
        (st = tok_gguf_flag(f, "tokenizer.ggml.add_bos_token", &d.add_bos, err)) ||
        (st = tok_gguf_flag(f, "tokenizer.ggml.add_eos_token", &d.add_eos, err)) ||
        (st = tok_gguf_flag(f, "tokenizer.ggml.add_space_prefix", &d.add_space_prefix, err)))
        goto done;
    if (d.bos >= (int32_t)d.n_tokens)
        d.bos = -1;
    if (d.eos >= (int32_t)d.n_tokens)
        d.eos = -1;
    if (d.unk >= (int32_t)d.n_tokens)
        d.unk = -1;
    st = tok_new(&d, out, err);
done:
    free(toks);
    free(tok_lens);
    free(merges);
    free(merge_lens);
    free(types);
    free(scores);
    return st;
}

pd_status tok_vocab_new(const tok *t, bool special, vocab **out, pd_err *err)
{
    uint32_t n = t->n;
    const char **texts = malloc(n * sizeof *texts);
    uint32_t *lens = malloc(n * sizeof *lens);
    int32_t *types = malloc(n * sizeof *types);
    pd_status st;
    if (!texts || !lens || !types) {
        st = pd_err_set(err, PD_ERR_NOMEM, "tokenizer: no memory for a vocabulary");
    } else {
        for (uint32_t i = 0; i < n; i++) {
            size_t l = 0;
            texts[i] = tok_text(t, (int32_t)i, &l);
            lens[i] = (uint32_t)l;
            types[i] = tok_token_type(t, (int32_t)i);
        }
        vocab_desc d = {.model = t->model == TOK_MODEL_GPT2 ? "gpt2" : "llama",
                        .n_tokens = n, .tokens = texts, .token_lens = lens, .types = types,
                        .bos = t->bos, .eos = t->eos, .no_space_prefix = true, .special = special};
        st = vocab_new(&d, out, err);
    }
    free(texts);
    free(lens);
    free(types);
    return st;
}

void tok_check(const tok *t)
{
    CHECK(t && t->n >= 1 && t->model < TOK_MODEL_COUNT && t->pre < TOK_PRE_COUNT);
    CHECK(t->text_off[0] == 0 && t->strs.n >= t->n);
    for (uint32_t i = 0; i < t->n; i++)
        CHECK(t->text_off[i] <= t->text_off[i + 1] && t->types[i] <= TT_BYTE);
    for (uint32_t i = 0; i < t->strs.n; i++)
        CHECK(t->sid_tok[i] >= -1 && t->sid_tok[i] < (int32_t)t->n);
    for (uint32_t k = 1; k < t->n_specials; k++)
        CHECK(tok_special_cmp_ctx_len(t, t->specials[k - 1], t->specials[k]) < 0);
    CHECK(t->bos >= -1 && t->bos < (int32_t)t->n && t->eos >= -1 && t->eos < (int32_t)t->n);
}

/* ---- a manifest's text segments ------------------------------------------ */

pd_status tok_pages_encode(void *ctx, const char *text, size_t len, int32_t **ids, size_t *n,
                           pd_err *err)
{
    tok_pages *tp = ctx;
    pd_status st = PD_OK;
    if (!tp->t) {
        gguf_file *own = NULL;
        const gguf_file *f = tp->gguf;
        if (!f && (st = gguf_open(tp->path, &own, err)) == PD_OK)
            f = own;
        if (st == PD_OK)
            st = tok_new_gguf(f, &tp->t, err); /* copies what it keeps: the file may go */
        gguf_close(own);
        if (st != PD_OK) {
            pd_err_prefix(err, "the model's tokenizer");
            return st;
        }
    }
    return tok_encode(tp->t, text, len, (tok_opts){.add_special = false, .parse_special = true}, ids, n, err);
}

void tok_pages_free(tok_pages *tp)
{
    if (!tp)
        return;
    tok_free(tp->t);
    tp->t = NULL;
}
