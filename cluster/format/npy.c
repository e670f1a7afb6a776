/* npy: strict reader and atomic writer of 2-D float32 .npy files (see npy.h
 * for the byte layout). Every byte of the prelude and the header is read
 * through comm/rd.h's bounds-checked reader; the header dict is parsed by a
 * small recursive-descent parser over exactly the Python literal subset NumPy
 * writes; everything outside it is refused with the byte offset where it went
 * wrong. */
#include "cluster/format/npy.h"

#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/check.h"
#include "base/file.h"
#include "comm/rd.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "npy reads '<f4' data by memcpy: a big-endian host needs a byte swap");
_Static_assert(sizeof(float) == 4, "'<f4' is a 4-byte IEEE float");

static const uint8_t NPY_MAGIC[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};

/* Where the header starts and how long it is, from the fixed prelude. */
typedef struct npy_prelude {
    uint8_t major, minor;
    uint64_t header_start; /* 10 or 12 */
    uint64_t header_len;
} npy_prelude;

static const char *npy_name(const char *name) { return name ? name : "<npy>"; }

/* Every byte of the prelude and the header dict is read through comm/rd.h's
 * bounds-checked reader with the context "npy: NAME", so its messages read
 * "npy: NAME: offset N: ...". A context longer than this is cut short. */
#define NPY_CTX_MAX 320

static void npy_ctx(char ctx[NPY_CTX_MAX], const char *name)
{
    snprintf(ctx, NPY_CTX_MAX, "npy: %s", npy_name(name));
}

/* Validates magic, version and header length of the first len bytes. */
static pd_status npy_prelude_parse(const uint8_t *b, size_t len, uint64_t file_size,
                                   const char *ctx, npy_prelude *pre, pd_err *err)
{
    uint64_t have = len < file_size ? len : file_size;
    rd r;
    rd_init(&r, b, (size_t)have, 0, ctx, err);
    for (size_t i = 0; i < sizeof NPY_MAGIC; i++) {
        uint8_t c = 0;
        if (rd_remaining(&r) == 0)
            return rd_fail(&r, PD_ERR_TRUNCATED,
                           "file ends inside the magic (%" PRIu64 " bytes)", file_size);
        if (rd_u8(&r, "magic", &c) != PD_OK)
            return r.status;
        if (c != NPY_MAGIC[i])
            return rd_fail_at(&r, i, PD_ERR_FORMAT, "not an .npy file (bad magic)");
    }
    uint8_t major = 0, minor = 0;
    if (rd_remaining(&r) < 2)
        return rd_fail_at(&r, (size_t)have, PD_ERR_TRUNCATED,
                          "file ends inside the version (%" PRIu64 " bytes)", file_size);
    if (rd_u8(&r, "major version", &major) != PD_OK || rd_u8(&r, "minor version", &minor) != PD_OK)
        return r.status;
    if (major < 1 || major > 3 || minor != 0)
        return rd_fail_at(&r, 6, PD_ERR_VERSION,
                          "format version %u.%u is not supported (1.0, 2.0, 3.0)", major, minor);
    uint64_t start = major == 1 ? 10 : 12;
    if (rd_remaining(&r) < start - 8)
        return rd_fail_at(&r, (size_t)have, PD_ERR_TRUNCATED,
                          "file ends inside the header length (%" PRIu64 " bytes)", file_size);
    uint64_t hlen = 0;
    if (major == 1) {
        uint16_t h16 = 0;
        if (rd_u16(&r, "header length", &h16) != PD_OK)
            return r.status;
        hlen = h16;
    } else {
        uint32_t h32 = 0;
        if (rd_u32(&r, "header length", &h32) != PD_OK)
            return r.status;
        hlen = h32;
    }
    if (hlen > file_size - start)
        return rd_fail_at(&r, 8, PD_ERR_TRUNCATED,
                          "header length %" PRIu64 " exceeds file size %" PRIu64, hlen, file_size);
    if (hlen > NPY_MAX_HEADER_LEN)
        return rd_fail_at(&r, 8, PD_ERR_FORMAT, "header length %" PRIu64 " exceeds the %u-byte limit",
                          hlen, NPY_MAX_HEADER_LEN);
    *pre = (npy_prelude){.major = major, .minor = minor, .header_start = start, .header_len = hlen};
    return PD_OK;
}

/* ---- the header dict ---------------------------------------------------- */

/* The dict parser reads the header through a reader h over exactly the
 * header's bytes (base = its file offset): rd_peek looks ahead, rd_skip
 * consumes, and every message names the file offset. */

static pd_status npy_hp_fail(rd *h, pd_status st, const char *what, const char *detail)
{
    return rd_fail(h, st, "header: %s%s", what, detail ? detail : "");
}

static bool npy_is_ws(int c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f'; }

/* Consumes one byte the caller has peeked. */
static void npy_hp_next(rd *h) { (void)rd_skip(h, "header", 1); }

static void npy_hp_ws(rd *h)
{
    while (npy_is_ws(rd_peek(h)))
        npy_hp_next(h);
}

/* A quoted string without escapes into out[cap]; quote may be ' or ". */
static pd_status npy_hp_string(rd *h, char *out, size_t cap)
{
    int q = rd_peek(h);
    if (q != '\'' && q != '"')
        return npy_hp_fail(h, PD_ERR_FORMAT, "expected a quoted string", NULL);
    npy_hp_next(h);
    size_t k = 0;
    for (;;) {
        int c = rd_peek(h);
        if (c < 0)
            return npy_hp_fail(h, PD_ERR_FORMAT, "unterminated string", NULL);
        if (c == q)
            break;
        if (c == '\\')
            return npy_hp_fail(h, PD_ERR_FORMAT, "escape sequences are not supported", NULL);
        if (c < 0x20 || c >= 0x7f)
            return npy_hp_fail(h, PD_ERR_FORMAT, "non-printable or non-ASCII byte in a string",
                               NULL);
        if (k + 1 >= cap)
            return npy_hp_fail(h, PD_ERR_FORMAT, "string too long", NULL);
        out[k++] = (char)c;
        npy_hp_next(h);
    }
    out[k] = '\0';
    npy_hp_next(h);
    return PD_OK;
}

static bool npy_is_digit(int c) { return c >= '0' && c <= '9'; }

/* A non-negative Python int literal without sign, underscores or leading zeros. */
static pd_status npy_hp_uint(rd *h, uint64_t *v)
{
    int c = rd_peek(h);
    if (c == '-' || c == '+')
        return npy_hp_fail(h, PD_ERR_FORMAT, "shape: signed dimensions are not allowed", NULL);
    if (!npy_is_digit(c))
        return npy_hp_fail(h, PD_ERR_FORMAT, "shape: expected a dimension (integer)", NULL);
    size_t start = rd_offset(h);
    int first = c;
    uint64_t x = 0;
    for (; npy_is_digit(c = rd_peek(h)); npy_hp_next(h)) {
        unsigned d = (unsigned)(c - '0');
        if (x > (UINT64_MAX - d) / 10)
            return rd_fail_at(h, start, PD_ERR_FORMAT, "header: shape: dimension overflows 64 bits");
        x = x * 10 + d;
    }
    if (first == '0' && rd_offset(h) - start > 1)
        return rd_fail_at(h, start, PD_ERR_FORMAT, "header: shape: leading zeros in a dimension");
    if (c == '_' || c == '.' || c == 'e' || c == 'E' || c == 'j' || c == 'J' || c == 'L' ||
        c == 'l' || c == 'x' || c == 'X')
        return npy_hp_fail(h, PD_ERR_FORMAT, "shape: dimensions must be plain decimal integers",
                           NULL);
    *v = x;
    return PD_OK;
}

/* The shape tuple: "()", "(a,)", "(a, b)", "(a, b,)"... up to 8 entries kept. */
static pd_status npy_hp_shape(rd *h, uint64_t *dims, size_t *ndim)
{
    if (rd_peek(h) != '(')
        return npy_hp_fail(h, PD_ERR_FORMAT, "shape: expected a tuple '('", NULL);
    npy_hp_next(h);
    size_t n = 0;
    bool comma = false;
    npy_hp_ws(h);
    while (rd_peek(h) != ')') {
        if (n == 8)
            return npy_hp_fail(h, PD_ERR_FORMAT, "shape: more than 8 dimensions", NULL);
        pd_status st = npy_hp_uint(h, &dims[n]);
        if (st != PD_OK)
            return st;
        n++;
        npy_hp_ws(h);
        int c = rd_peek(h);
        if (c == ',') {
            comma = true;
            npy_hp_next(h);
            npy_hp_ws(h);
        } else if (c != ')') {
            return npy_hp_fail(h, PD_ERR_FORMAT, "shape: expected ',' or ')'", NULL);
        }
    }
    if (n == 1 && !comma)
        return npy_hp_fail(h, PD_ERR_FORMAT, "shape: a parenthesized integer is not a tuple",
                           NULL);
    npy_hp_next(h);
    *ndim = n;
    return PD_OK;
}

/* An identifier made of letters (True, False, None, ...) into out[cap]. */
static void npy_hp_word(rd *h, char *out, size_t cap)
{
    size_t k = 0;
    for (int c; (c = rd_peek(h)) >= 0; npy_hp_next(h)) {
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || npy_is_digit(c)))
            break;
        if (k + 1 < cap)
            out[k++] = (char)c;
    }
    out[k] = '\0';
}

enum { NPY_KEY_DESCR, NPY_KEY_FORTRAN, NPY_KEY_SHAPE, NPY_KEY_COUNT };

/* One "key: value" of the header dict, its key known and not seen before
 * (k); the value into descr / *fortran / dims and *ndim. */
static pd_status npy_hp_value(rd *h, int k, char *descr, size_t descr_cap, bool *fortran, uint64_t *dims,
                              size_t *ndim)
{
    if (k == NPY_KEY_DESCR) {
        int c = rd_peek(h);
        if (c == '[' || c == '{' || c == '(')
            return npy_hp_fail(h, PD_ERR_UNSUPPORTED, "descr: structured dtypes are not supported (only '<f4')",
                               NULL);
        return npy_hp_string(h, descr, descr_cap);
    }
    if (k == NPY_KEY_FORTRAN) {
        char word[16];
        size_t wpos = rd_offset(h);
        npy_hp_word(h, word, sizeof word);
        if (!strcmp(word, "True"))
            *fortran = true;
        else if (!strcmp(word, "False"))
            *fortran = false;
        else
            return rd_fail_at(h, wpos, PD_ERR_FORMAT, "header: fortran_order: expected True or False");
        return PD_OK;
    }
    return npy_hp_shape(h, dims, ndim);
}

/* The header dict {'descr': ..., 'fortran_order': ..., 'shape': (...)}:
 * each key once, nothing else, nothing after it but white space. */
static pd_status npy_hp_dict(rd *h, char *descr, size_t descr_cap, bool *fortran, uint64_t *dims, size_t *ndim)
{
    static const char *const key_names[NPY_KEY_COUNT] = {"descr", "fortran_order", "shape"};
    bool seen[NPY_KEY_COUNT] = {false};
    pd_status st;
    npy_hp_ws(h);
    if (rd_peek(h) != '{')
        return npy_hp_fail(h, PD_ERR_FORMAT, "expected a dict '{'", NULL);
    npy_hp_next(h);
    npy_hp_ws(h);
    while (rd_peek(h) != '}') {
        char key[64];
        size_t key_pos = rd_offset(h);
        if ((st = npy_hp_string(h, key, sizeof key)) != PD_OK)
            return st;
        int k = -1;
        for (int j = 0; j < NPY_KEY_COUNT; j++)
            if (!strcmp(key, key_names[j]))
                k = j;
        if (k < 0)
            return rd_fail_at(h, key_pos, PD_ERR_FORMAT,
                              "header: unknown key '%s' (expected descr, fortran_order, shape)", key);
        if (seen[k])
            return rd_fail_at(h, key_pos, PD_ERR_FORMAT, "header: key '%s' appears twice", key);
        seen[k] = true;
        npy_hp_ws(h);
        if (rd_peek(h) != ':')
            return npy_hp_fail(h, PD_ERR_FORMAT, "expected ':' after key ", key);
        npy_hp_next(h);
        npy_hp_ws(h);
        if ((st = npy_hp_value(h, k, descr, descr_cap, fortran, dims, ndim)) != PD_OK)
            return st;
        npy_hp_ws(h);
        int c = rd_peek(h);
        if (c == ',') {
            npy_hp_next(h);
            npy_hp_ws(h);
        } else if (c != '}') {
            return npy_hp_fail(h, PD_ERR_FORMAT, "expected ',' or '}' after the value of ", key);
        }
    }
    npy_hp_next(h);
    size_t end = rd_offset(h);
    npy_hp_ws(h);
    if (rd_remaining(h))
        return npy_hp_fail(h, PD_ERR_FORMAT, "unexpected bytes after the dict", NULL);
    for (int k = 0; k < NPY_KEY_COUNT; k++)
        if (!seen[k])
            return rd_fail_at(h, end, PD_ERR_FORMAT, "header: missing key %s", key_names[k]);
    return PD_OK;
}

pd_status npy_parse_header(const void *buf, size_t len, uint64_t file_size, const char *name,
                           npy_info *out, pd_err *err)
{
    const uint8_t *b = buf;
    name = npy_name(name);
    if (!b && len)
        return pd_err_set(err, PD_ERR_ARG, "npy: %s: NULL buffer", name);
    char ctx[NPY_CTX_MAX];
    npy_ctx(ctx, name);
    npy_prelude pre;
    pd_status st = npy_prelude_parse(b, len, file_size, ctx, &pre, err);
    if (st != PD_OK)
        return st;
    rd r;
    rd_init(&r, b, len, 0, ctx, err);
    if (len < pre.header_start + pre.header_len)
        return rd_fail_at(&r, len, PD_ERR_TRUNCATED, "header needs %" PRIu64 " bytes, buffer holds %zu",
                          pre.header_start + pre.header_len, len);
    const uint8_t *hb = NULL;
    if (rd_skip(&r, "prelude", (size_t)pre.header_start) != PD_OK ||
        rd_span(&r, "header", (size_t)pre.header_len, &hb) != PD_OK)
        return r.status;

    rd h;
    rd_init(&h, hb, (size_t)pre.header_len, (size_t)pre.header_start, ctx, err);
    char descr[64] = "";
    bool fortran = false;
    uint64_t dims[8];
    size_t ndim = 0;
    if ((st = npy_hp_dict(&h, descr, sizeof descr, &fortran, dims, &ndim)) != PD_OK)
        return st;

    if (strcmp(descr, "<f4") != 0)
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "npy: %s: header: dtype '%s' is not supported (only '<f4', little-endian "
                          "float32)", name, descr);
    if (fortran)
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "npy: %s: header: fortran_order True is not supported (C order only)",
                          name);
    if (ndim != 2)
        return pd_err_set(err, PD_ERR_UNSUPPORTED,
                          "npy: %s: header: shape has %zu dimension%s; a 2-D (rows, cols) array is "
                          "required", name, ndim, ndim == 1 ? "" : "s");

    uint64_t rows = dims[0], cols = dims[1];
    uint64_t data_offset = pre.header_start + pre.header_len;
    if (cols && rows > UINT64_MAX / cols)
        return pd_err_set(err, PD_ERR_FORMAT,
                          "npy: %s: header: shape (%" PRIu64 ", %" PRIu64 ") overflows 64 bits",
                          name, rows, cols);
    uint64_t count = rows * cols;
    if (count > (UINT64_MAX - data_offset) / 4 || count > SIZE_MAX / 4)
        return pd_err_set(err, PD_ERR_FORMAT,
                          "npy: %s: header: shape (%" PRIu64 ", %" PRIu64 ") is too large", name,
                          rows, cols);
    uint64_t need = data_offset + count * 4;
    if (need > file_size)
        return rd_fail_at(&r, (size_t)data_offset, PD_ERR_TRUNCATED,
                          "shape (%" PRIu64 ", %" PRIu64 ") needs %" PRIu64
                          " data bytes, file has %" PRIu64,
                          rows, cols, count * 4, file_size - data_offset);
    if (need < file_size)
        return rd_fail_at(&r, (size_t)need, PD_ERR_FORMAT,
                          "%" PRIu64 " trailing bytes after the data of shape (%" PRIu64 ", %" PRIu64
                          ")",
                          file_size - need, rows, cols);
    *out = (npy_info){.major = pre.major,
                      .minor = pre.minor,
                      .header_len = pre.header_len,
                      .data_offset = data_offset,
                      .rows = rows,
                      .cols = cols,
                      .file_size = file_size};
    return PD_OK;
}

/* ---- files -------------------------------------------------------------- */

/* Opens path read-only and validates its header; *fd_out stays open on PD_OK. */
static pd_status npy_open_info(const char *path, npy_info *info, int *fd_out, pd_err *err)
{
    if (!path || !info)
        return pd_err_set(err, PD_ERR_ARG, "npy: NULL path or info");
    int fd = -1;
    uint64_t size = 0;
    pd_status st = pd_file_open_read(path, "npy", &fd, &size, err);
    if (st != PD_OK)
        return st;
    char ctx[NPY_CTX_MAX];
    npy_ctx(ctx, path);
    uint8_t pre_buf[12];
    size_t pre_len = size < sizeof pre_buf ? (size_t)size : sizeof pre_buf;
    npy_prelude pre;
    st = pd_file_read_at(fd, pre_buf, pre_len, 0, path, "npy", err);
    if (st == PD_OK)
        st = npy_prelude_parse(pre_buf, pre_len, size, ctx, &pre, err);
    if (st != PD_OK) {
        close(fd);
        return st;
    }
    /* Small headers (NumPy writes 118 bytes) stay on the stack. */
    uint8_t stack_buf[512];
    size_t total = (size_t)(pre.header_start + pre.header_len);
    uint8_t *hb = total <= sizeof stack_buf ? stack_buf : malloc(total);
    if (!hb) {
        close(fd);
        return pd_err_set(err, PD_ERR_NOMEM, "npy: %s: no memory for a %zu-byte header", path,
                          total);
    }
    st = pd_file_read_at(fd, hb, total, 0, path, "npy", err);
    if (st == PD_OK)
        st = npy_parse_header(hb, total, size, path, info, err);
    if (hb != stack_buf)
        free(hb);
    if (st != PD_OK) {
        close(fd);
        return st;
    }
    *fd_out = fd;
    return PD_OK;
}

pd_status npy_probe(const char *path, npy_info *out, pd_err *err)
{
    npy_info info;
    int fd;
    pd_status st = npy_open_info(path, &info, &fd, err);
    if (st != PD_OK)
        return st;
    close(fd);
    *out = info;
    return PD_OK;
}

pd_status npy_read_rows(const char *path, const npy_info *expect, uint64_t row0, uint64_t n,
                        float *dst, pd_err *err)
{
    if (!expect || (!dst && n))
        return pd_err_set(err, PD_ERR_ARG, "npy: %s: NULL expectation or destination",
                          path ? path : "<npy>");
    if (row0 > expect->rows || n > expect->rows - row0)
        return pd_err_set(err, PD_ERR_RANGE,
                          "npy: %s: rows [%" PRIu64 ", %" PRIu64 "+%" PRIu64 ") outside the %" PRIu64
                          " rows of the file", path ? path : "<npy>", row0, row0, n, expect->rows);
    npy_info info;
    int fd;
    pd_status st = npy_open_info(path, &info, &fd, err);
    if (st != PD_OK)
        return st;
    if (info.rows != expect->rows || info.cols != expect->cols ||
        info.data_offset != expect->data_offset || info.file_size != expect->file_size) {
        close(fd);
        return pd_err_set(err, PD_ERR_MISMATCH,
                          "npy: %s: file changed since it was validated: shape (%" PRIu64
                          ", %" PRIu64 ") size %" PRIu64 ", expected (%" PRIu64 ", %" PRIu64
                          ") size %" PRIu64, path, info.rows, info.cols, info.file_size,
                          expect->rows, expect->cols, expect->file_size);
    }
    /* No overflow: rows * cols * 4 fit below file_size (npy_info INV). */
    uint64_t row_bytes = info.cols * 4;
    st = pd_file_read_at(fd, dst, (size_t)(n * row_bytes), info.data_offset + row0 * row_bytes,
                         path, "npy", err);
    close(fd);
    return st;
}

pd_status npy_read_into(const char *path, float *dst, size_t cap, npy_info *info, pd_err *err)
{
    npy_info in;
    int fd;
    pd_status st = npy_open_info(path, &in, &fd, err);
    if (st != PD_OK)
        return st;
    uint64_t count = in.rows * in.cols;
    if (count > cap) {
        close(fd);
        return pd_err_set(err, PD_ERR_RANGE,
                          "npy: %s: shape (%" PRIu64 ", %" PRIu64 ") holds %" PRIu64
                          " floats, the buffer %zu", path, in.rows, in.cols, count, cap);
    }
    if (!dst && count) {
        close(fd);
        return pd_err_set(err, PD_ERR_ARG, "npy: %s: NULL destination", path);
    }
    st = pd_file_read_at(fd, dst, (size_t)count * 4, in.data_offset, path, "npy", err);
    close(fd);
    if (st == PD_OK && info)
        *info = in;
    return st;
}

pd_status npy_load(const char *path, npy_info *info, float **out, pd_err *err)
{
    if (!out)
        return pd_err_set(err, PD_ERR_ARG, "npy: NULL output");
    npy_info in;
    int fd;
    pd_status st = npy_open_info(path, &in, &fd, err);
    if (st != PD_OK)
        return st;
    size_t count = (size_t)(in.rows * in.cols);
    float *data = NULL;
    if (count) {
        data = malloc(count * sizeof *data);
        if (!data) {
            close(fd);
            return pd_err_set(err, PD_ERR_NOMEM, "npy: %s: no memory for %zu floats", path, count);
        }
        st = pd_file_read_at(fd, data, count * 4, in.data_offset, path, "npy", err);
    }
    close(fd);
    if (st != PD_OK) {
        free(data);
        return st;
    }
    if (info)
        *info = in;
    *out = data;
    return PD_OK;
}

/* ---- writer ------------------------------------------------------------- */

pd_status npy_write_f32(const char *path, uint64_t rows, uint64_t cols, const float *data,
                        pd_err *err)
{
    if (!path || !*path)
        return pd_err_set(err, PD_ERR_ARG, "npy: empty path");
    if (cols && rows > UINT64_MAX / cols)
        return pd_err_set(err, PD_ERR_ARG, "npy: %s: shape (%" PRIu64 ", %" PRIu64 ") overflows",
                          path, rows, cols);
    uint64_t count = rows * cols;
    if (count > SIZE_MAX / 8)
        return pd_err_set(err, PD_ERR_ARG, "npy: %s: shape (%" PRIu64 ", %" PRIu64 ") too large",
                          path, rows, cols);
    if (!data && count)
        return pd_err_set(err, PD_ERR_ARG, "npy: %s: NULL data", path);

    /* NumPy's own layout: dict, spaces, '\n', total prelude + header a multiple of 64. */
    char dict[160];
    int dl = snprintf(dict, sizeof dict,
                      "{'descr': '<f4', 'fortran_order': False, 'shape': (%" PRIu64 ", %" PRIu64
                      "), }", rows, cols);
    CHECK(dl > 0 && (size_t)dl < sizeof dict);
    size_t start = 10;
    size_t total = start + (size_t)dl + 1;
    total = (total + 63) / 64 * 64;
    CHECK(total - start <= 65535);
    uint8_t head[256];
    CHECK(total <= sizeof head);
    memcpy(head, NPY_MAGIC, 6);
    head[6] = 1;
    head[7] = 0;
    size_t hlen = total - start;
    head[8] = (uint8_t)(hlen & 0xff);
    head[9] = (uint8_t)(hlen >> 8);
    memcpy(head + start, dict, (size_t)dl);
    memset(head + start + dl, ' ', total - start - (size_t)dl - 1);
    head[total - 1] = '\n';

    pd_publish *pub = NULL;
    pd_status st = pd_file_publish_begin(path, 0644, "npy", &pub, err);
    if (st != PD_OK)
        return st;
    st = pd_file_publish_write(pub, head, total, err);
    if (st == PD_OK && count)
        st = pd_file_publish_write(pub, data, (size_t)count * 4, err);
    if (st != PD_OK) {
        pd_file_publish_abort(pub);
        return st;
    }
    return pd_file_publish_commit(pub, err);
}
