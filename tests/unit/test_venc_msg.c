/* venc_msg: the head <-> encoder-rank messages round-trip exactly, and every
 * truncation, flipped bit and huge count of a reply is refused with the
 * offset and field (never a crash, never rows of another width). */
#include <stdlib.h>
#include <string.h>

#include "cluster/vision/venc.h"
#include "pd_test.h"

enum { W = 8 };

static venc_out sample_out(void)
{
    venc_out o = {0};
    o.n_pieces = 3;
    o.pieces = calloc(3, sizeof *o.pieces);
    pd_rng r = {7};
    for (int k = 0; k < 3; k++) {
        venc_piece *p = &o.pieces[k];
        p->image = k < 2;
        p->n = k == 2 ? 2 : 5 + (uint32_t)k;
        if (p->image) {
            p->rows = malloc((size_t)p->n * W * sizeof *p->rows);
            pd_rng_fill(&r, p->rows, (size_t)p->n * W, -3, 3);
        } else {
            p->tokens = malloc(p->n * sizeof *p->tokens);
            p->tokens[0] = 12;
            p->tokens[1] = 100000;
        }
        o.rows += p->n;
    }
    return o;
}

START_TEST(venc_msg_round_trips)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    pd_err err = {0};
    ck_assert_int_eq(venc_msg_request(VENC_MSG_ENCODE, 42, "img/p7.png", &buf, &len, &err), PD_OK);
    uint32_t kind;
    uint64_t id;
    const char *path;
    size_t pl;
    ck_assert_int_eq(venc_msg_parse_request(buf, len, &kind, &id, &path, &pl, &err), PD_OK);
    ck_assert_uint_eq(kind, VENC_MSG_ENCODE);
    ck_assert_uint_eq(id, 42);
    ck_assert_uint_eq(pl, 10);
    ck_assert_int_eq(memcmp(path, "img/p7.png", 10), 0);
    free(buf);
    venc_out o = sample_out();
    ck_assert_int_eq(venc_msg_reply(9, PD_OK, NULL, &o, W, &buf, &len, &err), PD_OK);
    venc_out back;
    pd_err why = {0};
    ck_assert_int_eq(venc_msg_parse_reply(buf, len, W, &id, &back, &why, &err), PD_OK);
    ck_assert_uint_eq(id, 9);
    ck_assert_int_eq(why.status, PD_OK);
    ck_assert_uint_eq(back.n_pieces, 3);
    ck_assert_uint_eq(back.rows, o.rows);
    for (int k = 0; k < 3; k++) {
        ck_assert_int_eq(back.pieces[k].image, o.pieces[k].image);
        ck_assert_uint_eq(back.pieces[k].n, o.pieces[k].n);
        if (o.pieces[k].image)
            ck_assert_int_eq(memcmp(back.pieces[k].rows, o.pieces[k].rows, (size_t)o.pieces[k].n * W * 4), 0);
        else
            ck_assert_int_eq(memcmp(back.pieces[k].tokens, o.pieces[k].tokens, o.pieces[k].n * 4), 0);
    }
    venc_out_free(&back);
    /* another width: refused, not misread */
    pd_err_clear(&err);
    ck_assert_int_eq(venc_msg_parse_reply(buf, len, W + 1, &id, &back, &why, &err), PD_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(err.msg, "rows 8 wide, this model's are 9"));
    free(buf);
    /* an encoder's refusal travels as its status and message */
    ck_assert_int_eq(venc_msg_reply(10, PD_ERR_FORMAT, "p.png: not an image", NULL, W, &buf, &len, &err), PD_OK);
    ck_assert_int_eq(venc_msg_parse_reply(buf, len, W, &id, &back, &why, &err), PD_OK);
    ck_assert_uint_eq(id, 10);
    ck_assert_int_eq(why.status, PD_ERR_FORMAT);
    ck_assert_str_eq(why.msg, "p.png: not an image");
    ck_assert_uint_eq(back.n_pieces, 0);
    free(buf);
    venc_out_free(&o);
}
END_TEST

START_TEST(venc_msg_every_truncation_and_bit_flip_is_safe)
{
    venc_out o = sample_out();
    uint8_t *buf = NULL;
    size_t len = 0;
    pd_err err = {0};
    ck_assert_int_eq(venc_msg_reply(3, PD_OK, NULL, &o, W, &buf, &len, &err), PD_OK);
    for (size_t cut = 0; cut < len; cut++) {
        uint8_t *b = malloc(cut ? cut : 1);
        memcpy(b, buf, cut);
        venc_out back;
        uint64_t id;
        pd_err why = {0};
        pd_err_clear(&err);
        ck_assert_int_ne(venc_msg_parse_reply(b, cut, W, &id, &back, &why, &err), PD_OK);
        ck_assert_ptr_nonnull(strstr(err.msg, "encoder reply: offset"));
        ck_assert_uint_eq(back.n_pieces, 0);
        free(b);
    }
    size_t flips = 0, refused = 0;
    for (size_t bit = 0; bit < len * 8; bit += 3) {
        uint8_t *b = malloc(len);
        memcpy(b, buf, len);
        b[bit / 8] ^= (uint8_t)(1u << (bit % 8));
        venc_out back;
        uint64_t id;
        pd_err why = {0};
        pd_err_clear(&err);
        pd_status st = venc_msg_parse_reply(b, len, W, &id, &back, &why, &err);
        flips++;
        if (st != PD_OK) {
            refused++;
            ck_assert_uint_gt(strlen(err.msg), 0);
        } else if (why.status == PD_OK) {
            ck_assert_uint_eq(back.rows, o.rows); /* a flipped value, never another shape */
        }
        venc_out_free(&back);
        free(b);
    }
    ck_assert_uint_gt(refused, 0);
    free(buf);
    /* huge counts: refused before any allocation */
    static const uint8_t huge[] = {'P', 'D', 'I', 'R', 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                   W, 0, 0, 0, 0xff, 0xff, 0xff, 0xff};
    venc_out back;
    uint64_t id;
    pd_err why = {0};
    pd_err_clear(&err);
    ck_assert_int_eq(venc_msg_parse_reply(huge, sizeof huge, W, &id, &back, &why, &err), PD_ERR_RANGE);
    ck_assert_str_eq(err.msg, "encoder reply: offset 28: 4294967295 pieces (1..4096)");
    static const uint8_t rows[] = {'P', 'D', 'I', 'R', 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                   W, 0, 0, 0, 1, 0, 0, 0, 1, 0xff, 0xff, 0xff, 0x7f};
    pd_err_clear(&err);
    ck_assert_int_eq(venc_msg_parse_reply(rows, sizeof rows, W, &id, &back, &why, &err), PD_ERR_TRUNCATED);
    ck_assert_ptr_nonnull(strstr(err.msg, "piece rows 2147483647"));
    /* requests */
    static const uint8_t req[] = {'P', 'D', 'I', 'Q', 1, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0, 0};
    uint32_t kind;
    const char *path;
    size_t pl;
    pd_err_clear(&err);
    ck_assert_int_eq(venc_msg_parse_request(req, sizeof req, &kind, &id, &path, &pl, &err), PD_ERR_RANGE);
    ck_assert_str_eq(err.msg, "encoder request: offset 20: path length 65535 (1..4096)");
    venc_out_free(&o);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("venc_msg");
    TCase *tc = tcase_create("venc_msg");
    tcase_add_test(tc, venc_msg_round_trips);
    tcase_add_test(tc, venc_msg_every_truncation_and_bit_flip_is_safe);
    suite_add_tcase(s, tc);
    return s;
}
