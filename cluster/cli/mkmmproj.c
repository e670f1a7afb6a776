/* mkmmproj: a deterministic random DeepSeek-OCR mmproj (clip's "deepseekocr"
 * projector) written with pipedec's GGUF writer. Owns nothing past a call:
 * each tensor is generated into a scratch buffer the writer copies. */
#include "cluster/cli/mkmmproj.h"

#include "base/fp16.h"
#include "cluster/format/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* What clip.cpp and models/deepseekocr.cpp fix for DeepSeek-OCR whatever the
 * file says: the base page, the patch, the tile, SAM's global blocks. */
#define MM_BASE 1024u  /* overview side (hparams.image_size is forced to it) */
#define MM_PATCH 16u   /* hparams.patch_size is forced to it; also the conv kernel */
#define MM_GRID (MM_BASE / MM_PATCH) /* 64: SAM's patch grid of the overview */
#define MM_CLIP_GRID (MM_GRID / 4)   /* 16: after net_2 and net_3 (stride 2 each) */

void mkmmproj_defaults(mkmmproj_opts *o)
{
    *o = (mkmmproj_opts){.hidden = 64,
                         .sam_layers = 3,
                         .sam_width = 32,
                         .sam_heads = 2,
                         .clip_layers = 2,
                         .clip_width = 64,
                         .clip_heads = 4,
                         .window = 14,
                         .dtype = MK_F32,
                         .seed = 1};
}

/* clip's hparams.global_attn_indices() */
static int mm_sam_global(uint32_t layer)
{
    return layer == 2 || layer == 5 || layer == 8 || layer == 11;
}

static uint64_t mm_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct mm_ctx {
    const mkmmproj_opts *o;
    gguf_writer *w;
    uint64_t tag;    /* one per tensor, in the order they are added */
    float *scratch;  /* f32 values of the tensor being made */
    uint16_t *half;  /* its f16 bytes when stored as F16 */
    size_t cap;
    pd_err *err;
} mm_ctx;

/* Adds tensor `name` of shape ne[0..n_dims) holding center + U(-a, a), a
 * pure function of (seed, tensor index, element). mat: stored as o->dtype
 * (F32 or F16), else F32. */
static pd_status mm_tensor(mm_ctx *c, const char *name, uint32_t n_dims, const uint64_t *ne, float center,
                           float a, int mat)
{
    uint64_t n = 1;
    for (uint32_t d = 0; d < n_dims; d++)
        n *= ne[d];
    if (n > c->cap) {
        free(c->scratch);
        free(c->half);
        c->scratch = malloc(n * sizeof *c->scratch);
        c->half = malloc(n * sizeof *c->half);
        c->cap = c->scratch && c->half ? n : 0;
        if (!c->cap)
            return pd_err_set(c->err, PD_ERR_NOMEM, "mkmodel --mmproj: out of memory for %s", name);
    }
    const uint64_t tag = c->tag++;
    const uint64_t key = c->o->seed * 0x9e3779b97f4a7c15ull ^ mm_mix64(tag + 0x632be59bd9b4e019ull);
    for (uint64_t i = 0; i < n; i++) {
        const uint64_t r = mm_mix64(key ^ (i * 0xd1b54a32d192ed03ull));
        const double u = (double)(r >> 11) / 9007199254740992.0;
        c->scratch[i] = center + (float)((2.0 * u - 1.0) * a);
    }
    pd_status st;
    if (mat && c->o->dtype == MK_F16) {
        pd_f32_to_f16_n(c->scratch, c->half, n);
        st = gguf_writer_add_tensor_copy(c->w, name, GGUF_TENSOR_F16, n_dims, ne, c->half);
    } else
        st = gguf_writer_add_tensor_copy(c->w, name, GGUF_TENSOR_F32, n_dims, ne, c->scratch);
    if (st != PD_OK)
        return pd_err_set(c->err, st, "mkmodel --mmproj: cannot add tensor %s", name);
    return PD_OK;
}

#define SHAPE(...) ((const uint64_t[]){__VA_ARGS__})
#define NDIMS(...) ((uint32_t)(sizeof((uint64_t[]){__VA_ARGS__}) / sizeof(uint64_t)))
/* T(name, center, scale, mat, ne...) */
#define T(nm, ctr, a, mat, ...) \
    if (st == PD_OK)            \
    st = mm_tensor(c, (nm), NDIMS(__VA_ARGS__), SHAPE(__VA_ARGS__), (ctr), (a), (mat))

/* A layer norm's weight (near 1) and bias (near 0) of width n. */
static pd_status mm_norm(mm_ctx *c, const char *fmt_w, const char *fmt_b, int layer, uint64_t n)
{
    char nw[GGUF_NAME_MAX], nb[GGUF_NAME_MAX];
    pd_status st = PD_OK;
    snprintf(nw, sizeof nw, fmt_w, layer);
    snprintf(nb, sizeof nb, fmt_b, layer);
    T(nw, 1.0f, 0.1f, 0, n);
    T(nb, 0.0f, 0.05f, 0, n);
    return st;
}

static pd_status mm_sam(mm_ctx *c)
{
    const mkmmproj_opts *o = c->o;
    const uint64_t S = o->sam_width, hd = o->sam_width / o->sam_heads, N = o->clip_width / 4;
    const float damp = 1.0f / sqrtf(2.0f * (float)o->sam_layers), a_s = sqrtf(3.0f / (float)S);
    pd_status st = PD_OK;
    T("v.sam.patch_embd.weight", 0.0f, sqrtf(3.0f / (3.0f * MM_PATCH * MM_PATCH)), 1, MM_PATCH, MM_PATCH, 3, S);
    T("v.sam.patch_embd.bias", 0.0f, 0.02f, 0, S);
    T("v.sam.pos_embd.weight", 0.0f, 0.5f, 0, S, MM_GRID, MM_GRID, 1);
    for (uint32_t L = 0; st == PD_OK && L < o->sam_layers; L++) {
        char n[GGUF_NAME_MAX];
        const uint64_t span = mm_sam_global(L) ? MM_GRID : o->window;
#define NM(s) (snprintf(n, sizeof n, "v.sam.blk.%u." s, L), n)
        if (st == PD_OK)
            st = mm_norm(c, "v.sam.blk.%d.pre_ln.weight", "v.sam.blk.%d.pre_ln.bias", (int)L, S);
        T(NM("attn.qkv.weight"), 0.0f, a_s, 1, S, 3 * S);
        T(NM("attn.qkv.bias"), 0.0f, 0.02f, 0, 3 * S);
        T(NM("attn.out.weight"), 0.0f, a_s * damp, 1, S, S);
        T(NM("attn.out.bias"), 0.0f, 0.02f, 0, S);
        T(NM("attn.pos_h.weight"), 0.0f, 0.1f, 0, hd, 2 * span - 1);
        T(NM("attn.pos_w.weight"), 0.0f, 0.1f, 0, hd, 2 * span - 1);
        if (st == PD_OK)
            st = mm_norm(c, "v.sam.blk.%d.post_ln.weight", "v.sam.blk.%d.post_ln.bias", (int)L, S);
        T(NM("mlp.lin1.weight"), 0.0f, a_s, 1, S, 4 * S);
        T(NM("mlp.lin1.bias"), 0.0f, 0.02f, 0, 4 * S);
        T(NM("mlp.lin2.weight"), 0.0f, sqrtf(3.0f / (4.0f * (float)S)) * damp, 1, 4 * S, S);
        T(NM("mlp.lin2.bias"), 0.0f, 0.02f, 0, S);
#undef NM
    }
    /* the neck and the two stride-2 convolutions: F32 as the converter forces */
    T("v.sam.neck.0.weight", 0.0f, a_s, 0, 1, 1, S, N);
    if (st == PD_OK)
        st = mm_norm(c, "v.sam.neck.1.weight", "v.sam.neck.1.bias", 0, N);
    T("v.sam.neck.2.weight", 0.0f, sqrtf(3.0f / (9.0f * (float)N)), 0, 3, 3, N, N);
    if (st == PD_OK)
        st = mm_norm(c, "v.sam.neck.3.weight", "v.sam.neck.3.bias", 0, N);
    T("v.sam.net_2.weight", 0.0f, sqrtf(3.0f / (9.0f * (float)N)), 0, 3, 3, N, 2 * N);
    T("v.sam.net_3.weight", 0.0f, sqrtf(3.0f / (18.0f * (float)N)), 0, 3, 3, 2 * N, 4 * N);
    return st;
}

static pd_status mm_clip(mm_ctx *c)
{
    const mkmmproj_opts *o = c->o;
    const uint64_t D = o->clip_width, H = o->hidden;
    const float damp = 1.0f / sqrtf(2.0f * (float)o->clip_layers), a_d = sqrtf(3.0f / (float)D);
    pd_status st = PD_OK;
    T("v.class_embd", 0.0f, 1.0f, 0, D);
    T("v.position_embd.weight", 0.0f, 0.5f, 0, D, MM_CLIP_GRID * MM_CLIP_GRID + 1);
    if (st == PD_OK)
        st = mm_norm(c, "v.pre_ln.weight", "v.pre_ln.bias", 0, D);
    for (uint32_t L = 0; st == PD_OK && L < o->clip_layers; L++) {
        char n[GGUF_NAME_MAX];
#define NM(s) (snprintf(n, sizeof n, "v.blk.%u." s, L), n)
        if (st == PD_OK)
            st = mm_norm(c, "v.blk.%d.ln1.weight", "v.blk.%d.ln1.bias", (int)L, D);
        T(NM("attn_qkv.weight"), 0.0f, a_d, 1, D, 3 * D);
        T(NM("attn_qkv.bias"), 0.0f, 0.02f, 0, 3 * D);
        T(NM("attn_out.weight"), 0.0f, a_d * damp, 1, D, D);
        T(NM("attn_out.bias"), 0.0f, 0.02f, 0, D);
        if (st == PD_OK)
            st = mm_norm(c, "v.blk.%d.ln2.weight", "v.blk.%d.ln2.bias", (int)L, D);
        T(NM("ffn_up.weight"), 0.0f, a_d, 1, D, 4 * D);
        T(NM("ffn_up.bias"), 0.0f, 0.02f, 0, 4 * D);
        T(NM("ffn_down.weight"), 0.0f, sqrtf(3.0f / (4.0f * (float)D)) * damp, 1, 4 * D, D);
        T(NM("ffn_down.bias"), 0.0f, 0.02f, 0, D);
#undef NM
    }
    /* the projector sees [CLIP row ; SAM row]; rows of about unit variance
     * like the decoder's token embeddings */
    T("mm.model.fc.weight", 0.0f, sqrtf(3.0f / (2.0f * (float)D)), 1, 2 * D, H);
    T("mm.model.fc.bias", 0.0f, 0.05f, 0, H);
    T("v.image_newline", 0.0f, 1.0f, 0, H);
    T("v.view_seperator", 0.0f, 1.0f, 0, H, 1); /* the converter unsqueezes it */
    return st;
}
#undef T
#undef NDIMS
#undef SHAPE

static pd_status mm_check(const mkmmproj_opts *o, pd_err *err)
{
    if (o->hidden < 1 || o->hidden > 65536)
        return pd_err_set(err, PD_ERR_ARG, "--hidden %u: expected 1..65536", o->hidden);
    if (o->sam_layers < 1 || o->sam_layers > 64)
        return pd_err_set(err, PD_ERR_ARG, "--sam-layers %u: expected 1..64", o->sam_layers);
    if (o->clip_layers < 1 || o->clip_layers > 64)
        return pd_err_set(err, PD_ERR_ARG, "--clip-layers %u: expected 1..64", o->clip_layers);
    if (o->sam_heads < 1 || o->sam_width < 1 || o->sam_width > 4096 || o->sam_width % o->sam_heads)
        return pd_err_set(err, PD_ERR_ARG, "--sam-width %u must be a multiple of --sam-heads %u, at most 4096",
                          o->sam_width, o->sam_heads);
    if (o->clip_heads < 1 || o->clip_width < 4 || o->clip_width > 4096 || o->clip_width % o->clip_heads ||
        o->clip_width % 4)
        return pd_err_set(err, PD_ERR_ARG,
                          "--clip-width %u must be a multiple of 4 and of --clip-heads %u, at most 4096",
                          o->clip_width, o->clip_heads);
    if (o->window < 1 || o->window > MM_GRID)
        return pd_err_set(err, PD_ERR_ARG, "--window %u: expected 1..%u", o->window, MM_GRID);
    if (o->dtype != MK_F32 && o->dtype != MK_F16)
        return pd_err_set(err, PD_ERR_ARG, "--dtype %s: an mmproj is written f32 or f16",
                          mk_dtype_name(o->dtype) ? mk_dtype_name(o->dtype) : "?");
    return PD_OK;
}

/* Fills a new writer with the whole file; *out owned by the caller. */
static pd_status mm_build(const mkmmproj_opts *o, gguf_writer **out, pd_err *err)
{
    pd_status st = mm_check(o, err);
    if (st != PD_OK)
        return st;
    gguf_writer *w = gguf_writer_new();
    if (!w)
        return pd_err_set(err, PD_ERR_NOMEM, "mkmodel --mmproj: out of memory");
    const float half3[3] = {0.5f, 0.5f, 0.5f};
    /* the keys llama.cpp's converter writes for DeepSeek-OCR; image_size and
     * patch_size are the values clip forces for this projector */
    gguf_writer_set_str(w, "general.architecture", "clip");
    gguf_writer_set_str(w, "general.name", "pipedec synthetic deepseekocr mmproj");
    gguf_writer_set_u32(w, "general.file_type", o->dtype == MK_F16 ? 1 : 0);
    gguf_writer_set_bool(w, "clip.has_vision_encoder", true);
    gguf_writer_set_str(w, "clip.projector_type", "deepseekocr");
    gguf_writer_set_u32(w, "clip.vision.projection_dim", o->hidden);
    gguf_writer_set_u32(w, "clip.vision.image_size", MM_BASE);
    gguf_writer_set_u32(w, "clip.vision.patch_size", MM_PATCH);
    gguf_writer_set_u32(w, "clip.vision.embedding_length", o->clip_width);
    gguf_writer_set_u32(w, "clip.vision.feed_forward_length", 4 * o->clip_width);
    gguf_writer_set_u32(w, "clip.vision.block_count", o->clip_layers);
    gguf_writer_set_u32(w, "clip.vision.attention.head_count", o->clip_heads);
    gguf_writer_set_arr_f32(w, "clip.vision.image_mean", half3, 3);
    gguf_writer_set_arr_f32(w, "clip.vision.image_std", half3, 3);
    /* clip runs CLIP's norms at 1e-5 and SAM's at 1e-6 whatever this says */
    gguf_writer_set_f32(w, "clip.vision.attention.layer_norm_epsilon", 1e-6f);
    gguf_writer_set_bool(w, "clip.use_gelu", true);
    gguf_writer_set_u32(w, "clip.vision.window_size", o->window);
    gguf_writer_set_u32(w, "clip.vision.preproc_min_tiles", 2);
    gguf_writer_set_u32(w, "clip.vision.preproc_max_tiles", 9);
    gguf_writer_set_u32(w, "clip.vision.sam.block_count", o->sam_layers);
    gguf_writer_set_u32(w, "clip.vision.sam.embedding_length", o->sam_width);
    gguf_writer_set_u32(w, "clip.vision.sam.head_count", o->sam_heads);
    mm_ctx c = {.o = o, .w = w, .err = err};
    st = mm_sam(&c);
    if (st == PD_OK)
        st = mm_clip(&c);
    free(c.scratch);
    free(c.half);
    if (st != PD_OK) {
        gguf_writer_free(w);
        return st;
    }
    *out = w;
    return PD_OK;
}

pd_status mkmmproj_write(const mkmmproj_opts *o, const char *path, pd_err *err)
{
    gguf_writer *w = NULL;
    pd_status st = mm_build(o, &w, err);
    if (st == PD_OK)
        st = gguf_writer_write(w, path, err);
    gguf_writer_free(w);
    return st;
}

pd_status mkmmproj_to_mem(const mkmmproj_opts *o, void **buf, size_t *len, pd_err *err)
{
    gguf_writer *w = NULL;
    pd_status st = mm_build(o, &w, err);
    if (st == PD_OK)
        st = gguf_writer_to_mem(w, buf, len, err);
    gguf_writer_free(w);
    return st;
}
