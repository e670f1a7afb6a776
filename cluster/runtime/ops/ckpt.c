/* ckpt: writing checkpoints at a drain point and resuming from them
 * (contract and manifest layout in ckpt.h). */
#include "cluster/runtime/ops/ckpt.h"

#include "cluster/runtime/ops/ckpt_dir.h"

#include "base/check.h"
#include "base/file.h"
#include "base/fnv.h"
#include "comm/bundle.h"
#include "comm/crc32c.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>


/* ---- small helpers ------------------------------------------------------------ */

/* The settings text a run's tokens depend on (compared on resume). Owned. */
static char *ckpt_settings(const run_opts *o)
{
    char pol[160];
    policy_describe(&o->policy, pol, sizeof pol);
    char *s = malloc(512);
    if (s)
        snprintf(s, 512, "policy %s; sample mode %d temperature %a top_p %a top_k %u; seed %llu; ngram %u:%u; gemm %s; "
                 "wire %s",
                 pol, (int)o->sample.mode, (double)o->sample.temperature, (double)o->sample.top_p,
                 (unsigned)o->sample.top_k, (unsigned long long)o->seed, (unsigned)o->ngram.n,
                 (unsigned)o->ngram.window, gemm_backend_name(o->backend),
                 o->wire_dtype == MSG_DTYPE_F16 ? "f16" : "f32");
    /* the output text's convention: a resume must write lines like the
     * ones before it (appended only when set, so older checkpoints match) */
    if (s && o->special)
        strncat(s, "; special tokens in text", 511 - strlen(s));
    return s;
}

/* FNV-1a 64 of a file's bytes. */
static pd_status ckpt_file_digest(const char *path, uint64_t *out, pd_err *err)
{
    uint8_t *b;
    size_t n;
    pd_status st = pd_file_read_all(path, "checkpoint", &b, &n, err);
    if (st)
        return st;
    *out = pd_fnv_bytes(PD_FNV_OFFSET, b, n);
    free(b);
    return PD_OK;
}

static void layer_file(char *out, size_t cap, const char *dir, uint32_t layer)
{
    snprintf(out, cap, "%s/layer-%05u.cmfb", dir, layer);
}

/* fsync of a directory (its entries survive a crash). */
static pd_status sync_dir(const char *dir, pd_err *err)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return pd_err_set(err, PD_ERR_IO, "checkpoint: %s: open directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    if (rc != 0 && e != EINVAL)
        return pd_err_set(err, PD_ERR_IO, "checkpoint: %s: fsync directory: %s", dir, strerror(e));
    return PD_OK;
}

/* Lists dir, saying on stderr which entries named like checkpoints are not
 * ones (they are never resumed, numbered by or removed). */
static pd_status scan_dir(const char *dir, ckpt_dir_scan *sc, pd_err *err)
{
    pd_status st = ckpt_dir_list(dir, sc, err);
    for (uint32_t i = 0; st == PD_OK && i < sc->n_foreign && i < 8; i++)
        fprintf(stderr, "pipedec: checkpoint-dir %s: ignoring %s: not a checkpoint pipedec wrote\n", dir,
                sc->foreign[i]);
    if (st == PD_OK && sc->n_foreign > 8)
        fprintf(stderr, "pipedec: checkpoint-dir %s: ... and %u more such entries\n", dir, sc->n_foreign - 8);
    return st;
}

uint64_t ckpt_newest(const char *dir)
{
    ckpt_dir_scan sc;
    pd_err e = {0};
    uint64_t s = ckpt_dir_list(dir, &sc, &e) == PD_OK && sc.n ? sc.seqs[0] : 0;
    ckpt_dir_scan_free(&sc);
    return s;
}

/* The highest checkpoint number any entry of dir is named with (0 when
 * none): new checkpoints are numbered past it (ckpt_dir.h). */
static uint64_t ckpt_highest(const char *dir)
{
    ckpt_dir_scan sc;
    pd_err e = {0};
    uint64_t s = ckpt_dir_list(dir, &sc, &e) == PD_OK ? sc.max_seq : 0;
    ckpt_dir_scan_free(&sc);
    return s;
}

pd_status ckpt_inspect(const char *path, ckpt_manifest *m, uint64_t *seq, pd_err *err)
{
    char cd[4096], p[4200];
    snprintf(p, sizeof p, "%s/manifest.pdck", path);
    struct stat sb;
    if (stat(p, &sb) == 0)
        snprintf(cd, sizeof cd, "%s", path);
    else {
        uint64_t newest = ckpt_newest(path);
        if (!newest)
            return pd_err_set(err, PD_ERR_FORMAT, "%s: neither a checkpoint (no manifest.pdck) nor a directory of them",
                              path);
        snprintf(cd, sizeof cd, "%s/ckpt-%llu", path, (unsigned long long)newest);
        snprintf(p, sizeof p, "%s/manifest.pdck", cd);
    }
    uint8_t *b;
    size_t n;
    pd_status st = pd_file_read_all(p, "checkpoint", &b, &n, err);
    if (st)
        return st;
    stream_limits lim = {.max_new = UINT32_MAX - 1, .max_prefill = UINT64_MAX};
    st = ckpt_manifest_decode(b, n, &lim, 1u << 20, m, err);
    free(b);
    if (st) {
        pd_err_prefix(err, "%s", p);
        return st;
    }
    *seq = m->seq;
    for (uint32_t L = 0; st == PD_OK && L < m->n_layers; L++) {
        layer_file(p, sizeof p, cd, L);
        if ((st = pd_file_read_all(p, "checkpoint", &b, &n, err)))
            break;
        bundle_view *v = NULL;
        if (n != m->bundles[L].bytes)
            st = pd_err_set(err, PD_ERR_TRUNCATED, "%s: %zu bytes, the manifest says %" PRIu64, p, n, m->bundles[L].bytes);
        else if (crc32c_update(0, b, n) != m->bundles[L].crc)
            st = pd_err_set(err, PD_ERR_CHECKSUM, "%s: CRC32C does not match the manifest", p);
        else if ((st = bundle_parse(b, n, &v, err)) != PD_OK)
            pd_err_prefix(err, "%s", p);
        else if (v->layer != L)
            st = pd_err_set(err, PD_ERR_FORMAT, "%s: holds layer %u", p, v->layer);
        else if (v->n_streams != m->n_streams)
            st = pd_err_set(err, PD_ERR_FORMAT, "%s: %llu streams, the manifest has %u", p,
                            (unsigned long long)v->n_streams, m->n_streams);
        for (uint64_t i = 0; st == PD_OK && i < v->n_streams; i++) {
            bool known = false;
            for (uint32_t k = 0; k < m->n_streams; k++)
                known |= m->streams[k].id == v->entries[i].stream;
            if (!known)
                st = pd_err_set(err, PD_ERR_FORMAT, "%s: stream %llu is not in the manifest", p,
                                (unsigned long long)v->entries[i].stream);
        }
        bundle_view_free(v);
        free(b);
    }
    if (st)
        ckpt_manifest_free(m);
    return st;
}

/* ---- finding the checkpoint to resume -------------------------------------- */

/* Reads and checks dir/ckpt-seq: manifest, and every bundle's size and CRC. */
static pd_status check_one(const char *dir, uint64_t seq, uint32_t n_layers, ckpt_manifest *m, pd_err *err)
{
    char cd[4096], path[4200];
    snprintf(cd, sizeof cd, "%s/ckpt-%llu", dir, (unsigned long long)seq);
    snprintf(path, sizeof path, "%s/manifest.pdck", cd);
    uint8_t *b;
    size_t n;
    pd_status st = pd_file_read_all(path, "checkpoint", &b, &n, err);
    if (st)
        return st;
    stream_limits lim = {.max_new = UINT32_MAX - 1, .max_prefill = UINT64_MAX};
    st = ckpt_manifest_decode(b, n, &lim, n_layers, m, err);
    free(b);
    if (st) {
        pd_err_prefix(err, "%s", path);
        return st;
    }
    if (m->seq != seq || m->n_layers != n_layers) {
        st = pd_err_set(err, PD_ERR_FORMAT, "%s: says checkpoint %llu of %u layers, expected %llu of %u", path,
                        (unsigned long long)m->seq, m->n_layers, (unsigned long long)seq, n_layers);
        ckpt_manifest_free(m);
        return st;
    }
    for (uint32_t L = 0; L < n_layers; L++) {
        layer_file(path, sizeof path, cd, L);
        st = pd_file_read_all(path, "checkpoint", &b, &n, err);
        if (st == PD_OK) {
            if (n != m->bundles[L].bytes)
                st = pd_err_set(err, PD_ERR_TRUNCATED, "%s: %zu bytes, the manifest says %" PRIu64, path, n,
                                m->bundles[L].bytes);
            else if (crc32c_update(0, b, n) != m->bundles[L].crc)
                st = pd_err_set(err, PD_ERR_CHECKSUM, "%s: CRC32C does not match the manifest", path);
            free(b);
        }
        if (st) {
            ckpt_manifest_free(m);
            return st;
        }
    }
    return PD_OK;
}

/* Head, at start-up: the newest valid checkpoint of dir for this run
 * (*m filled, *seq >= 1), or *seq = 0 when there is none to resume (said on
 * stderr when some were skipped). A checkpoint of another model, manifest or
 * settings is an error naming what differs. */
static pd_status ckpt_find(const char *dir, uint64_t model_fp, uint64_t pages_digest, const char *settings,
                    uint32_t n_layers, ckpt_manifest *m, uint64_t *seq, pd_err *err)
{
    *seq = 0;
    ckpt_dir_scan sc;
    pd_status st = scan_dir(dir, &sc, err);
    if (st)
        return st;
    ckpt_dir_clean_stale(dir);
    const uint64_t *seqs = sc.seqs;
    uint32_t n = sc.n;
    for (uint32_t i = 0; i < n && *seq == 0; i++) {
        pd_err e = {0};
        ckpt_manifest c = {0};
        if (check_one(dir, seqs[i], n_layers, &c, &e) != PD_OK) {
            fprintf(stderr, "pipedec: checkpoint %llu is not usable, trying an older one: %s\n",
                    (unsigned long long)seqs[i], e.msg);
            continue;
        }
        if (c.model_fp != model_fp)
            st = pd_err_set(err, PD_ERR_MISMATCH,
                            "%s/ckpt-%llu was written with another model (fingerprint %016llx, this one %016llx): "
                            "resume with the model it was written with, or give another --checkpoint-dir",
                            dir, (unsigned long long)seqs[i], (unsigned long long)c.model_fp,
                            (unsigned long long)model_fp);
        else if (c.pages_digest != pages_digest)
            st = pd_err_set(err, PD_ERR_MISMATCH,
                            "%s/ckpt-%llu was written for another page manifest (digest %016llx, this one %016llx)",
                            dir, (unsigned long long)seqs[i], (unsigned long long)c.pages_digest,
                            (unsigned long long)pages_digest);
        else if (strcmp(c.settings, settings) != 0)
            st = pd_err_set(err, PD_ERR_MISMATCH,
                            "%s/ckpt-%llu was written with other settings (%s), this run has %s", dir,
                            (unsigned long long)seqs[i], c.settings, settings);
        if (st) {
            ckpt_manifest_free(&c);
            break;
        }
        *m = c;
        *seq = seqs[i];
    }
    if (st == PD_OK && *seq == 0 && n > 0)
        fprintf(stderr, "pipedec: no usable checkpoint in %s: starting from scratch\n", dir);
    ckpt_dir_scan_free(&sc);
    return st;
}

/* Removes this checkpoint's temporary directory (tmp: its path in dir),
 * saying why when it is left. */
static void remove_tmp(const char *dir, const char *tmp)
{
    const char *slash = strrchr(tmp, '/');
    pd_err e = {0};
    if (*tmp && ckpt_dir_remove(dir, slash ? slash + 1 : tmp, 0, &e) != PD_OK)
        fprintf(stderr, "pipedec: checkpoint-dir: %s\n", e.msg);
}

/* Keeps the two newest checkpoints pipedec wrote in dir and removes its
 * older ones; entries it does not recognise as its own are left, said once
 * per checkpoint. */
static void keep_last_two(const char *dir)
{
    ckpt_dir_scan sc;
    pd_err e = {0};
    if (ckpt_dir_list(dir, &sc, &e) != PD_OK) {
        fprintf(stderr, "pipedec: checkpoint-dir %s: old checkpoints not removed: %s\n", dir, e.msg);
        return;
    }
    uint32_t kept = 0;
    for (uint32_t i = 0; i < sc.n; i++) {
        char name[32];
        snprintf(name, sizeof name, "ckpt-%llu", (unsigned long long)sc.seqs[i]);
        if (!ckpt_dir_is_checkpoint(dir, sc.seqs[i])) {
            fprintf(stderr, "pipedec: checkpoint-dir %s: leaving %s: it has no manifest pipedec can read\n", dir,
                    name);
            continue;
        }
        if (kept < 2) {
            kept++;
            continue;
        }
        pd_err re = {0};
        if (ckpt_dir_remove(dir, name, sc.seqs[i], &re) != PD_OK)
            fprintf(stderr, "pipedec: checkpoint-dir: %s\n", re.msg);
    }
    ckpt_dir_scan_free(&sc);
}

/* The next position a restored stream's rows take on every stage. */
static uint64_t stream_next_pos(const stream_state *s)
{
    return s->n_tokens ? s->prefill_rows + s->n_tokens - 1 : s->fed;
}

/* ---- writing ---------------------------------------------------------------- */

typedef struct crc_sink {
    int fd;
    uint32_t crc;
    uint64_t bytes;
    const char *path;
} crc_sink;

static pd_status crc_sink_write(void *ctx, const void *bytes, size_t n, pd_err *err)
{
    crc_sink *s = ctx;
    const uint8_t *p = bytes;
    size_t done = 0;
    while (done < n) {
        ssize_t w = write(s->fd, p + done, n - done);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return pd_err_set(err, PD_ERR_IO, "checkpoint: %s: write: %s", s->path, w < 0 ? strerror(errno) : "no progress");
        done += (size_t)w;
    }
    s->crc = crc32c_update(s->crc, bytes, n);
    s->bytes += n;
    return PD_OK;
}

/* One stream's record of layer L, encoded straight into the bundle's file
 * (never held whole in memory). */
static pd_status write_entry(const stage *st, bundle_writer *bw, uint64_t stream, uint32_t L, pd_err *err)
{
    kv_layer_config kc;
    wire_layer_ref ref;
    pd_status rc = stage_export_ref(st, stream, L, &ref, &kc, err);
    if (rc == PD_OK && (rc = bundle_writer_add(bw, stream, &ref, 0, err)) != PD_OK)
        stage_export_refused(st, stream, L, rc, err);
    return rc;
}

/* This rank's bundles of the streams ids[0..n) into dir; info[L] filled for
 * the layers it owns. */
static pd_status write_bundles(rank *r, const char *dir, const uint64_t *ids, uint32_t n, ckpt_bundle_info *info,
                               pd_err *err)
{
    uint32_t first, cnt;
    stage_layers(r->st, &first, &cnt);
    for (uint32_t L = first; L < first + cnt; L++) {
        char path[4200];
        layer_file(path, sizeof path, dir, L);
        int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0)
            return pd_err_set(err, PD_ERR_IO, "checkpoint: %s: create: %s", path, strerror(errno));
        crc_sink cs = {.fd = fd, .path = path};
        bundle_writer *bw = NULL;
        pd_status st = bundle_writer_new(crc_sink_write, &cs, stage_layer_identity(r->st, L), L, n, &bw, err);
        for (uint32_t i = 0; st == PD_OK && i < n; i++)
            st = write_entry(r->st, bw, ids[i], L, err);
        if (st == PD_OK)
            st = bundle_writer_finish(bw, err);
        bundle_writer_free(bw);
        if (st == PD_OK && fsync(fd) != 0)
            st = pd_err_set(err, PD_ERR_IO, "checkpoint: %s: fsync: %s", path, strerror(errno));
        if (close(fd) != 0 && st == PD_OK)
            st = pd_err_set(err, PD_ERR_IO, "checkpoint: %s: close: %s", path, strerror(errno));
        if (st)
            return st;
        info[L] = (ckpt_bundle_info){.layer = L, .bytes = cs.bytes, .crc = cs.crc};
    }
    return PD_OK;
}

/* One checkpoint being written on this rank: what ckpt_write's steps share,
 * freed once (ckw_free). The steps keep this rank's first local failure in
 * e; every step ends in a vote (ckw_agree), so all ranks go on or stop
 * together. */
typedef struct ckw {
    rank *r;                 /* borrowed */
    sched *sc;               /* the head's (NULL elsewhere) */
    const char *dir;         /* --checkpoint-dir */
    uint64_t seq;
    /* tmp: made by the head (mkdtemp: a directory nobody else holds), its
     * name sent to every rank */
    char tmp[4096];
    uint64_t cnt;            /* the streams the head holds */
    uint64_t *ids, *pos;     /* [max_streams + 1]: their ids and next positions */
    ckpt_bundle_info *info;  /* [n_layers]: this rank's bundles */
    ckpt_bundle_info *every; /* head: [size x n_layers], every rank's info */
    pd_err e;
} ckw;

static void ckw_free(ckw *w)
{
    free(w->info);
    free(w->every);
    free(w->ids);
    free(w->pos);
    w->info = w->every = NULL;
    w->ids = w->pos = NULL;
}

/* Every rank's vote on a step: a failure of this rank's (local) speaks in its
 * own words, another rank's as "checkpoint N: <others>". */
static pd_status ckw_agree(ckw *w, pd_status vote, pd_status local, const char *others, pd_err *err)
{
    pd_status all = pipe_agree(w->r->p, vote, err);
    if (all != PD_OK) {
        if (local)
            *err = w->e;
        else
            pd_err_set(err, all, "checkpoint %llu: %s", (unsigned long long)w->seq, others);
    }
    return all;
}

/* Step 1, local: the head makes the temporary directory and names the
 * streams. */
static pd_status ckw_begin(ckw *w)
{
    rank *r = w->r;
    w->ids = calloc(r->sz.max_streams + 1, sizeof *w->ids);
    w->pos = calloc(r->sz.max_streams + 1, sizeof *w->pos);
    if (!w->ids || !w->pos)
        return pd_err_set(&w->e, PD_ERR_NOMEM, "out of memory");
    if (!r->is_head)
        return PD_OK;
    pd_status st;
    if (w->seq == 0)
        st = pd_err_set(&w->e, PD_ERR_RANGE, "checkpoint: %s: checkpoint numbers ran out (the next would wrap to 0)",
                        w->dir);
    else if (mkdir(w->dir, 0755) != 0 && errno != EEXIST)
        st = pd_err_set(&w->e, PD_ERR_IO, "checkpoint: %s: mkdir: %s", w->dir, strerror(errno));
    else
        st = ckpt_dir_make_tmp(w->dir, w->seq, w->tmp, sizeof w->tmp, &w->e);
    stream_table *t = sched_streams(w->sc);
    for (uint32_t i = 0; i < stream_table_capacity(t); i++)
        if (stream_table_at(t, i)) {
            w->pos[w->cnt] = stream_next_pos(stream_table_at(t, i));
            w->ids[w->cnt++] = stream_table_at(t, i)->id;
        }
    return st;
}

/* Every rank learns the temporary directory and the streams the head holds
 * (retirements not yet sent are not among them). Errors are MPI failures. */
static pd_status ckw_share(ckw *w, pd_err *err)
{
    pipe_link *p = w->r->p;
    pd_status st = pipe_bcast(p, &w->cnt, sizeof w->cnt, err);
    if (st == PD_OK)
        st = pipe_bcast(p, w->tmp, sizeof w->tmp, err);
    w->tmp[sizeof w->tmp - 1] = 0;
    if (st == PD_OK && w->cnt)
        st = pipe_bcast(p, w->ids, (size_t)w->cnt * sizeof *w->ids, err);
    if (st == PD_OK && w->cnt)
        st = pipe_bcast(p, w->pos, (size_t)w->cnt * sizeof *w->pos, err);
    return st;
}

/* Step 2, local: this rank settles the streams and writes its layers'
 * bundles. */
static pd_status ckw_bundles(ckw *w)
{
    rank *r = w->r;
    w->info = calloc(r->hp.n_layers, sizeof *w->info);
    if (!w->info)
        return pd_err_set(&w->e, PD_ERR_NOMEM, "out of memory");
    /* the rows up to the head's position are final; rejected drafts past
     * it are dropped (the position-driven rollback the next pass would do) */
    pd_status st = PD_OK;
    for (uint64_t i = 0; st == PD_OK && i < w->cnt; i++)
        st = stage_settle(r->st, w->ids[i], w->pos[i], &w->e);
    if (st == PD_OK)
        st = write_bundles(r, w->tmp, w->ids, (uint32_t)w->cnt, w->info, &w->e);
    return st;
}

/* The manifest as a file in tmp, written and published atomically. */
static pd_status ckw_manifest_file(ckw *w, const ckpt_manifest *m)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/manifest.pdck", w->tmp);
    wr b;
    pd_status st = wr_init_buffer(&b, 4096, &w->e);
    if (st)
        return st;
    st = ckpt_manifest_encode(m, &b);
    size_t len;
    uint8_t *bytes = wr_take(&b, &len);
    if (st == PD_OK && !bytes)
        st = pd_err_set(&w->e, PD_ERR_NOMEM, "out of memory");
    pd_publish *pub = NULL;
    if (st == PD_OK && (st = pd_file_publish_begin(path, 0644, "checkpoint", &pub, &w->e)) == PD_OK &&
        (st = pd_file_publish_write(pub, bytes, len, &w->e)) == PD_OK)
        st = pd_file_publish_commit(pub, &w->e);
    else if (pub)
        pd_file_publish_abort(pub);
    free(bytes);
    wr_dispose(&b);
    return st;
}

/* Step 3, the head: the manifest (layer map, streams, where every bundle is
 * and its CRC), then tmp renamed to ckpt-<seq> with both directories synced;
 * the older checkpoints but one go. */
static pd_status ckw_publish(ckw *w, uint64_t out_size)
{
    rank *r = w->r;
    uint32_t L_all = r->hp.n_layers;
    ckpt_manifest m = {.seq = w->seq, .out_size = out_size, .next_id = sched_next_id(w->sc), .n_layers = L_all,
                       .n_streams = (uint32_t)w->cnt};
    m.model_fp = model_fingerprint(r->m);
    pd_status st = ckpt_file_digest(r->o->pages_path, &m.pages_digest, &w->e);
    m.settings = ckpt_settings(r->o);
    char lm[512];
    layermap_format(&r->lm, lm, sizeof lm);
    m.layer_map = lm;
    m.bundles = calloc(L_all, sizeof *m.bundles);
    m.streams = calloc(w->cnt ? w->cnt : 1, sizeof *m.streams);
    if (st == PD_OK && (!m.settings || !m.bundles || !m.streams))
        st = pd_err_set(&w->e, PD_ERR_NOMEM, "out of memory");
    for (int k = 0; st == PD_OK && k < r->size; k++)
        for (uint32_t L = r->lm.first[k]; L < r->lm.first[k] + r->lm.count[k]; L++)
            m.bundles[L] = w->every[(size_t)k * L_all + L];
    for (uint64_t i = 0; st == PD_OK && i < w->cnt; i++)
        m.streams[i] = *stream_table_find(sched_streams(w->sc), w->ids[i]); /* shallow: not freed here */
    if (st == PD_OK)
        st = ckw_manifest_file(w, &m);
    if (st == PD_OK)
        st = sync_dir(w->tmp, &w->e);
    char fin[64];
    snprintf(fin, sizeof fin, "ckpt-%llu", (unsigned long long)w->seq);
    if (st == PD_OK)
        st = ckpt_dir_publish(w->tmp, w->dir, fin, &w->e);
    if (st == PD_OK)
        st = sync_dir(w->dir, &w->e);
    if (st)
        remove_tmp(w->dir, w->tmp);
    else
        keep_last_two(w->dir);
    free(m.settings);
    free(m.bundles);
    free(m.streams);
    return st;
}

pd_status ckpt_write(rank *r, sched *sc, const char *dir, uint64_t seq, uint64_t out_size, pd_err *err)
{
    ckw w = {.r = r, .sc = sc, .dir = dir, .seq = seq};
    pd_status st = ckw_begin(&w);
    pd_status all = ckw_agree(&w, st, st, "another rank could not start it", err);
    if (all == PD_OK)
        all = ckw_share(&w, err);
    if (all == PD_OK) {
        st = ckw_bundles(&w);
        uint32_t L_all = r->hp.n_layers;
        w.every = r->is_head ? calloc((size_t)r->size * L_all, sizeof *w.every) : NULL;
        pd_status gs = pipe_gather(r->p, w.info ? (void *)w.info : (void *)w.ids, (size_t)L_all * sizeof *w.info,
                                   w.every, err);
        all = ckw_agree(&w, st ? st : gs, st, "another rank could not write its layers", err);
        if (all && r->is_head)
            remove_tmp(dir, w.tmp);
    }
    if (all == PD_OK) {
        st = r->is_head ? ckw_publish(&w, out_size) : PD_OK;
        ckw_free(&w);
        all = ckw_agree(&w, st, st, "the head could not publish it", err);
    }
    ckw_free(&w);
    return all;
}

/* --checkpoint-dir: the checkpoint to resume, and out.jsonl cut back to the
 * bytes it recorded durable (lines written after it are decoded again). */
pd_status ckpt_resume_find(const run_opts *o, const model *mdl, uint32_t n_layers, uint64_t *seq, uint64_t *newest,
                           pd_err *err)
{
    *seq = 0;
    uint64_t digest;
    pd_status st = ckpt_file_digest(o->pages_path, &digest, err);
    char *settings = ckpt_settings(o);
    if (st == PD_OK && !settings)
        st = pd_err_set(err, PD_ERR_NOMEM, "out of memory");
    ckpt_manifest m = {0};
    if (st == PD_OK)
        st = ckpt_find(o->checkpoint_dir, model_fingerprint(mdl), digest, settings, n_layers, &m, seq, err);
    free(settings);
    *newest = ckpt_highest(o->checkpoint_dir);
    if (st || !*seq)
        return st;
    struct stat sb;
    if (stat(o->out_path, &sb) != 0)
        st = pd_err_set(err, PD_ERR_MISMATCH,
                        "%s: %s, but checkpoint %llu recorded %llu bytes of it written: resume with the output the "
                        "checkpoint belongs to, or give another --checkpoint-dir to start over",
                        o->out_path, errno == ENOENT ? "does not exist" : strerror(errno),
                        (unsigned long long)*seq, (unsigned long long)m.out_size);
    else if ((uint64_t)sb.st_size < m.out_size)
        st = pd_err_set(err, PD_ERR_MISMATCH,
                        "%s holds %lld bytes but checkpoint %llu recorded %llu written: it is not the output this "
                        "checkpoint belongs to",
                        o->out_path, (long long)sb.st_size, (unsigned long long)*seq,
                        (unsigned long long)m.out_size);
    else if ((uint64_t)sb.st_size > m.out_size && truncate(o->out_path, (off_t)m.out_size) != 0)
        st = pd_err_set(err, PD_ERR_IO, "%s: cutting back to %llu bytes: %s", o->out_path,
                        (unsigned long long)m.out_size, strerror(errno));
    if (st == PD_OK)
        fprintf(stderr, "pipedec: resuming from %s/ckpt-%llu (%u streams in flight, %s cut back to %llu bytes)\n",
                o->checkpoint_dir, (unsigned long long)*seq, m.n_streams, o->out_path,
                (unsigned long long)m.out_size);
    ckpt_manifest_free(&m);
    return st;
}

/* ---- restoring --------------------------------------------------------------- */

pd_status ckpt_restore(rank *r, sched *sc, const char *dir, uint64_t seq, pd_err *err)
{
    char cd[4096], path[4200];
    snprintf(cd, sizeof cd, "%s/ckpt-%llu", dir, (unsigned long long)seq);
    snprintf(path, sizeof path, "%s/manifest.pdck", cd);
    ckpt_manifest m = {0};
    uint8_t *b = NULL;
    size_t n = 0;
    pd_err e = {0};
    pd_status st = pd_file_read_all(path, "checkpoint", &b, &n, &e);
    stream_limits lim = {.max_new = UINT32_MAX - 1, .max_prefill = UINT64_MAX};
    if (st == PD_OK)
        st = ckpt_manifest_decode(b, n, &lim, r->hp.n_layers, &m, &e);
    free(b);
    if (st == PD_OK && m.n_streams > r->sz.max_streams)
        st = pd_err_set(&e, PD_ERR_RANGE, "checkpoint %llu holds %u streams; resume with --batch %u or more",
                        (unsigned long long)seq, m.n_streams, m.n_streams);
    /* streams: on every stage, the tail and the head's scheduler */
    for (uint32_t i = 0; st == PD_OK && i < m.n_streams; i++) {
        const stream_state *s = &m.streams[i];
        mb_admit a = {.stream = s->id, .prefill_rows = (uint32_t)s->prefill_rows, .max_new = s->max_new,
                      .sample_key = s->key};
        st = stage_admit_at(r->st, &a, stream_next_pos(s), &e);
        if (st == PD_OK && r->tl)
            st = tail_restore(r->tl, s, &e);
    }
    /* this rank's layers, from their bundles */
    uint32_t first, cnt;
    stage_layers(r->st, &first, &cnt);
    for (uint32_t L = first; st == PD_OK && L < first + cnt; L++) {
        snprintf(path, sizeof path, "%s/layer-%05u.cmfb", cd, L);
        if ((st = pd_file_read_all(path, "checkpoint", &b, &n, &e)))
            break;
        bundle_view *v = NULL;
        if (crc32c_update(0, b, n) != m.bundles[L].crc || n != m.bundles[L].bytes)
            st = pd_err_set(&e, PD_ERR_CHECKSUM, "%s does not match the manifest (size or CRC32C)", path);
        if (st == PD_OK)
            st = bundle_parse(b, n, &v, &e);
        if (st == PD_OK && v->n_streams != m.n_streams)
            st = pd_err_set(&e, PD_ERR_FORMAT, "%s holds %llu streams, the manifest %u", path,
                            (unsigned long long)v->n_streams, m.n_streams);
        if (st == PD_OK)
            st = v->layer == L ? stage_install_bundle(r->st, v, &e)
                               : pd_err_set(&e, PD_ERR_FORMAT, "%s holds layer %u", path, v->layer);
        if (st)
            pd_err_prefix(&e, "%s", path);
        bundle_view_free(v);
        free(b);
    }
    if (st == PD_OK && sc) {
        stream_state *mine = m.streams;
        uint32_t ns = m.n_streams;
        st = sched_restore(sc, mine, ns, m.next_id, &e); /* takes the records over */
        for (uint32_t i = 0; i < ns; i++)
            stream_release(&mine[i]); /* no-op on the ones taken */
    }
    ckpt_manifest_free(&m);
    pd_status all = pipe_agree(r->p, st, err);
    if (st)
        *err = e;
    else if (all)
        pd_err_set(err, all, "restoring checkpoint %llu failed on another rank", (unsigned long long)seq);
    return all;
}
