/* Tests for cluster/model/gemm.h: the batch-invariance contract (every C element is
 * one fmaf chain over k from +0.0f) checked bit for bit against an independent
 * reference, whatever M, N, the row offset, the thread count, the ISA path or
 * the weight type; OpenBLAS agreement within tolerance; bad arguments. */
#include "pd_test.h"

#include "base/cpu.h"
#include "base/fp16.h"
#include "cluster/model/gemm.h"
#include "cluster/model/pool.h"
#include "ggml_ref.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>

/* A weight matrix in its stored form plus its exact f32 values. */
typedef struct test_mat {
    gemm_wtype type;
    uint32_t n, k;
    uint8_t *raw;  /* [n x k] as GGUF stores it */
    float *deq;    /* [n x k] exact values, computed here independently */
} test_mat;

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v & 0xff);
    p[1] = (uint8_t)(v >> 8);
}

/* The ggml type id of a qs GEMM type. */
static int ggml_id(gemm_wtype t)
{
    switch (t) {
    case GEMM_W_Q4_0: return 2;
    case GEMM_W_Q5_0: return 6;
    case GEMM_W_Q4_1: return 3;
    case GEMM_W_Q5_1: return 7;
    case GEMM_W_Q4_K: return 12;
    case GEMM_W_Q5_K: return 13;
    case GEMM_W_Q6_K: return 14;
    default: ck_abort(); return -1;
    }
}

/* Byte offsets of the f16 scale fields of a ggml block (the rest is
 * integer data: any byte is valid). */
static int f16_fields(gemm_wtype t, int off[2])
{
    switch (t) {
    case GEMM_W_Q4_0:
    case GEMM_W_Q5_0: off[0] = 0; return 1;
    case GEMM_W_Q4_1:
    case GEMM_W_Q5_1:
    case GEMM_W_Q4_K:
    case GEMM_W_Q5_K: off[0] = 0; off[1] = 2; return 2;
    case GEMM_W_Q6_K: off[0] = 208; return 1;
    default: ck_abort(); return 0;
    }
}

/* A random row of a qs type: random bytes, f16 scales of either sign
 * around `mag`; deq from the test's ggml reference. */
static void qs_row_make(gemm_wtype type, uint32_t k, pd_rng *r, uint8_t *dst, float *deq)
{
    size_t row = gemm_row_bytes(type, k);
    for (size_t i = 0; i < row; i++)
        dst[i] = (uint8_t)pd_rng_below(r, 256);
    int qk, bb, off[2];
    ggml_ref_block(ggml_id(type), &qk, &bb);
    int nf = f16_fields(type, off);
    for (uint32_t b = 0; b < k / (uint32_t)qk; b++)
        for (int f = 0; f < nf; f++) {
            float v = pd_rng_uniform(r, 0.0005f, 0.01f) * (pd_rng_below(r, 4) == 0 ? -1.0f : 1.0f);
            put16(dst + (size_t)b * bb + off[f], pd_f32_to_f16(v));
        }
    ggml_ref_dequant(ggml_id(type), dst, deq, (int)k);
}

static test_mat mat_make(gemm_wtype type, uint32_t n, uint32_t k, uint64_t seed)
{
    pd_rng r = {.s = seed};
    test_mat m = {.type = type, .n = n, .k = k};
    size_t row = gemm_row_bytes(type, k);
    ck_assert_uint_gt(row, 0);
    m.raw = malloc(row * n);
    m.deq = malloc(sizeof(float) * n * k);
    ck_assert(m.raw && m.deq);
    if (gemm_wtype_is_qs(type)) {
        for (uint32_t j = 0; j < n; j++)
            qs_row_make(type, k, &r, m.raw + row * j, m.deq + (size_t)j * k);
        return m;
    }
    for (uint32_t j = 0; j < n; j++) {
        uint8_t *dst = m.raw + row * j;
        float *dq = m.deq + (size_t)j * k;
        for (uint32_t kk = 0; kk < k; kk++) {
            float v = pd_rng_uniform(&r, -1.0f, 1.0f);
            switch (type) {
            case GEMM_W_F32:
                memcpy(dst + 4 * kk, &v, 4);
                dq[kk] = v;
                break;
            case GEMM_W_F16: {
                uint16_t h = pd_f32_to_f16(v);
                put16(dst + 2 * kk, h);
                dq[kk] = pd_f16_to_f32(h);
                break;
            }
            case GEMM_W_BF16: {
                uint16_t h = pd_f32_to_bf16(v);
                put16(dst + 2 * kk, h);
                dq[kk] = pd_bf16_to_f32(h);
                break;
            }
            case GEMM_W_Q8_0: {
                uint8_t *blk = dst + 34 * (kk / 32);
                if (kk % 32 == 0)
                    put16(blk, pd_f32_to_f16(pd_rng_uniform(&r, 0.001f, 0.03f)));
                int8_t q = (int8_t)((int)pd_rng_below(&r, 256) - 128);
                blk[2 + kk % 32] = (uint8_t)q;
                float d = pd_f16_to_f32((uint16_t)(blk[0] | (blk[1] << 8)));
                dq[kk] = (float)q * d;
                break;
            }
            default: ck_abort();
            }
        }
    }
    return m;
}

static void mat_free(test_mat *m)
{
    free(m->raw);
    free(m->deq);
}

static float *act_make(uint32_t m, uint32_t k, uint64_t seed)
{
    pd_rng r = {.s = seed};
    float *a = malloc(sizeof(float) * ((size_t)m * k + 1));
    ck_assert_ptr_nonnull(a);
    pd_rng_fill(&r, a, (size_t)m * k, -1.0f, 1.0f);
    return a;
}

/* The contract, written out: one fmaf chain per element from +0.0f. */
static void ref_gemm(const float *a, size_t lda, uint32_t m, const test_mat *w, float *c, size_t ldc)
{
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t j = 0; j < w->n; j++) {
            float acc = 0.0f;
            for (uint32_t kk = 0; kk < w->k; kk++)
                acc = fmaf(a[(size_t)i * lda + kk], w->deq[(size_t)j * w->k + kk], acc);
            c[(size_t)i * ldc + j] = acc;
        }
}

static gemm_w *pack_or_die(const test_mat *t, gemm_backend be)
{
    gemm_w *g = NULL;
    pd_err err = {0};
    pd_status st = gemm_pack(t->raw, t->type, t->n, t->k, be, NULL, &g, &err);
    ck_assert_msg(st == PD_OK, "gemm_pack %s %ux%u: %s", gemm_wtype_name(t->type), t->n, t->k,
                  err.msg);
    gemm_check(g);
    return g;
}

/* Index of the first element whose bits differ, or -1. */
static long first_diff(const float *x, const float *y, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(&x[i], &y[i], sizeof(float)) != 0)
            return (long)i;
    return -1;
}

/* fmt takes at least one argument; the first differing element is appended. */
#define ASSERT_BITS_EQ(x, y, count, fmt, ...)                                                 \
    do {                                                                                      \
        long d_ = first_diff((x), (y), (count));                                              \
        if (d_ >= 0)                                                                          \
            ck_abort_msg(fmt ": element %ld: %a != %a", __VA_ARGS__, d_, (double)(x)[d_],     \
                         (double)(y)[d_]);                                                    \
    } while (0)

static const gemm_wtype all_types[] = {GEMM_W_F32,  GEMM_W_F16,  GEMM_W_BF16, GEMM_W_Q8_0, GEMM_W_Q4_0, GEMM_W_Q4_1,
                                       GEMM_W_Q5_0, GEMM_W_Q5_1, GEMM_W_Q4_K, GEMM_W_Q5_K, GEMM_W_Q6_K};
#define N_TYPES (sizeof all_types / sizeof all_types[0])

/* A k valid for the type near the wanted one (a multiple of its block). */
static uint32_t k_for(gemm_wtype type, uint32_t want)
{
    uint32_t b = gemm_wtype_block(type);
    return want < b ? b : (want + b - 1) / b * b;
}

/* ---- the int8 arithmetic (GEMM_BACKEND_INT8), written out from gemm.h ---- */

/* Block b of A row a quantized as gemm.h says, here with nearbyintf. */
static float q8_ref_block(const float *a, int8_t q[32], int32_t *sa, int32_t *sb)
{
    float amax = 0.0f;
    for (int k = 0; k < 32; k++)
        amax = fmaxf(amax, fabsf(a[k]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    *sa = *sb = 0;
    for (int k = 0; k < 32; k++) {
        q[k] = (int8_t)nearbyintf(a[k] * id);
        *(k < 16 ? sa : sb) += q[k];
    }
    return pd_f16_to_f32(pd_f32_to_f16(d));
}

/* Weight row j's block b: q, s[2], nm as gemm_qs_block gives them (Q8_0:
 * the stored bytes and the f16 scale). */
static void q8_ref_wblock(const test_mat *t, uint32_t j, uint32_t b, int8_t q[32], float s[2], float *nm)
{
    const uint8_t *row = t->raw + gemm_row_bytes(t->type, t->k) * j;
    if (t->type == GEMM_W_Q8_0) {
        const uint8_t *blk = row + 34 * b;
        s[0] = s[1] = pd_f16_to_f32((uint16_t)(blk[0] | blk[1] << 8));
        *nm = -0.0f;
        memcpy(q, blk + 2, 32);
        return;
    }
    gemm_qs_block(t->type, row, b, s, nm, q);
}

static void ref_gemm_int8(const float *a, uint32_t m, const test_mat *t, float *c)
{
    const bool has_nm = t->type == GEMM_W_Q4_1 || t->type == GEMM_W_Q5_1 || t->type == GEMM_W_Q4_K ||
                        t->type == GEMM_W_Q5_K;
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t j = 0; j < t->n; j++) {
            float acc = 0.0f;
            for (uint32_t b = 0; b < t->k / 32; b++) {
                int8_t qa[32], qw[32];
                int32_t sa, sb;
                float s[2], nm;
                const float da = q8_ref_block(a + (size_t)i * t->k + 32 * b, qa, &sa, &sb);
                q8_ref_wblock(t, j, b, qw, s, &nm);
                int32_t ia = 0, ib = 0;
                for (int k = 0; k < 32; k++)
                    *(k < 16 ? &ia : &ib) += qw[k] * qa[k];
                float x = t->type == GEMM_W_Q6_K ? fmaf(s[1], (float)ib, s[0] * (float)ia) : s[0] * (float)(ia + ib);
                if (has_nm)
                    x = fmaf(nm, (float)(sa + sb), x);
                acc = fmaf(da, x, acc);
            }
            c[(size_t)i * t->n + j] = acc;
        }
}

static const gemm_wtype q8_types[] = {GEMM_W_Q8_0, GEMM_W_Q4_0, GEMM_W_Q4_1, GEMM_W_Q5_0,
                                      GEMM_W_Q5_1, GEMM_W_Q4_K, GEMM_W_Q5_K, GEMM_W_Q6_K};
#define N_Q8_TYPES (sizeof q8_types / sizeof q8_types[0])

/* Every quantized type, shape, M (tiles of 1..8 rows, several row blocks,
 * K in several chunks), thread count and ISA: the int8 backend equals the
 * arithmetic written out above bit for bit. */
START_TEST(gemm_int8_matches_its_arithmetic_for_every_type_isa_and_thread_count)
{
    static const uint32_t ns[] = {1, 17, 40};
    /* tile heights 1 .. 8 (15: 8 + 7; 70: two chunks of 32, then 6); 9 and
     * up run several tiles over blocks unpacked once */
    static const uint32_t ms[] = {1, 2, 3, 4, 5, 9, 15, 33, 70};
    pool *pools[2] = {NULL, NULL};
    for (uint32_t th = 0; th < 2; th++)
        ck_assert_int_eq(pool_new(th + 1, &pools[th], NULL), PD_OK);
    pd_isa best = pd_cpu_detect();
    for (size_t ti = 0; ti < N_Q8_TYPES; ti++)
        for (size_t ni = 0; ni < 3; ni++)
            for (uint32_t kb = 1; kb <= 2; kb++) {
                const gemm_wtype type = q8_types[ti];
                /* 5 super-blocks of 256 or 40 blocks of 32: 40 blocks of
                 * 32 chunk K once 26 or more rows are quantized together,
                 * and a tall block's panels are unpacked 32 blocks at a
                 * time (GEMM_UNP_BLOCKS), so 32 + 8 */
                const uint32_t n = ns[ni], k = gemm_wtype_block(type) == 256 ? (kb == 1 ? 256 : 1280) : kb == 1 ? 64 : 1280;
                test_mat t = mat_make(type, n, k, 9100 + ti * 13 + ni * 3 + kb);
                gemm_w *g = pack_or_die(&t, GEMM_BACKEND_INT8);
                ck_assert_int_eq(gemm_get_backend(g), GEMM_BACKEND_INT8);
                float *a = act_make(70, k, 77 + ti + ni);
                /* a block of zeros (d = 0), and one with amax 127 (d = 1)
                 * holding ties, which round to even */
                memset(a + 32, 0, 32 * sizeof(float));
                static const float ties[4] = {127.0f, 62.5f, -3.5f, 2.5f};
                for (int x = 0; x < 32; x++)
                    a[k + x] = ties[x % 4];
                float *want = malloc(sizeof(float) * 70 * n), *got = malloc(sizeof(float) * 70 * n);
                ref_gemm_int8(a, 70, &t, want);
                for (int isa = PD_ISA_SCALAR; isa <= (int)best; isa++) {
                    pd_cpu_set_isa((pd_isa)isa);
                    for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
                        for (uint32_t th = 0; th < 2; th++) {
                            memset(got, 0xff, sizeof(float) * 70 * n);
                            gemm_run(g, a, ms[mi], got, pools[th]);
                            ASSERT_BITS_EQ(got, want, (size_t)ms[mi] * n, "int8 isa %s type %s m %u n %u k %u, %u threads",
                                           pd_isa_name((pd_isa)isa), gemm_wtype_name(type), ms[mi], n, k, th + 1);
                        }
                }
                pd_cpu_set_isa(best);
                free(a);
                free(want);
                free(got);
                gemm_free(g);
                mat_free(&t);
            }
    for (uint32_t th = 0; th < 2; th++)
        pool_free(pools[th]);
}
END_TEST

/* The int8 result stays near the exact one (a bound of a few per cent of
 * sum |a w|, which a wrong scale, offset or order of values would break),
 * and 16/32-bit weights run the invariant arithmetic unchanged. */
START_TEST(gemm_int8_is_near_the_exact_product_and_leaves_float_weights_alone)
{
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const gemm_wtype type = all_types[ti];
        const uint32_t n = 33, m = 5, k = k_for(type, 512);
        test_mat t = mat_make(type, n, k, 4400 + ti);
        gemm_w *gi = pack_or_die(&t, GEMM_BACKEND_INT8), *ge = pack_or_die(&t, GEMM_BACKEND_INVARIANT);
        float *a = act_make(m, k, 12 + ti);
        float ci[5 * 33], ce[5 * 33];
        gemm_run(gi, a, m, ci, NULL);
        gemm_run(ge, a, m, ce, NULL);
        if (type == GEMM_W_F32 || type == GEMM_W_F16 || type == GEMM_W_BF16) {
            ASSERT_BITS_EQ(ci, ce, (size_t)m * n, "%s under int8", gemm_wtype_name(type));
        } else {
            int differ = 0;
            for (uint32_t i = 0; i < m; i++)
                for (uint32_t j = 0; j < n; j++) {
                    double mag = 0.0;
                    for (uint32_t kk = 0; kk < k; kk++)
                        mag += fabs((double)a[(size_t)i * k + kk] * t.deq[(size_t)j * k + kk]);
                    const double e = fabs((double)ci[i * n + j] - ce[i * n + j]);
                    ck_assert_msg(e <= 0.02 * mag, "%s (%u, %u): int8 %g exact %g, sum |a w| %g",
                                  gemm_wtype_name(type), i, j, (double)ci[i * n + j], (double)ce[i * n + j], mag);
                    differ += ci[i * n + j] != ce[i * n + j];
                }
            ck_assert_msg(differ > 0, "%s: int8 gave the exact bits everywhere", gemm_wtype_name(type));
        }
        free(a);
        gemm_free(gi);
        gemm_free(ge);
        mat_free(&t);
    }
}
END_TEST

/* Every (type, shape, isa): gemm_run equals the reference chain bit for bit. */
START_TEST(gemm_matches_the_fma_chain_for_every_type_and_isa)
{
    static const uint32_t ns[] = {1, 15, 16, 17, 40};
    static const uint32_t ks[] = {1, 7, 33, 64};
    static const uint32_t ms[] = {1, 2, 3, 5, 6, 7, 13, 50};
    pd_isa best = pd_cpu_detect();
    for (int isa = PD_ISA_SCALAR; isa <= (int)best; isa++) {
        ck_assert_int_eq(pd_cpu_set_isa((pd_isa)isa), isa);
        for (size_t ti = 0; ti < N_TYPES; ti++)
            for (size_t ni = 0; ni < 5; ni++)
                for (size_t ki = 0; ki < 4; ki++) {
                    gemm_wtype type = all_types[ti];
                    uint32_t n = ns[ni], k = ks[ki];
                    if (type != GEMM_W_F32 && gemm_wtype_block(type) > 1)
                        k = gemm_wtype_block(type) * (uint32_t)(ki + 1);
                    test_mat t = mat_make(type, n, k, 100 + ti * 31 + ni * 7 + ki);
                    gemm_w *g = pack_or_die(&t, GEMM_BACKEND_INVARIANT);
                    float *a = act_make(50, k, 5 + ni + ki);
                    float *want = malloc(sizeof(float) * 50 * n);
                    float *got = malloc(sizeof(float) * 50 * n);
                    for (size_t mi = 0; mi < 8; mi++) {
                        uint32_t m = ms[mi];
                        ref_gemm(a, k, m, &t, want, n);
                        memset(got, 0xff, sizeof(float) * 50 * n);
                        gemm_run(g, a, m, got, NULL);
                        ASSERT_BITS_EQ(got, want, (size_t)m * n, "isa %s type %s m %u n %u k %u",
                                       pd_isa_name((pd_isa)isa), gemm_wtype_name(type), m, n, k);
                    }
                    free(a);
                    free(want);
                    free(got);
                    gemm_free(g);
                    mat_free(&t);
                }
    }
}
END_TEST

/* Every row of a 300-row batch, computed in batches of every size M = 1..300
 * starting at varying row offsets, has the bits it has when computed alone. */
static void rows_independent_of_m(gemm_wtype type, uint32_t n, uint32_t k, uint32_t m_step)
{
    const uint32_t rows = 300;
    test_mat t = mat_make(type, n, k, 77 + n + k);
    gemm_w *g = pack_or_die(&t, GEMM_BACKEND_INVARIANT);
    float *a = act_make(rows, k, 991 + k);
    float *alone = malloc(sizeof(float) * rows * n);
    float *batch = malloc(sizeof(float) * rows * n);
    for (uint32_t r = 0; r < rows; r++)
        gemm_run(g, a + (size_t)r * k, 1, alone + (size_t)r * n, NULL);
    /* the single-row results themselves follow the contract */
    float *want = malloc(sizeof(float) * rows * n);
    ref_gemm(a, k, rows, &t, want, n);
    ASSERT_BITS_EQ(alone, want, (size_t)rows * n, "single rows, %s n %u k %u",
                   gemm_wtype_name(type), n, k);
    for (uint32_t m = 1; m <= rows; m += m_step) {
        uint32_t off = (m * 37u) % (rows - m + 1);
        gemm_run(g, a + (size_t)off * k, m, batch, NULL);
        ASSERT_BITS_EQ(batch, alone + (size_t)off * n, (size_t)m * n,
                       "%s n %u k %u: batch of %u rows from row %u", gemm_wtype_name(type), n, k,
                       m, off);
    }
    free(want);
    free(a);
    free(alone);
    free(batch);
    gemm_free(g);
    mat_free(&t);
}

START_TEST(gemm_row_bits_do_not_depend_on_m)
{
    rows_independent_of_m(GEMM_W_F32, 37, 67, 1);
    rows_independent_of_m(GEMM_W_F32, 16, 129, 1);
    rows_independent_of_m(GEMM_W_F32, 50, 8, 1);
    rows_independent_of_m(GEMM_W_F16, 33, 31, 3);
    rows_independent_of_m(GEMM_W_BF16, 20, 45, 3);
    rows_independent_of_m(GEMM_W_Q8_0, 39, 64, 3);
    /* k beyond one cache block: chains carried across blocks */
    rows_independent_of_m(GEMM_W_F32, 21, 517, 5);
    rows_independent_of_m(GEMM_W_Q8_0, 18, 544, 9);
    /* 16-bit weights converted per k chunk on the blocked path, the last
     * chunk partial */
    rows_independent_of_m(GEMM_W_F16, 23, 301, 7);
    rows_independent_of_m(GEMM_W_BF16, 19, 517, 11);
    /* f32 blocks of more than one tile (M >= 7) on the blocked path, whose
     * tiles prefetch the next chunk in segments of their k loop: every M,
     * three panels, the last chunk partial */
    rows_independent_of_m(GEMM_W_F32, 40, 300, 1);
    /* the ggml block types: single-row kernels, tiles, blocked path, chains
     * across chunks */
    rows_independent_of_m(GEMM_W_Q4_0, 39, 64, 3);
    rows_independent_of_m(GEMM_W_Q5_0, 18, 544, 9);
    rows_independent_of_m(GEMM_W_Q4_1, 20, 96, 5);
    rows_independent_of_m(GEMM_W_Q5_1, 17, 320, 7);
    rows_independent_of_m(GEMM_W_Q4_K, 70, 256, 7);
    rows_independent_of_m(GEMM_W_Q5_K, 21, 512, 11);
    rows_independent_of_m(GEMM_W_Q6_K, 33, 768, 13);
}
END_TEST

START_TEST(gemm_row_bits_do_not_depend_on_m_scalar_path)
{
    pd_cpu_set_isa(PD_ISA_SCALAR);
    rows_independent_of_m(GEMM_W_F32, 37, 67, 11);
    rows_independent_of_m(GEMM_W_Q8_0, 21, 32, 13);
    rows_independent_of_m(GEMM_W_BF16, 19, 300, 29);
    rows_independent_of_m(GEMM_W_Q5_K, 19, 256, 29);
    rows_independent_of_m(GEMM_W_Q6_K, 17, 256, 31);
}
END_TEST

/* 1, 2 and 3 threads (and no pool) give the same bits, for M across the
 * tile and block boundaries, for a wide W (panel ranges split over threads)
 * and a narrow one (M blocks split over threads). */
START_TEST(gemm_bits_do_not_depend_on_thread_count)
{
    static const struct {
        uint32_t n, k;
    } shapes[] = {{203, 320}, {16, 64}};
    static const uint32_t ms[] = {1, 2, 4, 7, 16, 64, 97, 130, 250};
    const uint32_t max_m = 250;
    pool *pools[3] = {NULL, NULL, NULL};
    for (uint32_t t = 0; t < 3; t++)
        ck_assert_int_eq(pool_new(t + 1, &pools[t], NULL), PD_OK);
    for (size_t si = 0; si < 2; si++)
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            const uint32_t n = shapes[si].n, k = k_for(all_types[ti], shapes[si].k);
            test_mat t = mat_make(all_types[ti], n, k, 5150 + ti + si);
            gemm_w *g = pack_or_die(&t, GEMM_BACKEND_INVARIANT);
            float *a = act_make(max_m, k, 31 + ti);
            float *want = malloc(sizeof(float) * max_m * n);
            float *got = malloc(sizeof(float) * max_m * n);
            ref_gemm(a, k, max_m, &t, want, n);
            for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
                for (uint32_t th = 0; th < 3; th++) {
                    memset(got, 0, sizeof(float) * max_m * n);
                    gemm_run(g, a, ms[mi], got, pools[th]);
                    ASSERT_BITS_EQ(got, want, (size_t)ms[mi] * n, "%s n %u m %u, %u threads",
                                   gemm_wtype_name(all_types[ti]), n, ms[mi], th + 1);
                }
            }
            for (uint32_t th = 0; th < 3; th++)
                pool_check(pools[th]);
            free(a);
            free(want);
            free(got);
            gemm_free(g);
            mat_free(&t);
        }
    for (uint32_t t = 0; t < 3; t++)
        pool_free(pools[t]);
}
END_TEST

/* gemm_run_many gives each matrix the bits gemm_run gives it, whatever the
 * matrices' widths and weight types, their count, M and the threads; on
 * the int8 backend too, where the matrices share one quantized A per
 * quantizer order (Q8_0 natural, the qs types permuted; f16 exact). */
START_TEST(gemm_run_many_equals_one_run_per_matrix)
{
    static const uint32_t widths[GEMM_MANY_MAX] = {203, 16, 1, 50};
    static const uint32_t ms[] = {1, 2, 7, 64, 130};
    static const gemm_wtype int8_types[GEMM_MANY_MAX] = {GEMM_W_Q4_0, GEMM_W_Q8_0, GEMM_W_Q5_0, GEMM_W_F16};
    const gemm_backend be = _i ? GEMM_BACKEND_INT8 : GEMM_BACKEND_INVARIANT;
    const uint32_t k = 96, max_m = 130;
    pool *pools[3] = {NULL, NULL, NULL};
    for (uint32_t t = 0; t < 3; t++)
        ck_assert_int_eq(pool_new(t + 1, &pools[t], NULL), PD_OK);
    test_mat mats[GEMM_MANY_MAX];
    gemm_w *ws[GEMM_MANY_MAX];
    float *want[GEMM_MANY_MAX], *got[GEMM_MANY_MAX];
    for (uint32_t i = 0; i < GEMM_MANY_MAX; i++) {
        mats[i] = mat_make(be == GEMM_BACKEND_INT8 ? int8_types[i] : all_types[(i + 1) % 4], widths[i], k,
                           777 + i); /* a different type each */
        if (i == 2 && be == GEMM_BACKEND_INVARIANT) { /* and a ggml block type */
            mat_free(&mats[i]);
            mats[i] = mat_make(GEMM_W_Q4_0, widths[i], k, 777 + i);
        }
        ws[i] = pack_or_die(&mats[i], be);
        want[i] = malloc(sizeof(float) * max_m * widths[i]);
        got[i] = malloc(sizeof(float) * max_m * widths[i]);
    }
    float *a = act_make(max_m, k, 99);
    for (uint32_t n = 1; n <= GEMM_MANY_MAX; n++)
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
            for (uint32_t th = 0; th < 3; th++) {
                for (uint32_t i = 0; i < n; i++) {
                    gemm_run(ws[i], a, ms[mi], want[i], NULL);
                    memset(got[i], 0xff, sizeof(float) * max_m * widths[i]);
                }
                gemm_run_many(n, (const gemm_w *const *)ws, a, ms[mi], got, pools[th]);
                for (uint32_t i = 0; i < n; i++)
                    ASSERT_BITS_EQ(got[i], want[i], (size_t)ms[mi] * widths[i],
                                   "%s: %u matrices, #%u (%s), m %u, %u threads", gemm_backend_name(be), n, i,
                                   gemm_wtype_name(mats[i].type), ms[mi], th + 1);
                pool_check(pools[th]);
            }
    free(a);
    for (uint32_t i = 0; i < GEMM_MANY_MAX; i++) {
        free(want[i]);
        free(got[i]);
        gemm_free(ws[i]);
        mat_free(&mats[i]);
    }
    for (uint32_t t = 0; t < 3; t++)
        pool_free(pools[t]);
}
END_TEST

/* gemm_run_beside: C has gemm_run's bits and every extra task runs
 * exactly once, on each backend, thread count and M (the pooled path hands
 * out both kinds of task at once). */
typedef struct beside_count {
    _Atomic uint32_t runs[40];
} beside_count;

static void beside_task(void *ctx, uint32_t task, uint32_t thread)
{
    (void)thread;
    beside_count *bc = ctx;
    atomic_fetch_add(&bc->runs[task], 1u);
}

static void pools_free(pool **pools, uint32_t n)
{
    for (uint32_t t = 0; t < n; t++)
        pool_free(pools[t]);
}

START_TEST(gemm_run_beside_equals_gemm_run_and_runs_every_extra_task_once)
{
    static const gemm_backend bes[] = {GEMM_BACKEND_INVARIANT, GEMM_BACKEND_INT8, GEMM_BACKEND_OPENBLAS};
    static const uint32_t ms[] = {1, 3, 40};
    static const uint32_t extras[] = {0, 1, 6, 40};
    const uint32_t n = 70, k = 96;
    pool *pools[2] = {NULL, NULL};
    for (uint32_t t = 0; t < 2; t++)
        ck_assert_int_eq(pool_new(t + 1, &pools[t], NULL), PD_OK);
    test_mat mat = mat_make(GEMM_W_Q4_0, n, k, 4242);
    float *a = act_make(40, k, 4243);
    float *want = malloc(sizeof(float) * 40 * n), *got = malloc(sizeof(float) * 40 * n);
    for (size_t bi = 0; bi < sizeof bes / sizeof bes[0]; bi++) {
        gemm_w *w = pack_or_die(&mat, bes[bi]);
        for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++)
            for (size_t ei = 0; ei < sizeof extras / sizeof extras[0]; ei++)
                for (uint32_t th = 0; th < 2; th++) {
                    gemm_run(w, a, ms[mi], want, NULL);
                    memset(got, 0xff, sizeof(float) * 40 * n);
                    beside_count bc;
                    for (uint32_t t = 0; t < 40; t++)
                        atomic_init(&bc.runs[t], 0u);
                    gemm_run_beside(w, a, ms[mi], got, pools[th], extras[ei], beside_task, &bc);
                    if (bes[bi] == GEMM_BACKEND_OPENBLAS)
                        ck_assert_float_eq_tol(got[0], want[0], 1e-4f); /* OpenBLAS: not bit-stable by design */
                    else
                        ASSERT_BITS_EQ(got, want, (size_t)ms[mi] * n, "%s m %u, %u extra, %u threads",
                                       gemm_backend_name(bes[bi]), ms[mi], extras[ei], th + 1);
                    for (uint32_t t = 0; t < 40; t++)
                        ck_assert_uint_eq(atomic_load(&bc.runs[t]), t < extras[ei] ? 1u : 0u);
                    pool_check(pools[th]);
                }
        gemm_free(w);
    }
    pools_free(pools, 2);
    mat_free(&mat);
    free(a);
    free(want);
    free(got);
}
END_TEST

/* gemm_prefetch_start takes every backend, a matrix of one panel shorter
 * than the prefetch distance and NULL, and changes no result. */
START_TEST(gemm_prefetch_start_changes_nothing)
{
    static const gemm_backend bes[] = {GEMM_BACKEND_INVARIANT, GEMM_BACKEND_INT8, GEMM_BACKEND_OPENBLAS};
    static const uint32_t ns[] = {5, 70};
    const uint32_t k = 256, m = 3;
    gemm_prefetch_start(NULL);
    float *a = act_make(m, k, 77);
    for (size_t bi = 0; bi < sizeof bes / sizeof bes[0]; bi++)
        for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
            test_mat mat = mat_make(GEMM_W_Q4_K, ns[ni], k, 78 + (uint32_t)ni);
            gemm_w *w = pack_or_die(&mat, bes[bi]);
            float *want = malloc(sizeof(float) * m * ns[ni]), *got = malloc(sizeof(float) * m * ns[ni]);
            gemm_run(w, a, m, want, NULL);
            gemm_prefetch_start(w);
            gemm_run(w, a, m, got, NULL);
            ASSERT_BITS_EQ(got, want, (size_t)m * ns[ni], "%s n %u", gemm_backend_name(bes[bi]), ns[ni]);
            free(want);
            free(got);
            gemm_free(w);
            mat_free(&mat);
        }
    free(a);
}
END_TEST

/* Column j has the same bits whether W has 1, 15, 16, 17 ... or all n rows
 * (different panel counts and task splits), and whether C is written
 * through gemm_run_ld with wider strides. */
START_TEST(gemm_bits_do_not_depend_on_n_split)
{
    const uint32_t n = 150, k = 64, m = 23;
    static const uint32_t sub[] = {1, 15, 16, 17, 33, 100, 149};
    pool *p = NULL;
    ck_assert_int_eq(pool_new(2, &p, NULL), PD_OK);
    test_mat t = mat_make(GEMM_W_F32, n, k, 4242);
    gemm_w *full = pack_or_die(&t, GEMM_BACKEND_INVARIANT);
    float *a = act_make(m, k, 8);
    float *cf = malloc(sizeof(float) * m * n);
    float *cs = malloc(sizeof(float) * m * n);
    gemm_run(full, a, m, cf, p);
    for (size_t si = 0; si < 7; si++) {
        uint32_t ns = sub[si];
        gemm_w *g = NULL;
        ck_assert_int_eq(gemm_pack(t.raw, GEMM_W_F32, ns, k, GEMM_BACKEND_INVARIANT, NULL, &g, NULL),
                         PD_OK);
        gemm_run(g, a, m, cs, si % 2 ? p : NULL);
        for (uint32_t i = 0; i < m; i++)
            ASSERT_BITS_EQ(cs + (size_t)i * ns, cf + (size_t)i * n, ns, "first %u columns, row %u",
                           ns, i);
        gemm_free(g);
    }
    /* strided A and C: the gaps stay untouched, the values keep their bits */
    const size_t lda = k + 5, ldc = n + 9;
    float *a2 = malloc(sizeof(float) * m * lda);
    float *c2 = malloc(sizeof(float) * m * ldc);
    for (uint32_t i = 0; i < m; i++)
        memcpy(a2 + i * lda, a + (size_t)i * k, sizeof(float) * k);
    for (size_t x = 0; x < m * ldc; x++)
        c2[x] = -7.0f;
    gemm_run_ld(full, a2, lda, m, c2, ldc, p);
    for (uint32_t i = 0; i < m; i++) {
        ASSERT_BITS_EQ(c2 + i * ldc, cf + (size_t)i * n, n, "strided row %u", i);
        for (size_t x = n; x < ldc; x++)
            ck_assert_float_eq(c2[i * ldc + x], -7.0f);
    }
    free(a2);
    free(c2);
    free(a);
    free(cf);
    free(cs);
    gemm_free(full);
    mat_free(&t);
    pool_free(p);
}
END_TEST

/* The CPU's best vector path (AVX2, or AVX-512 where the CPU has it or in
 * test_gemm_avx512) and the portable path give the same bits (large enough
 * to use every tile height, a partial panel and chunks across k). */
START_TEST(gemm_simd_equals_scalar_bit_for_bit)
{
    ck_assert_int_eq(pd_cpu_set_isa(PD_ISA_SCALAR), PD_ISA_SCALAR);
    const uint32_t n = 45, m = 41;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const uint32_t k = k_for(all_types[ti], 544);
        test_mat t = mat_make(all_types[ti], n, k, 606 + ti);
        gemm_w *g = pack_or_die(&t, GEMM_BACKEND_INVARIANT);
        float *a = act_make(m, k, 99 + ti);
        float *cs = malloc(sizeof(float) * m * n);
        float *cv = malloc(sizeof(float) * m * n);
        pd_cpu_set_isa(PD_ISA_SCALAR);
        gemm_run(g, a, m, cs, NULL);
        pd_isa got = pd_cpu_set_isa(pd_cpu_detect());
        ck_assert_int_eq(got, pd_cpu_detect());
        gemm_run(g, a, m, cv, NULL);
        ASSERT_BITS_EQ(cv, cs, (size_t)m * n, "%s: %s vs scalar", gemm_wtype_name(all_types[ti]),
                       pd_isa_name(got));
        free(a);
        free(cs);
        free(cv);
        gemm_free(g);
        mat_free(&t);
    }
}
END_TEST

/* F16 / BF16 / Q8_0 GEMMs equal the f32 GEMM run on the dequantized
 * weights, bit for bit. */
START_TEST(gemm_quantized_equals_f32_of_dequantized)
{
    const uint32_t n = 70, m = 19;
    for (size_t ti = 1; ti < N_TYPES; ti++) {
        const uint32_t k = k_for(all_types[ti], 160);
        test_mat t = mat_make(all_types[ti], n, k, 1234 + ti);
        gemm_w *gq = pack_or_die(&t, GEMM_BACKEND_INVARIANT);
        gemm_w *gf = NULL;
        ck_assert_int_eq(gemm_pack(t.deq, GEMM_W_F32, n, k, GEMM_BACKEND_INVARIANT, NULL, &gf, NULL),
                         PD_OK);
        float *a = act_make(m, k, 3 + ti);
        float *cq = malloc(sizeof(float) * m * n);
        float *cf = malloc(sizeof(float) * m * n);
        for (int isa = PD_ISA_SCALAR; isa <= (int)pd_cpu_detect(); isa++) {
            pd_cpu_set_isa((pd_isa)isa);
            gemm_run(gq, a, m, cq, NULL);
            gemm_run(gf, a, m, cf, NULL);
            ASSERT_BITS_EQ(cq, cf, (size_t)m * n, "%s vs f32, isa %s",
                           gemm_wtype_name(all_types[ti]), pd_isa_name((pd_isa)isa));
        }
        ck_assert_uint_lt(gemm_bytes(gq), gemm_bytes(gf)); /* stays compact */
        free(a);
        free(cq);
        free(cf);
        gemm_free(gq);
        gemm_free(gf);
        mat_free(&t);
    }
}
END_TEST

/* Edge blocks of a qs type: row j, block b gets the f16 scale fields
 * edges[(j * 7 + b + f) % n_edges] and integer bytes that, over the rows,
 * take every value 0..255 at every position (every nibble and bit
 * pattern, every 6-bit scale and min of the K types). */
static test_mat edge_mat(gemm_wtype type, uint32_t n, uint32_t k)
{
    static const uint16_t edges[] = {
        0x0000, 0x8000, 0x0001, 0x8001, 0x03ff, 0x83ff, 0x0400, 0x7bff, 0xfbff,
        0x3c00, 0xbc00, 0x1400, 0x2e66, 0x0200, 0x5bff,
    };
    const uint32_t n_edges = sizeof edges / sizeof edges[0];
    test_mat m = {.type = type, .n = n, .k = k};
    size_t row = gemm_row_bytes(type, k);
    m.raw = malloc(row * n);
    m.deq = malloc(sizeof(float) * n * k);
    ck_assert(m.raw && m.deq);
    int qk, bb, off[2];
    ggml_ref_block(ggml_id(type), &qk, &bb);
    int nf = f16_fields(type, off);
    for (uint32_t j = 0; j < n; j++) {
        uint8_t *dst = m.raw + row * j;
        for (uint32_t b = 0; b < k / (uint32_t)qk; b++) {
            uint8_t *blk = dst + (size_t)b * bb;
            for (int i = 0; i < bb; i++)
                blk[i] = (uint8_t)(j + b * 256u / (k / (uint32_t)qk) + (uint32_t)i * 97u * (b % 2) + (uint32_t)i * (b % 3));
            for (int f = 0; f < nf; f++)
                put16(blk + off[f], edges[(j * 7 + b + (uint32_t)f) % n_edges]);
        }
        ggml_ref_dequant(ggml_id(type), dst, m.deq + (size_t)j * k, (int)k);
    }
    return m;
}

/* gemm_dequant and every GEMM path give exactly ggml's dequantized values
 * on edge blocks: scales 0, -0, subnormal f16, max f16, either sign, every
 * byte value at every position (over the 256 rows). */
START_TEST(gemm_qs_values_equal_ggml_on_edge_blocks)
{
    for (size_t ti = 4; ti < N_TYPES; ti++) {
        const gemm_wtype type = all_types[ti];
        const uint32_t n = 256, k = gemm_wtype_block(type) * 4;
        test_mat t = edge_mat(type, n, k);
        float *got = malloc(sizeof(float) * k);
        for (uint32_t j = 0; j < n; j++) {
            const uint8_t *row = t.raw + gemm_row_bytes(type, k) * j;
            gemm_dequant(type, row, 0, k, got);
            ASSERT_BITS_EQ(got, t.deq + (size_t)j * k, k, "%s row %u", gemm_wtype_name(type), j);
            /* a range starting mid-block */
            gemm_dequant(type, row, 13, k - 20, got);
            ASSERT_BITS_EQ(got, t.deq + (size_t)j * k + 13, k - 20, "%s row %u from 13", gemm_wtype_name(type), j);
        }
        /* the GEMM multiplies with exactly these values on every path */
        gemm_w *g = pack_or_die(&t, GEMM_BACKEND_INVARIANT);
        const uint32_t ms[] = {1, 5, 30};
        float *a = act_make(30, k, 17);
        float *want = malloc(sizeof(float) * 30 * n);
        float *c = malloc(sizeof(float) * 30 * n);
        for (int isa = PD_ISA_SCALAR; isa <= (int)pd_cpu_detect(); isa++) {
            pd_cpu_set_isa((pd_isa)isa);
            for (size_t mi = 0; mi < 3; mi++) {
                ref_gemm(a, k, ms[mi], &t, want, n);
                gemm_run(g, a, ms[mi], c, NULL);
                ASSERT_BITS_EQ(c, want, (size_t)ms[mi] * n, "%s edge blocks m %u isa %s", gemm_wtype_name(type),
                               ms[mi], pd_isa_name((pd_isa)isa));
            }
        }
        pd_cpu_set_isa(pd_cpu_detect());
        free(a);
        free(want);
        free(c);
        free(got);
        gemm_free(g);
        mat_free(&t);
    }
}
END_TEST

/* The qs types are packed in about the bytes of their GGUF file (nibbles,
 * bit planes, the stored scale fields), not widened: batch-1 decode reads
 * every packed byte. Bytes per 512 weights, as gemm_kern.h draws them. */
START_TEST(gemm_qs_packs_about_the_file_bytes)
{
    static const struct {
        gemm_wtype type;
        size_t per512;
    } want[] = {{GEMM_W_Q4_0, 288}, {GEMM_W_Q5_0, 352}, {GEMM_W_Q4_1, 320}, {GEMM_W_Q5_1, 384},
                {GEMM_W_Q4_K, 296}, {GEMM_W_Q5_K, 360}, {GEMM_W_Q6_K, 420}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        const uint32_t n = 32, k = 512; /* two panels, 32 blocks, 2 super-blocks */
        test_mat t = mat_make(want[i].type, n, k, 41 + i);
        gemm_w *g = pack_or_die(&t, GEMM_BACKEND_INVARIANT);
        const size_t file = gemm_row_bytes(want[i].type, k) * n;
        ck_assert_uint_eq(gemm_bytes(g), want[i].per512 * n * k / 512);
        ck_assert_msg(gemm_bytes(g) * 100 <= file * 103, "%s: %zu packed bytes for %zu in the file",
                      gemm_wtype_name(want[i].type), gemm_bytes(g), file);
        gemm_free(g);
        mat_free(&t);
    }
}
END_TEST

/* The M = 1 row kernels of every qs type on every ISA: groups of 1..4
 * panels, a partial last panel, several groups and super-blocks, one and
 * two threads; the same bits as the reference chain. */
START_TEST(gemm_qs_row_kernels_match_on_every_isa)
{
    static const uint32_t ns[] = {16, 33, 48, 64, 79, 140};
    pool *p2 = NULL;
    ck_assert_int_eq(pool_new(2, &p2, NULL), PD_OK);
    for (int isa = PD_ISA_SCALAR; isa <= (int)pd_cpu_detect(); isa++) {
        ck_assert_int_eq(pd_cpu_set_isa((pd_isa)isa), isa);
        for (size_t ti = 4; ti < N_TYPES; ti++)
            for (size_t ni = 0; ni < sizeof ns / sizeof ns[0]; ni++) {
                const gemm_wtype type = all_types[ti];
                const uint32_t n = ns[ni], k = k_for(type, 512);
                test_mat t = mat_make(type, n, k, 900 + ti * 13 + ni);
                gemm_w *g = pack_or_die(&t, GEMM_BACKEND_INVARIANT);
                float *a = act_make(2, k, 71 + ni);
                float want[2 * 140], got[2 * 140];
                ref_gemm(a, k, 2, &t, want, n);
                for (int th = 0; th < 2; th++)
                    for (uint32_t m = 1; m <= 2; m++) {
                        memset(got, 0xff, sizeof got);
                        gemm_run(g, a, m, got, th ? p2 : NULL);
                        ASSERT_BITS_EQ(got, want, (size_t)m * n, "isa %s %s n %u m %u threads %d",
                                       pd_isa_name((pd_isa)isa), gemm_wtype_name(type), n, m, th + 1);
                    }
                free(a);
                gemm_free(g);
                mat_free(&t);
            }
    }
    pd_cpu_set_isa(pd_cpu_detect());
    pool_free(p2);
}
END_TEST

/* |x - y| <= 1e-5 * sum_k |a||w| (the scale of the dot product). */
static void assert_close(const float *x, const float *y, const float *a, const test_mat *t,
                         uint32_t m, const char *what)
{
    for (uint32_t i = 0; i < m; i++)
        for (uint32_t j = 0; j < t->n; j++) {
            double scale = 0.0;
            for (uint32_t kk = 0; kk < t->k; kk++)
                scale += fabs((double)a[(size_t)i * t->k + kk] * t->deq[(size_t)j * t->k + kk]);
            double d = fabs((double)x[(size_t)i * t->n + j] - (double)y[(size_t)i * t->n + j]);
            if (d > 1e-5 * scale)
                ck_abort_msg("%s: [%u][%u] %.9g vs %.9g (scale %.3g)", what, i, j,
                             (double)x[(size_t)i * t->n + j], (double)y[(size_t)i * t->n + j],
                             scale);
        }
}

START_TEST(gemm_agrees_with_openblas_within_tolerance)
{
    const uint32_t n = 97, k = 256, m = 33;
    pool *p = NULL;
    ck_assert_int_eq(pool_new(2, &p, NULL), PD_OK);
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        test_mat t = mat_make(all_types[ti], n, k, 777 + ti);
        gemm_w *gi = pack_or_die(&t, GEMM_BACKEND_INVARIANT);
        gemm_w *gb = pack_or_die(&t, GEMM_BACKEND_OPENBLAS);
        ck_assert_int_eq(gemm_get_backend(gb), GEMM_BACKEND_OPENBLAS);
        ck_assert_uint_eq(gemm_bytes(gb), (size_t)n * k * 4);
        float *a = act_make(m, k, 12 + ti);
        float *ci = malloc(sizeof(float) * m * n);
        float *cb = malloc(sizeof(float) * m * n);
        float *cd = malloc(sizeof(float) * m * n);
        gemm_run(gi, a, m, ci, p);
        gemm_run(gb, a, m, cb, p);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)m, (int)n, (int)k, 1.0f, a,
                    (int)k, t.deq, (int)k, 0.0f, cd, (int)n);
        assert_close(ci, cd, a, &t, m, "invariant vs cblas_sgemm");
        assert_close(cb, cd, a, &t, m, "openblas backend vs cblas_sgemm");
        free(a);
        free(ci);
        free(cb);
        free(cd);
        gemm_free(gi);
        gemm_free(gb);
        mat_free(&t);
    }
    pool_free(p);
}
END_TEST

/* A chain from +0.0f: a*w products that are all -0 sum to +0 (a kernel that
 * started from the first product would give -0). */
START_TEST(gemm_zero_products_give_positive_zero)
{
    const uint32_t n = 17, k = 5;
    float w[17 * 5], a[3 * 5], c[3 * 17];
    for (size_t x = 0; x < 17 * 5; x++)
        w[x] = 0.0f;
    for (size_t x = 0; x < 3 * 5; x++)
        a[x] = -1.5f;
    gemm_w *g = NULL;
    ck_assert_int_eq(gemm_pack(w, GEMM_W_F32, n, k, GEMM_BACKEND_INVARIANT, NULL, &g, NULL), PD_OK);
    for (int isa = PD_ISA_SCALAR; isa <= (int)pd_cpu_detect(); isa++) {
        pd_cpu_set_isa((pd_isa)isa);
        memset(c, 0x80, sizeof c);
        gemm_run(g, a, 3, c, NULL);
        for (size_t x = 0; x < 3 * 17; x++) {
            uint32_t bits;
            memcpy(&bits, &c[x], 4);
            ck_assert_msg(bits == 0, "isa %d: element %zu has bits %08x", isa, x, bits);
        }
    }
    gemm_free(g);
}
END_TEST

START_TEST(gemm_m_zero_leaves_c_untouched)
{
    float w[16 * 4] = {1.0f}, a[4] = {1.0f}, c[16];
    for (int x = 0; x < 16; x++)
        c[x] = 3.0f;
    gemm_w *g = NULL;
    ck_assert_int_eq(gemm_pack(w, GEMM_W_F32, 16, 4, GEMM_BACKEND_INVARIANT, NULL, &g, NULL), PD_OK);
    gemm_run(g, a, 0, c, NULL);
    for (int x = 0; x < 16; x++)
        ck_assert_float_eq(c[x], 3.0f);
    gemm_run(g, a, 1, c, NULL);
    ck_assert_float_eq(c[0], 1.0f);
    ck_assert_float_eq(c[1], 0.0f);
    gemm_free(g);
}
END_TEST

/* A counting allocator that can be told to fail. */
typedef struct count_alloc {
    size_t live_bytes;
    int live_blocks;
    int fail_after; /* allocations left before failing; < 0 = never */
} count_alloc;

static void *ca_alloc(void *ctx, size_t bytes)
{
    count_alloc *c = ctx;
    if (c->fail_after == 0)
        return NULL;
    if (c->fail_after > 0)
        c->fail_after--;
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (p) {
        c->live_bytes += bytes;
        c->live_blocks++;
    }
    return p;
}

static void ca_free(void *ctx, void *p, size_t bytes)
{
    count_alloc *c = ctx;
    if (!p)
        return;
    c->live_bytes -= bytes;
    c->live_blocks--;
    free(p);
}

START_TEST(gemm_pack_uses_and_returns_the_given_allocator)
{
    count_alloc ca = {.fail_after = -1};
    pd_alloc al = {.alloc = ca_alloc, .free = ca_free, .ctx = &ca};
    test_mat t = mat_make(GEMM_W_Q8_0, 33, 64, 1);
    gemm_w *g = NULL;
    ck_assert_int_eq(gemm_pack(t.raw, GEMM_W_Q8_0, 33, 64, GEMM_BACKEND_INVARIANT, &al, &g, NULL),
                     PD_OK);
    ck_assert_int_gt(ca.live_blocks, 0);
    ck_assert_uint_ge(ca.live_bytes, gemm_bytes(g));
    /* 3 panels x 2 blocks x 544 bytes: scales and int8 stay compact */
    ck_assert_uint_eq(gemm_bytes(g), 3u * 2u * 544u);
    ck_assert_uint_eq(gemm_rows_n(g), 33);
    ck_assert_uint_eq(gemm_cols_k(g), 64);
    ck_assert_int_eq(gemm_get_wtype(g), GEMM_W_Q8_0);
    ck_assert_int_eq(gemm_get_backend(g), GEMM_BACKEND_INVARIANT);
    gemm_free(g);
    ck_assert_int_eq(ca.live_blocks, 0);
    ck_assert_uint_eq(ca.live_bytes, 0);
    for (int fail = 0; fail < 2; fail++) {
        ca.fail_after = fail;
        gemm_w *sentinel = (gemm_w *)&ca;
        g = sentinel;
        pd_err err = {0};
        ck_assert_int_eq(gemm_pack(t.raw, GEMM_W_Q8_0, 33, 64, GEMM_BACKEND_INVARIANT, &al, &g, &err),
                         PD_ERR_NOMEM);
        ck_assert_ptr_eq(g, sentinel);
        ck_assert_int_eq(ca.live_blocks, 0);
        ck_assert_uint_eq(ca.live_bytes, 0);
        ck_assert(strlen(err.msg) > 0);
    }
    mat_free(&t);
    gemm_free(NULL);
}
END_TEST

static void expect_pack_fails(const void *w, gemm_wtype type, uint32_t n, uint32_t k,
                              gemm_backend be, pd_status want)
{
    gemm_w *sentinel = (gemm_w *)&sentinel, *g = sentinel;
    pd_err err = {0};
    pd_status st = gemm_pack(w, type, n, k, be, NULL, &g, &err);
    ck_assert_msg(st == want, "type %d n %u k %u be %d: status %d (%s), want %d", (int)type, n, k,
                  (int)be, (int)st, err.msg, (int)want);
    ck_assert_ptr_eq(g, sentinel);
    ck_assert_int_eq(err.status, want);
}

START_TEST(gemm_pack_rejects_bad_arguments)
{
    static float w[64 * 64];
    expect_pack_fails(NULL, GEMM_W_F32, 4, 4, GEMM_BACKEND_INVARIANT, PD_ERR_ARG);
    expect_pack_fails(w, GEMM_W_F32, 0, 4, GEMM_BACKEND_INVARIANT, PD_ERR_ARG);
    expect_pack_fails(w, GEMM_W_F32, 4, 0, GEMM_BACKEND_INVARIANT, PD_ERR_ARG);
    expect_pack_fails(w, GEMM_W_F32, 0, 0, GEMM_BACKEND_OPENBLAS, PD_ERR_ARG);
    expect_pack_fails(w, GEMM_W_COUNT, 4, 4, GEMM_BACKEND_INVARIANT, PD_ERR_ARG);
    expect_pack_fails(w, (gemm_wtype)-1, 4, 4, GEMM_BACKEND_INVARIANT, PD_ERR_ARG);
    expect_pack_fails(w, GEMM_W_F32, 4, 4, GEMM_BACKEND_COUNT, PD_ERR_ARG);
    expect_pack_fails(w, GEMM_W_Q8_0, 4, 48, GEMM_BACKEND_INVARIANT, PD_ERR_ARG);
    expect_pack_fails(w, GEMM_W_Q8_0, 4, 31, GEMM_BACKEND_OPENBLAS, PD_ERR_ARG);
    expect_pack_fails(w, GEMM_W_F32, UINT32_MAX, UINT32_MAX, GEMM_BACKEND_INVARIANT, PD_ERR_NOMEM);
    expect_pack_fails(w, GEMM_W_F16, UINT32_MAX, UINT32_MAX, GEMM_BACKEND_INVARIANT, PD_ERR_NOMEM);
    expect_pack_fails(w, GEMM_W_F32, 0x80000000u, 4, GEMM_BACKEND_OPENBLAS, PD_ERR_RANGE);
    gemm_w *g = NULL;
    ck_assert_int_eq(gemm_pack(w, GEMM_W_F32, 4, 4, GEMM_BACKEND_INVARIANT, NULL, NULL, NULL),
                     PD_ERR_ARG);
    ck_assert_ptr_null(g);
    ck_assert_uint_eq(gemm_row_bytes(GEMM_W_Q8_0, 64), 68);
    ck_assert_uint_eq(gemm_row_bytes(GEMM_W_Q8_0, 40), 0);
    ck_assert_uint_eq(gemm_row_bytes(GEMM_W_BF16, 7), 14);
    ck_assert_uint_eq(gemm_row_bytes(GEMM_W_F32, 7), 28);
    ck_assert_uint_eq(gemm_row_bytes(GEMM_W_COUNT, 7), 0);
    ck_assert_str_eq(gemm_wtype_name(GEMM_W_Q8_0), "q8_0");
    ck_assert_str_eq(gemm_wtype_name(GEMM_W_Q4_K), "q4_K");
    ck_assert_uint_eq(gemm_row_bytes(GEMM_W_Q4_0, 64), 36);
    ck_assert_uint_eq(gemm_row_bytes(GEMM_W_Q5_0, 64), 44);
    ck_assert_uint_eq(gemm_row_bytes(GEMM_W_Q4_K, 512), 288);
    ck_assert_uint_eq(gemm_row_bytes(GEMM_W_Q5_K, 256), 176);
    ck_assert_uint_eq(gemm_row_bytes(GEMM_W_Q6_K, 256), 210);
    ck_assert_uint_eq(gemm_row_bytes(GEMM_W_Q6_K, 128), 0);
    expect_pack_fails(w, GEMM_W_Q4_K, 4, 128, GEMM_BACKEND_INVARIANT, PD_ERR_ARG);
    /* non-finite f16 scales are refused before anything is allocated */
    {
        static const gemm_wtype bt[] = {GEMM_W_Q8_0, GEMM_W_Q4_0, GEMM_W_Q5_1, GEMM_W_Q4_K, GEMM_W_Q6_K};
        for (size_t i = 0; i < sizeof bt / sizeof bt[0]; i++) {
            test_mat t = mat_make(bt[i], 3, k_for(bt[i], 64), 5 + i);
            const uint32_t kk = t.k, bb = (uint32_t)gemm_row_bytes(bt[i], gemm_wtype_block(bt[i]));
            uint8_t *blk = t.raw + gemm_row_bytes(bt[i], kk) * 2 + bb * (kk / gemm_wtype_block(bt[i]) - 1);
            put16(blk + (bt[i] == GEMM_W_Q6_K ? 208 : 0), i % 2 ? 0x7c00 : 0xfe01);
            gemm_w *sentinel = (gemm_w *)&t, *g2 = sentinel;
            pd_err err = {0};
            ck_assert_int_eq(gemm_pack(t.raw, bt[i], 3, kk, GEMM_BACKEND_INVARIANT, NULL, &g2, &err), PD_ERR_FORMAT);
            ck_assert_ptr_eq(g2, sentinel);
            ck_assert_msg(strstr(err.msg, "row 2") && strstr(err.msg, gemm_wtype_name(bt[i])), "%s", err.msg);
            mat_free(&t);
        }
    }
    expect_pack_fails(w, GEMM_W_Q5_0, 4, 48, GEMM_BACKEND_OPENBLAS, PD_ERR_ARG);
    ck_assert_str_eq(gemm_backend_name(GEMM_BACKEND_OPENBLAS), "openblas");
    ck_assert_str_eq(gemm_backend_name(GEMM_BACKEND_INT8), "int8");
    ck_assert_str_eq(gemm_backend_name(GEMM_BACKEND_COUNT), "unknown");
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("gemm");
    TCase *tc = tcase_create("gemm");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, gemm_matches_the_fma_chain_for_every_type_and_isa);
    tcase_add_test(tc, gemm_row_bits_do_not_depend_on_m);
    tcase_add_test(tc, gemm_row_bits_do_not_depend_on_m_scalar_path);
    tcase_add_test(tc, gemm_bits_do_not_depend_on_thread_count);
    tcase_add_test(tc, gemm_bits_do_not_depend_on_n_split);
    tcase_add_loop_test(tc, gemm_run_many_equals_one_run_per_matrix, 0, 2); /* invariant, int8 */
    tcase_add_test(tc, gemm_run_beside_equals_gemm_run_and_runs_every_extra_task_once);
    tcase_add_test(tc, gemm_prefetch_start_changes_nothing);
    tcase_add_test(tc, gemm_simd_equals_scalar_bit_for_bit);
    tcase_add_test(tc, gemm_quantized_equals_f32_of_dequantized);
    tcase_add_test(tc, gemm_qs_values_equal_ggml_on_edge_blocks);
    tcase_add_test(tc, gemm_qs_packs_about_the_file_bytes);
    tcase_add_test(tc, gemm_qs_row_kernels_match_on_every_isa);
    tcase_add_test(tc, gemm_agrees_with_openblas_within_tolerance);
    tcase_add_test(tc, gemm_zero_products_give_positive_zero);
    tcase_add_test(tc, gemm_m_zero_leaves_c_untouched);
    tcase_add_test(tc, gemm_pack_uses_and_returns_the_given_allocator);
    tcase_add_test(tc, gemm_pack_rejects_bad_arguments);
    tcase_add_test(tc, gemm_int8_matches_its_arithmetic_for_every_type_isa_and_thread_count);
    tcase_add_test(tc, gemm_int8_is_near_the_exact_product_and_leaves_float_weights_alone);
    suite_add_tcase(s, tc);
    return s;
}
