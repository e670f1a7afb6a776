/* The CMFS wire: one layer's cache state for one stream as bytes (seed: cortiq
 * export_wire / import_wire, version 2), for rebalancing and checkpoints.
 *
 * Export reads a kv_layer or ring_layer and refuses state the format does not
 * describe. Import decodes into FRESH state (kv_layer_new_from_state /
 * ring_layer_new_from_state) and swaps it into the target only when every
 * check passed, so a failed import leaves the target exactly as it was.
 *
 * Byte layout, little-endian, field by field (docs/wire.md has every byte):
 *
 *   off size field
 *   0   4    magic "CMFS"
 *   4   4    u32 version = 2          (any other: PD_ERR_VERSION)
 *   8   8    u64 identity             (wire_identity)
 *   16  4    u32 layer
 *   20  1    u8  kind                 (wire_kind; unknown: PD_ERR_FORMAT)
 *   21  1    u8  f16                  K/V payload dtype: 0 f32, 1 f16
 *   22  2    u16 reserved = 0
 *   24  8    u64 position             absolute depth
 *   32  ...  body by kind:
 *     0 FULL       full_body                              (base == 0)
 *     3 FULL_TAIL  u64 base (> 0), full_body
 *     1 LINEAR     u32 kv_heads, u32 head_dim, u32 n, n x f32
 *     2 BOUNDED    u32 kv_heads, u32 head_dim, u32 window, u32 len, u32 head,
 *                  ring K [kv_heads x window x head_dim], ring V (payload dtype)
 *     4 RING       u32 kv_heads, u32 head_dim, u32 window, u32 ref_rows,
 *                  u32 ring_len, u32 ring_pos, u64 writes, u8 decoding,
 *                  u8 int8_mirror, u16 reserved = 0,
 *                  per head: u32 n, ref K; u32 n, ref V; u32 n, ring K; u32 n, ring V
 *                  (ring rows are the live slots [0, ring_len) in slot order)
 *     6 RING_Q8    u32 kv_heads, u32 head_dim, u32 window, u32 k_group,
 *                  u32 ref_rows, u32 ring_len, u32 ring_pos, u64 writes,
 *                  u8 decoding, u8 mode (1 q8k, 2 q8v, 3 q8), u16 reserved = 0,
 *                  per head, for ref K, ref V, ring K, ring V in turn:
 *                    u32 n, rows (int8 when the mode quantizes that
 *                    component, else payload); u32 m, f32 scales (K: rows x
 *                    ceil(head_dim / k_group), V: rows; 0 when not int8)
 *     5 Q8         u32 kv_heads, u32 head_dim, u32 k_group, u32 freeze_rows,
 *                  u8 mode, u8 frozen, u16 reserved = 0, u64 base, u32 rows,
 *                  u32 n_linear, u32 n_importance, n_linear x f32,
 *                  n_importance x f32,
 *                  per head: u32 n, K (int8 when mode bit 0, else payload);
 *                            u32 n, K scales f32; u32 n, V (int8 when mode
 *                            bit 1, else payload); u32 n, V scales f32;
 *                            u32 n, K field f32; u32 n, V field f32
 *   full_body: u32 f16, u32 rows, u32 kv_heads, u32 head_dim, u32 n_linear,
 *              u32 n_importance, n_linear x f32, n_importance x f32,
 *              per head: u32 n_k, n_k values, u32 n_v, n_v values
 *
 * The unversioned legacy body (a bare full_body, no header) is read only when
 * the caller passes WIRE_ALLOW_LEGACY. */
#ifndef PD_COMM_WIRE_H
#define PD_COMM_WIRE_H

#include "cache/kv_layer.h"
#include "cache/ring_layer.h"
#include "base/status.h"
#include "comm/rd.h"

#include <stddef.h>
#include <stdint.h>

#define WIRE_MAGIC "CMFS"
#define WIRE_VERSION 2u
#define WIRE_HEADER_BYTES 32u

typedef enum wire_kind {
    WIRE_KIND_FULL = 0,      /* per-position f32 K/V + importance (+ linear vector) */
    WIRE_KIND_LINEAR = 1,    /* recurrent vector only */
    WIRE_KIND_BOUNDED = 2,   /* bounded anchor ring */
    WIRE_KIND_FULL_TAIL = 3, /* a trimmed full layer: base + full body */
    WIRE_KIND_RING = 4,      /* R-SWA ring layer (new in pipedec) */
    WIRE_KIND_Q8 = 5,        /* q8_2f / mixed kv storage (new in pipedec) */
    WIRE_KIND_RING_Q8 = 6,   /* R-SWA ring layer with int8 storage (issue 40) */
    WIRE_KIND_COUNT
} wire_kind;

/* "full", "linear", "bounded", "full_tail", "ring", "q8", "ring_q8";
 * "unknown" otherwise. */
const char *wire_kind_name(unsigned kind);

/* Import flags. */
enum {
    WIRE_ALLOW_LEGACY = 1u << 0, /* accept the seed's unversioned full body */
};

/* The 64-bit identity of what makes a record meaningful: FNV-1a 64 over
 *   "CMFS-id\0" (8 bytes), u64 digest_len, digest bytes, u32 layer,
 *   u64 policy_len, policy bytes       (all little-endian)
 * then the splitmix64 finalizer; 0 is mapped to 1 so 0 never names a model.
 * digest: the model weights digest (any length, may be NULL when 0);
 * policy: the cache policy string (e.g. "kv:f32" or "ring:w=128"), NULL = "". */
uint64_t wire_identity(const void *digest, size_t digest_len, uint32_t layer, const char *policy);

/* Which layer a record comes from or goes to. Exactly one of kv / ring is set.
 * Borrowed for the duration of a call.
 * kv_cfg: the configuration kv was created with (kv_layer_config_get(kv)
 * returns it, capacity_rows being the current capacity): its n_kv_heads sizes
 * the state view, and an import builds the fresh layer from it (allocator,
 * capacity, spec depth, scratch fan-out), so the swapped-in state lives where
 * the original did. It must describe kv truthfully. */
typedef struct wire_layer_ref {
    uint64_t identity; /* header identity written / required */
    uint32_t layer;    /* header layer written / required */
    kv_layer *kv;
    const kv_layer_config *kv_cfg; /* required with kv */
    ring_layer *ring;
    int linear; /* kv only: a linear-core layer, exchanges LINEAR records */
    /* Optional, kv only: a spare layer of the target's geometry and mode that
     * an import decodes into (kv_layer_assign_state: reuses its memory, so no
     * fresh pages are allocated and faulted in per import) and that holds
     * the target's previous state after commit. NULL: a fresh layer. */
    kv_layer *kv_spare;
} wire_layer_ref;

/* What a record says about itself (wire_inspect, also the CLI's inspect). */
typedef struct wire_info {
    int legacy;         /* 1: unversioned body (no header fields below) */
    uint32_t version;
    uint64_t identity;
    uint32_t layer;
    uint8_t kind;       /* wire_kind */
    uint8_t f16;        /* payload dtype */
    uint64_t position;
    uint32_t kv_heads, head_dim;
    uint64_t rows;      /* stored rows: full/q8 rows, ring reference rows,
                           bounded live slots */
    uint64_t base;      /* full_tail / q8: absolute position of row 0 */
    uint32_t window;    /* bounded / ring */
    uint32_t ring_len, ring_pos; /* ring; bounded: len, head */
    uint64_t writes;    /* ring */
    uint8_t decoding, int8_mirror; /* ring */
    uint8_t mode, frozen; /* q8, ring_q8 (mode: kv_mode bits) */
    uint32_t k_group, freeze_rows; /* q8 (k_group also ring_q8) */
    uint64_t n_linear, n_importance;
    uint32_t alive_heads; /* heads holding rows (full / q8 with rows > 0) */
    size_t bytes;       /* record size */
} wire_info;

/* Validates a record structurally (no target): magic, version, kind,
 * reserved bytes, flags, every count against the bytes that remain, per-head
 * lengths 0 or rows x head_dim, importance 0 or rows, cursors and position
 * consistency, trailing bytes. Fills *info (may be NULL) on success.
 * base_offset is where buf starts in the enclosing file, so messages name
 * absolute offsets. Never allocates. */
pd_status wire_inspect(const void *buf, size_t len, unsigned flags, size_t base_offset,
                       wire_info *info, pd_err *err);

/* Decodes only the 32-byte header (magic, version, kind known, reserved,
 * f16 flag 0/1). */
pd_status wire_header_decode(const void *buf, size_t len, size_t base_offset, wire_info *info,
                             pd_err *err);

/* Exact byte size of the record wire_encode would write for ref.
 * Refuses (PD_ERR_REFUSED / PD_ERR_UNSUPPORTED) what the format does not
 * describe: pending importance (confirm first), a bounded ring alongside
 * rows or a linear vector, a linear layer holding rows, fields under f32. */
pd_status wire_record_size(const wire_layer_ref *ref, int f16, size_t *size, pd_err *err);

/* Writes the record into w (any writer mode; the CRC of a bundle entry runs
 * through it). Same refusals as wire_record_size. */
pd_status wire_encode(const wire_layer_ref *ref, int f16, wr *w, pd_err *err);

/* Convenience: the record in a new buffer (owned, free with free()). */
pd_status wire_export(const wire_layer_ref *ref, int f16, uint8_t **out, size_t *len,
                      pd_err *err);

/* Installs a record into ref's layer: checks magic, version, identity,
 * layer, kind fits the layer, geometry, alive mask, position, every count,
 * reserved bytes, flags, trailing bytes; decodes into a fresh layer built
 * with the target's configuration, then swaps it in. On any failure the
 * target is untouched. base_offset as in wire_inspect. */
pd_status wire_import(const wire_layer_ref *ref, const void *buf, size_t len, unsigned flags,
                      size_t base_offset, pd_err *err);

/* Two-phase import for callers that install many records at once (bundles):
 * prepare decodes and validates one record into a fresh layer built with the
 * target's configuration, without touching the target; commit swaps it in
 * and cannot fail. Prepare every record first, then commit all (or free all
 * pending on the first failure: nothing was installed).
 * *out is owned by the caller: wire_import_commit consumes it,
 * wire_pending_free discards it (NULL is a no-op). ref's layer is borrowed
 * and must outlive the pending import and not change in between. */
typedef struct wire_pending wire_pending;

pd_status wire_import_prepare(const wire_layer_ref *ref, const void *buf, size_t len,
                              unsigned flags, size_t base_offset, wire_pending **out,
                              pd_err *err);
void wire_import_commit(wire_pending *p);
void wire_pending_free(wire_pending *p);

#endif
