#!/usr/bin/env bash
# Ranks against threads on one node (issue 17 §1): the same workload decoded by
# 1 rank x T threads and by T ranks x 1 thread (a pipeline of T stages), in
# one interleaved run, on the OCR-shaped dense model that bench/anchor.sh
# builds (llama, 12 layers, hidden 1280, 10 x 128 heads, ffn 6848, vocab
# 32000; f32 and Q8_0), or with --arch deepseek2-ocr on DeepSeek-OCR's MoE
# decoder as anchor.sh --arch deepseek2-ocr builds it (any of mkmodel's
# types), with pages of 277 prefill rows and 64 new tokens.
#
# Configurations per workload (WEIGHT TYPE:STREAMS):
#   threads    mpirun -np 1 pipedec run --threads T
#   ranks      mpirun -np T pipedec run --threads 1        (the default: on one
#              NUMA node the stages take turns, each rank with T threads)
#   ranks_k2   mpirun -np T pipedec run --threads 1 --micro-batches T
#              (a pipeline of T micro-batches in flight, one thread per rank)
# Every configuration runs `reps` times, interleaved, and counts by its
# median. Outputs (with logit digests) must be byte-identical across every
# configuration and repetition of a workload, or the script fails.
# Prints one JSON object: whole-run tokens/s (prefill included, as the issue
# measures), decode-only tokens/s and prefill rows/s from --stats, and the
# ratio ranks / threads (goal >= 0.95, for the default) for each workload.
#
# usage: bench/ranks_threads.sh BUILD_DIR [--reps N] [--threads T] [--work DIR]
#          [--workloads f32:8,f32:32,f32:64,q8_0:8] [--arch llama|deepseek2-ocr] [--gemm G] [--quick]
#   --gemm G:   pipedec's arithmetic in every configuration, invariant (the
#               default) or int8 (`run --gemm int8`); the JSON says which
#   --work DIR: keep models (m.f32.gguf, m.q8_0.gguf: anchor.sh's names, so
#               one --work serves both scripts), pages and outputs in DIR
#   --quick:    a small model and short pages, to check the script end to end
set -euo pipefail
usage="usage: bench/ranks_threads.sh BUILD_DIR [--reps N] [--threads T] [--work DIR] [--workloads LIST] [--arch A] [--gemm G] [--quick]"
build="${1:?$usage}"
shift
reps=3
threads=2
work=""
workloads="f32:8,f32:32,f32:64,q8_0:8"
quick=0
arch=llama
gemm=invariant
while [ $# -gt 0 ]; do
  case "$1" in
    --reps) reps="${2:?$usage}"; shift ;;
    --threads) threads="${2:?$usage}"; shift ;;
    --work) work="${2:?$usage}"; shift ;;
    --workloads) workloads="${2:?$usage}"; shift ;;
    --quick) quick=1 ;;
    --arch) arch="${2:?$usage}"; shift ;;
    --gemm) gemm="${2:?$usage}"; shift ;;
    *) echo "ranks_threads.sh: unknown argument '$1'; $usage" >&2; exit 2 ;;
  esac
  shift
done
case "$gemm" in invariant|int8) ;; *) echo "ranks_threads.sh: --gemm '$gemm': expected invariant or int8" >&2; exit 2 ;; esac
bin="$build/pipedec"
[ -x "$bin" ] || { echo "ranks_threads.sh: $bin is missing: build pipedec first (scripts/build.sh)" >&2; exit 2; }
if [ -z "$work" ]; then
  work="$(mktemp -d)"
  trap 'rm -rf "$work"' EXIT
else
  mkdir -p "$work"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"

# the shapes of bench/anchor.sh, so one --work serves both
case "$arch:$quick" in
  llama:1) shape=(--layers 4 --hidden 128 --heads 2 --kv-heads 2 --ffn 256 --vocab 1024) ;;
  llama:0) shape=(--layers 12 --hidden 1280 --heads 10 --kv-heads 10 --ffn 6848 --vocab 32000) ;;
  deepseek2-ocr:1) shape=(--layers 4 --hidden 128 --heads 2 --kv-heads 2 --ffn 256 --vocab 1024 --dense-layers 1
                          --experts 8 --experts-used 2 --expert-ffn 64 --shared 1) ;;
  deepseek2-ocr:0) shape=(--layers 12 --hidden 1280 --heads 10 --kv-heads 10 --ffn 6848 --vocab 129280
                          --dense-layers 1 --experts 64 --experts-used 6 --expert-ffn 896 --shared 2) ;;
  *) echo "ranks_threads.sh: --arch '$arch': expected llama or deepseek2-ocr" >&2; exit 2 ;;
esac
if [ "$quick" = 1 ]; then prefill=33; new=8; else prefill=277; new=64; fi
for dt in $(echo "$workloads" | tr ',' '\n' | cut -d: -f1 | sort -u); do
  case "$dt" in f32|f16|bf16|q8_0|q4_0|q5_0|q4_k|q5_k|q6_k) ;;
    *) echo "ranks_threads.sh: --workloads: '$dt' is not a type mkmodel writes" >&2; exit 2 ;; esac
  [ -s "$work/m.$dt.gguf" ] || "$bin" mkmodel --arch "$arch" "${shape[@]}" --ctx 4096 --dtype "$dt" --seed 17 \
    --out "$work/m.$dt.gguf" >/dev/null
done
m0="$(ls "$work"/m.*.gguf | head -1)"
[ -s "$work/rt-pages/pages.jsonl" ] || "$bin" mkpages --model "$m0" --count 64 --embed-rows 0 \
  --prompt-tokens $((prefill - 1)) --max-new "$new" --seed 17 --out "$work/rt-pages" >/dev/null

python3 - "$bin" "$work" "$reps" "$threads" "$workloads" "$gemm" <<'PY'
import json, os, statistics, subprocess, sys

bin_, work, reps, T, workloads, gemm = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
loads = []
for w in workloads.split(","):
    dt, n = w.split(":")
    loads.append((dt, int(n)))
lines = open(f"{work}/rt-pages/pages.jsonl").read().splitlines(keepends=True)
for _, n in loads:
    if n > len(lines):
        sys.exit(f"ranks_threads.sh: workload of {n} streams, but only {len(lines)} pages")
    open(f"{work}/rt-pages/n{n}.jsonl", "w").writelines(lines[:n])
configs = {"threads": (1, T, []), "ranks": (T, 1, []), "ranks_k2": (T, 1, ["--micro-batches", str(T)])}
runs = {(l, c): [] for l in loads for c in configs}
ref = {}

def run(load, cname, rep):
    dt, n = load
    np_, th, extra = configs[cname]
    tag = f"rt.{dt}.{n}.{cname}.{rep}"
    out, stats = f"{work}/{tag}.jsonl", f"{work}/{tag}.stats"
    if os.path.exists(out):
        os.remove(out)  # a rerun would skip pages already written
    cmd = ["mpirun", "-np", str(np_), "--bind-to", "none", bin_, "run", "--model", f"{work}/m.{dt}.gguf",
           "--pages", f"{work}/rt-pages/n{n}.jsonl", "--out", out, "--batch", str(n), "--threads", str(th),
           "--digest", "--stats", stats, "--gemm", gemm] + extra
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=open(f"{work}/{tag}.err", "w"))
    if r.returncode != 0:
        sys.exit(f"ranks_threads.sh: {' '.join(cmd)} failed (exit {r.returncode}); see {work}/{tag}.err")
    body = open(out, "rb").read()
    if ref.setdefault(load, body) != body:
        sys.exit(f"ranks_threads.sh: {tag}: output differs from the first run of {dt}:{n}")
    s = json.load(open(stats))
    runs[(load, cname)].append({"tokens_per_s": s["tokens_per_s"], "decode_tokens_per_s": s["decode"]["tokens_per_s"],
                                "prefill_rows_per_s": s["prefill"]["rows_per_s"],
                                "micro_batches": s["stages"][0]["micro_batches"],
                                "micro_batches_in_flight": s["micro_batches_in_flight"],
                                "threads_per_rank": s["threads_per_rank"]})
    print(f"ranks_threads.sh: rep {rep + 1}/{reps} {dt}:{n} {cname}: {s['tokens_per_s']:.1f} tok/s "
          f"(decode {s['decode']['tokens_per_s']:.1f})", file=sys.stderr)

for rep in range(reps):
    for load in loads:
        for cname in configs:
            run(load, cname, rep)

med = lambda xs: statistics.median(xs)
res = {"bench": "ranks_threads", "threads": T, "reps": reps, "pipedec_gemm": gemm,
       "loadavg_1m_at_end": os.getloadavg()[0], "outputs_identical": True, "goal": 0.95, "workloads": {}}
for load in loads:
    d = {}
    for cname in configs:
        rs = runs[(load, cname)]
        d[cname] = {k: round(med([x[k] for x in rs]), 1) for k in rs[0]}
        d[cname]["tokens_per_s_spread"] = [round(min(x["tokens_per_s"] for x in rs), 1),
                                           round(max(x["tokens_per_s"] for x in rs), 1)]
    t = d["threads"]
    for cname in ("ranks", "ranks_k2"):
        d[f"ratio_{cname}_over_threads"] = round(d[cname]["tokens_per_s"] / t["tokens_per_s"], 3)
        d[f"ratio_{cname}_over_threads_decode"] = round(d[cname]["decode_tokens_per_s"] / t["decode_tokens_per_s"], 3)
        d[f"ratio_{cname}_over_threads_prefill"] = round(d[cname]["prefill_rows_per_s"] / t["prefill_rows_per_s"], 3)
    d["goal_met"] = d["ratio_ranks_over_threads"] >= 0.95  # the default, as a user runs it
    res["workloads"][f"{load[0]}:{load[1]}"] = d
res["goal_met"] = all(v["goal_met"] for v in res["workloads"].values())
print(json.dumps(res, indent=2))
PY
