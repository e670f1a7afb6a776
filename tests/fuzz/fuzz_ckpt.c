/* libFuzzer target: the checkpoint manifest decoder (cluster/runtime/
 * ckpt_manifest.h). Any input is refused cleanly or decodes into streams that
 * keep every invariant and re-encodes to the same bytes.
 * PD_FUZZ_SOURCES: cluster/runtime/ops/ckpt_manifest.c cluster/runtime/pipeline/stream.c cluster/runtime/pipeline/digest.c cluster/model/sample.c cache/attn.c cache/attn_avx512.c comm/rd.c comm/crc32c.c base/fp16.c base/cpu.c base/status.c base/fnv.c */
#include "cluster/runtime/ops/ckpt_manifest.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pd_err e = {0};
    stream_limits lim = {.max_new = 1u << 16, .max_prefill = 1u << 24};
    ckpt_manifest m;
    if (ckpt_manifest_decode(data, size, &lim, 256, &m, &e) != PD_OK)
        return 0;
    for (uint32_t i = 0; i < m.n_streams; i++)
        stream_check(&m.streams[i]);
    wr w;
    if (wr_init_buffer(&w, 0, &e) != PD_OK || ckpt_manifest_encode(&m, &w) != PD_OK)
        abort();
    size_t len = 0;
    uint8_t *again = wr_take(&w, &len);
    if (len != size || memcmp(again, data, size) != 0)
        abort(); /* an accepted manifest must re-encode to itself */
    free(again);
    ckpt_manifest_free(&m);
    return 0;
}
