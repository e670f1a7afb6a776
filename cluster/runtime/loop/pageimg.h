/* pageimg: image pages inside a run (run --mmproj MM): the head encodes each
 * page image with the vision encoder (cluster/vision/venc.h) when the
 * scheduler first needs its rows, and feeds them as it feeds embedding rows.
 * The output is byte-identical to `pipedec encode` then `run` on its
 * manifest: the same library makes the same rows and the same text pieces,
 * at the same positions (tests/anchor/mtmd_pages.sh compares them).
 *
 * At load (pages_opts.image_rows) each image's rows are counted from its
 * header alone (mtmd's preprocessing of a placeholder of the same size), so
 * the scheduler plans the page without decoding it. Encoded images are kept
 * in a small cache (one entry per stream that may be prefilling, plus one)
 * until their prefill is done; a chunked prefill reads one encoding. A
 * checkpoint holds no image rows: a resumed job re-encodes only the pages
 * still in prefill (deterministic: the same rows). */
#ifndef PD_RUNTIME_PAGEIMG_H
#define PD_RUNTIME_PAGEIMG_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cluster/model/model.h"

typedef struct pageimg pageimg;

/* Opens the encoder (mmproj against the decoder at model_path, threads
 * encoder threads) with room for `streams` images in flight. */
pd_status pageimg_open(const char *mmproj, const char *model_path, uint32_t threads,
                       uint32_t streams, pageimg **out, pd_err *err);

void pageimg_free(pageimg *pi);

/* pages_opts.image_rows: the rows the image at path becomes. ctx: pageimg. */
pd_status pageimg_count(void *ctx, const char *path, uint32_t *rows, pd_err *err);

/* sched_config.image (sched.h). ctx: pageimg. */
pd_status pageimg_read(void *ctx, size_t page, uint32_t seg, const char *path, uint32_t seg_rows,
                       const model *em, uint32_t off, uint32_t n, float *dst, pd_err *err);

/* Images encoded so far (a cache miss each). */
uint64_t pageimg_encoded(const pageimg *pi);

#endif
