#!/usr/bin/env bash
# The README's main job: installs what is missing, builds, renders the bundled
# OCR pages (models/ocr-demo.txt: prose, a table, numbers) through the glyph
# encoder, decodes them with the shipped trained decoder (models/ocr-tiny.gguf)
# over several MPI ranks, and prints the recognized text of every page and its
# character error rate against the text it was rendered from.
# usage: scripts/demo.sh [OUT_DIR]        (default: out/demo)
# env:   PD_RANKS (default 2), PD_BATCH (default 4), PD_BUILD (default build)
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
out="${1:-$src/out/demo}"
build="${PD_BUILD:-$src/build}"
ranks="${PD_RANKS:-2}"
model="$src/models/ocr-tiny.gguf"
text="$src/models/ocr-demo.txt"

"$src/scripts/setup.sh"
"$src/scripts/build.sh" "$build" >/dev/null
bin="$build/pipedec"
mkdir -p "$out"
rm -rf "$out/pages"
"$bin" render --text "$text" --model "$model" --out "$out/pages"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# one node: shared memory, and the ob1 layer that drives it (the default
# first tries Omni-Path, whose library sleeps ~0.2 s in every rank's start)
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}"
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
rm -f "$out/out.jsonl"
# --bind-to none: pipedec places the ranks itself (one per NUMA node where
# there are several); on one node they take turns with all its cores rather
# than each bound to one core by Open MPI's default, which keeps a pipeline
mpirun -np "$ranks" --oversubscribe --bind-to none "$bin" run --model "$model" --pages "$out/pages/pages.jsonl" \
  --out "$out/out.jsonl" --batch "${PD_BATCH:-4}" --stats "$out/stats.json"
python3 - "$out/out.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    page = json.loads(line)
    print("---- page %s (%d tokens, stop: %s) ----" % (page["id"], page["generated"], page["stop"]))
    print(page.get("text", page.get("error", "")), end="")
PY
echo "----"
"$bin" score --pages "$out/pages/pages.jsonl" --out "$out/out.jsonl" --truth "$text"
echo "demo: output $out/out.jsonl ($(wc -l < "$out/out.jsonl") pages), stats $out/stats.json"
