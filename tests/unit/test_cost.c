/* cost: per-part counts read from a model file's tensor directory at the
 * tensors' real types, the time rule, and the layer maps layermap_for_model
 * builds from them (f32, Q8_0 and mixed-precision versions of one shape).
 *
 * mkmodel writes f32 and f16 only, so the Q8_0 and mixed files are written
 * here with the GGUF writer: same metadata keys and tensor names, zero
 * weights (the cost reader never looks at values; model_load accepts them). */
#include "pd_test.h"

#include "cluster/cli/mkmodel.h"
#include "cluster/format/gguf.h"
#include "cluster/model/cost.h"
#include "cluster/model/model.h"
#include "cluster/runtime/plan/layermap.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- a model file with a chosen type per matrix -------------------------- */

#define SPEC_MAX_LAYERS 16

typedef struct spec {
    int qwen2;        /* Q/K/V biases */
    int tied;         /* no output.weight: the tail projects with token_embd */
    uint32_t layers, hidden, heads, kv_heads, ffn, vocab, ctx;
    uint32_t layer_type[SPEC_MAX_LAYERS]; /* ggml type of every matrix of layer L */
    uint32_t ffn_type[SPEC_MAX_LAYERS];   /* 0 = as layer_type, else the FFN matrices' type */
    uint32_t embd_type, out_type;
} spec;

static spec spec_small(uint32_t type)
{
    spec s = {.layers = 4, .hidden = 64, .heads = 4, .kv_heads = 2, .ffn = 128, .vocab = 320, .ctx = 256,
              .embd_type = type, .out_type = type};
    for (uint32_t L = 0; L < SPEC_MAX_LAYERS; L++)
        s.layer_type[L] = type;
    return s;
}

static void tmp_path(char *out, size_t cap, const char *tag)
{
    snprintf(out, cap, "/tmp/pd_test_cost_%s_XXXXXX", tag);
    int fd = mkstemp(out);
    ck_assert_int_ge(fd, 0);
    close(fd);
}

static size_t type_bytes(uint32_t type, uint64_t n)
{
    uint32_t be, bb;
    ck_assert(gguf_type_block(type, &be, &bb));
    ck_assert_uint_eq(n % be, 0);
    return (size_t)(n / be * bb);
}

/* Adds tensor name [ne0] (ne1 == 0) or [ne0 x ne1] of type, its bytes taken
 * from zero (borrowed; large enough for any tensor of the file). */
static void add_zero(gguf_writer *w, const void *zero, uint32_t type, uint64_t ne0, uint64_t ne1, const char *name)
{
    const uint64_t ne[2] = {ne0, ne1 ? ne1 : 1};
    gguf_writer_add_tensor(w, name, type, ne1 ? 2 : 1, ne, zero); /* errors stick: checked at write */
}

/* Writes s to path; every tensor's bytes are zero (one shared buffer). */
static void spec_write(const spec *s, const char *path)
{
    ck_assert_uint_le(s->layers, SPEC_MAX_LAYERS);
    uint32_t hd = s->hidden / s->heads;
    uint64_t q_out = (uint64_t)s->heads * hd, kv_out = (uint64_t)s->kv_heads * hd;
    uint64_t biggest = (uint64_t)s->hidden * (s->vocab > s->ffn ? s->vocab : s->ffn);
    void *zero = calloc(biggest, 4);
    ck_assert_ptr_nonnull(zero);
    gguf_writer *w = gguf_writer_new();
    const char *arch = s->qwen2 ? "qwen2" : "llama";
    char key[128], name[96];
    gguf_writer_set_str(w, "general.architecture", arch);
#define KEY(k) (snprintf(key, sizeof key, "%s." k, arch), key)
    gguf_writer_set_u32(w, KEY("block_count"), s->layers);
    gguf_writer_set_u32(w, KEY("embedding_length"), s->hidden);
    gguf_writer_set_u32(w, KEY("feed_forward_length"), s->ffn);
    gguf_writer_set_u32(w, KEY("attention.head_count"), s->heads);
    gguf_writer_set_u32(w, KEY("attention.head_count_kv"), s->kv_heads);
    gguf_writer_set_u32(w, KEY("context_length"), s->ctx);
#undef KEY
    char **toks = calloc(s->vocab, sizeof *toks);
    ck_assert_ptr_nonnull(toks);
    for (uint32_t i = 0; i < s->vocab; i++) {
        char t[16];
        snprintf(t, sizeof t, "t%u", i);
        toks[i] = strdup(t);
    }
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, s->vocab);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    add_zero(w, zero, s->embd_type, s->hidden, s->vocab, "token_embd.weight");
    for (uint32_t L = 0; L < s->layers; L++) {
        uint32_t t = s->layer_type[L], tf = s->ffn_type[L] ? s->ffn_type[L] : t;
        const struct { const char *name; uint32_t type; uint64_t ne0, ne1; } ts[] = {
            {"attn_norm.weight", GGUF_TENSOR_F32, s->hidden, 0},
            {"ffn_norm.weight", GGUF_TENSOR_F32, s->hidden, 0},
            {"attn_q.weight", t, s->hidden, q_out},
            {"attn_k.weight", t, s->hidden, kv_out},
            {"attn_v.weight", t, s->hidden, kv_out},
            {"attn_output.weight", t, q_out, s->hidden},
            {"ffn_gate.weight", tf, s->hidden, s->ffn},
            {"ffn_up.weight", tf, s->hidden, s->ffn},
            {"ffn_down.weight", tf, s->ffn, s->hidden},
            {"attn_q.bias", GGUF_TENSOR_F32, q_out, 0},
            {"attn_k.bias", GGUF_TENSOR_F32, kv_out, 0},
            {"attn_v.bias", GGUF_TENSOR_F32, kv_out, 0},
        };
        for (size_t i = 0; i < (s->qwen2 ? 12u : 9u); i++) {
            snprintf(name, sizeof name, "blk.%u.%s", L, ts[i].name);
            add_zero(w, zero, ts[i].type, ts[i].ne0, ts[i].ne1, name);
        }
    }
    add_zero(w, zero, GGUF_TENSOR_F32, s->hidden, 0, "output_norm.weight");
    if (!s->tied)
        add_zero(w, zero, s->out_type, s->hidden, s->vocab, "output.weight");
    pd_err e = {0};
    ck_assert_msg(gguf_writer_write(w, path, &e) == PD_OK, "%s", e.msg);
    gguf_writer_free(w);
    for (uint32_t i = 0; i < s->vocab; i++)
        free(toks[i]);
    free(toks);
    free(zero);
}

static cost_table *read_ok(const char *path)
{
    cost_table *t = NULL;
    pd_err e = {0};
    ck_assert_msg(cost_table_read(path, &t, &e) == PD_OK, "%s", e.msg);
    return t;
}

/* Matrix bytes of a layer: its weight bytes less the two f32 norm vectors
 * (and the f32 biases of a qwen2 layer). */
static uint64_t layer_matrix_bytes(const cost_part *p, const spec *s)
{
    uint64_t hd = s->hidden / s->heads;
    uint64_t vec = 2ull * s->hidden + (s->qwen2 ? (uint64_t)(s->heads + 2 * s->kv_heads) * hd : 0);
    return p->weight_bytes - vec * 4;
}

/* ---- counts -------------------------------------------------------------- */

START_TEST(cost_counts_an_f32_model_by_hand)
{
    for (int qwen2 = 0; qwen2 <= 1; qwen2++) {
        spec s = spec_small(GGUF_TENSOR_F32);
        s.qwen2 = qwen2;
        char path[64];
        tmp_path(path, sizeof path, "f32");
        spec_write(&s, path);
        cost_table *t = read_ok(path);
        ck_assert_uint_eq(cost_table_layers(t), 4);
        ck_assert_uint_eq(cost_table_ctx(t), 256);
        /* hidden 64, 4 heads x 16, 2 KV heads x 16, ffn 128 */
        uint64_t params = 64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128;
        uint64_t vecs = 2 * 64 + (qwen2 ? 64 + 2 * 32 : 0);
        for (uint32_t L = 0; L < 4; L++) {
            const cost_part *p = cost_table_layer(t, L);
            ck_assert_uint_eq(p->weight_bytes, 4 * (params + vecs));
            ck_assert_uint_eq(p->macs, params + vecs);
            ck_assert_uint_eq(p->row_bytes, 0);
            ck_assert_uint_eq(p->attn_values, 2 * 2 * 16);
            ck_assert_uint_eq(p->attn_macs, 2 * 4 * 16);
        }
        const cost_part *h = cost_table_head(t), *tl = cost_table_tail(t);
        ck_assert_uint_eq(h->weight_bytes, 0); /* only the rows looked up are read */
        ck_assert_uint_eq(h->row_bytes, 64 * 4);
        ck_assert_uint_eq(h->macs, 0);
        ck_assert_uint_eq(h->attn_values, 0);
        ck_assert_uint_eq(tl->weight_bytes, 4 * (64 * 320 + 64));
        ck_assert_uint_eq(tl->macs, 64 * 320 + 64);
        ck_assert_uint_eq(tl->row_bytes, 2 * 4 * 320);
        ck_assert_uint_eq(tl->attn_values, 0);
        cost_table_free(t);
        unlink(path);
    }
    cost_table_free(NULL);
}
END_TEST

START_TEST(cost_q8_0_layers_read_34_of_128_of_the_f32_bytes)
{
    spec s32 = spec_small(GGUF_TENSOR_F32), s8 = spec_small(GGUF_TENSOR_Q8_0);
    char p32[64], p8[64];
    tmp_path(p32, sizeof p32, "f32");
    tmp_path(p8, sizeof p8, "q8");
    spec_write(&s32, p32);
    spec_write(&s8, p8);
    cost_table *a = read_ok(p32), *b = read_ok(p8);
    for (uint32_t L = 0; L < 4; L++) {
        const cost_part *x = cost_table_layer(a, L), *y = cost_table_layer(b, L);
        /* a Q8_0 block: 32 weights in 2 + 32 bytes, against 32 x 4 in f32 */
        ck_assert_uint_eq(layer_matrix_bytes(y, &s8) * 128, layer_matrix_bytes(x, &s32) * 34);
        double ratio = (double)y->weight_bytes / (double)x->weight_bytes;
        ck_assert_msg(ratio >= 34.0 / 128 && ratio < 0.27, "layer %u ratio %.4f", L, ratio);
        ck_assert_uint_eq(y->macs, x->macs); /* the same multiply-adds */
        ck_assert_uint_eq(y->attn_values, x->attn_values);
    }
    ck_assert_uint_eq((cost_table_tail(b)->weight_bytes - 64 * 4) * 128, (cost_table_tail(a)->weight_bytes - 64 * 4) * 34);
    ck_assert_uint_eq(cost_table_head(b)->row_bytes * 128, cost_table_head(a)->row_bytes * 34);
    cost_table_free(a);
    cost_table_free(b);
    unlink(p32);
    unlink(p8);
}
END_TEST

/* mkmodel's own f16 and f32 files: matrices are half the bytes. */
START_TEST(cost_f16_model_reads_half_the_f32_bytes)
{
    char p32[64], p16[64];
    tmp_path(p32, sizeof p32, "mk32");
    tmp_path(p16, sizeof p16, "mk16");
    mkmodel_opts o;
    mkmodel_defaults(&o);
    pd_err e = {0};
    ck_assert_msg(mkmodel_write(&o, p32, &e) == PD_OK, "%s", e.msg);
    o.dtype = MK_F16;
    ck_assert_msg(mkmodel_write(&o, p16, &e) == PD_OK, "%s", e.msg);
    cost_table *a = read_ok(p32), *b = read_ok(p16);
    spec s = spec_small(GGUF_TENSOR_F32); /* mkmodel's default shape */
    ck_assert_uint_eq(cost_table_layers(a), o.layers);
    for (uint32_t L = 0; L < o.layers; L++) {
        ck_assert_uint_eq(layer_matrix_bytes(cost_table_layer(b, L), &s) * 2,
                          layer_matrix_bytes(cost_table_layer(a, L), &s));
        ck_assert_uint_eq(cost_table_layer(b, L)->macs, cost_table_layer(a, L)->macs);
    }
    ck_assert_uint_eq((cost_table_tail(b)->weight_bytes - 64 * 4) * 2, cost_table_tail(a)->weight_bytes - 64 * 4);
    cost_table_free(a);
    cost_table_free(b);
    unlink(p32);
    unlink(p16);
}
END_TEST

/* The output projection is the tail's, never a layer's; a tied model projects
 * with token_embd at token_embd's type. */
START_TEST(cost_output_projection_is_counted_on_the_tail)
{
    spec s = spec_small(GGUF_TENSOR_F32);
    s.out_type = GGUF_TENSOR_Q8_0;
    char p[64], pt[64];
    tmp_path(p, sizeof p, "out");
    tmp_path(pt, sizeof pt, "tied");
    spec_write(&s, p);
    s.tied = 1;
    s.embd_type = GGUF_TENSOR_F16;
    spec_write(&s, pt);
    cost_table *a = read_ok(p), *b = read_ok(pt);
    ck_assert_uint_eq(cost_table_tail(a)->weight_bytes, type_bytes(GGUF_TENSOR_Q8_0, 64 * 320) + 64 * 4);
    ck_assert_uint_eq(cost_table_tail(b)->weight_bytes, type_bytes(GGUF_TENSOR_F16, 64 * 320) + 64 * 4);
    ck_assert_uint_eq(cost_table_head(b)->row_bytes, 64 * 2);
    for (uint32_t L = 0; L < 4; L++)
        ck_assert_uint_eq(cost_table_layer(a, L)->weight_bytes, cost_table_layer(b, L)->weight_bytes);
    /* in time units the tail carries the projection, the head almost nothing */
    cost_rule r;
    cost_rule_default(&r);
    uint64_t u[4], head, tail;
    pd_err e = {0};
    ck_assert_int_eq(cost_table_units(b, &r, u, &head, &tail, &e), PD_OK);
    ck_assert_uint_gt(tail, head);
    ck_assert_uint_gt(head, 0);
    cost_table_free(a);
    cost_table_free(b);
    unlink(p);
    unlink(pt);
}
END_TEST

/* The reader counts exactly the matrices model_load packs: a one-layer load's
 * packed bytes equal the layer's matrix bytes (dimensions are multiples of the
 * 16-column panel, so packing adds no padding). */
START_TEST(cost_layer_bytes_match_what_model_load_packs)
{
    spec s = spec_small(GGUF_TENSOR_F32);
    s.qwen2 = 1;
    const uint32_t types[4] = {GGUF_TENSOR_F32, GGUF_TENSOR_F16, GGUF_TENSOR_BF16, GGUF_TENSOR_Q8_0};
    for (uint32_t L = 0; L < 4; L++)
        s.layer_type[L] = types[L];
    s.ffn_type[2] = GGUF_TENSOR_Q8_0;
    char p[64];
    tmp_path(p, sizeof p, "load");
    spec_write(&s, p);
    cost_table *t = read_ok(p);
    pd_err e = {0};
    for (uint32_t L = 0; L < 4; L++) {
        model *m;
        model_load_opts lo = {.first_layer = L, .n_layers = 1};
        ck_assert_msg(model_load(p, &lo, &m, &e) == PD_OK, "%s", e.msg);
        ck_assert_uint_eq(layer_matrix_bytes(cost_table_layer(t, L), &s), model_weight_bytes(m));
        model_free(m);
    }
    model *m;
    model_load_opts lo = {.n_layers = 0, .want_output = 1};
    ck_assert_msg(model_load(p, &lo, &m, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(cost_table_tail(t)->weight_bytes - 64 * 4, model_weight_bytes(m));
    model_free(m);
    cost_table_free(t);
    unlink(p);
}
END_TEST

START_TEST(cost_refuses_unsupported_types_missing_tensors_and_bad_files)
{
    spec s = spec_small(GGUF_TENSOR_F32);
    s.layer_type[2] = GGUF_TENSOR_IQ4_NL;
    char p[64];
    tmp_path(p, sizeof p, "bad");
    spec_write(&s, p);
    cost_table *t = (cost_table *)&s; /* a sentinel that must stay */
    pd_err e = {0};
    ck_assert_int_eq(cost_table_read(p, &t, &e), PD_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "blk.2.attn_q.weight") && strstr(e.msg, "iq4_nl") && strstr(e.msg, p), "%s", e.msg);
    ck_assert_ptr_eq(t, (cost_table *)&s);
    s = spec_small(GGUF_TENSOR_F32);
    s.tied = 1;
    s.embd_type = GGUF_TENSOR_IQ4_NL; /* the tied projection's type is the embedding's */
    spec_write(&s, p);
    pd_err_clear(&e);
    ck_assert_int_eq(cost_table_read(p, &t, &e), PD_ERR_UNSUPPORTED);
    ck_assert_msg(strstr(e.msg, "token_embd.weight"), "%s", e.msg);
    pd_err_clear(&e);
    ck_assert_int_ne(cost_table_read("/nonexistent/m.gguf", &t, &e), PD_OK);
    ck_assert_msg(strstr(e.msg, "/nonexistent/m.gguf"), "%s", e.msg);
    /* hyperparameters without the layer's tensors */
    pd_err_clear(&e);
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.block_count", 1);
    gguf_writer_set_u32(w, "llama.embedding_length", 64);
    gguf_writer_set_u32(w, "llama.feed_forward_length", 128);
    gguf_writer_set_u32(w, "llama.attention.head_count", 4);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const[]){"a", "b", "c"}, 3);
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    ck_assert_int_eq(gguf_writer_write(w, p, &e), PD_OK);
    gguf_writer_free(w);
    ck_assert_int_eq(cost_table_read(p, &t, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "blk.0.attn_norm.weight is missing"), "%s", e.msg);
    ck_assert_ptr_eq(t, (cost_table *)&s);
    unlink(p);
}
END_TEST

/* ---- the time rule ------------------------------------------------------- */

START_TEST(cost_rule_takes_the_slower_of_memory_and_arithmetic)
{
    cost_rule r;
    cost_rule_default(&r);
    ck_assert_double_eq(r.bandwidth, 19.6e9);
    ck_assert_double_eq(r.peak, 82e9);
    ck_assert_uint_eq(r.rows, 4);
    ck_assert_uint_eq(r.depth, 512);
    ck_assert_double_eq(r.kv_value_bytes, 4.0);
    r = (cost_rule){.bandwidth = 100, .peak = 1000, .rows = 2, .depth = 0, .kv_value_bytes = 4};
    /* memory-bound: 1000 bytes / 100 = 10 s against 2 x 2 x 100 / 1000 = 0.4 s */
    cost_part p = {.weight_bytes = 1000, .macs = 100};
    ck_assert_double_eq_tol(cost_part_seconds(&p, &r, 0), 10.0, 1e-12);
    /* compute-bound: 2 x 2 x 10000 / 1000 = 40 s */
    p.macs = 10000;
    ck_assert_double_eq_tol(cost_part_seconds(&p, &r, 0), 40.0, 1e-12);
    /* per-row bytes and attention scale with rows and depth:
     * bytes = 0 + 2 x (10 + 3 x 5 x 4) = 140, flops = 2 x 2 x (0 + 3 x 7) = 84 */
    p = (cost_part){.row_bytes = 10, .attn_values = 5, .attn_macs = 7};
    ck_assert_double_eq_tol(cost_part_seconds(&p, &r, 3), 1.4, 1e-12);
    r.peak = 10;
    ck_assert_double_eq_tol(cost_part_seconds(&p, &r, 3), 8.4, 1e-12);

    static const struct { cost_rule r; const char *needle; } bad[] = {
        {{.bandwidth = 0, .peak = 1, .rows = 1, .kv_value_bytes = 4}, "bandwidth"},
        {{.bandwidth = NAN, .peak = 1, .rows = 1, .kv_value_bytes = 4}, "bandwidth"},
        {{.bandwidth = 1, .peak = INFINITY, .rows = 1, .kv_value_bytes = 4}, "peak"},
        {{.bandwidth = 1, .peak = 1, .rows = 0, .kv_value_bytes = 4}, "rows"},
        {{.bandwidth = 1, .peak = 1, .rows = 1, .kv_value_bytes = -1}, "kv_value_bytes"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pd_err e = {0};
        ck_assert_int_eq(cost_rule_validate(&bad[i].r, &e), PD_ERR_ARG);
        ck_assert_msg(strstr(e.msg, bad[i].needle), "%s", e.msg);
    }
}
END_TEST

/* Units are picoseconds of the rule's prediction; depth is clipped to the
 * model's context; an invalid rule leaves the outputs alone. */
START_TEST(cost_units_are_picoseconds_with_depth_clipped_to_context)
{
    spec s = spec_small(GGUF_TENSOR_F32);
    s.ctx = 100;
    char p[64];
    tmp_path(p, sizeof p, "units");
    spec_write(&s, p);
    cost_table *t = read_ok(p);
    cost_rule r;
    cost_rule_default(&r);
    r.depth = 100000;
    uint64_t u[4], head, tail;
    pd_err e = {0};
    ck_assert_int_eq(cost_table_units(t, &r, u, &head, &tail, &e), PD_OK);
    for (uint32_t L = 0; L < 4; L++)
        ck_assert_uint_eq(u[L], (uint64_t)llround(cost_part_seconds(cost_table_layer(t, L), &r, 100) * 1e12));
    ck_assert_uint_eq(tail, (uint64_t)llround(cost_part_seconds(cost_table_tail(t), &r, 100) * 1e12));
    ck_assert_uint_eq(head, (uint64_t)llround(cost_part_seconds(cost_table_head(t), &r, 100) * 1e12));
    uint64_t keep[4] = {1, 2, 3, 4}, kh = 5, kt = 6;
    r.rows = 0;
    ck_assert_int_eq(cost_table_units(t, &r, keep, &kh, &kt, &e), PD_ERR_ARG);
    ck_assert_uint_eq(keep[3], 4);
    ck_assert_uint_eq(kh, 5);
    ck_assert_uint_eq(kt, 6);
    cost_rule_default(&r);
    r.bandwidth = 1e-9; /* every part takes years */
    pd_err_clear(&e);
    ck_assert_int_eq(cost_table_units(t, &r, keep, &kh, &kt, &e), PD_ERR_RANGE);
    ck_assert_uint_eq(keep[0], 1);
    cost_table_free(t);
    unlink(p);
}
END_TEST

/* ---- layer maps from the model file -------------------------------------- */

/* The example shape: 12 layers, hidden 128, 4 heads x 32 (2 KV heads), ffn
 * 384, vocab 4096 (the f32 output projection weighs 2.7 layers). */
static spec spec_example(uint32_t type)
{
    spec s = {.layers = 12, .hidden = 128, .heads = 4, .kv_heads = 2, .ffn = 384, .vocab = 4096, .ctx = 2048,
              .embd_type = type, .out_type = type};
    for (uint32_t L = 0; L < SPEC_MAX_LAYERS; L++)
        s.layer_type[L] = type;
    return s;
}

/* Every map of n layers over k stages, brute force: the least bottleneck. */
static uint64_t brute_bottleneck(const uint64_t *c, uint32_t n, uint32_t k, uint64_t head, uint64_t tail)
{
    uint32_t cut[16];
    uint64_t best = UINT64_MAX;
    for (uint32_t s = 0; s < k; s++)
        cut[s] = s; /* first layer of stage s */
    for (;;) {
        uint64_t worst = 0;
        for (uint32_t s = 0; s < k; s++) {
            uint32_t end = s + 1 < k ? cut[s + 1] : n;
            uint64_t sum = (s == 0 ? head : 0) + (s == k - 1 ? tail : 0);
            for (uint32_t i = cut[s]; i < end; i++)
                sum += c[i];
            if (sum > worst)
                worst = sum;
        }
        if (worst < best)
            best = worst;
        /* next composition: advance the last cut that can move */
        int32_t s = (int32_t)k - 1;
        while (s >= 1 && cut[s] == n - (k - (uint32_t)s))
            s--;
        if (s < 1)
            break;
        cut[s]++;
        for (uint32_t r = (uint32_t)s + 1; r < k; r++)
            cut[r] = cut[r - 1] + 1;
    }
    return best;
}

/* The worst stage of m under costs c. */
static uint64_t bottleneck(const layermap *m, const uint64_t *c, uint64_t head, uint64_t tail)
{
    uint64_t worst = 0;
    for (uint32_t s = 0; s < m->n_stages; s++) {
        uint64_t sc = layermap_stage_cost(m, s, c, head, tail);
        worst = sc > worst ? sc : worst;
    }
    return worst;
}

/* Builds the map of one file at k stages with layermap_for_model, checks it
 * is the optimum of the same predicted times (brute force), and describes it
 * beside the map the type-blind rule gives (every layer the same, the tail
 * hidden x vocab weights), both timed by the cost model. Returns the
 * type-blind map's bottleneck over the new one's. */
static double map_of(const char *path, const spec *sp, uint32_t k, char *desc, size_t cap, layermap *out)
{
    pd_err e = {0};
    ck_assert_msg(layermap_for_model(path, k, NULL, NULL, out, &e) == PD_OK, "%s", e.msg);
    cost_table *t = read_ok(path);
    cost_rule r;
    cost_rule_default(&r);
    uint32_t n = cost_table_layers(t);
    uint64_t c[SPEC_MAX_LAYERS], head, tail;
    ck_assert_int_eq(cost_table_units(t, &r, c, &head, &tail, &e), PD_OK);
    uint64_t best = bottleneck(out, c, head, tail);
    ck_assert_uint_eq(best, brute_bottleneck(c, n, k, head, tail));
    uint64_t hd = sp->hidden / sp->heads;
    uint64_t blind_layer = 2ull * sp->hidden * sp->hidden + 2ull * sp->hidden * sp->kv_heads * hd +
                           3ull * sp->hidden * sp->ffn;
    layermap blind;
    ck_assert_int_eq(layermap_balance(k, n, blind_layer, (uint64_t)sp->hidden * sp->vocab, &blind, &e), PD_OK);
    uint64_t blind_worst = bottleneck(&blind, c, head, tail);
    ck_assert_uint_ge(blind_worst, best);
    char m[128], mb[128];
    layermap_format(out, m, sizeof m);
    layermap_format(&blind, mb, sizeof mb);
    int w = snprintf(desc, cap, "%-22s stage us:", m);
    for (uint32_t s = 0; s < k && w > 0 && (size_t)w < cap; s++)
        w += snprintf(desc + w, cap - (size_t)w, " %.1f", (double)layermap_stage_cost(out, s, c, head, tail) / 1e6);
    if (w > 0 && (size_t)w < cap)
        snprintf(desc + w, cap - (size_t)w, " | type-blind %s worst %.1f", mb, (double)blind_worst / 1e6);
    cost_table_free(t);
    return (double)blind_worst / (double)best;
}

START_TEST(cost_layer_maps_follow_the_tensor_types)
{
    static const struct { const char *name; uint32_t type, mixed; } models[] = {
        {"f32", GGUF_TENSOR_F32, 0},
        {"q8_0", GGUF_TENSOR_Q8_0, 0},
        /* llama.cpp-style mixture: Q8_0, but layers 0-2 kept in f32 */
        {"q8_0, layers 0-2 f32", GGUF_TENSOR_Q8_0, 1},
        /* FFN of the last 6 layers in Q8_0, the rest f32 */
        {"f32, ffn of 6-11 q8_0", GGUF_TENSOR_F32, 2},
    };
    layermap maps[4][4];
    double gain[4][4];
    char path[64];
    for (size_t i = 0; i < 4; i++) {
        spec s = spec_example(models[i].type);
        if (models[i].mixed == 1)
            for (uint32_t L = 0; L < 3; L++)
                s.layer_type[L] = GGUF_TENSOR_F32;
        if (models[i].mixed == 2)
            for (uint32_t L = 6; L < 12; L++)
                s.ffn_type[L] = GGUF_TENSOR_Q8_0;
        tmp_path(path, sizeof path, "example");
        spec_write(&s, path);
        for (uint32_t k = 1; k <= 4; k++) {
            char desc[256];
            gain[i][k - 1] = map_of(path, &s, k, desc, sizeof desc, &maps[i][k - 1]);
            printf("cost: %-22s %u ranks: %s\n", models[i].name, k, desc);
        }
        unlink(path);
    }
    /* f32: the tail stage gives up layers for the projection */
    for (uint32_t k = 2; k <= 4; k++)
        ck_assert_uint_lt(maps[0][k - 1].count[k - 1], maps[0][k - 1].count[0]);
    /* mixtures: the stage of the costly f32 layers holds fewer layers than
     * the same stage of the all-Q8_0 file, and the type-blind map is slower */
    for (uint32_t k = 3; k <= 4; k++)
        ck_assert_uint_lt(maps[2][k - 1].count[0], maps[1][k - 1].count[0]);
    ck_assert_double_gt(gain[2][3], 1.05);
    ck_assert_double_gt(gain[3][3], 1.0);
}
END_TEST

START_TEST(cost_layer_map_refuses_more_ranks_than_layers)
{
    spec s = spec_small(GGUF_TENSOR_Q8_0);
    char p[64];
    tmp_path(p, sizeof p, "ranks");
    spec_write(&s, p);
    layermap m;
    memset(&m, 0x5a, sizeof m);
    layermap ref = m;
    pd_err e = {0};
    ck_assert_int_eq(layermap_for_model(p, 5, NULL, NULL, &m, &e), PD_ERR_ARG);
    ck_assert_msg(strstr(e.msg, "fewer than"), "%s", e.msg);
    ck_assert_int_eq(memcmp(&m, &ref, sizeof m), 0);
    pd_err_clear(&e);
    ck_assert_int_ne(layermap_for_model("/nonexistent/m.gguf", 1, NULL, NULL, &m, &e), PD_OK);
    ck_assert_msg(strstr(e.msg, "/nonexistent/m.gguf"), "%s", e.msg);
    cost_rule r;
    cost_rule_default(&r);
    r.peak = 0;
    pd_err_clear(&e);
    ck_assert_int_eq(layermap_for_model(p, 2, &r, NULL, &m, &e), PD_ERR_ARG);
    ck_assert_msg(strstr(e.msg, "peak"), "%s", e.msg);
    ck_assert_int_eq(memcmp(&m, &ref, sizeof m), 0);
    unlink(p);
}
END_TEST

/* ---- a run's mix of prefill and decode ----------------------------------- */

/* An average page's units are its micro-batches' step times: a mix of one
 * decode micro-batch (no prefill) is one step at decode_rows rows and depth
 * new_tokens / 2; one prefill micro-batch (no decode) is one step at
 * prefill_rows_per_batch rows and depth prefill_rows / 2 on every layer and
 * the head, and one step of one row on the tail (logits of the page's last
 * row only). Bad mixes are refused by field, outputs untouched. */
START_TEST(cost_mix_units_weigh_prefill_and_decode_micro_batches)
{
    spec s = spec_small(GGUF_TENSOR_F32);
    char p[64];
    tmp_path(p, sizeof p, "mix");
    spec_write(&s, p);
    cost_table *t = read_ok(p);
    cost_rule r;
    cost_rule_default(&r);
    uint64_t u[4], head, tail;
    pd_err e = {0};

    cost_mix dec = {.prefill_rows = 0, .new_tokens = 6, .prefill_rows_per_batch = 64, .decode_rows = 6,
                    .decode_streams = 6};
    ck_assert_int_eq(cost_table_mix_units(t, &r, &dec, u, &head, &tail, &e), PD_OK);
    cost_rule at = r;
    at.rows = 6;
    for (uint32_t L = 0; L < 4; L++)
        ck_assert_uint_eq(u[L], (uint64_t)llround(cost_part_seconds(cost_table_layer(t, L), &at, 3) * 1e12));
    ck_assert_uint_eq(tail, (uint64_t)llround(cost_part_seconds(cost_table_tail(t), &at, 3) * 1e12));

    /* twice the tokens, drafts riding along: twice the micro-batches of 12 rows */
    cost_mix dec2 = dec;
    dec2.new_tokens = 12;
    dec2.decode_rows = 12;
    ck_assert_int_eq(cost_table_mix_units(t, &r, &dec2, u, &head, &tail, &e), PD_OK);
    at.rows = 12;
    ck_assert_uint_eq(u[1], (uint64_t)llround(2.0 * cost_part_seconds(cost_table_layer(t, 1), &at, 6) * 1e12));

    cost_mix pre = {.prefill_rows = 64, .new_tokens = 0, .prefill_rows_per_batch = 64, .decode_rows = 1,
                    .decode_streams = 1};
    ck_assert_int_eq(cost_table_mix_units(t, &r, &pre, u, &head, &tail, &e), PD_OK);
    at.rows = 64;
    ck_assert_uint_eq(u[0], (uint64_t)llround(cost_part_seconds(cost_table_layer(t, 0), &at, 32) * 1e12));
    ck_assert_uint_eq(head, (uint64_t)llround(cost_part_seconds(cost_table_head(t), &at, 32) * 1e12));
    at.rows = 1;
    ck_assert_uint_eq(tail, (uint64_t)llround(cost_part_seconds(cost_table_tail(t), &at, 32) * 1e12));

    /* depth clipped to the context (256) */
    cost_mix deep = dec;
    deep.prefill_rows = 1000;
    deep.prefill_rows_per_batch = 1000;
    ck_assert_int_eq(cost_table_mix_units(t, &r, &deep, u, &head, &tail, &e), PD_OK);
    cost_rule d1 = r, d6 = r;
    d1.rows = 1000;
    d6.rows = 6;
    ck_assert_uint_eq(u[2], (uint64_t)llround((cost_part_seconds(cost_table_layer(t, 2), &d1, 256) +
                                               cost_part_seconds(cost_table_layer(t, 2), &d6, 256)) * 1e12));

    static const struct { cost_mix m; const char *field; } bad[] = {
        {{.prefill_rows = -1, .new_tokens = 1, .prefill_rows_per_batch = 1, .decode_rows = 1, .decode_streams = 1},
         "prefill_rows"},
        {{.prefill_rows = 1, .new_tokens = NAN, .prefill_rows_per_batch = 1, .decode_rows = 1, .decode_streams = 1},
         "new_tokens"},
        {{.prefill_rows = 0, .new_tokens = 0, .prefill_rows_per_batch = 1, .decode_rows = 1, .decode_streams = 1},
         "no rows"},
        {{.prefill_rows = 1, .new_tokens = 1, .prefill_rows_per_batch = 0, .decode_rows = 1, .decode_streams = 1},
         "prefill_rows_per_batch"},
        {{.prefill_rows = 1, .new_tokens = 1, .prefill_rows_per_batch = 1, .decode_rows = 0, .decode_streams = 1},
         "decode_rows"},
        {{.prefill_rows = 1, .new_tokens = 1, .prefill_rows_per_batch = 1, .decode_rows = 2, .decode_streams = 3},
         "decode_streams 3"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        uint64_t keep[4] = {1, 2, 3, 4}, kh = 5, kt = 6;
        pd_err_clear(&e);
        ck_assert_int_eq(cost_table_mix_units(t, &r, &bad[i].m, keep, &kh, &kt, &e), PD_ERR_ARG);
        ck_assert_msg(strstr(e.msg, bad[i].field), "case %zu: %s", i, e.msg);
        ck_assert_uint_eq(keep[0], 1);
        ck_assert_uint_eq(kh, 5);
        ck_assert_uint_eq(kt, 6);
    }
    cost_rule slow = r;
    slow.bandwidth = 1e-9;
    pd_err_clear(&e);
    ck_assert_int_eq(cost_table_mix_units(t, &slow, &dec, u, &head, &tail, &e), PD_ERR_RANGE);
    cost_table_free(t);
    unlink(p);
}
END_TEST

/* The default map follows the run's mix: where the output projection is
 * costly in decode (the f32 example: 2.7 layers at 4 rows), a decode-heavy
 * mix gives the last stage fewer layers; a prefill-heavy one (logits for one
 * row a page) splits the layers evenly. Each is the optimum of its own
 * units (brute force). */
START_TEST(cost_layer_map_follows_the_mix_of_prefill_and_decode)
{
    spec s = spec_example(GGUF_TENSOR_F32);
    char p[64];
    tmp_path(p, sizeof p, "mixmap");
    spec_write(&s, p);
    cost_table *t = read_ok(p);
    cost_rule r;
    cost_rule_default(&r);
    cost_mix decode_heavy = {.prefill_rows = 16, .new_tokens = 512, .prefill_rows_per_batch = 68,
                             .decode_rows = 4, .decode_streams = 4};
    cost_mix prefill_heavy = {.prefill_rows = 1024, .new_tokens = 8, .prefill_rows_per_batch = 68,
                              .decode_rows = 4, .decode_streams = 4};
    layermap md, mp;
    pd_err e = {0};
    ck_assert_msg(layermap_for_model(p, 2, NULL, &decode_heavy, &md, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(layermap_for_model(p, 2, NULL, &prefill_heavy, &mp, &e) == PD_OK, "%s", e.msg);
    char a[64], b[64];
    layermap_format(&md, a, sizeof a);
    layermap_format(&mp, b, sizeof b);
    printf("cost: f32 example, 2 ranks: decode-heavy mix %s, prefill-heavy mix %s\n", a, b);
    ck_assert_uint_lt(md.count[1], md.count[0]);
    ck_assert_uint_eq(mp.count[0], 6);
    ck_assert_uint_eq(mp.count[1], 6);
    const cost_mix *mixes[2] = {&decode_heavy, &prefill_heavy};
    const layermap *maps[2] = {&md, &mp};
    for (int i = 0; i < 2; i++)
        for (uint32_t k = 2; k <= 4; k++) {
            uint64_t c[SPEC_MAX_LAYERS], head, tail;
            ck_assert_int_eq(cost_table_mix_units(t, &r, mixes[i], c, &head, &tail, &e), PD_OK);
            layermap m;
            ck_assert_int_eq(layermap_for_model(p, k, NULL, mixes[i], &m, &e), PD_OK);
            ck_assert_uint_eq(bottleneck(&m, c, head, tail), brute_bottleneck(c, 12, k, head, tail));
            if (k == 2)
                ck_assert_int_eq(memcmp(&m, maps[i], sizeof m), 0);
        }
    /* a bad mix is refused through the map too */
    cost_mix none = decode_heavy;
    none.new_tokens = none.prefill_rows = 0;
    layermap keep = md;
    ck_assert_int_eq(layermap_for_model(p, 2, NULL, &none, &md, &e), PD_ERR_ARG);
    ck_assert_int_eq(memcmp(&keep, &md, sizeof md), 0);
    cost_table_free(t);
    unlink(p);
}
END_TEST

/* A deepseek MoE layer counts its active parameters per row (router, top-k
 * experts, shared experts) and every expert's bytes; the dense leading layer
 * counts as a llama layer. */
START_TEST(cost_moe_layers_count_active_parameters_and_all_expert_bytes)
{
    char path[] = "/tmp/pd_test_cost_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    mkmodel_opts o;
    mkmodel_defaults(&o);
    o.arch = MODEL_ARCH_DEEPSEEK;
    o.layers = 2;
    o.hidden = 64;
    o.heads = 4;
    o.kv_heads = 4;
    o.ffn = 96;
    o.vocab = 320;
    o.dense_lead = 1;
    o.experts = 16;
    o.experts_used = 2;
    o.expert_ffn = 32;
    o.shared = 2;
    o.expert_scale = 1.0f;
    pd_err e = {0};
    ck_assert_msg(mkmodel_write(&o, path, &e) == PD_OK, "%s", e.msg);
    cost_table *t;
    ck_assert_msg(cost_table_read(path, &t, &e) == PD_OK, "%s", e.msg);
    const uint64_t H = 64, attn = 4 * H * H, norms = 2 * H;
    const cost_part *d = cost_table_layer(t, 0), *m = cost_table_layer(t, 1);
    ck_assert_uint_eq(d->macs, attn + 3 * H * 96 + norms);
    ck_assert_uint_eq(d->weight_bytes, 4 * (attn + 3 * H * 96) + 4 * norms);
    const uint64_t router = H * 16, routed_active = 2 * 3 * H * 32, shared = 3 * H * 64;
    ck_assert_uint_eq(m->macs, attn + router + routed_active + shared + norms);
    ck_assert_uint_eq(m->weight_bytes, 4 * (attn + router + 16 * 3 * H * 32 + shared) + 4 * norms);
    ck_assert_uint_eq(m->attn_values, d->attn_values);
    /* and what model_load packs for the MoE layer is those bytes (f32, every
     * width a multiple of the 16-column panel: no padding) */
    model *mm;
    model_load_opts lo = {.first_layer = 1, .n_layers = 1};
    ck_assert_msg(model_load(path, &lo, &mm, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(model_weight_bytes(mm) + 4 * norms, m->weight_bytes);
    model_free(mm);
    cost_table_free(t);
    unlink(path);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("cost");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, cost_counts_an_f32_model_by_hand);
    tcase_add_test(tc, cost_q8_0_layers_read_34_of_128_of_the_f32_bytes);
    tcase_add_test(tc, cost_f16_model_reads_half_the_f32_bytes);
    tcase_add_test(tc, cost_output_projection_is_counted_on_the_tail);
    tcase_add_test(tc, cost_layer_bytes_match_what_model_load_packs);
    tcase_add_test(tc, cost_refuses_unsupported_types_missing_tensors_and_bad_files);
    tcase_add_test(tc, cost_rule_takes_the_slower_of_memory_and_arithmetic);
    tcase_add_test(tc, cost_units_are_picoseconds_with_depth_clipped_to_context);
    tcase_add_test(tc, cost_layer_maps_follow_the_tensor_types);
    tcase_add_test(tc, cost_layer_map_refuses_more_ranks_than_layers);
    tcase_add_test(tc, cost_moe_layers_count_active_parameters_and_all_expert_bytes);
    tcase_add_test(tc, cost_mix_units_weigh_prefill_and_decode_micro_batches);
    tcase_add_test(tc, cost_layer_map_follows_the_mix_of_prefill_and_decode);
    suite_add_tcase(s, tc);
    return s;
}
