/* wire: CMFS records. Round trips of every kind and cache mode are judged by
 * what the imported layer ANSWERS (attention outputs and probabilities, bit
 * for bit), golden records assembled by hand from docs/wire.md decode and
 * re-encode byte for byte, and every malformed record is refused with the
 * target left exactly as it was. */
#include "pd_test.h"

#include "base/fp16.h"
#include "cache/kv_layer.h"
#include "cache/ring_layer.h"
#include "comm/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ID 0x1122334455667788ull
#define LAYER 3u

/* ---- a byte builder for hand-made records (never the encoder) ----------- */

typedef struct bb {
    uint8_t b[8192];
    size_t n;
} bb;

static void b8(bb *b, uint8_t v) { b->b[b->n++] = v; }
static void b16(bb *b, uint16_t v)
{
    b8(b, (uint8_t)v);
    b8(b, (uint8_t)(v >> 8));
}
static void b32(bb *b, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        b8(b, (uint8_t)(v >> (8 * i)));
}
static void b64(bb *b, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        b8(b, (uint8_t)(v >> (8 * i)));
}
static void bf(bb *b, float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    b32(b, u);
}
static void bhdr(bb *b, uint8_t kind, uint8_t f16, uint64_t position)
{
    b8(b, 'C');
    b8(b, 'M');
    b8(b, 'F');
    b8(b, 'S');
    b32(b, 2);
    b64(b, ID);
    b32(b, LAYER);
    b8(b, kind);
    b8(b, f16);
    b16(b, 0);
    b64(b, position);
}

/* ---- kv helpers ---------------------------------------------------------- */

typedef struct kvfix {
    kv_layer_config cfg;
    uint8_t alive[8];
    kv_layer *l;
} kvfix;

static void kv_mk(kvfix *f, uint32_t H, uint32_t D, kv_mode mode, const uint8_t *alive)
{
    f->cfg = (kv_layer_config){
        .n_kv_heads = H, .head_dim = D, .mode = mode, .max_q_per_kv = 2, .capacity_rows = 4};
    if (alive) {
        memcpy(f->alive, alive, H);
        f->cfg.alive = f->alive;
    }
    pd_err e = {0};
    f->l = NULL;
    ck_assert_msg(kv_layer_new(&f->cfg, &f->l, &e) == PD_OK, "%s", e.msg);
}

/* Random K/V rows; exact16 keeps every value a multiple of 1/8 in [-4, 4)
 * (exactly representable in f16). Attends each row (importance) and confirms. */
static void kv_fill(kvfix *f, uint32_t rows, pd_rng *g, int exact16)
{
    const uint32_t H = f->cfg.n_kv_heads, D = f->cfg.head_dim;
    float *k = malloc(sizeof(float) * H * D), *v = malloc(sizeof(float) * H * D);
    float q[2 * 64], out[2 * 64];
    pd_err e = {0};
    for (uint32_t r = 0; r < rows; r++) {
        for (uint32_t i = 0; i < H * D; i++) {
            k[i] = exact16 ? (float)((int)pd_rng_below(g, 64) - 32) / 8.0f : pd_rng_uniform(g, -2, 2);
            v[i] = exact16 ? (float)((int)pd_rng_below(g, 64) - 32) / 8.0f : pd_rng_uniform(g, -2, 2);
        }
        ck_assert_msg(kv_layer_append(f->l, k, v, &e) == PD_OK, "%s", e.msg);
        pd_rng_fill(g, q, 2 * D, -1, 1);
        for (uint32_t h = 0; h < H; h++) {
            if (f->cfg.alive && !f->alive[h])
                continue;
            kv_attend a = {.kv_head = h, .q_head0 = 2 * h, .n_q = 2, .q = q, .track_imp = 1, .out = out};
            ck_assert_msg(kv_layer_attend(f->l, &a, NULL, &e) == PD_OK, "%s", e.msg);
        }
    }
    kv_layer_confirm(f->l, kv_layer_pos_len(f->l));
    kv_layer_check(f->l);
    free(k);
    free(v);
}

static wire_layer_ref kv_ref(kvfix *f)
{
    return (wire_layer_ref){.identity = ID, .layer = LAYER, .kv = f->l, .kv_cfg = &f->cfg};
}

static uint8_t *export_ok(const wire_layer_ref *ref, int f16, size_t *len)
{
    pd_err e = {0};
    uint8_t *out = NULL;
    size_t size = 0;
    ck_assert_msg(wire_record_size(ref, f16, &size, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(wire_export(ref, f16, &out, len, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(*len, size);
    wire_info info;
    ck_assert_msg(wire_inspect(out, *len, 0, 0, &info, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(info.bytes, *len);
    return out;
}

/* Every alive head answers the same queries with the same bits (outputs and
 * probabilities), with and without a window and softcap. */
static void kv_same_answers(kvfix *a, kvfix *b, pd_rng *g)
{
    const uint32_t H = a->cfg.n_kv_heads, D = a->cfg.head_dim;
    const uint64_t rows = kv_layer_rows(a->l);
    ck_assert_uint_eq(rows, kv_layer_rows(b->l));
    ck_assert_uint_eq(kv_layer_base(a->l), kv_layer_base(b->l));
    ck_assert_uint_eq(kv_layer_pos_len(a->l), kv_layer_pos_len(b->l));
    ck_assert_int_eq(kv_layer_mode(a->l), kv_layer_mode(b->l));
    ck_assert_int_eq(kv_layer_frozen(a->l), kv_layer_frozen(b->l));
    float *ia = malloc(sizeof(float) * (rows + 1)), *ib = malloc(sizeof(float) * (rows + 1));
    kv_layer_importance(a->l, ia);
    kv_layer_importance(b->l, ib);
    ck_assert_int_eq(memcmp(ia, ib, sizeof(float) * rows), 0);
    free(ia);
    free(ib);
    if (rows == 0)
        return;
    float q[2 * 64], oa[2 * 64], ob[2 * 64];
    float *pa = malloc(sizeof(float) * 2 * rows), *pb = malloc(sizeof(float) * 2 * rows);
    pd_err e = {0};
    for (int variant = 0; variant < 2; variant++)
        for (uint32_t h = 0; h < H; h++) {
            if (a->cfg.alive && !a->alive[h])
                continue;
            pd_rng_fill(g, q, 2 * D, -1.5f, 1.5f);
            kv_attend at = {.kv_head = h, .q_head0 = 2 * h, .n_q = 2, .q = q, .out = oa, .probs = pa};
            if (variant) {
                at.first = (uint32_t)(rows / 3);
                at.softcap = 4.0f;
            }
            kv_attend bt = at;
            bt.out = ob;
            bt.probs = pb;
            uint32_t sa = 0, sb = 0;
            memset(pa, 0, sizeof(float) * 2 * rows);
            memset(pb, 0xff, sizeof(float) * 2 * rows);
            ck_assert_msg(kv_layer_attend(a->l, &at, &sa, &e) == PD_OK, "%s", e.msg);
            ck_assert_msg(kv_layer_attend(b->l, &bt, &sb, &e) == PD_OK, "%s", e.msg);
            ck_assert_uint_eq(sa, sb);
            ck_assert_msg(memcmp(oa, ob, sizeof(float) * 2 * D) == 0, "head %u outputs differ", h);
            ck_assert_msg(memcmp(pa, pb, sizeof(float) * 2 * sa) == 0, "head %u probs differ", h);
        }
    free(pa);
    free(pb);
}

/* Exports a, imports into a fresh layer of the same config, checks answers,
 * then that re-export reproduces the bytes. Returns the imported layer. */
static void kv_round_trip(kvfix *a, int f16, pd_rng *g)
{
    size_t len = 0;
    wire_layer_ref ra = kv_ref(a);
    uint8_t *bytes = export_ok(&ra, f16, &len);
    kvfix b = *a;
    if (a->cfg.alive)
        b.cfg.alive = b.alive;
    pd_err e = {0};
    ck_assert_msg(kv_layer_new(&b.cfg, &b.l, &e) == PD_OK, "%s", e.msg);
    wire_layer_ref rb = kv_ref(&b);
    ck_assert_msg(wire_import(&rb, bytes, len, 0, 0, &e) == PD_OK, "%s", e.msg);
    kv_layer_check(b.l);
    kv_same_answers(a, &b, g);
    size_t len2 = 0;
    uint8_t *again = export_ok(&rb, f16, &len2);
    ck_assert_uint_eq(len, len2);
    ck_assert_int_eq(memcmp(bytes, again, len), 0);
    /* The two layers keep answering alike as they grow (freeze included). */
    kv_fill(a, 3, &(pd_rng){.s = 99}, 0);
    kv_fill(&b, 3, &(pd_rng){.s = 99}, 0);
    kv_same_answers(a, &b, g);
    free(again);
    free(bytes);
    kv_layer_free(b.l);
}

/* ---- ring helpers -------------------------------------------------------- */

typedef struct ringfix {
    ring_layer_config cfg;
    ring_layer *r;
} ringfix;

/* i8: 0 f32 rows, 1 the int8 mirror, 2 / 3 / 4 int8 storage q8k / q8v / q8. */
static void ring_mk(ringfix *f, uint32_t H, uint32_t D, uint32_t W, uint32_t cap, int i8)
{
    f->cfg = (ring_layer_config){
        .n_kv_heads = H, .head_dim = D, .window = W, .ref_capacity = cap, .max_drafts = 2,
        .int8_mirror = i8 == 1, .mode = i8 >= 2 ? (kv_mode)(i8 - 1) : KV_MODE_F32};
    pd_err e = {0};
    ck_assert_msg(ring_layer_new(&f->cfg, &f->r, &e) == PD_OK, "%s", e.msg);
}

static void ring_fill(ringfix *f, uint32_t ref, uint32_t writes, pd_rng *g, int exact16)
{
    const uint32_t H = f->cfg.n_kv_heads, D = f->cfg.head_dim;
    float *k = malloc(sizeof(float) * H * D * (ref + 1)), *v = malloc(sizeof(float) * H * D * (ref + 1));
    size_t n = (size_t)H * D * (ref ? ref : 1);
    for (size_t i = 0; i < n; i++) {
        k[i] = exact16 ? (float)((int)pd_rng_below(g, 64) - 32) / 8.0f : pd_rng_uniform(g, -2, 2);
        v[i] = exact16 ? (float)((int)pd_rng_below(g, 64) - 32) / 8.0f : pd_rng_uniform(g, -2, 2);
    }
    pd_err e = {0};
    if (ref)
        ck_assert_msg(ring_layer_prefill(f->r, k, v, ref, &e) == PD_OK, "%s", e.msg);
    for (uint32_t w = 0; w < writes; w++) {
        for (size_t i = 0; i < (size_t)H * D; i++) {
            k[i] = exact16 ? (float)((int)pd_rng_below(g, 64) - 32) / 8.0f : pd_rng_uniform(g, -2, 2);
            v[i] = exact16 ? (float)((int)pd_rng_below(g, 64) - 32) / 8.0f : pd_rng_uniform(g, -2, 2);
        }
        ck_assert_msg(ring_layer_write(f->r, k, v, NULL, &e) == PD_OK, "%s", e.msg);
    }
    ck_assert_msg(ring_layer_check(f->r, &e) == PD_OK, "%s", e.msg);
    free(k);
    free(v);
}

static wire_layer_ref ring_ref(ringfix *f)
{
    return (wire_layer_ref){.identity = ID, .layer = LAYER, .ring = f->r};
}

static void ring_same_answers(ringfix *a, ringfix *b, pd_rng *g)
{
    const uint32_t H = a->cfg.n_kv_heads, D = a->cfg.head_dim;
    ck_assert_uint_eq(ring_layer_position(a->r), ring_layer_position(b->r));
    if (ring_layer_position(a->r) == 0)
        return;
    float *q = malloc(sizeof(float) * H * D), *oa = malloc(sizeof(float) * H * D),
          *ob = malloc(sizeof(float) * H * D);
    pd_err e = {0};
    for (int t = 0; t < 3; t++) {
        pd_rng_fill(g, q, (size_t)H * D, -1.5f, 1.5f);
        ring_attend_opts o = {.softcap = t == 2 ? 3.0f : 0.0f};
        ck_assert_msg(ring_layer_attend(a->r, q, &o, oa, NULL, &e) == PD_OK, "%s", e.msg);
        ck_assert_msg(ring_layer_attend(b->r, q, &o, ob, NULL, &e) == PD_OK, "%s", e.msg);
        ck_assert_int_eq(memcmp(oa, ob, sizeof(float) * H * D), 0);
    }
    free(q);
    free(oa);
    free(ob);
}

static void ring_round_trip(ringfix *a, int f16, pd_rng *g)
{
    size_t len = 0;
    wire_layer_ref ra = ring_ref(a);
    uint8_t *bytes = export_ok(&ra, f16, &len);
    ringfix b;
    ring_mk(&b, a->cfg.n_kv_heads, a->cfg.head_dim, a->cfg.window, a->cfg.ref_capacity,
            a->cfg.int8_mirror ? 1 : a->cfg.mode != KV_MODE_F32 ? 1 + (int)a->cfg.mode : 0);
    wire_layer_ref rb = ring_ref(&b);
    pd_err e = {0};
    ck_assert_msg(wire_import(&rb, bytes, len, 0, 0, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(ring_layer_check(b.r, &e) == PD_OK, "%s", e.msg);
    ring_same_answers(a, &b, g);
    size_t len2 = 0;
    uint8_t *again = export_ok(&rb, f16, &len2);
    ck_assert_uint_eq(len, len2);
    ck_assert_int_eq(memcmp(bytes, again, len), 0);
    if (ring_layer_position(a->r) > 0) {
        /* Both keep answering alike after more decode writes (wrap included). */
        ring_fill(a, 0, a->cfg.window + 1, &(pd_rng){.s = 5}, 0);
        ring_fill(&b, 0, a->cfg.window + 1, &(pd_rng){.s = 5}, 0);
        ring_same_answers(a, &b, g);
    }
    free(again);
    free(bytes);
    ring_layer_free(b.r);
}

/* ---- identity ------------------------------------------------------------ */

START_TEST(wire_identity_is_stable_and_separates_inputs)
{
    const uint8_t digest[4] = {1, 2, 3, 4};
    uint64_t a = wire_identity(digest, 4, 0, "kv:f32");
    ck_assert_uint_eq(a, wire_identity(digest, 4, 0, "kv:f32"));
    ck_assert_uint_ne(a, 0);
    ck_assert_uint_ne(a, wire_identity(digest, 4, 1, "kv:f32"));
    ck_assert_uint_ne(a, wire_identity(digest, 4, 0, "kv:q8"));
    ck_assert_uint_ne(a, wire_identity(digest, 3, 0, "kv:f32"));
    /* framing: moving a byte between digest and policy changes the hash */
    ck_assert_uint_ne(wire_identity("ab", 2, 0, "c"), wire_identity("a", 1, 0, "bc"));
    ck_assert_uint_eq(wire_identity(NULL, 0, 7, NULL), wire_identity(NULL, 0, 7, ""));
    /* The documented algorithm (docs/wire.md), pinned so peers agree; the
     * values come from an independent script of the documented steps. */
    ck_assert_uint_eq(wire_identity(NULL, 0, 0, ""), 0x7bbcadcfc3601834ull);
    ck_assert_uint_eq(wire_identity(digest, 4, 7, "kv:f32"), 0x40dcba098793b474ull);
    /* computed before the FNV loops moved to base/fnv.c: an 8-byte digest, a
     * layer above 0 and a longer policy */
    const uint8_t digest8[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ck_assert_uint_eq(wire_identity(digest8, 8, 3, "ring:w=128"), 0x9169bddf13e27dbdull);
}
END_TEST

/* ---- round trips --------------------------------------------------------- */

/* Layers that travel as they are and come back answering alike (geometry,
 * mode, rows and what else they hold): f32 with a linear vector, q8 with a
 * frozen field and a trimmed tail, and empty ones, f32 and q8 with an f16
 * payload. */
static const struct kv_trip {
    uint32_t H, D;
    kv_mode mode;
    uint32_t freeze_rows; /* 0: the layer's default */
    uint32_t rows;        /* rows filled (f32 values) */
    uint32_t trim;        /* 0, or the window of a trim that must move the base */
    int linear;           /* a 3-value linear vector too */
    int f16;              /* payload dtype */
    uint64_t seed;
} kv_trips[] = {
    {3, 16, KV_MODE_F32, 0, 9, 0, 1, 0, 1},
    {2, 32, KV_MODE_Q8, 4, 40, 10, 0, 0, 7},
    {2, 4, KV_MODE_F32, 0, 0, 0, 0, 0, 8},
    {2, 4, KV_MODE_Q8, 0, 0, 0, 0, 1, 8},
};

START_TEST(wire_kv_round_trip_answers_bit_identically)
{
    const struct kv_trip *c = &kv_trips[_i];
    pd_rng g = {.s = c->seed};
    kvfix a;
    kv_mk(&a, c->H, c->D, c->mode, NULL);
    pd_err e = {0};
    if (c->freeze_rows) {
        a.cfg.freeze_rows = c->freeze_rows;
        kv_layer_free(a.l);
        ck_assert_msg(kv_layer_new(&a.cfg, &a.l, &e) == PD_OK, "%s", e.msg);
    }
    if (c->rows)
        kv_fill(&a, c->rows, &g, 0);
    if (c->trim) {
        kv_layer_trim_window(a.l, c->trim, 2, 1);
        ck_assert_uint_gt(kv_layer_base(a.l), 0);
    }
    if (c->linear) {
        const float lin[3] = {0.5f, -0.25f, 1.0f};
        ck_assert_msg(kv_layer_set_linear(a.l, lin, 3, &e) == PD_OK, "%s", e.msg);
    }
    kv_round_trip(&a, c->f16, &g);
    kv_layer_free(a.l);
}
END_TEST

/* Import through a spare: the target answers like the source, the spare
 * receives the target's previous state, a refused record changes neither,
 * and a spare of another geometry is refused. */
START_TEST(wire_import_into_a_spare_swaps_it_with_the_target)
{
    for (int mi = 0; mi < 4; mi++) {
        static const kv_mode modes[4] = {KV_MODE_F32, KV_MODE_Q8K, KV_MODE_Q8V, KV_MODE_Q8};
        pd_rng g = {.s = 40 + (uint64_t)mi};
        kvfix a, b, spare, old;
        kv_mk(&a, 3, 16, modes[mi], NULL);
        kv_fill(&a, 9, &g, 0);
        kv_mk(&b, 3, 16, modes[mi], NULL);
        kv_fill(&b, 4, &(pd_rng){.s = 500}, 0); /* the target's previous state */
        kv_mk(&old, 3, 16, modes[mi], NULL);
        kv_fill(&old, 4, &(pd_rng){.s = 500}, 0); /* a copy of it */
        kv_mk(&spare, 3, 16, modes[mi], NULL);
        size_t len = 0;
        wire_layer_ref ra = kv_ref(&a);
        uint8_t *bytes = export_ok(&ra, 0, &len);
        wire_layer_ref rb = kv_ref(&b);
        rb.kv_spare = spare.l;
        pd_err e = {0};
        /* a damaged record changes neither the target nor the spare's answers */
        bytes[len - 1] ^= 0x40;
        if (wire_import(&rb, bytes, len, 0, 0, &e) != PD_OK) {
            kv_layer_check(b.l);
        }
        bytes[len - 1] ^= 0x40;
        pd_err_clear(&e);
        ck_assert_msg(wire_import(&rb, bytes, len, 0, 0, &e) == PD_OK, "%s", e.msg);
        kv_layer_check(b.l);
        kv_layer_check(spare.l);
        kv_same_answers(&a, &b, &g);
        kv_same_answers(&b, &a, &g);
        /* the spare now holds what the target held */
        ck_assert_uint_eq(kv_layer_rows(spare.l), 4);
        kv_same_answers(&old, &spare, &g);
        /* a spare of another geometry is refused before anything changes */
        kvfix other;
        kv_mk(&other, 3, 8, modes[mi], NULL);
        rb.kv_spare = other.l;
        pd_err_clear(&e);
        ck_assert_int_eq(wire_import(&rb, bytes, len, 0, 0, &e), PD_ERR_ARG);
        ck_assert_msg(strstr(e.msg, "spare") != NULL, "%s", e.msg);
        kv_same_answers(&a, &b, &g);
        free(bytes);
        kv_layer_free(other.l);
        kv_layer_free(a.l);
        kv_layer_free(b.l);
        kv_layer_free(old.l);
        kv_layer_free(spare.l);
    }
}
END_TEST

START_TEST(wire_full_with_dead_heads_round_trips)
{
    pd_rng g = {.s = 2};
    const uint8_t alive[4] = {1, 0, 1, 0};
    kvfix a;
    kv_mk(&a, 4, 8, KV_MODE_F32, alive);
    kv_fill(&a, 6, &g, 0);
    size_t len = 0;
    wire_layer_ref ra = kv_ref(&a);
    uint8_t *bytes = export_ok(&ra, 0, &len);
    wire_info info;
    ck_assert_int_eq(wire_inspect(bytes, len, 0, 0, &info, NULL), PD_OK);
    ck_assert_uint_eq(info.alive_heads, 2);
    /* dead heads cost 8 bytes (two zero counts) each */
    ck_assert_uint_eq(len, 32 + 24 + 6 * 4 + 2 * (8 + 2 * 6 * 8 * 4) + 2 * 8);
    free(bytes);
    kv_round_trip(&a, 0, &g);
    kv_layer_free(a.l);
}
END_TEST

START_TEST(wire_full_f16_round_trips_exactly_on_representable_values)
{
    pd_rng g = {.s = 3};
    kvfix a;
    kv_mk(&a, 2, 8, KV_MODE_F32, NULL);
    kv_fill(&a, 7, &g, 1);
    size_t l32 = 0, l16 = 0;
    wire_layer_ref ra = kv_ref(&a);
    uint8_t *b32_ = export_ok(&ra, 0, &l32), *b16_ = export_ok(&ra, 1, &l16);
    /* K/V payloads halve; importance and header do not */
    ck_assert_uint_eq(l32 - l16, 2 * 2 * 7 * 8 * 2);
    ck_assert_uint_eq(b16_[21], 1);
    free(b32_);
    free(b16_);
    kv_round_trip(&a, 1, &g);
    kv_layer_free(a.l);
}
END_TEST

START_TEST(wire_full_f16_rounds_other_values_to_nearest_half)
{
    pd_rng g = {.s = 4};
    kvfix a, b;
    kv_mk(&a, 1, 8, KV_MODE_F32, NULL);
    kv_mk(&b, 1, 8, KV_MODE_F32, NULL);
    kv_fill(&a, 3, &g, 0);
    size_t len = 0;
    wire_layer_ref ra = kv_ref(&a), rb = kv_ref(&b);
    uint8_t *bytes = export_ok(&ra, 1, &len);
    pd_err e = {0};
    ck_assert_msg(wire_import(&rb, bytes, len, 0, 0, &e) == PD_OK, "%s", e.msg);
    kv_state sa, sb;
    kv_head_state ha[1], hb[1];
    kv_layer_state(a.l, &sa, ha);
    kv_layer_state(b.l, &sb, hb);
    for (size_t i = 0; i < 3 * 8; i++)
        ck_assert_float_eq(hb[0].k[i], pd_f16_to_f32(pd_f32_to_f16(ha[0].k[i])));
    free(bytes);
    kv_layer_free(a.l);
    kv_layer_free(b.l);
}
END_TEST

START_TEST(wire_full_tail_round_trips_and_untrimmed_is_plain_full)
{
    pd_rng g = {.s = 5};
    kvfix a;
    kv_mk(&a, 2, 8, KV_MODE_F32, NULL);
    kv_fill(&a, 5, &g, 0);
    size_t len = 0;
    wire_layer_ref ra = kv_ref(&a);
    uint8_t *bytes = export_ok(&ra, 0, &len);
    ck_assert_uint_eq(bytes[20], WIRE_KIND_FULL);
    free(bytes);
    kv_fill(&a, 20, &g, 0);
    ck_assert_uint_gt(kv_layer_trim_window(a.l, 8, 2, 4), 0);
    ck_assert_uint_gt(kv_layer_base(a.l), 0);
    kv_layer_check(a.l);
    bytes = export_ok(&ra, 0, &len);
    ck_assert_uint_eq(bytes[20], WIRE_KIND_FULL_TAIL);
    free(bytes);
    kv_round_trip(&a, 0, &g);
    kv_layer_free(a.l);
}
END_TEST

static const kv_mode q8_modes[3] = {KV_MODE_Q8K, KV_MODE_Q8V, KV_MODE_Q8};

START_TEST(wire_q8_round_trips_every_mode_frozen_or_not)
{
    const uint8_t alive[3] = {1, 0, 1};
    const int m = _i / 4, frozen = _i / 2 % 2, f16 = _i % 2; /* q8_modes x frozen or not x f32 or f16 */
    pd_rng g = {.s = 100 + (uint64_t)(m * 4 + frozen * 2 + f16)};
    kvfix a;
    kv_mk(&a, 3, 40, q8_modes[m], alive); /* 40 channels: a partial k group */
    a.cfg.freeze_rows = 6;
    kv_layer_free(a.l);
    pd_err e = {0};
    ck_assert_msg(kv_layer_new(&a.cfg, &a.l, &e) == PD_OK, "%s", e.msg);
    kv_fill(&a, frozen ? 8 : 4, &g, f16);
    ck_assert_int_eq(kv_layer_frozen(a.l), frozen);
    size_t len = 0;
    wire_layer_ref ra = kv_ref(&a);
    uint8_t *bytes = export_ok(&ra, f16, &len);
    ck_assert_uint_eq(bytes[20], WIRE_KIND_Q8);
    free(bytes);
    kv_round_trip(&a, f16, &g);
    kv_layer_free(a.l);
}
END_TEST

START_TEST(wire_linear_round_trips_vector_and_depth)
{
    kvfix a, b;
    kv_mk(&a, 2, 4, KV_MODE_F32, NULL);
    kv_mk(&b, 2, 4, KV_MODE_F32, NULL);
    const float lin[4] = {0.5f, -0.25f, 1.0f, 3.5f};
    pd_err e = {0};
    ck_assert_msg(kv_layer_set_linear(a.l, lin, 4, &e) == PD_OK, "%s", e.msg);
    wire_layer_ref ra = kv_ref(&a), rb = kv_ref(&b);
    ra.linear = rb.linear = 1;
    for (int f16 = 0; f16 < 2; f16++) {
        size_t len = 0;
        uint8_t *bytes = export_ok(&ra, f16, &len);
        ck_assert_uint_eq(bytes[20], WIRE_KIND_LINEAR);
        ck_assert_uint_eq(len, 32 + 12 + 16); /* f32 whatever the payload dtype */
        ck_assert_msg(wire_import(&rb, bytes, len, 0, 0, &e) == PD_OK, "%s", e.msg);
        kv_state s;
        kv_head_state hs[2];
        kv_layer_state(b.l, &s, hs);
        ck_assert_uint_eq(s.n_linear, 4);
        ck_assert_int_eq(memcmp(s.linear, lin, sizeof lin), 0);
        ck_assert_uint_eq(s.rows, 0);
        free(bytes);
    }
    kv_layer_free(a.l);
    kv_layer_free(b.l);
}
END_TEST

START_TEST(wire_bounded_round_trips_f32_and_f16)
{
    kvfix a, b;
    kv_mk(&a, 2, 4, KV_MODE_F32, NULL);
    kv_mk(&b, 2, 4, KV_MODE_F32, NULL);
    pd_err e = {0};
    ck_assert_msg(kv_layer_install_bounded(a.l, 8, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(kv_layer_install_bounded(b.l, 8, &e) == PD_OK, "%s", e.msg);
    float k[8];
    for (int p = 0; p < 11; p++) {
        for (int i = 0; i < 8; i++)
            k[i] = (float)(p * 8 + i) * 0.125f;
        ck_assert_msg(kv_layer_bounded_insert(a.l, k, k, &e) == PD_OK, "%s", e.msg);
    }
    wire_layer_ref ra = kv_ref(&a), rb = kv_ref(&b);
    for (int f16 = 0; f16 < 2; f16++) {
        size_t len = 0;
        uint8_t *bytes = export_ok(&ra, f16, &len);
        ck_assert_uint_eq(bytes[20], WIRE_KIND_BOUNDED);
        ck_assert_msg(wire_import(&rb, bytes, len, 0, 0, &e) == PD_OK, "%s", e.msg);
        kv_state sa, sb;
        kv_head_state ha[2], hb[2];
        kv_layer_state(a.l, &sa, ha);
        kv_layer_state(b.l, &sb, hb);
        ck_assert_uint_eq(sb.bounded.len, 11);
        ck_assert_uint_eq(sb.bounded.head, 3);
        ck_assert_int_eq(memcmp(sa.bounded.k, sb.bounded.k, sizeof(float) * 2 * 8 * 4), 0);
        ck_assert_int_eq(memcmp(sa.bounded.v, sb.bounded.v, sizeof(float) * 2 * 8 * 4), 0);
        uint8_t *again = export_ok(&rb, f16, &len);
        ck_assert_int_eq(memcmp(bytes, again, len), 0);
        free(again);
        free(bytes);
    }
    kv_layer_free(a.l);
    kv_layer_free(b.l);
}
END_TEST

START_TEST(wire_ring_round_trips_at_every_fill_level)
{
    /* 5 storages x f32 or f16 x writes 0, 3, 6, 9 */
    const int i8 = _i / 8, f16 = _i / 4 % 2;
    const uint32_t writes = 3 * (uint32_t)(_i % 4);
    pd_rng g = {.s = 200 + writes + 20 * (uint64_t)f16 + 40 * (uint64_t)i8};
    ringfix a;
    ring_mk(&a, 2, 8, 4, 12, i8);
    ring_fill(&a, 5, writes, &g, f16);
    ring_round_trip(&a, f16, &g);
    ring_layer_free(a.r);
}
END_TEST

START_TEST(wire_empty_ring_layer_round_trips)
{
    pd_rng g = {.s = 9};
    ringfix a;
    ring_mk(&a, 1, 4, 2, 4, 0);
    ring_round_trip(&a, 0, &g);
    ring_layer_free(a.r);
}
END_TEST

START_TEST(wire_ring_export_ignores_pending_drafts)
{
    pd_rng g = {.s = 10};
    ringfix a;
    ring_mk(&a, 1, 4, 4, 8, 0);
    ring_fill(&a, 3, 2, &g, 0);
    size_t l1 = 0, l2 = 0;
    wire_layer_ref ra = ring_ref(&a);
    uint8_t *before = export_ok(&ra, 0, &l1);
    float k[4] = {1, 2, 3, 4};
    pd_err e = {0};
    ck_assert_msg(ring_layer_draft_put(a.r, k, k, &e) == PD_OK, "%s", e.msg);
    uint8_t *after = export_ok(&ra, 0, &l2);
    ck_assert_uint_eq(l1, l2);
    ck_assert_int_eq(memcmp(before, after, l1), 0);
    free(before);
    free(after);
    ring_layer_free(a.r);
}
END_TEST

/* ---- golden records (assembled by hand from the documented layout) ------ */

/* The ring_q8 record of wire.md §3 kind 6, by hand: 1 head x 2 channels,
 * window 2, k_group 32, 1 reference row, 3 writes (len 2, pos 1), mode q8. */
static void golden_ring_q8(bb *b)
{
    *b = (bb){.n = 0};
    bhdr(b, WIRE_KIND_RING_Q8, 0, 4);
    b32(b, 1);  /* 32 kv_heads */
    b32(b, 2);  /* 36 head_dim */
    b32(b, 2);  /* 40 window */
    b32(b, 32); /* 44 k_group */
    b32(b, 1);  /* 48 ref_rows */
    b32(b, 2);  /* 52 ring_len */
    b32(b, 1);  /* 56 ring_pos */
    b64(b, 3);  /* 60 writes */
    b8(b, 1);   /* 68 decoding */
    b8(b, 3);   /* 69 mode */
    b16(b, 0);  /* 70 reserved */
    b32(b, 2);  /* 72 ref K codes */
    b8(b, 127);
    b8(b, (uint8_t)-64);
    b32(b, 1); /* 78 ref K scales */
    bf(b, 0.5f);
    b32(b, 2); /* 86 ref V codes */
    b8(b, 3);
    b8(b, 127);
    b32(b, 1); /* 92 ref V scales */
    bf(b, 0.25f);
    b32(b, 4); /* 100 ring K codes */
    b8(b, 1);
    b8(b, 127);
    b8(b, (uint8_t)-127);
    b8(b, 0);
    b32(b, 2); /* 108 ring K scales */
    bf(b, 1.0f);
    bf(b, 2.0f);
    b32(b, 4); /* 120 ring V codes */
    b8(b, 127);
    b8(b, 5);
    b8(b, 6);
    b8(b, (uint8_t)-127);
    b32(b, 2); /* 128 ring V scales */
    bf(b, 0.125f);
    bf(b, 4.0f);
    ck_assert_uint_eq(b->n, 140);
}

START_TEST(wire_golden_ring_q8_record_decodes_and_reencodes)
{
    bb good;
    golden_ring_q8(&good);
    wire_info info;
    pd_err e = {0};
    ck_assert_msg(wire_inspect(good.b, good.n, 0, 0, &info, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(info.kind, WIRE_KIND_RING_Q8);
    ck_assert_str_eq(wire_kind_name(WIRE_KIND_RING_Q8), "ring_q8");
    ck_assert_uint_eq(info.mode, KV_MODE_Q8);
    ck_assert_uint_eq(info.k_group, 32);
    ck_assert_uint_eq(info.rows, 1);
    ck_assert_uint_eq(info.writes, 3);
    ringfix r;
    ring_mk(&r, 1, 2, 2, 4, 4);
    wire_layer_ref rr = ring_ref(&r);
    ck_assert_msg(wire_import(&rr, good.b, good.n, 0, 0, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(ring_layer_check(r.r, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(ring_layer_position(r.r), 4);
    ring_state st;
    ring_layer_state(r.r, &st);
    ck_assert_int_eq(st.ring_kq[0][1], 127);
    ck_assert_float_eq(st.ring_vs[0][1], 4.0f);
    for (int f16 = 0; f16 < 2; f16++) { /* int8 and scales never change dtype */
        size_t len = 0;
        uint8_t *again = export_ok(&rr, f16, &len);
        ck_assert_uint_eq(len, good.n);
        ck_assert_int_eq(memcmp(again + 22, good.b + 22, len - 22), 0);
        ck_assert_int_eq(again[21], f16);
        free(again);
    }
    ring_layer_free(r.r);
}
END_TEST

START_TEST(wire_ring_q8_faults_are_refused_without_change)
{
    bb good;
    golden_ring_q8(&good);
    ringfix r;
    ring_mk(&r, 1, 2, 2, 4, 4);
    wire_layer_ref rr = ring_ref(&r);
    pd_err e = {0};
    struct {
        size_t off;
        uint8_t val;
        pd_status want;
        const char *needle;
    } cases[] = {
        {69, 0, PD_ERR_FORMAT, "offset 69: ring_q8 mode 0 is not 1, 2 or 3"},
        {69, 4, PD_ERR_FORMAT, "ring_q8 mode 4"},
        {69, 1, PD_ERR_FORMAT, "offset 98: head 0 ref v scale count"}, /* q8k: V read as f32 */
        {44, 0, PD_ERR_FORMAT, "offset 44: k_group 0"},
        {44, 16, PD_ERR_MISMATCH, "k_group 16"},
        {70, 1, PD_ERR_FORMAT, "offset 70: reserved"},
        {68, 2, PD_ERR_FORMAT, "decoding 2"},
        {52, 3, PD_ERR_RANGE, "ring_len 3 exceeds window 2"},
        {78, 2, PD_ERR_FORMAT, "offset 78: head 0 ref k scale count 2, expected 1"},
        {108, 1, PD_ERR_FORMAT, "offset 108: head 0 ring k scale count 1, expected 2"},
        {77, 0x80, PD_ERR_FORMAT, "-128"},
        {85, 0xbf, PD_ERR_FORMAT, "scale"}, /* 0.5f -> -0.5f */
        {135, 0x7f, PD_ERR_FORMAT, "offset 132: head 0 ring v scale value 0 is not finite"},
        {20, WIRE_KIND_RING, PD_ERR_MISMATCH, "kind ring does not fit this layer (takes ring_q8)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bb c = good;
        c.b[cases[i].off] = cases[i].val;
        if (cases[i].off == 135) { /* +inf */
            c.b[134] = 0x80;
            c.b[133] = 0;
            c.b[132] = 0;
        }
        pd_err_clear(&e);
        uint64_t id = ring_layer_id(r.r);
        pd_status got = wire_import(&rr, c.b, c.n, 0, 0, &e);
        ck_assert_msg(got == cases[i].want, "case %zu: %s: %s", i, pd_status_str(got), e.msg);
        ck_assert_msg(strstr(e.msg, cases[i].needle) != NULL, "case %zu: '%s'", i, e.msg);
        ck_assert_uint_eq(ring_layer_id(r.r), id);
        ck_assert_uint_eq(ring_layer_position(r.r), 0);
    }
    /* truncated at every offset, and one trailing byte */
    for (size_t n = 0; n < good.n; n++) {
        pd_err_clear(&e);
        ck_assert_int_ne(wire_import(&rr, good.b, n, 0, 0, &e), PD_OK);
        ck_assert_int_ne(wire_inspect(good.b, n, 0, 0, NULL, &e), PD_OK);
        ck_assert_uint_eq(ring_layer_position(r.r), 0);
    }
    bb longer = good;
    longer.b[longer.n++] = 0;
    ck_assert_int_eq(wire_import(&rr, longer.b, longer.n, 0, 0, &e), PD_ERR_FORMAT);
    /* the other storages refuse it */
    for (int i8 = 0; i8 < 4; i8++) {
        ringfix o;
        ring_mk(&o, 1, 2, 2, 4, i8);
        wire_layer_ref ro = ring_ref(&o);
        pd_err_clear(&e);
        ck_assert_int_eq(wire_import(&ro, good.b, good.n, 0, 0, &e), PD_ERR_MISMATCH);
        ck_assert_uint_eq(ring_layer_position(o.r), 0);
        ring_layer_free(o.r);
    }
    /* and a q8 ring refuses the f32 ring kind */
    ringfix f;
    ring_mk(&f, 1, 2, 2, 4, 0);
    ring_fill(&f, 1, 3, &(pd_rng){.s = 3}, 0);
    wire_layer_ref rf = ring_ref(&f);
    size_t len = 0;
    uint8_t *f32rec = export_ok(&rf, 0, &len);
    pd_err_clear(&e);
    ck_assert_int_eq(wire_import(&rr, f32rec, len, 0, 0, &e), PD_ERR_MISMATCH);
    ck_assert_msg(strstr(e.msg, "takes ring_q8") != NULL, "%s", e.msg);
    free(f32rec);
    ring_layer_free(f.r);
    ring_layer_free(r.r);
}
END_TEST

static void golden_accept_and_reproduce(const bb *gold, kvfix *t, int linear, int f16)
{
    pd_err e = {0};
    wire_info info;
    ck_assert_msg(wire_inspect(gold->b, gold->n, 0, 0, &info, &e) == PD_OK, "%s", e.msg);
    wire_layer_ref ref = kv_ref(t);
    ref.linear = linear;
    ck_assert_msg(wire_import(&ref, gold->b, gold->n, 0, 0, &e) == PD_OK, "%s", e.msg);
    kv_layer_check(t->l);
    size_t len = 0;
    uint8_t *again = export_ok(&ref, f16, &len);
    ck_assert_uint_eq(len, gold->n);
    for (size_t i = 0; i < len; i++)
        ck_assert_msg(again[i] == gold->b[i], "byte %zu: %02x, golden %02x", i, again[i],
                      gold->b[i]);
    free(again);
}

/* full_body of 2 rows, 2 heads x 2 channels, head 1 dead, 1 linear value. */
static void golden_full_body(bb *b, int f16)
{
    b32(b, (uint32_t)f16);
    b32(b, 2);    /* rows */
    b32(b, 2);    /* kv_heads */
    b32(b, 2);    /* head_dim */
    b32(b, 1);    /* n_linear */
    b32(b, 2);    /* n_importance */
    bf(b, 0.75f); /* linear */
    bf(b, 1.5f);  /* importance row 0 */
    bf(b, 0.5f);  /* importance row 1 */
    const float kv[2][4] = {{1.0f, -2.0f, 0.5f, 0.25f}, {-1.0f, 2.0f, -0.5f, 4.0f}};
    const uint16_t kv16[2][4] = {{0x3c00, 0xc000, 0x3800, 0x3400}, {0xbc00, 0x4000, 0xb800, 0x4400}};
    for (int which = 0; which < 2; which++) { /* head 0: k then v */
        b32(b, 4);
        for (int i = 0; i < 4; i++) {
            if (f16)
                b16(b, kv16[which][i]);
            else
                bf(b, kv[which][i]);
        }
    }
    b32(b, 0); /* head 1 k: dead */
    b32(b, 0); /* head 1 v */
}

START_TEST(wire_golden_full_records_decode_and_reencode_byte_for_byte)
{
    const uint8_t alive[2] = {1, 0};
    for (int f16 = 0; f16 < 2; f16++) {
        bb gold = {.n = 0};
        bhdr(&gold, WIRE_KIND_FULL, (uint8_t)f16, 2);
        golden_full_body(&gold, f16);
        ck_assert_uint_eq(gold.n, 32 + 24 + 12 + 2 * (4 + 4 * (f16 ? 2 : 4)) + 8);
        kvfix t;
        kv_mk(&t, 2, 2, KV_MODE_F32, alive);
        golden_accept_and_reproduce(&gold, &t, 0, f16);
        kv_state s;
        kv_head_state hs[2];
        kv_layer_state(t.l, &s, hs);
        ck_assert_uint_eq(s.rows, 2);
        ck_assert_float_eq(hs[0].k[1], -2.0f);
        ck_assert_float_eq(hs[0].v[3], 4.0f);
        ck_assert_float_eq(s.imp[0], 1.5f);
        ck_assert_float_eq(s.linear[0], 0.75f);
        kv_layer_free(t.l);
    }
}
END_TEST

START_TEST(wire_golden_full_tail_record_decodes_and_reencodes)
{
    const uint8_t alive[2] = {1, 0};
    bb gold = {.n = 0};
    bhdr(&gold, WIRE_KIND_FULL_TAIL, 0, 7);
    b64(&gold, 5); /* base */
    golden_full_body(&gold, 0);
    kvfix t;
    kv_mk(&t, 2, 2, KV_MODE_F32, alive);
    golden_accept_and_reproduce(&gold, &t, 0, 0);
    ck_assert_uint_eq(kv_layer_base(t.l), 5);
    ck_assert_uint_eq(kv_layer_pos_len(t.l), 7);
    kv_layer_free(t.l);
}
END_TEST

START_TEST(wire_golden_linear_record_decodes_and_reencodes)
{
    bb gold = {.n = 0};
    bhdr(&gold, WIRE_KIND_LINEAR, 0, 9);
    b32(&gold, 1); /* kv_heads */
    b32(&gold, 4); /* head_dim */
    b32(&gold, 3);
    bf(&gold, 0.5f);
    bf(&gold, -0.25f);
    bf(&gold, 1.0f);
    kvfix t;
    kv_mk(&t, 1, 4, KV_MODE_F32, NULL);
    golden_accept_and_reproduce(&gold, &t, 1, 0);
    ck_assert_uint_eq(kv_layer_pos_len(t.l), 9);
    /* a full layer does not take a linear record (kind must fit) */
    kvfix u;
    kv_mk(&u, 1, 4, KV_MODE_F32, NULL);
    wire_layer_ref ru = kv_ref(&u);
    pd_err e = {0};
    ck_assert_int_eq(wire_import(&ru, gold.b, gold.n, 0, 0, &e), PD_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(e.msg, "offset 20"));
    kv_layer_free(t.l);
    kv_layer_free(u.l);
}
END_TEST

START_TEST(wire_golden_bounded_record_decodes_and_reencodes)
{
    for (int f16 = 0; f16 < 2; f16++) {
        bb gold = {.n = 0};
        bhdr(&gold, WIRE_KIND_BOUNDED, (uint8_t)f16, 4);
        b32(&gold, 1); /* kv_heads */
        b32(&gold, 2); /* head_dim */
        b32(&gold, 3); /* window */
        b32(&gold, 3); /* len = min(4, 3) */
        b32(&gold, 1); /* head = 4 % 3 */
        for (int which = 0; which < 2; which++)
            for (int i = 0; i < 6; i++) {
                float x = (float)(i + 1) * (which ? -0.5f : 0.25f);
                if (f16)
                    b16(&gold, pd_f32_to_f16(x)); /* exact: small multiples of 1/4 */
                else
                    bf(&gold, x);
            }
        kvfix t;
        kv_mk(&t, 1, 2, KV_MODE_F32, NULL);
        pd_err e = {0};
        ck_assert_msg(kv_layer_install_bounded(t.l, 3, &e) == PD_OK, "%s", e.msg);
        golden_accept_and_reproduce(&gold, &t, 0, f16);
        kv_layer_free(t.l);
    }
}
END_TEST

START_TEST(wire_legacy_body_is_read_only_when_allowed)
{
    const uint8_t alive[2] = {1, 0};
    bb body = {.n = 0};
    golden_full_body(&body, 0);
    kvfix t;
    kv_mk(&t, 2, 2, KV_MODE_F32, alive);
    wire_layer_ref ref = kv_ref(&t);
    pd_err e = {0};
    uint64_t gen = kv_layer_generation(t.l);
    ck_assert_int_eq(wire_import(&ref, body.b, body.n, 0, 0, &e), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "WIRE_ALLOW_LEGACY"));
    ck_assert_uint_eq(kv_layer_generation(t.l), gen);
    pd_err_clear(&e);
    ck_assert_msg(wire_import(&ref, body.b, body.n, WIRE_ALLOW_LEGACY, 0, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(kv_layer_rows(t.l), 2);
    /* the versioned export of that state is the golden full record */
    bb gold = {.n = 0};
    bhdr(&gold, WIRE_KIND_FULL, 0, 2);
    golden_full_body(&gold, 0);
    size_t len = 0;
    uint8_t *again = export_ok(&ref, 0, &len);
    ck_assert_uint_eq(len, gold.n);
    ck_assert_int_eq(memcmp(again, gold.b, len), 0);
    free(again);
    /* a legacy body never goes into a linear layer */
    ref.linear = 1;
    pd_err_clear(&e);
    ck_assert_int_eq(wire_import(&ref, body.b, body.n, WIRE_ALLOW_LEGACY, 0, &e), PD_ERR_MISMATCH);
    kv_layer_free(t.l);
}
END_TEST

/* ---- negative ------------------------------------------------------------ */

/* The target's full observable state, to prove nothing was installed. */
typedef struct tsnap {
    uint8_t *bytes;
    size_t len;
    uint64_t gen;
} tsnap;

static tsnap kv_snap(kvfix *t)
{
    tsnap s = {.gen = kv_layer_generation(t->l)};
    wire_layer_ref r = kv_ref(t);
    s.bytes = export_ok(&r, 0, &s.len);
    return s;
}

static void kv_unchanged(kvfix *t, tsnap *s)
{
    ck_assert_uint_eq(kv_layer_generation(t->l), s->gen);
    tsnap now = kv_snap(t);
    ck_assert_uint_eq(now.len, s->len);
    ck_assert_int_eq(memcmp(now.bytes, s->bytes, s->len), 0);
    free(now.bytes);
}

/* Imports buf and expects status `want`, with the target untouched. */
static void kv_refused(kvfix *t, const uint8_t *buf, size_t len, pd_status want, const char *needle)
{
    tsnap s = kv_snap(t);
    wire_layer_ref r = kv_ref(t);
    pd_err e = {0};
    pd_status got = wire_import(&r, buf, len, 0, 0, &e);
    ck_assert_msg(got == want, "status %s (want %s): %s", pd_status_str(got), pd_status_str(want),
                  e.msg);
    ck_assert_ptr_nonnull(strstr(e.msg, "offset "));
    if (needle)
        ck_assert_msg(strstr(e.msg, needle) != NULL, "'%s' lacks '%s'", e.msg, needle);
    kv_unchanged(t, &s);
    free(s.bytes);
}

START_TEST(wire_truncation_at_every_offset_is_refused_without_change)
{
    pd_rng g = {.s = 11};
    kvfix a, t;
    const uint8_t alive[2] = {1, 0};
    kv_mk(&a, 2, 4, KV_MODE_F32, alive);
    kv_fill(&a, 3, &g, 0);
    kv_mk(&t, 2, 4, KV_MODE_F32, alive);
    kv_fill(&t, 1, &g, 0);
    size_t len = 0;
    wire_layer_ref ra = kv_ref(&a);
    uint8_t *bytes = export_ok(&ra, 1, &len);
    tsnap s = kv_snap(&t);
    wire_layer_ref rt = kv_ref(&t);
    for (size_t cut = 0; cut < len; cut++) {
        pd_err e = {0};
        uint8_t *copy = malloc(cut + 1); /* exact-size copy: ASan sees any overread */
        memcpy(copy, bytes, cut);
        ck_assert_int_eq(wire_import(&rt, copy, cut, 0, 0, &e), PD_ERR_TRUNCATED);
        ck_assert_int_eq(wire_inspect(copy, cut, 0, 0, NULL, NULL), PD_ERR_TRUNCATED);
        free(copy);
    }
    kv_unchanged(&t, &s);
    free(s.bytes);
    free(bytes);
    /* the same for a ring record and a q8 record (inspect path) */
    ringfix r;
    ring_mk(&r, 2, 4, 3, 6, 1);
    ring_fill(&r, 2, 4, &g, 0);
    wire_layer_ref rr = ring_ref(&r);
    bytes = export_ok(&rr, 0, &len);
    for (size_t cut = 0; cut < len; cut++)
        ck_assert_int_eq(wire_inspect(bytes, cut, 0, 0, NULL, NULL), PD_ERR_TRUNCATED);
    free(bytes);
    ring_layer_free(r.r);
    kv_layer_free(a.l);
    kv_layer_free(t.l);
}
END_TEST

START_TEST(wire_header_faults_are_refused_with_their_offset)
{
    pd_rng g = {.s = 12};
    kvfix a, t;
    kv_mk(&a, 2, 4, KV_MODE_F32, NULL);
    kv_fill(&a, 3, &g, 0);
    kv_mk(&t, 2, 4, KV_MODE_F32, NULL);
    size_t len = 0;
    wire_layer_ref ra = kv_ref(&a);
    uint8_t *bytes = export_ok(&ra, 0, &len);
    uint8_t *c = malloc(len + 1);
#define MUT(stmt, want, needle)                                                                    \
    do {                                                                                           \
        memcpy(c, bytes, len);                                                                     \
        size_t n = len;                                                                            \
        stmt;                                                                                      \
        kv_refused(&t, c, n, want, needle);                                                        \
    } while (0)
    MUT(c[0] = 'X', PD_ERR_FORMAT, "offset 0: magic");
    MUT(c[4] = 3, PD_ERR_VERSION, "offset 4: wire version 3");
    MUT(c[8] ^= 1, PD_ERR_MISMATCH, "offset 8: identity");
    MUT(c[16] = 4, PD_ERR_MISMATCH, "offset 16: record is for layer 4");
    MUT(c[20] = WIRE_KIND_COUNT, PD_ERR_UNSUPPORTED, "offset 20: unknown state kind 7");
    MUT(c[20] = 200, PD_ERR_UNSUPPORTED, "unknown state kind 200");
    MUT(c[20] = WIRE_KIND_RING, PD_ERR_MISMATCH, "kind ring does not fit");
    MUT(c[21] = 2, PD_ERR_FORMAT, "offset 21: f16 2 is not 0 or 1");
    MUT(c[21] = 1, PD_ERR_FORMAT, "disagrees with header");
    MUT(c[22] = 1, PD_ERR_FORMAT, "offset 22: reserved");
    MUT(c[24] = 4, PD_ERR_FORMAT, "header position 4 != record rows 3");
    MUT((c[len] = 0, n = len + 1), PD_ERR_FORMAT, "1 trailing byte");
#undef MUT
    free(c);
    free(bytes);
    kv_layer_free(a.l);
    kv_layer_free(t.l);
}
END_TEST

START_TEST(wire_geometry_and_kind_mismatches_are_refused)
{
    pd_rng g = {.s = 13};
    kvfix a;
    kv_mk(&a, 2, 4, KV_MODE_F32, NULL);
    kv_fill(&a, 3, &g, 0);
    size_t len = 0;
    wire_layer_ref ra = kv_ref(&a);
    uint8_t *bytes = export_ok(&ra, 0, &len);
    kvfix t;
    kv_mk(&t, 2, 8, KV_MODE_F32, NULL); /* head_dim differs */
    kv_refused(&t, bytes, len, PD_ERR_MISMATCH, "geometry");
    kv_layer_free(t.l);
    kv_mk(&t, 3, 4, KV_MODE_F32, NULL); /* kv heads differ */
    kv_refused(&t, bytes, len, PD_ERR_MISMATCH, "geometry");
    kv_layer_free(t.l);
    const uint8_t alive[2] = {1, 0};
    kv_mk(&t, 2, 4, KV_MODE_F32, alive); /* head 1 dead here */
    kv_refused(&t, bytes, len, PD_ERR_MISMATCH, "head 1");
    kv_layer_free(t.l);
    kv_mk(&t, 2, 4, KV_MODE_Q8, NULL); /* q8 layer takes only q8 records */
    kv_refused(&t, bytes, len, PD_ERR_MISMATCH, "kind full does not fit");
    kv_layer_free(t.l);
    free(bytes);

    /* a ring record into a kv layer, a kv record into a ring layer */
    ringfix r;
    ring_mk(&r, 2, 4, 3, 6, 0);
    ring_fill(&r, 2, 1, &g, 0);
    wire_layer_ref rr = ring_ref(&r);
    bytes = export_ok(&rr, 0, &len);
    kv_mk(&t, 2, 4, KV_MODE_F32, NULL);
    kv_refused(&t, bytes, len, PD_ERR_MISMATCH, "kind ring");
    kv_layer_free(t.l);
    free(bytes);
    bytes = export_ok(&ra, 0, &len);
    pd_err e = {0};
    uint64_t id = ring_layer_id(r.r);
    ck_assert_int_eq(wire_import(&rr, bytes, len, 0, 0, &e), PD_ERR_MISMATCH);
    ck_assert_uint_eq(ring_layer_id(r.r), id);
    free(bytes);
    /* ring geometry: window and mirror must match */
    bytes = export_ok(&rr, 0, &len);
    ringfix r2;
    ring_mk(&r2, 2, 4, 4, 6, 0);
    wire_layer_ref rr2 = ring_ref(&r2);
    pd_err_clear(&e);
    id = ring_layer_id(r2.r);
    ck_assert_int_eq(wire_import(&rr2, bytes, len, 0, 0, &e), PD_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(e.msg, "window"));
    ck_assert_uint_eq(ring_layer_id(r2.r), id);
    ring_layer_free(r2.r);
    ring_mk(&r2, 2, 4, 3, 6, 1);
    rr2 = ring_ref(&r2);
    pd_err_clear(&e);
    ck_assert_int_eq(wire_import(&rr2, bytes, len, 0, 0, &e), PD_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(e.msg, "mirror"));
    ring_layer_free(r2.r);
    ring_mk(&r2, 2, 4, 3, 1, 0); /* reference capacity too small */
    rr2 = ring_ref(&r2);
    pd_err_clear(&e);
    ck_assert_int_eq(wire_import(&rr2, bytes, len, 0, 0, &e), PD_ERR_RANGE);
    ring_layer_free(r2.r);
    free(bytes);
    ring_layer_free(r.r);
    kv_layer_free(a.l);
}
END_TEST

START_TEST(wire_counts_near_uint32_max_are_refused_before_allocation)
{
    kvfix t;
    kv_mk(&t, 1, 1, KV_MODE_F32, NULL);
    bb b = {.n = 0};
    /* rows = UINT32_MAX with 1 x 1 geometry: the k count matches rows x
     * head_dim but the bytes are not there */
    bhdr(&b, WIRE_KIND_FULL, 0, UINT32_MAX);
    b32(&b, 0);
    b32(&b, UINT32_MAX);
    b32(&b, 1);
    b32(&b, 1);
    b32(&b, 0);
    b32(&b, UINT32_MAX); /* n_importance: one per row */
    kv_refused(&t, b.b, b.n, PD_ERR_TRUNCATED, "importance count 4294967295");
    /* n_linear near the limit */
    b.n = 0;
    bhdr(&b, WIRE_KIND_FULL, 0, 0);
    b32(&b, 0);
    b32(&b, 0);
    b32(&b, 1);
    b32(&b, 1);
    b32(&b, UINT32_MAX - 1);
    b32(&b, 0);
    kv_refused(&t, b.b, b.n, PD_ERR_TRUNCATED, "linear count 4294967294");
    /* n_importance neither 0 nor rows */
    b.n = 0;
    bhdr(&b, WIRE_KIND_FULL, 0, 0);
    b32(&b, 0);
    b32(&b, 5);
    b32(&b, 1);
    b32(&b, 1);
    b32(&b, 0);
    b32(&b, UINT32_MAX);
    kv_refused(&t, b.b, b.n, PD_ERR_FORMAT, "n_importance 4294967295, expected 5");
    /* a per-head length that is neither 0 nor rows x head_dim */
    b.n = 0;
    bhdr(&b, WIRE_KIND_FULL, 0, 2);
    b32(&b, 0);
    b32(&b, 2);
    b32(&b, 1);
    b32(&b, 1);
    b32(&b, 0);
    b32(&b, 2);
    bf(&b, 0.0f);
    bf(&b, 0.0f);
    b32(&b, 1);
    bf(&b, 1.0f);
    kv_refused(&t, b.b, b.n, PD_ERR_FORMAT, "head 0 k count 1 is neither 0 nor 2");
    /* UINT32_MAX kv heads */
    b.n = 0;
    bhdr(&b, WIRE_KIND_FULL, 0, 0);
    b32(&b, 0);
    b32(&b, 0);
    b32(&b, UINT32_MAX);
    b32(&b, 1);
    b32(&b, 0);
    b32(&b, 0);
    kv_refused(&t, b.b, b.n, PD_ERR_TRUNCATED, "kv_heads 4294967295");
    /* bounded ring whose size overflows 64 bits */
    b.n = 0;
    bhdr(&b, WIRE_KIND_BOUNDED, 0, UINT32_MAX);
    b32(&b, UINT32_MAX);
    b32(&b, UINT32_MAX);
    b32(&b, UINT32_MAX);
    b32(&b, UINT32_MAX);
    b32(&b, 0);
    ck_assert_int_eq(wire_inspect(b.b, b.n, 0, 0, NULL, NULL), PD_ERR_RANGE);
    b.n = 0;
    bhdr(&b, WIRE_KIND_RING, 0, 0);
    for (int i = 0; i < 3; i++)
        b32(&b, UINT32_MAX);
    b32(&b, 0);
    b32(&b, 0);
    b32(&b, 0);
    b64(&b, 0);
    b8(&b, 0);
    b8(&b, 0);
    b16(&b, 0);
    pd_err e = {0};
    ck_assert_int_eq(wire_inspect(b.b, b.n, 0, 0, NULL, &e), PD_ERR_TRUNCATED);
    ck_assert_ptr_nonnull(strstr(e.msg, "kv_heads 4294967295"));
    kv_layer_free(t.l);
}
END_TEST

START_TEST(wire_ring_cursor_faults_are_refused)
{
    /* 1 head x 1 channel, window 2, 1 reference row, 3 writes: len 2, pos 1 */
    bb good = {.n = 0};
    bhdr(&good, WIRE_KIND_RING, 0, 4);
    b32(&good, 1);
    b32(&good, 1);
    b32(&good, 2);
    b32(&good, 1);
    b32(&good, 2);
    b32(&good, 1);
    b64(&good, 3);
    b8(&good, 1);
    b8(&good, 0);
    b16(&good, 0);
    b32(&good, 1);
    bf(&good, 1);
    b32(&good, 1);
    bf(&good, 2);
    b32(&good, 2);
    bf(&good, 3);
    bf(&good, 4);
    b32(&good, 2);
    bf(&good, 5);
    bf(&good, 6);
    pd_err e = {0};
    ck_assert_msg(wire_inspect(good.b, good.n, 0, 0, NULL, &e) == PD_OK, "%s", e.msg);
    ringfix r;
    ring_mk(&r, 1, 1, 2, 4, 0);
    wire_layer_ref rr = ring_ref(&r);
    ck_assert_msg(wire_import(&rr, good.b, good.n, 0, 0, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(ring_layer_position(r.r), 4);
    size_t len = 0;
    uint8_t *again = export_ok(&rr, 0, &len);
    ck_assert_uint_eq(len, good.n);
    ck_assert_int_eq(memcmp(again, good.b, len), 0);
    free(again);
    struct {
        size_t off;
        uint8_t val;
        pd_status want;
        const char *needle;
    } cases[] = {
        {32 + 16, 3, PD_ERR_RANGE, "ring_len 3 exceeds window 2"},
        {32 + 20, 2, PD_ERR_RANGE, "ring_pos 2 outside window 2"},
        {32 + 20, 0, PD_ERR_FORMAT, "inconsistent with 3 writes"},
        {32 + 24, 4, PD_ERR_FORMAT, "inconsistent with 4 writes"},
        {32 + 32, 0, PD_ERR_FORMAT, "not sealed"},
        {32 + 32, 2, PD_ERR_FORMAT, "decoding 2 is not 0 or 1"},
        {32 + 33, 7, PD_ERR_FORMAT, "int8_mirror 7"},
        {32 + 34, 1, PD_ERR_FORMAT, "reserved"},
        {24, 5, PD_ERR_FORMAT, "header position 5"},
        {32 + 36, 2, PD_ERR_FORMAT, "head 0 ref k count 2, expected 1"},
        {32 + 12, 0, PD_ERR_FORMAT, "writes without a reference"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        bb c = good;
        c.b[cases[i].off] = cases[i].val;
        pd_err_clear(&e);
        uint64_t id = ring_layer_id(r.r);
        pd_status got = wire_import(&rr, c.b, c.n, 0, 0, &e);
        ck_assert_msg(got == cases[i].want, "case %zu: %s: %s", i, pd_status_str(got), e.msg);
        ck_assert_msg(strstr(e.msg, cases[i].needle) != NULL, "case %zu: '%s'", i, e.msg);
        ck_assert_uint_eq(ring_layer_id(r.r), id);
    }
    ring_layer_free(r.r);
}
END_TEST

START_TEST(wire_export_refuses_state_it_cannot_describe)
{
    pd_rng g = {.s = 14};
    kvfix a;
    kv_mk(&a, 1, 4, KV_MODE_F32, NULL);
    float k[4] = {1, 2, 3, 4}, q[8] = {1, 0, 0, 0, 0, 1, 0, 0}, out[8];
    pd_err e = {0};
    ck_assert_int_eq(kv_layer_append(a.l, k, k, &e), PD_OK);
    kv_attend at = {.kv_head = 0, .n_q = 2, .q = q, .track_imp = 1, .out = out};
    ck_assert_int_eq(kv_layer_attend(a.l, &at, NULL, &e), PD_OK);
    wire_layer_ref ra = kv_ref(&a);
    size_t size = 0;
    /* importance still pending (not confirmed) */
    ck_assert_int_eq(wire_record_size(&ra, 0, &size, &e), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.msg, "confirm"));
    kv_layer_confirm(a.l, kv_layer_pos_len(a.l));
    pd_err_clear(&e);
    ck_assert_int_eq(wire_record_size(&ra, 0, &size, &e), PD_OK);
    /* a linear record cannot carry rows */
    ra.linear = 1;
    ck_assert_int_eq(wire_record_size(&ra, 0, &size, &e), PD_ERR_REFUSED);
    ra.linear = 0;
    /* a bounded ring alongside rows */
    pd_err_clear(&e);
    ck_assert_int_eq(kv_layer_install_bounded(a.l, 2, &e), PD_OK);
    ck_assert_int_eq(wire_record_size(&ra, 0, &size, &e), PD_ERR_REFUSED);
    ck_assert_ptr_nonnull(strstr(e.msg, "bounded"));
    /* bad refs */
    wire_layer_ref none = {0};
    ck_assert_int_eq(wire_record_size(&none, 0, &size, NULL), PD_ERR_ARG);
    (void)g;
    kv_layer_free(a.l);
}
END_TEST

START_TEST(wire_two_phase_import_changes_nothing_until_commit)
{
    pd_rng g = {.s = 15};
    kvfix a, t;
    kv_mk(&a, 2, 4, KV_MODE_F32, NULL);
    kv_fill(&a, 4, &g, 0);
    kv_mk(&t, 2, 4, KV_MODE_F32, NULL);
    size_t len = 0;
    wire_layer_ref ra = kv_ref(&a), rt = kv_ref(&t);
    uint8_t *bytes = export_ok(&ra, 0, &len);
    wire_pending *p = NULL;
    pd_err e = {0};
    tsnap s = kv_snap(&t);
    ck_assert_msg(wire_import_prepare(&rt, bytes, len, 0, 0, &p, &e) == PD_OK, "%s", e.msg);
    kv_unchanged(&t, &s);
    wire_pending_free(p); /* abandoned: still unchanged */
    kv_unchanged(&t, &s);
    ck_assert_msg(wire_import_prepare(&rt, bytes, len, 0, 0, &p, &e) == PD_OK, "%s", e.msg);
    wire_import_commit(p);
    ck_assert_uint_eq(kv_layer_rows(t.l), 4);
    wire_pending_free(NULL);
    free(s.bytes);
    free(bytes);
    kv_layer_free(a.l);
    kv_layer_free(t.l);
}
END_TEST

START_TEST(wire_messages_name_absolute_offsets_inside_an_enclosing_file)
{
    bb b = {.n = 0};
    bhdr(&b, WIRE_KIND_FULL, 0, 0);
    b32(&b, 0);
    pd_err e = {0};
    ck_assert_int_eq(wire_inspect(b.b, b.n, 0, 1000, NULL, &e), PD_ERR_TRUNCATED);
    ck_assert_str_eq(e.msg, "wire: offset 1036: rows needs 4 bytes, 0 remain");
    pd_err_clear(&e);
    b.b[4] = 3;
    ck_assert_int_eq(wire_header_decode(b.b, b.n, 52, NULL, &e), PD_ERR_VERSION);
    ck_assert_str_eq(e.msg, "wire: offset 56: wire version 3, this build reads version 2");
    ck_assert_str_eq(wire_kind_name(WIRE_KIND_Q8), "q8");
    ck_assert_str_eq(wire_kind_name(99), "unknown");
}
END_TEST

START_TEST(wire_non_finite_values_are_refused_on_import_and_inspect)
{
    const uint8_t alive[2] = {1, 0};
    kvfix t;
    kv_mk(&t, 2, 2, KV_MODE_F32, alive);
    /* f32 K value 1 of head 0 (record offset 32 + 24 + 12 + 4 + 4) is NaN */
    bb gold = {.n = 0};
    bhdr(&gold, WIRE_KIND_FULL, 0, 2);
    golden_full_body(&gold, 0);
    bb c = gold;
    memcpy(c.b + 76, &(float){__builtin_nanf("")}, 4);
    kv_refused(&t, c.b, c.n, PD_ERR_FORMAT, "offset 76: head 0 k value 1 is not finite");
    c = gold;
    memcpy(c.b + 60, &(float){__builtin_inff()}, 4); /* importance row 0 */
    kv_refused(&t, c.b, c.n, PD_ERR_FORMAT, "offset 60: importance value 0 is not finite");
    /* f16 infinity in V */
    bb h = {.n = 0};
    bhdr(&h, WIRE_KIND_FULL, 1, 2);
    golden_full_body(&h, 1);
    h.b[32 + 24 + 12 + 4 + 8 + 4 + 2] = 0x00;
    h.b[32 + 24 + 12 + 4 + 8 + 4 + 3] = 0x7c;
    kv_refused(&t, h.b, h.n, PD_ERR_FORMAT, "head 0 v value 1 is not finite");
    kv_layer_free(t.l);
    /* inspect (no target) refuses the same records with the same message:
     * what it calls valid, import installs */
    pd_err ie = {0};
    ck_assert_int_eq(wire_inspect(gold.b, gold.n, 0, 0, NULL, &ie), PD_OK);
    c = gold;
    memcpy(c.b + 76, &(float){__builtin_nanf("")}, 4);
    ck_assert_int_eq(wire_inspect(c.b, c.n, 0, 0, NULL, &ie), PD_ERR_FORMAT);
    ck_assert_str_eq(ie.msg, "wire: offset 76: head 0 k value 1 is not finite (nan)");
    c = gold;
    memcpy(c.b + 60, &(float){-__builtin_inff()}, 4);
    pd_err_clear(&ie);
    ck_assert_int_eq(wire_inspect(c.b, c.n, 0, 1000, NULL, &ie), PD_ERR_FORMAT);
    ck_assert_str_eq(ie.msg, "wire: offset 1060: importance value 0 is not finite (-inf)");
    pd_err_clear(&ie);
    ck_assert_int_eq(wire_inspect(h.b, h.n, 0, 0, NULL, &ie), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(ie.msg, "head 0 v value 1 is not finite (inf)"));
    /* a ring record with a NaN row and the int8 mirror on (fuzzer finding:
     * the mirror's quantization of NaN was undefined behaviour) */
    bb r = {.n = 0};
    bhdr(&r, WIRE_KIND_RING, 0, 1);
    b32(&r, 1);
    b32(&r, 1);
    b32(&r, 2);
    b32(&r, 1);
    b32(&r, 0);
    b32(&r, 0);
    b64(&r, 0);
    b8(&r, 0);
    b8(&r, 1);
    b16(&r, 0);
    b32(&r, 1);
    bf(&r, __builtin_nanf(""));
    b32(&r, 1);
    bf(&r, 1.0f);
    b32(&r, 0);
    b32(&r, 0);
    ringfix rf;
    ring_mk(&rf, 1, 1, 2, 2, 1);
    wire_layer_ref rr = ring_ref(&rf);
    pd_err e = {0};
    uint64_t id = ring_layer_id(rf.r);
    ck_assert_int_eq(wire_import(&rr, r.b, r.n, 0, 0, &e), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "head 0 ref k value 0 is not finite"));
    ck_assert_uint_eq(ring_layer_id(rf.r), id);
    pd_err_clear(&e);
    ck_assert_int_eq(wire_inspect(r.b, r.n, 0, 0, NULL, &e), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "head 0 ref k value 0 is not finite"));
    ring_layer_free(rf.r);
}
END_TEST

START_TEST(wire_f16_export_refuses_values_beyond_half_range)
{
    kvfix a, b;
    kv_mk(&a, 1, 2, KV_MODE_F32, NULL);
    kv_mk(&b, 1, 2, KV_MODE_F32, NULL);
    const float k[2] = {1.0e5f, 1.0f}, v[2] = {2.0f, 3.0f};
    pd_err e = {0};
    ck_assert_int_eq(kv_layer_append(a.l, k, v, &e), PD_OK);
    wire_layer_ref ra = kv_ref(&a), rb = kv_ref(&b);
    uint8_t *out = NULL;
    size_t len = 0;
    ck_assert_int_eq(wire_export(&ra, 1, &out, &len, &e), PD_ERR_RANGE);
    ck_assert_ptr_null(out);
    ck_assert_ptr_nonnull(strstr(e.msg, "does not fit f16"));
    /* f32 carries it, and it arrives */
    out = export_ok(&ra, 0, &len);
    pd_err_clear(&e);
    ck_assert_msg(wire_import(&rb, out, len, 0, 0, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(kv_layer_rows(b.l), 1);
    free(out);
    kv_layer_free(a.l);
    kv_layer_free(b.l);
}
END_TEST

/* Found by fuzz_wire (scripts/fuzz.sh 150): a version-2 full record of 2
 * rows with no importance values (and a 3-value linear section) was
 * installed with zero importance and exported 8 bytes longer. Every
 * section is now installed as given or refused: a v2 record carries one
 * importance value per row, and inspect agrees. */
START_TEST(wire_v2_record_without_importance_for_its_rows_is_refused_at_the_field)
{
    static const char hex[] = "434d4653020000008877665544332211030000000001000002000000000000000100000002000000"
                              "010000000200000003000000000000000100403f0000c03f0000003f04000000003c00c0003834"
                              "00040000004400000032000000";
    uint8_t rec[92];
    for (size_t i = 0; i < sizeof rec; i++)
        sscanf(hex + 2 * i, "%2hhx", &rec[i]);
    wire_info in;
    pd_err e = {0};
    ck_assert_int_eq(wire_inspect(rec, sizeof rec, 0, 0, &in, &e), PD_ERR_FORMAT);
    ck_assert_str_eq(e.msg, "wire: offset 52: n_importance 0, expected 2");
    kvfix t;
    kv_mk(&t, 1, 2, KV_MODE_F32, NULL);
    wire_layer_ref r = kv_ref(&t);
    r.identity = 0x1122334455667788ull;
    r.layer = 3;
    tsnap sn = kv_snap(&t);
    pd_err_clear(&e);
    ck_assert_int_eq(wire_import(&r, rec, sizeof rec, 0, 0, &e), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(e.msg, "offset 52"));
    kv_unchanged(&t, &sn);
    free(sn.bytes);
    /* with its two importance values it installs and exports byte for byte */
    uint8_t fixed[100];
    memcpy(fixed, rec, 52);
    fixed[52] = 2;
    memset(fixed + 53, 0, 3);
    memcpy(fixed + 56, rec + 56, 12);       /* the linear section */
    const float imp[2] = {0.25f, 0.5f};
    memcpy(fixed + 68, imp, 8);
    memcpy(fixed + 76, rec + 68, 24);       /* the heads */
    pd_err_clear(&e);
    ck_assert_msg(wire_import(&r, fixed, sizeof fixed, 0, 0, &e) == PD_OK, "%s", e.msg);
    size_t n = 0;
    uint8_t *again = export_ok(&r, 1, &n);
    ck_assert_uint_eq(n, sizeof fixed);
    ck_assert_int_eq(memcmp(again, fixed, n), 0);
    free(again);
    kv_layer_free(t.l);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("wire");
    TCase *ring = tcase_create("ring");
    tcase_set_timeout(ring, 60);
    tcase_add_test(ring, wire_identity_is_stable_and_separates_inputs);
    tcase_add_loop_test(ring, wire_ring_round_trips_at_every_fill_level, 0, 5 * 2 * 4);
    tcase_add_test(ring, wire_empty_ring_layer_round_trips);
    tcase_add_test(ring, wire_ring_export_ignores_pending_drafts);
    tcase_add_test(ring, wire_golden_ring_q8_record_decodes_and_reencodes);
    tcase_add_test(ring, wire_ring_q8_faults_are_refused_without_change);
    tcase_add_test(ring, wire_ring_cursor_faults_are_refused);
    tcase_add_test(ring, wire_messages_name_absolute_offsets_inside_an_enclosing_file);
    suite_add_tcase(s, ring);
    TCase *kv = tcase_create("kv");
    tcase_set_timeout(kv, 60);
    tcase_add_loop_test(kv, wire_kv_round_trip_answers_bit_identically, 0, PD_COUNT(kv_trips));
    tcase_add_test(kv, wire_import_into_a_spare_swaps_it_with_the_target);
    tcase_add_test(kv, wire_full_with_dead_heads_round_trips);
    tcase_add_test(kv, wire_full_f16_round_trips_exactly_on_representable_values);
    tcase_add_test(kv, wire_full_f16_rounds_other_values_to_nearest_half);
    tcase_add_test(kv, wire_full_tail_round_trips_and_untrimmed_is_plain_full);
    tcase_add_loop_test(kv, wire_q8_round_trips_every_mode_frozen_or_not, 0, PD_COUNT(q8_modes) * 2 * 2);
    tcase_add_test(kv, wire_linear_round_trips_vector_and_depth);
    tcase_add_test(kv, wire_bounded_round_trips_f32_and_f16);
    tcase_add_test(kv, wire_golden_full_records_decode_and_reencode_byte_for_byte);
    tcase_add_test(kv, wire_golden_full_tail_record_decodes_and_reencodes);
    tcase_add_test(kv, wire_golden_linear_record_decodes_and_reencodes);
    tcase_add_test(kv, wire_golden_bounded_record_decodes_and_reencodes);
    tcase_add_test(kv, wire_legacy_body_is_read_only_when_allowed);
    tcase_add_test(kv, wire_truncation_at_every_offset_is_refused_without_change);
    tcase_add_test(kv, wire_header_faults_are_refused_with_their_offset);
    tcase_add_test(kv, wire_geometry_and_kind_mismatches_are_refused);
    tcase_add_test(kv, wire_counts_near_uint32_max_are_refused_before_allocation);
    tcase_add_test(kv, wire_v2_record_without_importance_for_its_rows_is_refused_at_the_field);
    tcase_add_test(kv, wire_export_refuses_state_it_cannot_describe);
    tcase_add_test(kv, wire_two_phase_import_changes_nothing_until_commit);
    tcase_add_test(kv, wire_non_finite_values_are_refused_on_import_and_inspect);
    tcase_add_test(kv, wire_f16_export_refuses_values_beyond_half_range);
    suite_add_tcase(s, kv);
    return s;
}
