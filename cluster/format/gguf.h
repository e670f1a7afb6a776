/* GGUF v3 model files (llama.cpp's format): a strict reader for files that may
 * be hostile, and a deterministic writer that never leaves a half-written file.
 *
 * The reader validates the whole header, metadata and tensor directory at
 * open and reports the first failure with its byte offset; after a successful
 * open every accessor is bounds-safe. The writer assembles metadata and tensors
 * in memory and writes them in one go (a temporary file, fsync, rename).
 *
 * Byte layout (all fields little-endian, written field by field):
 *
 *   offset  field
 *   0       magic "GGUF" (bytes 47 47 55 46)
 *   4       u32 version            3 (2 is the same layout and is accepted; 1 is refused)
 *   8       u64 tensor_count
 *   16      u64 kv_count
 *   24      kv_count x kv:
 *             string key           u64 len + len bytes (no terminator)
 *             u32 value type       gguf_vtype
 *             value                scalar: 1/2/4/8 bytes; BOOL: one byte 0 or 1;
 *                                  STRING: u64 len + bytes;
 *                                  ARRAY: u32 elem type (not ARRAY) + u64 count + elems
 *   ...     tensor_count x tensor info:
 *             string name          at most GGUF_NAME_MAX - 1 bytes
 *             u32 n_dims           1..4
 *             u64 ne[n_dims]       ne[0] is the contiguous dimension
 *             u32 ggml type        gguf_tensor_type
 *             u64 offset           relative to the data section, a multiple of alignment
 *   ...     zero padding to the next multiple of alignment
 *   data    tensor data; each tensor is followed by zero padding up to a multiple
 *           of alignment. alignment = the u32 key "general.alignment" (a power of
 *           two), default 32.
 *
 * What the reader refuses (PD_ERR_FORMAT unless noted; PD_ERR_TRUNCATED when the
 * bytes end early; PD_ERR_VERSION for versions other than 2 and 3): bad magic,
 * counts that cannot fit in the bytes that remain (checked before any
 * allocation), string lengths past the end, empty keys or tensor names, keys or
 * names containing a NUL byte, tensor names of GGUF_NAME_MAX bytes or more,
 * value types out of range, arrays of arrays, BOOL bytes other than 0/1,
 * duplicate keys, duplicate tensor names, "general.alignment" that is not a u32
 * power of two, n_dims outside 1..4, ne[i] == 0 or > INT64_MAX, element counts
 * or byte sizes that overflow int64, unknown or removed ggml types, ne[0] not a
 * multiple of the type's block size (Q8_0: 32), tensor offsets that are not
 * aligned, tensors that overlap, and tensors (including their trailing padding)
 * or the data section start that lie past the end of the file. Trailing bytes
 * after the last tensor's padding are allowed.
 *
 * An open gguf_file may be read from any number of threads (all accessors are
 * const). Its bytes must not change while it is open: bytes that change during
 * open make it fail (PD_ERR_IO) without overrunning anything, but a file
 * truncated under the mapping later raises SIGBUS, as with any mmap reader. */
#ifndef PD_GGUF_H
#define PD_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define GGUF_DEFAULT_ALIGNMENT 32u
/* Tensor names are stored with a terminator in ggml: at most 63 bytes of name. */
#define GGUF_NAME_MAX 64u

/* Metadata value types (the u32 after each key). */
typedef enum gguf_vtype {
    GGUF_VTYPE_UINT8 = 0,
    GGUF_VTYPE_INT8 = 1,
    GGUF_VTYPE_UINT16 = 2,
    GGUF_VTYPE_INT16 = 3,
    GGUF_VTYPE_UINT32 = 4,
    GGUF_VTYPE_INT32 = 5,
    GGUF_VTYPE_FLOAT32 = 6,
    GGUF_VTYPE_BOOL = 7,
    GGUF_VTYPE_STRING = 8,
    GGUF_VTYPE_ARRAY = 9,
    GGUF_VTYPE_UINT64 = 10,
    GGUF_VTYPE_INT64 = 11,
    GGUF_VTYPE_FLOAT64 = 12,
    GGUF_VTYPE_COUNT
} gguf_vtype;

/* Lower-case name of a value type ("uint32", "string", "array"); "unknown" if
 * out of range. Static storage. */
const char *gguf_vtype_name(uint32_t vtype);

/* ggml tensor types by id. This build computes with F32, F16, Q8_0, BF16,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K (gguf_type_supported); the others are known (names and byte sizes, so a file
 * holding them opens) but the model code refuses them. Ids 4, 5, 31..33 and
 * 36..38 were removed from ggml and are refused at open. */
typedef enum gguf_tensor_type {
    GGUF_TENSOR_F32 = 0,
    GGUF_TENSOR_F16 = 1,
    GGUF_TENSOR_Q4_0 = 2,
    GGUF_TENSOR_Q4_1 = 3,
    GGUF_TENSOR_Q5_0 = 6,
    GGUF_TENSOR_Q5_1 = 7,
    GGUF_TENSOR_Q8_0 = 8, /* blocks of 32: f16 scale d + 32 x int8 = 34 bytes */
    GGUF_TENSOR_Q8_1 = 9,
    GGUF_TENSOR_Q2_K = 10,
    GGUF_TENSOR_Q3_K = 11,
    GGUF_TENSOR_Q4_K = 12,
    GGUF_TENSOR_Q5_K = 13,
    GGUF_TENSOR_Q6_K = 14,
    GGUF_TENSOR_Q8_K = 15,
    GGUF_TENSOR_IQ2_XXS = 16,
    GGUF_TENSOR_IQ2_XS = 17,
    GGUF_TENSOR_IQ3_XXS = 18,
    GGUF_TENSOR_IQ1_S = 19,
    GGUF_TENSOR_IQ4_NL = 20,
    GGUF_TENSOR_IQ3_S = 21,
    GGUF_TENSOR_IQ2_S = 22,
    GGUF_TENSOR_IQ4_XS = 23,
    GGUF_TENSOR_I8 = 24,
    GGUF_TENSOR_I16 = 25,
    GGUF_TENSOR_I32 = 26,
    GGUF_TENSOR_I64 = 27,
    GGUF_TENSOR_F64 = 28,
    GGUF_TENSOR_IQ1_M = 29,
    GGUF_TENSOR_BF16 = 30,
    GGUF_TENSOR_TQ1_0 = 34,
    GGUF_TENSOR_TQ2_0 = 35,
    GGUF_TENSOR_MXFP4 = 39,
    GGUF_TENSOR_NVFP4 = 40,
    GGUF_TENSOR_Q1_0 = 41,
    GGUF_TENSOR_TYPE_COUNT
} gguf_tensor_type;

/* ggml's name of a tensor type ("f32", "q8_0", "q4_K", "bf16"); removed ids
 * keep their old name ("q4_0_4_4"); anything else is "unknown(N)". Known names
 * have static storage; "unknown(N)" lives in a small per-thread ring of buffers,
 * valid for the next three calls on the same thread (enough for one printf). */
const char *gguf_type_name(uint32_t ggml_type);

/* True for the types the model code computes with: F32, F16, Q8_0, BF16,
 * Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K. */
bool gguf_type_supported(uint32_t ggml_type);

/* Elements per block and bytes per block of a type the reader knows (F32: 1, 4;
 * Q8_0: 32, 34); false for unknown and removed ids. */
bool gguf_type_block(uint32_t ggml_type, uint32_t *block_elems, uint32_t *block_bytes);

/* Bytes of one row of ne0 elements of a supported type. Returns 0 and fills err
 * (PD_ERR_UNSUPPORTED naming the type, PD_ERR_ARG for ne0 == 0 or ne0 not a
 * multiple of the block size, PD_ERR_RANGE on overflow). */
size_t gguf_type_row_bytes(uint32_t ggml_type, uint64_t ne0, pd_err *err);

/* ---------------------------------------------------------------- reader */

typedef struct gguf_file gguf_file;

/* Maps path read-only (mmap) and validates everything listed above. On success
 * *out is owned by the caller (free with gguf_close); on failure *out is left
 * unchanged and err says what and at which byte offset, e.g.
 * "gguf: offset 24: kv 0 key length 18446744073709551615 exceeds the 100 remaining bytes". */
pd_status gguf_open(const char *path, gguf_file **out, pd_err *err);

/* The same checks on a caller buffer, which is borrowed: it must stay valid and
 * unchanged until gguf_close. */
pd_status gguf_open_mem(const void *buf, size_t len, gguf_file **out, pd_err *err);

/* Unmaps (gguf_open) and frees. gguf_close(NULL) is a no-op. Every pointer
 * obtained from f becomes invalid. */
void gguf_close(gguf_file *f);

/* Aborts (CHECK) if an internal invariant of an open file does not hold:
 * sorted unique keys and names, tensors aligned, in bounds and disjoint. */
void gguf_check(const gguf_file *f);

uint32_t gguf_version(const gguf_file *f);
uint32_t gguf_alignment(const gguf_file *f);
/* Byte offset of the data section in the file, and the file's size. */
uint64_t gguf_data_offset(const gguf_file *f);
uint64_t gguf_file_size(const gguf_file *f);
/* All gguf_file_size bytes of the file (the mapping or the caller's buffer),
 * borrowed from f: for whole-file digests. Reading it maps in every page. */
const void *gguf_bytes(const gguf_file *f);
/* The caller has copied what it needs of bytes [p, p + len) of f (p inside
 * gguf_bytes): for a file mapped by gguf_open, the pages wholly inside the
 * range leave the process's resident set (madvise MADV_DONTNEED on the
 * read-only mapping); they stay in the page cache and read back the same
 * bytes if touched again, so nothing f returns changes. A model load packs
 * every matrix into its own layout, so without this every packed weight
 * would be resident twice. A no-op for gguf_open_mem buffers (the caller's
 * memory), an empty range or one outside the file. */
void gguf_release_bytes(const gguf_file *f, const void *p, uint64_t len);

/* --- metadata */

/* One metadata entry, in file order. For ARRAY, elem_type and count describe
 * the elements; for other types elem_type == type and count == 1. key is
 * NUL-terminated and borrowed from f. */
typedef struct gguf_kv_info {
    const char *key;
    gguf_vtype type;
    gguf_vtype elem_type;
    uint64_t count;
} gguf_kv_info;

uint64_t gguf_kv_count(const gguf_file *f);
/* Entry i in file order, or NULL if i >= gguf_kv_count. Borrowed from f. */
const gguf_kv_info *gguf_kv_at(const gguf_file *f, uint64_t i);
/* Index (file order) of key, or -1 if absent. O(log kv_count). */
int64_t gguf_find_key(const gguf_file *f, const char *key);

/* Typed getters. Each fails without touching *out when the key is absent
 * (PD_ERR_FORMAT: "gguf: key 'x' is missing"), has the wrong type
 * (PD_ERR_MISMATCH, naming the key and its actual type) or a value that does
 * not fit (PD_ERR_RANGE).
 *   u32/i32/u64/i64: any integer type (UINT8..INT64) whose value fits.
 *   f32: FLOAT32, or FLOAT64 whose value is within float range (rounded).
 *   f64: FLOAT32 or FLOAT64 (exact).
 *   bool: BOOL only.  str: STRING only. */
pd_status gguf_get_u32(const gguf_file *f, const char *key, uint32_t *out, pd_err *err);
pd_status gguf_get_i32(const gguf_file *f, const char *key, int32_t *out, pd_err *err);
pd_status gguf_get_u64(const gguf_file *f, const char *key, uint64_t *out, pd_err *err);
pd_status gguf_get_i64(const gguf_file *f, const char *key, int64_t *out, pd_err *err);
pd_status gguf_get_f64(const gguf_file *f, const char *key, double *out, pd_err *err);
pd_status gguf_get_f32(const gguf_file *f, const char *key, float *out, pd_err *err);
pd_status gguf_get_bool(const gguf_file *f, const char *key, bool *out, pd_err *err);
/* *s is a NUL-terminated copy owned by f; *len is the exact byte length (the
 * value may itself contain NUL bytes; len is authoritative). len may be NULL. */
pd_status gguf_get_str(const gguf_file *f, const char *key, const char **s, size_t *len,
                       pd_err *err);

/* Any array. For numeric and BOOL elements *data points at the count packed
 * little-endian elements inside the file's bytes: NOT necessarily aligned for
 * the element type, so read elements with gguf_arr_*_at (or memcpy). For
 * STRING elements *data is NULL: use gguf_get_str_arr. data may be NULL. */
pd_status gguf_get_arr(const gguf_file *f, const char *key, gguf_vtype *elem_type,
                       uint64_t *count, const void **data, pd_err *err);

/* Element i of a packed array from gguf_get_arr; the caller checked elem_type
 * and i < count. Safe on unaligned data. */
float gguf_arr_f32_at(const void *data, uint64_t i);
int32_t gguf_arr_i32_at(const void *data, uint64_t i);
uint32_t gguf_arr_u32_at(const void *data, uint64_t i);

/* Element index of a STRING array (tokenizer.ggml.tokens), O(1) through an
 * index built at open. *s is a NUL-terminated copy owned by f, *len its exact
 * length (may be NULL). PD_ERR_RANGE if index >= count, PD_ERR_MISMATCH if the
 * key is not an array of strings. */
pd_status gguf_get_str_arr(const gguf_file *f, const char *key, uint64_t index, const char **s,
                           size_t *len, pd_err *err);

/* --- tensors */

/* One tensor of the directory. name is NUL-terminated; ne[i] = 1 for
 * i >= n_dims; offset is relative to the data section; bytes is the exact
 * (unpadded) size; data points into the file's bytes, aligned to the file's
 * alignment relative to the start of the buffer (gguf_open maps page-aligned, so
 * there it is truly aligned). All borrowed from f. type may be any known type:
 * check gguf_type_supported before computing with it. */
typedef struct gguf_tensor {
    const char *name;
    uint32_t type;
    uint32_t n_dims;
    uint64_t ne[4];
    uint64_t offset;
    uint64_t bytes;
    const void *data;
} gguf_tensor;

uint64_t gguf_tensor_count(const gguf_file *f);
/* Tensor i in file order, or NULL if i >= gguf_tensor_count. */
const gguf_tensor *gguf_tensor_at(const gguf_file *f, uint64_t i);
/* Tensor by name, or NULL. O(log tensor_count). */
const gguf_tensor *gguf_tensor_find(const gguf_file *f, const char *name);

/* ---------------------------------------------------------------- writer */

/* Collects metadata and tensors and writes a GGUF v3 file. Keys are written in
 * the order they were first set (setting a key again replaces its value in
 * place), tensors in the order they were added, each at the next aligned offset:
 * the same calls give the same bytes. The alignment is the value of a u32
 * "general.alignment" key if one was set (it must be a power of two), else 32.
 *
 * Errors are sticky: every setter returns a status, and the first failure
 * (bad key, duplicate tensor name, bad shape, out of memory) is also kept and
 * returned by gguf_writer_write / gguf_writer_to_mem, so a caller may check
 * only there. Keys must be non-empty and free of NUL bytes (they are C strings
 * here). */
typedef struct gguf_writer gguf_writer;

/* Returns an owned writer (free with gguf_writer_free), or NULL if out of memory. */
gguf_writer *gguf_writer_new(void);
/* gguf_writer_free(NULL) is a no-op. Borrowed tensor data is not touched. */
void gguf_writer_free(gguf_writer *w);
/* Aborts (CHECK) if an internal invariant of the writer does not hold. */
void gguf_writer_check(const gguf_writer *w);

pd_status gguf_writer_set_u8(gguf_writer *w, const char *key, uint8_t v);
pd_status gguf_writer_set_i8(gguf_writer *w, const char *key, int8_t v);
pd_status gguf_writer_set_u16(gguf_writer *w, const char *key, uint16_t v);
pd_status gguf_writer_set_i16(gguf_writer *w, const char *key, int16_t v);
pd_status gguf_writer_set_u32(gguf_writer *w, const char *key, uint32_t v);
pd_status gguf_writer_set_i32(gguf_writer *w, const char *key, int32_t v);
pd_status gguf_writer_set_u64(gguf_writer *w, const char *key, uint64_t v);
pd_status gguf_writer_set_i64(gguf_writer *w, const char *key, int64_t v);
pd_status gguf_writer_set_f32(gguf_writer *w, const char *key, float v);
pd_status gguf_writer_set_f64(gguf_writer *w, const char *key, double v);
pd_status gguf_writer_set_bool(gguf_writer *w, const char *key, bool v);
/* s is NUL-terminated and copied. */
pd_status gguf_writer_set_str(gguf_writer *w, const char *key, const char *s);
/* n strings, each NUL-terminated, copied. */
pd_status gguf_writer_set_arr_str(gguf_writer *w, const char *key, const char *const *strs,
                                  uint64_t n);
pd_status gguf_writer_set_arr_f32(gguf_writer *w, const char *key, const float *v, uint64_t n);
pd_status gguf_writer_set_arr_i32(gguf_writer *w, const char *key, const int32_t *v, uint64_t n);
/* Any numeric or BOOL element type: n elements of the type's natural C type
 * (bool elements as uint8_t 0/1), copied. STRING and ARRAY elements are refused. */
pd_status gguf_writer_set_arr(gguf_writer *w, const char *key, gguf_vtype elem_type,
                              const void *v, uint64_t n);

/* Adds a tensor of any known type (gguf_type_block). data (bytes exactly
 * ne[0]*...*ne[n_dims-1] / block_elems * block_bytes) is BORROWED: it must stay
 * valid and unchanged until the last gguf_writer_write / _to_mem call.
 * The name is copied. */
pd_status gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type,
                                 uint32_t n_dims, const uint64_t *ne, const void *data);
/* The same, but the writer copies data (freed with the writer). */
pd_status gguf_writer_add_tensor_copy(gguf_writer *w, const char *name, uint32_t type,
                                      uint32_t n_dims, const uint64_t *ne, const void *data);

/* Writes the file to a temporary file beside path ("<path>.tmp.XXXXXX", mode
 * 0644), fsyncs it, renames it over path and fsyncs the directory
 * (pd_file_publish_*, base/file.h), so path is either the old file or the
 * complete new one. On failure the temporary file is removed. May be called
 * more than once. */
pd_status gguf_writer_write(gguf_writer *w, const char *path, pd_err *err);

/* The same bytes into memory: *buf is owned by the caller (free with free()). */
pd_status gguf_writer_to_mem(gguf_writer *w, void **buf, size_t *len, pd_err *err);

#endif
