/* The attention reduction (see attn.h for the exact order every path keeps).
 * This file holds the portable reference; ISA-specific paths must match it
 * bit for bit (tests/unit/test_attn.c checks). */
#include "cache/attn.h"

#include "cache/check.h"
#include "cache/cpu.h"

#include <math.h>
#include <string.h>

float pd_expf(float x)
{
    if (x != x)
        return x;
    if (x < -87.0f)
        return 0.0f;
    if (x > 88.5f)
        x = 88.5f; /* exp(88.5) ~ 2.7e38 still finite; beyond saturates */
    float n = rintf(x * 1.44269504088896341f);
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
    uint32_t bits = (uint32_t)(ni + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

float attn_dot8(const float *a, const float *b, uint32_t n)
{
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (uint32_t d = 0; d < n; d++)
        l[d & 7] = fmaf(a[d], b[d], l[d & 7]);
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

size_t attn_scratch_floats(uint32_t n_heads, uint32_t head_dim, uint32_t span)
{
    /* scores [n_heads x span] + qc [n_heads x head_dim] + one dequantized row */
    return (size_t)n_heads * span + (size_t)n_heads * head_dim + head_dim + 64;
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

uint32_t attn_run(const attn_kv *kv, const attn_query *q, float *out, float *probs, float *imp,
                  float *scratch)
{
    const uint32_t hd = kv->head_dim, nh = q->n_heads;
    CHECK(hd > 0 && nh > 0);
    uint64_t total = 0;
    for (uint32_t s = 0; s < kv->n_segs; s++)
        total += kv->segs[s].rows;
    uint32_t upto = q->upto < total ? q->upto : (uint32_t)total;
    if (upto == 0) {
        memset(out, 0, sizeof(float) * nh * hd);
        return 0;
    }
    uint32_t first = q->first < upto ? q->first : upto - 1;
    uint32_t span = upto - first;

    float *scores = scratch;
    float *qc = scores + (size_t)nh * span;
    float *row = qc + (size_t)nh * hd;

    for (uint32_t h = 0; h < nh; h++)
        for (uint32_t d = 0; d < hd; d++)
            qc[h * hd + d] = kv->kcol ? q->q[h * hd + d] * kv->kcol[d] : q->q[h * hd + d];

    /* score pass: each visible K row read once for all heads */
    uint32_t r0 = 0;
    for (uint32_t s = 0; s < kv->n_segs; s++) {
        const attn_seg *seg = &kv->segs[s];
        for (uint32_t i = 0; i < seg->rows; i++) {
            uint32_t r = r0 + i;
            if (r < first || r >= upto)
                continue;
            const float *k = attn_row(seg, i, hd, 0, kv->k_group, row);
            for (uint32_t h = 0; h < nh; h++)
                scores[(size_t)h * span + (r - first)] = attn_dot8(qc + (size_t)h * hd, k, hd) * q->scale;
        }
        r0 += seg->rows;
    }

    if (q->softcap > 0.0f)
        for (size_t j = 0; j < (size_t)nh * span; j++)
            scores[j] = q->softcap * tanhf(scores[j] / q->softcap);

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
    r0 = 0;
    for (uint32_t s = 0; s < kv->n_segs; s++) {
        const attn_seg *seg = &kv->segs[s];
        for (uint32_t i = 0; i < seg->rows; i++) {
            uint32_t r = r0 + i;
            if (r < first || r >= upto)
                continue;
            const float *v = attn_row(seg, i, hd, 1, kv->v_group, row);
            for (uint32_t h = 0; h < nh; h++) {
                float p = scores[(size_t)h * span + (r - first)];
                float *o = out + (size_t)h * hd;
                for (uint32_t d = 0; d < hd; d++)
                    o[d] = fmaf(p, v[d], o[d]);
            }
        }
        r0 += seg->rows;
    }
    if (kv->vcol)
        for (uint32_t h = 0; h < nh; h++)
            for (uint32_t d = 0; d < hd; d++)
                out[(size_t)h * hd + d] *= kv->vcol[d];

    if (imp)
        for (uint32_t h = 0; h < nh; h++)
            for (uint32_t j = 0; j < span; j++)
                imp[first + j] += scores[(size_t)h * span + j];
    if (probs)
        memcpy(probs, scores, sizeof(float) * nh * span);
    return span;
}
