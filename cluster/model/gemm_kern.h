/* gemm_kern: what gemm.c and the kernels in other files share (internal to
 * cluster/model; users include gemm.h). The panel layout, the tile, row and
 * chunk-tile descriptors every micro-kernel takes, and the tables of the
 * AVX-512 kernels (gemm_avx512.c), which gemm.c picks at PD_ISA_AVX512.
 * Every kernel of every ISA computes each C element as the same fmaf chain
 * over k in order, so all give the same bits (ARCHITECTURE.md §8). */
#ifndef PD_MODEL_GEMM_KERN_H
#define PD_MODEL_GEMM_KERN_H

#include "cluster/model/gemm.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Rows per micro-tile (MR) of the portable and AVX2 kernels and of the
 * AVX-512 ones; and the M block a task walks over all its
 * panels before moving to the next rows (keeps that block of A hot in L2
 * while each panel is re-read from L2 for every tile). A tile needs about 8
 * independent FMA chains to cover two FMA pipes' latency: an AVX2 row has
 * two (16 columns are two ymm), an AVX-512 row one zmm, so AVX-512 tiles
 * are twice as tall. */
#define GEMM_MR 6u
#define GEMM_MR512 12u
#define GEMM_MC 96u
/* The blocked path (gemm_block) runs over chunks of GEMM_KC k values: one
 * panel's chunk in f32 is 16 KB, half of L1. A multiple of the Q8_0 block. */
#define GEMM_KC 256u
/* f32 blocks of at most this many tiles prefetch the next chunk over their
 * k loop (gemm_block). */
#define GEMM_SPREAD_MAX_TILES 4u
/* Cap on tasks per gemm_run (M blocks are grouped beyond it). */
#define GEMM_MAX_TASKS 65536u

/* Panel layout (one panel = GEMM_NR = 16 consecutive output columns j):
 *   F32:       [k][16] f32
 *   F16, BF16: [k][16] u16 (stored bits)
 *   Q8_0:      per 32-k block: [16] f16 scales d (little-endian), then
 *              [32][16] int8 q; 32 + 512 = 544 bytes per block.
 * Source Q8_0 block (GGUF): f16 d, 32 int8 = 34 bytes. */
#define GEMM_Q8_SRC_BLOCK 34u
#define GEMM_Q8_SCALES 32u
#define GEMM_Q8_PANEL_BLOCK (GEMM_Q8_SCALES + GEMM_Q8_0_BLOCK * GEMM_NR)

/* The qs layout of the ggml block types (gemm_wtype_is_qs), per 32-k
 * block of a panel: [16] f32 s_lo (the scales of k 0..15), [16] f32 s_hi
 * (k 16..31), [16] f32 nm (minus the offset; -0.0f for types without), then
 * [32][16] int8 q; weight = fmaf(s, (float)q, nm) (gemm_qs_block).
 * 192 + 512 = 704 bytes per block. */
#define GEMM_QS_BLOCK 32u
#define GEMM_QS_HDR 192u
#define GEMM_QS_PANEL_BLOCK (GEMM_QS_HDR + GEMM_QS_BLOCK * GEMM_NR)

/* One micro-tile: C[mr x ncols] = A[mr x k] * panel, from zero. */
typedef struct gemm_tile {
    gemm_wtype type;
    const uint8_t *panel; /* the panel's first byte */
    uint32_t k;
    const float *a;       /* row 0 of the tile, rows lda apart */
    size_t lda;
    uint32_t mr;          /* 1 .. the kernels' MR rows */
    float *c;             /* C[row 0][col 0 of the panel], rows ldc apart */
    size_t ldc;
    uint32_t ncols;       /* 1 .. 16 valid columns */
} gemm_tile;

typedef void gemm_tile_fn(const gemm_tile *t);

/* One row against np consecutive panels (AVX2 only): C[0][0 .. 16 np) from
 * zero; the last panel of the group has ncols_last valid columns. */
typedef struct gemm_row {
    const uint8_t *panel; /* the first panel of the group */
    size_t panel_stride;  /* bytes between panels */
    uint32_t k;
    const float *a;
    float *c;             /* C[row][first column of the group] */
    uint32_t ncols_last;
} gemm_row;

typedef void gemm_row_fn(const gemm_row *t);

/* One chunk of a micro-tile: C[mr x ncols] = A[mr x kn] * w (kn rows of 16
 * f32 weights), from zero when `first`, else continuing the chains already
 * in C. Storing a chain's f32 value and loading it back changes no bit, so
 * chunks along k give the same chain as one pass. */
typedef struct gemm_ctile {
    const float *w; /* [kn][16] f32, the chunk's weights */
    uint32_t kn;
    const float *a; /* row 0 of the tile at the chunk's first k */
    size_t lda;
    uint32_t mr;
    float *c;
    size_t ldc;
    uint32_t ncols;
    bool first;
    const uint8_t *pf; /* the spreading kernels prefetch [pf, pf + pf_len) */
    size_t pf_len;     /* over the tile's k loop, a line every few k */
} gemm_ctile;

typedef void gemm_ctile_fn(const gemm_ctile *t);

/* A panel's chunk of kn k values, given by its packed bytes src (see
 * gemm_chunk_src), as f32 [kn][16] (see the blocked path). */
typedef const float *gemm_chunk_fn(const uint8_t *src, uint32_t kn, float *buf);


/* Software prefetch distance in the panel stream (bytes). Panels of a task
 * are contiguous, so this runs ahead into the next panel too. It lifts small
 * M (2..16, where the first tile of a panel reads it from memory) by 15-25%
 * here. The single-tile path at M = 1 skips it (it cost more than it gained
 * there); the M = 1 row kernels over 4 panels use it for f32 and Q8_0
 * (Q8_0 spread over a block's k: gemm_row_q8_prefetch) and a shorter
 * distance for 16-bit weights (gemm_row_prefetch_dist). Near a panel's end
 * the row kernels prefetch the next group's panel (below): a Q8_0 panel is
 * only 21 KB at K = 1280, so starting each of the next group's panels cold
 * cost batch-1 Q8_0 decode 4-6 % on two threads. */
#define GEMM_PREFETCH 4096

/* How far ahead the M = 1 row kernels prefetch, by weight type (bytes).
 * The row kernels stream 4 panels per thread at once. For 16-bit weights a
 * shorter distance keeps them fed better: one token's GEMMs at M = 1 on two
 * threads (AVX-512 Zen 5, interleaved runs, medians) read 61.5 GB/s at
 * 4096 bytes, 67.5 at 2048, 71.2 at 1536, 73.7 at 1280 and 69.8 at 768
 * while the host's bandwidth was high, 43.0 -> 44.2 at 1536 while it was
 * low; AVX2 65.4 -> 72.0. Q8_0 gained 3 % at 3072 while the bandwidth was
 * high and lost 2-3 % while it was low, and f32 reads the same from 2048
 * to 6144: both keep GEMM_PREFETCH. */
#define GEMM_ROW_PREFETCH_16 1536

static inline size_t gemm_row_prefetch_dist(gemm_wtype type)
{
    return type == GEMM_W_F16 || type == GEMM_W_BF16 ? GEMM_ROW_PREFETCH_16 : GEMM_PREFETCH;
}

/* How far past byte o of its panel a row kernel over weights of type
 * prefetches: gemm_row_prefetch_dist bytes on, and near the panel's end,
 * into the panel np on (the same panel of the next group), not into the
 * next panel, which this group is reading already. Past the last group the
 * address is prefetched but never read. */
static inline size_t gemm_row_prefetch_offset(size_t o, size_t panel_stride, uint32_t np, gemm_wtype type)
{
    const size_t dist = gemm_row_prefetch_dist(type);
    return o + dist < panel_stride ? dist : dist + (size_t)(np - 1) * panel_stride;
}

/* The Q8_0 row kernels' prefetch at k row kk of the blocks b0..b3 (np of
 * them), pfo bytes ahead: the block's lines spread over its k rather than
 * all at its start, lines 0..7 every 4 k (a line holds 4 k rows) and line 8
 * at the last k (a 544-byte block spans 9 lines at either 32-byte phase).
 * One token's Q8_0 GEMMs on two threads (medians of interleaved runs):
 * AVX-512 63.1 -> 72.3 GB/s (8 of 8 runs ahead) against the whole block at
 * its start; AVX2, which had no prefetch, 39.5 -> 46.0 (6 of 6). */
static inline __attribute__((always_inline)) void gemm_row_q8_prefetch(const uint8_t *b0, const uint8_t *b1,
                                                                       const uint8_t *b2, const uint8_t *b3,
                                                                       uint32_t np, size_t pfo, uint32_t kk)
{
    if (kk % 4 != 0 && kk != GEMM_Q8_0_BLOCK - 1)
        return;
    const size_t l = pfo + (size_t)(kk % 4 == 0 ? kk / 4 : 8) * 64;
    __builtin_prefetch(b0 + l, 0, 3);
    if (np > 1) __builtin_prefetch(b1 + l, 0, 3);
    if (np > 2) __builtin_prefetch(b2 + l, 0, 3);
    if (np > 3) __builtin_prefetch(b3 + l, 0, 3);
}

/* One row against np consecutive panels (1 .. GEMM_ROW_PANELS) at once: a
 * lone row has only 2 accumulators per panel, so one panel at a time is
 * bound by the FMA latency (one k per 4 cycles), which caps 16-bit and Q8_0
 * weights well below memory bandwidth. 4 panels give 8 independent chains;
 * every lane still runs its own chain over k in order. */
#define GEMM_ROW_PANELS 4u

/* A tile's row pointers a0..a5 in a micro-kernel (rows past mr alias row 0
 * and are never read). */
#define GEMM_TILE_ROWS(a, lda, mr)                                               \
    const float *a0 = (a);                                                       \
    const float *a1 = (mr) > 1 ? a0 + (lda) : a0;                                \
    const float *a2 = (mr) > 2 ? a0 + 2 * (lda) : a0;                            \
    const float *a3 = (mr) > 3 ? a0 + 3 * (lda) : a0;                            \
    const float *a4 = (mr) > 4 ? a0 + 4 * (lda) : a0;                            \
    const float *a5 = (mr) > 5 ? a0 + 5 * (lda) : a0;

/* A row group's panel pointers p0..p3 in a row kernel (panels past np
 * alias panel 0 and are never read). */
#define GEMM_ROW_PANEL_PTRS(t, np)                                               \
    const size_t ps = (t)->panel_stride;                                         \
    const uint8_t *p0 = (t)->panel;                                              \
    const uint8_t *p1 = (np) > 1 ? p0 + ps : p0;                                 \
    const uint8_t *p2 = (np) > 2 ? p0 + 2 * ps : p0;                             \
    const uint8_t *p3 = (np) > 3 ? p0 + 3 * ps : p0;

/* Kernel tables of one ISA, from kernels named <pre><mr> (1..6, or 1..12
 * with GEMM_BY_MR12) or <pre><np> (1..4), per weight type <pre><type>_:
 * e.g. GEMM_BY_TYPE(GEMM_BY_MR, gemm_avx2_) lists gemm_avx2_f32_1 ..
 * _q8_0_6. */
#define GEMM_BY_MR(pre) {pre##1, pre##2, pre##3, pre##4, pre##5, pre##6}
#define GEMM_BY_MR12(pre)                                                        \
    {pre##1, pre##2, pre##3, pre##4, pre##5,  pre##6,                            \
     pre##7, pre##8, pre##9, pre##10, pre##11, pre##12}
#define GEMM_BY_NP(pre) {pre##1, pre##2, pre##3, pre##4}
#define GEMM_BY_TYPE(by, pre)                                                    \
    {[GEMM_W_F32] = by(pre##f32_), [GEMM_W_F16] = by(pre##f16_),                 \
     [GEMM_W_BF16] = by(pre##bf16_), [GEMM_W_Q8_0] = by(pre##q8_0_)}

/* The same with the qs types, which share the kernels <pre>qs_. */
#define GEMM_BY_TYPE_QS(by, pre)                                                 \
    {[GEMM_W_F32] = by(pre##f32_), [GEMM_W_F16] = by(pre##f16_),                 \
     [GEMM_W_BF16] = by(pre##bf16_), [GEMM_W_Q8_0] = by(pre##q8_0_),             \
     [GEMM_W_Q4_0] = by(pre##qs_), [GEMM_W_Q5_0] = by(pre##qs_),                 \
     [GEMM_W_Q4_1] = by(pre##qs_), [GEMM_W_Q5_1] = by(pre##qs_),                 \
     [GEMM_W_Q4_K] = by(pre##qs_), [GEMM_W_Q5_K] = by(pre##qs_),                 \
     [GEMM_W_Q6_K] = by(pre##qs_)}

/* The qs row kernels' prefetch at k row kk of a block (as
 * gemm_row_q8_prefetch): a 704-byte block spans 12 lines at worst; one
 * line every 3 k (kk = 0, 3, .., 30) and the last at kk = 31. */
static inline __attribute__((always_inline)) void gemm_row_qs_prefetch(const uint8_t *b0, const uint8_t *b1,
                                                                       const uint8_t *b2, const uint8_t *b3,
                                                                       uint32_t np, size_t pfo, uint32_t kk)
{
    if (kk % 3 != 0 && kk != GEMM_QS_BLOCK - 1)
        return;
    const size_t l = pfo + (size_t)(kk % 3 == 0 ? kk / 3 : 11) * 64;
    __builtin_prefetch(b0 + l, 0, 3);
    if (np > 1) __builtin_prefetch(b1 + l, 0, 3);
    if (np > 2) __builtin_prefetch(b2 + l, 0, 3);
    if (np > 3) __builtin_prefetch(b3 + l, 0, 3);
}

/* AVX-512F kernels (gemm_avx512.c), same contracts and bits as gemm.c's AVX2
 * ones, in tiles of up to GEMM_MR512 rows: tiles by [type][mr - 1],
 * single-row groups by [type][np - 1], chunk tiles by [mr - 1] (plain, and
 * spreading a prefetch over k). The blocked path's chunk conversion stays
 * AVX2 (every AVX-512 CPU has it). */
extern gemm_tile_fn *const gemm_avx512_tiles[GEMM_W_COUNT][GEMM_MR512];
extern gemm_row_fn *const gemm_avx512_rows[GEMM_W_COUNT][GEMM_ROW_PANELS];
extern gemm_ctile_fn *const gemm_avx512_ctiles[GEMM_MR512];
extern gemm_ctile_fn *const gemm_avx512_ctilepfs[GEMM_MR512];

#endif
