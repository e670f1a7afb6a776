#!/usr/bin/env bash
# --gemm int8 end to end (issue 39): on small random deepseek2-ocr models in
# every quantized type mkmodel writes, the int8 arithmetic (activations
# quantized per 32 values, integer block sums; gemm.h) gives byte-identical
# out.jsonl, logit digests included, alone, batched on 2 threads, prefill-
# chunked, with n-gram drafts, over 3 ranks and resumed from a checkpoint;
# its digests differ from the exact arithmetic's (it is in force), and a
# checkpoint written under one arithmetic is not resumed under the other.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
MPIRUN=(mpirun --oversubscribe --bind-to none)

for dt in q8_0 q4_0 q5_0 q4_k q5_k q6_k; do
  m="$T/ocr.$dt.gguf"
  "$PIPEDEC" mkmodel --arch deepseek2-ocr --layers 3 --hidden 256 --heads 2 --kv-heads 2 --ffn 512 --vocab 320 \
    --ctx 2048 --dense-layers 1 --experts 8 --experts-used 2 --expert-ffn 64 --shared 1 --seed 23 --dtype "$dt" \
    --out "$m" >"$T/mk.$dt.log" || { fail "mkmodel --dtype $dt: $(cat "$T/mk.$dt.log")"; continue; }
  if [ ! -f "$T/pages/pages.jsonl" ]; then
    "$PIPEDEC" mkpages --model "$m" --count 6 --embed-rows 6 --prompt-tokens 3 --max-new 12 --seed 5 \
      --mixed --out "$T/pages" >/dev/null
  fi
  P="$T/pages/pages.jsonl"
  run() { "$PIPEDEC" run --model "$m" --pages "$P" --digest "$@" >>"$T/run.log" 2>&1 </dev/null \
            || fail "$dt: run $* exited non-zero"; }
  run --gemm int8 --out "$T/$dt.alone.jsonl" --batch 1
  [ "$(wc -l < "$T/$dt.alone.jsonl")" -eq 6 ] && pass "$dt: 6 pages decoded with --gemm int8" || fail "$dt: pages"
  run --gemm int8 --out "$T/$dt.b6.jsonl" --batch 6 --threads 2
  same "$T/$dt.alone.jsonl" "$T/$dt.b6.jsonl" "$dt int8: batch 6 on 2 threads == batch 1"
  run --gemm int8 --out "$T/$dt.c2.jsonl" --batch 3 --prefill-chunk 2
  same "$T/$dt.alone.jsonl" "$T/$dt.c2.jsonl" "$dt int8: prefill chunks of 2 == whole"
  run --gemm int8 --out "$T/$dt.spec.jsonl" --batch 3 --draft ngram:1:6
  same "$T/$dt.alone.jsonl" "$T/$dt.spec.jsonl" "$dt int8: --draft ngram:1:6 == alone"
  timeout 300 "${MPIRUN[@]}" -np 3 "$PIPEDEC" run --model "$m" --pages "$P" --digest --gemm int8 --batch 3 \
    --threads 2 --prefill-chunk 4 --out "$T/$dt.np3.jsonl" >>"$T/run.log" 2>&1 </dev/null \
    || fail "$dt: mpirun -np 3 exited non-zero"
  same "$T/$dt.alone.jsonl" "$T/$dt.np3.jsonl" "$dt int8: 3 ranks, 2 threads, chunks of 4 == one rank"
  run --out "$T/$dt.exact.jsonl" --batch 1
  differ "$T/$dt.alone.jsonl" "$T/$dt.exact.jsonl" "$dt: --gemm int8 vs the exact arithmetic (digests)"
done

# a checkpoint records the arithmetic: a job stopped by SIGUSR2 (checkpoint,
# exit 75) resumed under int8 gives the uninterrupted bytes; under the exact
# arithmetic it is refused, naming it
m="$T/ocr.q4_k.gguf"; d="$T/ck.d"
"$PIPEDEC" mkpages --model "$m" --count 200 --embed-rows 6 --prompt-tokens 3 --max-new 12 --seed 6 \
  --out "$T/many" >/dev/null
PM="$T/many/pages.jsonl"
"$PIPEDEC" run --model "$m" --pages "$PM" --digest --gemm int8 --batch 3 --out "$T/many.ref.jsonl" \
  >>"$T/run.log" 2>&1 </dev/null || fail "int8: the uninterrupted run"
out="$T/ck.jsonl"
( rc=0; timeout 300 "$PIPEDEC" run --model "$m" --pages "$PM" --digest --gemm int8 --batch 3 --checkpoint-dir "$d" \
    --pid-file "$out.pids" --out "$out" >"$out.log" 2>&1 </dev/null || rc=$?; echo "$rc" > "$out.rc" ) &
job=$!
for _ in $(seq 1 3000); do [ -s "$out" ] && [ -s "$out.pids" ] && break; sleep 0.01; done
kill -USR2 "$(rank_pid "$out" 0)" 2>/dev/null || true
wait "$job" || true
if [ "$(cat "$out.rc")" = 75 ] && ls -d "$d"/ckpt-* >/dev/null 2>&1; then
  pass "int8: SIGUSR2 checkpointed and stopped (exit 75) after $(wc -l < "$out") of 200 pages"
  expect_fail "an int8 checkpoint resumed under --gemm invariant" "gemm" \
    "$PIPEDEC" run --model "$m" --pages "$PM" --digest --batch 3 --checkpoint-dir "$d" --out "$out"
  "$PIPEDEC" run --model "$m" --pages "$PM" --digest --gemm int8 --batch 3 --checkpoint-dir "$d" \
    --out "$out" >>"$T/run.log" 2>&1 </dev/null || fail "int8 resume exited non-zero"
  same "$T/many.ref.jsonl" "$out" "int8: stopped and resumed == uninterrupted"
else
  echo "note: the job ended (exit $(cat "$out.rc")) before SIGUSR2 could stop it; checkpoint part not run"
  fail "int8: no checkpoint stop (exit $(cat "$out.rc"))"
fi
finish
