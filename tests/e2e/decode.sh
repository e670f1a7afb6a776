#!/usr/bin/env bash
# End to end on one rank (issue 4): synthetic llama (GQA) and qwen2 (MHA)
# models; every page's output, logit digests included, is byte-identical
# decoded alone, in batches of 2..16, with 1 and 2 threads and prefill chunks
# of 1, 7 and whole; full attention equals rswa:W while generation stays under
# W; q8 KV, window and eviction policies are batch/chunk invariant and report
# memory; reruns resume without duplicates. Negative controls (issue 9): every
# policy flag changes the digests against the default, and OpenBLAS (not batch
# invariant) gives other digests at batch 1 than at batch 5, so the identity
# checks are known to see a bit-level difference. Every ISA's kernels
# (PD_ISA scalar, avx2, avx512, as far as the CPU has them) give the same
# digests on f32, F16 and Q8_0 weights.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"

run() { "$PIPEDEC" run --digest "$@" >>"$T/run.log" 2>&1; }

for arch in llama qwen2; do
  if [ "$arch" = llama ]; then kv=2; else kv=4; fi
  m="$T/$arch.gguf"
  "$PIPEDEC" mkmodel --arch "$arch" --layers 3 --hidden 64 --heads 4 --kv-heads "$kv" --ffn 96 \
    --vocab 320 --seed 11 --out "$m" >/dev/null
  "$PIPEDEC" mkpages --model "$m" --count 9 --embed-rows 12 --prompt-tokens 3 --max-new 20 \
    --seed 5 --mixed --out "$T/$arch-pages" >/dev/null
  P="$T/$arch-pages/pages.jsonl"
  run --model "$m" --pages "$P" --out "$T/$arch.alone.jsonl" --batch 1
  n=$(wc -l < "$T/$arch.alone.jsonl")
  if [ "$n" -eq 9 ]; then pass "$arch: 9 pages written"; else fail "$arch: $n pages written"; fi
  for b in 2 5 16; do
    run --model "$m" --pages "$P" --out "$T/$arch.b$b.jsonl" --batch "$b"
    same "$T/$arch.alone.jsonl" "$T/$arch.b$b.jsonl" "$arch: batch $b == alone"
  done
  run --model "$m" --pages "$P" --out "$T/$arch.t2.jsonl" --batch 4 --threads 2
  same "$T/$arch.alone.jsonl" "$T/$arch.t2.jsonl" "$arch: 2 threads == alone"
  for c in 1 7; do
    run --model "$m" --pages "$P" --out "$T/$arch.c$c.jsonl" --batch 3 --prefill-chunk "$c"
    same "$T/$arch.alone.jsonl" "$T/$arch.c$c.jsonl" "$arch: prefill chunk $c == whole"
  done
  run --model "$m" --pages "$P" --out "$T/$arch.rswa.jsonl" --batch 4 --attn rswa:32
  same "$T/$arch.alone.jsonl" "$T/$arch.rswa.jsonl" "$arch: rswa:32 == full while generation < 32"
  run --model "$m" --pages "$P" --out "$T/$arch.rswa4.jsonl" --batch 1 --attn rswa:4
  run --model "$m" --pages "$P" --out "$T/$arch.rswa4b.jsonl" --batch 6 --prefill-chunk 5 --attn rswa:4
  same "$T/$arch.rswa4.jsonl" "$T/$arch.rswa4b.jsonl" "$arch: rswa:4 (wrapping) batch/chunk invariant"
  run --model "$m" --pages "$P" --out "$T/$arch.q8.jsonl" --batch 4 --kv q8 --stats "$T/$arch.q8.stats"
  run --model "$m" --pages "$P" --out "$T/$arch.q8b.jsonl" --batch 1 --kv q8 --prefill-chunk 3
  same "$T/$arch.q8.jsonl" "$T/$arch.q8b.jsonl" "$arch: q8 KV batch/chunk invariant"
  run --model "$m" --pages "$P" --out "$T/$arch.f32s.jsonl" --batch 4 --stats "$T/$arch.f32.stats"
  if python3 - "$T/$arch.q8.stats" "$T/$arch.f32.stats" <<'PY'
import json, sys
q8, f32 = (json.load(open(p))["stages"][0]["attention_bytes_peak"] for p in sys.argv[1:3])
print(f"    q8 KV attention bytes peak {q8:.0f} vs f32 {f32:.0f} ({q8 / f32:.2f}x)")
sys.exit(0 if 0 < q8 < 0.5 * f32 else 1)
PY
  then pass "$arch: q8 run reports its memory, under half of f32"; else fail "$arch: q8 memory report"; fi
  run --model "$m" --pages "$P" --out "$T/$arch.win.jsonl" --batch 4 --attn window:8
  run --model "$m" --pages "$P" --out "$T/$arch.win1.jsonl" --batch 1 --attn window:8 --prefill-chunk 2
  same "$T/$arch.win.jsonl" "$T/$arch.win1.jsonl" "$arch: window:8 batch/chunk invariant"
  run --model "$m" --pages "$P" --out "$T/$arch.ev.jsonl" --batch 4 --evict importance:16:2
  run --model "$m" --pages "$P" --out "$T/$arch.ev1.jsonl" --batch 1 --evict importance:16:2 --prefill-chunk 4
  same "$T/$arch.ev.jsonl" "$T/$arch.ev1.jsonl" "$arch: importance eviction batch/chunk invariant"
  run --model "$m" --pages "$P" --out "$T/$arch.temp.jsonl" --batch 4 --sample temp:0.8,top_p:0.9,top_k:40 --seed 3
  run --model "$m" --pages "$P" --out "$T/$arch.temp1.jsonl" --batch 1 --sample temp:0.8,top_p:0.9,top_k:40 --seed 3
  same "$T/$arch.temp.jsonl" "$T/$arch.temp1.jsonl" "$arch: seeded sampling batch invariant"
  run --model "$m" --pages "$P" --out "$T/$arch.ng.jsonl" --batch 4 --no-repeat-ngram 2:16
  run --model "$m" --pages "$P" --out "$T/$arch.ng1.jsonl" --batch 1 --no-repeat-ngram 2:16 --prefill-chunk 5
  same "$T/$arch.ng.jsonl" "$T/$arch.ng1.jsonl" "$arch: no-repeat n-gram ban batch invariant"
  if python3 - "$T/$arch.ng.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    t = json.loads(line)["tokens"]
    # token i+1 was chosen with L = i+1 tokens generated: no bigram lying in
    # the last 16 of them may be completed again
    for i in range(len(t) - 1):
        L = i + 1
        for j in range(max(0, L - 16), L - 1):
            assert (t[j], t[j + 1]) != (t[i], t[i + 1]), (t, i, j)
PY
  then pass "$arch: no bigram repeats within the window under --no-repeat-ngram 2:16"; else fail "$arch: a bigram repeated despite the ban"; fi
  # OpenBLAS is not batch invariant, but it decodes the same pages
  run --model "$m" --pages "$P" --out "$T/$arch.blas.jsonl" --batch 4 --gemm openblas
  [ "$(wc -l < "$T/$arch.blas.jsonl")" -eq 9 ] && pass "$arch: --gemm openblas decodes every page" || fail "$arch: --gemm openblas"

  # negative controls: each of these must change the digests, or the flag
  # (or the digest) is being ignored
  run --model "$m" --pages "$P" --out "$T/$arch.blas1.jsonl" --batch 1 --gemm openblas
  run --model "$m" --pages "$P" --out "$T/$arch.blas5.jsonl" --batch 5 --gemm openblas
  differ "$T/$arch.blas1.jsonl" "$T/$arch.blas5.jsonl" "$arch: control: --gemm openblas batch 1 vs 5"
  differ "$T/$arch.alone.jsonl" "$T/$arch.q8.jsonl" "$arch: control: --kv q8 vs f32"
  differ "$T/$arch.alone.jsonl" "$T/$arch.win.jsonl" "$arch: control: --attn window:8 vs full"
  differ "$T/$arch.alone.jsonl" "$T/$arch.rswa4.jsonl" "$arch: control: --attn rswa:4 (ring wraps) vs full"
  differ "$T/$arch.alone.jsonl" "$T/$arch.ev.jsonl" "$arch: control: --evict importance:16:2 vs none"
  differ "$T/$arch.alone.jsonl" "$T/$arch.ng.jsonl" "$arch: control: --no-repeat-ngram 2:16 vs none"
  differ "$T/$arch.alone.jsonl" "$T/$arch.temp.jsonl" "$arch: control: --sample temp:0.8 vs greedy"
  run --model "$m" --pages "$P" --out "$T/$arch.rec.jsonl" --batch 4 --evict recent:16
  run --model "$m" --pages "$P" --out "$T/$arch.rec1.jsonl" --batch 1 --evict recent:16 --prefill-chunk 3
  same "$T/$arch.rec.jsonl" "$T/$arch.rec1.jsonl" "$arch: recent eviction batch/chunk invariant"
  differ "$T/$arch.alone.jsonl" "$T/$arch.rec.jsonl" "$arch: control: --evict recent:16 vs none"
  differ "$T/$arch.ev.jsonl" "$T/$arch.rec.jsonl" "$arch: control: --evict importance:16:2 vs recent:16"
  # every budget >= 1 holds: recent:1 keeps only the row being decoded
  run --model "$m" --pages "$P" --out "$T/$arch.rec1a.jsonl" --batch 4 --evict recent:1 --stats "$T/$arch.rec1.stats"
  run --model "$m" --pages "$P" --out "$T/$arch.rec1b.jsonl" --batch 1 --evict recent:1 --prefill-chunk 3
  same "$T/$arch.rec1a.jsonl" "$T/$arch.rec1b.jsonl" "$arch: recent:1 batch/chunk invariant"
  differ "$T/$arch.alone.jsonl" "$T/$arch.rec1a.jsonl" "$arch: control: --evict recent:1 vs none"
  run --model "$m" --pages "$P" --out "$T/$arch.q8k.jsonl" --batch 4 --kv q8k
  run --model "$m" --pages "$P" --out "$T/$arch.q8k1.jsonl" --batch 1 --kv q8k --prefill-chunk 2
  same "$T/$arch.q8k.jsonl" "$T/$arch.q8k1.jsonl" "$arch: q8k KV batch/chunk invariant"
  differ "$T/$arch.alone.jsonl" "$T/$arch.q8k.jsonl" "$arch: control: --kv q8k vs f32"
  differ "$T/$arch.q8k.jsonl" "$T/$arch.q8.jsonl" "$arch: control: --kv q8k vs q8"
  for sinks in 0 15 16; do
    run --model "$m" --pages "$P" --out "$T/$arch.evs$sinks.jsonl" --batch 4 --evict "importance:16:$sinks"
    run --model "$m" --pages "$P" --out "$T/$arch.evs${sinks}b.jsonl" --batch 1 --evict "importance:16:$sinks" --prefill-chunk 5
    same "$T/$arch.evs$sinks.jsonl" "$T/$arch.evs${sinks}b.jsonl" "$arch: importance:16:$sinks batch/chunk invariant"
  done
  differ "$T/$arch.evs0.jsonl" "$T/$arch.evs15.jsonl" "$arch: control: importance sinks 15 vs 0 (N-1 sinks are kept)"
  # sinks are clamped to what a decode step keeps (budget - its rows), the
  # cache library's rule: 16 sinks of a 16-row budget keep what 15 keep
  same "$T/$arch.evs15.jsonl" "$T/$arch.evs16.jsonl" "$arch: importance sinks N == N-1 (clamped to the budget)"
done

# every ISA's kernels give the same bits (ARCHITECTURE.md section 8): each
# PD_ISA level the CPU has, on f32, F16 and Q8_0 weights, in batches that take
# the GEMM's row, tile and blocked paths (3 pages of 23 prefill rows: 69 rows) (K 64 and 320: one chunk, and a
# chunk and a part); the log names the kernels each run used
for dt in f32 f16 q8_0; do
  mi="$T/isa-$dt.gguf"
  "$PIPEDEC" mkmodel --arch llama --dtype "$dt" --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 320 \
    --vocab 320 --seed 13 --out "$mi" >/dev/null
  "$PIPEDEC" mkpages --model "$mi" --count 3 --embed-rows 20 --prompt-tokens 3 --max-new 6 --seed 4 \
    --mixed --out "$T/isa-$dt-pages" >/dev/null
  used=""
  for isa in scalar avx2 avx512; do
    for b in 1 3; do
      PD_ISA="$isa" "$PIPEDEC" run --digest --model "$mi" --pages "$T/isa-$dt-pages/pages.jsonl" \
        --out "$T/isa.$dt.$isa.b$b.jsonl" --batch "$b" >"$T/isa.$dt.$isa.b$b.log" 2>&1 \
        || fail "$dt: PD_ISA=$isa --batch $b exited non-zero"
    done
    k=$(grep -o "kernels [a-z0-9]* on every rank" "$T/isa.$dt.$isa.b1.log" | cut -d' ' -f2)
    case " $used " in *" $k "*) ;; *) used="$used $k" ;; esac
    same "$T/isa.$dt.scalar.b1.jsonl" "$T/isa.$dt.$isa.b1.jsonl" "$dt: PD_ISA=$isa ($k kernels) batch 1 == scalar"
    same "$T/isa.$dt.scalar.b1.jsonl" "$T/isa.$dt.$isa.b3.jsonl" "$dt: PD_ISA=$isa ($k kernels) batch 3 == scalar batch 1"
  done
  echo "    $dt: kernels run:$used (the CPU's best: $(grep -o "kernels [a-z0-9]*" "$T/isa.$dt.avx512.b1.log" | cut -d' ' -f2))"
done

# resume: a rerun with the same --out skips finished pages and appends nothing
m="$T/llama.gguf"; P="$T/llama-pages/pages.jsonl"
cp "$T/llama.alone.jsonl" "$T/resume.jsonl"
run --model "$m" --pages "$P" --out "$T/resume.jsonl" --batch 4
same "$T/llama.alone.jsonl" "$T/resume.jsonl" "rerun with a complete output changes nothing"
head -n 4 "$T/llama.alone.jsonl" > "$T/partial.jsonl"
sed -n 5p "$T/llama.alone.jsonl" | head -c 25 >> "$T/partial.jsonl"   # a torn line from a killed run
run --model "$m" --pages "$P" --out "$T/partial.jsonl" --batch 4
if [ "$(wc -l < "$T/partial.jsonl")" -eq 9 ] && [ "$(sort "$T/partial.jsonl" | md5sum)" = "$(sort "$T/llama.alone.jsonl" | md5sum)" ]; then
  pass "resume after a torn line completes every page exactly once"
else
  fail "resume after a torn line"
fi
finish
