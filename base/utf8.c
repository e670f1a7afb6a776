/* The UTF-8 decoder (utf8.h): one table-driven pass over Table 3-7. */
#include "base/utf8.h"

size_t pd_utf8_decode(const void *s, size_t n, uint32_t *cp, size_t *bad)
{
    const unsigned char *b = s;
    if (n == 0) {
        if (bad)
            *bad = 0;
        return 0;
    }
    unsigned c = b[0];
    if (c < 0x80) {
        if (cp)
            *cp = c;
        return 1;
    }
    size_t k;                  /* continuation bytes the lead byte announces */
    unsigned lo = 0x80, hi = 0xbf; /* the range of the FIRST continuation byte */
    uint32_t v;
    if (c >= 0xc2 && c <= 0xdf) {
        k = 1, v = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        k = 2, v = c & 0x0f;
        lo = c == 0xe0 ? 0xa0 : 0x80; /* no overlong 3-byte forms */
        hi = c == 0xed ? 0x9f : 0xbf; /* no surrogates */
    } else if (c >= 0xf0 && c <= 0xf4) {
        k = 3, v = c & 0x07;
        lo = c == 0xf0 ? 0x90 : 0x80; /* no overlong 4-byte forms */
        hi = c == 0xf4 ? 0x8f : 0xbf; /* nothing above U+10FFFF */
    } else {
        if (bad)
            *bad = 1; /* C0, C1, F5..FF or a stray continuation byte */
        return 0;
    }
    for (size_t j = 1; j <= k; j++) {
        /* the input ends, or byte j does not continue this sequence */
        if (j >= n || b[j] < (j == 1 ? lo : 0x80) || b[j] > (j == 1 ? hi : 0xbf)) {
            if (bad)
                *bad = j; /* the lead byte and the j - 1 good continuations */
            return 0;
        }
        v = v << 6 | (b[j] & 0x3f);
    }
    if (cp)
        *cp = v;
    return k + 1;
}

bool pd_utf8_valid(const void *s, size_t n, size_t *err_off)
{
    const unsigned char *b = s;
    for (size_t i = 0; i < n;) {
        size_t k = pd_utf8_decode(b + i, n - i, NULL, NULL);
        if (!k) {
            if (err_off)
                *err_off = i;
            return false;
        }
        i += k;
    }
    return true;
}
