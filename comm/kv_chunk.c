/* kv_chunk: rows of a kv layer as a message and back (contract and byte
 * layout in kv_chunk.h). */
#include "comm/kv_chunk.h"

#include "base/check.h"
#include "cache/quant.h"
#include "comm/crc32c.h"
#include "comm/rd.h"

#include <stdlib.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
#define KC_HOST_LE 1
#else
#define KC_HOST_LE 0
#endif

static const uint8_t kc_magic[4] = {'P', 'D', 'K', 'C'};
#define KC_VERSION 1u

static int kc_qk(kv_mode m) { return (m & KV_MODE_Q8K) != 0; }
static int kc_qv(kv_mode m) { return (m & KV_MODE_Q8V) != 0; }
static size_t pad8(size_t n) { return (n + 7) & ~(size_t)7; }
static size_t pad4(size_t n) { return (n + 3) & ~(size_t)3; }

/* Bytes of one alive head's rows for n rows (each section padded to 4). */
static int head_row_bytes(kv_mode m, uint32_t hd, uint64_t n, uint64_t *out)
{
    uint64_t ngk = quant_groups(hd, KV_K_GROUP);
    if (n > (UINT64_MAX / 16) / ((uint64_t)hd + ngk + 2))
        return 0;
    uint64_t b = kc_qk(m) ? pad4(n * hd) + 4 * n * ngk : 4 * n * hd;
    b += kc_qv(m) ? pad4(n * hd) + 4 * n : 4 * n * hd;
    *out = b;
    return 1;
}

static uint64_t field_bytes(kv_mode m, uint32_t hd, int frozen)
{
    return frozen ? (uint64_t)4 * hd * (uint64_t)(kc_qk(m) + kc_qv(m)) : 0;
}

/* Size of a chunk from its header figures; 0 when it overflows. */
static uint64_t chunk_bytes(uint32_t n_kv, uint32_t n_alive, uint32_t hd, kv_mode mode, int frozen, uint64_t n,
                            uint64_t n_imp, uint64_t n_linear)
{
    uint64_t per;
    if (!head_row_bytes(mode, hd, n, &per) || n_imp > UINT64_MAX / 16 || n_linear > UINT64_MAX / 16)
        return 0;
    uint64_t fb = field_bytes(mode, hd, frozen);
    if (per && n_alive > (UINT64_MAX / 4) / (per + fb + 1))
        return 0;
    uint64_t b = KV_CHUNK_HEADER + pad8(n_kv) + (uint64_t)n_alive * (fb + per);
    if (b > UINT64_MAX / 2 - 4 * (n_imp + n_linear) - 4)
        return 0;
    return b + 4 * (n_imp + n_linear) + 4;
}

static void put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static void put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t get64(const uint8_t *p) { return (uint64_t)get32(p) | (uint64_t)get32(p + 4) << 32; }

pd_status kv_chunk_size(const kv_layer *l, uint64_t row0, uint64_t n, uint32_t flags, size_t *size, pd_err *err)
{
    kv_layer_config cfg;
    kv_layer_config_get(l, &cfg);
    kv_state s;
    kv_head_state *hs = calloc(cfg.n_kv_heads, sizeof *hs);
    if (!hs)
        return pd_err_set(err, PD_ERR_NOMEM, "kv chunk: out of memory");
    kv_layer_state(l, &s, hs);
    free(hs);
    if (row0 > s.rows || n > s.rows - row0)
        return pd_err_set(err, PD_ERR_RANGE, "kv chunk: rows %llu-%llu, the layer holds %llu",
                          (unsigned long long)row0, (unsigned long long)(row0 + n), (unsigned long long)s.rows);
    uint32_t alive = 0;
    for (uint32_t h = 0; h < s.n_kv_heads; h++)
        alive += s.alive[h] != 0;
    int fin = (flags & KV_CHUNK_FINAL) != 0;
    uint64_t b = chunk_bytes(s.n_kv_heads, alive, s.head_dim, s.mode, s.frozen, n, fin ? s.rows : 0,
                             fin ? s.n_linear : 0);
    if (b == 0 || b > SIZE_MAX)
        return pd_err_set(err, PD_ERR_RANGE, "kv chunk: %llu rows do not fit in memory", (unsigned long long)n);
    *size = (size_t)b;
    return PD_OK;
}

static uint8_t *put_rows(uint8_t *p, const void *src, size_t row_bytes, uint64_t row0, uint64_t n, int pad)
{
    size_t b = row_bytes * (size_t)n;
    if (b)
        memcpy(p, (const uint8_t *)src + row_bytes * (size_t)row0, b);
    if (pad) {
        memset(p + b, 0, pad4(b) - b);
        b = pad4(b);
    }
    return p + b;
}

pd_status kv_chunk_encode(const kv_layer *l, uint64_t identity, uint32_t layer, uint64_t stream, uint64_t row0,
                          uint64_t n, uint32_t flags, void *buf, size_t cap, size_t *len, pd_err *err)
{
    if (!KC_HOST_LE)
        return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv chunk: a big-endian host cannot send rows as stored");
    if ((flags & ~(KV_CHUNK_RESET | KV_CHUNK_FINAL)) || ((flags & KV_CHUNK_RESET) != 0) != (row0 == 0))
        return pd_err_set(err, PD_ERR_ARG, "kv chunk: flags %u with row0 %llu", flags, (unsigned long long)row0);
    size_t size;
    pd_status st = kv_chunk_size(l, row0, n, flags, &size, err);
    if (st)
        return st;
    if (size > cap)
        return pd_err_set(err, PD_ERR_RANGE, "kv chunk: %zu bytes, the buffer holds %zu", size, cap);
    kv_layer_config cfg;
    kv_layer_config_get(l, &cfg);
    kv_head_state *hs = calloc(cfg.n_kv_heads, sizeof *hs);
    if (!hs)
        return pd_err_set(err, PD_ERR_NOMEM, "kv chunk: out of memory");
    kv_state s;
    kv_layer_state(l, &s, hs);
    int fin = (flags & KV_CHUNK_FINAL) != 0;
    if (fin && s.imp_pending) {
        free(hs);
        return pd_err_set(err, PD_ERR_REFUSED, "kv chunk: %u query positions of importance pending", s.imp_pending);
    }
    uint8_t *p = buf;
    memset(p, 0, KV_CHUNK_HEADER);
    memcpy(p, kc_magic, 4);
    put32(p + 4, KC_VERSION);
    put32(p + 8, flags);
    put32(p + 12, layer);
    put64(p + 16, identity);
    put64(p + 24, stream);
    put64(p + 32, row0);
    put64(p + 40, n);
    put64(p + 48, s.base);
    put32(p + 56, s.n_kv_heads);
    put32(p + 60, s.head_dim);
    put32(p + 64, (uint32_t)s.mode);
    put32(p + 68, (uint32_t)s.frozen);
    put32(p + 72, s.tail_window);
    put32(p + 76, s.freeze_rows);
    put64(p + 80, fin ? s.rows : 0);
    put64(p + 88, fin ? s.n_linear : 0);
    p += KV_CHUNK_HEADER;
    memset(p, 0, pad8(s.n_kv_heads));
    for (uint32_t h = 0; h < s.n_kv_heads; h++)
        p[h] = s.alive[h] != 0;
    p += pad8(s.n_kv_heads);
    const size_t hd = s.head_dim, ngk = quant_groups(s.head_dim, KV_K_GROUP);
    for (uint32_t h = 0; h < s.n_kv_heads && s.frozen; h++) {
        if (!s.alive[h])
            continue;
        if (kc_qk(s.mode))
            p = put_rows(p, hs[h].kcol, 4 * hd, 0, 1, 0);
        if (kc_qv(s.mode))
            p = put_rows(p, hs[h].vcol, 4 * hd, 0, 1, 0);
    }
    for (uint32_t h = 0; h < s.n_kv_heads; h++) {
        if (!s.alive[h])
            continue;
        if (kc_qk(s.mode)) {
            p = put_rows(p, hs[h].kq, hd, row0, n, 1);
            p = put_rows(p, hs[h].ks, 4 * ngk, row0, n, 0);
        } else
            p = put_rows(p, hs[h].k, 4 * hd, row0, n, 0);
        if (kc_qv(s.mode)) {
            p = put_rows(p, hs[h].vq, hd, row0, n, 1);
            p = put_rows(p, hs[h].vs, 4, row0, n, 0);
        } else
            p = put_rows(p, hs[h].v, 4 * hd, row0, n, 0);
    }
    if (fin) {
        p = put_rows(p, s.imp, 4, 0, s.rows, 0);
        p = put_rows(p, s.linear, 4, 0, s.n_linear, 0);
    }
    free(hs);
    size_t body = (size_t)(p - (uint8_t *)buf);
    put32(p, crc32c_update(0, buf, body));
    *len = body + 4;
    CHECKF(*len == size, "kv chunk: %zu bytes written, %zu computed", *len, size);
    return PD_OK;
}

pd_status kv_chunk_peek(const void *buf, size_t len, kv_chunk_info *info, pd_err *err)
{
    const uint8_t *p = buf;
    if (len < KV_CHUNK_HEADER + 4)
        return pd_err_set(err, PD_ERR_TRUNCATED, "kv chunk: %zu bytes, the header alone takes %u", len,
                          KV_CHUNK_HEADER + 4);
    if (memcmp(p, kc_magic, 4) != 0)
        return pd_err_set(err, PD_ERR_FORMAT, "kv chunk: bad magic at offset 0");
    if (get32(p + 4) != KC_VERSION)
        return pd_err_set(err, PD_ERR_VERSION, "kv chunk: version %u at offset 4, this build reads %u", get32(p + 4),
                          KC_VERSION);
    uint32_t crc = crc32c_update(0, p, len - 4);
    if (crc != get32(p + len - 4))
        return pd_err_set(err, PD_ERR_CHECKSUM, "kv chunk: CRC32C %08x at offset %zu, the bytes give %08x",
                          get32(p + len - 4), len - 4, crc);
    *info = (kv_chunk_info){.flags = get32(p + 8),
                            .layer = get32(p + 12),
                            .identity = get64(p + 16),
                            .stream = get64(p + 24),
                            .row0 = get64(p + 32),
                            .n_rows = get64(p + 40)};
    if (info->flags & ~(KV_CHUNK_RESET | KV_CHUNK_FINAL))
        return pd_err_set(err, PD_ERR_FORMAT, "kv chunk: unknown flags %u at offset 8", info->flags);
    if (((info->flags & KV_CHUNK_RESET) != 0) != (info->row0 == 0))
        return pd_err_set(err, PD_ERR_FORMAT, "kv chunk: row0 %llu at offset 32 with flags %u",
                          (unsigned long long)info->row0, info->flags);
    return PD_OK;
}

/* Takes a section of n elements of `size` bytes (padded to 4 when pad) at
 * *off; f32 sections are checked finite. */
static pd_status take(const uint8_t *base, size_t len, size_t *off, uint64_t n, size_t size, int pad, int f32,
                      const char *what, uint32_t head, const void **out, pd_err *err)
{
    uint64_t b = n * size;
    if (pad)
        b = pad4(b);
    if (b > len - 4 - *off)
        return pd_err_set(err, PD_ERR_TRUNCATED, "kv chunk: %s of head %u at offset %zu: %llu bytes, %zu left", what,
                          head, *off, (unsigned long long)b, len - 4 - *off);
    const uint8_t *p = base + *off;
    for (uint64_t i = n * size; i < b; i++)
        if (p[i])
            return pd_err_set(err, PD_ERR_FORMAT, "kv chunk: %s of head %u: padding byte at offset %zu is not 0", what,
                              head, *off + (size_t)i);
    if (f32) {
        size_t bad = rd_f32_first_nonfinite((const float *)(const void *)p, (size_t)n);
        if (bad < n)
            return pd_err_set(err, PD_ERR_FORMAT, "kv chunk: %s of head %u: a NaN or infinity at offset %zu", what,
                              head, *off + 4 * bad);
    }
    *out = p;
    *off += (size_t)b;
    return PD_OK;
}

/* A chunk's header fields as kv_chunk_decode reads them (offsets in
 * kv_chunk.h's table). */
typedef struct kc_hdr {
    uint32_t n_kv, hd, mode, frozen, fr;
    uint64_t n, n_imp, n_lin;
    int fin;
    const uint8_t *alive; /* [n_kv] */
} kc_hdr;

/* The header against the layer's configuration, the alive mask, and the
 * chunk's length against what its counts take; fills *h. */
static pd_status kc_check(const uint8_t *p, size_t len, const kv_layer_config *cfg, const kv_chunk_info *in,
                          kc_hdr *h, pd_err *err)
{
    *h = (kc_hdr){.n_kv = get32(p + 56), .hd = get32(p + 60), .mode = get32(p + 64), .frozen = get32(p + 68),
                  .fr = cfg->freeze_rows ? cfg->freeze_rows : 64};
    uint32_t n_kv = h->n_kv, hd = h->hd, mode = h->mode, frozen = h->frozen;
    if (n_kv != cfg->n_kv_heads || hd != cfg->head_dim)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv chunk: %u kv heads x %u (offset 56), the layer has %u x %u", n_kv,
                          hd, cfg->n_kv_heads, cfg->head_dim);
    if (mode != (uint32_t)cfg->mode)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv chunk: mode %u at offset 64, the layer's is %u", mode,
                          (unsigned)cfg->mode);
    if (frozen > 1 || (frozen && mode == KV_MODE_F32))
        return pd_err_set(err, PD_ERR_FORMAT, "kv chunk: frozen %u at offset 68 for mode %u", frozen, mode);
    if (get32(p + 76) != h->fr)
        return pd_err_set(err, PD_ERR_MISMATCH, "kv chunk: freeze rows %u at offset 76, the layer's are %u",
                          get32(p + 76), h->fr);
    h->n = in->n_rows;
    h->n_imp = get64(p + 80);
    h->n_lin = get64(p + 88);
    h->fin = (in->flags & KV_CHUNK_FINAL) != 0;
    if (!h->fin && (h->n_imp || h->n_lin))
        return pd_err_set(err, PD_ERR_FORMAT, "kv chunk: importance or recurrent counts (offset 80) without FINAL");
    if (h->fin && (in->row0 > UINT64_MAX - h->n || h->n_imp != in->row0 + h->n))
        return pd_err_set(err, PD_ERR_FORMAT, "kv chunk: importance count %llu at offset 80 for rows 0-%llu",
                          (unsigned long long)h->n_imp, (unsigned long long)(in->row0 + h->n));
    if (pad8(n_kv) > len - 4 - KV_CHUNK_HEADER)
        return pd_err_set(err, PD_ERR_TRUNCATED, "kv chunk: alive mask at offset %u", KV_CHUNK_HEADER);
    const uint8_t *alive = p + KV_CHUNK_HEADER;
    for (size_t i = n_kv; i < pad8(n_kv); i++)
        if (alive[i])
            return pd_err_set(err, PD_ERR_FORMAT, "kv chunk: padding byte at offset %zu is not 0", KV_CHUNK_HEADER + i);
    uint32_t n_alive = 0;
    for (uint32_t k = 0; k < n_kv; k++) {
        int want = cfg->alive ? cfg->alive[k] != 0 : 1;
        if (alive[k] > 1 || alive[k] != want)
            return pd_err_set(err, PD_ERR_MISMATCH, "kv chunk: alive[%u] = %u at offset %u, the layer says %d", k,
                              alive[k], KV_CHUNK_HEADER + k, want);
        n_alive += alive[k];
    }
    h->alive = alive;
    uint64_t want = chunk_bytes(n_kv, n_alive, hd, (kv_mode)mode, (int)frozen, h->n, h->n_imp, h->n_lin);
    if (want == 0 || want != len)
        return pd_err_set(err, want > len || want == 0 ? PD_ERR_TRUNCATED : PD_ERR_FORMAT,
                          "kv chunk: %llu rows (offset 40) and counts take %llu bytes, the chunk has %zu",
                          (unsigned long long)h->n, (unsigned long long)want, len);
    return PD_OK;
}

/* Every alive head's per-channel fields (frozen int8 modes), then its K and
 * V rows and scales, as pointers into the chunk from *off on. */
static pd_status kc_take_heads(const uint8_t *p, size_t len, size_t *off, const kc_hdr *hh, kv_head_state *heads,
                               pd_err *err)
{
    const uint32_t hd = hh->hd;
    const uint64_t n = hh->n;
    const kv_mode mode = (kv_mode)hh->mode;
    const size_t ngk = quant_groups(hd, KV_K_GROUP);
    pd_status st;
    for (uint32_t h = 0; h < hh->n_kv; h++) {
        heads[h] = (kv_head_state){0};
        if (!hh->alive[h] || !hh->frozen)
            continue;
        const void *q = NULL;
        if (kc_qk(mode)) {
            if ((st = take(p, len, off, hd, 4, 0, 1, "K field", h, &q, err)))
                return st;
            heads[h].kcol = q;
        }
        if (kc_qv(mode)) {
            if ((st = take(p, len, off, hd, 4, 0, 1, "V field", h, &q, err)))
                return st;
            heads[h].vcol = q;
        }
    }
    for (uint32_t h = 0; h < hh->n_kv; h++) {
        if (!hh->alive[h])
            continue;
        const void *q = NULL;
        if (kc_qk(mode)) {
            if ((st = take(p, len, off, n * hd, 1, 1, 0, "K rows", h, &q, err)))
                return st;
            heads[h].kq = q;
            if ((st = take(p, len, off, n * ngk, 4, 0, 1, "K scales", h, &q, err)))
                return st;
            heads[h].ks = q;
        } else {
            if ((st = take(p, len, off, n * hd, 4, 0, 1, "K rows", h, &q, err)))
                return st;
            heads[h].k = q;
        }
        if (kc_qv(mode)) {
            if ((st = take(p, len, off, n * hd, 1, 1, 0, "V rows", h, &q, err)))
                return st;
            heads[h].vq = q;
            if ((st = take(p, len, off, n, 4, 0, 1, "V scales", h, &q, err)))
                return st;
            heads[h].vs = q;
        } else {
            if ((st = take(p, len, off, n * hd, 4, 0, 1, "V rows", h, &q, err)))
                return st;
            heads[h].v = q;
        }
    }
    return PD_OK;
}

pd_status kv_chunk_decode(const void *buf, size_t len, const kv_layer_config *cfg, kv_head_state *heads,
                          kv_chunk_view *v, pd_err *err)
{
    if (!KC_HOST_LE)
        return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv chunk: a big-endian host cannot take rows as stored");
    if ((uintptr_t)buf % 4)
        return pd_err_set(err, PD_ERR_ARG, "kv chunk: buffer not 4-byte aligned");
    memset(v, 0, sizeof *v);
    pd_status st = kv_chunk_peek(buf, len, &v->info, err);
    if (st)
        return st;
    const uint8_t *p = buf;
    kc_hdr h;
    if ((st = kc_check(p, len, cfg, &v->info, &h, err)))
        return st;
    size_t off = KV_CHUNK_HEADER + pad8(h.n_kv);
    if ((st = kc_take_heads(p, len, &off, &h, heads, err)))
        return st;
    const void *q = NULL;
    if (h.fin && (st = take(p, len, &off, h.n_imp, 4, 0, 1, "importance", 0, &q, err)))
        return st;
    v->imp = q;
    v->n_imp = h.fin ? h.n_imp : 0;
    q = NULL;
    if (h.fin && (st = take(p, len, &off, h.n_lin, 4, 0, 1, "recurrent records", 0, &q, err)))
        return st;
    v->linear = q;
    v->n_linear = h.fin ? h.n_lin : 0;
    CHECKF(off + 4 == len, "kv chunk: %zu bytes taken of %zu", off + 4, len);
    v->rows = (kv_state){.n_kv_heads = h.n_kv,
                         .head_dim = h.hd,
                         .k_group = KV_K_GROUP,
                         .freeze_rows = h.fr,
                         .mode = (kv_mode)h.mode,
                         .alive = h.alive,
                         .rows = h.n,
                         .base = get64(p + 48),
                         .tail_window = get32(p + 72),
                         .frozen = (int)h.frozen,
                         .heads = heads};
    return PD_OK;
}

pd_status kv_chunk_apply(kv_layer *l, const kv_chunk_view *v, pd_err *err)
{
    const kv_chunk_info *in = &v->info;
    int fin = (in->flags & KV_CHUNK_FINAL) != 0;
    pd_status st;
    if (in->flags & KV_CHUNK_RESET) {
        kv_state s = v->rows;
        if (fin) { /* the whole layer in one chunk: importance and records with it */
            s.imp = v->imp;
            s.n_imp = v->n_imp;
            s.linear = v->linear;
            s.n_linear = v->n_linear;
        }
        st = kv_layer_assign_state(l, &s, err);
        if (st == PD_OK && fin && !v->n_linear)
            st = kv_layer_set_linear(l, NULL, 0, err);
        return st;
    }
    if (kv_layer_rows(l) != in->row0)
        return pd_err_set(err, PD_ERR_FORMAT, "kv chunk: rows from %llu, the copy holds %llu",
                          (unsigned long long)in->row0, (unsigned long long)kv_layer_rows(l));
    if ((st = kv_layer_append_state(l, &v->rows, err)))
        return st;
    if (!fin)
        return PD_OK;
    if ((st = kv_layer_set_importance(l, v->imp, v->n_imp, err)))
        return st;
    return kv_layer_set_linear(l, v->linear, v->n_linear, err);
}
