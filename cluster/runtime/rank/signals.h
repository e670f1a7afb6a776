/* signals: what a job does when it is told to stop or checkpoint
 * (--checkpoint-dir): SIGUSR1 = checkpoint at the next step boundary and go
 * on; SIGUSR2 / SIGTERM = checkpoint, then exit 75 (resumable); a second
 * SIGTERM, or SIGINT, exits at once (the previous checkpoint stays).
 *
 * Whichever rank a signal reaches, the head acts on it for the whole job: a
 * rank that is not the head puts its request on the next message it sends
 * (batch flags down the pipeline, results flags from the tail to the head),
 * and the head takes it like its own signal (MSG_FLAG_*).
 *
 * A handler can only set a flag: the pending requests are the process's
 * only mutable globals. */
#ifndef PD_RUNTIME_SIGNALS_H
#define PD_RUNTIME_SIGNALS_H

#include <stdint.h>

/* Installs the handlers (once; with --checkpoint-dir only). */
void sig_install(void);
/* Takes this rank's pending requests (MSG_FLAG_* bits): the checkpoint
 * request is cleared by taking it, a stop request stays. */
uint32_t sig_take(void);
/* A request learned from a message, as if this rank had been signalled. */
void sig_note(uint32_t flags);

#endif
