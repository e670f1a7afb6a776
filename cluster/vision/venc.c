/* venc: page images to prefill rows through llama.cpp's mtmd (see venc.h). */
#include "cluster/vision/venc.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/file.h"
#include "cluster/format/image.h"
#include "cluster/vision/mmproj.h"

void venc_out_free(venc_out *out)
{
    if (!out)
        return;
    for (size_t i = 0; i < out->n_pieces; i++) {
        free(out->pieces[i].tokens);
        free(out->pieces[i].rows);
    }
    free(out->pieces);
    *out = (venc_out){0};
}

#ifndef PD_HAVE_MTMD

bool venc_available(void)
{
    return false;
}

const char *venc_describe(void)
{
    return "built without llama.cpp's mtmd: image pages need it (configure with "
           "-DCMAKE_PREFIX_PATH=<llama.cpp install prefix>, e.g. the one scripts/llama_cpp.sh prints)";
}

pd_status venc_open(const venc_opts *o, venc **out, pd_err *err)
{
    (void)o;
    (void)out;
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "vision encoder: this pipedec was %s",
                      venc_describe());
}

void venc_close(venc *v)
{
    (void)v;
}

uint32_t venc_width(const venc *v)
{
    (void)v;
    return 0;
}

void venc_stats(const venc *v, double *encode_s, uint64_t *images)
{
    (void)v;
    *encode_s = 0;
    *images = 0;
}

pd_status venc_image(venc *v, const char *path, bool count_only, venc_out *out, pd_err *err)
{
    (void)v;
    (void)count_only;
    if (out)
        *out = (venc_out){0};
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "%s: image pages need the vision encoder; this "
                      "pipedec was %s", path ? path : "image", venc_describe());
}

#else

#include <llama.h>
#include <mtmd-helper.h>
#include <mtmd.h>

struct venc {
    struct llama_model *model; /* vocabulary only */
    mtmd_context *ctx;
    uint32_t width;
    char log[512]; /* the last warning or error mtmd / llama logged */
    size_t log_len;
    double encode_s; /* in mtmd_encode_chunk */
    uint64_t images;
};

void venc_stats(const venc *v, double *encode_s, uint64_t *images)
{
    *encode_s = v ? v->encode_s : 0;
    *images = v ? v->images : 0;
}

bool venc_available(void)
{
    return true;
}

const char *venc_describe(void)
{
    return "llama.cpp mtmd " PD_MTMD_VERSION;
}

/* mtmd, ggml and llama log through one callback: pipedec keeps stderr for its
 * own messages, so information is dropped and the last warning or error is
 * kept for the message of a failure. */
static void venc_log(enum ggml_log_level level, const char *text, void *user)
{
    venc *v = user;
    if (!v || !text)
        return;
    if (level == GGML_LOG_LEVEL_ERROR) {
        if (v->log_len && v->log_len + 2 < sizeof v->log) { /* errors since the last reset, in order */
            memcpy(v->log + v->log_len, "; ", 3);
            v->log_len += 2;
        }
    } else if (level != GGML_LOG_LEVEL_CONT || v->log_len == 0) {
        return;
    }
    size_t n = strlen(text);
    if (n > sizeof v->log - 1 - v->log_len)
        n = sizeof v->log - 1 - v->log_len;
    memcpy(v->log + v->log_len, text, n);
    v->log_len += n;
    v->log[v->log_len] = '\0';
    while (v->log_len && (v->log[v->log_len - 1] == '\n' || v->log[v->log_len - 1] == ' '))
        v->log[--v->log_len] = '\0';
}

static const char *venc_last(const venc *v)
{
    return v->log_len ? v->log : "no message from mtmd";
}

static void venc_log_quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)level;
    (void)text;
    (void)user;
}

pd_status venc_open(const venc_opts *o, venc **out, pd_err *err)
{
    if (!o || !o->mmproj || !o->model || !out || o->threads < 1)
        return pd_err_set(err, PD_ERR_ARG, "vision encoder: NULL mmproj, model or output, or "
                          "threads < 1");
    const char *files[2] = {o->mmproj, o->model};
    for (int i = 0; i < 2; i++) {
        int fd;
        uint64_t size;
        pd_status st = pd_file_open_read(files[i], i ? "vision encoder: model" : "vision encoder: mmproj",
                                         &fd, &size, err);
        if (st != PD_OK)
            return st;
        close(fd);
    }
    uint32_t width;
    pd_status wst = mmproj_check(o->mmproj, o->model, &width, err);
    if (wst != PD_OK)
        return wst;
    venc *v = calloc(1, sizeof *v);
    if (!v)
        return pd_err_set(err, PD_ERR_NOMEM, "vision encoder: no memory");
    mtmd_helper_log_set(venc_log, v);
    llama_log_set(venc_log, v);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    v->model = llama_model_load_from_file(o->model, mp);
    if (!v->model) {
        pd_err_set(err, PD_ERR_FORMAT, "vision encoder: %s: llama.cpp cannot read the model "
                   "(metadata and vocabulary): %s", o->model, venc_last(v));
        venc_close(v);
        return PD_ERR_FORMAT;
    }
    struct mtmd_context_params cp = mtmd_context_params_default();
    cp.use_gpu = false;
    cp.print_timings = false;
    cp.n_threads = o->threads;
    cp.warmup = o->warmup;
    v->log_len = 0;
    v->ctx = mtmd_init_from_file(o->mmproj, v->model, cp);
    if (!v->ctx) {
        /* mtmd's message names both widths when they differ */
        pd_err_set(err, strstr(venc_last(v), "mismatch") ? PD_ERR_MISMATCH : PD_ERR_FORMAT,
                   "vision encoder: %s: %s", o->mmproj, venc_last(v));
        venc_close(v);
        return err ? err->status : PD_ERR_FORMAT;
    }
    if (!mtmd_support_vision(v->ctx)) {
        pd_err_set(err, PD_ERR_UNSUPPORTED, "vision encoder: %s: this mmproj has no vision encoder "
                   "(audio only?); image pages need one", o->mmproj);
        venc_close(v);
        return PD_ERR_UNSUPPORTED;
    }
    if (mtmd_decode_use_mrope(v->ctx)) {
        pd_err_set(err, PD_ERR_UNSUPPORTED, "vision encoder: %s: its projector places image rows "
                   "with M-RoPE positions, which pipedec's decoders do not use", o->mmproj);
        venc_close(v);
        return PD_ERR_UNSUPPORTED;
    }
    v->width = width;
    *out = v;
    return PD_OK;
}

void venc_close(venc *v)
{
    if (!v)
        return;
    if (v->ctx)
        mtmd_free(v->ctx);
    if (v->model)
        llama_model_free(v->model);
    mtmd_helper_log_set(venc_log_quiet, NULL);
    llama_log_set(venc_log_quiet, NULL);
    free(v);
}

uint32_t venc_width(const venc *v)
{
    return v ? v->width : 0;
}

/* A JPEG whose bytes stop early still decodes (stb_image fills the rest of
 * the picture): such a page must be refused, not read half grey. */
static pd_status venc_jpeg_complete(const uint8_t *b, size_t len, const char *path, pd_err *err)
{
    size_t from = len > 4096 ? len - 4096 : 0;
    for (size_t i = len; i-- > from + 1;)
        if (b[i - 1] == 0xFF && b[i] == 0xD9)
            return PD_OK;
    return pd_err_set(err, PD_ERR_TRUNCATED, "%s: offset %zu: JPEG has no end-of-image marker "
                      "(FF D9) in its last bytes: truncated?", path, len);
}

/* Turns mtmd's chunks into pieces; encodes the image chunks unless count_only. */
static pd_status venc_pieces(venc *v, const mtmd_input_chunks *chunks, bool count_only,
                             const char *path, venc_out *out, pd_err *err)
{
    size_t n = mtmd_input_chunks_size(chunks);
    out->pieces = calloc(n ? n : 1, sizeof *out->pieces);
    if (!out->pieces)
        return pd_err_set(err, PD_ERR_NOMEM, "%s: no memory", path);
    for (size_t i = 0; i < n; i++) {
        const mtmd_input_chunk *c = mtmd_input_chunks_get(chunks, i);
        venc_piece *pc = &out->pieces[out->n_pieces];
        enum mtmd_input_chunk_type t = mtmd_input_chunk_get_type(c);
        size_t nt = mtmd_input_chunk_get_n_tokens(c);
        if (nt == 0)
            continue;
        if (nt > UINT32_MAX / 2 || (llama_pos)nt != mtmd_input_chunk_get_n_pos(c))
            return pd_err_set(err, PD_ERR_UNSUPPORTED, "%s: chunk %zu: %zu rows at %d positions "
                              "(pipedec places one row per position)", path, i, nt,
                              (int)mtmd_input_chunk_get_n_pos(c));
        if (t == MTMD_INPUT_CHUNK_TYPE_TEXT) {
            size_t k = 0;
            const llama_token *ids = mtmd_input_chunk_get_tokens_text(c, &k);
            pc->tokens = malloc(k * sizeof *pc->tokens);
            if (!pc->tokens)
                return pd_err_set(err, PD_ERR_NOMEM, "%s: no memory", path);
            for (size_t j = 0; j < k; j++)
                pc->tokens[j] = ids[j];
            pc->n = (uint32_t)k;
        } else if (t == MTMD_INPUT_CHUNK_TYPE_IMAGE) {
            if (mtmd_decode_use_non_causal(v->ctx, c))
                return pd_err_set(err, PD_ERR_UNSUPPORTED, "%s: the projector's image rows need "
                                  "non-causal attention, which pipedec's decoders do not do", path);
            pc->image = true;
            pc->n = (uint32_t)nt;
            if (!count_only) {
                size_t cnt = nt * v->width;
                pc->rows = malloc(cnt * sizeof *pc->rows);
                if (!pc->rows)
                    return pd_err_set(err, PD_ERR_NOMEM, "%s: no memory for %zu image rows", path, nt);
                v->log_len = 0;
                double t0 = pd_now_s();
                int rc = mtmd_encode_chunk(v->ctx, c);
                v->encode_s += pd_now_s() - t0;
                if (rc != 0)
                    return pd_err_set(err, PD_ERR_FORMAT, "%s: the vision encoder failed: %s", path,
                                      venc_last(v));
                const float *e = mtmd_get_output_embd(v->ctx);
                memcpy(pc->rows, e, cnt * sizeof *pc->rows);
                for (size_t j = 0; j < cnt; j++)
                    if (!isfinite(pc->rows[j]))
                        return pd_err_set(err, PD_ERR_FORMAT, "%s: the vision encoder gave a "
                                          "non-finite value at image row %zu column %zu", path,
                                          j / v->width, j % v->width);
            }
        } else {
            return pd_err_set(err, PD_ERR_UNSUPPORTED, "%s: the mmproj made an audio chunk of an "
                              "image", path);
        }
        out->rows += pc->n;
        out->n_pieces++;
    }
    if (out->rows == 0)
        return pd_err_set(err, PD_ERR_FORMAT, "%s: the vision encoder made no rows", path);
    v->images += !count_only;
    return PD_OK;
}

pd_status venc_image(venc *v, const char *path, bool count_only, venc_out *out, pd_err *err)
{
    if (!v || !path || !out)
        return pd_err_set(err, PD_ERR_ARG, "vision encoder: NULL encoder, path or output");
    *out = (venc_out){0};
    image_info info;
    pd_status st = image_probe(path, &info, err);
    if (st != PD_OK)
        return st;
    mtmd_bitmap *bm = NULL;
    uint8_t *buf = NULL;
    if (count_only) {
        bm = mtmd_bitmap_init(info.width, info.height, NULL); /* a placeholder: sizes only */
    } else {
        size_t len = 0;
        if ((st = pd_file_read_all(path, NULL, &buf, &len, err)) != PD_OK)
            return st;
        if (info.kind == IMAGE_JPEG && (st = venc_jpeg_complete(buf, len, path, err)) != PD_OK) {
            free(buf);
            return st;
        }
        v->log_len = 0;
        struct mtmd_helper_bitmap_wrapper bw =
            mtmd_helper_bitmap_init_from_buf(v->ctx, buf, len, false, mtmd_helper_init_opt_default());
        free(buf);
        bm = bw.bitmap;
        /* mtmd's helper falls back to video decoding (ffprobe) when stb_image
         * refuses the bytes; its messages about that would only mislead */
        if (!bm)
            return pd_err_set(err, PD_ERR_FORMAT, "%s: cannot decode the %s image: llama.cpp's "
                              "image decoder (stb_image) refused its data: corrupt or truncated",
                              path, image_kind_name(info.kind));
        if (mtmd_bitmap_get_nx(bm) != info.width || mtmd_bitmap_get_ny(bm) != info.height) {
            mtmd_bitmap_free(bm);
            return pd_err_set(err, PD_ERR_FORMAT, "%s: decoded as %" PRIu32 " x %" PRIu32
                              " pixels, its header says %" PRIu32 " x %" PRIu32, path,
                              mtmd_bitmap_get_nx(bm), mtmd_bitmap_get_ny(bm), info.width,
                              info.height);
        }
    }
    if (!bm)
        return pd_err_set(err, PD_ERR_NOMEM, "%s: no memory for the bitmap", path);
    mtmd_input_chunks *chunks = mtmd_input_chunks_init();
    if (!chunks) {
        mtmd_bitmap_free(bm);
        return pd_err_set(err, PD_ERR_NOMEM, "%s: no memory", path);
    }
    const mtmd_input_part part = {.text = NULL, .bitmap = bm};
    const mtmd_input_part *parts[1] = {&part};
    v->log_len = 0;
    int32_t rc = mtmd_tokenize_from_parts(v->ctx, chunks, parts, 1, false);
    if (rc != 0)
        st = pd_err_set(err, PD_ERR_FORMAT, "%s: the vision encoder cannot preprocess the image "
                        "(%d): %s", path, (int)rc, venc_last(v));
    else
        st = venc_pieces(v, chunks, count_only, path, out, err);
    mtmd_input_chunks_free(chunks);
    mtmd_bitmap_free(bm);
    if (st != PD_OK)
        venc_out_free(out);
    return st;
}

#endif
