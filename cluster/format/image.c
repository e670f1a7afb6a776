/* image: page image headers (see image.h for the layouts read). */
#include "cluster/format/image.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"

const char *image_kind_name(image_kind k)
{
    static const char *const names[IMAGE_KIND_COUNT] = {"png", "jpeg", "ppm"};
    return (unsigned)k < IMAGE_KIND_COUNT ? names[k] : "?";
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint32_t be16(const uint8_t *p)
{
    return (uint32_t)p[0] << 8 | p[1];
}

/* zlib's CRC-32 (PNG chunks), bit by bit: it covers 17 bytes per file. */
static uint32_t png_crc(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xFFFFFFFFu;
}

/* The size checks every kind shares; off is where the width field starts. */
static pd_status image_size_ok(const char *name, size_t off, uint32_t w, uint32_t h, pd_err *err)
{
    if (w == 0 || h == 0)
        return pd_err_set(err, PD_ERR_FORMAT, "%s: offset %zu: width %" PRIu32 " x height %" PRIu32
                          " is empty", name, off, w, h);
    if (w > IMAGE_MAX_SIDE || h > IMAGE_MAX_SIDE || (uint64_t)w * h > IMAGE_MAX_PIXELS)
        return pd_err_set(err, PD_ERR_RANGE,
                          "%s: offset %zu: width %" PRIu32 " x height %" PRIu32
                          " exceeds the page limit of %u pixels (%u per side)", name, off, w, h,
                          IMAGE_MAX_PIXELS, IMAGE_MAX_SIDE);
    return PD_OK;
}

static pd_status png_header(const uint8_t *b, size_t len, const char *name, image_info *out,
                            pd_err *err)
{
    if (len < 33)
        return pd_err_set(err, PD_ERR_TRUNCATED, "%s: offset %zu: PNG ends inside its IHDR chunk "
                          "(needs 33 bytes)", name, len);
    if (be32(b + 8) != 13 || memcmp(b + 12, "IHDR", 4))
        return pd_err_set(err, PD_ERR_FORMAT, "%s: offset 8: PNG does not start with a 13-byte "
                          "IHDR chunk", name);
    uint32_t crc = be32(b + 29), want = png_crc(b + 12, 17);
    if (crc != want)
        return pd_err_set(err, PD_ERR_CHECKSUM, "%s: offset 29: IHDR CRC 0x%08" PRIx32
                          " does not match its bytes (0x%08" PRIx32 ")", name, crc, want);
    static const uint8_t depth_ok[7] = {
        [0] = 1 | 2 | 4 | 8 | 16, [2] = 8 | 16, [3] = 1 | 2 | 4 | 8, [4] = 8 | 16, [6] = 8 | 16};
    uint8_t depth = b[24], colour = b[25];
    if (colour > 6 || !depth_ok[colour] || depth > 16 || !(depth_ok[colour] & depth) ||
        (depth & (depth - 1)))
        return pd_err_set(err, PD_ERR_FORMAT, "%s: offset 24: PNG bit depth %u with colour type "
                          "%u is not a valid combination", name, depth, colour);
    pd_status st = image_size_ok(name, 16, be32(b + 16), be32(b + 20), err);
    if (st == PD_OK)
        *out = (image_info){.kind = IMAGE_PNG, .width = be32(b + 16), .height = be32(b + 20)};
    return st;
}

static pd_status jpeg_header(const uint8_t *b, size_t len, uint64_t file_size, const char *name,
                             image_info *out, size_t *need, pd_err *err)
{
    uint64_t off = 2;
    for (;;) {
        /* a marker: one or more 0xFF fill bytes, then its code */
        while (off < len && b[off] == 0xFF && off + 1 < len && b[off + 1] == 0xFF)
            off++;
        if (off < len && b[off] != 0xFF)
            return pd_err_set(err, PD_ERR_FORMAT, "%s: offset %" PRIu64 ": expected a JPEG marker "
                              "(0xFF), found 0x%02X", name, off, b[off]);
        if (off + 4 > len) {
            if (off + 4 > file_size)
                return pd_err_set(err, PD_ERR_TRUNCATED, "%s: offset %" PRIu64 ": JPEG ends "
                                  "before its frame header (SOF)", name, off);
            if (need)
                *need = (size_t)(off + 4);
            return pd_err_set(err, PD_ERR_TRUNCATED, "%s: offset %" PRIu64 ": needs more bytes",
                              name, off);
        }
        uint8_t m = b[off + 1];
        if (m == 0x01 || (m >= 0xD0 && m <= 0xD7)) { /* TEM, RSTn: no length */
            off += 2;
            continue;
        }
        if (m == 0xD8 || m == 0xD9 || m == 0xDA || m == 0x00)
            return pd_err_set(err, PD_ERR_FORMAT, "%s: offset %" PRIu64 ": JPEG marker 0x%02X "
                              "before any frame header (SOF)", name, off, m);
        uint32_t seg = be16(b + off + 2);
        if (seg < 2)
            return pd_err_set(err, PD_ERR_FORMAT, "%s: offset %" PRIu64 ": JPEG segment length %"
                              PRIu32 " (at least 2)", name, off + 2, seg);
        bool sof = m >= 0xC0 && m <= 0xCF && m != 0xC4 && m != 0xC8 && m != 0xCC;
        if (sof) {
            if (seg < 8)
                return pd_err_set(err, PD_ERR_FORMAT, "%s: offset %" PRIu64 ": JPEG frame header "
                                  "of %" PRIu32 " bytes (at least 8)", name, off + 2, seg);
            if (off + 9 > len) {
                if (off + 9 > file_size)
                    return pd_err_set(err, PD_ERR_TRUNCATED, "%s: offset %" PRIu64 ": JPEG ends "
                                      "inside its frame header", name, len < file_size ? len : file_size);
                if (need)
                    *need = (size_t)(off + 9);
                return pd_err_set(err, PD_ERR_TRUNCATED, "%s: offset %" PRIu64 ": needs more bytes",
                                  name, off);
            }
            uint32_t h = be16(b + off + 5), w = be16(b + off + 7);
            pd_status st = image_size_ok(name, (size_t)off + 5, w, h, err);
            if (st == PD_OK)
                *out = (image_info){.kind = IMAGE_JPEG, .width = w, .height = h};
            return st;
        }
        uint64_t at = off;
        off += 2 + (uint64_t)seg;
        if (off > file_size)
            return pd_err_set(err, PD_ERR_TRUNCATED, "%s: offset %" PRIu64 ": JPEG segment 0x%02X "
                              "of %" PRIu32 " bytes runs past the end of the file (%" PRIu64 ")",
                              name, at, m, seg, file_size);
    }
}

/* One decimal field of a netpbm header after whitespace and comments. */
static pd_status ppm_field(const uint8_t *b, size_t len, size_t *off, const char *name,
                           const char *field, uint32_t max, uint32_t *v, pd_err *err)
{
    for (;;) {
        while (*off < len && (b[*off] == ' ' || b[*off] == '\t' || b[*off] == '\n' ||
                              b[*off] == '\r' || b[*off] == '\v' || b[*off] == '\f'))
            (*off)++;
        if (*off < len && b[*off] == '#') {
            while (*off < len && b[*off] != '\n')
                (*off)++;
            continue;
        }
        break;
    }
    if (*off >= len)
        return pd_err_set(err, PD_ERR_TRUNCATED, "%s: offset %zu: PPM header ends before its %s",
                          name, *off, field);
    if (b[*off] < '0' || b[*off] > '9')
        return pd_err_set(err, PD_ERR_FORMAT, "%s: offset %zu: PPM %s is not a decimal number",
                          name, *off, field);
    size_t at = *off;
    uint64_t x = 0;
    while (*off < len && b[*off] >= '0' && b[*off] <= '9') {
        x = x * 10 + (uint64_t)(b[*off] - '0');
        if (x > max)
            return pd_err_set(err, PD_ERR_RANGE, "%s: offset %zu: PPM %s exceeds %" PRIu32, name,
                              at, field, max);
        (*off)++;
    }
    *v = (uint32_t)x;
    return PD_OK;
}

static pd_status ppm_header(const uint8_t *b, size_t len, uint64_t file_size, const char *name,
                            image_info *out, pd_err *err)
{
    size_t off = 2;
    uint32_t w = 0, h = 0, maxval = 0;
    pd_status st;
    if ((st = ppm_field(b, len, &off, name, "width", UINT32_MAX / 2, &w, err)) != PD_OK)
        return st;
    size_t wat = off;
    if ((st = ppm_field(b, len, &off, name, "height", UINT32_MAX / 2, &h, err)) != PD_OK ||
        (st = ppm_field(b, len, &off, name, "maxval", 65535, &maxval, err)) != PD_OK)
        return st;
    if (maxval == 0)
        return pd_err_set(err, PD_ERR_FORMAT, "%s: offset %zu: PPM maxval 0 (1..65535)", name, off - 1);
    if (off >= len)
        return pd_err_set(err, PD_ERR_TRUNCATED, "%s: offset %zu: PPM header ends before the raster",
                          name, off);
    if ((st = image_size_ok(name, wat, w, h, err)) != PD_OK)
        return st;
    uint64_t raster = (uint64_t)w * h * (b[1] == '6' ? 3u : 1u) * (maxval > 255 ? 2u : 1u);
    if (off + 1 + raster > file_size)
        return pd_err_set(err, PD_ERR_TRUNCATED, "%s: offset %" PRIu64 ": PPM raster of %" PRIu32
                          " x %" PRIu32 " needs %" PRIu64 " bytes, the file ends after %" PRIu64,
                          name, file_size, w, h, raster, file_size - (off + 1 > file_size ? file_size : off + 1));
    *out = (image_info){.kind = IMAGE_PPM, .width = w, .height = h};
    return PD_OK;
}

pd_status image_parse_header(const void *buf, size_t len, uint64_t file_size, const char *name,
                             image_info *out, size_t *need, pd_err *err)
{
    const uint8_t *b = buf;
    if (!name)
        name = "image";
    if (!b && len)
        return pd_err_set(err, PD_ERR_ARG, "%s: NULL buffer", name);
    if (len > file_size)
        return pd_err_set(err, PD_ERR_ARG, "%s: %zu bytes held of a %" PRIu64 "-byte file", name,
                          len, file_size);
    if (file_size == 0)
        return pd_err_set(err, PD_ERR_FORMAT, "%s: empty file (0 bytes), not an image", name);
    image_info info = {0};
    pd_status st;
    static const uint8_t png_sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
    if (len >= 8 && !memcmp(b, png_sig, 8))
        st = png_header(b, len, name, &info, err);
    else if (len >= 2 && b[0] == 0xFF && b[1] == 0xD8)
        st = jpeg_header(b, len, file_size, name, &info, need, err);
    else if (len >= 2 && b[0] == 'P' && (b[1] == '5' || b[1] == '6'))
        st = ppm_header(b, len, file_size, name, &info, err);
    else if (len < 8 && file_size < 8)
        return pd_err_set(err, PD_ERR_TRUNCATED, "%s: %" PRIu64 " bytes: too short to be a PNG, "
                          "JPEG or PPM image", name, file_size);
    else {
        char hex[3 * 8 + 1] = "";
        for (size_t i = 0; i < len && i < 8; i++)
            snprintf(hex + 3 * i, sizeof hex - 3 * i, "%02x ", b[i]);
        hex[strlen(hex) ? strlen(hex) - 1 : 0] = '\0';
        return pd_err_set(err, PD_ERR_FORMAT, "%s: offset 0: not a PNG, JPEG or PPM image "
                          "(starts with %s)", name, hex);
    }
    if (st != PD_OK)
        return st;
    info.file_size = file_size;
    *out = info;
    return PD_OK;
}

/* The most image_probe reads to find a JPEG's frame header. */
#define IMAGE_PROBE_MAX (16u << 20)

pd_status image_probe(const char *path, image_info *out, pd_err *err)
{
    int fd;
    uint64_t size;
    pd_status st = pd_file_open_read(path, NULL, &fd, &size, err);
    if (st != PD_OK)
        return st;
    size_t cap = size < IMAGE_HEAD_BYTES ? (size_t)size : IMAGE_HEAD_BYTES;
    uint8_t *b = malloc(cap ? cap : 1);
    if (!b) {
        close(fd);
        return pd_err_set(err, PD_ERR_NOMEM, "image: %s: no memory", path);
    }
    for (;;) {
        if ((st = pd_file_read_at(fd, b, cap, 0, path, NULL, err)) != PD_OK)
            break;
        size_t need = 0;
        pd_err e = {0};
        st = image_parse_header(b, cap, size, path, out, &need, &e);
        if (st == PD_ERR_TRUNCATED && need > cap && need <= size && need <= IMAGE_PROBE_MAX) {
            size_t grow = need < 2 * (size_t)cap ? 2 * (size_t)cap : need;
            if (grow > size)
                grow = (size_t)size;
            uint8_t *nb = realloc(b, grow);
            if (!nb) {
                st = pd_err_set(err, PD_ERR_NOMEM, "image: %s: no memory", path);
                break;
            }
            b = nb;
            cap = grow;
            continue;
        }
        if (st != PD_OK)
            pd_err_set(err, st, "%s", e.msg);
        break;
    }
    free(b);
    close(fd);
    return st;
}
