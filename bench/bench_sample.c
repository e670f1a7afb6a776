/* Sampling cost per token against the machine's limits.
 *
 * Temperature / top-p / top-k sampling at the vocabularies of a llama-style
 * model (32000) and the OCR decoder (129280), over logit vectors of three
 * shapes: "peaked" (a confident step, as OCR mostly is: a few tokens 20
 * above a Gaussian bulk of sd 2), "spread" (Gaussian, sd 3, no leader) and
 * "flat" (sd 0.3). In the last two nearly every token keeps enough mass to
 * change the float sums, so an exact sampler must order nearly the whole
 * vocabulary unless top_k bounds it: the worst cases of partial selection.
 * B_VECS vectors are cycled (4 x 517 KB at 129k: cache-resident, as the
 * logits just written by the output projection are).
 *
 * Prints one JSON object: the read bandwidth probe (1 thread), and per
 * (vocab, shape, setting) the best-of-trials ns per sampled token, its ratio
 * to one read pass over the logits at that bandwidth (the least any sampler
 * must spend), and to one decode step of the OCR-shaped f32 model at the
 * bandwidth limit (1.9 GB of weights read per step at batch 1: what a token
 * costs anyway). Timings are noisy on a shared machine; ratios use limits
 * measured in the same run. */
#include "probe.h"

#include "cluster/model/sample.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define B_VECS 4u
#define B_TRIALS 5
#define B_OCR_F32_BYTES 1.9e9 /* the OCR-shaped model's f32 weights (issue 17) */

static uint64_t b_rng = 0x243f6a8885a308d3ull;
static double b_uniform(void)
{
    b_rng ^= b_rng << 13;
    b_rng ^= b_rng >> 7;
    b_rng ^= b_rng << 17;
    return ((double)(b_rng >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static float b_gauss(double sd)
{
    return (float)(sd * sqrt(-2.0 * log(b_uniform())) * cos(6.283185307179586 * b_uniform()));
}

int main(void)
{
    static const uint32_t vocabs[] = {32000, 129280};
    static const struct { const char *name; double sd, lead; } shapes[] = {
        {"peaked", 2.0, 20.0}, {"spread", 3.0, 0.0}, {"flat", 0.3, 0.0}};
    static const char *settings[] = {"temp:1", "temp:0.8,top_p:0.9", "temp:0.7,top_k:50", "temp:1,top_p:0.95,top_k:1000"};
    double bw = probe_read_bw(1, 3);
    printf("{\n  \"bench\": \"sample\",\n  \"read_bw_gbs\": %.2f,\n  \"ocr_f32_step_at_bw_ns\": %.0f,\n  \"cases\": [\n",
           bw / 1e9, B_OCR_F32_BYTES / bw * 1e9);
    int first = 1;
    for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
        uint32_t V = vocabs[vi];
        float *l = malloc((size_t)B_VECS * V * sizeof *l);
        if (!l)
            return 1;
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
            for (size_t i = 0; i < (size_t)B_VECS * V; i++)
                l[i] = b_gauss(shapes[si].sd) + (i % 4099 == 7 ? (float)shapes[si].lead : 0.0f);
            for (size_t ci = 0; ci < sizeof settings / sizeof *settings; ci++) {
                sample_params p;
                pd_err err = {0};
                sampler *s = NULL;
                if (sample_parse(settings[ci], &p, &err) || sampler_new(V, &p, NULL, 7, &s, &err)) {
                    fprintf(stderr, "bench_sample: %s\n", err.msg);
                    return 1;
                }
                double best = 1e30;
                uint64_t check = 0;
                for (int t = 0; t < B_TRIALS; t++) {
                    double t0 = probe_now();
                    for (uint32_t j = 0; j < B_VECS; j++) {
                        int32_t tok;
                        if (sampler_next(s, l + (size_t)j * V, NULL, 0, "page", j, &tok, &err)) {
                            fprintf(stderr, "bench_sample: %s\n", err.msg);
                            return 1;
                        }
                        check = check * 31 + (uint64_t)tok;
                    }
                    double dt = (probe_now() - t0) / B_VECS;
                    best = dt < best ? dt : best;
                }
                sampler_free(s);
                double pass = (double)V * sizeof(float) / bw;
                printf("%s    {\"vocab\": %u, \"logits\": \"%s\", \"sampling\": \"%s\", \"ns_per_token\": %.0f, "
                       "\"x_logits_read_pass\": %.1f, \"fraction_of_ocr_f32_step\": %.4f, \"tokens_hash\": \"%016llx\"}",
                       first ? "" : ",\n", V, shapes[si].name, settings[ci], best * 1e9, best / pass,
                       best / (B_OCR_F32_BYTES / bw), (unsigned long long)check);
                first = 0;
            }
        }
        free(l);
    }
    printf("\n  ]\n}\n");
    return 0;
}
