/* attn: the one attention reduction. The AVX2 path, and the AVX-512
 * kernels it calls for int8 rows of one Q head, equal the portable
 * reference bit for bit over randomized configurations (built a second time
 * as test_attn_avx512 on SIMDe, so CPUs without AVX-512 check those kernels
 * too); the reference is
 * close to an f64 softmax-attention; windows, segment splits, int8 rows,
 * importance and empty input behave as attn.h states; pd_expf's AVX2 twin
 * equals the scalar function. */
#include "pd_test.h"

#include "cache/attn.h"
#include "base/cpu.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SEGS 4

/* Check records every passing ck_assert (a write per call in fork mode), so
 * loops assert only on failure. */
#define REQUIRE(cond, ...)                \
    do {                                  \
        if (!(cond))                      \
            ck_abort_msg(__VA_ARGS__);    \
    } while (0)

/* ---- test fixture: the logical rows of one KV head, in 1..4 segments ---- */

typedef struct tcfg {
    uint32_t hd, nh, kg, vg, n_segs;
    uint32_t rows[MAX_SEGS];
    int kq[MAX_SEGS], vq[MAX_SEGS]; /* int8 storage for K / V of segment s */
    int kcol, vcol, sinks;
    float scale, softcap;
} tcfg;

typedef struct tkv {
    tcfg c;
    uint32_t total;
    attn_seg segs[MAX_SEGS];
    attn_kv kv;
    float *q, *kcol, *vcol, *sinks;
    float *kf, *vf; /* every logical row as the f32 value attn must read [total x hd] */
    void *mem[8 * MAX_SEGS];
    int n_mem;
} tkv;

static void *tkv_alloc(tkv *t, size_t bytes)
{
    void *p = calloc(1, bytes ? bytes : 1);
    REQUIRE(p != NULL, "out of memory");
    t->mem[t->n_mem++] = p;
    return p;
}

static void tkv_free(tkv *t)
{
    for (int i = 0; i < t->n_mem; i++)
        free(t->mem[i]);
    free(t->q);
    free(t->kcol);
    free(t->vcol);
    free(t->sinks);
    free(t->kf);
    free(t->vf);
}

static uint32_t groups(uint32_t n, uint32_t g)
{
    return (n + g - 1) / g;
}

/* A random f32 element; now and then an exact +0 or -0. */
static float elem(pd_rng *r, float lo, float hi)
{
    uint32_t u = pd_rng_below(r, 32);
    if (u == 0)
        return 0.0f;
    if (u == 1)
        return -0.0f;
    return pd_rng_uniform(r, lo, hi);
}

/* Fills segment storage per the config and mirrors every row into kf/vf. */
static void tkv_make(tkv *t, const tcfg *c, pd_rng *r)
{
    memset(t, 0, sizeof *t);
    t->c = *c;
    const uint32_t hd = c->hd;
    for (uint32_t s = 0; s < c->n_segs; s++)
        t->total += c->rows[s];
    t->kf = calloc((size_t)t->total * hd + 1, sizeof(float));
    t->vf = calloc((size_t)t->total * hd + 1, sizeof(float));
    t->q = calloc((size_t)c->nh * hd, sizeof(float));
    REQUIRE(t->kf && t->vf && t->q, "out of memory");
    for (size_t i = 0; i < (size_t)c->nh * hd; i++)
        t->q[i] = elem(r, -1.5f, 1.5f);
    if (c->kcol) {
        t->kcol = malloc(hd * sizeof(float));
        pd_rng_fill(r, t->kcol, hd, 0.25f, 2.0f);
    }
    if (c->vcol) {
        t->vcol = malloc(hd * sizeof(float));
        pd_rng_fill(r, t->vcol, hd, 0.25f, 2.0f);
    }
    if (c->sinks) {
        t->sinks = malloc(c->nh * sizeof(float));
        pd_rng_fill(r, t->sinks, c->nh, -3.0f, 3.0f);
    }
    uint32_t r0 = 0;
    for (uint32_t s = 0; s < c->n_segs; s++) {
        attn_seg *g = &t->segs[s];
        const uint32_t n = c->rows[s];
        g->rows = n;
        size_t cells = (size_t)n * hd;
        for (int kv = 0; kv < 2; kv++) {
            int quant = kv ? c->vq[s] : c->kq[s];
            uint32_t grp = kv ? c->vg : c->kg;
            float *mirror = (kv ? t->vf : t->kf) + (size_t)r0 * hd;
            if (quant) {
                int8_t *q = tkv_alloc(t, cells);
                float *sc = tkv_alloc(t, (size_t)n * groups(hd, grp) * sizeof(float));
                for (size_t i = 0; i < cells; i++)
                    q[i] = (int8_t)((int)pd_rng_below(r, 255) - 127);
                pd_rng_fill(r, sc, (size_t)n * groups(hd, grp), 0.001f, 0.03f);
                for (uint32_t i = 0; i < n; i++)
                    for (uint32_t d = 0; d < hd; d++)
                        mirror[(size_t)i * hd + d] =
                            (float)q[(size_t)i * hd + d] * sc[(size_t)i * groups(hd, grp) + d / grp];
                if (kv)
                    g->vq = q, g->vs = sc;
                else
                    g->kq = q, g->ks = sc;
            } else {
                float *f = tkv_alloc(t, cells * sizeof(float));
                for (size_t i = 0; i < cells; i++)
                    f[i] = elem(r, -2.0f, 2.0f);
                memcpy(mirror, f, cells * sizeof(float));
                if (kv)
                    g->v = f;
                else
                    g->k = f;
            }
        }
        r0 += n;
    }
    t->kv = (attn_kv){.head_dim = hd, .k_group = c->kg, .v_group = c->vg, .kcol = t->kcol,
                      .vcol = t->vcol, .segs = t->segs, .n_segs = c->n_segs};
}

typedef struct tres {
    uint32_t span;
    float *out, *probs, *imp;
} tres;

/* Runs attn_run with the given ISA; imp starts from imp0 (total floats) when
 * given. Probs and imp buffers have a sentinel-filled slack that must stay. */
static tres run(const tkv *t, pd_isa isa, uint32_t first, uint32_t upto, const float *imp0)
{
    const tcfg *c = &t->c;
    REQUIRE(pd_cpu_set_isa(isa) == (isa < pd_cpu_detect() ? isa : pd_cpu_detect()), "isa %d", isa);
    uint32_t span_max = t->total + 1;
    tres r = {0};
    r.out = malloc(((size_t)c->nh * c->hd + 1) * sizeof(float));
    r.probs = malloc(((size_t)c->nh * span_max + 1) * sizeof(float));
    r.imp = malloc(((size_t)t->total + 1) * sizeof(float));
    float *scratch = malloc(attn_scratch_floats(c->nh, c->hd, span_max) * sizeof(float));
    REQUIRE(r.out && r.probs && r.imp && scratch, "out of memory");
    for (size_t i = 0; i < (size_t)c->nh * span_max + 1; i++)
        r.probs[i] = 1234.5f;
    for (uint32_t i = 0; i <= t->total; i++)
        r.imp[i] = imp0 && i < t->total ? imp0[i] : -7.0f;
    attn_query q = {.n_heads = c->nh, .q = t->q, .scale = c->scale, .softcap = c->softcap,
                    .sinks = t->sinks, .first = first, .upto = upto};
    r.span = attn_run(&t->kv, &q, r.out, r.probs, imp0 ? r.imp : NULL, scratch);
    free(scratch);
    return r;
}

static void tres_free(tres *r)
{
    free(r->out);
    free(r->probs);
    free(r->imp);
}

/* Index of the first bitwise difference, or -1. */
static long bits_diff(const float *a, const float *b, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (memcmp(a + i, b + i, sizeof(float)) != 0)
            return (long)i;
    return -1;
}

static void assert_same_bits(const char *what, const float *a, const float *b, size_t n,
                             unsigned cfg)
{
    long i = bits_diff(a, b, n);
    if (i >= 0)
        ck_abort_msg("config %u: %s differ at %ld: %a vs %a", cfg, what, i, (double)a[i],
                     (double)b[i]);
}

static const uint32_t hd_choices[] = {1, 3, 4, 8, 12, 20, 32, 64, 72, 128, 136};

static tcfg random_cfg(pd_rng *r)
{
    tcfg c = {0};
    c.hd = hd_choices[pd_rng_below(r, sizeof hd_choices / sizeof hd_choices[0])];
    if (pd_rng_below(r, 20) == 0)
        c.hd = 256;
    c.nh = 1 + pd_rng_below(r, 8);
    const uint32_t kgs[] = {c.hd, 32, 8, 16, 5, 3};
    const uint32_t vgs[] = {c.hd, c.hd, 8, 32, 7};
    c.kg = kgs[pd_rng_below(r, 6)];
    c.vg = vgs[pd_rng_below(r, 5)];
    c.n_segs = 1 + pd_rng_below(r, MAX_SEGS);
    uint32_t max_rows = c.hd >= 128 ? 24 : 40;
    for (uint32_t s = 0; s < c.n_segs; s++) {
        c.rows[s] = pd_rng_below(r, 5) == 0 ? 0 : pd_rng_below(r, max_rows);
        c.kq[s] = (int)pd_rng_below(r, 2);
        c.vq[s] = (int)pd_rng_below(r, 2);
    }
    c.kcol = pd_rng_below(r, 2);
    c.vcol = pd_rng_below(r, 2);
    c.sinks = pd_rng_below(r, 3) == 0;
    const float scales[] = {1.0f / sqrtf((float)c.hd), 1.0f, 12.0f, 0.01f};
    c.scale = scales[pd_rng_below(r, 4)];
    c.softcap = pd_rng_below(r, 3) == 0 ? pd_rng_uniform(r, 1.0f, 30.0f) : 0.0f;
    return c;
}

/* ---- scalar == AVX2 ---- */

START_TEST(attn_avx2_equals_scalar_bit_for_bit_on_random_configs)
{
    if (pd_cpu_detect() < PD_ISA_AVX2)
        printf("attn: CPU has no AVX2; the AVX2 comparison degenerates to scalar vs scalar\n");
    pd_rng rng = {.s = 0xa77e0001};
    unsigned n_cfg = 700, n_nonempty = 0;
    for (unsigned cfg = 0; cfg < n_cfg; cfg++) {
        tcfg c = random_cfg(&rng);
        tkv t;
        tkv_make(&t, &c, &rng);
        uint32_t first = pd_rng_below(&rng, 4) == 0 ? 0 : pd_rng_below(&rng, t.total + 3);
        uint32_t upto = pd_rng_below(&rng, 3) == 0 ? UINT32_MAX : pd_rng_below(&rng, t.total + 5);
        float *imp0 = NULL;
        if (pd_rng_below(&rng, 2)) {
            imp0 = malloc(((size_t)t.total + 1) * sizeof(float));
            pd_rng_fill(&rng, imp0, t.total + 1, 0.0f, 3.0f);
        }
        tres a = run(&t, PD_ISA_SCALAR, first, upto, imp0);
        n_nonempty += a.span > 0;
        for (int isa = PD_ISA_AVX2; isa < PD_ISA_COUNT; isa++) {
            tres b = run(&t, (pd_isa)isa, first, upto, imp0);
            REQUIRE(a.span == b.span, "config %u: span %u vs %u", cfg, a.span, b.span);
            assert_same_bits("out", a.out, b.out, (size_t)c.nh * c.hd, cfg);
            assert_same_bits("probs", a.probs, b.probs, (size_t)c.nh * (t.total + 1) + 1, cfg);
            assert_same_bits("imp", a.imp, b.imp, (size_t)t.total + 1, cfg);
            tres_free(&b);
        }
        tres_free(&a);
        free(imp0);
        tkv_free(&t);
    }
    ck_assert_uint_gt(n_nonempty, n_cfg / 2);
    pd_cpu_set_isa(pd_cpu_detect());
}
END_TEST

/* Zeros of both signs, huge logits (exp underflows to 0 for most rows), +-inf
 * keys: the paths still agree bit for bit (NaN compared as NaN). */
START_TEST(attn_avx2_equals_scalar_on_extreme_values)
{
    pd_rng rng = {.s = 0xa77e0002};
    for (unsigned cfg = 0; cfg < 200; cfg++) {
        tcfg c = random_cfg(&rng);
        c.scale = cfg % 2 ? 300.0f : 1e-30f;
        tkv t;
        tkv_make(&t, &c, &rng);
        for (uint32_t s = 0; s < c.n_segs; s++) {
            float *k = (float *)t.segs[s].k;
            if (k && t.segs[s].rows && cfg % 5 == 0)
                k[pd_rng_below(&rng, t.segs[s].rows * c.hd)] = cfg % 10 ? INFINITY : -INFINITY;
        }
        if (cfg % 7 == 0)
            for (uint32_t i = 0; i < c.nh * c.hd; i++)
                t.q[i] = i % 2 ? -0.0f : 0.0f;
        tres a = run(&t, PD_ISA_SCALAR, 0, UINT32_MAX, NULL);
        for (int isa = PD_ISA_AVX2; isa < PD_ISA_COUNT; isa++) {
            tres b = run(&t, (pd_isa)isa, 0, UINT32_MAX, NULL);
            REQUIRE(a.span == b.span, "config %u: span %u vs %u", cfg, a.span, b.span);
            for (size_t i = 0; i < (size_t)c.nh * c.hd; i++)
                if (!(isnan(a.out[i]) && isnan(b.out[i])))
                    REQUIRE(memcmp(&a.out[i], &b.out[i], 4) == 0, "config %u isa %d out[%zu]: %a vs %a",
                            cfg, isa, i, (double)a.out[i], (double)b.out[i]);
            for (size_t i = 0; i < (size_t)c.nh * a.span; i++)
                if (!(isnan(a.probs[i]) && isnan(b.probs[i])))
                    REQUIRE(memcmp(&a.probs[i], &b.probs[i], 4) == 0, "config %u isa %d probs[%zu]", cfg,
                            isa, i);
            tres_free(&b);
        }
        tres_free(&a);
        tkv_free(&t);
    }
    pd_cpu_set_isa(pd_cpu_detect());
}
END_TEST

/* One Q head over int8 K and V (the OCR decoder's MHA with --kv q8): the
 * case the AVX-512 kernels take. Every head size that is a multiple of 8
 * (so 16-channel blocks and an 8-channel tail both occur), key groups of 8
 * to hd, row counts that leave 1..7 rows after the 8-row key blocks and
 * reach past the prefetch distance, segments mixing int8 and f32: every
 * ISA equals the portable path bit for bit. */
START_TEST(attn_int8_single_head_equals_scalar_on_every_isa)
{
    pd_rng rng = {.s = 0xa77e0003};
    static const uint32_t hds[] = {8, 16, 24, 40, 64, 72, 128, 136, 256};
    unsigned n_cfg = 0;
    for (unsigned h = 0; h < sizeof hds / sizeof hds[0]; h++)
        for (unsigned rep = 0; rep < 12; rep++, n_cfg++) {
            tcfg c = {.hd = hds[h], .nh = 1, .scale = 1.0f / sqrtf((float)hds[h])};
            const uint32_t kgs[] = {8, 16, 32, c.hd};
            c.kg = kgs[pd_rng_below(&rng, 4)];
            c.vg = c.hd; /* one scale per V row */
            c.n_segs = 1 + pd_rng_below(&rng, 3);
            for (uint32_t s = 0; s < c.n_segs; s++) {
                c.rows[s] = rep < 6 ? 1 + pd_rng_below(&rng, 16) : 33 + pd_rng_below(&rng, 60);
                c.kq[s] = s == 0 || pd_rng_below(&rng, 4) != 0;
                c.vq[s] = s == 0 || pd_rng_below(&rng, 4) != 0;
            }
            c.kcol = pd_rng_below(&rng, 2);
            c.vcol = pd_rng_below(&rng, 2);
            c.sinks = rep % 3 == 0;
            tkv t;
            tkv_make(&t, &c, &rng);
            uint32_t first = rep % 2 ? pd_rng_below(&rng, t.total) : 0;
            tres a = run(&t, PD_ISA_SCALAR, first, UINT32_MAX, NULL);
            for (int isa = PD_ISA_AVX2; isa < PD_ISA_COUNT; isa++) {
                tres b = run(&t, (pd_isa)isa, first, UINT32_MAX, NULL);
                REQUIRE(a.span == b.span && a.span > 0, "config %u: span %u vs %u", n_cfg, a.span, b.span);
                assert_same_bits("out", a.out, b.out, c.hd, n_cfg);
                assert_same_bits("probs", a.probs, b.probs, a.span, n_cfg);
                tres_free(&b);
            }
            tres_free(&a);
            tkv_free(&t);
        }
    pd_cpu_set_isa(pd_cpu_detect());
}
END_TEST

/* ---- against an f64 softmax attention ---- */

/* out[h][d] in double from the logical f32 rows; mag[h] = max over d of
 * sum_j p_j |v_j[d] vcol[d]| (the size of the terms that out[h][d] sums). */
static void ref_f64(const tkv *t, uint32_t first, uint32_t upto, double *out, double *probs,
                    double *mag)
{
    const tcfg *c = &t->c;
    const uint32_t hd = c->hd, span = upto - first;
    double *s = malloc(span * sizeof(double));
    for (uint32_t h = 0; h < c->nh; h++) {
        double mx = -INFINITY;
        for (uint32_t j = 0; j < span; j++) {
            const float *k = t->kf + (size_t)(first + j) * hd;
            double acc = 0.0;
            for (uint32_t d = 0; d < hd; d++) {
                double qc = (double)t->q[h * hd + d] * (t->kcol ? (double)t->kcol[d] : 1.0);
                acc += qc * (double)k[d];
            }
            acc *= (double)c->scale;
            if (c->softcap > 0.0f)
                acc = (double)c->softcap * tanh(acc / (double)c->softcap);
            s[j] = acc;
            mx = fmax(mx, acc);
        }
        if (t->sinks)
            mx = fmax(mx, (double)t->sinks[h]);
        double sum = 0.0;
        for (uint32_t j = 0; j < span; j++)
            sum += (s[j] = exp(s[j] - mx));
        if (t->sinks)
            sum += exp((double)t->sinks[h] - mx);
        mag[h] = 1e-30;
        for (uint32_t d = 0; d < hd; d++) {
            double acc = 0.0, m = 0.0;
            for (uint32_t j = 0; j < span; j++) {
                double term = s[j] / sum * (double)t->vf[(size_t)(first + j) * hd + d] *
                              (t->vcol ? (double)t->vcol[d] : 1.0);
                acc += term;
                m += fabs(term);
            }
            out[h * hd + d] = acc;
            mag[h] = fmax(mag[h], m);
        }
        for (uint32_t j = 0; j < span; j++)
            probs[(size_t)h * span + j] = s[j] / sum;
    }
    free(s);
}

/* Max error of attn_run against f64 over random configs of one flavour:
 * out relative to the head's term magnitude (see ref_f64), probs absolute. */
static void check_against_f64(uint64_t seed, int sinks, int softcap, double tol, const char *name)
{
    pd_rng rng = {.s = seed};
    double worst_out = 0.0, worst_p = 0.0;
    for (unsigned cfg = 0; cfg < 150; cfg++) {
        tcfg c = random_cfg(&rng);
        c.sinks = sinks;
        c.softcap = softcap ? pd_rng_uniform(&rng, 0.5f, 4.0f) : 0.0f;
        c.scale = 1.0f / sqrtf((float)c.hd);
        if (c.rows[0] == 0)
            c.rows[0] = 1 + pd_rng_below(&rng, 30);
        tkv t;
        tkv_make(&t, &c, &rng);
        uint32_t first = pd_rng_below(&rng, t.total), upto = first + 1 + pd_rng_below(&rng, t.total - first);
        double *ro = malloc((size_t)c.nh * c.hd * sizeof(double));
        double *rp = malloc((size_t)c.nh * (upto - first) * sizeof(double));
        double mag[8];
        ref_f64(&t, first, upto, ro, rp, mag);
        for (int isa = PD_ISA_SCALAR; isa < PD_ISA_COUNT; isa++) {
            tres a = run(&t, (pd_isa)isa, first, upto, NULL);
            REQUIRE(a.span == upto - first, "config %u: span", cfg);
            for (uint32_t h = 0; h < c.nh; h++)
                for (uint32_t d = 0; d < c.hd; d++) {
                    double e = fabs((double)a.out[h * c.hd + d] - ro[h * c.hd + d]) / mag[h];
                    worst_out = fmax(worst_out, e);
                }
            for (size_t i = 0; i < (size_t)c.nh * a.span; i++)
                worst_p = fmax(worst_p, fabs((double)a.probs[i] - rp[i]));
            tres_free(&a);
        }
        free(ro);
        free(rp);
        tkv_free(&t);
    }
    printf("attn vs f64 (%s): max rel err out %.3g, max abs err probs %.3g\n", name, worst_out, worst_p);
    ck_assert_msg(worst_out < tol, "%s: out error %g above %g", name, worst_out, tol);
    ck_assert_msg(worst_p < tol, "%s: probs error %g above %g", name, worst_p, tol);
    pd_cpu_set_isa(pd_cpu_detect());
}

START_TEST(attn_matches_f64_softmax_attention)
{
    check_against_f64(0xf640001, 0, 0, 1e-6, "plain");
}
END_TEST

START_TEST(attn_sink_joins_max_and_denominator_but_adds_no_value)
{
    check_against_f64(0xf640002, 1, 0, 1e-6, "sinks");
}
END_TEST

START_TEST(attn_softcap_matches_f64_tanh_cap)
{
    check_against_f64(0xf640003, 0, 1, 1e-6, "softcap");
}
END_TEST

/* A dominant sink takes mass but no value: probs sum to well below 1 and
 * out shrinks by the same factor. */
START_TEST(attn_large_sink_absorbs_probability_mass)
{
    pd_rng rng = {.s = 0x5111};
    tcfg c = {.hd = 16, .nh = 1, .kg = 16, .vg = 16, .n_segs = 1, .rows = {10}, .sinks = 1,
              .scale = 0.25f};
    tkv t;
    tkv_make(&t, &c, &rng);
    t.sinks[0] = 40.0f;
    for (int isa = PD_ISA_SCALAR; isa < PD_ISA_COUNT; isa++) {
        tres a = run(&t, (pd_isa)isa, 0, UINT32_MAX, NULL);
        double psum = 0.0;
        for (uint32_t j = 0; j < a.span; j++)
            psum += a.probs[j];
        ck_assert_double_lt(psum, 1e-9);
        ck_assert_double_gt(psum, 0.0);
        for (uint32_t d = 0; d < c.hd; d++)
            REQUIRE(fabsf(a.out[d]) < 1e-8f, "out[%u] = %g", d, (double)a.out[d]);
        tres_free(&a);
    }
    tkv_free(&t);
    pd_cpu_set_isa(pd_cpu_detect());
}
END_TEST

/* ---- structural properties (each for every ISA) ---- */

/* A view of t's rows [from, total) as new segments (pointer offsets). */
static attn_kv suffix_view(const tkv *t, uint32_t from, attn_seg *segs)
{
    uint32_t n = 0, r0 = 0;
    const uint32_t hd = t->c.hd;
    for (uint32_t s = 0; s < t->c.n_segs; r0 += t->segs[s].rows, s++) {
        attn_seg g = t->segs[s];
        if (r0 + g.rows <= from)
            continue;
        uint32_t skip = from > r0 ? from - r0 : 0;
        g.rows -= skip;
        if (g.k) g.k += (size_t)skip * hd;
        if (g.kq) g.kq += (size_t)skip * hd, g.ks += (size_t)skip * groups(hd, t->c.kg);
        if (g.v) g.v += (size_t)skip * hd;
        if (g.vq) g.vq += (size_t)skip * hd, g.vs += (size_t)skip * groups(hd, t->c.vg);
        segs[n++] = g;
    }
    attn_kv kv = t->kv;
    kv.segs = segs;
    kv.n_segs = n;
    return kv;
}

START_TEST(attn_window_equals_full_attend_without_earlier_rows)
{
    pd_rng rng = {.s = 0x3170};
    for (unsigned cfg = 0; cfg < 200; cfg++) {
        tcfg c = random_cfg(&rng);
        c.rows[0] += 2;
        tkv t;
        tkv_make(&t, &c, &rng);
        uint32_t first = 1 + pd_rng_below(&rng, t.total - 1);
        uint32_t upto = first + 1 + pd_rng_below(&rng, t.total - first);
        float *imp0 = malloc(t.total * sizeof(float));
        pd_rng_fill(&rng, imp0, t.total, 0.0f, 1.0f);
        for (int isa = PD_ISA_SCALAR; isa < PD_ISA_COUNT; isa++) {
            tres a = run(&t, (pd_isa)isa, first, upto, imp0);
            attn_seg segs[MAX_SEGS];
            tkv u = t;
            u.kv = suffix_view(&t, first, segs);
            u.total = t.total - first;
            tres b = run(&u, (pd_isa)isa, 0, upto - first, imp0 + first);
            REQUIRE(a.span == upto - first && b.span == a.span, "config %u: span", cfg);
            assert_same_bits("out", a.out, b.out, (size_t)c.nh * c.hd, cfg);
            assert_same_bits("probs", a.probs, b.probs, (size_t)c.nh * a.span, cfg);
            assert_same_bits("imp", a.imp + first, b.imp, u.total, cfg);
            assert_same_bits("imp before window", a.imp, imp0, first, cfg);
            tres_free(&a);
            tres_free(&b);
        }
        free(imp0);
        tkv_free(&t);
    }
    pd_cpu_set_isa(pd_cpu_detect());
}
END_TEST

/* One storage of N rows (f32 or int8 for K and V) cut into 1..4 segments at
 * random points: every split gives the bits of the single segment. */
START_TEST(attn_segment_split_gives_identical_bits)
{
    pd_rng rng = {.s = 0x5e6};
    for (unsigned cfg = 0; cfg < 200; cfg++) {
        tcfg c = random_cfg(&rng);
        c.n_segs = 1;
        c.rows[0] = 1 + pd_rng_below(&rng, 60);
        tkv t;
        tkv_make(&t, &c, &rng);
        uint32_t first = pd_rng_below(&rng, 3) ? 0 : pd_rng_below(&rng, t.total);
        for (int isa = PD_ISA_SCALAR; isa < PD_ISA_COUNT; isa++) {
            tres a = run(&t, (pd_isa)isa, first, UINT32_MAX, NULL);
            for (uint32_t parts = 2; parts <= MAX_SEGS; parts++) {
                uint32_t cut[MAX_SEGS + 1] = {0};
                for (uint32_t p = 1; p < parts; p++)
                    cut[p] = pd_rng_below(&rng, t.total + 1);
                cut[parts] = t.total;
                for (uint32_t p = 1; p < parts; p++) /* sort; empty segments allowed */
                    for (uint32_t q = p + 1; q < parts; q++)
                        if (cut[q] < cut[p]) {
                            uint32_t x = cut[p];
                            cut[p] = cut[q];
                            cut[q] = x;
                        }
                tkv u = t;
                for (uint32_t p = 0; p < parts; p++) {
                    attn_seg segs[MAX_SEGS];
                    attn_kv rest = suffix_view(&t, cut[p], segs);
                    u.segs[p] = rest.n_segs ? rest.segs[0] : (attn_seg){0};
                    u.segs[p].rows = cut[p + 1] - cut[p];
                }
                u.kv.segs = u.segs;
                u.kv.n_segs = parts;
                tres b = run(&u, (pd_isa)isa, first, UINT32_MAX, NULL);
                REQUIRE(a.span == b.span, "config %u: span %u vs %u", cfg, a.span, b.span);
                assert_same_bits("out", a.out, b.out, (size_t)c.nh * c.hd, cfg);
                assert_same_bits("probs", a.probs, b.probs, (size_t)c.nh * a.span, cfg);
                tres_free(&b);
            }
            tres_free(&a);
        }
        tkv_free(&t);
    }
    pd_cpu_set_isa(pd_cpu_detect());
}
END_TEST

/* int8 segments read exactly as the f32 rows that hold (float)q * scale. */
START_TEST(attn_int8_rows_equal_f32_rows_of_dequantized_values)
{
    pd_rng rng = {.s = 0x1e8};
    for (unsigned cfg = 0; cfg < 200; cfg++) {
        tcfg c = random_cfg(&rng);
        for (uint32_t s = 0; s < c.n_segs; s++)
            c.kq[s] = c.vq[s] = 1;
        tkv t;
        tkv_make(&t, &c, &rng);
        tkv u = t; /* same rows, stored as f32 from the mirror */
        uint32_t r0 = 0;
        for (uint32_t s = 0; s < c.n_segs; r0 += c.rows[s], s++)
            u.segs[s] = (attn_seg){.rows = c.rows[s], .k = t.kf + (size_t)r0 * c.hd,
                                   .v = t.vf + (size_t)r0 * c.hd};
        u.kv.segs = u.segs;
        for (int isa = PD_ISA_SCALAR; isa < PD_ISA_COUNT; isa++) {
            tres a = run(&t, (pd_isa)isa, 0, UINT32_MAX, NULL);
            tres b = run(&u, (pd_isa)isa, 0, UINT32_MAX, NULL);
            REQUIRE(a.span == b.span, "config %u: span %u vs %u", cfg, a.span, b.span);
            assert_same_bits("out", a.out, b.out, (size_t)c.nh * c.hd, cfg);
            assert_same_bits("probs", a.probs, b.probs, (size_t)c.nh * a.span, cfg);
            tres_free(&a);
            tres_free(&b);
        }
        tkv_free(&t);
    }
    pd_cpu_set_isa(pd_cpu_detect());
}
END_TEST

/* imp[r] becomes ((imp0[r] + p_0) + p_1) + ... over heads in order; rows
 * outside the window keep imp0. */
START_TEST(attn_importance_adds_probs_over_heads_in_order)
{
    pd_rng rng = {.s = 0x1111};
    for (unsigned cfg = 0; cfg < 150; cfg++) {
        tcfg c = random_cfg(&rng);
        c.rows[0] += 1;
        tkv t;
        tkv_make(&t, &c, &rng);
        uint32_t first = pd_rng_below(&rng, t.total);
        uint32_t upto = first + 1 + pd_rng_below(&rng, t.total - first);
        float *imp0 = malloc(t.total * sizeof(float));
        pd_rng_fill(&rng, imp0, t.total, 0.0f, 5.0f);
        for (int isa = PD_ISA_SCALAR; isa < PD_ISA_COUNT; isa++) {
            tres a = run(&t, (pd_isa)isa, first, upto, imp0);
            for (uint32_t r = 0; r < t.total; r++) {
                float want = imp0[r];
                if (r >= first && r < upto)
                    for (uint32_t h = 0; h < c.nh; h++)
                        want += a.probs[(size_t)h * a.span + (r - first)];
                REQUIRE(memcmp(&want, &a.imp[r], 4) == 0, "config %u row %u: %a vs %a", cfg,
                              r, (double)want, (double)a.imp[r]);
            }
            ck_assert_float_eq(a.imp[t.total], -7.0f);
            tres_free(&a);
        }
        free(imp0);
        tkv_free(&t);
    }
    pd_cpu_set_isa(pd_cpu_detect());
}
END_TEST

START_TEST(attn_empty_input_gives_zeros_and_touches_nothing)
{
    pd_rng rng = {.s = 0xe};
    for (int isa = PD_ISA_SCALAR; isa < PD_ISA_COUNT; isa++) {
        for (int variant = 0; variant < 3; variant++) {
            tcfg c = {.hd = 20, .nh = 3, .kg = 32, .vg = 20, .n_segs = variant == 0 ? 0 : 2,
                      .rows = {0, variant == 2 ? 5 : 0}, .scale = 0.2f};
            tkv t;
            tkv_make(&t, &c, &rng);
            float imp0[6] = {1, 2, 3, 4, 5, 6};
            uint32_t upto = variant == 2 ? 0 : UINT32_MAX;
            tres a = run(&t, (pd_isa)isa, 0, upto, imp0);
            ck_assert_uint_eq(a.span, 0);
            for (uint32_t i = 0; i < c.nh * c.hd; i++)
                REQUIRE(memcmp(&a.out[i], &(float){0.0f}, 4) == 0, "out[%u] = %a", i,
                              (double)a.out[i]);
            ck_assert_float_eq(a.probs[0], 1234.5f);
            for (uint32_t i = 0; i < t.total; i++)
                REQUIRE(a.imp[i] == imp0[i], "imp[%u] touched", i);
            tres_free(&a);
            tkv_free(&t);
        }
    }
    pd_cpu_set_isa(pd_cpu_detect());
}
END_TEST

/* first beyond upto is clamped to upto - 1: one visible row, p = 1 and the
 * output is that row's value exactly (times vcol). */
START_TEST(attn_first_past_upto_sees_exactly_the_last_row)
{
    pd_rng rng = {.s = 0x1a57};
    tcfg c = {.hd = 72, .nh = 2, .kg = 32, .vg = 72, .n_segs = 2, .rows = {5, 4}, .vq = {0, 1},
              .scale = 0.1f};
    tkv t;
    tkv_make(&t, &c, &rng);
    for (int isa = PD_ISA_SCALAR; isa < PD_ISA_COUNT; isa++) {
        tres a = run(&t, (pd_isa)isa, 100, 7, NULL);
        ck_assert_uint_eq(a.span, 1);
        for (uint32_t h = 0; h < c.nh; h++) {
            ck_assert_float_eq(a.probs[h], 1.0f);
            for (uint32_t d = 0; d < c.hd; d++)
                REQUIRE(a.out[h * c.hd + d] == t.vf[6 * c.hd + d], "head %u channel %u", h, d);
        }
        tres_free(&a);
    }
    tkv_free(&t);
    pd_cpu_set_isa(pd_cpu_detect());
}
END_TEST

/* A GQA group equals each of its heads attended alone. */
START_TEST(attn_grouped_heads_equal_heads_attended_alone)
{
    pd_rng rng = {.s = 0x6a};
    for (unsigned cfg = 0; cfg < 100; cfg++) {
        tcfg c = random_cfg(&rng);
        c.rows[0] += 1;
        if (c.nh < 2)
            c.nh = 2 + pd_rng_below(&rng, 7);
        tkv t;
        tkv_make(&t, &c, &rng);
        for (int isa = PD_ISA_SCALAR; isa < PD_ISA_COUNT; isa++) {
            tres a = run(&t, (pd_isa)isa, 0, UINT32_MAX, NULL);
            for (uint32_t h = 0; h < c.nh; h++) {
                tkv u = t;
                u.c.nh = 1;
                u.q = t.q + (size_t)h * c.hd;
                u.sinks = t.sinks ? t.sinks + h : NULL;
                tres b = run(&u, (pd_isa)isa, 0, UINT32_MAX, NULL);
                assert_same_bits("out", a.out + (size_t)h * c.hd, b.out, c.hd, cfg);
                assert_same_bits("probs", a.probs + (size_t)h * a.span, b.probs, a.span, cfg);
                tres_free(&b);
            }
            tres_free(&a);
        }
        tkv_free(&t);
    }
    pd_cpu_set_isa(pd_cpu_detect());
}
END_TEST

START_TEST(attn_dot8_follows_the_eight_lane_order)
{
    /* values chosen so that any other summation order rounds differently */
    float a[20], b[20];
    for (int d = 0; d < 20; d++) {
        a[d] = 1.0f;
        b[d] = 0.0f;
    }
    b[0] = 16777216.0f;  /* lane 0: 2^24 */
    b[2] = -16777216.0f; /* lane 2 */
    b[4] = 1.0f;         /* lane 4: l0 + l4 = 2^24 + 1 ties to even 2^24 first */
    ck_assert_float_eq(attn_dot8(a, b, 20), 0.0f); /* a sum in channel order gives 1 */
    b[12] = 1.0f; /* lane 4 again: l4 = 2 and 2^24 + 2 is exact */
    ck_assert_float_eq(attn_dot8(a, b, 20), 2.0f);
    b[19] = 5.0f; /* lane 3, channel 19: beyond n = 19 it is ignored */
    ck_assert_float_eq(attn_dot8(a, b, 19), 2.0f);
    ck_assert_float_eq(attn_dot8(a, b, 20), 7.0f);
}
END_TEST

/* ---- pd_expf ---- */

static uint32_t fbits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bitsf(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

START_TEST(expf_avx2_twin_equals_scalar_on_millions_of_inputs)
{
    const size_t n = (size_t)6 << 20;
    float *x = malloc(n * sizeof(float)), *ys = malloc(n * sizeof(float)),
          *yv = malloc(n * sizeof(float));
    ck_assert(x && ys && yv);
    pd_rng rng = {.s = 0xe8f};
    size_t i = 0;
    for (; i < n / 2; i++) /* uniform over [-100, 100] */
        x[i] = pd_rng_uniform(&rng, -100.0f, 100.0f);
    /* consecutive floats around every edge: 0, -87, ln(FLT_MAX), n = 128 start */
    const float edges[] = {0.0f, -87.0f, 88.72283935546875f, 88.0296f, -1e-30f, 1.0f, -0.34657359f};
    for (size_t e = 0; e < sizeof edges / sizeof edges[0]; e++)
        for (int k = -20000; k < 20000; k++) {
            float v = bitsf(fbits(edges[e]) + (uint32_t)k);
            x[i++] = isnan(v) ? 0.0f : v;
        }
    const float specials[] = {INFINITY, -INFINITY, NAN, -NAN, bitsf(0x7fc12345u), bitsf(0xffa00001u),
                              0.0f, -0.0f, 3.4028235e38f, -3.4028235e38f, 1e-45f, -1e-45f,
                              88.5f, 88.7228394f, 88.7228470f, -87.0000076f, -86.9999924f};
    for (size_t e = 0; e < sizeof specials / sizeof specials[0]; e++)
        x[i++] = specials[e];
    for (; i < n; i++) /* random bit patterns: every exponent */
        x[i] = bitsf((uint32_t)pd_rng_next(&rng));
    for (size_t j = 0; j < n; j++)
        ys[j] = pd_expf(x[j]);
    /* the AVX2 twin, which AVX-512 CPUs run too (without AVX2: scalar) */
    pd_isa want = pd_cpu_detect() < PD_ISA_AVX2 ? pd_cpu_detect() : PD_ISA_AVX2;
    ck_assert_int_eq(pd_cpu_set_isa(PD_ISA_AVX2), want);
    pd_expf_n(x, yv, n);
    size_t bad = 0;
    for (size_t j = 0; j < n; j++)
        if (fbits(ys[j]) != fbits(yv[j]) && bad++ < 5)
            printf("expf twin differs at x=%a: %a vs %a\n", (double)x[j], (double)ys[j], (double)yv[j]);
    ck_assert_uint_eq(bad, 0);
    pd_cpu_set_isa(PD_ISA_SCALAR);
    pd_expf_n(x, yv, n);
    ck_assert_int_eq(memcmp(ys, yv, n * sizeof(float)), 0);
    /* in place */
    pd_cpu_set_isa(pd_cpu_detect());
    pd_expf_n(x, x, n);
    ck_assert_int_eq(memcmp(ys, x, n * sizeof(float)), 0);
    free(x);
    free(ys);
    free(yv);
}
END_TEST

START_TEST(expf_is_within_two_ulp_of_exp)
{
    pd_rng rng = {.s = 0xacc};
    double worst = 0.0;
    float worst_x = 0.0f;
    for (int i = 0; i < 2000000; i++) {
        float x = pd_rng_uniform(&rng, -87.0f, 88.72f);
        double want = exp((double)x);
        float got = pd_expf(x);
        int e;
        frexp(want, &e);
        double ulp = ldexp(1.0, e - 24);
        double err = fabs((double)got - want) / ulp;
        if (err > worst)
            worst = err, worst_x = x;
    }
    printf("pd_expf: max error %.3f ulp (at x = %.9g) on [-87, 88.72]\n", worst, (double)worst_x);
    ck_assert_double_le(worst, 2.0);
}
END_TEST

START_TEST(expf_specials_and_range_ends)
{
    ck_assert_float_eq(pd_expf(0.0f), 1.0f);
    ck_assert_float_eq(pd_expf(-0.0f), 1.0f);
    ck_assert_float_eq(pd_expf(-INFINITY), 0.0f);
    ck_assert_float_eq(pd_expf(-87.5f), 0.0f);
    ck_assert(isinf(pd_expf(INFINITY)) && pd_expf(INFINITY) > 0);
    ck_assert(isinf(pd_expf(88.75f)));
    float big = pd_expf(88.5f); /* n = 128: must not overflow early */
    ck_assert(isfinite(big));
    ck_assert_double_lt(fabs((double)big / exp(88.5) - 1.0), 1e-6);
    float nan_in = bitsf(0x7fc12345u);
    ck_assert_uint_eq(fbits(pd_expf(nan_in)), 0x7fc12345u);
    ck_assert_float_gt(pd_expf(-86.9f), 0.0f);
}
END_TEST

/* The public attn_dot8 dispatches to the ISA path; both give the scalar
 * reference's bits for every length (row-local kernels such as RMSNorm use it). */
START_TEST(attn_dot8_dispatch_equals_scalar_reference)
{
    pd_rng g = {.s = 314};
    float a[300], b[300];
    for (uint32_t n = 0; n <= 300; n++) {
        pd_rng_fill(&g, a, n, -3, 3);
        pd_rng_fill(&g, b, n, -3, 3);
        float x = attn_dot8(a, b, n), y = attn_dot8_scalar(a, b, n);
        if (memcmp(&x, &y, sizeof x) != 0)
            ck_abort_msg("n = %u: %a vs %a", n, (double)x, (double)y);
    }
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("attn");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, attn_avx2_equals_scalar_bit_for_bit_on_random_configs);
    tcase_add_test(tc, attn_avx2_equals_scalar_on_extreme_values);
    tcase_add_test(tc, attn_int8_single_head_equals_scalar_on_every_isa);
    tcase_add_test(tc, attn_matches_f64_softmax_attention);
    tcase_add_test(tc, attn_sink_joins_max_and_denominator_but_adds_no_value);
    tcase_add_test(tc, attn_softcap_matches_f64_tanh_cap);
    tcase_add_test(tc, attn_large_sink_absorbs_probability_mass);
    tcase_add_test(tc, attn_window_equals_full_attend_without_earlier_rows);
    tcase_add_test(tc, attn_segment_split_gives_identical_bits);
    tcase_add_test(tc, attn_int8_rows_equal_f32_rows_of_dequantized_values);
    tcase_add_test(tc, attn_importance_adds_probs_over_heads_in_order);
    tcase_add_test(tc, attn_empty_input_gives_zeros_and_touches_nothing);
    tcase_add_test(tc, attn_first_past_upto_sees_exactly_the_last_row);
    tcase_add_test(tc, attn_grouped_heads_equal_heads_attended_alone);
    tcase_add_test(tc, attn_dot8_follows_the_eight_lane_order);
    tcase_add_test(tc, attn_dot8_dispatch_equals_scalar_reference);
    tcase_add_test(tc, expf_avx2_twin_equals_scalar_on_millions_of_inputs);
    tcase_add_test(tc, expf_is_within_two_ulp_of_exp);
    tcase_add_test(tc, expf_specials_and_range_ends);
    suite_add_tcase(s, tc);
    return s;
}
