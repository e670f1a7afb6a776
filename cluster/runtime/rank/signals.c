/* signals: handlers that set flags, and the flags' takers (signals.h). */
#include "cluster/runtime/rank/signals.h"

#include "comm/msg.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

static volatile sig_atomic_t sig_ckpt, sig_stop;

static void sig_on(int sig)
{
    if (sig == SIGUSR1)
        sig_ckpt = 1;
    else if (sig == SIGINT || (sig == SIGTERM && sig_stop))
        _exit(128 + sig);
    else
        sig_stop = 1;
}

void sig_install(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = sig_on;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
}

uint32_t sig_take(void)
{
    uint32_t f = 0;
    if (sig_ckpt) {
        sig_ckpt = 0;
        f |= MSG_FLAG_CKPT;
    }
    if (sig_stop)
        f |= MSG_FLAG_STOP;
    return f;
}

void sig_note(uint32_t flags)
{
    if (flags & MSG_FLAG_CKPT)
        sig_ckpt = 1;
    if (flags & MSG_FLAG_STOP)
        sig_stop = 1;
}
