/* rank: start-up of one rank's compute part, and the calls its loops make
 * on the stage and tail (contract in rank.h). */
#include "cluster/runtime/rank/rank.h"

#include "base/check.h"
#include "base/clock.h"
#include "base/cpu.h"
#include "cluster/format/pages.h"
#include "cluster/format/tokenizer.h"
#include "cluster/model/cost.h"
#include "cluster/runtime/sched/budget.h"

#include <cjson/cJSON.h>

#include <stdio.h>

#include <stdlib.h>
#include <string.h>

#define RANK_WHOLE_PREFILL_ROWS 1024u
/* A pipeline's default prefill chunk. Each stage waits for the first
 * micro-batch to reach it and the last to leave the stage before it, so a
 * whole page's prefill in one micro-batch (1024 rows) idles a stage for a
 * whole page: on the OCR shape with 8 streams the head waited 11 s of a 40 s
 * run. 64 rows is where bench_gemm's rate reaches its large-M plateau, so
 * smaller chunks cost the GEMMs little while the idle time shrinks to one
 * 64-row chunk per stage. */
#define RANK_PIPELINE_PREFILL_ROWS 64u
#define RANK_CACHE_RETAIN ((size_t)512 << 20) /* freed cache bytes kept per rank */
#define RANK_POOL_POLL_US 1000u /* workers poll 1 ms for the next job when the rank owns its CPUs */

/* Stages take turns when every rank of the run is on this host and the
 * placement rule puts them all on one NUMA node that no launcher binding
 * split: they share one memory bus and one set of cores, so a pipeline
 * gives them nothing a rank's threads would not, and it costs a pass over
 * each stage's weights per micro-batch in flight (decode with few streams
 * is bound by those reads) and the stages' fill, drain and round-trip
 * waits. Instead one micro-batch is in flight, prefill goes in whole pages
 * as on one rank, and each rank, bound to the whole node, runs the threads
 * of all of them (--threads x ranks on the node, rank_place) while the
 * others sleep until the previous stage's message rings them awake
 * (pipe_bells_open; ranks on several hosts nap in their receives instead).
 * README.md ("Ranks or threads on one node") has the measurements.
 * --micro-batches K keeps a pipeline of K, --micro-batches pipeline the
 * pipeline's default K, and so does --draft-async (a stream's second batch
 * needs another in flight);
 * --micro-batches turns asks for turns wherever the ranks are.
 * Collective, and reached by every rank whatever failed before it: a rank
 * that cannot read its topology here votes for a pipeline, and rank_start
 * reports the failure. */
static pd_status rank_agree_turns(rank *r, pd_err *err)
{
    const run_opts *o = r->o;
    pd_err ignored = {0};
    bool one_node = false;
    if (r->size > 1 && r->local_size == r->size && numa_topo_load(&r->topo, &ignored) == PD_OK) {
        char now[NUMA_CPUS_CHARS];
        numa_choice c;
        one_node = numa_binding_get(r->topo, 0, now, sizeof now, &ignored) == PD_OK &&
                   numa_select(r->topo, now, (unsigned)r->local_rank, (unsigned)r->local_size, &c, &ignored) ==
                       PD_OK &&
                   !c.respected && c.ranks_on_node == (unsigned)r->size;
    }
    double against =
        o->turns || (one_node && !o->micro_batches && !o->pipeline && !o->policy.spec_async) ? 0.0 : 1.0;
    pd_status st = pipe_max_double(r->p, against, &against, err);
    r->turns = st == PD_OK && r->size > 1 && against == 0.0;
    /* taking turns, a rank idles until the previous stage's message: on
     * one node that message rings it awake (pipe_bells_open) */
    if (r->turns)
        st = pipe_bells_open(r->p, &r->bells, err);
    return st;
}

pd_status rank_agree_isa(rank *r, pd_err *err)
{
    r->rank = pipe_rank(r->p);
    r->size = pipe_size(r->p);
    r->is_head = r->rank == 0;
    r->is_tail = r->rank == r->size - 1;
    /* Every rank runs the kernels of the ISA level all ranks support. The
     * paths are bit-identical, so this is about one code path, not answers. */
    pd_status st = pipe_node_local(r->p, &r->local_rank, &r->local_size, err);
    double neg_isa = -(double)pd_cpu_isa();
    if (st == PD_OK)
        st = pipe_max_double(r->p, neg_isa, &neg_isa, err);
    if (st == PD_OK)
        pd_cpu_set_isa((pd_isa)(int)-neg_isa);
    return st == PD_OK ? rank_agree_turns(r, err) : st;
}

pd_status rank_agree_work(rank *r, pages_image_rows_fn image_rows, void *image_ctx, pd_err *err)
{
    if (r->size == 1)
        return PD_OK;
    double w[3] = {0, 0, 0}; /* pages, prefill rows, max_new_tokens */
    if (r->is_head) {
        model_hparams hp;
        pd_err ignored = {0};
        pages *pg = NULL;
        /* text segments tokenized as head_open's load tokenizes them, so
         * the rows agreed on are the rows prefilled */
        tok_pages tc = {.path = r->o->model_path};
        pages_opts po = {.header_only = true, .tokenize = tok_pages_encode, .tokenize_ctx = &tc,
                         .image_rows = image_rows, .image_ctx = image_ctx};
        /* hidden 0: embedding files by header, their width unchecked;
         * head_open loads the manifest for real and reports its errors */
        if (model_read_hparams(r->o->model_path, &hp, &ignored) == PD_OK &&
            pages_load(r->o->pages_path, hp.vocab, 0, &po, &pg, &ignored) == PD_OK) {
            for (size_t i = 0; i < pages_count(pg); i++) {
                const pages_page *pp = pages_get(pg, i);
                w[1] += (double)pp->prefill_rows;
                w[2] += (double)pp->max_new_tokens;
            }
            w[0] = (double)pages_count(pg);
        }
        pages_free(pg);
        tok_pages_free(&tc);
    }
    pd_status st = pipe_bcast(r->p, w, sizeof w, err);
    if (st == PD_OK) {
        r->work_pages = w[0];
        r->work_prefill_rows = w[1];
        r->work_new_tokens = w[2];
    }
    return st;
}

/* The default layer map: balanced for what an average page of the manifest
 * brings to each layer (its prefill micro-batches and its decode
 * micro-batches, cost_table_mix_units), or, with no page to go by, for one
 * decode step at cost.h's default operating point. The same on every rank:
 * a pure function of the options, the model file and rank_agree_work. */
static pd_status rank_default_map(rank *r, pd_err *err)
{
    const run_opts *o = r->o;
    if (r->work_pages < 1.0 || (r->work_prefill_rows == 0.0 && r->work_new_tokens == 0.0)) {
        snprintf(r->lm_basis, sizeof r->lm_basis, "one decode step");
        return layermap_for_model(o->model_path, (uint32_t)r->size, NULL, NULL, &r->lm, err);
    }
    /* the streams that decode together: --batch, or every page when fewer */
    uint32_t streams = r->work_pages < (double)o->batch ? (uint32_t)r->work_pages : o->batch;
    uint32_t k = r->sz.n_inflight;
    cost_mix mix = {.prefill_rows = r->work_prefill_rows / r->work_pages,
                    .new_tokens = r->work_new_tokens / r->work_pages,
                    .prefill_rows_per_batch = r->sz.rows_per_batch,
                    .decode_streams = (streams + k - 1) / k};
    if (mix.decode_streams == 0)
        mix.decode_streams = 1;
    mix.decode_rows = mix.decode_streams * (1 + o->policy.max_drafts);
    snprintf(r->lm_basis, sizeof r->lm_basis, "a mean page of %.0f prefill row%s and %.0f new token%s",
             mix.prefill_rows, mix.prefill_rows == 1.0 ? "" : "s", mix.new_tokens, mix.new_tokens == 1.0 ? "" : "s");
    return layermap_for_model(o->model_path, (uint32_t)r->size, NULL, &mix, &r->lm, err);
}

/* One more micro-batch in flight than stages is kept while it costs at most
 * this much more step time in the cost model: the round trip to the head it
 * hides is not in the model, and is worth about that. On the OCR shape with
 * 32 streams N + 1 ran 7 % faster than N though predicted 9 % slower; with 8
 * streams (predicted 44 % slower) it ran 30 % slower. */
#define RANK_INFLIGHT_SLACK 0.15

/* Micro-batches in flight when --micro-batches is not given (the same on
 * every rank: a pure function of the options and the model file). N + 1 lets
 * the head form the next micro-batch while a result travels back, but every
 * micro-batch reads its stage's weights once, so while a micro-batch's share
 * of the decoding streams is too few rows to make the matrices compute-bound
 * (cost.h's rule), one more micro-batch is one more pass over the weights: on
 * the OCR shape with 8 streams, N + 1 = 3 doubled the decode time of 2. Takes
 * N + 1 unless its predicted step time (micro-batches x the whole model's
 * step at their share of rows) exceeds N's by more than RANK_INFLIGHT_SLACK. */
static pd_status rank_default_inflight(const run_opts *o, int size, uint32_t *out, pd_err *err)
{
    *out = size == 1 ? 1 : (uint32_t)size + 1;
    if (size == 1 || o->micro_batches)
        return PD_OK;
    cost_table *t;
    pd_status st = cost_table_read(o->model_path, &t, err);
    if (st)
        return st;
    uint32_t n = cost_table_layers(t);
    uint64_t *c = malloc((size_t)n * sizeof *c), head_ps, tail_ps;
    if (!c)
        st = pd_err_set(err, PD_ERR_NOMEM, "micro-batch count: out of memory for %u layers", n);
    double step[2] = {0, 0};
    for (uint32_t i = 0; i < 2 && st == PD_OK; i++) {
        uint32_t k = (uint32_t)size + i;
        cost_rule rule;
        cost_rule_default(&rule);
        rule.rows = (o->batch + k - 1) / k * (1 + o->policy.max_drafts);
        if (rule.rows == 0)
            rule.rows = 1;
        st = cost_table_units(t, &rule, c, &head_ps, &tail_ps, err);
        double one = (double)head_ps + (double)tail_ps;
        for (uint32_t l = 0; l < n; l++)
            one += (double)c[l];
        step[i] = (double)k * one;
    }
    if (st == PD_OK && step[1] > step[0] * (1.0 + RANK_INFLIGHT_SLACK))
        *out = (uint32_t)size;
    free(c);
    cost_table_free(t);
    return st;
}

/* Micro-batch geometry from the options and the agreed turn mode: the same
 * on every rank. */
static rank_sizes rank_sizes_for(const run_opts *o, int size, bool turns, uint32_t n_inflight)
{
    rank_sizes z = {.prefill_chunk = o->prefill_chunk   ? o->prefill_chunk
                                     : size == 1 || turns ? RANK_WHOLE_PREFILL_ROWS
                                                          : RANK_PIPELINE_PREFILL_ROWS};
    /* n_inflight from rank_default_inflight (N or N + 1; one rank: one);
     * --micro-batches chooses another count (fewer, larger micro-batches
     * read each stage's weights fewer times per step); stages taking turns
     * have one */
    z.n_inflight = n_inflight;
    if (o->micro_batches && size > 1)
        z.n_inflight = o->micro_batches;
    if (turns)
        z.n_inflight = 1;
    z.max_streams = o->batch;
    z.max_rows = o->batch * (1 + o->policy.max_drafts) + z.prefill_chunk;
    z.max_logits = o->batch * (1 + o->policy.max_drafts);
    /* a micro-batch's share of the streams' rows, plus one prefill chunk */
    z.rows_per_batch = (o->batch + z.n_inflight - 1) / z.n_inflight * (1 + o->policy.max_drafts) + z.prefill_chunk;
    return z;
}

/* The largest message this rank may send: a batch with every stream
 * admitted and retired and every row full, or a results message. */
static size_t rank_send_cap(const rank *r)
{
    msg_batch worst = {.dtype = r->o->wire_dtype,
                       .hidden = r->hp.hidden,
                       .n_admit = r->sz.max_streams,
                       .n_retire = r->sz.max_streams,
                       .n_rows = r->sz.max_rows};
    size_t b = msg_batch_bytes(&worst);
    /* f32 rows are the larger when a follower forwards what it received */
    worst.dtype = MSG_DTYPE_F32;
    if (msg_batch_bytes(&worst) > b)
        b = msg_batch_bytes(&worst);
    size_t res = msg_results_bytes(r->sz.max_logits);
    if (res > b)
        b = res;
    return b > MSG_DRAIN_BYTES ? b : MSG_DRAIN_BYTES;
}

static void rank_trace_rows(void *ctx, uint32_t boundary, const mb_row *rows, uint32_t n, const float *x)
{
    rank *r = ctx;
    if (r->tr)
        trace_rows(r->tr, boundary, rows, n, x);
}

/* The node-local slot a rank is placed by (cache/numa.h's rule): among
 * every rank of the launch on its node when encoder ranks run beside the
 * decoding ones (run_opts.node_slots: each then takes cores of its own),
 * else the slot given (among the decoding ranks there). */
static void rank_slot(const run_opts *o, unsigned *slot, unsigned *slots)
{
    if (o->node_slots) {
        *slot = o->node_slot;
        *slots = o->node_slots;
    }
}

pd_status rank_place(rank *r, pd_err *err)
{
    if (r->placed)
        return PD_OK;
    const run_opts *o = r->o;
    unsigned flags = (o->no_bind ? NUMA_NO_BIND : 0) | (r->turns ? NUMA_SHARE_NODE : 0);
    unsigned slot = (unsigned)r->local_rank, slots = (unsigned)r->local_size;
    /* taking turns, the decoding ranks share their node's cpus, and their
     * count is that of the threads they bring */
    if (!r->turns)
        rank_slot(o, &slot, &slots);
    pd_status st = r->topo ? PD_OK : numa_topo_load(&r->topo, err);
    if (st == PD_OK)
        st = numa_place(r->topo, slot, slots, flags, &r->nc, err);
    if (st)
        return st;
    r->threads = o->threads;
    if (r->nc.node_shared) {
        /* the threads of every rank on the node, at most one per CPU of it
         * (oversubscribed ranks bring more threads than the node has CPUs) */
        r->threads = o->threads * r->nc.ranks_on_node;
        if (r->threads > r->nc.n_cpus)
            r->threads = r->nc.n_cpus > o->threads ? r->nc.n_cpus : o->threads;
        if (r->threads > POOL_MAX_THREADS)
            r->threads = POOL_MAX_THREADS;
    }
    r->placed = true;
    return PD_OK;
}

void rank_place_encoder(const run_opts *o, int world_rank, int encoder, char *line, char *json, size_t cap)
{
    numa_topo *topo = NULL;
    numa_choice c;
    pd_err e = {0};
    unsigned slot = 0, slots = 1;
    rank_slot(o, &slot, &slots);
    pd_status st = numa_topo_load(&topo, &e);
    if (st == PD_OK)
        st = numa_place(topo, slot, slots, o->no_bind ? NUMA_NO_BIND : 0, &c, &e);
    numa_report_info ri = {.rank = world_rank, .no_memory = true};
    char txt[RANK_PLACEMENT_CHARS - 32];
    if (st == PD_OK)
        st = numa_report_line(&c, &ri, txt, sizeof txt, &e);
    if (st == PD_OK)
        st = numa_report_json(&c, &ri, json, cap, &e);
    numa_topo_free(topo); /* the binding stays */
    if (st == PD_OK) {
        snprintf(line, cap, "encoder %d, %s", encoder, txt);
        return;
    }
    /* it encodes unbound: the report says why */
    snprintf(line, cap, "encoder %d, rank %d: not placed: %s", encoder, world_rank, e.msg);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "rank", world_rank);
    cJSON_AddStringToObject(j, "binding", "not placed");
    cJSON_AddStringToObject(j, "error", e.msg);
    char *t = cJSON_PrintUnformatted(j);
    snprintf(json, cap, "%s", t ? t : "{}");
    free(t);
    cJSON_Delete(j);
}

pd_status rank_start(rank *r, pd_err *err)
{
    const run_opts *o = r->o;
    pd_status st = model_read_hparams(o->model_path, &r->hp, err);
    if (st)
        return st;
    /* NUMA: bind by node-local rank (or to the whole node when the stages
     * take turns), place weights and caches there (run_begin may have
     * placed it already) */
    if ((st = rank_place(r, err)))
        return st;
    uint32_t n_inflight = 1;
    if (!r->turns && (st = rank_default_inflight(o, r->size, &n_inflight, err)))
        return st;
    r->sz = rank_sizes_for(o, r->size, r->turns, n_inflight);
    if (o->layers)
        st = layermap_parse(o->layers, (uint32_t)r->size, r->hp.n_layers, &r->lm, err);
    else /* balanced by each layer's predicted cost at its real tensor types (cost.h) */
        st = rank_default_map(r, err);
    if (st)
        return st;

    if ((st = arena_new(r->topo, r->nc.node, 0, &r->ar, err)))
        return st;
    /* a retired stream's cache memory is kept for the next admission: no page
     * faults and no munmap on the decode path */
    arena_set_retain(r->ar, RANK_CACHE_RETAIN);
    if ((st = pool_new(r->threads, &r->pool, err)))
        return st;
    /* a rank alone on its CPUs lets its workers poll through a layer's
     * serial work (pool.h); ranks that share CPUs keep the short poll */
    if (!r->turns && !r->nc.cores_shared && r->local_size == 1 && r->threads <= r->nc.n_cpus)
        pool_set_poll(r->pool, RANK_POOL_POLL_US);

    model_load_opts mo = {.first_layer = r->lm.first[r->rank],
                          .n_layers = r->lm.count[r->rank],
                          .want_embed = r->is_head,
                          .want_output = r->is_tail,
                          .backend = o->backend,
                          .alloc = arena_alloc_iface(r->ar)};
    if ((st = model_load(o->model_path, &mo, &r->m, err)))
        return st;

    if ((st = xport_new(r->p, rank_send_cap(r), r->sz.n_inflight + 1, &r->x, err)))
        return st;
    xport_settle_sends(r->x, r->bells);
    stage_config sc = {.m = r->m,
                       .policy = o->policy,
                       .max_rows = r->sz.max_rows,
                       .max_streams = r->sz.max_streams,
                       .pool = r->pool,
                       .cache_alloc = arena_alloc_iface(r->ar),
                       .round_f16 = o->wire_dtype == MSG_DTYPE_F16,
                       .progress = r->size > 1 ? xport_progress : NULL,
                       .progress_ctx = r->x,
                       /* the trace opens after the head's manifest: the
                        * stage reaches it through the rank */
                       .trace = o->trace_path ? rank_trace_rows : NULL,
                       .trace_ctx = r};
    if ((st = stage_new(&sc, &r->st, err)))
        return st;
    if (r->is_tail) {
        tail_config tc = {.m = r->m,
                          .sample = o->sample,
                          .ngram = o->ngram,
                          .seed = o->seed,
                          .max_streams = r->sz.max_streams,
                          .max_rows = r->sz.max_logits,
                          .pool = r->pool};
        if ((st = tail_new(&tc, &r->tl, err)))
            return st;
    }
    uint32_t nl = r->sz.max_logits ? r->sz.max_logits : 1;
    r->tokens = calloc(nl, sizeof *r->tokens);
    r->digests = calloc(nl, sizeof *r->digests);
    if (!r->tokens || !r->digests)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    return PD_OK;
}

#define RANK_FIELDS 15 /* compared */
#define RANK_SLOTS 16  /* + the model path, shown but not compared (nodes may keep the file elsewhere) */
#define RANK_FIELD 160 /* bytes per value */

/* What the ranks must share, in the order rank_fields writes them. */
static const char *const rank_field_names[RANK_FIELDS] = {
    "the layer count", "the model shape", "the layer map", "the model file's fingerprint",
    "--attn/--kv/--evict",          "--sample",        "--seed",          "--no-repeat-ngram",
    "--gemm",                       "--wire-dtype",    "--batch",         "--prefill-chunk",
    "the draft limit",              "the rank count",  "--micro-batches"};

/* This rank's value of each field (zero-padded, so they compare as bytes). */
static void rank_fields(const rank *r, char (*f)[RANK_FIELD])
{
    const run_opts *o = r->o;
    int k = 0;
    memset(f, 0, (size_t)RANK_SLOTS * RANK_FIELD);
    /* the most telling difference first */
    snprintf(f[k++], RANK_FIELD, "%u", r->hp.n_layers);
    snprintf(f[k++], RANK_FIELD, "hidden %u, heads %u/%u, ffn %u, vocab %u", r->hp.hidden, r->hp.n_heads,
             r->hp.n_kv_heads, r->hp.ffn, r->hp.vocab);
    layermap_format(&r->lm, f[k++], RANK_FIELD);
    snprintf(f[k++], RANK_FIELD, "%016llx", (unsigned long long)model_fingerprint(r->m));
    policy_describe(&o->policy, f[k++], RANK_FIELD);
    snprintf(f[k++], RANK_FIELD, "mode %d, temperature %a, top_p %a, top_k %u", (int)o->sample.mode,
             (double)o->sample.temperature, (double)o->sample.top_p, (unsigned)o->sample.top_k);
    snprintf(f[k++], RANK_FIELD, "%llu", (unsigned long long)o->seed);
    snprintf(f[k++], RANK_FIELD, "%u:%u", (unsigned)o->ngram.n, (unsigned)o->ngram.window);
    snprintf(f[k++], RANK_FIELD, "%s", gemm_backend_name(o->backend));
    snprintf(f[k++], RANK_FIELD, "%s", o->wire_dtype == MSG_DTYPE_F16 ? "f16" : "f32");
    snprintf(f[k++], RANK_FIELD, "%u", o->batch);
    snprintf(f[k++], RANK_FIELD, "%u", r->sz.prefill_chunk);
    snprintf(f[k++], RANK_FIELD, "%u%s", o->policy.max_drafts, o->policy.spec_async ? " async" : "");
    snprintf(f[k++], RANK_FIELD, "%d", r->size);
    snprintf(f[k++], RANK_FIELD, "%u%s", r->sz.n_inflight, r->turns ? " (stages take turns)" : "");
    CHECK(k == RANK_FIELDS);
    snprintf(f[k], RANK_FIELD, "%s", o->model_path);
}

pd_status rank_agree_run(rank *r, pd_err *err)
{
    char (*mine)[RANK_FIELD] = calloc(RANK_SLOTS, RANK_FIELD);
    char (*all)[RANK_FIELD] = calloc((size_t)r->size * RANK_SLOTS, RANK_FIELD);
    /* every rank reaches the gather even without memory for it */
    pd_status st = pipe_agree(r->p, mine && all ? PD_OK : PD_ERR_NOMEM, err);
    if (st == PD_ERR_NOMEM)
        pd_err_set(err, PD_ERR_NOMEM, "out of memory comparing the ranks' options (on %s rank)",
                   mine && all ? "another" : "this");
    if (st == PD_OK) {
        rank_fields(r, mine);
        st = pipe_allgather(r->p, mine, (size_t)RANK_SLOTS * RANK_FIELD, all, err);
    }
    /* every rank reads the same table: the verdict is the same everywhere */
    for (int k = 1; st == PD_OK && k < r->size; k++)
        for (int f = 0; f < RANK_FIELDS; f++) {
            const char *a = all[f], *b = all[(size_t)k * RANK_SLOTS + f];
            if (memcmp(a, b, RANK_FIELD) != 0) {
                st = pd_err_set(err, PD_ERR_MISMATCH,
                                "rank %d does not run what rank 0 runs: %s is %.160s on rank %d but %.160s on "
                                "rank 0 (model files: %.120s on rank %d, %.120s on rank 0; every rank needs the "
                                "same model and the same options)",
                                k, rank_field_names[f], b, k, a, all[(size_t)k * RANK_SLOTS + RANK_FIELDS], k,
                                all[RANK_FIELDS]);
                break;
            }
        }
    free(mine);
    free(all);
    return st;
}

pd_status rank_gather_budgets(rank *r, uint64_t **limit, uint32_t **first, uint32_t **layers, pd_err *err)
{
    uint64_t mine[3] = {r->o->mem_limit, r->lm.first[r->rank], r->lm.count[r->rank]};
    pd_status st = PD_OK;
    if (mine[0] == 0)
        st = budget_auto(r->local_size, &mine[0], err);
    /* a rank that could not measure still takes part, with no limit */
    if (st) {
        fprintf(stderr, "pipedec: rank %d: %s; this rank's cache memory is not limited\n", r->rank, err->msg);
        mine[0] = UINT64_MAX;
    }
    uint64_t *all = calloc((size_t)r->size * 3, sizeof *all);
    *limit = calloc((size_t)r->size, sizeof **limit);
    *first = calloc((size_t)r->size, sizeof **first);
    *layers = calloc((size_t)r->size, sizeof **layers);
    st = (all && *limit && *first && *layers) ? PD_OK : pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    pd_status gs = pipe_allgather(r->p, mine, sizeof mine, all, err);
    if (st == PD_OK)
        st = gs;
    for (int k = 0; st == PD_OK && k < r->size; k++) {
        (*limit)[k] = all[3 * k];
        (*first)[k] = (uint32_t)all[3 * k + 1];
        (*layers)[k] = (uint32_t)all[3 * k + 2];
    }
    free(all);
    return st;
}

pd_status rank_open_trace(rank *r, const pages *pg, pd_err *err)
{
    return trace_open(r->o->trace_path, r->rank, r->size, r->hp.hidden, r->sz.max_streams, pg, &r->tr, err);
}

void rank_stop(rank *r)
{
    free(r->tokens);
    free(r->digests);
    trace_close(r->tr);
    tail_free(r->tl);
    stage_free(r->st);
    xport_free(r->x);
    model_free(r->m);
    pool_free(r->pool);
    arena_free(r->ar);
    numa_topo_free(r->topo);
    r->tokens = NULL;
    r->digests = NULL;
    r->tr = NULL;
    r->tl = NULL;
    r->st = NULL;
    r->x = NULL;
    r->m = NULL;
    r->pool = NULL;
    r->ar = NULL;
    r->topo = NULL;
}

pd_status rank_lifecycle(rank *r, const mb_admit *admit, uint32_t na, const uint64_t *retire, uint32_t nr,
                         pd_err *err)
{
    if (r->tr)
        trace_lifecycle(r->tr, admit, na, retire, nr);
    for (uint32_t i = 0; i < nr; i++) {
        stage_retire(r->st, retire[i]);
        if (r->tl)
            tail_retire(r->tl, retire[i]);
    }
    for (uint32_t i = 0; i < na; i++) {
        pd_status st = stage_admit(r->st, &admit[i], err);
        if (st == PD_OK && r->tl)
            st = tail_admit(r->tl, &admit[i], err);
        if (st)
            return st;
    }
    return PD_OK;
}

pd_status rank_forward(rank *r, const mb_row *rows, uint32_t n, float *x, pd_err *err)
{
    double t0 = MPI_Wtime(), c0 = pd_cpu_s();
    pd_status st = stage_forward(r->st, rows, n, x, err);
    if (st)
        return st;
    double dt = MPI_Wtime() - t0;
    r->stats.busy_s += dt;
    r->busy_cpu_s += pd_cpu_s() - c0;
    r->stats.micro_batches += 1;
    r->stats.rows += n;
    /* the prefill / decode split: a mixed micro-batch's time by row share */
    uint32_t n_pre = 0;
    for (uint32_t i = 0; i < n; i++)
        n_pre += rows[i].role == MB_ROLE_PREFILL;
    r->stats.prefill_rows += n_pre;
    r->stats.decode_rows += n - n_pre;
    /* a micro-batch without rows (lifecycle only: retiring finished streams)
     * counts as decode time */
    double pre_s = n ? dt * ((double)n_pre / (double)n) : 0.0;
    r->stats.prefill_s += pre_s;
    r->stats.decode_s += dt - pre_s;
    r->stats.rows_rolled_back = (double)stage_rows_rolled_back(r->st);
    stage_mem sm;
    stage_memory(r->st, &sm);
    if ((double)sm.cache_bytes > r->stats.cache_bytes_peak)
        r->stats.cache_bytes_peak = (double)sm.cache_bytes;
    if ((double)sm.attention_bytes > r->stats.attention_bytes_peak)
        r->stats.attention_bytes_peak = (double)sm.attention_bytes;
    if ((double)sm.stream_bytes_max > r->stats.stream_cache_bytes_peak) {
        r->stats.stream_cache_bytes_peak = (double)sm.stream_bytes_max;
        r->stats.stream_cache_estimate = (double)sm.stream_estimate;
    }
    return PD_OK;
}

pd_status rank_sample(rank *r, const mb_row *rows, uint32_t n, const float *x, uint32_t *n_tokens, pd_err *err)
{
    CHECK(r->tl);
    double t0 = MPI_Wtime(), c0 = pd_cpu_s();
    pd_status st = tail_sample(r->tl, rows, n, x, r->tokens, r->digests, n_tokens, err);
    double dt = MPI_Wtime() - t0;
    r->stats.busy_s += dt;
    r->stats.decode_s += dt; /* sampling makes tokens: decode time (msg.h) */
    r->busy_cpu_s += pd_cpu_s() - c0;
    return st;
}

msg_stats rank_stats(const rank *r)
{
    msg_stats s = r->stats;
    if (r->x) {
        const xport_counters *c = xport_counters_get(r->x);
        s.wait_input_s = c->wait_input_s;
        s.wait_send_s = c->wait_send_s;
        s.messages_sent = c->messages_sent;
        s.bytes_sent = c->bytes_sent;
    }
    return s;
}
