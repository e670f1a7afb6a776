/* merge: joins a sharded run's outputs in manifest order (rules in merge.h).
 * Owns, for one call, the manifest's ids, every output file's bytes and, per
 * page, where its finished line is. */
#include "cluster/format/merge.h"

#include <cjson/cJSON.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/file.h"
#include "base/fnv.h"

/* Where one page's lines were found.
 * INV: done_file < 0 iff no finished line was seen; dup_file >= 0 only when
 *      done_file >= 0 (a second finished line). */
typedef struct merge_page {
    char *id;
    uint32_t line; /* manifest line */
    int done_file, dup_file;
    uint64_t done_lineno, dup_lineno;
    const char *text; /* the finished line, without '\n' (in the file's buffer) */
    size_t len;
    int err_file; /* last error line seen (-1: none) */
    uint64_t err_lineno;
    char *err; /* its "error" text (owned) */
} merge_page;

typedef struct merge_ctx {
    merge_page *pg;
    size_t n;
    size_t *slots; /* open addressing, value = page index + 1 */
    size_t n_slots;
    FILE *log;
    merge_report rep;
} merge_ctx;

static long merge_find(const merge_ctx *c, const char *id)
{
    if (!c->n_slots)
        return -1;
    size_t mask = c->n_slots - 1;
    for (size_t i = (size_t)pd_fnv_str(id) & mask; c->slots[i]; i = (i + 1) & mask)
        if (!strcmp(c->pg[c->slots[i] - 1].id, id))
            return (long)(c->slots[i] - 1);
    return -1;
}

static bool merge_blank(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r')
            return false;
    return true;
}

/* Parses a complete line: on PD_OK *root is a JSON object with a non-empty
 * string "id" (owned: cJSON_Delete). */
static pd_status merge_parse(const char *line, size_t len, const char *file, uint64_t lineno,
                             const char *what, cJSON **root, pd_err *err)
{
    const char *end = NULL;
    cJSON *r = cJSON_ParseWithLengthOpts(line, len, &end, 0);
    const cJSON *id = r ? cJSON_GetObjectItemCaseSensitive(r, "id") : NULL;
    if (!r || !merge_blank(end, len - (size_t)(end - line)) || !cJSON_IsObject(r) ||
        !cJSON_IsString(id) || !id->valuestring[0]) {
        cJSON_Delete(r);
        return pd_err_set(err, PD_ERR_FORMAT, "merge: %s:%" PRIu64 ": not a JSON object with a "
                          "non-empty string \"id\" (%s)", file, lineno, what);
    }
    *root = r;
    return PD_OK;
}

/* Calls fn for each complete non-blank line of text (lineno 1-based). A
 * non-blank last line without '\n' is passed to fn too when take_last (a
 * manifest), else only reported in *torn (an output killed mid-write). */
typedef pd_status (*merge_line_fn)(merge_ctx *c, int file, const char *path, const char *line,
                                   size_t len, uint64_t lineno, pd_err *err);

static pd_status merge_each_line(merge_ctx *c, int file, const char *path, const char *text,
                                 size_t len, merge_line_fn fn, bool take_last, bool *torn,
                                 pd_err *err)
{
    uint64_t lineno = 0;
    size_t start = 0;
    *torn = false;
    for (size_t i = 0; i < len; i++) {
        if (text[i] != '\n')
            continue;
        lineno++;
        if (!merge_blank(text + start, i - start)) {
            pd_status st = fn(c, file, path, text + start, i - start, lineno, err);
            if (st != PD_OK)
                return st;
        }
        start = i + 1;
    }
    *torn = !merge_blank(text + start, len - start);
    if (*torn && take_last)
        return fn(c, file, path, text + start, len - start, lineno + 1, err);
    return PD_OK;
}

static pd_status merge_take_page(merge_ctx *c, int file, const char *path, const char *line,
                                 size_t len, uint64_t lineno, pd_err *err)
{
    cJSON *root = NULL;
    pd_status st = merge_parse(line, len, path, lineno, "a page of the manifest", &root, err);
    if (st != PD_OK)
        return st;
    const char *id = cJSON_GetObjectItemCaseSensitive(root, "id")->valuestring;
    long prev = merge_find(c, id);
    if (prev >= 0) {
        st = pd_err_set(err, PD_ERR_FORMAT, "merge: %s:%" PRIu64 ": page \"%s\": id: already used "
                        "by the page on line %" PRIu32, path, lineno, id, c->pg[prev].line);
    } else if (lineno > UINT32_MAX) {
        st = pd_err_set(err, PD_ERR_RANGE, "merge: %s: more than %u lines", path, UINT32_MAX);
    } else {
        merge_page *pg = &c->pg[c->n];
        *pg = (merge_page){.id = strdup(id), .line = (uint32_t)lineno, .done_file = -1,
                           .dup_file = -1, .err_file = -1};
        if (!pg->id) {
            st = pd_err_set(err, PD_ERR_NOMEM, "merge: no memory");
        } else {
            size_t j = (size_t)pd_fnv_str(id) & (c->n_slots - 1);
            while (c->slots[j])
                j = (j + 1) & (c->n_slots - 1);
            c->slots[j] = ++c->n;
        }
    }
    cJSON_Delete(root);
    (void)file;
    return st;
}

static void merge_note(merge_ctx *c, size_t count, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prints one problem line, the first MERGE_LIST_MAX of a kind. */
static void merge_note(merge_ctx *c, size_t count, const char *fmt, ...)
{
    if (!c->log || count > MERGE_LIST_MAX)
        return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(c->log, fmt, ap);
    va_end(ap);
}

static pd_status merge_take_output(merge_ctx *c, int file, const char *path, const char *line,
                                   size_t len, uint64_t lineno, pd_err *err)
{
    cJSON *root = NULL;
    pd_status st = merge_parse(line, len, path, lineno, "an output line", &root, err);
    if (st != PD_OK)
        return st;
    const char *id = cJSON_GetObjectItemCaseSensitive(root, "id")->valuestring;
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(root, "error");
    long k = merge_find(c, id);
    if (k < 0) {
        c->rep.unknown++;
        merge_note(c, c->rep.unknown, "unknown: %s (%s:%" PRIu64 ")\n", id, path, lineno);
    } else if (e) {
        merge_page *pg = &c->pg[k];
        char *msg = strdup(cJSON_IsString(e) ? e->valuestring : "(no message)");
        if (!msg) {
            st = pd_err_set(err, PD_ERR_NOMEM, "merge: no memory");
        } else {
            free(pg->err);
            pg->err = msg;
            pg->err_file = file;
            pg->err_lineno = lineno;
        }
    } else {
        merge_page *pg = &c->pg[k];
        if (pg->done_file < 0) {
            pg->done_file = file;
            pg->done_lineno = lineno;
            pg->text = line;
            pg->len = len;
        } else if (pg->dup_file < 0) {
            pg->dup_file = file;
            pg->dup_lineno = lineno;
        }
    }
    cJSON_Delete(root);
    return st;
}

pd_status merge_outputs(const char *manifest, const char *const *outputs, size_t n_outputs,
                        const char *final, FILE *log, merge_report *rep, pd_err *err)
{
    if (!manifest || !final || (n_outputs && !outputs))
        return pd_err_set(err, PD_ERR_ARG, "merge: NULL manifest, outputs or final path");
    if (pd_file_same(final, manifest))
        return pd_err_set(err, PD_ERR_REFUSED, "merge: %s would overwrite the manifest", final);
    for (size_t f = 0; f < n_outputs; f++)
        if (pd_file_same(final, outputs[f]))
            return pd_err_set(err, PD_ERR_REFUSED, "merge: %s would overwrite the output %s", final,
                              outputs[f]);
    merge_ctx c = {.log = log};
    char *mtext = NULL;
    size_t mlen = 0;
    char **texts = calloc(n_outputs ? n_outputs : 1, sizeof *texts);
    pd_status st = texts ? PD_OK : pd_err_set(err, PD_ERR_NOMEM, "merge: no memory");
    if (st == PD_OK)
        st = pd_file_read_all(manifest, "merge", (uint8_t **)&mtext, &mlen, err);

    /* the manifest's ids */
    size_t lines = 1;
    for (size_t i = 0; st == PD_OK && i < mlen; i++)
        lines += mtext[i] == '\n';
    if (st == PD_OK) {
        c.n_slots = 64;
        while (c.n_slots < 2 * lines)
            c.n_slots *= 2;
        c.pg = calloc(lines, sizeof *c.pg);
        c.slots = calloc(c.n_slots, sizeof *c.slots);
        if (!c.pg || !c.slots)
            st = pd_err_set(err, PD_ERR_NOMEM, "merge: no memory");
    }
    bool torn = false;
    if (st == PD_OK)
        st = merge_each_line(&c, -1, manifest, mtext, mlen, merge_take_page, true, &torn, err);
    c.rep.pages = c.n;

    /* the outputs */
    for (size_t f = 0; f < n_outputs && st == PD_OK; f++) {
        size_t len = 0;
        if ((st = pd_file_read_all(outputs[f], "merge", (uint8_t **)&texts[f], &len, err)) != PD_OK)
            break;
        st = merge_each_line(&c, (int)f, outputs[f], texts[f], len, merge_take_output, false, &torn,
                             err);
        if (st == PD_OK && torn) {
            c.rep.torn++;
            if (log)
                fprintf(log, "note: %s: a partial last line (a run killed while writing it) is "
                        "ignored\n", outputs[f]);
        }
    }

    /* the verdict, in manifest order */
    for (size_t i = 0; i < c.n && st == PD_OK; i++) {
        const merge_page *pg = &c.pg[i];
        if (pg->done_file < 0 && pg->err_file >= 0) {
            c.rep.missing++;
            c.rep.failed++;
            merge_note(&c, c.rep.failed, "failed: %s: %s:%" PRIu64 ": %s\n", pg->id,
                       outputs[pg->err_file], pg->err_lineno, pg->err);
        } else if (pg->done_file < 0) {
            c.rep.missing++;
            merge_note(&c, c.rep.missing - c.rep.failed, "missing: %s\n", pg->id);
        } else if (pg->dup_file >= 0) {
            c.rep.duplicated++;
            merge_note(&c, c.rep.duplicated, "duplicated: %s (%s:%" PRIu64 ", %s:%" PRIu64 ")\n", pg->id,
                       outputs[pg->done_file], pg->done_lineno, outputs[pg->dup_file], pg->dup_lineno);
        }
    }
    if (st == PD_OK && log) {
        size_t more_missing = c.rep.missing - c.rep.failed;
        if (more_missing > MERGE_LIST_MAX)
            fprintf(log, "missing: ... and %zu more\n", more_missing - MERGE_LIST_MAX);
        if (c.rep.failed > MERGE_LIST_MAX)
            fprintf(log, "failed: ... and %zu more\n", c.rep.failed - MERGE_LIST_MAX);
        if (c.rep.duplicated > MERGE_LIST_MAX)
            fprintf(log, "duplicated: ... and %zu more\n", c.rep.duplicated - MERGE_LIST_MAX);
        if (c.rep.unknown > MERGE_LIST_MAX)
            fprintf(log, "unknown: ... and %zu more\n", c.rep.unknown - MERGE_LIST_MAX);
    }
    if (st == PD_OK && (c.rep.missing || c.rep.duplicated || c.rep.unknown))
        st = pd_err_set(err, PD_ERR_MISMATCH,
                        "merge: %zu of %zu pages missing (%zu of them failed), %zu duplicated, %zu "
                        "unknown ids in %zu outputs; %s not written", c.rep.missing, c.rep.pages,
                        c.rep.failed, c.rep.duplicated, c.rep.unknown, n_outputs, final);

    /* the merged output */
    if (st == PD_OK) {
        pd_publish *pub = NULL;
        st = pd_file_publish_begin(final, 0644, "merge", &pub, err);
        for (size_t i = 0; i < c.n && st == PD_OK; i++) {
            st = pd_file_publish_write(pub, c.pg[i].text, c.pg[i].len, err);
            if (st == PD_OK)
                st = pd_file_publish_write(pub, "\n", 1, err);
        }
        if (pub)
            st = st == PD_OK ? pd_file_publish_commit(pub, err) : (pd_file_publish_abort(pub), st);
        if (st == PD_OK)
            c.rep.written = c.n;
    }
    if (rep)
        *rep = c.rep;
    for (size_t i = 0; i < c.n; i++) {
        free(c.pg[i].id);
        free(c.pg[i].err);
    }
    for (size_t f = 0; texts && f < n_outputs; f++)
        free(texts[f]);
    free(texts);
    free(c.pg);
    free(c.slots);
    free(mtext);
    return st;
}
