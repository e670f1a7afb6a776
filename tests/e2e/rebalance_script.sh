#!/usr/bin/env bash
# slurm/rebalance (issue 14): steering a running job through its control
# socket by the rule --rebalance auto uses — from a lopsided map 0-0,1-11 it
# migrates to within one layer of the balanced split, prints every decision
# with its numbers, ends when the job does, and the job's out.jsonl is
# byte-identical to a one-rank run. That is in a pipeline; when the stages
# take turns (the default on one node) it stays, saying why.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 12 --hidden 128 --heads 4 --kv-heads 2 --ffn 256 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 160 --embed-rows 12 --prompt-tokens 3 --max-new 200 --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
MPIRUN=(mpirun --oversubscribe --bind-to none)
# the turns run needs only two decisions, so a quarter of the pages; the
# default map depends on the pages' mix of prefill and decode, which every
# page here shares, so 8 of them show it. Output is in manifest order and a
# page's bytes depend on nothing else: the first 40 lines of the reference
# are the reference of the first 40 pages
P40="$T/pages/first40.jsonl"
head -n 40 "$P" > "$P40"
head -n 8 "$P" > "$T/pages/first8.jsonl"
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/ref.jsonl" --batch 4 --digest >/dev/null 2>&1
head -n 40 "$T/ref.jsonl" > "$T/ref40.jsonl"
best=$("${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$T/pages/first8.jsonl" --out "$T/bal.jsonl" --batch 4 \
  --micro-batches pipeline 2>&1 </dev/null \
  | grep -o "placement: layers [0-9]*-[0-9]*, rank 1" | sed 's/placement: layers \([0-9]*\)-.*/\1/')

S="$T/job.sock"; out="$T/a.jsonl"
( rc=0; timeout 300 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$out" --batch 4 --digest \
    --layers 0-0,1-11 --micro-batches pipeline --control "$S" >"$out.log" 2>&1 </dev/null || rc=$?
  echo "$rc" > "$out.rc" ) &
for _ in $(seq 1 3000); do [ -S "$S" ] && break; sleep 0.01; done
rc=0
PIPEDEC="$PD_BUILD/pipedec" timeout 300 "$PD_SRC/slurm/rebalance" "$S" --interval 0.25 --max-moves 2 \
  >"$T/rb.out" 2>"$T/rb.err" || rc=$?
wait
[ "$rc" -eq 0 ] && pass "slurm/rebalance exited 0" || { fail "slurm/rebalance exited $rc"; tail -3 "$T/rb.err"; }
grep -q "rebalance: step [0-9]* map 0-0,1-11 busy CPU s .* gain" "$T/rb.err" \
  && pass "every decision printed with its numbers" || { fail "no decision lines"; head -3 "$T/rb.err"; }
final=$(grep -o "migration (ctl) at step [0-9]*: [0-9,-]* -> [0-9,-]*" "$out.log" | tail -1 | sed 's/.* -> //')
got=${final#*,}; got=${got%%-*}
if [ -n "$final" ] && [ -n "$best" ] && [ $((got - best)) -le 1 ] && [ $((best - got)) -le 1 ]; then
  pass "slurm/rebalance moved 0-0,1-11 to $final, within one layer of the balanced split at layer $best"
else
  fail "slurm/rebalance: final map '${final:-none}', balanced split at '${best:-?}'"; cat "$T/rb.out" | head -5
fi
[ "$(cat "$out.rc")" = 0 ] && pass "the job exited 0" || fail "the job exited $(cat "$out.rc")"
same "$T/ref.jsonl" "$out" "steered by slurm/rebalance: output == one rank"
# the stages taking turns: every decision stays, the job keeps its map
S2="$T/job2.sock"; out2="$T/b.jsonl"
( rc=0; timeout 300 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P40" --out "$out2" --batch 4 --digest \
    --layers 0-0,1-11 --control "$S2" >"$out2.log" 2>&1 </dev/null || rc=$?; echo "$rc" > "$out2.rc" ) &
for _ in $(seq 1 3000); do [ -S "$S2" ] && break; sleep 0.01; done
rc=0
PIPEDEC="$PD_BUILD/pipedec" timeout 300 "$PD_SRC/slurm/rebalance" "$S2" --interval 0.2 \
  >"$T/rb2.out" 2>"$T/rb2.err" || rc=$?
wait
n=$(grep -c "map 0-0,1-11: the stages take turns, so a step costs the sum of their times whatever the layer map" \
  "$T/rb2.err" || true)
if [ "$rc" -eq 0 ] && [ "$n" -ge 2 ] && ! grep -q "migrating\|migration" "$T/rb2.out" "$out2.log"; then
  pass "with turns: slurm/rebalance stayed on 0-0,1-11 ($n decisions say why)"
else
  fail "with turns: exit $rc, $n 'take turns' decisions"; head -3 "$T/rb2.err" "$T/rb2.out"
fi
[ "$(cat "$out2.rc")" = 0 ] && pass "with turns: the job exited 0" || fail "with turns: the job exited $(cat "$out2.rc")"
same "$T/ref40.jsonl" "$out2" "with turns, beside slurm/rebalance: output == one rank"
rc=0; "$PD_SRC/slurm/rebalance" 2>/dev/null || rc=$?
[ "$rc" -eq 2 ] && pass "slurm/rebalance without a socket: usage, exit 2" || fail "no-argument exit $rc"
finish
