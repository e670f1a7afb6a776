#!/usr/bin/env bash
# Speculative verify batches (issue 12, n-gram drafting): out.jsonl, digests
# included, is byte-identical with and without --draft for 1-4 ranks, every
# --attn and --kv mode, greedy and seeded sampling and the n-gram ban, while
# drafts are really sent and accepted (stats); drafting with eviction and bad
# --draft values are refused.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 12 --embed-rows 12 --prompt-tokens 3 --max-new 200 --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
MPIRUN=(mpirun --oversubscribe --bind-to none)

for pol in "" "--attn rswa:8" "--attn window:8" "--kv q8" "--kv q8k" "--sample temp:0.8,top_p:0.9 --seed 3" \
           "--no-repeat-ngram 3:32"; do
  tag=$(echo "p$pol" | tr -c 'a-zA-Z0-9' '_')
  # shellcheck disable=SC2086
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/$tag.ref" --batch 3 --digest $pol >/dev/null 2>&1
  # shellcheck disable=SC2086
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/$tag.spec" --batch 3 --digest --draft ngram:1:6 $pol \
    --stats "$T/$tag.stats" >/dev/null 2>&1
  same "$T/$tag.ref" "$T/$tag.spec" "${pol:-full f32}: --draft ngram:1:6 == no speculation"
  python3 -c "
import json, sys
sp = json.load(open(sys.argv[1]))['spec']
assert sp['drafted'] > 20 and 0 < sp['accepted'] <= sp['drafted'] and sp['passes'] > 0, sp
print(f\"    drafted {sp['drafted']}, accepted {sp['accepted']}, passes {sp['passes']}\")" "$T/$tag.stats" \
    && pass "${pol:-full f32}: drafts were sent and accepted" || fail "${pol:-full f32}: no speculation happened"
done
for n in 2 3 4; do
  "${MPIRUN[@]}" -np "$n" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/np$n.jsonl" --batch 3 --digest \
    --draft ngram --prefill-chunk 5 >/dev/null 2>&1 </dev/null
  same "$T/p_.ref" "$T/np$n.jsonl" "$n ranks, --draft ngram, chunked prefill == one rank without speculation"
done
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/b1.jsonl" --batch 1 --digest --draft ngram:2:3 >/dev/null 2>&1
same "$T/p_.ref" "$T/b1.jsonl" "batch 1, --draft ngram:2:3 == batch 3 without speculation"
expect_fail "--draft with --evict refused" "--draft with --evict is refused" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/x.jsonl" --draft ngram --evict recent:16
for bad in ngram:0 ngram:3:17 ngram:x model foo; do
  expect_fail "--draft $bad refused" "--draft '$bad'" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/x.jsonl" --draft "$bad"
done
finish
