/* file: opening for reading accepts regular files only (directories, fifos,
 * devices and missing paths are refused with the path and the step, a fifo
 * without blocking), exact reads tell a short file from success and name the
 * offset, and ctx = NULL leaves the prefix out. Publishing leaves the target
 * untouched until commit, replaces it whole, sets the mode exactly, and
 * leaves no temporary file behind after commit, abort or any failure. */
#include "pd_test.h"

#include "base/file.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[64];

static void setup(void)
{
    pd_test_tmpdir(tmpdir, sizeof tmpdir, "file");
}

static void teardown(void)
{
    pd_test_rmtree(tmpdir);
}

static void path_in(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

static void put(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(b, 1, n, f), n);
    ck_assert_int_eq(fclose(f), 0);
}

START_TEST(file_open_read_gives_a_descriptor_and_the_size)
{
    char p[128];
    path_in(p, sizeof p, "a.bin");
    put(p, "0123456789", 10);
    int fd = -1;
    uint64_t size = 0;
    pd_err err = {0};
    ck_assert_msg(pd_file_open_read(p, "t", &fd, &size, &err) == PD_OK, "%s", err.msg);
    ck_assert_int_ge(fd, 0);
    ck_assert_uint_eq(size, 10);
    ck_assert_int_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0);
    ck_assert_int_ne(fcntl(fd, F_GETFD) & FD_CLOEXEC, 0);
    char b[4];
    ck_assert_int_eq(pd_file_read_at(fd, b, 4, 3, p, "t", &err), PD_OK);
    ck_assert_mem_eq(b, "3456", 4);
    close(fd);
    /* an empty file is a regular file of size 0 */
    path_in(p, sizeof p, "empty");
    put(p, "", 0);
    ck_assert_int_eq(pd_file_open_read(p, "t", &fd, &size, &err), PD_OK);
    ck_assert_uint_eq(size, 0);
    close(fd);
}
END_TEST

/* Expects pd_file_open_read(path) to fail with st and exactly msg, leaving
 * the outputs alone and no descriptor open. */
static void expect_refused(const char *path, const char *ctx, pd_status st, const char *msg)
{
    int fd = -77;
    uint64_t size = 77;
    pd_err err = {0};
    int probe = open("/dev/null", O_RDONLY);
    ck_assert_int_eq(pd_file_open_read(path, ctx, &fd, &size, &err), st);
    ck_assert_str_eq(err.msg, msg);
    ck_assert_int_eq(fd, -77);
    ck_assert_uint_eq(size, 77);
    int next = open("/dev/null", O_RDONLY); /* the lowest free one: nothing leaked */
    ck_assert_int_eq(next, probe + 1);
    close(next);
    close(probe);
}

START_TEST(file_open_read_refuses_what_is_not_a_regular_file)
{
    char p[128], want[256];
    path_in(p, sizeof p, "missing");
    snprintf(want, sizeof want, "npy: %s: cannot open: No such file or directory", p);
    expect_refused(p, "npy", PD_ERR_IO, want);
    snprintf(want, sizeof want, "%s: not a regular file", tmpdir);
    expect_refused(tmpdir, NULL, PD_ERR_IO, want);
    expect_refused("/dev/null", "gguf", PD_ERR_IO, "gguf: /dev/null: not a regular file");
    /* a fifo with no writer: refused at once, not waited on */
    path_in(p, sizeof p, "fifo");
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    snprintf(want, sizeof want, "x: %s: not a regular file", p);
    expect_refused(p, "x", PD_ERR_IO, want);
    pd_err err = {0};
    int fd;
    uint64_t size;
    ck_assert_int_eq(pd_file_open_read(NULL, "x", &fd, &size, &err), PD_ERR_ARG);
}
END_TEST

START_TEST(file_check_regular_takes_a_descriptor_opened_elsewhere)
{
    char p[128];
    path_in(p, sizeof p, "rw.bin");
    int fd = open(p, O_RDWR | O_CREAT | O_APPEND, 0644);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "abc", 3), 3);
    uint64_t size = 0;
    pd_err err = {0};
    ck_assert_int_eq(pd_file_check_regular(fd, p, "outfile", &size, &err), PD_OK);
    ck_assert_uint_eq(size, 3);
    close(fd);
    int pipefd[2];
    ck_assert_int_eq(pipe(pipefd), 0);
    size = 9;
    ck_assert_int_eq(pd_file_check_regular(pipefd[0], "pipe", "outfile", &size, &err), PD_ERR_IO);
    ck_assert_str_eq(err.msg, "outfile: pipe: not a regular file");
    ck_assert_uint_eq(size, 9);
    close(pipefd[0]);
    close(pipefd[1]);
}
END_TEST

START_TEST(file_read_at_names_the_offset_where_the_file_ended)
{
    char p[128], want[256];
    path_in(p, sizeof p, "short.bin");
    put(p, "0123456789", 10);
    int fd;
    uint64_t size;
    pd_err err = {0};
    ck_assert_int_eq(pd_file_open_read(p, "npy", &fd, &size, &err), PD_OK);
    char b[16];
    ck_assert_int_eq(pd_file_read_at(fd, b, 10, 0, p, "npy", &err), PD_OK);
    ck_assert_int_eq(pd_file_read_at(fd, b, 0, 99, p, "npy", &err), PD_OK); /* nothing to read */
    ck_assert_int_eq(pd_file_read_at(fd, b, 8, 6, p, "npy", &err), PD_ERR_TRUNCATED);
    snprintf(want, sizeof want, "npy: %s: offset 10: file ended early (changed while read?)", p);
    ck_assert_str_eq(err.msg, want);
    close(fd);
    /* a descriptor that cannot be read: an i/o error with the reason */
    fd = open(p, O_WRONLY);
    ck_assert_int_ge(fd, 0);
    pd_err_clear(&err);
    ck_assert_int_eq(pd_file_read_at(fd, b, 4, 2, p, NULL, &err), PD_ERR_IO);
    snprintf(want, sizeof want, "%s: offset 2: read: Bad file descriptor", p);
    ck_assert_str_eq(err.msg, want);
    close(fd);
}
END_TEST

/* ---- publish ---------------------------------------------------------------- */

/* The file's contents as a string (at most cap - 1 bytes); "" if missing. */
static const char *slurp(const char *path, char *buf, size_t cap)
{
    buf[0] = '\0';
    FILE *f = fopen(path, "rb");
    if (!f)
        return buf;
    size_t n = fread(buf, 1, cap - 1, f);
    buf[n] = '\0';
    fclose(f);
    return buf;
}

/* Entries of tmpdir (without . and ..). */
static int entries(void)
{
    DIR *d = opendir(tmpdir);
    ck_assert_ptr_nonnull(d);
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    closedir(d);
    return n;
}

START_TEST(file_read_all_reads_the_whole_file_nul_terminated)
{
    char p[128];
    path_in(p, sizeof p, "all.bin");
    put(p, "ab\0cd", 5);
    uint8_t *b = NULL;
    size_t n = 0;
    pd_err e = {0};
    ck_assert_int_eq(pd_file_read_all(p, "test", &b, &n, &e), PD_OK);
    ck_assert_uint_eq(n, 5);
    ck_assert_int_eq(memcmp(b, "ab\0cd", 5), 0);
    ck_assert_uint_eq(b[5], 0);
    free(b);
    put(p, "", 0);
    ck_assert_int_eq(pd_file_read_all(p, NULL, &b, &n, &e), PD_OK);
    ck_assert_uint_eq(n, 0);
    ck_assert_uint_eq(b[0], 0);
    free(b);
    /* what is not a regular file is refused, naming it */
    pd_err_clear(&e);
    ck_assert_int_ne(pd_file_read_all(tmpdir, "test", &b, &n, &e), PD_OK);
    ck_assert_msg(strstr(e.msg, tmpdir) != NULL, "%s", e.msg);
    path_in(p, sizeof p, "missing");
    pd_err_clear(&e);
    ck_assert_int_ne(pd_file_read_all(p, "test", &b, &n, &e), PD_OK);
    ck_assert_msg(strstr(e.msg, "missing") != NULL, "%s", e.msg);
}
END_TEST

START_TEST(file_publish_replaces_the_target_only_at_commit)
{
    char p[128], buf[64];
    path_in(p, sizeof p, "out.bin");
    put(p, "old", 3);
    pd_publish *pub = NULL;
    pd_err err = {0};
    ck_assert_msg(pd_file_publish_begin(p, 0640, "t", &pub, &err) == PD_OK, "%s", err.msg);
    const char *tmp = pd_file_publish_tmp_path(pub);
    ck_assert_int_eq(strncmp(tmp, p, strlen(p)), 0);
    ck_assert_int_eq(strncmp(tmp + strlen(p), ".tmp.", 5), 0);
    ck_assert_int_eq(pd_file_publish_write(pub, "new ", 4, &err), PD_OK);
    ck_assert_int_eq(write(pd_file_publish_fd(pub), "bytes", 5), 5); /* the raw descriptor too */
    ck_assert_str_eq(slurp(p, buf, sizeof buf), "old");
    ck_assert_str_eq(slurp(tmp, buf, sizeof buf), "new bytes");
    ck_assert_int_eq(entries(), 2);
    ck_assert_msg(pd_file_publish_commit(pub, &err) == PD_OK, "%s", err.msg);
    ck_assert_str_eq(slurp(p, buf, sizeof buf), "new bytes");
    ck_assert_int_eq(entries(), 1);
    struct stat sb;
    ck_assert_int_eq(stat(p, &sb), 0);
    ck_assert_int_eq(sb.st_mode & 07777, 0640); /* exactly, whatever the umask */
    /* a target that did not exist yet */
    path_in(p, sizeof p, "fresh.bin");
    ck_assert_int_eq(pd_file_publish_begin(p, 0644, "t", &pub, &err), PD_OK);
    ck_assert_int_eq(pd_file_publish_commit(pub, &err), PD_OK);
    ck_assert_int_eq(stat(p, &sb), 0);
    ck_assert_int_eq(sb.st_size, 0);
    ck_assert_int_eq(sb.st_mode & 07777, 0644);
    ck_assert_int_eq(entries(), 2);
}
END_TEST

START_TEST(file_publish_stream_carries_formatted_output)
{
    char p[128], buf[64];
    path_in(p, sizeof p, "m.jsonl");
    pd_publish *pub = NULL;
    pd_err err = {0};
    ck_assert_int_eq(pd_file_publish_begin(p, 0644, NULL, &pub, &err), PD_OK);
    FILE *f = pd_file_publish_stream(pub, &err);
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_eq(pd_file_publish_stream(pub, &err), f);
    fprintf(f, "{\"id\":\"p%05u\"}\n", 7u);
    ck_assert_int_eq(access(p, F_OK), -1);
    ck_assert_msg(pd_file_publish_commit(pub, &err) == PD_OK, "%s", err.msg);
    ck_assert_str_eq(slurp(p, buf, sizeof buf), "{\"id\":\"p00007\"}\n");
    ck_assert_int_eq(entries(), 1);
}
END_TEST

START_TEST(file_publish_abort_leaves_the_target_and_nothing_else)
{
    char p[128], buf[64];
    path_in(p, sizeof p, "keep.bin");
    put(p, "old", 3);
    pd_publish *pub = NULL;
    pd_err err = {0};
    ck_assert_int_eq(pd_file_publish_begin(p, 0644, "t", &pub, &err), PD_OK);
    ck_assert_int_eq(pd_file_publish_write(pub, "half", 4, &err), PD_OK);
    pd_file_publish_abort(pub);
    ck_assert_str_eq(slurp(p, buf, sizeof buf), "old");
    ck_assert_int_eq(entries(), 1);
    /* with a stream open too */
    ck_assert_int_eq(pd_file_publish_begin(p, 0644, "t", &pub, &err), PD_OK);
    fputs("half", pd_file_publish_stream(pub, &err));
    pd_file_publish_abort(pub);
    ck_assert_str_eq(slurp(p, buf, sizeof buf), "old");
    ck_assert_int_eq(entries(), 1);
    pd_file_publish_abort(NULL);
}
END_TEST

START_TEST(file_publish_failures_name_path_and_step_and_publish_nothing)
{
    char p[128], want[512], buf[64];
    /* no such directory: nothing created */
    path_in(p, sizeof p, "no/such/f.bin");
    pd_publish *pub = (pd_publish *)&want; /* must stay untouched */
    pd_err err = {0};
    ck_assert_int_eq(pd_file_publish_begin(p, 0644, "gguf writer", &pub, &err), PD_ERR_IO);
    snprintf(want, sizeof want,
             "gguf writer: %s: create a temporary file beside it: No such file or directory", p);
    ck_assert_str_eq(err.msg, want);
    ck_assert_ptr_eq(pub, (pd_publish *)&want);
    ck_assert_int_eq(entries(), 0);

    /* a write that fails (file size limit): commit refuses, target untouched */
    path_in(p, sizeof p, "big.bin");
    put(p, "old", 3);
    struct rlimit old, lim;
    ck_assert_int_eq(getrlimit(RLIMIT_FSIZE, &old), 0);
    void (*prev)(int) = signal(SIGXFSZ, SIG_IGN);
    ck_assert_int_eq(pd_file_publish_begin(p, 0644, "npy", &pub, &err), PD_OK);
    char tmp[200];
    snprintf(tmp, sizeof tmp, "%s", pd_file_publish_tmp_path(pub));
    lim = old;
    lim.rlim_cur = 16;
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &lim), 0);
    static const char data[100] = {0};
    pd_err_clear(&err);
    pd_status st = pd_file_publish_write(pub, data, sizeof data, &err);
    ck_assert_int_eq(setrlimit(RLIMIT_FSIZE, &old), 0);
    signal(SIGXFSZ, prev);
    ck_assert_int_eq(st, PD_ERR_IO);
    snprintf(want, sizeof want, "npy: %s: write %s: File too large", p, tmp);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(pd_file_publish_write(pub, "x", 1, &err), PD_ERR_IO); /* sticky */
    pd_err_clear(&err);
    ck_assert_int_eq(pd_file_publish_commit(pub, &err), PD_ERR_IO);
    ck_assert_str_eq(slurp(p, buf, sizeof buf), "old");
    ck_assert_int_eq(entries(), 1);
    ck_assert_int_eq(access(tmp, F_OK), -1);

    /* a target that is a directory: the rename fails, nothing is left */
    path_in(p, sizeof p, "adir");
    ck_assert_int_eq(mkdir(p, 0755), 0);
    ck_assert_int_eq(pd_file_publish_begin(p, 0644, "t", &pub, &err), PD_OK);
    snprintf(tmp, sizeof tmp, "%s", pd_file_publish_tmp_path(pub));
    pd_err_clear(&err);
    ck_assert_int_eq(pd_file_publish_commit(pub, &err), PD_ERR_IO);
    snprintf(want, sizeof want, "t: %s: rename %s over it: Is a directory", p, tmp);
    ck_assert_str_eq(err.msg, want);
    ck_assert_int_eq(entries(), 2);
    ck_assert_int_eq(access(tmp, F_OK), -1);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("file");
    TCase *tc = tcase_create("read");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, file_open_read_gives_a_descriptor_and_the_size);
    tcase_add_test(tc, file_open_read_refuses_what_is_not_a_regular_file);
    tcase_add_test(tc, file_check_regular_takes_a_descriptor_opened_elsewhere);
    tcase_add_test(tc, file_read_at_names_the_offset_where_the_file_ended);
    tcase_add_test(tc, file_read_all_reads_the_whole_file_nul_terminated);
    suite_add_tcase(s, tc);
    tc = tcase_create("publish");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, file_publish_replaces_the_target_only_at_commit);
    tcase_add_test(tc, file_publish_stream_carries_formatted_output);
    tcase_add_test(tc, file_publish_abort_leaves_the_target_and_nothing_else);
    tcase_add_test(tc, file_publish_failures_name_path_and_step_and_publish_nothing);
    suite_add_tcase(s, tc);
    return s;
}
