/* libFuzzer target for CMFS record decoding: any bytes are either refused
 * with a message naming a byte offset, or describe a record that imports into
 * a fresh layer of the record's own geometry (for geometries small enough to
 * build) and exports again to a record of the same size and header.
 * A refused import must leave the target untouched.
 *
 * Built by scripts/fuzz.sh (clang -fsanitize=fuzzer,address,undefined) from
 * tests/fuzz/fuzz_wire.c comm/{wire,rd,crc32c}.c, the cache sources and base/.
 * PD_FUZZ_SOURCES: comm/wire.c comm/rd.c comm/crc32c.c cache/kv_layer.c cache/ring_layer.c cache/attn.c cache/attn_avx512.c cache/quant.c base/fnv.c base/fp16.c base/cpu.c base/alloc.c base/status.c */
#include "cache/kv_layer.h"
#include "cache/ring_layer.h"
#include "comm/wire.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_ASSERT(c)                                                                     \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "fuzz_wire: %s:%d: %s\n", __FILE__, __LINE__, #c);           \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* Small enough to build a layer for (the fuzzer owns the sizes). */
static int small(const wire_info *i)
{
    /* the harness builds the target from the record's own geometry: keep it small (a
     * q8 target preallocates its freeze snapshot for freeze_rows rows) */
    return i->kv_heads <= 16 && i->head_dim <= 256 && i->window <= 1024 && i->rows <= 4096 &&
           i->freeze_rows <= 4096;
}

static void refused_cleanly(const pd_err *e, pd_status s)
{
    FZ_ASSERT(s != PD_OK);
    FZ_ASSERT(e->status == s);
    FZ_ASSERT(strstr(e->msg, "offset ") != NULL);
}

static void check_reexport(const wire_layer_ref *ref, const uint8_t *data, size_t size,
                           const wire_info *in)
{
    pd_err e = {0};
    uint8_t *out = NULL;
    size_t n = 0;
    pd_status s = wire_export(ref, in->f16, &out, &n, &e);
    if (s != PD_OK) {
        fprintf(stderr, "fuzz_wire: imported record does not export: %s\n", e.msg);
        abort();
    }
    wire_info again;
    FZ_ASSERT(wire_inspect(out, n, 0, 0, &again, NULL) == PD_OK);
    FZ_ASSERT(again.kind == in->kind || (in->legacy && again.kind == WIRE_KIND_FULL));
    FZ_ASSERT(again.position == in->position);
    FZ_ASSERT(again.rows == in->rows);
    if (!in->legacy) {
        FZ_ASSERT(n == size);
        FZ_ASSERT(memcmp(out, data, 20) == 0); /* magic .. layer */
        FZ_ASSERT(memcmp(out + 22, data + 22, 10) == 0);
    }
    free(out);
}

static void try_kv(const uint8_t *data, size_t size, unsigned flags, const wire_info *in)
{
    uint8_t alive[16];
    kv_layer_config cfg = {
        .n_kv_heads = in->kv_heads,
        .head_dim = in->head_dim,
        .mode = in->kind == WIRE_KIND_Q8 ? (kv_mode)in->mode : KV_MODE_F32,
        .freeze_rows = in->kind == WIRE_KIND_Q8 ? in->freeze_rows : 0,
    };
    /* Every head alive: a record with dead heads is refused as a mismatch,
     * which exercises the refusal path; so does any other disagreement. */
    for (uint32_t h = 0; h < in->kv_heads; h++)
        alive[h] = 1;
    cfg.alive = alive;
    kv_layer *l = NULL;
    if (kv_layer_new(&cfg, &l, NULL) != PD_OK)
        return;
    if (in->kind == WIRE_KIND_BOUNDED && kv_layer_install_bounded(l, in->window, NULL) != PD_OK) {
        kv_layer_free(l);
        return;
    }
    wire_layer_ref ref = {.identity = in->identity, .layer = in->layer, .kv = l, .kv_cfg = &cfg,
                          .linear = in->kind == WIRE_KIND_LINEAR};
    uint64_t gen = kv_layer_generation(l);
    pd_err e = {0};
    pd_status s = wire_import(&ref, data, size, flags, 0, &e);
    if (s == PD_OK) {
        kv_layer_check(l);
        check_reexport(&ref, data, size, in);
    } else {
        refused_cleanly(&e, s);
        FZ_ASSERT(kv_layer_generation(l) == gen);
    }
    kv_layer_free(l);
}

static void try_ring(const uint8_t *data, size_t size, const wire_info *in)
{
    ring_layer_config cfg = {
        .n_kv_heads = in->kv_heads,
        .head_dim = in->head_dim,
        .window = in->window,
        .ref_capacity = in->rows ? (uint32_t)in->rows : 1,
        .int8_mirror = in->int8_mirror,
        .mode = in->kind == WIRE_KIND_RING_Q8 ? (kv_mode)in->mode : KV_MODE_F32,
    };
    ring_layer *r = NULL;
    if (ring_layer_new(&cfg, &r, NULL) != PD_OK)
        return;
    wire_layer_ref ref = {.identity = in->identity, .layer = in->layer, .ring = r};
    uint64_t id = ring_layer_id(r);
    pd_err e = {0};
    pd_status s = wire_import(&ref, data, size, 0, 0, &e);
    if (s == PD_OK) {
        FZ_ASSERT(ring_layer_check(r, NULL) == PD_OK);
        check_reexport(&ref, data, size, in);
    } else {
        refused_cleanly(&e, s);
        FZ_ASSERT(ring_layer_id(r) == id);
    }
    ring_layer_free(r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    for (unsigned flags = 0; flags <= WIRE_ALLOW_LEGACY; flags += WIRE_ALLOW_LEGACY) {
        wire_info in;
        pd_err e = {0};
        pd_status s = wire_inspect(data, size, flags, 0, &in, &e);
        if (s != PD_OK) {
            refused_cleanly(&e, s);
            continue;
        }
        FZ_ASSERT(in.bytes == size);
        if (!small(&in))
            continue;
        if (in.kind == WIRE_KIND_RING || in.kind == WIRE_KIND_RING_Q8)
            try_ring(data, size, &in);
        else
            try_kv(data, size, flags, &in);
    }
    return 0;
}
