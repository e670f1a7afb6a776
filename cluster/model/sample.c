/* sample: greedy and temperature/top-k/top-p sampling with a per-(seed, page,
 * index) random stream and the windowed no-repeat n-gram ban (rules in
 * sample.h). Owns preallocated scratch only; the order of every sum is fixed. */
#include "cluster/model/sample.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/attn.h"
#include "base/check.h"
#include "base/fnv.h"

/* pd_expf returns exactly 0 below this (attn.h), so such candidates can never
 * be drawn and add nothing to a sum: they are dropped before sorting. */
#define SAMPLE_EXP_FLOOR (-87.0f)
#define SAMPLE_BUCKET_SCALE 16.0f /* sample_cut's buckets per unit of z */
/* bucket k: candidates with floor(-z * 16) == k; -z in [0, 87] */
#define SAMPLE_BUCKETS (87 * 16 + 1)

/* INV: mask[i] == 0 for every i between calls; n_ban_cap >= ng.window. */
struct sampler {
    uint32_t vocab;
    sample_params p;
    sample_ngram ng;
    uint64_t seed;
    uint64_t *keys;  /* [vocab] sort keys of the candidates sample_gather keeps */
    uint64_t *tmp;   /* [vocab] radix sort buffer */
    float *cum;      /* [vocab] running sums in sorted order */
    float *z;        /* [vocab] by token: z_i - z_0 for a candidate, -inf for the rest */
    float *ex;       /* [vocab] by token: pd_expf(z[i]) (0 for non-candidates) */
    uint8_t *mask;   /* [vocab] banned flags, cleared after each step */
    int32_t *ban;    /* [n_ban_cap] */
    uint32_t count[3][2048]; /* radix histograms */
    float bsum[SAMPLE_BUCKETS], bmax[SAMPLE_BUCKETS + 1]; /* sample_cut's histogram by z */
    uint32_t bcnt[SAMPLE_BUCKETS];
    size_t n_ban_cap;
};

/* ---- random stream --------------------------------------------------------- */

static uint64_t sample_mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

uint64_t sample_page_key(const char *page_id)
{
    return pd_fnv_str(page_id); /* FNV-1a 64 of the id bytes; NULL = "" */
}

float sample_uniform(uint64_t seed, const char *page_id, uint64_t index)
{
    return sample_uniform_key(seed, sample_page_key(page_id), index);
}

float sample_uniform_key(uint64_t seed, uint64_t h, uint64_t index)
{
    uint64_t stream = sample_mix(sample_mix(seed ^ 0x9e3779b97f4a7c15ull) ^ h);
    uint64_t x = sample_mix(stream + (index + 1) * 0x9e3779b97f4a7c15ull);
    return (float)(x >> 40) * (1.0f / 16777216.0f);
}

/* ---- parsing ------------------------------------------------------------------ */

/* ctx starts the message: "sampling" or "sampling \"temp:0\"". */
static pd_status sample_validate(const sample_params *p, const char *ctx, pd_err *err)
{
    if (p->mode == SAMPLE_GREEDY)
        return PD_OK;
    if (p->mode != SAMPLE_TEMP)
        return pd_err_set(err, PD_ERR_ARG, "%s: unknown mode %d", ctx, (int)p->mode);
    if (!(p->temperature > 0.0f) || !(p->temperature <= SAMPLE_MAX_TEMP))
        return pd_err_set(err, PD_ERR_RANGE,
                          "%s: temp %g must be in (0, %g] (use \"greedy\" for argmax)", ctx,
                          (double)p->temperature, (double)SAMPLE_MAX_TEMP);
    if (!(p->top_p > 0.0f) || !(p->top_p <= 1.0f))
        return pd_err_set(err, PD_ERR_RANGE, "%s: top_p %g must be in (0, 1]", ctx,
                          (double)p->top_p);
    return PD_OK;
}

static pd_status sample_validate_ngram(const sample_ngram *ng, const char *ctx, pd_err *err)
{
    if (ng->n == 0)
        return PD_OK;
    if (ng->window < ng->n || ng->window > SAMPLE_MAX_NGRAM_WINDOW)
        return pd_err_set(err, PD_ERR_RANGE,
                          "%s: window %" PRIu32 " must be in [n = %" PRIu32 ", %u]", ctx,
                          ng->window, ng->n, SAMPLE_MAX_NGRAM_WINDOW);
    return PD_OK;
}

/* Parses a decimal unsigned integer filling [s, s + n) exactly. */
static bool sample_uint(const char *s, size_t n, uint64_t max, uint64_t *v)
{
    if (n == 0 || n > 20)
        return false;
    uint64_t x = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        unsigned d = (unsigned)(s[i] - '0');
        if (x > (max - d) / 10)
            return false;
        x = x * 10 + d;
    }
    *v = x;
    return true;
}

/* Parses a finite decimal float filling [s, s + n) exactly. */
static bool sample_float(const char *s, size_t n, float *v)
{
    char buf[48];
    if (n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if (!strchr("0123456789.eE+-", buf[i]))
            return false; /* no "inf", "nan", hex floats or spaces */
    char *end;
    errno = 0;
    double d = strtod(buf, &end);
    if (end != buf + n || errno || !isfinite(d))
        return false;
    *v = (float)d;
    return true;
}

#define SAMPLE_USAGE "expected \"greedy\" or \"temp:T[,top_p:P][,top_k:K]\""

pd_status sample_parse(const char *s, sample_params *out, pd_err *err)
{
    if (!s || !out)
        return pd_err_set(err, PD_ERR_ARG, "sampling: NULL argument");
    if (!strcmp(s, "greedy")) {
        *out = (sample_params){.mode = SAMPLE_GREEDY, .temperature = 1.0f, .top_p = 1.0f};
        return PD_OK;
    }
    sample_params p = {.mode = SAMPLE_TEMP, .temperature = 0.0f, .top_p = 1.0f, .top_k = 0};
    bool seen[3] = {false, false, false};
    for (const char *c = s;;) {
        const char *comma = strchr(c, ',');
        size_t n = comma ? (size_t)(comma - c) : strlen(c);
        const char *colon = memchr(c, ':', n);
        if (!colon)
            return pd_err_set(err, PD_ERR_ARG, "sampling \"%s\": %s", s, SAMPLE_USAGE);
        size_t kl = (size_t)(colon - c);
        const char *val = colon + 1;
        size_t vl = n - kl - 1;
        int k = kl == 4 && !memcmp(c, "temp", 4)    ? 0
                : kl == 5 && !memcmp(c, "top_p", 5) ? 1
                : kl == 5 && !memcmp(c, "top_k", 5) ? 2
                                                    : -1;
        if (k < 0)
            return pd_err_set(err, PD_ERR_ARG, "sampling \"%s\": unknown key \"%.*s\"; %s", s,
                              (int)kl, c, SAMPLE_USAGE);
        if (seen[k])
            return pd_err_set(err, PD_ERR_ARG, "sampling \"%s\": \"%.*s\" given twice", s, (int)kl,
                              c);
        seen[k] = true;
        if (k == 2) {
            uint64_t v;
            if (!sample_uint(val, vl, UINT32_MAX, &v))
                return pd_err_set(err, PD_ERR_ARG,
                                  "sampling \"%s\": top_k \"%.*s\" is not an integer in [0, %u]", s,
                                  (int)vl, val, UINT32_MAX);
            p.top_k = (uint32_t)v;
        } else {
            float v;
            if (!sample_float(val, vl, &v))
                return pd_err_set(err, PD_ERR_ARG, "sampling \"%s\": %s \"%.*s\" is not a number",
                                  s, k == 0 ? "temp" : "top_p", (int)vl, val);
            if (k == 0)
                p.temperature = v;
            else
                p.top_p = v;
        }
        if (!comma)
            break;
        c = comma + 1;
    }
    if (!seen[0])
        return pd_err_set(err, PD_ERR_ARG, "sampling \"%s\": temp is required; %s", s, SAMPLE_USAGE);
    char ctx[96];
    snprintf(ctx, sizeof ctx, "sampling \"%.80s\"", s);
    pd_status st = sample_validate(&p, ctx, err);
    if (st != PD_OK)
        return st;
    *out = p;
    return PD_OK;
}

pd_status sample_parse_ngram(const char *s, sample_ngram *out, pd_err *err)
{
    if (!s || !out)
        return pd_err_set(err, PD_ERR_ARG, "no-repeat n-gram: NULL argument");
    if (!strcmp(s, "off")) {
        *out = (sample_ngram){0};
        return PD_OK;
    }
    const char *colon = strchr(s, ':');
    uint64_t n, w;
    if (!colon || !sample_uint(s, (size_t)(colon - s), UINT32_MAX, &n) ||
        !sample_uint(colon + 1, strlen(colon + 1), UINT32_MAX, &w))
        return pd_err_set(err, PD_ERR_ARG,
                          "no-repeat n-gram \"%s\": expected N:WINDOW (e.g. 35:128) or off", s);
    if (n == 0)
        return pd_err_set(err, PD_ERR_RANGE, "no-repeat n-gram \"%s\": N must be >= 1 (or \"off\")",
                          s);
    sample_ngram ng = {.n = (uint32_t)n, .window = (uint32_t)w};
    char ctx[96];
    snprintf(ctx, sizeof ctx, "no-repeat n-gram \"%.60s\"", s);
    pd_status st = sample_validate_ngram(&ng, ctx, err);
    if (st != PD_OK)
        return st;
    *out = ng;
    return PD_OK;
}

/* ---- the n-gram ban ---------------------------------------------------------- */

size_t sample_ngram_ban(const sample_ngram *ng, const int32_t *hist, size_t n_hist, int32_t *out,
                        size_t cap)
{
    if (!ng || ng->n == 0 || n_hist < ng->n)
        return 0;
    size_t n = ng->n;
    const int32_t *prefix = hist + n_hist - (n - 1);
    size_t start = n_hist > ng->window ? n_hist - ng->window : 0;
    size_t k = 0;
    for (size_t i = start; i + n <= n_hist; i++) {
        if (memcmp(hist + i, prefix, (n - 1) * sizeof *hist) != 0)
            continue;
        if (k < cap)
            out[k] = hist[i + n - 1];
        k++;
    }
    return k < cap ? k : cap;
}

/* ---- sampler ---------------------------------------------------------------------- */

pd_status sampler_new(uint32_t vocab_size, const sample_params *p, const sample_ngram *ng,
                      uint64_t seed, sampler **out, pd_err *err)
{
    if (!p || !out)
        return pd_err_set(err, PD_ERR_ARG, "sampler: NULL params or output");
    if (vocab_size == 0 || vocab_size > (uint32_t)INT32_MAX)
        return pd_err_set(err, PD_ERR_ARG, "sampler: vocab size %" PRIu32 " invalid", vocab_size);
    pd_status st = sample_validate(p, "sampling", err);
    sample_ngram none = {0};
    if (!ng)
        ng = &none;
    if (st == PD_OK)
        st = sample_validate_ngram(ng, "no-repeat n-gram", err);
    if (st != PD_OK)
        return st;
    sampler *s = calloc(1, sizeof *s);
    if (s) {
        s->n_ban_cap = ng->n ? ng->window : 1;
        s->keys = malloc((size_t)vocab_size * sizeof *s->keys);
        s->tmp = malloc((size_t)vocab_size * sizeof *s->tmp);
        s->cum = malloc((size_t)vocab_size * sizeof *s->cum);
        s->ex = malloc((size_t)vocab_size * sizeof *s->ex);
        s->z = malloc((size_t)vocab_size * sizeof *s->z);
        s->mask = calloc(vocab_size, 1);
        s->ban = malloc(s->n_ban_cap * sizeof *s->ban);
    }
    if (!s || !s->keys || !s->tmp || !s->cum || !s->ex || !s->z || !s->mask || !s->ban) {
        sampler_free(s);
        return pd_err_set(err, PD_ERR_NOMEM, "sampler: no memory for %" PRIu32 " logits",
                          vocab_size);
    }
    s->vocab = vocab_size;
    s->p = *p;
    s->ng = *ng;
    s->seed = seed;
    *out = s;
    return PD_OK;
}

void sampler_free(sampler *s)
{
    if (!s)
        return;
    free(s->keys);
    free(s->tmp);
    free(s->cum);
    free(s->ex);
    free(s->z);
    free(s->mask);
    free(s->ban);
    free(s);
}

/* Sort key: ascending key order == (logit desc, index asc). -0.0 counts as +0.0. */
static uint64_t sample_key(float logit, uint32_t i)
{
    if (logit == 0.0f)
        logit = 0.0f;
    uint32_t b;
    memcpy(&b, &logit, sizeof b);
    uint32_t asc = (b & 0x80000000u) ? ~b : b | 0x80000000u; /* ascending with the value */
    return (uint64_t)~asc << 32 | i;
}

/* Stable LSD radix sort of a[0..n) by the high 32 bits only (3 passes of
 * 11/11/10 bits; a pass where every key has the same digit is skipped). The
 * keys are built in ascending index order, so stability alone puts equal
 * logits in ascending index order. Result in a. */
static void sample_radix(uint64_t *a, uint64_t *tmp, size_t n, uint32_t (*count)[2048])
{
    static const int shift[3] = {32, 43, 54};
    memset(count, 0, 3 * sizeof *count);
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

/* ---- partial selection ------------------------------------------------------
 *
 * The draw (sample.h) sums the kept candidates' exponentials in sorted order.
 * Sorting all of them is what cost the time (a 129k vocabulary); most of
 * them cannot change any sum: adding e >= 0 to a float running sum S leaves
 * S unchanged when e < ulp(S) / 2. So only a prefix P of the sorted order is
 * sorted: the candidates in the buckets (of 1/16 of z) above a cut chosen
 * so that every candidate below it has e < ulp(S) / 2 for a lower bound S of
 * the running sum once P is summed, or, with top_k, up to the bucket that
 * holds the top_k-th candidate if that comes first. Then every later cum_j
 * equals the last of P, so the full-sort rules give the same kept sum, the
 * same top_p cut (it either ends inside P or at the last kept token, whose
 * cum is that of P's end) and the same draw (a token whose cum equals its
 * predecessor's is never drawn; the fallback walks back to P's end).
 * The bound is checked on the actual e values (a max over the rest), so it
 * needs nothing of pd_expf but e >= 0. P is a prefix of the sorted order
 * because z is monotone in the logit (division by T > 0 and the subtraction
 * round monotonically), and ties of logit share z. */

#define SAMPLE_ALL UINT32_MAX /* sample_cut: every candidate (NaN z included) */

static inline uint32_t sample_bucket(float z)
{
    return (uint32_t)(-z * SAMPLE_BUCKET_SCALE); /* truncation of a value >= 0 is floor */
}

/* Returns c: the prefix to sort is the candidates of buckets < c, or every
 * candidate for SAMPLE_ALL. c is the least of: the first bucket from which
 * on no candidate can change a sum, and (top_k > 0) the first bucket by which
 * top_k candidates are counted — the top_k boundary then lies inside the
 * prefix, in its last bucket. */
static uint32_t sample_cut(sampler *s, int32_t best, uint32_t top_k, uint64_t *n_cut)
{
    *n_cut = s->vocab;
    float *bsum = s->bsum, *bmax = s->bmax;
    uint32_t *bcnt = s->bcnt;
    memset(bsum, 0, SAMPLE_BUCKETS * sizeof *bsum);
    memset(bmax, 0, (SAMPLE_BUCKETS + 1) * sizeof *bmax);
    memset(bcnt, 0, SAMPLE_BUCKETS * sizeof *bcnt);
    for (uint32_t i = 0; i < s->vocab; i++) {
        float z = s->z[i], e = s->ex[i];
        if (z == -INFINITY)
            continue;
        if (!(z <= 0.0f && z >= SAMPLE_EXP_FLOOR) || !(e >= 0.0f))
            return SAMPLE_ALL; /* NaN from an overflowing logit / T: the full-sort path's every step */
        uint32_t k = sample_bucket(z);
        bsum[k] += e;
        bmax[k] = e > bmax[k] ? e : bmax[k];
        bcnt[k]++;
    }
    for (int k = SAMPLE_BUCKETS - 1; k >= 0; k--) /* bmax[k]: max over buckets >= k */
        if (bmax[k + 1] > bmax[k])
            bmax[k] = bmax[k + 1];
    /* The running sum after P is >= the first term e0 (best's, z = 0) and,
     * for up to 2^22 terms, >= half of any other float summation of P
     * (recursive summation's relative error stays below 1/3); a quarter of
     * the bucket sums is used. */
    const float e0 = s->ex[best];
    if (!(e0 > 0.0f))
        return SAMPLE_ALL;
    float above = 0.0f;
    uint64_t count = 0;
    for (uint32_t c = 1; c <= SAMPLE_BUCKETS; c++) {
        above += bsum[c - 1];
        count += bcnt[c - 1];
        *n_cut = count;
        if (top_k && count >= top_k)
            return c;
        float lower = s->vocab <= (1u << 22) && 0.25f * above > e0 ? 0.25f * above : e0;
        int e2;
        frexpf(lower, &e2); /* lower in [2^(e2-1), 2^e2): ulp 2^(e2-24) */
        if (bmax[c] < ldexpf(1.0f, e2 - 25))
            return c;
    }
    *n_cut = s->vocab;
    return SAMPLE_ALL;
}

/* Writes to keys the sort keys of the candidates of buckets < c (every
 * candidate for SAMPLE_ALL), in index order, and returns how many. */
static size_t sample_gather(sampler *s, const float *logits, uint32_t c, uint64_t n_cut)
{
    size_t m = 0;
    if (c == SAMPLE_ALL) {
        for (uint32_t i = 0; i < s->vocab; i++)
            if (s->z[i] != -INFINITY)
                s->keys[m++] = sample_key(logits[i], i);
        return m;
    }
    /* bucket(z) < c  <=>  -16 z < c  <=>  z > -c / 16 (both exact); -inf
     * fails. A few kept (n_cut of them): a branch the predictor gets right;
     * many: branch-free, a key written at every index, kept by advancing m. */
    const float zc = -(float)c / SAMPLE_BUCKET_SCALE;
    if (n_cut < s->vocab / 8) {
        for (uint32_t i = 0; i < s->vocab; i++)
            if (s->z[i] > zc)
                s->keys[m++] = sample_key(logits[i], i);
    } else {
        for (uint32_t i = 0; i < s->vocab; i++) {
            s->keys[m] = sample_key(logits[i], i);
            m += s->z[i] > zc;
        }
    }
    CHECK(m == n_cut);
    return m;
}

/* The largest logit (-inf if none is larger), and whether any is NaN or
 * +inf. In blocks of 8 lanes so the compiler can vectorize it: "x > m ? x : m"
 * is exactly a SIMD max, and the first index of the max is found after. */
static float sample_max(const float *l, uint32_t V, bool *bad)
{
    float m[8];
    int b[8];
    for (int k = 0; k < 8; k++) {
        m[k] = -INFINITY;
        b[k] = 0;
    }
    uint32_t i = 0;
    for (; i + 8 <= V; i += 8)
        for (int k = 0; k < 8; k++) {
            float x = l[i + k];
            b[k] |= (x != x) | (x == INFINITY);
            m[k] = x > m[k] ? x : m[k];
        }
    for (; i < V; i++) {
        float x = l[i];
        b[0] |= (x != x) | (x == INFINITY);
        m[0] = x > m[0] ? x : m[0];
    }
    for (int k = 1; k < 8; k++) {
        m[0] = m[k] > m[0] ? m[k] : m[0];
        b[0] |= b[k];
    }
    *bad = b[0] != 0;
    return m[0];
}

/* z[i] = logits[i] / T - z0 for a candidate, -inf for a -inf logit or below
 * SAMPLE_EXP_FLOOR (banned tokens are set -inf by the caller). */
static void sample_z(const float *l, uint32_t V, float T, float z0, float *z)
{
    uint32_t i = 0;
    for (; i + 8 <= V; i += 8)
        for (int k = 0; k < 8; k++) {
            float x = l[i + k], v = x / T - z0;
            z[i + k] = x == -INFINITY || v < SAMPLE_EXP_FLOOR ? -INFINITY : v;
        }
    for (; i < V; i++) {
        float v = l[i] / T - z0;
        z[i] = l[i] == -INFINITY || v < SAMPLE_EXP_FLOOR ? -INFINITY : v;
    }
}

static void sample_unban(sampler *s, size_t n_ban)
{
    for (size_t i = 0; i < n_ban; i++)
        s->mask[s->ban[i]] = 0;
}

static pd_status sampler_pick(sampler *s, const float *logits, const int32_t *hist, size_t n_hist,
                              const char *page_id, uint64_t page_key, uint64_t index, int32_t *token,
                              pd_err *err);

pd_status sampler_next(sampler *s, const float *logits, const int32_t *hist, size_t n_hist,
                       const char *page_id, uint64_t index, int32_t *token, pd_err *err)
{
    return sampler_pick(s, logits, hist, n_hist, page_id ? page_id : "", sample_page_key(page_id), index,
                        token, err);
}

pd_status sampler_next_key(sampler *s, const float *logits, const int32_t *hist, size_t n_hist,
                           uint64_t page_key, uint64_t index, int32_t *token, pd_err *err)
{
    return sampler_pick(s, logits, hist, n_hist, NULL, page_key, index, token, err);
}

/* page_id names the page in messages when known (else its key does). */
static pd_status sampler_pick(sampler *s, const float *logits, const int32_t *hist, size_t n_hist,
                              const char *page_id, uint64_t page_key, uint64_t index, int32_t *token,
                              pd_err *err)
{
    if (!s || !logits || !token || (!hist && n_hist))
        return pd_err_set(err, PD_ERR_ARG, "sampler: NULL argument");
    uint32_t V = s->vocab;
    bool nonfinite;
    float mx = sample_max(logits, V, &nonfinite);
    for (uint32_t i = 0; nonfinite && i < V; i++)
        if (isnan(logits[i]) || logits[i] == INFINITY)
            return pd_err_set(err, PD_ERR_RANGE, "sampler: logit %" PRIu32 " is %s", i,
                              isnan(logits[i]) ? "NaN" : "+inf");
    size_t n_ban = sample_ngram_ban(&s->ng, hist, n_hist, s->ban, s->n_ban_cap);
    for (size_t i = 0; i < n_ban; i++) {
        if (s->ban[i] < 0 || (uint32_t)s->ban[i] >= V) {
            int32_t bad = s->ban[i];
            return pd_err_set(err, PD_ERR_RANGE, "sampler: history token %" PRId32
                              " outside the vocabulary [0, %" PRIu32 ")", bad, V);
        }
    }
    for (size_t i = 0; i < n_ban; i++)
        s->mask[s->ban[i]] = 1;

    /* the first index of the largest allowed logit */
    int32_t best = -1;
    float best_l = -INFINITY;
    if (n_ban == 0) {
        for (uint32_t i = 0; mx != -INFINITY && best < 0 && i < V; i++)
            if (logits[i] == mx) { /* -0.0 == 0.0: the first of either, as "> best_l" picks */
                best_l = logits[i];
                best = (int32_t)i;
            }
    } else {
        for (uint32_t i = 0; i < V; i++)
            if (!s->mask[i] && logits[i] > best_l) {
                best_l = logits[i];
                best = (int32_t)i;
            }
    }
    if (best < 0) {
        sample_unban(s, n_ban);
        if (page_id)
            return pd_err_set(err, PD_ERR_RANGE,
                              "sampler: page \"%s\" step %" PRIu64 ": no token allowed (all logits "
                              "-inf or banned)", page_id, index);
        return pd_err_set(err, PD_ERR_RANGE,
                          "sampler: page key %016" PRIx64 " step %" PRIu64 ": no token allowed (all logits "
                          "-inf or banned)", page_key, index);
    }
    if (s->p.mode == SAMPLE_GREEDY) {
        sample_unban(s, n_ban);
        *token = best;
        return PD_OK;
    }

    const float T = s->p.temperature;
    const float z0 = best_l / T;
    /* z for every candidate, -inf for the rest; then every exponential at
     * once (vectorized, the same bits as one call each) */
    sample_z(logits, V, T, z0, s->z);
    for (size_t i = 0; i < n_ban; i++)
        s->z[s->ban[i]] = -INFINITY;
    sample_unban(s, n_ban);
    pd_expf_n(s->z, s->ex, V);
    /* Only a prefix of the sorted order is sorted (sample_cut); the top_k
     * boundary is found by selection inside it. */
    uint64_t n_cut;
    uint32_t c = sample_cut(s, best, s->p.top_k, &n_cut);
    size_t m = sample_gather(s, logits, c, n_cut);
    sample_radix(s->keys, s->tmp, m, s->count);
    CHECK(m >= 1 && (int32_t)(uint32_t)s->keys[0] == best);
    size_t kept = s->p.top_k && s->p.top_k < m ? s->p.top_k : m;
    float sum = 0.0f;
    for (size_t j = 0; j < kept; j++) {
        sum += s->ex[(uint32_t)s->keys[j]];
        s->cum[j] = sum;
    }
    size_t L = kept;
    if (s->p.top_p < 1.0f) {
        float thr = s->p.top_p * sum;
        for (L = 1; L < kept && s->cum[L - 1] < thr; L++)
            ;
    }
    float target = sample_uniform_key(s->seed, page_key, index) * s->cum[L - 1];
    size_t pick = L;
    for (size_t j = 0; j < L; j++)
        if (s->cum[j] > target) {
            pick = j;
            break;
        }
    if (pick == L) { /* u * total rounded up to total: the last token with mass */
        pick = L - 1;
        while (pick > 0 && s->cum[pick] == s->cum[pick - 1])
            pick--;
    }
    *token = (int32_t)(uint32_t)s->keys[pick];
    return PD_OK;
}

void sampler_check(const sampler *s)
{
    CHECK(s && s->vocab >= 1);
    CHECK(s->p.mode < SAMPLE_MODE_COUNT);
    CHECK(s->ng.n == 0 || (s->ng.window >= s->ng.n && s->n_ban_cap >= s->ng.window));
    for (uint32_t i = 0; i < s->vocab; i++)
        CHECKF(s->mask[i] == 0, "ban mask left set at %" PRIu32, i);
}
