/* The float64 judge of the anchor (tests/anchor/llama_tokens.sh): a
 * teacher-forced decode of a GGUF model in double precision on its exactly
 * dequantized weights (tests/unit/model_ref.h, the reference unit.model
 * checks the layer math against), so where pipedec and llama.cpp round
 * differently (llama.cpp's K-quant / Q8_0 dot products quantize activations)
 * it says which token the exact weights choose.
 *
 *   ref_logits MODEL N_PROMPT TOKEN...
 *
 * The first N_PROMPT tokens are the prompt, the rest a generated sequence
 * (pipedec's). For each generated token i, the logits after the prompt and
 * generated tokens 0..i-1 give one line:
 *
 *   best margin second gap
 *
 * best / second: the two largest logits' ids, margin their difference, gap
 * = logit[best] - logit[token i] (0 when the sequence took the best).
 * Architectures as pipedec's model (llama, qwen2, deepseek, deepseek2-ocr
 * with its rope-scaling score factor); a MoE router the reference does not
 * model is refused. Exit 0, 2 on bad usage or a file it cannot read. */
#include "cluster/format/gguf.h"
#include "cluster/model/model.h"

#include "model_ref.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: ref_logits MODEL N_PROMPT TOKEN...\n");
        return 2;
    }
    const char *path = argv[1];
    const int n_prompt = atoi(argv[2]), n_tok = argc - 3;
    if (n_prompt < 1 || n_prompt > n_tok) {
        fprintf(stderr, "ref_logits: N_PROMPT %d outside 1..%d\n", n_prompt, n_tok);
        return 2;
    }
    pd_err e = {0};
    model_hparams hp;
    gguf_file *f = NULL;
    if (model_read_hparams(path, &hp, &e) != PD_OK || gguf_open(path, &f, &e) != PD_OK) {
        fprintf(stderr, "ref_logits: %s: %s\n", path, e.msg);
        return 2;
    }
    int *tok = malloc((size_t)n_tok * sizeof *tok);
    for (int i = 0; i < n_tok; i++) {
        tok[i] = atoi(argv[3 + i]);
        if (tok[i] < 0 || (uint32_t)tok[i] >= hp.vocab) {
            fprintf(stderr, "ref_logits: token %d outside the vocabulary of %u\n", tok[i], hp.vocab);
            return 2;
        }
    }
    const uint32_t H = hp.hidden, hd = hp.head_dim, nh = hp.n_heads, nkv = hp.n_kv_heads, V = hp.vocab;
    const uint32_t qd = nh * hd, kvd = nkv * hd, group = nh / nkv, NL = hp.n_layers;
    const int neox = hp.rope == MODEL_ROPE_NEOX;
    const double kq = hp.arch == MODEL_ARCH_DEEPSEEK2_OCR
                          ? mref_kq_mul(hp.rope_scaling, hp.rope_scaling_factor, hp.rope_scaling_attn_factor)
                          : 1.0;
    double *kc = malloc((size_t)NL * n_tok * kvd * sizeof *kc), *vc = malloc((size_t)NL * n_tok * kvd * sizeof *vc);
    double *x = malloc(H * sizeof *x), *h = malloc(H * sizeof *h), *o = malloc(H * sizeof *o);
    double *q = malloc(qd * sizeof *q), *att = malloc(qd * sizeof *att), *sc = malloc((size_t)n_tok * sizeof *sc);
    double *lg = malloc(V * sizeof *lg);
    const float *embd = mref_tensor(f, "token_embd.weight");
    const float *outw = mref_tensor_opt(f, "output.weight", 1);
    if (!outw)
        outw = embd; /* tied */
    char n[96];
    for (int p = 0; p < n_tok; p++) {
        for (uint32_t i = 0; i < H; i++)
            x[i] = embd[(size_t)tok[p] * H + i];
        for (uint32_t L = 0; L < NL; L++) {
#define T(s) (snprintf(n, sizeof n, "blk.%u." s, L), mref_tensor(f, n))
#define TB(s) (hp.qkv_bias ? T(s) : NULL)
            double *k = kc + ((size_t)L * n_tok + p) * kvd, *v = vc + ((size_t)L * n_tok + p) * kvd;
            mref_norm(x, T("attn_norm.weight"), H, hp.rms_eps, h);
            mref_matvec(T("attn_q.weight"), TB("attn_q.bias"), h, H, qd, q);
            mref_matvec(T("attn_k.weight"), TB("attn_k.bias"), h, H, kvd, k);
            mref_matvec(T("attn_v.weight"), TB("attn_v.bias"), h, H, kvd, v);
            for (uint32_t j = 0; j < nh; j++)
                mref_rope(q + j * hd, hd, (uint64_t)p, hp.rope_base, neox);
            for (uint32_t j = 0; j < nkv; j++)
                mref_rope(k + j * hd, hd, (uint64_t)p, hp.rope_base, neox);
            for (uint32_t j = 0; j < nh; j++) {
                const uint32_t kvh = j / group;
                double mx = -1e300, sum = 0;
                for (int r = 0; r <= p; r++) {
                    const double *kr = kc + ((size_t)L * n_tok + r) * kvd + kvh * hd;
                    double d = 0;
                    for (uint32_t c = 0; c < hd; c++)
                        d += q[j * hd + c] * kr[c];
                    sc[r] = d * kq / sqrt((double)hd);
                    mx = sc[r] > mx ? sc[r] : mx;
                }
                for (int r = 0; r <= p; r++)
                    sum += (sc[r] = exp(sc[r] - mx));
                for (uint32_t c = 0; c < hd; c++) {
                    double a = 0;
                    for (int r = 0; r <= p; r++)
                        a += sc[r] / sum * vc[((size_t)L * n_tok + r) * kvd + kvh * hd + c];
                    att[j * hd + c] = a;
                }
            }
            mref_matvec(T("attn_output.weight"), NULL, att, qd, H, o);
            for (uint32_t i = 0; i < H; i++)
                x[i] += o[i];
            mref_norm(x, T("ffn_norm.weight"), H, hp.rms_eps, h);
            mref_ffn(f, &hp, L, h, o);
            for (uint32_t i = 0; i < H; i++)
                x[i] += o[i];
#undef T
#undef TB
        }
        if (p < n_prompt - 1 || p == n_tok - 1)
            continue;
        mref_norm(x, mref_tensor(f, "output_norm.weight"), H, hp.rms_eps, h);
        mref_matvec(outw, NULL, h, H, V, lg);
        uint32_t best = 0, second = 1;
        if (lg[1] > lg[0])
            best = 1, second = 0;
        for (uint32_t t = 2; t < V; t++)
            if (lg[t] > lg[best]) {
                second = best;
                best = t;
            } else if (lg[t] > lg[second]) {
                second = t;
            }
        printf("%u %.9g %u %.9g\n", best, lg[best] - lg[second], second, lg[best] - lg[tok[p + 1]]);
    }
    free(kc);
    free(vc);
    free(x);
    free(h);
    free(o);
    free(q);
    free(att);
    free(sc);
    free(lg);
    free(tok);
    mref_tensors_free();
    gguf_close(f);
    return 0;
}
