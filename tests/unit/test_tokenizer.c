/* Tests for cluster/format/tokenizer.h with small hand-made vocabularies:
 * the pre-tokenizers' splits (deepseek-v3, llama-bpe, qwen2, gpt-2, default,
 * deepseek-llm) as llama.cpp's unicode.cpp makes them, BPE merge order,
 * special tokens, BOS/EOS defaults, SentencePiece with byte fallback, the
 * refusals (invalid UTF-8 and NUL by byte offset, unknown models and
 * pre-tokenizers by name), a GGUF round trip, and a 1 MB word in linear time.
 * The identity with llama.cpp and Hugging Face on a real vocabulary is
 * anchor.tokenizer's job. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/format/gguf.h"
#include "cluster/format/tokenizer.h"
#include "pd_test.h"

#include "base/clock.h"
/* A byte-level vocabulary: ids 0..255 are GPT-2's byte characters (byte b
 * is id b), then extra tokens; merges given by the caller. */
typedef struct bvocab {
    char *tok[600];
    int32_t type[600];
    uint32_t n;
} bvocab;

static void bv_gpt2_char(int b, char *out)
{
    bool pr = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
    uint32_t cp = (uint32_t)b;
    if (!pr) {
        uint32_t k = 0;
        for (int x = 0; x < b; x++)
            if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174))
                k++;
        cp = 256 + k;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xC0 | (cp >> 6));
        out[1] = (char)(0x80 | (cp & 0x3F));
        out[2] = 0;
    }
}

static void bv_init(bvocab *v)
{
    v->n = 0;
    for (int b = 0; b < 256; b++) {
        char c[4];
        bv_gpt2_char(b, c);
        v->tok[v->n] = strdup(c);
        v->type[v->n++] = 1;
    }
}

static int32_t bv_add(bvocab *v, const char *text, int32_t type)
{
    v->tok[v->n] = strdup(text);
    v->type[v->n] = type;
    return (int32_t)v->n++;
}

static void bv_free(bvocab *v)
{
    for (uint32_t i = 0; i < v->n; i++)
        free(v->tok[i]);
}

static tok *bv_tok(bvocab *v, const char *pre, const char *const *merges, uint64_t nm, int add_bos)
{
    tok_desc d = {.model = "gpt2", .pre = pre, .n_tokens = v->n, .tokens = (const char *const *)v->tok,
                  .types = v->type, .n_merges = nm, .merges = merges, .bos = -1, .eos = -1,
                  .unk = -1, .add_bos = add_bos, .add_eos = -1, .add_space_prefix = -1};
    tok *t = NULL;
    pd_err err = {0};
    ck_assert_msg(tok_new(&d, &t, &err) == PD_OK, "%s", err.msg);
    tok_check(t);
    return t;
}

/* The pieces of text as "|"-joined strings. */
static void expect_split(const tok *t, const char *text, const char *want)
{
    size_t *lens = NULL, n = 0;
    pd_err err = {0};
    ck_assert_msg(tok_split(t, text, strlen(text), &lens, &n, &err) == PD_OK, "%s", err.msg);
    char got[4096];
    size_t o = 0, at = 0;
    for (size_t i = 0; i < n; i++) {
        if (i)
            got[o++] = '|';
        memcpy(got + o, text + at, lens[i]);
        o += lens[i];
        at += lens[i];
    }
    got[o] = 0;
    ck_assert_uint_eq(at, strlen(text));
    ck_assert_msg(!strcmp(got, want), "split of \"%s\"\n got  \"%s\"\n want \"%s\"", text, got, want);
    free(lens);
}

static void expect_ids(const tok *t, const char *text, tok_opts o, const int32_t *want, size_t nw)
{
    int32_t *ids = NULL;
    size_t n = 0;
    pd_err err = {0};
    ck_assert_msg(tok_encode(t, text, strlen(text), o, &ids, &n, &err) == PD_OK, "%s", err.msg);
    ck_assert_msg(n == nw, "\"%s\": %zu ids, want %zu", text, n, nw);
    for (size_t i = 0; i < n; i++)
        ck_assert_msg(ids[i] == want[i], "\"%s\": id %zu is %d, want %d", text, i, ids[i], want[i]);
    free(ids);
}

START_TEST(tok_deepseek_v3_splits_as_llama_cpp)
{
    bvocab v;
    bv_init(&v);
    tok *t = bv_tok(&v, "deepseek-v3", NULL, 0, -1);
    ck_assert_int_eq(tok_pre_of(t), TOK_PRE_DEEPSEEK_V3);
    expect_split(t, "Hello world", "Hello| world");
    expect_split(t, "12345 678", "123|45| |678");
    expect_split(t, "  x", " | x");
    expect_split(t, "a\n\nb", "a|\n\n|b");
    expect_split(t, "a \n b", "a| \n| b");
    expect_split(t, "x.Yz", "x|.Yz");
    expect_split(t, "foo(bar)", "foo|(bar|)");
    expect_split(t, "你好world世界", "你好|world|世界");
    expect_split(t, "カタカナとひらがな", "カタカナとひらがな");
    expect_split(t, "hi!!\r\n", "hi|!!\r\n");
    expect_split(t, "end   ", "end|   ");
    expect_split(t, "a\tb", "a|\tb");
    expect_split(t, "é e\xcc\x81", "é| e\xcc\x81");
    expect_split(t, "x\xe2\x80\x8dy", "x|\xe2\x80\x8dy");
    expect_split(t, "٣٤٥٦", "٣٤٥|٦");
    tok_free(t);
    bv_free(&v);
}
END_TEST

START_TEST(tok_other_pre_tokenizers_split_as_llama_cpp)
{
    bvocab v;
    bv_init(&v);
    tok *t = bv_tok(&v, "llama-bpe", NULL, 0, -1);
    expect_split(t, "I'VE 12345 ok!\n\n  x", "I|'VE| |123|45| ok|!\n\n| | x");
    tok_free(t);
    t = bv_tok(&v, "qwen2", NULL, 0, -1);
    expect_split(t, "I'VE 12345 ok", "I|'VE| |1|2|3|4|5| ok");
    tok_free(t);
    t = bv_tok(&v, "gpt-2", NULL, 0, -1);
    expect_split(t, "I've 12345 ok!!  x", "I|'ve| 12345| ok|!!| | x");
    tok_free(t);
    t = bv_tok(&v, "default", NULL, 0, -1);
    expect_split(t, "a+b 12345", "a|+|b| |123|45");
    tok_free(t);
    t = bv_tok(&v, NULL, NULL, 0, -1);
    ck_assert_int_eq(tok_pre_of(t), TOK_PRE_DEFAULT);
    tok_free(t);
    t = bv_tok(&v, "deepseek-llm", NULL, 0, -1);
    expect_split(t, "Hello, world\n12 中文", "Hello|,| world|\n|12| |中文");
    tok_free(t);
    bv_free(&v);
}
END_TEST

START_TEST(tok_bpe_merges_by_rank_then_leftmost)
{
    bvocab v;
    bv_init(&v);
    int32_t aa = bv_add(&v, "aa", 1);
    int32_t ab = bv_add(&v, "ab", 1);
    int32_t aab = bv_add(&v, "aab", 1);
    static const char *const merges[] = {"a b", "a a", "a ab"};
    tok *t = bv_tok(&v, "deepseek-v3", merges, 3, -1);
    tok_opts o = {.parse_special = true};
    /* "ab" (rank 0) first, then "a"+"ab" (rank 2) */
    expect_ids(t, "aab", o, (int32_t[]){aab}, 1);
    /* equal ranks: the leftmost pair merges first */
    expect_ids(t, "aaa", o, (int32_t[]){aa, 'a'}, 2);
    expect_ids(t, "aaaab", o, (int32_t[]){aa, aab}, 2);
    expect_ids(t, "ba", o, (int32_t[]){'b', 'a'}, 2);
    (void)ab;
    tok_free(t);
    bv_free(&v);
}
END_TEST

START_TEST(tok_special_tokens_longest_first_and_parse_special_off)
{
    bvocab v;
    bv_init(&v);
    int32_t img = bv_add(&v, "<image>", 3);
    int32_t imgx = bv_add(&v, "<image>x", 3);
    int32_t user = bv_add(&v, "<u>", 4);
    tok *t = bv_tok(&v, "deepseek-v3", NULL, 0, -1);
    tok_opts o = {.parse_special = true};
    expect_ids(t, "<image>x<image>", o, (int32_t[]){imgx, img}, 2);
    expect_ids(t, "a<u>", o, (int32_t[]){'a', user}, 2);
    /* parse_special off: control tokens are text, user-defined ones still match */
    tok_opts off = {.parse_special = false};
    int32_t want[] = {'<', 'i', 'm', 'a', 'g', 'e', '>', user};
    expect_ids(t, "<image><u>", off, want, 8);
    size_t *lens = NULL, n = 0;
    pd_err err = {0};
    ck_assert_int_eq(tok_split(t, "q<image>\n", 9, &lens, &n, &err), PD_OK);
    ck_assert_uint_eq(n, 3);
    ck_assert_uint_eq(lens[1], 7);
    free(lens);
    tok_free(t);
    bv_free(&v);
}
END_TEST

START_TEST(tok_bos_eos_follow_the_model_and_its_defaults)
{
    bvocab v;
    bv_init(&v);
    int32_t bos = bv_add(&v, "<s>", 3), eos = bv_add(&v, "</s>", 3);
    tok_desc d = {.model = "gpt2", .pre = "deepseek-v3", .n_tokens = v.n,
                  .tokens = (const char *const *)v.tok, .types = v.type, .bos = bos, .eos = eos,
                  .unk = -1, .add_bos = -1, .add_eos = -1, .add_space_prefix = -1};
    tok *t = NULL;
    pd_err err = {0};
    ck_assert_int_eq(tok_new(&d, &t, &err), PD_OK);
    ck_assert(!tok_adds_bos(t) && !tok_adds_eos(t)); /* gpt2: no BOS by default */
    expect_ids(t, "a", (tok_opts){.add_special = true}, (int32_t[]){'a'}, 1);
    tok_free(t);
    d.pre = "llama-bpe";
    ck_assert_int_eq(tok_new(&d, &t, &err), PD_OK);
    ck_assert(tok_adds_bos(t)); /* llama.cpp: llama-bpe adds BOS */
    tok_free(t);
    d.pre = "deepseek-v3";
    d.add_bos = 1;
    d.add_eos = 1;
    ck_assert_int_eq(tok_new(&d, &t, &err), PD_OK);
    expect_ids(t, "a", (tok_opts){.add_special = true}, (int32_t[]){bos, 'a', eos}, 3);
    expect_ids(t, "a", (tok_opts){.add_special = false}, (int32_t[]){'a'}, 1);
    expect_ids(t, "", (tok_opts){.add_special = true}, (int32_t[]){bos, eos}, 2);
    tok_free(t);
    bv_free(&v);
}
END_TEST

START_TEST(tok_refuses_invalid_utf8_and_nul_naming_the_offset)
{
    bvocab v;
    bv_init(&v);
    tok *t = bv_tok(&v, "deepseek-v3", NULL, 0, -1);
    static const struct { const char *s; size_t n; const char *msg; } bad[] = {
        {"ab\xff", 3, "tokenizer: byte offset 2: invalid UTF-8"},
        {"a\xc3", 2, "tokenizer: byte offset 1: invalid UTF-8"},
        {"\xed\xa0\x80", 3, "tokenizer: byte offset 0: invalid UTF-8"},
        {"xyz\0w", 5, "tokenizer: byte offset 3: NUL byte in text"},
        {"\xc0\xaf", 2, "tokenizer: byte offset 0: invalid UTF-8"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int32_t *ids = (int32_t *)&v;
        size_t n = 77;
        pd_err err = {0};
        ck_assert_int_eq(tok_encode(t, bad[i].s, bad[i].n, (tok_opts){0}, &ids, &n, &err),
                         PD_ERR_FORMAT);
        ck_assert_str_eq(err.msg, bad[i].msg);
        ck_assert_ptr_eq(ids, (int32_t *)&v);
        ck_assert_uint_eq(n, 77);
    }
    tok_free(t);
    bv_free(&v);
}
END_TEST

START_TEST(tok_new_refuses_unknown_models_and_pre_tokenizers_by_name)
{
    bvocab v;
    bv_init(&v);
    tok_desc d = {.model = "gpt2", .pre = "tekken", .n_tokens = v.n,
                  .tokens = (const char *const *)v.tok, .bos = -1, .eos = -1, .unk = -1};
    tok *t = (tok *)&v;
    pd_err err = {0};
    ck_assert_int_eq(tok_new(&d, &t, &err), PD_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "\"tekken\""));
    ck_assert_ptr_eq(t, (tok *)&v);
    d.model = "t5";
    pd_err_clear(&err);
    ck_assert_int_eq(tok_new(&d, &t, &err), PD_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "\"t5\""));
    d.model = "gpt2";
    d.pre = "deepseek-v3";
    d.bos = (int32_t)v.n;
    pd_err_clear(&err);
    ck_assert_int_eq(tok_new(&d, &t, &err), PD_ERR_RANGE);
    d.bos = -1;
    v.type[5] = 9;
    d.types = v.type;
    pd_err_clear(&err);
    ck_assert_int_eq(tok_new(&d, &t, &err), PD_ERR_FORMAT);
    ck_assert_ptr_eq(t, (tok *)&v);
    tok_free(NULL);
    bv_free(&v);
}
END_TEST

/* SentencePiece: <unk>, <s>, </s>, 256 byte tokens, then scored pieces. */
START_TEST(tok_llama_spm_merges_by_score_with_byte_fallback)
{
    char *toks[300];
    int32_t types[300];
    float scores[300];
    uint32_t n = 0;
    toks[n] = strdup("<unk>"), types[n] = 2, scores[n++] = 0;
    toks[n] = strdup("<s>"), types[n] = 3, scores[n++] = 0;
    toks[n] = strdup("</s>"), types[n] = 3, scores[n++] = 0;
    for (int b = 0; b < 256; b++) {
        char s[8];
        snprintf(s, sizeof s, "<0x%02X>", b);
        toks[n] = strdup(s), types[n] = 6, scores[n++] = 0;
    }
    const char *words[] = {"\xe2\x96\x81", "h", "e", "l", "o", "\xe2\x96\x81h", "ll", "he",
                           "llo", "\xe2\x96\x81he", "\xe2\x96\x81hello"};
    float sc[] = {-1, -2, -2, -2, -2, -5, -3, -4, -6, -7, -8};
    int32_t first = (int32_t)n;
    for (size_t i = 0; i < sizeof words / sizeof words[0]; i++)
        toks[n] = strdup(words[i]), types[n] = 1, scores[n++] = sc[i];
    tok_desc d = {.model = "llama", .n_tokens = n, .tokens = (const char *const *)toks,
                  .types = types, .scores = scores, .bos = 1, .eos = 2, .unk = 0, .add_bos = -1,
                  .add_eos = -1, .add_space_prefix = -1};
    tok *t = NULL;
    pd_err err = {0};
    ck_assert_msg(tok_new(&d, &t, &err) == PD_OK, "%s", err.msg);
    tok_check(t);
    ck_assert(tok_adds_bos(t));
    /* "▁hello": ll(-3) > he(-4) > ▁h(-5) > llo(-6)... -> "▁he" "llo" -> "▁hello" */
    expect_ids(t, "hello", (tok_opts){.add_special = true},
               (int32_t[]){1, first + 10}, 2);
    /* "z" has no piece: byte fallback <0x7A> = 3 + 0x7A */
    expect_ids(t, "hez", (tok_opts){0}, (int32_t[]){first + 9, 3 + 'z'}, 2);
    /* a special token is cut out; the text after it gets the space prefix again */
    expect_ids(t, "he</s>he", (tok_opts){.parse_special = true},
               (int32_t[]){first + 9, 2, first + 9}, 3);
    tok_free(t);
    d.add_space_prefix = 0;
    ck_assert_int_eq(tok_new(&d, &t, &err), PD_OK);
    expect_ids(t, "he", (tok_opts){0}, (int32_t[]){first + 7}, 1);
    tok_free(t);
    for (uint32_t i = 0; i < n; i++)
        free(toks[i]);
}
END_TEST

/* A gpt2 vocabulary of "hi" (merged from "h i") and a BOS "<s>" the model
 * adds, as tokenizer keys of a GGUF writer; *v holds the tokens. */
static gguf_writer *hi_bos_vocab(bvocab *v, int32_t *hi, int32_t *bos)
{
    bv_init(v);
    *hi = bv_add(v, "hi", 1);
    *bos = bv_add(v, "<s>", 3);
    static const char *const merges[] = {"h i"};
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_str(w, "tokenizer.ggml.pre", "deepseek-v3");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v->tok, v->n);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v->type, v->n);
    gguf_writer_set_arr_str(w, "tokenizer.ggml.merges", merges, 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", (uint32_t)*bos);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    return w;
}

START_TEST(tok_gguf_keys_load_and_tokenize)
{
    bvocab v;
    int32_t hi, bos;
    gguf_writer *w = hi_bos_vocab(&v, &hi, &bos);
    void *buf = NULL;
    size_t len = 0;
    pd_err err = {0};
    ck_assert_int_eq(gguf_writer_to_mem(w, &buf, &len, &err), PD_OK);
    gguf_file *f = NULL;
    ck_assert_msg(gguf_open_mem(buf, len, &f, &err) == PD_OK, "%s", err.msg);
    tok *t = NULL;
    ck_assert_msg(tok_new_gguf(f, &t, &err) == PD_OK, "%s", err.msg);
    expect_ids(t, "hi hi", (tok_opts){.add_special = true}, (int32_t[]){bos, hi, ' ', hi}, 4);
    ck_assert_int_eq(tok_bos(t), bos);
    tok_free(t);
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
    /* a gpt2 vocabulary without merges is refused as llama.cpp refuses it */
    w = gguf_writer_new();
    gguf_writer_set_str(w, "tokenizer.ggml.model", "gpt2");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.tok, v.n);
    ck_assert_int_eq(gguf_writer_to_mem(w, &buf, &len, &err), PD_OK);
    ck_assert_int_eq(gguf_open_mem(buf, len, &f, &err), PD_OK);
    pd_err_clear(&err);
    ck_assert_int_eq(tok_new_gguf(f, &t, &err), PD_ERR_FORMAT);
    ck_assert_ptr_nonnull(strstr(err.msg, "tokenizer.ggml.merges"));
    gguf_close(f);
    free(buf);
    gguf_writer_free(w);
    bv_free(&v);
}
END_TEST

/* The manifest's text segments: the tokenizer built on the first one (from
 * the model's path, as the work-mix count has no model loaded, or from its
 * open file), no BOS although the model adds one, special tokens parsed:
 * both ways give the same ids, which is what makes the agreed rows the
 * prefilled ones. */
START_TEST(tok_pages_tokenizes_text_segments_as_prefilled)
{
    bvocab v;
    int32_t hi, bos;
    gguf_writer *w = hi_bos_vocab(&v, &hi, &bos);
    char dir[256], path[300];
    pd_test_tmpdir(dir, sizeof dir, "tokpages");
    snprintf(path, sizeof path, "%s/m.gguf", dir);
    pd_err err = {0};
    ck_assert_msg(gguf_writer_write(w, path, &err) == PD_OK, "%s", err.msg);
    gguf_file *f = NULL;
    ck_assert_msg(gguf_open(path, &f, &err) == PD_OK, "%s", err.msg);
    tok_pages by_path = {.path = path}, by_file = {.gguf = f};
    ck_assert_ptr_null(by_path.t); /* nothing built before a text segment */
    int32_t want[] = {hi, bos, hi};
    tok_pages *both[] = {&by_path, &by_file};
    for (int k = 0; k < 2; k++) {
        int32_t *ids = NULL;
        size_t n = 0;
        ck_assert_msg(tok_pages_encode(both[k], "hi<s>hi", 7, &ids, &n, &err) == PD_OK, "%s", err.msg);
        ck_assert_uint_eq(n, 3);
        ck_assert_mem_eq(ids, want, sizeof want);
        free(ids);
        tok_pages_free(both[k]);
        ck_assert_ptr_null(both[k]->t);
    }
    /* a model without a tokenizer: refused, saying whose */
    tok_pages none = {.path = dir};
    int32_t *ids = NULL;
    size_t n = 0;
    ck_assert_int_ne(tok_pages_encode(&none, "hi", 2, &ids, &n, &err), PD_OK);
    ck_assert_msg(strstr(err.msg, "the model's tokenizer"), "%s", err.msg);
    tok_pages_free(&none);
    tok_pages_free(NULL);
    gguf_close(f);
    gguf_writer_free(w);
    pd_test_rmtree(dir);
    bv_free(&v);
}
END_TEST

START_TEST(tok_a_one_megabyte_word_is_linear)
{
    bvocab v;
    bv_init(&v);
    /* merges build "a"^2^k for k = 1..9, so a long run of 'a' merges all the way */
    static char *merges[9];
    char left[600] = "a";
    for (int k = 0; k < 9; k++) {
        size_t l = strlen(left);
        merges[k] = malloc(2 * l + 2);
        snprintf(merges[k], 2 * l + 2, "%s %s", left, left);
        memcpy(left + l, left, l);
        left[2 * l] = 0;
        bv_add(&v, left, 1);
    }
    tok *t = bv_tok(&v, "deepseek-v3", (const char *const *)merges, 9, -1);
    size_t n = 1u << 20;
    char *s = malloc(n + 1);
    memset(s, 'a', n);
    s[n] = 0;
    double t0 = pd_now_s();
    int32_t *ids = NULL;
    size_t ni = 0;
    pd_err err = {0};
    ck_assert_int_eq(tok_encode(t, s, n, (tok_opts){0}, &ids, &ni, &err), PD_OK);
    double secs = pd_now_s() - t0;
    ck_assert_uint_eq(ni, n / 512);
    ck_assert_int_eq(ids[0], 256 + 8);
    ck_assert_msg(secs < 10.0, "1 MB word took %.2f s", secs);
    fprintf(stderr, "tokenizer: 1 MiB word in %.3f s\n", secs);
    free(ids);
    /* a 1 MB word of letters no merge touches: still linear */
    for (size_t i = 0; i < n; i++)
        s[i] = (char)('b' + i % 20);
    ck_assert_int_eq(tok_encode(t, s, n, (tok_opts){0}, &ids, &ni, &err), PD_OK);
    ck_assert_uint_eq(ni, n);
    free(ids);
    free(s);
    for (int k = 0; k < 9; k++)
        free(merges[k]);
    tok_free(t);
    bv_free(&v);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("tokenizer");
    TCase *tc = tcase_create("tokenizer");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, tok_deepseek_v3_splits_as_llama_cpp);
    tcase_add_test(tc, tok_other_pre_tokenizers_split_as_llama_cpp);
    tcase_add_test(tc, tok_bpe_merges_by_rank_then_leftmost);
    tcase_add_test(tc, tok_special_tokens_longest_first_and_parse_special_off);
    tcase_add_test(tc, tok_bos_eos_follow_the_model_and_its_defaults);
    tcase_add_test(tc, tok_refuses_invalid_utf8_and_nul_naming_the_offset);
    tcase_add_test(tc, tok_new_refuses_unknown_models_and_pre_tokenizers_by_name);
    tcase_add_test(tc, tok_llama_spm_merges_by_score_with_byte_fallback);
    tcase_add_test(tc, tok_gguf_keys_load_and_tokenize);
    tcase_add_test(tc, tok_pages_tokenizes_text_segments_as_prefilled);
    tcase_add_test(tc, tok_a_one_megabyte_word_is_linear);
    suite_add_tcase(s, tc);
    return s;
}
