/* model: the row-local math against hand-computed values, and a whole layer
 * stack against the tests' naive double-precision reference (model_ref.h)
 * read from the GGUF tensors (GQA head mapping, QKV bias, both RoPE styles, SwiGLU and the
 * residual stream) — through the stage (stage_forward) and through the
 * model's own layer math (model_layer_forward) with kv and ring layer cache
 * containers, which must give the stage's bits; and the per-layer
 * feed-forward dispatch. */
#include "pd_test.h"

#include "cache/attn.h"
#include "cluster/format/gguf.h"
#include "cluster/cli/mkmodel.h"
#include "cluster/model/model.h"
#include "cluster/runtime/pipeline/stage.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MREF_CHECK(cond, ...) ck_assert_msg(cond, __VA_ARGS__)
#include "model_ref.h"

START_TEST(model_rmsnorm_matches_hand_values)
{
    const float x[4] = {1, 2, 3, 4}, w[4] = {1, 1, 2, 0.5f};
    float y[4];
    model_rmsnorm(x, w, 4, 1e-5f, y);
    double r = 1.0 / sqrt(30.0 / 4.0 + 1e-5);
    for (int i = 0; i < 4; i++)
        ck_assert_double_eq_tol(y[i], x[i] * r * w[i], 1e-6);
}
END_TEST

START_TEST(model_rope_styles_rotate_the_documented_pairs)
{
    /* head_dim 4, base 10000, position 1: theta_0 = 1, theta_1 = 10000^(-1/2) = 0.01 */
    const float in[4] = {1, 2, 3, 4};
    float a[4], b[4];
    memcpy(a, in, sizeof a);
    model_rope_row(a, 1, 4, 1, 10000.0f, MODEL_ROPE_NORM); /* pairs (0,1), (2,3) */
    ck_assert_double_eq_tol(a[0], 1 * cos(1.0) - 2 * sin(1.0), 1e-6);
    ck_assert_double_eq_tol(a[1], 1 * sin(1.0) + 2 * cos(1.0), 1e-6);
    ck_assert_double_eq_tol(a[2], 3 * cos(0.01) - 4 * sin(0.01), 1e-6);
    ck_assert_double_eq_tol(a[3], 3 * sin(0.01) + 4 * cos(0.01), 1e-6);
    memcpy(b, in, sizeof b);
    model_rope_row(b, 1, 4, 1, 10000.0f, MODEL_ROPE_NEOX); /* pairs (0,2), (1,3) */
    ck_assert_double_eq_tol(b[0], 1 * cos(1.0) - 3 * sin(1.0), 1e-6);
    ck_assert_double_eq_tol(b[2], 1 * sin(1.0) + 3 * cos(1.0), 1e-6);
    ck_assert_double_eq_tol(b[1], 2 * cos(0.01) - 4 * sin(0.01), 1e-6);
    ck_assert_double_eq_tol(b[3], 2 * sin(0.01) + 4 * cos(0.01), 1e-6);
    /* position 0 is the identity; each head rotates the same way */
    float c[8] = {1, 2, 3, 4, 1, 2, 3, 4};
    model_rope_row(c, 2, 4, 0, 10000.0f, MODEL_ROPE_NORM);
    for (int i = 0; i < 8; i++)
        ck_assert_float_eq(c[i], in[i % 4]);
    float d[8] = {1, 2, 3, 4, 1, 2, 3, 4};
    model_rope_row(d, 2, 4, 1, 10000.0f, MODEL_ROPE_NORM);
    ck_assert_int_eq(memcmp(d, a, sizeof a), 0);
    ck_assert_int_eq(memcmp(d + 4, a, sizeof a), 0);
}
END_TEST

START_TEST(model_swiglu_matches_hand_values)
{
    const float g[3] = {0, 1, -1}, u[3] = {2, 3, 4};
    float a[3];
    model_swiglu(g, u, 3, a);
    ck_assert_double_eq_tol(a[0], 0.0, 1e-7);
    ck_assert_double_eq_tol(a[1], 3.0 / (1.0 + exp(-1.0)), 1e-6);
    ck_assert_double_eq_tol(a[2], 4.0 * -1.0 / (1.0 + exp(1.0)), 1e-6);
}
END_TEST

/* The blocked, vectorized SwiGLU gives exactly the per-element formula with
 * pd_expf, also in place and across block boundaries. */
START_TEST(model_swiglu_blocks_equal_the_scalar_formula)
{
    enum { N = 1000 };
    float g[N], u[N], a[N];
    pd_rng r = {.s = 5};
    pd_rng_fill(&r, g, N, -100, 100);
    pd_rng_fill(&r, u, N, -2, 2);
    model_swiglu(g, u, N, a);
    for (int i = 0; i < N; i++) {
        float want = (g[i] / (1.0f + pd_expf(-g[i]))) * u[i];
        ck_assert_int_eq(memcmp(&a[i], &want, sizeof want), 0);
    }
    model_swiglu(g, u, N, g); /* in place */
    ck_assert_int_eq(memcmp(a, g, sizeof a), 0);
}
END_TEST

/* ---- a naive reference forward from the file's tensors ----------------- */

/* The float64 reference (tests/unit/model_ref.h), its checks as Check
 * assertions. */
static void count_call(void *ctx)
{
    ++*(int *)ctx;
}

/* A small deepseek: 3 layers (1 dense), 8 experts of width 16, top 2 (or
 * top k), 2 shared experts. */
static void deepseek_small_opts(mkmodel_opts *o, uint32_t k)
{
    mkmodel_defaults(o);
    o->arch = MODEL_ARCH_DEEPSEEK;
    o->layers = 3;
    o->hidden = 32;
    o->heads = 4;
    o->kv_heads = 4;
    o->ffn = 40;
    o->vocab = 300;
    o->dense_lead = 1;
    o->experts = 8;
    o->experts_used = k;
    o->expert_ffn = 16;
    o->shared = 2;
    o->expert_scale = 1.0f;
}

static void check_stack_ex(model_arch arch, uint32_t heads, uint32_t kv_heads, mk_dtype dtype,
                           const char *rope_scaling, float rope_factor);

static void check_stack_dt(model_arch arch, uint32_t heads, uint32_t kv_heads, mk_dtype dtype)
{
    check_stack_ex(arch, heads, kv_heads, dtype, NULL, 0.0f);
}

/* As check_stack_dt, for a deepseek2-ocr with rope-scaling keys: the
 * reference scores q.k * mscale^2 / sqrt(head_dim), mscale^2 from mref_kq_mul */
static void check_stack_ex(model_arch arch, uint32_t heads, uint32_t kv_heads, mk_dtype dtype,
                           const char *rope_scaling, float rope_factor)
{
    char path[] = "/tmp/pd_test_model_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    mkmodel_opts o;
    mkmodel_defaults(&o);
    if (model_arch_is_moe(arch))
        deepseek_small_opts(&o, 2);
    o.arch = arch;
    o.dtype = dtype;
    o.layers = model_arch_is_moe(arch) ? 3 : 2;
    if (dtype != MK_F32)
        o.expert_ffn = 32; /* block-quantized rows: multiples of 32 */
    o.hidden = 32;
    o.heads = heads;
    o.kv_heads = kv_heads;
    o.ffn = dtype == MK_F32 ? 40 : 64;
    o.vocab = 300;
    o.seed = 9;
    o.rope_scaling = rope_scaling;
    o.rope_factor = rope_factor;
    o.rope_orig_ctx = rope_scaling ? 64 : 0;
    o.yarn_log_mul = rope_scaling ? 0.0707f : 0.0f; /* read by llama.cpp's deepseek2 only, not -ocr */
    pd_err e = {0};
    ck_assert_msg(mkmodel_write(&o, path, &e) == PD_OK, "%s", e.msg);

    model *m;
    model_load_opts lo = {.all_layers = 1, .want_embed = 1, .want_output = 1};
    ck_assert_int_eq(model_load(path, &lo, &m, &e), PD_OK);
    const model_hparams *hp = model_hp(m);
    ck_assert_int_eq(hp->rope, arch == MODEL_ARCH_QWEN2 || arch == MODEL_ARCH_DEEPSEEK2_OCR ? MODEL_ROPE_NEOX
                                                                                            : MODEL_ROPE_NORM);
    ck_assert_int_eq(hp->qkv_bias, arch == MODEL_ARCH_QWEN2);
    gguf_file *f;
    ck_assert_int_eq(gguf_open(path, &f, &e), PD_OK);

    enum { R = 5 };
    const uint32_t H = hp->hidden, hd = hp->head_dim, nh = hp->n_heads, nkv = hp->n_kv_heads;
    const uint32_t group = nh / nkv;
    model_rope_scaling rs = !rope_scaling               ? MODEL_ROPE_SCALING_NONE
                            : !strcmp(rope_scaling, "yarn") ? MODEL_ROPE_SCALING_YARN
                            : !strcmp(rope_scaling, "none") ? MODEL_ROPE_SCALING_NONE
                                                            : MODEL_ROPE_SCALING_LINEAR;
    const double kq = rope_scaling ? mref_kq_mul(rs, rope_factor, 1.0) : 1.0;
    ck_assert_double_eq_tol(hp->kq_mul, kq, 1e-6 * kq);
    float x[R * 32];
    pd_rng rng = {.s = 77};
    pd_rng_fill(&rng, x, R * H, -1.5f, 1.5f);
    double ref[R][32];
    for (int r = 0; r < R; r++)
        for (uint32_t i = 0; i < H; i++)
            ref[r][i] = x[r * H + i];

    /* reference: every layer, rows attend causally over the rows so far */
    for (uint32_t L = 0; L < hp->n_layers; L++) {
        char n[64];
#define T(s) (snprintf(n, sizeof n, "blk.%u." s, L), mref_tensor(f, n))
#define TB(s) (hp->qkv_bias ? T(s) : NULL)
        double q[R][32], k[R][32], v[R][32], h[32], att[R][32];
        for (int r = 0; r < R; r++) {
            mref_norm(ref[r], T("attn_norm.weight"), H, hp->rms_eps, h);
            mref_matvec(T("attn_q.weight"), TB("attn_q.bias"), h, H, nh * hd, q[r]);
            mref_matvec(T("attn_k.weight"), TB("attn_k.bias"), h, H, nkv * hd, k[r]);
            mref_matvec(T("attn_v.weight"), TB("attn_v.bias"), h, H, nkv * hd, v[r]);
            for (uint32_t j = 0; j < nh; j++)
                mref_rope(q[r] + j * hd, hd, (uint64_t)r, hp->rope_base, hp->rope == MODEL_ROPE_NEOX);
            for (uint32_t j = 0; j < nkv; j++)
                mref_rope(k[r] + j * hd, hd, (uint64_t)r, hp->rope_base, hp->rope == MODEL_ROPE_NEOX);
        }
        for (int r = 0; r < R; r++)
            for (uint32_t j = 0; j < nh; j++) {
                uint32_t kvh = j / group; /* GQA: Q head j reads KV head j / group */
                double sc[R], mx = -1e300, sum = 0;
                for (int p = 0; p <= r; p++) {
                    double d = 0;
                    for (uint32_t c = 0; c < hd; c++)
                        d += q[r][j * hd + c] * k[p][kvh * hd + c];
                    sc[p] = d * kq / sqrt((double)hd);
                    mx = sc[p] > mx ? sc[p] : mx;
                }
                for (int p = 0; p <= r; p++)
                    sum += (sc[p] = exp(sc[p] - mx));
                for (uint32_t c = 0; c < hd; c++) {
                    double o2 = 0;
                    for (int p = 0; p <= r; p++)
                        o2 += sc[p] / sum * v[p][kvh * hd + c];
                    att[r][j * hd + c] = o2;
                }
            }
        for (int r = 0; r < R; r++) {
            double o2[32];
            mref_matvec(T("attn_output.weight"), NULL, att[r], nh * hd, H, o2);
            for (uint32_t i = 0; i < H; i++)
                ref[r][i] += o2[i];
            mref_norm(ref[r], T("ffn_norm.weight"), H, hp->rms_eps, h);
            mref_ffn(f, hp, L, h, o2);
            for (uint32_t i = 0; i < H; i++)
                ref[r][i] += o2[i];
        }
#undef T
#undef TB
    }

    float x_in[R * 32];
    memcpy(x_in, x, sizeof x_in);
    stage *st;
    cache_policy pol;
    policy_default(&pol);
    stage_config sc = {.m = m, .policy = pol, .max_rows = R, .max_streams = 1};
    ck_assert_int_eq(stage_new(&sc, &st, &e), PD_OK);
    mb_admit ad = {.stream = 3, .prefill_rows = R, .max_new = 1};
    ck_assert_int_eq(stage_admit(st, &ad, &e), PD_OK);
    mb_row rows[R];
    for (int r = 0; r < R; r++)
        rows[r] = (mb_row){.stream = 3, .pos = (uint64_t)r, .role = MB_ROLE_PREFILL};
    ck_assert_int_eq(stage_forward(st, rows, R, x, &e), PD_OK);
    double worst = 0;
    for (int r = 0; r < R; r++)
        for (uint32_t i = 0; i < H; i++) {
            double d = fabs(x[r * H + i] - ref[r][i]) / (fabs(ref[r][i]) + 1e-2);
            worst = d > worst ? d : worst;
        }
    ck_assert_msg(worst < 2e-4, "%s %s %u/%u heads: max relative error %g against the reference",
                  model_arch_name(arch), mk_dtype_name(dtype), heads, kv_heads, worst);
    stage_free(st);

    /* the model's layer math without a stage: one group of 3 prefill and 2
     * decode rows per layer, through a kv and through a ring container
     * (window 4 holds both decode rows, so it sees every row as well): the
     * stage's bits exactly, and the progress hook between the GEMMs; with no
     * pool and with pools of 2 and 3 threads (one group, fewer than the
     * threads: a kv layer attends by KV-head ranges on them) */
    pool *pools[3] = {NULL};
    ck_assert_int_eq(pool_new(2, &pools[1], &e), PD_OK);
    ck_assert_int_eq(pool_new(3, &pools[2], &e), PD_OK);
    for (int pk = 0; pk < 3; pk++)
    for (int kind = 0; kind < LCACHE_KIND_COUNT; kind++) {
        lcache_config cc = {.kind = (lcache_kind)kind,
                            .n_kv_heads = nkv,
                            .head_dim = hd,
                            .q_per_kv = group,
                            .window = kind == LCACHE_KIND_RING ? 4 : 0,
                            .prefill_rows = 3,
                            .max_new = 2};
        lcache *caches[3];
        for (uint32_t L = 0; L < hp->n_layers; L++)
            ck_assert_int_eq(lcache_new(&cc, &caches[L], &e), PD_OK);
        model_scratch *scr;
        ck_assert_int_eq(model_scratch_new(hp, R, &scr, &e), PD_OK);
        ck_assert_uint_eq(model_scratch_rows(scr), R);
        uint64_t pos[R];
        uint8_t roles[R];
        for (int r = 0; r < R; r++) {
            pos[r] = (uint64_t)r;
            roles[r] = r < 3 ? LCACHE_ROLE_PREFILL : LCACHE_ROLE_DECODE;
        }
        float y[R * 32];
        memcpy(y, x_in, sizeof y);
        int calls = 0;
        model_hooks hk = {.progress = count_call, .ctx = &calls};
        for (uint32_t L = 0; L < hp->n_layers; L++) {
            model_group g = {.row0 = 0, .n = R, .cache = caches[L]};
            model_batch b = {.n = R, .pos = pos, .roles = roles, .groups = &g, .n_groups = 1};
            ck_assert_msg(model_layer_forward(m, L, &b, y, scr, pools[pk], &hk, &e) == PD_OK, "%s", e.msg);
            lcache_check(caches[L]);
            ck_assert_uint_eq(lcache_position(caches[L]), R);
        }
        ck_assert_int_eq(calls, 4 * (int)hp->n_layers);
        ck_assert_msg(memcmp(y, x, (size_t)R * H * sizeof(float)) == 0,
                      "model_layer_forward (%s container, %u threads) differs from stage_forward",
                      kind == LCACHE_KIND_RING ? "ring" : "kv", pool_threads(pools[pk]));
        for (uint32_t L = 0; L < hp->n_layers; L++)
            lcache_free(caches[L]);
        model_scratch_free(scr);
    }
    pool_free(pools[1]);
    pool_free(pools[2]);
    mref_tensors_free();
    gguf_close(f);
    model_free(m);
    unlink(path);
}

static void check_stack(model_arch arch, uint32_t heads, uint32_t kv_heads)
{
    check_stack_dt(arch, heads, kv_heads, MK_F32);
}

START_TEST(model_stack_matches_reference_llama_gqa)
{
    check_stack(MODEL_ARCH_LLAMA, 4, 2);
}
END_TEST

START_TEST(model_stack_matches_reference_qwen2_mha_with_bias)
{
    check_stack(MODEL_ARCH_QWEN2, 4, 4);
}
END_TEST

START_TEST(model_stack_matches_reference_qwen2_gqa_with_bias)
{
    check_stack(MODEL_ARCH_QWEN2, 4, 1);
}
END_TEST

/* deepseek: a dense layer, then two MoE layers (router, top-2 of 8 experts,
 * 2 shared experts) against the double-precision reference */
START_TEST(model_stack_matches_reference_deepseek_moe)
{
    check_stack(MODEL_ARCH_DEEPSEEK, 4, 4);
}
END_TEST

/* deepseek2-ocr: NEOX rope over the whole head, the same MoE, against the
 * double-precision reference; and on Q8_0, Q4_0 and Q5_0 weights, exactly
 * dequantized by the test's ggml reference (hidden 32: the K types would
 * fall back to these) */
START_TEST(model_stack_matches_reference_deepseek2_ocr)
{
    check_stack(MODEL_ARCH_DEEPSEEK2_OCR, 4, 4);
    check_stack_dt(MODEL_ARCH_DEEPSEEK2_OCR, 4, 4, MK_Q8_0);
    check_stack_dt(MODEL_ARCH_DEEPSEEK2_OCR, 4, 4, MK_Q4_0);
    check_stack_dt(MODEL_ARCH_DEEPSEEK2_OCR, 4, 4, MK_Q5_0);
    check_stack_dt(MODEL_ARCH_LLAMA, 4, 2, MK_Q4_0);
}
END_TEST

/* deepseek2-ocr with YaRN keys (DeepSeek-OCR's converter writes them for a
 * long-context variant): scores scaled by mscale^2 as llama.cpp's kq_scale,
 * the rope unchanged; also linear scaling, which the OCR graph turns into
 * the same kind of score factor, and f16 / Q8_0 weights */
START_TEST(model_stack_matches_reference_deepseek2_ocr_yarn)
{
    check_stack_ex(MODEL_ARCH_DEEPSEEK2_OCR, 4, 4, MK_F32, "yarn", 40.0f);
    check_stack_ex(MODEL_ARCH_DEEPSEEK2_OCR, 4, 4, MK_F32, "yarn", 0.25f);
    check_stack_ex(MODEL_ARCH_DEEPSEEK2_OCR, 4, 4, MK_F32, "linear", 4.0f);
    check_stack_ex(MODEL_ARCH_DEEPSEEK2_OCR, 4, 4, MK_Q8_0, "yarn", 16.0f);
}
END_TEST

/* model_ocr_kq_mul (float, as llama.cpp computes it) against the float64
 * formula over types, factors and attn factors; exactly 1 without keys */
START_TEST(model_ocr_kq_mul_matches_the_float64_formula)
{
    const float factors[] = {0.0f, 1e-3f, 0.25f, 0.5f, 1.0f, 1.5f, 2.0f, 4.0f, 40.0f, 1000.0f, 1e6f};
    const float attn[] = {1.0f, 0.707f, 1.25f};
    for (int t = 0; t < MODEL_ROPE_SCALING_COUNT; t++)
        for (size_t i = 0; i < sizeof factors / sizeof factors[0]; i++)
            for (size_t j = 0; j < sizeof attn / sizeof attn[0]; j++) {
                double want = mref_kq_mul((model_rope_scaling)t, factors[i], attn[j]);
                float got = model_ocr_kq_mul((model_rope_scaling)t, factors[i], attn[j]);
                ck_assert_msg(fabs(got - want) <= 2e-6 * want, "type %d factor %g attn %g: %.9g vs %.9g", t,
                              (double)factors[i], (double)attn[j], (double)got, want);
            }
    for (int t = 0; t < MODEL_ROPE_SCALING_COUNT; t++) {
        ck_assert(model_ocr_kq_mul((model_rope_scaling)t, 0.0f, 1.0f) == 1.0f);
        ck_assert(model_ocr_kq_mul((model_rope_scaling)t, 1.0f, 1.0f) == 1.0f);
    }
    ck_assert(model_ocr_kq_mul(MODEL_ROPE_SCALING_NONE, 40.0f, 1.0f) == 1.0f);
    /* YaRN 40: mscale = 1 + 0.1 ln 40 */
    ck_assert_double_eq_tol(model_ocr_kq_mul(MODEL_ROPE_SCALING_YARN, 40.0f, 1.0f),
                            (1 + 0.1 * log(40.0)) * (1 + 0.1 * log(40.0)), 1e-6);
}
END_TEST

/* The router: softmax over every expert against double precision, the top k
 * in decreasing order, equal probabilities in increasing expert index, the
 * weights the probabilities themselves (no renormalisation). */
START_TEST(model_moe_route_is_softmax_top_k_with_ties_to_the_lower_index)
{
    const float lg[8] = {0.5f, 2.0f, -1.0f, 2.0f, 0.25f, 2.0f, -3.0f, 1.0f};
    float p[8];
    uint32_t sel[5];
    float w[5];
    model_moe_route(lg, 8, 5, p, sel, w);
    double mx = 2.0, sum = 0;
    for (int e = 0; e < 8; e++)
        sum += exp(lg[e] - mx);
    for (int e = 0; e < 8; e++)
        ck_assert_double_eq_tol(p[e], exp(lg[e] - mx) / sum, 1e-7);
    const uint32_t want[5] = {1, 3, 5, 7, 0}; /* three-way tie at 2.0 in index order */
    for (int r = 0; r < 5; r++) {
        ck_assert_uint_eq(sel[r], want[r]);
        ck_assert_int_eq(memcmp(&w[r], &p[want[r]], sizeof(float)), 0);
    }
    /* the same in place, and every expert (k = n) in a total order */
    float q[8];
    memcpy(q, lg, sizeof q);
    uint32_t all[8];
    float wa[8];
    model_moe_route(q, 8, 8, q, all, wa);
    ck_assert_int_eq(memcmp(q, p, sizeof p), 0);
    const uint32_t order[8] = {1, 3, 5, 7, 0, 4, 2, 6};
    for (int r = 0; r < 8; r++)
        ck_assert_uint_eq(all[r], order[r]);
    /* all equal: the first k experts, each weight 1/n */
    const float flat[4] = {0.3f, 0.3f, 0.3f, 0.3f};
    uint32_t s2[2];
    float w2[2], p2[4];
    model_moe_route(flat, 4, 2, p2, s2, w2);
    ck_assert_uint_eq(s2[0], 0);
    ck_assert_uint_eq(s2[1], 1);
    ck_assert_float_eq(w2[0], 0.25f);
}
END_TEST

/* deepseek2-ocr's router options, as build_moe_ffn: the selection bias picks
 * experts but the weights stay the unbiased p; sigmoid gating; the chosen
 * weights renormalised (sum in double, clamped) and scaled. */
START_TEST(model_moe_route_ex_bias_selects_norm_and_scale_weigh)
{
    const float lg[6] = {1.0f, 0.5f, -0.25f, 2.0f, 0.0f, -1.0f};
    const float bias[6] = {0.0f, 0.0f, 5.0f, 0.0f, 0.0f, 0.0f};
    float p[6], w[2], pr[6], wr[2];
    uint32_t sel[2], selr[2];
    model_moe_route(lg, 6, 2, pr, selr, wr);
    ck_assert_uint_eq(selr[0], 3);
    ck_assert_uint_eq(selr[1], 0);
    model_moe_opts o = {.gating = MODEL_MOE_SOFTMAX, .sel_bias = bias};
    model_moe_route_ex(lg, 6, 2, &o, p, sel, w);
    ck_assert_int_eq(memcmp(p, pr, sizeof p), 0); /* p unbiased */
    ck_assert_uint_eq(sel[0], 2);                 /* biased into the top */
    ck_assert_uint_eq(sel[1], 3);
    ck_assert_int_eq(memcmp(&w[0], &p[2], 4), 0); /* weight of the unbiased p */
    /* norm and scale */
    o = (model_moe_opts){.gating = MODEL_MOE_SOFTMAX, .norm_w = 1, .scale_w = 2.5f};
    model_moe_route_ex(lg, 6, 2, &o, p, sel, w);
    float s = (float)((double)pr[3] + (double)pr[0]);
    ck_assert_int_eq(sel[0], 3);
    ck_assert_float_eq(w[0], (pr[3] / s) * 2.5f);
    ck_assert_float_eq(w[1], (pr[0] / s) * 2.5f);
    /* scale 1 or 0: not applied */
    o = (model_moe_opts){.gating = MODEL_MOE_SOFTMAX, .scale_w = 1.0f};
    model_moe_route_ex(lg, 6, 2, &o, p, sel, w);
    ck_assert_int_eq(memcmp(w, wr, sizeof w), 0);
    /* sigmoid gating */
    o = (model_moe_opts){.gating = MODEL_MOE_SIGMOID};
    model_moe_route_ex(lg, 6, 2, &o, p, sel, w);
    for (int e = 0; e < 6; e++)
        ck_assert_double_eq_tol(p[e], 1.0 / (1.0 + exp(-(double)lg[e])), 1e-6);
    ck_assert_uint_eq(sel[0], 3);
    ck_assert_uint_eq(sel[1], 0);
    /* the clamp: tiny weights are divided by 6.103515625e-5, not their sum */
    const float neg[2] = {-30.0f, -31.0f};
    o = (model_moe_opts){.gating = MODEL_MOE_SIGMOID, .norm_w = 1};
    model_moe_route_ex(neg, 2, 1, &o, p, sel, w);
    ck_assert_float_eq(w[0], p[0] / 6.103515625e-5f);
}
END_TEST

/* A row's MoE output bits do not depend on the other rows of its batch (which
 * experts they share with it), on their order, or on the thread count: each
 * row alone equals the same row inside batches of 7 rows in two orders, with
 * a pool of 1 and of 3 threads. */
START_TEST(model_moe_rows_do_not_depend_on_their_batch)
{
    char path[] = "/tmp/pd_test_model_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    mkmodel_opts o;
    deepseek_small_opts(&o, 3);
    pd_err e = {0};
    ck_assert_msg(mkmodel_write(&o, path, &e) == PD_OK, "%s", e.msg);
    model *m;
    model_load_opts lo = {.first_layer = 1, .n_layers = 2};
    ck_assert_msg(model_load(path, &lo, &m, &e) == PD_OK, "%s", e.msg);
    const model_hparams *hp = model_hp(m);
    ck_assert_int_eq(model_layer_get(m, 1)->ffn, MODEL_FFN_MOE);
    ck_assert_str_eq(model_ffn_kind_name(MODEL_FFN_MOE), "moe");
    enum { N = 7 };
    const uint32_t H = hp->hidden;
    model_scratch *scr;
    ck_assert_int_eq(model_scratch_new(hp, N, &scr, &e), PD_OK);
    pool *p3;
    ck_assert_int_eq(pool_new(3, &p3, &e), PD_OK);
    float h[N * 32], hr[N * 32], alone[N * 32], out[N * 32];
    pd_rng r = {.s = 11};
    pd_rng_fill(&r, h, N * H, -1.5f, 1.5f);
    for (int i = 0; i < N; i++)
        memcpy(hr + (N - 1 - i) * H, h + i * H, H * sizeof(float));
    for (uint32_t L = 1; L <= 2; L++) {
        for (int i = 0; i < N; i++)
            model_ffn(m, L, h + i * H, 1, alone + i * H, scr, NULL, NULL);
        pool *pools[2] = {NULL, p3};
        for (int k = 0; k < 2; k++) {
            int calls = 0;
            model_hooks hk = {.progress = count_call, .ctx = &calls};
            model_ffn(m, L, h, N, out, scr, pools[k], &hk);
            ck_assert_int_eq(calls, 2);
            ck_assert_msg(memcmp(out, alone, sizeof out) == 0, "layer %u, %d threads: batch != alone", L,
                          k ? 3 : 1);
            model_ffn(m, L, hr, N, out, scr, pools[k], NULL);
            for (int i = 0; i < N; i++)
                ck_assert_int_eq(memcmp(out + (N - 1 - i) * H, alone + i * H, H * sizeof(float)), 0);
        }
    }
    pool_free(p3);
    model_scratch_free(scr);
    model_free(m);
    unlink(path);
}
END_TEST

static void rename_in_file(const char *path, const char *name, size_t at, char to);

/* Overwrites the u32 value of metadata key `key` (its type word follows the
 * name, then the value). */
static void set_key_u32(const char *path, const char *key, uint32_t v)
{
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f), len = strlen(key);
    size_t at = 0;
    for (size_t i = 8; i + len + 8 <= n && !at; i++)
        if (!memcmp(buf + i, key, len) && buf[i - 1] == 0 && buf[i + len] == 4 /* GGUF u32 */)
            at = i + len + 4;
    ck_assert_msg(at, "key %s not found", key);
    ck_assert_int_eq(fseek(f, (long)at, SEEK_SET), 0);
    ck_assert_uint_eq(fwrite(&v, 4, 1, f), 1); /* little-endian host (x86-64) */
    fclose(f);
}

/* Loader errors of a deepseek file say which key or tensor and why. */
START_TEST(model_deepseek_loader_names_bad_moe_keys_and_tensors)
{
    char path[] = "/tmp/pd_test_model_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    mkmodel_opts o;
    deepseek_small_opts(&o, 2);
    pd_err e = {0};
    model_hparams hp;
    model *m = NULL;
    model_load_opts la = {.all_layers = 1, .want_embed = 1, .want_output = 1};
    ck_assert_msg(mkmodel_write(&o, path, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(model_read_hparams(path, &hp, &e) == PD_OK, "%s", e.msg);
    ck_assert_int_eq(hp.arch, MODEL_ARCH_DEEPSEEK);
    ck_assert_int_eq(hp.rope, MODEL_ROPE_NORM);
    ck_assert_uint_eq(hp.n_dense_lead, 1);
    ck_assert_uint_eq(hp.n_expert, 8);
    ck_assert_uint_eq(hp.n_expert_used, 2);
    ck_assert_uint_eq(hp.n_expert_shared, 2);
    ck_assert_uint_eq(hp.ffn_exp, 16);
    ck_assert(hp.expert_weights_scale == 1.0f);
    ck_assert_uint_eq(hp.eos, 1);
    ck_assert_uint_eq(hp.bos, 0);
    /* missing keys, each named */
    const char *keys[] = {"deepseek.expert_count", "deepseek.expert_used_count", "deepseek.expert_shared_count",
                          "deepseek.expert_feed_forward_length", "deepseek.leading_dense_block_count",
                          "deepseek.expert_weights_scale"};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) {
        ck_assert_int_eq(mkmodel_write(&o, path, &e), PD_OK);
        rename_in_file(path, keys[k], strlen(keys[k]) - 1, '_'); /* "…coun_" */
        pd_err_clear(&e);
        ck_assert_int_eq(model_load(path, &la, &m, &e), PD_ERR_FORMAT);
        ck_assert_ptr_null(m);
        ck_assert_msg(strstr(e.msg, "missing metadata key") && strstr(e.msg, keys[k]), "%s", e.msg);
    }
    /* expert_used_count > expert_count */
    ck_assert_int_eq(mkmodel_write(&o, path, &e), PD_OK);
    set_key_u32(path, "deepseek.expert_used_count", 9);
    pd_err_clear(&e);
    ck_assert_int_eq(model_read_hparams(path, &hp, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "deepseek.expert_used_count 9: expected 1..expert_count 8"), "%s", e.msg);
    /* expert_count not matching the tensors */
    ck_assert_int_eq(mkmodel_write(&o, path, &e), PD_OK);
    set_key_u32(path, "deepseek.expert_count", 4);
    pd_err_clear(&e);
    ck_assert_int_eq(model_load(path, &la, &m, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "blk.1.ffn_gate_inp.weight has shape [32, 8]"), "%s", e.msg);
    ck_assert_int_eq(mkmodel_write(&o, path, &e), PD_OK);
    set_key_u32(path, "deepseek.expert_feed_forward_length", 8);
    pd_err_clear(&e);
    ck_assert_int_eq(model_load(path, &la, &m, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "blk.1.ffn_gate_exps.weight has shape [32, 16, 8] (3 dims), expected [32, 8, 8]"),
                  "%s", e.msg);
    /* a dense count that makes layer 1 dense: its MoE tensors are unused,
     * its dense ones missing */
    ck_assert_int_eq(mkmodel_write(&o, path, &e), PD_OK);
    set_key_u32(path, "deepseek.leading_dense_block_count", 2);
    pd_err_clear(&e);
    ck_assert_int_eq(model_load(path, &la, &m, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "not used by architecture deepseek") && strstr(e.msg, "blk.1.ffn_gate_inp.weight"),
                  "%s", e.msg);
    /* a renamed expert tensor */
    ck_assert_int_eq(mkmodel_write(&o, path, &e), PD_OK);
    rename_in_file(path, "blk.2.ffn_down_exps.weight", 10, 'D');
    pd_err_clear(&e);
    ck_assert_int_eq(model_load(path, &la, &m, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "blk.2.ffn_Down_exps.weight"), "%s", e.msg);
    /* the output is not tied */
    ck_assert_int_eq(mkmodel_write(&o, path, &e), PD_OK);
    rename_in_file(path, "output.weight", 5, 'T');
    pd_err_clear(&e);
    ck_assert_int_eq(model_read_hparams(path, &hp, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "output.weight is missing"), "%s", e.msg);
    unlink(path);
}
END_TEST

/* Each layer carries its feed-forward kind; model_ffn runs that kind's
 * routine: for SWIGLU exactly the GEMMs and model_swiglu by hand. */
START_TEST(model_ffn_runs_the_kind_each_layer_carries)
{
    char path[] = "/tmp/pd_test_model_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    mkmodel_opts o;
    mkmodel_defaults(&o);
    o.layers = 2;
    o.hidden = 32;
    o.heads = 4;
    o.kv_heads = 2;
    o.ffn = 40;
    o.vocab = 300;
    pd_err e = {0};
    ck_assert_int_eq(mkmodel_write(&o, path, &e), PD_OK);
    model *m;
    model_load_opts lo = {.all_layers = 1};
    ck_assert_int_eq(model_load(path, &lo, &m, &e), PD_OK);
    const model_hparams *hp = model_hp(m);
    enum { N = 3 };
    model_scratch *scr;
    ck_assert_int_eq(model_scratch_new(hp, N, &scr, &e), PD_OK);
    ck_assert_int_eq(model_scratch_new(hp, 0, &(model_scratch *){NULL}, &e), PD_ERR_ARG);
    float h[N * 32], out[N * 32], g[N * 40], u[N * 40], want[N * 32];
    pd_rng r = {.s = 3};
    pd_rng_fill(&r, h, sizeof h / sizeof h[0], -1, 1);
    for (uint32_t L = 0; L < hp->n_layers; L++) {
        const model_layer *ly = model_layer_get(m, L);
        ck_assert_int_eq(ly->ffn, MODEL_FFN_SWIGLU);
        ck_assert_str_eq(model_ffn_kind_name(ly->ffn), "swiglu");
        int calls = 0;
        model_hooks hk = {.progress = count_call, .ctx = &calls};
        model_ffn(m, L, h, N, out, scr, NULL, &hk);
        ck_assert_int_eq(calls, 2);
        gemm_run(ly->wgate, h, N, g, NULL);
        gemm_run(ly->wup, h, N, u, NULL);
        model_swiglu(g, u, N * hp->ffn, g);
        gemm_run(ly->wdown, g, N, want, NULL);
        ck_assert_int_eq(memcmp(out, want, (size_t)N * hp->hidden * sizeof(float)), 0);
    }
    ck_assert_str_eq(model_ffn_kind_name(MODEL_FFN_KIND_COUNT), "unknown");
    model_scratch_free(scr);
    model_scratch_free(NULL);
    model_free(m);
    unlink(path);
}
END_TEST

/* Writes the fixed small model of the digest tests (2 layers, hidden 16, 2
 * heads over 1 KV head, ffn 24, vocab 300, default seed) to a new temporary
 * file; path is a mkstemp template, filled in. */
static void small_model_write(const char *path)
{
    mkmodel_opts o;
    mkmodel_defaults(&o);
    o.layers = 2;
    o.hidden = 16;
    o.heads = 2;
    o.kv_heads = 1;
    o.ffn = 24;
    o.vocab = 300;
    pd_err e = {0};
    ck_assert_msg(mkmodel_write(&o, path, &e) == PD_OK, "%s", e.msg);
}

static void small_model(char *path)
{
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    small_model_write(path);
}

/* The digest identifies the file's bytes: the same file gives the same
 * value in every load (any layer range), one changed weight byte another. */
START_TEST(model_digest_is_stable_and_sees_one_weight_byte)
{
    char path[] = "/tmp/pd_test_model_XXXXXX";
    small_model(path);
    pd_err e = {0};
    model *a, *b;
    model_load_opts la = {.all_layers = 1, .want_embed = 1, .want_output = 1};
    model_load_opts lb = {.first_layer = 1, .n_layers = 1, .want_output = 1};
    ck_assert_int_eq(model_load(path, &la, &a, &e), PD_OK);
    ck_assert_int_eq(model_load(path, &lb, &b, &e), PD_OK);
    uint64_t d = model_digest(a);
    ck_assert_uint_eq(d, model_digest(b));
    ck_assert_uint_eq(d, model_digest(a));
    model_free(a);
    model_free(b);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fseek(f, -100, SEEK_END), 0);
    int c = fgetc(f);
    ck_assert_int_eq(fseek(f, -100, SEEK_END), 0);
    fputc(c ^ 1, f);
    fclose(f);
    ck_assert_int_eq(model_load(path, &la, &a, &e), PD_OK);
    ck_assert_uint_ne(model_digest(a), d);
    model_free(a);
    unlink(path);
}
END_TEST

/* The fingerprint ranks compare at start-up: equal for every load of the
 * same file whatever the layer range, different after one weight byte
 * changes in a sampled span (here the last bytes of the last tensor) or in
 * the header, while reading far less than the whole file. */
START_TEST(model_fingerprint_is_stable_and_sees_weights_and_header)
{
    char path[] = "/tmp/pd_test_model_XXXXXX";
    small_model(path);
    pd_err e = {0};
    model *a, *b;
    model_load_opts la = {.all_layers = 1, .want_embed = 1, .want_output = 1};
    model_load_opts lb = {.first_layer = 1, .n_layers = 1};
    ck_assert_int_eq(model_load(path, &la, &a, &e), PD_OK);
    ck_assert_int_eq(model_load(path, &lb, &b, &e), PD_OK);
    uint64_t f0 = model_fingerprint(a);
    ck_assert_uint_eq(f0, model_fingerprint(b));
    ck_assert_uint_ne(f0, model_digest(a));
    model_free(a);
    model_free(b);
    long offs[2] = {-3, 40}; /* a weight byte at the end; a metadata byte */
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(path, "r+b");
        ck_assert_ptr_nonnull(f);
        ck_assert_int_eq(fseek(f, offs[k], offs[k] < 0 ? SEEK_END : SEEK_SET), 0);
        int c = fgetc(f);
        ck_assert_int_eq(fseek(f, offs[k], offs[k] < 0 ? SEEK_END : SEEK_SET), 0);
        fputc(c ^ 0x10, f);
        fclose(f);
        if (model_load(path, &la, &a, &e) == PD_OK) {
            ck_assert_uint_ne(model_fingerprint(a), f0);
            model_free(a);
        }
        f = fopen(path, "r+b");
        ck_assert_int_eq(fseek(f, offs[k], offs[k] < 0 ? SEEK_END : SEEK_SET), 0);
        fputc(c, f);
        fclose(f);
    }
    unlink(path);
}
END_TEST

/* The digest of a fixed synthetic model, pinned (values computed before the
 * digest's FNV-1a tail moved to base/fnv.c): once as written (a multiple of 8
 * bytes) and once with 5 trailing bytes, which only the FNV tail reads.
 * Checkpoints and migrations compare this value across ranks and runs. */
START_TEST(model_digest_is_pinned_including_the_unaligned_tail)
{
    char path[] = "/tmp/pd_test_model_XXXXXX";
    small_model(path);
    pd_err e = {0};
    model *m;
    model_load_opts la = {.all_layers = 1, .want_embed = 1, .want_output = 1};
    ck_assert_msg(model_load(path, &la, &m, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(model_digest(m), 0xe6181e29819c4f6eull);
    model_free(m);
    FILE *f = fopen(path, "ab");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite("\x01\x02\x03\x04\x05", 1, 5, f), 5);
    fclose(f);
    ck_assert_msg(model_load(path, &la, &m, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(model_digest(m), 0xdf532190d593e67cull);
    model_free(m);
    unlink(path);
}
END_TEST

/* Flips the first byte `at` bytes into the first occurrence of name in the
 * file at path (a tensor name in the directory: the file stays well formed). */
static void rename_in_file(const char *path, const char *name, size_t at, char to)
{
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    size_t len = strlen(name);
    char *hit = NULL;
    for (size_t i = 1; i + len <= n && !hit; i++)
        if (!memcmp(buf + i, name, len) && buf[i - 1] == 0 /* u64 length's high byte */)
            hit = buf + i;
    ck_assert_msg(hit != NULL, "%s not in the first %zu bytes", name, n);
    ck_assert_int_eq(fseek(f, (long)(hit - buf + (ptrdiff_t)at), SEEK_SET), 0);
    fputc(to, f);
    fclose(f);
}

/* A tensor the architecture does not read is refused by name, like
 * llama.cpp does: a renamed output.weight would otherwise load as a model
 * with tied embeddings (and decode one repeated token), a renamed layer
 * weight would only be found missing. */
START_TEST(model_refuses_tensors_the_architecture_does_not_use)
{
    char path[] = "/tmp/pd_test_model_XXXXXX";
    small_model(path);
    model_load_opts la = {.all_layers = 1, .want_embed = 1, .want_output = 1};
    model *m = NULL;
    model_hparams hp;
    pd_err e = {0};
    ck_assert_msg(model_load(path, &la, &m, &e) == PD_OK, "%s", e.msg);
    ck_assert(!model_hp(m)->tied_output);
    model_free(m);
    m = NULL;
    rename_in_file(path, "output.weight", 5, 'T'); /* "outpuT.weight" */
    ck_assert_int_eq(model_load(path, &la, &m, &e), PD_ERR_FORMAT);
    ck_assert_ptr_null(m);
    ck_assert_msg(strstr(e.msg, path) && strstr(e.msg, "outpuT.weight") &&
                      strstr(e.msg, "not used by architecture llama"),
                  "%s", e.msg);
    pd_err_clear(&e);
    ck_assert_int_eq(model_read_hparams(path, &hp, &e), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "outpuT.weight"));
    /* a layer's tensor: named as unused, not only as missing */
    small_model_write(path);
    rename_in_file(path, "blk.1.ffn_up.weight", 10, 'U');
    pd_err_clear(&e);
    ck_assert_int_eq(model_load(path, &la, &m, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "blk.1.ffn_Up.weight"), "%s", e.msg);
    /* a layer beyond block_count */
    small_model_write(path);
    rename_in_file(path, "blk.1.attn_norm.weight", 4, '7');
    pd_err_clear(&e);
    ck_assert_int_eq(model_read_hparams(path, &hp, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "blk.7.attn_norm.weight"), "%s", e.msg);
    unlink(path);
}
END_TEST

/* Optional keys a file leaves out are filled with defaults, and the
 * hyperparameters say which, so a run can tell its user what it assumed. */
START_TEST(model_hparams_list_the_keys_that_defaulted)
{
    char path[] = "/tmp/pd_test_model_XXXXXX";
    small_model(path);
    model_hparams hp;
    pd_err e = {0};
    ck_assert_msg(model_read_hparams(path, &hp, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(hp.defaulted, 0); /* mkmodel writes every key */
    ck_assert_str_eq(hp.assumed, "");
    rename_in_file(path, "llama.rope.freq_base", 19, 'E'); /* now an unrelated key */
    ck_assert_msg(model_read_hparams(path, &hp, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(hp.defaulted, 1u << MODEL_HP_KEY_ROPE_BASE);
    ck_assert(hp.rope_base == 10000.0f);
    ck_assert_str_eq(hp.assumed, "rope base 10000 (llama.rope.freq_base absent)");
    model *m = NULL;
    model_load_opts la = {.all_layers = 1, .want_embed = 1, .want_output = 1};
    ck_assert_msg(model_load(path, &la, &m, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(model_hp(m)->defaulted, 1u << MODEL_HP_KEY_ROPE_BASE);
    ck_assert_str_eq(model_hp(m)->assumed, "rope base 10000 (llama.rope.freq_base absent)");
    model_free(m);
    /* several, in model_hp_key order (the kv head default does not fit this
     * file's tensors, so only the hyperparameters are read) */
    rename_in_file(path, "llama.attention.layer_norm_rms_epsilon", 37, 'N');
    rename_in_file(path, "llama.attention.head_count_kv", 28, 'V');
    rename_in_file(path, "general.alignment", 16, 'T');
    ck_assert_msg(model_read_hparams(path, &hp, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(hp.defaulted, (1u << MODEL_HP_KEY_ROPE_BASE) | (1u << MODEL_HP_KEY_RMS_EPS) |
                                        (1u << MODEL_HP_KEY_KV_HEADS) |
                                        (1u << MODEL_HP_KEY_ALIGNMENT));
    ck_assert_uint_eq(hp.n_kv_heads, hp.n_heads);
    ck_assert_str_eq(hp.assumed,
                     "kv heads 2 (llama.attention.head_count_kv absent), rope base 10000 "
                     "(llama.rope.freq_base absent), rms epsilon 1e-05 "
                     "(llama.attention.layer_norm_rms_epsilon absent), alignment 32 "
                     "(general.alignment absent)");
    unlink(path);
}
END_TEST

/* deepseek2-ocr's rope-scaling keys: a type llama.cpp does not know, or a
 * negative / non-finite factor, is refused naming the key (the file is a
 * YaRN model from mkmodel with one value patched in place) */
static void patch_after(const char *path, const char *key, size_t skip, const void *bytes, size_t n)
{
    FILE *fp = fopen(path, "r+b");
    ck_assert_ptr_nonnull(fp);
    static uint8_t buf[1 << 16];
    size_t got = fread(buf, 1, sizeof buf, fp);
    size_t kl = strlen(key), at = 0;
    for (size_t i = 0; i + kl <= got && !at; i++)
        if (!memcmp(buf + i, key, kl))
            at = i + kl;
    ck_assert_msg(at != 0, "key %s not in the first %zu bytes", key, got);
    ck_assert_int_eq(fseek(fp, (long)(at + skip), SEEK_SET), 0);
    ck_assert_uint_eq(fwrite(bytes, 1, n, fp), n);
    fclose(fp);
}

START_TEST(model_deepseek2_ocr_refuses_bad_rope_scaling_keys)
{
    char path[] = "/tmp/pd_test_model_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    mkmodel_opts o;
    deepseek_small_opts(&o, 2);
    o.arch = MODEL_ARCH_DEEPSEEK2_OCR;
    o.rope_scaling = "yarn";
    o.rope_factor = 4.0f;
    pd_err e = {0};
    model_hparams hp;
    ck_assert_int_eq(mkmodel_write(&o, path, &e), PD_OK);
    ck_assert_msg(model_read_hparams(path, &hp, &e) == PD_OK, "%s", e.msg);
    ck_assert_int_eq(hp.rope_scaling, MODEL_ROPE_SCALING_YARN);
    ck_assert(hp.kq_mul > 1.2f && hp.kq_mul < 1.3f); /* (1 + 0.1 ln 4)^2 = 1.296 */
    /* value of a string: u32 type, u64 length, then the bytes */
    patch_after(path, "rope.scaling.type", 12, "nope", 4);
    ck_assert_int_eq(model_read_hparams(path, &hp, &e), PD_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "deepseek2-ocr.rope.scaling.type \"nope\"") != NULL, "%s", e.msg);
    patch_after(path, "rope.scaling.type", 12, "yarn", 4);
    float bad[2] = {-2.0f, NAN};
    for (int i = 0; i < 2; i++) {
        patch_after(path, "rope.scaling.factor", 4, &bad[i], 4); /* value of an f32: u32 type, 4 bytes */
        pd_err_clear(&e);
        ck_assert_int_eq(model_read_hparams(path, &hp, &e), PD_ERR_FORMAT);
        ck_assert_msg(strstr(e.msg, "deepseek2-ocr.rope.scaling.factor") != NULL, "%s", e.msg);
    }
    unlink(path);
}
END_TEST

START_TEST(model_refuses_unsupported_architecture_and_types)
{
    char path[] = "/tmp/pd_test_model_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "mamba");
    pd_err e = {0};
    ck_assert_int_eq(gguf_writer_write(w, path, &e), PD_OK);
    gguf_writer_free(w);
    model_hparams hp;
    ck_assert_int_eq(model_read_hparams(path, &hp, &e), PD_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "mamba") != NULL, "%s", e.msg);
    pd_err_clear(&e);
    ck_assert_int_ne(model_read_hparams("/nonexistent/model.gguf", &hp, &e), PD_OK);
    ck_assert_msg(strstr(e.msg, "/nonexistent/model.gguf") != NULL, "%s", e.msg);
    /* a Q4_0 model whose blk.1.attn_v.weight claims IQ4_NL (the same block
     * size): refused by the hyperparameter read, before any weight is
     * loaded, naming the tensor and its type */
    mkmodel_opts o;
    mkmodel_defaults(&o);
    o.layers = 2;
    o.hidden = 64;
    o.ffn = 128;
    o.dtype = MK_Q4_0;
    ck_assert_int_eq(mkmodel_write(&o, path, &e), PD_OK);
    FILE *fp = fopen(path, "r+b");
    ck_assert_ptr_nonnull(fp);
    static uint8_t buf[1 << 16];
    size_t got = fread(buf, 1, sizeof buf, fp);
    const char *nm = "blk.1.attn_v.weight";
    uint8_t *at = memmem(buf, got, nm, strlen(nm));
    ck_assert_ptr_nonnull(at);
    size_t toff = (size_t)(at - buf) + strlen(nm) + 4 + 2 * 8; /* n_dims, ne[2], then the type */
    uint32_t ty;
    memcpy(&ty, buf + toff, 4);
    ck_assert_uint_eq(ty, GGUF_TENSOR_Q4_0);
    ty = GGUF_TENSOR_IQ4_NL;
    ck_assert_int_eq(fseek(fp, (long)toff, SEEK_SET), 0);
    ck_assert_uint_eq(fwrite(&ty, 4, 1, fp), 1);
    fclose(fp);
    pd_err_clear(&e);
    ck_assert_int_eq(model_read_hparams(path, &hp, &e), PD_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "blk.1.attn_v.weight") && strstr(e.msg, "iq4_nl"), "%s", e.msg);
    model *m = NULL;
    model_load_opts lo = {.all_layers = 1, .want_embed = 1, .want_output = 1};
    pd_err_clear(&e);
    ck_assert_int_eq(model_load(path, &lo, &m, &e), PD_ERR_UNSUPPORTED);
    ck_assert_ptr_null(m);
    unlink(path);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, model_rmsnorm_matches_hand_values);
    tcase_add_test(tc, model_rope_styles_rotate_the_documented_pairs);
    tcase_add_test(tc, model_swiglu_matches_hand_values);
    tcase_add_test(tc, model_swiglu_blocks_equal_the_scalar_formula);
    tcase_add_test(tc, model_stack_matches_reference_llama_gqa);
    tcase_add_test(tc, model_stack_matches_reference_qwen2_mha_with_bias);
    tcase_add_test(tc, model_stack_matches_reference_deepseek_moe);
    tcase_add_test(tc, model_stack_matches_reference_deepseek2_ocr);
    tcase_add_test(tc, model_stack_matches_reference_deepseek2_ocr_yarn);
    tcase_add_test(tc, model_ocr_kq_mul_matches_the_float64_formula);
    tcase_add_test(tc, model_deepseek2_ocr_refuses_bad_rope_scaling_keys);
    tcase_add_test(tc, model_moe_route_is_softmax_top_k_with_ties_to_the_lower_index);
    tcase_add_test(tc, model_moe_route_ex_bias_selects_norm_and_scale_weigh);
    tcase_add_test(tc, model_moe_rows_do_not_depend_on_their_batch);
    tcase_add_test(tc, model_deepseek_loader_names_bad_moe_keys_and_tensors);
    tcase_add_test(tc, model_stack_matches_reference_qwen2_gqa_with_bias);
    tcase_add_test(tc, model_ffn_runs_the_kind_each_layer_carries);
    tcase_add_test(tc, model_digest_is_stable_and_sees_one_weight_byte);
    tcase_add_test(tc, model_fingerprint_is_stable_and_sees_weights_and_header);
    tcase_add_test(tc, model_digest_is_pinned_including_the_unaligned_tail);
    tcase_add_test(tc, model_refuses_unsupported_architecture_and_types);
    tcase_add_test(tc, model_refuses_tensors_the_architecture_does_not_use);
    tcase_add_test(tc, model_hparams_list_the_keys_that_defaulted);
    suite_add_tcase(s, tc);
    return s;
}
