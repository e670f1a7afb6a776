/* mkpages: synthetic OCR-like page manifests with .npy embedding blocks. */
#include "cluster/cli/mkpages.h"

#include "base/file.h"
#include "cluster/format/npy.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static uint64_t mp_mix(uint64_t z)
{
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

pd_status mkpages_write(const mkpages_opts *o, const model_hparams *hp, const char *dir, pd_err *err)
{
    if (o->count == 0 || o->count > 1000000)
        return pd_err_set(err, PD_ERR_ARG, "mkpages: --count %u: expected 1..1000000", o->count);
    if (o->embed_rows > (1u << 20) || o->prompt_tokens > (1u << 20) || o->max_new > (1u << 20))
        return pd_err_set(err, PD_ERR_ARG, "mkpages: --embed-rows, --prompt-tokens and --max-new must be <= 1048576");
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return pd_err_set(err, PD_ERR_IO, "mkpages: cannot create %s: %s", dir, strerror(errno));
    /* ordinary tokens: past the specials and the 256 byte tokens */
    uint32_t lo = hp->vocab_kind == MODEL_VOCAB_LLAMA ? 259 : 258;
    if (hp->vocab <= lo + 1)
        return pd_err_set(err, PD_ERR_ARG, "mkpages: vocabulary of %u tokens is too small", hp->vocab);
    size_t plen = strlen(dir) + 64;
    char *path = malloc(plen);
    float *emb = malloc(((size_t)o->embed_rows ? o->embed_rows : 1) * hp->hidden * sizeof(float));
    if (!path || !emb) {
        free(path);
        free(emb);
        return pd_err_set(err, PD_ERR_NOMEM, "mkpages: out of memory");
    }
    /* The manifest is published atomically once every .npy it names exists. */
    snprintf(path, plen, "%s/pages.jsonl", dir);
    pd_publish *pub = NULL;
    pd_status st = pd_file_publish_begin(path, 0644, "mkpages", &pub, err);
    FILE *f = st == PD_OK ? pd_file_publish_stream(pub, err) : NULL;
    if (st == PD_OK && !f)
        st = PD_ERR_IO;
    for (uint32_t i = 0; st == PD_OK && i < o->count; i++) {
        uint64_t h = mp_mix(o->seed ^ mp_mix(i));
        uint32_t rows = o->embed_rows, max_new = o->max_new;
        if (o->mixed) {
            rows -= (uint32_t)(h % (rows / 2 + 1));
            max_new -= (uint32_t)((h >> 20) % (max_new / 2 + 1));
        }
        fprintf(f, "{\"id\":\"p%05u\",\"prefill\":[{\"tokens\":[%u]}", i, hp->bos);
        if (rows) {
            char npy[32];
            snprintf(npy, sizeof npy, "p%05u.npy", i);
            for (uint64_t e = 0; e < (uint64_t)rows * hp->hidden; e++) {
                uint64_t r = mp_mix(h ^ (e * 0xd1b54a32d192ed03ull));
                emb[e] = (float)(((double)(r >> 11) / 9007199254740992.0 * 2.0 - 1.0) * 1.7);
            }
            snprintf(path, plen, "%s/%s", dir, npy);
            st = npy_write_f32(path, rows, hp->hidden, emb, err);
            fprintf(f, ",{\"embeddings\":\"%s\"}", npy);
        }
        if (o->prompt_tokens) {
            fprintf(f, ",{\"tokens\":[");
            for (uint32_t t = 0; t < o->prompt_tokens; t++)
                fprintf(f, "%s%u", t ? "," : "", lo + (uint32_t)(mp_mix(h + t + 1) % (hp->vocab - lo)));
            fprintf(f, "]}");
        }
        fprintf(f, "],\"max_new_tokens\":%u}\n", max_new);
    }
    if (st == PD_OK)
        st = pd_file_publish_commit(pub, err);
    else
        pd_file_publish_abort(pub);
    free(path);
    free(emb);
    return st;
}
