/* Decode benchmark (issue 4): tokens/s of the real stage + tail on a model of
 * the OCR decoder's attention shape (hidden 1280, 12 layers, 10 heads x 128,
 * MLP 6848, vocab 32000, f32) with pages of 277 prefill rows, one thread.
 *   batch 1  against the bandwidth roofline: read bandwidth / weight bytes
 *            read per token (layers + output projection), both measured here;
 *   batch 64 against the compute roofline: GEMM peak / (2 x params per
 *            token), the peak being the best of the project's kernel and
 *            OpenBLAS at M = 256 on this model's widest matrix shape.
 * Prefill is run for real (chunked) but only decode steps are timed.
 * Prints one JSON object.
 * usage: bench_decode [MODEL.gguf] [prefill_rows] [steps_b1] [steps_b64]
 *        (the model is generated at MODEL, default /tmp/pd_bench_ocr.gguf, if absent) */
#include "probe.h"

#include "base/cpu.h"
#include "cluster/model/gemm.h"
#include "cluster/cli/mkmodel.h"
#include "cluster/model/model.h"
#include "cluster/runtime/pipeline/stage.h"
#include "cluster/runtime/pipeline/tail.h"

#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void die(const char *what, const pd_err *e)
{
    fprintf(stderr, "bench_decode: %s: %s\n", what, e->msg);
    exit(1);
}

/* Decode tokens/s for `batch` streams after `prefill` rows each. */
static double decode_rate(const model *m, uint32_t batch, uint32_t prefill, uint32_t steps, double *prefill_s)
{
    const model_hparams *hp = model_hp(m);
    pd_err e = {0};
    cache_policy pol;
    policy_default(&pol);
    uint32_t chunk = 512;
    stage *st;
    tail *tl;
    stage_config sc = {.m = m, .policy = pol, .max_rows = chunk + batch, .max_streams = batch};
    if (stage_new(&sc, &st, &e))
        die("stage", &e);
    tail_config tc = {.m = m, .sample = {.mode = SAMPLE_GREEDY}, .max_streams = batch, .max_rows = chunk + batch};
    if (tail_new(&tc, &tl, &e))
        die("tail", &e);
    size_t H = hp->hidden;
    float *x = malloc((size_t)(chunk + batch) * H * sizeof(float));
    mb_row *rows = calloc(chunk + batch, sizeof *rows);
    uint32_t *tok = calloc(chunk + batch, sizeof *tok);
    uint64_t *dig = calloc(chunk + batch, sizeof *dig); /* the logits digests the runtime chains */
    uint32_t *last = calloc(batch, sizeof *last);
    for (uint32_t s = 0; s < batch; s++) {
        mb_admit a = {.stream = s, .prefill_rows = prefill, .max_new = steps + 2, .sample_key = s};
        if (stage_admit(st, &a, &e) || tail_admit(tl, &a, &e))
            die("admit", &e);
    }
    double t0 = probe_now();
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
    *prefill_s = probe_now() - t0;
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
    stage_free(st);
    tail_free(tl);
    free(x);
    free(rows);
    free(tok);
    free(dig);
    free(last);
    return (double)batch * steps / dt;
}

/* Best GFLOP/s of the invariant kernel and OpenBLAS at M = 256 on [n x k]. */
static double gemm_peak(uint32_t n, uint32_t k, double *inv_out, double *blas_out)
{
    const uint32_t M = 256;
    float *w = malloc((size_t)n * k * sizeof(float)), *a = malloc((size_t)M * k * sizeof(float)),
          *c = malloc((size_t)M * n * sizeof(float));
    for (size_t i = 0; i < (size_t)n * k; i++)
        w[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    for (size_t i = 0; i < (size_t)M * k; i++)
        a[i] = (float)((i * 40503u) % 1000) * 1e-3f - 0.5f;
    pd_err e = {0};
    gemm_w *g;
    if (gemm_pack(w, GEMM_W_F32, n, k, GEMM_BACKEND_INVARIANT, NULL, &g, &e))
        die("gemm_pack", &e);
    openblas_set_num_threads(1);
    double best_inv = 0, best_blas = 0, flop = 2.0 * M * n * k;
    for (int r = 0; r < 5; r++) {
        double t0 = probe_now();
        gemm_run(g, a, M, c, NULL);
        double t1 = probe_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)M, (int)n, (int)k, 1.0f, a, (int)k, w, (int)k,
                    0.0f, c, (int)n);
        double t2 = probe_now();
        if (flop / (t1 - t0) > best_inv)
            best_inv = flop / (t1 - t0);
        if (flop / (t2 - t1) > best_blas)
            best_blas = flop / (t2 - t1);
    }
    gemm_free(g);
    free(w);
    free(a);
    free(c);
    *inv_out = best_inv / 1e9;
    *blas_out = best_blas / 1e9;
    return (best_inv > best_blas ? best_inv : best_blas) / 1e9;
}

int main(int argc, char **argv)
{
    const char *path = argc > 1 ? argv[1] : "/tmp/pd_bench_ocr.gguf";
    uint32_t prefill = argc > 2 ? (uint32_t)atoi(argv[2]) : 277;
    uint32_t steps1 = argc > 3 ? (uint32_t)atoi(argv[3]) : 24;
    uint32_t steps64 = argc > 4 ? (uint32_t)atoi(argv[4]) : 10;
    pd_err e = {0};
    if (access(path, R_OK) != 0) {
        mkmodel_opts o;
        mkmodel_defaults(&o);
        o.layers = 12;
        o.hidden = 1280;
        o.heads = 10;
        o.kv_heads = 10;
        o.ffn = 6848;
        o.vocab = 32000;
        o.ctx = 8192;
        fprintf(stderr, "bench_decode: generating %s (1.9 GB)\n", path);
        if (mkmodel_write(&o, path, &e))
            die("mkmodel", &e);
    }
    model *m;
    model_load_opts lo = {.all_layers = 1, .want_embed = 1, .want_output = 1, .backend = GEMM_BACKEND_INVARIANT};
    if (model_load(path, &lo, &m, &e))
        die("model_load", &e);
    const model_hparams *hp = model_hp(m);
    double bw = probe_read_bw(1, 5);
    double inv, blas;
    double peak = gemm_peak(hp->ffn, hp->hidden, &inv, &blas);
    uint64_t wbytes = model_weight_bytes(m);
    double params = (double)wbytes / 4.0; /* f32 weights */
    double pre1, pre64;
    double r1 = decode_rate(m, 1, prefill, steps1, &pre1);
    double r64 = decode_rate(m, 64, prefill, steps64, &pre64);
    double roof1 = bw / (double)wbytes;
    double roof64 = peak * 1e9 / (2.0 * params);
    printf("{\"bench\":\"decode\",\"isa\":\"%s\",\"threads\":1,\"model\":{\"layers\":%u,\"hidden\":%u,\"heads\":%u,"
           "\"kv_heads\":%u,\"head_dim\":%u,\"ffn\":%u,\"vocab\":%u,\"dtype\":\"f32\"},\"prefill_rows\":%u,"
           "\"weight_bytes_per_token\":%llu,\"read_bw_gbs\":%.2f,\"gemm_peak_gflops\":%.1f,"
           "\"gemm_peak_invariant_gflops\":%.1f,\"gemm_peak_openblas_gflops\":%.1f,"
           "\"batch1\":{\"tokens_per_s\":%.2f,\"roofline_tokens_per_s\":%.2f,\"ratio\":%.3f,\"goal\":0.7,"
           "\"goal_met\":%s,\"prefill_s\":%.2f},"
           "\"batch64\":{\"tokens_per_s\":%.2f,\"roofline_tokens_per_s\":%.2f,\"ratio\":%.3f,\"goal\":0.6,"
           "\"goal_met\":%s,\"prefill_s\":%.2f}}\n",
           pd_isa_name(pd_cpu_isa()), hp->n_layers, hp->hidden, hp->n_heads, hp->n_kv_heads, hp->head_dim,
           hp->ffn, hp->vocab, prefill, (unsigned long long)wbytes, bw / 1e9, peak, inv, blas, r1, roof1,
           r1 / roof1, r1 / roof1 >= 0.7 ? "true" : "false", pre1, r64, roof64, r64 / roof64,
           r64 / roof64 >= 0.6 ? "true" : "false", pre64);
    model_free(m);
    return 0;
}
