/* venc: page images to prefill rows, with llama.cpp's mtmd library.
 *
 * DeepSeek-OCR reads a page through its vision encoder (SAM-B + CLIP-L + a
 * projector) stored in an mmproj GGUF file that llama.cpp's mtmd library runs.
 * pipedec does not reimplement it: an image segment of a page becomes exactly
 * what llama-mtmd-cli feeds its decoder for the same image, because the same
 * library decodes the file (its stb_image), preprocesses it (the projector's
 * resize/pad and tiling), encodes it and places the text it puts around the
 * image rows (for DeepSeek-OCR a "\n" after them; view separators and
 * image-newline rows are rows of the encoder's output). The decoder-side
 * model is opened vocabulary-only, for the ids of that text; the decoder's
 * weights are loaded by pipedec's ranks only.
 *
 * An image becomes a list of pieces in prefill order, each either text token
 * ids or image rows of the decoder's hidden width; positions follow one per
 * row (projectors with M-RoPE positions are refused at open).
 *
 * pipedec builds without llama.cpp: then venc_available() is false and
 * venc_open refuses with PD_ERR_UNSUPPORTED saying how to build with it.
 *
 * Determinism: the rows depend on the image, the mmproj and the encoder's
 * thread count only through mtmd; tests/anchor/mtmd_pages.sh checks that 1
 * and 2 threads give the same bytes. Not thread-safe: one venc per thread. */
#ifndef PD_VENC_H
#define PD_VENC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

typedef struct venc venc;

typedef struct venc_opts {
    const char *mmproj; /* the vision projector GGUF (clip.* keys) */
    const char *model;  /* the decoder GGUF, read vocabulary-only */
    int threads;        /* encoder threads (>= 1) */
    bool warmup;        /* run one encode of a blank image at open, as llama-mtmd-cli does, so
                         * the first page does not pay for building the graph (an encoder that
                         * only counts rows skips it) */
} venc_opts;

/* One piece of an image's prefill.
 * INV: n >= 1; image ? rows != NULL (n x width floats, all finite)
 *                     : tokens != NULL (n ids of the model's vocabulary);
 *      rows == NULL in a count-only result. */
typedef struct venc_piece {
    bool image;
    uint32_t n;
    int32_t *tokens;
    float *rows;
} venc_piece;

typedef struct venc_out {
    size_t n_pieces;
    venc_piece *pieces;
    uint64_t rows; /* sum of pieces[].n */
} venc_out;

/* True when this build has llama.cpp's mtmd. */
bool venc_available(void);

/* A line naming the llama.cpp build pipedec uses, or why there is none. */
const char *venc_describe(void);

/* Opens the encoder. Refuses an mmproj without vision, one whose output width
 * differs from the model's embedding width (naming both), one that needs
 * M-RoPE positions, and files mtmd cannot read (with mtmd's own message). */
pd_status venc_open(const venc_opts *o, venc **out, pd_err *err);

void venc_close(venc *v);

/* The width of the rows (the decoder's hidden size). */
uint32_t venc_width(const venc *v);

/* Encodes the image file at path (PNG, JPEG, PPM; its header checked by
 * image_probe first, so a huge or corrupt header is refused before anything
 * decodes). count_only: only the piece sizes, from the header's dimensions,
 * without decoding or encoding (what a scheduler needs to plan a page). On
 * PD_OK *out is owned by the caller (venc_out_free); on failure it is empty
 * and err names the file and the cause. */
pd_status venc_image(venc *v, const char *path, bool count_only, venc_out *out, pd_err *err);

void venc_out_free(venc_out *out);

/* Time spent in the encoder graph (mtmd_encode_chunk, wall seconds) and
 * images encoded by this venc so far; the rest of venc_image (reading,
 * decoding, preprocessing) is the caller's wall time minus this. */
void venc_stats(const venc *v, double *encode_s, uint64_t *images);

/* ---- the encoder-rank messages (run --encoder-ranks, loop/pageimg.h) ------
 * Little-endian, read through comm/rd.h (every count checked against the
 * bytes that remain):
 *   request  u32 magic "PDIQ", u32 kind (1 encode, 2 stop), u64 id,
 *            u32 path length P (1..4096), P bytes of path (no NUL)
 *   reply    u32 magic "PDIR", u64 id, u32 status (0 = encoded, else a
 *            pd_status), u32 message length M (<= 511), M bytes; when
 *            encoded: u32 width W, u32 pieces K (1..4096), and K times
 *            u8 kind (0 text, 1 image), u32 n (>= 1), then n i32 ids or
 *            n x W f32 rows (finite) */
#define VENC_MSG_ENCODE 1u
#define VENC_MSG_STOP 2u
#define VENC_MAX_PATH 4096u
#define VENC_MAX_PIECES 4096u

/* Writes a request (kind, id, path) into a new buffer (*buf owned, free()). */
pd_status venc_msg_request(uint32_t kind, uint64_t id, const char *path, uint8_t **buf, size_t *len,
                           pd_err *err);
/* Parses a request; *path points into buf (not NUL-terminated: *path_len). */
pd_status venc_msg_parse_request(const void *buf, size_t len, uint32_t *kind, uint64_t *id,
                                 const char **path, size_t *path_len, pd_err *err);
/* Writes a reply: out and width when st == PD_OK, else the message msg. */
pd_status venc_msg_reply(uint64_t id, pd_status st, const char *msg, const venc_out *out,
                         uint32_t width, uint8_t **buf, size_t *len, pd_err *err);
/* Parses a reply for rows of width `width`: *id, and either *out (PD_OK,
 * owned by the caller) or the encoder's status and message in *enc_err (the
 * return value is then PD_OK too: the message was well formed). A malformed
 * message returns its own status with the offset and field. */
pd_status venc_msg_parse_reply(const void *buf, size_t len, uint32_t width, uint64_t *id,
                               venc_out *out, pd_err *enc_err, pd_err *err);

#endif
