/* pipedec mkmodel: write a deterministic synthetic model. */
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"
#include "cluster/cli/mkmodel.h"

#include <getopt.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

static void mkmodel_usage(FILE *f)
{
    fprintf(f, "usage: pipedec mkmodel --out FILE [--arch llama|qwen2] [--layers N] [--hidden N] [--heads N]\n"
               "                        [--kv-heads N] [--ffn N] [--vocab N] [--ctx N] [--dtype f32|f16]\n"
               "                        [--seed S] [--eos-boost X]\n");
}

int cmd_mkmodel(int argc, char **argv)
{
    static const struct option opts[] = {
        {"arch", required_argument, 0, 'a'},   {"layers", required_argument, 0, 'l'},
        {"hidden", required_argument, 0, 'H'}, {"heads", required_argument, 0, 'h'},
        {"kv-heads", required_argument, 0, 'k'}, {"ffn", required_argument, 0, 'f'},
        {"vocab", required_argument, 0, 'v'},  {"ctx", required_argument, 0, 'c'},
        {"dtype", required_argument, 0, 'd'},  {"seed", required_argument, 0, 's'},
        {"out", required_argument, 0, 'o'},    {"eos-boost", required_argument, 0, 'e'},
        {"help", no_argument, 0, 'Z'},         {0, 0, 0, 0}};
    mkmodel_opts mo;
    mkmodel_defaults(&mo);
    const char *out = NULL;
    pd_err e = {0};
    pd_status st = PD_OK;
    int ch;
    optind = 1;
    opterr = 0;
    while (st == PD_OK && (ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'a':
            if (strcmp(optarg, "llama") == 0)
                mo.arch = MODEL_ARCH_LLAMA;
            else if (strcmp(optarg, "qwen2") == 0)
                mo.arch = MODEL_ARCH_QWEN2;
            else
                st = pd_err_set(&e, PD_ERR_ARG, "--arch '%s': expected llama or qwen2", optarg);
            break;
        case 'l': st = cli_u32("--layers", optarg, 1, 1024, &mo.layers, &e); break;
        case 'H': st = cli_u32("--hidden", optarg, 2, 65536, &mo.hidden, &e); break;
        case 'h': st = cli_u32("--heads", optarg, 1, 1024, &mo.heads, &e); break;
        case 'k': st = cli_u32("--kv-heads", optarg, 1, 1024, &mo.kv_heads, &e); break;
        case 'f': st = cli_u32("--ffn", optarg, 1, 1u << 20, &mo.ffn, &e); break;
        case 'v': st = cli_u32("--vocab", optarg, 1, 1u << 20, &mo.vocab, &e); break;
        case 'c': st = cli_u32("--ctx", optarg, 16, 1u << 24, &mo.ctx, &e); break;
        case 'd':
            if (strcmp(optarg, "f32") == 0)
                mo.f16 = 0;
            else if (strcmp(optarg, "f16") == 0)
                mo.f16 = 1;
            else
                st = pd_err_set(&e, PD_ERR_ARG, "--dtype '%s': expected f32 or f16", optarg);
            break;
        case 's': st = cli_u64("--seed", optarg, &mo.seed, &e); break;
        case 'e': {
            char *end;
            mo.eos_boost = strtof(optarg, &end);
            if (*end || !(mo.eos_boost > 0.0f) || mo.eos_boost > 1000.0f)
                st = pd_err_set(&e, PD_ERR_ARG, "--eos-boost '%s': expected a number in (0, 1000]", optarg);
            break;
        }
        case 'o': out = optarg; break;
        case 'Z':
            mkmodel_usage(stdout);
            return 0;
        default:
            st = pd_err_set(&e, PD_ERR_ARG, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (st == PD_OK && optind < argc)
        st = pd_err_set(&e, PD_ERR_ARG, "unexpected argument '%s'", argv[optind]);
    if (st == PD_OK && !out)
        st = pd_err_set(&e, PD_ERR_ARG, "--out FILE is required");
    if (st == PD_OK)
        st = mkmodel_write(&mo, out, &e);
    if (st != PD_OK) {
        fprintf(stderr, "pipedec mkmodel: %s\n", e.msg);
        if (st == PD_ERR_ARG)
            mkmodel_usage(stderr);
        return 2;
    }
    printf("pipedec mkmodel: wrote %s (%s, %u layers, hidden %u, %u heads / %u kv heads, ffn %u, vocab %u, %s)\n",
           out, mo.arch == MODEL_ARCH_LLAMA ? "llama" : "qwen2", mo.layers, mo.hidden, mo.heads, mo.kv_heads,
           mo.ffn, mo.vocab, mo.f16 ? "f16" : "f32");
    return 0;
}
