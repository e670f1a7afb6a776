/* policy: each flag parser accepts exactly its documented forms, refuses the
 * rest with a message naming the flag and the value and without touching the
 * policy; cross-flag validation; the canonical description string. */
#include "pd_test.h"

#include "cluster/runtime/plan/policy.h"

#include <stdio.h>
#include <string.h>

typedef pd_status (*policy_parser)(const char *s, cache_policy *p, pd_err *err);

/* A policy with every field set to a value no parser writes, so a refused
 * parse can be seen to leave all of it alone. */
static cache_policy policy_marked(void)
{
    cache_policy p;
    memset(&p, 0, sizeof p);
    p.attn = POLICY_ATTN_WINDOW;
    p.window = 777;
    p.kv = KV_MODE_Q8V;
    p.evict = POLICY_EVICT_RECENT;
    p.evict_budget = 555;
    p.evict_sinks = 333;
    p.max_drafts = 9;
    return p;
}

/* parse(s) must fail with PD_ERR_ARG, name flag and s, change nothing. */
static void refused(policy_parser parse, const char *flag, const char *s)
{
    cache_policy p = policy_marked(), ref = p;
    pd_err e = {0};
    ck_assert_msg(parse(s, &p, &e) == PD_ERR_ARG, "%s '%s' was accepted", flag, s);
    ck_assert_msg(strstr(e.msg, flag) != NULL, "%s '%s': message '%s' does not name the flag", flag, s, e.msg);
    char quoted[160];
    snprintf(quoted, sizeof quoted, "'%s'", s);
    ck_assert_msg(strlen(s) > 100 || strstr(e.msg, quoted) != NULL, "%s '%s': message '%s' does not quote the value",
                  flag, s, e.msg);
    ck_assert_msg(memcmp(&p, &ref, sizeof p) == 0, "%s '%s': refused but changed the policy", flag, s);
}

static cache_policy accepted(policy_parser parse, const char *s)
{
    cache_policy p = policy_marked();
    pd_err e = {0};
    ck_assert_msg(parse(s, &p, &e) == PD_OK, "'%s' refused: %s", s, e.msg);
    return p;
}

START_TEST(policy_default_is_full_f32_no_eviction_no_drafts)
{
    cache_policy p = policy_marked();
    policy_default(&p);
    ck_assert_int_eq(p.attn, POLICY_ATTN_FULL);
    ck_assert_uint_eq(p.window, 0);
    ck_assert_int_eq(p.kv, KV_MODE_F32);
    ck_assert_int_eq(p.evict, POLICY_EVICT_NONE);
    ck_assert_uint_eq(p.evict_budget, 0);
    ck_assert_uint_eq(p.evict_sinks, 0);
    ck_assert_uint_eq(p.max_drafts, 0);
    pd_err e = {0};
    ck_assert_int_eq(policy_validate(&p, &e), PD_OK);
}
END_TEST

START_TEST(policy_attn_accepts_full_rswa_and_window)
{
    cache_policy p = accepted(policy_parse_attn, "full");
    ck_assert_int_eq(p.attn, POLICY_ATTN_FULL);
    ck_assert_uint_eq(p.window, 0);
    ck_assert_int_eq(p.kv, KV_MODE_Q8V); /* other fields untouched */
    ck_assert_uint_eq(p.evict_budget, 555);
    p = accepted(policy_parse_attn, "rswa:128");
    ck_assert_int_eq(p.attn, POLICY_ATTN_RSWA);
    ck_assert_uint_eq(p.window, 128);
    p = accepted(policy_parse_attn, "rswa:1");
    ck_assert_uint_eq(p.window, 1);
    p = accepted(policy_parse_attn, "window:16777216");
    ck_assert_int_eq(p.attn, POLICY_ATTN_WINDOW);
    ck_assert_uint_eq(p.window, 16777216);
    p = accepted(policy_parse_attn, "window:007");
    ck_assert_uint_eq(p.window, 7);
    ck_assert_uint_eq(p.max_drafts, 9);
}
END_TEST

START_TEST(policy_attn_refuses_other_forms_naming_the_flag)
{
    static const char *const bad[] = {
        "", "Full", "full ", "none", "rswa", "rswa:", "rswa:0", "rswa:16777217", "rswa:-1", "rswa:+5", "rswa:5x",
        "rswa:0x10", "rswa:1.5", "rswa: 5", "rswa:99999999999999999999999", "window", "window:", "window:0",
        "window:-3", "window:16777217", "RSWA:8", "rswa=8", "window:8:8",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refused(policy_parse_attn, "--attn", bad[i]);
}
END_TEST

START_TEST(policy_kv_accepts_the_four_modes)
{
    static const struct { const char *s; kv_mode m; } ok[] = {
        {"f32", KV_MODE_F32}, {"q8", KV_MODE_Q8}, {"q8k", KV_MODE_Q8K}, {"q8v", KV_MODE_Q8V}};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        cache_policy p = accepted(policy_parse_kv, ok[i].s);
        ck_assert_int_eq(p.kv, ok[i].m);
        ck_assert_int_eq(p.attn, POLICY_ATTN_WINDOW);
        ck_assert_uint_eq(p.window, 777);
    }
    static const char *const bad[] = {"", "F32", "f16", "q4", "q8kv", "q8 ", " q8", "f32,q8"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refused(policy_parse_kv, "--kv", bad[i]);
}
END_TEST

START_TEST(policy_evict_accepts_none_recent_and_importance)
{
    cache_policy p = accepted(policy_parse_evict, "none");
    ck_assert_int_eq(p.evict, POLICY_EVICT_NONE);
    ck_assert_uint_eq(p.evict_budget, 0);
    ck_assert_uint_eq(p.evict_sinks, 0);
    p = accepted(policy_parse_evict, "recent:1");
    ck_assert_int_eq(p.evict, POLICY_EVICT_RECENT);
    ck_assert_uint_eq(p.evict_budget, 1);
    ck_assert_uint_eq(p.evict_sinks, 0);
    p = accepted(policy_parse_evict, "recent:4294967295");
    ck_assert_uint_eq(p.evict_budget, UINT32_MAX);
    p = accepted(policy_parse_evict, "importance:64:4");
    ck_assert_int_eq(p.evict, POLICY_EVICT_IMPORTANCE);
    ck_assert_uint_eq(p.evict_budget, 64);
    ck_assert_uint_eq(p.evict_sinks, 4);
    p = accepted(policy_parse_evict, "importance:2:0");
    ck_assert_uint_eq(p.evict_budget, 2);
    ck_assert_uint_eq(p.evict_sinks, 0);
    /* SINKS may equal N (the cache keeps at most N - 1 of them) */
    p = accepted(policy_parse_evict, "importance:16:16");
    ck_assert_uint_eq(p.evict_budget, 16);
    ck_assert_uint_eq(p.evict_sinks, 16);
    p = accepted(policy_parse_evict, "importance:2:2");
    ck_assert_uint_eq(p.evict_sinks, 2);
    p = accepted(policy_parse_evict, "importance:4294967295:4294967295");
    ck_assert_uint_eq(p.evict_budget, UINT32_MAX);
    ck_assert_uint_eq(p.evict_sinks, UINT32_MAX);
    ck_assert_int_eq(p.kv, KV_MODE_Q8V);
    ck_assert_uint_eq(p.window, 777);
}
END_TEST

START_TEST(policy_evict_refuses_other_forms_naming_the_flag)
{
    static const char *const bad[] = {
        "", "None", "recent", "recent:", "recent:0", "recent:-1", "recent:4294967296", "recent:5:1", "recent: 5",
        "importance", "importance:", "importance:8", "importance:8:", "importance::2", "importance:1:0",
        "importance:0:0", "importance:5:6", "importance:8:2:1", "importance:-8:2", "importance:8:-2",
        "importance:8:+2", "importance:4294967296:1", "importance:8:2x", "importance:x:2", "lru:8",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        refused(policy_parse_evict, "--evict", bad[i]);
}
END_TEST

/* Long values are judged whole: junk past any internal buffer is still junk. */
START_TEST(policy_evict_refuses_junk_after_a_long_valid_prefix)
{
    char s[256];
    int n = snprintf(s, sizeof s, "importance:10:");
    for (int i = 0; i < 120; i++)
        s[n++] = '0';
    s[n++] = 'x';
    s[n] = '\0';
    refused(policy_parse_evict, "--evict", s);
    n = snprintf(s, sizeof s, "importance:");
    for (int i = 0; i < 120; i++)
        s[n++] = '0';
    snprintf(s + n, sizeof s - (size_t)n, "8:2junk");
    refused(policy_parse_evict, "--evict", s);
    /* long but valid: leading zeros */
    n = snprintf(s, sizeof s, "importance:");
    for (int i = 0; i < 120; i++)
        s[n++] = '0';
    snprintf(s + n, sizeof s - (size_t)n, "8:2");
    cache_policy p = accepted(policy_parse_evict, s);
    ck_assert_uint_eq(p.evict_budget, 8);
    ck_assert_uint_eq(p.evict_sinks, 2);
}
END_TEST

START_TEST(policy_validate_refuses_contradictory_combinations)
{
    static const struct {
        policy_attn attn;
        kv_mode kv;
        policy_evict evict;
        const char *needle; /* NULL: valid */
    } cases[] = {
        {POLICY_ATTN_FULL, KV_MODE_F32, POLICY_EVICT_NONE, NULL},
        {POLICY_ATTN_FULL, KV_MODE_Q8, POLICY_EVICT_IMPORTANCE, NULL},
        {POLICY_ATTN_FULL, KV_MODE_Q8K, POLICY_EVICT_RECENT, NULL},
        {POLICY_ATTN_WINDOW, KV_MODE_Q8V, POLICY_EVICT_NONE, NULL},
        {POLICY_ATTN_WINDOW, KV_MODE_F32, POLICY_EVICT_RECENT, "--evict must be none"},
        {POLICY_ATTN_WINDOW, KV_MODE_F32, POLICY_EVICT_IMPORTANCE, "--evict must be none"},
        {POLICY_ATTN_RSWA, KV_MODE_F32, POLICY_EVICT_NONE, NULL},
        {POLICY_ATTN_RSWA, KV_MODE_Q8, POLICY_EVICT_NONE, NULL}, /* issue 40 */
        {POLICY_ATTN_RSWA, KV_MODE_Q8K, POLICY_EVICT_NONE, NULL},
        {POLICY_ATTN_RSWA, KV_MODE_Q8V, POLICY_EVICT_NONE, NULL},
        {POLICY_ATTN_RSWA, KV_MODE_Q8, POLICY_EVICT_RECENT, "--evict must be none"},
        {POLICY_ATTN_RSWA, KV_MODE_F32, POLICY_EVICT_RECENT, "--evict must be none"},
        {POLICY_ATTN_RSWA, KV_MODE_F32, POLICY_EVICT_IMPORTANCE, "--evict must be none"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cache_policy p;
        policy_default(&p);
        p.attn = cases[i].attn;
        p.window = p.attn == POLICY_ATTN_FULL ? 0 : 64;
        p.kv = cases[i].kv;
        p.evict = cases[i].evict;
        p.evict_budget = p.evict == POLICY_EVICT_NONE ? 0 : 32;
        p.evict_sinks = p.evict == POLICY_EVICT_IMPORTANCE ? 4 : 0;
        pd_err e = {0};
        pd_status st = policy_validate(&p, &e);
        if (!cases[i].needle) {
            ck_assert_msg(st == PD_OK, "case %zu refused: %s", i, e.msg);
        } else {
            ck_assert_msg(st == PD_ERR_ARG, "case %zu accepted", i);
            ck_assert_msg(strstr(e.msg, cases[i].needle) != NULL, "case %zu: '%s' lacks '%s'", i, e.msg,
                          cases[i].needle);
            ck_assert_msg(strstr(e.msg, "--attn") != NULL, "case %zu: '%s' does not name --attn", i, e.msg);
        }
    }
}
END_TEST

/* Validation of what the parsers produce, end to end: the CLI's order of
 * calls (each flag, then policy_validate). */
START_TEST(policy_parsed_flags_validate_together)
{
    static const struct { const char *attn, *kv, *evict; int ok; } runs[] = {
        {"full", "q8", "importance:32:32", 1},
        {"rswa:64", "f32", "none", 1},
        {"rswa:64", "q8v", "none", 1}, /* issue 40: the ring stores int8 rows */
        {"rswa:64", "q8", "recent:16", 0},
        {"window:64", "q8k", "none", 1},
        {"window:64", "f32", "recent:16", 0},
    };
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        cache_policy p;
        policy_default(&p);
        pd_err e = {0};
        ck_assert_int_eq(policy_parse_attn(runs[i].attn, &p, &e), PD_OK);
        ck_assert_int_eq(policy_parse_kv(runs[i].kv, &p, &e), PD_OK);
        ck_assert_int_eq(policy_parse_evict(runs[i].evict, &p, &e), PD_OK);
        ck_assert_int_eq(policy_validate(&p, &e) == PD_OK, runs[i].ok);
    }
}
END_TEST

START_TEST(policy_describe_gives_the_canonical_strings)
{
    static const struct { const char *attn, *kv, *evict; uint32_t drafts; const char *want; } cases[] = {
        {"full", "f32", "none", 0, "attn=full kv=f32 evict=none drafts=0"},
        {"rswa:128", "f32", "none", 0, "attn=rswa:128 kv=f32 evict=none drafts=0"},
        {"rswa:128", "q8", "none", 2, "attn=rswa:128 kv=q8 evict=none drafts=2"},
        {"window:64", "q8", "none", 3, "attn=window:64 kv=q8 evict=none drafts=3"},
        {"full", "q8k", "recent:100", 0, "attn=full kv=q8k evict=recent:100 drafts=0"},
        {"full", "q8v", "importance:64:4", 1, "attn=full kv=q8v evict=importance:64:4 drafts=1"},
        {"full", "f32", "importance:0010:010", 0, "attn=full kv=f32 evict=importance:10:10 drafts=0"},
        {"window:007", "f32", "none", 0, "attn=window:7 kv=f32 evict=none drafts=0"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cache_policy p;
        policy_default(&p);
        pd_err e = {0};
        ck_assert_int_eq(policy_parse_attn(cases[i].attn, &p, &e), PD_OK);
        ck_assert_int_eq(policy_parse_kv(cases[i].kv, &p, &e), PD_OK);
        ck_assert_int_eq(policy_parse_evict(cases[i].evict, &p, &e), PD_OK);
        p.max_drafts = cases[i].drafts;
        char buf[160];
        policy_describe(&p, buf, sizeof buf);
        ck_assert_str_eq(buf, cases[i].want);
    }
    /* a later flag replaces an earlier one of the same kind completely */
    cache_policy p;
    policy_default(&p);
    pd_err e = {0};
    ck_assert_int_eq(policy_parse_evict("importance:64:4", &p, &e), PD_OK);
    ck_assert_int_eq(policy_parse_evict("recent:8", &p, &e), PD_OK);
    ck_assert_int_eq(policy_parse_attn("rswa:32", &p, &e), PD_OK);
    ck_assert_int_eq(policy_parse_attn("full", &p, &e), PD_OK);
    char buf[160];
    policy_describe(&p, buf, sizeof buf);
    ck_assert_str_eq(buf, "attn=full kv=f32 evict=recent:8 drafts=0");
    /* a short buffer gets a terminated prefix */
    char small[12];
    memset(small, 'z', sizeof small);
    policy_describe(&p, small, sizeof small);
    ck_assert_str_eq(small, "attn=full k");
}
END_TEST

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
        {"rswa:4", "q8", "none", LCACHE_KIND_RING, 4, KV_MODE_Q8, LCACHE_EVICT_NONE, 0, 0},
        {"rswa:16", "q8k", "none", LCACHE_KIND_RING, 16, KV_MODE_Q8K, LCACHE_EVICT_NONE, 0, 0},
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

START_TEST(policy_refuses_an_eviction_budget_below_a_verify_step)
{
    cache_policy p;
    policy_default(&p);
    pd_err e = {0};
    ck_assert_int_eq(policy_parse_evict("recent:1", &p, &e), PD_OK);
    ck_assert_int_eq(policy_validate(&p, &e), PD_OK); /* no drafts: one row per step */
    p.max_drafts = 4;
    ck_assert_int_eq(policy_validate(&p, &e), PD_ERR_ARG);
    ck_assert_msg(strstr(e.msg, "--evict budget 1") != NULL, "%s", e.msg);
    p.evict_budget = 5;
    ck_assert_int_eq(policy_validate(&p, &e), PD_OK);
}
END_TEST

START_TEST(policy_eviction_takes_drafts_but_not_q8_async_nor_a_q8_budget_at_the_freeze)
{
    static const struct { kv_mode kv; uint32_t budget, drafts; int async; const char *needle; } cases[] = {
        {KV_MODE_F32, 60, 6, 0, NULL},      /* f32: no field to freeze */
        {KV_MODE_Q8, 58, 6, 0, NULL},       /* 58 + 6 rows: the 64th never held */
        {KV_MODE_Q8, 59, 6, 0, "freezes"},  /* a verify group reaches 64 rows, one-by-one never */
        {KV_MODE_Q8K, 64, 1, 0, "freezes"},
        {KV_MODE_Q8V, 65, 8, 0, NULL},      /* both freeze at position 64 */
        {KV_MODE_Q8, 200, 8, 0, NULL},
        {KV_MODE_Q8, 59, 0, 0, NULL},       /* no drafts */
        {KV_MODE_F32, 16, 4, 1, NULL},     /* asynchronous: exact too (f32) */
        {KV_MODE_Q8, 200, 4, 1, "--draft-async with --evict and --kv q8"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        cache_policy p;
        policy_default(&p);
        p.kv = cases[i].kv;
        p.evict = POLICY_EVICT_IMPORTANCE;
        p.evict_budget = cases[i].budget;
        p.evict_sinks = 2;
        p.max_drafts = cases[i].drafts;
        p.spec_async = cases[i].async;
        pd_err e = {0};
        pd_status st = policy_validate(&p, &e);
        if (!cases[i].needle)
            ck_assert_msg(st == PD_OK, "case %zu refused: %s", i, e.msg);
        else
            ck_assert_msg(st == PD_ERR_ARG && strstr(e.msg, cases[i].needle), "case %zu: %s", i, e.msg);
    }
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("policy");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, policy_default_is_full_f32_no_eviction_no_drafts);
    tcase_add_test(tc, policy_attn_accepts_full_rswa_and_window);
    tcase_add_test(tc, policy_attn_refuses_other_forms_naming_the_flag);
    tcase_add_test(tc, policy_kv_accepts_the_four_modes);
    tcase_add_test(tc, policy_evict_accepts_none_recent_and_importance);
    tcase_add_test(tc, policy_evict_refuses_other_forms_naming_the_flag);
    tcase_add_test(tc, policy_evict_refuses_junk_after_a_long_valid_prefix);
    tcase_add_test(tc, policy_validate_refuses_contradictory_combinations);
    tcase_add_test(tc, policy_parsed_flags_validate_together);
    tcase_add_test(tc, policy_eviction_takes_drafts_but_not_q8_async_nor_a_q8_budget_at_the_freeze);
    tcase_add_test(tc, policy_describe_gives_the_canonical_strings);
    tcase_add_test(tc, policy_maps_to_the_container_it_asks_for);
    tcase_add_test(tc, policy_refuses_an_eviction_budget_below_a_verify_step);
    suite_add_tcase(s, tc);
    return s;
}
