/* MoE decode benchmark (issue 16): the real stage + tail on a DeepSeek MoE of
 * the OCR decoder's shape (mkmodel --arch deepseek defaults: 12 layers,
 * hidden 1280, 10 x 128 heads, layer 0 dense ffn 6848, 64 experts top 6 of
 * ffn 896, 2 shared, vocab 129280) stored as Q8_0, on T threads.
 *   batch 1   tokens/s against the bandwidth roofline: read bandwidth (T
 *             threads, measured here) / bytes one token actually reads —
 *             attention, dense and shared-expert weights, the router, the
 *             experts the step used (counted by the model), the output
 *             projection, one embedding row and the KV rows attended;
 *   batch 32, 64  tokens/s and the distinct experts each micro-batch reads
 *             per MoE layer (of 64), with the same bandwidth roofline.
 * Prefill is run for real (chunked) but only decode steps are timed.
 * Prints one JSON object. PD_BENCH_GEMM=int8 loads the weights for the
 * int8 arithmetic (`--gemm int8`, gemm.h) instead of the exact one; the
 * JSON's "gemm" says which.
 * usage: bench_moe [MODEL.gguf] [prefill_b1] [steps_b1] [steps_bN] [threads] [batches]
 *        (batches: a comma list, default 1,32,64)
 *        (the model is generated at MODEL, default /tmp/pd_bench_ds_q8.gguf,
 *        3.5 GB, if absent) */
#include "probe.h"

#include "base/cpu.h"
#include "cluster/cli/mkmodel.h"
#include "cluster/model/gemm.h"
#include "cluster/model/model.h"
#include "cluster/model/pool.h"
#include "cluster/runtime/pipeline/stage.h"
#include "cluster/runtime/pipeline/tail.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *what, const pd_err *e)
{
    fprintf(stderr, "bench_moe: %s: %s\n", what, e->msg);
    exit(1);
}

typedef struct rate {
    double tokens_per_s;
    double experts_per_layer; /* distinct experts a decode step read per MoE layer */
    double ctx_rows;          /* mean KV rows a decode row attended */
} rate;

/* Decode tokens/s for `batch` streams after `prefill` rows each. */
static rate decode_rate(const model *m, pool *pl, uint32_t batch, uint32_t prefill, uint32_t steps)
{
    const model_hparams *hp = model_hp(m);
    pd_err e = {0};
    cache_policy pol;
    policy_default(&pol);
    const uint32_t chunk = 256, R = chunk + batch;
    stage *st;
    tail *tl;
    stage_config sc = {.m = m, .policy = pol, .max_rows = R, .max_streams = batch, .pool = pl};
    if (stage_new(&sc, &st, &e))
        die("stage", &e);
    tail_config tc = {.m = m, .sample = {.mode = SAMPLE_GREEDY}, .max_streams = batch, .max_rows = R, .pool = pl};
    if (tail_new(&tc, &tl, &e))
        die("tail", &e);
    size_t H = hp->hidden;
    float *x = malloc((size_t)R * H * sizeof(float));
    mb_row *rows = calloc(R, sizeof *rows);
    uint32_t *tok = calloc(R, sizeof *tok), *last = calloc(batch, sizeof *last);
    uint64_t *dig = calloc(R, sizeof *dig);
    for (uint32_t s = 0; s < batch; s++) {
        mb_admit a = {.stream = s, .prefill_rows = prefill, .max_new = steps + 2, .sample_key = s};
        if (stage_admit(st, &a, &e) || tail_admit(tl, &a, &e))
            die("admit", &e);
    }
    uint64_t seed = 1;
    for (uint32_t s = 0; s < batch; s++)
        for (uint32_t r0 = 0; r0 < prefill; r0 += chunk) {
            uint32_t n = prefill - r0 < chunk ? prefill - r0 : chunk;
            for (uint32_t j = 0; j < n; j++) {
                rows[j] = (mb_row){.stream = s, .pos = r0 + j, .role = MB_ROLE_PREFILL,
                                   .wants_logits = r0 + j + 1 == prefill};
                for (size_t d = 0; d < H; d++) {
                    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
                    x[j * H + d] = (float)((double)(seed >> 40) / 16777216.0 * 2.0 - 1.0);
                }
            }
            uint32_t nt;
            if (stage_forward(st, rows, n, x, &e) || tail_sample(tl, rows, n, x, tok, dig, &nt, &e))
                die("prefill", &e);
            if (nt)
                last[s] = tok[0];
        }
    uint64_t c0, a0, c1, a1;
    stage_moe_stats(st, &c0, &a0);
    double t1 = probe_now();
    for (uint32_t step = 0; step < steps; step++) {
        for (uint32_t s = 0; s < batch; s++) {
            rows[s] = (mb_row){.stream = s, .pos = prefill + step, .role = MB_ROLE_DECODE, .wants_logits = 1};
            model_embed(m, &last[s], 1, x + (size_t)s * H);
        }
        uint32_t nt;
        if (stage_forward(st, rows, batch, x, &e) || tail_sample(tl, rows, batch, x, tok, dig, &nt, &e))
            die("decode", &e);
        memcpy(last, tok, batch * sizeof *tok);
    }
    double dt = probe_now() - t1;
    stage_moe_stats(st, &c1, &a1);
    stage_free(st);
    tail_free(tl);
    free(x);
    free(rows);
    free(tok);
    free(dig);
    free(last);
    return (rate){.tokens_per_s = (double)batch * steps / dt,
                  .experts_per_layer = c1 > c0 ? (double)(a1 - a0) / (double)(c1 - c0) : 0.0,
                  .ctx_rows = prefill + (steps + 1) / 2.0};
}

/* Bytes one decode step reads: every weight but the experts no row used
 * (experts_per_layer of n_expert per MoE layer are read), plus per row its
 * embedding row (counted as Q8_0) and the KV rows it attends (f32 K and V). */
static double step_bytes(const model *m, const rate *r, uint32_t batch)
{
    const model_hparams *hp = model_hp(m);
    double b = (double)model_weight_bytes(m);
    for (uint32_t L = 0; L < hp->n_layers; L++) {
        const model_layer *ly = model_layer_get(m, L);
        if (ly->ffn != MODEL_FFN_MOE)
            continue;
        double eb = (double)(gemm_bytes(ly->egate[0]) + gemm_bytes(ly->eup[0]) + gemm_bytes(ly->edown[0]));
        b -= (hp->n_expert - r->experts_per_layer) * eb;
    }
    double kv_row = 2.0 * hp->n_kv_heads * hp->head_dim * sizeof(float) * hp->n_layers;
    double embd_row = (double)gemm_row_bytes(GEMM_W_Q8_0, hp->hidden);
    return b + batch * (r->ctx_rows * kv_row + embd_row);
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "/tmp/pd_bench_ds_q8.gguf";
    uint32_t prefill1 = argc > 2 ? (uint32_t)atoi(argv[2]) : 277;
    uint32_t steps1 = argc > 3 ? (uint32_t)atoi(argv[3]) : 16;
    uint32_t stepsn = argc > 4 ? (uint32_t)atoi(argv[4]) : 6;
    int threads = argc > 5 ? atoi(argv[5]) : 2;
    const uint32_t prefilln = 32;
    pd_err e = {0};
    if (access(path, R_OK) != 0) {
        mkmodel_opts o;
        mkmodel_defaults_deepseek(&o);
        o.dtype = MK_Q8_0;
        fprintf(stderr, "bench_moe: generating %s (DeepSeek-OCR's decoder shape, Q8_0, about 3.5 GB)\n", path);
        if (mkmodel_write(&o, path, &e))
            die("mkmodel", &e);
    }
    const char *be = getenv("PD_BENCH_GEMM");
    if (be && strcmp(be, "invariant") != 0 && strcmp(be, "int8") != 0) {
        fprintf(stderr, "bench_moe: PD_BENCH_GEMM must be invariant or int8, not '%s'\n", be);
        return 1;
    }
    const bool int8 = be && strcmp(be, "int8") == 0;
    model *m;
    model_load_opts lo = {.all_layers = 1, .want_embed = 1, .want_output = 1,
                          .backend = int8 ? GEMM_BACKEND_INT8 : GEMM_BACKEND_INVARIANT};
    if (model_load(path, &lo, &m, &e))
        die("model_load", &e);
    const model_hparams *hp = model_hp(m);
    if (hp->n_expert == 0) {
        fprintf(stderr, "bench_moe: %s has no experts\n", path);
        return 1;
    }
    pool *pl;
    if (pool_new((uint32_t)threads, &pl, &e))
        die("pool", &e);
    double bw = probe_read_bw(threads, 5);
    uint32_t batches[8], nbatch = 0;
    for (const char *p = argc > 6 ? argv[6] : "1,32,64"; *p && nbatch < 8;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || v == 0 || v > 256 || (*end && *end != ',')) {
            fprintf(stderr, "bench_moe: batches must be a comma list of 1 .. 256, not '%s'\n", argv[6]);
            return 1;
        }
        batches[nbatch++] = (uint32_t)v;
        p = *end ? end + 1 : end;
    }
    char runs[8 * 512] = "";
    for (uint32_t i = 0; i < nbatch; i++) {
        uint32_t B = batches[i];
        rate r = decode_rate(m, pl, B, B == 1 ? prefill1 : prefilln, B == 1 ? steps1 : stepsn);
        double bytes = step_bytes(m, &r, B), roof = bw / bytes * B;
        size_t at = strlen(runs);
        snprintf(runs + at, sizeof runs - at,
                 "%s{\"batch\":%u,\"prefill_rows\":%u,\"tokens_per_s\":%.2f,\"experts_per_moe_layer\":%.2f,"
                 "\"bytes_per_step\":%.0f,\"bandwidth_roofline_tokens_per_s\":%.2f,\"ratio\":%.3f%s}",
                 i ? "," : "", B, B == 1 ? prefill1 : prefilln, r.tokens_per_s, r.experts_per_layer, bytes, roof,
                 r.tokens_per_s / roof, B == 1 ? (r.tokens_per_s / roof >= 0.7 ? ",\"goal\":0.7,\"goal_met\":true"
                                                                             : ",\"goal\":0.7,\"goal_met\":false")
                                               : "");
    }
    printf("{\"bench\":\"moe\",\"isa\":\"%s\",\"gemm\":\"%s\",\"threads\":%d,\"model\":{\"layers\":%u,"
           "\"hidden\":%u,\"heads\":%u,\"dense_layers\":%u,\"experts\":%u,\"experts_used\":%u,\"expert_ffn\":%u,"
           "\"shared\":%u,\"vocab\":%u,\"weight_bytes\":%llu},\"read_bw_gbs\":%.2f,\"runs\":[%s]}\n",
           pd_isa_name(pd_cpu_isa()), int8 ? "int8" : "invariant", threads, hp->n_layers, hp->hidden, hp->n_heads,
           hp->n_dense_lead, hp->n_expert, hp->n_expert_used, hp->ffn_exp, hp->n_expert_shared, hp->vocab,
           (unsigned long long)model_weight_bytes(m), bw / 1e9, runs);
    pool_free(pl);
    model_free(m);
    return 0;
}
