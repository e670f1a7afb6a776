/* Tests for cluster/model/sample.h: greedy ties, the (seed, page id, index) random
 * stream, top-k / top-p against a brute-force reference and at their exact
 * boundaries, the windowed no-repeat n-gram ban, and the CLI parsers. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/attn.h"
#include "cluster/model/sample.h"
#include "pd_test.h"

static sampler *make(uint32_t V, sample_params p, const sample_ngram *ng, uint64_t seed)
{
    sampler *s = NULL;
    pd_err err = {0};
    ck_assert_msg(sampler_new(V, &p, ng, seed, &s, &err) == PD_OK, "%s", err.msg);
    return s;
}

static int32_t next(sampler *s, const float *l, const int32_t *h, size_t nh, const char *id,
                    uint64_t idx)
{
    int32_t t = -7;
    pd_err err = {0};
    ck_assert_msg(sampler_next(s, l, h, nh, id, idx, &t, &err) == PD_OK, "%s", err.msg);
    sampler_check(s);
    return t;
}

static const sample_params GREEDY = {.mode = SAMPLE_GREEDY};

START_TEST(sample_greedy_picks_the_max_and_the_lowest_index_on_ties)
{
    float l[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, 2.0f};
    sampler *s = make(6, GREEDY, NULL, 1);
    ck_assert_int_eq(next(s, l, NULL, 0, "p", 0), 1);
    float z[3] = {-0.0f, 0.0f, -INFINITY};
    sampler *s3 = make(3, GREEDY, NULL, 1);
    ck_assert_int_eq(next(s3, z, NULL, 0, "p", 0), 0);
    float z2[3] = {-INFINITY, 0.0f, -0.0f};
    ck_assert_int_eq(next(s3, z2, NULL, 0, "p", 0), 1);
    sampler_free(s);
    sampler_free(s3);
    sampler_free(NULL);
}
END_TEST

START_TEST(sample_uniform_is_a_pure_function_of_seed_id_and_index)
{
    ck_assert(sample_uniform(7, "page-1", 3) == sample_uniform(7, "page-1", 3));
    int same_id = 0, same_seed = 0, same_index = 0;
    double mean = 0;
    int buckets[10] = {0};
    for (uint64_t i = 0; i < 4000; i++) {
        float u = sample_uniform(7, "page-1", i);
        ck_assert(u >= 0.0f && u < 1.0f);
        mean += u;
        buckets[(int)(u * 10)]++;
        same_id += u == sample_uniform(7, "page-2", i);
        same_seed += u == sample_uniform(8, "page-1", i);
        same_index += u == sample_uniform(7, "page-1", i + 1);
    }
    /* Different ids / seeds / indices: independent streams (a 24-bit value
     * repeats by chance about 4000 / 2^24 times). */
    ck_assert_int_le(same_id, 2);
    ck_assert_int_le(same_seed, 2);
    ck_assert_int_le(same_index, 2);
    mean /= 4000;
    ck_assert(fabs(mean - 0.5) < 0.02);
    for (int b = 0; b < 10; b++)
        ck_assert_int_gt(buckets[b], 320);
    /* The bytes of the id count, not the pointer. */
    char a[] = "abc", b[] = "abc";
    ck_assert(sample_uniform(1, a, 5) == sample_uniform(1, b, 5));
    ck_assert(sample_uniform(1, "ab", 5) != sample_uniform(1, "abc", 5));
}
END_TEST

/* The page key and the numbers drawn from it, pinned: values computed before
 * the key's FNV-1a loop moved to base/fnv.c. A change here changes every
 * sampled token of every page. */
START_TEST(sample_page_key_and_uniform_are_pinned)
{
    ck_assert_uint_eq(sample_page_key("p00000"), 0x08a2935a7995037dull);
    ck_assert_uint_eq(sample_page_key("p7"), 0x08d59107b575e088ull);
    ck_assert_uint_eq(sample_page_key(""), 0xcbf29ce484222325ull);
    ck_assert_uint_eq(sample_page_key(NULL), sample_page_key(""));
    ck_assert(sample_uniform(7, "page-1", 3) == 0x1.140af4p-1f);
    ck_assert(sample_uniform(0, "p00000", 0) == 0x1.70d22p-5f);
    ck_assert(sample_uniform_key(7, 0x08a2935a7995037dull, 3) == 0x1.72822ap-1f);
}
END_TEST

START_TEST(sample_tokens_do_not_depend_on_call_order_or_sampler)
{
    enum { V = 64, STEPS = 50 };
    sample_params p = {.mode = SAMPLE_TEMP, .temperature = 0.9f, .top_p = 0.95f, .top_k = 40};
    pd_rng r = {.s = 5};
    static float logits[STEPS][V];
    for (int i = 0; i < STEPS; i++)
        pd_rng_fill(&r, logits[i], V, -4, 4);
    int32_t a[STEPS], b[STEPS], c[STEPS];
    sampler *s1 = make(V, p, NULL, 99), *s2 = make(V, p, NULL, 99);
    for (int i = 0; i < STEPS; i++)
        a[i] = next(s1, logits[i], NULL, 0, "page-A", (uint64_t)i);
    /* Interleaved with another page, in reverse order, on another sampler. */
    for (int i = STEPS - 1; i >= 0; i--) {
        (void)next(s2, logits[STEPS - 1 - i], NULL, 0, "page-B", (uint64_t)i);
        b[i] = next(s2, logits[i], NULL, 0, "page-A", (uint64_t)i);
    }
    ck_assert_mem_eq(a, b, sizeof a);
    int diff = 0;
    for (int i = 0; i < STEPS; i++) {
        c[i] = next(s1, logits[i], NULL, 0, "page-C", (uint64_t)i);
        diff += c[i] != a[i];
    }
    ck_assert_int_gt(diff, 10); /* a different page draws differently */
    sampler_free(s1);
    sampler_free(s2);
}
END_TEST

/* ---- brute-force reference ------------------------------------------------ */

typedef struct cand {
    float l;
    int32_t i;
} cand;

static int cand_cmp(const void *x, const void *y)
{
    const cand *a = x, *b = y;
    if (a->l > b->l)
        return -1;
    if (a->l < b->l)
        return 1;
    return (a->i > b->i) - (a->i < b->i);
}

/* The documented algorithm, written plainly (qsort, no pruning). */
static int32_t reference(const float *l, uint32_t V, const sample_params *p, uint64_t seed,
                         const char *id, uint64_t index)
{
    cand *c = malloc(V * sizeof *c);
    float *cum = malloc(V * sizeof *cum);
    size_t m = 0;
    for (uint32_t i = 0; i < V; i++)
        if (l[i] != -INFINITY)
            c[m++] = (cand){.l = l[i] == 0.0f ? 0.0f : l[i], .i = (int32_t)i};
    qsort(c, m, sizeof *c, cand_cmp);
    size_t kept = p->top_k && p->top_k < m ? p->top_k : m;
    float z0 = c[0].l / p->temperature, sum = 0;
    for (size_t j = 0; j < kept; j++) {
        sum += pd_expf(c[j].l / p->temperature - z0);
        cum[j] = sum;
    }
    size_t L = kept;
    if (p->top_p < 1.0f) {
        float thr = p->top_p * sum;
        for (L = 0; L < kept; L++)
            if (cum[L] >= thr)
                break;
        L = L < kept ? L + 1 : kept;
    }
    float target = sample_uniform(seed, id, index) * cum[L - 1];
    int32_t t = -1;
    for (size_t j = 0; j < L && t < 0; j++)
        if (cum[j] > target)
            t = c[j].i;
    if (t < 0) {
        size_t j = L - 1;
        while (j > 0 && cum[j] == cum[j - 1])
            j--;
        t = c[j].i;
    }
    free(c);
    free(cum);
    return t;
}

START_TEST(sample_top_k_top_p_match_a_brute_force_reference)
{
    pd_rng r = {.s = 2024};
    const sample_params ps[] = {
        {.mode = SAMPLE_TEMP, .temperature = 1.0f, .top_p = 1.0f, .top_k = 0},
        {.mode = SAMPLE_TEMP, .temperature = 0.7f, .top_p = 0.9f, .top_k = 0},
        {.mode = SAMPLE_TEMP, .temperature = 1.3f, .top_p = 1.0f, .top_k = 5},
        {.mode = SAMPLE_TEMP, .temperature = 0.5f, .top_p = 0.5f, .top_k = 20},
        {.mode = SAMPLE_TEMP, .temperature = 2.0f, .top_p = 0.01f, .top_k = 0},
        {.mode = SAMPLE_TEMP, .temperature = 1.0f, .top_p = 1.0f, .top_k = 1},
        {.mode = SAMPLE_TEMP, .temperature = 0.05f, .top_p = 0.99f, .top_k = 100000},
    };
    for (size_t k = 0; k < sizeof ps / sizeof ps[0]; k++) {
        for (int it = 0; it < 60; it++) {
            uint32_t V = 2 + pd_rng_below(&r, 400);
            float *l = malloc(V * sizeof *l);
            for (uint32_t i = 0; i < V; i++) {
                uint32_t kind = pd_rng_below(&r, 10);
                /* coarse values make many exact ties; some -inf; a few far below */
                l[i] = kind == 0   ? -INFINITY
                       : kind < 5 ? (float)pd_rng_below(&r, 8) * 0.5f
                       : kind == 5 ? -200.0f
                                   : pd_rng_uniform(&r, -6, 6);
            }
            l[pd_rng_below(&r, V)] = 3.0f; /* at least one finite */
            sampler *s = make(V, ps[k], NULL, 31337);
            for (uint64_t idx = 0; idx < 8; idx++) {
                int32_t got = next(s, l, NULL, 0, "ref", idx * 977 + (uint64_t)it);
                int32_t want = reference(l, V, &ps[k], 31337, "ref", idx * 977 + (uint64_t)it);
                ck_assert_msg(got == want, "params %zu it %d V %u idx %lu: got %d want %d", k, it,
                              V, (unsigned long)idx, got, want);
            }
            sampler_free(s);
            free(l);
        }
    }
}
END_TEST

/* ---- the full-sort sampler this one replaced, kept as the reference --------
 *
 * sampler_pick's temperature path before partial selection (issue 17),
 * verbatim but for its scratch: every candidate's key radix-sorted, then the
 * kept sum, the top_p cut and the draw. The partial-selection sampler must
 * give the same token for every input. banned: [V] flags or NULL. */
static uint64_t fs_key(float logit, uint32_t i)
{
    if (logit == 0.0f)
        logit = 0.0f;
    uint32_t b;
    memcpy(&b, &logit, sizeof b);
    uint32_t asc = (b & 0x80000000u) ? ~b : b | 0x80000000u;
    return (uint64_t)~asc << 32 | i;
}

static void fs_radix(uint64_t *a, uint64_t *tmp, size_t n)
{
    static uint32_t count[3][2048];
    static const int shift[3] = {32, 43, 54};
    memset(count, 0, sizeof count);
    for (size_t i = 0; i < n; i++) {
        count[0][(a[i] >> 32) & 2047]++;
        count[1][(a[i] >> 43) & 2047]++;
        count[2][a[i] >> 54]++;
    }
    for (int p = 0; p < 3; p++) {
        uint32_t *c = count[p];
        if (n == 0 || c[(a[0] >> shift[p]) & 2047] == n)
            continue;
        uint32_t pos = 0;
        for (int d = 0; d < 2048; d++) {
            uint32_t k = c[d];
            c[d] = pos;
            pos += k;
        }
        for (size_t i = 0; i < n; i++)
            tmp[c[(a[i] >> shift[p]) & 2047]++] = a[i];
        memcpy(a, tmp, n * sizeof *a);
    }
}

static int32_t fullsort_pick(const float *logits, uint32_t V, const uint8_t *banned, const sample_params *p,
                             float u)
{
    int32_t best = -1;
    float best_l = -INFINITY;
    for (uint32_t i = 0; i < V; i++)
        if (!(banned && banned[i]) && logits[i] > best_l) {
            best_l = logits[i];
            best = (int32_t)i;
        }
    if (best < 0)
        return -1;
    uint64_t *keys = malloc(V * sizeof *keys), *tmp = malloc(V * sizeof *tmp);
    float *cum = malloc(V * sizeof *cum), *ex = malloc(V * sizeof *ex);
    const float T = p->temperature;
    const float z0 = best_l / T;
    size_t m = 0;
    for (uint32_t i = 0; i < V; i++) {
        float z = logits[i] / T - z0;
        if ((banned && banned[i]) || logits[i] == -INFINITY || z < -87.0f) {
            ex[i] = -INFINITY;
            continue;
        }
        ex[i] = z;
        keys[m++] = fs_key(logits[i], i);
    }
    pd_expf_n(ex, ex, V);
    fs_radix(keys, tmp, m);
    ck_assert(m >= 1 && (int32_t)(uint32_t)keys[0] == best);
    size_t kept = p->top_k && p->top_k < m ? p->top_k : m;
    float sum = 0.0f;
    for (size_t j = 0; j < kept; j++) {
        sum += ex[(uint32_t)keys[j]];
        cum[j] = sum;
    }
    size_t L = kept;
    if (p->top_p < 1.0f) {
        float thr = p->top_p * sum;
        for (L = 1; L < kept && cum[L - 1] < thr; L++)
            ;
    }
    float target = u * cum[L - 1];
    size_t pick = L;
    for (size_t j = 0; j < L; j++)
        if (cum[j] > target) {
            pick = j;
            break;
        }
    if (pick == L) {
        pick = L - 1;
        while (pick > 0 && cum[pick] == cum[pick - 1])
            pick--;
    }
    int32_t t = (int32_t)(uint32_t)keys[pick];
    free(keys);
    free(tmp);
    free(cum);
    free(ex);
    return t;
}

/* One logit vector of a shape that stresses a part of partial selection. */
static void fs_fill(pd_rng *r, float *l, uint32_t V, int shape)
{
    for (uint32_t i = 0; i < V; i++) {
        float g = pd_rng_uniform(r, -1, 1) + pd_rng_uniform(r, -1, 1) + pd_rng_uniform(r, -1, 1);
        switch (shape) {
        case 0: l[i] = 3.0f * g; break;                                  /* a trained model's spread */
        case 1: l[i] = 0.2f * g; break;                                  /* flat: everything has mass */
        case 2: l[i] = (float)pd_rng_below(r, 6) * 0.5f - 1.0f; break;   /* coarse: huge tie groups */
        case 3: l[i] = pd_rng_below(r, 4) == 0 ? -INFINITY : 4.0f * g; break; /* many -inf */
        case 4: l[i] = pd_rng_below(r, 2) ? 0.0f : -0.0f; break;          /* all zeros, both signs */
        case 5: l[i] = 1e30f * g; break;                                 /* huge: l / T overflows */
        case 6: l[i] = 2.0f * g - (i % 97 == 0 ? 0.0f : 25.0f); break;   /* peaked: a few far ahead */
        default: l[i] = 1e-30f * g; break;                               /* tiny differences */
        }
    }
    if (shape == 3 || shape == 5)
        l[pd_rng_below(r, V)] = 1.0f; /* at least one finite */
}

START_TEST(sample_partial_selection_draws_as_the_full_sort)
{
    pd_rng r = {.s = 17};
    static const uint32_t sizes[] = {1, 2, 3, 5, 17, 100, 257, 1000, 4099, 32000, 129280};
    static const float temps[] = {1e-30f, 1e-6f, 0.01f, 0.3f, 0.7f, 1.0f, 2.5f, 100.0f};
    static const float top_ps[] = {1.0f, 0.95f, 0.5f, 1e-3f, 1e-30f};
    static const uint32_t top_ks[] = {0, 1, 2, 7, 50, 1000, 200000};
    float *l = malloc(129280 * sizeof *l);
    uint8_t *banned = calloc(129280, 1);
    int32_t *hist = malloc(64 * sizeof *hist);
    long cases = 0;
    for (size_t vi = 0; vi < sizeof sizes / sizeof *sizes; vi++) {
        uint32_t V = sizes[vi];
        int reps = V >= 32000 ? 10 : 40; /* the big vocabularies cost most */
        for (int rep = 0; rep < reps; rep++) {
            int shape = (int)pd_rng_below(&r, 8);
            fs_fill(&r, l, V, shape);
            sample_params p = {.mode = SAMPLE_TEMP,
                               .temperature = temps[pd_rng_below(&r, 8)],
                               .top_p = top_ps[pd_rng_below(&r, 5)],
                               .top_k = top_ks[pd_rng_below(&r, 7)]};
            /* a third of the runs ban the tokens of a short history (n-gram 1) */
            size_t nh = 0;
            sample_ngram ng = {0};
            if (rep % 3 == 2 && V > 1) {
                ng = (sample_ngram){.n = 1, .window = 64};
                nh = 1 + pd_rng_below(&r, 20);
                for (size_t j = 0; j < nh; j++) {
                    hist[j] = (int32_t)pd_rng_below(&r, V);
                    banned[hist[j]] = 1;
                }
                int allowed = 0;
                for (uint32_t i = 0; i < V && !allowed; i++)
                    allowed = !banned[i] && l[i] != -INFINITY;
                if (!allowed)
                    l[0] = banned[0] ? l[0] : 0.5f;
            }
            bool any = false;
            for (uint32_t i = 0; i < V; i++)
                any |= !banned[i] && l[i] != -INFINITY;
            if (!any) { /* every token banned or -inf: both refuse; not a draw to compare */
                for (size_t j = 0; j < nh; j++)
                    banned[hist[j]] = 0;
                continue;
            }
            sampler *s = make(V, p, ng.n ? &ng : NULL, 99);
            for (uint64_t idx = 0; idx < 6; idx++) {
                uint64_t index = (uint64_t)rep * 131 + idx;
                int32_t got = next(s, l, hist, nh, "page", index);
                int32_t want = fullsort_pick(l, V, nh ? banned : NULL, &p, sample_uniform(99, "page", index));
                ck_assert_msg(got == want,
                              "V %u shape %d T %g top_p %g top_k %u bans %zu index %llu: got %d, full sort %d",
                              V, shape, (double)p.temperature, (double)p.top_p, p.top_k, nh,
                              (unsigned long long)index, got, want);
                cases++;
            }
            sampler_free(s);
            for (size_t j = 0; j < nh; j++)
                banned[hist[j]] = 0;
        }
    }
    ck_assert(cases > 1500);
    free(l);
    free(banned);
    free(hist);
}
END_TEST

/* The bound sample.c relies on, at the float level: adding a term below half
 * an ulp of a sum >= 1 leaves it unchanged, and pd_expf(0) is 1 (the first
 * term of every sum). */
START_TEST(sample_tiny_terms_leave_a_sum_unchanged)
{
    ck_assert(pd_expf(0.0f) == 1.0f);
    volatile float s = 1.0f, e = nextafterf(0x1p-24f, 0.0f);
    ck_assert(s + e == 1.0f);
    e = 0x1p-24f; /* exactly half an ulp: ties to even, still 1 */
    ck_assert(s + e == 1.0f);
    s = nextafterf(1.0f, 2.0f);
    ck_assert(s + e != s); /* ... but at an odd neighbour it rounds up: the bound must be strict */
}
END_TEST

/* Which tokens are ever drawn over many steps. */
static void drawn_set(const float *l, uint32_t V, sample_params p, bool *seen)
{
    sampler *s = make(V, p, NULL, 4);
    memset(seen, 0, V);
    for (uint64_t i = 0; i < 2000; i++)
        seen[next(s, l, NULL, 0, "set", i)] = true;
    sampler_free(s);
}

START_TEST(sample_top_k_boundary_breaks_ties_by_index)
{
    float l[5] = {1.0f, 3.0f, 3.0f, 3.0f, 2.0f};
    bool seen[5];
    drawn_set(l, 5, (sample_params){.mode = SAMPLE_TEMP, .temperature = 1, .top_p = 1, .top_k = 2},
              seen);
    ck_assert(!seen[0] && seen[1] && seen[2] && !seen[3] && !seen[4]);
    drawn_set(l, 5, (sample_params){.mode = SAMPLE_TEMP, .temperature = 1, .top_p = 1, .top_k = 4},
              seen);
    ck_assert(!seen[0] && seen[1] && seen[2] && seen[3] && seen[4]);
    drawn_set(l, 5, (sample_params){.mode = SAMPLE_TEMP, .temperature = 1, .top_p = 1, .top_k = 1},
              seen);
    ck_assert(!seen[0] && seen[1] && !seen[2] && !seen[3] && !seen[4]);
}
END_TEST

START_TEST(sample_top_p_boundary_is_inclusive)
{
    /* Four equal logits: e = 1 each, cum = 1, 2, 3, 4 exactly. top_p 0.5 ->
     * threshold 2.0 is reached by the second token: exactly two are kept. */
    float l[4] = {0.5f, 0.5f, 0.5f, 0.5f};
    bool seen[4];
    drawn_set(l, 4, (sample_params){.mode = SAMPLE_TEMP, .temperature = 1, .top_p = 0.5f}, seen);
    ck_assert(seen[0] && seen[1] && !seen[2] && !seen[3]);
    drawn_set(l, 4, (sample_params){.mode = SAMPLE_TEMP, .temperature = 1, .top_p = 0.5000001f},
              seen);
    ck_assert(seen[0] && seen[1] && seen[2] && !seen[3]);
    drawn_set(l, 4, (sample_params){.mode = SAMPLE_TEMP, .temperature = 1, .top_p = 0.25f}, seen);
    ck_assert(seen[0] && !seen[1] && !seen[2] && !seen[3]);
    drawn_set(l, 4, (sample_params){.mode = SAMPLE_TEMP, .temperature = 1, .top_p = 1.0f}, seen);
    ck_assert(seen[0] && seen[1] && seen[2] && seen[3]);
}
END_TEST

START_TEST(sample_frequencies_follow_the_softmax)
{
    float l[4] = {1.0f, 0.0f, -1.0f, 2.0f};
    sample_params p = {.mode = SAMPLE_TEMP, .temperature = 1.0f, .top_p = 1.0f};
    sampler *s = make(4, p, NULL, 77);
    int cnt[4] = {0};
    enum { N = 20000 };
    for (uint64_t i = 0; i < N; i++)
        cnt[next(s, l, NULL, 0, "freq", i)]++;
    double z = exp(1.0) + 1 + exp(-1.0) + exp(2.0);
    double want[4] = {exp(1.0) / z, 1 / z, exp(-1.0) / z, exp(2.0) / z};
    for (int i = 0; i < 4; i++)
        ck_assert_msg(fabs(cnt[i] / (double)N - want[i]) < 0.015, "token %d: %f vs %f", i,
                      cnt[i] / (double)N, want[i]);
    sampler_free(s);
    /* A tiny temperature is greedy. */
    sampler *cold = make(4, (sample_params){.mode = SAMPLE_TEMP, .temperature = 0.01f, .top_p = 1},
                         NULL, 77);
    for (uint64_t i = 0; i < 200; i++)
        ck_assert_int_eq(next(cold, l, NULL, 0, "cold", i), 3);
    sampler_free(cold);
}
END_TEST

/* ---- no-repeat n-gram ---------------------------------------------------------- */

static bool banned_has(const int32_t *b, size_t n, int32_t t)
{
    for (size_t i = 0; i < n; i++)
        if (b[i] == t)
            return true;
    return false;
}

START_TEST(sample_ngram_ban_examples)
{
    int32_t out[64];
    sample_ngram ng = {.n = 3, .window = 8};
    int32_t h1[] = {1, 2, 3, 1, 2};
    size_t k = sample_ngram_ban(&ng, h1, 5, out, 64);
    ck_assert_uint_eq(k, 1);
    ck_assert_int_eq(out[0], 3);
    int32_t h2[] = {1, 2, 3, 1, 2, 4, 1, 2};
    k = sample_ngram_ban(&ng, h2, 8, out, 64);
    ck_assert_uint_eq(k, 2);
    ck_assert(banned_has(out, k, 3) && banned_has(out, k, 4));
    /* The n-gram must lie entirely inside the last WINDOW tokens. */
    int32_t h3[] = {1, 2, 3, 9, 9, 9, 9, 9, 9, 1, 2};
    ck_assert_uint_eq(sample_ngram_ban(&ng, h3, 11, out, 64), 0);
    ng.window = 10; /* starts at index 1: [1 2 3] at index 0 still outside */
    ck_assert_uint_eq(sample_ngram_ban(&ng, h3, 11, out, 64), 0);
    ng.window = 11;
    k = sample_ngram_ban(&ng, h3, 11, out, 64);
    ck_assert_uint_eq(k, 1);
    ck_assert_int_eq(out[0], 3);
    /* Fewer than n tokens: nothing. n = 1: every token of the window. */
    ck_assert_uint_eq(sample_ngram_ban(&ng, h1, 2, out, 64), 0);
    sample_ngram one = {.n = 1, .window = 3};
    k = sample_ngram_ban(&one, h2, 8, out, 64);
    ck_assert_uint_eq(k, 3);
    ck_assert(banned_has(out, k, 4) && banned_has(out, k, 1) && banned_has(out, k, 2));
    ck_assert(!banned_has(out, k, 3));
    /* cap bounds the writes. */
    ck_assert_uint_eq(sample_ngram_ban(&one, h2, 8, out, 2), 2);
    sample_ngram off = {0};
    ck_assert_uint_eq(sample_ngram_ban(&off, h2, 8, out, 64), 0);
}
END_TEST

START_TEST(sample_ngram_ban_matches_brute_force)
{
    pd_rng r = {.s = 9};
    int32_t h[300], out[300];
    for (int it = 0; it < 400; it++) {
        size_t L = pd_rng_below(&r, 300);
        for (size_t i = 0; i < L; i++)
            h[i] = (int32_t)pd_rng_below(&r, 3);
        sample_ngram ng = {.n = 1 + pd_rng_below(&r, 6)};
        ng.window = ng.n + pd_rng_below(&r, 60);
        size_t k = sample_ngram_ban(&ng, h, L, out, 300);
        for (int32_t t = 0; t < 3; t++) {
            /* t is banned iff the last n-1 tokens ++ [t] equals some n-gram
             * h[i .. i+n) with L - window <= i and i + n <= L. */
            bool want = false;
            for (size_t i = 0; L >= ng.n && i + ng.n <= L; i++) {
                if (i + ng.window < L)
                    continue;
                bool eq = h[i + ng.n - 1] == t;
                for (size_t j = 0; eq && j + 1 < ng.n; j++)
                    eq = h[i + j] == h[L - (ng.n - 1) + j];
                want |= eq;
            }
            ck_assert_msg(banned_has(out, k, t) == want, "it %d token %d", it, t);
        }
    }
}
END_TEST

START_TEST(sample_ngram_ban_applies_before_sampling)
{
    /* The OCR setting 35:128 on a loop: after a 35-token phrase and 34 tokens
     * of its repeat, the token that would complete the repeat is banned. */
    enum { V = 100 };
    sample_ngram ng = {.n = 35, .window = 128};
    int32_t h[69];
    for (int i = 0; i < 69; i++)
        h[i] = (int32_t)(i % 35);
    float l[V];
    for (int i = 0; i < V; i++)
        l[i] = -(float)i * 0.01f;
    l[34] = 5.0f; /* the loop's next token is the favourite */
    l[50] = 4.0f;
    sampler *g = make(V, GREEDY, &ng, 1);
    ck_assert_int_eq(next(g, l, h, 69, "loop", 69), 50);
    ck_assert_int_eq(next(g, l, h, 68, "loop", 68), 34); /* 34-token repeat: no full n-gram yet */
    /* Temperature sampling never draws a banned token. */
    sampler *t = make(V, (sample_params){.mode = SAMPLE_TEMP, .temperature = 1, .top_p = 1, .top_k = 2},
                      &ng, 1);
    int n50 = 0;
    for (uint64_t i = 0; i < 300; i++) {
        int32_t k = next(t, l, h, 69, "loop", i); /* top 2 after the ban: 50 and 0 */
        ck_assert(k == 50 || k == 0);
        n50 += k == 50;
    }
    ck_assert_int_gt(n50, 250); /* e^4 : e^0 */
    /* Nothing allowed -> refused, scratch still clean. */
    float only[V];
    for (int i = 0; i < V; i++)
        only[i] = -INFINITY;
    only[34] = 1.0f;
    int32_t tok = -5;
    pd_err err = {0};
    ck_assert_int_eq(sampler_next(g, only, h, 69, "loop", 69, &tok, &err), PD_ERR_RANGE);
    ck_assert_str_eq(err.msg, "sampler: page \"loop\" step 69: no token allowed (all logits -inf "
                              "or banned)");
    ck_assert_int_eq(tok, -5);
    sampler_check(g);
    sampler_free(g);
    sampler_free(t);
}
END_TEST

START_TEST(sample_refuses_nan_and_positive_infinity)
{
    float l[3] = {0, NAN, 1};
    sampler *s = make(3, GREEDY, NULL, 1);
    int32_t t = -3;
    pd_err err = {0};
    ck_assert_int_eq(sampler_next(s, l, NULL, 0, "x", 0, &t, &err), PD_ERR_RANGE);
    ck_assert_str_eq(err.msg, "sampler: logit 1 is NaN");
    l[1] = INFINITY;
    pd_err_clear(&err);
    ck_assert_int_eq(sampler_next(s, l, NULL, 0, "x", 0, &t, &err), PD_ERR_RANGE);
    ck_assert_str_eq(err.msg, "sampler: logit 1 is +inf");
    ck_assert_int_eq(t, -3);
    sampler_free(s);
}
END_TEST

/* ---- parsers ------------------------------------------------------------------- */

START_TEST(sample_parse_accepts_the_cli_forms)
{
    sample_params p;
    pd_err err = {0};
    ck_assert_int_eq(sample_parse("greedy", &p, &err), PD_OK);
    ck_assert_int_eq(p.mode, SAMPLE_GREEDY);
    ck_assert_int_eq(sample_parse("temp:0.7", &p, &err), PD_OK);
    ck_assert_int_eq(p.mode, SAMPLE_TEMP);
    ck_assert(p.temperature == 0.7f && p.top_p == 1.0f && p.top_k == 0);
    ck_assert_int_eq(sample_parse("temp:0.7,top_p:0.9,top_k:40", &p, &err), PD_OK);
    ck_assert(p.temperature == 0.7f && p.top_p == 0.9f && p.top_k == 40);
    ck_assert_int_eq(sample_parse("top_k:5,temp:1e0", &p, &err), PD_OK);
    ck_assert(p.temperature == 1.0f && p.top_k == 5);
    sample_ngram ng;
    ck_assert_int_eq(sample_parse_ngram("35:128", &ng, &err), PD_OK);
    ck_assert(ng.n == 35 && ng.window == 128);
    ck_assert_int_eq(sample_parse_ngram("off", &ng, &err), PD_OK);
    ck_assert_uint_eq(ng.n, 0);
}
END_TEST

START_TEST(sample_parse_refuses_with_clear_errors)
{
    struct {
        const char *s, *msg;
    } bad[] = {
        {"", "sampling \"\": expected \"greedy\" or \"temp:T[,top_p:P][,top_k:K]\""},
        {"Greedy", "sampling \"Greedy\": expected \"greedy\" or \"temp:T[,top_p:P][,top_k:K]\""},
        {"temp", "sampling \"temp\": expected \"greedy\" or \"temp:T[,top_p:P][,top_k:K]\""},
        {"temp:0", "sampling \"temp:0\": temp 0 must be in (0, 100] (use \"greedy\" for "
                   "argmax)"},
        {"temp:-1", "sampling \"temp:-1\": temp -1 must be in (0, 100] (use \"greedy\" "
                    "for argmax)"},
        {"temp:abc", "sampling \"temp:abc\": temp \"abc\" is not a number"},
        {"temp:nan", "sampling \"temp:nan\": temp \"nan\" is not a number"},
        {"temp:1,top_p:0", "sampling \"temp:1,top_p:0\": top_p 0 must be in (0, 1]"},
        {"temp:1,top_p:1.5", "sampling \"temp:1,top_p:1.5\": top_p 1.5 must be in (0, 1]"},
        {"temp:1,top_k:-1", "sampling \"temp:1,top_k:-1\": top_k \"-1\" is not an integer in "
                            "[0, 4294967295]"},
        {"temp:1,top_k:1.5", "sampling \"temp:1,top_k:1.5\": top_k \"1.5\" is not an integer in "
                             "[0, 4294967295]"},
        {"temp:1,topk:3", "sampling \"temp:1,topk:3\": unknown key \"topk\"; expected \"greedy\" or "
                          "\"temp:T[,top_p:P][,top_k:K]\""},
        {"temp:1,temp:2", "sampling \"temp:1,temp:2\": \"temp\" given twice"},
        {"top_p:0.5", "sampling \"top_p:0.5\": temp is required; expected \"greedy\" or "
                      "\"temp:T[,top_p:P][,top_k:K]\""},
        {"temp:1,", "sampling \"temp:1,\": expected \"greedy\" or \"temp:T[,top_p:P][,top_k:K]\""},
        {"temp: 1", "sampling \"temp: 1\": temp \" 1\" is not a number"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        sample_params p = {.mode = SAMPLE_TEMP, .temperature = 42};
        pd_err err = {0};
        ck_assert_msg(sample_parse(bad[i].s, &p, &err) != PD_OK, "case %zu accepted", i);
        ck_assert_msg(!strcmp(err.msg, bad[i].msg), "case %zu:\n got  %s\n want %s", i, err.msg,
                      bad[i].msg);
        ck_assert(p.temperature == 42); /* untouched */
    }
    struct {
        const char *s, *msg;
    } badng[] = {
        {"35", "no-repeat n-gram \"35\": expected N:WINDOW (e.g. 35:128) or off"},
        {"a:b", "no-repeat n-gram \"a:b\": expected N:WINDOW (e.g. 35:128) or off"},
        {"35:128:1", "no-repeat n-gram \"35:128:1\": expected N:WINDOW (e.g. 35:128) or off"},
        {"0:5", "no-repeat n-gram \"0:5\": N must be >= 1 (or \"off\")"},
        {"5:3", "no-repeat n-gram \"5:3\": window 3 must be in [n = 5, 1048576]"},
        {"5:2000000", "no-repeat n-gram \"5:2000000\": window 2000000 must be in [n = 5, 1048576]"},
    };
    for (size_t i = 0; i < sizeof badng / sizeof badng[0]; i++) {
        sample_ngram ng = {.n = 9, .window = 9};
        pd_err err = {0};
        ck_assert_msg(sample_parse_ngram(badng[i].s, &ng, &err) != PD_OK, "ng case %zu", i);
        ck_assert_msg(!strcmp(err.msg, badng[i].msg), "ng case %zu:\n got  %s\n want %s", i,
                      err.msg, badng[i].msg);
        ck_assert(ng.n == 9 && ng.window == 9);
    }
    /* Programmatic params are validated too. */
    sampler *s = (sampler *)bad;
    pd_err err = {0};
    sample_params p = {.mode = SAMPLE_TEMP, .temperature = 1, .top_p = 0};
    ck_assert_int_eq(sampler_new(10, &p, NULL, 0, &s, &err), PD_ERR_RANGE);
    ck_assert_ptr_eq(s, (sampler *)bad);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("sample");
    TCase *tc = tcase_create("sample");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, sample_greedy_picks_the_max_and_the_lowest_index_on_ties);
    tcase_add_test(tc, sample_uniform_is_a_pure_function_of_seed_id_and_index);
    tcase_add_test(tc, sample_page_key_and_uniform_are_pinned);
    tcase_add_test(tc, sample_tokens_do_not_depend_on_call_order_or_sampler);
    tcase_add_test(tc, sample_top_k_top_p_match_a_brute_force_reference);
    tcase_add_test(tc, sample_partial_selection_draws_as_the_full_sort);
    tcase_add_test(tc, sample_tiny_terms_leave_a_sum_unchanged);
    tcase_add_test(tc, sample_top_k_boundary_breaks_ties_by_index);
    tcase_add_test(tc, sample_top_p_boundary_is_inclusive);
    tcase_add_test(tc, sample_frequencies_follow_the_softmax);
    tcase_add_test(tc, sample_ngram_ban_examples);
    tcase_add_test(tc, sample_ngram_ban_matches_brute_force);
    tcase_add_test(tc, sample_ngram_ban_applies_before_sampling);
    tcase_add_test(tc, sample_refuses_nan_and_positive_infinity);
    tcase_add_test(tc, sample_parse_accepts_the_cli_forms);
    tcase_add_test(tc, sample_parse_refuses_with_clear_errors);
    suite_add_tcase(s, tc);
    return s;
}
