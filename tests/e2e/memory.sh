#!/usr/bin/env bash
# The admission memory budget (issue 11): a page whose caches cannot fit even
# alone fails by itself with a line naming its size and the budget, and the
# job goes on; pages that fit wait for memory instead of overcommitting, with
# every output line (digests included) byte-identical to an unlimited run and
# the caches' real peak under the budget; on 1 and 2 ranks.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --ctx 300000 \
  --seed 4 --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 12 --embed-rows 12 --prompt-tokens 3 --max-new 16 --seed 3 --mixed \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
# the same pages with a huge one in the middle: 200,000 prompt tokens
python3 - "$P" "$T/pages/huge.jsonl" <<'PY'
import json, sys
lines = open(sys.argv[1]).read().splitlines()
huge = {"id": "huge", "prefill": [{"tokens": [1] + [7 + i % 300 for i in range(199999)]}], "max_new_tokens": 4}
lines.insert(5, json.dumps(huge))
open(sys.argv[2], "w").write("\n".join(lines) + "\n")
PY
MPIRUN=(mpirun --oversubscribe --bind-to none)
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/ref.jsonl" --batch 8 --digest --mem-limit none >/dev/null 2>&1

for np in 1 2; do
  pre=(); [ "$np" -gt 1 ] && pre=("${MPIRUN[@]}" -np "$np")
  # 1. the huge page needs ~100 MB on one rank: it fails alone, the rest decode
  rc=0
  "${pre[@]}" "$PIPEDEC" run --model "$m" --pages "$T/pages/huge.jsonl" --out "$T/huge$np.jsonl" --batch 8 --digest \
    --mem-limit 8M >/dev/null 2>"$T/huge$np.err" || rc=$?
  [ "$rc" -eq 4 ] && pass "np $np: job goes on past a page that cannot fit (exit 4: a page failed)" \
    || fail "np $np: exit $rc with a page that cannot fit"
  if python3 - "$T/huge$np.jsonl" "$T/ref.jsonl" <<'PY'
import json, sys
got = open(sys.argv[1]).read().splitlines(True)
ref = open(sys.argv[2]).read().splitlines(True)
err = [json.loads(l) for l in got if '"error"' in l]
assert len(err) == 1 and err[0]["id"] == "huge", err
e = err[0]["error"]
assert "200000 prefill rows + max_new_tokens 4 need" in e and "budget of 8388608 bytes" in e and "--mem-limit" in e, e
assert [l for l in got if '"error"' not in l] == ref
PY
  then pass "np $np: the huge page's line names its size and the budget; the others are byte-identical"
  else fail "np $np: huge page output"; head -c 300 "$T/huge$np.jsonl"; fi

  # 2. a budget of about two streams: pages wait, nothing changes, the peak holds
  "${pre[@]}" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/tight$np.jsonl" --batch 8 --digest --mem-limit 64K \
    --stats "$T/tight$np.stats" >/dev/null 2>&1
  same "$T/ref.jsonl" "$T/tight$np.jsonl" "np $np: --mem-limit 64K (about two streams at once) == unlimited"
  if python3 - "$T/tight$np.stats" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for st in s["stages"]:
    lim = st["mem_limit_bytes"]
    assert lim == 65536, st
    assert 0 < st["cache_reserved_peak"] <= lim, st
    assert 0 < st["cache_bytes_peak"] <= st["cache_reserved_peak"], st   # the prediction bounds reality
    print(f"    rank {st['rank']}: cache peak {st['cache_bytes_peak']:.0f} <= reserved {st['cache_reserved_peak']:.0f} <= limit {lim}")
PY
  then pass "np $np: real cache peak <= reserved peak <= the budget"; else fail "np $np: budget stats"; fi
done

# every cache kind: the reservation bounds the real allocation
for pol in "--kv q8" "--kv q8k" "--attn rswa:8" "--attn window:8" "--evict importance:16:2"; do
  tag=$(echo "$pol" | tr -c 'a-z0-9' '_')
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/u$tag.jsonl" --batch 8 --digest --mem-limit none $pol >/dev/null 2>&1
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/t$tag.jsonl" --batch 8 --digest --mem-limit 64K $pol \
    --stats "$T/t$tag.stats" >/dev/null 2>&1
  same "$T/u$tag.jsonl" "$T/t$tag.jsonl" "$pol: --mem-limit 64K == unlimited"
  python3 -c "
import json, sys
s = json.load(open(sys.argv[1]))['stages'][0]
assert 0 < s['cache_bytes_peak'] <= s['cache_reserved_peak'] <= 65536, s" "$T/t$tag.stats" \
    && pass "$pol: real cache peak <= reserved peak <= the budget" || fail "$pol: budget stats"
done

# an automatic budget is reported; bad values are refused naming the flag
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/auto.jsonl" --batch 8 --digest --stats "$T/auto.stats" >/dev/null 2>&1
python3 -c "import json,sys; s=json.load(open(sys.argv[1])); assert s['stages'][0]['mem_limit_bytes'] > 1e8" "$T/auto.stats" \
  && pass "auto budget from the node's available memory is in the stats" || fail "auto budget"
same "$T/ref.jsonl" "$T/auto.jsonl" "auto budget == unlimited"
for bad in 0 12Q -5 auto2; do
  expect_fail "--mem-limit $bad refused" "--mem-limit" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/bad.jsonl" --mem-limit "$bad"
done
finish
