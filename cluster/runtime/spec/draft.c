/* draft: --draft parsing and n-gram prompt lookup (contract in draft.h). */
#include "cluster/runtime/spec/draft.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Digits at *p into *v (at most 4 of them); advances *p. */
static int draft_uint(const char **p, unsigned *v)
{
    unsigned x = 0, d = 0;
    while (**p >= '0' && **p <= '9' && d < 4) {
        x = x * 10 + (unsigned)(**p - '0');
        (*p)++;
        d++;
    }
    *v = x;
    return d > 0;
}

pd_status draft_parse(const char *s, draft_config *out, pd_err *err)
{
    if (strcmp(s, "none") == 0) {
        *out = (draft_config){.mode = DRAFT_NONE};
        return PD_OK;
    }
    unsigned n = 3, k = 4;
    if (strncmp(s, "model:", 6) == 0) {
        /* one rule: a last ':' followed by nothing or by digits only starts
         * K, which must be 1..16 (an empty, zero, huge or out-of-range K
         * gets the same message); anything else belongs to the file name */
        const char *file = s + 6, *colon = strrchr(file, ':');
        const char *kp = colon ? colon + 1 : NULL;
        int has_k = kp && strspn(kp, "0123456789") == strlen(kp);
        size_t flen = has_k ? (size_t)(colon - file) : strlen(file);
        if (has_k) {
            const char *q = kp;
            k = 0;
            if (strlen(kp) > 2 || !draft_uint(&q, &k) || k < 1 || k > 16)
                return pd_err_set(err, PD_ERR_ARG, "--draft '%s': K must be an integer 1..16 (model:FILE[:K])", s);
        }
        if (flen == 0)
            return pd_err_set(err, PD_ERR_ARG, "--draft '%s': expected model:FILE[:K] (K 1..16)", s);
        if (flen >= sizeof out->path)
            return pd_err_set(err, PD_ERR_ARG, "--draft model: the file name is longer than %zu bytes",
                              sizeof out->path - 1);
        *out = (draft_config){.mode = DRAFT_MODEL, .k = k};
        memcpy(out->path, file, flen);
        out->path[flen] = '\0';
        return PD_OK;
    }
    const char *p = s;
    int ok = strncmp(p, "ngram", 5) == 0;
    p += ok ? 5 : 0;
    if (ok && *p == ':') {
        p++;
        ok = draft_uint(&p, &n);
        if (ok && *p == ':') {
            p++;
            ok = draft_uint(&p, &k);
        }
    }
    if (!ok || *p != '\0' || n < 1 || n > 64 || k < 1 || k > 16)
        return pd_err_set(err, PD_ERR_ARG, "--draft '%s': expected none, ngram[:N[:K]] (N 1..64, K 1..16) or model:FILE[:K]", s);
    *out = (draft_config){.mode = DRAFT_NGRAM, .n = n, .k = k};
    return PD_OK;
}

uint32_t draft_ngram(const uint32_t *hist, size_t n_hist, uint32_t n, uint32_t k, uint32_t *out)
{
    if (n == 0 || n_hist < (size_t)n + 1)
        return 0;
    const uint32_t *tail = hist + n_hist - n;
    /* the latest earlier occurrence: start at the one ending just before the tail */
    for (size_t at = n_hist - n; at-- > 0;) {
        if (memcmp(hist + at, tail, (size_t)n * sizeof *hist) != 0)
            continue;
        uint32_t got = 0;
        for (size_t j = at + n; j < n_hist && got < k; j++)
            out[got++] = hist[j];
        return got;
    }
    return 0;
}
