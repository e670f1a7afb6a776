/* npy: the NumPy .npy files that carry a page's embedding rows.
 *
 * Reads format versions 1.0, 2.0 and 3.0 holding a 2-D little-endian float32
 * array in C order ({'descr': '<f4', 'fortran_order': False, 'shape': (R, C)})
 * and writes version 1.0 (NumPy's own header layout, 64-byte aligned) atomically.
 * Every other dtype, Fortran order and any other rank are refused by name.
 *
 * File layout (all little-endian):
 *   offset  size  field
 *   0       6     magic "\x93NUMPY"
 *   6       1     major version (1, 2 or 3)
 *   7       1     minor version (0)
 *   8       2|4   header length H: u16 in 1.0, u32 in 2.0 and 3.0
 *   10|12   H     header: a Python dict literal (ASCII here), padded with
 *                 spaces and ending in '\n' by NumPy's writer
 *   10|12+H R*C*4 the float32 values, row after row
 * The header is parsed as a real Python literal (quoted keys, True/False, int
 * tuples, whitespace, optional trailing commas); keys must be exactly descr,
 * fortran_order and shape, each once. The data must fill the file exactly:
 * a shorter file is truncated, a longer one carries trailing bytes; both are
 * refused. Errors name the file and the byte offset or field:
 *   "npy: p3.npy: offset 8: header length 70000 exceeds file size 500". */
#ifndef PD_NPY_H
#define PD_NPY_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Largest header accepted (NumPy's own reader refuses far smaller ones). */
#define NPY_MAX_HEADER_LEN (1u << 20)

/* What a validated header says about its file.
 * INV: data_offset + rows * cols * 4 == file_size, no overflow on the way. */
typedef struct npy_info {
    uint8_t major;        /* 1, 2 or 3 */
    uint8_t minor;        /* 0 */
    uint64_t header_len;  /* H above */
    uint64_t data_offset; /* byte offset of the first float */
    uint64_t rows;        /* shape[0] */
    uint64_t cols;        /* shape[1] */
    uint64_t file_size;   /* bytes in the whole file */
} npy_info;

/* Parses and validates the start of an .npy file held in memory: buf holds the
 * first len bytes of a file of file_size bytes (len may be all of it). Needs
 * the magic, the version, the length field and the whole header in buf; a
 * shorter buf returns PD_ERR_TRUNCATED. name is used only in messages.
 * Pure function of its arguments (fuzzable); *out is written only on PD_OK. */
pd_status npy_parse_header(const void *buf, size_t len, uint64_t file_size, const char *name,
                           npy_info *out, pd_err *err);

/* Opens path, reads and validates its header against the file's size. */
pd_status npy_probe(const char *path, npy_info *out, pd_err *err);

/* Reads rows [row0, row0 + n) of the file at path into dst [n x cols]. The
 * file's header is read again and must still describe exactly `expect` (the
 * npy_info of an earlier probe: same shape, offset and size), so a file that
 * changed since it was validated is refused instead of misread. dst is
 * caller-owned; on failure its contents are unspecified. */
pd_status npy_read_rows(const char *path, const npy_info *expect, uint64_t row0, uint64_t n,
                        float *dst, pd_err *err);

/* Reads the whole array into a caller buffer of cap floats. *info (optional)
 * receives the header. Refuses (PD_ERR_RANGE) an array of more than cap floats. */
pd_status npy_read_into(const char *path, float *dst, size_t cap, npy_info *info, pd_err *err);

/* Reads the whole array into a new array: *out is owned by the caller, free it
 * with free(); it is NULL for an empty array. *info (optional) receives the
 * header. Nothing is written to *out on failure. */
pd_status npy_load(const char *path, npy_info *info, float **out, pd_err *err);

/* Writes data [rows x cols] as a '<f4' C-order .npy file. Atomic: the bytes go
 * to a temporary file beside path which is fsynced and renamed over path
 * (pd_file_publish_*, base/file.h), so
 * path holds the old file or the complete new one, never a partial one. */
pd_status npy_write_f32(const char *path, uint64_t rows, uint64_t cols, const float *data,
                        pd_err *err);

#endif
