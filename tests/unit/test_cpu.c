/* cpu: the kernel ISA is capped at what the CPU has, PD_ISA picks it by
 * name at start-up, and every ISA has a distinct name. */
#include "pd_test.h"

#include "base/cpu.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static pd_isa isa_min(pd_isa a, pd_isa b)
{
    return a < b ? a : b;
}

/* Runs pd_cpu_isa() in a fresh child with PD_ISA=env (NULL: unset) and
 * returns what it chose. Must run before anything in this process fixed the
 * choice (the child inherits it), so this case is registered first. */
static int isa_from_env(const char *env)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        if (env)
            setenv("PD_ISA", env, 1);
        else
            unsetenv("PD_ISA");
        _exit((int)pd_cpu_isa());
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st));
    return WEXITSTATUS(st);
}

START_TEST(cpu_env_selects_isa_by_name_capped_at_the_cpu)
{
    pd_isa best = pd_cpu_detect();
    for (int i = 0; i < PD_ISA_COUNT; i++)
        ck_assert_int_eq(isa_from_env(pd_isa_name((pd_isa)i)), isa_min((pd_isa)i, best));
    ck_assert_int_eq(isa_from_env(NULL), best);
    ck_assert_int_eq(isa_from_env("no-such-isa"), best);
    ck_assert_int_eq(isa_from_env(""), best);
}
END_TEST

START_TEST(cpu_set_isa_caps_at_detect_and_sticks)
{
    pd_isa best = pd_cpu_detect();
    ck_assert_int_lt(best, PD_ISA_COUNT);
    for (int i = 0; i < PD_ISA_COUNT; i++) {
        pd_isa got = pd_cpu_set_isa((pd_isa)i);
        ck_assert_int_eq(got, isa_min((pd_isa)i, best));
        ck_assert_int_eq(pd_cpu_isa(), got);
        ck_assert_int_eq(pd_cpu_isa(), got); /* stable across calls */
    }
    ck_assert_int_eq(pd_cpu_set_isa(PD_ISA_COUNT), best); /* out of range: capped */
    ck_assert_int_eq(pd_cpu_set_isa(PD_ISA_SCALAR), PD_ISA_SCALAR); /* always available */
    ck_assert_int_eq(pd_cpu_isa(), PD_ISA_SCALAR);
    pd_cpu_set_isa(best);
}
END_TEST

START_TEST(cpu_isa_names_are_distinct_and_known)
{
    ck_assert_str_eq(pd_isa_name(PD_ISA_SCALAR), "scalar");
    ck_assert_str_eq(pd_isa_name(PD_ISA_AVX2), "avx2");
    ck_assert_str_eq(pd_isa_name(PD_ISA_AVX512), "avx512");
    for (int i = 0; i < PD_ISA_COUNT; i++)
        for (int j = 0; j < i; j++)
            ck_assert_str_ne(pd_isa_name((pd_isa)i), pd_isa_name((pd_isa)j));
    ck_assert_str_eq(pd_isa_name(PD_ISA_COUNT), "unknown");
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("cpu");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, cpu_env_selects_isa_by_name_capped_at_the_cpu); /* first: see isa_from_env */
    tcase_add_test(tc, cpu_set_isa_caps_at_detect_and_sticks);
    tcase_add_test(tc, cpu_isa_names_are_distinct_and_known);
    suite_add_tcase(s, tc);
    return s;
}
