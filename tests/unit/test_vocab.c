/* Tests for cluster/format/vocab.h with small hand-made vocabularies of both styles:
 * SentencePiece (▁, <0xNN> byte fallback, control tokens, leading space) and
 * byte-level BPE (GPT-2's byte<->unicode table), plus UTF-8 repair. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/format/vocab.h"
#include "pd_test.h"

#define SP "\xe2\x96\x81" /* U+2581 */
#define FFFD "\xef\xbf\xbd"

/* llama vocabulary: 0 <unk>, 1 <s>, 2 </s>, 3..258 <0x00>..<0xFF>, then words. */
enum { L_UNK, L_BOS, L_EOS, L_BYTE0, L_HELLO = L_BYTE0 + 256, L_WORLD, L_BANG, L_CAF, L_PAD,
       L_USER, L_N };

static char byte_names[256][8];

static vocab *make_llama(bool with_types, bool no_space_prefix)
{
    static const char *t[L_N];
    static int32_t ty[L_N];
    t[L_UNK] = "<unk>", ty[L_UNK] = VOCAB_TT_UNKNOWN;
    t[L_BOS] = "<s>", ty[L_BOS] = VOCAB_TT_CONTROL;
    t[L_EOS] = "</s>", ty[L_EOS] = VOCAB_TT_CONTROL;
    for (int b = 0; b < 256; b++) {
        snprintf(byte_names[b], sizeof byte_names[b], "<0x%02X>", b);
        t[L_BYTE0 + b] = byte_names[b];
        ty[L_BYTE0 + b] = VOCAB_TT_BYTE;
    }
    t[L_HELLO] = SP "Hello", ty[L_HELLO] = VOCAB_TT_NORMAL;
    t[L_WORLD] = SP "world" SP, ty[L_WORLD] = VOCAB_TT_NORMAL;
    t[L_BANG] = "!", ty[L_BANG] = VOCAB_TT_NORMAL;
    t[L_CAF] = SP "caf", ty[L_CAF] = VOCAB_TT_NORMAL;
    t[L_PAD] = "<pad>", ty[L_PAD] = VOCAB_TT_UNUSED;
    t[L_USER] = SP "<td>", ty[L_USER] = VOCAB_TT_USER_DEFINED;
    vocab_desc d = {.model = "llama",
                    .n_tokens = L_N,
                    .tokens = t,
                    .types = with_types ? ty : NULL,
                    .bos = L_BOS,
                    .eos = L_EOS,
                    .no_space_prefix = no_space_prefix};
    vocab *v = NULL;
    pd_err err = {0};
    ck_assert_msg(vocab_new(&d, &v, &err) == PD_OK, "%s", err.msg);
    vocab_check(v);
    return v;
}

static char *detok(const vocab *v, const int32_t *tok, size_t n, size_t *len)
{
    char *s = NULL;
    pd_err err = {0};
    ck_assert_msg(vocab_detok(v, tok, n, &s, len, &err) == PD_OK, "%s", err.msg);
    ck_assert_ptr_nonnull(s);
    return s;
}

static void expect_text(const vocab *v, const int32_t *tok, size_t n, const char *want)
{
    size_t len = 0;
    char *s = detok(v, tok, n, &len);
    ck_assert_msg(len == strlen(want) && !memcmp(s, want, len), "got [%s] want [%s]", s, want);
    ck_assert_int_eq(s[len], '\0');
    free(s);
}

START_TEST(vocab_llama_spiece_underline_becomes_space_and_first_is_stripped)
{
    vocab *v = make_llama(true, false);
    int32_t a[] = {L_HELLO, L_WORLD, L_BANG, L_EOS};
    expect_text(v, a, 4, "Hello world !");
    /* Only token 0's space goes, like llama.cpp: a leading BOS consumes the strip. */
    int32_t b[] = {L_BOS, L_HELLO, L_WORLD};
    expect_text(v, b, 3, " Hello world ");
    int32_t c[] = {L_BANG, L_HELLO};
    expect_text(v, c, 2, "! Hello");
    vocab_free(v);
    v = make_llama(true, true);
    expect_text(v, a, 4, " Hello world !");
    vocab_free(v);
}
END_TEST

START_TEST(vocab_llama_byte_tokens_reassemble_multibyte_utf8)
{
    vocab *v = make_llama(true, false);
    int32_t cafe[] = {L_CAF, L_BYTE0 + 0xC3, L_BYTE0 + 0xA9, L_BANG};
    expect_text(v, cafe, 4, "caf\xc3\xa9!");
    int32_t euro_emoji[] = {L_BYTE0 + 0xE2, L_BYTE0 + 0x82, L_BYTE0 + 0xAC, L_HELLO,
                            L_BYTE0 + 0xF0, L_BYTE0 + 0x9F, L_BYTE0 + 0x98, L_BYTE0 + 0x80};
    expect_text(v, euro_emoji, 8, "\xe2\x82\xac Hello\xf0\x9f\x98\x80");
    /* Streaming: a character split across appends is incomplete until its last byte. */
    vocab_text t = {0};
    pd_err err = {0};
    char *s = NULL;
    size_t n = 0;
    ck_assert_int_eq(vocab_text_reserve(&t, 64, &err), PD_OK);
    char *before = t.buf;
    for (int i = 0; i < 2; i++)
        ck_assert_int_eq(vocab_detok_append(v, &t, cafe[i], &err), PD_OK);
    ck_assert_int_eq(vocab_text_finish(&t, &s, &n, &err), PD_OK);
    ck_assert_str_eq(s, "caf" FFFD);
    free(s);
    ck_assert_int_eq(vocab_detok_append(v, &t, cafe[2], &err), PD_OK);
    ck_assert_int_eq(vocab_text_finish(&t, &s, &n, &err), PD_OK);
    ck_assert_str_eq(s, "caf\xc3\xa9");
    ck_assert_ptr_eq(t.buf, before); /* reserved: no reallocation */
    ck_assert_uint_eq(t.n_tokens, 3);
    free(s);
    vocab_text_free(&t);
    vocab_free(v);
}
END_TEST

START_TEST(vocab_llama_control_unused_unknown_and_user_defined)
{
    vocab *v = make_llama(true, false);
    ck_assert_int_eq(vocab_token_type(v, L_BOS), VOCAB_TT_CONTROL);
    size_t len = 99;
    ck_assert_ptr_nonnull(vocab_piece(v, L_EOS, &len));
    ck_assert_uint_eq(len, 0);
    int32_t a[] = {L_HELLO, L_BOS, L_PAD, L_UNK, L_USER, L_EOS};
    expect_text(v, a, 6, "Hello\xe2\x96\x85" SP "<td>");
    ck_assert_ptr_null(vocab_piece(v, L_N, &len));
    ck_assert_ptr_null(vocab_piece(v, -1, &len));
    ck_assert_uint_eq(vocab_max_piece(v), 7); /* " world " */
    vocab_free(v);
}
END_TEST

/* DeepSeek's EOS, "<｜end▁of▁sentence｜>" */
#define EOS_TEXT "<" "\xef\xbd\x9c" "end" "\xe2\x96\x81" "of" "\xe2\x96\x81" "sentence" "\xef\xbd\x9c" ">"

/* --special: control tokens decode to their own text, as llama.cpp's
 * token_to_piece with special = true; without it, to nothing. */
START_TEST(vocab_special_shows_control_tokens_as_their_text)
{
    static const char *t[] = {"Hello", EOS_TEXT, "<image>",
                              "\xc4\xa0world"};
    static const int32_t ty[] = {VOCAB_TT_NORMAL, VOCAB_TT_CONTROL, VOCAB_TT_CONTROL, VOCAB_TT_NORMAL};
    const int32_t a[] = {2, 0, 3, 1};
    for (int special = 0; special < 2; special++) {
        vocab_desc d = {.model = "gpt2", .n_tokens = 4, .tokens = t, .types = ty, .bos = -1, .eos = 1,
                        .special = special};
        vocab *v = NULL;
        pd_err err = {0};
        ck_assert_msg(vocab_new(&d, &v, &err) == PD_OK, "%s", err.msg);
        vocab_check(v);
        expect_text(v, a, 4, special ? "<image>Hello world" EOS_TEXT
                                     : "Hello world");
        vocab_free(v);
    }
}
END_TEST

START_TEST(vocab_llama_types_inferred_without_token_types)
{
    vocab *v = make_llama(false, false);
    ck_assert_int_eq(vocab_token_type(v, L_BYTE0 + 0x41), VOCAB_TT_BYTE);
    ck_assert_int_eq(vocab_token_type(v, L_HELLO), VOCAB_TT_NORMAL);
    ck_assert_int_eq(vocab_token_type(v, L_EOS), VOCAB_TT_CONTROL);
    int32_t a[] = {L_BOS, L_BYTE0 + 0x41, L_HELLO, L_EOS};
    expect_text(v, a, 4, "A Hello");
    vocab_free(v);
}
END_TEST

START_TEST(vocab_nul_byte_is_kept_with_its_length)
{
    vocab *v = make_llama(true, false);
    int32_t a[] = {L_BANG, L_BYTE0 + 0x00, L_BANG};
    size_t len = 0;
    char *s = detok(v, a, 3, &len);
    ck_assert_uint_eq(len, 3);
    ck_assert_mem_eq(s, "!\0!", 4);
    free(s);
    vocab_free(v);
}
END_TEST

/* GPT-2's bytes_to_unicode, written the way the Python original builds it. */
static void gpt2_forward(uint32_t cp_of_byte[256])
{
    int bs[256], cs[256], n = 0;
    for (int b = '!'; b <= '~'; b++)
        bs[n] = cs[n] = b, n++;
    for (int b = 0xa1; b <= 0xac; b++)
        bs[n] = cs[n] = b, n++;
    for (int b = 0xae; b <= 0xff; b++)
        bs[n] = cs[n] = b, n++;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool in = false;
        for (int i = 0; i < n && !in; i++)
            in = bs[i] == b;
        if (!in) {
            bs[n] = b;
            cs[n] = 256 + extra++;
            n++;
        }
    }
    ck_assert_int_eq(n, 256);
    for (int i = 0; i < 256; i++)
        cp_of_byte[bs[i]] = (uint32_t)cs[i];
}

static size_t utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xc0 | cp >> 6);
        o[1] = (char)(0x80 | (cp & 0x3f));
        return 2;
    }
    o[0] = (char)(0xe0 | cp >> 12);
    o[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
    o[2] = (char)(0x80 | (cp & 0x3f));
    return 3;
}

START_TEST(vocab_gpt2_every_byte_maps_back_through_the_table)
{
    uint32_t fwd[256];
    gpt2_forward(fwd);
    ck_assert_uint_eq(fwd[' '], 0x120);  /* 'Ġ' */
    ck_assert_uint_eq(fwd['\n'], 0x10a); /* 'Ċ' */
    static char names[256][4];
    const char *t[257];
    for (int b = 0; b < 256; b++) {
        names[b][utf8_put(fwd[b], names[b])] = '\0';
        t[b] = names[b];
    }
    t[256] = "<|endoftext|>";
    vocab_desc d = {.model = "gpt2", .n_tokens = 257, .tokens = t, .bos = -1, .eos = 256};
    vocab *v = NULL;
    pd_err err = {0};
    ck_assert_int_eq(vocab_new(&d, &v, &err), PD_OK);
    vocab_check(v);
    for (int b = 0; b < 256; b++) {
        size_t len = 0;
        const char *p = vocab_piece(v, b, &len);
        ck_assert_uint_eq(len, 1);
        ck_assert_int_eq((unsigned char)p[0], b);
    }
    vocab_free(v);
}
END_TEST

START_TEST(vocab_gpt2_words_spaces_and_split_characters)
{
    const char *t[] = {"Hello", "\xc4\xa0world", "\xc4\x8a", "\xc3\x83\xc2\xa9", "\xc3\x83", "\xc2\xa9",
                       "<|endoftext|>", "<td>", "\xe4\xbd\xa0"};
    int32_t ty[] = {1, 1, 1, 1, 1, 1, 3, 4, 1};
    vocab_desc d = {.model = "gpt2", .n_tokens = 9, .tokens = t, .types = ty, .bos = -1, .eos = 6};
    vocab *v = NULL;
    pd_err err = {0};
    ck_assert_int_eq(vocab_new(&d, &v, &err), PD_OK);
    vocab_check(v);
    int32_t a[] = {0, 1, 2, 3, 4, 5, 7, 8, 6};
    /* "Ã©" is the two bytes of "é"; split over tokens 4 and 5 it reassembles;
     * U+4F60 is outside the table and is kept as it is. */
    expect_text(v, a, 9, "Hello world\n\xc3\xa9\xc3\xa9<td>\xe4\xbd\xa0");
    int32_t b[] = {1, 0};
    expect_text(v, b, 2, " worldHello"); /* gpt2: no leading-space strip */
    int32_t c[] = {4, 0};
    expect_text(v, c, 2, FFFD "Hello"); /* a lone lead byte */
    vocab_free(v);
}
END_TEST

static void expect_repair(const char *in, size_t n, const char *want)
{
    char out[256];
    size_t k = vocab_utf8_repair(in, n, out);
    ck_assert_msg(k == strlen(want) && !memcmp(out, want, k), "repair of %zu bytes", n);
}

START_TEST(vocab_invalid_utf8_becomes_one_fffd_per_maximal_subpart)
{
    expect_repair("abc", 3, "abc");
    expect_repair("\x80", 1, FFFD);
    expect_repair("\xc3", 1, FFFD);
    expect_repair("\xe2\x82" "A", 3, FFFD "A");
    expect_repair("\xc0\xaf", 2, FFFD FFFD);
    expect_repair("\xed\xa0\x80", 3, FFFD FFFD FFFD);
    expect_repair("\xf4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD);
    expect_repair("\xf0\x9f\x98" "A", 4, FFFD "A");
    expect_repair("\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80");
    expect_repair("\xff\xfe", 2, FFFD FFFD);
    expect_repair("\xef\xbf\xbd", 3, FFFD);
    /* The Unicode Standard's example (ch. 3, U+FFFD substitution of maximal subparts). */
    expect_repair("\x61\xf1\x80\x80\xe1\x80\xc2\x62\x80\x63\x80\xbf\x64", 13,
                  "a" FFFD FFFD FFFD "b" FFFD "c" FFFD FFFD "d");
}
END_TEST

/* An independent strict validator for the property test. */
static bool valid_utf8(const unsigned char *s, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t k = c < 0x80 ? 0 : c >= 0xc2 && c <= 0xdf ? 1 : c >= 0xe0 && c <= 0xef ? 2
                 : c >= 0xf0 && c <= 0xf4 ? 3 : 99;
        if (k == 99 || i + k >= n + (k ? 0 : 1))
            return false;
        uint32_t cp = k == 0 ? c : k == 1 ? (c & 0x1f) : k == 2 ? (c & 0x0f) : (c & 0x07);
        for (size_t j = 1; j <= k; j++) {
            if ((s[i + j] & 0xc0) != 0x80)
                return false;
            cp = cp << 6 | (s[i + j] & 0x3f);
        }
        static const uint32_t min[4] = {0, 0x80, 0x800, 0x10000};
        if (cp < min[k] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
            return false;
        i += k + 1;
    }
    return true;
}

START_TEST(vocab_random_token_streams_give_valid_utf8_equal_to_streaming)
{
    vocab *v = make_llama(true, false);
    pd_rng r = {.s = 42};
    for (int it = 0; it < 300; it++) {
        int32_t tok[40];
        size_t n = pd_rng_below(&r, 40);
        for (size_t i = 0; i < n; i++)
            tok[i] = (int32_t)pd_rng_below(&r, L_N);
        size_t len = 0;
        char *s = detok(v, tok, n, &len);
        ck_assert(valid_utf8((const unsigned char *)s, len));
        vocab_text t = {0};
        pd_err err = {0};
        for (size_t i = 0; i < n; i++)
            ck_assert_int_eq(vocab_detok_append(v, &t, tok[i], &err), PD_OK);
        char *s2 = NULL;
        size_t len2 = 0;
        ck_assert_int_eq(vocab_text_finish(&t, &s2, &len2, &err), PD_OK);
        ck_assert_uint_eq(len, len2);
        ck_assert_mem_eq(s, s2, len);
        free(s);
        free(s2);
        vocab_text_free(&t);
    }
    vocab_free(v);
}
END_TEST

START_TEST(vocab_new_refuses_bad_descriptions)
{
    const char *t[] = {"a", "<0xZZ>", "c"};
    int32_t ty_bad[] = {1, 7, 1};
    int32_t ty_byte[] = {1, 6, 1};
    vocab *v = (vocab *)t;
    pd_err err = {0};
    vocab_desc d = {.model = "bert", .n_tokens = 3, .tokens = t, .bos = -1, .eos = -1};
    ck_assert_int_eq(vocab_new(&d, &v, &err), PD_ERR_UNSUPPORTED);
    ck_assert_ptr_nonnull(strstr(err.msg, "\"bert\""));
    d.model = "llama";
    d.types = ty_bad;
    pd_err_clear(&err);
    ck_assert_int_eq(vocab_new(&d, &v, &err), PD_ERR_FORMAT);
    ck_assert_str_eq(err.msg, "vocab: token 1: unknown token type 7");
    d.types = ty_byte;
    pd_err_clear(&err);
    ck_assert_int_eq(vocab_new(&d, &v, &err), PD_ERR_FORMAT);
    ck_assert_str_eq(err.msg, "vocab: token 1: byte token text is not of the form <0xNN>");
    d.types = NULL;
    d.eos = 3;
    pd_err_clear(&err);
    ck_assert_int_eq(vocab_new(&d, &v, &err), PD_ERR_RANGE);
    d.eos = -1;
    d.n_tokens = 0;
    pd_err_clear(&err);
    ck_assert_int_eq(vocab_new(&d, &v, &err), PD_ERR_ARG);
    ck_assert_ptr_eq(v, (vocab *)t);
    /* Without types, "<0xZZ>" is just a normal token. */
    d.n_tokens = 3;
    ck_assert_int_eq(vocab_new(&d, &v, &err), PD_OK);
    int32_t a[] = {1, 5};
    char *s = (char *)t;
    pd_err_clear(&err);
    ck_assert_int_eq(vocab_detok(v, a, 2, &s, NULL, &err), PD_ERR_RANGE);
    ck_assert_str_eq(err.msg, "vocab: tokens[1]: id 5 outside the vocabulary [0, 3)");
    ck_assert_ptr_eq(s, (char *)t);
    vocab_text txt = {0};
    pd_err_clear(&err);
    ck_assert_int_eq(vocab_detok_append(v, &txt, -1, &err), PD_ERR_RANGE);
    ck_assert_uint_eq(txt.len, 0);
    ck_assert_uint_eq(txt.n_tokens, 0);
    expect_text(v, a, 1, "<0xZZ>");
    vocab_free(v);
    vocab_free(NULL);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("vocab");
    TCase *tc = tcase_create("vocab");
    tcase_add_test(tc, vocab_llama_spiece_underline_becomes_space_and_first_is_stripped);
    tcase_add_test(tc, vocab_llama_byte_tokens_reassemble_multibyte_utf8);
    tcase_add_test(tc, vocab_llama_control_unused_unknown_and_user_defined);
    tcase_add_test(tc, vocab_llama_types_inferred_without_token_types);
    tcase_add_test(tc, vocab_special_shows_control_tokens_as_their_text);
    tcase_add_test(tc, vocab_nul_byte_is_kept_with_its_length);
    tcase_add_test(tc, vocab_gpt2_every_byte_maps_back_through_the_table);
    tcase_add_test(tc, vocab_gpt2_words_spaces_and_split_characters);
    tcase_add_test(tc, vocab_invalid_utf8_becomes_one_fffd_per_maximal_subpart);
    tcase_add_test(tc, vocab_random_token_streams_give_valid_utf8_equal_to_streaming);
    tcase_add_test(tc, vocab_new_refuses_bad_descriptions);
    suite_add_tcase(s, tc);
    return s;
}
