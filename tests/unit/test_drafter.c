/* Tests for cluster/runtime/spec/drafter.h: a stream's guesses depend only on
 * its context, never on what the draft model's caches held before. A stream
 * proposed for step by step, whose context then goes back (a refuted
 * --draft-async continuation: rolled back within the caches' undo window; or
 * further back: its caches retired and the context run again), gets the
 * guesses a draft model seeing that context for the first time gets.
 *
 * The context is a token list per stream; its rows are the draft model's
 * embeddings of those tokens, so two contexts that share a prefix share those
 * rows bit for bit. */
#define _XOPEN_SOURCE 700
#include "pd_test.h"

#include "cluster/cli/mkmodel.h"
#include "cluster/model/model.h"
#include "cluster/runtime/spec/drafter.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { K = 3, CTX = 64, VOCAB = 300 };

static char target_path[64], draft_path[64];
static model *target;

static void write_model(char *path, uint32_t layers, uint64_t seed)
{
    strcpy(path, "/tmp/pd_test_drafter_XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    mkmodel_opts o;
    mkmodel_defaults(&o);
    o.layers = layers;
    o.hidden = 64;
    o.heads = 4;
    o.kv_heads = 2;
    o.ffn = 96;
    o.vocab = VOCAB;
    o.seed = seed;
    pd_err e = {0};
    ck_assert_msg(mkmodel_write(&o, path, &e) == PD_OK, "%s", e.msg);
}

static void fixture_setup(void)
{
    write_model(target_path, 3, 8);
    write_model(draft_path, 2, 21);
    model_load_opts all = {.all_layers = 1, .want_embed = 1, .want_output = 1};
    pd_err e = {0};
    ck_assert_msg(model_load(target_path, &all, &target, &e) == PD_OK, "%s", e.msg);
}

static void fixture_teardown(void)
{
    model_free(target);
    target = NULL;
    unlink(target_path);
    unlink(draft_path);
}

static drafter *open_drafter(void)
{
    drafter_config c = {.path = draft_path, .target = target, .max_streams = 2, .max_rows = 16, .max_k = K};
    drafter *d = NULL;
    pd_err e = {0};
    ck_assert_msg(drafter_open(&c, &d, &e) == PD_OK, "%s", e.msg);
    return d;
}

/* Context rows: the draft model's embeddings of the stream's tokens. */
static pd_status ctx_rows(void *ctx, const drafter_req *r, uint64_t from, uint32_t n, float *x, pd_err *err)
{
    (void)err;
    const drafter *d = ctx;
    model_embed(drafter_model(d), (const uint32_t *)r->user + from, n, x);
    return PD_OK;
}

/* A context of tokens: toks[p] for p < from, then another sequence (salt). */
static void context_of(uint32_t *toks, uint32_t from, uint32_t salt)
{
    for (uint32_t p = from; p < CTX; p++)
        toks[p] = (p * 37u + 11u + salt * 101u) % (VOCAB - 2) + 2; /* ids from 2 on */
}

/* One proposal for stream 5 whose context is toks[0..n_ctx), last toks[n_ctx]:
 * returns how many rows the draft model ran for it. */
static uint64_t propose(drafter *d, const uint32_t *toks, uint64_t n_ctx, uint32_t *out, uint32_t *got)
{
    drafter_stats before, after;
    drafter_get_stats(d, &before);
    drafter_req r = {.stream = 5, .n_ctx = n_ctx, .n_prefill = 4, .last = toks[n_ctx], .k = K,
                     .max_rows = CTX, .out = out, .user = toks};
    pd_err e = {0};
    ck_assert_msg(drafter_propose(d, &r, 1, ctx_rows, d, &e) == PD_OK, "%s", e.msg);
    *got = r.got;
    drafter_get_stats(d, &after);
    return after.rows - before.rows;
}

/* The guesses d gives for the context toks[0..n_ctx] equal those of a draft
 * model that sees it first; returns the rows d ran. */
static uint64_t propose_as_fresh(drafter *d, const uint32_t *toks, uint64_t n_ctx, const char *what)
{
    uint32_t out[K] = {0}, want[K] = {0}, got, want_got;
    uint64_t rows = propose(d, toks, n_ctx, out, &got);
    drafter *fresh = open_drafter();
    propose(fresh, toks, n_ctx, want, &want_got);
    drafter_free(fresh);
    ck_assert_msg(got == want_got && memcmp(out, want, got * sizeof *out) == 0,
                  "%s (n_ctx %llu): guesses differ from a fresh draft model's (%u of them, first %u vs %u)", what,
                  (unsigned long long)n_ctx, got, out[0], want[0]);
    return rows;
}

START_TEST(drafter_guesses_after_the_context_went_back_equal_a_fresh_draft_models)
{
    uint32_t toks[CTX], other[CTX], third[CTX];
    context_of(toks, 0, 0);
    drafter *d = open_drafter();
    /* step by step: each proposal runs the rows committed since the last */
    propose_as_fresh(d, toks, 10, "first sight");
    ck_assert_uint_le(propose_as_fresh(d, toks, 12, "two more committed"), 2 + K);
    propose_as_fresh(d, toks, 15, "three more committed");
    /* the continuation assumed at 14 was refuted: back 2 positions, inside
     * the 2 x (K + 1) the caches undo, so only the new rows run */
    memcpy(other, toks, sizeof toks);
    context_of(other, 14, 1);
    uint64_t rows = propose_as_fresh(d, other, 14, "back within the undo window");
    ck_assert_msg(rows <= K, "rolled back within the window, yet %llu rows ran", (unsigned long long)rows);
    /* back past the undo window (a context 9 positions shorter): retired and
     * the whole context run again */
    memcpy(third, other, sizeof other);
    context_of(third, 5, 2);
    rows = propose_as_fresh(d, third, 5, "back past the undo window");
    ck_assert_msg(rows >= 6, "the context was not run again: %llu rows", (unsigned long long)rows);
    /* and on from there, step by step again */
    ck_assert_uint_le(propose_as_fresh(d, third, 7, "on after the rerun"), 2 + K);
    drafter_free(d);
}
END_TEST

START_TEST(drafter_refuses_a_configuration_without_k)
{
    drafter_config c = {.path = draft_path, .target = target, .max_streams = 2, .max_rows = 16, .max_k = 0};
    drafter *d = (drafter *)1;
    pd_err e = {0};
    ck_assert_int_eq(drafter_open(&c, &d, &e), PD_ERR_ARG);
    ck_assert_ptr_null(d);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("drafter");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_unchecked_fixture(tc, fixture_setup, fixture_teardown);
    tcase_add_test(tc, drafter_guesses_after_the_context_went_back_equal_a_fresh_draft_models);
    tcase_add_test(tc, drafter_refuses_a_configuration_without_k);
    suite_add_tcase(s, tc);
    return s;
}
