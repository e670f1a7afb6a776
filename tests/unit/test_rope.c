/* rope: the deterministic angle tables against libm.
 *
 * Over every position a model of context 128k uses and every pair of a
 * head_dim-128 head (the frequencies of head_dim 64, 32, ... are a subset),
 * for rope_base 10000 and 1e6, each table entry is within 1 ulp (float) of
 * (float) cos / sin of pos * pow(base, -2.0 * i / head_dim) computed by libm;
 * the frequencies equal pow's; the double kernel is within 1 ulp (double) of
 * libm also at angles next to multiples of pi/2 (the reduction's hard case).
 * A golden hash pins the bits of a table, so a host that computes other bits
 * fails here. The measured maxima are printed. */
#include "pd_test.h"

#include "cluster/model/model.h"
#include "cluster/model/rope.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Distance in representable values between two floats / doubles of any sign. */
static int64_t ulps_f(float a, float b)
{
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    int64_t x = ia < 0 ? (int64_t)INT32_MIN - ia : ia, y = ib < 0 ? (int64_t)INT32_MIN - ib : ib;
    return x > y ? x - y : y - x;
}

static uint64_t ulps_d(double a, double b)
{
    int64_t ia, ib;
    memcpy(&ia, &a, 8);
    memcpy(&ib, &b, 8);
    /* map sign-magnitude to a monotone integer line (no overflow for finite values) */
    __int128 x = ia < 0 ? (__int128)INT64_MIN - ia : ia, y = ib < 0 ? (__int128)INT64_MIN - ib : ib;
    __int128 d = x > y ? x - y : y - x;
    return (uint64_t)d;
}

START_TEST(rope_frequencies_equal_libm_pow)
{
    static const double bases[] = {10000.0, 1e6, 500000.0, 1234.5};
    static const uint32_t dims[] = {128, 64, 80, 96, 256};
    uint64_t worst = 0, n = 0, differ = 0;
    for (size_t b = 0; b < sizeof bases / sizeof bases[0]; b++)
        for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
            for (uint32_t i = 0; i < dims[d] / 2; i++) {
                double f = rope_freq(bases[b], dims[d], i), want = pow(bases[b], -2.0 * (double)i / (double)dims[d]);
                uint64_t u = ulps_d(f, want);
                worst = u > worst ? u : worst;
                differ += u != 0;
                n++;
            }
    fprintf(stderr, "rope: frequencies: %llu of %llu differ from pow, max %llu ulp (double)\n",
            (unsigned long long)differ, (unsigned long long)n, (unsigned long long)worst);
    ck_assert_uint_le(worst, 1);
    ck_assert_double_eq(rope_freq(10000.0, 128, 0), 1.0);
}
END_TEST

/* The double kernel: random angles over [0, 2^20), and the neighbours of
 * k pi/2 (where the reduced argument is tiny and a naive reduction loses
 * every bit). */
START_TEST(rope_sincos_is_within_an_ulp_of_libm_in_double)
{
    pd_rng r = {.s = 42};
    uint64_t worst = 0;
    double worst_at = 0;
    for (int t = 0; t < 400000; t++) {
        double th;
        if (t & 1) {
            th = (double)pd_rng_next(&r) / 18446744073709551616.0 * 1048576.0;
        } else {
            double k = (double)(pd_rng_next(&r) % (1u << 20));
            th = k * 1.5707963267948966; /* the double next to k pi/2 */
            int64_t step = (int64_t)(pd_rng_next(&r) % 5) - 2;
            int64_t bits;
            memcpy(&bits, &th, 8);
            bits += step;
            memcpy(&th, &bits, 8);
        }
        double c, s;
        rope_sincos(th, &c, &s);
        uint64_t u = ulps_d(c, cos(th)), v = ulps_d(s, sin(th));
        if (u > worst || v > worst) {
            worst = u > v ? u : v;
            worst_at = th;
        }
    }
    fprintf(stderr, "rope: sincos: max %llu ulp (double) against libm, at %.17g\n", (unsigned long long)worst,
            worst_at);
    ck_assert_uint_le(worst, 1);
    double c, s;
    rope_sincos(0.0, &c, &s);
    ck_assert(c == 1.0 && s == 0.0);
}
END_TEST

/* Every table entry of a 128k-position, head_dim-128 table for bases 1e4
 * and 1e6 against libm's float results: at most 1 ulp, and almost always 0. */
START_TEST(rope_table_is_within_an_ulp_of_libm_over_128k_positions)
{
    static const double bases[] = {10000.0, 1e6};
    enum { HD = 128, HALF = HD / 2, NPOS = 131072 };
    for (size_t b = 0; b < 2; b++) {
        rope_table *t = NULL;
        pd_err e = {0};
        ck_assert_msg(rope_table_new(bases[b], HD, NPOS, NULL, &t, &e) == PD_OK, "%s", e.msg);
        ck_assert_uint_eq(rope_table_positions(t), NPOS);
        double f[HALF];
        for (uint32_t i = 0; i < HALF; i++) {
            f[i] = pow(bases[b], -2.0 * (double)i / (double)HD);
            ck_assert_double_eq(rope_table_freq(t, i), f[i]); /* the same angles as libm's path */
        }
        int64_t worst = 0;
        uint64_t differ = 0, worst_pos = 0;
        uint32_t worst_i = 0;
        for (uint32_t p = 0; p < NPOS; p++) {
            const float *cs = rope_table_row(t, p, NULL);
            for (uint32_t i = 0; i < HALF; i++) {
                double th = (double)p * f[i];
                int64_t uc = ulps_f(cs[2 * i], (float)cos(th)), us = ulps_f(cs[2 * i + 1], (float)sin(th));
                int64_t u = uc > us ? uc : us;
                differ += (uc != 0) + (us != 0);
                if (u > worst) {
                    worst = u;
                    worst_pos = p;
                    worst_i = i;
                }
            }
        }
        fprintf(stderr,
                "rope: table base %g, head_dim %u, positions [0, %u): %llu of %llu values differ from libm, "
                "max %lld ulp (float) (position %llu, pair %u)\n",
                bases[b], HD, NPOS, (unsigned long long)differ, (unsigned long long)NPOS * HALF * 2,
                (long long)worst, (unsigned long long)worst_pos, worst_i);
        ck_assert_int_le(worst, 1);
        rope_table_free(t);
    }
}
END_TEST

/* 64-bit FNV-1a over the table's float bits, rows in order. */
static uint64_t table_hash(const rope_table *t, uint32_t n_pos)
{
    uint64_t h = 0xcbf29ce484222325ull;
    float buf[1024];
    for (uint32_t p = 0; p < n_pos; p++) {
        const float *cs = rope_table_row(t, p, buf);
        const uint8_t *b = (const uint8_t *)cs;
        for (size_t i = 0; i < (size_t)rope_table_head_dim(t) * sizeof(float); i++)
            h = (h ^ b[i]) * 0x100000001b3ull;
    }
    return h;
}

#define ROPE_GOLDEN_A 0xb4a7ffc5dcf2e0a1ull
#define ROPE_GOLDEN_B 0x7e9f8045d1cb4fb2ull

/* Pinned: the bits this code gave when it was written. Another host, libm or
 * compiler must give exactly these (that is the table's reason to exist). */
START_TEST(rope_table_bits_are_pinned)
{
    rope_table *a = NULL, *b = NULL;
    pd_err e = {0};
    ck_assert_int_eq(rope_table_new(10000.0, 128, 4096, NULL, &a, &e), PD_OK);
    ck_assert_int_eq(rope_table_new(1e6, 64, 4096, NULL, &b, &e), PD_OK);
    uint64_t ha = table_hash(a, 4096), hb = table_hash(b, 4096);
    fprintf(stderr, "rope: golden hashes %016llx %016llx\n", (unsigned long long)ha, (unsigned long long)hb);
    ck_assert_uint_eq(ha, ROPE_GOLDEN_A);
    ck_assert_uint_eq(hb, ROPE_GOLDEN_B);
    rope_table_free(a);
    rope_table_free(b);
}
END_TEST

/* Rows past the table are computed, with the table's bits; apply rotates the
 * documented pairs; model_rope_row (no table) gives the same bits; position
 * 0 is the identity. */
START_TEST(rope_rows_past_the_table_and_apply_agree)
{
    rope_table *small = NULL, *big = NULL;
    pd_err e = {0};
    ck_assert_int_eq(rope_table_new(10000.0, 16, 8, NULL, &small, &e), PD_OK);
    ck_assert_int_eq(rope_table_new(10000.0, 16, 64, NULL, &big, &e), PD_OK);
    float buf[16];
    for (uint64_t p = 0; p < 64; p++) {
        const float *a = rope_table_row(small, p, buf), *b = rope_table_row(big, p, NULL);
        ck_assert_int_eq(memcmp(a, b, 16 * sizeof(float)), 0);
        ck_assert(p < 8 ? a != buf : a == buf);
    }
    /* a row far beyond any table */
    float c, s;
    rope_angle(3000000000ull, rope_table_freq(big, 1), &c, &s);
    ck_assert_int_le(ulps_f(c, (float)cos(3000000000.0 * rope_table_freq(big, 1))), 1);
    ck_assert_int_le(ulps_f(s, (float)sin(3000000000.0 * rope_table_freq(big, 1))), 1);
    pd_rng r = {.s = 9};
    for (int style = 0; style < 2; style++)
        for (uint64_t p = 0; p < 70; p += 7) {
            float x[3 * 16], y[3 * 16], z[3 * 16];
            pd_rng_fill(&r, x, 3 * 16, -2, 2);
            memcpy(y, x, sizeof x);
            memcpy(z, x, sizeof x);
            rope_table_apply(small, y, 3, p, style ? ROPE_PAIRS_HALVES : ROPE_PAIRS_ADJACENT);
            model_rope_row(z, 3, 16, p, 10000.0f, style ? MODEL_ROPE_NEOX : MODEL_ROPE_NORM);
            ck_assert_int_eq(memcmp(y, z, sizeof y), 0);
            const float *cs = rope_table_row(small, p, buf);
            for (uint32_t h = 0; h < 3; h++)
                for (uint32_t i = 0; i < 8; i++) {
                    uint32_t a = style ? i : 2 * i, b = style ? i + 8 : 2 * i + 1;
                    float x0 = x[h * 16 + a], x1 = x[h * 16 + b];
                    ck_assert_float_eq(y[h * 16 + a], x0 * cs[2 * i] - x1 * cs[2 * i + 1]);
                    ck_assert_float_eq(y[h * 16 + b], x0 * cs[2 * i + 1] + x1 * cs[2 * i]);
                    if (p == 0)
                        ck_assert(y[h * 16 + a] == x0 && y[h * 16 + b] == x1);
                }
        }
    ck_assert_uint_gt(rope_table_bytes(big), 64 * 16 * sizeof(float));
    rope_table_free(small);
    rope_table_free(big);
    rope_table_free(NULL);
}
END_TEST

START_TEST(rope_table_refuses_bad_parameters)
{
    rope_table *t = (rope_table *)&t; /* must stay untouched */
    pd_err e = {0};
    ck_assert_int_eq(rope_table_new(1.0, 16, 4, NULL, &t, &e), PD_ERR_ARG);
    ck_assert_int_eq(rope_table_new(NAN, 16, 4, NULL, &t, &e), PD_ERR_ARG);
    ck_assert_int_eq(rope_table_new(INFINITY, 16, 4, NULL, &t, &e), PD_ERR_ARG);
    ck_assert_int_eq(rope_table_new(10000.0, 15, 4, NULL, &t, &e), PD_ERR_ARG);
    ck_assert_int_eq(rope_table_new(10000.0, 0, 4, NULL, &t, &e), PD_ERR_ARG);
    ck_assert_ptr_eq(t, (rope_table *)&t);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("rope");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, rope_frequencies_equal_libm_pow);
    tcase_add_test(tc, rope_sincos_is_within_an_ulp_of_libm_in_double);
    tcase_add_test(tc, rope_table_is_within_an_ulp_of_libm_over_128k_positions);
    tcase_add_test(tc, rope_table_bits_are_pinned);
    tcase_add_test(tc, rope_rows_past_the_table_and_apply_agree);
    tcase_add_test(tc, rope_table_refuses_bad_parameters);
    suite_add_tcase(s, tc);
    return s;
}
