/* shard: the manifest split of `pipedec shard` (rules in shard.h). Owns
 * nothing past a call: the manifest is loaded, planned and written out. */
#include "cluster/format/shard.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/file.h"
#include "cluster/format/pages.h"

uint32_t shard_of(uint64_t before, uint64_t cost, uint64_t total, uint32_t shards)
{
    if (!total || shards <= 1)
        return 0;
    /* the midpoint of the page's cost interval, in units of total / (2 * shards) */
    unsigned __int128 mid2 = (unsigned __int128)before * 2 + cost;
    unsigned __int128 k = mid2 * shards / ((unsigned __int128)total * 2);
    return k >= shards ? shards - 1 : (uint32_t)k;
}

pd_status shard_path(const char *out_dir, uint32_t k, char *buf, size_t cap, pd_err *err)
{
    int n = snprintf(buf, cap, "%s/shard-%" PRIu32 ".jsonl", out_dir, k);
    if (n < 0 || (size_t)n >= cap)
        return pd_err_set(err, PD_ERR_RANGE, "shard: %s: path too long", out_dir);
    return PD_OK;
}

static uint64_t shard_page_cost(const pages_page *pg)
{
    uint64_t c = pg->prefill_rows + pg->max_new_tokens;
    return c ? c : 1;
}

/* The relative path from directory `from` to directory `to` (both absolute
 * and resolved: realpath) into buf: "" when they are the same, else
 * "../../a/b" with no trailing '/'. */
static pd_status shard_relpath(const char *from, const char *to, char *buf, size_t cap, pd_err *err)
{
    /* the longest common prefix that ends at a component boundary */
    size_t common = 0;
    for (size_t i = 0;; i++) {
        bool fe = from[i] == '\0' || from[i] == '/', te = to[i] == '\0' || to[i] == '/';
        if (fe && te)
            common = i;
        if (from[i] != to[i] || from[i] == '\0')
            break;
    }
    size_t k = 0;
    buf[0] = '\0';
    /* one ".." per component of from below the common prefix */
    for (const char *s = from + common; *s; s++) {
        if (*s == '/' || (s > from && s[-1] != '/'))
            continue;
        if (k + 4 > cap)
            return pd_err_set(err, PD_ERR_RANGE, "shard: relative path from %s to %s too long", from, to);
        memcpy(buf + k, k ? "/.." : "..", k ? 4 : 3);
        k += k ? 3 : 2;
    }
    const char *rest = to + common;
    while (*rest == '/')
        rest++;
    if (*rest) {
        int n = snprintf(buf + k, cap - k, "%s%s", k ? "/" : "", rest);
        if (n < 0 || (size_t)n >= cap - k)
            return pd_err_set(err, PD_ERR_RANGE, "shard: relative path from %s to %s too long", from, to);
    }
    return PD_OK;
}

/* A line of the manifest text. */
typedef struct shard_line {
    const char *text;
    size_t len; /* without the '\n' */
} shard_line;

/* Splits text into lines (the last one may lack '\n'); *out owned (free). */
static pd_status shard_lines(const char *text, size_t len, shard_line **out, size_t *n, pd_err *err)
{
    size_t cap = 1;
    for (size_t i = 0; i < len; i++)
        cap += text[i] == '\n';
    shard_line *ls = calloc(cap, sizeof *ls);
    if (!ls)
        return pd_err_set(err, PD_ERR_NOMEM, "shard: no memory");
    size_t k = 0, start = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i == len || text[i] == '\n') {
            if (i > start || i < len)
                ls[k++] = (shard_line){.text = text + start, .len = i - start};
            start = i + 1;
        }
    }
    *out = ls;
    *n = k;
    return PD_OK;
}

/* Writes page line `ln` to the shard, rewriting relative embeddings and image paths as
 * prefix + "/" + path (prefix "" = unchanged, the line copied byte for
 * byte). */
static pd_status shard_put_line(pd_publish *pub, const pages_page *pg, const shard_line *ln,
                                const char *prefix, const char *manifest, pd_err *err)
{
    bool rewrite = false;
    for (uint32_t s = 0; s < pg->n_segs && prefix[0]; s++)
        rewrite |= (pg->segs[s].kind == PAGES_SEG_EMBEDDINGS || pg->segs[s].kind == PAGES_SEG_IMAGE) &&
                   pg->segs[s].file[0] != '/';
    if (!rewrite) {
        pd_status st = pd_file_publish_write(pub, ln->text, ln->len, err);
        return st == PD_OK ? pd_file_publish_write(pub, "\n", 1, err) : st;
    }
    cJSON *root = cJSON_ParseWithLength(ln->text, ln->len);
    cJSON *prefill = root ? cJSON_GetObjectItemCaseSensitive(root, "prefill") : NULL;
    pd_status st = PD_OK;
    if (!cJSON_IsArray(prefill)) /* pages_load accepted this line: cannot happen */
        st = pd_err_set(err, PD_ERR_FORMAT, "shard: %s:%" PRIu32 ": cannot re-read the line", manifest,
                        pg->line);
    for (cJSON *seg = prefill ? prefill->child : NULL; seg && st == PD_OK; seg = seg->next) {
        const char *key = "embeddings";
        cJSON *e = cJSON_GetObjectItemCaseSensitive(seg, key);
        if (!e)
            e = cJSON_GetObjectItemCaseSensitive(seg, key = "image");
        if (!cJSON_IsString(e) || e->valuestring[0] == '/')
            continue;
        size_t n = strlen(prefix) + 1 + strlen(e->valuestring) + 1;
        char *path = malloc(n);
        cJSON *ns = path ? (snprintf(path, n, "%s/%s", prefix, e->valuestring), cJSON_CreateString(path)) : NULL;
        free(path);
        if (!ns || !cJSON_ReplaceItemInObjectCaseSensitive(seg, key, ns)) {
            cJSON_Delete(ns);
            st = pd_err_set(err, PD_ERR_NOMEM, "shard: no memory");
        }
    }
    char *text = st == PD_OK ? cJSON_PrintUnformatted(root) : NULL;
    if (st == PD_OK && !text)
        st = pd_err_set(err, PD_ERR_NOMEM, "shard: no memory");
    if (st == PD_OK)
        st = pd_file_publish_write(pub, text, strlen(text), err);
    if (st == PD_OK)
        st = pd_file_publish_write(pub, "\n", 1, err);
    cJSON_free(text);
    cJSON_Delete(root);
    return st;
}

/* Refuses an out_dir that holds shard-K.jsonl with K >= shards. */
static pd_status shard_check_stale(const char *out_dir, uint32_t shards, pd_err *err)
{
    DIR *d = opendir(out_dir);
    if (!d)
        return pd_err_set(err, PD_ERR_IO, "shard: %s: cannot list: %s", out_dir, strerror(errno));
    pd_status st = PD_OK;
    struct dirent *de;
    while (st == PD_OK && (de = readdir(d)) != NULL) {
        unsigned long k;
        int used = 0;
        if (sscanf(de->d_name, "shard-%lu.jsonl%n", &k, &used) == 1 && de->d_name[used] == '\0' &&
            k >= shards)
            st = pd_err_set(err, PD_ERR_REFUSED,
                            "shard: %s/%s is left from a split into more shards (an array job would "
                            "run it too); remove it or choose another directory", out_dir, de->d_name);
    }
    closedir(d);
    return st;
}

pd_status shard_split(const char *manifest, uint32_t shards, const char *out_dir,
                      const shard_counts *counts, pd_err *err)
{
    if (!manifest || !out_dir)
        return pd_err_set(err, PD_ERR_ARG, "shard: NULL manifest or output directory");
    if (shards < 1 || shards > SHARD_MAX)
        return pd_err_set(err, PD_ERR_ARG, "shard: %" PRIu32 " shards: expected 1..%u", shards, SHARD_MAX);
    pages *p = NULL;
    pd_status st = pages_load(manifest, (uint32_t)INT32_MAX, 0, &(pages_opts){.header_only = true}, &p, err);
    if (st != PD_OK)
        return st;
    char *text = NULL;
    size_t len = 0;
    shard_line *lines = NULL;
    size_t n_lines = 0;
    uint32_t *which = NULL;
    char dir_real[PATH_MAX], man_real[PATH_MAX], prefix[PATH_MAX];
    size_t n = pages_count(p);

    /* the manifest's directory, as pages_load resolves relative paths */
    char man_dir[PATH_MAX];
    const char *slash = strrchr(manifest, '/');
    if (!slash)
        snprintf(man_dir, sizeof man_dir, ".");
    else if (slash == manifest)
        snprintf(man_dir, sizeof man_dir, "/");
    else
        snprintf(man_dir, sizeof man_dir, "%.*s", (int)(slash - manifest), manifest);

    if (mkdir(out_dir, 0777) != 0 && errno != EEXIST)
        st = pd_err_set(err, PD_ERR_IO, "shard: %s: cannot create: %s", out_dir, strerror(errno));
    if (st == PD_OK && (!realpath(out_dir, dir_real) || !realpath(man_dir, man_real)))
        st = pd_err_set(err, PD_ERR_IO, "shard: cannot resolve %s or %s: %s", out_dir, man_dir,
                        strerror(errno));
    if (st == PD_OK)
        st = shard_relpath(dir_real, man_real, prefix, sizeof prefix, err);
    if (st == PD_OK)
        st = shard_check_stale(out_dir, shards, err);
    for (uint32_t k = 0; k < shards && st == PD_OK; k++) {
        char path[PATH_MAX];
        if ((st = shard_path(out_dir, k, path, sizeof path, err)) == PD_OK && pd_file_same(path, manifest))
            st = pd_err_set(err, PD_ERR_REFUSED, "shard: %s would overwrite the manifest %s", path, manifest);
    }
    if (st == PD_OK)
        st = pd_file_read_all(manifest, "shard", (uint8_t **)&text, &len, err);
    if (st == PD_OK)
        st = shard_lines(text, len, &lines, &n_lines, err);
    if (st == PD_OK && !(which = calloc(n ? n : 1, sizeof *which)))
        st = pd_err_set(err, PD_ERR_NOMEM, "shard: no memory");

    /* the plan */
    uint64_t total = 0;
    for (size_t i = 0; i < n && st == PD_OK; i++)
        total += shard_page_cost(pages_get(p, i));
    for (uint32_t k = 0; counts && k < shards; k++) {
        if (counts->pages)
            counts->pages[k] = 0;
        if (counts->cost)
            counts->cost[k] = 0;
    }
    uint64_t before = 0;
    for (size_t i = 0; i < n && st == PD_OK; i++) {
        const pages_page *pg = pages_get(p, i);
        uint64_t c = shard_page_cost(pg);
        which[i] = shard_of(before, c, total, shards);
        before += c;
        if (pg->line < 1 || pg->line > n_lines) /* the text changed under us */
            st = pd_err_set(err, PD_ERR_IO, "shard: %s: changed while read", manifest);
        if (counts && counts->pages)
            counts->pages[which[i]]++;
        if (counts && counts->cost)
            counts->cost[which[i]] += c;
    }

    /* the shards: pages of shard k are contiguous, so one pass per shard */
    size_t i = 0;
    for (uint32_t k = 0; k < shards && st == PD_OK; k++) {
        char path[PATH_MAX];
        pd_publish *pub = NULL;
        if ((st = shard_path(out_dir, k, path, sizeof path, err)) != PD_OK ||
            (st = pd_file_publish_begin(path, 0644, "shard", &pub, err)) != PD_OK)
            break;
        for (; i < n && which[i] == k && st == PD_OK; i++) {
            const pages_page *pg = pages_get(p, i);
            st = shard_put_line(pub, pg, &lines[pg->line - 1], prefix, manifest, err);
        }
        if (st == PD_OK)
            st = pd_file_publish_commit(pub, err);
        else
            pd_file_publish_abort(pub);
    }
    free(which);
    free(lines);
    free(text);
    pages_free(p);
    return st;
}
