#!/usr/bin/env bash
# Message overhead over TCP against shared memory (issue 15): the same
# 2-rank pipeline run (a) with both ranks in one network namespace over
# Open MPI's shared-memory transport (btl vader) and (b) across two network
# namespaces joined by a veth pair over TCP (btl tcp; tests/netns/lib.bash
# sets them up, tests/netns/ns-agent launches the second "host"). Prints one
# JSON object: MPI one-way latency at 8 B and at the pipeline's message size
# on both transports (bench_mpi_latency, same run), and per micro-batch the
# wall time, the head's wait for results and the extra time TCP costs. Each
# pipeline configuration runs `reps` times, interleaved; medians count; the
# outputs must be byte-identical. A veth is the kernel's TCP stack without a
# wire: a real network adds its own latency on top (see "note").
# usage: bench/tcp.sh BUILD_DIR [reps]      (needs root: network namespaces)
set -euo pipefail
build="$(cd "${1:?usage: bench/tcp.sh BUILD_DIR [reps]}" && pwd)"
reps="${2:-3}"
src="$(cd "$(dirname "$0")/.." && pwd)"
bin="$build/pipedec"
source "$src/tests/netns/lib.bash"
netns_need_root "$@"
tmp="$(mktemp -d)"
chmod 755 "$tmp"
trap 'netns_down; rm -rf "$tmp"' EXIT
NS_DIR="$tmp"
netns_up
export TMPDIR="$tmp" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
MPIRUN_SHM=(ip netns exec "$NS_A" mpirun --allow-run-as-root -np 2 --bind-to none --mca pml ob1 --mca btl self,vader)

"$bin" mkmodel --arch llama --layers 8 --hidden 512 --heads 8 --kv-heads 8 --ffn 1536 --vocab 4096 \
  --seed 5 --out "$tmp/m.gguf" >/dev/null
"$bin" mkpages --model "$tmp/m.gguf" --count 32 --embed-rows 32 --prompt-tokens 3 --max-new 48 --mixed \
  --seed 5 --out "$tmp/pages" >/dev/null
"${MPIRUN_SHM[@]}" "$build/bench/bench_mpi_latency" $((1 << 20)) > "$tmp/lat.shm.json"
"${MPIRUN_TCP[@]}" "$build/bench/bench_mpi_latency" $((1 << 20)) > "$tmp/lat.tcp.json"
for r in $(seq 1 "$reps"); do
  for t in shm tcp; do
    if [ "$t" = shm ]; then launch=("${MPIRUN_SHM[@]}"); else launch=("${MPIRUN_TCP[@]}"); fi
    "${launch[@]}" "$bin" run --model "$tmp/m.gguf" --pages "$tmp/pages/pages.jsonl" --out "$tmp/$t.$r.jsonl" \
      --digest --batch 24 --prefill-chunk 32 --no-bind --stats "$tmp/$t.$r.stats" >/dev/null 2>"$tmp/$t.$r.log" \
      || { echo "bench/tcp.sh: the $t run failed:" >&2; cat "$tmp/$t.$r.log" >&2; exit 1; }
  done
done

python3 - "$tmp" "$reps" <<'PY'
import json, statistics, sys
tmp, reps = sys.argv[1], int(sys.argv[2])
lat = {t: json.load(open(f"{tmp}/lat.{t}.json"))["points"] for t in ("shm", "tcp")}
outs = {open(f"{tmp}/{t}.{r}.jsonl", "rb").read() for t in ("shm", "tcp") for r in range(1, reps + 1)}
res = {}
for t in ("shm", "tcp"):
    runs = [json.load(open(f"{tmp}/{t}.{r}.stats")) for r in range(1, reps + 1)]
    runs.sort(key=lambda s: s["wall_s"])
    s = runs[len(runs) // 2]
    head, tail = s["stages"][0], s["stages"][-1]
    mb = max(head["micro_batches"], 1)
    res[t] = {"wall_s_median": round(s["wall_s"], 4),
              "wall_s_spread": [round(runs[0]["wall_s"], 4), round(runs[-1]["wall_s"], 4)],
              "tokens_per_s": round(s["tokens_per_s"], 1), "micro_batches": head["micro_batches"],
              "wall_per_micro_batch_us": round(s["wall_s"] / mb * 1e6, 1),
              "head_wait_input_per_micro_batch_us": round(head["wait_input_s"] / mb * 1e6, 1),
              "head_busy_per_micro_batch_us": round(head["busy_s"] / mb * 1e6, 1),
              "tail_wait_input_per_micro_batch_us": round(tail["wait_input_s"] / mb * 1e6, 1),
              "messages_sent_head": head["messages_sent"], "bytes_sent_head": head["bytes_sent"]}
bytes_per_msg = res["tcp"]["bytes_sent_head"] / max(res["tcp"]["messages_sent_head"], 1)
def at(points, n):
    return next((p["one_way_us"] for p in points if p["bytes"] >= n), points[-1]["one_way_us"])
one_way = {t: {"8B": lat[t][0]["one_way_us"], "at_message_size": at(lat[t], bytes_per_msg)} for t in lat}
extra_wall = res["tcp"]["wall_per_micro_batch_us"] - res["shm"]["wall_per_micro_batch_us"]
print(json.dumps({
    "bench": "tcp_vs_shm",
    "workload": {"model": "llama 8 layers hidden 512", "pages": 32, "batch": 24, "prefill_chunk": 32, "reps": reps},
    "message_bytes_per_micro_batch": round(bytes_per_msg),
    "mpi_one_way_latency_us": one_way,
    "tcp_extra_one_way_latency_us_at_message_size": round(one_way["tcp"]["at_message_size"] - one_way["shm"]["at_message_size"], 2),
    "pipeline": res,
    "tcp_extra_wall_per_micro_batch_us": round(extra_wall, 1),
    "tcp_extra_share_of_shm_wall_per_micro_batch": round(extra_wall / res["shm"]["wall_per_micro_batch_us"], 4),
    "tcp_extra_latency_share_of_micro_batch": round((one_way["tcp"]["at_message_size"] - one_way["shm"]["at_message_size"])
                                                    / res["shm"]["wall_per_micro_batch_us"], 5),
    # the pipeline walls differ by less than their own run-to-run spread when the latency share is small
    "wall_difference_within_spread": min(res["tcp"]["wall_s_spread"][1], res["shm"]["wall_s_spread"][1])
                                     >= max(res["tcp"]["wall_s_spread"][0], res["shm"]["wall_s_spread"][0]),
    "outputs_identical": len(outs) == 1,
    "note": "both hosts are namespaces of one 2-core machine: TCP here is the kernel stack over a veth, no wire"}))
PY
