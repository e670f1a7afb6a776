/* The batch-invariant GEMM (see gemm.h for the contract) and the opt-in
 * OpenBLAS backend. Owns the packed weight panels. Holds the portable fmaf
 * micro-kernel and the AVX2/FMA one, and picks those or gemm_avx512.c's by
 * the ISA in force: same per-lane FMA order everywhere, so the same bits. */
#include "cluster/model/gemm.h"
#include "cluster/model/gemm_kern.h"

#include "base/check.h"
#include "base/cpu.h"
#include "base/fp16.h"

#include <cblas.h>
#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <string.h>

/* f32 chunks are the packed bytes themselves; the rest are converted. */
static inline bool gemm_chunk_in_place(gemm_wtype type) { return type == GEMM_W_F32; }

/* INV: n >= 1, k >= 1, n_panels == ceil(n / GEMM_NR); type < GEMM_W_COUNT,
 *      be < GEMM_BACKEND_COUNT; Q8_0 => k % 32 == 0.
 * INV: invariant backend: data holds n_panels panels of panel_bytes bytes
 *      (layout above); the columns of the last panel beyond n are zero
 *      (zero scales for Q8_0). OpenBLAS backend: data is f32 [n x k].
 * INV: bytes == n_panels * panel_bytes (invariant) or n * k * 4 (OpenBLAS). */
struct gemm_w {
    gemm_backend be;
    gemm_wtype type;
    uint32_t n, k;
    uint32_t n_panels;
    size_t panel_bytes;
    size_t bytes;
    void *data;
    pd_alloc alloc; /* copy of the allocator the memory came from */
};

const char *gemm_wtype_name(gemm_wtype t)
{
    switch (t) {
    case GEMM_W_F32: return "f32";
    case GEMM_W_F16: return "f16";
    case GEMM_W_BF16: return "bf16";
    case GEMM_W_Q8_0: return "q8_0";
    case GEMM_W_Q4_0: return "q4_0";
    case GEMM_W_Q5_0: return "q5_0";
    case GEMM_W_Q4_1: return "q4_1";
    case GEMM_W_Q5_1: return "q5_1";
    case GEMM_W_Q4_K: return "q4_K";
    case GEMM_W_Q5_K: return "q5_K";
    case GEMM_W_Q6_K: return "q6_K";
    default: return "unknown";
    }
}

const char *gemm_backend_name(gemm_backend b)
{
    switch (b) {
    case GEMM_BACKEND_INVARIANT: return "invariant";
    case GEMM_BACKEND_OPENBLAS: return "openblas";
    case GEMM_BACKEND_INT8: return "int8";
    default: return "unknown";
    }
}

/* Source block of a qs type: values and bytes. */
static void gemm_qs_src_block(gemm_wtype type, uint32_t *elems, uint32_t *bytes)
{
    switch (type) {
    case GEMM_W_Q4_0: *elems = 32; *bytes = 18; return;
    case GEMM_W_Q5_0: *elems = 32; *bytes = 22; return;
    case GEMM_W_Q4_1: *elems = 32; *bytes = 20; return;
    case GEMM_W_Q5_1: *elems = 32; *bytes = 24; return;
    case GEMM_W_Q4_K: *elems = 256; *bytes = 144; return;
    case GEMM_W_Q5_K: *elems = 256; *bytes = 176; return;
    case GEMM_W_Q6_K: *elems = 256; *bytes = 210; return;
    default: CHECK(0);
    }
}

uint32_t gemm_wtype_block(gemm_wtype type)
{
    if (type == GEMM_W_Q8_0)
        return GEMM_Q8_0_BLOCK;
    if (gemm_wtype_is_qs(type)) {
        uint32_t e, b;
        gemm_qs_src_block(type, &e, &b);
        return e;
    }
    return 1;
}

static uint16_t gemm_rd16(const uint8_t *p);

/* ggml's get_scale_min_k4: the 6-bit scale and min of sub-block j (0..7)
 * of a Q4_K / Q5_K super-block's 12 scale bytes. */
static void gemm_scale_min_k4(uint32_t j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

void gemm_qs_block(gemm_wtype type, const uint8_t *row, uint32_t b, float s[2], float *nm, int8_t q[32])
{
    switch (type) {
    case GEMM_W_Q4_0: {
        const uint8_t *x = row + (size_t)b * 18, *qs = x + 2;
        s[0] = s[1] = pd_f16_to_f32(gemm_rd16(x));
        *nm = -0.0f;
        for (uint32_t j = 0; j < 16; j++) {
            q[j] = (int8_t)((qs[j] & 0x0F) - 8);
            q[j + 16] = (int8_t)((qs[j] >> 4) - 8);
        }
        return;
    }
    case GEMM_W_Q4_1: {
        const uint8_t *x = row + (size_t)b * 20, *qs = x + 4;
        s[0] = s[1] = pd_f16_to_f32(gemm_rd16(x));
        *nm = pd_f16_to_f32(gemm_rd16(x + 2));
        for (uint32_t j = 0; j < 16; j++) {
            q[j] = (int8_t)(qs[j] & 0x0F);
            q[j + 16] = (int8_t)(qs[j] >> 4);
        }
        return;
    }
    case GEMM_W_Q5_1: {
        const uint8_t *x = row + (size_t)b * 24, *qs = x + 8;
        uint32_t qh = (uint32_t)x[4] | (uint32_t)x[5] << 8 | (uint32_t)x[6] << 16 | (uint32_t)x[7] << 24;
        s[0] = s[1] = pd_f16_to_f32(gemm_rd16(x));
        *nm = pd_f16_to_f32(gemm_rd16(x + 2));
        for (uint32_t j = 0; j < 16; j++) {
            uint32_t h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            q[j] = (int8_t)((qs[j] & 0x0F) | h0);
            q[j + 16] = (int8_t)((qs[j] >> 4) | h1);
        }
        return;
    }
    case GEMM_W_Q5_0: {
        const uint8_t *x = row + (size_t)b * 22, *qs = x + 6;
        uint32_t qh = (uint32_t)x[2] | (uint32_t)x[3] << 8 | (uint32_t)x[4] << 16 | (uint32_t)x[5] << 24;
        s[0] = s[1] = pd_f16_to_f32(gemm_rd16(x));
        *nm = -0.0f;
        for (uint32_t j = 0; j < 16; j++) {
            uint32_t h0 = ((qh >> j) << 4) & 0x10, h1 = (qh >> (j + 12)) & 0x10;
            q[j] = (int8_t)((int)((qs[j] & 0x0F) | h0) - 16);
            q[j + 16] = (int8_t)((int)((qs[j] >> 4) | h1) - 16);
        }
        return;
    }
    case GEMM_W_Q4_K:
    case GEMM_W_Q5_K: {
        const uint32_t sub = b % 8, pair = sub / 2;
        const uint8_t *x = row + (size_t)(b / 8) * (type == GEMM_W_Q4_K ? 144 : 176);
        const float d = pd_f16_to_f32(gemm_rd16(x)), dmin = pd_f16_to_f32(gemm_rd16(x + 2));
        uint8_t sc, m;
        gemm_scale_min_k4(sub, x + 4, &sc, &m);
        s[0] = s[1] = d * (float)sc;
        *nm = -(dmin * (float)m);
        if (type == GEMM_W_Q4_K) {
            const uint8_t *ql = x + 16 + 32 * pair;
            for (uint32_t l = 0; l < 32; l++)
                q[l] = (int8_t)(sub % 2 ? ql[l] >> 4 : ql[l] & 0xF);
        } else {
            const uint8_t *qh = x + 16, *ql = x + 48 + 32 * pair;
            const uint8_t u = (uint8_t)(1u << sub); /* u1 = 1 << 2 pair, u2 = 2 << 2 pair */
            for (uint32_t l = 0; l < 32; l++)
                q[l] = (int8_t)((sub % 2 ? ql[l] >> 4 : ql[l] & 0xF) + (qh[l] & u ? 16 : 0));
        }
        return;
    }
    case GEMM_W_Q6_K: {
        /* 128-value halves; in each, l in 0..31 gives values l, l + 32,
         * l + 64, l + 96 (r = 0..3) */
        const uint32_t sub = b % 8, half = sub / 4, r = sub % 4;
        const uint8_t *x = row + (size_t)(b / 8) * 210;
        const uint8_t *ql = x + 64 * half + (r % 2 ? 32 : 0), *qh = x + 128 + 32 * half;
        const int8_t *sc = (const int8_t *)(x + 192) + 8 * half;
        const float d = pd_f16_to_f32(gemm_rd16(x + 208));
        s[0] = d * (float)sc[2 * r];
        s[1] = d * (float)sc[2 * r + 1];
        *nm = -0.0f;
        for (uint32_t l = 0; l < 32; l++) {
            uint32_t lo = r < 2 ? ql[l] & 0xF : ql[l] >> 4;
            uint32_t hi = (qh[l] >> (2 * r)) & 3;
            q[l] = (int8_t)((int)(lo | hi << 4) - 32);
        }
        return;
    }
    default: CHECK(0);
    }
}

/* The stored fields of source block b (32 k) of a qs type, for the panel
 * layout (gemm_kern.h): h[0] its f16 d, h[1] its second f16 (m, dmin; 0
 * when the type has none), hb[0..1] its block header bytes (K types: the
 * 6-bit sc and m; Q6_K: the int8 scales of k 0..15 and 16..31; 0 else). */
static void gemm_qs_src_fields(gemm_wtype type, const uint8_t *row, uint32_t b, uint16_t h[2], uint8_t hb[2])
{
    h[1] = 0;
    hb[0] = hb[1] = 0;
    switch (type) {
    case GEMM_W_Q4_0: h[0] = gemm_rd16(row + (size_t)b * 18); return;
    case GEMM_W_Q5_0: h[0] = gemm_rd16(row + (size_t)b * 22); return;
    case GEMM_W_Q4_1:
    case GEMM_W_Q5_1: {
        const uint8_t *x = row + (size_t)b * (type == GEMM_W_Q4_1 ? 20 : 24);
        h[0] = gemm_rd16(x);
        h[1] = gemm_rd16(x + 2);
        return;
    }
    case GEMM_W_Q4_K:
    case GEMM_W_Q5_K: {
        const uint8_t *x = row + (size_t)(b / 8) * (type == GEMM_W_Q4_K ? 144 : 176);
        h[0] = gemm_rd16(x);
        h[1] = gemm_rd16(x + 2);
        gemm_scale_min_k4(b % 8, x + 4, &hb[0], &hb[1]);
        return;
    }
    case GEMM_W_Q6_K: {
        const uint32_t sub = b % 8, half = sub / 4, r = sub % 4;
        const uint8_t *x = row + (size_t)(b / 8) * 210;
        h[0] = gemm_rd16(x + 208);
        hb[0] = x[192 + 8 * half + 2 * r];
        hb[1] = x[192 + 8 * half + 2 * r + 1];
        return;
    }
    default: CHECK(0);
    }
}

/* The scales s[0] (k 0..15), s[1] (k 16..31) and nm of block b of a qs
 * panel for column l, from the stored fields with the f32 operations every
 * kernel uses (gemm_kern.h): the values of gemm_qs_block. */
static void gemm_qs_panel_scales(gemm_wtype type, const uint8_t *panel, uint32_t b, uint32_t l, float s[2],
                                 float *nm)
{
    const gemm_qs_fmt f = gemm_qs_fmt_of(type);
    const uint8_t *grp = panel + gemm_qs_group_off(f, b), *blk = panel + gemm_qs_block_off(f, b);
    const float d = pd_f16_to_f32(gemm_rd16(grp + 2 * l));
    const float h1 = f.gh == 64 ? pd_f16_to_f32(gemm_rd16(grp + 32 + 2 * l)) : 0.0f;
    switch (type) {
    case GEMM_W_Q4_K:
    case GEMM_W_Q5_K:
        s[0] = s[1] = d * (float)blk[l];
        *nm = -(h1 * (float)blk[16 + l]);
        return;
    case GEMM_W_Q6_K:
        s[0] = d * (float)(int8_t)blk[l];
        s[1] = d * (float)(int8_t)blk[16 + l];
        *nm = -0.0f;
        return;
    default:
        s[0] = s[1] = d;
        *nm = f.gh == 64 ? h1 : -0.0f;
        return;
    }
}

/* q of k row kk (0..31) of block b of a qs panel, column l. */
static int gemm_qs_panel_q(gemm_wtype type, const uint8_t *panel, uint32_t b, uint32_t kk, uint32_t l)
{
    const gemm_qs_fmt f = gemm_qs_fmt_of(type);
    const uint8_t *qd = panel + gemm_qs_block_off(f, b) + f.bh;
    uint32_t u = (qd[16 * (kk / 2) + l] >> (4 * (kk % 2))) & 0xF;
    if (f.bits == 5)
        u |= ((qd[GEMM_QS_NIBBLES + 16 * (kk / 8) + l] >> (kk % 8)) & 1) << 4;
    else if (f.bits == 6)
        u |= ((qd[GEMM_QS_NIBBLES + 16 * (kk / 4) + l] >> (2 * (kk % 4))) & 3) << 4;
    return (int)u - (int)f.off;
}

size_t gemm_row_bytes(gemm_wtype type, uint32_t k)
{
    if (gemm_wtype_is_qs(type)) {
        uint32_t e, b;
        gemm_qs_src_block(type, &e, &b);
        return k % e ? 0 : (size_t)(k / e) * b;
    }
    switch (type) {
    case GEMM_W_F32: return (size_t)k * 4;
    case GEMM_W_F16:
    case GEMM_W_BF16: return (size_t)k * 2;
    case GEMM_W_Q8_0:
        return k % GEMM_Q8_0_BLOCK ? 0 : (size_t)(k / GEMM_Q8_0_BLOCK) * GEMM_Q8_SRC_BLOCK;
    default: return 0;
    }
}

/* Packed bytes of one panel of k values, or 0 on a bad type. */
static size_t gemm_panel_bytes(gemm_wtype type, uint32_t k)
{
    switch (type) {
    case GEMM_W_F32: return (size_t)k * GEMM_NR * 4;
    case GEMM_W_F16:
    case GEMM_W_BF16: return (size_t)k * GEMM_NR * 2;
    case GEMM_W_Q8_0: return (size_t)(k / GEMM_Q8_0_BLOCK) * GEMM_Q8_PANEL_BLOCK;
    default:
        if (!gemm_wtype_is_qs(type))
            return 0;
        const gemm_qs_fmt f = gemm_qs_fmt_of(type);
        return (size_t)(k / (GEMM_QS_BLOCK * f.g)) * gemm_qs_group_bytes(f);
    }
}

static uint16_t gemm_rd16(const uint8_t *p)
{
    /* little-endian, as GGUF stores it */
    return (uint16_t)(p[0] | (p[1] << 8));
}

/* Source row j of w as stored (GGUF layout). */
static const uint8_t *gemm_src_row(const void *w, gemm_wtype type, uint32_t k, uint32_t j)
{
    return (const uint8_t *)w + (size_t)j * gemm_row_bytes(type, k);
}

/* The exact f32 value of weight (j, kk) of a source row: the value every
 * path multiplies with. */
static float gemm_src_value(const uint8_t *row, gemm_wtype type, uint32_t kk)
{
    switch (type) {
    case GEMM_W_F32: {
        float v;
        memcpy(&v, row + (size_t)kk * 4, 4);
        return v;
    }
    case GEMM_W_F16: return pd_f16_to_f32(gemm_rd16(row + (size_t)kk * 2));
    case GEMM_W_BF16: return pd_bf16_to_f32(gemm_rd16(row + (size_t)kk * 2));
    case GEMM_W_Q8_0: {
        const uint8_t *blk = row + (size_t)(kk / GEMM_Q8_0_BLOCK) * GEMM_Q8_SRC_BLOCK;
        float d = pd_f16_to_f32(gemm_rd16(blk));
        return (float)(int8_t)blk[2 + kk % GEMM_Q8_0_BLOCK] * d;
    }
    default: {
        float sv[2], nm;
        int8_t q[32];
        gemm_qs_block(type, row, kk / GEMM_QS_BLOCK, sv, &nm, q);
        uint32_t i = kk % GEMM_QS_BLOCK;
        return fmaf(sv[i / 16], (float)q[i], nm);
    }
    }
}

void gemm_dequant(gemm_wtype type, const void *row, uint32_t k0, uint32_t n, float *out)
{
    const uint8_t *r = row;
    if (!gemm_wtype_is_qs(type)) {
        for (uint32_t i = 0; i < n; i++)
            out[i] = gemm_src_value(r, type, k0 + i);
        return;
    }
    float sv[2], nm;
    int8_t q[32];
    uint32_t cur = UINT32_MAX;
    for (uint32_t i = 0; i < n; i++) {
        uint32_t kk = k0 + i;
        if (kk / GEMM_QS_BLOCK != cur) {
            cur = kk / GEMM_QS_BLOCK;
            gemm_qs_block(type, r, cur, sv, &nm, q);
        }
        uint32_t j = kk % GEMM_QS_BLOCK;
        out[i] = fmaf(sv[j / 16], (float)q[j], nm);
    }
}

/* Writes the panel holding columns [col0, col0 + 16) of w. */
static void gemm_pack_panel(const void *w, gemm_wtype type, uint32_t n, uint32_t k, uint32_t col0,
                            uint8_t *dst)
{
    uint32_t cols = n - col0 < GEMM_NR ? n - col0 : GEMM_NR;
    switch (type) {
    case GEMM_W_F32:
    case GEMM_W_F16:
    case GEMM_W_BF16: {
        size_t es = type == GEMM_W_F32 ? 4 : 2;
        memset(dst, 0, (size_t)k * GEMM_NR * es);
        for (uint32_t l = 0; l < cols; l++) {
            const uint8_t *row = gemm_src_row(w, type, k, col0 + l);
            for (uint32_t kk = 0; kk < k; kk++)
                memcpy(dst + ((size_t)kk * GEMM_NR + l) * es, row + (size_t)kk * es, es);
        }
        break;
    }
    case GEMM_W_Q8_0: {
        uint32_t nb = k / GEMM_Q8_0_BLOCK;
        memset(dst, 0, (size_t)nb * GEMM_Q8_PANEL_BLOCK);
        for (uint32_t l = 0; l < cols; l++) {
            const uint8_t *row = gemm_src_row(w, type, k, col0 + l);
            for (uint32_t b = 0; b < nb; b++) {
                const uint8_t *src = row + (size_t)b * GEMM_Q8_SRC_BLOCK;
                uint8_t *blk = dst + (size_t)b * GEMM_Q8_PANEL_BLOCK;
                memcpy(blk + 2 * l, src, 2); /* f16 scale, little-endian */
                for (uint32_t kk = 0; kk < GEMM_Q8_0_BLOCK; kk++)
                    blk[GEMM_Q8_SCALES + kk * GEMM_NR + l] = src[2 + kk];
            }
        }
        break;
    }
    default: {
        CHECK(gemm_wtype_is_qs(type));
        const gemm_qs_fmt f = gemm_qs_fmt_of(type);
        const uint32_t nb = k / GEMM_QS_BLOCK;
        memset(dst, 0, gemm_panel_bytes(type, k));
        for (uint32_t l = 0; l < cols; l++) {
            const uint8_t *row = gemm_src_row(w, type, k, col0 + l);
            for (uint32_t b = 0; b < nb; b++) {
                uint8_t *grp = dst + gemm_qs_group_off(f, b), *blk = dst + gemm_qs_block_off(f, b);
                uint16_t h[2];
                uint8_t hb[2];
                gemm_qs_src_fields(type, row, b, h, hb);
                if (b % f.g == 0) /* f16 fields little-endian, as GGUF stores them */
                    for (uint32_t i = 0; i < f.gh / 32; i++) {
                        grp[32 * i + 2 * l] = (uint8_t)h[i];
                        grp[32 * i + 2 * l + 1] = (uint8_t)(h[i] >> 8);
                    }
                if (f.bh) {
                    blk[l] = hb[0];
                    blk[16 + l] = hb[1];
                }
                /* the values gemm_qs_block defines, stored as q + off */
                float sv[2], nm;
                int8_t q[32];
                gemm_qs_block(type, row, b, sv, &nm, q);
                uint8_t *qd = blk + f.bh;
                for (uint32_t kk = 0; kk < GEMM_QS_BLOCK; kk++) {
                    const uint32_t u = (uint32_t)(q[kk] + (int)f.off);
                    qd[16 * (kk / 2) + l] |= (uint8_t)((u & 0xF) << (4 * (kk % 2)));
                    if (f.bits == 5)
                        qd[GEMM_QS_NIBBLES + 16 * (kk / 8) + l] |= (uint8_t)((u >> 4) << (kk % 8));
                    else if (f.bits == 6)
                        qd[GEMM_QS_NIBBLES + 16 * (kk / 4) + l] |= (uint8_t)((u >> 4) << (2 * (kk % 4)));
                }
            }
        }
        break;
    }
    }
}

/* The first non-finite f16 scale of a block type's source rows (Q8_0 and
 * the qs types): 1 and its row, block and bits, else 0. */
static int gemm_bad_scale(const void *w, gemm_wtype type, uint32_t n, uint32_t k, uint32_t *row, uint32_t *blk,
                          uint16_t *bits)
{
    uint32_t be, bb, off[2] = {0, 0}, nf = 1;
    switch (type) {
    case GEMM_W_Q8_0: be = 32; bb = GEMM_Q8_SRC_BLOCK; break;
    case GEMM_W_Q4_1:
    case GEMM_W_Q5_1:
    case GEMM_W_Q4_K:
    case GEMM_W_Q5_K: nf = 2; off[1] = 2; gemm_qs_src_block(type, &be, &bb); break;
    case GEMM_W_Q6_K: off[0] = 208; gemm_qs_src_block(type, &be, &bb); break;
    default:
        if (!gemm_wtype_is_qs(type))
            return 0;
        gemm_qs_src_block(type, &be, &bb);
    }
    const uint8_t *p = w;
    const size_t rb = (size_t)(k / be) * bb;
    for (uint32_t j = 0; j < n; j++)
        for (uint32_t b = 0; b < k / be; b++)
            for (uint32_t f = 0; f < nf; f++) {
                uint16_t h = gemm_rd16(p + (size_t)j * rb + (size_t)b * bb + off[f]);
                if ((h & 0x7c00) == 0x7c00) {
                    *row = j;
                    *blk = b;
                    *bits = h;
                    return 1;
                }
            }
    return 0;
}

pd_status gemm_pack(const void *w, gemm_wtype type, uint32_t n, uint32_t k, gemm_backend be,
                    const pd_alloc *alloc, gemm_w **out, pd_err *err)
{
    if (!w || !out)
        return pd_err_set(err, PD_ERR_ARG, "gemm_pack: NULL %s", !w ? "weights" : "out");
    if ((unsigned)type >= GEMM_W_COUNT)
        return pd_err_set(err, PD_ERR_ARG, "gemm_pack: unknown weight type %d", (int)type);
    if ((unsigned)be >= GEMM_BACKEND_COUNT)
        return pd_err_set(err, PD_ERR_ARG, "gemm_pack: unknown backend %d", (int)be);
    if (n == 0 || k == 0)
        return pd_err_set(err, PD_ERR_ARG, "gemm_pack: empty matrix %u x %u", n, k);
    if (type != GEMM_W_F32 && k % gemm_wtype_block(type) != 0)
        return pd_err_set(err, PD_ERR_ARG, "gemm_pack: %s needs k %% %u == 0, k = %u", gemm_wtype_name(type),
                          gemm_wtype_block(type), k);
    if (be == GEMM_BACKEND_OPENBLAS && (n > INT_MAX || k > INT_MAX))
        return pd_err_set(err, PD_ERR_RANGE, "gemm_pack: %u x %u exceeds cblas int sizes", n, k);
    uint32_t bad_row, bad_blk;
    uint16_t bad_bits;
    if (gemm_bad_scale(w, type, n, k, &bad_row, &bad_blk, &bad_bits))
        return pd_err_set(err, PD_ERR_FORMAT, "row %u, block %u: %s scale 0x%04x is %s", bad_row, bad_blk,
                          gemm_wtype_name(type), bad_bits, (bad_bits & 0x3ff) ? "NaN" : "infinite");
    uint32_t n_panels = (uint32_t)(((uint64_t)n + GEMM_NR - 1) / GEMM_NR);
    size_t panel_bytes = gemm_panel_bytes(type, k);
    size_t bytes;
    if (be != GEMM_BACKEND_OPENBLAS) {
        /* panel_bytes <= k * 64 < 2^38: only the product can overflow */
        if (panel_bytes > SIZE_MAX / n_panels)
            return pd_err_set(err, PD_ERR_NOMEM, "gemm_pack: %u x %u %s overflows", n, k,
                              gemm_wtype_name(type));
        bytes = panel_bytes * n_panels;
    } else {
        if ((size_t)k > SIZE_MAX / 4 / n)
            return pd_err_set(err, PD_ERR_NOMEM, "gemm_pack: %u x %u f32 overflows", n, k);
        bytes = (size_t)n * k * 4;
    }
    const pd_alloc *al = alloc ? alloc : pd_alloc_default();
    gemm_w *g = pd_alloc_bytes(al, sizeof *g);
    void *data = g ? pd_alloc_bytes(al, bytes) : NULL;
    if (!data) {
        pd_free_bytes(al, g, sizeof *g);
        return pd_err_set(err, PD_ERR_NOMEM, "gemm_pack: cannot allocate %zu bytes for %u x %u %s",
                          bytes, n, k, gemm_wtype_name(type));
    }
    *g = (gemm_w){.be = be, .type = type, .n = n, .k = k, .n_panels = n_panels,
                  .panel_bytes = panel_bytes, .bytes = bytes, .data = data, .alloc = *al};
    if (be != GEMM_BACKEND_OPENBLAS) {
        for (uint32_t pnl = 0; pnl < n_panels; pnl++)
            gemm_pack_panel(w, type, n, k, pnl * GEMM_NR, (uint8_t *)data + pnl * panel_bytes);
    } else {
        float *f = data;
        for (uint32_t j = 0; j < n; j++) {
            const uint8_t *row = gemm_src_row(w, type, k, j);
            if (type == GEMM_W_F32)
                memcpy(f + (size_t)j * k, row, (size_t)k * 4);
            else
                for (uint32_t kk = 0; kk < k; kk++)
                    f[(size_t)j * k + kk] = gemm_src_value(row, type, kk);
        }
    }
    *out = g;
    return PD_OK;
}

void gemm_free(gemm_w *w)
{
    if (!w)
        return;
    pd_alloc al = w->alloc;
    pd_free_bytes(&al, w->data, w->bytes);
    pd_free_bytes(&al, w, sizeof *w);
}

void gemm_prefetch_start(const gemm_w *w)
{
    if (!w || w->be == GEMM_BACKEND_OPENBLAS)
        return;
    /* the first two panels: the tiles of more than one row read two at
     * once; into L2 (prefetcht1), so a matrix's worth of starts does not
     * evict the L1 lines of the work in flight */
    const uint8_t *d = w->data;
    const size_t head = w->panel_bytes < GEMM_PREFETCH ? w->panel_bytes : GEMM_PREFETCH;
    for (uint32_t pn = 0; pn < 2 && pn < w->n_panels; pn++)
        for (size_t o = 0; o < head; o += 64)
            __builtin_prefetch(d + (size_t)pn * w->panel_bytes + o, 0, 2);
}

uint32_t gemm_rows_n(const gemm_w *w) { return w->n; }
uint32_t gemm_cols_k(const gemm_w *w) { return w->k; }
gemm_wtype gemm_get_wtype(const gemm_w *w) { return w->type; }
gemm_backend gemm_get_backend(const gemm_w *w) { return w->be; }
size_t gemm_bytes(const gemm_w *w) { return w ? w->bytes : 0; }

void gemm_check(const gemm_w *w)
{
    CHECK(w != NULL);
    CHECK((unsigned)w->type < GEMM_W_COUNT && (unsigned)w->be < GEMM_BACKEND_COUNT);
    CHECK(w->n >= 1 && w->k >= 1 && w->data != NULL);
    CHECK(w->n_panels == (w->n + GEMM_NR - 1) / GEMM_NR);
    CHECK(w->k % gemm_wtype_block(w->type) == 0);
    if (w->be == GEMM_BACKEND_OPENBLAS) {
        CHECK(w->bytes == (size_t)w->n * w->k * 4);
        return;
    }
    CHECK(w->panel_bytes == gemm_panel_bytes(w->type, w->k));
    CHECK(w->bytes == w->panel_bytes * w->n_panels);
    /* padding columns of the last panel are zero */
    uint32_t cols = w->n - (w->n_panels - 1) * GEMM_NR;
    const uint8_t *last = (const uint8_t *)w->data + (size_t)(w->n_panels - 1) * w->panel_bytes;
    if (gemm_wtype_is_qs(w->type)) {
        /* group headers are f16 arrays (column l at bytes 2l, 2l + 1), the
         * rest rows of 16 bytes (column l at byte l) */
        const gemm_qs_fmt f = gemm_qs_fmt_of(w->type);
        const size_t gb = gemm_qs_group_bytes(f);
        for (size_t g = 0; g < w->panel_bytes / gb; g++) {
            const uint8_t *grp = last + g * gb;
            for (uint32_t l = cols; l < GEMM_NR; l++) {
                for (size_t o = 0; o < f.gh; o += 32)
                    CHECK(grp[o + 2 * l] == 0 && grp[o + 2 * l + 1] == 0);
                for (size_t o = f.gh; o < gb; o += 16)
                    CHECK(grp[o + l] == 0);
            }
        }
    } else if (w->type == GEMM_W_Q8_0) {
        for (uint32_t b = 0; b < w->k / GEMM_Q8_0_BLOCK; b++) {
            const uint8_t *blk = last + (size_t)b * GEMM_Q8_PANEL_BLOCK;
            for (uint32_t l = cols; l < GEMM_NR; l++) {
                CHECK(gemm_rd16(blk + 2 * l) == 0);
                for (uint32_t kk = 0; kk < GEMM_Q8_0_BLOCK; kk++)
                    CHECK(blk[GEMM_Q8_SCALES + kk * GEMM_NR + l] == 0);
            }
        }
    } else {
        size_t es = w->type == GEMM_W_F32 ? 4 : 2;
        for (uint32_t kk = 0; kk < w->k; kk++)
            for (size_t byte = cols * es; byte < GEMM_NR * es; byte++)
                CHECK(last[(size_t)kk * GEMM_NR * es + byte] == 0);
    }
}

/* ---- portable kernel: the reference order, lane by lane with fmaf ---- */

/* The 16 f32 weights of row kk of a panel. */
static void gemm_panel_row(gemm_wtype type, const uint8_t *panel, uint32_t kk, float wv[GEMM_NR])
{
    switch (type) {
    case GEMM_W_F32:
        memcpy(wv, panel + (size_t)kk * GEMM_NR * 4, GEMM_NR * 4);
        break;
    case GEMM_W_F16:
    case GEMM_W_BF16: {
        const uint8_t *r = panel + (size_t)kk * GEMM_NR * 2;
        for (uint32_t l = 0; l < GEMM_NR; l++)
            wv[l] = type == GEMM_W_F16 ? pd_f16_to_f32(gemm_rd16(r + 2 * l))
                                       : pd_bf16_to_f32(gemm_rd16(r + 2 * l));
        break;
    }
    case GEMM_W_Q8_0: {
        const uint8_t *blk = panel + (size_t)(kk / GEMM_Q8_0_BLOCK) * GEMM_Q8_PANEL_BLOCK;
        const uint8_t *q = blk + GEMM_Q8_SCALES + (kk % GEMM_Q8_0_BLOCK) * GEMM_NR;
        for (uint32_t l = 0; l < GEMM_NR; l++)
            wv[l] = (float)(int8_t)q[l] * pd_f16_to_f32(gemm_rd16(blk + 2 * l));
        break;
    }
    default: {
        CHECK(gemm_wtype_is_qs(type));
        const uint32_t b = kk / GEMM_QS_BLOCK, kb = kk % GEMM_QS_BLOCK;
        for (uint32_t l = 0; l < GEMM_NR; l++) {
            float sv[2], nm;
            gemm_qs_panel_scales(type, panel, b, l, sv, &nm);
            wv[l] = fmaf(sv[kb / 16], (float)gemm_qs_panel_q(type, panel, b, kb, l), nm);
        }
        break;
    }
    }
}

/* Also the qs types' tiles on AVX2 and AVX-512 (where gemm_task sends every
 * block of 2+ rows to the blocked path, so they run only if that changes):
 * up to GEMM_MR512 rows. */
static void gemm_scalar_tile(const gemm_tile *t)
{
    float acc[GEMM_MR512][GEMM_NR];
    float wv[GEMM_NR];
    for (uint32_t i = 0; i < t->mr; i++)
        for (uint32_t l = 0; l < GEMM_NR; l++)
            acc[i][l] = 0.0f;
    for (uint32_t kk = 0; kk < t->k; kk++) {
        gemm_panel_row(t->type, t->panel, kk, wv);
        for (uint32_t i = 0; i < t->mr; i++) {
            float av = t->a[(size_t)i * t->lda + kk];
            for (uint32_t l = 0; l < GEMM_NR; l++)
                acc[i][l] = fmaf(av, wv[l], acc[i][l]);
        }
    }
    for (uint32_t i = 0; i < t->mr; i++)
        memcpy(t->c + (size_t)i * t->ldc, acc[i], (size_t)t->ncols * sizeof(float));
}

/* ---- the int8 arithmetic (gemm.h): activation quantization and the
 * portable tile, the reference the VNNI kernels match bit for bit ---- */

/* Where value k (0..31) of a block goes: natural, or with perm each 8 k as
 * 0 2 4 6 1 3 5 7 (gemm_qa). */
static inline uint32_t gemm_q8_slot(uint32_t k, bool perm)
{
    return perm ? (k & ~7u) | ((k & 1u) << 2) | ((k & 7u) >> 1) : k;
}

void gemm_q8_row(const float *a, uint32_t nb, bool perm, int8_t *q, float *d, int32_t *s)
{
    /* adding and subtracting 1.5 * 2^23 rounds |x| < 2^22 to the nearest
     * integer, ties to even, in the default rounding mode: nearbyintf
     * without its cost */
    const float magic = 12582912.0f;
    for (uint32_t b = 0; b < nb; b++, a += GEMM_QS_BLOCK, q += GEMM_QS_BLOCK) {
        float amax = 0.0f;
        for (uint32_t k = 0; k < GEMM_QS_BLOCK; k++) {
            const float x = fabsf(a[k]);
            amax = x > amax ? x : amax;
        }
        const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        int32_t sa = 0, sb = 0;
        for (uint32_t k = 0; k < GEMM_QS_BLOCK; k++) {
            float x = a[k] * id;
            x = x > 127.0f ? 127.0f : x < -127.0f ? -127.0f : x; /* NaN stays */
            const int32_t v = x == x ? (int32_t)((x + magic) - magic) : 0;
            q[gemm_q8_slot(k, perm)] = (int8_t)v;
            if (k < 16)
                sa += v;
            else
                sb += v;
        }
        d[b] = pd_f16_to_f32(pd_f32_to_f16(dd));
        s[2 * b] = sa;
        s[2 * b + 1] = sb;
    }
}

/* The integer value of k row kk of block b, column l, of a Q8_0 or qs
 * panel: gemm_qs_block's q. */
static int gemm_q8_panel_q(gemm_wtype type, const uint8_t *panel, uint32_t b, uint32_t kk, uint32_t l)
{
    if (type == GEMM_W_Q8_0)
        return (int8_t)panel[(size_t)b * GEMM_Q8_PANEL_BLOCK + GEMM_Q8_SCALES + kk * GEMM_NR + l];
    return gemm_qs_panel_q(type, panel, b, kk, l);
}

/* One C element's chain over the tile's blocks: gemm.h's steps, lane l,
 * quantized row qr (natural order). */
static float gemm_q8_chain(const gemm_qtile *t, uint32_t l, const int8_t *q, const float *da, const int32_t *sab,
                           float c)
{
    const gemm_wtype type = t->type;
    const bool has_nm = gemm_wtype_has_nm(type);
    for (uint32_t b = 0; b < t->nb; b++, q += GEMM_QS_BLOCK) {
        const uint32_t bi = t->b0 + b;
        int32_t ia = 0, ib = 0;
        for (uint32_t kk = 0; kk < GEMM_QS_BLOCK; kk++) {
            const int32_t p = gemm_q8_panel_q(type, t->panel, bi, kk, l) * q[kk];
            if (kk < 16)
                ia += p;
            else
                ib += p;
        }
        float sv[2], nm;
        if (type == GEMM_W_Q8_0) {
            sv[0] = sv[1] = pd_f16_to_f32(gemm_rd16(t->panel + (size_t)bi * GEMM_Q8_PANEL_BLOCK + 2 * l));
            nm = -0.0f;
        } else {
            gemm_qs_panel_scales(type, t->panel, bi, l, sv, &nm);
        }
        float x = type == GEMM_W_Q6_K ? fmaf(sv[1], (float)ib, sv[0] * (float)ia) : sv[0] * (float)(ia + ib);
        if (has_nm)
            x = fmaf(nm, (float)(sab[2 * b] + sab[2 * b + 1]), x);
        c = fmaf(da[b], x, c);
    }
    return c;
}

static void gemm_scalar_qtile(const gemm_qtile *t)
{
    const size_t rs = t->qa.nb;
    for (uint32_t i = 0; i < t->mr; i++)
        for (uint32_t l = 0; l < t->ncols; l++) {
            float *c = t->c + (size_t)i * t->ldc + l;
            *c = gemm_q8_chain(t, l, t->qa.q + 32 * rs * i, t->qa.d + rs * i, t->qa.s + 2 * rs * i,
                               t->first ? 0.0f : *c);
        }
}

static gemm_qtile_fn *const gemm_scalar_qtiles[GEMM_MR8] = {
    gemm_scalar_qtile, gemm_scalar_qtile, gemm_scalar_qtile, gemm_scalar_qtile,
    gemm_scalar_qtile, gemm_scalar_qtile, gemm_scalar_qtile, gemm_scalar_qtile,
};

/* ---- AVX2/FMA kernel: the same order, 6 x 16 accumulators in registers ---- */

#if defined(__x86_64__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

#include "cluster/model/gemm_qs_sse.h"


/* Stores one accumulator row (two ymm) into ncols floats of C. */
static inline __attribute__((always_inline)) void gemm_avx2_store(float *c, __m256 x0, __m256 x1,
                                                                  uint32_t ncols)
{
    if (ncols == GEMM_NR) {
        _mm256_storeu_ps(c, x0);
        _mm256_storeu_ps(c + 8, x1);
        return;
    }
    float tmp[GEMM_NR];
    _mm256_storeu_ps(tmp, x0);
    _mm256_storeu_ps(tmp + 8, x1);
    memcpy(c, tmp, (size_t)ncols * sizeof(float));
}

/* Accumulators are named variables (c<row><half>): gcc 12 keeps them in
 * registers, where an array of __m256 was spilled every k (ARCHITECTURE.md §8).
 * mr and type are compile-time constants in every instantiation below, so
 * the row guards and type branches fold away. */
#define GEMM_AVX2_ROW(i, kk)                                                     \
    if (mr > i) {                                                                \
        __m256 b = _mm256_broadcast_ss(a##i + (kk));                             \
        c##i##0 = _mm256_fmadd_ps(b, w0, c##i##0);                               \
        c##i##1 = _mm256_fmadd_ps(b, w1, c##i##1);                               \
    }
#define GEMM_AVX2_STEP(kk)                                                       \
    GEMM_AVX2_ROW(0, kk) GEMM_AVX2_ROW(1, kk) GEMM_AVX2_ROW(2, kk)               \
    GEMM_AVX2_ROW(3, kk) GEMM_AVX2_ROW(4, kk) GEMM_AVX2_ROW(5, kk)

/* A tile's row pointers a0..a5 (rows past mr alias row 0 and are never
 * read) and its 6 x 2 accumulators, zero. */
#define GEMM_AVX2_TILE_VARS(a, lda, mr)                                          \
    GEMM_TILE_ROWS(a, lda, mr)                                                   \
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00;           \
    __m256 c20 = c00, c21 = c00, c30 = c00, c31 = c00;                           \
    __m256 c40 = c00, c41 = c00, c50 = c00, c51 = c00;

/* Stores the tile's mr accumulator rows into C (ncols valid columns). */
#define GEMM_AVX2_TILE_STORE(c, ldc, mr, ncols)                                  \
    gemm_avx2_store((c), c00, c01, (ncols));                                     \
    if ((mr) > 1) gemm_avx2_store((c) + (ldc), c10, c11, (ncols));               \
    if ((mr) > 2) gemm_avx2_store((c) + 2 * (ldc), c20, c21, (ncols));           \
    if ((mr) > 3) gemm_avx2_store((c) + 3 * (ldc), c30, c31, (ncols));           \
    if ((mr) > 4) gemm_avx2_store((c) + 4 * (ldc), c40, c41, (ncols));           \
    if ((mr) > 5) gemm_avx2_store((c) + 5 * (ldc), c50, c51, (ncols));

/* A qs block's scales for the AVX2 kernels, into sv: [0..15] s of k 0..15,
 * [16..31] s of k 16..31, [32..47] nm; computed from the group header grp
 * and block header blk with the f32 operations of gemm_qs_panel_scales. */
static inline __attribute__((always_inline)) void gemm_avx2_qs_scales(const uint8_t *grp, const uint8_t *blk,
                                                                      float *sv, const gemm_wtype type)
{
    const gemm_qs_fmt f = gemm_qs_fmt_of(type);
    for (uint32_t h = 0; h < 2; h++) { /* columns 8 h .. 8 h + 7 */
        const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + 16 * h)));
        __m256 s0 = d, s1 = d, nm = _mm256_set1_ps(-0.0f);
        const __m256 e = f.gh == 64 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(grp + 32 + 16 * h)))
                                    : nm;
        if (type == GEMM_W_Q4_K || type == GEMM_W_Q5_K) {
            const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 8 * h))));
            const __m256 m =
                _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 16 + 8 * h))));
            s0 = s1 = _mm256_mul_ps(d, sc);
            nm = _mm256_xor_ps(_mm256_mul_ps(e, m), _mm256_set1_ps(-0.0f));
        } else if (type == GEMM_W_Q6_K) {
            s0 = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 8 * h)))));
            s1 = _mm256_mul_ps(
                d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 16 + 8 * h)))));
        } else if (f.gh == 64) {
            nm = e;
        }
        _mm256_storeu_ps(sv + 8 * h, s0);
        _mm256_storeu_ps(sv + 16 + 8 * h, s1);
        _mm256_storeu_ps(sv + 32 + 8 * h, nm);
    }
}

/* A qs k row's 16 weights from its q bytes qv and the block's scales sv
 * (gemm_avx2_qs_scales; hi: k 16..31): fmaf(s, (float)q, nm) lane by lane,
 * as the portable path computes it. */
#define GEMM_AVX2_QSW(qv, sv, hi, w0, w1)                                                          \
    do {                                                                                           \
        w0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(qv)),                         \
                             _mm256_loadu_ps((sv) + 16 * (hi)), _mm256_loadu_ps((sv) + 32));       \
        w1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(qv, qv))), \
                             _mm256_loadu_ps((sv) + 16 * (hi) + 8), _mm256_loadu_ps((sv) + 40));  \
    } while (0)

static inline __attribute__((always_inline)) void
gemm_avx2_tile_impl(const gemm_tile *t, const uint32_t mr, const gemm_wtype type)
{
    const size_t lda = t->lda;
    GEMM_AVX2_TILE_VARS(t->a, lda, mr)
    const uint8_t *pn = t->panel;
    const uint32_t k = t->k;
    if (type == GEMM_W_Q8_0) {
        for (uint32_t kb = 0; kb < k; kb += GEMM_Q8_0_BLOCK, pn += GEMM_Q8_PANEL_BLOCK) {
            const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pn));
            const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pn + 16)));
            const uint8_t *q = pn + GEMM_Q8_SCALES;
            if (mr > 1)
                for (uint32_t line = 0; line < GEMM_Q8_PANEL_BLOCK; line += 64)
                    _mm_prefetch((const char *)pn + GEMM_PREFETCH + line, _MM_HINT_T0);
            for (uint32_t kk = kb; kk < kb + GEMM_Q8_0_BLOCK; kk++, q += GEMM_NR) {
                /* (float)q * d: one exact multiply, as in the portable path */
                __m256 w0 = _mm256_mul_ps(
                    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q))),
                    d0);
                __m256 w1 = _mm256_mul_ps(
                    _mm256_cvtepi32_ps(
                        _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8)))),
                    d1);
                GEMM_AVX2_STEP(kk)
            }
        }
    } else {
        for (uint32_t kk = 0; kk < k; kk++) {
            __m256 w0, w1;
            if (type == GEMM_W_F32) {
                w0 = _mm256_loadu_ps((const float *)pn);
                w1 = _mm256_loadu_ps((const float *)pn + 8);
                if (mr > 1)
                    _mm_prefetch((const char *)pn + GEMM_PREFETCH, _MM_HINT_T0);
                pn += GEMM_NR * 4;
            } else if (type == GEMM_W_F16) {
                w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)pn));
                w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(pn + 16)));
                if (mr > 1)
                    _mm_prefetch((const char *)pn + GEMM_PREFETCH, _MM_HINT_T0);
                pn += GEMM_NR * 2;
            } else {
                __m256i x0 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)pn));
                __m256i x1 = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(pn + 16)));
                w0 = _mm256_castsi256_ps(_mm256_slli_epi32(x0, 16));
                w1 = _mm256_castsi256_ps(_mm256_slli_epi32(x1, 16));
                if (mr > 1)
                    _mm_prefetch((const char *)pn + GEMM_PREFETCH, _MM_HINT_T0);
                pn += GEMM_NR * 2;
            }
            GEMM_AVX2_STEP(kk)
        }
    }
    const size_t ldc = t->ldc;
    GEMM_AVX2_TILE_STORE(t->c, ldc, mr, t->ncols)
}


/* The 16 f32 weights of one k row of a 16-bit or f32 panel. */
#define GEMM_AVX2_LOADW(type, p, w0, w1)                                                \
    do {                                                                                \
        if (type == GEMM_W_F32) {                                                       \
            w0 = _mm256_loadu_ps((const float *)(p));                                   \
            w1 = _mm256_loadu_ps((const float *)(p) + 8);                               \
        } else if (type == GEMM_W_F16) {                                                \
            w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p)));                \
            w1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((p) + 16)));         \
        } else {                                                                        \
            w0 = _mm256_castsi256_ps(_mm256_slli_epi32(                                 \
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p))), 16));     \
            w1 = _mm256_castsi256_ps(_mm256_slli_epi32(                                 \
                _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((p) + 16))), 16)); \
        }                                                                               \
    } while (0)

/* Panel j's k row of Q8_0 weights: (float)q * d, one exact multiply. */
#define GEMM_AVX2_Q8W(q, d0, d1, w0, w1)                                                \
    do {                                                                                \
        w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(                     \
                               _mm_loadl_epi64((const __m128i *)(q)))), d0);            \
        w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(                     \
                               _mm_loadl_epi64((const __m128i *)((q) + 8)))), d1);      \
    } while (0)

#define GEMM_AVX2_RFMA(j)                                                               \
    r##j##0 = _mm256_fmadd_ps(b, w0, r##j##0);                                          \
    r##j##1 = _mm256_fmadd_ps(b, w1, r##j##1);

static inline __attribute__((always_inline)) void
gemm_avx2_row_impl(const gemm_row *t, const uint32_t np, const gemm_wtype type)
{
    GEMM_ROW_PANEL_PTRS(t, np)
    const float *a = t->a;
    __m256 r00 = _mm256_setzero_ps(), r01 = r00, r10 = r00, r11 = r00;
    __m256 r20 = r00, r21 = r00, r30 = r00, r31 = r00;
    __m256 w0, w1;
    const uint32_t k = t->k;
    if (gemm_wtype_is_qs(type)) {
        const gemm_qs_fmt f = gemm_qs_fmt_of(type);
        _Alignas(32) float sv[GEMM_ROW_PANELS][48];
        for (uint32_t kb = 0; kb < k; kb += GEMM_QS_BLOCK) {
            const uint32_t bi = kb / GEMM_QS_BLOCK;
            const size_t go = gemm_qs_group_off(f, bi), off = gemm_qs_block_off(f, bi);
            const uint8_t *b0 = p0 + off, *b1 = p1 + off, *b2 = p2 + off, *b3 = p3 + off;
            gemm_avx2_qs_scales(p0 + go, b0, sv[0], type);
            if (np > 1) gemm_avx2_qs_scales(p1 + go, b1, sv[1], type);
            if (np > 2) gemm_avx2_qs_scales(p2 + go, b2, sv[2], type);
            if (np > 3) gemm_avx2_qs_scales(p3 + go, b3, sv[3], type);
            const size_t pfo = gemm_row_prefetch_offset(off, ps, np, type);
            for (uint32_t kq = 0; kq < GEMM_QS_BLOCK; kq += 8) {
                const uint32_t hi = kq >= 16;
#pragma GCC unroll 8
                for (uint32_t r = 0; r < 8; r++) {
                    gemm_row_qs_prefetch(b0, b1, b2, b3, np, pfo, kq + r, f);
                    const __m256 b = _mm256_broadcast_ss(a + kb + kq + r);
#define GEMM_AVX2_QSROW(j)                                                       \
    {                                                                            \
        const __m128i qv = gemm_qs_row_q(b##j + f.bh, kq, r, type);              \
        GEMM_AVX2_QSW(qv, sv[j], hi, w0, w1);                                    \
        GEMM_AVX2_RFMA(j)                                                        \
    }
                    GEMM_AVX2_QSROW(0)
                    if (np > 1) GEMM_AVX2_QSROW(1)
                    if (np > 2) GEMM_AVX2_QSROW(2)
                    if (np > 3) GEMM_AVX2_QSROW(3)
#undef GEMM_AVX2_QSROW
                }
            }
        }
    } else if (type == GEMM_W_Q8_0) {
        for (uint32_t kb = 0; kb < k; kb += GEMM_Q8_0_BLOCK) {
            size_t off = (size_t)(kb / GEMM_Q8_0_BLOCK) * GEMM_Q8_PANEL_BLOCK;
            const uint8_t *b0 = p0 + off, *b1 = p1 + off, *b2 = p2 + off, *b3 = p3 + off;
            __m256 d00 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b0));
            __m256 d01 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b0 + 16)));
            __m256 d10 = d00, d11 = d01, d20 = d00, d21 = d01, d30 = d00, d31 = d01;
            if (np > 1) {
                d10 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b1));
                d11 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b1 + 16)));
            }
            if (np > 2) {
                d20 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b2));
                d21 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b2 + 16)));
            }
            if (np > 3) {
                d30 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)b3));
                d31 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(b3 + 16)));
            }
            const size_t pfo = gemm_row_prefetch_offset(off, ps, np, type);
            for (uint32_t kk = 0; kk < GEMM_Q8_0_BLOCK; kk++) {
                gemm_row_q8_prefetch(b0, b1, b2, b3, np, pfo, kk);
                const __m256 b = _mm256_broadcast_ss(a + kb + kk);
                const size_t qo = GEMM_Q8_SCALES + (size_t)kk * GEMM_NR;
                GEMM_AVX2_Q8W(b0 + qo, d00, d01, w0, w1);
                GEMM_AVX2_RFMA(0)
                if (np > 1) {
                    GEMM_AVX2_Q8W(b1 + qo, d10, d11, w0, w1);
                    GEMM_AVX2_RFMA(1)
                }
                if (np > 2) {
                    GEMM_AVX2_Q8W(b2 + qo, d20, d21, w0, w1);
                    GEMM_AVX2_RFMA(2)
                }
                if (np > 3) {
                    GEMM_AVX2_Q8W(b3 + qo, d30, d31, w0, w1);
                    GEMM_AVX2_RFMA(3)
                }
            }
        }
    } else {
        const size_t es = type == GEMM_W_F32 ? 4 : 2, rs = GEMM_NR * es;
        for (uint32_t kk = 0; kk < k; kk++) {
            const __m256 b = _mm256_broadcast_ss(a + kk);
            const size_t o = (size_t)kk * rs, pfo = o + gemm_row_prefetch_offset(o, ps, np, type);
            /* 4 streams: software prefetch lifts 16-bit weights ~10% here */
            _mm_prefetch((const char *)p0 + pfo, _MM_HINT_T0);
            if (np > 1) _mm_prefetch((const char *)p1 + pfo, _MM_HINT_T0);
            if (np > 2) _mm_prefetch((const char *)p2 + pfo, _MM_HINT_T0);
            if (np > 3) _mm_prefetch((const char *)p3 + pfo, _MM_HINT_T0);
            GEMM_AVX2_LOADW(type, p0 + o, w0, w1);
            GEMM_AVX2_RFMA(0)
            if (np > 1) {
                GEMM_AVX2_LOADW(type, p1 + o, w0, w1);
                GEMM_AVX2_RFMA(1)
            }
            if (np > 2) {
                GEMM_AVX2_LOADW(type, p2 + o, w0, w1);
                GEMM_AVX2_RFMA(2)
            }
            if (np > 3) {
                GEMM_AVX2_LOADW(type, p3 + o, w0, w1);
                GEMM_AVX2_RFMA(3)
            }
        }
    }
    /* every panel but the last of the group is full */
    gemm_avx2_store(t->c, r00, r01, np > 1 ? GEMM_NR : t->ncols_last);
    if (np > 1) gemm_avx2_store(t->c + GEMM_NR, r10, r11, np > 2 ? GEMM_NR : t->ncols_last);
    if (np > 2) gemm_avx2_store(t->c + 2 * GEMM_NR, r20, r21, np > 3 ? GEMM_NR : t->ncols_last);
    if (np > 3) gemm_avx2_store(t->c + 3 * GEMM_NR, r30, r31, t->ncols_last);
}

/* ---- blocked path: blocks of many rows ---- */

/* Loads ncols floats of C, the rest zero (they are never stored). */
static inline __attribute__((always_inline)) void gemm_avx2_load(const float *c, __m256 *x0, __m256 *x1,
                                                                 uint32_t ncols)
{
    if (ncols == GEMM_NR) {
        *x0 = _mm256_loadu_ps(c);
        *x1 = _mm256_loadu_ps(c + 8);
        return;
    }
    float tmp[GEMM_NR] = {0};
    memcpy(tmp, c, (size_t)ncols * sizeof(float));
    *x0 = _mm256_loadu_ps(tmp);
    *x1 = _mm256_loadu_ps(tmp + 8);
}

/* One k of a chunk tile: the chunk's 16 f32 weights at k, every row's FMAs. */
#define GEMM_AVX2_CHUNK_K(pw, kk)                                                \
    {                                                                            \
        const float *wk = (pw) + (size_t)(kk) * GEMM_NR;                         \
        __m256 w0 = _mm256_loadu_ps(wk), w1 = _mm256_loadu_ps(wk + 8);          \
        GEMM_AVX2_STEP(kk)                                                       \
    }

/* spread: prefetch t->pf's bytes over the k loop (f32 chunks, read in
 * place: the first tile reads them from memory). The other kernels leave it
 * to the caller (gemm_block): a burst before each tile suits them. */
static inline __attribute__((always_inline)) void gemm_avx2_ctile_impl(const gemm_ctile *t, const uint32_t mr,
                                                                       const bool spread)
{
    const size_t lda = t->lda, ldc = t->ldc;
    GEMM_AVX2_TILE_VARS(t->a, lda, mr)
    if (!t->first) {
        gemm_avx2_load(t->c, &c00, &c01, t->ncols);
        if (mr > 1) gemm_avx2_load(t->c + ldc, &c10, &c11, t->ncols);
        if (mr > 2) gemm_avx2_load(t->c + 2 * ldc, &c20, &c21, t->ncols);
        if (mr > 3) gemm_avx2_load(t->c + 3 * ldc, &c30, &c31, t->ncols);
        if (mr > 4) gemm_avx2_load(t->c + 4 * ldc, &c40, &c41, t->ncols);
        if (mr > 5) gemm_avx2_load(t->c + 5 * ldc, &c50, &c51, t->ncols);
    }
    /* separate row pointers: gcc otherwise rebuilds rows 2..5 from lda
     * every k, which costs more issue slots than the FMAs leave */
    __asm__("" : "+r"(a1), "+r"(a2), "+r"(a3), "+r"(a4), "+r"(a5));
    const float *pw = t->w;
    const uint32_t kn = t->kn;
    /* the plain loop: the segmented one below cost blocks of 64-277 rows
     * 7-10 % on two threads even with nothing to prefetch */
    if (!spread) {
#pragma GCC unroll 4
        for (uint32_t kk = 0; kk < kn; kk++)
            GEMM_AVX2_CHUNK_K(pw, kk)
        GEMM_AVX2_TILE_STORE(t->c, ldc, mr, t->ncols)
        return;
    }
    /* one line every `every` k, so the slice ends with the loop */
    const uint8_t *pf = t->pf;
    size_t lines = t->pf_len / 64;
    uint32_t every = lines ? (uint32_t)((kn + lines - 1) / lines) : kn;
    for (uint32_t kk = 0; kk < kn;) {
        uint32_t kend = kn - kk > every ? kk + every : kn;
        if (lines) {
            _mm_prefetch((const char *)pf, _MM_HINT_T0);
            pf += 64;
            lines--;
        }
#pragma GCC unroll 4
        for (; kk < kend; kk++)
            GEMM_AVX2_CHUNK_K(pw, kk)
    }
    GEMM_AVX2_TILE_STORE(t->c, ldc, mr, t->ncols)
}

/* A chunk of kn k values from its packed bytes src as f32 [kn][16]: the
 * values gemm_panel_row gives (Q8_0: kn is a multiple of 32 and src starts a
 * block). An f32 chunk is used in place; other types are converted into
 * buf. */
static inline __attribute__((always_inline)) const float *
gemm_avx2_chunk_impl(const uint8_t *src, uint32_t kn, float *buf, const gemm_wtype type)
{
    if (gemm_chunk_in_place(type))
        return (const float *)src;
    float *dst = buf;
    if (gemm_wtype_is_qs(type)) {
        /* src starts a group (chunks are whole groups) */
        const gemm_qs_fmt f = gemm_qs_fmt_of(type);
        _Alignas(32) float sv[48];
        for (uint32_t bi = 0; bi < kn / GEMM_QS_BLOCK; bi++) {
            const uint8_t *blk = src + gemm_qs_block_off(f, bi);
            gemm_avx2_qs_scales(src + gemm_qs_group_off(f, bi), blk, sv, type);
            for (uint32_t kq = 0; kq < GEMM_QS_BLOCK; kq += 8) {
                const uint32_t hi = kq >= 16;
#pragma GCC unroll 8
                for (uint32_t r = 0; r < 8; r++, dst += GEMM_NR) {
                    const __m128i qv = gemm_qs_row_q(blk + f.bh, kq, r, type);
                    __m256 w0, w1;
                    GEMM_AVX2_QSW(qv, sv, hi, w0, w1);
                    _mm256_store_ps(dst, w0);
                    _mm256_store_ps(dst + 8, w1);
                }
            }
        }
        return buf;
    }
    if (type == GEMM_W_Q8_0) {
        const uint8_t *blk = src;
        for (uint32_t kb = 0; kb < kn; kb += GEMM_Q8_0_BLOCK, blk += GEMM_Q8_PANEL_BLOCK) {
            const __m256 d0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)blk));
            const __m256 d1 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(blk + 16)));
            const uint8_t *q = blk + GEMM_Q8_SCALES;
            for (uint32_t kk = 0; kk < GEMM_Q8_0_BLOCK; kk++, q += GEMM_NR, dst += GEMM_NR) {
                __m256 w0, w1;
                GEMM_AVX2_Q8W(q, d0, d1, w0, w1);
                _mm256_store_ps(dst, w0);
                _mm256_store_ps(dst + 8, w1);
            }
        }
        return buf;
    }
    const uint8_t *p = src;
    for (uint32_t kk = 0; kk < kn; kk++, p += GEMM_NR * 2, dst += GEMM_NR) {
        __m256 w0, w1;
        GEMM_AVX2_LOADW(type, p, w0, w1);
        _mm256_store_ps(dst, w0);
        _mm256_store_ps(dst + 8, w1);
    }
    return buf;
}

#define GEMM_AVX2_CHUNKFN(tname, type)                                           \
    static const float *gemm_avx2_chunk_##tname(const uint8_t *src, uint32_t kn, float *buf) \
    {                                                                            \
        return gemm_avx2_chunk_impl(src, kn, buf, type);                         \
    }
GEMM_AVX2_CHUNKFN(f32, GEMM_W_F32)
GEMM_AVX2_CHUNKFN(f16, GEMM_W_F16)
GEMM_AVX2_CHUNKFN(bf16, GEMM_W_BF16)
GEMM_AVX2_CHUNKFN(q8_0, GEMM_W_Q8_0)
GEMM_AVX2_CHUNKFN(q4_0, GEMM_W_Q4_0)
GEMM_AVX2_CHUNKFN(q5_0, GEMM_W_Q5_0)
GEMM_AVX2_CHUNKFN(q4_1, GEMM_W_Q4_1)
GEMM_AVX2_CHUNKFN(q5_1, GEMM_W_Q5_1)
GEMM_AVX2_CHUNKFN(q4_K, GEMM_W_Q4_K)
GEMM_AVX2_CHUNKFN(q5_K, GEMM_W_Q5_K)
GEMM_AVX2_CHUNKFN(q6_K, GEMM_W_Q6_K)

#define GEMM_AVX2_CTILEFN(mr)                                                    \
    static void gemm_avx2_ctile_##mr(const gemm_ctile *t) { gemm_avx2_ctile_impl(t, mr, false); } \
    static void gemm_avx2_ctilepf_##mr(const gemm_ctile *t) { gemm_avx2_ctile_impl(t, mr, true); }
GEMM_AVX2_CTILEFN(1)
GEMM_AVX2_CTILEFN(2)
GEMM_AVX2_CTILEFN(3)
GEMM_AVX2_CTILEFN(4)
GEMM_AVX2_CTILEFN(5)
GEMM_AVX2_CTILEFN(6)

#define GEMM_AVX2_ROWFN(tname, type, np)                                         \
    static void gemm_avx2_row_##tname##_##np(const gemm_row *t)                  \
    {                                                                            \
        gemm_avx2_row_impl(t, np, type);                                         \
    }
#define GEMM_AVX2_ROWFNS_OF(tname, type)                                         \
    GEMM_AVX2_ROWFN(tname, type, 1) GEMM_AVX2_ROWFN(tname, type, 2)              \
    GEMM_AVX2_ROWFN(tname, type, 3) GEMM_AVX2_ROWFN(tname, type, 4)

#define GEMM_AVX2_FN(tname, type, mr)                                            \
    static void gemm_avx2_##tname##_##mr(const gemm_tile *t)                     \
    {                                                                            \
        gemm_avx2_tile_impl(t, mr, type);                                        \
    }
#define GEMM_AVX2_FNS(tname, type)                                               \
    GEMM_AVX2_FN(tname, type, 1) GEMM_AVX2_FN(tname, type, 2)                    \
    GEMM_AVX2_FN(tname, type, 3) GEMM_AVX2_FN(tname, type, 4)                    \
    GEMM_AVX2_FN(tname, type, 5) GEMM_AVX2_FN(tname, type, 6)
GEMM_AVX2_FNS(f32, GEMM_W_F32)
GEMM_AVX2_FNS(f16, GEMM_W_F16)
GEMM_AVX2_FNS(bf16, GEMM_W_BF16)
GEMM_AVX2_FNS(q8_0, GEMM_W_Q8_0)
GEMM_AVX2_ROWFNS_OF(f32, GEMM_W_F32)
GEMM_AVX2_ROWFNS_OF(f16, GEMM_W_F16)
GEMM_AVX2_ROWFNS_OF(bf16, GEMM_W_BF16)
GEMM_AVX2_ROWFNS_OF(q8_0, GEMM_W_Q8_0)
GEMM_AVX2_ROWFNS_OF(q4_0, GEMM_W_Q4_0)
GEMM_AVX2_ROWFNS_OF(q5_0, GEMM_W_Q5_0)
GEMM_AVX2_ROWFNS_OF(q4_1, GEMM_W_Q4_1)
GEMM_AVX2_ROWFNS_OF(q5_1, GEMM_W_Q5_1)
GEMM_AVX2_ROWFNS_OF(q4_K, GEMM_W_Q4_K)
GEMM_AVX2_ROWFNS_OF(q5_K, GEMM_W_Q5_K)
GEMM_AVX2_ROWFNS_OF(q6_K, GEMM_W_Q6_K)

#pragma GCC pop_options

/* no qs tiles: see gemm_tiles_for */
static gemm_tile_fn *const gemm_avx2_tiles[GEMM_W_COUNT][GEMM_MR] = GEMM_BY_TYPE(GEMM_BY_MR, gemm_avx2_);
static gemm_row_fn *const gemm_avx2_rows[GEMM_W_COUNT][GEMM_ROW_PANELS] = GEMM_BY_TYPE_QS(GEMM_BY_NP, gemm_avx2_row_);
static gemm_ctile_fn *const gemm_avx2_ctiles[GEMM_MR] = GEMM_BY_MR(gemm_avx2_ctile_);
static gemm_ctile_fn *const gemm_avx2_ctilepfs[GEMM_MR] = GEMM_BY_MR(gemm_avx2_ctilepf_);
static gemm_chunk_fn *const gemm_avx2_chunks[GEMM_W_COUNT] = {
    [GEMM_W_F32] = gemm_avx2_chunk_f32,
    [GEMM_W_F16] = gemm_avx2_chunk_f16,
    [GEMM_W_BF16] = gemm_avx2_chunk_bf16,
    [GEMM_W_Q8_0] = gemm_avx2_chunk_q8_0,
    [GEMM_W_Q4_0] = gemm_avx2_chunk_q4_0,
    [GEMM_W_Q5_0] = gemm_avx2_chunk_q5_0,
    [GEMM_W_Q4_1] = gemm_avx2_chunk_q4_1,
    [GEMM_W_Q5_1] = gemm_avx2_chunk_q5_1,
    [GEMM_W_Q4_K] = gemm_avx2_chunk_q4_K,
    [GEMM_W_Q5_K] = gemm_avx2_chunk_q5_K,
    [GEMM_W_Q6_K] = gemm_avx2_chunk_q6_K,
};
#endif

static gemm_tile_fn *const gemm_scalar_tiles[GEMM_MR512] = {
    gemm_scalar_tile, gemm_scalar_tile, gemm_scalar_tile, gemm_scalar_tile,
    gemm_scalar_tile, gemm_scalar_tile, gemm_scalar_tile, gemm_scalar_tile,
    gemm_scalar_tile, gemm_scalar_tile, gemm_scalar_tile, gemm_scalar_tile,
};

/* The tile height of the ISA's kernels. */
static uint32_t gemm_mr_for(pd_isa isa)
{
#if defined(__x86_64__)
    if (isa >= PD_ISA_AVX512)
        return GEMM_MR512;
#endif
    (void)isa;
    return GEMM_MR;
}

/* The micro-kernels (indexed by mr - 1) and the single-row multi-panel
 * kernels (indexed by np - 1, or NULL: use the tiles) for a weight type on
 * the ISA in force. */
static gemm_tile_fn *const *gemm_tiles_for(pd_isa isa, gemm_wtype type)
{
#if defined(__x86_64__)
    /* the qs types have AVX-512 tiles only: on AVX2 one row takes the row
     * kernels, more the blocked path, which unpacks a chunk once for
     * every tile (gemm_block_min_rows); the portable tiles cover any other
     * case */
    if (isa >= PD_ISA_AVX512)
        return gemm_avx512_tiles[type];
    if (gemm_wtype_is_qs(type))
        return gemm_scalar_tiles;
    if (isa >= PD_ISA_AVX2)
        return gemm_avx2_tiles[type];
#endif
    return gemm_scalar_tiles;
}

static gemm_row_fn *const *gemm_rows_for(pd_isa isa, gemm_wtype type)
{
#if defined(__x86_64__)
    if (isa >= PD_ISA_AVX512)
        return gemm_avx512_rows[type];
    if (isa >= PD_ISA_AVX2)
        return gemm_avx2_rows[type];
#endif
    return NULL;
}

/* The blocked path's chunk kernels and converter, or NULL where the ISA has
 * none (the portable path runs tiles only). */
static gemm_ctile_fn *const *gemm_ctiles_for(pd_isa isa)
{
#if defined(__x86_64__)
    if (isa >= PD_ISA_AVX512)
        return gemm_avx512_ctiles;
    if (isa >= PD_ISA_AVX2)
        return gemm_avx2_ctiles;
#endif
    return NULL;
}

/* The chunk kernels that prefetch the next chunk over their k loop, for
 * chunks read in place (f32), or NULL (gemm_block). */
static gemm_ctile_fn *const *gemm_ctiles_spread_for(pd_isa isa, gemm_wtype type)
{
#if defined(__x86_64__)
    if (isa >= PD_ISA_AVX512 && gemm_chunk_in_place(type))
        return gemm_avx512_ctilepfs;
    if (isa >= PD_ISA_AVX2 && gemm_chunk_in_place(type))
        return gemm_avx2_ctilepfs;
#endif
    (void)isa;
    (void)type;
    return NULL;
}

static gemm_chunk_fn *gemm_chunk_for(pd_isa isa, gemm_wtype type)
{
#if defined(__x86_64__)
    if (isa >= PD_ISA_AVX2)
        return gemm_avx2_chunks[type];
#endif
    (void)type;
    return NULL;
}

/* The fewest rows of an M block that take the blocked path, by weight type
 * and tile height mr (from A/B runs of both paths on the decoder's shapes,
 * one and two threads). f32: any block of more than one tile, where the tile
 * path reads the panel from memory in its first tile with nothing to
 * overlap it and re-reads it from L2 in the rest (AVX2, M = 8: 24-34 ->
 * 33-49 GFLOP/s on one thread, 46-54 -> 65-72 on two). 16-bit and Q8_0:
 * below it the tile path's in-register conversion costs less than the
 * chunk's round trip through L1; F16 converts in one instruction, so it
 * gains later. AVX-512's 12-row tiles convert a weight row once per 12 rows,
 * which moves BF16's point from 16 to 32 rows (M = 16: 133-149 against
 * 120-133 GFLOP/s). The qs types: on AVX-512 never, their 12-row tiles
 * unpack a k row in registers once for 12 rows and beat the chunk's AVX2
 * unpacking through L1 at every M measured (one thread, cold, N = 896 and
 * 1280: M = 2 57 against 28-34 GFLOP/s, M = 6 154-158 against 79-96, M =
 * 32 167-177 against 144-163, M = 64-256 157-181 against 160-178); on
 * AVX2, which has no qs tiles (gemm_tiles_for), from 2 rows. Either path
 * gives the same bits. */
static uint32_t gemm_block_min_rows(gemm_wtype type, uint32_t mr)
{
    switch (type) {
    case GEMM_W_F32:
        return mr + 1;
    case GEMM_W_BF16:
        return mr > GEMM_MR ? 32 : 16;
    case GEMM_W_Q8_0:
        return 24;
    default:
        if (gemm_wtype_is_qs(type))
            return mr > GEMM_MR ? UINT32_MAX : 2;
        return 32;
    }
}

/* ---- tiling and threads ---- */

typedef struct gemm_job {
    const gemm_w *w;
    const float *a;
    size_t lda;
    uint32_t m;
    float *c;
    size_t ldc;
    uint32_t n_groups;          /* ceil(panels / GEMM_ROW_PANELS) */
    uint32_t n_panel_tasks;     /* panel ranges of near-equal group counts; task t
                                 * takes range t % n_panel_tasks (gemm_task_panels) */
    uint32_t mblocks_per_task;  /* ... and M blocks from (t / n_panel_tasks) * this */
    uint32_t mr;                /* the kernels' tile height: GEMM_MR or GEMM_MR512 */
    gemm_tile_fn *const *tiles; /* indexed by mr - 1 */
    gemm_row_fn *const *rows;   /* indexed by np - 1; NULL = tiles only */
    gemm_ctile_fn *const *ctiles; /* blocked path, by mr - 1; NULL = none */
    gemm_ctile_fn *const *ctiles_spread; /* ... prefetching over k; NULL = none */
    gemm_chunk_fn *chunk;
    gemm_qtile_fn *const *qtiles; /* int8 arithmetic, by mr - 1; NULL = none */
    gemm_qtile2_fn *const *qtiles2; /* the same two panels at once, or NULL */
    gemm_qtile_fn *const *qtiles_unp; /* tiles reading blocks unpacked by unpack, or NULL */
    gemm_unpack_fn *unpack;
    uint32_t unp_tiles;           /* ... from this many tiles in a block on */
    bool qperm;                   /* ... taking gemm_qa's perm order */
    void (*quant)(const float *, uint32_t, bool, int8_t *, float *, int32_t *); /* gemm_q8_row or its SIMD twin */
    const struct gemm_preq *pre; /* int8: A quantized once by the caller (gemm_prequant), or NULL */
} gemm_job;

/* Near-equal tile heights of at most mr for a block of `rows` rows (8 rows,
 * mr 6: 4 + 4, not 6 + 2): a short tile has few FMA chains and runs at the
 * FMA latency. Tile ti has base + (ti < taller) rows. */
static void gemm_tile_heights(uint32_t rows, uint32_t mr, uint32_t *n_tiles, uint32_t *base, uint32_t *taller)
{
    *n_tiles = (rows + mr - 1) / mr;
    *base = rows / *n_tiles;
    *taller = rows % *n_tiles;
}

/* The packed bytes of panel pnl's chunk at k0 (kn values): *len bytes from
 * the returned address. */
static const uint8_t *gemm_chunk_src(const gemm_w *w, uint32_t pnl, uint32_t k0, uint32_t kn, size_t *len)
{
    const uint8_t *panel = (const uint8_t *)w->data + (size_t)pnl * w->panel_bytes;
    if (gemm_wtype_is_qs(w->type)) {
        /* k0 starts a group: GEMM_KC is a whole number of groups */
        const gemm_qs_fmt f = gemm_qs_fmt_of(w->type);
        *len = gemm_qs_group_off(f, kn / GEMM_QS_BLOCK);
        return panel + gemm_qs_group_off(f, k0 / GEMM_QS_BLOCK);
    }
    if (w->type == GEMM_W_Q8_0) {
        *len = (size_t)(kn / GEMM_Q8_0_BLOCK) * GEMM_Q8_PANEL_BLOCK;
        return panel + (size_t)(k0 / GEMM_Q8_0_BLOCK) * GEMM_Q8_PANEL_BLOCK;
    }
    size_t es = w->type == GEMM_W_F32 ? 4 : 2;
    *len = (size_t)kn * GEMM_NR * es;
    return panel + (size_t)k0 * GEMM_NR * es;
}

/* Rows [mb, me) against panels [p0, p1) on the blocked path: panel by
 * panel, chunk by chunk of GEMM_KC k values, the chunk is made f32 once (in
 * place for f32 weights) and stays in L1 while every tile of the block runs
 * over it, continuing its chains from C (a tile's C rows stay in L1 across
 * the panel's chunks). The tile path instead re-reads a whole panel (up to
 * 438 KB at K = 6848) from L2 or beyond for every tile, and converts 16-bit
 * and Q8_0 weights once per tile. Each C element's chain is the same fmaf
 * sequence over k either way. */
static void gemm_block(const gemm_job *j, uint32_t p0, uint32_t p1, uint32_t mb, uint32_t me)
{
    const gemm_w *w = j->w;
    _Alignas(32) float buf[GEMM_KC * GEMM_NR];
    uint32_t n_tiles, base, taller;
    gemm_tile_heights(me - mb, j->mr, &n_tiles, &base, &taller);
    const uint8_t *end = (const uint8_t *)w->data + (size_t)p1 * w->panel_bytes;
    /* spread over a few tiles, where it was measured to gain (M = 7-24);
     * larger blocks keep the burst they were tuned with */
    const bool spread = j->ctiles_spread && n_tiles <= GEMM_SPREAD_MAX_TILES;
    gemm_ctile_fn *const *ctiles = spread ? j->ctiles_spread : j->ctiles;
    for (uint32_t pnl = p0; pnl < p1; pnl++) {
        uint32_t col0 = pnl * GEMM_NR;
        for (uint32_t k0 = 0; k0 < w->k; k0 += GEMM_KC) {
            uint32_t kn = w->k - k0 < GEMM_KC ? w->k - k0 : GEMM_KC;
            /* the next chunk's bytes come in while the tiles run, a slice
             * per tile (the weights are cold: a stage's layers far exceed
             * the cache). A task's panels are contiguous, so the next chunk
             * is the bytes after this one. Tiles of small f32 blocks spread
             * their slice over their k loop (`spread`): the first tile reads
             * its chunk from memory, and ran slower behind a burst of
             * prefetches. The rest take theirs as a burst before the tile. */
            size_t len;
            const uint8_t *src = gemm_chunk_src(w, pnl, k0, kn, &len);
            const uint8_t *next = src + len;
            size_t nlen = next < end ? (size_t)(end - next) : 0;
            nlen = nlen < len ? nlen : len;
            size_t slice = (nlen / n_tiles + 63) & ~(size_t)63;
            gemm_ctile t = {
                .w = j->chunk(src, kn, buf),
                .kn = kn,
                .lda = j->lda,
                .ldc = j->ldc,
                .ncols = w->n - col0 < GEMM_NR ? w->n - col0 : GEMM_NR,
                .first = k0 == 0,
            };
            for (uint32_t ti = 0, i = mb; ti < n_tiles; ti++, i += t.mr) {
                t.mr = base + (ti < taller ? 1u : 0u);
                t.a = j->a + (size_t)i * j->lda + k0;
                t.c = j->c + (size_t)i * j->ldc + col0;
                size_t o0 = ti * slice < nlen ? ti * slice : nlen;
                size_t o1 = (ti + 1) * slice < nlen ? (ti + 1) * slice : nlen;
                t.pf = next + o0;
                t.pf_len = o1 - o0;
                if (!spread)
                    for (size_t off = o0; off < o1; off += 64)
                        __builtin_prefetch(next + off, 0, 3);
                ctiles[t.mr - 1](&t);
            }
        }
    }
}

/* Panel range t of a job: G groups of GEMM_ROW_PANELS panels over n ranges,
 * the first G % n ranges one group longer than the rest. Ranges differ by at
 * most one group and the longer ones are claimed first, so threads of equal
 * speed finish together (ranges rounded up to whole multiples once gave a
 * 1280-wide W's 80 panels to two threads as 44 and 36). */
static void gemm_task_panels(const gemm_job *j, uint32_t t, uint32_t *p0, uint32_t *p1)
{
    const uint32_t n = j->n_panel_tasks, base = j->n_groups / n, longer = j->n_groups % n;
    const uint64_t g0 = (uint64_t)t * base + (t < longer ? t : longer);
    const uint64_t g1 = g0 + base + (t < longer);
    const uint32_t np = j->w->n_panels;
    *p0 = g0 * GEMM_ROW_PANELS < np ? (uint32_t)(g0 * GEMM_ROW_PANELS) : np;
    *p1 = g1 * GEMM_ROW_PANELS < np ? (uint32_t)(g1 * GEMM_ROW_PANELS) : np;
}

/* Rows a task quantizes at once for the int8 arithmetic, and the blocks
 * (rows x 32 k) its stack holds: K is taken in chunks of at most
 * GEMM_Q8_BLOCKS / rows blocks (about 44 KB), each chunk quantized once
 * for all the task's panels. */
#define GEMM_Q8_ROWS 32u
#define GEMM_Q8_BLOCKS 1024u

/* A job's activations quantized once, by the caller, for all its tasks:
 * each task of a pooled int8 GEMM would otherwise quantize every row of A
 * it covers itself (8 tasks a GEMM on two threads: one batch-1 decode step
 * quantized each activation row about 14 times, 1.4 % of its samples; at
 * 64 streams the quantizer took 6 % of a step). A is taken whole, row r's
 * blocks from r x K / 32, the layout a task's own buffer has when it takes
 * K in one chunk, so the tiles read the same values: on the stack up to
 * GEMM_Q8_BLOCKS blocks, on the heap up to GEMM_PREQ_BLOCKS (2.9 MB: a
 * 1024-row prefill chunk at K = 1280, 256 rows at K = 6848). Beyond that, or if the heap has no room, each task
 * quantizes as before: the bits are the same either way. */
#define GEMM_PREQ_BLOCKS 65536u

typedef struct gemm_preq {
    int8_t *q;
    float *d;
    int32_t *s;
    void *heap; /* owned: A did not fit the buffers below */
    int8_t qb[GEMM_Q8_BLOCKS * GEMM_QS_BLOCK];
    float db[GEMM_Q8_BLOCKS];
    int32_t sb[2 * GEMM_Q8_BLOCKS];
} gemm_preq;

/* Whether job j's A can be quantized whole (int8 jobs only). */
static bool gemm_prequant_fits(const gemm_job *j)
{
    return j->qtiles && (uint64_t)j->m * (j->w->k / GEMM_QS_BLOCK) <= GEMM_PREQ_BLOCKS;
}

/* Quantizes j's A into *pq and points j at it; leaves j as it was if the
 * heap has no room for it. gemm_preq_free after the job has run. */
static void gemm_prequant(gemm_job *j, gemm_preq *pq)
{
    const uint32_t nbk = j->w->k / GEMM_QS_BLOCK;
    const size_t nb = (size_t)j->m * nbk;
    pq->heap = NULL;
    pq->q = pq->qb;
    pq->d = pq->db;
    pq->s = pq->sb;
    if (nb > GEMM_Q8_BLOCKS) {
        pq->heap = malloc(nb * (GEMM_QS_BLOCK + sizeof(float) + 2 * sizeof(int32_t)));
        if (!pq->heap)
            return;
        pq->d = pq->heap;
        pq->s = (int32_t *)(pq->d + nb);
        pq->q = (int8_t *)(pq->s + 2 * nb);
    }
    for (uint32_t r = 0; r < j->m; r++)
        j->quant(j->a + (size_t)r * j->lda, nbk, j->qperm, pq->q + (size_t)r * nbk * GEMM_QS_BLOCK,
                 pq->d + (size_t)r * nbk, pq->s + (size_t)2 * r * nbk);
    j->pre = pq;
}

static void gemm_preq_free(gemm_preq *pq)
{
    free(pq->heap);
    pq->heap = NULL;
}

/* Points tile t (its other fields set once per chunk) at panel pnl, C's
 * row row. */
static inline void gemm_q8_tile_at(const gemm_job *j, uint32_t pnl, uint32_t row, gemm_qtile *t)
{
    const uint32_t col0 = pnl * GEMM_NR;
    t->panel = (const uint8_t *)j->w->data + (size_t)pnl * j->w->panel_bytes;
    t->ncols = j->w->n - col0 < GEMM_NR ? j->w->n - col0 : GEMM_NR;
    t->c = j->c + (size_t)row * j->ldc + col0;
}

/* gemm_task's int8 arithmetic: rows m0 .. mend of panels p0 .. p1. */
static void gemm_task_q8(const gemm_job *j, uint32_t p0, uint32_t p1, uint32_t m0, uint32_t mend)
{
    int8_t qbuf[GEMM_Q8_BLOCKS * GEMM_QS_BLOCK];
    float dbuf[GEMM_Q8_BLOCKS];
    int32_t sbuf[2 * GEMM_Q8_BLOCKS];
    _Alignas(64) uint8_t ubuf[GEMM_UNP_BLOCKS * GEMM_UNP_BYTES];
    const gemm_w *w = j->w;
    const uint32_t nbk = w->k / GEMM_QS_BLOCK;
    for (uint32_t mb = m0; mb < mend; mb += GEMM_Q8_ROWS) {
        const uint32_t rows = mend - mb < GEMM_Q8_ROWS ? mend - mb : GEMM_Q8_ROWS;
        /* A quantized whole is taken in one chunk (the same bits: a chunk
         * boundary only stores C and loads it back) */
        const uint32_t nbc = j->pre ? nbk : GEMM_Q8_BLOCKS / rows;
        uint32_t n_tiles, base, taller;
        gemm_tile_heights(rows, GEMM_MR8, &n_tiles, &base, &taller);
        for (uint32_t b0 = 0; b0 < nbk; b0 += nbc) {
            const uint32_t nb = nbk - b0 < nbc ? nbk - b0 : nbc;
            const int8_t *q = qbuf;
            const float *d = dbuf;
            const int32_t *s = sbuf;
            if (j->pre) {
                CHECK(b0 == 0 && nb == nbk); /* gemm_prequant_fits: one chunk */
                q = j->pre->q + (size_t)mb * nbk * GEMM_QS_BLOCK;
                d = j->pre->d + (size_t)mb * nbk;
                s = j->pre->s + (size_t)2 * mb * nbk;
            } else {
                for (uint32_t r = 0; r < rows; r++)
                    j->quant(j->a + (size_t)(mb + r) * j->lda + (size_t)b0 * GEMM_QS_BLOCK, nb, j->qperm,
                             qbuf + (size_t)r * nb * GEMM_QS_BLOCK, dbuf + (size_t)r * nb,
                             sbuf + (size_t)2 * r * nb);
            }
            /* up to GEMM_MR_PAIR rows: two panels at once, panel p0 + i
             * beside p0 + h + i, the odd one out alone. The tiles are set
             * up once a chunk: built afresh for every call, their copies
             * waited on the stores just made (7 % of a batch-1 Q4_K_M
             * step's perf samples landed on those copies). */
            const uint32_t pairs = rows <= GEMM_MR_PAIR && j->qtiles2 ? (p1 - p0) / 2 : 0, h = p1 - p0 - pairs;
            gemm_qtile t = {.type = w->type, .b0 = b0, .nb = nb, .ldc = j->ldc, .first = b0 == 0};
            if (pairs) {
                gemm_qtile u = t;
                t.mr = u.mr = rows;
                t.qa = u.qa = (gemm_qa){.q = q, .d = d, .s = s, .nb = nb};
                for (uint32_t i = 0; i < pairs; i++) {
                    gemm_q8_tile_at(j, p0 + i, mb, &t);
                    gemm_q8_tile_at(j, p0 + h + i, mb, &u);
                    j->qtiles2[rows - 1](&t, &u);
                }
            }
            if (j->qtiles_unp && n_tiles >= j->unp_tiles) {
                /* several tiles: each panel's blocks unpacked once, a
                 * buffer's worth at a time, for all of them (a buffer
                 * boundary only stores C and loads it back) */
                for (uint32_t pnl = p0 + pairs; pnl < p0 + h; pnl++)
                    for (uint32_t cb = 0; cb < nb; cb += GEMM_UNP_BLOCKS) {
                        const uint32_t cn = nb - cb < GEMM_UNP_BLOCKS ? nb - cb : GEMM_UNP_BLOCKS;
                        j->unpack((const uint8_t *)w->data + (size_t)pnl * w->panel_bytes, b0 + cb, cn, ubuf);
                        gemm_qtile x = {.type = w->type, .b0 = b0 + cb, .nb = cn, .ldc = j->ldc,
                                        .first = b0 + cb == 0, .unp = ubuf};
                        for (uint32_t ti = 0, r = 0; ti < n_tiles; ti++, r += x.mr) {
                            x.mr = base + (ti < taller ? 1u : 0u);
                            x.qa = (gemm_qa){.q = q + ((size_t)r * nb + cb) * GEMM_QS_BLOCK,
                                             .d = d + (size_t)r * nb + cb, .s = s + 2 * ((size_t)r * nb + cb),
                                             .nb = nb};
                            gemm_q8_tile_at(j, pnl, mb + r, &x);
                            j->qtiles_unp[x.mr - 1](&x);
                        }
                    }
                continue;
            }
            for (uint32_t pnl = p0 + pairs; pnl < p0 + h; pnl++)
                for (uint32_t ti = 0, r = 0; ti < n_tiles; ti++, r += t.mr) {
                    t.mr = base + (ti < taller ? 1u : 0u);
                    t.qa = (gemm_qa){.q = q + (size_t)r * nb * GEMM_QS_BLOCK, .d = d + (size_t)r * nb,
                                     .s = s + (size_t)2 * r * nb, .nb = nb};
                    gemm_q8_tile_at(j, pnl, mb + r, &t);
                    j->qtiles[t.mr - 1](&t);
                }
        }
    }
}

/* A task: a contiguous range of panels times a range of M blocks. Each M
 * block walks all the task's panels before the next block starts. */
static void gemm_task(void *ctxp, uint32_t task, uint32_t thread)
{
    const gemm_job *j = ctxp;
    const gemm_w *w = j->w;
    uint32_t p0, p1;
    gemm_task_panels(j, task % j->n_panel_tasks, &p0, &p1);
    uint64_t m0 = (uint64_t)(task / j->n_panel_tasks) * j->mblocks_per_task * GEMM_MC;
    uint64_t m1 = m0 + (uint64_t)j->mblocks_per_task * GEMM_MC;
    uint32_t mend = m1 < j->m ? (uint32_t)m1 : j->m;
    if (j->qtiles) {
        gemm_task_q8(j, p0, p1, (uint32_t)m0, mend);
        return;
    }
    for (uint32_t mb = (uint32_t)m0; mb < mend; mb += GEMM_MC) {
        uint32_t me = mend - mb < GEMM_MC ? mend : mb + GEMM_MC;
        if (me - mb == 1 && j->rows) {
            for (uint32_t pnl = p0; pnl < p1; pnl += GEMM_ROW_PANELS) {
                uint32_t np = p1 - pnl < GEMM_ROW_PANELS ? p1 - pnl : GEMM_ROW_PANELS;
                uint32_t last0 = (pnl + np - 1) * GEMM_NR;
                gemm_row r = {
                    .panel = (const uint8_t *)w->data + (size_t)pnl * w->panel_bytes,
                    .panel_stride = w->panel_bytes,
                    .k = w->k,
                    .a = j->a + (size_t)mb * j->lda,
                    .c = j->c + (size_t)mb * j->ldc + (size_t)pnl * GEMM_NR,
                    .ncols_last = w->n - last0 < GEMM_NR ? w->n - last0 : GEMM_NR,
                };
                j->rows[np - 1](&r);
            }
            continue;
        }
        if (j->ctiles && me - mb >= gemm_block_min_rows(w->type, j->mr)) {
            gemm_block(j, p0, p1, mb, me);
            continue;
        }
        uint32_t n_tiles, base, taller;
        gemm_tile_heights(me - mb, j->mr, &n_tiles, &base, &taller);
        for (uint32_t pnl = p0; pnl < p1; pnl++) {
            uint32_t col0 = pnl * GEMM_NR;
            gemm_tile t = {
                .type = w->type,
                .panel = (const uint8_t *)w->data + (size_t)pnl * w->panel_bytes,
                .k = w->k,
                .lda = j->lda,
                .ldc = j->ldc,
                .ncols = w->n - col0 < GEMM_NR ? w->n - col0 : GEMM_NR,
            };
            for (uint32_t ti = 0, i = mb; ti < n_tiles; ti++, i += t.mr) {
                t.mr = base + (ti < taller ? 1u : 0u);
                t.a = j->a + (size_t)i * j->lda;
                t.c = j->c + (size_t)i * j->ldc + col0;
                j->tiles[t.mr - 1](&t);
            }
        }
    }
}

static void gemm_run_openblas(const gemm_w *w, const float *a, size_t lda, uint32_t m, float *c,
                              size_t ldc, pool *p)
{
    CHECK(m <= INT_MAX && lda <= INT_MAX && ldc <= INT_MAX);
    int threads = (int)pool_threads(p);
    if (openblas_get_num_threads() != threads)
        openblas_set_num_threads(threads);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)w->n, (int)w->k, 1.0f, a,
                (int)lda, (const float *)w->data, (int)w->k, 0.0f, c, (int)ldc);
}

/* Sets up *job, C = A W^T on the invariant backend for `threads` threads;
 * returns its task count. */
static uint32_t gemm_job_init(gemm_job *job, const gemm_w *w, const float *a, size_t lda, uint32_t m, float *c,
                              size_t ldc, uint32_t threads)
{
    pd_isa isa = pd_cpu_isa();
    /* A few panel ranges per thread so a thread the OS delays does not hold
     * up the rest; each streams contiguous panels, a multiple of the row
     * kernel's group. M blocks are separate tasks too, so a narrow W with
     * many rows still spreads over the threads. */
    uint32_t want = threads == 1 ? 1 : threads * 4;
    uint32_t n_groups = (w->n_panels + GEMM_ROW_PANELS - 1) / GEMM_ROW_PANELS;
    uint32_t n_ptasks = n_groups < want ? n_groups : want;
    uint64_t n_mblocks = ((uint64_t)m + GEMM_MC - 1) / GEMM_MC;
    uint64_t mbpt = (n_mblocks * n_ptasks + GEMM_MAX_TASKS - 1) / GEMM_MAX_TASKS;
    *job = (gemm_job){
        .w = w, .a = a, .lda = lda, .m = m, .c = c, .ldc = ldc,
        .n_groups = n_groups,
        .n_panel_tasks = n_ptasks,
        .mblocks_per_task = (uint32_t)mbpt,
        .mr = gemm_mr_for(isa),
        .tiles = gemm_tiles_for(isa, w->type),
        .rows = gemm_rows_for(isa, w->type),
        .ctiles = gemm_ctiles_for(isa),
        .ctiles_spread = gemm_ctiles_spread_for(isa, w->type),
        .chunk = gemm_chunk_for(isa, w->type),
    };
    if (w->be == GEMM_BACKEND_INT8 && (w->type == GEMM_W_Q8_0 || gemm_wtype_is_qs(w->type))) {
#if defined(__x86_64__)
        const bool vnni = isa >= PD_ISA_AVX512 && gemm_vnni_ok();
#else
        const bool vnni = false;
#endif
        job->qtiles = vnni ? gemm_vnni_qtiles[w->type] : gemm_scalar_qtiles;
#if defined(__x86_64__)
        job->qtiles2 = vnni ? gemm_vnni_qtiles2[w->type] : NULL;
        job->qtiles_unp = vnni ? gemm_vnni_qtiles_unp[w->type] : NULL;
        job->unpack = vnni ? gemm_vnni_unpack[w->type] : NULL;
        /* measured one thread, hot weights, K 1280, in interleaved pairs:
         * the 4- and 5-bit block types and Q6_K gain from 2 tiles on
         * (M = 16: +12-18 %); Q8_0, Q4_K and Q5_K only at 4 (M = 32, 64:
         * +4-15 %; at M = 16, 2 tiles, Q8_0 lost 9 % and Q5_K 5 %: their
         * unpacking costs less than the buffer's stores and loads) */
        job->unp_tiles = w->type == GEMM_W_Q8_0 || w->type == GEMM_W_Q4_K || w->type == GEMM_W_Q5_K ? 4 : 2;
#endif
        job->qperm = vnni && gemm_wtype_is_qs(w->type);
#if defined(__x86_64__)
        job->quant = vnni ? gemm_vnni_q8_row : gemm_q8_row;
#else
        job->quant = gemm_q8_row;
#endif
    }
    return (uint32_t)((n_mblocks + mbpt - 1) / mbpt) * n_ptasks;
}

void gemm_run_ld(const gemm_w *w, const float *a, size_t lda, uint32_t m, float *c, size_t ldc,
                 pool *p)
{
    CHECK(w != NULL);
    if (m == 0)
        return;
    CHECK(a != NULL && c != NULL && lda >= w->k && ldc >= w->n);
    if (w->be == GEMM_BACKEND_OPENBLAS) {
        gemm_run_openblas(w, a, lda, m, c, ldc, p);
        return;
    }
    uint32_t threads = pool_threads(p);
    gemm_job job;
    uint32_t n_tasks = gemm_job_init(&job, w, a, lda, m, c, ldc, threads);
    gemm_preq pq;
    pq.heap = NULL;
    if (n_tasks > 1 && gemm_prequant_fits(&job))
        gemm_prequant(&job, &pq);
    pool_run(threads == 1 ? NULL : p, n_tasks, gemm_task, &job);
    gemm_preq_free(&pq);
}

/* Several jobs in one pool_run: task t is task t - first[i] of job i, where
 * first[i] <= t < first[i + 1]. */
typedef struct gemm_jobs {
    gemm_job job[GEMM_MANY_MAX];
    uint32_t first[GEMM_MANY_MAX + 1];
} gemm_jobs;

static void gemm_many_task(void *ctxp, uint32_t task, uint32_t thread)
{
    gemm_jobs *js = ctxp;
    uint32_t i = 0;
    while (task >= js->first[i + 1])
        i++;
    gemm_task(&js->job[i], task - js->first[i], thread);
}

void gemm_run_many(uint32_t n, const gemm_w *const *w, const float *a, uint32_t m, float *const *c, pool *p)
{
    CHECK(n >= 1 && n <= GEMM_MANY_MAX && w != NULL && c != NULL);
    bool invariant = true;
    for (uint32_t i = 0; i < n; i++) {
        CHECK(w[i] != NULL && w[i]->k == w[0]->k);
        invariant = invariant && w[i]->be != GEMM_BACKEND_OPENBLAS;
    }
    uint32_t threads = pool_threads(p);
    if (m == 0)
        return;
    if (!invariant) {
        for (uint32_t i = 0; i < n; i++)
            gemm_run(w[i], a, m, c[i], p);
        return;
    }
    CHECK(a != NULL);
    gemm_jobs js;
    js.first[0] = 0;
    for (uint32_t i = 0; i < n; i++) {
        CHECK(c[i] != NULL);
        js.first[i + 1] = js.first[i] + gemm_job_init(&js.job[i], w[i], a, w[i]->k, m, c[i], w[i]->n, threads);
    }
    /* the jobs share A: one quantization per (quantizer, order) */
    gemm_preq pq[2];
    pq[0].heap = pq[1].heap = NULL;
    for (uint32_t i = 0, used = 0; i < n; i++) {
        gemm_job *j = &js.job[i];
        if (!gemm_prequant_fits(j))
            continue;
        for (uint32_t u = 0; u < i && !j->pre; u++)
            if (js.job[u].pre && js.job[u].quant == j->quant && js.job[u].qperm == j->qperm)
                j->pre = js.job[u].pre;
        if (!j->pre && used < 2)
            gemm_prequant(j, &pq[used++]);
    }
    pool_run(threads == 1 ? NULL : p, js.first[n], gemm_many_task, &js);
    gemm_preq_free(&pq[0]);
    gemm_preq_free(&pq[1]);
}

/* gemm_run_beside's tasks: the caller's first, then the GEMM's. */
typedef struct gemm_beside {
    gemm_job job;
    uint32_t n_extra;
    pool_fn fn;
    void *ctx;
} gemm_beside;

static void gemm_beside_task(void *ctxp, uint32_t task, uint32_t thread)
{
    gemm_beside *b = ctxp;
    if (task < b->n_extra)
        b->fn(b->ctx, task, thread);
    else
        gemm_task(&b->job, task - b->n_extra, thread);
}

void gemm_run_beside(const gemm_w *w, const float *a, uint32_t m, float *c, pool *p, uint32_t n_extra,
                     pool_fn fn, void *ctx)
{
    CHECK(w != NULL && (n_extra == 0 || fn != NULL));
    const uint32_t threads = pool_threads(p);
    if (w->be == GEMM_BACKEND_OPENBLAS || threads == 1 || m == 0) {
        pool_run(threads == 1 ? NULL : p, n_extra, fn, ctx);
        gemm_run(w, a, m, c, p);
        return;
    }
    CHECK(a != NULL && c != NULL);
    gemm_beside b = {.n_extra = n_extra, .fn = fn, .ctx = ctx};
    const uint32_t n_tasks = gemm_job_init(&b.job, w, a, w->k, m, c, w->n, threads);
    gemm_preq pq;
    pq.heap = NULL;
    if (gemm_prequant_fits(&b.job))
        gemm_prequant(&b.job, &pq);
    pool_run(p, n_extra + n_tasks, gemm_beside_task, &b);
    gemm_preq_free(&pq);
}

void gemm_run(const gemm_w *w, const float *a, uint32_t m, float *c, pool *p)
{
    CHECK(w != NULL);
    gemm_run_ld(w, a, w->k, m, c, w->n, p);
}
