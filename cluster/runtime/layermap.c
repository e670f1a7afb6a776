/* layermap: parsing, validating and balancing stage layer ranges. */
#include "cluster/runtime/layermap.h"

#include <stdio.h>
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

pd_status layermap_balance(uint32_t n_stages, uint32_t n_layers, uint64_t layer_cost,
                           uint64_t tail_cost, layermap *out, pd_err *err)
{
    if (n_stages == 0 || n_stages > LAYERMAP_MAX_STAGES)
        return pd_err_set(err, PD_ERR_ARG, "layer map: %u ranks (1..%u supported)", n_stages, LAYERMAP_MAX_STAGES);
    if (n_layers < n_stages)
        return pd_err_set(err, PD_ERR_ARG,
                          "layer map: the model has %u layers, fewer than the %u ranks (each rank needs one)",
                          n_layers, n_stages);
    /* the smallest bottleneck: try every max-layers-per-stage bound k; give
     * the last stage as many layers as fit under the bound with the tail,
     * the others fill greedily from the front, each keeping >= 1 layer */
    uint64_t best = UINT64_MAX;
    layermap bm = {0};
    for (uint32_t last = 1; last <= n_layers - (n_stages - 1); last++) {
        uint32_t rest = n_layers - last, others = n_stages - 1;
        layermap m = {.n_stages = n_stages};
        uint64_t worst = (uint64_t)last * layer_cost + tail_cost;
        uint32_t at = 0;
        for (uint32_t s = 0; s < others; s++) {
            uint32_t c = rest / others + (s < rest % others ? 1 : 0);
            m.first[s] = at;
            m.count[s] = c;
            at += c;
            if ((uint64_t)c * layer_cost > worst)
                worst = (uint64_t)c * layer_cost;
        }
        m.first[others] = at;
        m.count[others] = last;
        if (others == 0 && last != n_layers)
            continue;
        if (worst < best) {
            best = worst;
            bm = m;
        }
    }
    *out = bm;
    return PD_OK;
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
