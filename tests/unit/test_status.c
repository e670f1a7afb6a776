/* status: every code has a name, the first failure sticks, prefixes compose. */
#include "pd_test.h"

#include "base/status.h"

#include <string.h>

START_TEST(status_every_code_has_a_distinct_name)
{
    for (int i = 0; i < PD_STATUS_COUNT; i++) {
        ck_assert_ptr_nonnull(pd_status_str((pd_status)i));
        for (int j = 0; j < i; j++)
            ck_assert_str_ne(pd_status_str((pd_status)i), pd_status_str((pd_status)j));
    }
    ck_assert_str_eq(pd_status_str(PD_STATUS_COUNT), "unknown status");
}
END_TEST

START_TEST(status_first_failure_sticks_until_cleared)
{
    pd_err e = {0};
    ck_assert_int_eq(pd_err_set(&e, PD_ERR_FORMAT, "offset %d: bad magic", 0), PD_ERR_FORMAT);
    ck_assert_int_eq(pd_err_set(&e, PD_ERR_IO, "later"), PD_ERR_IO);
    ck_assert_int_eq(e.status, PD_ERR_FORMAT);
    ck_assert_str_eq(e.msg, "offset 0: bad magic");
    pd_err_prefix(&e, "wire");
    ck_assert_str_eq(e.msg, "wire: offset 0: bad magic");
    pd_err_clear(&e);
    ck_assert_int_eq(e.status, PD_OK);
    ck_assert_str_eq(e.msg, "");
    ck_assert_int_eq(pd_err_set(NULL, PD_ERR_ARG, "no buffer"), PD_ERR_ARG);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("status");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, status_every_code_has_a_distinct_name);
    tcase_add_test(tc, status_first_failure_sticks_until_cleared);
    suite_add_tcase(s, tc);
    return s;
}
