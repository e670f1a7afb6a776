/* libFuzzer target for the OCR text parser (render_doc_parse) and the cell
 * encoder behind `pipedec render`: any byte string is a valid input; a crash,
 * a sanitizer report or a broken postcondition is a bug. Postconditions: a
 * parsed page is printable ASCII and '\n' only, ends in '\n', and uses one
 * cell per byte; its embedding rows are multiples of 0.25 within +-13.
 *
 * For scripts/fuzz.sh:
 *   PD_FUZZ_SOURCES: cluster/format/render.c cluster/format/npy.c comm/rd.c comm/crc32c.c base/file.c base/fnv.c base/utf8.c base/fp16.c base/cpu.c base/status.c
 * Replay without libFuzzer: add -DPD_FUZZ_MAIN, drop -fsanitize=fuzzer, and
 * pass input files as arguments. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/format/render.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz_render: postcondition failed: %s\n", what);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    render_doc *d = NULL;
    pd_err err = {0};
    pd_status st = render_doc_parse((const char *)data, size, &d, &err);
    if ((st == PD_OK) != (d != NULL) || (st != PD_OK && !err.msg[0]))
        fuzz_fail("status, document and message disagree");
    if (st != PD_OK)
        return 0;
    enum { H = 8 };
    for (size_t i = 0; i < render_doc_pages(d); i++) {
        size_t len;
        const char *t = render_page_truth(d, i, &len);
        if (!t || len == 0 || t[len - 1] != '\n' || render_page_cells(d, i) != len)
            fuzz_fail("page text, final newline or cell count");
        for (size_t k = 0; k < len; k++)
            if (t[k] != '\n' && (t[k] < 32 || t[k] > 126))
                fuzz_fail("a byte outside printable ASCII");
        uint32_t cells = render_page_cells(d, i) + 1;
        float *rows = malloc((size_t)cells * H * sizeof *rows);
        if (!rows)
            break;
        if (render_page_embed(d, i, cells, H, rows, &err) != PD_OK)
            fuzz_fail("a page refused at its own capacity");
        for (size_t k = 0; k < (size_t)cells * H; k++)
            if (rows[k] * 4.0f != (float)(int)(rows[k] * 4.0f) || rows[k] < -13.0f || rows[k] > 13.0f)
                fuzz_fail("an embedding value off the 0.25 grid or out of range");
        free(rows);
    }
    render_doc_free(d);
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
