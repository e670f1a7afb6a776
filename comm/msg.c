/* msg: pipeline message encoding and validating decoders (layout in msg.h). */
#include "comm/msg.h"

#include "comm/rd.h"

#include <string.h>

static const uint8_t msg_magic[4] = {'P', 'D', 'M', 'B'};

size_t msg_batch_bytes(const msg_batch *b)
{
    size_t el = b->dtype == MSG_DTYPE_F16 ? 2 : 4;
    return MSG_HEADER_BYTES + 20 + (size_t)b->n_admit * 24 + (size_t)b->n_retire * 8 +
           (size_t)b->n_rows * 24 + (size_t)b->n_rows * b->hidden * el;
}

size_t msg_results_bytes(uint32_t n_tokens)
{
    return MSG_HEADER_BYTES + 8 + (size_t)n_tokens * 12;
}

/* A sink that appends into a fixed caller buffer. */
typedef struct msg_mem {
    uint8_t *p;
    size_t cap, len;
} msg_mem;

static pd_status msg_mem_sink(void *ctx, const void *bytes, size_t n, pd_err *err)
{
    msg_mem *m = ctx;
    if (n > m->cap - m->len)
        return pd_err_set(err, PD_ERR_RANGE, "msg: encoding needs more than the %zu-byte buffer", m->cap);
    memcpy(m->p + m->len, bytes, n);
    m->len += n;
    return PD_OK;
}

static void msg_header(wr *w, msg_kind kind, msg_dtype dtype, uint64_t seq)
{
    wr_bytes(w, msg_magic, 4);
    wr_u16(w, MSG_VERSION);
    wr_u8(w, (uint8_t)kind);
    wr_u8(w, (uint8_t)dtype);
    wr_u64(w, seq);
}

static pd_status msg_finish(wr *w, msg_mem *m, size_t *len)
{
    pd_status st = wr_flush(w);
    if (st == PD_OK)
        st = w->status;
    if (st == PD_OK)
        *len = m->len;
    return st;
}

pd_status msg_encode_batch(const msg_batch *b, void *buf, size_t cap, size_t *len, pd_err *err)
{
    if (b->dtype >= MSG_DTYPE_COUNT)
        return pd_err_set(err, PD_ERR_ARG, "msg: dtype %d", (int)b->dtype);
    msg_mem m = {.p = buf, .cap = cap};
    uint8_t staging[4096];
    wr w;
    wr_init_sink(&w, msg_mem_sink, &m, staging, sizeof staging, err);
    msg_header(&w, MSG_KIND_BATCH, b->dtype, b->seq);
    wr_u32(&w, b->n_admit);
    wr_u32(&w, b->n_retire);
    wr_u32(&w, b->n_rows);
    wr_u32(&w, b->hidden);
    wr_u32(&w, b->flags);
    for (uint32_t i = 0; i < b->n_admit; i++) {
        wr_u64(&w, b->admit[i].stream);
        wr_u32(&w, b->admit[i].prefill_rows);
        wr_u32(&w, b->admit[i].max_new);
        wr_u64(&w, b->admit[i].sample_key);
    }
    for (uint32_t i = 0; i < b->n_retire; i++)
        wr_u64(&w, b->retire[i]);
    for (uint32_t i = 0; i < b->n_rows; i++) {
        wr_u64(&w, b->rows[i].stream);
        wr_u64(&w, b->rows[i].pos);
        wr_u8(&w, b->rows[i].role);
        wr_u8(&w, b->rows[i].wants_logits);
        wr_u16(&w, 0);
        wr_u32(&w, b->rows[i].token);
    }
    size_t n = (size_t)b->n_rows * b->hidden;
    if (b->dtype == MSG_DTYPE_F16)
        wr_f16_n(&w, b->x, n);
    else
        wr_f32_n(&w, b->x, n);
    return msg_finish(&w, &m, len);
}

pd_status msg_encode_results(uint64_t seq, uint32_t flags, const uint32_t *tokens, const uint64_t *digests,
                             uint32_t n, void *buf, size_t cap, size_t *len, pd_err *err)
{
    msg_mem m = {.p = buf, .cap = cap};
    uint8_t staging[256];
    wr w;
    wr_init_sink(&w, msg_mem_sink, &m, staging, sizeof staging, err);
    msg_header(&w, MSG_KIND_RESULTS, MSG_DTYPE_F32, seq);
    wr_u32(&w, n);
    wr_u32(&w, flags);
    for (uint32_t i = 0; i < n; i++)
        wr_u32(&w, tokens[i]);
    for (uint32_t i = 0; i < n; i++)
        wr_u64(&w, digests[i]);
    return msg_finish(&w, &m, len);
}

pd_status msg_encode_stop(uint64_t seq, void *buf, size_t cap, size_t *len, pd_err *err)
{
    msg_mem m = {.p = buf, .cap = cap};
    uint8_t staging[64];
    wr w;
    wr_init_sink(&w, msg_mem_sink, &m, staging, sizeof staging, err);
    msg_header(&w, MSG_KIND_STOP, MSG_DTYPE_F32, seq);
    return msg_finish(&w, &m, len);
}

pd_status msg_encode_drain(uint64_t seq, uint32_t action, uint32_t number, void *buf, size_t cap, size_t *len,
                           pd_err *err)
{
    msg_mem m = {.p = buf, .cap = cap};
    uint8_t staging[64];
    wr w;
    wr_init_sink(&w, msg_mem_sink, &m, staging, sizeof staging, err);
    msg_header(&w, MSG_KIND_DRAIN, MSG_DTYPE_F32, seq);
    wr_u32(&w, action);
    wr_u32(&w, number);
    return msg_finish(&w, &m, len);
}

static const uint8_t stats_magic[4] = {'P', 'D', 'S', 'T'};
#define STATS_VERSION 4u /* 3: prefill / decode rows and seconds; 4: per-stream cache bytes */
#define STATS_FIELDS 17u

void msg_encode_stats(const msg_stats *s, uint8_t out[MSG_STATS_BYTES])
{
    const double v[STATS_FIELDS] = {s->busy_s,         s->wait_input_s,  s->wait_send_s, s->wall_s,
                                    s->messages_sent,  s->bytes_sent,    s->micro_batches, s->rows,
                                    s->cache_bytes_peak, s->attention_bytes_peak, s->rows_rolled_back,
                                    s->prefill_rows,   s->decode_rows,   s->prefill_s,   s->decode_s,
                                    s->stream_cache_bytes_peak, s->stream_cache_estimate};
    memcpy(out, stats_magic, 4);
    out[4] = STATS_VERSION & 0xff;
    out[5] = STATS_VERSION >> 8;
    out[6] = STATS_FIELDS & 0xff;
    out[7] = STATS_FIELDS >> 8;
    for (unsigned i = 0; i < STATS_FIELDS; i++) {
        uint64_t b;
        memcpy(&b, &v[i], 8);
        for (unsigned k = 0; k < 8; k++)
            out[8 + 8 * i + k] = (uint8_t)(b >> (8 * k));
    }
}

pd_status msg_decode_stats(const void *buf, size_t len, msg_stats *out, pd_err *err)
{
    rd r;
    rd_init(&r, buf, len, 0, "stats", err);
    const uint8_t *mg;
    uint16_t ver, nf;
    if (rd_span(&r, "magic", 4, &mg))
        return r.status;
    if (memcmp(mg, stats_magic, 4) != 0)
        return rd_fail_at(&r, 0, PD_ERR_FORMAT, "bad magic (not rank statistics)");
    if (rd_u16(&r, "version", &ver))
        return r.status;
    if (ver != STATS_VERSION)
        return rd_fail_at(&r, 4, PD_ERR_VERSION, "version %u, this build reads %u", ver, STATS_VERSION);
    if (rd_u16(&r, "field count", &nf))
        return r.status;
    if (nf != STATS_FIELDS)
        return rd_fail_at(&r, 6, PD_ERR_FORMAT, "%u fields, version %u has %u", nf, STATS_VERSION, STATS_FIELDS);
    double v[STATS_FIELDS];
    for (unsigned i = 0; i < STATS_FIELDS; i++) {
        uint64_t b;
        if (rd_u64(&r, "field", &b))
            return r.status;
        memcpy(&v[i], &b, 8);
    }
    if (rd_expect_end(&r))
        return r.status;
    *out = (msg_stats){.busy_s = v[0],
                       .wait_input_s = v[1],
                       .wait_send_s = v[2],
                       .wall_s = v[3],
                       .messages_sent = v[4],
                       .bytes_sent = v[5],
                       .micro_batches = v[6],
                       .rows = v[7],
                       .cache_bytes_peak = v[8],
                       .attention_bytes_peak = v[9],
                       .rows_rolled_back = v[10],
                       .prefill_rows = v[11],
                       .decode_rows = v[12],
                       .prefill_s = v[13],
                       .decode_s = v[14],
                       .stream_cache_bytes_peak = v[15],
                       .stream_cache_estimate = v[16]};
    return PD_OK;
}

static pd_status msg_read_header(rd *r, msg_kind *kind, msg_dtype *dtype, uint64_t *seq)
{
    const uint8_t *mg;
    uint16_t ver;
    uint8_t k, dt;
    size_t at = rd_offset(r);
    *kind = (msg_kind)0; /* defined on failure too (callers then return) */
    *dtype = (msg_dtype)0;
    if (rd_span(r, "magic", 4, &mg))
        return r->status;
    if (memcmp(mg, msg_magic, 4) != 0)
        return rd_fail_at(r, at, PD_ERR_FORMAT, "bad magic (not a pipeline message)");
    at = rd_offset(r);
    if (rd_u16(r, "version", &ver))
        return r->status;
    if (ver != MSG_VERSION)
        return rd_fail_at(r, at, PD_ERR_VERSION, "version %u, this build speaks %u", ver, MSG_VERSION);
    at = rd_offset(r);
    if (rd_u8(r, "kind", &k))
        return r->status;
    if (k < MSG_KIND_BATCH || k >= MSG_KIND_END_)
        return rd_fail_at(r, at, PD_ERR_FORMAT, "unknown message kind %u", k);
    at = rd_offset(r);
    if (rd_u8(r, "dtype", &dt))
        return r->status;
    if (dt >= MSG_DTYPE_COUNT || (k != MSG_KIND_BATCH && dt != 0))
        return rd_fail_at(r, at, PD_ERR_FORMAT, "dtype %u invalid for kind %u", dt, k);
    if (rd_u64(r, "seq", seq))
        return r->status;
    *kind = (msg_kind)k;
    *dtype = (msg_dtype)dt;
    return PD_OK;
}

pd_status msg_peek(const void *buf, size_t len, msg_kind *kind, uint64_t *seq, pd_err *err)
{
    rd r;
    rd_init(&r, buf, len, 0, "msg", err);
    msg_dtype dt;
    return msg_read_header(&r, kind, &dt, seq);
}

pd_status msg_decode_batch(const void *buf, size_t len, const msg_limits *lim, msg_batch *out,
                           pd_err *err)
{
    rd r;
    rd_init(&r, buf, len, 0, "msg", err);
    msg_kind kind;
    msg_dtype dt;
    uint64_t seq;
    if (msg_read_header(&r, &kind, &dt, &seq))
        return r.status;
    if (kind != MSG_KIND_BATCH)
        return rd_fail_at(&r, 6, PD_ERR_FORMAT, "expected a batch message, got kind %d", (int)kind);
    uint32_t na, nt, nr, hidden;
    size_t at = rd_offset(&r);
    uint32_t flags;
    if (rd_u32(&r, "n_admit", &na) || rd_u32(&r, "n_retire", &nt) || rd_u32(&r, "n_rows", &nr) ||
        rd_u32(&r, "hidden", &hidden) || rd_u32(&r, "flags", &flags))
        return r.status;
    if (flags & ~MSG_FLAGS_KNOWN)
        return rd_fail_at(&r, at + 16, PD_ERR_FORMAT, "flags %#x: unknown bits", flags);
    if (na > lim->max_admit)
        return rd_fail_at(&r, at, PD_ERR_RANGE, "n_admit %u exceeds the limit %u", na, lim->max_admit);
    if (nt > lim->max_retire)
        return rd_fail_at(&r, at + 4, PD_ERR_RANGE, "n_retire %u exceeds the limit %u", nt, lim->max_retire);
    if (nr > lim->max_rows)
        return rd_fail_at(&r, at + 8, PD_ERR_RANGE, "n_rows %u exceeds the limit %u", nr, lim->max_rows);
    if (hidden != lim->hidden)
        return rd_fail_at(&r, at + 12, PD_ERR_MISMATCH, "hidden size %u, this stage runs %u", hidden,
                          lim->hidden);
    size_t el = dt == MSG_DTYPE_F16 ? 2 : 4;
    uint64_t need = (uint64_t)na * 24 + (uint64_t)nt * 8 + (uint64_t)nr * 24 + (uint64_t)nr * hidden * el;
    if (need != rd_remaining(&r))
        return rd_fail(&r, need > rd_remaining(&r) ? PD_ERR_TRUNCATED : PD_ERR_FORMAT,
                       "counts need %llu bytes of body, %zu remain", (unsigned long long)need,
                       rd_remaining(&r));
    /* validate everything before writing the caller's arrays */
    rd probe = r;
    for (uint32_t i = 0; i < na; i++) {
        uint64_t u64;
        uint32_t pr, mx;
        rd_u64(&probe, "admit stream", &u64);
        size_t pat = rd_offset(&probe);
        rd_u32(&probe, "admit prefill_rows", &pr);
        rd_u32(&probe, "admit max_new", &mx);
        rd_u64(&probe, "admit sample_key", &u64);
        if (probe.status)
            return probe.status;
        if (pr == 0)
            return rd_fail_at(&probe, pat, PD_ERR_FORMAT, "admit %u: prefill_rows is 0", i);
    }
    rd_skip(&probe, "retire", (size_t)nt * 8);
    for (uint32_t i = 0; i < nr; i++) {
        uint64_t u64;
        uint8_t role, lg;
        uint16_t z;
        rd_u64(&probe, "row stream", &u64);
        rd_u64(&probe, "row pos", &u64);
        size_t rat = rd_offset(&probe);
        rd_u8(&probe, "row role", &role);
        rd_u8(&probe, "row wants_logits", &lg);
        rd_u16(&probe, "row reserved", &z);
        uint32_t tk;
        rd_u32(&probe, "row token", &tk);
        if (probe.status)
            return probe.status;
        if (role >= MB_ROLE_COUNT)
            return rd_fail_at(&probe, rat, PD_ERR_FORMAT, "row %u: role %u", i, role);
        if (lg > 1)
            return rd_fail_at(&probe, rat + 1, PD_ERR_FORMAT, "row %u: wants_logits %u is not 0/1", i, lg);
        if (z != 0)
            return rd_fail_at(&probe, rat + 2, PD_ERR_FORMAT, "row %u: reserved bytes are not zero", i);
    }
    /* fill */
    for (uint32_t i = 0; i < na; i++) {
        rd_u64(&r, "admit stream", &out->admit[i].stream);
        rd_u32(&r, "admit prefill_rows", &out->admit[i].prefill_rows);
        rd_u32(&r, "admit max_new", &out->admit[i].max_new);
        rd_u64(&r, "admit sample_key", &out->admit[i].sample_key);
    }
    for (uint32_t i = 0; i < nt; i++)
        rd_u64(&r, "retire", &out->retire[i]);
    for (uint32_t i = 0; i < nr; i++) {
        uint16_t z;
        rd_u64(&r, "row stream", &out->rows[i].stream);
        rd_u64(&r, "row pos", &out->rows[i].pos);
        rd_u8(&r, "row role", &out->rows[i].role);
        rd_u8(&r, "row wants_logits", &out->rows[i].wants_logits);
        rd_u16(&r, "row reserved", &z);
        rd_u32(&r, "row token", &out->rows[i].token);
    }
    size_t n = (size_t)nr * hidden;
    if (dt == MSG_DTYPE_F16)
        rd_f16_n(&r, "hidden", out->x, n);
    else
        rd_f32_n(&r, "hidden", out->x, n);
    if (r.status || rd_expect_end(&r))
        return r.status;
    out->seq = seq;
    out->dtype = dt;
    out->hidden = hidden;
    out->n_admit = na;
    out->n_retire = nt;
    out->n_rows = nr;
    out->flags = flags;
    return PD_OK;
}

pd_status msg_decode_results(const void *buf, size_t len, const msg_limits *lim, uint64_t *seq, uint32_t *flags,
                             uint32_t *tokens, uint64_t *digests, uint32_t *n, pd_err *err)
{
    rd r;
    rd_init(&r, buf, len, 0, "msg", err);
    msg_kind kind;
    msg_dtype dt;
    uint64_t s;
    if (msg_read_header(&r, &kind, &dt, &s))
        return r.status;
    if (kind != MSG_KIND_RESULTS)
        return rd_fail_at(&r, 6, PD_ERR_FORMAT, "expected a results message, got kind %d", (int)kind);
    uint32_t cnt, z;
    size_t at = rd_offset(&r);
    if (rd_u32(&r, "n_tokens", &cnt) || rd_u32(&r, "flags", &z))
        return r.status;
    if (cnt > lim->max_tokens)
        return rd_fail_at(&r, at, PD_ERR_RANGE, "n_tokens %u exceeds the limit %u", cnt, lim->max_tokens);
    if (z & ~MSG_FLAGS_KNOWN)
        return rd_fail_at(&r, at + 4, PD_ERR_FORMAT, "flags %#x: unknown bits", z);
    size_t tok_bytes;
    if (rd_check_count(&r, "tokens and digests", cnt, 12, &tok_bytes))
        return r.status;
    if ((uint64_t)cnt * 12 != rd_remaining(&r))
        return rd_fail(&r, PD_ERR_FORMAT, "%zu trailing bytes after %u tokens and digests",
                       rd_remaining(&r) - (size_t)cnt * 12, cnt);
    for (uint32_t i = 0; i < cnt; i++)
        rd_u32(&r, "token", &tokens[i]);
    for (uint32_t i = 0; i < cnt; i++)
        rd_u64(&r, "digest", &digests[i]);
    if (r.status)
        return r.status;
    *seq = s;
    *flags = z;
    *n = cnt;
    return PD_OK;
}

pd_status msg_decode_drain(const void *buf, size_t len, uint64_t *seq, uint32_t *action, uint32_t *number,
                           pd_err *err)
{
    rd r;
    rd_init(&r, buf, len, 0, "msg", err);
    msg_kind kind;
    msg_dtype dt;
    uint64_t s;
    if (msg_read_header(&r, &kind, &dt, &s))
        return r.status;
    if (kind != MSG_KIND_DRAIN)
        return rd_fail_at(&r, 6, PD_ERR_FORMAT, "expected a drain message, got kind %d", (int)kind);
    uint32_t a, no;
    if (rd_u32(&r, "action", &a) || rd_u32(&r, "drain number", &no))
        return r.status;
    if (rd_expect_end(&r))
        return r.status;
    *seq = s;
    *action = a;
    *number = no;
    return PD_OK;
}
