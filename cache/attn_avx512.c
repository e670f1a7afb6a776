/* The AVX-512F kernels of the attention reduction (attn_kern.h): int8 rows
 * of one Q head, where dequantizing costs more than reading and AVX2 leaves
 * attention compute-bound (bench_attn: about half the read bandwidth).
 *
 * The key dot keeps dot8's eight lanes per row: a zmm holds two rows, lanes
 * 0-7 the first, 8-15 the second, each lane the same fmaf chain over d = l,
 * l+8, ... as the portable path, and each row's eight lanes are combined in
 * dot8's order. The value pass is elementwise per channel, so sixteen
 * channels per zmm keep each channel's chain over rows unchanged.
 *
 * Built twice, like the GEMM's AVX-512 file: for the CPU (immintrin.h,
 * target avx512f), and in the test test_attn_avx512 with PD_AVX512_EMULATED
 * on SIMDe's portable AVX-512, so CPUs without AVX-512 check the same
 * source bit for bit against the portable path. */
#include "cache/attn_kern.h"

#if defined(__x86_64__)

#ifdef PD_AVX512_EMULATED
#if !defined(__AVX2__) || !defined(__FMA__)
#error "the emulated build runs SIMDe's 512-bit FMA as two native 256-bit ones: compile with -mavx2 -mfma"
#endif
#define SIMDE_ENABLE_NATIVE_ALIASES
#include <simde/x86/avx512.h>
#define ATTN512
#else
#include <immintrin.h>
/* a function attribute, not a pragma: clang (the fuzz builds) ignores GCC's */
#define ATTN512 __attribute__((target("avx512f,avx2,fma")))
#endif

#define ALWAYS_INLINE ATTN512 inline __attribute__((always_inline))

/* Two ymm as one zmm: lo in lanes 0-7, hi in 8-15. */
static ALWAYS_INLINE __m512 attn512_join(__m256 lo, __m256 hi)
{
    return _mm512_castpd_ps(
        _mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
}

/* Sixteen int8 codes as f32, exact. SIMDe 0.7 lacks the 512-bit sign
 * extension, so the emulated build converts two halves and joins them. */
static ALWAYS_INLINE __m512 attn512_i8x16(__m128i b)
{
#ifdef PD_AVX512_EMULATED
    return attn512_join(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
                        _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(b, b))));
#else
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
#endif
}

/* dot8's final combine of one row's eight lanes:
 * ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). */
static ALWAYS_INLINE float attn512_hsum8(__m256 a)
{
    __m128 t = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    __m128 u = _mm_add_ps(t, _mm_movehl_ps(t, t));
    return _mm_cvtss_f32(_mm_add_ss(u, _mm_movehdup_ps(u)));
}

/* Rows j and j + 1 of the eight: their eight channels at kd as one zmm of
 * codes times their group's scales (s<j>), the fmaf onto acc. */
#define ATTN512_K2(j, acc)                                                                        \
    acc = _mm512_fmadd_ps(                                                                        \
        qv,                                                                                       \
        _mm512_mul_ps(attn512_i8x16(_mm_unpacklo_epi64(                                           \
                          _mm_loadl_epi64((const __m128i *)(kd + (j) * (size_t)hd)),              \
                          _mm_loadl_epi64((const __m128i *)(kd + ((j) + 1) * (size_t)hd)))),      \
                      s##j),                                                                      \
        acc)
#define ATTN512_SCALES(j)                                                                         \
    const __m512 s##j = attn512_join(_mm256_broadcast_ss(sg + (j) * (size_t)ng),                  \
                                     _mm256_broadcast_ss(sg + ((j) + 1) * (size_t)ng))

ATTN512 void attn_avx512_dot8x8_q8(const float *qh, const int8_t *k, const float *ks, uint32_t hd,
                           uint32_t ng, uint32_t group, float dots[8], const int8_t *pf,
                           const float *pfs)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    if (pf) /* the eight rows ATTN_PF_ROWS ahead: their scales now, their codes spread below */
        for (uint32_t o = 0; o < 8 * ng * (uint32_t)sizeof(float); o += 64)
            _mm_prefetch((const char *)pfs + o, _MM_HINT_T0);
    for (uint32_t g = 0, d = 0; d < hd; g++) {
        const uint32_t end = (g + 1) * group < hd ? (g + 1) * group : hd;
        const float *sg = ks + g;
        ATTN512_SCALES(0);
        ATTN512_SCALES(2);
        ATTN512_SCALES(4);
        ATTN512_SCALES(6);
        for (; d < end; d += 8) {
            if (pf) /* 8 rows x hd bytes over hd / 8 steps: one line per step */
                _mm_prefetch((const char *)pf + 8 * (size_t)d, _MM_HINT_T0);
            const __m256 q8 = _mm256_loadu_ps(qh + d);
            const __m512 qv = attn512_join(q8, q8);
            const int8_t *kd = k + d;
            ATTN512_K2(0, a0);
            ATTN512_K2(2, a1);
            ATTN512_K2(4, a2);
            ATTN512_K2(6, a3);
        }
    }
    const __m512 acc[4] = {a0, a1, a2, a3};
    for (int j = 0; j < 4; j++) {
        dots[2 * j] = attn512_hsum8(_mm512_castps512_ps256(acc[j]));
        dots[2 * j + 1] = attn512_hsum8(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[j]), 1)));
    }
}

/* The value pass over n rows for channels [0, 16*NB) of one head: the
 * accumulators stay in registers across the rows; NB is a constant at every
 * call site (8: a 128-channel row whole, in address order; or 1). */
#define ATTN512_VLOAD(c) __m512 a##c = NB > (c) ? _mm512_loadu_ps(o + 16 * (c)) : _mm512_setzero_ps()
#define ATTN512_VACC(c)                                                                           \
    do {                                                                                          \
        if (NB > (c))                                                                             \
            a##c = _mm512_fmadd_ps(                                                               \
                pv, _mm512_mul_ps(attn512_i8x16(_mm_loadu_si128((const __m128i *)(vr + 16 * (c)))), sv), \
                a##c);                                                                            \
    } while (0)
#define ATTN512_VSTORE(c) do { if (NB > (c)) _mm512_storeu_ps(o + 16 * (c), a##c); } while (0)

static ALWAYS_INLINE void attn512_vblock_q8(float *o, const int8_t *v, const float *vs, uint32_t hd,
                                            const float *p, uint32_t n, const int NB, uint32_t npf)
{
    const int8_t *pf = v + (size_t)ATTN_PF_ROWS * hd; /* read when npf > 0: channel 0 on */
    const float *pfs = vs + ATTN_PF_ROWS;
    ATTN512_VLOAD(0); ATTN512_VLOAD(1); ATTN512_VLOAD(2); ATTN512_VLOAD(3);
    ATTN512_VLOAD(4); ATTN512_VLOAD(5); ATTN512_VLOAD(6); ATTN512_VLOAD(7);
    for (uint32_t r = 0; r < n; r++) {
        const int8_t *vr = v + (size_t)r * hd;
        if (r < npf) { /* row r + ATTN_PF_ROWS: its codes and scale */
            for (uint32_t x = 0; x < hd; x += 64)
                _mm_prefetch((const char *)(pf + (size_t)r * hd) + x, _MM_HINT_T0);
            _mm_prefetch((const char *)(pfs + r), _MM_HINT_T0);
        }
        const __m512 pv = _mm512_set1_ps(p[r]), sv = _mm512_set1_ps(vs[r]);
        ATTN512_VACC(0); ATTN512_VACC(1); ATTN512_VACC(2); ATTN512_VACC(3);
        ATTN512_VACC(4); ATTN512_VACC(5); ATTN512_VACC(6); ATTN512_VACC(7);
    }
    ATTN512_VSTORE(0); ATTN512_VSTORE(1); ATTN512_VSTORE(2); ATTN512_VSTORE(3);
    ATTN512_VSTORE(4); ATTN512_VSTORE(5); ATTN512_VSTORE(6); ATTN512_VSTORE(7);
}

/* The last 8 channels when hd % 16 == 8. */
ATTN512 static void attn512_vtail8_q8(float *o, const int8_t *v, const float *vs, uint32_t hd, const float *p,
                              uint32_t n)
{
    __m256 a = _mm256_loadu_ps(o);
    for (uint32_t r = 0; r < n; r++) {
        __m256 x = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(v + (size_t)r * hd))));
        a = _mm256_fmadd_ps(_mm256_set1_ps(p[r]), _mm256_mul_ps(x, _mm256_set1_ps(vs[r])), a);
    }
    _mm256_storeu_ps(o, a);
}

ATTN512 void attn_avx512_vrows_q8(float *o, const int8_t *v, const float *vs, uint32_t hd, const float *p,
                          uint32_t n, uint32_t npf)
{
    /* whole 128-channel rows, then (other head sizes) 16 channels a pass
     * over the block's rows, which L1 holds; the first pass prefetches */
    uint32_t d = 0;
    for (; d + 128 <= hd; d += 128, npf = 0)
        attn512_vblock_q8(o + d, v + d, vs, hd, p, n, 8, npf);
    for (; d + 16 <= hd; d += 16, npf = 0)
        attn512_vblock_q8(o + d, v + d, vs, hd, p, n, 1, npf);
    if (d + 8 <= hd)
        attn512_vtail8_q8(o + d, v + d, vs, hd, p, n);
}

#endif /* __x86_64__ */
