/* pipedec render: text pages -> an OCR-shaped page manifest through the
 * built-in glyph encoder (cluster/format/render.h, docs/ocr.md). */
#include "base/check.h"
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"
#include "cluster/cli/ocrmeta.h"
#include "cluster/format/render.h"

#include "base/file.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void render_usage(FILE *f)
{
    fprintf(f, "usage: pipedec render --text FILE --model M --out DIR [--cells N] [--id-prefix P]\n"
               "  FILE: printable ASCII lines, pages separated by form feeds (\\f)\n"
               "  --cells N: cells per page (default: the model's pipedec.ocr.cells, else %u)\n",
               RENDER_DEFAULT_CELLS);
}

typedef struct render_args {
    const char *text_path, *model_path, *out, *prefix;
    uint32_t cells;
} render_args;

static pd_status render_flag(void *ctx, int ch, const char *arg, pd_err *e)
{
    render_args *a = ctx;
    switch (ch) {
    case 't': a->text_path = arg; return PD_OK;
    case 'm': a->model_path = arg; return PD_OK;
    case 'o': a->out = arg; return PD_OK;
    case 'c': return cli_u32("--cells", arg, 1, 1u << 16, &a->cells, e);
    case 'p': a->prefix = arg; return PD_OK;
    default: CHECKF(0, "render: option code %d without its case", ch);
    }
    return PD_OK;
}

static pd_status render_check(void *ctx, pd_err *e)
{
    const render_args *a = ctx;
    if (!a->text_path || !a->model_path || !a->out)
        return pd_err_set(e, PD_ERR_ARG, "--text FILE, --model M and --out DIR are required");
    return PD_OK;
}

static const struct option render_longopts[] = {{"text", required_argument, 0, 't'},   {"model", required_argument, 0, 'm'},
                                                {"out", required_argument, 0, 'o'},    {"cells", required_argument, 0, 'c'},
                                                {"id-prefix", required_argument, 0, 'p'}, {"help", no_argument, 0, 'h'},
                                                {0, 0, 0, 0}};

static const cli_cmd render_cli = {
    .name = "render", .opts = render_longopts, .flag = render_flag, .check = render_check, .usage = render_usage};

int cmd_render(int argc, char **argv)
{
    render_args a = {.prefix = "p"};
    int rc = cli_parse(&render_cli, argc, argv, &a, stdout, stderr);
    if (rc != CLI_GO)
        return rc;
    const char *text_path = a.text_path, *model_path = a.model_path, *out = a.out, *prefix = a.prefix;
    uint32_t cells = a.cells;
    pd_err e = {0};
    pd_status st = PD_OK;
    ocrmeta meta;
    uint8_t *text = NULL;
    size_t len = 0;
    render_doc *doc = NULL;
    char *prompt_text = NULL;
    if (st == PD_OK)
        st = ocrmeta_read(model_path, &meta, &e);
    if (st == PD_OK)
        st = pd_file_read_all(text_path, NULL, &text, &len, &e);
    if (st == PD_OK) {
        st = render_doc_parse((const char *)text, len, &doc, &e);
        if (st != PD_OK)
            pd_err_prefix(&e, "%s", text_path);
    }
    if (st == PD_OK) {
        render_opts ro = {.hidden = meta.hidden,
                          .cells = cells ? cells : meta.cells,
                          .bos = meta.bos,
                          .n_prompt = meta.n_prompt,
                          .max_new_extra = 8,
                          .id_prefix = prefix};
        memcpy(ro.prompt, meta.prompt, sizeof ro.prompt);
        /* the prompt as text when the model's tokenizer gives back exactly
         * its ids (a manifest a user can read and edit); token ids otherwise */
        pd_err pe = {0};
        if (meta.n_prompt && ocrmeta_prompt_text(model_path, &meta, &prompt_text, &pe) != PD_OK)
            printf("pipedec render: the prompt stays token ids: %s\n", pe.msg);
        ro.prompt_text = prompt_text;
        st = render_write(doc, &ro, out, &e);
        if (st == PD_OK)
            printf("pipedec render: wrote %s/pages.jsonl (%zu pages of %u cells, hidden %u)\n", out,
                   render_doc_pages(doc), ro.cells, ro.hidden);
    }
    free(prompt_text);
    render_doc_free(doc);
    free(text);
    if (st != PD_OK) {
        fprintf(stderr, "pipedec render: %s\n", e.msg);
        return st == PD_ERR_IO ? CMD_EXIT_USAGE : CMD_EXIT_INVALID;
    }
    return CMD_EXIT_OK;
}
