/* fnv: FNV-1a 64 gives the published test vectors, the values the page keys,
 * id sets and CMFS identities had before the copies were merged into
 * base/fnv.c (pinned: a change here would change sampled tokens and record
 * identities), and its three entry points agree with each other. */
#include "pd_test.h"

#include "base/fnv.h"

#include <string.h>

START_TEST(fnv_matches_published_test_vectors)
{
    /* FNV-1a 64 vectors from the reference (Fowler, Noll, Vo) test suite */
    ck_assert_uint_eq(pd_fnv_str(""), 0xcbf29ce484222325ull);
    ck_assert_uint_eq(pd_fnv_str("a"), 0xaf63dc4c8601ec8cull);
    ck_assert_uint_eq(pd_fnv_str("foobar"), 0x85944171f73967e8ull);
    ck_assert_uint_eq(PD_FNV_OFFSET, 0xcbf29ce484222325ull);
    ck_assert_uint_eq(PD_FNV_PRIME, 0x100000001b3ull);
}
END_TEST

START_TEST(fnv_pins_page_keys_computed_before_the_merge)
{
    /* sample_page_key (and the pages / outfile id sets) of these ids, as the
     * separate copies computed them before they became pd_fnv_str */
    static const struct {
        const char *id;
        uint64_t key;
    } pin[] = {
        {"p00000", 0x08a2935a7995037dull},
        {"p7", 0x08d59107b575e088ull},
        {"page-\xc3\xa9", 0x95abc79e66b2e13dull},
    };
    for (size_t i = 0; i < sizeof pin / sizeof pin[0]; i++) {
        ck_assert_uint_eq(pd_fnv_str(pin[i].id), pin[i].key);
        ck_assert_uint_eq(pd_fnv_bytes(PD_FNV_OFFSET, pin[i].id, strlen(pin[i].id)), pin[i].key);
    }
}
END_TEST

START_TEST(fnv_null_string_hashes_like_the_empty_one)
{
    ck_assert_uint_eq(pd_fnv_str(NULL), pd_fnv_str(""));
    ck_assert_uint_eq(pd_fnv_bytes(PD_FNV_OFFSET, NULL, 0), PD_FNV_OFFSET);
    ck_assert_uint_eq(pd_fnv_bytes(12345, NULL, 0), 12345);
}
END_TEST

START_TEST(fnv_bytes_continues_a_hash_across_pieces)
{
    const char *s = "CMFS-id and some policy";
    size_t n = strlen(s);
    uint64_t whole = pd_fnv_bytes(PD_FNV_OFFSET, s, n);
    for (size_t cut = 0; cut <= n; cut++)
        ck_assert_uint_eq(pd_fnv_bytes(pd_fnv_bytes(PD_FNV_OFFSET, s, cut), s + cut, n - cut),
                          whole);
    /* a byte with the high bit set is hashed as an unsigned byte */
    const unsigned char hi[1] = {0xe9};
    ck_assert_uint_eq(pd_fnv_bytes(PD_FNV_OFFSET, hi, 1),
                      (PD_FNV_OFFSET ^ 0xe9u) * PD_FNV_PRIME);
}
END_TEST

START_TEST(fnv_le_hashes_the_little_endian_bytes_of_a_value)
{
    const uint8_t le[8] = {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08};
    const uint64_t v = 0x0807060504030201ull;
    for (unsigned k = 0; k <= 8; k++)
        ck_assert_uint_eq(pd_fnv_le(PD_FNV_OFFSET, v, k), pd_fnv_bytes(PD_FNV_OFFSET, le, k));
    /* bytes above nbytes do not count */
    ck_assert_uint_eq(pd_fnv_le(7, 0xffffffff00000005ull, 4), pd_fnv_le(7, 5, 4));
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("fnv");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, fnv_matches_published_test_vectors);
    tcase_add_test(tc, fnv_pins_page_keys_computed_before_the_merge);
    tcase_add_test(tc, fnv_null_string_hashes_like_the_empty_one);
    tcase_add_test(tc, fnv_bytes_continues_a_hash_across_pieces);
    tcase_add_test(tc, fnv_le_hashes_the_little_endian_bytes_of_a_value);
    suite_add_tcase(s, tc);
    return s;
}
