/* pages: loads and validates a JSON Lines page manifest (format in pages.h).
 * Owns the parsed pages (ids, token segments, resolved embedding paths) in one
 * bump arena, an id hash for uniqueness and lookup, and nothing else: the
 * embedding rows stay in their .npy files until pages_embed_read. The
 * manifest's bytes are split into lines and checked around each JSON object
 * through comm/rd.h's bounds-checked reader; cJSON parses each line within
 * its length. */
#include "cluster/format/pages.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/file.h"
#include "base/fnv.h"
#include "base/utf8.h"
#include "comm/rd.h"

/* ---- arena: every string and array of a pages object ------------------- */

typedef struct pages_blk {
    struct pages_blk *next;
    size_t used, cap;
    _Alignas(8) unsigned char data[];
} pages_blk;

/* INV: n <= cap; pg[i].line strictly increasing; every page reachable through
 *      slots (open addressing on the id hash, value = page index + 1), with
 *      n_slots a power of two and 2 * n <= n_slots. */
struct pages {
    uint32_t vocab_size;
    uint32_t hidden;
    char *manifest; /* path as given, for messages */
    pages_page *pg;
    size_t n, cap;
    size_t *slots;
    size_t n_slots;
    pages_blk *blk;
};

static void *pages_alloc(pages *p, size_t size)
{
    size = (size + 7) & ~(size_t)7;
    if (!p->blk || p->blk->cap - p->blk->used < size) {
        size_t cap = size > (64u << 10) ? size : (64u << 10);
        pages_blk *b = malloc(sizeof *b + cap);
        if (!b)
            return NULL;
        b->next = p->blk;
        b->used = 0;
        b->cap = cap;
        p->blk = b;
    }
    void *r = p->blk->data + p->blk->used;
    p->blk->used += size;
    return r;
}

static char *pages_strdup(pages *p, const char *s)
{
    size_t n = strlen(s) + 1;
    char *d = pages_alloc(p, n);
    if (d)
        memcpy(d, s, n);
    return d;
}

/* ---- ids ------------------------------------------------------------------ */

static long pages_lookup(const pages *p, const char *id)
{
    if (!p->n_slots)
        return -1;
    size_t mask = p->n_slots - 1;
    for (size_t i = (size_t)pd_fnv_str(id) & mask;; i = (i + 1) & mask) {
        if (!p->slots[i])
            return -1;
        if (!strcmp(p->pg[p->slots[i] - 1].id, id))
            return (long)(p->slots[i] - 1);
    }
}

/* Inserts page index k (its id must be absent). */
static int pages_index(pages *p, size_t k)
{
    if (2 * (p->n + 1) > p->n_slots) {
        size_t ns = p->n_slots ? p->n_slots * 2 : 64;
        size_t *s = calloc(ns, sizeof *s);
        if (!s)
            return -1;
        for (size_t i = 0; i < p->n_slots; i++) {
            if (!p->slots[i])
                continue;
            size_t j = (size_t)pd_fnv_str(p->pg[p->slots[i] - 1].id) & (ns - 1);
            while (s[j])
                j = (j + 1) & (ns - 1);
            s[j] = p->slots[i];
        }
        free(p->slots);
        p->slots = s;
        p->n_slots = ns;
    }
    size_t j = (size_t)pd_fnv_str(p->pg[k].id) & (p->n_slots - 1);
    while (p->slots[j])
        j = (j + 1) & (p->n_slots - 1);
    p->slots[j] = k + 1;
    return 0;
}

/* ---- one manifest line ---------------------------------------------------- */

/* Where a message is about: manifest, line, and the page id once known. */
typedef struct pages_where {
    const char *manifest;
    uint32_t line;
    char id[96]; /* display form of the id (escaped, shortened); "" = unknown */
    pd_err *err;
} pages_where;

static pd_status pages_fail(const pages_where *w, pd_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static pd_status pages_fail(const pages_where *w, pd_status st, const char *fmt, ...)
{
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (w->id[0])
        return pd_err_set(w->err, st, "%s:%" PRIu32 ": page \"%s\": %s", w->manifest, w->line,
                          w->id, msg);
    return pd_err_set(w->err, st, "%s:%" PRIu32 ": %s", w->manifest, w->line, msg);
}

/* Adds the line/page/field context in front of a message a callee set. */
static void pages_context(const pages_where *w, const char *field_fmt, size_t seg)
{
    char field[64];
    snprintf(field, sizeof field, field_fmt, seg);
    if (w->id[0])
        pd_err_prefix(w->err, "%s:%" PRIu32 ": page \"%s\": %s", w->manifest, w->line, w->id,
                      field);
    else
        pd_err_prefix(w->err, "%s:%" PRIu32 ": %s", w->manifest, w->line, field);
}

/* The id as shown in messages: quotes, backslashes and control bytes escaped,
 * at most ~64 bytes then "...". */
static void pages_show_id(char *out, size_t cap, const char *id)
{
    size_t k = 0;
    for (const unsigned char *s = (const unsigned char *)id; *s; s++) {
        if (k + 8 >= cap || k >= 64) {
            memcpy(out + k, "...", 4);
            return;
        }
        if (*s == '"' || *s == '\\') {
            out[k++] = '\\';
            out[k++] = (char)*s;
        } else if (*s < 0x20 || *s == 0x7f) {
            k += (size_t)snprintf(out + k, cap - k, "\\x%02x", *s);
        } else {
            out[k++] = (char)*s;
        }
    }
    out[k] = '\0';
}

static const char *pages_num_show(double v, char *buf, size_t cap)
{
    if (isfinite(v) && v == floor(v) && fabs(v) < 1e18)
        snprintf(buf, cap, "%.0f", v);
    else
        snprintf(buf, cap, "%.17g", v);
    return buf;
}

static bool pages_is_ws(int c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

/* Consumes the white space at r (the manifest's white space: CRLF's '\r' too). */
static void pages_skip_ws(rd *r)
{
    while (pages_is_ws(rd_peek(r)))
        (void)rd_skip(r, "white space", 1);
}

/* ---- NUL characters ------------------------------------------------------ */

/* cJSON decodes a string's \u0000 escape (or a raw 0x00 byte) into a NUL and
 * keeps only a C string, so everything after it is silently cut: "a\u0000x"
 * would become the id "a" and collide with a page "a", a key
 * "max_new_tokens\u0000x" would count as max_new_tokens, a path would name
 * another file. No field of a page may hold one, so the line's raw text is
 * scanned for them before its values are used, and the first is refused
 * with the field it sits in. The line already parsed as JSON; the scan reads
 * it through comm/rd.h all the same and gives up quietly on anything
 * unexpected (cJSON's verdict stands then). */

#define PAGES_PATH_DEPTH 8 /* containers whose key / index the field path names */

/* One open container on the way to the current value. */
typedef struct pages_frame {
    bool object;
    bool key_next;      /* object: the next string is a key */
    uint64_t index;     /* array: the current element */
    const uint8_t *key; /* object: the current key's raw text (escapes as written) */
    size_t key_len;
} pages_frame;

/* Appends raw JSON text to a message: control bytes as \xNN, at most ~40 bytes. */
static void pages_show_raw(char *out, size_t cap, const uint8_t *t, size_t n)
{
    size_t k = strlen(out);
    for (size_t i = 0; i < n && k + 8 < cap; i++) {
        if (i == 40) {
            k += (size_t)snprintf(out + k, cap - k, "...");
            break;
        }
        if (t[i] < 0x20 || t[i] == 0x7f)
            k += (size_t)snprintf(out + k, cap - k, "\\x%02x", t[i]);
        else
            out[k++] = (char)t[i];
    }
    out[k] = '\0';
}

/* The field path of the current value ("id", "prefill[1].embeddings") from
 * frames [1, depth) (frame 0 is the page object; its key starts the path). */
static void pages_field_path(char *out, size_t cap, const pages_frame *fr, size_t depth,
                             bool with_last_key)
{
    out[0] = '\0';
    size_t shown = depth < PAGES_PATH_DEPTH ? depth : PAGES_PATH_DEPTH;
    for (size_t i = 0; i < shown; i++) {
        size_t k = strlen(out);
        if (!fr[i].object)
            snprintf(out + k, cap - k, "[%" PRIu64 "]", fr[i].index);
        else if (fr[i].key && (with_last_key || i + 1 < depth)) {
            if (i)
                snprintf(out + k, cap - k, ".");
            pages_show_raw(out, cap, fr[i].key, fr[i].key_len);
        }
    }
    if (depth > PAGES_PATH_DEPTH) {
        size_t k = strlen(out);
        snprintf(out + k, cap - k, "...");
    }
}

/* Reads the string whose opening quote r is at; *nul_col is the 1-based
 * column of its first NUL (escape or raw byte), 0 when none. Returns false
 * when the text is not as expected. */
static bool pages_scan_string(rd *r, const uint8_t **text, size_t *len, size_t *nul_col)
{
    uint8_t c = 0;
    if (rd_u8(r, "quote", &c) != PD_OK)
        return false;
    size_t start = rd_offset(r);
    *text = r->p + r->off;
    *nul_col = 0;
    for (;;) {
        size_t at = rd_offset(r);
        if (rd_u8(r, "string", &c) != PD_OK)
            return false;
        if (c == '"') {
            *len = at - start;
            return true;
        }
        if (c == 0 && !*nul_col)
            *nul_col = at + 1;
        if (c != '\\')
            continue;
        if (rd_u8(r, "escape", &c) != PD_OK)
            return false;
        if (c != 'u')
            continue;
        const uint8_t *hex = NULL;
        if (rd_span(r, "escape", 4, &hex) != PD_OK)
            return false;
        if (!memcmp(hex, "0000", 4) && !*nul_col)
            *nul_col = at + 1;
    }
}

/* Scans a line that parsed as one JSON object; on the first NUL in a string
 * fails naming the field (PD_ERR_FORMAT), else PD_OK. */
static pd_status pages_refuse_nul(const pages_where *w, const char *text, size_t len)
{
    pages_frame fr[PAGES_PATH_DEPTH];
    size_t depth = 0;
    rd r;
    rd_init(&r, text, len, 0, w->manifest, NULL);
    for (int c; (c = rd_peek(&r)) >= 0;) {
        pages_frame *top = depth && depth <= PAGES_PATH_DEPTH ? &fr[depth - 1] : NULL;
        if (c == '"') {
            const uint8_t *str = NULL;
            size_t n = 0, col = 0;
            bool is_key = top && top->object && top->key_next;
            if (!pages_scan_string(&r, &str, &n, &col))
                return PD_OK;
            if (is_key) {
                top->key = str;
                top->key_len = n;
                top->key_next = false;
            }
            if (!col)
                continue;
            char field[160];
            pages_field_path(field, sizeof field, fr, depth, !is_key);
            if (is_key) {
                size_t k = strlen(field);
                snprintf(field + k, sizeof field - k, "%skey \"", k ? ": " : "");
                pages_show_raw(field, sizeof field, str, n);
                k = strlen(field);
                snprintf(field + k, sizeof field - k, "\"");
            }
            return pages_fail(w, PD_ERR_FORMAT, "%s: contains a NUL character (\\u0000) at column %zu",
                              field, col);
        }
        (void)rd_skip(&r, "JSON", 1);
        if (c == '{' || c == '[') {
            if (depth < PAGES_PATH_DEPTH)
                fr[depth] = (pages_frame){.object = c == '{', .key_next = c == '{'};
            depth++;
        } else if ((c == '}' || c == ']') && depth) {
            depth--;
        } else if (c == ',' && top) {
            if (top->object)
                top->key_next = true;
            else
                top->index++;
        }
    }
    return PD_OK;
}

/* One line being parsed: where messages point, where its page goes (p NULL:
 * the line is only checked), and what its values are checked against. */
typedef struct pages_line {
    pages *p;
    pages_where *w;
    uint32_t vocab_size;
    const pages_opts *opts; /* may be NULL */
} pages_line;

/* Sorts the members of object obj into field[] by key (keys[0..n)): the
 * first unknown key or key given twice fails, named; ctx ("" or
 * "prefill[N]: ") starts the message and has ("a page has ...") ends it.
 * field[] starts all NULL; *given counts the keys given. */
static pd_status pages_keys(const pages_where *w, const cJSON *obj, const char *const *keys, int n, const char *ctx,
                            const char *has, const cJSON **field, int *given)
{
    *given = 0;
    for (const cJSON *c = obj->child; c; c = c->next) {
        int k = -1;
        for (int j = 0; j < n; j++)
            if (c->string && !strcmp(c->string, keys[j]))
                k = j;
        char shown[96];
        pages_show_id(shown, sizeof shown, c->string ? c->string : "");
        if (k < 0)
            return pages_fail(w, PD_ERR_FORMAT, "%sunknown key \"%s\" (%s)", ctx, shown, has);
        if (field[k])
            return pages_fail(w, PD_ERR_FORMAT, "%skey \"%s\" given twice", ctx, shown);
        field[k] = c;
        ++*given;
    }
    return PD_OK;
}

/* ---- segments: one parser per kind of the table below --------------------- */

/* Parses value v of segment s (its only key) into *sg (NULL: checked only)
 * and adds its rows to *rows. */
typedef pd_status (*pages_seg_parse)(const pages_line *ln, const cJSON *v, int s, pages_seg_kind kind,
                                     pages_seg *sg, uint64_t *rows);

/* "text": tokenized with the model's tokenizer, or kept as text without one. */
static pd_status pages_seg_text(const pages_line *ln, const cJSON *v, int s, pages_seg_kind kind, pages_seg *sg,
                                uint64_t *rows)
{
    (void)kind;
    const pages_where *w = ln->w;
    if (!cJSON_IsString(v) || !v->valuestring || !v->valuestring[0])
        return pages_fail(w, PD_ERR_FORMAT, "prefill[%d].text: must be a non-empty string", s);
    size_t tl = strlen(v->valuestring), bad = 0;
    if (!pd_utf8_valid(v->valuestring, tl, &bad))
        return pages_fail(w, PD_ERR_FORMAT, "prefill[%d].text: byte offset %zu: not valid UTF-8", s, bad);
    if (!ln->opts || !ln->opts->tokenize) {
        /* no tokenizer at hand (a tool without the model): kept as text */
        if (sg) {
            *sg = (pages_seg){.kind = PAGES_SEG_TEXT, .text = pages_strdup(ln->p, v->valuestring)};
            if (!sg->text)
                return pages_fail(w, PD_ERR_NOMEM, "no memory");
        }
        return PD_OK;
    }
    int32_t *tids = NULL;
    size_t nt = 0;
    pd_err te = {0};
    if (ln->opts->tokenize(ln->opts->tokenize_ctx, v->valuestring, tl, &tids, &nt, &te) != PD_OK)
        return pages_fail(w, te.status ? te.status : PD_ERR_FORMAT, "prefill[%d].text: %s", s, te.msg);
    pd_status st = PD_OK;
    if (nt == 0 || nt > PAGES_MAX_PREFILL_ROWS)
        st = pages_fail(w, nt ? PD_ERR_RANGE : PD_ERR_FORMAT, "prefill[%d].text: tokenizes to %zu tokens (need 1..%u)",
                        s, nt, PAGES_MAX_PREFILL_ROWS);
    for (size_t t = 0; st == PD_OK && t < nt; t++)
        if (tids[t] < 0 || (uint32_t)tids[t] >= ln->vocab_size)
            st = pages_fail(w, PD_ERR_RANGE,
                            "prefill[%d].text: token %zu is id %d, outside the vocabulary [0, %" PRIu32 ")", s, t,
                            tids[t], ln->vocab_size);
    int32_t *ids = st == PD_OK && ln->p ? pages_alloc(ln->p, nt * sizeof *ids) : NULL;
    if (st == PD_OK && ln->p && !ids)
        st = pages_fail(w, PD_ERR_NOMEM, "no memory");
    if (st == PD_OK && ids)
        memcpy(ids, tids, nt * sizeof *ids);
    free(tids);
    if (st)
        return st;
    *rows += (uint64_t)nt;
    if (sg)
        *sg = (pages_seg){.kind = PAGES_SEG_TOKENS, .rows = (uint32_t)nt, .tokens = ids};
    return PD_OK;
}

/* "tokens": an array of ids within the vocabulary. */
static pd_status pages_seg_tokens(const pages_line *ln, const cJSON *v, int s, pages_seg_kind kind, pages_seg *sg,
                                  uint64_t *rows)
{
    (void)kind;
    const pages_where *w = ln->w;
    int nt = cJSON_IsArray(v) ? cJSON_GetArraySize(v) : 0;
    if (nt <= 0)
        return pages_fail(w, PD_ERR_FORMAT, "prefill[%d].tokens: must be a non-empty array of token ids", s);
    int32_t *ids = ln->p ? pages_alloc(ln->p, (size_t)nt * sizeof *ids) : NULL;
    if (ln->p && !ids)
        return pages_fail(w, PD_ERR_NOMEM, "no memory");
    int t = 0;
    for (const cJSON *c = v->child; c; c = c->next, t++) {
        char num[40];
        if (!cJSON_IsNumber(c) || !isfinite(c->valuedouble) || c->valuedouble != floor(c->valuedouble))
            return pages_fail(w, PD_ERR_FORMAT, "prefill[%d].tokens[%d]: must be an integer", s, t);
        if (c->valuedouble < 0 || c->valuedouble >= (double)ln->vocab_size)
            return pages_fail(w, PD_ERR_RANGE,
                              "prefill[%d].tokens[%d]: token id %s is outside the vocabulary [0, %" PRIu32 ")", s, t,
                              pages_num_show(c->valuedouble, num, sizeof num), ln->vocab_size);
        if (ids)
            ids[t] = (int32_t)c->valuedouble;
    }
    *rows += (uint64_t)nt;
    if (sg)
        *sg = (pages_seg){.kind = PAGES_SEG_TOKENS, .rows = (uint32_t)nt, .tokens = ids};
    return PD_OK;
}

/* "embeddings" / "image": a file path, resolved and checked with the files. */
static pd_status pages_seg_file(const pages_line *ln, const cJSON *v, int s, pages_seg_kind kind, pages_seg *sg,
                                uint64_t *rows)
{
    (void)rows; /* an embeddings file's rows are added by the file checks */
    if (!cJSON_IsString(v) || !v->valuestring || !v->valuestring[0])
        return pages_fail(ln->w, PD_ERR_FORMAT, "prefill[%d].%s: must be a non-empty file path (string)", s,
                          kind == PAGES_SEG_EMBEDDINGS ? "embeddings" : "image");
    if (sg) {
        *sg = (pages_seg){.kind = kind, .file = pages_strdup(ln->p, v->valuestring)};
        if (!sg->file)
            return pages_fail(ln->w, PD_ERR_NOMEM, "no memory");
    }
    return PD_OK;
}

/* A segment is an object with exactly one of these keys. */
enum { PAGES_SK_TOKENS, PAGES_SK_TEXT, PAGES_SK_EMBEDDINGS, PAGES_SK_IMAGE, PAGES_SK_COUNT };
static const char *const pages_seg_keys[PAGES_SK_COUNT] = {"tokens", "text", "embeddings", "image"};
static const struct {
    pages_seg_kind kind;
    pages_seg_parse parse;
} pages_seg_table[PAGES_SK_COUNT] = {
    [PAGES_SK_TOKENS] = {PAGES_SEG_TOKENS, pages_seg_tokens},
    [PAGES_SK_TEXT] = {PAGES_SEG_TOKENS, pages_seg_text}, /* or PAGES_SEG_TEXT: pages_seg_text decides */
    [PAGES_SK_EMBEDDINGS] = {PAGES_SEG_EMBEDDINGS, pages_seg_file},
    [PAGES_SK_IMAGE] = {PAGES_SEG_IMAGE, pages_seg_file},
};

/* Segment s of the prefill: its one key, then its kind's parser; *rows stays
 * within PAGES_MAX_PREFILL_ROWS. */
static pd_status pages_parse_seg(const pages_line *ln, const cJSON *v, int s, pages_seg *sg, uint64_t *rows)
{
    const pages_where *w = ln->w;
    if (!cJSON_IsObject(v))
        return pages_fail(w, PD_ERR_FORMAT, "prefill[%d]: a segment must be an object", s);
    const cJSON *field[PAGES_SK_COUNT] = {NULL};
    char ctx[32];
    snprintf(ctx, sizeof ctx, "prefill[%d]: ", s);
    int given = 0;
    pd_status st = pages_keys(w, v, pages_seg_keys, PAGES_SK_COUNT, ctx,
                              "a segment has tokens, text, embeddings or image", field, &given);
    if (st)
        return st;
    if (given > 1)
        return pages_fail(w, PD_ERR_FORMAT,
                          "prefill[%d]: has more than one of \"tokens\", \"text\", \"embeddings\" and \"image\"; a "
                          "segment is one of them", s);
    if (given == 0)
        return pages_fail(w, PD_ERR_FORMAT,
                          "prefill[%d]: empty segment (expected \"tokens\", \"text\", \"embeddings\" or \"image\")", s);
    for (int k = 0; k < PAGES_SK_COUNT; k++)
        if (field[k] && (st = pages_seg_table[k].parse(ln, field[k], s, pages_seg_table[k].kind, sg, rows)))
            return st;
    if (*rows > PAGES_MAX_PREFILL_ROWS)
        return pages_fail(w, PD_ERR_RANGE, "prefill[%d]: the prefill exceeds %u rows", s, PAGES_MAX_PREFILL_ROWS);
    return PD_OK;
}

/* ---- the page ---------------------------------------------------------------- */

/* The line's text around its object: cJSON read the object within the
 * line's length (ending at end); what follows it on the line may only be
 * white space; the object holds no NUL in any string. */
static pd_status pages_check_object(const pages_where *w, const cJSON *root, const char *text, size_t len,
                                    const char *end)
{
    rd lr;
    rd_init(&lr, text, len, 0, w->manifest, NULL);
    if (!end || end < text || rd_skip(&lr, "JSON object", (size_t)(end - text)) != PD_OK)
        return pages_fail(w, PD_ERR_FORMAT, "not valid JSON (column 1)");
    pages_skip_ws(&lr);
    if (rd_remaining(&lr))
        return pages_fail(w, PD_ERR_FORMAT, "unexpected text after the JSON object (column %zu); one page a line",
                          rd_offset(&lr) + 1);
    if (!cJSON_IsObject(root))
        return pages_fail(w, PD_ERR_FORMAT, "a page must be a JSON object");
    return pages_refuse_nul(w, text, len);
}

/* The page's id, looked for first so that every later message names the
 * page; sets w->id. */
static pd_status pages_parse_id(pages_where *w, const cJSON *root, const cJSON **out)
{
    const cJSON *id = NULL;
    for (const cJSON *c = root->child; c && !id; c = c->next)
        if (c->string && !strcmp(c->string, "id"))
            id = c;
    if (!id)
        return pages_fail(w, PD_ERR_FORMAT, "missing key \"id\"");
    if (!cJSON_IsString(id) || !id->valuestring || !id->valuestring[0])
        return pages_fail(w, PD_ERR_FORMAT, "id: must be a non-empty string");
    size_t id_len = strlen(id->valuestring);
    if (id_len > PAGES_MAX_ID_BYTES)
        return pages_fail(w, PD_ERR_FORMAT, "id: %zu bytes exceeds the limit of %u", id_len, PAGES_MAX_ID_BYTES);
    if (!pd_utf8_valid(id->valuestring, id_len, NULL))
        return pages_fail(w, PD_ERR_FORMAT, "id: not valid UTF-8");
    pages_show_id(w->id, sizeof w->id, id->valuestring);
    *out = id;
    return PD_OK;
}

enum { PAGES_KEY_ID, PAGES_KEY_PREFILL, PAGES_KEY_MAX_NEW, PAGES_KEY_COUNT };
static const char *const pages_page_keys[PAGES_KEY_COUNT] = {"id", "prefill", "max_new_tokens"};

/* The page object: id, keys, prefill segments, max_new_tokens; into *out
 * when ln->p is set. */
static pd_status pages_parse_page(const pages_line *ln, const cJSON *root, pages_page *out)
{
    pages_where *w = ln->w;
    const cJSON *id = NULL, *field[PAGES_KEY_COUNT] = {NULL};
    int given = 0;
    pd_status st = pages_parse_id(w, root, &id);
    if (st == PD_OK)
        st = pages_keys(w, root, pages_page_keys, PAGES_KEY_COUNT, "", "a page has id, prefill, max_new_tokens",
                        field, &given);
    for (int k = 0; st == PD_OK && k < PAGES_KEY_COUNT; k++)
        if (!field[k])
            st = pages_fail(w, PD_ERR_FORMAT, "missing key \"%s\"", pages_page_keys[k]);
    if (st)
        return st;
    const cJSON *prefill = field[PAGES_KEY_PREFILL];
    int n_segs = cJSON_IsArray(prefill) ? cJSON_GetArraySize(prefill) : 0;
    if (n_segs <= 0)
        return pages_fail(w, PD_ERR_FORMAT, "prefill: must be a non-empty array of segments");
    pages_seg *segs = NULL;
    if (ln->p) {
        segs = pages_alloc(ln->p, (size_t)n_segs * sizeof *segs);
        out->id = pages_strdup(ln->p, id->valuestring);
        if (!segs || !out->id)
            return pages_fail(w, PD_ERR_NOMEM, "no memory");
    }
    uint64_t rows = 0;
    int s = 0;
    for (const cJSON *sg = prefill->child; sg; sg = sg->next, s++)
        if ((st = pages_parse_seg(ln, sg, s, segs ? &segs[s] : NULL, &rows)))
            return st;
    const cJSON *mnt = field[PAGES_KEY_MAX_NEW];
    if (!cJSON_IsNumber(mnt) || !isfinite(mnt->valuedouble) || mnt->valuedouble != floor(mnt->valuedouble) ||
        mnt->valuedouble < 0 || mnt->valuedouble > (double)PAGES_MAX_NEW_TOKENS)
        return pages_fail(w, cJSON_IsNumber(mnt) ? PD_ERR_RANGE : PD_ERR_FORMAT,
                          "max_new_tokens: must be an integer in [0, %u]", PAGES_MAX_NEW_TOKENS);
    if (out) {
        out->line = w->line;
        out->max_new_tokens = (uint32_t)mnt->valuedouble;
        out->prefill_rows = rows; /* embeddings rows are added by the file checks */
        out->n_segs = (uint32_t)n_segs;
        out->segs = segs;
    }
    return PD_OK;
}

/* Validates one line; when p is set, also stores it as page p->n (not yet
 * counted: the caller commits it after the file checks). */
static pd_status pages_parse_line(pages *p, pages_where *w, const char *text, size_t len,
                                  uint32_t vocab_size, const pages_opts *opts, pages_page *out)
{
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
    if (!root) {
        size_t col = end && end >= text && end <= text + len ? (size_t)(end - text) + 1 : 1;
        return pages_fail(w, PD_ERR_FORMAT, "not valid JSON (column %zu)", col);
    }
    pages_line ln = {.p = p, .w = w, .vocab_size = vocab_size, .opts = opts};
    pd_status st = pages_check_object(w, root, text, len, end);
    if (st == PD_OK)
        st = pages_parse_page(&ln, root, out);
    cJSON_Delete(root);
    return st;
}

pd_status pages_line_check(const char *text, size_t len, uint32_t vocab_size, pd_err *err)
{
    if (!text && len)
        return pd_err_set(err, PD_ERR_ARG, "pages: NULL line");
    pages_where w = {.manifest = "line", .line = 1, .err = err};
    return pages_parse_line(NULL, &w, text ? text : "", len, vocab_size, NULL, NULL);
}

/* ---- files ---------------------------------------------------------------- */

/* Floats scanned per chunk when checking that embedding values are finite. */
#define PAGES_SCAN_FLOATS (1u << 18)

static pd_status pages_finite(const pages_where *w, size_t s, const pages_seg *sg, uint32_t hidden,
                              const float *v, uint32_t row0, uint32_t n)
{
    for (size_t i = 0; i < (size_t)n * hidden; i++)
        if (!isfinite(v[i]))
            return pages_fail(w, PD_ERR_FORMAT,
                              "prefill[%zu].embeddings: %s: row %zu column %zu is not finite (%g)",
                              s, sg->file, row0 + i / hidden, i % hidden, (double)v[i]);
    return PD_OK;
}

/* Sets sg->path: sg->file resolved against the manifest's directory.
 * dir_len: length of the manifest's directory prefix in manifest (the text
 * before its last '/'), or SIZE_MAX when the manifest path has no '/'. */
static pd_status pages_resolve(pages *p, const pages_where *w, size_t dir_len, pages_seg *sg)
{
    char *path;
    if (sg->file[0] == '/' || dir_len == SIZE_MAX) {
        path = pages_strdup(p, sg->file);
    } else {
        size_t fl = strlen(sg->file);
        path = pages_alloc(p, dir_len + 1 + fl + 1);
        if (path) {
            memcpy(path, p->manifest, dir_len);
            path[dir_len] = '/';
            memcpy(path + dir_len + 1, sg->file, fl + 1);
        }
    }
    if (!path)
        return pages_fail(w, PD_ERR_NOMEM, "no memory");
    sg->path = path;
    return PD_OK;
}

/* Counts image segment s's rows with opts->image_rows; a refusal stays with
 * the segment (rows 1, error) for the page to fail with when decoded. */
static pd_status pages_count_image(pages *p, const pages_where *w, pages_seg *sg, size_t s,
                                   const pages_opts *opts)
{
    uint32_t rows = 0;
    pd_err e = {0};
    pd_status st = opts->image_rows(opts->image_ctx, sg->path, &rows, &e);
    if (st == PD_ERR_NOMEM)
        return pages_fail(w, st, "prefill[%zu].image: %s", s, e.msg);
    if (st == PD_OK && (rows == 0 || rows > PAGES_MAX_PREFILL_ROWS)) {
        st = PD_ERR_RANGE;
        pd_err_set(&e, st, "%s: the vision encoder makes %" PRIu32 " rows of it (need 1..%u)",
                   sg->file, rows, PAGES_MAX_PREFILL_ROWS);
    }
    if (st == PD_OK) {
        sg->rows = rows;
        return PD_OK;
    }
    char msg[sizeof e.msg + 64];
    snprintf(msg, sizeof msg, "prefill[%zu].image: %s", s, e.msg);
    sg->error = pages_strdup(p, msg);
    if (!sg->error)
        return pages_fail(w, PD_ERR_NOMEM, "no memory");
    sg->rows = 1;
    return PD_OK;
}

/* Resolves, probes and (unless header_only) scans embeddings segment s.
 * dir_len: length of the manifest's directory prefix in manifest (the text
 * before its last '/'), or SIZE_MAX when the manifest path has no '/'. */
static pd_status pages_check_embeddings(pages *p, const pages_where *w, size_t dir_len,
                                        pages_seg *sg, size_t s, bool header_only, float **scan,
                                        size_t *scan_cap)
{
    pd_status st = pages_resolve(p, w, dir_len, sg);
    if (st != PD_OK)
        return st;
    const char *path = sg->path;
    st = npy_probe(path, &sg->npy, w->err);
    if (st != PD_OK) {
        pages_context(w, "prefill[%zu].embeddings", s);
        return st;
    }
    if (p->hidden && sg->npy.cols != p->hidden)
        return pages_fail(w, PD_ERR_MISMATCH,
                          "prefill[%zu].embeddings: %s: shape [%" PRIu64 ", %" PRIu64
                          "] does not match hidden size %" PRIu32, s, sg->file, sg->npy.rows,
                          sg->npy.cols, p->hidden);
    if (sg->npy.rows == 0)
        return pages_fail(w, PD_ERR_FORMAT,
                          "prefill[%zu].embeddings: %s: shape [0, %" PRIu64 "] has no rows", s,
                          sg->file, sg->npy.cols);
    if (sg->npy.rows > PAGES_MAX_PREFILL_ROWS)
        return pages_fail(w, PD_ERR_RANGE,
                          "prefill[%zu].embeddings: %s: %" PRIu64 " rows exceed the limit of %u",
                          s, sg->file, sg->npy.rows, PAGES_MAX_PREFILL_ROWS);
    sg->rows = (uint32_t)sg->npy.rows;
    if (header_only)
        return PD_OK;
    size_t want = p->hidden > PAGES_SCAN_FLOATS ? p->hidden : PAGES_SCAN_FLOATS;
    if (*scan_cap < want) {
        float *b = realloc(*scan, want * sizeof *b);
        if (!b)
            return pages_fail(w, PD_ERR_NOMEM, "no memory for the embedding scan");
        *scan = b;
        *scan_cap = want;
    }
    uint32_t per = (uint32_t)(*scan_cap / p->hidden);
    for (uint32_t r = 0; r < sg->rows; r += per) {
        uint32_t n = sg->rows - r < per ? sg->rows - r : per;
        st = npy_read_rows(path, &sg->npy, r, n, *scan, w->err);
        if (st != PD_OK) {
            pages_context(w, "prefill[%zu].embeddings", s);
            return st;
        }
        if ((st = pages_finite(w, s, sg, p->hidden, *scan, r, n)) != PD_OK)
            return st;
    }
    return PD_OK;
}

pd_status pages_load(const char *path, uint32_t vocab_size, uint32_t hidden,
                     const pages_opts *opts, pages **out, pd_err *err)
{
    if (!path || !out)
        return pd_err_set(err, PD_ERR_ARG, "pages: NULL path or output");
    if (!vocab_size || vocab_size > (uint32_t)INT32_MAX)
        return pd_err_set(err, PD_ERR_ARG, "pages: %s: vocab size %" PRIu32 " / hidden size %" PRIu32
                          " invalid", path, vocab_size, hidden);
    bool header_only = (opts && opts->header_only) || !hidden; /* no model: nothing to scan for */
    char *text = NULL;
    size_t len = 0;
    pd_status st = pd_file_read_all(path, NULL, (uint8_t **)&text, &len, err); /* NUL-terminated */
    if (st != PD_OK)
        return st;
    pages *p = calloc(1, sizeof *p);
    if (!p || !(p->manifest = strdup(path))) {
        free(p);
        free(text);
        return pd_err_set(err, PD_ERR_NOMEM, "pages: no memory");
    }
    p->vocab_size = vocab_size;
    p->hidden = hidden;
    const char *slash = strrchr(path, '/');
    size_t dir_len = slash ? (size_t)(slash - path) : SIZE_MAX;

    float *scan = NULL;
    size_t scan_cap = 0;
    uint32_t line = 0;
    /* The manifest's bytes are split into lines by comm/rd.h's reader; each
     * line goes to the JSON parser with its length. */
    rd r;
    rd_init(&r, text, len, 0, path, err);
    while (st == PD_OK && rd_remaining(&r)) {
        const uint8_t *lb = NULL;
        size_t ll = 0;
        bool nl = false;
        if ((st = rd_until(&r, '\n', &lb, &ll, &nl)) != PD_OK)
            break;
        const char *ln = (const char *)lb;
        if (line == UINT32_MAX) {
            st = pd_err_set(err, PD_ERR_RANGE, "%s: more than %u lines", path, UINT32_MAX);
            break;
        }
        line++;
        rd blank;
        rd_init(&blank, ln, ll, 0, path, NULL);
        pages_skip_ws(&blank);
        if (!rd_remaining(&blank))
            continue;
        if (p->n == p->cap) {
            size_t nc = p->cap ? p->cap * 2 : 64;
            pages_page *g = realloc(p->pg, nc * sizeof *g);
            if (!g) {
                st = pd_err_set(err, PD_ERR_NOMEM, "pages: no memory");
                break;
            }
            p->pg = g;
            p->cap = nc;
        }
        pages_where w = {.manifest = path, .line = line, .err = err};
        pages_page *pg = &p->pg[p->n];
        *pg = (pages_page){0};
        if ((st = pages_parse_line(p, &w, ln, ll, vocab_size, opts, pg)) != PD_OK)
            break;
        long prev = pages_lookup(p, pg->id);
        if (prev >= 0) {
            st = pages_fail(&w, PD_ERR_FORMAT, "id: already used by the page on line %" PRIu32,
                            p->pg[prev].line);
            break;
        }
        pages_seg *segs = (pages_seg *)pg->segs;
        for (uint32_t s = 0; s < pg->n_segs && st == PD_OK; s++) {
            if (segs[s].kind == PAGES_SEG_IMAGE) {
                /* read by the vision encoder */
                if ((st = pages_resolve(p, &w, dir_len, &segs[s])) == PD_OK && opts && opts->image_rows)
                    st = pages_count_image(p, &w, &segs[s], s, opts);
                if (st == PD_OK) {
                    pg->prefill_rows += segs[s].rows;
                    if (pg->prefill_rows > PAGES_MAX_PREFILL_ROWS)
                        st = pages_fail(&w, PD_ERR_RANGE, "prefill[%" PRIu32 "]: the prefill exceeds "
                                        "%u rows", s, PAGES_MAX_PREFILL_ROWS);
                }
                continue;
            }
            if (segs[s].kind != PAGES_SEG_EMBEDDINGS)
                continue;
            st = pages_check_embeddings(p, &w, dir_len, &segs[s], s, header_only, &scan,
                                        &scan_cap);
            if (st == PD_OK) {
                pg->prefill_rows += segs[s].rows;
                if (pg->prefill_rows > PAGES_MAX_PREFILL_ROWS)
                    st = pages_fail(&w, PD_ERR_RANGE, "prefill[%" PRIu32 "]: the prefill exceeds "
                                    "%u rows", s, PAGES_MAX_PREFILL_ROWS);
            }
        }
        if (st != PD_OK)
            break;
        if (pages_index(p, p->n) != 0) {
            st = pd_err_set(err, PD_ERR_NOMEM, "pages: no memory");
            break;
        }
        p->n++;
    }
    free(scan);
    free(text);
    if (st != PD_OK) {
        pages_free(p);
        return st;
    }
    *out = p;
    return PD_OK;
}

void pages_free(pages *p)
{
    if (!p)
        return;
    for (pages_blk *b = p->blk, *nx; b; b = nx) {
        nx = b->next;
        free(b);
    }
    free(p->slots);
    free(p->pg);
    free(p->manifest);
    free(p);
}

size_t pages_count(const pages *p) { return p ? p->n : 0; }

const pages_page *pages_get(const pages *p, size_t i)
{
    CHECKF(p && i < p->n, "page %zu of %zu", i, p ? p->n : 0);
    return &p->pg[i];
}

long pages_find(const pages *p, const char *id)
{
    if (!p || !id)
        return -1;
    return pages_lookup(p, id);
}

pd_status pages_embed_read(const pages *p, size_t page, size_t seg, uint32_t row0, uint32_t n,
                           float *dst, pd_err *err)
{
    if (!p || page >= p->n || seg >= p->pg[page].n_segs)
        return pd_err_set(err, PD_ERR_ARG, "pages: no page %zu segment %zu", page, seg);
    const pages_page *pg = &p->pg[page];
    const pages_seg *sg = &pg->segs[seg];
    pages_where w = {.manifest = p->manifest, .line = pg->line, .err = err};
    pages_show_id(w.id, sizeof w.id, pg->id);
    if (sg->kind != PAGES_SEG_EMBEDDINGS)
        return pages_fail(&w, PD_ERR_ARG, "prefill[%zu]: not an embeddings segment", seg);
    if (row0 > sg->rows || n > sg->rows - row0)
        return pages_fail(&w, PD_ERR_RANGE,
                          "prefill[%zu].embeddings: rows [%" PRIu32 ", %" PRIu64 ") outside the %"
                          PRIu32 " rows", seg, row0, (uint64_t)row0 + n, sg->rows);
    if (!dst && n)
        return pages_fail(&w, PD_ERR_ARG, "prefill[%zu].embeddings: NULL destination", seg);
    if (!p->hidden)
        return pages_fail(&w, PD_ERR_ARG, "prefill[%zu].embeddings: loaded without a hidden size", seg);
    pd_status st = npy_read_rows(sg->path, &sg->npy, row0, n, dst, err);
    if (st != PD_OK) {
        pages_context(&w, "prefill[%zu].embeddings", seg);
        return st;
    }
    return pages_finite(&w, seg, sg, p->hidden, dst, row0, n);
}

void pages_check(const pages *p)
{
    CHECK(p);
    CHECK(p->n <= p->cap);
    CHECK(p->n_slots == 0 || (p->n_slots & (p->n_slots - 1)) == 0);
    CHECK(2 * p->n <= p->n_slots || p->n == 0);
    for (size_t i = 0; i < p->n; i++) {
        const pages_page *pg = &p->pg[i];
        CHECK(pg->id && pg->id[0]);
        CHECKF(pages_lookup(p, pg->id) == (long)i, "page %zu not found under its id", i);
        CHECK(i == 0 || pg->line > p->pg[i - 1].line);
        CHECK(pg->n_segs >= 1 && pg->segs);
        CHECK(pg->max_new_tokens <= PAGES_MAX_NEW_TOKENS);
        uint64_t rows = 0;
        for (uint32_t s = 0; s < pg->n_segs; s++) {
            const pages_seg *sg = &pg->segs[s];
            if (sg->kind == PAGES_SEG_TEXT) {
                CHECK(sg->rows == 0 && sg->text && !sg->tokens && !sg->file);
                continue;
            }
            if (sg->kind == PAGES_SEG_IMAGE) {
                CHECK(sg->file && sg->path && !sg->tokens && !sg->text);
                CHECK(!sg->error || sg->rows == 1);
                rows += sg->rows;
                continue;
            }
            CHECK(sg->rows >= 1);
            if (sg->kind == PAGES_SEG_TOKENS) {
                CHECK(sg->tokens && !sg->file && !sg->path);
                for (uint32_t t = 0; t < sg->rows; t++)
                    CHECK(sg->tokens[t] >= 0 && (uint32_t)sg->tokens[t] < p->vocab_size);
            } else {
                CHECK(sg->kind == PAGES_SEG_EMBEDDINGS);
                CHECK(!sg->tokens && sg->file && sg->path);
                CHECK(sg->npy.rows == sg->rows && (!p->hidden || sg->npy.cols == p->hidden));
            }
            rows += sg->rows;
        }
        CHECKF(rows == pg->prefill_rows, "page %zu: rows %" PRIu64 " vs %" PRIu64, i, rows,
               pg->prefill_rows);
        CHECK(rows <= PAGES_MAX_PREFILL_ROWS);
    }
}
