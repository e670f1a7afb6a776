/* Tests for cluster/cli/mkmmproj.h: the random DeepSeek-OCR mmproj parses with
 * pipedec's GGUF reader and holds exactly the keys and tensors (names,
 * shapes, types) llama.cpp's clip loader and deepseekocr graph use; the same
 * seed gives the same bytes; bad options are refused by flag name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fp16.h"
#include "cluster/cli/mkmmproj.h"
#include "cluster/format/gguf.h"
#include "pd_test.h"

static gguf_file *open_mem(const mkmmproj_opts *o, void **buf)
{
    size_t len = 0;
    pd_err e = {0};
    ck_assert_int_eq(mkmmproj_to_mem(o, buf, &len, &e), PD_OK);
    gguf_file *f = NULL;
    ck_assert_msg(gguf_open_mem(*buf, len, &f, &e) == PD_OK, "%s", e.msg);
    gguf_check(f);
    return f;
}

static uint32_t u32(const gguf_file *f, const char *key)
{
    uint32_t v = 0;
    pd_err e = {0};
    ck_assert_msg(gguf_get_u32(f, key, &v, &e) == PD_OK, "%s", e.msg);
    /* clip reads these with gguf_get_val_u32, which wants exactly UINT32 */
    ck_assert_int_eq(gguf_kv_at(f, (uint64_t)gguf_find_key(f, key))->type, GGUF_VTYPE_UINT32);
    return v;
}

static const char *str(const gguf_file *f, const char *key)
{
    const char *s = NULL;
    pd_err e = {0};
    ck_assert_msg(gguf_get_str(f, key, &s, NULL, &e) == PD_OK, "%s", e.msg);
    return s;
}

START_TEST(mkmmproj_writes_the_keys_clip_reads)
{
    mkmmproj_opts o;
    mkmmproj_defaults(&o);
    o.hidden = 96;
    void *buf = NULL;
    gguf_file *f = open_mem(&o, &buf);
    ck_assert_str_eq(str(f, "general.architecture"), "clip");
    ck_assert_str_eq(str(f, "clip.projector_type"), "deepseekocr");
    bool b = false;
    pd_err e = {0};
    ck_assert_int_eq(gguf_get_bool(f, "clip.has_vision_encoder", &b, &e), PD_OK);
    ck_assert(b);
    ck_assert_int_eq(gguf_get_bool(f, "clip.use_gelu", &b, &e), PD_OK);
    ck_assert(b);
    ck_assert_uint_eq(u32(f, "general.file_type"), 0);
    ck_assert_uint_eq(u32(f, "clip.vision.projection_dim"), 96);
    ck_assert_uint_eq(u32(f, "clip.vision.image_size"), 1024);
    ck_assert_uint_eq(u32(f, "clip.vision.patch_size"), 16);
    ck_assert_uint_eq(u32(f, "clip.vision.embedding_length"), o.clip_width);
    ck_assert_uint_eq(u32(f, "clip.vision.feed_forward_length"), 4 * o.clip_width);
    ck_assert_uint_eq(u32(f, "clip.vision.block_count"), o.clip_layers);
    ck_assert_uint_eq(u32(f, "clip.vision.attention.head_count"), o.clip_heads);
    ck_assert_uint_eq(u32(f, "clip.vision.window_size"), 14);
    ck_assert_uint_eq(u32(f, "clip.vision.preproc_min_tiles"), 2);
    ck_assert_uint_eq(u32(f, "clip.vision.preproc_max_tiles"), 9);
    ck_assert_uint_eq(u32(f, "clip.vision.sam.block_count"), o.sam_layers);
    ck_assert_uint_eq(u32(f, "clip.vision.sam.embedding_length"), o.sam_width);
    ck_assert_uint_eq(u32(f, "clip.vision.sam.head_count"), o.sam_heads);
    float eps = 0.0f;
    ck_assert_int_eq(gguf_get_f32(f, "clip.vision.attention.layer_norm_epsilon", &eps, &e), PD_OK);
    ck_assert_float_eq(eps, 1e-6f);
    const char *arrs[] = {"clip.vision.image_mean", "clip.vision.image_std"};
    for (int i = 0; i < 2; i++) {
        gguf_vtype et;
        uint64_t n = 0;
        const void *d = NULL;
        ck_assert_int_eq(gguf_get_arr(f, arrs[i], &et, &n, &d, &e), PD_OK);
        ck_assert_int_eq(et, GGUF_VTYPE_FLOAT32);
        ck_assert_uint_eq(n, 3);
        for (uint64_t k = 0; k < 3; k++)
            ck_assert_float_eq(gguf_arr_f32_at(d, k), 0.5f);
    }
    ck_assert_uint_eq(gguf_kv_count(f), 22);
    gguf_close(f);
    free(buf);
}
END_TEST

/* One expected tensor: name, shape (ne[0] first), and whether it is a matrix
 * (stored as --dtype) or kept F32. */
typedef struct want {
    char name[GGUF_NAME_MAX];
    uint32_t n_dims;
    uint64_t ne[4];
    int mat;
} want;

static size_t add(want *w, size_t n, int mat, const char *name, uint32_t nd, uint64_t a, uint64_t b, uint64_t c,
                  uint64_t d)
{
    snprintf(w[n].name, sizeof w[n].name, "%s", name);
    w[n].n_dims = nd;
    w[n].ne[0] = a;
    w[n].ne[1] = b;
    w[n].ne[2] = c;
    w[n].ne[3] = d;
    w[n].mat = mat;
    return n + 1;
}

/* The list models/deepseekocr.cpp and clip.cpp's loader need, written out
 * independently of mkmmproj.c. */
static size_t expected(const mkmmproj_opts *o, want *w)
{
    const uint64_t S = o->sam_width, hd = S / o->sam_heads, D = o->clip_width, N = D / 4, H = o->hidden;
    char nm[GGUF_NAME_MAX];
    size_t n = 0;
    n = add(w, n, 1, "v.sam.patch_embd.weight", 4, 16, 16, 3, S);
    n = add(w, n, 0, "v.sam.patch_embd.bias", 1, S, 1, 1, 1);
    n = add(w, n, 0, "v.sam.pos_embd.weight", 4, S, 64, 64, 1);
    for (uint32_t L = 0; L < o->sam_layers; L++) {
        const uint64_t span = (L == 2 || L == 5 || L == 8 || L == 11) ? 64 : o->window;
#define A(mat, s, nd, a, b) (snprintf(nm, sizeof nm, "v.sam.blk.%u." s, L), n = add(w, n, mat, nm, nd, a, b, 1, 1))
        A(0, "pre_ln.weight", 1, S, 1);
        A(0, "pre_ln.bias", 1, S, 1);
        A(1, "attn.qkv.weight", 2, S, 3 * S);
        A(0, "attn.qkv.bias", 1, 3 * S, 1);
        A(1, "attn.out.weight", 2, S, S);
        A(0, "attn.out.bias", 1, S, 1);
        A(0, "attn.pos_h.weight", 2, hd, 2 * span - 1);
        A(0, "attn.pos_w.weight", 2, hd, 2 * span - 1);
        A(0, "post_ln.weight", 1, S, 1);
        A(0, "post_ln.bias", 1, S, 1);
        A(1, "mlp.lin1.weight", 2, S, 4 * S);
        A(0, "mlp.lin1.bias", 1, 4 * S, 1);
        A(1, "mlp.lin2.weight", 2, 4 * S, S);
        A(0, "mlp.lin2.bias", 1, S, 1);
#undef A
    }
    n = add(w, n, 0, "v.sam.neck.0.weight", 4, 1, 1, S, N);
    n = add(w, n, 0, "v.sam.neck.1.weight", 1, N, 1, 1, 1);
    n = add(w, n, 0, "v.sam.neck.1.bias", 1, N, 1, 1, 1);
    n = add(w, n, 0, "v.sam.neck.2.weight", 4, 3, 3, N, N);
    n = add(w, n, 0, "v.sam.neck.3.weight", 1, N, 1, 1, 1);
    n = add(w, n, 0, "v.sam.neck.3.bias", 1, N, 1, 1, 1);
    n = add(w, n, 0, "v.sam.net_2.weight", 4, 3, 3, N, 2 * N);
    n = add(w, n, 0, "v.sam.net_3.weight", 4, 3, 3, 2 * N, D);
    n = add(w, n, 0, "v.class_embd", 1, D, 1, 1, 1);
    n = add(w, n, 0, "v.position_embd.weight", 2, D, 257, 1, 1);
    n = add(w, n, 0, "v.pre_ln.weight", 1, D, 1, 1, 1);
    n = add(w, n, 0, "v.pre_ln.bias", 1, D, 1, 1, 1);
    for (uint32_t L = 0; L < o->clip_layers; L++) {
#define A(mat, s, nd, a, b) (snprintf(nm, sizeof nm, "v.blk.%u." s, L), n = add(w, n, mat, nm, nd, a, b, 1, 1))
        A(0, "ln1.weight", 1, D, 1);
        A(0, "ln1.bias", 1, D, 1);
        A(1, "attn_qkv.weight", 2, D, 3 * D);
        A(0, "attn_qkv.bias", 1, 3 * D, 1);
        A(1, "attn_out.weight", 2, D, D);
        A(0, "attn_out.bias", 1, D, 1);
        A(0, "ln2.weight", 1, D, 1);
        A(0, "ln2.bias", 1, D, 1);
        A(1, "ffn_up.weight", 2, D, 4 * D);
        A(0, "ffn_up.bias", 1, 4 * D, 1);
        A(1, "ffn_down.weight", 2, 4 * D, D);
        A(0, "ffn_down.bias", 1, D, 1);
#undef A
    }
    n = add(w, n, 1, "mm.model.fc.weight", 2, 2 * D, H, 1, 1);
    n = add(w, n, 0, "mm.model.fc.bias", 1, H, 1, 1, 1);
    n = add(w, n, 0, "v.image_newline", 1, H, 1, 1, 1);
    n = add(w, n, 0, "v.view_seperator", 2, H, 1, 1, 1);
    return n;
}

static void check_tensors(const mkmmproj_opts *o)
{
    want *w = calloc(1024, sizeof *w);
    const size_t n = expected(o, w);
    void *buf = NULL;
    gguf_file *f = open_mem(o, &buf);
    ck_assert_uint_eq(gguf_tensor_count(f), n);
    for (size_t i = 0; i < n; i++) {
        const gguf_tensor *t = gguf_tensor_find(f, w[i].name);
        ck_assert_msg(t != NULL, "tensor %s is missing", w[i].name);
        ck_assert_msg(t->n_dims == w[i].n_dims, "%s: n_dims %u, want %u", w[i].name, t->n_dims, w[i].n_dims);
        for (int d = 0; d < 4; d++)
            ck_assert_msg(t->ne[d] == w[i].ne[d], "%s: ne[%d] %llu, want %llu", w[i].name, d,
                          (unsigned long long)t->ne[d], (unsigned long long)w[i].ne[d]);
        const uint32_t type = w[i].mat && o->dtype == MK_F16 ? GGUF_TENSOR_F16 : GGUF_TENSOR_F32;
        ck_assert_msg(t->type == type, "%s: type %s", w[i].name, gguf_type_name(t->type));
        /* every value finite; no tensor all zeros */
        const uint64_t cnt = t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3];
        double sum_abs = 0.0;
        for (uint64_t k = 0; k < cnt; k++) {
            float v;
            if (type == GGUF_TENSOR_F16) {
                uint16_t h;
                memcpy(&h, (const uint8_t *)t->data + 2 * k, 2);
                v = pd_f16_to_f32(h);
            } else
                memcpy(&v, (const uint8_t *)t->data + 4 * k, 4);
            ck_assert_msg(isfinite(v) && fabsf(v) < 4.0f, "%s[%llu] = %g", w[i].name, (unsigned long long)k,
                          (double)v);
            sum_abs += fabs(v);
        }
        ck_assert_msg(sum_abs > 0.0, "%s is all zeros", w[i].name);
    }
    gguf_close(f);
    free(buf);
    free(w);
}

START_TEST(mkmmproj_writes_every_tensor_clip_uses_with_its_shape)
{
    mkmmproj_opts o;
    mkmmproj_defaults(&o);
    check_tensors(&o);
    /* widths and depths of the options; 6 SAM layers reach global block 5 */
    o = (mkmmproj_opts){.hidden = 40, .sam_layers = 6, .sam_width = 24, .sam_heads = 3, .clip_layers = 1,
                        .clip_width = 32, .clip_heads = 2, .window = 7, .dtype = MK_F32, .seed = 9};
    check_tensors(&o);
}
END_TEST

START_TEST(mkmmproj_f16_stores_the_matrices_only)
{
    mkmmproj_opts o;
    mkmmproj_defaults(&o);
    o.dtype = MK_F16;
    check_tensors(&o);
    void *buf = NULL;
    gguf_file *f = open_mem(&o, &buf);
    ck_assert_uint_eq(u32(f, "general.file_type"), 1);
    gguf_close(f);
    free(buf);
}
END_TEST

START_TEST(mkmmproj_same_seed_gives_the_same_bytes)
{
    mkmmproj_opts o;
    mkmmproj_defaults(&o);
    void *a = NULL, *b = NULL, *c = NULL;
    size_t la = 0, lb = 0, lc = 0;
    pd_err e = {0};
    ck_assert_int_eq(mkmmproj_to_mem(&o, &a, &la, &e), PD_OK);
    ck_assert_int_eq(mkmmproj_to_mem(&o, &b, &lb, &e), PD_OK);
    ck_assert_uint_eq(la, lb);
    ck_assert(memcmp(a, b, la) == 0);
    /* the file is the same bytes */
    char dir[64], path[128];
    pd_test_tmpdir(dir, sizeof dir, "mkmmproj");
    snprintf(path, sizeof path, "%s/mm.gguf", dir);
    ck_assert_int_eq(mkmmproj_write(&o, path, &e), PD_OK);
    FILE *fp = fopen(path, "rb");
    ck_assert_ptr_nonnull(fp);
    void *fb = malloc(la + 1);
    ck_assert_uint_eq(fread(fb, 1, la + 1, fp), la);
    fclose(fp);
    ck_assert(memcmp(fb, a, la) == 0);
    free(fb);
    pd_test_rmtree(dir);
    /* another seed: the same layout, other weights */
    o.seed = 2;
    ck_assert_int_eq(mkmmproj_to_mem(&o, &c, &lc, &e), PD_OK);
    ck_assert_uint_eq(lc, la);
    ck_assert(memcmp(a, c, la) != 0);
    free(a);
    free(b);
    free(c);
}
END_TEST

START_TEST(mkmmproj_refuses_bad_options_naming_the_flag)
{
    struct {
        const char *flag;
        mkmmproj_opts o;
    } tc[9];
    for (int i = 0; i < 9; i++)
        mkmmproj_defaults(&tc[i].o);
    tc[0].flag = "--hidden", tc[0].o.hidden = 0;
    tc[1].flag = "--sam-layers", tc[1].o.sam_layers = 0;
    tc[2].flag = "--clip-layers", tc[2].o.clip_layers = 0;
    tc[3].flag = "--sam-width", tc[3].o.sam_width = 30, tc[3].o.sam_heads = 4;
    tc[4].flag = "--clip-width", tc[4].o.clip_width = 66, tc[4].o.clip_heads = 2;
    tc[5].flag = "--clip-width", tc[5].o.clip_width = 64, tc[5].o.clip_heads = 3;
    tc[6].flag = "--window", tc[6].o.window = 0;
    tc[7].flag = "--window", tc[7].o.window = 65;
    tc[8].flag = "--dtype", tc[8].o.dtype = MK_Q8_0;
    char dir[64], path[128];
    pd_test_tmpdir(dir, sizeof dir, "mkmmproj");
    snprintf(path, sizeof path, "%s/mm.gguf", dir);
    for (int i = 0; i < 9; i++) {
        pd_err e = {0};
        ck_assert_int_eq(mkmmproj_write(&tc[i].o, path, &e), PD_ERR_ARG);
        ck_assert_msg(strstr(e.msg, tc[i].flag) != NULL, "case %d: '%s' does not name %s", i, e.msg, tc[i].flag);
        ck_assert_int_ne(access(path, F_OK), 0);
    }
    pd_test_rmtree(dir);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("mkmmproj");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, mkmmproj_writes_the_keys_clip_reads);
    tcase_add_test(tc, mkmmproj_writes_every_tensor_clip_uses_with_its_shape);
    tcase_add_test(tc, mkmmproj_f16_stores_the_matrices_only);
    tcase_add_test(tc, mkmmproj_same_seed_gives_the_same_bytes);
    tcase_add_test(tc, mkmmproj_refuses_bad_options_naming_the_flag);
    suite_add_tcase(s, tc);
    return s;
}
