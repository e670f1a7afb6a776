/* libFuzzer target for the tokenizer (tok_encode, tok_split): byte 0 picks
 * the model and pre-tokenizer, byte 1 the options, the rest is the text. Any
 * byte string must be refused (PD_ERR_FORMAT naming a byte offset) or
 * tokenized; never a crash or an out-of-bounds read. Postconditions: ids in
 * range; for byte-level BPE the ids' bytes (GPT-2 table, special tokens as
 * their text) are exactly the input; tok_split's pieces cover the input.
 * The vocabulary is built here: 256 byte tokens, merges up to "aaaa" and
 * " the", and special tokens of different lengths that overlap.
 *
 * For scripts/fuzz.sh:
 *   PD_FUZZ_SOURCES: cluster/format/tokenizer.c cluster/format/vocab.c cluster/format/ucd.c cluster/format/gguf.c comm/rd.c comm/crc32c.c base/file.c base/fnv.c base/utf8.c base/fp16.c base/cpu.c base/status.c
 * Replay without libFuzzer: add -DPD_FUZZ_MAIN, drop -fsanitize=fuzzer, and
 * pass input files as arguments. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/format/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_fail(const char *what)
{
    fprintf(stderr, "fuzz_tokenizer: postcondition failed: %s\n", what);
    abort();
}

enum { N_PRE = 6, N_EXTRA = 12 };
static const char *const pres[N_PRE] = {"deepseek-v3", "deepseek-llm", "llama-bpe", "qwen2",
                                        "gpt-2", "default"};
/* extra tokens (after the 256 bytes) and their bytes when decoded */
static const char *const extra[N_EXTRA] = {"aa", "aaaa", "Ġt", "he", "Ġthe", "<s>", "<image>",
                                           "<image>\n", "<|ref|>", "<u>", "ab", "Ġ"};
static const char *const extra_bytes[N_EXTRA] = {"aa", "aaaa", " t", "he", " the", "<s>",
                                                 "<image>", "<image>\n", "<|ref|>", "<u>", "ab", " "};
static const int32_t extra_type[N_EXTRA] = {1, 1, 1, 1, 1, 3, 3, 3, 3, 4, 1, 1};
static const char *const merges[] = {"a a", "aa aa", "Ġ t", "h e", "Ġt he", "a b"};

static tok *g_tok[N_PRE + 1];
static char *g_text[256 + N_EXTRA];
static char g_bytes[256 + N_EXTRA][16];
static size_t g_blen[256 + N_EXTRA];

static void fuzz_init(void)
{
    int32_t types[256 + N_EXTRA];
    for (int b = 0; b < 256; b++) {
        bool pr = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || b >= 174;
        uint32_t cp = (uint32_t)b;
        if (!pr) {
            uint32_t k = 0;
            for (int x = 0; x < b; x++)
                if (!((x >= 33 && x <= 126) || (x >= 161 && x <= 172) || x >= 174))
                    k++;
            cp = 256 + k;
        }
        char s[4] = {0};
        if (cp < 0x80) {
            s[0] = (char)cp;
        } else {
            s[0] = (char)(0xC0 | (cp >> 6));
            s[1] = (char)(0x80 | (cp & 0x3F));
        }
        g_text[b] = strdup(s);
        g_bytes[b][0] = (char)b;
        g_blen[b] = 1;
        types[b] = 1;
    }
    for (int i = 0; i < N_EXTRA; i++) {
        g_text[256 + i] = strdup(extra[i]);
        g_blen[256 + i] = strlen(extra_bytes[i]);
        memcpy(g_bytes[256 + i], extra_bytes[i], g_blen[256 + i]);
        types[256 + i] = extra_type[i];
    }
    for (int p = 0; p < N_PRE; p++) {
        tok_desc d = {.model = "gpt2", .pre = pres[p], .n_tokens = 256 + N_EXTRA,
                      .tokens = (const char *const *)g_text, .types = types,
                      .n_merges = sizeof merges / sizeof merges[0], .merges = merges,
                      .bos = 256 + 5, .eos = -1, .unk = -1, .add_bos = -1, .add_eos = -1,
                      .add_space_prefix = -1};
        pd_err err = {0};
        if (tok_new(&d, &g_tok[p], &err) != PD_OK)
            fuzz_fail(err.msg);
    }
    /* SentencePiece over the same texts (byte tokens absent: unk fallback) */
    tok_desc d = {.model = "llama", .n_tokens = 256 + N_EXTRA, .tokens = (const char *const *)g_text,
                  .types = types, .bos = 256 + 5, .eos = -1, .unk = 0, .add_bos = -1,
                  .add_eos = -1, .add_space_prefix = -1};
    pd_err err = {0};
    if (tok_new(&d, &g_tok[N_PRE], &err) != PD_OK)
        fuzz_fail(err.msg);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!g_tok[0])
        fuzz_init();
    if (size < 2)
        return 0;
    int which = data[0] % (N_PRE + 1);
    tok_opts o = {.add_special = data[1] & 1, .parse_special = (data[1] >> 1) & 1};
    const char *text = (const char *)data + 2;
    size_t len = size - 2;
    const tok *t = g_tok[which];
    int32_t *ids = NULL;
    size_t n = 0;
    pd_err err = {0};
    pd_status st = tok_encode(t, text, len, o, &ids, &n, &err);
    if (st != PD_OK) {
        if (st != PD_ERR_FORMAT || !strstr(err.msg, "byte offset"))
            fuzz_fail("refusal without a byte offset");
        size_t *lens = NULL, m = 0;
        pd_err e2 = {0};
        if (tok_split(t, text, len, &lens, &m, &e2) != st || strcmp(e2.msg, err.msg))
            fuzz_fail("tok_split and tok_encode refuse differently");
        return 0;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= tok_n_tokens(t))
            fuzz_fail("id out of range");
    if (which < N_PRE) {
        /* the ids' bytes give the text back (BOS aside) */
        size_t at = 0, i = 0;
        if (o.add_special && tok_adds_bos(t)) {
            if (n == 0 || ids[0] != tok_bos(t))
                fuzz_fail("BOS missing");
            i = 1;
        }
        for (; i < n; i++) {
            size_t bl = g_blen[ids[i]];
            if (at + bl > len || memcmp(text + at, g_bytes[ids[i]], bl))
                fuzz_fail("ids do not spell the text");
            at += bl;
        }
        if (at != len)
            fuzz_fail("ids cover less than the text");
    }
    free(ids);
    size_t *lens = NULL, m = 0, sum = 0;
    if (tok_split(t, text, len, &lens, &m, &err) != PD_OK)
        fuzz_fail("tok_split refused what tok_encode took");
    for (size_t i = 0; i < m; i++) {
        if (!lens[i])
            fuzz_fail("empty piece");
        sum += lens[i];
    }
    if (sum != len)
        fuzz_fail("pieces do not cover the text");
    free(lens);
    return 0;
}

#ifdef PD_FUZZ_MAIN
int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        FILE *f = fopen(argv[i], "rb");
        if (!f)
            continue;
        static uint8_t buf[1 << 20];
        size_t n = fread(buf, 1, sizeof buf, f);
        fclose(f);
        LLVMFuzzerTestOneInput(buf, n);
    }
    return 0;
}
#endif
