/* The subcommands of the `pipedec` binary.
 *
 * cluster/cli/main.c is a small dispatch table {name, function, one-line help};
 * each subcommand lives in cluster/cmd_<name>.c and is declared here. A
 * subcommand receives argv starting at its own name (argv[0] == "inspect"),
 * parses its options, prints its own --help, and returns the process exit
 * status: 0 success, 1 the input is invalid or the work failed, 2 usage or
 * I/O error (the CLI convention; only main exits). */
#ifndef PD_CMD_H
#define PD_CMD_H

#include <stdio.h>

typedef int (*cmd_fn)(int argc, char **argv);

typedef struct cmd_entry {
    const char *name;
    cmd_fn fn;
    const char *help; /* one line */
} cmd_entry;

/* Exit statuses shared by every subcommand. */
enum {
    CMD_EXIT_OK = 0,
    CMD_EXIT_INVALID = 1, /* input invalid / work failed */
    CMD_EXIT_USAGE = 2,   /* bad arguments, unreadable file */
};

/* `pipedec inspect FILE [--json] [--legacy]`: describes and validates a CMFS
 * record or a state bundle (see docs/wire.md). Exit 0 when valid, 1 with the
 * first error's byte offset and reason when not, 2 for usage or an
 * unreadable file (anything but a regular file or "-" for standard input is
 * refused, naming the path, before it is read). */
int cmd_inspect(int argc, char **argv);

/* cmd_inspect with explicit output streams (tests capture them). */
int cmd_inspect_run(int argc, char **argv, FILE *out, FILE *err);

/* `pipedec shard`: split a page manifest into shards (cluster/format/shard.h). */
int cmd_shard(int argc, char **argv);

/* `pipedec merge`: join shard outputs in manifest order (cluster/format/merge.h). */
int cmd_merge(int argc, char **argv);

/* `pipedec run`: decode a page manifest, on one rank or as an MPI pipeline
 * (cluster/runtime/job/run.h). Initializes and finalizes MPI itself. */
int cmd_run(int argc, char **argv);

/* `pipedec ctl PATH COMMAND...`: sends one command to a running job's
 * control socket (run --control PATH, cluster/runtime/ops/ctl.h, jobctl.h) and
 * prints the reply: status (human lines, or the JSON line with --json),
 * migrate --map M, migrate --layer L --to R, checkpoint, stop. Exit 0 when
 * the job did it, 1 when it refused (the reason on stderr, the JSON reply
 * on stdout), 2 usage error or no job listening. */
int cmd_ctl(int argc, char **argv);

/* `pipedec mkmodel`: write a deterministic synthetic GGUF model. */
int cmd_mkmodel(int argc, char **argv);

/* `pipedec mkpages`: write a deterministic synthetic page manifest. */
int cmd_mkpages(int argc, char **argv);

/* `pipedec render`: text pages -> an OCR page manifest (cluster/format/render.h). */
int cmd_render(int argc, char **argv);

/* `pipedec tokenize`: text -> ids with the model's own tokenizer
 * (cluster/format/tokenizer.h), like llama.cpp's llama-tokenize. */
int cmd_tokenize(int argc, char **argv);

/* `pipedec encode`: the image pages of a manifest to embeddings pages with
 * llama.cpp's mtmd (cluster/vision/venc.h); a pre-pass before `run`. */
int cmd_encode(int argc, char **argv);

/* `pipedec score`: character error rate of an output file against the text. */
int cmd_score(int argc, char **argv);

#endif
