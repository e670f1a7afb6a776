/* render: text pages -> glyph-cell embedding rows and a page manifest
 * (the layout is in render.h and docs/ocr.md). Owns the built-in 5x7 font. */
#include "cluster/format/render.h"

#include "base/file.h"
#include "cluster/format/npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* 5x7 glyphs of ASCII 32..126, five columns left to right, bit r = row r
 * (top row bit 0). Every glyph differs from every other (a unit test checks);
 * the space is blank. */
static const uint8_t render_font[95][5] = {
    {0x00, 0x00, 0x00, 0x00, 0x00}, /*   */ {0x00, 0x00, 0x5F, 0x00, 0x00}, /* ! */
    {0x00, 0x07, 0x00, 0x07, 0x00}, /* " */ {0x14, 0x7F, 0x14, 0x7F, 0x14}, /* # */
    {0x24, 0x2A, 0x7F, 0x2A, 0x12}, /* $ */ {0x23, 0x13, 0x08, 0x64, 0x62}, /* % */
    {0x36, 0x49, 0x55, 0x22, 0x50}, /* & */ {0x00, 0x05, 0x03, 0x00, 0x00}, /* ' */
    {0x00, 0x1C, 0x22, 0x41, 0x00}, /* ( */ {0x00, 0x41, 0x22, 0x1C, 0x00}, /* ) */
    {0x08, 0x2A, 0x1C, 0x2A, 0x08}, /* * */ {0x08, 0x08, 0x3E, 0x08, 0x08}, /* + */
    {0x00, 0x50, 0x30, 0x00, 0x00}, /* , */ {0x08, 0x08, 0x08, 0x08, 0x08}, /* - */
    {0x00, 0x60, 0x60, 0x00, 0x00}, /* . */ {0x20, 0x10, 0x08, 0x04, 0x02}, /* / */
    {0x3E, 0x51, 0x49, 0x45, 0x3E}, /* 0 */ {0x00, 0x42, 0x7F, 0x40, 0x00}, /* 1 */
    {0x42, 0x61, 0x51, 0x49, 0x46}, /* 2 */ {0x21, 0x41, 0x45, 0x4B, 0x31}, /* 3 */
    {0x18, 0x14, 0x12, 0x7F, 0x10}, /* 4 */ {0x27, 0x45, 0x45, 0x45, 0x39}, /* 5 */
    {0x3C, 0x4A, 0x49, 0x49, 0x30}, /* 6 */ {0x01, 0x71, 0x09, 0x05, 0x03}, /* 7 */
    {0x36, 0x49, 0x49, 0x49, 0x36}, /* 8 */ {0x06, 0x49, 0x49, 0x29, 0x1E}, /* 9 */
    {0x00, 0x36, 0x36, 0x00, 0x00}, /* : */ {0x00, 0x56, 0x36, 0x00, 0x00}, /* ; */
    {0x08, 0x14, 0x22, 0x41, 0x00}, /* < */ {0x14, 0x14, 0x14, 0x14, 0x14}, /* = */
    {0x00, 0x41, 0x22, 0x14, 0x08}, /* > */ {0x02, 0x01, 0x51, 0x09, 0x06}, /* ? */
    {0x32, 0x49, 0x79, 0x41, 0x3E}, /* @ */ {0x7E, 0x11, 0x11, 0x11, 0x7E}, /* A */
    {0x7F, 0x49, 0x49, 0x49, 0x36}, /* B */ {0x3E, 0x41, 0x41, 0x41, 0x22}, /* C */
    {0x7F, 0x41, 0x41, 0x22, 0x1C}, /* D */ {0x7F, 0x49, 0x49, 0x49, 0x41}, /* E */
    {0x7F, 0x09, 0x09, 0x01, 0x01}, /* F */ {0x3E, 0x41, 0x41, 0x51, 0x32}, /* G */
    {0x7F, 0x08, 0x08, 0x08, 0x7F}, /* H */ {0x00, 0x41, 0x7F, 0x41, 0x00}, /* I */
    {0x20, 0x40, 0x41, 0x3F, 0x01}, /* J */ {0x7F, 0x08, 0x14, 0x22, 0x41}, /* K */
    {0x7F, 0x40, 0x40, 0x40, 0x40}, /* L */ {0x7F, 0x02, 0x04, 0x02, 0x7F}, /* M */
    {0x7F, 0x04, 0x08, 0x10, 0x7F}, /* N */ {0x3E, 0x41, 0x41, 0x41, 0x3E}, /* O */
    {0x7F, 0x09, 0x09, 0x09, 0x06}, /* P */ {0x3E, 0x41, 0x51, 0x21, 0x5E}, /* Q */
    {0x7F, 0x09, 0x19, 0x29, 0x46}, /* R */ {0x46, 0x49, 0x49, 0x49, 0x31}, /* S */
    {0x01, 0x01, 0x7F, 0x01, 0x01}, /* T */ {0x3F, 0x40, 0x40, 0x40, 0x3F}, /* U */
    {0x1F, 0x20, 0x40, 0x20, 0x1F}, /* V */ {0x7F, 0x20, 0x18, 0x20, 0x7F}, /* W */
    {0x63, 0x14, 0x08, 0x14, 0x63}, /* X */ {0x03, 0x04, 0x78, 0x04, 0x03}, /* Y */
    {0x61, 0x51, 0x49, 0x45, 0x43}, /* Z */ {0x00, 0x00, 0x7F, 0x41, 0x41}, /* [ */
    {0x02, 0x04, 0x08, 0x10, 0x20}, /* \ */ {0x41, 0x41, 0x7F, 0x00, 0x00}, /* ] */
    {0x04, 0x02, 0x01, 0x02, 0x04}, /* ^ */ {0x40, 0x40, 0x40, 0x40, 0x40}, /* _ */
    {0x00, 0x01, 0x02, 0x04, 0x00}, /* ` */ {0x20, 0x54, 0x54, 0x54, 0x78}, /* a */
    {0x7F, 0x48, 0x44, 0x44, 0x38}, /* b */ {0x38, 0x44, 0x44, 0x44, 0x20}, /* c */
    {0x38, 0x44, 0x44, 0x48, 0x7F}, /* d */ {0x38, 0x54, 0x54, 0x54, 0x18}, /* e */
    {0x08, 0x7E, 0x09, 0x01, 0x02}, /* f */ {0x08, 0x14, 0x54, 0x54, 0x3C}, /* g */
    {0x7F, 0x08, 0x04, 0x04, 0x78}, /* h */ {0x00, 0x44, 0x7D, 0x40, 0x00}, /* i */
    {0x20, 0x40, 0x44, 0x3D, 0x00}, /* j */ {0x00, 0x7F, 0x10, 0x28, 0x44}, /* k */
    {0x00, 0x41, 0x7F, 0x40, 0x00}, /* l */ {0x7C, 0x04, 0x18, 0x04, 0x78}, /* m */
    {0x7C, 0x08, 0x04, 0x04, 0x78}, /* n */ {0x38, 0x44, 0x44, 0x44, 0x38}, /* o */
    {0x7C, 0x14, 0x14, 0x14, 0x08}, /* p */ {0x08, 0x14, 0x14, 0x18, 0x7C}, /* q */
    {0x7C, 0x08, 0x04, 0x04, 0x08}, /* r */ {0x48, 0x54, 0x54, 0x54, 0x20}, /* s */
    {0x04, 0x3F, 0x44, 0x40, 0x20}, /* t */ {0x3C, 0x40, 0x40, 0x20, 0x7C}, /* u */
    {0x1C, 0x20, 0x40, 0x20, 0x1C}, /* v */ {0x3C, 0x40, 0x30, 0x40, 0x3C}, /* w */
    {0x44, 0x28, 0x10, 0x28, 0x44}, /* x */ {0x0C, 0x50, 0x50, 0x50, 0x3C}, /* y */
    {0x44, 0x64, 0x54, 0x4C, 0x44}, /* z */ {0x00, 0x08, 0x36, 0x41, 0x00}, /* { */
    {0x00, 0x00, 0x7F, 0x00, 0x00}, /* | */ {0x00, 0x41, 0x36, 0x08, 0x00}, /* } */
    {0x02, 0x01, 0x02, 0x04, 0x02}, /* ~ */
};

/* One page: its transcription (lines each ending in '\n'). */
typedef struct render_page {
    char *text;
    size_t len;
    uint32_t cells;
} render_page;

struct render_doc {
    render_page *pages;
    size_t n;
};

const uint8_t *render_glyph(int ch)
{
    return ch >= 32 && ch <= 126 ? render_font[ch - 32] : NULL;
}

static uint64_t render_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void render_doc_free(render_doc *d)
{
    if (!d)
        return;
    for (size_t i = 0; i < d->n; i++)
        free(d->pages[i].text);
    free(d->pages);
    free(d);
}

/* Validates page `pno` (1-based) text[0..len) and stores it with a final
 * '\n' added when missing. */
static pd_status render_page_take(const char *text, size_t len, size_t pno, render_page *pg, pd_err *err)
{
    uint32_t line = 1, col = 1, cells = 0;
    for (size_t k = 0; k < len; k++) {
        unsigned char c = (unsigned char)text[k];
        if (c == '\n') {
            cells++;
            line++;
            col = 1;
            continue;
        }
        if (c < 32 || c > 126)
            return pd_err_set(err, PD_ERR_FORMAT,
                              "page %zu, line %u, column %u: byte 0x%02x is not printable ASCII (32..126), "
                              "a newline or a form feed",
                              pno, line, col, c);
        if (col > RENDER_MAX_COLS)
            return pd_err_set(err, PD_ERR_RANGE, "page %zu, line %u: longer than %u characters", pno, line,
                              RENDER_MAX_COLS);
        if (line > RENDER_MAX_LINES)
            return pd_err_set(err, PD_ERR_RANGE, "page %zu: more than %u lines", pno, RENDER_MAX_LINES);
        col++;
        cells++;
    }
    int add_nl = len == 0 || text[len - 1] != '\n';
    if (add_nl) {
        cells++;
        line++;
    }
    if (line - 1 > RENDER_MAX_LINES)
        return pd_err_set(err, PD_ERR_RANGE, "page %zu: more than %u lines", pno, RENDER_MAX_LINES);
    pg->text = malloc(len + 2);
    if (!pg->text)
        return pd_err_set(err, PD_ERR_NOMEM, "render: out of memory");
    memcpy(pg->text, text, len);
    if (add_nl)
        pg->text[len++] = '\n';
    pg->text[len] = '\0';
    pg->len = len;
    pg->cells = cells;
    return PD_OK;
}

pd_status render_doc_parse(const char *text, size_t len, render_doc **out, pd_err *err)
{
    /* pieces between form feeds; a last piece that is empty or "\n" follows
     * a trailing form feed and is not a page */
    size_t n = 1;
    for (size_t k = 0; k < len; k++)
        n += text[k] == '\f';
    render_doc *d = calloc(1, sizeof *d);
    render_page *pages = calloc(n, sizeof *pages);
    if (!d || !pages) {
        free(d);
        free(pages);
        return pd_err_set(err, PD_ERR_NOMEM, "render: out of memory");
    }
    d->pages = pages;
    pd_status st = PD_OK;
    size_t start = 0;
    for (size_t p = 0; p < n && st == PD_OK; p++) {
        size_t end = start;
        while (end < len && text[end] != '\f')
            end++;
        size_t plen = end - start;
        int last = p + 1 == n;
        if (last && n > 1 && (plen == 0 || (plen == 1 && text[start] == '\n')))
            break;
        if (plen == 0)
            st = pd_err_set(err, PD_ERR_FORMAT, "page %zu is empty", p + 1);
        else
            st = render_page_take(text + start, plen, p + 1, &pages[d->n], err);
        if (st == PD_OK)
            d->n++;
        start = end + 1;
    }
    if (st != PD_OK) {
        render_doc_free(d);
        return st;
    }
    *out = d;
    return PD_OK;
}

size_t render_doc_pages(const render_doc *d)
{
    return d->n;
}

const char *render_page_truth(const render_doc *d, size_t i, size_t *len)
{
    if (i >= d->n)
        return NULL;
    if (len)
        *len = d->pages[i].len;
    return d->pages[i].text;
}

uint32_t render_page_cells(const render_doc *d, size_t i)
{
    return i < d->n ? d->pages[i].cells : 0;
}

/* The features of one cell: ch is a printable character, '\n' for an end
 * of line, -1 for padding. */
static void render_features_of(int ch, uint32_t line, uint32_t col, float f[RENDER_FEATURES])
{
    memset(f, 0, RENDER_FEATURES * sizeof *f);
    const uint8_t *g = ch > 0 && ch != '\n' ? render_glyph(ch) : NULL;
    for (int r = 0; g && r < RENDER_GLYPH_H; r++)
        for (int c = 0; c < RENDER_GLYPH_W; c++)
            f[RENDER_GLYPH_W * r + c] = (g[c] >> r) & 1 ? 1.0f : 0.0f;
    for (int b = 0; b < 6; b++)
        f[35 + b] = (line >> b) & 1 ? 1.0f : -1.0f;
    for (int b = 0; b < 7; b++)
        f[41 + b] = (col >> b) & 1 ? 1.0f : -1.0f;
    f[ch < 0 ? 50 : ch == '\n' ? 49 : 48] = 1.0f;
    f[51] = 1.0f;
}

/* Cell k of a page is byte k of its transcription (a character, or '\n'
 * for an end of line); cells past the text are padding at line 0, col 0. */
void render_cell_features(const render_doc *d, size_t i, uint32_t cell, float f[RENDER_FEATURES])
{
    const render_page *pg = &d->pages[i];
    uint32_t line = 0, col = 0;
    if (cell >= pg->cells) {
        render_features_of(-1, 0, 0, f);
        return;
    }
    for (uint32_t b = 0; b < cell; b++) {
        if (pg->text[b] == '\n') {
            line++;
            col = 0;
        } else {
            col++;
        }
    }
    render_features_of((unsigned char)pg->text[cell], line, col, f);
}

pd_status render_page_embed(const render_doc *d, size_t i, uint32_t cells, uint32_t hidden, float *out,
                            pd_err *err)
{
    if (i >= d->n)
        return pd_err_set(err, PD_ERR_RANGE, "render: page %zu of %zu", i + 1, d->n);
    if (d->pages[i].cells > cells)
        return pd_err_set(err, PD_ERR_RANGE,
                          "page %zu uses %u cells (characters plus one per line), the model reads %u per page",
                          i + 1, d->pages[i].cells, cells);
    /* the projection, once per call: P[h][f] = +-0.25 */
    float *P = malloc((size_t)hidden * RENDER_FEATURES * sizeof *P);
    if (!P)
        return pd_err_set(err, PD_ERR_NOMEM, "render: out of memory");
    for (uint32_t h = 0; h < hidden; h++)
        for (uint32_t f = 0; f < RENDER_FEATURES; f++)
            P[(size_t)h * RENDER_FEATURES + f] =
                render_mix(RENDER_SEED ^ render_mix((uint64_t)h * 64 + f)) & 1 ? -0.25f : 0.25f;
    float feat[RENDER_FEATURES];
    const render_page *pg = &d->pages[i];
    uint32_t line = 0, col = 0;
    for (uint32_t c = 0; c < cells; c++) {
        /* one walk over the text: cell c is byte c (render_cell_features) */
        if (c < pg->cells) {
            render_features_of((unsigned char)pg->text[c], line, col, feat);
            if (pg->text[c] == '\n') {
                line++;
                col = 0;
            } else {
                col++;
            }
        } else {
            render_features_of(-1, 0, 0, feat);
        }
        float *row = out + (size_t)c * hidden;
        for (uint32_t h = 0; h < hidden; h++) {
            const float *p = P + (size_t)h * RENDER_FEATURES;
            float s = 0.0f;
            for (uint32_t f = 0; f < RENDER_FEATURES; f++)
                s += p[f] * feat[f];
            row[h] = s;
        }
    }
    free(P);
    return PD_OK;
}

/* s as a JSON string: quotes, backslashes and control bytes escaped, other
 * bytes (UTF-8) as they are. */
static void render_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

pd_status render_write(const render_doc *d, const render_opts *o, const char *dir, pd_err *err)
{
    if (o->hidden < 1 || o->hidden > 65536 || o->cells < 1 || o->cells > (1u << 16) ||
        o->n_prompt > RENDER_MAX_PROMPT)
        return pd_err_set(err, PD_ERR_ARG, "render: hidden %u, cells %u or prompt of %u tokens out of range",
                          o->hidden, o->cells, o->n_prompt);
    for (size_t i = 0; i < d->n; i++)
        if (d->pages[i].cells > o->cells)
            return pd_err_set(err, PD_ERR_RANGE,
                              "page %zu uses %u cells (characters plus one per line), the model reads at most %u",
                              i + 1, d->pages[i].cells, o->cells);
    if (d->n > 100000)
        return pd_err_set(err, PD_ERR_RANGE, "render: %zu pages, at most 100000", d->n);
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return pd_err_set(err, PD_ERR_IO, "render: cannot create %s: %s", dir, strerror(errno));
    const char *prefix = o->id_prefix ? o->id_prefix : "p";
    if (strlen(prefix) > 32 || strpbrk(prefix, "\"\\/"))
        return pd_err_set(err, PD_ERR_ARG, "render: id prefix '%s' must be at most 32 characters without quotes, "
                                           "backslashes or slashes", prefix);
    size_t plen = strlen(dir) + 64;
    char *path = malloc(plen);
    float *emb = malloc((size_t)o->cells * o->hidden * sizeof *emb);
    if (!path || !emb) {
        free(path);
        free(emb);
        return pd_err_set(err, PD_ERR_NOMEM, "render: out of memory");
    }
    snprintf(path, plen, "%s/pages.jsonl", dir);
    pd_publish *pub = NULL;
    pd_status st = pd_file_publish_begin(path, 0644, "render", &pub, err);
    FILE *f = st == PD_OK ? pd_file_publish_stream(pub, err) : NULL;
    if (st == PD_OK && !f)
        st = PD_ERR_IO;
    for (size_t i = 0; st == PD_OK && i < d->n; i++) {
        char id[48];
        snprintf(id, sizeof id, "%s%05zu", prefix, i);
        st = render_page_embed(d, i, o->cells, o->hidden, emb, err);
        snprintf(path, plen, "%s/%s.npy", dir, id);
        if (st == PD_OK)
            st = npy_write_f32(path, o->cells, o->hidden, emb, err);
        if (st != PD_OK)
            break;
        fprintf(f, "{\"id\":\"%s\",\"prefill\":[{\"tokens\":[%u]},{\"embeddings\":\"%s.npy\"}", id, o->bos, id);
        if (o->n_prompt && o->prompt_text) {
            fprintf(f, ",{\"text\":");
            render_json_str(f, o->prompt_text);
            fprintf(f, "}");
        } else if (o->n_prompt) {
            fprintf(f, ",{\"tokens\":[");
            for (uint32_t t = 0; t < o->n_prompt; t++)
                fprintf(f, "%s%u", t ? "," : "", o->prompt[t]);
            fprintf(f, "]}");
        }
        fprintf(f, "],\"max_new_tokens\":%u}\n", d->pages[i].cells + o->max_new_extra);
    }
    if (st == PD_OK)
        st = pd_file_publish_commit(pub, err);
    else
        pd_file_publish_abort(pub);
    free(path);
    free(emb);
    return st;
}
