/* ucd: the Unicode data the tokenizer's pre-tokenizers need: each code point's
 * general-category class and the White_Space property, generated into ucd.c by
 * scripts/gen_unicode.py from a pinned Unicode version (ucd_unicode_version).
 * Classes group categories as llama.cpp's unicode tables do. */
#ifndef PD_UCD_H
#define PD_UCD_H

#include <stdint.h>

enum {
    UCD_CODEPOINTS = 0x110000,
    UCD_UNDEFINED = 0, /* Cn */
    UCD_NUMBER = 1,    /* Nd Nl No: \p{N} */
    UCD_LETTER = 2,    /* Lu Ll Lt Lm Lo: \p{L} */
    UCD_MARK = 3,      /* Mn Mc Me: \p{M} */
    UCD_PUNCT = 4,     /* Pc Pd Ps Pe Pi Pf Po: \p{P} */
    UCD_SYMBOL = 5,    /* Sm Sc Sk So: \p{S} */
    UCD_SEPARATOR = 6, /* Zs Zl Zp */
    UCD_CONTROL = 7,   /* Cc Cf Cs Co */
    UCD_CLASS_MASK = 7,
    UCD_WHITESPACE = 8 /* bit: White_Space */
};

/* The Unicode version the data was generated from ("14.0.0"). */
extern const char ucd_unicode_version[];

/* Writes every code point's class | UCD_WHITESPACE bit into table. */
void ucd_fill(uint8_t table[UCD_CODEPOINTS]);

#endif
