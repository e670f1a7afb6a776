#!/usr/bin/env bash
# Pipeline benchmark (issue 5): one workload decoded on 1 rank x 1 thread and
# on 2 ranks x 1 thread each, in one run; prints one JSON object with the
# throughput ratio (goal >= 1.8) and the per-micro-batch message cost next to
# the MPI one-way latency measured in the same run for that message size.
#
# The workload is fixed: a llama model of 8 layers (hidden 512), 96 OCR-like
# pages with mixed lengths (33-64 embedding rows + 4 tokens of prefill, 49-96
# new tokens), prefill chunks of 32 rows. Only --batch (page-streams in
# flight) varies: a pipeline of N stages keeps N+1 micro-batches in flight,
# each with a share of the streams, so it needs more streams in flight than
# one rank for the same micro-batch shape. Each rank count is run at three
# batch sizes and judged by its best; the ratios at equal batch and at equal
# micro-batch shape are printed too. Every configuration runs `reps` times,
# interleaved, and counts by its median; every output must be byte-identical.
# The limit measured in the same run: two independent one-rank jobs at once,
# each on half of the pages, give the throughput two cores reach with no
# pipeline at all (they share caches and memory bandwidth as the two stages
# do); the 2-rank pipeline is also reported as a fraction of that. The 2-rank
# runs ask for a pipeline (--micro-batches pipeline): on one node the default
# would have the stages take turns with two threads each.
# usage: bench/pipeline.sh BUILD_DIR [reps]
set -euo pipefail
build="${1:?usage: bench/pipeline.sh BUILD_DIR [reps]}"
reps="${2:-3}"
bin="$build/pipedec"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export TMPDIR="$tmp" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
"$bin" mkmodel --arch llama --layers 8 --hidden 512 --heads 8 --kv-heads 8 --ffn 1536 --vocab 4096 \
  --seed 5 --out "$tmp/m.gguf" >/dev/null
"$bin" mkpages --model "$tmp/m.gguf" --count 96 --embed-rows 64 --prompt-tokens 3 --max-new 96 --mixed \
  --seed 5 --out "$tmp/pages" >/dev/null
mpirun -np 2 --bind-to none "$build/bench/bench_mpi_latency" $((8 << 20)) > "$tmp/lat.json"

python3 - "$bin" "$tmp" "$reps" <<'PY'
import json, os, statistics, subprocess, sys

bin_, tmp, reps = sys.argv[1], sys.argv[2], int(sys.argv[3])
configs = [(1, 16), (1, 32), (1, 48), (2, 16), (2, 48), (2, 96)]
runs = {c: [] for c in configs}
reference = None
same = True
# the two-core limit: two independent one-rank jobs at once, each on half of
# the pages (shared caches and memory bandwidth included)
lines = open(f"{tmp}/pages/pages.jsonl").read().splitlines(keepends=True)
for half in (0, 1):
    open(f"{tmp}/pages/half{half}.jsonl", "w").writelines(lines[half::2])
parallel = []

def run_parallel(r):
    procs = []
    for half in (0, 1):
        procs.append(subprocess.Popen(
            ["mpirun", "-np", "1", "--bind-to", "none", bin_, "run", "--model", f"{tmp}/m.gguf",
             "--pages", f"{tmp}/pages/half{half}.jsonl", "--out", f"{tmp}/par{half}-{r}.jsonl", "--batch", "16",
             "--prefill-chunk", "32", "--threads", "1", "--stats", f"{tmp}/par{half}.json"],
            stdout=subprocess.DEVNULL))
    for p in procs:
        if p.wait() != 0:
            raise SystemExit("parallel one-rank run failed")
    st = [json.load(open(f"{tmp}/par{half}.json")) for half in (0, 1)]
    parallel.append(sum(x["tokens"] for x in st) / max(x["wall_s"] for x in st))

for r in range(reps):
    run_parallel(r)
    for np_, batch in configs:
        out, stats = f"{tmp}/o-{np_}-{batch}-{r}.jsonl", f"{tmp}/s.json"
        subprocess.run(["mpirun", "-np", str(np_), "--oversubscribe", "--bind-to", "none", bin_, "run",
                        "--model", f"{tmp}/m.gguf", "--pages", f"{tmp}/pages/pages.jsonl", "--out", out,
                        "--batch", str(batch), "--prefill-chunk", "32", "--threads", "1", "--stats", stats]
                       + (["--micro-batches", "pipeline"] if np_ > 1 else []),
                       check=True, stdout=subprocess.DEVNULL)
        body = open(out, "rb").read()
        os.remove(out)
        if reference is None:
            reference = body
        same = same and body == reference
        runs[(np_, batch)].append(json.load(open(stats)))

def median_run(c):
    rs = sorted(runs[c], key=lambda s: s["tokens_per_s"])
    return rs[len(rs) // 2]

med = {c: median_run(c)["tokens_per_s"] for c in configs}
best1 = max((c for c in configs if c[0] == 1), key=lambda c: med[c])
best2 = max((c for c in configs if c[0] == 2), key=lambda c: med[c])
ratio = med[best2] / med[best1]

s2 = median_run(best2)
head = s2["stages"][0]
bytes_per_batch = head["bytes_sent"] / max(head["messages_sent"], 1)
lat = json.load(open(f"{tmp}/lat.json"))["points"]
lat_us = next((p["one_way_us"] for p in lat if p["bytes"] >= bytes_per_batch), lat[-1]["one_way_us"])
stages = []
for st in s2["stages"]:
    mb = max(st["micro_batches"], 1)
    stages.append({"rank": st["rank"], "layers": st["layers"], "busy_s": round(st["busy_s"], 3),
                   "wait_input_s": round(st["wait_input_s"], 3), "wait_send_s": round(st["wait_send_s"], 4),
                   "busy_share": round(st["busy_s"] / s2["wall_s"], 3),
                   "busy_per_micro_batch_us": round(st["busy_s"] / mb * 1e6, 1),
                   "wait_send_per_micro_batch_us": round(st["wait_send_s"] / mb * 1e6, 2)})
print(json.dumps({
    "bench": "pipeline",
    "workload": {"pages": s2["pages_done"], "tokens": s2["tokens"], "prefill_chunk": 32, "reps": reps},
    "tokens_per_s_median": {f"{n}rank_batch{b}": round(med[(n, b)], 1) for n, b in configs},
    "tokens_per_s_spread": {f"{n}rank_batch{b}": [round(min(x["tokens_per_s"] for x in runs[(n, b)]), 1),
                                                 round(max(x["tokens_per_s"] for x in runs[(n, b)]), 1)]
                            for n, b in configs},
    "best_1rank": {"batch": best1[1], "tokens_per_s": round(med[best1], 1)},
    "best_2ranks": {"batch": best2[1], "tokens_per_s": round(med[best2], 1)},
    "scaling_ratio": round(ratio, 3), "goal": 1.8, "goal_met": ratio >= 1.8,
    "tokens_per_s_two_independent_1rank_jobs": round(statistics.median(parallel), 1),
    "tokens_per_s_two_independent_1rank_jobs_spread": [round(min(parallel), 1), round(max(parallel), 1)],
    "pipeline_efficiency_vs_two_independent_jobs": round(med[best2] / statistics.median(parallel), 3),
    "ratio_same_batch_16": round(med[(2, 16)] / med[(1, 16)], 3),
    "ratio_same_batch_48": round(med[(2, 48)] / med[(1, 48)], 3),
    "ratio_same_micro_batch_shape": round(med[(2, 48)] / med[(1, 16)], 3),
    "outputs_identical": same,
    "micro_batches_2ranks": head["micro_batches"], "message_bytes_per_micro_batch": round(bytes_per_batch),
    "mpi_one_way_latency_us_at_that_size": lat_us, "mpi_one_way_latency_us_8B": lat[0]["one_way_us"],
    "message_latency_share_of_busy_per_micro_batch": round(lat_us / stages[0]["busy_per_micro_batch_us"], 4),
    "stages_2ranks": stages, "layers_2ranks": s2["layers"]}))
PY
