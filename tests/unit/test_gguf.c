/* gguf: the writer and reader round-trip every value and tensor type; a file
 * assembled by hand from the documented layout is read and reproduced byte for
 * byte; hostile variants (truncated, flipped, huge counts, misaligned,
 * overlapping, duplicated) are refused with an offset, never crash. */
#include "pd_test.h"

#include "cluster/format/gguf.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ------------------------------------------------------------ byte builder */

typedef struct bb {
    uint8_t *p;
    size_t len, cap;
} bb;

static void bb_put(bb *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        size_t nc = b->cap ? b->cap * 2 : 256;
        while (nc < b->len + n)
            nc *= 2;
        b->p = realloc(b->p, nc);
        ck_assert_ptr_nonnull(b->p);
        b->cap = nc;
    }
    memcpy(b->p + b->len, d, n);
    b->len += n;
}

static void bb_u8(bb *b, uint8_t v)
{
    bb_put(b, &v, 1);
}

static void bb_u32(bb *b, uint32_t v)
{
    uint8_t x[4];
    for (int i = 0; i < 4; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    bb_put(b, x, 4);
}

static void bb_u64(bb *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++)
        x[i] = (uint8_t)(v >> (8 * i));
    bb_put(b, x, 8);
}

static void bb_f32(bb *b, float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    bb_u32(b, u);
}

static void bb_str(bb *b, const char *s)
{
    bb_u64(b, strlen(s));
    bb_put(b, s, strlen(s));
}

static void bb_pad(bb *b, size_t a)
{
    while (b->len % a)
        bb_u8(b, 0);
}

static void put_u32_at(uint8_t *p, size_t off, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[off + i] = (uint8_t)(v >> (8 * i));
}

static void put_u64_at(uint8_t *p, size_t off, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[off + i] = (uint8_t)(v >> (8 * i));
}

/* ------------------------------------------------------------ golden file */

/* Offsets of the fields the negative tests patch. */
typedef struct golden_offs {
    size_t n_tensors, n_kv;
    size_t kv0_key_len, kv0_str_len;
    size_t kv1_type;
    size_t kv2_elem_type, kv2_count;
    size_t kv3_key;
    size_t kv4_value; /* general.alignment */
    size_t kv5_value; /* bool */
    size_t t0_n_dims, t0_ne0, t0_ne1, t0_type;
    size_t t1_name, t1_ne0, t1_offset;
    size_t data;
} golden_offs;

static const char *const golden_tokens[] = {"<s>", "a", "bc"};
static float golden_t0[8];
static uint8_t golden_t1[34];

static void golden_fill_data(void)
{
    for (int i = 0; i < 8; i++)
        golden_t0[i] = (float)i * 0.5f - 1.0f;
    golden_t1[0] = 0x00; /* f16 1.0 = 0x3c00 */
    golden_t1[1] = 0x3c;
    for (int i = 0; i < 32; i++)
        golden_t1[2 + i] = (uint8_t)(int8_t)(i - 16);
}

/* The small valid file every negative test starts from, written field by
 * field from the layout in gguf.h: 6 kvs, 2 tensors (f32 [4,2], q8_0 [32]). */
static bb golden_build(golden_offs *o)
{
    golden_fill_data();
    bb b = {0};
    bb_put(&b, "GGUF", 4);
    bb_u32(&b, 3);
    o->n_tensors = b.len;
    bb_u64(&b, 2);
    o->n_kv = b.len;
    bb_u64(&b, 6);
    /* kv0: general.architecture = "llama" */
    o->kv0_key_len = b.len;
    bb_str(&b, "general.architecture");
    bb_u32(&b, GGUF_VTYPE_STRING);
    o->kv0_str_len = b.len;
    bb_str(&b, "llama");
    /* kv1: llama.block_count = 2 (u32) */
    bb_str(&b, "llama.block_count");
    o->kv1_type = b.len;
    bb_u32(&b, GGUF_VTYPE_UINT32);
    bb_u32(&b, 2);
    /* kv2: tokenizer.ggml.tokens = ["<s>", "a", "bc"] */
    bb_str(&b, "tokenizer.ggml.tokens");
    bb_u32(&b, GGUF_VTYPE_ARRAY);
    o->kv2_elem_type = b.len;
    bb_u32(&b, GGUF_VTYPE_STRING);
    o->kv2_count = b.len;
    bb_u64(&b, 3);
    for (int i = 0; i < 3; i++)
        bb_str(&b, golden_tokens[i]);
    /* kv3: llama.rope.freq_base = 10000 (f32); its key has the length of kv0's */
    o->kv3_key = b.len + 8;
    bb_str(&b, "llama.rope.freq_base");
    bb_u32(&b, GGUF_VTYPE_FLOAT32);
    bb_f32(&b, 10000.0f);
    /* kv4: general.alignment = 32 */
    bb_str(&b, "general.alignment");
    bb_u32(&b, GGUF_VTYPE_UINT32);
    o->kv4_value = b.len;
    bb_u32(&b, 32);
    /* kv5: x.flag = true */
    bb_str(&b, "x.flag");
    bb_u32(&b, GGUF_VTYPE_BOOL);
    o->kv5_value = b.len;
    bb_u8(&b, 1);
    /* tensor 0: "tok.w" f32 ne {4, 2} at 0 */
    bb_str(&b, "tok.w");
    o->t0_n_dims = b.len;
    bb_u32(&b, 2);
    o->t0_ne0 = b.len;
    bb_u64(&b, 4);
    o->t0_ne1 = b.len;
    bb_u64(&b, 2);
    o->t0_type = b.len;
    bb_u32(&b, GGUF_TENSOR_F32);
    bb_u64(&b, 0);
    /* tensor 1: "out.w" q8_0 ne {32} at 32 */
    o->t1_name = b.len + 8;
    bb_str(&b, "out.w");
    bb_u32(&b, 1);
    o->t1_ne0 = b.len;
    bb_u64(&b, 32);
    bb_u32(&b, GGUF_TENSOR_Q8_0);
    o->t1_offset = b.len;
    bb_u64(&b, 32);
    bb_pad(&b, 32);
    o->data = b.len;
    for (int i = 0; i < 8; i++)
        bb_f32(&b, golden_t0[i]);
    bb_put(&b, golden_t1, sizeof golden_t1);
    bb_pad(&b, 32);
    return b;
}

static gguf_writer *golden_writer(void)
{
    golden_fill_data();
    gguf_writer *w = gguf_writer_new();
    ck_assert_ptr_nonnull(w);
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_u32(w, "llama.block_count", 2);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", golden_tokens, 3);
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_writer_set_u32(w, "general.alignment", 32);
    gguf_writer_set_bool(w, "x.flag", true);
    gguf_writer_add_tensor(w, "tok.w", GGUF_TENSOR_F32, 2, (const uint64_t[]){4, 2}, golden_t0);
    gguf_writer_add_tensor(w, "out.w", GGUF_TENSOR_Q8_0, 1, (const uint64_t[]){32}, golden_t1);
    gguf_writer_check(w);
    return w;
}

/* Opens an exact-size heap copy (so ASan sees any read past the end). On
 * success runs gguf_check and every accessor over the whole file. */
static pd_status open_copy(const uint8_t *p, size_t len, pd_err *err)
{
    uint8_t *c = malloc(len ? len : 1);
    ck_assert_ptr_nonnull(c);
    if (len)
        memcpy(c, p, len);
    gguf_file *f = NULL;
    pd_err_clear(err);
    pd_status s = gguf_open_mem(c, len, &f, err);
    if (s == PD_OK) {
        ck_assert_ptr_nonnull(f);
        gguf_check(f);
        for (uint64_t i = 0; i < gguf_kv_count(f); i++) {
            const gguf_kv_info *kv = gguf_kv_at(f, i);
            ck_assert_ptr_nonnull(kv);
            ck_assert_int_eq(gguf_find_key(f, kv->key), (int64_t)i);
            pd_err e = {0};
            uint64_t count = 0;
            gguf_vtype et;
            const void *data = NULL;
            if (kv->type == GGUF_VTYPE_ARRAY) {
                ck_assert_int_eq(gguf_get_arr(f, kv->key, &et, &count, &data, &e), PD_OK);
                ck_assert_uint_eq(count, kv->count);
                if (et == GGUF_VTYPE_STRING) {
                    for (uint64_t k = 0; k < count; k++) {
                        const char *str = NULL;
                        size_t l = 0;
                        ck_assert_int_eq(gguf_get_str_arr(f, kv->key, k, &str, &l, &e), PD_OK);
                        ck_assert_uint_eq(str[l], 0);
                    }
                } else if (count) {
                    volatile uint8_t sink = ((const uint8_t *)data)[0];
                    (void)sink;
                }
            } else if (kv->type == GGUF_VTYPE_STRING) {
                const char *str = NULL;
                size_t l = 0;
                ck_assert_int_eq(gguf_get_str(f, kv->key, &str, &l, &e), PD_OK);
                ck_assert_uint_eq(str[l], 0);
            } else {
                uint64_t u;
                float fl;
                bool bo;
                (void)gguf_get_u64(f, kv->key, &u, &e);
                (void)gguf_get_f32(f, kv->key, &fl, &e);
                (void)gguf_get_bool(f, kv->key, &bo, &e);
            }
        }
        for (uint64_t i = 0; i < gguf_tensor_count(f); i++) {
            const gguf_tensor *t = gguf_tensor_at(f, i);
            ck_assert_ptr_eq(gguf_tensor_find(f, t->name), t);
            const uint8_t *d = t->data;
            volatile uint8_t first = d[0], last = d[t->bytes - 1];
            (void)first;
            (void)last;
        }
        gguf_close(f);
    } else {
        ck_assert_ptr_null(f);
        ck_assert_int_ne(err->status, PD_OK);
    }
    free(c);
    return s;
}

/* ------------------------------------------------------------ round trips */

static gguf_file *open_writer(gguf_writer *w, void **buf)
{
    size_t len = 0;
    pd_err err = {0};
    ck_assert_int_eq(gguf_writer_to_mem(w, buf, &len, &err), PD_OK);
    gguf_file *f = NULL;
    pd_status s = gguf_open_mem(*buf, len, &f, &err);
    ck_assert_msg(s == PD_OK, "%s", err.msg);
    gguf_check(f);
    return f;
}

START_TEST(roundtrip_every_kv_type)
{
    gguf_writer *w = gguf_writer_new();
    ck_assert_int_eq(gguf_writer_set_u8(w, "t.u8", 200), PD_OK);
    ck_assert_int_eq(gguf_writer_set_i8(w, "t.i8", -100), PD_OK);
    ck_assert_int_eq(gguf_writer_set_u16(w, "t.u16", 60000), PD_OK);
    ck_assert_int_eq(gguf_writer_set_i16(w, "t.i16", -30000), PD_OK);
    ck_assert_int_eq(gguf_writer_set_u32(w, "t.u32", 4000000000u), PD_OK);
    ck_assert_int_eq(gguf_writer_set_i32(w, "t.i32", -2000000000), PD_OK);
    ck_assert_int_eq(gguf_writer_set_f32(w, "t.f32", 1.5e-3f), PD_OK);
    ck_assert_int_eq(gguf_writer_set_bool(w, "t.bool", true), PD_OK);
    ck_assert_int_eq(gguf_writer_set_str(w, "t.str", "h\xc3\xa9llo"), PD_OK);
    ck_assert_int_eq(gguf_writer_set_u64(w, "t.u64", UINT64_MAX - 5), PD_OK);
    ck_assert_int_eq(gguf_writer_set_i64(w, "t.i64", INT64_MIN + 7), PD_OK);
    ck_assert_int_eq(gguf_writer_set_f64(w, "t.f64", 0.1), PD_OK);
    const uint8_t a_u8[] = {0, 1, 255};
    const int8_t a_i8[] = {-128, 0, 127};
    const uint16_t a_u16[] = {1, 65535};
    const int16_t a_i16[] = {-32768, 5};
    const uint32_t a_u32[] = {7, 4294967295u};
    const int32_t a_i32[] = {-1, 2147483647, -2147483647 - 1};
    const float a_f32[] = {0.25f, -3.0f, 1e30f};
    const uint8_t a_bool[] = {1, 0, 1, 1};
    const uint64_t a_u64[] = {UINT64_MAX};
    const int64_t a_i64[] = {INT64_MIN, -2};
    const double a_f64[] = {1e300, -0.0};
    const char *const a_str[] = {"", "x", "yz\xe2\x96\x81"};
    ck_assert_int_eq(gguf_writer_set_arr(w, "a.u8", GGUF_VTYPE_UINT8, a_u8, 3), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr(w, "a.i8", GGUF_VTYPE_INT8, a_i8, 3), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr(w, "a.u16", GGUF_VTYPE_UINT16, a_u16, 2), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr(w, "a.i16", GGUF_VTYPE_INT16, a_i16, 2), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr(w, "a.u32", GGUF_VTYPE_UINT32, a_u32, 2), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr_i32(w, "a.i32", a_i32, 3), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr_f32(w, "a.f32", a_f32, 3), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr(w, "a.bool", GGUF_VTYPE_BOOL, a_bool, 4), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr(w, "a.u64", GGUF_VTYPE_UINT64, a_u64, 1), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr(w, "a.i64", GGUF_VTYPE_INT64, a_i64, 2), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr(w, "a.f64", GGUF_VTYPE_FLOAT64, a_f64, 2), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr_str(w, "a.str", a_str, 3), PD_OK);
    ck_assert_int_eq(gguf_writer_set_arr_f32(w, "a.empty", NULL, 0), PD_OK);
    gguf_writer_check(w);

    void *buf = NULL;
    gguf_file *f = open_writer(w, &buf);
    pd_err err = {0};
    ck_assert_uint_eq(gguf_kv_count(f), 25);
    ck_assert_uint_eq(gguf_tensor_count(f), 0);
    ck_assert_uint_eq(gguf_version(f), 3);
    ck_assert_uint_eq(gguf_alignment(f), 32);
    /* file order is the order of the calls */
    ck_assert_str_eq(gguf_kv_at(f, 0)->key, "t.u8");
    ck_assert_str_eq(gguf_kv_at(f, 24)->key, "a.empty");
    ck_assert_ptr_null(gguf_kv_at(f, 25));

    static const struct {
        const char *key;
        gguf_vtype type;
    } types[] = {{"t.u8", GGUF_VTYPE_UINT8},     {"t.i8", GGUF_VTYPE_INT8},
                 {"t.u16", GGUF_VTYPE_UINT16},   {"t.i16", GGUF_VTYPE_INT16},
                 {"t.u32", GGUF_VTYPE_UINT32},   {"t.i32", GGUF_VTYPE_INT32},
                 {"t.f32", GGUF_VTYPE_FLOAT32},  {"t.bool", GGUF_VTYPE_BOOL},
                 {"t.str", GGUF_VTYPE_STRING},   {"t.u64", GGUF_VTYPE_UINT64},
                 {"t.i64", GGUF_VTYPE_INT64},    {"t.f64", GGUF_VTYPE_FLOAT64},
                 {"a.u8", GGUF_VTYPE_ARRAY}};
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++) {
        int64_t k = gguf_find_key(f, types[i].key);
        ck_assert_int_ge(k, 0);
        ck_assert_int_eq(gguf_kv_at(f, (uint64_t)k)->type, types[i].type);
    }

    uint32_t u32 = 0;
    int32_t i32 = 0;
    uint64_t u64 = 0;
    float f32 = 0;
    bool b = false;
    ck_assert_int_eq(gguf_get_u32(f, "t.u8", &u32, &err), PD_OK);
    ck_assert_uint_eq(u32, 200);
    ck_assert_int_eq(gguf_get_i32(f, "t.i8", &i32, &err), PD_OK);
    ck_assert_int_eq(i32, -100);
    ck_assert_int_eq(gguf_get_u32(f, "t.u16", &u32, &err), PD_OK);
    ck_assert_uint_eq(u32, 60000);
    ck_assert_int_eq(gguf_get_i32(f, "t.i16", &i32, &err), PD_OK);
    ck_assert_int_eq(i32, -30000);
    ck_assert_int_eq(gguf_get_u32(f, "t.u32", &u32, &err), PD_OK);
    ck_assert_uint_eq(u32, 4000000000u);
    ck_assert_int_eq(gguf_get_i32(f, "t.i32", &i32, &err), PD_OK);
    ck_assert_int_eq(i32, -2000000000);
    ck_assert_int_eq(gguf_get_f32(f, "t.f32", &f32, &err), PD_OK);
    ck_assert(f32 == 1.5e-3f);
    ck_assert_int_eq(gguf_get_bool(f, "t.bool", &b, &err), PD_OK);
    ck_assert(b);
    const char *s = NULL;
    size_t sl = 0;
    ck_assert_int_eq(gguf_get_str(f, "t.str", &s, &sl, &err), PD_OK);
    ck_assert_str_eq(s, "h\xc3\xa9llo");
    ck_assert_uint_eq(sl, 6);
    ck_assert_int_eq(gguf_get_u64(f, "t.u64", &u64, &err), PD_OK);
    ck_assert(u64 == UINT64_MAX - 5);
    ck_assert_int_eq(gguf_get_f32(f, "t.f64", &f32, &err), PD_OK);
    ck_assert(f32 == (float)0.1);
    int64_t i64 = 0;
    double f64 = 0;
    ck_assert_int_eq(gguf_get_i64(f, "t.i64", &i64, &err), PD_OK);
    ck_assert(i64 == INT64_MIN + 7);
    ck_assert_int_eq(gguf_get_i64(f, "t.u8", &i64, &err), PD_OK);
    ck_assert(i64 == 200);
    ck_assert_int_eq(gguf_get_f64(f, "t.f64", &f64, &err), PD_OK);
    ck_assert(f64 == 0.1);
    ck_assert_int_eq(gguf_get_f64(f, "t.f32", &f64, &err), PD_OK);
    ck_assert(f64 == (double)1.5e-3f);
    ck_assert_int_eq(err.status, PD_OK);
    /* t.i64 is negative: no unsigned getter takes it, and the value stays put */
    u64 = 42;
    ck_assert_int_eq(gguf_get_u64(f, "t.i64", &u64, &err), PD_ERR_RANGE);
    ck_assert_uint_eq(u64, 42);
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_get_i64(f, "t.u64", &i64, &err), PD_ERR_RANGE);
    ck_assert(i64 == 200);
    pd_err_clear(&err);

    gguf_vtype et;
    uint64_t n = 0;
    const void *d = NULL;
    ck_assert_int_eq(gguf_get_arr(f, "a.u8", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_UINT8 && n == 3 && memcmp(d, a_u8, 3) == 0);
    ck_assert_int_eq(gguf_get_arr(f, "a.i8", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_INT8 && n == 3 && memcmp(d, a_i8, 3) == 0);
    ck_assert_int_eq(gguf_get_arr(f, "a.u16", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_UINT16 && n == 2 && memcmp(d, a_u16, 4) == 0);
    ck_assert_int_eq(gguf_get_arr(f, "a.i16", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_INT16 && n == 2 && memcmp(d, a_i16, 4) == 0);
    ck_assert_int_eq(gguf_get_arr(f, "a.u32", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_UINT32 && n == 2);
    ck_assert_uint_eq(gguf_arr_u32_at(d, 1), 4294967295u);
    ck_assert_int_eq(gguf_get_arr(f, "a.i32", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_INT32 && n == 3);
    for (int i = 0; i < 3; i++)
        ck_assert_int_eq(gguf_arr_i32_at(d, (uint64_t)i), a_i32[i]);
    ck_assert_int_eq(gguf_get_arr(f, "a.f32", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_FLOAT32 && n == 3);
    for (int i = 0; i < 3; i++)
        ck_assert(gguf_arr_f32_at(d, (uint64_t)i) == a_f32[i]);
    ck_assert_int_eq(gguf_get_arr(f, "a.bool", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_BOOL && n == 4 && memcmp(d, a_bool, 4) == 0);
    ck_assert_int_eq(gguf_get_arr(f, "a.u64", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_UINT64 && n == 1 && memcmp(d, a_u64, 8) == 0);
    ck_assert_int_eq(gguf_get_arr(f, "a.i64", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_INT64 && n == 2 && memcmp(d, a_i64, 16) == 0);
    ck_assert_int_eq(gguf_get_arr(f, "a.f64", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_FLOAT64 && n == 2 && memcmp(d, a_f64, 16) == 0);
    ck_assert_int_eq(gguf_get_arr(f, "a.str", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_STRING && n == 3 && d == NULL);
    for (uint64_t i = 0; i < 3; i++) {
        ck_assert_int_eq(gguf_get_str_arr(f, "a.str", i, &s, &sl, &err), PD_OK);
        ck_assert_str_eq(s, a_str[i]);
        ck_assert_uint_eq(sl, strlen(a_str[i]));
    }
    ck_assert_int_eq(gguf_get_arr(f, "a.empty", &et, &n, &d, &err), PD_OK);
    ck_assert(et == GGUF_VTYPE_FLOAT32 && n == 0);
    ck_assert_int_eq(err.status, PD_OK);
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
}
END_TEST

START_TEST(roundtrip_every_tensor_type)
{
    pd_rng rng = {.s = 7};
    float f32[3 * 5];
    pd_rng_fill(&rng, f32, 15, -2, 2);
    uint16_t f16[64 * 2], bf16[8];
    for (size_t i = 0; i < 128; i++)
        f16[i] = (uint16_t)pd_rng_next(&rng);
    for (size_t i = 0; i < 8; i++)
        bf16[i] = (uint16_t)pd_rng_next(&rng);
    uint8_t q8[34 * 2 * 3], q4k[144 * 2];
    for (size_t i = 0; i < sizeof q8; i++)
        q8[i] = (uint8_t)pd_rng_next(&rng);
    for (size_t i = 0; i < sizeof q4k; i++)
        q4k[i] = (uint8_t)pd_rng_next(&rng);

    gguf_writer *w = gguf_writer_new();
    ck_assert_int_eq(gguf_writer_add_tensor(w, "w.f32", GGUF_TENSOR_F32, 2,
                                            (const uint64_t[]){5, 3}, f32), PD_OK);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "w.f16", GGUF_TENSOR_F16, 3,
                                            (const uint64_t[]){64, 1, 2}, f16), PD_OK);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "w.q8_0", GGUF_TENSOR_Q8_0, 2,
                                            (const uint64_t[]){64, 3}, q8), PD_OK);
    ck_assert_int_eq(gguf_writer_add_tensor_copy(w, "w.bf16", GGUF_TENSOR_BF16, 4,
                                                 (const uint64_t[]){2, 2, 1, 2}, bf16), PD_OK);
    /* a K-quant type round-trips */
    ck_assert_int_eq(gguf_writer_add_tensor(w, "w.q4_K", GGUF_TENSOR_Q4_K, 1,
                                            (const uint64_t[]){512}, q4k), PD_OK);
    gguf_writer_check(w);
    bf16[0] ^= 0xffff; /* the copy must not see this */

    void *buf = NULL;
    gguf_file *f = open_writer(w, &buf);
    ck_assert_uint_eq(gguf_tensor_count(f), 5);
    static const struct {
        const char *name;
        uint32_t type, n_dims;
        uint64_t ne[4], bytes;
    } want[] = {
        {"w.f32", GGUF_TENSOR_F32, 2, {5, 3, 1, 1}, 60},
        {"w.f16", GGUF_TENSOR_F16, 3, {64, 1, 2, 1}, 256},
        {"w.q8_0", GGUF_TENSOR_Q8_0, 2, {64, 3, 1, 1}, 204},
        {"w.bf16", GGUF_TENSOR_BF16, 4, {2, 2, 1, 2}, 16},
        {"w.q4_K", GGUF_TENSOR_Q4_K, 1, {512, 1, 1, 1}, 288},
    };
    const void *datas[] = {f32, f16, q8, NULL, q4k};
    uint64_t expect_off = 0;
    for (uint64_t i = 0; i < 5; i++) {
        const gguf_tensor *t = gguf_tensor_at(f, i);
        ck_assert_str_eq(t->name, want[i].name);
        ck_assert_uint_eq(t->type, want[i].type);
        ck_assert_uint_eq(t->n_dims, want[i].n_dims);
        for (int d = 0; d < 4; d++)
            ck_assert_uint_eq(t->ne[d], want[i].ne[d]);
        ck_assert_uint_eq(t->bytes, want[i].bytes);
        ck_assert_uint_eq(t->offset, expect_off);
        expect_off += (t->bytes + 31) / 32 * 32;
        ck_assert_uint_eq((uint64_t)((const uint8_t *)t->data - (const uint8_t *)buf),
                          gguf_data_offset(f) + t->offset);
        ck_assert_uint_eq(gguf_data_offset(f) % 32, 0);
        if (datas[i])
            ck_assert_mem_eq(t->data, datas[i], (size_t)t->bytes);
        ck_assert_ptr_eq(gguf_tensor_find(f, want[i].name), t);
    }
    bf16[0] ^= 0xffff;
    ck_assert_mem_eq(gguf_tensor_at(f, 3)->data, bf16, 16);
    ck_assert_ptr_null(gguf_tensor_at(f, 5));
    ck_assert_ptr_null(gguf_tensor_find(f, "w.none"));
    ck_assert_uint_eq(gguf_file_size(f), gguf_data_offset(f) + expect_off);
    ck_assert(gguf_type_supported(gguf_tensor_find(f, "w.q8_0")->type));
    ck_assert(gguf_type_supported(gguf_tensor_find(f, "w.q4_K")->type));
    ck_assert(!gguf_type_supported(GGUF_TENSOR_Q2_K));
    ck_assert(!gguf_type_supported(GGUF_TENSOR_IQ4_XS));
    ck_assert(!gguf_type_supported(GGUF_TENSOR_MXFP4));
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
}
END_TEST

START_TEST(golden_bytes_read_and_reproduced_by_writer)
{
    golden_offs o;
    bb g = golden_build(&o);
    pd_err err = {0};
    gguf_file *f = NULL;
    ck_assert_msg(gguf_open_mem(g.p, g.len, &f, &err) == PD_OK, "%s", err.msg);
    gguf_check(f);
    ck_assert_uint_eq(gguf_kv_count(f), 6);
    ck_assert_uint_eq(gguf_tensor_count(f), 2);
    ck_assert_uint_eq(gguf_data_offset(f), o.data);
    ck_assert_uint_eq(gguf_data_offset(f) % 32, 0);
    const char *s = NULL;
    ck_assert_int_eq(gguf_get_str(f, "general.architecture", &s, NULL, &err), PD_OK);
    ck_assert_str_eq(s, "llama");
    uint32_t u = 0;
    ck_assert_int_eq(gguf_get_u32(f, "llama.block_count", &u, &err), PD_OK);
    ck_assert_uint_eq(u, 2);
    float fb = 0;
    ck_assert_int_eq(gguf_get_f32(f, "llama.rope.freq_base", &fb, &err), PD_OK);
    ck_assert(fb == 10000.0f);
    bool flag = false;
    ck_assert_int_eq(gguf_get_bool(f, "x.flag", &flag, &err), PD_OK);
    ck_assert(flag);
    size_t l = 0;
    ck_assert_int_eq(gguf_get_str_arr(f, "tokenizer.ggml.tokens", 2, &s, &l, &err), PD_OK);
    ck_assert_str_eq(s, "bc");
    ck_assert_uint_eq(l, 2);
    const gguf_tensor *t0 = gguf_tensor_find(f, "tok.w"), *t1 = gguf_tensor_find(f, "out.w");
    ck_assert_ptr_nonnull(t0);
    ck_assert_ptr_nonnull(t1);
    ck_assert_uint_eq(t0->bytes, 32);
    ck_assert_uint_eq(t1->bytes, 34);
    ck_assert_uint_eq(t1->offset, 32);
    ck_assert_ptr_eq(t0->data, g.p + o.data);
    ck_assert_mem_eq(t0->data, golden_t0, 32);
    ck_assert_mem_eq(t1->data, golden_t1, 34);
    ck_assert_int_eq(err.status, PD_OK);
    gguf_close(f);

    gguf_writer *w = golden_writer();
    void *buf = NULL;
    size_t len = 0;
    ck_assert_int_eq(gguf_writer_to_mem(w, &buf, &len, &err), PD_OK);
    ck_assert_uint_eq(len, g.len);
    ck_assert_mem_eq(buf, g.p, g.len);
    free(buf);
    gguf_writer_free(w);
    free(g.p);
}
END_TEST

START_TEST(writer_is_deterministic_and_set_replaces_in_place)
{
    void *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    pd_err err = {0};
    gguf_writer *w1 = golden_writer();
    gguf_writer *w2 = golden_writer();
    ck_assert_int_eq(gguf_writer_to_mem(w1, &a, &la, &err), PD_OK);
    ck_assert_int_eq(gguf_writer_to_mem(w2, &b, &lb, &err), PD_OK);
    ck_assert_uint_eq(la, lb);
    ck_assert_mem_eq(a, b, la);
    free(b);
    /* replacing a value keeps the key's position; only its bytes change */
    ck_assert_int_eq(gguf_writer_set_u32(w2, "llama.block_count", 7), PD_OK);
    gguf_writer_check(w2);
    ck_assert_int_eq(gguf_writer_to_mem(w2, &b, &lb, &err), PD_OK);
    ck_assert_uint_eq(la, lb);
    ck_assert_mem_ne(a, b, la);
    gguf_file *f = NULL;
    ck_assert_int_eq(gguf_open_mem(b, lb, &f, &err), PD_OK);
    ck_assert_str_eq(gguf_kv_at(f, 1)->key, "llama.block_count");
    uint32_t u = 0;
    ck_assert_int_eq(gguf_get_u32(f, "llama.block_count", &u, &err), PD_OK);
    ck_assert_uint_eq(u, 7);
    gguf_close(f);
    free(a);
    free(b);
    gguf_writer_free(w1);
    gguf_writer_free(w2);
}
END_TEST

START_TEST(writer_file_is_atomic_and_mmap_reads_it)
{
    char dir[64];
    pd_test_tmpdir(dir, sizeof dir, "gguf");
    char path[256], tmp[300];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    pd_err err = {0};

    gguf_writer *w = golden_writer();
    ck_assert_int_eq(gguf_writer_write(w, path, &err), PD_OK);
    ck_assert_int_ne(access(tmp, F_OK), 0);
    /* writing again over an existing file replaces it */
    ck_assert_int_eq(gguf_writer_set_str(w, "general.name", "again"), PD_OK);
    ck_assert_int_eq(gguf_writer_write(w, path, &err), PD_OK);
    ck_assert_int_ne(access(tmp, F_OK), 0);

    gguf_file *f = NULL;
    ck_assert_msg(gguf_open(path, &f, &err) == PD_OK, "%s", err.msg);
    gguf_check(f);
    const char *s = NULL;
    ck_assert_int_eq(gguf_get_str(f, "general.name", &s, NULL, &err), PD_OK);
    ck_assert_str_eq(s, "again");
    const gguf_tensor *t = gguf_tensor_find(f, "out.w");
    ck_assert_ptr_nonnull(t);
    ck_assert_mem_eq(t->data, golden_t1, 34);
    ck_assert_uint_eq((uintptr_t)t->data % 32, 0); /* mmap is page aligned */
    gguf_close(f);

    /* a directory that does not exist: an i/o error and nothing left behind */
    char bad[300];
    snprintf(bad, sizeof bad, "%s/no/such/m.gguf", dir);
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_writer_write(w, bad, &err), PD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "no/such"));

    /* the reader's own i/o failures: missing file, empty file, directory */
    pd_err_clear(&err);
    f = NULL;
    ck_assert_int_eq(gguf_open(bad, &f, &err), PD_ERR_IO);
    ck_assert_ptr_null(f);
    char empty[300];
    snprintf(empty, sizeof empty, "%s/empty.gguf", dir);
    FILE *fp = fopen(empty, "wb");
    ck_assert_ptr_nonnull(fp);
    fclose(fp);
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_open(empty, &f, &err), PD_ERR_TRUNCATED);
    ck_assert_ptr_nonnull(strstr(err.msg, "offset 0"));
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_open(dir, &f, &err), PD_ERR_IO);
    ck_assert_ptr_null(f);

    unlink(empty);
    unlink(path);
    rmdir(dir);
    gguf_writer_free(w);
}
END_TEST

/* Resident pages of this process (/proc/self/statm, field 2). */
static long resident_pages(void)
{
    long size = 0, res = -1;
    FILE *fp = fopen("/proc/self/statm", "r");
    ck_assert_ptr_nonnull(fp);
    ck_assert_int_eq(fscanf(fp, "%ld %ld", &size, &res), 2);
    fclose(fp);
    return res;
}

/* Released pages of a mapped file leave the resident set and read back the
 * same bytes; an in-memory file (the caller's buffer) is never released, so
 * its bytes stay too; ranges outside the file are ignored. */
START_TEST(released_bytes_leave_the_resident_set_and_read_back_the_same)
{
    enum { N = 4u << 20 }; /* 16 MiB of f32 */
    float *v = malloc((size_t)N * sizeof *v);
    ck_assert_ptr_nonnull(v);
    for (uint32_t i = 0; i < N; i++)
        v[i] = (float)i * 0.5f;
    char dir[64];
    pd_test_tmpdir(dir, sizeof dir, "gguf_rel");
    char path[256];
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    pd_err err = {0};
    gguf_writer *w = gguf_writer_new();
    ck_assert_int_eq(gguf_writer_add_tensor(w, "big", GGUF_TENSOR_F32, 1, (const uint64_t[]){N}, v), PD_OK);
    ck_assert_int_eq(gguf_writer_write(w, path, &err), PD_OK);

    gguf_file *f = NULL;
    ck_assert_msg(gguf_open(path, &f, &err) == PD_OK, "%s", err.msg);
    const gguf_tensor *t = gguf_tensor_find(f, "big");
    ck_assert_ptr_nonnull(t);
    volatile uint8_t sink = 0;
    for (uint64_t i = 0; i < t->bytes; i += 4096)
        sink ^= ((const uint8_t *)t->data)[i];
    long before = resident_pages();
    gguf_release_bytes(f, t->data, t->bytes);
    long after = resident_pages();
    long page = sysconf(_SC_PAGESIZE);
    /* the kernel's resident counters are per-thread and synced in batches of
     * page events: allow a tenth */
    ck_assert_msg(before - after >= (long)(t->bytes / (uint64_t)page) * 9 / 10, "resident %ld -> %ld pages",
                  before, after);
    ck_assert_mem_eq(t->data, v, (size_t)t->bytes);
    /* outside the mapping, empty: nothing happens */
    gguf_release_bytes(f, v, (uint64_t)N * 4);
    gguf_release_bytes(f, t->data, 0);
    gguf_close(f);

    void *buf = NULL;
    size_t len = 0;
    ck_assert_int_eq(gguf_writer_to_mem(w, &buf, &len, &err), PD_OK);
    ck_assert_int_eq(gguf_open_mem(buf, len, &f, &err), PD_OK);
    t = gguf_tensor_find(f, "big");
    gguf_release_bytes(f, t->data, t->bytes);
    ck_assert_mem_eq(t->data, v, (size_t)t->bytes);
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
    unlink(path);
    rmdir(dir);
    free(v);
    (void)sink;
}
END_TEST

/* ------------------------------------------------------------ negatives */

START_TEST(truncation_at_every_offset_is_refused_with_an_offset)
{
    golden_offs o;
    bb g = golden_build(&o);
    pd_err err = {0};
    for (size_t n = 0; n < g.len; n++) {
        pd_status s = open_copy(g.p, n, &err);
        ck_assert_msg(s != PD_OK, "a prefix of %zu of %zu bytes was accepted", n, g.len);
        ck_assert_msg(strstr(err.msg, "gguf: offset ") == err.msg, "prefix %zu: '%s'", n, err.msg);
    }
    ck_assert_int_eq(open_copy(g.p, g.len, &err), PD_OK);
    free(g.p);
}
END_TEST

START_TEST(byte_flips_are_refused_or_parse_validly)
{
    golden_offs o;
    bb g = golden_build(&o);
    pd_err err = {0};
    static const uint8_t masks[] = {0x01, 0x02, 0x10, 0x80, 0xff};
    int refused = 0, accepted = 0;
    for (size_t i = 0; i < g.len; i++) {
        for (size_t m = 0; m < sizeof masks; m++) {
            g.p[i] ^= masks[m];
            if (open_copy(g.p, g.len, &err) == PD_OK) {
                accepted++;
            } else {
                refused++;
                ck_assert_ptr_nonnull(strstr(err.msg, "gguf: "));
            }
            g.p[i] ^= masks[m];
        }
    }
    /* flips in tensor data or in values parse; flips in the structure do not */
    ck_assert_int_gt(refused, 100);
    ck_assert_int_gt(accepted, 100);

    /* and a few thousand random multi-byte mutations */
    pd_rng rng = {.s = 99};
    uint8_t *m = malloc(g.len);
    for (int it = 0; it < 3000; it++) {
        memcpy(m, g.p, g.len);
        int k = 1 + (int)pd_rng_below(&rng, 4);
        for (int j = 0; j < k; j++)
            m[pd_rng_below(&rng, (uint32_t)g.len)] = (uint8_t)pd_rng_next(&rng);
        (void)open_copy(m, g.len, &err);
    }
    free(m);
    free(g.p);
}
END_TEST

/* Patches the golden file, expects refusal with status st and a message
 * containing every given fragment. */
static void expect_refused(void (*patch)(uint8_t *, const golden_offs *), pd_status st,
                           const char *frag1, const char *frag2)
{
    golden_offs o;
    bb g = golden_build(&o);
    patch(g.p, &o);
    pd_err err = {0};
    pd_status s = open_copy(g.p, g.len, &err);
    ck_assert_msg(s == st, "status %d (%s), want %d", s, err.msg, st);
    ck_assert_msg(strstr(err.msg, "gguf: offset ") == err.msg, "%s", err.msg);
    ck_assert_msg(strstr(err.msg, frag1) != NULL, "'%s' lacks '%s'", err.msg, frag1);
    if (frag2)
        ck_assert_msg(strstr(err.msg, frag2) != NULL, "'%s' lacks '%s'", err.msg, frag2);
    free(g.p);
}

static void p_version1(uint8_t *p, const golden_offs *o)
{
    (void)o;
    put_u32_at(p, 4, 1);
}
static void p_version4(uint8_t *p, const golden_offs *o)
{
    (void)o;
    put_u32_at(p, 4, 4);
}
static void p_version_swapped(uint8_t *p, const golden_offs *o)
{
    (void)o;
    put_u32_at(p, 4, 0x03000000u);
}
static void p_magic(uint8_t *p, const golden_offs *o)
{
    (void)o;
    p[3] = 'G';
}

START_TEST(versions_1_and_4_and_bad_magic_are_refused)
{
    expect_refused(p_version1, PD_ERR_VERSION, "offset 4:", "version 1");
    expect_refused(p_version4, PD_ERR_VERSION, "offset 4:", "version 4");
    expect_refused(p_version_swapped, PD_ERR_VERSION, "byte-swapped", NULL);
    expect_refused(p_magic, PD_ERR_FORMAT, "offset 0:", "magic");

    /* version 2 has the same layout and is read */
    golden_offs o;
    bb g = golden_build(&o);
    put_u32_at(g.p, 4, 2);
    pd_err err = {0};
    gguf_file *f = NULL;
    ck_assert_int_eq(gguf_open_mem(g.p, g.len, &f, &err), PD_OK);
    ck_assert_uint_eq(gguf_version(f), 2);
    gguf_close(f);
    free(g.p);
}
END_TEST

static uint64_t huge;
static void p_kv_count(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->n_kv, huge);
}
static void p_tensor_count(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->n_tensors, huge);
}
static void p_key_len(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->kv0_key_len, huge);
}
static void p_str_len(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->kv0_str_len, huge);
}
static void p_arr_count(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->kv2_count, huge);
}
static void p_ne(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->t0_ne1, huge);
}

START_TEST(huge_counts_are_refused_before_allocation)
{
    const uint64_t values[] = {UINT64_MAX, UINT64_MAX - 1, (uint64_t)1 << 63, (uint64_t)1 << 40};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        huge = values[i];
        expect_refused(p_kv_count, PD_ERR_TRUNCATED, "offset 16:", "kv count");
        expect_refused(p_tensor_count, PD_ERR_TRUNCATED, "offset 8:", "tensor count");
        expect_refused(p_key_len, PD_ERR_TRUNCATED, "offset 24:", "kv 0 key length");
        expect_refused(p_str_len, PD_ERR_TRUNCATED, "kv 0 'general.architecture' string length",
                       "remaining bytes");
        expect_refused(p_arr_count, PD_ERR_TRUNCATED, "array count", "cannot fit");
        if (huge > (uint64_t)INT64_MAX)
            expect_refused(p_ne, PD_ERR_FORMAT, "tensor 0 'tok.w'", "ne[1]");
        else /* representable, but the data is not there */
            expect_refused(p_ne, PD_ERR_TRUNCATED, "tensor 0 'tok.w'", "past");
    }
    /* the exact message of the documented example */
    golden_offs o;
    bb g = golden_build(&o);
    put_u64_at(g.p, o.kv0_key_len, UINT64_MAX);
    pd_err err = {0};
    ck_assert_int_ne(open_copy(g.p, g.len, &err), PD_OK);
    char want[160];
    snprintf(want, sizeof want,
             "gguf: offset 24: kv 0 key length 18446744073709551615 exceeds the %zu remaining bytes",
             g.len - 32);
    ck_assert_str_eq(err.msg, want);
    free(g.p);
}
END_TEST

static void p_ne_overflow(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->t0_ne0, (uint64_t)1 << 32);
    put_u64_at(p, o->t0_ne1, (uint64_t)1 << 31);
}
static void p_ne_zero(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->t0_ne1, 0);
}
static void p_n_dims0(uint8_t *p, const golden_offs *o)
{
    put_u32_at(p, o->t0_n_dims, 0);
}
static void p_n_dims5(uint8_t *p, const golden_offs *o)
{
    put_u32_at(p, o->t0_n_dims, 5);
}
static void p_type_unknown(uint8_t *p, const golden_offs *o)
{
    put_u32_at(p, o->t0_type, 77);
}
static void p_type_removed(uint8_t *p, const golden_offs *o)
{
    put_u32_at(p, o->t0_type, 31);
}
static void p_q8_ne0(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->t1_ne0, 48);
}
static void p_past_end(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->t1_ne0, 64);
}

START_TEST(bad_tensor_shapes_and_types_are_refused)
{
    expect_refused(p_ne_overflow, PD_ERR_FORMAT, "overflows int64", "ne[1]");
    expect_refused(p_ne_zero, PD_ERR_FORMAT, "ne[1] = 0", NULL);
    expect_refused(p_n_dims0, PD_ERR_FORMAT, "n_dims 0", NULL);
    expect_refused(p_n_dims5, PD_ERR_FORMAT, "n_dims 5", NULL);
    expect_refused(p_type_unknown, PD_ERR_FORMAT, "unknown ggml type 77", NULL);
    expect_refused(p_type_removed, PD_ERR_FORMAT, "q4_0_4_4", "removed");
    expect_refused(p_q8_ne0, PD_ERR_FORMAT, "ne[0] = 48", "q8_0 block size 32");
    expect_refused(p_past_end, PD_ERR_TRUNCATED, "tensor 1 'out.w'", "past");
}
END_TEST

static void p_misaligned(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->t1_offset, 33);
}
static void p_overlap_same(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->t1_offset, 0);
}
static void p_overlap_partial(uint8_t *p, const golden_offs *o)
{
    put_u64_at(p, o->t0_ne0, 8); /* tok.w grows to [0, 64) over out.w at 32 */
}

START_TEST(misaligned_and_overlapping_tensors_are_refused)
{
    expect_refused(p_misaligned, PD_ERR_FORMAT, "offset 33 is not a multiple of the alignment 32",
                   NULL);
    expect_refused(p_overlap_same, PD_ERR_FORMAT, "overlaps", "'tok.w'");
    expect_refused(p_overlap_partial, PD_ERR_FORMAT, "overlaps", "[0, 64)");
}
END_TEST

static void p_align0(uint8_t *p, const golden_offs *o)
{
    put_u32_at(p, o->kv4_value, 0);
}
static void p_align3(uint8_t *p, const golden_offs *o)
{
    put_u32_at(p, o->kv4_value, 3);
}
static void p_align_type(uint8_t *p, const golden_offs *o)
{
    put_u32_at(p, o->kv4_value - 4, GGUF_VTYPE_INT32);
}

START_TEST(bad_alignment_is_refused)
{
    expect_refused(p_align0, PD_ERR_FORMAT, "general.alignment 0 is not a power of two", NULL);
    expect_refused(p_align3, PD_ERR_FORMAT, "general.alignment 3 is not a power of two", NULL);
    expect_refused(p_align_type, PD_ERR_FORMAT, "general.alignment has type int32", NULL);

    /* a larger alignment is honoured by the writer and accepted by the reader */
    gguf_writer *w = golden_writer();
    ck_assert_int_eq(gguf_writer_set_u32(w, "general.alignment", 256), PD_OK);
    void *buf = NULL;
    gguf_file *f = open_writer(w, &buf);
    ck_assert_uint_eq(gguf_alignment(f), 256);
    ck_assert_uint_eq(gguf_data_offset(f) % 256, 0);
    ck_assert_uint_eq(gguf_tensor_find(f, "out.w")->offset, 256);
    ck_assert_uint_eq(gguf_file_size(f), gguf_data_offset(f) + 512);
    gguf_close(f);
    free(buf);
    /* and the writer refuses to write a bad one */
    ck_assert_int_eq(gguf_writer_set_u32(w, "general.alignment", 3), PD_OK);
    pd_err err = {0};
    size_t len = 0;
    buf = NULL;
    ck_assert_int_eq(gguf_writer_to_mem(w, &buf, &len, &err), PD_ERR_ARG);
    ck_assert_ptr_null(buf);
    ck_assert_ptr_nonnull(strstr(err.msg, "power of two"));
    gguf_writer_free(w);
}
END_TEST

static void p_dup_key(uint8_t *p, const golden_offs *o)
{
    memcpy(p + o->kv3_key, "general.architecture", 20);
}
static void p_dup_name(uint8_t *p, const golden_offs *o)
{
    memcpy(p + o->t1_name, "tok.w", 5);
}

START_TEST(duplicate_keys_and_tensor_names_are_refused)
{
    expect_refused(p_dup_key, PD_ERR_FORMAT, "kv 3 key 'general.architecture' duplicates kv 0", NULL);
    expect_refused(p_dup_name, PD_ERR_FORMAT, "tensor 1 name 'tok.w' duplicates tensor 0", NULL);
}
END_TEST

static void p_nested(uint8_t *p, const golden_offs *o)
{
    put_u32_at(p, o->kv2_elem_type, GGUF_VTYPE_ARRAY);
}
static void p_elem_range(uint8_t *p, const golden_offs *o)
{
    put_u32_at(p, o->kv2_elem_type, 13);
}
static void p_vtype_range(uint8_t *p, const golden_offs *o)
{
    put_u32_at(p, o->kv1_type, 13);
}
static void p_bool2(uint8_t *p, const golden_offs *o)
{
    p[o->kv5_value] = 2;
}
static void p_key_nul(uint8_t *p, const golden_offs *o)
{
    p[o->kv3_key + 3] = 0;
}
static void p_key_empty(uint8_t *p, const golden_offs *o)
{
    /* kv0's key becomes empty; its 20 bytes then read as the type field */
    put_u64_at(p, o->kv0_key_len, 0);
}

START_TEST(bad_values_are_refused)
{
    expect_refused(p_nested, PD_ERR_FORMAT, "array of arrays", NULL);
    expect_refused(p_elem_range, PD_ERR_FORMAT, "element type 13 is out of range", NULL);
    expect_refused(p_vtype_range, PD_ERR_FORMAT, "'llama.block_count' value type 13", NULL);
    expect_refused(p_bool2, PD_ERR_FORMAT, "'x.flag' bool byte is 2", NULL);
    expect_refused(p_key_nul, PD_ERR_FORMAT, "contains a NUL byte", NULL);
    expect_refused(p_key_empty, PD_ERR_FORMAT, "kv 0 key is empty", NULL);
}
END_TEST

/* A file with one f32 [1] tensor called name, no kvs. */
static bb one_tensor_file(const char *name)
{
    bb b = {0};
    bb_put(&b, "GGUF", 4);
    bb_u32(&b, 3);
    bb_u64(&b, 1);
    bb_u64(&b, 0);
    bb_str(&b, name);
    bb_u32(&b, 1);
    bb_u64(&b, 1);
    bb_u32(&b, GGUF_TENSOR_F32);
    bb_u64(&b, 0);
    bb_pad(&b, 32);
    bb_f32(&b, 1.0f);
    bb_pad(&b, 32);
    return b;
}

START_TEST(long_tensor_name_is_refused)
{
    char name[65];
    memset(name, 'n', 64);
    name[64] = '\0';
    pd_err err = {0};
    bb b = one_tensor_file(name);
    ck_assert_int_eq(open_copy(b.p, b.len, &err), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "offset 24: tensor 0 name"));
    ck_assert_ptr_nonnull(strstr(err.msg, "is 64 bytes, the limit is 63"));
    free(b.p);
    name[63] = '\0'; /* 63 bytes is the longest ggml takes */
    b = one_tensor_file(name);
    ck_assert_msg(open_copy(b.p, b.len, &err) == PD_OK, "%s", err.msg);
    free(b.p);
    b = one_tensor_file("");
    ck_assert_int_eq(open_copy(b.p, b.len, &err), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "tensor 0 name is empty"));
    free(b.p);

    name[63] = 'n';
    gguf_writer *w = gguf_writer_new();
    float x = 0;
    ck_assert_int_eq(gguf_writer_add_tensor(w, name, GGUF_TENSOR_F32, 1, (const uint64_t[]){1}, &x),
                     PD_ERR_ARG);
    gguf_writer_free(w);
}
END_TEST

START_TEST(files_without_tensors_or_kvs_are_valid)
{
    gguf_writer *w = gguf_writer_new();
    void *buf = NULL;
    gguf_file *f = open_writer(w, &buf);
    ck_assert_uint_eq(gguf_kv_count(f), 0);
    ck_assert_uint_eq(gguf_tensor_count(f), 0);
    ck_assert_uint_eq(gguf_data_offset(f), 32);
    ck_assert_int_eq(gguf_find_key(f, "anything"), -1);
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
}
END_TEST

/* ------------------------------------------------------------ getters */

START_TEST(getters_convert_fitting_integers_and_refuse_others)
{
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_i64(w, "pos", 12345);
    gguf_writer_set_i32(w, "neg", -5);
    gguf_writer_set_u64(w, "big", (uint64_t)UINT32_MAX + 1);
    gguf_writer_set_f64(w, "huge_f64", 1e300);
    gguf_writer_set_str(w, "name", "x");
    gguf_writer_set_arr_f32(w, "arr", (const float[]){1, 2}, 2);
    void *buf = NULL;
    gguf_file *f = open_writer(w, &buf);
    pd_err err = {0};
    uint32_t u = 99;
    int32_t i = 99;
    uint64_t u64 = 99;
    float fl = 99;
    bool b = false;
    const char *s = NULL;

    ck_assert_int_eq(gguf_get_u32(f, "pos", &u, &err), PD_OK);
    ck_assert_uint_eq(u, 12345);
    ck_assert_int_eq(gguf_get_u64(f, "big", &u64, &err), PD_OK);
    ck_assert(u64 == (uint64_t)UINT32_MAX + 1);

    u = 99;
    ck_assert_int_eq(gguf_get_u32(f, "neg", &u, &err), PD_ERR_RANGE);
    ck_assert_uint_eq(u, 99);
    ck_assert_ptr_nonnull(strstr(err.msg, "'neg' = -5 (int32) does not fit uint32"));
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_get_u32(f, "big", &u, &err), PD_ERR_RANGE);
    ck_assert_uint_eq(u, 99);
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_get_i32(f, "big", &i, &err), PD_ERR_RANGE);
    ck_assert_int_eq(i, 99);
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_get_f32(f, "huge_f64", &fl, &err), PD_ERR_RANGE);
    ck_assert(fl == 99);
    pd_err_clear(&err);

    ck_assert_int_eq(gguf_get_u32(f, "name", &u, &err), PD_ERR_MISMATCH);
    ck_assert_str_eq(err.msg, "gguf: key 'name' has type string, expected an integer");
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_get_str(f, "pos", &s, NULL, &err), PD_ERR_MISMATCH);
    ck_assert_str_eq(err.msg, "gguf: key 'pos' has type int64, expected string");
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_get_bool(f, "arr", &b, &err), PD_ERR_MISMATCH);
    ck_assert_str_eq(err.msg, "gguf: key 'arr' is an array of float32, expected bool");
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_get_f32(f, "missing.key", &fl, &err), PD_ERR_FORMAT);
    ck_assert_str_eq(err.msg, "gguf: key 'missing.key' is missing");
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_get_str_arr(f, "arr", 0, &s, NULL, &err), PD_ERR_MISMATCH);
    pd_err_clear(&err);
    ck_assert_int_eq(gguf_get_arr(f, "name", NULL, NULL, NULL, &err), PD_ERR_MISMATCH);
    ck_assert_ptr_null(s);
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
}
END_TEST

START_TEST(string_array_index_is_direct_and_bounded)
{
    enum { N = 5000 };
    char **toks = malloc(N * sizeof *toks);
    for (int i = 0; i < N; i++) {
        toks[i] = malloc(16);
        snprintf(toks[i], 16, "tok%d", i * 7);
    }
    gguf_writer *w = gguf_writer_new();
    ck_assert_int_eq(gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)toks, N),
                     PD_OK);
    void *buf = NULL;
    gguf_file *f = open_writer(w, &buf);
    pd_err err = {0};
    const char *s = NULL;
    size_t l = 0;
    for (int i = N - 1; i >= 0; i -= 333) {
        ck_assert_int_eq(gguf_get_str_arr(f, "tokenizer.ggml.tokens", (uint64_t)i, &s, &l, &err),
                         PD_OK);
        ck_assert_str_eq(s, toks[i]);
        ck_assert_uint_eq(l, strlen(toks[i]));
    }
    s = NULL;
    ck_assert_int_eq(gguf_get_str_arr(f, "tokenizer.ggml.tokens", N, &s, &l, &err), PD_ERR_RANGE);
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(err.msg, "index 5000"));
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
    for (int i = 0; i < N; i++)
        free(toks[i]);
    free(toks);
}
END_TEST

START_TEST(type_names_and_row_bytes)
{
    ck_assert_str_eq(gguf_type_name(GGUF_TENSOR_F32), "f32");
    ck_assert_str_eq(gguf_type_name(GGUF_TENSOR_F16), "f16");
    ck_assert_str_eq(gguf_type_name(GGUF_TENSOR_Q8_0), "q8_0");
    ck_assert_str_eq(gguf_type_name(GGUF_TENSOR_BF16), "bf16");
    ck_assert_str_eq(gguf_type_name(GGUF_TENSOR_Q4_K), "q4_K");
    ck_assert_str_eq(gguf_type_name(GGUF_TENSOR_MXFP4), "mxfp4");
    ck_assert_str_eq(gguf_type_name(33), "q4_0_8_8");
    ck_assert_str_eq(gguf_type_name(4242), "unknown(4242)");
    const char *a = gguf_type_name(1000), *b = gguf_type_name(1001);
    ck_assert_str_eq(a, "unknown(1000)"); /* two in one printf stay distinct */
    ck_assert_str_eq(b, "unknown(1001)");
    ck_assert_str_eq(gguf_vtype_name(GGUF_VTYPE_FLOAT64), "float64");
    ck_assert_str_eq(gguf_vtype_name(99), "unknown");

    uint32_t be = 0, bsz = 0;
    ck_assert(gguf_type_block(GGUF_TENSOR_Q8_0, &be, &bsz) && be == 32 && bsz == 34);
    ck_assert(gguf_type_block(GGUF_TENSOR_Q6_K, &be, &bsz) && be == 256 && bsz == 210);
    ck_assert(!gguf_type_block(31, &be, &bsz));
    ck_assert(!gguf_type_block(4242, &be, &bsz));

    pd_err err = {0};
    ck_assert_uint_eq(gguf_type_row_bytes(GGUF_TENSOR_F32, 10, &err), 40);
    ck_assert_uint_eq(gguf_type_row_bytes(GGUF_TENSOR_F16, 10, &err), 20);
    ck_assert_uint_eq(gguf_type_row_bytes(GGUF_TENSOR_BF16, 3, &err), 6);
    ck_assert_uint_eq(gguf_type_row_bytes(GGUF_TENSOR_Q8_0, 1280, &err), 40 * 34);
    ck_assert_int_eq(err.status, PD_OK);
    ck_assert_uint_eq(gguf_type_row_bytes(GGUF_TENSOR_Q8_0, 33, &err), 0);
    ck_assert_int_eq(err.status, PD_ERR_ARG);
    pd_err_clear(&err);
    ck_assert_uint_eq(gguf_type_row_bytes(GGUF_TENSOR_Q4_K, 256, &err), 144);
    ck_assert_uint_eq(gguf_type_row_bytes(GGUF_TENSOR_Q5_0, 64, &err), 44);
    ck_assert_uint_eq(gguf_type_row_bytes(GGUF_TENSOR_Q6_K, 128, &err), 0);
    ck_assert_int_eq(err.status, PD_ERR_ARG);
    pd_err_clear(&err);
    ck_assert_uint_eq(gguf_type_row_bytes(GGUF_TENSOR_Q2_K, 256, &err), 0);
    ck_assert_int_eq(err.status, PD_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "q2_K"));
    pd_err_clear(&err);
    ck_assert_uint_eq(gguf_type_row_bytes(500, 256, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "unknown(500)"));
}
END_TEST

START_TEST(writer_errors_are_sticky_and_reported_at_write)
{
    gguf_writer *w = gguf_writer_new();
    uint8_t q[34] = {0};
    ck_assert_int_eq(gguf_writer_add_tensor(w, "a", GGUF_TENSOR_Q8_0, 1, (const uint64_t[]){32}, q),
                     PD_OK);
    /* a second "a", a q8_0 row of 16 and an empty key each fail on the spot */
    ck_assert_int_eq(gguf_writer_add_tensor(w, "a", GGUF_TENSOR_Q8_0, 1, (const uint64_t[]){32}, q),
                     PD_ERR_ARG);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "b", GGUF_TENSOR_Q8_0, 1, (const uint64_t[]){16}, q),
                     PD_ERR_ARG);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "c", 31, 1, (const uint64_t[]){32}, q), PD_ERR_ARG);
    ck_assert_int_eq(gguf_writer_add_tensor(w, "d", GGUF_TENSOR_F32, 5,
                                            (const uint64_t[]){1, 1, 1, 1, 1}, q), PD_ERR_ARG);
    ck_assert_int_eq(gguf_writer_set_u32(w, "", 1), PD_ERR_ARG);
    ck_assert_int_eq(gguf_writer_set_arr(w, "x", GGUF_VTYPE_STRING, q, 1), PD_ERR_ARG);
    ck_assert_int_eq(gguf_writer_set_arr(w, "x", GGUF_VTYPE_BOOL, (const uint8_t[]){2}, 1),
                     PD_ERR_ARG);
    gguf_writer_check(w);
    /* the first failure is what write reports */
    pd_err err = {0};
    void *buf = NULL;
    size_t len = 0;
    ck_assert_int_eq(gguf_writer_to_mem(w, &buf, &len, &err), PD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(err.msg, "tensor 'a' was already added"));
    ck_assert_ptr_null(buf);
    gguf_writer_free(w);
    gguf_writer_free(NULL);
    gguf_close(NULL);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("gguf");
    TCase *tc = tcase_create("roundtrip");
    tcase_add_test(tc, roundtrip_every_kv_type);
    tcase_add_test(tc, roundtrip_every_tensor_type);
    tcase_add_test(tc, golden_bytes_read_and_reproduced_by_writer);
    tcase_add_test(tc, writer_is_deterministic_and_set_replaces_in_place);
    tcase_add_test(tc, writer_file_is_atomic_and_mmap_reads_it);
    tcase_add_test(tc, released_bytes_leave_the_resident_set_and_read_back_the_same);
    tcase_add_test(tc, files_without_tensors_or_kvs_are_valid);
    suite_add_tcase(s, tc);

    TCase *neg = tcase_create("hostile");
    tcase_set_timeout(neg, 60);
    tcase_add_test(neg, truncation_at_every_offset_is_refused_with_an_offset);
    tcase_add_test(neg, byte_flips_are_refused_or_parse_validly);
    tcase_add_test(neg, versions_1_and_4_and_bad_magic_are_refused);
    tcase_add_test(neg, huge_counts_are_refused_before_allocation);
    tcase_add_test(neg, bad_tensor_shapes_and_types_are_refused);
    tcase_add_test(neg, misaligned_and_overlapping_tensors_are_refused);
    tcase_add_test(neg, bad_alignment_is_refused);
    tcase_add_test(neg, duplicate_keys_and_tensor_names_are_refused);
    tcase_add_test(neg, bad_values_are_refused);
    tcase_add_test(neg, long_tensor_name_is_refused);
    suite_add_tcase(s, neg);

    TCase *api = tcase_create("api");
    tcase_add_test(api, getters_convert_fitting_integers_and_refuse_others);
    tcase_add_test(api, string_array_index_is_direct_and_bounded);
    tcase_add_test(api, type_names_and_row_bytes);
    tcase_add_test(api, writer_errors_are_sticky_and_reported_at_write);
    suite_add_tcase(s, api);
    return s;
}
