/* State bundles: many CMFS records (one per page-stream) of one layer in one
 * container, for checkpoint files and migration messages.
 *
 * A bundle is validated whole (header CRC, every entry's length and CRC, every
 * record's structure, identity and layer, duplicate stream ids, count against
 * bytes, trailing bytes) before anything is installed; bundle_install then
 * decodes every record into a fresh layer and swaps them all in only when all
 * succeeded. A bundle arriving in pieces (a migration) is validated as it
 * arrives by the streaming reader, which hands over each entry once it is
 * checked: the caller decodes it into state held aside and switches that in
 * only when the reader finished (bundle_parse is the reader over one buffer).
 *
 * Byte layout (little-endian; docs/wire.md):
 *
 *   off size field
 *   0   4    magic "CMFB"
 *   4   4    u32 version = 1            (any other: PD_ERR_VERSION)
 *   8   8    u64 identity               model identity every record carries
 *   16  4    u32 layer                  layer every record names
 *   20  4    u32 reserved = 0
 *   24  8    u64 stream count
 *   32  4    u32 CRC32C of bytes [0, 32)
 *   36  ...  stream count entries:
 *              u64 stream id
 *              u64 record length L
 *              L   record bytes (a CMFS record, wire.h)
 *              u32 CRC32C of (stream id, length, record): the 16 + L bytes before it
 *
 * Every byte is covered by a CRC (the header by its own, each entry by its
 * own), so any single corrupted byte is detected.
 *
 * Streaming write: the writer emits the header, then for each stream computes
 * the record's exact size (wire_record_size), writes id and length, and
 * encodes the record straight into a sink with a running CRC: a bundle of
 * large states is never held in memory, let alone twice. Checkpoints stream
 * into their files, migrations into MPI pieces (bundle_entry_bytes gives the
 * size a receiver is told first). */
#ifndef PD_COMM_BUNDLE_H
#define PD_COMM_BUNDLE_H

#include "base/status.h"
#include "comm/lcache_wire.h"
#include "comm/rd.h"
#include "comm/wire.h"

#include <stddef.h>
#include <stdint.h>

#define BUNDLE_MAGIC "CMFB"
#define BUNDLE_VERSION 1u
#define BUNDLE_HEADER_BYTES 36u
#define BUNDLE_ENTRY_OVERHEAD 20u /* id + length + CRC */

/* One validated entry. record points into the parsed buffer (borrowed). */
typedef struct bundle_entry {
    uint64_t stream;
    const uint8_t *record;
    size_t len;
    size_t offset;  /* of the record's first byte in the bundle */
    wire_info info; /* what the record says (wire_inspect) */
} bundle_entry;

/* A validated bundle. Owned; free with bundle_view_free. Entries borrow the
 * buffer given to bundle_parse, which must outlive the view. */
typedef struct bundle_view {
    uint32_t version;
    uint64_t identity;
    uint32_t layer;
    uint64_t n_streams;
    bundle_entry *entries; /* [n_streams], in file order */
    size_t bytes;
} bundle_view;

/* Validates buf[0..len) as a whole bundle. On success *out is owned by the
 * caller. On failure nothing is returned and err names the byte offset. */
pd_status bundle_parse(const void *buf, size_t len, bundle_view **out, pd_err *err);
void bundle_view_free(bundle_view *v);

/* Where one entry goes, filled by the resolver: either a layer cache
 * container at its stream's position (c and pos: lcache_wire_prepare, the
 * runtime's checkpoints and migrations), or a bare layer (ref.kv or
 * ref.ring: wire_import_prepare). ref.identity and ref.layer are what the
 * record must carry in both cases. */
typedef struct bundle_target {
    wire_layer_ref ref;
    lcache *c;    /* borrowed; NULL: install into ref's layer */
    uint64_t pos; /* with c: the stream's position the record stands for */
} bundle_target;

/* Maps a stream id to where its record goes (fills *t, zeroed before the
 * call). A failure aborts the install before anything is swapped. */
typedef pd_status (*bundle_resolve_fn)(void *ctx, uint64_t stream, bundle_target *t, pd_err *err);

/* The one install path of state bundles (checkpoint restore, migration).
 * Installs every entry of v: prepares all (every check and the decode into
 * fresh state, without touching any target) and commits all only when every
 * one succeeded. On failure no target changed and err names the stream. Two
 * entries must not resolve to the same target (PD_ERR_ARG). */
pd_status bundle_install(const bundle_view *v, bundle_resolve_fn resolve, void *ctx, pd_err *err);

/* ---- streaming reader ---------------------------------------------------- */

typedef struct bundle_reader bundle_reader;

/* What a reader calls as the bytes arrive. A callback's failure (with err
 * set) fails the reader. Either may be NULL. */
typedef struct bundle_reader_ops {
    /* Once the header passed its checks (magic, version, CRC, reserved, the
     * stream count against the announced bytes): h's version, identity,
     * layer, n_streams and bytes (entries NULL). */
    pd_status (*header)(void *ctx, const bundle_view *h, pd_err *err);
    /* Each entry once it passed bundle_parse's checks: its CRC, its record's
     * structure (wire_inspect), identity and layer, a stream id not seen
     * before. e->record is valid during the call only (in the bytes pushed,
     * or in the reader's buffer when the entry was split between pushes). */
    pd_status (*entry)(void *ctx, const bundle_entry *e, pd_err *err);
} bundle_reader_ops;

/* Starts reading a bundle announced as `bytes` long. Owned; free with
 * bundle_reader_free. It holds the header, one entry's head and, only for
 * an entry split between pushes, that entry's record: never the bundle. */
pd_status bundle_reader_new(uint64_t bytes, const bundle_reader_ops *ops, void *ctx, bundle_reader **out,
                            pd_err *err);

/* The next n bytes. The first failure sticks (every later push and the
 * finish return it again, err naming the byte offset): bytes past the
 * announced length, any check of bundle_parse, a callback's failure. */
pd_status bundle_reader_push(bundle_reader *br, const void *bytes, size_t n, pd_err *err);

/* PD_OK only when every announced byte arrived and formed a valid bundle
 * (PD_ERR_TRUNCATED when bytes are missing); else the reader's failure. */
pd_status bundle_reader_finish(bundle_reader *br, pd_err *err);

void bundle_reader_free(bundle_reader *br);

/* ---- streaming writer ---------------------------------------------------- */

typedef struct bundle_writer bundle_writer;

/* Starts a bundle of exactly n_streams entries written to sink (ctx is the
 * sink's, e.g. a FILE* with wr_sink_file). Writes the header. Owned; free
 * with bundle_writer_free (after bundle_writer_finish, or to abandon). */
pd_status bundle_writer_new(wr_sink_fn sink, void *sink_ctx, uint64_t identity, uint32_t layer,
                            uint64_t n_streams, bundle_writer **out, pd_err *err);

/* Appends stream `stream` with ref's layer encoded as a record (f16 K/V
 * payloads when f16). ref's identity and layer must equal the bundle's
 * (PD_ERR_MISMATCH); a repeated stream id or one entry too many is
 * PD_ERR_ARG. Refusals of wire_encode pass through. A sink failure leaves
 * the output incomplete: abandon it. */
pd_status bundle_writer_add(bundle_writer *bw, uint64_t stream, const wire_layer_ref *ref, int f16,
                            pd_err *err);

/* Appends an already encoded record (validated with wire_inspect first). */
pd_status bundle_writer_add_record(bundle_writer *bw, uint64_t stream, const void *record,
                                   size_t len, pd_err *err);

/* Checks that every announced stream was written and flushes the sink. */
pd_status bundle_writer_finish(bundle_writer *bw, pd_err *err);

/* The bytes bundle_writer_add adds for ref (20 + wire_record_size): a
 * bundle's length before it is written. Refusals of wire_record_size. */
pd_status bundle_entry_bytes(const wire_layer_ref *ref, int f16, uint64_t *bytes, pd_err *err);

/* Bytes emitted so far. */
uint64_t bundle_writer_bytes(const bundle_writer *bw);

void bundle_writer_free(bundle_writer *bw);

#endif
