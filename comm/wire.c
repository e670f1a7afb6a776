/* CMFS records (wire.h): the version-2 parser shared by inspect and import,
 * the encoders for kv and ring layers, and the two-phase import (decode into
 * a fresh layer, swap on success).
 *
 * The parser walks a record once to validate it (no allocation, no target),
 * and a second time to collect the payload spans once the caller allocated
 * room for them; both walks run the same code, so what import installs is
 * exactly what inspect validated. */
#include "comm/wire.h"

#include "base/check.h"
#include "base/fnv.h"
#include "comm/rd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define WIRE_HOST_LE 1
#else
#define WIRE_HOST_LE 0
#endif

static const char *const wire_kind_names[] = {
    [WIRE_KIND_FULL] = "full",       [WIRE_KIND_LINEAR] = "linear", [WIRE_KIND_BOUNDED] = "bounded",
    [WIRE_KIND_FULL_TAIL] = "full_tail", [WIRE_KIND_RING] = "ring",  [WIRE_KIND_Q8] = "q8",
    [WIRE_KIND_RING_Q8] = "ring_q8",
};
_Static_assert(sizeof wire_kind_names / sizeof wire_kind_names[0] == WIRE_KIND_COUNT,
               "wire_kind_names must name every wire_kind");

const char *wire_kind_name(unsigned kind)
{
    return kind < WIRE_KIND_COUNT ? wire_kind_names[kind] : "unknown";
}

/* ---- identity ------------------------------------------------------------ */

uint64_t wire_identity(const void *digest, size_t digest_len, uint32_t layer, const char *policy)
{
    static const uint8_t tag[8] = {'C', 'M', 'F', 'S', '-', 'i', 'd', 0};
    if (!policy)
        policy = "";
    size_t plen = strlen(policy);
    uint64_t h = PD_FNV_OFFSET;
    h = pd_fnv_bytes(h, tag, sizeof tag);
    h = pd_fnv_le(h, digest_len, 8);
    if (digest_len)
        h = pd_fnv_bytes(h, digest, digest_len);
    h = pd_fnv_le(h, layer, 4);
    h = pd_fnv_le(h, plen, 8);
    h = pd_fnv_bytes(h, policy, plen);
    /* splitmix64 finalizer: spreads FNV's weak high bits */
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h ? h : 1;
}

/* ---- parsing ------------------------------------------------------------- */

enum { DT_F32 = 0, DT_F16 = 1, DT_I8 = 2 };

/* A payload array inside the record (borrowed from the input). */
typedef struct wspan {
    const uint8_t *p;
    uint64_t n; /* elements */
    uint8_t dt;
} wspan;

/* Per-head span slots. kv kinds: K, K scales, V, V scales, K field, V field.
 * RING: reference K, reference V, ring K, ring V in the first four.
 * RING_Q8: the same four arrays at 2 * slot, each followed by its scales
 * (empty for a component kept in the payload dtype). */
enum { HS_K, HS_KS, HS_V, HS_VS, HS_KCOL, HS_VCOL, HS_COUNT_KV };
enum { HS_REF_K = 0, HS_REF_V = 1, HS_RING_K = 2, HS_RING_V = 3 };
#define HS_COUNT 8

/* Where the second walk puts the spans (heads: [kv_heads x HS_COUNT]). */
typedef struct wspans {
    wspan linear, imp, bk, bv;
    wspan *heads;
} wspans;

/* Offsets the target checks name in their messages. */
typedef struct waux {
    size_t geom_off;  /* first geometry field of the body */
    size_t body_off;  /* first byte after the header */
} waux;

static size_t dt_size(uint8_t dt) { return dt == DT_F32 ? 4 : dt == DT_F16 ? 2 : 1; }

/* Index of the first NaN or infinity among the n little-endian f32 / f16
 * values at p (any alignment), or n; *bad is that value as f32. Aligned f32
 * on a little-endian host is scanned in place, the rest through a small
 * buffer (no allocation). */
static size_t span_first_nonfinite(const uint8_t *p, size_t n, uint8_t dt, float *bad)
{
    if (dt == DT_F32 && WIRE_HOST_LE && ((uintptr_t)p % _Alignof(float)) == 0) {
        const float *x = (const float *)(const void *)p;
        size_t i = rd_f32_first_nonfinite(x, n);
        if (i < n)
            *bad = x[i];
        return i;
    }
    float buf[1024];
    for (size_t i0 = 0; i0 < n; i0 += 1024) {
        size_t m = n - i0 < 1024 ? n - i0 : 1024;
        if (dt == DT_F16)
            rd_f16_decode(p + i0 * 2, buf, m);
        else
            rd_f32_decode(p + i0 * 4, buf, m);
        size_t i = rd_f32_first_nonfinite(buf, m);
        if (i < m) {
            *bad = buf[i];
            return i0 + i;
        }
    }
    return n;
}

/* Checks and consumes n elements of type dt; records the span when out != NULL.
 * The validating walk (out == NULL: wire_inspect, bundle validation and the
 * first walk of an import) also checks that every f32 / f16 value is finite:
 * a NaN or infinity is corrupt state (and the layers quantize rows, which is
 * undefined for NaN), refused with the value's offset, so what inspect calls
 * valid is what import installs. field ends in " count"; the message names
 * the array without it ("head 3 k value 5 is not finite (nan)"). */
static pd_status take_array(rd *r, const char *field, uint64_t n, uint8_t dt, wspan *out)
{
    size_t bytes = 0;
    const uint8_t *p = NULL;
    if (rd_check_count(r, field, n, dt_size(dt), &bytes) != PD_OK ||
        rd_span(r, field, bytes, &p) != PD_OK)
        return r->status;
    if (out) {
        *out = (wspan){.p = p, .n = n, .dt = dt};
        return PD_OK;
    }
    if (dt == DT_I8)
        return PD_OK;
    float v = 0.0f;
    size_t bad = span_first_nonfinite(p, (size_t)n, dt, &v);
    if (bad == n)
        return PD_OK;
    size_t flen = strlen(field), suffix = sizeof " count" - 1;
    if (flen >= suffix && strcmp(field + flen - suffix, " count") == 0)
        flen -= suffix;
    return rd_fail_at(r, r->base + (size_t)(p - r->p) + bad * dt_size(dt), PD_ERR_FORMAT,
                      "%.*s value %zu is not finite (%g)", (int)flen, field, bad, (double)v);
}

/* Reads a u32 count that must be a or b. */
static pd_status read_count_in(rd *r, const char *field, uint64_t a, uint64_t b, uint32_t *out)
{
    size_t at = rd_offset(r);
    uint32_t n = 0;
    if (rd_u32(r, field, &n) != PD_OK)
        return r->status;
    if (n != a && n != b) {
        if (a == b)
            return rd_fail_at(r, at, PD_ERR_FORMAT, "%s %u, expected %llu", field, n,
                              (unsigned long long)a);
        return rd_fail_at(r, at, PD_ERR_FORMAT, "%s %u is neither %llu nor %llu", field, n,
                          (unsigned long long)a, (unsigned long long)b);
    }
    *out = n;
    return PD_OK;
}

/* Reads a u32 that must be >= 1 (a dimension). */
static pd_status read_dim(rd *r, const char *field, uint32_t *out)
{
    size_t at = rd_offset(r);
    if (rd_u32(r, field, out) != PD_OK)
        return r->status;
    if (*out == 0)
        return rd_fail_at(r, at, PD_ERR_FORMAT, "%s 0", field);
    return PD_OK;
}

/* Reads a u8 flag that must be 0 or 1. */
static pd_status read_flag(rd *r, const char *field, uint8_t *out)
{
    size_t at = rd_offset(r);
    if (rd_u8(r, field, out) != PD_OK)
        return r->status;
    if (*out > 1)
        return rd_fail_at(r, at, PD_ERR_FORMAT, "%s %u is not 0 or 1", field, *out);
    return PD_OK;
}

static pd_status read_reserved16(rd *r)
{
    size_t at = rd_offset(r);
    uint16_t z = 0;
    if (rd_u16(r, "reserved", &z) != PD_OK)
        return r->status;
    if (z != 0)
        return rd_fail_at(r, at, PD_ERR_FORMAT, "reserved field %u is not 0", z);
    return PD_OK;
}

/* Checks that `heads` per-head blocks of at least min_bytes each can remain,
 * before any per-head loop or allocation. */
static pd_status check_heads(rd *r, uint32_t heads, size_t min_bytes)
{
    size_t bytes = 0;
    return rd_check_count(r, "kv_heads", heads, min_bytes, &bytes);
}

static wspan *head_span(wspans *sp, uint32_t h, int slot)
{
    return sp ? &sp->heads[(size_t)h * HS_COUNT + slot] : NULL;
}

/* full_body (also the legacy record). hdr_f16 < 0: no header to agree with. */
static pd_status parse_full_body(rd *r, int hdr_f16, wire_info *in, wspans *sp, waux *aux)
{
    size_t at = rd_offset(r);
    uint32_t f16 = 0, rows = 0, heads = 0, hd = 0, nlin = 0, nimp = 0;
    if (rd_u32(r, "body f16", &f16) != PD_OK)
        return r->status;
    if (f16 > 1)
        return rd_fail_at(r, at, PD_ERR_FORMAT, "body f16 flag %u is not 0 or 1", f16);
    if (hdr_f16 >= 0 && f16 != (uint32_t)hdr_f16)
        return rd_fail_at(r, at, PD_ERR_FORMAT, "body f16 flag %u disagrees with header f16 %d",
                          f16, hdr_f16);
    size_t rows_at = rd_offset(r);
    aux->geom_off = rows_at;
    if (rd_u32(r, "rows", &rows) != PD_OK || read_dim(r, "kv_heads", &heads) != PD_OK ||
        read_dim(r, "head_dim", &hd) != PD_OK || rd_u32(r, "n_linear", &nlin) != PD_OK)
        return r->status;
    /* a versioned record carries one importance value per row (every
     * exporter writes them: importance is state eviction reads); only the
     * legacy body may leave them out. Accepting none for rows would install
     * zeros the record did not hold. */
    if (read_count_in(r, "n_importance", hdr_f16 < 0 ? 0 : rows, rows, &nimp) != PD_OK)
        return r->status;
    if (take_array(r, "linear count", nlin, DT_F32, sp ? &sp->linear : NULL) != PD_OK ||
        take_array(r, "importance count", nimp, DT_F32, sp ? &sp->imp : NULL) != PD_OK ||
        check_heads(r, heads, 8) != PD_OK)
        return r->status;
    uint64_t per = (uint64_t)rows * hd;
    uint8_t dt = f16 ? DT_F16 : DT_F32;
    uint32_t alive = 0;
    char f[64];
    for (uint32_t h = 0; h < heads; h++) {
        uint32_t nk = 0, nv = 0;
        snprintf(f, sizeof f, "head %u k count", h);
        if (read_count_in(r, f, 0, per, &nk) != PD_OK || take_array(r, f, nk, dt, head_span(sp, h, HS_K)) != PD_OK)
            return r->status;
        size_t v_at = rd_offset(r);
        snprintf(f, sizeof f, "head %u v count", h);
        if (read_count_in(r, f, 0, per, &nv) != PD_OK || take_array(r, f, nv, dt, head_span(sp, h, HS_V)) != PD_OK)
            return r->status;
        if ((nk == 0) != (nv == 0))
            return rd_fail_at(r, v_at, PD_ERR_FORMAT, "head %u stores %s rows without %s rows", h,
                              nk ? "k" : "v", nk ? "v" : "k");
        alive += nk != 0;
    }
    in->f16 = (uint8_t)f16;
    in->rows = rows;
    in->kv_heads = heads;
    in->head_dim = hd;
    in->n_linear = nlin;
    in->n_importance = nimp;
    in->alive_heads = alive;
    return PD_OK;
}

static pd_status parse_linear(rd *r, wire_info *in, wspans *sp, waux *aux)
{
    uint32_t heads = 0, hd = 0, n = 0;
    aux->geom_off = rd_offset(r);
    if (read_dim(r, "kv_heads", &heads) != PD_OK || read_dim(r, "head_dim", &hd) != PD_OK ||
        rd_u32(r, "linear n", &n) != PD_OK ||
        take_array(r, "linear count", n, DT_F32, sp ? &sp->linear : NULL) != PD_OK)
        return r->status;
    in->kv_heads = heads;
    in->head_dim = hd;
    in->n_linear = n;
    return PD_OK;
}

static pd_status parse_bounded(rd *r, wire_info *in, wspans *sp, waux *aux)
{
    uint32_t heads = 0, hd = 0, window = 0, len = 0, head = 0;
    aux->geom_off = rd_offset(r);
    if (read_dim(r, "kv_heads", &heads) != PD_OK || read_dim(r, "head_dim", &hd) != PD_OK ||
        read_dim(r, "window", &window) != PD_OK)
        return r->status;
    size_t at = rd_offset(r);
    if (rd_u32(r, "len", &len) != PD_OK || rd_u32(r, "head", &head) != PD_OK)
        return r->status;
    uint64_t pos = in->position;
    if (len != (pos < window ? pos : window) || head != pos % window)
        return rd_fail_at(r, at, PD_ERR_FORMAT,
                          "bounded len/head %u/%u inconsistent with position %llu (window %u)",
                          len, head, (unsigned long long)pos, window);
    uint64_t n = 0;
    if (__builtin_mul_overflow((uint64_t)heads * window, (uint64_t)hd, &n))
        return rd_fail(r, PD_ERR_RANGE, "bounded ring %u x %u x %u overflows", heads, window, hd);
    uint8_t dt = in->f16 ? DT_F16 : DT_F32;
    if (take_array(r, "bounded ring k count", n, dt, sp ? &sp->bk : NULL) != PD_OK ||
        take_array(r, "bounded ring v count", n, dt, sp ? &sp->bv : NULL) != PD_OK)
        return r->status;
    in->kv_heads = heads;
    in->head_dim = hd;
    in->window = window;
    in->ring_len = len;
    in->ring_pos = head;
    in->rows = len;
    return PD_OK;
}

/* The cursor rules shared by kinds 4 and 6 (offsets name the fields). */
static pd_status parse_ring_cursors(rd *r, const wire_info *in, const waux *aux, uint32_t window,
                                    uint32_t ref_rows, uint32_t ring_len, uint32_t ring_pos,
                                    uint64_t writes, uint8_t decoding, size_t len_at, size_t pos_at,
                                    size_t writes_at)
{
    if (ring_len > window)
        return rd_fail_at(r, len_at, PD_ERR_RANGE, "ring_len %u exceeds window %u", ring_len,
                          window);
    if (ring_pos >= window)
        return rd_fail_at(r, pos_at, PD_ERR_RANGE, "ring_pos %u outside window %u", ring_pos,
                          window);
    if (ring_len != (writes < window ? writes : window) || ring_pos != writes % window)
        return rd_fail_at(r, len_at, PD_ERR_FORMAT,
                          "ring cursors len %u / pos %u inconsistent with %llu writes (window %u)",
                          ring_len, ring_pos, (unsigned long long)writes, window);
    if (!decoding && writes)
        return rd_fail_at(r, writes_at, PD_ERR_FORMAT, "%llu writes but the reference is not sealed",
                          (unsigned long long)writes);
    if (writes && ref_rows == 0)
        return rd_fail_at(r, writes_at, PD_ERR_FORMAT, "%llu writes without a reference block",
                          (unsigned long long)writes);
    if (writes > UINT64_MAX - ref_rows || ref_rows + writes != in->position)
        return rd_fail_at(r, aux->body_off - 8, PD_ERR_FORMAT,
                          "header position %llu != ref_rows %u + writes %llu",
                          (unsigned long long)in->position, ref_rows, (unsigned long long)writes);
    return PD_OK;
}

static pd_status parse_ring(rd *r, wire_info *in, wspans *sp, waux *aux)
{
    uint32_t heads = 0, hd = 0, window = 0, ref_rows = 0, ring_len = 0, ring_pos = 0;
    uint64_t writes = 0;
    uint8_t decoding = 0, mirror = 0;
    aux->geom_off = rd_offset(r);
    if (read_dim(r, "kv_heads", &heads) != PD_OK || read_dim(r, "head_dim", &hd) != PD_OK ||
        read_dim(r, "window", &window) != PD_OK || rd_u32(r, "ref_rows", &ref_rows) != PD_OK)
        return r->status;
    size_t len_at = rd_offset(r);
    if (rd_u32(r, "ring_len", &ring_len) != PD_OK)
        return r->status;
    size_t pos_at = rd_offset(r);
    if (rd_u32(r, "ring_pos", &ring_pos) != PD_OK)
        return r->status;
    size_t writes_at = rd_offset(r);
    if (rd_u64(r, "writes", &writes) != PD_OK || read_flag(r, "decoding", &decoding) != PD_OK ||
        read_flag(r, "int8_mirror", &mirror) != PD_OK || read_reserved16(r) != PD_OK)
        return r->status;
    if (parse_ring_cursors(r, in, aux, window, ref_rows, ring_len, ring_pos, writes, decoding, len_at,
                           pos_at, writes_at) != PD_OK)
        return r->status;
    if (check_heads(r, heads, 16) != PD_OK)
        return r->status;
    uint64_t nref = (uint64_t)ref_rows * hd, nring = (uint64_t)ring_len * hd;
    uint8_t dt = in->f16 ? DT_F16 : DT_F32;
    static const char *const names[4] = {"ref k", "ref v", "ring k", "ring v"};
    char f[64];
    for (uint32_t h = 0; h < heads; h++)
        for (int s = 0; s < 4; s++) {
            uint64_t want = s < 2 ? nref : nring;
            uint32_t n = 0;
            snprintf(f, sizeof f, "head %u %s count", h, names[s]);
            if (read_count_in(r, f, want, want, &n) != PD_OK ||
                take_array(r, f, n, dt, head_span(sp, h, s)) != PD_OK)
                return r->status;
        }
    in->kv_heads = heads;
    in->head_dim = hd;
    in->window = window;
    in->rows = ref_rows;
    in->ring_len = ring_len;
    in->ring_pos = ring_pos;
    in->writes = writes;
    in->decoding = decoding;
    in->int8_mirror = mirror;
    in->alive_heads = heads;
    return PD_OK;
}

/* Kind 6: the ring body of kind 4 with int8 storage. The cursor rules are
 * kind 4's (parse_ring_cursors). */
static pd_status parse_ring_q8(rd *r, wire_info *in, wspans *sp, waux *aux)
{
    uint32_t heads = 0, hd = 0, window = 0, kg = 0, ref_rows = 0, ring_len = 0, ring_pos = 0;
    uint64_t writes = 0;
    uint8_t decoding = 0, mode = 0;
    aux->geom_off = rd_offset(r);
    if (read_dim(r, "kv_heads", &heads) != PD_OK || read_dim(r, "head_dim", &hd) != PD_OK ||
        read_dim(r, "window", &window) != PD_OK || read_dim(r, "k_group", &kg) != PD_OK ||
        rd_u32(r, "ref_rows", &ref_rows) != PD_OK)
        return r->status;
    size_t len_at = rd_offset(r);
    if (rd_u32(r, "ring_len", &ring_len) != PD_OK)
        return r->status;
    size_t pos_at = rd_offset(r);
    if (rd_u32(r, "ring_pos", &ring_pos) != PD_OK)
        return r->status;
    size_t writes_at = rd_offset(r);
    if (rd_u64(r, "writes", &writes) != PD_OK || read_flag(r, "decoding", &decoding) != PD_OK)
        return r->status;
    size_t mode_at = rd_offset(r);
    if (rd_u8(r, "mode", &mode) != PD_OK)
        return r->status;
    if (mode == KV_MODE_F32 || mode >= KV_MODE_COUNT)
        return rd_fail_at(r, mode_at, PD_ERR_FORMAT, "ring_q8 mode %u is not 1, 2 or 3", mode);
    if (read_reserved16(r) != PD_OK)
        return r->status;
    if (parse_ring_cursors(r, in, aux, window, ref_rows, ring_len, ring_pos, writes, decoding, len_at,
                           pos_at, writes_at) != PD_OK)
        return r->status;
    if (check_heads(r, heads, 32) != PD_OK)
        return r->status;
    const int qk = (mode & KV_MODE_Q8K) != 0, qv = (mode & KV_MODE_Q8V) != 0;
    const uint64_t G = (hd + kg - 1) / kg;
    const uint64_t rows_of[2] = {ref_rows, ring_len};
    const uint8_t pay = in->f16 ? DT_F16 : DT_F32;
    static const char *const names[4] = {"ref k", "ref v", "ring k", "ring v"};
    char f[64];
    for (uint32_t h = 0; h < heads; h++)
        for (int a = 0; a < 4; a++) {
            const int isk = a % 2 == 0, q = isk ? qk : qv;
            const uint64_t rows = rows_of[a / 2], want = rows * hd;
            const uint64_t nsc = q ? rows * (isk ? G : 1) : 0;
            uint32_t n = 0;
            snprintf(f, sizeof f, "head %u %s count", h, names[a]);
            if (read_count_in(r, f, want, want, &n) != PD_OK ||
                take_array(r, f, n, q ? DT_I8 : pay, head_span(sp, h, 2 * a)) != PD_OK)
                return r->status;
            snprintf(f, sizeof f, "head %u %s scale count", h, names[a]);
            if (read_count_in(r, f, nsc, nsc, &n) != PD_OK ||
                take_array(r, f, n, DT_F32, head_span(sp, h, 2 * a + 1)) != PD_OK)
                return r->status;
        }
    in->kv_heads = heads;
    in->head_dim = hd;
    in->window = window;
    in->k_group = kg;
    in->mode = mode;
    in->rows = ref_rows;
    in->ring_len = ring_len;
    in->ring_pos = ring_pos;
    in->writes = writes;
    in->decoding = decoding;
    in->alive_heads = heads;
    return PD_OK;
}

static pd_status parse_q8(rd *r, wire_info *in, wspans *sp, waux *aux)
{
    uint32_t heads = 0, hd = 0, kg = 0, freeze = 0, rows = 0, nlin = 0, nimp = 0;
    uint8_t mode = 0, frozen = 0;
    uint64_t base = 0;
    aux->geom_off = rd_offset(r);
    if (read_dim(r, "kv_heads", &heads) != PD_OK || read_dim(r, "head_dim", &hd) != PD_OK ||
        read_dim(r, "k_group", &kg) != PD_OK || rd_u32(r, "freeze_rows", &freeze) != PD_OK)
        return r->status;
    size_t mode_at = rd_offset(r);
    if (rd_u8(r, "mode", &mode) != PD_OK)
        return r->status;
    if (mode == KV_MODE_F32 || mode >= KV_MODE_COUNT)
        return rd_fail_at(r, mode_at, PD_ERR_FORMAT, "q8 mode %u is not 1, 2 or 3", mode);
    if (read_flag(r, "frozen", &frozen) != PD_OK || read_reserved16(r) != PD_OK ||
        rd_u64(r, "base", &base) != PD_OK)
        return r->status;
    size_t rows_at = rd_offset(r);
    if (rd_u32(r, "rows", &rows) != PD_OK || rd_u32(r, "n_linear", &nlin) != PD_OK ||
        read_count_in(r, "n_importance", rows, rows, &nimp) != PD_OK) /* one per row, as full */
        return r->status;
    if (base > UINT64_MAX - rows || base + rows != in->position)
        return rd_fail_at(r, rows_at, PD_ERR_FORMAT, "base %llu + rows %u != header position %llu",
                          (unsigned long long)base, rows, (unsigned long long)in->position);
    if (take_array(r, "linear count", nlin, DT_F32, sp ? &sp->linear : NULL) != PD_OK ||
        take_array(r, "importance count", nimp, DT_F32, sp ? &sp->imp : NULL) != PD_OK ||
        check_heads(r, heads, 24) != PD_OK)
        return r->status;
    const int qk = (mode & KV_MODE_Q8K) != 0, qv = (mode & KV_MODE_Q8V) != 0;
    const uint64_t per = (uint64_t)rows * hd;
    const uint64_t nks = (uint64_t)rows * ((hd + kg - 1) / kg), nvs = rows;
    const uint8_t pay = in->f16 ? DT_F16 : DT_F32;
    uint32_t alive = 0;
    char f[64];
    for (uint32_t h = 0; h < heads; h++) {
        uint32_t nk = 0, nksc = 0, nv = 0, nvsc = 0, nkc = 0, nvc = 0;
        snprintf(f, sizeof f, "head %u k count", h);
        if (read_count_in(r, f, 0, per, &nk) != PD_OK ||
            take_array(r, f, nk, qk ? DT_I8 : pay, head_span(sp, h, HS_K)) != PD_OK)
            return r->status;
        const int live = nk != 0;
        snprintf(f, sizeof f, "head %u k scale count", h);
        if (read_count_in(r, f, qk && live ? nks : 0, qk && live ? nks : 0, &nksc) != PD_OK ||
            take_array(r, f, nksc, DT_F32, head_span(sp, h, HS_KS)) != PD_OK)
            return r->status;
        snprintf(f, sizeof f, "head %u v count", h);
        if (read_count_in(r, f, live ? per : 0, live ? per : 0, &nv) != PD_OK ||
            take_array(r, f, nv, qv ? DT_I8 : pay, head_span(sp, h, HS_V)) != PD_OK)
            return r->status;
        snprintf(f, sizeof f, "head %u v scale count", h);
        if (read_count_in(r, f, qv && live ? nvs : 0, qv && live ? nvs : 0, &nvsc) != PD_OK ||
            take_array(r, f, nvsc, DT_F32, head_span(sp, h, HS_VS)) != PD_OK)
            return r->status;
        /* A field exists only on a frozen quantized component; an alive head
         * holding rows carries it exactly then, a dead one never.
         * With no rows the record cannot tell dead heads from alive ones, so
         * a field may be present or absent there (the layer checks it). */
        const uint64_t kc_need = frozen && qk ? hd : 0, vc_need = frozen && qv ? hd : 0;
        const uint64_t kc_a = live ? kc_need : 0, kc_b = rows ? kc_a : kc_need;
        const uint64_t vc_a = live ? vc_need : 0, vc_b = rows ? vc_a : vc_need;
        snprintf(f, sizeof f, "head %u k field count", h);
        if (read_count_in(r, f, kc_a, kc_b, &nkc) != PD_OK ||
            take_array(r, f, nkc, DT_F32, head_span(sp, h, HS_KCOL)) != PD_OK)
            return r->status;
        snprintf(f, sizeof f, "head %u v field count", h);
        if (read_count_in(r, f, vc_a, vc_b, &nvc) != PD_OK ||
            take_array(r, f, nvc, DT_F32, head_span(sp, h, HS_VCOL)) != PD_OK)
            return r->status;
        alive += live;
    }
    in->kv_heads = heads;
    in->head_dim = hd;
    in->k_group = kg;
    in->freeze_rows = freeze;
    in->mode = mode;
    in->frozen = frozen;
    in->base = base;
    in->rows = rows;
    in->n_linear = nlin;
    in->n_importance = nimp;
    in->alive_heads = alive;
    return PD_OK;
}

static pd_status parse_header(rd *r, wire_info *in)
{
    uint8_t magic[4];
    if (rd_bytes(r, "magic", magic, 4) != PD_OK)
        return r->status;
    if (memcmp(magic, WIRE_MAGIC, 4) != 0)
        return rd_fail_at(r, r->base, PD_ERR_FORMAT, "magic %02x %02x %02x %02x is not \"CMFS\"",
                          magic[0], magic[1], magic[2], magic[3]);
    size_t at = rd_offset(r);
    if (rd_u32(r, "version", &in->version) != PD_OK)
        return r->status;
    if (in->version != WIRE_VERSION)
        return rd_fail_at(r, at, PD_ERR_VERSION, "wire version %u, this build reads version %u",
                          in->version, WIRE_VERSION);
    if (rd_u64(r, "identity", &in->identity) != PD_OK || rd_u32(r, "layer", &in->layer) != PD_OK)
        return r->status;
    at = rd_offset(r);
    if (rd_u8(r, "kind", &in->kind) != PD_OK)
        return r->status;
    if (in->kind >= WIRE_KIND_COUNT)
        return rd_fail_at(r, at, PD_ERR_UNSUPPORTED, "unknown state kind %u", in->kind);
    if (read_flag(r, "f16", &in->f16) != PD_OK || read_reserved16(r) != PD_OK ||
        rd_u64(r, "position", &in->position) != PD_OK)
        return r->status;
    return PD_OK;
}

/* Which kinds a target accepts; *expect names the canonical one. */
static int kind_fits(const wire_layer_ref *t, const kv_state *tst, unsigned kind, unsigned *expect)
{
    if (t->ring) {
        ring_layer_config rc;
        ring_layer_config_get(t->ring, &rc);
        *expect = rc.mode == KV_MODE_F32 ? WIRE_KIND_RING : WIRE_KIND_RING_Q8;
        return kind == *expect;
    }
    if (t->linear) {
        *expect = WIRE_KIND_LINEAR;
        return kind == WIRE_KIND_LINEAR;
    }
    if (tst->has_bounded) {
        *expect = WIRE_KIND_BOUNDED;
        return kind == WIRE_KIND_BOUNDED;
    }
    if (tst->mode != KV_MODE_F32) {
        *expect = WIRE_KIND_Q8;
        return kind == WIRE_KIND_Q8;
    }
    *expect = WIRE_KIND_FULL;
    return kind == WIRE_KIND_FULL || kind == WIRE_KIND_FULL_TAIL;
}

/* The header's claims against the target (identity, layer, kind). */
static pd_status check_header_target(rd *r, const wire_info *in, const wire_layer_ref *t,
                                     const kv_state *tst)
{
    size_t b = r->base;
    if (in->identity != t->identity)
        return rd_fail_at(r, b + 8, PD_ERR_MISMATCH,
                          "identity %016llx, this layer is %016llx (not the same model/policy)",
                          (unsigned long long)in->identity, (unsigned long long)t->identity);
    if (in->layer != t->layer)
        return rd_fail_at(r, b + 16, PD_ERR_MISMATCH, "record is for layer %u, this is layer %u",
                          in->layer, t->layer);
    unsigned expect = 0;
    if (!kind_fits(t, tst, in->kind, &expect))
        return rd_fail_at(r, b + 20, PD_ERR_MISMATCH, "kind %s does not fit this layer (takes %s)",
                          wire_kind_name(in->kind), wire_kind_name(expect));
    return PD_OK;
}

/* One walk over a record. sp: NULL validates only. t/tst: optional target
 * whose header claims are checked before the body is read. */
static pd_status parse_record(rd *r, unsigned flags, wire_info *in, wspans *sp, waux *aux,
                              const wire_layer_ref *t, const kv_state *tst)
{
    *in = (wire_info){0};
    *aux = (waux){0};
    const int v2 = rd_remaining(r) >= 4 && memcmp(r->p + r->off, WIRE_MAGIC, 4) == 0;
    if (!v2 && (flags & WIRE_ALLOW_LEGACY)) {
        in->legacy = 1;
        in->kind = WIRE_KIND_FULL;
        if (t) {
            unsigned expect = 0;
            if (t->ring || t->linear || !kind_fits(t, tst, WIRE_KIND_FULL, &expect))
                return rd_fail(r, PD_ERR_MISMATCH,
                               "an unversioned legacy body fits only a full f32 kv layer");
        }
        aux->body_off = rd_offset(r);
        if (parse_full_body(r, -1, in, sp, aux) != PD_OK)
            return r->status;
        in->position = in->rows;
        return rd_expect_end(r);
    }
    if (!v2 && rd_remaining(r) >= 4)
        return rd_fail(r, PD_ERR_FORMAT,
                       "magic %02x %02x %02x %02x is not \"CMFS\" (an unversioned legacy body "
                       "needs WIRE_ALLOW_LEGACY)",
                       r->p[r->off], r->p[r->off + 1], r->p[r->off + 2], r->p[r->off + 3]);
    if (parse_header(r, in) != PD_OK)
        return r->status;
    aux->body_off = rd_offset(r);
    if (t && check_header_target(r, in, t, tst) != PD_OK)
        return r->status;
    switch (in->kind) {
    case WIRE_KIND_FULL:
        if (parse_full_body(r, in->f16, in, sp, aux) != PD_OK)
            return r->status;
        if (in->position != in->rows)
            return rd_fail_at(r, r->base + 24, PD_ERR_FORMAT,
                              "header position %llu != record rows %llu",
                              (unsigned long long)in->position, (unsigned long long)in->rows);
        break;
    case WIRE_KIND_FULL_TAIL: {
        size_t at = rd_offset(r);
        if (rd_u64(r, "base", &in->base) != PD_OK)
            return r->status;
        if (in->base == 0)
            return rd_fail_at(r, at, PD_ERR_FORMAT,
                              "full_tail base 0 (an untrimmed layer travels as full)");
        uint64_t base = in->base;
        if (parse_full_body(r, in->f16, in, sp, aux) != PD_OK)
            return r->status;
        if (base > UINT64_MAX - in->rows || base + in->rows != in->position)
            return rd_fail_at(r, at, PD_ERR_FORMAT, "tail base %llu + %llu rows != header position %llu",
                              (unsigned long long)base, (unsigned long long)in->rows,
                              (unsigned long long)in->position);
        break;
    }
    case WIRE_KIND_LINEAR:
        if (parse_linear(r, in, sp, aux) != PD_OK)
            return r->status;
        break;
    case WIRE_KIND_BOUNDED:
        if (parse_bounded(r, in, sp, aux) != PD_OK)
            return r->status;
        break;
    case WIRE_KIND_RING:
        if (parse_ring(r, in, sp, aux) != PD_OK)
            return r->status;
        break;
    case WIRE_KIND_Q8:
        if (parse_q8(r, in, sp, aux) != PD_OK)
            return r->status;
        break;
    case WIRE_KIND_RING_Q8:
        if (parse_ring_q8(r, in, sp, aux) != PD_OK)
            return r->status;
        break;
    default:
        CHECKF(0, "kind %u passed the header check", in->kind);
    }
    return rd_expect_end(r);
}

pd_status wire_header_decode(const void *buf, size_t len, size_t base_offset, wire_info *info,
                             pd_err *err)
{
    rd r;
    rd_init(&r, buf, len, base_offset, "wire", err);
    wire_info in = {0};
    if (parse_header(&r, &in) != PD_OK)
        return r.status;
    if (info)
        *info = in;
    return PD_OK;
}

pd_status wire_inspect(const void *buf, size_t len, unsigned flags, size_t base_offset,
                       wire_info *info, pd_err *err)
{
    rd r;
    rd_init(&r, buf, len, base_offset, "wire", err);
    wire_info in;
    waux aux;
    if (parse_record(&r, flags, &in, NULL, &aux, NULL, NULL) != PD_OK)
        return r.status;
    in.bytes = len;
    if (info)
        *info = in;
    return PD_OK;
}

/* ---- encoding ------------------------------------------------------------ */

/* A kv layer's state view with its heads array (owned). */
typedef struct kv_view {
    kv_state st;
    kv_head_state *heads;
} kv_view;

static pd_status kv_view_get(const wire_layer_ref *ref, kv_view *v, pd_err *err)
{
    CHECK(ref->kv_cfg && ref->kv_cfg->n_kv_heads > 0);
    v->heads = calloc(ref->kv_cfg->n_kv_heads, sizeof *v->heads);
    if (!v->heads)
        return pd_err_set(err, PD_ERR_NOMEM, "wire: no memory for %u head views",
                          ref->kv_cfg->n_kv_heads);
    kv_layer_state(ref->kv, &v->st, v->heads);
    CHECKF(v->st.n_kv_heads == ref->kv_cfg->n_kv_heads,
           "wire_layer_ref.kv_cfg says %u kv heads, the layer has %u", ref->kv_cfg->n_kv_heads,
           v->st.n_kv_heads);
    return PD_OK;
}

static void kv_view_release(kv_view *v)
{
    free(v->heads);
    v->heads = NULL;
}

static pd_status ref_check(const wire_layer_ref *ref, pd_err *err)
{
    if (!ref || (!ref->kv == !ref->ring))
        return pd_err_set(err, PD_ERR_ARG, "wire: exactly one of kv / ring must be set");
    if (ref->kv && (!ref->kv_cfg || ref->kv_cfg->n_kv_heads == 0))
        return pd_err_set(err, PD_ERR_ARG, "wire: a kv layer needs its kv_cfg");
    if (ref->ring && ref->linear)
        return pd_err_set(err, PD_ERR_ARG, "wire: a ring layer is never linear");
    return PD_OK;
}

static int fits_u32(uint64_t a, uint64_t b) { return b == 0 || a <= UINT32_MAX / b; }

/* Decides the kind of a kv layer's record, refusing what no kind describes. */
static pd_status kv_export_kind(const wire_layer_ref *ref, const kv_state *st, unsigned *kind,
                                pd_err *err)
{
    if (st->imp_pending)
        return pd_err_set(err, PD_ERR_REFUSED,
                          "wire: export: %u query positions of importance are pending; confirm "
                          "the layer (kv_layer_confirm) before exporting",
                          st->imp_pending);
    if (ref->linear) {
        if (st->rows || st->n_imp || st->has_bounded || st->frozen)
            return pd_err_set(err, PD_ERR_REFUSED,
                              "wire: export: a linear layer holding %llu rows%s is not described "
                              "by a linear record",
                              (unsigned long long)st->rows, st->has_bounded ? " and a ring" : "");
        if (st->n_linear > UINT32_MAX)
            return pd_err_set(err, PD_ERR_REFUSED, "wire: export: linear vector too long");
        *kind = WIRE_KIND_LINEAR;
        return PD_OK;
    }
    if (st->has_bounded) {
        if (st->rows || st->n_linear || st->n_imp || st->base)
            return pd_err_set(err, PD_ERR_REFUSED,
                              "wire: export: a bounded ring alongside per-position rows or a "
                              "linear vector is not described by this format");
        if (!fits_u32((uint64_t)st->n_kv_heads * st->bounded.window, st->head_dim))
            return pd_err_set(err, PD_ERR_REFUSED, "wire: export: bounded ring too large");
        *kind = WIRE_KIND_BOUNDED;
        return PD_OK;
    }
    if (st->rows > UINT32_MAX || !fits_u32(st->rows, st->head_dim) || st->n_linear > UINT32_MAX)
        return pd_err_set(err, PD_ERR_REFUSED,
                          "wire: export: %llu rows x %u channels exceed the format's u32 counts",
                          (unsigned long long)st->rows, st->head_dim);
    if (st->mode != KV_MODE_F32) {
        *kind = WIRE_KIND_Q8;
        return PD_OK;
    }
    if (st->frozen)
        return pd_err_set(err, PD_ERR_REFUSED,
                          "wire: export: frozen fields under an f32 cache are not described");
    *kind = st->base ? WIRE_KIND_FULL_TAIL : WIRE_KIND_FULL;
    return PD_OK;
}

static void put_payload(wr *w, int f16, const float *x, size_t n)
{
    if (f16)
        wr_f16_n(w, x, n);
    else
        wr_f32_n(w, x, n);
}

static void put_header(wr *w, const wire_layer_ref *ref, unsigned kind, int f16, uint64_t position)
{
    wr_bytes(w, WIRE_MAGIC, 4);
    wr_u32(w, WIRE_VERSION);
    wr_u64(w, ref->identity);
    wr_u32(w, ref->layer);
    wr_u8(w, (uint8_t)kind);
    wr_u8(w, (uint8_t)(f16 != 0));
    wr_u16(w, 0);
    wr_u64(w, position);
}

static int head_alive(const kv_state *st, uint32_t h) { return !st->alive || st->alive[h]; }

static void put_full_body(wr *w, const kv_state *st, const kv_head_state *heads, int f16)
{
    const size_t per = (size_t)st->rows * st->head_dim;
    wr_u32(w, (uint32_t)(f16 != 0));
    wr_u32(w, (uint32_t)st->rows);
    wr_u32(w, st->n_kv_heads);
    wr_u32(w, st->head_dim);
    wr_u32(w, (uint32_t)st->n_linear);
    wr_u32(w, (uint32_t)st->n_imp);
    wr_f32_n(w, st->linear, st->n_linear);
    wr_f32_n(w, st->imp, st->n_imp);
    for (uint32_t h = 0; h < st->n_kv_heads; h++) {
        int live = per && head_alive(st, h);
        wr_u32(w, live ? (uint32_t)per : 0);
        if (live)
            put_payload(w, f16, heads[h].k, per);
        wr_u32(w, live ? (uint32_t)per : 0);
        if (live)
            put_payload(w, f16, heads[h].v, per);
    }
}

static void put_q8_body(wr *w, const kv_state *st, const kv_head_state *heads, int f16)
{
    const size_t per = (size_t)st->rows * st->head_dim;
    const uint32_t kg = st->k_group;
    const size_t nks = (size_t)st->rows * ((st->head_dim + kg - 1) / kg), nvs = st->rows;
    const int qk = (st->mode & KV_MODE_Q8K) != 0, qv = (st->mode & KV_MODE_Q8V) != 0;
    wr_u32(w, st->n_kv_heads);
    wr_u32(w, st->head_dim);
    wr_u32(w, kg);
    wr_u32(w, st->freeze_rows);
    wr_u8(w, (uint8_t)st->mode);
    wr_u8(w, (uint8_t)(st->frozen != 0));
    wr_u16(w, 0);
    wr_u64(w, st->base);
    wr_u32(w, (uint32_t)st->rows);
    wr_u32(w, (uint32_t)st->n_linear);
    wr_u32(w, (uint32_t)st->n_imp);
    wr_f32_n(w, st->linear, st->n_linear);
    wr_f32_n(w, st->imp, st->n_imp);
    for (uint32_t h = 0; h < st->n_kv_heads; h++) {
        const kv_head_state *hs = &heads[h];
        const int alive = head_alive(st, h), live = per && alive;
        wr_u32(w, live ? (uint32_t)per : 0);
        if (live && qk)
            wr_i8_n(w, hs->kq, per);
        else if (live)
            put_payload(w, f16, hs->k, per);
        wr_u32(w, live && qk ? (uint32_t)nks : 0);
        if (live && qk)
            wr_f32_n(w, hs->ks, nks);
        wr_u32(w, live ? (uint32_t)per : 0);
        if (live && qv)
            wr_i8_n(w, hs->vq, per);
        else if (live)
            put_payload(w, f16, hs->v, per);
        wr_u32(w, live && qv ? (uint32_t)nvs : 0);
        if (live && qv)
            wr_f32_n(w, hs->vs, nvs);
        const int kc = alive && hs->kcol && st->frozen && qk;
        const int vc = alive && hs->vcol && st->frozen && qv;
        wr_u32(w, kc ? st->head_dim : 0);
        if (kc)
            wr_f32_n(w, hs->kcol, st->head_dim);
        wr_u32(w, vc ? st->head_dim : 0);
        if (vc)
            wr_f32_n(w, hs->vcol, st->head_dim);
    }
}

static pd_status encode_kv(const wire_layer_ref *ref, int f16, wr *w, pd_err *err)
{
    kv_view v = {0};
    pd_status s = kv_view_get(ref, &v, err);
    if (s != PD_OK)
        return s;
    const kv_state *st = &v.st;
    unsigned kind = 0;
    if ((s = kv_export_kind(ref, st, &kind, err)) != PD_OK) {
        kv_view_release(&v);
        return s;
    }
    switch (kind) {
    case WIRE_KIND_FULL:
        put_header(w, ref, kind, f16, st->rows);
        put_full_body(w, st, v.heads, f16);
        break;
    case WIRE_KIND_FULL_TAIL:
        put_header(w, ref, kind, f16, st->base + st->rows);
        wr_u64(w, st->base);
        put_full_body(w, st, v.heads, f16);
        break;
    case WIRE_KIND_LINEAR:
        put_header(w, ref, kind, f16, st->base + st->rows);
        wr_u32(w, st->n_kv_heads);
        wr_u32(w, st->head_dim);
        wr_u32(w, (uint32_t)st->n_linear);
        wr_f32_n(w, st->linear, st->n_linear);
        break;
    case WIRE_KIND_BOUNDED: {
        const kv_bounded_state *b = &st->bounded;
        const size_t n = (size_t)st->n_kv_heads * b->window * st->head_dim;
        CHECK(b->window > 0 && b->head == b->len % b->window);
        put_header(w, ref, kind, f16, b->len);
        wr_u32(w, st->n_kv_heads);
        wr_u32(w, st->head_dim);
        wr_u32(w, b->window);
        wr_u32(w, (uint32_t)(b->len < b->window ? b->len : b->window));
        wr_u32(w, b->head);
        put_payload(w, f16, b->k, n);
        put_payload(w, f16, b->v, n);
        break;
    }
    case WIRE_KIND_Q8:
        put_header(w, ref, kind, f16, st->base + st->rows);
        put_q8_body(w, st, v.heads, f16);
        break;
    default:
        CHECKF(0, "kv export kind %u", kind);
    }
    kv_view_release(&v);
    if (w->status != PD_OK)
        return pd_err_set(err, w->status, "wire: export: write failed");
    return PD_OK;
}

/* Kind 6: int8 components as codes + scales, the others in the payload dtype. */
static void encode_ring_q8(const wire_layer_ref *ref, const ring_state *rs, int f16, wr *w)
{
    const uint32_t G = (rs->head_dim + RING_K_GROUP - 1) / RING_K_GROUP;
    const int qk = (rs->mode & KV_MODE_Q8K) != 0, qv = (rs->mode & KV_MODE_Q8V) != 0;
    put_header(w, ref, WIRE_KIND_RING_Q8, f16, (uint64_t)rs->ref_rows + rs->writes);
    wr_u32(w, rs->n_kv_heads);
    wr_u32(w, rs->head_dim);
    wr_u32(w, rs->window);
    wr_u32(w, RING_K_GROUP);
    wr_u32(w, rs->ref_rows);
    wr_u32(w, rs->ring_len);
    wr_u32(w, rs->ring_pos);
    wr_u64(w, rs->writes);
    wr_u8(w, (uint8_t)(rs->decoding != 0));
    wr_u8(w, (uint8_t)rs->mode);
    wr_u16(w, 0);
    const float *const *f32[4] = {rs->ref_k, rs->ref_v, rs->ring_k, rs->ring_v};
    const int8_t *const *i8[4] = {rs->ref_kq, rs->ref_vq, rs->ring_kq, rs->ring_vq};
    const float *const *sc[4] = {rs->ref_ks, rs->ref_vs, rs->ring_ks, rs->ring_vs};
    for (uint32_t h = 0; h < rs->n_kv_heads; h++)
        for (int a = 0; a < 4; a++) {
            const int isk = a % 2 == 0, q = isk ? qk : qv;
            const size_t rows = a < 2 ? rs->ref_rows : rs->ring_len, n = rows * rs->head_dim;
            const size_t ns = q ? rows * (isk ? G : 1) : 0;
            wr_u32(w, (uint32_t)n);
            if (q && n)
                wr_i8_n(w, i8[a][h], n);
            else if (n)
                put_payload(w, f16, f32[a][h], n);
            wr_u32(w, (uint32_t)ns);
            if (ns)
                wr_f32_n(w, sc[a][h], ns);
        }
}

static pd_status encode_ring(const wire_layer_ref *ref, int f16, wr *w, pd_err *err)
{
    ring_state rs;
    ring_layer_state(ref->ring, &rs);
    const size_t nref = (size_t)rs.ref_rows * rs.head_dim, nring = (size_t)rs.ring_len * rs.head_dim;
    if (!fits_u32(rs.ref_rows, rs.head_dim) || !fits_u32(rs.ring_len, rs.head_dim))
        return pd_err_set(err, PD_ERR_REFUSED, "wire: export: ring rows exceed u32 counts");
    if (rs.mode != KV_MODE_F32) {
        encode_ring_q8(ref, &rs, f16, w);
        if (w->status != PD_OK)
            return pd_err_set(err, w->status, "wire: export: write failed");
        return PD_OK;
    }
    put_header(w, ref, WIRE_KIND_RING, f16, (uint64_t)rs.ref_rows + rs.writes);
    wr_u32(w, rs.n_kv_heads);
    wr_u32(w, rs.head_dim);
    wr_u32(w, rs.window);
    wr_u32(w, rs.ref_rows);
    wr_u32(w, rs.ring_len);
    wr_u32(w, rs.ring_pos);
    wr_u64(w, rs.writes);
    wr_u8(w, (uint8_t)(rs.decoding != 0));
    wr_u8(w, (uint8_t)(rs.int8_mirror != 0));
    wr_u16(w, 0);
    for (uint32_t h = 0; h < rs.n_kv_heads; h++) {
        wr_u32(w, (uint32_t)nref);
        put_payload(w, f16, rs.ref_k[h], nref);
        wr_u32(w, (uint32_t)nref);
        put_payload(w, f16, rs.ref_v[h], nref);
        wr_u32(w, (uint32_t)nring);
        put_payload(w, f16, rs.ring_k[h], nring);
        wr_u32(w, (uint32_t)nring);
        put_payload(w, f16, rs.ring_v[h], nring);
    }
    if (w->status != PD_OK)
        return pd_err_set(err, w->status, "wire: export: write failed");
    return PD_OK;
}

pd_status wire_encode(const wire_layer_ref *ref, int f16, wr *w, pd_err *err)
{
    pd_status s = ref_check(ref, err);
    if (s != PD_OK)
        return s;
    if (w->status != PD_OK)
        return pd_err_set(err, w->status, "wire: export: writer already failed");
    return ref->kv ? encode_kv(ref, f16, w, err) : encode_ring(ref, f16, w, err);
}

pd_status wire_record_size(const wire_layer_ref *ref, int f16, size_t *size, pd_err *err)
{
    wr w;
    wr_init_count(&w, err);
    pd_status s = wire_encode(ref, f16, &w, err);
    if (s != PD_OK)
        return s;
    if (w.total > SIZE_MAX)
        return pd_err_set(err, PD_ERR_NOMEM, "wire: record of %llu bytes",
                          (unsigned long long)w.total);
    *size = (size_t)w.total;
    return PD_OK;
}

pd_status wire_export(const wire_layer_ref *ref, int f16, uint8_t **out, size_t *len, pd_err *err)
{
    size_t n = 0;
    pd_status s = wire_record_size(ref, f16, &n, err);
    if (s != PD_OK)
        return s;
    wr w;
    if ((s = wr_init_buffer(&w, n, err)) != PD_OK)
        return s;
    if ((s = wire_encode(ref, f16, &w, err)) != PD_OK) {
        wr_dispose(&w);
        return s;
    }
    CHECKF(w.fill == n, "record size %zu, encoded %zu", n, w.fill);
    *out = wr_take(&w, len);
    return PD_OK;
}

/* ---- import -------------------------------------------------------------- */

struct wire_pending {
    kv_layer *kv_target, *kv;
    ring_layer *ring_target, *ring;
    int kv_is_spare; /* kv is the caller's spare: swapped, never freed */
};

/* Payload arrays as f32 pointers: aligned little-endian f32 spans are used
 * in place (the fresh layer copies them); the rest is widened into one
 * scratch block. Every value is finite: the validating walk (take_array)
 * refused the record otherwise. */
typedef struct wmat {
    float *scratch;
    size_t used, cap;
} wmat;

static int span_direct(const wspan *s)
{
    return s->dt == DT_I8 ||
           (s->dt == DT_F32 && WIRE_HOST_LE && ((uintptr_t)s->p % _Alignof(float)) == 0);
}

static size_t span_scratch_floats(const wspan *s) { return s->n && !span_direct(s) ? s->n : 0; }

static const float *span_f32(const wspan *s, wmat *m)
{
    if (s->n == 0)
        return NULL;
    CHECK(s->dt != DT_I8);
    const float *x;
    if (span_direct(s)) {
        x = (const float *)(const void *)s->p;
    } else {
        CHECK(m->used + s->n <= m->cap);
        float *dst = m->scratch + m->used;
        m->used += s->n;
        if (s->dt == DT_F16)
            rd_f16_decode(s->p, dst, s->n);
        else
            rd_f32_decode(s->p, dst, s->n);
        x = dst;
    }
    return x;
}

static const int8_t *span_i8(const wspan *s)
{
    CHECK(s->n == 0 || s->dt == DT_I8);
    return s->n ? (const int8_t *)(const void *)s->p : NULL;
}

/* Geometry of the record against a kv target. */
static pd_status check_kv_geometry(rd *r, const waux *aux, const wire_info *in,
                                   const kv_layer_config *cfg, const kv_state *tst)
{
    if (in->kv_heads != cfg->n_kv_heads || in->head_dim != cfg->head_dim)
        return rd_fail_at(r, aux->geom_off, PD_ERR_MISMATCH,
                          "record geometry %u kv heads x %u, this layer is %u x %u", in->kv_heads,
                          in->head_dim, cfg->n_kv_heads, cfg->head_dim);
    if (in->kind == WIRE_KIND_Q8 &&
        (in->mode != tst->mode || in->k_group != tst->k_group || in->freeze_rows != tst->freeze_rows))
        return rd_fail_at(r, aux->geom_off, PD_ERR_MISMATCH,
                          "record storage mode %u (k_group %u, freeze %u), this layer is mode %u "
                          "(k_group %u, freeze %u)",
                          in->mode, in->k_group, in->freeze_rows, (unsigned)tst->mode,
                          tst->k_group, tst->freeze_rows);
    if (in->kind == WIRE_KIND_BOUNDED && in->window != tst->bounded.window)
        return rd_fail_at(r, aux->geom_off, PD_ERR_MISMATCH,
                          "bounded window %u, this layer's ring holds %u", in->window,
                          tst->bounded.window);
    return PD_OK;
}

/* The alive mask is the layer's, fixed at creation: a record must hold rows
 * exactly for the heads that are alive here. */
static pd_status kv_alive_check(rd *r, const waux *aux, uint32_t H, const kv_state *tst, const wspans *sp)
{
    for (uint32_t h = 0; h < H; h++) {
        int rec = sp->heads[(size_t)h * HS_COUNT + HS_K].n != 0;
        if (rec != head_alive(tst, h))
            return rd_fail_at(r, aux->geom_off, PD_ERR_MISMATCH,
                              "head %u: record %s rows, this layer's head is %s", h,
                              rec ? "holds" : "holds no", rec ? "dead" : "alive");
    }
    return PD_OK;
}

/* The record's rows, importance, recurrent vectors or ring as the state of
 * kind in->kind: s points into the record (int8 spans) and into m's scratch
 * (f32 spans, converted as needed), heads[H] and alive[H] filled. */
static void kv_state_of_spans(const wire_info *in, const kv_state *tst, wspans *sp, wmat *m, kv_head_state *heads,
                              uint8_t *alive, kv_state *s)
{
    const uint32_t H = in->kv_heads;
    for (uint32_t h = 0; h < H; h++)
        alive[h] = (uint8_t)head_alive(tst, h);
    *s = (kv_state){
        .n_kv_heads = H,
        .head_dim = in->head_dim,
        .k_group = tst->k_group,
        .freeze_rows = tst->freeze_rows,
        .mode = tst->mode,
        .alive = alive,
        .tail_window = tst->tail_window,
        .heads = heads,
        .linear = span_f32(&sp->linear, m),
        .n_linear = sp->linear.n,
    };
    switch (in->kind) {
    case WIRE_KIND_FULL:
    case WIRE_KIND_FULL_TAIL:
    case WIRE_KIND_Q8:
        s->rows = in->rows;
        s->base = in->base;
        s->frozen = in->frozen;
        s->imp = span_f32(&sp->imp, m);
        s->n_imp = sp->imp.n;
        for (uint32_t h = 0; h < H; h++) {
            const wspan *hs = &sp->heads[(size_t)h * HS_COUNT];
            kv_head_state *o = &heads[h];
            if (hs[HS_K].dt == DT_I8)
                o->kq = span_i8(&hs[HS_K]);
            else
                o->k = span_f32(&hs[HS_K], m);
            if (hs[HS_V].dt == DT_I8)
                o->vq = span_i8(&hs[HS_V]);
            else
                o->v = span_f32(&hs[HS_V], m);
            o->ks = span_f32(&hs[HS_KS], m);
            o->vs = span_f32(&hs[HS_VS], m);
            o->kcol = span_f32(&hs[HS_KCOL], m);
            o->vcol = span_f32(&hs[HS_VCOL], m);
        }
        break;
    case WIRE_KIND_LINEAR:
        s->base = in->position; /* no rows: the depth is carried by base */
        break;
    case WIRE_KIND_BOUNDED:
        s->has_bounded = 1;
        s->bounded = (kv_bounded_state){
            .window = in->window,
            .len = in->position,
            .head = (uint32_t)(in->position % in->window),
            .k = span_f32(&sp->bk, m),
            .v = span_f32(&sp->bv, m),
        };
        break;
    default:
        CHECKF(0, "kv import of kind %u", in->kind);
    }
}

/* State s into the caller's spare layer (its geometry and mode those of the
 * target) or into a new layer sized for its rows. */
static pd_status kv_install(const wire_layer_ref *ref, const kv_state *tst, const kv_state *s, kv_layer **out,
                            pd_err *err)
{
    const kv_layer_config *cfg = ref->kv_cfg;
    if (!ref->kv_spare) {
        kv_layer_config c = *cfg;
        if (s->rows > c.capacity_rows)
            c.capacity_rows = (uint32_t)s->rows;
        return kv_layer_new_from_state(&c, s, out, err);
    }
    kv_layer_config sc;
    kv_layer_config_get(ref->kv_spare, &sc);
    if (sc.n_kv_heads != cfg->n_kv_heads || sc.head_dim != cfg->head_dim || sc.mode != cfg->mode ||
        memcmp(sc.alive, tst->alive, cfg->n_kv_heads) != 0)
        return pd_err_set(err, PD_ERR_ARG, "wire: the spare layer's geometry or mode differs from the target's");
    pd_status st = kv_layer_assign_state(ref->kv_spare, s, err);
    if (st == PD_OK)
        *out = ref->kv_spare;
    return st;
}

static pd_status prepare_kv(const wire_layer_ref *ref, rd *r, const wire_info *in,
                            const waux *aux, const kv_view *tv, wspans *sp, kv_layer **out,
                            pd_err *err)
{
    const kv_state *tst = &tv->st;
    if (check_kv_geometry(r, aux, in, ref->kv_cfg, tst) != PD_OK)
        return r->status;
    const uint32_t H = in->kv_heads;
    const int per_head = in->kind == WIRE_KIND_FULL || in->kind == WIRE_KIND_FULL_TAIL ||
                         in->kind == WIRE_KIND_Q8;
    if (per_head && in->rows && kv_alive_check(r, aux, H, tst, sp) != PD_OK)
        return r->status;

    size_t need = span_scratch_floats(&sp->linear) + span_scratch_floats(&sp->imp) +
                  span_scratch_floats(&sp->bk) + span_scratch_floats(&sp->bv);
    if (per_head)
        for (size_t i = 0; i < (size_t)H * HS_COUNT; i++)
            need += span_scratch_floats(&sp->heads[i]);
    wmat m = {.cap = need};
    kv_head_state *heads = calloc(H, sizeof *heads);
    uint8_t *alive = malloc(H);
    pd_status st = PD_OK;
    if ((need && !(m.scratch = malloc(need * sizeof(float)))) || !heads || !alive)
        st = pd_err_set(err, PD_ERR_NOMEM, "wire: no memory to decode %u heads", H);
    if (st == PD_OK) {
        kv_state s;
        kv_state_of_spans(in, tst, sp, &m, heads, alive, &s);
        kv_layer *fresh = NULL;
        if ((st = kv_install(ref, tst, &s, &fresh, err)) != PD_OK)
            pd_err_prefix(err, "wire: offset %zu: install", r->base);
        else
            *out = fresh;
    }
    free(m.scratch);
    free(heads);
    free(alive);
    return st;
}

static pd_status prepare_ring(const wire_layer_ref *ref, rd *r, const wire_info *in,
                              const waux *aux, wspans *sp, ring_layer **out, pd_err *err)
{
    ring_layer_config cfg;
    ring_layer_config_get(ref->ring, &cfg);
    if (in->kv_heads != cfg.n_kv_heads || in->head_dim != cfg.head_dim || in->window != cfg.window)
        return rd_fail_at(r, aux->geom_off, PD_ERR_MISMATCH,
                          "record geometry %u kv heads x %u, window %u; this layer is %u x %u, "
                          "window %u",
                          in->kv_heads, in->head_dim, in->window, cfg.n_kv_heads, cfg.head_dim,
                          cfg.window);
    if (in->int8_mirror != (cfg.int8_mirror != 0))
        return rd_fail_at(r, aux->geom_off, PD_ERR_MISMATCH,
                          "record int8 mirror %u, this layer's is %d", in->int8_mirror,
                          cfg.int8_mirror != 0);
    const int q8 = in->kind == WIRE_KIND_RING_Q8;
    if (q8 && (in->mode != cfg.mode || in->k_group != RING_K_GROUP))
        return rd_fail_at(r, aux->geom_off, PD_ERR_MISMATCH,
                          "record int8 storage %u with k_group %u; this layer stores mode %u with "
                          "k_group %u",
                          in->mode, in->k_group, (unsigned)cfg.mode, RING_K_GROUP);
    if (in->rows > cfg.ref_capacity)
        return rd_fail_at(r, aux->geom_off, PD_ERR_RANGE,
                          "record reference of %llu rows exceeds this layer's capacity %u",
                          (unsigned long long)in->rows, cfg.ref_capacity);
    const uint32_t H = in->kv_heads;
    size_t need = 0;
    for (size_t i = 0; i < (size_t)H * HS_COUNT; i++)
        need += span_scratch_floats(&sp->heads[i]);
    wmat m = {.cap = need};
    const float **ptrs = calloc((size_t)H * 4, sizeof *ptrs);
    const float **sptrs = calloc((size_t)H * 4, sizeof *sptrs);
    const int8_t **qptrs = calloc((size_t)H * 4, sizeof *qptrs);
    if ((need && !(m.scratch = malloc(need * sizeof(float)))) || !ptrs || !sptrs || !qptrs) {
        free(m.scratch);
        free(ptrs);
        free(sptrs);
        free(qptrs);
        return pd_err_set(err, PD_ERR_NOMEM, "wire: no memory to decode %u heads", H);
    }
    /* Empty regions still need a valid pointer per head. */
    static const float none[1] = {0.0f};
    static const int8_t none8[1] = {0};
    for (uint32_t h = 0; h < H; h++)
        for (int s = 0; s < 4; s++) {
            const wspan *hs = &sp->heads[(size_t)h * HS_COUNT + (q8 ? 2 * s : s)];
            if (hs->dt == DT_I8) {
                const int8_t *p = span_i8(hs);
                qptrs[(size_t)s * H + h] = p ? p : none8;
                const float *sc = span_f32(hs + 1, &m);
                sptrs[(size_t)s * H + h] = sc ? sc : none;
            } else {
                const float *p = span_f32(hs, &m);
                ptrs[(size_t)s * H + h] = p ? p : none;
            }
        }
    /* Tables of a component stored int8 (f32 ones of the others) only. */
    const int qk = q8 && (cfg.mode & KV_MODE_Q8K), qv = q8 && (cfg.mode & KV_MODE_Q8V);
    ring_state s = {
        .n_kv_heads = H,
        .head_dim = in->head_dim,
        .window = in->window,
        .ref_rows = (uint32_t)in->rows,
        .ring_len = in->ring_len,
        .ring_pos = in->ring_pos,
        .writes = in->writes,
        .decoding = in->decoding,
        .int8_mirror = in->int8_mirror,
        .mode = q8 ? cfg.mode : KV_MODE_F32,
        .ref_k = qk ? NULL : ptrs + (size_t)HS_REF_K * H,
        .ref_v = qv ? NULL : ptrs + (size_t)HS_REF_V * H,
        .ring_k = qk ? NULL : ptrs + (size_t)HS_RING_K * H,
        .ring_v = qv ? NULL : ptrs + (size_t)HS_RING_V * H,
        .ref_kq = qk ? qptrs + (size_t)HS_REF_K * H : NULL,
        .ref_ks = qk ? sptrs + (size_t)HS_REF_K * H : NULL,
        .ring_kq = qk ? qptrs + (size_t)HS_RING_K * H : NULL,
        .ring_ks = qk ? sptrs + (size_t)HS_RING_K * H : NULL,
        .ref_vq = qv ? qptrs + (size_t)HS_REF_V * H : NULL,
        .ref_vs = qv ? sptrs + (size_t)HS_REF_V * H : NULL,
        .ring_vq = qv ? qptrs + (size_t)HS_RING_V * H : NULL,
        .ring_vs = qv ? sptrs + (size_t)HS_RING_V * H : NULL,
    };
    ring_layer *fresh = NULL;
    pd_status st = ring_layer_new_from_state(&cfg, &s, &fresh, err);
    if (st != PD_OK)
        pd_err_prefix(err, "wire: offset %zu: install", r->base);
    free(m.scratch);
    free(ptrs);
    free(sptrs);
    free(qptrs);
    if (st == PD_OK)
        *out = fresh;
    return st;
}

pd_status wire_import_prepare(const wire_layer_ref *ref, const void *buf, size_t len,
                              unsigned flags, size_t base_offset, wire_pending **out, pd_err *err)
{
    pd_status s = ref_check(ref, err);
    if (s != PD_OK)
        return s;
    if (!out)
        return pd_err_set(err, PD_ERR_ARG, "wire: out is NULL");
    kv_view tv = {0};
    if (ref->kv && (s = kv_view_get(ref, &tv, err)) != PD_OK)
        return s;

    /* Walk 1: validate everything, allocate nothing. */
    rd r;
    rd_init(&r, buf, len, base_offset, "wire", err);
    wire_info in;
    waux aux;
    if (parse_record(&r, flags, &in, NULL, &aux, ref, &tv.st) != PD_OK) {
        kv_view_release(&tv);
        return r.status;
    }
    /* Walk 2: collect the spans (the head count was bounded by the bytes). */
    const int per_head = in.kind == WIRE_KIND_FULL || in.kind == WIRE_KIND_FULL_TAIL ||
                         in.kind == WIRE_KIND_Q8 || in.kind == WIRE_KIND_RING ||
                         in.kind == WIRE_KIND_RING_Q8;
    wspans sp = {0};
    if (per_head && !(sp.heads = calloc((size_t)in.kv_heads * HS_COUNT, sizeof *sp.heads))) {
        kv_view_release(&tv);
        return pd_err_set(err, PD_ERR_NOMEM, "wire: no memory for %u head spans", in.kv_heads);
    }
    rd r2;
    rd_init(&r2, buf, len, base_offset, "wire", NULL);
    wire_info in2;
    waux aux2;
    CHECK(parse_record(&r2, flags, &in2, &sp, &aux2, NULL, NULL) == PD_OK);

    wire_pending *p = calloc(1, sizeof *p);
    if (!p) {
        free(sp.heads);
        kv_view_release(&tv);
        return pd_err_set(err, PD_ERR_NOMEM, "wire: no memory");
    }
    if (ref->kv) {
        p->kv_target = ref->kv;
        p->kv_is_spare = ref->kv_spare != NULL;
        s = prepare_kv(ref, &r, &in, &aux, &tv, &sp, &p->kv, err);
    } else {
        p->ring_target = ref->ring;
        s = prepare_ring(ref, &r, &in, &aux, &sp, &p->ring, err);
    }
    free(sp.heads);
    kv_view_release(&tv);
    if (s != PD_OK) {
        free(p);
        return s;
    }
    *out = p;
    return PD_OK;
}

void wire_import_commit(wire_pending *p)
{
    if (!p)
        return;
    if (p->kv) {
        kv_layer_swap(p->kv_target, p->kv);
        if (!p->kv_is_spare)
            kv_layer_free(p->kv);
    } else {
        ring_layer_swap(p->ring_target, p->ring);
        ring_layer_free(p->ring);
    }
    free(p);
}

void wire_pending_free(wire_pending *p)
{
    if (!p)
        return;
    if (!p->kv_is_spare)
        kv_layer_free(p->kv);
    ring_layer_free(p->ring);
    free(p);
}

pd_status wire_import(const wire_layer_ref *ref, const void *buf, size_t len, unsigned flags,
                      size_t base_offset, pd_err *err)
{
    wire_pending *p = NULL;
    pd_status s = wire_import_prepare(ref, buf, len, flags, base_offset, &p, err);
    if (s != PD_OK)
        return s;
    wire_import_commit(p);
    return PD_OK;
}
