/* The project's GEMM: C = A * W^T with W packed once at load time.
 *
 * Two backends:
 *
 * GEMM_BACKEND_INVARIANT (the default): batch invariant. Every C[i][j] is
 * exactly one sequential chain
 *
 *     c = +0.0f;  for k = 0 .. K-1:  c = fmaf(a[i][k], w[j][k], c);
 *
 * whatever M, N, the tiling, the ISA path or the thread count (threads split
 * the N panels and blocks of M rows, never K). For 16-bit and Q8_0 weights, w[j][k] is the exact
 * f32 value of the stored weight (f16/bf16 converted; Q8_0 as (float)q * d
 * with d the block's f16 scale in f32, one multiply, which is exact), so a
 * 16-bit or Q8_0 GEMM equals the f32 GEMM of the dequantized weights bit for
 * bit. The AVX2/FMA path (chosen by pd_cpu_isa(), base/cpu.h) and the
 * portable fmaf path give the same bits (NaN payloads aside). Weights are kept
 * in the kernel's panel layout [N/16 panels][K][16 columns] in their stored
 * type (Q8_0: per 32-k block, the 16 columns' f16 scales, then the int8
 * values [32][16]) and converted to f32 in registers just before use, or,
 * for blocks of many rows on the AVX2 path (f32: from 7 rows), once per
 * 256-k chunk of a panel into an L1-resident buffer that every tile of the
 * block reuses.
 *
 * Speed (K = 1280, N = 3584, one thread, AVX2, see bench/bench_gemm.c):
 * M = 1 streams the panels at about the machine's read bandwidth; f32 at
 * M = 8 runs about 40 GFLOP/s (2.1x OpenBLAS, 10 GB/s of weights); M >= 64
 * runs at or above OpenBLAS's speed (f32 72-78 GFLOP/s, F16, BF16 and Q8_0
 * 77-81 on the blocked path); the OpenBLAS backend was not faster at any M
 * there.
 *
 * GEMM_BACKEND_OPENBLAS (opt-in, `--gemm openblas`): cblas_sgemm on an f32
 * copy of the weights. NOT batch invariant: the bits of a row change with M
 * and with the thread count (ARCHITECTURE.md §1). gemm_run sets OpenBLAS's
 * thread count to pool_threads(p) with openblas_set_num_threads, which is
 * process-wide: with several pools or ranks per node the last call wins, and
 * OpenBLAS runs its own threads while the pool's workers stay parked.
 *
 * GEMM_BACKEND_INT8 (opt-in, `--gemm int8`): for Q8_0 and the qs types, a
 * second defined arithmetic, batch invariant too (every step is row-local
 * and in a fixed order), faster where the exact product is compute-bound.
 * Weights are packed as on the invariant backend. Each A row is quantized
 * per 32-k block b as ggml's quantize_row_q8_0_ref does, except that ties
 * round to even:
 *
 *     amax = max |a[k]|;  d = amax / 127;  id = d != 0 ? 1 / d : 0;
 *     qa[k] = (int8)nearbyintf(a[k] * id);  da = (float)(f16)d;
 *     sA = sum qa[k], k < 16;  sB = sum qa[k], k >= 16
 *
 * and, with q[k], s[2] and nm of weight column j's block b as gemm_qs_block
 * defines them (Q8_0: q the stored int8, s[0] = s[1] = d), integer sums
 * iA = sum q[k] qa[k] over k < 16, iB over k >= 16 (exact, any order), then
 *
 *     t = Q6_K ? fmaf(s[1], (float)iB, s[0] * (float)iA) : s[0] * (float)(iA + iB)
 *     t = fmaf(nm, (float)(sA + sB), t)     only Q4_1, Q5_1, Q4_K, Q5_K
 *     c = fmaf(da, t, c)                    c from +0, blocks in k order
 *
 * The AVX-512 VNNI kernel (gemm_vnni.c) and the portable one give the same
 * bits. F32, F16 and BF16 weights run the invariant arithmetic unchanged.
 * The int8 result is not the invariant one: docs/performance.md gives how
 * far the tokens agree. */
#ifndef PD_GEMM_H
#define PD_GEMM_H

#include "base/alloc.h"
#include "base/status.h"
#include "cluster/model/pool.h"

#include <stddef.h>
#include <stdint.h>

typedef enum gemm_wtype {
    GEMM_W_F32,
    GEMM_W_F16,
    GEMM_W_BF16,
    GEMM_W_Q8_0, /* ggml/GGUF block: per 32 consecutive k, an f16 scale d then 32 int8 q;
                    value = d * q. A row of k values is k / 32 blocks of 34 bytes. */
    /* The block-quantized types of ggml (byte layouts as in ggml-common.h);
     * each weight is exactly the f32 ggml's dequantize_row_* gives. Q4_0
     * and Q5_0: blocks of 32 (18 and 22 bytes); Q4_K, Q5_K, Q6_K: super-
     * blocks of 256 (144, 176, 210 bytes), so k % 256 == 0. */
    GEMM_W_Q4_0,
    GEMM_W_Q4_1, /* blocks of 32: f16 d, f16 m, 16 bytes of nibbles = 20 bytes; d * q + m */
    GEMM_W_Q5_0,
    GEMM_W_Q5_1, /* blocks of 32: f16 d, f16 m, 4 bytes qh, 16 bytes qs = 24 bytes */
    GEMM_W_Q4_K,
    GEMM_W_Q5_K,
    GEMM_W_Q6_K,
    GEMM_W_COUNT
} gemm_wtype;

typedef enum gemm_backend {
    GEMM_BACKEND_INVARIANT,
    GEMM_BACKEND_OPENBLAS,
    GEMM_BACKEND_INT8, /* opt-in: the int8 arithmetic below */
    GEMM_BACKEND_COUNT
} gemm_backend;

/* Columns per packed panel (the micro-kernel's NR). */
#define GEMM_NR 16u
/* Q8_0 block length along k. */
#define GEMM_Q8_0_BLOCK 32u

/* True for the ggml block types of the "qs" panel layouts (gemm_kern.h:
 * nibbles, bit planes and the stored scale fields, about the bytes of the
 * file): Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K. */
static inline int gemm_wtype_is_qs(gemm_wtype t) { return t >= GEMM_W_Q4_0 && t <= GEMM_W_Q6_K; }

/* Values per source block of a type along k (1 for f32/f16/bf16). */
uint32_t gemm_wtype_block(gemm_wtype type);

/* Block b (32 consecutive k values, from k = 32 b) of a source row of a qs
 * type, as ggml defines its values: q[i] an integer, s[0] the scale of
 * i < 16 and s[1] of i >= 16, nm minus the block's offset (-0.0f when the
 * type has none). Value i is exactly fmaf(s[i / 16], (float)q[i], nm), which
 * is the float ggml's dequantize_row_* gives (its products d * sc and
 * d_min * m are exact in f32, and so is s * q except for Q6_K, where ggml
 * rounds (d * sc) * q once, as fmaf does; Q4_1 and Q5_1 add m: nm = +m,
 * d * q exact). row must hold block b. */
void gemm_qs_block(gemm_wtype type, const uint8_t *row, uint32_t b, float s[2], float *nm, int8_t q[32]);

/* Values [k0, k0 + n) of a source row of `type` (GGUF layout), exactly the
 * f32 values every GEMM path multiplies with. */
void gemm_dequant(gemm_wtype type, const void *row, uint32_t k0, uint32_t n, float *out);

/* Packed weights, opaque. Immutable after gemm_pack, so several threads may
 * run GEMMs on one gemm_w at once (each with its own pool or none). */
typedef struct gemm_w gemm_w;

/* Bytes of one weight row of k values stored as `type` (GGUF layout), or 0
 * when k is not valid for the type (Q8_0 needs k % 32 == 0) or on overflow. */
size_t gemm_row_bytes(gemm_wtype type, uint32_t k);

/* Packs w, an [n x k] row-major matrix of `type` (GGUF's layout: ne0 = k
 * contiguous, n rows; Q8_0 rows are k / 32 blocks), for backend be. Invariant
 * backend: panel layout in the stored type; OpenBLAS backend: an f32 [n x k]
 * copy (dequantized). w is borrowed only during the call. Memory comes from
 * alloc (NULL = default malloc), which must outlive the result.
 * Errors (*out untouched): PD_ERR_ARG for NULL pointers, n == 0, k == 0, an
 * unknown type or backend, Q8_0 with k % 32 != 0; PD_ERR_NOMEM when the size
 * overflows or the allocation fails; PD_ERR_RANGE when n or k exceeds what
 * cblas takes (INT_MAX) on the OpenBLAS backend.
 * Returns owned, free with gemm_free. */
pd_status gemm_pack(const void *w, gemm_wtype type, uint32_t n, uint32_t k, gemm_backend be,
                    const pd_alloc *alloc, gemm_w **out, pd_err *err);

/* Frees w and its packed memory. gemm_free(NULL) is a no-op. */
void gemm_free(gemm_w *w);

/* C[m x n] = A[m x k] * W^T. A is row-major with lda = k, C row-major with
 * ldc = n and is overwritten (never read). m == 0 does nothing. a and c are
 * borrowed and must not overlap. p may be NULL (caller thread only); the
 * invariant backend splits the N panels over the pool's threads, and its
 * result does not depend on p. The int8 backend quantizes A once for its
 * tasks: on the caller's stack (44 KB; gemm_run_many up to twice that)
 * when A is small, else in one heap buffer of up to 2.9 MB freed before
 * the return; a larger A, or no room on the heap, and each task quantizes
 * its part on its own stack (as much again). Either way the same bits. */
void gemm_run(const gemm_w *w, const float *a, uint32_t m, float *c, pool *p);

/* Same as gemm_run with explicit leading dimensions (lda >= k, ldc >= n), so
 * a caller can multiply column slices of a fused buffer. Invariant backend:
 * the bits of every C element are those gemm_run gives. OpenBLAS backend:
 * m, lda and ldc must fit in an int. Violations abort through CHECK (they
 * are programming errors, not input). */
void gemm_run_ld(const gemm_w *w, const float *a, size_t lda, uint32_t m, float *c, size_t ldc,
                 pool *p);

/* Most matrices gemm_run_many takes at once. */
#define GEMM_MANY_MAX 4u

/* c[i] = A * w[i]^T for the n (1 .. GEMM_MANY_MAX) matrices, all of the same
 * k, each C with ldc = its n: the bits of gemm_run for each, but one
 * hand-out of tasks to the pool for all of them, so threads wait for each
 * other once (a layer's q, k and v; its gate and up) rather than once per
 * matrix. Matrices on the OpenBLAS backend run one after the other. */
void gemm_run_many(uint32_t n, const gemm_w *const *w, const float *a, uint32_t m, float *const *c, pool *p);

/* C = A W^T as gemm_run gives it, and fn(ctx, t, thread) for every t in
 * [0, n_extra), in one hand-out of tasks to the pool: the extra tasks are
 * claimed first, then the GEMM's, so threads that finish uneven extra
 * tasks (a mixture of experts' routed experts) take the GEMM's panels (its
 * shared experts' down projection) instead of waiting for each other, and
 * meet once. fn must not touch c, and the GEMM must not need what fn
 * writes. The OpenBLAS backend and a one-thread pool run the extra tasks,
 * then the GEMM. */
void gemm_run_beside(const gemm_w *w, const float *a, uint32_t m, float *c, pool *p, uint32_t n_extra,
                     pool_fn fn, void *ctx);

/* Asks for the bytes a GEMM on w reads first (its first panels' starts)
 * to be brought toward this core's L2, without waiting: the kernels
 * prefetch GEMM_PREFETCH bytes ahead as they stream, across panel ends,
 * so a cold matrix's first lines are the only ones they wait for. A caller
 * that knows which matrix comes next (a mixture of experts' next expert)
 * calls this ahead of it. No effect on any result; w NULL is a no-op. */
void gemm_prefetch_start(const gemm_w *w);

uint32_t gemm_rows_n(const gemm_w *w);
uint32_t gemm_cols_k(const gemm_w *w);
gemm_wtype gemm_get_wtype(const gemm_w *w);
gemm_backend gemm_get_backend(const gemm_w *w);
/* Bytes of packed weight memory held (including panel padding). */
size_t gemm_bytes(const gemm_w *w); /* 0 for NULL */

/* "f32" / "f16" / "bf16" / "q8_0" / "q4_0" / "q5_0" / "q4_K" / "q5_K" /
 * "q6_K" (ggml's names); "unknown" out of range. */
const char *gemm_wtype_name(gemm_wtype t);
/* "invariant" / "openblas" / "int8"; "unknown" out of range. */
const char *gemm_backend_name(gemm_backend b);

/* Checks w's internal invariants; aborts through CHECK on violation. */
void gemm_check(const gemm_w *w);

#endif
