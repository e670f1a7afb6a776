/* Reference decode through llama.cpp (libllama from the prefix
 * scripts/llama_cpp.sh builds; compiled by tests/anchor/anchor.sh only when
 * that prefix exists, never part of the pipedec build). Feeds a token
 * prompt, decodes greedily on the CPU and prints, per generated token, its id,
 * the margin between the best and second-best logit, and the second-best id:
 *
 *   llama_greedy MODEL N_NEW THREADS TOKEN...   ->  lines "id margin second"
 *
 * Generation stops after N_NEW tokens or after an end-of-generation token
 * (printed). */
#include "llama.h"

#include <stdio.h>
#include <stdlib.h>

static void quiet(enum ggml_log_level level, const char *text, void *ud)
{
    (void)ud;
    if (level == GGML_LOG_LEVEL_ERROR)
        fputs(text, stderr);
}

int main(int argc, char **argv)
{
    if (argc < 5) {
        fprintf(stderr, "usage: llama_greedy MODEL N_NEW THREADS TOKEN...\n");
        return 2;
    }
    const int n_new = atoi(argv[2]), threads = atoi(argv[3]), n_prompt = argc - 4;
    llama_token *prompt = malloc(sizeof *prompt * (size_t)n_prompt);
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (llama_token)atoi(argv[4 + i]);
    llama_log_set(quiet, NULL);
    llama_backend_init();
    struct llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    struct llama_model *model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "llama_greedy: cannot load %s\n", argv[1]);
        return 1;
    }
    struct llama_context_params cp = llama_context_default_params();
    cp.n_ctx = (uint32_t)(n_prompt + n_new + 16);
    cp.n_batch = cp.n_ctx;
    cp.n_ubatch = cp.n_ctx;
    cp.n_threads = threads;
    cp.n_threads_batch = threads;
    cp.no_perf = true;
    struct llama_context *ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        fprintf(stderr, "llama_greedy: cannot create a context\n");
        return 1;
    }
    const struct llama_vocab *vocab = llama_model_get_vocab(model);
    const int n_vocab = llama_vocab_n_tokens(vocab);
    struct llama_batch batch = llama_batch_get_one(prompt, n_prompt);
    llama_token tok;
    for (int i = 0; i < n_new; i++) {
        if (llama_decode(ctx, batch) != 0) {
            fprintf(stderr, "llama_greedy: decode failed at token %d\n", i);
            return 1;
        }
        const float *lg = llama_get_logits_ith(ctx, -1);
        int best = 0, second = -1;
        for (int v = 1; v < n_vocab; v++)
            if (lg[v] > lg[best]) {
                second = best;
                best = v;
            } else if (second < 0 || lg[v] > lg[second]) {
                second = v;
            }
        printf("%d %.9g %d\n", best, (double)(lg[best] - lg[second]), second);
        tok = best;
        if (llama_vocab_is_eog(vocab, tok))
            break;
        batch = llama_batch_get_one(&tok, 1);
    }
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    free(prompt);
    return 0;
}
