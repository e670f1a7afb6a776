/* utf8: the decoder accepts exactly the well-formed sequences of Unicode's
 * Table 3-7 (checked against every code point encoded independently, and
 * every 1-, 2- and 3-byte input), returns the maximal subpart of everything
 * else (checked against the set of prefixes of well-formed sequences, and the
 * Standard's own example), never reads past n, and pd_utf8_valid names the
 * first bad offset. */
#include "pd_test.h"

#include "base/utf8.h"

#include <stdlib.h>
#include <string.h>

#define REQUIRE(cond, ...)             \
    do {                               \
        if (!(cond))                   \
            ck_abort_msg(__VA_ARGS__); \
    } while (0)

/* Independent encoder: the UTF-8 bytes of code point cp into b; length. */
static size_t encode(uint32_t cp, uint8_t b[4])
{
    if (cp < 0x80) {
        b[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        b[0] = (uint8_t)(0xc0 | cp >> 6);
        b[1] = (uint8_t)(0x80 | (cp & 0x3f));
        return 2;
    }
    if (cp < 0x10000) {
        b[0] = (uint8_t)(0xe0 | cp >> 12);
        b[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (uint8_t)(0x80 | (cp & 0x3f));
        return 3;
    }
    b[0] = (uint8_t)(0xf0 | cp >> 18);
    b[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3f));
    b[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3f));
    b[3] = (uint8_t)(0x80 | (cp & 0x3f));
    return 4;
}

static int is_scalar(uint32_t cp) { return cp <= 0x10ffff && (cp < 0xd800 || cp > 0xdfff); }

/* Bitsets of the 1-, 2- and 3-byte prefixes of every well-formed sequence
 * (a whole 1/2/3-byte sequence is its own prefix). */
static uint8_t *prefix_set[4];

static void prefix_add(const uint8_t *b, size_t m)
{
    uint32_t key = 0;
    for (size_t i = 0; i < m; i++)
        key = key << 8 | b[i];
    prefix_set[m][key >> 3] |= (uint8_t)(1u << (key & 7));
}

static int prefix_has(const uint8_t *b, size_t m)
{
    uint32_t key = 0;
    for (size_t i = 0; i < m; i++)
        key = key << 8 | b[i];
    return prefix_set[m][key >> 3] >> (key & 7) & 1;
}

static void prefixes_build(void)
{
    if (prefix_set[1])
        return;
    for (size_t m = 1; m <= 3; m++)
        prefix_set[m] = calloc((size_t)1 << (8 * m - 3), 1);
    for (uint32_t cp = 0; cp <= 0x10ffff; cp++) {
        if (!is_scalar(cp))
            continue;
        uint8_t b[4];
        size_t len = encode(cp, b);
        for (size_t m = 1; m <= len && m <= 3; m++)
            prefix_add(b, m);
    }
}

/* What decode must say about s[0..n) by the prefix definition. */
static void expect_by_definition(const uint8_t *s, size_t n)
{
    uint32_t cp = 0xdeadbeef;
    size_t bad = 99;
    size_t k = pd_utf8_decode(s, n, &cp, &bad);
    /* the well-formed sequence at s, if any: decode then re-encode */
    if (k) {
        uint8_t b[4];
        REQUIRE(k <= n && is_scalar(cp), "%02x..: k %zu cp %x", s[0], k, cp);
        REQUIRE(encode(cp, b) == k && memcmp(b, s, k) == 0, "%02x..: cp %x does not re-encode",
                s[0], cp);
        return;
    }
    size_t m = 1;
    while (m < 3 && m < n && prefix_has(s, m + 1))
        m++;
    REQUIRE(bad == m, "%02x %02x %02x (n %zu): bad %zu, want %zu", s[0], n > 1 ? s[1] : 0,
            n > 2 ? s[2] : 0, n, bad, m);
}

START_TEST(utf8_decodes_every_scalar_value)
{
    for (uint32_t cp = 0; cp <= 0x10ffff; cp++) {
        if (!is_scalar(cp))
            continue;
        uint8_t b[4];
        size_t len = encode(cp, b);
        uint32_t got = 0;
        REQUIRE(pd_utf8_decode(b, len, &got, NULL) == len && got == cp, "U+%04X", cp);
        REQUIRE(pd_utf8_valid(b, len, NULL), "U+%04X invalid", cp);
        /* cut short: ill-formed, and the subpart is everything there was */
        for (size_t n = 1; n < len; n++) {
            size_t bad = 0;
            REQUIRE(pd_utf8_decode(b, n, NULL, &bad) == 0 && bad == n, "U+%04X cut at %zu", cp, n);
        }
    }
}
END_TEST

START_TEST(utf8_every_short_input_matches_the_definition)
{
    prefixes_build();
    uint8_t s[3];
    for (uint32_t a = 0; a < 256; a++) {
        s[0] = (uint8_t)a;
        expect_by_definition(s, 1);
        for (uint32_t b = 0; b < 256; b++) {
            s[1] = (uint8_t)b;
            expect_by_definition(s, 2);
            for (uint32_t c = 0; c < 256; c++) {
                s[2] = (uint8_t)c;
                expect_by_definition(s, 3);
            }
        }
    }
    /* 4-byte inputs: every lead byte with random tails, some made to continue */
    pd_rng rng = {.s = 8};
    for (int it = 0; it < 2000000; it++) {
        uint8_t t[4];
        for (int i = 0; i < 4; i++)
            t[i] = (uint8_t)pd_rng_next(&rng);
        t[0] = (uint8_t)(0xf0 | (t[0] & 0x07));
        for (int i = 1; i < 4; i++)
            if (t[i] & 1)
                t[i] = (uint8_t)(0x80 | (t[i] & 0x3f));
        expect_by_definition(t, 4);
    }
}
END_TEST

START_TEST(utf8_refuses_overlongs_surrogates_and_beyond_u10ffff)
{
    static const struct {
        const char *s;
        size_t n, bad;
    } c[] = {
        {"\xc0\x80", 2, 1},             /* overlong NUL */
        {"\xc1\xbf", 2, 1},             /* overlong U+007F */
        {"\xe0\x80\x80", 3, 1},         /* overlong 3-byte */
        {"\xe0\x9f\xbf", 3, 1},         /* overlong U+07FF */
        {"\xed\xa0\x80", 3, 1},         /* surrogate U+D800 */
        {"\xed\xbf\xbf", 3, 1},         /* surrogate U+DFFF */
        {"\xf0\x80\x80\x80", 4, 1},     /* overlong 4-byte */
        {"\xf0\x8f\xbf\xbf", 4, 1},     /* overlong U+FFFF */
        {"\xf4\x90\x80\x80", 4, 1},     /* U+110000 */
        {"\xf5\x80\x80\x80", 4, 1},     /* lead byte past F4 */
        {"\xff", 1, 1},
        {"\x80", 1, 1},                 /* stray continuation */
        {"\xe2\x82", 2, 2},             /* truncated U+20AC */
        {"\xe2\x82\x41", 3, 2},         /* interrupted U+20AC */
        {"\xf0\x9f\x98", 3, 3},         /* truncated U+1F600 */
        {"\xf0\x9f\x98\x41", 4, 3},
    };
    for (size_t i = 0; i < sizeof c / sizeof c[0]; i++) {
        size_t bad = 0;
        uint32_t cp = 77;
        ck_assert_msg(pd_utf8_decode(c[i].s, c[i].n, &cp, &bad) == 0, "case %zu accepted", i);
        ck_assert_msg(bad == c[i].bad, "case %zu: bad %zu, want %zu", i, bad, c[i].bad);
        ck_assert_uint_eq(cp, 77); /* untouched on failure */
        ck_assert(!pd_utf8_valid(c[i].s, c[i].n, NULL));
    }
    size_t bad = 7;
    ck_assert_uint_eq(pd_utf8_decode("", 0, NULL, &bad), 0);
    ck_assert_uint_eq(bad, 0);
    /* NULL outputs are allowed */
    ck_assert_uint_eq(pd_utf8_decode("\xc3\xa9", 2, NULL, NULL), 2);
    ck_assert_uint_eq(pd_utf8_decode("\xc3", 1, NULL, NULL), 0);
}
END_TEST

START_TEST(utf8_maximal_subparts_follow_the_standard_example)
{
    /* Unicode 15, section 3.9, Table 3-11 and the text after it:
     * 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 -> a FFFD FFFD FFFD b FFFD c FFFD FFFD d */
    const uint8_t s[] = {0x61, 0xf1, 0x80, 0x80, 0xe1, 0x80, 0xc2, 0x62, 0x80, 0x63, 0x80, 0xbf, 0x64};
    const int want[] = {'a', -3, -2, -1, 'b', -1, 'c', -1, -1, 'd'}; /* <0: a U+FFFD of -w bytes */
    size_t i = 0, w = 0;
    while (i < sizeof s) {
        uint32_t cp = 0;
        size_t bad = 0, k = pd_utf8_decode(s + i, sizeof s - i, &cp, &bad);
        ck_assert_uint_lt(w, sizeof want / sizeof want[0]);
        if (k) {
            ck_assert_int_eq((int)cp, want[w]);
            i += k;
        } else {
            ck_assert_int_eq(-(int)bad, want[w]);
            i += bad;
        }
        w++;
    }
    ck_assert_uint_eq(w, sizeof want / sizeof want[0]);
}
END_TEST

START_TEST(utf8_never_reads_past_n)
{
    /* a lead byte at the very end of an exactly sized heap block: ASan would
     * flag a read of the next byte */
    static const uint8_t leads[] = {0xc3, 0xe2, 0xf0, 0xf4};
    for (size_t i = 0; i < sizeof leads; i++) {
        uint8_t *b = malloc(1);
        b[0] = leads[i];
        size_t bad = 0;
        ck_assert_uint_eq(pd_utf8_decode(b, 1, NULL, &bad), 0);
        ck_assert_uint_eq(bad, 1);
        free(b);
    }
}
END_TEST

START_TEST(utf8_valid_reports_the_first_bad_offset)
{
    size_t off = 99;
    ck_assert(pd_utf8_valid("", 0, &off));
    ck_assert(pd_utf8_valid("p7-\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80", 13, &off));
    ck_assert_uint_eq(off, 99); /* untouched when valid */
    ck_assert(pd_utf8_valid("a\0b", 3, NULL)); /* NUL is a character */
    ck_assert(!pd_utf8_valid("ab\xc3\xa9\xed\xa0\x80z", 8, &off));
    ck_assert_uint_eq(off, 4);
    ck_assert(!pd_utf8_valid("abc\xe2\x82", 5, &off));
    ck_assert_uint_eq(off, 3);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("utf8");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, utf8_decodes_every_scalar_value);
    tcase_add_test(tc, utf8_every_short_input_matches_the_definition);
    tcase_add_test(tc, utf8_refuses_overlongs_surrogates_and_beyond_u10ffff);
    tcase_add_test(tc, utf8_maximal_subparts_follow_the_standard_example);
    tcase_add_test(tc, utf8_never_reads_past_n);
    tcase_add_test(tc, utf8_valid_reports_the_first_bad_offset);
    suite_add_tcase(s, tc);
    return s;
}
