/* digest: 64-bit hashes of the exact bits of float rows, and the per-page
 * chain that `pipedec run --digest` writes.
 *
 * A page's digest tells two runs apart whenever any logits row the tail
 * computed for the page differs in any bit, even when every sampled token is
 * the same. It is what the identity tests compare (docs/digests.md).
 *
 *   row hash   digest_f32(row, n): four-lane multiply-rotate rounds (the
 *              XXH64 round structure) over the IEEE-754 bit patterns taken as
 *              u32 values, two per 64-bit word, then a splitmix64 finalizer.
 *              Defined on the values, not the bytes, so it does not depend on
 *              the host's byte order. -0.0 and +0.0, and NaNs with different
 *              payloads, hash differently: bits, not values.
 *   chain      d_0 = DIGEST_CHAIN_INIT; d_{i+1} = digest_chain(d_i, h_i) for
 *              the logits row hashes h_i of a page in position order (the
 *              last prefill row first, the row that sampled EOS included).
 *              Order matters: swapping two rows changes the result.
 *
 * Pure functions, no state, no allocation. */
#ifndef PD_DIGEST_H
#define PD_DIGEST_H

#include <stddef.h>
#include <stdint.h>

#define DIGEST_CHAIN_INIT 0x70646467ull /* "pddg": the digest of a page with no logits rows */

/* Hash of the bit patterns of x[0..n). */
uint64_t digest_f32(const float *x, size_t n);

/* The next link of a chain: d is the chain so far, h a row hash. */
uint64_t digest_chain(uint64_t d, uint64_t h);

/* Writes d as 16 lower-case hex digits and a NUL into out[17]. */
void digest_hex(uint64_t d, char out[17]);

#endif
