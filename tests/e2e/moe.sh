#!/usr/bin/env bash
# DeepSeek MoE end to end (issue 16): a small random `deepseek` model (1 dense
# layer, then MoE layers of 8 experts, top 2, 1 shared) decodes every page,
# logit digests included, byte-identically alone, batched (1 vs 5 vs 16),
# prefill-chunked, on 2 threads and over N = 1..4 ranks with several layer
# maps; every cache policy runs on it and is batch/chunk invariant. Negative
# control: OpenBLAS (not batch invariant) gives other digests at batch 1 than
# at batch 5, so the identity checks see a one-bit difference.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/ds.gguf"
"$PIPEDEC" mkmodel --arch deepseek --layers 5 --hidden 64 --heads 4 --kv-heads 4 --ffn 96 --vocab 320 \
  --ctx 2048 --dense-layers 1 --experts 8 --experts-used 2 --expert-ffn 32 --shared 1 --seed 17 \
  --out "$m" >"$T/mk.log"
grep -q "deepseek, 5 layers.*1 dense layers, 8 experts (top 2) of ffn 32, 1 shared" "$T/mk.log" \
  && pass "mkmodel --arch deepseek writes the MoE shape" || { fail "mkmodel --arch deepseek"; cat "$T/mk.log"; }
"$PIPEDEC" mkpages --model "$m" --count 10 --embed-rows 10 --prompt-tokens 3 --max-new 18 --seed 4 \
  --mixed --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"

run() { "$PIPEDEC" run --model "$m" --pages "$P" --digest "$@" >>"$T/run.log" 2>&1 || fail "run $* exited non-zero"; }

run --out "$T/alone.jsonl" --batch 1
[ "$(wc -l < "$T/alone.jsonl")" -eq 10 ] && pass "10 pages decoded" || fail "pages decoded"
for b in 5 16; do
  run --out "$T/b$b.jsonl" --batch "$b"
  same "$T/alone.jsonl" "$T/b$b.jsonl" "batch $b == alone"
done
run --out "$T/t2.jsonl" --batch 5 --threads 2
same "$T/alone.jsonl" "$T/t2.jsonl" "2 threads, batch 5 == alone"
for c in 1 4; do
  run --out "$T/c$c.jsonl" --batch 3 --prefill-chunk "$c"
  same "$T/alone.jsonl" "$T/c$c.jsonl" "prefill chunk $c == whole"
done

# the negative control
run --out "$T/blas1.jsonl" --batch 1 --gemm openblas
run --out "$T/blas5.jsonl" --batch 5 --gemm openblas
differ "$T/blas1.jsonl" "$T/blas5.jsonl" "control: --gemm openblas batch 1 vs 5"

# every cache policy: batch 5 threads 2 == batch 1 chunked, and not the default
for pol in "--attn rswa:4" "--attn window:8" "--kv q8" "--kv q8k" "--kv q8v" "--evict recent:8" \
           "--evict importance:12:2"; do
  tag=$(tr -c 'a-z0-9' '_' <<<"$pol")
  # shellcheck disable=SC2086
  run --out "$T/p$tag.a.jsonl" --batch 5 --threads 2 $pol
  # shellcheck disable=SC2086
  run --out "$T/p$tag.b.jsonl" --batch 1 --prefill-chunk 3 $pol
  same "$T/p$tag.a.jsonl" "$T/p$tag.b.jsonl" "$pol: batch 5 on 2 threads == batch 1 chunked"
  differ "$T/alone.jsonl" "$T/p$tag.a.jsonl" "control: $pol vs the default policy"
done

# ranks and layer maps
MPIRUN=(mpirun --oversubscribe --bind-to none)
prun() { # prun N OUT extra-args...
  local n="$1" out="$2"; shift 2
  timeout 300 "${MPIRUN[@]}" -np "$n" "$PIPEDEC" run --model "$m" --pages "$P" --out "$out" --batch 3 --digest "$@" \
    >>"$T/run.log" 2>&1 || { fail "mpirun -np $n $* exited non-zero"; tail -5 "$T/run.log"; }
}
declare -A MAPS=(
  [1]="0-4"
  [2]="0,1-4 0-2,3-4"
  [3]="0,1,2-4 0-1,2-3,4"
  [4]="0,1,2,3-4 0-1,2,3,4"
)
for n in 1 2 3 4; do
  prun "$n" "$T/np$n.auto.jsonl"
  same "$T/alone.jsonl" "$T/np$n.auto.jsonl" "np $n, default map == one rank"
  for map in ${MAPS[$n]}; do
    prun "$n" "$T/np$n.$map.jsonl" --layers "$map" --prefill-chunk 4
    same "$T/alone.jsonl" "$T/np$n.$map.jsonl" "np $n, --layers $map, chunk 4 == one rank"
  done
done

# loader errors reach the user
cp "$m" "$T/bad.gguf"
python3 - "$T/bad.gguf" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
k = b"deepseek.expert_used_count"; i = b.index(k) + len(k)
assert b[i:i + 4] == (4).to_bytes(4, "little")  # GGUF u32
b[i + 4:i + 8] = (9).to_bytes(4, "little")
open(p, "wb").write(b)
PY
expect_fail "expert_used_count > expert_count is refused" "expert_used_count 9: expected 1..expert_count 8" \
  "$PIPEDEC" run --model "$T/bad.gguf" --pages "$P" --out "$T/bad.jsonl"
expect_fail "mkmodel refuses --experts-used > --experts" "experts-used 9" \
  "$PIPEDEC" mkmodel --arch deepseek --layers 2 --hidden 64 --heads 4 --kv-heads 4 --vocab 320 --experts 8 \
  --experts-used 9 --out "$T/x.gguf"
expect_fail "expert flags need --arch deepseek" "need --arch deepseek" \
  "$PIPEDEC" mkmodel --arch llama --experts 8 --out "$T/x.gguf"
# expert tensors stored as F16, BF16 and Q8_0 (mkmodel --type): same invariance,
# and each type really changes the logits (other digests than f32)
for dt in f16 bf16 q8_0; do
  "$PIPEDEC" mkmodel --arch deepseek --layers 4 --hidden 64 --heads 4 --kv-heads 4 --ffn 96 --vocab 320 \
    --ctx 2048 --dense-layers 1 --experts 8 --experts-used 2 --expert-ffn 32 --shared 1 --seed 17 --type "$dt" \
    --out "$T/ds.$dt.gguf" >"$T/mk.$dt.log"
  grep -q "$dt" "$T/mk.$dt.log" && pass "mkmodel --type $dt" || fail "mkmodel --type $dt: $(cat "$T/mk.$dt.log")"
  "$PIPEDEC" run --model "$T/ds.$dt.gguf" --pages "$P" --digest --out "$T/$dt.1.jsonl" --batch 1 >>"$T/run.log" 2>&1
  "${MPIRUN[@]}" -np 3 "$PIPEDEC" run --model "$T/ds.$dt.gguf" --pages "$P" --digest --out "$T/$dt.3.jsonl" \
    --batch 5 --threads 2 --prefill-chunk 4 >>"$T/run.log" 2>&1 </dev/null
  same "$T/$dt.1.jsonl" "$T/$dt.3.jsonl" "$dt experts: 3 ranks, batch 5, 2 threads, chunks of 4 == one rank, batch 1"
done
"$PIPEDEC" mkmodel --arch deepseek --layers 4 --hidden 64 --heads 4 --kv-heads 4 --ffn 96 --vocab 320 \
  --ctx 2048 --dense-layers 1 --experts 8 --experts-used 2 --expert-ffn 32 --shared 1 --seed 17 \
  --out "$T/ds.f32.gguf" >/dev/null
"$PIPEDEC" run --model "$T/ds.f32.gguf" --pages "$P" --digest --out "$T/f32.1.jsonl" --batch 1 >>"$T/run.log" 2>&1
differ "$T/f32.1.jsonl" "$T/q8_0.1.jsonl" "q8_0 experts change the logits (negative control)"
expect_fail "mkmodel --dtype q8_0 with a width not a multiple of 32" "expert-ffn 20 is not a multiple of 32" \
  "$PIPEDEC" mkmodel --arch deepseek --layers 2 --hidden 64 --heads 4 --kv-heads 4 --ffn 96 --vocab 320 \
  --experts 4 --experts-used 2 --expert-ffn 20 --shared 1 --dtype q8_0 --out "$T/bad.gguf"
finish
