/* int8 row quantization (grouped q8_2f and symmetric per-row). */
#include "cache/quant.h"

#include <math.h>

uint32_t quant_groups(uint32_t n, uint32_t group)
{
    return group ? (n + group - 1) / group : 0;
}

/* Saturates to [-127, 127] (-128 is never produced, so codes are symmetric).
 * A NaN element (a model bug upstream) codes as 0 rather than reaching an
 * undefined float-to-int conversion; fmaxf already keeps it out of absmax. */
static int8_t quant_clamp(float r)
{
    if (r != r)
        return 0;
    if (r > 127.0f)
        return 127;
    if (r < -127.0f)
        return -127;
    return (int8_t)r;
}

void quant_q8_row(const float *row, const float *col, uint32_t n, uint32_t group, int8_t *q,
                  float *scales)
{
    for (uint32_t g0 = 0, gi = 0; g0 < n; g0 += group, gi++) {
        uint32_t g1 = g0 + group < n ? g0 + group : n;
        float absmax = 0.0f;
        for (uint32_t d = g0; d < g1; d++) {
            float r = col ? row[d] / col[d] : row[d];
            absmax = fmaxf(absmax, fabsf(r));
        }
        float s = fmaxf(absmax / 127.0f, 1e-12f);
        scales[gi] = s;
        for (uint32_t d = g0; d < g1; d++) {
            float r = col ? row[d] / col[d] : row[d];
            q[d] = quant_clamp(roundf(r / s));
        }
    }
}

void quant_q8_row_dequant(const int8_t *q, const float *scales, const float *col, uint32_t n,
                          uint32_t group, float *out)
{
    for (uint32_t d = 0; d < n; d++) {
        float x = (float)q[d] * scales[d / group];
        out[d] = col ? x * col[d] : x;
    }
}

float quant_sym_row(const float *row, uint32_t n, int8_t *q)
{
    float absmax = 0.0f;
    for (uint32_t d = 0; d < n; d++)
        absmax = fmaxf(absmax, fabsf(row[d]));
    float s = absmax > 0.0f ? absmax / 127.0f : 1.0f;
    for (uint32_t d = 0; d < n; d++)
        q[d] = quant_clamp(rintf(row[d] / s));
    return s;
}
