/* vision: an mmproj is checked against the decoder from the files alone
 * (mmproj.h), and the encoder says plainly what it needs (venc.h) in builds
 * with and without llama.cpp's mtmd. Encoding itself is pinned against
 * llama.cpp in tests/anchor/mtmd_pages.sh. */
#include <stdio.h>
#include <string.h>

#include "cluster/cli/mkmodel.h"
#include "cluster/format/gguf.h"
#include "cluster/vision/mmproj.h"
#include "cluster/vision/venc.h"
#include "pd_test.h"


/* A decoder of hidden 64 (any architecture: only its hidden size is read). */
static void put_model(const char *path)
{
    mkmodel_opts o;
    mkmodel_defaults(&o);
    o.layers = 1;
    o.hidden = 64;
    o.heads = 2;
    o.kv_heads = 2;
    o.ffn = 96;
    o.vocab = 300;
    pd_err err = {0};
    ck_assert_msg(mkmodel_write(&o, path, &err) == PD_OK, "%s", err.msg);
}

/* An mmproj-like GGUF: the projector type key (NULL: none) and, when fc_out
 * > 0, mm.model.fc.weight [fc_in x fc_out]. */
static void put_mmproj(const char *path, const char *type, uint64_t fc_in, uint64_t fc_out)
{
    gguf_writer *w = gguf_writer_new();
    ck_assert_ptr_nonnull(w);
    ck_assert_int_eq(gguf_writer_set_str(w, "general.architecture", "clip"), PD_OK);
    if (type)
        ck_assert_int_eq(gguf_writer_set_str(w, "clip.projector_type", type), PD_OK);
    if (fc_out) {
        uint64_t ne[2] = {fc_in, fc_out};
        static float zeros[64 * 128];
        ck_assert_uint_le(fc_in * fc_out, sizeof zeros / sizeof zeros[0]);
        ck_assert_int_eq(gguf_writer_add_tensor_copy(w, "mm.model.fc.weight", GGUF_TENSOR_F32, 2, ne, zeros),
                         PD_OK);
    }
    pd_err err = {0};
    ck_assert_msg(gguf_writer_write(w, path, &err) == PD_OK, "%s", err.msg);
    gguf_writer_free(w);
}

START_TEST(mmproj_width_must_equal_the_decoders_hidden_size)
{
    char dec[320], mm[320];
    snprintf(dec, sizeof dec, "%s/dec.gguf", pd_tmpdir);
    snprintf(mm, sizeof mm, "%s/mm.gguf", pd_tmpdir);
    put_model(dec);
    uint32_t width = 0;
    pd_err err = {0};
    put_mmproj(mm, "deepseekocr", 32, 64);
    ck_assert_msg(mmproj_check(mm, dec, &width, &err) == PD_OK, "%s", err.msg);
    ck_assert_uint_eq(width, 64);
    put_mmproj(mm, "deepseekocr2", 32, 64);
    ck_assert_msg(mmproj_check(mm, dec, &width, &err) == PD_OK, "%s", err.msg);
    put_mmproj(mm, "deepseekocr", 32, 128);
    ck_assert_int_eq(mmproj_check(mm, dec, &width, &err), PD_ERR_MISMATCH);
    char want[900];
    snprintf(want, sizeof want, "the mmproj %s makes rows 128 wide (mm.model.fc.weight), the model "
             "%s has hidden size 64", mm, dec);
    ck_assert_str_eq(err.msg, want);
    pd_err_clear(&err);
    put_mmproj(mm, "qwen2vl", 32, 64);
    ck_assert_int_eq(mmproj_check(mm, dec, &width, &err), PD_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "projector type \"qwen2vl\": pipedec reads DeepSeek-OCR's"));
    pd_err_clear(&err);
    put_mmproj(mm, "deepseekocr", 0, 0);
    ck_assert_int_eq(mmproj_check(mm, dec, &width, &err), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "tensor mm.model.fc.weight is missing"));
    pd_err_clear(&err);
    put_mmproj(mm, NULL, 32, 64);
    ck_assert_int_eq(mmproj_check(mm, dec, &width, &err), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "no clip.projector_type: not an mmproj file"));
    /* the decoder given as the mmproj: not an mmproj */
    pd_err_clear(&err);
    ck_assert_int_eq(mmproj_check(dec, dec, &width, &err), PD_ERR_FORMAT);
    pd_err_clear(&err);
    snprintf(mm, sizeof mm, "%s/none.gguf", pd_tmpdir);
    ck_assert_int_eq(mmproj_check(mm, dec, &width, &err), PD_ERR_IO);
    ck_assert_uint_eq(width, 64);
}
END_TEST

/* mmproj_describe: what inspect shows, from the header; a file pipedec
 * cannot use is still described, with the reason. */
START_TEST(mmproj_describe_reads_the_header_and_says_why_not)
{
    char dec[320], mm[320];
    snprintf(dec, sizeof dec, "%s/dec.gguf", pd_tmpdir);
    snprintf(mm, sizeof mm, "%s/mm.gguf", pd_tmpdir);
    put_model(dec);
    gguf_file *f = NULL;
    pd_err err = {0};
    mmproj_info m;
    ck_assert_int_eq(gguf_open(dec, &f, &err), PD_OK);
    ck_assert(!mmproj_is(f)); /* a decoder */
    gguf_close(f);

    put_mmproj(mm, "deepseekocr2", 32, 64);
    ck_assert_int_eq(gguf_open(mm, &f, &err), PD_OK);
    ck_assert(mmproj_is(f));
    ck_assert_msg(mmproj_describe(f, mm, &m, &err) == PD_OK, "%s", err.msg);
    ck_assert_str_eq(m.projector, "deepseekocr2");
    ck_assert(m.known);
    ck_assert_uint_eq(m.width, 64);
    ck_assert_uint_eq(m.fc_in, 32);
    ck_assert_uint_eq(m.image_size, 0); /* absent keys read as 0 */
    gguf_close(f);

    put_mmproj(mm, "qwen2vl", 32, 48);
    ck_assert_int_eq(gguf_open(mm, &f, &err), PD_OK);
    ck_assert_int_eq(mmproj_describe(f, mm, &m, &err), PD_ERR_UNSUPPORTED);
    ck_assert_str_eq(m.projector, "qwen2vl");
    ck_assert(!m.known);
    ck_assert_uint_eq(m.width, 48);
    gguf_close(f);

    pd_err_clear(&err);
    put_mmproj(mm, NULL, 32, 64); /* general.architecture clip, no projector type */
    ck_assert_int_eq(gguf_open(mm, &f, &err), PD_OK);
    ck_assert(mmproj_is(f));
    ck_assert_int_eq(mmproj_describe(f, mm, &m, &err), PD_ERR_FORMAT);
    ck_assert_str_eq(m.projector, "");
    ck_assert_ptr_nonnull(strstr(err.msg, "no clip.projector_type"));
    gguf_close(f);
}
END_TEST

START_TEST(venc_says_what_it_needs)
{
    char dec[320], mm[320];
    snprintf(dec, sizeof dec, "%s/dec.gguf", pd_tmpdir);
    snprintf(mm, sizeof mm, "%s/mm.gguf", pd_tmpdir);
    put_model(dec);
    venc *v = NULL;
    pd_err err = {0};
    venc_opts o = {.mmproj = mm, .model = dec, .threads = 1};
    if (!venc_available()) {
        ck_assert_int_eq(venc_open(&o, &v, &err), PD_ERR_UNSUPPORTED);
        ck_assert_ptr_nonnull(strstr(err.msg, "built without llama.cpp's mtmd: image pages need it"));
        venc_out out;
        pd_err_clear(&err);
        ck_assert_int_eq(venc_image(NULL, "p.png", false, &out, &err), PD_ERR_UNSUPPORTED);
        ck_assert_uint_eq(out.n_pieces, 0);
        return;
    }
    ck_assert_ptr_nonnull(strstr(venc_describe(), "llama.cpp mtmd"));
    /* a missing file is named before llama.cpp sees it */
    ck_assert_int_eq(venc_open(&o, &v, &err), PD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(err.msg, "mm.gguf: cannot open"));
    ck_assert_ptr_null(v);
    /* a width that does not match is refused naming both */
    put_mmproj(mm, "deepseekocr", 32, 128);
    pd_err_clear(&err);
    ck_assert_int_eq(venc_open(&o, &v, &err), PD_ERR_MISMATCH);
    ck_assert_ptr_nonnull(strstr(err.msg, "rows 128 wide"));
    /* a projector file mtmd cannot load: mtmd's own message */
    put_mmproj(mm, "deepseekocr", 32, 64);
    pd_err_clear(&err);
    ck_assert_int_eq(venc_open(&o, &v, &err), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "mm.gguf"));
    ck_assert_ptr_null(v);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("vision");
    TCase *tc = tcase_create("vision");
    tcase_add_checked_fixture(tc, pd_test_dir_setup, pd_test_dir_teardown);
    tcase_add_test(tc, mmproj_width_must_equal_the_decoders_hidden_size);
    tcase_add_test(tc, mmproj_describe_reads_the_header_and_says_why_not);
    tcase_add_test(tc, venc_says_what_it_needs);
    suite_add_tcase(s, tc);
    return s;
}
