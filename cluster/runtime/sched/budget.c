/* budget: per-rank cache budgets and the head's reservations (contract in
 * budget.h). */
#include "cluster/runtime/sched/budget.h"

#include "base/check.h"
#include "cluster/runtime/pipeline/stage.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BUDGET_LAYER_SLACK 4096u /* allocator rounding per layer and stream */

struct budget {
    model_hparams hp;
    cache_policy pol;
    int n;
    uint64_t *limit, *reserved, *peak;
    uint32_t *first, *layers;
};

pd_status budget_new(const model_hparams *hp, const cache_policy *pol, int n, const uint64_t *limit,
                     const uint32_t *first, const uint32_t *layers, budget **out, pd_err *err)
{
    budget *b = calloc(1, sizeof *b);
    if (!b)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    b->hp = *hp;
    b->pol = *pol;
    b->n = n;
    b->limit = calloc((size_t)n, sizeof *b->limit);
    b->reserved = calloc((size_t)n, sizeof *b->reserved);
    b->peak = calloc((size_t)n, sizeof *b->peak);
    b->first = calloc((size_t)n, sizeof *b->first);
    b->layers = calloc((size_t)n, sizeof *b->layers);
    if (!b->limit || !b->reserved || !b->peak || !b->first || !b->layers) {
        budget_free(b);
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    }
    memcpy(b->limit, limit, (size_t)n * sizeof *limit);
    memcpy(b->first, first, (size_t)n * sizeof *first);
    memcpy(b->layers, layers, (size_t)n * sizeof *layers);
    *out = b;
    return PD_OK;
}

void budget_free(budget *b)
{
    if (!b)
        return;
    free(b->limit);
    free(b->reserved);
    free(b->peak);
    free(b->first);
    free(b->layers);
    free(b);
}

uint64_t budget_stream_bytes(const budget *b, int r, uint64_t prefill_rows, uint32_t max_new)
{
    uint32_t pr = prefill_rows > UINT32_MAX ? UINT32_MAX : (uint32_t)prefill_rows;
    return stage_stream_bytes_estimate(&b->hp, &b->pol, b->layers[r], pr, max_new) +
           (uint64_t)b->layers[r] * BUDGET_LAYER_SLACK;
}

static void human(uint64_t v, char *out, size_t cap)
{
    if (v >= (1ull << 30))
        snprintf(out, cap, "%.2f GiB", (double)v / (double)(1ull << 30));
    else
        snprintf(out, cap, "%.1f MiB", (double)v / (double)(1ull << 20));
}

sched_admit budget_admit(void *ctx, size_t page, uint64_t prefill_rows, uint32_t max_new, char *why, size_t cap)
{
    (void)page;
    budget *b = ctx;
    bool wait = false;
    for (int r = 0; r < b->n; r++) {
        uint64_t need = budget_stream_bytes(b, r, prefill_rows, max_new);
        if (b->limit[r] != UINT64_MAX && need > b->limit[r]) {
            char hn[32], hl[32];
            human(need, hn, sizeof hn);
            human(b->limit[r], hl, sizeof hl);
            snprintf(why, cap,
                     "%" PRIu64 " prefill rows + max_new_tokens %u need %" PRIu64 " bytes (%s) of cache on rank %d "
                     "(layers %u-%u), more than its whole budget of %" PRIu64 " bytes (%s, --mem-limit)",
                     prefill_rows, max_new, need, hn, r, b->first[r], b->first[r] + b->layers[r] - 1, b->limit[r],
                     hl);
            return SCHED_ADMIT_NEVER;
        }
        if (b->limit[r] != UINT64_MAX && b->reserved[r] + need > b->limit[r])
            wait = true;
    }
    if (wait)
        return SCHED_ADMIT_WAIT;
    for (int r = 0; r < b->n; r++) {
        b->reserved[r] += budget_stream_bytes(b, r, prefill_rows, max_new);
        if (b->reserved[r] > b->peak[r])
            b->peak[r] = b->reserved[r];
        CHECK(b->limit[r] == UINT64_MAX || b->reserved[r] <= b->limit[r]);
    }
    return SCHED_ADMIT_OK;
}

void budget_release(void *ctx, size_t page, uint64_t prefill_rows, uint32_t max_new)
{
    (void)page;
    budget *b = ctx;
    for (int r = 0; r < b->n; r++) {
        uint64_t need = budget_stream_bytes(b, r, prefill_rows, max_new);
        CHECK(b->reserved[r] >= need);
        b->reserved[r] -= need;
    }
}

pd_status budget_remap(budget *b, const uint32_t *first, const uint32_t *layers, const uint64_t *prefill_rows,
                       const uint32_t *max_new, uint32_t n_streams, bool dry_run, pd_err *err)
{
    uint64_t *res = calloc((size_t)b->n, sizeof *res);
    uint32_t *old_first = calloc((size_t)b->n, sizeof *old_first), *old_layers = calloc((size_t)b->n, sizeof *old_layers);
    if (!res || !old_first || !old_layers) {
        free(res);
        free(old_first);
        free(old_layers);
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    }
    memcpy(old_first, b->first, (size_t)b->n * sizeof *old_first);
    memcpy(old_layers, b->layers, (size_t)b->n * sizeof *old_layers);
    memcpy(b->first, first, (size_t)b->n * sizeof *first);
    memcpy(b->layers, layers, (size_t)b->n * sizeof *layers);
    pd_status st = PD_OK;
    for (int r = 0; r < b->n && st == PD_OK; r++) {
        for (uint32_t i = 0; i < n_streams; i++)
            res[r] += budget_stream_bytes(b, r, prefill_rows[i], max_new[i]);
        if (b->limit[r] != UINT64_MAX && res[r] > b->limit[r]) {
            char hn[32], hl[32];
            human(res[r], hn, sizeof hn);
            human(b->limit[r], hl, sizeof hl);
            st = pd_err_set(err, PD_ERR_RANGE,
                            "rank %d would hold layers %u-%u: its %u streams need %" PRIu64 " bytes (%s) of cache, "
                            "more than its --mem-limit of %" PRIu64 " bytes (%s)",
                            r, first[r], first[r] + layers[r] - 1, n_streams, res[r], hn, b->limit[r], hl);
        }
    }
    if (st != PD_OK || dry_run) {
        memcpy(b->first, old_first, (size_t)b->n * sizeof *old_first);
        memcpy(b->layers, old_layers, (size_t)b->n * sizeof *old_layers);
    } else {
        for (int r = 0; r < b->n; r++) {
            b->reserved[r] = res[r];
            if (res[r] > b->peak[r])
                b->peak[r] = res[r];
        }
    }
    free(res);
    free(old_first);
    free(old_layers);
    return st;
}

uint64_t budget_peak(const budget *b, int r)
{
    return b->peak[r];
}

uint64_t budget_limit(const budget *b, int r)
{
    return b->limit[r];
}

pd_status budget_parse(const char *s, uint64_t *out, pd_err *err)
{
    if (strcmp(s, "auto") == 0) {
        *out = 0;
        return PD_OK;
    }
    if (strcmp(s, "none") == 0) {
        *out = UINT64_MAX;
        return PD_OK;
    }
    uint64_t v = 0;
    const char *p = s;
    if (*p < '0' || *p > '9')
        return pd_err_set(err, PD_ERR_ARG, "--mem-limit '%s': expected auto, none or BYTES[K|M|G|T]", s);
    for (; *p >= '0' && *p <= '9'; p++) {
        if (v > (UINT64_MAX - 9) / 10)
            return pd_err_set(err, PD_ERR_ARG, "--mem-limit '%s': too large", s);
        v = v * 10 + (uint64_t)(*p - '0');
    }
    unsigned shift = 0;
    if (*p == 'K' || *p == 'k')
        shift = 10;
    else if (*p == 'M' || *p == 'm')
        shift = 20;
    else if (*p == 'G' || *p == 'g')
        shift = 30;
    else if (*p == 'T' || *p == 't')
        shift = 40;
    if (shift)
        p++;
    if (*p != '\0' || v == 0)
        return pd_err_set(err, PD_ERR_ARG, "--mem-limit '%s': expected auto, none or BYTES[K|M|G|T] (> 0)", s);
    if (shift && v > (UINT64_MAX >> shift))
        return pd_err_set(err, PD_ERR_ARG, "--mem-limit '%s': too large", s);
    *out = v << shift;
    if (*out == UINT64_MAX)
        (*out)--;
    return PD_OK;
}

pd_status budget_auto(int ranks_on_node, uint64_t *out, pd_err *err)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return pd_err_set(err, PD_ERR_IO, "--mem-limit auto: cannot read /proc/meminfo: %s (give a number)",
                          strerror(errno));
    char line[256];
    uint64_t kb = 0;
    bool found = false;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %" SCNu64 " kB", &kb) == 1) {
            found = true;
            break;
        }
    fclose(f);
    if (!found)
        return pd_err_set(err, PD_ERR_IO, "--mem-limit auto: no MemAvailable in /proc/meminfo (give a number)");
    *out = kb * 1024 / 100 * 85 / (uint64_t)(ranks_on_node > 0 ? ranks_on_node : 1);
    return PD_OK;
}
