/* run: one rank's `pipedec run` from start-up to report (contract in run.h). */
#include "cluster/runtime/job/run.h"

#include "base/file.h"
#include "cluster/runtime/loop/follow.h"
#include "cluster/runtime/loop/head.h"
#include "cluster/runtime/loop/pageimg.h"
#include "cluster/runtime/rank/rank.h"
#include "cluster/runtime/job/report.h"

#include "cluster/runtime/ops/ckpt.h"
#include "cluster/runtime/ops/ckpt_dir.h"
#include "cluster/runtime/ops/ctl.h"
#include "cluster/runtime/ops/jobctl.h"
#include "cluster/runtime/rank/signals.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>


/* Everything that can fail on one rank before anything is decoded. img,
 * img_st, img_err: the head's encoder (run_open_encoder) and why it could
 * not be opened, said here, where the head's start-up needs it. */
static pd_status run_start(rank *r, pageimg *img, pd_status img_st, const pd_err *img_err, head **h, ctl **c,
                           pd_err *err)
{
    pd_status st = rank_start(r, err);
    /* --migrate-at maps are checked now, not when their step comes */
    for (uint32_t i = 0; st == PD_OK && i < r->o->n_migrate_at; i++) {
        uint64_t step;
        const char *map;
        layermap lm;
        st = jobctl_parse_migrate_at(r->o->migrate_at[i], &step, &map, err);
        if (st == PD_OK && (st = layermap_parse(map, (uint32_t)r->size, r->hp.n_layers, &lm, err)))
            pd_err_prefix(err, "--migrate-at %s", r->o->migrate_at[i]);
    }
    /* every rank writes its layers' bundles into --checkpoint-dir: each
     * checks that it can, before anything is decoded */
    if (st == PD_OK && r->o->checkpoint_dir)
        st = ckpt_dir_check(r->o->checkpoint_dir, err);
    /* --pid-file is written once every rank started (run_write_pids); that
     * it can be is checked now, before the head creates the output */
    if (st == PD_OK && r->is_head && r->o->pid_path) {
        pd_publish *pub = NULL;
        if ((st = pd_file_publish_begin(r->o->pid_path, 0644, "--pid-file", &pub, err)) == PD_OK)
            pd_file_publish_abort(pub);
    }
    if (st == PD_OK && r->is_head && img_st != PD_OK) {
        *err = *img_err;
        st = img_st;
    }
    if (st == PD_OK && r->is_head)
        st = head_open(r, img, ckpt_resume_find, h, err);
    if (st == PD_OK && r->is_head && r->o->control_path)
        st = ctl_open(r->o->control_path, CTL_LINE_TIMEOUT_S, c, err);
    if (st == PD_OK && r->o->trace_path)
        st = rank_open_trace(r, *h ? head_pages(*h) : NULL, err);
    return st;
}

/* --pid-file (collective): rank 0 gathers every rank's pid and host and
 * publishes "RANK PID HOST" lines atomically, so scripts signal a rank by
 * its number instead of searching the process table. */
static pd_status run_write_pids(rank *r, const char *path, pd_err *err)
{
    struct { int32_t rank, pid; char host[64]; } mine = {.rank = r->rank, .pid = (int32_t)getpid()}, *all = NULL;
    gethostname(mine.host, sizeof mine.host - 1);
    if (r->rank == 0 && !(all = calloc((size_t)r->size, sizeof *all)))
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    pd_status st = pipe_gather(r->p, &mine, sizeof mine, all, err);
    pd_publish *pub = NULL;
    pd_err e = {0};
    pd_status ws = PD_OK;
    if (st == PD_OK && r->rank == 0 && (ws = pd_file_publish_begin(path, 0644, "--pid-file", &pub, &e)) == PD_OK) {
        for (int k = 0; ws == PD_OK && k < r->size; k++) {
            char line[128];
            int n = snprintf(line, sizeof line, "%d %d %.64s\n", (int)all[k].rank, (int)all[k].pid, all[k].host);
            ws = pd_file_publish_write(pub, line, (size_t)n, &e);
        }
        if (ws == PD_OK)
            ws = pd_file_publish_commit(pub, &e);
        else
            pd_file_publish_abort(pub);
    }
    free(all);
    if (st)
        return st;
    pd_status ag = pipe_agree(r->p, ws, err);
    if (ws)
        *err = e;
    return ag;
}

/* One rank's run: what run_main's phases share, torn down once
 * (run_teardown). INV: r.p == p; r does not move (the head, the jobctl and
 * the report keep pointers to it). */
typedef struct run_job {
    const run_opts *o;
    pipe_link *p;            /* owned */
    rank r;
    head *h;                 /* rank 0 only */
    pageimg *img;            /* rank 0 with --mmproj: the encoder (h borrows it) */
    pd_status img_st;        /* ... or why it could not be opened (img_e) */
    pd_err img_e;
    ctl *c;                  /* the control socket until the jobctl takes it */
    jobctl *jc;
    report *rep;
    const run_hooks *hooks;  /* the caller's, or jc_hooks */
    run_hooks jc_hooks;
    pd_err e;
} run_job;

/* --mmproj, on the head: the run's encoder, opened once, bound already
 * (rank_place), before the work-mix agreement that counts image rows with
 * it; head_open then uses it. A failure is said by run_start where the head
 * needs it, so a bad model is still named as without --mmproj. */
static void run_open_encoder(run_job *j)
{
    const run_opts *o = j->o;
    if (!j->r.is_head || !o->mmproj_path)
        return;
    pageimg_encoders enc = {.world = o->enc_world, .first = o->enc_first, .n = (int)o->encoder_ranks};
    j->img_st = pageimg_open(o->mmproj_path, o->model_path, o->encoder_threads ? o->encoder_threads : o->threads,
                             &enc, &j->img, &j->img_e);
    if (j->img_st)
        pd_err_prefix(&j->img_e, "--mmproj");
}

/* Every rank started and runs the same thing, or none goes on: the ISA and
 * work-mix agreements (the only collectives before the start-up agreement:
 * every rank reaches them whatever fails in between), start-up, the run
 * agreement and --pid-file. Says why on stderr when not. */
static bool run_begin(run_job *j)
{
    rank *r = &j->r;
    pd_status st = rank_agree_isa(r, &j->e);
    if (st == PD_OK)
        st = rank_place(r, &j->e);
    if (st == PD_OK)
        run_open_encoder(j);
    pd_err we = {0};
    /* reached even after a failure: it is collective */
    pd_status wst = rank_agree_work(r, j->img ? pageimg_count : NULL, j->img, &we);
    if (st == PD_OK && wst != PD_OK) {
        st = wst;
        j->e = we;
    }
    if (st == PD_OK)
        st = run_start(r, j->img, j->img_st, &j->img_e, &j->h, &j->c, &j->e);
    if (st)
        fprintf(stderr, "pipedec: rank %d: %s\n", r->rank, j->e.msg);
    pd_err ae = {0};
    if (pipe_agree(j->p, st, &ae) != PD_OK) {
        if (r->rank == 0 && st == PD_OK)
            fprintf(stderr, "pipedec: start-up failed on another rank (see its message); nothing was decoded\n");
        return false;
    }
    /* every rank started: do they run the same thing? (collective, the
     * same verdict everywhere, so a mismatch still ends the run cleanly);
     * then --pid-file: where every rank runs, once all of them started */
    if (rank_agree_run(r, &j->e) != PD_OK || (j->o->pid_path && run_write_pids(r, j->o->pid_path, &j->e) != PD_OK)) {
        if (r->rank == 0)
            fprintf(stderr, "pipedec: %s; nothing was decoded\n", j->e.msg);
        return false;
    }
    return true;
}

/* What the decode needs once every rank started: the budget, a resumed
 * checkpoint, the drain-point actions, the report, the transport's caps.
 * A failure from here on cannot be agreed on. */
static pd_status run_prepare(run_job *j)
{
    rank *r = &j->r;
    const run_opts *o = j->o;
    uint64_t *lim = NULL;
    uint32_t *first = NULL, *layers = NULL;
    pd_status st = rank_gather_budgets(r, &lim, &first, &layers, &j->e);
    if (st == PD_OK && j->h) {
        budget *b = NULL;
        st = budget_new(&r->hp, &o->policy, r->size, lim, first, layers, &b, &j->e);
        if (st == PD_OK)
            head_use_budget(j->h, b);
    }
    free(lim);
    free(first);
    free(layers);
    /* --checkpoint-dir: resume what the head found, on every rank */
    uint64_t seqs[2] = {0, 0};
    if (st == PD_OK && o->checkpoint_dir) {
        if (j->h)
            seqs[0] = head_resume_seq(j->h, &seqs[1]);
        st = pipe_bcast(j->p, seqs, sizeof seqs, &j->e);
        if (st == PD_OK && seqs[0]) {
            double t0 = MPI_Wtime();
            st = ckpt_restore(r, j->h ? head_sched(j->h) : NULL, o->checkpoint_dir, seqs[0], &j->e);
            if (st == PD_OK && j->h)
                st = head_restored(j->h, &j->e);
            if (st == PD_OK && j->h)
                fprintf(stderr, "pipedec: restored checkpoint %llu in %.3f s\n", (unsigned long long)seqs[0],
                        MPI_Wtime() - t0);
        }
        sig_install();
    }
    /* drain-point actions: checkpoints, migrations, status (collective) */
    if (st == PD_OK) {
        st = jobctl_new(r, j->h, j->c, seqs[1], &j->jc, &j->e);
        j->c = NULL; /* jobctl owns it now */
        if (st == PD_OK) {
            jobctl_hooks(j->jc, &j->jc_hooks);
            if (!j->hooks)
                j->hooks = &j->jc_hooks;
        }
    }
    if (st == PD_OK)
        st = report_start(r, j->img, &j->rep, &j->e);
    if (st == PD_OK)
        st = xport_agree_caps(r->x, &j->e);
    return st;
}

/* The exit code of a run that decoded to its end: a stop asked for by the
 * jobctl, or pages that failed. *clean: the job ends in step (no stop). */
static int run_code(const run_job *j, bool *clean)
{
    int code = j->jc && jobctl_exit_code(j->jc) ? jobctl_exit_code(j->jc) : RUN_EXIT_OK;
    *clean = code == RUN_EXIT_OK;
    if (*clean && j->h) {
        sched_progress pr;
        head_progress(j->h, &pr);
        if (pr.pages_failed)
            code = RUN_EXIT_PAGES;
    }
    return code;
}

static void run_teardown(run_job *j, bool close_pipe)
{
    report_free(j->rep);
    jobctl_free(j->jc);
    ctl_close(j->c);
    head_free(j->h);
    pageimg_free(j->img);
    rank_stop(&j->r);
    if (close_pipe)
        pipe_close(j->p);
}

int run_main(const run_opts *o, MPI_Comm world, const run_hooks *hooks)
{
    pd_err pe = {0};
    pipe_link *p = NULL;
    if (pipe_open(world, &p, &pe) != PD_OK) {
        fprintf(stderr, "pipedec: %s\n", pe.msg);
        return RUN_EXIT_FAIL;
    }
    /* the head waits twice as long: when a stage stops, the rank right after
     * it notices first and names it (the head would only see its results
     * missing) */
    pipe_set_stall_timeout(p, pipe_rank(p) == 0 && pipe_size(p) > 1 ? 2 * o->stall_timeout : o->stall_timeout);
    run_job j = {.o = o, .p = p, .r = {.o = o, .p = p}, .hooks = hooks};
    rank *r = &j.r;
    double t_start = MPI_Wtime();
    if (!run_begin(&j)) {
        run_teardown(&j, true);
        return RUN_EXIT_FAIL;
    }

    pd_status st = run_prepare(&j);
    if (st == PD_OK) {
        t_start = MPI_Wtime();
        st = r->is_head ? head_loop(j.h, j.hooks, &j.e) : follow_loop(r, j.hooks, &j.e);
    }
    if (st == PD_OK && j.jc)
        st = jobctl_finish(j.jc, &j.e);
    if (st == PD_OK)
        st = xport_flush(r->x, &j.e);
    r->stats.wall_s = MPI_Wtime() - t_start;
    if (st == PD_OK && j.h)
        head_progress_line(j.h, true);
    bool clean;
    int code = run_code(&j, &clean);
    if (st == PD_OK)
        st = report_end(j.rep, r, j.h, code, &j.e);
    if (st) {
        fprintf(stderr, "pipedec: rank %d: %s: %s\n", r->rank, pd_status_str(st), j.e.msg);
        fflush(stderr);
        code = RUN_EXIT_ABORT;
        clean = false;
    }
    if (o->pid_path && r->rank == 0)
        unlink(o->pid_path);
    run_teardown(&j, clean);
    return code;
}
