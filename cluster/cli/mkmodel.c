/* mkmodel: deterministic synthetic llama / qwen2 / deepseek GGUF files. */
#include "cluster/cli/mkmodel.h"

#include "base/fp16.h"
#include "cluster/format/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void mkmodel_defaults(mkmodel_opts *o)
{
    *o = (mkmodel_opts){.arch = MODEL_ARCH_LLAMA,
                        .layers = 4,
                        .hidden = 64,
                        .heads = 4,
                        .kv_heads = 2,
                        .ffn = 128,
                        .vocab = 512,
                        .ctx = 2048,
                        .seed = 1,
                        .eos_boost = 1.0f};
}

void mkmodel_defaults_deepseek(mkmodel_opts *o)
{
    *o = (mkmodel_opts){.arch = MODEL_ARCH_DEEPSEEK,
                        .layers = 12,
                        .hidden = 1280,
                        .heads = 10,
                        .kv_heads = 10,
                        .ffn = 6848,
                        .vocab = 129280,
                        .ctx = 8192,
                        .seed = 1,
                        .eos_boost = 1.0f,
                        .dense_lead = 1,
                        .experts = 64,
                        .experts_used = 6,
                        .expert_ffn = 896,
                        .shared = 2,
                        .expert_scale = 1.0f};
}

static uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [-a, a), a pure function of (seed, tensor tag, element). */
static float uval(uint64_t seed, uint64_t tag, uint64_t i, float a)
{
    uint64_t r = mix64(seed * 0x9e3779b97f4a7c15ull ^ mix64(tag + 0x632be59bd9b4e019ull) ^ (i * 0xd1b54a32d192ed03ull));
    double u = (double)(r >> 11) / 9007199254740992.0;
    return (float)((2.0 * u - 1.0) * a);
}

typedef struct mk_ctx {
    const mkmodel_opts *o;
    gguf_writer *w;
    void **bufs;
    size_t n_bufs, cap_bufs;
    uint64_t tag;
} mk_ctx;

static void *mk_keep(mk_ctx *c, size_t bytes)
{
    if (c->n_bufs == c->cap_bufs) {
        size_t nc = c->cap_bufs ? 2 * c->cap_bufs : 64;
        void **nb = realloc(c->bufs, nc * sizeof *nb);
        if (!nb)
            return NULL;
        c->bufs = nb;
        c->cap_bufs = nc;
    }
    void *p = malloc(bytes ? bytes : 1);
    if (p)
        c->bufs[c->n_bufs++] = p;
    return p;
}

static const uint32_t mk_gguf_type[] = {[MK_F32] = GGUF_TENSOR_F32,   [MK_F16] = GGUF_TENSOR_F16,
                                        [MK_BF16] = GGUF_TENSOR_BF16, [MK_Q8_0] = GGUF_TENSOR_Q8_0,
                                        [MK_Q4_0] = GGUF_TENSOR_Q4_0, [MK_Q5_0] = GGUF_TENSOR_Q5_0,
                                        [MK_Q4_K] = GGUF_TENSOR_Q4_K, [MK_Q5_K] = GGUF_TENSOR_Q5_K,
                                        [MK_Q6_K] = GGUF_TENSOR_Q6_K};

const char *mk_dtype_name(mk_dtype t)
{
    static const char *const names[] = {"f32", "f16", "bf16", "q8_0", "q4_0", "q5_0", "q4_k", "q5_k", "q6_k"};
    return (unsigned)t < MK_DTYPE_COUNT ? names[t] : NULL;
}

/* The type a matrix of rows of ne0 values is stored as: t, or for a K type
 * whose rows do not split into 256-blocks, llama-quantize's fallback. */
static mk_dtype mk_row_type(mk_dtype t, uint64_t ne0)
{
    if (ne0 % 256 == 0)
        return t;
    switch (t) {
    case MK_Q4_K:
    case MK_Q5_K: return MK_Q5_0;
    case MK_Q6_K: return MK_Q8_0;
    default: return t;
    }
}

/* Bytes of n values (a multiple of the block) stored as t. */
static uint64_t mk_bytes(mk_dtype t, uint64_t n)
{
    uint32_t be = 1, bb = 4;
    gguf_type_block(mk_gguf_type[t], &be, &bb);
    return n / be * bb;
}

static void mk_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static int mk_clampi(int v, int lo, int hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

/* Q4_0 / Q5_0 (bits 4 or 5) block of 32 at b: as ggml's reference, d =
 * (the value of largest magnitude) / -2^(bits-1), q = x / d + 2^(bits-1)
 * rounded, clamped. */
static void mk_quant_q_0(const float *x, int bits, uint8_t *b)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const int half = 1 << (bits - 1);
    const float d = max / (float)-half, id = d != 0.0f ? 1.0f / d : 0.0f;
    mk_put16(b, pd_f32_to_f16(d));
    uint8_t q[32];
    for (int j = 0; j < 32; j++)
        q[j] = (uint8_t)mk_clampi((int)(x[j] * id + (float)half + 0.5f), 0, 2 * half - 1);
    uint8_t *qs = b + (bits == 4 ? 2 : 6);
    uint32_t qh = 0;
    for (int j = 0; j < 16; j++) {
        qs[j] = (uint8_t)((q[j] & 15) | ((q[j + 16] & 15) << 4));
        qh |= (uint32_t)(q[j] >> 4) << j;
        qh |= (uint32_t)(q[j + 16] >> 4) << (j + 16);
    }
    if (bits == 5)
        for (int i = 0; i < 4; i++)
            b[2 + i] = (uint8_t)(qh >> (8 * i));
}

/* Q4_K / Q5_K (bits 4 or 5) super-block of 256 at b: per 32, scale
 * (max - min) / (2^bits - 1) and offset -min (min <= 0), both as 6-bit
 * multiples of the super-block's f16 d and dmin; q rounded and clamped. */
static void mk_quant_k(const float *x, int bits, uint8_t *b)
{
    const int top = (1 << bits) - 1;
    float sc[8], mn[8], smax = 0.0f, mmax = 0.0f;
    for (int s = 0; s < 8; s++) {
        float lo = 0.0f, hi = x[32 * s];
        for (int j = 0; j < 32; j++) {
            lo = x[32 * s + j] < lo ? x[32 * s + j] : lo;
            hi = x[32 * s + j] > hi ? x[32 * s + j] : hi;
        }
        sc[s] = (hi - lo) / (float)top;
        mn[s] = -lo;
        smax = sc[s] > smax ? sc[s] : smax;
        mmax = mn[s] > mmax ? mn[s] : mmax;
    }
    const uint16_t dh = pd_f32_to_f16(smax / 63.0f), mh = pd_f32_to_f16(mmax / 63.0f);
    const float d = pd_f16_to_f32(dh), dmin = pd_f16_to_f32(mh);
    uint8_t ls[8], lm[8];
    for (int s = 0; s < 8; s++) {
        ls[s] = (uint8_t)(d > 0.0f ? mk_clampi((int)lroundf(sc[s] / d), 0, 63) : 0);
        lm[s] = (uint8_t)(dmin > 0.0f ? mk_clampi((int)lroundf(mn[s] / dmin), 0, 63) : 0);
    }
    mk_put16(b, dh);
    mk_put16(b + 2, mh);
    uint8_t *scales = b + 4;
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
    }
    uint8_t q[256];
    for (int s = 0; s < 8; s++) {
        const float D = d * (float)ls[s], M = dmin * (float)lm[s];
        for (int j = 0; j < 32; j++)
            q[32 * s + j] = (uint8_t)(D > 0.0f ? mk_clampi((int)lroundf((x[32 * s + j] + M) / D), 0, top) : 0);
    }
    uint8_t *qh = b + 16, *ql = bits == 4 ? b + 16 : b + 48;
    if (bits == 5)
        memset(qh, 0, 32);
    for (int p = 0; p < 4; p++)
        for (int l = 0; l < 32; l++) {
            const uint8_t lo = q[64 * p + l], hi = q[64 * p + 32 + l];
            ql[32 * p + l] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
            if (bits == 5)
                qh[l] |= (uint8_t)(((lo >> 4) << (2 * p)) | ((hi >> 4) << (2 * p + 1)));
        }
}

/* Q6_K super-block of 256 at b: per 16 an int8 scale of the f16 d, q in
 * -32..31 rounded. */
static void mk_quant_q6_k(const float *x, uint8_t *b)
{
    float sc[16], amax = 0.0f;
    for (int s = 0; s < 16; s++) {
        float m = 0.0f;
        for (int j = 0; j < 16; j++)
            m = fabsf(x[16 * s + j]) > m ? fabsf(x[16 * s + j]) : m;
        sc[s] = m / 31.0f;
        amax = sc[s] > amax ? sc[s] : amax;
    }
    const uint16_t dh = pd_f32_to_f16(amax / 127.0f);
    const float d = pd_f16_to_f32(dh);
    int8_t ls[16];
    uint8_t u[256];
    for (int s = 0; s < 16; s++) {
        ls[s] = (int8_t)(d > 0.0f ? mk_clampi((int)lroundf(sc[s] / d), -128, 127) : 0);
        const float D = d * (float)ls[s];
        for (int j = 0; j < 16; j++)
            u[16 * s + j] = (uint8_t)(mk_clampi(D > 0.0f ? (int)lroundf(x[16 * s + j] / D) : 0, -32, 31) + 32);
    }
    uint8_t *ql = b, *qh = b + 128;
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++) {
            const uint8_t *v = u + 128 * h + l;
            ql[64 * h + l] = (uint8_t)((v[0] & 15) | ((v[64] & 15) << 4));
            ql[64 * h + 32 + l] = (uint8_t)((v[32] & 15) | ((v[96] & 15) << 4));
            qh[32 * h + l] = (uint8_t)((v[0] >> 4) | ((v[32] >> 4) << 2) | ((v[64] >> 4) << 4) | ((v[96] >> 4) << 6));
        }
    memcpy(b + 192, ls, 16);
    mk_put16(b + 208, dh);
}

/* Stores src [n] as t into dst (Q8_0: per block of 32, d = amax / 127 as
 * f16, then round(x / d) as int8; an all-zero block gets d = 0). */
static void mk_convert(mk_dtype t, const float *src, uint64_t n, void *dst)
{
    if (t == MK_F32) {
        memcpy(dst, src, n * sizeof *src);
    } else if (t == MK_F16 || t == MK_BF16) {
        uint16_t *h = dst;
        for (uint64_t i = 0; i < n; i++)
            h[i] = t == MK_F16 ? pd_f32_to_f16(src[i]) : pd_f32_to_bf16(src[i]);
    } else if (t != MK_Q8_0) {
        uint8_t *b = dst;
        const uint64_t qk = t == MK_Q4_0 || t == MK_Q5_0 ? 32 : 256, bb = mk_bytes(t, qk);
        for (uint64_t blk = 0; blk < n / qk; blk++, b += bb) {
            const float *x = src + blk * qk;
            switch (t) {
            case MK_Q4_0: mk_quant_q_0(x, 4, b); break;
            case MK_Q5_0: mk_quant_q_0(x, 5, b); break;
            case MK_Q4_K: mk_quant_k(x, 4, b); break;
            case MK_Q5_K: mk_quant_k(x, 5, b); break;
            default: mk_quant_q6_k(x, b); break;
            }
        }
    } else {
        uint8_t *b = dst;
        for (uint64_t blk = 0; blk < n / 32; blk++, b += 34) {
            const float *x = src + blk * 32;
            float amax = 0.0f;
            for (int j = 0; j < 32; j++)
                amax = fabsf(x[j]) > amax ? fabsf(x[j]) : amax;
            float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
            uint16_t dh = pd_f32_to_f16(d);
            memcpy(b, &dh, 2); /* little-endian hosts only, as the loader */
            for (int j = 0; j < 32; j++)
                b[2 + j] = (uint8_t)(int8_t)roundf(x[j] * id);
        }
    }
}


/* Adds tensor `name` of shape [ne0 x ne1 x ne2] (ne1 = 0: a vector; ne2 = 0:
 * at most 2 dimensions) with values base + uniform(-a, a); matrices are
 * stored as --dtype. With keep, the f32 values stay in *keep and the stored
 * bytes are written by mk_store later (values changed after generation:
 * --eos-boost, --repeat); the writer reads them only at the end. */
static pd_status mk_tensor3k(mk_ctx *c, const char *name, uint64_t ne0, uint64_t ne1, uint64_t ne2, float base,
                             float a, int matrix, float **keep, void **stored, pd_err *err)
{
    uint64_t n = ne0 * (ne1 ? ne1 : 1) * (ne2 ? ne2 : 1);
    uint64_t tag = ++c->tag;
    mk_dtype t = matrix ? mk_row_type(c->o->dtype, ne0) : MK_F32;
    float *f = keep || t != MK_F32 ? malloc(n * sizeof *f) : mk_keep(c, n * sizeof *f);
    void *buf = t == MK_F32 && !keep ? f : mk_keep(c, mk_bytes(t, n));
    if (!f || !buf) {
        if (f != buf)
            free(f);
        return pd_err_set(err, PD_ERR_NOMEM, "mkmodel: out of memory for %s", name);
    }
    for (uint64_t i = 0; i < n; i++)
        f[i] = base + uval(c->o->seed, tag, i, a);
    if (keep) {
        *keep = f;
        *stored = buf;
    } else if (f != buf) {
        mk_convert(t, f, n, buf);
        free(f);
    }
    uint64_t ne[3] = {ne0, ne1, ne2};
    pd_status st = gguf_writer_add_tensor(c->w, name, mk_gguf_type[t], ne2 ? 3 : ne1 ? 2 : 1, ne, buf);
    if (st)
        return pd_err_set(err, st, "mkmodel: cannot add tensor %s", name);
    return PD_OK;
}

static pd_status mk_tensor3(mk_ctx *c, const char *name, uint64_t ne0, uint64_t ne1, uint64_t ne2, float base,
                            float a, int matrix, pd_err *err)
{
    return mk_tensor3k(c, name, ne0, ne1, ne2, base, a, matrix, NULL, NULL, err);
}

static pd_status mk_tensor(mk_ctx *c, const char *name, uint64_t ne0, uint64_t ne1, float base, float a,
                           int matrix, pd_err *err)
{
    return mk_tensor3(c, name, ne0, ne1, 0, base, a, matrix, err);
}

/* --repeat P: adds gamma * embedding(t) to the output row of t's successor.
 * The cycle is the last P tokens, each leading to the next; a token outside
 * it leads to cycle token t % P with a quarter of the weight (enough to
 * enter the cycle, little noise on the cycle's rows). With the residual
 * stream near the input embedding the successor's logit gains about +80
 * against logits of std ~2.5, so greedy text enters the cycle at once and
 * mostly stays on it (the attention's mixing makes it skip now and then,
 * as OCR text of repeated cells does). */
static void mk_repeat(const mkmodel_opts *o, const float *embd, float *out)
{
    const uint32_t V = o->vocab, H = o->hidden, P = o->repeat, c0 = V - P;
    for (uint32_t t = 0; t < V; t++) {
        uint32_t next = c0 + (t >= c0 ? (t - c0 + 1) % P : t % P);
        const float gamma = (t >= c0 ? 80.0f : 20.0f) / (float)H;
        for (uint32_t i = 0; i < H; i++)
            out[(uint64_t)next * H + i] += gamma * embd[(uint64_t)t * H + i];
    }
}

static const char *const mk_syl[] = {"ka", "to", "ri", "ne", "su", "mo", "la", "pe", "di", "an",
                                     "or", "ve", "hu", "in", "se", "ba", "el", "co", "fu", "ya",
                                     "qu", "ze", "wi", "xo", "gi", "th", "ch", "st", "er", "on",
                                     "ly", "ad"};
#define MK_NSYL (sizeof mk_syl / sizeof mk_syl[0])

/* The i-th word: i written in base MK_NSYL with syllables (unique per i). */
static void mk_word(uint32_t i, char *out, size_t cap)
{
    char tmp[64];
    size_t len = 0;
    uint32_t x = i;
    do {
        const char *s = mk_syl[x % MK_NSYL];
        size_t sl = strlen(s);
        if (len + sl + 1 >= sizeof tmp)
            break;
        memcpy(tmp + len, s, sl);
        len += sl;
        x /= MK_NSYL;
    } while (x);
    tmp[len] = '\0';
    snprintf(out, cap, "%s", tmp);
}

static pd_status mk_vocab(mk_ctx *c, pd_err *err)
{
    const mkmodel_opts *o = c->o;
    uint32_t V = o->vocab;
    char **toks = calloc(V, sizeof *toks);
    int32_t *types = calloc(V, sizeof *types);
    float *scores = calloc(V, sizeof *scores);
    pd_status st = PD_OK;
    if (!toks || !types || !scores)
        st = pd_err_set(err, PD_ERR_NOMEM, "mkmodel: out of memory for the vocabulary");
    uint32_t bos, eos;
    int llama = o->arch == MODEL_ARCH_LLAMA, deepseek = model_arch_is_moe(o->arch);
    for (uint32_t i = 0; st == PD_OK && i < V; i++) {
        char piece[96];
        int32_t type = 1;
        if (llama) {
            if (i == 0) { snprintf(piece, sizeof piece, "<unk>"); type = 2; }
            else if (i == 1) { snprintf(piece, sizeof piece, "<s>"); type = 3; }
            else if (i == 2) { snprintf(piece, sizeof piece, "</s>"); type = 3; }
            else if (i < 3 + 256) { snprintf(piece, sizeof piece, "<0x%02X>", i - 3); type = 6; }
            else {
                char w[64];
                mk_word(i - 259, w, sizeof w);
                /* even pieces start a word ("▁" is U+2581: E2 96 81) */
                snprintf(piece, sizeof piece, "%s%s", (i % 2 == 0) ? "\xe2\x96\x81" : "", w);
                if (i % 17 == 0)
                    snprintf(piece, sizeof piece, "%s", (i % 34 == 0) ? "." : ",");
                if (i % 17 == 0 && i > 300) {
                    char w2[64];
                    mk_word(i, w2, sizeof w2);
                    snprintf(piece, sizeof piece, "%s%s", (i % 34 == 0) ? "." : ",", w2);
                }
            }
        } else {
            /* DeepSeek's specials are BOS 0, EOS 1 ("｜" U+FF5C, "▁" U+2581) */
            if (i == 0 && deepseek) { snprintf(piece, sizeof piece, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"); type = 3; }
            else if (i == 1 && deepseek) { snprintf(piece, sizeof piece, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"); type = 3; }
            else if (i == 0) { snprintf(piece, sizeof piece, "<|endoftext|>"); type = 3; }
            else if (i == 1) { snprintf(piece, sizeof piece, "<|bos|>"); type = 3; }
            else if (i < 2 + 256) {
                /* GPT-2 bytes_to_unicode: printable bytes map to themselves,
                 * the others to U+0100 + k in order */
                uint32_t b = i - 2, cp;
                if ((b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255))
                    cp = b;
                else {
                    uint32_t k = 0;
                    for (uint32_t x = 0; x < b; x++)
                        if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || (x >= 174 && x <= 255)))
                            k++;
                    cp = 256 + k;
                }
                if (cp < 0x80)
                    snprintf(piece, sizeof piece, "%c", (char)cp);
                else
                    snprintf(piece, sizeof piece, "%c%c", (char)(0xc0 | (cp >> 6)), (char)(0x80 | (cp & 0x3f)));
            } else {
                char w[64];
                mk_word(i - 258, w, sizeof w);
                /* "Ġ" (U+0120: C4 A0) marks a leading space */
                snprintf(piece, sizeof piece, "%s%s", (i % 2 == 0) ? "\xc4\xa0" : "", w);
                if (i % 17 == 0) {
                    char w2[64];
                    mk_word(i, w2, sizeof w2);
                    snprintf(piece, sizeof piece, "%s%s", (i % 34 == 0) ? "." : ",", w2);
                }
            }
        }
        toks[i] = strdup(piece);
        types[i] = type;
        scores[i] = -(float)i;
        if (!toks[i])
            st = pd_err_set(err, PD_ERR_NOMEM, "mkmodel: out of memory for the vocabulary");
    }
    if (llama) {
        bos = 1;
        eos = 2;
    } else if (deepseek) {
        bos = 0;
        eos = 1;
    } else {
        bos = 1;
        eos = 0;
    }
    gguf_writer *w = c->w;
    if (st == PD_OK) {
        gguf_writer_set_str(w, "tokenizer.ggml.model", llama ? "llama" : "gpt2");
        gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, V);
        gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", types, V);
        if (llama)
            gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", scores, V);
        else {
            /* a gpt2 vocabulary needs merges to load in llama.cpp ("cannot
             * find tokenizer merges in model file"): the syllables' letter
             * pairs, whose letters are byte tokens of the vocabulary */
            const char *mg[MK_NSYL];
            char buf[MK_NSYL][8];
            size_t nm = 0;
            for (size_t i = 0; i < MK_NSYL; i++)
                if (strlen(mk_syl[i]) == 2) {
                    snprintf(buf[nm], sizeof buf[nm], "%c %c", mk_syl[i][0], mk_syl[i][1]);
                    mg[nm] = buf[nm];
                    nm++;
                }
            gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", mg, nm);
        }
        gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", bos);
        gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", eos);
    }
    for (uint32_t i = 0; toks && i < V; i++)
        free(toks[i]);
    free(toks);
    free(types);
    free(scores);
    return st;
}

/* Every option mkmodel_write takes, checked before anything is made. */
static pd_status mk_check(const mkmodel_opts *o, pd_err *err)
{
    if (o->arch >= MODEL_ARCH_COUNT)
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --arch must be llama, qwen2, deepseek or deepseek2-ocr");
    if ((unsigned)o->dtype >= MK_DTYPE_COUNT)
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: unknown --dtype %d", (int)o->dtype);
    const int moe = model_arch_is_moe(o->arch), ocr = o->arch == MODEL_ARCH_DEEPSEEK2_OCR;
    if (ocr && o->kv_heads != o->heads)
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: deepseek2-ocr is MHA: --kv-heads %u must equal --heads %u",
                          o->kv_heads, o->heads);
    if (moe && o->dense_lead > o->layers)
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --dense-layers %u exceeds --layers %u", o->dense_lead,
                          o->layers);
    if (moe && (o->experts < 1 || o->experts > 512))
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --experts %u: expected 1..512", o->experts);
    if (moe && (o->experts_used < 1 || o->experts_used > o->experts))
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --experts-used %u: expected 1..--experts %u",
                          o->experts_used, o->experts);
    if (moe && (o->expert_ffn < 1 || o->shared < 1 || (uint64_t)o->expert_ffn * o->shared > (1u << 20)))
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --expert-ffn %u x --shared %u: expected 1..2^20",
                          o->expert_ffn, o->shared);
    if (moe && !(o->expert_scale > 0.0f))
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --expert-scale must be positive");
    if (o->layers < 1 || o->layers > 1024)
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --layers %u: expected 1..1024", o->layers);
    if (o->heads < 1 || o->kv_heads < 1 || o->heads % o->kv_heads)
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --heads %u must be a positive multiple of --kv-heads %u",
                          o->heads, o->kv_heads);
    if (o->hidden < 2 || o->hidden % o->heads || (o->hidden / o->heads) % 2 || o->hidden / o->heads > 1024)
        return pd_err_set(err, PD_ERR_ARG,
                          "mkmodel: --hidden %u must split into --heads %u even head dimensions <= 1024",
                          o->hidden, o->heads);
    if (o->ffn < 1 || o->ffn > (1u << 20) || o->hidden > (1u << 16))
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --ffn %u / --hidden %u out of range", o->ffn, o->hidden);
    const uint32_t min_vocab = 300; /* specials + 256 byte tokens + a few words */
    if (o->vocab < min_vocab || o->vocab > (1u << 20))
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --vocab %u: expected %u..1048576 (byte tokens need room)",
                          o->vocab, min_vocab);
    if (o->dtype != MK_F32 && o->dtype != MK_F16 && o->dtype != MK_BF16) {
        /* every matrix's row (its input width) splits into blocks of 32 */
        const struct {
            const char *what;
            uint64_t width;
        } rows[] = {{"--hidden", o->hidden},
                    {"--ffn", o->ffn},
                    {"--expert-ffn", moe ? o->expert_ffn : 32},
                    {"--expert-ffn x --shared", moe ? (uint64_t)o->expert_ffn * o->shared : 32}};
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            if (rows[i].width % 32)
                return pd_err_set(err, PD_ERR_ARG, "mkmodel: --dtype %s stores rows in blocks of 32: %s %llu is not a multiple of 32",
                                  mk_dtype_name(o->dtype), rows[i].what, (unsigned long long)rows[i].width);
    }
    if (o->ctx < 16)
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --ctx %u: expected >= 16", o->ctx);
    if (!ocr && (o->rope_scaling || o->rope_factor != 0.0f || o->rope_orig_ctx || o->yarn_log_mul != 0.0f))
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: the rope-scaling options need --arch deepseek2-ocr");
    if (o->rope_scaling && strcmp(o->rope_scaling, "none") && strcmp(o->rope_scaling, "linear") &&
        strcmp(o->rope_scaling, "yarn"))
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --rope-scaling '%s': expected none, linear or yarn",
                          o->rope_scaling);
    if (o->rope_factor != 0.0f && !(o->rope_factor >= 1e-6f && o->rope_factor <= 1e6f))
        return pd_err_set(err, PD_ERR_ARG, "mkmodel: --rope-factor %g: expected a factor in [1e-6, 1e6]",
                          (double)o->rope_factor);
    if (o->repeat && o->repeat + 259 > o->vocab)
        return pd_err_set(err, PD_ERR_ARG,
                          "mkmodel: --repeat %u: the cycle must leave the special and byte tokens out (at most --vocab - 259 = %d)",
                          o->repeat, (int)o->vocab - 259);
    return PD_OK;
}

/* The file's metadata: general.*, the architecture's hyperparameters and,
 * for deepseek2-ocr, the keys llama.cpp's converter adds. */
static void mk_keys(const mkmodel_opts *o, gguf_writer *w)
{
    const int moe = model_arch_is_moe(o->arch), ocr = o->arch == MODEL_ARCH_DEEPSEEK2_OCR;
    const char *arch = model_arch_name(o->arch);
    char key[128];
    gguf_writer_set_str(w, "general.architecture", arch);
    gguf_writer_set_str(w, "general.name", "pipedec synthetic");
    gguf_writer_set_u32(w, "general.alignment", 32);
#define KEY(s) (snprintf(key, sizeof key, "%s." s, arch), key)
    gguf_writer_set_u32(w, KEY("block_count"), o->layers);
    gguf_writer_set_u32(w, KEY("embedding_length"), o->hidden);
    gguf_writer_set_u32(w, KEY("feed_forward_length"), o->ffn);
    gguf_writer_set_u32(w, KEY("attention.head_count"), o->heads);
    gguf_writer_set_u32(w, KEY("attention.head_count_kv"), o->kv_heads);
    gguf_writer_set_u32(w, KEY("context_length"), o->ctx);
    gguf_writer_set_f32(w, KEY("rope.freq_base"), 10000.0f);
    gguf_writer_set_f32(w, KEY("attention.layer_norm_rms_epsilon"), 1e-5f);
    if (moe) {
        gguf_writer_set_u32(w, KEY("leading_dense_block_count"), o->dense_lead);
        gguf_writer_set_u32(w, KEY("expert_count"), o->experts);
        gguf_writer_set_u32(w, KEY("expert_used_count"), o->experts_used);
        gguf_writer_set_u32(w, KEY("expert_shared_count"), o->shared);
        gguf_writer_set_u32(w, KEY("expert_feed_forward_length"), o->expert_ffn);
        gguf_writer_set_f32(w, KEY("expert_weights_scale"), o->expert_scale);
    }
    if (ocr) {
        /* what llama.cpp's converter adds for DeepSeek-OCR: the vocabulary
         * size, rope.dimension_count = qk_rope_head_dim (0: the decoder ropes
         * the whole head anyway), softmax gating */
        gguf_writer_set_u32(w, KEY("vocab_size"), o->vocab);
        gguf_writer_set_u32(w, KEY("rope.dimension_count"), 0);
        gguf_writer_set_u32(w, KEY("expert_gating_func"), 1);
        /* a YaRN model's keys, in the converter's order */
        if (o->rope_scaling)
            gguf_writer_set_str(w, KEY("rope.scaling.type"), o->rope_scaling);
        if (o->rope_factor != 0.0f)
            gguf_writer_set_f32(w, KEY("rope.scaling.factor"), o->rope_factor);
        if (o->rope_orig_ctx)
            gguf_writer_set_u32(w, KEY("rope.scaling.original_context_length"), o->rope_orig_ctx);
        if (o->yarn_log_mul != 0.0f)
            gguf_writer_set_f32(w, KEY("rope.scaling.yarn_log_multiplier"), o->yarn_log_mul);
    }
#undef KEY
}

/* Layer L's tensors: attention, a dense or a mixture-of-experts FFN, and
 * qwen2's biases. */
static pd_status mk_layer(mk_ctx *c, uint32_t L, pd_err *err)
{
    const mkmodel_opts *o = c->o;
    const int moe = model_arch_is_moe(o->arch);
    const uint32_t H = o->hidden, hd = o->hidden / o->heads, F = o->ffn;
    const uint64_t qd = (uint64_t)o->heads * hd, kvd = (uint64_t)o->kv_heads * hd;
    const float damp = 1.0f / sqrtf(2.0f * (float)o->layers);
    const float a_in = sqrtf(3.0f / (float)H);
    char n[96];
    pd_status st;
#define T(s) (snprintf(n, sizeof n, "blk.%u." s, L), n)
    if ((st = mk_tensor(c, T("attn_norm.weight"), H, 0, 1.0f, 0.1f, 0, err)) ||
        (st = mk_tensor(c, T("attn_q.weight"), H, qd, 0.0f, a_in * 1.5f, 1, err)) ||
        (st = mk_tensor(c, T("attn_k.weight"), H, kvd, 0.0f, a_in * 1.5f, 1, err)) ||
        (st = mk_tensor(c, T("attn_v.weight"), H, kvd, 0.0f, a_in, 1, err)) ||
        (st = mk_tensor(c, T("attn_output.weight"), qd, H, 0.0f, sqrtf(3.0f / (float)qd) * damp, 1, err)) ||
        (st = mk_tensor(c, T("ffn_norm.weight"), H, 0, 1.0f, 0.1f, 0, err)))
        return st;
    if (!moe || L < o->dense_lead) {
        if ((st = mk_tensor(c, T("ffn_gate.weight"), H, F, 0.0f, a_in, 1, err)) ||
            (st = mk_tensor(c, T("ffn_up.weight"), H, F, 0.0f, a_in, 1, err)) ||
            (st = mk_tensor(c, T("ffn_down.weight"), F, H, 0.0f, sqrtf(3.0f / (float)F) * damp * 2.0f, 1, err)))
            return st;
    } else {
        /* router logits of std ~2: a peaked but not one-hot softmax;
         * the routed sum (weights <= 1) and the shared experts each
         * carry about half of a dense layer's output */
        uint32_t FE = o->expert_ffn, FS = o->expert_ffn * o->shared, E = o->experts;
        float a_fe = sqrtf(3.0f / (float)FE) * damp * 2.0f, a_fs = sqrtf(3.0f / (float)FS) * damp * 1.4f;
        if ((st = mk_tensor(c, T("ffn_gate_inp.weight"), H, E, 0.0f, a_in * 2.0f, 1, err)) ||
            (st = mk_tensor3(c, T("ffn_gate_exps.weight"), H, FE, E, 0.0f, a_in, 1, err)) ||
            (st = mk_tensor3(c, T("ffn_up_exps.weight"), H, FE, E, 0.0f, a_in, 1, err)) ||
            (st = mk_tensor3(c, T("ffn_down_exps.weight"), FE, H, E, 0.0f, a_fe * 2.0f, 1, err)) ||
            (st = mk_tensor(c, T("ffn_gate_shexp.weight"), H, FS, 0.0f, a_in, 1, err)) ||
            (st = mk_tensor(c, T("ffn_up_shexp.weight"), H, FS, 0.0f, a_in, 1, err)) ||
            (st = mk_tensor(c, T("ffn_down_shexp.weight"), FS, H, 0.0f, a_fs, 1, err)))
            return st;
    }
    if (o->arch == MODEL_ARCH_QWEN2 &&
        ((st = mk_tensor(c, T("attn_q.bias"), qd, 0, 0.0f, 0.1f, 0, err)) ||
         (st = mk_tensor(c, T("attn_k.bias"), kvd, 0, 0.0f, 0.1f, 0, err)) ||
         (st = mk_tensor(c, T("attn_v.bias"), kvd, 0, 0.0f, 0.1f, 0, err))))
        return st;
#undef T
    return PD_OK;
}

pd_status mkmodel_write(const mkmodel_opts *o, const char *path, pd_err *err)
{
    pd_status st = mk_check(o, err);
    if (st != PD_OK)
        return st;
    const int moe = model_arch_is_moe(o->arch);
    mk_ctx c = {.o = o, .w = gguf_writer_new()};
    if (!c.w)
        return pd_err_set(err, PD_ERR_NOMEM, "mkmodel: out of memory");
    gguf_writer *w = c.w;
    mk_keys(o, w);
    st = mk_vocab(&c, err);
    const uint32_t H = o->hidden;
    const float a_in = sqrtf(3.0f / (float)H);
    float *embd = NULL, *outw = NULL;
    void *embd_st = NULL, *outw_st = NULL;
    if (st == PD_OK)
        st = mk_tensor3k(&c, "token_embd.weight", H, o->vocab, 0, 0.0f, 1.7f, 1, &embd, &embd_st, err);
    for (uint32_t L = 0; st == PD_OK && L < o->layers; L++)
        st = mk_layer(&c, L, err);
    if (st == PD_OK)
        st = mk_tensor(&c, "output_norm.weight", H, 0, 1.0f, 0.1f, 0, err);
    if (st == PD_OK) {
        /* untied output; logits of std ~2.5 give varied but not uniform text */
        st = mk_tensor3k(&c, "output.weight", H, o->vocab, 0, 0.0f, a_in * 4.0f, 1, &outw, &outw_st, err);
        if (st == PD_OK && o->eos_boost != 1.0f) {
            uint32_t eos = o->arch == MODEL_ARCH_LLAMA ? 2 : moe ? 1 : 0;
            for (uint32_t i = 0; i < H; i++)
                outw[(uint64_t)eos * H + i] *= o->eos_boost;
        }
    }
    if (st == PD_OK && o->repeat)
        mk_repeat(o, embd, outw);
    /* the two matrices kept as f32 until now get their stored bytes */
    if (embd)
        mk_convert(mk_row_type(o->dtype, H), embd, (uint64_t)H * o->vocab, embd_st);
    if (outw)
        mk_convert(mk_row_type(o->dtype, H), outw, (uint64_t)H * o->vocab, outw_st);
    free(embd);
    free(outw);
    if (st == PD_OK)
        st = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    for (size_t i = 0; i < c.n_bufs; i++)
        free(c.bufs[i]);
    free(c.bufs);
    return st;
}
