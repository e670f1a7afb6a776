/* gemm_qs_sse: the unpacking of a qs panel block's k row (gemm_kern.h) in
 * 128-bit integer operations, shared by the AVX2 kernels (gemm.c) and the
 * AVX-512 ones (gemm_avx512.c, also built on SIMDe). Include it after the
 * ISA's intrinsics and target pragma: it has no includes of its own, so it
 * compiles for whichever target (or SIMDe's aliases) the includer set. */
#ifndef PD_MODEL_GEMM_QS_SSE_H
#define PD_MODEL_GEMM_QS_SSE_H

/* Row kq + r (kq a multiple of 8, r in 0..7, a compile-time constant after
 * unrolling) of the block whose nibbles start at qd: the 16 columns' q as
 * signed bytes, column l in byte l. Only whole-byte shifts within 16-bit
 * lanes and masks: every byte keeps its own column. */
static inline __attribute__((always_inline)) __m128i gemm_qs_row_q(const uint8_t *qd, uint32_t kq, uint32_t r,
                                                                   const gemm_wtype type)
{
    const gemm_qs_fmt f = gemm_qs_fmt_of(type);
    const __m128i x = _mm_loadu_si128((const __m128i *)(qd + 16 * (kq / 2 + r / 2)));
    __m128i v = _mm_and_si128(r % 2 ? _mm_srli_epi16(x, 4) : x, _mm_set1_epi8(0x0F));
    if (f.bits == 5) {
        __m128i h = _mm_loadu_si128((const __m128i *)(qd + GEMM_QS_NIBBLES + 16 * (kq / 8)));
        h = r < 4 ? _mm_slli_epi16(h, 4 - r) : r > 4 ? _mm_srli_epi16(h, r - 4) : h;
        v = _mm_or_si128(v, _mm_and_si128(h, _mm_set1_epi8(0x10)));
    } else if (f.bits == 6) {
        const uint32_t r4 = r % 4;
        __m128i h = _mm_loadu_si128((const __m128i *)(qd + GEMM_QS_NIBBLES + 16 * (kq / 4 + r / 4)));
        h = r4 < 2 ? _mm_slli_epi16(h, 4 - 2 * r4) : r4 > 2 ? _mm_srli_epi16(h, 2) : h;
        v = _mm_or_si128(v, _mm_and_si128(h, _mm_set1_epi8(0x30)));
    }
    if (f.off)
        v = _mm_sub_epi8(v, _mm_set1_epi8((char)f.off));
    return v;
}

#endif
