/* arena: a pd_alloc whose memory lives on one NUMA node, placement verified.
 *
 * Owns every byte it hands out: large blocks are their own hwloc regions
 * (hwloc_alloc_membind, BIND + STRICT to the node's nodeset), medium ones
 * (the KV blocks of one head: a few hundred KiB) share 32 MiB slabs that
 * start on a 2 MiB boundary (so they sit on transparent huge pages: on 4 KiB
 * pages, TLB misses under a hypervisor's nested paging cost 64-stream decode
 * 13-26 %), small ones are carved from 1 MiB chunks, all bound the same way. Where memory binding is
 * impossible (a synthetic or XML topology, no hwloc support, mbind refused)
 * or ARENA_UNBOUND asks for it, it falls back to plain 64-byte-aligned memory
 * and says so in arena_placement(): "unbound (<reason>)".
 *
 * First touch: the arena itself faults in every page of every region it
 * obtains (madvise MADV_POPULATE_WRITE, or one write per page where the
 * kernel lacks it), before handing any of it out; bound regions ask for
 * transparent huge pages (MADV_HUGEPAGE) first. With a strict BIND policy the
 * page lands on the node whichever thread touches it, so touching early costs
 * nothing in placement, and it means arena_verify can check every page right
 * away (hwloc_get_area_memlocation reports nothing for untouched pages) and
 * never has to write into user data. Contents are otherwise unspecified (not
 * zeroed), as with malloc.
 *
 * Accounting (exact, so tests and the report can rely on it):
 *   - a request of 1..ARENA_SMALL_MAX bytes takes a block of the next power
 *     of two >= max(bytes, 64) from the small-block pool; the pool grows by
 *     one ARENA_CHUNK_BYTES region whenever a class has no free block and
 *     the current chunk's remainder is too small (that remainder is split
 *     into free blocks, nothing is lost); freed small blocks return to their
 *     class and chunks are held until arena_free;
 *   - a request of ARENA_MEDIUM_MIN + 1 .. ARENA_MEDIUM_MAX bytes is a
 *     medium block of bytes rounded up to ARENA_LARGE_ROUND, taken from a
 *     slab (ARENA_SLAB_BYTES, huge-page aligned, bound and touched like any
 *     region): a freed block of the same rounded length in any slab, else
 *     the untouched rest of a slab, else a new slab. A slab whose last block
 *     is freed starts over empty; it is kept within the retain budget (its
 *     bytes count as retained) and otherwise goes back to the system;
 *   - a larger request, or one of ARENA_SMALL_MAX + 1 .. ARENA_MEDIUM_MIN
 *     bytes, is a region of bytes rounded up to ARENA_LARGE_ROUND.
 *     When it is freed it goes back to the system, unless arena_set_retain
 *     gave a budget: then it is kept (newest first, the oldest returned to
 *     the system when the budget would be exceeded) and a later request of
 *     the same rounded size, or up to a quarter smaller, reuses the smallest
 *     kept region that fits. Its pages stay placed and touched, so
 *     admitting a page-stream after one retired costs no page faults and no
 *     munmap (whose TLB shootdown is slow on VMs).
 *   bytes_placed = chunks * ARENA_CHUNK_BYTES + slabs * ARENA_SLAB_BYTES +
 *   sum of rounded large regions, live or retained.
 *
 * Thread-safe: one mutex around every operation. Allocation is for set-up
 * and stream admission, never the per-token path. Under AddressSanitizer the
 * arena poisons free small blocks and the slack behind each block, so
 * overflows and use-after-free inside a chunk are reported. */
#ifndef PD_ARENA_H
#define PD_ARENA_H

#include "base/alloc.h"
#include "cache/numa.h"
#include "base/status.h"

#include <stdbool.h>
#include <stddef.h>

#define ARENA_ALIGN 64
#define ARENA_SMALL_MAX 16384
#define ARENA_CHUNK_BYTES ((size_t)1 << 20)
#define ARENA_LARGE_ROUND 4096
#define ARENA_MEDIUM_MIN ((size_t)64 << 10) /* medium blocks: (MIN, MAX] bytes */
#define ARENA_MEDIUM_MAX ((size_t)2 << 20)
#define ARENA_SLAB_BYTES ((size_t)32 << 20)
#define ARENA_HUGE_PAGE ((size_t)2 << 20)

/* Flags for arena_new. */
enum {
    ARENA_UNBOUND = 1u << 0, /* do not bind: plain aligned memory (e.g. --numa off) */
};

typedef struct arena arena;

/* Creates an arena for logical NUMA node `node` of `topo`. `topo` is borrowed
 * and must outlive the arena. A node out of range is PD_ERR_RANGE, unknown
 * flags PD_ERR_ARG. Unsupported binding is not an error: the arena falls back
 * (see top). Returns owned in *out, free with arena_free; *out untouched on
 * failure. */
pd_status arena_new(numa_topo *topo, unsigned node, unsigned flags, arena **out, pd_err *err);
/* Releases every region, including blocks still allocated (their pointers
 * die with it). arena_free(NULL) is a no-op. */
void arena_free(arena *a);

/* The allocator interface: alloc returns 64-byte-aligned memory or NULL
 * (bytes == 0, overflow, out of memory); free takes the size alloc was asked
 * with and aborts (CHECK) on a large block the arena does not hold.
 * Borrowed, valid until arena_free. */
const pd_alloc *arena_alloc_iface(arena *a);

/* Keep up to `bytes` of freed large regions for reuse (default 0: return them
 * at once). Lowering the budget returns the excess at once. */
void arena_set_retain(arena *a, size_t bytes);

/* Whether memory is bound to the node (false: the fallback). */
bool arena_is_bound(const arena *a);
/* "bound to numa node 0 (os 0)" or "unbound (<reason>)". Borrowed, valid
 * until arena_free. */
const char *arena_placement(const arena *a);
/* The logical NUMA node the arena was made for. */
unsigned arena_node(const arena *a);

typedef struct arena_stats {
    size_t bytes_live;     /* sum of the sizes of live allocations, as asked */
    size_t peak_live;      /* highest bytes_live so far */
    size_t blocks;         /* live allocations */
    size_t bytes_placed;   /* bytes held from the system: chunks + large regions */
    size_t peak_placed;    /* highest bytes_placed so far */
    size_t regions;        /* system regions held (chunks + large blocks, retained included) */
    size_t bytes_retained; /* freed large regions kept for reuse (part of bytes_placed) */
    size_t bytes_verified; /* bytes found on the node by the last arena_verify */
    size_t alloc_failures; /* alloc calls that returned NULL for bytes > 0 */
} arena_stats;

void arena_stats_get(arena *a, arena_stats *out);

typedef struct arena_verdict {
    bool verified;        /* bound, checked, and every placed byte is on the node */
    size_t bytes_checked; /* placed bytes whose location was queried */
    size_t bytes_on_node; /* ... found on the arena's node */
    size_t bytes_wrong;   /* ... found on another node */
    size_t bytes_unknown; /* ... with no location (page not resident) */
    char reason[256];     /* why not verified, or "" */
} arena_verdict;

/* Checks with hwloc_get_area_memlocation where every placed region (chunks
 * included) lives, page-exact, and records bytes_on_node in the stats. On a
 * topology that cannot be queried (synthetic, XML, no support) nothing is
 * checked and the verdict says why; that is PD_OK. A failing query is
 * PD_ERR_TOPOLOGY. An arena with no memory verifies vacuously when bound. */
pd_status arena_verify(arena *a, arena_verdict *out, pd_err *err);

/* Aborts (CHECK) unless the arena's bookkeeping is consistent: regions sum to
 * bytes_placed, chunk bytes = free + live small + unused remainder. */
void arena_check(arena *a);

#endif
