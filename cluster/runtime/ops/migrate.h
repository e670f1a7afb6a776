/* migrate: live layer migration — moving contiguous layer ranges, with every
 * alive stream's cache state, between running ranks at a drain point
 * (run.h), so that every rank switches to a new layer map together and no
 * token changes (ARCHITECTURE.md §1, §10).
 *
 * Owns: a communicator duplicated from the pipeline's (the migration's
 * point-to-point traffic must not meet the pipeline's pre-posted receives)
 * and the weight slices this rank loaded for layers it received.
 *
 * Protocol (migrate_run, every rank at the same drain point):
 *   1. plan   the head checks the target map (same rank count, a change,
 *             the admission budget of every rank under it: --mem-limit) and
 *             broadcasts it with the alive streams and their positions; a
 *             refused plan changes nothing;
 *   2. copy   every rank settles those streams at their positions; a rank
 *             that takes layers and wants their weights over MPI
 *             (--weights-over-mpi, or the model file not readable there)
 *             gets them from the giving rank (tensor pieces with CRC32C,
 *             loaded from an image of the file: model_load_image), else it
 *             maps them from the model file; each layer whose owner changes
 *             travels from its old owner to its new one as one state bundle
 *             (comm/bundle.h: CRC per entry, whole-bundle validation); the
 *             receiver reads each bundle as its pieces arrive
 *             (bundle_reader: CRC, structure, identity = model + layer +
 *             policy, layer, exactly the broadcast streams) and decodes
 *             each entry at once into a copy of its own
 *             (stage_spare_cache) through the caches' own install checks
 *             (geometry, kind, position), held aside: a failure anywhere in
 *             the bundle frees them all. Before it votes, a receiver whose
 *             new layers sit next to the ones it holds adds them with those
 *             copies (and removes them again if the move is refused), any
 *             other keeps them for the switch to hand to the stage;
 *   3. ack    every rank's digests (CRC32C and length of each bundle as sent
 *             and as received) and verdict are gathered: one failure or one digest
 *             that differs refuses the whole move, every rank drops what it
 *             prepared, the old map stays (the sources never stopped owning
 *             their layers);
 *   4. switch every rank removes the layers it gives (their caches are
 *             freed); a receiver that did not install early adds the layers
 *             it takes with its validated copies as their containers
 *             (stage_add_layers_from); the map, the head's budget and the
 *             rank's layer map change together. A failure here cannot be
 *             undone (a commit after a full validation fails only for lack
 *             of memory): it ends the job like any mid-run failure.
 *
 * Without pre-copy (bounded caches: rings, windows, eviction) it is a
 * stop-the-world copy: the pipeline is drained during the whole move, and
 * the state moved is bounded by the policy. With pre-copy (below) step 2
 * sends only the rows since the pre-copy's last chunks. */
#ifndef PD_RUNTIME_MIGRATE_H
#define PD_RUNTIME_MIGRATE_H

#include "base/status.h"
#include "cluster/runtime/sched/budget.h"
#include "cluster/runtime/plan/layermap.h"
#include "cluster/runtime/rank/rank.h"
#include "cluster/runtime/sched/sched.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct migrate migrate;

/* Test hooks (--migrate-fault, documented as such): each makes every
 * migration of the run fail at a protocol step so the tests see the abort
 * path: CORRUPT flips one byte of the first bundle a source sends (after its
 * CRC was computed), WEIGHTS makes the receiver's weight load read a path
 * that does not exist, CUT ends the first bundle a source sends half way
 * (the pieces after that go short or empty, as a transfer cut mid-stream:
 * the receiver has decoded some of its records by then). */
typedef enum migrate_fault {
    MIGRATE_FAULT_NONE = 0,
    MIGRATE_FAULT_CORRUPT,
    MIGRATE_FAULT_WEIGHTS,
    MIGRATE_FAULT_CUT,
    MIGRATE_FAULT_COUNT
} migrate_fault;

pd_status migrate_fault_parse(const char *s, migrate_fault *out, pd_err *err);

/* Collective (duplicates the pipeline's communicator): every rank, after
 * rank_start. r is borrowed and must outlive the migrate. Returns owned *out
 * (migrate_free, before rank_stop: it frees weight slices the stage uses). */
pd_status migrate_new(rank *r, migrate_fault fault, migrate **out, pd_err *err);
void migrate_free(migrate *mg);

/* What one migration did (filled on every rank; figures are the job's). */
typedef struct migrate_report {
    bool moved;              /* the new map is in force on every rank */
    char why[512];           /* refused: the reason (the failing rank's words) */
    layermap from, to;
    uint32_t layers_moved;
    uint32_t streams;
    uint64_t bytes;          /* state bytes moved (all bundles) */
    double copy_s;           /* export, transfer and validation (max over ranks) */
    double export_s;         /* settling and encoding the bundles (max over ranks) */
    double weights_s;        /* loading the moving layers' weights (max over ranks) */
    double transfer_s;       /* from the first send to the last bundle received (max) */
    double switch_s;         /* installing and removing layers (max over ranks; a
                                receiver next to its new layers installs them before
                                the vote, the rest at the switch) */
    double total_s;          /* the whole action on this rank */
    /* pre-copy (full attention without eviction: precopy.h) */
    bool started;            /* migrate_begin: the pre-copy runs */
    uint64_t precopy_bytes;  /* chunk bytes sent while decoding went on (this rank) */
    uint64_t final_bytes;    /* chunk bytes sent at the switch (this rank) */
    uint64_t resets;         /* copies restarted from row 0 (this rank) */
    double precopy_s;        /* from the pre-copy's start to the switch */
    double precopy_send_s;   /* the busiest source's seconds encoding and sending chunks */
    double precopy_recv_s;   /* the busiest receiver's seconds taking and applying them */
    double precopy_alloc_s;  /* of those, allocating its copies' caches */
    double weights_mpi_bytes;/* weight bytes that travelled over MPI */
    uint64_t weights_released; /* weight bytes the giving ranks freed at the switch */
} migrate_report;

/* The drain action. target: the head's proposed map (read on rank 0 only);
 * sc / bud: the head's scheduler and budget (NULL elsewhere; bud may be
 * NULL). Returns PD_OK when the action ended with the same outcome on every
 * rank — moved, or refused with the old map intact (rep->moved false,
 * rep->why) — and an error only when the job cannot go on (an MPI failure,
 * a failed switch). */
pd_status migrate_run(migrate *mg, sched *sc, budget *bud, const layermap *target, migrate_report *rep,
                      pd_err *err);

/* Pre-copy (precopy.h). Under a policy whose caches grow with the context
 * (migrate_uses_precopy), a migration runs in two drain points: migrate_begin
 * (plan checked and agreed, nothing copied: every rank starts the pre-copy),
 * then decoding goes on while migrate_progress, called by every rank between
 * micro-batches, moves the rows that are final; then migrate_run at a later
 * drain point is the switch: the plan is checked again (the same map), only
 * the rows since the last chunks travel, and steps 3-4 run as above. A
 * refused switch ends the pre-copy with the old map in force. */
bool migrate_uses_precopy(const migrate *mg);
/* Every rank, after a run that ended well: a pre-copy still running (the
 * run ended before its switch) sends and takes its end marks, so nothing
 * is left in flight. */
pd_status migrate_finish(migrate *mg, pd_err *err);
bool migrate_precopying(const migrate *mg);
/* The first drain point: rep->started, or rep->why when refused. */
pd_status migrate_begin(migrate *mg, sched *sc, budget *bud, const layermap *target, migrate_report *rep,
                        pd_err *err);
/* Between micro-batches (every rank): *busy while this rank has pre-copy
 * work left. Errors are MPI failures. */
pd_status migrate_progress(migrate *mg, bool *busy, pd_err *err);

/* The map that moves boundary layer `layer` to rank `to` (a neighbour of its
 * owner on the side the layer sits at; the owner must keep a layer).
 * PD_ERR_ARG naming what is wrong; *out written only on success. */
pd_status migrate_map_for_layer(const layermap *cur, uint32_t layer, uint32_t to, layermap *out, pd_err *err);

/* Layers whose owner differs between a and b (same stage count). */
uint32_t migrate_layers_moved(const layermap *a, const layermap *b);

#endif
