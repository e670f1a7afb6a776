/* numa: topology probing, node/core selection and CPU binding over hwloc.
 * Owns the hwloc topology behind numa_topo; everything else is computed on
 * demand from it. The selection rules are documented in numa.h. */
#include "cache/numa.h"

#include "base/check.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* INV: t is a loaded topology; this_system caches hwloc_topology_is_thissystem. */
struct numa_topo {
    hwloc_topology_t t;
    bool this_system;
};

/* Largest CPU index a binding string may name: bounds the bitmap a hostile or
 * mistyped string ("0-4000000000") could make us build. */
#define NUMA_MAX_CPU 1048575u

typedef enum numa_source { NUMA_SRC_THIS, NUMA_SRC_SYNTHETIC, NUMA_SRC_XML } numa_source;

static pd_status numa_topo_open(numa_source src, const char *arg, numa_topo **out, pd_err *err)
{
    if (!out)
        return pd_err_set(err, PD_ERR_ARG, "numa: no output pointer");
    if (src != NUMA_SRC_THIS && !arg)
        return pd_err_set(err, PD_ERR_ARG, "numa: no topology %s given",
                          src == NUMA_SRC_SYNTHETIC ? "description" : "file");
    hwloc_topology_t t;
    if (hwloc_topology_init(&t) != 0)
        return pd_err_set(err, PD_ERR_NOMEM, "numa: hwloc_topology_init: %s", strerror(errno));
    /* PCI and other I/O objects play no part in placement; skipping them makes
     * loading faster. */
    hwloc_topology_set_io_types_filter(t, HWLOC_TYPE_FILTER_KEEP_NONE);
    pd_status st = PD_OK;
    if (src == NUMA_SRC_SYNTHETIC && hwloc_topology_set_synthetic(t, arg) != 0)
        st = pd_err_set(err, PD_ERR_FORMAT, "numa: bad synthetic topology \"%s\"", arg);
    else if (src == NUMA_SRC_XML && hwloc_topology_set_xml(t, arg) != 0)
        st = pd_err_set(err, PD_ERR_IO, "numa: cannot use topology XML %s: %s", arg,
                        strerror(errno));
    else if (hwloc_topology_load(t) != 0)
        st = pd_err_set(err, src == NUMA_SRC_XML ? PD_ERR_FORMAT : PD_ERR_TOPOLOGY,
                        "numa: cannot load topology%s%s: %s", arg ? " " : "", arg ? arg : "",
                        strerror(errno));
    if (st != PD_OK) {
        hwloc_topology_destroy(t);
        return st;
    }
    numa_topo *nt = malloc(sizeof *nt);
    if (!nt) {
        hwloc_topology_destroy(t);
        return pd_err_set(err, PD_ERR_NOMEM, "numa: out of memory");
    }
    *nt = (numa_topo){.t = t, .this_system = hwloc_topology_is_thissystem(t) != 0};
    *out = nt;
    return PD_OK;
}

pd_status numa_topo_load(numa_topo **out, pd_err *err)
{
    return numa_topo_open(NUMA_SRC_THIS, NULL, out, err);
}

pd_status numa_topo_synthetic(const char *desc, numa_topo **out, pd_err *err)
{
    return numa_topo_open(NUMA_SRC_SYNTHETIC, desc, out, err);
}

pd_status numa_topo_xml(const char *path, numa_topo **out, pd_err *err)
{
    return numa_topo_open(NUMA_SRC_XML, path, out, err);
}

pd_status numa_topo_export_xml(const numa_topo *t, const char *path, pd_err *err)
{
    if (!t || !path)
        return pd_err_set(err, PD_ERR_ARG, "numa: export needs a topology and a path");
    if (hwloc_topology_export_xml(t->t, path, 0) != 0)
        return pd_err_set(err, PD_ERR_IO, "numa: cannot write topology XML %s: %s", path,
                          strerror(errno));
    return PD_OK;
}

void numa_topo_free(numa_topo *t)
{
    if (!t)
        return;
    hwloc_topology_destroy(t->t);
    free(t);
}

bool numa_topo_is_this_system(const numa_topo *t)
{
    return t->this_system;
}

hwloc_topology_t numa_topo_hwloc(const numa_topo *t)
{
    return t->t;
}

unsigned numa_topo_nodes(const numa_topo *t)
{
    int n = hwloc_get_nbobjs_by_type(t->t, HWLOC_OBJ_NUMANODE);
    CHECK(n >= 1); /* hwloc always reports at least one node */
    return (unsigned)n;
}

static hwloc_obj_t numa_node_obj(const numa_topo *t, unsigned node)
{
    return hwloc_get_obj_by_type(t->t, HWLOC_OBJ_NUMANODE, node);
}

unsigned numa_topo_node_pus(const numa_topo *t, unsigned node)
{
    hwloc_obj_t o = numa_node_obj(t, node);
    if (!o || !o->cpuset)
        return 0;
    int w = hwloc_bitmap_weight(o->cpuset);
    return w > 0 ? (unsigned)w : 0;
}

int numa_topo_node_os(const numa_topo *t, unsigned node)
{
    hwloc_obj_t o = numa_node_obj(t, node);
    return o ? (int)o->os_index : -1;
}

/* Strict cpu-list parser: "N" or "N-M" items separated by commas, nothing
 * else (hwloc's own parser reads "5x" as an empty set without complaint). */
static pd_status numa_parse_cpus(const char *s, hwloc_bitmap_t out, pd_err *err)
{
    if (!s)
        return pd_err_set(err, PD_ERR_ARG, "numa: no cpu list");
    hwloc_bitmap_zero(out);
    size_t i = 0;
    for (;;) {
        unsigned long lo = 0, hi;
        size_t start = i;
        if (s[i] < '0' || s[i] > '9')
            return pd_err_set(err, PD_ERR_FORMAT,
                              "numa: cpu list \"%s\": offset %zu: expected a cpu number", s, i);
        while (s[i] >= '0' && s[i] <= '9') {
            lo = lo * 10 + (unsigned long)(s[i++] - '0');
            if (lo > NUMA_MAX_CPU)
                return pd_err_set(err, PD_ERR_FORMAT,
                                  "numa: cpu list \"%s\": offset %zu: cpu number above %u", s,
                                  start, NUMA_MAX_CPU);
        }
        hi = lo;
        if (s[i] == '-') {
            i++;
            size_t hstart = i;
            if (s[i] < '0' || s[i] > '9')
                return pd_err_set(err, PD_ERR_FORMAT,
                                  "numa: cpu list \"%s\": offset %zu: expected a range end", s, i);
            hi = 0;
            while (s[i] >= '0' && s[i] <= '9') {
                hi = hi * 10 + (unsigned long)(s[i++] - '0');
                if (hi > NUMA_MAX_CPU)
                    return pd_err_set(err, PD_ERR_FORMAT,
                                      "numa: cpu list \"%s\": offset %zu: cpu number above %u", s,
                                      hstart, NUMA_MAX_CPU);
            }
            if (hi < lo)
                return pd_err_set(err, PD_ERR_FORMAT,
                                  "numa: cpu list \"%s\": offset %zu: range %lu-%lu runs backwards",
                                  s, start, lo, hi);
        }
        if (hwloc_bitmap_set_range(out, (unsigned)lo, (int)hi) != 0)
            return pd_err_set(err, PD_ERR_NOMEM, "numa: out of memory");
        if (s[i] == '\0')
            return PD_OK;
        if (s[i] != ',')
            return pd_err_set(err, PD_ERR_FORMAT,
                              "numa: cpu list \"%s\": offset %zu: unexpected '%c'", s, i, s[i]);
        i++;
    }
}

/* Formats set into buf[cap]; PD_ERR_RANGE when it does not fit. */
static pd_status numa_format_cpus(hwloc_const_bitmap_t set, char *buf, size_t cap, pd_err *err)
{
    int n = hwloc_bitmap_list_snprintf(buf, cap, set);
    if (n < 0 || (size_t)n >= cap)
        return pd_err_set(err, PD_ERR_RANGE, "numa: cpu list needs %d characters, %zu available",
                          n, cap);
    return PD_OK;
}

/* Parses `cpus` (NULL = whole machine) and clips it to the topology's CPUs. */
static pd_status numa_binding_set(const numa_topo *t, const char *cpus, hwloc_bitmap_t b,
                                  pd_err *err)
{
    hwloc_const_cpuset_t all = hwloc_topology_get_topology_cpuset(t->t);
    if (!cpus) {
        hwloc_bitmap_copy(b, all);
        return PD_OK;
    }
    pd_status st = numa_parse_cpus(cpus, b, err);
    if (st != PD_OK)
        return st;
    hwloc_bitmap_and(b, b, all);
    if (hwloc_bitmap_iszero(b))
        return pd_err_set(err, PD_ERR_RANGE, "numa: binding \"%s\" names no cpu of this topology",
                          cpus);
    return PD_OK;
}

static bool numa_node_touches(const numa_topo *t, unsigned node, hwloc_const_bitmap_t b)
{
    hwloc_obj_t o = numa_node_obj(t, node);
    return o && o->cpuset && hwloc_bitmap_intersects(o->cpuset, b);
}

pd_status numa_binding_get(const numa_topo *t, unsigned flags, char *buf, size_t cap, pd_err *err)
{
    if (!t || !buf || cap == 0)
        return pd_err_set(err, PD_ERR_ARG, "numa: binding query needs a topology and a buffer");
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set)
        return pd_err_set(err, PD_ERR_NOMEM, "numa: out of memory");
    int how = (flags & NUMA_THREAD) ? HWLOC_CPUBIND_THREAD : HWLOC_CPUBIND_PROCESS;
    pd_status st = PD_OK;
    if (hwloc_get_cpubind(t->t, set, how) != 0)
        st = pd_err_set(err, PD_ERR_TOPOLOGY, "numa: cannot read the current binding: %s",
                        strerror(errno));
    else
        st = numa_format_cpus(set, buf, cap, err);
    hwloc_bitmap_free(set);
    return st;
}

pd_status numa_binding_nodes(const numa_topo *t, const char *cpus, unsigned *nodes, unsigned cap,
                             unsigned *n, pd_err *err)
{
    if (!t || !cpus || !n || (cap && !nodes))
        return pd_err_set(err, PD_ERR_ARG, "numa: binding_nodes needs a topology, a list and n");
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    if (!b)
        return pd_err_set(err, PD_ERR_NOMEM, "numa: out of memory");
    pd_status st = numa_binding_set(t, cpus, b, err);
    if (st == PD_OK) {
        unsigned count = 0, total = numa_topo_nodes(t);
        for (unsigned i = 0; i < total; i++) {
            if (!numa_node_touches(t, i, b))
                continue;
            if (count < cap)
                nodes[count] = i;
            count++;
        }
        *n = count;
    }
    hwloc_bitmap_free(b);
    return st;
}

/* "spread", "respected", "within"; never NULL. */
static const char *numa_mode_str(numa_mode m)
{
    static const char *const names[] = {
        [NUMA_MODE_SPREAD] = "spread",
        [NUMA_MODE_RESPECTED] = "respected",
        [NUMA_MODE_WITHIN] = "within",
    };
    _Static_assert(sizeof names / sizeof names[0] == NUMA_MODE_COUNT, "name every numa_mode");
    return (unsigned)m < NUMA_MODE_COUNT ? names[m] : "unknown";
}

/* ceil(a * b / c) without overflow for the 32-bit counts used here. */
static unsigned numa_ceil_div(uint64_t ab, uint64_t c)
{
    return (unsigned)((ab + c - 1) / c);
}

/* The allocation units (cores, or PUs on a topology without Core objects) of
 * `avail`, in logical order: fills units[0..*n) up to cap; *n is the count. */
static void numa_units(const numa_topo *t, hwloc_const_bitmap_t avail, hwloc_obj_t *units,
                       unsigned cap, unsigned *n)
{
    unsigned count = 0;
    hwloc_obj_type_t types[2] = {HWLOC_OBJ_CORE, HWLOC_OBJ_PU};
    for (int k = 0; k < 2 && count == 0; k++) {
        hwloc_obj_t o = NULL;
        while ((o = hwloc_get_next_obj_by_type(t->t, types[k], o)) != NULL) {
            if (!o->cpuset || !hwloc_bitmap_intersects(o->cpuset, avail))
                continue;
            if (count < cap)
                units[count] = o;
            count++;
        }
    }
    *n = count;
}

pd_status numa_select(const numa_topo *t, const char *binding, unsigned local_rank,
                      unsigned local_count, numa_choice *out, pd_err *err)
{
    if (!t || !out)
        return pd_err_set(err, PD_ERR_ARG, "numa: select needs a topology and an output");
    if (local_count == 0 || local_rank >= local_count)
        return pd_err_set(err, PD_ERR_ARG, "numa: local rank %u of %u ranks is not a rank",
                          local_rank, local_count);
    hwloc_bitmap_t b = hwloc_bitmap_alloc(), avail = hwloc_bitmap_alloc(),
                   chosen = hwloc_bitmap_alloc(), part = hwloc_bitmap_alloc();
    unsigned total = numa_topo_nodes(t);
    unsigned *cand = malloc(total * sizeof *cand);
    int npu = hwloc_get_nbobjs_by_type(t->t, HWLOC_OBJ_PU);
    unsigned ucap = npu > 0 ? (unsigned)npu : 1;
    hwloc_obj_t *units = malloc(ucap * sizeof *units);
    numa_choice c = {.applied = false};
    pd_status st = PD_OK;
    if (!b || !avail || !chosen || !part || !cand || !units) {
        st = pd_err_set(err, PD_ERR_NOMEM, "numa: out of memory");
        goto done;
    }
    if ((st = numa_binding_set(t, binding, b, err)) != PD_OK)
        goto done;
    if ((st = numa_format_cpus(b, c.binding, sizeof c.binding, err)) != PD_OK)
        goto done;

    unsigned ncand = 0;
    for (unsigned i = 0; i < total; i++)
        if (numa_node_touches(t, i, b))
            cand[ncand++] = i;
    CHECK(ncand >= 1); /* b is a non-empty subset of the machine's CPUs */

    bool whole = hwloc_bitmap_isincluded(hwloc_topology_get_topology_cpuset(t->t), b);
    if (!whole && ncand == 1) {
        c.mode = NUMA_MODE_RESPECTED;
        c.respected = true;
        c.node = cand[0];
        c.nodes = 1;
        c.ranks_on_node = 1; /* the launcher decided who shares the node */
        c.slot = 0;
        hwloc_bitmap_copy(chosen, b);
    } else {
        c.mode = whole ? NUMA_MODE_SPREAD : NUMA_MODE_WITHIN;
        c.nodes = ncand;
        /* blocked: rank r -> candidate floor(r * N / count); see numa.h */
        unsigned k = (unsigned)((uint64_t)local_rank * ncand / local_count);
        unsigned first = numa_ceil_div((uint64_t)k * local_count, ncand);
        unsigned end = numa_ceil_div((uint64_t)(k + 1) * local_count, ncand);
        c.node = cand[k];
        c.ranks_on_node = end - first;
        c.slot = local_rank - first;
        hwloc_bitmap_and(avail, numa_node_obj(t, c.node)->cpuset, b);
        unsigned n;
        numa_units(t, avail, units, ucap, &n);
        CHECK(n >= 1 && n <= ucap);
        unsigned kr = c.ranks_on_node, lo, hi;
        lo = (unsigned)((uint64_t)c.slot * n / kr);
        if (kr <= n) {
            hi = (unsigned)((uint64_t)(c.slot + 1) * n / kr);
        } else {
            hi = lo + 1;
            c.cores_shared = true;
        }
        hwloc_bitmap_zero(chosen);
        for (unsigned u = lo; u < hi; u++) {
            hwloc_bitmap_and(part, units[u]->cpuset, avail);
            hwloc_bitmap_or(chosen, chosen, part);
        }
    }
    c.node_os = numa_topo_node_os(t, c.node);
    c.n_cpus = (unsigned)hwloc_bitmap_weight(chosen);
    if ((st = numa_format_cpus(chosen, c.cpus, sizeof c.cpus, err)) != PD_OK)
        goto done;
    *out = c;
done:
    free(units);
    free(cand);
    hwloc_bitmap_free(part);
    hwloc_bitmap_free(chosen);
    hwloc_bitmap_free(avail);
    hwloc_bitmap_free(b);
    return st;
}

static void numa_set_why(numa_choice *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void numa_set_why(numa_choice *c, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->why, sizeof c->why, fmt, ap);
    va_end(ap);
}

pd_status numa_apply(const numa_topo *t, numa_choice *c, unsigned flags, pd_err *err)
{
    if (!t || !c)
        return pd_err_set(err, PD_ERR_ARG, "numa: apply needs a topology and a choice");
    if (c->respected || (flags & NUMA_NO_BIND))
        return PD_OK;
    bool thread = (flags & NUMA_THREAD) != 0;
    if (!t->this_system) {
        c->unsupported = true;
        c->applied = false;
        numa_set_why(c, "topology is synthetic or from XML, binding is a no-op");
        return PD_OK;
    }
    const struct hwloc_topology_support *sup = hwloc_topology_get_support(t->t);
    if (!(thread ? sup->cpubind->set_thisthread_cpubind : sup->cpubind->set_thisproc_cpubind)) {
        c->unsupported = true;
        c->applied = false;
        numa_set_why(c, "hwloc cannot bind a %s on this system", thread ? "thread" : "process");
        return PD_OK;
    }
    hwloc_bitmap_t set = hwloc_bitmap_alloc();
    if (!set)
        return pd_err_set(err, PD_ERR_NOMEM, "numa: out of memory");
    pd_status st = numa_parse_cpus(c->cpus, set, err);
    if (st == PD_OK) {
        if (hwloc_set_cpubind(t->t, set, thread ? HWLOC_CPUBIND_THREAD : HWLOC_CPUBIND_PROCESS) == 0) {
            c->applied = true;
            c->unsupported = false;
        } else if (errno == ENOSYS) {
            c->unsupported = true;
            c->applied = false;
            numa_set_why(c, "binding not implemented here: %s", strerror(errno));
        } else {
            st = pd_err_set(err, PD_ERR_TOPOLOGY, "numa: cannot bind to node %u (cpus %s): %s",
                            c->node, c->cpus, strerror(errno));
        }
    }
    hwloc_bitmap_free(set);
    return st;
}

pd_status numa_share_node(const numa_topo *t, numa_choice *c, pd_err *err)
{
    if (!t || !c)
        return pd_err_set(err, PD_ERR_ARG, "numa: share_node needs a topology and a choice");
    if (c->respected)
        return PD_OK;
    hwloc_bitmap_t b = hwloc_bitmap_alloc();
    if (!b)
        return pd_err_set(err, PD_ERR_NOMEM, "numa: out of memory");
    char cpus[NUMA_CPUS_CHARS];
    pd_status st = numa_binding_set(t, c->binding, b, err);
    if (st == PD_OK) {
        hwloc_bitmap_and(b, numa_node_obj(t, c->node)->cpuset, b);
        st = numa_format_cpus(b, cpus, sizeof cpus, err);
    }
    unsigned n = (unsigned)hwloc_bitmap_weight(b);
    hwloc_bitmap_free(b);
    if (st != PD_OK)
        return st;
    memcpy(c->cpus, cpus, sizeof cpus);
    c->n_cpus = n;
    c->node_shared = true;
    return PD_OK;
}

pd_status numa_place(const numa_topo *t, unsigned local_rank, unsigned local_count,
                     unsigned flags, numa_choice *out, pd_err *err)
{
    if (!t || !out)
        return pd_err_set(err, PD_ERR_ARG, "numa: place needs a topology and an output");
    char now[NUMA_CPUS_CHARS];
    pd_status st = numa_binding_get(t, flags, now, sizeof now, err);
    if (st != PD_OK)
        return st;
    numa_choice c;
    if ((st = numa_select(t, now, local_rank, local_count, &c, err)) != PD_OK)
        return st;
    if ((flags & NUMA_SHARE_NODE) && (st = numa_share_node(t, &c, err)) != PD_OK)
        return st;
    if ((st = numa_apply(t, &c, flags, err)) != PD_OK)
        return st;
    *out = c;
    return PD_OK;
}

void numa_choice_check(const numa_topo *t, const numa_choice *c)
{
    CHECK(t && c);
    CHECK((unsigned)c->mode < NUMA_MODE_COUNT);
    CHECK(c->respected == (c->mode == NUMA_MODE_RESPECTED));
    CHECK(!(c->applied && c->unsupported));
    CHECK(!(c->respected && (c->applied || c->unsupported)));
    CHECK(c->slot < c->ranks_on_node);
    CHECK(c->node < numa_topo_nodes(t));
    CHECK(c->node_os == numa_topo_node_os(t, c->node));
    CHECK(c->nodes >= 1 && c->nodes <= numa_topo_nodes(t));
    CHECK(memchr(c->cpus, '\0', sizeof c->cpus) && memchr(c->binding, '\0', sizeof c->binding));
    hwloc_bitmap_t cpus = hwloc_bitmap_alloc(), bind = hwloc_bitmap_alloc();
    CHECK(cpus && bind);
    CHECKF(numa_parse_cpus(c->cpus, cpus, NULL) == PD_OK, "cpus \"%s\"", c->cpus);
    CHECKF(numa_parse_cpus(c->binding, bind, NULL) == PD_OK, "binding \"%s\"", c->binding);
    CHECK(!hwloc_bitmap_iszero(cpus));
    CHECKF(c->n_cpus == (unsigned)hwloc_bitmap_weight(cpus), "n_cpus %u for cpus %s", c->n_cpus, c->cpus);
    CHECKF(hwloc_bitmap_isincluded(cpus, bind), "cpus %s outside binding %s", c->cpus, c->binding);
    CHECKF(hwloc_bitmap_isincluded(cpus, numa_node_obj(t, c->node)->cpuset),
           "cpus %s outside node %u", c->cpus, c->node);
    hwloc_bitmap_free(bind);
    hwloc_bitmap_free(cpus);
}

/* A bounded string builder: appends until full, then remembers it overflowed. */
typedef struct numa_sb {
    char *buf;
    size_t cap, len;
    bool over;
} numa_sb;

static void numa_sb_printf(numa_sb *sb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void numa_sb_printf(numa_sb *sb, const char *fmt, ...)
{
    if (sb->over)
        return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(sb->buf + sb->len, sb->cap - sb->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sb->cap - sb->len) {
        sb->over = true;
        sb->buf[sb->len] = '\0';
        return;
    }
    sb->len += (size_t)n;
}

/* Appends s as a JSON string literal (quotes included). */
static void numa_sb_json_str(numa_sb *sb, const char *s)
{
    numa_sb_printf(sb, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p && !sb->over; p++) {
        if (*p == '"' || *p == '\\')
            numa_sb_printf(sb, "\\%c", *p);
        else if (*p < 0x20)
            numa_sb_printf(sb, "\\u%04x", *p);
        else
            numa_sb_printf(sb, "%c", *p);
    }
    numa_sb_printf(sb, "\"");
}

static void numa_binding_text(const numa_choice *c, char *buf, size_t cap)
{
    if (c->respected)
        snprintf(buf, cap, "respected");
    else if (c->applied)
        snprintf(buf, cap, "applied");
    else if (c->unsupported)
        snprintf(buf, cap, "unsupported (%s)", c->why);
    else
        snprintf(buf, cap, "not applied");
}

static pd_status numa_report_begin(const numa_choice *c, const numa_report_info *info, char *buf,
                                   size_t cap, char *host, size_t host_cap, pd_err *err)
{
    if (!c || !info || !buf || cap == 0)
        return pd_err_set(err, PD_ERR_ARG, "numa: report needs a choice, info and a buffer");
    if (info->host) {
        snprintf(host, host_cap, "%s", info->host);
    } else if (gethostname(host, host_cap) != 0) {
        snprintf(host, host_cap, "unknown");
    }
    host[host_cap - 1] = '\0';
    return PD_OK;
}

pd_status numa_report_line(const numa_choice *c, const numa_report_info *info, char *buf,
                           size_t cap, pd_err *err)
{
    char host[256], bind[sizeof c->why + 32];
    pd_status st = numa_report_begin(c, info, buf, cap, host, sizeof host, err);
    if (st != PD_OK)
        return st;
    numa_binding_text(c, bind, sizeof bind);
    numa_sb sb = {.buf = buf, .cap = cap};
    numa_sb_printf(&sb, "rank %d on %s: numa node %u (os %d) of %u, cpus %s, %s", info->rank,
                   host, c->node, c->node_os, c->nodes, c->cpus, numa_mode_str(c->mode));
    if (c->respected)
        numa_sb_printf(&sb, " (bound to cpus %s by the launcher)", c->binding);
    else
        numa_sb_printf(&sb, " (%u of %u ranks on the node%s)", c->slot + 1, c->ranks_on_node,
                       c->node_shared ? ", its cpus shared by them" : c->cores_shared ? ", cores shared" : "");
    numa_sb_printf(&sb, ", binding %s", bind);
    if (!info->no_memory) {
        numa_sb_printf(&sb, "; %zu bytes placed", info->bytes_placed);
        if (info->placement)
            numa_sb_printf(&sb, " (%s)", info->placement);
        numa_sb_printf(&sb, ", verified %s", info->verified ? "yes" : "no");
    }
    if (sb.over)
        return pd_err_set(err, PD_ERR_RANGE, "numa: report line does not fit in %zu bytes", cap);
    return PD_OK;
}

pd_status numa_report_json(const numa_choice *c, const numa_report_info *info, char *buf,
                           size_t cap, pd_err *err)
{
    char host[256], bind[sizeof c->why + 32];
    pd_status st = numa_report_begin(c, info, buf, cap, host, sizeof host, err);
    if (st != PD_OK)
        return st;
    numa_binding_text(c, bind, sizeof bind);
    numa_sb sb = {.buf = buf, .cap = cap};
    numa_sb_printf(&sb, "{\"rank\":%d,\"host\":", info->rank);
    numa_sb_json_str(&sb, host);
    numa_sb_printf(&sb, ",\"node\":%u,\"node_os\":%d,\"cpuset\":", c->node, c->node_os);
    numa_sb_json_str(&sb, c->cpus);
    numa_sb_printf(&sb, ",\"mode\":\"%s\",\"binding\":", numa_mode_str(c->mode));
    numa_sb_json_str(&sb, bind);
    if (!info->no_memory)
        numa_sb_printf(&sb, ",\"bytes_placed\":%zu,\"verified\":%s", info->bytes_placed,
                       info->verified ? "true" : "false");
    if (info->placement && !info->no_memory) {
        numa_sb_printf(&sb, ",\"placement\":");
        numa_sb_json_str(&sb, info->placement);
    }
    numa_sb_printf(&sb, "}");
    if (sb.over)
        return pd_err_set(err, PD_ERR_RANGE, "numa: report JSON does not fit in %zu bytes", cap);
    return PD_OK;
}
