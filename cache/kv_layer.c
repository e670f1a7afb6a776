/* kv_layer: the per-(stream, layer) KV cache (see kv_layer.h).
 * STUB: the public API compiles; the implementation follows. */
#include "cache/kv_layer.h"

#include <string.h>

pd_status kv_layer_new(const kv_layer_config *cfg, kv_layer **out, pd_err *err)
{
    (void)cfg;
    (void)out;
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv_layer: not implemented yet");
}
void kv_layer_free(kv_layer *l) { (void)l; }
pd_status kv_layer_append(kv_layer *l, const float *k, const float *v, pd_err *err)
{
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv_layer: not implemented yet");
}
pd_status kv_layer_append_rows(kv_layer *l, uint32_t n, const float *k, const float *v,
                               pd_err *err)
{
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv_layer: not implemented yet");
}
size_t kv_layer_scratch_floats(const kv_layer *l, uint32_t n_q) { return 0; }
pd_status kv_layer_attend(kv_layer *l, const kv_attend *a, uint32_t *span_out, pd_err *err)
{
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv_layer: not implemented yet");
}
pd_status kv_layer_set_sinks(kv_layer *l, const float *sinks, uint32_t n_q_heads, pd_err *err)
{
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv_layer: not implemented yet");
}
void kv_layer_importance(const kv_layer *l, float *out) {}
void kv_layer_confirm(kv_layer *l, uint64_t pos) {}
pd_status kv_layer_truncate_last(kv_layer *l, uint64_t n, pd_err *err)
{
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv_layer: not implemented yet");
}
void kv_layer_clear(kv_layer *l) {}
uint64_t kv_layer_evict_recent(kv_layer *l, uint64_t keep_last) { return 0; }
uint64_t kv_layer_evict_importance(kv_layer *l, uint64_t budget, uint64_t sinks, uint64_t recent)
{
    return 0;
}
uint64_t kv_layer_trim_window(kv_layer *l, uint64_t w, uint64_t slack, uint64_t align) { return 0; }
uint64_t kv_layer_trim_window_anchored(kv_layer *l, uint64_t w, uint64_t slack, uint64_t align,
                                       uint64_t anchor)
{
    return 0;
}
pd_status kv_layer_set_linear(kv_layer *l, const float *x, uint64_t n, pd_err *err)
{
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv_layer: not implemented yet");
}
pd_status kv_layer_install_bounded(kv_layer *l, uint32_t window, pd_err *err)
{
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv_layer: not implemented yet");
}
pd_status kv_layer_bounded_insert(kv_layer *l, const float *k, const float *v, pd_err *err)
{
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv_layer: not implemented yet");
}
uint64_t kv_layer_rows(const kv_layer *l) { return 0; }
uint64_t kv_layer_base(const kv_layer *l) { return 0; }
uint64_t kv_layer_pos_len(const kv_layer *l) { return 0; }
uint64_t kv_layer_tail_window(const kv_layer *l) { return 0; }
kv_mode kv_layer_mode(const kv_layer *l) { return KV_MODE_F32; }
int kv_layer_frozen(const kv_layer *l) { return 0; }
uint64_t kv_layer_generation(const kv_layer *l) { return 0; }
void kv_layer_memory(const kv_layer *l, kv_memory *out) { memset(out, 0, sizeof *out); }
void kv_layer_check(const kv_layer *l) {}
void kv_layer_state(const kv_layer *l, kv_state *out, kv_head_state *heads)
{
    memset(out, 0, sizeof *out);
}
pd_status kv_layer_new_from_state(const kv_layer_config *cfg, const kv_state *s, kv_layer **out,
                                  pd_err *err)
{
    return pd_err_set(err, PD_ERR_UNSUPPORTED, "kv_layer: not implemented yet");
}
void kv_layer_swap(kv_layer *a, kv_layer *b) {}
