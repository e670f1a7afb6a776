/* The R-SWA ring cache of one (stream, layer): reference block, W-slot ring,
 * draft spill slots, checkpoint / rollback. (Stub: implementation follows.) */
#include "cache/ring_layer.h"

#include <stdlib.h>

pd_status ring_layer_new(const ring_layer_config *cfg, ring_layer **out, pd_err *err)
{
    (void)cfg;
    (void)out;
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "ring_layer: not implemented yet");
}

void ring_layer_free(ring_layer *r)
{
    (void)r;
}
