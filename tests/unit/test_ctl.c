/* ctl: the control socket — mode 0600, one request line in, one reply line
 * out, never blocking the server; a client gone before its reply costs
 * nothing; a path that exists is replaced only when it is a stale socket;
 * silent or half-line clients cannot hold the slots (timeout, eviction of
 * the oldest idle one). */
#include "pd_test.h"

#include "cluster/runtime/ops/ctl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

/* name in the test's own directory (pd_tmpdir: the checked fixture makes it
 * before each test and removes it after) */
static void mkpath(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", pd_tmpdir, name);
}

typedef struct client_arg {
    const char *path, *line;
    char *reply;
    pd_status st;
} client_arg;

static void *client(void *p)
{
    client_arg *a = p;
    pd_err e = {0};
    a->st = ctl_request(a->path, a->line, 10, &a->reply, &e);
    return NULL;
}

/* Polls the server until a request arrives (the server never blocks). */
static int wait_request(ctl *c, char *line, size_t cap)
{
    int id;
    for (int i = 0; i < 5000; i++) {
        if (ctl_next(c, &id, line, cap))
            return id;
        usleep(1000);
    }
    ck_abort_msg("no request arrived");
    return -1;
}

START_TEST(ctl_one_line_in_one_line_out)
{
    char path[300], line[CTL_LINE_MAX];
    mkpath(path, sizeof path, "a.sock");
    ctl *c = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ctl_open(path, 0, &c, &e), PD_OK);
    struct stat sb;
    ck_assert_int_eq(stat(path, &sb), 0);
    ck_assert_uint_eq(sb.st_mode & 0777, 0600);
    int id;
    ck_assert(!ctl_next(c, &id, line, sizeof line)); /* nothing yet, and no wait */
    client_arg a = {.path = path, .line = "migrate --map 0-3,4-11"};
    pthread_t t;
    pthread_create(&t, NULL, client, &a);
    id = wait_request(c, line, sizeof line);
    ck_assert_str_eq(line, "migrate --map 0-3,4-11");
    ctl_reply(c, id, "{\"ok\":true}");
    pthread_join(t, NULL);
    ck_assert_int_eq(a.st, PD_OK);
    ck_assert_str_eq(a.reply, "{\"ok\":true}");
    free(a.reply);
    ctl_close(c);
    ck_assert_int_ne(access(path, F_OK), 0); /* removed */
}
END_TEST

START_TEST(ctl_client_gone_before_its_reply_costs_nothing)
{
    char path[300], line[CTL_LINE_MAX];
    mkpath(path, sizeof path, "b.sock");
    ctl *c = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ctl_open(path, 0, &c, &e), PD_OK);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ck_assert_uint_lt(strlen(path), sizeof sa.sun_path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    ck_assert_int_eq(write(fd, "status\n", 7), 7);
    close(fd);
    int id = wait_request(c, line, sizeof line);
    ck_assert_str_eq(line, "status");
    ctl_reply(c, id, "{\"ok\":true}"); /* no SIGPIPE, no error */
    /* and the server still serves */
    client_arg a = {.path = path, .line = "stop"};
    pthread_t t;
    pthread_create(&t, NULL, client, &a);
    id = wait_request(c, line, sizeof line);
    ck_assert_str_eq(line, "stop");
    ctl_reply(c, id, "{\"ok\":false,\"error\":\"x\"}");
    pthread_join(t, NULL);
    ck_assert_int_eq(a.st, PD_OK);
    free(a.reply);
    ctl_close(c);
}
END_TEST

START_TEST(ctl_existing_paths)
{
    char path[300];
    ctl *c = NULL, *c2 = NULL;
    pd_err e = {0};
    /* a file is never replaced */
    mkpath(path, sizeof path, "file");
    FILE *f = fopen(path, "w");
    fputs("keep", f);
    fclose(f);
    ck_assert_int_eq(ctl_open(path, 0, &c, &e), PD_ERR_ARG);
    ck_assert_ptr_nonnull(strstr(e.msg, "not a socket"));
    ck_assert_int_eq(access(path, F_OK), 0);
    /* a live socket is refused */
    mkpath(path, sizeof path, "live.sock");
    ck_assert_int_eq(ctl_open(path, 0, &c, &e), PD_OK);
    e = (pd_err){0};
    ck_assert_int_eq(ctl_open(path, 0, &c2, &e), PD_ERR_ARG);
    ck_assert_msg(strstr(e.msg, "another job is listening"), "%s", e.msg);
    ctl_close(c);
    /* a stale socket (bound, nobody listening) is replaced */
    mkpath(path, sizeof path, "stale.sock");
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    ck_assert_uint_lt(strlen(path), sizeof sa.sun_path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    close(fd);
    ck_assert_int_eq(ctl_open(path, 0, &c, &e), PD_OK);
    ctl_close(c);
    /* nobody listening: the client says so */
    char *reply = NULL;
    e = (pd_err){0};
    ck_assert_int_eq(ctl_request(path, "status", 1, &reply, &e), PD_ERR_IO);
    ck_assert_ptr_nonnull(strstr(e.msg, "cannot connect"));
}
END_TEST

/* A raw connection to path, optionally sending some bytes (no newline). */
static int raw_client(const char *path, const char *bytes)
{
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path) + 1);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof sa), 0);
    if (bytes)
        ck_assert_int_eq(write(fd, bytes, strlen(bytes)), (ssize_t)strlen(bytes));
    return fd;
}

/* What the server sent fd before closing it (up to cap - 1 bytes). */
static void read_all(int fd, char *out, size_t cap)
{
    size_t n = 0;
    ssize_t r;
    while (n + 1 < cap && (r = read(fd, out + n, cap - 1 - n)) > 0)
        n += (size_t)r;
    out[n] = 0;
}

START_TEST(ctl_silent_clients_cannot_jam_the_socket)
{
    char path[300], line[CTL_LINE_MAX];
    mkpath(path, sizeof path, "jam.sock");
    ctl *c = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ctl_open(path, 30, &c, &e), PD_OK); /* long timeout: eviction alone frees the slots */
    int fds[CTL_MAX_CLIENTS];
    int id;
    for (int i = 0; i < CTL_MAX_CLIENTS; i++) {
        fds[i] = raw_client(path, i % 2 ? "stat" : NULL); /* nothing, or half a line */
        ck_assert(!ctl_next(c, &id, line, sizeof line));
    }
    /* every slot is held; a real request still gets through */
    client_arg a = {.path = path, .line = "status"};
    pthread_t t;
    pthread_create(&t, NULL, client, &a);
    id = wait_request(c, line, sizeof line);
    ck_assert_str_eq(line, "status");
    ctl_reply(c, id, "{\"ok\":true}");
    pthread_join(t, NULL);
    ck_assert_int_eq(a.st, PD_OK);
    ck_assert_str_eq(a.reply, "{\"ok\":true}");
    free(a.reply);
    /* the oldest silent client was dropped, and told why */
    char got[256];
    read_all(fds[0], got, sizeof got);
    ck_assert_ptr_nonnull(strstr(got, "dropped: no complete request line"));
    for (int i = 0; i < CTL_MAX_CLIENTS; i++)
        close(fds[i]);
    ctl_close(c);
}
END_TEST

/* All in one backlog before the server looks (a busy head polls between
 * micro-batches): 16 silent clients, a real request, 3 more silent ones.
 * The newcomers evict the clients that connected first and said nothing;
 * the request, complete in its socket, is never the one evicted. */
START_TEST(ctl_a_whole_line_is_never_evicted_by_later_silent_clients)
{
    char path[300], line[CTL_LINE_MAX];
    mkpath(path, sizeof path, "backlog.sock");
    ctl *c = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ctl_open(path, 30, &c, &e), PD_OK);
    int fds[20];
    for (int i = 0; i < 16; i++)
        fds[i] = raw_client(path, NULL);
    fds[16] = raw_client(path, "status\n");
    for (int i = 17; i < 20; i++)
        fds[i] = raw_client(path, i == 18 ? "mig" : NULL);
    int id = wait_request(c, line, sizeof line);
    ck_assert_str_eq(line, "status");
    ctl_reply(c, id, "{\"ok\":true}");
    char got[256];
    read_all(fds[16], got, sizeof got);
    ck_assert_str_eq(got, "{\"ok\":true}\n");
    for (int i = 0; i < 4; i++) { /* the four that connected first made room */
        read_all(fds[i], got, sizeof got);
        ck_assert_ptr_nonnull(strstr(got, "dropped: no complete request line"));
    }
    for (int i = 0; i < 20; i++)
        close(fds[i]);
    ctl_close(c);
}
END_TEST

START_TEST(ctl_a_client_without_a_whole_line_is_dropped_after_the_timeout)
{
    char path[300], line[CTL_LINE_MAX];
    mkpath(path, sizeof path, "slow.sock");
    ctl *c = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ctl_open(path, 0.2, &c, &e), PD_OK);
    int fd = raw_client(path, "migr");
    int id;
    ck_assert(!ctl_next(c, &id, line, sizeof line));
    usleep(100 * 1000);
    ck_assert(!ctl_next(c, &id, line, sizeof line));
    usleep(200 * 1000);
    ck_assert(!ctl_next(c, &id, line, sizeof line)); /* past 0.2 s: dropped */
    char got[256];
    read_all(fd, got, sizeof got);
    ck_assert_str_eq(got, "{\"ok\":false,\"error\":\"no complete request line within 0.2 s\"}\n");
    close(fd);
    /* a client that waits for its reply is never dropped by the timeout */
    fd = raw_client(path, "status\n");
    id = wait_request(c, line, sizeof line);
    usleep(300 * 1000);
    ck_assert(!ctl_next(c, &id, line, sizeof line));
    ctl_reply(c, id, "{\"ok\":true}");
    read_all(fd, got, sizeof got);
    ck_assert_str_eq(got, "{\"ok\":true}\n");
    close(fd);
    ctl_close(c);
}
END_TEST

START_TEST(ctl_turns_away_a_newcomer_only_when_every_client_awaits_a_reply)
{
    char path[300], line[CTL_LINE_MAX];
    mkpath(path, sizeof path, "full.sock");
    ctl *c = NULL;
    pd_err e = {0};
    ck_assert_int_eq(ctl_open(path, 0, &c, &e), PD_OK);
    int fds[CTL_MAX_CLIENTS], ids[CTL_MAX_CLIENTS];
    for (int i = 0; i < CTL_MAX_CLIENTS; i++) {
        fds[i] = raw_client(path, "status\n");
        ids[i] = wait_request(c, line, sizeof line);
    }
    int fd = raw_client(path, "status\n");
    int id;
    ck_assert(!ctl_next(c, &id, line, sizeof line));
    char got[256];
    read_all(fd, got, sizeof got);
    ck_assert_ptr_nonnull(strstr(got, "too many control clients at once"));
    close(fd);
    for (int i = 0; i < CTL_MAX_CLIENTS; i++) {
        ctl_reply(c, ids[i], "{\"ok\":true}");
        read_all(fds[i], got, sizeof got);
        ck_assert_str_eq(got, "{\"ok\":true}\n");
        close(fds[i]);
    }
    ctl_close(c);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("ctl");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, pd_test_dir_setup, pd_test_dir_teardown);
    tcase_add_test(tc, ctl_one_line_in_one_line_out);
    tcase_add_test(tc, ctl_client_gone_before_its_reply_costs_nothing);
    tcase_add_test(tc, ctl_existing_paths);
    tcase_add_test(tc, ctl_silent_clients_cannot_jam_the_socket);
    tcase_add_test(tc, ctl_a_client_without_a_whole_line_is_dropped_after_the_timeout);
    tcase_add_test(tc, ctl_a_whole_line_is_never_evicted_by_later_silent_clients);
    tcase_add_test(tc, ctl_turns_away_a_newcomer_only_when_every_client_awaits_a_reply);
    suite_add_tcase(s, tc);
    return s;
}
