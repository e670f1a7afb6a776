/* kv_layer: the seed's LayerKvCache tests (layout, dead heads, eviction,
 * q8 grid, grouped == per-head, sinks, windows, sliding tail, generation)
 * plus the speculation exactness rules, memory figures, the state view /
 * install API and randomized sequences checked after every mutation. */
#include "pd_test.h"

#include "cache/attn.h"
#include "base/cpu.h"
#include "cache/kv_layer.h"
#include "cache/quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MAXH 8
#define MAXD 64

/* ---- helpers -------------------------------------------------------------- */

/* Deterministic value in [-1, 1) for (position, index, salt) (the seed's swa_row). */
static float swa(uint64_t p, uint64_t i, uint64_t salt)
{
    return (float)((p * 7919 + i * 104729 + salt * 1299709) % 2003) / 1001.5f - 1.0f;
}

static void swa_fill(float *dst, uint64_t p, uint32_t n, uint64_t salt)
{
    for (uint32_t i = 0; i < n; i++)
        dst[i] = swa(p, i, salt);
}

/* An allocator that counts live bytes and calls, and can fail on demand. */
typedef struct cnt_alloc {
    pd_alloc a;
    long long live;
    long long calls;
    long long fail_at; /* -1: never; else the call index that fails (and all later) */
} cnt_alloc;

static void *cnt_alloc_fn(void *ctx, size_t bytes)
{
    cnt_alloc *c = ctx;
    if (c->fail_at >= 0 && c->calls >= c->fail_at)
        return NULL;
    c->calls++;
    void *p = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (p)
        c->live += (long long)bytes;
    return p;
}

static void cnt_free_fn(void *ctx, void *p, size_t bytes)
{
    cnt_alloc *c = ctx;
    c->live -= (long long)bytes;
    free(p);
}

static void cnt_init(cnt_alloc *c)
{
    *c = (cnt_alloc){.a = {.alloc = cnt_alloc_fn, .free = cnt_free_fn, .ctx = c}, .fail_at = -1};
}

static kv_layer *mk(kv_layer_config cfg)
{
    kv_layer *l = NULL;
    pd_err e = {0};
    ck_assert_msg(kv_layer_new(&cfg, &l, &e) == PD_OK, "kv_layer_new: %s", e.msg);
    ck_assert_ptr_nonnull(l);
    kv_layer_check(l);
    return l;
}

static void app(kv_layer *l, const float *k, const float *v)
{
    pd_err e = {0};
    ck_assert_msg(kv_layer_append(l, k, v, &e) == PD_OK, "append: %s", e.msg);
    kv_layer_check(l);
}

/* Appends position p of the seed's synthetic rows (salts sk, sv). */
static void app_swa(kv_layer *l, uint32_t n_kv, uint32_t hd, uint64_t p, uint64_t sk, uint64_t sv)
{
    float k[MAXH * MAXD], v[MAXH * MAXD];
    swa_fill(k, p, n_kv * hd, sk);
    swa_fill(v, p, n_kv * hd, sv);
    app(l, k, v);
}

static void trunc_ok(kv_layer *l, uint64_t n)
{
    pd_err e = {0};
    ck_assert_msg(kv_layer_truncate_last(l, n, &e) == PD_OK, "truncate: %s", e.msg);
    kv_layer_check(l);
}

/* One attend; returns the span. */
static uint32_t att(kv_layer *l, uint32_t kvh, uint32_t q0, uint32_t nq, const float *q, float scale,
                    float softcap, uint32_t first, uint32_t upto, int track, float *out,
                    float *probs)
{
    kv_attend a = {.kv_head = kvh, .q_head0 = q0, .n_q = nq, .q = q, .scale = scale,
                   .softcap = softcap, .first = first, .upto = upto, .track_imp = track,
                   .out = out, .probs = probs};
    uint32_t span = 0;
    pd_err e = {0};
    ck_assert_msg(kv_layer_attend(l, &a, &span, &e) == PD_OK, "attend: %s", e.msg);
    kv_layer_check(l);
    return span;
}

static int same_bits(const float *a, const float *b, size_t n)
{
    return n == 0 || memcmp(a, b, n * sizeof(float)) == 0;
}

/* Byte comparison of everything kv_layer_state shows (not the generation),
 * plus the folded importance view. */
static void assert_same_state(const kv_layer *a, const kv_layer *b)
{
    kv_state sa, sb;
    kv_head_state ha[MAXH], hb[MAXH];
    kv_layer_state(a, &sa, ha);
    kv_layer_state(b, &sb, hb);
    ck_assert_uint_eq(sa.n_kv_heads, sb.n_kv_heads);
    ck_assert_uint_eq(sa.head_dim, sb.head_dim);
    ck_assert_int_eq(sa.mode, sb.mode);
    ck_assert_uint_eq(sa.rows, sb.rows);
    ck_assert_uint_eq(sa.base, sb.base);
    ck_assert_uint_eq(sa.tail_window, sb.tail_window);
    ck_assert_int_eq(sa.frozen, sb.frozen);
    ck_assert_uint_eq(sa.n_imp, sb.n_imp);
    ck_assert_uint_eq(sa.imp_pending, sb.imp_pending);
    ck_assert_uint_eq(sa.n_linear, sb.n_linear);
    ck_assert_int_eq(sa.has_bounded, sb.has_bounded);
    const uint64_t rows = sa.rows, hd = sa.head_dim;
    const uint64_t ngk = (hd + sa.k_group - 1) / sa.k_group;
    ck_assert(same_bits(sa.imp, sb.imp, rows));
    for (uint32_t h = 0; h < sa.n_kv_heads; h++) {
        ck_assert_int_eq(sa.alive[h], sb.alive[h]);
        const kv_head_state *x = &ha[h], *y = &hb[h];
        if (rows) {
            ck_assert_int_eq(x->k == NULL, y->k == NULL);
            ck_assert_int_eq(x->kq == NULL, y->kq == NULL);
            ck_assert_int_eq(x->v == NULL, y->v == NULL);
            ck_assert_int_eq(x->vq == NULL, y->vq == NULL);
        }
        ck_assert_int_eq(x->kcol == NULL, y->kcol == NULL);
        ck_assert_int_eq(x->vcol == NULL, y->vcol == NULL);
        if (rows && x->k)
            ck_assert_msg(same_bits(x->k, y->k, rows * hd), "head %u K", h);
        if (rows && x->v)
            ck_assert_msg(same_bits(x->v, y->v, rows * hd), "head %u V", h);
        if (rows && x->kq) {
            ck_assert_msg(memcmp(x->kq, y->kq, rows * hd) == 0, "head %u Kq", h);
            ck_assert_msg(same_bits(x->ks, y->ks, rows * ngk), "head %u Ks", h);
        }
        if (rows && x->vq) {
            ck_assert_msg(memcmp(x->vq, y->vq, rows * hd) == 0, "head %u Vq", h);
            ck_assert_msg(same_bits(x->vs, y->vs, rows), "head %u Vs", h);
        }
        if (x->kcol)
            ck_assert(same_bits(x->kcol, y->kcol, hd));
        if (x->vcol)
            ck_assert(same_bits(x->vcol, y->vcol, hd));
    }
    ck_assert(same_bits(sa.linear, sb.linear, sa.n_linear));
    if (sa.has_bounded) {
        ck_assert_uint_eq(sa.bounded.window, sb.bounded.window);
        ck_assert_uint_eq(sa.bounded.len, sb.bounded.len);
        ck_assert_uint_eq(sa.bounded.head, sb.bounded.head);
        size_t n = (size_t)sa.n_kv_heads * sa.bounded.window * hd;
        ck_assert(same_bits(sa.bounded.k, sb.bounded.k, n));
        ck_assert(same_bits(sa.bounded.v, sb.bounded.v, n));
    }
    float *ia = calloc(rows + 1, sizeof(float)), *ib = calloc(rows + 1, sizeof(float));
    kv_layer_importance(a, ia);
    kv_layer_importance(b, ib);
    ck_assert_msg(same_bits(ia, ib, rows), "folded importance");
    free(ia);
    free(ib);
}

/* A copy of l through the state API (confirming l first). */
static kv_layer *clone_layer(kv_layer *l, const kv_layer_config *cfg)
{
    kv_layer_confirm(l, kv_layer_pos_len(l));
    kv_state s;
    kv_head_state hs[MAXH];
    kv_layer_state(l, &s, hs);
    kv_layer *c = NULL;
    pd_err e = {0};
    ck_assert_msg(kv_layer_new_from_state(cfg, &s, &c, &e) == PD_OK, "from_state: %s", e.msg);
    kv_layer_check(c);
    return c;
}

/* The per-head K row r of head h as stored (f32 layers only). */
static const float *head_k(const kv_layer *l, uint32_t h)
{
    kv_state s;
    kv_head_state hs[MAXH];
    kv_layer_state(l, &s, hs);
    return hs[h].k;
}

static const float *head_v(const kv_layer *l, uint32_t h)
{
    kv_state s;
    kv_head_state hs[MAXH];
    kv_layer_state(l, &s, hs);
    return hs[h].v;
}

static const kv_mode all_modes[] = {KV_MODE_F32, KV_MODE_Q8K, KV_MODE_Q8V, KV_MODE_Q8};

/* ---- seed: layout, dead heads, rollback, eviction ----------------------- */

START_TEST(kv_append_tracks_rows_and_head_major_layout)
{
    kv_layer *l = mk((kv_layer_config){.n_kv_heads = 4, .head_dim = 8});
    ck_assert_uint_eq(kv_layer_rows(l), 0);
    float k[32], v[32];
    for (int i = 0; i < 32; i++) {
        k[i] = (float)i;
        v[i] = 2.0f;
    }
    app(l, k, v);
    ck_assert_uint_eq(kv_layer_rows(l), 1);
    ck_assert_uint_eq(kv_layer_pos_len(l), 1);
    /* head 1's block is contiguous and equals its part of the row */
    ck_assert(same_bits(head_k(l, 1), k + 8, 8));
    ck_assert(same_bits(head_v(l, 3), v + 24, 8));
    for (int i = 0; i < 32; i++)
        k[i] = (float)(100 + i);
    app(l, k, v);
    ck_assert_float_eq(head_k(l, 1)[8], 108.0f); /* row 1 follows row 0 in head 1's block */
    kv_memory m;
    kv_layer_memory(l, &m);
    /* 2 rows x (4 heads x 2 x 8 floats + 1 importance float) */
    ck_assert_uint_eq(m.attention, 2 * (256 + 4));
    ck_assert_uint_eq(m.recurrent, 0);
    kv_layer_free(l);
    kv_layer_free(NULL);
}
END_TEST

START_TEST(kv_dead_head_stores_nothing)
{
    const uint8_t alive[2] = {1, 0};
    kv_layer *l = mk((kv_layer_config){.n_kv_heads = 2, .head_dim = 4, .alive = alive});
    float k[8], v[8];
    for (int i = 0; i < 8; i++) {
        k[i] = 1.0f;
        v[i] = 2.0f;
    }
    app(l, k, v);
    app(l, k, v);
    ck_assert_uint_eq(kv_layer_rows(l), 2);
    kv_state s;
    kv_head_state hs[2];
    kv_layer_state(l, &s, hs);
    ck_assert_ptr_nonnull(hs[0].k);
    ck_assert_ptr_null(hs[1].k);
    ck_assert_ptr_null(hs[1].v);
    ck_assert_ptr_null(hs[1].kq);
    kv_memory m;
    kv_layer_memory(l, &m);
    ck_assert_uint_eq(m.attention, 2 * 2 * 4 * 4 + 2 * 4);
    /* attending the dead head sees no row */
    float q[4] = {1, 1, 1, 1}, out[4] = {9, 9, 9, 9};
    ck_assert_uint_eq(att(l, 1, 0, 1, q, 0, 0, 0, 0, 1, out, NULL), 0);
    for (int d = 0; d < 4; d++)
        ck_assert_float_eq(out[d], 0.0f);
    kv_layer_free(l);
}
END_TEST

START_TEST(kv_truncate_rolls_back_speculative_rows)
{
    kv_layer *l = mk((kv_layer_config){.n_kv_heads = 2, .head_dim = 4});
    for (int p = 0; p < 5; p++) {
        float k[8], v[8];
        for (int i = 0; i < 8; i++)
            k[i] = v[i] = (float)p;
        app(l, k, v);
    }
    trunc_ok(l, 2);
    ck_assert_uint_eq(kv_layer_rows(l), 3);
    ck_assert_float_eq(head_k(l, 0)[2 * 4], 2.0f); /* row 2 survives */
    /* more than stored: refused, nothing changes */
    pd_err e = {0};
    uint64_t g = kv_layer_generation(l);
    ck_assert_int_eq(kv_layer_truncate_last(l, 4, &e), PD_ERR_RANGE);
    ck_assert_uint_eq(kv_layer_rows(l), 3);
    ck_assert_uint_eq(kv_layer_generation(l), g);
    kv_layer_free(l);
}
END_TEST

START_TEST(kv_evict_recent_keeps_last_rows)
{
    kv_layer *l = mk((kv_layer_config){.n_kv_heads = 4, .head_dim = 8});
    for (int p = 0; p < 8; p++) {
        float k[32], v[32];
        for (int i = 0; i < 32; i++) {
            k[i] = (float)p;
            v[i] = (float)p + 100.0f;
        }
        app(l, k, v);
    }
    uint64_t g = kv_layer_generation(l);
    ck_assert_uint_eq(kv_layer_evict_recent(l, 8), 0);
    ck_assert_uint_eq(kv_layer_generation(l), g);
    ck_assert_uint_eq(kv_layer_evict_recent(l, 4), 4);
    kv_layer_check(l);
    ck_assert_uint_ne(kv_layer_generation(l), g);
    ck_assert_uint_eq(kv_layer_rows(l), 4);
    for (int r = 0; r < 4; r++) {
        ck_assert_float_eq(head_k(l, 3)[r * 8], (float)(4 + r));
        ck_assert_float_eq(head_v(l, 3)[r * 8 + 7], (float)(104 + r));
    }
    kv_layer_free(l);
}
END_TEST

START_TEST(kv_evict_importance_keeps_high_mass_row)
{
    /* 8 rows whose keys carry their index; importance peaked at row 3. */
    for (int via_attend = 0; via_attend < 2; via_attend++) {
        kv_layer *l = mk((kv_layer_config){.n_kv_heads = 1, .head_dim = 2});
        for (int p = 0; p < 8; p++) {
            float k[2] = {(float)p, (float)p}, v[2] = {p + 100.0f, p + 100.0f};
            if (via_attend) { /* row 3's key alone points along the query */
                k[0] = p == 3 ? 40.0f : 0.0f;
                k[1] = (float)p;
            }
            app(l, k, v);
        }
        if (via_attend) {
            float q[2] = {1.0f, 0.0f}, out[2];
            for (int i = 0; i < 3; i++)
                att(l, 0, 0, 1, q, 1.0f, 0, 0, 0, 1, out, NULL);
        } else {
            float mass[8] = {0.05f, 0.05f, 0.05f, 5.0f, 0.05f, 0.05f, 0.05f, 0.05f};
            pd_err e = {0};
            ck_assert_int_eq(kv_layer_add_importance(l, mass, &e), PD_OK);
        }
        float imp_before[8];
        kv_layer_importance(l, imp_before);
        ck_assert_uint_eq(kv_layer_evict_importance(l, 4, 1, 2), 4); /* sink 1 + recent 2 + 1 */
        kv_layer_check(l);
        ck_assert_uint_eq(kv_layer_rows(l), 4);
        const float *k = head_k(l, 0);
        const float *v = head_v(l, 0);
        const int want[4] = {0, 3, 6, 7};
        float imp[4];
        kv_layer_importance(l, imp);
        for (int j = 0; j < 4; j++) {
            ck_assert_float_eq(k[j * 2 + 1], (float)want[j]);
            ck_assert_float_eq(v[j * 2], (float)want[j] + 100.0f);
            /* importance stays aligned with the gathered rows */
            ck_assert_float_eq(imp[j], imp_before[want[j]]);
        }
        kv_layer_free(l);
    }
}
END_TEST

START_TEST(kv_evict_importance_never_exceeds_budget)
{
    kv_layer *l = mk((kv_layer_config){.n_kv_heads = 1, .head_dim = 4});
    for (int p = 0; p < 30; p++)
        app_swa(l, 1, 4, p, 1, 2);
    float mass[30];
    for (int i = 0; i < 30; i++)
        mass[i] = (float)((i * 7) % 11);
    ck_assert_int_eq(kv_layer_add_importance(l, mass, NULL), PD_OK);
    /* sinks + recent beyond the budget are clamped, sinks first */
    ck_assert_uint_eq(kv_layer_evict_importance(l, 5, 4, 9), 25);
    kv_layer_check(l);
    ck_assert_uint_eq(kv_layer_rows(l), 5);
    float k0[4];
    swa_fill(k0, 29, 4, 1); /* the 5th kept row is the newest: 4 sinks + 1 recent */
    ck_assert(same_bits(head_k(l, 0) + 4 * 4, k0, 4));
    swa_fill(k0, 3, 4, 1);
    ck_assert(same_bits(head_k(l, 0) + 3 * 4, k0, 4));
    /* budget 0 keeps nothing */
    ck_assert_uint_eq(kv_layer_evict_importance(l, 0, 2, 2), 5);
    kv_layer_check(l);
    ck_assert_uint_eq(kv_layer_rows(l), 0);
    kv_layer_free(l);
}
END_TEST

START_TEST(kv_evict_importance_mixed_modes_stay_consistent)
{
    const kv_mode modes[2] = {KV_MODE_Q8V, KV_MODE_Q8K};
    for (int mi = 0; mi < 2; mi++) {
        kv_layer *l = mk((kv_layer_config){.n_kv_heads = 1, .head_dim = 4, .mode = modes[mi]});
        for (int p = 0; p < 80; p++) {
            float k[4], v[4];
            for (int i = 0; i < 4; i++) {
                k[i] = (float)p * 0.01f;
                v[i] = (float)p;
            }
            app(l, k, v);
        }
        ck_assert(kv_layer_frozen(l));
        float mass[80];
        for (int i = 0; i < 80; i++)
            mass[i] = (float)i;
        ck_assert_int_eq(kv_layer_add_importance(l, mass, NULL), PD_OK);
        kv_memory before, after;
        kv_layer_memory(l, &before);
        ck_assert_uint_eq(kv_layer_evict_importance(l, 20, 4, 8), 60);
        kv_layer_check(l);
        ck_assert_uint_eq(kv_layer_rows(l), 20);
        kv_layer_memory(l, &after);
        ck_assert_uint_lt(after.attention, before.attention / 2);
        /* kept K and V rows are the same rows: sinks 0..3, recent 72..79 and the
         * 8 heaviest middle rows 64..71 (importance = index) */
        kv_state s;
        kv_head_state hs[1];
        kv_layer_state(l, &s, hs);
        for (int j = 0; j < 20; j++) {
            int want = j < 4 ? j : 60 + j;
            float kk, vv;
            if (hs[0].k)
                kk = hs[0].k[j * 4];
            else
                kk = (float)hs[0].kq[j * 4] * hs[0].ks[j] * hs[0].kcol[0];
            if (hs[0].v)
                vv = hs[0].v[j * 4];
            else
                vv = (float)hs[0].vq[j * 4] * hs[0].vs[j] * hs[0].vcol[0];
            ck_assert_msg(fabsf(kk - want * 0.01f) <= 0.01f * want * 0.01f + 1e-4f,
                          "mode %d row %d: K %g", modes[mi], j, (double)kk);
            ck_assert_msg(fabsf(vv - (float)want) <= 0.01f * want + 1e-3f,
                          "mode %d row %d: V %g", modes[mi], j, (double)vv);
        }
        /* V from the kept tail, not stale rows */
        float q[4] = {1, 1, 1, 1}, out[4];
        att(l, 0, 0, 1, q, 0, 0, 0, 0, 0, out, NULL);
        ck_assert_msg(out[0] > 30.0f, "mode %d: out %g", modes[mi], (double)out[0]);
        kv_layer_free(l);
    }
}
END_TEST

/* ---- seed: attention ------------------------------------------------------ */

/* The seed's synthetic rows with channel structure (even channels x4). */
static void synth(float *dst, int p, int salt, int n)
{
    for (int i = 0; i < n; i++) {
        float x = (float)((i * 31 + p * 17 + salt * 7 + 3) % 97) / 97.0f - 0.5f;
        dst[i] = i % 2 == 0 ? x * 4.0f : x * 0.25f;
    }
}

START_TEST(kv_q8_attend_matches_f32_within_grid)
{
    enum { H = 2, D = 32, N = 100 };
    kv_layer *f = mk((kv_layer_config){.n_kv_heads = H, .head_dim = D});
    kv_layer *q8 = mk((kv_layer_config){.n_kv_heads = H, .head_dim = D, .mode = KV_MODE_Q8});
    for (int p = 0; p < N; p++) {
        float k[H * D], v[H * D];
        synth(k, p, 1, H * D);
        synth(v, p, 2, H * D);
        app(f, k, v);
        app(q8, k, v);
        ck_assert_int_eq(kv_layer_frozen(q8), p >= 64); /* frozen by the 65th append */
    }
    float q[D];
    for (int i = 0; i < D; i++)
        q[i] = (float)((i * 13 + 5) % 89) / 89.0f - 0.5f;
    for (uint32_t g = 0; g < H; g++) {
        float of[D], o8[D], pf[N], p8[N];
        att(f, g, 0, 1, q, 0, 0, 0, 0, 0, of, pf);
        att(q8, g, 0, 1, q, 0, 0, 0, 0, 0, o8, p8);
        float scale = 1e-6f;
        for (int d = 0; d < D; d++)
            scale = fmaxf(scale, fabsf(of[d]));
        for (int d = 0; d < D; d++)
            ck_assert_msg(fabsf(of[d] - o8[d]) <= scale * 0.03f + 1e-3f, "g%u d%d: %g vs %g", g, d,
                          (double)of[d], (double)o8[d]);
        for (int p = 0; p < N; p++)
            ck_assert_msg(fabsf(pf[p] - p8[p]) < 0.02f, "prob %d", p);
    }
    /* memory at equal rows: q8 below a third of f32 */
    {
        kv_memory mf, m8;
        trunc_ok(f, 30);
        trunc_ok(q8, 30);
        kv_layer_memory(f, &mf);
        kv_layer_memory(q8, &m8);
        ck_assert_uint_lt(m8.attention * 3, mf.attention);
    }
    /* rollback and eviction live on the q8 storage */
    ck_assert_uint_eq(kv_layer_rows(q8), 70);
    float mass[70];
    for (int i = 0; i < 70; i++)
        mass[i] = (float)i;
    ck_assert_int_eq(kv_layer_add_importance(q8, mass, NULL), PD_OK);
    kv_layer_evict_importance(q8, 20, 2, 8);
    kv_layer_check(q8);
    ck_assert_uint_eq(kv_layer_rows(q8), 20);
    float o[D];
    att(q8, 0, 0, 1, q, 0, 0, 0, 0, 0, o, NULL);
    for (int d = 0; d < D; d++)
        ck_assert(isfinite(o[d]));
    /* memory: q8 is about 1 byte per element plus scales (vs 4 for f32) */
    kv_memory mf, m8;
    trunc_ok(f, 50);
    kv_layer_memory(f, &mf);
    kv_layer_memory(q8, &m8);
    ck_assert_uint_eq(kv_layer_rows(f), kv_layer_rows(q8));
    ck_assert_uint_lt(m8.attention * 2, mf.attention);
    kv_layer_free(f);
    kv_layer_free(q8);
}
END_TEST

/* The freeze: col = RMS over the stored rows per channel (floor 1e-6 for a
 * silent channel), old rows requantized against it (their dequantized values
 * stay within the int8 grid of the originals), later rows quantized against
 * it. */
START_TEST(kv_freeze_field_is_channel_rms_with_floor)
{
    enum { D = 40, F = 6, NG = 2 };
    kv_layer *l = mk((kv_layer_config){.n_kv_heads = 1, .head_dim = D, .mode = KV_MODE_Q8,
                                       .freeze_rows = F});
    float rowsk[F + 3][D], rowsv[F + 3][D];
    for (int p = 0; p < F + 3; p++) {
        for (int d = 0; d < D; d++) {
            rowsk[p][d] = d == 5 ? 0.0f : swa(p, d, 1) * (d < 20 ? 8.0f : 0.5f);
            rowsv[p][d] = d == 7 ? 0.0f : swa(p, d, 2) * (d % 2 ? 3.0f : 0.1f);
        }
        app(l, rowsk[p], rowsv[p]);
        ck_assert_int_eq(kv_layer_frozen(l), p >= F);
    }
    /* the expected field and rows, derived with quant.h: pre-freeze rows
     * quantized without a field, dequantized, RMS per channel in row order */
    int8_t qk[F + 3][D], qv[F + 3][D];
    float sk[F + 3][NG], sv[F + 3][1], deq[D], kcol[D] = {0}, vcol[D] = {0};
    for (int p = 0; p < F; p++) {
        quant_q8_row(rowsk[p], NULL, D, 32, qk[p], sk[p]);
        quant_q8_row(rowsv[p], NULL, D, D, qv[p], sv[p]);
        quant_q8_row_dequant(qk[p], sk[p], NULL, D, 32, deq);
        for (int d = 0; d < D; d++)
            kcol[d] += deq[d] * deq[d];
        quant_q8_row_dequant(qv[p], sv[p], NULL, D, D, deq);
        for (int d = 0; d < D; d++)
            vcol[d] += deq[d] * deq[d];
    }
    for (int d = 0; d < D; d++) {
        kcol[d] = fmaxf(sqrtf(kcol[d] / (float)F), 1e-6f);
        vcol[d] = fmaxf(sqrtf(vcol[d] / (float)F), 1e-6f);
    }
    ck_assert_float_eq(kcol[5], 1e-6f); /* a silent channel gets the floor */
    ck_assert_float_eq(vcol[7], 1e-6f);
    for (int p = 0; p < F + 3; p++) {
        if (p < F) { /* retroactive: requantize the dequantized old row */
            quant_q8_row_dequant(qk[p], sk[p], NULL, D, 32, deq);
            quant_q8_row(deq, kcol, D, 32, qk[p], sk[p]);
            quant_q8_row_dequant(qv[p], sv[p], NULL, D, D, deq);
            quant_q8_row(deq, vcol, D, D, qv[p], sv[p]);
        } else {
            quant_q8_row(rowsk[p], kcol, D, 32, qk[p], sk[p]);
            quant_q8_row(rowsv[p], vcol, D, D, qv[p], sv[p]);
        }
    }
    kv_state s;
    kv_head_state hs[1];
    kv_layer_state(l, &s, hs);
    ck_assert(same_bits(hs[0].kcol, kcol, D));
    ck_assert(same_bits(hs[0].vcol, vcol, D));
    ck_assert(memcmp(hs[0].kq, qk, sizeof qk) == 0);
    ck_assert(memcmp(hs[0].vq, qv, sizeof qv) == 0);
    ck_assert(same_bits(hs[0].ks, &sk[0][0], (F + 3) * NG));
    ck_assert(same_bits(hs[0].vs, &sv[0][0], F + 3));
    /* and the result still dequantizes near the originals */
    for (int p = 0; p < F + 3; p++)
        for (int d = 0; d < D; d++) {
            float k = (float)qk[p][d] * sk[p][d / 32] * kcol[d];
            ck_assert_msg(fabsf(k - rowsk[p][d]) <= 0.2f, "row %d K[%d]", p, d);
        }
    kv_layer_free(l);
}
END_TEST

/* Grouped attend (all Q heads of a KV head in one pass) == per-head attend,
 * bit for bit, in every mode, with sinks, softcap, windows and upto; the
 * importance both leave behind is identical too. */
START_TEST(kv_grouped_attend_equals_per_head_bitexact_in_every_mode)
{
    enum { H = 2, D = 32, G = 3, N = 70 };
    for (int mi = 0; mi < 4; mi++) {
        kv_layer_config cfg = {.n_kv_heads = H, .head_dim = D, .mode = all_modes[mi],
                               .max_q_per_kv = G, .spec_depth = 64};
        kv_layer *a = mk(cfg), *b = mk(cfg);
        const float sinks[H * G] = {0.7f, -1.3f, 2.5f, 0.0f, -4.0f, 6.0f};
        for (int p = 0; p < N; p++) {
            float k[H * D], v[H * D];
            for (int i = 0; i < H * D; i++) {
                k[i] = (float)((i * 31 + p * 17 + 3) % 97) / 97.0f - 0.5f;
                v[i] = (float)((i * 13 + p * 29 + 7) % 89) / 89.0f - 0.5f;
            }
            app(a, k, v);
            app(b, k, v);
        }
        float q[H * G * D];
        for (int i = 0; i < H * G * D; i++)
            q[i] = (float)((i * 11 + 5) % 83) / 83.0f - 0.5f;
        const uint32_t firsts[4] = {0, 10, 0, 5}, uptos[4] = {0, 0, 33, 20};
        for (int with_sinks = 0; with_sinks < 2; with_sinks++) {
            if (with_sinks) {
                kv_layer_set_sinks(a, sinks, H * G, NULL);
                kv_layer_set_sinks(b, sinks, H * G, NULL);
            }
            for (int c = 0; c < 4; c++)
                for (int cap = 0; cap < 2; cap++)
                    for (uint32_t g = 0; g < H; g++) {
                        float out[G * D], pr[G * N], o1[D], p1[N];
                        uint32_t span = att(a, g, g * G, G, q + g * G * D, 0, cap ? 5.0f : 0,
                                            firsts[c], uptos[c], 1, out, pr);
                        for (uint32_t h = 0; h < G; h++) {
                            uint32_t s1 = att(b, g, g * G + h, 1, q + (g * G + h) * D, 0,
                                              cap ? 5.0f : 0, firsts[c], uptos[c], 1, o1, p1);
                            ck_assert_uint_eq(s1, span);
                            ck_assert_msg(same_bits(out + h * D, o1, D),
                                          "mode %d g%u h%u case %d: grouped != per-head",
                                          all_modes[mi], g, h, c);
                            ck_assert(same_bits(pr + h * span, p1, span));
                        }
                    }
        }
        assert_same_state(a, b);
        kv_layer_free(a);
        kv_layer_free(b);
    }
}
END_TEST

/* Learned sinks: the softmax over the visible rows plus a value-less sink
 * column, computed independently in f64, with windows and upto. */
START_TEST(kv_sinks_match_f64_reference_with_windows)
{
    enum { H = 2, D = 8, G = 3, N = 9 };
    kv_layer_config cfg = {.n_kv_heads = H, .head_dim = D, .max_q_per_kv = G};
    kv_layer *l = mk(cfg);
    float ks[N][H * D], vs[N][H * D];
    for (int r = 0; r < N; r++) {
        for (int i = 0; i < H * D; i++) {
            ks[r][i] = ((float)((r * 31 + i * 7 + 3) % 97) / 97.0f - 0.5f) * 2.0f;
            vs[r][i] = ((float)((r * 17 + i * 7 + 3) % 89) / 89.0f - 0.5f) * 2.0f;
        }
        app(l, ks[r], vs[r]);
    }
    float q[H * G * D];
    for (int i = 0; i < H * G * D; i++)
        q[i] = ((float)((i * 11 + 5) % 83) / 83.0f - 0.5f) * 3.0f;
    const float sinks[H * G] = {0.7f, -1.3f, 2.5f, 0.0f, -4.0f, 6.0f};
    ck_assert_int_eq(kv_layer_set_sinks(l, sinks, H * G, NULL), PD_OK);
    const float scale = 1.0f / sqrtf((float)D);
    const uint32_t uptos[4] = {1, 2, 5, 9};
    const int windows[3] = {0, 3, 1};
    int checked = 0;
    for (int u = 0; u < 4; u++)
        for (int w = 0; w < 3; w++) {
            uint32_t upto = uptos[u];
            uint32_t first = windows[w] && upto > (uint32_t)windows[w] ? upto - windows[w] : 0;
            for (uint32_t g = 0; g < H; g++) {
                kv_layer *c = clone_layer(l, &cfg);
                kv_layer_set_sinks(c, sinks, H * G, NULL);
                float out[G * D];
                att(c, g, g * G, G, q + g * G * D, scale, 0, first, upto, 1, out, NULL);
                double imp_ref[N] = {0};
                for (uint32_t h = 0; h < G; h++) {
                    const float *qh = q + (g * G + h) * D;
                    double z[N + 1], m = -INFINITY, sum = 0;
                    uint32_t nz = 0;
                    for (uint32_t r = first; r < upto; r++) {
                        double dot = 0;
                        for (int d = 0; d < D; d++)
                            dot += (double)qh[d] * ks[r][g * D + d];
                        z[nz++] = dot * scale;
                    }
                    z[nz++] = sinks[g * G + h];
                    for (uint32_t j = 0; j < nz; j++)
                        m = fmax(m, z[j]);
                    for (uint32_t j = 0; j < nz; j++)
                        sum += exp(z[j] - m);
                    for (int d = 0; d < D; d++) {
                        double want = 0;
                        for (uint32_t r = first; r < upto; r++)
                            want += exp(z[r - first] - m) / sum * vs[r][g * D + d];
                        ck_assert_msg(fabs(out[h * D + d] - want) < 2e-6,
                                      "upto %u first %u g%u h%u d%d: %g vs %g", upto, first, g, h,
                                      d, (double)out[h * D + d], want);
                    }
                    for (uint32_t r = first; r < upto; r++)
                        imp_ref[r] += exp(z[r - first] - m) / sum;
                    checked++;
                }
                float imp[N];
                kv_layer_importance(c, imp);
                float row_mass = 0;
                for (int r = 0; r < N; r++) {
                    ck_assert_msg(fabs(imp[r] - imp_ref[r]) < 2e-6, "imp row %d", r);
                    row_mass += imp[r];
                }
                ck_assert_msg(row_mass < (float)G, "the sinks absorb some mass");
                kv_layer_free(c);
            }
        }
    ck_assert_int_eq(checked, 4 * 3 * H * G);
    /* sink logits missing for the asked heads: refused, out untouched */
    float out[G * D] = {0};
    kv_attend a = {.kv_head = 1, .q_head0 = 4, .n_q = G, .q = q, .out = out};
    pd_err e = {0};
    ck_assert_int_eq(kv_layer_attend(l, &a, NULL, &e), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "sink"));
    kv_layer_free(l);
}
END_TEST

/* Scoring only the window's rows == the full row with -inf outside it, bit
 * for bit, output and importance; the reference is written out here with
 * attn.h's dot8 and exp. */
START_TEST(kv_windowed_attend_equals_masked_full_row)
{
    enum { D = 16, G = 2, N = 40 };
    kv_layer_config cfg = {.n_kv_heads = 1, .head_dim = D, .max_q_per_kv = G};
    kv_layer *l = mk(cfg);
    for (int r = 0; r < N; r++) {
        float k[D], v[D];
        for (int i = 0; i < D; i++) {
            k[i] = (float)((r * 13 + i * 5) % 29) / 29.0f - 0.5f;
            v[i] = (float)((r * 7 + i * 3) % 31) / 31.0f - 0.5f;
        }
        app(l, k, v);
    }
    float q[G * D];
    for (int i = 0; i < G * D; i++)
        q[i] = (float)((i * 19) % 23) / 23.0f - 0.5f;
    const float scale = 0.25f;
    const uint32_t ws[5] = {1, 7, 39, 40, 100};
    const float *K = head_k(l, 0), *V = head_v(l, 0);
    for (int wi = 0; wi < 5; wi++) {
        uint32_t first = N > ws[wi] ? N - ws[wi] : 0;
        kv_layer *c = clone_layer(l, &cfg);
        float out[G * D];
        att(c, 0, 0, G, q, scale, 0, first, 0, 1, out, NULL);
        float out_ref[G * D], imp_ref[N] = {0};
        for (int h = 0; h < G; h++) {
            float s[N], m = -INFINITY, sum = 0.0f;
            for (int p = 0; p < N; p++)
                s[p] = (uint32_t)p >= first ? attn_dot8(q + h * D, K + p * D, D) * scale : -INFINITY;
            for (int p = 0; p < N; p++)
                m = fmaxf(m, s[p]);
            for (int p = 0; p < N; p++) {
                s[p] = pd_expf(s[p] - m);
                sum += s[p];
            }
            for (int p = 0; p < N; p++)
                s[p] /= sum;
            for (int d = 0; d < D; d++) {
                float acc = 0.0f;
                for (int p = 0; p < N; p++)
                    acc = fmaf(s[p], V[p * D + d], acc);
                out_ref[h * D + d] = acc;
            }
            for (int p = 0; p < N; p++)
                imp_ref[p] += s[p];
        }
        ck_assert_msg(same_bits(out, out_ref, G * D), "out window %u", ws[wi]);
        float imp[N];
        kv_layer_importance(c, imp);
        ck_assert_msg(same_bits(imp, imp_ref, N), "imp window %u", ws[wi]);
        kv_layer_free(c);
    }
    kv_layer_free(l);
}
END_TEST

/* The scalar and AVX2 kernels give the layer the same bits. */
START_TEST(kv_attend_same_bits_on_every_isa)
{
    enum { H = 2, D = 40, G = 2, N = 90 };
    for (int mi = 0; mi < 4; mi++) {
        kv_layer *l = mk((kv_layer_config){.n_kv_heads = H, .head_dim = D, .mode = all_modes[mi],
                                           .max_q_per_kv = G});
        for (int p = 0; p < N; p++)
            app_swa(l, H, D, p, 3, 4);
        float q[G * D], o[2][G * D];
        swa_fill(q, 7, G * D, 5);
        for (int isa = 0; isa < 2; isa++) {
            pd_cpu_set_isa(isa ? PD_ISA_AVX2 : PD_ISA_SCALAR);
            att(l, 1, 0, G, q, 0, 2.0f, 3, 0, 0, o[isa], NULL);
        }
        pd_cpu_set_isa(pd_cpu_detect());
        ck_assert(same_bits(o[0], o[1], G * D));
        kv_layer_free(l);
    }
}
END_TEST

/* ---- seed: sliding tail ----------------------------------------------------- */

START_TEST(kv_trim_keeps_contiguous_tail)
{
    enum { H = 2, D = 8 };
    const uint64_t w = 6, slack = 2, align = 4;
    const uint8_t alive[H] = {1, 0};
    kv_layer_config cfg = {.n_kv_heads = H, .head_dim = D, .alive = alive};
    kv_layer *full = mk(cfg), *t = mk(cfg);
    int trims = 0;
    for (uint64_t p = 0; p < 100; p++) {
        app_swa(full, H, D, p, 1, 2);
        app_swa(t, H, D, p, 1, 2);
        float q[D], out[D];
        swa_fill(q, p, D, 9);
        att(full, 0, 0, 1, q, 0, 0, 0, 0, 1, out, NULL);
        att(t, 0, 0, 1, q, 0, 0, 0, 0, 1, out, NULL);
        if (kv_layer_trim_window(t, w, slack, align) > 0) {
            kv_layer_check(t);
            trims++;
            ck_assert_msg(kv_layer_rows(t) >= w + slack && kv_layer_rows(t) < w + slack + align,
                          "rows after a trim: %llu", (unsigned long long)kv_layer_rows(t));
        }
        ck_assert_uint_le(kv_layer_rows(t), 2 * w);
        ck_assert_uint_eq(kv_layer_pos_len(t), p + 1);
        ck_assert_uint_eq(kv_layer_base(t) % align, 0);
        ck_assert_uint_eq(kv_layer_base(t) + kv_layer_rows(t), kv_layer_rows(full));
        uint64_t b = kv_layer_base(t), n = kv_layer_rows(t);
        ck_assert(same_bits(head_k(t, 0), head_k(full, 0) + b * D, n * D));
        ck_assert(same_bits(head_v(t, 0), head_v(full, 0) + b * D, n * D));
        ck_assert_ptr_null(head_k(t, 1));
        kv_state s;
        kv_head_state hs[H];
        kv_layer_state(t, &s, hs);
        ck_assert_uint_eq(s.n_imp, n);
        ck_assert_uint_eq(s.base, b);
    }
    ck_assert_int_gt(trims, 5);
    ck_assert_uint_eq(kv_layer_tail_window(t), w);
    ck_assert_uint_eq(kv_layer_tail_window(full), 0);
    kv_layer_free(full);
    kv_layer_free(t);
}
END_TEST

START_TEST(kv_anchored_trim_keeps_the_rollback_window)
{
    enum { D = 4 };
    const uint64_t w = 6, slack = 2, align = 4, anchor = 40;
    kv_layer_config cfg = {.n_kv_heads = 1, .head_dim = D};
    kv_layer *full = mk(cfg), *t = mk(cfg);
    for (uint64_t p = 0; p < 100; p++) {
        app_swa(full, 1, D, p, 1, 2);
        app_swa(t, 1, D, p, 1, 2);
        kv_layer_trim_window_anchored(t, w, slack, align, anchor);
        kv_layer_check(t);
        ck_assert_msg(kv_layer_base(t) + w <= anchor - slack + 1, "base %llu at %llu",
                      (unsigned long long)kv_layer_base(t), (unsigned long long)p);
    }
    const uint64_t back = anchor - slack;
    trunc_ok(t, kv_layer_pos_len(t) - back);
    trunc_ok(full, kv_layer_pos_len(full) - back);
    ck_assert_uint_eq(kv_layer_pos_len(t), back);
    uint64_t b = kv_layer_base(t), n = kv_layer_rows(t);
    ck_assert_uint_ge(n, w - 1);
    ck_assert(same_bits(head_k(t, 0), head_k(full, 0) + b * D, n * D));
    ck_assert(same_bits(head_v(t, 0), head_v(full, 0) + b * D, n * D));
    for (uint64_t p = back; p < back + 3 * w; p++) {
        app_swa(t, 1, D, p, 1, 2);
        kv_layer_trim_window_anchored(t, w, slack, align, UINT64_MAX);
        kv_layer_check(t);
    }
    ck_assert_uint_le(kv_layer_rows(t), 2 * w);
    kv_layer_free(full);
    kv_layer_free(t);
}
END_TEST

static const uint64_t trim_cases[3][3] = {{40, 2, 4}, {37, 5, 16}, {64, 64, 64}}; /* w, slack, align */

/* Two layers fed the same rows, one trimmed: every windowed attend gives the
 * same output and importance, bit for bit, in every mode (q8: the field
 * freezes before the first trim). */
START_TEST(kv_trimmed_attend_equals_untrimmed)
{
    enum { H = 2, D = 16, G = 2, P = 400 };
    const int mi = _i / PD_COUNT(trim_cases), ci = _i % PD_COUNT(trim_cases); /* all_modes x trim_cases */
    const uint64_t w = trim_cases[ci][0], slack = trim_cases[ci][1], align = trim_cases[ci][2];
    kv_layer_config cfg = {.n_kv_heads = H, .head_dim = D, .mode = all_modes[mi],
                           .max_q_per_kv = G};
    kv_layer *full = mk(cfg), *t = mk(cfg);
    int trims = 0;
    for (uint64_t p = 0; p < P; p++) {
        app_swa(full, H, D, p, 3, 4);
        app_swa(t, H, D, p, 3, 4);
        float q[H * G * D];
        swa_fill(q, p, H * G * D, 5);
        for (uint32_t g = 0; g < H; g++) {
            float of[G * D], ot[G * D];
            uint32_t nf = (uint32_t)kv_layer_rows(full), nt = (uint32_t)kv_layer_rows(t);
            att(full, g, 0, G, q + g * G * D, 0.3f, 0, nf > w ? nf - (uint32_t)w : 0, 0, 1,
                of, NULL);
            att(t, g, 0, G, q + g * G * D, 0.3f, 0, nt > w ? nt - (uint32_t)w : 0, 0, 1,
                ot, NULL);
            ck_assert_msg(same_bits(of, ot, G * D), "mode %d w %llu pos %llu g%u",
                          all_modes[mi], (unsigned long long)w, (unsigned long long)p, g);
        }
        if (kv_layer_trim_window(t, w, slack, align) > 0) {
            trims++;
            kv_layer_check(t);
        }
        if (p % 16 == 15 || p == P - 1) {
            uint64_t nf = kv_layer_rows(full), nt = kv_layer_rows(t), b = kv_layer_base(t);
            float *imf = malloc(sizeof(float) * nf), *imt = malloc(sizeof(float) * nt);
            kv_layer_importance(full, imf);
            kv_layer_importance(t, imt);
            ck_assert_msg(same_bits(imf + b, imt, nt), "importance at %llu",
                          (unsigned long long)p);
            free(imf);
            free(imt);
        }
    }
    ck_assert_msg(trims > 0, "mode %d w %llu: never trimmed", all_modes[mi],
                  (unsigned long long)w);
    kv_layer_free(full);
    kv_layer_free(t);
}
END_TEST

/* A rollback no deeper than the slack, then new rows: still the untrimmed
 * answer. */
START_TEST(kv_truncate_after_trim_within_slack)
{
    enum { D = 8 };
    const uint32_t w = 10;
    kv_layer_config cfg = {.n_kv_heads = 1, .head_dim = D};
    kv_layer *full = mk(cfg), *t = mk(cfg);
    uint64_t p = 0;
    for (int round = 0; round < 60; round++) {
        for (int i = 0; i < 3; i++, p++) {
            app_swa(full, 1, D, p, 6, 7);
            app_swa(t, 1, D, p, 6, 7);
        }
        kv_layer_trim_window(t, w, 2, 4);
        kv_layer_check(t);
        trunc_ok(full, 2);
        trunc_ok(t, 2);
        p -= 2;
        ck_assert_uint_eq(kv_layer_pos_len(t), kv_layer_rows(full));
        for (int i = 0; i < 2; i++, p++) {
            app_swa(full, 1, D, p, 8 + round, 9 + round);
            app_swa(t, 1, D, p, 8 + round, 9 + round);
        }
        float q[D], of[D], ot[D];
        swa_fill(q, p, D, 10);
        uint32_t nf = (uint32_t)kv_layer_rows(full), nt = (uint32_t)kv_layer_rows(t);
        att(full, 0, 0, 1, q, 0.5f, 0, nf - (w < nf ? w : nf), 0, 0, of, NULL);
        att(t, 0, 0, 1, q, 0.5f, 0, nt - (w < nt ? w : nt), 0, 0, ot, NULL);
        ck_assert_msg(same_bits(of, ot, D), "round %d", round);
    }
    ck_assert_uint_gt(kv_layer_base(t), 0);
    kv_layer_free(full);
    kv_layer_free(t);
}
END_TEST

/* Eviction leaves a sliding tail alone (a gather would break its window). */
START_TEST(kv_evict_skips_tail_layer)
{
    for (int policy = 0; policy < 2; policy++) {
        kv_layer_config cfg = {.n_kv_heads = 1, .head_dim = 4};
        kv_layer *t = mk(cfg), *f = mk(cfg);
        for (uint64_t p = 0; p < 30; p++) {
            app_swa(t, 1, 4, p, 1, 2);
            app_swa(f, 1, 4, p, 1, 2);
            if (p < 25)
                kv_layer_trim_window(t, 8, 2, 4);
        }
        uint64_t rows = kv_layer_rows(t), base = kv_layer_base(t), gen = kv_layer_generation(t);
        ck_assert_uint_gt(base, 0);
        uint64_t dropped = policy ? kv_layer_evict_importance(t, 10, 1, 5)
                                  : kv_layer_evict_recent(t, 10);
        ck_assert_uint_eq(dropped, 0);
        ck_assert_uint_eq(kv_layer_rows(t), rows);
        ck_assert_uint_eq(kv_layer_base(t), base);
        ck_assert_uint_eq(kv_layer_generation(t), gen);
        dropped = policy ? kv_layer_evict_importance(f, 10, 1, 5) : kv_layer_evict_recent(f, 10);
        ck_assert_uint_eq(dropped, 20);
        ck_assert_uint_eq(kv_layer_rows(f), 10);
        kv_layer_check(f);
        kv_layer_free(t);
        kv_layer_free(f);
    }
}
END_TEST

/* The generation moves on every mutation a derived copy cannot follow by its
 * row count (truncate too), and stays on appends. */
START_TEST(kv_generation_changes_on_every_non_append_mutation)
{
    kv_layer_config cfg = {.n_kv_heads = 1, .head_dim = 4};
    kv_layer *l = mk(cfg), *other = mk(cfg);
    uint64_t g = kv_layer_generation(l);
    ck_assert_uint_ne(kv_layer_generation(other), g);
    for (uint64_t p = 0; p < 20; p++)
        app_swa(l, 1, 4, p, 1, 2);
    ck_assert_uint_eq(kv_layer_generation(l), g);
    float q[4] = {1, 0, 0, 0}, out[4];
    att(l, 0, 0, 1, q, 0, 0, 0, 0, 1, out, NULL);
    kv_layer_confirm(l, 5);
    ck_assert_uint_eq(kv_layer_generation(l), g);
#define BUMPS(expr, what)                                                                 \
    do {                                                                                  \
        uint64_t g0 = kv_layer_generation(l);                                             \
        expr;                                                                             \
        kv_layer_check(l);                                                                \
        ck_assert_msg(kv_layer_generation(l) != g0, "%s keeps the generation", what);      \
    } while (0)
#define KEEPS(expr, what)                                                                 \
    do {                                                                                  \
        uint64_t g0 = kv_layer_generation(l);                                             \
        expr;                                                                             \
        kv_layer_check(l);                                                                \
        ck_assert_msg(kv_layer_generation(l) == g0, "%s changes the generation", what);    \
    } while (0)
    BUMPS(trunc_ok(l, 2), "truncate_last");
    KEEPS(ck_assert_uint_eq(kv_layer_trim_window(l, 10, 2, 4), 0), "a no-op trim");
    for (uint64_t p = 18; p < 21; p++)
        app_swa(l, 1, 4, p, 1, 2);
    BUMPS(ck_assert_uint_gt(kv_layer_trim_window(l, 10, 2, 4), 0), "trim");
    BUMPS(kv_layer_clear(l), "clear");
    ck_assert_uint_eq(kv_layer_base(l), 0);
    ck_assert_uint_eq(kv_layer_pos_len(l), 0);
    ck_assert_uint_eq(kv_layer_tail_window(l), 10); /* the window is the layer's */
    kv_layer_free(l);
    l = mk(cfg);
    for (uint64_t p = 0; p < 12; p++)
        app_swa(l, 1, 4, p, 1, 2);
    KEEPS(kv_layer_evict_recent(l, 20), "an eviction that does nothing");
    BUMPS(kv_layer_evict_recent(l, 6), "evict_recent");
    BUMPS(kv_layer_evict_importance(l, 3, 1, 1), "evict_importance");
    BUMPS(kv_layer_set_linear(l, q, 4, NULL), "set_linear");
    BUMPS(kv_layer_install_bounded(l, 3, NULL), "install_bounded");
    KEEPS(kv_layer_bounded_insert(l, q, q, NULL), "bounded_insert");
    KEEPS(kv_layer_set_sinks(l, q, 1, NULL), "set_sinks (weights)");
    kv_layer *c = clone_layer(l, &cfg);
    ck_assert_uint_ne(kv_layer_generation(c), kv_layer_generation(l)); /* an import is new storage */
    uint64_t gc = kv_layer_generation(c);
    BUMPS(kv_layer_swap(l, c), "swap");
    ck_assert_uint_ne(kv_layer_generation(c), gc);
    kv_layer_free(c);
    kv_layer_free(l);
    /* the freeze rewrites stored rows */
    l = mk((kv_layer_config){.n_kv_heads = 1, .head_dim = 4, .mode = KV_MODE_Q8, .freeze_rows = 8});
    for (uint64_t p = 0; p < 8; p++)
        KEEPS(app_swa(l, 1, 4, p, 1, 2), "an append below the freeze");
    BUMPS(app_swa(l, 1, 4, 8, 1, 2), "the freezing append");
    ck_assert(kv_layer_frozen(l));
    kv_layer_free(l);
    kv_layer_free(other);
#undef BUMPS
#undef KEEPS
}
END_TEST

/* ---- speculation exactness --------------------------------------------- */

typedef struct shape {
    uint32_t n_kv, hd, g;
    uint8_t alive[MAXH];
} shape;

static const shape shapes[3] = {
    {.n_kv = 2, .hd = 32, .g = 2, .alive = {1, 1}},
    {.n_kv = 3, .hd = 40, .g = 1, .alive = {1, 0, 1}},
    {.n_kv = 1, .hd = 8, .g = 4, .alive = {1}},
};

static kv_layer_config shape_cfg(const shape *s, kv_mode m, uint32_t freeze, uint32_t depth)
{
    return (kv_layer_config){.n_kv_heads = s->n_kv, .head_dim = s->hd, .mode = m,
                             .alive = s->alive, .freeze_rows = freeze, .spec_depth = depth,
                             .max_q_per_kv = s->g};
}

/* The decode step of the query at row eff - 1: every KV head attends with
 * its whole group (grouped when g > 1) over a 9-row window, importance
 * tracked. as_chunk passes upto = eff (the prefill / verify form), else
 * upto = 0 (all rows, the layer then holds exactly eff rows). */
static void step_attend(kv_layer *l, const shape *s, uint64_t salt, uint32_t eff, int as_chunk,
                        float *out)
{
    float q[MAXH * 4 * MAXD];
    swa_fill(q, salt, s->n_kv * s->g * s->hd, 77);
    uint32_t first = eff > 9 ? eff - 9 : 0;
    for (uint32_t h = 0; h < s->n_kv; h++)
        att(l, h, h * s->g, s->g, q + h * s->g * s->hd, 0, h == 0 ? 0 : 3.0f, first,
            as_chunk ? eff : 0, 1, out + h * s->g * s->hd, NULL);
}

/* attend_upto after appending a chunk == append + attend one row at a time,
 * outputs and final state bit for bit, in every mode and shape, including a
 * chunk that straddles the q8 freeze. */
START_TEST(kv_attend_upto_equals_sequential_prefill_chunk)
{
    const int si = _i / PD_COUNT(all_modes), mi = _i % PD_COUNT(all_modes); /* shapes x all_modes */
    const shape *s = &shapes[si];
    kv_layer_config cfg = shape_cfg(s, all_modes[mi], 24, 40);
    kv_layer *seq = mk(cfg), *chk = mk(cfg);
    const uint32_t chunks[4] = {10, 20, 1, 15}; /* rows 10..30 straddle the freeze at 24 */
    size_t nout = (size_t)s->n_kv * s->g * s->hd;
    float *os = malloc(sizeof(float) * nout * 20), *oc = malloc(sizeof(float) * nout);
    uint32_t s0 = 0;
    for (int c = 0; c < 4; c++) {
        uint32_t b = chunks[c];
        for (uint32_t i = 0; i < b; i++) {
            app_swa(seq, s->n_kv, s->hd, s0 + i, 1, 2);
            step_attend(seq, s, s0 + i, s0 + i + 1, 0, os + i * nout);
        }
        for (uint32_t i = 0; i < b; i++)
            app_swa(chk, s->n_kv, s->hd, s0 + i, 1, 2);
        for (uint32_t i = 0; i < b; i++) {
            step_attend(chk, s, s0 + i, s0 + i + 1, 1, oc);
            ck_assert_msg(same_bits(os + i * nout, oc, nout),
                          "shape %d mode %d row %u: chunk != sequential", si,
                          all_modes[mi], s0 + i);
        }
        s0 += b;
        assert_same_state(seq, chk);
        kv_layer_confirm(seq, s0);
        kv_layer_confirm(chk, s0);
        assert_same_state(seq, chk);
        kv_layer_check(seq);
        kv_layer_check(chk);
    }
    ck_assert_int_eq(kv_layer_frozen(seq), all_modes[mi] != KV_MODE_F32);
    free(os);
    free(oc);
    kv_layer_free(seq);
    kv_layer_free(chk);
}
END_TEST

static const uint32_t variants[2][2] = {{1, 8}, {3, 16}}; /* confirm every n rounds, spec_depth */

/* truncate_last == never appended: a verify batch (accepted rows + drafts
 * appended as a chunk, attended with upto, rejected ones rolled back) leaves
 * the state byte-identical to a layer that only ever appended and attended
 * the accepted rows one at a time. Every mode and shape; importance pending
 * or confirmed; drafts across the freeze. */
START_TEST(kv_truncate_equals_never_appended)
{
    /* variants x shapes x all_modes */
    const int vi = _i / (PD_COUNT(shapes) * PD_COUNT(all_modes)), si = _i / PD_COUNT(all_modes) % PD_COUNT(shapes),
              mi = _i % PD_COUNT(all_modes);
    const shape *s = &shapes[si];
    kv_layer_config cfg = shape_cfg(s, all_modes[mi], 16, variants[vi][1]);
    kv_layer *r = mk(cfg), *sp = mk(cfg);
    size_t nout = (size_t)s->n_kv * s->g * s->hd;
    float *o = malloc(sizeof(float) * nout);
    uint32_t p = 0;
    int crossed_freeze_in_drafts = 0;
    for (uint32_t round = 0; round < 16; round++) {
        if (round % variants[vi][0] == 0) {
            kv_layer_confirm(r, p);
            kv_layer_confirm(sp, p);
        }
        uint32_t d = 1 + (round * 3) % 5, a = round % 3 < d ? round % 3 : d;
        int was_frozen = kv_layer_frozen(sp);
        for (uint32_t i = 0; i < d; i++)
            app_swa(sp, s->n_kv, s->hd, p + i, i < a ? 1 : 100 + round,
                    i < a ? 2 : 200 + round);
        if (!was_frozen && kv_layer_frozen(sp) && p + a <= 16)
            crossed_freeze_in_drafts = 1;
        for (uint32_t i = 0; i < d; i++)
            step_attend(sp, s, p + i, p + i + 1, 1, o);
        trunc_ok(sp, d - a);
        for (uint32_t i = 0; i < a; i++) {
            app_swa(r, s->n_kv, s->hd, p + i, 1, 2);
            step_attend(r, s, p + i, p + i + 1, 0, o);
        }
        p += a;
        assert_same_state(r, sp);
        /* one plain decode step on both */
        app_swa(r, s->n_kv, s->hd, p, 1, 2);
        app_swa(sp, s->n_kv, s->hd, p, 1, 2);
        step_attend(r, s, p, p + 1, 0, o);
        step_attend(sp, s, p, p + 1, 0, o);
        p++;
        assert_same_state(r, sp);
    }
    if (all_modes[mi] != KV_MODE_F32)
        ck_assert_msg(crossed_freeze_in_drafts, "no rolled-back freeze exercised");
    kv_layer_confirm(r, p);
    kv_layer_confirm(sp, p);
    assert_same_state(r, sp);
    free(o);
    kv_layer_free(r);
    kv_layer_free(sp);
}
END_TEST

/* A freeze triggered by draft rows is undone when they are rolled back (the
 * field is frozen only from rows that survived verify); once the freezing
 * append is confirmed the undo data is gone and a rollback keeps the field. */
START_TEST(kv_truncate_undoes_a_freeze_from_rolled_back_rows)
{
    for (int mi = 1; mi < 4; mi++) {
        kv_layer_config cfg = {.n_kv_heads = 2, .head_dim = 40, .mode = all_modes[mi],
                               .freeze_rows = 16};
        kv_layer *r = mk(cfg), *sp = mk(cfg);
        for (uint32_t p = 0; p < 14; p++) {
            app_swa(r, 2, 40, p, 1, 2);
            app_swa(sp, 2, 40, p, 1, 2);
        }
        for (uint32_t p = 14; p < 19; p++)
            app_swa(sp, 2, 40, p, 9, 9);
        ck_assert(kv_layer_frozen(sp));
        trunc_ok(sp, 5);
        ck_assert(!kv_layer_frozen(sp));
        assert_same_state(r, sp);
        /* rows 16 and 17 (the freezing append) survive: the field stays */
        for (uint32_t p = 14; p < 19; p++)
            app_swa(sp, 2, 40, p, 1, 2);
        trunc_ok(sp, 1);
        ck_assert(kv_layer_frozen(sp));
        for (uint32_t p = 14; p < 18; p++)
            app_swa(r, 2, 40, p, 1, 2);
        assert_same_state(r, sp);
        /* confirmed past the freezing append: rows before 18 are final, and a
         * rollback below the freeze point (past the confirm point) keeps it */
        kv_layer_confirm(sp, 18);
        trunc_ok(sp, 5);
        ck_assert(kv_layer_frozen(sp));
        kv_layer_free(r);
        kv_layer_free(sp);
    }
}
END_TEST

/* Importance mass of rolled-back query rows is not kept, even when the log
 * had to fold older positions; the folded view equals the never-speculated
 * run's. */
START_TEST(kv_rolled_back_importance_is_not_kept)
{
    const shape *s = &shapes[0];
    kv_layer_config cfg = shape_cfg(s, KV_MODE_F32, 0, 4);
    kv_layer *r = mk(cfg), *sp = mk(cfg);
    size_t nout = (size_t)s->n_kv * s->g * s->hd;
    float *o = malloc(sizeof(float) * nout);
    for (uint32_t p = 0; p < 6; p++) {
        app_swa(r, s->n_kv, s->hd, p, 1, 2);
        app_swa(sp, s->n_kv, s->hd, p, 1, 2);
        step_attend(r, s, p, p + 1, 0, o);
        step_attend(sp, s, p, p + 1, 0, o);
    }
    /* 4 pending positions (2..5) fill the log; drafts force folds of 2 and 3 */
    for (uint32_t p = 6; p < 8; p++) {
        app_swa(sp, s->n_kv, s->hd, p, 7, 8);
        step_attend(sp, s, p, p + 1, 0, o);
    }
    trunc_ok(sp, 2);
    float ir[8], is[8];
    kv_layer_importance(r, ir);
    kv_layer_importance(sp, is);
    ck_assert(same_bits(ir, is, 6));
    float total = 0;
    for (int i = 0; i < 6; i++)
        total += is[i];
    /* 6 queries x 4 Q heads of probability mass, none from the drafts */
    ck_assert_float_eq_tol(total, 24.0f, 1e-4f);
    /* once everything is confirmed the stored state is identical too */
    kv_layer_confirm(r, 6);
    kv_layer_confirm(sp, 6);
    assert_same_state(r, sp);
    free(o);
    kv_layer_free(r);
    kv_layer_free(sp);
}
END_TEST

/* A layer with everything: q8 field frozen, trimmed base, importance,
 * a dead head, linear vector and bounded ring. */
static kv_layer *rich_layer(kv_layer_config *cfg_out, kv_mode mode)
{
    static const uint8_t alive[3] = {1, 0, 1};
    *cfg_out = (kv_layer_config){.n_kv_heads = 3, .head_dim = 40, .mode = mode, .alive = alive,
                                 .freeze_rows = 12, .spec_depth = 4, .max_q_per_kv = 2};
    kv_layer *l = mk(*cfg_out);
    float q[2 * 40], out[2 * 40];
    for (uint32_t p = 0; p < 60; p++) {
        app_swa(l, 3, 40, p, 1, 2);
        swa_fill(q, p, 80, 3);
        att(l, 0, 0, 2, q, 0, 0, 0, 0, 1, out, NULL);
        att(l, 2, 4, 2, q, 0, 0, 0, 0, 1, out, NULL);
        kv_layer_trim_window(l, 10, 3, 4);
        kv_layer_check(l);
    }
    float lin[5] = {1, 2, 3, 4, 5}, k[120], v[120];
    ck_assert_int_eq(kv_layer_set_linear(l, lin, 5, NULL), PD_OK);
    ck_assert_int_eq(kv_layer_install_bounded(l, 4, NULL), PD_OK);
    for (uint32_t p = 0; p < 6; p++) {
        swa_fill(k, p, 120, 11);
        swa_fill(v, p, 120, 12);
        ck_assert_int_eq(kv_layer_bounded_insert(l, k, v, NULL), PD_OK);
    }
    kv_layer_check(l);
    return l;
}

/* ---- memory ------------------------------------------------------------- */

static const uint8_t masks[3][3] = {{1, 1, 1}, {0, 1, 0}, {0, 0, 0}}; /* alive heads of 3 */

/* attention / recurrent bytes against the analytic formula, allocated bytes
 * against what the allocator actually holds, in every mode and alive mask. */
START_TEST(kv_memory_matches_analytic_formula)
{
    const uint32_t H = 3, D = 40, NGK = 2; /* ceil(40 / 32) */
    const int mi = _i / PD_COUNT(masks), ai = _i % PD_COUNT(masks); /* all_modes x masks */
    cnt_alloc ca;
    cnt_init(&ca);
    uint32_t alive = masks[ai][0] + masks[ai][1] + masks[ai][2];
    kv_layer *l = mk((kv_layer_config){.n_kv_heads = H, .head_dim = D,
                                       .mode = all_modes[mi], .alive = masks[ai],
                                       .freeze_rows = 20, .capacity_rows = 8,
                                       .alloc = &ca.a});
    int qk = all_modes[mi] & KV_MODE_Q8K, qv = all_modes[mi] & KV_MODE_Q8V;
    uint64_t per_row = (qk ? D + 4 * NGK : 4 * D) + (qv ? D + 4 : 4 * D);
    uint64_t field = 4 * D * (uint64_t)((qk != 0) + (qv != 0));
    const uint32_t counts[5] = {0, 5, 20, 30, 21};
    uint32_t rows = 0;
    for (int ci = 0; ci < 5; ci++) {
        while (rows < counts[ci])
            app_swa(l, H, D, rows++, 1, 2);
        if (rows > counts[ci]) {
            trunc_ok(l, rows - counts[ci]);
            rows = counts[ci];
        }
        kv_memory m;
        kv_layer_memory(l, &m);
        int frozen = all_modes[mi] != KV_MODE_F32 && rows > 20;
        ck_assert_int_eq(kv_layer_frozen(l), frozen);
        uint64_t want = (uint64_t)rows * (4 + alive * per_row) + (frozen ? alive * field : 0);
        ck_assert_msg(m.attention == want, "mode %d mask %d rows %u: %llu vs %llu",
                      all_modes[mi], ai, rows, (unsigned long long)m.attention,
                      (unsigned long long)want);
        ck_assert_uint_eq(m.recurrent, 0);
        ck_assert_uint_eq(m.allocated, (uint64_t)ca.live);
        ck_assert_uint_ge(m.allocated, m.attention);
    }
    float lin[10] = {0};
    ck_assert_int_eq(kv_layer_set_linear(l, lin, 10, NULL), PD_OK);
    ck_assert_int_eq(kv_layer_install_bounded(l, 7, NULL), PD_OK);
    ck_assert_int_eq(kv_layer_set_sinks(l, lin, 6, NULL), PD_OK);
    kv_layer_check(l);
    kv_memory m;
    kv_layer_memory(l, &m);
    ck_assert_uint_eq(m.recurrent, 4 * 10 + 2 * 4 * H * 7 * D);
    ck_assert_uint_eq(m.allocated, (uint64_t)ca.live);
    kv_layer_clear(l);
    kv_layer_check(l);
    kv_layer_memory(l, &m);
    ck_assert_uint_eq(m.attention, 0);
    ck_assert_uint_eq(m.recurrent, 2 * 4 * H * 7 * D); /* the ring keeps its size */
    ck_assert_uint_eq(m.allocated, (uint64_t)ca.live);
    kv_layer_free(l);
    ck_assert_int_eq(ca.live, 0);
}
END_TEST

/* No allocation while appending within capacity, nor in attend, truncate,
 * confirm, trim or eviction; growth beyond it is geometric. */
START_TEST(kv_append_within_capacity_does_not_allocate)
{
    cnt_alloc ca;
    cnt_init(&ca);
    kv_layer *l = mk((kv_layer_config){.n_kv_heads = 2, .head_dim = 16, .mode = KV_MODE_Q8,
                                       .capacity_rows = 100, .freeze_rows = 30,
                                       .max_q_per_kv = 2, .alloc = &ca.a});
    long long calls = ca.calls;
    float q[32], out[32];
    swa_fill(q, 1, 32, 3);
    for (uint32_t p = 0; p < 100; p++) {
        app_swa(l, 2, 16, p, 1, 2);
        att(l, p % 2, 0, 2, q, 0, 0, 0, 0, 1, out, NULL);
        if (p % 7 == 6) {
            trunc_ok(l, 2);
            app_swa(l, 2, 16, p - 1, 1, 2);
            app_swa(l, 2, 16, p, 1, 2);
            kv_layer_confirm(l, p - 3);
        }
    }
    kv_layer_trim_window(l, 30, 2, 4);
    kv_layer_check(l);
    ck_assert_uint_lt(kv_layer_rows(l), 100);
    for (uint64_t p = kv_layer_pos_len(l); kv_layer_rows(l) < 100; p++)
        app_swa(l, 2, 16, p, 1, 2);
    ck_assert_int_eq(ca.calls, calls);
    app_swa(l, 2, 16, 100, 1, 2); /* beyond capacity: one growth */
    ck_assert_int_gt(ca.calls, calls);
    calls = ca.calls;
    for (uint32_t p = 101; p < 130; p++)
        app_swa(l, 2, 16, p, 1, 2);
    ck_assert_int_eq(ca.calls, calls);
    kv_layer_free(l);
    l = mk((kv_layer_config){.n_kv_heads = 1, .head_dim = 4, .capacity_rows = 50, .alloc = &ca.a});
    for (uint32_t p = 0; p < 50; p++)
        app_swa(l, 1, 4, p, 1, 2);
    calls = ca.calls;
    kv_layer_evict_importance(l, 20, 2, 5);
    kv_layer_evict_recent(l, 10);
    ck_assert_int_eq(ca.calls, calls);
    kv_layer_free(l);
    ck_assert_int_eq(ca.live, 0);
}
END_TEST

/* A failing allocation leaves the layer exactly as it was (growth) and
 * creates nothing (new, new_from_state). */
START_TEST(kv_allocation_failure_leaves_layer_unchanged)
{
    cnt_alloc ca;
    cnt_init(&ca);
    kv_layer_config cfg = {.n_kv_heads = 2, .head_dim = 8, .mode = KV_MODE_Q8K, .alloc = &ca.a};
    kv_layer *l = mk(cfg);
    for (uint32_t p = 0; p < 16; p++)
        app_swa(l, 2, 8, p, 1, 2);
    kv_layer *ref = clone_layer(l, &cfg);
    long long live = ca.live;
    for (long long extra = 0; extra < 12; extra++) {
        ca.fail_at = ca.calls + extra;
        float k[16], v[16];
        swa_fill(k, 16, 16, 1);
        swa_fill(v, 16, 16, 2);
        pd_err e = {0};
        pd_status st = kv_layer_append(l, k, v, &e);
        ca.fail_at = -1;
        if (st == PD_OK) {
            trunc_ok(l, 1);
            ck_assert_int_ge(extra, 1);
            break;
        }
        ck_assert_int_eq(st, PD_ERR_NOMEM);
        kv_layer_check(l);
        ck_assert_int_eq(ca.live, live);
        assert_same_state(l, ref);
    }
    /* creation failing at every allocation: nothing created, nothing held */
    for (long long extra = 0;; extra++) {
        ca.fail_at = ca.calls + extra;
        kv_layer *n = (kv_layer *)&ca; /* sentinel */
        pd_err e = {0};
        pd_status st = kv_layer_new(&cfg, &n, &e);
        ca.fail_at = -1;
        if (st == PD_OK) {
            kv_layer_free(n);
            break;
        }
        ck_assert_int_eq(st, PD_ERR_NOMEM);
        ck_assert_ptr_eq(n, (kv_layer *)&ca);
        ck_assert_int_eq(ca.live, live);
    }
    /* installing a state failing at every allocation: the same */
    kv_layer_config rcfg;
    kv_layer *rich = rich_layer(&rcfg, KV_MODE_Q8V);
    kv_layer_confirm(rich, kv_layer_pos_len(rich));
    kv_state rs;
    kv_head_state rh[3];
    kv_layer_state(rich, &rs, rh);
    rcfg.alloc = &ca.a;
    for (long long extra = 0;; extra++) {
        ca.fail_at = ca.calls + extra;
        kv_layer *n = (kv_layer *)&ca;
        pd_status st = kv_layer_new_from_state(&rcfg, &rs, &n, NULL);
        ca.fail_at = -1;
        if (st == PD_OK) {
            assert_same_state(rich, n);
            kv_layer_free(n);
            break;
        }
        ck_assert_int_eq(st, PD_ERR_NOMEM);
        ck_assert_ptr_eq(n, (kv_layer *)&ca);
        ck_assert_int_eq(ca.live, live);
    }
    kv_layer_free(rich);
    kv_layer_free(ref);
    kv_layer_free(l);
    ck_assert_int_eq(ca.live, 0);
}
END_TEST

/* ---- state view / install ---------------------------------------------------- */

START_TEST(kv_state_round_trip_answers_identically)
{
    for (int mi = 0; mi < 4; mi++) {
        kv_layer_config cfg;
        kv_layer *a = rich_layer(&cfg, all_modes[mi]);
        ck_assert_uint_gt(kv_layer_base(a), 0);
        ck_assert_int_eq(kv_layer_frozen(a), all_modes[mi] != KV_MODE_F32);
        kv_layer *b = clone_layer(a, &cfg);
        assert_same_state(a, b);
        ck_assert_uint_eq(kv_layer_pos_len(b), kv_layer_pos_len(a));
        ck_assert_uint_eq(kv_layer_tail_window(b), 10);
        kv_memory ma, mb;
        kv_layer_memory(a, &ma);
        kv_layer_memory(b, &mb);
        ck_assert_uint_eq(ma.attention, mb.attention);
        ck_assert_uint_eq(ma.recurrent, mb.recurrent);
        /* the same questions get the same answers, and the layers evolve alike */
        for (uint32_t p = 60; p < 90; p++) {
            app_swa(a, 3, 40, p, 1, 2);
            app_swa(b, 3, 40, p, 1, 2);
            float q[80], oa[80], ob[80];
            swa_fill(q, p, 80, 4);
            for (uint32_t h = 0; h < 3; h += 2) {
                att(a, h, 0, 2, q, 0, 1.5f, 2, 0, 1, oa, NULL);
                att(b, h, 0, 2, q, 0, 1.5f, 2, 0, 1, ob, NULL);
                ck_assert(same_bits(oa, ob, 80));
            }
            kv_layer_trim_window(a, 10, 3, 4);
            kv_layer_trim_window(b, 10, 3, 4);
            if (p % 5 == 0) {
                trunc_ok(a, 1);
                trunc_ok(b, 1);
                app_swa(a, 3, 40, p, 1, 2);
                app_swa(b, 3, 40, p, 1, 2);
            }
        }
        assert_same_state(a, b);
        kv_layer_free(a);
        kv_layer_free(b);
    }
}
END_TEST

/* assign_state into a spare of enough capacity: the same state as
 * new_from_state, no allocation; a spare too small grows; a refused state
 * leaves the spare exactly as it was. */
START_TEST(kv_assign_state_reuses_a_spare_without_allocating)
{
    for (int mi = 0; mi < 4; mi++) {
        static const uint8_t alive[3] = {1, 0, 1};
        kv_layer_config cfg = {.n_kv_heads = 3, .head_dim = 40, .mode = all_modes[mi], .alive = alive,
                               .freeze_rows = 12, .spec_depth = 4, .max_q_per_kv = 2};
        kv_layer *a = mk(cfg);
        float q[80], out[80];
        for (uint32_t p = 0; p < 30; p++) {
            app_swa(a, 3, 40, p, 1, 2);
            swa_fill(q, p, 80, 3);
            att(a, 0, 0, 2, q, 0, 0, 0, 0, 1, out, NULL);
        }
        kv_layer *want = clone_layer(a, &cfg);
        cnt_alloc ca;
        cnt_init(&ca);
        kv_layer_config scfg = cfg;
        scfg.alloc = &ca.a;
        scfg.capacity_rows = 64;
        kv_layer *spare = mk(scfg);
        for (uint32_t p = 0; p < 5; p++) /* the spare holds something else first */
            app_swa(spare, 3, 40, p, 7, 8);
        kv_state st;
        kv_head_state hs[MAXH];
        kv_layer_state(a, &st, hs);
        long long calls = ca.calls;
        pd_err e = {0};
        ck_assert_int_eq(kv_layer_assign_state(spare, &st, &e), PD_OK);
        ck_assert_int_eq(ca.calls, calls); /* reused, nothing allocated */
        kv_layer_check(spare);
        assert_same_state(want, spare);
        /* it answers like the original */
        swa_fill(q, 31, 80, 5);
        float oa[80], ob[80];
        att(a, 2, 0, 2, q, 0, 0, 0, 0, 0, oa, NULL);
        att(spare, 2, 0, 2, q, 0, 0, 0, 0, 0, ob, NULL);
        ck_assert(same_bits(oa, ob, 80));
        /* a refused state (importance of the wrong length) leaves it as it was */
        kv_state bad = st;
        bad.n_imp = st.rows + 1;
        kv_layer *before = clone_layer(spare, &cfg);
        ck_assert_int_ne(kv_layer_assign_state(spare, &bad, &e), PD_OK);
        assert_same_state(before, spare);
        /* a spare too small grows through a fresh layer */
        kv_layer_config tcfg = cfg;
        tcfg.capacity_rows = 4;
        kv_layer *tiny = mk(tcfg);
        pd_err_clear(&e);
        ck_assert_int_eq(kv_layer_assign_state(tiny, &st, &e), PD_OK);
        kv_layer_check(tiny);
        assert_same_state(want, tiny);
        kv_layer_config got;
        kv_layer_config_get(spare, &got);
        ck_assert_uint_eq(got.n_kv_heads, 3);
        ck_assert_uint_eq(got.head_dim, 40);
        ck_assert_int_eq(got.mode, all_modes[mi]);
        ck_assert_uint_ge(got.capacity_rows, 64);
        ck_assert_ptr_eq(got.alloc, &ca.a);
        kv_layer_free(before);
        kv_layer_free(tiny);
        kv_layer_free(spare);
        kv_layer_free(want);
        kv_layer_free(a);
        ck_assert_int_eq(ca.live, 0);
    }
}
END_TEST

/* Every refusal of new_from_state names the field, creates nothing and
 * allocates nothing. */
START_TEST(kv_new_from_state_refusals_create_nothing)
{
    kv_layer_config cfg;
    kv_layer *src = rich_layer(&cfg, KV_MODE_Q8);
    kv_layer_confirm(src, kv_layer_pos_len(src));
    kv_state good;
    kv_head_state gh[3];
    kv_layer_state(src, &good, gh);
    cnt_alloc ca;
    cnt_init(&ca);
    cfg.alloc = &ca.a;
    int8_t bad_q[40 * 64];
    float bad_s[64 * 2], bad_col[40];
    const uint64_t rows = good.rows;
    ck_assert_uint_le(rows, 64);
    const uint8_t alive_wrong[3] = {1, 1, 1};
    enum { CASES = 31 };
    for (int c = 0; c < CASES; c++) {
        kv_state s = good;
        kv_head_state h[3];
        memcpy(h, gh, sizeof h);
        s.heads = h;
        kv_layer_config cf = cfg;
        const char *field = NULL;
        pd_status want = PD_ERR_FORMAT;
        switch (c) {
        case 0: s.n_kv_heads = 2; field = "n_kv_heads"; want = PD_ERR_MISMATCH; break;
        case 1: s.head_dim = 32; field = "head_dim"; want = PD_ERR_MISMATCH; break;
        case 2: s.mode = KV_MODE_Q8K; field = "mode"; want = PD_ERR_MISMATCH; break;
        case 3: s.k_group = 16; field = "k_group"; want = PD_ERR_MISMATCH; break;
        case 4: s.freeze_rows = 64; field = "freeze_rows"; want = PD_ERR_MISMATCH; break;
        case 5: s.alive = alive_wrong; field = "alive[1]"; want = PD_ERR_MISMATCH; break;
        case 6: s.rows = (uint64_t)UINT32_MAX + 5; field = "rows"; want = PD_ERR_RANGE; break;
        case 7: s.base = UINT64_MAX - 3; field = "base"; want = PD_ERR_RANGE; break;
        case 8: s.frozen = 2; field = "frozen"; break;
        case 9: s.frozen = 0; h[0].kcol = h[0].vcol = h[2].kcol = h[2].vcol = NULL;
                field = "frozen"; break; /* unfrozen q8 with more rows than freeze_rows */
        case 10: s.n_imp = rows - 1; field = "n_imp"; break;
        case 11: s.imp = NULL; field = "imp"; want = PD_ERR_ARG; break;
        case 12: s.imp_pending = 1; field = "imp_pending"; want = PD_ERR_REFUSED; break;
        case 13: s.linear = NULL; field = "linear"; want = PD_ERR_ARG; break;
        case 14: s.has_bounded = 2; field = "has_bounded"; break;
        case 15: s.bounded.window = 0; field = "bounded.window"; break;
        case 16: s.bounded.head = (s.bounded.head + 1) % s.bounded.window; field = "bounded.head";
                 break;
        case 17: s.bounded.len += 1; field = "bounded.head"; break;
        case 18: s.bounded.k = NULL; field = "bounded.k"; want = PD_ERR_ARG; break;
        case 19: s.bounded.window = UINT32_MAX; s.bounded.head = (uint32_t)(s.bounded.len % UINT32_MAX);
                 field = "bounded.window"; want = PD_ERR_RANGE; break;
        case 20: s.heads = NULL; field = "heads"; want = PD_ERR_ARG; break;
        case 21: h[0].k = h[0].ks; field = "heads[0].k"; break;      /* f32 K on a q8 layer */
        case 22: h[2].kq = NULL; field = "heads[2].kq"; break;
        case 23: h[1].vq = h[0].vq; field = "heads[1].vq"; break;    /* a dead head with rows */
        case 24: h[2].vcol = NULL; field = "heads[2].vcol"; break;
        case 25:
            memcpy(bad_q, h[0].kq, rows * 40);
            bad_q[rows * 40 - 1] = -128;
            h[0].kq = bad_q;
            field = "heads[0].kq";
            break;
        case 26:
            memcpy(bad_s, h[2].vs, rows * 4);
            bad_s[3] = 0.0f;
            h[2].vs = bad_s;
            field = "heads[2].vs";
            break;
        case 27:
            memcpy(bad_col, h[0].kcol, sizeof bad_col);
            bad_col[7] = 0.0f;
            h[0].kcol = bad_col;
            field = "heads[0].kcol";
            break;
        case 28:
            memcpy(bad_col, h[2].vcol, sizeof bad_col);
            bad_col[0] = NAN;
            h[2].vcol = bad_col;
            field = "heads[2].vcol";
            break;
        case 29: cf.mode = KV_MODE_F32; field = "mode"; want = PD_ERR_MISMATCH; break;
        case 30: cf.head_dim = 0; field = "head_dim"; want = PD_ERR_ARG; break;
        }
        kv_layer *out = (kv_layer *)&ca; /* sentinel */
        pd_err e = {0};
        pd_status st = kv_layer_new_from_state(&cf, &s, &out, &e);
        ck_assert_msg(st == want, "case %d: status %d (%s), want %d", c, st, e.msg, want);
        ck_assert_msg(strstr(e.msg, field) != NULL, "case %d: '%s' does not name %s", c, e.msg,
                      field);
        ck_assert_ptr_eq(out, (kv_layer *)&ca);
        ck_assert_int_eq(ca.live, 0);
        ck_assert_int_eq(ca.calls, 0);
    }
    /* the untouched state is accepted */
    kv_layer *out = NULL;
    ck_assert_int_eq(kv_layer_new_from_state(&cfg, &good, &out, NULL), PD_OK);
    kv_layer_check(out);
    assert_same_state(src, out);
    kv_layer_free(out);
    ck_assert_int_eq(ca.live, 0);
    kv_layer_free(src);
}
END_TEST

/* An import decodes into a fresh layer and swaps on success; the sinks
 * (weights) stay with the object they were set on, through clear too. */
START_TEST(kv_swap_exchanges_state_and_keeps_sinks)
{
    kv_layer_config cfg = {.n_kv_heads = 1, .head_dim = 4};
    kv_layer *target = mk(cfg), *src = mk(cfg);
    const float sinks[2] = {0.5f, -0.5f};
    ck_assert_int_eq(kv_layer_set_sinks(target, sinks, 2, NULL), PD_OK);
    app_swa(target, 1, 4, 0, 1, 2);
    kv_layer_clear(target);
    for (uint32_t p = 0; p < 3; p++)
        app_swa(src, 1, 4, p, 1, 2);
    kv_layer *fresh = clone_layer(src, &cfg);
    kv_layer_swap(target, fresh);
    kv_layer_check(target);
    kv_layer_check(fresh);
    ck_assert_uint_eq(kv_layer_rows(target), 3);
    ck_assert_uint_eq(kv_layer_rows(fresh), 0);
    kv_layer_free(fresh);
    /* the target answers with its own sinks over the imported rows */
    float q[4] = {0.3f, -0.2f, 0.1f, 0.4f}, ot[4], os[4], ow[4];
    att(target, 0, 1, 1, q, 0, 0, 0, 0, 0, ot, NULL);
    kv_layer_set_sinks(src, sinks, 2, NULL);
    att(src, 0, 1, 1, q, 0, 0, 0, 0, 0, os, NULL);
    ck_assert(same_bits(ot, os, 4));
    kv_layer_set_sinks(src, NULL, 0, NULL);
    att(src, 0, 1, 1, q, 0, 0, 0, 0, 0, ow, NULL);
    ck_assert(!same_bits(ot, ow, 4)); /* the sink took some mass */
    kv_layer_free(target);
    kv_layer_free(src);
}
END_TEST

START_TEST(kv_bounded_ring_insert_overwrites_len_mod_window)
{
    kv_layer *l = mk((kv_layer_config){.n_kv_heads = 2, .head_dim = 3});
    float k[6], v[6];
    ck_assert_int_eq(kv_layer_bounded_insert(l, k, v, NULL), PD_ERR_ARG); /* no ring */
    ck_assert_int_eq(kv_layer_install_bounded(l, 0, NULL), PD_ERR_ARG);
    ck_assert_int_eq(kv_layer_install_bounded(l, 3, NULL), PD_OK);
    for (int p = 0; p < 7; p++) {
        for (int i = 0; i < 6; i++) {
            k[i] = (float)(p * 10 + i);
            v[i] = -(float)(p * 10 + i);
        }
        ck_assert_int_eq(kv_layer_bounded_insert(l, k, v, NULL), PD_OK);
        kv_layer_check(l);
    }
    kv_state s;
    kv_head_state hs[2];
    kv_layer_state(l, &s, hs);
    ck_assert(s.has_bounded);
    ck_assert_uint_eq(s.bounded.window, 3);
    ck_assert_uint_eq(s.bounded.len, 7);
    ck_assert_uint_eq(s.bounded.head, 1);
    /* slot 0 holds insert 6, slot 1 insert 4, slot 2 insert 5; head 1 at offset 3 */
    ck_assert_float_eq(s.bounded.k[0 * 3 + 0], 60.0f);
    ck_assert_float_eq(s.bounded.k[1 * 3 + 2], 42.0f);
    ck_assert_float_eq(s.bounded.v[(3 + 2) * 3 + 1], -54.0f);
    /* the ring is not per-position storage: rows, eviction and trim ignore it,
     * and truncate leaves it alone */
    ck_assert_uint_eq(kv_layer_rows(l), 0);
    app_swa(l, 2, 3, 0, 1, 2);
    ck_assert_uint_eq(kv_layer_trim_window(l, 1, 0, 1), 0);
    trunc_ok(l, 1);
    kv_layer_state(l, &s, hs);
    ck_assert_uint_eq(s.bounded.len, 7);
    kv_layer_clear(l);
    kv_layer_state(l, &s, hs);
    ck_assert_uint_eq(s.bounded.len, 0);
    ck_assert_float_eq(s.bounded.k[0], 0.0f);
    kv_layer_free(l);
}
END_TEST

START_TEST(kv_refuses_bad_arguments)
{
    kv_layer *l = NULL;
    pd_err e = {0};
    ck_assert_int_eq(kv_layer_new(&(kv_layer_config){.n_kv_heads = 0, .head_dim = 4}, &l, &e),
                     PD_ERR_ARG);
    ck_assert_ptr_null(l);
    ck_assert_int_eq(kv_layer_new(&(kv_layer_config){.n_kv_heads = 1, .head_dim = 0}, &l, NULL),
                     PD_ERR_ARG);
    ck_assert_int_eq(kv_layer_new(&(kv_layer_config){.n_kv_heads = 1, .head_dim = 4,
                                                     .mode = (kv_mode)7}, &l, NULL),
                     PD_ERR_ARG);
    ck_assert_int_eq(kv_layer_new(NULL, &l, NULL), PD_ERR_ARG);
    ck_assert_ptr_null(l);
    l = mk((kv_layer_config){.n_kv_heads = 2, .head_dim = 4, .capacity_rows = 5});
    for (uint32_t p = 0; p < 5; p++)
        app_swa(l, 2, 4, p, 1, 2);
    ck_assert_int_eq(kv_layer_append(l, NULL, NULL, NULL), PD_ERR_ARG);
    float q[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[8] = {0}, small[3];
    const float zero[8] = {0};
    kv_attend a = {.kv_head = 2, .n_q = 1, .q = q, .out = out};
    pd_err e2 = {0};
    ck_assert_int_eq(kv_layer_attend(l, &a, NULL, &e2), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e2.msg, "kv_head"));
    a.kv_head = 0;
    a.n_q = 0;
    ck_assert_int_eq(kv_layer_attend(l, &a, NULL, NULL), PD_ERR_ARG);
    /* two Q heads on a layer whose own scratch serves one; too small a
     * caller scratch: refused, nothing written, importance untouched */
    a.n_q = 2;
    a.track_imp = 1;
    ck_assert_int_eq(kv_layer_attend(l, &a, NULL, NULL), PD_ERR_RANGE);
    a.scratch = small;
    a.scratch_floats = 3;
    ck_assert_int_eq(kv_layer_attend(l, &a, NULL, NULL), PD_ERR_RANGE);
    ck_assert(same_bits(out, zero, 8));
    float imp[5];
    kv_layer_importance(l, imp);
    ck_assert(same_bits(imp, zero, 5));
    /* with a big enough caller scratch it works */
    size_t n = kv_layer_scratch_floats(l, 2);
    float *scr = malloc(sizeof(float) * n);
    a.scratch = scr;
    a.scratch_floats = n;
    uint32_t span = 0;
    ck_assert_int_eq(kv_layer_attend(l, &a, &span, NULL), PD_OK);
    ck_assert_uint_eq(span, 5);
    kv_layer_importance(l, imp);
    ck_assert_float_eq_tol(imp[0] + imp[1] + imp[2] + imp[3] + imp[4], 2.0f, 1e-5f);
    free(scr);
    ck_assert_int_eq(kv_layer_set_linear(l, NULL, 3, NULL), PD_ERR_ARG);
    ck_assert_int_eq(kv_layer_truncate_last(NULL, 1, NULL), PD_ERR_ARG);
    kv_layer_free(l);
}
END_TEST

/* ---- randomized sequences -------------------------------------------------- */

/* Two layers, R and S, take the same random operations (append, attend,
 * truncate, confirm, evict, trim, clear, records); S additionally runs
 * verify bursts (confirm, accepted + draft rows as a chunk, attends with
 * upto, rollback of the drafts) where R appends the accepted rows one at a
 * time. kv_layer_check after every mutation; attends compared bit for bit;
 * states byte-identical after every burst. */
START_TEST(kv_randomized_sequences_keep_invariants)
{
    const uint32_t cfg_i = (uint32_t)_i; /* 12 configurations: shape cfg_i % 3, mode cfg_i / 3 */
    pd_rng rng = {.s = 0x9e3779b97f4a7c15ull * (cfg_i + 1)};
    const shape *s = &shapes[cfg_i % 3];
    kv_layer_config cfg = shape_cfg(s, all_modes[(cfg_i / 3) % 4], 8 + pd_rng_below(&rng, 12),
                                    6 + pd_rng_below(&rng, 8));
    cfg.capacity_rows = pd_rng_below(&rng, 20);
    kv_layer *R = mk(cfg), *S = mk(cfg);
    size_t nout = (size_t)s->n_kv * s->g * s->hd;
    float *o1 = malloc(sizeof(float) * nout), *o2 = malloc(sizeof(float) * nout);
    uint64_t salt = 1000;
    int bursts = 0;
    for (int step = 0; step < 250; step++) {
        uint32_t op = pd_rng_below(&rng, 100);
        uint32_t p = (uint32_t)kv_layer_pos_len(R);
        uint32_t rows = (uint32_t)kv_layer_rows(R);
        if (op < 30) { /* decode step */
            app_swa(R, s->n_kv, s->hd, p, salt, salt + 1);
            app_swa(S, s->n_kv, s->hd, p, salt, salt + 1);
            step_attend(R, s, salt, rows + 1, 0, o1);
            step_attend(S, s, salt, rows + 1, 0, o2);
            ck_assert(same_bits(o1, o2, nout));
            salt++;
        } else if (op < 40 && rows) { /* any attend */
            uint32_t h = pd_rng_below(&rng, s->n_kv), upto = pd_rng_below(&rng, rows + 1);
            uint32_t first = pd_rng_below(&rng, rows), track = pd_rng_below(&rng, 2);
            float q[4 * MAXD];
            swa_fill(q, salt++, s->g * s->hd, 3);
            att(R, h, 0, s->g, q, 0, 0, first, upto, (int)track, o1, NULL);
            att(S, h, 0, s->g, q, 0, 0, first, upto, (int)track, o2, NULL);
            ck_assert(same_bits(o1, o2, (size_t)s->g * s->hd));
        } else if (op < 55) { /* verify burst */
            kv_layer_confirm(R, p);
            kv_layer_confirm(S, p);
            uint32_t d = 1 + pd_rng_below(&rng, 6), a = pd_rng_below(&rng, d + 1);
            for (uint32_t i = 0; i < d; i++)
                app_swa(S, s->n_kv, s->hd, p + i, i < a ? salt + i : 99999 + salt,
                        i < a ? salt + i + 1 : 77777 + salt);
            for (uint32_t i = 0; i < d; i++)
                step_attend(S, s, salt + i, rows + i + 1, 1, o2);
            trunc_ok(S, d - a);
            for (uint32_t i = 0; i < a; i++) {
                app_swa(R, s->n_kv, s->hd, p + i, salt + i, salt + i + 1);
                step_attend(R, s, salt + i, rows + i + 1, 0, o1);
            }
            salt += d;
            assert_same_state(R, S);
            bursts++;
        } else if (op < 62) {
            uint32_t n = pd_rng_below(&rng, (rows < 8 ? rows : 8) + 1);
            trunc_ok(R, n);
            trunc_ok(S, n);
        } else if (op < 70) {
            uint64_t pos = pd_rng_below(&rng, p + 2);
            kv_layer_confirm(R, pos);
            kv_layer_confirm(S, pos);
        } else if (op < 75) {
            uint32_t keep = pd_rng_below(&rng, rows + 2);
            ck_assert_uint_eq(kv_layer_evict_recent(R, keep), kv_layer_evict_recent(S, keep));
        } else if (op < 80) {
            uint32_t b = pd_rng_below(&rng, rows + 2), sk = pd_rng_below(&rng, 4),
                     rc = pd_rng_below(&rng, 6);
            ck_assert_uint_eq(kv_layer_evict_importance(R, b, sk, rc),
                              kv_layer_evict_importance(S, b, sk, rc));
        } else if (op < 88) {
            uint32_t w = 1 + pd_rng_below(&rng, 12), sl = pd_rng_below(&rng, 4),
                     al = pd_rng_below(&rng, 5);
            ck_assert_uint_eq(kv_layer_trim_window(R, w, sl, al),
                              kv_layer_trim_window(S, w, sl, al));
        } else if (op < 90) {
            kv_layer_clear(R);
            kv_layer_clear(S);
        } else if (op < 93) {
            float lin[7];
            uint32_t n = pd_rng_below(&rng, 8);
            swa_fill(lin, salt++, 7, 5);
            ck_assert_int_eq(kv_layer_set_linear(R, lin, n, NULL), PD_OK);
            ck_assert_int_eq(kv_layer_set_linear(S, lin, n, NULL), PD_OK);
        } else if (op < 95) {
            uint32_t w = 1 + pd_rng_below(&rng, 4);
            ck_assert_int_eq(kv_layer_install_bounded(R, w, NULL), PD_OK);
            ck_assert_int_eq(kv_layer_install_bounded(S, w, NULL), PD_OK);
        } else if (op < 97) {
            float k[MAXH * MAXD];
            swa_fill(k, salt++, s->n_kv * s->hd, 6);
            pd_status a = kv_layer_bounded_insert(R, k, k, NULL);
            ck_assert_int_eq(kv_layer_bounded_insert(S, k, k, NULL), a);
        } else { /* prefill chunk */
            uint32_t b = 1 + pd_rng_below(&rng, 10);
            for (uint32_t i = 0; i < b; i++) {
                app_swa(R, s->n_kv, s->hd, p + i, salt + i, salt + i + 1);
                app_swa(S, s->n_kv, s->hd, p + i, salt + i, salt + i + 1);
            }
            for (uint32_t i = 0; i < b; i++) {
                step_attend(R, s, salt + i, rows + i + 1, 1, o1);
                step_attend(S, s, salt + i, rows + i + 1, 1, o2);
                ck_assert(same_bits(o1, o2, nout));
            }
            salt += b;
        }
        kv_layer_check(R);
        kv_layer_check(S);
        ck_assert_uint_eq(kv_layer_pos_len(R), kv_layer_pos_len(S));
        ck_assert_uint_eq(kv_layer_rows(R), kv_layer_rows(S));
        ck_assert_uint_eq(kv_layer_base(R) + kv_layer_rows(R), kv_layer_pos_len(R));
    }
    ck_assert_int_gt(bursts, 10);
    kv_layer_confirm(R, kv_layer_pos_len(R));
    kv_layer_confirm(S, kv_layer_pos_len(S));
    assert_same_state(R, S);
    free(o1);
    free(o2);
    kv_layer_free(R);
    kv_layer_free(S);
}
END_TEST


/* ---- eviction decided elsewhere (speculation, issue 40) -------------------- */

START_TEST(kv_row_list_attend_equals_the_layer_that_keeps_those_rows)
{
    /* Attending a list of stored rows gives the bits (output and importance
     * of those rows) of a layer that kept exactly them: kv_layer_keep_rows
     * of a twin, then a plain attend. Every mode, contiguous and scattered
     * lists. */
    const uint32_t H = 2, D = 40, G = 2, R = 12;
    static const uint32_t lists[3][6] = {{0, 1, 2, 3, 4, 11}, {0, 3, 4, 7, 10, 11}, {2, 5, 6, 8, 9, 11}};
    for (int m = 0; m < KV_MODE_COUNT; m++)
        for (int li = 0; li < 3; li++) {
            kv_layer_config cfg = {.n_kv_heads = H, .head_dim = D, .mode = (kv_mode)m, .capacity_rows = 16,
                                   .spec_depth = 4, .max_q_per_kv = G};
            kv_layer *a = mk(cfg), *b = mk(cfg);
            float k[80], v[80], q[160], oa[160], ob[160];
            for (uint32_t r = 0; r < R; r++) {
                swa_fill(k, r, H * D, 1);
                swa_fill(v, r, H * D, 2);
                app(a, k, v);
                app(b, k, v);
            }
            const uint32_t *rows = lists[li], n = 6;
            attn_seg segs[6];
            float imp_rows[6];
            pd_err e = {0};
            ck_assert_msg(kv_layer_keep_rows(b, rows, n, &e) == PD_OK, "%s", e.msg);
            kv_layer_check(b);
            ck_assert_uint_eq(kv_layer_rows(b), n);
            swa_fill(q, 99, H * G * D, 3);
            for (uint32_t h = 0; h < H; h++) {
                kv_attend x = {.kv_head = h, .q_head0 = h * G, .n_q = G, .q = q + h * G * D, .track_imp = 1,
                               .out = oa + h * G * D, .rows = rows, .n_rows = n, .segs = segs, .imp_rows = imp_rows};
                ck_assert_msg(kv_layer_attend(a, &x, NULL, &e) == PD_OK, "%s", e.msg);
                kv_attend y = {.kv_head = h, .q_head0 = h * G, .n_q = G, .q = q + h * G * D, .track_imp = 1,
                               .out = ob + h * G * D};
                ck_assert_msg(kv_layer_attend(b, &y, NULL, &e) == PD_OK, "%s", e.msg);
            }
            ck_assert_msg(memcmp(oa, ob, sizeof(float) * H * G * D) == 0, "mode %d list %d: output", m, li);
            float ia[16], ib[16];
            kv_layer_importance(a, ia);
            kv_layer_importance(b, ib);
            for (uint32_t i = 0; i < n; i++)
                ck_assert_msg(memcmp(&ia[rows[i]], &ib[i], 4) == 0 && ib[i] > 0, "mode %d list %d: importance", m,
                              li);
            for (uint32_t r = 0, i = 0; r < R; r++) /* rows off the list got nothing */
                if (i < n && rows[i] == r)
                    i++;
                else
                    ck_assert(ia[r] == 0.0f);
            /* the view below a row folds only the positions before it */
            float below[16];
            kv_layer_importance_below(a, R - 1, below);
            for (uint32_t r = 0; r < R - 1; r++)
                ck_assert(below[r] == 0.0f);
            kv_layer_free(a);
            kv_layer_free(b);
        }
}
END_TEST

START_TEST(kv_keep_rows_and_row_lists_refuse_bad_lists_without_change)
{
    kv_layer_config cfg = {.n_kv_heads = 1, .head_dim = 8, .capacity_rows = 8};
    kv_layer *l = mk(cfg);
    float k[8], v[8], q[8], o[8];
    for (uint32_t r = 0; r < 5; r++) {
        swa_fill(k, r, 8, 4);
        swa_fill(v, r, 8, 5);
        app(l, k, v);
    }
    uint64_t gen = kv_layer_generation(l);
    pd_err e = {0};
    const uint32_t dup[3] = {0, 2, 2}, out_of[2] = {1, 5}, down[2] = {3, 1};
    ck_assert_int_eq(kv_layer_keep_rows(l, dup, 3, &e), PD_ERR_RANGE);
    ck_assert_int_eq(kv_layer_keep_rows(l, out_of, 2, &e), PD_ERR_RANGE);
    ck_assert_int_eq(kv_layer_keep_rows(l, down, 2, &e), PD_ERR_RANGE);
    ck_assert_int_eq(kv_layer_keep_rows(l, NULL, 2, &e), PD_ERR_ARG);
    ck_assert_uint_eq(kv_layer_rows(l), 5);
    ck_assert_uint_eq(kv_layer_generation(l), gen);
    attn_seg segs[3];
    swa_fill(q, 1, 8, 6);
    kv_attend a = {.kv_head = 0, .n_q = 1, .q = q, .out = o, .rows = down, .n_rows = 2, .segs = segs};
    ck_assert_int_eq(kv_layer_attend(l, &a, NULL, &e), PD_ERR_RANGE);
    a.rows = out_of;
    ck_assert_int_eq(kv_layer_attend(l, &a, NULL, &e), PD_ERR_RANGE);
    a.rows = dup;
    a.n_rows = 2;
    a.segs = NULL;
    ck_assert_int_eq(kv_layer_attend(l, &a, NULL, &e), PD_ERR_ARG);
    a.segs = segs;
    a.track_imp = 1; /* needs imp_rows */
    ck_assert_int_eq(kv_layer_attend(l, &a, NULL, &e), PD_ERR_ARG);
    /* keeping every row is no change at all */
    const uint32_t all[5] = {0, 1, 2, 3, 4};
    ck_assert_int_eq(kv_layer_keep_rows(l, all, 5, &e), PD_OK);
    ck_assert_uint_eq(kv_layer_generation(l), gen);
    kv_layer_free(l);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("kv_layer");
    TCase *tc = tcase_create("seed");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, kv_append_tracks_rows_and_head_major_layout);
    tcase_add_test(tc, kv_dead_head_stores_nothing);
    tcase_add_test(tc, kv_truncate_rolls_back_speculative_rows);
    tcase_add_test(tc, kv_evict_recent_keeps_last_rows);
    tcase_add_test(tc, kv_evict_importance_keeps_high_mass_row);
    tcase_add_test(tc, kv_evict_importance_never_exceeds_budget);
    tcase_add_test(tc, kv_evict_importance_mixed_modes_stay_consistent);
    tcase_add_test(tc, kv_q8_attend_matches_f32_within_grid);
    tcase_add_test(tc, kv_freeze_field_is_channel_rms_with_floor);
    tcase_add_test(tc, kv_grouped_attend_equals_per_head_bitexact_in_every_mode);
    tcase_add_test(tc, kv_sinks_match_f64_reference_with_windows);
    tcase_add_test(tc, kv_windowed_attend_equals_masked_full_row);
    tcase_add_test(tc, kv_attend_same_bits_on_every_isa);
    tcase_add_test(tc, kv_trim_keeps_contiguous_tail);
    tcase_add_test(tc, kv_anchored_trim_keeps_the_rollback_window);
    tcase_add_loop_test(tc, kv_trimmed_attend_equals_untrimmed, 0, PD_COUNT(all_modes) * PD_COUNT(trim_cases));
    tcase_add_test(tc, kv_truncate_after_trim_within_slack);
    tcase_add_test(tc, kv_evict_skips_tail_layer);
    tcase_add_test(tc, kv_generation_changes_on_every_non_append_mutation);
    suite_add_tcase(s, tc);
    TCase *tx = tcase_create("exactness");
    tcase_set_timeout(tx, 60);
    tcase_add_loop_test(tx, kv_attend_upto_equals_sequential_prefill_chunk, 0, PD_COUNT(shapes) * PD_COUNT(all_modes));
    tcase_add_loop_test(tx, kv_truncate_equals_never_appended, 0,
                        PD_COUNT(variants) * PD_COUNT(shapes) * PD_COUNT(all_modes));
    tcase_add_test(tx, kv_truncate_undoes_a_freeze_from_rolled_back_rows);
    tcase_add_test(tx, kv_rolled_back_importance_is_not_kept);
    tcase_add_loop_test(tx, kv_memory_matches_analytic_formula, 0, PD_COUNT(all_modes) * PD_COUNT(masks));
    tcase_add_test(tx, kv_append_within_capacity_does_not_allocate);
    tcase_add_test(tx, kv_allocation_failure_leaves_layer_unchanged);
    suite_add_tcase(s, tx);
    TCase *ts = tcase_create("state");
    tcase_set_timeout(ts, 60);
    tcase_add_test(ts, kv_state_round_trip_answers_identically);
    tcase_add_test(ts, kv_assign_state_reuses_a_spare_without_allocating);
    tcase_add_test(ts, kv_new_from_state_refusals_create_nothing);
    tcase_add_test(ts, kv_swap_exchanges_state_and_keeps_sinks);
    tcase_add_test(ts, kv_bounded_ring_insert_overwrites_len_mod_window);
    tcase_add_test(ts, kv_refuses_bad_arguments);
    tcase_add_loop_test(ts, kv_randomized_sequences_keep_invariants, 0, 12);
    tcase_add_test(ts, kv_row_list_attend_equals_the_layer_that_keeps_those_rows);
    tcase_add_test(ts, kv_keep_rows_and_row_lists_refuse_bad_lists_without_change);
    suite_add_tcase(s, ts);
    return s;
}
