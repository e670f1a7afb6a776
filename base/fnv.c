/* FNV-1a 64 (fnv.h). Byte at a time on purpose: the value is defined per
 * byte, and every caller hashes short inputs (ids, a record header, the last
 * few bytes of a file). */
#include "base/fnv.h"

#include "base/check.h"

uint64_t pd_fnv_bytes(uint64_t h, const void *p, size_t n)
{
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++)
        h = (h ^ b[i]) * PD_FNV_PRIME;
    return h;
}

uint64_t pd_fnv_le(uint64_t h, uint64_t v, unsigned nbytes)
{
    CHECK(nbytes <= 8);
    for (unsigned i = 0; i < nbytes; i++)
        h = (h ^ (uint8_t)(v >> (8 * i))) * PD_FNV_PRIME;
    return h;
}

uint64_t pd_fnv_str(const char *s)
{
    uint64_t h = PD_FNV_OFFSET;
    for (const unsigned char *c = (const unsigned char *)(s ? s : ""); *c; c++)
        h = (h ^ *c) * PD_FNV_PRIME;
    return h;
}
