/* The allocator interface cache memory comes from.
 *
 * Caches never call malloc directly: they take a pd_alloc at creation, so a
 * stage can hand them a NUMA-bound arena (arena.h) and the default is plain
 * malloc. Functions receive the byte size on free so an arena can account
 * exactly. */
#ifndef PD_ALLOC_H
#define PD_ALLOC_H

#include <stddef.h>

typedef struct pd_alloc {
    /* Returns `bytes` of memory aligned to 64 bytes, or NULL. */
    void *(*alloc)(void *ctx, size_t bytes);
    /* Releases a block returned by alloc; `bytes` is the size it was asked with. */
    void (*free)(void *ctx, void *p, size_t bytes);
    void *ctx;
} pd_alloc;

/* The malloc-backed allocator (64-byte aligned). Borrowed, static lifetime. */
const pd_alloc *pd_alloc_default(void);

/* Convenience: allocate / free through a (possibly NULL = default) allocator.
 * pd_alloc_bytes returns NULL on failure or bytes == 0; pd_free_bytes(NULL) is a no-op. */
void *pd_alloc_bytes(const pd_alloc *a, size_t bytes);
void pd_free_bytes(const pd_alloc *a, void *p, size_t bytes);

#endif
