/* pipedec ctl: one command to a running job's control socket (cmd.h). */
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"
#include "cluster/runtime/ops/ctl.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void ctl_usage(FILE *f)
{
    fprintf(f, "usage: pipedec ctl SOCKET status [--json]\n"
               "       pipedec ctl SOCKET migrate --map 0-3,4-11\n"
               "       pipedec ctl SOCKET migrate --layer L --to R\n"
               "       pipedec ctl SOCKET checkpoint | stop\n"
               "  [--timeout SECONDS] (default 600) anywhere after SOCKET\n"
               "exit 0 done, 1 refused by the job (why on stderr), 2 usage error or no job listening\n");
}

static double num(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return cJSON_IsNumber(v) ? v->valuedouble : 0;
}

/* status as `key: value` lines */
static void print_status(const cJSON *j)
{
    const cJSON *map = cJSON_GetObjectItemCaseSensitive(j, "map");
    printf("map: %s\n", cJSON_IsString(map) ? map->valuestring : "?");
    printf("step: %.0f\nwindow_s: %.3f\n", num(j, "step"), num(j, "window_s"));
    const cJSON *st;
    cJSON_ArrayForEach(st, cJSON_GetObjectItemCaseSensitive(j, "stages"))
        printf("stage %.0f: layers %.0f-%.0f, busy %.3f s (%.0f%%), waiting %.3f s\n", num(st, "rank"), num(st, "first"),
               num(st, "first") + num(st, "layers") - 1, num(st, "busy_s"), 100 * num(st, "busy_frac"),
               num(st, "wait_s"));
    printf("streams: %.0f\npages: %.0f/%.0f\ntokens: %.0f\ntokens_per_s: %.1f\n", num(j, "streams"),
           num(j, "pages_done"), num(j, "pages_total"), num(j, "tokens"), num(j, "tokens_per_s"));
    const cJSON *ck = cJSON_GetObjectItemCaseSensitive(j, "checkpoint");
    const cJSON *dir = cJSON_GetObjectItemCaseSensitive(ck, "dir");
    printf("checkpoint: %s (%.0f written)\n", cJSON_IsString(dir) ? dir->valuestring : "off", num(ck, "written"));
    printf("migrations: %.0f done, %.0f refused%s\n", num(j, "migrations"), num(j, "migrations_refused"),
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(j, "migrating")) ? ", one pending" : "");
    const cJSON *rb = cJSON_GetObjectItemCaseSensitive(j, "rebalance");
    printf("rebalance: %s\n", cJSON_IsString(rb) ? rb->valuestring : "?");
}

int cmd_ctl(int argc, char **argv)
{
    if (argc >= 2 && (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0)) {
        ctl_usage(stdout);
        return CMD_EXIT_OK;
    }
    if (argc < 3) {
        ctl_usage(stderr);
        return CMD_EXIT_USAGE;
    }
    const char *path = argv[1];
    bool json = false;
    double timeout = 600;
    char line[CTL_LINE_MAX] = "";
    size_t n = 0;
    pd_err e = {0};
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            json = true;
            continue;
        }
        if (strcmp(argv[i], "--timeout") == 0) {
            uint32_t t;
            if (i + 1 >= argc || cli_u32("--timeout", argv[i + 1], 1, 7u * 24 * 3600, &t, &e) != PD_OK) {
                fprintf(stderr, "pipedec ctl: %s\n", i + 1 >= argc ? "--timeout needs a value" : e.msg);
                return CMD_EXIT_USAGE;
            }
            timeout = t;
            i++;
            continue;
        }
        if (strchr(argv[i], ' ') || strchr(argv[i], '\n') || strlen(argv[i]) + 2 > sizeof line - n) {
            fprintf(stderr, "pipedec ctl: argument '%s' has a space or newline, or the command is too long\n", argv[i]);
            return CMD_EXIT_USAGE;
        }
        n += (size_t)snprintf(line + n, sizeof line - n, "%s%s", n ? " " : "", argv[i]);
    }
    const char *cmds[] = {"status", "migrate", "checkpoint", "stop"};
    bool known = false;
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++)
        known |= strncmp(line, cmds[i], strlen(cmds[i])) == 0 &&
                 (line[strlen(cmds[i])] == ' ' || line[strlen(cmds[i])] == '\0');
    if (!known) {
        fprintf(stderr, "pipedec ctl: unknown command '%s'\n", line);
        ctl_usage(stderr);
        return CMD_EXIT_USAGE;
    }
    char *reply = NULL;
    if (ctl_request(path, line, timeout, &reply, &e) != PD_OK) {
        fprintf(stderr, "pipedec ctl: %s\n", e.msg);
        return CMD_EXIT_USAGE;
    }
    cJSON *j = cJSON_Parse(reply);
    const cJSON *ok = cJSON_GetObjectItemCaseSensitive(j, "ok");
    int code = CMD_EXIT_OK;
    if (!j || !cJSON_IsBool(ok)) {
        fprintf(stderr, "pipedec ctl: the job's reply is not a JSON object with \"ok\": %.200s\n", reply);
        code = CMD_EXIT_USAGE;
    } else if (!cJSON_IsTrue(ok)) {
        const cJSON *why = cJSON_GetObjectItemCaseSensitive(j, "error");
        fprintf(stderr, "pipedec ctl: refused: %s\n", cJSON_IsString(why) ? why->valuestring : "(no reason given)");
        printf("%s\n", reply);
        code = CMD_EXIT_INVALID;
    } else if (strcmp(line, "status") == 0 && !json)
        print_status(j);
    else
        printf("%s\n", reply);
    cJSON_Delete(j);
    free(reply);
    return code;
}
