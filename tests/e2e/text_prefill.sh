#!/usr/bin/env bash
# Prompts as text (issue 37): a manifest's {"text": ...} prefill segment is
# tokenized with the model's own tokenizer (no BOS, special tokens parsed)
# and decodes byte-identically (logit digests included) to the same page
# written as {"tokens": [...]} with the ids `pipedec tokenize --ids --no-bos`
# prints; pages of ids alone are untouched by the tokenizer. Negative: text
# that is not valid UTF-8 (a raw 0xFF byte) is refused naming line,
# page and field, and so is a key beside "text".
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/llama.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 \
  --vocab 320 --seed 7 --out "$m" >/dev/null
text='Hello world, this is text.'
ids=$("$PD_BUILD/pipedec" tokenize --model "$m" --text "$text" --ids --no-bos)
if [ "$ids" != "[]" ] && [[ "$ids" == \[* ]]; then pass "tokenize --ids: $ids"; else fail "tokenize --ids gave '$ids'"; fi
bos=$("$PD_BUILD/pipedec" tokenize --model "$m" --text "$text" --ids)
if [ "$bos" = "[1, ${ids#[}" ]; then pass "tokenize adds the llama BOS (1) by default"; else fail "BOS: $bos vs $ids"; fi
printf '{"id": "a", "prefill": [{"tokens": [1]}, {"text": "%s"}], "max_new_tokens": 12}\n{"id": "b", "prefill": [{"tokens": [1, 5, 9]}], "max_new_tokens": 6}\n' "$text" >"$T/text.jsonl"
printf '{"id": "a", "prefill": [{"tokens": [1]}, {"tokens": %s}], "max_new_tokens": 12}\n{"id": "b", "prefill": [{"tokens": [1, 5, 9]}], "max_new_tokens": 6}\n' "$ids" >"$T/ids.jsonl"
"$PIPEDEC" run --digest --model "$m" --pages "$T/text.jsonl" --out "$T/text.out.jsonl" >>"$T/run.log" 2>&1 || fail "run on the text manifest failed: $(tail -3 "$T/run.log")"
"$PIPEDEC" run --digest --model "$m" --pages "$T/ids.jsonl" --out "$T/ids.out.jsonl" >>"$T/run.log" 2>&1 || fail "run on the ids manifest failed"
same "$T/text.out.jsonl" "$T/ids.out.jsonl" "text segment == the same ids as a tokens segment"

printf '{"id": "bad", "prefill": [{"text": "x\xffy"}], "max_new_tokens": 4}\n' >"$T/bad.jsonl"
if msg=$("$PIPEDEC" run --model "$m" --pages "$T/bad.jsonl" --out "$T/bad.out" 2>&1); then
  fail "invalid UTF-8 text accepted"
elif grep -q 'bad.jsonl:1: page "bad": prefill\[0\].text: byte offset 1: not valid UTF-8' <<<"$msg"; then
  pass "invalid text refused naming line, page and field"
else
  fail "invalid text: unexpected message: $msg"
fi
printf '{"id": "two", "prefill": [{"text": "a", "tokens": [1]}], "max_new_tokens": 4}\n' >"$T/two.jsonl"
if msg=$("$PIPEDEC" run --model "$m" --pages "$T/two.jsonl" --out "$T/two.out" 2>&1); then
  fail "text and tokens in one segment accepted"
elif grep -q 'two.jsonl:1: page "two": prefill\[0\]: has more than one of' <<<"$msg"; then
  pass "text beside tokens refused"
else
  fail "text + tokens: unexpected message: $msg"
fi
finish
