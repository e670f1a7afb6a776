/* layer_cache: the one interface over a kv_layer and a ring_layer answers
 * exactly what the implementation answers when driven directly. For each
 * implementation and policy a random schedule of groups (prefill chunks,
 * prefill running into decode rows, several decode rows, verify rows with
 * every number of them accepted, rollbacks) runs twice: through lcache_* and
 * through the kv_layer / ring_layer calls the stage made before the container
 * existed; every attention output and the whole stored state must match bit
 * for bit. Also the position bookkeeping, the refusals (which change
 * nothing) and the memory figures. Links pd_cache only: the container needs
 * neither MPI nor the model. */
#include "pd_test.h"

#include "cache/kv_layer.h"
#include "cache/layer_cache.h"
#include "cache/ring_layer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NKV = 2, HD = 32, QPK = 2, QD = NKV * QPK * HD, KVD = NKV * HD, MAXN = 96 };

/* ---- the direct driver: the implementation objects, called as the stage
 * called them before the container ----------------------------------------- */

typedef struct direct {
    lcache_config cfg;
    kv_layer *kv;
    ring_layer *ring;
    uint64_t pos;
    uint32_t drafts; /* ring: verify rows of the last group */
    /* kv with eviction: the SEQUENTIAL-STEPS oracle. The accepted rows (K, V,
     * Q and whether their group evicts: not one that starts with prefill),
     * replayed one row per step into a fresh layer: before each generated
     * row the step evicts down to budget - 1, then appends and attends. A
     * group's rows are run as steps on a replay of the rows before it, so
     * its verify rows get what decoding them one by one would give. */
    float *hk, *hv, *hq;
    uint8_t *hgen;
    uint32_t hn;
} direct;

enum { MAXH = 256 };

static int direct_oracle(const direct *d) { return !d->ring && d->cfg.evict != LCACHE_EVICT_NONE; }

static direct direct_new(const lcache_config *cfg)
{
    direct d = {.cfg = *cfg};
    pd_err e = {0};
    if (cfg->kind == LCACHE_KIND_RING) {
        ring_layer_config rc = {.n_kv_heads = NKV,
                                .head_dim = HD,
                                .window = cfg->window,
                                .ref_capacity = cfg->prefill_rows,
                                .max_drafts = cfg->max_drafts,
                                .mode = cfg->mode,
                                .max_group = QPK};
        ck_assert_msg(ring_layer_new(&rc, &d.ring, &e) == PD_OK, "%s", e.msg);
    } else {
        kv_layer_config kc = {.n_kv_heads = NKV,
                              .head_dim = HD,
                              .mode = cfg->mode,
                              .capacity_rows = 8, /* grows: capacity is not part of the answer */
                              .spec_depth = cfg->max_drafts + 1,
                              .max_q_per_kv = QPK};
        ck_assert_msg(kv_layer_new(&kc, &d.kv, &e) == PD_OK, "%s", e.msg);
    }
    return d;
}

static void direct_free(direct *d)
{
    kv_layer_free(d->kv);
    ring_layer_free(d->ring);
    free(d->hk);
    free(d->hv);
    free(d->hq);
    free(d->hgen);
}

/* One sequential step of the oracle (see direct). */
static void oracle_step(kv_layer *kv, const lcache_config *p, int gen, const float *k, const float *v,
                        const float *q, float *out)
{
    pd_err e = {0};
    if (gen && kv_layer_rows(kv) + 1 > p->evict_budget) {
        uint64_t keep = p->evict_budget > 1 ? p->evict_budget - 1 : 0;
        uint64_t sinks = p->evict_sinks < keep ? p->evict_sinks : keep;
        if (p->evict == LCACHE_EVICT_RECENT)
            kv_layer_evict_recent(kv, keep);
        else
            kv_layer_evict_importance(kv, keep, sinks, keep / 2 ? keep / 2 : 1);
    }
    ck_assert_msg(kv_layer_append(kv, k, v, &e) == PD_OK, "%s", e.msg);
    for (uint32_t h = 0; h < NKV; h++) {
        kv_attend a = {.kv_head = h, .q_head0 = h * QPK, .n_q = QPK, .q = q + h * QPK * HD,
                       .track_imp = p->evict == LCACHE_EVICT_IMPORTANCE, .out = out + h * QPK * HD};
        ck_assert_msg(kv_layer_attend(kv, &a, NULL, &e) == PD_OK, "%s", e.msg);
    }
    kv_layer_confirm(kv, kv_layer_pos_len(kv)); /* the next group's settle */
}

/* A fresh oracle layer holding the first n accepted rows, replayed. */
static void oracle_replay(direct *d, uint32_t n)
{
    kv_layer_free(d->kv);
    d->kv = NULL;
    lcache_config cfg = d->cfg;
    kv_layer_config kc = {.n_kv_heads = NKV, .head_dim = HD, .mode = cfg.mode, .capacity_rows = 8,
                          .spec_depth = cfg.max_drafts + 1, .max_q_per_kv = QPK};
    pd_err e = {0};
    ck_assert_msg(kv_layer_new(&kc, &d->kv, &e) == PD_OK, "%s", e.msg);
    float out[QD];
    for (uint32_t i = 0; i < n; i++)
        oracle_step(d->kv, &cfg, d->hgen[i], d->hk + (size_t)i * KVD, d->hv + (size_t)i * KVD,
                    d->hq + (size_t)i * QD, out);
}

/* The group at pos (rows as given to direct_group) had its first `kept`
 * rows accepted: they join the history, and the oracle replays it. */
static void direct_accept(direct *d, uint64_t pos, const uint8_t *roles, uint32_t kept, const float *k,
                          const float *v, const float *q)
{
    if (!direct_oracle(d))
        return;
    if (!d->hk) {
        d->hk = calloc((size_t)MAXH * KVD, 4);
        d->hv = calloc((size_t)MAXH * KVD, 4);
        d->hq = calloc((size_t)MAXH * QD, 4);
        d->hgen = calloc(MAXH, 1);
    }
    ck_assert_uint_eq(d->hn, pos);
    ck_assert_uint_le(pos + kept, MAXH);
    for (uint32_t j = 0; j < kept; j++, d->hn++) {
        memcpy(d->hk + (size_t)d->hn * KVD, k + (size_t)j * KVD, 4 * KVD);
        memcpy(d->hv + (size_t)d->hn * KVD, v + (size_t)j * KVD, 4 * KVD);
        memcpy(d->hq + (size_t)d->hn * QD, q + (size_t)j * QD, 4 * QD);
        d->hgen[d->hn] = roles[0] != LCACHE_ROLE_PREFILL;
    }
    oracle_replay(d, d->hn);
    d->pos = d->hn;
}

static void direct_settle(direct *d, uint64_t p)
{
    pd_err e = {0};
    if (!d->ring && d->cfg.evict != LCACHE_EVICT_NONE)
        return; /* the oracle: direct_accept replays the accepted rows */
    uint64_t back = d->pos - p;
    if (d->ring) {
        if (d->drafts)
            ck_assert_msg(ring_layer_draft_commit(d->ring, d->drafts - (uint32_t)back, &e) == PD_OK, "%s", e.msg);
    } else {
        if (back)
            ck_assert_msg(kv_layer_truncate_last(d->kv, back, &e) == PD_OK, "%s", e.msg);
        kv_layer_confirm(d->kv, kv_layer_base(d->kv) + kv_layer_rows(d->kv));
    }
    d->drafts = 0;
    d->pos = p;
}

static void direct_group(direct *d, uint64_t pos, const uint8_t *roles, uint32_t n, const float *k,
                         const float *v, const float *q, float *out)
{
    pd_err e = {0};
    const lcache_config *p = &d->cfg;
    if (direct_oracle(d)) {
        ck_assert_uint_eq(d->hn, pos);
        oracle_replay(d, (uint32_t)pos);
        for (uint32_t j = 0; j < n; j++)
            oracle_step(d->kv, p, roles[0] != LCACHE_ROLE_PREFILL, k + (size_t)j * KVD, v + (size_t)j * KVD,
                        q + (size_t)j * QD, out + (size_t)j * QD);
        d->pos = pos + n;
        return;
    }
    direct_settle(d, pos);
    uint32_t verify = 0;
    for (uint32_t j = 0; j < n; j++)
        verify += roles[j] == LCACHE_ROLE_VERIFY;
    if (d->ring) {
        ring_attend_opts o = {.group = QPK};
        uint32_t j = 0, np = 0;
        while (np < n && roles[np] == LCACHE_ROLE_PREFILL)
            np++;
        if (np) {
            ck_assert_int_eq(ring_layer_prefill(d->ring, k, v, np, &e), PD_OK);
            for (; j < np; j++)
                ck_assert_int_eq(
                    ring_layer_attend_prefill(d->ring, (uint32_t)pos + j, q + j * QD, &o, out + j * QD, NULL, &e),
                    PD_OK);
        }
        for (; j < n; j++) {
            if (roles[j] == LCACHE_ROLE_DECODE) {
                ck_assert_int_eq(ring_layer_write(d->ring, k + j * KVD, v + j * KVD, NULL, &e), PD_OK);
                ck_assert_int_eq(ring_layer_attend(d->ring, q + j * QD, &o, out + j * QD, NULL, &e), PD_OK);
            } else {
                uint32_t i = ring_layer_drafts(d->ring);
                ck_assert_int_eq(ring_layer_draft_put(d->ring, k + j * KVD, v + j * KVD, &e), PD_OK);
                ck_assert_int_eq(ring_layer_draft_attend(d->ring, i, q + j * QD, &o, out + j * QD, NULL, &e),
                                 PD_OK);
            }
        }
        d->drafts = verify;
    } else {
        if (p->evict != LCACHE_EVICT_NONE && roles[0] != LCACHE_ROLE_PREFILL &&
            kv_layer_rows(d->kv) + n > p->evict_budget && p->evict_budget > n) {
            uint64_t keep = p->evict_budget - n, sinks = p->evict_sinks < keep ? p->evict_sinks : keep;
            if (p->evict == LCACHE_EVICT_RECENT)
                kv_layer_evict_recent(d->kv, keep);
            else
                kv_layer_evict_importance(d->kv, keep, sinks, keep / 2 ? keep / 2 : 1);
        }
        uint64_t r0 = kv_layer_rows(d->kv);
        ck_assert_int_eq(kv_layer_append_rows(d->kv, n, k, v, &e), PD_OK);
        for (uint32_t j = 0; j < n; j++) {
            uint64_t upto = r0 + j + 1, first = p->window && upto > p->window ? upto - p->window : 0;
            for (uint32_t h = 0; h < NKV; h++) {
                kv_attend a = {.kv_head = h,
                               .q_head0 = h * QPK,
                               .n_q = QPK,
                               .q = q + j * QD + h * QPK * HD,
                               .first = (uint32_t)first,
                               .upto = (uint32_t)upto,
                               .track_imp = p->evict == LCACHE_EVICT_IMPORTANCE,
                               .out = out + j * QD + h * QPK * HD};
                ck_assert_int_eq(kv_layer_attend(d->kv, &a, NULL, &e), PD_OK);
            }
        }
        if (p->window)
            kv_layer_trim_window(d->kv, p->window, p->max_drafts + 1, 1);
    }
    d->pos = pos + n;
}

/* ---- state comparison ------------------------------------------------------ */

static void assert_same_bytes(const void *a, const void *b, size_t n, const char *what)
{
    ck_assert_msg((a == NULL) == (b == NULL), "%s: present in one state only", what);
    if (a && n)
        ck_assert_msg(memcmp(a, b, n) == 0, "%s differs", what);
}

static void assert_kv_equal(const kv_layer *a, const kv_layer *b, const char *what)
{
    kv_state sa, sb;
    kv_head_state ha[NKV], hb[NKV];
    kv_layer_state(a, &sa, ha);
    kv_layer_state(b, &sb, hb);
    ck_assert_msg(sa.rows == sb.rows && sa.base == sb.base && sa.frozen == sb.frozen,
                  "%s: rows %llu/%llu base %llu/%llu frozen %d/%d", what, (unsigned long long)sa.rows,
                  (unsigned long long)sb.rows, (unsigned long long)sa.base, (unsigned long long)sb.base,
                  sa.frozen, sb.frozen);
    size_t r = sa.rows, ngk = (HD + KV_K_GROUP - 1) / KV_K_GROUP;
    for (uint32_t h = 0; h < NKV; h++) {
        assert_same_bytes(ha[h].k, hb[h].k, r * HD * 4, "k");
        assert_same_bytes(ha[h].v, hb[h].v, r * HD * 4, "v");
        assert_same_bytes(ha[h].kq, hb[h].kq, r * HD, "kq");
        assert_same_bytes(ha[h].vq, hb[h].vq, r * HD, "vq");
        assert_same_bytes(ha[h].ks, hb[h].ks, r * ngk * 4, "ks");
        assert_same_bytes(ha[h].vs, hb[h].vs, r * 4, "vs");
        assert_same_bytes(ha[h].kcol, hb[h].kcol, HD * 4, "kcol");
        assert_same_bytes(ha[h].vcol, hb[h].vcol, HD * 4, "vcol");
    }
    float *ia = malloc((r + 1) * 4), *ib = malloc((r + 1) * 4);
    kv_layer_importance(a, ia);
    kv_layer_importance(b, ib);
    assert_same_bytes(ia, ib, r * 4, "importance");
    free(ia);
    free(ib);
}

static void assert_ring_equal(const ring_layer *a, const ring_layer *b, const char *what)
{
    ring_state sa, sb;
    ring_layer_state(a, &sa);
    ring_layer_state(b, &sb);
    ck_assert_msg(sa.ref_rows == sb.ref_rows && sa.ring_len == sb.ring_len && sa.ring_pos == sb.ring_pos &&
                      sa.writes == sb.writes && sa.decoding == sb.decoding,
                  "%s: ring cursors differ", what);
    ck_assert_uint_eq(ring_layer_drafts(a), ring_layer_drafts(b));
    ck_assert_int_eq(sa.mode, sb.mode);
    const size_t ngk = (HD + RING_K_GROUP - 1) / RING_K_GROUP, nr = sa.ref_rows, ng = sa.ring_len;
    for (uint32_t h = 0; h < NKV; h++) {
        /* a component stored int8 has only its codes and scales (ring_state) */
        if (sa.ref_k) {
            assert_same_bytes(sa.ref_k[h], sb.ref_k[h], nr * HD * 4, "ref k");
            assert_same_bytes(sa.ring_k[h], sb.ring_k[h], ng * HD * 4, "ring k");
        } else {
            assert_same_bytes(sa.ref_kq[h], sb.ref_kq[h], nr * HD, "ref kq");
            assert_same_bytes(sa.ref_ks[h], sb.ref_ks[h], nr * ngk * 4, "ref ks");
            assert_same_bytes(sa.ring_kq[h], sb.ring_kq[h], ng * HD, "ring kq");
            assert_same_bytes(sa.ring_ks[h], sb.ring_ks[h], ng * ngk * 4, "ring ks");
        }
        if (sa.ref_v) {
            assert_same_bytes(sa.ref_v[h], sb.ref_v[h], nr * HD * 4, "ref v");
            assert_same_bytes(sa.ring_v[h], sb.ring_v[h], ng * HD * 4, "ring v");
        } else {
            assert_same_bytes(sa.ref_vq[h], sb.ref_vq[h], nr * HD, "ref vq");
            assert_same_bytes(sa.ref_vs[h], sb.ref_vs[h], nr * 4, "ref vs");
            assert_same_bytes(sa.ring_vq[h], sb.ring_vq[h], ng * HD, "ring vq");
            assert_same_bytes(sa.ring_vs[h], sb.ring_vs[h], ng * 4, "ring vs");
        }
    }
}

static void assert_same_state(const lcache *c, const direct *d, const char *what)
{
    lcache_check(c);
    ck_assert_uint_eq(lcache_position(c), d->pos);
    if (d->ring)
        assert_ring_equal(lcache_ring(c), d->ring, what);
    else
        assert_kv_equal(lcache_kv(c), d->kv, what);
}

/* ---- the schedule ------------------------------------------------------------- */

static lcache_config cfg_kv(kv_mode mode, uint32_t window, lcache_evict ev, uint32_t budget, uint32_t sinks)
{
    return (lcache_config){.kind = LCACHE_KIND_KV,
                           .n_kv_heads = NKV,
                           .head_dim = HD,
                           .q_per_kv = QPK,
                           .window = window,
                           .mode = mode,
                           .evict = ev,
                           .evict_budget = budget,
                           .evict_sinks = sinks,
                           .max_drafts = 3,
                           .prefill_rows = 70,
                           .max_new = 60};
}

static lcache_config cfg_ring(uint32_t window)
{
    return (lcache_config){.kind = LCACHE_KIND_RING,
                           .n_kv_heads = NKV,
                           .head_dim = HD,
                           .q_per_kv = QPK,
                           .window = window,
                           .max_drafts = 3,
                           .prefill_rows = 70,
                           .max_new = 60};
}

static lcache_config cfg_ring_q8(uint32_t window, kv_mode mode)
{
    lcache_config c = cfg_ring(window);
    c.mode = mode;
    return c;
}

static lcache *make(const lcache_config *cfg)
{
    lcache *c = NULL;
    pd_err e = {0};
    ck_assert_msg(lcache_new(cfg, &c, &e) == PD_OK, "%s", e.msg);
    lcache_check(c);
    return c;
}

/* Runs one group through the container; out receives the attention rows. */
static void lc_group(lcache *c, uint64_t pos, const uint8_t *roles, uint32_t n, const float *k, const float *v,
                     const float *q, float *out)
{
    pd_err e = {0};
    lcache_group g = {.pos = pos, .n = n, .roles = roles};
    ck_assert_msg(lcache_append(c, &g, k, v, &e) == PD_OK, "%s", e.msg);
    ck_assert_int_eq(lcache_group_open(c), 1);
    for (uint32_t j = 0; j < n; j++)
        ck_assert_msg(lcache_attend(c, j, q + j * QD, out + j * QD, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(lcache_end(c, &e) == PD_OK, "%s", e.msg);
    ck_assert_int_eq(lcache_group_open(c), 0);
    lcache_config cfg;
    lcache_config_get(c, &cfg);
    if (!cfg.undo_rows) /* across groups: rows turn final undo_rows behind */
        ck_assert_uint_eq(lcache_pending(c), n);
}

/* A random schedule: prefill in random chunks (sometimes running on into
 * decode rows), then rounds of [decode, verify x 0..3] or (kv, ring) a few
 * decode rows, each followed by a random accepted count. */
static void run_schedule(const lcache_config *cfg, uint64_t seed)
{
    char what[96];
    snprintf(what, sizeof what, "kind %u window %u mode %u evict %u, seed %llu", cfg->kind, cfg->window,
             cfg->mode, cfg->evict, (unsigned long long)seed);
    lcache *c = make(cfg);
    direct d = direct_new(cfg);
    pd_rng r = {.s = seed * 131 + 7};
    static float k[MAXN * KVD], v[MAXN * KVD], q[MAXN * QD], o1[MAXN * QD], o2[MAXN * QD];
    uint8_t roles[MAXN];
    const uint64_t P = cfg->prefill_rows, END = P + cfg->max_new - 6;
    uint64_t pos = 0;
    while (pos < END) {
        uint32_t n = 0;
        if (pos < P) {
            uint32_t left = (uint32_t)(P - pos);
            n = 1 + pd_rng_below(&r, left < 40 ? left : 40);
            for (uint32_t j = 0; j < n; j++)
                roles[j] = LCACHE_ROLE_PREFILL;
            if (n == left && pd_rng_below(&r, 2)) /* run on into decode rows */
                while (n < left + 2)
                    roles[n++] = LCACHE_ROLE_DECODE;
        } else if (pd_rng_below(&r, 4) == 0) {
            uint32_t nd = 1 + pd_rng_below(&r, 3);
            for (; n < nd; n++)
                roles[n] = LCACHE_ROLE_DECODE;
        } else {
            roles[n++] = LCACHE_ROLE_DECODE;
            uint32_t nv = pd_rng_below(&r, cfg->max_drafts + 1);
            for (uint32_t i = 0; i < nv; i++)
                roles[n++] = LCACHE_ROLE_VERIFY;
        }
        pd_rng_fill(&r, k, (size_t)n * KVD, -1, 1);
        pd_rng_fill(&r, v, (size_t)n * KVD, -1, 1);
        pd_rng_fill(&r, q, (size_t)n * QD, -1, 1);
        lc_group(c, pos, roles, n, k, v, q, o1);
        direct_group(&d, pos, roles, n, k, v, q, o2);
        for (uint32_t j = 0; j < n; j++)
            ck_assert_msg(memcmp(o1 + j * QD, o2 + j * QD, QD * 4) == 0, "%s: position %llu (row %u of %u): "
                          "attention output differs", what, (unsigned long long)(pos + j), j, n);
        /* the next group starts where the accepted rows end: verify rows may
         * be rejected, and on a kv layer the decode row too */
        uint32_t verify = 0;
        for (uint32_t j = 0; j < n; j++)
            verify += roles[j] == LCACHE_ROLE_VERIFY;
        uint64_t next = pos + n;
        if (verify) {
            uint32_t acc = pd_rng_below(&r, verify + 1);
            next = pos + n - verify + acc;
            /* the decode row itself replaced (asynchronous speculation,
             * which eviction refuses: its decode rows are final) */
            if (!d.ring && !direct_oracle(&d) && pd_rng_below(&r, 5) == 0)
                next = pos;
        }
        ck_assert_uint_eq(lcache_rollback_limit(c), d.ring ? verify : (n < 4 ? n : 4));
        direct_accept(&d, pos, roles, (uint32_t)(next - pos), k, v, q);
        /* settle ahead of the next group, sometimes; always against the
         * oracle, which holds the accepted rows only */
        if (direct_oracle(&d) || pd_rng_below(&r, 3) == 0) {
            pd_err e = {0};
            ck_assert_msg(lcache_settle(c, next, &e) == PD_OK, "%s", e.msg);
            direct_settle(&d, next);
            ck_assert_uint_eq(lcache_pending(c), 0);
        }
        assert_same_state(c, &d, what);
        pos = next;
    }
    lcache_free(c);
    direct_free(&d);
}

START_TEST(lcache_kv_answers_like_the_kv_layer)
{
    const lcache_config cfgs[] = {
        cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_NONE, 0, 0),
        cfg_kv(KV_MODE_Q8, 0, LCACHE_EVICT_NONE, 0, 0), /* the field freezes at row 64 */
        cfg_kv(KV_MODE_Q8V, 0, LCACHE_EVICT_NONE, 0, 0),
        cfg_kv(KV_MODE_F32, 8, LCACHE_EVICT_NONE, 0, 0),
        cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_IMPORTANCE, 12, 3),
        cfg_kv(KV_MODE_Q8K, 0, LCACHE_EVICT_RECENT, 10, 0),
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        for (uint64_t seed = 0; seed < 4; seed++)
            run_schedule(&cfgs[i], seed);
}
END_TEST

/* Eviction under speculation, exhaustively (issue 40 item 2): a group
 * [decode, verify x K] at every fill level around the budget (the prefill
 * alone below, at and above it; evictions before the group or inside it),
 * every accepted count a = 0..K, and a decode step after the settle: each
 * row's attention and the settled layer (rows of every storage, importance)
 * equal the accepted rows decoded one by one. */
static void evict_group_case(const lcache_config *cfg, uint32_t P, uint32_t fill, uint32_t K, uint32_t a,
                             uint64_t seed)
{
    char what[128];
    snprintf(what, sizeof what, "evict %u budget %u mode %u: prefill %u, %u steps, K %u, accept %u", cfg->evict,
             cfg->evict_budget, cfg->mode, P, fill, K, a);
    lcache *c = make(cfg);
    direct d = direct_new(cfg);
    pd_rng r = {.s = seed};
    static float k[MAXN * KVD], v[MAXN * KVD], q[MAXN * QD], o1[MAXN * QD], o2[MAXN * QD];
    uint8_t roles[MAXN];
    uint64_t pos = 0;
    /* prefill, `fill` single decode steps, the verify group, one step after */
    for (uint32_t step = 0; step < 3 + fill; step++) {
        uint32_t n = 0, acc;
        if (step == 0) {
            for (; n < P; n++)
                roles[n] = LCACHE_ROLE_PREFILL;
        } else if (step == fill + 1) {
            roles[n++] = LCACHE_ROLE_DECODE;
            for (uint32_t i = 0; i < K; i++)
                roles[n++] = LCACHE_ROLE_VERIFY;
        } else {
            roles[n++] = LCACHE_ROLE_DECODE;
        }
        acc = step == fill + 1 ? 1 + a : n;
        pd_rng_fill(&r, k, (size_t)n * KVD, -1, 1);
        pd_rng_fill(&r, v, (size_t)n * KVD, -1, 1);
        pd_rng_fill(&r, q, (size_t)n * QD, -2, 2);
        lc_group(c, pos, roles, n, k, v, q, o1);
        direct_group(&d, pos, roles, n, k, v, q, o2);
        for (uint32_t j = 0; j < n; j++)
            ck_assert_msg(memcmp(o1 + j * QD, o2 + j * QD, QD * 4) == 0, "%s: step %u row %u differs", what, step,
                          j);
        direct_accept(&d, pos, roles, acc, k, v, q);
        pd_err e = {0};
        ck_assert_msg(lcache_settle(c, pos + acc, &e) == PD_OK, "%s", e.msg);
        assert_same_state(c, &d, what);
        pos += acc;
    }
    lcache_free(c);
    direct_free(&d);
}

START_TEST(lcache_eviction_verify_groups_equal_sequential_steps)
{
    const lcache_config cfgs[] = {
        cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_RECENT, 5, 0),
        cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_IMPORTANCE, 6, 2),
        cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_IMPORTANCE, 7, 0),
        cfg_kv(KV_MODE_Q8, 0, LCACHE_EVICT_IMPORTANCE, 5, 1),
        cfg_kv(KV_MODE_Q8V, 0, LCACHE_EVICT_RECENT, 4, 0),
    };
    uint64_t seed = 1;
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        for (uint32_t P = 1; P <= cfgs[i].evict_budget + 2; P++)
            for (uint32_t fill = 0; fill <= 3; fill++)
                for (uint32_t K = 1; K <= cfgs[i].max_drafts; K++)
                    for (uint32_t a = 0; a <= K; a++)
                        evict_group_case(&cfgs[i], P, fill, K, a, seed++);
}
END_TEST


/* Asynchronous speculation with eviction: groups [decode, verify x k] and
 * verify-only groups continuing them, rollbacks anywhere within the undo
 * range, settles now and then. Against the sequential-steps oracle run on
 * the TENTATIVE history (every row given, cut at each rollback): each row
 * attends what decoding the rows before it one by one would give, and a
 * settled layer is what the sequential steps leave. */
static void async_evict_run(const lcache_config *cfg, uint64_t seed)
{
    char what[96];
    snprintf(what, sizeof what, "async evict %u budget %u, seed %llu", cfg->evict, cfg->evict_budget,
             (unsigned long long)seed);
    lcache *c = make(cfg);
    direct d = direct_new(cfg);
    pd_rng r = {.s = seed * 977 + 3};
    static float k[MAXN * KVD], v[MAXN * KVD], q[MAXN * QD], o1[MAXN * QD], o2[MAXN * QD];
    uint8_t roles[MAXN];
    uint64_t pos = 0;
    for (int step = 0; step < 60 && pos + 8 < MAXH; step++) {
        uint32_t n = 0;
        uint64_t gpos = pos;
        if (step == 0) {
            n = 1 + pd_rng_below(&r, 12);
            for (uint32_t j = 0; j < n; j++)
                roles[j] = LCACHE_ROLE_PREFILL;
        } else {
            uint64_t lim = lcache_rollback_limit(c);
            gpos = pos - pd_rng_below(&r, (uint32_t)(lim < 5 ? lim : 5) + 1);
            if (pd_rng_below(&r, 3))
                roles[n++] = LCACHE_ROLE_DECODE;
            uint32_t nv = (n ? 0 : 1) + pd_rng_below(&r, cfg->max_drafts + (n ? 1 : 0));
            for (uint32_t i = 0; i < nv; i++)
                roles[n++] = LCACHE_ROLE_VERIFY;
        }
        pd_rng_fill(&r, k, (size_t)n * KVD, -1, 1);
        pd_rng_fill(&r, v, (size_t)n * KVD, -1, 1);
        pd_rng_fill(&r, q, (size_t)n * QD, -2, 2);
        lc_group(c, gpos, roles, n, k, v, q, o1);
        d.hn = (uint32_t)gpos; /* the tentative history, cut at the rollback */
        direct_group(&d, gpos, roles, n, k, v, q, o2);
        for (uint32_t j = 0; j < n; j++)
            ck_assert_msg(memcmp(o1 + j * QD, o2 + j * QD, QD * 4) == 0, "%s: step %u position %llu differs", what,
                          step, (unsigned long long)(gpos + j));
        direct_accept(&d, gpos, roles, n, k, v, q);
        pos = gpos + n;
        if (pd_rng_below(&r, 5) == 0) { /* a settle (checkpoint, migration) somewhere in the undo range */
            uint64_t sp = pos - pd_rng_below(&r, (uint32_t)lcache_rollback_limit(c) + 1);
            pd_err e = {0};
            ck_assert_msg(lcache_settle(c, sp, &e) == PD_OK, "%s", e.msg);
            d.hn = (uint32_t)sp;
            oracle_replay(&d, d.hn);
            d.pos = sp;
            assert_same_state(c, &d, what);
            /* settled: nothing pending, so a checkpoint or migration may export it */
            kv_state ks;
            kv_head_state hs[NKV];
            kv_layer_state(lcache_kv(c), &ks, hs);
            ck_assert_msg(ks.imp_pending == 0, "%s: %u positions of importance pending after a settle", what,
                          ks.imp_pending);
            pos = sp;
        }
    }
    lcache_free(c);
    direct_free(&d);
}

START_TEST(lcache_async_eviction_equals_sequential_steps)
{
    lcache_config cfgs[] = {
        cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_RECENT, 6, 0),
        cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_IMPORTANCE, 7, 2),
        cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_IMPORTANCE, 5, 0),
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++) {
        cfgs[i].undo_rows = 2 * (cfgs[i].max_drafts + 1);
        for (uint64_t seed = 0; seed < 12; seed++)
            async_evict_run(&cfgs[i], seed);
    }
}
END_TEST

START_TEST(lcache_ring_answers_like_the_ring_layer)
{
    for (uint32_t w = 3; w <= 9; w += 3)
        for (uint64_t seed = 0; seed < 6; seed++) {
            lcache_config cfg = cfg_ring(w);
            run_schedule(&cfg, seed);
        }
}
END_TEST

START_TEST(lcache_ring_q8_answers_like_the_ring_layer)
{
    /* int8 storage (issue 40): groups, verify spill slots and settles give
     * the ring layer's own bits in every mode */
    for (int m = KV_MODE_Q8K; m <= KV_MODE_Q8; m++)
        for (uint32_t w = 3; w <= 9; w += 6)
            for (uint64_t seed = 0; seed < 3; seed++) {
                lcache_config cfg = cfg_ring_q8(w, (kv_mode)m);
                run_schedule(&cfg, seed);
            }
}
END_TEST

/* ---- bookkeeping and refusals -------------------------------------------------- */

static void fill(float *x, size_t n, uint64_t seed)
{
    pd_rng r = {.s = seed};
    pd_rng_fill(&r, x, n, -1, 1);
}

/* Both kinds: a prefill of 5 then [decode 5, verify 6, verify 7]: position 8,
 * 3 rows pending; a kv layer may roll back 3 of them (max_drafts + 1 = 4 >
 * pending), a ring its 2 verify rows. */
START_TEST(lcache_positions_pending_and_rollback_limits)
{
    for (int kind = 0; kind < LCACHE_KIND_COUNT; kind++) {
        lcache_config cfg = kind == LCACHE_KIND_RING ? cfg_ring(4) : cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_NONE, 0, 0);
        cfg.prefill_rows = 5;
        lcache *c = make(&cfg);
        ck_assert_int_eq(lcache_kind_of(c), kind);
        ck_assert_uint_eq(lcache_position(c), 0);
        ck_assert_uint_eq(lcache_pending(c), 0);
        ck_assert_uint_eq(lcache_rollback_limit(c), 0);
        float k[8 * KVD], v[8 * KVD], q[8 * QD], o[8 * QD];
        fill(k, sizeof k / 4, 1);
        fill(v, sizeof v / 4, 2);
        fill(q, sizeof q / 4, 3);
        const uint8_t pre[5] = {0}, dv[3] = {LCACHE_ROLE_DECODE, LCACHE_ROLE_VERIFY, LCACHE_ROLE_VERIFY};
        lc_group(c, 0, pre, 5, k, v, q, o);
        ck_assert_uint_eq(lcache_position(c), 5);
        lc_group(c, 5, dv, 3, k, v, q, o);
        lcache_check(c);
        ck_assert_uint_eq(lcache_position(c), 8);
        ck_assert_uint_eq(lcache_pending(c), 3);
        ck_assert_uint_eq(lcache_rollback_limit(c), kind == LCACHE_KIND_RING ? 2 : 3);
        pd_err e = {0};
        /* refused settles change nothing */
        ck_assert_int_eq(lcache_settle(c, 9, &e), PD_ERR_RANGE);
        ck_assert_int_eq(lcache_settle(c, kind == LCACHE_KIND_RING ? 5 : 4, &e), PD_ERR_RANGE);
        ck_assert_uint_eq(lcache_position(c), 8);
        ck_assert_uint_eq(lcache_pending(c), 3);
        /* one draft accepted: position 7, nothing pending, twice is once */
        ck_assert_int_eq(lcache_settle(c, 7, &e), PD_OK);
        ck_assert_int_eq(lcache_settle(c, 7, &e), PD_OK);
        lcache_check(c);
        ck_assert_uint_eq(lcache_position(c), 7);
        ck_assert_uint_eq(lcache_pending(c), 0);
        ck_assert_uint_eq(lcache_rollback_limit(c), 0);
        ck_assert_int_eq(lcache_settle(c, 6, &e), PD_ERR_RANGE);
        if (kind == LCACHE_KIND_RING)
            ck_assert_uint_eq(ring_layer_position(lcache_ring(c)), 7);
        else
            ck_assert_uint_eq(kv_layer_rows(lcache_kv(c)), 7);
        lcache_free(c);
    }
}
END_TEST

/* Attending by KV-head ranges (lcache_attend_heads, what a layer does when
 * one stream's rows would otherwise attend on one thread) gives the bits of
 * whole-row attends, for f32 and q8 storage, a window, and a group of
 * decode and verify rows after a prefill group; the ranges run in reverse
 * order and the rows backwards (they change nothing, so any order is
 * allowed). Refusals: a ring and an importance-tracking kv layer attend whole
 * rows; no open group, a group already attended by rows, a row or a range out
 * of bounds, no scratch (PD_ERR_ARG) or too little (PD_ERR_RANGE). */
START_TEST(lcache_attend_heads_equal_whole_rows)
{
    enum { P = 9, D = 3, N = P + D };
    float k[N * KVD], v[N * KVD], q[N * QD], whole[N * QD], byh[N * QD];
    fill(k, sizeof k / 4, 21);
    fill(v, sizeof v / 4, 22);
    fill(q, sizeof q / 4, 23);
    const uint8_t pre[P] = {0}, dv[D] = {LCACHE_ROLE_DECODE, LCACHE_ROLE_VERIFY, LCACHE_ROLE_VERIFY};
    const lcache_config cfgs[] = {cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_NONE, 0, 0),
                                  cfg_kv(KV_MODE_Q8, 0, LCACHE_EVICT_NONE, 0, 0),
                                  cfg_kv(KV_MODE_F32, 5, LCACHE_EVICT_NONE, 0, 0),
                                  cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_RECENT, 8, 0)};
    pd_err e = {0};
    for (size_t ci = 0; ci < sizeof cfgs / sizeof cfgs[0]; ci++) {
        lcache *a = make(&cfgs[ci]), *b = make(&cfgs[ci]);
        ck_assert_int_eq(lcache_attend_splits(b), 1);
        memset(whole, 0, sizeof whole);
        memset(byh, 0xff, sizeof byh);
        lc_group(a, 0, pre, P, k, v, q, whole);
        lc_group(a, P, dv, D, k + P * KVD, v + P * KVD, q + P * QD, whole + P * QD);
        const struct { uint64_t pos; const uint8_t *roles; uint32_t n; uint32_t r0; } gs[] = {{0, pre, P, 0},
                                                                                               {P, dv, D, P}};
        for (int gi = 0; gi < 2; gi++) {
            lcache_group g = {.pos = gs[gi].pos, .n = gs[gi].n, .roles = gs[gi].roles};
            ck_assert_int_eq(lcache_attend_heads(b, 0, 0, NKV, q, byh, whole, sizeof whole / 4, &e), PD_ERR_ARG);
            ck_assert_msg(lcache_append(b, &g, k + gs[gi].r0 * KVD, v + gs[gi].r0 * KVD, &e) == PD_OK, "%s", e.msg);
            size_t need = lcache_attend_heads_scratch(b);
            ck_assert_uint_gt(need, 0);
            float *scr = malloc(need * sizeof *scr);
            const float *qg = q + gs[gi].r0 * QD;
            float *og = byh + gs[gi].r0 * QD;
            ck_assert_int_eq(lcache_attend_heads(b, gs[gi].n, 0, NKV, qg, og, scr, need, &e), PD_ERR_ARG);
            ck_assert_int_eq(lcache_attend_heads(b, 0, 1, 1, qg, og, scr, need, &e), PD_ERR_ARG);
            ck_assert_int_eq(lcache_attend_heads(b, 0, 0, NKV + 1, qg, og, scr, need, &e), PD_ERR_ARG);
            ck_assert_int_eq(lcache_attend_heads(b, 0, 0, NKV, qg, og, NULL, need, &e), PD_ERR_ARG);
            ck_assert_int_eq(lcache_attend_heads(b, gs[gi].n - 1, 0, NKV, qg, og, scr, 8, &e), PD_ERR_RANGE);
            for (uint32_t h = NKV; h-- > 0;)
                for (uint32_t j = gs[gi].n; j-- > 0;)
                    ck_assert_msg(lcache_attend_heads(b, j, h, h + 1, qg + j * QD, og + j * QD, scr, need, &e) ==
                                      PD_OK,
                                  "%s", e.msg);
            free(scr);
            ck_assert_msg(lcache_end(b, &e) == PD_OK, "%s", e.msg);
            lcache_check(b);
        }
        ck_assert_msg(memcmp(whole, byh, sizeof whole) == 0, "config %zu: by heads != whole rows", ci);
        ck_assert_uint_eq(lcache_position(a), lcache_position(b));
        assert_kv_equal(lcache_kv(a), lcache_kv(b), "after attends by heads");
        /* a group attended by rows refuses head ranges */
        lcache_group g = {.pos = N, .n = 1, .roles = dv};
        ck_assert_int_eq(lcache_append(b, &g, k, v, &e), PD_OK);
        ck_assert_int_eq(lcache_attend(b, 0, q, byh, &e), PD_OK);
        ck_assert_int_eq(lcache_attend_heads(b, 0, 0, NKV, q, byh, whole, sizeof whole / 4, &e), PD_ERR_ARG);
        ck_assert_int_eq(lcache_end(b, &e), PD_OK);
        lcache_free(a);
        lcache_free(b);
    }
    const lcache_config whole_only[] = {cfg_ring(4), cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_IMPORTANCE, 8, 2)};
    for (size_t ci = 0; ci < 2; ci++) {
        lcache *c = make(&whole_only[ci]);
        ck_assert_int_eq(lcache_attend_splits(c), 0);
        lcache_group g = {.pos = 0, .n = P, .roles = pre};
        ck_assert_int_eq(lcache_append(c, &g, k, v, &e), PD_OK);
        e = (pd_err){0}; /* the first failure sticks: forget the ones above */
        ck_assert_int_eq(lcache_attend_heads(c, 0, 0, NKV, q, byh, whole, sizeof whole / 4, &e), PD_ERR_ARG);
        ck_assert_msg(strstr(e.msg, ci ? "importance" : "ring") != NULL, "%s", e.msg);
        ck_assert_int_eq(lcache_end(c, &e), PD_OK);
        lcache_free(c);
    }
}
END_TEST

START_TEST(lcache_refuses_bad_groups_and_calls_and_changes_nothing)
{
    for (int kind = 0; kind < LCACHE_KIND_COUNT; kind++) {
        const int ring = kind == LCACHE_KIND_RING;
        lcache_config cfg = ring ? cfg_ring(4) : cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_NONE, 0, 0);
        cfg.prefill_rows = 3;
        cfg.max_drafts = 2;
        lcache *c = make(&cfg);
        float k[8 * KVD], v[8 * KVD], q[8 * QD], o[8 * QD];
        fill(k, sizeof k / 4, 4);
        fill(v, sizeof v / 4, 5);
        fill(q, sizeof q / 4, 6);
        const uint8_t pre[3] = {0}, dec[1] = {LCACHE_ROLE_DECODE};
        lc_group(c, 0, pre, 3, k, v, q, o);
        lc_group(c, 3, dec, 1, k, v, q, o);
        struct {
            const char *name;
            uint64_t pos;
            uint8_t roles[5];
            uint32_t n, row;
            int ring_only;
            pd_status want;
        } bad[] = {
            {"empty group", 4, {0}, 0, 0, 0, PD_ERR_FORMAT},
            {"skips ahead", 5, {LCACHE_ROLE_DECODE}, 1, 0, 0, PD_ERR_FORMAT},
            {"rolls back past what may be", 2, {LCACHE_ROLE_PREFILL}, 1, 0, 0, PD_ERR_RANGE},
            {"unknown role", 4, {LCACHE_ROLE_DECODE, LCACHE_ROLE_COUNT}, 2, 1, 0, PD_ERR_FORMAT},
            {"prefill after decode", 4, {LCACHE_ROLE_DECODE, LCACHE_ROLE_PREFILL}, 2, 1, 0, PD_ERR_FORMAT},
            {"decode after verify", 4, {LCACHE_ROLE_DECODE, LCACHE_ROLE_VERIFY, LCACHE_ROLE_DECODE}, 3, 2, 1,
             PD_ERR_FORMAT},
            {"too many verify rows", 4,
             {LCACHE_ROLE_DECODE, LCACHE_ROLE_VERIFY, LCACHE_ROLE_VERIFY, LCACHE_ROLE_VERIFY}, 4, 3, 1,
             PD_ERR_FORMAT},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            if (bad[i].ring_only && !ring)
                continue;
            lcache_group g = {.pos = bad[i].pos, .n = bad[i].n, .roles = bad[i].roles};
            pd_err e = {0};
            uint32_t row = 99;
            ck_assert_msg(lcache_group_check(c, &g, &row, &e) == bad[i].want, "%s: %s", bad[i].name, e.msg);
            if (bad[i].n)
                ck_assert_msg(row == bad[i].row, "%s: row %u", bad[i].name, row);
            pd_err_clear(&e);
            ck_assert_int_eq(lcache_append(c, &g, k, v, &e), bad[i].want);
            ck_assert_int_eq(lcache_group_open(c), 0);
            ck_assert_uint_eq(lcache_position(c), 4);
            ck_assert_uint_eq(lcache_pending(c), 1);
            lcache_check(c);
        }
        /* a verify row right after prefill rows: the ring refuses, kv takes it */
        {
            lcache_config c2 = cfg;
            lcache *f = make(&c2);
            const uint8_t pv[4] = {LCACHE_ROLE_PREFILL, LCACHE_ROLE_PREFILL, LCACHE_ROLE_PREFILL, LCACHE_ROLE_VERIFY};
            lcache_group g = {.pos = 0, .n = 4, .roles = pv};
            uint32_t row = 0;
            pd_err e = {0};
            ck_assert_int_eq(lcache_group_check(f, &g, &row, &e), ring ? PD_ERR_FORMAT : PD_OK);
            if (ring)
                ck_assert_uint_eq(row, 3);
            lcache_free(f);
        }
        /* call order: attend and end need an open group, rows in increasing order */
        pd_err e = {0};
        ck_assert_int_eq(lcache_attend(c, 0, q, o, &e), PD_ERR_ARG);
        ck_assert_int_eq(lcache_end(c, &e), PD_OK);
        const uint8_t dd[2] = {LCACHE_ROLE_DECODE, LCACHE_ROLE_DECODE};
        lcache_group g = {.pos = 4, .n = 2, .roles = dd};
        ck_assert_int_eq(lcache_append(c, &g, k, v, &e), PD_OK);
        ck_assert_int_eq(lcache_append(c, &g, k, v, &e), PD_ERR_ARG);
        ck_assert_int_eq(lcache_settle(c, 4, &e), PD_ERR_ARG);
        ck_assert_int_eq(lcache_attend(c, 1, q, o, &e), PD_OK);
        ck_assert_int_eq(lcache_attend(c, 0, q, o, &e), PD_ERR_ARG);
        ck_assert_int_eq(lcache_attend(c, 2, q, o, &e), PD_ERR_ARG);
        lcache_check(c);
        ck_assert_int_eq(lcache_end(c, &e), PD_OK);
        ck_assert_uint_eq(lcache_position(c), 6);
        /* a skipped row still enters the cache */
        if (ring)
            ck_assert_uint_eq(ring_layer_position(lcache_ring(c)), 6);
        else
            ck_assert_uint_eq(kv_layer_rows(lcache_kv(c)), 6);
        lcache_check(c);
        lcache_free(c);
    }
}
END_TEST

START_TEST(lcache_refuses_contradictory_configurations)
{
    lcache_config ok = cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_NONE, 0, 0);
    struct {
        const char *name;
        lcache_config c;
    } bad[] = {
        {"kind", ok}, {"heads", ok}, {"prefill", ok}, {"budget", ok}, {"ring mode", cfg_ring(4)},
        {"ring evict", cfg_ring(4)}, {"ring window 0", cfg_ring(4)}, {"window + evict", ok}, {"q per kv", ok},
    };
    bad[0].c.kind = LCACHE_KIND_COUNT;
    bad[1].c.n_kv_heads = 0;
    bad[2].c.prefill_rows = 0;
    bad[3].c.evict = LCACHE_EVICT_RECENT;
    bad[4].c.mode = KV_MODE_COUNT;
    bad[5].c.evict = LCACHE_EVICT_RECENT;
    bad[5].c.evict_budget = 4;
    bad[6].c.window = 0;
    bad[7].c.window = 8;
    bad[7].c.evict = LCACHE_EVICT_RECENT;
    bad[7].c.evict_budget = 4;
    bad[8].c.q_per_kv = 0;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        lcache *c = (lcache *)&ok; /* must stay untouched */
        pd_err e = {0};
        ck_assert_msg(lcache_new(&bad[i].c, &c, &e) == PD_ERR_ARG, "%s accepted", bad[i].name);
        ck_assert_ptr_eq(c, (lcache *)&ok);
    }
    lcache_free(NULL);
}
END_TEST

/* The figures are the implementation's, plus the container's handle. */
START_TEST(lcache_bytes_estimate_is_what_a_new_container_holds)
{
    /* the admission budget reserves this: it must equal the real allocation
     * for every kind, mode, window and eviction, before and after a decode */
    const lcache_config cfgs[] = {
        cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_NONE, 0, 0),     cfg_kv(KV_MODE_Q8, 0, LCACHE_EVICT_NONE, 0, 0),
        cfg_kv(KV_MODE_Q8K, 0, LCACHE_EVICT_NONE, 0, 0),     cfg_kv(KV_MODE_Q8V, 8, LCACHE_EVICT_NONE, 0, 0),
        cfg_kv(KV_MODE_F32, 0, LCACHE_EVICT_IMPORTANCE, 16, 2), cfg_kv(KV_MODE_Q8, 0, LCACHE_EVICT_RECENT, 9, 0),
        cfg_ring(4),                                          cfg_ring(32),
        cfg_ring_q8(4, KV_MODE_Q8),                           cfg_ring_q8(32, KV_MODE_Q8V),
    };
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0] + 2; i++) {
        /* and asynchronous eviction, whose replay scratch is counted too */
        lcache_config cfg = i < sizeof cfgs / sizeof cfgs[0] ? cfgs[i]
                            : cfg_kv(KV_MODE_F32, 0, i % 2 ? LCACHE_EVICT_RECENT : LCACHE_EVICT_IMPORTANCE, 9, 2);
        if (i >= sizeof cfgs / sizeof cfgs[0])
            cfg.undo_rows = 8;
        cfg.prefill_rows = 6;
        lcache *c = make(&cfg);
        lcache_mem m;
        lcache_memory(c, &m);
        ck_assert_msg(lcache_bytes_estimate(&cfg) == m.allocated, "config %zu: estimate %llu, allocated %llu", i,
                      (unsigned long long)lcache_bytes_estimate(&cfg), (unsigned long long)m.allocated);
        float k[6 * KVD], v[6 * KVD], q[6 * QD], o[6 * QD];
        fill(k, sizeof k / 4, 7);
        fill(v, sizeof v / 4, 8);
        fill(q, sizeof q / 4, 9);
        const uint8_t pre[6] = {0};
        lc_group(c, 0, pre, 6, k, v, q, o);
        lcache_memory(c, &m);
        ck_assert_msg(m.allocated <= lcache_bytes_estimate(&cfg), "config %zu grew past its estimate", i);
        lcache_free(c);
    }
}
END_TEST

START_TEST(lcache_memory_is_the_implementations)
{
    for (int kind = 0; kind < LCACHE_KIND_COUNT; kind++) {
        lcache_config cfg = kind == LCACHE_KIND_RING ? cfg_ring(4) : cfg_kv(KV_MODE_Q8, 0, LCACHE_EVICT_NONE, 0, 0);
        cfg.prefill_rows = 6;
        lcache *c = make(&cfg);
        float k[6 * KVD], v[6 * KVD], q[6 * QD], o[6 * QD];
        fill(k, sizeof k / 4, 7);
        fill(v, sizeof v / 4, 8);
        fill(q, sizeof q / 4, 9);
        const uint8_t pre[6] = {0};
        lc_group(c, 0, pre, 6, k, v, q, o);
        lcache_mem m;
        lcache_memory(c, &m);
        uint64_t alloc, live;
        if (kind == LCACHE_KIND_RING) {
            ring_layer_mem rm;
            ring_layer_mem_get(lcache_ring(c), &rm);
            alloc = rm.allocated;
            live = rm.live;
        } else {
            kv_memory km;
            kv_layer_memory(lcache_kv(c), &km);
            alloc = km.allocated;
            live = km.attention + km.recurrent;
        }
        ck_assert_uint_gt(m.allocated, alloc);
        ck_assert_uint_lt(m.allocated, alloc + 1024);
        ck_assert_uint_eq(m.live, live);
        ck_assert_uint_gt(live, 0);
        ck_assert_uint_gt(lcache_bytes_estimate(&cfg), 0);
        lcache_free(c);
    }
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("layer_cache");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, lcache_kv_answers_like_the_kv_layer);
    tcase_add_test(tc, lcache_ring_answers_like_the_ring_layer);
    tcase_add_test(tc, lcache_eviction_verify_groups_equal_sequential_steps);
    tcase_add_test(tc, lcache_async_eviction_equals_sequential_steps);
    tcase_add_test(tc, lcache_ring_q8_answers_like_the_ring_layer);
    tcase_add_test(tc, lcache_positions_pending_and_rollback_limits);
    tcase_add_test(tc, lcache_refuses_bad_groups_and_calls_and_changes_nothing);
    tcase_add_test(tc, lcache_attend_heads_equal_whole_rows);
    tcase_add_test(tc, lcache_refuses_contradictory_configurations);
    tcase_add_test(tc, lcache_memory_is_the_implementations);
    tcase_add_test(tc, lcache_bytes_estimate_is_what_a_new_container_holds);
    suite_add_tcase(s, tc);
    return s;
}
