/* pipedec score: character error rate of a decode run against the text its
 * pages were rendered from (cluster/cli/score.h). */
#include "base/check.h"
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"
#include "cluster/cli/score.h"
#include "cluster/format/render.h"

#include "base/file.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void score_usage(FILE *f)
{
    fprintf(f, "usage: pipedec score --pages P --out O.jsonl --truth T [--json]\n"
               "  P: the manifest `pipedec render --text T` wrote; O.jsonl: `pipedec run`'s output\n"
               "  prints per page and overall CER = edit distance / reference characters\n");
}

/* id as a JSON string body: quote, backslash and control bytes escaped. */
static void score_json_str(const char *s)
{
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
}

typedef struct score_args {
    const char *pages, *outp, *truth;
    int json;
} score_args;

static pd_status score_flag(void *ctx, int ch, const char *arg, pd_err *e)
{
    (void)e;
    score_args *a = ctx;
    switch (ch) {
    case 'p': a->pages = arg; break;
    case 'o': a->outp = arg; break;
    case 't': a->truth = arg; break;
    case 'j': a->json = 1; break;
    default: CHECKF(0, "score: option code %d without its case", ch);
    }
    return PD_OK;
}

static pd_status score_check(void *ctx, pd_err *e)
{
    const score_args *a = ctx;
    if (!a->pages || !a->outp || !a->truth)
        return pd_err_set(e, PD_ERR_ARG, "--pages P, --out O.jsonl and --truth T are required");
    return PD_OK;
}

static const struct option score_longopts[] = {{"pages", required_argument, 0, 'p'}, {"out", required_argument, 0, 'o'},
                                               {"truth", required_argument, 0, 't'}, {"json", no_argument, 0, 'j'},
                                               {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};

static const cli_cmd score_cli = {
    .name = "score", .opts = score_longopts, .flag = score_flag, .check = score_check, .usage = score_usage};

int cmd_score(int argc, char **argv)
{
    score_args a = {0};
    int rc = cli_parse(&score_cli, argc, argv, &a, stdout, stderr);
    if (rc != CLI_GO)
        return rc;
    const char *pages = a.pages, *outp = a.outp, *truth = a.truth;
    int json = a.json;
    pd_err e = {0};
    pd_status st;
    uint8_t *text = NULL;
    size_t len = 0;
    render_doc *doc = NULL;
    score_result *r = NULL;
    const char **refs = NULL;
    size_t *ref_len = NULL;
    st = pd_file_read_all(truth, NULL, &text, &len, &e);
    if (st == PD_OK && (st = render_doc_parse((const char *)text, len, &doc, &e)) != PD_OK)
        pd_err_prefix(&e, "%s", truth);
    if (st == PD_OK) {
        size_t n = render_doc_pages(doc);
        refs = calloc(n, sizeof *refs);
        ref_len = calloc(n, sizeof *ref_len);
        if (!refs || !ref_len)
            st = pd_err_set(&e, PD_ERR_NOMEM, "score: out of memory");
        for (size_t i = 0; st == PD_OK && i < n; i++)
            refs[i] = render_page_truth(doc, i, &ref_len[i]);
        if (st == PD_OK)
            st = score_run(pages, outp, refs, ref_len, n, &r, &e);
    }
    if (st == PD_OK) {
        size_t tot_ref = 0, tot_ed = 0, n = score_count(r);
        if (json)
            printf("{\"pages\":[");
        for (size_t i = 0; i < n; i++) {
            const score_page *p = score_get(r, i);
            double cer = p->ref_chars ? (double)p->edits / (double)p->ref_chars : 0.0;
            if (json) {
                printf("%s{\"id\":\"", i ? "," : "");
                score_json_str(p->id);
                printf("\",\"ref_chars\":%zu,\"hyp_chars\":%zu,\"edits\":%zu,\"cer\":%.6f}", p->ref_chars, p->hyp_chars,
                       p->edits, cer);
            }
            else
                printf("%-12s cer %.4f  (%zu edits / %zu chars)\n", p->id, cer, p->edits, p->ref_chars);
            tot_ref += p->ref_chars;
            tot_ed += p->edits;
        }
        double cer = tot_ref ? (double)tot_ed / (double)tot_ref : 0.0;
        if (json)
            printf("],\"overall\":{\"pages\":%zu,\"ref_chars\":%zu,\"edits\":%zu,\"cer\":%.6f}}\n", n, tot_ref, tot_ed,
                   cer);
        else
            printf("%-12s cer %.4f  (%zu edits / %zu chars, %zu pages)\n", "overall", cer, tot_ed, tot_ref, n);
    }
    score_free(r);
    free(refs);
    free(ref_len);
    render_doc_free(doc);
    free(text);
    if (st != PD_OK) {
        fprintf(stderr, "pipedec score: %s\n", e.msg);
        return st == PD_ERR_IO ? CMD_EXIT_USAGE : CMD_EXIT_INVALID;
    }
    return CMD_EXIT_OK;
}
