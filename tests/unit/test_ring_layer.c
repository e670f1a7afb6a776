/* ring_layer: the R-SWA ring cache. Ports the intent of the seed RingCache
 * tests (warm-up, steady state, wrap, prefill validation, identity, int8
 * mirror; its checkpoint / rollback went: speculation rolls back by
 * discarding drafts) and checks what the port adds:
 * verify without cloning == sequential steps at every fill level, exact
 * memory, state export / install, an f64 naive oracle, randomized sequences. */
#include "pd_test.h"

#include "cache/attn.h"
#include "cache/kv_layer.h"
#include "cache/quant.h"
#include "cache/ring_layer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------ */

/* An allocator that counts bytes and calls, to check exact accounting and
 * allocation-free hot paths. */
typedef struct count_alloc {
    size_t live_bytes;
    size_t calls;
    size_t frees;
} count_alloc;

static void *count_alloc_fn(void *ctx, size_t bytes)
{
    count_alloc *c = ctx;
    c->live_bytes += bytes;
    c->calls++;
    return pd_alloc_default()->alloc(NULL, bytes);
}

static void count_free_fn(void *ctx, void *p, size_t bytes)
{
    count_alloc *c = ctx;
    c->live_bytes -= bytes;
    c->frees++;
    pd_alloc_default()->free(NULL, p, bytes);
}

/* The storage a test's `i8` argument asks for: 0 f32, 1 the int8 mirror,
 * ST_Q8(mode) int8 storage of that kv_mode (q8k, q8v, q8). */
#define ST_Q8(mode) (1 + (int)(mode))
#define ST_COUNT 5
static int st_mirror(int i8) { return i8 == 1; }
static kv_mode st_mode(int i8) { return i8 >= 2 ? (kv_mode)(i8 - 1) : KV_MODE_F32; }

static ring_layer *mk(uint32_t H, uint32_t D, uint32_t W, uint32_t cap, uint32_t K, int i8,
                      uint32_t max_group)
{
    ring_layer_config cfg = {.n_kv_heads = H,
                             .head_dim = D,
                             .window = W,
                             .ref_capacity = cap,
                             .max_drafts = K,
                             .int8_mirror = st_mirror(i8),
                             .mode = st_mode(i8),
                             .max_group = max_group};
    ring_layer *r = NULL;
    pd_err e = {0};
    ck_assert_msg(ring_layer_new(&cfg, &r, &e) == PD_OK, "%s", e.msg);
    ck_assert_ptr_nonnull(r);
    return r;
}

static void check_ok(const ring_layer *r)
{
    pd_err e = {0};
    ck_assert_msg(ring_layer_check(r, &e) == PD_OK, "%s", e.msg);
}

static void fill_const(float *x, size_t n, float v)
{
    for (size_t i = 0; i < n; i++)
        x[i] = v;
}

static void prefill_ok(ring_layer *r, const float *k, const float *v, uint32_t n)
{
    pd_err e = {0};
    ck_assert_msg(ring_layer_prefill(r, k, v, n, &e) == PD_OK, "%s", e.msg);
    check_ok(r);
}

static uint32_t write_ok(ring_layer *r, const float *k, const float *v)
{
    pd_err e = {0};
    uint32_t slot = UINT32_MAX;
    ck_assert_msg(ring_layer_write(r, k, v, &slot, &e) == PD_OK, "%s", e.msg);
    check_ok(r);
    return slot;
}

static void attend_ok(const ring_layer *r, const float *q, const ring_attend_opts *o, float *out)
{
    pd_err e = {0};
    ck_assert_msg(ring_layer_attend(r, q, o, out, NULL, &e) == PD_OK, "%s", e.msg);
}

/* A copy of everything readable in a layer: cursors, reference rows, live
 * ring rows, pending draft count, memory figures, identity. */
typedef struct snap {
    ring_state st;
    float *ref, *ring;
    size_t n_ref, n_ring;
    uint32_t drafts;
    ring_layer_mem mem;
    uint64_t id;
} snap;

/* The rows of head h of the reference (ring == 0) or the ring, K (v == 0) or
 * V, as the attention reads them: f32, or int8 codes times their scales. */
static void rows_read(const ring_state *st, int ring, int v, size_t h, float *out)
{
    const uint32_t D = st->head_dim, n = ring ? st->ring_len : st->ref_rows;
    const float *const *f = ring ? (v ? st->ring_v : st->ring_k) : (v ? st->ref_v : st->ref_k);
    if (n == 0)
        return;
    if (f) {
        memcpy(out, f[h], sizeof(float) * n * D);
        return;
    }
    const int8_t *q = (ring ? (v ? st->ring_vq : st->ring_kq) : (v ? st->ref_vq : st->ref_kq))[h];
    const float *sc = (ring ? (v ? st->ring_vs : st->ring_ks) : (v ? st->ref_vs : st->ref_ks))[h];
    const uint32_t grp = v ? D : RING_K_GROUP, G = (D + grp - 1) / grp;
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t d = 0; d < D; d++)
            out[(size_t)i * D + d] = (float)q[(size_t)i * D + d] * sc[(size_t)i * G + d / grp];
}

static snap snap_take(const ring_layer *r)
{
    snap s = {0};
    ring_layer_state(r, &s.st);
    const size_t D = s.st.head_dim, H = s.st.n_kv_heads;
    s.n_ref = H * s.st.ref_rows * D;
    s.n_ring = H * s.st.ring_len * D;
    s.ref = calloc(2 * s.n_ref + 1, sizeof(float));
    s.ring = calloc(2 * s.n_ring + 1, sizeof(float));
    for (size_t h = 0; h < H; h++) {
        rows_read(&s.st, 0, 0, h, s.ref + h * s.st.ref_rows * D);
        rows_read(&s.st, 0, 1, h, s.ref + s.n_ref + h * s.st.ref_rows * D);
        rows_read(&s.st, 1, 0, h, s.ring + h * s.st.ring_len * D);
        rows_read(&s.st, 1, 1, h, s.ring + s.n_ring + h * s.st.ring_len * D);
    }
    s.drafts = ring_layer_drafts(r);
    ring_layer_mem_get(r, &s.mem);
    s.id = ring_layer_id(r);
    return s;
}

static void snap_free(snap *s)
{
    free(s->ref);
    free(s->ring);
}

/* Same readable state (identity-independent parts when !same_layer). */
static void snap_eq(const snap *a, const snap *b, int same_layer, const char *what)
{
    ck_assert_msg(a->st.ref_rows == b->st.ref_rows, "%s: ref_rows", what);
    ck_assert_msg(a->st.ring_len == b->st.ring_len, "%s: ring_len %u vs %u", what,
                  a->st.ring_len, b->st.ring_len);
    ck_assert_msg(a->st.ring_pos == b->st.ring_pos, "%s: ring_pos", what);
    ck_assert_msg(a->st.writes == b->st.writes, "%s: writes", what);
    ck_assert_msg(a->st.decoding == b->st.decoding, "%s: decoding", what);
    ck_assert_msg(a->drafts == b->drafts, "%s: drafts", what);
    ck_assert_msg(a->mem.live == b->mem.live, "%s: live bytes", what);
    ck_assert_msg(memcmp(a->ref, b->ref, sizeof(float) * 2 * a->n_ref) == 0, "%s: ref rows",
                  what);
    ck_assert_msg(memcmp(a->ring, b->ring, sizeof(float) * 2 * a->n_ring) == 0,
                  "%s: ring rows", what);
    if (same_layer)
        ck_assert_msg(a->id == b->id, "%s: identity", what);
}

/* f64 naive softmax attention: Q head j of kv head j / g over rows (token-major
 * [n x H x D]) in the given order. */
static void naive_attend(uint32_t H, uint32_t D, uint32_t g, const float *rk, const float *rv,
                         uint32_t n, const float *q, double *out)
{
    double *sc = malloc(sizeof(double) * n);
    const double scale = 1.0 / sqrt((double)D);
    for (uint32_t j = 0; j < H * g; j++) {
        uint32_t h = j / g;
        double mx = -INFINITY;
        for (uint32_t r = 0; r < n; r++) {
            double s = 0;
            for (uint32_t d = 0; d < D; d++)
                s += (double)q[j * D + d] * rk[((size_t)r * H + h) * D + d];
            sc[r] = s * scale;
            mx = fmax(mx, sc[r]);
        }
        double sum = 0;
        for (uint32_t r = 0; r < n; r++) {
            sc[r] = exp(sc[r] - mx);
            sum += sc[r];
        }
        for (uint32_t d = 0; d < D; d++) {
            double acc = 0;
            for (uint32_t r = 0; r < n; r++)
                acc += sc[r] / sum * rv[((size_t)r * H + h) * D + d];
            out[j * D + d] = acc;
        }
    }
    free(sc);
}

/* ---- creation and prefill ------------------------------------------------ */

START_TEST(ring_new_rejects_bad_geometry_and_free_null_is_noop)
{
    ring_layer_free(NULL);
    const ring_layer_config good = {
        .n_kv_heads = 2, .head_dim = 4, .window = 3, .ref_capacity = 5, .max_drafts = 2};
    ring_layer_config bad[5];
    for (int i = 0; i < 5; i++)
        bad[i] = good;
    bad[0].n_kv_heads = 0;
    bad[1].head_dim = 0;
    bad[2].window = 0;
    bad[3].ref_capacity = 0;
    bad[4].ref_capacity = UINT32_MAX; /* capacity + window + drafts overflows 32 bits */
    const pd_status want[5] = {PD_ERR_ARG, PD_ERR_ARG, PD_ERR_ARG, PD_ERR_ARG, PD_ERR_NOMEM};
    for (int i = 0; i < 5; i++) {
        ring_layer *r = (ring_layer *)&bad[i]; /* sentinel: must stay untouched */
        pd_err e = {0};
        ck_assert_int_eq(ring_layer_new(&bad[i], &r, &e), want[i]);
        ck_assert_ptr_eq(r, (ring_layer *)&bad[i]);
        ck_assert(strlen(e.msg) > 0);
    }
    /* Size overflow of the storage itself (huge heads x dims x capacity). */
    ring_layer_config huge = {.n_kv_heads = UINT32_MAX,
                              .head_dim = UINT32_MAX,
                              .window = 1,
                              .ref_capacity = 1u << 30};
    ring_layer *r = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ring_layer_new(&huge, &r, &e), PD_ERR_NOMEM);
    ck_assert_ptr_null(r);
    ck_assert_ptr_nonnull(strstr(e.msg, "overflow"));
}
END_TEST

START_TEST(ring_new_is_empty_with_resolved_config)
{
    ring_layer *r = mk(3, 8, 4, 10, 2, 0, 0);
    check_ok(r);
    ring_state st;
    ring_layer_state(r, &st);
    ck_assert_uint_eq(st.n_kv_heads, 3);
    ck_assert_uint_eq(st.head_dim, 8);
    ck_assert_uint_eq(st.window, 4);
    ck_assert_uint_eq(st.ref_rows, 0);
    ck_assert_uint_eq(st.ring_len, 0);
    ck_assert_uint_eq(st.ring_pos, 0);
    ck_assert_uint_eq(st.writes, 0);
    ck_assert_int_eq(st.decoding, 0);
    ck_assert_uint_eq(ring_layer_drafts(r), 0);
    ck_assert_uint_eq(ring_layer_position(r), 0);
    ring_layer_config cfg;
    ring_layer_config_get(r, &cfg);
    ck_assert_ptr_eq(cfg.alloc, pd_alloc_default());
    ck_assert_uint_eq(cfg.max_group, 1);
    ck_assert_uint_eq(cfg.ref_capacity, 10);
    ring_layer_free(r);
}
END_TEST

START_TEST(ring_prefill_sets_reference_rows)
{
    const uint32_t H = 2, D = 4, n = 8;
    ring_layer *r = mk(H, D, 4, 64, 0, 0, 1);
    float k[8 * 2 * 4], v[8 * 2 * 4];
    for (uint32_t i = 0; i < n; i++)
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t d = 0; d < D; d++) {
                k[(i * H + h) * D + d] = (float)(i * 100 + h * 10 + d);
                v[(i * H + h) * D + d] = -(float)(i * 100 + h * 10 + d);
            }
    prefill_ok(r, k, v, n);
    ring_state st;
    ring_layer_state(r, &st);
    ck_assert_uint_eq(st.ref_rows, n);
    ck_assert_uint_eq(ring_layer_position(r), n);
    /* Head-major view: head 1, row 3, channel 2. */
    ck_assert_float_eq(st.ref_k[1][3 * D + 2], 312.0f);
    ck_assert_float_eq(st.ref_v[1][3 * D + 2], -312.0f);
    ck_assert_float_eq(st.ref_k[0][7 * D + 0], 700.0f);
    ring_layer_free(r);
}
END_TEST

START_TEST(ring_prefill_refusals_leave_layer_unchanged)
{
    const uint32_t H = 2, D = 4;
    ring_layer *r = mk(H, D, 3, 4, 2, 1, 1);
    float k[8 * 2 * 4], v[8 * 2 * 4];
    pd_rng g = {.s = 7};
    pd_rng_fill(&g, k, sizeof k / sizeof *k, -1, 1);
    pd_rng_fill(&g, v, sizeof v / sizeof *v, -1, 1);
    prefill_ok(r, k, v, 3);
    snap before = snap_take(r);
    pd_err e = {0};
    /* beyond capacity: 3 + 2 > 4 */
    ck_assert_int_eq(ring_layer_prefill(r, k, v, 2, &e), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "ref_capacity"));
    pd_err_clear(&e);
    ck_assert_int_eq(ring_layer_prefill(r, NULL, v, 1, &e), PD_ERR_ARG);
    snap mid = snap_take(r);
    snap_eq(&before, &mid, 1, "after refused prefill");
    snap_free(&mid);
    /* while drafts are pending */
    ck_assert_int_eq(ring_layer_draft_put(r, k, v, &e), PD_OK);
    pd_err_clear(&e);
    ck_assert_int_eq(ring_layer_prefill(r, k, v, 1, &e), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.msg, "drafts"));
    ring_layer_draft_discard(r);
    /* 0 rows is a no-op; one more row fits exactly */
    ck_assert_int_eq(ring_layer_prefill(r, k, v, 0, &e), PD_OK);
    prefill_ok(r, k, v, 1);
    /* sealed once decoding starts */
    write_ok(r, k, v);
    pd_err_clear(&e);
    snap sealed = snap_take(r);
    ck_assert_int_eq(ring_layer_prefill(r, k, v, 1, &e), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.msg, "sealed"));
    snap after = snap_take(r);
    snap_eq(&sealed, &after, 1, "after sealed prefill");
    check_ok(r);
    snap_free(&before);
    snap_free(&sealed);
    snap_free(&after);
    ring_layer_free(r);
}
END_TEST

START_TEST(ring_chunked_prefill_equals_whole_prefill)
{
    const uint32_t H = 2, D = 12, n = 11, g = 3;
    pd_rng rng = {.s = 99};
    float *k = malloc(sizeof(float) * n * H * D), *v = malloc(sizeof(float) * n * H * D);
    float q[2 * 3 * 12], a[2 * 3 * 12], b[2 * 3 * 12], c[2 * 3 * 12];
    pd_rng_fill(&rng, k, (size_t)n * H * D, -1, 1);
    pd_rng_fill(&rng, v, (size_t)n * H * D, -1, 1);
    for (int i8 = 0; i8 < ST_COUNT; i8++) {
        ring_layer *whole = mk(H, D, 4, 16, 0, i8, g);
        ring_layer *chunked = mk(H, D, 4, 16, 0, i8, g);
        prefill_ok(whole, k, v, n);
        const uint32_t chunks[4] = {3, 1, 5, 2};
        for (uint32_t i = 0, at = 0; i < 4; at += chunks[i], i++)
            prefill_ok(chunked, k + (size_t)at * H * D, v + (size_t)at * H * D, chunks[i]);
        snap sw = snap_take(whole), sc = snap_take(chunked);
        snap_eq(&sw, &sc, 0, "chunked vs whole");
        snap_free(&sw);
        snap_free(&sc);
        ring_attend_opts o = {.group = g};
        for (uint32_t row = 0; row < n; row++) {
            pd_rng_fill(&rng, q, sizeof q / sizeof *q, -1, 1);
            pd_err e = {0};
            ck_assert_int_eq(ring_layer_attend_prefill(whole, row, q, &o, a, NULL, &e), PD_OK);
            ck_assert_int_eq(ring_layer_attend_prefill(chunked, row, q, &o, b, NULL, &e),
                             PD_OK);
            ck_assert_msg(memcmp(a, b, sizeof a) == 0, "row %u differs", row);
            /* Prefill row i == a decode attend over exactly rows [0, i]. */
            ring_layer *upto = mk(H, D, 4, 16, 0, i8, g);
            prefill_ok(upto, k, v, row + 1);
            attend_ok(upto, q, &o, c);
            ck_assert_msg(memcmp(a, c, sizeof a) == 0, "row %u != attend over rows 0..%u", row,
                          row);
            ring_layer_free(upto);
        }
        pd_err e = {0};
        ck_assert_int_eq(ring_layer_attend_prefill(whole, n, q, &o, a, NULL, &e), PD_ERR_RANGE);
        ring_layer_free(whole);
        ring_layer_free(chunked);
    }
    free(k);
    free(v);
}
END_TEST

/* ---- decode attention ---------------------------------------------------- */

START_TEST(ring_decode_single_key_returns_value)
{
    const uint32_t H = 3, D = 8;
    ring_layer *r = mk(H, D, 4, 8, 0, 0, 1);
    float k[3 * 8] = {0}, v[3 * 8], q[3 * 8] = {0}, out[3 * 8];
    for (uint32_t h = 0; h < H; h++) {
        k[h * D] = 1.0f;
        q[h * D] = 5.0f;
    }
    fill_const(v, H * D, 7.0f);
    prefill_ok(r, k, v, 1);
    attend_ok(r, q, NULL, out);
    for (uint32_t i = 0; i < H * D; i++)
        ck_assert_float_eq(out[i], 7.0f);
    ring_layer_free(r);
}
END_TEST

START_TEST(ring_decode_equal_scores_average_values)
{
    const uint32_t H = 2, D = 4;
    ring_layer *r = mk(H, D, 4, 8, 0, 0, 2);
    float k[2 * 2 * 4] = {0}, v[2 * 2 * 4], q[4 * 4] = {0}, out[4 * 4];
    for (uint32_t i = 0; i < 2; i++)
        for (uint32_t h = 0; h < H; h++) {
            k[(i * H + h) * D] = 1.0f;
            for (uint32_t d = 0; d < D; d++)
                v[(i * H + h) * D + d] = i == 0 ? 2.0f : 4.0f;
        }
    for (uint32_t j = 0; j < 4; j++)
        q[j * D] = 3.0f;
    prefill_ok(r, k, v, 2);
    ring_attend_opts o = {.group = 2};
    attend_ok(r, q, &o, out);
    for (uint32_t i = 0; i < 4 * D; i++)
        ck_assert_msg(fabsf(out[i] - 3.0f) < 1e-6f, "out[%u] = %g", i, out[i]);
    ring_layer_free(r);
}
END_TEST

START_TEST(ring_ring_token_dominates_reference)
{
    /* The seed's write-then-attend case: one reference row orthogonal to q,
     * one ring row aligned with it; softmax([10/sqrt(D), 0]). */
    const uint32_t H = 2, D = 16;
    ring_layer *r = mk(H, D, 4, 8, 0, 0, 1);
    float k[2 * 16] = {0}, v[2 * 16], kt[2 * 16] = {0}, vt[2 * 16], q[2 * 16] = {0}, out[2 * 16];
    for (uint32_t h = 0; h < H; h++) {
        k[h * D + 1] = 1.0f;
        kt[h * D] = 1.0f;
        q[h * D] = 10.0f;
    }
    fill_const(v, H * D, 1.0f);
    fill_const(vt, H * D, 5.0f);
    prefill_ok(r, k, v, 1);
    ck_assert_uint_eq(write_ok(r, kt, vt), 0);
    attend_ok(r, q, NULL, out);
    double w = exp(10.0 / sqrt((double)D));
    double expect = (w * 5.0 + 1.0) / (w + 1.0);
    for (uint32_t i = 0; i < H * D; i++) {
        ck_assert_msg(fabs(out[i] - expect) < 1e-5, "got %g expected %g", out[i], expect);
        ck_assert(out[i] > 3.0f);
    }
    ring_layer_free(r);
}
END_TEST

START_TEST(ring_decode_matches_f64_naive_softmax)
{
    /* Reference ++ ring in age order, with the ring warm, full and wrapped,
     * for several GQA shapes, against an f64 softmax oracle. */
    const uint32_t shapes[3][3] = {{1, 16, 1}, {2, 12, 3}, {3, 5, 2}}; /* H, D, group */
    pd_rng rng = {.s = 4242};
    for (int si = 0; si < 3; si++) {
        const uint32_t H = shapes[si][0], D = shapes[si][1], g = shapes[si][2];
        const uint32_t W = 5, R = 6, steps = 13;
        const size_t tok = (size_t)H * D;
        float *rows_k = malloc(sizeof(float) * (R + steps) * tok);
        float *rows_v = malloc(sizeof(float) * (R + steps) * tok);
        pd_rng_fill(&rng, rows_k, (R + steps) * tok, -2, 2);
        pd_rng_fill(&rng, rows_v, (R + steps) * tok, -1, 1);
        float *q = malloc(sizeof(float) * tok * g), *out = malloc(sizeof(float) * tok * g);
        double *want = malloc(sizeof(double) * tok * g);
        float *vis_k = malloc(sizeof(float) * (R + W) * tok);
        float *vis_v = malloc(sizeof(float) * (R + W) * tok);
        ring_layer *r = mk(H, D, W, R, 0, 0, g);
        prefill_ok(r, rows_k, rows_v, R);
        ring_attend_opts o = {.group = g};
        for (uint32_t t = 0; t <= steps; t++) {
            if (t > 0)
                write_ok(r, rows_k + (R + t - 1) * tok, rows_v + (R + t - 1) * tok);
            /* visible rows: the reference, then the last min(t, W) generated */
            uint32_t keep = t < W ? t : W;
            memcpy(vis_k, rows_k, sizeof(float) * R * tok);
            memcpy(vis_v, rows_v, sizeof(float) * R * tok);
            memcpy(vis_k + R * tok, rows_k + (R + t - keep) * tok, sizeof(float) * keep * tok);
            memcpy(vis_v + R * tok, rows_v + (R + t - keep) * tok, sizeof(float) * keep * tok);
            pd_rng_fill(&rng, q, tok * g, -1, 1);
            attend_ok(r, q, &o, out);
            naive_attend(H, D, g, vis_k, vis_v, R + keep, q, want);
            for (size_t i = 0; i < tok * g; i++)
                ck_assert_msg(fabs(out[i] - want[i]) <= 2e-6 * (1.0 + fabs(want[i])),
                              "shape %d step %u [%zu]: %.9g vs %.9g", si, t, i, out[i],
                              want[i]);
        }
        ring_layer_free(r);
        free(rows_k);
        free(rows_v);
        free(q);
        free(out);
        free(want);
        free(vis_k);
        free(vis_v);
    }
}
END_TEST

START_TEST(ring_attend_argument_errors_and_caller_scratch)
{
    const uint32_t H = 2, D = 8, g = 4;
    ring_layer *r = mk(H, D, 3, 4, 0, 0, 1);
    float q[2 * 4 * 8], a[2 * 4 * 8], b[2 * 4 * 8];
    pd_rng rng = {.s = 3};
    pd_rng_fill(&rng, q, sizeof q / sizeof *q, -1, 1);
    pd_err e = {0};
    ring_attend_opts o = {.group = g};
    /* nothing held yet */
    ck_assert_int_eq(ring_layer_attend(r, q, NULL, a, NULL, &e), PD_ERR_RANGE);
    float k[2 * 8], v[2 * 8];
    pd_rng_fill(&rng, k, H * D, -1, 1);
    pd_rng_fill(&rng, v, H * D, -1, 1);
    prefill_ok(r, k, v, 1);
    write_ok(r, v, k);
    pd_err_clear(&e);
    /* group 4 exceeds the owned scratch (max_group 1) */
    fill_const(a, sizeof a / sizeof *a, -9.0f);
    ck_assert_int_eq(ring_layer_attend(r, q, &o, a, NULL, &e), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "max_group"));
    ck_assert_float_eq(a[0], -9.0f);
    pd_err_clear(&e);
    ck_assert_int_eq(ring_layer_attend(r, NULL, &o, a, NULL, &e), PD_ERR_ARG);
    size_t nf = ring_layer_scratch_floats(r, g);
    ck_assert(nf > 0);
    float *scratch = malloc(sizeof(float) * nf);
    ck_assert_int_eq(ring_layer_attend(r, q, &o, a, scratch, &e), PD_OK);
    /* grouped == per-head: each Q head alone with group 1 sees the same bits */
    for (uint32_t j = 0; j < H * g; j++) {
        ring_layer *one = mk(1, D, 3, 4, 0, 0, 1);
        float k1[8], v1[8], k2[8], v2[8];
        memcpy(k1, k + (j / g) * D, sizeof k1);
        memcpy(v1, v + (j / g) * D, sizeof v1);
        memcpy(k2, v + (j / g) * D, sizeof k2);
        memcpy(v2, k + (j / g) * D, sizeof v2);
        prefill_ok(one, k1, v1, 1);
        write_ok(one, k2, v2);
        attend_ok(one, q + j * D, NULL, b);
        ck_assert_msg(memcmp(a + j * D, b, sizeof(float) * D) == 0, "q head %u", j);
        ring_layer_free(one);
    }
    free(scratch);
    ring_layer_free(r);
}
END_TEST

/* ---- ring mechanics ---------------------------------------------------- */

START_TEST(ring_warmup_appends_without_eviction)
{
    const uint32_t H = 2, D = 4, W = 6;
    ring_layer *r = mk(H, D, W, 8, 0, 0, 1);
    float k[2 * 4], v[2 * 4];
    fill_const(k, H * D, 1.0f);
    prefill_ok(r, k, k, 1);
    for (uint32_t step = 0; step < W; step++) {
        fill_const(k, H * D, (float)step);
        fill_const(v, H * D, -(float)step);
        ck_assert_uint_eq(write_ok(r, k, v), step);
        ring_state st;
        ring_layer_state(r, &st);
        ck_assert_uint_eq(st.ring_len, step + 1);
        ck_assert_uint_eq(st.ring_pos, (step + 1) % W);
        ck_assert_uint_eq(ring_layer_position(r), 1 + step + 1);
    }
    ring_state st;
    ring_layer_state(r, &st);
    ck_assert_uint_eq(st.ring_len, W);
    ck_assert_uint_eq(st.ring_pos, 0);
    for (uint32_t s = 0; s < W; s++)
        for (uint32_t h = 0; h < H; h++)
            ck_assert_float_eq(st.ring_k[h][s * D], (float)s); /* nothing evicted */
    ring_layer_free(r);
}
END_TEST

START_TEST(ring_steady_state_overwrites_modulo_w)
{
    const uint32_t H = 2, D = 4, W = 5;
    ring_layer *r = mk(H, D, W, 4, 0, 0, 1);
    float z[2 * 2 * 4] = {0}, k[2 * 4];
    prefill_ok(r, z, z, 2);
    for (uint32_t i = 0; i < W; i++)
        write_ok(r, z, z);
    fill_const(k, H * D, 99.0f);
    ck_assert_uint_eq(write_ok(r, k, k), 0);
    ring_state st;
    ring_layer_state(r, &st);
    ck_assert_uint_eq(st.ring_pos, 1);
    ck_assert_uint_eq(write_ok(r, k, k), 1);
    ring_layer_state(r, &st);
    ck_assert_uint_eq(st.ring_pos, 2);
    ck_assert_uint_eq(st.ring_len, W);
    ck_assert_float_eq(st.ring_k[1][0], 99.0f);
    ck_assert_float_eq(st.ring_k[1][1 * D], 99.0f);
    ck_assert_float_eq(st.ring_k[1][2 * D], 0.0f);
    ck_assert_uint_eq(st.ref_rows, 2); /* the reference is never written by decode */
    ring_layer_free(r);
}
END_TEST

START_TEST(ring_pos_wraps_modulo_w)
{
    for (uint32_t W = 1; W <= 4; W++) {
        ring_layer *r = mk(1, 2, W, 2, 0, 0, 1);
        float z[2] = {0};
        prefill_ok(r, z, z, 1);
        for (uint32_t i = 0; i < W; i++)
            ck_assert_uint_eq(write_ok(r, z, z), i);
        for (uint32_t i = 0; i < W; i++)
            ck_assert_uint_eq(write_ok(r, z, z), i);
        ring_state st;
        ring_layer_state(r, &st);
        ck_assert_uint_eq(st.ring_pos, 0);
        ck_assert_uint_eq(st.writes, 2 * W);
        ring_layer_free(r);
    }
}
END_TEST

START_TEST(ring_write_refusals_leave_layer_unchanged)
{
    ring_layer *r = mk(2, 4, 3, 4, 1, 0, 1);
    float k[2 * 4] = {1, 2, 3, 4, 5, 6, 7, 8};
    pd_err e = {0};
    /* before any prefill row */
    ck_assert_int_eq(ring_layer_write(r, k, k, NULL, &e), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "prefill"));
    pd_err_clear(&e);
    ck_assert_int_eq(ring_layer_draft_put(r, k, k, &e), PD_ERR_RANGE);
    check_ok(r);
    ring_state st;
    ring_layer_state(r, &st);
    ck_assert_int_eq(st.decoding, 0);
    ck_assert_uint_eq(st.writes, 0);
    prefill_ok(r, k, k, 1);
    pd_err_clear(&e);
    ck_assert_int_eq(ring_layer_write(r, NULL, k, NULL, &e), PD_ERR_ARG);
    /* while a draft is pending */
    ck_assert_int_eq(ring_layer_draft_put(r, k, k, &e), PD_OK);
    snap before = snap_take(r);
    pd_err_clear(&e);
    ck_assert_int_eq(ring_layer_write(r, k, k, NULL, &e), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.msg, "pending"));
    snap after = snap_take(r);
    snap_eq(&before, &after, 1, "refused write");
    check_ok(r);
    snap_free(&before);
    snap_free(&after);
    ring_layer_free(r);
}
END_TEST

/* ---- verify without cloning ---------------------------------------------- */

/* Deterministic rows: token t of a history has values from a seeded RNG. */
static void gen_token(uint64_t seed, uint32_t t, size_t tok, float *k, float *v)
{
    pd_rng g = {.s = seed * 1000003u + t};
    pd_rng_fill(&g, k, tok, -1.5f, 1.5f);
    pd_rng_fill(&g, v, tok, -1.0f, 1.0f);
}

/* A layer with R reference rows and `w` decode writes of history `seed`. */
static ring_layer *build_history(uint32_t H, uint32_t D, uint32_t W, uint32_t R, uint32_t K,
                                 int i8, uint32_t g, uint64_t seed, uint32_t w, float *tk,
                                 float *tv)
{
    const size_t tok = (size_t)H * D;
    ring_layer *r = mk(H, D, W, R, K, i8, g);
    for (uint32_t i = 0; i < R; i++) {
        gen_token(seed, 100000 + i, tok, tk, tv);
        prefill_ok(r, tk, tv, 1);
    }
    for (uint32_t t = 0; t < w; t++) {
        gen_token(seed, t, tok, tk, tv);
        write_ok(r, tk, tv);
    }
    return r;
}

/* For one geometry: every fill level w in [0, 2W + 2] (warm-up, exactly full,
 * wrapped) and K = 1..Kmax: draft attend == write-then-attend, commit of a
 * drafts == a sequential writes. */
static void verify_vs_sequential(uint32_t H, uint32_t D, uint32_t W, uint32_t g, int i8,
                                 uint32_t Kmax, uint64_t seed)
{
    const uint32_t R = 3;
    const size_t tok = (size_t)H * D, qn = tok * g;
    float *tk = malloc(sizeof(float) * tok), *tv = malloc(sizeof(float) * tok);
    float *dk = malloc(sizeof(float) * tok * Kmax), *dv = malloc(sizeof(float) * tok * Kmax);
    float *q = malloc(sizeof(float) * qn * Kmax);
    float *a = malloc(sizeof(float) * qn), *b = malloc(sizeof(float) * qn);
    ring_attend_opts o = {.group = g};
    pd_rng rng = {.s = seed ^ 0x5555};
    for (uint32_t w = 0; w <= 2 * W + 2; w++) {
        for (uint32_t K = 1; K <= Kmax; K++) {
            ring_layer *ver = build_history(H, D, W, R, Kmax, i8, g, seed, w, tk, tv);
            ring_layer *seq = build_history(H, D, W, R, Kmax, i8, g, seed, w, tk, tv);
            pd_rng_fill(&rng, dk, tok * K, -1.5f, 1.5f);
            pd_rng_fill(&rng, dv, tok * K, -1.0f, 1.0f);
            pd_rng_fill(&rng, q, qn * K, -1.0f, 1.0f);
            snap pre = snap_take(ver);
            pd_err e = {0};
            for (uint32_t i = 0; i < K; i++) {
                ck_assert_msg(ring_layer_draft_put(ver, dk + i * tok, dv + i * tok, &e) == PD_OK,
                              "%s", e.msg);
                check_ok(ver);
            }
            ck_assert_uint_eq(ring_layer_drafts(ver), K);
            /* Drafts attended in reverse order too: nothing depends on call order. */
            for (uint32_t ii = 0; ii < K; ii++) {
                uint32_t i = K - 1 - ii;
                ck_assert_int_eq(ring_layer_draft_attend(ver, i, q + i * qn, &o, a, NULL, &e),
                                 PD_OK);
                float *want = malloc(sizeof(float) * qn);
                /* sequential: computed on a fresh copy of the history */
                ring_layer *s2 = build_history(H, D, W, R, Kmax, i8, g, seed, w, tk, tv);
                for (uint32_t j = 0; j <= i; j++)
                    write_ok(s2, dk + j * tok, dv + j * tok);
                attend_ok(s2, q + i * qn, &o, want);
                ck_assert_msg(memcmp(a, want, sizeof(float) * qn) == 0,
                              "H%u D%u W%u g%u i8 %d: fill %u K %u draft %u differs", H, D, W, g,
                              i8, w, K, i);
                ring_layer_free(s2);
                free(want);
            }
            /* The layer itself did not move while drafts were attended. */
            snap during = snap_take(ver);
            ck_assert_uint_eq(during.st.writes, pre.st.writes);
            ck_assert_uint_eq(during.st.ring_len, pre.st.ring_len);
            ck_assert_uint_eq(during.st.ring_pos, pre.st.ring_pos);
            ck_assert(memcmp(during.ring, pre.ring, sizeof(float) * 2 * pre.n_ring) == 0);
            /* Commit a of K, compare with a sequential writes + attend. */
            uint32_t acc = (uint32_t)((w + K) % (K + 1));
            ck_assert_int_eq(ring_layer_draft_commit(ver, acc, &e), PD_OK);
            check_ok(ver);
            for (uint32_t j = 0; j < acc; j++)
                write_ok(seq, dk + j * tok, dv + j * tok);
            snap sv = snap_take(ver), ss = snap_take(seq);
            snap_eq(&sv, &ss, 0, "commit vs sequential");
            ck_assert_uint_eq(ring_layer_position(ver), ring_layer_position(seq));
            ck_assert_uint_eq(sv.st.writes, pre.st.writes + acc);
            ck_assert_uint_eq(ring_layer_drafts(ver), 0);
            attend_ok(ver, q, &o, a);
            attend_ok(seq, q, &o, b);
            ck_assert_msg(memcmp(a, b, sizeof(float) * qn) == 0, "attend after commit");
            /* and the next write still lands where the sequential one does */
            uint32_t s1 = write_ok(ver, tk, tv), s2 = write_ok(seq, tk, tv);
            ck_assert_uint_eq(s1, s2);
            snap_free(&pre);
            snap_free(&during);
            snap_free(&sv);
            snap_free(&ss);
            ring_layer_free(ver);
            ring_layer_free(seq);
        }
    }
    free(tk);
    free(tv);
    free(dk);
    free(dv);
    free(q);
    free(a);
    free(b);
}

/* The verify geometries (H, D, W, group, storage, Kmax, seed): windows 1, 3
 * and 8 in f32, the int8 mirror, and int8 storage, where drafts are
 * quantized in their spill slots as a write quantizes and a commit copies
 * the codes. */
static const struct verify_case {
    uint32_t H, D, W, g;
    int i8;
    uint32_t Kmax;
    uint64_t seed;
} verify_cases[] = {
    {1, 8, 1, 1, 0, 8, 11},
    {2, 5, 1, 3, 0, 8, 12},
    {1, 16, 3, 2, 0, 8, 13},
    {3, 6, 3, 1, 0, 8, 14},
    {2, 12, 8, 2, 0, 8, 15},
    {2, 8, 3, 2, 1, 5, 16},
    {1, 8, 8, 1, 1, 8, 17},
    {2, 40, 3, 2, ST_Q8(KV_MODE_Q8), 5, 18},
    {1, 8, 1, 1, ST_Q8(KV_MODE_Q8K), 4, 19},
    {2, 33, 4, 3, ST_Q8(KV_MODE_Q8V), 6, 20},
};

START_TEST(ring_verify_without_clone_equals_sequential)
{
    const struct verify_case *c = &verify_cases[_i];
    verify_vs_sequential(c->H, c->D, c->W, c->g, c->i8, c->Kmax, c->seed);
}
END_TEST

START_TEST(ring_commit_a_of_k_commits_exactly_a)
{
    const uint32_t H = 2, D = 4, W = 4;
    float tk[8], tv[8];
    for (uint32_t acc = 0; acc <= 3; acc++) {
        ring_layer *r = build_history(H, D, W, 2, 3, 0, 1, 77, 2, tk, tv);
        float dk[3][8], dv[3][8];
        for (uint32_t i = 0; i < 3; i++) {
            fill_const(dk[i], 8, 10.0f + (float)i);
            fill_const(dv[i], 8, -10.0f - (float)i);
            pd_err e = {0};
            ck_assert_int_eq(ring_layer_draft_put(r, dk[i], dv[i], &e), PD_OK);
        }
        pd_err e = {0};
        ck_assert_int_eq(ring_layer_draft_commit(r, 4, &e), PD_ERR_RANGE); /* > pending */
        ck_assert_uint_eq(ring_layer_drafts(r), 3);
        ck_assert_int_eq(ring_layer_draft_commit(r, acc, &e), PD_OK);
        check_ok(r);
        ring_state st;
        ring_layer_state(r, &st);
        ck_assert_uint_eq(st.writes, 2 + acc);
        ck_assert_uint_eq(ring_layer_position(r), 2 + 2 + acc);
        ck_assert_uint_eq(ring_layer_drafts(r), 0);
        ck_assert_int_eq(st.decoding, 1);
        /* slots 2, 3 (warm-up), then slot 0 (wrap) hold drafts 0, 1, 2 */
        const uint32_t slot_of[3] = {2, 3, 0};
        for (uint32_t i = 0; i < acc; i++)
            for (uint32_t h = 0; h < H; h++) {
                ck_assert_float_eq(st.ring_k[h][slot_of[i] * D], 10.0f + (float)i);
                ck_assert_float_eq(st.ring_v[h][slot_of[i] * D + 3], -10.0f - (float)i);
            }
        ring_layer_free(r);
    }
}
END_TEST

START_TEST(ring_rejected_drafts_leave_layer_byte_identical)
{
    const uint32_t H = 2, D = 6, W = 3;
    float tk[12], tv[12], q[12], out[12];
    for (uint32_t w = 0; w <= 2 * W; w++) {
        for (int how = 0; how < 2; how++) {
            ring_layer *r = build_history(H, D, W, 2, 4, 1, 1, 5 + w, w, tk, tv);
            ring_layer *ctl = build_history(H, D, W, 2, 4, 1, 1, 5 + w, w, tk, tv);
            snap before = snap_take(r);
            pd_rng g = {.s = w * 3 + (uint64_t)how};
            for (uint32_t i = 0; i < 4; i++) {
                pd_rng_fill(&g, tk, 12, -5, 5);
                pd_err e = {0};
                ck_assert_int_eq(ring_layer_draft_put(r, tk, tk, &e), PD_OK);
                pd_rng_fill(&g, q, 12, -1, 1);
                ck_assert_int_eq(ring_layer_draft_attend(r, i, q, NULL, out, NULL, &e), PD_OK);
            }
            pd_err e = {0};
            if (how == 0)
                ring_layer_draft_discard(r);
            else
                ck_assert_int_eq(ring_layer_draft_commit(r, 0, &e), PD_OK);
            check_ok(r);
            snap after = snap_take(r);
            snap_eq(&before, &after, 1, "rejected drafts");
            /* and it keeps answering like a layer that never saw them */
            pd_rng_fill(&g, q, 12, -1, 1);
            float want[12];
            attend_ok(r, q, NULL, out);
            attend_ok(ctl, q, NULL, want);
            ck_assert(memcmp(out, want, sizeof out) == 0);
            gen_token(9, w, 12, tk, tv);
            write_ok(r, tk, tv);
            write_ok(ctl, tk, tv);
            attend_ok(r, q, NULL, out);
            attend_ok(ctl, q, NULL, want);
            ck_assert(memcmp(out, want, sizeof out) == 0);
            snap_free(&before);
            snap_free(&after);
            ring_layer_free(r);
            ring_layer_free(ctl);
        }
    }
}
END_TEST

START_TEST(ring_draft_refusals)
{
    ring_layer *r = mk(1, 4, 2, 2, 2, 0, 1);
    float k[4] = {1, 2, 3, 4}, q[4] = {1, 0, 0, 0}, out[4];
    prefill_ok(r, k, k, 1);
    pd_err e = {0};
    ck_assert_int_eq(ring_layer_draft_attend(r, 0, q, NULL, out, NULL, &e), PD_ERR_RANGE);
    ck_assert_int_eq(ring_layer_draft_put(r, k, k, &e), PD_OK);
    ck_assert_int_eq(ring_layer_draft_put(r, k, k, &e), PD_OK);
    pd_err_clear(&e);
    ck_assert_int_eq(ring_layer_draft_put(r, k, k, &e), PD_ERR_RANGE);
    ck_assert_ptr_nonnull(strstr(e.msg, "max_drafts"));
    ck_assert_int_eq(ring_layer_draft_put(r, NULL, k, &e), PD_ERR_ARG);
    ck_assert_uint_eq(ring_layer_drafts(r), 2);
    ck_assert_int_eq(ring_layer_draft_attend(r, 2, q, NULL, out, NULL, &e), PD_ERR_RANGE);
    check_ok(r);
    ring_layer_free(r);
    /* max_drafts 0: verify is off, decode still works */
    r = mk(1, 4, 2, 2, 0, 0, 1);
    prefill_ok(r, k, k, 1);
    ck_assert_int_eq(ring_layer_draft_put(r, k, k, &e), PD_ERR_RANGE);
    write_ok(r, k, k);
    ring_layer_free(r);
}
END_TEST

START_TEST(ring_identity_fresh_per_layer_and_import)
{
    enum { N = 16 };
    ring_layer *ls[N];
    for (int i = 0; i < N; i++) {
        ls[i] = mk(1, 2, 2, 2, 0, 0, 1);
        ck_assert_uint_ne(ring_layer_id(ls[i]), 0);
        for (int j = 0; j < i; j++)
            ck_assert_uint_ne(ring_layer_id(ls[i]), ring_layer_id(ls[j]));
    }
    float k[2] = {1, 2};
    prefill_ok(ls[0], k, k, 1);
    ring_state st;
    ring_layer_state(ls[0], &st);
    ring_layer_config cfg;
    ring_layer_config_get(ls[0], &cfg);
    ring_layer *imp = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ring_layer_new_from_state(&cfg, &st, &imp, &e), PD_OK);
    ck_assert_uint_ne(ring_layer_id(imp), 0);
    for (int j = 0; j < N; j++)
        ck_assert_uint_ne(ring_layer_id(imp), ring_layer_id(ls[j]));
    ring_layer_free(imp);
    for (int i = 0; i < N; i++)
        ring_layer_free(ls[i]);
}
END_TEST

/* ---- int8 mirror ---------------------------------------------------------- */

START_TEST(ring_int8_mirror_close_to_f32)
{
    const uint32_t H = 2, D = 32, W = 4, g = 2;
    float tk[64], tv[64], q[128], a[128], b[128];
    ring_layer *f = build_history(H, D, W, 7, 0, 0, g, 40, 6, tk, tv);
    ring_layer *i8 = build_history(H, D, W, 7, 0, 1, g, 40, 6, tk, tv);
    pd_rng rng = {.s = 41};
    ring_attend_opts o = {.group = g};
    double worst = 0;
    for (int t = 0; t < 8; t++) {
        pd_rng_fill(&rng, q, 128, -1, 1);
        attend_ok(f, q, &o, a);
        attend_ok(i8, q, &o, b);
        int differs = 0;
        for (int i = 0; i < 128; i++) {
            worst = fmax(worst, fabs((double)a[i] - b[i]));
            differs |= a[i] != b[i];
        }
        ck_assert_msg(differs, "the int8 path must actually read the int8 rows");
    }
    /* values in [-1, 1], 7-bit mantissa rows: a few 1e-2 at most */
    ck_assert_msg(worst < 2e-2, "int8 vs f32 max abs diff %g", worst);
    /* f32 stays the source of truth: the state view is the same bytes */
    snap sf = snap_take(f), si = snap_take(i8);
    ck_assert(sf.n_ref == si.n_ref && sf.n_ring == si.n_ring);
    ck_assert(memcmp(sf.ref, si.ref, sizeof(float) * 2 * sf.n_ref) == 0);
    ck_assert(memcmp(sf.ring, si.ring, sizeof(float) * 2 * sf.n_ring) == 0);
    ck_assert(si.mem.storage > sf.mem.storage && si.mem.live > sf.mem.live);
    snap_free(&sf);
    snap_free(&si);
    ring_layer_free(f);
    ring_layer_free(i8);
}
END_TEST

START_TEST(ring_int8_mirror_exact_when_losslessly_quantizable)
{
    /* integer rows with a 127 anchor: scale 1, the int8 rows are the f32 rows,
     * so the int8 path gives the f32 path's bits */
    const uint32_t H = 2, D = 16;
    ring_layer *f = mk(H, D, 3, 6, 2, 0, 1), *i8 = mk(H, D, 3, 6, 2, 1, 1);
    float k[32], v[32], q[32], a[32], b[32];
    for (uint32_t t = 0; t < 11; t++) {
        for (uint32_t i = 0; i < H * D; i++) {
            k[i] = i % D == 0 ? 127.0f : (float)((int)((t * 7 + i * 3) % 7) - 3);
            v[i] = i % D == 0 ? -127.0f : (float)((int)((t * 5 + i * 2) % 9) - 4);
        }
        if (t < 4) {
            prefill_ok(f, k, v, 1);
            prefill_ok(i8, k, v, 1);
        } else if (t < 9) {
            write_ok(f, k, v);
            write_ok(i8, k, v);
        } else {
            pd_err e = {0};
            ck_assert_int_eq(ring_layer_draft_put(f, k, v, &e), PD_OK);
            ck_assert_int_eq(ring_layer_draft_put(i8, k, v, &e), PD_OK);
        }
    }
    for (uint32_t i = 0; i < H * D; i++)
        q[i] = (float)((int)(i % 5) - 2) * 0.01f;
    attend_ok(f, q, NULL, a);
    attend_ok(i8, q, NULL, b);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    pd_err e = {0};
    ck_assert_int_eq(ring_layer_draft_attend(f, 1, q, NULL, a, NULL, &e), PD_OK);
    ck_assert_int_eq(ring_layer_draft_attend(i8, 1, q, NULL, b, NULL, &e), PD_OK);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    ring_layer_free(f);
    ring_layer_free(i8);
}
END_TEST

/* ---- memory -------------------------------------------------------------- */

static size_t r64(size_t x)
{
    return (x + 63) / 64 * 64;
}

/* The analytic storage formula, written independently of the layer. */
static size_t expect_storage(uint32_t H, uint32_t D, uint32_t W, uint32_t C, uint32_t K, int i8,
                             uint32_t group)
{
    size_t s = 0;
    const uint32_t rows[3] = {C, W, K};
    const int qk = (st_mode(i8) & KV_MODE_Q8K) != 0, qv = (st_mode(i8) & KV_MODE_Q8V) != 0;
    const size_t G = (D + RING_K_GROUP - 1) / RING_K_GROUP;
    for (int i = 0; i < 3; i++) {
        const size_t hr = (size_t)H * rows[i];
        s += (qk ? 0 : r64(hr * D * 4)) + (qv ? 0 : r64(hr * D * 4));
        if (st_mirror(i8))
            s += 2 * r64(hr * D) + 2 * r64(hr * 4);
        if (qk)
            s += r64(hr * D) + r64(hr * G * 4);
        if (qv)
            s += r64(hr * D) + r64(hr * 4);
    }
    /* the attention scratch is attn.h's contract for the largest span */
    s += r64(attn_scratch_floats(group, D, C + W + K) * 4);
    s += r64(4 * (size_t)H * sizeof(float *) * (st_mode(i8) != KV_MODE_F32 ? 3 : 1));
    return s;
}

static const uint32_t mem_cases[11][7] = {
    /* H, D, W, C, K, i8 (storage), group */
    {1, 1, 1, 1, 0, 0, 1},   {2, 16, 8, 32, 4, 0, 1}, {2, 16, 8, 32, 4, 1, 1},
    {3, 12, 5, 7, 8, 1, 4},  {10, 128, 128, 300, 8, 0, 2}, {4, 7, 3, 9, 0, 1, 3},
    {1, 1, 1, 1, 0, 4, 1},   {2, 40, 8, 32, 4, 2, 1}, {2, 40, 8, 32, 4, 3, 2},
    {10, 128, 128, 300, 8, 4, 2}, {3, 33, 5, 7, 0, 4, 3}};

START_TEST(ring_memory_matches_formula)
{
    const int c = _i;
    const uint32_t *p = mem_cases[c];
    count_alloc ca = {0};
    pd_alloc al = {.alloc = count_alloc_fn, .free = count_free_fn, .ctx = &ca};
    ring_layer_config cfg = {.n_kv_heads = p[0],
                             .head_dim = p[1],
                             .window = p[2],
                             .ref_capacity = p[3],
                             .max_drafts = p[4],
                             .int8_mirror = st_mirror((int)p[5]),
                             .mode = st_mode((int)p[5]),
                             .max_group = p[6],
                             .alloc = &al};
    ring_layer *r = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ring_layer_new(&cfg, &r, &e), PD_OK);
    ring_layer_mem m;
    ring_layer_mem_get(r, &m);
    size_t want = expect_storage(p[0], p[1], p[2], p[3], p[4], (int)p[5], p[6]);
    ck_assert_msg(m.storage == want, "case %d: storage %zu, formula %zu", c, m.storage,
                  want);
    ck_assert_uint_eq(m.allocated, m.storage + m.handle);
    ck_assert_uint_eq(ca.live_bytes, m.allocated); /* every byte asked of the allocator */
    ck_assert_uint_eq(m.live, 0);
    /* live bytes follow the rows held */
    const size_t tok = (size_t)p[0] * p[1];
    float *k = calloc(tok * p[3], sizeof(float));
    const kv_mode md = st_mode((int)p[5]);
    const size_t Dp = p[1], Gp = (Dp + RING_K_GROUP - 1) / RING_K_GROUP;
    const size_t row_bytes = ((md & KV_MODE_Q8K) ? Dp + 4 * Gp : 4 * Dp) +
                             ((md & KV_MODE_Q8V) ? Dp + 4 : 4 * Dp) +
                             (st_mirror((int)p[5]) ? 2 * Dp + 8 : 0);
    ck_assert_uint_eq(ring_layer_bytes_for(&cfg), m.allocated); /* the estimate */
    prefill_ok(r, k, k, p[3]);
    uint32_t n_w = p[2] + 2, n_d = p[4] > 0 ? p[4] - (p[4] > 1) : 0;
    for (uint32_t i = 0; i < n_w; i++)
        write_ok(r, k, k);
    for (uint32_t i = 0; i < n_d; i++)
        ck_assert_int_eq(ring_layer_draft_put(r, k, k, &e), PD_OK);
    ring_layer_mem_get(r, &m);
    ck_assert_uint_eq(m.live, (size_t)p[0] * ((size_t)p[3] + p[2] + n_d) * row_bytes);
    ck_assert_uint_eq(ca.live_bytes, m.allocated);
    free(k);
    ring_layer_free(r);
    ck_assert_uint_eq(ca.live_bytes, 0);
    ck_assert_uint_eq(ca.calls, ca.frees);
}
END_TEST

/* After new, the hot paths (prefill attend, write, attend, draft put /
 * attend / commit, the state view) allocate nothing: with the int8 mirror,
 * and with int8 storage. */
static const struct hot_case {
    int int8_mirror;
    kv_mode mode;
    uint64_t seed;
} hot_cases[] = {{1, KV_MODE_F32, 1}, {0, KV_MODE_Q8, 2}};

START_TEST(ring_hot_paths_never_allocate)
{
    const struct hot_case *c = &hot_cases[_i];
    count_alloc ca = {0};
    pd_alloc al = {.alloc = count_alloc_fn, .free = count_free_fn, .ctx = &ca};
    ring_layer_config cfg = {.n_kv_heads = 2,
                             .head_dim = 8,
                             .window = 3,
                             .ref_capacity = 4,
                             .max_drafts = 3,
                             .int8_mirror = c->int8_mirror,
                             .mode = c->mode,
                             .max_group = 2,
                             .alloc = &al};
    ring_layer *r = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ring_layer_new(&cfg, &r, &e), PD_OK);
    const size_t calls = ca.calls;
    float k[32], q[32], out[32];
    pd_rng g = {.s = c->seed};
    pd_rng_fill(&g, k, 32, -1, 1);
    pd_rng_fill(&g, q, 32, -1, 1);
    ring_attend_opts o = {.group = 2};
    ck_assert_int_eq(ring_layer_prefill(r, k, k, 2, &e), PD_OK);
    ck_assert_int_eq(ring_layer_attend_prefill(r, 1, q, &o, out, NULL, &e), PD_OK);
    for (int i = 0; i < 5; i++) {
        ck_assert_int_eq(ring_layer_write(r, k, k, NULL, &e), PD_OK);
        ck_assert_int_eq(ring_layer_attend(r, q, &o, out, NULL, &e), PD_OK);
    }
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(ring_layer_draft_put(r, k, k, &e), PD_OK);
        ck_assert_int_eq(ring_layer_draft_attend(r, (uint32_t)i, q, &o, out, NULL, &e), PD_OK);
    }
    ck_assert_int_eq(ring_layer_draft_commit(r, 2, &e), PD_OK);
    ring_layer_state(r, &(ring_state){0});
    ck_assert_uint_eq(ca.calls, calls);
    ring_layer_free(r);
    ck_assert_uint_eq(ca.live_bytes, 0);
}
END_TEST

/* ---- state view and install ----------------------------------------------- */

enum { RT_W = 4 }; /* the round trip's window: fill levels 0 .. 2 RT_W + 1, each storage */

START_TEST(ring_state_roundtrip_into_new_layer_and_swap)
{
    const uint32_t H = 2, D = 8, W = RT_W, g = 2;
    float tk[16], tv[16], q[32], a[32], b[32];
    const uint32_t w = (uint32_t)_i / ST_COUNT;
    const int i8 = _i % ST_COUNT;
    ring_layer *src = build_history(H, D, W, 3, 2, i8, g, 50 + w, w, tk, tv);
    ring_state st;
    ring_layer_state(src, &st);
    ring_layer_config cfg;
    ring_layer_config_get(src, &cfg);
    ring_layer *dst = NULL;
    pd_err e = {0};
    ck_assert_msg(ring_layer_new_from_state(&cfg, &st, &dst, &e) == PD_OK, "%s",
                  e.msg);
    check_ok(dst); /* includes the recomputed int8 mirror */
    snap s1 = snap_take(src), s2 = snap_take(dst);
    snap_eq(&s1, &s2, 0, "imported state");
    ck_assert_uint_ne(s1.id, s2.id);
    ck_assert_uint_eq(ring_layer_position(src), ring_layer_position(dst));
    pd_rng rng = {.s = w};
    pd_rng_fill(&rng, q, 32, -1, 1);
    ring_attend_opts o = {.group = g};
    attend_ok(src, q, &o, a);
    attend_ok(dst, q, &o, b);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    /* swap: the live handle takes the imported state and identity */
    ring_layer *live = build_history(H, D, W, 3, 2, i8, g, 999, 1, tk, tv);
    uint64_t id_live = ring_layer_id(live), id_dst = ring_layer_id(dst);
    ring_layer_swap(live, dst);
    check_ok(live);
    check_ok(dst);
    ck_assert_uint_eq(ring_layer_id(live), id_dst);
    ck_assert_uint_eq(ring_layer_id(dst), id_live);
    snap s3 = snap_take(live);
    snap_eq(&s1, &s3, 0, "swapped-in state");
    attend_ok(live, q, &o, b);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    /* both keep working after the swap */
    gen_token(3, w, 16, tk, tv);
    write_ok(live, tk, tv);
    write_ok(src, tk, tv);
    write_ok(dst, tk, tv);
    attend_ok(live, q, &o, a);
    attend_ok(src, q, &o, b);
    ck_assert(memcmp(a, b, sizeof a) == 0);
    snap_free(&s1);
    snap_free(&s2);
    snap_free(&s3);
    ring_layer_free(dst); /* holds live's old state now */
    ring_layer_free(live);
    ring_layer_free(src);
}
END_TEST

START_TEST(ring_new_from_state_rejects_each_bad_field)
{
    const uint32_t H = 2, D = 4, W = 3;
    float tk[8], tv[8];
    ring_layer *src = build_history(H, D, W, 2, 0, 0, 1, 60, 4, tk, tv);
    ring_state good;
    ring_layer_state(src, &good);
    ring_layer_config cfg;
    ring_layer_config_get(src, &cfg);
    count_alloc ca = {0};
    pd_alloc al = {.alloc = count_alloc_fn, .free = count_free_fn, .ctx = &ca};
    cfg.alloc = &al;
    const float *nulls[2] = {NULL, NULL};
    struct {
        ring_state s;
        ring_layer_config c;
        pd_status want;
        const char *field;
    } cases[16];
    int n = 0;
#define CASE(expr, st, name)                                                                 \
    do {                                                                                     \
        cases[n].s = good;                                                                   \
        cases[n].c = cfg;                                                                    \
        {                                                                                    \
            ring_state *s = &cases[n].s;                                                     \
            ring_layer_config *c = &cases[n].c;                                              \
            (void)s;                                                                         \
            (void)c;                                                                         \
            expr;                                                                            \
        }                                                                                    \
        cases[n].want = st;                                                                  \
        cases[n].field = name;                                                               \
        n++;                                                                                 \
    } while (0)
    CASE(s->n_kv_heads = 3, PD_ERR_MISMATCH, "n_kv_heads");
    CASE(s->head_dim = 8, PD_ERR_MISMATCH, "head_dim");
    CASE(s->window = 4, PD_ERR_MISMATCH, "window");
    CASE(s->int8_mirror = 1, PD_ERR_MISMATCH, "int8_mirror");
    CASE(c->ref_capacity = 1, PD_ERR_RANGE, "ref_rows");
    CASE(s->ring_len = 4, PD_ERR_RANGE, "ring_len");
    CASE(s->ring_pos = 3, PD_ERR_RANGE, "ring_pos");
    CASE(s->ring_len = 2, PD_ERR_FORMAT, "ring_len");
    CASE(s->ring_pos = 0, PD_ERR_FORMAT, "ring_pos");
    CASE(s->writes = 5, PD_ERR_FORMAT, "ring_pos");
    CASE(s->decoding = 0, PD_ERR_FORMAT, "decoding");
    CASE((s->ref_rows = 0), PD_ERR_FORMAT, "ref_rows");
    CASE(s->ref_k = NULL, PD_ERR_ARG, "ref_k");
    CASE(s->ring_v = nulls, PD_ERR_ARG, "ring_v[0]");
    CASE(c->head_dim = 0, PD_ERR_ARG, "head_dim");
    CASE(s->writes = UINT64_MAX, PD_ERR_RANGE, "writes");
#undef CASE
    for (int i = 0; i < n; i++) {
        ring_layer *out = (ring_layer *)&cases[i]; /* sentinel */
        pd_err e = {0};
        pd_status st = ring_layer_new_from_state(&cases[i].c, &cases[i].s, &out, &e);
        ck_assert_msg(st == cases[i].want, "case %d (%s): status %d, msg %s", i, cases[i].field,
                      (int)st, e.msg);
        ck_assert_msg(strstr(e.msg, cases[i].field) != NULL, "case %d: '%s' lacks '%s'", i,
                      e.msg, cases[i].field);
        ck_assert_ptr_eq(out, (ring_layer *)&cases[i]);
        ck_assert_uint_eq(ca.calls, 0); /* nothing created */
    }
    /* and the untouched state still installs */
    ring_layer *ok = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ring_layer_new_from_state(&cfg, &good, &ok, &e), PD_OK);
    ring_layer_free(ok);
    ck_assert_uint_eq(ca.live_bytes, 0);
    ring_layer_free(src);
}
END_TEST

/* ---- KV layer vs ring layer ----------------------------------------------- */

/* A kv_layer holding the same rows in the same order answers with the same
 * bits as the ring layer as long as the ring has not wrapped: in f32, and in
 * int8 storage before the kv layer's field freezes (it then quantizes rows
 * the way the ring does). Decode and prefill attends alike, and attend_upto
 * over a whole reference at once. */
static const struct kv_case {
    kv_mode mode;
    uint32_t D;
    uint64_t seed;
} kv_cases[] = {{KV_MODE_F32, 12, 70}, {KV_MODE_Q8K, 40, 71}, {KV_MODE_Q8V, 40, 71}, {KV_MODE_Q8, 40, 71}};

START_TEST(ring_equals_kv_layer_before_wrap)
{
    const struct kv_case *c = &kv_cases[_i];
    const uint32_t H = 2, D = c->D, W = 6, R = 5, g = 3;
    const size_t tok = (size_t)H * D;
    const int m = c->mode;
    kv_layer_config kc = {.n_kv_heads = H, .head_dim = D, .mode = c->mode,
                          .capacity_rows = R + W, .max_q_per_kv = g};
    kv_layer *kv = NULL;
    pd_err e = {0};
    ck_assert_msg(kv_layer_new(&kc, &kv, &e) == PD_OK, "%s", e.msg);
    ring_layer *r = mk(H, D, W, R, 0, m == KV_MODE_F32 ? 0 : ST_Q8(m), g);
    float tk[2 * 40], tv[2 * 40], q[2 * 40 * 3], a[2 * 40 * 3], b[2 * 40 * 3];
    ring_attend_opts o = {.group = g};
    pd_rng rng = {.s = c->seed};
    for (uint32_t t = 0; t < R + W; t++) {
        gen_token(c->seed, t, tok, tk, tv);
        ck_assert_msg(kv_layer_append(kv, tk, tv, &e) == PD_OK, "%s", e.msg);
        pd_rng_fill(&rng, q, tok * g, -1, 1);
        if (t < R) {
            prefill_ok(r, tk, tv, 1);
            ck_assert_int_eq(ring_layer_attend_prefill(r, t, q, &o, a, NULL, &e), PD_OK);
        } else {
            write_ok(r, tk, tv);
            attend_ok(r, q, &o, a);
        }
        for (uint32_t h = 0; h < H; h++) {
            kv_attend ka = {.kv_head = h, .q_head0 = h * g, .n_q = g, .q = q + h * g * D,
                            .out = b + h * g * D};
            ck_assert_msg(kv_layer_attend(kv, &ka, NULL, &e) == PD_OK, "%s", e.msg);
        }
        ck_assert_msg(memcmp(a, b, sizeof(float) * tok * g) == 0, "mode %d row %u differs", m, t);
    }
    /* attend_upto: a whole reference at once, row i vs the KV layer's upto */
    ring_layer *whole = mk(H, D, W, R, 0, m == KV_MODE_F32 ? 0 : ST_Q8(m), g);
    float *all_k = malloc(sizeof(float) * R * tok), *all_v = malloc(sizeof(float) * R * tok);
    for (uint32_t t = 0; t < R; t++)
        gen_token(c->seed, t, tok, all_k + t * tok, all_v + t * tok);
    prefill_ok(whole, all_k, all_v, R);
    for (uint32_t t = 0; t < R; t++) {
        pd_rng_fill(&rng, q, tok * g, -1, 1);
        ck_assert_int_eq(ring_layer_attend_prefill(whole, t, q, &o, a, NULL, &e), PD_OK);
        for (uint32_t h = 0; h < H; h++) {
            kv_attend ka = {.kv_head = h, .q_head0 = h * g, .n_q = g, .q = q + h * g * D,
                            .upto = t + 1, .out = b + h * g * D};
            ck_assert_msg(kv_layer_attend(kv, &ka, NULL, &e) == PD_OK, "%s", e.msg);
        }
        ck_assert_msg(memcmp(a, b, sizeof(float) * tok * g) == 0, "mode %d upto row %u differs", m, t);
    }
    free(all_k);
    free(all_v);
    ring_layer_free(whole);
    kv_layer_free(kv);
    ring_layer_free(r);
}
END_TEST

/* ---- int8 storage (--attn rswa:W --kv q8|q8k|q8v) ------------------------- */

START_TEST(ring_q8_new_refuses_unknown_mode_and_mode_with_mirror)
{
    ring_layer_config cfg = {.n_kv_heads = 1, .head_dim = 8, .window = 2, .ref_capacity = 2,
                             .mode = KV_MODE_Q8, .int8_mirror = 1};
    ring_layer *r = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ring_layer_new(&cfg, &r, &e), PD_ERR_ARG);
    ck_assert_ptr_null(r);
    ck_assert_ptr_nonnull(strstr(e.msg, "mirror"));
    ck_assert_uint_eq(ring_layer_bytes_for(&cfg), 0);
    cfg.int8_mirror = 0;
    cfg.mode = KV_MODE_COUNT;
    ck_assert_int_eq(ring_layer_new(&cfg, &r, &e), PD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(e.msg, "mode"));
    ck_assert_ptr_null(r);
}
END_TEST

START_TEST(ring_q8_stores_q8_2f_rows_without_f32)
{
    /* Every region holds exactly quant_q8_row of the input row (K: a scale
     * per 32 channels, V: one per row, no field); the quantized component
     * has no f32 rows in the state view. */
    const uint32_t H = 2, D = 40, W = 3, R = 4;
    const size_t tok = (size_t)H * D, G = 2;
    float tk[80], tv[80];
    for (int m = KV_MODE_Q8K; m <= KV_MODE_Q8; m++) {
        ring_layer *r = mk(H, D, W, R, 2, ST_Q8(m), 1);
        float *rows = malloc(sizeof(float) * 2 * tok * (R + W + 2));
        for (uint32_t t = 0; t < R + W + 2; t++) {
            gen_token(7, t, tok, tk, tv);
            memcpy(rows + 2 * t * tok, tk, sizeof tk);
            memcpy(rows + (2 * t + 1) * tok, tv, sizeof tv);
            if (t < R)
                prefill_ok(r, tk, tv, 1);
            else
                write_ok(r, tk, tv); /* W + 2 writes: wrapped */
        }
        ring_state st;
        ring_layer_state(r, &st);
        ck_assert_int_eq(st.mode, m);
        const int qk = (m & KV_MODE_Q8K) != 0, qv = (m & KV_MODE_Q8V) != 0;
        ck_assert((st.ref_k == NULL) == qk && (st.ring_k == NULL) == qk && (st.ref_kq != NULL) == qk);
        ck_assert((st.ref_v == NULL) == qv && (st.ring_v == NULL) == qv && (st.ref_vq != NULL) == qv);
        int8_t q[40];
        float sc[2];
        for (uint32_t h = 0; h < H; h++)
            for (uint32_t i = 0; i < R + W; i++) {
                /* reference row i, or ring slot s holding generated token t */
                const int ring = i >= R;
                const uint32_t slot = ring ? i - R : i;
                uint32_t t = i;
                if (ring) /* W + 2 writes: slot s holds write s + W when s < 2 */
                    t = R + (slot < 2 ? slot + W : slot);
                const float *kr = rows + 2 * t * tok + h * D, *vr = rows + (2 * t + 1) * tok + h * D;
                if (qk) {
                    quant_q8_row(kr, NULL, D, 32, q, sc);
                    const int8_t *have = (ring ? st.ring_kq : st.ref_kq)[h] + (size_t)slot * D;
                    const float *hs = (ring ? st.ring_ks : st.ref_ks)[h] + (size_t)slot * G;
                    ck_assert(memcmp(have, q, D) == 0 && memcmp(hs, sc, sizeof(float) * G) == 0);
                } else {
                    ck_assert(memcmp((ring ? st.ring_k : st.ref_k)[h] + (size_t)slot * D, kr,
                                     sizeof(float) * D) == 0);
                }
                if (qv) {
                    quant_q8_row(vr, NULL, D, D, q, sc);
                    const int8_t *have = (ring ? st.ring_vq : st.ref_vq)[h] + (size_t)slot * D;
                    const float *hs = (ring ? st.ring_vs : st.ref_vs)[h] + slot;
                    ck_assert(memcmp(have, q, D) == 0 && memcmp(hs, sc, sizeof(float)) == 0);
                } else {
                    ck_assert(memcmp((ring ? st.ring_v : st.ref_v)[h] + (size_t)slot * D, vr,
                                     sizeof(float) * D) == 0);
                }
            }
        free(rows);
        ring_layer_free(r);
    }
}
END_TEST

START_TEST(ring_q8_close_to_f32)
{
    /* Quantization error only: the attention output of an int8 ring stays
     * within a few percent of the f32 ring's on random rows. */
    const uint32_t H = 2, D = 64, W = 4, R = 30, g = 2;
    const size_t tok = (size_t)H * D;
    float tk[128], tv[128], q[256], a[256], b[256];
    pd_rng rng = {.s = 5};
    pd_rng_fill(&rng, q, 256, -1, 1);
    ring_attend_opts o = {.group = g};
    for (int m = KV_MODE_Q8K; m <= KV_MODE_Q8; m++) {
        ring_layer *f = build_history(H, D, W, R, 0, 0, g, 21, 7, tk, tv);
        ring_layer *i8 = build_history(H, D, W, R, 0, ST_Q8(m), g, 21, 7, tk, tv);
        attend_ok(f, q, &o, a);
        attend_ok(i8, q, &o, b);
        double num = 0, den = 0;
        for (size_t i = 0; i < tok * g; i++) {
            num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
            den += (double)a[i] * a[i];
        }
        ck_assert_msg(sqrt(num / den) < 0.03, "mode %d: relative error %g", m, sqrt(num / den));
        ck_assert_msg(num > 0, "mode %d: int8 rows gave the f32 bits", m);
        ring_layer_free(f);
        ring_layer_free(i8);
    }
}
END_TEST

START_TEST(ring_q8_new_from_state_refuses_bad_codes_scales_and_mode)
{
    const uint32_t H = 2, D = 40, W = 3;
    float tk[80], tv[80];
    ring_layer *src = build_history(H, D, W, 2, 0, ST_Q8(KV_MODE_Q8), 1, 61, 4, tk, tv);
    ring_state good;
    ring_layer_state(src, &good);
    ring_layer_config cfg;
    ring_layer_config_get(src, &cfg);
    /* private copies of head 1's ring codes / scales to corrupt */
    int8_t codes[3 * 40];
    float ks[3 * 2], vs[3];
    memcpy(codes, good.ring_kq[1], sizeof codes);
    memcpy(ks, good.ring_ks[1], sizeof ks);
    memcpy(vs, good.ring_vs[1], sizeof vs);
    const int8_t *kq_tab[2] = {good.ring_kq[0], codes};
    const float *ks_tab[2] = {good.ring_ks[0], ks};
    const float *vs_tab[2] = {good.ring_vs[0], vs};
    struct {
        int what;
        pd_status want;
        const char *field;
    } cases[] = {{0, PD_ERR_FORMAT, "-128"},        {1, PD_ERR_FORMAT, "scale"},
                 {2, PD_ERR_FORMAT, "scale"},       {3, PD_ERR_FORMAT, "scale"},
                 {4, PD_ERR_MISMATCH, "mode"},      {5, PD_ERR_ARG, "ref_v"},
                 {6, PD_ERR_ARG, "ring_k codes"}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ring_state s = good;
        memcpy(codes, good.ring_kq[1], sizeof codes);
        memcpy(ks, good.ring_ks[1], sizeof ks);
        memcpy(vs, good.ring_vs[1], sizeof vs);
        s.ring_kq = kq_tab;
        s.ring_ks = ks_tab;
        s.ring_vs = vs_tab;
        switch (cases[c].what) {
        case 0: codes[77] = -128; break;
        case 1: ks[5] = 0.0f; break;
        case 2: vs[2] = NAN; break;
        case 3: ks[0] = INFINITY; break;
        case 4: s.mode = KV_MODE_Q8K; break;
        case 5: s.ref_vq = NULL; break;
        case 6: s.ring_kq = NULL; break;
        }
        ring_layer *dst = (ring_layer *)&s; /* must stay untouched */
        pd_err e = {0};
        ck_assert_int_eq(ring_layer_new_from_state(&cfg, &s, &dst, &e), cases[c].want);
        ck_assert_ptr_eq(dst, (ring_layer *)&s);
        ck_assert_msg(strstr(e.msg, cases[c].field), "case %zu: '%s' lacks '%s'", c, e.msg,
                      cases[c].field);
    }
    /* the untouched copy installs */
    ring_state s = good;
    s.ring_kq = kq_tab;
    s.ring_ks = ks_tab;
    s.ring_vs = vs_tab;
    memcpy(codes, good.ring_kq[1], sizeof codes);
    memcpy(ks, good.ring_ks[1], sizeof ks);
    memcpy(vs, good.ring_vs[1], sizeof vs);
    ring_layer *dst = NULL;
    pd_err e = {0};
    ck_assert_msg(ring_layer_new_from_state(&cfg, &s, &dst, &e) == PD_OK, "%s", e.msg);
    check_ok(dst);
    ring_layer_free(dst);
    ring_layer_free(src);
}
END_TEST

/* ---- randomized sequences -------------------------------------------------- */

/* A shadow of the committed history, replayed into a fresh layer to get the
 * bits a never-speculated layer would give. */
START_TEST(ring_randomized_sequences_keep_invariants)
{
    const uint32_t H = 2, D = 6, W = 4, C = 6, KM = 5, g = 2;
    const size_t tok = (size_t)H * D;
    const uint64_t seed = 1 + (uint64_t)_i; /* seeds 1 .. 10 */
    pd_rng rng = {.s = seed};
    int i8 = (int)(seed % ST_COUNT);
    ring_layer *r = mk(H, D, W, C, KM, i8, g);
    /* shadow: reference rows and committed generated rows */
    float *ref = malloc(sizeof(float) * 2 * C * tok);
    uint32_t n_ref = 0;
    size_t cap_h = 512;
    float *hist = malloc(sizeof(float) * 2 * cap_h * tok);
    uint64_t n_hist = 0;
    float *drafts = malloc(sizeof(float) * 2 * KM * tok);
    float tk[12], tv[12], q[24], a[24], b[24];
    ring_attend_opts o = {.group = g};
    for (int step = 0; step < 160; step++) {
        uint32_t op = pd_rng_below(&rng, 8);
        pd_rng_fill(&rng, tk, tok, -1, 1);
        pd_rng_fill(&rng, tv, tok, -1, 1);
        pd_err e = {0};
        pd_status st;
        ring_state s0;
        ring_layer_state(r, &s0);
        uint32_t nd = ring_layer_drafts(r);
        switch (op) {
        case 0: /* prefill chunk */
            st = ring_layer_prefill(r, tk, tv, 1, &e);
            if (!s0.decoding && nd == 0 && n_ref < C) {
                ck_assert_int_eq(st, PD_OK);
                memcpy(ref + (size_t)n_ref * 2 * tok, tk, sizeof(float) * tok);
                memcpy(ref + (size_t)n_ref * 2 * tok + tok, tv, sizeof(float) * tok);
                n_ref++;
            } else {
                ck_assert_int_ne(st, PD_OK);
            }
            break;
        case 1:
        case 2: /* decode write */
            st = ring_layer_write(r, tk, tv, NULL, &e);
            if (n_ref > 0 && nd == 0 && n_hist < cap_h) {
                ck_assert_int_eq(st, PD_OK);
                memcpy(hist + n_hist * 2 * tok, tk, sizeof(float) * tok);
                memcpy(hist + n_hist * 2 * tok + tok, tv, sizeof(float) * tok);
                n_hist++;
            } else if (n_hist < cap_h) {
                ck_assert_int_ne(st, PD_OK);
            }
            break;
        case 3: /* draft put */
            st = ring_layer_draft_put(r, tk, tv, &e);
            if (n_ref > 0 && nd < KM) {
                ck_assert_int_eq(st, PD_OK);
                memcpy(drafts + nd * 2 * tok, tk, sizeof(float) * tok);
                memcpy(drafts + nd * 2 * tok + tok, tv, sizeof(float) * tok);
            } else {
                ck_assert_int_ne(st, PD_OK);
            }
            break;
        case 4: { /* commit some drafts */
            uint32_t acc = pd_rng_below(&rng, nd + 1);
            if (n_hist + acc > cap_h)
                acc = 0;
            ck_assert_int_eq(ring_layer_draft_commit(r, acc, &e), PD_OK);
            memcpy(hist + n_hist * 2 * tok, drafts, sizeof(float) * 2 * tok * acc);
            n_hist += acc;
            break;
        }
        case 5: /* drop the pending drafts */
            ring_layer_draft_discard(r);
            break;
        default: /* attend drafts and decode against the shadow */
            break;
        }
        check_ok(r);
        /* shadow replay: a fresh layer with the committed rows only */
        ring_layer *sh = mk(H, D, W, C, KM, i8, g);
        for (uint32_t i = 0; i < n_ref; i++)
            prefill_ok(sh, ref + (size_t)i * 2 * tok, ref + (size_t)i * 2 * tok + tok, 1);
        for (uint64_t i = 0; i < n_hist; i++)
            write_ok(sh, hist + i * 2 * tok, hist + i * 2 * tok + tok);
        snap s1 = snap_take(r), s2 = snap_take(sh);
        ck_assert_uint_eq(s1.st.ref_rows, s2.st.ref_rows);
        ck_assert_uint_eq(s1.st.writes, s2.st.writes);
        ck_assert_uint_eq(s1.st.ring_len, s2.st.ring_len);
        ck_assert_uint_eq(s1.st.ring_pos, s2.st.ring_pos);
        ck_assert(memcmp(s1.ref, s2.ref, sizeof(float) * 2 * s1.n_ref) == 0);
        ck_assert(memcmp(s1.ring, s2.ring, sizeof(float) * 2 * s1.n_ring) == 0);
        snap_free(&s1);
        snap_free(&s2);
        if (n_ref > 0) {
            pd_rng_fill(&rng, q, tok * g, -1, 1);
            attend_ok(r, q, &o, a);
            attend_ok(sh, q, &o, b);
            ck_assert_msg(memcmp(a, b, sizeof a) == 0, "seed %llu step %d decode",
                          (unsigned long long)seed, step);
            uint32_t nd2 = ring_layer_drafts(r);
            if (nd2 > 0) {
                uint32_t i = pd_rng_below(&rng, nd2);
                ck_assert_int_eq(ring_layer_draft_attend(r, i, q, &o, a, NULL, &e), PD_OK);
                for (uint32_t j = 0; j <= i; j++)
                    write_ok(sh, drafts + j * 2 * tok, drafts + j * 2 * tok + tok);
                attend_ok(sh, q, &o, b);
                ck_assert_msg(memcmp(a, b, sizeof a) == 0, "seed %llu step %d draft %u",
                              (unsigned long long)seed, step, i);
            }
        }
        ring_layer_free(sh);
    }
    free(ref);
    free(hist);
    free(drafts);
    ring_layer_free(r);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("ring_layer");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, ring_new_rejects_bad_geometry_and_free_null_is_noop);
    tcase_add_test(tc, ring_new_is_empty_with_resolved_config);
    tcase_add_test(tc, ring_prefill_sets_reference_rows);
    tcase_add_test(tc, ring_prefill_refusals_leave_layer_unchanged);
    tcase_add_test(tc, ring_chunked_prefill_equals_whole_prefill);
    tcase_add_test(tc, ring_decode_single_key_returns_value);
    tcase_add_test(tc, ring_decode_equal_scores_average_values);
    tcase_add_test(tc, ring_ring_token_dominates_reference);
    tcase_add_test(tc, ring_decode_matches_f64_naive_softmax);
    tcase_add_test(tc, ring_attend_argument_errors_and_caller_scratch);
    tcase_add_test(tc, ring_warmup_appends_without_eviction);
    tcase_add_test(tc, ring_steady_state_overwrites_modulo_w);
    tcase_add_test(tc, ring_pos_wraps_modulo_w);
    tcase_add_test(tc, ring_write_refusals_leave_layer_unchanged);
    tcase_add_loop_test(tc, ring_verify_without_clone_equals_sequential, 0, PD_COUNT(verify_cases));
    tcase_add_test(tc, ring_commit_a_of_k_commits_exactly_a);
    tcase_add_test(tc, ring_rejected_drafts_leave_layer_byte_identical);
    tcase_add_test(tc, ring_draft_refusals);
    tcase_add_test(tc, ring_identity_fresh_per_layer_and_import);
    tcase_add_test(tc, ring_int8_mirror_close_to_f32);
    tcase_add_test(tc, ring_int8_mirror_exact_when_losslessly_quantizable);
    tcase_add_loop_test(tc, ring_memory_matches_formula, 0, PD_COUNT(mem_cases));
    tcase_add_loop_test(tc, ring_hot_paths_never_allocate, 0, PD_COUNT(hot_cases));
    tcase_add_loop_test(tc, ring_state_roundtrip_into_new_layer_and_swap, 0, (2 * RT_W + 2) * ST_COUNT);
    tcase_add_test(tc, ring_new_from_state_rejects_each_bad_field);
    tcase_add_loop_test(tc, ring_equals_kv_layer_before_wrap, 0, PD_COUNT(kv_cases));
    tcase_add_loop_test(tc, ring_randomized_sequences_keep_invariants, 0, 10);
    tcase_add_test(tc, ring_q8_new_refuses_unknown_mode_and_mode_with_mirror);
    tcase_add_test(tc, ring_q8_stores_q8_2f_rows_without_f32);
    tcase_add_test(tc, ring_q8_close_to_f32);
    tcase_add_test(tc, ring_q8_new_from_state_refuses_bad_codes_scales_and_mode);
    suite_add_tcase(s, tc);
    return s;
}
