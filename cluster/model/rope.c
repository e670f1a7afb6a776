/* rope: deterministic RoPE angles without libm (see rope.h, docs/rope.md).
 * Double-double arithmetic for the frequencies and the argument reduction,
 * Taylor polynomials for sin and cos on [-pi/4, pi/4], and a table of the
 * float results per (position, pair). */
#include "cluster/model/rope.h"

#include "base/check.h"

#include <float.h>
#include <string.h>

/* The whole point is bit-identical doubles everywhere: excess precision
 * (x87) would change them. Contraction is off in the build (-ffp-contract=off). */
#if !defined(FLT_EVAL_METHOD) || FLT_EVAL_METHOD != 0
#error "rope.c needs FLT_EVAL_METHOD == 0 (IEEE double evaluation)"
#endif

/* ---- double-double arithmetic (value = hi + lo, |lo| <= ulp(hi) / 2) ------ */

typedef struct dd {
    double hi, lo;
} dd;

/* a + b exactly (Knuth). */
static dd two_sum(double a, double b)
{
    double s = a + b, bb = s - a;
    return (dd){s, (a - (s - bb)) + (b - bb)};
}

/* a + b exactly when |a| >= |b| (Dekker). */
static dd fast_two_sum(double a, double b)
{
    double s = a + b;
    return (dd){s, b - (s - a)};
}

/* a * b exactly (Dekker, Veltkamp split; no FMA, so no host difference). */
static dd two_prod(double a, double b)
{
    const double split = 134217729.0; /* 2^27 + 1 */
    double p = a * b;
    double ta = split * a, ah = ta - (ta - a), al = a - ah;
    double tb = split * b, bh = tb - (tb - b), bl = b - bh;
    return (dd){p, ((ah * bh - p) + ah * bl + al * bh) + al * bl};
}

/* a + b, relative error ~3 * 2^-106 (the "accurate" double-word sum). */
static dd dd_add(dd a, dd b)
{
    dd s = two_sum(a.hi, b.hi), t = two_sum(a.lo, b.lo);
    s.lo += t.hi;
    s = fast_two_sum(s.hi, s.lo);
    s.lo += t.lo;
    return fast_two_sum(s.hi, s.lo);
}

static dd dd_neg(dd a)
{
    return (dd){-a.hi, -a.lo};
}

static dd dd_mul(dd a, dd b)
{
    dd p = two_prod(a.hi, b.hi);
    p.lo += a.hi * b.lo + a.lo * b.hi;
    return fast_two_sum(p.hi, p.lo);
}

static dd dd_mul_d(dd a, double b)
{
    dd p = two_prod(a.hi, b);
    p.lo += a.lo * b;
    return fast_two_sum(p.hi, p.lo);
}

/* a / b: three quotient digits, each corrected against the exact remainder. */
static dd dd_div(dd a, dd b)
{
    double q1 = a.hi / b.hi;
    dd r = dd_add(a, dd_neg(dd_mul_d(b, q1)));
    double q2 = r.hi / b.hi;
    r = dd_add(r, dd_neg(dd_mul_d(b, q2)));
    double q3 = r.hi / b.hi;
    return dd_add(fast_two_sum(q1, q2), (dd){q3, 0.0});
}

/* 2^k for -1022 <= k <= 1023, built from its bits. */
static double pow2i(int k)
{
    uint64_t bits = (uint64_t)(k + 1023) << 52;
    double d;
    memcpy(&d, &bits, sizeof d);
    return d;
}

/* Nearest integer of |t| < 2^51 (ties away from zero), without libm. */
static double round_int(double t)
{
    int64_t i = (int64_t)(t + (t >= 0 ? 0.5 : -0.5));
    return (double)i;
}

/* ln 2 = LN2_HI + LN2_LO (the first 106 bits). */
static const dd LN2 = {0x1.62e42fefa39efp-1, 0x1.abc9e3b39803fp-56};

/* ln(b) for a finite b > 0 in double-double: b = m 2^e with m in
 * [sqrt(1/2), sqrt(2)], ln m = 2 atanh(s) = 2 (s + s^3/3 + ...), s = (m - 1) /
 * (m + 1), |s| <= 0.1716: 22 terms reach 2^-110. */
static dd dd_log(double b)
{
    uint64_t bits;
    memcpy(&bits, &b, sizeof bits);
    int e = (int)((bits >> 52) & 0x7ff) - 1023;
    CHECKF(e > -1023 && e < 1024, "rope: ln of a subnormal or non-finite %g", b);
    bits = (bits & ((1ull << 52) - 1)) | (1023ull << 52);
    double m;
    memcpy(&m, &bits, sizeof m);
    if (m > 1.4142135623730951) {
        m *= 0.5; /* exact */
        e += 1;
    }
    dd s = dd_div((dd){m - 1.0, 0.0}, two_sum(m, 1.0)); /* m - 1 is exact (Sterbenz) */
    dd s2 = dd_mul(s, s);
    enum { K = 22 };
    dd acc = dd_div((dd){1.0, 0.0}, (dd){2.0 * K + 1.0, 0.0});
    for (int k = K - 1; k >= 0; k--)
        acc = dd_add(dd_mul(acc, s2), dd_div((dd){1.0, 0.0}, (dd){2.0 * k + 1.0, 0.0}));
    dd lnm = dd_mul(dd_mul_d(s, 2.0), acc);
    return dd_add(dd_mul_d(LN2, (double)e), lnm);
}

double rope_ln(double x)
{
    dd l = dd_log(x);
    return l.hi + l.lo;
}

/* exp(y) rounded to double, |y| < 700: y = k ln2 + r, |r| <= ln2 / 2; exp(r)
 * = (1 + em1(r / 1024))^1024 with em1 a 9-term Taylor series in double-double
 * and ten squarings of 1 + em1 kept as em1 (2 em1 + em1^2), so the small
 * part never loses bits to the 1. */
static double dd_exp_round(dd y)
{
    CHECKF(y.hi > -700.0 && y.hi < 700.0, "rope: exp(%g) out of range", y.hi);
    double k = round_int(y.hi * 0x1.71547652b82fep+0); /* y / ln 2 */
    dd r = dd_add(y, dd_neg(dd_mul_d(LN2, k)));
    r.hi *= 0x1p-10; /* exact */
    r.lo *= 0x1p-10;
    enum { N = 9 };
    double fact = 1.0;
    for (int n = 2; n <= N; n++)
        fact *= n; /* 9! = 362880, exact */
    dd p = dd_div((dd){1.0, 0.0}, (dd){fact, 0.0});
    for (int n = N - 1; n >= 1; n--) {
        fact /= (n + 1); /* n!, exact */
        p = dd_add(dd_mul(p, r), dd_div((dd){1.0, 0.0}, (dd){fact, 0.0}));
    }
    dd em1 = dd_mul(p, r);
    for (int i = 0; i < 10; i++)
        em1 = dd_add(dd_mul_d(em1, 2.0), dd_mul(em1, em1));
    dd e = dd_add((dd){1.0, 0.0}, em1);
    return (e.hi + e.lo) * pow2i((int)k); /* e.hi + e.lo == e.hi: normalized; scaling is exact */
}

double rope_freq(double base, uint32_t head_dim, uint32_t i)
{
    CHECKF(base > 1.0 && base < 0x1p1000 && head_dim >= 2 && i < head_dim / 2, "rope: base %g head_dim %u pair %u",
           base, head_dim, i);
    double x = -(2.0 * (double)i) / (double)head_dim;
    return dd_exp_round(dd_mul_d(dd_log(base), x));
}

/* ---- sin and cos ------------------------------------------------------------ */

/* pi/2 = PIO2_1 + PIO2_2 + PIO2_3 to ~160 bits; 2/pi rounded. */
static const double PIO2_1 = 0x1.921fb54442d18p+0, PIO2_2 = 0x1.1a62633145c07p-54,
                    PIO2_3 = -0x1.f1976b7ed8fbcp-110, TWO_OVER_PI = 0x1.45f306dc9c883p-1;

/* 1/n! rounded to double, signs alternating as sin and cos take them. */
static const double S[8] = {-0x1.5555555555555p-3, 0x1.1111111111111p-7,  -0x1.a01a01a01a01ap-13,
                            0x1.71de3a556c734p-19, -0x1.ae64567f544e4p-26, 0x1.6124613a86d09p-33,
                            -0x1.ae7f3e733b81fp-41, 0x1.952c77030ad4ap-49}; /* 1/3! .. 1/17! */
static const double C[8] = {0x1.5555555555555p-5,  -0x1.6c16c16c16c17p-10, 0x1.a01a01a01a01ap-16,
                            -0x1.27e4fb7789f5cp-22, 0x1.1eed8eff8d898p-29,  -0x1.93974a8c07c9dp-37,
                            0x1.ae7f3e733b81fp-45,  -0x1.6827863b97d97p-53}; /* 1/4! .. 1/18! */

/* sin and cos of r = rh + rl, |rh| <= ~pi/4, |rl| <= ulp(rh). The Taylor
 * tails past 1/17! and 1/18! are below 2^-62 relative on that interval. */
static void kernel_sincos(double rh, double rl, double *s, double *c)
{
    dd zz = two_prod(rh, rh); /* z = rh^2 exactly as zz.hi + zz.lo */
    double z = zz.hi;
    double ps = S[7];
    for (int i = 6; i >= 0; i--)
        ps = ps * z + S[i];
    double pc = C[7];
    for (int i = 6; i >= 0; i--)
        pc = pc * z + C[i];
    /* sin(rh + rl) = rh + rh z ps(z) + rl cos(rh) */
    *s = rh + (rh * z * ps + rl * (1.0 - 0.5 * z));
    /* cos(rh + rl) = 1 - z/2 + z^2 pc(z) - rl sin(rh); w = 1 - z/2 rounded,
     * (1 - w) - z/2 is its rounding error exactly, and -zz.lo/2 the error of
     * z itself */
    double hz = 0.5 * z, w = 1.0 - hz;
    *c = w + (((1.0 - w) - hz) + (z * z * pc - 0.5 * zz.lo - rl * rh));
}

void rope_sincos(double theta, double *c, double *s)
{
    CHECKF(theta > -ROPE_MAX_ANGLE && theta < ROPE_MAX_ANGLE, "rope: angle %g out of range", theta);
    double k = round_int(theta * TWO_OVER_PI);
    /* r = theta - k pi/2: k PIO2_1 and k PIO2_2 exact as double-double, the
     * first difference exact, every sum with ~2^-104 relative error */
    dd p1 = two_prod(k, PIO2_1), p2 = two_prod(k, PIO2_2);
    dd r = two_sum(theta, -p1.hi);
    r = dd_add(r, (dd){-p1.lo, 0.0});
    r = dd_add(r, dd_neg(p2));
    r = dd_add(r, (dd){-(k * PIO2_3), 0.0});
    double sr, cr;
    kernel_sincos(r.hi, r.lo, &sr, &cr);
    switch ((int64_t)k & 3) {
    case 0: *s = sr, *c = cr; break;
    case 1: *s = cr, *c = -sr; break;
    case 2: *s = -sr, *c = -cr; break;
    default: *s = -cr, *c = sr; break;
    }
}

void rope_angle(uint64_t pos, double freq, float *c, float *s)
{
    double cd, sd;
    rope_sincos((double)pos * freq, &cd, &sd);
    *c = (float)cd;
    *s = (float)sd;
}

/* ---- the table -------------------------------------------------------------- */

/* INV: cs holds n_pos rows of half pairs (cos, sin) = rope_angle(pos,
 * freq[i]); freq[i] = rope_freq(base, head_dim, i). */
struct rope_table {
    const pd_alloc *alloc;
    uint32_t head_dim, half, n_pos;
    double *freq; /* [half] */
    float *cs;    /* [n_pos x half x 2] */
};

pd_status rope_table_new(double base, uint32_t head_dim, uint32_t n_pos, const pd_alloc *alloc,
                         rope_table **out, pd_err *err)
{
    if (!(base > 1.0) || !(base < 0x1p1000))
        return pd_err_set(err, PD_ERR_ARG, "rope: base %g must be above 1", base);
    if (head_dim == 0 || head_dim % 2)
        return pd_err_set(err, PD_ERR_ARG, "rope: head dimension %u must be even", head_dim);
    uint32_t half = head_dim / 2;
    if ((uint64_t)n_pos * half > SIZE_MAX / 8)
        return pd_err_set(err, PD_ERR_NOMEM, "rope: table of %u positions too large", n_pos);
    rope_table *t = pd_alloc_bytes(alloc, sizeof *t);
    if (!t)
        return pd_err_set(err, PD_ERR_NOMEM, "rope: out of memory");
    *t = (rope_table){.alloc = alloc, .head_dim = head_dim, .half = half, .n_pos = n_pos};
    t->freq = pd_alloc_bytes(alloc, half * sizeof *t->freq);
    t->cs = n_pos ? pd_alloc_bytes(alloc, (size_t)n_pos * half * 2 * sizeof *t->cs) : NULL;
    if (!t->freq || (n_pos && !t->cs)) {
        rope_table_free(t);
        return pd_err_set(err, PD_ERR_NOMEM, "rope: out of memory for %u positions", n_pos);
    }
    for (uint32_t i = 0; i < half; i++)
        t->freq[i] = rope_freq(base, head_dim, i);
    for (uint32_t p = 0; p < n_pos; p++) {
        float *row = t->cs + (size_t)p * half * 2;
        for (uint32_t i = 0; i < half; i++)
            rope_angle(p, t->freq[i], &row[2 * i], &row[2 * i + 1]);
    }
    *out = t;
    return PD_OK;
}

void rope_table_free(rope_table *t)
{
    if (!t)
        return;
    pd_free_bytes(t->alloc, t->freq, t->half * sizeof *t->freq);
    pd_free_bytes(t->alloc, t->cs, (size_t)t->n_pos * t->half * 2 * sizeof *t->cs);
    pd_free_bytes(t->alloc, t, sizeof *t);
}

uint32_t rope_table_positions(const rope_table *t)
{
    return t->n_pos;
}

uint32_t rope_table_head_dim(const rope_table *t)
{
    return t->head_dim;
}

double rope_table_freq(const rope_table *t, uint32_t i)
{
    CHECK(i < t->half);
    return t->freq[i];
}

size_t rope_table_bytes(const rope_table *t)
{
    return sizeof *t + t->half * sizeof *t->freq + (size_t)t->n_pos * t->half * 2 * sizeof *t->cs;
}

const float *rope_table_row(const rope_table *t, uint64_t pos, float *buf)
{
    if (pos < t->n_pos)
        return t->cs + (size_t)pos * t->half * 2;
    for (uint32_t i = 0; i < t->half; i++)
        rope_angle(pos, t->freq[i], &buf[2 * i], &buf[2 * i + 1]);
    return buf;
}

void rope_table_apply(const rope_table *t, float *x, uint32_t n_heads, uint64_t pos, rope_pairs pairs)
{
    float buf[1024];
    CHECKF(t->head_dim <= 1024, "rope: head dimension %u", t->head_dim);
    const float *cs = rope_table_row(t, pos, buf);
    const uint32_t half = t->half;
    for (uint32_t h = 0; h < n_heads; h++) {
        float *v = x + (size_t)h * t->head_dim;
        for (uint32_t i = 0; i < half; i++) {
            uint32_t a = pairs == ROPE_PAIRS_ADJACENT ? 2 * i : i;
            uint32_t b = pairs == ROPE_PAIRS_ADJACENT ? 2 * i + 1 : i + half;
            float x0 = v[a], x1 = v[b], c = cs[2 * i], s = cs[2 * i + 1];
            v[a] = x0 * c - x1 * s;
            v[b] = x0 * s + x1 * c;
        }
    }
}
