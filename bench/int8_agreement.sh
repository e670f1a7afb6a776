#!/usr/bin/env bash
# How far `--gemm int8` agrees with the exact arithmetic (issue 39). For each
# quantized file, every page is decoded greedily twice, exact and int8, and
# the tokens compared: pages identical, and where a page first differs, the
# token index and the exact run's logit margin there (its best minus its
# second-best logit, from the tail's PD_TRACE_MARGINS trace), which says how
# close to a tie the exact choice was. Files:
#   ocr      the shipped OCR model (models/ocr-tiny.gguf, f16) quantized by
#            llama.cpp's llama-quantize to Q8_0, Q4_0, Q5_0 and Q4_K_M (its
#            128-wide rows take llama-quantize's fallbacks), on the held-out
#            and demo pages rendered as bench/ocr_quality.sh does; also the
#            character error rate of each arithmetic (`pipedec score`)
#   random   random deepseek2-ocr models (mkmodel, hidden 256, 8 experts of
#            64, top 2) in q8_0, q4_0, q5_0, q4_k, q5_k and q6_k, 16 pages of
#            48 new tokens
# Prints one JSON object. Needs LLAMA_CPP_PREFIX (llama-quantize) for the OCR
# part; without it only the random part runs.
# usage: bench/int8_agreement.sh BUILD_DIR [WORK_DIR]
set -euo pipefail
build="${1:?usage: bench/int8_agreement.sh BUILD_DIR [WORK_DIR]}"
src="$(cd "$(dirname "$0")/.." && pwd)"
work="${2:-$(mktemp -d "${TMPDIR:-/tmp}/pd-bench-int8.XXXXXX")}"
P="$build/pipedec"
mkdir -p "$work"
: >"$work/cases.txt"

# decode NAME MODEL PAGES [TRUTH]: exact and int8 runs with margin traces
decode() {
  local name="$1" model="$2" pages="$3" truth="${4:-}"
  for g in invariant int8; do
    rm -f "$work/$name.$g.jsonl" "$work/$name.$g.margins"
    PD_TRACE_MARGINS="$work/$name.$g.margins" "$P" run --model "$model" --pages "$pages" --out "$work/$name.$g.jsonl" \
      --batch 8 --gemm "$g" >/dev/null 2>"$work/$name.$g.err" \
      || { echo "int8_agreement: $name --gemm $g failed: $(tail -1 "$work/$name.$g.err")" >&2; exit 1; }
    if [ -n "$truth" ]; then
      "$P" score --pages "$pages" --out "$work/$name.$g.jsonl" --truth "$truth" --json >"$work/$name.$g.score"
    fi
  done
  echo "$name $pages" >>"$work/cases.txt"
}

if [ -n "${LLAMA_CPP_PREFIX:-}" ]; then
  export LD_LIBRARY_PATH="$LLAMA_CPP_PREFIX/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  { cat "$src/tests/data/ocr/heldout.txt"; printf '\f'; cat "$src/models/ocr-demo.txt"; } >"$work/text.txt"
  rm -rf "$work/ocrpages"
  "$P" render --text "$work/text.txt" --model "$src/models/ocr-tiny.gguf" --out "$work/ocrpages" >/dev/null
  for q in Q8_0 Q4_0 Q5_0 Q4_K_M; do
    "$LLAMA_CPP_PREFIX/bin/llama-quantize" "$src/models/ocr-tiny.gguf" "$work/ocr.$q.gguf" "$q" 1 \
      >"$work/quantize.$q.log" 2>&1 || { echo "int8_agreement: llama-quantize $q failed: see $work/quantize.$q.log" >&2; exit 1; }
    decode "ocr.$q" "$work/ocr.$q.gguf" "$work/ocrpages/pages.jsonl" "$work/text.txt"
  done
else
  echo "int8_agreement: LLAMA_CPP_PREFIX unset: the OCR model part needs llama-quantize; random models only" >&2
fi

for dt in q8_0 q4_0 q5_0 q4_k q5_k q6_k; do
  m="$work/rand.$dt.gguf"
  "$P" mkmodel --arch deepseek2-ocr --layers 4 --hidden 256 --heads 2 --kv-heads 2 --ffn 512 --vocab 512 --ctx 2048 \
    --dense-layers 1 --experts 8 --experts-used 2 --expert-ffn 64 --shared 1 --seed 31 --dtype "$dt" --out "$m" >/dev/null
  [ -f "$work/randpages/pages.jsonl" ] || "$P" mkpages --model "$m" --count 16 --embed-rows 8 --prompt-tokens 4 \
    --max-new 48 --seed 9 --mixed --out "$work/randpages" >/dev/null
  decode "rand.$dt" "$m" "$work/randpages/pages.jsonl"
done

python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]

def fnv(s):
    h = 0xcbf29ce484222325
    for b in s.encode():
        h = ((h ^ b) * 0x100000001b3) & 0xffffffffffffffff
    return h

def margins(path):
    m = {}
    for line in open(path):
        k, i, tok, mg = line.split()
        m[(int(k, 16), int(i))] = (int(tok), float(mg))
    return m

cases = []
for line in open(f"{work}/cases.txt"):
    name, pages = line.split()
    ex = {o["id"]: o for o in map(json.loads, open(f"{work}/{name}.invariant.jsonl"))}
    i8 = {o["id"]: o for o in map(json.loads, open(f"{work}/{name}.int8.jsonl"))}
    mex = margins(f"{work}/{name}.invariant.margins")
    all_margins = sorted(v[1] for v in mex.values())
    same, divs = 0, []
    for pid, a in ex.items():
        b = i8[pid]
        if a["tokens"] == b["tokens"]:
            same += 1
            continue
        t = next((i for i, (x, y) in enumerate(zip(a["tokens"], b["tokens"])) if x != y),
                 min(len(a["tokens"]), len(b["tokens"])))
        tok, mg = mex.get((fnv(pid), t), (None, None))
        divs.append({"page": pid, "index": t, "of": len(a["tokens"]), "exact_margin": mg,
                     "margin_percentile": round(sum(x < mg for x in all_margins) / len(all_margins), 4)
                     if mg is not None else None})
    c = {"case": name, "pages": len(ex), "identical_pages": same,
         "tokens": sum(len(o["tokens"]) for o in ex.values()),
         "median_exact_margin": all_margins[len(all_margins) // 2] if all_margins else None,
         "first_divergences": divs}
    if os.path.exists(f"{work}/{name}.invariant.score"):
        c["cer_exact"] = json.load(open(f"{work}/{name}.invariant.score"))["overall"]["cer"]
        c["cer_int8"] = json.load(open(f"{work}/{name}.int8.score"))["overall"]["cer"]
    cases.append(c)
print(json.dumps({"bench": "int8_agreement", "cases": cases}, indent=1))
PY
