/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of state
 * bundles.
 *
 * Two paths compute the same value bit for bit: a portable slicing-by-8 table
 * path and an SSE4.2 `crc32` instruction path, chosen by pd_cpu_isa() (the
 * hardware path runs only when the ISA in force is AVX2 and the CPU has
 * SSE4.2; PD_ISA=scalar forces the table path).
 *
 * Convention (as zlib's crc32): the value passed in and returned is the
 * finished CRC, so crc32c_update(0, "123456789", 9) == 0xE3069283 and
 * crc32c_update(crc32c_update(0, a, n), b, m) is the CRC of a ++ b. */
#ifndef PD_COMM_CRC32C_H
#define PD_COMM_CRC32C_H

#include <stddef.h>
#include <stdint.h>

/* CRC32C of buf[0..n) continued from crc (0 to start). buf may be NULL when n == 0. */
uint32_t crc32c_update(uint32_t crc, const void *buf, size_t n);

/* The portable table path, whatever the ISA (tests compare the two). */
uint32_t crc32c_update_portable(uint32_t crc, const void *buf, size_t n);

/* 1 when crc32c_update currently uses the SSE4.2 instruction. */
int crc32c_hw_active(void);

#endif
