/* The attention reduction (see attn.h for the exact order every path keeps)
 * and the project's exponential. This file holds the portable reference and
 * its AVX2+FMA twin; the twin computes the very same operations in the very
 * same order per result element, so the two agree bit for bit for every input
 * (tests/unit/test_attn.c checks across randomized configurations). At
 * PD_ISA_AVX512 the twin hands int8 rows of one Q head to the AVX-512F
 * kernels of attn_avx512.c, which keep the same order. */
#include "cache/attn.h"
#include "cache/attn_kern.h"

#include "base/check.h"
#include "base/cpu.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* Rows per block in the AVX2 path: the value pass keeps its accumulators in
 * registers across a block, and int8 rows shared by several Q heads are
 * dequantized a block at a time into scratch (attn_scratch_floats reserves
 * one block). */
#define ATTN_RB 16u

/* pd_expf's range: below LO the result is 0, above HI (~ln FLT_MAX) +inf. */
#define PD_EXPF_LO (-87.0f)
#define PD_EXPF_HI 88.72283935546875f
#define PD_EXPF_LOG2E 1.44269504088896341f

/* ------------------------------------------------------------------------ */
/* Portable reference                                                        */
/* ------------------------------------------------------------------------ */

float pd_expf(float x)
{
    if (x != x)
        return x;
    if (x < PD_EXPF_LO)
        return 0.0f;
    if (x > PD_EXPF_HI)
        return INFINITY;
    float n = rintf(x * PD_EXPF_LOG2E);
    float r = fmaf(n, -0.693359375f, x);
    r = fmaf(n, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = fmaf(p, r, 1.3981999507e-3f);
    p = fmaf(p, r, 8.3334519073e-3f);
    p = fmaf(p, r, 4.1665795894e-2f);
    p = fmaf(p, r, 1.6666665459e-1f);
    p = fmaf(p, r, 5.0000001201e-1f);
    float r2 = r * r;
    float y = fmaf(p, r2, r) + 1.0f;
    int32_t ni = (int32_t)n;
    if (ni > 127) { /* x near ln(FLT_MAX): 2^128 is no float, so double y first (exact) */
        y = y + y;
        ni = 127;
    }
    uint32_t bits = (uint32_t)(ni + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

#if defined(__x86_64__)
static float attn_dot8_avx2_entry(const float *a, const float *b, uint32_t n);
#endif

float attn_dot8(const float *a, const float *b, uint32_t n)
{
#if defined(__x86_64__)
    if (pd_cpu_isa() >= PD_ISA_AVX2)
        return attn_dot8_avx2_entry(a, b, n);
#endif
    return attn_dot8_scalar(a, b, n);
}

float attn_dot8_scalar(const float *a, const float *b, uint32_t n)
{
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t d = 0; d < n; d++)
        l[d & 7] = fmaf(a[d], b[d], l[d & 7]);
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

size_t attn_scratch_floats(uint32_t n_heads, uint32_t head_dim, uint32_t span)
{
    /* scores [n_heads x span] + qc [n_heads x head_dim] + one block of
     * ATTN_RB dequantized rows (the reference uses the first row of it) */
    return (size_t)n_heads * span + (size_t)n_heads * head_dim + (size_t)ATTN_RB * head_dim + 64;
}

/* Clamps [q->first, q->upto) to the rows held. Returns the span (0 when no row
 * is held) and the first visible logical row in *first. */
static uint32_t attn_visible(const attn_kv *kv, const attn_query *q, uint32_t *first)
{
    uint64_t total = 0;
    for (uint32_t s = 0; s < kv->n_segs; s++)
        total += kv->segs[s].rows;
    uint32_t upto = q->upto < total ? q->upto : (uint32_t)total;
    if (upto == 0)
        return *first = 0, 0;
    *first = q->first < upto ? q->first : upto - 1;
    return upto - *first;
}

/* The visible rows [first, upto) as blocks of at most ATTN_RB consecutive
 * rows of one segment, in logical order: the one walk every pass of both
 * paths makes (the scalar path takes a block's rows one by one).
 *   for (attn_walk w = attn_walk_start(kv, first, upto); attn_walk_next(&w);)
 *       ... rows [w.i, w.i + w.n) of w.seg, logical rows from w.r0 + w.i ... */
typedef struct attn_walk {
    const attn_kv *kv;
    uint32_t first, upto;
    uint32_t s;            /* the next segment to look at */
    uint32_t r0_next;      /* its first logical row */
    const attn_seg *seg;   /* the current block's segment (NULL before the first) */
    uint32_t r0;           /* seg's first logical row */
    uint32_t i, n;         /* the block: rows [i, i + n) of seg */
    uint32_t hi;           /* one past seg's last visible row */
} attn_walk;

static inline attn_walk attn_walk_start(const attn_kv *kv, uint32_t first, uint32_t upto)
{
    return (attn_walk){.kv = kv, .first = first, .upto = upto};
}

static inline uint32_t attn_min_u32(uint32_t a, uint32_t b)
{
    return a < b ? a : b;
}

/* Moves to the next block; false past the last visible row. */
static inline bool attn_walk_next(attn_walk *w)
{
    if (w->seg && w->i + w->n < w->hi) { /* the next block of this segment */
        w->i += w->n;
        w->n = attn_min_u32(w->hi - w->i, ATTN_RB);
        return true;
    }
    while (w->s < w->kv->n_segs) { /* the next segment with a visible row */
        const attn_seg *seg = &w->kv->segs[w->s++];
        uint32_t r0 = w->r0_next;
        w->r0_next += seg->rows;
        if (w->upto <= r0)
            return false;
        uint32_t lo = w->first > r0 ? w->first - r0 : 0;
        uint32_t hi = attn_min_u32(w->upto - r0, seg->rows);
        if (lo >= hi)
            continue;
        *w = (attn_walk){.kv = w->kv, .first = w->first, .upto = w->upto, .s = w->s, .r0_next = w->r0_next,
                         .seg = seg, .r0 = r0, .i = lo, .n = attn_min_u32(hi - lo, ATTN_RB), .hi = hi};
        return true;
    }
    return false;
}

/* qc[h][d] = q[h][d] * kcol[d] (or q[h][d]): the query per head. */
static void attn_query_cols(const attn_kv *kv, const attn_query *q, float *qc)
{
    const uint32_t hd = kv->head_dim;
    for (uint32_t h = 0; h < q->n_heads; h++)
        for (uint32_t d = 0; d < hd; d++)
            qc[h * hd + d] = kv->kcol ? q->q[h * hd + d] * kv->kcol[d] : q->q[h * hd + d];
}

/* out[h][d] *= vcol[d], when the value field is set. */
static void attn_value_cols(const attn_kv *kv, uint32_t nh, float *out)
{
    if (kv->vcol)
        for (uint32_t h = 0; h < nh; h++)
            for (uint32_t d = 0; d < kv->head_dim; d++)
                out[(size_t)h * kv->head_dim + d] *= kv->vcol[d];
}

/* Pointer to logical row r's key (or value) as f32: either the stored row or
 * the row dequantized into buf. */
static const float *attn_row(const attn_seg *s, uint32_t i, uint32_t hd, int want_v,
                             uint32_t group, float *buf)
{
    const float *f = want_v ? s->v : s->k;
    if (f)
        return f + (size_t)i * hd;
    const int8_t *q = (want_v ? s->vq : s->kq) + (size_t)i * hd;
    const float *sc = (want_v ? s->vs : s->ks) + (size_t)i * ((hd + group - 1) / group);
    for (uint32_t d = 0; d < hd; d++)
        buf[d] = (float)q[d] * sc[d / group];
    return buf;
}

/* Logit softcap; both paths call this one scalar function (libm tanhf). */
static float attn_softcap(float s, float cap)
{
    return cap * tanhf(s / cap);
}

static uint32_t attn_run_scalar(const attn_kv *kv, const attn_query *q, float *out, float *probs,
                                float *imp, float *scratch)
{
    const uint32_t hd = kv->head_dim, nh = q->n_heads;
    uint32_t first;
    uint32_t span = attn_visible(kv, q, &first);
    if (span == 0) {
        memset(out, 0, sizeof(float) * nh * hd);
        return 0;
    }
    uint32_t upto = first + span;

    float *scores = scratch;
    float *qc = scores + (size_t)nh * span;
    float *row = qc + (size_t)nh * hd;
    attn_query_cols(kv, q, qc);

    /* score pass: each visible K row read once for all heads */
    for (attn_walk w = attn_walk_start(kv, first, upto); attn_walk_next(&w);)
        for (uint32_t i = w.i; i < w.i + w.n; i++) {
            uint32_t j = w.r0 + i - first;
            const float *k = attn_row(w.seg, i, hd, 0, kv->k_group, row);
            for (uint32_t h = 0; h < nh; h++)
                scores[(size_t)h * span + j] = attn_dot8(qc + (size_t)h * hd, k, hd) * q->scale;
        }

    if (q->softcap > 0.0f)
        for (size_t j = 0; j < (size_t)nh * span; j++)
            scores[j] = attn_softcap(scores[j], q->softcap);

    for (uint32_t h = 0; h < nh; h++) {
        float *sc = scores + (size_t)h * span;
        float mx = -INFINITY;
        for (uint32_t j = 0; j < span; j++)
            mx = fmaxf(mx, sc[j]);
        if (q->sinks)
            mx = fmaxf(mx, q->sinks[h]);
        float sum = 0.0f;
        for (uint32_t j = 0; j < span; j++) {
            sc[j] = pd_expf(sc[j] - mx);
            sum += sc[j];
        }
        if (q->sinks)
            sum += pd_expf(q->sinks[h] - mx);
        for (uint32_t j = 0; j < span; j++)
            sc[j] = sc[j] / sum;
    }

    /* value pass: each visible V row read once for all heads */
    memset(out, 0, sizeof(float) * nh * hd);
    for (attn_walk w = attn_walk_start(kv, first, upto); attn_walk_next(&w);)
        for (uint32_t i = w.i; i < w.i + w.n; i++) {
            uint32_t j = w.r0 + i - first;
            const float *v = attn_row(w.seg, i, hd, 1, kv->v_group, row);
            for (uint32_t h = 0; h < nh; h++) {
                float p = scores[(size_t)h * span + j];
                float *o = out + (size_t)h * hd;
                for (uint32_t d = 0; d < hd; d++)
                    o[d] = fmaf(p, v[d], o[d]);
            }
        }
    attn_value_cols(kv, nh, out);

    if (imp)
        for (uint32_t h = 0; h < nh; h++)
            for (uint32_t j = 0; j < span; j++)
                imp[first + j] += scores[(size_t)h * span + j];
    if (probs)
        memcpy(probs, scores, sizeof(float) * nh * span);
    return span;
}

/* ------------------------------------------------------------------------ */
/* AVX2 + FMA twin                                                          */
/* ------------------------------------------------------------------------ */
#if defined(__x86_64__)
#define ATTN_AVX2 __attribute__((target("avx2,fma")))

/* pd_expf on 8 lanes: the same operations, constants, clamps and selects. */
ATTN_AVX2 static inline __m256 attn_expf8(__m256 x)
{
    __m256 nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
    __m256 under = _mm256_cmp_ps(x, _mm256_set1_ps(PD_EXPF_LO), _CMP_LT_OQ);
    __m256 over = _mm256_cmp_ps(x, _mm256_set1_ps(PD_EXPF_HI), _CMP_GT_OQ);
    /* rintf: round in the current mode (nearest-even by default), like the reference */
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(PD_EXPF_LOG2E)),
                               _MM_FROUND_CUR_DIRECTION);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-0.693359375f), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(2.12194440e-4f), r);
    __m256 p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    __m256 r2 = _mm256_mul_ps(r, r);
    __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
    __m256i ni = _mm256_cvtps_epi32(n); /* n is integral: exact */
    __m256i big = _mm256_cmpgt_epi32(ni, _mm256_set1_epi32(127));
    y = _mm256_blendv_ps(y, _mm256_add_ps(y, y), _mm256_castsi256_ps(big));
    ni = _mm256_min_epi32(ni, _mm256_set1_epi32(127));
    __m256 scale = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
    __m256 res = _mm256_mul_ps(y, scale);
    res = _mm256_blendv_ps(res, _mm256_set1_ps(INFINITY), over);
    res = _mm256_blendv_ps(res, _mm256_setzero_ps(), under);
    return _mm256_blendv_ps(res, x, nan);
}

ATTN_AVX2 static void attn_expf_n_avx2(const float *x, float *y, size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, attn_expf8(_mm256_loadu_ps(x + i)));
    for (; i < n; i++)
        y[i] = pd_expf(x[i]);
}

/* Rows stream from DRAM once per step. f32 rows, read in address order, are
 * left to the hardware prefetcher (measured: software prefetch only slowed
 * them down). int8 rows are compute-bound and read eight at a time in an
 * interleaved order, so their kernels prefetch the rows ATTN_PF_ROWS ahead,
 * a line at a time between the arithmetic (measured ~8% over prefetching a
 * whole block at once, which stalls on full miss buffers); int8 rows that
 * go through buf prefetch the block ATTN_PF_BLOCKS ahead. No prefetch runs
 * past a segment's end. */
#define ATTN_PF_BLOCKS 2u /* ATTN_PF_ROWS: attn_kern.h */

/* always_inline: GCC sees a prefetch as free of side effects, so an
 * out-of-line helper made of prefetches is deemed pure and its calls deleted. */
static inline __attribute__((always_inline)) void attn_prefetch(const void *p, size_t bytes)
{
    const char *c = p;
    for (size_t o = 0; o < bytes; o += 64)
        _mm_prefetch(c + o, _MM_HINT_T0);
}

/* Prefetches rows [i, i + n) of a segment's int8 K (want_v = 0) or V codes
 * and scales. */
static inline __attribute__((always_inline)) void
attn_prefetch_rows(const attn_seg *g, uint32_t i, uint32_t n, uint32_t hd, uint32_t ng, int want_v)
{
    attn_prefetch((want_v ? g->vq : g->kq) + (size_t)i * hd, (size_t)n * hd);
    attn_prefetch((want_v ? g->vs : g->ks) + (size_t)i * ng, (size_t)n * ng * sizeof(float));
}

/* All-ones in lanes [0, rem), rem in 1..8. */
ATTN_AVX2 static inline __m256i attn_mask(uint32_t rem)
{
    static const int32_t m[16] = {-1, -1, -1, -1, -1, -1, -1, -1, 0, 0, 0, 0, 0, 0, 0, 0};
    return _mm256_loadu_si256((const __m256i *)(m + 8 - rem));
}

/* dot8's final combine: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). */
ATTN_AVX2 static inline float attn_hsum8(__m256 a)
{
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t)); /* u0 = (l0+l4)+(l2+l6), u1 = (l1+l5)+(l3+l7) */
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

/* dot8(qh, k_i, hd) for four rows at once: four independent chains, each
 * lane exactly the reference's fmaf chain; for rows already in L1 (buf),
 * where FMA latency, not memory order, is the limit. In the last partial
 * block the lanes at or beyond hd keep their value (blend), as the reference
 * never touches them. */
ATTN_AVX2 static inline void attn_dot8x4(const float *qh, const float *k0, const float *k1,
                                          const float *k2, const float *k3, uint32_t hd,
                                          float dots[4])
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    uint32_t d = 0;
    for (; d + 8 <= hd; d += 8) {
        __m256 qv = _mm256_loadu_ps(qh + d);
        a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k0 + d), a0);
        a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k1 + d), a1);
        a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k2 + d), a2);
        a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k3 + d), a3);
    }
    if (d < hd) {
        __m256i m = attn_mask(hd - d);
        __m256 mf = _mm256_castsi256_ps(m);
        __m256 qv = _mm256_maskload_ps(qh + d, m);
        a0 = _mm256_blendv_ps(a0, _mm256_fmadd_ps(qv, _mm256_maskload_ps(k0 + d, m), a0), mf);
        a1 = _mm256_blendv_ps(a1, _mm256_fmadd_ps(qv, _mm256_maskload_ps(k1 + d, m), a1), mf);
        a2 = _mm256_blendv_ps(a2, _mm256_fmadd_ps(qv, _mm256_maskload_ps(k2 + d, m), a2), mf);
        a3 = _mm256_blendv_ps(a3, _mm256_fmadd_ps(qv, _mm256_maskload_ps(k3 + d, m), a3), mf);
    }
    dots[0] = attn_hsum8(a0);
    dots[1] = attn_hsum8(a1);
    dots[2] = attn_hsum8(a2);
    dots[3] = attn_hsum8(a3);
}

/* dot8(qh, k, hd) for one row. Rows are taken one after another so the K
 * stream is read in address order (measured: 30% faster from DRAM than four
 * interleaved rows); the out-of-order core overlaps consecutive rows' chains. */
ATTN_AVX2 static inline float attn_dot8x1(const float *qh, const float *k, uint32_t hd)
{
    __m256 a = _mm256_setzero_ps();
    uint32_t d = 0;
    for (; d + 8 <= hd; d += 8)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(qh + d), _mm256_loadu_ps(k + d), a);
    if (d < hd) { /* lanes at or beyond hd keep their value, as in the reference */
        __m256i m = attn_mask(hd - d);
        __m256 t = _mm256_fmadd_ps(_mm256_maskload_ps(qh + d, m), _mm256_maskload_ps(k + d, m), a);
        a = _mm256_blendv_ps(a, t, _mm256_castsi256_ps(m));
    }
    return attn_hsum8(a);
}

/* 8 int8 channels as f32 times their scale: (float)q[d] * s, one rounding. */
ATTN_AVX2 static inline __m256 attn_i8x8(const int8_t *p, __m256 s)
{
    __m128i b = _mm_loadl_epi64((const __m128i *)p);
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
}

/* attn_dot8x4 on int8 rows dequantized in registers (one Q head: nothing to
 * share a dequantized row with). Needs hd % 8 == 0 and group % 8 == 0, so a
 * block of 8 channels never straddles a scale group. */
ATTN_AVX2 static inline void attn_dot8x4_q8(const float *qh, const int8_t *k0, const int8_t *k1,
                                             const int8_t *k2, const int8_t *k3, const float *s0,
                                             const float *s1, const float *s2, const float *s3,
                                             uint32_t hd, uint32_t group, float dots[4])
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (uint32_t g = 0, d = 0; d < hd; g++) {
        const __m256 c0 = _mm256_broadcast_ss(s0 + g), c1 = _mm256_broadcast_ss(s1 + g);
        const __m256 c2 = _mm256_broadcast_ss(s2 + g), c3 = _mm256_broadcast_ss(s3 + g);
        const uint32_t end = (g + 1) * group < hd ? (g + 1) * group : hd;
        for (; d < end; d += 8) {
            __m256 qv = _mm256_loadu_ps(qh + d);
            a0 = _mm256_fmadd_ps(qv, attn_i8x8(k0 + d, c0), a0);
            a1 = _mm256_fmadd_ps(qv, attn_i8x8(k1 + d, c1), a1);
            a2 = _mm256_fmadd_ps(qv, attn_i8x8(k2 + d, c2), a2);
            a3 = _mm256_fmadd_ps(qv, attn_i8x8(k3 + d, c3), a3);
        }
    }
    dots[0] = attn_hsum8(a0);
    dots[1] = attn_hsum8(a1);
    dots[2] = attn_hsum8(a2);
    dots[3] = attn_hsum8(a3);
}

/* attn_dot8x4_q8 for eight consecutive rows (row i at k + i*hd, its scales
 * at ks + i*ng): eight independent chains keep the FMA pipes busy where four
 * would wait on FMA latency. */
#define ATTN_K8(i)                                                                              \
    a##i = _mm256_fmadd_ps(qv, attn_i8x8(kd + (i) * (size_t)hd, _mm256_broadcast_ss(sg + (i) * (size_t)ng)), a##i)

ATTN_AVX2 static inline void attn_dot8x8_q8(const float *qh, const int8_t *k, const float *ks,
                                             uint32_t hd, uint32_t ng, uint32_t group,
                                             float dots[8], const int8_t *pf, const float *pfs)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    if (pf) /* the eight rows ATTN_PF_ROWS ahead: their scales now, their codes spread below */
        attn_prefetch(pfs, (size_t)8 * ng * sizeof(float));
    for (uint32_t g = 0, d = 0; d < hd; g++) {
        const uint32_t end = (g + 1) * group < hd ? (g + 1) * group : hd;
        const float *sg = ks + g;
        for (; d < end; d += 8) {
            if (pf) /* 8 rows x hd bytes over hd / 8 steps: one line per step */
                _mm_prefetch((const char *)pf + 8 * (size_t)d, _MM_HINT_T0);
            const __m256 qv = _mm256_loadu_ps(qh + d);
            const int8_t *kd = k + d;
            ATTN_K8(0); ATTN_K8(1); ATTN_K8(2); ATTN_K8(3);
            ATTN_K8(4); ATTN_K8(5); ATTN_K8(6); ATTN_K8(7);
        }
    }
    dots[0] = attn_hsum8(a0);
    dots[1] = attn_hsum8(a1);
    dots[2] = attn_hsum8(a2);
    dots[3] = attn_hsum8(a3);
    dots[4] = attn_hsum8(a4);
    dots[5] = attn_hsum8(a5);
    dots[6] = attn_hsum8(a6);
    dots[7] = attn_hsum8(a7);
}

/* n int8 rows -> f32 rows in dst: dst[d] = (float)q[d] * sc[d / group], one
 * rounding per element exactly as the reference's attn_row. */
ATTN_AVX2 static void attn_dequant_rows(const int8_t *q, const float *sc, uint32_t hd,
                                        uint32_t group, uint32_t n, float *dst)
{
    CHECK(group > 0);
    const uint32_t ng = (hd + group - 1) / group;
    for (uint32_t r = 0; r < n; r++) {
        const int8_t *qr = q + (size_t)r * hd;
        const float *sr = sc + (size_t)r * ng;
        float *o = dst + (size_t)r * hd;
        uint32_t d = 0;
        if (group % 8 == 0) /* a block of 8 channels shares one scale */
            for (uint32_t g = 0; d + 8 <= hd; g++) {
                const __m256 sv = _mm256_broadcast_ss(sr + g);
                const uint32_t end = (g + 1) * group < hd ? (g + 1) * group : hd;
                for (; d + 8 <= end; d += 8) {
                    __m128i b = _mm_loadl_epi64((const __m128i *)(qr + d));
                    __m256 f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
                    _mm256_storeu_ps(o + d, _mm256_mul_ps(f, sv));
                }
            }
        for (; d < hd; d++)
            o[d] = (float)qr[d] * sr[d / group];
    }
}

/* The value pass over a block of n rows (row r at v + r*hd, probability
 * p[r]) for channels [0, 8*NB) of one head: out's accumulators stay in
 * registers across the block; each lane is the reference's fmaf chain
 * continued in row order. NB (a constant at every call site) goes up to 16
 * so a 128-channel row is consumed whole and V streams in address order
 * (measured ~8% faster from DRAM than two 64-channel passes). */
#define ATTN_VACC(c) \
    do { if (NB > (c)) a##c = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vr + 8 * (c)), a##c); } while (0)
#define ATTN_VLOAD(c) __m256 a##c = NB > (c) ? _mm256_loadu_ps(o + 8 * (c)) : _mm256_setzero_ps()
#define ATTN_VSTORE(c) do { if (NB > (c)) _mm256_storeu_ps(o + 8 * (c), a##c); } while (0)

ATTN_AVX2 static inline __attribute__((always_inline)) void
attn_vblock(float *o, const float *v, uint32_t hd, const float *p, uint32_t n, const int NB)
{
    ATTN_VLOAD(0); ATTN_VLOAD(1); ATTN_VLOAD(2); ATTN_VLOAD(3);
    ATTN_VLOAD(4); ATTN_VLOAD(5); ATTN_VLOAD(6); ATTN_VLOAD(7);
    ATTN_VLOAD(8); ATTN_VLOAD(9); ATTN_VLOAD(10); ATTN_VLOAD(11);
    ATTN_VLOAD(12); ATTN_VLOAD(13); ATTN_VLOAD(14); ATTN_VLOAD(15);
    for (uint32_t r = 0; r < n; r++) {
        const float *vr = v + (size_t)r * hd;
        __m256 pv = _mm256_broadcast_ss(p + r);
        ATTN_VACC(0); ATTN_VACC(1); ATTN_VACC(2); ATTN_VACC(3);
        ATTN_VACC(4); ATTN_VACC(5); ATTN_VACC(6); ATTN_VACC(7);
        ATTN_VACC(8); ATTN_VACC(9); ATTN_VACC(10); ATTN_VACC(11);
        ATTN_VACC(12); ATTN_VACC(13); ATTN_VACC(14); ATTN_VACC(15);
    }
    ATTN_VSTORE(0); ATTN_VSTORE(1); ATTN_VSTORE(2); ATTN_VSTORE(3);
    ATTN_VSTORE(4); ATTN_VSTORE(5); ATTN_VSTORE(6); ATTN_VSTORE(7);
    ATTN_VSTORE(8); ATTN_VSTORE(9); ATTN_VSTORE(10); ATTN_VSTORE(11);
    ATTN_VSTORE(12); ATTN_VSTORE(13); ATTN_VSTORE(14); ATTN_VSTORE(15);
}

/* attn_vblock on int8 rows with one scale per row (v_group >= hd), the
 * scale applied in registers: v = (float)q[d] * s_r, then the same fmaf. */
#define ATTN_VACCQ(c)                                                                          \
    do {                                                                                       \
        if (NB > (c))                                                                          \
            a##c = _mm256_fmadd_ps(pv, attn_i8x8(vr + 8 * (c), sv), a##c);                     \
    } while (0)

ATTN_AVX2 static inline __attribute__((always_inline)) void
attn_vblock_q8(float *o, const int8_t *v, const float *vs, uint32_t hd, const float *p, uint32_t n,
               const int NB, const int8_t *pf, const float *pfs, uint32_t npf)
{
    ATTN_VLOAD(0); ATTN_VLOAD(1); ATTN_VLOAD(2); ATTN_VLOAD(3);
    ATTN_VLOAD(4); ATTN_VLOAD(5); ATTN_VLOAD(6); ATTN_VLOAD(7);
    ATTN_VLOAD(8); ATTN_VLOAD(9); ATTN_VLOAD(10); ATTN_VLOAD(11);
    ATTN_VLOAD(12); ATTN_VLOAD(13); ATTN_VLOAD(14); ATTN_VLOAD(15);
    for (uint32_t r = 0; r < n; r++) {
        const int8_t *vr = v + (size_t)r * hd;
        if (r < npf) { /* row r + ATTN_PF_ROWS: its codes and scale */
            attn_prefetch(pf + (size_t)r * hd, hd);
            _mm_prefetch((const char *)(pfs + r), _MM_HINT_T0);
        }
        const __m256 pv = _mm256_broadcast_ss(p + r), sv = _mm256_broadcast_ss(vs + r);
        ATTN_VACCQ(0); ATTN_VACCQ(1); ATTN_VACCQ(2); ATTN_VACCQ(3);
        ATTN_VACCQ(4); ATTN_VACCQ(5); ATTN_VACCQ(6); ATTN_VACCQ(7);
        ATTN_VACCQ(8); ATTN_VACCQ(9); ATTN_VACCQ(10); ATTN_VACCQ(11);
        ATTN_VACCQ(12); ATTN_VACCQ(13); ATTN_VACCQ(14); ATTN_VACCQ(15);
    }
    ATTN_VSTORE(0); ATTN_VSTORE(1); ATTN_VSTORE(2); ATTN_VSTORE(3);
    ATTN_VSTORE(4); ATTN_VSTORE(5); ATTN_VSTORE(6); ATTN_VSTORE(7);
    ATTN_VSTORE(8); ATTN_VSTORE(9); ATTN_VSTORE(10); ATTN_VSTORE(11);
    ATTN_VSTORE(12); ATTN_VSTORE(13); ATTN_VSTORE(14); ATTN_VSTORE(15);
}

/* Rows [0, n) of int8 values with one scale per row; hd % 8 == 0. */
/* Rows [0, n) of int8 values with one scale per row; hd % 8 == 0. The
 * first channel chunk also prefetches rows [ATTN_PF_ROWS, ATTN_PF_ROWS +
 * npf) ahead, npf <= n. */
ATTN_AVX2 static void attn_vrows_q8(float *o, const int8_t *v, const float *vs, uint32_t hd,
                                    const float *p, uint32_t n, uint32_t npf)
{
    const int8_t *pf = v + (size_t)ATTN_PF_ROWS * hd;
    const float *pfs = vs + ATTN_PF_ROWS;
    uint32_t d = 0;
    for (; d + 128 <= hd; d += 128, npf = 0)
        attn_vblock_q8(o + d, v + d, vs, hd, p, n, 16, pf, pfs, npf);
    for (; d + 64 <= hd; d += 64, npf = 0)
        attn_vblock_q8(o + d, v + d, vs, hd, p, n, 8, pf, pfs, npf);
    if (d + 32 <= hd) {
        attn_vblock_q8(o + d, v + d, vs, hd, p, n, 4, pf, pfs, npf);
        d += 32, npf = 0;
    }
    if (d + 16 <= hd) {
        attn_vblock_q8(o + d, v + d, vs, hd, p, n, 2, pf, pfs, npf);
        d += 16, npf = 0;
    }
    if (d + 8 <= hd)
        attn_vblock_q8(o + d, v + d, vs, hd, p, n, 1, pf, pfs, npf);
}

/* The last rem (< 8) channels: lanes beyond hd are neither loaded nor stored. */
ATTN_AVX2 static void attn_vtail(float *o, const float *v, uint32_t hd, const float *p, uint32_t n,
                                 uint32_t rem)
{
    __m256i m = attn_mask(rem);
    __m256 a = _mm256_maskload_ps(o, m);
    for (uint32_t r = 0; r < n; r++)
        a = _mm256_fmadd_ps(_mm256_broadcast_ss(p + r), _mm256_maskload_ps(v + (size_t)r * hd, m), a);
    _mm256_maskstore_ps(o, m, a);
}

ATTN_AVX2 static void attn_vrows(float *o, const float *v, uint32_t hd, const float *p, uint32_t n)
{
    uint32_t d = 0;
    for (; d + 128 <= hd; d += 128)
        attn_vblock(o + d, v + d, hd, p, n, 16);
    for (; d + 64 <= hd; d += 64)
        attn_vblock(o + d, v + d, hd, p, n, 8);
    if (d + 32 <= hd) {
        attn_vblock(o + d, v + d, hd, p, n, 4);
        d += 32;
    }
    if (d + 16 <= hd) {
        attn_vblock(o + d, v + d, hd, p, n, 2);
        d += 16;
    }
    if (d + 8 <= hd) {
        attn_vblock(o + d, v + d, hd, p, n, 1);
        d += 8;
    }
    if (d < hd)
        attn_vtail(o + d, v + d, hd, p, n, hd - d);
}

/* One head's scores -> probabilities, in place: vector max (ignoring NaN
 * scores like fmaxf; the sign of a zero max cannot change s - max's exp),
 * vector exp, the row-order sum kept sequential (it is the definition),
 * vector division. */
ATTN_AVX2 static void attn_softmax_avx2(float *sc, uint32_t span, const float *sink)
{
    __m256 m8 = _mm256_set1_ps(-INFINITY);
    uint32_t j = 0;
    for (; j + 8 <= span; j += 8)
        m8 = _mm256_max_ps(_mm256_loadu_ps(sc + j), m8); /* NaN score: keeps m8 */
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m8), _mm256_extractf128_ps(m8, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    float mx = _mm_cvtss_f32(m4);
    for (; j < span; j++)
        mx = fmaxf(mx, sc[j]);
    if (sink)
        mx = fmaxf(mx, *sink);

    /* one loop, so the exps of the next rows overlap the serial add chain */
    __m256 mv = _mm256_set1_ps(mx);
    float sum = 0.0f;
    for (j = 0; j + 8 <= span; j += 8) {
        _mm256_storeu_ps(sc + j, attn_expf8(_mm256_sub_ps(_mm256_loadu_ps(sc + j), mv)));
        sum += sc[j];
        sum += sc[j + 1];
        sum += sc[j + 2];
        sum += sc[j + 3];
        sum += sc[j + 4];
        sum += sc[j + 5];
        sum += sc[j + 6];
        sum += sc[j + 7];
    }
    for (; j < span; j++) {
        sc[j] = pd_expf(sc[j] - mx);
        sum += sc[j];
    }
    if (sink)
        sum += pd_expf(*sink - mx);

    __m256 sv = _mm256_set1_ps(sum);
    for (j = 0; j + 8 <= span; j += 8)
        _mm256_storeu_ps(sc + j, _mm256_div_ps(_mm256_loadu_ps(sc + j), sv));
    for (; j < span; j++)
        sc[j] = sc[j] / sum;
}

/* What the AVX2 passes of one attn_run share. */
typedef struct attn_pass {
    const attn_kv *kv;
    const attn_query *q;
    uint32_t hd, nh, span;
    uint32_t ngk, ngv;     /* scale groups per int8 K / V row (0: no int8 rows of that kind) */
    int k_inline, v_inline; /* int8 rows dequantized in registers (one Q head) */
    int wide;              /* the AVX-512 kernels for those */
    const float *qc;       /* [nh x hd] */
    float *buf;            /* ATTN_RB dequantized rows */
} attn_pass;

/* Prefetches the int8 block ATTN_PF_BLOCKS blocks ahead of row i (within
 * the segment's visible rows [.., hi)). */
ATTN_AVX2 static inline __attribute__((always_inline)) void
attn_prefetch_ahead(const attn_seg *seg, uint32_t i, uint32_t hi, uint32_t hd, uint32_t ng, int want_v)
{
    uint32_t pf = i + ATTN_PF_BLOCKS * ATTN_RB;
    if (pf < hi)
        attn_prefetch_rows(seg, pf, attn_min_u32(hi - pf, ATTN_RB), hd, ng, want_v);
}

/* Scores of rows [i, i + n) of int8 keys for one Q head, dequantized in
 * registers, eight rows at a time then four; dst[t] for row i + t. */
ATTN_AVX2 static void attn_scores_q8_inline(const attn_pass *c, const attn_seg *seg, uint32_t i, uint32_t n,
                                            uint32_t hi, float *dst)
{
    const uint32_t hd = c->hd, ngk = c->ngk, group = c->kv->k_group;
    const float scale = c->q->scale;
    const int8_t *kq = seg->kq + (size_t)i * hd;
    const float *ks = seg->ks + (size_t)i * ngk;
    uint32_t t = 0;
    for (; t + 8 <= n; t += 8) {
        float dots[8];
        int ahead = i + t + 8 + ATTN_PF_ROWS <= hi;
        const int8_t *kt = kq + (size_t)t * hd, *kpf = ahead ? kt + (size_t)ATTN_PF_ROWS * hd : NULL;
        const float *st = ks + (size_t)t * ngk, *pfs = ahead ? st + (size_t)ATTN_PF_ROWS * ngk : NULL;
        if (c->wide)
            attn_avx512_dot8x8_q8(c->qc, kt, st, hd, ngk, group, dots, kpf, pfs);
        else
            attn_dot8x8_q8(c->qc, kt, st, hd, ngk, group, dots, kpf, pfs);
        for (uint32_t x = 0; x < 8; x++)
            dst[t + x] = dots[x] * scale;
    }
    for (; t < n; t += 4) {
        size_t u[4]; /* a short last group repeats its last row */
        for (uint32_t x = 0; x < 4; x++)
            u[x] = t + x < n ? t + x : n - 1;
        float dots[4];
        attn_dot8x4_q8(c->qc, kq + u[0] * hd, kq + u[1] * hd, kq + u[2] * hd, kq + u[3] * hd, ks + u[0] * ngk,
                       ks + u[1] * ngk, ks + u[2] * ngk, ks + u[3] * ngk, hd, group, dots);
        for (uint32_t x = 0; x < 4 && t + x < n; x++)
            dst[t + x] = dots[x] * scale;
    }
}

/* The score pass over one block (rows [i, i + n) of seg): read once, it
 * serves every head; head h's scores at dst + h * span. */
ATTN_AVX2 static void attn_scores_block(const attn_pass *c, const attn_seg *seg, uint32_t i, uint32_t n,
                                        uint32_t hi, float *dst)
{
    const uint32_t hd = c->hd;
    const float scale = c->q->scale;
    if (!seg->k && !c->k_inline)
        attn_prefetch_ahead(seg, i, hi, hd, c->ngk, 0);
    if (!seg->k && c->k_inline) {
        attn_scores_q8_inline(c, seg, i, n, hi, dst);
        return;
    }
    const float *k = seg->k ? seg->k + (size_t)i * hd : c->buf;
    if (!seg->k)
        attn_dequant_rows(seg->kq + (size_t)i * hd, seg->ks + (size_t)i * c->ngk, hd, c->kv->k_group, n, c->buf);
    for (uint32_t h = 0; h < c->nh; h++) {
        const float *qh = c->qc + (size_t)h * hd;
        float *dh = dst + (size_t)h * c->span;
        if (seg->k) { /* streamed from memory: in address order */
            for (uint32_t t = 0; t < n; t++)
                dh[t] = attn_dot8x1(qh, k + (size_t)t * hd, hd) * scale;
            continue;
        }
        for (uint32_t t = 0; t < n; t += 4) { /* rows in buf (L1): four chains */
            /* a short last group repeats its last row; extra dots are dropped */
            const float *kr[4];
            for (uint32_t u = 0; u < 4; u++)
                kr[u] = k + (size_t)(t + u < n ? t + u : n - 1) * hd;
            float dots[4];
            attn_dot8x4(qh, kr[0], kr[1], kr[2], kr[3], hd, dots);
            for (uint32_t u = 0; u < 4 && t + u < n; u++)
                dh[t + u] = dots[u] * scale;
        }
    }
}

/* The value pass over one block (rows [i, i + n) of seg): read once, it
 * serves every head; head h's probabilities at p + h * span. */
ATTN_AVX2 static void attn_values_block(const attn_pass *c, const attn_seg *seg, uint32_t i, uint32_t n,
                                        uint32_t hi, const float *p, float *out)
{
    const uint32_t hd = c->hd;
    if (!seg->v && !c->v_inline)
        attn_prefetch_ahead(seg, i, hi, hd, c->ngv, 1);
    if (!seg->v && c->v_inline) {
        uint32_t npf = i + ATTN_PF_ROWS < hi ? hi - (i + ATTN_PF_ROWS) : 0;
        const int8_t *vq = seg->vq + (size_t)i * hd;
        npf = npf < n ? npf : n;
        if (c->wide)
            attn_avx512_vrows_q8(out, vq, seg->vs + i, hd, p, n, npf);
        else
            attn_vrows_q8(out, vq, seg->vs + i, hd, p, n, npf);
        return;
    }
    const float *v = seg->v ? seg->v + (size_t)i * hd : c->buf;
    if (!seg->v)
        attn_dequant_rows(seg->vq + (size_t)i * hd, seg->vs + (size_t)i * c->ngv, hd, c->kv->v_group, n, c->buf);
    for (uint32_t h = 0; h < c->nh; h++)
        attn_vrows(out + (size_t)h * hd, v, hd, p + (size_t)h * c->span, n);
}

ATTN_AVX2 static uint32_t attn_run_avx2(const attn_kv *kv, const attn_query *q, float *out,
                                        float *probs, float *imp, float *scratch)
{
    const uint32_t hd = kv->head_dim, nh = q->n_heads;
    uint32_t first;
    uint32_t span = attn_visible(kv, q, &first);
    if (span == 0) {
        memset(out, 0, sizeof(float) * nh * hd);
        return 0;
    }
    const uint32_t upto = first + span;
    float *scores = scratch;
    float *qc = scores + (size_t)nh * span;
    attn_pass c = {
        .kv = kv,
        .q = q,
        .hd = hd,
        .nh = nh,
        .span = span,
        /* groups only matter (and must be > 0) for int8 segments */
        .ngk = kv->k_group ? (hd + kv->k_group - 1) / kv->k_group : 0,
        .ngv = kv->v_group ? (hd + kv->v_group - 1) / kv->v_group : 0,
        .qc = qc,
        .buf = qc + (size_t)nh * hd,
    };
    /* With one Q head an int8 row serves a single dot (value sum), so it is
     * dequantized in registers; with several it is dequantized once into buf. */
    c.k_inline = nh == 1 && hd % 8 == 0 && kv->k_group % 8 == 0;
    c.v_inline = nh == 1 && hd % 8 == 0 && c.ngv == 1;
    /* those two cases are compute-bound: AVX-512 kernels where agreed */
    c.wide = pd_cpu_isa() >= PD_ISA_AVX512;
    attn_query_cols(kv, q, qc);

    for (attn_walk w = attn_walk_start(kv, first, upto); attn_walk_next(&w);)
        attn_scores_block(&c, w.seg, w.i, w.n, w.hi, scores + (w.r0 + w.i - first));

    if (q->softcap > 0.0f)
        for (size_t j = 0; j < (size_t)nh * span; j++)
            scores[j] = attn_softcap(scores[j], q->softcap);

    for (uint32_t h = 0; h < nh; h++)
        attn_softmax_avx2(scores + (size_t)h * span, span, q->sinks ? q->sinks + h : NULL);

    memset(out, 0, sizeof(float) * nh * hd);
    for (attn_walk w = attn_walk_start(kv, first, upto); attn_walk_next(&w);)
        attn_values_block(&c, w.seg, w.i, w.n, w.hi, scores + (w.r0 + w.i - first), out);
    attn_value_cols(kv, nh, out);

    if (imp) {
        uint32_t j = 0;
        for (; j + 8 <= span; j += 8) {
            __m256 a = _mm256_loadu_ps(imp + first + j);
            for (uint32_t h = 0; h < nh; h++)
                a = _mm256_add_ps(a, _mm256_loadu_ps(scores + (size_t)h * span + j));
            _mm256_storeu_ps(imp + first + j, a);
        }
        for (; j < span; j++)
            for (uint32_t h = 0; h < nh; h++)
                imp[first + j] += scores[(size_t)h * span + j];
    }
    if (probs)
        memcpy(probs, scores, sizeof(float) * nh * span);
    return span;
}
#endif /* __x86_64__ */

/* ------------------------------------------------------------------------ */
/* Dispatch                                                                  */
/* ------------------------------------------------------------------------ */

uint32_t attn_run(const attn_kv *kv, const attn_query *q, float *out, float *probs, float *imp,
                  float *scratch)
{
    CHECK(kv->head_dim > 0 && q->n_heads > 0);
    CHECK(kv->n_segs == 0 || kv->segs != NULL);
    for (uint32_t s = 0; s < kv->n_segs; s++) {
        const attn_seg *g = &kv->segs[s];
        if (g->rows == 0)
            continue;
        CHECK((g->k != NULL) != (g->kq != NULL) && (g->v != NULL) != (g->vq != NULL));
        CHECK(!g->kq || (g->ks && kv->k_group > 0));
        CHECK(!g->vq || (g->vs && kv->v_group > 0));
    }
#if defined(__x86_64__)
    if (pd_cpu_isa() >= PD_ISA_AVX2)
        return attn_run_avx2(kv, q, out, probs, imp, scratch);
#endif
    return attn_run_scalar(kv, q, out, probs, imp, scratch);
}

#if defined(__x86_64__)
/* attn_dot8 on the AVX2 path: the same lane chains as the reference. */
ATTN_AVX2 static float attn_dot8_avx2_entry(const float *a, const float *b, uint32_t n)
{
    return attn_dot8x1(a, b, n);
}
#endif

void pd_expf_n(const float *x, float *y, size_t n)
{
#if defined(__x86_64__)
    if (pd_cpu_isa() >= PD_ISA_AVX2) {
        attn_expf_n_avx2(x, y, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        y[i] = pd_expf(x[i]);
}
