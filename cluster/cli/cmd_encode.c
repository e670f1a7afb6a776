/* `pipedec encode --mmproj MM --model M --pages P --out DIR [--threads T]`:
 * the image pages of a manifest to embeddings pages, with llama.cpp's mtmd
 * (cluster/vision/venc.h), as a pre-pass (for instance on GPU nodes with a
 * CUDA-built llama.cpp) whose output `run`, `shard` and the Slurm scripts
 * take unchanged.
 *
 * Each image segment becomes what mtmd makes of it: text pieces as
 * {"tokens": [...]} and image rows as {"embeddings": "rows/..."} segments
 * (one '<f4' .npy per piece, under DIR/rows/). Other segments are kept: text
 * and tokens as written, embeddings with their path made absolute. The new
 * manifest is DIR/pages.jsonl, in the input's order, written atomically. A
 * page whose image cannot be read or encoded is left out of it; its
 * {"id","error"} line goes to DIR/errors.jsonl and stderr, the other pages
 * are encoded, and the exit status is 1. */
#include "base/check.h"
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/file.h"
#include "cluster/format/npy.h"
#include "cluster/format/pages.h"
#include "cluster/model/model.h"
#include "cluster/vision/venc.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: pipedec encode --mmproj MM --model M --pages P --out DIR [--threads T]\n"
               "  Encodes the image segments of a page manifest ({\"image\": \"scan.png\"}) with the\n"
               "  vision projector MM (llama.cpp's mtmd) into embeddings pages: DIR/pages.jsonl\n"
               "  and DIR/rows/*.npy, which `pipedec run --model M` decodes.\n"
               "  --threads T   encoder threads (default 2)\n"
               "  A page that fails is left out; its {\"id\",\"error\"} line goes to DIR/errors.jsonl.\n"
               "  exit: 0 every page encoded, 1 some page failed or the model/mmproj was refused,\n"
               "        2 usage or unreadable file\n"
               "  %s\n", venc_describe());
}

typedef struct enc_job {
    const char *out_dir;
    const pages *pg;
    venc *v;
    uint32_t hidden;
    uint64_t images, rows;
} enc_job;

static cJSON *enc_tokens(const int32_t *ids, uint32_t n)
{
    cJSON *seg = cJSON_CreateObject(), *arr = cJSON_CreateArray();
    if (!seg || !arr) {
        cJSON_Delete(seg);
        cJSON_Delete(arr);
        return NULL;
    }
    cJSON_AddItemToObject(seg, "tokens", arr);
    for (uint32_t i = 0; i < n; i++) {
        cJSON *x = cJSON_CreateNumber(ids[i]);
        if (!x) {
            cJSON_Delete(seg);
            return NULL;
        }
        cJSON_AddItemToArray(arr, x);
    }
    return seg;
}

static cJSON *enc_str_seg(const char *key, const char *value)
{
    cJSON *seg = cJSON_CreateObject();
    if (seg && !cJSON_AddStringToObject(seg, key, value)) {
        cJSON_Delete(seg);
        return NULL;
    }
    return seg;
}

/* The new manifest line of page i, or NULL with err set. */
static cJSON *enc_page(enc_job *j, size_t i, pd_err *err)
{
    const pages_page *pg = pages_get(j->pg, i);
    cJSON *root = cJSON_CreateObject(), *prefill = cJSON_CreateArray();
    if (!root || !prefill || !cJSON_AddStringToObject(root, "id", pg->id)) {
        cJSON_Delete(root);
        cJSON_Delete(prefill);
        pd_err_set(err, PD_ERR_NOMEM, "no memory");
        return NULL;
    }
    cJSON_AddItemToObject(root, "prefill", prefill);
    pd_status st = PD_OK;
    for (uint32_t s = 0; s < pg->n_segs && st == PD_OK; s++) {
        const pages_seg *sg = &pg->segs[s];
        cJSON *seg = NULL;
        if (sg->kind == PAGES_SEG_TOKENS) {
            seg = enc_tokens(sg->tokens, sg->rows);
        } else if (sg->kind == PAGES_SEG_TEXT) {
            seg = enc_str_seg("text", sg->text);
        } else if (sg->kind == PAGES_SEG_EMBEDDINGS) {
            char abs[PATH_MAX];
            if (!realpath(sg->path, abs)) {
                st = pd_err_set(err, PD_ERR_IO, "prefill[%" PRIu32 "].embeddings: %s: %s", s,
                                sg->path, strerror(errno));
                break;
            }
            seg = enc_str_seg("embeddings", abs);
        } else {
            venc_out vo;
            if ((st = venc_image(j->v, sg->path, false, &vo, err)) != PD_OK) {
                pd_err_prefix(err, "prefill[%" PRIu32 "].image", s);
                break;
            }
            j->images++;
            for (size_t k = 0; k < vo.n_pieces && st == PD_OK; k++) {
                const venc_piece *pc = &vo.pieces[k];
                if (!pc->image) {
                    seg = enc_tokens(pc->tokens, pc->n);
                } else {
                    char rel[96], path[PATH_MAX];
                    snprintf(rel, sizeof rel, "rows/%06zu-%03" PRIu32 "-%02zu.npy", i, s, k);
                    snprintf(path, sizeof path, "%s/%s", j->out_dir, rel);
                    st = npy_write_f32(path, pc->n, j->hidden, pc->rows, err);
                    seg = st == PD_OK ? enc_str_seg("embeddings", rel) : NULL;
                    j->rows += pc->n;
                }
                if (st == PD_OK && !seg)
                    st = pd_err_set(err, PD_ERR_NOMEM, "no memory");
                if (seg)
                    cJSON_AddItemToArray(prefill, seg);
                seg = NULL;
            }
            venc_out_free(&vo);
            continue;
        }
        if (!seg)
            st = pd_err_set(err, PD_ERR_NOMEM, "no memory");
        else
            cJSON_AddItemToArray(prefill, seg);
    }
    if (st == PD_OK && !cJSON_AddNumberToObject(root, "max_new_tokens", pg->max_new_tokens))
        st = pd_err_set(err, PD_ERR_NOMEM, "no memory");
    if (st != PD_OK) {
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

static pd_status enc_put(pd_publish *pub, cJSON *line, pd_err *err)
{
    char *t = cJSON_PrintUnformatted(line);
    if (!t)
        return pd_err_set(err, PD_ERR_NOMEM, "no memory");
    pd_status st = pd_file_publish_write(pub, t, strlen(t), err);
    if (st == PD_OK)
        st = pd_file_publish_write(pub, "\n", 1, err);
    cJSON_free(t);
    return st;
}

static int enc_mkdir(const char *path)
{
    if (mkdir(path, 0755) == 0 || errno == EEXIST) {
        struct stat sb;
        if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode))
            return 0;
        fprintf(stderr, "pipedec encode: %s exists and is not a directory\n", path);
        return -1;
    }
    fprintf(stderr, "pipedec encode: cannot create %s: %s\n", path, strerror(errno));
    return -1;
}

typedef struct encode_args {
    const char *mmproj, *model_path, *pages_path, *out_dir;
    uint32_t threads;
} encode_args;

static pd_status encode_flag(void *ctx, int ch, const char *arg, pd_err *e)
{
    encode_args *a = ctx;
    switch (ch) {
    case 'm': a->mmproj = arg; return PD_OK;
    case 'M': a->model_path = arg; return PD_OK;
    case 'p': a->pages_path = arg; return PD_OK;
    case 'o': a->out_dir = arg; return PD_OK;
    case 't': return cli_u32("--threads", arg, 1, 1024, &a->threads, e);
    default: CHECKF(0, "encode: option code %d without its case", ch);
    }
    return PD_OK;
}

static pd_status encode_check(void *ctx, pd_err *e)
{
    const encode_args *a = ctx;
    const char *missing = !a->mmproj ? "--mmproj" : !a->model_path ? "--model" : !a->pages_path ? "--pages"
                          : !a->out_dir ? "--out" : NULL;
    if (missing)
        return pd_err_set(e, PD_ERR_ARG, "%s is required", missing);
    return PD_OK;
}

static const struct option encode_longopts[] = {
    {"mmproj", required_argument, NULL, 'm'}, {"model", required_argument, NULL, 'M'},
    {"pages", required_argument, NULL, 'p'},  {"out", required_argument, NULL, 'o'},
    {"threads", required_argument, NULL, 't'}, {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};

static const cli_cmd encode_cli = {
    .name = "encode", .opts = encode_longopts, .flag = encode_flag, .check = encode_check, .usage = usage};

int cmd_encode(int argc, char **argv)
{
    encode_args a = {.threads = 2};
    int rc = cli_parse(&encode_cli, argc, argv, &a, stdout, stderr);
    if (rc != CLI_GO)
        return rc;
    const char *mmproj = a.mmproj, *model_path = a.model_path, *pages_path = a.pages_path, *out_dir = a.out_dir;
    const long threads = (long)a.threads;
    pd_err err = {0};
    model_hparams hp;
    if (model_read_hparams(model_path, &hp, &err) != PD_OK) {
        fprintf(stderr, "pipedec encode: %s\n", err.msg);
        return err.status == PD_ERR_IO ? CMD_EXIT_USAGE : CMD_EXIT_INVALID;
    }
    pages *pg = NULL;
    if (pages_load(pages_path, hp.vocab, hp.hidden, NULL, &pg, &err) != PD_OK) {
        fprintf(stderr, "pipedec encode: %s\n", err.msg);
        return err.status == PD_ERR_IO ? CMD_EXIT_USAGE : CMD_EXIT_INVALID;
    }
    venc *v = NULL;
    if (venc_open(&(venc_opts){.mmproj = mmproj, .model = model_path, .threads = (int)threads, .warmup = true}, &v,
                  &err) != PD_OK) {
        fprintf(stderr, "pipedec encode: %s\n", err.msg);
        pages_free(pg);
        return CMD_EXIT_INVALID;
    }
    if (venc_width(v) != hp.hidden) {
        fprintf(stderr, "pipedec encode: the mmproj's rows are %" PRIu32 " wide, the model's hidden "
                "size is %" PRIu32 "\n", venc_width(v), hp.hidden);
        venc_close(v);
        pages_free(pg);
        return CMD_EXIT_INVALID;
    }
    char rows_dir[PATH_MAX], man[PATH_MAX], errs[PATH_MAX];
    snprintf(rows_dir, sizeof rows_dir, "%s/rows", out_dir);
    snprintf(man, sizeof man, "%s/pages.jsonl", out_dir);
    snprintf(errs, sizeof errs, "%s/errors.jsonl", out_dir);
    rc = CMD_EXIT_OK;
    if (enc_mkdir(out_dir) || enc_mkdir(rows_dir)) {
        venc_close(v);
        pages_free(pg);
        return CMD_EXIT_USAGE;
    }
    if (pd_file_same(man, pages_path)) {
        fprintf(stderr, "pipedec encode: %s is the input manifest: refusing to overwrite it\n", man);
        venc_close(v);
        pages_free(pg);
        return CMD_EXIT_USAGE;
    }
    pd_publish *pm = NULL, *pe = NULL;
    pd_status st = pd_file_publish_begin(man, 0644, "encode", &pm, &err);
    if (st == PD_OK)
        st = pd_file_publish_begin(errs, 0644, "encode", &pe, &err);
    enc_job j = {.out_dir = out_dir, .pg = pg, .v = v, .hidden = hp.hidden};
    double t_start = pd_now_s();
    size_t failed = 0;
    for (size_t i = 0; st == PD_OK && i < pages_count(pg); i++) {
        pd_err pe_err = {0};
        cJSON *line = enc_page(&j, i, &pe_err);
        if (line) {
            st = enc_put(pm, line, &err);
            cJSON_Delete(line);
            continue;
        }
        failed++;
        fprintf(stderr, "pipedec encode: page \"%s\": %s\n", pages_get(pg, i)->id, pe_err.msg);
        cJSON *e = cJSON_CreateObject();
        if (!e || !cJSON_AddStringToObject(e, "id", pages_get(pg, i)->id) ||
            !cJSON_AddStringToObject(e, "error", pe_err.msg))
            st = pd_err_set(&err, PD_ERR_NOMEM, "no memory");
        else
            st = enc_put(pe, e, &err);
        cJSON_Delete(e);
    }
    if (st == PD_OK)
        st = pd_file_publish_commit(pe, &err);
    else
        pd_file_publish_abort(pe);
    if (st == PD_OK)
        st = pd_file_publish_commit(pm, &err);
    else
        pd_file_publish_abort(pm);
    if (st != PD_OK) {
        fprintf(stderr, "pipedec encode: %s\n", err.msg);
        rc = CMD_EXIT_USAGE;
    } else {
        fprintf(stderr, "pipedec encode: %zu pages, %" PRIu64 " images, %" PRIu64 " image rows of "
                "%" PRIu32 " -> %s\n", pages_count(pg) - failed, j.images, j.rows, hp.hidden, man);
        double enc_s = 0;
        uint64_t n_img = 0;
        venc_stats(v, &enc_s, &n_img);
        if (n_img)
            fprintf(stderr, "pipedec encode: %.1f ms per image in the encoder graph, %.1f ms per image "
                    "in all (read, decode, preprocess, encode, write), %ld threads\n",
                    1e3 * enc_s / (double)n_img, 1e3 * (pd_now_s() - t_start) / (double)n_img, threads);
        if (failed) {
            fprintf(stderr, "pipedec encode: %zu page(s) failed, listed in %s\n", failed, errs);
            rc = CMD_EXIT_INVALID;
        }
    }
    venc_close(v);
    pages_free(pg);
    return rc;
}
