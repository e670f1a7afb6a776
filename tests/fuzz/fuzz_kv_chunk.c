/* libFuzzer target for kv chunk decoding (live migration's pre-copy): any
 * bytes are either refused with a message or decode into rows that apply to
 * a copy of the chunk's own geometry; a chunk that fails to apply leaves the
 * copy as it was, and an applied chunk re-encodes to the same bytes.
 *
 * The first input byte picks the receiving layer's mode and whether it
 * already holds rows; the rest is the chunk (after a valid CRC is forced
 * for half the inputs, so the fuzzer reaches the body's checks).
 *
 * Built by scripts/fuzz.sh (clang -fsanitize=fuzzer,address,undefined).
 * PD_FUZZ_SOURCES: comm/kv_chunk.c comm/rd.c comm/crc32c.c cache/kv_layer.c cache/attn.c cache/attn_avx512.c cache/quant.c base/fnv.c base/fp16.c base/cpu.c base/alloc.c base/status.c */
#include "cache/kv_layer.h"
#include "comm/crc32c.h"
#include "comm/kv_chunk.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_ASSERT(c)                                                                  \
    do {                                                                              \
        if (!(c)) {                                                                   \
            fprintf(stderr, "fuzz_kv_chunk: %s:%d: %s\n", __FILE__, __LINE__, #c);    \
            abort();                                                                  \
        }                                                                             \
    } while (0)

enum { NKV = 2, HD = 8 };

static kv_layer *make(kv_mode mode)
{
    kv_layer_config cfg = {.n_kv_heads = NKV, .head_dim = HD, .mode = mode, .capacity_rows = 4, .freeze_rows = 4};
    kv_layer *l = NULL;
    pd_err e = {0};
    FZ_ASSERT(kv_layer_new(&cfg, &l, &e) == PD_OK);
    return l;
}

static size_t record(kv_layer *l, uint8_t **out)
{
    pd_err e = {0};
    size_t n = 0;
    FZ_ASSERT(kv_chunk_size(l, 0, kv_layer_rows(l), KV_CHUNK_RESET | KV_CHUNK_FINAL, &n, &e) == PD_OK);
    *out = malloc(n);
    size_t len = 0;
    kv_layer_confirm(l, kv_layer_pos_len(l));
    FZ_ASSERT(kv_chunk_encode(l, 1, 0, 1, 0, kv_layer_rows(l), KV_CHUNK_RESET | KV_CHUNK_FINAL, *out, n, &len, &e) ==
              PD_OK);
    return len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    static const kv_mode modes[4] = {KV_MODE_F32, KV_MODE_Q8K, KV_MODE_Q8V, KV_MODE_Q8K | KV_MODE_Q8V};
    kv_mode mode = modes[data[0] & 3];
    int prefill = (data[0] >> 2) & 7, fix_crc = (data[0] >> 5) & 1;
    data++;
    size--;
    kv_layer *l = make(mode);
    float k[NKV * HD], v[NKV * HD];
    pd_err e = {0};
    for (int r = 0; r < prefill; r++) {
        for (int i = 0; i < NKV * HD; i++) {
            k[i] = (float)(r * 7 + i) / 13.0f - 1.0f;
            v[i] = (float)(r * 5 - i) / 11.0f;
        }
        FZ_ASSERT(kv_layer_append(l, k, v, &e) == PD_OK);
    }
    uint8_t *before = NULL;
    size_t before_len = record(l, &before);

    uint8_t *buf = malloc(size + 4);
    memcpy(buf, data, size);
    if (fix_crc && size >= 4) {
        uint32_t c = crc32c_update(0, buf, size - 4);
        memcpy(buf + size - 4, &c, 4);
    }
    kv_layer_config cfg;
    kv_layer_config_get(l, &cfg);
    kv_head_state hs[NKV];
    kv_chunk_view view = {0};
    pd_status s = kv_chunk_decode(buf, size, &cfg, hs, &view, &e);
    if (s == PD_OK) {
        s = kv_chunk_apply(l, &view, &e);
        if (s == PD_OK) {
            kv_layer_check(l);
            /* what was applied encodes back to the same rows */
            size_t n = 0, len = 0;
            uint64_t r0 = view.info.row0, nr = view.info.n_rows;
            FZ_ASSERT(kv_chunk_size(l, r0, nr, view.info.flags, &n, &e) == PD_OK);
            uint8_t *again = malloc(n);
            kv_layer_confirm(l, kv_layer_pos_len(l));
            FZ_ASSERT(kv_chunk_encode(l, view.info.identity, view.info.layer, view.info.stream, r0, nr,
                                      view.info.flags, again, n, &len, &e) == PD_OK);
            FZ_ASSERT(len == size);
            free(again);
        }
    }
    if (s != PD_OK) {
        FZ_ASSERT(e.status == s && e.msg[0] != '\0');
        /* a refused decode changed nothing (a failed apply of a FINAL chunk
         * may leave its rows: the caller drops such a copy) */
        uint8_t *after = NULL;
        size_t after_len = record(l, &after);
        if (!(view.info.flags & KV_CHUNK_FINAL))
            FZ_ASSERT(after_len == before_len && memcmp(after, before, before_len) == 0);
        free(after);
    }
    free(before);
    free(buf);
    kv_layer_free(l);
    return 0;
}
