/* arena: NUMA-bound memory behind the pd_alloc interface.
 * Owns the regions it obtains (hwloc_alloc_membind, or aligned_alloc in the
 * unbound fallback), a table of them for freeing and verification, and the
 * small-block pool carved from chunk regions. Rules are in arena.h. */
#include "cache/arena.h"

#include "base/check.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifdef MADV_POPULATE_WRITE
#define ARENA_MADV_POPULATE_WRITE MADV_POPULATE_WRITE
#else
#define ARENA_MADV_POPULATE_WRITE 23 /* Linux 5.14 uapi value; older kernels answer EINVAL */
#endif

#if defined(__SANITIZE_ADDRESS__)
#define ARENA_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_ASAN 1
#endif
#endif

#ifdef ARENA_ASAN
#include <sanitizer/asan_interface.h>
#define ARENA_POISON(p, n) ASAN_POISON_MEMORY_REGION((p), (n))
#define ARENA_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION((p), (n))
#else
#define ARENA_POISON(p, n) ((void)(p), (void)(n))
#define ARENA_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

/* Small classes: 64 << c bytes for c in [0, ARENA_CLASSES). */
#define ARENA_CLASSES 9
_Static_assert(((size_t)ARENA_ALIGN << (ARENA_CLASSES - 1)) == ARENA_SMALL_MAX,
               "the largest small class is ARENA_SMALL_MAX");
_Static_assert(ARENA_CHUNK_BYTES % ARENA_SMALL_MAX == 0, "chunks hold whole largest blocks");
/* Pages are queried in spans of this size; a span on several nodes is
 * re-queried page by page, so counts are exact while most calls cover 2 MiB. */
#define ARENA_VERIFY_SPAN ((size_t)2 << 20)

/* One region obtained from the system: a chunk of small blocks or one large
 * block. Kept in a chained hash keyed by address. A large block that was
 * freed and is kept for reuse (arena_set_retain) stays in the hash with
 * `retained` set and is also linked, newest first, through `older`. */
typedef struct arena_region {
    struct arena_region *next;
    struct arena_region *older; /* retained list, when retained */
    void *p;
    size_t len;
    size_t asked;               /* bytes of the live large block (0: chunk or retained) */
    bool chunk;
    bool retained;
    struct arena_slab *slab;    /* the slab this region is, or NULL */
} arena_region;

/* A slab of medium blocks (arena.h): its region is ARENA_SLAB_BYTES long and
 * starts on a huge-page boundary. Blocks are bumped from the start; a freed
 * block goes on the slab's list ({next, len} in its first bytes) and is
 * reused whole by a request of the same rounded length. A slab whose last
 * block is freed starts over empty (bump 0, no list).
 * INV: live + free_bytes + (ARENA_SLAB_BYTES - bump) == ARENA_SLAB_BYTES;
 *      live == 0 implies bump == 0 and an empty list. */
typedef struct arena_slab {
    struct arena_slab *next;
    char *p;
    size_t bump;       /* bytes handed out from the start so far */
    size_t live;       /* rounded bytes of live blocks */
    size_t free_bytes; /* rounded bytes on the list */
    void *free;
} arena_slab;

/* INV: every region in `buckets` is held from the system; their lens sum to
 *      st.bytes_placed and their count is st.regions;
 *      chunks * ARENA_CHUNK_BYTES == free-list bytes + small_used + bump_left;
 *      large_held + st.bytes_retained == st.bytes_placed - chunks * ARENA_CHUNK_BYTES;
 *      the regions on the retained list are exactly those with `retained`
 *      set, their lens sum to st.bytes_retained <= retain_cap;
 *      bump .. bump + bump_left lies inside the newest chunk;
 *      bound == (nodeset != NULL).
 * All fields below `mu` are guarded by it. */
struct arena {
    numa_topo *topo;
    hwloc_topology_t t;
    unsigned node;
    bool bound;
    hwloc_nodeset_t nodeset;  /* the node's nodeset when bound, else NULL */
    bool can_query;           /* hwloc_get_area_memlocation works here */
    size_t page;              /* system page size, for first touch */
    char placement[160];
    pd_alloc iface;

    pthread_mutex_t mu;
    arena_region **buckets;   /* nbuckets chains, nbuckets a power of two */
    unsigned bucket_shift;    /* 64 - log2(nbuckets) */
    size_t nbuckets;
    void *free_list[ARENA_CLASSES];
    char *bump;               /* unused remainder of the newest chunk */
    size_t bump_left;
    size_t chunks;
    size_t small_used;        /* class bytes of live small blocks */
    size_t large_held;        /* rounded bytes of live large blocks */
    arena_region *retained;   /* freed large regions kept for reuse, newest first */
    arena_slab *slabs;        /* every slab, in use or empty */
    size_t slabs_empty;       /* slabs with no live block (their bytes count as retained) */
    size_t retain_cap;
    arena_stats st;
};

static unsigned arena_class_of(size_t bytes)
{
    unsigned c = 0;
    while (((size_t)ARENA_ALIGN << c) < bytes)
        c++;
    return c;
}

static size_t arena_class_size(unsigned c)
{
    return (size_t)ARENA_ALIGN << c;
}

static size_t arena_hash(const arena *a, const void *p)
{
    uint64_t x = (uint64_t)(uintptr_t)p >> 6;
    return (size_t)((x * 0x9e3779b97f4a7c15ull) >> a->bucket_shift);
}

/* ---- system regions ---------------------------------------------------- */

/* First touch (see arena.h): places every page of [p, p + len) now. One
 * madvise(MADV_POPULATE_WRITE) faults the range in as a whole, which on a VM
 * costs ~0.6 us a page against ~11 us for a write per page (one exit each);
 * kernels before 5.14 refuse it and get the writes. Bound (mmap'd) regions
 * ask for transparent huge pages first: where THP is in "madvise" mode (the
 * Debian default) weights and caches otherwise sit on 4 KiB pages, and TLB
 * misses under a hypervisor's nested paging made one-rank decode 1.3-1.8x
 * slower and erratic. */
static void arena_populate(const arena *a, void *p, size_t len, bool huge)
{
    uintptr_t lo = (uintptr_t)p & ~(uintptr_t)(a->page - 1);
    uintptr_t hi = ((uintptr_t)p + len + a->page - 1) & ~(uintptr_t)(a->page - 1);
    if (a->bound || huge)
        (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
    if (madvise((void *)lo, hi - lo, ARENA_MADV_POPULATE_WRITE) == 0)
        return;
    volatile char *v = p;
    for (size_t off = 0; off < len; off += a->page)
        v[off] = 0;
    v[len - 1] = 0; /* the last page, when p is not page-aligned (fallback) */
}

static void *arena_sys_alloc(arena *a, size_t len)
{
    void *p;
    if (a->bound)
        p = hwloc_alloc_membind(a->t, len, a->nodeset, HWLOC_MEMBIND_BIND,
                                HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT);
    else
        p = aligned_alloc(ARENA_ALIGN, len); /* len is a multiple of 64 */
    if (!p)
        return NULL;
    arena_populate(a, p, len, false);
    return p;
}

/* A slab's region: ARENA_SLAB_BYTES mapped on a huge-page boundary (more is
 * mapped, the ends unmapped), bound like every region when the arena is,
 * then populated on huge pages. NULL on failure. */
static void *arena_sys_alloc_slab(arena *a)
{
    size_t len = ARENA_SLAB_BYTES, al = ARENA_HUGE_PAGE;
    char *raw = mmap(NULL, len + al, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *p = (char *)(((uintptr_t)raw + al - 1) & ~(uintptr_t)(al - 1));
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (raw + len + al > p + len)
        munmap(p + len, (size_t)(raw + len + al - (p + len)));
    if (a->bound && hwloc_set_area_membind(a->t, p, len, a->nodeset, HWLOC_MEMBIND_BIND,
                                           HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT) != 0) {
        munmap(p, len);
        return NULL;
    }
    arena_populate(a, p, len, true);
    return p;
}

static void arena_sys_free(arena *a, const arena_region *r)
{
    void *p = r->p;
    size_t len = r->len;
    /* Manual poison must not outlive the mapping: a later mmap could reuse
     * the addresses. */
    ARENA_UNPOISON(p, len);
    if (r->slab)
        munmap(p, len);
    else if (a->bound)
        hwloc_free(a->t, p, len);
    else
        free(p);
}

static bool arena_grow_table(arena *a)
{
    size_t n = a->nbuckets * 2;
    arena_region **nb = calloc(n, sizeof *nb);
    if (!nb)
        return false;
    arena_region **old = a->buckets;
    size_t oldn = a->nbuckets;
    a->buckets = nb;
    a->nbuckets = n;
    a->bucket_shift--;
    for (size_t i = 0; i < oldn; i++) {
        arena_region *r = old[i];
        while (r) {
            arena_region *next = r->next;
            size_t h = arena_hash(a, r->p);
            r->next = nb[h];
            nb[h] = r;
            r = next;
        }
    }
    free(old);
    return true;
}

/* Obtains a region of len bytes and records it; NULL on failure. */
static void *arena_region_add(arena *a, size_t len, bool chunk, arena_slab *slab)
{
    if (a->st.regions >= a->nbuckets && !arena_grow_table(a))
        return NULL;
    arena_region *r = malloc(sizeof *r);
    if (!r)
        return NULL;
    void *p = slab ? arena_sys_alloc_slab(a) : arena_sys_alloc(a, len);
    if (!p) {
        free(r);
        return NULL;
    }
    size_t h = arena_hash(a, p);
    *r = (arena_region){.next = a->buckets[h], .p = p, .len = len, .chunk = chunk, .slab = slab};
    a->buckets[h] = r;
    a->st.regions++;
    a->st.bytes_placed += len;
    if (a->st.bytes_placed > a->st.peak_placed)
        a->st.peak_placed = a->st.bytes_placed;
    return p;
}

/* Unlinks and returns the region starting at p, or NULL. */
static arena_region *arena_region_take(arena *a, void *p)
{
    arena_region **link = &a->buckets[arena_hash(a, p)];
    for (arena_region *r = *link; r; link = &r->next, r = r->next) {
        if (r->p == p) {
            *link = r->next;
            a->st.regions--;
            a->st.bytes_placed -= r->len;
            return r;
        }
    }
    return NULL;
}

/* ---- small blocks ------------------------------------------------------ */

static void arena_push(arena *a, unsigned c, void *p)
{
    ARENA_UNPOISON(p, sizeof(void *));
    memcpy(p, &a->free_list[c], sizeof(void *));
    a->free_list[c] = p;
    ARENA_POISON(p, arena_class_size(c));
}

static void *arena_pop(arena *a, unsigned c)
{
    void *p = a->free_list[c];
    if (!p)
        return NULL;
    ARENA_UNPOISON(p, sizeof(void *));
    memcpy(&a->free_list[c], p, sizeof(void *));
    return p;
}

/* Splits the newest chunk's remainder into free blocks of the largest
 * classes that fit, so switching chunks loses nothing. */
static void arena_retire_bump(arena *a)
{
    while (a->bump_left >= ARENA_ALIGN) {
        unsigned c = ARENA_CLASSES - 1;
        while (arena_class_size(c) > a->bump_left)
            c--;
        arena_push(a, c, a->bump);
        a->bump += arena_class_size(c);
        a->bump_left -= arena_class_size(c);
    }
    CHECK(a->bump_left == 0);
}

static void *arena_small_alloc(arena *a, size_t bytes)
{
    unsigned c = arena_class_of(bytes);
    size_t size = arena_class_size(c);
    void *p = arena_pop(a, c);
    if (!p) {
        if (a->bump_left < size) {
            char *chunk = arena_region_add(a, ARENA_CHUNK_BYTES, true, NULL);
            if (!chunk)
                return NULL;
            ARENA_POISON(chunk, ARENA_CHUNK_BYTES);
            arena_retire_bump(a);
            a->chunks++;
            a->bump = chunk;
            a->bump_left = ARENA_CHUNK_BYTES;
        }
        p = a->bump;
        a->bump += size;
        a->bump_left -= size;
    }
    a->small_used += size;
    /* Only the bytes asked for are addressable: the class slack stays poisoned. */
    ARENA_POISON(p, size);
    ARENA_UNPOISON(p, bytes);
    return p;
}

static void arena_small_free(arena *a, void *p, size_t bytes)
{
    unsigned c = arena_class_of(bytes);
    CHECKF(((uintptr_t)p & (ARENA_ALIGN - 1)) == 0, "arena: free of unaligned small block %p", p);
#ifdef ARENA_ASAN
    CHECKF(!__asan_address_is_poisoned(p), "arena: double free of small block %p", p);
#endif
    CHECK(a->small_used >= arena_class_size(c));
    a->small_used -= arena_class_size(c);
    arena_push(a, c, p);
}

/* ---- large blocks ------------------------------------------------------ */

/* The region in the hash that starts at p, or NULL. */
static arena_region *arena_region_find(arena *a, const void *p)
{
    for (arena_region *r = a->buckets[arena_hash(a, p)]; r; r = r->next)
        if (r->p == p)
            return r;
    return NULL;
}

/* Unlinks r from the retained list. */
static void arena_unretain(arena *a, arena_region *r)
{
    arena_region **link = &a->retained;
    while (*link != r)
        link = &(*link)->older;
    *link = r->older;
    r->older = NULL;
    r->retained = false;
    a->st.bytes_retained -= r->len;
}

/* Returns an empty slab to the system. */
static void arena_slab_release(arena *a, arena_slab *sl)
{
    CHECK(sl->live == 0 && a->slabs_empty > 0);
    arena_slab **link = &a->slabs;
    while (*link != sl)
        link = &(*link)->next;
    *link = sl->next;
    a->slabs_empty--;
    a->st.bytes_retained -= ARENA_SLAB_BYTES;
    arena_region *r = arena_region_take(a, sl->p);
    CHECK(r && r->slab == sl);
    arena_sys_free(a, r);
    free(r);
    free(sl);
}

/* Returns the oldest retained regions, then empty slabs, to the system until
 * `need` more bytes fit under the cap. */
static void arena_trim_retained(arena *a, size_t need)
{
    while (a->retained && a->st.bytes_retained + need > a->retain_cap) {
        arena_region *oldest = a->retained;
        while (oldest->older)
            oldest = oldest->older;
        arena_unretain(a, oldest);
        arena_region *r = arena_region_take(a, oldest->p);
        CHECK(r == oldest);
        arena_sys_free(a, r);
        free(r);
    }
    while (a->slabs_empty > 0 && a->st.bytes_retained + need > a->retain_cap) {
        arena_slab *sl = a->slabs;
        while (sl->live != 0)
            sl = sl->next;
        arena_slab_release(a, sl);
    }
}

/* A large block of `bytes` (region of `len`, rounded): a retained region of
 * at least len and at most a quarter larger (the smallest such), else a new
 * one. */
static void *arena_large_alloc(arena *a, size_t bytes, size_t len)
{
    arena_region *best = NULL;
    for (arena_region *r = a->retained; r; r = r->older)
        if (r->len >= len && r->len - len <= len / 4 && (!best || r->len < best->len))
            best = r;
    if (best) {
        arena_unretain(a, best);
    } else {
        void *p = arena_region_add(a, len, false, NULL);
        if (!p)
            return NULL;
        best = arena_region_find(a, p);
    }
    best->asked = bytes;
    a->large_held += best->len;
    ARENA_UNPOISON(best->p, bytes);
    ARENA_POISON((char *)best->p + bytes, best->len - bytes);
    return best->p;
}

static void arena_large_free(arena *a, void *p, size_t bytes)
{
    arena_region *r = arena_region_find(a, p);
    CHECKF(r && !r->chunk && !r->retained, "arena: free of %zu bytes at %p: no such large block", bytes,
           p);
    CHECKF(r->asked == bytes, "arena: block at %p was %zu bytes, freed as %zu", p, r->asked, bytes);
    a->large_held -= r->len;
    r->asked = 0;
    if (r->len <= a->retain_cap) {
        arena_trim_retained(a, r->len);
        ARENA_POISON(r->p, r->len);
        r->retained = true;
        r->older = a->retained;
        a->retained = r;
        a->st.bytes_retained += r->len;
        return;
    }
    r = arena_region_take(a, p);
    arena_sys_free(a, r);
    free(r);
}

/* ---- medium blocks ----------------------------------------------------- */

/* The {next, len} header of a free medium block. */
typedef struct arena_free_block {
    void *next;
    size_t len;
} arena_free_block;

static arena_free_block arena_fb_read(void *p)
{
    arena_free_block b;
    ARENA_UNPOISON(p, sizeof b);
    memcpy(&b, p, sizeof b);
    ARENA_POISON(p, sizeof b);
    return b;
}

static void arena_fb_write(void *p, arena_free_block b)
{
    ARENA_UNPOISON(p, sizeof b);
    memcpy(p, &b, sizeof b);
    ARENA_POISON(p, sizeof b);
}

/* A block of len rounded bytes taken in slab sl (live before). */
static void arena_slab_take(arena *a, arena_slab *sl, size_t len)
{
    if (sl->live == 0) {
        a->slabs_empty--;
        a->st.bytes_retained -= ARENA_SLAB_BYTES;
    }
    sl->live += len;
}

/* Takes a freed block of exactly len bytes off sl's list, or NULL. */
static char *arena_slab_pop(arena_slab *sl, size_t len)
{
    void *prev = NULL;
    for (void *cur = sl->free; cur;) {
        arena_free_block b = arena_fb_read(cur);
        if (b.len != len) {
            prev = cur;
            cur = b.next;
            continue;
        }
        if (prev) {
            arena_free_block pb = arena_fb_read(prev);
            pb.next = b.next;
            arena_fb_write(prev, pb);
        } else {
            sl->free = b.next;
        }
        sl->free_bytes -= len;
        return cur;
    }
    return NULL;
}

/* The length a medium or large block of `bytes` takes (wraps to 0 near SIZE_MAX,
 * which the caller refuses). */
static size_t arena_round_len(size_t bytes)
{
    return (bytes + (ARENA_LARGE_ROUND - 1)) & ~(size_t)(ARENA_LARGE_ROUND - 1);
}

/* A medium block of `bytes` (len rounded): a freed block of the same length
 * in any slab, else the untouched rest of one, else a new slab (an empty
 * slab first). */
static void *arena_medium_alloc(arena *a, size_t bytes, size_t len)
{
    char *p = NULL;
    arena_slab *sl;
    for (sl = a->slabs; sl && !(p = arena_slab_pop(sl, len)); sl = sl->next)
        ;
    if (!p) {
        arena_slab *room = NULL;
        for (sl = a->slabs; sl; sl = sl->next)
            if (ARENA_SLAB_BYTES - sl->bump >= len && (!room || (room->live == 0 && sl->live > 0)))
                room = sl; /* prefer a slab in use: empty ones may go back to the system */
        if (!room) {
            room = calloc(1, sizeof *room);
            if (!room)
                return NULL;
            if (!(room->p = arena_region_add(a, ARENA_SLAB_BYTES, false, room))) {
                free(room);
                return NULL;
            }
            ARENA_POISON(room->p, ARENA_SLAB_BYTES);
            room->next = a->slabs;
            a->slabs = room;
            a->slabs_empty++;
            a->st.bytes_retained += ARENA_SLAB_BYTES;
        }
        sl = room;
        p = sl->p + sl->bump;
        sl->bump += len;
    }
    arena_slab_take(a, sl, len);
    ARENA_UNPOISON(p, bytes);
    return p;
}

static void arena_medium_free(arena *a, void *p, size_t bytes)
{
    size_t len = arena_round_len(bytes);
    arena_slab *sl = a->slabs;
    while (sl && !((char *)p >= sl->p && (char *)p < sl->p + ARENA_SLAB_BYTES))
        sl = sl->next;
    CHECKF(sl, "arena: free of %zu bytes at %p: no slab holds it", bytes, p);
    CHECKF(((uintptr_t)p & (ARENA_ALIGN - 1)) == 0 && (size_t)((char *)p - sl->p) + len <= sl->bump,
           "arena: free of %zu bytes at %p: not a block of its slab", bytes, p);
    for (void *cur = sl->free; cur; cur = arena_fb_read(cur).next)
        CHECKF(cur != p, "arena: double free of medium block %p", p);
    CHECKF(sl->live >= len, "arena: free of %zu bytes at %p: its slab holds %zu live", bytes, p, sl->live);
    sl->live -= len;
    ARENA_POISON(p, len);
    if (sl->live > 0) {
        arena_fb_write(p, (arena_free_block){.next = sl->free, .len = len});
        sl->free = p;
        sl->free_bytes += len;
        return;
    }
    /* the last block: the slab starts over empty, kept within the budget */
    sl->free = NULL;
    sl->free_bytes = 0;
    sl->bump = 0;
    a->slabs_empty++;
    a->st.bytes_retained += ARENA_SLAB_BYTES;
    if (a->st.bytes_retained > a->retain_cap)
        arena_slab_release(a, sl);
}

/* ---- the pd_alloc interface -------------------------------------------- */

static void *arena_iface_alloc(void *ctx, size_t bytes)
{
    arena *a = ctx;
    if (bytes == 0)
        return NULL;
    pthread_mutex_lock(&a->mu);
    void *p = NULL;
    if (bytes <= ARENA_SMALL_MAX) {
        p = arena_small_alloc(a, bytes);
    } else {
        size_t len = arena_round_len(bytes);
        if (len >= bytes && bytes > ARENA_MEDIUM_MIN && bytes <= ARENA_MEDIUM_MAX)
            p = arena_medium_alloc(a, bytes, len);
        else if (len >= bytes)
            p = arena_large_alloc(a, bytes, len);
    }
    if (p) {
        a->st.blocks++;
        a->st.bytes_live += bytes;
        if (a->st.bytes_live > a->st.peak_live)
            a->st.peak_live = a->st.bytes_live;
    } else {
        a->st.alloc_failures++;
    }
    pthread_mutex_unlock(&a->mu);
    return p;
}

static void arena_iface_free(void *ctx, void *p, size_t bytes)
{
    arena *a = ctx;
    if (!p)
        return;
    pthread_mutex_lock(&a->mu);
    CHECKF(bytes > 0 && a->st.blocks > 0 && a->st.bytes_live >= bytes,
           "arena: free of %zu bytes at %p that were never allocated", bytes, p);
    if (bytes <= ARENA_SMALL_MAX)
        arena_small_free(a, p, bytes);
    else if (bytes > ARENA_MEDIUM_MIN && bytes <= ARENA_MEDIUM_MAX)
        arena_medium_free(a, p, bytes);
    else
        arena_large_free(a, p, bytes);
    a->st.blocks--;
    a->st.bytes_live -= bytes;
    pthread_mutex_unlock(&a->mu);
}

/* ---- life cycle -------------------------------------------------------- */

static void arena_fallback(arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void arena_fallback(arena *a, const char *fmt, ...)
{
    char why[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    a->bound = false;
    if (a->nodeset) {
        hwloc_bitmap_free(a->nodeset);
        a->nodeset = NULL;
    }
    snprintf(a->placement, sizeof a->placement, "unbound (%s)", why);
}

pd_status arena_new(numa_topo *topo, unsigned node, unsigned flags, arena **out, pd_err *err)
{
    if (!topo || !out)
        return pd_err_set(err, PD_ERR_ARG, "arena: needs a topology and an output pointer");
    if (flags & ~(unsigned)ARENA_UNBOUND)
        return pd_err_set(err, PD_ERR_ARG, "arena: unknown flags 0x%x", flags);
    unsigned nodes = numa_topo_nodes(topo);
    if (node >= nodes)
        return pd_err_set(err, PD_ERR_RANGE, "arena: numa node %u out of range (%u nodes)", node,
                          nodes);
    hwloc_topology_t t = numa_topo_hwloc(topo);
    hwloc_obj_t obj = hwloc_get_obj_by_type(t, HWLOC_OBJ_NUMANODE, node);
    CHECK(obj && obj->nodeset);

    arena *a = calloc(1, sizeof *a);
    if (!a)
        return pd_err_set(err, PD_ERR_NOMEM, "arena: out of memory");
    long page = sysconf(_SC_PAGESIZE);
    *a = (arena){.topo = topo, .t = t, .node = node, .page = page > 0 ? (size_t)page : 4096,
                 .nbuckets = 64, .bucket_shift = 64 - 6};
    a->iface = (pd_alloc){.alloc = arena_iface_alloc, .free = arena_iface_free, .ctx = a};
    a->buckets = calloc(a->nbuckets, sizeof *a->buckets);
    if (!a->buckets || pthread_mutex_init(&a->mu, NULL) != 0) {
        free(a->buckets);
        free(a);
        return pd_err_set(err, PD_ERR_NOMEM, "arena: out of memory");
    }

    const struct hwloc_topology_support *sup = hwloc_topology_get_support(t);
    bool this_system = numa_topo_is_this_system(topo);
    a->can_query = this_system && sup->membind->get_area_memlocation;
    if (flags & ARENA_UNBOUND) {
        arena_fallback(a, "requested");
    } else if (!this_system) {
        arena_fallback(a, "synthetic or XML topology");
    } else if (!sup->membind->alloc_membind) {
        arena_fallback(a, "hwloc cannot allocate bound memory here");
    } else if (!(a->nodeset = hwloc_bitmap_dup(obj->nodeset))) {
        pthread_mutex_destroy(&a->mu);
        free(a->buckets);
        free(a);
        return pd_err_set(err, PD_ERR_NOMEM, "arena: out of memory");
    } else {
        a->bound = true;
        /* Support flags do not tell whether the kernel (or a container's
         * seccomp policy) lets mbind through: probe with one page. */
        void *probe = hwloc_alloc_membind(t, a->page, a->nodeset, HWLOC_MEMBIND_BIND,
                                          HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_STRICT);
        if (probe)
            hwloc_free(t, probe, a->page);
        else
            arena_fallback(a, "binding to numa node %u failed: %s", node, strerror(errno));
    }
    if (a->bound)
        snprintf(a->placement, sizeof a->placement, "bound to numa node %u (os %u)", node,
                 obj->os_index);
    *out = a;
    return PD_OK;
}

void arena_free(arena *a)
{
    if (!a)
        return;
    for (size_t i = 0; i < a->nbuckets; i++) {
        arena_region *r = a->buckets[i];
        while (r) {
            arena_region *next = r->next;
            arena_sys_free(a, r);
            free(r);
            r = next;
        }
    }
    while (a->slabs) {
        arena_slab *next = a->slabs->next;
        free(a->slabs);
        a->slabs = next;
    }
    free(a->buckets);
    hwloc_bitmap_free(a->nodeset);
    pthread_mutex_destroy(&a->mu);
    free(a);
}

void arena_set_retain(arena *a, size_t bytes)
{
    pthread_mutex_lock(&a->mu);
    a->retain_cap = bytes;
    arena_trim_retained(a, 0);
    pthread_mutex_unlock(&a->mu);
}

const pd_alloc *arena_alloc_iface(arena *a)
{
    return &a->iface;
}

bool arena_is_bound(const arena *a)
{
    return a->bound;
}

const char *arena_placement(const arena *a)
{
    return a->placement;
}

unsigned arena_node(const arena *a)
{
    return a->node;
}

void arena_stats_get(arena *a, arena_stats *out)
{
    pthread_mutex_lock(&a->mu);
    *out = a->st;
    pthread_mutex_unlock(&a->mu);
}

/* ---- verification ------------------------------------------------------ */

typedef struct arena_tally {
    size_t on, wrong, unknown;
} arena_tally;

static pd_status arena_locate(arena *a, const char *p, size_t len, hwloc_bitmap_t where,
                              hwloc_const_bitmap_t want, int *verdict, pd_err *err)
{
    if (hwloc_get_area_memlocation(a->t, p, len, where, HWLOC_MEMBIND_BYNODESET) != 0)
        return pd_err_set(err, PD_ERR_TOPOLOGY,
                          "arena: cannot query the placement of %zu bytes at %p: %s", len,
                          (const void *)p, strerror(errno));
    if (hwloc_bitmap_iszero(where))
        *verdict = 0; /* not resident */
    else if (hwloc_bitmap_isequal(where, want))
        *verdict = 1; /* all on the node */
    else if (!hwloc_bitmap_intersects(where, want))
        *verdict = 2; /* all elsewhere */
    else
        *verdict = 3; /* mixed */
    return PD_OK;
}

static pd_status arena_verify_region(arena *a, const char *p, size_t len, hwloc_bitmap_t where,
                                     hwloc_const_bitmap_t want, arena_tally *tally, pd_err *err)
{
    for (size_t off = 0; off < len; off += ARENA_VERIFY_SPAN) {
        size_t n = len - off < ARENA_VERIFY_SPAN ? len - off : ARENA_VERIFY_SPAN;
        int v = 0;
        pd_status st = arena_locate(a, p + off, n, where, want, &v, err);
        if (st != PD_OK)
            return st;
        if (v != 3) {
            size_t *slot = v == 0 ? &tally->unknown : v == 1 ? &tally->on : &tally->wrong;
            *slot += n;
            continue;
        }
        /* Mixed span: page by page (a page lives on exactly one node). */
        for (size_t q = 0; q < n;) {
            uintptr_t at = (uintptr_t)(p + off + q);
            size_t step = a->page - (size_t)(at % a->page);
            if (step > n - q)
                step = n - q;
            if ((st = arena_locate(a, p + off + q, step, where, want, &v, err)) != PD_OK)
                return st;
            size_t *slot = v == 0 ? &tally->unknown : v == 1 ? &tally->on : &tally->wrong;
            *slot += step;
            q += step;
        }
    }
    return PD_OK;
}

pd_status arena_verify(arena *a, arena_verdict *out, pd_err *err)
{
    if (!a || !out)
        return pd_err_set(err, PD_ERR_ARG, "arena: verify needs an arena and a verdict");
    arena_verdict v = {.verified = false};
    if (!a->can_query) {
        snprintf(v.reason, sizeof v.reason, "placement cannot be queried: %s", a->placement);
        pthread_mutex_lock(&a->mu);
        a->st.bytes_verified = 0;
        pthread_mutex_unlock(&a->mu);
        *out = v;
        return PD_OK;
    }
    hwloc_bitmap_t where = hwloc_bitmap_alloc();
    hwloc_obj_t obj = hwloc_get_obj_by_type(a->t, HWLOC_OBJ_NUMANODE, a->node);
    if (!where)
        return pd_err_set(err, PD_ERR_NOMEM, "arena: out of memory");
    arena_tally tally = {0};
    pd_status st = PD_OK;
    pthread_mutex_lock(&a->mu);
    for (size_t i = 0; i < a->nbuckets && st == PD_OK; i++)
        for (arena_region *r = a->buckets[i]; r && st == PD_OK; r = r->next)
            st = arena_verify_region(a, r->p, r->len, where, obj->nodeset, &tally, err);
    if (st == PD_OK) {
        v.bytes_checked = tally.on + tally.wrong + tally.unknown;
        CHECK(v.bytes_checked == a->st.bytes_placed);
        v.bytes_on_node = tally.on;
        v.bytes_wrong = tally.wrong;
        v.bytes_unknown = tally.unknown;
        a->st.bytes_verified = tally.on;
        bool all_on = tally.wrong == 0 && tally.unknown == 0;
        v.verified = a->bound && all_on;
        if (!a->bound)
            snprintf(v.reason, sizeof v.reason, "%s; %zu of %zu bytes happen to be on node %u",
                     a->placement, tally.on, v.bytes_checked, a->node);
        else if (!all_on)
            snprintf(v.reason, sizeof v.reason,
                     "%zu bytes on another node, %zu bytes not resident, of %zu", tally.wrong,
                     tally.unknown, v.bytes_checked);
    }
    pthread_mutex_unlock(&a->mu);
    hwloc_bitmap_free(where);
    if (st == PD_OK)
        *out = v;
    return st;
}

void arena_check(arena *a)
{
    pthread_mutex_lock(&a->mu);
    CHECK(a->bound == (a->nodeset != NULL));
    CHECK(a->nbuckets >= 64 && (a->nbuckets & (a->nbuckets - 1)) == 0);
    size_t regions = 0, bytes = 0, chunks = 0, large = 0, retained = 0, n_retained = 0, n_slabs = 0;
    for (size_t i = 0; i < a->nbuckets; i++) {
        for (arena_region *r = a->buckets[i]; r; r = r->next) {
            CHECK(arena_hash(a, r->p) == i);
            CHECK(((uintptr_t)r->p & (ARENA_ALIGN - 1)) == 0);
            regions++;
            bytes += r->len;
            if (r->chunk) {
                CHECK(r->len == ARENA_CHUNK_BYTES && !r->retained && r->asked == 0 && !r->slab);
                chunks++;
            } else if (r->slab) {
                CHECK(r->len == ARENA_SLAB_BYTES && !r->retained && r->asked == 0 && r->slab->p == r->p);
                CHECK(((uintptr_t)r->p & (ARENA_HUGE_PAGE - 1)) == 0);
                n_slabs++;
            } else {
                CHECK(r->len > ARENA_SMALL_MAX && r->len % ARENA_LARGE_ROUND == 0);
                if (r->retained) {
                    CHECK(r->asked == 0);
                    retained += r->len;
                    n_retained++;
                } else {
                    CHECK(r->asked > 0 && r->asked <= r->len);
                    large += r->len;
                }
            }
        }
    }
    size_t empty = 0;
    for (arena_slab *sl = a->slabs; sl; sl = sl->next) {
        arena_region *r = arena_region_find(a, sl->p);
        CHECK(r && r->slab == sl);
        CHECK(n_slabs-- > 0);
        size_t fb = 0;
        for (void *p = sl->free; p;) {
            arena_free_block b = arena_fb_read(p);
            CHECK((char *)p >= sl->p && (size_t)((char *)p - sl->p) + b.len <= sl->bump);
            CHECK(b.len > ARENA_MEDIUM_MIN && b.len % ARENA_LARGE_ROUND == 0);
            fb += b.len;
            p = b.next;
        }
        CHECKF(fb == sl->free_bytes && sl->live + fb == sl->bump && sl->bump <= ARENA_SLAB_BYTES,
               "slab %p: live %zu, free %zu (listed %zu), bumped %zu", (void *)sl->p, sl->live, sl->free_bytes, fb,
               sl->bump);
        if (sl->live == 0) {
            CHECK(sl->bump == 0 && !sl->free);
            empty++;
        }
    }
    CHECK(n_slabs == 0 && empty == a->slabs_empty);
    CHECK(regions == a->st.regions && bytes == a->st.bytes_placed);
    CHECK(chunks == a->chunks && large == a->large_held);
    retained += empty * ARENA_SLAB_BYTES;
    CHECK(retained == a->st.bytes_retained && retained <= a->retain_cap);
    for (arena_region *r = a->retained; r; r = r->older) {
        CHECK(r->retained && arena_region_find(a, r->p) == r);
        CHECK(n_retained-- > 0);
    }
    CHECK(n_retained == 0);
    size_t free_bytes = 0;
    for (unsigned c = 0; c < ARENA_CLASSES; c++) {
        for (void *p = a->free_list[c]; p;) {
            CHECK(((uintptr_t)p & (ARENA_ALIGN - 1)) == 0);
            free_bytes += arena_class_size(c);
            void *next;
            ARENA_UNPOISON(p, sizeof next);
            memcpy(&next, p, sizeof next);
            ARENA_POISON(p, sizeof next);
            p = next;
        }
    }
    CHECKF(chunks * ARENA_CHUNK_BYTES == free_bytes + a->small_used + a->bump_left,
           "chunks %zu, free %zu, used %zu, remainder %zu", chunks, free_bytes, a->small_used,
           a->bump_left);
    CHECK(a->st.bytes_live <= a->st.peak_live && a->st.bytes_placed <= a->st.peak_placed);
    CHECK((a->st.blocks == 0) == (a->st.bytes_live == 0));
    pthread_mutex_unlock(&a->mu);
}
