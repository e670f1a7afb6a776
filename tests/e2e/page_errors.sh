#!/usr/bin/env bash
# A page whose input goes bad mid-run fails by itself (issue 10): its .npy is
# truncated while the job runs; the job goes on and exits 0, that page gets an
# {"id", "error"} line naming the file, every other line is byte-identical
# (digests included) to a clean run, and a rerun with the file repaired
# retries exactly that page. On one rank and on a 2-rank pipeline.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 128 --heads 4 --kv-heads 2 --ffn 192 --vocab 320 \
  --seed 8 --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 30 --embed-rows 12 --prompt-tokens 3 --max-new 400 --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
bad="$T/pages/p00029.npy"   # the last page: admitted long after the first line is out
cp "$bad" "$T/good.npy"
MPIRUN=(mpirun --oversubscribe --bind-to none)

"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/clean.jsonl" --batch 1 --digest >/dev/null 2>&1
[ "$(wc -l < "$T/clean.jsonl")" -eq 30 ] && pass "clean reference: 30 pages" || fail "clean reference"

for np in 1 2; do
  out="$T/np$np.jsonl"
  cp "$T/good.npy" "$bad"
  cmd=("$PIPEDEC" run --model "$m" --pages "$P" --out "$out" --batch 1 --digest)
  [ "$np" -gt 1 ] && cmd=("${MPIRUN[@]}" -np "$np" "${cmd[@]}")
  ( "${cmd[@]}" >"$T/np$np.log" 2>&1 </dev/null; echo $? > "$T/np$np.rc" ) &
  for _ in $(seq 1 3000); do [ -s "$out" ] && break; sleep 0.01; done
  if [ ! -s "$out" ]; then fail "np $np: no first line within 30 s"; wait; continue; fi
  head -c 100 "$T/good.npy" > "$bad"   # the file changes under the running job
  wait
  rc=$(cat "$T/np$np.rc")
  [ "$rc" -eq 0 ] && pass "np $np: job went on and exited 0" || { fail "np $np: exit $rc"; tail -3 "$T/np$np.log"; }
  if python3 - "$out" "$T/clean.jsonl" <<'PY'
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
ref = {json.loads(l)["id"]: l for l in open(sys.argv[2])}
lines = open(sys.argv[1]).read().splitlines(True)
errs = [g for g in got if "error" in g]
assert len(got) == 30, len(got)
assert [g["id"] for g in errs] == ["p00029"], errs
assert "p00029.npy" in errs[0]["error"] and set(errs[0]) == {"id", "error"}, errs[0]
for l, g in zip(lines, got):
    if "error" not in g:
        assert l == ref[g["id"]], g["id"]   # byte-identical, digest included
PY
  then pass "np $np: one error line naming the file, every other line byte-identical"; else fail "np $np: output"; fi
  grep -q 'p00029.*failed and was skipped' "$T/np$np.log" && grep -q '1 FAILED' "$T/np$np.log" \
    && pass "np $np: the failure is reported on stderr and in the summary" || fail "np $np: failure not reported"
  cp "$T/good.npy" "$bad"
  "${cmd[@]}" >/dev/null 2>&1 </dev/null
  if [ "$(wc -l < "$out")" -eq 31 ] && [ "$(tail -n 1 "$out")" = "$(grep '"p00029"' "$T/clean.jsonl")" ]; then
    pass "np $np: a rerun retries only the failed page, its line as in a clean run"
  else
    fail "np $np: rerun"; tail -n 2 "$out" | cut -c1-200
  fi
done
finish
