/* CRC32C: a slicing-by-8 table path and an SSE4.2 path that agree bit for bit.
 * The tables are built once (pthread_once); they are constants in all but
 * name and carry no answer-relevant state. */
#include "comm/crc32c.h"

#include "base/cpu.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY 0x82F63B78u /* Castagnoli, reflected */

static uint32_t crc_table[8][256];
static pthread_once_t crc_table_once = PTHREAD_ONCE_INIT;

static void crc_table_build(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int b = 0; b < 8; b++)
            c = (c >> 1) ^ ((c & 1u) ? CRC32C_POLY : 0u);
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            crc_table[t][i] = (crc_table[t - 1][i] >> 8) ^ crc_table[0][crc_table[t - 1][i] & 0xffu];
}

/* Raw (non-inverted) register update, table path. */
static uint32_t crc_raw_table(uint32_t c, const uint8_t *p, size_t n)
{
    while (n && ((uintptr_t)p & 7u)) {
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xffu];
        n--;
    }
    while (n >= 8) {
        /* Bytes in memory order, independent of host endianness. */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
                           (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16 |
                      (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xffu] ^ crc_table[6][(lo >> 8) & 0xffu] ^
            crc_table[5][(lo >> 16) & 0xffu] ^ crc_table[4][lo >> 24] ^
            crc_table[3][hi & 0xffu] ^ crc_table[2][(hi >> 8) & 0xffu] ^
            crc_table[1][(hi >> 16) & 0xffu] ^ crc_table[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--)
        c = (c >> 8) ^ crc_table[0][(c ^ *p++) & 0xffu];
    return c;
}

uint32_t crc32c_update_portable(uint32_t crc, const void *buf, size_t n)
{
    pthread_once(&crc_table_once, crc_table_build);
    if (n == 0)
        return crc;
    return ~crc_raw_table(~crc, (const uint8_t *)buf, n);
}

#if defined(__x86_64__)
#include <immintrin.h>

__attribute__((target("sse4.2"))) static uint32_t crc_raw_hw(uint32_t c, const uint8_t *p,
                                                                size_t n)
{
    while (n && ((uintptr_t)p & 7u)) {
        c = _mm_crc32_u8(c, *p++);
        n--;
    }
    uint64_t c64 = c;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c64 = _mm_crc32_u64(c64, v);
        p += 8;
        n -= 8;
    }
    c = (uint32_t)c64;
    while (n--)
        c = _mm_crc32_u8(c, *p++);
    return c;
}

static int crc_hw_usable(void)
{
    __builtin_cpu_init();
    return pd_cpu_isa() >= PD_ISA_AVX2 && __builtin_cpu_supports("sse4.2");
}
#endif

int crc32c_hw_active(void)
{
#if defined(__x86_64__)
    return crc_hw_usable();
#else
    return 0;
#endif
}

uint32_t crc32c_update(uint32_t crc, const void *buf, size_t n)
{
    if (n == 0)
        return crc;
#if defined(__x86_64__)
    if (crc_hw_usable())
        return ~crc_raw_hw(~crc, (const uint8_t *)buf, n);
#endif
    return crc32c_update_portable(crc, buf, n);
}
