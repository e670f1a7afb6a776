/* ctl: the job's control socket (`pipedec run --control PATH`, rank 0) —
 * a Unix-domain stream socket that `pipedec ctl PATH ...` connects to.
 *
 * Owns: the listening socket, the socket file (unlinked by ctl_close), and
 * up to CTL_MAX_CLIENTS connected clients with their partial request lines.
 *
 * Protocol: a client sends one request line (the ctl arguments joined by
 * single spaces, at most CTL_LINE_MAX - 1 bytes, ended by '\n') and gets one
 * reply line (a JSON object ended by '\n'); then the server closes the
 * connection. Requests are taken only through ctl_next, which never blocks
 * (every descriptor is non-blocking): the head polls it from its loop. A
 * client that disconnects before its reply costs nothing (the reply is
 * dropped; no SIGPIPE). A request line that is too long is answered with an
 * error at once.
 *
 * Nobody can jam it: a client that has not completed its line within the
 * line timeout (CTL_LINE_TIMEOUT_S by default) is answered with an error and
 * dropped, and when all CTL_MAX_CLIENTS slots are taken a new client gets
 * the slot of the one that connected first among those that have not
 * completed a line (their bytes are read first, so a line already sent is
 * never evicted; the evicted one is told why). Only when every slot holds a client waiting for
 * its reply is a newcomer turned away ("too many control clients at once").
 *
 * Opening: the socket is created with mode 0600. An existing PATH is
 * replaced only when it is a stale socket (nothing accepts on it);
 * anything else there — a live socket, a file, a directory — is refused
 * with the reason. */
#ifndef PD_RUNTIME_CTL_H
#define PD_RUNTIME_CTL_H

#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>

#define CTL_MAX_CLIENTS 16
#define CTL_LINE_MAX 1024
#define CTL_LINE_TIMEOUT_S 5.0

typedef struct ctl ctl;

/* Returns owned *out (ctl_close). line_timeout_s: seconds a client has to
 * complete its request line (<= 0: CTL_LINE_TIMEOUT_S). Errors name PATH
 * and the reason. */
pd_status ctl_open(const char *path, double line_timeout_s, ctl **out, pd_err *err);
/* Closes every client and the socket, removes PATH. NULL is a no-op. */
void ctl_close(ctl *c);

/* The next complete request, if any: *client identifies the connection for
 * ctl_reply, line gets the request without its newline. Never blocks. */
bool ctl_next(ctl *c, int *client, char *line, size_t cap);
/* Sends json (one line, no newline: it is added) to the client and closes
 * the connection. A client gone in the meantime is ignored. */
void ctl_reply(ctl *c, int client, const char *json);

/* Client side: connects to PATH, sends the request line, waits up to
 * timeout_s for the reply line (owned *reply, free with free()).
 * PD_ERR_IO naming PATH when nothing listens there. */
pd_status ctl_request(const char *path, const char *line, double timeout_s, char **reply, pd_err *err);

#endif
