/* fromweights: trained weights directory -> GGUF (fromweights.h). */
#include "cluster/cli/fromweights.h"

#include "base/file.h"
#include "base/fp16.h"
#include "cluster/cli/ocrmeta.h"
#include "cluster/format/gguf.h"
#include "cluster/format/npy.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fw_cfg {
    uint32_t layers, hidden, heads, kv_heads, ffn, ctx, cells;
    float rope_base, rms_eps;
    int32_t prompt[RENDER_MAX_PROMPT];
    uint32_t n_prompt;
    char name[128];
} fw_cfg;

typedef struct fw_ctx {
    const char *dir;
    int f16;
    gguf_writer *w;
    void **bufs;
    size_t n_bufs;
} fw_ctx;

static pd_status fw_u32(const cJSON *root, const char *key, uint32_t lo, uint32_t hi, uint32_t *out, pd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < lo || v->valuedouble > hi)
        return pd_err_set(err, PD_ERR_FORMAT, "config.json: \"%s\" must be an integer in %u..%u", key, lo, hi);
    *out = (uint32_t)v->valuedouble;
    return PD_OK;
}

static pd_status fw_f32(const cJSON *root, const char *key, double lo, double hi, float *out, pd_err *err)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return pd_err_set(err, PD_ERR_FORMAT, "config.json: \"%s\" must be a number in [%g, %g]", key, lo, hi);
    *out = (float)v->valuedouble;
    return PD_OK;
}

static pd_status fw_config(const char *dir, fw_cfg *c, pd_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    uint8_t *text = NULL;
    size_t len = 0;
    pd_status st = pd_file_read_all(path, NULL, &text, &len, err);
    if (st != PD_OK)
        return st;
    cJSON *root = cJSON_ParseWithLength((const char *)text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return pd_err_set(err, PD_ERR_FORMAT, "%s: not a JSON object", path);
    }
    memset(c, 0, sizeof *c);
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "arch");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(root, "vocab");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "ocr_prompt");
    if (!cJSON_IsString(arch) || strcmp(arch->valuestring, "llama") != 0)
        st = pd_err_set(err, PD_ERR_UNSUPPORTED, "config.json: \"arch\" must be \"llama\"");
    else if (!cJSON_IsString(vocab) || strcmp(vocab->valuestring, "bytes") != 0)
        st = pd_err_set(err, PD_ERR_UNSUPPORTED, "config.json: \"vocab\" must be \"bytes\"");
    if (st == PD_OK)
        (void)((st = fw_u32(root, "layers", 1, 256, &c->layers, err)) ||
         (st = fw_u32(root, "hidden", 2, 8192, &c->hidden, err)) ||
         (st = fw_u32(root, "heads", 1, 256, &c->heads, err)) ||
         (st = fw_u32(root, "kv_heads", 1, 256, &c->kv_heads, err)) ||
         (st = fw_u32(root, "ffn", 1, 65536, &c->ffn, err)) || (st = fw_u32(root, "ctx", 16, 1u << 20, &c->ctx, err)) ||
         (st = fw_u32(root, "ocr_cells", 1, 1u << 16, &c->cells, err)) ||
         (st = fw_f32(root, "rope_base", 1.0001, 1e9, &c->rope_base, err)) ||
         (st = fw_f32(root, "rms_eps", 1e-12, 1.0, &c->rms_eps, err)));
    if (st == PD_OK && (c->heads % c->kv_heads || c->hidden % c->heads || (c->hidden / c->heads) % 2))
        st = pd_err_set(err, PD_ERR_FORMAT,
                        "config.json: hidden %u must split into heads %u of an even size, heads a multiple of kv_heads %u",
                        c->hidden, c->heads, c->kv_heads);
    if (st == PD_OK) {
        int n = cJSON_GetArraySize(prompt);
        if (!cJSON_IsArray(prompt) || n > RENDER_MAX_PROMPT)
            st = pd_err_set(err, PD_ERR_FORMAT, "config.json: \"ocr_prompt\" must be an array of at most %u tokens",
                            RENDER_MAX_PROMPT);
        for (int i = 0; st == PD_OK && i < n; i++) {
            const cJSON *t = cJSON_GetArrayItem(prompt, i);
            if (!cJSON_IsNumber(t) || t->valuedouble != floor(t->valuedouble) || t->valuedouble < 0 ||
                t->valuedouble >= FROMWEIGHTS_VOCAB)
                st = pd_err_set(err, PD_ERR_FORMAT, "config.json: ocr_prompt[%d] is not a token id below %u", i,
                                FROMWEIGHTS_VOCAB);
            else
                c->prompt[c->n_prompt++] = (int32_t)t->valuedouble;
        }
    }
    snprintf(c->name, sizeof c->name, "%s", cJSON_IsString(name) ? name->valuestring : "pipedec ocr");
    cJSON_Delete(root);
    return st;
}

/* Reads DIR/<name>.npy, checks its shape [rows, cols] and values, and adds it
 * as a tensor (a vector when rows == 1 and !matrix). */
static pd_status fw_tensor(fw_ctx *c, const char *name, uint64_t rows, uint64_t cols, int matrix, pd_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.npy", c->dir, name);
    npy_info info;
    pd_status st = npy_probe(path, &info, err);
    if (st != PD_OK)
        return st;
    if (info.rows != rows || info.cols != cols)
        return pd_err_set(err, PD_ERR_MISMATCH, "%s: shape [%llu, %llu], the config needs [%llu, %llu]", path,
                          (unsigned long long)info.rows, (unsigned long long)info.cols, (unsigned long long)rows,
                          (unsigned long long)cols);
    uint64_t n = rows * cols;
    float *v = malloc(n * sizeof *v);
    void **nb = realloc(c->bufs, (c->n_bufs + 1) * sizeof *nb);
    if (!v || !nb) {
        free(v);
        if (nb)
            c->bufs = nb;
        return pd_err_set(err, PD_ERR_NOMEM, "mkmodel --from-weights: out of memory for %s", name);
    }
    c->bufs = nb;
    c->bufs[c->n_bufs++] = v;
    if ((st = npy_read_into(path, v, n, NULL, err)))
        return st;
    for (uint64_t i = 0; i < n; i++)
        if (!isfinite(v[i]))
            return pd_err_set(err, PD_ERR_FORMAT, "%s: element %llu is not finite", path, (unsigned long long)i);
    uint32_t type = GGUF_TENSOR_F32;
    if (matrix && c->f16) {
        uint16_t *h = (uint16_t *)v; /* in place: element i is read before h[i] overwrites its half */
        for (uint64_t i = 0; i < n; i++)
            h[i] = pd_f32_to_f16(v[i]);
        type = GGUF_TENSOR_F16;
    }
    uint64_t ne[2] = {cols, rows};
    st = gguf_writer_add_tensor(c->w, name, type, matrix ? 2 : 1, ne, v);
    if (st)
        return pd_err_set(err, st, "mkmodel --from-weights: cannot add tensor %s", name);
    return PD_OK;
}

/* GPT-2's bytes_to_unicode piece of byte b (UTF-8, NUL-terminated). */
static void fw_byte_piece(uint32_t b, char out[4])
{
    uint32_t cp = b;
    int printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    if (!printable) {
        uint32_t k = 0;
        for (uint32_t x = 0; x < b; x++)
            k += !((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255));
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

pd_status fromweights_write(const char *dir, int f16, const char *out_path, pd_err *err)
{
    fw_cfg cfg;
    pd_status st = fw_config(dir, &cfg, err);
    if (st != PD_OK)
        return st;
    fw_ctx c = {.dir = dir, .f16 = f16, .w = gguf_writer_new()};
    if (!c.w)
        return pd_err_set(err, PD_ERR_NOMEM, "mkmodel --from-weights: out of memory");
    gguf_writer *w = c.w;
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "general.name", cfg.name);
    gguf_writer_set_u32(w, "general.alignment", 32);
    gguf_writer_set_u32(w, "llama.block_count", cfg.layers);
    gguf_writer_set_u32(w, "llama.embedding_length", cfg.hidden);
    gguf_writer_set_u32(w, "llama.feed_forward_length", cfg.ffn);
    gguf_writer_set_u32(w, "llama.attention.head_count", cfg.heads);
    gguf_writer_set_u32(w, "llama.attention.head_count_kv", cfg.kv_heads);
    gguf_writer_set_u32(w, "llama.context_length", cfg.ctx);
    gguf_writer_set_f32(w, "llama.rope.freq_base", cfg.rope_base);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", cfg.rms_eps);
    gguf_writer_set_u32(w, OCRMETA_KEY_CELLS, cfg.cells);
    gguf_writer_set_arr_i32(w, OCRMETA_KEY_PROMPT, cfg.prompt, cfg.n_prompt);
    char pieces[256][4];
    const char *toks[FROMWEIGHTS_VOCAB];
    int32_t types[FROMWEIGHTS_VOCAB];
    for (uint32_t b = 0; b < 256; b++) {
        fw_byte_piece(b, pieces[b]);
        toks[b] = pieces[b];
        types[b] = 1;
    }
    toks[FROMWEIGHTS_BOS] = "<|bos|>";
    toks[FROMWEIGHTS_EOS] = "<|endoftext|>";
    types[FROMWEIGHTS_BOS] = types[FROMWEIGHTS_EOS] = 3;
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, FROMWEIGHTS_VOCAB);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, FROMWEIGHTS_VOCAB);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", FROMWEIGHTS_BOS);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", FROMWEIGHTS_EOS);

    const uint64_t H = cfg.hidden, V = FROMWEIGHTS_VOCAB, F = cfg.ffn, hd = cfg.hidden / cfg.heads;
    const uint64_t qd = cfg.heads * hd, kvd = cfg.kv_heads * hd;
    st = fw_tensor(&c, "token_embd.weight", V, H, 1, err);
    for (uint32_t L = 0; st == PD_OK && L < cfg.layers; L++) {
        char n[96];
#define T(s) (snprintf(n, sizeof n, "blk.%u." s, L), n)
        if ((st = fw_tensor(&c, T("attn_norm.weight"), 1, H, 0, err)) ||
            (st = fw_tensor(&c, T("attn_q.weight"), qd, H, 1, err)) ||
            (st = fw_tensor(&c, T("attn_k.weight"), kvd, H, 1, err)) ||
            (st = fw_tensor(&c, T("attn_v.weight"), kvd, H, 1, err)) ||
            (st = fw_tensor(&c, T("attn_output.weight"), H, qd, 1, err)) ||
            (st = fw_tensor(&c, T("ffn_norm.weight"), 1, H, 0, err)) ||
            (st = fw_tensor(&c, T("ffn_gate.weight"), F, H, 1, err)) ||
            (st = fw_tensor(&c, T("ffn_up.weight"), F, H, 1, err)) ||
            (st = fw_tensor(&c, T("ffn_down.weight"), H, F, 1, err)))
            break;
#undef T
    }
    if (st == PD_OK)
        st = fw_tensor(&c, "output_norm.weight", 1, H, 0, err);
    if (st == PD_OK)
        st = fw_tensor(&c, "output.weight", V, H, 1, err);
    if (st == PD_OK)
        st = gguf_writer_write(w, out_path, err);
    gguf_writer_free(w);
    for (size_t i = 0; i < c.n_bufs; i++)
        free(c.bufs[i]);
    free(c.bufs);
    return st;
}
