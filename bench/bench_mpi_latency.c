/* MPI one-way latency between rank 0 and rank 1 (half the ping-pong round
 * trip), for message sizes from 8 B up to a pipeline micro-batch. Run with
 * `mpirun -np 2`. Prints one JSON object: {"sizes":[...],"one_way_us":[...]}.
 * usage: mpirun -np 2 bench_mpi_latency [max_bytes]   (default 4 MiB) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "bench_mpi_latency: run with exactly 2 ranks\n");
        MPI_Finalize();
        return 2;
    }
    long max_bytes = argc > 1 ? atol(argv[1]) : (4L << 20);
    char *buf = calloc((size_t)max_bytes, 1);
    if (rank == 0)
        printf("{\"bench\":\"mpi_latency\",\"points\":[");
    int first = 1;
    for (long n = 8; n <= max_bytes; n *= 4) {
        int reps = n <= 65536 ? 2000 : 50;
        double best = 1e30;
        for (int trial = 0; trial < 3; trial++) {
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (int r = 0; r < reps; r++) {
                if (rank == 0) {
                    MPI_Send(buf, (int)n, MPI_BYTE, 1, 0, MPI_COMM_WORLD);
                    MPI_Recv(buf, (int)n, MPI_BYTE, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(buf, (int)n, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, (int)n, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
                }
            }
            double one_way = (MPI_Wtime() - t0) / reps / 2.0;
            if (one_way < best)
                best = one_way;
        }
        if (rank == 0) {
            printf("%s{\"bytes\":%ld,\"one_way_us\":%.3f}", first ? "" : ",", n, best * 1e6);
            first = 0;
        }
    }
    if (rank == 0)
        printf("]}\n");
    free(buf);
    MPI_Finalize();
    return 0;
}
