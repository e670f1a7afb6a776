/* Tests for cluster/runtime/pipeline/digest.h: the row hash sees every bit of every value and
 * the length, is pinned to golden values (digests in output files stay
 * comparable across builds and hosts), and the chain is order sensitive. */
#include "pd_test.h"

#include "cluster/runtime/pipeline/digest.h"

#include <stdlib.h>
#include <string.h>

static uint64_t hash_bits(const uint32_t *bits, size_t n)
{
    float x[64];
    memcpy(x, bits, n * sizeof *x);
    return digest_f32(x, n);
}

START_TEST(digest_row_changes_with_every_single_bit)
{
    /* every length through two 8-value blocks plus a tail, every bit of
     * every value: 5,000+ flips, none may leave the hash unchanged or repeat */
    pd_rng r = {.s = 7};
    uint32_t bits[40];
    for (size_t n = 1; n <= 19; n += 6) {
        for (size_t i = 0; i < n; i++)
            bits[i] = (uint32_t)pd_rng_next(&r);
        uint64_t base = hash_bits(bits, n);
        size_t m = n * 32;
        uint64_t *seen = malloc(m * sizeof *seen);
        for (size_t i = 0; i < n; i++)
            for (unsigned b = 0; b < 32; b++) {
                bits[i] ^= 1u << b;
                uint64_t h = hash_bits(bits, n);
                bits[i] ^= 1u << b;
                ck_assert_msg(h != base, "n %zu: flipping bit %u of value %zu leaves the hash", n, b, i);
                seen[i * 32 + b] = h;
            }
        for (size_t i = 0; i < m; i++)
            for (size_t j = i + 1; j < m; j++)
                ck_assert_msg(seen[i] != seen[j], "n %zu: flips %zu and %zu collide", n, i, j);
        free(seen);
    }
}
END_TEST

START_TEST(digest_row_sees_bits_not_values_and_the_length)
{
    float z[2] = {0.0f, 0.0f}, nz[2] = {-0.0f, 0.0f};
    ck_assert(z[0] == nz[0]);
    ck_assert_uint_ne(digest_f32(z, 2), digest_f32(nz, 2));
    uint32_t q1 = 0x7fc00001u, q2 = 0x7fc00002u;
    ck_assert_uint_ne(hash_bits(&q1, 1), hash_bits(&q2, 1));
    /* a row and the same row with a trailing zero differ; the empty row has one fixed hash */
    float x[17] = {0};
    for (size_t n = 0; n < 16; n++)
        ck_assert_msg(digest_f32(x, n) != digest_f32(x, n + 1), "zeros of length %zu and %zu", n, n + 1);
    ck_assert_uint_eq(digest_f32(NULL, 0), digest_f32(x, 0));
    /* the values, not where they are stored */
    float *heap = malloc(17 * sizeof *heap);
    for (int i = 0; i < 17; i++)
        x[i] = heap[i] = (float)i * 0.25f - 1.0f;
    ck_assert_uint_eq(digest_f32(x, 17), digest_f32(heap, 17));
    ck_assert_uint_eq(digest_f32(x + 1, 9), digest_f32(heap + 1, 9));
    free(heap);
}
END_TEST

START_TEST(digest_golden_values_pin_the_definition)
{
    /* docs/digests.md defines these functions; the values below come from an
     * independent implementation of that text (Python integers), not from
     * this code. A change here changes every digest users have stored. */
    float x[11];
    for (int i = 0; i < 11; i++)
        x[i] = (float)i / 3.0f - 1.5f;
    ck_assert_uint_eq(digest_f32(NULL, 0), 0xf9f6ea50b085eb53ull);
    ck_assert_uint_eq(digest_f32(x, 3), 0xed6c7d321c9d00f0ull);
    ck_assert_uint_eq(digest_f32(x, 11), 0x93bd0d65829adcfcull);
    ck_assert_uint_eq(digest_chain(DIGEST_CHAIN_INIT, 1), 0xdcef7be77b037acdull);
}
END_TEST

START_TEST(digest_chain_is_order_sensitive_and_hexes_fixed_width)
{
    uint64_t a = digest_chain(digest_chain(DIGEST_CHAIN_INIT, 1), 2);
    uint64_t b = digest_chain(digest_chain(DIGEST_CHAIN_INIT, 2), 1);
    ck_assert_uint_ne(a, b);
    /* one more row (even an all-zero-hash row) changes the chain */
    ck_assert_uint_ne(digest_chain(a, 0), a);
    ck_assert_uint_ne(digest_chain(DIGEST_CHAIN_INIT, 0), digest_chain(DIGEST_CHAIN_INIT, 1));
    char hex[17];
    digest_hex(0xabcull, hex);
    ck_assert_str_eq(hex, "0000000000000abc");
    digest_hex(UINT64_MAX, hex);
    ck_assert_str_eq(hex, "ffffffffffffffff");
}
END_TEST

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

START_TEST(digest_row_has_no_collisions_over_many_near_rows)
{
    /* 32,000 distinct rows, each the base row with one value moved by
     * 1..1000 ulps (position i % W, distance i / W + 1): no two hashes equal */
    enum { W = 32, N = 32000 };
    pd_rng r = {.s = 3};
    float base[W];
    pd_rng_fill(&r, base, W, 0.5f, 1.0f);
    uint64_t *h = malloc(N * sizeof *h);
    for (uint32_t i = 0; i < N; i++) {
        uint32_t row[W];
        memcpy(row, base, sizeof row);
        row[i % W] += i / W + 1;
        h[i] = hash_bits(row, W);
    }
    qsort(h, N, sizeof *h, cmp_u64);
    for (int i = 1; i < N; i++)
        ck_assert_msg(h[i] != h[i - 1], "two distinct rows share the hash %016llx", (unsigned long long)h[i]);
    free(h);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("digest");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, digest_row_changes_with_every_single_bit);
    tcase_add_test(tc, digest_row_sees_bits_not_values_and_the_length);
    tcase_add_test(tc, digest_golden_values_pin_the_definition);
    tcase_add_test(tc, digest_chain_is_order_sensitive_and_hexes_fixed_width);
    tcase_add_test(tc, digest_row_has_no_collisions_over_many_near_rows);
    suite_add_tcase(s, tc);
    return s;
}
