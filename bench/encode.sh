#!/usr/bin/env bash
# Image pages (issue 38 section 4), ratios from one run on this machine:
#
#  encoder   pipedec's time per image in the encoder graph (pipedec encode)
#            against llama-mtmd-cli's own "batch encoding done in N ms" for
#            the same images, mmproj and threads (1 and 2). Same library, so
#            the goal is >= 0.95: pipedec adds nothing to the encode itself.
#            Also pipedec's whole per-image time (read, decode, preprocess,
#            encode, write the rows) for what a page costs in all.
#  overlap   P pages through 1 encoder rank + 1 decoding rank (run --mmproj
#            --encoder-ranks 1, one thread each) against min(the encode rate
#            of one rank, the decode rate of one rank), each measured alone
#            (pipedec encode --threads 1 on the encoder rank's core; the
#            decode with the overlapped run's own launch, mpirun -np 2
#            --bind-to core --encoder-ranks 1, on the embeddings manifest
#            encode wrote: the same rows on the same core, the encoder rank
#            idle). Every run is placed as the overlapped run places it: on
#            this VM one vCPU decoded at 1.48-1.50 pages/s while the other
#            did 1.67-1.93 in the same minutes, so an unbound decode-alone
#            run moved 20-30 % with where the kernel put it, and once ran
#            slower than the overlapped run beside it.
#            Goal >= 0.9: encoding hides behind decoding and vice versa.
#            Also how long the head waited for an image's rows in the
#            overlapped run (the decoding rank idles meanwhile), and the
#            decoding rank's busy time and micro-batches there against alone
#            (the same rows; more micro-batches of fewer streams while the
#            first BATCH pages arrive one encode apart).
#            The pages differ (the three test images in turn, both
#            prompts): copies of one page decoded in lockstep route every
#            stream to the same experts, so decode alone read a fraction of
#            the expert weights a job reads per step (1.7 pages/s against
#            0.9 for these pages), while the overlapped run, whose streams
#            the encodes offset, did not: the ratio measured that, not the
#            overlap.
#            Models sized so both stages take comparable time: a random
#            DeepSeek-OCR mmproj (mkmodel --mmproj, small) and a random
#            deepseek2-ocr decoder of hidden 512, 8 layers, 300 new tokens a page.
#            Both decode runs use --batch BATCH. The rates are steady-state
#            ones, so PAGES must be many batches: the overlapped run cannot
#            hide the first page's encode nor the last batch's decode (about
#            BATCH pages' worth of decode time), which costs 1 - PAGES /
#            (PAGES + BATCH) of the ratio (0.08 at the defaults, 0.5 with
#            PAGES = BATCH, where the decode-alone run is one full batch).
#            REPS rounds, each of the three runs once, in turn (encode
#            alone, decode alone, both): a shared host moves a single run's
#            rate by 10-40 %, so the ratio is the overlapped run's median
#            rate over the smaller of the two medians alone (the goal's
#            figure); each round's own ratio is printed beside it.
#
# Prints one JSON object.
# usage: bench/encode.sh BUILD_DIR [PAGES] [BATCH] [REPS] (defaults 48, 4 and 3)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bench/encode.sh BUILD_DIR [PAGES] [BATCH] [REPS]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
P="${2:-48}"
B="${3:-4}"
R="${4:-3}"
src="$(cd "$(dirname "$0")/.." && pwd)"
pd="$build/pipedec"
"$pd" encode --help | grep -q "llama.cpp mtmd" || { echo "encode.sh: $pd was built without llama.cpp's mtmd" >&2; exit 1; }
prefix="$("$src/scripts/llama_cpp.sh")"
work="$(mktemp -d "${TMPDIR:-/tmp}/pd-encbench.XXXXXX")"
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

"$pd" mkmodel --arch deepseek2-ocr --layers 8 --hidden 512 --heads 8 --kv-heads 8 --ffn 1024 --vocab 1024 \
  --ctx 4096 --dense-layers 1 --experts 8 --experts-used 2 --expert-ffn 256 --shared 1 --repeat 16 \
  --out "$work/dec.gguf" >/dev/null
"$pd" mkmodel --mmproj "$work/mm.gguf" --hidden 512 >/dev/null
python3 "$src/tests/anchor/mkimages.py" "$work/img"
python3 - "$work" "$P" <<'PY'
import json, sys
d, P = sys.argv[1], int(sys.argv[2])
with open(f"{d}/three.jsonl", "w") as f:
    for img in ("page-a.ppm", "page-b.png", "page-c.jpg"):
        f.write(json.dumps({"id": img, "prefill": [{"image": f"img/{img}"}, {"text": "Free OCR."}],
                            "max_new_tokens": 1}) + "\n")
# pages that differ, as a job's do: the three images in turn, both prompts
prompts = ("Free OCR.", "<|grounding|>Convert the document to markdown.")
with open(f"{d}/many.jsonl", "w") as f:
    for i in range(P):
        img = ("page-a.ppm", "page-b.png", "page-c.jpg")[i % 3]
        f.write(json.dumps({"id": f"p{i}", "prefill": [{"image": f"img/{img}"}, {"text": prompts[i // 3 % 2]}],
                            "max_new_tokens": 300}) + "\n")
PY

# mpirun --bind-to core puts rank 1 (the encoder) on the second core: the
# encode-alone run goes there too
enc_cpus="$(lscpu -p=CPU,CORE | awk -F, '!/^#/ { if (!(($2) in seen)) { seen[$2] = n++ } if (seen[$2] == 1) { l = l (l ? "," : "") $1 } } END { print l }')"
[ -n "$enc_cpus" ] || { echo "encode.sh: the overlap needs 2 cores (one rank each); lscpu shows one" >&2; exit 1; }

# encoder: pipedec against llama-mtmd-cli, same images and threads
declare -A pd_graph pd_all cli_ms
for t in 1 2; do
  "$pd" encode --mmproj "$work/mm.gguf" --model "$work/dec.gguf" --pages "$work/three.jsonl" --out "$work/e$t" \
    --threads "$t" 2>"$work/e$t.err"
  read -r g a < <(sed -n 's/.*: \([0-9.]*\) ms per image in the encoder graph, \([0-9.]*\) ms per image in all.*/\1 \2/p' "$work/e$t.err")
  pd_graph[$t]=$g; pd_all[$t]=$a
  sum=0
  for img in page-a.ppm page-b.png page-c.jpg; do
    "$prefix/bin/llama-mtmd-cli" -m "$work/dec.gguf" --mmproj "$work/mm.gguf" --image "$work/img/$img" \
      -p "<__media__>Free OCR." --chat-template deepseek-ocr -n 1 --temp 0 -t "$t" >/dev/null 2>"$work/cli.err" || true
    # one line per batch of chunks it encodes together (tiles and the
    # overview differ in size, so a tiled page takes several): their sum
    ms=$(sed -n 's/.*batch encoding done in \([0-9.]*\) ms.*/\1/p' "$work/cli.err" \
         | python3 -c 'import sys; v = [float(x) for x in sys.stdin]; print(sum(v) if v else "")')
    [ -n "$ms" ] || { echo "encode.sh: no encode time in llama-mtmd-cli's log ($img)" >&2; tail -3 "$work/cli.err" >&2; exit 1; }
    sum=$(python3 -c "print($sum + $ms)")
  done
  cli_ms[$t]=$(python3 -c "print($sum / 3)")
done

# overlap: 1 encoder rank + 1 decoding rank against each alone, REPS rounds
enc_ms=()
for r in $(seq 1 "$R"); do
  rm -rf "$work/m"
  taskset -c "$enc_cpus" "$pd" encode --mmproj "$work/mm.gguf" --model "$work/dec.gguf" \
    --pages "$work/many.jsonl" --out "$work/m" --threads 1 2>"$work/m.err"
  enc_ms+=("$(sed -n 's/.*, \([0-9.]*\) ms per image in all.*/\1/p' "$work/m.err")")
  rm -f "$work/dec.jsonl" "$work/both.jsonl"
  mpirun --oversubscribe --bind-to core -np 2 "$pd" run --model "$work/dec.gguf" --mmproj "$work/mm.gguf" \
    --pages "$work/m/pages.jsonl" --out "$work/dec.jsonl" --threads 1 --encoder-threads 1 --encoder-ranks 1 \
    --batch "$B" --stats "$work/dec$r.json" >/dev/null 2>&1
  mpirun --oversubscribe --bind-to core -np 2 "$pd" run --model "$work/dec.gguf" --mmproj "$work/mm.gguf" \
    --pages "$work/many.jsonl" --out "$work/both.jsonl" --threads 1 --encoder-threads 1 --encoder-ranks 1 \
    --batch "$B" --stats "$work/both$r.json" >/dev/null 2>&1
  cmp -s "$work/dec.jsonl" "$work/both.jsonl" || { echo "encode.sh: round $r: the overlapped run's output differs" >&2; exit 1; }
  echo "encode.sh: round $r/$R done" >&2
done

python3 - "$work" "$P" "$B" "$R" "$(IFS=,; echo "${enc_ms[*]}")" "${pd_graph[1]}" "${pd_all[1]}" "${cli_ms[1]}" \
  "${pd_graph[2]}" "${pd_all[2]}" "${cli_ms[2]}" <<'PY'
import json, statistics, sys
d, P, B, R = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
enc_ms = [float(x) for x in sys.argv[5].split(",")]
g1, a1, c1, g2, a2, c2 = map(float, sys.argv[6:])
med = statistics.median
rounds = []
for r in range(1, R + 1):
    dec = json.load(open(f"{d}/dec{r}.json"))
    both = json.load(open(f"{d}/both{r}.json"))
    enc_rate, dec_rate, both_rate = 1000.0 / enc_ms[r - 1], P / dec["wall_s"], P / both["wall_s"]
    rounds.append({"encode_pages_per_s": enc_rate, "decode_pages_per_s": dec_rate, "both_pages_per_s": both_rate,
                   "ratio_to_min": both_rate / min(enc_rate, dec_rate),
                   "head_waited_for_rows_s": both.get("images_wait_s"), "head_waits": both.get("images_waits"),
                   "head_encoded_images": both.get("images_head"), "head_encoding_s": both.get("images_head_s"),
                   "images_encoded": both.get("images_encoded"),
                   "decoding_rank_busy_s_both": both["stages"][0]["busy_s"],
                   "decoding_rank_busy_s_alone": dec["stages"][0]["busy_s"],
                   "micro_batches_both": both["stages"][0]["micro_batches"],
                   "micro_batches_alone": dec["stages"][0]["micro_batches"]})
m = {k: med([x[k] for x in rounds]) for k in ("encode_pages_per_s", "decode_pages_per_s", "both_pages_per_s")}
ratio = m["both_pages_per_s"] / min(m["encode_pages_per_s"], m["decode_pages_per_s"])
out = {
    "loadavg_at_end": open("/proc/loadavg").read().split()[:3],
    "encoder": {
        str(t): {"pipedec_graph_ms_per_image": g, "pipedec_all_ms_per_image": a, "llama_mtmd_cli_ms_per_image": c,
                 "ratio_cli_over_pipedec_graph": c / g, "goal": 0.95}
        for t, g, a, c in ((1, g1, a1, c1), (2, g2, a2, c2))},
    "overlap": {"pages": P, "batch": B, "rounds": R,
                "encode_pages_per_s_1_rank_median": m["encode_pages_per_s"],
                "decode_pages_per_s_1_rank_median": m["decode_pages_per_s"],
                "both_pages_per_s_1_plus_1_median": m["both_pages_per_s"],
                "ratio_to_min": ratio, "ratio_to_min_rounds_median": med([x["ratio_to_min"] for x in rounds]),
                "goal": 0.9, "goal_met": ratio >= 0.9, "each_round": rounds},
}
print(json.dumps(out, indent=1))
PY
