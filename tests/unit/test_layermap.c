/* layermap: explicit maps are validated strictly; balancing puts the output
 * projection's cost on the last stage. */
#include "pd_test.h"

#include "cluster/runtime/layermap.h"

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

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("layermap");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, layermap_parses_explicit_ranges);
    tcase_add_test(tc, layermap_refuses_gaps_overlaps_and_wrong_counts);
    tcase_add_test(tc, layermap_balance_moves_layers_off_the_tail);
    suite_add_tcase(s, tc);
    return s;
}
