/* alloc: the default allocator's alignment promises, small and huge-page
 * sized, and its refusals. */
#include "pd_test.h"

#include "base/alloc.h"

#include <stdint.h>
#include <string.h>

START_TEST(alloc_small_blocks_are_64_byte_aligned_and_usable)
{
    const pd_alloc *al = pd_alloc_default();
    size_t sizes[] = {1, 63, 64, 65, 4096, 100000, ((size_t)4 << 20) - 1};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = pd_alloc_bytes(al, sizes[i]);
        ck_assert_ptr_nonnull(p);
        ck_assert_uint_eq((uintptr_t)p % 64, 0);
        memset(p, 0xa5, sizes[i]);
        ck_assert_uint_eq(p[sizes[i] - 1], 0xa5);
        pd_free_bytes(al, p, sizes[i]);
    }
}
END_TEST

START_TEST(alloc_large_blocks_start_on_a_2_mib_boundary)
{
    /* so whole huge pages fit from the first byte */
    size_t sizes[] = {(size_t)4 << 20, ((size_t)4 << 20) + 1, (size_t)9 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        unsigned char *p = pd_alloc_bytes(NULL, sizes[i]);
        ck_assert_ptr_nonnull(p);
        ck_assert_uint_eq((uintptr_t)p % ((size_t)2 << 20), 0);
        memset(p, 0x5a, sizes[i]);
        ck_assert_uint_eq(p[0], 0x5a);
        ck_assert_uint_eq(p[sizes[i] - 1], 0x5a);
        pd_free_bytes(NULL, p, sizes[i]);
    }
}
END_TEST

START_TEST(alloc_refuses_zero_and_sizes_that_overflow_when_rounded)
{
    ck_assert_ptr_null(pd_alloc_bytes(NULL, 0));
    ck_assert_ptr_null(pd_alloc_bytes(NULL, SIZE_MAX));
    ck_assert_ptr_null(pd_alloc_bytes(NULL, SIZE_MAX - 40));
    pd_free_bytes(NULL, NULL, 10); /* a no-op */
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("alloc");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, alloc_small_blocks_are_64_byte_aligned_and_usable);
    tcase_add_test(tc, alloc_large_blocks_start_on_a_2_mib_boundary);
    tcase_add_test(tc, alloc_refuses_zero_and_sizes_that_overflow_when_rounded);
    suite_add_tcase(s, tc);
    return s;
}
