#!/usr/bin/env bash
# Byte-compares what two pipedec binaries decode, for refactorings that must
# not change an answer: 28 configurations (1-4 ranks, every cache policy,
# f16 wire, sampling, OpenBLAS, speculation, a DeepSeek MoE, threads,
# prefill chunks), outputs with digests. Exits 1 naming every configuration
# whose out.jsonl differs.
# usage: scripts/compare_outputs.sh OLD_PIPEDEC NEW_PIPEDEC [WORK_DIR]
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: scripts/compare_outputs.sh OLD_PIPEDEC NEW_PIPEDEC [WORK_DIR]" >&2; exit 2; }
old="$(realpath "$1")"; new="$(realpath "$2")"
work="${3:-$(mktemp -d "${TMPDIR:-/tmp}/pd-compare.XXXXXX")}"
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader \
       OMPI_MCA_btl_vader_single_copy_mechanism=none OMPI_MCA_pml=ob1 OMPI_MCA_rmaps_base_oversubscribe=1
"$old" mkmodel --arch llama --layers 4 --hidden 64 --heads 4 --kv-heads 2 --ffn 96 --vocab 320 --seed 8 \
  --out "$work/m.gguf" >/dev/null
"$old" mkmodel --arch deepseek --layers 3 --hidden 64 --heads 4 --kv-heads 4 --ffn 96 --vocab 320 --experts 8 \
  --experts-used 2 --expert-ffn 32 --shared 1 --dense-layers 1 --seed 5 --out "$work/moe.gguf" >/dev/null
"$old" mkpages --model "$work/m.gguf" --count 12 --embed-rows 10 --prompt-tokens 3 --max-new 40 --seed 6 \
  --out "$work/pages" >/dev/null
configs=(
  "1|m|" "2|m|" "3|m|" "4|m|"
  "2|m|--attn rswa:8" "3|m|--attn window:12" "2|m|--kv q8" "3|m|--kv q8k" "2|m|--kv q8v"
  "2|m|--evict recent:16" "3|m|--evict importance:16:2" "2|m|--wire-dtype f16" "3|m|--wire-dtype f16"
  "2|m|--sample temp:0.8,top_p:0.9,top_k:40 --seed 3" "1|m|--gemm openblas" "2|m|--draft ngram:1:4"
  "3|m|--draft ngram:1:4 --draft-async" "2|m|--draft model:m.gguf:2" "1|moe|" "2|moe|" "3|moe|--kv q8"
  "1|m|--threads 2" "2|m|--prefill-chunk 3" "2|m|--micro-batches pipeline" "3|m|--micro-batches 2"
  "2|m|--layers 0,1-3" "1|m|--no-repeat-ngram 3:32" "2|m|--batch 1"
)
bad=0
for i in "${!configs[@]}"; do
  IFS='|' read -r n model extra <<<"${configs[$i]}"
  extra="${extra//m.gguf/$work/m.gguf}"
  for which in old new; do
    bin="$old"; [ "$which" = new ] && bin="$new"
    out="$work/c$i.$which.jsonl"; rm -f "$out"
    cmd=("$bin" run --model "$work/$model.gguf" --pages "$work/pages/pages.jsonl" --out "$out" --batch 3 --digest)
    # shellcheck disable=SC2206
    cmd+=($extra)
    [ "$n" -gt 1 ] && cmd=(mpirun --oversubscribe --bind-to none -np "$n" "${cmd[@]}")
    "${cmd[@]}" >"$out.log" 2>&1 </dev/null || { echo "config $i ($n ranks, $model, $extra): $which exited non-zero"; tail -2 "$out.log"; bad=$((bad + 1)); }
  done
  if cmp -s "$work/c$i.old.jsonl" "$work/c$i.new.jsonl" && [ -s "$work/c$i.old.jsonl" ]; then
    echo "same  config $i: $n rank(s), $model $extra"
  else
    echo "DIFF  config $i: $n rank(s), $model $extra"; bad=$((bad + 1))
  fi
done
echo "compare_outputs: ${#configs[@]} configurations, $bad differ or failed"
[ "$bad" -eq 0 ]
