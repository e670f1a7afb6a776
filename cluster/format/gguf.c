/* GGUF v3 reader and writer (layout and the list of refused inputs: gguf.h).
 *
 * The reader walks the untrusted bytes twice through comm/rd.h's
 * bounds-checked reader: a counting pass that validates every field and
 * sizes the tables, then a fill pass into tables allocated once (so nothing
 * is allocated from a count the bytes have not yet backed). Cross-entry checks (duplicates,
 * bounds, overlaps) run on the filled tables. The writer encodes every field
 * little-endian and streams the file through an atomic publish (base/file.h). */
#include "cluster/format/gguf.h"

#include <errno.h>
#include <float.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/check.h"
#include "base/file.h"
#include "comm/rd.h"

/* ------------------------------------------------------------ type tables */

static const char *const gguf_vtype_names[] = {
    [GGUF_VTYPE_UINT8] = "uint8",     [GGUF_VTYPE_INT8] = "int8",
    [GGUF_VTYPE_UINT16] = "uint16",   [GGUF_VTYPE_INT16] = "int16",
    [GGUF_VTYPE_UINT32] = "uint32",   [GGUF_VTYPE_INT32] = "int32",
    [GGUF_VTYPE_FLOAT32] = "float32", [GGUF_VTYPE_BOOL] = "bool",
    [GGUF_VTYPE_STRING] = "string",   [GGUF_VTYPE_ARRAY] = "array",
    [GGUF_VTYPE_UINT64] = "uint64",   [GGUF_VTYPE_INT64] = "int64",
    [GGUF_VTYPE_FLOAT64] = "float64",
};
_Static_assert(sizeof gguf_vtype_names / sizeof gguf_vtype_names[0] == GGUF_VTYPE_COUNT,
               "gguf_vtype_names must name every gguf_vtype");

/* Encoded size of a scalar value; 0 for STRING and ARRAY (variable). */
static const uint8_t gguf_vtype_size[] = {
    [GGUF_VTYPE_UINT8] = 1,   [GGUF_VTYPE_INT8] = 1,   [GGUF_VTYPE_UINT16] = 2,
    [GGUF_VTYPE_INT16] = 2,   [GGUF_VTYPE_UINT32] = 4, [GGUF_VTYPE_INT32] = 4,
    [GGUF_VTYPE_FLOAT32] = 4, [GGUF_VTYPE_BOOL] = 1,   [GGUF_VTYPE_STRING] = 0,
    [GGUF_VTYPE_ARRAY] = 0,   [GGUF_VTYPE_UINT64] = 8, [GGUF_VTYPE_INT64] = 8,
    [GGUF_VTYPE_FLOAT64] = 8,
};
_Static_assert(sizeof gguf_vtype_size / sizeof gguf_vtype_size[0] == GGUF_VTYPE_COUNT,
               "gguf_vtype_size must size every gguf_vtype");

/* ggml's block geometry per type id. block_elems == 0 marks an id ggml
 * removed (kept here for its name); NULL name marks an id never used. */
typedef struct gguf_type_traits {
    const char *name;
    uint32_t block_elems;
    uint32_t block_bytes;
} gguf_type_traits;

static const gguf_type_traits gguf_types[] = {
    [GGUF_TENSOR_F32] = {"f32", 1, 4},
    [GGUF_TENSOR_F16] = {"f16", 1, 2},
    [GGUF_TENSOR_Q4_0] = {"q4_0", 32, 18},
    [GGUF_TENSOR_Q4_1] = {"q4_1", 32, 20},
    [4] = {"q4_2", 0, 0},
    [5] = {"q4_3", 0, 0},
    [GGUF_TENSOR_Q5_0] = {"q5_0", 32, 22},
    [GGUF_TENSOR_Q5_1] = {"q5_1", 32, 24},
    [GGUF_TENSOR_Q8_0] = {"q8_0", 32, 34},
    [GGUF_TENSOR_Q8_1] = {"q8_1", 32, 36},
    [GGUF_TENSOR_Q2_K] = {"q2_K", 256, 84},
    [GGUF_TENSOR_Q3_K] = {"q3_K", 256, 110},
    [GGUF_TENSOR_Q4_K] = {"q4_K", 256, 144},
    [GGUF_TENSOR_Q5_K] = {"q5_K", 256, 176},
    [GGUF_TENSOR_Q6_K] = {"q6_K", 256, 210},
    [GGUF_TENSOR_Q8_K] = {"q8_K", 256, 292},
    [GGUF_TENSOR_IQ2_XXS] = {"iq2_xxs", 256, 66},
    [GGUF_TENSOR_IQ2_XS] = {"iq2_xs", 256, 74},
    [GGUF_TENSOR_IQ3_XXS] = {"iq3_xxs", 256, 98},
    [GGUF_TENSOR_IQ1_S] = {"iq1_s", 256, 50},
    [GGUF_TENSOR_IQ4_NL] = {"iq4_nl", 32, 18},
    [GGUF_TENSOR_IQ3_S] = {"iq3_s", 256, 110},
    [GGUF_TENSOR_IQ2_S] = {"iq2_s", 256, 82},
    [GGUF_TENSOR_IQ4_XS] = {"iq4_xs", 256, 136},
    [GGUF_TENSOR_I8] = {"i8", 1, 1},
    [GGUF_TENSOR_I16] = {"i16", 1, 2},
    [GGUF_TENSOR_I32] = {"i32", 1, 4},
    [GGUF_TENSOR_I64] = {"i64", 1, 8},
    [GGUF_TENSOR_F64] = {"f64", 1, 8},
    [GGUF_TENSOR_IQ1_M] = {"iq1_m", 256, 56},
    [GGUF_TENSOR_BF16] = {"bf16", 1, 2},
    [31] = {"q4_0_4_4", 0, 0},
    [32] = {"q4_0_4_8", 0, 0},
    [33] = {"q4_0_8_8", 0, 0},
    [GGUF_TENSOR_TQ1_0] = {"tq1_0", 256, 54},
    [GGUF_TENSOR_TQ2_0] = {"tq2_0", 256, 66},
    [36] = {"iq4_nl_4_4", 0, 0},
    [37] = {"iq4_nl_4_8", 0, 0},
    [38] = {"iq4_nl_8_8", 0, 0},
    [GGUF_TENSOR_MXFP4] = {"mxfp4", 32, 17},
    [GGUF_TENSOR_NVFP4] = {"nvfp4", 64, 36},
    [GGUF_TENSOR_Q1_0] = {"q1_0", 128, 18},
};
_Static_assert(sizeof gguf_types / sizeof gguf_types[0] == GGUF_TENSOR_TYPE_COUNT,
               "gguf_types must cover every gguf_tensor_type id");

const char *gguf_vtype_name(uint32_t vtype)
{
    return vtype < GGUF_VTYPE_COUNT ? gguf_vtype_names[vtype] : "unknown";
}

const char *gguf_type_name(uint32_t ggml_type)
{
    if (ggml_type < GGUF_TENSOR_TYPE_COUNT && gguf_types[ggml_type].name)
        return gguf_types[ggml_type].name;
    /* "unknown(N)" needs storage. A small per-thread ring keeps the simple
     * signature callers format errors with, without state threads share. */
    static _Thread_local char ring[4][24];
    static _Thread_local unsigned next;
    char *b = ring[next++ % 4];
    snprintf(b, sizeof ring[0], "unknown(%" PRIu32 ")", ggml_type);
    return b;
}

bool gguf_type_supported(uint32_t ggml_type)
{
    return ggml_type == GGUF_TENSOR_F32 || ggml_type == GGUF_TENSOR_F16 ||
           ggml_type == GGUF_TENSOR_Q8_0 || ggml_type == GGUF_TENSOR_BF16 ||
           ggml_type == GGUF_TENSOR_Q4_0 || ggml_type == GGUF_TENSOR_Q5_0 ||
           ggml_type == GGUF_TENSOR_Q4_1 || ggml_type == GGUF_TENSOR_Q5_1 ||
           ggml_type == GGUF_TENSOR_Q4_K || ggml_type == GGUF_TENSOR_Q5_K ||
           ggml_type == GGUF_TENSOR_Q6_K;
}

bool gguf_type_block(uint32_t ggml_type, uint32_t *block_elems, uint32_t *block_bytes)
{
    if (ggml_type >= GGUF_TENSOR_TYPE_COUNT || gguf_types[ggml_type].block_elems == 0)
        return false;
    if (block_elems)
        *block_elems = gguf_types[ggml_type].block_elems;
    if (block_bytes)
        *block_bytes = gguf_types[ggml_type].block_bytes;
    return true;
}

size_t gguf_type_row_bytes(uint32_t ggml_type, uint64_t ne0, pd_err *err)
{
    if (!gguf_type_supported(ggml_type)) {
        pd_err_set(err, PD_ERR_UNSUPPORTED,
                   "gguf: tensor type %s is not supported (f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K and q6_K are)",
                   gguf_type_name(ggml_type));
        return 0;
    }
    uint32_t be = 0, bb = 0;
    CHECK(gguf_type_block(ggml_type, &be, &bb));
    if (ne0 == 0 || ne0 % be != 0) {
        pd_err_set(err, PD_ERR_ARG,
                   "gguf: a %s row of %" PRIu64 " elements is not a positive multiple of %" PRIu32,
                   gguf_type_name(ggml_type), ne0, be);
        return 0;
    }
    uint64_t blocks = ne0 / be;
    if (blocks > SIZE_MAX / bb) {
        pd_err_set(err, PD_ERR_RANGE, "gguf: a %s row of %" PRIu64 " elements overflows size_t",
                   gguf_type_name(ggml_type), ne0);
        return 0;
    }
    return (size_t)(blocks * bb);
}

/* ------------------------------------------------------- little endian */

/* Loads of bytes already bounds-checked use comm/rd.h (rd_le16/32/64). */

static void st_u16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void st_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void st_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

float gguf_arr_f32_at(const void *data, uint64_t i)
{
    uint32_t bits = rd_le32((const uint8_t *)data + 4 * i);
    float v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

int32_t gguf_arr_i32_at(const void *data, uint64_t i)
{
    uint32_t bits = rd_le32((const uint8_t *)data + 4 * i);
    int32_t v;
    memcpy(&v, &bits, sizeof v);
    return v;
}

uint32_t gguf_arr_u32_at(const void *data, uint64_t i)
{
    return rd_le32((const uint8_t *)data + 4 * i);
}

/* ------------------------------------------------------------ reader */

/* One metadata entry. info is the public view (gguf_kv_at returns it). */
typedef struct gg_kv {
    gguf_kv_info info;
    size_t key_len;
    size_t off;          /* file offset of the entry (its key length field) */
    const uint8_t *val;  /* scalar, or packed numeric array elements, in the buffer */
    const char *str;     /* STRING: NUL-terminated copy in the pool */
    size_t str_len;
    size_t str0;         /* ARRAY of STRING: index of element 0 in strs */
} gg_kv;

typedef struct gg_tensor {
    gguf_tensor pub;
    size_t info_off; /* file offset of the tensor info (its name length field) */
} gg_tensor;

typedef struct gg_str {
    const char *s; /* NUL-terminated copy in the pool */
    size_t len;
} gg_str;

/* INV: base[0..len) is the whole file; data_off <= len, data_off % alignment == 0.
 * INV: kv_sorted / t_sorted hold every entry once, strictly increasing by key /
 *      name (so keys and names are unique); keys and names contain no NUL.
 * INV: every tensor satisfies pub.offset % alignment == 0 and
 *      data_off + align_up(offset + bytes) <= len; in offset order each tensor
 *      starts at or after the end of the previous one.
 * INV: pool holds every string (keys, values, array elements, names) each
 *      followed by a NUL; pool_used == pool_len once open succeeded. */
struct gguf_file {
    const uint8_t *base;
    size_t len;
    bool mapped; /* base came from mmap (gguf_open) and is unmapped at close */
    uint32_t version;
    uint32_t alignment;
    size_t data_off;
    uint64_t n_kv;
    gg_kv *kvs;
    const gg_kv **kv_sorted;
    uint64_t n_tensors;
    gg_tensor *tensors;
    const gg_tensor **t_sorted;
    char *pool;
    size_t pool_len, pool_used;
    gg_str *strs;
    size_t n_strs, strs_used;
    bool changed; /* the fill pass met bytes that differ from the counting pass */
};

/* Every untrusted byte is read through comm/rd.h's bounds-checked reader
 * (context "gguf", so its messages read "gguf: offset N: ..."). Field names
 * of messages are formatted only on the failure path: a vocabulary of 150k
 * strings is walked twice per open and must not pay for a snprintf each. */

enum { GG_FIELD_MAX = 176 };

/* The name of a field of `size` bytes about to be read, for the reader's
 * message ("<field> needs 4 bytes, N remain"): formatted from fmt into
 * buf[GG_FIELD_MAX] only when fewer than size bytes remain, that is when the
 * read is about to fail; otherwise a placeholder nobody sees. */
static const char *gg_field(const rd *r, size_t size, char *buf, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static const char *gg_field(const rd *r, size_t size, char *buf, const char *fmt, ...)
{
    if (rd_remaining(r) >= size)
        return "field";
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, GG_FIELD_MAX, fmt, ap);
    va_end(ap);
    return buf;
}

/* Reads a gguf string (u64 length + bytes) and borrows its bytes. Failures,
 * at the offset of the length field, with what formatted from fmt: "<what>
 * length needs 8 bytes, N remain" and "<what> length L exceeds the N
 * remaining bytes". */
static pd_status gg_read_str(rd *r, const uint8_t **s, uint64_t *len, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static pd_status gg_read_str(rd *r, const uint8_t **s, uint64_t *len, const char *fmt, ...)
{
    size_t at = rd_offset(r);
    uint64_t n = 0;
    if (rd_remaining(r) >= 8) {
        (void)rd_u64(r, "string length", &n);
        if (n <= rd_remaining(r)) {
            *len = n;
            return rd_span(r, "string", (size_t)n, s);
        }
    }
    char what[GG_FIELD_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what - 8, fmt, ap);
    va_end(ap);
    if (rd_offset(r) == at) { /* not even the length field is there */
        strcat(what, " length");
        return rd_u64(r, what, &n);
    }
    return rd_fail_at(r, at, PD_ERR_TRUNCATED,
                      "%s length %" PRIu64 " exceeds the %zu remaining bytes", what, n,
                      rd_remaining(r));
}

/* A printable, bounded rendering of untrusted name bytes for messages. */
static void gg_quote(char *dst, size_t cap, const uint8_t *s, uint64_t len)
{
    CHECK(cap >= 8);
    size_t n = 0;
    size_t lim = cap - 4;
    for (uint64_t i = 0; i < len && n < lim; i++)
        dst[n++] = (s[i] >= 0x20 && s[i] < 0x7f) ? (char)s[i] : '?';
    if (len > n) {
        dst[n++] = '.';
        dst[n++] = '.';
        dst[n++] = '.';
    }
    dst[n] = '\0';
}

/* Copies a string into the pool. The pool was sized by the counting pass; if
 * the bytes changed since (a buffer or file modified while being opened), it
 * refuses to overflow and marks the file changed instead. */
static const char *pool_put(gguf_file *f, const uint8_t *s, size_t n)
{
    CHECK(f->pool_used <= f->pool_len);
    if (n >= f->pool_len - f->pool_used) {
        f->changed = true;
        return "";
    }
    char *d = f->pool + f->pool_used;
    memcpy(d, s, n);
    d[n] = '\0';
    f->pool_used += n + 1;
    return d;
}

/* What the counting pass learns: the table sizes of the fill pass. */
typedef struct gg_need {
    size_t pool;
    size_t strs;
} gg_need;

static bool is_pow2(uint64_t v)
{
    return v != 0 && (v & (v - 1)) == 0;
}

/* Smallest encodings: a kv is at least key length + 1 key byte + type + 1 value
 * byte; a tensor info at least name length + 1 byte + n_dims + ne[0] + type + offset. */
enum { GG_KV_MIN = 8 + 1 + 4 + 1, GG_TI_MIN = 8 + 1 + 4 + 8 + 4 + 8, GG_HEADER = 24 };

/* One metadata value of type vt at r (after the type field). kvname is the
 * quoted key for messages; i the entry's index. */
static pd_status gg_value(gguf_file *f, bool fill, gg_need *need, rd *r, uint64_t i,
                          const char *kvname, uint32_t vt, gg_kv *kv)
{
    size_t at = rd_offset(r);
    char w[GG_FIELD_MAX];
    if (vt == GGUF_VTYPE_STRING) {
        const uint8_t *s = NULL;
        uint64_t n = 0;
        if (gg_read_str(r, &s, &n, "kv %" PRIu64 " '%s' string", i, kvname) != PD_OK)
            return r->status;
        need->pool += (size_t)n + 1;
        if (fill) {
            kv->str = pool_put(f, s, (size_t)n);
            kv->str_len = (size_t)n;
        }
        return PD_OK;
    }
    if (vt != GGUF_VTYPE_ARRAY) {
        size_t sz = gguf_vtype_size[vt];
        const uint8_t *v = NULL;
        if (rd_span(r, gg_field(r, sz, w, "kv %" PRIu64 " '%s' %s value", i, kvname,
                                gguf_vtype_name(vt)),
                    sz, &v) != PD_OK)
            return r->status;
        if (vt == GGUF_VTYPE_BOOL && v[0] > 1)
            return rd_fail_at(r, at, PD_ERR_FORMAT,
                              "kv %" PRIu64 " '%s' bool byte is %u, not 0 or 1", i, kvname,
                              (unsigned)v[0]);
        if (fill)
            kv->val = v;
        return PD_OK;
    }

    uint32_t et = 0;
    uint64_t count = 0;
    if (rd_u32(r, gg_field(r, 4, w, "kv %" PRIu64 " '%s' array element type", i, kvname),
               &et) != PD_OK)
        return r->status;
    if (et >= GGUF_VTYPE_COUNT)
        return rd_fail_at(r, at, PD_ERR_FORMAT,
                          "kv %" PRIu64 " '%s' array element type %" PRIu32
                          " is out of range (0..%d)",
                          i, kvname, et, GGUF_VTYPE_COUNT - 1);
    if (et == GGUF_VTYPE_ARRAY)
        return rd_fail_at(r, at, PD_ERR_FORMAT,
                          "kv %" PRIu64 " '%s' is an array of arrays, which is not supported", i,
                          kvname);
    size_t count_at = rd_offset(r);
    if (rd_u64(r, gg_field(r, 8, w, "kv %" PRIu64 " '%s' array count", i, kvname), &count) !=
        PD_OK)
        return r->status;
    size_t min = et == GGUF_VTYPE_STRING ? 8 : gguf_vtype_size[et];
    if (count > rd_remaining(r) / min)
        return rd_fail_at(r, count_at, PD_ERR_TRUNCATED,
                          "kv %" PRIu64 " '%s' array count %" PRIu64
                          " cannot fit in the %zu remaining bytes (%zu bytes per %s at least)",
                          i, kvname, count, rd_remaining(r), min, gguf_vtype_name(et));
    if (fill) {
        kv->info.elem_type = (gguf_vtype)et;
        kv->info.count = count;
    }
    if (et != GGUF_VTYPE_STRING) {
        size_t v_at = rd_offset(r);
        const uint8_t *v = NULL;
        size_t bytes = (size_t)count * min; /* fits: count <= remaining / min */
        if (rd_span(r, "array elements", bytes, &v) != PD_OK)
            return r->status;
        if (et == GGUF_VTYPE_BOOL) {
            for (size_t k = 0; k < bytes; k++)
                if (v[k] > 1)
                    return rd_fail_at(r, v_at + k, PD_ERR_FORMAT,
                                      "kv %" PRIu64 " '%s' bool element %zu is %u, not 0 or 1", i,
                                      kvname, k, (unsigned)v[k]);
        }
        if (fill)
            kv->val = v;
        return PD_OK;
    }
    if (fill)
        kv->str0 = f->strs_used;
    for (uint64_t k = 0; k < count; k++) {
        const uint8_t *s = NULL;
        uint64_t n = 0;
        if (gg_read_str(r, &s, &n, "kv %" PRIu64 " '%s' string element %" PRIu64, i, kvname,
                        k) != PD_OK)
            return r->status;
        need->pool += (size_t)n + 1;
        need->strs += 1;
        if (fill && f->strs_used >= f->n_strs) {
            f->changed = true;
        } else if (fill) {
            f->strs[f->strs_used].s = pool_put(f, s, (size_t)n);
            f->strs[f->strs_used].len = (size_t)n;
            f->strs_used++;
        }
    }
    return PD_OK;
}

/* One tensor info at r. */
static pd_status gg_tensor_info(gguf_file *f, bool fill, gg_need *need, rd *r, uint64_t i)
{
    size_t at = rd_offset(r);
    char w[GG_FIELD_MAX];
    const uint8_t *name = NULL;
    uint64_t nlen = 0;
    if (gg_read_str(r, &name, &nlen, "tensor %" PRIu64 " name", i) != PD_OK)
        return r->status;
    char q[80];
    gg_quote(q, sizeof q, name, nlen);
    if (nlen == 0)
        return rd_fail_at(r, at, PD_ERR_FORMAT, "tensor %" PRIu64 " name is empty", i);
    if (nlen >= GGUF_NAME_MAX)
        return rd_fail_at(r, at, PD_ERR_FORMAT,
                          "tensor %" PRIu64 " name '%s' is %" PRIu64 " bytes, the limit is %u",
                          i, q, nlen, GGUF_NAME_MAX - 1);
    if (memchr(name, 0, (size_t)nlen))
        return rd_fail_at(r, at, PD_ERR_FORMAT, "tensor %" PRIu64 " name '%s' contains a NUL byte",
                          i, q);

    size_t f_at = rd_offset(r);
    uint32_t n_dims = 0;
    if (rd_u32(r, gg_field(r, 4, w, "tensor %" PRIu64 " '%s' n_dims", i, q), &n_dims) != PD_OK)
        return r->status;
    if (n_dims < 1 || n_dims > 4)
        return rd_fail_at(r, f_at, PD_ERR_FORMAT,
                          "tensor %" PRIu64 " '%s' n_dims %" PRIu32 " is outside 1..4", i, q,
                          n_dims);
    uint64_t ne[4] = {1, 1, 1, 1};
    uint64_t nelem = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        f_at = rd_offset(r);
        if (rd_u64(r, gg_field(r, 8, w, "tensor %" PRIu64 " '%s' ne[%" PRIu32 "]", i, q, d),
                   &ne[d]) != PD_OK)
            return r->status;
        if (ne[d] == 0 || ne[d] > (uint64_t)INT64_MAX)
            return rd_fail_at(r, f_at, PD_ERR_FORMAT,
                              "tensor %" PRIu64 " '%s' ne[%" PRIu32 "] = %" PRIu64
                              " is outside 1..INT64_MAX",
                              i, q, d, ne[d]);
        if (nelem > (uint64_t)INT64_MAX / ne[d])
            return rd_fail_at(r, f_at, PD_ERR_FORMAT,
                              "tensor %" PRIu64 " '%s' element count overflows int64 at ne[%" PRIu32
                              "]",
                              i, q, d);
        nelem *= ne[d];
    }
    f_at = rd_offset(r);
    uint32_t type = 0;
    if (rd_u32(r, gg_field(r, 4, w, "tensor %" PRIu64 " '%s' type", i, q), &type) != PD_OK)
        return r->status;
    uint32_t be = 0, bb = 0;
    if (!gguf_type_block(type, &be, &bb)) {
        if (type < GGUF_TENSOR_TYPE_COUNT && gguf_types[type].name)
            return rd_fail_at(r, f_at, PD_ERR_FORMAT,
                              "tensor %" PRIu64 " '%s' has ggml type %s (%" PRIu32
                              "), which ggml removed",
                              i, q, gguf_types[type].name, type);
        return rd_fail_at(r, f_at, PD_ERR_FORMAT,
                          "tensor %" PRIu64 " '%s' has unknown ggml type %" PRIu32, i, q, type);
    }
    if (ne[0] % be != 0)
        return rd_fail_at(r, f_at, PD_ERR_FORMAT,
                          "tensor %" PRIu64 " '%s' ne[0] = %" PRIu64
                          " is not a multiple of the %s block size %" PRIu32,
                          i, q, ne[0], gguf_type_name(type), be);
    uint64_t blocks = nelem / be;
    if (blocks > (uint64_t)INT64_MAX / bb)
        return rd_fail_at(r, f_at, PD_ERR_FORMAT,
                          "tensor %" PRIu64 " '%s' byte size overflows int64", i, q);
    f_at = rd_offset(r);
    uint64_t offset = 0;
    if (rd_u64(r, gg_field(r, 8, w, "tensor %" PRIu64 " '%s' offset", i, q), &offset) != PD_OK)
        return r->status;
    if (offset % f->alignment != 0)
        return rd_fail_at(r, f_at, PD_ERR_FORMAT,
                          "tensor %" PRIu64 " '%s' offset %" PRIu64
                          " is not a multiple of the alignment %" PRIu32,
                          i, q, offset, f->alignment);
    need->pool += (size_t)nlen + 1;
    if (fill) {
        gg_tensor *t = &f->tensors[i];
        t->info_off = at;
        t->pub = (gguf_tensor){
            .name = pool_put(f, name, (size_t)nlen),
            .type = type,
            .n_dims = n_dims,
            .ne = {ne[0], ne[1], ne[2], ne[3]},
            .offset = offset,
            .bytes = blocks * bb,
            .data = NULL, /* set once the data section is known */
        };
    }
    return PD_OK;
}

/* The header: magic, version (2 or 3), the tensor and kv counts, each count
 * checked against the bytes that remain before anything is sized from it. */
static pd_status gg_header(gguf_file *f, rd *r, uint64_t *n_tensors, uint64_t *n_kv)
{
    char w[GG_FIELD_MAX];
    uint8_t magic[4];
    if (rd_bytes(r, "magic", magic, 4) != PD_OK)
        return r->status;
    if (memcmp(magic, "GGUF", 4) != 0)
        return rd_fail_at(r, 0, PD_ERR_FORMAT,
                          "magic is %02x %02x %02x %02x, not \"GGUF\" (47 47 55 46)", magic[0],
                          magic[1], magic[2], magic[3]);
    uint32_t version = 0;
    if (rd_u32(r, gg_field(r, 4, w, "version"), &version) != PD_OK)
        return r->status;
    if (version != 3 && version != 2) {
        const char *hint = "";
        if (version == 1)
            hint = " (GGUF v1 used 32-bit counts; convert the file with a current llama.cpp)";
        else if ((version & 0xffffu) == 0 && version != 0)
            hint = " (it looks byte-swapped: a big-endian GGUF file)";
        return rd_fail_at(r, 4, PD_ERR_VERSION,
                          "version %" PRIu32 " is not supported (2 and 3 are)%s", version, hint);
    }
    f->version = version;
    if (rd_u64(r, gg_field(r, 8, w, "tensor count"), n_tensors) != PD_OK ||
        rd_u64(r, gg_field(r, 8, w, "kv count"), n_kv) != PD_OK)
        return r->status;
    if (*n_kv > rd_remaining(r) / GG_KV_MIN)
        return rd_fail_at(r, 16, PD_ERR_TRUNCATED,
                          "kv count %" PRIu64
                          " cannot fit in the %zu remaining bytes (%d bytes per kv at least)",
                          *n_kv, rd_remaining(r), GG_KV_MIN);
    if (*n_tensors > (rd_remaining(r) - *n_kv * GG_KV_MIN) / GG_TI_MIN)
        return rd_fail_at(r, 8, PD_ERR_TRUNCATED,
                          "tensor count %" PRIu64 " with %" PRIu64
                          " kvs cannot fit in the %zu remaining bytes (%d bytes per tensor info at "
                          "least)",
                          *n_tensors, *n_kv, rd_remaining(r), GG_TI_MIN);
    return PD_OK;
}

/* Metadata entry i: a non-empty key without NUL, a value type in range, the
 * value; general.alignment (a uint32 power of two) sets f->alignment. */
static pd_status gg_kv_entry(gguf_file *f, bool fill, gg_need *need, rd *r, uint64_t i)
{
    char w[GG_FIELD_MAX];
    size_t at = rd_offset(r);
    const uint8_t *key = NULL;
    uint64_t klen = 0;
    if (gg_read_str(r, &key, &klen, "kv %" PRIu64 " key", i) != PD_OK)
        return r->status;
    char q[80];
    gg_quote(q, sizeof q, key, klen);
    if (klen == 0)
        return rd_fail_at(r, at, PD_ERR_FORMAT, "kv %" PRIu64 " key is empty", i);
    if (memchr(key, 0, (size_t)klen))
        return rd_fail_at(r, at, PD_ERR_FORMAT, "kv %" PRIu64 " key '%s' contains a NUL byte",
                          i, q);
    size_t t_at = rd_offset(r);
    uint32_t vt = 0;
    if (rd_u32(r, gg_field(r, 4, w, "kv %" PRIu64 " '%s' value type", i, q), &vt) != PD_OK)
        return r->status;
    if (vt >= GGUF_VTYPE_COUNT)
        return rd_fail_at(r, t_at, PD_ERR_FORMAT,
                          "kv %" PRIu64 " '%s' value type %" PRIu32 " is out of range (0..%d)",
                          i, q, vt, GGUF_VTYPE_COUNT - 1);
    gg_kv *kv = NULL;
    need->pool += (size_t)klen + 1;
    if (fill) {
        kv = &f->kvs[i];
        *kv = (gg_kv){
            .info = {.key = pool_put(f, key, (size_t)klen),
                     .type = (gguf_vtype)vt,
                     .elem_type = (gguf_vtype)vt,
                     .count = 1},
            .key_len = (size_t)klen,
            .off = at,
        };
    }
    size_t v_at = rd_offset(r);
    if (gg_value(f, fill, need, r, i, q, vt, kv) != PD_OK)
        return r->status;
    static const char align_key[] = "general.alignment";
    if (klen == sizeof align_key - 1 && memcmp(key, align_key, klen) == 0) {
        if (vt != GGUF_VTYPE_UINT32)
            return rd_fail_at(r, t_at, PD_ERR_FORMAT,
                              "kv %" PRIu64 " general.alignment has type %s, expected uint32",
                              i, gguf_vtype_name(vt));
        uint32_t a = rd_le32(f->base + v_at); /* the 4 bytes gg_value just read */
        if (!is_pow2(a))
            return rd_fail_at(r, v_at, PD_ERR_FORMAT,
                              "kv %" PRIu64 " general.alignment %" PRIu32
                              " is not a power of two",
                              i, a);
        f->alignment = a;
    }
    return PD_OK;
}

/* Walks header, metadata and tensor infos. Counting pass: fill == false and
 * the tables are NULL; fill pass: tables sized from the counting pass. */
static pd_status gg_walk(gguf_file *f, bool fill, gg_need *need, pd_err *err)
{
    rd r;
    rd_init(&r, f->base, f->len, 0, "gguf", err);
    *need = (gg_need){0};
    uint64_t n_tensors = 0, n_kv = 0;
    pd_status st = gg_header(f, &r, &n_tensors, &n_kv);
    if (st != PD_OK)
        return st;
    if (fill && (n_kv != f->n_kv || n_tensors != f->n_tensors)) {
        f->changed = true; /* the tables were sized for other counts */
        return PD_OK;
    }
    f->n_kv = n_kv;
    f->n_tensors = n_tensors;
    f->alignment = GGUF_DEFAULT_ALIGNMENT;
    for (uint64_t i = 0; i < n_kv; i++)
        if ((st = gg_kv_entry(f, fill, need, &r, i)) != PD_OK)
            return st;

    /* The tensor count was checked against the bytes after the header; check it
     * again against what the metadata left. */
    if (n_tensors > rd_remaining(&r) / GG_TI_MIN)
        return rd_fail(&r, PD_ERR_TRUNCATED,
                       "tensor count %" PRIu64
                       " cannot fit in the %zu bytes after the metadata (%d bytes per tensor info "
                       "at least)",
                       n_tensors, rd_remaining(&r), GG_TI_MIN);
    for (uint64_t i = 0; i < n_tensors; i++)
        if (gg_tensor_info(f, fill, need, &r, i) != PD_OK)
            return r.status;

    size_t end = rd_offset(&r);
    size_t pad = (f->alignment - end % f->alignment) % f->alignment;
    if (pad > rd_remaining(&r))
        return rd_fail(&r, PD_ERR_TRUNCATED,
                       "the data section starts at %zu (padding to alignment %" PRIu32
                       ") but the file has %zu bytes",
                       end + pad, f->alignment, f->len);
    f->data_off = end + pad;
    return PD_OK;
}

static int gg_kv_cmp(const void *a, const void *b)
{
    const gg_kv *x = *(const gg_kv *const *)a, *y = *(const gg_kv *const *)b;
    int c = strcmp(x->info.key, y->info.key);
    return c ? c : (x < y ? -1 : x > y);
}

static int gg_tensor_name_cmp(const void *a, const void *b)
{
    const gg_tensor *x = *(const gg_tensor *const *)a, *y = *(const gg_tensor *const *)b;
    int c = strcmp(x->pub.name, y->pub.name);
    return c ? c : (x < y ? -1 : x > y);
}

static int gg_tensor_off_cmp(const void *a, const void *b)
{
    const gg_tensor *x = *(const gg_tensor *const *)a, *y = *(const gg_tensor *const *)b;
    if (x->pub.offset != y->pub.offset)
        return x->pub.offset < y->pub.offset ? -1 : 1;
    return x < y ? -1 : x > y;
}

/* Checks that need the filled tables: duplicates, bounds, overlaps. */
static pd_status gg_cross_checks(gguf_file *f, pd_err *err)
{
    rd r; /* reads nothing: it formats "gguf: offset N: ..." like the walk */
    rd_init(&r, f->base, f->len, 0, "gguf", err);
    for (uint64_t i = 0; i < f->n_kv; i++)
        f->kv_sorted[i] = &f->kvs[i];
    if (f->n_kv > 1)
        qsort(f->kv_sorted, (size_t)f->n_kv, sizeof f->kv_sorted[0], gg_kv_cmp);
    for (uint64_t i = 1; i < f->n_kv; i++) {
        const gg_kv *a = f->kv_sorted[i - 1], *b = f->kv_sorted[i];
        if (strcmp(a->info.key, b->info.key) == 0) {
            char q[80];
            gg_quote(q, sizeof q, (const uint8_t *)b->info.key, b->key_len);
            return rd_fail_at(&r, b->off, PD_ERR_FORMAT, "kv %td key '%s' duplicates kv %td",
                              b - f->kvs, q, a - f->kvs);
        }
    }

    for (uint64_t i = 0; i < f->n_tensors; i++)
        f->t_sorted[i] = &f->tensors[i];
    if (f->n_tensors > 1)
        qsort(f->t_sorted, (size_t)f->n_tensors, sizeof f->t_sorted[0], gg_tensor_name_cmp);
    for (uint64_t i = 1; i < f->n_tensors; i++) {
        const gg_tensor *a = f->t_sorted[i - 1], *b = f->t_sorted[i];
        if (strcmp(a->pub.name, b->pub.name) == 0)
            return rd_fail_at(&r, b->info_off, PD_ERR_FORMAT,
                              "tensor %td name '%s' duplicates tensor %td", b - f->tensors,
                              b->pub.name, a - f->tensors);
    }

    uint64_t avail = f->len - f->data_off;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        gg_tensor *t = &f->tensors[i];
        uint64_t o = t->pub.offset, n = t->pub.bytes;
        if (o > avail || n > avail - o)
            return rd_fail_at(&r, t->info_off, PD_ERR_TRUNCATED,
                              "tensor %" PRIu64 " '%s' data [%" PRIu64 ", %" PRIu64
                              ") extends past the %" PRIu64 " bytes of the data section",
                              i, t->pub.name, o, o + n, avail);
        uint64_t end = o + n;
        uint64_t pad = (f->alignment - end % f->alignment) % f->alignment;
        if (pad > avail - end)
            return rd_fail_at(&r, t->info_off, PD_ERR_TRUNCATED,
                              "tensor %" PRIu64 " '%s' padding to %" PRIu64
                              " extends past the %" PRIu64 " bytes of the data section",
                              i, t->pub.name, end + pad, avail);
        t->pub.data = f->base + f->data_off + o;
    }

    /* Overlaps: sort a scratch copy by offset (t_sorted must stay by name). */
    if (f->n_tensors > 1) {
        const gg_tensor **by_off = malloc((size_t)f->n_tensors * sizeof *by_off);
        if (!by_off)
            return pd_err_set(err, PD_ERR_NOMEM, "gguf: out of memory sorting %" PRIu64 " tensors",
                              f->n_tensors);
        for (uint64_t i = 0; i < f->n_tensors; i++)
            by_off[i] = &f->tensors[i];
        qsort(by_off, (size_t)f->n_tensors, sizeof by_off[0], gg_tensor_off_cmp);
        pd_status s = PD_OK;
        for (uint64_t i = 1; i < f->n_tensors && s == PD_OK; i++) {
            const gg_tensor *a = by_off[i - 1], *b = by_off[i];
            if (b->pub.offset < a->pub.offset + a->pub.bytes) {
                const gg_tensor *later = a->info_off > b->info_off ? a : b;
                const gg_tensor *other = later == a ? b : a;
                s = rd_fail_at(&r, later->info_off, PD_ERR_FORMAT,
                               "tensor %td '%s' data [%" PRIu64 ", %" PRIu64
                               ") overlaps tensor %td '%s' [%" PRIu64 ", %" PRIu64 ")",
                               later - f->tensors, later->pub.name, later->pub.offset,
                               later->pub.offset + later->pub.bytes, other - f->tensors,
                               other->pub.name, other->pub.offset,
                               other->pub.offset + other->pub.bytes);
            }
        }
        free(by_off);
        if (s != PD_OK)
            return s;
    }
    return PD_OK;
}

static void gg_free_tables(gguf_file *f)
{
    free(f->kvs);
    free(f->kv_sorted);
    free(f->tensors);
    free(f->t_sorted);
    free(f->pool);
    free(f->strs);
}

static pd_status gg_open(const uint8_t *base, size_t len, bool mapped, gguf_file **out, pd_err *err)
{
    gguf_file probe = {.base = base, .len = len};
    gg_need need;
    pd_status s = gg_walk(&probe, false, &need, err);
    if (s != PD_OK)
        return s;

    gguf_file *f = calloc(1, sizeof *f);
    if (!f)
        return pd_err_set(err, PD_ERR_NOMEM, "gguf: out of memory");
    *f = (gguf_file){.base = base, .len = len, .n_kv = probe.n_kv, .n_tensors = probe.n_tensors};
    /* Every size below is bounded by len (the counting pass saw the bytes). */
    size_t nkv = (size_t)probe.n_kv, nt = (size_t)probe.n_tensors;
    f->kvs = calloc(nkv ? nkv : 1, sizeof *f->kvs);
    f->kv_sorted = calloc(nkv ? nkv : 1, sizeof *f->kv_sorted);
    f->tensors = calloc(nt ? nt : 1, sizeof *f->tensors);
    f->t_sorted = calloc(nt ? nt : 1, sizeof *f->t_sorted);
    f->pool = malloc(need.pool ? need.pool : 1);
    f->strs = calloc(need.strs ? need.strs : 1, sizeof *f->strs);
    f->pool_len = need.pool;
    f->n_strs = need.strs;
    if (!f->kvs || !f->kv_sorted || !f->tensors || !f->t_sorted || !f->pool || !f->strs) {
        gg_free_tables(f);
        free(f);
        return pd_err_set(err, PD_ERR_NOMEM,
                          "gguf: out of memory for %zu kvs, %zu tensors and %zu string bytes", nkv, nt,
                          need.pool);
    }
    /* The fill pass reads the same bytes again; if they changed meanwhile
     * (a caller buffer or file modified during open) the tables are never
     * overrun and the open fails instead. */
    gg_need again;
    s = gg_walk(f, true, &again, err);
    if (s == PD_OK && (f->changed || again.pool != need.pool || again.strs != need.strs ||
                       f->pool_used != f->pool_len || f->strs_used != f->n_strs))
        s = pd_err_set(err, PD_ERR_IO, "gguf: the bytes changed while the file was being read");
    if (s == PD_OK)
        s = gg_cross_checks(f, err);
    if (s != PD_OK) {
        gg_free_tables(f);
        free(f);
        return s;
    }
    f->mapped = mapped;
    *out = f;
    return PD_OK;
}

pd_status gguf_open_mem(const void *buf, size_t len, gguf_file **out, pd_err *err)
{
    if (!out || (!buf && len))
        return pd_err_set(err, PD_ERR_ARG, "gguf: open_mem needs a buffer and an out pointer");
    return gg_open(buf, len, false, out, err);
}

pd_status gguf_open(const char *path, gguf_file **out, pd_err *err)
{
    if (!path || !out)
        return pd_err_set(err, PD_ERR_ARG, "gguf: open needs a path and an out pointer");
    int fd = -1;
    uint64_t size = 0;
    pd_status s = pd_file_open_read(path, "gguf", &fd, &size, err);
    if (s != PD_OK)
        return s;
    if (size > SIZE_MAX) {
        close(fd);
        return pd_err_set(err, PD_ERR_IO, "gguf: %s: too large to map", path);
    }
    size_t len = (size_t)size;
    const uint8_t *base = NULL;
    if (len > 0) {
        void *m = mmap(NULL, len, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) {
            int e = errno;
            close(fd);
            return pd_err_set(err, PD_ERR_IO, "gguf: %s: cannot map: %s", path, strerror(e));
        }
        base = m;
    }
    close(fd); /* the mapping keeps the file */
    s = gg_open(base, len, len > 0, out, err);
    if (s != PD_OK && base)
        munmap((void *)base, len);
    return s;
}

void gguf_close(gguf_file *f)
{
    if (!f)
        return;
    if (f->mapped)
        munmap((void *)f->base, f->len);
    gg_free_tables(f);
    free(f);
}

void gguf_check(const gguf_file *f)
{
    CHECK(f);
    CHECK(f->data_off <= f->len && is_pow2(f->alignment) && f->data_off % f->alignment == 0);
    CHECK(f->pool_used == f->pool_len && f->strs_used == f->n_strs);
    for (uint64_t i = 0; i < f->n_kv; i++) {
        const gg_kv *kv = f->kv_sorted[i];
        CHECK(kv >= f->kvs && kv < f->kvs + f->n_kv);
        CHECK(strlen(kv->info.key) == kv->key_len && kv->key_len > 0);
        CHECK(kv->info.type < GGUF_VTYPE_COUNT && kv->info.elem_type < GGUF_VTYPE_COUNT);
        if (i > 0)
            CHECK(strcmp(f->kv_sorted[i - 1]->info.key, kv->info.key) < 0);
        if (kv->info.type == GGUF_VTYPE_ARRAY && kv->info.elem_type == GGUF_VTYPE_STRING)
            CHECK(kv->str0 <= f->n_strs && kv->info.count <= f->n_strs - kv->str0);
    }
    uint64_t avail = f->len - f->data_off;
    for (uint64_t i = 0; i < f->n_tensors; i++) {
        const gg_tensor *t = f->t_sorted[i];
        CHECK(t >= f->tensors && t < f->tensors + f->n_tensors);
        if (i > 0)
            CHECK(strcmp(f->t_sorted[i - 1]->pub.name, t->pub.name) < 0);
        const gguf_tensor *p = &t->pub;
        CHECK(p->n_dims >= 1 && p->n_dims <= 4 && p->offset % f->alignment == 0);
        CHECK(p->offset <= avail && p->bytes <= avail - p->offset);
        CHECK((const uint8_t *)p->data == f->base + f->data_off + p->offset);
        uint32_t be = 0, bb = 0;
        CHECK(gguf_type_block(p->type, &be, &bb));
        uint64_t nelem = p->ne[0] * p->ne[1] * p->ne[2] * p->ne[3];
        CHECK(p->bytes == nelem / be * bb);
        /* disjointness: quadratic, but only tests call this on small files */
        for (uint64_t j = 0; j < i; j++) {
            const gguf_tensor *o = &f->t_sorted[j]->pub;
            CHECK(o->offset + o->bytes <= p->offset || p->offset + p->bytes <= o->offset);
        }
    }
}

uint32_t gguf_version(const gguf_file *f)
{
    return f->version;
}

uint32_t gguf_alignment(const gguf_file *f)
{
    return f->alignment;
}

uint64_t gguf_data_offset(const gguf_file *f)
{
    return f->data_off;
}

uint64_t gguf_file_size(const gguf_file *f)
{
    return f->len;
}

const void *gguf_bytes(const gguf_file *f)
{
    return f->base;
}

void gguf_release_bytes(const gguf_file *f, const void *p, uint64_t len)
{
    uintptr_t b = (uintptr_t)f->base, a = (uintptr_t)p;
    if (!f->mapped || len == 0 || a < b || a - b > f->len || len > f->len - (a - b))
        return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (a + page - 1) / page * page, hi = (a + (uintptr_t)len) / page * page;
    if (hi > lo)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* advice: a failure changes nothing */
}

uint64_t gguf_kv_count(const gguf_file *f)
{
    return f ? f->n_kv : 0;
}

const gguf_kv_info *gguf_kv_at(const gguf_file *f, uint64_t i)
{
    return f && i < f->n_kv ? &f->kvs[i].info : NULL;
}

static const gg_kv *gg_find(const gguf_file *f, const char *key)
{
    if (!f || !key)
        return NULL;
    size_t lo = 0, hi = (size_t)f->n_kv;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->kv_sorted[mid]->info.key, key);
        if (c == 0)
            return f->kv_sorted[mid];
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

int64_t gguf_find_key(const gguf_file *f, const char *key)
{
    const gg_kv *kv = gg_find(f, key);
    return kv ? (int64_t)(kv - f->kvs) : -1;
}

/* The entry for key with one of the accepted types, or an error. */
static pd_status gg_lookup(const gguf_file *f, const char *key, const gg_kv **out,
                           const char *expected, bool (*accept)(uint32_t), pd_err *err)
{
    if (!f || !key)
        return pd_err_set(err, PD_ERR_ARG, "gguf: lookup needs a file and a key");
    const gg_kv *kv = gg_find(f, key);
    if (!kv)
        return pd_err_set(err, PD_ERR_FORMAT, "gguf: key '%s' is missing", key);
    if (!accept(kv->info.type)) {
        if (kv->info.type == GGUF_VTYPE_ARRAY)
            return pd_err_set(err, PD_ERR_MISMATCH, "gguf: key '%s' is an array of %s, expected %s",
                              key, gguf_vtype_name(kv->info.elem_type), expected);
        return pd_err_set(err, PD_ERR_MISMATCH, "gguf: key '%s' has type %s, expected %s", key,
                          gguf_vtype_name(kv->info.type), expected);
    }
    *out = kv;
    return PD_OK;
}

static bool acc_int(uint32_t t)
{
    return t <= GGUF_VTYPE_INT32 || t == GGUF_VTYPE_UINT64 || t == GGUF_VTYPE_INT64;
}
static bool acc_float(uint32_t t)
{
    return t == GGUF_VTYPE_FLOAT32 || t == GGUF_VTYPE_FLOAT64;
}
static bool acc_bool(uint32_t t)
{
    return t == GGUF_VTYPE_BOOL;
}
static bool acc_str(uint32_t t)
{
    return t == GGUF_VTYPE_STRING;
}
static bool acc_arr(uint32_t t)
{
    return t == GGUF_VTYPE_ARRAY;
}

/* An integer value as sign + magnitude-or-value. */
typedef struct gg_int {
    bool neg;   /* s < 0 */
    uint64_t u; /* the value when !neg */
    int64_t s;  /* the value when neg */
} gg_int;

static gg_int gg_int_of(const gg_kv *kv)
{
    const uint8_t *p = kv->val;
    int64_t s = 0;
    switch (kv->info.type) {
    case GGUF_VTYPE_UINT8: return (gg_int){.u = p[0]};
    case GGUF_VTYPE_UINT16: return (gg_int){.u = rd_le16(p)};
    case GGUF_VTYPE_UINT32: return (gg_int){.u = rd_le32(p)};
    case GGUF_VTYPE_UINT64: return (gg_int){.u = rd_le64(p)};
    case GGUF_VTYPE_INT8: s = (int8_t)p[0]; break;
    case GGUF_VTYPE_INT16: s = (int16_t)rd_le16(p); break;
    case GGUF_VTYPE_INT32: s = (int32_t)rd_le32(p); break;
    case GGUF_VTYPE_INT64: s = (int64_t)rd_le64(p); break;
    default: CHECKF(0, "gguf: type %u is not an integer", (unsigned)kv->info.type);
    }
    return s < 0 ? (gg_int){.neg = true, .s = s} : (gg_int){.u = (uint64_t)s};
}

static pd_status gg_range_fail(const gg_kv *kv, gg_int v, const char *target, pd_err *err)
{
    if (v.neg)
        return pd_err_set(err, PD_ERR_RANGE, "gguf: key '%s' = %" PRId64 " (%s) does not fit %s",
                          kv->info.key, v.s, gguf_vtype_name(kv->info.type), target);
    return pd_err_set(err, PD_ERR_RANGE, "gguf: key '%s' = %" PRIu64 " (%s) does not fit %s",
                      kv->info.key, v.u, gguf_vtype_name(kv->info.type), target);
}

pd_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, pd_err *err)
{
    const gg_kv *kv = NULL;
    pd_status s = gg_lookup(f, key, &kv, "an integer", acc_int, err);
    if (s != PD_OK)
        return s;
    gg_int v = gg_int_of(kv);
    if (v.neg || v.u > UINT32_MAX)
        return gg_range_fail(kv, v, "uint32", err);
    if (out)
        *out = (uint32_t)v.u;
    return PD_OK;
}

pd_status gguf_get_i32(const gguf_file *f, const char *key, int32_t *out, pd_err *err)
{
    const gg_kv *kv = NULL;
    pd_status s = gg_lookup(f, key, &kv, "an integer", acc_int, err);
    if (s != PD_OK)
        return s;
    gg_int v = gg_int_of(kv);
    if (v.neg ? v.s < INT32_MIN : v.u > INT32_MAX)
        return gg_range_fail(kv, v, "int32", err);
    if (out)
        *out = v.neg ? (int32_t)v.s : (int32_t)v.u;
    return PD_OK;
}

pd_status gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, pd_err *err)
{
    const gg_kv *kv = NULL;
    pd_status s = gg_lookup(f, key, &kv, "an integer", acc_int, err);
    if (s != PD_OK)
        return s;
    gg_int v = gg_int_of(kv);
    if (v.neg)
        return gg_range_fail(kv, v, "uint64", err);
    if (out)
        *out = v.u;
    return PD_OK;
}

pd_status gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, pd_err *err)
{
    const gg_kv *kv = NULL;
    pd_status s = gg_lookup(f, key, &kv, "an integer", acc_int, err);
    if (s != PD_OK)
        return s;
    gg_int v = gg_int_of(kv);
    if (!v.neg && v.u > (uint64_t)INT64_MAX)
        return gg_range_fail(kv, v, "int64", err);
    if (out)
        *out = v.neg ? v.s : (int64_t)v.u;
    return PD_OK;
}

pd_status gguf_get_f64(const gguf_file *f, const char *key, double *out, pd_err *err)
{
    const gg_kv *kv = NULL;
    pd_status s = gg_lookup(f, key, &kv, "float32 or float64", acc_float, err);
    if (s != PD_OK)
        return s;
    double d;
    if (kv->info.type == GGUF_VTYPE_FLOAT32) {
        d = gguf_arr_f32_at(kv->val, 0);
    } else {
        uint64_t bits = rd_le64(kv->val);
        memcpy(&d, &bits, sizeof d);
    }
    if (out)
        *out = d;
    return PD_OK;
}

pd_status gguf_get_f32(const gguf_file *f, const char *key, float *out, pd_err *err)
{
    const gg_kv *kv = NULL;
    pd_status s = gg_lookup(f, key, &kv, "float32 or float64", acc_float, err);
    if (s != PD_OK)
        return s;
    float v;
    if (kv->info.type == GGUF_VTYPE_FLOAT32) {
        v = gguf_arr_f32_at(kv->val, 0);
    } else {
        uint64_t bits = rd_le64(kv->val);
        double d;
        memcpy(&d, &bits, sizeof d);
        if (isfinite(d) && fabs(d) > FLT_MAX)
            return pd_err_set(err, PD_ERR_RANGE, "gguf: key '%s' = %g (float64) does not fit float32",
                              key, d);
        v = (float)d;
    }
    if (out)
        *out = v;
    return PD_OK;
}

pd_status gguf_get_bool(const gguf_file *f, const char *key, bool *out, pd_err *err)
{
    const gg_kv *kv = NULL;
    pd_status s = gg_lookup(f, key, &kv, "bool", acc_bool, err);
    if (s != PD_OK)
        return s;
    if (out)
        *out = kv->val[0] != 0;
    return PD_OK;
}

pd_status gguf_get_str(const gguf_file *f, const char *key, const char **str, size_t *len,
                       pd_err *err)
{
    const gg_kv *kv = NULL;
    pd_status s = gg_lookup(f, key, &kv, "string", acc_str, err);
    if (s != PD_OK)
        return s;
    if (str)
        *str = kv->str;
    if (len)
        *len = kv->str_len;
    return PD_OK;
}

pd_status gguf_get_arr(const gguf_file *f, const char *key, gguf_vtype *elem_type,
                       uint64_t *count, const void **data, pd_err *err)
{
    const gg_kv *kv = NULL;
    pd_status s = gg_lookup(f, key, &kv, "array", acc_arr, err);
    if (s != PD_OK)
        return s;
    if (elem_type)
        *elem_type = kv->info.elem_type;
    if (count)
        *count = kv->info.count;
    if (data)
        *data = kv->info.elem_type == GGUF_VTYPE_STRING ? NULL : (const void *)kv->val;
    return PD_OK;
}

pd_status gguf_get_str_arr(const gguf_file *f, const char *key, uint64_t index, const char **str,
                           size_t *len, pd_err *err)
{
    const gg_kv *kv = NULL;
    pd_status s = gg_lookup(f, key, &kv, "array of string", acc_arr, err);
    if (s != PD_OK)
        return s;
    if (kv->info.elem_type != GGUF_VTYPE_STRING)
        return pd_err_set(err, PD_ERR_MISMATCH, "gguf: key '%s' is an array of %s, expected string",
                          key, gguf_vtype_name(kv->info.elem_type));
    if (index >= kv->info.count)
        return pd_err_set(err, PD_ERR_RANGE, "gguf: key '%s' index %" PRIu64 " is past its %" PRIu64
                          " strings", key, index, kv->info.count);
    const gg_str *e = &f->strs[kv->str0 + (size_t)index];
    if (str)
        *str = e->s;
    if (len)
        *len = e->len;
    return PD_OK;
}

uint64_t gguf_tensor_count(const gguf_file *f)
{
    return f ? f->n_tensors : 0;
}

const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i)
{
    return f && i < f->n_tensors ? &f->tensors[i].pub : NULL;
}

const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name)
{
    if (!f || !name)
        return NULL;
    size_t lo = 0, hi = (size_t)f->n_tensors;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = strcmp(f->t_sorted[mid]->pub.name, name);
        if (c == 0)
            return &f->t_sorted[mid]->pub;
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

/* ------------------------------------------------------------ writer */

typedef struct gw_kv {
    char *key;
    uint32_t type;
    uint8_t *val;   /* the value exactly as encoded after the type field */
    size_t val_len;
} gw_kv;

typedef struct gw_tensor {
    char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[4];
    uint64_t bytes;
    const void *data; /* borrowed from the caller, or == owned */
    void *owned;
} gw_tensor;

/* INV: keys are non-empty, NUL-free and unique; tensor names are 1..63 bytes
 *      and unique; each tensor's bytes match its type and shape.
 * INV: err holds the first failure of any call (sticky). */
struct gguf_writer {
    gw_kv *kvs;
    size_t n_kv, cap_kv;
    gw_tensor *ts;
    size_t n_t, cap_t;
    pd_err err;
};

gguf_writer *gguf_writer_new(void)
{
    return calloc(1, sizeof(gguf_writer));
}

void gguf_writer_free(gguf_writer *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->n_kv; i++) {
        free(w->kvs[i].key);
        free(w->kvs[i].val);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        free(w->ts[i].name);
        free(w->ts[i].owned);
    }
    free(w->kvs);
    free(w->ts);
    free(w);
}

void gguf_writer_check(const gguf_writer *w)
{
    CHECK(w);
    CHECK(w->n_kv <= w->cap_kv && w->n_t <= w->cap_t);
    for (size_t i = 0; i < w->n_kv; i++) {
        CHECK(w->kvs[i].key && w->kvs[i].key[0] && w->kvs[i].type < GGUF_VTYPE_COUNT);
        CHECK(w->kvs[i].val || w->kvs[i].val_len == 0);
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(w->kvs[i].key, w->kvs[j].key) != 0);
    }
    for (size_t i = 0; i < w->n_t; i++) {
        const gw_tensor *t = &w->ts[i];
        size_t nl = strlen(t->name);
        CHECK(nl > 0 && nl < GGUF_NAME_MAX && t->n_dims >= 1 && t->n_dims <= 4);
        uint32_t be = 0, bb = 0;
        CHECK(gguf_type_block(t->type, &be, &bb));
        CHECK(t->bytes == t->ne[0] * t->ne[1] * t->ne[2] * t->ne[3] / be * bb);
        CHECK(t->data != NULL);
        for (size_t j = 0; j < i; j++)
            CHECK(strcmp(t->name, w->ts[j].name) != 0);
    }
}

/* Records the writer's sticky error and returns s. */
static pd_status gw_fail(gguf_writer *w, pd_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static pd_status gw_fail(gguf_writer *w, pd_status s, const char *fmt, ...)
{
    if (!w)
        return s;
    char msg[sizeof w->err.msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return pd_err_set(&w->err, s, "gguf writer: %.490s", msg);
}

static bool gw_grow(void **arr, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return true;
    size_t nc = *cap ? *cap * 2 : 16;
    if (nc > SIZE_MAX / elem)
        return false;
    void *p = realloc(*arr, nc * elem);
    if (!p)
        return false;
    *arr = p;
    *cap = nc;
    return true;
}

/* Sets key to an encoded value; takes ownership of val (freed on failure). */
static pd_status gw_put(gguf_writer *w, const char *key, uint32_t type, uint8_t *val, size_t len)
{
    if (!w) {
        free(val);
        return PD_ERR_ARG;
    }
    if (!val) /* the caller's allocation failed */
        return gw_fail(w, PD_ERR_NOMEM, "out of memory for the value of '%s'", key ? key : "(null)");
    if (!key || !key[0]) {
        free(val);
        return gw_fail(w, PD_ERR_ARG, "a key must be a non-empty string");
    }
    for (size_t i = 0; i < w->n_kv; i++) {
        if (strcmp(w->kvs[i].key, key) == 0) {
            free(w->kvs[i].val);
            w->kvs[i].type = type;
            w->kvs[i].val = val;
            w->kvs[i].val_len = len;
            return PD_OK;
        }
    }
    char *k = strdup(key);
    if (!k || !gw_grow((void **)&w->kvs, &w->cap_kv, w->n_kv, sizeof *w->kvs)) {
        free(k);
        free(val);
        return gw_fail(w, PD_ERR_NOMEM, "out of memory adding key '%s'", key);
    }
    w->kvs[w->n_kv++] = (gw_kv){.key = k, .type = type, .val = val, .val_len = len};
    return PD_OK;
}

static pd_status gw_scalar(gguf_writer *w, const char *key, uint32_t type, uint64_t bits)
{
    size_t n = gguf_vtype_size[type];
    uint8_t *v = malloc(n);
    if (v)
        for (size_t i = 0; i < n; i++)
            v[i] = (uint8_t)(bits >> (8 * i));
    return gw_put(w, key, type, v, n);
}

pd_status gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v)
{
    return gw_scalar(w, key, GGUF_VTYPE_UINT8, v);
}

pd_status gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v)
{
    return gw_scalar(w, key, GGUF_VTYPE_INT8, (uint8_t)v);
}

pd_status gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v)
{
    return gw_scalar(w, key, GGUF_VTYPE_UINT16, v);
}

pd_status gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v)
{
    return gw_scalar(w, key, GGUF_VTYPE_INT16, (uint16_t)v);
}

pd_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v)
{
    return gw_scalar(w, key, GGUF_VTYPE_UINT32, v);
}

pd_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v)
{
    return gw_scalar(w, key, GGUF_VTYPE_INT32, (uint32_t)v);
}

pd_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v)
{
    return gw_scalar(w, key, GGUF_VTYPE_UINT64, v);
}

pd_status gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v)
{
    return gw_scalar(w, key, GGUF_VTYPE_INT64, (uint64_t)v);
}

pd_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    return gw_scalar(w, key, GGUF_VTYPE_FLOAT32, bits);
}

pd_status gguf_writer_set_f64(gguf_writer *w, const char *key, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    return gw_scalar(w, key, GGUF_VTYPE_FLOAT64, bits);
}

pd_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v)
{
    return gw_scalar(w, key, GGUF_VTYPE_BOOL, v ? 1 : 0);
}

pd_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *s)
{
    if (!s)
        return gw_fail(w, PD_ERR_ARG, "string value of '%s' is NULL", key ? key : "(null)");
    size_t n = strlen(s);
    uint8_t *v = n <= SIZE_MAX - 8 ? malloc(8 + n) : NULL;
    if (v) {
        st_u64(v, n);
        memcpy(v + 8, s, n);
    }
    return gw_put(w, key, GGUF_VTYPE_STRING, v, 8 + n);
}

pd_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                                  uint64_t n)
{
    if (n && !strs)
        return gw_fail(w, PD_ERR_ARG, "string array '%s' is NULL", key ? key : "(null)");
    size_t total = 12;
    for (uint64_t i = 0; i < n; i++) {
        if (!strs[i])
            return gw_fail(w, PD_ERR_ARG, "string %" PRIu64 " of array '%s' is NULL", i,
                           key ? key : "(null)");
        size_t l = strlen(strs[i]);
        if (total > SIZE_MAX - 8 - l)
            return gw_fail(w, PD_ERR_NOMEM, "string array '%s' is too large", key ? key : "(null)");
        total += 8 + l;
    }
    uint8_t *v = malloc(total);
    if (v) {
        st_u32(v, GGUF_VTYPE_STRING);
        st_u64(v + 4, n);
        size_t o = 12;
        for (uint64_t i = 0; i < n; i++) {
            size_t l = strlen(strs[i]);
            st_u64(v + o, l);
            memcpy(v + o + 8, strs[i], l);
            o += 8 + l;
        }
        CHECK(o == total);
    }
    return gw_put(w, key, GGUF_VTYPE_ARRAY, v, total);
}

pd_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type, const void *data,
                              uint64_t n)
{
    if ((unsigned)elem_type >= GGUF_VTYPE_COUNT || elem_type == GGUF_VTYPE_STRING ||
        elem_type == GGUF_VTYPE_ARRAY)
        return gw_fail(w, PD_ERR_ARG, "array '%s' element type %d is not numeric or bool",
                       key ? key : "(null)", (int)elem_type);
    if (n && !data)
        return gw_fail(w, PD_ERR_ARG, "array '%s' data is NULL", key ? key : "(null)");
    size_t es = gguf_vtype_size[elem_type];
    if (n > (SIZE_MAX - 12) / es)
        return gw_fail(w, PD_ERR_NOMEM, "array '%s' is too large", key ? key : "(null)");
    size_t total = 12 + (size_t)n * es;
    const uint8_t *src = data;
    if (elem_type == GGUF_VTYPE_BOOL)
        for (uint64_t i = 0; i < n; i++)
            if (src[i] > 1)
                return gw_fail(w, PD_ERR_ARG, "array '%s' bool element %" PRIu64 " is %u, not 0 or 1",
                               key ? key : "(null)", i, (unsigned)src[i]);
    uint8_t *v = malloc(total);
    if (v) {
        st_u32(v, (uint32_t)elem_type);
        st_u64(v + 4, n);
        /* Elements go out little-endian from their native C representation. */
        for (uint64_t i = 0; i < n; i++) {
            uint8_t *d = v + 12 + i * es;
            const uint8_t *s = src + i * es;
            switch (es) {
            case 1: d[0] = s[0]; break;
            case 2: { uint16_t x; memcpy(&x, s, 2); st_u16(d, x); break; }
            case 4: { uint32_t x; memcpy(&x, s, 4); st_u32(d, x); break; }
            default: { uint64_t x; memcpy(&x, s, 8); st_u64(d, x); break; }
            }
        }
    }
    return gw_put(w, key, GGUF_VTYPE_ARRAY, v, total);
}

pd_status gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n)
{
    return gguf_writer_set_arr(w, key, GGUF_VTYPE_FLOAT32, v, n);
}

pd_status gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n)
{
    return gguf_writer_set_arr(w, key, GGUF_VTYPE_INT32, v, n);
}

static pd_status gw_add(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                        const uint64_t *ne, const void *data, bool copy)
{
    if (!w)
        return PD_ERR_ARG;
    const char *nm = name ? name : "(null)";
    if (!name || !name[0] || strlen(name) >= GGUF_NAME_MAX)
        return gw_fail(w, PD_ERR_ARG, "tensor name '%.80s' must be 1..%u bytes", nm,
                       GGUF_NAME_MAX - 1);
    uint32_t be = 0, bb = 0;
    if (!gguf_type_block(type, &be, &bb))
        return gw_fail(w, PD_ERR_ARG, "tensor '%s' has unknown ggml type %s", nm,
                       gguf_type_name(type));
    if (n_dims < 1 || n_dims > 4 || !ne)
        return gw_fail(w, PD_ERR_ARG, "tensor '%s' n_dims %" PRIu32 " is outside 1..4", nm, n_dims);
    uint64_t shape[4] = {1, 1, 1, 1};
    uint64_t nelem = 1;
    for (uint32_t d = 0; d < n_dims; d++) {
        if (ne[d] == 0 || ne[d] > (uint64_t)INT64_MAX || nelem > (uint64_t)INT64_MAX / ne[d])
            return gw_fail(w, PD_ERR_ARG, "tensor '%s' ne[%" PRIu32 "] = %" PRIu64
                           " is zero or overflows int64", nm, d, ne[d]);
        shape[d] = ne[d];
        nelem *= ne[d];
    }
    if (shape[0] % be != 0)
        return gw_fail(w, PD_ERR_ARG, "tensor '%s' ne[0] = %" PRIu64
                       " is not a multiple of the %s block size %" PRIu32, nm, shape[0],
                       gguf_type_name(type), be);
    uint64_t bytes = nelem / be;
    if (bytes > (uint64_t)INT64_MAX / bb || bytes * bb > SIZE_MAX)
        return gw_fail(w, PD_ERR_ARG, "tensor '%s' byte size overflows", nm);
    bytes *= bb;
    if (!data)
        return gw_fail(w, PD_ERR_ARG, "tensor '%s' data is NULL", nm);
    for (size_t i = 0; i < w->n_t; i++)
        if (strcmp(w->ts[i].name, name) == 0)
            return gw_fail(w, PD_ERR_ARG, "tensor '%s' was already added", nm);
    char *n = strdup(name);
    void *owned = NULL;
    if (copy && n) {
        owned = malloc((size_t)bytes);
        if (owned)
            memcpy(owned, data, (size_t)bytes);
    }
    if (!n || (copy && !owned) || !gw_grow((void **)&w->ts, &w->cap_t, w->n_t, sizeof *w->ts)) {
        free(n);
        free(owned);
        return gw_fail(w, PD_ERR_NOMEM, "out of memory adding tensor '%s'", nm);
    }
    w->ts[w->n_t++] = (gw_tensor){
        .name = n,
        .type = type,
        .n_dims = n_dims,
        .ne = {shape[0], shape[1], shape[2], shape[3]},
        .bytes = bytes,
        .data = copy ? owned : data,
        .owned = owned,
    };
    return PD_OK;
}

pd_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims,
                                 const uint64_t *ne, const void *data)
{
    return gw_add(w, name, type, n_dims, ne, data, false);
}

pd_status gguf_writer_add_tensor_copy(gguf_writer *w, const char *name, uint32_t type,
                                      uint32_t n_dims, const uint64_t *ne, const void *data)
{
    return gw_add(w, name, type, n_dims, ne, data, true);
}

/* Output: either a memory buffer sized up front, or a file being published
 * behind a small staging buffer (tensor data larger than it goes straight
 * through). */
typedef struct gw_sink {
    uint8_t *buf;
    size_t cap, len;
    pd_publish *pub; /* NULL for memory */
    pd_status st;
    pd_err *err;
} gw_sink;

static void sink_flush(gw_sink *s)
{
    if (!s->pub || s->st != PD_OK)
        return;
    s->st = pd_file_publish_write(s->pub, s->buf, s->len, s->err);
    s->len = 0;
}

static void sink_put(gw_sink *s, const void *p, size_t n)
{
    if (s->st != PD_OK || n == 0)
        return;
    if (!s->pub) {
        CHECK(n <= s->cap - s->len);
        memcpy(s->buf + s->len, p, n);
        s->len += n;
        return;
    }
    if (n > s->cap - s->len)
        sink_flush(s);
    if (n <= s->cap - s->len) {
        memcpy(s->buf + s->len, p, n);
        s->len += n;
        return;
    }
    /* larger than the staging buffer: write it directly */
    if (s->st == PD_OK)
        s->st = pd_file_publish_write(s->pub, p, n, s->err);
}

static void sink_u32(gw_sink *s, uint32_t v)
{
    uint8_t b[4];
    st_u32(b, v);
    sink_put(s, b, 4);
}

static void sink_u64(gw_sink *s, uint64_t v)
{
    uint8_t b[8];
    st_u64(b, v);
    sink_put(s, b, 8);
}

static void sink_zeros(gw_sink *s, uint64_t n)
{
    static const uint8_t zeros[256];
    while (n > 0) {
        size_t k = n < sizeof zeros ? (size_t)n : sizeof zeros;
        sink_put(s, zeros, k);
        n -= k;
    }
}

static uint64_t pad_to(uint64_t off, uint32_t a)
{
    return (a - off % a) % a;
}

/* Bytes of header, metadata and tensor infos (before the padding). */
static uint64_t gw_meta_bytes(const gguf_writer *w)
{
    uint64_t meta = GG_HEADER;
    for (size_t i = 0; i < w->n_kv; i++)
        meta += 8 + strlen(w->kvs[i].key) + 4 + w->kvs[i].val_len;
    for (size_t i = 0; i < w->n_t; i++)
        meta += 8 + strlen(w->ts[i].name) + 4 + 8 * (uint64_t)w->ts[i].n_dims + 4 + 8;
    return meta;
}

/* The alignment the writer will use, and the total file size. */
static pd_status gw_layout(gguf_writer *w, uint32_t *alignment, uint64_t *total, pd_err *err)
{
    if (w->err.status != PD_OK)
        return pd_err_set(err, w->err.status, "%s", w->err.msg);
    uint32_t a = GGUF_DEFAULT_ALIGNMENT;
    for (size_t i = 0; i < w->n_kv; i++) {
        const gw_kv *kv = &w->kvs[i];
        if (strcmp(kv->key, "general.alignment") == 0) {
            if (kv->type != GGUF_VTYPE_UINT32)
                return pd_err_set(err, PD_ERR_ARG, "gguf writer: general.alignment is %s, must be uint32",
                                  gguf_vtype_name(kv->type));
            a = rd_le32(kv->val);
            if (!is_pow2(a))
                return pd_err_set(err, PD_ERR_ARG,
                                  "gguf writer: general.alignment %" PRIu32 " is not a power of two", a);
        }
    }
    uint64_t meta = gw_meta_bytes(w);
    uint64_t t = meta + pad_to(meta, a);
    for (size_t i = 0; i < w->n_t; i++) {
        uint64_t b = w->ts[i].bytes;
        uint64_t padded = b + pad_to(b, a);
        if (padded < b || t > UINT64_MAX - padded)
            return pd_err_set(err, PD_ERR_RANGE, "gguf writer: the file size overflows");
        t += padded;
    }
    *alignment = a;
    *total = t;
    return PD_OK;
}

static void gw_emit(const gguf_writer *w, uint32_t a, gw_sink *s)
{
    sink_put(s, "GGUF", 4);
    sink_u32(s, 3);
    sink_u64(s, w->n_t);
    sink_u64(s, w->n_kv);
    for (size_t i = 0; i < w->n_kv; i++) {
        const gw_kv *kv = &w->kvs[i];
        size_t kl = strlen(kv->key);
        sink_u64(s, kl);
        sink_put(s, kv->key, kl);
        sink_u32(s, kv->type);
        sink_put(s, kv->val, kv->val_len);
    }
    uint64_t off = 0;
    for (size_t i = 0; i < w->n_t; i++) {
        const gw_tensor *t = &w->ts[i];
        size_t nl = strlen(t->name);
        sink_u64(s, nl);
        sink_put(s, t->name, nl);
        sink_u32(s, t->n_dims);
        for (uint32_t d = 0; d < t->n_dims; d++)
            sink_u64(s, t->ne[d]);
        sink_u32(s, t->type);
        sink_u64(s, off);
        off += t->bytes + pad_to(t->bytes, a);
    }
    sink_zeros(s, pad_to(gw_meta_bytes(w), a));
    for (size_t i = 0; i < w->n_t; i++) {
        const gw_tensor *t = &w->ts[i];
        sink_put(s, t->data, (size_t)t->bytes);
        sink_zeros(s, pad_to(t->bytes, a));
    }
}

pd_status gguf_writer_to_mem(gguf_writer *w, void **buf, size_t *len, pd_err *err)
{
    if (!w || !buf || !len)
        return pd_err_set(err, PD_ERR_ARG, "gguf writer: to_mem needs a writer, buf and len");
    uint32_t a = 0;
    uint64_t total = 0;
    pd_status st = gw_layout(w, &a, &total, err);
    if (st != PD_OK)
        return st;
    if (total > SIZE_MAX)
        return pd_err_set(err, PD_ERR_NOMEM, "gguf writer: %" PRIu64 " bytes do not fit in memory",
                          total);
    uint8_t *b = malloc((size_t)total);
    if (!b)
        return pd_err_set(err, PD_ERR_NOMEM, "gguf writer: out of memory for %" PRIu64 " bytes", total);
    gw_sink s = {.buf = b, .cap = (size_t)total, .err = err};
    gw_emit(w, a, &s);
    CHECK(s.st == PD_OK && s.len == total);
    *buf = b;
    *len = (size_t)total;
    return PD_OK;
}

pd_status gguf_writer_write(gguf_writer *w, const char *path, pd_err *err)
{
    if (!w || !path || !path[0])
        return pd_err_set(err, PD_ERR_ARG, "gguf writer: write needs a writer and a path");
    uint32_t a = 0;
    uint64_t total = 0;
    pd_status st = gw_layout(w, &a, &total, err);
    if (st != PD_OK)
        return st;
    enum { STAGE = 1 << 20 };
    uint8_t *stage = malloc(STAGE);
    if (!stage)
        return pd_err_set(err, PD_ERR_NOMEM, "gguf writer: out of memory");
    pd_publish *pub = NULL;
    st = pd_file_publish_begin(path, 0644, "gguf writer", &pub, err);
    if (st != PD_OK) {
        free(stage);
        return st;
    }
    gw_sink s = {.buf = stage, .cap = STAGE, .pub = pub, .err = err};
    gw_emit(w, a, &s);
    sink_flush(&s);
    if (s.st == PD_OK) {
        st = pd_file_publish_commit(pub, err);
    } else {
        pd_file_publish_abort(pub);
        st = s.st;
    }
    free(stage);
    return st;
}
