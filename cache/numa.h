/* numa: where a rank runs and which NUMA node its memory belongs to.
 *
 * Owns a hwloc topology (this machine's, or a synthetic / XML one for testing
 * placement logic), reads the binding the process already has, chooses a NUMA
 * node and a core subset for a node-local rank, applies the CPU binding, and
 * formats the placement report. Memory placement itself is arena.h's job.
 *
 * Choosing a node is a pure function (numa_select) of the topology, the
 * current binding, the node-local rank and the node-local rank count:
 *
 *   1. The binding covers the whole machine (nobody bound us; "spread"):
 *      every NUMA node with CPUs is a candidate.
 *   2. Otherwise, the binding touches exactly one NUMA node (mpirun's
 *      --bind-to numa/core/...; "respected"): that node, that binding, no
 *      rebinding. This test runs after 1, so on a one-node machine an unbound
 *      process is "spread" and its ranks still get disjoint cores.
 *   3. Otherwise, the binding spans several nodes but not all ("within"):
 *      the candidates are the nodes it touches, restricted to its CPUs.
 *
 *   With N candidate nodes (in logical order) and `count` local ranks, rank r
 *   takes candidate floor(r * N / count): BLOCKED, not round-robin. Adjacent
 *   ranks are adjacent pipeline stages and exchange hidden states every step,
 *   so keeping neighbours on one node keeps most pipeline traffic node-local
 *   (4 ranks on 2 nodes -> 0,0,1,1: one cross-node hop instead of three).
 *   The formula still spreads evenly (each node gets floor or ceil of
 *   count / N ranks) and with fewer ranks than nodes it strides across them
 *   (2 ranks on 2 packages x 2 nodes -> nodes 0 and 2: one per package).
 *   The k ranks sharing a node split its cores (Core objects, or PUs when the
 *   topology has no cores) into k disjoint contiguous blocks, slot j taking
 *   cores [floor(j*n/k), floor((j+1)*n/k)). With more ranks than cores on a
 *   node, slot j takes core floor(j*n/k) alone and `cores_shared` is set.
 *
 * Example (a rank's start-up; errors abbreviated):
 *
 *     numa_topo *topo;  numa_choice where;  pd_err err = {0};
 *     if (numa_topo_load(&topo, &err) != PD_OK) ...
 *     if (numa_place(topo, local_rank, local_count, 0, &where, &err) != PD_OK) ...
 *     arena *mem;       // arena.h: memory bound to the chosen node
 *     arena_new(topo, where.node, 0, &mem, &err);
 *     ... caches allocate through arena_alloc_iface(mem) ...
 *     arena_verdict v;  arena_stats st;
 *     arena_verify(mem, &v, &err);
 *     arena_stats_get(mem, &st);
 *     char line[NUMA_REPORT_CHARS], json[NUMA_REPORT_CHARS];
 *     numa_report_info info = {.rank = world_rank, .host = NULL,
 *                              .bytes_placed = st.bytes_placed,
 *                              .verified = v.verified,
 *                              .placement = arena_placement(mem)};
 *     numa_report_line(&where, &info, line, sizeof line, &err);
 *     numa_report_json(&where, &info, json, sizeof json, &err);
 *     // line: "rank 0 on node7: numa node 0 (os 0) of 1, cpus 0, spread
 *     //        (1 of 2 ranks on the node), binding applied; 1052672 bytes
 *     //        placed (bound to numa node 0 (os 0)), verified yes"
 *     // json: {"rank":0,"host":"node7","node":0,"node_os":0,"cpuset":"0",...}
 *     arena_free(mem);  numa_topo_free(topo);   // arena first
 *
 * Binding calls on a synthetic or XML topology are no-ops in hwloc; numa
 * never makes them and reports the binding as unsupported instead. */
#ifndef PD_NUMA_H
#define PD_NUMA_H

#include "base/status.h"

#include <hwloc.h>
#include <stdbool.h>
#include <stddef.h>

/* Capacity of the cpu-list strings in numa_choice ("0-3,8-11"). */
#define NUMA_CPUS_CHARS 256
/* A comfortable capacity for numa_report_line / numa_report_json buffers. */
#define NUMA_REPORT_CHARS 1024

typedef struct numa_topo numa_topo;

/* Loads this machine's topology (hwloc honours HWLOC_XMLFILE and
 * HWLOC_SYNTHETIC in the environment; numa_topo_is_this_system tells).
 * Returns owned in *out, free with numa_topo_free. *out is untouched on failure. */
pd_status numa_topo_load(numa_topo **out, pd_err *err);
/* A synthetic topology from an hwloc description ("pack:2 numa:2 core:4 pu:1").
 * Logic-only: it is never this system. */
pd_status numa_topo_synthetic(const char *desc, numa_topo **out, pd_err *err);
/* A topology from an hwloc XML file (e.g. written by numa_topo_export_xml). */
pd_status numa_topo_xml(const char *path, numa_topo **out, pd_err *err);
/* Writes the topology as hwloc XML (for bug reports and tests). */
pd_status numa_topo_export_xml(const numa_topo *t, const char *path, pd_err *err);
/* numa_topo_free(NULL) is a no-op. Free every arena made from t first. */
void numa_topo_free(numa_topo *t);

/* True when the topology describes the running machine, so binding and
 * memory placement calls act for real. */
bool numa_topo_is_this_system(const numa_topo *t);
/* The hwloc handle, borrowed, valid until numa_topo_free (arena.c uses it). */
hwloc_topology_t numa_topo_hwloc(const numa_topo *t);
/* NUMA node count (at least 1 on any loaded topology). */
unsigned numa_topo_nodes(const numa_topo *t);
/* PUs (hardware threads) of logical node `node`; 0 when out of range. */
unsigned numa_topo_node_pus(const numa_topo *t, unsigned node);
/* OS index (the kernel's node number) of logical node `node`; -1 when out of range. */
int numa_topo_node_os(const numa_topo *t, unsigned node);

/* Flags for numa_binding_get, numa_apply and numa_place. */
enum {
    NUMA_THREAD = 1u << 0,  /* query / bind the calling thread, not the whole process */
    NUMA_NO_BIND = 1u << 1, /* numa_apply / numa_place: choose, but do not bind */
    NUMA_SHARE_NODE = 1u << 2, /* numa_place: numa_share_node before binding */
};

/* The CPUs the process (or thread, with NUMA_THREAD) is bound to now, as an
 * hwloc list string ("0-3,8") in buf[cap]. On a synthetic topology hwloc
 * reports the whole machine. */
pd_status numa_binding_get(const numa_topo *t, unsigned flags, char *buf, size_t cap,
                           pd_err *err);
/* The logical indices, ascending, of the NUMA nodes whose CPUs intersect the
 * cpu list `cpus`: nodes[0..*n) (at most cap are written; *n is the full
 * count). A malformed list is PD_ERR_FORMAT, one with no CPU of the machine
 * PD_ERR_RANGE. */
pd_status numa_binding_nodes(const numa_topo *t, const char *cpus, unsigned *nodes,
                             unsigned cap, unsigned *n, pd_err *err);

typedef enum numa_mode {
    NUMA_MODE_SPREAD,    /* binding covered the machine: spread over all nodes */
    NUMA_MODE_RESPECTED, /* an external binding to one node is kept as it is */
    NUMA_MODE_WITHIN,    /* binding spans several nodes, not all: chosen inside it */
    NUMA_MODE_COUNT
} numa_mode;

/* A placement decision and what became of the binding.
 * INV: cpus is a non-empty subset of logical node `node`'s CPUs and of the
 *      binding it was chosen from; slot < ranks_on_node;
 *      respected == (mode == NUMA_MODE_RESPECTED);
 *      at most one of applied / unsupported is set, neither when respected. */
typedef struct numa_choice {
    numa_mode mode;
    unsigned node;                /* logical NUMA node index */
    int node_os;                  /* its OS index */
    unsigned nodes;               /* candidate nodes considered (1 when respected) */
    unsigned ranks_on_node;       /* local ranks the rule puts on `node` (1 when respected) */
    unsigned slot;                /* this rank's index among them (0 when respected) */
    bool cores_shared;            /* more ranks than cores on the node */
    bool node_shared;             /* numa_share_node: cpus are all of the node's (in the binding) */
    char cpus[NUMA_CPUS_CHARS];   /* chosen CPUs (hwloc list string) */
    unsigned n_cpus;              /* how many */
    char binding[NUMA_CPUS_CHARS]; /* binding the choice was made from */
    bool respected;               /* external binding kept */
    bool applied;                 /* numa_apply bound us to cpus */
    bool unsupported;             /* binding impossible here; see why */
    char why[128];                /* reason when unsupported, or "" */
} numa_choice;

/* Pure selection: see the rules at the top of this file. `binding` is a cpu
 * list string (NULL = the whole machine). Fills *out (applied = unsupported =
 * false); on failure *out is untouched. local_count == 0 or local_rank >=
 * local_count is PD_ERR_ARG; a malformed binding PD_ERR_FORMAT; one with no
 * CPU of this topology PD_ERR_RANGE. */
pd_status numa_select(const numa_topo *t, const char *binding, unsigned local_rank,
                      unsigned local_count, numa_choice *out, pd_err *err);

/* Binds the process (thread with NUMA_THREAD) to c->cpus and sets
 * c->applied. Does nothing when c->respected or with NUMA_NO_BIND. On a
 * topology that is not this system, or where hwloc cannot bind, sets
 * c->unsupported and c->why and returns PD_OK. A bind that fails is
 * PD_ERR_TOPOLOGY ("numa: cannot bind to node 1 (cpus 4-7): <strerror>"),
 * c unchanged. */
pd_status numa_apply(const numa_topo *t, numa_choice *c, unsigned flags, pd_err *err);

/* Widens a (not respected) choice to every CPU of its node within its
 * binding and sets node_shared: the ranks on the node then share its cores
 * rather than each holding a block. A respected choice is left as it is. */
pd_status numa_share_node(const numa_topo *t, numa_choice *c, pd_err *err);

/* numa_binding_get + numa_select (+ numa_share_node with NUMA_SHARE_NODE) +
 * numa_apply: a rank's start-up in one call. */
pd_status numa_place(const numa_topo *t, unsigned local_rank, unsigned local_count,
                     unsigned flags, numa_choice *out, pd_err *err);

/* Aborts (CHECK) unless c satisfies numa_choice's invariants against t. */
void numa_choice_check(const numa_topo *t, const numa_choice *c);

/* What the report adds to a numa_choice (from the runtime and arena.h). */
typedef struct numa_report_info {
    int rank;              /* global rank */
    const char *host;      /* NULL: gethostname() */
    size_t bytes_placed;   /* arena_stats.bytes_placed */
    bool verified;         /* arena_verdict.verified */
    const char *placement; /* arena_placement(); NULL: omitted */
    bool no_memory;        /* a rank that places no memory of its own (an encoder rank):
                              bytes_placed, verified and placement are omitted */
} numa_report_info;

/* One human line, no newline, into buf[cap]. PD_ERR_RANGE if it does not fit. */
pd_status numa_report_line(const numa_choice *c, const numa_report_info *info, char *buf,
                           size_t cap, pd_err *err);
/* One JSON object (strings escaped) into buf[cap]:
 * {"rank":R,"host":H,"node":N,"node_os":O,"cpuset":C,"mode":M,"binding":B,
 *  "bytes_placed":P,"verified":true|false[,"placement":S]}
 * B is "respected", "applied", "not applied" or "unsupported (<why>)".
 * With info->no_memory the object ends after "binding" (the line after
 * "binding B"). */
pd_status numa_report_json(const numa_choice *c, const numa_report_info *info, char *buf,
                           size_t cap, pd_err *err);

#endif
