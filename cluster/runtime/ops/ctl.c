/* ctl: the control socket's server (non-blocking, polled by the head) and
 * its one-request client (contract in ctl.h). */
#include "cluster/runtime/ops/ctl.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <stdint.h>
#include <unistd.h>

#include "base/clock.h"

typedef struct ctl_client {
    int fd;                  /* -1: free slot */
    size_t n;                /* bytes of buf */
    bool asked;              /* a request was taken: waiting for its reply */
    double since;            /* when it connected (monotonic seconds) */
    uint64_t seq;            /* connection order (eviction takes the lowest) */
    char buf[CTL_LINE_MAX];
} ctl_client;

struct ctl {
    int fd;
    char *path;
    double line_timeout;     /* seconds a client has to complete its line */
    uint64_t accepted;       /* connections taken so far */
    ctl_client cl[CTL_MAX_CLIENTS];
};

static pd_status ctl_addr(const char *path, struct sockaddr_un *a, pd_err *err)
{
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    if (strlen(path) >= sizeof a->sun_path)
        return pd_err_set(err, PD_ERR_ARG, "--control %s: a socket path has at most %zu bytes", path,
                          sizeof a->sun_path - 1);
    memcpy(a->sun_path, path, strlen(path) + 1);
    return PD_OK;
}

pd_status ctl_open(const char *path, double line_timeout_s, ctl **out, pd_err *err)
{
    struct sockaddr_un a;
    pd_status st = ctl_addr(path, &a, err);
    if (st)
        return st;
    struct stat sb;
    if (lstat(path, &sb) == 0) {
        if (!S_ISSOCK(sb.st_mode))
            return pd_err_set(err, PD_ERR_ARG, "--control %s: the path exists and is not a socket: refusing to "
                              "replace it", path);
        int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (probe < 0)
            return pd_err_set(err, PD_ERR_IO, "--control %s: socket: %s", path, strerror(errno));
        int rc = connect(probe, (struct sockaddr *)&a, sizeof a);
        int e = errno;
        close(probe);
        if (rc == 0)
            return pd_err_set(err, PD_ERR_ARG, "--control %s: another job is listening on that socket", path);
        if (e != ECONNREFUSED)
            return pd_err_set(err, PD_ERR_IO, "--control %s: the socket exists and cannot be probed: %s", path,
                              strerror(e));
        if (unlink(path) != 0) /* stale: nothing accepts on it */
            return pd_err_set(err, PD_ERR_IO, "--control %s: removing the stale socket: %s", path, strerror(errno));
    }
    ctl *c = calloc(1, sizeof *c);
    if (!c || !(c->path = strdup(path))) {
        free(c);
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    }
    for (int i = 0; i < CTL_MAX_CLIENTS; i++)
        c->cl[i].fd = -1;
    c->line_timeout = line_timeout_s > 0 ? line_timeout_s : CTL_LINE_TIMEOUT_S;
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (c->fd < 0) {
        st = pd_err_set(err, PD_ERR_IO, "--control %s: socket: %s", path, strerror(errno));
        free(c->path);
        free(c);
        return st;
    }
    /* 0600 from the start: no window in which others could connect */
    mode_t old = umask(0177);
    int rc = bind(c->fd, (struct sockaddr *)&a, sizeof a);
    int e = errno;
    umask(old);
    if (rc != 0 || listen(c->fd, 4 * CTL_MAX_CLIENTS) != 0) {
        st = pd_err_set(err, PD_ERR_IO, "--control %s: %s: %s", path, rc ? "bind" : "listen", strerror(rc ? e : errno));
        if (rc == 0)
            unlink(path);
        close(c->fd);
        free(c->path);
        free(c);
        return st;
    }
    chmod(path, 0600);
    *out = c;
    return PD_OK;
}

static void client_drop(ctl_client *k)
{
    if (k->fd >= 0)
        close(k->fd);
    k->fd = -1;
    k->n = 0;
    k->asked = false;
}

void ctl_close(ctl *c)
{
    if (!c)
        return;
    for (int i = 0; i < CTL_MAX_CLIENTS; i++) {
        if (c->cl[i].fd >= 0 && c->cl[i].asked)
            ctl_reply(c, i, "{\"ok\":false,\"error\":\"the job ended before the command ran\"}");
        client_drop(&c->cl[i]);
    }
    close(c->fd);
    unlink(c->path);
    free(c->path);
    free(c);
}

static void send_all(int fd, const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = send(fd, s, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            /* a reply is one short line: wait a little for room, never long */
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            if (poll(&p, 1, 100) <= 0)
                return;
            continue;
        }
        if (w <= 0)
            return; /* the client went away */
        s += w;
        n -= (size_t)w;
    }
}

void ctl_reply(ctl *c, int client, const char *json)
{
    if (client < 0 || client >= CTL_MAX_CLIENTS || c->cl[client].fd < 0)
        return;
    send_all(c->cl[client].fd, json, strlen(json));
    send_all(c->cl[client].fd, "\n", 1);
    client_drop(&c->cl[client]);
}

/* Reads what client i has sent so far, never blocking. 1: buf holds a
 * whole line; 0: not yet; -1: the slot was freed (the client closed before
 * a whole line, or its line is too long and it was answered so). */
static int client_fill(ctl *c, int i)
{
    ctl_client *k = &c->cl[i];
    for (;;) {
        if (memchr(k->buf, '\n', k->n))
            return 1;
        if (k->n == sizeof k->buf) {
            ctl_reply(c, i, "{\"ok\":false,\"error\":\"request line too long\"}");
            return -1;
        }
        ssize_t r = recv(k->fd, k->buf + k->n, sizeof k->buf - k->n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return 0;
        if (r <= 0) { /* closed before a whole line: forget it */
            client_drop(k);
            return -1;
        }
        k->n += (size_t)r;
    }
}

/* A free slot for a new client: when every slot is taken, the client that
 * connected first among those that have not completed a line (their bytes
 * read first, so a line already sent counts) gives its slot up, told so;
 * -1 when every client has a whole line in. */
static int free_slot(ctl *c)
{
    int oldest = -1;
    for (int i = 0; i < CTL_MAX_CLIENTS; i++)
        if (c->cl[i].fd < 0)
            return i;
    for (int i = 0; i < CTL_MAX_CLIENTS; i++) {
        if (c->cl[i].asked)
            continue;
        int f = client_fill(c, i);
        if (f < 0)
            return i;
        if (f == 0 && (oldest < 0 || c->cl[i].seq < c->cl[oldest].seq))
            oldest = i;
    }
    if (oldest >= 0)
        ctl_reply(c, oldest, "{\"ok\":false,\"error\":\"dropped: no complete request line while other clients "
                             "needed the slot\"}");
    return oldest;
}

bool ctl_next(ctl *c, int *client, char *line, size_t cap)
{
    double now = pd_now_s();
    /* clients that did not complete a line in time */
    for (int i = 0; i < CTL_MAX_CLIENTS; i++)
        if (c->cl[i].fd >= 0 && !c->cl[i].asked && now - c->cl[i].since > c->line_timeout &&
            client_fill(c, i) == 0) {
            char msg[128];
            snprintf(msg, sizeof msg, "{\"ok\":false,\"error\":\"no complete request line within %g s\"}",
                     c->line_timeout);
            ctl_reply(c, i, msg);
        }
    /* new connections */
    for (;;) {
        int fd = accept4(c->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0)
            break;
        int i = free_slot(c);
        if (i < 0) {
            static const char busy[] = "{\"ok\":false,\"error\":\"too many control clients at once\"}\n";
            send_all(fd, busy, sizeof busy - 1);
            close(fd);
            continue;
        }
        c->cl[i] = (ctl_client){.fd = fd, .since = now, .seq = c->accepted++};
    }
    /* a whole line from a client that has not asked yet */
    for (int i = 0; i < CTL_MAX_CLIENTS; i++) {
        ctl_client *k = &c->cl[i];
        if (k->fd < 0 || k->asked || client_fill(c, i) != 1)
            continue;
        char *nl = memchr(k->buf, '\n', k->n);
        size_t len = (size_t)(nl - k->buf);
        if (len >= cap)
            len = cap - 1;
        memcpy(line, k->buf, len);
        line[len] = '\0';
        k->asked = true;
        *client = i;
        return true;
    }
    return false;
}

pd_status ctl_request(const char *path, const char *line, double timeout_s, char **reply, pd_err *err)
{
    struct sockaddr_un a;
    pd_status st = ctl_addr(path, &a, err);
    if (st)
        return st;
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return pd_err_set(err, PD_ERR_IO, "%s: socket: %s", path, strerror(errno));
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        st = pd_err_set(err, PD_ERR_IO, "%s: cannot connect (is a job running with --control %s?): %s", path, path,
                        strerror(errno));
        close(fd);
        return st;
    }
    send_all(fd, line, strlen(line));
    send_all(fd, "\n", 1);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    double t0 = pd_now_s();
    while (buf) {
        double left = timeout_s - (pd_now_s() - t0);
        if (left <= 0) {
            st = pd_err_set(err, PD_ERR_STALLED, "%s: no reply within %.0f s", path, timeout_s);
            break;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)(left * 1000) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue;
        if (n + 1 >= cap) {
            char *nb = realloc(buf, cap * 2);
            if (!nb)
                break;
            buf = nb;
            cap *= 2;
        }
        ssize_t r = recv(fd, buf + n, cap - 1 - n, 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (n == 0)
                st = pd_err_set(err, PD_ERR_IO, "%s: the job closed the connection without a reply", path);
            break;
        }
        n += (size_t)r;
        if (memchr(buf, '\n', n))
            break;
    }
    close(fd);
    if (!buf)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    if (st) {
        free(buf);
        return st;
    }
    buf[n] = '\0';
    char *nl = strchr(buf, '\n');
    if (nl)
        *nl = '\0';
    *reply = buf;
    return PD_OK;
}
