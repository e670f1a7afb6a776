/* migrate: the maps a `migrate --layer L --to R` command may ask for (a
 * boundary layer to the neighbour on its side, the owner keeps a layer),
 * counting moved layers, and the --migrate-fault test hook's names. The
 * protocol itself runs in tests/e2e/migrate.sh (it needs ranks, a model
 * and streams). */
#include "pd_test.h"

#include "cluster/runtime/ops/migrate.h"

#include <string.h>

static layermap map_of(const char *s, uint32_t stages)
{
    layermap m;
    pd_err e = {0};
    ck_assert_int_eq(layermap_parse(s, stages, 12, &m, &e), PD_OK);
    return m;
}

static void expect_map(const layermap *m, const char *want)
{
    char buf[128];
    layermap_format(m, buf, sizeof buf);
    ck_assert_str_eq(buf, want);
}

START_TEST(migrate_layer_moves_a_boundary_layer_either_way)
{
    layermap cur = map_of("0-3,4-7,8-11", 3), out;
    pd_err e = {0};
    ck_assert_int_eq(migrate_map_for_layer(&cur, 3, 1, &out, &e), PD_OK);
    expect_map(&out, "0-2,3-7,8-11");
    ck_assert_int_eq(migrate_map_for_layer(&cur, 4, 0, &out, &e), PD_OK);
    expect_map(&out, "0-4,5-7,8-11");
    ck_assert_int_eq(migrate_map_for_layer(&cur, 7, 2, &out, &e), PD_OK);
    expect_map(&out, "0-3,4-6,7-11");
    ck_assert_uint_eq(migrate_layers_moved(&cur, &out), 1);
    ck_assert_uint_eq(migrate_layers_moved(&cur, &cur), 0);
    layermap far = map_of("0,1,2-11", 3);
    ck_assert_uint_eq(migrate_layers_moved(&cur, &far), 7);
}
END_TEST

START_TEST(migrate_layer_refuses_what_is_not_a_neighbour_move)
{
    layermap cur = map_of("0-3,4-4,5-11", 3), out;
    memset(&out, 0x5a, sizeof out);
    layermap before = out;
    static const struct { uint32_t layer, to; const char *needle; } bad[] = {
        {12, 1, "the model has layers 0-11"}, {3, 3, "the job has ranks 0-2"}, {3, 0, "on rank 0 already"},
        {2, 1, "only to a neighbour"},        {3, 2, "only to a neighbour"},   {4, 0, "would hold no layer"},
        {0, 1, "only to a neighbour"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        pd_err e = {0};
        ck_assert_int_eq(migrate_map_for_layer(&cur, bad[i].layer, bad[i].to, &out, &e), PD_ERR_ARG);
        ck_assert_msg(strstr(e.msg, bad[i].needle), "case %zu: %s", i, e.msg);
        ck_assert(memcmp(&out, &before, sizeof out) == 0);
    }
}
END_TEST

START_TEST(migrate_fault_names)
{
    migrate_fault f;
    pd_err e = {0};
    ck_assert_int_eq(migrate_fault_parse("corrupt", &f, &e), PD_OK);
    ck_assert_int_eq(f, MIGRATE_FAULT_CORRUPT);
    ck_assert_int_eq(migrate_fault_parse("weights", &f, &e), PD_OK);
    ck_assert_int_eq(f, MIGRATE_FAULT_WEIGHTS);
    ck_assert_int_eq(migrate_fault_parse("cut", &f, &e), PD_OK);
    ck_assert_int_eq(f, MIGRATE_FAULT_CUT);
    ck_assert_int_eq(migrate_fault_parse("none", &f, &e), PD_OK);
    ck_assert_int_eq(f, MIGRATE_FAULT_NONE);
    ck_assert_int_eq(migrate_fault_parse("CORRUPT", &f, &e), PD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(e.msg, "--migrate-fault"));
    ck_assert_ptr_nonnull(strstr(e.msg, "weights or cut"));
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("migrate");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, migrate_layer_moves_a_boundary_layer_either_way);
    tcase_add_test(tc, migrate_layer_refuses_what_is_not_a_neighbour_move);
    tcase_add_test(tc, migrate_fault_names);
    suite_add_tcase(s, tc);
    return s;
}
