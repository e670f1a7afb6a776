/* pipe: the MPI transport of the pipeline — a communicator duplicated from
 * the caller's, every call checked, failures turned into statuses carrying
 * MPI_Error_string (ARCHITECTURE.md §9). Messages are byte buffers encoded by
 * msg.h; pipe knows nothing of their content. */
#ifndef PD_COMM_PIPE_H
#define PD_COMM_PIPE_H

#include "base/status.h"

#include <mpi.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct pipe_link pipe_link;

/* Duplicates parent (errors return instead of aborting on the duplicate).
 * Returns owned *out (pipe_close). */
pd_status pipe_open(MPI_Comm parent, pipe_link **out, pd_err *err);
void pipe_close(pipe_link *p);

/* Waiting: every wait of this module (send completion, receive, probe)
 * tests for about 0.5 ms, then sleeps between tests (20 us doubling to
 * 0.2 ms; 2 ms once the wait is 0.1 s old), so a rank waiting on a slow or
 * stopped peer does not burn a core, and a message arriving during a sleep
 * is taken at most 0.2 ms late (2 ms after a 0.1 s wait: 2 %). With a
 * stall timeout > 0, a wait that sees no progress for that many seconds
 * returns PD_ERR_STALLED naming the peer (0 = wait forever). */
void pipe_set_stall_timeout(pipe_link *p, double seconds);

/* Doorbells, for ranks that take turns on one node (the others idle until
 * a message comes). Collective over the link: when every rank of the link
 * shares one memory node (MPI_COMM_TYPE_SHARED), each gets a bell word in
 * memory they all map (MPI_Win_allocate_shared), *on is true, and from then
 * on every pipe_isend on the link rings its receiver's bell (a futex wake).
 * A wait on the link then sleeps on its rank's bell instead of napping
 * blind: a ring wakes it at once and it tests without sleeping for 20 ms
 * while the message's bytes move; without a ring it wakes every 2 ms (20 ms
 * once the wait is 0.1 s old) only to check the stall timeout. A send's
 * completion (pipe_wait) tests that long before it sleeps, as its receiver
 * was just rung. Ranks on several nodes, or not on Linux: *on is false and
 * nothing changes. pipe_close frees the bells (collective then). */
pd_status pipe_bells_open(pipe_link *p, bool *on, pd_err *err);
/* What the bells did on this rank: rings sent; sleeps a ring ended (or
 * found rung); sleeps that ran out and only then saw a ring (a lost
 * wake-up: the message waited for the nap); sleeps that ran out without. */
typedef struct pipe_bell_counts {
    uint64_t rung, woken, late, timed_out;
} pipe_bell_counts;
pipe_bell_counts pipe_bells_counted(const pipe_link *p);

int pipe_rank(const pipe_link *p);
int pipe_size(const pipe_link *p);
MPI_Comm pipe_comm(const pipe_link *p);

/* Starts sending buf[0..len) to dest; buf must stay untouched until
 * pipe_wait(req) returns. */
pd_status pipe_isend(pipe_link *p, int dest, const void *buf, size_t len, MPI_Request *req, pd_err *err);
/* Completes a send (no-op for MPI_REQUEST_NULL); adds the seconds spent
 * waiting to *waited when not NULL. */
pd_status pipe_wait(pipe_link *p, MPI_Request *req, double *waited, pd_err *err);

/* Lets MPI progress the n requests (sends still in flight) without waiting
 * for them; completed ones become MPI_REQUEST_NULL. Cheap enough to call
 * between the GEMMs of a forward pass. */
pd_status pipe_progress(pipe_link *p, int n, MPI_Request *reqs, pd_err *err);

/* Ends every process of the job (MPI_Abort on the link's communicator) with
 * status code. For the CLI only: after start-up a rank that fails cannot
 * agree with peers blocked in a receive, so the job must end as a whole. */
_Noreturn void pipe_abort(pipe_link *p, int code);

/* Receives the next message from src (MPI_ANY_SOURCE allowed) into
 * buf[0..cap). A message larger than cap is received into nothing and
 * reported (PD_ERR_RANGE), never truncated silently. *from gets the sender. */
pd_status pipe_recv(pipe_link *p, int src, void *buf, size_t cap, size_t *len, int *from,
                    double *waited, pd_err *err);

/* Pre-posts a receive of the next message from src into buf[0..cap), so the
 * transfer proceeds while this rank computes (a large message otherwise
 * waits for the receiver to arrive in MPI before its bytes move). Complete
 * with pipe_wait_recv or pipe_cancel_recv; buf stays untouched until then.
 * cap must cover the largest message any peer may send: Open MPI reports a
 * truncation, but with single-copy shared memory (CMA) or tcp it may already
 * have written the whole message past buf + cap. */
pd_status pipe_irecv(pipe_link *p, int src, void *buf, size_t cap, MPI_Request *req, pd_err *err);
/* Completes a pipe_irecv: *len gets the message size, *from the sender; adds
 * the seconds spent waiting to *waited when not NULL. A message larger than
 * the posted buffer is PD_ERR_RANGE (MPI truncation; see pipe_irecv), a
 * request with no receive posted (MPI_REQUEST_NULL) PD_ERR_ARG. */
pd_status pipe_wait_recv(pipe_link *p, MPI_Request *req, size_t *len, int *from, double *waited,
                         pd_err *err);
/* Completes a pipe_irecv if its message has arrived, without waiting:
 * *done 1 with *len and *from as pipe_wait_recv gives them, or 0. */
pd_status pipe_test_recv(pipe_link *p, MPI_Request *req, int *done, size_t *len, int *from, pd_err *err);
/* Withdraws a pipe_irecv that no message should match (no-op for
 * MPI_REQUEST_NULL). A message that had already matched it is dropped and
 * reported (PD_ERR_FORMAT, naming the sender): the protocol was broken. */
pd_status pipe_cancel_recv(pipe_link *p, MPI_Request *req, pd_err *err);
/* Lets go of a nonblocking send nobody will wait for (MPI_Request_free:
 * the send still completes; no-op for MPI_REQUEST_NULL). */
pd_status pipe_release_send(MPI_Request *req, pd_err *err);
/* Agreement: every rank passes its local status; returns the worst status
 * of all ranks (PD_OK only when every rank is PD_OK). Collective. */
pd_status pipe_agree(pipe_link *p, pd_status local, pd_err *err);

/* Rank and size among the ranks sharing this node (MPI_COMM_TYPE_SHARED). */
pd_status pipe_node_local(pipe_link *p, int *local_rank, int *local_size, pd_err *err);

/* Gathers `len` bytes from every rank into all[size x len] on rank 0 (all may
 * be NULL elsewhere). Collective. */
pd_status pipe_gather(pipe_link *p, const void *mine, size_t len, void *all, pd_err *err);

/* Gathers `len` bytes from every rank into all[size x len] on every rank.
 * Collective. */
pd_status pipe_allgather(pipe_link *p, const void *mine, size_t len, void *all, pd_err *err);

/* Rank 0's len bytes of buf, on every rank. Collective. */
pd_status pipe_bcast(pipe_link *p, void *buf, size_t len, pd_err *err);

/* The maximum of a double over all ranks, on every rank. Collective. */
pd_status pipe_max_double(pipe_link *p, double mine, double *out, pd_err *err);

#endif
