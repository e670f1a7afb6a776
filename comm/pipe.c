/* pipe: checked MPI point-to-point transport for pipeline messages. */
#include "comm/pipe.h"

#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#ifdef __linux__
#include <errno.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#define PIPE_TAG 0x5044 /* "PD" */
#define PIPE_SPIN_S 0.0005   /* test without sleeping this long first */
#define PIPE_NAP_MIN_US 20
#define PIPE_NAP_MAX_US 200    /* while the wait is short */
#define PIPE_LONG_S 0.1         /* a wait this long is a stall or a slow stage: */
#define PIPE_NAP_LONG_US 2000   /* nap longer (costs at most 2 % of such a wait) */
/* With doorbells (pipe_bells_open) a message wakes its receiver, so naps
 * only bound how late the stall timeout is checked: */
#define PIPE_BELL_NAP_US 2000
#define PIPE_BELL_NAP_LONG_US 20000
#define PIPE_BELL_SPIN_S 0.02   /* after a ring: test without sleeping while the bytes move */
#define PIPE_BELL_STRIDE 16     /* 32-bit words between two ranks' bells: one cache line each */

struct pipe_link {
    MPI_Comm comm;
    int rank, size;
    double stall_s; /* 0 = wait forever */
    /* doorbells: NULL, or [size * PIPE_BELL_STRIDE] words in memory every
     * rank maps (bell_win); rank q's bell is bells[q * PIPE_BELL_STRIDE] */
    _Atomic uint32_t *bells;
    MPI_Win bell_win;
    pipe_bell_counts counts;
};

/* One wait's clock: spin, then nap with growing sleeps, until the stall
 * timeout; with doorbells the naps sleep on this rank's bell, and a ring
 * starts another spin. */
typedef struct pipe_backoff {
    double t0;
    double spin_t0, spin_s; /* the current spin: since spin_t0, for spin_s */
    long nap_us;
    uint32_t seen;          /* this rank's bell when the wait (or its last spin) began */
} pipe_backoff;

static _Atomic uint32_t *pipe_bell(const pipe_link *p, int rank)
{
    return &p->bells[(size_t)rank * PIPE_BELL_STRIDE];
}

/* spin_s: how long to test before the first nap (a send's wait spins as long
 * as a ring's: it just rang its receiver) */
static pipe_backoff pipe_backoff_start(const pipe_link *p, double spin_s)
{
    double t = MPI_Wtime();
    return (pipe_backoff){.t0 = t,
                          .spin_t0 = t,
                          .spin_s = spin_s,
                          .seen = p->bells ? atomic_load(pipe_bell(p, p->rank)) : 0};
}

/* Sleeps up to us microseconds on this rank's bell unless it moved past
 * seen: 1 when it rang (now or before), 0 after the time ran out; counted
 * (a ring seen only once the time ran out is "late": the wake-up was lost). */
static int pipe_bell_sleep(pipe_link *p, uint32_t seen, long us)
{
    int timed_out = 0;
#ifdef __linux__
    struct timespec ts = {.tv_sec = us / 1000000, .tv_nsec = (us % 1000000) * 1000L};
    /* the kernel sleeps only while the word still holds seen, so a ring
     * between the caller's test and this call is not lost */
    timed_out = syscall(SYS_futex, (uint32_t *)pipe_bell(p, p->rank), FUTEX_WAIT, seen, &ts, NULL, 0) != 0 &&
                errno == ETIMEDOUT;
#else
    (void)us;
#endif
    int rang = atomic_load(pipe_bell(p, p->rank)) != seen;
    if (rang && timed_out)
        p->counts.late += 1;
    else if (rang)
        p->counts.woken += 1;
    else
        p->counts.timed_out += 1;
    return rang;
}

static void pipe_ring(pipe_link *p, int dest)
{
    _Atomic uint32_t *w = pipe_bell(p, dest);
    atomic_fetch_add(w, 1);
#ifdef __linux__
    syscall(SYS_futex, (uint32_t *)w, FUTEX_WAKE, 1, NULL, NULL, 0);
#endif
    p->counts.rung += 1;
}

/* Called after a test that found nothing: 1 when the wait is over its stall
 * timeout, else 0 after sleeping if the spin phase is over. */
static int pipe_backoff_step(pipe_link *p, pipe_backoff *b)
{
    double now = MPI_Wtime(), el = now - b->t0;
    if (p->stall_s > 0 && el > p->stall_s)
        return 1;
    if (now - b->spin_t0 < b->spin_s)
        return 0;
    long cap = p->bells ? (el < PIPE_LONG_S ? PIPE_BELL_NAP_US : PIPE_BELL_NAP_LONG_US)
                        : (el < PIPE_LONG_S ? PIPE_NAP_MAX_US : PIPE_NAP_LONG_US);
    b->nap_us = b->nap_us ? b->nap_us * 2 : PIPE_NAP_MIN_US;
    if (b->nap_us > cap)
        b->nap_us = cap;
    if (!p->bells) {
        struct timespec ts = {.tv_sec = 0, .tv_nsec = b->nap_us * 1000L};
        nanosleep(&ts, NULL);
        return 0;
    }
    if (pipe_bell_sleep(p, b->seen, b->nap_us)) {
        b->seen = atomic_load(pipe_bell(p, p->rank));
        b->spin_t0 = MPI_Wtime();
        b->spin_s = PIPE_BELL_SPIN_S;
        b->nap_us = 0;
    }
    return 0;
}

static pd_status pipe_stalled(const pipe_link *p, pd_err *err, const char *what, int peer)
{
    if (peer >= 0)
        return pd_err_set(err, PD_ERR_STALLED,
                          "no progress for %.0f s waiting %s rank %d (--stall-timeout): rank %d, or a rank it "
                          "waits on, stopped making progress",
                          p->stall_s, what, peer, peer);
    return pd_err_set(err, PD_ERR_STALLED, "no progress for %.0f s waiting %s (--stall-timeout)", p->stall_s,
                      what);
}

void pipe_set_stall_timeout(pipe_link *p, double seconds)
{
    p->stall_s = seconds > 0 ? seconds : 0;
}

static pd_status pipe_mpi_fail(pd_err *err, int rc, const char *what)
{
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
        len = 0;
    msg[len] = '\0';
    return pd_err_set(err, PD_ERR_MPI, "%s failed: %s", what, msg);
}

#define PIPE_CALL(call, what)                                                                      \
    do {                                                                                           \
        int rc_ = (call);                                                                          \
        if (rc_ != MPI_SUCCESS)                                                                    \
            return pipe_mpi_fail(err, rc_, what);                                                  \
    } while (0)

pd_status pipe_open(MPI_Comm parent, pipe_link **out, pd_err *err)
{
    pipe_link *p = calloc(1, sizeof *p);
    if (!p)
        return pd_err_set(err, PD_ERR_NOMEM, "pipe: out of memory");
    int rc = MPI_Comm_dup(parent, &p->comm);
    if (rc != MPI_SUCCESS) {
        free(p);
        return pipe_mpi_fail(err, rc, "MPI_Comm_dup");
    }
    if ((rc = MPI_Comm_set_errhandler(p->comm, MPI_ERRORS_RETURN)) != MPI_SUCCESS ||
        (rc = MPI_Comm_rank(p->comm, &p->rank)) != MPI_SUCCESS ||
        (rc = MPI_Comm_size(p->comm, &p->size)) != MPI_SUCCESS) {
        MPI_Comm_free(&p->comm);
        free(p);
        return pipe_mpi_fail(err, rc, "MPI communicator set-up");
    }
    *out = p;
    return PD_OK;
}

void pipe_close(pipe_link *p)
{
    if (!p)
        return;
    if (p->bells)
        MPI_Win_free(&p->bell_win);
    MPI_Comm_free(&p->comm);
    free(p);
}

int pipe_rank(const pipe_link *p) { return p->rank; }
pipe_bell_counts pipe_bells_counted(const pipe_link *p) { return p->counts; }
int pipe_size(const pipe_link *p) { return p->size; }
MPI_Comm pipe_comm(const pipe_link *p) { return p->comm; }

pd_status pipe_isend(pipe_link *p, int dest, const void *buf, size_t len, MPI_Request *req, pd_err *err)
{
    if (len > (size_t)0x7fffffff)
        return pd_err_set(err, PD_ERR_RANGE, "pipe: message of %zu bytes exceeds the MPI count limit", len);
    PIPE_CALL(MPI_Isend(buf, (int)len, MPI_BYTE, dest, PIPE_TAG, p->comm, req), "MPI_Isend");
    if (p->bells)
        pipe_ring(p, dest);
    return PD_OK;
}

pd_status pipe_wait(pipe_link *p, MPI_Request *req, double *waited, pd_err *err)
{
    if (*req == MPI_REQUEST_NULL)
        return PD_OK;
    pipe_backoff b = pipe_backoff_start(p, p->bells ? PIPE_BELL_SPIN_S : PIPE_SPIN_S);
    int done = 0;
    for (;;) {
        PIPE_CALL(MPI_Test(req, &done, MPI_STATUS_IGNORE), "MPI_Test");
        if (done || pipe_backoff_step(p, &b))
            break;
    }
    if (waited)
        *waited += MPI_Wtime() - b.t0;
    return done ? PD_OK : pipe_stalled(p, err, "for a send to complete, the receiver is", -1);
}

pd_status pipe_progress(pipe_link *p, int n, MPI_Request *reqs, pd_err *err)
{
    (void)p;
    int done = 0;
    PIPE_CALL(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    return PD_OK;
}

_Noreturn void pipe_abort(pipe_link *p, int code)
{
    MPI_Abort(p ? p->comm : MPI_COMM_WORLD, code);
    abort(); /* MPI_Abort does not return; if it did, the process must still end */
}

pd_status pipe_recv(pipe_link *p, int src, void *buf, size_t cap, size_t *len, int *from,
                    double *waited, pd_err *err)
{
    MPI_Status stt;
    pipe_backoff b = pipe_backoff_start(p, PIPE_SPIN_S);
    int found = 0;
    for (;;) {
        PIPE_CALL(MPI_Iprobe(src, PIPE_TAG, p->comm, &found, &stt), "MPI_Iprobe");
        if (found || pipe_backoff_step(p, &b))
            break;
    }
    if (waited)
        *waited += MPI_Wtime() - b.t0;
    if (!found)
        return pipe_stalled(p, err, "for a message from", src);
    int count = 0;
    PIPE_CALL(MPI_Get_count(&stt, MPI_BYTE, &count), "MPI_Get_count");
    if (count < 0 || (size_t)count > cap) {
        /* drain it so the sender is not left hanging, then report */
        char *tmp = malloc(count > 0 ? (size_t)count : 1);
        int rc = tmp ? MPI_Recv(tmp, count, MPI_BYTE, stt.MPI_SOURCE, PIPE_TAG, p->comm, MPI_STATUS_IGNORE)
                     : MPI_SUCCESS;
        free(tmp);
        if (rc != MPI_SUCCESS)
            return pipe_mpi_fail(err, rc, "MPI_Recv (draining an oversized message)");
        return pd_err_set(err, PD_ERR_RANGE, "pipe: message of %d bytes from rank %d exceeds the %zu-byte buffer",
                          count, stt.MPI_SOURCE, cap);
    }
    PIPE_CALL(MPI_Recv(buf, count, MPI_BYTE, stt.MPI_SOURCE, PIPE_TAG, p->comm, MPI_STATUS_IGNORE),
              "MPI_Recv");
    *len = (size_t)count;
    if (from)
        *from = stt.MPI_SOURCE;
    return PD_OK;
}

pd_status pipe_irecv(pipe_link *p, int src, void *buf, size_t cap, MPI_Request *req, pd_err *err)
{
    if (cap > (size_t)0x7fffffff)
        return pd_err_set(err, PD_ERR_RANGE, "pipe: receive buffer of %zu bytes exceeds the MPI count limit", cap);
    PIPE_CALL(MPI_Irecv(buf, (int)cap, MPI_BYTE, src, PIPE_TAG, p->comm, req), "MPI_Irecv");
    return PD_OK;
}

/* What a completed (or failed) test of a posted receive says: MPI's code rc
 * and status stt. */
static pd_status recv_done(int rc, const MPI_Status *stt, size_t *len, int *from, pd_err *err)
{
    int cls = MPI_SUCCESS;
    if (rc != MPI_SUCCESS)
        MPI_Error_class(rc, &cls);
    if (rc != MPI_SUCCESS && cls == MPI_ERR_TRUNCATE)
        return pd_err_set(err, PD_ERR_RANGE, "pipe: a message from rank %d exceeds the receive buffer",
                          stt->MPI_SOURCE);
    PIPE_CALL(rc, "MPI_Test (receive)");
    int count = 0;
    PIPE_CALL(MPI_Get_count(stt, MPI_BYTE, &count), "MPI_Get_count");
    *len = count > 0 ? (size_t)count : 0;
    if (from)
        *from = stt->MPI_SOURCE;
    return PD_OK;
}

pd_status pipe_wait_recv(pipe_link *p, MPI_Request *req, size_t *len, int *from, double *waited,
                         pd_err *err)
{
    if (*req == MPI_REQUEST_NULL)
        return pd_err_set(err, PD_ERR_ARG, "pipe: no receive is posted on this request");
    MPI_Status stt;
    pipe_backoff b = pipe_backoff_start(p, PIPE_SPIN_S);
    int done = 0, rc;
    for (;;) {
        rc = MPI_Test(req, &done, &stt);
        if (rc != MPI_SUCCESS || done || pipe_backoff_step(p, &b))
            break;
    }
    if (waited)
        *waited += MPI_Wtime() - b.t0;
    if (rc == MPI_SUCCESS && !done)
        return pipe_stalled(p, err, "for the next message from the previous stage,", -1);
    return recv_done(rc, &stt, len, from, err);
}

pd_status pipe_test_recv(pipe_link *p, MPI_Request *req, int *done, size_t *len, int *from, pd_err *err)
{
    (void)p;
    *done = 0;
    if (*req == MPI_REQUEST_NULL)
        return pd_err_set(err, PD_ERR_ARG, "pipe: no receive is posted on this request");
    MPI_Status stt;
    int rc = MPI_Test(req, done, &stt);
    if (rc == MPI_SUCCESS && !*done)
        return PD_OK;
    *done = 1;
    return recv_done(rc, &stt, len, from, err);
}

pd_status pipe_cancel_recv(pipe_link *p, MPI_Request *req, pd_err *err)
{
    (void)p;
    if (*req == MPI_REQUEST_NULL)
        return PD_OK;
    PIPE_CALL(MPI_Cancel(req), "MPI_Cancel");
    MPI_Status stt;
    PIPE_CALL(MPI_Wait(req, &stt), "MPI_Wait (cancelled receive)");
    int cancelled = 0;
    PIPE_CALL(MPI_Test_cancelled(&stt, &cancelled), "MPI_Test_cancelled");
    if (!cancelled)
        return pd_err_set(err, PD_ERR_FORMAT, "pipe: a message from rank %d arrived for a receive being withdrawn",
                          stt.MPI_SOURCE);
    return PD_OK;
}

pd_status pipe_release_send(MPI_Request *req, pd_err *err)
{
    if (*req == MPI_REQUEST_NULL)
        return PD_OK;
    PIPE_CALL(MPI_Request_free(req), "MPI_Request_free");
    return PD_OK;
}

pd_status pipe_agree(pipe_link *p, pd_status local, pd_err *err)
{
    int mine = (int)local, worst = 0;
    PIPE_CALL(MPI_Allreduce(&mine, &worst, 1, MPI_INT, MPI_MAX, p->comm), "MPI_Allreduce");
    return (pd_status)worst;
}

pd_status pipe_node_local(pipe_link *p, int *local_rank, int *local_size, pd_err *err)
{
    MPI_Comm node;
    PIPE_CALL(MPI_Comm_split_type(p->comm, MPI_COMM_TYPE_SHARED, p->rank, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
    int rc = MPI_Comm_rank(node, local_rank);
    if (rc == MPI_SUCCESS)
        rc = MPI_Comm_size(node, local_size);
    MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS)
        return pipe_mpi_fail(err, rc, "node-local rank");
    return PD_OK;
}

pd_status pipe_gather(pipe_link *p, const void *mine, size_t len, void *all, pd_err *err)
{
    if (len > (size_t)0x7fffffff)
        return pd_err_set(err, PD_ERR_RANGE, "pipe: gather of %zu bytes per rank", len);
    PIPE_CALL(MPI_Gather(mine, (int)len, MPI_BYTE, all, (int)len, MPI_BYTE, 0, p->comm), "MPI_Gather");
    return PD_OK;
}

pd_status pipe_allgather(pipe_link *p, const void *mine, size_t len, void *all, pd_err *err)
{
    if (len > (size_t)0x7fffffff)
        return pd_err_set(err, PD_ERR_RANGE, "pipe: allgather of %zu bytes per rank", len);
    PIPE_CALL(MPI_Allgather(mine, (int)len, MPI_BYTE, all, (int)len, MPI_BYTE, p->comm), "MPI_Allgather");
    return PD_OK;
}

pd_status pipe_bcast(pipe_link *p, void *buf, size_t len, pd_err *err)
{
    if (len > (size_t)0x7fffffff)
        return pd_err_set(err, PD_ERR_RANGE, "pipe: broadcast of %zu bytes", len);
    PIPE_CALL(MPI_Bcast(buf, (int)len, MPI_BYTE, 0, p->comm), "MPI_Bcast");
    return PD_OK;
}

pd_status pipe_max_double(pipe_link *p, double mine, double *out, pd_err *err)
{
    PIPE_CALL(MPI_Allreduce(&mine, out, 1, MPI_DOUBLE, MPI_MAX, p->comm), "MPI_Allreduce");
    return PD_OK;
}

pd_status pipe_bells_open(pipe_link *p, bool *on, pd_err *err)
{
    *on = p->bells != NULL;
#ifdef __linux__
    if (p->bells)
        return PD_OK;
    MPI_Comm node;
    PIPE_CALL(MPI_Comm_split_type(p->comm, MPI_COMM_TYPE_SHARED, p->rank, MPI_INFO_NULL, &node),
              "MPI_Comm_split_type");
    int n = 0, rc = MPI_Comm_size(node, &n);
    void *base = NULL;
    /* n == size on every rank or on none: the ranks are on one node or not */
    if (rc == MPI_SUCCESS && n == p->size) {
        MPI_Aint bytes = p->rank == 0 ? (MPI_Aint)p->size * PIPE_BELL_STRIDE * (MPI_Aint)sizeof(uint32_t) : 0;
        rc = MPI_Win_allocate_shared(bytes, (int)sizeof(uint32_t), MPI_INFO_NULL, node, &base, &p->bell_win);
        MPI_Aint got = 0;
        int unit = 0;
        if (rc == MPI_SUCCESS && (rc = MPI_Win_shared_query(p->bell_win, 0, &got, &unit, &base)) == MPI_SUCCESS) {
            if (p->rank == 0)
                for (size_t i = 0; i < (size_t)p->size * PIPE_BELL_STRIDE; i++)
                    atomic_init(&((_Atomic uint32_t *)base)[i], 0);
            rc = MPI_Barrier(node); /* nobody rings before the words are 0 */
        }
        if (rc == MPI_SUCCESS)
            p->bells = base;
    }
    MPI_Comm_free(&node);
    if (rc != MPI_SUCCESS)
        return pipe_mpi_fail(err, rc, "doorbells in shared memory (MPI_Win_allocate_shared)");
    *on = p->bells != NULL;
#else
    (void)err;
#endif
    return PD_OK;
}
