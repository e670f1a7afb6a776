/* policy: the attention / cache policy of a run, parsed from the CLI flags
 * --attn full|rswa:W|window:W, --kv f32|q8|q8k|q8v,
 * --evict none|recent:N|importance:N:SINKS.
 * It is part of what a token is a function of (ARCHITECTURE.md §1), so it is
 * also part of the CMFS identity (policy_describe gives the canonical string). */
#ifndef PD_POLICY_H
#define PD_POLICY_H

#include "cache/kv_layer.h"
#include "cache/layer_cache.h"
#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum policy_attn { POLICY_ATTN_FULL, POLICY_ATTN_RSWA, POLICY_ATTN_WINDOW } policy_attn;
typedef enum policy_evict { POLICY_EVICT_NONE, POLICY_EVICT_RECENT, POLICY_EVICT_IMPORTANCE } policy_evict;

typedef struct cache_policy {
    policy_attn attn;
    uint32_t window;      /* rswa:W ring slots / window:W visible rows */
    kv_mode kv;           /* KV layers only */
    policy_evict evict;
    uint32_t evict_budget;/* rows kept */
    uint32_t evict_sinks; /* importance: oldest rows always kept */
    uint32_t max_drafts;  /* verify rows a stream may carry per micro-batch */
    bool spec_async;      /* asynchronous speculation: a stream may have a second
                             micro-batch in flight built on its first one's drafts,
                             so caches undo up to 2 x (max_drafts + 1) positions
                             across micro-batches (kv layers; eviction on f32
                             rows only) */
} cache_policy;

/* Defaults: full attention, f32 KV, no eviction, 0 drafts. */
void policy_default(cache_policy *p);

/* Each parser leaves *p unchanged on error and names the flag and value.
 * W, N and SINKS are plain decimal digits (no sign, space or trailing text). */
pd_status policy_parse_attn(const char *s, cache_policy *p, pd_err *err);
pd_status policy_parse_kv(const char *s, cache_policy *p, pd_err *err);
pd_status policy_parse_evict(const char *s, cache_policy *p, pd_err *err);
/* Cross-flag checks (e.g. eviction needs KV layers; a ring bounds itself,
 * so no --evict; eviction takes drafts, not --draft-async, and with --kv
 * q8* not a budget whose verify groups pass the int8 freeze point). --kv applies to a ring too: q8 / q8k / q8v store its
 * reference block, ring and draft rows int8 (ring_layer.h). */
pd_status policy_validate(const cache_policy *p, pd_err *err);

/* The layer cache container (cache/layer_cache.h) this policy asks for:
 * kind (rswa: a ring, else a kv layer), window (rswa: ring slots; window:W:
 * visible rows; full: 0), storage mode (a ring's too), eviction and draft
 * limit. The
 * geometry, the stream's sizes and the allocator are left 0 for the caller. */
void policy_lcache_config(const cache_policy *p, lcache_config *out);

/* Canonical text ("attn=rswa:128 kv=f32 evict=none"), written into buf. */
void policy_describe(const cache_policy *p, char *buf, size_t cap);

#endif
