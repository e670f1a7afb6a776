/* CHECK: an always-on assertion for internal invariants (never for bad input,
 * which returns a pd_status). It survives NDEBUG and prints file and line. */
#ifndef PD_CHECK_H
#define PD_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define CHECK(cond)                                                              \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: internal invariant failed: %s\n", __FILE__,  \
                    __LINE__, #cond);                                            \
            abort();                                                             \
        }                                                                        \
    } while (0)

#define CHECKF(cond, ...)                                                        \
    do {                                                                         \
        if (!(cond)) {                                                           \
            fprintf(stderr, "%s:%d: internal invariant failed: %s: ", __FILE__,  \
                    __LINE__, #cond);                                            \
            fprintf(stderr, __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                 \
            abort();                                                             \
        }                                                                        \
    } while (0)

#endif
