/* The default (malloc) allocator. */
#include "base/alloc.h"

#include <stdlib.h>
#include <sys/mman.h>

/* Blocks from this size up (weights, large caches) are 2 MiB-aligned and ask
 * for transparent huge pages before anything touches them: with THP in
 * "madvise" mode (Debian's default) they would otherwise sit on 4 KiB pages,
 * and TLB misses under a hypervisor's nested paging slow decode by up to
 * 1.8x (see cache/arena.c). */
#define PD_ALLOC_HUGE_MIN ((size_t)4 << 20)
#define PD_ALLOC_HUGE_ALIGN ((size_t)2 << 20)

static void *pd_default_alloc(void *ctx, size_t bytes)
{
    (void)ctx;
    if (bytes >= PD_ALLOC_HUGE_MIN) {
        size_t rounded = (bytes + PD_ALLOC_HUGE_ALIGN - 1) & ~(PD_ALLOC_HUGE_ALIGN - 1);
        if (rounded < bytes)
            return NULL;
        void *p = aligned_alloc(PD_ALLOC_HUGE_ALIGN, rounded);
        if (p)
            (void)madvise(p, rounded, MADV_HUGEPAGE); /* advice only: refused is fine */
        return p;
    }
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
