#!/usr/bin/env bash
# Live layer migration (issue 14): layers move between running ranks at
# drain points (--migrate-at STEP:MAP, a testing aid) — single layers both
# ways, whole new maps, several per run, on 2..4 ranks, for every --attn,
# --kv and --evict mode and with speculation (--draft ngram, --draft-async,
# --draft model:) — and out.jsonl, digests
# included, stays byte-identical to a one-rank run. Full attention
# pre-copies its rows while decoding goes on (the switch sends only the rows
# since); bounded caches move whole at the switch. Forced aborts (a corrupted
# chunk or bundle, a bundle cut half way, unreadable weights, a receiver
# over --mem-limit) keep the old map and the same bytes, and a run may end during a pre-copy. The
# giving rank frees the weights it gave; --weights-over-mpi takes them from
# the giving rank. --rebalance auto moves a lopsided map to within one layer
# of the balanced one and leaves a balanced map alone, in a pipeline; when
# the stages take turns it moves nothing (the map does not change the step).
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 8 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 12 --embed-rows 12 --prompt-tokens 3 --max-new 60 --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
"$PIPEDEC" mkmodel --arch llama --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 9 \
  --out "$T/d.gguf" >/dev/null   # a draft model for --draft model:
MPIRUN=(mpirun --oversubscribe --bind-to none)

# schedules per rank count: single layers both ways, whole new maps
sched() {
  case "$1" in
    2) echo "--layers 0-3,4-7 --migrate-at 3:0-4,5-7 --migrate-at 15:0-3,4-7 --migrate-at 30:0,1-7 --migrate-at 60:0-6,7" ;;
    3) echo "--layers 0-2,3-5,6-7 --migrate-at 5:0-1,2-5,6-7 --migrate-at 20:0-1,2-6,7 --migrate-at 40:0,1,2-7 --migrate-at 70:0-5,6,7" ;;
    4) echo "--layers 0-1,2-3,4-5,6-7 --migrate-at 4:0-2,3,4-5,6-7 --migrate-at 25:0,1-5,6,7 --migrate-at 55:0-1,2-3,4-5,6-7" ;;
  esac
}

# run_mig TAG N POLICY...: the migrating run; its log in TAG.log
run_mig() {
  local tag="$1" n="$2"; shift 2
  # shellcheck disable=SC2046
  timeout 120 "${MPIRUN[@]}" -np "$n" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/$tag.out" --batch 3 --digest \
    $(sched "$n") "$@" >"$T/$tag.log" 2>&1 </dev/null
}

i=0
for pol in "" "--attn rswa:8" "--attn window:8" "--kv q8" "--kv q8k" "--kv q8v" "--evict recent:16" \
           "--evict importance:16:2" "--draft ngram" "--draft ngram:1:6 --attn rswa:8" "--draft ngram --draft-async" \
           "--draft model:$T/d.gguf" "--attn rswa:8 --kv q8" "--draft ngram:1:6 --attn rswa:8 --kv q8k" \
           "--draft ngram:1:6 --evict importance:16:2" "--draft ngram:1:6 --evict recent:16" \
           "--draft ngram:1:6 --draft-async --evict importance:16:2"; do
  tag=$(printf "%s" "p$i${pol//$T\//}" | tr -c "a-zA-Z0-9-" "_")
  # shellcheck disable=SC2086
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/$tag.ref" --batch 3 --digest $pol >/dev/null 2>&1
  n=$((2 + i % 3))
  # every other policy migrates in a pipeline; the rest with the stages
  # taking turns (the default on one node)
  [ $((i % 2)) -eq 1 ] && pol="$pol --micro-batches pipeline"
  # shellcheck disable=SC2086
  if run_mig "$tag" "$n" $pol; then
    k=$(grep -c "^pipedec: migration (--migrate-at) at step .* -> .* streams, .* bytes;" "$T/$tag.log" || true)
    want=$(sched "$n" | grep -o -- --migrate-at | wc -l)
    [ "$k" -eq "$want" ] && pass "${pol:-default}: $k migrations on $n ranks" \
      || { fail "${pol:-default}: $k of $want migrations happened on $n ranks"; grep -i migrat "$T/$tag.log" | head -3; }
    same "$T/$tag.ref" "$T/$tag.out" "${pol:-default}: migrated on $n ranks == one rank"
  else
    fail "${pol:-default}: the migrating run on $n ranks failed"; tail -3 "$T/$tag.log"
  fi
  i=$((i + 1))
done
# the negative control of the identity checks: another cache policy's
# output differs, so the comparisons above could see a difference
differ "$T/p0.ref" "$T/p3--kv_q8.ref" "negative control: --kv q8 differs from f32"

# forced aborts: the job goes on with the old map and the same bytes
abort_case() { # abort_case TAG REF PATTERN ARGS...
  local tag="$1" ref="$2" pat="$3"; shift 3
  if timeout 120 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/$tag.out" --batch 3 \
       --digest --layers 0-3,4-7 "$@" >"$T/$tag.log" 2>&1 </dev/null; then
    if grep -q "refused, the map stays 0-3,4-7: .*$pat" "$T/$tag.log" && ! grep -q " streams, .* bytes;" "$T/$tag.log"
    then
      pass "$tag: refused ($(grep -o "refused.*" "$T/$tag.log" | head -1 | cut -c1-150))"
    else
      fail "$tag: no refusal matching /$pat/"; grep -i migrat "$T/$tag.log" | head -3
    fi
  else
    fail "$tag: the job failed"; tail -3 "$T/$tag.log"
  fi
  same "$ref" "$T/$tag.out" "$tag: old map kept, output == one rank"
}
# full attention pre-copies (a chunk fails its CRC during the pre-copy, the
# weights fail to load in its first step); a ring moves whole at the switch
# (a bundle entry fails its CRC)
abort_case corrupt "$T/p0.ref" "pre-copy message 0 from rank 1: kv chunk: CRC32C .* the bytes give" \
  --migrate-at 10:0-4,5-7 --migrate-fault corrupt
abort_case corrupt-ring "$T/p1--attn_rswa_8.ref" "bundle: offset [0-9]*: entry .* crc" --attn rswa:8 \
  --migrate-at 10:0-4,5-7 --migrate-fault corrupt
# a transfer cut half way through a ring's bundle: the receiver decoded the
# records that arrived whole into copies held aside, then finds the rest
# missing; it installs none of them (the map stays, the same bytes)
abort_case cut-ring "$T/p1--attn_rswa_8.ref" "bundle: offset [0-9]*: [0-9]* of the [0-9]* announced bytes arrived" \
  --attn rswa:8 --migrate-at 10:0-4,5-7 --migrate-fault cut
abort_case weights "$T/p0.ref" "weights of layers 4-4 are not readable" --migrate-at 10:0-4,5-7 --migrate-fault weights
abort_case memlimit "$T/p0.ref" "more than its --mem-limit" --migrate-at 10:0-6,7 --mem-limit 400K
abort_case corrupt-weights "$T/p0.ref" "weights piece 0 of layer 4 from rank 1 .*CRC32C" --weights-over-mpi \
  --migrate-at 10:0-4,5-7 --migrate-fault corrupt

# the same cut on 3 ranks, where rank 1 takes layers 4-5 that do not meet
# its 2-3 (copies for the switch) and rank 0 takes 2-3 next to its own
# (installed before the vote, removed again): nothing of either stays
if timeout 120 "${MPIRUN[@]}" -np 3 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/cut3.out" --batch 3 \
     --digest --attn rswa:8 --layers 0-1,2-3,4-7 --migrate-at 10:0-3,4-5,6-7 --migrate-fault cut \
     >"$T/cut3.log" 2>&1 </dev/null; then
  grep -q "refused, the map stays 0-1,2-3,4-7: .*announced bytes arrived" "$T/cut3.log" \
    && ! grep -q " streams, .* bytes;" "$T/cut3.log" \
    && pass "cut on 3 ranks: refused ($(grep -o "refused.*" "$T/cut3.log" | head -1 | cut -c1-150))" \
    || { fail "cut on 3 ranks: no refusal naming the missing bytes"; grep -i migrat "$T/cut3.log" | head -3; }
else
  fail "cut on 3 ranks: the job failed"; tail -3 "$T/cut3.log"
fi
same "$T/p1--attn_rswa_8.ref" "$T/cut3.out" "cut on 3 ranks: old map kept, output == one rank"

# --weights-over-mpi: the taking rank gets the weights from the giving rank
# (at the pre-copy's first drain point, or in the stop-the-world copy)
for wc in "p0:" "p1--attn_rswa_8:--attn rswa:8"; do
  ref="${wc%%:*}"; pol="${wc#*:}"
  # shellcheck disable=SC2086
  if run_mig "wmpi$ref" 3 --weights-over-mpi $pol && grep -q "weights over MPI [0-9]* bytes" "$T/wmpi$ref.log"; then
    pass "--weights-over-mpi ${pol:-default}: $(grep -c "weights over MPI" "$T/wmpi$ref.log") migrations took weights over MPI"
  else
    fail "--weights-over-mpi ${pol:-default}"; grep -i "migrat\|error" "$T/wmpi$ref.log" | head -3
  fi
  same "$T/$ref.ref" "$T/wmpi$ref.out" "--weights-over-mpi ${pol:-default}: migrated on 3 ranks == one rank"
done

# pre-copy (full attention): the rows travel while decoding goes on and
# the switch sends only the rows since the last chunks
line=$(grep -m1 "^pipedec: migration (--migrate-at) .* streams, .* bytes;.*pre-copy" "$T/p0.log" || true)
pre=$(sed -n 's/.*pre-copy \([0-9]*\) bytes.*/\1/p' <<<"$line"); fin=$(sed -n 's/.*at the switch \([0-9]*\) bytes.*/\1/p' <<<"$line")
[ -n "$pre" ] && [ -n "$fin" ] && [ "$pre" -gt 0 ] && [ "$fin" -lt "$pre" ] \
  && pass "pre-copy: $pre bytes while decoding, $fin at the switch" \
  || { fail "pre-copy: no pre-copied bytes in '$line'"; }
fr=$(sed -n 's/.*givers freed \([0-9]*\) bytes of weights.*/\1/p' <<<"$line")
[ -n "$fr" ] && [ "$fr" -gt 0 ] && pass "the giving rank freed the weights it gave ($fr bytes)" \
  || fail "the giving rank kept the weights it gave: '$line'"
grep -q "pre-copy" "$T/p1--attn_rswa_8.log" && fail "a ring pre-copied (its state is bounded)" \
  || pass "rswa moves whole at the switch (no pre-copy)"
# a run that ends while a pre-copy runs: every rank sends and takes its end
# marks at teardown, exit 0, same bytes
timeout 120 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/mb.out" --batch 3 --digest \
  --layers 0-3,4-7 --stats "$T/mb.json" >/dev/null 2>&1 </dev/null
mb=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["stages"][0]["micro_batches"])' "$T/mb.json")
rc=0
timeout 120 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/end.out" --batch 3 --digest \
  --layers 0-3,4-7 --migrate-at "$((mb - 3)):0-4,5-7" >"$T/end.log" 2>&1 </dev/null || rc=$?
if [ "$rc" -eq 0 ] && grep -q "pre-copy started" "$T/end.log" && ! grep -q " streams, .* bytes;" "$T/end.log"; then
  pass "a run that ends during a pre-copy (started at step $((mb - 3)) of $mb) exits 0"
else
  fail "a run that ends during a pre-copy: exit $rc"; grep -i "migrat\|error" "$T/end.log" | head -3
fi
same "$T/p0.ref" "$T/end.out" "a run that ends during a pre-copy == one rank"

# bad schedules are start-up errors
rc=0; timeout 60 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/bad.out" --migrate-at 5:0-3 \
  >/dev/null 2>"$T/badmap.err" </dev/null || rc=$?
[ "$rc" -ne 0 ] && grep -q -- "--migrate-at 5:0-3: .*" "$T/badmap.err" && pass "--migrate-at with a bad map (exit $rc)" \
  || { fail "--migrate-at with a bad map: exit $rc"; head -3 "$T/badmap.err"; }
expect_fail "--migrate-at without a map" "--migrate-at '7': expected STEP:MAP" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/bad.out" --migrate-at 7
expect_fail "--migrate-fault unknown" "--migrate-fault 'x'" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/bad.out" --migrate-fault x
[ ! -e "$T/bad.out" ] && pass "refused runs wrote no output" || fail "a refused run wrote $T/bad.out"

# --rebalance auto: from 0-0,1-11 to within one layer of the balanced map
m12="$T/m12.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 12 --hidden 128 --heads 4 --kv-heads 2 --ffn 256 --vocab 320 --seed 8 \
  --out "$m12" >/dev/null
"$PIPEDEC" mkpages --model "$m12" --count 16 --embed-rows 12 --prompt-tokens 3 --max-new 160 --seed 6 \
  --out "$T/p12" >/dev/null
P12="$T/p12/pages.jsonl"
"$PIPEDEC" run --model "$m12" --pages "$P12" --out "$T/rb.ref" --batch 4 --digest >/dev/null 2>&1
timeout 120 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m12" --pages "$P12" --out "$T/rb.out" --batch 4 --digest \
  --layers 0-0,1-11 --rebalance auto --rebalance-window 64 --micro-batches pipeline >"$T/rb.log" 2>&1 </dev/null \
  || fail "rebalance run failed"
# switches LOG: the rebalancer's completed moves, "OLD -> NEW" a line (a move
# with a pre-copy also logs its start, "pre-copy started", which is skipped)
switches() {
  grep -v "pre-copy started" "$1" | grep -o "migration (rebalance) at step [0-9]*: [0-9,-]* -> [0-9,-]*" \
    | sed 's/.*: //' || true
}
final=$(switches "$T/rb.log" | tail -1 | sed 's/.* -> //')
# the balanced split the cost model predicts (the default map's first layer of rank 1)
best=$(timeout 120 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m12" --pages "$P12" --out "$T/rb0.out" --batch 4 \
  --micro-batches pipeline 2>&1 </dev/null | grep -o "placement: layers [0-9-]*, rank 1" | grep -o "[0-9]*-" | head -1 | tr -d -)
got=${final#*,}; got=${got%%-*}
if [ -n "$final" ] && [ -n "$best" ] && [ $((got - best)) -le 1 ] && [ $((best - got)) -le 1 ]; then
  pass "rebalance: 0-0,1-11 moved to $final, within one layer of the balanced split at layer $best"
else
  fail "rebalance: final map '${final:-none}', balanced split at layer '${best:-?}'"; grep rebalance "$T/rb.log" | head -5
fi
grep -q "rebalance at step .*busy CPU s per stage .* predicts bottleneck .* gain" "$T/rb.log" \
  && pass "rebalance: every decision is logged with its numbers" || fail "rebalance: no decision logged"
same "$T/rb.ref" "$T/rb.out" "rebalance: output == one rank"
# throughput: the pipeline's bound is its slowest stage: the slowest stage's
# CPU seconds per step in the windows on the lopsided map against those after
# the last move (window tokens/s printed too)
tput=$(python3 - "$T/rb.log" <<'PY'
import re, statistics, sys
txt = open(sys.argv[1]).read()
pat = (r"rebalance at step \d+: busy CPU s per stage ([\d.,]+) over (\d+) steps "
       r"\(map (\S+), ([\d.]+) tokens/s\)")
w = [(m[3], max(float(x) for x in m[1].split(",")) / int(m[2]), float(m[4])) for m in re.finditer(pat, txt)]
moves = re.findall(r"migration \(rebalance\) at step \d+: \S+ -> (\S+):", txt)
before = [x for x in w if x[0] == "0-0,1-11"]
after = [x for x in w if moves and x[0] == moves[-1]][1:]
if not before or not after:
    print("0 0 0 0")
    sys.exit()
print(f"{statistics.median(b for _, b, _ in before) * 1e6:.0f} {statistics.median(b for _, b, _ in after) * 1e6:.0f} "
      f"{statistics.median(t for _, _, t in before):.0f} {statistics.median(t for _, _, t in after):.0f}")
PY
)
read -r cb ca tb ta <<<"$tput"
# reported, not judged: a test holds no speed threshold (a loaded CI machine
# moved this from 511 -> 310 to 434 -> 373 us); bench/migrate.sh measures the
# gain of rebalancing against the best static map
echo "# rebalance: the slowest stage's CPU time per step $cb -> $ca us (window tokens/s $tb -> $ta; 0: no window after the move)"
# on the map the first run settled on, the job stays settled: windows of 128
# steps, a move needs two windows in a row and both together to pass the
# 15 % threshold. That map came from measurements on the lopsided map, so
# this run may still confirm one move by one layer (under the sanitizers
# beside other suites the head's share of a step differs: a CI run moved
# 0-5,6-11 to 0-4,5-11 once); more moves, or a move back, is a rebalancer
# that chases noise
timeout 120 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m12" --pages "$P12" --out "$T/rb2.out" --batch 4 --digest \
  --layers "${final:-0-5,6-11}" --rebalance auto --rebalance-window 128 --micro-batches pipeline >"$T/rb2.log" 2>&1 \
  </dev/null \
  || fail "rebalance run on a balanced map failed"
moves2=$(switches "$T/rb2.log")
n_moves2=$(grep -c . <<<"$moves2" || true)
n_dec2=$(grep -c 'rebalance at step' "$T/rb2.log" || true)
if [ "$n_moves2" -eq 0 ]; then
  pass "rebalance: no move on the settled map ${final:-0-5,6-11} ($n_dec2 decisions: staying)"
elif [ "$n_moves2" -eq 1 ] && moved_by=$(python3 -c 'import sys
a, b = (int(m.split(",")[1].split("-")[0]) for m in sys.argv[1].split(" -> "))
print(abs(a - b)); sys.exit(abs(a - b) != 1)' "$moves2"); then
  pass "rebalance: the settled map moved once, by $moved_by layer ($moves2), then stayed ($n_dec2 decisions)"
else
  fail "rebalance: the settled map moved $n_moves2 times"; grep "migration (rebalance)" "$T/rb2.log" | head -3
fi
same "$T/rb.ref" "$T/rb2.out" "rebalance on a balanced map: output == one rank"
# taking turns (the default here), the lopsided map stays, and says why
timeout 120 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m12" --pages "$P12" --out "$T/rb3.out" --batch 4 --digest \
  --layers 0-0,1-11 --rebalance auto --rebalance-window 64 >"$T/rb3.log" 2>&1 </dev/null \
  || fail "rebalance run with turns failed"
n_turns=$(grep -c "rebalance at step [0-9]*: the stages take turns, so a step costs the sum of their times whatever the layer map: staying" "$T/rb3.log" || true)
if [ "$n_turns" -ge 2 ] && ! grep -q "migration (rebalance)" "$T/rb3.log"; then
  pass "rebalance with turns: 0-0,1-11 stays ($n_turns decisions say why)"
else
  fail "rebalance with turns: $n_turns 'take turns' decisions"; grep "rebalance\|migration" "$T/rb3.log" | head -3
fi
same "$T/rb.ref" "$T/rb3.out" "rebalance with turns: output == one rank"
finish
