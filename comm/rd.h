/* The one bounds-checked little-endian reader every untrusted byte goes
 * through (files, MPI messages), and the matching writer.
 *
 * Binary formats (CMFS records, state bundles, pipeline messages, GGUF, .npy)
 * are read with it field by field. JSON Lines text (page manifests, the
 * output file read back at resume) is cut into lines with rd_until and each
 * line handed to cJSON with its length.
 *
 * Reader (rd): every read checks the bytes that remain before it touches
 * them; a count is checked against the remaining bytes and against
 * SIZE_MAX / element size before any caller allocates for it. Offsets are
 * tracked so every failure names where it happened:
 *     "wire: offset 132: head 3 k count 4096 exceeds 512 remaining bytes".
 * Failures are sticky: after the first one every later read returns the same
 * status and leaves its output untouched, so a decoder may read a run of
 * fields and test once. The reader never allocates.
 *
 * Writer (wr): little-endian fields written one by one into either
 *   - a growable buffer the writer owns (wr_init_buffer; take it with
 *     wr_take), or
 *   - a sink callback (wr_init_sink) through a fixed staging buffer the
 *     caller provides, so a large state streams out without ever being held
 *     whole in memory; large arrays bypass the staging buffer, or
 *   - nothing at all (wr_init_count): the writer only counts bytes, which
 *     gives an encoder's exact output size without converting anything.
 * A writer can keep a running CRC32C of what it emits (wr_crc_begin /
 * wr_crc_end). Failures are sticky like the reader's. */
#ifndef PD_COMM_RD_H
#define PD_COMM_RD_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- reader -------------------------------------------------------------- */

/* INV: off <= len; status != PD_OK once any read failed (then off is frozen). */
typedef struct rd {
    const uint8_t *p; /* borrowed input, valid while the reader is used */
    size_t len;       /* bytes in p */
    size_t off;       /* bytes consumed */
    size_t base;      /* added to off in messages (a record inside a bundle) */
    const char *ctx;  /* message prefix, e.g. "wire" (borrowed; outlives the reader) */
    pd_err *err;      /* where failures are reported (may be NULL) */
    pd_status status; /* first failure, sticky */
} rd;

/* Starts reading buf[0..len). base is the offset of buf[0] in the enclosing
 * file or message, so messages name absolute offsets. */
void rd_init(rd *r, const void *buf, size_t len, size_t base, const char *ctx, pd_err *err);

static inline size_t rd_remaining(const rd *r) { return r->len - r->off; }
/* Absolute offset of the next byte (base + off). */
static inline size_t rd_offset(const rd *r) { return r->base + r->off; }

/* Fails the reader with "ctx: offset N: <message>" (N = rd_offset now) and
 * returns s. Decoders use it for semantic errors (bad value, mismatch). */
pd_status rd_fail(rd *r, pd_status s, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* As rd_fail but names an explicit absolute offset (a field read earlier). */
pd_status rd_fail_at(rd *r, size_t abs_off, pd_status s, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Scalars. `field` names the value in messages ("layer", "head 3 k count").
 * On failure *out is unchanged. */
pd_status rd_u8(rd *r, const char *field, uint8_t *out);
pd_status rd_u16(rd *r, const char *field, uint16_t *out);
pd_status rd_u32(rd *r, const char *field, uint32_t *out);
pd_status rd_u64(rd *r, const char *field, uint64_t *out);

/* Checks that count elements of elem_size bytes fit both in size_t and in the
 * bytes that remain; on success *bytes = count * elem_size. Consumes nothing.
 * This is the check every decoder runs before it allocates for a count. */
pd_status rd_check_count(rd *r, const char *field, uint64_t count, size_t elem_size,
                         size_t *bytes);

/* Borrows the next n bytes (pointer into the input) and consumes them. */
pd_status rd_span(rd *r, const char *field, size_t n, const uint8_t **out);
/* Skips n bytes. */
pd_status rd_skip(rd *r, const char *field, size_t n);
/* Copies the next n bytes into dst. */
pd_status rd_bytes(rd *r, const char *field, void *dst, size_t n);

/* Arrays: n little-endian elements decoded into dst[0..n). f16 values are
 * widened to f32 (exactly). dst may be NULL, which only validates and skips. */
pd_status rd_f32_n(rd *r, const char *field, float *dst, size_t n);
pd_status rd_f16_n(rd *r, const char *field, float *dst, size_t n);
pd_status rd_i8_n(rd *r, const char *field, int8_t *dst, size_t n);

/* Fails with PD_ERR_FORMAT naming the count when bytes remain. */
pd_status rd_expect_end(rd *r);

/* The next byte without consuming it, or -1 when none remains or the reader
 * has failed: text decoders (the .npy header dict) look ahead with it. */
static inline int rd_peek(const rd *r)
{
    return r->status == PD_OK && r->off < r->len ? r->p[r->off] : -1;
}

/* Borrows the bytes up to the next delim (*out, *n; delim excluded) and
 * consumes them and the delimiter. *found is false when no delimiter
 * remains: then they are all the remaining bytes (possibly none). Line-based
 * text (page manifests, output files) is split with it. */
pd_status rd_until(rd *r, uint8_t delim, const uint8_t **out, size_t *n, bool *found);

/* Little-endian loads from memory already bounds-checked by the caller. */
uint16_t rd_le16(const uint8_t *p);
uint32_t rd_le32(const uint8_t *p);
uint64_t rd_le64(const uint8_t *p);

/* Widens n f16 values stored little-endian at src (any alignment) to f32. */
void rd_f16_decode(const uint8_t *src, float *dst, size_t n);
/* Copies n f32 values stored little-endian at src (any alignment). */
void rd_f32_decode(const uint8_t *src, float *dst, size_t n);

/* Largest magnitude bit pattern (bits & 0x7fffffff) of x[0..n), 0 for n == 0:
 * one pass that tells whether every value is finite (< 0x7f800000) or fits
 * f16 (< 0x477ff000, i.e. |x| < 65520). AVX2 where pd_cpu_isa() allows; an
 * integer result, so every path gives the same answer. */
uint32_t rd_f32_max_abs_bits(const float *x, size_t n);

/* Index of the first NaN or infinity in x[0..n), or n: blocks of one
 * max-reduction pass (rd_f32_max_abs_bits), the element search only in a
 * block that has one. */
size_t rd_f32_first_nonfinite(const float *x, size_t n);

/* ---- writer -------------------------------------------------------------- */

/* A byte sink: consumes n bytes or fails (filling err). */
typedef pd_status (*wr_sink_fn)(void *ctx, const void *bytes, size_t n, pd_err *err);

/* Ready-made sinks. ctx is a FILE* / a pointer to an int fd. */
pd_status wr_sink_file(void *file, const void *bytes, size_t n, pd_err *err);
pd_status wr_sink_fd(void *fd_ptr, const void *bytes, size_t n, pd_err *err);

typedef enum wr_mode {
    WR_MODE_COUNTING = 0, /* count only */
    WR_MODE_BUFFER,       /* growable owned buffer */
    WR_MODE_SINK,         /* staged into a caller buffer, flushed to a sink */
    WR_MODE_COUNT         /* number of modes (the project's enum convention) */
} wr_mode;

/* INV: fill <= cap; total counts every byte accepted (emitted or staged);
 * status sticky. In BUFFER mode buf is owned (pd_alloc-free malloc). */
typedef struct wr {
    wr_mode mode;
    uint8_t *buf;  /* BUFFER: owned bytes; SINK: caller's staging buffer */
    size_t fill;   /* bytes in buf not yet flushed (SINK) / written (BUFFER) */
    size_t cap;    /* capacity of buf */
    uint64_t total; /* bytes accepted since init */
    wr_sink_fn sink;
    void *sink_ctx;
    int crc_on;    /* running CRC active */
    uint32_t crc;  /* CRC32C of the bytes since wr_crc_begin */
    pd_err *err;
    pd_status status;
} wr;

void wr_init_count(wr *w, pd_err *err);
/* Growable buffer; reserve is the initial capacity (0 is fine). */
pd_status wr_init_buffer(wr *w, size_t reserve, pd_err *err);
/* Sink through staging[0..staging_len) (borrowed; >= 64 bytes). */
void wr_init_sink(wr *w, wr_sink_fn sink, void *sink_ctx, void *staging, size_t staging_len,
                  pd_err *err);

pd_status wr_bytes(wr *w, const void *p, size_t n);
pd_status wr_u8(wr *w, uint8_t v);
pd_status wr_u16(wr *w, uint16_t v);
pd_status wr_u32(wr *w, uint32_t v);
pd_status wr_u64(wr *w, uint64_t v);
pd_status wr_f32_n(wr *w, const float *x, size_t n);
/* Narrows to f16 (round to nearest even, F16C where available). A value that
 * would become an f16 infinity or NaN (|x| >= 65520, inf, NaN) fails the
 * writer with PD_ERR_RANGE instead of being written. */
pd_status wr_f16_n(wr *w, const float *x, size_t n);
pd_status wr_i8_n(wr *w, const int8_t *x, size_t n);

/* Running CRC32C over every byte written between begin and end. */
void wr_crc_begin(wr *w);
uint32_t wr_crc_end(wr *w);

/* SINK mode: pushes staged bytes to the sink. Other modes: no-op. */
pd_status wr_flush(wr *w);

/* BUFFER mode: hands over the written bytes (owned, free with free()) and
 * resets the writer to empty. Returns NULL when nothing was written or the
 * writer failed; *len receives the byte count. */
uint8_t *wr_take(wr *w, size_t *len);

/* Releases a BUFFER writer's memory (no-op for other modes). */
void wr_dispose(wr *w);

#endif
