/* lcache_wire: a layer cache container through the CMFS wire. A container's
 * record is the record of the layer behind it; a container that imports
 * another's record at the stream's position continues exactly like the
 * original (same attention outputs, same records), for kv layers with and
 * without eviction (depth below the position) and q8, and for rings; refused
 * imports (identity, layer, kind, position, truncation, an open group) change
 * nothing; pending importance is not exported. */
#include "pd_test.h"

#include "cache/layer_cache.h"
#include "comm/lcache_wire.h"
#include "comm/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NKV = 2, HD = 32, QPK = 2, QD = NKV * QPK * HD, KVD = NKV * HD, MAXN = 40 };
static const uint64_t ID = 0x1234abcd5678ef01ull;
static const uint32_t LAYER = 3;

static lcache *make(const lcache_config *cfg)
{
    lcache *c = NULL;
    pd_err e = {0};
    ck_assert_msg(lcache_new(cfg, &c, &e) == PD_OK, "%s", e.msg);
    return c;
}

/* One group with rows drawn from (pos, salt): the same call on two
 * containers feeds the same bits. */
static void group(lcache *c, uint64_t pos, const uint8_t *roles, uint32_t n, uint32_t salt, float *out)
{
    static float k[MAXN * KVD], v[MAXN * KVD], q[MAXN * QD];
    pd_rng r = {.s = pos * 0x9e3779b97f4a7c15ull + salt};
    pd_rng_fill(&r, k, (size_t)n * KVD, -1, 1);
    pd_rng_fill(&r, v, (size_t)n * KVD, -1, 1);
    pd_rng_fill(&r, q, (size_t)n * QD, -1, 1);
    pd_err e = {0};
    lcache_group g = {.pos = pos, .n = n, .roles = roles};
    ck_assert_msg(lcache_append(c, &g, k, v, &e) == PD_OK, "%s", e.msg);
    for (uint32_t j = 0; j < n; j++)
        ck_assert_msg(lcache_attend(c, j, q + j * QD, out + j * QD, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(lcache_end(c, &e) == PD_OK, "%s", e.msg);
}

static void record(const lcache *c, uint8_t **rec, size_t *len)
{
    pd_err e = {0};
    *rec = NULL;
    ck_assert_msg(lcache_wire_export(c, ID, LAYER, 0, rec, len, &e) == PD_OK, "%s", e.msg);
}

static void assert_same_record(const lcache *a, const lcache *b, const char *what)
{
    uint8_t *ra, *rb;
    size_t la, lb;
    record(a, &ra, &la);
    record(b, &rb, &lb);
    ck_assert_msg(la == lb && memcmp(ra, rb, la) == 0, "%s: records differ (%zu vs %zu bytes)", what, la, lb);
    free(ra);
    free(rb);
}

static const uint8_t PRE[MAXN] = {0};
static const uint8_t DEC[1] = {LCACHE_ROLE_DECODE};
static const uint8_t DV[3] = {LCACHE_ROLE_DECODE, LCACHE_ROLE_VERIFY, LCACHE_ROLE_VERIFY};

/* a: prefill 20, then decode steps with verify rows (one draft accepted each
 * time) up to position `until`; settled there. */
static uint64_t history(lcache *a, uint64_t until)
{
    float o[MAXN * QD];
    group(a, 0, PRE, 20, 0, o);
    uint64_t pos = 20;
    pd_err e = {0};
    while (pos < until) {
        group(a, pos, DV, 3, 1, o);
        pos += 2; /* decode + one accepted draft */
    }
    ck_assert_msg(lcache_settle(a, pos, &e) == PD_OK, "%s", e.msg);
    return pos;
}

START_TEST(lcache_wire_import_continues_like_the_original)
{
    const lcache_config base = {.n_kv_heads = NKV, .head_dim = HD, .q_per_kv = QPK, .max_drafts = 2,
                                .prefill_rows = 20, .max_new = 60};
    lcache_config cfgs[5];
    for (int i = 0; i < 5; i++)
        cfgs[i] = base;
    cfgs[1].mode = KV_MODE_Q8;
    cfgs[2].evict = LCACHE_EVICT_IMPORTANCE, cfgs[2].evict_budget = 16, cfgs[2].evict_sinks = 2;
    cfgs[3].window = 8;
    cfgs[4].kind = LCACHE_KIND_RING, cfgs[4].window = 5;
    for (int i = 0; i < 5; i++) {
        char what[64];
        snprintf(what, sizeof what, "config %d", i);
        lcache *a = make(&cfgs[i]), *b = make(&cfgs[i]);
        uint64_t pos = history(a, 70);
        uint8_t *rec;
        size_t len;
        record(a, &rec, &len);
        wire_info wi;
        pd_err e = {0};
        ck_assert_msg(wire_inspect(rec, len, 0, 0, &wi, &e) == PD_OK, "%s", e.msg);
        ck_assert_uint_eq(wi.layer, LAYER);
        ck_assert_uint_eq(wi.identity, ID);
        /* under eviction the record's depth is below the stream position */
        if (cfgs[i].evict)
            ck_assert_uint_lt(wi.position, pos);
        else
            ck_assert_uint_eq(wi.position, pos);
        /* the container's record is the implementation's */
        {
            wire_layer_ref ref = {.identity = ID, .layer = LAYER};
            kv_layer_config kc;
            if (lcache_ring(a)) {
                ref.ring = lcache_ring(a);
            } else {
                ref.kv = lcache_kv(a);
                kv_layer_config_get(ref.kv, &kc);
                ref.kv_cfg = &kc;
            }
            uint8_t *r2;
            size_t l2;
            ck_assert_int_eq(wire_export(&ref, 0, &r2, &l2, &e), PD_OK);
            ck_assert(l2 == len && memcmp(r2, rec, len) == 0);
            free(r2);
        }
        ck_assert_msg(lcache_wire_import(b, ID, LAYER, pos, rec, len, 0, &e) == PD_OK, "%s: %s", what, e.msg);
        lcache_check(b);
        ck_assert_uint_eq(lcache_position(b), pos);
        ck_assert_uint_eq(lcache_pending(b), 0);
        free(rec);
        assert_same_record(a, b, what);
        /* both go on: decode steps, verify rows, rollbacks */
        for (int step = 0; step < 20; step++) {
            float oa[MAXN * QD], ob[MAXN * QD];
            const int dv = step % 3 == 0;
            group(a, pos, dv ? DV : DEC, dv ? 3 : 1, 7, oa);
            group(b, pos, dv ? DV : DEC, dv ? 3 : 1, 7, ob);
            ck_assert_msg(memcmp(oa, ob, (size_t)(dv ? 3 : 1) * QD * 4) == 0, "%s: step %d differs", what, step);
            pos += dv ? 1 + (uint64_t)(step % 2) : 1;
        }
        ck_assert_int_eq(lcache_settle(a, pos, &e), PD_OK);
        ck_assert_int_eq(lcache_settle(b, pos, &e), PD_OK);
        assert_same_record(a, b, what);
        lcache_free(a);
        lcache_free(b);
    }
}
END_TEST

START_TEST(lcache_wire_refused_imports_change_nothing)
{
    const lcache_config kvc = {.n_kv_heads = NKV, .head_dim = HD, .q_per_kv = QPK, .max_drafts = 2,
                               .prefill_rows = 20, .max_new = 40};
    lcache_config ringc = kvc;
    ringc.kind = LCACHE_KIND_RING, ringc.window = 4;
    lcache *src = make(&kvc), *rsrc = make(&ringc);
    uint64_t pos = history(src, 30);
    ck_assert_uint_eq(history(rsrc, 30), pos);
    uint8_t *rec, *rrec;
    size_t len, rlen;
    record(src, &rec, &len);
    record(rsrc, &rrec, &rlen);

    for (int kind = 0; kind < 2; kind++) {
        lcache *t = make(kind ? &ringc : &kvc);
        uint64_t tpos = history(t, 24);
        uint8_t *before;
        size_t blen;
        record(t, &before, &blen);
        const uint8_t *good = kind ? rrec : rec, *other = kind ? rec : rrec;
        size_t glen = kind ? rlen : len, olen = kind ? len : rlen;
        struct {
            const char *name;
            uint64_t id;
            uint32_t layer;
            uint64_t pos;
            const uint8_t *buf;
            size_t len;
            pd_status want;
        } bad[] = {
            {"identity", ID + 1, LAYER, pos, good, glen, PD_ERR_MISMATCH},
            {"layer", ID, LAYER + 1, pos, good, glen, PD_ERR_MISMATCH},
            {"position", ID, LAYER, pos + 1, good, glen, PD_ERR_MISMATCH},
            {"position behind", ID, LAYER, pos - 1, good, glen, PD_ERR_MISMATCH},
            {"the other kind", ID, LAYER, pos, other, olen, PD_ERR_MISMATCH},
            {"truncated", ID, LAYER, pos, good, glen - 1, PD_ERR_TRUNCATED},
            {"header only", ID, LAYER, pos, good, 16, PD_ERR_TRUNCATED},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            pd_err e = {0};
            pd_status rc = lcache_wire_import(t, bad[i].id, bad[i].layer, bad[i].pos, bad[i].buf, bad[i].len, 0, &e);
            ck_assert_msg(rc == bad[i].want, "kind %d: %s: %s (%s)", kind, bad[i].name, pd_status_str(rc), e.msg);
            lcache_check(t);
            ck_assert_uint_eq(lcache_position(t), tpos);
            uint8_t *after;
            size_t alen;
            record(t, &after, &alen);
            ck_assert_msg(alen == blen && memcmp(after, before, blen) == 0, "kind %d: %s changed the cache", kind,
                          bad[i].name);
            free(after);
        }
        /* not while a group is open */
        {
            float o[QD], k[KVD] = {0}, v[KVD] = {0};
            lcache_group g = {.pos = tpos, .n = 1, .roles = DEC};
            pd_err e = {0};
            ck_assert_int_eq(lcache_append(t, &g, k, v, &e), PD_OK);
            ck_assert_int_eq(lcache_wire_import(t, ID, LAYER, pos, good, glen, 0, &e), PD_ERR_ARG);
            ck_assert_int_eq(lcache_attend(t, 0, o, o, &e), PD_OK);
            ck_assert_int_eq(lcache_end(t, &e), PD_OK);
        }
        free(before);
        lcache_free(t);
    }
    free(rec);
    free(rrec);
    lcache_free(src);
    lcache_free(rsrc);
}
END_TEST

/* Importance mass of the last group's query positions is pending until the
 * next group or a settle: the wire has no place for it. */
START_TEST(lcache_wire_refuses_pending_importance)
{
    const lcache_config c = {.n_kv_heads = NKV, .head_dim = HD, .q_per_kv = QPK, .max_drafts = 2,
                             .prefill_rows = 20, .max_new = 40, .evict = LCACHE_EVICT_IMPORTANCE,
                             .evict_budget = 16, .evict_sinks = 1};
    lcache *a = make(&c);
    float o[MAXN * QD];
    group(a, 0, PRE, 20, 0, o);
    uint8_t *rec = NULL;
    size_t len;
    pd_err e = {0};
    ck_assert_int_eq(lcache_wire_export(a, ID, LAYER, 0, &rec, &len, &e), PD_ERR_REFUSED);
    ck_assert_ptr_null(rec);
    ck_assert_int_eq(lcache_settle(a, 20, &e), PD_OK);
    ck_assert_int_eq(lcache_wire_export(a, ID, LAYER, 0, &rec, &len, &e), PD_OK);
    free(rec);
    lcache_free(a);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("lcache_wire");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, lcache_wire_import_continues_like_the_original);
    tcase_add_test(tc, lcache_wire_refused_imports_change_nothing);
    tcase_add_test(tc, lcache_wire_refuses_pending_importance);
    suite_add_tcase(s, tc);
    return s;
}
