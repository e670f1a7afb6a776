/* cmd_inspect: `pipedec inspect` tells records from bundles, describes them
 * (text and one JSON object), exits 0 / 1 / 2 for valid / invalid / unusable,
 * and names the first error's byte offset. */
#include "pd_test.h"

#include "cache/ring_layer.h"
#include "cluster/cli/cmd.h"
#include "comm/bundle.h"
#include "comm/crc32c.h"
#include "comm/wire.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <fcntl.h>
#include <unistd.h>

#define ID 0xabcdef0123456789ull

/* Output of one run. */
typedef struct run {
    int rc;
    char out[16384];
    char err[4096];
} run;

static void inspect(run *r, const char *a1, const char *a2, const char *a3)
{
    char *argv[5] = {"inspect", (char *)a1, (char *)a2, (char *)a3, NULL};
    int argc = 1 + (a1 != NULL) + (a1 && a2) + (a1 && a2 && a3);
    FILE *o = tmpfile(), *e = tmpfile();
    ck_assert_ptr_nonnull(o);
    ck_assert_ptr_nonnull(e);
    r->rc = cmd_inspect_run(argc, argv, o, e);
    pd_test_slurp(o, r->out, sizeof r->out);
    pd_test_slurp(e, r->err, sizeof r->err);
}

static void write_file(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    fclose(f);
}

static ring_layer *ring_with_rows(void)
{
    ring_layer_config cfg = {.n_kv_heads = 2, .head_dim = 4, .window = 3, .ref_capacity = 4};
    ring_layer *r = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ring_layer_new(&cfg, &r, &e), PD_OK);
    float k[4 * 8], v[4 * 8];
    pd_rng g = {.s = 1};
    pd_rng_fill(&g, k, 32, -1, 1);
    pd_rng_fill(&g, v, 32, -1, 1);
    ck_assert_int_eq(ring_layer_prefill(r, k, v, 2, &e), PD_OK);
    for (int i = 0; i < 4; i++)
        ck_assert_int_eq(ring_layer_write(r, k, v, NULL, &e), PD_OK);
    return r;
}

/* Writes the ring record to a temp file; returns its size. */
static size_t record_file(char *path, uint8_t **bytes)
{
    ring_layer *r = ring_with_rows();
    wire_layer_ref ref = {.identity = ID, .layer = 9, .ring = r};
    size_t n = 0;
    ck_assert_int_eq(wire_export(&ref, 0, bytes, &n, NULL), PD_OK);
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    write_file(path, *bytes, n);
    ring_layer_free(r);
    return n;
}

static cJSON *parse_json(const run *r)
{
    cJSON *j = cJSON_Parse(r->out);
    ck_assert_msg(j != NULL, "not JSON: %s", r->out);
    ck_assert_msg(strchr(r->out, '\n') == r->out + strlen(r->out) - 1, "one line: %s", r->out);
    return j;
}

START_TEST(inspect_valid_record_exits_zero_and_describes_it)
{
    char path[] = "/tmp/pd_inspect_XXXXXX";
    uint8_t *bytes = NULL;
    size_t n = record_file(path, &bytes);
    run r;
    inspect(&r, path, NULL, NULL);
    ck_assert_int_eq(r.rc, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "type: record\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "kind: ring (4)\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "layer: 9\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "identity: abcdef0123456789\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "position: 6\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "geometry: 2 kv heads x 4 channels\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "ring: window 3, len 3, pos 1, writes 4"));
    ck_assert_ptr_nonnull(strstr(r.out, "valid: yes\n"));
    ck_assert_str_eq(r.err, "");
    inspect(&r, path, "--json", NULL);
    ck_assert_int_eq(r.rc, 0);
    cJSON *j = parse_json(&r);
    ck_assert(cJSON_IsTrue(cJSON_GetObjectItem(j, "valid")));
    ck_assert_str_eq(cJSON_GetObjectItem(j, "kind")->valuestring, "ring");
    ck_assert_int_eq(cJSON_GetObjectItem(j, "layer")->valueint, 9);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "identity")->valuestring, "abcdef0123456789");
    ck_assert_int_eq(cJSON_GetObjectItem(j, "position")->valueint, 6);
    ck_assert_int_eq((int)cJSON_GetObjectItem(j, "bytes")->valuedouble, (int)n);
    ck_assert(cJSON_IsNull(cJSON_GetObjectItem(j, "error")));
    ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetObjectItem(j, "ring"), "writes")->valueint, 4);
    cJSON_Delete(j);
    unlink(path);
    free(bytes);
}
END_TEST

START_TEST(inspect_corrupt_record_exits_one_naming_the_offset)
{
    char path[] = "/tmp/pd_inspect_XXXXXX";
    uint8_t *bytes = NULL;
    size_t n = record_file(path, &bytes);
    bytes[32 + 16] = 9; /* ring_len beyond the window */
    write_file(path, bytes, n);
    run r;
    inspect(&r, "--json", path, NULL);
    ck_assert_int_eq(r.rc, 1);
    cJSON *j = parse_json(&r);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "valid")));
    ck_assert_ptr_nonnull(strstr(cJSON_GetObjectItem(j, "error")->valuestring, "ring_len 9"));
    ck_assert_int_eq(cJSON_GetObjectItem(j, "error_offset")->valueint, 48);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "kind")->valuestring, "ring"); /* header decoded */
    cJSON_Delete(j);
    ck_assert_ptr_nonnull(strstr(r.err, "offset 48: ring_len 9 exceeds window 3"));
    /* truncated: every cut is invalid */
    for (size_t cut = 0; cut < n; cut += 7) {
        write_file(path, bytes, cut);
        inspect(&r, path, NULL, NULL);
        ck_assert_int_eq(r.rc, 1);
        ck_assert_ptr_nonnull(strstr(r.out, "valid: no\nerror: "));
        ck_assert_ptr_nonnull(strstr(r.out, "offset "));
    }
    unlink(path);
    free(bytes);
}
END_TEST

static pd_status sink_file(void *ctx, const void *p, size_t n, pd_err *err)
{
    return wr_sink_file(ctx, p, n, err);
}

START_TEST(inspect_bundle_lists_one_line_per_stream)
{
    ring_layer *a = ring_with_rows();
    char path[] = "/tmp/pd_inspect_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    close(fd);
    FILE *f = fopen(path, "wb");
    bundle_writer *bw = NULL;
    pd_err e = {0};
    ck_assert_int_eq(bundle_writer_new(sink_file, f, ID, 9, 3, &bw, &e), PD_OK);
    wire_layer_ref ref = {.identity = ID, .layer = 9, .ring = a};
    const uint64_t ids[3] = {11, 5, 1ull << 52};
    for (int i = 0; i < 3; i++)
        ck_assert_msg(bundle_writer_add(bw, ids[i], &ref, i == 1, &e) == PD_OK, "%s", e.msg);
    ck_assert_int_eq(bundle_writer_finish(bw, &e), PD_OK);
    bundle_writer_free(bw);
    fclose(f);
    run r;
    inspect(&r, path, NULL, NULL);
    ck_assert_int_eq(r.rc, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "type: bundle\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "streams: 3\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "stream 11: kind ring, position 6"));
    ck_assert_ptr_nonnull(strstr(r.out, "stream 5: kind ring, position 6, rows 2, dtype f16"));
    ck_assert_ptr_nonnull(strstr(r.out, "stream 4503599627370496: kind ring"));
    inspect(&r, path, "--json", NULL);
    cJSON *j = parse_json(&r);
    ck_assert_str_eq(cJSON_GetObjectItem(j, "kind")->valuestring, "bundle");
    cJSON *s = cJSON_GetObjectItem(j, "streams");
    ck_assert_int_eq(cJSON_GetArraySize(s), 3);
    ck_assert_int_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(s, 1), "stream")->valueint, 5);
    ck_assert_str_eq(cJSON_GetObjectItem(cJSON_GetArrayItem(s, 1), "dtype")->valuestring, "f16");
    /* exact 64-bit ids in the JSON text */
    ck_assert_ptr_nonnull(strstr(r.out, "\"stream\":4503599627370496"));
    cJSON_Delete(j);
    /* a flipped byte: invalid, exit 1, offset named */
    f = fopen(path, "r+b");
    fseek(f, 60, SEEK_SET);
    fputc(0x55, f);
    fclose(f);
    inspect(&r, path, "--json", NULL);
    ck_assert_int_eq(r.rc, 1);
    j = parse_json(&r);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "valid")));
    ck_assert_ptr_nonnull(strstr(cJSON_GetObjectItem(j, "error")->valuestring, "crc"));
    ck_assert(cJSON_IsNumber(cJSON_GetObjectItem(j, "error_offset")));
    cJSON_Delete(j);
    unlink(path);
    ring_layer_free(a);
}
END_TEST

/* A NaN in K (or an infinity in a bundle entry whose CRC is right) is a
 * record import refuses: inspect says invalid, exit 1, naming the value's
 * byte offset, instead of "valid: yes". */
START_TEST(inspect_non_finite_values_are_invalid)
{
    char path[] = "/tmp/pd_inspect_XXXXXX";
    uint8_t *bytes = NULL;
    size_t n = record_file(path, &bytes);
    /* ring record: header 32, ring fields 36, head 0's reference K count, K */
    const size_t k0 = 32 + 36 + 4;
    memcpy(bytes + k0, &(float){__builtin_nanf("")}, 4);
    write_file(path, bytes, n);
    run r;
    inspect(&r, path, NULL, NULL);
    ck_assert_int_eq(r.rc, 1);
    ck_assert_ptr_nonnull(strstr(r.out, "valid: no\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "offset 72: head 0 ref k value 0 is not finite (nan)"));
    inspect(&r, path, "--json", NULL);
    ck_assert_int_eq(r.rc, 1);
    cJSON *j = parse_json(&r);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "valid")));
    ck_assert_int_eq(cJSON_GetObjectItem(j, "error_offset")->valueint, 72);
    cJSON_Delete(j);

    /* the same record as the one entry of a bundle with correct CRCs */
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    bundle_writer *bw = NULL;
    pd_err e = {0};
    ck_assert_int_eq(bundle_writer_new(sink_file, f, ID, 9, 1, &bw, &e), PD_OK);
    bytes[k0] = 0; /* a finite value, so the writer takes the record */
    bytes[k0 + 1] = bytes[k0 + 2] = bytes[k0 + 3] = 0;
    ck_assert_msg(bundle_writer_add_record(bw, 5, bytes, n, &e) == PD_OK, "%s", e.msg);
    ck_assert_int_eq(bundle_writer_finish(bw, &e), PD_OK);
    bundle_writer_free(bw);
    fclose(f);
    inspect(&r, path, NULL, NULL);
    ck_assert_msg(r.rc == 0, "%s", r.err);
    /* an infinity in head 0's reference K, entry CRC recomputed */
    uint8_t b[4096];
    f = fopen(path, "rb");
    size_t bn = fread(b, 1, sizeof b, f);
    fclose(f);
    ck_assert_uint_eq(bn, BUNDLE_HEADER_BYTES + BUNDLE_ENTRY_OVERHEAD + n);
    const size_t rec = BUNDLE_HEADER_BYTES + 16, at = rec + k0;
    memcpy(b + at, &(float){__builtin_inff()}, 4);
    uint32_t crc = crc32c_update(0, b + BUNDLE_HEADER_BYTES, 16 + n);
    for (int i = 0; i < 4; i++)
        b[rec + n + (size_t)i] = (uint8_t)(crc >> (8 * i));
    write_file(path, b, bn);
    inspect(&r, path, "--json", NULL);
    ck_assert_int_eq(r.rc, 1);
    j = parse_json(&r);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "valid")));
    ck_assert_int_eq(cJSON_GetObjectItem(j, "error_offset")->valueint, (int)at);
    ck_assert_ptr_nonnull(
        strstr(cJSON_GetObjectItem(j, "error")->valuestring, "head 0 ref k value 0 is not finite (inf)"));
    cJSON_Delete(j);
    unlink(path);
    free(bytes);
}
END_TEST

START_TEST(inspect_unusable_input_exits_two_or_one)
{
    run r;
    inspect(&r, "/nonexistent/pd_inspect", NULL, NULL);
    ck_assert_int_eq(r.rc, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "/nonexistent/pd_inspect: cannot open"));
    inspect(&r, "/nonexistent/pd_inspect", "--json", NULL);
    ck_assert_int_eq(r.rc, 2);
    cJSON *j = parse_json(&r);
    ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "valid")));
    ck_assert_ptr_nonnull(strstr(cJSON_GetObjectItem(j, "error")->valuestring, "cannot open"));
    cJSON_Delete(j);
    inspect(&r, NULL, NULL, NULL);
    ck_assert_int_eq(r.rc, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "missing FILE"));
    inspect(&r, "a", "b", NULL);
    ck_assert_int_eq(r.rc, 2);
    inspect(&r, "--bogus", NULL, NULL);
    ck_assert_int_eq(r.rc, 2);
    ck_assert_ptr_nonnull(strstr(r.err, "unknown option '--bogus'"));
    inspect(&r, "--help", NULL, NULL);
    ck_assert_int_eq(r.rc, 0);
    ck_assert_ptr_nonnull(strstr(r.out, "usage: pipedec inspect"));
    /* a truncated GGUF model (issue 36: GGUF files are inspected as models):
     * invalid, the reader's offset and field named */
    char path[] = "/tmp/pd_inspect_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_eq(write(fd, "GGUF\3\0\0\0", 8), 8);
    close(fd);
    inspect(&r, path, NULL, NULL);
    ck_assert_int_eq(r.rc, 1);
    ck_assert_ptr_nonnull(strstr(r.err, "gguf: offset 8: tensor count"));
    /* a file that is none of them */
    fd = open(path, O_WRONLY | O_TRUNC);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "GGUX\3\0\0\0", 8), 8);
    close(fd);
    inspect(&r, path, NULL, NULL);
    ck_assert_int_eq(r.rc, 1);
    ck_assert_ptr_nonnull(strstr(r.out, "type: unknown\n"));
    ck_assert_ptr_nonnull(strstr(r.out, "offset 0: magic 47 47 55 58"));
    unlink(path);
}
END_TEST

/* Only a regular file is read: a fifo would block until a writer came (or
 * forever), a device such as /dev/zero reads until memory runs out, and a
 * directory is no input. Each is refused before reading, naming the path,
 * with exit 2 (unreadable), as text and as JSON. */
START_TEST(inspect_refuses_what_is_not_a_regular_file)
{
    char dir[64];
    pd_test_tmpdir(dir, sizeof dir, "inspect");
    char fifo[80];
    snprintf(fifo, sizeof fifo, "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    const char *paths[] = {fifo, "/dev/null", "/dev/zero", dir};
    for (size_t i = 0; i < sizeof paths / sizeof paths[0]; i++) {
        run r;
        inspect(&r, paths[i], NULL, NULL);
        ck_assert_msg(r.rc == 2, "%s: exit %d", paths[i], r.rc);
        char want[96];
        snprintf(want, sizeof want, "%s: not a regular file", paths[i]);
        ck_assert_msg(strstr(r.err, want) != NULL, "%s: %s", paths[i], r.err);
        inspect(&r, paths[i], "--json", NULL);
        ck_assert_int_eq(r.rc, 2);
        cJSON *j = parse_json(&r);
        ck_assert(cJSON_IsFalse(cJSON_GetObjectItem(j, "valid")));
        ck_assert_ptr_nonnull(strstr(cJSON_GetObjectItem(j, "error")->valuestring, want));
        cJSON_Delete(j);
    }
    unlink(fifo);
    rmdir(dir);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("cmd_inspect");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, inspect_valid_record_exits_zero_and_describes_it);
    tcase_add_test(tc, inspect_corrupt_record_exits_one_naming_the_offset);
    tcase_add_test(tc, inspect_bundle_lists_one_line_per_stream);
    tcase_add_test(tc, inspect_non_finite_values_are_invalid);
    tcase_add_test(tc, inspect_unusable_input_exits_two_or_one);
    tcase_add_test(tc, inspect_refuses_what_is_not_a_regular_file);
    suite_add_tcase(s, tc);
    return s;
}
