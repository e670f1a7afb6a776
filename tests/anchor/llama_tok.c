/* The llama.cpp side of the tokenizer identity test: loads a GGUF's
 * vocabulary through libllama (vocab_only, as llama-tokenize does) and, for
 * each record of a corpus file, prints one line: the ids llama_tokenize
 * gives (add_special off, parse_special on; the flags are arguments), a tab,
 * and 1 or 0: whether llama_detokenize (special tokens rendered) gives the
 * text back. Built by tests/anchor/tokenizer.sh against the llama.cpp that
 * scripts/llama_cpp.sh installs; not part of the pipedec build.
 *
 * Records: "<byte length>\n<bytes>\n", repeated.
 * usage: llama_tok MODEL.gguf CORPUS.rec [add_special parse_special] */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "llama.h"

static void quiet(enum ggml_log_level level, const char *text, void *user)
{
    (void)level;
    (void)text;
    (void)user;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: llama_tok MODEL.gguf CORPUS.rec [add_special parse_special]\n");
        return 2;
    }
    bool add_special = argc == 5 && atoi(argv[3]);
    bool parse_special = argc != 5 || atoi(argv[4]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    struct llama_model *m = llama_model_load_from_file(argv[1], mp);
    if (!m) {
        fprintf(stderr, "llama_tok: cannot load %s\n", argv[1]);
        return 1;
    }
    const struct llama_vocab *v = llama_model_get_vocab(m);
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 2;
    }
    size_t len;
    while (fscanf(f, "%zu", &len) == 1 && fgetc(f) == '\n') {
        char *text = malloc(len + 1);
        if (!text || fread(text, 1, len, f) != len || fgetc(f) != '\n') {
            fprintf(stderr, "llama_tok: bad record\n");
            return 2;
        }
        int32_t cap = (int32_t)len + 16;
        llama_token *ids = malloc((size_t)cap * sizeof *ids);
        int32_t n = llama_tokenize(v, text, (int32_t)len, ids, cap, add_special, parse_special);
        if (n < 0) {
            cap = -n;
            ids = realloc(ids, (size_t)cap * sizeof *ids);
            n = llama_tokenize(v, text, (int32_t)len, ids, cap, add_special, parse_special);
        }
        int32_t tcap = (int32_t)len * 4 + 64;
        char *back = malloc((size_t)tcap);
        int32_t bn = llama_detokenize(v, ids, n, back, tcap, false, true);
        bool rt = bn == (int32_t)len && memcmp(back, text, len) == 0;
        putchar('[');
        for (int32_t i = 0; i < n; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        printf("]\t%d\n", rt);
        free(back);
        free(ids);
        free(text);
    }
    fclose(f);
    llama_model_free(m);
    llama_backend_free();
    return 0;
}
