/* lcache_wire: a layer cache container (cache/layer_cache.h) as a CMFS
 * record (comm/wire.h) and back.
 *
 * It lives in comm/ because cache/ knows no byte layout: the container
 * exposes its implementation object (a kv_layer or a ring_layer) and the
 * wire describes that object exactly as it describes a bare one, so a
 * container's record is byte-identical to the record of the layer behind it
 * (kinds FULL / FULL_TAIL / Q8 for a kv layer, RING for a ring).
 *
 * What a record holds between groups is the implementation's: a kv record
 * holds every stored row, pending ones included (settle first for final rows
 * only), and is refused while importance mass is pending; a ring record holds
 * committed rows only (pending verify rows never travel). A record's header
 * position is the layer's depth, which is not the stream's position once
 * eviction dropped rows: the position travels beside the record, and an
 * import is told it. */
#ifndef PD_COMM_LCACHE_WIRE_H
#define PD_COMM_LCACHE_WIRE_H

#include "base/status.h"
#include "cache/layer_cache.h"
#include "comm/wire.h"

#include <stddef.h>
#include <stdint.h>

/* The record of c with header identity and layer (wire_export of the object
 * behind c). Returns owned *out of *len bytes, free with free(); c is not
 * changed. Refusals as wire_export (PD_ERR_REFUSED: pending importance). */
pd_status lcache_wire_export(const lcache *c, uint64_t identity, uint32_t layer, int f16, uint8_t **out,
                             size_t *len, pd_err *err);

/* The wire's view of c's implementation object (what lcache_wire_export
 * encodes; bundle_writer_add streams it). kc receives the kv configuration
 * the ref points to: it must outlive the ref. */
wire_layer_ref lcache_wire_ref(const lcache *c, uint64_t identity, uint32_t layer, kv_layer_config *kc);

/* Replaces c's state with the record's, for a stream at position pos: checks
 * the record as wire_import does against c's implementation (identity,
 * layer, kind, geometry, mode, every count) and its header position against
 * pos (lcache_adopt_check), decodes into fresh state and only then swaps it
 * in. Afterwards c is at pos with nothing pending. On any failure c is
 * unchanged; PD_ERR_ARG while c has an open group. base_offset: where buf starts in an
 * enclosing file (error messages). */
pd_status lcache_wire_import(lcache *c, uint64_t identity, uint32_t layer, uint64_t pos, const void *buf,
                             size_t len, size_t base_offset, pd_err *err);

/* lcache_wire_import in two phases, for callers that install many records at
 * once (comm/bundle.h): prepare runs every check and decodes into fresh state
 * without touching c; commit swaps it in and puts c at pos (cannot fail);
 * lcache_wire_pending_free discards it (NULL is a no-op). *out is owned by the
 * caller until commit consumes it. c is borrowed and must not change in
 * between. */
typedef struct lcache_wire_pending lcache_wire_pending;

pd_status lcache_wire_prepare(lcache *c, uint64_t identity, uint32_t layer, uint64_t pos, const void *buf,
                              size_t len, size_t base_offset, lcache_wire_pending **out, pd_err *err);
void lcache_wire_commit(lcache_wire_pending *p);
void lcache_wire_pending_free(lcache_wire_pending *p);

#endif
