/* IEEE half (f16) and bfloat16 conversions.
 *
 * f32 -> f16 and f32 -> bf16 round to nearest, ties to even; infinities and
 * signed zeros are kept, NaN stays NaN (quiet). f16 subnormals are produced and
 * read exactly. The bulk routines use F16C where pd_cpu_isa() allows and are
 * bit-identical to the scalar ones. */
#ifndef PD_FP16_H
#define PD_FP16_H

#include <stddef.h>
#include <stdint.h>

uint16_t pd_f32_to_f16(float x);
float pd_f16_to_f32(uint16_t h);
uint16_t pd_f32_to_bf16(float x);
float pd_bf16_to_f32(uint16_t h);

/* dst[i] = convert(src[i]) for i < n. src and dst must not overlap. */
void pd_f32_to_f16_n(const float *src, uint16_t *dst, size_t n);
void pd_f16_to_f32_n(const uint16_t *src, float *dst, size_t n);
void pd_bf16_to_f32_n(const uint16_t *src, float *dst, size_t n);

#endif
