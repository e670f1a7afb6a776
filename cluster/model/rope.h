/* rope: rotary position embedding with angle tables whose bits are the same
 * on every host (docs/rope.md).
 *
 * Pair i of a head (i < head_dim / 2) rotates by the angle
 *     theta(pos, i) = pos (x) f_i,   f_i = base ^ x_i,   x_i = -(2i) (/) head_dim
 * where (x) and (/) are one IEEE double multiplication / division, and f_i
 * is the double nearest to base ^ x_i (computed in double-double, ~2^-94
 * relative error, then rounded: the correctly rounded value except in
 * cases too close to a rounding boundary to occur in practice). This is the
 * angle of the usual `pos * pow(base, -2.0 * i / head_dim)` with a correctly
 * rounded pow.
 *
 * cos(theta) and sin(theta) come from rope_sincos, which uses no libm: an
 * exact Cody-Waite reduction by pi/2 in double-double arithmetic (pi/2 as a
 * sum of three doubles, products split exactly with Veltkamp/Dekker, so the
 * reduced argument keeps ~100 bits even when theta sits close to a multiple
 * of pi/2), then degree-17 / degree-18 Taylor polynomials on |r| <= pi/4 in
 * double with a correction for the reduced argument's low part. The double
 * results are within ~1 ulp (double) of the true values, so the float they
 * round to is the correctly rounded one except when the true value lies
 * within ~2^-52 (relative) of a float rounding boundary; tests/unit/
 * test_rope.c measures it against libm. Only +, -, *, / on doubles and one
 * conversion to float are used, in a fixed order, and the build forbids
 * contraction into FMAs (-ffp-contract=off) and needs FLT_EVAL_METHOD == 0:
 * every IEEE-754 host computes the same bits.
 *
 * A table holds cos and sin as floats for positions [0, n_pos) and every
 * pair; rows past it are computed by the same routine (the same bits,
 * slower), so a table is a cache of rope_sincos, never a different answer. */
#ifndef PD_ROPE_H
#define PD_ROPE_H

#include "base/alloc.h"
#include "base/status.h"

#include <stddef.h>
#include <stdint.h>

/* Which elements of a head form pair i. */
typedef enum rope_pairs {
    ROPE_PAIRS_ADJACENT, /* (2i, 2i + 1): llama ("normal") */
    ROPE_PAIRS_HALVES,   /* (i, i + head_dim / 2): NeoX (qwen2) */
    ROPE_PAIRS_COUNT
} rope_pairs;

/* Angles theta with |theta| below this are reduced exactly (rope_sincos
 * CHECKs it): pos * f_i < 2^50, i.e. any position below 2^50. */
#define ROPE_MAX_ANGLE 1125899906842624.0 /* 2^50 */

/* f_i as defined above (base > 1, head_dim even >= 2, i < head_dim / 2). */
double rope_freq(double base, uint32_t head_dim, uint32_t i);

/* ln x for a finite normal x > 0, rounded to double from double-double (the
 * same routine rope_freq uses; no libm, the same bits on every host). A
 * float rounding of it is logf's correctly rounded value (but for double
 * rounding in the last bit, vanishingly rare). */
double rope_ln(double x);

/* cos(theta) and sin(theta) in double, |theta| < ROPE_MAX_ANGLE, within
 * ~1 ulp. */
void rope_sincos(double theta, double *c, double *s);

/* The table's entry: (float) cos and sin of pos (x) freq. */
void rope_angle(uint64_t pos, double freq, float *c, float *s);

typedef struct rope_table rope_table;

/* Precomputes cos and sin of every pair for positions [0, n_pos). Memory
 * from alloc (NULL = malloc): 8 * n_pos * head_dim / 2 bytes plus the
 * frequencies. Returns owned *out, free with rope_table_free. PD_ERR_ARG for
 * base <= 1 (or not finite) or an odd / zero head_dim; PD_ERR_NOMEM. */
pd_status rope_table_new(double base, uint32_t head_dim, uint32_t n_pos, const pd_alloc *alloc,
                         rope_table **out, pd_err *err);
void rope_table_free(rope_table *t);

uint32_t rope_table_positions(const rope_table *t);
uint32_t rope_table_head_dim(const rope_table *t);
/* f_i of the table (i < head_dim / 2). */
double rope_table_freq(const rope_table *t, uint32_t i);
/* Bytes the table holds from its allocator. */
size_t rope_table_bytes(const rope_table *t);

/* cs[2i] = cos, cs[2i + 1] = sin of pair i at pos: a pointer into the table
 * when pos < n_pos, else computed into buf [head_dim] and buf returned. */
const float *rope_table_row(const rope_table *t, uint64_t pos, float *buf);

/* Rotates x, n_heads heads of head_dim, in place for position pos:
 * (a, b) of pair i becomes (a c - b s, a s + b c). */
void rope_table_apply(const rope_table *t, float *x, uint32_t n_heads, uint64_t pos, rope_pairs pairs);

#endif
