/* policy: the container configuration each policy asks for (the stage
 * creates every cache from it, so a wrong mapping would change answers
 * without a branch in the stage to look at). */
#include "pd_test.h"

#include "cluster/runtime/policy.h"

START_TEST(policy_maps_to_the_container_it_asks_for)
{
    static const struct {
        const char *attn, *kv, *evict;
        lcache_kind kind;
        uint32_t window;
        kv_mode mode;
        lcache_evict ev;
        uint32_t budget, sinks;
    } cases[] = {
        {"full", "f32", "none", LCACHE_KIND_KV, 0, KV_MODE_F32, LCACHE_EVICT_NONE, 0, 0},
        {"full", "q8k", "importance:16:2", LCACHE_KIND_KV, 0, KV_MODE_Q8K, LCACHE_EVICT_IMPORTANCE, 16, 2},
        {"full", "q8", "recent:9", LCACHE_KIND_KV, 0, KV_MODE_Q8, LCACHE_EVICT_RECENT, 9, 0},
        {"window:8", "q8v", "none", LCACHE_KIND_KV, 8, KV_MODE_Q8V, LCACHE_EVICT_NONE, 0, 0},
        {"rswa:4", "f32", "none", LCACHE_KIND_RING, 4, KV_MODE_F32, LCACHE_EVICT_NONE, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cache_policy p;
        policy_default(&p);
        pd_err e = {0};
        ck_assert_int_eq(policy_parse_attn(cases[i].attn, &p, &e), PD_OK);
        ck_assert_int_eq(policy_parse_kv(cases[i].kv, &p, &e), PD_OK);
        ck_assert_int_eq(policy_parse_evict(cases[i].evict, &p, &e), PD_OK);
        ck_assert_int_eq(policy_validate(&p, &e), PD_OK);
        p.max_drafts = 3;
        lcache_config c;
        policy_lcache_config(&p, &c);
        ck_assert_int_eq(c.kind, cases[i].kind);
        ck_assert_uint_eq(c.window, cases[i].window);
        ck_assert_int_eq(c.mode, cases[i].mode);
        ck_assert_int_eq(c.evict, cases[i].ev);
        ck_assert_uint_eq(c.evict_budget, cases[i].budget);
        ck_assert_uint_eq(c.evict_sinks, cases[i].sinks);
        ck_assert_uint_eq(c.max_drafts, 3);
        ck_assert_uint_eq(c.n_kv_heads, 0); /* the caller's */
        ck_assert_uint_eq(c.prefill_rows, 0);
        ck_assert_ptr_null(c.alloc);
    }
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("policy");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, policy_maps_to_the_container_it_asks_for);
    suite_add_tcase(s, tc);
    return s;
}
