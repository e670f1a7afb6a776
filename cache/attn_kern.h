/* attn_kern: what attn.c and the AVX-512 kernels in attn_avx512.c share
 * (internal to cache/; users include attn.h). attn.c's AVX2 path calls these
 * at PD_ISA_AVX512 for int8 rows of a single Q head, the compute-bound case;
 * every lane runs the chain attn.h's reduction order defines, so the bits
 * are those of the portable path. */
#ifndef PD_CACHE_ATTN_KERN_H
#define PD_CACHE_ATTN_KERN_H

#include <stdint.h>

/* Rows ahead that the int8 kernels prefetch (attn.c explains the choice). */
#define ATTN_PF_ROWS 32u

/* dot8(qh, k_r, hd) for the eight consecutive int8 rows r at k + r*hd, key
 * scales at ks + r*ng (one per group channels): dots[r] unscaled. Needs
 * hd % 8 == 0 and group % 8 == 0. When pf is set, the eight rows at pf (and
 * their scales at pfs) are prefetched along the way. */
void attn_avx512_dot8x8_q8(const float *qh, const int8_t *k, const float *ks, uint32_t hd,
                           uint32_t ng, uint32_t group, float dots[8], const int8_t *pf,
                           const float *pfs);

/* The value pass over n int8 rows with one scale per row (row r at v +
 * r*hd, scale vs[r], probability p[r]): o[d] = fmaf(p_r, (float)v_r[d] *
 * vs[r], o[d]) in row order for every d < hd; hd % 8 == 0. Rows [ATTN_PF_ROWS,
 * ATTN_PF_ROWS + npf) past v are prefetched, npf <= n. */
void attn_avx512_vrows_q8(float *o, const int8_t *v, const float *vs, uint32_t hd, const float *p,
                          uint32_t n, uint32_t npf);

#endif
