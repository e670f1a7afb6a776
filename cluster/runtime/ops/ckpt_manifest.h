/* ckpt_manifest: the manifest of a checkpoint (ckpt.h) — what a checkpoint
 * holds besides the layer bundles: the streams' records, the bundles' sizes
 * and CRCs, and what must match to resume. Its own module so the decoder of
 * these untrusted bytes is testable and fuzzable alone.
 *
 * manifest.pdck, little-endian (version 1):
 *   0   magic "PDCK", u16 version, u16 reserved 0
 *   8   u64 seq, u64 model fingerprint, u64 manifest digest (FNV-1a 64 of
 *       pages.jsonl's bytes), u64 out.jsonl durable bytes, u64 next stream id
 *   48  u32 layer count, u32 stream count
 *   56  u32 n, n bytes: the token-affecting settings (text)
 *       u32 n, n bytes: the layer map it was written with (text)
 *       layer count x (u32 layer, u64 bundle bytes, u32 bundle CRC32C)
 *       stream count x (u32 n, n bytes: a stream record, stream.h)
 *   u32 CRC32C of every byte before it
 */
#ifndef PD_RUNTIME_CKPT_MANIFEST_H
#define PD_RUNTIME_CKPT_MANIFEST_H

#include "base/status.h"
#include "cluster/runtime/pipeline/stream.h"
#include "comm/rd.h"

#include <stdint.h>

#define CKPT_VERSION 1u

typedef struct ckpt_bundle_info {
    uint32_t layer;
    uint64_t bytes;
    uint32_t crc;
} ckpt_bundle_info;

typedef struct ckpt_manifest {
    uint64_t seq;
    uint64_t model_fp, pages_digest, out_size, next_id;
    char *settings;           /* owned */
    char *layer_map;          /* owned */
    uint32_t n_layers;
    ckpt_bundle_info *bundles; /* [n_layers], owned */
    uint32_t n_streams;
    stream_state *streams;     /* [n_streams], owned */
} ckpt_manifest;

pd_status ckpt_manifest_encode(const ckpt_manifest *m, wr *w);
/* Validates all of it (CRC first) before filling *out; limits bound every
 * count. */
pd_status ckpt_manifest_decode(const void *buf, size_t len, const stream_limits *lim, uint32_t max_layers,
                               ckpt_manifest *out, pd_err *err);
void ckpt_manifest_free(ckpt_manifest *m);

#endif
