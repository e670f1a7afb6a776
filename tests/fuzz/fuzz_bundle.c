/* libFuzzer target for state bundles: any bytes are either refused with a
 * message naming a byte offset, or form a bundle whose entries lie inside the
 * input, carry the bundle's identity and layer, have distinct stream ids, and
 * whose records each validate on their own; rewriting the entries through
 * the streaming writer reproduces the input byte for byte. The streaming
 * reader, fed the same bytes in pieces, reaches parse's verdict with parse's
 * words and hands over the same entries.
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

/* The entries a streaming reader hands over, against parse's view. */
typedef struct seen {
    const bundle_view *v; /* NULL: parse refused the input */
    uint64_t n;
} seen;

static pd_status seen_entry(void *ctx, const bundle_entry *e, pd_err *err)
{
    (void)err;
    seen *s = ctx;
    if (s->v) {
        FZ_ASSERT(s->n < s->v->n_streams);
        const bundle_entry *p = &s->v->entries[s->n];
        FZ_ASSERT(e->stream == p->stream && e->offset == p->offset && e->len == p->len);
        FZ_ASSERT(memcmp(e->record, p->record, e->len) == 0);
    }
    s->n++;
    return PD_OK;
}

/* The reader over data in pieces of 1 + size % 61 bytes: parse's verdict. */
static void check_reader(const uint8_t *data, size_t size, const bundle_view *v, pd_status want, const pd_err *we)
{
    static const bundle_reader_ops ops = {.entry = seen_entry};
    seen s = {.v = v};
    bundle_reader *br = NULL;
    pd_err e = {0};
    FZ_ASSERT(bundle_reader_new(size, &ops, &s, &br, &e) == PD_OK);
    size_t piece = 1 + size % 61;
    pd_status st = PD_OK;
    for (size_t o = 0; o < size && st == PD_OK; o += piece)
        st = bundle_reader_push(br, data + o, size - o < piece ? size - o : piece, &e);
    if (st == PD_OK)
        st = bundle_reader_finish(br, &e);
    bundle_reader_free(br);
    FZ_ASSERT(st == want);
    if (want != PD_OK && want != PD_ERR_NOMEM)
        FZ_ASSERT(strcmp(e.msg, we->msg) == 0);
    if (want == PD_OK)
        FZ_ASSERT(s.n == v->n_streams);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bundle_view *v = NULL;
    pd_err e = {0};
    pd_status s = bundle_parse(data, size, &v, &e);
    check_reader(data, size, v, s, &e);
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
