/* image: what a page image file is, read from its header alone.
 *
 * A page's {"image": "scan.png"} segment names a PNG, JPEG or PPM/PGM (binary
 * netpbm) file. The pixels are decoded by the vision encoder's own decoder
 * (llama.cpp's mtmd, cluster/vision/venc.h) so that a page reads exactly as
 * llama-mtmd-cli reads it; this module only decides, before anything decodes
 * or allocates, whether the bytes are an image of a supported kind and of a
 * size a page may have. That is what lets a PNG whose header claims
 * 60000 x 60000 pixels be refused from 33 bytes instead of a 10 GB allocation.
 *
 * Layouts read (all offsets in bytes from the start of the file):
 *   PNG   8-byte signature 89 50 4E 47 0D 0A 1A 0A, then the IHDR chunk:
 *         length u32be == 13 at 8, "IHDR" at 12, width u32be at 16,
 *         height u32be at 20, bit depth at 24, colour type at 25
 *   JPEG  FF D8, then marker segments (FF xx, length u16be counting itself)
 *         up to the first start-of-frame SOF0..SOF15 other than DHT (C4),
 *         JPG (C8) and DAC (CC): precision at +4, height u16be at +5, width
 *         u16be at +7 of the marker
 *   PPM   "P6" (RGB) or "P5" (grey), whitespace and '#' comments, width,
 *         height, maxval (1..65535), one whitespace byte, then the raster
 * Errors name the file and the offset or field:
 *   "scan.png: offset 16: width 60000 x height 60000 exceeds the page limit
 *    of 67108864 pixels (16384 per side)". */
#ifndef PD_IMAGE_H
#define PD_IMAGE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* Largest side and pixel count a page image may have: an A4 page scanned at
 * 600 dpi is 4960 x 7016 (35 Mpx); anything past these is a corrupt header or
 * not a page. */
#define IMAGE_MAX_SIDE 16384u
#define IMAGE_MAX_PIXELS (1u << 26)

/* Bytes of a file image_probe reads: enough for every header above except a
 * JPEG whose frame header sits behind large metadata (EXIF thumbnails), which
 * image_probe follows by seeking. */
#define IMAGE_HEAD_BYTES 4096u

typedef enum image_kind { IMAGE_PNG, IMAGE_JPEG, IMAGE_PPM, IMAGE_KIND_COUNT } image_kind;

typedef struct image_info {
    image_kind kind;
    uint32_t width;
    uint32_t height;
    uint64_t file_size;
} image_info;

/* Short name of a kind ("png"); never NULL. */
const char *image_kind_name(image_kind k);

/* Parses the header of an image held in memory: buf holds the first len bytes
 * of a file of file_size bytes (all of it, or at least what the header needs;
 * a JPEG's frame header may lie further: then PD_ERR_TRUNCATED with *need set
 * to the bytes needed, when need is not NULL). name is used only in messages.
 * Pure function of its arguments (fuzzable); *out is written only on PD_OK. */
pd_status image_parse_header(const void *buf, size_t len, uint64_t file_size, const char *name,
                             image_info *out, size_t *need, pd_err *err);

/* Opens path (a regular file), reads its header and validates it. */
pd_status image_probe(const char *path, image_info *out, pd_err *err);

#endif
