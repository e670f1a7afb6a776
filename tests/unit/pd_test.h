/* Shared scaffolding for the Check suites: each tests/unit/test_<module>.c
 * defines `Suite *pd_test_suite(void)`; pd_test.c supplies main(), which runs
 * it and exits non-zero on any failure. Also a deterministic RNG so every
 * randomized test is reproducible from its seed. */
#ifndef PD_TEST_H
#define PD_TEST_H

#include <check.h>
#include <stdint.h>
#include <stdio.h>

Suite *pd_test_suite(void);

/* The number of cases in a static table, for
 *   tcase_add_loop_test(tc, test, 0, PD_COUNT(cases));   (the case is _i) */
#define PD_COUNT(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* splitmix64: a tiny deterministic generator for test data. */
typedef struct pd_rng {
    uint64_t s;
} pd_rng;

uint64_t pd_rng_next(pd_rng *r);
/* Uniform in [lo, hi). */
float pd_rng_uniform(pd_rng *r, float lo, float hi);
/* Uniform integer in [0, n). */
uint32_t pd_rng_below(pd_rng *r, uint32_t n);
/* Fills dst[0..n) with uniform values in [lo, hi). */
void pd_rng_fill(pd_rng *r, float *dst, size_t n, float lo, float hi);

/* What a stream holds from its start into dst (cap bytes, NUL-terminated,
 * the rest cut off), then closed: a tmpfile() a command wrote to. */
void pd_test_slurp(FILE *f, char *dst, size_t cap);

/* A fresh directory $TMPDIR/pd_test_<tag>_XXXXXX (TMPDIR unset or empty:
 * /tmp) into out (cap >= 64), and its removal with everything in it (links
 * are removed, never followed). */
void pd_test_tmpdir(char *out, size_t cap, const char *tag);
void pd_test_rmtree(const char *dir);

/* The temp-dir fixture the file-handling suites share: before each test
 * pd_tmpdir is a fresh $TMPDIR/pd_test_fixture_XXXXXX (the _cd variant also
 * makes it the working directory); after it, the working directory is
 * restored and the directory removed with everything in it.
 *   tcase_add_checked_fixture(tc, pd_test_dir_setup_cd, pd_test_dir_teardown); */
extern char pd_tmpdir[256];
void pd_test_dir_setup(void);
void pd_test_dir_setup_cd(void);
void pd_test_dir_teardown(void);

#endif
