/* `pipedec inspect FILE [--json] [--legacy]`: tells a CMFS record from a state
 * bundle by its magic, validates it completely (wire_inspect / bundle_parse)
 * and describes it as text or one JSON object. Reads a regular file or
 * standard input, nothing else. Owns nothing beyond the file buffer it reads. */
#include "cluster/cli/cmd.h"

#include "base/file.h"
#include "cluster/format/gguf.h"
#include "cluster/model/model.h"
#include "cluster/runtime/ops/ckpt.h"
#include "cluster/runtime/plan/layermap.h"
#include "cluster/vision/mmproj.h"
#include "comm/bundle.h"
#include "comm/wire.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef enum insp_type { INSP_UNKNOWN = 0, INSP_RECORD, INSP_BUNDLE } insp_type;

static const char *const insp_type_names[] = {"unknown", "record", "bundle"};

/* What one inspection found; the renderers read only this. */
typedef struct insp {
    const char *path;
    insp_type type;
    int valid;
    int have_info;      /* info holds at least a decoded header */
    wire_info info;     /* record */
    bundle_view *view;  /* valid bundle */
    int have_bhdr;      /* bundle header fields below decoded */
    uint32_t b_version, b_layer;
    uint64_t b_identity, b_count;
    size_t bytes;
    pd_err err;
} insp;

static void usage(FILE *f)
{
    fprintf(f, "usage: pipedec inspect FILE|CHECKPOINT_DIR [--json] [--legacy]\n"
               "  Describes and validates a CMFS record or state bundle (docs/wire.md), a GGUF model\n"
               "  (architecture, hyperparameters, bytes by tensor type, default layer maps for 1..8 ranks,\n"
               "  tokenizer, metadata keys pipedec does not use), or a vision projector (mmproj: projector\n"
               "  type, image and patch size, the row width it makes = the decoder hidden size it fits,\n"
               "  bytes by tensor type; headers only, no llama.cpp needed).\n"
               "  --json    print one JSON object (valid, kind, layer, identity, position, error, ...)\n"
               "  --legacy  read a file without the CMFS magic as the unversioned legacy body\n"
               "  FILE may be - for standard input.\n"
               "  exit: 0 valid, 1 invalid (the error names the byte offset), 2 usage or unreadable\n");
}

/* Reads a stream to its end (stdin for "-": a pipe has no size to check
 * first). */
static pd_status read_stream(FILE *f, const char *path, uint8_t **out, size_t *len, pd_err *err)
{
    size_t cap = 1 << 16, n = 0;
    uint8_t *b = malloc(cap);
    while (b) {
        if (n == cap) {
            uint8_t *nb = cap <= SIZE_MAX / 2 ? realloc(b, cap * 2) : NULL;
            if (!nb) {
                free(b);
                b = NULL;
                break;
            }
            b = nb;
            cap *= 2;
        }
        size_t k = fread(b + n, 1, cap - n, f);
        n += k;
        if (k == 0)
            break;
    }
    if (!b)
        return pd_err_set(err, PD_ERR_NOMEM, "cannot read %s: out of memory", path);
    if (ferror(f)) {
        free(b);
        return pd_err_set(err, PD_ERR_IO, "cannot read %s: %s", path, strerror(errno));
    }
    *out = b;
    *len = n;
    return PD_OK;
}

/* Reads the whole file (or stdin for "-"). A path must name a regular file
 * (base/file.h): a fifo would block for a writer and a device such as
 * /dev/zero would be read until memory runs out, so both are refused before
 * anything is read; the size known up front bounds the read. On failure err
 * names the path and nothing is returned. */
static pd_status read_all(const char *path, uint8_t **out, size_t *len, pd_err *err)
{
    if (strcmp(path, "-") == 0)
        return read_stream(stdin, path, out, len, err);
    return pd_file_read_all(path, NULL, out, len, err);
}

static void inspect_bytes(insp *in, const uint8_t *buf, size_t len, int legacy)
{
    in->bytes = len;
    if (len >= 4 && memcmp(buf, BUNDLE_MAGIC, 4) == 0) {
        in->type = INSP_BUNDLE;
        if (len >= BUNDLE_HEADER_BYTES) {
            in->have_bhdr = 1;
            in->b_version = rd_le32(buf + 4);
            in->b_identity = rd_le64(buf + 8);
            in->b_layer = rd_le32(buf + 16);
            in->b_count = rd_le64(buf + 24);
        }
        in->valid = bundle_parse(buf, len, &in->view, &in->err) == PD_OK;
        return;
    }
    if ((len >= 4 && memcmp(buf, WIRE_MAGIC, 4) == 0) || legacy) {
        in->type = INSP_RECORD;
        in->valid = wire_inspect(buf, len, legacy ? WIRE_ALLOW_LEGACY : 0, 0, &in->info, &in->err) ==
                    PD_OK;
        in->have_info = in->valid || wire_header_decode(buf, len, 0, &in->info, NULL) == PD_OK;
        return;
    }
    in->type = INSP_UNKNOWN;
    in->valid = 0;
    if (len < 4)
        pd_err_set(&in->err, PD_ERR_TRUNCATED, "inspect: offset 0: %zu byte(s), too short for a magic",
                   len);
    else
        pd_err_set(&in->err, PD_ERR_FORMAT,
                   "inspect: offset 0: magic %02x %02x %02x %02x is neither a CMFS record nor a "
                   "CMFB bundle",
                   buf[0], buf[1], buf[2], buf[3]);
}

/* The byte offset an error message names ("...offset N: ..."), or -1. */
static long long error_offset(const char *msg)
{
    const char *p = strstr(msg, "offset ");
    if (!p)
        return -1;
    char *end = NULL;
    long long v = strtoll(p + 7, &end, 10);
    return end && *end == ':' ? v : -1;
}

static const char *mode_name(unsigned m)
{
    static const char *const names[] = {"f32", "q8k", "q8v", "q8"};
    return m < 4 ? names[m] : "unknown";
}

/* ---- text ---------------------------------------------------------------- */

static void text_record(FILE *o, const wire_info *i, int full)
{
    if (i->legacy)
        fprintf(o, "kind: %s (legacy unversioned body)\n", wire_kind_name(i->kind));
    else {
        fprintf(o, "kind: %s (%u)\n", wire_kind_name(i->kind), i->kind);
        fprintf(o, "version: %u\n", i->version);
        fprintf(o, "layer: %u\n", i->layer);
        fprintf(o, "identity: %016llx\n", (unsigned long long)i->identity);
    }
    fprintf(o, "position: %llu\n", (unsigned long long)i->position);
    fprintf(o, "dtype: %s\n", i->f16 ? "f16" : "f32");
    if (!full)
        return;
    fprintf(o, "geometry: %u kv heads x %u channels", i->kv_heads, i->head_dim);
    if (i->kind == WIRE_KIND_FULL || i->kind == WIRE_KIND_FULL_TAIL || i->kind == WIRE_KIND_Q8)
        fprintf(o, ", %u holding rows", i->alive_heads);
    fputc('\n', o);
    switch (i->kind) {
    case WIRE_KIND_FULL:
    case WIRE_KIND_FULL_TAIL:
        fprintf(o, "rows: %llu (base %llu)\n", (unsigned long long)i->rows,
                (unsigned long long)i->base);
        fprintf(o, "linear: %llu f32, importance: %llu f32\n", (unsigned long long)i->n_linear,
                (unsigned long long)i->n_importance);
        break;
    case WIRE_KIND_LINEAR:
        fprintf(o, "linear: %llu f32\n", (unsigned long long)i->n_linear);
        break;
    case WIRE_KIND_BOUNDED:
        fprintf(o, "bounded ring: window %u, len %u, head %u\n", i->window, i->ring_len,
                i->ring_pos);
        break;
    case WIRE_KIND_RING:
        fprintf(o, "reference rows: %llu\n", (unsigned long long)i->rows);
        fprintf(o, "ring: window %u, len %u, pos %u, writes %llu, decoding %u, int8 mirror %u\n",
                i->window, i->ring_len, i->ring_pos, (unsigned long long)i->writes, i->decoding,
                i->int8_mirror);
        break;
    case WIRE_KIND_RING_Q8:
        fprintf(o, "reference rows: %llu\n", (unsigned long long)i->rows);
        fprintf(o, "ring: window %u, len %u, pos %u, writes %llu, decoding %u\n", i->window,
                i->ring_len, i->ring_pos, (unsigned long long)i->writes, i->decoding);
        fprintf(o, "storage: %s, k_group %u\n", mode_name(i->mode), i->k_group);
        break;
    case WIRE_KIND_Q8:
        fprintf(o, "rows: %llu (base %llu)\n", (unsigned long long)i->rows,
                (unsigned long long)i->base);
        fprintf(o, "storage: %s, k_group %u, freeze_rows %u, frozen %u\n", mode_name(i->mode),
                i->k_group, i->freeze_rows, i->frozen);
        fprintf(o, "linear: %llu f32, importance: %llu f32\n", (unsigned long long)i->n_linear,
                (unsigned long long)i->n_importance);
        break;
    default:
        break;
    }
}

static void render_text(FILE *o, const insp *in)
{
    fprintf(o, "file: %s\n", in->path);
    fprintf(o, "type: %s\n", insp_type_names[in->type]);
    if (in->type == INSP_RECORD && in->have_info)
        text_record(o, &in->info, in->valid);
    if (in->type == INSP_BUNDLE && in->have_bhdr) {
        fprintf(o, "version: %u\n", in->b_version);
        fprintf(o, "layer: %u\n", in->b_layer);
        fprintf(o, "identity: %016llx\n", (unsigned long long)in->b_identity);
        fprintf(o, "streams: %llu\n", (unsigned long long)in->b_count);
    }
    if (in->view)
        for (uint64_t s = 0; s < in->view->n_streams; s++) {
            const bundle_entry *e = &in->view->entries[s];
            fprintf(o,
                    "stream %llu: kind %s, position %llu, rows %llu, dtype %s, %zu bytes at "
                    "offset %zu\n",
                    (unsigned long long)e->stream, wire_kind_name(e->info.kind),
                    (unsigned long long)e->info.position, (unsigned long long)e->info.rows,
                    e->info.f16 ? "f16" : "f32", e->len, e->offset);
        }
    fprintf(o, "bytes: %zu\n", in->bytes);
    fprintf(o, "valid: %s\n", in->valid ? "yes" : "no");
    if (!in->valid)
        fprintf(o, "error: %s\n", in->err.msg);
}

/* ---- JSON ---------------------------------------------------------------- */

/* Exact 64-bit integers (a JSON number as text, never through a double). */
static void json_u64(cJSON *o, const char *key, uint64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%llu", (unsigned long long)v);
    cJSON_AddRawToObject(o, key, b);
}

static void json_hex(cJSON *o, const char *key, uint64_t v)
{
    char b[32];
    snprintf(b, sizeof b, "%016llx", (unsigned long long)v);
    cJSON_AddStringToObject(o, key, b);
}

static void json_record(cJSON *o, const wire_info *i, int full)
{
    cJSON_AddStringToObject(o, "kind", wire_kind_name(i->kind));
    cJSON_AddNumberToObject(o, "kind_code", i->kind);
    cJSON_AddBoolToObject(o, "legacy", i->legacy);
    if (i->legacy) {
        cJSON_AddNullToObject(o, "version");
        cJSON_AddNullToObject(o, "layer");
        cJSON_AddNullToObject(o, "identity");
    } else {
        cJSON_AddNumberToObject(o, "version", i->version);
        cJSON_AddNumberToObject(o, "layer", i->layer);
        json_hex(o, "identity", i->identity);
    }
    json_u64(o, "position", i->position);
    cJSON_AddStringToObject(o, "dtype", i->f16 ? "f16" : "f32");
    if (!full)
        return;
    cJSON *g = cJSON_AddObjectToObject(o, "geometry");
    cJSON_AddNumberToObject(g, "kv_heads", i->kv_heads);
    cJSON_AddNumberToObject(g, "head_dim", i->head_dim);
    cJSON_AddNumberToObject(g, "heads_holding_rows", i->alive_heads);
    json_u64(o, "rows", i->rows);
    json_u64(o, "base", i->base);
    json_u64(o, "n_linear", i->n_linear);
    json_u64(o, "n_importance", i->n_importance);
    const int ring = i->kind == WIRE_KIND_RING || i->kind == WIRE_KIND_RING_Q8;
    if (ring || i->kind == WIRE_KIND_BOUNDED) {
        cJSON *r = cJSON_AddObjectToObject(o, ring ? "ring" : "bounded");
        cJSON_AddNumberToObject(r, "window", i->window);
        cJSON_AddNumberToObject(r, "len", i->ring_len);
        cJSON_AddNumberToObject(r, ring ? "pos" : "head", i->ring_pos);
        if (ring) {
            json_u64(r, "writes", i->writes);
            cJSON_AddBoolToObject(r, "decoding", i->decoding);
            cJSON_AddBoolToObject(r, "int8_mirror", i->int8_mirror);
            cJSON_AddStringToObject(r, "storage", i->kind == WIRE_KIND_RING_Q8 ? mode_name(i->mode) : "f32");
            if (i->kind == WIRE_KIND_RING_Q8)
                cJSON_AddNumberToObject(r, "k_group", i->k_group);
        }
    }
    if (i->kind == WIRE_KIND_Q8) {
        cJSON *q = cJSON_AddObjectToObject(o, "q8");
        cJSON_AddStringToObject(q, "mode", mode_name(i->mode));
        cJSON_AddNumberToObject(q, "k_group", i->k_group);
        cJSON_AddNumberToObject(q, "freeze_rows", i->freeze_rows);
        cJSON_AddBoolToObject(q, "frozen", i->frozen);
    }
}

static char *render_json(const insp *in)
{
    cJSON *o = cJSON_CreateObject();
    if (!o)
        return NULL;
    cJSON_AddStringToObject(o, "file", in->path);
    cJSON_AddStringToObject(o, "type", insp_type_names[in->type]);
    cJSON_AddBoolToObject(o, "valid", in->valid);
    if (in->type == INSP_RECORD && in->have_info) {
        json_record(o, &in->info, in->valid);
    } else if (in->type == INSP_BUNDLE && in->have_bhdr) {
        cJSON_AddStringToObject(o, "kind", "bundle");
        cJSON_AddNumberToObject(o, "version", in->b_version);
        cJSON_AddNumberToObject(o, "layer", in->b_layer);
        json_hex(o, "identity", in->b_identity);
        cJSON_AddNullToObject(o, "position");
        json_u64(o, "n_streams", in->b_count);
    } else {
        cJSON_AddNullToObject(o, "kind");
        cJSON_AddNullToObject(o, "layer");
        cJSON_AddNullToObject(o, "identity");
        cJSON_AddNullToObject(o, "position");
    }
    if (in->view) {
        cJSON *arr = cJSON_AddArrayToObject(o, "streams");
        for (uint64_t s = 0; s < in->view->n_streams; s++) {
            const bundle_entry *e = &in->view->entries[s];
            cJSON *x = cJSON_CreateObject();
            json_u64(x, "stream", e->stream);
            json_u64(x, "offset", e->offset);
            json_u64(x, "bytes", e->len);
            json_record(x, &e->info, 1);
            cJSON_AddItemToArray(arr, x);
        }
    }
    json_u64(o, "bytes", in->bytes);
    if (in->valid) {
        cJSON_AddNullToObject(o, "error");
        cJSON_AddNullToObject(o, "error_offset");
    } else {
        cJSON_AddStringToObject(o, "error", in->err.msg);
        long long off = error_offset(in->err.msg);
        if (off >= 0)
            json_u64(o, "error_offset", (uint64_t)off);
        else
            cJSON_AddNullToObject(o, "error_offset");
    }
    char *text = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return text;
}

/* ---- command ------------------------------------------------------------- */

/* A checkpoint directory (D/ckpt-SEQ, or D: its newest): every bundle
 * checked against the manifest (ckpt_inspect). */
static int inspect_checkpoint(const char *path, int json, FILE *out, FILE *err)
{
    ckpt_manifest m = {0};
    uint64_t seq = 0;
    pd_err e = {0};
    pd_status st = ckpt_inspect(path, &m, &seq, &e);
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "valid", st == PD_OK);
        cJSON_AddStringToObject(o, "kind", "checkpoint");
        json_u64(o, "seq", seq);
        if (st == PD_OK) {
            json_hex(o, "model_fingerprint", m.model_fp);
            json_hex(o, "manifest_digest", m.pages_digest);
            json_u64(o, "out_bytes", m.out_size);
            json_u64(o, "layers", m.n_layers);
            json_u64(o, "streams", m.n_streams);
            cJSON_AddStringToObject(o, "settings", m.settings);
            cJSON_AddStringToObject(o, "layer_map", m.layer_map);
            cJSON_AddNullToObject(o, "error");
        } else
            cJSON_AddStringToObject(o, "error", e.msg);
        char *t = cJSON_PrintUnformatted(o);
        if (t)
            fprintf(out, "%s\n", t);
        cJSON_free(t);
        cJSON_Delete(o);
    } else if (st == PD_OK) {
        fprintf(out, "kind: checkpoint\nseq: %llu\nlayers: %u\nstreams: %u\nout_bytes: %llu\n"
                     "model_fingerprint: %016llx\nmanifest_digest: %016llx\nsettings: %s\nlayer_map: %s\n",
                (unsigned long long)seq, m.n_layers, m.n_streams, (unsigned long long)m.out_size,
                (unsigned long long)m.model_fp, (unsigned long long)m.pages_digest, m.settings, m.layer_map);
        for (uint32_t i = 0; i < m.n_streams; i++)
            fprintf(out, "stream %llu: page \"%s\", %llu of %llu prefill rows, %u tokens\n",
                    (unsigned long long)m.streams[i].id, m.streams[i].page_id,
                    (unsigned long long)m.streams[i].fed, (unsigned long long)m.streams[i].prefill_rows,
                    m.streams[i].n_tokens);
        fprintf(out, "valid: yes\n");
    }
    if (st)
        fprintf(err, "pipedec inspect: %s: invalid: %s\n", path, e.msg);
    ckpt_manifest_free(&m);
    return st ? CMD_EXIT_INVALID : CMD_EXIT_OK;
}

/* ---- GGUF models ---- */

/* Bytes and tensor counts by ggml type (arrays of GGUF_TENSOR_TYPE_COUNT,
 * filled); returns the bytes of all tensors. */
static uint64_t tensors_by_type(const gguf_file *f, uint64_t *by_bytes, uint64_t *by_count)
{
    uint64_t total = 0;
    memset(by_bytes, 0, GGUF_TENSOR_TYPE_COUNT * sizeof *by_bytes);
    memset(by_count, 0, GGUF_TENSOR_TYPE_COUNT * sizeof *by_count);
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (t->type < GGUF_TENSOR_TYPE_COUNT) {
            by_bytes[t->type] += t->bytes;
            by_count[t->type]++;
        }
        total += t->bytes;
    }
    return total;
}

static void json_by_type(cJSON *o, const gguf_file *f, uint64_t total, const uint64_t *by_bytes,
                         const uint64_t *by_count)
{
    json_u64(o, "tensor_count", gguf_tensor_count(f));
    json_u64(o, "tensor_bytes", total);
    cJSON *bt = cJSON_AddArrayToObject(o, "by_type");
    for (uint32_t t = 0; t < GGUF_TENSOR_TYPE_COUNT; t++)
        if (by_count[t]) {
            cJSON *x = cJSON_CreateObject();
            cJSON_AddStringToObject(x, "type", gguf_type_name(t));
            json_u64(x, "tensors", by_count[t]);
            json_u64(x, "bytes", by_bytes[t]);
            cJSON_AddBoolToObject(x, "supported", gguf_type_supported(t));
            cJSON_AddItemToArray(bt, x);
        }
}

static void text_by_type(FILE *out, const gguf_file *f, uint64_t total, const uint64_t *by_bytes,
                         const uint64_t *by_count)
{
    fprintf(out, "tensors: %llu, %llu bytes\n", (unsigned long long)gguf_tensor_count(f), (unsigned long long)total);
    for (uint32_t t = 0; t < GGUF_TENSOR_TYPE_COUNT; t++)
        if (by_count[t])
            fprintf(out, "  %-8s %6llu tensors %14llu bytes%s\n", gguf_type_name(t), (unsigned long long)by_count[t],
                    (unsigned long long)by_bytes[t], gguf_type_supported(t) ? "" : "  (not supported)");
}

/* A vision projector (mmproj_is): what the header says, and whether pipedec
 * can use it (a DeepSeek-OCR projector with its mm.model.fc.weight). The
 * tensors' bytes are never read: gguf_open checked that they lie inside the
 * file. */
static int inspect_mmproj(const char *path, const gguf_file *f, int json, FILE *out, FILE *err)
{
    mmproj_info m;
    pd_err e = {0};
    const pd_status st = mmproj_describe(f, path, &m, &e);
    uint64_t by_bytes[GGUF_TENSOR_TYPE_COUNT], by_count[GGUF_TENSOR_TYPE_COUNT];
    const uint64_t total = tensors_by_type(f, by_bytes, by_count);
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "valid", st == PD_OK);
        cJSON_AddStringToObject(o, "kind", "mmproj");
        cJSON_AddStringToObject(o, "projector_type", m.projector);
        cJSON_AddBoolToObject(o, "has_vision_encoder", m.has_vision);
        json_u64(o, "image_size", m.image_size);
        json_u64(o, "patch_size", m.patch_size);
        json_u64(o, "embedding_width", m.width);   /* mm.model.fc.weight ne[1] */
        json_u64(o, "fits_decoder_hidden", m.width);
        json_u64(o, "projector_input", m.fc_in);
        cJSON *c = cJSON_AddObjectToObject(o, "clip");
        json_u64(c, "width", m.clip_width);
        json_u64(c, "layers", m.clip_layers);
        json_u64(c, "heads", m.clip_heads);
        cJSON *sm = cJSON_AddObjectToObject(o, "sam");
        json_u64(sm, "width", m.sam_width);
        json_u64(sm, "layers", m.sam_layers);
        json_u64(sm, "heads", m.sam_heads);
        json_u64(sm, "window", m.window);
        json_by_type(o, f, total, by_bytes, by_count);
        json_u64(o, "bytes", gguf_file_size(f));
        if (st == PD_OK)
            cJSON_AddNullToObject(o, "error");
        else
            cJSON_AddStringToObject(o, "error", e.msg);
        char *t = cJSON_PrintUnformatted(o);
        if (t)
            fprintf(out, "%s\n", t);
        cJSON_free(t);
        cJSON_Delete(o);
    } else {
        fprintf(out, "kind: mmproj (vision projector)\nprojector: %s%s\n", m.projector[0] ? m.projector : "(none)",
                m.known ? " (DeepSeek-OCR)" : "");
        fprintf(out, "vision encoder: %s\n", m.has_vision ? "yes" : "no");
        fprintf(out, "image size: %u, patch size: %u%s\n", m.image_size, m.patch_size,
                strcmp(m.projector, "deepseekocr") == 0
                    ? " (as written; llama.cpp's clip uses 1024 and 16 for deepseekocr, and 640 x 640 tiles)"
                    : "");
        if (m.sam_layers || m.sam_width)
            fprintf(out, "sam: %u layers x %u (%u heads), window %u\n", m.sam_layers, m.sam_width, m.sam_heads,
                    m.window);
        fprintf(out, "clip: %u layers x %u (%u heads)\n", m.clip_layers, m.clip_width, m.clip_heads);
        if (m.width)
            fprintf(out, "rows: %llu wide (mm.model.fc.weight, from %llu): fits a decoder of hidden size %llu\n",
                    (unsigned long long)m.width, (unsigned long long)m.fc_in, (unsigned long long)m.width);
        text_by_type(out, f, total, by_bytes, by_count);
        fprintf(out, "bytes: %llu\n", (unsigned long long)gguf_file_size(f));
        fprintf(out, "valid: %s\n", st == PD_OK ? "yes" : "no");
    }
    if (st != PD_OK)
        fprintf(err, "pipedec inspect: %s: invalid: %s\n", path, e.msg);
    return st == PD_OK ? CMD_EXIT_OK : CMD_EXIT_INVALID;
}

/* The metadata keys pipedec reads (the architecture's own under "<arch>."). */
static int gguf_key_used(const char *key, const char *arch)
{
    static const char *const general[] = {
        "general.architecture", "general.alignment", "tokenizer.ggml.model", "tokenizer.ggml.tokens",
        "tokenizer.ggml.token_type", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    };
    static const char *const per_arch[] = {
        "block_count", "embedding_length", "feed_forward_length", "attention.head_count",
        "attention.head_count_kv", "context_length", "rope.freq_base", "attention.layer_norm_rms_epsilon",
        "leading_dense_block_count", "expert_count", "expert_used_count", "expert_shared_count",
        "expert_feed_forward_length", "expert_weights_scale", "expert_weights_norm", "expert_gating_func",
        "rope.scaling.factor", "rope.scaling.type", "rope.scaling.attn_factor",
    };
    for (size_t i = 0; i < sizeof general / sizeof general[0]; i++)
        if (!strcmp(key, general[i]))
            return 1;
    size_t al = strlen(arch);
    if (al == 0 || strncmp(key, arch, al) != 0 || key[al] != '.')
        return 0;
    for (size_t i = 0; i < sizeof per_arch / sizeof per_arch[0]; i++)
        if (!strcmp(key + al + 1, per_arch[i]))
            return 1;
    return 0;
}

/* A valid model's hyperparameters and tokenizer, into the JSON object o. */
static void insp_json_hparams(cJSON *o, const model_hparams *hp)
{
    cJSON *h = cJSON_AddObjectToObject(o, "hparams");
    json_u64(h, "block_count", hp->n_layers);
    json_u64(h, "embedding_length", hp->hidden);
    json_u64(h, "head_count", hp->n_heads);
    json_u64(h, "head_count_kv", hp->n_kv_heads);
    json_u64(h, "head_dim", hp->head_dim);
    json_u64(h, "feed_forward_length", hp->ffn);
    json_u64(h, "context_length", hp->ctx);
    cJSON_AddNumberToObject(h, "rope_freq_base", hp->rope_base);
    cJSON_AddStringToObject(h, "rope", hp->rope == MODEL_ROPE_NEOX ? "neox" : "norm");
    cJSON_AddNumberToObject(h, "rms_eps", hp->rms_eps);
    if (hp->arch == MODEL_ARCH_DEEPSEEK2_OCR) {
        static const char *const sn[MODEL_ROPE_SCALING_COUNT] = {"none", "linear", "yarn"};
        cJSON_AddStringToObject(h, "rope_scaling_type", sn[hp->rope_scaling]);
        cJSON_AddNumberToObject(h, "rope_scaling_factor", hp->rope_scaling_factor);
        cJSON_AddNumberToObject(h, "rope_scaling_attn_factor", hp->rope_scaling_attn_factor);
        json_u64(h, "rope_scaling_original_context_length", hp->rope_scaling_orig_ctx);
        cJSON_AddNumberToObject(h, "kq_mscale2", hp->kq_mul); /* kq_scale = this / sqrt(head_dim) */
    }
    cJSON_AddBoolToObject(h, "tied_output", hp->tied_output);
    cJSON_AddBoolToObject(h, "qkv_bias", hp->qkv_bias);
    if (model_arch_is_moe(hp->arch)) {
        json_u64(h, "leading_dense_block_count", hp->n_dense_lead);
        json_u64(h, "expert_count", hp->n_expert);
        json_u64(h, "expert_used_count", hp->n_expert_used);
        json_u64(h, "expert_shared_count", hp->n_expert_shared);
        json_u64(h, "expert_feed_forward_length", hp->ffn_exp);
        cJSON_AddNumberToObject(h, "expert_weights_scale", hp->expert_weights_scale);
        cJSON_AddBoolToObject(h, "expert_weights_norm", hp->expert_weights_norm);
        cJSON_AddStringToObject(h, "expert_gating_func", hp->moe_gating == MODEL_MOE_SIGMOID ? "sigmoid" : "softmax");
        cJSON_AddBoolToObject(h, "exp_probs_b", hp->has_exp_probs_b);
    }
    cJSON_AddStringToObject(h, "assumed", hp->assumed);
    cJSON *tk = cJSON_AddObjectToObject(o, "tokenizer");
    cJSON_AddStringToObject(tk, "model", hp->vocab_kind == MODEL_VOCAB_GPT2 ? "gpt2" : "llama");
    json_u64(tk, "size", hp->vocab);
    json_u64(tk, "bos_token_id", hp->bos);
    json_u64(tk, "eos_token_id", hp->eos);
}

/* A valid model's hyperparameters and tokenizer, as text. */
static void insp_text_hparams(FILE *out, const model_hparams *hp)
{
    fprintf(out, "layers: %u\nhidden: %u\nheads: %u x %u (kv heads %u)\nffn: %u\ncontext: %u\n"
                 "rope: %s, base %g\nrms_eps: %g\noutput: %s\n",
            hp->n_layers, hp->hidden, hp->n_heads, hp->head_dim, hp->n_kv_heads, hp->ffn, hp->ctx,
            hp->rope == MODEL_ROPE_NEOX ? "neox" : "norm", (double)hp->rope_base, (double)hp->rms_eps,
            hp->tied_output ? "tied to token_embd" : "output.weight");
    if (hp->arch == MODEL_ARCH_DEEPSEEK2_OCR && hp->kq_mul != 1.0f)
        fprintf(out, "rope scaling: %s, factor %g (rope unchanged; scores x mscale^2 = %.6g)\n",
                hp->rope_scaling == MODEL_ROPE_SCALING_YARN     ? "yarn"
                : hp->rope_scaling == MODEL_ROPE_SCALING_LINEAR ? "linear"
                                                               : "none",
                (double)hp->rope_scaling_factor, (double)hp->kq_mul);
    if (model_arch_is_moe(hp->arch))
        fprintf(out, "moe: %u dense layers, %u experts (top %u) of ffn %u, %u shared, gating %s, norm %s, "
                     "scale %g%s\n",
                hp->n_dense_lead, hp->n_expert, hp->n_expert_used, hp->ffn_exp, hp->n_expert_shared,
                hp->moe_gating == MODEL_MOE_SIGMOID ? "sigmoid" : "softmax", hp->expert_weights_norm ? "yes" : "no",
                (double)hp->expert_weights_scale, hp->has_exp_probs_b ? ", selection bias" : "");
    fprintf(out, "tokenizer: %s, %u tokens, bos %u, eos %u\n", hp->vocab_kind == MODEL_VOCAB_GPT2 ? "gpt2" : "llama",
            hp->vocab, hp->bos, hp->eos);
    if (hp->assumed[0])
        fprintf(out, "assumed: %s\n", hp->assumed);
}

#define INSP_MAX_RANKS 8u

static int inspect_gguf(const char *path, int json, FILE *out, FILE *err)
{
    pd_err e = {0};
    gguf_file *f = NULL;
    if (gguf_open(path, &f, &e) != PD_OK) {
        if (json) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddBoolToObject(o, "valid", 0);
            cJSON_AddStringToObject(o, "kind", "gguf");
            cJSON_AddStringToObject(o, "error", e.msg);
            char *t = cJSON_PrintUnformatted(o);
            if (t)
                fprintf(out, "%s\n", t);
            cJSON_free(t);
            cJSON_Delete(o);
        }
        fprintf(err, "pipedec inspect: %s: invalid: %s\n", path, e.msg);
        return CMD_EXIT_INVALID;
    }
    if (mmproj_is(f)) {
        int rc = inspect_mmproj(path, f, json, out, err);
        gguf_close(f);
        return rc;
    }
    model_hparams hp;
    pd_err he = {0};
    pd_status hst = model_read_hparams(path, &hp, &he);
    const char *arch = "";
    size_t alen = 0;
    char archz[64] = "";
    pd_err ae = {0};
    if (gguf_get_str(f, "general.architecture", &arch, &alen, &ae) == PD_OK && alen < sizeof archz) {
        memcpy(archz, arch, alen);
        archz[alen] = '\0';
    }
    /* bytes and tensor counts by type */
    uint64_t by_bytes[GGUF_TENSOR_TYPE_COUNT], by_count[GGUF_TENSOR_TYPE_COUNT];
    const uint64_t total = tensors_by_type(f, by_bytes, by_count);
    /* default layer maps */
    char maps[INSP_MAX_RANKS][256];
    for (uint32_t n = 1; n <= INSP_MAX_RANKS; n++) {
        layermap lm;
        pd_err le = {0};
        maps[n - 1][0] = '\0';
        if (hst != PD_OK || n > hp.n_layers)
            continue;
        /* the cost table reads every tensor's shape and type: a missing
         * tensor or a shape the keys disagree with shows here */
        pd_status ls = layermap_for_model(path, n, NULL, NULL, &lm, &le);
        if (ls == PD_OK)
            layermap_format(&lm, maps[n - 1], sizeof maps[n - 1]);
        else if (n == 1) {
            hst = ls;
            he = le;
        }
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddBoolToObject(o, "valid", hst == PD_OK);
    cJSON_AddStringToObject(o, "kind", "gguf");
    cJSON_AddStringToObject(o, "architecture", archz);
    if (hst == PD_OK)
        insp_json_hparams(o, &hp);
    json_by_type(o, f, total, by_bytes, by_count);
    cJSON *lmj = cJSON_AddObjectToObject(o, "default_layer_maps");
    for (uint32_t n = 1; n <= INSP_MAX_RANKS; n++)
        if (maps[n - 1][0]) {
            char k[8];
            snprintf(k, sizeof k, "%u", n);
            cJSON_AddStringToObject(lmj, k, maps[n - 1]);
        }
    cJSON *uk = cJSON_AddArrayToObject(o, "unused_keys");
    for (uint64_t i = 0; i < gguf_kv_count(f); i++) {
        const gguf_kv_info *kv = gguf_kv_at(f, i);
        if (!gguf_key_used(kv->key, archz))
            cJSON_AddItemToArray(uk, cJSON_CreateString(kv->key));
    }
    if (hst == PD_OK)
        cJSON_AddNullToObject(o, "error");
    else
        cJSON_AddStringToObject(o, "error", he.msg);
    if (json) {
        char *t = cJSON_PrintUnformatted(o);
        if (t)
            fprintf(out, "%s\n", t);
        cJSON_free(t);
    } else {
        fprintf(out, "kind: gguf\narchitecture: %s\n", archz);
        if (hst == PD_OK)
            insp_text_hparams(out, &hp);
        text_by_type(out, f, total, by_bytes, by_count);
        for (uint32_t n = 1; n <= INSP_MAX_RANKS; n++)
            if (maps[n - 1][0])
                fprintf(out, "layers over %u rank%s: %s\n", n, n == 1 ? "" : "s", maps[n - 1]);
        int any = 0;
        for (uint64_t i = 0; i < gguf_kv_count(f); i++) {
            const gguf_kv_info *kv = gguf_kv_at(f, i);
            if (!gguf_key_used(kv->key, archz)) {
                fprintf(out, "%s%s", any ? ", " : "unused keys: ", kv->key);
                any = 1;
            }
        }
        if (any)
            fprintf(out, "\n");
        fprintf(out, "valid: %s\n", hst == PD_OK ? "yes" : "no");
    }
    cJSON_Delete(o);
    gguf_close(f);
    if (hst != PD_OK)
        fprintf(err, "pipedec inspect: %s: invalid: %s\n", path, he.msg);
    return hst == PD_OK ? CMD_EXIT_OK : CMD_EXIT_INVALID;
}

/* 1 when the file at path starts with the GGUF magic. */
static int is_gguf(const char *path)
{
    FILE *f = strcmp(path, "-") ? fopen(path, "rb") : NULL;
    if (!f)
        return 0;
    char m[4] = {0};
    size_t n = fread(m, 1, 4, f);
    fclose(f);
    return n == 4 && memcmp(m, "GGUF", 4) == 0;
}

int cmd_inspect_run(int argc, char **argv, FILE *out, FILE *err)
{
    const char *path = NULL;
    int json = 0, legacy = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0)
            json = 1;
        else if (strcmp(a, "--legacy") == 0)
            legacy = 1;
        else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
            usage(out);
            return CMD_EXIT_OK;
        } else if (a[0] == '-' && a[1] != '\0') {
            fprintf(err, "pipedec inspect: unknown option '%s'\n", a);
            usage(err);
            return CMD_EXIT_USAGE;
        } else if (path) {
            fprintf(err, "pipedec inspect: one FILE only ('%s' and '%s')\n", path, a);
            return CMD_EXIT_USAGE;
        } else
            path = a;
    }
    if (!path) {
        fprintf(err, "pipedec inspect: missing FILE\n");
        usage(err);
        return CMD_EXIT_USAGE;
    }
    struct stat sb;
    char mpath[4200];
    snprintf(mpath, sizeof mpath, "%s/manifest.pdck", path);
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode) && (access(mpath, F_OK) == 0 || ckpt_newest(path) > 0))
        return inspect_checkpoint(path, json, out, err);
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && is_gguf(path))
        return inspect_gguf(path, json, out, err);
    insp in = {.path = path};
    uint8_t *buf = NULL;
    size_t len = 0;
    if (read_all(path, &buf, &len, &in.err) != PD_OK) {
        if (json) {
            char *t = render_json(&in);
            if (t)
                fprintf(out, "%s\n", t);
            cJSON_free(t);
        }
        fprintf(err, "pipedec inspect: %s\n", in.err.msg);
        return CMD_EXIT_USAGE;
    }
    inspect_bytes(&in, buf, len, legacy);
    int rc = in.valid ? CMD_EXIT_OK : CMD_EXIT_INVALID;
    if (json) {
        char *t = render_json(&in);
        if (!t) {
            fprintf(err, "pipedec inspect: out of memory\n");
            rc = CMD_EXIT_USAGE;
        } else
            fprintf(out, "%s\n", t);
        cJSON_free(t);
    } else
        render_text(out, &in);
    if (!in.valid)
        fprintf(err, "pipedec inspect: %s: invalid: %s\n", path, in.err.msg);
    bundle_view_free(in.view);
    free(buf);
    return rc;
}

int cmd_inspect(int argc, char **argv) { return cmd_inspect_run(argc, argv, stdout, stderr); }
