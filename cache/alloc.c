/* The default (malloc) allocator. */
#include "cache/alloc.h"

#include <stdlib.h>

static void *pd_default_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    size_t rounded = (bytes + 63) & ~(size_t)63;
    if (rounded < bytes)
        return NULL;
    return aligned_alloc(64, rounded);
}

static void pd_default_free(void *ctx, void *p, size_t bytes)
{
    (void)ctx;
    (void)bytes;
    free(p);
}

static const pd_alloc pd_alloc_malloc = {.alloc = pd_default_alloc, .free = pd_default_free};

const pd_alloc *pd_alloc_default(void)
{
    return &pd_alloc_malloc;
}

void *pd_alloc_bytes(const pd_alloc *a, size_t bytes)
{
    if (bytes == 0)
        return NULL;
    if (!a)
        a = &pd_alloc_malloc;
    return a->alloc(a->ctx, bytes);
}

void pd_free_bytes(const pd_alloc *a, void *p, size_t bytes)
{
    if (!p)
        return;
    if (!a)
        a = &pd_alloc_malloc;
    a->free(a->ctx, p, bytes);
}
