/* pipedec: the command-line entry point. A dispatch table of subcommands
 * (cluster/cli/cmd.h); each lives in cluster/cmd_<name>.c. Adding one = one line
 * in `commands` below. Only this file decides the process exit status. */
#include "cluster/cli/cmd.h"

#include <stdio.h>
#include <string.h>

static const cmd_entry commands[] = {
    {.name = "run", .fn = cmd_run, .help = "decode a page manifest (mpirun -np N pipedec run ... for a pipeline)"},
    {.name = "mkmodel", .fn = cmd_mkmodel, .help = "write a deterministic synthetic GGUF model"},
    {.name = "mkpages", .fn = cmd_mkpages, .help = "write a deterministic synthetic page manifest"},
    {.name = "render", .fn = cmd_render, .help = "render text pages into an OCR page manifest (glyph cells)"},
    {.name = "encode", .fn = cmd_encode, .help = "page images -> embeddings pages with the vision encoder (mtmd)"},
    {.name = "tokenize", .fn = cmd_tokenize, .help = "text -> token ids with the model's own tokenizer"},
    {.name = "score", .fn = cmd_score, .help = "character error rate of decoded pages against their text"},
    {.name = "shard", .fn = cmd_shard, .help = "split a page manifest into shards for an array job"},
    {.name = "merge", .fn = cmd_merge, .help = "join shard outputs in manifest order, checking completeness"},
    {.name = "inspect", .fn = cmd_inspect,
     .help = "describe and validate a CMFS record or state bundle"},
    {.name = "ctl", .fn = cmd_ctl, .help = "talk to a running job's control socket (run --control PATH)"},
};

static const size_t n_commands = sizeof commands / sizeof commands[0];

static void usage(FILE *f)
{
    fprintf(f, "usage: pipedec <command> [options]\n\ncommands:\n");
    for (size_t i = 0; i < n_commands; i++)
        fprintf(f, "  %-10s %s\n", commands[i].name, commands[i].help);
    fprintf(f, "\n`pipedec <command> --help` describes a command's options.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return CMD_EXIT_USAGE;
    }
    const char *name = argv[1];
    if (strcmp(name, "-h") == 0 || strcmp(name, "--help") == 0) {
        usage(stdout);
        return CMD_EXIT_OK;
    }
    if (strcmp(name, "help") == 0) {
        if (argc < 3) {
            usage(stdout);
            return CMD_EXIT_OK;
        }
        name = argv[2];
        for (size_t i = 0; i < n_commands; i++)
            if (strcmp(commands[i].name, name) == 0) {
                char *args[] = {argv[2], "--help", NULL};
                return commands[i].fn(2, args);
            }
    } else {
        for (size_t i = 0; i < n_commands; i++)
            if (strcmp(commands[i].name, name) == 0)
                return commands[i].fn(argc - 1, argv + 1);
    }
    fprintf(stderr, "pipedec: unknown command '%s'\n\n", name);
    usage(stderr);
    return CMD_EXIT_USAGE;
}
