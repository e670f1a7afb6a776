/* ckpt_manifest: encoding and validating decoder (layout in
 * ckpt_manifest.h). */
#include "cluster/runtime/ops/ckpt_manifest.h"

#include "comm/crc32c.h"

#include <stdlib.h>
#include <string.h>

static const uint8_t ckpt_magic[4] = {'P', 'D', 'C', 'K'};
#define CKPT_MAX_TEXT 4096u
#define CKPT_MAX_RECORD (1u << 26)

/* ---- manifest ------------------------------------------------------------- */

static void wr_text(wr *w, const char *s)
{
    uint32_t n = (uint32_t)strlen(s);
    wr_u32(w, n);
    wr_bytes(w, s, n);
}

pd_status ckpt_manifest_encode(const ckpt_manifest *m, wr *w)
{
    wr_crc_begin(w);
    wr_bytes(w, ckpt_magic, 4);
    wr_u16(w, CKPT_VERSION);
    wr_u16(w, 0);
    wr_u64(w, m->seq);
    wr_u64(w, m->model_fp);
    wr_u64(w, m->pages_digest);
    wr_u64(w, m->out_size);
    wr_u64(w, m->next_id);
    wr_u32(w, m->n_layers);
    wr_u32(w, m->n_streams);
    wr_text(w, m->settings);
    wr_text(w, m->layer_map);
    for (uint32_t i = 0; i < m->n_layers; i++) {
        wr_u32(w, m->bundles[i].layer);
        wr_u64(w, m->bundles[i].bytes);
        wr_u32(w, m->bundles[i].crc);
    }
    for (uint32_t i = 0; i < m->n_streams; i++) {
        wr_u32(w, (uint32_t)stream_encoded_size(&m->streams[i]));
        stream_encode(&m->streams[i], w);
    }
    uint32_t crc = wr_crc_end(w);
    wr_u32(w, crc);
    return w->status;
}

void ckpt_manifest_free(ckpt_manifest *m)
{
    if (!m)
        return;
    free(m->settings);
    free(m->layer_map);
    free(m->bundles);
    for (uint32_t i = 0; m->streams && i < m->n_streams; i++)
        stream_release(&m->streams[i]);
    free(m->streams);
    memset(m, 0, sizeof *m);
}

static char *rd_text(rd *r, const char *field)
{
    uint32_t n;
    const uint8_t *p;
    size_t at = rd_offset(r);
    if (rd_u32(r, field, &n))
        return NULL;
    if (n > CKPT_MAX_TEXT) {
        rd_fail_at(r, at, PD_ERR_FORMAT, "%s of %u bytes (at most %u)", field, n, CKPT_MAX_TEXT);
        return NULL;
    }
    if (rd_span(r, field, n, &p))
        return NULL;
    char *s = malloc((size_t)n + 1);
    if (!s) {
        rd_fail(r, PD_ERR_NOMEM, "out of memory");
        return NULL;
    }
    memcpy(s, p, n);
    s[n] = '\0';
    if (memchr(s, 0, n)) {
        free(s);
        rd_fail_at(r, at + 4, PD_ERR_FORMAT, "%s holds a NUL byte", field);
        return NULL;
    }
    return s;
}

pd_status ckpt_manifest_decode(const void *buf, size_t len, const stream_limits *lim, uint32_t max_layers,
                               ckpt_manifest *out, pd_err *err)
{
    rd r;
    rd_init(&r, buf, len, 0, "checkpoint manifest", err);
    if (len < 4 + 4)
        return rd_fail(&r, PD_ERR_TRUNCATED, "%zu bytes: too short for a manifest", len);
    uint32_t want = (uint32_t)((const uint8_t *)buf)[len - 4] | (uint32_t)((const uint8_t *)buf)[len - 3] << 8 |
                    (uint32_t)((const uint8_t *)buf)[len - 2] << 16 | (uint32_t)((const uint8_t *)buf)[len - 1] << 24;
    const uint8_t *mg;
    if (rd_span(&r, "magic", 4, &mg))
        return r.status;
    if (memcmp(mg, ckpt_magic, 4) != 0)
        return rd_fail_at(&r, 0, PD_ERR_FORMAT, "bad magic (not a pipedec checkpoint manifest)");
    uint16_t ver, z;
    if (rd_u16(&r, "version", &ver) || rd_u16(&r, "reserved", &z))
        return r.status;
    if (ver != CKPT_VERSION)
        return rd_fail_at(&r, 4, PD_ERR_VERSION, "manifest version %u, this build reads %u", ver, CKPT_VERSION);
    if (crc32c_update(0, buf, len - 4) != want)
        return rd_fail_at(&r, len - 4, PD_ERR_CHECKSUM, "CRC32C does not match the manifest's bytes (torn or damaged)");
    if (z != 0)
        return rd_fail_at(&r, 6, PD_ERR_FORMAT, "reserved bytes are not zero");
    ckpt_manifest m = {0};
    if (rd_u64(&r, "seq", &m.seq) || rd_u64(&r, "model fingerprint", &m.model_fp) ||
        rd_u64(&r, "manifest digest", &m.pages_digest) || rd_u64(&r, "out.jsonl size", &m.out_size) ||
        rd_u64(&r, "next stream id", &m.next_id) || rd_u32(&r, "layer count", &m.n_layers) ||
        rd_u32(&r, "stream count", &m.n_streams))
        return r.status;
    if (m.n_layers == 0 || m.n_layers > max_layers)
        return rd_fail_at(&r, 48, PD_ERR_RANGE, "layer count %u outside 1..%u", m.n_layers, max_layers);
    size_t sb;
    if (rd_check_count(&r, "streams", m.n_streams, 4 + 68, &sb))
        return r.status;
    pd_status st = PD_OK;
    m.settings = rd_text(&r, "settings");
    m.layer_map = m.settings ? rd_text(&r, "layer map") : NULL;
    if (!m.layer_map)
        st = r.status;
    if (st == PD_OK && rd_check_count(&r, "bundles", m.n_layers, 16, &sb))
        st = r.status;
    if (st == PD_OK) {
        m.bundles = calloc(m.n_layers, sizeof *m.bundles);
        m.streams = calloc(m.n_streams ? m.n_streams : 1, sizeof *m.streams);
        if (!m.bundles || !m.streams)
            st = rd_fail(&r, PD_ERR_NOMEM, "out of memory");
    }
    for (uint32_t i = 0; st == PD_OK && i < m.n_layers; i++) {
        size_t at = rd_offset(&r);
        if (rd_u32(&r, "bundle layer", &m.bundles[i].layer) || rd_u64(&r, "bundle bytes", &m.bundles[i].bytes) ||
            rd_u32(&r, "bundle CRC", &m.bundles[i].crc))
            st = r.status;
        else if (m.bundles[i].layer != i)
            st = rd_fail_at(&r, at, PD_ERR_FORMAT, "bundle %u names layer %u", i, m.bundles[i].layer);
    }
    uint32_t decoded = 0;
    for (uint32_t i = 0; st == PD_OK && i < m.n_streams; i++) {
        uint32_t n;
        const uint8_t *p;
        size_t at = rd_offset(&r);
        if (rd_u32(&r, "stream record length", &n) || rd_span(&r, "stream record", n, &p)) {
            st = r.status;
            break;
        }
        if (n > CKPT_MAX_RECORD) {
            st = rd_fail_at(&r, at, PD_ERR_FORMAT, "stream record of %u bytes", n);
            break;
        }
        rd sr;
        rd_init(&sr, p, n, at + 4, "checkpoint manifest", err);
        if ((st = stream_decode(&sr, lim, &m.streams[i])))
            break;
        decoded++;
        for (uint32_t k = 0; k < i; k++)
            if (m.streams[k].id == m.streams[i].id || m.streams[k].page == m.streams[i].page) {
                st = rd_fail_at(&r, at, PD_ERR_FORMAT, "stream %u repeats the id or page of stream %u", i, k);
                break;
            }
        if (st == PD_OK && m.streams[i].id >= m.next_id)
            st = rd_fail_at(&r, at, PD_ERR_FORMAT, "stream id %llu is not below the next id %llu",
                            (unsigned long long)m.streams[i].id, (unsigned long long)m.next_id);
    }
    if (st == PD_OK && rd_remaining(&r) != 4)
        st = rd_fail(&r, PD_ERR_FORMAT, "%zu bytes between the last stream record and the CRC", rd_remaining(&r) - 4);
    if (st) {
        m.n_streams = decoded;
        ckpt_manifest_free(&m);
        return st;
    }
    *out = m;
    return PD_OK;
}

