/* main() for every Check suite, and the test RNG. */
#include "pd_test.h"

#include <stdio.h>
#include <stdlib.h>
#include <ftw.h>
#include <unistd.h>

void pd_test_tmpdir(char *out, size_t cap, const char *tag)
{
    const char *tmp = getenv("TMPDIR");
    ck_assert_int_lt(snprintf(out, cap, "%s/pd_test_%s_XXXXXX", tmp && *tmp ? tmp : "/tmp", tag), (int)cap);
    ck_assert_ptr_nonnull(mkdtemp(out));
}

void pd_test_slurp(FILE *f, char *dst, size_t cap)
{
    rewind(f);
    size_t n = fread(dst, 1, cap - 1, f);
    dst[n] = '\0';
    fclose(f);
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *f)
{
    (void)sb;
    (void)f;
    return flag == FTW_DP ? rmdir(path) : unlink(path);
}

void pd_test_rmtree(const char *dir)
{
    ck_assert_int_eq(nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS), 0);
}

char pd_tmpdir[256];
static char pd_oldcwd[4096];
static int pd_did_cd;

void pd_test_dir_setup(void)
{
    pd_test_tmpdir(pd_tmpdir, sizeof pd_tmpdir, "fixture");
    pd_did_cd = 0;
}

void pd_test_dir_setup_cd(void)
{
    pd_test_dir_setup();
    ck_assert_ptr_nonnull(getcwd(pd_oldcwd, sizeof pd_oldcwd));
    ck_assert_int_eq(chdir(pd_tmpdir), 0);
    pd_did_cd = 1;
}

void pd_test_dir_teardown(void)
{
    if (pd_did_cd)
        ck_assert_int_eq(chdir(pd_oldcwd), 0);
    pd_test_rmtree(pd_tmpdir);
}

uint64_t pd_rng_next(pd_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

float pd_rng_uniform(pd_rng *r, float lo, float hi)
{
    double u = (double)(pd_rng_next(r) >> 11) / 9007199254740992.0;
    return (float)(lo + (hi - lo) * u);
}

uint32_t pd_rng_below(pd_rng *r, uint32_t n)
{
    return n ? (uint32_t)(pd_rng_next(r) % n) : 0;
}

void pd_rng_fill(pd_rng *r, float *dst, size_t n, float lo, float hi)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = pd_rng_uniform(r, lo, hi);
}

#ifdef PD_TEST_MPI
#include <mpi.h>
#include <stdio.h>

/* MPI suites: every rank runs the suite (no fork: the ranks are the MPI
 * job), the verdicts are combined with MPI_Allreduce and rank 0 reports. */
int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, size = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    SRunner *sr = srunner_create(pd_test_suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, rank == 0 ? CK_NORMAL : CK_SILENT);
    int failed = srunner_ntests_failed(sr), total = 0;
    srunner_free(sr);
    MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0)
        printf("%d ranks: %d failed checks in all\n", size, total);
    MPI_Finalize();
    return total == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
#else
int main(void)
{
    SRunner *sr = srunner_create(pd_test_suite());
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
#endif
