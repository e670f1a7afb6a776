/* trace: --trace-hidden lines of one rank (format in docs/digests.md). */
#include "cluster/runtime/pipeline/trace.h"

#include "cluster/model/sample.h"
#include "cluster/runtime/pipeline/digest.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* INV: streams[0..n) are distinct ids of streams admitted and not retired. */
struct trace {
    FILE *f;
    int rank;
    uint32_t hidden, cap, n;
    uint64_t *streams, *keys;
};

pd_status trace_open(const char *path, int rank, int size, uint32_t hidden, uint32_t max_streams,
                     const pages *pg, trace **out, pd_err *err)
{
    char name[4096];
    if (rank == 0)
        snprintf(name, sizeof name, "%s", path);
    else
        snprintf(name, sizeof name, "%s.%d", path, rank);
    trace *t = calloc(1, sizeof *t);
    if (!t)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory for the hidden-state trace");
    *t = (trace){.rank = rank, .hidden = hidden, .cap = max_streams};
    t->streams = calloc(max_streams ? max_streams : 1, sizeof *t->streams);
    t->keys = calloc(max_streams ? max_streams : 1, sizeof *t->keys);
    if (!t->streams || !t->keys) {
        trace_close(t);
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory for the hidden-state trace");
    }
    if (!(t->f = fopen(name, "w"))) {
        int e = errno;
        trace_close(t);
        return pd_err_set(err, PD_ERR_IO, "--trace-hidden: cannot create %s: %s", name, strerror(e));
    }
    fprintf(t->f, "# pipedec trace-hidden 1 rank %d of %d\n", rank, size);
    for (size_t i = 0; pg && i < pages_count(pg); i++) {
        const char *id = pages_get(pg, i)->id;
        fprintf(t->f, "p %016llx %s\n", (unsigned long long)sample_page_key(id), id);
    }
    *out = t;
    return PD_OK;
}

void trace_close(trace *t)
{
    if (!t)
        return;
    if (t->f && (ferror(t->f) | fclose(t->f)))
        fprintf(stderr, "pipedec: rank %d: --trace-hidden: writing the trace failed: %s\n", t->rank,
                strerror(errno));
    free(t->streams);
    free(t->keys);
    free(t);
}

void trace_lifecycle(trace *t, const mb_admit *admit, uint32_t na, const uint64_t *retire, uint32_t nr)
{
    for (uint32_t i = 0; i < nr; i++)
        for (uint32_t k = 0; k < t->n; k++)
            if (t->streams[k] == retire[i]) {
                t->streams[k] = t->streams[t->n - 1];
                t->keys[k] = t->keys[--t->n];
                break;
            }
    for (uint32_t i = 0; i < na && t->n < t->cap; i++) {
        t->streams[t->n] = admit[i].stream;
        t->keys[t->n++] = admit[i].sample_key;
    }
}

void trace_rows(void *ctx, uint32_t boundary, const mb_row *rows, uint32_t n, const float *x)
{
    trace *t = ctx;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t key = 0;
        for (uint32_t k = 0; k < t->n; k++)
            if (t->streams[k] == rows[i].stream)
                key = t->keys[k];
        fprintf(t->f, "t %016llx %llu %u %016llx\n", (unsigned long long)key, (unsigned long long)rows[i].pos,
                boundary, (unsigned long long)digest_f32(x + (size_t)i * t->hidden, t->hidden));
    }
}
