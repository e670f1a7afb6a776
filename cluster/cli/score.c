/* score: edit distance and the per-page CER of an output file (score.h). */
#include "cluster/cli/score.h"

#include "base/file.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t score_edit_distance(const char *a, size_t na, const char *b, size_t nb)
{
    if (nb + 1 > SIZE_MAX / (2 * sizeof(size_t)))
        return SIZE_MAX;
    size_t *prev = malloc((nb + 1) * sizeof *prev), *cur = malloc((nb + 1) * sizeof *cur);
    if (!prev || !cur) {
        free(prev);
        free(cur);
        return SIZE_MAX;
    }
    for (size_t j = 0; j <= nb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= na; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= nb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            size_t m = sub < del ? sub : del;
            cur[j] = m < ins ? m : ins;
        }
        size_t *t = prev;
        prev = cur;
        cur = t;
    }
    size_t d = prev[nb];
    free(prev);
    free(cur);
    return d;
}

struct score_result {
    score_page *pages;
    char **ids;
    size_t n;
};

size_t score_count(const score_result *r)
{
    return r->n;
}

const score_page *score_get(const score_result *r, size_t i)
{
    return i < r->n ? &r->pages[i] : NULL;
}

void score_free(score_result *r)
{
    if (!r)
        return;
    for (size_t i = 0; i < r->n; i++)
        free(r->ids[i]);
    free(r->ids);
    free(r->pages);
    free(r);
}

/* Calls fn(ctx, line number, line, len) for every non-blank line of buf. */
typedef pd_status (*score_line_fn)(void *ctx, size_t lineno, const char *line, size_t len, pd_err *err);
static pd_status score_lines(const char *buf, size_t len, score_line_fn fn, void *ctx, pd_err *err)
{
    size_t lineno = 0;
    for (size_t s = 0; s < len;) {
        const char *nl = memchr(buf + s, '\n', len - s);
        size_t e = nl ? (size_t)(nl - buf) : len;
        lineno++;
        size_t k = s;
        while (k < e && (buf[k] == ' ' || buf[k] == '\t' || buf[k] == '\r'))
            k++;
        if (k < e) {
            pd_status st = fn(ctx, lineno, buf + s, e - s, err);
            if (st != PD_OK)
                return st;
        }
        s = e + 1;
    }
    return PD_OK;
}

typedef struct score_ctx {
    const char *path;
    score_result *r;
    size_t cap;
    cJSON **texts; /* [r->n] the last output line of each manifest id (owned) */
} score_ctx;

static pd_status score_manifest_line(void *vctx, size_t lineno, const char *line, size_t len, pd_err *err)
{
    score_ctx *c = vctx;
    cJSON *o = cJSON_ParseWithLength(line, len);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    pd_status st = PD_OK;
    if (!cJSON_IsObject(o) || !cJSON_IsString(id) || !id->valuestring[0])
        st = pd_err_set(err, PD_ERR_FORMAT, "%s:%zu: not a JSON object with a non-empty string \"id\"", c->path, lineno);
    if (st == PD_OK && c->r->n == c->cap) {
        size_t nc = c->cap ? 2 * c->cap : 64;
        score_page *np = realloc(c->r->pages, nc * sizeof *np);
        if (np)
            c->r->pages = np;
        char **ni = realloc(c->r->ids, nc * sizeof *ni);
        if (ni)
            c->r->ids = ni;
        cJSON **nt = realloc(c->texts, nc * sizeof *nt);
        if (nt)
            c->texts = nt;
        if (!np || !ni || !nt)
            st = pd_err_set(err, PD_ERR_NOMEM, "score: out of memory");
        else
            c->cap = nc;
    }
    if (st == PD_OK) {
        char *dup = strdup(id->valuestring);
        if (!dup) {
            st = pd_err_set(err, PD_ERR_NOMEM, "score: out of memory");
        } else {
            c->r->ids[c->r->n] = dup;
            c->r->pages[c->r->n] = (score_page){.id = dup};
            c->texts[c->r->n] = NULL;
            c->r->n++;
        }
    }
    cJSON_Delete(o);
    return st;
}

static pd_status score_out_line(void *vctx, size_t lineno, const char *line, size_t len, pd_err *err)
{
    score_ctx *c = vctx;
    cJSON *o = cJSON_ParseWithLength(line, len);
    const cJSON *id = cJSON_GetObjectItemCaseSensitive(o, "id");
    if (!cJSON_IsObject(o) || !cJSON_IsString(id)) {
        cJSON_Delete(o);
        return pd_err_set(err, PD_ERR_FORMAT, "%s:%zu: not a JSON object with a string \"id\"", c->path, lineno);
    }
    for (size_t i = 0; i < c->r->n; i++)
        if (strcmp(c->r->ids[i], id->valuestring) == 0) {
            cJSON_Delete(c->texts[i]);
            c->texts[i] = o; /* the last line of an id counts */
            return PD_OK;
        }
    cJSON_Delete(o); /* a page of another manifest: not scored */
    return PD_OK;
}

pd_status score_run(const char *pages_path, const char *out_path, const char *const *truth, const size_t *truth_len,
                    size_t n_truth, score_result **out, pd_err *err)
{
    score_result *r = calloc(1, sizeof *r);
    if (!r)
        return pd_err_set(err, PD_ERR_NOMEM, "score: out of memory");
    score_ctx c = {.path = pages_path, .r = r};
    uint8_t *buf = NULL;
    size_t len = 0;
    pd_status st = pd_file_read_all(pages_path, NULL, &buf, &len, err);
    if (st == PD_OK)
        st = score_lines((const char *)buf, len, score_manifest_line, &c, err);
    free(buf);
    buf = NULL;
    if (st == PD_OK && r->n != n_truth)
        st = pd_err_set(err, PD_ERR_MISMATCH, "%s holds %zu pages, the truth text %zu", pages_path, r->n, n_truth);
    if (st == PD_OK) {
        c.path = out_path;
        st = pd_file_read_all(out_path, NULL, &buf, &len, err);
    }
    if (st == PD_OK)
        st = score_lines((const char *)buf, len, score_out_line, &c, err);
    free(buf);
    for (size_t i = 0; st == PD_OK && i < r->n; i++) {
        const cJSON *o = c.texts[i];
        const cJSON *text = cJSON_GetObjectItemCaseSensitive(o, "text");
        if (!o)
            st = pd_err_set(err, PD_ERR_FORMAT, "%s: page \"%s\" has no line", out_path, r->ids[i]);
        else if (cJSON_IsString(cJSON_GetObjectItemCaseSensitive(o, "error")))
            st = pd_err_set(err, PD_ERR_FORMAT, "%s: page \"%s\" failed: %s", out_path, r->ids[i],
                            cJSON_GetObjectItemCaseSensitive(o, "error")->valuestring);
        else if (!cJSON_IsString(text))
            st = pd_err_set(err, PD_ERR_FORMAT, "%s: page \"%s\": no string \"text\"", out_path, r->ids[i]);
        if (st != PD_OK)
            break;
        size_t hl = strlen(text->valuestring);
        size_t d = score_edit_distance(text->valuestring, hl, truth[i], truth_len[i]);
        if (d == SIZE_MAX)
            st = pd_err_set(err, PD_ERR_NOMEM, "score: out of memory");
        r->pages[i].ref_chars = truth_len[i];
        r->pages[i].hyp_chars = hl;
        r->pages[i].edits = d;
    }
    for (size_t i = 0; i < r->n && c.texts; i++)
        cJSON_Delete(c.texts[i]);
    free(c.texts);
    if (st != PD_OK) {
        score_free(r);
        return st;
    }
    *out = r;
    return PD_OK;
}
