#!/usr/bin/env bash
# Speculative verify batches (issue 12): out.jsonl, digests included, is
# byte-identical with and without --draft (n-gram lookup, and draft models:
# the target itself, which must get every draft accepted, and other models
# of the same vocabulary, reading the page embeddings or only its tokens)
# for 1-4 ranks, every --attn and --kv mode, greedy and seeded sampling and
# the n-gram ban, while drafts are really sent and accepted (stats);
# asynchronous drafting with eviction on int8 rows, a draft model of another vocabulary and bad
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
# draft models: the target itself (same bits, so every draft is accepted),
# one of the same hidden size (reads the page embeddings), one smaller
# (reads only tokens)
"$PIPEDEC" mkmodel --arch llama --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 64 --vocab 320 --seed 21 \
  --out "$T/d64.gguf" >/dev/null
"$PIPEDEC" mkmodel --arch llama --layers 2 --hidden 32 --heads 2 --kv-heads 1 --ffn 48 --vocab 320 --seed 22 \
  --out "$T/d32.gguf" >/dev/null
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/self.jsonl" --batch 3 --digest --draft "model:$m" \
  --stats "$T/self.stats" >/dev/null 2>&1
same "$T/p_.ref" "$T/self.jsonl" "--draft model:<the target> == no speculation"
python3 -c "
import json, sys
st = json.load(open(sys.argv[1]))
sp, tok = st['spec'], st['tokens']
assert sp['drafted'] > 100 and sp['accepted'] == sp['drafted'], sp
# the draft model's own counters: it proposed for streams and ran rows
assert sp['draft_model_proposals'] > 0 and sp['draft_model_rows'] >= sp['drafted'], sp
print(f\"    drafted {sp['drafted']}, accepted {sp['accepted']}, {tok / sp['passes']:.2f} tokens per pass at K 4\")
assert tok / sp['passes'] > 3, 'tokens per pass'" "$T/self.stats" \
  && pass "the target as its own draft: every draft accepted, > 3 tokens per pass" \
  || fail "the target as its own draft: not every draft accepted"
for pol in "" "--attn rswa:8" "--kv q8k" "--sample temp:0.8,top_p:0.9 --seed 3" "--no-repeat-ngram 3:32"; do
  tag=$(echo "p$pol" | tr -c 'a-zA-Z0-9' '_')
  for d in d64 d32; do
    # shellcheck disable=SC2086
    "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/$tag.$d" --batch 3 --digest --draft "model:$T/$d.gguf:3" $pol \
      --stats "$T/$tag.$d.stats" >/dev/null 2>&1
    same "$T/$tag.ref" "$T/$tag.$d" "${pol:-full f32}: --draft model:$d == no speculation"
  done
done
python3 -c "
import json, sys
sp = json.load(open(sys.argv[1]))['spec']
assert sp['drafted'] >= 12 and sp['accepted'] < sp['drafted'] / 2, sp
print(f\"    drafted {sp['drafted']}, accepted {sp['accepted']}\")" "$T/p_.d32.stats" \
  && pass "a different draft model: drafts sent, mostly rejected" || fail "a different draft model: no drafts or all accepted"
for n in 2 4; do
  "${MPIRUN[@]}" -np "$n" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/npm$n.jsonl" --batch 3 --digest \
    --draft "model:$T/d64.gguf" --prefill-chunk 5 >/dev/null 2>&1 </dev/null
  same "$T/p_.ref" "$T/npm$n.jsonl" "$n ranks, --draft model:d64, chunked prefill == one rank without speculation"
done
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/selfb1.jsonl" --batch 1 --prefill-chunk 4 --digest \
  --draft "model:$m:6" >/dev/null 2>&1
same "$T/p_.ref" "$T/selfb1.jsonl" "batch 1, chunks of 4 (the draft context in several forwards), --draft model:<the target>:6"
# asynchronous speculation: a second batch of verify rows goes out before the
# first one's verdict; rejections while it travels (stale rows) roll back
# across both batches on every stage
for pol in "" "--attn window:8" "--kv q8" "--kv q8k" "--sample temp:0.8,top_p:0.9 --seed 3" "--no-repeat-ngram 3:32"; do
  tag=$(echo "p$pol" | tr -c 'a-zA-Z0-9' '_')
  for nd in "2 ngram:1:6" "3 model:$T/d64.gguf"; do
    n=${nd%% *} d=${nd#* }
    {
      # shellcheck disable=SC2086
      "${MPIRUN[@]}" -np "$n" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/$tag.async$n.jsonl" --batch 3 --digest \
        --draft "$d" --draft-async --stats "$T/$tag.async$n.stats" $pol >/dev/null 2>&1 </dev/null
      same "$T/$tag.ref" "$T/$tag.async$n.jsonl" "${pol:-full f32}, $n ranks: --draft ${d##*/} --draft-async == no speculation"
    }
  done
done
"${MPIRUN[@]}" -np 3 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/as.jsonl" --batch 3 --digest --draft ngram:1:6 \
  --draft-async --prefill-chunk 5 --stats "$T/as.stats" >/dev/null 2>&1 </dev/null
same "$T/p_.ref" "$T/as.jsonl" "3 ranks, chunked prefill, --draft-async == no speculation"
python3 -c "
import json, sys
st = json.load(open(sys.argv[1]))
sp, rb = st['spec'], [x['rows_rolled_back'] for x in st['stages']]
assert sp['stale'] > 0 and sp['accepted'] > 0, sp
assert len(set(rb)) == 1 and rb[0] >= sp['stale'], rb  # every stage dropped the same rows
print(f\"    drafted {sp['drafted']}, accepted {sp['accepted']}, stale {sp['stale']}, rows rolled back per stage {rb}\")" "$T/as.stats" \
  && pass "--draft-async: rejections arrived while a later batch was in flight (stale rows rolled back)" \
  || fail "--draft-async: no stale batch happened (the rollback across batches went untested)"
expect_fail "--draft-async with --attn rswa refused" "--draft-async with --attn rswa is refused" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/never.jsonl" --draft ngram --draft-async --attn rswa:8
expect_fail "--draft-async without --draft refused" "--draft-async needs --draft" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/never.jsonl" --draft-async
"$PIPEDEC" mkmodel --arch llama --layers 1 --hidden 32 --heads 2 --kv-heads 1 --ffn 48 --vocab 300 --out "$T/v300.gguf" >/dev/null
expect_fail "a draft model of another vocabulary refused" "--draft model:.*v300.gguf: vocabulary of 300 tokens, the model's has 320" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/never.jsonl" --draft "model:$T/v300.gguf"
expect_fail "a missing draft model refused" "--draft model:.*nothere.gguf" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/never.jsonl" --draft "model:$T/nothere.gguf"
[ ! -e "$T/never.jsonl" ] && pass "refused draft models: no output file" || fail "refused draft models left an output file"
cp "$T/d32.gguf" "$T/d32.orig"
expect_fail "--out naming the draft model refused" "is the draft model" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/d32.gguf" --draft "model:$T/d32.gguf"
same_bytes "$T/d32.orig" "$T/d32.gguf" "the draft model is untouched"
expect_fail "--draft-async with --evict and --kv q8 refused" "--draft-async with --evict and --kv q8 is refused" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/x.jsonl" --draft ngram --draft-async --evict recent:16 --kv q8
for bad in ngram:0 ngram:3:17 ngram:x model model: model:m.gguf:0 foo; do
  expect_fail "--draft $bad refused" "--draft '$bad'" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/x.jsonl" --draft "$bad"
done
finish
