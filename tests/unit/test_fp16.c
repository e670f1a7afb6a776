/* fp16: f16 and bf16 conversions round to nearest even, keep infinities,
 * signed zeros and subnormals, keep NaN a NaN, and the F16C bulk paths give
 * the scalar bits for every input. */
#include "pd_test.h"

#include "base/cpu.h"
#include "base/fp16.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Check records every passing ck_assert (a write per call in fork mode), so
 * loops over millions of values assert only on failure. */
#define REQUIRE(cond, ...)                \
    do {                                  \
        if (!(cond))                      \
            ck_abort_msg(__VA_ARGS__);    \
    } while (0)

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

static int f16_is_nan(uint16_t h)
{
    return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
}

/* The exact value of an f16 bit pattern (not NaN), computed independently. */
static double f16_value(uint16_t h)
{
    int e = (h >> 10) & 0x1f, m = h & 0x3ff;
    double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
    return h & 0x8000 ? -v : v;
}

START_TEST(fp16_every_f16_pattern_round_trips_through_f32)
{
    for (uint32_t i = 0; i < 65536; i++) {
        uint16_t h = (uint16_t)i;
        float f = pd_f16_to_f32(h);
        if (f16_is_nan(h)) {
            REQUIRE(isnan(f), "0x%04x -> %a is not NaN", i, (double)f);
            REQUIRE(f16_is_nan(pd_f32_to_f16(f)), "0x%04x: NaN lost on the way back", i);
            REQUIRE(fbits(f) >> 31 == i >> 15, "0x%04x: NaN sign", i);
            if (h & 0x200u) /* a quiet NaN comes back with its payload */
                REQUIRE(pd_f32_to_f16(f) == h, "0x%04x: quiet NaN payload", i);
            continue;
        }
        REQUIRE((double)f == f16_value(h), "0x%04x -> %a, want %a", i, (double)f, f16_value(h));
        REQUIRE((signbit(f) != 0) == ((i >> 15) != 0), "0x%04x: sign", i);
        REQUIRE(pd_f32_to_f16(f) == h, "0x%04x -> %a -> 0x%04x", i, (double)f, pd_f32_to_f16(f));
    }
}
END_TEST

/* Reference f32 -> f16 from the f16 values alone: the two finite neighbours
 * of |x| (positive patterns are ordered like their values), the nearer one,
 * ties to the even pattern, and inf from 65520 (the tie above 65504) on. */
static uint16_t f16_ref(float x)
{
    if (isnan(x))
        return 0x7e00;
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs((double)x);
    if (a >= 65520.0)
        return sign | 0x7c00;
    uint32_t lo = 0, hi = 0x7bff; /* largest m with f16_value(m) <= a */
    while (lo < hi) {
        uint32_t mid = (lo + hi + 1) / 2;
        if (f16_value((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    if (lo == 0x7bff)
        return sign | 0x7bff;
    double dl = a - f16_value((uint16_t)lo), dh = f16_value((uint16_t)(lo + 1)) - a;
    uint32_t m = dl < dh || (dl == dh && (lo & 1u) == 0) ? lo : lo + 1;
    return (uint16_t)(sign | m);
}

START_TEST(fp16_f32_to_f16_rounds_to_nearest_even)
{
    /* every tie between neighbouring f16 values (normal and subnormal), and
     * just either side of it */
    for (uint32_t m = 0; m < 0x7bff; m += 37) {
        double mid = (f16_value((uint16_t)m) + f16_value((uint16_t)(m + 1))) / 2.0;
        float x = (float)mid; /* exact: needs at most 12 significant bits */
        REQUIRE((double)x == mid, "tie %a not exact", mid);
        uint16_t want = (m & 1u) ? (uint16_t)(m + 1) : (uint16_t)m;
        REQUIRE(pd_f32_to_f16(x) == want, "tie %a -> 0x%04x want 0x%04x", mid, pd_f32_to_f16(x), want);
        REQUIRE(pd_f32_to_f16(-x) == (want | 0x8000u), "tie -%a", mid);
        REQUIRE(pd_f32_to_f16(nextafterf(x, 0.0f)) == m, "below tie %a", mid);
        REQUIRE(pd_f32_to_f16(nextafterf(x, INFINITY)) == m + 1, "above tie %a", mid);
    }
    /* overflow: 65504 is the largest half; 65520 is the tie to 65536 = inf */
    ck_assert_uint_eq(pd_f32_to_f16(65504.0f), 0x7bffu);
    ck_assert_uint_eq(pd_f32_to_f16(nextafterf(65520.0f, 0.0f)), 0x7bffu);
    ck_assert_uint_eq(pd_f32_to_f16(65520.0f), 0x7c00u);
    ck_assert_uint_eq(pd_f32_to_f16(-1e30f), 0xfc00u);
    ck_assert_uint_eq(pd_f32_to_f16(INFINITY), 0x7c00u);
    /* signed zero and underflow */
    ck_assert_uint_eq(pd_f32_to_f16(0.0f), 0x0000u);
    ck_assert_uint_eq(pd_f32_to_f16(-0.0f), 0x8000u);
    ck_assert_uint_eq(pd_f32_to_f16(0x1p-25f), 0x0000u);             /* tie to even 0 */
    ck_assert_uint_eq(pd_f32_to_f16(nextafterf(0x1p-25f, 1.0f)), 1u); /* above the tie */
    ck_assert_uint_eq(pd_f32_to_f16(-0x1p-26f), 0x8000u);
    ck_assert_uint_eq(pd_f32_to_f16(0x1.8p-24f), 2u); /* 1.5 x smallest: tie to even 2 */
    ck_assert(isnan(pd_f16_to_f32(pd_f32_to_f16(NAN))));
    /* random inputs against the exhaustive reference */
    pd_rng rng = {.s = 0xf16};
    for (int i = 0; i < 300000; i++) {
        float x = bitsf((uint32_t)pd_rng_next(&rng));
        if (i % 2)
            x = pd_rng_uniform(&rng, -70000.0f, 70000.0f) * (i % 3 ? 1.0f : 1e-5f);
        if (isnan(x))
            continue;
        REQUIRE(pd_f32_to_f16(x) == f16_ref(x), "%a -> 0x%04x want 0x%04x", (double)x,
                      pd_f32_to_f16(x), f16_ref(x));
    }
}
END_TEST

/* Inputs that stress the scalar/F16C agreement, then random bit patterns. */
static size_t fill_f32_cases(float *x, size_t n, pd_rng *rng)
{
    size_t i = 0;
    for (uint32_t m = 0; m < 0x7bff && i + 4 <= n; m++) { /* every tie and its neighbours */
        double mid = (f16_value((uint16_t)m) + f16_value((uint16_t)(m + 1))) / 2.0;
        x[i++] = (float)mid;
        x[i++] = -(float)mid;
        x[i++] = nextafterf((float)mid, 0.0f);
        x[i++] = nextafterf((float)mid, INFINITY);
    }
    const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN, bitsf(0x7f800001u),
                              bitsf(0xffbfffffu), bitsf(0x7fc00123u), 65504.0f, 65520.0f,
                              nextafterf(65520.0f, 0.0f), 1e-45f, 0x1p-24f, 0x1p-25f, 0x1p-14f,
                              nextafterf(0x1p-14f, 0.0f), 3.4e38f};
    for (size_t s = 0; s < sizeof specials / sizeof specials[0]; s++)
        x[i++] = specials[s];
    for (; i < n; i++) /* random patterns, half of them in the f16 range */
        x[i] = i % 2 ? bitsf((uint32_t)pd_rng_next(rng))
                     : bitsf(0x33000000u + (uint32_t)(pd_rng_next(rng) % (0x47800000u - 0x33000000u))) *
                           (i % 4 ? 1.0f : -1.0f);
    return i;
}

START_TEST(fp16_f16c_bulk_f32_to_f16_equals_scalar)
{
    const size_t n = (size_t)3 << 20;
    float *x = malloc(n * sizeof(float));
    uint16_t *a = malloc(n * 2), *b = malloc(n * 2);
    ck_assert(x && a && b);
    pd_rng rng = {.s = 0xf16c};
    fill_f32_cases(x, n, &rng);
    for (size_t i = 0; i < n; i++)
        a[i] = pd_f32_to_f16(x[i]);
    if (pd_cpu_set_isa(PD_ISA_AVX2) != PD_ISA_AVX2)
        printf("fp16: no AVX2/F16C on this CPU, bulk path compared with itself\n");
    /* odd lengths and offsets exercise the tails */
    size_t cuts[] = {0, 1, 7, 9, n - 5};
    for (size_t c = 0; c < sizeof cuts / sizeof cuts[0]; c++) {
        memset(b, 0xaa, n * 2);
        pd_f32_to_f16_n(x + cuts[c], b + cuts[c], n - cuts[c]);
        size_t i = cuts[c];
        while (i < n && a[i] == b[i])
            i++;
        ck_assert_msg(i == n, "x=%a (0x%08x): scalar 0x%04x bulk 0x%04x", (double)x[i % n],
                      fbits(x[i % n]), a[i % n], b[i % n]);
        for (i = 0; i < cuts[c]; i++)
            REQUIRE(b[i] == 0xaaaau, "bulk wrote before its start at %zu", i);
    }
    pd_cpu_set_isa(PD_ISA_SCALAR);
    pd_f32_to_f16_n(x, b, n);
    ck_assert_int_eq(memcmp(a, b, n * 2), 0);
    pd_cpu_set_isa(pd_cpu_detect());
    free(x);
    free(a);
    free(b);
}
END_TEST

START_TEST(fp16_f16c_bulk_f16_to_f32_equals_scalar_for_every_pattern)
{
    uint16_t *h = malloc(65536 * 2 + 2);
    float *a = malloc(65537 * 4), *b = malloc(65537 * 4);
    ck_assert(h && a && b);
    for (uint32_t i = 0; i < 65536; i++)
        h[i] = (uint16_t)i;
    h[65536] = 0x3c00;
    for (uint32_t i = 0; i < 65537; i++)
        a[i] = pd_f16_to_f32(h[i]);
    for (int isa = PD_ISA_SCALAR; isa < PD_ISA_COUNT; isa++) {
        pd_cpu_set_isa((pd_isa)isa);
        for (size_t off = 0; off < 3; off++) {
            memset(b, 0, 65537 * 4);
            pd_f16_to_f32_n(h + off, b + off, 65537 - off);
            for (uint32_t i = (uint32_t)off; i < 65537; i++)
                REQUIRE(fbits(a[i]) == fbits(b[i]), "isa %d: 0x%04x -> 0x%08x vs 0x%08x", isa,
                              h[i], fbits(a[i]), fbits(b[i]));
        }
    }
    pd_cpu_set_isa(pd_cpu_detect());
    free(h);
    free(a);
    free(b);
}
END_TEST

START_TEST(fp16_bf16_rounds_to_nearest_even_and_keeps_specials)
{
    ck_assert_uint_eq(pd_f32_to_bf16(bitsf(0x3f808000u)), 0x3f80u); /* tie, even below */
    ck_assert_uint_eq(pd_f32_to_bf16(bitsf(0x3f818000u)), 0x3f82u); /* tie, odd: up */
    ck_assert_uint_eq(pd_f32_to_bf16(bitsf(0x3f808001u)), 0x3f81u); /* above the tie */
    ck_assert_uint_eq(pd_f32_to_bf16(bitsf(0x3f817fffu)), 0x3f81u); /* below the tie */
    ck_assert_uint_eq(pd_f32_to_bf16(bitsf(0xbf818000u)), 0xbf82u); /* negative tie */
    ck_assert_uint_eq(pd_f32_to_bf16(-0.0f), 0x8000u);
    ck_assert_uint_eq(pd_f32_to_bf16(INFINITY), 0x7f80u);
    ck_assert_uint_eq(pd_f32_to_bf16(bitsf(0x7f7fffffu)), 0x7f80u); /* FLT_MAX rounds to inf */
    ck_assert_uint_eq(pd_f32_to_bf16(bitsf(0x00008000u)), 0x0000u); /* subnormal tie to even */
    ck_assert_uint_eq(pd_f32_to_bf16(bitsf(0x00018000u)), 0x0002u);
    uint16_t qn = pd_f32_to_bf16(bitsf(0x7f800001u)); /* NaN whose payload sits in the low bits */
    ck_assert(isnan(pd_bf16_to_f32(qn)));
    ck_assert_uint_eq(pd_f32_to_bf16(bitsf(0xffc12345u)) & 0xffc0u, 0xffc0u);
    /* every bf16 pattern round-trips; every f32 lands on a nearest neighbour */
    for (uint32_t i = 0; i < 65536; i++) {
        float f = pd_bf16_to_f32((uint16_t)i);
        REQUIRE(fbits(f) == i << 16, "bf16 0x%04x", i);
        if (!isnan(f))
            REQUIRE(pd_f32_to_bf16(f) == i, "bf16 0x%04x round trip", i);
    }
    pd_rng rng = {.s = 0xbf16};
    for (int i = 0; i < 1000000; i++) {
        uint32_t u = (uint32_t)pd_rng_next(&rng);
        float x = bitsf(u);
        if (isnan(x) || isinf(x))
            continue;
        uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
        /* the pattern after the largest finite one is inf, worth 2^128 for rounding */
        double vhi = (hi & 0x7fffffffu) == 0x7f800000u ? copysign(0x1p128, x) : (double)bitsf(hi);
        double dl = fabs((double)bitsf(lo) - x), dh = fabs(vhi - x);
        uint16_t want = (uint16_t)((dl < dh || (dl == dh && ((lo >> 16) & 1u) == 0)) ? lo >> 16 : hi >> 16);
        REQUIRE(pd_f32_to_bf16(x) == want, "0x%08x -> 0x%04x want 0x%04x", u, pd_f32_to_bf16(x), want);
    }
    /* bulk == scalar */
    uint16_t h[37];
    float a[37];
    for (int i = 0; i < 37; i++)
        h[i] = (uint16_t)pd_rng_next(&rng);
    pd_bf16_to_f32_n(h, a, 37);
    for (int i = 0; i < 37; i++)
        REQUIRE(fbits(a[i]) == fbits(pd_bf16_to_f32(h[i])), "bf16 bulk %d", i);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("fp16");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, fp16_every_f16_pattern_round_trips_through_f32);
    tcase_add_test(tc, fp16_f32_to_f16_rounds_to_nearest_even);
    tcase_add_test(tc, fp16_f16c_bulk_f32_to_f16_equals_scalar);
    tcase_add_test(tc, fp16_f16c_bulk_f16_to_f32_equals_scalar_for_every_pattern);
    tcase_add_test(tc, fp16_bf16_rounds_to_nearest_even_and_keeps_specials);
    suite_add_tcase(s, tc);
    return s;
}
