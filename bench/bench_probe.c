/* The machine's read bandwidth for 1..T threads (probe.h), for scripts that
 * need a limit measured in the same run as their own figures (anchor.sh).
 * Prints one JSON object, with the int8 arithmetic's compute limit of one
 * thread (probe_int8_peak) beside the bandwidths.
 *
 * usage: bench_probe [max_threads] [reps]   (defaults 2, 3) */
#include "probe.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    int tmax = argc > 1 ? atoi(argv[1]) : 2;
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    if (tmax < 1 || tmax > 256 || reps < 1) {
        fprintf(stderr, "usage: bench_probe [max_threads 1..256] [reps >= 1]\n");
        return 2;
    }
    printf("{\"bench\": \"probe\", \"read_bw_gbs\": {");
    for (int t = 1; t <= tmax; t++)
        printf("%s\"%d\": %.2f", t > 1 ? ", " : "", t, probe_read_bw(t, reps) / 1e9);
    /* the int8 arithmetic's compute limit (0: no AVX-512 VNNI) */
    printf("}, \"int8_peak_gops_1t\": %.2f}\n", probe_int8_peak(reps) / 1e9);
    return 0;
}
