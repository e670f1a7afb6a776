/* pipedec merge: join the outputs of a sharded run in manifest order and
 * prove them complete (cluster/format/merge.h). */
#include "base/check.h"
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"
#include "cluster/format/merge.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static void merge_usage(FILE *f)
{
    fprintf(f, "usage: pipedec merge --pages P --out-dir DIR --out FINAL.jsonl\n"
               "  reads every *.jsonl file in DIR as a shard's output; FINAL gets one line per page\n"
               "  of P, in P's order; exit 1 (FINAL not written) when a page is missing, failed or\n"
               "  duplicated, or an output holds an id P lacks\n");
}

static int merge_name_cmp(const void *a, const void *b)
{
    return strverscmp(*(char *const *)a, *(char *const *)b);
}

/* The *.jsonl regular files in dir, sorted (shard-2 before shard-10); owned
 * array of owned strings. */
static int merge_list(const char *dir, char ***out, size_t *n)
{
    DIR *d = opendir(dir);
    if (!d) {
        fprintf(stderr, "pipedec merge: %s: cannot list: %s\n", dir, strerror(errno));
        return -1;
    }
    char **v = NULL;
    size_t k = 0, cap = 0;
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (de->d_name[0] == '.' || l <= 6 || strcmp(de->d_name + l - 6, ".jsonl") != 0)
            continue;
        char path[PATH_MAX];
        struct stat sb;
        if (snprintf(path, sizeof path, "%s/%s", dir, de->d_name) >= (int)sizeof path ||
            stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            continue;
        if (k == cap) {
            cap = cap ? 2 * cap : 16;
            char **nv = realloc(v, cap * sizeof *nv);
            if (!nv) {
                rc = -1;
                break;
            }
            v = nv;
        }
        if (!(v[k] = strdup(path)))
            rc = -1;
        else
            k++;
    }
    closedir(d);
    if (rc == 0)
        qsort(v, k, sizeof *v, merge_name_cmp);
    *out = v;
    *n = k;
    if (rc != 0)
        fprintf(stderr, "pipedec merge: no memory\n");
    return rc;
}

/* True when path lies directly in dir (a later merge would read it back). */
static int merge_in_dir(const char *path, const char *dir)
{
    char d1[PATH_MAX], d2[PATH_MAX], parent[PATH_MAX];
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(parent, sizeof parent, ".");
    else
        snprintf(parent, sizeof parent, "%.*s", slash == path ? 1 : (int)(slash - path), path);
    return realpath(parent, d1) && realpath(dir, d2) && strcmp(d1, d2) == 0;
}

typedef struct merge_args {
    const char *pages, *dir, *final;
} merge_args;

static pd_status merge_flag(void *ctx, int ch, const char *arg, pd_err *e)
{
    (void)e;
    merge_args *a = ctx;
    switch (ch) {
    case 'p': a->pages = arg; break;
    case 'd': a->dir = arg; break;
    case 'o': a->final = arg; break;
    default: CHECKF(0, "merge: option code %d without its case", ch);
    }
    return PD_OK;
}

static pd_status merge_check(void *ctx, pd_err *e)
{
    const merge_args *a = ctx;
    if (!a->pages || !a->dir || !a->final)
        return pd_err_set(e, PD_ERR_ARG, "--pages, --out-dir and --out are required");
    return PD_OK;
}

static const struct option merge_longopts[] = {{"pages", required_argument, 0, 'p'},
                                               {"out-dir", required_argument, 0, 'd'},
                                               {"out", required_argument, 0, 'o'},
                                               {"help", no_argument, 0, 'h'},
                                               {0, 0, 0, 0}};

static const cli_cmd merge_cli = {
    .name = "merge", .opts = merge_longopts, .flag = merge_flag, .check = merge_check, .usage = merge_usage};

int cmd_merge(int argc, char **argv)
{
    merge_args a = {0};
    int rc = cli_parse(&merge_cli, argc, argv, &a, stdout, stderr);
    if (rc != CLI_GO)
        return rc;
    const char *pages = a.pages, *dir = a.dir, *final = a.final;
    if (merge_in_dir(final, dir)) {
        fprintf(stderr, "pipedec merge: %s is in %s, where every *.jsonl is read as a shard's output; "
                "write it elsewhere\n", final, dir);
        return CMD_EXIT_USAGE;
    }
    char **files = NULL;
    size_t n = 0;
    if (merge_list(dir, &files, &n) != 0)
        return CMD_EXIT_USAGE;
    merge_report rep = {0};
    pd_err e = {0};
    pd_status st = merge_outputs(pages, (const char *const *)files, n, final, stderr, &rep, &e);
    for (size_t i = 0; i < n; i++)
        free(files[i]);
    free(files);
    if (st != PD_OK) {
        /* the module's own "merge: " prefix would repeat the command's */
        const char *msg = strncmp(e.msg, "merge: ", 7) == 0 ? e.msg + 7 : e.msg;
        fprintf(stderr, "pipedec merge: %s\n", msg);
        return st == PD_ERR_IO || st == PD_ERR_NOMEM ? CMD_EXIT_USAGE : CMD_EXIT_INVALID;
    }
    printf("pipedec merge: wrote %s (%zu pages from %zu outputs)\n", final, rep.written, n);
    return CMD_EXIT_OK;
}
