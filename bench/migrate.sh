#!/usr/bin/env bash
# Live migration benchmark (issue 14), one JSON object:
#  - the decode pauses of one migration (one layer with every stream's cache,
#    layer 2, rank 1 -> rank 0; two streams; full attention, so it is
#    pre-copied: a first drain point agrees the plan, the rows travel while
#    decoding goes on, a second drain point switches) against one decode step
#    (the time between two tokens of a stream just before it), at contexts of
#    300, 2000 and 8000 rows;
#  - migration bytes/s against the MPI bandwidth between the same two ranks
#    measured in the same run (bench_mpi_latency, largest message): the
#    pre-copy's working rate (bytes / the busier side's seconds spent
#    encoding+sending or taking+applying chunks, the receiver's cache
#    allocation left out and reported beside) and its elapsed rate (paced by
#    the decode: PRECOPY_BUDGET bytes per micro-batch);
#  - --rebalance auto from 0-0,1-11: tokens/s over the windows after its last
#    move against the best static map's tokens/s over the same windows (every
#    static map 0-k,k+1-11 measured with --rebalance auto at a threshold it
#    never reaches, so the windows are measured the same way), two rounds of
#    every run in turn, each judged by its better round.
# usage: bench/migrate.sh BUILD_DIR [WORK_DIR]
set -euo pipefail
build="${1:?usage: bench/migrate.sh BUILD_DIR [WORK_DIR]}"
work="${2:-$(mktemp -d "${TMPDIR:-/tmp}/pd-bench-mig.XXXXXX")}"
P="$build/pipedec"
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}" OMPI_MCA_rmaps_base_oversubscribe=1
MPIRUN=(mpirun --oversubscribe --bind-to none -np 2)

# MPI bandwidth between the two ranks, in this run
"${MPIRUN[@]}" "$build/bench/bench_mpi_latency" $((32 << 20)) > "$work/mpi.json" 2>/dev/null

# pause vs decode step at three context lengths
m="$work/m.gguf"
[ -f "$m" ] || "$P" mkmodel --arch llama --layers 4 --hidden 128 --heads 2 --kv-heads 2 --ffn 256 --vocab 2000 \
  --ctx 8400 --seed 5 --out "$m" >/dev/null
for R in 300 2000 8000; do
  [ -d "$work/pages$R" ] || "$P" mkpages --model "$m" --count 2 --embed-rows "$R" --prompt-tokens 3 --max-new 64 \
    --seed 4 --out "$work/pages$R" >/dev/null
  # every stream decoding: prefill takes ceil(2 R / 1024) micro-batches
  step=$(( (2 * R + 1023) / 1024 + 40 ))
  rm -f "$work/c$R.jsonl"
  "${MPIRUN[@]}" "$P" run --model "$m" --pages "$work/pages$R/pages.jsonl" --out "$work/c$R.jsonl" --batch 2 \
    --layers 0-1,2-3 --migrate-at "$step:0-2,3" >/dev/null 2>"$work/c$R.log"
done

# rebalance: lopsided start, and every static map
m12="$work/m12.gguf"
[ -f "$m12" ] || "$P" mkmodel --arch llama --layers 12 --hidden 128 --heads 4 --kv-heads 2 --ffn 256 --vocab 320 \
  --seed 8 --out "$m12" >/dev/null
[ -d "$work/p12" ] || "$P" mkpages --model "$m12" --count 32 --embed-rows 12 --prompt-tokens 3 --max-new 200 \
  --seed 6 --out "$work/p12" >/dev/null
# (in a pipeline: when the stages take turns, the default on one node, no
# map is faster than another and --rebalance auto stays)
rb=(--model "$m12" --pages "$work/p12/pages.jsonl" --batch 4 --rebalance auto --rebalance-window 32
  --micro-batches pipeline)
# two rounds, each map once per round in turn, so a neighbour's load hits
# all of them alike; each map is judged by its better round
for round in 1 2; do
  rm -f "$work/rb$round.jsonl"
  "${MPIRUN[@]}" "$P" run "${rb[@]}" --out "$work/rb$round.jsonl" --layers 0-0,1-11 >/dev/null 2>"$work/rb$round.log"
  for k in 3 4 5 6 7 8; do
    rm -f "$work/s$k.$round.jsonl"
    "${MPIRUN[@]}" "$P" run "${rb[@]}" --out "$work/s$k.$round.jsonl" --layers "0-$k,$((k + 1))-11" \
      --rebalance-threshold 100000 >/dev/null 2>"$work/s$k.$round.log"
  done
done

python3 - "$work" <<'PY'
import json, re, sys, glob, statistics
w = sys.argv[1]
mpi = json.load(open(f"{w}/mpi.json"))
pt = mpi["points"][-1]
mpi_bps = pt["bytes"] / (pt["one_way_us"] * 1e-6)
ctx = []
for R in (300, 2000, 8000):
    log = open(f"{w}/c{R}.log").read()
    num = r"([\d.]+)"
    b0 = re.search(r"migration \(--migrate-at\) at step (\d+): \S+ -> \S+: \d+ layers, pre-copy started \(action "
                   + num + r" ms, pause " + num + r" ms\)", log)
    mm = re.search(r"migration \(--migrate-at\) at step (\d+): \S+ -> \S+: (\d+) layers, (\d+) streams, (\d+) bytes; "
                   r"copy " + num + r" ms \(export " + num + r", weights " + num + r", transfer\+validate " + num +
                   r"\), switch " + num + r" ms, action " + num + r" ms, pause " + num + r" ms; decode step " + num +
                   r" ms(?:; pre-copy (\d+) bytes over " + num + r" ms \((\d+) micro-batches, (\d+) restarts; sending "
                   + num + r" ms, applying " + num + r" ms of which allocating " + num + r" ms\), at the switch (\d+) bytes)?", log)
    if not mm:
        ctx.append({"rows": R, "error": "no migration in the log"}); continue
    b = int(mm[4])
    copy, exp, wts, xfer, sw, act, pause, stp = (float(mm[i]) for i in range(5, 13))
    e = {"rows": R, "layers_moved": int(mm[2]), "streams": int(mm[3]), "bytes": b, "decode_step_ms": stp}
    if mm[13] is not None and b0:
        pre_b, pre_ms, mbs, resets = int(mm[13]), float(mm[14]), int(mm[15]), int(mm[16])
        send_ms, apply_ms, alloc_ms, fin_b = float(mm[17]), float(mm[18]), float(mm[19]), int(mm[20])
        # allocating the receiver's cache is paid by any move (the
        # stop-the-world path pays it in the pause): the copy path's rate
        # leaves it out, and it is reported beside
        work = max(send_ms, apply_ms - alloc_ms)
        e.update({
            "precopy": True,
            # the two drain points: the first agrees the plan, the second switches
            "begin_action_ms": float(b0[2]), "begin_pause_ms": float(b0[3]),
            "switch_action_ms": act, "switch_pause_ms": pause,
            "begin_pause_over_decode_step": float(b0[3]) / stp if stp else None,
            "switch_pause_over_decode_step": pause / stp if stp else None,
            "switch_action_over_decode_step": act / stp if stp else None,
            "precopy_bytes": pre_b, "switch_bytes": fin_b, "precopy_ms": pre_ms, "precopy_micro_batches": mbs,
            "precopy_restarts": resets, "precopy_send_ms": send_ms, "precopy_apply_ms": apply_ms,
            "precopy_alloc_ms": alloc_ms,
            # pre-copy runs between micro-batches at PRECOPY_BUDGET bytes per call:
            # its elapsed rate is paced by the decode, its working rate is how fast
            # the copy path moves bytes while it runs
            "precopy_elapsed_Bps": pre_b / (pre_ms * 1e-3), "precopy_elapsed_over_mpi": pre_b / (pre_ms * 1e-3) / mpi_bps,
            "precopy_working_Bps": pre_b / (work * 1e-3) if work else None,
            "precopy_working_over_mpi": pre_b / (work * 1e-3) / mpi_bps if work else None})
    else:
        e.update({"precopy": False, "copy_ms": copy, "export_ms": exp, "weights_ms": wts, "transfer_validate_ms": xfer,
                  "switch_ms": sw, "action_ms": act, "pause_ms": pause,
                  "pause_over_decode_step": pause / stp if stp else None,
                  "migration_Bps": b / (copy * 1e-3), "migration_over_mpi": b / (copy * 1e-3) / mpi_bps})
    ctx.append(e)

def windows(path):
    """(map, tokens/s) of every rebalance window in a log"""
    out = []
    for l in open(path):
        mm = re.search(r"rebalance at step (\d+): .*\(map (\S+), ([\d.]+) tokens/s\)", l)
        if mm: out.append((int(mm[1]), mm[2], float(mm[3])))
    return out
def converged(path):
    """(moves, final map, median tokens/s of the windows after the last move)"""
    txt = open(path).read()
    moves = [(int(mm[1]), mm[2]) for mm in re.finditer(r"migration \(rebalance\) at step (\d+): \S+ -> (\S+):", txt)]
    last = moves[-1][0] if moves else 0
    after = [t for s, mp, t in windows(path) if s > last + 64]
    return moves, (moves[-1][1] if moves else "0-0,1-11"), (statistics.median(after) if after else None)
rounds = [converged(f"{w}/rb{r}.log") for r in (1, 2)]
moves, final_map = rounds[0][0], rounds[0][1]
conv_all = [c for _, _, c in rounds if c]
conv = max(conv_all) if conv_all else None
static = {}
for f in sorted(glob.glob(f"{w}/s*.*.log")):
    ws = windows(f)
    if ws:
        med = statistics.median(t for _, _, t in ws[1:] or ws)
        static[ws[0][1]] = max(static.get(ws[0][1], 0), med)
best = max(static, key=static.get) if static else None
print(json.dumps({
    "mpi_one_way_bytes": pt["bytes"], "mpi_Bps": mpi_bps,
    "contexts": ctx,
    "rebalance": {"start": "0-0,1-11", "moves": [{"step": s, "to": mp} for s, mp in moves], "final_map": final_map,
                  "final_maps_both_rounds": [r[1] for r in rounds],
                  "tokens_per_s_after_convergence_median": conv,
                  "static_maps_tokens_per_s_median": static, "best_static_map": best,
                  "converged_over_best_static": conv / static[best] if conv and best else None},
}, indent=1))
PY
