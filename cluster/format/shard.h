/* shard: splits a page manifest into S shard manifests for an array job
 * (`pipedec shard`), one pipeline per shard; cluster/format/merge.h joins
 * their outputs again.
 *
 * The split is by cumulative estimated cost, in manifest order: page i costs
 *   cost(i) = prefill_rows(i) + max_new_tokens(i)      (at least 1)
 * (every prefill row and every generated token is one row through every
 * layer; generation may stop early at EOS, so this is an upper bound). With
 * C(i) the cost of the pages before i and T the total, page i goes to shard
 *   k = floor(S * (C(i) + cost(i) / 2) / T)
 * so each shard is a contiguous run of the manifest holding about T / S of
 * the cost. A pure function of the manifest and S: the same inputs give the
 * same shards on every machine. A shard may be empty (more shards than
 * pages, or one page costing more than T / S); its manifest is then empty.
 *
 * The manifest is validated as `pipedec run` validates it, except what needs
 * the model (token ids only checked to be >= 0, embedding widths not
 * compared): duplicate ids and malformed lines are refused naming
 * "manifest:line", and nothing is written. A shard manifest holds the
 * original lines byte for byte, except that a relative embeddings or image path is
 * rewritten relative to the output directory (so it names the same file);
 * such a line is re-serialized as compact JSON with the same fields and
 * values. Each shard file is published atomically (base/file.h). */
#ifndef PD_SHARD_H
#define PD_SHARD_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* The most shards one split makes. */
#define SHARD_MAX 10000u

/* What a split did, per shard (arrays of `shards` entries, caller-owned,
 * either may be NULL): pages and estimated cost. */
typedef struct shard_counts {
    size_t *pages;
    uint64_t *cost;
} shard_counts;

/* The shard (0..shards-1) of a page whose cost is `cost` after pages costing
 * `before`, in a manifest of total cost `total` (> 0). Pure. */
uint32_t shard_of(uint64_t before, uint64_t cost, uint64_t total, uint32_t shards);

/* Splits the manifest at `manifest` into out_dir/shard-K.jsonl for K in
 * 0..shards-1 (out_dir is created if missing; its parent must exist).
 * Refuses (PD_ERR_REFUSED) an out_dir holding a shard-K.jsonl with K >= shards
 * (left from a split into more shards: an array job would run it too) and a
 * shard file that would overwrite the manifest. On a validation failure
 * nothing is written; an I/O error part-way leaves the shards written before
 * it complete (each file is whole or absent). counts may be NULL. */
pd_status shard_split(const char *manifest, uint32_t shards, const char *out_dir,
                      const shard_counts *counts, pd_err *err);

/* The path of shard k's manifest in out_dir ("out_dir/shard-k.jsonl") into
 * buf of cap bytes; PD_ERR_RANGE when it does not fit. */
pd_status shard_path(const char *out_dir, uint32_t k, char *buf, size_t cap, pd_err *err);

#endif
