/* cost: per-part work counted from a GGUF tensor directory, and the rule that
 * turns it into a predicted step time. */
#include "cluster/model/cost.h"

#include "base/check.h"
#include "cluster/format/gguf.h"
#include "cluster/model/model.h"

#include <stdio.h>
#include <stdlib.h>

/* INV: layer has n_layers entries; every count fits the model's shapes. */
struct cost_table {
    uint32_t n_layers, ctx;
    cost_part head, tail;
    cost_part layer[];
};

void cost_rule_default(cost_rule *r)
{
    *r = (cost_rule){.bandwidth = COST_BANDWIDTH,
                     .peak = COST_PEAK,
                     .rows = COST_ROWS,
                     .depth = COST_DEPTH,
                     .kv_value_bytes = COST_KV_VALUE_BYTES};
}

static int positive_finite(double x)
{
    return x > 0.0 && x <= 1e300; /* false for NaN and infinity */
}

pd_status cost_rule_validate(const cost_rule *r, pd_err *err)
{
    if (!positive_finite(r->bandwidth))
        return pd_err_set(err, PD_ERR_ARG, "cost rule: bandwidth %g B/s is not a positive number", r->bandwidth);
    if (!positive_finite(r->peak))
        return pd_err_set(err, PD_ERR_ARG, "cost rule: peak %g FLOP/s is not a positive number", r->peak);
    if (!positive_finite(r->kv_value_bytes))
        return pd_err_set(err, PD_ERR_ARG, "cost rule: kv_value_bytes %g is not a positive number",
                          r->kv_value_bytes);
    if (r->rows == 0)
        return pd_err_set(err, PD_ERR_ARG, "cost rule: rows is 0 (a step has at least one row)");
    return PD_OK;
}

double cost_part_seconds(const cost_part *p, const cost_rule *r, uint32_t depth)
{
    double rows = (double)r->rows, d = (double)depth;
    double bytes = (double)p->weight_bytes +
                   rows * ((double)p->row_bytes + d * (double)p->attn_values * r->kv_value_bytes);
    double flops = 2.0 * rows * ((double)p->macs + d * (double)p->attn_macs);
    double t_mem = bytes / r->bandwidth, t_fma = flops / r->peak;
    return t_mem > t_fma ? t_mem : t_fma;
}

/* ---- reading ------------------------------------------------------------ */

/* The tensor `name`, checked as model.c's tensor_get checks it: present,
 * shape [ne0] (ne1 == 0) or [ne0, ne1], a type the model computes with. */
static pd_status cost_tensor(const gguf_file *f, const char *name, uint64_t ne0, uint64_t ne1,
                             const gguf_tensor **out, pd_err *err)
{
    const gguf_tensor *t = gguf_tensor_find(f, name);
    if (!t)
        return pd_err_set(err, PD_ERR_FORMAT, "tensor %s is missing", name);
    uint32_t want_dims = ne1 ? 2 : 1;
    if (t->n_dims != want_dims || t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1))
        return pd_err_set(err, PD_ERR_FORMAT, "tensor %s has shape [%llu, %llu] (%u dims), expected [%llu, %llu]",
                          name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1], t->n_dims,
                          (unsigned long long)ne0, (unsigned long long)(ne1 ? ne1 : 1));
    if (!gguf_type_supported(t->type))
        return pd_err_set(err, PD_ERR_UNSUPPORTED, "tensor %s has type %s; supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K", name,
                          gguf_type_name(t->type));
    *out = t;
    return PD_OK;
}

/* A matrix [in x out] (GGUF ne0 = in): its stored bytes, in x out multiply-adds. */
static pd_status cost_add_mat(const gguf_file *f, const char *name, uint64_t in, uint64_t outn, cost_part *p,
                              pd_err *err)
{
    const gguf_tensor *t = NULL;
    pd_status st = cost_tensor(f, name, in, outn, &t, err);
    if (st)
        return st;
    p->weight_bytes += t->bytes;
    p->macs += in * outn;
    return PD_OK;
}

/* An expert stack [in x outn x n_expert] (model.c's experts_load): every
 * expert's bytes are weights of the step (at the batch sizes the cost rule is
 * made for, most experts are used by some row), but a row multiplies only
 * through its top-k experts: in x outn x k multiply-adds. */
static pd_status cost_add_experts(const gguf_file *f, const char *name, uint64_t in, uint64_t outn,
                                  const model_hparams *hp, cost_part *p, pd_err *err)
{
    const gguf_tensor *t = gguf_tensor_find(f, name);
    if (!t)
        return pd_err_set(err, PD_ERR_FORMAT, "tensor %s is missing", name);
    if (t->n_dims != 3 || t->ne[0] != in || t->ne[1] != outn || t->ne[2] != hp->n_expert)
        return pd_err_set(err, PD_ERR_FORMAT,
                          "tensor %s has shape [%llu, %llu, %llu] (%u dims), expected [%llu, %llu, %u] "
                          "(the last is expert_count)",
                          name, (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
                          (unsigned long long)(t->n_dims > 2 ? t->ne[2] : 1), t->n_dims, (unsigned long long)in,
                          (unsigned long long)outn, hp->n_expert);
    if (!gguf_type_supported(t->type))
        return pd_err_set(err, PD_ERR_UNSUPPORTED, "tensor %s has type %s; supported: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q4_K, q5_K, q6_K", name,
                          gguf_type_name(t->type));
    p->weight_bytes += t->bytes;
    p->macs += in * outn * hp->n_expert_used;
    return PD_OK;
}

/* A norm weight or a bias of n values: kept as f32 whatever its stored type
 * (model.c vec_load), one multiply or add per value. */
static pd_status cost_add_vec(const gguf_file *f, const char *name, uint64_t n, cost_part *p, pd_err *err)
{
    const gguf_tensor *t;
    pd_status st = cost_tensor(f, name, n, 0, &t, err);
    if (st)
        return st;
    p->weight_bytes += n * sizeof(float);
    p->macs += n;
    return PD_OK;
}

/* The tensors model.c's layer_load reads for layer L, nothing else. */
static pd_status cost_layer(const gguf_file *f, const model_hparams *hp, uint32_t L, cost_part *p, pd_err *err)
{
    uint64_t q_out = (uint64_t)hp->n_heads * hp->head_dim, kv_out = (uint64_t)hp->n_kv_heads * hp->head_dim;
    char n[96];
    pd_status st;
#define LNAME(s) (snprintf(n, sizeof n, "blk.%u." s, L), n)
    if ((st = cost_add_vec(f, LNAME("attn_norm.weight"), hp->hidden, p, err)) ||
        (st = cost_add_vec(f, LNAME("ffn_norm.weight"), hp->hidden, p, err)) ||
        (st = cost_add_mat(f, LNAME("attn_q.weight"), hp->hidden, q_out, p, err)) ||
        (st = cost_add_mat(f, LNAME("attn_k.weight"), hp->hidden, kv_out, p, err)) ||
        (st = cost_add_mat(f, LNAME("attn_v.weight"), hp->hidden, kv_out, p, err)) ||
        (st = cost_add_mat(f, LNAME("attn_output.weight"), q_out, hp->hidden, p, err)))
        return st;
    if (model_arch_is_moe(hp->arch) && L >= hp->n_dense_lead) {
        /* MoE: the router, the routed experts (all bytes, top-k active), the
         * shared experts (dense) */
        uint64_t fe = hp->ffn_exp, fs = (uint64_t)hp->ffn_exp * hp->n_expert_shared;
        if ((st = cost_add_mat(f, LNAME("ffn_gate_inp.weight"), hp->hidden, hp->n_expert, p, err)) ||
            (st = cost_add_experts(f, LNAME("ffn_gate_exps.weight"), hp->hidden, fe, hp, p, err)) ||
            (st = cost_add_experts(f, LNAME("ffn_up_exps.weight"), hp->hidden, fe, hp, p, err)) ||
            (st = cost_add_experts(f, LNAME("ffn_down_exps.weight"), fe, hp->hidden, hp, p, err)) ||
            (st = cost_add_mat(f, LNAME("ffn_gate_shexp.weight"), hp->hidden, fs, p, err)) ||
            (st = cost_add_mat(f, LNAME("ffn_up_shexp.weight"), hp->hidden, fs, p, err)) ||
            (st = cost_add_mat(f, LNAME("ffn_down_shexp.weight"), fs, hp->hidden, p, err)))
            return st;
    } else if ((st = cost_add_mat(f, LNAME("ffn_gate.weight"), hp->hidden, hp->ffn, p, err)) ||
               (st = cost_add_mat(f, LNAME("ffn_up.weight"), hp->hidden, hp->ffn, p, err)) ||
               (st = cost_add_mat(f, LNAME("ffn_down.weight"), hp->ffn, hp->hidden, p, err)))
        return st;
    if (hp->qkv_bias &&
        ((st = cost_add_vec(f, LNAME("attn_q.bias"), q_out, p, err)) ||
         (st = cost_add_vec(f, LNAME("attn_k.bias"), kv_out, p, err)) ||
         (st = cost_add_vec(f, LNAME("attn_v.bias"), kv_out, p, err))))
        return st;
#undef LNAME
    p->attn_values = 2 * kv_out;
    p->attn_macs = 2 * q_out;
    return PD_OK;
}

static pd_status cost_read_file(const gguf_file *f, const model_hparams *hp, cost_table *t, pd_err *err)
{
    pd_status st;
    for (uint32_t L = 0; L < hp->n_layers; L++)
        if ((st = cost_layer(f, hp, L, &t->layer[L], err)))
            return st;
    /* head: one embedding row per row, converted to f32 (model_embed) */
    const gguf_tensor *embd;
    if ((st = cost_tensor(f, "token_embd.weight", hp->hidden, hp->vocab, &embd, err)))
        return st;
    t->head.row_bytes = embd->bytes / hp->vocab;
    /* tail: final norm, the projection, and one logits row written and read
     * back by sampling */
    if ((st = cost_add_vec(f, "output_norm.weight", hp->hidden, &t->tail, err)) ||
        (st = cost_add_mat(f, hp->tied_output ? "token_embd.weight" : "output.weight", hp->hidden, hp->vocab,
                           &t->tail, err)))
        return st;
    t->tail.row_bytes = 2 * (uint64_t)hp->vocab * sizeof(float);
    return PD_OK;
}

pd_status cost_table_read(const char *path, cost_table **out, pd_err *err)
{
    model_hparams hp;
    pd_status st = model_read_hparams(path, &hp, err);
    if (st)
        return st;
    gguf_file *f;
    if ((st = gguf_open(path, &f, err))) {
        pd_err_prefix(err, "%s", path);
        return st;
    }
    cost_table *t = calloc(1, sizeof *t + (size_t)hp.n_layers * sizeof(cost_part));
    if (!t) {
        gguf_close(f);
        return pd_err_set(err, PD_ERR_NOMEM, "%s: out of memory for the costs of %u layers", path, hp.n_layers);
    }
    t->n_layers = hp.n_layers;
    t->ctx = hp.ctx;
    st = cost_read_file(f, &hp, t, err);
    gguf_close(f);
    if (st) {
        pd_err_prefix(err, "%s", path);
        free(t);
        return st;
    }
    *out = t;
    return PD_OK;
}

void cost_table_free(cost_table *t)
{
    free(t);
}

uint32_t cost_table_layers(const cost_table *t) { return t->n_layers; }
uint32_t cost_table_ctx(const cost_table *t) { return t->ctx; }
const cost_part *cost_table_head(const cost_table *t) { return &t->head; }
const cost_part *cost_table_tail(const cost_table *t) { return &t->tail; }

const cost_part *cost_table_layer(const cost_table *t, uint32_t i)
{
    CHECKF(i < t->n_layers, "cost_table_layer: layer %u of %u", i, t->n_layers);
    return &t->layer[i];
}

/* Seconds to picoseconds, rounded to nearest; 0 when it does not fit. */
static int cost_ps(double s, uint64_t *out)
{
    double ps = s * 1e12 + 0.5;
    if (!(ps < 4611686018427387904.0)) /* 2^62 */
        return 0;
    *out = (uint64_t)ps;
    return 1;
}

pd_status cost_table_units(const cost_table *t, const cost_rule *r, uint64_t *layer, uint64_t *head,
                           uint64_t *tail, pd_err *err)
{
    pd_status st = cost_rule_validate(r, err);
    if (st)
        return st;
    uint32_t depth = r->depth < t->ctx ? r->depth : t->ctx;
    uint64_t h, tl;
    if (!cost_ps(cost_part_seconds(&t->head, r, depth), &h) || !cost_ps(cost_part_seconds(&t->tail, r, depth), &tl))
        return pd_err_set(err, PD_ERR_RANGE, "cost: the head or tail step takes more than 2^62 ps");
    for (uint32_t i = 0; i < t->n_layers; i++) {
        uint64_t u;
        if (!cost_ps(cost_part_seconds(&t->layer[i], r, depth), &u))
            return pd_err_set(err, PD_ERR_RANGE, "cost: layer %u's step takes more than 2^62 ps", i);
    }
    for (uint32_t i = 0; i < t->n_layers; i++)
        cost_ps(cost_part_seconds(&t->layer[i], r, depth), &layer[i]);
    *head = h;
    *tail = tl;
    return PD_OK;
}

/* PD_ERR_ARG naming the field when a mean is negative or not finite or a
 * count is out of range. */
static pd_status cost_mix_validate(const cost_mix *m, pd_err *err)
{
    if (!(m->prefill_rows >= 0.0 && m->prefill_rows <= 1e300))
        return pd_err_set(err, PD_ERR_ARG, "cost mix: prefill_rows %g is not a number >= 0", m->prefill_rows);
    if (!(m->new_tokens >= 0.0 && m->new_tokens <= 1e300))
        return pd_err_set(err, PD_ERR_ARG, "cost mix: new_tokens %g is not a number >= 0", m->new_tokens);
    if (m->prefill_rows == 0.0 && m->new_tokens == 0.0)
        return pd_err_set(err, PD_ERR_ARG, "cost mix: no rows (prefill_rows and new_tokens are both 0)");
    if (m->prefill_rows_per_batch == 0)
        return pd_err_set(err, PD_ERR_ARG, "cost mix: prefill_rows_per_batch is 0");
    if (m->decode_rows == 0)
        return pd_err_set(err, PD_ERR_ARG, "cost mix: decode_rows is 0");
    if (m->decode_streams == 0 || m->decode_streams > m->decode_rows)
        return pd_err_set(err, PD_ERR_ARG, "cost mix: decode_streams %u is not in 1 .. decode_rows (%u)",
                          m->decode_streams, m->decode_rows);
    return PD_OK;
}

/* Depth d rows clipped to the context, as a whole number of rows. */
static uint32_t cost_depth(double d, uint32_t ctx)
{
    return d >= (double)ctx ? ctx : (uint32_t)d;
}

/* One average page's seconds on part p (see cost_table_mix_units). */
static double cost_mix_seconds(const cost_part *p, const cost_rule *r, const cost_mix *m, uint32_t ctx, int is_tail)
{
    cost_rule pre = *r, dec = *r;
    pre.rows = is_tail ? 1 : m->prefill_rows_per_batch;
    dec.rows = m->decode_rows;
    double pre_batches = is_tail ? (m->prefill_rows > 0.0 ? 1.0 : 0.0)
                                 : m->prefill_rows / (double)m->prefill_rows_per_batch;
    double dec_batches = m->new_tokens / (double)m->decode_streams;
    return pre_batches * cost_part_seconds(p, &pre, cost_depth(m->prefill_rows / 2.0, ctx)) +
           dec_batches * cost_part_seconds(p, &dec, cost_depth(m->prefill_rows + m->new_tokens / 2.0, ctx));
}

pd_status cost_table_mix_units(const cost_table *t, const cost_rule *r, const cost_mix *mix, uint64_t *layer,
                               uint64_t *head, uint64_t *tail, pd_err *err)
{
    pd_status st = cost_rule_validate(r, err);
    if (st == PD_OK)
        st = cost_mix_validate(mix, err);
    if (st)
        return st;
    uint64_t h, tl;
    if (!cost_ps(cost_mix_seconds(&t->head, r, mix, t->ctx, 0), &h) ||
        !cost_ps(cost_mix_seconds(&t->tail, r, mix, t->ctx, 1), &tl))
        return pd_err_set(err, PD_ERR_RANGE, "cost: the head's or tail's share of a page takes more than 2^62 ps");
    for (uint32_t i = 0; i < t->n_layers; i++) {
        uint64_t u;
        if (!cost_ps(cost_mix_seconds(&t->layer[i], r, mix, t->ctx, 0), &u))
            return pd_err_set(err, PD_ERR_RANGE, "cost: layer %u's share of a page takes more than 2^62 ps", i);
    }
    for (uint32_t i = 0; i < t->n_layers; i++)
        cost_ps(cost_mix_seconds(&t->layer[i], r, mix, t->ctx, 0), &layer[i]);
    *head = h;
    *tail = tl;
    return PD_OK;
}
