#!/usr/bin/env bash
# e2e: the shipped OCR decoder (models/ocr-tiny.gguf) transcribes held-out
# rendered pages (tests/data/ocr/heldout.txt: hand-written text, not in the
# training set): CER <= 1 % with f32 full attention, <= 2 % with --kv q8.
# Also: render is deterministic, and bad text or flags are refused with a
# clear message leaving the outputs untouched.
# usage: PD_BUILD=<build dir> PD_SRC=<source dir> tests/e2e/ocr.sh
source "$(dirname "$0")/lib.bash"
model="$PD_SRC/models/ocr-tiny.gguf"
text="$PD_SRC/tests/data/ocr/heldout.txt"
t="$E2E_TMP"

"$PIPEDEC" render --text "$text" --model "$model" --out "$t/pages" >/dev/null
"$PIPEDEC" render --text "$text" --model "$model" --out "$t/pages2" >/dev/null
if diff -r "$t/pages" "$t/pages2" >/dev/null; then pass "render: same text, same bytes"; else fail "render is not deterministic"; fi

# the shipped model's tokenizer: the prompt text is the prompt's ids, and the
# file is exactly what `mkmodel --revocab` makes of it (models/README.md)
ids=$("$PIPEDEC" tokenize --model "$model" --text "OCR:" --ids --no-bos 2>&1)
[ "$ids" = "[79, 67, 82, 58]" ] && pass "tokenize: \"OCR:\" is the model's prompt ids" || fail "tokenize OCR: gave $ids"
"$PIPEDEC" mkmodel --revocab "$model" --out "$t/revocab.gguf" >/dev/null
cmp -s "$model" "$t/revocab.gguf" && pass "mkmodel --revocab of the shipped model is the shipped model" \
  || fail "mkmodel --revocab changed the shipped model"

# cer_at MODE_NAME MAX_CER RUN_FLAGS...: decode, score, compare with MAX_CER
cer_at() {
  local name="$1" max="$2"; shift 2
  rm -f "$t/$name.jsonl"
  "$PIPEDEC" run --model "$model" --pages "$t/pages/pages.jsonl" --out "$t/$name.jsonl" --batch 8 "$@" \
    >/dev/null 2>"$t/$name.err" || { fail "$name: run failed: $(tail -2 "$t/$name.err")"; return; }
  "$PIPEDEC" score --pages "$t/pages/pages.jsonl" --out "$t/$name.jsonl" --truth "$text" --json >"$t/$name.score" \
    || { fail "$name: score failed"; return; }
  local cer
  cer=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["overall"]["cer"])' "$t/$name.score")
  if python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) <= float(sys.argv[2]) else 1)' "$cer" "$max"; then
    pass "$name: held-out CER $cer <= $max"
  else
    fail "$name: held-out CER $cer > $max"; head -c 600 "$t/$name.jsonl"
  fi
}
cer_at f32 0.01
cer_at q8 0.02 --kv q8

# render writes the prompt as text; the same pages with the prompt as ids
# decode to the same bytes (digests included)
grep -q '{"text":"OCR:"}\],"max_new_tokens"' "$t/pages/pages.jsonl" && pass "render: the prompt is a text segment" \
  || fail "render: no text prompt in $(head -c 300 "$t/pages/pages.jsonl")"
sed 's/{"text":"OCR:"}/{"tokens":[79,67,82,58]}/' "$t/pages/pages.jsonl" >"$t/pages/ids.jsonl"
for m in text ids; do
  pg="$t/pages/pages.jsonl"; [ "$m" = ids ] && pg="$t/pages/ids.jsonl"
  "$PIPEDEC" run --model "$model" --pages "$pg" --out "$t/prompt_$m.jsonl" --batch 8 --digest >/dev/null 2>&1 \
    || fail "prompt as $m: run failed"
done
cmp -s "$t/prompt_text.jsonl" "$t/prompt_ids.jsonl" && grep -q '"digest"' "$t/prompt_ids.jsonl" \
  && pass "a text prompt decodes exactly as its ids (digests)" || fail "text and id prompts decode differently"
# negative control: another prompt changes the digests
sed 's/{"text":"OCR:"}/{"text":"OCR;"}/' "$t/pages/pages.jsonl" >"$t/pages/other.jsonl"
"$PIPEDEC" run --model "$model" --pages "$t/pages/other.jsonl" --out "$t/prompt_other.jsonl" --batch 8 --digest \
  >/dev/null 2>&1 || fail "other prompt: run failed"
cmp -s "$t/prompt_text.jsonl" "$t/prompt_other.jsonl" && fail "negative control: another prompt gave the same bytes" \
  || pass "negative control: another prompt gives other digests"

# the scorer sees errors: a transcription with one page dropped scores worse
python3 - "$t/f32.jsonl" "$t/broken.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
lines[0]["text"] = lines[0]["text"][::-1]
open(sys.argv[2], "w").write("".join(json.dumps(l) + "\n" for l in lines))
PY
cer=$("$PIPEDEC" score --pages "$t/pages/pages.jsonl" --out "$t/broken.jsonl" --truth "$text" --json |
      python3 -c 'import json,sys; print(json.load(sys.stdin)["overall"]["cer"])')
if python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) > 0.05 else 1)' "$cer"; then
  pass "score: a reversed page raises the CER ($cer)"
else
  fail "score: a reversed page scored $cer"
fi

# bad input: clear errors, non-zero exit, nothing written
printf 'fine line\nbad\tline\n' >"$t/tab.txt"
expect_fail "render refuses a tab" "tab.txt: page 1, line 2, column 4: byte 0x09" \
  "$PIPEDEC" render --text "$t/tab.txt" --model "$model" --out "$t/tab"
[ ! -e "$t/tab" ] && pass "render: refused text leaves no output" || fail "render: refused text left $t/tab"
python3 -c 'print(("x" * 40 + "\n") * 3, end="")' >"$t/long.txt"
expect_fail "render refuses a page over the model's cells" "page 1 uses 123 cells .* at most 64" \
  "$PIPEDEC" render --text "$t/long.txt" --model "$model" --out "$t/long" --cells 64
expect_fail "render needs --model" "--model M" "$PIPEDEC" render --text "$text" --out "$t/x"
expect_fail "render: a missing text file is named" "nope.txt" \
  "$PIPEDEC" render --text "$t/nope.txt" --model "$model" --out "$t/x"
head -1 "$t/f32.jsonl" >"$t/short.jsonl"
expect_fail "score refuses an output missing pages" 'page "p00001" has no line' \
  "$PIPEDEC" score --pages "$t/pages/pages.jsonl" --out "$t/short.jsonl" --truth "$text"
printf 'one page only\n' >"$t/one.txt"
expect_fail "score refuses a truth of another page count" "holds 8 pages, the truth text 1" \
  "$PIPEDEC" score --pages "$t/pages/pages.jsonl" --out "$t/f32.jsonl" --truth "$t/one.txt"
finish
