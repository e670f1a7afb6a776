/* f16 / bf16 conversions: scalar reference and F16C bulk paths. */
#include "base/fp16.h"

#include "base/cpu.h"

#include <string.h>

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

uint16_t pd_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu >= 0x7f800000u) /* inf or NaN */
        return (uint16_t)(sign | 0x7c00u | (absu > 0x7f800000u ? 0x0200u | ((absu >> 13) & 0x3ffu) : 0));
    if (absu >= 0x477ff000u) /* rounds to >= 65520: overflow to inf */
        return (uint16_t)(sign | 0x7c00u);
    if (absu < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (absu < 0x33000000u) /* below half of the smallest subnormal: +-0 */
            return (uint16_t)sign;
        uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(absu >> 23); /* 14..24 */
        uint32_t q = mant >> shift;
        uint32_t rem = mant & ((1u << shift) - 1u);
        uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (q & 1u)))
            q++;
        return (uint16_t)(sign | q);
    }
    uint32_t r = absu - 0x38000000u; /* rebias exponent 127 -> 15 */
    uint32_t q = r >> 13;
    uint32_t rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (q & 1u)))
        q++;
    return (uint16_t)(sign | q);
}

float pd_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0x1f) /* inf, or NaN made quiet (as F16C's vcvtph2ps does) */
        return bits_f32(sign | 0x7f800000u | (mant << 13) | (mant ? 0x400000u : 0u));
    if (exp == 0) {
        if (mant == 0)
            return bits_f32(sign);
        /* subnormal: mant * 2^-24, exact in f32 */
        float v = (float)mant * 0x1p-24f;
        return bits_f32(sign | f32_bits(v));
    }
    return bits_f32(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t pd_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x0040u); /* quiet NaN */
    uint32_t lsb = (u >> 16) & 1u;
    u += 0x7fffu + lsb;
    return (uint16_t)(u >> 16);
}

float pd_bf16_to_f32(uint16_t h)
{
    return bits_f32((uint32_t)h << 16);
}

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("avx2,f16c"))) static void f32_to_f16_f16c(const float *src, uint16_t *dst,
                                                                  size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
        _mm_storeu_si128((__m128i *)(dst + i), h);
    }
    for (; i < n; i++)
        dst[i] = pd_f32_to_f16(src[i]);
}

__attribute__((target("avx2,f16c"))) static void f16_to_f32_f16c(const uint16_t *src, float *dst,
                                                                  size_t n)
{
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    for (; i < n; i++)
        dst[i] = pd_f16_to_f32(src[i]);
}

static int have_f16c(void)
{
    __builtin_cpu_init();
    return pd_cpu_isa() >= PD_ISA_AVX2 && __builtin_cpu_supports("f16c");
}
#endif

void pd_f32_to_f16_n(const float *src, uint16_t *dst, size_t n)
{
#if defined(__x86_64__)
    if (have_f16c()) {
        f32_to_f16_f16c(src, dst, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        dst[i] = pd_f32_to_f16(src[i]);
}

void pd_f16_to_f32_n(const uint16_t *src, float *dst, size_t n)
{
#if defined(__x86_64__)
    if (have_f16c()) {
        f16_to_f32_f16c(src, dst, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        dst[i] = pd_f16_to_f32(src[i]);
}

void pd_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = pd_bf16_to_f32(src[i]);
}
