/* stream: one page-stream's non-cache state, its table and its encoding
 * (contract and byte layout in stream.h). */
#include "cluster/runtime/pipeline/stream.h"

#include "base/check.h"
#include "cluster/model/sample.h"
#include "cluster/runtime/pipeline/digest.h"

#include <stdlib.h>
#include <string.h>

static const uint8_t stream_magic[4] = {'P', 'D', 'S', 'S'};
#define STREAM_FIXED_BYTES (8u + 5u * 8u + 2u * 4u + 8u + 4u)

pd_status stream_init(stream_state *s, uint64_t id, uint64_t page, const char *page_id, uint64_t prefill_rows,
                      uint32_t max_new, pd_err *err)
{
    size_t n = page_id ? strlen(page_id) : 0;
    if (n == 0 || n > STREAM_MAX_ID)
        return pd_err_set(err, PD_ERR_ARG, "stream %llu: page id of %zu bytes (1..%u allowed)",
                          (unsigned long long)id, n, STREAM_MAX_ID);
    if (max_new == UINT32_MAX)
        return pd_err_set(err, PD_ERR_ARG, "stream %llu: max_new %u", (unsigned long long)id, max_new);
    char *pid = malloc(n + 1);
    uint32_t *tok = malloc(((size_t)max_new + 1) * sizeof *tok);
    if (!pid || !tok) {
        free(pid);
        free(tok);
        return pd_err_set(err, PD_ERR_NOMEM, "stream %llu: out of memory for page \"%s\"", (unsigned long long)id,
                          page_id);
    }
    memcpy(pid, page_id, n + 1);
    *s = (stream_state){.id = id,
                        .page = page,
                        .page_id = pid,
                        .key = sample_page_key(pid),
                        .prefill_rows = prefill_rows,
                        .max_new = max_new,
                        .tokens = tok,
                        .digest = DIGEST_CHAIN_INIT};
    return PD_OK;
}

pd_status stream_init_keyed(stream_state *s, uint64_t id, uint64_t key, uint32_t max_new, pd_err *err)
{
    if (max_new == UINT32_MAX)
        return pd_err_set(err, PD_ERR_ARG, "stream %llu: max_new %u", (unsigned long long)id, max_new);
    uint32_t *tok = malloc(((size_t)max_new + 1) * sizeof *tok);
    if (!tok)
        return pd_err_set(err, PD_ERR_NOMEM, "stream %llu: out of memory", (unsigned long long)id);
    *s = (stream_state){.id = id, .key = key, .max_new = max_new, .tokens = tok, .digest = DIGEST_CHAIN_INIT};
    return PD_OK;
}

void stream_release(stream_state *s)
{
    free(s->page_id);
    free(s->tokens);
    memset(s, 0, sizeof *s);
}

void stream_check(const stream_state *s)
{
    CHECK(s->tokens);
    CHECK(s->fed <= s->prefill_rows);
    CHECK(s->n_tokens <= (uint64_t)s->max_new + 1);
    CHECK(!s->page_id || s->n_tokens == 0 || s->fed == s->prefill_rows);
    CHECK(!s->page_id || s->key == sample_page_key(s->page_id));
}

pd_status stream_push(stream_state *s, uint32_t token, uint64_t row_digest, pd_err *err)
{
    if (s->n_tokens > s->max_new)
        return pd_err_set(err, PD_ERR_RANGE, "stream %llu: token %u beyond max_new %u", (unsigned long long)s->id,
                          s->n_tokens + 1, s->max_new);
    s->tokens[s->n_tokens++] = token;
    s->digest = digest_chain(s->digest, row_digest);
    return PD_OK;
}

size_t stream_encoded_size(const stream_state *s)
{
    return STREAM_FIXED_BYTES + strlen(s->page_id) + (size_t)s->n_tokens * 4;
}

pd_status stream_encode(const stream_state *s, wr *w)
{
    CHECK(s->page_id);
    uint32_t n = (uint32_t)strlen(s->page_id);
    wr_bytes(w, stream_magic, 4);
    wr_u16(w, STREAM_VERSION);
    wr_u16(w, 0);
    wr_u64(w, s->id);
    wr_u64(w, s->page);
    wr_u64(w, s->key);
    wr_u64(w, s->prefill_rows);
    wr_u64(w, s->fed);
    wr_u32(w, s->max_new);
    wr_u32(w, s->n_tokens);
    wr_u64(w, s->digest);
    wr_u32(w, n);
    wr_bytes(w, s->page_id, n);
    for (uint32_t i = 0; i < s->n_tokens; i++)
        wr_u32(w, s->tokens[i]);
    return w->status;
}

pd_status stream_decode(rd *r, const stream_limits *lim, stream_state *out)
{
    size_t at0 = rd_offset(r);
    const uint8_t *mg;
    uint16_t ver, z;
    if (rd_span(r, "magic", 4, &mg))
        return r->status;
    if (memcmp(mg, stream_magic, 4) != 0)
        return rd_fail_at(r, at0, PD_ERR_FORMAT, "bad magic (not a stream record)");
    if (rd_u16(r, "version", &ver))
        return r->status;
    if (ver != STREAM_VERSION)
        return rd_fail_at(r, at0 + 4, PD_ERR_VERSION, "stream record version %u, this build reads %u", ver,
                          STREAM_VERSION);
    if (rd_u16(r, "reserved", &z))
        return r->status;
    if (z != 0)
        return rd_fail_at(r, at0 + 6, PD_ERR_FORMAT, "reserved bytes are not zero");
    stream_state s = {0};
    uint32_t idn;
    if (rd_u64(r, "id", &s.id) || rd_u64(r, "page", &s.page) || rd_u64(r, "key", &s.key) ||
        rd_u64(r, "prefill_rows", &s.prefill_rows) || rd_u64(r, "fed", &s.fed) || rd_u32(r, "max_new", &s.max_new) ||
        rd_u32(r, "n_tokens", &s.n_tokens) || rd_u64(r, "digest", &s.digest) || rd_u32(r, "id_len", &idn))
        return r->status;
    size_t f = at0 + 8; /* field offsets for the messages */
    if (s.prefill_rows == 0 || s.prefill_rows > lim->max_prefill)
        return rd_fail_at(r, f + 24, PD_ERR_RANGE, "prefill_rows %llu outside 1..%llu",
                          (unsigned long long)s.prefill_rows, (unsigned long long)lim->max_prefill);
    if (s.fed > s.prefill_rows)
        return rd_fail_at(r, f + 32, PD_ERR_FORMAT, "fed %llu exceeds prefill_rows %llu", (unsigned long long)s.fed,
                          (unsigned long long)s.prefill_rows);
    if (s.max_new > lim->max_new)
        return rd_fail_at(r, f + 40, PD_ERR_RANGE, "max_new %u exceeds the limit %u", s.max_new, lim->max_new);
    if ((uint64_t)s.n_tokens > (uint64_t)s.max_new + 1)
        return rd_fail_at(r, f + 44, PD_ERR_FORMAT, "n_tokens %u exceeds max_new %u + 1", s.n_tokens, s.max_new);
    if (s.n_tokens > 0 && s.fed != s.prefill_rows)
        return rd_fail_at(r, f + 44, PD_ERR_FORMAT, "%u tokens before the prefill was fed (%llu of %llu rows)",
                          s.n_tokens, (unsigned long long)s.fed, (unsigned long long)s.prefill_rows);
    if (idn == 0 || idn > STREAM_MAX_ID)
        return rd_fail_at(r, f + 56, PD_ERR_FORMAT, "page id of %u bytes (1..%u allowed)", idn, STREAM_MAX_ID);
    const uint8_t *idb;
    size_t id_at = rd_offset(r);
    if (rd_span(r, "page id", idn, &idb))
        return r->status;
    if (memchr(idb, 0, idn))
        return rd_fail_at(r, id_at, PD_ERR_FORMAT, "page id holds a NUL byte");
    size_t tok_bytes;
    if (rd_check_count(r, "tokens", s.n_tokens, 4, &tok_bytes))
        return r->status;
    s.page_id = malloc((size_t)idn + 1);
    s.tokens = malloc(((size_t)s.max_new + 1) * sizeof *s.tokens);
    if (!s.page_id || !s.tokens) {
        free(s.page_id);
        free(s.tokens);
        return rd_fail(r, PD_ERR_NOMEM, "out of memory for a stream record");
    }
    memcpy(s.page_id, idb, idn);
    s.page_id[idn] = '\0';
    pd_status st = PD_OK;
    if (s.key != sample_page_key(s.page_id))
        st = rd_fail_at(r, f + 16, PD_ERR_FORMAT, "key %016llx is not the key of page \"%s\"",
                        (unsigned long long)s.key, s.page_id);
    for (uint32_t i = 0; st == PD_OK && i < s.n_tokens; i++)
        st = rd_u32(r, "token", &s.tokens[i]);
    if (st == PD_OK)
        st = rd_expect_end(r);
    if (st) {
        free(s.page_id);
        free(s.tokens);
        return st;
    }
    *out = s;
    return PD_OK;
}

/* ---- table ---------------------------------------------------------------- */

struct stream_table {
    uint32_t cap, count;
    bool *used;
    stream_state *e;
};

pd_status stream_table_new(uint32_t capacity, stream_table **out, pd_err *err)
{
    stream_table *t = calloc(1, sizeof *t);
    if (t) {
        t->cap = capacity;
        t->used = calloc(capacity ? capacity : 1, sizeof *t->used);
        t->e = calloc(capacity ? capacity : 1, sizeof *t->e);
    }
    if (!t || !t->used || !t->e) {
        stream_table_free(t);
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory for %u streams", capacity);
    }
    *out = t;
    return PD_OK;
}

void stream_table_free(stream_table *t)
{
    if (!t)
        return;
    for (uint32_t i = 0; t->e && i < t->cap; i++)
        if (t->used[i])
            stream_release(&t->e[i]);
    free(t->used);
    free(t->e);
    free(t);
}

uint32_t stream_table_capacity(const stream_table *t)
{
    return t->cap;
}

uint32_t stream_table_count(const stream_table *t)
{
    return t->count;
}

stream_state *stream_table_at(stream_table *t, uint32_t i)
{
    return i < t->cap && t->used[i] ? &t->e[i] : NULL;
}

stream_state *stream_table_find(stream_table *t, uint64_t id)
{
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->used[i] && t->e[i].id == id)
            return &t->e[i];
    return NULL;
}

pd_status stream_table_put(stream_table *t, stream_state *s, uint32_t *slot, pd_err *err)
{
    if (stream_table_find(t, s->id))
        return pd_err_set(err, PD_ERR_ARG, "stream %llu is already alive", (unsigned long long)s->id);
    for (uint32_t i = 0; i < t->cap; i++)
        if (!t->used[i]) {
            t->e[i] = *s;
            t->used[i] = true;
            t->count++;
            memset(s, 0, sizeof *s);
            if (slot)
                *slot = i;
            return PD_OK;
        }
    return pd_err_set(err, PD_ERR_RANGE, "%u streams already alive", t->cap);
}

void stream_table_drop(stream_table *t, uint64_t id)
{
    for (uint32_t i = 0; i < t->cap; i++)
        if (t->used[i] && t->e[i].id == id) {
            stream_release(&t->e[i]);
            t->used[i] = false;
            t->count--;
            return;
        }
}
