#!/usr/bin/env bash
# The MPI pipeline (issue 5): out.jsonl, logit digests included, is
# byte-identical to the one-rank run for N = 1..4 ranks and three layer maps
# per N (balanced, lopsided, one layer on a rank) plus the automatic map, with
# f32 hidden states on the wire; with --wire-dtype f16 identical across N.
# Many streams (more than N x batch) with mixed prefill lengths and
# max_new_tokens. Negative controls (issue 9): f16 vs f32 on the wire and
# OpenBLAS at batch 1 vs 5 change the digests; --trace-hidden traces of two
# rank counts are identical and scripts/trace_diff.py names the first layer
# where f16 departs. Error paths end every rank promptly with a message naming
# the cause.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 6 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 \
  --seed 21 --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 14 --embed-rows 10 --prompt-tokens 3 --max-new 16 --seed 9 \
  --mixed --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
MPIRUN=(mpirun --oversubscribe --bind-to none)

prun() { # prun N OUT extra-args...
  local n="$1" out="$2"; shift 2
  timeout 300 "${MPIRUN[@]}" -np "$n" "$PIPEDEC" run --model "$m" --pages "$P" --out "$out" --batch 3 --digest "$@" \
    >>"$T/run.log" 2>&1 || { fail "mpirun -np $n $* exited non-zero"; tail -5 "$T/run.log"; }
}

"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/ref.jsonl" --batch 3 --digest --trace-hidden "$T/ref.trace" \
  >/dev/null 2>&1
[ "$(wc -l < "$T/ref.jsonl")" -eq 14 ] && pass "one-rank reference: 14 pages" || fail "one-rank reference"
prun 1 "$T/np1.jsonl"
same "$T/ref.jsonl" "$T/np1.jsonl" "np 1 under mpirun == one rank"
# f16 on the wire rounds the residual stream at every layer boundary, so the
# answer cannot depend on where the rank boundaries fall
prun 1 "$T/np1.f16.jsonl" --wire-dtype f16 --trace-hidden "$T/f16.trace"
differ "$T/ref.jsonl" "$T/np1.f16.jsonl" "control: --wire-dtype f16 vs f32"
# OpenBLAS is not batch invariant: on this very workload its digests move with
# the batch, so the identity checks above would see such a dependence
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/blas1.jsonl" --batch 1 --digest --gemm openblas >/dev/null 2>&1
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/blas5.jsonl" --batch 5 --digest --gemm openblas >/dev/null 2>&1
differ "$T/blas1.jsonl" "$T/blas5.jsonl" "control: --gemm openblas batch 1 vs 5"

# ranks on CPUs of different ISAs agree on the kernels every rank has (the
# minimum): here rank 1 is capped at the portable kernels, so both run them,
# with the same bytes out
timeout 300 "${MPIRUN[@]}" -np 1 -x PD_ISA=avx512 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/isa.jsonl" \
  --batch 3 --digest : -np 1 -x PD_ISA=scalar "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/isa.jsonl" \
  --batch 3 --digest >"$T/isa.log" 2>&1 || fail "mixed-ISA run exited non-zero"
grep -q "kernels scalar on every rank" "$T/isa.log" \
  && pass "np 2, rank 1 capped at PD_ISA=scalar: the ranks agree on scalar kernels" \
  || { fail "mixed-ISA run: no agreement on scalar kernels"; grep -o "kernels [a-z0-9]* on every rank" "$T/isa.log"; }
same "$T/ref.jsonl" "$T/isa.jsonl" "np 2, mixed ISAs == one rank"

declare -A MAPS=(
  [2]="0-2,3-5 0-4,5 0,1-5"
  [3]="0-1,2-3,4-5 0-3,4,5 0,1,2-5"
  [4]="0-1,2,3,4-5 0-2,3,4,5 0,1,2,3-5"
)
for n in 2 3 4; do
  # on one node the stages take turns by default; --micro-batches pipeline
  # keeps the pipeline with its default K
  prun "$n" "$T/np$n.auto.jsonl" --stats "$T/np$n.stats.json"
  same "$T/ref.jsonl" "$T/np$n.auto.jsonl" "np $n, balanced map, stages taking turns == one rank"
  prun "$n" "$T/np$n.pipe.jsonl" --micro-batches pipeline --stats "$T/np$n.pipe.json"
  same "$T/ref.jsonl" "$T/np$n.pipe.jsonl" "np $n, balanced map, pipeline == one rank"
  # --stats says how it ran: turns with one micro-batch in flight and the
  # node's threads on every rank (at most one per CPU: these ranks are
  # oversubscribed beyond 2), the pipeline with one thread and K > 1
  got=$(python3 -c 'import json,sys
for f in sys.argv[1:]:
    s = json.load(open(f)); print(s["turns"], s["micro_batches_in_flight"], s["threads_per_rank"], end=" ")' \
    "$T/np$n.stats.json" "$T/np$n.pipe.json")
  want="True 1 $(( n < $(nproc) ? n : $(nproc) )) False"
  [[ "$got" == "$want "* ]] && [[ "$got" == *" 1 " ]] \
    && pass "np $n: stats say turns, 1 in flight, threads; then a pipeline of one thread: $got" \
    || fail "np $n: stats: want '$want ... 1', got '$got'"
  for map in ${MAPS[$n]}; do
    prun "$n" "$T/np$n.$map.jsonl" --layers "$map"
    same "$T/ref.jsonl" "$T/np$n.$map.jsonl" "np $n, --layers $map == one rank"
  done
  prun "$n" "$T/np$n.f16.jsonl" --wire-dtype f16 --prefill-chunk 4
  same "$T/np1.f16.jsonl" "$T/np$n.f16.jsonl" "np $n, f16 wire == f16 wire on one rank"
  # micro-batches in flight: one, as many as ranks, more than ranks + 1
  for k in 1 "$n" $((n + 3)); do
    prun "$n" "$T/np$n.k$k.jsonl" --micro-batches "$k" --prefill-chunk 8 --stats "$T/np$n.k$k.stats"
    same "$T/ref.jsonl" "$T/np$n.k$k.jsonl" "np $n, --micro-batches $k == one rank"
  done
  # the flag took effect: more micro-batches in flight, each with fewer
  # streams, means more micro-batches formed for the same pages
  mbs=$(python3 -c 'import json,sys; print(*[json.load(open(f))["stages"][0]["micro_batches"] for f in sys.argv[1:]])' \
    "$T/np$n.k1.stats" "$T/np$n.k$((n + 3)).stats")
  read -r m1 mk <<<"$mbs"
  [ "$m1" -lt "$mk" ] && pass "np $n: --micro-batches 1 formed $m1 micro-batches, $((n + 3)) formed $mk" \
    || fail "np $n: --micro-batches had no effect ($m1 vs $mk micro-batches)"
done

# the default micro-batch count and prefill chunk, as the start-up line
# states them: ranks sharing one NUMA node take turns, one micro-batch in
# flight, each rank with the node's threads (here 2 ranks x 1 thread: 2
# each; 3 oversubscribed ranks: at most one per CPU), whole prefill as one
# rank; in a pipeline, on a model whose weights dominate a step, 2 streams
# on 2 ranks take K = 2 (a third micro-batch would be a third pass over the
# weights for the same rows), 64 streams K = 3, and prefill comes in 64-row
# chunks; --draft-async keeps the pipeline; the flags override both
mw="$T/mw.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 2 --hidden 512 --heads 8 --kv-heads 8 --ffn 1536 --vocab 512 \
  --seed 3 --out "$mw" >/dev/null
"$PIPEDEC" mkpages --model "$mw" --count 1 --embed-rows 0 --prompt-tokens 3 --max-new 2 --seed 3 \
  --out "$T/mwp" >/dev/null
# startline NP OUT args...: the run's first line; the run's output is read
# to its end (closing the pipe after one line could kill it with SIGPIPE)
startline() {
  local n="$1" out="$2" all; shift 2
  all=$(timeout 120 "${MPIRUN[@]}" -np "$n" "$PIPEDEC" run --model "$mw" --pages "$T/mwp/pages.jsonl" --out "$out" \
    "$@" 2>/dev/null) || true
  printf '%s\n' "${all%%$'\n'*}"
}
ncpu=$(nproc)
for c in "2|--batch 2|1 micro-batch in flight (the stages take turns, 2 threads each), prefill chunk 1024" \
         "2|--batch 2 --micro-batches pipeline|2 micro-batches in flight, prefill chunk 64" \
         "2|--batch 64 --micro-batches pipeline|3 micro-batches in flight, prefill chunk 64" \
         "2|--batch 2 --draft ngram --draft-async|2 micro-batches in flight, prefill chunk 64" \
         "2|--batch 2 --micro-batches turns --threads 2|1 micro-batch in flight (the stages take turns, $(( ncpu < 4 ? (ncpu > 2 ? ncpu : 2) : 4 )) threads each), prefill chunk 1024" \
         "2|--batch 2 --micro-batches 5 --prefill-chunk 8|5 micro-batches in flight, prefill chunk 8" \
         "1|--batch 2|1 micro-batch in flight, prefill chunk 1024"; do
  IFS='|' read -r n args want <<<"$c"
  # shellcheck disable=SC2086
  line=$(startline "$n" "$T/mw.$n.$RANDOM.jsonl" $args)
  grep -q ", $want" <<<"$line" && pass "np $n $args: $want" || fail "np $n $args: want '$want' in '$line'"
done

# the default layer map is balanced for the manifest's mix of prefill and
# decode: on a model whose output projection outweighs its layers (vocab
# 4096, hidden 64), a decode-heavy manifest leaves the last rank one layer,
# a prefill-heavy one (logits for one row a page) splits the layers evenly;
# the start-up line names the mix; both decode as one rank does
mt="$T/mt.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 4096 \
  --seed 5 --out "$mt" >/dev/null
for c in "pre|200|1|0-1,2-3 (balanced for a mean page of 201 prefill rows and 1 new token)" \
         "dec|3|120|0-2,3-3 (balanced for a mean page of 4 prefill rows and 120 new tokens)"; do
  IFS='|' read -r tag prompt new want <<<"$c"
  "$PIPEDEC" mkpages --model "$mt" --count 4 --embed-rows 0 --prompt-tokens "$prompt" --max-new "$new" --seed 4 \
    --out "$T/mt.$tag" >/dev/null
  "$PIPEDEC" run --model "$mt" --pages "$T/mt.$tag/pages.jsonl" --out "$T/mt.$tag.ref" --batch 4 --digest \
    >/dev/null 2>&1
  line=$(timeout 120 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$mt" --pages "$T/mt.$tag/pages.jsonl" \
    --out "$T/mt.$tag.np2" --batch 4 --digest 2>/dev/null) || fail "mix $tag: the 2-rank run failed"
  line="${line%%$'\n'*}"
  grep -qF "layers $want" <<<"$line" && pass "mix $tag: default map $want" || fail "mix $tag: want 'layers $want' in '$line'"
  same "$T/mt.$tag.ref" "$T/mt.$tag.np2" "mix $tag: default map == one rank"
done

# hidden-state traces: merged over ranks, identical to one rank at every
# layer boundary; against f16 the first difference is layer 0's output
prun 3 "$T/np3.trace.jsonl" --layers 0-1,2-3,4-5 --batch 5 --trace-hidden "$T/np3.trace"
out=$(python3 "$PD_SRC/scripts/trace_diff.py" "$T/ref.trace" "$T/np3.trace" 2>&1) && rc=0 || rc=$?
if [ "$rc" -eq 0 ] && grep -q "identical" <<<"$out" && [ -s "$T/np3.trace.2" ]; then
  pass "trace: 3 ranks == 1 rank at every layer boundary"
else
  fail "trace: 3 ranks vs 1 rank (exit $rc)"; echo "$out" | head -5
fi
out=$(python3 "$PD_SRC/scripts/trace_diff.py" "$T/ref.trace" "$T/f16.trace" 2>&1) && rc=0 || rc=$?
if [ "$rc" -eq 1 ] && grep -q "first difference: page p00000, position 0, boundary 1 " <<<"$out"; then
  pass "trace: f16 first departs at layer 0's output"
else
  fail "trace: f16 vs f32 (exit $rc)"; echo "$out" | head -5
fi
rm -f "$T/np3.trace.2"
out=$(python3 "$PD_SRC/scripts/trace_diff.py" "$T/ref.trace" "$T/np3.trace" 2>&1) && rc=0 || rc=$?
[ "$rc" -eq 2 ] && grep -q "np3.trace.2" <<<"$out" && pass "trace: a missing rank part is an error naming it" \
  || { fail "trace: missing part (exit $rc)"; echo "$out" | head -3; }
if python3 -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['ranks']==4 and len(s['stages'])==4 and all('busy_s' in x and 'placement' in x for x in s['stages'])" "$T/np4.stats.json"; then
  pass "stats JSON has every stage with timings and placement"
else
  fail "stats JSON"
fi

# errors: every rank ends promptly, non-zero, with the cause named
printf '{"id":"bad","prefill":[{"tokens":[1,99999]}],"max_new_tokens":3}\n' > "$T/pages/bad.jsonl"
expect_fail "malformed page found on the head" 'bad.jsonl:1: page "bad"' \
  "${MPIRUN[@]}" -np 3 "$PIPEDEC" run --model "$m" --pages "$T/pages/bad.jsonl" --out "$T/e1.jsonl"
expect_fail "model file missing on one rank" "rank 1: .*gone.gguf" \
  "${MPIRUN[@]}" -np 1 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/e2.jsonl" : \
  -np 1 "$PIPEDEC" run --model "$T/gone.gguf" --pages "$P" --out "$T/e2.jsonl"
# MPMD launches: every rank must run the same model and options (issue 11)
"$PIPEDEC" mkmodel --arch llama --layers 6 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 \
  --seed 22 --out "$T/other.gguf" >/dev/null
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 \
  --seed 21 --out "$T/four.gguf" >/dev/null
expect_fail "other weights on rank 1" "rank 1 does not run what rank 0 runs: the model file's fingerprint.*other.gguf" \
  "${MPIRUN[@]}" -np 1 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/e5.jsonl" : \
  -np 1 "$PIPEDEC" run --model "$T/other.gguf" --pages "$P" --out "$T/e5.jsonl"
expect_fail "6 vs 4 layers" "rank 2 does not run what rank 0 runs: the layer count is 4 on rank 2 but 6" \
  "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/e6.jsonl" : \
  -np 1 "$PIPEDEC" run --model "$T/four.gguf" --pages "$P" --out "$T/e6.jsonl"
expect_fail "--attn differs on rank 1" "rank 1 does not run what rank 0 runs: --attn/--kv/--evict" \
  "${MPIRUN[@]}" -np 1 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/e7.jsonl" : \
  -np 1 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/e7.jsonl" --attn rswa:8
expect_fail "--seed differs on rank 2" "rank 2 does not run what rank 0 runs: --seed is 5 on rank 2 but 0" \
  "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/e8.jsonl" : \
  -np 1 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/e8.jsonl" --seed 5
for f in e5 e6 e7 e8; do [ ! -s "$T/$f.jsonl" ] || fail "$f: output written despite the mismatch"; done
expect_fail "impossible layer map" "gap|not assigned" \
  "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/e3.jsonl" --layers 0-2,4-5
expect_fail "more ranks than layers" "fewer than" \
  "${MPIRUN[@]}" -np 7 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/e4.jsonl"
[ ! -s "$T/e1.jsonl" ] && pass "no output written on start-up failure" || fail "output written despite failure"

# a rank dying mid-run ends the job within seconds, never a hang
"$PIPEDEC" mkpages --model "$m" --count 40 --embed-rows 10 --prompt-tokens 3 --max-new 2000 --seed 3 \
  --out "$T/long" >/dev/null
( "${MPIRUN[@]}" -np 3 "$PIPEDEC" run --model "$m" --pages "$T/long/pages.jsonl" --out "$T/long.jsonl" \
    --batch 2 >"$T/kill.out" 2>"$T/kill.err" && echo 0 > "$T/kill.rc" || echo $? > "$T/kill.rc" ) &
victim=""
for _ in $(seq 1 100); do
  for pid in $(pgrep -f "pipedec run --model $m --pages $T/long" || true); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then victim=$pid; fi
  done
  [ -n "$victim" ] && break
  sleep 0.1
done
if [ -z "$victim" ]; then
  fail "could not find rank 1 to kill"
else
  sleep 1
  kill -9 "$victim"
  for _ in $(seq 1 300); do [ -f "$T/kill.rc" ] && break; sleep 0.1; done
  if [ ! -f "$T/kill.rc" ]; then
    fail "job still running 30 s after rank 1 died"
    pkill -9 -f "pipedec run --model $m --pages $T/long" || true
  elif [ "$(cat "$T/kill.rc")" -ne 0 ]; then
    pass "rank 1 killed: job ended with exit $(cat "$T/kill.rc")"
  else
    fail "rank 1 killed but the job exited 0"
  fi
fi
wait || true

# a rank stopped with SIGSTOP: the others back off instead of spinning, and
# the stall watchdog ends the job naming the stopped stage
( "${MPIRUN[@]}" -np 3 "$PIPEDEC" run --model "$m" --pages "$T/long/pages.jsonl" --out "$T/stall.jsonl" \
    --batch 2 --stall-timeout 4 >"$T/stall.out" 2>"$T/stall.err" && echo 0 > "$T/stall.rc" || echo $? > "$T/stall.rc" ) &
victim=""; waiter=""
for _ in $(seq 1 100); do
  for pid in $(pgrep -f "pipedec run --model $m --pages $T/long/pages.jsonl --out $T/stall" || true); do
    r=$(tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p')
    [ "$r" = 1 ] && victim=$pid
    [ "$r" = 2 ] && waiter=$pid
  done
  [ -n "$victim" ] && [ -n "$waiter" ] && break
  sleep 0.1
done
if [ -z "$victim" ] || [ -z "$waiter" ]; then
  fail "could not find ranks 1 and 2 to stop"
else
  sleep 1
  kill -STOP "$victim"
  sleep 0.5
  t0=$(awk '{print $14 + $15}' "/proc/$waiter/stat")
  sleep 2
  t1=$(awk '{print $14 + $15}' "/proc/$waiter/stat" 2>/dev/null || echo "$t0")
  ticks=$((t1 - t0)); hz=$(getconf CLK_TCK)
  # 2 s of waiting: at most 5 % of a core (spinning would be ~100 %)
  [ "$ticks" -le $((hz / 10)) ] && pass "waiting rank used $ticks ticks of $((2 * hz)) while its peer was stopped" \
    || fail "waiting rank spun: $ticks ticks of $((2 * hz)) in 2 s"
  for _ in $(seq 1 300); do [ -f "$T/stall.rc" ] && break; sleep 0.1; done
  if [ ! -f "$T/stall.rc" ]; then
    fail "job still running 30 s after rank 1 stopped"
    kill -CONT "$victim" 2>/dev/null || true
    pkill -9 -f "pipedec run --model $m --pages $T/long/pages.jsonl --out $T/stall" || true
  elif [ "$(cat "$T/stall.rc")" -ne 0 ] && grep -q "rank 2, waiting for rank 1 (the previous stage): no progress for 4 s" "$T/stall.err"; then
    pass "stopped rank 1: the stall watchdog ended the job naming it (exit $(cat "$T/stall.rc"))"
  else
    fail "stall: exit $(cat "$T/stall.rc"), stderr:"; head -5 "$T/stall.err"
  fi
  kill -CONT "$victim" 2>/dev/null || true
fi
wait || true
finish
