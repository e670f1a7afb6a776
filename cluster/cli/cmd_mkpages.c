/* pipedec mkpages: write a deterministic synthetic page manifest. */
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

int cmd_mkpages(int argc, char **argv)
{
    static const struct option opts[] = {
        {"model", required_argument, 0, 'm'},     {"count", required_argument, 0, 'n'},
        {"embed-rows", required_argument, 0, 'r'}, {"prompt-tokens", required_argument, 0, 'p'},
        {"max-new", required_argument, 0, 't'},   {"seed", required_argument, 0, 's'},
        {"out", required_argument, 0, 'o'},       {"mixed", no_argument, 0, 'x'},
        {"help", no_argument, 0, 'h'},            {0, 0, 0, 0}};
    mkpages_opts po = {.count = 4, .embed_rows = 273, .prompt_tokens = 3, .max_new = 64, .seed = 1};
    const char *model_path = NULL, *out = NULL;
    pd_err e = {0};
    pd_status st = PD_OK;
    int ch;
    optind = 1;
    opterr = 0;
    while (st == PD_OK && (ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': model_path = optarg; break;
        case 'n': st = cli_u32("--count", optarg, 1, 1000000, &po.count, &e); break;
        case 'r': st = cli_u32("--embed-rows", optarg, 0, 1u << 20, &po.embed_rows, &e); break;
        case 'p': st = cli_u32("--prompt-tokens", optarg, 0, 1u << 20, &po.prompt_tokens, &e); break;
        case 't': st = cli_u32("--max-new", optarg, 0, 1u << 20, &po.max_new, &e); break;
        case 's': st = cli_u64("--seed", optarg, &po.seed, &e); break;
        case 'o': out = optarg; break;
        case 'x': po.mixed = true; break;
        case 'h': mkpages_usage(stdout); return 0;
        default: st = pd_err_set(&e, PD_ERR_ARG, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (st == PD_OK && optind < argc)
        st = pd_err_set(&e, PD_ERR_ARG, "unexpected argument '%s'", argv[optind]);
    if (st == PD_OK && (!model_path || !out))
        st = pd_err_set(&e, PD_ERR_ARG, "--model M and --out DIR are required");
    model_hparams hp;
    if (st == PD_OK)
        st = model_read_hparams(model_path, &hp, &e);
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
