/* libFuzzer target for state bundles: any bytes are either refused with a
 * message naming a byte offset, or form a bundle whose entries lie inside the
 * input, carry the bundle's identity and layer, have distinct stream ids, and
 * whose records each validate on their own; rewriting the entries through
 * the streaming writer reproduces the input byte for byte.
 * PD_FUZZ_SOURCES: comm/bundle.c comm/lcache_wire.c comm/wire.c comm/rd.c comm/crc32c.c cache/layer_cache.c cache/kv_layer.c cache/ring_layer.c cache/attn.c cache/attn_avx512.c cache/quant.c base/fnv.c base/fp16.c base/cpu.c base/alloc.c base/status.c */
#include "comm/bundle.h"
#include "comm/wire.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_ASSERT(c)                                                                     \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "fuzz_bundle: %s:%d: %s\n", __FILE__, __LINE__, #c);         \
            abort();                                                                     \
        }                                                                                \
    } while (0)

typedef struct memsink {
    uint8_t *b;
    size_t n, cap;
} memsink;

static pd_status memsink_write(void *ctx, const void *p, size_t n, pd_err *err)
{
    memsink *m = ctx;
    if (m->n + n > m->cap)
        return pd_err_set(err, PD_ERR_IO, "longer than the input");
    memcpy(m->b + m->n, p, n);
    m->n += n;
    return PD_OK;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bundle_view *v = NULL;
    pd_err e = {0};
    pd_status s = bundle_parse(data, size, &v, &e);
    if (s != PD_OK) {
        FZ_ASSERT(v == NULL);
        FZ_ASSERT(e.status == s);
        FZ_ASSERT(strstr(e.msg, "offset ") != NULL || s == PD_ERR_NOMEM);
        return 0;
    }
    FZ_ASSERT(v->bytes == size);
    memsink m = {.b = malloc(size ? size : 1), .cap = size};
    bundle_writer *bw = NULL;
    FZ_ASSERT(bundle_writer_new(memsink_write, &m, v->identity, v->layer, v->n_streams, &bw, NULL) ==
              PD_OK);
    for (uint64_t i = 0; i < v->n_streams; i++) {
        const bundle_entry *en = &v->entries[i];
        FZ_ASSERT(en->record >= data && en->record + en->len <= data + size);
        FZ_ASSERT(en->record == data + en->offset);
        FZ_ASSERT(en->info.identity == v->identity && en->info.layer == v->layer);
        FZ_ASSERT(wire_inspect(en->record, en->len, 0, 0, NULL, NULL) == PD_OK);
        for (uint64_t j = 0; j < i; j++)
            FZ_ASSERT(v->entries[j].stream != en->stream);
        FZ_ASSERT(bundle_writer_add_record(bw, en->stream, en->record, en->len, NULL) == PD_OK);
    }
    FZ_ASSERT(bundle_writer_finish(bw, NULL) == PD_OK);
    FZ_ASSERT(m.n == size && memcmp(m.b, data, size) == 0);
    bundle_writer_free(bw);
    free(m.b);
    bundle_view_free(v);
    return 0;
}
