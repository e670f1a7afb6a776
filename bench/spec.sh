#!/usr/bin/env bash
# Speculation benchmark (issue 12). Prints one JSON object:
#   ngram          tokens per pass and acceptance of n-gram drafting on pages
#                  whose output repeats (a model made with mkmodel --repeat:
#                  greedy text cycles, as OCR tables and repeated headers do)
#   one_stream     one stream on 2 ranks: tokens/s with n-gram drafting and
#                  --draft-async against without (goal >= 2.5), and with
#                  synchronous drafting, to show what async adds
#   never_right    32 streams with a draft model that is never right (same
#                  vocabulary, other weights): throughput with speculation
#                  against without (goal >= 0.95, adaptive K)
# Each figure is the median of RUNS runs (default 3), ratios of runs made in
# this same invocation. usage: bench/spec.sh BUILD_DIR [WORK_DIR]
set -euo pipefail
build="${1:?usage: bench/spec.sh BUILD_DIR [WORK_DIR]}"
work="${2:-$(mktemp -d "${TMPDIR:-/tmp}/pd-bench-spec.XXXXXX")}"
runs="${RUNS:-3}"
P="$build/pipedec"
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPIRUN=(mpirun --oversubscribe --bind-to none -np 2)

r="$work/r.gguf"      # the target: greedy text cycles through 24 tokens
d="$work/d.gguf"      # a draft of the same vocabulary that is never right
[ -f "$r" ] || "$P" mkmodel --arch llama --layers 8 --hidden 512 --heads 8 --kv-heads 8 --ffn 1536 --vocab 1024 \
  --seed 5 --repeat 24 --out "$r" >/dev/null
[ -f "$d" ] || "$P" mkmodel --arch llama --layers 1 --hidden 64 --heads 2 --kv-heads 2 --ffn 96 --vocab 1024 \
  --seed 77 --out "$d" >/dev/null
[ -d "$work/p8" ] || "$P" mkpages --model "$r" --count 8 --embed-rows 64 --prompt-tokens 3 --max-new 256 --seed 4 \
  --out "$work/p8" >/dev/null
[ -d "$work/p1" ] || "$P" mkpages --model "$r" --count 1 --embed-rows 64 --prompt-tokens 3 --max-new 512 --seed 9 \
  --out "$work/p1" >/dev/null
[ -d "$work/p32" ] || "$P" mkpages --model "$r" --count 64 --embed-rows 32 --prompt-tokens 3 --max-new 96 --seed 11 \
  --out "$work/p32" >/dev/null

# run TAG PAGES [launcher...] -- flags: one decode, its stats in $work/TAG.stats
run() {
  local tag="$1" pages="$2"; shift 2
  local pre=()
  while [ "$1" != "--" ]; do pre+=("$1"); shift; done
  shift
  rm -f "$work/$tag.jsonl"
  "${pre[@]}" "$P" run --model "$r" --pages "$pages" --out "$work/$tag.jsonl" --digest --stats "$work/$tag.stats" "$@" \
    >/dev/null 2>"$work/$tag.log" </dev/null
}
tps() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['tokens_per_s'])" "$work/$1.stats"; }
median() { python3 -c "import sys, statistics; print(statistics.median(float(x) for x in sys.argv[1:]))" "$@"; }
same_out() { cmp -s "$work/$1.jsonl" "$work/$2.jsonl" || { echo "bench/spec.sh: $1 and $2 differ" >&2; exit 1; }; }

# 1. n-gram drafting on repetitive pages, 8 streams, one rank
run ng "$work/p8/pages.jsonl" -- --batch 8 --draft ngram:3:4
run ng0 "$work/p8/pages.jsonl" -- --batch 8
same_out ng ng0
ngram=$(python3 -c "
import json, sys
s = json.load(open(sys.argv[1])); sp = s['spec']
print(json.dumps({'drafted': sp['drafted'], 'accepted': sp['accepted'], 'passes': sp['passes'],
                  'acceptance': round(sp['accepted'] / max(sp['drafted'], 1), 3),
                  'tokens_per_pass': round((sp['accepted'] + sp['passes']) / max(sp['passes'], 1), 3)}))" "$work/ng.stats")

# 2. one stream on 2 ranks, with and without n-gram drafting
on=(); off=(); sync=()
for _ in $(seq 1 "$runs"); do
  run one1 "$work/p1/pages.jsonl" "${MPIRUN[@]}" -- --batch 1 --draft ngram:3:8 --draft-async; on+=("$(tps one1)")
  run ones "$work/p1/pages.jsonl" "${MPIRUN[@]}" -- --batch 1 --draft ngram:3:8; sync+=("$(tps ones)")
  run one0 "$work/p1/pages.jsonl" "${MPIRUN[@]}" -- --batch 1; off+=("$(tps one0)")
  same_out one1 one0
  same_out ones one0
done
one_on=$(median "${on[@]}"); one_off=$(median "${off[@]}"); one_sync=$(median "${sync[@]}")
one_acc=$(python3 -c "import json,sys; sp=json.load(open(sys.argv[1]))['spec']; print(round(sp['accepted']/max(sp['drafted'],1),3))" "$work/one1.stats")

# 3. 32 streams, a draft model that is never right
on=(); off=()
for _ in $(seq 1 "$runs"); do
  run nr1 "$work/p32/pages.jsonl" -- --batch 32 --draft "model:$d"; on+=("$(tps nr1)")
  run nr0 "$work/p32/pages.jsonl" -- --batch 32; off+=("$(tps nr0)")
  same_out nr1 nr0
done
nr_on=$(median "${on[@]}"); nr_off=$(median "${off[@]}")
nr_acc=$(python3 -c "import json,sys; sp=json.load(open(sys.argv[1]))['spec']; print(sp['drafted'], sp['accepted'])" "$work/nr1.stats")

python3 - "$ngram" "$one_on" "$one_off" "$one_acc" "$nr_on" "$nr_off" "$nr_acc" "$one_sync" <<'PY'
import json, sys
ngram = json.loads(sys.argv[1])
one_on, one_off, one_acc, nr_on, nr_off = map(float, sys.argv[2:7])
nr_drafted, nr_accepted = map(int, sys.argv[7].split())
one_sync = float(sys.argv[8])
print(json.dumps({
    "bench": "spec",
    "ngram_repetitive_pages": ngram,
    "one_stream_2_ranks": {"tokens_per_s_async": one_on, "tokens_per_s_sync": one_sync,
                           "tokens_per_s_plain": one_off, "acceptance": one_acc,
                           "ratio_async": round(one_on / one_off, 3), "ratio_sync": round(one_sync / one_off, 3),
                           "goal": 2.5},
    "never_right_32_streams": {"tokens_per_s_spec": nr_on, "tokens_per_s_plain": nr_off,
                               "drafted": nr_drafted, "accepted": nr_accepted,
                               "ratio": round(nr_on / nr_off, 3), "goal": 0.95},
}, indent=1))
PY
