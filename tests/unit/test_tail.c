/* tail: stream admission and retirement, and sampling checked against the
 * model computed separately: only rows that want logits are sampled, in row
 * order; a greedy token is the argmax of model_logits of that row alone; each
 * row digest is digest_f32 of that logits row; temperature sampling is the
 * sampler's choice for (seed, page key, token index), whatever shares the
 * batch. Refusals: a second admission, a row of an unknown stream, a token
 * beyond max_new, more logits rows than max_rows. */
#include "pd_test.h"

#include "cluster/cli/mkmodel.h"
#include "cluster/model/model.h"
#include "cluster/model/sample.h"
#include "cluster/runtime/pipeline/digest.h"
#include "cluster/runtime/pipeline/tail.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_ROWS 8u

static char model_path[64];
static model *tm;    /* tail-only load of mkmodel's default model */
static uint32_t H, V; /* hidden, vocab */

static void tail_setup(void)
{
    snprintf(model_path, sizeof model_path, "/tmp/pd_test_tail_XXXXXX");
    int fd = mkstemp(model_path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    mkmodel_opts o;
    mkmodel_defaults(&o);
    o.seed = 11;
    pd_err e = {0};
    ck_assert_msg(mkmodel_write(&o, model_path, &e) == PD_OK, "%s", e.msg);
    model_load_opts lo = {.n_layers = 0, .want_output = 1};
    ck_assert_msg(model_load(model_path, &lo, &tm, &e) == PD_OK, "%s", e.msg);
    H = model_hp(tm)->hidden;
    V = model_hp(tm)->vocab;
}

static void tail_teardown(void)
{
    model_free(tm);
    tm = NULL;
    unlink(model_path);
}

static tail *tail_make(sample_params sp, uint64_t seed, uint32_t max_streams)
{
    tail_config cfg = {.m = tm, .sample = sp, .ngram = {.n = 0}, .seed = seed, .max_streams = max_streams,
                       .max_rows = MAX_ROWS, .pool = NULL};
    tail *t = NULL;
    pd_err e = {0};
    ck_assert_msg(tail_new(&cfg, &t, &e) == PD_OK, "%s", e.msg);
    return t;
}

static const sample_params greedy = {.mode = SAMPLE_GREEDY, .temperature = 1.0f, .top_p = 1.0f};

static void admit_ok(tail *t, uint64_t stream, uint32_t max_new, uint64_t key)
{
    mb_admit a = {.stream = stream, .prefill_rows = 4, .max_new = max_new, .sample_key = key};
    pd_err e = {0};
    ck_assert_msg(tail_admit(t, &a, &e) == PD_OK, "%s", e.msg);
}

/* The logits of one hidden row computed on its own (model_logits overwrites
 * its input, so on a copy). */
static void ref_logits(const float *x, float *logits)
{
    float *xc = malloc(H * sizeof *xc);
    ck_assert_ptr_nonnull(xc);
    memcpy(xc, x, H * sizeof *xc);
    model_logits(tm, xc, 1, logits, NULL);
    free(xc);
}

static uint32_t argmax(const float *v, uint32_t n)
{
    uint32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (v[i] > v[best])
            best = i;
    return best;
}

START_TEST(tail_samples_rows_that_want_logits_in_row_order)
{
    tail *t = tail_make(greedy, 1, 4);
    admit_ok(t, 7, 10, 0x7777);
    admit_ok(t, 3, 10, 0x3333);
    /* rows of two streams; only rows 1, 3 and 4 want logits */
    const mb_row rows[5] = {
        {.stream = 7, .pos = 0, .role = MB_ROLE_PREFILL, .wants_logits = 0},
        {.stream = 7, .pos = 1, .role = MB_ROLE_PREFILL, .wants_logits = 1},
        {.stream = 3, .pos = 0, .role = MB_ROLE_PREFILL, .wants_logits = 0},
        {.stream = 3, .pos = 1, .role = MB_ROLE_PREFILL, .wants_logits = 1},
        {.stream = 3, .pos = 2, .role = MB_ROLE_DECODE, .wants_logits = 1},
    };
    float x[5 * 64], x_before[5 * 64];
    ck_assert_uint_eq(H, 64);
    pd_rng r = {.s = 3};
    pd_rng_fill(&r, x, 5 * H, -2.0f, 2.0f);
    memcpy(x_before, x, sizeof x);
    uint32_t tokens[MAX_ROWS];
    uint64_t digests[MAX_ROWS];
    uint32_t n_tokens = 99;
    pd_err e = {0};
    ck_assert_msg(tail_sample(t, rows, 5, x, tokens, digests, &n_tokens, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(n_tokens, 3);
    ck_assert_int_eq(memcmp(x, x_before, sizeof x), 0); /* x is read only */
    const uint32_t want_rows[3] = {1, 3, 4};
    float *lg = malloc(V * sizeof *lg);
    ck_assert_ptr_nonnull(lg);
    for (uint32_t j = 0; j < 3; j++) {
        ref_logits(x + (size_t)want_rows[j] * H, lg);
        ck_assert_uint_eq(tokens[j], argmax(lg, V));
        ck_assert_uint_eq(digests[j], digest_f32(lg, V));
    }
    /* the three rows' tokens are not all the same, or order would go unseen */
    ck_assert(tokens[0] != tokens[1] || tokens[1] != tokens[2]);
    free(lg);
    tail_free(t);
}
END_TEST

START_TEST(tail_batch_without_logits_rows_samples_nothing)
{
    tail *t = tail_make(greedy, 1, 2);
    admit_ok(t, 1, 4, 1);
    const mb_row rows[2] = {{.stream = 1, .pos = 0}, {.stream = 1, .pos = 1}};
    float x[2 * 64] = {0};
    uint32_t tokens[MAX_ROWS], n_tokens = 99;
    uint64_t digests[MAX_ROWS];
    pd_err e = {0};
    ck_assert_int_eq(tail_sample(t, rows, 2, x, tokens, digests, &n_tokens, &e), PD_OK);
    ck_assert_uint_eq(n_tokens, 0);
    ck_assert_int_eq(tail_sample(t, rows, 0, x, tokens, digests, &n_tokens, &e), PD_OK);
    ck_assert_uint_eq(n_tokens, 0);
    tail_free(t);
}
END_TEST

/* Each stream's temperature sample is the sampler's pick for (seed, the
 * stream's page key, its token index) on that row's logits, and the same
 * whether the stream is sampled alone or beside another. */
START_TEST(tail_temperature_samples_per_stream_key_and_index)
{
    const sample_params temp = {.mode = SAMPLE_TEMP, .temperature = 1.5f, .top_p = 0.95f};
    const uint64_t seed = 99, key_a = sample_page_key("page-a"), key_b = sample_page_key("page-b");
    tail *both = tail_make(temp, seed, 4), *alone = tail_make(temp, seed, 4);
    admit_ok(both, 1, 6, key_a);
    admit_ok(both, 2, 6, key_b);
    admit_ok(alone, 1, 6, key_a);
    sampler *smp;
    pd_err e = {0};
    ck_assert_int_eq(sampler_new(V, &temp, NULL, seed, &smp, &e), PD_OK);
    int32_t hist_a[6];
    float x[2 * 64], *lg = malloc(V * sizeof *lg);
    ck_assert_ptr_nonnull(lg);
    pd_rng r = {.s = 5};
    for (uint32_t step = 0; step < 6; step++) {
        pd_rng_fill(&r, x, 2 * H, -3.0f, 3.0f);
        const mb_row rows[2] = {{.stream = 1, .pos = 10 + step, .role = MB_ROLE_DECODE, .wants_logits = 1},
                                {.stream = 2, .pos = 20 + step, .role = MB_ROLE_DECODE, .wants_logits = 1}};
        uint32_t tb[MAX_ROWS], ta[MAX_ROWS], nb, na;
        uint64_t db[MAX_ROWS], da[MAX_ROWS];
        ck_assert_int_eq(tail_sample(both, rows, 2, x, tb, db, &nb, &e), PD_OK);
        ck_assert_int_eq(tail_sample(alone, rows, 1, x, ta, da, &na, &e), PD_OK);
        ck_assert_uint_eq(nb, 2);
        ck_assert_uint_eq(na, 1);
        ck_assert_uint_eq(ta[0], tb[0]);
        ck_assert_uint_eq(da[0], db[0]);
        ref_logits(x, lg);
        int32_t want;
        ck_assert_int_eq(sampler_next_key(smp, lg, hist_a, step, key_a, step, &want, &e), PD_OK);
        ck_assert_int_eq((int32_t)tb[0], want);
        hist_a[step] = want;
    }
    sampler_free(smp);
    free(lg);
    tail_free(both);
    tail_free(alone);
}
END_TEST

START_TEST(tail_admission_refuses_duplicates_and_overflow)
{
    tail *t = tail_make(greedy, 1, 2);
    admit_ok(t, 5, 3, 0);
    mb_admit again = {.stream = 5, .max_new = 3};
    pd_err e = {0};
    ck_assert_int_eq(tail_admit(t, &again, &e), PD_ERR_ARG);
    ck_assert_msg(strstr(e.msg, "stream 5") && strstr(e.msg, "twice"), "%s", e.msg);
    admit_ok(t, 6, 3, 0);
    mb_admit third = {.stream = 8, .max_new = 3};
    pd_err_clear(&e);
    ck_assert_int_eq(tail_admit(t, &third, &e), PD_ERR_RANGE);
    ck_assert_msg(strstr(e.msg, "2 streams"), "%s", e.msg);
    /* retiring an unknown id changes nothing; retiring 5 frees its slot */
    tail_retire(t, 42);
    pd_err_clear(&e);
    ck_assert_int_eq(tail_admit(t, &third, &e), PD_ERR_RANGE);
    tail_retire(t, 5);
    admit_ok(t, 8, 3, 0);
    /* and its id: 5 may come back */
    tail_retire(t, 8);
    admit_ok(t, 5, 3, 0);
    tail_free(t);
    tail_free(NULL);
}
END_TEST

START_TEST(tail_refuses_rows_of_unknown_or_retired_streams)
{
    tail *t = tail_make(greedy, 1, 2);
    admit_ok(t, 1, 4, 0);
    float x[2 * 64] = {0};
    uint32_t tokens[MAX_ROWS], n_tokens;
    uint64_t digests[MAX_ROWS];
    pd_err e = {0};
    const mb_row unknown[1] = {{.stream = 77, .pos = 3, .role = MB_ROLE_DECODE, .wants_logits = 1}};
    ck_assert_int_eq(tail_sample(t, unknown, 1, x, tokens, digests, &n_tokens, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "unknown stream 77"), "%s", e.msg);
    /* a stream's rows are refused once it is retired */
    const mb_row one[1] = {{.stream = 1, .pos = 3, .role = MB_ROLE_DECODE, .wants_logits = 1}};
    ck_assert_int_eq(tail_sample(t, one, 1, x, tokens, digests, &n_tokens, &e), PD_OK);
    tail_retire(t, 1);
    pd_err_clear(&e);
    ck_assert_int_eq(tail_sample(t, one, 1, x, tokens, digests, &n_tokens, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "unknown stream 1"), "%s", e.msg);
    /* an unknown stream's row that wants no logits is not looked at */
    const mb_row quiet[1] = {{.stream = 77, .pos = 3, .role = MB_ROLE_PREFILL, .wants_logits = 0}};
    ck_assert_int_eq(tail_sample(t, quiet, 1, x, tokens, digests, &n_tokens, &e), PD_OK);
    tail_free(t);
}
END_TEST

/* A stream samples at most max_new tokens: the next logits row is refused,
 * naming the stream and the limit. A re-admitted id starts from token 0. */
START_TEST(tail_refuses_a_row_beyond_max_new)
{
    tail *t = tail_make(greedy, 1, 2);
    admit_ok(t, 4, 3, 0);
    float x[64];
    pd_rng r = {.s = 9};
    uint32_t tokens[MAX_ROWS], n_tokens;
    uint64_t digests[MAX_ROWS];
    pd_err e = {0};
    for (uint32_t i = 0; i < 3; i++) {
        pd_rng_fill(&r, x, H, -1.0f, 1.0f);
        const mb_row row[1] = {{.stream = 4, .pos = 8 + i, .role = MB_ROLE_DECODE, .wants_logits = 1}};
        ck_assert_msg(tail_sample(t, row, 1, x, tokens, digests, &n_tokens, &e) == PD_OK, "token %u: %s", i, e.msg);
        ck_assert_uint_eq(n_tokens, 1);
    }
    const mb_row fourth[1] = {{.stream = 4, .pos = 11, .role = MB_ROLE_DECODE, .wants_logits = 1}};
    ck_assert_int_eq(tail_sample(t, fourth, 1, x, tokens, digests, &n_tokens, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "stream 4") && strstr(e.msg, "token 4") && strstr(e.msg, "max_new 3"), "%s", e.msg);
    /* max_new 0: not even one */
    admit_ok(t, 5, 0, 0);
    const mb_row none[1] = {{.stream = 5, .pos = 2, .role = MB_ROLE_PREFILL, .wants_logits = 1}};
    pd_err_clear(&e);
    ck_assert_int_eq(tail_sample(t, none, 1, x, tokens, digests, &n_tokens, &e), PD_ERR_FORMAT);
    ck_assert_msg(strstr(e.msg, "max_new 0"), "%s", e.msg);
    /* a re-admitted id has a fresh budget */
    tail_retire(t, 4);
    admit_ok(t, 4, 1, 0);
    ck_assert_int_eq(tail_sample(t, fourth, 1, x, tokens, digests, &n_tokens, &e), PD_OK);
    ck_assert_uint_eq(n_tokens, 1);
    tail_free(t);
}
END_TEST

START_TEST(tail_refuses_more_logits_rows_than_max_rows)
{
    tail *t = tail_make(greedy, 1, 2);
    admit_ok(t, 1, 100, 0);
    mb_row rows[MAX_ROWS + 1];
    for (uint32_t i = 0; i <= MAX_ROWS; i++)
        rows[i] = (mb_row){.stream = 1, .pos = i, .role = MB_ROLE_PREFILL, .wants_logits = 1};
    float *x = calloc((MAX_ROWS + 1) * (size_t)H, sizeof *x);
    ck_assert_ptr_nonnull(x);
    uint32_t tokens[MAX_ROWS + 1], n_tokens;
    uint64_t digests[MAX_ROWS + 1];
    pd_err e = {0};
    ck_assert_int_eq(tail_sample(t, rows, MAX_ROWS + 1, x, tokens, digests, &n_tokens, &e), PD_ERR_RANGE);
    ck_assert_msg(strstr(e.msg, "8 logits rows"), "%s", e.msg);
    /* exactly max_rows is fine; extra rows without logits do not count */
    rows[MAX_ROWS].wants_logits = 0;
    ck_assert_int_eq(tail_sample(t, rows, MAX_ROWS + 1, x, tokens, digests, &n_tokens, &e), PD_OK);
    ck_assert_uint_eq(n_tokens, MAX_ROWS);
    free(x);
    tail_free(t);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("tail");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, tail_setup, tail_teardown);
    tcase_add_test(tc, tail_samples_rows_that_want_logits_in_row_order);
    tcase_add_test(tc, tail_batch_without_logits_rows_samples_nothing);
    tcase_add_test(tc, tail_temperature_samples_per_stream_key_and_index);
    tcase_add_test(tc, tail_admission_refuses_duplicates_and_overflow);
    tcase_add_test(tc, tail_refuses_rows_of_unknown_or_retired_streams);
    tcase_add_test(tc, tail_refuses_a_row_beyond_max_new);
    tcase_add_test(tc, tail_refuses_more_logits_rows_than_max_rows);
    suite_add_tcase(s, tc);
    return s;
}
