/* jobctl: drain-point actions and the requests behind them (contract in
 * jobctl.h). */
#include "cluster/runtime/ops/jobctl.h"

#include "base/check.h"
#include "cluster/runtime/ops/ckpt.h"
#include "cluster/runtime/ops/migrate.h"
#include "cluster/runtime/plan/rebalance.h"
#include "cluster/runtime/rank/signals.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ACT_CKPT = 1, ACT_CKPT_EXIT = 2, ACT_MIGRATE = 3, ACT_STATS = 4, ACT_PRECOPY = 5 };

/* A pre-copy that has not caught up after this many micro-batches switches
 * anyway (the switch sends whatever is left). */
#define JOBCTL_PRECOPY_MAX_STEPS 4096

#define JOBCTL_REPLY 8192
#define JOBCTL_RING 16
/* Ranks 1..N-1 send the head their counters at most this often (seconds),
 * between micro-batches: a status is answered from them at once. */
#define JOBCTL_SNAP_EVERY 0.05

/* What every rank sends the head at a status gather: a window's counters. */
typedef struct jobctl_win {
    double busy, cpu, wait_in, wait_send, wall;
} jobctl_win;

/* A rank's cumulative counters (live status). */
typedef struct jobctl_snap {
    double busy, cpu, wait_in, wait_send, t;
    int32_t bye, pad;
} jobctl_snap;

static void status_live(jobctl *j, uint64_t step);
static void status_reply(jobctl *j, uint64_t step, const jobctl_win *w, double tokens_per_s);

struct jobctl {
    rank *r;                 /* borrowed */
    head *h;                 /* borrowed, rank 0 only */
    ctl *c;                  /* rank 0 with --control */
    migrate *mg;
    /* checkpoints */
    uint64_t ckpt_base;
    uint32_t ckpts;          /* asked for by this run (a failed one's number is not reused) */
    double ckpt_last;
    int exit_code;
    bool stop;
    int ckpt_client, stop_client; /* -1: none */
    bool ckpt_asked, stop_asked;
    /* --migrate-at, in step order */
    uint64_t at_step[RUN_MIGRATE_AT_MAX];
    const char *at_map[RUN_MIGRATE_AT_MAX];
    uint32_t n_at, next_at;
    /* the pending migration */
    bool pend_mig;
    layermap mig_target;
    int mig_client;
    const char *mig_source;
    uint32_t migrations, refused;
    /* head: the running pre-copy (migrate.h) */
    uint64_t pc_step0;       /* micro-batches formed when it started */
    uint64_t pc_results;     /* results taken since */
    bool pc_self_busy, pc_others_busy;
    /* status requests waiting for a gather */
    int status_client[CTL_MAX_CLIENTS];
    uint32_t n_status;
    /* windows: this rank's counters at the last gather */
    double win_t, win_busy, win_cpu, win_wait_in, win_wait_send;
    uint64_t win_step, win_tokens;
    uint32_t hold;           /* windows left before --rebalance acts again */
    layermap last_prop;      /* --rebalance: the move the last window proposed */
    bool have_prop;
    double *last_busy;       /* head: [size] that window's busy CPU seconds per stage */
    double t_ask;            /* head: when the current drain point was asked for */
    /* head: (time, tokens sampled, streams alive) at the last JOBCTL_RING
     * steps, for the decode step a migration's pause is set against */
    double ring_t[JOBCTL_RING];
    uint64_t ring_tok[JOBCTL_RING];
    uint32_t ring_alive[JOBCTL_RING];
    uint64_t ring_n;
    uint64_t step;           /* head: the step of the last want_drain */
    char *reply;             /* [JOBCTL_REPLY] */
    /* live status: a link of its own */
    pipe_link *stl;
    jobctl_snap snap_out;    /* ranks 1..N-1: the one in flight */
    MPI_Request snap_sreq;
    double snap_sent_t;
    jobctl_snap *snap_in, *snap_last, *snap_prev; /* head: [size] posted, newest, at the last reply */
    MPI_Request *snap_rreq;  /* head: [size] */
    uint64_t st_tokens;      /* head: tokens at the last status reply */
    double st_t;
};

pd_status jobctl_parse_migrate_at(const char *s, uint64_t *step, const char **map, pd_err *err)
{
    const char *colon = strchr(s, ':');
    char *end = NULL;
    unsigned long long v = colon && s[0] >= '0' && s[0] <= '9' ? strtoull(s, &end, 10) : 0;
    if (!colon || end != colon || !colon[1])
        return pd_err_set(err, PD_ERR_ARG, "--migrate-at '%s': expected STEP:MAP (e.g. 40:0-5,6-11)", s);
    *step = v;
    *map = colon + 1;
    return PD_OK;
}

pd_status jobctl_new(rank *r, head *h, ctl *c, uint64_t ckpt_base, jobctl **out, pd_err *err)
{
    jobctl *j = calloc(1, sizeof *j);
    pd_status st = j ? PD_OK : pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    if (j) {
        j->r = r;
        j->h = h;
        j->c = c;
        j->ckpt_base = ckpt_base;
        j->ckpt_last = MPI_Wtime();
        j->ckpt_client = j->stop_client = j->mig_client = -1;
        j->win_t = MPI_Wtime();
        j->reply = malloc(JOBCTL_REPLY);
        if (!j->reply)
            st = pd_err_set(err, PD_ERR_NOMEM, "out of memory");
        for (uint32_t i = 0; st == PD_OK && i < r->o->n_migrate_at; i++) {
            st = jobctl_parse_migrate_at(r->o->migrate_at[i], &j->at_step[i], &j->at_map[i], err);
            j->n_at++;
        }
        /* in step order (insertion sort of at most RUN_MIGRATE_AT_MAX) */
        for (uint32_t i = 1; i < j->n_at; i++)
            for (uint32_t k = i; k > 0 && j->at_step[k] < j->at_step[k - 1]; k--) {
                uint64_t ts = j->at_step[k];
                const char *tm = j->at_map[k];
                j->at_step[k] = j->at_step[k - 1];
                j->at_map[k] = j->at_map[k - 1];
                j->at_step[k - 1] = ts;
                j->at_map[k - 1] = tm;
            }
        /* a job that may migrate computes its model digest (the identity of
         * every record, model_digest reads the whole file) now, not during
         * its first migration's pause */
        if (r->o->control_path || r->o->rebalance || r->o->n_migrate_at)
            (void)stage_layer_identity(r->st, 0);
    } else
        ctl_close(c);
    /* collective: every rank gets here */
    migrate *mg = NULL;
    pd_status ms = migrate_new(r, (migrate_fault)r->o->migrate_fault, &mg, err);
    if (st == PD_OK)
        st = ms;
    else
        migrate_free(mg);
    if (j)
        j->mg = mg;
    /* collective: the live-status link and every rank's first counters */
    pd_status ls = pipe_open(pipe_comm(r->p), j ? &j->stl : &(pipe_link *){NULL}, err);
    if (st == PD_OK)
        st = ls;
    if (j) {
        j->snap_sreq = MPI_REQUEST_NULL;
        if (r->is_head) {
            j->snap_in = calloc((size_t)r->size, sizeof *j->snap_in);
            j->snap_last = calloc((size_t)r->size, sizeof *j->snap_last);
            j->snap_prev = calloc((size_t)r->size, sizeof *j->snap_prev);
            j->snap_rreq = calloc((size_t)r->size, sizeof *j->snap_rreq);
            j->last_busy = calloc((size_t)r->size, sizeof *j->last_busy);
            if (!j->snap_in || !j->snap_last || !j->snap_prev || !j->snap_rreq || !j->last_busy)
                st = st ? st : pd_err_set(err, PD_ERR_NOMEM, "out of memory");
            for (int q = 0; j->snap_rreq && q < r->size; q++)
                j->snap_rreq[q] = MPI_REQUEST_NULL;
        }
    }
    jobctl_snap first = {.t = MPI_Wtime()};
    pd_status gs = pipe_gather(r->p, &first, sizeof first, j && j->snap_last ? j->snap_last : NULL, err);
    if (st == PD_OK)
        st = gs;
    if (st == PD_OK && r->is_head) {
        memcpy(j->snap_prev, j->snap_last, sizeof *j->snap_prev * (size_t)r->size);
        j->st_t = MPI_Wtime();
        for (int q = 1; q < r->size && st == PD_OK; q++)
            st = pipe_irecv(j->stl, q, &j->snap_in[q], sizeof j->snap_in[q], &j->snap_rreq[q], err);
    }
    if (st) {
        jobctl_free(j);
        return st;
    }
    pipe_set_stall_timeout(j->stl, r->o->stall_timeout);
    *out = j;
    return PD_OK;
}

void jobctl_free(jobctl *j)
{
    if (!j)
        return;
    /* no waiting here (after a failed run peers may never answer) */
    for (int q = 0; j->snap_rreq && j->stl && q < j->r->size; q++)
        (void)pipe_cancel_recv(j->stl, &j->snap_rreq[q], &(pd_err){0});
    pd_err fe = {0};
    if (pipe_release_send(&j->snap_sreq, &fe) != PD_OK)
        fprintf(stderr, "pipedec: rank %d: letting go of a status send: %s\n", j->r->rank, fe.msg);
    free(j->last_busy);
    free(j->snap_in);
    free(j->snap_last);
    free(j->snap_prev);
    free(j->snap_rreq);
    pipe_close(j->stl);
    ctl_close(j->c);
    migrate_free(j->mg);
    free(j->reply);
    free(j);
}

pd_status jobctl_finish(jobctl *j, pd_err *err)
{
    rank *r = j->r;
    pd_status st = migrate_finish(j->mg, err);
    if (st)
        return st;
    if (!r->is_head) { /* the last counters, marked as the last */
        if ((st = pipe_wait(j->stl, &j->snap_sreq, NULL, err)))
            return st;
        j->snap_out = (jobctl_snap){.t = MPI_Wtime(), .bye = 1};
        if ((st = pipe_isend(j->stl, 0, &j->snap_out, sizeof j->snap_out, &j->snap_sreq, err)))
            return st;
        return pipe_wait(j->stl, &j->snap_sreq, NULL, err);
    }
    for (int q = 1; q < r->size && st == PD_OK; q++)
        for (;;) {
            size_t len;
            if ((st = pipe_wait_recv(j->stl, &j->snap_rreq[q], &len, NULL, NULL, err)))
                break;
            if (j->snap_in[q].bye)
                break; /* nothing follows it: no receive posted again */
            if ((st = pipe_irecv(j->stl, q, &j->snap_in[q], sizeof j->snap_in[q], &j->snap_rreq[q], err)))
                break;
        }
    return st;
}

int jobctl_exit_code(const jobctl *j)
{
    return j->exit_code;
}


/* ---- replies ----------------------------------------------------------------- */

/* s as the body of a JSON string (quotes, backslashes, control bytes escaped). */
static void json_str(char *out, size_t cap, const char *s)
{
    size_t n = 0;
    for (; *s && n + 7 < cap; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') {
            out[n++] = '\\';
            out[n++] = (char)ch;
        } else if (ch < 0x20)
            n += (size_t)snprintf(out + n, cap - n, "\\u%04x", ch);
        else
            out[n++] = (char)ch;
    }
    out[n] = '\0';
}

static void reply_error(jobctl *j, int client, const char *why)
{
    if (client < 0 || !j->c)
        return;
    char esc[2048];
    json_str(esc, sizeof esc, why);
    snprintf(j->reply, JOBCTL_REPLY, "{\"ok\":false,\"error\":\"%s\"}", esc);
    ctl_reply(j->c, client, j->reply);
}

/* ---- requests (head) ------------------------------------------------------------ */

/* Takes a migration target; refused (with the reason to the client) when
 * one is pending already. */
static bool ask_migration(jobctl *j, const layermap *to, int client, const char *source)
{
    if (j->pend_mig) {
        reply_error(j, client, "a migration is in progress already: try again when it has finished");
        return false;
    }
    j->pend_mig = true;
    j->mig_target = *to;
    j->mig_client = client;
    j->mig_source = source;
    return true;
}

static void handle_request(jobctl *j, int client, char *line)
{
    rank *r = j->r;
    char *argv[8];
    int argc = 0;
    for (char *t = strtok(line, " \t"); t && argc < 8; t = strtok(NULL, " \t"))
        argv[argc++] = t;
    pd_err e = {0};
    if (argc == 0) {
        reply_error(j, client, "empty request: expected status, migrate, checkpoint or stop");
        return;
    }
    if (strcmp(argv[0], "status") == 0 && argc == 1) {
        j->status_client[j->n_status++] = client;
        return;
    }
    if ((strcmp(argv[0], "checkpoint") == 0 || strcmp(argv[0], "stop") == 0) && argc == 1) {
        bool stop = argv[0][0] == 's';
        if (!r->o->checkpoint_dir) {
            reply_error(j, client, stop ? "stop needs a job started with --checkpoint-dir (it checkpoints, then exits)"
                                        : "checkpoint needs a job started with --checkpoint-dir");
            return;
        }
        int *slot = stop ? &j->stop_client : &j->ckpt_client;
        if (*slot >= 0) {
            reply_error(j, client, stop ? "a stop is pending already" : "a checkpoint is pending already");
            return;
        }
        *slot = client;
        if (stop)
            j->stop_asked = true;
        else
            j->ckpt_asked = true;
        return;
    }
    if (strcmp(argv[0], "migrate") == 0) {
        layermap to;
        pd_status st;
        if (argc == 3 && strcmp(argv[1], "--map") == 0)
            st = layermap_parse(argv[2], (uint32_t)r->size, r->hp.n_layers, &to, &e);
        else if (argc == 5 && strcmp(argv[1], "--layer") == 0 && strcmp(argv[3], "--to") == 0) {
            char *e1 = NULL, *e2 = NULL;
            unsigned long L = strtoul(argv[2], &e1, 10), R = strtoul(argv[4], &e2, 10);
            if (!*argv[2] || *e1 || !*argv[4] || *e2 || L > UINT32_MAX || R > UINT32_MAX)
                st = pd_err_set(&e, PD_ERR_ARG, "--layer and --to take non-negative integers");
            else
                st = migrate_map_for_layer(&r->lm, (uint32_t)L, (uint32_t)R, &to, &e);
        } else
            st = pd_err_set(&e, PD_ERR_ARG, "usage: migrate --map M | migrate --layer L --to R");
        if (st == PD_OK && migrate_layers_moved(&r->lm, &to) == 0)
            st = pd_err_set(&e, PD_ERR_ARG, "that map is in force already");
        if (st) {
            reply_error(j, client, e.msg);
            return;
        }
        ask_migration(j, &to, client, "ctl");
        return;
    }
    snprintf(e.msg, sizeof e.msg, "unknown command '%s': expected status, migrate --map M, migrate --layer L --to R, "
             "checkpoint or stop", argv[0]);
    reply_error(j, client, e.msg);
}

static uint32_t want_drain(void *ctx, uint64_t step)
{
    jobctl *j = ctx;
    rank *r = j->r;
    const run_opts *o = r->o;
    j->step = step;
    if (j->h) {
        sched_progress pr;
        head_progress(j->h, &pr);
        uint32_t k = (uint32_t)(j->ring_n++ % JOBCTL_RING);
        j->ring_t[k] = MPI_Wtime();
        j->ring_tok[k] = pr.tokens_generated;
        j->ring_alive[k] = pr.streams_alive;
    }
    if (j->c) {
        int client;
        char line[CTL_LINE_MAX];
        while (j->n_status < CTL_MAX_CLIENTS && ctl_next(j->c, &client, line, sizeof line))
            handle_request(j, client, line);
        if (j->n_status > 0)
            status_live(j, step); /* no drain point: the counters came between micro-batches */
    }
    uint32_t act = 0;
    uint32_t f = o->checkpoint_dir ? sig_take() : 0;
    if ((f & MSG_FLAG_STOP) || j->stop_asked)
        act = ACT_CKPT_EXIT;
    else if ((f & MSG_FLAG_CKPT) || j->ckpt_asked ||
             (o->checkpoint_every > 0 && MPI_Wtime() - j->ckpt_last >= o->checkpoint_every))
        act = ACT_CKPT;
    else if (j->pend_mig && migrate_precopying(j->mg)) {
        /* the switch once every rank caught up (a result that passed every
         * stage without MSG_FLAG_BUSY, and the head idle too) */
        if ((j->pc_results >= 2 && !j->pc_self_busy && !j->pc_others_busy) ||
            step - j->pc_step0 > JOBCTL_PRECOPY_MAX_STEPS)
            act = ACT_MIGRATE;
    } else if (j->pend_mig)
        act = migrate_uses_precopy(j->mg) ? ACT_PRECOPY : ACT_MIGRATE;
    else if (j->next_at < j->n_at && step >= j->at_step[j->next_at]) {
        layermap to;
        pd_err e = {0};
        const char *m = j->at_map[j->next_at++];
        /* checked at start-up (run.c): a parse cannot fail here */
        CHECK(layermap_parse(m, (uint32_t)r->size, r->hp.n_layers, &to, &e) == PD_OK);
        if (ask_migration(j, &to, -1, "--migrate-at"))
            act = migrate_uses_precopy(j->mg) ? ACT_PRECOPY : ACT_MIGRATE;
    } else if (o->rebalance && step - j->win_step >= o->rebalance_window)
        act = ACT_STATS;
    if (act)
        j->t_ask = MPI_Wtime();
    return act;
}

/* ---- actions --------------------------------------------------------------------- */

/* The decode step before a drain point: the mean time between two tokens of
 * one stream over the last steps (streams alive x seconds / tokens); 0 when
 * nothing was sampled. */
static double decode_step(const jobctl *j)
{
    if (j->ring_n < 2)
        return 0;
    uint64_t n = j->ring_n < JOBCTL_RING ? j->ring_n : JOBCTL_RING;
    uint32_t last = (uint32_t)((j->ring_n - 1) % JOBCTL_RING), first = (uint32_t)((j->ring_n - n) % JOBCTL_RING);
    uint64_t tok = j->ring_tok[last] - j->ring_tok[first];
    double alive = 0;
    for (uint64_t i = 0; i < n; i++)
        alive += j->ring_alive[i];
    alive /= (double)n;
    return tok ? alive * (j->ring_t[last] - j->ring_t[first]) / (double)tok : 0;
}

static pd_status act_ckpt(jobctl *j, const run_drain *d)
{
    rank *r = j->r;
    uint64_t seq = j->ckpt_base + ++j->ckpts;
    double t0 = MPI_Wtime();
    pd_err e = {0};
    pd_status st = ckpt_write(r, j->h ? head_sched(j->h) : NULL, r->o->checkpoint_dir, seq,
                              j->h ? head_out_size(j->h) : 0, &e);
    j->ckpt_last = MPI_Wtime();
    if (r->is_head) {
        if (st == PD_OK)
            fprintf(stderr, "pipedec: checkpoint %s/ckpt-%llu written at step %llu in %.2f s%s\n", r->o->checkpoint_dir,
                    (unsigned long long)seq, (unsigned long long)d->step, j->ckpt_last - t0,
                    d->action == ACT_CKPT_EXIT ? "; exiting (resumable, status 75)" : "");
        else
            fprintf(stderr, "pipedec: checkpoint %llu failed, the previous one stays the newest%s: %s\n",
                    (unsigned long long)seq, d->action == ACT_CKPT_EXIT ? "; exiting" : "; decoding goes on", e.msg);
        int *slot = d->action == ACT_CKPT_EXIT ? &j->stop_client : &j->ckpt_client;
        if (*slot >= 0 && j->c) {
            if (st == PD_OK) {
                snprintf(j->reply, JOBCTL_REPLY, "{\"ok\":true,\"checkpoint\":\"%s/ckpt-%llu\",\"step\":%llu%s}",
                         r->o->checkpoint_dir, (unsigned long long)seq, (unsigned long long)d->step,
                         d->action == ACT_CKPT_EXIT ? ",\"stopping\":true" : "");
                ctl_reply(j->c, *slot, j->reply);
            } else
                reply_error(j, *slot, e.msg);
        }
        *slot = -1;
        if (d->action == ACT_CKPT_EXIT)
            j->stop_asked = false;
        else
            j->ckpt_asked = false;
    }
    if (d->action == ACT_CKPT_EXIT) {
        j->stop = true;
        j->exit_code = st == PD_OK ? RUN_EXIT_RESUMABLE : RUN_EXIT_FAIL;
    }
    return PD_OK; /* a failed checkpoint does not stop the decode */
}

/* Starts a new window on this rank (after a gather or a migration). */
static void window_reset(jobctl *j, uint64_t step)
{
    msg_stats s = rank_stats(j->r);
    j->win_t = MPI_Wtime();
    j->win_busy = s.busy_s;
    j->win_cpu = j->r->busy_cpu_s;
    j->win_wait_in = s.wait_input_s;
    j->win_wait_send = s.wait_send_s;
    j->win_step = step;
    if (j->h) {
        sched_progress pr;
        head_progress(j->h, &pr);
        j->win_tokens = pr.tokens_generated;
    }
}

static pd_status act_migrate(jobctl *j, const run_drain *d, const layermap *target, int client, const char *source,
                             pd_err *err)
{
    rank *r = j->r;
    migrate_report rep;
    pd_status st = migrate_run(j->mg, j->h ? head_sched(j->h) : NULL, j->h ? head_budget_rw(j->h) : NULL, target,
                               &rep, err);
    if (st)
        return st;
    window_reset(j, d->step);
    if (!r->is_head)
        return PD_OK;
    double pause = MPI_Wtime() - j->t_ask;
    char a[512], b[512];
    layermap_format(&rep.from, a, sizeof a);
    layermap_format(target, b, sizeof b);
    if (rep.moved) {
        j->migrations++;
        char pre[320] = "", wts[160] = "";
        size_t wn = 0;
        if (rep.weights_mpi_bytes > 0)
            wn += (size_t)snprintf(wts + wn, sizeof wts - wn, "; weights over MPI %.0f bytes", rep.weights_mpi_bytes);
        snprintf(wts + wn, sizeof wts - wn, "; givers freed %llu bytes of weights",
                 (unsigned long long)rep.weights_released);
        if (rep.precopy_s > 0)
            snprintf(pre, sizeof pre, "; pre-copy %llu bytes over %.3f ms (%llu micro-batches, %llu restarts; "
                     "sending %.3f ms, applying %.3f ms of which allocating %.3f ms), at the switch %llu bytes",
                     (unsigned long long)rep.precopy_bytes, rep.precopy_s * 1e3,
                     (unsigned long long)(d->step - j->pc_step0), (unsigned long long)rep.resets,
                     rep.precopy_send_s * 1e3, rep.precopy_recv_s * 1e3, rep.precopy_alloc_s * 1e3,
                     (unsigned long long)rep.final_bytes);
        fprintf(stderr,
                "pipedec: migration (%s) at step %llu: %s -> %s: %u layers, %u streams, %llu bytes; copy %.3f ms "
                "(export %.3f, weights %.3f, transfer+validate %.3f), switch %.3f ms, action %.3f ms, pause %.3f ms; "
                "decode step %.3f ms%s%s\n",
                source, (unsigned long long)d->step, a, b, rep.layers_moved, rep.streams,
                (unsigned long long)rep.bytes, rep.copy_s * 1e3, rep.export_s * 1e3, rep.weights_s * 1e3,
                rep.transfer_s * 1e3, rep.switch_s * 1e3, rep.total_s * 1e3, pause * 1e3, decode_step(j) * 1e3, pre,
                wts);
        if (client >= 0 && j->c) {
            snprintf(j->reply, JOBCTL_REPLY,
                     "{\"ok\":true,\"moved\":true,\"step\":%llu,\"from\":\"%s\",\"to\":\"%s\",\"layers\":%u,"
                     "\"streams\":%u,\"bytes\":%llu,\"copy_ms\":%.3f,\"switch_ms\":%.3f,\"pause_ms\":%.3f,"
                     "\"decode_step_ms\":%.3f}",
                     (unsigned long long)d->step, a, b, rep.layers_moved, rep.streams, (unsigned long long)rep.bytes,
                     rep.copy_s * 1e3, rep.switch_s * 1e3, pause * 1e3, decode_step(j) * 1e3);
            ctl_reply(j->c, client, j->reply);
        }
    } else {
        j->refused++;
        fprintf(stderr, "pipedec: migration (%s) at step %llu refused, the map stays %s: %s\n", source,
                (unsigned long long)d->step, a, rep.why);
        char why[1600];
        snprintf(why, sizeof why, "migration to %s refused, the map stays %s: %s", b, a, rep.why);
        reply_error(j, client, why);
    }
    return PD_OK;
}

/* The first drain point of a pre-copied migration: the plan is agreed and
 * every rank starts copying while decoding goes on; the switch comes at a
 * later drain point (want_drain). */
static pd_status act_begin(jobctl *j, const run_drain *d, const layermap *target, int client, const char *source,
                           pd_err *err)
{
    rank *r = j->r;
    migrate_report rep;
    pd_status st = migrate_begin(j->mg, j->h ? head_sched(j->h) : NULL, j->h ? head_budget_rw(j->h) : NULL, target,
                                 &rep, err);
    if (st || !r->is_head)
        return st;
    char a[512], b[512];
    layermap_format(&rep.from, a, sizeof a);
    layermap_format(target, b, sizeof b);
    if (rep.started) {
        j->pend_mig = true;
        j->mig_target = *target;
        j->mig_client = client;
        j->mig_source = source;
        j->pc_step0 = d->step;
        j->pc_results = 0;
        j->pc_self_busy = j->pc_others_busy = true;
        fprintf(stderr, "pipedec: migration (%s) at step %llu: %s -> %s: %u layers, pre-copy started (action %.3f ms, "
                "pause %.3f ms)\n", source, (unsigned long long)d->step, a, b, migrate_layers_moved(&rep.from, target),
                rep.total_s * 1e3, (MPI_Wtime() - j->t_ask) * 1e3);
        return PD_OK;
    }
    j->refused++;
    j->pend_mig = false;
    j->mig_client = -1;
    fprintf(stderr, "pipedec: migration (%s) at step %llu refused, the map stays %s: %s\n", source,
            (unsigned long long)d->step, a, rep.why);
    char why[1600];
    snprintf(why, sizeof why, "migration to %s refused, the map stays %s: %s", b, a, rep.why);
    reply_error(j, client, why);
    return PD_OK;
}

/* This rank's cumulative counters now. */
static jobctl_snap snap_now(const rank *r)
{
    msg_stats s = rank_stats(r);
    return (jobctl_snap){.busy = s.busy_s, .cpu = r->busy_cpu_s, .wait_in = s.wait_input_s,
                         .wait_send = s.wait_send_s, .t = MPI_Wtime()};
}

/* Head: answers the status requests now, from every rank's newest counters
 * (no drain point); the window is the time since the previous reply. */
static void status_live(jobctl *j, uint64_t step)
{
    rank *r = j->r;
    j->snap_last[0] = snap_now(r);
    jobctl_win *w = calloc((size_t)r->size, sizeof *w);
    if (!w) {
        for (uint32_t i = 0; i < j->n_status; i++)
            reply_error(j, j->status_client[i], "out of memory");
        j->n_status = 0;
        return;
    }
    for (int q = 0; q < r->size; q++) {
        const jobctl_snap *a = &j->snap_prev[q], *b = &j->snap_last[q];
        w[q] = (jobctl_win){.busy = b->busy - a->busy, .cpu = b->cpu - a->cpu, .wait_in = b->wait_in - a->wait_in,
                            .wait_send = b->wait_send - a->wait_send, .wall = b->t - a->t};
    }
    sched_progress pr;
    head_progress(j->h, &pr);
    double now = MPI_Wtime();
    status_reply(j, step, w, now > j->st_t ? (double)(pr.tokens_generated - j->st_tokens) / (now - j->st_t) : 0);
    memcpy(j->snap_prev, j->snap_last, sizeof *j->snap_prev * (size_t)r->size);
    j->st_tokens = pr.tokens_generated;
    j->st_t = now;
    free(w);
}

/* Live status counters: ranks 1..N-1 send, the head takes. */
static pd_status snap_progress(jobctl *j, pd_err *err)
{
    rank *r = j->r;
    pd_status st = PD_OK;
    if (!r->is_head) {
        double now = MPI_Wtime();
        if (now - j->snap_sent_t < JOBCTL_SNAP_EVERY)
            return PD_OK;
        if (j->snap_sreq != MPI_REQUEST_NULL && (st = pipe_progress(j->stl, 1, &j->snap_sreq, err)))
            return st;
        if (j->snap_sreq != MPI_REQUEST_NULL)
            return PD_OK; /* the last one is still on its way */
        j->snap_out = snap_now(r);
        j->snap_sent_t = now;
        return pipe_isend(j->stl, 0, &j->snap_out, sizeof j->snap_out, &j->snap_sreq, err);
    }
    for (int q = 1; q < r->size && st == PD_OK; q++)
        for (;;) {
            int done = 0;
            size_t len;
            if ((st = pipe_test_recv(j->stl, &j->snap_rreq[q], &done, &len, NULL, err)) || !done)
                break;
            if (len == sizeof j->snap_in[q])
                j->snap_last[q] = j->snap_in[q];
            if ((st = pipe_irecv(j->stl, q, &j->snap_in[q], sizeof j->snap_in[q], &j->snap_rreq[q], err)))
                break;
        }
    return st;
}

static pd_status progress(void *ctx, uint32_t seen, uint32_t *add, pd_err *err)
{
    jobctl *j = ctx;
    *add = 0;
    pd_status ss = snap_progress(j, err);
    if (ss || !migrate_precopying(j->mg))
        return ss;
    bool busy = false;
    pd_status st = migrate_progress(j->mg, &busy, err);
    if (busy)
        *add = MSG_FLAG_BUSY;
    if (j->h) {
        j->pc_self_busy = busy;
        if (seen & RUN_SEEN_RESULTS) {
            j->pc_results++;
            j->pc_others_busy = (seen & MSG_FLAG_BUSY) != 0;
        }
    }
    return st;
}


static void status_reply(jobctl *j, uint64_t step, const jobctl_win *w, double tokens_per_s)
{
    rank *r = j->r;
    sched_progress pr;
    head_progress(j->h, &pr);
    char map[512];
    layermap_format(&r->lm, map, sizeof map);
    double wall = w[0].wall > 0 ? w[0].wall : 1e-9;
    size_t n = (size_t)snprintf(j->reply, JOBCTL_REPLY, "{\"ok\":true,\"step\":%llu,\"map\":\"%s\",\"ranks\":%d,"
                                "\"window_s\":%.6f,\"stages\":[",
                                (unsigned long long)step, map, r->size, w[0].wall);
    for (int s = 0; s < r->size && n < JOBCTL_REPLY; s++)
        n += (size_t)snprintf(j->reply + n, JOBCTL_REPLY - n,
                              "%s{\"rank\":%d,\"first\":%u,\"layers\":%u,\"busy_s\":%.6f,\"busy_cpu_s\":%.6f,"
                              "\"wait_s\":%.6f,\"busy_frac\":%.4f}",
                              s ? "," : "", s, r->lm.first[s], r->lm.count[s], w[s].busy, w[s].cpu,
                              w[s].wait_in + w[s].wait_send, w[s].busy / wall);
    char dir[1100] = "";
    if (r->o->checkpoint_dir)
        json_str(dir, sizeof dir, r->o->checkpoint_dir);
    if (n < JOBCTL_REPLY)
        snprintf(j->reply + n, JOBCTL_REPLY - n,
                 "],\"streams\":%u,\"pages_done\":%llu,\"pages_total\":%llu,\"tokens\":%llu,\"tokens_per_s\":%.3f,"
                 "\"checkpoint\":{\"dir\":%s%s%s,\"written\":%u},\"migrations\":%u,\"migrations_refused\":%u,"
                 "\"migrating\":%s,\"rebalance\":\"%s\",\"turns\":%s,\"drain_points\":%u}",
                 pr.streams_alive, (unsigned long long)pr.pages_done,
                 (unsigned long long)(pr.pages_total - pr.pages_skipped), (unsigned long long)pr.tokens_generated,
                 tokens_per_s, r->o->checkpoint_dir ? "\"" : "",
                 r->o->checkpoint_dir ? dir : "null", r->o->checkpoint_dir ? "\"" : "", j->ckpts, j->migrations,
                 j->refused, j->pend_mig ? "true" : "false", r->o->rebalance ? "auto" : "off", r->turns ? "true" : "false",
                 head_drains(j->h));
    for (uint32_t i = 0; i < j->n_status; i++)
        ctl_reply(j->c, j->status_client[i], j->reply);
    j->n_status = 0;
}

/* Head: tokens per second over the window that just ended. */
static double window_tps(const jobctl *j, double wall)
{
    sched_progress pr;
    head_progress(j->h, &pr);
    return wall > 0 ? (double)(pr.tokens_generated - j->win_tokens) / wall : 0;
}

static bool map_eq(const layermap *a, const layermap *b)
{
    if (a->n_stages != b->n_stages)
        return false;
    for (uint32_t s = 0; s < a->n_stages; s++)
        if (a->first[s] != b->first[s] || a->count[s] != b->count[s])
            return false;
    return true;
}

/* Status gather; --rebalance auto decides on it and may migrate at once. */
static pd_status act_stats(jobctl *j, const run_drain *d, pd_err *err)
{
    rank *r = j->r;
    msg_stats s = rank_stats(r);
    jobctl_win mine = {.busy = s.busy_s - j->win_busy,
                       .cpu = r->busy_cpu_s - j->win_cpu,
                       .wait_in = s.wait_input_s - j->win_wait_in,
                       .wait_send = s.wait_send_s - j->win_wait_send,
                       .wall = MPI_Wtime() - j->win_t};
    jobctl_win *all = r->is_head ? calloc((size_t)r->size, sizeof *all) : NULL;
    if (r->is_head && !all)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    pd_status st = pipe_gather(r->p, &mine, sizeof mine, all, err);
    struct {
        int32_t move;
        layermap to;
    } dec = {0};
    if (st == PD_OK && r->is_head) {
        bool due = r->o->rebalance && d->step - j->win_step >= r->o->rebalance_window;
        if (due && r->turns)
            fprintf(stderr,
                    "pipedec: rebalance at step %llu: the stages take turns, so a step costs the sum of their "
                    "times whatever the layer map: staying\n",
                    (unsigned long long)d->step);
        else if (due && j->hold > 0) {
            j->hold--;
            fprintf(stderr, "pipedec: rebalance at step %llu: holding (a move was just made)\n",
                    (unsigned long long)d->step);
        } else if (due) {
            double *busy = calloc((size_t)r->size, sizeof *busy);
            rebalance_decision dcs;
            pd_err e = {0};
            pd_status rs = busy ? PD_OK : pd_err_set(&e, PD_ERR_NOMEM, "out of memory");
            for (int q = 0; busy && q < r->size; q++)
                busy[q] = all[q].cpu;
            if (rs == PD_OK)
                rs = rebalance_decide(&r->lm, busy, r->o->rebalance_threshold, &dcs, &e);
            char cur[512], prop[512], nums[1024];
            size_t k = 0;
            layermap_format(&r->lm, cur, sizeof cur);
            for (int q = 0; busy && q < r->size && k < sizeof nums; q++)
                k += (size_t)snprintf(nums + k, sizeof nums - k, "%s%.4f", q ? "," : "", busy[q]);
            /* hysteresis: a move must be proposed by two windows in a row
             * and by the two windows taken together (one noisy window
             * moves nothing, nor do two that each just pass the threshold
             * on noise) */
            bool confirmed = false;
            if (rs == PD_OK && dcs.move && !j->pend_mig && j->have_prop && map_eq(&j->last_prop, &dcs.propose)) {
                double *both = calloc((size_t)r->size, sizeof *both);
                rebalance_decision d2;
                pd_err e2 = {0};
                for (int q = 0; both && q < r->size; q++)
                    both[q] = busy[q] + j->last_busy[q];
                confirmed = both && rebalance_decide(&r->lm, both, r->o->rebalance_threshold, &d2, &e2) == PD_OK &&
                            d2.move && map_eq(&d2.propose, &dcs.propose);
                free(both);
            }
            for (int q = 0; busy && q < r->size; q++)
                j->last_busy[q] = busy[q];
            if (rs == PD_OK) {
                layermap_format(&dcs.propose, prop, sizeof prop);
                fprintf(stderr,
                        "pipedec: rebalance at step %llu: busy CPU s per stage %s over %llu steps (map %s, %.1f "
                        "tokens/s); best map %s predicts bottleneck %.4f s vs %.4f s measured: gain %.1f%% %s %.1f%%: "
                        "%s\n",
                        (unsigned long long)d->step, nums, (unsigned long long)(d->step - j->win_step), cur,
                        window_tps(j, all[0].wall), prop,
                        dcs.predicted, dcs.bottleneck, 100 * dcs.gain, dcs.move ? ">" : "<=",
                        100 * r->o->rebalance_threshold,
                        !dcs.move ? "staying"
                        : confirmed ? "confirmed by a second window and by both together: migrating"
                        : (j->have_prop && map_eq(&j->last_prop, &dcs.propose))
                            ? "the two windows together do not pass the threshold: waiting"
                            : "waiting for a second window to confirm");
                if (confirmed) {
                    dec.move = 1;
                    dec.to = dcs.propose;
                    j->have_prop = false;
                } else {
                    j->have_prop = dcs.move;
                    j->last_prop = dcs.propose;
                }
            } else
                fprintf(stderr, "pipedec: rebalance at step %llu: no decision: %s\n", (unsigned long long)d->step,
                        e.msg);
            free(busy);
        }
    }
    free(all);
    if (st == PD_OK)
        st = pipe_bcast(r->p, &dec, sizeof dec, err);
    if (st)
        return st;
    window_reset(j, d->step);
    if (dec.move) {
        if (r->is_head)
            j->hold = r->o->rebalance_hold;
        if (migrate_uses_precopy(j->mg))
            return act_begin(j, d, &dec.to, -1, "rebalance", err);
        return act_migrate(j, d, &dec.to, -1, "rebalance", err);
    }
    return PD_OK;
}

static pd_status at_drain(void *ctx, const run_drain *d, pd_err *err)
{
    jobctl *j = ctx;
    switch (d->action) {
    case ACT_CKPT:
    case ACT_CKPT_EXIT:
        if (!j->r->o->checkpoint_dir)
            return pd_err_set(err, PD_ERR_FORMAT, "drain point %u asks for a checkpoint, but this rank has no "
                              "--checkpoint-dir", d->number);
        return act_ckpt(j, d);
    case ACT_MIGRATE: {
        pd_status st = act_migrate(j, d, &j->mig_target, j->mig_client, j->mig_source ? j->mig_source : "?", err);
        j->pend_mig = false;
        j->mig_client = -1;
        return st;
    }
    case ACT_STATS:
        return act_stats(j, d, err);
    case ACT_PRECOPY:
        return act_begin(j, d, &j->mig_target, j->mig_client, j->mig_source ? j->mig_source : "?", err);
    default:
        return pd_err_set(err, PD_ERR_FORMAT, "drain point %u asks for unknown action %u", d->number, d->action);
    }
}

static bool stop_after_drain(void *ctx)
{
    return ((jobctl *)ctx)->stop;
}

void jobctl_hooks(jobctl *j, run_hooks *out)
{
    *out = (run_hooks){.want_drain = want_drain,
                       .at_drain = at_drain,
                       .stop_after_drain = stop_after_drain,
                       .progress = progress,
                       .ctx = j};
}
