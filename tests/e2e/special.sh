#!/usr/bin/env bash
# run --special: control tokens a page generates (here BOS, which a random
# model emits now and then) appear in its text as their own text, as
# llama.cpp's token_to_piece with special = true; without it they decode to
# nothing. Tokens and digests do not depend on it; a checkpoint written
# without it is not resumed with it (the text convention would change
# mid-file).
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 20 --embed-rows 4 --prompt-tokens 3 --max-new 200 --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/plain.jsonl" --digest >/dev/null 2>&1
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/special.jsonl" --digest --special >/dev/null 2>&1
if python3 - "$T/plain.jsonl" "$T/special.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 20
with_bos = 0
for x, y in zip(a, b):
    assert x["tokens"] == y["tokens"] and x["digest"] == y["digest"], x["id"]
    n = x["tokens"].count(1)
    with_bos += n > 0
    assert "<s>" not in x["text"], x["id"]
    assert y["text"].count("<s>") == n, (x["id"], n, y["text"].count("<s>"))
assert with_bos >= 3, with_bos   # the case is exercised, not vacuous
print(with_bos)
PY
then pass "--special: BOS shows as <s> in the text of the pages that generate it, nowhere without it; tokens and digests equal"
else fail "--special"; fi
# the text convention is a checkpoint setting
d="$T/ck"
"$PIPEDEC" mkpages --model "$m" --count 2000 --embed-rows 4 --prompt-tokens 3 --max-new 200 --seed 6 --out "$T/long" >/dev/null
( timeout 300 "$PIPEDEC" run --model "$m" --pages "$T/long/pages.jsonl" --out "$T/l.jsonl" --checkpoint-dir "$d" \
    --pid-file "$T/l.jsonl.pids" >/dev/null 2>&1 || true ) &
job=$!
for _ in $(seq 1 3000); do [ -s "$T/l.jsonl" ] && [ -s "$T/l.jsonl.pids" ] && break; sleep 0.01; done
kill -USR2 "$(rank_pid "$T/l.jsonl" 0)" 2>/dev/null || true
wait "$job" || true
[ -d "$d/ckpt-1" ] || fail "no checkpoint to resume"
expect_fail "resume with --special of a checkpoint written without it" "written with other settings" \
  "$PIPEDEC" run --model "$m" --pages "$T/long/pages.jsonl" --out "$T/l.jsonl" --checkpoint-dir "$d" --special
finish
