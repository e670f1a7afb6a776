#!/usr/bin/env bash
# Pipeline benchmark (issue 5): the same workload on 1 rank x 1 thread and on
# 2 ranks x 1 thread each, in one run; prints one JSON object with the
# throughput ratio (goal >= 1.8) and the per-micro-batch message cost next to
# the MPI one-way latency measured in the same run for that message size.
# usage: bench/pipeline.sh BUILD_DIR [pages] [max_new]
set -euo pipefail
build="${1:?usage: bench/pipeline.sh BUILD_DIR [pages] [max_new]}"
pages="${2:-24}"
max_new="${3:-96}"
bin="$build/pipedec"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export TMPDIR="$tmp" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
"$bin" mkmodel --arch llama --layers 8 --hidden 512 --heads 8 --kv-heads 8 --ffn 1536 --vocab 4096 \
  --seed 5 --out "$tmp/m.gguf" >/dev/null
"$bin" mkpages --model "$tmp/m.gguf" --count "$pages" --embed-rows "${PD_BENCH_EMBED_ROWS:-64}" --prompt-tokens 3 --max-new "$max_new" \
  --seed 5 --out "$tmp/pages" >/dev/null
run() { # run NP OUT STATS
  mpirun -np "$1" --oversubscribe --bind-to none "$bin" run --model "$tmp/m.gguf" --pages "$tmp/pages/pages.jsonl" \
    --out "$2" --batch "${PD_BENCH_BATCH:-16}" --prefill-chunk "${PD_BENCH_CHUNK:-0}" --threads 1 --stats "$3" >/dev/null
}
run 1 "$tmp/o1.jsonl" "$tmp/s1.json"
run 2 "$tmp/o2.jsonl" "$tmp/s2.json"
cmp -s "$tmp/o1.jsonl" "$tmp/o2.jsonl" && same=true || same=false
mpirun -np 2 --bind-to none "$build/bench/bench_mpi_latency" $((8 << 20)) > "$tmp/lat.json"
python3 - "$tmp/s1.json" "$tmp/s2.json" "$tmp/lat.json" "$same" <<'PY'
import json, sys
s1, s2, lat = (json.load(open(p)) for p in sys.argv[1:4])
same = sys.argv[4] == "true"
ratio = s2["tokens_per_s"] / s1["tokens_per_s"]
head = s2["stages"][0]
batches = head["micro_batches"]
bytes_per_batch = head["bytes_sent"] / max(head["messages_sent"], 1)
pts = lat["points"]
# one-way latency at the nearest measured size at or above the message size
lat_us = next((p["one_way_us"] for p in pts if p["bytes"] >= bytes_per_batch), pts[-1]["one_way_us"])
stages = []
for st in s2["stages"]:
    idle = s2["wall_s"] - st["busy_s"]
    stages.append({"rank": st["rank"], "layers": st["layers"], "busy_s": round(st["busy_s"], 3),
                   "wait_input_s": round(st["wait_input_s"], 3), "wait_send_s": round(st["wait_send_s"], 4),
                   "not_busy_per_micro_batch_us": round(idle / max(st["micro_batches"], 1) * 1e6, 1),
                   "send_wait_per_micro_batch_us": round(st["wait_send_s"] / max(st["micro_batches"], 1) * 1e6, 1)})
print(json.dumps({
    "bench": "pipeline", "workload": {"pages": s1["pages_done"], "tokens": s1["tokens"], "batch": s1["batch"]},
    "tokens_per_s_1rank": round(s1["tokens_per_s"], 2), "tokens_per_s_2ranks": round(s2["tokens_per_s"], 2),
    "scaling_ratio": round(ratio, 3), "goal": 1.8, "goal_met": ratio >= 1.8, "outputs_identical": same,
    "micro_batches_2ranks": batches, "message_bytes_per_micro_batch": round(bytes_per_batch),
    "mpi_one_way_latency_us_at_that_size": lat_us, "mpi_one_way_latency_us_8B": pts[0]["one_way_us"],
    "stages_2ranks": stages, "layers_2ranks": s2["layers"]}))
PY
