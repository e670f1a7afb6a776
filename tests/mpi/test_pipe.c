/* pipe + msg across real ranks: batches travel a ring of ranks intact, the
 * start-up agreement sees one rank's failure everywhere, an oversized message
 * is refused without a hang, and node-local ranks are distinct.
 * PD_MPI_RANKS: 2 3 */
#include "pd_test.h"

#include "comm/msg.h"
#include "comm/pipe.h"

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#define HID 6

static pipe_link *open_link(void)
{
    pipe_link *p = NULL;
    pd_err e = {0};
    ck_assert_int_eq(pipe_open(MPI_COMM_WORLD, &p, &e), PD_OK);
    return p;
}

START_TEST(pipe_batches_travel_a_ring_of_ranks_intact)
{
    pipe_link *p = open_link();
    int rank = pipe_rank(p), size = pipe_size(p);
    for (int dt = 0; dt < 2; dt++) {
        mb_admit admit[1] = {{.stream = 100 + (uint64_t)rank, .prefill_rows = 3, .max_new = 7, .sample_key = 9}};
        mb_row rows[3];
        float x[3 * HID];
        for (int i = 0; i < 3; i++) {
            rows[i] = (mb_row){.stream = (uint64_t)rank, .pos = (uint64_t)i, .role = MB_ROLE_PREFILL,
                               .wants_logits = i == 2};
            for (int d = 0; d < HID; d++)
                x[i * HID + d] = (float)(rank * 100 + i * 10 + d) * 0.5f;
        }
        msg_batch b = {.seq = (uint64_t)rank, .dtype = (msg_dtype)dt, .hidden = HID, .n_admit = 1, .n_rows = 3,
                       .admit = admit, .rows = rows, .x = x};
        uint8_t out[1024], in[1024];
        size_t len;
        pd_err e = {0};
        ck_assert_int_eq(msg_encode_batch(&b, out, sizeof out, &len, &e), PD_OK);
        MPI_Request req;
        ck_assert_int_eq(pipe_isend(p, (rank + 1) % size, out, len, &req, &e), PD_OK);
        size_t got;
        int from;
        ck_assert_int_eq(pipe_recv(p, (rank + size - 1) % size, in, sizeof in, &got, &from, NULL, &e), PD_OK);
        ck_assert_int_eq(pipe_wait(p, &req, NULL, &e), PD_OK);
        int prev = (rank + size - 1) % size;
        ck_assert_int_eq(from, prev);
        mb_admit ra[2];
        uint64_t rr[2];
        mb_row rw[4];
        float rx[4 * HID];
        msg_batch d = {.admit = ra, .retire = rr, .rows = rw, .x = rx};
        msg_limits lim = {.max_admit = 2, .max_retire = 2, .max_rows = 4, .hidden = HID};
        ck_assert_int_eq(msg_decode_batch(in, got, &lim, &d, &e), PD_OK);
        ck_assert_uint_eq(d.seq, (uint64_t)prev);
        ck_assert_uint_eq(ra[0].stream, 100 + (uint64_t)prev);
        ck_assert_uint_eq(rw[2].wants_logits, 1);
        for (int i = 0; i < 3 * HID; i++)
            ck_assert_float_eq(rx[i], (float)(prev * 100 + (i / HID) * 10 + i % HID) * 0.5f);
    }
    pipe_close(p);
}
END_TEST

START_TEST(pipe_agreement_sees_any_ranks_failure)
{
    pipe_link *p = open_link();
    pd_err e = {0};
    ck_assert_int_eq(pipe_agree(p, PD_OK, &e), PD_OK);
    pd_status mine = pipe_rank(p) == pipe_size(p) - 1 ? PD_ERR_FORMAT : PD_OK;
    ck_assert_int_eq(pipe_agree(p, mine, &e), PD_ERR_FORMAT);
    pipe_close(p);
}
END_TEST

START_TEST(pipe_oversized_message_is_refused_without_hanging)
{
    pipe_link *p = open_link();
    int rank = pipe_rank(p);
    pd_err e = {0};
    char big[4096];
    memset(big, 7, sizeof big);
    if (rank == 0) {
        MPI_Request req;
        ck_assert_int_eq(pipe_isend(p, 1, big, sizeof big, &req, &e), PD_OK);
        ck_assert_int_eq(pipe_wait(p, &req, NULL, &e), PD_OK);
        ck_assert_int_eq(pipe_isend(p, 1, big, 16, &req, &e), PD_OK);
        ck_assert_int_eq(pipe_wait(p, &req, NULL, &e), PD_OK);
    } else if (rank == 1) {
        char small[64];
        size_t got = 0;
        ck_assert_int_eq(pipe_recv(p, 0, small, sizeof small, &got, NULL, NULL, &e), PD_ERR_RANGE);
        ck_assert_msg(strstr(e.msg, "4096 bytes") != NULL, "%s", e.msg);
        pd_err_clear(&e);
        /* the oversized message was drained: the next one arrives intact */
        ck_assert_int_eq(pipe_recv(p, 0, small, sizeof small, &got, NULL, NULL, &e), PD_OK);
        ck_assert_uint_eq(got, 16);
        ck_assert_int_eq(small[15], 7);
    }
    pipe_close(p);
}
END_TEST

START_TEST(pipe_node_local_ranks_are_distinct)
{
    pipe_link *p = open_link();
    pd_err e = {0};
    int lr = -1, ls = -1;
    ck_assert_int_eq(pipe_node_local(p, &lr, &ls, &e), PD_OK);
    ck_assert_int_eq(ls, pipe_size(p)); /* one node in the test */
    int *all = pipe_rank(p) == 0 ? calloc((size_t)ls, sizeof(int)) : NULL;
    ck_assert_int_eq(pipe_gather(p, &lr, sizeof lr, all, &e), PD_OK);
    if (all) {
        for (int i = 0; i < ls; i++)
            for (int j = 0; j < i; j++)
                ck_assert_int_ne(all[i], all[j]);
        free(all);
    }
    double mx = 0;
    ck_assert_int_eq(pipe_max_double(p, (double)pipe_rank(p), &mx, &e), PD_OK);
    ck_assert_double_eq(mx, (double)(pipe_size(p) - 1));
    pipe_close(p);
}
END_TEST

Suite *pd_test_suite(void)
{
    Suite *s = suite_create("pipe");
    TCase *tc = tcase_create("mpi");
    tcase_add_test(tc, pipe_batches_travel_a_ring_of_ranks_intact);
    tcase_add_test(tc, pipe_agreement_sees_any_ranks_failure);
    tcase_add_test(tc, pipe_oversized_message_is_refused_without_hanging);
    tcase_add_test(tc, pipe_node_local_ranks_are_distinct);
    suite_add_tcase(s, tc);
    return s;
}
