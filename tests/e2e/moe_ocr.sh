#!/usr/bin/env bash
# deepseek2-ocr end to end (issue 36): a small random `deepseek2-ocr` model
# (DeepSeek-OCR's decoder as llama.cpp's converter writes it: NEOX rope over
# the whole head, MHA; 1 dense layer, then MoE layers of 8 experts, top 2,
# 1 shared) decodes every page, logit digests included, byte-identically
# alone, batched, prefill-chunked, on 2 threads, under every cache policy and
# over 1..3 ranks with several layer maps, with speculation, a live layer
# migration and checkpoints; the same weights as `deepseek`
# (V1, adjacent-pair rope) give other tokens (the rope style is in force);
# the ggml block types written by mkmodel (q4_0 .. q6_k) keep the invariance
# over ranks; a key/shape disagreement is refused naming the key.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/ocr.gguf"
shape=(--layers 5 --hidden 64 --heads 4 --kv-heads 4 --ffn 96 --vocab 320 --ctx 2048 --dense-layers 1
       --experts 8 --experts-used 2 --expert-ffn 32 --shared 1 --seed 17)
"$PIPEDEC" mkmodel --arch deepseek2-ocr "${shape[@]}" --out "$m" >"$T/mk.log"
grep -q "deepseek2-ocr, 5 layers.*1 dense layers, 8 experts (top 2) of ffn 32, 1 shared" "$T/mk.log" \
  && pass "mkmodel --arch deepseek2-ocr writes the MoE shape" || { fail "mkmodel --arch deepseek2-ocr"; cat "$T/mk.log"; }
"$PIPEDEC" mkpages --model "$m" --count 8 --embed-rows 10 --prompt-tokens 3 --max-new 16 --seed 4 \
  --mixed --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"

run() { "$PIPEDEC" run --model "$m" --pages "$P" --digest "$@" >>"$T/run.log" 2>&1 || fail "run $* exited non-zero"; }

run --out "$T/alone.jsonl" --batch 1
[ "$(wc -l < "$T/alone.jsonl")" -eq 8 ] && pass "8 pages decoded" || fail "pages decoded"
run --out "$T/b5.jsonl" --batch 5
same "$T/alone.jsonl" "$T/b5.jsonl" "batch 5 == alone"
run --out "$T/t2.jsonl" --batch 8 --threads 2
same "$T/alone.jsonl" "$T/t2.jsonl" "2 threads, batch 8 == alone"
run --out "$T/c1.jsonl" --batch 3 --prefill-chunk 1
same "$T/alone.jsonl" "$T/c1.jsonl" "prefill chunk 1 == whole"
for pol in "--attn rswa:4" "--kv q8" "--evict recent:8"; do
  tag=$(tr -c 'a-z0-9' '_' <<<"$pol")
  # shellcheck disable=SC2086
  run --out "$T/p$tag.a.jsonl" --batch 5 --threads 2 $pol
  # shellcheck disable=SC2086
  run --out "$T/p$tag.b.jsonl" --batch 1 --prefill-chunk 3 $pol
  same "$T/p$tag.a.jsonl" "$T/p$tag.b.jsonl" "$pol: batch 5 on 2 threads == batch 1 chunked"
done

# the same weights as deepseek (V1): other tokens (rope style)
"$PIPEDEC" mkmodel --arch deepseek "${shape[@]}" --out "$T/v1.gguf" >/dev/null
"$PIPEDEC" run --model "$T/v1.gguf" --pages "$P" --digest --out "$T/v1.jsonl" --batch 1 >>"$T/run.log" 2>&1
differ "$T/alone.jsonl" "$T/v1.jsonl" "deepseek (V1 rope) vs deepseek2-ocr (NEOX) on the same weights"

# mkmodel --to-ocr: the V1 network as deepseek2-ocr (q/k rows reordered for
# NEOX rope): the same tokens as V1 on every page (the q.k sums run in
# another order, so digests may differ in last bits), llama.cpp loads it
# (the anchor checks the shipped model so), and what it cannot convert
# exactly is refused by name
"$PIPEDEC" mkmodel --to-ocr "$T/v1.gguf" --out "$T/v1ocr.gguf" >/dev/null
"$PIPEDEC" run --model "$T/v1ocr.gguf" --pages "$P" --digest --out "$T/v1ocr.jsonl" --batch 1 >>"$T/run.log" 2>&1
if python3 - "$T/v1.jsonl" "$T/v1ocr.jsonl" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(p)] for p in sys.argv[1:3])
assert len(a) == len(b) == 8 and all(x["id"] == y["id"] and x["tokens"] == y["tokens"] for x, y in zip(a, b))
PY
then pass "mkmodel --to-ocr: the converted V1 model gives V1's tokens on all 8 pages"
else fail "mkmodel --to-ocr changed the tokens"; fi
"$PIPEDEC" inspect "$T/v1ocr.gguf" | grep -q '^rope: neox' && pass "mkmodel --to-ocr: the file is deepseek2-ocr (NEOX rope)" \
  || fail "mkmodel --to-ocr: not NEOX"
to_ocr_refused() { # to_ocr_refused WHAT EXPECTED mkmodel-args...
  local what="$1" want="$2"; shift 2
  "$PIPEDEC" mkmodel "$@" --out "$T/in.gguf" >/dev/null
  rm -f "$T/conv.gguf"
  if ! "$PIPEDEC" mkmodel --to-ocr "$T/in.gguf" --out "$T/conv.gguf" >/dev/null 2>"$T/conv.err" \
     && grep -q -- "$want" "$T/conv.err" && [ ! -e "$T/conv.gguf" ]; then
    pass "mkmodel --to-ocr refuses $what: $(head -1 "$T/conv.err")"
  else fail "mkmodel --to-ocr on $what: $(cat "$T/conv.err")"; fi
}
to_ocr_refused "a llama file" 'is "llama"' --arch llama --layers 1 --hidden 32 --heads 2 --kv-heads 2 --ffn 32 --vocab 320
to_ocr_refused "GQA" "head_count_kv 2 differs from head_count 4" --arch deepseek --layers 2 --hidden 64 --heads 4 \
  --kv-heads 2 --ffn 96 --vocab 320 --dense-layers 1 --experts 4 --experts-used 2 --expert-ffn 32 --shared 1
to_ocr_refused "an expert_weights_scale V1 ignores" "expert_weights_scale is 2.5" --arch deepseek --layers 2 --hidden 64 \
  --heads 4 --kv-heads 4 --ffn 96 --vocab 320 --dense-layers 1 --experts 4 --experts-used 2 --expert-ffn 32 --shared 1 \
  --expert-scale 2.5

MPIRUN=(mpirun --oversubscribe --bind-to none)
prun() { # prun MODEL N OUT extra-args...
  local mm="$1" n="$2" out="$3"; shift 3
  timeout 300 "${MPIRUN[@]}" -np "$n" "$PIPEDEC" run --model "$mm" --pages "${PP:-$P}" --out "$out" --batch 3 --digest "$@" \
    >>"$T/run.log" 2>&1 </dev/null || { fail "mpirun -np $n $* exited non-zero"; tail -5 "$T/run.log"; }
}
for spec in "2 0,1-4" "3 0-1,2-3,4"; do
  read -r n map <<<"$spec"
  prun "$m" "$n" "$T/np$n.jsonl" --layers "$map" --prefill-chunk 4
  same "$T/alone.jsonl" "$T/np$n.jsonl" "np $n, --layers $map, chunk 4 == one rank"
done

# speculation (n-gram drafts verified), a live layer migration between two
# ranks, and a run writing checkpoints: the same bytes as alone
run --out "$T/spec.jsonl" --batch 3 --draft ngram:1:6
same "$T/alone.jsonl" "$T/spec.jsonl" "--draft ngram:1:6 == alone"
prun "$m" 2 "$T/mig.jsonl" --layers 0,1-4 --migrate-at 3:0-2,3-4 --migrate-at 9:0-3,4
same "$T/alone.jsonl" "$T/mig.jsonl" "2 ranks migrating layers at steps 3 and 9 == one rank"
run --out "$T/ck.jsonl" --batch 3 --checkpoint-dir "$T/ck"
same "$T/alone.jsonl" "$T/ck.jsonl" "--checkpoint-dir == alone"

# the ggml block types (hidden 256 so the K types keep 256-blocks where the
# row allows; the 32-wide expert rows take llama-quantize's fallbacks)
for dt in q4_0 q5_0 q4_k q5_k q6_k; do
  mq="$T/ocr.$dt.gguf"
  "$PIPEDEC" mkmodel --arch deepseek2-ocr --layers 3 --hidden 256 --heads 2 --kv-heads 2 --ffn 512 --vocab 320 \
    --ctx 2048 --dense-layers 1 --experts 8 --experts-used 2 --expert-ffn 64 --shared 1 --seed 17 --dtype "$dt" \
    --out "$mq" >"$T/mk.$dt.log" || { fail "mkmodel --dtype $dt: $(cat "$T/mk.$dt.log")"; continue; }
  if [ ! -f "$T/pages256/pages.jsonl" ]; then
    "$PIPEDEC" mkpages --model "$mq" --count 6 --embed-rows 6 --prompt-tokens 3 --max-new 12 --seed 4 \
      --mixed --out "$T/pages256" >/dev/null
  fi
  PP="$T/pages256/pages.jsonl"
  "$PIPEDEC" run --model "$mq" --pages "$PP" --digest --out "$T/$dt.1.jsonl" --batch 1 >>"$T/run.log" 2>&1 \
    || fail "run $dt"
  prun "$mq" 3 "$T/$dt.3.jsonl" --threads 2 --prefill-chunk 4
  same "$T/$dt.1.jsonl" "$T/$dt.3.jsonl" "$dt: 3 ranks, batch 3, 2 threads, chunks of 4 == one rank, batch 1"
done
PP=

# key/shape disagreements are refused naming the key
cp "$m" "$T/bad.gguf"
python3 - "$T/bad.gguf" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
k = b"deepseek2-ocr.attention.head_count_kv"; i = b.index(k) + len(k)
assert b[i:i + 4] == (4).to_bytes(4, "little")  # GGUF u32
b[i + 4:i + 8] = (2).to_bytes(4, "little")
open(p, "wb").write(b)
PY
expect_fail "head_count_kv != head_count is refused" "deepseek2-ocr is MHA" \
  "$PIPEDEC" run --model "$T/bad.gguf" --pages "$P" --out "$T/bad.jsonl"
finish
