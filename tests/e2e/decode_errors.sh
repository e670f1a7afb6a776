#!/usr/bin/env bash
# Bad input to `pipedec run` / mkmodel / mkpages (issue 4): a clear error that
# names the problem, a non-zero exit, and the output file untouched.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/m.gguf"
"$PIPEDEC" mkmodel --layers 2 --hidden 32 --heads 2 --kv-heads 1 --ffn 48 --vocab 300 --out "$m" >/dev/null
"$PIPEDEC" mkpages --model "$m" --count 3 --embed-rows 4 --prompt-tokens 2 --max-new 5 --out "$T/pages" >/dev/null
P="$T/pages/pages.jsonl"
# a real, complete output: failing runs must leave it byte-identical
head -n 2 "$P" > "$T/pages/two.jsonl"
"$PIPEDEC" run --model "$m" --pages "$T/pages/two.jsonl" --out "$T/keep.jsonl" >/dev/null 2>&1
cp "$T/keep.jsonl" "$T/keep.orig"

check_untouched() { same_bytes "$T/keep.orig" "$T/keep.jsonl" "$1: output untouched"; }

# model file problems
expect_fail "missing model" "no such file|cannot open|No such file" "$PIPEDEC" run --model "$T/none.gguf" --pages "$P" --out "$T/keep.jsonl"
check_untouched "missing model"
head -c 1000 "$m" > "$T/trunc.gguf"
expect_fail "truncated model" "offset [0-9]+" "$PIPEDEC" run --model "$T/trunc.gguf" --pages "$P" --out "$T/keep.jsonl"
check_untouched "truncated model"
printf 'GGUF\x09\x00\x00\x00' > "$T/v9.gguf"; head -c 100 /dev/zero >> "$T/v9.gguf"
expect_fail "unsupported gguf version" "version" "$PIPEDEC" run --model "$T/v9.gguf" --pages "$P" --out "$T/keep.jsonl"
# one flipped byte in a tensor name: output.weight -> outpuT.weight would load
# as tied embeddings and decode one repeated token; refused, naming it
python3 - "$m" "$T/renamed.gguf" <<'PY'
import sys
b = open(sys.argv[1], 'rb').read()
i = b.index(b'\x00output.weight') + 1
open(sys.argv[2], 'wb').write(b[:i + 5] + b'T' + b[i + 6:])
PY
expect_fail "renamed output.weight" "renamed.gguf: 1 tensor is not used by architecture llama .*: outpuT.weight" \
  "$PIPEDEC" run --model "$T/renamed.gguf" --pages "$P" --out "$T/keep.jsonl"
check_untouched "renamed tensor"

# manifest problems
printf '{"id":"a","prefill":[{"tokens":[1,999]}],"max_new_tokens":3}\n' > "$T/badtok.jsonl"
expect_fail "token id beyond vocab" 'badtok.jsonl:1: page "a"' "$PIPEDEC" run --model "$m" --pages "$T/badtok.jsonl" --out "$T/keep.jsonl"
check_untouched "token id beyond vocab"
printf '{"id":"a","prefill":[{"tokens":[1]}],"max_new_token":3}\n' > "$T/typo.jsonl"
expect_fail "unknown key in a page" "max_new_token" "$PIPEDEC" run --model "$m" --pages "$T/typo.jsonl" --out "$T/keep.jsonl"
printf '{"id":"a","prefill":[{"embeddings":"missing.npy"}],"max_new_tokens":3}\n' > "$T/nonpy.jsonl"
expect_fail "missing .npy" "missing.npy" "$PIPEDEC" run --model "$m" --pages "$T/nonpy.jsonl" --out "$T/keep.jsonl"
cp "$T/pages/p00000.npy" "$T/wrong.npy"
python3 - "$T/wrong.npy" <<'PY'
import sys, struct
# rewrite the header's shape to (4, 16): same byte count per row is wrong for hidden 32
p = sys.argv[1]; b = bytearray(open(p, 'rb').read())
h = bytes(b[10:10 + struct.unpack('<H', bytes(b[8:10]))[0]])
h2 = h.replace(b"(4, 32)", b"(8, 16)")
assert h2 != h
b[10:10 + len(h)] = h2
open(p, 'wb').write(b)
PY
printf '{"id":"a","prefill":[{"embeddings":"wrong.npy"}],"max_new_tokens":3}\n' > "$T/wrongshape.jsonl"
expect_fail "npy of the wrong hidden size" "wrong.npy.*(16|hidden)" "$PIPEDEC" run --model "$m" --pages "$T/wrongshape.jsonl" --out "$T/keep.jsonl"
head -c 60 "$T/pages/p00001.npy" > "$T/short.npy"
printf '{"id":"a","prefill":[{"embeddings":"short.npy"}],"max_new_tokens":3}\n' > "$T/short.jsonl"
expect_fail "truncated .npy" "short.npy" "$PIPEDEC" run --model "$m" --pages "$T/short.jsonl" --out "$T/keep.jsonl"
check_untouched "bad manifests"
expect_fail "missing manifest" "nothere.jsonl" "$PIPEDEC" run --model "$m" --pages "$T/nothere.jsonl" --out "$T/keep.jsonl"

# a fifo in place of the model, the manifest or an embeddings file is refused
# at once, naming it (opening one must not wait for a writer)
mkfifo "$T/fifo.gguf" "$T/fifo.jsonl" "$T/fifo.npy"
printf '{"id":"a","prefill":[{"embeddings":"fifo.npy"}],"max_new_tokens":3}\n' > "$T/fifonpy.jsonl"
fifo_fails() {
  local name="$1" pat="$2" t0 t1; shift 2
  t0=$(date +%s)
  expect_fail "$name" "$pat" timeout 10 "$@"
  t1=$(date +%s)
  if [ $((t1 - t0)) -le 5 ]; then pass "$name: refused in $((t1 - t0)) s"; else fail "$name: took $((t1 - t0)) s"; fi
}
fifo_fails "fifo as the model" "fifo.gguf: not a regular file" "$PIPEDEC" run --model "$T/fifo.gguf" --pages "$P" --out "$T/keep.jsonl"
fifo_fails "fifo as the manifest" "fifo.jsonl: not a regular file" "$PIPEDEC" run --model "$m" --pages "$T/fifo.jsonl" --out "$T/keep.jsonl"
fifo_fails "fifo as an embeddings file" 'fifonpy.jsonl:1: page "a": prefill\[0\]\.embeddings: .*fifo.npy: not a regular file' \
  "$PIPEDEC" run --model "$m" --pages "$T/fifonpy.jsonl" --out "$T/keep.jsonl"
check_untouched "fifo inputs"

# flags
expect_fail "bad --attn" "--attn" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --attn ring:4
expect_fail "bad --kv" "--kv" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --kv q4
expect_fail "bad --evict" "--evict" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --evict importance:4:9
expect_fail "bad --batch" "--batch" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --batch 0
expect_fail "bad --micro-batches word" "--micro-batches 'fast': expected a count \(1-64\), turns or pipeline" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --micro-batches fast
expect_fail "bad --micro-batches count" "--micro-batches" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --micro-batches 0
expect_fail "bad --sample" "temp|sample" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --sample temp:-1
expect_fail "missing --out" "required" "$PIPEDEC" run --model "$m" --pages "$P"
expect_fail "unknown flag" "unknown" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --fast
expect_fail "unwritable --trace-hidden" "trace-hidden: cannot create .*/nodir/t" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --trace-hidden "$T/nodir/t"
expect_fail "--trace-hidden without a file" "trace-hidden|incomplete" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --trace-hidden
check_untouched "bad flags"

# no output may land on an input or another output (issue 11): refused before
# anything is opened for writing, every file byte-identical afterwards
cp "$m" "$T/m.orig"; cp "$P" "$T/P.orig"; cp "$T/pages/p00001.npy" "$T/npy.orig"
expect_fail "--stats naming --out" "--out and --stats name the same file" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --stats "$T/keep.jsonl"
expect_fail "--stats naming the model" "--stats .* is the model file" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --stats "$m"
expect_fail "--out naming the manifest" "--out .* is the page manifest" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$P"
expect_fail "--out naming the manifest by another path" "--out .* is the page manifest" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/pages/../pages/pages.jsonl"
expect_fail "--out naming an embeddings file" "is page \"p00001\"'s embeddings file" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/pages/p00001.npy"
expect_fail "--trace-hidden naming the model" "--trace-hidden .* is the model file" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/keep.jsonl" --trace-hidden "$m"
same_bytes "$T/m.orig" "$m" "the model is untouched"
same_bytes "$T/P.orig" "$P" "the manifest is untouched"
same_bytes "$T/npy.orig" "$T/pages/p00001.npy" "the embeddings are untouched"
check_untouched "outputs naming inputs"
# max_new_tokens 0 (undefined behaviour once: a NULL token array copied):
# an empty, valid line; under the sanitizers in CI
printf '{"id":"z0","prefill":[{"tokens":[1,5,6]}],"max_new_tokens":0}\n' > "$T/zero.jsonl"
"$PIPEDEC" run --model "$m" --pages "$T/zero.jsonl" --out "$T/zero.out" --digest >/dev/null 2>&1 \
  && [ "$(cat "$T/zero.out")" = '{"id":"z0","tokens":[],"text":"","prefill_rows":3,"generated":0,"stop":"length","digest":"0000000070646467"}' ] \
  && pass "max_new_tokens 0: an empty, valid line" || fail "max_new_tokens 0"
# a disk that fills up mid-run (an LD_PRELOAD shim): the error says so, it
# is the only thing on stderr of a one-process run (no Open MPI abort
# banner), no partial line stays, and a rerun with space completes the file
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/clean.jsonl" --digest >/dev/null 2>&1
: > "$T/diskfull.jsonl"
rc=0
ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" \
  PD_FULL_DISK_PATH="$(realpath "$T/diskfull.jsonl")" PD_FULL_DISK_BYTES=300 LD_PRELOAD="$PD_BUILD/tests/libpd_full_disk.so" \
  "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/diskfull.jsonl" --digest >/dev/null 2>"$T/diskfull.err" || rc=$?
if [ "$rc" -ne 0 ] && grep -q "No space left on device" "$T/diskfull.err" && [ "$(wc -l < "$T/diskfull.err")" -eq 1 ] \
   && { [ ! -s "$T/diskfull.jsonl" ] || [ "$(tail -c 1 "$T/diskfull.jsonl" | od -An -c | tr -d ' ')" = '\n' ]; }; then
  pass "full disk: ENOSPC named, alone on stderr, no partial line (exit $rc)"
else
  fail "full disk: exit $rc"; cat "$T/diskfull.err" | head -5
fi
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/diskfull.jsonl" --digest >/dev/null 2>&1
same "$T/clean.jsonl" "$T/diskfull.jsonl" "full disk: a rerun with space completes the file as a clean run"

# the stats file is published whole (temporary file + rename): no temp left
"$PIPEDEC" run --model "$m" --pages "$P" --out "$T/st.jsonl" --stats "$T/st.json" >/dev/null 2>&1
python3 -c "import json,sys; json.load(open(sys.argv[1]))" "$T/st.json" && [ -z "$(ls "$T" | grep 'st.json.tmp')" ] \
  && pass "stats written atomically, no temporary file left" || fail "stats publish"
expect_fail "mkmodel bad heads" "--heads" "$PIPEDEC" mkmodel --heads 3 --kv-heads 2 --out "$T/x.gguf"
expect_fail "mkpages missing model" "none.gguf" "$PIPEDEC" mkpages --model "$T/none.gguf" --out "$T/pp"
# a model without its optional rope and rms keys still runs on the defaults,
# and the start-up line says what was assumed (here the defaults equal the
# values mkmodel writes, so the output is the same); a complete model's line
# assumes nothing
python3 - "$m" "$T/nokeys.gguf" <<'PY'
import sys
b = open(sys.argv[1], 'rb').read()
for key in (b'llama.rope.freq_base', b'llama.attention.layer_norm_rms_epsilon'):
    i = b.index(b'\x00' + key) + 1 + len(key) - 1   # last byte: now an unrelated key
    b = b[:i] + b'_' + b[i + 1:]
open(sys.argv[2], 'wb').write(b)
PY
"$PIPEDEC" run --digest --model "$m" --pages "$T/pages/two.jsonl" --out "$T/full.jsonl" >"$T/full.log" 2>&1
"$PIPEDEC" run --digest --model "$T/nokeys.gguf" --pages "$T/pages/two.jsonl" --out "$T/nokeys.jsonl" >"$T/nokeys.log" 2>&1
want='prefill chunk [0-9]*, layers 0-[0-9]*; assumed: rope base 10000 (llama.rope.freq_base absent), rms epsilon 1e-05 (llama.attention.layer_norm_rms_epsilon absent)$'
if grep -q "^pipedec: 1 rank, model .*nokeys.gguf .*$want" "$T/nokeys.log"; then pass "defaulted keys listed in the start-up line"
else fail "defaulted keys: start-up line: $(grep -m1 '^pipedec: 1 rank' "$T/nokeys.log")"; fi
if grep -q '^pipedec: 1 rank, model .* prefill chunk [0-9]*, layers 0-[0-9]*$' "$T/full.log"; then pass "a complete model assumes nothing"
else fail "complete model: start-up line: $(grep -m1 '^pipedec: 1 rank' "$T/full.log")"; fi
same "$T/full.jsonl" "$T/nokeys.jsonl" "defaults equal to the written values decode the same"

# a corrupt complete line in an existing output is refused and left alone
printf 'not json\n' > "$T/corrupt.jsonl"; cp "$T/corrupt.jsonl" "$T/corrupt.orig"
expect_fail "corrupt existing output" "corrupt.jsonl" "$PIPEDEC" run --model "$m" --pages "$P" --out "$T/corrupt.jsonl"
same_bytes "$T/corrupt.orig" "$T/corrupt.jsonl" "corrupt output untouched"
finish
