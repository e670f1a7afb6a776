/* The int8 arithmetic's AVX-512 kernels (GEMM_BACKEND_INT8, gemm.h): a
 * block's integer sums by vpdpbusd (u8 weights x s8 activations, four
 * products per dword lane), then the block's float steps in the order
 * gemm.h defines, so the bits are those of gemm.c's portable int8 tile.
 *
 * The panels are the invariant backend's (gemm_kern.h): a row of 16 bytes
 * holds one byte per column. vpermb turns 4 such rows (64 bytes) into 16
 * dwords, dword l = the 4 bytes of column l, which is what vpdpbusd takes
 * against one broadcast dword of 4 activations. For a qs block those 4
 * bytes are nibble pairs t .. t + 3: their low nibbles are k 2t, 2t + 2,
 * 2t + 4, 2t + 6 and their high nibbles the odd k, so the activations are
 * quantized in that order (gemm_qa's perm). The 5- and 6-bit planes are
 * placed beside them with vpermb too and their bits moved to bit 4 (and 5)
 * of each byte with vpmultishiftqb, one control per byte. Weights are
 * unsigned (u, before the type's offset); the offset comes off as off * sA
 * and off * sB, the activations' block sums. Q8_0's signed bytes are made
 * unsigned by flipping bit 7 (q + 128), 128 sums off the same way.
 *
 * Needs AVX-512 F, BW, VNNI and VBMI (gemm_vnni_ok); gemm.c uses the
 * portable tile elsewhere. */
#include "cluster/model/gemm_kern.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,avx512vbmi,avx2,fma,f16c")

bool gemm_vnni_ok(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi");
}

/* The byte shuffles and bit controls, as 64-byte constants: byte p of
 * each from its formula. */
#define GEMM_B8(f, o) f(o), f(o + 1), f(o + 2), f(o + 3), f(o + 4), f(o + 5), f(o + 6), f(o + 7)
#define GEMM_B64(f)                                                                                  \
    {GEMM_B8(f, 0), GEMM_B8(f, 8), GEMM_B8(f, 16), GEMM_B8(f, 24), GEMM_B8(f, 32), GEMM_B8(f, 40), \
     GEMM_B8(f, 48), GEMM_B8(f, 56)}
/* dword l = p / 4, byte i = p % 4 of a vector; bytes of the 16-byte rows */
#define GEMM_ROWS(p) (16 * ((p) % 4) + (p) / 4)
/* the plane bytes nibble vector j needs: 5-bit, plane row j; 6-bit, rows
 * 2j (bytes 0, 1) and 2j + 1 (bytes 2, 3), of which a 64-byte half holds
 * two j (the P0 / P1 tables, for even and odd j) */
#define GEMM_PL5(p, j) (16 * (j) + (p) / 4)
#define GEMM_PL5_0(p) GEMM_PL5(p, 0)
#define GEMM_PL5_1(p) GEMM_PL5(p, 1)
#define GEMM_PL5_2(p) GEMM_PL5(p, 2)
#define GEMM_PL5_3(p) GEMM_PL5(p, 3)
#define GEMM_PL6_0(p) (16 * ((p) % 4 / 2) + (p) / 4)
#define GEMM_PL6_1(p) (16 * (2 + (p) % 4 / 2) + (p) / 4)
/* vpmultishiftqb controls putting, in byte p (of its qword, p % 8), the
 * bit that becomes bit 4: low nibble k 2i (i = p % 4) -> 5-bit: bit 2i of
 * the plane byte; 6-bit: bits 0 (i even) or 4 (i odd) of its row's byte;
 * high nibbles one bit pair (6-bit) or bit (5-bit) higher */
#define GEMM_MS(bit) (((bit) + 60) % 64)
#define GEMM_MS5_LO(p) GEMM_MS(8 * ((p) % 8) + 2 * ((p) % 4))
#define GEMM_MS5_HI(p) GEMM_MS(8 * ((p) % 8) + 2 * ((p) % 4) + 1)
#define GEMM_MS6_LO(p) GEMM_MS(8 * ((p) % 8) + 4 * ((p) % 2))
#define GEMM_MS6_HI(p) GEMM_MS(8 * ((p) % 8) + 4 * ((p) % 2) + 2)

static const uint8_t gemm_vnni_rows[64] __attribute__((aligned(64))) = GEMM_B64(GEMM_ROWS);
static const uint8_t gemm_vnni_plane[2][4][64] __attribute__((aligned(64))) = {
    {GEMM_B64(GEMM_PL5_0), GEMM_B64(GEMM_PL5_1), GEMM_B64(GEMM_PL5_2), GEMM_B64(GEMM_PL5_3)},
    {GEMM_B64(GEMM_PL6_0), GEMM_B64(GEMM_PL6_1), GEMM_B64(GEMM_PL6_0), GEMM_B64(GEMM_PL6_1)},
};
static const uint8_t gemm_vnni_ms[2][2][64] __attribute__((aligned(64))) = {
    {GEMM_B64(GEMM_MS5_LO), GEMM_B64(GEMM_MS5_HI)},
    {GEMM_B64(GEMM_MS6_LO), GEMM_B64(GEMM_MS6_HI)},
};

/* gemm_q8_row with AVX-512: the same f32 operations per value (the max is
 * exact in any order, a NaN is skipped by it and quantized to 0, and
 * vcvtps2dq rounds to nearest even as the portable magic constant does
 * below 2^22), so the same bytes. */
void gemm_vnni_q8_row(const float *a, uint32_t nb, bool perm, int8_t *q, float *d, int32_t *s)
{
    static const uint8_t perm_idx[32] = {0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15,
                                         16, 18, 20, 22, 17, 19, 21, 23, 24, 26, 28, 30, 25, 27, 29, 31};
    const __m256i pidx = _mm256_loadu_si256((const __m256i *)perm_idx);
    const __m512 lim = _mm512_set1_ps(127.0f);
    for (uint32_t b = 0; b < nb; b++, a += GEMM_QS_BLOCK, q += GEMM_QS_BLOCK) {
        const __m512 x0 = _mm512_loadu_ps(a), x1 = _mm512_loadu_ps(a + 16);
        /* max(|x|, acc): a NaN first operand gives the second */
        const __m512 m = _mm512_max_ps(_mm512_abs_ps(x1), _mm512_max_ps(_mm512_abs_ps(x0), _mm512_setzero_ps()));
        const float amax = _mm512_reduce_max_ps(m);
        const float dd = amax / 127.0f, id = dd != 0.0f ? 1.0f / dd : 0.0f;
        const __m512 vid = _mm512_set1_ps(id);
        __m512 y0 = _mm512_mul_ps(x0, vid), y1 = _mm512_mul_ps(x1, vid);
        y0 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y0, y0, _CMP_ORD_Q), y0);
        y1 = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(y1, y1, _CMP_ORD_Q), y1);
        y0 = _mm512_min_ps(_mm512_max_ps(y0, _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim);
        y1 = _mm512_min_ps(_mm512_max_ps(y1, _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim);
        const __m512i i0 = _mm512_cvtps_epi32(y0), i1 = _mm512_cvtps_epi32(y1);
        __m256i bytes = _mm256_set_m128i(_mm512_cvtepi32_epi8(i1), _mm512_cvtepi32_epi8(i0));
        if (perm)
            bytes = _mm256_permutexvar_epi8(pidx, bytes);
        _mm256_storeu_si256((__m256i *)q, bytes);
        d[b] = _cvtsh_ss(_cvtss_sh(dd, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        s[2 * b] = _mm512_reduce_add_epi32(i0);
        s[2 * b + 1] = _mm512_reduce_add_epi32(i1);
    }
}

/* The unsigned values u of a qs block (nibbles at nib, plane after them)
 * as 8 vectors: v[2j] the low nibbles of pair rows 4j .. 4j + 3, v[2j + 1]
 * the high ones. v[0 .. 3] are k 0 .. 15, v[4 .. 7] k 16 .. 31. */
static inline __attribute__((always_inline)) void gemm_vnni_qs_unpack(const uint8_t *nib, const gemm_qs_fmt f,
                                                                      __m512i v[8])
{
    const __m512i rows = _mm512_load_si512(gemm_vnni_rows);
    const uint32_t b6 = f.bits == 6;
    const __m512i lo4 = _mm512_set1_epi8(0x0F);
    const __m512i hb = _mm512_set1_epi8(f.bits == 5 ? 0x10 : 0x30);
    __m512i pl0 = _mm512_setzero_si512(), pl1 = pl0;
    if (f.bits >= 5)
        pl0 = _mm512_loadu_si512(nib + GEMM_QS_NIBBLES);
    if (f.bits == 6)
        pl1 = _mm512_loadu_si512(nib + GEMM_QS_NIBBLES + 64);
#pragma GCC unroll 4
    for (uint32_t j = 0; j < 4; j++) {
        const __m512i t = _mm512_permutexvar_epi8(rows, _mm512_loadu_si512(nib + 64 * j));
        __m512i lo = _mm512_and_si512(t, lo4), hi = _mm512_and_si512(_mm512_srli_epi16(t, 4), lo4);
        if (f.bits >= 5) {
            const __m512i p = _mm512_permutexvar_epi8(_mm512_load_si512(gemm_vnni_plane[b6][j]), b6 && j >= 2 ? pl1 : pl0);
            const __m512i mlo = _mm512_load_si512(gemm_vnni_ms[b6][0]), mhi = _mm512_load_si512(gemm_vnni_ms[b6][1]);
            /* 0xF8: a | (b & c) */
            lo = _mm512_ternarylogic_epi32(lo, _mm512_multishift_epi64_epi8(mlo, p), hb, 0xF8);
            hi = _mm512_ternarylogic_epi32(hi, _mm512_multishift_epi64_epi8(mhi, p), hb, 0xF8);
        }
        v[2 * j] = lo;
        v[2 * j + 1] = hi;
    }
}

/* A Q8_0 block's 32 rows of 16 signed bytes (at q) as 8 vectors of 4 k
 * each, bit 7 flipped (q + 128). */
static inline __attribute__((always_inline)) void gemm_vnni_q8_unpack(const uint8_t *q, __m512i v[8])
{
    const __m512i flip = _mm512_set1_epi8((char)0x80), rows = _mm512_load_si512(gemm_vnni_rows);
#pragma GCC unroll 8
    for (uint32_t g = 0; g < 8; g++)
        v[g] = _mm512_xor_si512(_mm512_permutexvar_epi8(rows, _mm512_loadu_si512(q + 64 * g)), flip);
}

/* A block's column scales s0 (k 0 .. 15), s1 (k 16 .. 31) and nm, with
 * the f32 operations of gemm.c's gemm_qs_panel_scales (exact products). */
static inline __attribute__((always_inline)) void gemm_vnni_scales(const uint8_t *grp, const uint8_t *blk,
                                                                   const gemm_wtype type, __m512 *s0, __m512 *s1,
                                                                   __m512 *nm)
{
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)grp));
    *s0 = *s1 = d;
    *nm = _mm512_setzero_ps();
    if (type == GEMM_W_Q4_K || type == GEMM_W_Q5_K) {
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)blk)));
        const __m512 m = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 16))));
        const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(grp + 32)));
        *s0 = *s1 = _mm512_mul_ps(d, sc);
        *nm = _mm512_castsi512_ps(
            _mm512_xor_si512(_mm512_castps_si512(_mm512_mul_ps(dmin, m)), _mm512_set1_epi32(INT32_MIN)));
    } else if (type == GEMM_W_Q6_K) {
        *s0 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)blk))));
        *s1 = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 16)))));
    } else if (type == GEMM_W_Q4_1 || type == GEMM_W_Q5_1) {
        *nm = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(grp + 32)));
    }
}

/* A 32-bit word at p broadcast to 16 lanes, read as one memory operand
 * (a vpdpbusd takes it as {1to16}; through a general register it costs a
 * move, a shift and a broadcast uop per word). */
static inline __attribute__((always_inline)) __m512i gemm_vnni_bcast(const void *p)
{
    return _mm512_broadcastd_epi32(_mm_loadu_si32(p));
}

/* One row's block: the integer sums of v against its 32 quantized values
 * q (8 dwords in v's order), then gemm.h's float steps into c. The
 * offset term off * (sA + sB) is integer and exact, taken as a shift (every
 * off is 0 or a power of two), so the lanes hold the same integers as the
 * portable tile's scalar. */
static inline __attribute__((always_inline)) __m512 gemm_vnni_row_block(const __m512i v[8], const int8_t *q,
                                                                        const float *da, const int32_t *sab,
                                                                        const gemm_wtype type, __m512 s0,
                                                                        __m512 s1, __m512 nm, __m512 c)
{
    __m512i a = _mm512_setzero_si512(), b = a;
#pragma GCC unroll 4
    for (uint32_t g = 0; g < 4; g++) {
        a = _mm512_dpbusd_epi32(a, v[g], gemm_vnni_bcast(q + 4 * g));
        b = _mm512_dpbusd_epi32(b, v[4 + g], gemm_vnni_bcast(q + 16 + 4 * g));
    }
    const uint32_t off = type == GEMM_W_Q8_0 ? 128 : gemm_qs_fmt_of(type).off;
    const uint32_t sh = off ? (uint32_t)__builtin_ctz(off) : 0;
    const __m512i sa = gemm_vnni_bcast(sab), sb = gemm_vnni_bcast(sab + 1);
    __m512 t;
    if (type == GEMM_W_Q6_K) {
        const __m512i ia = _mm512_sub_epi32(a, _mm512_slli_epi32(sa, sh));
        const __m512i ib = _mm512_sub_epi32(b, _mm512_slli_epi32(sb, sh));
        t = _mm512_fmadd_ps(s1, _mm512_cvtepi32_ps(ib), _mm512_mul_ps(s0, _mm512_cvtepi32_ps(ia)));
    } else {
        __m512i i = _mm512_add_epi32(a, b);
        if (off)
            i = _mm512_sub_epi32(i, _mm512_slli_epi32(_mm512_add_epi32(sa, sb), sh));
        t = _mm512_mul_ps(s0, _mm512_cvtepi32_ps(i));
    }
    if (gemm_wtype_has_nm(type))
        t = _mm512_fmadd_ps(nm, _mm512_cvtepi32_ps(_mm512_add_epi32(sa, sb)), t);
    return _mm512_fmadd_ps(_mm512_set1_ps(*da), t, c);
}

static inline __attribute__((always_inline)) void gemm_vnni_store(float *c, __m512 x, uint32_t ncols)
{
    _mm512_mask_storeu_ps(c, (__mmask16)((1u << ncols) - 1u), x);
}

static inline __attribute__((always_inline)) __m512 gemm_vnni_load(const float *c, uint32_t ncols, bool first)
{
    if (first)
        return _mm512_setzero_ps();
    return _mm512_maskz_loadu_ps((__mmask16)((1u << ncols) - 1u), c);
}

#define GEMM_VNNI_ROW(i)                                                         \
    if (mr > i) {                                                                \
        const size_t r_ = (size_t)(i) * rs + b;                                  \
        c##i = gemm_vnni_row_block(v, t->qa.q + 32 * r_, t->qa.d + r_, t->qa.s + 2 * r_, type, s0, s1, nm, c##i); \
    }

/* Prefetches every cache line [p, p + bytes) touches. A block is not
 * line-aligned (Q4_0: 288 bytes a block with its group header), so
 * stepping 64 bytes from p would skip its last line every other block. */
static inline __attribute__((always_inline)) void gemm_vnni_prefetch(const uint8_t *p, size_t bytes)
{
    const uintptr_t end = (uintptr_t)p + bytes;
    for (uintptr_t a = (uintptr_t)p & ~(uintptr_t)63; a < end; a += 64)
        __builtin_prefetch((const void *)a, 0, 3);
}

/* Block bi of a panel unpacked into v and its column scales, prefetching
 * the block's bytes pf bytes on. */
static inline __attribute__((always_inline)) void gemm_vnni_block(const uint8_t *panel, uint32_t bi, size_t pf,
                                                                  const gemm_wtype type, __m512i v[8], __m512 *s0,
                                                                  __m512 *s1, __m512 *nm)
{
    if (gemm_wtype_is_qs(type)) {
        const gemm_qs_fmt f = gemm_qs_fmt_of(type);
        const uint8_t *blk = panel + gemm_qs_block_off(f, bi);
        gemm_vnni_prefetch(blk + pf, gemm_qs_block_bytes(f));
        gemm_vnni_scales(panel + gemm_qs_group_off(f, bi), blk, type, s0, s1, nm);
        gemm_vnni_qs_unpack(blk + f.bh, f, v);
    } else {
        const uint8_t *blk = panel + (size_t)bi * GEMM_Q8_PANEL_BLOCK;
        gemm_vnni_prefetch(blk + pf, GEMM_Q8_PANEL_BLOCK);
        *s0 = *s1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk));
        *nm = _mm512_setzero_ps();
        gemm_vnni_q8_unpack(blk + GEMM_Q8_SCALES, v);
    }
}

#define GEMM_VNNI_LOAD(i) __m512 c##i = mr > i ? gemm_vnni_load(t->c + (i) * ldc, nc, t->first) : c0;
#define GEMM_VNNI_STORE(i) \
    if (mr > i)            \
        gemm_vnni_store(t->c + (i) * ldc, c##i, nc);
#define GEMM_VNNI_LOAD2(i) __m512 d##i = two && mr > i ? gemm_vnni_load(u->c + (i) * ldc, nc2, u->first) : d0;
#define GEMM_VNNI_ROW2(i)                                                        \
    if (two && mr > i) {                                                         \
        const size_t r_ = (size_t)(i) * rs + b;                                  \
        d##i = gemm_vnni_row_block(v, u->qa.q + 32 * r_, u->qa.d + r_, u->qa.s + 2 * r_, type, s0, s1, nm, d##i); \
    }
#define GEMM_VNNI_STORE2(i) \
    if (two && mr > i)      \
        gemm_vnni_store(u->c + (i) * ldc, d##i, nc2);

/* One tile (two false: u unused; unp: its blocks' vectors from t->unp,
 * gemm_vnni_unpack's, instead of unpacked here), or two tiles of the same rows and blocks
 * on two panels, block by block (two true): two streams of weights in
 * flight instead of one (one expert's matrix at M = 6 read 20.8 GB/s cold
 * on one thread against 38.8 in cache and a 33 GB/s probe: its compute and
 * memory barely overlapped). Each C value takes the same steps in the same
 * order either way. mr and two are constants, so the rows a tile does not
 * have and the second tile of a single cost nothing. */
static inline __attribute__((always_inline)) void gemm_vnni_qtile_impl(const gemm_qtile *t, const gemm_qtile *u,
                                                                       const uint32_t mr, const gemm_wtype type,
                                                                       const bool two, const bool unp)
{
    const size_t rs = t->qa.nb, ldc = t->ldc;
    const uint32_t nc = t->ncols, nc2 = two ? u->ncols : 0;
    __m512 c0 = gemm_vnni_load(t->c, nc, t->first);
    GEMM_VNNI_LOAD(1) GEMM_VNNI_LOAD(2) GEMM_VNNI_LOAD(3)
    GEMM_VNNI_LOAD(4) GEMM_VNNI_LOAD(5) GEMM_VNNI_LOAD(6) GEMM_VNNI_LOAD(7)
    __m512 d0 = two ? gemm_vnni_load(u->c, nc2, u->first) : c0;
    GEMM_VNNI_LOAD2(1) GEMM_VNNI_LOAD2(2) GEMM_VNNI_LOAD2(3)
    GEMM_VNNI_LOAD2(4) GEMM_VNNI_LOAD2(5) GEMM_VNNI_LOAD2(6) GEMM_VNNI_LOAD2(7)
    for (uint32_t b = 0; b < t->nb; b++) {
        const uint32_t bi = t->b0 + b;
        __m512i v[8];
        __m512 s0, s1, nm;
        if (unp) {
            const uint8_t *ub = t->unp + (size_t)b * GEMM_UNP_BYTES;
#pragma GCC unroll 8
            for (uint32_t g = 0; g < 8; g++)
                v[g] = _mm512_load_si512(ub + 64 * g);
            s0 = _mm512_load_ps(ub + 512);
            s1 = _mm512_load_ps(ub + 576);
            nm = _mm512_load_ps(ub + 640);
        } else {
            gemm_vnni_block(t->panel, bi, GEMM_PREFETCH, type, v, &s0, &s1, &nm);
        }
        GEMM_VNNI_ROW(0) GEMM_VNNI_ROW(1) GEMM_VNNI_ROW(2) GEMM_VNNI_ROW(3)
        GEMM_VNNI_ROW(4) GEMM_VNNI_ROW(5) GEMM_VNNI_ROW(6) GEMM_VNNI_ROW(7)
        if (two) {
            gemm_vnni_block(u->panel, bi, GEMM_PREFETCH, type, v, &s0, &s1, &nm);
            GEMM_VNNI_ROW2(0) GEMM_VNNI_ROW2(1) GEMM_VNNI_ROW2(2) GEMM_VNNI_ROW2(3)
            GEMM_VNNI_ROW2(4) GEMM_VNNI_ROW2(5) GEMM_VNNI_ROW2(6) GEMM_VNNI_ROW2(7)
        }
    }
    gemm_vnni_store(t->c, c0, nc);
    GEMM_VNNI_STORE(1) GEMM_VNNI_STORE(2) GEMM_VNNI_STORE(3)
    GEMM_VNNI_STORE(4) GEMM_VNNI_STORE(5) GEMM_VNNI_STORE(6) GEMM_VNNI_STORE(7)
    if (two) {
        gemm_vnni_store(u->c, d0, nc2);
        GEMM_VNNI_STORE2(1) GEMM_VNNI_STORE2(2) GEMM_VNNI_STORE2(3)
        GEMM_VNNI_STORE2(4) GEMM_VNNI_STORE2(5) GEMM_VNNI_STORE2(6) GEMM_VNNI_STORE2(7)
    }
}

/* one kernel per type and height: mr a constant, so the rows a tile does
 * not have cost nothing */
#define GEMM_VNNI_MR(tn, TYPE, n) \
    static void gemm_vnni_##tn##_##n(const gemm_qtile *t) { gemm_vnni_qtile_impl(t, t, n, TYPE, false, false); } \
    static void gemm_vnniu_##tn##_##n(const gemm_qtile *t) { gemm_vnni_qtile_impl(t, t, n, TYPE, false, true); }
#define GEMM_VNNI_MR2(tn, TYPE, n)                                              \
    static void gemm_vnni2_##tn##_##n(const gemm_qtile *t, const gemm_qtile *u) \
    {                                                                           \
        gemm_vnni_qtile_impl(t, u, n, TYPE, true, false);                       \
    }
/* gemm_unpack_fn: blocks b0 .. b0 + nb of panel, GEMM_UNP_BYTES each */
#define GEMM_VNNI_UNPACK(tn, TYPE)                                                                 \
    static void gemm_vnni_unpack_##tn(const uint8_t *panel, uint32_t b0, uint32_t nb, uint8_t *dst) \
    {                                                                                              \
        for (uint32_t b = 0; b < nb; b++, dst += GEMM_UNP_BYTES) {                                 \
            __m512i v[8];                                                                          \
            __m512 s0, s1, nm;                                                                     \
            gemm_vnni_block(panel, b0 + b, GEMM_PREFETCH, TYPE, v, &s0, &s1, &nm);                 \
            for (uint32_t g = 0; g < 8; g++)                                                       \
                _mm512_store_si512(dst + 64 * g, v[g]);                                            \
            _mm512_store_ps(dst + 512, s0);                                                        \
            _mm512_store_ps(dst + 576, s1);                                                        \
            _mm512_store_ps(dst + 640, nm);                                                        \
        }                                                                                          \
    }
#define GEMM_VNNI_DEF(tn, TYPE)                                                                        \
    GEMM_VNNI_UNPACK(tn, TYPE)                                                                         \
    GEMM_VNNI_MR(tn, TYPE, 1) GEMM_VNNI_MR(tn, TYPE, 2) GEMM_VNNI_MR(tn, TYPE, 3) GEMM_VNNI_MR(tn, TYPE, 4) \
    GEMM_VNNI_MR(tn, TYPE, 5) GEMM_VNNI_MR(tn, TYPE, 6) GEMM_VNNI_MR(tn, TYPE, 7) GEMM_VNNI_MR(tn, TYPE, 8) \
    GEMM_VNNI_MR2(tn, TYPE, 1) GEMM_VNNI_MR2(tn, TYPE, 2) GEMM_VNNI_MR2(tn, TYPE, 3)                   \
    GEMM_VNNI_MR2(tn, TYPE, 4) GEMM_VNNI_MR2(tn, TYPE, 5) GEMM_VNNI_MR2(tn, TYPE, 6)
GEMM_VNNI_DEF(q8_0, GEMM_W_Q8_0)
GEMM_VNNI_DEF(q4_0, GEMM_W_Q4_0)
GEMM_VNNI_DEF(q4_1, GEMM_W_Q4_1)
GEMM_VNNI_DEF(q5_0, GEMM_W_Q5_0)
GEMM_VNNI_DEF(q5_1, GEMM_W_Q5_1)
GEMM_VNNI_DEF(q4_K, GEMM_W_Q4_K)
GEMM_VNNI_DEF(q5_K, GEMM_W_Q5_K)
GEMM_VNNI_DEF(q6_K, GEMM_W_Q6_K)

#pragma GCC pop_options

#define GEMM_VNNI_BY_MR(tn)                                                                          \
    {gemm_vnni_##tn##_1, gemm_vnni_##tn##_2, gemm_vnni_##tn##_3, gemm_vnni_##tn##_4, gemm_vnni_##tn##_5, \
     gemm_vnni_##tn##_6, gemm_vnni_##tn##_7, gemm_vnni_##tn##_8}
gemm_qtile_fn *const gemm_vnni_qtiles[GEMM_W_COUNT][GEMM_MR8] = {
    [GEMM_W_Q8_0] = GEMM_VNNI_BY_MR(q8_0), [GEMM_W_Q4_0] = GEMM_VNNI_BY_MR(q4_0),
    [GEMM_W_Q4_1] = GEMM_VNNI_BY_MR(q4_1), [GEMM_W_Q5_0] = GEMM_VNNI_BY_MR(q5_0),
    [GEMM_W_Q5_1] = GEMM_VNNI_BY_MR(q5_1), [GEMM_W_Q4_K] = GEMM_VNNI_BY_MR(q4_K),
    [GEMM_W_Q5_K] = GEMM_VNNI_BY_MR(q5_K), [GEMM_W_Q6_K] = GEMM_VNNI_BY_MR(q6_K),
};
#define GEMM_VNNIU_BY_MR(tn)                                                                             \
    {gemm_vnniu_##tn##_1, gemm_vnniu_##tn##_2, gemm_vnniu_##tn##_3, gemm_vnniu_##tn##_4, gemm_vnniu_##tn##_5, \
     gemm_vnniu_##tn##_6, gemm_vnniu_##tn##_7, gemm_vnniu_##tn##_8}
gemm_qtile_fn *const gemm_vnni_qtiles_unp[GEMM_W_COUNT][GEMM_MR8] = {
    [GEMM_W_Q8_0] = GEMM_VNNIU_BY_MR(q8_0), [GEMM_W_Q4_0] = GEMM_VNNIU_BY_MR(q4_0),
    [GEMM_W_Q4_1] = GEMM_VNNIU_BY_MR(q4_1), [GEMM_W_Q5_0] = GEMM_VNNIU_BY_MR(q5_0),
    [GEMM_W_Q5_1] = GEMM_VNNIU_BY_MR(q5_1), [GEMM_W_Q4_K] = GEMM_VNNIU_BY_MR(q4_K),
    [GEMM_W_Q5_K] = GEMM_VNNIU_BY_MR(q5_K), [GEMM_W_Q6_K] = GEMM_VNNIU_BY_MR(q6_K),
};
gemm_unpack_fn *const gemm_vnni_unpack[GEMM_W_COUNT] = {
    [GEMM_W_Q8_0] = gemm_vnni_unpack_q8_0, [GEMM_W_Q4_0] = gemm_vnni_unpack_q4_0,
    [GEMM_W_Q4_1] = gemm_vnni_unpack_q4_1, [GEMM_W_Q5_0] = gemm_vnni_unpack_q5_0,
    [GEMM_W_Q5_1] = gemm_vnni_unpack_q5_1, [GEMM_W_Q4_K] = gemm_vnni_unpack_q4_K,
    [GEMM_W_Q5_K] = gemm_vnni_unpack_q5_K, [GEMM_W_Q6_K] = gemm_vnni_unpack_q6_K,
};
#define GEMM_VNNI2_BY_MR(tn)                                                                              \
    {gemm_vnni2_##tn##_1, gemm_vnni2_##tn##_2, gemm_vnni2_##tn##_3, gemm_vnni2_##tn##_4, gemm_vnni2_##tn##_5, \
     gemm_vnni2_##tn##_6}
gemm_qtile2_fn *const gemm_vnni_qtiles2[GEMM_W_COUNT][GEMM_MR_PAIR] = {
    [GEMM_W_Q8_0] = GEMM_VNNI2_BY_MR(q8_0), [GEMM_W_Q4_0] = GEMM_VNNI2_BY_MR(q4_0),
    [GEMM_W_Q4_1] = GEMM_VNNI2_BY_MR(q4_1), [GEMM_W_Q5_0] = GEMM_VNNI2_BY_MR(q5_0),
    [GEMM_W_Q5_1] = GEMM_VNNI2_BY_MR(q5_1), [GEMM_W_Q4_K] = GEMM_VNNI2_BY_MR(q4_K),
    [GEMM_W_Q5_K] = GEMM_VNNI2_BY_MR(q5_K), [GEMM_W_Q6_K] = GEMM_VNNI2_BY_MR(q6_K),
};

#else

bool gemm_vnni_ok(void) { return false; }
gemm_qtile_fn *const gemm_vnni_qtiles[GEMM_W_COUNT][GEMM_MR8];
gemm_qtile2_fn *const gemm_vnni_qtiles2[GEMM_W_COUNT][GEMM_MR_PAIR];
gemm_qtile_fn *const gemm_vnni_qtiles_unp[GEMM_W_COUNT][GEMM_MR8];
gemm_unpack_fn *const gemm_vnni_unpack[GEMM_W_COUNT];

#endif
