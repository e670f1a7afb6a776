/* layermap: explicit maps are validated strictly; balancing with per-layer
 * costs is checked against brute force over every map of small cases (the
 * least bottleneck, then the least sum of squares, then the documented tie
 * rule), and puts the head's and tail's extras on the first and last stage. */
#include "pd_test.h"

#include "cluster/runtime/plan/layermap.h"

#include <string.h>

START_TEST(layermap_parses_explicit_ranges)
{
    layermap m;
    pd_err e = {0};
    ck_assert_int_eq(layermap_parse("0-3,4-7,8-11", 3, 12, &m, &e), PD_OK);
    ck_assert_uint_eq(m.n_stages, 3);
    ck_assert_uint_eq(m.first[1], 4);
    ck_assert_uint_eq(m.count[2], 4);
    ck_assert_int_eq(layermap_parse("0-10,11", 2, 12, &m, &e), PD_OK);
    ck_assert_uint_eq(m.count[1], 1);
    char buf[64];
    layermap_format(&m, buf, sizeof buf);
    ck_assert_str_eq(buf, "0-10,11-11");
}
END_TEST

START_TEST(layermap_owner_names_the_stage_of_every_layer)
{
    layermap m;
    pd_err e = {0};
    ck_assert_int_eq(layermap_parse("0,1-5,6-11", 3, 12, &m, &e), PD_OK);
    static const uint32_t want[12] = {0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2};
    for (uint32_t L = 0; L < 12; L++)
        ck_assert_uint_eq(layermap_owner(&m, L), want[L]);
}
END_TEST

START_TEST(layermap_refuses_gaps_overlaps_and_wrong_counts)
{
    static const struct { const char *map; uint32_t ranks; const char *needle; } bad[] = {
        {"0-3,5-11", 2, "gap"},         {"0-4,4-11", 2, "twice"},      {"0-3,4-7", 2, "not assigned"},
        {"0-5", 2, "ranges for"},       {"0-3,4-7,8-11", 2, "more ranges"}, {"0-12", 1, "does not exist"},
        {"3-1,4-11", 2, "reversed"},    {"0-5,", 2, "trailing"},       {"a-5,6-11", 2, "layer number"},
        {"0-5;6-11", 2, "unexpected"},  {"", 1, "ranges for"},         {"0-99999999999", 1, "layer number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        layermap m;
        memset(&m, 0x5a, sizeof m);
        layermap ref = m;
        pd_err e = {0};
        ck_assert_int_eq(layermap_parse(bad[i].map, bad[i].ranks, 12, &m, &e), PD_ERR_ARG);
        ck_assert_msg(strstr(e.msg, bad[i].needle) != NULL, "'%s': '%s' lacks '%s'", bad[i].map, e.msg,
                      bad[i].needle);
        ck_assert_int_eq(memcmp(&m, &ref, sizeof m), 0);
    }
}
END_TEST

START_TEST(layermap_balance_moves_layers_off_the_tail)
{
    layermap m;
    pd_err e = {0};
    /* no tail cost: even split */
    ck_assert_int_eq(layermap_balance(3, 12, 10, 0, &m, &e), PD_OK);
    ck_assert_uint_eq(m.count[0], 4);
    ck_assert_uint_eq(m.count[2], 4);
    /* the output projection costs two layers: the tail keeps fewer */
    ck_assert_int_eq(layermap_balance(2, 12, 10, 20, &m, &e), PD_OK);
    ck_assert_uint_eq(m.count[0], 7);
    ck_assert_uint_eq(m.count[1], 5);
    ck_assert_uint_eq(m.first[1], 7);
    /* one rank takes everything */
    ck_assert_int_eq(layermap_balance(1, 5, 10, 1000, &m, &e), PD_OK);
    ck_assert_uint_eq(m.count[0], 5);
    /* every rank needs a layer */
    ck_assert_int_eq(layermap_balance(4, 3, 10, 0, &m, &e), PD_ERR_ARG);
    ck_assert_msg(strstr(e.msg, "fewer than") != NULL, "%s", e.msg);
    for (uint32_t n = 1; n <= 8; n++)
        for (uint32_t L = n; L <= 20; L++) {
            ck_assert_int_eq(layermap_balance(n, L, 7, 13, &m, &e), PD_OK);
            uint32_t sum = 0;
            for (uint32_t s = 0; s < n; s++) {
                ck_assert_uint_ge(m.count[s], 1);
                ck_assert_uint_eq(m.first[s], sum);
                sum += m.count[s];
            }
            ck_assert_uint_eq(sum, L);
        }
}
END_TEST

/* Brute force over every map of n layers onto k stages (n <= 12): the map
 * layermap_balance_costs documents: least bottleneck, then least sum of
 * squared stage costs, then later stages with fewer layers (the last stage
 * the fewest, then the one before it, ...). */
static layermap brute_best(const uint64_t *c, uint32_t n, uint32_t k, uint64_t head, uint64_t tail)
{
    uint32_t first[LAYERMAP_MAX_STAGES];
    layermap best = {.n_stages = 0};
    uint64_t best_max = UINT64_MAX;
    double best_sq = 0;
    for (uint32_t s = 0; s < k; s++)
        first[s] = s;
    for (;;) {
        layermap m = {.n_stages = k};
        uint64_t worst = 0;
        double sq = 0;
        for (uint32_t s = 0; s < k; s++) {
            m.first[s] = first[s];
            m.count[s] = (s + 1 < k ? first[s + 1] : n) - first[s];
            uint64_t sc = layermap_stage_cost(&m, s, c, head, tail);
            worst = sc > worst ? sc : worst;
            sq += (double)sc * (double)sc;
        }
        int better = worst < best_max || (worst == best_max && sq < best_sq);
        if (!better && worst == best_max && sq == best_sq)
            for (uint32_t s = k; s-- > 0;)
                if (m.count[s] != best.count[s]) {
                    better = m.count[s] < best.count[s];
                    break;
                }
        if (better) {
            best = m;
            best_max = worst;
            best_sq = sq;
        }
        int32_t s = (int32_t)k - 1;
        while (s >= 1 && first[s] == n - (k - (uint32_t)s))
            s--;
        if (s < 1)
            break;
        first[s]++;
        for (uint32_t r = (uint32_t)s + 1; r < k; r++)
            first[r] = first[r - 1] + 1;
    }
    return best;
}

static void check_map(const layermap *m, uint32_t k, uint32_t n)
{
    ck_assert_uint_eq(m->n_stages, k);
    uint32_t sum = 0;
    for (uint32_t s = 0; s < k; s++) {
        ck_assert_uint_ge(m->count[s], 1);
        ck_assert_uint_eq(m->first[s], sum);
        sum += m->count[s];
    }
    ck_assert_uint_eq(sum, n);
}

START_TEST(layermap_balance_costs_equals_brute_force)
{
    pd_rng r = {.s = 42};
    for (int trial = 0; trial < 3000; trial++) {
        uint32_t n = 1 + pd_rng_below(&r, 10), k = 1 + pd_rng_below(&r, n);
        uint64_t c[12], head = 0, tail = 0;
        /* small ranges make ties common; zero costs included */
        uint32_t range = trial % 3 == 0 ? 3 : trial % 3 == 1 ? 20 : 1000;
        for (uint32_t i = 0; i < n; i++)
            c[i] = pd_rng_below(&r, range);
        if (trial % 2)
            head = pd_rng_below(&r, 2 * range);
        if (trial % 4 < 2)
            tail = pd_rng_below(&r, 3 * range);
        layermap m, want = brute_best(c, n, k, head, tail);
        pd_err e = {0};
        ck_assert_int_eq(layermap_balance_costs(k, n, c, head, tail, &m, &e), PD_OK);
        check_map(&m, k, n);
        char got[128], exp[128];
        layermap_format(&m, got, sizeof got);
        layermap_format(&want, exp, sizeof exp);
        ck_assert_msg(strcmp(got, exp) == 0, "trial %d: n %u k %u head %llu tail %llu: got %s, want %s", trial, n, k,
                      (unsigned long long)head, (unsigned long long)tail, got, exp);
    }
}
END_TEST

START_TEST(layermap_balance_costs_breaks_ties_as_documented)
{
    layermap m;
    pd_err e = {0};
    char buf[128];
    /* equal layers: bottleneck 3, spread 3,3,2,2,2 (not 3,3,3,2,1), the
     * extra layers on the earlier stages */
    uint64_t ones[12] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    ck_assert_int_eq(layermap_balance_costs(5, 12, ones, 0, 0, &m, &e), PD_OK);
    layermap_format(&m, buf, sizeof buf);
    ck_assert_str_eq(buf, "0-2,3-5,6-7,8-9,10-11");
    /* all zero: any map is optimal; the rule picks one layer per later stage */
    uint64_t zeros[6] = {0};
    ck_assert_int_eq(layermap_balance_costs(3, 6, zeros, 0, 0, &m, &e), PD_OK);
    layermap_format(&m, buf, sizeof buf);
    ck_assert_str_eq(buf, "0-3,4-4,5-5");
    /* the head's extra moves layers off stage 0, the tail's off the last */
    ck_assert_int_eq(layermap_balance_costs(3, 12, ones, 2, 0, &m, &e), PD_OK);
    layermap_format(&m, buf, sizeof buf);
    ck_assert_str_eq(buf, "0-2,3-7,8-11");
    ck_assert_int_eq(layermap_balance_costs(3, 12, ones, 0, 3, &m, &e), PD_OK);
    layermap_format(&m, buf, sizeof buf);
    ck_assert_str_eq(buf, "0-4,5-9,10-11");
    /* one costly layer gets a stage to itself when that is the bottleneck */
    uint64_t spike[6] = {1, 1, 10, 1, 1, 1};
    ck_assert_int_eq(layermap_balance_costs(3, 6, spike, 0, 0, &m, &e), PD_OK);
    layermap_format(&m, buf, sizeof buf);
    ck_assert_str_eq(buf, "0-1,2-2,3-5");
    ck_assert_uint_eq(layermap_stage_cost(&m, 1, spike, 0, 0), 10);
    ck_assert_uint_eq(layermap_stage_cost(&m, 2, spike, 5, 7), 10);
    ck_assert_uint_eq(layermap_stage_cost(&m, 0, spike, 5, 7), 7);
}
END_TEST

START_TEST(layermap_balance_costs_refuses_bad_shapes_and_overflow)
{
    uint64_t c[4] = {1, 2, 3, 4};
    layermap m;
    memset(&m, 0x5a, sizeof m);
    layermap ref = m;
    pd_err e = {0};
    ck_assert_int_eq(layermap_balance_costs(5, 4, c, 0, 0, &m, &e), PD_ERR_ARG);
    ck_assert_msg(strstr(e.msg, "4 layers, fewer than the 5 ranks") != NULL, "%s", e.msg);
    pd_err_clear(&e);
    ck_assert_int_eq(layermap_balance_costs(0, 4, c, 0, 0, &m, &e), PD_ERR_ARG);
    pd_err_clear(&e);
    ck_assert_int_eq(layermap_balance_costs(LAYERMAP_MAX_STAGES + 1, 300, c, 0, 0, &m, &e), PD_ERR_ARG);
    pd_err_clear(&e);
    uint64_t big[3] = {UINT64_MAX / 2, UINT64_MAX / 2, 2};
    ck_assert_int_eq(layermap_balance_costs(2, 3, big, 0, 0, &m, &e), PD_ERR_RANGE);
    pd_err_clear(&e);
    ck_assert_int_eq(layermap_balance_costs(2, 3, c, UINT64_MAX, 0, &m, &e), PD_ERR_RANGE);
    pd_err_clear(&e);
    ck_assert_int_eq(layermap_balance_costs(2, 3, c, 0, UINT64_MAX - 2, &m, &e), PD_ERR_RANGE);
    ck_assert_int_eq(memcmp(&m, &ref, sizeof m), 0);
    /* the largest sums that fit are fine */
    uint64_t edge[3] = {UINT64_MAX / 4, UINT64_MAX / 4, UINT64_MAX / 4};
    ck_assert_int_eq(layermap_balance_costs(3, 3, edge, 1, 2, &m, &e), PD_OK);
    ck_assert_uint_eq(m.count[1], 1);
}
END_TEST

/* The largest shapes: 1024 layers over 256 stages, with a tail that dwarfs
 * everything (the widest search), stay fast and valid. */
START_TEST(layermap_balance_costs_handles_the_largest_shapes)
{
    static uint64_t c[1024];
    pd_rng r = {.s = 7};
    for (uint32_t i = 0; i < 1024; i++)
        c[i] = 1000 + pd_rng_below(&r, 1000);
    layermap m;
    pd_err e = {0};
    ck_assert_int_eq(layermap_balance_costs(256, 1024, c, 0, 2000000, &m, &e), PD_OK);
    check_map(&m, 256, 1024);
    ck_assert_uint_eq(m.count[255], 1);
    ck_assert_int_eq(layermap_balance_costs(256, 1024, c, 0, 0, &m, &e), PD_OK);
    check_map(&m, 256, 1024);
    ck_assert_int_eq(layermap_balance_costs(7, 1024, c, 123, 4567, &m, &e), PD_OK);
    check_map(&m, 7, 1024);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("layermap");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120); /* the largest shapes take seconds under the sanitizers */
    tcase_add_test(tc, layermap_parses_explicit_ranges);
    tcase_add_test(tc, layermap_owner_names_the_stage_of_every_layer);
    tcase_add_test(tc, layermap_refuses_gaps_overlaps_and_wrong_counts);
    tcase_add_test(tc, layermap_balance_moves_layers_off_the_tail);
    tcase_add_test(tc, layermap_balance_costs_equals_brute_force);
    tcase_add_test(tc, layermap_balance_costs_breaks_ties_as_documented);
    tcase_add_test(tc, layermap_balance_costs_refuses_bad_shapes_and_overflow);
    tcase_add_test(tc, layermap_balance_costs_handles_the_largest_shapes);
    suite_add_tcase(s, tc);
    return s;
}
