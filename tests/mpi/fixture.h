/* Inputs the MPI suites share: rank 0 writes a small llama model and a page
 * file into a fresh directory and every rank learns the directory's name.
 * Collective over MPI_COMM_WORLD; every rank must call it. */
#ifndef PD_MPI_FIXTURE_H
#define PD_MPI_FIXTURE_H

#include "cluster/cli/mkpages.h"

#include <stddef.h>
#include <stdint.h>

/* The model: llama, hidden 64, 4 heads, 2 KV heads, ffn 96, vocab 320, with
 * `layers` layers and weights from `model_seed`; written to <dir>/m.gguf,
 * the pages from *pages to <dir>/pages. dir (cap bytes, the same on every
 * rank) receives $TMPDIR/pd-<tag>-XXXXXX (or /tmp/...). A failure on rank 0
 * is printed and fails the calling test on every rank. */
void pd_mpi_make_inputs(char *dir, size_t cap, const char *tag, uint32_t layers,
                        uint64_t model_seed, const mkpages_opts *pages);

/* The end of a test that used pd_mpi_make_inputs, collective: once every
 * rank is past its last use of dir, rank 0 removes it with everything in it
 * when `passed` (a verdict every rank agrees on), else keeps it to be looked
 * at and says where. Call it before the test's final assertions (a failed
 * one leaves the test). */
void pd_mpi_remove_inputs(const char *dir, const char *tag, int passed);

#endif
