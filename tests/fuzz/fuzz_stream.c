/* libFuzzer target: the per-stream state record decoder (cluster/runtime/
 * stream.h). Any input is refused cleanly or decodes into a state that keeps
 * every invariant (stream_check) and re-encodes to the same bytes.
 * PD_FUZZ_SOURCES: cluster/runtime/pipeline/stream.c cluster/runtime/pipeline/digest.c cluster/model/sample.c cache/attn.c cache/attn_avx512.c comm/rd.c comm/crc32c.c base/fp16.c base/cpu.c base/status.c base/fnv.c */
#include "cluster/runtime/pipeline/stream.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    rd r;
    pd_err e = {0};
    rd_init(&r, data, size, 0, "stream", &e);
    stream_limits lim = {.max_new = 1u << 16, .max_prefill = 1u << 24};
    stream_state s;
    if (stream_decode(&r, &lim, &s) != PD_OK)
        return 0;
    stream_check(&s);
    wr w;
    if (wr_init_buffer(&w, 0, &e) != PD_OK || stream_encode(&s, &w) != PD_OK)
        abort();
    size_t len = 0;
    uint8_t *again = wr_take(&w, &len);
    if (len != size || memcmp(again, data, size) != 0)
        abort(); /* an accepted record must re-encode to itself */
    free(again);
    stream_release(&s);
    return 0;
}
