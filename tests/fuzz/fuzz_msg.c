/* libFuzzer target: pipeline message decoders (comm/msg.h). Any input must be
 * refused cleanly or decode into arrays within the limits; a decoded batch
 * (f32) or results message re-encodes to the same bytes.
 * PD_FUZZ_SOURCES: comm/msg.c comm/rd.c comm/crc32c.c base/fp16.c base/cpu.c base/status.c */
#include "comm/msg.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define FZ_HIDDEN 4
#define FZ_ROWS 16

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static mb_admit admit[FZ_ROWS];
    static uint64_t retire[FZ_ROWS];
    static mb_row rows[FZ_ROWS];
    static float x[FZ_ROWS * FZ_HIDDEN];
    static uint32_t tokens[FZ_ROWS];
    static uint64_t digests[FZ_ROWS];
    static uint8_t again[4096];
    msg_limits lim = {.max_admit = FZ_ROWS, .max_retire = FZ_ROWS, .max_rows = FZ_ROWS, .max_tokens = FZ_ROWS,
                      .hidden = FZ_HIDDEN};
    pd_err e = {0};
    msg_kind kind;
    uint64_t seq;
    msg_stats stats;
    msg_decode_stats(data, size, &stats, &e); /* any bytes: refused or decoded, never a crash */
    if (msg_peek(data, size, &kind, &seq, &e) != PD_OK)
        return 0;
    if (kind == MSG_KIND_BATCH) {
        msg_batch b = {.admit = admit, .retire = retire, .rows = rows, .x = x};
        if (msg_decode_batch(data, size, &lim, &b, &e) == PD_OK) {
            size_t len = 0;
            if (b.dtype == MSG_DTYPE_F32 && msg_encode_batch(&b, again, sizeof again, &len, &e) == PD_OK &&
                (len != size || memcmp(again, data, size) != 0))
                abort(); /* an accepted f32 batch must re-encode to itself */
        }
    } else if (kind == MSG_KIND_RESULTS) {
        uint32_t n, flags;
        if (msg_decode_results(data, size, &lim, &seq, &flags, tokens, digests, &n, &e) == PD_OK) {
            size_t len = 0;
            if (msg_encode_results(seq, flags, tokens, digests, n, again, sizeof again, &len, &e) != PD_OK ||
                len != size || memcmp(again, data, size) != 0)
                abort(); /* accepted results must re-encode to themselves */
        }
    } else if (kind == MSG_KIND_DRAIN) {
        uint32_t action, number;
        if (msg_decode_drain(data, size, &seq, &action, &number, &e) == PD_OK) {
            size_t len = 0;
            if (msg_encode_drain(seq, action, number, again, sizeof again, &len, &e) != PD_OK || len != size ||
                memcmp(again, data, size) != 0)
                abort(); /* an accepted drain must re-encode to itself */
        }
    }
    return 0;
}
