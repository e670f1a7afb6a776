/* libFuzzer target for the GGUF reader: any bytes either are refused with a
 * message that names a byte offset, or open into a file whose every accessor
 * reads in bounds, and which the writer re-encodes into a file that reads back
 * with the same keys, values and tensor bytes.
 *
 * Needs only these sources (scripts/fuzz.sh reads the next line):
 *   PD_FUZZ_SOURCES: cluster/format/gguf.c comm/rd.c comm/crc32c.c base/file.c base/fp16.c base/cpu.c base/status.c
 * By hand, from the source root:
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -D_GNU_SOURCE -I. \
 *         tests/fuzz/fuzz_gguf.c cluster/format/gguf.c comm/rd.c comm/crc32c.c base/file.c \
 *         base/fp16.c base/cpu.c base/status.c -o fuzz_gguf */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/format/gguf.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FZ_ASSERT(c)                                                                     \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "fuzz_gguf: %s:%d: %s\n", __FILE__, __LINE__, #c);           \
            abort();                                                                     \
        }                                                                                \
    } while (0)

/* Reads every value through the public getters; copies it into w (when w is
 * not NULL). Returns false if the file holds something the writer cannot
 * reproduce exactly (a string with an embedded NUL byte). */
static bool fz_walk_kvs(const gguf_file *f, gguf_writer *w)
{
    bool exact = true;
    pd_err e = {0};
    for (uint64_t i = 0; i < gguf_kv_count(f); i++) {
        const gguf_kv_info *kv = gguf_kv_at(f, i);
        FZ_ASSERT(kv && kv->key && kv->key[0]);
        FZ_ASSERT(gguf_find_key(f, kv->key) == (int64_t)i);
        const char *k = kv->key;
        uint64_t u = 0;
        int64_t s = 0;
        double d = 0;
        bool b = false;
        const char *str = NULL;
        size_t len = 0;
        switch (kv->type) {
        case GGUF_VTYPE_UINT8:
        case GGUF_VTYPE_UINT16:
        case GGUF_VTYPE_UINT32:
        case GGUF_VTYPE_UINT64:
            FZ_ASSERT(gguf_get_u64(f, k, &u, &e) == PD_OK);
            if (w && kv->type == GGUF_VTYPE_UINT8)
                gguf_writer_set_u8(w, k, (uint8_t)u);
            if (w && kv->type == GGUF_VTYPE_UINT16)
                gguf_writer_set_u16(w, k, (uint16_t)u);
            if (w && kv->type == GGUF_VTYPE_UINT32)
                gguf_writer_set_u32(w, k, (uint32_t)u);
            if (w && kv->type == GGUF_VTYPE_UINT64)
                gguf_writer_set_u64(w, k, u);
            break;
        case GGUF_VTYPE_INT8:
        case GGUF_VTYPE_INT16:
        case GGUF_VTYPE_INT32:
        case GGUF_VTYPE_INT64:
            FZ_ASSERT(gguf_get_i64(f, k, &s, &e) == PD_OK);
            if (w && kv->type == GGUF_VTYPE_INT8)
                gguf_writer_set_i8(w, k, (int8_t)s);
            if (w && kv->type == GGUF_VTYPE_INT16)
                gguf_writer_set_i16(w, k, (int16_t)s);
            if (w && kv->type == GGUF_VTYPE_INT32)
                gguf_writer_set_i32(w, k, (int32_t)s);
            if (w && kv->type == GGUF_VTYPE_INT64)
                gguf_writer_set_i64(w, k, s);
            break;
        case GGUF_VTYPE_FLOAT32:
        case GGUF_VTYPE_FLOAT64: {
            float f32 = 0;
            FZ_ASSERT(gguf_get_f64(f, k, &d, &e) == PD_OK);
            (void)gguf_get_f32(f, k, &f32, &e); /* may be out of float range */
            if (w && kv->type == GGUF_VTYPE_FLOAT32)
                gguf_writer_set_f32(w, k, (float)d);
            if (w && kv->type == GGUF_VTYPE_FLOAT64)
                gguf_writer_set_f64(w, k, d);
            break;
        }
        case GGUF_VTYPE_BOOL:
            FZ_ASSERT(gguf_get_bool(f, k, &b, &e) == PD_OK);
            if (w)
                gguf_writer_set_bool(w, k, b);
            break;
        case GGUF_VTYPE_STRING:
            FZ_ASSERT(gguf_get_str(f, k, &str, &len, &e) == PD_OK);
            FZ_ASSERT(str[len] == '\0');
            exact = exact && strlen(str) == len;
            if (w)
                gguf_writer_set_str(w, k, str);
            break;
        case GGUF_VTYPE_ARRAY: {
            gguf_vtype et;
            uint64_t n = 0;
            const void *p = NULL;
            FZ_ASSERT(gguf_get_arr(f, k, &et, &n, &p, &e) == PD_OK);
            FZ_ASSERT(et == kv->elem_type && n == kv->count);
            if (et == GGUF_VTYPE_STRING) {
                FZ_ASSERT(p == NULL);
                const char **v = w ? calloc(n ? n : 1, sizeof *v) : NULL;
                for (uint64_t j = 0; j < n; j++) {
                    FZ_ASSERT(gguf_get_str_arr(f, k, j, &str, &len, &e) == PD_OK);
                    FZ_ASSERT(str[len] == '\0');
                    exact = exact && strlen(str) == len;
                    if (v)
                        v[j] = str;
                }
                FZ_ASSERT(gguf_get_str_arr(f, k, n, &str, &len, &e) == PD_ERR_RANGE);
                if (w && v)
                    gguf_writer_set_arr_str(w, k, v, n);
                free(v);
            } else {
                /* touch the first and last element bytes */
                if (n) {
                    FZ_ASSERT(p != NULL);
                    volatile uint8_t x = ((const uint8_t *)p)[0];
                    (void)x;
                }
                if (n && et == GGUF_VTYPE_FLOAT32)
                    (void)gguf_arr_f32_at(p, n - 1);
                if (n && et == GGUF_VTYPE_INT32)
                    (void)gguf_arr_i32_at(p, n - 1);
                if (w)
                    gguf_writer_set_arr(w, k, et, p, n);
            }
            break;
        }
        default:
            FZ_ASSERT(!"value type out of range after a successful open");
        }
    }
    return exact;
}

static void fz_walk_tensors(const gguf_file *f, gguf_writer *w)
{
    for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        FZ_ASSERT(t && t->name && t->bytes > 0 && t->n_dims >= 1 && t->n_dims <= 4);
        FZ_ASSERT(gguf_tensor_find(f, t->name) == t);
        FZ_ASSERT(gguf_type_block(t->type, NULL, NULL));
        const uint8_t *p = t->data;
        volatile uint8_t first = p[0], last = p[t->bytes - 1];
        (void)first;
        (void)last;
        pd_err e = {0};
        size_t row = gguf_type_row_bytes(t->type, t->ne[0], &e);
        FZ_ASSERT(gguf_type_supported(t->type) ? row > 0 : row == 0);
        (void)gguf_type_name(t->type);
        if (w)
            gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t->data);
    }
    FZ_ASSERT(gguf_tensor_at(f, gguf_tensor_count(f)) == NULL);
}

/* The re-encoded file must hold the same keys, values and tensor bytes. */
static void fz_compare(const gguf_file *a, const gguf_file *b)
{
    FZ_ASSERT(gguf_kv_count(a) == gguf_kv_count(b));
    FZ_ASSERT(gguf_tensor_count(a) == gguf_tensor_count(b));
    FZ_ASSERT(gguf_alignment(a) == gguf_alignment(b));
    pd_err e = {0};
    for (uint64_t i = 0; i < gguf_kv_count(a); i++) {
        const gguf_kv_info *x = gguf_kv_at(a, i), *y = gguf_kv_at(b, i);
        FZ_ASSERT(strcmp(x->key, y->key) == 0 && x->type == y->type);
        FZ_ASSERT(x->elem_type == y->elem_type && x->count == y->count);
        if (x->type == GGUF_VTYPE_STRING) {
            const char *s1, *s2;
            size_t l1, l2;
            FZ_ASSERT(gguf_get_str(a, x->key, &s1, &l1, &e) == PD_OK);
            FZ_ASSERT(gguf_get_str(b, y->key, &s2, &l2, &e) == PD_OK);
            FZ_ASSERT(l1 == l2 && memcmp(s1, s2, l1) == 0);
        }
    }
    for (uint64_t i = 0; i < gguf_tensor_count(a); i++) {
        const gguf_tensor *x = gguf_tensor_at(a, i), *y = gguf_tensor_at(b, i);
        FZ_ASSERT(strcmp(x->name, y->name) == 0 && x->type == y->type && x->bytes == y->bytes);
        FZ_ASSERT(memcmp(x->ne, y->ne, sizeof x->ne) == 0);
        FZ_ASSERT(memcmp(x->data, y->data, (size_t)x->bytes) == 0);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_file *f = NULL;
    pd_err err = {0};
    pd_status s = gguf_open_mem(data, size, &f, &err);
    if (s != PD_OK) {
        FZ_ASSERT(f == NULL && err.status == s);
        FZ_ASSERT(s == PD_ERR_NOMEM || strncmp(err.msg, "gguf: offset ", 13) == 0);
        return 0;
    }
    gguf_check(f);
    gguf_writer *w = gguf_writer_new();
    FZ_ASSERT(w);
    bool exact = fz_walk_kvs(f, w);
    fz_walk_tensors(f, w);
    void *buf = NULL;
    size_t len = 0;
    pd_err werr = {0};
    FZ_ASSERT(gguf_writer_to_mem(w, &buf, &len, &werr) == PD_OK);
    gguf_file *g = NULL;
    pd_err rerr = {0};
    if (gguf_open_mem(buf, len, &g, &rerr) != PD_OK) {
        fprintf(stderr, "fuzz_gguf: the re-encoded file does not read: %s\n", rerr.msg);
        abort();
    }
    if (exact)
        fz_compare(f, g);
    gguf_close(g);
    free(buf);
    gguf_writer_free(w);
    gguf_close(f);
    return 0;
}
