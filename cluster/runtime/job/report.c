/* report: placement lines at start, --stats and the summary at the end
 * (contract in report.h). */
#include "cluster/runtime/job/report.h"

#include "base/cpu.h"
#include "base/file.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPORT_LINE RANK_PLACEMENT_CHARS /* one rank's placement text, and its JSON */

struct report {
    char *lines; /* rank 0: [size x 2 x REPORT_LINE] text, JSON of each rank */
    char *enc;   /* rank 0: [n_enc x 2 x REPORT_LINE] the same of each encoder rank */
    int n_enc;
};

/* Encoder ranks (--encoder-ranks): their placement records (rank_place_encoder,
 * sent as they start), kept for the start-up lines and --stats. */
static pd_status report_encoders(report *rep, pageimg *img, pd_err *err)
{
    rep->n_enc = pageimg_encoder_count(img);
    if (rep->n_enc == 0)
        return PD_OK;
    if (!(rep->enc = calloc((size_t)rep->n_enc, 2 * REPORT_LINE)))
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    pd_status st = pageimg_placements(img, rep->enc, 2 * REPORT_LINE, err);
    for (int k = 0; k < 2 * rep->n_enc; k++) /* what came over the wire ends in NUL here */
        rep->enc[(size_t)k * REPORT_LINE + REPORT_LINE - 1] = '\0';
    return st;
}

pd_status report_start(rank *r, pageimg *img, report **out, pd_err *err)
{
    report *rep = calloc(1, sizeof *rep);
    if (!rep)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    *out = rep;
    arena_verdict av = {0};
    pd_err ve = {0};
    arena_verify(r->ar, &av, &ve);
    arena_stats as;
    arena_stats_get(r->ar, &as);
    char lr[64];
    snprintf(lr, sizeof lr, "layers %u-%u", r->lm.first[r->rank], r->lm.first[r->rank] + r->lm.count[r->rank] - 1);
    numa_report_info ri = {.rank = r->rank,
                           .bytes_placed = as.bytes_placed,
                           .verified = av.verified,
                           .placement = arena_placement(r->ar)};
    char line[REPORT_LINE - 96];
    char both[2 * REPORT_LINE];
    memset(both, 0, sizeof both);
    numa_report_line(&r->nc, &ri, line, sizeof line, &ve);
    snprintf(both, REPORT_LINE, "%s, %s", lr, line);
    numa_report_json(&r->nc, &ri, both + REPORT_LINE, REPORT_LINE, &ve);
    if (r->rank == 0 && !(rep->lines = calloc((size_t)r->size, sizeof both)))
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    pd_status st = pipe_gather(r->p, both, sizeof both, rep->lines, err);
    if (st == PD_OK && r->rank == 0)
        st = report_encoders(rep, img, err);
    if (st || r->rank != 0)
        return st;
    char pol[160];
    policy_describe(&r->o->policy, pol, sizeof pol);
    char lm[LAYERMAP_MAX_STAGES * 12], basis[sizeof r->lm_basis + 32] = "";
    layermap_format(&r->lm, lm, sizeof lm);
    if (r->size > 1)
        snprintf(basis, sizeof basis, " (balanced for %s)", r->lm_basis);
    char turns[96] = "";
    if (r->turns)
        snprintf(turns, sizeof turns, " (the stages take turns, %u thread%s each)", r->threads,
                 r->threads == 1 ? "" : "s");
    printf("pipedec: %d rank%s, model %s (%u layers, hidden %u), %s, kernels %s on every rank, %u micro-batch%s "
           "in flight%s, prefill chunk %u, layers %s%s%s%s\n",
           r->size, r->size == 1 ? "" : "s", r->o->model_path, r->hp.n_layers, r->hp.hidden, pol,
           pd_isa_name(pd_cpu_isa()), r->sz.n_inflight, r->sz.n_inflight == 1 ? "" : "es", turns,
           r->sz.prefill_chunk, lm,
           r->o->layers ? "" : basis, r->hp.assumed[0] ? "; assumed: " : "", r->hp.assumed);
    for (int k = 0; k < r->size; k++)
        printf("pipedec: placement: %s\n", rep->lines + (size_t)k * sizeof both);
    for (int k = 0; k < rep->n_enc; k++)
        printf("pipedec: placement: %s\n", rep->enc + (size_t)k * sizeof both);
    fflush(stdout);
    return PD_OK;
}

void report_free(report *rep)
{
    if (!rep)
        return;
    free(rep->lines);
    free(rep->enc);
    free(rep);
}

/* --stats "spec": what speculation drafted and kept (with --draft). */
static void stats_spec(cJSON *j, const run_opts *o, const sched_progress *pr)
{
    cJSON *sp = cJSON_AddObjectToObject(j, "spec");
    cJSON_AddNumberToObject(sp, "drafted", (double)pr->drafted);
    cJSON_AddNumberToObject(sp, "accepted", (double)pr->accepted);
    cJSON_AddNumberToObject(sp, "passes", (double)pr->spec_passes);
    if (o->policy.spec_async)
        cJSON_AddNumberToObject(sp, "stale", (double)pr->stale_rows);
    if (o->draft.mode == DRAFT_MODEL) {
        cJSON_AddNumberToObject(sp, "draft_model_rows", (double)pr->draft_rows);
        cJSON_AddNumberToObject(sp, "draft_model_proposals", (double)pr->draft_proposals);
    }
}

/* --stats "prefill" / "decode": the prefill / decode split (msg.h): every
 * stage runs every row, so the pipeline's time in a phase is that of its
 * busiest stage in that phase, or the sum of the stages' when they take
 * turns. */
static void stats_phases(cJSON *j, const rank *r, const sched_progress *pr, const msg_stats *all)
{
    double pre_s = 0, dec_s = 0, dec_rows = 0;
    for (int k = 0; k < r->size; k++) {
        if (r->turns) { /* stages taking turns: one after another */
            pre_s += all[k].prefill_s;
            dec_s += all[k].decode_s;
        } else {
            pre_s = all[k].prefill_s > pre_s ? all[k].prefill_s : pre_s;
            dec_s = all[k].decode_s > dec_s ? all[k].decode_s : dec_s;
        }
        dec_rows = all[k].decode_rows > dec_rows ? all[k].decode_rows : dec_rows;
    }
    cJSON *pre = cJSON_AddObjectToObject(j, "prefill");
    cJSON_AddNumberToObject(pre, "rows", (double)pr->prefill_rows);
    cJSON_AddNumberToObject(pre, "s", pre_s);
    cJSON_AddNumberToObject(pre, "rows_per_s", pre_s > 0 ? (double)pr->prefill_rows / pre_s : 0.0);
    cJSON *dec = cJSON_AddObjectToObject(j, "decode");
    cJSON_AddNumberToObject(dec, "rows", dec_rows);
    cJSON_AddNumberToObject(dec, "tokens", (double)pr->tokens_generated);
    cJSON_AddNumberToObject(dec, "s", dec_s);
    cJSON_AddNumberToObject(dec, "tokens_per_s", dec_s > 0 ? (double)pr->tokens_generated / dec_s : 0.0);
}

/* --stats "stages"[k]: rank k's counters, limits and placement. */
static cJSON *stats_stage(const report *rep, const rank *r, int k, const msg_stats *s, const budget *bud)
{
    const char *pj = rep->lines + (size_t)k * 2 * REPORT_LINE + REPORT_LINE;
    cJSON *st = cJSON_CreateObject();
    cJSON_AddNumberToObject(st, "rank", k);
    char lr[64];
    snprintf(lr, sizeof lr, "%u-%u", r->lm.first[k], r->lm.first[k] + r->lm.count[k] - 1);
    cJSON_AddStringToObject(st, "layers", lr);
    cJSON_AddNumberToObject(st, "busy_s", s->busy_s);
    cJSON_AddNumberToObject(st, "wait_input_s", s->wait_input_s);
    cJSON_AddNumberToObject(st, "wait_send_s", s->wait_send_s);
    cJSON_AddNumberToObject(st, "messages_sent", s->messages_sent);
    cJSON_AddNumberToObject(st, "bytes_sent", s->bytes_sent);
    cJSON_AddNumberToObject(st, "micro_batches", s->micro_batches);
    cJSON_AddNumberToObject(st, "rows", s->rows);
    cJSON_AddNumberToObject(st, "prefill_rows", s->prefill_rows);
    cJSON_AddNumberToObject(st, "decode_rows", s->decode_rows);
    cJSON_AddNumberToObject(st, "prefill_s", s->prefill_s);
    cJSON_AddNumberToObject(st, "decode_s", s->decode_s);
    if (r->o->draft.mode != DRAFT_NONE)
        cJSON_AddNumberToObject(st, "rows_rolled_back", s->rows_rolled_back);
    cJSON_AddNumberToObject(st, "cache_bytes_peak", s->cache_bytes_peak);
    cJSON_AddNumberToObject(st, "attention_bytes_peak", s->attention_bytes_peak);
    cJSON_AddNumberToObject(st, "stream_cache_bytes_peak", s->stream_cache_bytes_peak);
    cJSON_AddNumberToObject(st, "stream_cache_estimate", s->stream_cache_estimate);
    if (bud) {
        uint64_t lim = budget_limit(bud, k);
        if (lim == UINT64_MAX)
            cJSON_AddNullToObject(st, "mem_limit_bytes");
        else
            cJSON_AddNumberToObject(st, "mem_limit_bytes", (double)lim);
        cJSON_AddNumberToObject(st, "cache_reserved_peak", (double)budget_peak(bud, k));
    }
    cJSON *pl = cJSON_Parse(pj);
    if (pl)
        cJSON_AddItemToObject(st, "placement", pl);
    return st;
}

/* Written whole or not at all: a temporary file renamed over the target. A
 * failure is said on stderr: the decode itself succeeded. */
static void stats_publish(const cJSON *j, const char *path)
{
    char *txt = cJSON_Print(j);
    pd_err e = {0};
    pd_publish *pub = NULL;
    pd_status st = txt ? pd_file_publish_begin(path, 0644, "--stats", &pub, &e)
                       : pd_err_set(&e, PD_ERR_NOMEM, "--stats: out of memory");
    if (st == PD_OK && (st = pd_file_publish_write(pub, txt, strlen(txt), &e)) == PD_OK)
        st = pd_file_publish_write(pub, "\n", 1, &e);
    if (pub) /* a failed write fails the publish: commit then cleans up and returns it */
        st = pd_file_publish_commit(pub, &e);
    if (st)
        fprintf(stderr, "pipedec: %s (the decode itself succeeded)\n", e.msg);
    free(txt);
}

static void report_stats_json(const report *rep, const rank *r, const sched_progress *pr, double wall,
                              const msg_stats *all, const budget *bud, int exit_status)
{
    const run_opts *o = r->o;
    double tps = wall > 0 ? (double)pr->tokens_generated / wall : 0.0;
    char pol[160];
    policy_describe(&o->policy, pol, sizeof pol);
    cJSON *j = cJSON_CreateObject();
    cJSON_AddNumberToObject(j, "exit_status", exit_status);
    cJSON_AddNumberToObject(j, "ranks", r->size);
    cJSON_AddNumberToObject(j, "pages_total", (double)pr->pages_total);
    cJSON_AddNumberToObject(j, "pages_done", (double)pr->pages_done);
    cJSON_AddNumberToObject(j, "pages_skipped", (double)pr->pages_skipped);
    cJSON_AddNumberToObject(j, "pages_failed", (double)pr->pages_failed);
    cJSON_AddNumberToObject(j, "pages_past_context", (double)pr->pages_past_context);
    if (o->mmproj_path) {
        cJSON_AddNumberToObject(j, "images_encoded", (double)pr->images_encoded);
        cJSON_AddNumberToObject(j, "images_counted", (double)pr->images_counted);
    }
    if (o->mmproj_path && o->encoder_ranks) { /* the decoding ranks idle while the head waits */
        cJSON_AddNumberToObject(j, "images_wait_s", pr->images_wait_s);
        cJSON_AddNumberToObject(j, "images_waits", (double)pr->images_waits);
        cJSON_AddNumberToObject(j, "images_head", (double)pr->images_head);
        cJSON_AddNumberToObject(j, "images_head_s", pr->images_head_s);
    }
    if (o->draft.mode != DRAFT_NONE)
        stats_spec(j, o, pr);
    cJSON_AddNumberToObject(j, "context_length", r->hp.ctx);
    cJSON_AddNumberToObject(j, "tokens", (double)pr->tokens_generated);
    cJSON_AddNumberToObject(j, "prefill_rows", (double)pr->prefill_rows);
    if (r->size > 1) { /* what the default layer map was balanced for (rank_agree_work) */
        cJSON *wk = cJSON_AddObjectToObject(j, "work_agreed");
        cJSON_AddNumberToObject(wk, "pages", r->work_pages);
        cJSON_AddNumberToObject(wk, "prefill_rows", r->work_prefill_rows);
        cJSON_AddNumberToObject(wk, "max_new_tokens", r->work_new_tokens);
    }
    cJSON_AddNumberToObject(j, "wall_s", wall);
    cJSON_AddNumberToObject(j, "tokens_per_s", tps);
    stats_phases(j, r, pr, all);
    cJSON_AddStringToObject(j, "policy", pol);
    cJSON_AddStringToObject(j, "gemm", gemm_backend_name(o->backend));
    cJSON_AddStringToObject(j, "wire_dtype", o->wire_dtype == MSG_DTYPE_F16 ? "f16" : "f32");
    cJSON_AddNumberToObject(j, "threads", o->threads);
    cJSON_AddNumberToObject(j, "threads_per_rank", r->threads);
    cJSON_AddBoolToObject(j, "turns", r->turns);
    cJSON_AddNumberToObject(j, "micro_batches_in_flight", r->sz.n_inflight);
    cJSON_AddNumberToObject(j, "batch", o->batch);
    char lmap[512];
    layermap_format(&r->lm, lmap, sizeof lmap);
    cJSON_AddStringToObject(j, "layers", lmap);
    cJSON *stages = cJSON_AddArrayToObject(j, "stages");
    for (int k = 0; k < r->size; k++)
        cJSON_AddItemToArray(stages, stats_stage(rep, r, k, &all[k], bud));
    if (rep->n_enc) {
        cJSON *enc = cJSON_AddArrayToObject(j, "encoders");
        for (int k = 0; k < rep->n_enc; k++) {
            cJSON *e = cJSON_CreateObject(), *pl = cJSON_Parse(rep->enc + (size_t)(2 * k + 1) * REPORT_LINE);
            cJSON_AddNumberToObject(e, "encoder", k);
            cJSON_AddNumberToObject(e, "rank", (double)(r->o->enc_first + k));
            if (pl)
                cJSON_AddItemToObject(e, "placement", pl);
            cJSON_AddItemToArray(enc, e);
        }
    }
    stats_publish(j, o->stats_path);
    cJSON_Delete(j);
}

pd_status report_end(report *rep, rank *r, head *h, int exit_status, pd_err *err)
{
    uint8_t mine[MSG_STATS_BYTES];
    msg_stats me = rank_stats(r);
    msg_encode_stats(&me, mine);
    uint8_t *all = r->rank == 0 ? calloc((size_t)r->size, MSG_STATS_BYTES) : NULL;
    msg_stats *each = r->rank == 0 ? calloc((size_t)r->size, sizeof *each) : NULL;
    pd_status st = (r->rank == 0 && (!all || !each)) ? pd_err_set(err, PD_ERR_NOMEM, "out of memory") : PD_OK;
    /* the gather is collective: every rank reaches it */
    pd_status gs = pipe_gather(r->p, mine, sizeof mine, all, err);
    if (st == PD_OK)
        st = gs;
    for (int k = 0; st == PD_OK && r->rank == 0 && k < r->size; k++)
        st = msg_decode_stats(all + (size_t)k * MSG_STATS_BYTES, MSG_STATS_BYTES, &each[k], err);
    if (st == PD_OK && r->rank == 0) {
        sched_progress pr;
        head_progress(h, &pr);
        double wall = me.wall_s;
        double tps = wall > 0 ? (double)pr.tokens_generated / wall : 0.0;
        char failed[96] = "";
        if (pr.pages_past_context)
            fprintf(stderr, "pipedec: warning: %llu pages ran past the model's context of %u positions "
                    "(--past-context); their tokens there are extrapolation\n",
                    (unsigned long long)pr.pages_past_context, r->hp.ctx);
        if (pr.pages_failed)
            snprintf(failed, sizeof failed, "; %llu FAILED, see their \"error\" lines, a rerun retries them",
                     (unsigned long long)pr.pages_failed);
        if (r->o->stats_path)
            report_stats_json(rep, r, &pr, wall, each, head_budget(h), exit_status);
        printf("pipedec: %llu pages decoded (%llu skipped as already done%s), %llu tokens in %.2f s = %.1f tokens/s "
               "over %d rank%s; output %s\n",
               (unsigned long long)(pr.pages_done - pr.pages_failed), (unsigned long long)pr.pages_skipped, failed,
               (unsigned long long)pr.tokens_generated, wall, tps, r->size, r->size == 1 ? "" : "s", r->o->out_path);
        fflush(stdout);
    }
    free(all);
    free(each);
    /* the closing handshake: every rank waits here until rank 0's record is
     * written (rank 0 sends its status, so a failure there is heard) */
    int32_t failed = st == PD_OK ? 0 : 1;
    pd_err be = {0};
    if (pipe_bcast(r->p, &failed, sizeof failed, &be) != PD_OK) {
        if (st == PD_OK)
            st = pd_err_set(err, PD_ERR_MPI, "%s", be.msg);
    } else if (failed && st == PD_OK) {
        st = pd_err_set(err, PD_ERR_MPI, "rank 0 could not finish the run's report");
    }
    return st;
}
