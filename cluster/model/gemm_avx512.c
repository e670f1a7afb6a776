/* The GEMM's AVX-512F micro-kernels (tables in gemm_kern.h; gemm.c picks
 * them at PD_ISA_AVX512). A panel's k row of 16 weights is one zmm, so a
 * tile row needs one accumulator where AVX2 needs two; every lane still runs
 * its own fmaf chain over k in order, the chain of the portable kernel, so
 * the bits are the same on every ISA.
 *
 * Built twice: for the CPU (immintrin.h, target avx512f), and, in the test
 * test_gemm_avx512, with PD_AVX512_EMULATED on SIMDe's portable AVX-512
 * (libsimde-dev), which runs each 512-bit operation as AVX2/FMA ones, so the
 * same source is checked bit for bit against the portable kernel on CPUs
 * without AVX-512. */
#include "cluster/model/gemm_kern.h"

#if defined(__x86_64__)

#include <string.h>

#ifdef PD_AVX512_EMULATED
#if !defined(__AVX2__) || !defined(__FMA__) || !defined(__F16C__)
#error "the emulated build runs SIMDe's 512-bit FMA as two native 256-bit ones: compile with -mavx2 -mfma -mf16c"
#endif
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#include <simde/x86/f16c.h>
#else
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif

#include "cluster/model/gemm_qs_sse.h"

static inline __attribute__((always_inline)) void gemm_avx512_store(float *c, __m512 x, uint32_t ncols)
{
    if (ncols == GEMM_NR) {
        _mm512_storeu_ps(c, x);
        return;
    }
    float tmp[GEMM_NR];
    _mm512_storeu_ps(tmp, x);
    memcpy(c, tmp, (size_t)ncols * sizeof(float));
}

/* Loads ncols floats of C, the rest zero (they are never stored). */
static inline __attribute__((always_inline)) __m512 gemm_avx512_load(const float *c, uint32_t ncols)
{
    if (ncols == GEMM_NR)
        return _mm512_loadu_ps(c);
    float tmp[GEMM_NR] = {0};
    memcpy(tmp, c, (size_t)ncols * sizeof(float));
    return _mm512_loadu_ps(tmp);
}

/* The 16 f32 weights of one k row of an f32 or 16-bit panel at p, and a
 * Q8_0 block's 16 scales d and its k row q of weights (float)q * d: one
 * exact multiply, as in the portable path. Every conversion is exact, so
 * any instruction sequence gives the same values. For the CPU they are
 * AVX-512F's 512-bit conversions; SIMDe 0.7, which the emulated build runs
 * on, has none of these, so that build converts two AVX2 halves and joins
 * them. */
#ifdef PD_AVX512_EMULATED
static inline __attribute__((always_inline)) __m512 gemm_avx512_join(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

static inline __attribute__((always_inline)) __m512 gemm_avx512_w(const uint8_t *p, const gemm_wtype type)
{
    if (type == GEMM_W_F32)
        return _mm512_loadu_ps((const float *)p);
    __m128i h0 = _mm_loadu_si128((const __m128i *)p), h1 = _mm_loadu_si128((const __m128i *)(p + 16));
    if (type == GEMM_W_F16)
        return gemm_avx512_join(_mm256_cvtph_ps(h0), _mm256_cvtph_ps(h1));
    return gemm_avx512_join(_mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h0), 16)), /* BF16 */
                            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h1), 16)));
}

static inline __attribute__((always_inline)) __m512 gemm_avx512_q8w(const uint8_t *q, __m512 d)
{
    __m256 q0 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)q)));
    __m256 q1 = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + 8))));
    return _mm512_mul_ps(gemm_avx512_join(q0, q1), d);
}

/* 16 bytes as 16 f32, signed or unsigned */
static inline __attribute__((always_inline)) __m512 gemm_avx512_b2f(__m128i x, const bool sign)
{
    const __m128i h = _mm_unpackhi_epi64(x, x);
    if (sign)
        return gemm_avx512_join(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(x)),
                                _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(h)));
    return gemm_avx512_join(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(x)), _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(h)));
}

/* lanes of x with no bit of y set (SIMDe 0.7 has no testn) */
static inline __attribute__((always_inline)) __mmask16 gemm_avx512_testn(__m512i x, __m512i y)
{
    return (__mmask16)~_mm512_test_epi32_mask(x, y);
}

/* 16 dwords as f32 */
static inline __attribute__((always_inline)) __m512 gemm_avx512_i2f(__m512i v)
{
    return gemm_avx512_join(_mm256_cvtepi32_ps(_mm512_castsi512_si256(v)),
                            _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(v, 1)));
}

/* 16 bytes at p zero-extended to 16 dwords */
static inline __attribute__((always_inline)) __m512i gemm_avx512_zx8(const uint8_t *p)
{
    const __m128i x = _mm_loadu_si128((const __m128i *)p);
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_cvtepu8_epi32(x)),
                              _mm256_cvtepu8_epi32(_mm_unpackhi_epi64(x, x)), 1);
}
#else
static inline __attribute__((always_inline)) __m512 gemm_avx512_w(const uint8_t *p, const gemm_wtype type)
{
    if (type == GEMM_W_F32)
        return _mm512_loadu_ps((const float *)p);
    __m256i h = _mm256_loadu_si256((const __m256i *)p);
    if (type == GEMM_W_F16)
        return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); /* BF16 */
}

static inline __attribute__((always_inline)) __m512 gemm_avx512_q8w(const uint8_t *q, __m512 d)
{
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), d);
}

/* 16 bytes as 16 f32, signed or unsigned */
static inline __attribute__((always_inline)) __m512 gemm_avx512_b2f(__m128i x, const bool sign)
{
    return _mm512_cvtepi32_ps(sign ? _mm512_cvtepi8_epi32(x) : _mm512_cvtepu8_epi32(x));
}

/* lanes of x with no bit of y set */
static inline __attribute__((always_inline)) __mmask16 gemm_avx512_testn(__m512i x, __m512i y)
{
    return _mm512_testn_epi32_mask(x, y);
}

/* 16 dwords as f32 */
static inline __attribute__((always_inline)) __m512 gemm_avx512_i2f(__m512i v) { return _mm512_cvtepi32_ps(v); }

/* 16 bytes at p zero-extended to 16 dwords */
static inline __attribute__((always_inline)) __m512i gemm_avx512_zx8(const uint8_t *p)
{
    return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}
#endif

/* q of row kq + r (kq a multiple of 8, r in 0..7 constant after unrolling)
 * of the qs block whose nibbles start at qd, as f32: the values of
 * gemm_qs_row_q, built on dword lanes with AVX-512F's masks and
 * three-input logic (16-byte integer loads only, no AVX-512BW). The 4-bit
 * types look (float)(u - off) up in a table of the 16 values, indexed by
 * u itself (vpermps reads an index's low 4 bits only, so the even row's
 * nibble needs no mask): one shuffle where a mask, a subtract and a
 * conversion were, the same f32 values. Hot M = 1 on one thread, G
 * weights/s (AVX-512 Zen 5): Q4_0 34 -> 43, Q4_1 and Q4_K the same (40).
 * A 32-value table (vpermt2ps) for the 5-bit types was no faster (Q5_0
 * 27 -> 25-28, Q5_1 27 -> 25): they keep the conversion, Q5_0's offset as
 * a masked subtract (26.5 against 19.5 for a shift, merge and subtract),
 * Q5_1 and Q5_K's bit 4 merged by one vpternlogd (27-28 against 25-26
 * for a test mask and masked or). Q6_K converts u and takes its offset in
 * the scale step (gemm_avx512_qs_scales): 24.5 -> 28. */
static inline __attribute__((always_inline)) __m512 gemm_avx512_qs_q(const uint8_t *qd, uint32_t kq, uint32_t r,
                                                                     const gemm_wtype type)
{
    const gemm_qs_fmt f = gemm_qs_fmt_of(type);
    const __m512i xd = gemm_avx512_zx8(qd + 16 * (kq / 2 + r / 2)); /* both nibbles, bits 0..7 */
    /* the odd row's nibble in bits 0..3 (zero above: the byte was zero-extended) */
    __m512i v = r % 2 ? _mm512_srli_epi32(xd, 4) : xd;
    const float o = -(float)f.off;
    if (f.bits == 4) {
        const __m512 t = _mm512_setr_ps(o, o + 1, o + 2, o + 3, o + 4, o + 5, o + 6, o + 7, o + 8, o + 9, o + 10,
                                        o + 11, o + 12, o + 13, o + 14, o + 15);
        return _mm512_permutexvar_ps(v, t);
    }
    const __m512i lo4 = _mm512_set1_epi32(0x0F);
    if (f.bits == 5) {
        if (r % 2 == 0)
            v = _mm512_and_si512(v, lo4);
        const __m512i hd = gemm_avx512_zx8(qd + GEMM_QS_NIBBLES + 16 * (kq / 8));
        if (f.off) /* u - 16 = v where bit 4 is set, v - 16 where it is clear */
            return gemm_avx512_i2f(_mm512_mask_sub_epi32(v, gemm_avx512_testn(hd, _mm512_set1_epi32(1 << r)), v,
                                                         _mm512_set1_epi32((int)f.off)));
        /* bit r to bit 4; 0xE4 takes it where the mask is set, v elsewhere */
        const __m512i h = r < 4 ? _mm512_slli_epi32(hd, 4 - r) : r > 4 ? _mm512_srli_epi32(hd, r - 4) : hd;
        return gemm_avx512_i2f(_mm512_ternarylogic_epi32(h, v, _mm512_set1_epi32(0x10), 0xE4));
    }
    const uint32_t r4 = r % 4;
    __m512i h = gemm_avx512_zx8(qd + GEMM_QS_NIBBLES + 16 * (kq / 4 + r / 4));
    h = r4 < 2 ? _mm512_slli_epi32(h, 4 - 2 * r4) : r4 > 2 ? _mm512_srli_epi32(h, 2) : h;
    h = _mm512_and_si512(h, _mm512_set1_epi32(0x30));
    /* even rows: 0xD8 takes xd's bits where lo4 is set, h's elsewhere;
     * odd rows: v is clean above bit 3 */
    v = r % 2 ? _mm512_or_si512(v, h) : _mm512_ternarylogic_epi32(h, xd, lo4, 0xD8);
    return gemm_avx512_i2f(v); /* u, unsigned: the offset is in the scale step */
}

/* A qs block's scales s0 (k 0..15), s1 (k 16..31) and addends n0, n1 from
 * its group header grp and block header blk, with the f32 operations of
 * the portable path (gemm.c, gemm_qs_panel_scales): exact products, so the
 * same bits. Q6_K's q = u - 32 is folded in here, since gemm_avx512_qs_q
 * gives it u: fmaf(s, u, -(32 s)) is s (u - 32) exactly (s = d sc has at
 * most 18 significant bits and u - 32 at most 6, so every term is exact),
 * the value fmaf(s, q, -0.0f) gives; only a zero's sign can differ, and an
 * fmaf chain from +0 never holds -0, so its sums are the same bits. */
static inline __attribute__((always_inline)) void gemm_avx512_qs_scales(const uint8_t *grp, const uint8_t *blk,
                                                                        const gemm_wtype type, __m512 *s0,
                                                                        __m512 *s1, __m512 *n0, __m512 *n1)
{
    const gemm_qs_fmt f = gemm_qs_fmt_of(type);
    const __m512 d = gemm_avx512_w(grp, GEMM_W_F16);
    *s0 = *s1 = d;
    *n0 = _mm512_set1_ps(-0.0f);
    if (type == GEMM_W_Q4_K || type == GEMM_W_Q5_K) {
        const __m512 sc = gemm_avx512_b2f(_mm_loadu_si128((const __m128i *)blk), false);
        const __m512 m = gemm_avx512_b2f(_mm_loadu_si128((const __m128i *)(blk + 16)), false);
        const __m512 dmin_m = _mm512_mul_ps(gemm_avx512_w(grp + 32, GEMM_W_F16), m);
        *s0 = *s1 = _mm512_mul_ps(d, sc);
        *n0 = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(dmin_m), _mm512_set1_epi32(INT32_MIN)));
    } else if (type == GEMM_W_Q6_K) {
        *s0 = _mm512_mul_ps(d, gemm_avx512_b2f(_mm_loadu_si128((const __m128i *)blk), true));
        *s1 = _mm512_mul_ps(d, gemm_avx512_b2f(_mm_loadu_si128((const __m128i *)(blk + 16)), true));
        *n0 = _mm512_mul_ps(*s0, _mm512_set1_ps(-(float)f.off));
        *n1 = _mm512_mul_ps(*s1, _mm512_set1_ps(-(float)f.off));
        return;
    } else if (f.gh == 64) {
        *n0 = gemm_avx512_w(grp + 32, GEMM_W_F16);
    }
    *n1 = *n0;
}

static inline __attribute__((always_inline)) __m512 gemm_avx512_q8d(const uint8_t *blk)
{
    return gemm_avx512_w(blk, GEMM_W_F16);
}

/* The lines of the Q8_0 panel block at blk. */
static inline __attribute__((always_inline)) void gemm_avx512_q8_prefetch(const uint8_t *blk)
{
    for (uint32_t line = 0; line < GEMM_Q8_PANEL_BLOCK; line += 64)
        __builtin_prefetch(blk + line, 0, 3);
}

/* Accumulators are named variables (c<row>) so gcc keeps them in registers;
 * mr and type are compile-time constants in every instantiation below. */
#define GEMM_AVX512_ROW(i, kk)                                                   \
    if (mr > i)                                                                  \
        c##i = _mm512_fmadd_ps(_mm512_set1_ps(a##i[kk]), w, c##i);
#define GEMM_AVX512_STEP(kk)                                                     \
    GEMM_AVX512_ROW(0, kk) GEMM_AVX512_ROW(1, kk) GEMM_AVX512_ROW(2, kk)         \
    GEMM_AVX512_ROW(3, kk) GEMM_AVX512_ROW(4, kk) GEMM_AVX512_ROW(5, kk)         \
    GEMM_AVX512_ROW(6, kk) GEMM_AVX512_ROW(7, kk) GEMM_AVX512_ROW(8, kk)         \
    GEMM_AVX512_ROW(9, kk) GEMM_AVX512_ROW(10, kk) GEMM_AVX512_ROW(11, kk)

/* A tile's row pointers a0..a11 (rows 7..11 from row 6 as rows 1..5 from
 * row 0; rows past mr alias row 0 and are never read) and its 12
 * accumulators, zero. */
#define GEMM_AVX512_TILE_VARS(a, lda, mr)                                        \
    GEMM_TILE_ROWS(a, lda, mr)                                                   \
    const float *a6 = (mr) > 6 ? a0 + 6 * (lda) : a0;                            \
    const float *a7 = (mr) > 7 ? a6 + (lda) : a0;                                \
    const float *a8 = (mr) > 8 ? a6 + 2 * (lda) : a0;                            \
    const float *a9 = (mr) > 9 ? a6 + 3 * (lda) : a0;                            \
    const float *a10 = (mr) > 10 ? a6 + 4 * (lda) : a0;                          \
    const float *a11 = (mr) > 11 ? a6 + 5 * (lda) : a0;                          \
    __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0; \
    __m512 c6 = c0, c7 = c0, c8 = c0, c9 = c0, c10 = c0, c11 = c0;

/* Applies OP(i) to every row i of a tile of mr rows. */
#define GEMM_AVX512_EACH_ROW(mr, OP)                                             \
    OP(0)                                                                        \
    if ((mr) > 1) OP(1)                                                          \
    if ((mr) > 2) OP(2)                                                          \
    if ((mr) > 3) OP(3)                                                          \
    if ((mr) > 4) OP(4)                                                          \
    if ((mr) > 5) OP(5)                                                          \
    if ((mr) > 6) OP(6)                                                          \
    if ((mr) > 7) OP(7)                                                          \
    if ((mr) > 8) OP(8)                                                          \
    if ((mr) > 9) OP(9)                                                          \
    if ((mr) > 10) OP(10)                                                        \
    if ((mr) > 11) OP(11)

#define GEMM_AVX512_STORE_ROW(i) gemm_avx512_store(c_ + (i) * ldc_, c##i, ncols_);
#define GEMM_AVX512_TILE_STORE(c, ldc, mr, ncols)                                \
    {                                                                            \
        float *c_ = (c);                                                         \
        const size_t ldc_ = (ldc);                                               \
        const uint32_t ncols_ = (ncols);                                         \
        GEMM_AVX512_EACH_ROW(mr, GEMM_AVX512_STORE_ROW)                          \
    }

static inline __attribute__((always_inline)) void gemm_avx512_tile_impl(const gemm_tile *t, const uint32_t mr,
                                                                        const gemm_wtype type)
{
    const size_t lda = t->lda;
    GEMM_AVX512_TILE_VARS(t->a, lda, mr)
    const uint8_t *pn = t->panel;
    const uint32_t k = t->k;
    if (gemm_wtype_is_qs(type)) {
        /* a k row unpacked once, as the row kernels do, for all mr rows */
        const gemm_qs_fmt f = gemm_qs_fmt_of(type);
        for (uint32_t kb = 0; kb < k; kb += GEMM_QS_BLOCK) {
            const uint32_t bi = kb / GEMM_QS_BLOCK;
            const uint8_t *blk = pn + gemm_qs_block_off(f, bi);
            __m512 s0, s1, n0, n1;
            gemm_avx512_qs_scales(pn + gemm_qs_group_off(f, bi), blk, type, &s0, &s1, &n0, &n1);
            for (size_t line = 0; line < gemm_qs_block_bytes(f); line += 64)
                __builtin_prefetch(blk + GEMM_PREFETCH + line, 0, 3);
            for (uint32_t kq = 0; kq < GEMM_QS_BLOCK; kq += 8) {
                const __m512 sq = kq >= 16 ? s1 : s0, nq = kq >= 16 ? n1 : n0;
#pragma GCC unroll 8
                for (uint32_t r = 0; r < 8; r++) {
                    const uint32_t kk = kb + kq + r;
                    const __m512 w = _mm512_fmadd_ps(gemm_avx512_qs_q(blk + f.bh, kq, r, type), sq, nq);
                    GEMM_AVX512_STEP(kk)
                }
            }
        }
    } else if (type == GEMM_W_Q8_0) {
        for (uint32_t kb = 0; kb < k; kb += GEMM_Q8_0_BLOCK, pn += GEMM_Q8_PANEL_BLOCK) {
            const __m512 d = gemm_avx512_q8d(pn);
            const uint8_t *q = pn + GEMM_Q8_SCALES;
            if (mr > 1)
                gemm_avx512_q8_prefetch(pn + GEMM_PREFETCH);
            for (uint32_t kk = kb; kk < kb + GEMM_Q8_0_BLOCK; kk++, q += GEMM_NR) {
                const __m512 w = gemm_avx512_q8w(q, d);
                GEMM_AVX512_STEP(kk)
            }
        }
    } else {
        const size_t rs = GEMM_NR * (type == GEMM_W_F32 ? 4u : 2u);
        for (uint32_t kk = 0; kk < k; kk++, pn += rs) {
            const __m512 w = gemm_avx512_w(pn, type);
            if (mr > 1)
                __builtin_prefetch(pn + GEMM_PREFETCH, 0, 3);
            GEMM_AVX512_STEP(kk)
        }
    }
    const size_t ldc = t->ldc;
    GEMM_AVX512_TILE_STORE(t->c, ldc, mr, t->ncols)
}

/* r<j> += b * W(j), panel j's weights, for the group's np panels */
#define GEMM_AVX512_RFMA(W)                                                      \
    r0 = _mm512_fmadd_ps(b, W(0), r0);                                           \
    if (np > 1)                                                                  \
        r1 = _mm512_fmadd_ps(b, W(1), r1);                                       \
    if (np > 2)                                                                  \
        r2 = _mm512_fmadd_ps(b, W(2), r2);                                       \
    if (np > 3)                                                                  \
        r3 = _mm512_fmadd_ps(b, W(3), r3);

/* One row against np consecutive panels (1 .. GEMM_ROW_PANELS): one chain
 * per lane per panel, the panels' chains independent. */
static inline __attribute__((always_inline)) void gemm_avx512_row_impl(const gemm_row *t, const uint32_t np,
                                                                       const gemm_wtype type)
{
    GEMM_ROW_PANEL_PTRS(t, np)
    const float *a = t->a;
    __m512 r0 = _mm512_setzero_ps(), r1 = r0, r2 = r0, r3 = r0;
    const uint32_t k = t->k;
    if (gemm_wtype_is_qs(type)) {
        const gemm_qs_fmt f = gemm_qs_fmt_of(type);
        for (uint32_t kb = 0; kb < k; kb += GEMM_QS_BLOCK) {
            const uint32_t bi = kb / GEMM_QS_BLOCK;
            const size_t go = gemm_qs_group_off(f, bi), off = gemm_qs_block_off(f, bi);
            const uint8_t *b0 = p0 + off, *b1 = p1 + off, *b2 = p2 + off, *b3 = p3 + off;
            __m512 s00, s01, n00, n01, s10, s11, n10, n11, s20, s21, n20, n21, s30, s31, n30, n31;
            gemm_avx512_qs_scales(p0 + go, b0, type, &s00, &s01, &n00, &n01);
            s10 = s20 = s30 = s00;
            s11 = s21 = s31 = s01;
            n10 = n20 = n30 = n00;
            n11 = n21 = n31 = n01;
            if (np > 1) gemm_avx512_qs_scales(p1 + go, b1, type, &s10, &s11, &n10, &n11);
            if (np > 2) gemm_avx512_qs_scales(p2 + go, b2, type, &s20, &s21, &n20, &n21);
            if (np > 3) gemm_avx512_qs_scales(p3 + go, b3, type, &s30, &s31, &n30, &n31);
            const size_t pfo = gemm_row_prefetch_offset(off, ps, np, type);
            for (uint32_t kq = 0; kq < GEMM_QS_BLOCK; kq += 8) {
                const bool hi = kq >= 16;
                const __m512 t0 = hi ? s01 : s00, t1 = hi ? s11 : s10, t2 = hi ? s21 : s20, t3 = hi ? s31 : s30;
                const __m512 u0 = hi ? n01 : n00, u1 = hi ? n11 : n10, u2 = hi ? n21 : n20, u3 = hi ? n31 : n30;
#pragma GCC unroll 8
                for (uint32_t r = 0; r < 8; r++) {
                    gemm_row_qs_prefetch(b0, b1, b2, b3, np, pfo, kq + r, f);
                    const __m512 b = _mm512_set1_ps(a[kb + kq + r]);
#define GEMM_AVX512_QSW(j) _mm512_fmadd_ps(gemm_avx512_qs_q(b##j + f.bh, kq, r, type), t##j, u##j)
                    GEMM_AVX512_RFMA(GEMM_AVX512_QSW)
#undef GEMM_AVX512_QSW
                }
            }
        }
    } else if (type == GEMM_W_Q8_0) {
        for (uint32_t kb = 0; kb < k; kb += GEMM_Q8_0_BLOCK) {
            size_t off = (size_t)(kb / GEMM_Q8_0_BLOCK) * GEMM_Q8_PANEL_BLOCK;
            const uint8_t *b0 = p0 + off, *b1 = p1 + off, *b2 = p2 + off, *b3 = p3 + off;
            const __m512 d0 = gemm_avx512_q8d(b0);
            const __m512 d1 = np > 1 ? gemm_avx512_q8d(b1) : d0;
            const __m512 d2 = np > 2 ? gemm_avx512_q8d(b2) : d0;
            const __m512 d3 = np > 3 ? gemm_avx512_q8d(b3) : d0;
            const size_t pfo = gemm_row_prefetch_offset(off, ps, np, type);
            for (uint32_t kk = 0; kk < GEMM_Q8_0_BLOCK; kk++) {
                gemm_row_q8_prefetch(b0, b1, b2, b3, np, pfo, kk);
                const __m512 b = _mm512_set1_ps(a[kb + kk]);
                const size_t qo = GEMM_Q8_SCALES + (size_t)kk * GEMM_NR;
#define GEMM_AVX512_Q8W(j) gemm_avx512_q8w(b##j + qo, d##j)
                GEMM_AVX512_RFMA(GEMM_AVX512_Q8W)
#undef GEMM_AVX512_Q8W
            }
        }
    } else {
        const size_t rs = GEMM_NR * (type == GEMM_W_F32 ? 4u : 2u);
        for (uint32_t kk = 0; kk < k; kk++) {
            const __m512 b = _mm512_set1_ps(a[kk]);
            const size_t o = (size_t)kk * rs, pfo = o + gemm_row_prefetch_offset(o, ps, np, type);
            /* one prefetch per 64-byte line: a 16-bit panel's k row is 32 bytes */
            if (type == GEMM_W_F32 || (kk & 1) == 0) {
                __builtin_prefetch(p0 + pfo, 0, 3);
                if (np > 1) __builtin_prefetch(p1 + pfo, 0, 3);
                if (np > 2) __builtin_prefetch(p2 + pfo, 0, 3);
                if (np > 3) __builtin_prefetch(p3 + pfo, 0, 3);
            }
#define GEMM_AVX512_W(j) gemm_avx512_w(p##j + o, type)
            GEMM_AVX512_RFMA(GEMM_AVX512_W)
#undef GEMM_AVX512_W
        }
    }
    /* every panel but the last of the group is full */
    gemm_avx512_store(t->c, r0, np > 1 ? GEMM_NR : t->ncols_last);
    if (np > 1) gemm_avx512_store(t->c + GEMM_NR, r1, np > 2 ? GEMM_NR : t->ncols_last);
    if (np > 2) gemm_avx512_store(t->c + 2 * GEMM_NR, r2, np > 3 ? GEMM_NR : t->ncols_last);
    if (np > 3) gemm_avx512_store(t->c + 3 * GEMM_NR, r3, t->ncols_last);
}

/* A chunk tile (the blocked path): weights are the chunk's f32 [kn][16];
 * chains start from zero on the first chunk, else continue from C. spread:
 * prefetch t->pf's bytes a line every few k. */
static inline __attribute__((always_inline)) void gemm_avx512_ctile_impl(const gemm_ctile *t, const uint32_t mr,
                                                                         const bool spread)
{
    const size_t lda = t->lda, ldc = t->ldc;
    GEMM_AVX512_TILE_VARS(t->a, lda, mr)
    if (!t->first) {
#define GEMM_AVX512_LOAD_ROW(i) c##i = gemm_avx512_load(t->c + (i) * ldc, t->ncols);
        GEMM_AVX512_EACH_ROW(mr, GEMM_AVX512_LOAD_ROW)
#undef GEMM_AVX512_LOAD_ROW
    }
    const float *pw = t->w;
    const uint32_t kn = t->kn;
    const uint8_t *pf = t->pf;
    size_t lines = spread ? t->pf_len / 64 : 0;
    uint32_t every = lines ? (uint32_t)((kn + lines - 1) / lines) : kn;
    for (uint32_t kk = 0; kk < kn;) {
        uint32_t kend = kn - kk > every ? kk + every : kn;
        if (lines) {
            __builtin_prefetch(pf, 0, 3);
            pf += 64;
            lines--;
        }
#pragma GCC unroll 4
        for (; kk < kend; kk++) {
            const __m512 w = _mm512_loadu_ps(pw + (size_t)kk * GEMM_NR);
            GEMM_AVX512_STEP(kk)
        }
    }
    GEMM_AVX512_TILE_STORE(t->c, ldc, mr, t->ncols)
}

#define GEMM_AVX512_TILEFN(tname, type, mr)                                      \
    static void gemm_avx512_##tname##_##mr(const gemm_tile *t) { gemm_avx512_tile_impl(t, mr, type); }
#define GEMM_AVX512_TILEFNS(tname, type)                                         \
    GEMM_AVX512_TILEFN(tname, type, 1) GEMM_AVX512_TILEFN(tname, type, 2)        \
    GEMM_AVX512_TILEFN(tname, type, 3) GEMM_AVX512_TILEFN(tname, type, 4)        \
    GEMM_AVX512_TILEFN(tname, type, 5) GEMM_AVX512_TILEFN(tname, type, 6)        \
    GEMM_AVX512_TILEFN(tname, type, 7) GEMM_AVX512_TILEFN(tname, type, 8)        \
    GEMM_AVX512_TILEFN(tname, type, 9) GEMM_AVX512_TILEFN(tname, type, 10)       \
    GEMM_AVX512_TILEFN(tname, type, 11) GEMM_AVX512_TILEFN(tname, type, 12)
#define GEMM_AVX512_ROWFN(tname, type, np)                                       \
    static void gemm_avx512_row_##tname##_##np(const gemm_row *t) { gemm_avx512_row_impl(t, np, type); }
#define GEMM_AVX512_ROWFNS(tname, type)                                          \
    GEMM_AVX512_ROWFN(tname, type, 1) GEMM_AVX512_ROWFN(tname, type, 2)          \
    GEMM_AVX512_ROWFN(tname, type, 3) GEMM_AVX512_ROWFN(tname, type, 4)
#define GEMM_AVX512_CTILEFN(mr)                                                  \
    static void gemm_avx512_ctile_##mr(const gemm_ctile *t) { gemm_avx512_ctile_impl(t, mr, false); } \
    static void gemm_avx512_ctilepf_##mr(const gemm_ctile *t) { gemm_avx512_ctile_impl(t, mr, true); }

GEMM_AVX512_TILEFNS(f32, GEMM_W_F32)
GEMM_AVX512_TILEFNS(f16, GEMM_W_F16)
GEMM_AVX512_TILEFNS(bf16, GEMM_W_BF16)
GEMM_AVX512_TILEFNS(q8_0, GEMM_W_Q8_0)
GEMM_AVX512_TILEFNS(q4_0, GEMM_W_Q4_0)
GEMM_AVX512_TILEFNS(q5_0, GEMM_W_Q5_0)
GEMM_AVX512_TILEFNS(q4_1, GEMM_W_Q4_1)
GEMM_AVX512_TILEFNS(q5_1, GEMM_W_Q5_1)
GEMM_AVX512_TILEFNS(q4_K, GEMM_W_Q4_K)
GEMM_AVX512_TILEFNS(q5_K, GEMM_W_Q5_K)
GEMM_AVX512_TILEFNS(q6_K, GEMM_W_Q6_K)
GEMM_AVX512_ROWFNS(f32, GEMM_W_F32)
GEMM_AVX512_ROWFNS(f16, GEMM_W_F16)
GEMM_AVX512_ROWFNS(bf16, GEMM_W_BF16)
GEMM_AVX512_ROWFNS(q8_0, GEMM_W_Q8_0)
GEMM_AVX512_ROWFNS(q4_0, GEMM_W_Q4_0)
GEMM_AVX512_ROWFNS(q5_0, GEMM_W_Q5_0)
GEMM_AVX512_ROWFNS(q4_1, GEMM_W_Q4_1)
GEMM_AVX512_ROWFNS(q5_1, GEMM_W_Q5_1)
GEMM_AVX512_ROWFNS(q4_K, GEMM_W_Q4_K)
GEMM_AVX512_ROWFNS(q5_K, GEMM_W_Q5_K)
GEMM_AVX512_ROWFNS(q6_K, GEMM_W_Q6_K)
GEMM_AVX512_CTILEFN(1)
GEMM_AVX512_CTILEFN(2)
GEMM_AVX512_CTILEFN(3)
GEMM_AVX512_CTILEFN(4)
GEMM_AVX512_CTILEFN(5)
GEMM_AVX512_CTILEFN(6)
GEMM_AVX512_CTILEFN(7)
GEMM_AVX512_CTILEFN(8)
GEMM_AVX512_CTILEFN(9)
GEMM_AVX512_CTILEFN(10)
GEMM_AVX512_CTILEFN(11)
GEMM_AVX512_CTILEFN(12)

#ifndef PD_AVX512_EMULATED
#pragma GCC pop_options
#endif

/* the qs types have tiles here (not on AVX2: gemm.c, gemm_tiles_for) */
gemm_tile_fn *const gemm_avx512_tiles[GEMM_W_COUNT][GEMM_MR512] = GEMM_BY_TYPE_QS(GEMM_BY_MR12, gemm_avx512_);
gemm_row_fn *const gemm_avx512_rows[GEMM_W_COUNT][GEMM_ROW_PANELS] = GEMM_BY_TYPE_QS(GEMM_BY_NP, gemm_avx512_row_);
gemm_ctile_fn *const gemm_avx512_ctiles[GEMM_MR512] = GEMM_BY_MR12(gemm_avx512_ctile_);
gemm_ctile_fn *const gemm_avx512_ctilepfs[GEMM_MR512] = GEMM_BY_MR12(gemm_avx512_ctilepf_);

#endif /* __x86_64__ */
