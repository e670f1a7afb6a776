/* pageimg: image pages encoded at the head or on encoder ranks (see pageimg.h). */
#include "cluster/runtime/loop/pageimg.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/check.h"
#include "base/clock.h"
#include "cluster/format/image.h"
#include "cluster/vision/venc.h"

/* Requests an encoder rank holds at once: one it works on and two waiting,
 * so it never idles between two, even when the head takes a reply late (it
 * takes them once per loop turn, or when it needs the rows) and the encoder
 * sits in its send meanwhile. Each is one image's rows on the head at most:
 * the queue, and so memory, stays bounded. */
#define PAGEIMG_DEPTH 3u

/* The longest nap between two probes (pageimg_probe_napping): an idle
 * encoder rank waiting for a request, against a head that needs the rows to
 * go on (nothing else to decode), which should not sleep past their arrival. */
#define PAGEIMG_NAP_IDLE_US 2000L
#define PAGEIMG_NAP_HEAD_US 200L

typedef enum pe_state { PE_FREE, PE_WAIT, PE_READY } pe_state;

typedef struct pageimg_entry {
    pe_state state;
    bool started;   /* the scheduler read rows of it */
    bool failed;    /* READY with an error instead of rows */
    size_t page;
    uint32_t seg;
    uint64_t stamp; /* last use, for eviction */
    uint64_t id;    /* encoder ranks: the request */
    int enc;        /* encoder ranks: index of the encoder that has it */
    pd_err why;     /* failed: the encoder's message */
    venc_out out;
} pageimg_entry;

typedef struct pageimg_job {
    size_t page;
    uint32_t seg;
    const char *path; /* borrowed from the pages */
    bool taken;       /* requested, or read directly: never requested again */
} pageimg_job;

struct pageimg {
    venc *v;
    uint32_t width, streams;
    pageimg_entry *e;
    uint32_t n_e;
    uint64_t clock, encoded, next_id;
    double wait_s;  /* the head waiting for an image's rows (pageimg_wait_s) */
    uint64_t waits;
    double head_s;  /* images the head encoded itself, with or without encoder ranks (pageimg_encoded_head) */
    uint64_t head_n;
    /* rows by image size (pageimg_count): open addressing, keys (width << 32 | height) + 1
     * (0 = empty), INV: n_sizes <= cap_sizes / 2, cap_sizes 0 or a power of two */
    uint64_t *size_key;
    uint32_t *size_rows;
    size_t n_sizes, cap_sizes;
    pageimg_encoders enc;
    uint32_t *busy; /* [enc.n] requests outstanding */
    uint32_t rr;    /* round robin over encoders */
    pageimg_job *plan;
    size_t n_plan, next_plan;
    size_t read_page; /* the highest page read so far */
};

pd_status pageimg_open(const char *mmproj, const char *model_path, uint32_t threads,
                       const pageimg_encoders *enc, pageimg **out, pd_err *err)
{
    pageimg *pi = calloc(1, sizeof *pi);
    if (!pi)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    if (enc)
        pi->enc = *enc;
    pi->busy = calloc(pi->enc.n > 0 ? (size_t)pi->enc.n : 1, sizeof *pi->busy);
    if (!pi->busy) {
        pageimg_free(pi);
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    }
    /* with encoder ranks the head's encoder counts rows and encodes the
     * first image (pageimg_plan): its first encode warms it up */
    pd_status st = venc_open(&(venc_opts){.mmproj = mmproj, .model = model_path,
                                           .threads = (int)(threads ? threads : 1), .warmup = pi->enc.n == 0},
                             &pi->v, err);
    if (st != PD_OK) {
        pageimg_free(pi);
        return st;
    }
    pi->width = venc_width(pi->v);
    *out = pi;
    return PD_OK;
}

pd_status pageimg_reserve(pageimg *pi, uint32_t streams, pd_err *err)
{
    CHECK(!pi->e && "pageimg_reserve twice");
    pi->streams = streams;
    pi->n_e = streams + 1 + (uint32_t)pi->enc.n * PAGEIMG_DEPTH;
    pi->e = calloc(pi->n_e, sizeof *pi->e);
    if (!pi->e) {
        pi->n_e = 0;
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    }
    return PD_OK;
}

void pageimg_free(pageimg *pi)
{
    if (!pi)
        return;
    for (uint32_t i = 0; pi->e && i < pi->n_e; i++)
        venc_out_free(&pi->e[i].out);
    free(pi->e);
    free(pi->busy);
    free(pi->plan);
    free(pi->size_key);
    free(pi->size_rows);
    venc_close(pi->v);
    free(pi);
}

uint64_t pageimg_encoded(const pageimg *pi)
{
    return pi ? pi->encoded : 0;
}

double pageimg_wait_s(const pageimg *pi, uint64_t *waits)
{
    if (waits)
        *waits = pi ? pi->waits : 0;
    return pi ? pi->wait_s : 0.0;
}

double pageimg_encoded_head(const pageimg *pi, uint64_t *n)
{
    if (n)
        *n = pi ? pi->head_n : 0;
    return pi ? pi->head_s : 0.0;
}

uint64_t pageimg_counted(const pageimg *pi)
{
    return pi ? pi->n_sizes : 0;
}

/* The slot of key in the size table (its own, or the empty one it would take). */
static size_t pageimg_size_slot(const pageimg *pi, uint64_t key)
{
    size_t mask = pi->cap_sizes - 1, i = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & mask;
    while (pi->size_key[i] && pi->size_key[i] != key)
        i = (i + 1) & mask;
    return i;
}

static pd_status pageimg_size_put(pageimg *pi, uint64_t key, uint32_t rows, pd_err *err)
{
    if (2 * (pi->n_sizes + 1) > pi->cap_sizes) {
        size_t cap = pi->cap_sizes ? 2 * pi->cap_sizes : 64;
        uint64_t *ok = pi->size_key;
        uint32_t *orows = pi->size_rows;
        size_t ocap = pi->cap_sizes;
        pi->size_key = calloc(cap, sizeof *pi->size_key);
        pi->size_rows = calloc(cap, sizeof *pi->size_rows);
        if (!pi->size_key || !pi->size_rows) {
            free(pi->size_key);
            free(pi->size_rows);
            pi->size_key = ok;
            pi->size_rows = orows;
            return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
        }
        pi->cap_sizes = cap;
        for (size_t i = 0; i < ocap; i++)
            if (ok[i]) {
                size_t j = pageimg_size_slot(pi, ok[i]);
                pi->size_key[j] = ok[i];
                pi->size_rows[j] = orows[i];
            }
        free(ok);
        free(orows);
    }
    size_t j = pageimg_size_slot(pi, key);
    pi->size_key[j] = key;
    pi->size_rows[j] = rows;
    pi->n_sizes++;
    return PD_OK;
}

/* The rows an image becomes depend on its size alone (venc_image counts
 * them from a placeholder of the header's width and height), and mtmd's
 * preprocessing of that placeholder costs about what preprocessing the page
 * does: so each size is counted once per run, whatever the number of pages
 * of that size and however often the manifest is loaded (the work-mix
 * agreement, then head_open: before, every image was counted at both). */
pd_status pageimg_count(void *ctx, const char *path, uint32_t *rows, pd_err *err)
{
    pageimg *pi = ctx;
    image_info info;
    pd_status st = image_probe(path, &info, err);
    if (st != PD_OK)
        return st;
    uint64_t key = ((uint64_t)info.width << 32 | info.height) + 1;
    if (pi->cap_sizes) {
        size_t j = pageimg_size_slot(pi, key);
        if (pi->size_key[j]) {
            *rows = pi->size_rows[j];
            return PD_OK;
        }
    }
    venc_out o;
    if ((st = venc_image(pi->v, path, true, &o, err)) != PD_OK)
        return st;
    *rows = o.rows > UINT32_MAX ? UINT32_MAX : (uint32_t)o.rows;
    venc_out_free(&o);
    return pageimg_size_put(pi, key, *rows, err);
}

pd_status pageimg_plan(pageimg *pi, const pages *pg, const bool *skip, pd_err *err)
{
    size_t n = 0;
    for (size_t p = 0; p < pages_count(pg); p++)
        for (uint32_t k = 0; k < pages_get(pg, p)->n_segs; k++)
            n += !(skip && skip[p]) && pages_get(pg, p)->segs[k].kind == PAGES_SEG_IMAGE &&
                 !pages_get(pg, p)->segs[k].error;
    free(pi->plan);
    pi->n_plan = 0; /* planned again after a checkpoint's restore (head_restored) */
    pi->plan = calloc(n ? n : 1, sizeof *pi->plan);
    if (!pi->plan)
        return pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    for (size_t p = 0; p < pages_count(pg); p++) {
        const pages_page *pp = pages_get(pg, p);
        for (uint32_t k = 0; k < pp->n_segs; k++)
            if (!(skip && skip[p]) && pp->segs[k].kind == PAGES_SEG_IMAGE && !pp->segs[k].error)
                pi->plan[pi->n_plan++] = (pageimg_job){.page = p, .seg = k, .path = pp->segs[k].path};
    }
    /* the first page the scheduler admits waits for its image with
     * nothing else to decode: with encoder ranks the head encodes that one
     * itself (pageimg_get) while the encoders warm up and take the next
     * ones, instead of waiting for an encoder's warm-up and first encode */
    size_t first = 0;
    while (skip && first < pages_count(pg) && skip[first])
        first++;
    pi->next_plan = pi->enc.n > 0 && pi->n_plan > 0 && pi->plan[0].page == first ? 1 : 0;
    return PD_OK;
}

/* The plan's first job of `page` (the plan is in (page, seg) order), or n_plan. */
static size_t pageimg_plan_at(const pageimg *pi, size_t page)
{
    size_t lo = 0, hi = pi->n_plan;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (pi->plan[mid].page < page)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void pageimg_take_job(pageimg *pi, size_t page, uint32_t seg)
{
    for (size_t j = pageimg_plan_at(pi, page); j < pi->n_plan && pi->plan[j].page == page; j++)
        if (pi->plan[j].seg == seg)
            pi->plan[j].taken = true;
}

static pageimg_entry *pageimg_find(pageimg *pi, size_t page, uint32_t seg)
{
    for (uint32_t i = 0; i < pi->n_e; i++)
        if (pi->e[i].state != PE_FREE && pi->e[i].page == page && pi->e[i].seg == seg)
            return &pi->e[i];
    return NULL;
}

static void pageimg_release(pageimg_entry *e)
{
    venc_out_free(&e->out);
    *e = (pageimg_entry){.state = PE_FREE};
}

/* A free entry; without encoder ranks the least recently used ready one is
 * evicted when none is free (an image read again is encoded again: the same
 * rows). NULL only when every entry waits on an encoder (cannot happen: the
 * queue ahead is bounded below the cache size). */
static pageimg_entry *pageimg_slot(pageimg *pi)
{
    pageimg_entry *victim = NULL;
    for (uint32_t i = 0; i < pi->n_e; i++) {
        pageimg_entry *e = &pi->e[i];
        if (e->state == PE_FREE)
            return e;
        if (e->state == PE_READY && (!victim || e->stamp < victim->stamp))
            victim = e;
    }
    if (victim)
        pageimg_release(victim);
    return victim;
}

/* ---- encoder ranks ------------------------------------------------------- */

static pd_status pageimg_mpi(int rc, const char *what, pd_err *err)
{
    if (rc == MPI_SUCCESS)
        return PD_OK;
    char s[MPI_MAX_ERROR_STRING];
    int n = 0;
    MPI_Error_string(rc, s, &n);
    return pd_err_set(err, PD_ERR_MPI, "encoder ranks: %s: %.*s", what, n, s);
}

static pd_status pageimg_request(pageimg *pi, pageimg_entry *e, size_t page, uint32_t seg, const char *path,
                                 pd_err *err)
{
    uint32_t best = pi->rr % (uint32_t)pi->enc.n;
    for (uint32_t j = 0; j < (uint32_t)pi->enc.n; j++) {
        uint32_t c = (pi->rr + j) % (uint32_t)pi->enc.n;
        if (pi->busy[c] < pi->busy[best])
            best = c;
    }
    pi->rr = best + 1;
    uint8_t *buf = NULL;
    size_t len = 0;
    uint64_t id = pi->next_id++;
    pd_status st = venc_msg_request(VENC_MSG_ENCODE, id, path, &buf, &len, err);
    if (st != PD_OK)
        return st;
    st = pageimg_mpi(MPI_Send(buf, (int)len, MPI_BYTE, pi->enc.first + (int)best, PAGEIMG_TAG_REQUEST,
                              pi->enc.world), "send a request", err);
    free(buf);
    if (st != PD_OK)
        return st;
    pi->busy[best]++;
    *e = (pageimg_entry){.state = PE_WAIT, .page = page, .seg = seg, .id = id, .enc = (int)best,
                         .stamp = ++pi->clock};
    return PD_OK;
}

/* MPI_Probe without its busy poll: Open MPI's blocking probe spins a core
 * at 100 %, and an idle encoder rank (or a head waiting for an image) would
 * take that core's cycles from the ranks that compute beside it on the node
 * (on SMT siblings, half of them). Tests, then naps from 50 us doubling to
 * max_us: an idle encoder takes a request at most 2 ms late (against encodes
 * of tenths of a second), a head waiting for rows takes them at most 200 us
 * late (it has nothing else to do: every late microsecond is lost). */
static int pageimg_probe_napping(int src, int tag, MPI_Comm comm, long max_us, MPI_Status *ms)
{
    long nap_us = 0;
    for (;;) {
        int flag = 0;
        int rc = MPI_Iprobe(src, tag, comm, &flag, ms);
        if (rc != MPI_SUCCESS || flag)
            return rc;
        nap_us = nap_us ? (2 * nap_us < max_us ? 2 * nap_us : max_us) : 50;
        struct timespec ts = {.tv_sec = 0, .tv_nsec = nap_us * 1000L};
        nanosleep(&ts, NULL);
    }
}

/* Receives one reply (waiting for it when `wait`); *got says whether one came. */
static pd_status pageimg_take(pageimg *pi, bool wait, bool *got, pd_err *err)
{
    *got = false;
    MPI_Status ms;
    int flag = 1;
    pd_status st;
    if (wait) {
        double t0 = pd_now_s();
        st = pageimg_mpi(pageimg_probe_napping(MPI_ANY_SOURCE, PAGEIMG_TAG_REPLY, pi->enc.world,
                                               PAGEIMG_NAP_HEAD_US, &ms), "probe", err);
        pi->wait_s += pd_now_s() - t0;
        pi->waits++;
    } else
        st = pageimg_mpi(MPI_Iprobe(MPI_ANY_SOURCE, PAGEIMG_TAG_REPLY, pi->enc.world, &flag, &ms), "probe", err);
    if (st != PD_OK || !flag)
        return st;
    int n = 0;
    MPI_Get_count(&ms, MPI_BYTE, &n);
    uint8_t *buf = malloc(n > 0 ? (size_t)n : 1);
    if (!buf)
        return pd_err_set(err, PD_ERR_NOMEM, "encoder ranks: no memory for a reply of %d bytes", n);
    st = pageimg_mpi(MPI_Recv(buf, n, MPI_BYTE, ms.MPI_SOURCE, PAGEIMG_TAG_REPLY, pi->enc.world,
                              MPI_STATUS_IGNORE), "receive a reply", err);
    int c = ms.MPI_SOURCE - pi->enc.first;
    if (st == PD_OK && (c < 0 || c >= pi->enc.n))
        st = pd_err_set(err, PD_ERR_MPI, "encoder ranks: a reply from rank %d, not an encoder", ms.MPI_SOURCE);
    uint64_t id = 0;
    venc_out o = {0};
    pd_err why = {0};
    if (st == PD_OK)
        st = venc_msg_parse_reply(buf, (size_t)n, pi->width, &id, &o, &why, err);
    free(buf);
    if (st != PD_OK) {
        pd_err_prefix(err, "encoder rank %d", ms.MPI_SOURCE);
        return st;
    }
    pageimg_entry *e = NULL;
    for (uint32_t i = 0; i < pi->n_e && !e; i++)
        if (pi->e[i].state == PE_WAIT && pi->e[i].id == id && pi->e[i].enc == c)
            e = &pi->e[i];
    if (!e) {
        venc_out_free(&o);
        return pd_err_set(err, PD_ERR_MPI, "encoder rank %d: a reply to request %" PRIu64 " nobody waits for",
                          ms.MPI_SOURCE, id);
    }
    pi->busy[c]--;
    e->state = PE_READY;
    e->failed = why.status != PD_OK;
    e->why = why;
    e->out = o;
    pi->encoded += !e->failed;
    *got = true;
    return PD_OK;
}

pd_status pageimg_pump(pageimg *pi, pd_err *err)
{
    if (!pi || pi->enc.n == 0)
        return PD_OK;
    bool got = true;
    pd_status st = PD_OK;
    while (st == PD_OK && got)
        st = pageimg_take(pi, false, &got, err);
    /* the queue ahead: requested or ready but not started, at most DEPTH per encoder */
    uint32_t ahead = 0;
    for (uint32_t i = 0; i < pi->n_e; i++)
        ahead += pi->e[i].state != PE_FREE && !pi->e[i].started;
    while (st == PD_OK && pi->next_plan < pi->n_plan && ahead < (uint32_t)pi->enc.n * PAGEIMG_DEPTH) {
        pageimg_job *j = &pi->plan[pi->next_plan++];
        if (j->taken || pageimg_find(pi, j->page, j->seg))
            continue;
        j->taken = true;
        pageimg_entry *e = pageimg_slot(pi);
        CHECK(e);
        st = pageimg_request(pi, e, j->page, j->seg, j->path, err);
        ahead++;
    }
    return st;
}

pd_status pageimg_finish(pageimg *pi, pd_err *err)
{
    if (!pi || pi->enc.n == 0)
        return PD_OK;
    pd_status st = PD_OK;
    for (;;) {
        bool waiting = false;
        for (uint32_t i = 0; i < pi->n_e; i++)
            waiting |= pi->e[i].state == PE_WAIT;
        if (!waiting)
            break;
        bool got;
        if ((st = pageimg_take(pi, true, &got, err)) != PD_OK)
            return st;
    }
    st = pageimg_stop(&pi->enc, pi->next_id++, err);
    pi->enc.n = 0; /* once */
    return st;
}

pd_status pageimg_stop(const pageimg_encoders *enc, uint64_t id, pd_err *err)
{
    pd_status st = PD_OK;
    for (int c = 0; c < enc->n && st == PD_OK; c++) {
        uint8_t *buf = NULL;
        size_t len = 0;
        if ((st = venc_msg_request(VENC_MSG_STOP, id, NULL, &buf, &len, err)) == PD_OK)
            st = pageimg_mpi(MPI_Send(buf, (int)len, MPI_BYTE, enc->first + c, PAGEIMG_TAG_REQUEST, enc->world),
                             "send stop", err);
        free(buf);
    }
    return st;
}

pd_status pageimg_placements(pageimg *pi, void *all, size_t len, pd_err *err)
{
    if (!pi || pi->enc.n == 0)
        return PD_OK;
    if (len > (size_t)INT32_MAX)
        return pd_err_set(err, PD_ERR_RANGE, "encoder ranks: placement records of %zu bytes", len);
    for (int c = 0; c < pi->enc.n; c++) {
        MPI_Status ms;
        int src = pi->enc.first + c, n = 0;
        pd_status st = pageimg_mpi(pageimg_probe_napping(src, PAGEIMG_TAG_PLACEMENT, pi->enc.world,
                                                         PAGEIMG_NAP_IDLE_US, &ms), "probe", err);
        if (st == PD_OK) {
            MPI_Get_count(&ms, MPI_BYTE, &n);
            if ((size_t)n != len)
                return pd_err_set(err, PD_ERR_MPI, "encoder rank %d: a placement record of %d bytes, not %zu",
                                  src, n, len);
            st = pageimg_mpi(MPI_Recv((char *)all + (size_t)c * len, n, MPI_BYTE, src, PAGEIMG_TAG_PLACEMENT,
                                      pi->enc.world, MPI_STATUS_IGNORE), "receive a placement", err);
        }
        if (st != PD_OK)
            return st;
    }
    return PD_OK;
}

int pageimg_encoder_count(const pageimg *pi)
{
    return pi ? pi->enc.n : 0;
}

bool pageimg_ready(void *ctx, size_t page)
{
    pageimg *pi = ctx;
    if (pi->enc.n == 0)
        return true; /* encoded here when read */
    for (size_t j = pageimg_plan_at(pi, page); j < pi->n_plan && pi->plan[j].page == page; j++) {
        pageimg_entry *e = pageimg_find(pi, page, pi->plan[j].seg);
        if (!e || e->state != PE_READY)
            return false;
    }
    return true;
}

/* ---- reading rows -------------------------------------------------------- */

/* The encoding of (page, seg), ready: from the cache, from an encoder rank
 * (waiting for it), or encoded here. */
static pd_status pageimg_get(pageimg *pi, size_t page, uint32_t seg, const char *path,
                             pageimg_entry **out, pd_err *err)
{
    pageimg_entry *e = pageimg_find(pi, page, seg);
    pd_status st;
    pageimg_take_job(pi, page, seg);
    if (!e) {
        /* never requested (with encoder ranks: the plan's first image, kept
         * for the head, or a page the scheduler reached before the queue
         * did): encoded here, at once, instead of queued behind an encoder's
         * requests while the head idles (the scheduler reads a page whose
         * rows are not here only when nothing else decodes) */
        e = pageimg_slot(pi);
        CHECK(e);
        venc_out o;
        pd_err why = {0};
        double t0 = pd_now_s();
        st = venc_image(pi->v, path, false, &o, &why);
        pi->head_s += pd_now_s() - t0;
        pi->head_n++;
        if (st == PD_ERR_NOMEM) {
            *err = why;
            return st;
        }
        *e = (pageimg_entry){.state = PE_READY, .page = page, .seg = seg, .failed = st != PD_OK,
                             .why = why, .out = st == PD_OK ? o : (venc_out){0}};
        pi->encoded += st == PD_OK;
    }
    while (e->state == PE_WAIT) {
        bool got;
        if ((st = pageimg_take(pi, true, &got, err)) != PD_OK)
            return st;
    }
    e->stamp = ++pi->clock;
    e->started = true;
    *out = e;
    return PD_OK;
}

pd_status pageimg_read(void *ctx, size_t page, uint32_t seg, const char *path, uint32_t seg_rows,
                       const model *em, uint32_t off, uint32_t n, float *dst, pd_err *err)
{
    pageimg *pi = ctx;
    pageimg_entry *e = NULL;
    pd_status st = pageimg_get(pi, page, seg, path, &e, err);
    if (st != PD_OK)
        return st;
    /* images planned for pages far behind this one were never read (their
     * page failed before its prefill): their entries go */
    if (page > pi->read_page)
        pi->read_page = page;
    for (uint32_t i = 0; i < pi->n_e; i++) {
        pageimg_entry *x = &pi->e[i];
        if (x->state == PE_READY && !x->started && x->page + 4 * (size_t)pi->streams + 16 < pi->read_page)
            pageimg_release(x);
    }
    if (e->failed) {
        *err = e->why;
        pageimg_release(e);
        return err->status ? err->status : PD_ERR_FORMAT;
    }
    if (e->out.rows != seg_rows) {
        uint64_t got = e->out.rows;
        pageimg_release(e);
        return pd_err_set(err, PD_ERR_MISMATCH, "%s: encoded to %" PRIu64 " rows, its header "
                          "promised %" PRIu32 " (the file changed since the manifest was loaded?)",
                          path, got, seg_rows);
    }
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
                    if (t >= model_hp(em)->vocab)
                        return pd_err_set(err, PD_ERR_RANGE, "%s: the encoder's text piece holds id %"
                                          PRIu32 ", outside the vocabulary", path, t);
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
    if ((uint64_t)off + n == e->out.rows)
        pageimg_release(e);
    return PD_OK;
}

/* ---- an encoder rank ------------------------------------------------------ */

pd_status pageimg_serve(const char *mmproj, const char *model_path, uint32_t threads, MPI_Comm world,
                        int head, const void *placement, size_t placement_len, pd_err *err)
{
    if (placement_len > (size_t)INT32_MAX)
        return pd_err_set(err, PD_ERR_RANGE, "encoder: a placement record of %zu bytes", placement_len);
    /* first: the head's report waits for it (pageimg_placements) */
    pd_status st = pageimg_mpi(MPI_Send(placement, (int)placement_len, MPI_BYTE, head, PAGEIMG_TAG_PLACEMENT, world),
                               "send the placement", err);
    if (st != PD_OK)
        return st;
    venc *v = NULL;
    st = venc_open(&(venc_opts){.mmproj = mmproj, .model = model_path,
                                          .threads = (int)(threads ? threads : 1), .warmup = true},
                             &v, err);
    if (st != PD_OK)
        return st;
    for (;;) {
        MPI_Status ms;
        if ((st = pageimg_mpi(pageimg_probe_napping(head, PAGEIMG_TAG_REQUEST, world, PAGEIMG_NAP_IDLE_US, &ms), "probe", err)) != PD_OK)
            break;
        int n = 0;
        MPI_Get_count(&ms, MPI_BYTE, &n);
        uint8_t *req = malloc(n > 0 ? (size_t)n : 1);
        if (!req) {
            st = pd_err_set(err, PD_ERR_NOMEM, "encoder: no memory");
            break;
        }
        st = pageimg_mpi(MPI_Recv(req, n, MPI_BYTE, head, PAGEIMG_TAG_REQUEST, world, MPI_STATUS_IGNORE),
                         "receive a request", err);
        uint32_t kind = 0;
        uint64_t id = 0;
        const char *p = NULL;
        size_t pl = 0;
        if (st == PD_OK)
            st = venc_msg_parse_request(req, (size_t)n, &kind, &id, &p, &pl, err);
        char path[VENC_MAX_PATH + 1];
        if (st == PD_OK) {
            memcpy(path, p, pl);
            path[pl] = '\0';
        }
        free(req);
        if (st != PD_OK || kind == VENC_MSG_STOP)
            break;
        venc_out o;
        pd_err why = {0};
        pd_status es = venc_image(v, path, false, &o, &why);
        if (es == PD_ERR_NOMEM) {
            *err = why;
            st = es;
            break;
        }
        uint8_t *rep = NULL;
        size_t len = 0;
        st = venc_msg_reply(id, es, why.msg, es == PD_OK ? &o : NULL, venc_width(v), &rep, &len, err);
        if (es == PD_OK)
            venc_out_free(&o);
        if (st == PD_OK && len > (size_t)INT32_MAX)
            st = pd_err_set(err, PD_ERR_RANGE, "encoder: %s: a reply of %zu bytes", path, len);
        if (st == PD_OK)
            st = pageimg_mpi(MPI_Send(rep, (int)len, MPI_BYTE, head, PAGEIMG_TAG_REPLY, world), "send a reply",
                             err);
        free(rep);
        if (st != PD_OK)
            break;
    }
    venc_close(v);
    return st;
}
