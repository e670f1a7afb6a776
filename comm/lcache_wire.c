/* lcache_wire: CMFS records of layer cache containers (see lcache_wire.h). */
#include "comm/lcache_wire.h"

#include "comm/wire.h"

#include <stdlib.h>

wire_layer_ref lcache_wire_ref(const lcache *c, uint64_t identity, uint32_t layer, kv_layer_config *kc)
{
    wire_layer_ref ref = {.identity = identity, .layer = layer};
    if (lcache_ring(c)) {
        ref.ring = lcache_ring(c);
    } else {
        ref.kv = lcache_kv(c);
        lcache_kv_config(c, kc);
        ref.kv_cfg = kc;
    }
    return ref;
}

pd_status lcache_wire_export(const lcache *c, uint64_t identity, uint32_t layer, int f16, uint8_t **out,
                             size_t *len, pd_err *err)
{
    kv_layer_config kc;
    wire_layer_ref ref = lcache_wire_ref(c, identity, layer, &kc);
    return wire_export(&ref, f16, out, len, err);
}

struct lcache_wire_pending {
    lcache *c;
    uint64_t pos;
    wire_pending *wp;
};

pd_status lcache_wire_prepare(lcache *c, uint64_t identity, uint32_t layer, uint64_t pos, const void *buf,
                              size_t len, size_t base_offset, lcache_wire_pending **out, pd_err *err)
{
    if (lcache_group_open(c))
        return pd_err_set(err, PD_ERR_ARG, "layer cache: import while a group is open");
    wire_info wi;
    pd_status rc = wire_header_decode(buf, len, base_offset, &wi, err);
    if (rc != PD_OK)
        return rc;
    if ((rc = lcache_adopt_check(c, wi.position, pos, err)) != PD_OK)
        return rc;
    lcache_wire_pending *p = malloc(sizeof *p);
    if (!p)
        return pd_err_set(err, PD_ERR_NOMEM, "layer cache: no memory for an import");
    kv_layer_config kc;
    wire_layer_ref ref = lcache_wire_ref(c, identity, layer, &kc);
    *p = (lcache_wire_pending){.c = c, .pos = pos};
    if ((rc = wire_import_prepare(&ref, buf, len, 0, base_offset, &p->wp, err)) != PD_OK) {
        free(p);
        return rc;
    }
    *out = p;
    return PD_OK;
}

void lcache_wire_commit(lcache_wire_pending *p)
{
    wire_import_commit(p->wp);
    lcache_adopt(p->c, p->pos);
    free(p);
}

void lcache_wire_pending_free(lcache_wire_pending *p)
{
    if (!p)
        return;
    wire_pending_free(p->wp);
    free(p);
}

pd_status lcache_wire_import(lcache *c, uint64_t identity, uint32_t layer, uint64_t pos, const void *buf,
                             size_t len, size_t base_offset, pd_err *err)
{
    lcache_wire_pending *p = NULL;
    pd_status rc = lcache_wire_prepare(c, identity, layer, pos, buf, len, base_offset, &p, err);
    if (rc == PD_OK)
        lcache_wire_commit(p);
    return rc;
}
