/* Tests for cluster/cli/fromweights.h: a weights directory becomes a GGUF the
 * model loader reads (hyperparameters, byte vocabulary, OCR keys), and every
 * bad config field, shape, value or missing file is refused by name without
 * writing the output. */
#define _XOPEN_SOURCE 700
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster/cli/fromweights.h"
#include "cluster/cli/ocrmeta.h"
#include "cluster/format/gguf.h"
#include "cluster/format/npy.h"
#include "cluster/format/tokenizer.h"
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

/* deepseek: layer 0 dense, layer 1 a mixture of E experts (top K) of width
 * FE, one shared expert */
enum { E = 4, K = 2, FE = 6 };
static const char *MOE_CONFIG =
    "{\"arch\":\"deepseek\",\"layers\":2,\"hidden\":8,\"heads\":2,\"kv_heads\":2,\"ffn\":16,"
    "\"ctx\":512,\"rope_base\":10000.0,\"rms_eps\":1e-5,\"vocab\":\"bytes\","
    "\"ocr_cells\":32,\"ocr_prompt\":[79,67,82,58],\"dense_layers\":1,\"experts\":4,\"experts_used\":2,"
    "\"expert_ffn\":6,\"shared_experts\":1,\"expert_gating\":\"softmax\",\"expert_weights_norm\":false,"
    "\"expert_weights_scale\":1.0}";

static void put_moe(void)
{
    put_text("config.json", MOE_CONFIG);
    put_npy("blk.1.attn_norm.weight", 1, H, 1.0f);
    put_npy("blk.1.attn_q.weight", H, H, 0.1f);
    put_npy("blk.1.attn_k.weight", H, H, 0.1f);
    put_npy("blk.1.attn_v.weight", H, H, 0.1f);
    put_npy("blk.1.attn_output.weight", H, H, 0.1f);
    put_npy("blk.1.ffn_norm.weight", 1, H, 1.0f);
    put_npy("blk.1.ffn_gate_inp.weight", E, H, 0.1f);
    put_npy("blk.1.ffn_gate_exps.weight", E * FE, H, 0.1f);
    put_npy("blk.1.ffn_up_exps.weight", E * FE, H, 0.1f);
    put_npy("blk.1.ffn_down_exps.weight", E * H, FE, 0.1f);
    put_npy("blk.1.ffn_gate_shexp.weight", FE, H, 0.1f);
    put_npy("blk.1.ffn_up_shexp.weight", FE, H, 0.1f);
    put_npy("blk.1.ffn_down_shexp.weight", H, FE, 0.1f);
}

static void setup(void)
{
    pd_test_tmpdir(dir, sizeof dir, "fw");
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
    pd_test_rmtree(dir);
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
    refused("\"arch\" must be \"llama\", \"deepseek\" or \"deepseek2-ocr\"");
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
    /* a duplicate key: Python's json takes the last, cJSON the first */
    put_text("config.json", "{\"arch\":\"llama\",\"vocab\":\"bytes\",\"layers\":1,\"hidden\":8,\"heads\":2,"
                            "\"kv_heads\":2,\"ffn\":16,\"ctx\":512,\"ocr_cells\":32,\"rope_base\":10000,"
                            "\"rms_eps\":1e-5,\"ocr_prompt\":[],\"hidden\":16}");
    refused("key \"hidden\" appears more than once");
    /* more cells than the context holds (BOS + 512 cells + 2 prompt tokens > 512) */
    put_text("config.json", "{\"arch\":\"llama\",\"vocab\":\"bytes\",\"layers\":1,\"hidden\":8,\"heads\":2,"
                            "\"kv_heads\":2,\"ffn\":16,\"ctx\":512,\"ocr_cells\":512,\"rope_base\":10000,"
                            "\"rms_eps\":1e-5,\"ocr_prompt\":[79,67]}");
    refused("\"ocr_cells\" 512: a page (BOS, 512 cells, 2 prompt tokens) would not fit the context of 512");
    /* exactly fitting is fine: 1 + 509 + 2 = 512 */
    put_text("config.json", "{\"arch\":\"llama\",\"vocab\":\"bytes\",\"layers\":1,\"hidden\":8,\"heads\":2,"
                            "\"kv_heads\":2,\"ffn\":16,\"ctx\":512,\"ocr_cells\":509,\"rope_base\":10000,"
                            "\"rms_eps\":1e-5,\"ocr_prompt\":[79,67]}");
    pd_err e = {0};
    ck_assert_msg(fromweights_write(dir, 1, out, &e) == PD_OK, "%s", e.msg);
}
END_TEST

START_TEST(fromweights_writes_a_deepseek_moe_the_loader_runs)
{
    put_moe();
    pd_err e = {0};
    ck_assert_msg(fromweights_write(dir, 1, out, &e) == PD_OK, "%s", e.msg);
    model_hparams hp;
    ck_assert_msg(model_read_hparams(out, &hp, &e) == PD_OK, "%s", e.msg);
    ck_assert_int_eq(hp.arch, MODEL_ARCH_DEEPSEEK);
    ck_assert_uint_eq(hp.n_layers, 2);
    ck_assert_uint_eq(hp.n_dense_lead, 1);
    ck_assert_uint_eq(hp.n_expert, E);
    ck_assert_uint_eq(hp.n_expert_used, K);
    ck_assert_uint_eq(hp.n_expert_shared, 1);
    ck_assert_uint_eq(hp.ffn_exp, FE);
    ck_assert(hp.expert_weights_scale == 1.0f);
    ck_assert_uint_eq(hp.eos, FROMWEIGHTS_EOS);
    model_load_opts lo = {.all_layers = 1, .want_embed = 1, .want_output = 1};
    model *m = NULL;
    ck_assert_msg(model_load(out, &lo, &m, &e) == PD_OK, "%s", e.msg);
    const model_layer *l0 = model_layer_get(m, 0), *l1 = model_layer_get(m, 1);
    ck_assert_int_eq(l0->ffn, MODEL_FFN_SWIGLU);
    ck_assert_int_eq(l1->ffn, MODEL_FFN_MOE);
    model_free(m);
}
END_TEST

START_TEST(fromweights_writes_deepseek2_ocr_as_llama_cpp_converter_does)
{
    put_moe();
    char cfg[1024];
    const char *rest = strchr(MOE_CONFIG, ',');
    snprintf(cfg, sizeof cfg, "{\"arch\":\"deepseek2-ocr\"%s", rest);
    put_text("config.json", cfg);
    pd_err e = {0};
    ck_assert_msg(fromweights_write(dir, 0, out, &e) == PD_OK, "%s", e.msg);
    model_hparams hp;
    ck_assert_msg(model_read_hparams(out, &hp, &e) == PD_OK, "%s", e.msg);
    ck_assert_int_eq(hp.arch, MODEL_ARCH_DEEPSEEK2_OCR);
    ck_assert_int_eq(hp.rope, MODEL_ROPE_NEOX);
    ck_assert_uint_eq(hp.n_expert, E);
    gguf_file *f = NULL;
    ck_assert_msg(gguf_open(out, &f, &e) == PD_OK, "%s", e.msg);
    uint32_t v = 0, rd = 9, gate = 0;
    ck_assert_int_eq(gguf_get_u32(f, "deepseek2-ocr.vocab_size", &v, &e), PD_OK);
    ck_assert_int_eq(gguf_get_u32(f, "deepseek2-ocr.rope.dimension_count", &rd, &e), PD_OK);
    ck_assert_int_eq(gguf_get_u32(f, "deepseek2-ocr.expert_gating_func", &gate, &e), PD_OK);
    ck_assert_uint_eq(v, FROMWEIGHTS_VOCAB);
    ck_assert_uint_eq(rd, 0);
    ck_assert_uint_eq(gate, 1);
    gguf_close(f);
    /* deepseek2-ocr is MHA */
    snprintf(cfg, sizeof cfg, "{\"arch\":\"deepseek2-ocr\"%s", rest);
    char *kv = strstr(cfg, "\"kv_heads\":2");
    ck_assert_ptr_nonnull(kv);
    kv[11] = '1';
    put_text("config.json", cfg);
    ck_assert_int_ne(fromweights_write(dir, 0, out, &e), PD_OK);
    ck_assert_msg(strstr(e.msg, "deepseek2-ocr is MHA: kv_heads 1 must equal heads 2"), "%s", e.msg);
}
END_TEST

/* --to-ocr: a deepseek file's q and k rows reordered per head from
 * adjacent pairs to halves (new i <- old 2i, new i + d/2 <- old 2i + 1),
 * every other tensor byte copied, the keys renamed */
START_TEST(fromweights_to_ocr_reorders_q_and_k_rows_per_head)
{
    put_moe();
    pd_err e = {0};
    ck_assert_msg(fromweights_write(dir, 0, out, &e) == PD_OK, "%s", e.msg);
    char conv[300];
    snprintf(conv, sizeof conv, "%s.ocr.gguf", dir);
    ck_assert_msg(fromweights_to_ocr(out, conv, &e) == PD_OK, "%s", e.msg);
    gguf_file *a = NULL, *b = NULL;
    ck_assert_msg(gguf_open(out, &a, &e) == PD_OK, "%s", e.msg);
    ck_assert_msg(gguf_open(conv, &b, &e) == PD_OK, "%s", e.msg);
    const char *arch;
    size_t len;
    ck_assert_int_eq(gguf_get_str(b, "general.architecture", &arch, &len, &e), PD_OK);
    ck_assert_str_eq(arch, "deepseek2-ocr");
    uint32_t n = 0;
    ck_assert_int_eq(gguf_get_u32(b, "deepseek2-ocr.expert_count", &n, &e), PD_OK);
    ck_assert_uint_eq(n, E);
    ck_assert_int_lt(gguf_find_key(b, "deepseek.expert_count"), 0);
    ck_assert_uint_eq(gguf_tensor_count(a), gguf_tensor_count(b));
    const uint64_t hd = H / 2; /* 2 heads */
    for (uint64_t i = 0; i < gguf_tensor_count(a); i++) {
        const gguf_tensor *ta = gguf_tensor_at(a, i), *tb = gguf_tensor_find(b, ta->name);
        ck_assert_ptr_nonnull(tb);
        ck_assert_uint_eq(ta->bytes, tb->bytes);
        int qk = strstr(ta->name, ".attn_q.") || strstr(ta->name, ".attn_k.");
        if (!qk) {
            ck_assert_msg(memcmp(ta->data, tb->data, ta->bytes) == 0, "%s changed", ta->name);
            continue;
        }
        const float *x = ta->data, *y = tb->data;
        for (uint64_t r = 0; r < ta->ne[1]; r++) {
            uint64_t h = r / hd, j = r % hd;
            uint64_t src = h * hd + (j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1);
            ck_assert_msg(memcmp(y + r * ta->ne[0], x + src * ta->ne[0], ta->ne[0] * sizeof(float)) == 0,
                          "%s row %llu is not old row %llu", ta->name, (unsigned long long)r, (unsigned long long)src);
        }
    }
    gguf_close(a);
    gguf_close(b);
    /* its own output is not a deepseek file */
    ck_assert_int_ne(fromweights_to_ocr(conv, out, &e), PD_OK);
    ck_assert_msg(strstr(e.msg, "\"deepseek2-ocr\"; --to-ocr converts deepseek files"), "%s", e.msg);
    unlink(conv);
}
END_TEST

START_TEST(fromweights_refuses_a_missing_or_misshapen_expert_tensor_by_name)
{
    put_moe();
    char p[256];
    snprintf(p, sizeof p, "%s/blk.1.ffn_up_exps.weight.npy", dir);
    unlink(p);
    refused("blk.1.ffn_up_exps.weight.npy");
    put_npy("blk.1.ffn_up_exps.weight", FE, H, 0.1f); /* one expert, not the stack of 4 */
    refused("blk.1.ffn_up_exps.weight.npy: shape [6, 8], the config needs [24, 8] (4 experts of [6, 8]");
    put_npy("blk.1.ffn_up_exps.weight", E * FE, H, 0.1f);
    put_npy("blk.1.ffn_gate_inp.weight", E + 1, H, 0.1f);
    refused("blk.1.ffn_gate_inp.weight.npy: shape [5, 8], the config needs [4, 8]");
    put_npy("blk.1.ffn_gate_inp.weight", E, H, 0.1f);
    snprintf(p, sizeof p, "%s/blk.1.ffn_down_shexp.weight.npy", dir);
    unlink(p);
    refused("blk.1.ffn_down_shexp.weight.npy");
}
END_TEST

/* MOE_CONFIG with the text `from` replaced by `to` */
static void put_moe_config_with(const char *from, const char *to)
{
    char buf[1024];
    const char *at = strstr(MOE_CONFIG, from);
    ck_assert_ptr_nonnull(at);
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - MOE_CONFIG), MOE_CONFIG, to, at + strlen(from));
    put_text("config.json", buf);
}

START_TEST(fromweights_refuses_bad_deepseek_fields_by_name)
{
    put_moe();
    put_moe_config_with("\"experts_used\":2", "\"experts_used\":5");
    refused("\"experts_used\" must be an integer in 1..4");
    put_moe_config_with("\"dense_layers\":1", "\"dense_layers\":3");
    refused("\"dense_layers\" must be an integer in 0..2");
    put_moe_config_with("\"experts\":4,", "");
    refused("\"experts\" must be an integer");
    put_moe_config_with("\"expert_ffn\":6", "\"expert_ffn\":0");
    refused("\"expert_ffn\" must be an integer");
    put_moe_config_with("\"shared_experts\":1", "\"shared_experts\":0");
    refused("\"shared_experts\" must be an integer");
    put_moe_config_with("\"softmax\"", "\"sigmoid\"");
    refused("\"expert_gating\" must be \"softmax\"");
    put_moe_config_with("\"expert_weights_norm\":false", "\"expert_weights_norm\":true");
    refused("\"expert_weights_norm\" must be false");
    put_moe_config_with("\"expert_weights_scale\":1.0", "\"expert_weights_scale\":2.5");
    refused("\"expert_weights_scale\" must be 1");
}
END_TEST

/* The byte vocabulary carries (empty) merges and a pre-tokenizer, so text
 * tokenizes to its bytes: a {"text": ...} prompt is the ids it was trained
 * on, and llama.cpp loads the file. */
START_TEST(fromweights_vocab_tokenizes_text_to_its_bytes)
{
    pd_err e = {0};
    ck_assert_msg(fromweights_write(dir, 1, out, &e) == PD_OK, "%s", e.msg);
    gguf_file *f = NULL;
    ck_assert_msg(gguf_open(out, &f, &e) == PD_OK, "%s", e.msg);
    gguf_vtype et;
    uint64_t n = 99;
    ck_assert_int_eq(gguf_get_arr(f, "tokenizer.ggml.merges", &et, &n, NULL, &e), PD_OK);
    ck_assert_int_eq(et, GGUF_VTYPE_STRING);
    ck_assert_uint_eq(n, 0);
    const char *pre;
    ck_assert_int_eq(gguf_get_str(f, "tokenizer.ggml.pre", &pre, NULL, &e), PD_OK);
    ck_assert_str_eq(pre, "default");
    tok *t = NULL;
    ck_assert_msg(tok_new_gguf(f, &t, &e) == PD_OK, "%s", e.msg);
    const char text[] = "OCR: it's 42 \"x\"\n\xc3\xa9!<|bos|>";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    tok_opts o = {.add_special = true, .parse_special = true};
    ck_assert_msg(tok_encode(t, text, strlen(text), o, &ids, &n_ids, &e) == PD_OK, "%s", e.msg);
    size_t nb = strlen(text) - strlen("<|bos|>");
    ck_assert_uint_eq(n_ids, nb + 1); /* no BOS added (gpt2 "default"), the special parsed */
    for (size_t i = 0; i < nb; i++)
        ck_assert_int_eq(ids[i], (unsigned char)text[i]);
    ck_assert_int_eq(ids[nb], FROMWEIGHTS_BOS);
    free(ids);
    tok_free(t);
    gguf_close(f);
}
END_TEST

/* --revocab on a file that already has today's vocabulary gives the same
 * bytes: the key order and every tensor are kept. */
START_TEST(fromweights_revocab_keeps_every_other_key_and_tensor)
{
    pd_err e = {0};
    put_moe();
    ck_assert_msg(fromweights_write(dir, 1, out, &e) == PD_OK, "%s", e.msg);
    char again[160];
    snprintf(again, sizeof again, "%s.again.gguf", dir);
    ck_assert_msg(fromweights_revocab(out, again, &e) == PD_OK, "%s", e.msg);
    FILE *a = fopen(out, "rb"), *b = fopen(again, "rb");
    ck_assert_ptr_nonnull(a);
    ck_assert_ptr_nonnull(b);
    int ca, cb;
    size_t off = 0;
    do {
        ca = fgetc(a);
        cb = fgetc(b);
        ck_assert_msg(ca == cb, "byte %zu differs", off);
        off++;
    } while (ca != EOF);
    fclose(a);
    fclose(b);
    unlink(again);
}
END_TEST

START_TEST(fromweights_revocab_refuses_another_vocabulary)
{
    pd_err e = {0};
    gguf_writer *w = gguf_writer_new();
    const char *toks[3] = {"a", "b", "c"};
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", toks, 3);
    ck_assert_msg(gguf_writer_write(w, out, &e) == PD_OK, "%s", e.msg);
    gguf_writer_free(w);
    char o2[160];
    snprintf(o2, sizeof o2, "%s.o2.gguf", dir);
    ck_assert_int_eq(fromweights_revocab(out, o2, &e), PD_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(e.msg, "not a byte-vocabulary model"));
    ck_assert_int_eq(access(o2, F_OK), -1);
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
    tcase_add_test(tc, fromweights_writes_a_deepseek_moe_the_loader_runs);
    tcase_add_test(tc, fromweights_writes_deepseek2_ocr_as_llama_cpp_converter_does);
    tcase_add_test(tc, fromweights_to_ocr_reorders_q_and_k_rows_per_head);
    tcase_add_test(tc, fromweights_refuses_a_missing_or_misshapen_expert_tensor_by_name);
    tcase_add_test(tc, fromweights_refuses_bad_deepseek_fields_by_name);
    tcase_add_test(tc, fromweights_vocab_tokenizes_text_to_its_bytes);
    tcase_add_test(tc, fromweights_revocab_keeps_every_other_key_and_tensor);
    tcase_add_test(tc, fromweights_revocab_refuses_another_vocabulary);
    suite_add_tcase(s, tc);
    return s;
}
