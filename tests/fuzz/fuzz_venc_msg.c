/* libFuzzer target for the encoder-rank messages (venc_msg_parse_request,
 * venc_msg_parse_reply): any bytes are refused with a message or read into
 * pieces of the asked width whose row counts add up; never a crash or a read
 * past the input.
 *
 * For scripts/fuzz.sh:
 *   PD_FUZZ_SOURCES: cluster/vision/venc_msg.c cluster/vision/venc.c cluster/format/image.c comm/rd.c comm/crc32c.c base/file.c base/status.c base/fp16.c base/cpu.c
 * Replay without libFuzzer: add -DPD_FUZZ_MAIN, drop -fsanitize=fuzzer, and
 * pass input files as arguments. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/vision/venc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz_venc_msg: postcondition failed: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    uint8_t *b = malloc(size ? size : 1);
    if (!b)
        return 0;
    memcpy(b, data, size);
    uint32_t width = size ? 1u + data[0] % 16u : 4;
    venc_out o;
    uint64_t id;
    pd_err why = {0}, err = {0};
    pd_status st = venc_msg_parse_reply(b, size, width, &id, &o, &why, &err);
    if (st != PD_OK && (!err.msg[0] || o.n_pieces))
        fuzz_fail("a refusal without a message, or with pieces left");
    if (st == PD_OK) {
        uint64_t rows = 0;
        for (size_t k = 0; k < o.n_pieces; k++) {
            if (o.pieces[k].n == 0 || (o.pieces[k].image ? !o.pieces[k].rows : !o.pieces[k].tokens))
                fuzz_fail("an empty piece");
            rows += o.pieces[k].n;
        }
        if (rows != o.rows || (why.status == PD_OK && !o.n_pieces))
            fuzz_fail("rows do not add up");
        venc_out_free(&o);
    }
    uint32_t kind;
    const char *path;
    size_t pl;
    pd_err e2 = {0};
    if (venc_msg_parse_request(b, size, &kind, &id, &path, &pl, &e2) == PD_OK &&
        (pl > VENC_MAX_PATH || (kind == VENC_MSG_ENCODE && pl == 0) || (pl && memchr(path, 0, pl))))
        fuzz_fail("a request path out of its rules");
    free(b);
    return 0;
}

#ifdef PD_FUZZ_MAIN
int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f)
            continue;
        static uint8_t buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
    }
    return 0;
}
#endif
