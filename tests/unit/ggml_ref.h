/* A test-side reference of ggml's dequantize_row_* for the block types the
 * GEMM takes (Q4_0, Q5_0, Q4_K, Q5_K, Q6_K), written straight from ggml's
 * definitions (ggml-common.h block layouts, ggml-quants.c loops) with the
 * same float32 expressions in the same order, independently of
 * cluster/model/gemm.c. Compiled with -ffp-contract=off like the rest of
 * the project, so `d1 * q - m1` is two roundings, as in ggml's C. */
#ifndef PD_TEST_GGML_REF_H
#define PD_TEST_GGML_REF_H

#include "base/fp16.h"

#include <stdint.h>
#include <string.h>

static inline float ggml_ref_f16(const uint8_t *p)
{
    return pd_f16_to_f32((uint16_t)(p[0] | (p[1] << 8)));
}

static inline void ggml_ref_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m)
{
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* Block bytes and values of each type, by the ggml type id. */
static inline void ggml_ref_block(int ggml_type, int *qk, int *bytes)
{
    switch (ggml_type) {
    case 2: *qk = 32; *bytes = 18; break;   /* q4_0: d, qs[16] */
    case 6: *qk = 32; *bytes = 22; break;   /* q5_0: d, qh[4], qs[16] */
    case 3: *qk = 32; *bytes = 20; break;   /* q4_1: d, m, qs[16] */
    case 7: *qk = 32; *bytes = 24; break;   /* q5_1: d, m, qh[4], qs[16] */
    case 12: *qk = 256; *bytes = 144; break; /* q4_K: d, dmin, scales[12], qs[128] */
    case 13: *qk = 256; *bytes = 176; break; /* q5_K: d, dmin, scales[12], qh[32], qs[128] */
    case 14: *qk = 256; *bytes = 210; break; /* q6_K: ql[128], qh[64], scales[16], d */
    default: *qk = 0; *bytes = 0;
    }
}

/* y[0 .. k) from the k / qk blocks at x. */
static inline void ggml_ref_dequant(int ggml_type, const uint8_t *x, float *y, int k)
{
    int qk, bb;
    ggml_ref_block(ggml_type, &qk, &bb);
    const int nb = k / qk;
    for (int i = 0; i < nb; i++) {
        const uint8_t *b = x + (size_t)i * bb;
        if (ggml_type == 2) {
            const float d = ggml_ref_f16(b);
            for (int j = 0; j < qk / 2; ++j) {
                const int x0 = (b[2 + j] & 0x0F) - 8;
                const int x1 = (b[2 + j] >> 4) - 8;
                y[i * qk + j + 0] = x0 * d;
                y[i * qk + j + qk / 2] = x1 * d;
            }
        } else if (ggml_type == 3) {
            const float d = ggml_ref_f16(b), m = ggml_ref_f16(b + 2);
            for (int j = 0; j < qk / 2; ++j) {
                const int x0 = (b[4 + j] & 0x0F);
                const int x1 = (b[4 + j] >> 4);
                y[i * qk + j + 0] = x0 * d + m;
                y[i * qk + j + qk / 2] = x1 * d + m;
            }
        } else if (ggml_type == 7) {
            const float d = ggml_ref_f16(b), m = ggml_ref_f16(b + 2);
            uint32_t qh;
            memcpy(&qh, b + 4, 4);
            for (int j = 0; j < qk / 2; ++j) {
                const uint8_t xh_0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
                const uint8_t xh_1 = (uint8_t)(((qh >> (j + 12))) & 0x10);
                const int x0 = (b[8 + j] & 0x0F) | xh_0;
                const int x1 = (b[8 + j] >> 4) | xh_1;
                y[i * qk + j + 0] = x0 * d + m;
                y[i * qk + j + qk / 2] = x1 * d + m;
            }
        } else if (ggml_type == 6) {
            const float d = ggml_ref_f16(b);
            uint32_t qh;
            memcpy(&qh, b + 2, 4); /* little-endian host, as ggml */
            for (int j = 0; j < qk / 2; ++j) {
                const uint8_t xh_0 = (uint8_t)(((qh >> (j + 0)) << 4) & 0x10);
                const uint8_t xh_1 = (uint8_t)(((qh >> (j + 12))) & 0x10);
                const int32_t x0 = ((b[6 + j] & 0x0F) | xh_0) - 16;
                const int32_t x1 = ((b[6 + j] >> 4) | xh_1) - 16;
                y[i * qk + j + 0] = x0 * d;
                y[i * qk + j + qk / 2] = x1 * d;
            }
        } else if (ggml_type == 12 || ggml_type == 13) {
            const float d = ggml_ref_f16(b), min = ggml_ref_f16(b + 2);
            const uint8_t *scales = b + 4;
            const uint8_t *qh = b + 16;
            const uint8_t *q = ggml_type == 12 ? b + 16 : b + 48;
            float *yy = y + (size_t)i * qk;
            int is = 0;
            uint8_t sc, m, u1 = 1, u2 = 2;
            for (int j = 0; j < qk; j += 64) {
                ggml_ref_scale_min_k4(is + 0, scales, &sc, &m);
                const float d1 = d * sc;
                const float m1 = min * m;
                ggml_ref_scale_min_k4(is + 1, scales, &sc, &m);
                const float d2 = d * sc;
                const float m2 = min * m;
                if (ggml_type == 12) {
                    for (int l = 0; l < 32; ++l) *yy++ = d1 * (q[l] & 0xF) - m1;
                    for (int l = 0; l < 32; ++l) *yy++ = d2 * (q[l] >> 4) - m2;
                } else {
                    for (int l = 0; l < 32; ++l) *yy++ = d1 * ((q[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
                    for (int l = 0; l < 32; ++l) *yy++ = d2 * ((q[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
                    u1 = (uint8_t)(u1 << 2);
                    u2 = (uint8_t)(u2 << 2);
                }
                q += 32;
                is += 2;
            }
        } else if (ggml_type == 14) {
            const float d = ggml_ref_f16(b + 208);
            const uint8_t *ql = b, *qh = b + 128;
            const int8_t *sc = (const int8_t *)(b + 192);
            float *yy = y + (size_t)i * qk;
            for (int n = 0; n < qk; n += 128) {
                for (int l = 0; l < 32; ++l) {
                    int is = l / 16;
                    const int8_t q1 = (int8_t)((int8_t)((ql[l + 0] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
                    const int8_t q2 = (int8_t)((int8_t)((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
                    const int8_t q3 = (int8_t)((int8_t)((ql[l + 0] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
                    const int8_t q4 = (int8_t)((int8_t)((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
                    yy[l + 0] = d * sc[is + 0] * q1;
                    yy[l + 32] = d * sc[is + 2] * q2;
                    yy[l + 64] = d * sc[is + 4] * q3;
                    yy[l + 96] = d * sc[is + 6] * q4;
                }
                yy += 128;
                ql += 64;
                qh += 32;
                sc += 8;
            }
        }
    }
}

#endif
