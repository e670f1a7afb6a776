/* int8 row quantization used by the caches.
 *
 * Grouped (q8_2f, the KV layer): each row is first divided by an optional
 * per-channel field col[d] (NULL = all ones), then every group of `group`
 * consecutive channels gets its own scale s = max(absmax / 127, 1e-12) and
 * q[d] = clamp(round_half_away(x[d] / s), -127, 127). K rows use group 32,
 * V rows use group = row length (one scale per row).
 *
 * Symmetric per-row (the ring layer's int8 mirror): s = absmax / 127, or 1
 * for an all-zero row; q[d] = clamp(round_half_even(x[d] / s), -127, 127).
 *
 * Dequantized value of channel d: q[d] * s[group(d)] (times col[d] when a
 * field is given). The attention kernel (attn.h) reads int8 rows as exactly
 * these dequantized values. */
#ifndef PD_QUANT_H
#define PD_QUANT_H

#include <stdint.h>

/* Number of scales a grouped row of n channels carries. */
uint32_t quant_groups(uint32_t n, uint32_t group);

/* Quantizes row[0..n) into q[0..n) and scales[0..quant_groups(n, group)). */
void quant_q8_row(const float *row, const float *col, uint32_t n, uint32_t group, int8_t *q,
                  float *scales);

/* out[d] = q[d] * scales[d / group] (* col[d] when col != NULL). */
void quant_q8_row_dequant(const int8_t *q, const float *scales, const float *col, uint32_t n,
                          uint32_t group, float *out);

/* Symmetric per-row quantization; returns the row's scale. */
float quant_sym_row(const float *row, uint32_t n, int8_t *q);

#endif
