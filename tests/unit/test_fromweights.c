/* Tests for cluster/cli/fromweights.h: a weights directory becomes a GGUF the
 * model loader reads (hyperparameters, byte vocabulary, OCR keys), and every
 * bad config field, shape, value or missing file is refused by name without
 * writing the output. */
#define _XOPEN_SOURCE 700
#include <ftw.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/cli/fromweights.h"
#include "cluster/cli/ocrmeta.h"
#include "cluster/format/npy.h"
#include "cluster/model/model.h"
#include "pd_test.h"

static char dir[64], out[128];
enum { H = 8, F = 16, V = FROMWEIGHTS_VOCAB };

static void put_text(const char *name, const char *s)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(s, f);
    fclose(f);
}

static void put_npy(const char *name, uint64_t rows, uint64_t cols, float fill)
{
    char p[256];
    snprintf(p, sizeof p, "%s/%s.npy", dir, name);
    float *v = malloc(rows * cols * sizeof *v);
    for (uint64_t i = 0; i < rows * cols; i++)
        v[i] = fill + 0.001f * (float)(i % 7);
    pd_err e = {0};
    ck_assert_int_eq(npy_write_f32(p, rows, cols, v, &e), PD_OK);
    free(v);
}

static const char *CONFIG = "{\"arch\":\"llama\",\"layers\":1,\"hidden\":8,\"heads\":2,\"kv_heads\":2,\"ffn\":16,"
                            "\"ctx\":512,\"rope_base\":10000.0,\"rms_eps\":1e-5,\"vocab\":\"bytes\","
                            "\"ocr_cells\":32,\"ocr_prompt\":[79,67,82,58]}";

static void rm_rf(void);
static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(p);
}
static void rm_rf(void)
{
    nftw(dir, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
}

static void setup(void)
{
    snprintf(dir, sizeof dir, "/tmp/pd_test_fw_XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(out, sizeof out, "%s.gguf", dir);
    put_text("config.json", CONFIG);
    put_npy("token_embd.weight", V, H, 0.1f);
    put_npy("blk.0.attn_norm.weight", 1, H, 1.0f);
    put_npy("blk.0.attn_q.weight", H, H, 0.1f);
    put_npy("blk.0.attn_k.weight", H, H, 0.1f);
    put_npy("blk.0.attn_v.weight", H, H, 0.1f);
    put_npy("blk.0.attn_output.weight", H, H, 0.1f);
    put_npy("blk.0.ffn_norm.weight", 1, H, 1.0f);
    put_npy("blk.0.ffn_gate.weight", F, H, 0.1f);
    put_npy("blk.0.ffn_up.weight", F, H, 0.1f);
    put_npy("blk.0.ffn_down.weight", H, F, 0.1f);
    put_npy("output_norm.weight", 1, H, 1.0f);
    put_npy("output.weight", V, H, 0.1f);
}

static void teardown(void)
{
    rm_rf();
    unlink(out);
}

START_TEST(fromweights_writes_a_model_the_loader_reads)
{
    pd_err e = {0};
    ck_assert_msg(fromweights_write(dir, 1, out, &e) == PD_OK, "%s", e.msg);
    model_hparams hp;
    ck_assert_msg(model_read_hparams(out, &hp, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(hp.hidden, H);
    ck_assert_uint_eq(hp.vocab, V);
    ck_assert_uint_eq(hp.bos, FROMWEIGHTS_BOS);
    ck_assert_uint_eq(hp.eos, FROMWEIGHTS_EOS);
    ck_assert_int_eq(hp.vocab_kind, MODEL_VOCAB_GPT2);
    ck_assert_int_eq(hp.tied_output, 0);
    model_load_opts lo = {.all_layers = 1, .want_embed = 1, .want_output = 1};
    model *m = NULL;
    ck_assert_msg(model_load(out, &lo, &m, &e) == PD_OK, "%s", e.msg);
    const char *s;
    size_t len;
    ck_assert_int_eq(model_token(m, 'A', &s, &len, &e), PD_OK);
    ck_assert_uint_eq(len, 1);
    ck_assert_int_eq(s[0], 'A');
    model_free(m);
    ocrmeta om;
    ck_assert_msg(ocrmeta_read(out, &om, &e) == PD_OK, "%s", e.msg);
    ck_assert_uint_eq(om.cells, 32);
    ck_assert_uint_eq(om.n_prompt, 4);
    ck_assert_uint_eq(om.prompt[0], 'O');
}
END_TEST

static void refused(const char *needle)
{
    pd_err e = {0};
    ck_assert_int_ne(fromweights_write(dir, 1, out, &e), PD_OK);
    ck_assert_msg(strstr(e.msg, needle), "'%s' lacks '%s'", e.msg, needle);
    ck_assert_int_ne(access(out, F_OK), 0); /* nothing written */
}

START_TEST(fromweights_refuses_a_wrong_shape_naming_the_file)
{
    put_npy("blk.0.ffn_down.weight", F, H, 0.1f);
    refused("blk.0.ffn_down.weight.npy: shape [16, 8], the config needs [8, 16]");
}
END_TEST

START_TEST(fromweights_refuses_a_missing_tensor_and_non_finite_values)
{
    char p[256];
    snprintf(p, sizeof p, "%s/output.weight.npy", dir);
    unlink(p);
    refused("output.weight.npy");
    put_npy("output.weight", V, H, NAN);
    refused("element 0 is not finite");
}
END_TEST

START_TEST(fromweights_refuses_bad_config_fields_by_name)
{
    put_text("config.json", "[1]");
    refused("not a JSON object");
    put_text("config.json", "{\"arch\":\"qwen2\"}");
    refused("\"arch\" must be \"llama\"");
    put_text("config.json", "{\"arch\":\"llama\",\"vocab\":\"bytes\",\"layers\":1}");
    refused("\"hidden\" must be an integer");
    put_text("config.json", "{\"arch\":\"llama\",\"vocab\":\"bytes\",\"layers\":1,\"hidden\":8,\"heads\":3,"
                            "\"kv_heads\":3,\"ffn\":16,\"ctx\":512,\"ocr_cells\":32,\"rope_base\":10000,"
                            "\"rms_eps\":1e-5,\"ocr_prompt\":[]}");
    refused("must split into heads 3");
    put_text("config.json", "{\"arch\":\"llama\",\"vocab\":\"bytes\",\"layers\":1,\"hidden\":8,\"heads\":2,"
                            "\"kv_heads\":2,\"ffn\":16,\"ctx\":512,\"ocr_cells\":32,\"rope_base\":10000,"
                            "\"rms_eps\":1e-5,\"ocr_prompt\":[79,300]}");
    refused("ocr_prompt[1] is not a token id");
    put_text("config.json", "{\"arch\":\"llama\",\"vocab\":\"bytes\",\"layers\":1,\"hidden\":8,\"heads\":2,"
                            "\"kv_heads\":2,\"ffn\":16,\"ctx\":512,\"ocr_cells\":32,\"rope_base\":1,"
                            "\"rms_eps\":1e-5,\"ocr_prompt\":[]}");
    refused("\"rope_base\" must be a number");
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("fromweights");
    TCase *tc = tcase_create("fromweights");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, fromweights_writes_a_model_the_loader_reads);
    tcase_add_test(tc, fromweights_refuses_a_wrong_shape_naming_the_file);
    tcase_add_test(tc, fromweights_refuses_a_missing_tensor_and_non_finite_values);
    tcase_add_test(tc, fromweights_refuses_bad_config_fields_by_name);
    suite_add_tcase(s, tc);
    return s;
}
