/* The bounds-checked reader and the counting / buffer / sink writer (rd.h).
 * Every multi-byte value is assembled from bytes, so the code is correct on
 * any host; little-endian hosts take memcpy fast paths for f32 arrays. */
#include "comm/rd.h"

#include "base/check.h"
#include "base/cpu.h"
#include "base/fp16.h"
#include "comm/crc32c.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define RD_HOST_LE 1
#else
#define RD_HOST_LE 0
#endif

/* Elements converted per stack chunk in the f16 paths (fits L1). */
#define RD_CHUNK 1024

/* ---- reader -------------------------------------------------------------- */

void rd_init(rd *r, const void *buf, size_t len, size_t base, const char *ctx, pd_err *err)
{
    *r = (rd){
        .p = (const uint8_t *)buf,
        .len = buf ? len : 0,
        .off = 0,
        .base = base,
        .ctx = ctx ? ctx : "read",
        .err = err,
        .status = PD_OK,
    };
}

static pd_status rd_vfail(rd *r, size_t abs_off, pd_status s, const char *fmt, va_list ap)
{
    if (r->status != PD_OK)
        return r->status;
    r->status = s;
    char msg[400];
    vsnprintf(msg, sizeof msg, fmt, ap);
    pd_err_set(r->err, s, "%s: offset %zu: %s", r->ctx, abs_off, msg);
    return s;
}

pd_status rd_fail(rd *r, pd_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pd_status out = rd_vfail(r, rd_offset(r), s, fmt, ap);
    va_end(ap);
    return out;
}

pd_status rd_fail_at(rd *r, size_t abs_off, pd_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pd_status out = rd_vfail(r, abs_off, s, fmt, ap);
    va_end(ap);
    return out;
}

/* Ensures n bytes remain. */
static pd_status rd_need(rd *r, const char *field, size_t n)
{
    if (r->status != PD_OK)
        return r->status;
    if (n > rd_remaining(r))
        return rd_fail(r, PD_ERR_TRUNCATED, "%s needs %zu bytes, %zu remain", field, n,
                       rd_remaining(r));
    return PD_OK;
}

uint16_t rd_le16(const uint8_t *p) { return (uint16_t)(p[0] | (uint16_t)p[1] << 8); }

uint32_t rd_le32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t rd_le64(const uint8_t *p) { return (uint64_t)rd_le32(p) | (uint64_t)rd_le32(p + 4) << 32; }

pd_status rd_u8(rd *r, const char *field, uint8_t *out)
{
    pd_status s = rd_need(r, field, 1);
    if (s != PD_OK)
        return s;
    *out = r->p[r->off];
    r->off += 1;
    return PD_OK;
}

pd_status rd_u16(rd *r, const char *field, uint16_t *out)
{
    pd_status s = rd_need(r, field, 2);
    if (s != PD_OK)
        return s;
    *out = rd_le16(r->p + r->off);
    r->off += 2;
    return PD_OK;
}

pd_status rd_u32(rd *r, const char *field, uint32_t *out)
{
    pd_status s = rd_need(r, field, 4);
    if (s != PD_OK)
        return s;
    *out = rd_le32(r->p + r->off);
    r->off += 4;
    return PD_OK;
}

pd_status rd_u64(rd *r, const char *field, uint64_t *out)
{
    pd_status s = rd_need(r, field, 8);
    if (s != PD_OK)
        return s;
    *out = rd_le64(r->p + r->off);
    r->off += 8;
    return PD_OK;
}

pd_status rd_check_count(rd *r, const char *field, uint64_t count, size_t elem_size,
                         size_t *bytes)
{
    if (r->status != PD_OK)
        return r->status;
    CHECK(elem_size > 0);
    if (count > (uint64_t)(SIZE_MAX / elem_size))
        return rd_fail(r, PD_ERR_RANGE, "%s %llu x %zu bytes overflows the address space", field,
                       (unsigned long long)count, elem_size);
    size_t n = (size_t)count * elem_size;
    if (n > rd_remaining(r))
        return rd_fail(r, PD_ERR_TRUNCATED, "%s %llu (%zu bytes) exceeds %zu remaining bytes",
                       field, (unsigned long long)count, n, rd_remaining(r));
    *bytes = n;
    return PD_OK;
}

pd_status rd_span(rd *r, const char *field, size_t n, const uint8_t **out)
{
    pd_status s = rd_need(r, field, n);
    if (s != PD_OK)
        return s;
    *out = r->p + r->off;
    r->off += n;
    return PD_OK;
}

pd_status rd_skip(rd *r, const char *field, size_t n)
{
    pd_status s = rd_need(r, field, n);
    if (s != PD_OK)
        return s;
    r->off += n;
    return PD_OK;
}

pd_status rd_bytes(rd *r, const char *field, void *dst, size_t n)
{
    pd_status s = rd_need(r, field, n);
    if (s != PD_OK)
        return s;
    if (n)
        memcpy(dst, r->p + r->off, n);
    r->off += n;
    return PD_OK;
}

void rd_f32_decode(const uint8_t *src, float *dst, size_t n)
{
#if RD_HOST_LE
    if (n)
        memcpy(dst, src, n * sizeof(float));
#else
    for (size_t i = 0; i < n; i++) {
        uint32_t u = rd_le32(src + 4 * i);
        memcpy(dst + i, &u, 4);
    }
#endif
}

void rd_f16_decode(const uint8_t *src, float *dst, size_t n)
{
    uint16_t tmp[RD_CHUNK];
    while (n) {
        size_t m = n < RD_CHUNK ? n : RD_CHUNK;
#if RD_HOST_LE
        memcpy(tmp, src, m * 2);
#else
        for (size_t i = 0; i < m; i++)
            tmp[i] = rd_le16(src + 2 * i);
#endif
        pd_f16_to_f32_n(tmp, dst, m);
        src += m * 2;
        dst += m;
        n -= m;
    }
}

static pd_status rd_array(rd *r, const char *field, size_t n, size_t elem, const uint8_t **src)
{
    size_t bytes = 0;
    pd_status s = rd_check_count(r, field, n, elem, &bytes);
    if (s != PD_OK)
        return s;
    *src = r->p + r->off;
    r->off += bytes;
    return PD_OK;
}

pd_status rd_f32_n(rd *r, const char *field, float *dst, size_t n)
{
    const uint8_t *src = NULL;
    pd_status s = rd_array(r, field, n, 4, &src);
    if (s == PD_OK && dst)
        rd_f32_decode(src, dst, n);
    return s;
}

pd_status rd_f16_n(rd *r, const char *field, float *dst, size_t n)
{
    const uint8_t *src = NULL;
    pd_status s = rd_array(r, field, n, 2, &src);
    if (s == PD_OK && dst)
        rd_f16_decode(src, dst, n);
    return s;
}

pd_status rd_i8_n(rd *r, const char *field, int8_t *dst, size_t n)
{
    const uint8_t *src = NULL;
    pd_status s = rd_array(r, field, n, 1, &src);
    if (s == PD_OK && dst && n)
        memcpy(dst, src, n);
    return s;
}

pd_status rd_until(rd *r, uint8_t delim, const uint8_t **out, size_t *n, bool *found)
{
    if (r->status != PD_OK)
        return r->status;
    const uint8_t *start = r->p + r->off;
    size_t left = rd_remaining(r);
    const uint8_t *hit = left ? memchr(start, delim, left) : NULL;
    *out = start;
    *n = hit ? (size_t)(hit - start) : left;
    *found = hit != NULL;
    r->off += *n + (hit ? 1 : 0);
    return PD_OK;
}

pd_status rd_expect_end(rd *r)
{
    if (r->status != PD_OK)
        return r->status;
    if (rd_remaining(r))
        return rd_fail(r, PD_ERR_FORMAT, "%zu trailing byte(s) after the end", rd_remaining(r));
    return PD_OK;
}

static uint32_t max_abs_bits_scalar(const float *x, size_t n)
{
    uint32_t m = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, x + i, 4);
        u &= 0x7fffffffu;
        m = u > m ? u : m;
    }
    return m;
}

#if defined(__x86_64__)
#include <immintrin.h>

static pd_status wr_reserve(wr *w, size_t more);

__attribute__((target("avx2"))) static uint32_t max_abs_bits_avx2(const float *x, size_t n)
{
    const __m256i mask = _mm256_set1_epi32(0x7fffffff);
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        a0 = _mm256_max_epu32(a0, _mm256_and_si256(mask, _mm256_loadu_si256((const __m256i *)(x + i))));
        a1 = _mm256_max_epu32(a1, _mm256_and_si256(mask, _mm256_loadu_si256((const __m256i *)(x + i + 8))));
        a2 = _mm256_max_epu32(a2, _mm256_and_si256(mask, _mm256_loadu_si256((const __m256i *)(x + i + 16))));
        a3 = _mm256_max_epu32(a3, _mm256_and_si256(mask, _mm256_loadu_si256((const __m256i *)(x + i + 24))));
    }
    __m256i a = _mm256_max_epu32(_mm256_max_epu32(a0, a1), _mm256_max_epu32(a2, a3));
    uint32_t lanes[8];
    _mm256_storeu_si256((__m256i *)lanes, a);
    uint32_t m = max_abs_bits_scalar(x + i, n - i);
    for (int l = 0; l < 8; l++)
        m = lanes[l] > m ? lanes[l] : m;
    return m;
}
#endif

uint32_t rd_f32_max_abs_bits(const float *x, size_t n)
{
#if defined(__x86_64__)
    if (pd_cpu_isa() >= PD_ISA_AVX2)
        return max_abs_bits_avx2(x, n);
#endif
    return max_abs_bits_scalar(x, n);
}

size_t rd_f32_first_nonfinite(const float *x, size_t n)
{
    enum { B = 4096 };
    for (size_t i0 = 0; i0 < n; i0 += B) {
        size_t m = n - i0 < B ? n - i0 : B;
        if (rd_f32_max_abs_bits(x + i0, m) >= 0x7f800000u)
            for (size_t i = i0; i < i0 + m; i++)
                if (rd_f32_max_abs_bits(x + i, 1) >= 0x7f800000u)
                    return i;
    }
    return n;
}

/* ---- writer -------------------------------------------------------------- */

pd_status wr_sink_file(void *file, const void *bytes, size_t n, pd_err *err)
{
    if (n && fwrite(bytes, 1, n, (FILE *)file) != n)
        return pd_err_set(err, PD_ERR_IO, "write: %s", strerror(errno));
    return PD_OK;
}

pd_status wr_sink_fd(void *fd_ptr, const void *bytes, size_t n, pd_err *err)
{
    int fd = *(const int *)fd_ptr;
    const uint8_t *p = bytes;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            return pd_err_set(err, PD_ERR_IO, "write: %s", k < 0 ? strerror(errno) : "no progress");
        p += k;
        n -= (size_t)k;
    }
    return PD_OK;
}

void wr_init_count(wr *w, pd_err *err)
{
    *w = (wr){.mode = WR_MODE_COUNTING, .err = err, .status = PD_OK};
}

pd_status wr_init_buffer(wr *w, size_t reserve, pd_err *err)
{
    *w = (wr){.mode = WR_MODE_BUFFER, .err = err, .status = PD_OK};
    return reserve ? wr_reserve(w, reserve) : PD_OK;
}

void wr_init_sink(wr *w, wr_sink_fn sink, void *sink_ctx, void *staging, size_t staging_len,
                  pd_err *err)
{
    CHECK(sink && staging && staging_len >= 64);
    *w = (wr){
        .mode = WR_MODE_SINK,
        .buf = staging,
        .cap = staging_len,
        .sink = sink,
        .sink_ctx = sink_ctx,
        .err = err,
        .status = PD_OK,
    };
}

static pd_status wr_failed(wr *w, pd_status s)
{
    if (w->status == PD_OK)
        w->status = s;
    return w->status;
}

/* BUFFER mode: ensures room for `more` bytes beyond what is written. */
static pd_status wr_reserve(wr *w, size_t more)
{
    if (w->status != PD_OK)
        return w->status;
    if (w->mode != WR_MODE_BUFFER || more <= w->cap - w->fill)
        return PD_OK;
    if (more > SIZE_MAX - w->fill)
        return wr_failed(w, pd_err_set(w->err, PD_ERR_NOMEM, "write: size overflow"));
    size_t need = w->fill + more;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < need)
        cap = cap > SIZE_MAX / 2 ? need : cap * 2;
    uint8_t *nb = realloc(w->buf, cap);
    if (!nb)
        return wr_failed(w, pd_err_set(w->err, PD_ERR_NOMEM, "write: cannot grow to %zu bytes", cap));
    w->buf = nb;
    w->cap = cap;
    return PD_OK;
}

pd_status wr_flush(wr *w)
{
    if (w->status != PD_OK)
        return w->status;
    if (w->mode != WR_MODE_SINK || w->fill == 0)
        return PD_OK;
    pd_status s = w->sink(w->sink_ctx, w->buf, w->fill, w->err);
    w->fill = 0;
    return s == PD_OK ? PD_OK : wr_failed(w, s);
}

/* Accounts n bytes about to be emitted from p (CRC and total). */
static void wr_account(wr *w, const void *p, size_t n)
{
    if (w->crc_on)
        w->crc = crc32c_update(w->crc, p, n);
    w->total += n;
}

pd_status wr_bytes(wr *w, const void *p, size_t n)
{
    if (w->status != PD_OK)
        return w->status;
    if (n == 0)
        return PD_OK;
    switch (w->mode) {
    case WR_MODE_COUNTING:
        if (w->crc_on)
            w->crc = crc32c_update(w->crc, p, n);
        w->total += n;
        return PD_OK;
    case WR_MODE_BUFFER: {
        pd_status s = wr_reserve(w, n);
        if (s != PD_OK)
            return s;
        memcpy(w->buf + w->fill, p, n);
        w->fill += n;
        wr_account(w, p, n);
        return PD_OK;
    }
    case WR_MODE_SINK:
        wr_account(w, p, n);
        if (n <= w->cap - w->fill) {
            memcpy(w->buf + w->fill, p, n);
            w->fill += n;
            return PD_OK;
        }
        /* Large payload: flush what is staged, then hand it over directly. */
        if (wr_flush(w) != PD_OK)
            return w->status;
        if (n < w->cap) {
            memcpy(w->buf, p, n);
            w->fill = n;
            return PD_OK;
        }
        {
            pd_status s = w->sink(w->sink_ctx, p, n, w->err);
            return s == PD_OK ? PD_OK : wr_failed(w, s);
        }
    default:
        CHECKF(0, "writer mode %d", (int)w->mode);
    }
    return PD_ERR_ARG;
}

pd_status wr_u8(wr *w, uint8_t v) { return wr_bytes(w, &v, 1); }

pd_status wr_u16(wr *w, uint16_t v)
{
    uint8_t b[2] = {(uint8_t)v, (uint8_t)(v >> 8)};
    return wr_bytes(w, b, 2);
}

pd_status wr_u32(wr *w, uint32_t v)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return wr_bytes(w, b, 4);
}

pd_status wr_u64(wr *w, uint64_t v)
{
    uint8_t b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)(v >> (8 * i));
    return wr_bytes(w, b, 8);
}

/* Bytes of n elements of elem_size, or fails the writer on overflow. */
static pd_status wr_array_bytes(wr *w, size_t n, size_t elem_size, size_t *bytes)
{
    if (n > SIZE_MAX / elem_size)
        return wr_failed(w, pd_err_set(w->err, PD_ERR_NOMEM, "write: %zu elements overflow", n));
    *bytes = n * elem_size;
    return PD_OK;
}

pd_status wr_f32_n(wr *w, const float *x, size_t n)
{
    if (w->status != PD_OK)
        return w->status;
    size_t bytes = 0;
    if (wr_array_bytes(w, n, 4, &bytes) != PD_OK)
        return w->status;
#if RD_HOST_LE
    return wr_bytes(w, x, bytes);
#else
    uint8_t tmp[4 * 256];
    while (n) {
        size_t m = n < 256 ? n : 256;
        for (size_t i = 0; i < m; i++) {
            uint32_t u;
            memcpy(&u, x + i, 4);
            for (int b = 0; b < 4; b++)
                tmp[4 * i + b] = (uint8_t)(u >> (8 * b));
        }
        if (wr_bytes(w, tmp, 4 * m) != PD_OK)
            return w->status;
        x += m;
        n -= m;
    }
    return PD_OK;
#endif
}

pd_status wr_f16_n(wr *w, const float *x, size_t n)
{
    if (w->status != PD_OK)
        return w->status;
    size_t bytes = 0;
    if (wr_array_bytes(w, n, 2, &bytes) != PD_OK)
        return w->status;
    if (w->mode == WR_MODE_COUNTING && !w->crc_on) {
        w->total += bytes; /* counting needs no conversion */
        return PD_OK;
    }
    if (w->mode == WR_MODE_BUFFER && wr_reserve(w, bytes) != PD_OK)
        return w->status;
    uint16_t tmp[RD_CHUNK];
    while (n) {
        size_t m = n < RD_CHUNK ? n : RD_CHUNK;
        /* |x| >= 65520 (bits 0x477ff000), inf or NaN would come out as an
         * f16 infinity or NaN: refuse, never round to inf. */
        if (rd_f32_max_abs_bits(x, m) >= 0x477ff000u)
            for (size_t i = 0; i < m; i++)
                if (rd_f32_max_abs_bits(x + i, 1) >= 0x477ff000u)
                    return wr_failed(w, pd_err_set(w->err, PD_ERR_RANGE,
                                                   "write: value %g does not fit f16 (|x| >= 65520 "
                                                   "or not finite)",
                                                   (double)x[i]));
        pd_f32_to_f16_n(x, tmp, m);
#if !RD_HOST_LE
        for (size_t i = 0; i < m; i++) {
            uint8_t b[2] = {(uint8_t)tmp[i], (uint8_t)(tmp[i] >> 8)};
            memcpy(tmp + i, b, 2);
        }
#endif
        if (wr_bytes(w, tmp, 2 * m) != PD_OK)
            return w->status;
        x += m;
        n -= m;
    }
    return PD_OK;
}

pd_status wr_i8_n(wr *w, const int8_t *x, size_t n) { return wr_bytes(w, x, n); }

void wr_crc_begin(wr *w)
{
    w->crc_on = 1;
    w->crc = 0;
}

uint32_t wr_crc_end(wr *w)
{
    w->crc_on = 0;
    return w->crc;
}

uint8_t *wr_take(wr *w, size_t *len)
{
    *len = 0;
    if (w->mode != WR_MODE_BUFFER || w->status != PD_OK || w->fill == 0)
        return NULL;
    uint8_t *out = w->buf;
    *len = w->fill;
    w->buf = NULL;
    w->fill = 0;
    w->cap = 0;
    return out;
}

void wr_dispose(wr *w)
{
    if (w->mode == WR_MODE_BUFFER) {
        free(w->buf);
        w->buf = NULL;
        w->fill = w->cap = 0;
    }
}
