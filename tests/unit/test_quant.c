/* quant: grouped q8 rows (per-group scales, optional per-channel field,
 * round half away from zero) and symmetric per-row int8 (ties to even)
 * reconstruct every element within half a scale step and never leave
 * [-127, 127]. */
#include "pd_test.h"

#include "cache/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond, ...)                \
    do {                                  \
        if (!(cond))                      \
            ck_abort_msg(__VA_ARGS__);    \
    } while (0)

#define MAXN 256

START_TEST(quant_groups_counts_partial_groups)
{
    ck_assert_uint_eq(quant_groups(128, 32), 4);
    ck_assert_uint_eq(quant_groups(72, 32), 3);
    ck_assert_uint_eq(quant_groups(20, 32), 1);
    ck_assert_uint_eq(quant_groups(128, 128), 1);
    ck_assert_uint_eq(quant_groups(1, 1), 1);
    ck_assert_uint_eq(quant_groups(0, 32), 0);
    ck_assert_uint_eq(quant_groups(10, 0), 0);
}
END_TEST

/* Random rows of assorted lengths and groups, with and without a field:
 * scales are the group absmax / 127 (of row / col), the absmax element maps
 * to +-127, every element is within half a step after dequantization. */
START_TEST(quant_q8_reconstructs_within_half_a_scale_step)
{
    pd_rng rng = {.s = 0x98};
    const uint32_t ns[] = {1, 20, 32, 64, 72, 128, 256};
    const uint32_t gs[] = {32, 8, 5, 0 /* = n */};
    float row[MAXN], col[MAXN], out[MAXN], scales[MAXN];
    int8_t q[MAXN];
    double worst = 0.0;
    for (int it = 0; it < 4000; it++) {
        uint32_t n = ns[pd_rng_below(&rng, 7)];
        uint32_t group = gs[pd_rng_below(&rng, 4)];
        if (group == 0)
            group = n;
        float mag = powf(10.0f, pd_rng_uniform(&rng, -6.0f, 6.0f));
        pd_rng_fill(&rng, row, n, -mag, mag);
        int with_col = it % 2;
        pd_rng_fill(&rng, col, n, 0.1f, 4.0f);
        const float *c = with_col ? col : NULL;
        quant_q8_row(row, c, n, group, q, scales);
        quant_q8_row_dequant(q, scales, c, n, group, out);
        for (uint32_t g = 0; g < quant_groups(n, group); g++) {
            uint32_t g0 = g * group, g1 = g0 + group < n ? g0 + group : n;
            float absmax = 0.0f;
            uint32_t arg = g0;
            for (uint32_t d = g0; d < g1; d++) {
                float r = c ? row[d] / c[d] : row[d];
                if (fabsf(r) > absmax)
                    absmax = fabsf(r), arg = d;
            }
            float s = fmaxf(absmax / 127.0f, 1e-12f);
            REQUIRE(scales[g] == s, "it %d group %u: scale %g want %g", it, g, (double)scales[g], (double)s);
            REQUIRE(abs(q[arg]) == 127, "it %d: absmax element -> %d", it, q[arg]);
            for (uint32_t d = g0; d < g1; d++) {
                REQUIRE(q[d] >= -127 && q[d] <= 127, "it %d: q[%u] = %d", it, d, q[d]);
                /* |x/col - q*s| <= s/2, with a few ulp of float slack */
                double x = c ? (double)row[d] / c[d] : (double)row[d];
                double err = fabs(x - (double)q[d] * s) / s;
                worst = fmax(worst, err);
                REQUIRE(err <= 0.5 + 1e-4, "it %d: element %u off by %g steps", it, d, err);
                double back = fabs((double)out[d] - row[d]);
                REQUIRE(back <= (0.5 + 1e-4) * s * (c ? c[d] : 1.0f),
                        "it %d: dequantized %u: %g vs %g", it, d, (double)out[d], (double)row[d]);
            }
        }
    }
    ck_assert_double_le(worst, 0.5 + 1e-4);
    ck_assert_double_gt(worst, 0.45); /* the bound is reached, so it is the real one */
}
END_TEST

/* The per-channel field: quantizing row with col equals quantizing row / col
 * without it, and dequantization multiplies col back in. */
START_TEST(quant_q8_col_field_divides_before_quantizing)
{
    pd_rng rng = {.s = 0xc01};
    float row[72], col[72], div[72], out[72], s1[3], s2[3];
    int8_t q1[72], q2[72];
    for (int it = 0; it < 200; it++) {
        pd_rng_fill(&rng, row, 72, -3.0f, 3.0f);
        pd_rng_fill(&rng, col, 72, 0.05f, 8.0f);
        for (int d = 0; d < 72; d++)
            div[d] = row[d] / col[d];
        quant_q8_row(row, col, 72, 32, q1, s1);
        quant_q8_row(div, NULL, 72, 32, q2, s2);
        REQUIRE(memcmp(q1, q2, 72) == 0 && memcmp(s1, s2, sizeof s1) == 0, "it %d", it);
        quant_q8_row_dequant(q1, s1, col, 72, 32, out);
        for (int d = 0; d < 72; d++)
            REQUIRE(out[d] == (float)q1[d] * s1[d / 32] * col[d], "it %d channel %d", it, d);
    }
    /* a large field entry shrinks its channel's share of the group */
    float one[4] = {1.0f, 1.0f, 1.0f, 1.0f}, big[4] = {1.0f, 1.0f, 1.0f, 100.0f};
    int8_t q[4];
    float s;
    quant_q8_row(one, big, 4, 4, q, &s);
    ck_assert_int_eq(q[0], 127);
    ck_assert_int_eq(q[3], 1); /* 0.01 / (1/127) = 1.27 -> 1 */
}
END_TEST

/* Dequantized values are exactly (float)q * scale (what attn reads). */
START_TEST(quant_q8_dequant_is_one_product_per_element)
{
    pd_rng rng = {.s = 0xde9};
    int8_t q[128];
    float sc[4], out[128];
    for (int it = 0; it < 100; it++) {
        for (int d = 0; d < 128; d++)
            q[d] = (int8_t)((int)pd_rng_below(&rng, 255) - 127);
        pd_rng_fill(&rng, sc, 4, 1e-4f, 1.0f);
        quant_q8_row_dequant(q, sc, NULL, 128, 32, out);
        for (int d = 0; d < 128; d++) {
            float want = (float)q[d] * sc[d / 32];
            REQUIRE(memcmp(&want, &out[d], 4) == 0, "it %d channel %d", it, d);
        }
    }
}
END_TEST

/* Grouped rows round half away from zero; symmetric rows round ties to even. */
START_TEST(quant_rounding_modes_differ_on_ties)
{
    /* absmax 127 gives scale exactly 1, so x / s = x */
    float row[8] = {127.0f, 2.5f, 3.5f, -2.5f, 0.5f, -0.5f, 1.5f, -127.0f};
    int8_t q[8];
    float s;
    quant_q8_row(row, NULL, 8, 8, q, &s);
    ck_assert_float_eq(s, 1.0f);
    const int8_t away[8] = {127, 3, 4, -3, 1, -1, 2, -127};
    for (int d = 0; d < 8; d++)
        ck_assert_int_eq(q[d], away[d]);
    s = quant_sym_row(row, 8, q);
    ck_assert_float_eq(s, 1.0f);
    const int8_t even[8] = {127, 2, 4, -2, 0, 0, 2, -127};
    for (int d = 0; d < 8; d++)
        ck_assert_int_eq(q[d], even[d]);
}
END_TEST

START_TEST(quant_zero_row_gets_floor_or_unit_scale_and_zero_codes)
{
    float row[40] = {0}, out[40], sc[2];
    int8_t q[40];
    row[3] = -0.0f;
    memset(q, 0x55, sizeof q);
    quant_q8_row(row, NULL, 40, 32, q, sc);
    ck_assert_float_eq(sc[0], 1e-12f);
    ck_assert_float_eq(sc[1], 1e-12f);
    for (int d = 0; d < 40; d++)
        ck_assert_int_eq(q[d], 0);
    quant_q8_row_dequant(q, sc, NULL, 40, 32, out);
    for (int d = 0; d < 40; d++)
        ck_assert_float_eq(out[d], 0.0f);
    memset(q, 0x55, sizeof q);
    ck_assert_float_eq(quant_sym_row(row, 40, q), 1.0f);
    for (int d = 0; d < 40; d++)
        ck_assert_int_eq(q[d], 0);
    /* one zero group beside a live one keeps its own floor scale */
    row[35] = 2.0f;
    quant_q8_row(row, NULL, 40, 32, q, sc);
    ck_assert_float_eq(sc[0], 1e-12f);
    ck_assert_float_eq(sc[1], 2.0f / 127.0f);
    ck_assert_int_eq(q[35], 127);
}
END_TEST

START_TEST(quant_sym_row_scale_is_absmax_over_127_and_codes_stay_in_range)
{
    pd_rng rng = {.s = 0x5e};
    float row[128];
    int8_t q[128];
    double worst = 0.0;
    for (int it = 0; it < 3000; it++) {
        uint32_t n = 1 + pd_rng_below(&rng, 128);
        float mag = powf(10.0f, pd_rng_uniform(&rng, -30.0f, 30.0f));
        pd_rng_fill(&rng, row, n, -mag, mag);
        float absmax = 0.0f;
        for (uint32_t d = 0; d < n; d++)
            absmax = fmaxf(absmax, fabsf(row[d]));
        float s = quant_sym_row(row, n, q);
        REQUIRE(s == absmax / 127.0f, "it %d: scale %g", it, (double)s);
        int saw127 = 0;
        for (uint32_t d = 0; d < n; d++) {
            REQUIRE(q[d] >= -127 && q[d] <= 127, "it %d: q = %d", it, q[d]);
            saw127 |= abs(q[d]) == 127;
            double err = fabs((double)row[d] - (double)q[d] * s) / s;
            worst = fmax(worst, err);
            REQUIRE(err <= 0.5 + 1e-4, "it %d: element %u off by %g steps", it, d, err);
        }
        REQUIRE(saw127, "it %d: no code reached 127", it);
    }
    ck_assert_double_gt(worst, 0.45);
}
END_TEST

START_TEST(quant_nan_element_codes_as_zero_and_spares_its_group)
{
    float row[8] = {2.5f, NAN, -127.0f, 0.5f, 0, 0, 0, 0}; /* absmax 127: scale 1 */
    int8_t q[8];
    float s;
    quant_q8_row(row, NULL, 8, 8, q, &s);
    ck_assert_float_eq(s, 1.0f);
    ck_assert_int_eq(q[0], 3);
    ck_assert_int_eq(q[1], 0);
    ck_assert_int_eq(q[2], -127);
    s = quant_sym_row(row, 8, q);
    ck_assert_float_eq(s, 1.0f);
    ck_assert_int_eq(q[0], 2);
    ck_assert_int_eq(q[1], 0);
    ck_assert_int_eq(q[2], -127);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("quant");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, quant_groups_counts_partial_groups);
    tcase_add_test(tc, quant_q8_reconstructs_within_half_a_scale_step);
    tcase_add_test(tc, quant_q8_col_field_divides_before_quantizing);
    tcase_add_test(tc, quant_q8_dequant_is_one_product_per_element);
    tcase_add_test(tc, quant_rounding_modes_differ_on_ties);
    tcase_add_test(tc, quant_zero_row_gets_floor_or_unit_scale_and_zero_codes);
    tcase_add_test(tc, quant_sym_row_scale_is_absmax_over_127_and_codes_stay_in_range);
    tcase_add_test(tc, quant_nan_element_codes_as_zero_and_spares_its_group);
    suite_add_tcase(s, tc);
    return s;
}
