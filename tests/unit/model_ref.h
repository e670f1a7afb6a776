/* model_ref: the tests' naive float64 reference of pipedec's model math, read
 * straight from a GGUF's tensors, every weight exactly dequantized
 * (ggml_ref.h: ggml's dequantize_row_* written from ggml's definitions):
 * matrix-vector products, RMSNorm, RoPE (both pair styles), the dense
 * SwiGLU and DeepSeek's MoE feed-forward (softmax router, top-k by
 * probability with ties to the lower index, the probabilities as weights,
 * plus the shared experts), all in double. Used by unit.model (a layer
 * stack against the stage) and by tests/anchor/ref_greedy.c (whole-model
 * greedy decoding, the judge where pipedec and llama.cpp round differently).
 *
 * Header-only: the includer defines MREF_CHECK(cond, ...) first to report a
 * broken expectation its own way (a Check assertion), or gets a message on
 * stderr and abort(). Dequantized tensors are kept in a static table until
 * mref_tensors_free. */
#ifndef PD_TEST_MODEL_REF_H
#define PD_TEST_MODEL_REF_H

#include "cluster/format/gguf.h"
#include "cluster/model/model.h"
#include "ggml_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef MREF_CHECK
#define MREF_CHECK(cond, ...)                                                  \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "model_ref: %s:%d: ", __FILE__, __LINE__);         \
            fprintf(stderr, __VA_ARGS__);                                      \
            fputc('\n', stderr);                                               \
            abort();                                                           \
        }                                                                      \
    } while (0)
#endif

enum { MREF_MAX_BUFS = 1024 };
static float *mref_bufs[MREF_MAX_BUFS];
static const gguf_tensor *mref_of[MREF_MAX_BUFS]; /* the tensor buffer i holds */
static int mref_n_bufs;

static inline void mref_tensors_free(void)
{
    while (mref_n_bufs > 0) {
        --mref_n_bufs;
        free(mref_bufs[mref_n_bufs]);
        mref_of[mref_n_bufs] = NULL;
    }
}

/* Tensor `name` as floats: F32 in place, F16 / Q8_0 / the ggml block types
 * dequantized exactly into a buffer kept until mref_tensors_free. NULL when
 * the file has no such tensor and `optional`. A tensor is dequantized once
 * (per file: the cache is keyed by its directory entry; call
 * mref_tensors_free before the file is closed). */
static inline const float *mref_tensor_opt(gguf_file *f, const char *name, int optional)
{
    const gguf_tensor *t = gguf_tensor_find(f, name);
    if (!t && optional)
        return NULL;
    MREF_CHECK(t != NULL, "tensor %s is missing", name);
    if (t->type == GGUF_TENSOR_F32)
        return t->data;
    for (int i = 0; i < mref_n_bufs; i++) /* dequantized once per tensor */
        if (mref_of[i] == t)
            return mref_bufs[i];
    uint64_t n = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        n *= t->ne[d];
    float *y = malloc(n * sizeof *y);
    MREF_CHECK(y != NULL, "out of memory for %s", name);
    MREF_CHECK(mref_n_bufs < MREF_MAX_BUFS, "more than %d dequantized tensors", MREF_MAX_BUFS);
    mref_of[mref_n_bufs] = t;
    mref_bufs[mref_n_bufs++] = y;
    const uint8_t *b = t->data;
    if (t->type == GGUF_TENSOR_Q8_0) {
        for (uint64_t i = 0; i < n; i++)
            y[i] = (float)(int8_t)b[(i / 32) * 34 + 2 + i % 32] * ggml_ref_f16(b + (i / 32) * 34);
    } else if (t->type == GGUF_TENSOR_F16) {
        for (uint64_t i = 0; i < n; i++)
            y[i] = ggml_ref_f16(b + 2 * i);
    } else {
        int qk = 0, bb = 0;
        ggml_ref_block((int)t->type, &qk, &bb);
        MREF_CHECK(qk > 0, "tensor %s: type %u has no reference dequantizer", name, t->type);
        ggml_ref_dequant((int)t->type, b, y, (int)n);
    }
    return y;
}

static inline const float *mref_tensor(gguf_file *f, const char *name)
{
    return mref_tensor_opt(f, name, 0);
}

/* y[o] = sum_i W[o][i] x[i] (+ b[o]) with W stored [out x in] */
static inline void mref_matvec(const float *W, const float *b, const double *x, uint32_t in, uint32_t out,
                               double *y)
{
    for (uint32_t o = 0; o < out; o++) {
        double s = b ? b[o] : 0.0;
        for (uint32_t i = 0; i < in; i++)
            s += (double)W[(size_t)o * in + i] * x[i];
        y[o] = s;
    }
}

static inline void mref_norm(const double *x, const float *w, uint32_t n, double eps, double *y)
{
    double ss = 0;
    for (uint32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    double r = 1.0 / sqrt(ss / n + eps);
    for (uint32_t i = 0; i < n; i++)
        y[i] = x[i] * r * w[i];
}

static inline void mref_rope(double *v, uint32_t hd, uint64_t pos, double base, int neox)
{
    for (uint32_t i = 0; i < hd / 2; i++) {
        double th = (double)pos * pow(base, -2.0 * i / hd);
        uint32_t a = neox ? i : 2 * i, b = neox ? i + hd / 2 : 2 * i + 1;
        double x0 = v[a], x1 = v[b];
        v[a] = x0 * cos(th) - x1 * sin(th);
        v[b] = x0 * sin(th) + x1 * cos(th);
    }
}

/* llama.cpp's mscale^2 for deepseek2-ocr's rope-scaling keys, in double
 * (model_ocr_kq_mul is its float version): scores are q.k * this / sqrt(hd). */
static inline double mref_kq_mul(model_rope_scaling t, double factor, double attn_factor)
{
    double fs = factor == 0.0 ? 1.0 : 1.0 / factor;
    if (t == MODEL_ROPE_SCALING_NONE)
        fs = 1.0;
    double a = 1.0;
    if (t == MODEL_ROPE_SCALING_YARN) {
        double f = 1.0 / fs;
        a = (f <= 1.0 ? 1.0 : 0.1 * log(f) + 1.0) / (1.0 + 0.1 * log(f));
    }
    a *= attn_factor;
    double m = a * (1.0 + 0.1 * log(1.0 / fs));
    return m * m;
}

/* The reference feed-forward of layer L on the normed row h: dense SwiGLU,
 * or (a MoE architecture past its dense layers) the MoE of llama.cpp's graph
 * in double: softmax router, top-k by probability (ties to the lower index),
 * the probabilities as weights without renormalisation, plus the shared
 * experts. A deepseek2-ocr router with sigmoid gating, renormalised or scaled
 * weights or a selection bias is not modelled (refused). */
static inline void mref_ffn(gguf_file *f, const model_hparams *hp, uint32_t L, const double *h, double *out)
{
    const uint32_t H = hp->hidden;
    char n[64];
#define MREF_T(s) (snprintf(n, sizeof n, "blk.%u." s, L), mref_tensor(f, n))
    if (!model_arch_is_moe(hp->arch) || L < hp->n_dense_lead) {
        const uint32_t F = hp->ffn;
        double *g = malloc(3 * (size_t)F * sizeof *g), *u = g + F, *a = u + F;
        MREF_CHECK(g != NULL, "out of memory");
        mref_matvec(MREF_T("ffn_gate.weight"), NULL, h, H, F, g);
        mref_matvec(MREF_T("ffn_up.weight"), NULL, h, H, F, u);
        for (uint32_t i = 0; i < F; i++)
            a[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        mref_matvec(MREF_T("ffn_down.weight"), NULL, a, F, H, out);
        free(g);
        return;
    }
    MREF_CHECK(hp->moe_gating == MODEL_MOE_SOFTMAX && !hp->expert_weights_norm && !hp->has_exp_probs_b &&
                   (hp->arch != MODEL_ARCH_DEEPSEEK2_OCR || hp->expert_weights_scale == 0.0f ||
                    hp->expert_weights_scale == 1.0f),
               "layer %u: a router the reference does not model (sigmoid, norm, scale or selection bias)", L);
    const uint32_t E = hp->n_expert, K = hp->n_expert_used, FE = hp->ffn_exp, FS = FE * hp->n_expert_shared;
    const uint32_t W = FS > FE ? FS : FE;
    double *g = malloc((3 * (size_t)W + H + E) * sizeof *g), *u = g + W, *a = u + W, *y = a + W, *lg = y + H;
    int *taken = calloc(E, sizeof *taken);
    MREF_CHECK(g != NULL && taken != NULL, "out of memory");
    double mx = -1e300, sum = 0;
    mref_matvec(MREF_T("ffn_gate_inp.weight"), NULL, h, H, E, lg);
    for (uint32_t e = 0; e < E; e++)
        mx = lg[e] > mx ? lg[e] : mx;
    for (uint32_t e = 0; e < E; e++)
        sum += (lg[e] = exp(lg[e] - mx));
    for (uint32_t i = 0; i < H; i++)
        out[i] = 0;
    const float *wg = MREF_T("ffn_gate_exps.weight"), *wu = MREF_T("ffn_up_exps.weight"),
                *wd = MREF_T("ffn_down_exps.weight");
    for (uint32_t r = 0; r < K; r++) {
        uint32_t best = E;
        for (uint32_t e = 0; e < E; e++)
            if (!taken[e] && (best == E || lg[e] > lg[best]))
                best = e;
        taken[best] = 1;
        mref_matvec(wg + (size_t)best * FE * H, NULL, h, H, FE, g);
        mref_matvec(wu + (size_t)best * FE * H, NULL, h, H, FE, u);
        for (uint32_t i = 0; i < FE; i++)
            a[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
        mref_matvec(wd + (size_t)best * H * FE, NULL, a, FE, H, y);
        for (uint32_t i = 0; i < H; i++)
            out[i] += lg[best] / sum * y[i];
    }
    mref_matvec(MREF_T("ffn_gate_shexp.weight"), NULL, h, H, FS, g);
    mref_matvec(MREF_T("ffn_up_shexp.weight"), NULL, h, H, FS, u);
    for (uint32_t i = 0; i < FS; i++)
        a[i] = g[i] / (1.0 + exp(-g[i])) * u[i];
    mref_matvec(MREF_T("ffn_down_shexp.weight"), NULL, a, FS, H, y);
    for (uint32_t i = 0; i < H; i++)
        out[i] += y[i];
    free(g);
    free(taken);
#undef MREF_T
}

#endif
