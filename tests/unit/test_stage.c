/* Tests for cluster/stage.h: the design invariant at stage level (a stream's
 * hidden states never depend on how its rows are split into micro-batches,
 * which other streams' rows share them, or the thread count), position-driven
 * rollback of verify rows leaving every cache byte as if the drafts were never
 * seen, the importance-eviction sink clamp, the export / settle API, the
 * refusals of bad micro-batches, and layers moving between running stages
 * (add / remove at either end, export + import) without changing a bit.
 *
 * Every input row is a pure function of (stream, position, salt), so two
 * schedules feed the same bits and their outputs compare with memcmp. Cache
 * state is compared through stage_export_layer (CMFS bytes of every layer).
 * The eviction test also builds a kv_layer from a record (comm/wire.h,
 * cache/kv_layer.h) to apply the cache library's own eviction rule. */
#define _XOPEN_SOURCE 700
#include "pd_test.h"

#include "cache/kv_layer.h"
#include "cluster/cli/mkmodel.h"
#include "cluster/model/model.h"
#include "cluster/runtime/plan/policy.h"
#include "cluster/model/pool.h"
#include "cluster/runtime/pipeline/stage.h"
#include "comm/wire.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- fixture: one tiny model (3 layers), loaded whole and as layers [1, 3) */

enum { N_LAYERS = 3 };
static char model_path[64];
static model *mdl;      /* every layer */
static model *mdl_tail; /* layers [1, 3): a stage that does not start at 0 */
static uint32_t H;

static void fixture_setup(void)
{
    strcpy(model_path, "/tmp/pd_test_stage_XXXXXX");
    int fd = mkstemp(model_path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    mkmodel_opts o;
    mkmodel_defaults(&o);
    o.layers = N_LAYERS;
    o.hidden = 64;
    o.heads = 4;
    o.kv_heads = 2;
    o.ffn = 96;
    o.vocab = 300; /* mkmodel's minimum; the stage never reads the vocabulary */
    o.seed = 17;
    pd_err e = {0};
    ck_assert_msg(mkmodel_write(&o, model_path, &e) == PD_OK, "%s", e.msg);
    model_load_opts all = {.all_layers = 1};
    ck_assert_msg(model_load(model_path, &all, &mdl, &e) == PD_OK, "%s", e.msg);
    model_load_opts tail = {.first_layer = 1, .n_layers = 2};
    ck_assert_msg(model_load(model_path, &tail, &mdl_tail, &e) == PD_OK, "%s", e.msg);
    H = model_hp(mdl)->hidden;
}

static void fixture_teardown(void)
{
    model_free(mdl);
    model_free(mdl_tail);
    mdl = mdl_tail = NULL;
    unlink(model_path);
}

/* ---- helpers ------------------------------------------------------------- */

static cache_policy policy_of(const char *attn, const char *kv, const char *evict, uint32_t drafts)
{
    cache_policy p;
    policy_default(&p);
    pd_err e = {0};
    ck_assert_msg(policy_parse_attn(attn, &p, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(policy_parse_kv(kv, &p, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(policy_parse_evict(evict, &p, &e) == PD_OK, "%s", e.msg);
    p.max_drafts = drafts;
    return p;
}

static const char *policy_name(const cache_policy *p)
{
    static char buf[4][128];
    static int next;
    char *b = buf[next++ & 3];
    policy_describe(p, b, sizeof buf[0]);
    return b;
}

static stage *stage_make(const model *m, const cache_policy *p, pool *pl, uint32_t max_rows,
                         uint32_t max_streams)
{
    stage_config c = {.m = m, .policy = *p, .max_rows = max_rows, .max_streams = max_streams, .pool = pl};
    stage *s = NULL;
    pd_err e = {0};
    ck_assert_msg(stage_new(&c, &s, &e) == PD_OK, "%s", e.msg);
    return s;
}

static void admit(stage *s, uint64_t id, uint32_t prefill, uint32_t max_new)
{
    mb_admit a = {.stream = id, .prefill_rows = prefill, .max_new = max_new};
    pd_err e = {0};
    ck_assert_msg(stage_admit(s, &a, &e) == PD_OK, "%s", e.msg);
}

/* The input hidden row of (stream, pos); salt != 0 gives another token's row
 * (a draft that will be rejected). */
static void row_input(uint64_t stream, uint64_t pos, uint32_t salt, float *x)
{
    pd_rng r = {.s = stream * 0x100000001b3ull + pos * 0x9e3779b97f4a7c15ull + salt * 0xbf58476d1ce4e5b9ull};
    pd_rng_fill(&r, x, H, -1.0f, 1.0f);
}

/* A micro-batch under construction: rows, their salts, the output. */
enum { MB_MAX = 192 };
typedef struct mbatch {
    mb_row rows[MB_MAX];
    uint32_t salt[MB_MAX];
    uint32_t n;
    float *x; /* [n x H] after mb_forward: the stage's output */
} mbatch;

static void mb_add(mbatch *b, uint64_t stream, uint64_t pos, uint32_t n, mb_role role, uint32_t salt)
{
    for (uint32_t i = 0; i < n; i++) {
        ck_assert_uint_lt(b->n, MB_MAX);
        b->rows[b->n] = (mb_row){.stream = stream, .pos = pos + i, .role = (uint8_t)role};
        b->salt[b->n++] = salt;
    }
}

static void mb_fill_inputs(mbatch *b)
{
    free(b->x);
    b->x = malloc((size_t)(b->n ? b->n : 1) * H * sizeof(float));
    ck_assert_ptr_nonnull(b->x);
    for (uint32_t i = 0; i < b->n; i++)
        row_input(b->rows[i].stream, b->rows[i].pos, b->salt[i], b->x + (size_t)i * H);
}

static void mb_forward(stage *s, mbatch *b)
{
    mb_fill_inputs(b);
    pd_err e = {0};
    ck_assert_msg(stage_forward(s, b->rows, b->n, b->x, &e) == PD_OK, "%s", e.msg);
}

static void mb_clear(mbatch *b)
{
    free(b->x);
    memset(b, 0, sizeof *b);
}

/* The output row of (stream, pos) in b, or NULL. */
static const float *mb_out(const mbatch *b, uint64_t stream, uint64_t pos)
{
    for (uint32_t i = 0; i < b->n; i++)
        if (b->rows[i].stream == stream && b->rows[i].pos == pos)
            return b->x + (size_t)i * H;
    return NULL;
}

/* Forwards one micro-batch of a single group and returns the output of its
 * last row in out [H]. */
static void forward_rows(stage *s, uint64_t stream, uint64_t pos, uint32_t n, mb_role role, uint32_t salt,
                         float *out)
{
    mbatch b = {0};
    mb_add(&b, stream, pos, n, role, salt);
    mb_forward(s, &b);
    if (out)
        memcpy(out, b.x + (size_t)(n - 1) * H, H * sizeof(float));
    mb_clear(&b);
}

static void assert_rows_equal(const float *got, const float *want, const char *what, uint64_t stream,
                              uint64_t pos)
{
    ck_assert_ptr_nonnull(got);
    ck_assert_ptr_nonnull(want);
    for (uint32_t c = 0; c < H; c++)
        if (memcmp(&got[c], &want[c], sizeof(float)) != 0)
            ck_abort_msg("%s: stream %llu position %llu: hidden[%u] = %.9g, want %.9g (first difference)",
                         what, (unsigned long long)stream, (unsigned long long)pos, c, (double)got[c],
                         (double)want[c]);
}

/* Every layer's record of a stream, concatenated (each prefixed by its
 * length), so one memcmp compares every cache byte of the stream. */
typedef struct snap {
    uint8_t *bytes;
    size_t len;
} snap;

static snap snap_take(const stage *s, const model *m, uint64_t stream)
{
    snap sn = {0};
    for (uint32_t l = model_first_layer(m); l < model_first_layer(m) + model_layer_count(m); l++) {
        uint8_t *rec = NULL;
        size_t n = 0;
        pd_err e = {0};
        ck_assert_msg(stage_export_layer(s, stream, l, &rec, &n, &e) == PD_OK, "layer %u: %s", l, e.msg);
        sn.bytes = realloc(sn.bytes, sn.len + sizeof n + n);
        ck_assert_ptr_nonnull(sn.bytes);
        memcpy(sn.bytes + sn.len, &n, sizeof n);
        memcpy(sn.bytes + sn.len + sizeof n, rec, n);
        sn.len += sizeof n + n;
        free(rec);
    }
    return sn;
}

static void snap_assert_equal(const snap *a, const snap *b, const char *what)
{
    if (a->len == b->len && memcmp(a->bytes, b->bytes, a->len) == 0)
        return;
    size_t i = 0;
    while (i < a->len && i < b->len && a->bytes[i] == b->bytes[i])
        i++;
    ck_abort_msg("%s: cache records differ (%zu vs %zu bytes, first difference at byte %zu)", what, a->len,
                 b->len, i);
}

static void snap_free(snap *s)
{
    free(s->bytes);
    s->bytes = NULL;
}

static void settle(stage *s, uint64_t stream, uint64_t pos)
{
    pd_err e = {0};
    ck_assert_msg(stage_settle(s, stream, pos, &e) == PD_OK, "%s", e.msg);
}

/* ---- a: splitting, mixing and threads give identical hidden states -------- */

/* Three streams: prefill 70 (q8: the field freezes inside a prefill chunk),
 * 58 (the freeze happens while decoding), 5 (importance: eviction starts
 * late). */
enum { N_SPLIT_STREAMS = 3, SPLIT_POS_MAX = 96 };
static const struct {
    uint64_t id;
    uint32_t prefill, total;
} split_streams[N_SPLIT_STREAMS] = {{101, 70, 84}, {202, 58, 76}, {303, 5, 25}};

/* out[stream index][pos] rows of hidden, written once each */
typedef struct outs {
    float *h;
    uint8_t have[N_SPLIT_STREAMS][SPLIT_POS_MAX];
} outs;

static float *outs_row(outs *o, uint32_t si, uint64_t pos)
{
    ck_assert_uint_lt(pos, SPLIT_POS_MAX);
    return o->h + ((size_t)si * SPLIT_POS_MAX + pos) * H;
}

static void outs_init(outs *o)
{
    memset(o, 0, sizeof *o);
    o->h = calloc((size_t)N_SPLIT_STREAMS * SPLIT_POS_MAX * H, sizeof(float));
    ck_assert_ptr_nonnull(o->h);
}

static void outs_record(outs *o, const mbatch *b)
{
    for (uint32_t i = 0; i < b->n; i++)
        for (uint32_t si = 0; si < N_SPLIT_STREAMS; si++)
            if (b->rows[i].stream == split_streams[si].id) {
                memcpy(outs_row(o, si, b->rows[i].pos), b->x + (size_t)i * H, H * sizeof(float));
                o->have[si][b->rows[i].pos] = 1;
            }
}

static mb_role role_at(uint32_t si, uint64_t pos)
{
    return pos < split_streams[si].prefill ? MB_ROLE_PREFILL : MB_ROLE_DECODE;
}

/* The reference: each stream alone on its own stage, the whole prefill in one
 * micro-batch, then one decode row per micro-batch, one thread. Also leaves
 * each stream's settled cache records in ref_snap. */
static void run_alone(const cache_policy *p, outs *o, snap ref_snap[N_SPLIT_STREAMS])
{
    for (uint32_t si = 0; si < N_SPLIT_STREAMS; si++) {
        stage *s = stage_make(mdl, p, NULL, 160, 1);
        admit(s, split_streams[si].id, split_streams[si].prefill, 64);
        mbatch b = {0};
        mb_add(&b, split_streams[si].id, 0, split_streams[si].prefill, MB_ROLE_PREFILL, 0);
        mb_forward(s, &b);
        outs_record(o, &b);
        mb_clear(&b);
        for (uint32_t pos = split_streams[si].prefill; pos < split_streams[si].total; pos++) {
            mb_add(&b, split_streams[si].id, pos, 1, MB_ROLE_DECODE, 0);
            mb_forward(s, &b);
            outs_record(o, &b);
            mb_clear(&b);
        }
        settle(s, split_streams[si].id, split_streams[si].total);
        ref_snap[si] = snap_take(s, mdl, split_streams[si].id);
        stage_free(s);
    }
}

/* Eviction runs once per micro-batch per stream, before the group's rows are
 * appended, and keeps budget - (rows in the group): a group of several decode
 * or verify rows sees a smaller cache than the same rows one per micro-batch
 * (importance:12:3 and recent:10 with [decode, 4 verify] differ from 5
 * sequential steps from layer 0 on, the decode row included). That is a
 * known divergence, not tested here: under eviction a stream gets one decode
 * row per micro-batch (what the scheduler sends today) and everything else
 * varies. */

/* All three streams on one stage. seed 0: every micro-batch carries every
 * unfinished stream with as many rows as it may take; other seeds: random
 * stream order, random subsets, random chunk sizes. A stream's group may run
 * from prefill into decode rows and carry up to 3 decode rows, except under
 * eviction (above). */
static void run_mixed(const cache_policy *p, uint32_t threads, uint64_t seed, outs *o,
                      snap got_snap[N_SPLIT_STREAMS])
{
    pool *pl = NULL;
    pd_err e = {0};
    if (threads > 1)
        ck_assert_msg(pool_new(threads, &pl, &e) == PD_OK, "%s", e.msg);
    const uint32_t max_rows = 160;
    stage *s = stage_make(mdl, p, pl, max_rows, N_SPLIT_STREAMS);
    /* admission order differs from the reference's too */
    for (uint32_t k = 0; k < N_SPLIT_STREAMS; k++) {
        uint32_t si = (uint32_t)((k + seed) % N_SPLIT_STREAMS);
        admit(s, split_streams[si].id, split_streams[si].prefill, 64);
    }
    const int evicting = p->evict != POLICY_EVICT_NONE;
    uint64_t next[N_SPLIT_STREAMS] = {0};
    pd_rng r = {.s = seed * 7 + 1};
    for (;;) {
        uint32_t order[N_SPLIT_STREAMS], n_open = 0;
        for (uint32_t si = 0; si < N_SPLIT_STREAMS; si++)
            if (next[si] < split_streams[si].total)
                order[n_open++] = si;
        if (n_open == 0)
            break;
        for (uint32_t i = n_open; i > 1; i--) { /* shuffle */
            uint32_t j = pd_rng_below(&r, i), t = order[i - 1];
            order[i - 1] = order[j];
            order[j] = t;
        }
        uint32_t take_streams = seed == 0 ? n_open : 1 + pd_rng_below(&r, n_open);
        mbatch b = {0};
        for (uint32_t k = 0; k < take_streams; k++) {
            uint32_t si = order[k];
            uint64_t pos = next[si];
            uint32_t pre = split_streams[si].prefill;
            uint32_t room = max_rows - b.n;
            uint32_t n;
            if (pos < pre) {
                uint32_t left = pre - (uint32_t)pos;
                n = seed == 0 ? left : 1 + pd_rng_below(&r, left);
                if (!evicting && n == left && pd_rng_below(&r, 2))
                    n += 1 + pd_rng_below(&r, 2); /* run on into decode rows */
            } else {
                n = evicting ? 1 : (seed == 0 ? 3 : 1 + pd_rng_below(&r, 3));
            }
            if (n > split_streams[si].total - pos)
                n = split_streams[si].total - (uint32_t)pos;
            if (n > room)
                n = room;
            if (n == 0)
                continue;
            for (uint32_t j = 0; j < n; j++)
                mb_add(&b, split_streams[si].id, pos + j, 1, role_at(si, pos + j), 0);
            next[si] += n;
        }
        mb_forward(s, &b);
        outs_record(o, &b);
        mb_clear(&b);
    }
    for (uint32_t si = 0; si < N_SPLIT_STREAMS; si++) {
        settle(s, split_streams[si].id, split_streams[si].total);
        got_snap[si] = snap_take(s, mdl, split_streams[si].id);
    }
    stage_free(s);
    pool_free(pl);
}

START_TEST(stage_rows_split_or_mixed_give_identical_hidden)
{
    const cache_policy pols[] = {
        policy_of("full", "f32", "none", 0),
        policy_of("full", "q8", "none", 0),
        policy_of("window:8", "f32", "none", 0),
        policy_of("rswa:6", "f32", "none", 0),
        policy_of("full", "f32", "importance:12:3", 0),
        policy_of("full", "q8", "recent:10", 0),
    };
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0]; pi++) {
        const cache_policy *p = &pols[pi];
        outs ref;
        outs_init(&ref);
        snap ref_snap[N_SPLIT_STREAMS];
        run_alone(p, &ref, ref_snap);
        for (uint32_t threads = 1; threads <= 2; threads++)
            for (uint64_t seed = 0; seed < 4; seed++) {
                outs got;
                outs_init(&got);
                snap got_snap[N_SPLIT_STREAMS];
                run_mixed(p, threads, seed, &got, got_snap);
                char what[200];
                snprintf(what, sizeof what, "%s, %u thread(s), schedule %llu", policy_name(p), threads,
                         (unsigned long long)seed);
                for (uint32_t si = 0; si < N_SPLIT_STREAMS; si++) {
                    for (uint32_t pos = 0; pos < split_streams[si].total; pos++) {
                        ck_assert_msg(got.have[si][pos] && ref.have[si][pos], "%s: row missing", what);
                        assert_rows_equal(outs_row(&got, si, pos), outs_row(&ref, si, pos), what,
                                          split_streams[si].id, pos);
                    }
                    /* the window's trim point follows group boundaries (it only
                     * drops rows no query sees), so its records may differ */
                    if (p->attn != POLICY_ATTN_WINDOW)
                        snap_assert_equal(&got_snap[si], &ref_snap[si], what);
                    snap_free(&got_snap[si]);
                }
                free(got.h);
            }
        for (uint32_t si = 0; si < N_SPLIT_STREAMS; si++)
            snap_free(&ref_snap[si]);
        free(ref.h);
    }
}
END_TEST

/* ---- b: verify rows rolled back leave no trace ------------------------------ */

enum { RB_DRAFTS = 4 };
static const uint64_t RB_T = 7, RB_C = 9; /* the drafting stream, a companion */

typedef struct rb_case {
    cache_policy pol;
    uint32_t prefill; /* of T */
    uint32_t p;       /* T's decode row that carries the drafts */
} rb_case;

/* Whether layer 0 of a q8 stream has frozen its per-channel field. */
static int layer0_frozen(const stage *s, uint64_t stream)
{
    uint8_t *rec = NULL;
    size_t len = 0;
    pd_err e = {0};
    ck_assert_msg(stage_export_layer(s, stream, 0, &rec, &len, &e) == PD_OK, "%s", e.msg);
    wire_info wi;
    ck_assert_msg(wire_inspect(rec, len, 0, 0, &wi, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(wi.kind, WIRE_KIND_Q8);
    free(rec);
    return wi.frozen;
}

/* Both stages get the same history up to T's decode row p - 1 (C rides along
 * in the same micro-batches). Then D sees [T decode p, T verify p+1..p+4, C]
 * where the first `accepted` drafts carry the true rows and the rest other
 * tokens' rows (accepted = -1: the decode row p itself is replaced too), and
 * N sees the sequential history without drafts. The next micro-batch starts
 * where the accepted prefix ends: nxt = p + 1 + accepted. */
static void rollback_case(const rb_case *c, int accepted)
{
    const cache_policy *p = &c->pol;
    const int imp = p->evict == POLICY_EVICT_IMPORTANCE;
    char what[200];
    snprintf(what, sizeof what, "%s, %d of %d drafts accepted", policy_name(p), accepted, RB_DRAFTS);
    pool *pl = NULL;
    pd_err e = {0};
    ck_assert_int_eq(pool_new(2, &pl, &e), PD_OK);
    stage *D = stage_make(mdl, p, pl, 80, 2), *N = stage_make(mdl, p, NULL, 80, 2);
    const uint32_t c_prefill = 6;
    uint64_t cpos = 0;
    for (int k = 0; k < 2; k++) {
        stage *s = k ? N : D;
        admit(s, RB_T, c->prefill, 40);
        admit(s, RB_C, c_prefill, 40);
        mbatch b = {0};
        mb_add(&b, RB_T, 0, c->prefill, MB_ROLE_PREFILL, 0);
        mb_add(&b, RB_C, 0, c_prefill, MB_ROLE_PREFILL, 0);
        mb_forward(s, &b);
        mb_clear(&b);
        cpos = c_prefill;
        for (uint64_t pos = c->prefill; pos < c->p; pos++) {
            mb_add(&b, RB_C, cpos++, 1, MB_ROLE_DECODE, 0);
            mb_add(&b, RB_T, pos, 1, MB_ROLE_DECODE, 0);
            mb_forward(s, &b);
            mb_clear(&b);
        }
    }
    /* D: the decode row and its drafts */
    mbatch d = {0};
    mb_add(&d, RB_T, c->p, 1, MB_ROLE_DECODE, accepted < 0 ? 99 : 0);
    for (int i = 0; i < RB_DRAFTS; i++)
        mb_add(&d, RB_T, c->p + 1 + (uint64_t)i, 1, MB_ROLE_VERIFY, i < accepted ? 0 : 100 + (uint32_t)i);
    mb_add(&d, RB_C, cpos, 1, MB_ROLE_DECODE, 0);
    mb_forward(D, &d);
    const int q8 = !imp && p->attn == POLICY_ATTN_FULL && p->kv != KV_MODE_F32;
    if (q8) /* the drafts reach row 64: the field froze (the test's point) */
        ck_assert_int_eq(layer0_frozen(D, RB_T), c->p + RB_DRAFTS >= 64);
    if (imp) {
        /* the drafts' importance is pending: no record of it may leave */
        uint8_t *rec = NULL;
        size_t len = 0;
        ck_assert_int_eq(stage_export_layer(D, RB_T, 0, &rec, &len, &e), PD_ERR_REFUSED);
        ck_assert_ptr_null(rec);
        ck_assert_msg(strstr(e.msg, "stage_settle") != NULL, "%s", e.msg);
    }
    /* N: the same rows without drafts, the accepted ones as sequential steps */
    mbatch nb = {0};
    if (accepted >= 0)
        mb_add(&nb, RB_T, c->p, 1, MB_ROLE_DECODE, 0);
    mb_add(&nb, RB_C, cpos, 1, MB_ROLE_DECODE, 0);
    mb_forward(N, &nb);
    if (accepted >= 0)
        assert_rows_equal(mb_out(&d, RB_T, c->p), mb_out(&nb, RB_T, c->p), what, RB_T, c->p);
    assert_rows_equal(mb_out(&d, RB_C, cpos), mb_out(&nb, RB_C, cpos), what, RB_C, cpos);
    for (int i = 0; i < accepted; i++) {
        float h[256];
        uint64_t pos = c->p + 1 + (uint64_t)i;
        forward_rows(N, RB_T, pos, 1, MB_ROLE_DECODE, 0, h);
        /* batched verify is bit-exact to the sequential step */
        assert_rows_equal(mb_out(&d, RB_T, pos), h, what, RB_T, pos);
    }
    mb_clear(&d);
    mb_clear(&nb);
    cpos++;

    /* the next micro-batch starts at nxt: D rolls back (or commits) first */
    const uint64_t nxt = c->p + 1 + (uint64_t)(accepted < 0 ? -1 : accepted);
    mbatch after[2];
    memset(after, 0, sizeof after);
    for (int k = 0; k < 2; k++) {
        mb_add(&after[k], RB_C, cpos, 1, MB_ROLE_DECODE, 0);
        mb_add(&after[k], RB_T, nxt, 1, MB_ROLE_DECODE, 0);
        mb_forward(k ? N : D, &after[k]);
    }
    assert_rows_equal(mb_out(&after[0], RB_T, nxt), mb_out(&after[1], RB_T, nxt), what, RB_T, nxt);
    assert_rows_equal(mb_out(&after[0], RB_C, cpos), mb_out(&after[1], RB_C, cpos), what, RB_C, cpos);
    mb_clear(&after[0]);
    mb_clear(&after[1]);
    cpos++;
    if (q8) /* frozen only if the row at position 64 survived (or came now) */
        ck_assert_int_eq(layer0_frozen(D, RB_T), nxt >= 64);
    if (!imp) {
        /* no settle needed: the records compare right after the rollback */
        snap a = snap_take(D, mdl, RB_T), b = snap_take(N, mdl, RB_T);
        snap_assert_equal(&a, &b, what);
        snap_free(&a);
        snap_free(&b);
    }
    for (int k = 0; k < 2; k++) {
        settle(k ? N : D, RB_T, nxt + 1);
        settle(k ? N : D, RB_C, cpos);
    }
    for (int k = 0; k < 2; k++) {
        uint64_t id = k ? RB_C : RB_T;
        snap a = snap_take(D, mdl, id), b = snap_take(N, mdl, id);
        snap_assert_equal(&a, &b, what);
        snap_free(&a);
        snap_free(&b);
    }
    /* and they go on alike */
    float hd[256], hn[256];
    forward_rows(D, RB_T, nxt + 1, 1, MB_ROLE_DECODE, 0, hd);
    forward_rows(N, RB_T, nxt + 1, 1, MB_ROLE_DECODE, 0, hn);
    assert_rows_equal(hd, hn, what, RB_T, nxt + 1);
    stage_free(D);
    stage_free(N);
    pool_free(pl);
}

START_TEST(stage_rolled_back_verify_rows_leave_caches_as_never_seen)
{
    const rb_case cases[] = {
        {.pol = policy_of("full", "f32", "none", RB_DRAFTS), .prefill = 9, .p = 12},
        /* the q8 field freezes at row 64: inside the drafts [63, 66] */
        {.pol = policy_of("full", "q8", "none", RB_DRAFTS), .prefill = 60, .p = 62},
        {.pol = policy_of("full", "q8k", "none", RB_DRAFTS), .prefill = 60, .p = 62},
        /* ring of 3 slots, full and wrapped before the 4 drafts */
        {.pol = policy_of("rswa:3", "f32", "none", RB_DRAFTS), .prefill = 10, .p = 15},
        /* importance tracked (budget not reached): the drafts' mass must go */
        {.pol = policy_of("full", "f32", "importance:200:4", RB_DRAFTS), .prefill = 9, .p = 12},
        /* issue 40: an int8 ring, wrapped before the drafts */
        {.pol = policy_of("rswa:3", "q8", "none", RB_DRAFTS), .prefill = 10, .p = 15},
        {.pol = policy_of("rswa:2", "q8k", "none", RB_DRAFTS), .prefill = 5, .p = 6},
        /* issue 40: eviction under speculation, every draft crossing an
         * eviction (budget 8 < prefill 9), recent and importance */
        {.pol = policy_of("full", "f32", "recent:8", RB_DRAFTS), .prefill = 9, .p = 12},
        {.pol = policy_of("full", "f32", "importance:8:2", RB_DRAFTS), .prefill = 9, .p = 12},
        {.pol = policy_of("full", "q8v", "importance:6:0", RB_DRAFTS), .prefill = 4, .p = 7},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const int ring = cases[i].pol.attn == POLICY_ATTN_RSWA;
        /* a ring rolls back only its verify rows (-1 would roll back the
         * decode row); so does eviction, whose decode row's step is made
         * (only asynchronous speculation, which it refuses, replaces one) */
        const int final_decode = ring || cases[i].pol.evict != POLICY_EVICT_NONE;
        for (int a = final_decode ? 0 : -1; a <= RB_DRAFTS; a++)
            rollback_case(&cases[i], a);
    }
}
END_TEST

/* ---- c: importance eviction keeps min(sinks, budget) sinks ----------------- */

static kv_layer *kv_from_record(const stage *s, uint32_t layer, const uint8_t *rec, size_t len)
{
    const model_hparams *hp = model_hp(mdl);
    kv_layer_config kc = {.n_kv_heads = hp->n_kv_heads,
                          .head_dim = hp->head_dim,
                          .mode = KV_MODE_F32,
                          .capacity_rows = 64,
                          .spec_depth = 1,
                          .max_q_per_kv = hp->n_heads / hp->n_kv_heads};
    kv_layer *kl = NULL;
    pd_err e = {0};
    ck_assert_msg(kv_layer_new(&kc, &kl, &e) == PD_OK, "%s", e.msg);
    wire_layer_ref ref = {.identity = stage_layer_identity(s, layer), .layer = layer, .kv = kl, .kv_cfg = &kc};
    ck_assert_msg(wire_import(&ref, rec, len, 0, 0, &e) == PD_OK, "%s", e.msg);
    return kl;
}

static void export_layer(const stage *s, uint64_t stream, uint32_t layer, uint8_t **rec, size_t *len)
{
    pd_err e = {0};
    ck_assert_msg(stage_export_layer(s, stream, layer, rec, len, &e) == PD_OK, "%s", e.msg);
}

/* Asserts rows [0, n) of every head of a equal rows [a0, a0 + n) ... of b. */
static void assert_kv_rows_equal(const kv_layer *a, uint64_t a0, const kv_layer *b, uint64_t b0, uint64_t n,
                                 const char *what)
{
    kv_head_state ha[8], hb[8];
    kv_state sa, sb;
    kv_layer_state(a, &sa, ha);
    kv_layer_state(b, &sb, hb);
    ck_assert_uint_le(a0 + n, sa.rows);
    ck_assert_uint_le(b0 + n, sb.rows);
    const size_t hd = sa.head_dim;
    for (uint32_t h = 0; h < sa.n_kv_heads; h++) {
        ck_assert_msg(memcmp(ha[h].k + a0 * hd, hb[h].k + b0 * hd, n * hd * sizeof(float)) == 0,
                      "%s: head %u K rows differ", what, h);
        ck_assert_msg(memcmp(ha[h].v + a0 * hd, hb[h].v + b0 * hd, n * hd * sizeof(float)) == 0,
                      "%s: head %u V rows differ", what, h);
    }
}

/* --evict importance:N:S: every decode step with a full cache keeps N - 1
 * rows (room for the new one). The stage must keep what the library's rule
 * keeps with sinks = min(S, N - 1): checked by applying
 * kv_layer_evict_importance to a copy of the cache made just before the step,
 * and by the first min(S, N - 1) positions' rows staying in the cache. */
static void eviction_case(uint32_t budget, uint32_t sinks)
{
    cache_policy p = policy_of("full", "f32", "none", 0);
    p.evict = POLICY_EVICT_IMPORTANCE;
    p.evict_budget = budget;
    p.evict_sinks = sinks; /* set directly: every S from 0 to N, N included (the parser accepts SINKS <= N) */
    char what[120];
    snprintf(what, sizeof what, "importance:%u:%u", budget, sinks);
    const uint64_t id = 5;
    const uint32_t prefill = 3, steps = 24;
    const uint64_t keep = budget - 1, kept_sinks = sinks < keep ? sinks : keep;
    stage *s = stage_make(mdl, &p, NULL, 16, 1);
    admit(s, id, prefill, steps + budget);
    forward_rows(s, id, 0, prefill, MB_ROLE_PREFILL, 0, NULL);
    /* decode until the cache is full: positions [0, budget) are all held */
    for (uint64_t pos = prefill; pos < budget; pos++)
        forward_rows(s, id, pos, 1, MB_ROLE_DECODE, 0, NULL);
    settle(s, id, budget);
    kv_layer *first[N_LAYERS];
    for (uint32_t l = 0; l < N_LAYERS; l++) {
        uint8_t *rec;
        size_t len;
        export_layer(s, id, l, &rec, &len);
        first[l] = kv_from_record(s, l, rec, len);
        ck_assert_uint_eq(kv_layer_rows(first[l]), budget);
        free(rec);
    }
    for (uint64_t pos = budget; pos < budget + steps; pos++) {
        kv_layer *lib[N_LAYERS];
        for (uint32_t l = 0; l < N_LAYERS; l++) {
            uint8_t *rec;
            size_t len;
            export_layer(s, id, l, &rec, &len);
            lib[l] = kv_from_record(s, l, rec, len);
            free(rec);
            kv_layer_evict_importance(lib[l], keep, sinks, keep / 2 ? keep / 2 : 1);
            ck_assert_uint_eq(kv_layer_rows(lib[l]), keep);
        }
        forward_rows(s, id, pos, 1, MB_ROLE_DECODE, 0, NULL);
        settle(s, id, pos + 1);
        for (uint32_t l = 0; l < N_LAYERS; l++) {
            uint8_t *rec;
            size_t len;
            export_layer(s, id, l, &rec, &len);
            kv_layer *got = kv_from_record(s, l, rec, len);
            free(rec);
            char w2[200];
            snprintf(w2, sizeof w2, "%s, step at position %llu, layer %u", what, (unsigned long long)pos, l);
            ck_assert_msg(kv_layer_rows(got) == budget, "%s: %llu rows", w2,
                          (unsigned long long)kv_layer_rows(got));
            /* the kept rows are the library's, the new row follows them */
            assert_kv_rows_equal(got, 0, lib[l], 0, keep, w2);
            /* the sinks: positions [0, kept_sinks) */
            assert_kv_rows_equal(got, 0, first[l], 0, kept_sinks, w2);
            kv_layer_free(got);
            kv_layer_free(lib[l]);
        }
    }
    for (uint32_t l = 0; l < N_LAYERS; l++)
        kv_layer_free(first[l]);
    stage_free(s);
}

START_TEST(stage_importance_eviction_keeps_sinks_up_to_the_budget)
{
    eviction_case(8, 0);
    eviction_case(8, 3);
    eviction_case(8, 7); /* S = N - 1: keep = N - 1, every kept row a sink */
    eviction_case(8, 8); /* S = N: clamped to N - 1, as the library clamps */
}
END_TEST

/* ---- export, settle, identity --------------------------------------------- */

START_TEST(stage_export_names_its_layer_and_refuses_unknown_streams_and_layers)
{
    const cache_policy p = policy_of("full", "f32", "none", 2), p8 = policy_of("full", "f32", "none", 8),
                       pq = policy_of("full", "q8", "none", 2);
    stage *s = stage_make(mdl, &p, NULL, 8, 2);
    stage *t = stage_make(mdl_tail, &p, NULL, 8, 2);
    stage *s8 = stage_make(mdl, &p8, NULL, 8, 2);
    stage *sq = stage_make(mdl, &pq, NULL, 8, 2);
    admit(s, 1, 4, 8);
    admit(t, 1, 4, 8);
    forward_rows(s, 1, 0, 4, MB_ROLE_PREFILL, 0, NULL);
    forward_rows(t, 1, 0, 4, MB_ROLE_PREFILL, 0, NULL);
    pd_err e = {0};
    uint8_t *rec = NULL;
    size_t len = 0;
    /* identity: per layer and policy, not per draft limit */
    ck_assert_uint_ne(stage_layer_identity(s, 0), stage_layer_identity(s, 1));
    ck_assert_uint_eq(stage_layer_identity(s, 1), stage_layer_identity(t, 1));
    ck_assert_uint_eq(stage_layer_identity(s, 1), stage_layer_identity(s8, 1));
    ck_assert_uint_ne(stage_layer_identity(s, 1), stage_layer_identity(sq, 1));
    for (uint32_t l = 1; l < N_LAYERS; l++) {
        ck_assert_int_eq(stage_export_layer(t, 1, l, &rec, &len, &e), PD_OK);
        wire_info wi;
        ck_assert_msg(wire_inspect(rec, len, 0, 0, &wi, &e) == PD_OK, "%s", e.msg);
        ck_assert_uint_eq(wi.layer, l);
        ck_assert_uint_eq(wi.identity, stage_layer_identity(t, l));
        ck_assert_uint_eq(wi.kind, WIRE_KIND_FULL);
        ck_assert_uint_eq(wi.position, 4);
        ck_assert_uint_eq(wi.rows, 4);
        free(rec);
        rec = NULL;
        /* same shape from the whole-model stage (other bits: other input) */
        ck_assert_int_eq(stage_export_layer(s, 1, l, &rec, &len, &e), PD_OK);
        ck_assert_uint_eq(len, wi.bytes);
        free(rec);
        rec = NULL;
    }
    ck_assert_int_eq(stage_export_layer(t, 1, 0, &rec, &len, &e), PD_ERR_RANGE);
    ck_assert_ptr_null(rec);
    ck_assert_int_eq(stage_export_layer(t, 1, N_LAYERS, &rec, &len, &e), PD_ERR_RANGE);
    ck_assert_int_eq(stage_export_layer(s, 1, N_LAYERS, &rec, &len, &e), PD_ERR_RANGE);
    ck_assert_int_eq(stage_export_layer(s, 1, UINT32_MAX, &rec, &len, &e), PD_ERR_RANGE);
    pd_err_clear(&e);
    ck_assert_int_eq(stage_export_layer(s, 2, 0, &rec, &len, &e), PD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(e.msg, "stream 2"));
    ck_assert_ptr_null(rec);
    stage_retire(s, 1);
    ck_assert_int_eq(stage_export_layer(s, 1, 0, &rec, &len, &e), PD_ERR_ARG);
    stage_free(s);
    stage_free(t);
    stage_free(s8);
    stage_free(sq);
}
END_TEST

/* Settle refuses positions the stream cannot take (nothing changes), makes
 * an importance stream exportable, and settling before the next micro-batch
 * gives the bits of that micro-batch alone: stage a settles every round,
 * stage b never does; also under eviction with verify rows. */
START_TEST(stage_settle_changes_nothing_the_next_micro_batch_would_not)
{
    const cache_policy pols[] = {
        policy_of("full", "f32", "importance:10:2", 2),
        policy_of("full", "q8", "none", 2),
        policy_of("rswa:3", "f32", "none", 2),
    };
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0]; pi++) {
        const cache_policy *p = &pols[pi];
        const int imp = p->evict == POLICY_EVICT_IMPORTANCE, ring = p->attn == POLICY_ATTN_RSWA;
        const char *what = policy_name(p);
        stage *a = stage_make(mdl, p, NULL, 8, 1), *b = stage_make(mdl, p, NULL, 8, 1);
        for (int k = 0; k < 2; k++) {
            admit(k ? b : a, 4, 6, 40);
            forward_rows(k ? b : a, 4, 0, 6, MB_ROLE_PREFILL, 0, NULL);
        }
        pd_err e = {0};
        uint8_t *rec = NULL;
        size_t len = 0;
        ck_assert_int_eq(stage_export_layer(a, 4, 0, &rec, &len, &e), imp ? PD_ERR_REFUSED : PD_OK);
        free(rec);
        rec = NULL;
        uint64_t pos = 6;
        for (int round = 0; round < 12; round++) {
            /* [decode pos, verify pos+1, verify pos+2], acc of the drafts accepted */
            const int acc = round % 3;
            mbatch m[2];
            memset(m, 0, sizeof m);
            for (int k = 0; k < 2; k++) {
                mb_add(&m[k], 4, pos, 1, MB_ROLE_DECODE, 0);
                mb_add(&m[k], 4, pos + 1, 1, MB_ROLE_VERIFY, acc >= 1 ? 0 : 50);
                mb_add(&m[k], 4, pos + 2, 1, MB_ROLE_VERIFY, acc >= 2 ? 0 : 51);
                mb_forward(k ? b : a, &m[k]);
            }
            for (uint32_t j = 0; j < 3; j++)
                assert_rows_equal(m[0].x + (size_t)j * H, m[1].x + (size_t)j * H, what, 4, pos + j);
            mb_clear(&m[0]);
            mb_clear(&m[1]);
            /* refused settles change nothing: the stream is at pos + 3 */
            snap before = imp ? (snap){0} : snap_take(a, mdl, 4);
            ck_assert_int_eq(stage_settle(a, 4, pos + 4, &e), PD_ERR_RANGE);
            /* back 4 > max_drafts + 1 (kv); back 3 > 2 pending drafts (ring) */
            ck_assert_int_eq(stage_settle(a, 4, ring ? pos : pos - 1, &e), PD_ERR_RANGE);
            ck_assert_int_eq(stage_settle(a, 99, pos, &e), PD_ERR_ARG);
            if (!imp) {
                snap after = snap_take(a, mdl, 4);
                snap_assert_equal(&after, &before, "refused settle");
                snap_free(&after);
                snap_free(&before);
            }
            const uint64_t nxt = pos + 1 + (uint64_t)acc;
            settle(a, 4, nxt);
            settle(a, 4, nxt); /* twice is once */
            ck_assert_int_eq(stage_export_layer(a, 4, N_LAYERS - 1, &rec, &len, &e), PD_OK);
            wire_info wi;
            ck_assert_msg(wire_inspect(rec, len, 0, 0, &wi, &e) == PD_OK, "%s", e.msg);
            /* a kv record's position is the layer's depth (base + stored
             * rows): the stream's position unless rows were evicted */
            ck_assert_uint_eq(wi.position, (imp ? wi.rows : nxt));
            free(rec);
            rec = NULL;
            pos = nxt;
        }
        settle(b, 4, pos);
        snap sa = snap_take(a, mdl, 4), sb = snap_take(b, mdl, 4);
        snap_assert_equal(&sa, &sb, what);
        snap_free(&sa);
        snap_free(&sb);
        stage_free(a);
        stage_free(b);
    }
}
END_TEST

/* ---- d: bad micro-batches are refused whole -------------------------------- */

START_TEST(stage_refuses_bad_micro_batches_and_changes_nothing)
{
    const cache_policy pols[] = {
        policy_of("full", "f32", "none", 2),
        policy_of("full", "q8", "none", 2),
        policy_of("rswa:3", "f32", "none", 2),
    };
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0]; pi++) {
        const cache_policy *p = &pols[pi];
        stage *s = stage_make(mdl, p, NULL, 8, 3), *twin = stage_make(mdl, p, NULL, 8, 3);
        for (int k = 0; k < 2; k++) {
            stage *t = k ? twin : s;
            admit(t, 1, 5, 20);
            admit(t, 2, 3, 20);
            mbatch m = {0};
            mb_add(&m, 1, 0, 5, MB_ROLE_PREFILL, 0);
            mb_add(&m, 2, 0, 3, MB_ROLE_PREFILL, 0);
            mb_forward(t, &m);
            mb_clear(&m);
            /* stream 1 ends with two verify rows, so a rollback is allowed */
            mb_add(&m, 1, 5, 1, MB_ROLE_DECODE, 0);
            mb_add(&m, 1, 6, 2, MB_ROLE_VERIFY, 0);
            mb_add(&m, 2, 3, 1, MB_ROLE_DECODE, 0);
            mb_forward(t, &m);
            mb_clear(&m);
        }
        snap b1 = snap_take(s, mdl, 1), b2 = snap_take(s, mdl, 2);
        /* stream 1 is at 8 (drafts included), stream 2 at 4 */
        struct {
            const char *name;
            mb_row rows[4];
            uint32_t n;
            pd_status want;
        } bad[] = {
            {"unknown stream", {{.stream = 2, .pos = 4, .role = MB_ROLE_DECODE}, {.stream = 3, .pos = 0, .role = MB_ROLE_PREFILL}}, 2, PD_ERR_FORMAT},
            {"position skips ahead", {{.stream = 2, .pos = 5, .role = MB_ROLE_DECODE}}, 1, PD_ERR_FORMAT},
            {"gap inside a group", {{.stream = 2, .pos = 4, .role = MB_ROLE_DECODE}, {.stream = 2, .pos = 6, .role = MB_ROLE_DECODE}}, 2, PD_ERR_FORMAT},
            {"a stream twice", {{.stream = 1, .pos = 7, .role = MB_ROLE_DECODE}, {.stream = 2, .pos = 4, .role = MB_ROLE_DECODE}, {.stream = 1, .pos = 8, .role = MB_ROLE_DECODE}}, 3, PD_ERR_FORMAT},
            {"a stream twice, same position", {{.stream = 2, .pos = 4, .role = MB_ROLE_DECODE}, {.stream = 1, .pos = 6, .role = MB_ROLE_DECODE}, {.stream = 2, .pos = 4, .role = MB_ROLE_DECODE}}, 3, PD_ERR_FORMAT},
            {"rollback deeper than speculation", {{.stream = 1, .pos = 4, .role = MB_ROLE_PREFILL}}, 1, PD_ERR_FORMAT},
            {"rollback of a stream without drafts past its rows", {{.stream = 2, .pos = 0, .role = MB_ROLE_PREFILL}}, 1, PD_ERR_FORMAT},
            {"prefill role after the prefill", {{.stream = 2, .pos = 4, .role = MB_ROLE_PREFILL}}, 1, PD_ERR_FORMAT},
            {"unknown role", {{.stream = 2, .pos = 4, .role = MB_ROLE_COUNT}}, 1, PD_ERR_FORMAT},
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            float x[4 * 256], x0[4 * 256];
            for (uint32_t r = 0; r < bad[i].n; r++)
                row_input(bad[i].rows[r].stream, bad[i].rows[r].pos, 0, x + (size_t)r * H);
            memcpy(x0, x, sizeof x);
            pd_err e = {0};
            pd_status rc = stage_forward(s, bad[i].rows, bad[i].n, x, &e);
            ck_assert_msg(rc == bad[i].want, "%s: %s: got %s (%s)", policy_name(p), bad[i].name,
                          pd_status_str(rc), e.msg);
            ck_assert_msg(strstr(e.msg, "row ") != NULL, "%s: message names no row: %s", bad[i].name, e.msg);
            ck_assert_msg(memcmp(x, x0, (size_t)bad[i].n * H * sizeof(float)) == 0, "%s: x changed", bad[i].name);
            snap a1 = snap_take(s, mdl, 1), a2 = snap_take(s, mdl, 2);
            snap_assert_equal(&a1, &b1, bad[i].name);
            snap_assert_equal(&a2, &b2, bad[i].name);
            snap_free(&a1);
            snap_free(&a2);
        }
        /* too many rows: a range error, nothing changed */
        mb_row many[9];
        float xm[9 * 256];
        for (uint32_t r = 0; r < 9; r++)
            many[r] = (mb_row){.stream = 2, .pos = 4 + r, .role = MB_ROLE_DECODE};
        pd_err e = {0};
        ck_assert_int_eq(stage_forward(s, many, 9, xm, &e), PD_ERR_RANGE);
        ck_assert_uint_eq(stage_streams(s), 2);
        /* and the stage goes on exactly like its twin that saw none of it */
        for (int k = 0; k < 2; k++) {
            mbatch m = {0};
            mb_add(&m, 2, 4, 1, MB_ROLE_DECODE, 0);
            mb_add(&m, 1, 7, 1, MB_ROLE_DECODE, 0); /* one draft accepted */
            mb_forward(k ? twin : s, &m);
            if (k == 0) {
                memcpy(xm, m.x, 2 * H * sizeof(float));
            } else {
                assert_rows_equal(xm, m.x, policy_name(p), 2, 4);
                assert_rows_equal(xm + H, m.x + H, policy_name(p), 1, 7);
            }
            mb_clear(&m);
        }
        for (uint64_t id = 1; id <= 2; id++) {
            snap a = snap_take(s, mdl, id), b = snap_take(twin, mdl, id);
            snap_assert_equal(&a, &b, "after the refusals");
            snap_free(&a);
            snap_free(&b);
        }
        snap_free(&b1);
        snap_free(&b2);
        stage_free(s);
        stage_free(twin);
    }
}
END_TEST

/* ---- e: layers move between running stages --------------------------------- */

static model *load_range(const char *path, uint32_t first, uint32_t n)
{
    model_load_opts o = {.first_layer = first, .n_layers = n};
    model *m = NULL;
    pd_err e = {0};
    ck_assert_msg(model_load(path, &o, &m, &e) == PD_OK, "%s", e.msg);
    return m;
}

/* Every layer's record of a stream on the stage's current range. */
static snap snap_stage(const stage *s, uint64_t stream)
{
    uint32_t first, n;
    stage_layers(s, &first, &n);
    snap sn = {0};
    for (uint32_t l = first; l < first + n; l++) {
        uint8_t *rec = NULL;
        size_t len = 0;
        export_layer(s, stream, l, &rec, &len);
        sn.bytes = realloc(sn.bytes, sn.len + len);
        ck_assert_ptr_nonnull(sn.bytes);
        memcpy(sn.bytes + sn.len, rec, len);
        sn.len += len;
        free(rec);
    }
    return sn;
}

enum { MV_STREAMS = 3, MV_DRAFTS = 2 };
static const struct {
    uint64_t id;
    uint32_t prefill;
} mv_streams[MV_STREAMS] = {{11, 9}, {22, 4}, {33, 5}};

/* One pipeline of stages (A then B) next to a reference R holding every
 * layer. next[] is each stream's next position (accepted rows), alive[]
 * which streams run. */
typedef struct mv_run {
    stage *A, *B, *R;
    uint64_t next[MV_STREAMS];
    int alive[MV_STREAMS];
    pd_rng rng;
    const char *what;
} mv_run;

/* One micro-batch of every alive stream: a prefill chunk, or a decode row
 * with up to MV_DRAFTS verify rows of which a random number is accepted
 * (the rejected ones carry other tokens' rows). Through A then B, and
 * through R: the same bits. */
static void mv_round(mv_run *r, int round)
{
    mbatch b = {0};
    uint32_t verify[MV_STREAMS] = {0}, acc[MV_STREAMS] = {0};
    for (uint32_t k = 0; k < MV_STREAMS; k++) {
        if (!r->alive[k])
            continue;
        uint64_t pos = r->next[k];
        if (pos < mv_streams[k].prefill) {
            uint32_t left = mv_streams[k].prefill - (uint32_t)pos, n = 1 + pd_rng_below(&r->rng, left);
            mb_add(&b, mv_streams[k].id, pos, n, MB_ROLE_PREFILL, 0);
            r->next[k] += n;
            continue;
        }
        verify[k] = pd_rng_below(&r->rng, MV_DRAFTS + 1);
        acc[k] = pd_rng_below(&r->rng, verify[k] + 1);
        mb_add(&b, mv_streams[k].id, pos, 1, MB_ROLE_DECODE, 0);
        for (uint32_t i = 0; i < verify[k]; i++)
            mb_add(&b, mv_streams[k].id, pos + 1 + i, 1, MB_ROLE_VERIFY, i < acc[k] ? 0 : 40 + i);
        r->next[k] += 1 + acc[k];
    }
    mb_fill_inputs(&b);
    float *y = malloc((size_t)b.n * H * sizeof(float));
    ck_assert_ptr_nonnull(y);
    memcpy(y, b.x, (size_t)b.n * H * sizeof(float));
    pd_err e = {0};
    ck_assert_msg(stage_forward(r->A, b.rows, b.n, y, &e) == PD_OK, "%s: A: %s", r->what, e.msg);
    ck_assert_msg(stage_forward(r->B, b.rows, b.n, y, &e) == PD_OK, "%s: B: %s", r->what, e.msg);
    ck_assert_msg(stage_forward(r->R, b.rows, b.n, b.x, &e) == PD_OK, "%s: R: %s", r->what, e.msg);
    for (uint32_t i = 0; i < b.n; i++) {
        char w[160];
        snprintf(w, sizeof w, "%s, round %d", r->what, round);
        assert_rows_equal(y + (size_t)i * H, b.x + (size_t)i * H, w, b.rows[i].stream, b.rows[i].pos);
    }
    free(y);
    mb_clear(&b);
}

/* Moves absolute layer L from `from` to `to` (to gains it at one end, from
 * drops it at one end) with the protocol of stage.h. weights: what `to`
 * takes the layer's weights from. Before the imports `to` refuses to run the
 * streams; afterwards each moved record reads back byte for byte. */
static void mv_move(mv_run *r, stage *from, stage *to, uint32_t L, const model *weights)
{
    pd_err e = {0};
    uint8_t *rec[MV_STREAMS] = {0};
    size_t len[MV_STREAMS] = {0};
    for (uint32_t k = 0; k < MV_STREAMS; k++) {
        if (!r->alive[k])
            continue;
        settle(from, mv_streams[k].id, r->next[k]);
        settle(to, mv_streams[k].id, r->next[k]);
        export_layer(from, mv_streams[k].id, L, &rec[k], &len[k]);
    }
    ck_assert_msg(stage_add_layers(to, L, 1, weights, &e) == PD_OK, "%s: %s", r->what, e.msg);
    for (uint32_t k = 0; k < MV_STREAMS; k++) {
        if (!r->alive[k])
            continue;
        /* not yet imported: no micro-batch, settle or export of the stream */
        mb_row row = {.stream = mv_streams[k].id, .pos = r->next[k],
                      .role = r->next[k] < mv_streams[k].prefill ? MB_ROLE_PREFILL : MB_ROLE_DECODE};
        float x[256];
        row_input(row.stream, row.pos, 0, x);
        ck_assert_int_eq(stage_forward(to, &row, 1, x, &e), PD_ERR_FORMAT);
        ck_assert_msg(strstr(e.msg, "import") != NULL, "%s", e.msg);
        pd_err_clear(&e);
        settle(to, row.stream, row.pos); /* the new layer is left alone */
        uint8_t *bad = NULL;
        size_t blen;
        ck_assert_int_eq(stage_export_layer(to, row.stream, L, &bad, &blen, &e), PD_ERR_REFUSED);
        ck_assert_ptr_null(bad);
        ck_assert_msg(stage_import_layer(to, row.stream, L, rec[k], len[k], &e) == PD_OK, "%s: %s", r->what, e.msg);
        uint8_t *back;
        size_t blen2;
        export_layer(to, row.stream, L, &back, &blen2);
        ck_assert_msg(blen2 == len[k] && memcmp(back, rec[k], len[k]) == 0, "%s: layer %u record changed in the move",
                      r->what, L);
        free(back);
        free(rec[k]);
    }
    ck_assert_msg(stage_remove_layers(from, L, 1, &e) == PD_OK, "%s: %s", r->what, e.msg);
}

/* A [0, 2) and B [2, 3) run as a pipeline beside R [0, 3). After some
 * rounds A's last layer moves to B's front, a new stream joins, more rounds,
 * then B's first layer moves back to A's end: every output row equals R's
 * bit for bit throughout, and at the end every layer's record equals R's. */
START_TEST(stage_layers_move_between_running_stages_bit_identically)
{
    const cache_policy pols[] = {
        policy_of("full", "f32", "none", MV_DRAFTS),
        policy_of("full", "q8", "none", MV_DRAFTS),
        policy_of("window:8", "f32", "none", MV_DRAFTS),
        policy_of("rswa:4", "f32", "none", MV_DRAFTS),
        policy_of("full", "f32", "importance:12:3", MV_DRAFTS),
    };
    model *m01 = load_range(model_path, 0, 2), *m2 = load_range(model_path, 2, 1);
    for (size_t pi = 0; pi < sizeof pols / sizeof pols[0]; pi++) {
        const cache_policy *p = &pols[pi];
        pool *pl = NULL;
        pd_err e = {0};
        ck_assert_int_eq(pool_new(2, &pl, &e), PD_OK);
        mv_run r = {.A = stage_make(m01, p, pl, 64, MV_STREAMS),
                    .B = stage_make(m2, p, NULL, 64, MV_STREAMS),
                    .R = stage_make(mdl, p, NULL, 64, MV_STREAMS),
                    .rng = {.s = 1000 + pi},
                    .what = policy_name(p)};
        for (uint32_t k = 0; k < 2; k++) {
            admit(r.A, mv_streams[k].id, mv_streams[k].prefill, 64);
            admit(r.B, mv_streams[k].id, mv_streams[k].prefill, 64);
            admit(r.R, mv_streams[k].id, mv_streams[k].prefill, 64);
            r.alive[k] = 1;
        }
        int round = 0;
        for (; round < 12; round++)
            mv_round(&r, round);
        /* A drops its last layer, B gains it at its front (weights from a
         * load of layers [1, 3)) */
        mv_move(&r, r.A, r.B, 1, mdl_tail);
        uint32_t f, n;
        stage_layers(r.A, &f, &n);
        ck_assert(f == 0 && n == 1);
        stage_layers(r.B, &f, &n);
        ck_assert(f == 1 && n == 2);
        admit(r.A, mv_streams[2].id, mv_streams[2].prefill, 64);
        admit(r.B, mv_streams[2].id, mv_streams[2].prefill, 64);
        admit(r.R, mv_streams[2].id, mv_streams[2].prefill, 64);
        r.alive[2] = 1;
        for (; round < 24; round++)
            mv_round(&r, round);
        /* B drops its first layer, A gains it back at its end (its own model
         * holds it) */
        mv_move(&r, r.B, r.A, 1, NULL);
        stage_layers(r.A, &f, &n);
        ck_assert(f == 0 && n == 2);
        stage_layers(r.B, &f, &n);
        ck_assert(f == 2 && n == 1);
        for (; round < 34; round++)
            mv_round(&r, round);
        for (uint32_t k = 0; k < MV_STREAMS; k++) {
            uint64_t id = mv_streams[k].id;
            settle(r.A, id, r.next[k]);
            settle(r.B, id, r.next[k]);
            settle(r.R, id, r.next[k]);
            snap a = snap_stage(r.A, id), b = snap_stage(r.B, id), ref = snap_stage(r.R, id);
            snap ab = {.len = a.len + b.len};
            ab.bytes = malloc(ab.len);
            memcpy(ab.bytes, a.bytes, a.len);
            memcpy(ab.bytes + a.len, b.bytes, b.len);
            snap_assert_equal(&ab, &ref, r.what);
            snap_free(&a);
            snap_free(&b);
            snap_free(&ab);
            snap_free(&ref);
        }
        stage_free(r.A);
        stage_free(r.B);
        stage_free(r.R);
        pool_free(pl);
    }
    model_free(m01);
    model_free(m2);
}
END_TEST

/* Adds and removes only at the ends, with weights that hold the layers and
 * come from the same file; imports only into settled streams; a stage may
 * lose every layer (it then passes rows through) and take any range again.
 * Every refusal changes nothing. */
START_TEST(stage_layer_changes_refuse_what_would_break_the_range)
{
    const cache_policy p = policy_of("full", "f32", "none", 2);
    model *m01 = load_range(model_path, 0, 2);
    char other_path[64];
    strcpy(other_path, "/tmp/pd_test_stage_XXXXXX");
    int fd = mkstemp(other_path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    mkmodel_opts o;
    mkmodel_defaults(&o);
    o.layers = N_LAYERS, o.hidden = 64, o.heads = 4, o.kv_heads = 2, o.ffn = 96, o.vocab = 300, o.seed = 18;
    pd_err e = {0};
    ck_assert_msg(mkmodel_write(&o, other_path, &e) == PD_OK, "%s", e.msg);
    model *other = load_range(other_path, 0, N_LAYERS);

    stage *s = stage_make(m01, &p, NULL, 8, 2), *full = stage_make(mdl, &p, NULL, 8, 2);
    admit(s, 1, 3, 10);
    admit(full, 1, 3, 10);
    forward_rows(s, 1, 0, 3, MB_ROLE_PREFILL, 0, NULL);
    forward_rows(full, 1, 0, 3, MB_ROLE_PREFILL, 0, NULL);
    snap before = snap_stage(s, 1);
    uint32_t f, n;
    ck_assert_int_eq(stage_add_layers(s, 2, 0, NULL, &e), PD_ERR_ARG);
    ck_assert_int_eq(stage_add_layers(s, 3, 1, mdl, &e), PD_ERR_RANGE);  /* past the model */
    ck_assert_int_eq(stage_add_layers(s, 2, 1, NULL, &e), PD_ERR_RANGE); /* m01 does not hold it */
    ck_assert_int_eq(stage_add_layers(s, 2, 1, other, &e), PD_ERR_MISMATCH);
    ck_assert_int_eq(stage_remove_layers(s, 0, 0, &e), PD_ERR_ARG);
    ck_assert_int_eq(stage_remove_layers(s, 2, 1, &e), PD_ERR_RANGE);
    ck_assert_int_eq(stage_remove_layers(s, 0, 3, &e), PD_ERR_RANGE);
    stage_layers(s, &f, &n);
    ck_assert(f == 0 && n == 2);
    snap after = snap_stage(s, 1);
    snap_assert_equal(&after, &before, "refused layer changes");
    snap_free(&after);
    snap_free(&before);
    /* a layer in the middle cannot go */
    ck_assert_int_eq(stage_add_layers(s, 2, 1, mdl, &e), PD_OK);
    ck_assert_int_eq(stage_remove_layers(s, 1, 1, &e), PD_ERR_RANGE);
    /* imports: unknown stream, layer outside, pending rows elsewhere, a
     * record of another layer */
    uint8_t *rec;
    size_t len;
    export_layer(full, 1, 2, &rec, &len);
    ck_assert_int_eq(stage_import_layer(s, 9, 2, rec, len, &e), PD_ERR_ARG);
    ck_assert_int_eq(stage_import_layer(s, 1, 3, rec, len, &e), PD_ERR_RANGE);
    ck_assert_int_eq(stage_import_layer(s, 1, 2, rec, len, &e), PD_ERR_REFUSED); /* the prefill is pending */
    settle(s, 1, 3);
    settle(full, 1, 3);
    free(rec);
    export_layer(full, 1, 2, &rec, &len);
    ck_assert_int_eq(stage_import_layer(s, 1, 1, rec, len, &e), PD_ERR_MISMATCH);
    ck_assert_msg(stage_import_layer(s, 1, 2, rec, len, &e) == PD_OK, "%s", e.msg);
    free(rec);
    /* s now equals full: both go on identically */
    float a[256], b[256];
    forward_rows(s, 1, 3, 1, MB_ROLE_DECODE, 0, a);
    forward_rows(full, 1, 3, 1, MB_ROLE_DECODE, 0, b);
    assert_rows_equal(a, b, "after the import", 1, 3);
    /* every layer leaves: rows pass through unchanged; a new range may be
     * anywhere, and the stream (at position 4) must import it */
    ck_assert_int_eq(stage_remove_layers(s, 0, 1, &e), PD_OK);
    ck_assert_int_eq(stage_remove_layers(s, 2, 1, &e), PD_OK);
    ck_assert_int_eq(stage_remove_layers(s, 1, 1, &e), PD_OK);
    stage_layers(s, &f, &n);
    ck_assert_uint_eq(n, 0);
    row_input(1, 4, 0, a);
    memcpy(b, a, sizeof a);
    mb_row row = {.stream = 1, .pos = 4, .role = MB_ROLE_DECODE};
    ck_assert_int_eq(stage_forward(s, &row, 1, a, &e), PD_OK);
    ck_assert_int_eq(memcmp(a, b, H * sizeof(float)), 0);
    stage_memory(s, &(stage_mem){0});
    ck_assert_int_eq(stage_add_layers(s, 1, 1, mdl_tail, &e), PD_OK);
    ck_assert_int_eq(stage_forward(s, &(mb_row){.stream = 1, .pos = 5, .role = MB_ROLE_DECODE}, 1, a, &e),
                     PD_ERR_FORMAT);
    /* a stream admitted now starts empty in the new range and simply runs */
    admit(s, 2, 2, 4);
    forward_rows(s, 2, 0, 2, MB_ROLE_PREFILL, 0, NULL);
    stage_free(s);
    stage_free(full);
    model_free(m01);
    model_free(other);
    unlink(other_path);
}
END_TEST

/* ---- asynchronous speculation: rollback across two micro-batches -------- */

enum { AS_K = 4, AS_M = 3 };

/* D sees T's decode row p with drafts p+1..p+K (the first a1 true rows),
 * then, before any verdict, verify rows p+K+1..p+K+M continuing them (the
 * first a2 true rows; the batch is stale unless a1 == K). The tail would
 * accept v = a1 (a1 < K) or K + a2 rows after p, so the next micro-batch
 * starts at nxt = p + 1 + v with true rows. N sees only true rows, one per
 * step. The next batch's outputs and every cache byte must agree. */
static void async_case(const cache_policy *p, uint32_t prefill, uint32_t a1, uint32_t a2)
{
    char what[200];
    snprintf(what, sizeof what, "%s, prefill %u, %u of %u then %u of %u accepted", policy_name(p), prefill, a1,
             AS_K, a2, AS_M);
    stage *D = stage_make(mdl, p, NULL, 80, 2), *N = stage_make(mdl, p, NULL, 80, 2);
    const uint64_t pos0 = prefill;
    admit(D, RB_T, prefill, 64);
    admit(N, RB_T, prefill, 64);
    forward_rows(D, RB_T, 0, prefill, MB_ROLE_PREFILL, 0, NULL);
    forward_rows(N, RB_T, 0, prefill, MB_ROLE_PREFILL, 0, NULL);
    mbatch b1 = {0}, b2 = {0};
    mb_add(&b1, RB_T, pos0, 1, MB_ROLE_DECODE, 0);
    for (uint32_t i = 0; i < AS_K; i++)
        mb_add(&b1, RB_T, pos0 + 1 + i, 1, MB_ROLE_VERIFY, i < a1 ? 0 : 200 + i);
    mb_forward(D, &b1);
    for (uint32_t i = 0; i < AS_M; i++)
        mb_add(&b2, RB_T, pos0 + 1 + AS_K + i, 1, MB_ROLE_VERIFY, i < a2 ? 0 : 300 + i);
    mb_forward(D, &b2);
    const uint64_t v = a1 < AS_K ? a1 : AS_K + a2, nxt = pos0 + 1 + v;
    for (uint64_t q = pos0; q < nxt; q++)
        forward_rows(N, RB_T, q, 1, MB_ROLE_DECODE, 0, NULL);
    mbatch d3 = {0}, n3 = {0};
    mb_add(&d3, RB_T, nxt, 1, MB_ROLE_DECODE, 0);
    mb_add(&d3, RB_T, nxt + 1, 1, MB_ROLE_VERIFY, 0);
    mb_add(&n3, RB_T, nxt, 1, MB_ROLE_DECODE, 0);
    mb_add(&n3, RB_T, nxt + 1, 1, MB_ROLE_VERIFY, 0);
    mb_forward(D, &d3);
    mb_forward(N, &n3);
    for (uint64_t q = nxt; q < nxt + 2; q++)
        assert_rows_equal(mb_out(&d3, RB_T, q), mb_out(&n3, RB_T, q), what, RB_T, q);
    /* and they go on alike (a window's trims come later there) */
    for (uint64_t q = nxt + 2; q < nxt + 22; q++) {
        float hd[256], hn[256];
        forward_rows(D, RB_T, q, 1, MB_ROLE_DECODE, 0, hd);
        forward_rows(N, RB_T, q, 1, MB_ROLE_DECODE, 0, hn);
        assert_rows_equal(hd, hn, what, RB_T, q);
    }
    /* every cache byte, where the state is a function of the rows kept (a
     * window trims when more than 2W rows are stored, so where its cut
     * falls depends on how far the stream ever reached) */
    if (p->attn == POLICY_ATTN_FULL) {
        pd_err e = {0};
        ck_assert_msg(stage_settle(D, RB_T, nxt + 22, &e) == PD_OK, "%s: %s", what, e.msg);
        ck_assert_msg(stage_settle(N, RB_T, nxt + 22, &e) == PD_OK, "%s: %s", what, e.msg);
        snap sd = snap_take(D, mdl, RB_T), sn = snap_take(N, mdl, RB_T);
        ck_assert_msg(sd.len == sn.len && memcmp(sd.bytes, sn.bytes, sd.len) == 0, "%s: cache bytes differ", what);
        free(sd.bytes);
        free(sn.bytes);
    }
    mb_clear(&b1);
    mb_clear(&b2);
    mb_clear(&d3);
    mb_clear(&n3);
    stage_free(D);
    stage_free(N);
}

START_TEST(stage_async_rollback_across_two_micro_batches_at_every_accepted_count)
{
    const char *kinds[][2] = {{"full", "f32"}, {"full", "q8"}, {"full", "q8k"}, {"window:8", "f32"}};
    /* prefill 58: the q8 field freezes at row 64, inside B2; 61: inside B1 */
    const uint32_t prefills[] = {9, 58, 61};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        cache_policy p = policy_of(kinds[k][0], kinds[k][1], "none", AS_K);
        p.spec_async = true;
        for (size_t f = 0; f < sizeof prefills / sizeof prefills[0]; f++)
            for (uint32_t a1 = 0; a1 <= AS_K; a1++)
                for (uint32_t a2 = 0; a2 <= (a1 == AS_K ? AS_M : 0); a2++)
                    async_case(&p, prefills[f], a1, a2);
    }
    /* issue 40: eviction (budget 8 < prefill: both micro-batches cross
     * evictions that are decided, not made, until their rows are final) */
    const char *evicts[] = {"recent:8", "importance:8:2"};
    for (size_t k = 0; k < 2; k++) {
        cache_policy p = policy_of("full", "f32", evicts[k], AS_K);
        p.spec_async = true;
        for (uint32_t pre = 9; pre <= 12; pre += 3)
            for (uint32_t a1 = 0; a1 <= AS_K; a1++)
                for (uint32_t a2 = 0; a2 <= (a1 == AS_K ? AS_M : 0); a2++)
                    async_case(&p, pre, a1, a2);
    }
    /* without --draft-async a rollback past the last micro-batch is refused */
    cache_policy sync = policy_of("full", "f32", "none", AS_K);
    stage *s = stage_make(mdl, &sync, NULL, 32, 1);
    admit(s, RB_T, 9, 40);
    forward_rows(s, RB_T, 0, 9, MB_ROLE_PREFILL, 0, NULL);
    forward_rows(s, RB_T, 9, 3, MB_ROLE_DECODE, 0, NULL);
    forward_rows(s, RB_T, 12, 3, MB_ROLE_VERIFY, 0, NULL);
    mbatch b = {0};
    mb_add(&b, RB_T, 10, 1, MB_ROLE_DECODE, 0);
    mb_fill_inputs(&b);
    pd_err e = {0};
    ck_assert_int_eq(stage_forward(s, b.rows, b.n, b.x, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "more than speculation allows") != NULL, "%s", e.msg);
    mb_clear(&b);
    stage_free(s);
}
END_TEST

/* ---- the draft model's guesses leave without a trace --------------------- */

/* Twin streams: `a` runs guesses in `n` one-row micro-batches (salted: other
 * tokens' rows) after position 7, `b` never does. */
static void guess_twins(const cache_policy *p, uint32_t n, stage **a, stage **b)
{
    *a = stage_make(mdl, p, NULL, 16, 2);
    *b = stage_make(mdl, p, NULL, 16, 2);
    admit(*a, 1, 6, 32);
    admit(*b, 1, 6, 32);
    forward_rows(*a, 1, 0, 6, MB_ROLE_PREFILL, 0, NULL);
    forward_rows(*b, 1, 0, 6, MB_ROLE_PREFILL, 0, NULL);
    forward_rows(*a, 1, 6, 1, MB_ROLE_DECODE, 0, NULL);
    forward_rows(*b, 1, 6, 1, MB_ROLE_DECODE, 0, NULL);
    for (uint32_t g = 0; g < n; g++)
        forward_rows(*a, 1, 7 + g, 1, MB_ROLE_DECODE, 9, NULL);
}

/* Both go on from position `from` to 10 with the same rows and give the same
 * hidden states and, settled, the same records of every layer. */
static void assert_twins_equal(stage *a, stage *b, uint64_t from, const char *what)
{
    float oa[H], ob[H];
    for (uint64_t p = from; p < 10; p++) {
        forward_rows(a, 1, p, 1, MB_ROLE_DECODE, 0, oa);
        forward_rows(b, 1, p, 1, MB_ROLE_DECODE, 0, ob);
        assert_rows_equal(oa, ob, what, 1, p);
    }
    pd_err e = {0};
    ck_assert_msg(stage_settle(a, 1, 10, &e) == PD_OK, "%s: %s", what, e.msg);
    ck_assert_msg(stage_settle(b, 1, 10, &e) == PD_OK, "%s: %s", what, e.msg);
    for (uint32_t L = 0; L < model_hp(mdl)->n_layers; L++) {
        uint8_t *ra, *rb;
        size_t la, lb;
        export_layer(a, 1, L, &ra, &la);
        export_layer(b, 1, L, &rb, &lb);
        ck_assert_msg(la == lb && memcmp(ra, rb, la) == 0, "%s: layer %u's record differs", what, L);
        free(ra);
        free(rb);
    }
}

/* The head's draft model feeds its guesses back in one row per micro-batch
 * and throws them away at the stream's next proposal (drafter.h): on a
 * spec_async stage, whose layers undo 2 x (K + 1) positions across
 * micro-batches, a stream that ran guesses in five one-row micro-batches and
 * was rolled back — by stage_settle, or by its next micro-batch starting
 * before them, as the draft model does — gives the same bits afterwards as
 * one that never ran them, for every policy that takes spec_async.
 * stage_undo_floor says how far back that reaches: deeper, or on a stage
 * without spec_async (the last micro-batch's rows only), the settle is
 * refused and changes nothing. */
START_TEST(stage_settle_drops_guesses_of_earlier_micro_batches_exactly)
{
    const char *undo[][3] = {{"full", "f32", "none"}, {"full", "q8k", "none"}, {"window:8", "f32", "none"},
                             {"full", "f32", "recent:8"}, {"full", "f32", "importance:8:2"}};
    pd_err e = {0};
    uint64_t floor = 99;
    for (size_t i = 0; i < 2 * (sizeof undo / sizeof undo[0]); i++) {
        size_t k = i / 2;
        bool settle = i % 2 == 0;
        cache_policy p = policy_of(undo[k][0], undo[k][1], undo[k][2], 2); /* undoes 6 positions */
        p.spec_async = true;
        stage *a, *b;
        guess_twins(&p, 5, &a, &b);
        ck_assert_int_eq(stage_undo_floor(a, 2, &floor, &e), PD_ERR_ARG); /* unknown stream */
        ck_assert_msg(stage_undo_floor(a, 1, &floor, &e) == PD_OK && floor == 6, "%s: floor %llu",
                      policy_name(&p), (unsigned long long)floor);
        if (settle) {
            ck_assert_int_eq(stage_settle(a, 1, 13, &e), PD_ERR_RANGE); /* ahead of the stream */
            ck_assert_int_eq(stage_settle(a, 2, 7, &e), PD_ERR_ARG);    /* unknown stream */
            ck_assert_msg(stage_settle(a, 1, 7, &e) == PD_OK, "%s: %s", policy_name(&p), e.msg);
            ck_assert_msg(stage_settle(a, 1, 7, &e) == PD_OK, "%s: %s", policy_name(&p), e.msg); /* again */
            ck_assert_uint_eq(stage_rows_rolled_back(a), 5);
        }
        assert_twins_equal(a, b, 7, policy_name(&p)); /* without a settle: rolled back by the row at 7 */
        ck_assert_uint_eq(stage_rows_rolled_back(a), 5);
        stage_free(a);
        stage_free(b);
    }
    /* seven guesses: the cut back to 7 is deeper than the 6 positions undone */
    cache_policy deep = policy_of("full", "f32", "none", 2);
    deep.spec_async = true;
    const char *sync[][3] = {{"full", "f32", "none"}, {"full", "q8", "none"}, {"rswa:4", "f32", "none"},
                             {"window:8", "f32", "none"}, {"full", "f32", "recent:8"}};
    for (size_t i = 0; i <= sizeof sync / sizeof sync[0]; i++) {
        const cache_policy p = i ? policy_of(sync[i - 1][0], sync[i - 1][1], sync[i - 1][2], 4) : deep;
        stage *a, *b;
        guess_twins(&p, i ? 3 : 7, &a, &b);
        for (uint32_t g = 0; g < (i ? 3u : 7u); g++) /* b runs a's rows too, so they stay twins */
            forward_rows(b, 1, 7 + g, 1, MB_ROLE_DECODE, 9, NULL);
        pd_err_clear(&e);
        ck_assert_msg(stage_undo_floor(a, 1, &floor, &e) == PD_OK && floor > 7, "%s: floor %llu",
                      policy_name(&p), (unsigned long long)floor);
        ck_assert_msg(stage_settle(a, 1, 7, &e) == PD_ERR_RANGE, "%s: cut allowed", policy_name(&p));
        ck_assert_msg(strstr(e.msg, "more than speculation allows") != NULL, "%s", e.msg);
        ck_assert_uint_eq(stage_rows_rolled_back(a), 0);
        /* nothing changed: both go on after the guesses alike */
        float oa[H], ob[H];
        uint64_t next = i ? 10 : 14;
        forward_rows(a, 1, next, 1, MB_ROLE_DECODE, 0, oa);
        forward_rows(b, 1, next, 1, MB_ROLE_DECODE, 0, ob);
        assert_rows_equal(oa, ob, policy_name(&p), 1, next);
        stage_free(a);
        stage_free(b);
    }
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("stage");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_unchecked_fixture(tc, fixture_setup, fixture_teardown);
    tcase_add_test(tc, stage_rows_split_or_mixed_give_identical_hidden);
    tcase_add_test(tc, stage_rolled_back_verify_rows_leave_caches_as_never_seen);
    tcase_add_test(tc, stage_importance_eviction_keeps_sinks_up_to_the_budget);
    tcase_add_test(tc, stage_export_names_its_layer_and_refuses_unknown_streams_and_layers);
    tcase_add_test(tc, stage_settle_changes_nothing_the_next_micro_batch_would_not);
    tcase_add_test(tc, stage_refuses_bad_micro_batches_and_changes_nothing);
    tcase_add_test(tc, stage_layers_move_between_running_stages_bit_identically);
    tcase_add_test(tc, stage_layer_changes_refuse_what_would_break_the_range);
    tcase_add_test(tc, stage_settle_drops_guesses_of_earlier_micro_batches_exactly);
    tcase_add_test(tc, stage_async_rollback_across_two_micro_batches_at_every_accepted_count);
    suite_add_tcase(s, tc);
    return s;
}
