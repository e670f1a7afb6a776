/* libFuzzer target for the untrusted-text parsers of the page input: the page
 * manifest line parser (pages_line_check) and the .npy header parser
 * (npy_parse_header). Neither touches files, so any byte string is a valid
 * input; a crash, a sanitizer report or a broken postcondition is a bug.
 *
 * For scripts/fuzz.sh (it needs -lcjson too: see PD_FUZZ_LIBS):
 *   PD_FUZZ_SOURCES: cluster/format/pages.c cluster/format/npy.c comm/rd.c comm/crc32c.c base/file.c base/fnv.c base/utf8.c base/fp16.c base/cpu.c base/status.c
 *   PD_FUZZ_LIBS: -lcjson
 * Build and run by hand (from the source root; libFuzzer comes with clang):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -I. \
 *     tests/fuzz/fuzz_pages.c cluster/format/pages.c cluster/format/npy.c comm/rd.c \
 *     comm/crc32c.c base/file.c base/fnv.c base/utf8.c base/fp16.c base/cpu.c base/status.c \
 *     -lcjson -lm -o /tmp/fuzz_pages
 *   /tmp/fuzz_pages -max_total_time=60 -max_len=4096
 * Replay without libFuzzer (any C compiler): add -DPD_FUZZ_MAIN, drop
 * -fsanitize=fuzzer, and pass input files as arguments. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/format/npy.h"
#include "cluster/format/pages.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz_pages: postcondition failed: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    pd_err err = {0};
    /* The manifest line parser over the raw bytes (the loader passes one line
     * without its '\n', but the parser must survive anything). */
    pd_status st = pages_line_check((const char *)data, size, 1000, &err);
    if ((st == PD_OK) != (err.status == PD_OK) || strnlen(err.msg, sizeof err.msg) == sizeof err.msg)
        fuzz_fail("pages_line_check status/message");

    /* The npy header parser: the buffer as a whole file, and as the head of a
     * file claimed to be longer (the probe path). */
    for (int pass = 0; pass < 2; pass++) {
        npy_info info = {.rows = 12345};
        uint64_t file_size = pass == 0 ? size : (uint64_t)size + (size ? data[0] : 0) * 4u;
        pd_err_clear(&err);
        st = npy_parse_header(data, size, file_size, "fuzz.npy", &info, &err);
        if (st == PD_OK) {
            if (info.major < 1 || info.major > 3 || info.minor != 0)
                fuzz_fail("npy version");
            if (info.data_offset > file_size || info.data_offset > size)
                fuzz_fail("npy data offset beyond the file/buffer");
            if (info.cols && info.rows > UINT64_MAX / info.cols)
                fuzz_fail("npy shape overflow accepted");
            if (info.data_offset + info.rows * info.cols * 4 != file_size)
                fuzz_fail("npy size equation");
            if (info.file_size != file_size)
                fuzz_fail("npy file size");
        } else if (info.rows != 12345) {
            fuzz_fail("npy output written on failure");
        }
    }
    return 0;
}

#ifdef PD_FUZZ_MAIN
int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f) {
            perror(argv[i]);
            return 1;
        }
        static uint8_t buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
    }
    return 0;
}
#endif
