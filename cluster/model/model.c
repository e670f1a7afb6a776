/* model: GGUF hyperparameters, weight packing for one layer range, the layer
 * math of a micro-batch (attention through the layer cache containers, the
 * per-layer feed-forward kinds) and the row-local math every stage shares
 * (RMSNorm, RoPE, SwiGLU). */
#include "cluster/model/model.h"

#include <sys/mman.h>

#include "cache/attn.h"
#include "base/check.h"
#include "base/fnv.h"
#include "base/fp16.h"
#include "cluster/format/gguf.h"
#include "cluster/model/rope.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* INV: layers has n_layers entries for absolute layers [first, first + n_layers);
 * embd != NULL iff the model was loaded with want_embed; out/out_norm iff want_output. */
struct model {
    gguf_file *file;
    char *path;
    model_hparams hp;
    uint32_t first, n_layers;
    model_layer *layers;
    const gguf_tensor *embd; /* token_embd.weight, read in place */
    gemm_w *out;             /* output projection [vocab x hidden] */
    float *out_norm;         /* [hidden] */
    const pd_alloc *alloc;
    uint64_t digest;
    int digest_done;
    const void *token_types; /* int32 array in the file or NULL */
    uint64_t n_token_types;
    rope_table *rope;        /* angles of positions [0, min(ctx, MODEL_ROPE_TABLE_POSITIONS)); NULL without layers */
    int rope_borrowed;       /* rope belongs to the model of load_opts.share_rope */
    void *image;             /* model_load_image: the file image this model owns */
    size_t image_len;
};

static const char *const model_arch_names[MODEL_ARCH_COUNT] = {
    [MODEL_ARCH_LLAMA] = "llama",
    [MODEL_ARCH_QWEN2] = "qwen2",
    [MODEL_ARCH_DEEPSEEK] = "deepseek",
    [MODEL_ARCH_DEEPSEEK2_OCR] = "deepseek2-ocr",
};

const char *model_arch_name(model_arch a)
{
    return (unsigned)a < MODEL_ARCH_COUNT ? model_arch_names[a] : "unknown";
}

/* llama.cpp's LLAMA_MAX_EXPERTS: a file claiming more is refused. */
#define MODEL_MAX_EXPERTS 512u

/* ---- hyperparameters ---------------------------------------------------- */

/* Reads key "<arch>.<suffix>". Absent: an error when required, else *out =
 * dflt and bit `opt` (a model_hp_key) set in *defaulted. */
static pd_status hp_u32(const gguf_file *f, const char *arch, const char *suffix, uint32_t *out,
                        int required, uint32_t dflt, uint32_t *defaulted, model_hp_key opt,
                        pd_err *err)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (gguf_find_key(f, key) < 0) {
        if (required)
            return pd_err_set(err, PD_ERR_FORMAT, "missing metadata key %s", key);
        *out = dflt;
        *defaulted |= 1u << opt;
        return PD_OK;
    }
    return gguf_get_u32(f, key, out, err);
}

static pd_status hp_f32(const gguf_file *f, const char *arch, const char *suffix, float *out,
                        float dflt, uint32_t *defaulted, model_hp_key opt, pd_err *err)
{
    char key[160];
    snprintf(key, sizeof key, "%s.%s", arch, suffix);
    if (gguf_find_key(f, key) < 0) {
        *out = dflt;
        *defaulted |= 1u << opt;
        return PD_OK;
    }
    return gguf_get_f32(f, key, out, err);
}

/* hp->assumed from hp->defaulted: each defaulted key's value and name, in
 * model_hp_key order. */
static void hparams_describe_assumed(model_hparams *hp, const char *arch)
{
    char *o = hp->assumed;
    size_t cap = sizeof hp->assumed, k = 0;
    o[0] = '\0';
    for (int key = 0; key < MODEL_HP_KEY_COUNT; key++) {
        if (!(hp->defaulted & (1u << key)))
            continue;
        const char *sep = k ? ", " : "";
        int n = 0;
        switch ((model_hp_key)key) {
        case MODEL_HP_KEY_KV_HEADS:
            n = snprintf(o + k, cap - k, "%skv heads %u (%s.attention.head_count_kv absent)", sep,
                         hp->n_kv_heads, arch);
            break;
        case MODEL_HP_KEY_CTX:
            n = snprintf(o + k, cap - k, "%scontext length %u (%s.context_length absent)", sep,
                         hp->ctx, arch);
            break;
        case MODEL_HP_KEY_ROPE_BASE:
            n = snprintf(o + k, cap - k, "%srope base %g (%s.rope.freq_base absent)", sep,
                         (double)hp->rope_base, arch);
            break;
        case MODEL_HP_KEY_RMS_EPS:
            n = snprintf(o + k, cap - k,
                         "%srms epsilon %g (%s.attention.layer_norm_rms_epsilon absent)", sep,
                         (double)hp->rms_eps, arch);
            break;
        case MODEL_HP_KEY_ALIGNMENT:
            n = snprintf(o + k, cap - k, "%salignment %u (general.alignment absent)", sep,
                         GGUF_DEFAULT_ALIGNMENT);
            break;
        case MODEL_HP_KEY_TOKEN_TYPE:
            n = snprintf(o + k, cap - k,
                         "%severy token type normal (tokenizer.ggml.token_type absent)", sep);
            break;
        case MODEL_HP_KEY_COUNT:
            break;
        }
        /* 6 keys of at most ~90 bytes each fit; a cut text stays terminated */
        k = n > 0 && (size_t)n < cap - k ? k + (size_t)n : cap - 1;
    }
}

/* ---- the tensor set ------------------------------------------------------ */

/* The per-layer tensors layer_load reads ("blk.L." + part): the attention
 * parts of every layer, the feed-forward parts of the layer's kind; the Q/K/V
 * biases only when the file has them (hp->qkv_bias). */
static const char *const model_layer_parts[] = {
    "attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight",
    "attn_v.weight",    "attn_output.weight",
};
static const char *const model_swiglu_parts[] = {"ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};
static const char *const model_moe_parts[] = {
    "ffn_gate_inp.weight",   "ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_down_exps.weight",
    "ffn_gate_shexp.weight", "ffn_up_shexp.weight",  "ffn_down_shexp.weight",
};

/* The feed-forward kind of layer L: llama and qwen2 are dense throughout,
 * deepseek after its leading dense layers is a mixture of experts. */
static model_ffn_kind ffn_kind_of(const model_hparams *hp, uint32_t L)
{
    return model_arch_is_moe(hp->arch) && L >= hp->n_dense_lead ? MODEL_FFN_MOE : MODEL_FFN_SWIGLU;
}
static const char *const model_layer_bias_parts[] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};

/* Whether the architecture reads a tensor of this name (model_load,
 * layer_load): token_embd.weight, output_norm.weight, output.weight, and
 * blk.L.<part> for L < n_layers written as the loader writes it (no leading
 * zeros). */
static int tensor_used(const model_hparams *hp, const char *name)
{
    if (!strcmp(name, "token_embd.weight") || !strcmp(name, "output_norm.weight") ||
        !strcmp(name, "output.weight"))
        return 1;
    if (strncmp(name, "blk.", 4) != 0)
        return 0;
    const char *p = name + 4;
    uint64_t L = 0;
    const char *d = p;
    while (*p >= '0' && *p <= '9' && L < hp->n_layers)
        L = L * 10 + (uint64_t)(*p++ - '0');
    if (p == d || (*d == '0' && p - d > 1) || L >= hp->n_layers || *p != '.')
        return 0;
    p++;
    for (size_t i = 0; i < sizeof model_layer_parts / sizeof model_layer_parts[0]; i++)
        if (!strcmp(p, model_layer_parts[i]))
            return 1;
    int moe = ffn_kind_of(hp, (uint32_t)L) == MODEL_FFN_MOE;
    const char *const *ffn_parts = moe ? model_moe_parts : model_swiglu_parts;
    size_t n_ffn = moe ? sizeof model_moe_parts / sizeof model_moe_parts[0]
                       : sizeof model_swiglu_parts / sizeof model_swiglu_parts[0];
    for (size_t i = 0; i < n_ffn; i++)
        if (!strcmp(p, ffn_parts[i]))
            return 1;
    if (moe && hp->has_exp_probs_b && !strcmp(p, "exp_probs_b.bias"))
        return 1;
    for (size_t i = 0; hp->qkv_bias && i < sizeof model_layer_bias_parts / sizeof model_layer_bias_parts[0];
         i++)
        if (!strcmp(p, model_layer_bias_parts[i]))
            return 1;
    return 0;
}

/* Refuses a file holding tensors the architecture does not read, naming them
 * (the first few, and how many there are). Like llama.cpp, which refuses a
 * file whose tensor count differs from what the architecture creates: a
 * renamed output.weight would otherwise silently mean tied embeddings, a
 * tensor of an unsupported variant (rope_freqs.weight, a layer beyond
 * block_count) would silently be ignored. */
static pd_status tensors_check_used(const gguf_file *f, const model_hparams *hp, const char *arch,
                                    pd_err *err)
{
    char list[300] = "";
    size_t k = 0;
    uint64_t unused = 0;
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const char *name = gguf_tensor_at(f, i)->name;
        if (tensor_used(hp, name))
            continue;
        if (unused++ >= 4)
            continue;
        if (k)
            k += (size_t)snprintf(list + k, sizeof list - k, ", ");
        /* names are any bytes but NUL: show control bytes as '?' */
        for (const char *c = name; *c && k + 1 < sizeof list; c++)
            list[k++] = (unsigned char)*c < 0x20 || *c == 0x7f ? '?' : *c;
        list[k] = '\0';
    }
    if (!unused)
        return PD_OK;
    return pd_err_set(err, PD_ERR_FORMAT,
                      "%llu tensor%s not used by architecture %s (renamed, or from another "
                      "architecture or variant): %s%s",
                      (unsigned long long)unused, unused == 1 ? " is" : "s are", arch, list,
                      unused > 4 ? ", ..." : "");
}

/* The mixture-of-experts keys, every one required as llama.cpp requires them
 * for deepseek (expert_count and expert_used_count are required here too: a
 * deepseek file without experts is not one). */
static pd_status moe_hparams_read(const gguf_file *f, model_hparams *hp, const char *archz, pd_err *err)
{
    uint32_t *dfl = &hp->defaulted;
    const model_hp_key req = MODEL_HP_KEY_COUNT;
    char key[160];
    pd_status st;
    const int ocr = hp->arch == MODEL_ARCH_DEEPSEEK2_OCR;
    hp->moe_gating = MODEL_MOE_SOFTMAX;
    if (ocr) {
        /* llama.cpp's deepseek2-ocr loader: leading_dense_block_count,
         * expert_weights_scale, expert_weights_norm and expert_gating_func
         * optional */
        uint32_t scratch = 0;
        if ((st = hp_u32(f, archz, "leading_dense_block_count", &hp->n_dense_lead, 0, 0, &scratch, 0, err)))
            return st;
        snprintf(key, sizeof key, "%s.expert_weights_scale", archz);
        hp->expert_weights_scale = 0.0f;
        if (gguf_find_key(f, key) >= 0 && (st = gguf_get_f32(f, key, &hp->expert_weights_scale, err)))
            return st;
        if (!(hp->expert_weights_scale >= 0.0f) || hp->expert_weights_scale > 1e6f)
            return pd_err_set(err, PD_ERR_FORMAT, "%s %g out of range", key, (double)hp->expert_weights_scale);
        snprintf(key, sizeof key, "%s.expert_weights_norm", archz);
        bool norm = false;
        if (gguf_find_key(f, key) >= 0 && (st = gguf_get_bool(f, key, &norm, err)))
            return st;
        hp->expert_weights_norm = norm;
        uint32_t gf = 0;
        if ((st = hp_u32(f, archz, "expert_gating_func", &gf, 0, 0, &scratch, 0, err)))
            return st;
        if (gf > 2)
            return pd_err_set(err, PD_ERR_UNSUPPORTED, "%s.expert_gating_func %u: supported 1 (softmax), 2 (sigmoid)",
                              archz, gf);
        hp->moe_gating = gf == 2 ? MODEL_MOE_SIGMOID : MODEL_MOE_SOFTMAX;
    }
    if ((!ocr && (st = hp_u32(f, archz, "leading_dense_block_count", &hp->n_dense_lead, 1, 0, dfl, req, err))) ||
        (st = hp_u32(f, archz, "expert_count", &hp->n_expert, 1, 0, dfl, req, err)) ||
        (st = hp_u32(f, archz, "expert_used_count", &hp->n_expert_used, 1, 0, dfl, req, err)) ||
        (st = hp_u32(f, archz, "expert_shared_count", &hp->n_expert_shared, 1, 0, dfl, req, err)) ||
        (st = hp_u32(f, archz, "expert_feed_forward_length", &hp->ffn_exp, 1, 0, dfl, req, err)))
        return st;
    snprintf(key, sizeof key, "%s.expert_weights_scale", archz);
    if (!ocr && gguf_find_key(f, key) < 0)
        return pd_err_set(err, PD_ERR_FORMAT, "missing metadata key %s", key);
    if (!ocr && (st = gguf_get_f32(f, key, &hp->expert_weights_scale, err)))
        return st;
    if (hp->n_dense_lead > hp->n_layers)
        return pd_err_set(err, PD_ERR_FORMAT, "%s.leading_dense_block_count %u exceeds block_count %u", archz,
                          hp->n_dense_lead, hp->n_layers);
    if (hp->n_expert == 0 || hp->n_expert > MODEL_MAX_EXPERTS)
        return pd_err_set(err, PD_ERR_FORMAT, "%s.expert_count %u: expected 1..%u", archz, hp->n_expert,
                          MODEL_MAX_EXPERTS);
    if (hp->n_expert_used == 0 || hp->n_expert_used > hp->n_expert)
        return pd_err_set(err, PD_ERR_FORMAT, "%s.expert_used_count %u: expected 1..expert_count %u", archz,
                          hp->n_expert_used, hp->n_expert);
    if (hp->n_expert_shared == 0 || hp->ffn_exp == 0 ||
        (uint64_t)hp->n_expert_shared * hp->ffn_exp > (1u << 24))
        return pd_err_set(err, PD_ERR_FORMAT,
                          "%s.expert_shared_count %u x expert_feed_forward_length %u: expected 1..2^24 "
                          "(a layer without a shared expert is not supported)",
                          archz, hp->n_expert_shared, hp->ffn_exp);
    if (!ocr && (!(hp->expert_weights_scale > 0.0f) || hp->expert_weights_scale > 1e6f))
        return pd_err_set(err, PD_ERR_FORMAT, "%s.expert_weights_scale %g out of range", archz,
                          (double)hp->expert_weights_scale);
    return PD_OK;
}

float model_ocr_kq_mul(model_rope_scaling t, float factor, float attn_factor)
{
    /* the float operations of llama.cpp's llama_context constructor and
     * deepseek2 graph, in their order; logf as rope_ln rounded to float */
#define LOGF(x) ((float)rope_ln((double)(x)))
    float freq_scale = factor == 0.0f ? 1.0f : 1.0f / factor;
    if (t == MODEL_ROPE_SCALING_NONE)
        freq_scale = 1.0f;
    float a = 1.0f;
    if (t == MODEL_ROPE_SCALING_YARN) {
        const float f = 1.0f / freq_scale;
        a = f <= 1.0f ? 1.0f : 0.1f * 1.0f * LOGF(f) + 1.0f;
        a *= 1.0f / (1.0f + 0.1f * LOGF(f));
    }
    a *= attn_factor;
    const float attn_factor_org = a * (1.0f + 0.1f * LOGF(1.0f / freq_scale));
    const float mscale = attn_factor_org * (1.0f + 0.1f * 0.0f * LOGF(1.0f / freq_scale));
#undef LOGF
    return mscale * mscale;
}

/* deepseek2-ocr's rope.scaling.* keys, as llama.cpp's loader reads them:
 * type "none" | "linear" | "yarn" (absent: linear; anything else refused, as
 * llama.cpp asserts), factor (absent or 0: none), attn_factor (default 1),
 * original_context_length (reported only). A factor that is negative, not
 * finite, or so small that ln(1 / freq_scale) leaves float is refused. */
static pd_status ocr_rope_scaling_read(const gguf_file *f, model_hparams *hp, const char *archz, pd_err *err)
{
    char key[160];
    pd_status st;
    hp->rope_scaling = MODEL_ROPE_SCALING_LINEAR;
    hp->rope_scaling_factor = 0.0f;
    hp->rope_scaling_attn_factor = 1.0f;
    hp->rope_scaling_orig_ctx = 0;
    snprintf(key, sizeof key, "%s.rope.scaling.type", archz);
    if (gguf_find_key(f, key) >= 0) {
        const char *t;
        if ((st = gguf_get_str(f, key, &t, NULL, err)))
            return st;
        if (!strcmp(t, "none"))
            hp->rope_scaling = MODEL_ROPE_SCALING_NONE;
        else if (!strcmp(t, "linear"))
            hp->rope_scaling = MODEL_ROPE_SCALING_LINEAR;
        else if (!strcmp(t, "yarn"))
            hp->rope_scaling = MODEL_ROPE_SCALING_YARN;
        else
            return pd_err_set(err, PD_ERR_UNSUPPORTED, "%s \"%s\" is not supported (none, linear, yarn)", key, t);
    }
    snprintf(key, sizeof key, "%s.rope.scaling.factor", archz);
    if (gguf_find_key(f, key) >= 0 && (st = gguf_get_f32(f, key, &hp->rope_scaling_factor, err)))
        return st;
    if (!(hp->rope_scaling_factor == 0.0f || (hp->rope_scaling_factor >= 1e-6f && hp->rope_scaling_factor <= 1e6f)))
        return pd_err_set(err, PD_ERR_FORMAT, "%s %g: expected 0 (none) or a factor in [1e-6, 1e6]", key,
                          (double)hp->rope_scaling_factor);
    snprintf(key, sizeof key, "%s.rope.scaling.attn_factor", archz);
    if (gguf_find_key(f, key) >= 0 && (st = gguf_get_f32(f, key, &hp->rope_scaling_attn_factor, err)))
        return st;
    if (!(hp->rope_scaling_attn_factor > 0.0f && hp->rope_scaling_attn_factor <= 1e3f))
        return pd_err_set(err, PD_ERR_FORMAT, "%s %g: expected a factor in (0, 1000]", key,
                          (double)hp->rope_scaling_attn_factor);
    snprintf(key, sizeof key, "%s.rope.scaling.original_context_length", archz);
    if (gguf_find_key(f, key) >= 0 && (st = gguf_get_u32(f, key, &hp->rope_scaling_orig_ctx, err)))
        return st;
    hp->kq_mul = model_ocr_kq_mul(hp->rope_scaling, hp->rope_scaling_factor, hp->rope_scaling_attn_factor);
    return PD_OK;
}

/* general.architecture: one of model_arch_names, into hp->arch and archz
 * (the key prefix of the other hyperparameters). */
static pd_status hp_arch_read(const gguf_file *f, model_hparams *hp, char *archz, size_t cap, pd_err *err)
{
    const char *arch;
    size_t alen;
    pd_status st = gguf_get_str(f, "general.architecture", &arch, &alen, err);
    if (st != PD_OK)
        return st;
    if (alen >= cap)
        return pd_err_set(err, PD_ERR_UNSUPPORTED, "architecture name of %zu bytes", alen);
    memcpy(archz, arch, alen);
    archz[alen] = '\0';
    int found = 0;
    for (int a = 0; a < MODEL_ARCH_COUNT; a++)
        if (strcmp(archz, model_arch_names[a]) == 0) {
            hp->arch = (model_arch)a;
            found = 1;
        }
    if (!found)
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "architecture \"%s\" is not supported (supported: llama, qwen2, deepseek, deepseek2-ocr)",
                          archz);
    return PD_OK;
}

/* The geometry the layer math needs: nothing zero, heads dividing the
 * width and the K/V heads the heads, RoPE pairs, a sane epsilon and base.
 * Sets hp->head_dim. */
static pd_status hp_shape_check(model_hparams *hp, const char *archz, pd_err *err)
{
    if (hp->n_layers == 0 || hp->hidden == 0 || hp->ffn == 0 || hp->n_heads == 0 ||
        hp->n_kv_heads == 0)
        return pd_err_set(err, PD_ERR_FORMAT, "%s: zero layer count, width or head count", archz);
    if (hp->hidden % hp->n_heads != 0)
        return pd_err_set(err, PD_ERR_FORMAT, "%s: embedding_length %u is not a multiple of head_count %u",
                          archz, hp->hidden, hp->n_heads);
    if (hp->n_heads % hp->n_kv_heads != 0)
        return pd_err_set(err, PD_ERR_FORMAT, "%s: head_count %u is not a multiple of head_count_kv %u",
                          archz, hp->n_heads, hp->n_kv_heads);
    hp->head_dim = hp->hidden / hp->n_heads;
    if (hp->head_dim % 2 != 0)
        return pd_err_set(err, PD_ERR_FORMAT, "%s: head dimension %u is odd (RoPE needs pairs)", archz,
                          hp->head_dim);
    if (!(hp->rms_eps > 0.0f) || !(hp->rope_base > 1.0f))
        return pd_err_set(err, PD_ERR_FORMAT, "%s: rms epsilon %g or rope base %g out of range", archz,
                          (double)hp->rms_eps, (double)hp->rope_base);
    return PD_OK;
}

/* The vocabulary's size and kind, BOS and EOS (inside it). */
static pd_status hp_vocab_read(const gguf_file *f, model_hparams *hp, pd_err *err)
{
    pd_status st;
    gguf_vtype et;
    const void *data;
    uint64_t count;
    if ((st = gguf_get_arr(f, "tokenizer.ggml.tokens", &et, &count, &data, err)))
        return st;
    if (et != GGUF_VTYPE_STRING || count == 0 || count > UINT32_MAX)
        return pd_err_set(err, PD_ERR_FORMAT, "tokenizer.ggml.tokens: expected a non-empty string array");
    hp->vocab = (uint32_t)count;
    const char *tm;
    size_t tml;
    if ((st = gguf_get_str(f, "tokenizer.ggml.model", &tm, &tml, err)))
        return st;
    if (tml == 5 && memcmp(tm, "llama", 5) == 0)
        hp->vocab_kind = MODEL_VOCAB_LLAMA;
    else if (tml == 4 && memcmp(tm, "gpt2", 4) == 0)
        hp->vocab_kind = MODEL_VOCAB_GPT2;
    else
        return pd_err_set(err, PD_ERR_UNSUPPORTED, "tokenizer.ggml.model \"%.*s\" is not supported (llama, gpt2)",
                          (int)tml, tm);
    if ((st = gguf_get_u32(f, "tokenizer.ggml.bos_token_id", &hp->bos, err)) ||
        (st = gguf_get_u32(f, "tokenizer.ggml.eos_token_id", &hp->eos, err)))
        return st;
    if (hp->bos >= hp->vocab || hp->eos >= hp->vocab)
        return pd_err_set(err, PD_ERR_FORMAT, "bos %u / eos %u outside the vocabulary of %u", hp->bos,
                          hp->eos, hp->vocab);
    return PD_OK;
}

/* Every tensor's type, before any weight is read or allocated (every rank
 * reads the hyperparameters first): a file people quantized with a type
 * this build does not compute with is refused here, naming the first such
 * tensor in file order. */
static pd_status hp_types_check(const gguf_file *f, pd_err *err)
{
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        if (!gguf_type_supported(t->type))
            return pd_err_set(err, PD_ERR_UNSUPPORTED,
                              "tensor %s has type %s; supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, "
                              "q5_K, q6_K",
                              t->name, gguf_type_name(t->type));
    }
    return PD_OK;
}

static pd_status hparams_read(const gguf_file *f, model_hparams *hp, pd_err *err)
{
    memset(hp, 0, sizeof *hp);
    char archz[64];
    pd_status st = hp_arch_read(f, hp, archz, sizeof archz, err);
    if (st != PD_OK)
        return st;
    /* llama.cpp's rope type: NEOX for qwen2 and deepseek2-ocr (its OCR
     * branch ropes the whole head, whatever rope.dimension_count says),
     * NORM for llama and deepseek */
    hp->rope = hp->arch == MODEL_ARCH_QWEN2 || hp->arch == MODEL_ARCH_DEEPSEEK2_OCR ? MODEL_ROPE_NEOX
                                                                                   : MODEL_ROPE_NORM;
    hp->rope_scaling = MODEL_ROPE_SCALING_NONE;
    hp->rope_scaling_attn_factor = 1.0f;
    hp->kq_mul = 1.0f;
    uint32_t *dfl = &hp->defaulted;
    const model_hp_key req = MODEL_HP_KEY_COUNT; /* required: never defaulted */
    if ((st = hp_u32(f, archz, "block_count", &hp->n_layers, 1, 0, dfl, req, err)) ||
        (st = hp_u32(f, archz, "embedding_length", &hp->hidden, 1, 0, dfl, req, err)) ||
        (st = hp_u32(f, archz, "feed_forward_length", &hp->ffn, 1, 0, dfl, req, err)) ||
        (st = hp_u32(f, archz, "attention.head_count", &hp->n_heads, 1, 0, dfl, req, err)) ||
        (st = hp_u32(f, archz, "attention.head_count_kv", &hp->n_kv_heads, 0, hp->n_heads, dfl,
                     MODEL_HP_KEY_KV_HEADS, err)) ||
        (st = hp_u32(f, archz, "context_length", &hp->ctx, 0, 4096, dfl, MODEL_HP_KEY_CTX, err)) ||
        (st = hp_f32(f, archz, "rope.freq_base", &hp->rope_base, 10000.0f, dfl,
                     MODEL_HP_KEY_ROPE_BASE, err)) ||
        (st = hp_f32(f, archz, "attention.layer_norm_rms_epsilon", &hp->rms_eps, 1e-5f, dfl,
                     MODEL_HP_KEY_RMS_EPS, err)))
        return st;
    if (model_arch_is_moe(hp->arch) && (st = moe_hparams_read(f, hp, archz, err)))
        return st;
    if (hp->arch == MODEL_ARCH_DEEPSEEK2_OCR) {
        /* llama.cpp builds full MHA (n_head K/V heads) and a kq scale of
         * mscale^2 / sqrt(head_dim), mscale from the rope-scaling keys
         * (model_ocr_kq_mul); a file asking for grouped K/V is not the model
         * this computes */
        if ((st = ocr_rope_scaling_read(f, hp, archz, err)))
            return st;
        if (hp->n_kv_heads != hp->n_heads)
            return pd_err_set(err, PD_ERR_FORMAT,
                              "%s.attention.head_count_kv %u differs from head_count %u (deepseek2-ocr is MHA)", archz,
                              hp->n_kv_heads, hp->n_heads);
        char bn[64];
        snprintf(bn, sizeof bn, "blk.%u.exp_probs_b.bias", hp->n_dense_lead);
        hp->has_exp_probs_b = hp->n_dense_lead < hp->n_layers && gguf_tensor_find(f, bn) != NULL;
    }
    if (gguf_find_key(f, "general.alignment") < 0)
        hp->defaulted |= 1u << MODEL_HP_KEY_ALIGNMENT;
    if (gguf_find_key(f, "tokenizer.ggml.token_type") < 0)
        hp->defaulted |= 1u << MODEL_HP_KEY_TOKEN_TYPE;
    if ((st = hp_shape_check(hp, archz, err)) || (st = hp_vocab_read(f, hp, err)))
        return st;
    hp->qkv_bias = gguf_tensor_find(f, "blk.0.attn_q.bias") != NULL;
    hp->tied_output = gguf_tensor_find(f, "output.weight") == NULL;
    if (hp->tied_output && hp->arch == MODEL_ARCH_DEEPSEEK)
        return pd_err_set(err, PD_ERR_FORMAT, "tensor output.weight is missing (deepseek's output is not tied)");
    if ((st = tensors_check_used(f, hp, archz, err)))
        return st;
    if ((st = hp_types_check(f, err)))
        return st;
    hparams_describe_assumed(hp, archz);
    return PD_OK;
}

/* ---- tensors ------------------------------------------------------------ */

static pd_status tensor_get(const gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1,
                            const gguf_tensor **out, pd_err *err)
{
    const gguf_tensor *t = gguf_tensor_find(f, name);
    if (!t)
        return pd_err_set(err, PD_ERR_FORMAT, "tensor %s is missing", name);
    uint32_t want_dims = ne1 ? 2 : 1;
    if (t->n_dims != want_dims || t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1))
        return pd_err_set(err, PD_ERR_FORMAT,
                          "tensor %s has shape [%llu, %llu] (%u dims), expected [%llu, %llu]", name,
                          (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], t->n_dims,
                          (unsigned long long)ne0, (unsigned long long)(ne1 ? ne1 : 1));
    if (!gguf_type_supported(t->type))
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "tensor %s has type %s; supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K", name,
                          gguf_type_name(t->type));
    *out = t;
    return PD_OK;
}

/* A 3-dimensional tensor [ne0, ne1, ne2] (expert stacks: ne2 = experts). */
static pd_status tensor_get3(const gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1, uint64_t ne2,
                             const gguf_tensor **out, pd_err *err)
{
    const gguf_tensor *t = gguf_tensor_find(f, name);
    if (!t)
        return pd_err_set(err, PD_ERR_FORMAT, "tensor %s is missing", name);
    if (t->n_dims != 3 || t->ne[0] != ne0 || t->ne[1] != ne1 || t->ne[2] != ne2)
        return pd_err_set(err, PD_ERR_FORMAT,
                          "tensor %s has shape [%llu, %llu, %llu] (%u dims), expected [%llu, %llu, %llu] "
                          "(the last is expert_count)",
                          name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                          (unsigned long long)(t->n_dims > 2 ? t->ne[2] : 1), t->n_dims,
                          (unsigned long long)ne0, (unsigned long long)ne1, (unsigned long long)ne2);
    if (!gguf_type_supported(t->type))
        return pd_err_set(err, PD_ERR_UNSUPPORTED, "tensor %s has type %s; supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K",
                          name, gguf_type_name(t->type));
    *out = t;
    return PD_OK;
}

/* The GEMM's type of a supported ggml type (GEMM_W_COUNT for others). */
static gemm_wtype tensor_gemm_type(uint32_t type)
{
    switch (type) {
    case GGUF_TENSOR_F32: return GEMM_W_F32;
    case GGUF_TENSOR_F16: return GEMM_W_F16;
    case GGUF_TENSOR_BF16: return GEMM_W_BF16;
    case GGUF_TENSOR_Q8_0: return GEMM_W_Q8_0;
    case GGUF_TENSOR_Q4_0: return GEMM_W_Q4_0;
    case GGUF_TENSOR_Q5_0: return GEMM_W_Q5_0;
    case GGUF_TENSOR_Q4_1: return GEMM_W_Q4_1;
    case GGUF_TENSOR_Q5_1: return GEMM_W_Q5_1;
    case GGUF_TENSOR_Q4_K: return GEMM_W_Q4_K;
    case GGUF_TENSOR_Q5_K: return GEMM_W_Q5_K;
    case GGUF_TENSOR_Q6_K: return GEMM_W_Q6_K;
    default: return GEMM_W_COUNT;
    }
}

/* Converts element range [i0, i0 + n) of a supported tensor to f32. */
static void tensor_row_f32(const gguf_tensor *t, uint64_t i0, uint64_t n, float *out)
{
    const uint8_t *b = t->data;
    switch (t->type) {
    case GGUF_TENSOR_F32:
        memcpy(out, b + i0 * 4, n * 4);
        break;
    case GGUF_TENSOR_F16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, b + (i0 + i) * 2, 2);
            out[i] = pd_f16_to_f32(h);
        }
        break;
    case GGUF_TENSOR_BF16:
        for (uint64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, b + (i0 + i) * 2, 2);
            out[i] = pd_bf16_to_f32(h);
        }
        break;
    case GGUF_TENSOR_Q8_0:
        for (uint64_t i = 0; i < n; i++) {
            uint64_t e = i0 + i, blk = e / 32;
            const uint8_t *bb = b + blk * 34;
            uint16_t h;
            memcpy(&h, bb, 2);
            out[i] = (float)(int8_t)bb[2 + e % 32] * pd_f16_to_f32(h);
        }
        break;
    default: {
        /* the ggml block types: by rows of ne0 (the token embedding's rows,
         * a whole norm vector), the values the GEMM multiplies with */
        gemm_wtype wt = tensor_gemm_type(t->type);
        CHECKF(gemm_wtype_is_qs(wt), "tensor_row_f32: unsupported type %u", t->type);
        const uint64_t ne0 = t->ne[0];
        const size_t row = gemm_row_bytes(wt, (uint32_t)ne0);
        while (n > 0) {
            uint64_t r = i0 / ne0, k0 = i0 % ne0, take = ne0 - k0 < n ? ne0 - k0 : n;
            gemm_dequant(wt, b + r * row, (uint32_t)k0, (uint32_t)take, out);
            out += take;
            i0 += take;
            n -= take;
        }
    }
    }
}

static pd_status vec_load(const model *m, const char *name, uint64_t n, float **out, pd_err *err)
{
    const gguf_tensor *t = NULL;
    pd_status st = tensor_get(m->file, name, n, 0, &t, err);
    if (st)
        return st;
    float *v = pd_alloc_bytes(m->alloc, n * sizeof(float));
    if (!v)
        return pd_err_set(err, PD_ERR_NOMEM, "tensor %s: out of memory", name);
    tensor_row_f32(t, 0, n, v);
    *out = v;
    return PD_OK;
}

static pd_status tensor_wtype(const gguf_tensor *t, const char *name, gemm_wtype *wt, pd_err *err)
{
    *wt = tensor_gemm_type(t->type);
    if (*wt == GEMM_W_COUNT)
        return pd_err_set(err, PD_ERR_UNSUPPORTED, "tensor %s: type %s", name, gguf_type_name(t->type));
    return PD_OK;
}

static pd_status mat_load(const model *m, const char *name, uint64_t in, uint64_t outn,
                          gemm_backend be, gemm_w **out, pd_err *err)
{
    const gguf_tensor *t = NULL;
    gemm_wtype wt = GEMM_W_F32;
    pd_status st = tensor_get(m->file, name, in, outn, &t, err);
    if (st || (st = tensor_wtype(t, name, &wt, err)))
        return st;
    st = gemm_pack(t->data, wt, (uint32_t)outn, (uint32_t)in, be, m->alloc, out, err);
    if (st)
        pd_err_prefix(err, "tensor %s", name);
    else /* packed: the file's copy need not stay resident too */
        gguf_release_bytes(m->file, t->data, t->bytes);
    return st;
}

/* An expert stack [in, outn, n_expert] packed as n_expert matrices [outn x in]
 * (expert e is the e-th slab of outn rows): out[e], an array calloc'd here. */
static pd_status experts_load(const model *m, const char *name, uint64_t in, uint64_t outn,
                              gemm_backend be, gemm_w ***out, pd_err *err)
{
    const uint32_t E = m->hp.n_expert;
    const gguf_tensor *t = NULL;
    gemm_wtype wt = GEMM_W_F32;
    pd_status st = tensor_get3(m->file, name, in, outn, E, &t, err);
    if (st || (st = tensor_wtype(t, name, &wt, err)))
        return st;
    size_t row = gemm_row_bytes(wt, (uint32_t)in);
    if (row == 0)
        return pd_err_set(err, PD_ERR_FORMAT, "tensor %s: rows of %llu %s values", name, (unsigned long long)in,
                          gemm_wtype_name(wt));
    gemm_w **w = calloc(E, sizeof *w);
    if (!w)
        return pd_err_set(err, PD_ERR_NOMEM, "tensor %s: out of memory", name);
    *out = w; /* layer_free frees what was packed when a later expert fails */
    for (uint32_t e = 0; e < E; e++) {
        const uint8_t *slab = (const uint8_t *)t->data + (size_t)e * outn * row;
        if ((st = gemm_pack(slab, wt, (uint32_t)outn, (uint32_t)in, be, m->alloc, &w[e], err))) {
            pd_err_prefix(err, "tensor %s, expert %u", name, e);
            return st;
        }
    }
    gguf_release_bytes(m->file, t->data, t->bytes);
    return PD_OK;
}

static pd_status layer_load(model *m, uint32_t L, model_layer *ly, gemm_backend be, pd_err *err)
{
    const model_hparams *hp = &m->hp;
    uint64_t q_out = (uint64_t)hp->n_heads * hp->head_dim, kv_out = (uint64_t)hp->n_kv_heads * hp->head_dim;
    char n[96];
    pd_status st;
    /* every name read here is listed in model_layer_parts / model_layer_bias_parts
     * (tensor_used): a file holding any other tensor is refused */
#define LNAME(s) (snprintf(n, sizeof n, "blk.%u." s, L), n)
    if ((st = vec_load(m, LNAME("attn_norm.weight"), hp->hidden, &ly->attn_norm, err)) ||
        (st = vec_load(m, LNAME("ffn_norm.weight"), hp->hidden, &ly->ffn_norm, err)) ||
        (st = mat_load(m, LNAME("attn_q.weight"), hp->hidden, q_out, be, &ly->wq, err)) ||
        (st = mat_load(m, LNAME("attn_k.weight"), hp->hidden, kv_out, be, &ly->wk, err)) ||
        (st = mat_load(m, LNAME("attn_v.weight"), hp->hidden, kv_out, be, &ly->wv, err)) ||
        (st = mat_load(m, LNAME("attn_output.weight"), q_out, hp->hidden, be, &ly->wo, err)))
        return st;
    ly->ffn = ffn_kind_of(hp, L);
    switch (ly->ffn) {
    case MODEL_FFN_SWIGLU:
        if ((st = mat_load(m, LNAME("ffn_gate.weight"), hp->hidden, hp->ffn, be, &ly->wgate, err)) ||
            (st = mat_load(m, LNAME("ffn_up.weight"), hp->hidden, hp->ffn, be, &ly->wup, err)) ||
            (st = mat_load(m, LNAME("ffn_down.weight"), hp->ffn, hp->hidden, be, &ly->wdown, err)))
            return st;
        break;
    case MODEL_FFN_MOE: {
        uint64_t fe = hp->ffn_exp, fs = (uint64_t)hp->ffn_exp * hp->n_expert_shared;
        if ((st = mat_load(m, LNAME("ffn_gate_inp.weight"), hp->hidden, hp->n_expert, be, &ly->router, err)) ||
            (st = experts_load(m, LNAME("ffn_gate_exps.weight"), hp->hidden, fe, be, &ly->egate, err)) ||
            (st = experts_load(m, LNAME("ffn_up_exps.weight"), hp->hidden, fe, be, &ly->eup, err)) ||
            (st = experts_load(m, LNAME("ffn_down_exps.weight"), fe, hp->hidden, be, &ly->edown, err)) ||
            (st = mat_load(m, LNAME("ffn_gate_shexp.weight"), hp->hidden, fs, be, &ly->wgate, err)) ||
            (st = mat_load(m, LNAME("ffn_up_shexp.weight"), hp->hidden, fs, be, &ly->wup, err)) ||
            (st = mat_load(m, LNAME("ffn_down_shexp.weight"), fs, hp->hidden, be, &ly->wdown, err)))
            return st;
        if (hp->has_exp_probs_b && (st = vec_load(m, LNAME("exp_probs_b.bias"), hp->n_expert, &ly->exp_probs_b, err)))
            return st;
        break;
    }
    default:
        CHECKF(0, "layer %u: feed-forward kind %u", L, (unsigned)ly->ffn);
    }
    if (hp->qkv_bias) {
        if ((st = vec_load(m, LNAME("attn_q.bias"), q_out, &ly->bq, err)) ||
            (st = vec_load(m, LNAME("attn_k.bias"), kv_out, &ly->bk, err)) ||
            (st = vec_load(m, LNAME("attn_v.bias"), kv_out, &ly->bv, err)))
            return st;
    }
#undef LNAME
    return PD_OK;
}

static void layer_free(const model *m, model_layer *ly)
{
    const model_hparams *hp = &m->hp;
    uint64_t q_out = (uint64_t)hp->n_heads * hp->head_dim, kv_out = (uint64_t)hp->n_kv_heads * hp->head_dim;
    gemm_free(ly->wq);
    gemm_free(ly->wk);
    gemm_free(ly->wv);
    gemm_free(ly->wo);
    gemm_free(ly->wgate);
    gemm_free(ly->wup);
    gemm_free(ly->wdown);
    gemm_free(ly->router);
    gemm_w **stacks[3] = {ly->egate, ly->eup, ly->edown};
    for (int s = 0; s < 3; s++) {
        for (uint32_t e = 0; stacks[s] && e < hp->n_expert; e++)
            gemm_free(stacks[s][e]);
        free(stacks[s]);
    }
    pd_free_bytes(m->alloc, ly->attn_norm, hp->hidden * sizeof(float));
    pd_free_bytes(m->alloc, ly->ffn_norm, hp->hidden * sizeof(float));
    pd_free_bytes(m->alloc, ly->bq, q_out * sizeof(float));
    pd_free_bytes(m->alloc, ly->bk, kv_out * sizeof(float));
    pd_free_bytes(m->alloc, ly->bv, kv_out * sizeof(float));
    pd_free_bytes(m->alloc, ly->exp_probs_b, hp->n_expert * sizeof(float));
    memset(ly, 0, sizeof *ly);
}

pd_status model_read_hparams(const char *path, model_hparams *out, pd_err *err)
{
    gguf_file *f;
    pd_status st = gguf_open(path, &f, err);
    if (st) {
        pd_err_prefix(err, "%s", path);
        return st;
    }
    st = hparams_read(f, out, err);
    if (st)
        pd_err_prefix(err, "%s", path);
    gguf_close(f);
    return st;
}

static pd_status model_load_from(model *m, const char *path, const model_load_opts *opts, model **out, pd_err *err);

pd_status model_load(const char *path, const model_load_opts *opts, model **out, pd_err *err)
{
    model *m = calloc(1, sizeof *m);
    if (!m)
        return pd_err_set(err, PD_ERR_NOMEM, "model: out of memory");
    m->path = strdup(path);
    pd_status st = m->path ? gguf_open(path, &m->file, err) : pd_err_set(err, PD_ERR_NOMEM, "oom");
    if (st != PD_OK) {
        pd_err_prefix(err, "%s", path);
        model_free(m);
        return st;
    }
    return model_load_from(m, path, opts, out, err);
}

void *model_image_new(size_t len)
{
    void *p = mmap(NULL, len ? len : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void model_image_free(void *image, size_t len)
{
    if (image)
        munmap(image, len ? len : 1);
}

pd_status model_load_image(void *image, size_t len, const char *name, const model_load_opts *opts, model **out,
                           pd_err *err)
{
    model *m = calloc(1, sizeof *m);
    if (!m) {
        model_image_free(image, len);
        return pd_err_set(err, PD_ERR_NOMEM, "model: out of memory");
    }
    m->image = image;
    m->image_len = len;
    m->path = strdup(name);
    pd_status st = m->path ? gguf_open_mem(image, len, &m->file, err) : pd_err_set(err, PD_ERR_NOMEM, "oom");
    if (st != PD_OK) {
        pd_err_prefix(err, "%s", name);
        model_free(m);
        return st;
    }
    return model_load_from(m, name, opts, out, err);
}

int model_digest_inherit_header(model *m, const model *from)
{
    uint64_t size = gguf_file_size(m->file), data = gguf_data_offset(m->file);
    const void *a = gguf_bytes(m->file), *b = gguf_bytes(from->file);
    if (!a || !b || size != gguf_file_size(from->file) || data != gguf_data_offset(from->file) ||
        memcmp(a, b, (size_t)data) != 0)
        return 0;
    m->digest = model_digest(from);
    m->digest_done = 1;
    return 1;
}

const struct gguf_file *model_gguf(const model *m) { return m->file; }

static pd_status model_load_from(model *m, const char *path, const model_load_opts *opts, model **out, pd_err *err)
{
    m->alloc = opts->alloc;
    pd_status st = PD_OK;
    if (st == PD_OK)
        st = hparams_read(m->file, &m->hp, err);
    if (st == PD_OK) {
        const model_hparams *hp = &m->hp;
        m->first = opts->all_layers ? 0 : opts->first_layer;
        m->n_layers = opts->all_layers ? hp->n_layers : opts->n_layers;
        if ((uint64_t)m->first + m->n_layers > hp->n_layers)
            st = pd_err_set(err, PD_ERR_RANGE, "layers %u-%u requested but the model has %u layers",
                            m->first, m->first + m->n_layers - 1, hp->n_layers);
    }
    if (st == PD_OK && m->n_layers) {
        m->layers = calloc(m->n_layers, sizeof *m->layers);
        if (!m->layers)
            st = pd_err_set(err, PD_ERR_NOMEM, "model: out of memory");
        for (uint32_t i = 0; st == PD_OK && i < m->n_layers; i++)
            st = layer_load(m, m->first + i, &m->layers[i], opts->backend, err);
    }
    if (st == PD_OK && m->n_layers) {
        uint32_t n_pos = m->hp.ctx < MODEL_ROPE_TABLE_POSITIONS ? m->hp.ctx : MODEL_ROPE_TABLE_POSITIONS;
        const model *sh = opts->share_rope;
        if (sh && sh->rope && sh->hp.rope_base == m->hp.rope_base && sh->hp.head_dim == m->hp.head_dim &&
            sh->hp.ctx == m->hp.ctx) {
            m->rope = sh->rope; /* the same angles: built from the same three numbers */
            m->rope_borrowed = 1;
        } else
            st = rope_table_new(m->hp.rope_base, m->hp.head_dim, n_pos, m->alloc, &m->rope, err);
    }
    if (st == PD_OK && (opts->want_embed || (opts->want_output && m->hp.tied_output)))
        st = tensor_get(m->file, "token_embd.weight", m->hp.hidden, m->hp.vocab, &m->embd, err);
    if (st == PD_OK && opts->want_output) {
        st = vec_load(m, "output_norm.weight", m->hp.hidden, &m->out_norm, err);
        if (st == PD_OK)
            st = mat_load(m, m->hp.tied_output ? "token_embd.weight" : "output.weight", m->hp.hidden,
                          m->hp.vocab, opts->backend, &m->out, err);
    }
    if (st == PD_OK) {
        gguf_vtype et;
        const void *data;
        uint64_t count;
        if (gguf_find_key(m->file, "tokenizer.ggml.token_type") >= 0) {
            st = gguf_get_arr(m->file, "tokenizer.ggml.token_type", &et, &count, &data, err);
            if (st == PD_OK && (et != GGUF_VTYPE_INT32 || count != m->hp.vocab))
                st = pd_err_set(err, PD_ERR_FORMAT,
                                "tokenizer.ggml.token_type: expected %u int32 values", m->hp.vocab);
            m->token_types = data;
            m->n_token_types = count;
        }
    }
    if (st != PD_OK) {
        pd_err_prefix(err, "%s", path);
        model_free(m);
        return st;
    }
    *out = m;
    return PD_OK;
}

void model_free(model *m)
{
    if (!m)
        return;
    for (uint32_t i = 0; m->layers && i < m->n_layers; i++)
        layer_free(m, &m->layers[i]);
    free(m->layers);
    if (!m->rope_borrowed)
        rope_table_free(m->rope);
    gemm_free(m->out);
    pd_free_bytes(m->alloc, m->out_norm, m->hp.hidden * sizeof(float));
    gguf_close(m->file);
    model_image_free(m->image, m->image_len);
    free(m->path);
    free(m);
}

const model_hparams *model_hp(const model *m) { return &m->hp; }
uint32_t model_first_layer(const model *m) { return m->first; }
uint32_t model_layer_count(const model *m) { return m->n_layers; }


const model_layer *model_layer_get(const model *m, uint32_t layer)
{
    CHECKF(layer >= m->first && layer < m->first + m->n_layers, "layer %u outside [%u, %u)", layer,
           m->first, m->first + m->n_layers);
    CHECKF(m->layers[layer - m->first].wq, "layer %u's weights were released", layer);
    return &m->layers[layer - m->first];
}

void model_release_layers(model *m, uint32_t first, uint32_t n)
{
    for (uint32_t L = first; L < first + n; L++)
        if (L >= m->first && L < m->first + m->n_layers && m->layers[L - m->first].wq)
            layer_free(m, &m->layers[L - m->first]);
}

int model_holds_layers(const model *m, uint32_t first, uint32_t n)
{
    if (first < m->first || first + n > m->first + m->n_layers)
        return 0;
    for (uint32_t L = first; L < first + n; L++)
        if (!m->layers[L - m->first].wq)
            return 0;
    return 1;
}

static uint64_t layer_bytes(const model *m, const model_layer *ly)
{
    uint64_t b = gemm_bytes(ly->wq) + gemm_bytes(ly->wk) + gemm_bytes(ly->wv) + gemm_bytes(ly->wo);
    b += gemm_bytes(ly->wgate) + gemm_bytes(ly->wup) + gemm_bytes(ly->wdown);
    if (ly->ffn == MODEL_FFN_MOE) {
        b += gemm_bytes(ly->router);
        for (uint32_t e = 0; ly->egate && e < m->hp.n_expert; e++)
            b += gemm_bytes(ly->egate[e]) + gemm_bytes(ly->eup[e]) + gemm_bytes(ly->edown[e]);
    }
    return b;
}

uint64_t model_weight_bytes(const model *m)
{
    uint64_t b = 0;
    for (uint32_t i = 0; i < m->n_layers; i++)
        b += layer_bytes(m, &m->layers[i]);
    if (m->out)
        b += gemm_bytes(m->out);
    return b;
}

uint64_t model_layers_bytes(const model *m, uint32_t first, uint32_t n)
{
    uint64_t b = 0;
    for (uint32_t L = first; L < first + n; L++)
        if (L >= m->first && L < m->first + m->n_layers)
            b += layer_bytes(m, &m->layers[L - m->first]);
    return b;
}

/* A 64-bit digest of the file: four independent multiply-xorshift lanes over
 * 8-byte words, so it runs near memory speed. Computed on first use only
 * (checkpoints and migration need it; plain decoding does not). */
uint64_t model_digest(const model *m)
{
    model *mm = (model *)m;
    if (mm->digest_done)
        return mm->digest;
    uint64_t size = gguf_file_size(m->file);
    const uint8_t *base = gguf_bytes(m->file);
    uint64_t h[4] = {0x9e3779b97f4a7c15ull, 0xc2b2ae3d27d4eb4full, 0x165667b19e3779f9ull,
                     0x27d4eb2f165667c5ull};
    uint64_t n8 = base ? size / 8 : 0;
    for (uint64_t i = 0; i < n8; i++) {
        uint64_t w;
        memcpy(&w, base + i * 8, 8);
        uint64_t *x = &h[i & 3];
        *x = (*x ^ w) * 0x9fb21c651e98df25ull;
        *x ^= *x >> 29;
    }
    uint64_t d = size;
    for (int i = 0; i < 4; i++) {
        d ^= h[i] + 0x9e3779b97f4a7c15ull + (d << 6) + (d >> 2);
    }
    if (base) /* the last size % 8 bytes: FNV-1a continued from d */
        d = pd_fnv_bytes(d, base + n8 * 8, (size_t)(size - n8 * 8));
    mm->digest = d;
    mm->digest_done = 1;
    return d;
}

int model_digest_inherit(model *m, const model *from)
{
    if (model_fingerprint(m) != model_fingerprint(from))
        return 0;
    m->digest = model_digest(from);
    m->digest_done = 1;
    return 1;
}

/* What ranks compare at start-up: cheap (it reads the header and 12 KiB
 * per tensor, not the whole file), yet a different model — other weights,
 * other shapes, another file version — differs: the file size, every byte
 * before the data section (metadata and tensor directory), and up to 4 KiB
 * at the start, the middle and the end of every tensor's data. */
uint64_t model_fingerprint(const model *m)
{
    const uint8_t *base = gguf_bytes(m->file);
    uint64_t size = gguf_file_size(m->file), data = gguf_data_offset(m->file);
    uint64_t h = pd_fnv_le(PD_FNV_OFFSET, size, 8);
    if (!base)
        return h;
    h = pd_fnv_bytes(h, base, (size_t)(data < size ? data : size));
    for (uint64_t i = 0; i < gguf_tensor_count(m->file); i++) {
        const gguf_tensor *t = gguf_tensor_at(m->file, i);
        const uint8_t *p = t->data;
        uint64_t span = t->bytes < 4096 ? t->bytes : 4096;
        uint64_t at[3] = {0, (t->bytes - span) / 2, t->bytes - span};
        for (int k = 0; k < 3; k++)
            h = pd_fnv_bytes(h, p + at[k], (size_t)span);
    }
    return h;
}

void model_embed(const model *m, const uint32_t *tokens, uint32_t n, float *out)
{
    CHECK(m->embd);
    uint32_t hd = m->hp.hidden;
    for (uint32_t i = 0; i < n; i++) {
        CHECKF(tokens[i] < m->hp.vocab, "token %u outside vocab %u", tokens[i], m->hp.vocab);
        tensor_row_f32(m->embd, (uint64_t)tokens[i] * hd, hd, out + (size_t)i * hd);
    }
}

void model_logits(const model *m, float *x, uint32_t n, float *logits, pool *p)
{
    CHECK(m->out && m->out_norm);
    uint32_t hd = m->hp.hidden;
    for (uint32_t i = 0; i < n; i++)
        model_rmsnorm(x + (size_t)i * hd, m->out_norm, hd, m->hp.rms_eps, x + (size_t)i * hd);
    gemm_run(m->out, x, n, logits, p);
}

pd_status model_token(const model *m, uint32_t id, const char **s, size_t *len, pd_err *err)
{
    return gguf_get_str_arr(m->file, "tokenizer.ggml.tokens", id, s, len, err);
}

int32_t model_token_type(const model *m, uint32_t id)
{
    if (!m->token_types || id >= m->n_token_types)
        return 1;
    return gguf_arr_i32_at(m->token_types, id);
}

/* ---- one layer of a micro-batch ------------------------------------------ */

/* INV: every buffer holds rows x its width floats (64-byte aligned); the MOE
 * buffers are NULL when the model has no experts (n_expert == 0). */
struct model_scratch {
    uint32_t rows;
    float *h, *o;   /* [rows x hidden] */
    float *q, *att; /* [rows x n_heads * head_dim] */
    float *k, *v;   /* [rows x n_kv_heads * head_dim] */
    float *g, *u;   /* SWIGLU / MOE shared experts: [rows x max(ffn, ffn_exp * n_expert_shared)] */
    /* MOE, K = n_expert_used, E = n_expert: */
    float *probs;   /* [rows x E] router logits, then probabilities */
    uint32_t *sel;  /* [rows x K] row i's experts in rank order */
    float *wt;      /* [rows x K] their weights */
    uint32_t *slot; /* [rows x K] where (row i, rank r) sits among the gathered rows */
    uint32_t *off;  /* [E + 1] expert e's gathered rows are [off[e], off[e + 1]) */
    uint32_t *fill; /* [E] rows placed so far while gathering */
    uint32_t *act;  /* [E] experts used by some row, increasing */
    float *xa, *xy; /* [rows x K x hidden] gathered inputs, expert outputs */
    uint64_t moe_calls, moe_active; /* MoE layer runs, and the experts they used in all */
    float *xg, *xu; /* [rows x K x ffn_exp] */
    /* attention split by KV heads: one scratch of ascr_per floats per pool
     * thread, grown before a layer's attends when its rows need more */
    float *ascr;
    size_t ascr_per;
    uint32_t ascr_threads;
};

static float *scratch_f(uint64_t n)
{
    return n ? aligned_alloc(64, ((n * sizeof(float)) + 63) & ~(uint64_t)63) : NULL;
}

pd_status model_scratch_new(const model_hparams *hp, uint32_t max_rows, model_scratch **out, pd_err *err)
{
    if (max_rows == 0)
        return pd_err_set(err, PD_ERR_ARG, "model: scratch for 0 rows");
    model_scratch *s = calloc(1, sizeof *s);
    if (!s)
        return pd_err_set(err, PD_ERR_NOMEM, "model: out of memory");
    uint64_t R = max_rows, qd = (uint64_t)hp->n_heads * hp->head_dim, kvd = (uint64_t)hp->n_kv_heads * hp->head_dim;
    s->rows = max_rows;
    s->h = scratch_f(R * hp->hidden);
    s->o = scratch_f(R * hp->hidden);
    s->q = scratch_f(R * qd);
    s->att = scratch_f(R * qd);
    s->k = scratch_f(R * kvd);
    s->v = scratch_f(R * kvd);
    uint64_t gw = hp->ffn, shw = (uint64_t)hp->ffn_exp * hp->n_expert_shared;
    gw = shw > gw ? shw : gw;
    s->g = scratch_f(R * gw);
    s->u = scratch_f(R * gw);
    int moe_ok = 1;
    if (hp->n_expert) {
        uint64_t E = hp->n_expert, RK = R * hp->n_expert_used;
        s->probs = scratch_f(R * E);
        s->wt = scratch_f(RK);
        s->sel = malloc(RK * sizeof *s->sel);
        s->slot = malloc(RK * sizeof *s->slot);
        s->off = malloc((E + 1) * sizeof *s->off);
        s->fill = malloc(E * sizeof *s->fill);
        s->act = malloc(E * sizeof *s->act);
        s->xa = scratch_f(RK * hp->hidden);
        s->xy = scratch_f(RK * hp->hidden);
        s->xg = scratch_f(RK * hp->ffn_exp);
        s->xu = scratch_f(RK * hp->ffn_exp);
        moe_ok = s->probs && s->wt && s->sel && s->slot && s->off && s->fill && s->act && s->xa && s->xy &&
                 s->xg && s->xu;
    }
    if (!s->h || !s->o || !s->q || !s->att || !s->k || !s->v || !s->g || !s->u || !moe_ok) {
        model_scratch_free(s);
        return pd_err_set(err, PD_ERR_NOMEM, "model: out of memory for %u-row scratch", max_rows);
    }
    *out = s;
    return PD_OK;
}

void model_scratch_free(model_scratch *s)
{
    if (!s)
        return;
    free(s->h);
    free(s->o);
    free(s->q);
    free(s->att);
    free(s->k);
    free(s->v);
    free(s->g);
    free(s->u);
    free(s->probs);
    free(s->wt);
    free(s->sel);
    free(s->slot);
    free(s->off);
    free(s->fill);
    free(s->act);
    free(s->xa);
    free(s->xy);
    free(s->xg);
    free(s->xu);
    free(s->ascr);
    free(s);
}

uint32_t model_scratch_rows(const model_scratch *s)
{
    return s->rows;
}

void model_scratch_moe_stats(const model_scratch *s, uint64_t *calls, uint64_t *experts)
{
    *calls = s->moe_calls;
    *experts = s->moe_active;
}

static void hooks_progress(const model_hooks *hk)
{
    if (hk && hk->progress)
        hk->progress(hk->ctx);
}

/* ---- feed-forward kinds: one routine each, dispatched per layer ---------- */

typedef void (*model_ffn_fn)(const model_layer *ly, const model_hparams *hp, const float *h, uint32_t n,
                             float *out, model_scratch *s, pool *p, const model_hooks *hk);

static void ffn_swiglu(const model_layer *ly, const model_hparams *hp, const float *h, uint32_t n, float *out,
                       model_scratch *s, pool *p, const model_hooks *hk)
{
    gemm_run_many(2, (const gemm_w *const[]){ly->wgate, ly->wup}, h, n, (float *const[]){s->g, s->u}, p);
    hooks_progress(hk);
    model_swiglu(s->g, s->u, n * hp->ffn, s->g);
    gemm_run(ly->wdown, s->g, n, out, p);
    hooks_progress(hk);
}

/* One routed expert on its gathered rows (a pool task per active expert). */
typedef struct moe_ctx {
    const model_layer *ly;
    const model_hparams *hp;
    model_scratch *s;
    pool *p; /* for the GEMMs when experts run one after the other, else NULL */
    uint32_t n_act, ahead; /* experts handed out; threads claiming them (1 when serial) */
} moe_ctx;

/* The expert's gate and up matrices' first bytes on their way in (the
 * kernels prefetch the rest as they stream, gemm_prefetch_start). */
static void moe_prefetch_gate_up(const moe_ctx *c, uint32_t task)
{
    if (task < c->n_act) {
        const uint32_t e = c->s->act[task];
        gemm_prefetch_start(c->ly->egate[e]);
        gemm_prefetch_start(c->ly->eup[e]);
    }
}

static void moe_expert_task(void *ctxp, uint32_t task, uint32_t thread)
{
    (void)thread;
    const moe_ctx *c = ctxp;
    const model_scratch *s = c->s;
    const uint32_t e = s->act[task], r0 = s->off[e], nr = s->off[e + 1] - r0;
    const uint64_t H = c->hp->hidden, F = c->hp->ffn_exp;
    /* this expert's down projection, read after its gate and up, and the
     * expert the next free thread claims (tasks are claimed in order) */
    gemm_prefetch_start(c->ly->edown[e]);
    moe_prefetch_gate_up(c, task + c->ahead);
    float *g = s->xg + r0 * F, *u = s->xu + r0 * F;
    gemm_run_many(2, (const gemm_w *const[]){c->ly->egate[e], c->ly->eup[e]}, s->xa + r0 * H, nr,
                  (float *const[]){g, u}, c->p);
    model_swiglu(g, u, (uint32_t)(nr * F), g);
    gemm_run(c->ly->edown[e], g, nr, s->xy + r0 * H, c->p);
}

static void ffn_moe(const model_layer *ly, const model_hparams *hp, const float *h, uint32_t n, float *out,
                    model_scratch *s, pool *p, const model_hooks *hk)
{
    const uint32_t E = hp->n_expert, K = hp->n_expert_used;
    const uint64_t H = hp->hidden, FS = (uint64_t)hp->ffn_exp * hp->n_expert_shared;
    /* the router's logits and the shared experts' gate/up of every row */
    gemm_run_many(3, (const gemm_w *const[]){ly->router, ly->wgate, ly->wup}, h, n,
                  (float *const[]){s->probs, s->g, s->u}, p);
    hooks_progress(hk);
    /* route every row */
    const model_moe_opts ro = {
        .gating = hp->moe_gating,
        .sel_bias = ly->exp_probs_b,
        .norm_w = hp->expert_weights_norm,
        /* deepseek (V1): llama.cpp passes no scale */
        .scale_w = hp->arch == MODEL_ARCH_DEEPSEEK2_OCR ? hp->expert_weights_scale : 0.0f,
    };
    for (uint32_t i = 0; i < n; i++)
        model_moe_route_ex(s->probs + (uint64_t)i * E, E, K, &ro, s->probs + (uint64_t)i * E,
                           s->sel + (uint64_t)i * K, s->wt + (uint64_t)i * K);
    /* gather: expert e's rows in row order at [off[e], off[e + 1]) */
    memset(s->off, 0, (E + 1) * sizeof *s->off);
    for (uint64_t j = 0; j < (uint64_t)n * K; j++)
        s->off[s->sel[j] + 1]++;
    uint32_t n_act = 0;
    for (uint32_t e = 0; e < E; e++) {
        if (s->off[e + 1])
            s->act[n_act++] = e;
        s->off[e + 1] += s->off[e];
        s->fill[e] = 0;
    }
    s->moe_calls++;
    s->moe_active += n_act;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t r = 0; r < K; r++) {
            uint32_t e = s->sel[(uint64_t)i * K + r], at = s->off[e] + s->fill[e]++;
            s->slot[(uint64_t)i * K + r] = at;
            memcpy(s->xa + at * H, h + i * H, H * sizeof(float));
        }
    /* each used expert once, on all its rows: a pool task each (its GEMMs on
     * that thread); OpenBLAS sets a process-wide thread count per call, so
     * that backend runs the experts one after the other, each GEMM on the
     * pool */
    int serial = gemm_get_backend(ly->router) == GEMM_BACKEND_OPENBLAS || pool_threads(p) == 1;
    moe_ctx c = {.ly = ly, .hp = hp, .s = s, .p = serial ? p : NULL, .n_act = n_act,
                 .ahead = serial ? 1 : pool_threads(p)};
    /* the experts claimed first: each thread's first one (the caller's in
     * its own cache, the others' at least on their way from memory) */
    for (uint32_t t = 0; t < c.ahead; t++)
        moe_prefetch_gate_up(&c, t);
    model_swiglu(s->g, s->u, (uint32_t)(n * FS), s->g);
    if (serial) {
        for (uint32_t t = 0; t < n_act; t++)
            moe_expert_task(&c, t, 0);
        gemm_run(ly->wdown, s->g, n, out, p);
    } else {
        /* the shared experts' down projection into out, its panels handed
         * out behind the routed experts: threads that finish their experts
         * unevenly take its panels (batch 1: 6 experts on 2 threads) */
        gemm_run_beside(ly->wdown, s->g, n, out, p, n_act, moe_expert_task, &c);
    }
    hooks_progress(hk);
    /* scatter: per row, the weighted expert outputs in rank order, then the
     * shared experts' output (MODEL_FFN_MOE's order; separate multiply and
     * add, kernels build with -ffp-contract=off) */
    for (uint32_t i = 0; i < n; i++) {
        const uint32_t *sl = s->slot + (uint64_t)i * K;
        const float *w = s->wt + (uint64_t)i * K;
        float *o = out + i * H;
        const float *y0 = s->xy + sl[0] * H;
        for (uint64_t c0 = 0; c0 < H; c0++) {
            float acc = y0[c0] * w[0];
            for (uint32_t r = 1; r < K; r++)
                acc = acc + s->xy[sl[r] * H + c0] * w[r];
            o[c0] = acc + o[c0];
        }
    }
}

static const struct {
    const char *name;
    model_ffn_fn run;
} ffn_kinds[] = {
    [MODEL_FFN_SWIGLU] = {"swiglu", ffn_swiglu},
    [MODEL_FFN_MOE] = {"moe", ffn_moe},
};
_Static_assert(sizeof ffn_kinds / sizeof ffn_kinds[0] == MODEL_FFN_KIND_COUNT,
               "every feed-forward kind has a routine");

const char *model_ffn_kind_name(model_ffn_kind k)
{
    return (unsigned)k < MODEL_FFN_KIND_COUNT ? ffn_kinds[k].name : "unknown";
}

void model_ffn(const model *m, uint32_t layer, const float *h, uint32_t n, float *out, model_scratch *s,
               pool *p, const model_hooks *hooks)
{
    const model_layer *ly = model_layer_get(m, layer);
    CHECKF(n <= s->rows, "model: %u rows, scratch of %u", n, s->rows);
    CHECKF((unsigned)ly->ffn < MODEL_FFN_KIND_COUNT, "layer %u: feed-forward kind %u", layer, (unsigned)ly->ffn);
    ffn_kinds[ly->ffn].run(ly, &m->hp, h, n, out, s, p, hooks);
}

/* ---- attention: one pool task per group ---------------------------------- */

typedef struct attend_ctx {
    const model_batch *b;
    model_scratch *s;
    uint64_t qd, kvd;
    pd_status status;
    pd_err err;
} attend_ctx;

static pd_status group_append(const attend_ctx *a, const model_group *gr, pd_err *err)
{
    lcache_group lg = {.pos = a->b->pos[gr->row0], .n = gr->n, .roles = a->b->roles + gr->row0};
    return lcache_append(gr->cache, &lg, a->s->k + gr->row0 * a->kvd, a->s->v + gr->row0 * a->kvd, err);
}

/* Every row of the open group attends with all heads. */
static pd_status group_attend_rows(const attend_ctx *a, const model_group *gr, pd_err *err)
{
    const model_scratch *s = a->s;
    pd_status rc = PD_OK;
    for (uint32_t j = 0; rc == PD_OK && j < gr->n; j++)
        rc = lcache_attend(gr->cache, j, s->q + (gr->row0 + j) * a->qd, s->att + (gr->row0 + j) * a->qd, err);
    return rc;
}

static pd_status group_attend(const attend_ctx *a, const model_group *gr, pd_err *err)
{
    pd_status rc = group_append(a, gr, err);
    if (rc == PD_OK)
        rc = group_attend_rows(a, gr, err);
    if (rc == PD_OK)
        rc = lcache_end(gr->cache, err);
    return rc;
}

/* Records a task's failure: the first one wins (the pool runs tasks on
 * several threads). */
static void attend_fail(attend_ctx *a, pd_status rc, const pd_err *e)
{
    if (rc != PD_OK && __atomic_exchange_n(&a->status, rc, __ATOMIC_ACQ_REL) == PD_OK)
        a->err = *e;
}

static void attend_task(void *ctx, uint32_t task, uint32_t thread)
{
    (void)thread;
    attend_ctx *a = ctx;
    pd_err e = {0};
    attend_fail(a, group_attend(a, &a->b->groups[task], &e), &e);
}

/* Fewer groups than threads (one stream's decode step or its prefill): the
 * groups whose container splits (lcache_attend_splits) attend by ranges of
 * KV heads, one pool task per (group, range), each thread in its own
 * scratch; the others run whole as one task. Appends and ends stay on the
 * calling thread. Task t is part t % parts of group t / parts (a group that
 * does not split does its work in part 0). */
typedef struct attend_split_ctx {
    attend_ctx *a;
    uint32_t parts, n_kv;
    const uint8_t *split; /* [n_groups] */
} attend_split_ctx;

static void attend_split_task(void *ctx, uint32_t task, uint32_t thread)
{
    attend_split_ctx *sp = ctx;
    attend_ctx *a = sp->a;
    const uint32_t g = task / sp->parts, part = task % sp->parts;
    const model_group *gr = &a->b->groups[g];
    model_scratch *s = a->s;
    pd_err e = {0};
    pd_status rc = PD_OK;
    if (sp->split[g]) {
        uint32_t h0 = (uint32_t)((uint64_t)part * sp->n_kv / sp->parts);
        uint32_t h1 = (uint32_t)((uint64_t)(part + 1) * sp->n_kv / sp->parts);
        for (uint32_t j = 0; rc == PD_OK && h0 < h1 && j < gr->n; j++)
            rc = lcache_attend_heads(gr->cache, j, h0, h1, s->q + (gr->row0 + j) * a->qd,
                                     s->att + (gr->row0 + j) * a->qd, s->ascr + (size_t)thread * s->ascr_per,
                                     s->ascr_per, &e);
    } else if (part == 0) {
        rc = group_attend_rows(a, gr, &e);
    }
    attend_fail(a, rc, &e);
}

/* Makes room for `threads` attention scratches of `per` floats; 0 when it
 * cannot (the caller then attends by groups). */
static int ascr_reserve(model_scratch *s, uint32_t threads, size_t per)
{
    if (s->ascr && s->ascr_threads >= threads && s->ascr_per >= per)
        return 1;
    per += per / 2; /* rows grow by one a step: grow ahead */
    float *n = malloc((size_t)threads * per * sizeof *n);
    if (!n)
        return 0;
    free(s->ascr);
    s->ascr = n;
    s->ascr_per = per;
    s->ascr_threads = threads;
    return 1;
}

/* The split path of model_layer_forward's attention; 0 when no group splits
 * (nothing done: the caller attends by groups). */
static int attend_by_heads(const model_batch *b, uint32_t n_kv, attend_ctx *a, pool *p)
{
    const uint32_t threads = pool_threads(p), G = b->n_groups;
    if (threads < 2 || G >= threads)
        return 0;
    uint8_t split[POOL_MAX_THREADS] = {0};
    uint32_t n_split = 0;
    for (uint32_t g = 0; g < G; g++)
        n_split += split[g] = (uint8_t)(lcache_attend_splits(b->groups[g].cache) != 0);
    if (n_split == 0)
        return 0;
    uint32_t g = 0;
    for (; g < G && a->status == PD_OK; g++)
        a->status = group_append(a, &b->groups[g], &a->err);
    size_t per = 0;
    for (uint32_t i = 0; i < g; i++) {
        size_t need = split[i] ? lcache_attend_heads_scratch(b->groups[i].cache) : 0;
        per = need > per ? need : per;
    }
    if (a->status == PD_OK && !ascr_reserve(a->s, threads, per))
        for (uint32_t i = 0; i < G; i++)
            split[i] = 0; /* attend whole rows: same bits, one thread a group */
    if (a->status == PD_OK) {
        attend_split_ctx sp = {.a = a, .parts = threads < n_kv ? threads : n_kv, .n_kv = n_kv, .split = split};
        pool_run(p, G * sp.parts, attend_split_task, &sp);
    }
    for (uint32_t i = 0; i < g; i++) {
        pd_err e = {0};
        pd_status rc = lcache_end(b->groups[i].cache, &e);
        if (rc != PD_OK && a->status == PD_OK) {
            a->status = rc;
            a->err = e;
        }
    }
    return 1;
}

static void add_bias(float *x, const float *b, uint32_t n, uint32_t width)
{
    if (!b)
        return;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t c = 0; c < width; c++)
            x[(uint64_t)i * width + c] += b[c];
}

pd_status model_layer_forward(const model *m, uint32_t layer, const model_batch *b, float *x,
                              model_scratch *s, pool *p, const model_hooks *hooks, pd_err *err)
{
    const model_hparams *hp = &m->hp;
    const model_layer *ly = model_layer_get(m, layer);
    const uint32_t H = hp->hidden, hd = hp->head_dim, n = b->n;
    const uint32_t qd = hp->n_heads * hd, kvd = hp->n_kv_heads * hd;
    CHECKF(n <= s->rows, "model: %u rows, scratch of %u", n, s->rows);
    if (n == 0)
        return PD_OK;
    for (uint32_t i = 0; i < n; i++)
        model_rmsnorm(x + (uint64_t)i * H, ly->attn_norm, H, hp->rms_eps, s->h + (uint64_t)i * H);
    gemm_run_many(3, (const gemm_w *const[]){ly->wq, ly->wk, ly->wv}, s->h, n, (float *const[]){s->q, s->k, s->v},
                  p);
    hooks_progress(hooks);
    add_bias(s->q, ly->bq, n, qd);
    add_bias(s->k, ly->bk, n, kvd);
    add_bias(s->v, ly->bv, n, kvd);
    const rope_pairs pairs = hp->rope == MODEL_ROPE_NORM ? ROPE_PAIRS_ADJACENT : ROPE_PAIRS_HALVES;
    for (uint32_t i = 0; i < n; i++) {
        rope_table_apply(m->rope, s->q + (uint64_t)i * qd, hp->n_heads, b->pos[i], pairs);
        rope_table_apply(m->rope, s->k + (uint64_t)i * kvd, hp->n_kv_heads, b->pos[i], pairs);
    }
    /* deepseek2-ocr with rope-scaling keys: kq_scale = mscale^2 / sqrt(head_dim)
     * (model_ocr_kq_mul); the attention applies 1 / sqrt(head_dim), the query
     * carries mscale^2 (row-local, so batch invariance holds) */
    if (hp->kq_mul != 1.0f)
        for (uint64_t i = 0; i < (uint64_t)n * qd; i++)
            s->q[i] *= hp->kq_mul;
    attend_ctx a = {.b = b, .s = s, .qd = qd, .kvd = kvd, .status = PD_OK};
    if (!attend_by_heads(b, hp->n_kv_heads, &a, p))
        pool_run(p, b->n_groups, attend_task, &a);
    if (a.status != PD_OK)
        return pd_err_set(err, a.status, "layer %u: %s", layer, a.err.msg);
    hooks_progress(hooks);
    gemm_run(ly->wo, s->att, n, s->o, p);
    for (uint64_t i = 0; i < (uint64_t)n * H; i++)
        x[i] = x[i] + s->o[i];
    for (uint32_t i = 0; i < n; i++)
        model_rmsnorm(x + (uint64_t)i * H, ly->ffn_norm, H, hp->rms_eps, s->h + (uint64_t)i * H);
    model_ffn(m, layer, s->h, n, s->o, s, p, hooks);
    for (uint64_t i = 0; i < (uint64_t)n * H; i++)
        x[i] = x[i] + s->o[i];
    return PD_OK;
}

/* ---- row-local math ----------------------------------------------------- */

void model_rmsnorm(const float *x, const float *w, uint32_t n, float eps, float *y)
{
    float ss = attn_dot8(x, x, n);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (uint32_t i = 0; i < n; i++)
        y[i] = (x[i] * r) * w[i];
}

void model_rope_row(float *x, uint32_t n_heads, uint32_t head_dim, uint64_t pos, float base,
                    model_rope style)
{
    /* the table's routine, one row: the same bits as a model's table */
    uint32_t half = head_dim / 2;
    float cs[512], sn[512];
    CHECK(half <= 512);
    for (uint32_t i = 0; i < half; i++)
        rope_angle(pos, rope_freq(base, head_dim, i), &cs[i], &sn[i]);
    for (uint32_t h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * head_dim;
        for (uint32_t i = 0; i < half; i++) {
            uint32_t a = style == MODEL_ROPE_NORM ? 2 * i : i;
            uint32_t b = style == MODEL_ROPE_NORM ? 2 * i + 1 : i + half;
            float x0 = v[a], x1 = v[b];
            v[a] = x0 * cs[i] - x1 * sn[i];
            v[b] = x0 * sn[i] + x1 * cs[i];
        }
    }
}

/* The top k of p (+ o's selection bias) and their weights (o's norm and
 * scale). Selection: the largest remaining each time, strictly greater wins,
 * so among equal scores the lowest index comes first. k x n_expert compares
 * (64 x 6 for the OCR decoder): cheaper than a sort. */
static void model_moe_select(const float *p, uint32_t n_expert, uint32_t k, const model_moe_opts *o, uint32_t *sel,
                             float *w)
{
    const float *b = o ? o->sel_bias : NULL;
    for (uint32_t r = 0; r < k; r++) {
        uint32_t best = UINT32_MAX;
        float bs = 0.0f;
        for (uint32_t e = 0; e < n_expert; e++) {
            int taken = 0;
            for (uint32_t q = 0; q < r && !taken; q++)
                taken = sel[q] == e;
            const float sc = b ? p[e] + b[e] : p[e];
            if (!taken && (best == UINT32_MAX || sc > bs)) {
                best = e;
                bs = sc;
            }
        }
        sel[r] = best;
        w[r] = p[best];
    }
    if (o && o->norm_w) {
        double sum = 0.0;
        for (uint32_t r = 0; r < k; r++)
            sum += (double)w[r];
        float s = (float)sum;
        s = s < 6.103515625e-5f ? 6.103515625e-5f : s;
        for (uint32_t r = 0; r < k; r++)
            w[r] = w[r] / s;
    }
    if (o && o->scale_w != 0.0f && o->scale_w != 1.0f)
        for (uint32_t r = 0; r < k; r++)
            w[r] = w[r] * o->scale_w;
}

void model_moe_route(const float *logits, uint32_t n_expert, uint32_t k, float *p, uint32_t *sel, float *w)
{
    model_moe_route_ex(logits, n_expert, k, NULL, p, sel, w);
}

void model_moe_route_ex(const float *logits, uint32_t n_expert, uint32_t k, const model_moe_opts *o, float *p,
                        uint32_t *sel, float *w)
{
    CHECKF(k >= 1 && k <= n_expert, "model_moe_route: top %u of %u", k, n_expert);
    if (o && o->gating == MODEL_MOE_SIGMOID) {
        for (uint32_t e = 0; e < n_expert; e++)
            p[e] = -logits[e];
        pd_expf_n(p, p, n_expert);
        for (uint32_t e = 0; e < n_expert; e++)
            p[e] = 1.0f / (1.0f + p[e]);
        model_moe_select(p, n_expert, k, o, sel, w);
        return;
    }
    float mx = logits[0];
    for (uint32_t e = 1; e < n_expert; e++)
        mx = logits[e] > mx ? logits[e] : mx;
    for (uint32_t e = 0; e < n_expert; e++)
        p[e] = logits[e] - mx;
    pd_expf_n(p, p, n_expert);
    double sum = 0.0;
    for (uint32_t e = 0; e < n_expert; e++)
        sum += (double)p[e];
    const float inv = (float)(1.0 / sum);
    for (uint32_t e = 0; e < n_expert; e++)
        p[e] = p[e] * inv;
    model_moe_select(p, n_expert, k, o, sel, w);
}

void model_swiglu(const float *g, const float *u, uint32_t n, float *a)
{
    /* exponentials in blocks through pd_expf_n (vectorized, the same bits as
     * pd_expf); a may alias g */
    float e[256];
    for (uint32_t i0 = 0; i0 < n; i0 += 256) {
        uint32_t m = n - i0 < 256 ? n - i0 : 256;
        for (uint32_t i = 0; i < m; i++)
            e[i] = -g[i0 + i];
        pd_expf_n(e, e, m);
        for (uint32_t i = 0; i < m; i++)
            a[i0 + i] = (g[i0 + i] / (1.0f + e[i])) * u[i0 + i];
    }
}
