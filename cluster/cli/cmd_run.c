/* pipedec run: decode a page manifest, on one rank or as an MPI pipeline
 * (`mpirun -np N pipedec run ...`). */
#include "cluster/cli/cli.h"
#include "cluster/cli/cmd.h"
#include "cluster/runtime/sched/budget.h"
#include "cluster/runtime/ops/jobctl.h"
#include "cluster/runtime/ops/migrate.h"
#include "cluster/runtime/job/run.h"
#include "cluster/runtime/loop/pageimg.h"
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
            "         [--gemm invariant|openblas] [--layers 0-3,4-7,...] [--wire-dtype f32|f16]\n"
            "         [--stats FILE] [--progress] [--no-bind] [--digest] [--special] [--trace-hidden FILE]\n"
            "         [--past-context] [--stall-timeout SECONDS] [--mem-limit BYTES|auto|none]\n"
            "         [--checkpoint-dir D [--checkpoint-every SECONDS]] [--draft none|ngram[:N[:K]]|model:FILE[:K]]\n"
            "         [--draft-async]\n"
            "         [--control SOCKET] [--rebalance off|auto] [--rebalance-window STEPS]\n"
            "         [--rebalance-threshold PERCENT] [--weights-over-mpi] [--pid-file FILE]\n"
            "         [--mmproj MM [--encoder-threads T] [--encoder-ranks E]]   (image pages: llama.cpp's mtmd;\n"
            "                                            E: the last E ranks encode while the others decode)\n"
            "testing aids: [--migrate-at STEP:MAP]... [--migrate-fault none|corrupt|weights]\n");
}

/* Parses argv into o; PD_ERR_ARG with a message naming the flag. */
static pd_status run_parse(int argc, char **argv, run_opts *o, int *help, pd_err *e)
{
    static const struct option opts[] = {
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
        {"past-context", no_argument, 0, 'X'},       {"stall-timeout", required_argument, 0, 'W'},
        {"mem-limit", required_argument, 0, 'M'},     {"checkpoint-dir", required_argument, 0, 'C'},
        {"checkpoint-every", required_argument, 0, 'Y'}, {"draft", required_argument, 0, 'R'},
        {"draft-async", no_argument, 0, 'y'},
        {"control", required_argument, 0, 'Q'},      {"rebalance", required_argument, 0, 'U'},
        {"rebalance-window", required_argument, 0, 'V'}, {"migrate-at", required_argument, 0, 'G'},
        {"migrate-fault", required_argument, 0, 'F'}, {"rebalance-threshold", required_argument, 0, 'J'},
        {"weights-over-mpi", no_argument, 0, 'O'},    {"pid-file", required_argument, 0, 'I'},
        {"special", no_argument, 0, 'Z'},             {"mmproj", required_argument, 0, 'i'},
        {"encoder-threads", required_argument, 0, 'e'}, {"encoder-ranks", required_argument, 0, 'r'},
           {"micro-batches", required_argument, 0, 'k'},    {"help", no_argument, 0, 'h'},
        {0, 0, 0, 0}};
    pd_status st = PD_OK;
    int ch;
    optind = 1;
    opterr = 0;
    *help = 0;
    while (st == PD_OK && (ch = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (ch) {
        case 'm': o->model_path = optarg; break;
        case 'p': o->pages_path = optarg; break;
        case 'o': o->out_path = optarg; break;
        case 'b': st = cli_u32("--batch", optarg, 1, 4096, &o->batch, e); break;
        case 't': st = cli_u32("--threads", optarg, 1, 256, &o->threads, e); break;
        case 'c': st = cli_u32("--prefill-chunk", optarg, 0, 1u << 16, &o->prefill_chunk, e); break;
        case 'A': st = policy_parse_attn(optarg, &o->policy, e); break;
        case 'K': st = policy_parse_kv(optarg, &o->policy, e); break;
        case 'E': st = policy_parse_evict(optarg, &o->policy, e); break;
        case 'S': st = sample_parse(optarg, &o->sample, e); break;
        case 's': st = cli_u64("--seed", optarg, &o->seed, e); break;
        case 'N': st = sample_parse_ngram(optarg, &o->ngram, e); break;
        case 'g':
            if (strcmp(optarg, "invariant") == 0)
                o->backend = GEMM_BACKEND_INVARIANT;
            else if (strcmp(optarg, "openblas") == 0)
                o->backend = GEMM_BACKEND_OPENBLAS;
            else
                st = pd_err_set(e, PD_ERR_ARG, "--gemm '%s': expected invariant or openblas", optarg);
            break;
        case 'T': o->stats_path = optarg; break;
        case 'P': o->progress = true; break;
        case 'L': o->layers = optarg; break;
        case 'w':
            if (strcmp(optarg, "f32") == 0)
                o->wire_dtype = MSG_DTYPE_F32;
            else if (strcmp(optarg, "f16") == 0)
                o->wire_dtype = MSG_DTYPE_F16;
            else
                st = pd_err_set(e, PD_ERR_ARG, "--wire-dtype '%s': expected f32 or f16", optarg);
            break;
        case 'B': o->no_bind = true; break;
        case 'D': o->digest = true; break;
        case 'X': o->past_context = true; break;
        case 'M': st = budget_parse(optarg, &o->mem_limit, e); break;
        case 'C': o->checkpoint_dir = optarg; break;
        case 'R': st = draft_parse(optarg, &o->draft, e); break;
        case 'y': o->policy.spec_async = true; break;
        case 'Y': {
            uint32_t v;
            st = cli_u32("--checkpoint-every", optarg, 1, 30u * 24 * 3600, &v, e);
            o->checkpoint_every = v;
            break;
        }
        case 'W': {
            uint32_t v;
            st = cli_u32("--stall-timeout", optarg, 0, 7u * 24 * 3600, &v, e);
            o->stall_timeout = v;
            break;
        }
        case 'H': o->trace_path = optarg; break;
        case 'Q': o->control_path = optarg; break;
        case 'I': o->pid_path = optarg; break;
        case 'Z': o->special = true; break;
        case 'i': o->mmproj_path = optarg; break;
        case 'e': st = cli_u32("--encoder-threads", optarg, 1, 1024, &o->encoder_threads, e); break;
        case 'r': st = cli_u32("--encoder-ranks", optarg, 0, 4096, &o->encoder_ranks, e); break;
        case 'U':
            if (strcmp(optarg, "auto") == 0)
                o->rebalance = true;
            else if (strcmp(optarg, "off") == 0)
                o->rebalance = false;
            else
                st = pd_err_set(e, PD_ERR_ARG, "--rebalance '%s': expected off or auto", optarg);
            break;
        case 'V': st = cli_u32("--rebalance-window", optarg, 1, 1u << 30, &o->rebalance_window, e); break;
        case 'O': o->weights_over_mpi = true; break;
        case 'k':
            o->turns = strcmp(optarg, "turns") == 0;
            o->pipeline = strcmp(optarg, "pipeline") == 0;
            o->micro_batches = 0;
            if (o->turns || o->pipeline)
                break;
            if (optarg[0] >= '0' && optarg[0] <= '9')
                st = cli_u32("--micro-batches", optarg, 1, 64, &o->micro_batches, e);
            else
                st = pd_err_set(e, PD_ERR_ARG, "--micro-batches '%s': expected a count (1-64), turns or pipeline",
                                optarg);
            break;
        case 'J': {
            uint32_t pct;
            st = cli_u32("--rebalance-threshold", optarg, 0, 100000, &pct, e);
            o->rebalance_threshold = pct / 100.0;
            break;
        }
        case 'G': {
            uint64_t step;
            const char *map;
            if (o->n_migrate_at == RUN_MIGRATE_AT_MAX)
                st = pd_err_set(e, PD_ERR_ARG, "--migrate-at: at most %d of them", RUN_MIGRATE_AT_MAX);
            else if ((st = jobctl_parse_migrate_at(optarg, &step, &map, e)) == PD_OK)
                o->migrate_at[o->n_migrate_at++] = optarg;
            break;
        }
        case 'F': {
            migrate_fault f;
            if ((st = migrate_fault_parse(optarg, &f, e)) == PD_OK)
                o->migrate_fault = (int)f;
            break;
        }
        case 'h': *help = 1; return PD_OK;
        default: st = pd_err_set(e, PD_ERR_ARG, "unknown or incomplete option '%s'", argv[optind - 1]);
        }
    }
    if (st == PD_OK && optind < argc)
        st = pd_err_set(e, PD_ERR_ARG, "unexpected argument '%s'", argv[optind]);
    if (st == PD_OK && (!o->model_path || !o->pages_path || !o->out_path))
        st = pd_err_set(e, PD_ERR_ARG, "--model, --pages and --out are required");
    /* the caches keep room for the drafts a verify step carries */
    o->policy.max_drafts = o->draft.mode == DRAFT_NONE ? 0 : o->draft.k;
    if (st == PD_OK && o->encoder_ranks && !o->mmproj_path)
        st = pd_err_set(e, PD_ERR_ARG, "--encoder-ranks needs --mmproj (the vision encoder they run)");
    if (st == PD_OK && o->checkpoint_every > 0 && !o->checkpoint_dir)
        st = pd_err_set(e, PD_ERR_ARG, "--checkpoint-every needs --checkpoint-dir");
    if (st == PD_OK)
        st = policy_validate(&o->policy, e);
    return st;
}

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
    int code;
    if (encoder) {
        pd_err e = {0};
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
                          MPI_COMM_WORLD, 0, &e) != PD_OK) {
            fprintf(stderr, "pipedec: encoder rank %d: %s\n", me, e.msg);
            code = RUN_EXIT_ABORT;
        }
    } else {
        code = run_main(o, part, NULL);
    }
    if (code != RUN_EXIT_ABORT)
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
    pd_err e = {0};
    int help = 0;
    int code;
    if (run_parse(argc, argv, &o, &help, &e) != PD_OK) {
        /* every rank parsed the same argv and agrees; rank 0 speaks */
        if (me == 0) {
            fprintf(stderr, "pipedec run: %s\n", e.msg);
            run_usage(stderr);
        }
        code = 2;
    } else if (help) {
        if (me == 0)
            run_usage(stdout);
        code = 0;
    } else if (o.encoder_ranks) {
        code = run_with_encoders(&o, me);
    } else {
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
