/* vocab: precomputes every token's output bytes once (SentencePiece or
 * byte-level BPE rules, see vocab.h) so detokenizing is a concatenation plus
 * one UTF-8 repair pass. Owns the piece bytes, their offsets and the types. */
#include "cluster/format/vocab.h"

#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "base/utf8.h"

/* INV: off[0] == 0, off[i] <= off[i + 1], off[n] == bytes in pieces;
 *      max_piece == max(off[i + 1] - off[i]); types[i] < VOCAB_TT_COUNT;
 *      bos, eos in [-1, n). */
struct vocab {
    vocab_kind kind;
    uint32_t n;
    int32_t bos, eos;
    bool strip_space; /* llama with add_space_prefix */
    bool special;     /* control tokens keep their text (vocab_desc.special) */
    size_t max_piece;
    size_t *off;      /* [n + 1] */
    char *pieces;     /* concatenated piece bytes */
    uint8_t *types;   /* [n] */
};

/* GPT-2's bytes_to_unicode: bytes 33..126, 161..172 and 174..255 map to the
 * same code point; the other 68 bytes map, in increasing byte order, to
 * U+0100, U+0101, ... The inverse: code point -> byte, or -1. */
static bool vocab_gpt2_printable(int b)
{
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
}

typedef struct vocab_gpt2_inv {
    uint8_t byte[68]; /* byte of code point 256 + k */
} vocab_gpt2_inv;

static void vocab_gpt2_inv_init(vocab_gpt2_inv *inv)
{
    int k = 0;
    for (int b = 0; b < 256; b++)
        if (!vocab_gpt2_printable(b))
            inv->byte[k++] = (uint8_t)b;
    CHECK(k == 68);
}

static int vocab_gpt2_byte(const vocab_gpt2_inv *inv, uint32_t cp)
{
    if (cp < 256)
        return vocab_gpt2_printable((int)cp) ? (int)cp : -1;
    return cp < 256 + 68 ? inv->byte[cp - 256] : -1;
}

size_t vocab_utf8_repair(const char *in, size_t n, char *out)
{
    const unsigned char *s = (const unsigned char *)in;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t bad = 0;
        size_t k = pd_utf8_decode(s + i, n - i, NULL, &bad);
        if (k) {
            memcpy(out + o, s + i, k);
            o += k;
            i += k;
            continue;
        }
        /* Maximal subpart: the longest prefix that could start a valid
         * sequence is consumed by one U+FFFD (at least one byte). */
        memcpy(out + o, "\xef\xbf\xbd", 3);
        o += 3;
        i += bad;
    }
    return o;
}

int vocab_byte_token(const char *t, size_t n)
{
    if (n != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>')
        return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = t[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* Writes token i's piece at dst (room for max(len, 3) bytes); returns its length. */
static size_t vocab_decode(const vocab_gpt2_inv *inv, vocab_kind kind, vocab_ttype tt, bool special,
                           const char *t, size_t n, char *dst)
{
    switch (tt) {
    case VOCAB_TT_CONTROL:
        if (!special)
            return 0;
        memcpy(dst, t, n); /* its own text, as written in the vocabulary */
        return n;
    case VOCAB_TT_UNUSED:
        return 0;
    case VOCAB_TT_USER_DEFINED:
        memcpy(dst, t, n);
        return n;
    case VOCAB_TT_UNKNOWN:
        if (kind == VOCAB_LLAMA) {
            memcpy(dst, "\xe2\x96\x85", 3);
            return 3;
        }
        memcpy(dst, t, n);
        return n;
    case VOCAB_TT_BYTE: {
        int b = vocab_byte_token(t, n);
        if (b >= 0) {
            dst[0] = (char)b;
            return 1;
        }
        break; /* gpt2: a byte-typed token with other text decodes as normal */
    }
    default:
        break;
    }
    size_t o = 0;
    const unsigned char *s = (const unsigned char *)t;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = pd_utf8_decode(s + i, n - i, &cp, NULL);
        if (!k) { /* ill-formed text: keep the byte, the final repair handles it */
            dst[o++] = (char)s[i++];
            continue;
        }
        if (kind == VOCAB_LLAMA && cp == 0x2581) {
            dst[o++] = ' ';
        } else if (kind == VOCAB_GPT2 && vocab_gpt2_byte(inv, cp) >= 0) {
            dst[o++] = (char)vocab_gpt2_byte(inv, cp);
        } else {
            memcpy(dst + o, s + i, k);
            o += k;
        }
        i += k;
    }
    return o;
}

pd_status vocab_new(const vocab_desc *d, vocab **out, pd_err *err)
{
    if (!d || !out)
        return pd_err_set(err, PD_ERR_ARG, "vocab: NULL description or output");
    vocab_kind kind;
    if (d->model && !strcmp(d->model, "llama"))
        kind = VOCAB_LLAMA;
    else if (d->model && !strcmp(d->model, "gpt2"))
        kind = VOCAB_GPT2;
    else
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "vocab: tokenizer model \"%s\" is not supported (llama, gpt2)",
                          d->model ? d->model : "(none)");
    if (d->n_tokens == 0 || d->n_tokens > (uint32_t)INT32_MAX || !d->tokens)
        return pd_err_set(err, PD_ERR_ARG, "vocab: %u tokens (need 1..INT32_MAX and a token array)",
                          d->n_tokens);
    if (d->bos < -1 || d->bos >= (int64_t)d->n_tokens || d->eos < -1 ||
        d->eos >= (int64_t)d->n_tokens)
        return pd_err_set(err, PD_ERR_RANGE, "vocab: bos %d / eos %d outside [-1, %u)", d->bos,
                          d->eos, d->n_tokens);
    uint32_t n = d->n_tokens;
    size_t room = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!d->tokens[i])
            return pd_err_set(err, PD_ERR_ARG, "vocab: token %u: NULL text", i);
        size_t len = d->token_lens ? d->token_lens[i] : strlen(d->tokens[i]);
        if (d->types && (d->types[i] < 0 || d->types[i] >= VOCAB_TT_COUNT))
            return pd_err_set(err, PD_ERR_FORMAT, "vocab: token %u: unknown token type %d", i,
                              d->types[i]);
        if (kind == VOCAB_LLAMA && d->types && d->types[i] == VOCAB_TT_BYTE &&
            vocab_byte_token(d->tokens[i], len) < 0)
            return pd_err_set(err, PD_ERR_FORMAT,
                              "vocab: token %u: byte token text is not of the form <0xNN>", i);
        size_t r = len < 3 ? 3 : len;
        if (room > SIZE_MAX - r)
            return pd_err_set(err, PD_ERR_NOMEM, "vocab: token texts overflow");
        room += r;
    }
    vocab *v = calloc(1, sizeof *v);
    if (v) {
        v->off = malloc((size_t)(n + 1) * sizeof *v->off);
        v->types = malloc(n);
        v->pieces = malloc(room ? room : 1);
    }
    if (!v || !v->off || !v->types || !v->pieces) {
        vocab_free(v);
        return pd_err_set(err, PD_ERR_NOMEM, "vocab: no memory for %u tokens", n);
    }
    v->kind = kind;
    v->n = n;
    v->bos = d->bos;
    v->eos = d->eos;
    v->strip_space = kind == VOCAB_LLAMA && !d->no_space_prefix;
    v->special = d->special;
    vocab_gpt2_inv inv;
    vocab_gpt2_inv_init(&inv);
    size_t o = 0;
    for (uint32_t i = 0; i < n; i++) {
        const char *t = d->tokens[i];
        size_t len = d->token_lens ? d->token_lens[i] : strlen(t);
        vocab_ttype tt;
        if (d->types)
            tt = (vocab_ttype)d->types[i];
        else if (kind == VOCAB_LLAMA && vocab_byte_token(t, len) >= 0)
            tt = VOCAB_TT_BYTE;
        else
            tt = VOCAB_TT_NORMAL;
        if ((int32_t)i == d->bos || (int32_t)i == d->eos)
            tt = VOCAB_TT_CONTROL;
        v->types[i] = (uint8_t)tt;
        v->off[i] = o;
        size_t k = vocab_decode(&inv, kind, tt, d->special, t, len, v->pieces + o);
        CHECK(k <= (len < 3 ? 3 : len));
        o += k;
        if (k > v->max_piece)
            v->max_piece = k;
    }
    v->off[n] = o;
    *out = v;
    return PD_OK;
}

void vocab_free(vocab *v)
{
    if (!v)
        return;
    free(v->off);
    free(v->types);
    free(v->pieces);
    free(v);
}

uint32_t vocab_size(const vocab *v) { return v->n; }
size_t vocab_max_piece(const vocab *v) { return v->max_piece; }

vocab_ttype vocab_token_type(const vocab *v, int32_t token)
{
    CHECKF(token >= 0 && (uint32_t)token < v->n, "token %d of %u", token, v->n);
    return (vocab_ttype)v->types[token];
}

const char *vocab_piece(const vocab *v, int32_t token, size_t *len)
{
    if (!v || token < 0 || (uint32_t)token >= v->n)
        return NULL;
    *len = v->off[token + 1] - v->off[token];
    return v->pieces + v->off[token];
}

pd_status vocab_text_reserve(vocab_text *t, size_t bytes, pd_err *err)
{
    if (!t)
        return pd_err_set(err, PD_ERR_ARG, "vocab: NULL text");
    if (bytes <= t->cap - t->len)
        return PD_OK;
    if (bytes > SIZE_MAX / 2 - t->len)
        return pd_err_set(err, PD_ERR_NOMEM, "vocab: text of %zu + %zu bytes", t->len, bytes);
    size_t cap = t->cap ? t->cap : 256;
    while (cap - t->len < bytes)
        cap *= 2;
    char *b = realloc(t->buf, cap);
    if (!b)
        return pd_err_set(err, PD_ERR_NOMEM, "vocab: no memory for %zu text bytes", cap);
    t->buf = b;
    t->cap = cap;
    return PD_OK;
}

pd_status vocab_detok_append(const vocab *v, vocab_text *t, int32_t token, pd_err *err)
{
    if (!v || !t)
        return pd_err_set(err, PD_ERR_ARG, "vocab: NULL vocab or text");
    size_t len;
    const char *p = vocab_piece(v, token, &len);
    if (!p)
        return pd_err_set(err, PD_ERR_RANGE, "vocab: token %d outside the vocabulary [0, %u)",
                          token, v->n);
    if (t->n_tokens == 0 && v->strip_space && len && p[0] == ' ') {
        p++;
        len--;
    }
    pd_status st = vocab_text_reserve(t, len, err);
    if (st != PD_OK)
        return st;
    if (len)
        memcpy(t->buf + t->len, p, len);
    t->len += len;
    t->n_tokens++;
    return PD_OK;
}

pd_status vocab_text_finish(const vocab_text *t, char **out, size_t *out_len, pd_err *err)
{
    if (!t || !out)
        return pd_err_set(err, PD_ERR_ARG, "vocab: NULL text or output");
    if (t->len > (SIZE_MAX - 1) / 3)
        return pd_err_set(err, PD_ERR_NOMEM, "vocab: text of %zu bytes too large", t->len);
    char *s = malloc(t->len * 3 + 1);
    if (!s)
        return pd_err_set(err, PD_ERR_NOMEM, "vocab: no memory for %zu text bytes", t->len * 3);
    size_t n = vocab_utf8_repair(t->buf ? t->buf : "", t->len, s);
    s[n] = '\0';
    char *shrunk = realloc(s, n + 1);
    *out = shrunk ? shrunk : s;
    if (out_len)
        *out_len = n;
    return PD_OK;
}

void vocab_text_free(vocab_text *t)
{
    if (!t)
        return;
    free(t->buf);
    *t = (vocab_text){0};
}

pd_status vocab_detok(const vocab *v, const int32_t *tokens, size_t n, char **out,
                      size_t *out_len, pd_err *err)
{
    if (!v || !out || (!tokens && n))
        return pd_err_set(err, PD_ERR_ARG, "vocab: NULL argument");
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || (uint32_t)tokens[i] >= v->n)
            return pd_err_set(err, PD_ERR_RANGE,
                              "vocab: tokens[%zu]: id %d outside the vocabulary [0, %u)", i,
                              tokens[i], v->n);
    vocab_text t = {0};
    pd_status st = PD_OK;
    for (size_t i = 0; i < n && st == PD_OK; i++)
        st = vocab_detok_append(v, &t, tokens[i], err);
    if (st == PD_OK)
        st = vocab_text_finish(&t, out, out_len, err);
    vocab_text_free(&t);
    return st;
}

void vocab_check(const vocab *v)
{
    CHECK(v && v->n >= 1 && v->off && v->pieces && v->types);
    CHECK(v->kind < VOCAB_KIND_COUNT);
    CHECK(v->off[0] == 0);
    CHECK(v->bos >= -1 && v->bos < (int64_t)v->n);
    CHECK(v->eos >= -1 && v->eos < (int64_t)v->n);
    size_t mx = 0;
    for (uint32_t i = 0; i < v->n; i++) {
        CHECK(v->off[i] <= v->off[i + 1]);
        CHECK(v->types[i] < VOCAB_TT_COUNT);
        size_t k = v->off[i + 1] - v->off[i];
        if (k > mx)
            mx = k;
        if ((v->types[i] == VOCAB_TT_CONTROL && !v->special) || v->types[i] == VOCAB_TT_UNUSED)
            CHECK(k == 0);
    }
    CHECK(mx == v->max_piece);
    if (v->bos >= 0)
        CHECK(v->types[v->bos] == VOCAB_TT_CONTROL);
    if (v->eos >= 0)
        CHECK(v->types[v->eos] == VOCAB_TT_CONTROL);
}
