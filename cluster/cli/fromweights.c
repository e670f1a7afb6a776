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

/* Routed experts per layer the loader takes (model.c's MODEL_MAX_EXPERTS). */
#define FW_MAX_EXPERTS 512u

typedef struct fw_cfg {
    int deepseek; /* "arch": "deepseek" or "deepseek2-ocr" (else llama) */
    int ocr;      /* "arch": "deepseek2-ocr": NEOX rope, MHA */
    uint32_t layers, hidden, heads, kv_heads, ffn, ctx, cells;
    /* deepseek only: leading dense layers, routed experts (top experts_used),
     * one expert's width, shared experts */
    uint32_t dense_layers, experts, experts_used, expert_ffn, shared_experts;
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

/* The deepseek fields. The expert math is fixed by pipedec's loader
 * (MODEL_FFN_MOE): softmax gating, the top experts_used probabilities used as
 * they are (not renormalised), no weights scale; the config must say so, so
 * a trainer that did otherwise is refused instead of silently misread. */
static pd_status fw_moe_config(const cJSON *root, fw_cfg *c, pd_err *err)
{
    const cJSON *gating = cJSON_GetObjectItemCaseSensitive(root, "expert_gating");
    const cJSON *norm = cJSON_GetObjectItemCaseSensitive(root, "expert_weights_norm");
    const cJSON *scale = cJSON_GetObjectItemCaseSensitive(root, "expert_weights_scale");
    pd_status st;
    c->deepseek = 1;
    if ((st = fw_u32(root, "dense_layers", 0, c->layers, &c->dense_layers, err)) ||
        (st = fw_u32(root, "experts", 1, FW_MAX_EXPERTS, &c->experts, err)) ||
        (st = fw_u32(root, "experts_used", 1, c->experts, &c->experts_used, err)) ||
        (st = fw_u32(root, "expert_ffn", 1, 65536, &c->expert_ffn, err)) ||
        (st = fw_u32(root, "shared_experts", 1, 256, &c->shared_experts, err)))
        return st;
    if (!cJSON_IsString(gating) || strcmp(gating->valuestring, "softmax") != 0)
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "config.json: \"expert_gating\" must be \"softmax\" (pipedec's deepseek router)");
    if (!cJSON_IsFalse(norm))
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "config.json: \"expert_weights_norm\" must be false (pipedec does not renormalise the "
                          "top-k weights)");
    if (!cJSON_IsNumber(scale) || scale->valuedouble != 1.0)
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "config.json: \"expert_weights_scale\" must be 1 (pipedec does not scale the expert "
                          "weights)");
    return PD_OK;
}

/* A JSON object with a key twice is refused: cJSON takes the first, the
 * training script's reader (Python's json) the last, so the two would
 * disagree on the model silently. */
static pd_status fw_unique_keys(const cJSON *obj, const char *path, pd_err *err)
{
    for (const cJSON *a = obj ? obj->child : NULL; a; a = a->next) {
        for (const cJSON *b = a->next; b; b = b->next)
            if (a->string && b->string && strcmp(a->string, b->string) == 0)
                return pd_err_set(err, PD_ERR_FORMAT, "%s: key \"%s\" appears more than once", path, a->string);
        if (cJSON_IsObject(a)) {
            pd_status st = fw_unique_keys(a, path, err);
            if (st)
                return st;
        }
    }
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
    if ((st = fw_unique_keys(root, path, err)) != PD_OK) {
        cJSON_Delete(root);
        return st;
    }
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(root, "arch");
    const cJSON *vocab = cJSON_GetObjectItemCaseSensitive(root, "vocab");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(root, "ocr_prompt");
    if (!cJSON_IsString(arch) || (strcmp(arch->valuestring, "llama") != 0 && strcmp(arch->valuestring, "deepseek") != 0 &&
                                  strcmp(arch->valuestring, "deepseek2-ocr") != 0))
        st = pd_err_set(err, PD_ERR_UNSUPPORTED,
                        "config.json: \"arch\" must be \"llama\", \"deepseek\" or \"deepseek2-ocr\"");
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
    if (st == PD_OK && strcmp(arch->valuestring, "llama") != 0)
        st = fw_moe_config(root, c, err);
    if (st == PD_OK && !strcmp(arch->valuestring, "deepseek2-ocr")) {
        c->ocr = 1;
        if (c->kv_heads != c->heads)
            st = pd_err_set(err, PD_ERR_FORMAT, "config.json: deepseek2-ocr is MHA: kv_heads %u must equal heads %u",
                            c->kv_heads, c->heads);
    }
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
    /* a page is BOS, the cells and the prompt: it must fit the context */
    if (st == PD_OK && (uint64_t)c->cells + 1 + c->n_prompt > c->ctx)
        st = pd_err_set(err, PD_ERR_RANGE,
                        "config.json: \"ocr_cells\" %u: a page (BOS, %u cells, %u prompt tokens) would not fit the "
                        "context of %u positions",
                        c->cells, c->cells, c->n_prompt, c->ctx);
    snprintf(c->name, sizeof c->name, "%s", cJSON_IsString(name) ? name->valuestring : "pipedec ocr");
    cJSON_Delete(root);
    return st;
}

/* How fw_tensor stores a tensor. */
typedef enum fw_kind {
    FW_VEC,    /* [1, n] -> a 1-D f32 vector */
    FW_MAT,    /* [rows, cols] -> a matrix of the chosen dtype */
    FW_MAT32,  /* a matrix kept f32 whatever the dtype (the router: its top-k is discrete) */
    FW_STACK,  /* [experts * rows, cols] -> a 3-D expert stack [cols, rows, experts] */
} fw_kind;

/* Reads DIR/<name>.npy, checks its shape [experts * rows, cols] (experts 1
 * unless FW_STACK) and values, and adds it as a tensor. */
static pd_status fw_tensor(fw_ctx *c, const char *name, uint64_t experts, uint64_t rows, uint64_t cols, fw_kind kind,
                           pd_err *err)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.npy", c->dir, name);
    npy_info info;
    pd_status st = npy_probe(path, &info, err);
    if (st != PD_OK)
        return st;
    if (info.rows != experts * rows || info.cols != cols) {
        if (kind == FW_STACK)
            return pd_err_set(err, PD_ERR_MISMATCH,
                              "%s: shape [%llu, %llu], the config needs [%llu, %llu] (%llu experts of [%llu, %llu] "
                              "stacked by rows)",
                              path, (unsigned long long)info.rows, (unsigned long long)info.cols,
                              (unsigned long long)(experts * rows), (unsigned long long)cols,
                              (unsigned long long)experts, (unsigned long long)rows, (unsigned long long)cols);
        return pd_err_set(err, PD_ERR_MISMATCH, "%s: shape [%llu, %llu], the config needs [%llu, %llu]", path,
                          (unsigned long long)info.rows, (unsigned long long)info.cols, (unsigned long long)rows,
                          (unsigned long long)cols);
    }
    uint64_t n = experts * rows * cols;
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
    if ((kind == FW_MAT || kind == FW_STACK) && c->f16) {
        uint16_t *h = (uint16_t *)v; /* in place: element i is read before h[i] overwrites its half */
        for (uint64_t i = 0; i < n; i++)
            h[i] = pd_f32_to_f16(v[i]);
        type = GGUF_TENSOR_F16;
    }
    uint64_t ne[3] = {cols, rows, experts};
    st = gguf_writer_add_tensor(c->w, name, type, kind == FW_VEC ? 1 : kind == FW_STACK ? 3 : 2, ne, v);
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

/* The byte vocabulary's tokenizer.ggml.* keys (fromweights.h). merges is
 * present and empty, so llama.cpp loads the file ("cannot find tokenizer
 * merges in model file" otherwise) and no two bytes ever merge: any text
 * tokenizes to its bytes, the ids the model was trained on. pre "default"
 * names a pre-tokenizer both llama.cpp and pipedec know; with no merges its
 * split cannot change the ids. */
static void fw_byte_vocab(gguf_writer *w)
{
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
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "default");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, FROMWEIGHTS_VOCAB);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, FROMWEIGHTS_VOCAB);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", NULL, 0);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", FROMWEIGHTS_BOS);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", FROMWEIGHTS_EOS);
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
    const char *arch = cfg.ocr ? "deepseek2-ocr" : cfg.deepseek ? "deepseek" : "llama";
    char key[96];
#define KEY(s) (snprintf(key, sizeof key, "%s." s, arch), key)
    gguf_writer_set_str(w, "general.architecture", arch);
    gguf_writer_set_str(w, "general.name", cfg.name);
    gguf_writer_set_u32(w, "general.alignment", 32);
    gguf_writer_set_u32(w, KEY("block_count"), cfg.layers);
    gguf_writer_set_u32(w, KEY("embedding_length"), cfg.hidden);
    gguf_writer_set_u32(w, KEY("feed_forward_length"), cfg.ffn);
    gguf_writer_set_u32(w, KEY("attention.head_count"), cfg.heads);
    gguf_writer_set_u32(w, KEY("attention.head_count_kv"), cfg.kv_heads);
    gguf_writer_set_u32(w, KEY("context_length"), cfg.ctx);
    gguf_writer_set_f32(w, KEY("rope.freq_base"), cfg.rope_base);
    gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), cfg.rms_eps);
    if (cfg.deepseek) {
        gguf_writer_set_u32(w, KEY("leading_dense_block_count"), cfg.dense_layers);
        gguf_writer_set_u32(w, KEY("expert_count"), cfg.experts);
        gguf_writer_set_u32(w, KEY("expert_used_count"), cfg.experts_used);
        gguf_writer_set_u32(w, KEY("expert_shared_count"), cfg.shared_experts);
        gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), cfg.expert_ffn);
        gguf_writer_set_f32(w, KEY("expert_weights_scale"), 1.0f); /* the config's, checked to be 1 */
    }
    if (cfg.ocr) { /* what llama.cpp's converter adds for DeepSeek-OCR (mkmodel.c) */
        gguf_writer_set_u32(w, KEY("vocab_size"), FROMWEIGHTS_VOCAB);
        gguf_writer_set_u32(w, KEY("rope.dimension_count"), 0);
        gguf_writer_set_u32(w, KEY("expert_gating_func"), 1);
    }
#undef KEY
    gguf_writer_set_u32(w, OCRMETA_KEY_CELLS, cfg.cells);
    gguf_writer_set_arr_i32(w, OCRMETA_KEY_PROMPT, cfg.prompt, cfg.n_prompt);
    fw_byte_vocab(w);

    const uint64_t H = cfg.hidden, V = FROMWEIGHTS_VOCAB, F = cfg.ffn, hd = cfg.hidden / cfg.heads;
    const uint64_t qd = cfg.heads * hd, kvd = cfg.kv_heads * hd;
    const uint64_t E = cfg.experts, FE = cfg.expert_ffn, FS = (uint64_t)cfg.expert_ffn * cfg.shared_experts;
    st = fw_tensor(&c, "token_embd.weight", 1, V, H, FW_MAT, err);
    for (uint32_t L = 0; st == PD_OK && L < cfg.layers; L++) {
        char n[96];
#define T(s) (snprintf(n, sizeof n, "blk.%u." s, L), n)
        if ((st = fw_tensor(&c, T("attn_norm.weight"), 1, 1, H, FW_VEC, err)) ||
            (st = fw_tensor(&c, T("attn_q.weight"), 1, qd, H, FW_MAT, err)) ||
            (st = fw_tensor(&c, T("attn_k.weight"), 1, kvd, H, FW_MAT, err)) ||
            (st = fw_tensor(&c, T("attn_v.weight"), 1, kvd, H, FW_MAT, err)) ||
            (st = fw_tensor(&c, T("attn_output.weight"), 1, H, qd, FW_MAT, err)) ||
            (st = fw_tensor(&c, T("ffn_norm.weight"), 1, 1, H, FW_VEC, err)))
            break;
        if (!cfg.deepseek || L < cfg.dense_layers)
            st = fw_tensor(&c, T("ffn_gate.weight"), 1, F, H, FW_MAT, err);
        if (st == PD_OK && (!cfg.deepseek || L < cfg.dense_layers))
            st = fw_tensor(&c, T("ffn_up.weight"), 1, F, H, FW_MAT, err);
        if (st == PD_OK && (!cfg.deepseek || L < cfg.dense_layers))
            st = fw_tensor(&c, T("ffn_down.weight"), 1, H, F, FW_MAT, err);
        if (st == PD_OK && cfg.deepseek && L >= cfg.dense_layers)
            (void)((st = fw_tensor(&c, T("ffn_gate_inp.weight"), 1, E, H, FW_MAT32, err)) ||
                   (st = fw_tensor(&c, T("ffn_gate_exps.weight"), E, FE, H, FW_STACK, err)) ||
                   (st = fw_tensor(&c, T("ffn_up_exps.weight"), E, FE, H, FW_STACK, err)) ||
                   (st = fw_tensor(&c, T("ffn_down_exps.weight"), E, H, FE, FW_STACK, err)) ||
                   (st = fw_tensor(&c, T("ffn_gate_shexp.weight"), 1, FS, H, FW_MAT, err)) ||
                   (st = fw_tensor(&c, T("ffn_up_shexp.weight"), 1, FS, H, FW_MAT, err)) ||
                   (st = fw_tensor(&c, T("ffn_down_shexp.weight"), 1, H, FS, FW_MAT, err)));
#undef T
    }
    if (st == PD_OK)
        st = fw_tensor(&c, "output_norm.weight", 1, 1, H, FW_VEC, err);
    if (st == PD_OK)
        st = fw_tensor(&c, "output.weight", 1, V, H, FW_MAT, err);
    if (st == PD_OK)
        st = gguf_writer_write(w, out_path, err);
    gguf_writer_free(w);
    for (size_t i = 0; i < c.n_bufs; i++)
        free(c.bufs[i]);
    free(c.bufs);
    return st;
}

/* Is f's vocabulary the byte vocabulary fw_byte_vocab writes (whatever its
 * merges and pre say)? Refuses by name what differs. */
static pd_status fw_is_byte_vocab(const gguf_file *f, const char *path, pd_err *err)
{
    const char *model = NULL;
    uint64_t n = 0;
    gguf_vtype et;
    uint32_t bos = 0, eos = 0;
    pd_err ignore = {0};
    if (gguf_get_str(f, "tokenizer.ggml.model", &model, NULL, &ignore) || strcmp(model, "gpt2") != 0 ||
        gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &n, NULL, &ignore) || et != GGUF_VTYPE_STRING ||
        n != FROMWEIGHTS_VOCAB || gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &bos, &ignore) ||
        gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &eos, &ignore) || bos != FROMWEIGHTS_BOS ||
        eos != FROMWEIGHTS_EOS)
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "%s: not a byte-vocabulary model (tokenizer.ggml.model gpt2, %u tokens, bos %u, eos %u: "
                          "what mkmodel --from-weights writes)",
                          path, FROMWEIGHTS_VOCAB, FROMWEIGHTS_BOS, FROMWEIGHTS_EOS);
    for (uint32_t i = 0; i < FROMWEIGHTS_VOCAB; i++) {
        char piece[4];
        const char *want = i == FROMWEIGHTS_BOS ? "<|bos|>" : i == FROMWEIGHTS_EOS ? "<|endoftext|>" : piece;
        const char *s = NULL;
        size_t len = 0;
        if (i < 256)
            fw_byte_piece(i, piece);
        if (gguf_get_str_arr(f, "tokenizer.ggml.tokens", i, &s, &len, &ignore) || len != strlen(want) ||
            memcmp(s, want, len) != 0)
            return pd_err_set(err, PD_ERR_UNSUPPORTED,
                              "%s: token %u is not the byte vocabulary's (mkmodel --from-weights)", path, i);
    }
    return PD_OK;
}

/* Copies metadata entry kv of f into w as key o (any type but arrays of
 * arrays). */
static pd_status fw_copy_kv_as(const gguf_file *f, const gguf_kv_info *kv, const char *o, gguf_writer *w,
                               pd_err *err)
{
    static const uint8_t elem_size[GGUF_VTYPE_COUNT] = {
        [GGUF_VTYPE_UINT8] = 1,   [GGUF_VTYPE_INT8] = 1,   [GGUF_VTYPE_UINT16] = 2, [GGUF_VTYPE_INT16] = 2,
        [GGUF_VTYPE_UINT32] = 4,  [GGUF_VTYPE_INT32] = 4,  [GGUF_VTYPE_FLOAT32] = 4, [GGUF_VTYPE_BOOL] = 1,
        [GGUF_VTYPE_UINT64] = 8,  [GGUF_VTYPE_INT64] = 8,  [GGUF_VTYPE_FLOAT64] = 8};
    const char *k = kv->key;
    pd_status st = PD_OK;
    uint64_t u = 0;
    int64_t i = 0;
    switch (kv->type) {
    case GGUF_VTYPE_UINT8:
    case GGUF_VTYPE_UINT16:
    case GGUF_VTYPE_UINT32:
    case GGUF_VTYPE_UINT64:
        if ((st = gguf_get_u64(f, k, &u, err)))
            return st;
        return kv->type == GGUF_VTYPE_UINT8    ? gguf_writer_set_u8(w, o, (uint8_t)u)
               : kv->type == GGUF_VTYPE_UINT16 ? gguf_writer_set_u16(w, o, (uint16_t)u)
               : kv->type == GGUF_VTYPE_UINT32 ? gguf_writer_set_u32(w, o, (uint32_t)u)
                                               : gguf_writer_set_u64(w, o, u);
    case GGUF_VTYPE_INT8:
    case GGUF_VTYPE_INT16:
    case GGUF_VTYPE_INT32:
    case GGUF_VTYPE_INT64:
        if ((st = gguf_get_i64(f, k, &i, err)))
            return st;
        return kv->type == GGUF_VTYPE_INT8    ? gguf_writer_set_i8(w, o, (int8_t)i)
               : kv->type == GGUF_VTYPE_INT16 ? gguf_writer_set_i16(w, o, (int16_t)i)
               : kv->type == GGUF_VTYPE_INT32 ? gguf_writer_set_i32(w, o, (int32_t)i)
                                              : gguf_writer_set_i64(w, o, i);
    case GGUF_VTYPE_FLOAT32: {
        float v;
        return (st = gguf_get_f32(f, k, &v, err)) ? st : gguf_writer_set_f32(w, o, v);
    }
    case GGUF_VTYPE_FLOAT64: {
        double v;
        return (st = gguf_get_f64(f, k, &v, err)) ? st : gguf_writer_set_f64(w, o, v);
    }
    case GGUF_VTYPE_BOOL: {
        bool v;
        return (st = gguf_get_bool(f, k, &v, err)) ? st : gguf_writer_set_bool(w, o, v);
    }
    case GGUF_VTYPE_STRING: {
        const char *s;
        size_t len;
        if ((st = gguf_get_str(f, k, &s, &len, err)))
            return st;
        if (strlen(s) != len)
            return pd_err_set(err, PD_ERR_UNSUPPORTED, "key %s: a string with a NUL byte", k);
        return gguf_writer_set_str(w, o, s);
    }
    case GGUF_VTYPE_ARRAY: break;
    default: return pd_err_set(err, PD_ERR_UNSUPPORTED, "key %s: value type %u", k, (unsigned)kv->type);
    }
    gguf_vtype et;
    uint64_t n;
    const void *data;
    if ((st = gguf_get_arr(f, k, &et, &n, &data, err)))
        return st;
    if (et == GGUF_VTYPE_STRING) {
        const char **s = malloc((n ? n : 1) * sizeof *s);
        if (!s)
            return pd_err_set(err, PD_ERR_NOMEM, "key %s: out of memory", k);
        for (uint64_t j = 0; st == PD_OK && j < n; j++) {
            size_t len;
            if ((st = gguf_get_str_arr(f, k, j, &s[j], &len, err)) == PD_OK && strlen(s[j]) != len)
                st = pd_err_set(err, PD_ERR_UNSUPPORTED, "key %s[%llu]: a string with a NUL byte", k,
                                (unsigned long long)j);
        }
        if (st == PD_OK)
            st = gguf_writer_set_arr_str(w, o, s, n);
        free(s);
        return st;
    }
    if (et >= GGUF_VTYPE_COUNT || !elem_size[et])
        return pd_err_set(err, PD_ERR_UNSUPPORTED, "key %s: an array of %s", k, gguf_vtype_name(et));
    /* packed little-endian elements, unaligned: copied into an aligned buffer
     * of the host's types (the writer writes them back little-endian; the
     * project builds for little-endian hosts only) */
    void *v = malloc(n ? n * elem_size[et] : 1);
    if (!v)
        return pd_err_set(err, PD_ERR_NOMEM, "key %s: out of memory", k);
    memcpy(v, data, n * elem_size[et]);
    st = gguf_writer_set_arr(w, o, et, v, n);
    free(v);
    return st;
}

static pd_status fw_copy_kv(const gguf_file *f, const gguf_kv_info *kv, gguf_writer *w, pd_err *err)
{
    return fw_copy_kv_as(f, kv, kv->key, w, err);
}

pd_status fromweights_revocab(const char *in_path, const char *out_path, pd_err *err)
{
    gguf_file *f = NULL;
    pd_status st = gguf_open(in_path, &f, err);
    if (st != PD_OK)
        return st;
    gguf_writer *w = NULL;
    if ((st = fw_is_byte_vocab(f, in_path, err)) == PD_OK && !(w = gguf_writer_new()))
        st = pd_err_set(err, PD_ERR_NOMEM, "mkmodel --revocab: out of memory");
    /* every key but the tokenizer's, in file order, then the vocabulary: the
     * order fromweights_write sets them in */
    for (uint64_t i = 0; st == PD_OK && i < gguf_kv_count(f); i++) {
        const gguf_kv_info *kv = gguf_kv_at(f, i);
        if (strncmp(kv->key, "tokenizer.", 10) != 0 && (st = fw_copy_kv(f, kv, w, err)) != PD_OK) {
            if (err && !err->msg[0]) /* a writer setter's failure (out of memory) says nothing itself */
                pd_err_set(err, st, "cannot copy key %s", kv->key);
            pd_err_prefix(err, "%s", in_path);
        }
    }
    if (st == PD_OK)
        fw_byte_vocab(w);
    for (uint64_t i = 0; st == PD_OK && i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if ((st = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data)))
            st = pd_err_set(err, st, "mkmodel --revocab: cannot add tensor %s", t->name);
    }
    if (st == PD_OK)
        st = gguf_writer_write(w, out_path, err);
    gguf_writer_free(w);
    gguf_close(f);
    return st;
}

/* New row order of a [heads * hd]-row q or k: adjacent pairs -> halves. */
static uint64_t to_ocr_src_row(uint64_t r, uint64_t hd)
{
    uint64_t h = r / hd, j = r % hd, half = hd / 2;
    return h * hd + (j < half ? 2 * j : 2 * (j - half) + 1);
}

/* A q or k weight (ne [H, heads * hd]) or bias (ne [heads * hd]): rows
 * reordered into a copy the writer owns. */
static pd_status to_ocr_permuted(gguf_writer *w, const gguf_tensor *t, uint64_t hd, pd_err *err)
{
    uint64_t rows = t->n_dims == 1 ? t->ne[0] : t->ne[1];
    uint64_t row_ne = t->n_dims == 1 ? 1 : t->ne[0];
    if (t->n_dims > 2 || rows % hd)
        return pd_err_set(err, PD_ERR_FORMAT, "tensor %s: %llu rows are not whole heads of %llu", t->name,
                          (unsigned long long)rows, (unsigned long long)hd);
    size_t rb = gguf_type_row_bytes(t->type, row_ne, err);
    if (!rb) {
        pd_err_prefix(err, "tensor %s", t->name);
        return err ? err->status : PD_ERR_FORMAT;
    }
    uint8_t *buf = malloc(rb * rows);
    if (!buf)
        return pd_err_set(err, PD_ERR_NOMEM, "tensor %s: out of memory", t->name);
    for (uint64_t r = 0; r < rows; r++)
        memcpy(buf + r * rb, (const uint8_t *)t->data + to_ocr_src_row(r, hd) * rb, rb);
    pd_status st = gguf_writer_add_tensor_copy(w, t->name, t->type, t->n_dims, t->ne, buf);
    free(buf);
    return st ? pd_err_set(err, st, "mkmodel --to-ocr: cannot add tensor %s", t->name) : PD_OK;
}

static int to_ocr_is_qk(const char *name)
{
    const char *d = strncmp(name, "blk.", 4) == 0 ? strchr(name + 4, '.') : NULL;
    return d && (!strcmp(d, ".attn_q.weight") || !strcmp(d, ".attn_k.weight") || !strcmp(d, ".attn_q.bias") ||
                 !strcmp(d, ".attn_k.bias"));
}

/* One key of a deepseek file as deepseek2-ocr has it (rope.dimension_count
 * is written by the caller, as llama.cpp's converter writes it). */
static pd_status to_ocr_copy_key(const gguf_file *f, const gguf_kv_info *kv, gguf_writer *w, const char *in_path,
                                 pd_err *err)
{
    char key[512];
    pd_status st = PD_OK;
    if (!strcmp(kv->key, "general.architecture")) {
        st = gguf_writer_set_str(w, kv->key, "deepseek2-ocr");
    } else if (!strcmp(kv->key, "deepseek.rope.dimension_count")) {
        return PD_OK;
    } else if (!strncmp(kv->key, "deepseek.", 9)) {
        snprintf(key, sizeof key, "deepseek2-ocr.%s", kv->key + 9);
        st = fw_copy_kv_as(f, kv, key, w, err);
    } else {
        st = fw_copy_kv(f, kv, w, err);
    }
    if (st != PD_OK) {
        if (err && !err->msg[0]) /* a writer setter's failure (out of memory) says nothing itself */
            pd_err_set(err, st, "cannot copy key %s", kv->key);
        pd_err_prefix(err, "%s", in_path);
    }
    return st;
}

pd_status fromweights_to_ocr(const char *in_path, const char *out_path, pd_err *err)
{
    gguf_file *f = NULL;
    pd_status st = gguf_open(in_path, &f, err);
    if (st != PD_OK)
        return st;
    const char *arch = NULL;
    size_t alen = 0;
    uint32_t H = 0, heads = 0, kv_heads = 0, n_vocab = 0;
    float scale = 1.0f;
    gguf_writer *w = NULL;
    if ((st = gguf_get_str(f, "general.architecture", &arch, &alen, err)) == PD_OK && strcmp(arch, "deepseek") != 0)
        st = pd_err_set(err, PD_ERR_UNSUPPORTED, "general.architecture is \"%s\"; --to-ocr converts deepseek files",
                        arch);
    if (st == PD_OK)
        (void)((st = gguf_get_u32(f, "deepseek.embedding_length", &H, err)) ||
               (st = gguf_get_u32(f, "deepseek.attention.head_count", &heads, err)) ||
               (st = gguf_get_u32(f, "deepseek.attention.head_count_kv", &kv_heads, err)));
    if (st == PD_OK && gguf_find_key(f, "deepseek.expert_weights_scale") >= 0 &&
        (st = gguf_get_f32(f, "deepseek.expert_weights_scale", &scale, err)) == PD_OK && scale != 0.0f &&
        scale != 1.0f)
        st = pd_err_set(err, PD_ERR_UNSUPPORTED,
                        "deepseek.expert_weights_scale is %g: deepseek ignores it, deepseek2-ocr would apply it", scale);
    if (st == PD_OK && (heads == 0 || H % heads || (H / heads) % 2))
        st = pd_err_set(err, PD_ERR_FORMAT, "deepseek.embedding_length %u does not split into %u heads of an even size",
                        H, heads);
    if (st == PD_OK && kv_heads != heads)
        st = pd_err_set(err, PD_ERR_UNSUPPORTED,
                        "deepseek.attention.head_count_kv %u differs from head_count %u (deepseek2-ocr is MHA)", kv_heads,
                        heads);
    gguf_vtype et;
    const void *tokens;
    uint64_t nt = 0;
    if (st == PD_OK && (st = gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &nt, &tokens, err)) == PD_OK)
        n_vocab = (uint32_t)nt;
    if (st == PD_OK && !(w = gguf_writer_new()))
        st = pd_err_set(err, PD_ERR_NOMEM, "mkmodel --to-ocr: out of memory");
    /* the model's keys, the added ones, then the tokenizer's (the order
     * fromweights_write and --revocab keep) */
    for (uint64_t i = 0; st == PD_OK && i < gguf_kv_count(f); i++)
        if (strncmp(gguf_kv_at(f, i)->key, "tokenizer.", 10) != 0)
            st = to_ocr_copy_key(f, gguf_kv_at(f, i), w, in_path, err);
    if (st == PD_OK)
        (void)((st = gguf_writer_set_u32(w, "deepseek2-ocr.vocab_size", n_vocab)) ||
               (st = gguf_writer_set_u32(w, "deepseek2-ocr.rope.dimension_count", 0)) ||
               (st = gguf_writer_set_u32(w, "deepseek2-ocr.expert_gating_func", 1)));
    for (uint64_t i = 0; st == PD_OK && i < gguf_kv_count(f); i++)
        if (strncmp(gguf_kv_at(f, i)->key, "tokenizer.", 10) == 0)
            st = to_ocr_copy_key(f, gguf_kv_at(f, i), w, in_path, err);
    for (uint64_t i = 0; st == PD_OK && i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (to_ocr_is_qk(t->name))
            st = to_ocr_permuted(w, t, H / heads, err);
        else if ((st = gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data)))
            st = pd_err_set(err, st, "mkmodel --to-ocr: cannot add tensor %s", t->name);
    }
    if (st == PD_OK)
        st = gguf_writer_write(w, out_path, err);
    gguf_writer_free(w);
    gguf_close(f);
    return st;
}
