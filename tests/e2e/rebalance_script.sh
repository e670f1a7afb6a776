#!/usr/bin/env bash
# slurm/rebalance (issue 14): steering a running job through its control
# socket by the rule --rebalance auto uses — from a lopsided map 0-0,1-11 it
# migrates to within one layer of the balanced split, prints every decision
# with its numbers, ends when the job does, and the job's out.jsonl is
# byte-identical to a one-rank run.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 12 --hidden 128 --heads 4 --kv-heads 2 --ffn 256 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 40 --embed-rows 12 --prompt-tokens 3 --max-new 200 --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
MPIRUN=(mpirun --oversubscribe --bind-to none)
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/ref.jsonl" --batch 4 --digest >/dev/null 2>&1
best=$("${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/bal.jsonl" --batch 4 2>&1 </dev/null \
  | grep -o "placement: layers [0-9]*-[0-9]*, rank 1" | sed 's/placement: layers \([0-9]*\)-.*/\1/')

S="$T/job.sock"; out="$T/a.jsonl"
( rc=0; timeout 300 "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$out" --batch 4 --digest \
    --layers 0-0,1-11 --control "$S" >"$out.log" 2>&1 </dev/null || rc=$?; echo "$rc" > "$out.rc" ) &
for _ in $(seq 1 3000); do [ -S "$S" ] && break; sleep 0.01; done
rc=0
PIPEDEC="$PD_BUILD/pipedec" timeout 300 "$PD_SRC/slurm/rebalance" "$S" --interval 0.4 --max-moves 2 \
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
rc=0; "$PD_SRC/slurm/rebalance" 2>/dev/null || rc=$?
[ "$rc" -eq 2 ] && pass "slurm/rebalance without a socket: usage, exit 2" || fail "no-argument exit $rc"
finish
