/* jobctl: what a running job does at its drain points (run.h) and who asks
 * for them — checkpoints (signals, --checkpoint-every), live layer
 * migrations (--migrate-at, the control socket, --rebalance auto), and the
 * status gather behind `pipedec ctl PATH status`.
 *
 * Owns: the migration state (migrate.h), the control socket on rank 0
 * (ctl.h, taken over at jobctl_new), the requests waiting for a drain point
 * and the per-window counters.
 *
 * Actions (the drain message's action number, the same on every rank):
 *   1 checkpoint, 2 checkpoint and stop (ckpt.h), 3 migrate to the map the
 *   head holds (migrate.h), 4 gather every rank's counters over the last
 *   window (status; --rebalance auto then decides and may migrate in the
 *   same drain point).
 *
 * Control commands (one request line, one JSON reply line, ctl.h):
 *   status                      map, per-stage busy / wait seconds and busy
 *                               fraction since the previous status, streams,
 *                               tokens, tokens/s, checkpoint and migration
 *                               state (answered at once, without a drain
 *                               point: ranks 1..N-1 send the head their
 *                               counters between micro-batches, at most
 *                               every 50 ms, on a link of their own)
 *   migrate --map M             any map with the job's rank count
 *   migrate --layer L --to R    a boundary layer to the neighbouring rank
 *   checkpoint | stop           as SIGUSR1 / SIGTERM (needs --checkpoint-dir)
 * A refused command says why ({"ok":false,"error":...}) and changes nothing;
 * a migration asked for while another waits for its drain point is refused.
 *
 * INV: at most one migration is pending (pend_mig); a pending request's
 *      client gets exactly one reply. */
#ifndef PD_RUNTIME_JOBCTL_H
#define PD_RUNTIME_JOBCTL_H

#include "base/status.h"
#include "cluster/runtime/ops/ctl.h"
#include "cluster/runtime/loop/head.h"
#include "cluster/runtime/rank/rank.h"
#include "cluster/runtime/rank/run_opts.h"

typedef struct jobctl jobctl;

/* Collective (every rank, after start-up). h: the head (rank 0, else NULL);
 * c: the control socket (rank 0 with --control, else NULL), owned from now
 * on even on failure; ckpt_base: checkpoint numbers of this run start after
 * it. Returns owned *out (jobctl_free, before head_free and rank_stop). */
pd_status jobctl_new(rank *r, head *h, ctl *c, uint64_t ckpt_base, jobctl **out, pd_err *err);
void jobctl_free(jobctl *j);

/* Every rank, after its loop ended well (collective): a pre-copy still
 * running exchanges its end marks, the live-status counters their last
 * message, so nothing is left in flight. */
pd_status jobctl_finish(jobctl *j, pd_err *err);

/* The hooks every rank passes to its loop (borrowing j). */
void jobctl_hooks(jobctl *j, run_hooks *out);

/* RUN_EXIT_OK, or what the run ends with after a stop (RUN_EXIT_RESUMABLE
 * after a checkpoint, RUN_EXIT_FAIL when it failed). */
int jobctl_exit_code(const jobctl *j);


/* --migrate-at STEP:MAP (testing aid): parses one; *step and map borrowed
 * from s. PD_ERR_ARG naming the flag. */
pd_status jobctl_parse_migrate_at(const char *s, uint64_t *step, const char **map, pd_err *err);

#endif
