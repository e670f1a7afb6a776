#!/usr/bin/env bash
# OCR quality of every cache mode (issue 18). Decodes real text (the held-out
# pages of tests/data/ocr/heldout.txt and the demo pages of models/) with the
# shipped decoder models/ocr-tiny.gguf under each cache mode, one page at a
# time (--batch 1, so a stage's peak cache bytes are one page's), and prints
# one JSON object:
#   modes[]   {"mode", "flags", "cer", "edits", "ref_chars", "peak_cache_bytes"
#              (--stats cache_bytes_peak: allocated, summed over stages),
#              "peak_live_bytes" (attention_bytes_peak: live rows), and both
#              relative to full f32}
#   frontier  the modes no other mode beats in both memory and CER, by peak
#             allocated cache bytes (frontier) and by peak live rows' bytes
#             (frontier_live: what a bounded cache must hold; windows and
#             eviction bound this, while their allocation may stay larger)
#   spec      n-gram speculation (--draft ngram) on the same pages: drafted,
#             accepted, passes, acceptance = accepted / drafted, and the
#             output byte-compared with the run without drafting
#   spec_modes  the same for bounded caches (eviction, rings, int8; issue
#             40): per mode acceptance, tokens per pass (tokens / (decode
#             passes + pages), a page's first token coming from its prefill
#             pass) against 1 without drafting, and whether out.jsonl
#             (tokens and text) is identical to the mode's run without drafts
# and writes WORK/ocr_quality.txt (a table) and WORK/ocr_frontier.png (gnuplot;
# Debian's gnuplot-nox is installed when missing).
# usage: bench/ocr_quality.sh BUILD_DIR [WORK_DIR]
set -euo pipefail
build="${1:?usage: bench/ocr_quality.sh BUILD_DIR [WORK_DIR]}"
src="$(cd "$(dirname "$0")/.." && pwd)"
work="${2:-$(mktemp -d "${TMPDIR:-/tmp}/pd-bench-ocr.XXXXXX")}"
P="$build/pipedec"
model="$src/models/ocr-tiny.gguf"
mkdir -p "$work"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

# the pages: held-out text and the demo pages, one text
{ cat "$src/tests/data/ocr/heldout.txt"; printf '\f'; cat "$src/models/ocr-demo.txt"; } >"$work/text.txt"
rm -rf "$work/pages"
"$P" render --text "$work/text.txt" --model "$model" --out "$work/pages" >/dev/null

modes=(
  "full f32|--kv f32" "full q8|--kv q8" "full q8k|--kv q8k" "full q8v|--kv q8v"
  "rswa:16|--attn rswa:16" "rswa:64|--attn rswa:64" "rswa:128|--attn rswa:128"
  "window:64|--attn window:64" "window:128|--attn window:128" "window:192|--attn window:192"
  "window:224|--attn window:224" "window:256|--attn window:256"
  "recent:64|--evict recent:64" "recent:128|--evict recent:128" "recent:192|--evict recent:192"
  "recent:224|--evict recent:224" "recent:256|--evict recent:256"
  "importance:64:4|--evict importance:64:4" "importance:128:4|--evict importance:128:4"
  "importance:192:4|--evict importance:192:4" "importance:224:4|--evict importance:224:4"
  "importance:256:4|--evict importance:256:4"
  "window:256 q8|--attn window:256 --kv q8" "recent:224 q8|--evict recent:224 --kv q8"
  "rswa:16 q8|--attn rswa:16 --kv q8" "rswa:64 q8|--attn rswa:64 --kv q8" "rswa:128 q8|--attn rswa:128 --kv q8"
  "rswa:16 q8k|--attn rswa:16 --kv q8k" "rswa:16 q8v|--attn rswa:16 --kv q8v"
)
: >"$work/modes.jsonl"
for m in "${modes[@]}"; do
  name="${m%%|*}"; flags="${m#*|}"; tag="$(echo "$name" | tr ' :' '__')"
  rm -f "$work/$tag.jsonl"
  # shellcheck disable=SC2086
  "$P" run --model "$model" --pages "$work/pages/pages.jsonl" --out "$work/$tag.jsonl" --batch 1 \
    --stats "$work/$tag.stats" $flags >/dev/null 2>"$work/$tag.err" || { echo "ocr_quality: $name failed: $(tail -1 "$work/$tag.err")" >&2; continue; }
  "$P" score --pages "$work/pages/pages.jsonl" --out "$work/$tag.jsonl" --truth "$work/text.txt" --json >"$work/$tag.score"
  python3 - "$name" "$flags" "$work/$tag.score" "$work/$tag.stats" >>"$work/modes.jsonl" <<'PY'
import json, sys
name, flags, score, stats = sys.argv[1:5]
s = json.load(open(score))["overall"]
st = json.load(open(stats))
peak = sum(x["cache_bytes_peak"] for x in st["stages"])
live = sum(x["attention_bytes_peak"] for x in st["stages"])
print(json.dumps({"mode": name, "flags": flags, "cer": round(s["cer"], 6), "edits": s["edits"],
                  "ref_chars": s["ref_chars"], "peak_cache_bytes": peak, "peak_live_bytes": live}))
PY
done

# n-gram speculation on the same real text
rm -f "$work/spec.jsonl"
"$P" run --model "$model" --pages "$work/pages/pages.jsonl" --out "$work/spec.jsonl" --batch 1 --draft ngram \
  --stats "$work/spec.stats" >/dev/null 2>"$work/spec.err"
# and with the bounded caches (the mode's own run above is the reference)
spec_modes=(
  "full f32|--kv f32" "recent:224|--evict recent:224" "recent:128|--evict recent:128"
  "importance:192:4|--evict importance:192:4" "importance:256:4|--evict importance:256:4"
  "recent:224 q8|--evict recent:224 --kv q8" "rswa:16|--attn rswa:16" "rswa:16 q8|--attn rswa:16 --kv q8"
  "window:224|--attn window:224"
)
: >"$work/spec_modes.jsonl"
for m in "${spec_modes[@]}"; do
  name="${m%%|*}"; flags="${m#*|}"; tag="$(echo "$name" | tr ' :' '__')"
  rm -f "$work/$tag.spec.jsonl"
  # shellcheck disable=SC2086
  "$P" run --model "$model" --pages "$work/pages/pages.jsonl" --out "$work/$tag.spec.jsonl" --batch 1 --draft ngram \
    --stats "$work/$tag.spec.stats" $flags >/dev/null 2>"$work/$tag.spec.err" || { echo "ocr_quality: $name with drafts failed: $(tail -1 "$work/$tag.spec.err")" >&2; continue; }
  python3 - "$name" "$flags" "$work/$tag.spec.stats" "$work/$tag.spec.jsonl" "$work/$tag.jsonl" >>"$work/spec_modes.jsonl" <<'PY'
import json, sys
name, flags, stats, got, ref = sys.argv[1:6]
st = json.load(open(stats))
sp = st["spec"]
pages = st["pages_done"]
passes = st["stages"][0]["decode_rows"] - sp["drafted"] + pages   # one verify row per draft
key = lambda p: [(j["id"], j["tokens"], j["text"]) for j in map(json.loads, open(p))]
print(json.dumps({"mode": name, "flags": flags + " --draft ngram", "drafted": sp["drafted"], "accepted": sp["accepted"],
                  "acceptance": round(sp["accepted"] / sp["drafted"], 4) if sp["drafted"] else None,
                  "tokens": st["tokens"], "passes": passes, "tokens_per_pass": round(st["tokens"] / passes, 3),
                  "identical_to_without": key(got) == key(ref)}))
PY
done

python3 - "$work" <<'PY'
import json, os, sys
work = sys.argv[1]
modes = [json.loads(l) for l in open(os.path.join(work, "modes.jsonl"))]
full = next(m["peak_cache_bytes"] for m in modes if m["mode"] == "full f32")
full_live = next(m["peak_live_bytes"] for m in modes if m["mode"] == "full f32")
for m in modes:
    m["cache_vs_full"] = round(m["peak_cache_bytes"] / full, 4)
    m["live_vs_full"] = round(m["peak_live_bytes"] / full_live, 4)


def frontier(key):
    return [m["mode"] for m in modes
            if not any(o[key] <= m[key] and o["cer"] <= m["cer"] and (o[key] < m[key] or o["cer"] < m["cer"])
                       for o in modes)]


front = frontier("peak_cache_bytes")
front_live = frontier("peak_live_bytes")
sp = json.load(open(os.path.join(work, "spec.stats"))).get("spec", {})
same = [json.loads(l)["tokens"] for l in open(os.path.join(work, "spec.jsonl"))] == \
       [json.loads(l)["tokens"] for l in open(os.path.join(work, "full_f32.jsonl"))]
spec = {"drafted": sp.get("drafted"), "accepted": sp.get("accepted"), "passes": sp.get("passes"),
        "acceptance": round(sp["accepted"] / sp["drafted"], 4) if sp.get("drafted") else None,
        "tokens_same_as_without": same}
with open(os.path.join(work, "ocr_quality.txt"), "w") as f:
    f.write("%-18s %7s %6s %12s %7s %11s %7s  frontier\n" % ("mode", "CER", "edits", "peak cache B", "vs full",
                                                                "peak live B", "vs full"))
    for m in modes:
        f.write("%-18s %7.4f %6d %12d %7.3f %11d %7.3f  %s\n" % (
            m["mode"], m["cer"], m["edits"], m["peak_cache_bytes"], m["cache_vs_full"], m["peak_live_bytes"],
            m["live_vs_full"], ("alloc " if m["mode"] in front else "") + ("live" if m["mode"] in front_live else "")))
with open(os.path.join(work, "frontier.dat"), "w") as f:
    for m in modes:
        f.write("%d %.6f \"%s\" %d %d %d\n" % (m["peak_cache_bytes"], m["cer"], m["mode"].replace(" ", "_"), m["mode"] in front,
                                               m["peak_live_bytes"], m["mode"] in front_live))
spec_modes = [json.loads(l) for l in open(os.path.join(work, "spec_modes.jsonl"))]
with open(os.path.join(work, "ocr_quality.txt"), "a") as f:
    f.write("\n%-18s %7s %8s %10s %9s %6s %15s\n" % ("mode --draft ngram", "drafted", "accepted", "acceptance",
                                                     "passes", "tok/p", "same as without"))
    for m in spec_modes:
        f.write("%-18s %7d %8d %10.3f %9d %6.3f %15s\n" % (m["mode"], m["drafted"], m["accepted"], m["acceptance"] or 0,
                                                          m["passes"], m["tokens_per_pass"], m["identical_to_without"]))
print(json.dumps({"model": "models/ocr-tiny.gguf", "pages": len([1 for _ in open(os.path.join(work, "pages", "pages.jsonl"))]),
                  "ref_chars": modes[0]["ref_chars"], "modes": modes, "frontier": front, "frontier_live": front_live, "spec": spec,
                  "spec_modes": spec_modes}, indent=1))
PY
if ! command -v gnuplot >/dev/null; then   # the plot's one dependency, from Debian
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get install -y --no-install-recommends gnuplot-nox >/dev/null 2>&1 ||
    echo "ocr_quality: gnuplot-nox could not be installed; no plot" >&2
fi
if command -v gnuplot >/dev/null; then
  gnuplot <<EOF2 2>/dev/null || echo "ocr_quality: gnuplot failed; the table is in $work/ocr_quality.txt" >&2
set terminal pngcairo size 900,600 noenhanced
set output "$work/ocr_frontier.png"
set title "OCR decoder: peak live cache bytes vs character error rate (batch 1)"
set xlabel "peak live cache bytes (all stages)"
set ylabel "CER"
set logscale y
set key top right
plot "$work/frontier.dat" using 5:(\$2 > 0 ? \$2 : 1e-4) with points pt 7 title "mode (CER 0 drawn at 1e-4)", \
     "" using 5:(\$2 > 0 ? \$2 : 1e-4):3 with labels offset 0,0.8 font ",7" notitle, \
     "< awk '\$NF == 1' $work/frontier.dat | sort -k5 -n" using 5:(\$2 > 0 ? \$2 : 1e-4) with linespoints lw 2 title "frontier"
EOF2
fi
echo "ocr_quality: table $work/ocr_quality.txt, plot $work/ocr_frontier.png" >&2
