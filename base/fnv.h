/* FNV-1a 64: the project's one small non-cryptographic hash.
 *
 * h = offset basis; for each byte b: h = (h ^ b) * prime. Used where a value
 * must be the same on every machine and in every build: the page key that
 * seeds sampling (sample.h), the id sets of pages and outfile, the CMFS
 * identity (wire.h, which documents its exact byte stream) and the tail of the
 * model digest. Changing anything here changes those values, and so record
 * identities and sampled tokens: tests/unit/test_fnv.c pins them.
 *
 * Not for hostile keys (no seed; collisions are easy to make on purpose):
 * the id sets only use it to pick a probe slot and compare the strings. */
#ifndef PD_FNV_H
#define PD_FNV_H

#include <stddef.h>
#include <stdint.h>

#define PD_FNV_OFFSET 0xcbf29ce484222325ull /* FNV-1a 64 offset basis */
#define PD_FNV_PRIME 0x100000001b3ull       /* FNV-1a 64 prime */

/* Continues hash h over the bytes p[0..n) (p may be NULL when n == 0). Start
 * from PD_FNV_OFFSET, or from a value another hash left. */
uint64_t pd_fnv_bytes(uint64_t h, const void *p, size_t n);

/* Continues hash h over the low nbytes (<= 8) bytes of v, least significant
 * first: a field hashed as it would be stored little-endian, on any host. */
uint64_t pd_fnv_le(uint64_t h, uint64_t v, unsigned nbytes);

/* FNV-1a 64 of the bytes of a NUL-terminated string (the NUL excluded), from
 * the offset basis; NULL hashes like "" (to PD_FNV_OFFSET). */
uint64_t pd_fnv_str(const char *s);

#endif
