/* digest: bit-exact row hashes and the per-page chain (layout in digest.h). */
#include "cluster/runtime/pipeline/digest.h"

#include <stdio.h>
#include <string.h>

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull

static inline uint64_t rotl(uint64_t x, unsigned r)
{
    return (x << r) | (x >> (64 - r));
}

static inline uint64_t round64(uint64_t acc, uint64_t w)
{
    return rotl(acc + w * P2, 31) * P1;
}

/* splitmix64's finalizer: every input bit reaches every output bit. */
static inline uint64_t fmix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static inline uint64_t word(const float *x, size_t i)
{
    uint32_t lo, hi;
    memcpy(&lo, x + i, 4);
    memcpy(&hi, x + i + 1, 4);
    return (uint64_t)lo | (uint64_t)hi << 32;
}

uint64_t digest_f32(const float *x, size_t n)
{
    uint64_t a = P1 + P2, b = P2, c = 0, d = 0 - P1;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        a = round64(a, word(x, i));
        b = round64(b, word(x, i + 2));
        c = round64(c, word(x, i + 4));
        d = round64(d, word(x, i + 6));
    }
    uint64_t h = rotl(a, 1) + rotl(b, 7) + rotl(c, 12) + rotl(d, 18);
    h ^= (uint64_t)n * P3;
    for (; i < n; i++) {
        uint32_t v;
        memcpy(&v, x + i, 4);
        h = rotl(h ^ ((uint64_t)v * P1), 23) * P2 + P3;
    }
    return fmix(h);
}

uint64_t digest_chain(uint64_t d, uint64_t h)
{
    return fmix(rotl(d, 17) * P1 + h);
}

void digest_hex(uint64_t d, char out[17])
{
    snprintf(out, 17, "%016llx", (unsigned long long)d);
}
