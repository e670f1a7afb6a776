#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, generates the
# bundled default model and pages (deterministic), and decodes them over
# several MPI ranks, printing the placement, a summary and where the output is.
# usage: scripts/demo.sh [OUT_DIR]        (default: out/demo)
# env:   PD_RANKS (default 2), PD_BATCH (default 4), PD_BUILD (default build)
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$src/out/demo}"
build="${PD_BUILD:-$src/build}"
ranks="${PD_RANKS:-2}"

"$src/scripts/setup.sh"
"$src/scripts/build.sh" "$build" >/dev/null
bin="$build/pipedec"
mkdir -p "$out"

if [ ! -f "$out/model.gguf" ]; then
  "$bin" mkmodel --arch llama --layers 6 --hidden 256 --heads 8 --kv-heads 4 --ffn 704 \
    --vocab 4096 --ctx 4096 --seed 7 --out "$out/model.gguf"
fi
if [ ! -f "$out/pages/pages.jsonl" ]; then
  "$bin" mkpages --model "$out/model.gguf" --count 8 --embed-rows 64 --prompt-tokens 3 \
    --max-new 48 --seed 7 --mixed --out "$out/pages"
fi

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
rm -f "$out/out.jsonl"
mpirun -np "$ranks" --oversubscribe "$bin" run --model "$out/model.gguf" --pages "$out/pages/pages.jsonl" \
  --out "$out/out.jsonl" --batch "${PD_BATCH:-4}" --stats "$out/stats.json"
echo "demo: output $out/out.jsonl ($(wc -l < "$out/out.jsonl") pages), stats $out/stats.json"
echo "demo: first page: $(head -c 300 "$out/out.jsonl")"
