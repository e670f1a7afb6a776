/* kv_chunk: rows of one kv layer of one page-stream as a message — the
 * unit of live migration's pre-copy (cluster/runtime/ops/precopy.h). A chunk
 * carries rows [row0, row0 + n) exactly as the layer stores them (f32 or
 * int8 rows and their scales, the frozen q8 field), so a receiver can grow
 * a copy of the layer row range by row range while the source keeps
 * decoding, and the final chunk adds what is not rows (importance of every
 * row, recurrent records). Applying every chunk of a layer in order gives a
 * layer whose CMFS record (comm/wire.h) is byte-identical to the source's.
 *
 * Byte layout (little-endian; the payload is the host's f32 / int8 bytes and
 * a big-endian host is refused; docs/wire.md §8):
 *
 *   off size field
 *   0   4    magic "PDKC"
 *   4   4    u32 version = 1
 *   8   4    u32 flags: 1 RESET (row0 = 0: the receiver's copy restarts),
 *                       2 FINAL (importance and recurrent records follow)
 *   12  4    u32 layer
 *   16  8    u64 identity (model + layer + policy, wire_identity)
 *   24  8    u64 stream
 *   32  8    u64 row0
 *   40  8    u64 n rows
 *   48  8    u64 base (first position the rows hold)
 *   56  4    u32 kv heads        60  4  u32 head dim
 *   64  4    u32 mode (kv_mode)  68  4  u32 frozen (0 / 1)
 *   72  4    u32 tail window     76  4  u32 freeze rows
 *   80  8    u64 importance count (FINAL: row0 + n, else 0)
 *   88  8    u64 recurrent count (FINAL only, else 0)
 *   96  H    alive mask (one byte per head), zero-padded to 8 bytes
 *   ...      frozen: per alive head, K field [hd] f32 (q8 K), V field [hd]
 *            f32 (q8 V)
 *   ...      per alive head: K rows, K scales, V rows, V scales as the mode
 *            stores them (f32 [n x hd]; int8 [n x hd] zero-padded to 4
 *            bytes; K scales [n x ceil(hd / 32)] f32; V scales [n] f32)
 *   ...      importance [count] f32, recurrent records [count] f32
 *   end-4 4  u32 CRC32C of every byte before it
 *
 * Decoding checks the CRC, every count against the bytes (no trailing
 * byte), the geometry against the receiving layer, and that every f32 value
 * is finite, before anything is applied. */
#ifndef PD_COMM_KV_CHUNK_H
#define PD_COMM_KV_CHUNK_H

#include "base/status.h"
#include "cache/kv_layer.h"

#include <stddef.h>
#include <stdint.h>

#define KV_CHUNK_RESET 1u
#define KV_CHUNK_FINAL 2u
#define KV_CHUNK_HEADER 96u

/* What a chunk says of itself (kv_chunk_decode). */
typedef struct kv_chunk_info {
    uint32_t flags, layer;
    uint64_t identity, stream, row0, n_rows;
} kv_chunk_info;

/* Bytes of the chunk of rows [row0, row0 + n) of l (FINAL: with importance
 * and recurrent records). PD_ERR_RANGE when the rows are not all in l. */
pd_status kv_chunk_size(const kv_layer *l, uint64_t row0, uint64_t n, uint32_t flags, size_t *size, pd_err *err);

/* Writes that chunk into buf[0..cap) (cap >= kv_chunk_size); *len its size.
 * flags must hold RESET exactly when row0 = 0. PD_ERR_REFUSED while l has
 * importance pending (a FINAL chunk's importance must be final). */
pd_status kv_chunk_encode(const kv_layer *l, uint64_t identity, uint32_t layer, uint64_t stream, uint64_t row0,
                          uint64_t n, uint32_t flags, void *buf, size_t cap, size_t *len, pd_err *err);

/* A decoded chunk: borrowed views into the buffer it was decoded from. */
typedef struct kv_chunk_view {
    kv_chunk_info info;
    kv_state rows;               /* the chunk's rows (rows.rows = n); heads
                                    is the caller's array */
    const float *imp;            /* FINAL: importance of every row */
    uint64_t n_imp;
    const float *linear;         /* FINAL: recurrent records */
    uint64_t n_linear;
} kv_chunk_view;

/* Header only (info), after the length and CRC check: tells the receiver
 * which stream and layer a chunk is for before it picks the layer to check
 * it against. */
pd_status kv_chunk_peek(const void *buf, size_t len, kv_chunk_info *info, pd_err *err);

/* Validates the whole chunk against cfg (geometry, mode, alive mask,
 * freeze rows) and fills *v with views into buf (which must be 4-byte
 * aligned) and heads[0..cfg->n_kv_heads) (the caller's). Every failure
 * names the field and its offset. */
pd_status kv_chunk_decode(const void *buf, size_t len, const kv_layer_config *cfg, kv_head_state *heads,
                          kv_chunk_view *v, pd_err *err);

/* Applies a decoded chunk to l: RESET rebuilds l from the rows
 * (kv_layer_assign_state), otherwise l must hold exactly row0 rows and the
 * rows are appended (kv_layer_append_state); FINAL then replaces the
 * importance and recurrent records. On failure l may hold the rows of a
 * failed FINAL chunk without its importance: the caller drops the copy. */
pd_status kv_chunk_apply(kv_layer *l, const kv_chunk_view *v, pd_err *err);

#endif
