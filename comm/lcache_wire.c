/* lcache_wire: CMFS records of layer cache containers (see lcache_wire.h). */
#include "comm/lcache_wire.h"

#include "comm/wire.h"

/* The wire's view of c's implementation object. kc receives the kv
 * configuration (the wire sizes and rebuilds a kv layer from it). */
static wire_layer_ref ref_of(const lcache *c, uint64_t identity, uint32_t layer, kv_layer_config *kc)
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
    wire_layer_ref ref = ref_of(c, identity, layer, &kc);
    return wire_export(&ref, f16, out, len, err);
}

pd_status lcache_wire_import(lcache *c, uint64_t identity, uint32_t layer, uint64_t pos, const void *buf,
                             size_t len, size_t base_offset, pd_err *err)
{
    if (lcache_group_open(c))
        return pd_err_set(err, PD_ERR_ARG, "layer cache: import while a group is open");
    wire_info wi;
    pd_status rc = wire_header_decode(buf, len, base_offset, &wi, err);
    if (rc != PD_OK)
        return rc;
    if ((rc = lcache_adopt_check(c, wi.position, pos, err)) != PD_OK)
        return rc;
    kv_layer_config kc;
    wire_layer_ref ref = ref_of(c, identity, layer, &kc);
    if ((rc = wire_import(&ref, buf, len, 0, base_offset, err)) != PD_OK)
        return rc;
    lcache_adopt(c, pos);
    return PD_OK;
}
