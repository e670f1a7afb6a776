/* libFuzzer target for page image headers (image_parse_header): any byte
 * string is refused with a message or read as an image within the page
 * limits; never a crash or a read past the bytes given. The input is parsed
 * twice: as a whole file, and as the head of a longer file (what image_probe
 * does before it reads on), which must agree with the whole-file answer
 * whenever it gives one.
 *
 * For scripts/fuzz.sh:
 *   PD_FUZZ_SOURCES: cluster/format/image.c base/file.c base/status.c
 * Replay without libFuzzer: add -DPD_FUZZ_MAIN, drop -fsanitize=fuzzer, and
 * pass input files as arguments. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/format/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz_image: postcondition failed: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    /* an exact-size copy, so a read past the end is an ASan report */
    uint8_t *b = malloc(size ? size : 1);
    if (!b)
        return 0;
    memcpy(b, data, size);
    image_info whole, head;
    pd_err err = {0};
    size_t need = 0;
    pd_status st = image_parse_header(b, size, size, "f", &whole, &need, &err);
    if (st != PD_OK && !err.msg[0])
        fuzz_fail("a refusal without a message");
    if (st == PD_OK && (whole.width < 1 || whole.height < 1 || whole.width > IMAGE_MAX_SIDE ||
                        whole.height > IMAGE_MAX_SIDE ||
                        (uint64_t)whole.width * whole.height > IMAGE_MAX_PIXELS ||
                        whole.file_size != size))
        fuzz_fail("an image outside the page limits");
    pd_err e2 = {0};
    need = 0;
    pd_status st2 = image_parse_header(b, size, (uint64_t)size + 1000000, "f", &head, &need, &e2);
    if (st2 == PD_OK && st == PD_OK && (head.width != whole.width || head.height != whole.height))
        fuzz_fail("the head of a longer file reads as another image");
    if (st2 == PD_ERR_TRUNCATED && need && need <= size)
        fuzz_fail("asked for bytes it already had");
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
