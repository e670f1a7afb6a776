/* image: page image headers are read exactly and every bad header is refused
 * from its bytes alone, naming the file and the offset. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cluster/format/image.h"
#include "pd_test.h"

static uint32_t crc32_ref(const uint8_t *p, size_t n)
{
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int k = 0; k < 8; k++)
            c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
    }
    return ~c;
}

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* The first 33 bytes of a PNG: signature and IHDR with its CRC. */
static void png_head(uint8_t b[33], uint32_t w, uint32_t h, uint8_t depth, uint8_t colour)
{
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', 0x0D, 0x0A, 0x1A, 0x0A};
    memcpy(b, sig, 8);
    put_be32(b + 8, 13);
    memcpy(b + 12, "IHDR", 4);
    put_be32(b + 16, w);
    put_be32(b + 20, h);
    b[24] = depth;
    b[25] = colour;
    b[26] = b[27] = b[28] = 0;
    put_be32(b + 29, crc32_ref(b + 12, 17));
}

static size_t jpeg_head(uint8_t *b, size_t app_len, uint16_t w, uint16_t h)
{
    size_t o = 0;
    b[o++] = 0xFF, b[o++] = 0xD8;
    b[o++] = 0xFF, b[o++] = 0xE0; /* APP0 of app_len bytes (length counts itself) */
    b[o++] = (uint8_t)(app_len >> 8), b[o++] = (uint8_t)app_len;
    memset(b + o, 'J', app_len - 2);
    o += app_len - 2;
    b[o++] = 0xFF, b[o++] = 0xFF; /* a fill byte before the marker */
    b[o++] = 0xC0;
    b[o++] = 0, b[o++] = 17, b[o++] = 8;
    b[o++] = (uint8_t)(h >> 8), b[o++] = (uint8_t)h;
    b[o++] = (uint8_t)(w >> 8), b[o++] = (uint8_t)w;
    b[o++] = 3;
    memset(b + o, 0x11, 9);
    o += 9;
    return o;
}

START_TEST(image_reads_png_jpeg_and_ppm_headers)
{
    uint8_t b[200];
    image_info in;
    pd_err err = {0};
    png_head(b, 1240, 1754, 8, 2);
    ck_assert_msg(image_parse_header(b, 33, 5000, "a.png", &in, NULL, &err) == PD_OK, "%s", err.msg);
    ck_assert_int_eq(in.kind, IMAGE_PNG);
    ck_assert_uint_eq(in.width, 1240);
    ck_assert_uint_eq(in.height, 1754);
    ck_assert_uint_eq(in.file_size, 5000);
    size_t n = jpeg_head(b, 20, 640, 480);
    ck_assert_msg(image_parse_header(b, n, n + 100, "a.jpg", &in, NULL, &err) == PD_OK, "%s", err.msg);
    ck_assert_int_eq(in.kind, IMAGE_JPEG);
    ck_assert_uint_eq(in.width, 640);
    ck_assert_uint_eq(in.height, 480);
    const char *ppm = "P6\n# scanner 7\n 3 2\n255\n";
    size_t pl = strlen(ppm);
    memcpy(b, ppm, pl);
    memset(b + pl, 0x80, 18);
    ck_assert_msg(image_parse_header(b, pl + 18, pl + 18, "a.ppm", &in, NULL, &err) == PD_OK, "%s",
                  err.msg);
    ck_assert_int_eq(in.kind, IMAGE_PPM);
    ck_assert_uint_eq(in.width, 3);
    ck_assert_uint_eq(in.height, 2);
    ck_assert_str_eq(image_kind_name(IMAGE_JPEG), "jpeg");
}
END_TEST

START_TEST(image_refuses_bad_headers_naming_file_and_offset)
{
    uint8_t b[64];
    image_info in = {0};
    pd_err err = {0};
    static const struct {
        int kind; /* 0 png with w,h,depth,colour; 1 raw bytes */
        uint32_t w, h;
        uint8_t depth, colour;
        const char *raw;
        size_t raw_len; /* 0: strlen(raw) */
        pd_status st;
        const char *msg;
    } cases[] = {
        {0, 60000, 60000, 8, 2, NULL, 0, PD_ERR_RANGE,
         "x: offset 16: width 60000 x height 60000 exceeds the page limit of 67108864 pixels "
         "(16384 per side)"},
        {0, 16384, 4097, 8, 2, NULL, 0, PD_ERR_RANGE,
         "x: offset 16: width 16384 x height 4097 exceeds the page limit of 67108864 pixels "
         "(16384 per side)"},
        {0, 0, 10, 8, 2, NULL, 0, PD_ERR_FORMAT, "x: offset 16: width 0 x height 10 is empty"},
        {0, 10, 10, 3, 2, NULL, 0, PD_ERR_FORMAT,
         "x: offset 24: PNG bit depth 3 with colour type 2 is not a valid combination"},
        {0, 10, 10, 8, 5, NULL, 0, PD_ERR_FORMAT,
         "x: offset 24: PNG bit depth 8 with colour type 5 is not a valid combination"},
        {1, 0, 0, 0, 0, "GIF89a....", 10, PD_ERR_FORMAT,
         "x: offset 0: not a PNG, JPEG or PPM image (starts with 47 49 46 38 39 61 2e 2e)"},
        {1, 0, 0, 0, 0, "P6 12 x", 7, PD_ERR_FORMAT, "x: offset 6: PPM height is not a decimal number"},
        {1, 0, 0, 0, 0, "P5 4 4 0 ", 9, PD_ERR_FORMAT, "x: offset 7: PPM maxval 0 (1..65535)"},
        {1, 0, 0, 0, 0, "P5 4 4 255 ab", 13, PD_ERR_TRUNCATED,
         "x: offset 13: PPM raster of 4 x 4 needs 16 bytes, the file ends after 2"},
        {1, 0, 0, 0, 0, "P5 99999999999 4 255 ", 21, PD_ERR_RANGE, "x: offset 3: PPM width exceeds 2147483647"},
        {1, 0, 0, 0, 0, "\xFF\xD8\xFF\xDA\x00\x08", 6, PD_ERR_FORMAT,
         "x: offset 2: JPEG marker 0xDA before any frame header (SOF)"},
        {1, 0, 0, 0, 0, "\xFF\xD8\xFF\xE0\x00\x01", 6, PD_ERR_FORMAT,
         "x: offset 4: JPEG segment length 1 (at least 2)"},
        {1, 0, 0, 0, 0, "\xFF\xD8\xFF\xE0\x10\x00", 6, PD_ERR_TRUNCATED,
         "x: offset 2: JPEG segment 0xE0 of 4096 bytes runs past the end of the file (6)"},
        {1, 0, 0, 0, 0, "\xFF\xD8\xFF\xC0\x00\x11\x08\x00\x00\x01\x00", 11, PD_ERR_FORMAT,
         "x: offset 7: width 256 x height 0 is empty"},
        {1, 0, 0, 0, 0, "\xFF\xD8\x12\x34", 4, PD_ERR_FORMAT,
         "x: offset 2: expected a JPEG marker (0xFF), found 0x12"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t n;
        if (cases[i].kind == 0) {
            png_head(b, cases[i].w, cases[i].h, cases[i].depth, cases[i].colour);
            n = 33;
        } else {
            n = cases[i].raw_len;
            memcpy(b, cases[i].raw, n);
        }
        pd_err_clear(&err);
        pd_status got = image_parse_header(b, n, n, "x", &in, NULL, &err);
        ck_assert_msg(got == cases[i].st, "case %zu: status %d, want %d: %s", i, got, cases[i].st, err.msg);
        ck_assert_str_eq(err.msg, cases[i].msg);
    }
    /* a flipped bit in the IHDR chunk is caught by its CRC */
    png_head(b, 100, 100, 8, 2);
    b[18] ^= 0x04;
    pd_err_clear(&err);
    ck_assert_int_eq(image_parse_header(b, 33, 33, "x", &in, NULL, &err), PD_ERR_CHECKSUM);
    ck_assert_ptr_nonnull(strstr(err.msg, "x: offset 29: IHDR CRC"));
    pd_err_clear(&err);
    ck_assert_int_eq(image_parse_header(b, 0, 0, "x", &in, NULL, &err), PD_ERR_FORMAT);
    ck_assert_str_eq(err.msg, "x: empty file (0 bytes), not an image");
}
END_TEST

/* Every prefix of a valid header is refused (never read past), and every
 * single-bit flip is either refused or read as some image within the limits. */
START_TEST(image_every_truncation_and_bit_flip_is_safe)
{
    uint8_t good[3][200];
    size_t len[3], need[3]; /* need: the bytes the header takes */
    png_head(good[0], 800, 600, 8, 6);
    len[0] = 33;
    len[1] = jpeg_head(good[1], 30, 1024, 768);
    const char *ppm = "P5 4 3 255\n";
    memcpy(good[2], ppm, strlen(ppm));
    memset(good[2] + strlen(ppm), 7, 12);
    len[2] = strlen(ppm) + 12;
    need[0] = 33;
    need[1] = len[1] - 10; /* the frame header's component table is not read */
    need[2] = len[2];      /* a PPM's raster must be all there */
    for (int k = 0; k < 3; k++) {
        for (size_t cut = 0; cut < need[k]; cut++) {
            uint8_t *b = malloc(cut ? cut : 1);
            memcpy(b, good[k], cut);
            image_info in;
            pd_err err = {0};
            ck_assert_int_ne(image_parse_header(b, cut, cut, "t", &in, NULL, &err), PD_OK);
            ck_assert_ptr_nonnull(strstr(err.msg, "t"));
            free(b);
        }
        for (size_t bit = 0; bit < len[k] * 8; bit++) {
            uint8_t b[200];
            memcpy(b, good[k], len[k]);
            b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
            image_info in = {0};
            pd_err err = {0};
            if (image_parse_header(b, len[k], len[k], "t", &in, NULL, &err) == PD_OK) {
                ck_assert_uint_le(in.width, IMAGE_MAX_SIDE);
                ck_assert_uint_le(in.height, IMAGE_MAX_SIDE);
                ck_assert_uint_le((uint64_t)in.width * in.height, IMAGE_MAX_PIXELS);
                ck_assert_uint_ge(in.width, 1);
            } else {
                ck_assert_uint_gt(strlen(err.msg), 0);
            }
        }
    }
}
END_TEST

/* image_probe follows a JPEG's metadata to a frame header far into the file. */
START_TEST(image_probe_reads_files_and_follows_large_jpeg_metadata)
{
    char dir[128], path[256];
    pd_test_tmpdir(dir, sizeof dir, "image");
    snprintf(path, sizeof path, "%s/big.jpg", dir);
    uint8_t *b = malloc(70000);
    size_t n = jpeg_head(b, 60000, 1700, 2200);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
    image_info in;
    pd_err err = {0};
    ck_assert_msg(image_probe(path, &in, &err) == PD_OK, "%s", err.msg);
    ck_assert_uint_eq(in.width, 1700);
    ck_assert_uint_eq(in.height, 2200);
    /* the same file cut inside the metadata */
    f = fopen(path, "wb");
    ck_assert_uint_eq(fwrite(b, 1, 5000, f), 5000);
    fclose(f);
    pd_err_clear(&err);
    ck_assert_int_eq(image_probe(path, &in, &err), PD_ERR_TRUNCATED);
    ck_assert_ptr_nonnull(strstr(err.msg, "runs past the end of the file (5000)"));
    snprintf(path, sizeof path, "%s/none.png", dir);
    pd_err_clear(&err);
    ck_assert_int_eq(image_probe(path, &in, &err), PD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "none.png: cannot open"));
    free(b);
    pd_test_rmtree(dir);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("image");
    TCase *tc = tcase_create("image");
    tcase_add_test(tc, image_reads_png_jpeg_and_ppm_headers);
    tcase_add_test(tc, image_refuses_bad_headers_naming_file_and_offset);
    tcase_add_test(tc, image_every_truncation_and_bit_flip_is_safe);
    tcase_add_test(tc, image_probe_reads_files_and_follows_large_jpeg_metadata);
    suite_add_tcase(s, tc);
    return s;
}
