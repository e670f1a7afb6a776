#!/usr/bin/env bash
# R-SWA with int8 storage (issue 40 item 1): --attn rswa:W --kv q8|q8k|q8v.
# For each mode, out.jsonl with digests is byte-identical across batch
# sizes, prefill chunking, threads, 1-3 ranks and speculation (n-gram drafts
# really accepted); while nothing wraps and no q8 field would freeze (< 64
# rows) it equals full attention with the same --kv (the ring stores rows
# as a q8 kv layer does before its freeze), and wrapped it differs from the
# f32 ring (negative controls). Each stream's cache bytes in --stats equal
# the admission estimate, and a --mem-limit of exactly a page's reservation
# decodes it while one byte less fails that page alone. Checkpoint / resume
# and migration of these rings run in e2e.checkpoint and e2e.migrate, the
# ring_q8 record in e2e.inspect.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 8 \
  --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 9 --embed-rows 12 --prompt-tokens 3 --max-new 120 --seed 6 \
  --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
# short pages: prefill 15 + 40 generated < 64 rows (no q8 freeze), W = 48 (no wrap)
"$PIPEDEC" mkpages --model "$m" --count 6 --embed-rows 12 --prompt-tokens 3 --max-new 40 --seed 7 \
  --out "$T/short" >/dev/null
S="$T/short/pages.jsonl"
MPIRUN=(mpirun --oversubscribe --bind-to none)
run() { "$PIPEDEC" run --model "$m" --digest "$@" >/dev/null 2>&1 </dev/null; }

for kv in q8 q8k q8v; do
  pol=(--attn rswa:8 --kv "$kv")
  run --pages "$P" --out "$T/$kv.ref" --batch 3 "${pol[@]}" --stats "$T/$kv.stats"
  run --pages "$P" --out "$T/$kv.b1" --batch 1 "${pol[@]}"
  same "$T/$kv.ref" "$T/$kv.b1" "rswa:8 --kv $kv: batch 1 == batch 3"
  run --pages "$P" --out "$T/$kv.b6" --batch 6 --prefill-chunk 5 --threads 2 "${pol[@]}"
  same "$T/$kv.ref" "$T/$kv.b6" "rswa:8 --kv $kv: batch 6, prefill chunks of 5, 2 threads == batch 3"
  for n in 2 3; do
    "${MPIRUN[@]}" -np "$n" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/$kv.np$n" --batch 3 --digest \
      --prefill-chunk 7 "${pol[@]}" >/dev/null 2>&1 </dev/null
    same "$T/$kv.ref" "$T/$kv.np$n" "rswa:8 --kv $kv: $n ranks, prefill chunks of 7 == one rank"
  done
  run --pages "$P" --out "$T/$kv.spec" --batch 3 --draft ngram:1:6 "${pol[@]}" --stats "$T/$kv.spec.stats"
  same "$T/$kv.ref" "$T/$kv.spec" "rswa:8 --kv $kv: --draft ngram:1:6 == no speculation"
  python3 -c "
import json, sys
sp = json.load(open(sys.argv[1]))['spec']
assert sp['drafted'] > 20 and 0 < sp['accepted'] <= sp['drafted'], sp
print(f\"    drafted {sp['drafted']}, accepted {sp['accepted']}, passes {sp['passes']}\")" "$T/$kv.spec.stats" \
    && pass "rswa:8 --kv $kv: drafts were sent and accepted" || fail "rswa:8 --kv $kv: no speculation happened"
  "${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/$kv.spec2" --batch 3 --digest \
    --draft ngram:1:6 --prefill-chunk 5 "${pol[@]}" >/dev/null 2>&1 </dev/null
  same "$T/$kv.ref" "$T/$kv.spec2" "rswa:8 --kv $kv: 2 ranks, --draft ngram:1:6 == one rank without speculation"
  # lossless where nothing is lost: the ring holds every row and no field freezes
  run --pages "$S" --out "$T/$kv.short.full" --batch 3 --kv "$kv"
  run --pages "$S" --out "$T/$kv.short.rswa" --batch 2 --attn rswa:48 --kv "$kv"
  same "$T/$kv.short.full" "$T/$kv.short.rswa" "rswa:48 --kv $kv == full --kv $kv while < 64 rows and no wrap"
  # the per-stream figures: allocated == estimate
  python3 -c "
import json, sys
for st in json.load(open(sys.argv[1]))['stages']:
    a, e = st['stream_cache_bytes_peak'], st['stream_cache_estimate']
    assert a > 0 and a == e, st
    print(f'    rank {st[\"rank\"]}: one stream {a:.0f} bytes allocated == {e:.0f} estimated')" "$T/$kv.stats" \
    && pass "rswa:8 --kv $kv: a stream's cache bytes == the admission estimate" \
    || fail "rswa:8 --kv $kv: per-stream cache bytes"
done
# negative controls: int8 rows change the logits; a wrapping ring is not full attention
run --pages "$P" --out "$T/f32.ref" --batch 3 --attn rswa:8 --stats "$T/f32.stats"
differ "$T/f32.ref" "$T/q8.ref" "negative control: rswa:8 --kv q8 differs from rswa:8 f32"
differ "$T/q8k.ref" "$T/q8v.ref" "negative control: --kv q8k differs from q8v"
run --pages "$P" --out "$T/fullq8.ref" --batch 3 --kv q8
differ "$T/fullq8.ref" "$T/q8.ref" "negative control: rswa:8 (wrapping) --kv q8 differs from full --kv q8"
python3 - "$T/f32.stats" "$T/q8.stats" "$T/q8k.stats" <<'PY' && pass "int8 storage shrinks the caches" || fail "int8 cache bytes"
import json, sys
f, q, k = (json.load(open(p))["stages"][0]["stream_cache_bytes_peak"] for p in sys.argv[1:4])
print(f"    one stream: f32 {f:.0f} bytes, q8k {k:.0f}, q8 {q:.0f}")
assert q < k < f, (f, k, q)
PY

# --mem-limit holds exactly: the largest page's reservation (the estimate plus
# the budget's fixed per-layer allowance for allocator rounding) decodes it,
# one byte less fails it alone
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/tiny.jsonl" --attn rswa:8 --kv q8 --mem-limit 1K \
  >/dev/null 2>&1 </dev/null || true
need=$(python3 -c "
import json, re, sys
n = [int(re.search(r'need (\d+) bytes', json.loads(l)['error']).group(1)) for l in open(sys.argv[1])]
print(max(n))" "$T/tiny.jsonl")
run --pages "$P" --out "$T/exact.jsonl" --batch 3 --attn rswa:8 --kv q8 --mem-limit "$need"
same "$T/q8.ref" "$T/exact.jsonl" "--mem-limit $need (the largest page's reservation) == unlimited"
run --pages "$P" --out "$T/less.jsonl" --batch 3 --attn rswa:8 --kv q8 --mem-limit "$((need - 1))" || true
python3 - "$T/less.jsonl" "$T/q8.ref" "$need" <<'PY' && pass "--mem-limit one byte less fails the largest page(s) alone" \
  || fail "--mem-limit one byte less"
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
ref = {j["id"]: j for j in (json.loads(l) for l in open(sys.argv[2]))}
need = int(sys.argv[3])
err = [g for g in got if "error" in g]
assert err and len(got) == len(ref), err
assert all(f"need {need} bytes" in g["error"] and f"budget of {need - 1} bytes" in g["error"] for g in err), err
assert all(g == ref[g["id"]] for g in got if "error" not in g)
print(f"    {len(err)} of {len(got)} pages need {need} bytes: each fails alone")
PY

finish
