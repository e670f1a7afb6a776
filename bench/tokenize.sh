#!/usr/bin/env bash
# Tokenizer speed (issue 37): `pipedec tokenize` against llama.cpp's
# `llama-tokenize` on the same ~10 MB mixed text and the same vocabulary
# (DeepSeek-V3's, deepseek-v3 pre-tokenizer, from scripts/tok_refs.sh),
# whole process wall time each (vocabulary load included), `reps` runs
# interleaved, the median counted; the two id lists must be identical. Then
# a 1 MB word without spaces (one pre-tokenizer piece: the BPE merge loop's
# worst case) through both, and 0.5 MB of text dense in special tokens (the
# corpus strings that hold DeepSeek's <｜...｜> tokens: llama.cpp's special-token
# partition walks a linked list per match, so it grows faster than linearly
# there). The texts are generated here from tests/data/tok_corpus.jsonl
# (strings drawn with a fixed seed; the main text from the strings without
# special tokens: prose in many scripts, code, tables, LaTeX, numbers,
# whitespace, emoji), never committed.
# Prints one JSON object.
# usage: bench/tokenize.sh BUILD_DIR [MB] [REPS]   (default 10 MB, 3 reps)
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: bench/tokenize.sh BUILD_DIR [MB] [REPS]" >&2; exit 2; }
build="$(cd "$1" && pwd)"
mb="${2:-10}"
reps="${3:-3}"
src="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/pd-tokbench.XXXXXX")"
trap 'rm -rf "$work"' EXIT
mapfile -t refs < <("$src/scripts/tok_refs.sh")
gguf="${refs[1]}"
prefix="$("$src/scripts/llama_cpp.sh")"
python3 - "$src/tests/data/tok_corpus.jsonl" "$work/text.txt" "$mb" "$work/word.txt" "$work/special.txt" <<'PY'
import json, random, sys
strings = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
rng = random.Random(37)
def draw(pool, target, path):
    out, n = [], 0
    while n < target:
        s = rng.choice(pool)
        out.append(s)
        n += len(s.encode()) + 1
    open(path, "w", encoding="utf-8").write("\n".join(out))
# The main text keeps to strings of at most 300 bytes without whitespace
# runs of 17 or more (typical prose and code; the long runs are the 1 MB
# word's job).
import re
plain = [s for s in strings if "<\uff5c" not in s and len(s.encode()) <= 300
         and not re.search(r"\s{17}", s) and s.strip()]
draw(plain, int(float(sys.argv[3]) * 1e6), sys.argv[2])
draw([s for s in strings if "<\uff5c" in s], 500000, sys.argv[5])
# a 1 MB word: letters only (one piece for every pre-tokenizer)
letters = "abcdefghijklmnopqrstuvwxyzéèàüößçñ"
word, n = [], 0
while n < 1000000:
    c = rng.choice(letters)
    word.append(c)
    n += len(c.encode())
open(sys.argv[4], "w", encoding="utf-8").write("".join(word))
PY
now() { date +%s.%N; }
run_pd() { "$build/pipedec" tokenize --model "$gguf" --file "$1" --ids --no-bos >"$2"; }
# llama-tokenize's std::regex recurses deeply on a large text: with the usual
# 8 MB stack it dies (SIGSEGV) on the 10 MB text, so it runs without a stack
# limit (a subshell's ulimit -s unlimited)
run_ll() ( ulimit -s unlimited; "$prefix/bin/llama-tokenize" -m "$gguf" -f "$1" --ids --no-bos --no-escape --log-disable 2>/dev/null | tail -1 >"$2" )
declare -a tpd tll
for ((r = 0; r < reps; r++)); do
  t0=$(now); run_pd "$work/text.txt" "$work/pd.ids"; t1=$(now)
  run_ll "$work/text.txt" "$work/ll.ids"; t2=$(now)
  tpd+=("$(echo "$t1 - $t0" | bc)"); tll+=("$(echo "$t2 - $t1" | bc)")
done
t0=$(now); run_pd "$work/word.txt" "$work/pdw.ids"; t1=$(now)
run_ll "$work/word.txt" "$work/llw.ids"; t2=$(now)
wpd=$(echo "$t1 - $t0" | bc); wll=$(echo "$t2 - $t1" | bc)
t0=$(now); run_pd "$work/special.txt" "$work/pds.ids"; t1=$(now)
run_ll "$work/special.txt" "$work/lls.ids"; t2=$(now)
spd=$(echo "$t1 - $t0" | bc); sll=$(echo "$t2 - $t1" | bc)
python3 - "$work" "$reps" "${tpd[*]}" "${tll[*]}" "$wpd" "$wll" "$spd" "$sll" <<'PY'
import json, os, statistics, sys
w, reps = sys.argv[1], int(sys.argv[2])
tpd = [float(x) for x in sys.argv[3].split()]
tll = [float(x) for x in sys.argv[4].split()]
pd = open(os.path.join(w, "pd.ids")).read().strip()
ll = open(os.path.join(w, "ll.ids")).read().strip()
ntok = pd.count(",") + 1 if pd != "[]" else 0
mpd, mll = statistics.median(tpd), statistics.median(tll)
word_same = open(os.path.join(w, "pdw.ids")).read().strip() == open(os.path.join(w, "llw.ids")).read().strip()
print(json.dumps({
    "bench": "tokenize", "vocab": "deepseek-v3 (129280 ids, 127741 merges)",
    "bytes": os.path.getsize(os.path.join(w, "text.txt")), "tokens": ntok, "reps": reps,
    "ids_identical": pd == ll,
    "pipedec_s": round(mpd, 3), "llama_tokenize_s": round(mll, 3),
    "pipedec_tokens_per_s": round(ntok / mpd), "llama_tokenize_tokens_per_s": round(ntok / mll),
    "speed_ratio": round(mll / mpd, 2),
    "pipedec_runs_s": [round(x, 3) for x in tpd], "llama_tokenize_runs_s": [round(x, 3) for x in tll],
    "word_1mb_bytes": os.path.getsize(os.path.join(w, "word.txt")),
    "word_1mb_pipedec_s": round(float(sys.argv[5]), 3), "word_1mb_llama_tokenize_s": round(float(sys.argv[6]), 3),
    "word_1mb_ids_identical": word_same,
    "special_dense_bytes": os.path.getsize(os.path.join(w, "special.txt")),
    "special_dense_pipedec_s": round(float(sys.argv[7]), 3),
    "special_dense_llama_tokenize_s": round(float(sys.argv[8]), 3),
    "special_dense_ids_identical": open(os.path.join(w, "pds.ids")).read() == open(os.path.join(w, "lls.ids")).read(),
}))
PY
