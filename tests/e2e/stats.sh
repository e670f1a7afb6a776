#!/usr/bin/env bash
# --stats splits prefill and decode (issue 17): the fields exist on every
# stage and overall, are non-negative, and add up — prefill rows equal the
# pages' prefill rows on every stage, decode rows equal generated tokens
# minus one per page (the last token is sampled, never fed) plus the rows
# rollback dropped (rejected drafts), rows = prefill + decode rows, and
# prefill_s + decode_s = busy_s. 1 and 2 ranks, with and without
# speculation, chunked prefill. Counts only: no timing thresholds.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 7 --embed-rows 12 --prompt-tokens 3 --max-new 40 --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"

check() { # check STATS_FILE WHAT
  if python3 - "$1" "$P" <<'PY'
import json, os, sys
s = json.load(open(sys.argv[1]))
pages = [json.loads(l) for l in open(sys.argv[2])]
d = os.path.dirname(sys.argv[2])
def rows(seg):  # a segment's prefill rows: its tokens, or the .npy block's first dimension
    if "tokens" in seg:
        return len(seg["tokens"])
    hdr = open(os.path.join(d, seg["embeddings"]), "rb").read(256).decode("latin1")
    return int(hdr.split("'shape': (")[1].split(",")[0])
want_pre = sum(rows(seg) for p in pages for seg in p["prefill"])
pre, dec = s["prefill"], s["decode"]
assert s["exit_status"] == 0, s["exit_status"]
for k in ("rows", "s", "rows_per_s"):
    assert pre[k] >= 0, (k, pre)
for k in ("rows", "tokens", "s", "tokens_per_s"):
    assert dec[k] >= 0, (k, dec)
assert pre["rows"] == s["prefill_rows"] == want_pre, (pre, want_pre)
assert dec["tokens"] == s["tokens"] > 0, dec
done = s["pages_done"] - s["pages_failed"]
assert done == len(pages), s
for st in s["stages"]:
    for k in ("prefill_rows", "decode_rows", "prefill_s", "decode_s"):
        assert st[k] >= 0, (k, st)
    assert st["prefill_rows"] == want_pre, st
    assert st["prefill_rows"] + st["decode_rows"] == st["rows"], st
    assert st["decode_rows"] == s["tokens"] - done + st.get("rows_rolled_back", 0), (st, s["tokens"], done)
    assert abs(st["prefill_s"] + st["decode_s"] - st["busy_s"]) <= 1e-6 * max(1.0, st["busy_s"]), st
    assert st["prefill_s"] <= pre["s"] and st["decode_s"] <= dec["s"], st
assert dec["rows"] == max(st["decode_rows"] for st in s["stages"]), dec
assert (pre["rows_per_s"] > 0) == (pre["s"] > 0) and (dec["tokens_per_s"] > 0) == (dec["s"] > 0)
print(f"    prefill {pre['rows']} rows, decode {dec['tokens']} tokens / {dec['rows']} rows")
PY
  then pass "$2"; else fail "$2"; fi
}

"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/a.jsonl" --batch 3 --stats "$T/a.stats" >/dev/null 2>&1
check "$T/a.stats" "1 rank: prefill / decode split adds up"
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/b.jsonl" --batch 3 --prefill-chunk 5 --draft ngram:1:6 \
  --stats "$T/b.stats" >/dev/null 2>&1
check "$T/b.stats" "1 rank, chunked prefill, speculation: rejected drafts counted as decode rows"
mpirun --oversubscribe --bind-to none -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/c.jsonl" --batch 3 \
  --prefill-chunk 5 --stats "$T/c.stats" >/dev/null 2>&1 </dev/null
check "$T/c.stats" "2 ranks: every stage runs every prefill row; split adds up"
mpirun --oversubscribe --bind-to none -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/d.jsonl" --batch 3 \
  --draft ngram:1:6 --sample temp:0.8,top_p:0.9 --seed 3 --stats "$T/d.stats" >/dev/null 2>&1 </dev/null
check "$T/d.stats" "2 ranks, speculation, sampling: split adds up"
# negative control: the checker refuses a stats file whose split does not add up
python3 -c "
import json, sys
s = json.load(open(sys.argv[1])); s['stages'][0]['decode_rows'] += 1
json.dump(s, open(sys.argv[2], 'w'))" "$T/a.stats" "$T/bad.stats"
if (check "$T/bad.stats" "x" >/dev/null 2>&1; exit "$E2E_FAILS"); then fail "negative control: a broken split passed"
else pass "negative control: a decode row too many is caught"; fi
finish
