#!/usr/bin/env bash
# pipedec shard / merge (issue 15): a manifest split into shards, each shard
# decoded by its own job (one rank, or a 2-rank pipeline), merged back, is
# byte-identical (digests included) to one run over the whole manifest; a
# shard directory elsewhere still finds the embeddings; more shards than
# pages give empty shards that decode to nothing; bad manifests are refused
# naming file:line with nothing written; merge lists missing, duplicated and
# unknown ids, exits 1 and leaves its output untouched.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 24 --embed-rows 12 --prompt-tokens 3 --max-new 40 --mixed --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/ref.jsonl" --digest --batch 4 2>/dev/null

# 4 shards in a directory elsewhere: relative embedding paths rewritten
mkdir -p "$T/elsewhere"
"$PIPEDEC" shard --pages "$P" --shards 4 --out "$T/elsewhere/shards" > "$T/shard.out"
grep -q '"embeddings":"../../pages/p00000.npy"' "$T/elsewhere/shards/shard-0.jsonl" \
  && pass "shard: relative embedding paths rewritten from the shard directory" || fail "shard: paths not rewritten"
n=$(cat "$T/elsewhere/shards"/shard-*.jsonl | wc -l)
[ "$n" -eq 24 ] && grep -q "^shard 3: " "$T/shard.out" && pass "shard: 4 shards hold the 24 pages once" \
  || fail "shard: $n lines in the shards"
mkdir -p "$T/out"
for k in 0 1; do
  "$PIPEDEC" run --model "$m" --pages "$T/elsewhere/shards/shard-$k.jsonl" --out "$T/out/shard-$k.jsonl" --digest \
    --batch 3 2>/dev/null
done
for k in 2 3; do
  mpirun --oversubscribe --bind-to none -np 2 "$PD_BUILD/pipedec" run --model "$m" \
    --pages "$T/elsewhere/shards/shard-$k.jsonl" --out "$T/out/shard-$k.jsonl" --digest --batch 6 >/dev/null 2>&1
done
"$PIPEDEC" merge --pages "$P" --out-dir "$T/out" --out "$T/merged.jsonl" > "$T/merge.out"
same "$T/ref.jsonl" "$T/merged.jsonl" "4 shards on 1 and 2 ranks, merged == one run over the manifest"
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/other.jsonl" --digest --batch 4 --sample temp:0.9 --seed 2 2>/dev/null
differ "$T/ref.jsonl" "$T/other.jsonl" "negative control: seeded sampling"

# more shards than pages: empty shards decode to nothing, merge is still complete
head -3 "$P" > "$T/pages/three.jsonl"
head -3 "$T/ref.jsonl" > "$T/three.ref"
"$PIPEDEC" shard --pages "$T/pages/three.jsonl" --shards 6 --out "$T/many" >/dev/null
empty=$(find "$T/many" -name 'shard-*.jsonl' -empty | wc -l)
mkdir -p "$T/many.out"
for f in "$T/many"/shard-*.jsonl; do
  "$PIPEDEC" run --model "$m" --pages "$f" --out "$T/many.out/$(basename "$f")" --digest 2>/dev/null \
    || fail "run over $f failed"
done
"$PIPEDEC" merge --pages "$T/pages/three.jsonl" --out-dir "$T/many.out" --out "$T/many.jsonl" >/dev/null
[ "$empty" -eq 3 ] && same "$T/three.ref" "$T/many.jsonl" "3 pages in 6 shards ($empty empty), merged == one run" \
  || fail "3 pages in 6 shards: $empty empty"

# bad manifests: file:line named, exit 1, nothing written
head -3 "$P" > "$T/pages/dup.jsonl"; sed -n 2p "$P" >> "$T/pages/dup.jsonl"
expect_fail "shard: a duplicate id" 'dup.jsonl:4: page "p00001": id: already used by the page on line 2' \
  "$PIPEDEC" shard --pages "$T/pages/dup.jsonl" --shards 2 --out "$T/dup.out"
[ ! -e "$T/dup.out" ] && pass "shard: nothing written for a refused manifest" || fail "shard wrote $T/dup.out"
{ head -2 "$P"; echo '{"id": "x", "prefill": [{"tokens": [1]}], "max_new_tokens": 1'; } > "$T/pages/broken.jsonl"
expect_fail "shard: a line that is not JSON" 'broken.jsonl:3' \
  "$PIPEDEC" shard --pages "$T/pages/broken.jsonl" --shards 2 --out "$T/broken.out"
expect_fail "shard: --shards 0" "--shards '0': expected an integer in 1..10000" \
  "$PIPEDEC" shard --pages "$P" --shards 0 --out "$T/zero"
expect_fail "shard: stale shards of a larger split" "^pipedec shard: .*/many/shard-[45].jsonl is left from a split into more shards" \
  "$PIPEDEC" shard --pages "$P" --shards 4 --out "$T/many"

# merge: problems listed, exit 1, output untouched
cp "$T/out/shard-0.jsonl" "$T/out/shard-0.copy.jsonl"          # every page of shard 0 twice
rm "$T/out/shard-3.jsonl"                                        # shard 3 missing
echo '{"id":"stranger","tokens":[]}' > "$T/out/extra.jsonl"      # an id the manifest lacks
echo keep > "$T/final.jsonl"
rc=0
"$PIPEDEC" merge --pages "$P" --out-dir "$T/out" --out "$T/final.jsonl" >/dev/null 2>"$T/merge.err" || rc=$?
nmiss=$(grep -c "^missing: " "$T/merge.err" || true)
ndup=$(grep -c "^duplicated: " "$T/merge.err" || true)
want_miss=$(grep -c . "$T/elsewhere/shards/shard-3.jsonl")
want_dup=$(grep -c . "$T/out/shard-0.jsonl")
if [ "$rc" -eq 1 ] && [ "$nmiss" -eq "$want_miss" ] && [ "$ndup" -eq "$want_dup" ] \
   && grep -q "^unknown: stranger (.*extra.jsonl:1)" "$T/merge.err" && [ "$(cat "$T/final.jsonl")" = keep ]; then
  pass "merge: $nmiss missing, $ndup duplicated and 1 unknown id listed, exit 1, output untouched"
else
  fail "merge: exit $rc, $nmiss missing (want $want_miss), $ndup duplicated (want $want_dup)"; cat "$T/merge.err"
fi
expect_fail "merge: the output inside the out-dir" "is in .*, where every \*.jsonl is read" \
  "$PIPEDEC" merge --pages "$P" --out-dir "$T/out" --out "$T/out/final.jsonl"
expect_fail "merge: the output over the manifest" "would overwrite the manifest" \
  "$PIPEDEC" merge --pages "$P" --out-dir "$T/out" --out "$P"
finish
