/* venc_msg: the messages between the head and encoder ranks (see venc.h). */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cluster/vision/venc.h"
#include "comm/rd.h"

#define VENC_MAGIC_REQ 0x51494450u /* "PDIQ" little-endian */
#define VENC_MAGIC_REP 0x52494450u /* "PDIR" */

pd_status venc_msg_request(uint32_t kind, uint64_t id, const char *path, uint8_t **buf, size_t *len,
                           pd_err *err)
{
    size_t pl = path ? strlen(path) : 0;
    if ((kind != VENC_MSG_ENCODE && kind != VENC_MSG_STOP) || pl > VENC_MAX_PATH ||
        (kind == VENC_MSG_ENCODE && pl == 0))
        return pd_err_set(err, PD_ERR_ARG, "encoder request: kind %" PRIu32 ", path of %zu bytes", kind, pl);
    wr w;
    pd_status st = wr_init_buffer(&w, 20 + pl, err);
    if (st == PD_OK) {
        wr_u32(&w, VENC_MAGIC_REQ);
        wr_u32(&w, kind);
        wr_u64(&w, id);
        wr_u32(&w, (uint32_t)pl);
        st = wr_bytes(&w, path, pl);
    }
    if (st == PD_OK && !(*buf = wr_take(&w, len)))
        st = pd_err_set(err, PD_ERR_NOMEM, "encoder request: no memory");
    wr_dispose(&w);
    return st;
}

pd_status venc_msg_parse_request(const void *buf, size_t len, uint32_t *kind, uint64_t *id,
                                 const char **path, size_t *path_len, pd_err *err)
{
    rd r;
    rd_init(&r, buf, len, 0, "encoder request", err);
    uint32_t magic = 0, k = 0, pl = 0;
    uint64_t i = 0;
    const uint8_t *p = NULL;
    rd_u32(&r, "magic", &magic);
    if (r.status == PD_OK && magic != VENC_MAGIC_REQ)
        return rd_fail(&r, PD_ERR_FORMAT, "magic 0x%08" PRIx32 " is not PDIQ", magic);
    rd_u32(&r, "kind", &k);
    if (r.status == PD_OK && k != VENC_MSG_ENCODE && k != VENC_MSG_STOP)
        return rd_fail(&r, PD_ERR_FORMAT, "kind %" PRIu32 " (1 encode, 2 stop)", k);
    rd_u64(&r, "id", &i);
    rd_u32(&r, "path length", &pl);
    if (r.status == PD_OK && (pl > VENC_MAX_PATH || (k == VENC_MSG_ENCODE && pl == 0)))
        return rd_fail(&r, PD_ERR_RANGE, "path length %" PRIu32 " (1..%u)", pl, VENC_MAX_PATH);
    rd_span(&r, "path", pl, &p);
    if (r.status == PD_OK && p && memchr(p, 0, pl))
        return rd_fail(&r, PD_ERR_FORMAT, "path holds a NUL byte");
    if (rd_expect_end(&r) != PD_OK)
        return r.status;
    *kind = k;
    *id = i;
    *path = (const char *)p;
    *path_len = pl;
    return PD_OK;
}

pd_status venc_msg_reply(uint64_t id, pd_status st, const char *msg, const venc_out *out,
                         uint32_t width, uint8_t **buf, size_t *len, pd_err *err)
{
    size_t ml = st == PD_OK || !msg ? 0 : strlen(msg);
    if (ml > 511)
        ml = 511;
    wr w;
    pd_status ws = wr_init_buffer(&w, 32 + ml + (st == PD_OK && out ? out->rows * width * 4 : 0), err);
    if (ws != PD_OK)
        return ws;
    wr_u32(&w, VENC_MAGIC_REP);
    wr_u64(&w, id);
    wr_u32(&w, (uint32_t)st);
    wr_u32(&w, (uint32_t)ml);
    wr_bytes(&w, msg, ml);
    if (st == PD_OK) {
        wr_u32(&w, width);
        wr_u32(&w, (uint32_t)out->n_pieces);
        for (size_t k = 0; k < out->n_pieces; k++) {
            const venc_piece *pc = &out->pieces[k];
            wr_u8(&w, pc->image ? 1 : 0);
            wr_u32(&w, pc->n);
            if (pc->image)
                wr_f32_n(&w, pc->rows, (size_t)pc->n * width);
            else
                for (uint32_t j = 0; j < pc->n; j++)
                    wr_u32(&w, (uint32_t)pc->tokens[j]);
        }
    }
    ws = w.status;
    if (ws == PD_OK && !(*buf = wr_take(&w, len)))
        ws = pd_err_set(err, PD_ERR_NOMEM, "encoder reply: no memory");
    wr_dispose(&w);
    return ws;
}

pd_status venc_msg_parse_reply(const void *buf, size_t len, uint32_t width, uint64_t *id,
                               venc_out *out, pd_err *enc_err, pd_err *err)
{
    *out = (venc_out){0};
    rd r;
    rd_init(&r, buf, len, 0, "encoder reply", err);
    uint32_t magic = 0, est = 0, ml = 0, w = 0, k = 0;
    uint64_t i = 0;
    const uint8_t *m = NULL;
    rd_u32(&r, "magic", &magic);
    if (r.status == PD_OK && magic != VENC_MAGIC_REP)
        return rd_fail(&r, PD_ERR_FORMAT, "magic 0x%08" PRIx32 " is not PDIR", magic);
    rd_u64(&r, "id", &i);
    rd_u32(&r, "status", &est);
    if (r.status == PD_OK && est >= PD_STATUS_COUNT)
        return rd_fail(&r, PD_ERR_FORMAT, "status %" PRIu32 " is not a pipedec status", est);
    rd_u32(&r, "message length", &ml);
    if (r.status == PD_OK && ml > 511)
        return rd_fail(&r, PD_ERR_RANGE, "message length %" PRIu32 " (at most 511)", ml);
    rd_span(&r, "message", ml, &m);
    if (r.status != PD_OK)
        return r.status;
    *id = i;
    if (est != PD_OK) {
        if (rd_expect_end(&r) != PD_OK)
            return r.status;
        pd_err_set(enc_err, (pd_status)est, "%.*s", (int)ml, (const char *)m);
        return PD_OK;
    }
    rd_u32(&r, "width", &w);
    if (r.status == PD_OK && w != width)
        return rd_fail(&r, PD_ERR_MISMATCH, "rows %" PRIu32 " wide, this model's are %" PRIu32, w, width);
    rd_u32(&r, "pieces", &k);
    if (r.status == PD_OK && (k == 0 || k > VENC_MAX_PIECES))
        return rd_fail(&r, PD_ERR_RANGE, "%" PRIu32 " pieces (1..%u)", k, VENC_MAX_PIECES);
    if (r.status != PD_OK)
        return r.status;
    out->pieces = calloc(k, sizeof *out->pieces);
    if (!out->pieces)
        return pd_err_set(err, PD_ERR_NOMEM, "encoder reply: no memory");
    pd_status st = PD_OK;
    for (uint32_t j = 0; j < k && st == PD_OK; j++) {
        venc_piece *pc = &out->pieces[j];
        uint8_t kind = 0;
        uint32_t n = 0;
        rd_u8(&r, "piece kind", &kind);
        if (r.status == PD_OK && kind > 1) {
            st = rd_fail(&r, PD_ERR_FORMAT, "piece %" PRIu32 ": kind %u (0 text, 1 image)", j, kind);
            break;
        }
        rd_u32(&r, "piece rows", &n);
        size_t elem = kind ? (size_t)width * 4 : 4;
        if (r.status == PD_OK && n == 0)
            st = rd_fail(&r, PD_ERR_FORMAT, "piece %" PRIu32 ": 0 rows", j);
        size_t bytes = 0;
        if (st == PD_OK && (st = rd_check_count(&r, "piece rows", n, elem, &bytes)) != PD_OK)
            break;
        if ((st = r.status) != PD_OK)
            break;
        pc->image = kind == 1;
        pc->n = n;
        if (pc->image) {
            pc->rows = malloc((size_t)n * width * sizeof *pc->rows);
            if (!pc->rows) {
                st = pd_err_set(err, PD_ERR_NOMEM, "encoder reply: no memory");
                break;
            }
            if ((st = rd_f32_n(&r, "rows", pc->rows, (size_t)n * width)) != PD_OK)
                break;
            for (size_t x = 0; x < (size_t)n * width; x++)
                if (!isfinite(pc->rows[x])) {
                    st = rd_fail(&r, PD_ERR_FORMAT, "piece %" PRIu32 ": row %zu column %zu is not finite",
                                 j, x / width, x % width);
                    break;
                }
        } else {
            pc->tokens = malloc((size_t)n * sizeof *pc->tokens);
            if (!pc->tokens) {
                st = pd_err_set(err, PD_ERR_NOMEM, "encoder reply: no memory");
                break;
            }
            for (uint32_t t = 0; t < n && st == PD_OK; t++) {
                uint32_t v = 0;
                if ((st = rd_u32(&r, "token", &v)) == PD_OK && v > INT32_MAX)
                    st = rd_fail(&r, PD_ERR_RANGE, "piece %" PRIu32 ": token %" PRIu32, j, v);
                pc->tokens[t] = (int32_t)v;
            }
        }
        out->n_pieces++;
        out->rows += n;
    }
    if (st == PD_OK)
        st = rd_expect_end(&r);
    if (st != PD_OK)
        venc_out_free(out);
    return st;
}
