/* `pipedec tokenize --model M (--text S | --file F) [--ids] [--pieces]
 * [--no-bos] [--no-parse-special]`: the model's own tokenizer (tokenizer.h)
 * run on a text, like llama.cpp's llama-tokenize. Reads only the GGUF's
 * metadata (the weights stay unmapped pages). --ids prints one JSON array;
 * the default and --pieces print "id<TAB>piece" per line, the piece as
 * llama.cpp's token_to_piece renders it (vocab.h), its bytes as JSON. */
#include "base/check.h"
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"

#include <getopt.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/file.h"
#include "cluster/format/gguf.h"
#include "cluster/format/tokenizer.h"
#include "cluster/format/vocab.h"

static void usage(FILE *f)
{
    fprintf(f, "usage: pipedec tokenize --model M (--text S | --file F) [--ids | --pieces]\n"
               "                        [--no-bos] [--no-parse-special]\n"
               "  Tokenizes text with the model's own tokenizer (GGUF tokenizer.ggml.*),\n"
               "  as llama.cpp's llama-tokenize does; reads only the vocabulary.\n"
               "  --ids               one JSON array of ids on one line\n"
               "  --pieces            id and piece (a JSON string) per line (the default)\n"
               "  --no-bos            do not add BOS/EOS even when the model asks for them\n"
               "  --no-parse-special  special token texts (<image>, ...) are plain text\n"
               "  exit: 0 done, 1 text refused (invalid UTF-8, NUL: the byte offset named)\n"
               "        or model refused, 2 usage or unreadable file\n");
}

static int read_file(const char *path, char **out, size_t *len, pd_err *err)
{
    int fd;
    uint64_t size;
    if (pd_file_open_read(path, "tokenize", &fd, &size, err))
        return -1;
    char *b = size < SIZE_MAX ? malloc((size_t)size + 1) : NULL;
    if (!b) {
        close(fd);
        pd_err_set(err, PD_ERR_NOMEM, "tokenize: %s: no memory for %llu bytes", path,
                   (unsigned long long)size);
        return -1;
    }
    pd_status st = pd_file_read_at(fd, b, (size_t)size, 0, path, "tokenize", err);
    close(fd);
    if (st) {
        free(b);
        return -1;
    }
    *out = b;
    *len = (size_t)size;
    return 0;
}

/* Writes bytes as the body of a JSON string (valid UTF-8 assumed repaired). */
static void put_json_str(FILE *f, const char *s, size_t n)
{
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", f);
        else if (c == '\r')
            fputs("\\r", f);
        else if (c == '\t')
            fputs("\\t", f);
        else if (c < 0x20 || c == 0x7f)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

typedef struct tokenize_args {
    const char *model, *text, *file;
    bool ids_only, no_bos, no_special;
} tokenize_args;

static pd_status tokenize_flag(void *ctx, int ch, const char *arg, pd_err *e)
{
    (void)e;
    tokenize_args *a = ctx;
    switch (ch) {
    case 'm': a->model = arg; break;
    case 't': a->text = arg; break;
    case 'f': a->file = arg; break;
    case 'i': a->ids_only = true; break;
    case 'p': a->ids_only = false; break;
    case 'b': a->no_bos = true; break;
    case 's': a->no_special = true; break;
    default: CHECKF(0, "tokenize: option code %d without its case", ch);
    }
    return PD_OK;
}

static pd_status tokenize_check(void *ctx, pd_err *e)
{
    const tokenize_args *a = ctx;
    if (!a->model || !a->text == !a->file)
        return pd_err_set(e, PD_ERR_ARG, "--model and one of --text or --file are required");
    return PD_OK;
}

static const struct option tokenize_longopts[] = {
    {"model", required_argument, NULL, 'm'}, {"text", required_argument, NULL, 't'},
    {"file", required_argument, NULL, 'f'},  {"ids", no_argument, NULL, 'i'},
    {"pieces", no_argument, NULL, 'p'},      {"no-bos", no_argument, NULL, 'b'},
    {"no-parse-special", no_argument, NULL, 's'}, {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}};

static const cli_cmd tokenize_cli = {
    .name = "tokenize", .opts = tokenize_longopts, .flag = tokenize_flag, .check = tokenize_check, .usage = usage};

int cmd_tokenize(int argc, char **argv)
{
    tokenize_args a = {0};
    int rc = cli_parse(&tokenize_cli, argc, argv, &a, stdout, stderr);
    if (rc != CLI_GO)
        return rc;
    const char *model = a.model, *text = a.text, *file = a.file;
    const bool ids_only = a.ids_only, no_bos = a.no_bos, no_special = a.no_special;
    pd_err err = {0};
    char *buf = NULL;
    size_t len = 0;
    if (file) {
        if (read_file(file, &buf, &len, &err)) {
            fprintf(stderr, "pipedec tokenize: %s\n", err.msg);
            return CMD_EXIT_USAGE;
        }
    }
    gguf_file *g = NULL;
    tok *t = NULL;
    vocab *v = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    rc = CMD_EXIT_INVALID;
    if (gguf_open(model, &g, &err)) {
        fprintf(stderr, "pipedec tokenize: %s: %s\n", model, err.msg);
        rc = err.status == PD_ERR_IO ? CMD_EXIT_USAGE : CMD_EXIT_INVALID;
        goto out;
    }
    if (tok_new_gguf(g, &t, &err) || (!ids_only && tok_vocab_new(t, false, &v, &err))) {
        fprintf(stderr, "pipedec tokenize: %s: %s\n", model, err.msg);
        goto out;
    }
    tok_opts o = {.add_special = !no_bos, .parse_special = !no_special};
    if (tok_encode(t, file ? buf : text, file ? len : strlen(text), o, &ids, &n, &err)) {
        fprintf(stderr, "pipedec tokenize: %s: %s\n", file ? file : "--text", err.msg);
        goto out;
    }
    if (ids_only) {
        fputc('[', stdout);
        for (size_t i = 0; i < n; i++)
            fprintf(stdout, i ? ", %d" : "%d", ids[i]);
        fputs("]\n", stdout);
    } else {
        for (size_t i = 0; i < n; i++) {
            size_t pl = 0;
            const char *p = vocab_piece(v, ids[i], &pl);
            char *rep = malloc(3 * pl + 1);
            size_t rl = rep ? vocab_utf8_repair(p, pl, rep) : 0;
            fprintf(stdout, "%d\t", ids[i]);
            put_json_str(stdout, rep ? rep : "", rl);
            fputc('\n', stdout);
            free(rep);
        }
    }
    rc = fflush(stdout) ? CMD_EXIT_USAGE : CMD_EXIT_OK;
out:
    free(ids);
    vocab_free(v);
    tok_free(t);
    gguf_close(g);
    free(buf);
    return rc;
}
