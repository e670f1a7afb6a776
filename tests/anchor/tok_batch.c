/* The pipedec side of the tokenizer identity test: for each record of a
 * corpus file ("<byte length>\n<bytes>\n", repeated) prints the ids
 * tok_encode gives (add_special off, parse_special on), a tab, and 1 or 0:
 * whether detokenizing them (vocab.h, control tokens rendered as their text,
 * as llama.cpp's detokenize with special rendering does) gives the text back.
 * A refused text prints "refused: <message>".
 * usage: tok_batch MODEL.gguf CORPUS.rec [add_special parse_special] */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/format/gguf.h"
#include "cluster/format/tokenizer.h"
#include "cluster/format/vocab.h"

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 5) {
        fprintf(stderr, "usage: tok_batch MODEL.gguf CORPUS.rec [add_special parse_special]\n");
        return 2;
    }
    tok_opts o = {.add_special = argc == 5 && atoi(argv[3]), .parse_special = argc != 5 || atoi(argv[4])};
    pd_err err = {0};
    gguf_file *g = NULL;
    tok *t = NULL;
    if (gguf_open(argv[1], &g, &err) || tok_new_gguf(g, &t, &err)) {
        fprintf(stderr, "tok_batch: %s: %s\n", argv[1], err.msg);
        return 1;
    }
    /* a vocabulary that renders control tokens as text, for the round trip */
    uint32_t nt = tok_n_tokens(t);
    const char **texts = malloc(nt * sizeof *texts);
    uint32_t *lens = malloc(nt * sizeof *lens);
    int32_t *types = malloc(nt * sizeof *types);
    for (uint32_t i = 0; i < nt; i++) {
        size_t l;
        texts[i] = tok_text(t, (int32_t)i, &l);
        lens[i] = (uint32_t)l;
        int32_t ty = tok_token_type(t, (int32_t)i);
        types[i] = ty == VOCAB_TT_CONTROL ? VOCAB_TT_USER_DEFINED : ty;
    }
    vocab_desc vd = {.model = tok_model_of(t) == TOK_MODEL_GPT2 ? "gpt2" : "llama", .n_tokens = nt,
                     .tokens = texts, .token_lens = lens, .types = types, .bos = -1, .eos = -1,
                     .no_space_prefix = true};
    vocab *v = NULL;
    if (vocab_new(&vd, &v, &err)) {
        fprintf(stderr, "tok_batch: vocab: %s\n", err.msg);
        return 1;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        perror(argv[2]);
        return 2;
    }
    size_t len;
    while (fscanf(f, "%zu", &len) == 1 && fgetc(f) == '\n') {
        char *text = malloc(len + 1);
        if (!text || fread(text, 1, len, f) != len || fgetc(f) != '\n') {
            fprintf(stderr, "tok_batch: bad record\n");
            return 2;
        }
        int32_t *ids = NULL;
        size_t n = 0;
        pd_err e2 = {0};
        if (tok_encode(t, text, len, o, &ids, &n, &e2)) {
            printf("refused: %s\n", e2.msg);
            free(text);
            continue;
        }
        char *back = NULL;
        size_t bl = 0;
        bool rt = vocab_detok(v, ids, n, &back, &bl, &e2) == PD_OK && bl == len &&
                  memcmp(back, text, len) == 0;
        putchar('[');
        for (size_t i = 0; i < n; i++)
            printf(i ? ", %d" : "%d", ids[i]);
        printf("]\t%d\n", rt);
        free(back);
        free(ids);
        free(text);
    }
    fclose(f);
    vocab_free(v);
    free(texts);
    free(lens);
    free(types);
    tok_free(t);
    gguf_close(g);
    return 0;
}
