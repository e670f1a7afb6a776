/* pipedec mkpages: write a deterministic synthetic page manifest. */
#include "base/check.h"
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"
#include "cluster/cli/mkpages.h"

#include <getopt.h>
#include <stdio.h>
#include <string.h>

static void mkpages_usage(FILE *f)
{
    fprintf(f, "usage: pipedec mkpages --model M --out DIR [--count N] [--embed-rows R] [--prompt-tokens P]\n"
               "                        [--max-new T] [--seed S] [--mixed]\n");
}

typedef struct mkpages_args {
    mkpages_opts po;
    const char *model_path, *out;
} mkpages_args;

static pd_status mkpages_flag(void *ctx, int ch, const char *arg, pd_err *e)
{
    mkpages_args *a = ctx;
    switch (ch) {
    case 'm': a->model_path = arg; return PD_OK;
    case 'n': return cli_u32("--count", arg, 1, 1000000, &a->po.count, e);
    case 'r': return cli_u32("--embed-rows", arg, 0, 1u << 20, &a->po.embed_rows, e);
    case 'p': return cli_u32("--prompt-tokens", arg, 0, 1u << 20, &a->po.prompt_tokens, e);
    case 't': return cli_u32("--max-new", arg, 0, 1u << 20, &a->po.max_new, e);
    case 's': return cli_u64("--seed", arg, &a->po.seed, e);
    case 'o': a->out = arg; return PD_OK;
    case 'x': a->po.mixed = true; return PD_OK;
    default: CHECKF(0, "mkpages: option code %d without its case", ch);
    }
    return PD_OK;
}

static pd_status mkpages_check(void *ctx, pd_err *e)
{
    const mkpages_args *a = ctx;
    if (!a->model_path || !a->out)
        return pd_err_set(e, PD_ERR_ARG, "--model M and --out DIR are required");
    return PD_OK;
}

static const struct option mkpages_longopts[] = {
    {"model", required_argument, 0, 'm'},     {"count", required_argument, 0, 'n'},
    {"embed-rows", required_argument, 0, 'r'}, {"prompt-tokens", required_argument, 0, 'p'},
    {"max-new", required_argument, 0, 't'},   {"seed", required_argument, 0, 's'},
    {"out", required_argument, 0, 'o'},       {"mixed", no_argument, 0, 'x'},
    {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};

static const cli_cmd mkpages_cli = {
    .name = "mkpages", .opts = mkpages_longopts, .flag = mkpages_flag, .check = mkpages_check, .usage = mkpages_usage};

int cmd_mkpages(int argc, char **argv)
{
    mkpages_args a = {.po = {.count = 4, .embed_rows = 273, .prompt_tokens = 3, .max_new = 64, .seed = 1}};
    int rc = cli_parse(&mkpages_cli, argc, argv, &a, stdout, stderr);
    if (rc != CLI_GO)
        return rc;
    mkpages_opts po = a.po;
    const char *model_path = a.model_path, *out = a.out;
    pd_err e = {0};
    model_hparams hp;
    pd_status st = model_read_hparams(model_path, &hp, &e);
    if (st == PD_OK)
        st = mkpages_write(&po, &hp, out, &e);
    if (st != PD_OK) {
        fprintf(stderr, "pipedec mkpages: %s\n", e.msg);
        if (st == PD_ERR_ARG)
            mkpages_usage(stderr);
        return 2;
    }
    printf("pipedec mkpages: wrote %s/pages.jsonl (%u pages: BOS + %u embedding rows + %u prompt tokens, "
           "max_new_tokens %u%s)\n",
           out, po.count, po.embed_rows, po.prompt_tokens, po.max_new, po.mixed ? ", mixed lengths" : "");
    return 0;
}
