/* The MPI suites' shared inputs: see fixture.h. */
#include "fixture.h"

#include "pd_test.h"

#include "cluster/cli/mkmodel.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

void pd_mpi_make_inputs(char *dir, size_t cap, const char *tag, uint32_t layers,
                        uint64_t model_seed, const mkpages_opts *pages)
{
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    int ok = 1;
    if (rank == 0) {
        snprintf(dir, cap, "%s/pd-%s-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", tag);
        ok = mkdtemp(dir) != NULL;
        mkmodel_opts mo;
        mkmodel_defaults(&mo);
        mo.arch = MODEL_ARCH_LLAMA;
        mo.layers = layers;
        mo.hidden = 64;
        mo.heads = 4;
        mo.kv_heads = 2;
        mo.ffn = 96;
        mo.vocab = 320;
        mo.seed = model_seed;
        char path[300];
        pd_err e = {0};
        snprintf(path, sizeof path, "%s/m.gguf", dir);
        ok = ok && mkmodel_write(&mo, path, &e) == PD_OK;
        model_hparams hp;
        ok = ok && model_read_hparams(path, &hp, &e) == PD_OK;
        snprintf(path, sizeof path, "%s/pages", dir);
        ok = ok && mkpages_write(pages, &hp, path, &e) == PD_OK;
        if (!ok)
            fprintf(stderr, "test_%s: making inputs failed: %s\n", tag, e.msg);
    }
    MPI_Bcast(&ok, 1, MPI_INT, 0, MPI_COMM_WORLD);
    MPI_Bcast(dir, (int)cap, MPI_CHAR, 0, MPI_COMM_WORLD);
    ck_assert_msg(ok, "inputs");
}

void pd_mpi_remove_inputs(const char *dir, const char *tag, int passed)
{
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank != 0)
        return;
    if (passed)
        pd_test_rmtree(dir);
    else
        fprintf(stderr, "test_%s: inputs and outputs kept in %s\n", tag, dir);
}
