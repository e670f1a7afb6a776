/* layermap: parsing, validating and balancing stage layer ranges. */
#include "cluster/runtime/plan/layermap.h"

#include "base/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int lm_num(const char **p, uint32_t *out)
{
    const char *s = *p;
    if (*s < '0' || *s > '9')
        return 0;
    uint64_t v = 0;
    while (*s >= '0' && *s <= '9') {
        v = v * 10 + (uint64_t)(*s - '0');
        if (v > UINT32_MAX)
            return 0;
        s++;
    }
    *out = (uint32_t)v;
    *p = s;
    return 1;
}

pd_status layermap_parse(const char *s, uint32_t n_stages, uint32_t n_layers, layermap *out,
                         pd_err *err)
{
    if (n_stages == 0 || n_stages > LAYERMAP_MAX_STAGES)
        return pd_err_set(err, PD_ERR_ARG, "--layers: %u ranks (1..%u supported)", n_stages, LAYERMAP_MAX_STAGES);
    layermap m = {.n_stages = 0};
    const char *p = s;
    uint32_t next = 0;
    while (*p) {
        const char *start = p;
        uint32_t a, b;
        if (!lm_num(&p, &a))
            return pd_err_set(err, PD_ERR_ARG, "--layers '%s': expected a layer number at offset %td", s, start - s);
        b = a;
        if (*p == '-') {
            p++;
            if (!lm_num(&p, &b))
                return pd_err_set(err, PD_ERR_ARG, "--layers '%s': expected a layer number at offset %td", s, p - s);
        }
        if (*p && *p != ',')
            return pd_err_set(err, PD_ERR_ARG, "--layers '%s': unexpected '%c' at offset %td", s, *p, p - s);
        if (b < a)
            return pd_err_set(err, PD_ERR_ARG, "--layers '%s': range %u-%u is reversed", s, a, b);
        if (m.n_stages == LAYERMAP_MAX_STAGES || m.n_stages == n_stages)
            return pd_err_set(err, PD_ERR_ARG, "--layers '%s': more ranges than the %u ranks", s, n_stages);
        if (a > next)
            return pd_err_set(err, PD_ERR_ARG, "--layers '%s': layers %u-%u are not assigned (gap)", s, next, a - 1);
        if (a < next)
            return pd_err_set(err, PD_ERR_ARG, "--layers '%s': layer %u is assigned twice (overlap)", s, a);
        if (b >= n_layers)
            return pd_err_set(err, PD_ERR_ARG, "--layers '%s': layer %u does not exist (the model has %u layers)", s,
                              b, n_layers);
        m.first[m.n_stages] = a;
        m.count[m.n_stages] = b - a + 1;
        m.n_stages++;
        next = b + 1;
        if (*p == ',') {
            p++;
            if (!*p)
                return pd_err_set(err, PD_ERR_ARG, "--layers '%s': trailing comma", s);
        }
    }
    if (m.n_stages != n_stages)
        return pd_err_set(err, PD_ERR_ARG, "--layers '%s': %u ranges for %u ranks (one range per rank)", s,
                          m.n_stages, n_stages);
    if (next != n_layers)
        return pd_err_set(err, PD_ERR_ARG, "--layers '%s': layers %u-%u are not assigned", s, next, n_layers - 1);
    *out = m;
    return PD_OK;
}

/* Whether every stage can stay <= bound with at most n_stages stages, packing
 * greedily from the front; c are the folded costs, each already <= bound. */
static int lm_fits(const uint64_t *c, uint32_t n, uint32_t n_stages, uint64_t bound)
{
    uint32_t stages = 1;
    uint64_t sum = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (c[i] > bound - sum) {
            if (++stages > n_stages)
                return 0;
            sum = 0;
        }
        sum += c[i];
    }
    return 1;
}

pd_status layermap_balance_costs(uint32_t n_stages, uint32_t n_layers, const uint64_t *layer_cost,
                                 uint64_t head_cost, uint64_t tail_cost, layermap *out, pd_err *err)
{
    if (n_stages == 0 || n_stages > LAYERMAP_MAX_STAGES)
        return pd_err_set(err, PD_ERR_ARG, "layer map: %u ranks (1..%u supported)", n_stages, LAYERMAP_MAX_STAGES);
    if (n_layers < n_stages)
        return pd_err_set(err, PD_ERR_ARG,
                          "layer map: the model has %u layers, fewer than the %u ranks (each rank needs one)",
                          n_layers, n_stages);
    const uint32_t n = n_layers, k = n_stages;
    /* c: costs with the extras folded in; P: prefix sums, P[j] = c[0] + .. + c[j-1] */
    uint64_t *c = malloc((size_t)n * sizeof *c), *P = malloc(((size_t)n + 1) * sizeof *P);
    double *f = malloc(2 * ((size_t)n + 1) * sizeof *f);
    uint32_t *arg = malloc((size_t)k * ((size_t)n + 1) * sizeof *arg);
    pd_status st = PD_OK;
    if (!c || !P || !f || !arg) {
        st = pd_err_set(err, PD_ERR_NOMEM, "layer map: out of memory for %u layers x %u ranks", n, k);
        goto done;
    }
    memcpy(c, layer_cost, (size_t)n * sizeof *c);
    int overflow = c[0] > UINT64_MAX - head_cost;
    c[0] += overflow ? 0 : head_cost;
    overflow |= c[n - 1] > UINT64_MAX - tail_cost;
    c[n - 1] += overflow ? 0 : tail_cost;
    uint64_t lo = 0;
    P[0] = 0;
    for (uint32_t i = 0; i < n && !overflow; i++) {
        overflow = c[i] > UINT64_MAX - P[i];
        P[i + 1] = P[i] + c[i];
        if (c[i] > lo)
            lo = c[i];
    }
    if (overflow) {
        st = pd_err_set(err, PD_ERR_RANGE, "layer map: the layer costs add up to more than 2^64");
        goto done;
    }

    /* 1. the smallest bottleneck, exactly */
    uint64_t hi = P[n];
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (lm_fits(c, n, k, mid))
            hi = mid;
        else
            lo = mid + 1;
    }
    const uint64_t bound = lo;

    /* 2. under that bound, the least sum of squares. Row s of the DP (f, two
     * rows of n + 1 doubles used in turn) holds, for stage s ending after
     * layer j - 1, the least sum over stages 0..s; arg[s][j] is where stage s
     * starts. Stage s may end at j in [s + 1, n - (k - 1 - s)] so that every
     * stage keeps a layer. Scanning i upwards with <= keeps the latest start
     * among equal sums: later stages get fewer layers. */
    const size_t n1 = (size_t)n + 1; /* size_t indices: n may be UINT32_MAX */
    double *prev = f, *cur = f + n1;
    const double inf = HUGE_VAL;
    for (size_t j = 0; j < n1; j++)
        prev[j] = inf; /* no stage yet: nothing reachable */
    for (uint32_t s = 0; s < k; s++) {
        uint32_t *as = arg + (size_t)s * n1;
        for (size_t j = 0; j < n1; j++) {
            cur[j] = inf;
            as[j] = 0;
        }
        for (size_t j = (size_t)s + 1; j <= (size_t)n - (k - 1 - s); j++) {
            if (s == 0) {
                if (P[j] <= bound)
                    cur[j] = (double)P[j] * (double)P[j];
                continue;
            }
            /* the earliest start i with P[j] - P[i] <= bound, then upwards */
            size_t i = j - 1;
            while (i > s && P[j] - P[i - 1] <= bound)
                i--;
            for (; i < j; i++) {
                if (prev[i] == inf || P[j] - P[i] > bound)
                    continue;
                double d = (double)(P[j] - P[i]), v = prev[i] + d * d;
                if (v <= cur[j]) {
                    cur[j] = v;
                    as[j] = (uint32_t)i;
                }
            }
        }
        double *t = prev;
        prev = cur;
        cur = t;
    }
    CHECKF(prev[n] != inf, "layer map: bound %llu admits no map of %u layers over %u stages",
           (unsigned long long)bound, n, k);
    layermap m = {.n_stages = k};
    uint32_t end = n;
    for (uint32_t s = k; s-- > 0;) {
        uint32_t start = s == 0 ? 0 : arg[(size_t)s * n1 + end];
        CHECK(start < end);
        m.first[s] = start;
        m.count[s] = end - start;
        end = start;
    }
    CHECK(end == 0);
    *out = m;
done:
    free(c);
    free(P);
    free(f);
    free(arg);
    return st;
}

uint64_t layermap_stage_cost(const layermap *m, uint32_t s, const uint64_t *layer_cost, uint64_t head_cost,
                             uint64_t tail_cost)
{
    CHECKF(s < m->n_stages, "stage %u of %u", s, m->n_stages);
    uint64_t sum = 0;
    for (uint32_t i = m->first[s]; i < m->first[s] + m->count[s]; i++)
        sum = layer_cost[i] > UINT64_MAX - sum ? UINT64_MAX : sum + layer_cost[i];
    if (s == 0)
        sum = head_cost > UINT64_MAX - sum ? UINT64_MAX : sum + head_cost;
    if (s == m->n_stages - 1)
        sum = tail_cost > UINT64_MAX - sum ? UINT64_MAX : sum + tail_cost;
    return sum;
}

pd_status layermap_balance(uint32_t n_stages, uint32_t n_layers, uint64_t layer_cost,
                           uint64_t tail_cost, layermap *out, pd_err *err)
{
    uint64_t *c = malloc((n_layers ? n_layers : 1) * sizeof *c);
    if (!c)
        return pd_err_set(err, PD_ERR_NOMEM, "layer map: out of memory for %u layers", n_layers);
    for (uint32_t i = 0; i < n_layers; i++)
        c[i] = layer_cost;
    pd_status st = layermap_balance_costs(n_stages, n_layers, c, 0, tail_cost, out, err);
    free(c);
    return st;
}

pd_status layermap_for_model(const char *model_path, uint32_t n_stages, const cost_rule *rule, const cost_mix *mix,
                             layermap *out, pd_err *err)
{
    cost_rule dflt;
    if (!rule) {
        cost_rule_default(&dflt);
        rule = &dflt;
    }
    cost_table *t;
    pd_status st = cost_table_read(model_path, &t, err);
    if (st)
        return st;
    uint32_t n = cost_table_layers(t);
    uint64_t *c = malloc((size_t)n * sizeof *c), head, tail;
    if (!c)
        st = pd_err_set(err, PD_ERR_NOMEM, "layer map: out of memory for %u layers", n);
    if (st == PD_OK)
        st = mix ? cost_table_mix_units(t, rule, mix, c, &head, &tail, err)
                 : cost_table_units(t, rule, c, &head, &tail, err);
    if (st == PD_OK)
        st = layermap_balance_costs(n_stages, n, c, head, tail, out, err);
    free(c);
    cost_table_free(t);
    return st;
}

void layermap_format(const layermap *m, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (uint32_t s = 0; s < m->n_stages && n < cap; s++) {
        int w = snprintf(buf + n, cap - n, "%s%u-%u", s ? "," : "", m->first[s], m->first[s] + m->count[s] - 1);
        if (w < 0)
            break;
        n += (size_t)w;
    }
}

uint32_t layermap_owner(const layermap *m, uint32_t layer)
{
    for (uint32_t s = 0; s < m->n_stages; s++)
        if (layer >= m->first[s] && layer < m->first[s] + m->count[s])
            return s;
    CHECK(0 && "a layer no stage owns");
    return 0;
}
