/* pipedec run: decode a page manifest, on one rank or as an MPI pipeline
 * (`mpirun -np N pipedec run ...`). */
#include "base/check.h"
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"
#include "cluster/runtime/sched/budget.h"
#include "cluster/runtime/ops/jobctl.h"
#include "cluster/runtime/ops/migrate.h"
#include "cluster/runtime/job/run.h"
#include "cluster/runtime/loop/pageimg.h"
#include "cluster/runtime/rank/rank.h"
#include "cluster/runtime/rank/signals.h"

#include <getopt.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void run_usage(FILE *f)
{
    fprintf(f,
            "usage: [mpirun -np N] pipedec run --model M --pages P --out O.jsonl\n"
            "         [--batch B] [--threads T] [--prefill-chunk C] [--micro-batches K|turns|pipeline]\n"
            "         [--attn full|rswa:W|window:W] [--kv f32|q8|q8k|q8v]\n"
            "         [--evict none|recent:N|importance:N:SINKS]\n"
            "         [--sample greedy|temp:T[,top_p:P][,top_k:K]] [--seed S] [--no-repeat-ngram N:WINDOW]\n"
            "         [--gemm invariant|openblas|int8] [--layers 0-3,4-7,...] [--wire-dtype f32|f16]\n"
            "         [--stats FILE] [--progress] [--no-bind] [--digest] [--special] [--trace-hidden FILE]\n"
            "         [--past-context] [--stall-timeout SECONDS] [--mem-limit BYTES|auto|none]\n"
            "         [--checkpoint-dir D [--checkpoint-every SECONDS]] [--draft none|ngram[:N[:K]]|model:FILE[:K]]\n"
            "         [--draft-async]\n"
            "         [--control SOCKET] [--rebalance off|auto] [--rebalance-window STEPS]\n"
            "         [--rebalance-threshold PERCENT] [--weights-over-mpi] [--pid-file FILE]\n"
            "         [--mmproj MM [--encoder-threads T] [--encoder-ranks E]]   (image pages: llama.cpp's mtmd;\n"
            "                                            E: the last E ranks encode while the others decode)\n"
            "testing aids: [--migrate-at STEP:MAP]... [--migrate-fault none|corrupt|weights|cut]\n");
}

/* The flags of pipedec run; each short code is a case of run_option. */
static const struct option run_longopts[] = {
    {"model", required_argument, 0, 'm'},         {"pages", required_argument, 0, 'p'},
    {"out", required_argument, 0, 'o'},           {"batch", required_argument, 0, 'b'},
    {"threads", required_argument, 0, 't'},       {"prefill-chunk", required_argument, 0, 'c'},
    {"attn", required_argument, 0, 'A'},          {"kv", required_argument, 0, 'K'},
    {"evict", required_argument, 0, 'E'},         {"sample", required_argument, 0, 'S'},
    {"seed", required_argument, 0, 's'},          {"no-repeat-ngram", required_argument, 0, 'N'},
    {"gemm", required_argument, 0, 'g'},          {"stats", required_argument, 0, 'T'},
    {"progress", no_argument, 0, 'P'},            {"layers", required_argument, 0, 'L'},
    {"wire-dtype", required_argument, 0, 'w'},    {"no-bind", no_argument, 0, 'B'},
    {"digest", no_argument, 0, 'D'},              {"trace-hidden", required_argument, 0, 'H'},
    {"past-context", no_argument, 0, 'X'},        {"stall-timeout", required_argument, 0, 'W'},
    {"mem-limit", required_argument, 0, 'M'},     {"checkpoint-dir", required_argument, 0, 'C'},
    {"checkpoint-every", required_argument, 0, 'Y'}, {"draft", required_argument, 0, 'R'},
    {"draft-async", no_argument, 0, 'y'},         {"control", required_argument, 0, 'Q'},
    {"rebalance", required_argument, 0, 'U'},
    {"rebalance-window", required_argument, 0, 'V'}, {"migrate-at", required_argument, 0, 'G'},
    {"migrate-fault", required_argument, 0, 'F'}, {"rebalance-threshold", required_argument, 0, 'J'},
    {"weights-over-mpi", no_argument, 0, 'O'},    {"pid-file", required_argument, 0, 'I'},
    {"special", no_argument, 0, 'Z'},             {"mmproj", required_argument, 0, 'i'},
    {"encoder-threads", required_argument, 0, 'e'}, {"encoder-ranks", required_argument, 0, 'r'},
    {"micro-batches", required_argument, 0, 'k'}, {"help", no_argument, 0, 'h'},
    {0, 0, 0, 0}};

static const char *const run_gemm_names[] = {"invariant", "openblas", "int8"};
static const gemm_backend run_gemm_values[] = {GEMM_BACKEND_INVARIANT, GEMM_BACKEND_OPENBLAS, GEMM_BACKEND_INT8};
static const char *const run_dtype_names[] = {"f32", "f16"};
static const msg_dtype run_dtype_values[] = {MSG_DTYPE_F32, MSG_DTYPE_F16};
static const char *const run_rebalance_names[] = {"off", "auto"};

/* One flag (getopt_long's code ch, its value arg) into o; PD_ERR_ARG with a
 * message naming the flag. */
static pd_status run_option(int ch, const char *arg, run_opts *o, pd_err *e)
{
    pd_status st = PD_OK;
    uint32_t v = 0;
    int k = 0;
    switch (ch) {
    case 'm': o->model_path = arg; break;
    case 'p': o->pages_path = arg; break;
    case 'o': o->out_path = arg; break;
    case 'b': return cli_u32("--batch", arg, 1, 4096, &o->batch, e);
    case 't': return cli_u32("--threads", arg, 1, 256, &o->threads, e);
    case 'c': return cli_u32("--prefill-chunk", arg, 0, 1u << 16, &o->prefill_chunk, e);
    case 'A': return policy_parse_attn(arg, &o->policy, e);
    case 'K': return policy_parse_kv(arg, &o->policy, e);
    case 'E': return policy_parse_evict(arg, &o->policy, e);
    case 'S': return sample_parse(arg, &o->sample, e);
    case 's': return cli_u64("--seed", arg, &o->seed, e);
    case 'N': return sample_parse_ngram(arg, &o->ngram, e);
    case 'g':
        if ((st = cli_choice("--gemm", arg, run_gemm_names, 3, &k, e)) == PD_OK)
            o->backend = run_gemm_values[k];
        return st;
    case 'T': o->stats_path = arg; break;
    case 'P': o->progress = true; break;
    case 'L': o->layers = arg; break;
    case 'w':
        if ((st = cli_choice("--wire-dtype", arg, run_dtype_names, 2, &k, e)) == PD_OK)
            o->wire_dtype = run_dtype_values[k];
        return st;
    case 'B': o->no_bind = true; break;
    case 'D': o->digest = true; break;
    case 'X': o->past_context = true; break;
    case 'M': return budget_parse(arg, &o->mem_limit, e);
    case 'C': o->checkpoint_dir = arg; break;
    case 'R': return draft_parse(arg, &o->draft, e);
    case 'y': o->policy.spec_async = true; break;
    case 'Y':
        st = cli_u32("--checkpoint-every", arg, 1, 30u * 24 * 3600, &v, e);
        o->checkpoint_every = v;
        return st;
    case 'W':
        st = cli_u32("--stall-timeout", arg, 0, 7u * 24 * 3600, &v, e);
        o->stall_timeout = v;
        return st;
    case 'H': o->trace_path = arg; break;
    case 'Q': o->control_path = arg; break;
    case 'I': o->pid_path = arg; break;
    case 'Z': o->special = true; break;
    case 'i': o->mmproj_path = arg; break;
    case 'e': return cli_u32("--encoder-threads", arg, 1, 1024, &o->encoder_threads, e);
    case 'r': return cli_u32("--encoder-ranks", arg, 0, 4096, &o->encoder_ranks, e);
    case 'U':
        if ((st = cli_choice("--rebalance", arg, run_rebalance_names, 2, &k, e)) == PD_OK)
            o->rebalance = k == 1;
        return st;
    case 'V': return cli_u32("--rebalance-window", arg, 1, 1u << 30, &o->rebalance_window, e);
    case 'O': o->weights_over_mpi = true; break;
    case 'k':
        o->turns = strcmp(arg, "turns") == 0;
        o->pipeline = strcmp(arg, "pipeline") == 0;
        o->micro_batches = 0;
        if (o->turns || o->pipeline)
            break;
        if (arg[0] >= '0' && arg[0] <= '9')
            return cli_u32("--micro-batches", arg, 1, 64, &o->micro_batches, e);
        return pd_err_set(e, PD_ERR_ARG, "--micro-batches '%s': expected a count (1-64), turns or pipeline", arg);
    case 'J':
        st = cli_u32("--rebalance-threshold", arg, 0, 100000, &v, e);
        o->rebalance_threshold = v / 100.0;
        return st;
    case 'G': {
        uint64_t step;
        const char *map;
        if (o->n_migrate_at == RUN_MIGRATE_AT_MAX)
            return pd_err_set(e, PD_ERR_ARG, "--migrate-at: at most %d of them", RUN_MIGRATE_AT_MAX);
        if ((st = jobctl_parse_migrate_at(arg, &step, &map, e)) == PD_OK)
            o->migrate_at[o->n_migrate_at++] = arg;
        return st;
    }
    case 'F': {
        migrate_fault f;
        if ((st = migrate_fault_parse(arg, &f, e)) == PD_OK)
            o->migrate_fault = (int)f;
        return st;
    }
    default: CHECK(0 && "a flag of run_longopts without its case");
    }
    return PD_OK;
}

/* What no single flag can check: the required ones, and flags that need
 * another. */
static pd_status run_check(run_opts *o, pd_err *e)
{
    if (!o->model_path || !o->pages_path || !o->out_path)
        return pd_err_set(e, PD_ERR_ARG, "--model, --pages and --out are required");
    if (o->encoder_ranks && !o->mmproj_path)
        return pd_err_set(e, PD_ERR_ARG, "--encoder-ranks needs --mmproj (the vision encoder they run)");
    if (o->checkpoint_every > 0 && !o->checkpoint_dir)
        return pd_err_set(e, PD_ERR_ARG, "--checkpoint-every needs --checkpoint-dir");
    return policy_validate(&o->policy, e);
}

/* One flag into o (cli_flag_fn); PD_ERR_ARG with a message naming the flag. */
static pd_status run_flag(void *ctx, int ch, const char *arg, pd_err *e)
{
    return run_option(ch, arg, ctx, e);
}

/* Once every flag is in (cli_cmd.check): what follows from them, then run_check. */
static pd_status run_finish(void *ctx, pd_err *e)
{
    run_opts *o = ctx;
    /* the caches keep room for the drafts a verify step carries */
    o->policy.max_drafts = o->draft.mode == DRAFT_NONE ? 0 : o->draft.k;
    return run_check(o, e);
}

static const cli_cmd run_cli = {
    .name = "run", .opts = run_longopts, .flag = run_flag, .check = run_finish, .usage = run_usage};

/* Started without a launcher (no mpirun, srun or PMI environment), pipedec
 * is an Open MPI singleton: one rank that talks to nobody. Open MPI would
 * still fork an orted for it and probe every transport component; loading
 * the Omni-Path one (libpsm2) alone sleeps ~0.2 s in its constructor, so a
 * one-rank run spent ~0.4 s in MPI_Init. A singleton needs neither, so
 * unless the user's environment says otherwise it runs isolated (no orted)
 * on the ob1 layer over self: MPI_Init then takes ~0.05 s. Launched ranks
 * are left alone: their transports are the site's choice. */
static void singleton_defaults(void)
{
    static const char *const launched[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"};
    for (size_t i = 0; i < sizeof launched / sizeof *launched; i++)
        if (getenv(launched[i]))
            return;
    setenv("OMPI_MCA_ess_singleton_isolated", "1", 0);
    setenv("OMPI_MCA_pml", "ob1", 0);
}

/* --encoder-ranks E: the last E ranks of the launch encode page images
 * (loop/pageimg.h) for the decoding pipeline on the others, whose rank 0 is
 * the head. Returns this rank's exit code. */
static int run_with_encoders(run_opts *o, int me)
{
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if ((int64_t)o->encoder_ranks >= size) {
        if (me == 0)
            fprintf(stderr, "pipedec run: --encoder-ranks %u leaves no rank to decode (the launch has %d)\n",
                    o->encoder_ranks, size);
        return 2;
    }
    int first = size - (int)o->encoder_ranks;
    bool encoder = me >= first;
    MPI_Comm part;
    if (MPI_Comm_split(MPI_COMM_WORLD, encoder ? 1 : 0, me, &part) != MPI_SUCCESS) {
        fprintf(stderr, "pipedec run: rank %d: MPI_Comm_split failed\n", me);
        return 1;
    }
    o->enc_world = MPI_COMM_WORLD;
    o->enc_first = first;
    /* every rank of the launch on a node is placed by its slot among all of
     * them: decoding and encoder ranks take cores of their own */
    MPI_Comm node;
    int slot = 0, slots = 1;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, me, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_rank(node, &slot);
        MPI_Comm_size(node, &slots);
        MPI_Comm_free(&node);
        o->node_slot = (uint32_t)slot;
        o->node_slots = (uint32_t)slots;
    }
    int code;
    if (encoder) {
        pd_err e = {0};
        char pl[2 * RANK_PLACEMENT_CHARS] = {0};
        rank_place_encoder(o, me, me - first, pl, pl + RANK_PLACEMENT_CHARS, RANK_PLACEMENT_CHARS);
        code = RUN_EXIT_OK;
        /* srun and mpirun forward a checkpoint or stop signal (USR1, USR2,
         * TERM) to every rank of the step, this one included, and the
         * default action would end it: the launcher then ends the step
         * before the head's checkpoint is written. The decoding ranks act on
         * the signal (the head receives it too); an encoder keeps serving
         * until the head tells it to stop, and like them exits at a second
         * SIGTERM or a SIGINT. */
        sig_install();
        if (pageimg_serve(o->mmproj_path, o->model_path, o->encoder_threads ? o->encoder_threads : o->threads,
                          MPI_COMM_WORLD, 0, pl, sizeof pl, &e) != PD_OK) {
            fprintf(stderr, "pipedec: encoder rank %d: %s\n", me, e.msg);
            code = RUN_EXIT_ABORT;
        }
    } else {
        code = run_main(o, part, NULL);
        pd_err e = {0};
        /* nothing was decoded: the encoders still wait for the head's word */
        if (code == RUN_EXIT_FAIL && me == 0 &&
            pageimg_stop(&(pageimg_encoders){.world = MPI_COMM_WORLD, .first = first, .n = (int)o->encoder_ranks},
                         0, &e) != PD_OK)
            fprintf(stderr, "pipedec: rank 0: %s\n", e.msg);
    }
    /* a rank that failed mid-run (an encoder included: the head waits for
     * its replies) ends the job, as without encoder ranks */
    if (code == RUN_EXIT_ABORT)
        MPI_Abort(MPI_COMM_WORLD, 1);
    MPI_Comm_free(&part);
    return code;
}

int cmd_run(int argc, char **argv)
{
    int provided = 0;
    singleton_defaults();
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "pipedec run: MPI_Init_thread failed\n");
        return 1;
    }
    int me = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    run_opts o;
    run_opts_default(&o);
    /* every rank parses the same argv and agrees; rank 0 speaks */
    int code = cli_parse(&run_cli, argc, argv, &o, me == 0 ? stdout : NULL, me == 0 ? stderr : NULL);
    if (code == CLI_GO && o.encoder_ranks) {
        code = run_with_encoders(&o, me);
    } else if (code == CLI_GO) {
        code = run_main(&o, MPI_COMM_WORLD, NULL);
        if (code == RUN_EXIT_ABORT) {
            int size = 1;
            MPI_Comm_size(MPI_COMM_WORLD, &size);
            /* this rank failed mid-run; its peers may be blocked in a
             * receive and cannot learn of it otherwise: end the job. Alone,
             * there is nobody to tell: exit plainly, so pipedec's message is
             * the last thing the user reads (no Open MPI abort banner). */
            if (size > 1)
                MPI_Abort(MPI_COMM_WORLD, 1);
            code = 1;
        }
    }
    MPI_Finalize();
    return code;
}
