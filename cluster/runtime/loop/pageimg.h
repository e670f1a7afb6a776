/* pageimg: image pages inside a run (run --mmproj MM): the rows of each
 * page image, from the vision encoder (cluster/vision/venc.h), fed by the
 * head as it feeds embedding rows. The output is byte-identical to `pipedec
 * encode` then `run` on its manifest: the same library makes the same rows
 * and text pieces at the same positions (tests/anchor/mtmd_pages.sh).
 *
 * Where images are encoded:
 *   - on the head itself (no encoder ranks), when the scheduler first needs
 *     an image's rows;
 *   - on E encoder ranks of their own (run --encoder-ranks E): the head
 *     sends them the images of the pages to come, in manifest order, a few
 *     per encoder ahead (a bounded queue: memory stays flat), takes the rows
 *     back as they come, and waits only when the scheduler needs rows not yet
 *     encoded. Encoders work while the pipeline decodes. The head encodes
 *     an image itself when the scheduler needs one no encoder was asked
 *     for: the first page's (kept for it, so the first prefill does not
 *     wait for an encoder's warm-up and first encode), or a page reached
 *     before the queue ahead did.
 *
 * At load (pages_opts.image_rows) each image's rows are counted from its
 * header alone (mtmd's preprocessing of a placeholder of the same size, on
 * the head's encoder: opened once per run, before rank_agree_work, which
 * loads the manifest too; each size is counted once, pageimg_count), so the
 * scheduler plans the page without decoding it. Encodings wait in a small cache (one entry per stream that
 * may be prefilling, plus the queue ahead) until their prefill is done. A
 * checkpoint holds no image rows: a resumed job encodes only the pages it
 * had not finished. */
#ifndef PD_RUNTIME_PAGEIMG_H
#define PD_RUNTIME_PAGEIMG_H

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "cluster/format/pages.h"
#include "cluster/model/model.h"

typedef struct pageimg pageimg;

/* Where the encoders are: n ranks of world from rank first on (n = 0: the
 * head encodes). */
typedef struct pageimg_encoders {
    MPI_Comm world;
    int first, n;
} pageimg_encoders;

/* MPI tags of the encoder messages on world. */
#define PAGEIMG_TAG_REQUEST 0x5049
#define PAGEIMG_TAG_REPLY 0x504A
#define PAGEIMG_TAG_PLACEMENT 0x504B

/* Opens the encoder (mmproj against the decoder at model_path, threads
 * encoder threads): once per run, on the head, before the work-mix
 * agreement (rank_agree_work counts image rows with it), then handed to
 * head_open. pageimg_count works from here on; the rest needs
 * pageimg_reserve first. Returns owned in *out, free with pageimg_free. */
pd_status pageimg_open(const char *mmproj, const char *model_path, uint32_t threads,
                       const pageimg_encoders *enc, pageimg **out, pd_err *err);

/* Room for `streams` images being read (the run's max_streams, known once
 * the rank started). Once, before pageimg_plan and pageimg_read. */
pd_status pageimg_reserve(pageimg *pi, uint32_t streams, pd_err *err);

void pageimg_free(pageimg *pi);

/* pages_opts.image_rows: the rows the image at path becomes. ctx: pageimg.
 * From its header's size: each size is counted by the encoder once per run
 * (the rows depend on nothing else), so loading the manifest twice (the
 * work-mix agreement, head_open) or many pages of one size cost one count. */
pd_status pageimg_count(void *ctx, const char *path, uint32_t *rows, pd_err *err);

/* The row counts pageimg_count ran the encoder's preprocessing for so far:
 * the distinct image sizes it met. */
uint64_t pageimg_counted(const pageimg *pi);

/* The images to come, in the order the scheduler admits pages (manifest
 * order, pages with skip[i] set left out): what encoder ranks work ahead on.
 * A later call replaces the plan; only before the first pageimg_pump. */
pd_status pageimg_plan(pageimg *pi, const pages *pg, const bool *skip, pd_err *err);

/* Encoder ranks: sends requests while there is room, takes finished replies
 * (never blocks). The head calls it once per loop turn. No-op without them. */
pd_status pageimg_pump(pageimg *pi, pd_err *err);

/* Encoder ranks: waits for every outstanding reply and tells each encoder to
 * stop. Call once, after the last micro-batch. No-op without them. */
pd_status pageimg_finish(pageimg *pi, pd_err *err);

/* Tells each encoder rank of enc to stop (request id `id`): what
 * pageimg_finish ends with, and what a head that ends before it (a start-up
 * failure: nothing decoded) sends, so the encoders return and the launch
 * ends instead of waiting in MPI_Finalize for them. */
pd_status pageimg_stop(const pageimg_encoders *enc, uint64_t id, pd_err *err);

/* sched_config.ready (sched.h): whether every image of `page` is encoded
 * (always, without encoder ranks: the head encodes when it reads). The
 * scheduler admits a page whose images are still on an encoder only when
 * nothing else decodes, so the head decodes instead of waiting. */
bool pageimg_ready(void *ctx, size_t page);

/* sched_config.image (sched.h). ctx: pageimg. */
pd_status pageimg_read(void *ctx, size_t page, uint32_t seg, const char *path, uint32_t seg_rows,
                       const model *em, uint32_t off, uint32_t n, float *dst, pd_err *err);

/* Images encoded for this run so far (here or on encoder ranks). */
uint64_t pageimg_encoded(const pageimg *pi);

/* Encoder ranks: wall seconds the head waited for an image's rows (the
 * scheduler needed them and they had not come: nothing else to decode, or
 * the run's end), and how many times (*waits, may be NULL). 0 without. */
double pageimg_wait_s(const pageimg *pi, uint64_t *waits);

/* Wall seconds the head spent encoding images itself, and how many (*n,
 * may be NULL): with encoder ranks the first page's and pages reached
 * before the queue; without them, every image. */
double pageimg_encoded_head(const pageimg *pi, uint64_t *n);

/* Encoder ranks: each one's placement record (what pageimg_serve was
 * given: len bytes), received into all[k * len] for encoder k, in encoder
 * order. Once, on the head, before the first pageimg_pump. No-op without
 * encoder ranks. */
pd_status pageimg_placements(pageimg *pi, void *all, size_t len, pd_err *err);

/* Encoder ranks beside the head's pipeline (0 without). */
int pageimg_encoder_count(const pageimg *pi);

/* An encoder rank's whole life (run --encoder-ranks): sends the head at rank
 * `head` of world its placement record (placement[placement_len], for the head's
 * report: pageimg_placements), opens the encoder, encodes what the head
 * asks, in order, and returns when it says stop. A page whose image fails is
 * answered with the error (the page fails alone); only a malformed request
 * or an MPI failure ends it. */
pd_status pageimg_serve(const char *mmproj, const char *model_path, uint32_t threads, MPI_Comm world,
                        int head, const void *placement, size_t placement_len, pd_err *err);

#endif
