/* The one attention reduction of the project.
 *
 * Both cache layers (kv_layer.h, ring_layer.h), decode rows, prefill rows and
 * verify rows all attend through attn_run, so a KV layer and a ring layer that
 * hold the same rows answer bit-identically, and a prefill chunk's row i
 * equals the decode step at position i (ARCHITECTURE.md §1).
 *
 * The visible rows of one KV head are handed in as segments in logical order
 * (a KV layer: one segment; a ring layer: reference ++ ring in age order ++
 * draft rows). Each segment is f32 or int8 for K and for V independently.
 *
 * THE REDUCTION ORDER (what every path, scalar or SIMD, computes bit for bit):
 *   dot8(a, b, n): eight lanes; lane l = fmaf chain over d = l, l+8, l+16, ...
 *       (d < n, increasing d) starting at +0.0f; then
 *       ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
 *   key value k[d]:   f32 row, or (float)kq[d] * ks[d / k_group] for int8.
 *   query per head:   qc[d] = q[d] * kcol[d] when kcol != NULL, else q[d].
 *   score s_r      =  dot8(qc, k_r, head_dim) * scale
 *                     then, if softcap > 0, softcap * tanhf(s_r / softcap).
 *   max            =  fmaxf fold over visible rows in order, then with sink.
 *   e_r            =  pd_expf(s_r - max)            (attn.h's own exp)
 *   sum            =  e_first + ... + e_last in row order, then + pd_expf(sink - max)
 *   p_r            =  e_r / sum
 *   out[d]         =  fmaf chain over rows in order: acc = fmaf(p_r, v_r[d], acc),
 *                     from +0.0f; v_r[d] is the f32 value or
 *                     (float)vq[d] * vs[d / v_group]; finally out[d] *= vcol[d]
 *                     when vcol != NULL.
 *   imp[r]        +=  p_r for each head in head order (when imp != NULL).
 * Heads are independent; a caller may run (head, query) work in parallel but
 * never splits one reduction. */
#ifndef PD_ATTN_H
#define PD_ATTN_H

#include <stddef.h>
#include <stdint.h>

/* A run of consecutive logical rows of one KV head. For each of K and V
 * exactly one of the f32 pointer or the int8 pointer is set. */
typedef struct attn_seg {
    uint32_t rows;
    const float *k;   /* f32 keys [rows x head_dim] or NULL */
    const int8_t *kq; /* int8 keys [rows x head_dim] or NULL */
    const float *ks;  /* key scales [rows x ceil(head_dim / k_group)] (int8 only) */
    const float *v;   /* f32 values [rows x head_dim] or NULL */
    const int8_t *vq; /* int8 values [rows x head_dim] or NULL */
    const float *vs;  /* value scales [rows x ceil(head_dim / v_group)] (int8 only) */
} attn_seg;

/* One KV head's rows (borrowed for the duration of attn_run). */
typedef struct attn_kv {
    uint32_t head_dim;
    uint32_t k_group;     /* channels per key scale (int8 keys) */
    uint32_t v_group;     /* channels per value scale (int8 values) */
    const float *kcol;    /* per-channel key field [head_dim] or NULL */
    const float *vcol;    /* per-channel value field [head_dim] or NULL */
    const attn_seg *segs; /* in logical row order */
    uint32_t n_segs;
} attn_kv;

/* The Q heads that share this KV head, and what they see. */
typedef struct attn_query {
    uint32_t n_heads;     /* Q heads in the group (>= 1) */
    const float *q;       /* [n_heads x head_dim] */
    float scale;          /* score scale, usually 1/sqrt(head_dim) */
    float softcap;        /* 0 = off */
    const float *sinks;   /* learned sink logit per head [n_heads] or NULL */
    uint32_t first;       /* first visible logical row */
    uint32_t upto;        /* one past the last visible logical row (clamped to the rows held) */
} attn_query;

/* Floats of scratch attn_run needs for n_heads heads over `span` visible rows. */
size_t attn_scratch_floats(uint32_t n_heads, uint32_t head_dim, uint32_t span);

/* Attends q against kv. Visible rows are [first, upto) clamped to the rows
 * held, with first clamped so that at least one row is visible; when no row
 * is held the output is all zeros.
 *   out    [n_heads x head_dim], written.
 *   probs  optional [n_heads x span]: p_r of visible row first + j at [h*span + j].
 *   imp    optional, indexed by logical row: imp[r] += p_r (heads in order).
 *   scratch  attn_scratch_floats(...) floats, caller-owned (no allocation here).
 * Returns the span (visible row count) actually used. */
uint32_t attn_run(const attn_kv *kv, const attn_query *q, float *out, float *probs, float *imp,
                  float *scratch);

/* The exponential every softmax in the project uses (also outside attention,
 * e.g. sampling): a fixed fmaf polynomial, identical in every ISA path.
 * Accurate to ~2 ulp on [-87, 88.72]; returns 0 below -87.0f, +inf above
 * ln(FLT_MAX) ~ 88.7228f, and NaN (the same bits) for NaN. */
float pd_expf(float x);

/* y[i] = pd_expf(x[i]) for i < n, bit-identical to the scalar call in every
 * ISA path (vectorized where pd_cpu_isa() allows). x and y may be equal. */
void pd_expf_n(const float *x, float *y, size_t n);

/* dot8 as defined above, exposed for other row-local kernels and tests. */
float attn_dot8(const float *a, const float *b, uint32_t n);
/* The portable reference of attn_dot8 (attn_dot8 dispatches by pd_cpu_isa;
 * both give the same bits). */
float attn_dot8_scalar(const float *a, const float *b, uint32_t n);

#endif
