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

/* The qs layout of the ggml block types (gemm_wtype_is_qs): about as many
 * bytes as the GGUF file, so batch-1 decode streams no more than the file.
 * A panel is k / (32 g) groups; a group is a group header of gh bytes, then
 * g blocks of 32 k, each a block header of bh bytes, the low nibbles and,
 * for 5- and 6-bit types, a plane of the high bits. Column l (0..15) of a
 * 16-value array sits at element l; every array is 16 bytes or 16 f16:
 *
 *   group header:  Q4_0, Q5_0  [16] f16 d                     32 bytes
 *                  Q4_1, Q5_1  [16] f16 d, [16] f16 m         64
 *                  Q4_K, Q5_K  [16] f16 d, [16] f16 dmin      64 (g = 8)
 *                  Q6_K        [16] f16 d                     32 (g = 8)
 *   block header:  Q4_K, Q5_K  [16] u8 sc, [16] u8 m          32
 *                  Q6_K        [16] i8 sc (k 0..15), [16] i8 sc (k 16..31)
 *   nibbles:       [16 pairs][16] u8: pair t holds k 2t in the low and
 *                  k 2t + 1 in the high nibble              256
 *   5-bit plane:   [4][16] u8: bit r of row u is bit 4 of k 8u + r   64
 *   6-bit plane:   [8][16] u8: bits 2r, 2r + 1 of row u are bits 4, 5
 *                  of k 4u + r                              128
 *
 * Bytes per 512 weights (16 columns x 32 k), the file's in brackets: Q4_0
 * 288 (288), Q5_0 352 (352), Q4_1 320 (320), Q5_1 384 (384), Q4_K 296
 * (288), Q5_K 360 (352), Q6_K 420 (420).
 * Value: u = nibble | high bits << 4, q = u - off (8, 16, 32 for Q4_0, Q5_0,
 * Q6_K; 0 else) and weight = fmaf(s, (float)q, nm) with s and nm as
 * gemm_qs_block defines them: s = d (Q4_0 .. Q5_1), d * (float)sc (K
 * types: exact products), nm = -0.0f, m (Q4_1, Q5_1) or -(dmin * (float)m)
 * (Q4_K, Q5_K). Each kernel computes s and nm from the stored fields with
 * these f32 operations, so the values are those of gemm_qs_block. */
#define GEMM_QS_BLOCK 32u
#define GEMM_QS_NIBBLES 256u

typedef struct gemm_qs_fmt {
    uint32_t g;    /* 32-k blocks per group */
    uint32_t gh;   /* group header bytes */
    uint32_t bh;   /* block header bytes */
    uint32_t bits; /* 4, 5 or 6 */
    uint32_t off;  /* subtracted from the stored unsigned value */
} gemm_qs_fmt;

static inline __attribute__((always_inline)) gemm_qs_fmt gemm_qs_fmt_of(gemm_wtype t)
{
    switch (t) {
    case GEMM_W_Q4_0: return (gemm_qs_fmt){.g = 1, .gh = 32, .bh = 0, .bits = 4, .off = 8};
    case GEMM_W_Q5_0: return (gemm_qs_fmt){.g = 1, .gh = 32, .bh = 0, .bits = 5, .off = 16};
    case GEMM_W_Q4_1: return (gemm_qs_fmt){.g = 1, .gh = 64, .bh = 0, .bits = 4, .off = 0};
    case GEMM_W_Q5_1: return (gemm_qs_fmt){.g = 1, .gh = 64, .bh = 0, .bits = 5, .off = 0};
    case GEMM_W_Q4_K: return (gemm_qs_fmt){.g = 8, .gh = 64, .bh = 32, .bits = 4, .off = 0};
    case GEMM_W_Q5_K: return (gemm_qs_fmt){.g = 8, .gh = 64, .bh = 32, .bits = 5, .off = 0};
    default: return (gemm_qs_fmt){.g = 8, .gh = 32, .bh = 32, .bits = 6, .off = 32}; /* Q6_K */
    }
}

/* Bytes of a block (header, nibbles, plane) and of a group. */
static inline __attribute__((always_inline)) size_t gemm_qs_block_bytes(gemm_qs_fmt f)
{
    return f.bh + GEMM_QS_NIBBLES + (f.bits - 4) * 64u;
}

static inline __attribute__((always_inline)) size_t gemm_qs_group_bytes(gemm_qs_fmt f)
{
    return f.gh + f.g * gemm_qs_block_bytes(f);
}

/* Offset in a panel of block b's group and of the block itself. */
static inline __attribute__((always_inline)) size_t gemm_qs_group_off(gemm_qs_fmt f, uint32_t b)
{
    return (size_t)(b / f.g) * gemm_qs_group_bytes(f);
}

static inline __attribute__((always_inline)) size_t gemm_qs_block_off(gemm_qs_fmt f, uint32_t b)
{
    return gemm_qs_group_off(f, b) + f.gh + (size_t)(b % f.g) * gemm_qs_block_bytes(f);
}

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

/* The same with the qs types, one kernel set each. */
#define GEMM_BY_TYPE_QS(by, pre)                                                 \
    {[GEMM_W_F32] = by(pre##f32_), [GEMM_W_F16] = by(pre##f16_),                 \
     [GEMM_W_BF16] = by(pre##bf16_), [GEMM_W_Q8_0] = by(pre##q8_0_),             \
     [GEMM_W_Q4_0] = by(pre##q4_0_), [GEMM_W_Q5_0] = by(pre##q5_0_),             \
     [GEMM_W_Q4_1] = by(pre##q4_1_), [GEMM_W_Q5_1] = by(pre##q5_1_),             \
     [GEMM_W_Q4_K] = by(pre##q4_K_), [GEMM_W_Q5_K] = by(pre##q5_K_),             \
     [GEMM_W_Q6_K] = by(pre##q6_K_)}

/* The qs row kernels' prefetch at k row kk of a block, pfo bytes past
 * the blocks b0..b3 (as gemm_row_q8_prefetch): the block's lines, plus one
 * for its phase and the next group's header, one every 4 k. */
static inline __attribute__((always_inline)) void gemm_row_qs_prefetch(const uint8_t *b0, const uint8_t *b1,
                                                                       const uint8_t *b2, const uint8_t *b3,
                                                                       uint32_t np, size_t pfo, uint32_t kk,
                                                                       gemm_qs_fmt f)
{
    const uint32_t lines = (uint32_t)((gemm_qs_block_bytes(f) + 63) / 64) + 1;
    if (kk % 4 != 0 || kk / 4 >= lines)
        return;
    const size_t l = pfo + (size_t)(kk / 4) * 64;
    __builtin_prefetch(b0 + l, 0, 3);
    if (np > 1) __builtin_prefetch(b1 + l, 0, 3);
    if (np > 2) __builtin_prefetch(b2 + l, 0, 3);
    if (np > 3) __builtin_prefetch(b3 + l, 0, 3);
}

/* AVX-512F kernels (gemm_avx512.c), same contracts and bits as gemm.c's AVX2
 * ones, in tiles of up to GEMM_MR512 rows: tiles by [type][mr - 1] (the
 * qs types too: a k row unpacked once for the tile's rows),
 * single-row groups by [type][np - 1], chunk tiles by [mr - 1] (plain, and
 * spreading a prefetch over k). The blocked path's chunk conversion stays
 * AVX2 (every AVX-512 CPU has it). */
extern gemm_tile_fn *const gemm_avx512_tiles[GEMM_W_COUNT][GEMM_MR512];
extern gemm_row_fn *const gemm_avx512_rows[GEMM_W_COUNT][GEMM_ROW_PANELS];
extern gemm_ctile_fn *const gemm_avx512_ctiles[GEMM_MR512];
extern gemm_ctile_fn *const gemm_avx512_ctilepfs[GEMM_MR512];

/* ---- the int8 arithmetic (GEMM_BACKEND_INT8, defined in gemm.h) ---- */

/* Rows per int8 tile (its kernels keep two integer sums and a float chain
 * per row, and a block's 8 unpacked weight vectors, in registers). */
#define GEMM_MR8 8u

/* A rows quantized to the int8 arithmetic's blocks, over a chunk of nb
 * 32-k blocks: row r's values at q + 32 nb r (32 per block; with `perm`,
 * each 8 k in the order 0 2 4 6 1 3 5 7, which puts a VNNI dword beside
 * each unpacked nibble vector), its block scales da at d + nb r, its sums
 * sA, sB at s + 2 (nb r + b). */
typedef struct gemm_qa {
    const int8_t *q;
    const float *d;
    const int32_t *s;
    uint32_t nb;
} gemm_qa;

/* One int8 micro-tile: blocks b0 .. b0 + nb - 1 of a Q8_0 or qs panel
 * against the tile's quantized rows (qa at the tile's row 0 and the
 * chunk's block 0), into C[mr x ncols]: from +0 when `first`, else
 * continuing the chains in C (a chain's f32 stored and loaded back is the
 * same chain). */
typedef struct gemm_qtile {
    gemm_wtype type;
    const uint8_t *panel;
    uint32_t b0, nb;
    gemm_qa qa;
    uint32_t mr; /* 1 .. GEMM_MR8 */
    float *c;
    size_t ldc;
    uint32_t ncols;
    bool first;
    const uint8_t *unp; /* gemm_vnni_qtiles_unp: blocks b0 .. b0 + nb of panel, unpacked */
} gemm_qtile;

typedef void gemm_qtile_fn(const gemm_qtile *t);
/* Two tiles of the same height and blocks (t->qa, u->qa alike) on two
 * panels at once; the same bits as each alone. Up to GEMM_MR_PAIR rows:
 * above that Q6_K's pair no longer fits the 32 vector registers, and a
 * tile that high is bound by its arithmetic more than by memory. */
typedef void gemm_qtile2_fn(const gemm_qtile *t, const gemm_qtile *u);
#define GEMM_MR_PAIR 6u

/* The types whose values carry an offset term nm (gemm.h's last float
 * step, fmaf(nm, sA + sB, t)): Q4_1, Q5_1 (+m) and Q4_K, Q5_K (-dmin m). */
static inline bool gemm_wtype_has_nm(gemm_wtype t)
{
    return t == GEMM_W_Q4_1 || t == GEMM_W_Q5_1 || t == GEMM_W_Q4_K || t == GEMM_W_Q5_K;
}

/* Quantizes nb blocks of the row a (gemm.h's formula) into q, d, s (one
 * row of a gemm_qa); perm as there. The same bits on every ISA. */
void gemm_q8_row(const float *a, uint32_t nb, bool perm, int8_t *q, float *d, int32_t *s);

/* The AVX-512 VNNI/VBMI int8 tiles (gemm_vnni.c) by [type][mr - 1], NULL
 * for f32, f16 and bf16; they take perm = true for the qs types, false for
 * Q8_0. gemm_vnni_ok: the CPU has AVX-512 BW, VNNI and VBMI. */
extern gemm_qtile_fn *const gemm_vnni_qtiles[GEMM_W_COUNT][GEMM_MR8];
extern gemm_qtile2_fn *const gemm_vnni_qtiles2[GEMM_W_COUNT][GEMM_MR_PAIR];
bool gemm_vnni_ok(void);
/* A tall M block (more rows than one tile) runs several tiles over each
 * panel, and each tile unpacked every block again (K-quants: the planes'
 * shuffles cost about what 2-3 rows' products do). The panel's blocks are
 * unpacked once instead, GEMM_UNP_BLOCKS at a time, into a buffer the
 * tiles read: GEMM_UNP_BYTES a block (its 8 weight vectors, then s0, s1,
 * nm), 64-byte aligned. The same vectors, so the same bits. */
#define GEMM_UNP_BYTES (11u * 64u)
#define GEMM_UNP_BLOCKS 32u
typedef void gemm_unpack_fn(const uint8_t *panel, uint32_t b0, uint32_t nb, uint8_t *dst);
extern gemm_unpack_fn *const gemm_vnni_unpack[GEMM_W_COUNT];
/* by [type][mr - 1]: t->unp holds blocks t->b0 .. t->b0 + t->nb unpacked */
extern gemm_qtile_fn *const gemm_vnni_qtiles_unp[GEMM_W_COUNT][GEMM_MR8];
/* gemm_q8_row on AVX-512 (the same bytes; only where gemm_vnni_ok). */
void gemm_vnni_q8_row(const float *a, uint32_t nb, bool perm, int8_t *q, float *d, int32_t *s);

#endif
