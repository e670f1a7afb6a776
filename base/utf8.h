/* utf8: the one UTF-8 decoder: well-formedness by the Unicode Standard's
 * Table 3-7 and, for what is not well-formed, the length of the maximal
 * subpart that one U+FFFD replaces.
 *
 * Well-formed sequences (Unicode 15, section 3.9, Table 3-7):
 *   U+0000..U+007F     00..7F
 *   U+0080..U+07FF     C2..DF 80..BF
 *   U+0800..U+0FFF     E0     A0..BF 80..BF
 *   U+1000..U+CFFF     E1..EC 80..BF 80..BF
 *   U+D000..U+D7FF     ED     80..9F 80..BF      (no surrogates)
 *   U+E000..U+FFFF     EE..EF 80..BF 80..BF
 *   U+10000..U+3FFFF   F0     90..BF 80..BF 80..BF
 *   U+40000..U+FFFFF   F1..F3 80..BF 80..BF 80..BF
 *   U+100000..U+10FFFF F4     80..8F 80..BF 80..BF
 * so overlong forms, surrogates and code points above U+10FFFF are refused.
 * A maximal subpart (section 3.9, "U+FFFD Substitution of Maximal Subparts",
 * the practice W3C and WHATWG decoders follow) is the longest prefix of an
 * ill-formed sequence that could still start a well-formed one: at least one
 * byte, at most three. Callers: page ids must be valid (pages), output text
 * repairs each maximal subpart into one U+FFFD (outfile, vocab). */
#ifndef PD_UTF8_H
#define PD_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Decodes the sequence that starts at s[0] within s[0..n).
 * Well-formed: returns its length (1..4) and sets *cp (when cp is not NULL)
 * to its code point. Ill-formed (a bad lead byte, a bad or missing
 * continuation byte): returns 0 and sets *bad (when not NULL) to the length of
 * its maximal subpart (1..3), the bytes to skip before decoding again.
 * n == 0 returns 0 with *bad = 0. Reads at most min(n, 4) bytes. */
size_t pd_utf8_decode(const void *s, size_t n, uint32_t *cp, size_t *bad);

/* True when all of s[0..n) is well-formed UTF-8 (n == 0: true). When
 * err_off is not NULL and the text is not valid, *err_off receives the
 * offset of the first ill-formed sequence. */
bool pd_utf8_valid(const void *s, size_t n, size_t *err_off);

#endif
