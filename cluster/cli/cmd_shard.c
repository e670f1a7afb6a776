/* pipedec shard: split a page manifest into shard manifests for an array job
 * (cluster/format/shard.h says how pages are assigned). */
#include "base/check.h"
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"
#include "cluster/format/shard.h"

#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void shard_usage(FILE *f)
{
    fprintf(f, "usage: pipedec shard --pages P --shards S --out DIR\n"
               "  writes DIR/shard-0.jsonl .. DIR/shard-(S-1).jsonl: contiguous runs of P, each about\n"
               "  1/S of the estimated cost (prefill rows + max_new_tokens per page); relative\n"
               "  embedding paths are rewritten to stay valid from DIR\n");
}

typedef struct shard_args {
    const char *pages, *out;
    uint32_t shards;
} shard_args;

static pd_status shard_flag(void *ctx, int ch, const char *arg, pd_err *e)
{
    shard_args *a = ctx;
    switch (ch) {
    case 'p': a->pages = arg; return PD_OK;
    case 's': return cli_u32("--shards", arg, 1, SHARD_MAX, &a->shards, e);
    case 'o': a->out = arg; return PD_OK;
    default: CHECKF(0, "shard: option code %d without its case", ch);
    }
    return PD_OK;
}

static pd_status shard_check(void *ctx, pd_err *e)
{
    const shard_args *a = ctx;
    if (!a->pages || !a->out || !a->shards)
        return pd_err_set(e, PD_ERR_ARG, "--pages, --shards and --out are required");
    return PD_OK;
}

static const struct option shard_longopts[] = {{"pages", required_argument, 0, 'p'},
                                               {"shards", required_argument, 0, 's'},
                                               {"out", required_argument, 0, 'o'},
                                               {"help", no_argument, 0, 'h'},
                                               {0, 0, 0, 0}};

static const cli_cmd shard_cli = {
    .name = "shard", .opts = shard_longopts, .flag = shard_flag, .check = shard_check, .usage = shard_usage};

int cmd_shard(int argc, char **argv)
{
    shard_args a = {0};
    int rc = cli_parse(&shard_cli, argc, argv, &a, stdout, stderr);
    if (rc != CLI_GO)
        return rc;
    const char *pages = a.pages, *out = a.out;
    uint32_t shards = a.shards;
    pd_err e = {0};
    pd_status st = PD_OK;
    size_t *n = calloc(shards, sizeof *n);
    uint64_t *cost = calloc(shards, sizeof *cost);
    if (!n || !cost)
        st = pd_err_set(&e, PD_ERR_NOMEM, "no memory");
    if (st == PD_OK)
        st = shard_split(pages, shards, out, &(shard_counts){.pages = n, .cost = cost}, &e);
    if (st == PD_OK) {
        size_t total_pages = 0;
        uint64_t total = 0;
        for (uint32_t k = 0; k < shards; k++) {
            total_pages += n[k];
            total += cost[k];
        }
        for (uint32_t k = 0; k < shards; k++)
            printf("shard %" PRIu32 ": %zu pages, estimated cost %" PRIu64 " rows (%.1f%%)\n", k, n[k],
                   cost[k], total ? 100.0 * (double)cost[k] / (double)total : 0.0);
        printf("pipedec shard: wrote %s/shard-0.jsonl .. shard-%" PRIu32 ".jsonl (%zu pages, %" PRIu64
               " rows estimated)\n", out, shards - 1, total_pages, total);
    }
    free(n);
    free(cost);
    if (st != PD_OK) {
        /* the module's own "shard: " prefix would repeat the command's */
        const char *msg = strncmp(e.msg, "shard: ", 7) == 0 ? e.msg + 7 : e.msg;
        fprintf(stderr, "pipedec shard: %s\n", msg);
        return st == PD_ERR_IO || st == PD_ERR_NOMEM ? CMD_EXIT_USAGE : CMD_EXIT_INVALID;
    }
    return CMD_EXIT_OK;
}
