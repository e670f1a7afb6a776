/* pageimg: image pages encoded at the head (see pageimg.h). */
#include "cluster/runtime/loop/pageimg.h"

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/vision/venc.h"

typedef struct pageimg_entry {
    bool used;
    size_t page;
    uint32_t seg;
    uint64_t stamp; /* last use, for eviction */
    venc_out out;
} pageimg_entry;

struct pageimg {
    venc *v;
    uint32_t width;
    pageimg_entry *e;
    uint32_t n_e;
    uint64_t clock, encoded;
};

pd_status pageimg_open(const char *mmproj, const char *model_path, uint32_t threads,
                       uint32_t streams, pageimg **out, pd_err *err)
{
    pageimg *pi = calloc(1, sizeof *pi);
    if (!pi)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    pi->n_e = streams + 1;
    pi->e = calloc(pi->n_e, sizeof *pi->e);
    if (!pi->e) {
        free(pi);
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    }
    pd_status st = venc_open(&(venc_opts){.mmproj = mmproj, .model = model_path,
                                           .threads = (int)(threads ? threads : 1)},
                             &pi->v, err);
    if (st != PD_OK) {
        pageimg_free(pi);
        return st;
    }
    pi->width = venc_width(pi->v);
    *out = pi;
    return PD_OK;
}

void pageimg_free(pageimg *pi)
{
    if (!pi)
        return;
    for (uint32_t i = 0; i < pi->n_e; i++)
        venc_out_free(&pi->e[i].out);
    free(pi->e);
    venc_close(pi->v);
    free(pi);
}

uint64_t pageimg_encoded(const pageimg *pi)
{
    return pi ? pi->encoded : 0;
}

pd_status pageimg_count(void *ctx, const char *path, uint32_t *rows, pd_err *err)
{
    pageimg *pi = ctx;
    venc_out o;
    pd_status st = venc_image(pi->v, path, true, &o, err);
    if (st != PD_OK)
        return st;
    *rows = o.rows > UINT32_MAX ? UINT32_MAX : (uint32_t)o.rows;
    venc_out_free(&o);
    return PD_OK;
}

/* The cached encoding of (page, seg), encoding it on a miss into the least
 * recently used entry. */
static pd_status pageimg_get(pageimg *pi, size_t page, uint32_t seg, const char *path,
                             uint32_t seg_rows, pageimg_entry **out, pd_err *err)
{
    pageimg_entry *victim = &pi->e[0];
    for (uint32_t i = 0; i < pi->n_e; i++) {
        pageimg_entry *e = &pi->e[i];
        if (e->used && e->page == page && e->seg == seg) {
            e->stamp = ++pi->clock;
            *out = e;
            return PD_OK;
        }
        if (!e->used || (victim->used && e->stamp < victim->stamp))
            victim = e;
    }
    venc_out_free(&victim->out);
    victim->used = false;
    venc_out o;
    pd_status st = venc_image(pi->v, path, false, &o, err);
    if (st != PD_OK)
        return st;
    if (o.rows != seg_rows) {
        venc_out_free(&o);
        return pd_err_set(err, PD_ERR_MISMATCH, "%s: encoded to %" PRIu64 " rows, its header "
                          "promised %" PRIu32 " (the file changed since the manifest was loaded?)",
                          path, o.rows, seg_rows);
    }
    pi->encoded++;
    *victim = (pageimg_entry){.used = true, .page = page, .seg = seg, .stamp = ++pi->clock, .out = o};
    *out = victim;
    return PD_OK;
}

pd_status pageimg_read(void *ctx, size_t page, uint32_t seg, const char *path, uint32_t seg_rows,
                       const model *em, uint32_t off, uint32_t n, float *dst, pd_err *err)
{
    pageimg *pi = ctx;
    pageimg_entry *e = NULL;
    pd_status st = pageimg_get(pi, page, seg, path, seg_rows, &e, err);
    if (st != PD_OK)
        return st;
    uint32_t hidden = model_hp(em)->hidden;
    if (hidden != pi->width)
        return pd_err_set(err, PD_ERR_MISMATCH, "%s: image rows are %" PRIu32 " wide, this model's "
                          "hidden size is %" PRIu32, path, pi->width, hidden);
    uint64_t p0 = 0;
    uint32_t done = 0;
    for (size_t k = 0; k < e->out.n_pieces && done < n; k++) {
        const venc_piece *pc = &e->out.pieces[k];
        uint64_t at = (uint64_t)off + done;
        if (at < p0 + pc->n) {
            uint32_t o = (uint32_t)(at - p0), cnt = pc->n - o;
            if (cnt > n - done)
                cnt = n - done;
            float *d = dst + (size_t)done * hidden;
            if (pc->image) {
                memcpy(d, pc->rows + (size_t)o * hidden, (size_t)cnt * hidden * sizeof *d);
            } else {
                for (uint32_t i = 0; i < cnt; i++) {
                    uint32_t t = (uint32_t)pc->tokens[o + i];
                    model_embed(em, &t, 1, d + (size_t)i * hidden);
                }
            }
            done += cnt;
        }
        p0 += pc->n;
    }
    if (done != n)
        return pd_err_set(err, PD_ERR_RANGE, "%s: rows [%" PRIu32 ", %" PRIu64 ") past its %" PRIu64
                          " rows", path, off, (uint64_t)off + n, e->out.rows);
    /* the last row read: this image's prefill is done, its rows can go */
    if ((uint64_t)off + n == e->out.rows) {
        venc_out_free(&e->out);
        e->used = false;
    }
    return PD_OK;
}
