/* policy: parsing and describing the attention / cache policy. */
#include "cluster/runtime/plan/policy.h"

#include <stdio.h>
#include <string.h>

void policy_default(cache_policy *p)
{
    *p = (cache_policy){.attn = POLICY_ATTN_FULL, .kv = KV_MODE_F32, .evict = POLICY_EVICT_NONE};
}

/* Parses the characters [s, end) as a decimal u32 in [lo, hi]: one or more
 * digits and nothing else (no sign, no space, no base prefix). */
static int parse_u32_span(const char *s, const char *end, uint32_t lo, uint32_t hi, uint32_t *out)
{
    if (s == end)
        return 0;
    uint64_t v = 0;
    for (const char *c = s; c < end; c++) {
        if (*c < '0' || *c > '9')
            return 0;
        v = v * 10 + (uint64_t)(*c - '0');
        if (v > UINT32_MAX)
            return 0;
    }
    if (v < lo || v > hi)
        return 0;
    *out = (uint32_t)v;
    return 1;
}

/* The same over the whole of the NUL-terminated s. */
static int parse_u32(const char *s, uint32_t lo, uint32_t hi, uint32_t *out)
{
    return parse_u32_span(s, s + strlen(s), lo, hi, out);
}

pd_status policy_parse_attn(const char *s, cache_policy *p, pd_err *err)
{
    uint32_t w;
    if (strcmp(s, "full") == 0) {
        p->attn = POLICY_ATTN_FULL;
        p->window = 0;
        return PD_OK;
    }
    if (strncmp(s, "rswa:", 5) == 0 && parse_u32(s + 5, 1, 1u << 24, &w)) {
        p->attn = POLICY_ATTN_RSWA;
        p->window = w;
        return PD_OK;
    }
    if (strncmp(s, "window:", 7) == 0 && parse_u32(s + 7, 1, 1u << 24, &w)) {
        p->attn = POLICY_ATTN_WINDOW;
        p->window = w;
        return PD_OK;
    }
    return pd_err_set(err, PD_ERR_ARG,
                      "--attn '%s': expected full, rswa:W or window:W with 1 <= W <= 16777216", s);
}

pd_status policy_parse_kv(const char *s, cache_policy *p, pd_err *err)
{
    static const struct { const char *name; kv_mode mode; } modes[] = {
        {"f32", KV_MODE_F32}, {"q8", KV_MODE_Q8}, {"q8k", KV_MODE_Q8K}, {"q8v", KV_MODE_Q8V}};
    for (size_t i = 0; i < sizeof modes / sizeof modes[0]; i++)
        if (strcmp(s, modes[i].name) == 0) {
            p->kv = modes[i].mode;
            return PD_OK;
        }
    return pd_err_set(err, PD_ERR_ARG, "--kv '%s': expected f32, q8, q8k or q8v", s);
}

pd_status policy_parse_evict(const char *s, cache_policy *p, pd_err *err)
{
    uint32_t n, k;
    if (strcmp(s, "none") == 0) {
        p->evict = POLICY_EVICT_NONE;
        p->evict_budget = p->evict_sinks = 0;
        return PD_OK;
    }
    if (strncmp(s, "recent:", 7) == 0 && parse_u32(s + 7, 1, UINT32_MAX, &n)) {
        p->evict = POLICY_EVICT_RECENT;
        p->evict_budget = n;
        p->evict_sinks = 0;
        return PD_OK;
    }
    if (strncmp(s, "importance:", 11) == 0) {
        /* N and SINKS are read in place: the whole value is judged, however long */
        const char *a = s + 11, *colon = strchr(a, ':');
        if (colon && parse_u32_span(a, colon, 2, UINT32_MAX, &n) && parse_u32(colon + 1, 0, UINT32_MAX, &k) &&
            k <= n) {
            p->evict = POLICY_EVICT_IMPORTANCE;
            p->evict_budget = n;
            p->evict_sinks = k;
            return PD_OK;
        }
    }
    return pd_err_set(err, PD_ERR_ARG,
                      "--evict '%s': expected none, recent:N (N >= 1) or importance:N:SINKS "
                      "(N >= 2, SINKS <= N)", s);
}

pd_status policy_validate(const cache_policy *p, pd_err *err)
{
    if (p->attn == POLICY_ATTN_RSWA && p->evict != POLICY_EVICT_NONE)
        return pd_err_set(err, PD_ERR_ARG, "--attn rswa bounds itself; --evict must be none");
    if (p->attn == POLICY_ATTN_WINDOW && p->evict != POLICY_EVICT_NONE)
        return pd_err_set(err, PD_ERR_ARG, "--attn window:W trims itself; --evict must be none");
    if (p->spec_async && p->max_drafts == 0)
        return pd_err_set(err, PD_ERR_ARG, "--draft-async needs --draft");
    if (p->spec_async && p->attn == POLICY_ATTN_RSWA)
        return pd_err_set(err, PD_ERR_ARG,
                          "--draft-async with --attn rswa is refused: a ring commits a micro-batch's verify rows when "
                          "the next one starts, so it cannot undo two micro-batches");
    if (p->spec_async && p->evict != POLICY_EVICT_NONE && p->kv != KV_MODE_F32)
        return pd_err_set(err, PD_ERR_ARG,
                          "--draft-async with --evict and --kv %s is refused: an eviction made while rows after it "
                          "are still pending cannot move the int8 field's freeze undo; use --kv f32 or --draft "
                          "without --draft-async",
                          p->kv == KV_MODE_Q8 ? "q8" : p->kv == KV_MODE_Q8K ? "q8k" : "q8v");
    /* Under speculation a verify row's eviction is decided, not made, so a
     * group holds up to budget - 1 + drafts + 1 rows where the sequential
     * steps hold budget: with int8 storage the field would freeze at 64
     * rows in the group but never in the steps. */
    if (p->evict != POLICY_EVICT_NONE && p->max_drafts && p->kv != KV_MODE_F32 &&
        p->evict_budget <= KV_FREEZE_ROWS_DEFAULT && (uint64_t)p->evict_budget + p->max_drafts > KV_FREEZE_ROWS_DEFAULT)
        return pd_err_set(err, PD_ERR_ARG,
                          "--evict budget %u with %u drafts and --kv q8*: a verify group would hold more than "
                          "the %u rows at which the int8 field freezes while decoding one by one never does; "
                          "use a budget of at most %u or above %u, or fewer drafts",
                          p->evict_budget, p->max_drafts, KV_FREEZE_ROWS_DEFAULT,
                          KV_FREEZE_ROWS_DEFAULT - p->max_drafts, KV_FREEZE_ROWS_DEFAULT);
    if (p->evict != POLICY_EVICT_NONE && p->evict_budget < p->max_drafts + 1u)
        return pd_err_set(err, PD_ERR_ARG,
                          "--evict budget %u is below the %u rows of a verify step (drafts + 1): it could not hold",
                          p->evict_budget, p->max_drafts + 1u);
    return PD_OK;
}

void policy_lcache_config(const cache_policy *p, lcache_config *out)
{
    static const lcache_evict ev[] = {[POLICY_EVICT_NONE] = LCACHE_EVICT_NONE,
                                      [POLICY_EVICT_RECENT] = LCACHE_EVICT_RECENT,
                                      [POLICY_EVICT_IMPORTANCE] = LCACHE_EVICT_IMPORTANCE};
    *out = (lcache_config){.kind = p->attn == POLICY_ATTN_RSWA ? LCACHE_KIND_RING : LCACHE_KIND_KV,
                           .window = p->attn == POLICY_ATTN_FULL ? 0 : p->window,
                           .mode = p->kv,
                           .evict = ev[p->evict],
                           .evict_budget = p->evict_budget,
                           .evict_sinks = p->evict_sinks,
                           .max_drafts = p->max_drafts,
                           .undo_rows = p->spec_async ? 2 * (p->max_drafts + 1) : 0};
}

void policy_describe(const cache_policy *p, char *buf, size_t cap)
{
    static const char *const kv[] = {"f32", "q8k", "q8v", "q8"};
    char attn[48], ev[64];
    if (p->attn == POLICY_ATTN_FULL)
        snprintf(attn, sizeof attn, "full");
    else
        snprintf(attn, sizeof attn, "%s:%u", p->attn == POLICY_ATTN_RSWA ? "rswa" : "window", p->window);
    if (p->evict == POLICY_EVICT_NONE)
        snprintf(ev, sizeof ev, "none");
    else if (p->evict == POLICY_EVICT_RECENT)
        snprintf(ev, sizeof ev, "recent:%u", p->evict_budget);
    else
        snprintf(ev, sizeof ev, "importance:%u:%u", p->evict_budget, p->evict_sinks);
    snprintf(buf, cap, "attn=%s kv=%s evict=%s drafts=%u%s", attn, kv[p->kv & 3], ev, p->max_drafts,
             p->spec_async ? " async" : "");
}
