#!/usr/bin/env bash
# `pipedec mkmodel --mmproj FILE --hidden H` (issue 38): writes the random
# DeepSeek-OCR vision projector (same seed, same bytes; another seed, other
# bytes) and says what it wrote; bad or misplaced flags exit 2 naming the
# flag and write nothing. Whether llama.cpp accepts the file is
# anchor.mtmd_ocr's part.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
mm="$T/mm.gguf"
if "$PIPEDEC" mkmodel --mmproj "$mm" --hidden 96 --seed 4 >"$T/out" 2>"$T/err" \
    && grep -q "wrote $mm (deepseekocr mmproj, output width 96; SAM 3 layers x 32, 2 heads, window 14; CLIP 2 layers x 64, 4 heads; f32, seed 4)" "$T/out"; then
  pass "mkmodel --mmproj writes the file and describes it"
else
  fail "mkmodel --mmproj: $(cat "$T/out" "$T/err")"
fi
"$PIPEDEC" mkmodel --seed 4 --hidden 96 --mmproj "$T/again.gguf" >/dev/null 2>&1
same_bytes "$mm" "$T/again.gguf" "the same options in another order write the same bytes"
"$PIPEDEC" mkmodel --mmproj "$T/seed5.gguf" --hidden 96 --seed 5 >/dev/null 2>&1
if [ -s "$T/seed5.gguf" ] && ! cmp -s "$mm" "$T/seed5.gguf" && [ "$(stat -c %s "$mm")" = "$(stat -c %s "$T/seed5.gguf")" ]; then
  pass "another seed: the same layout, other bytes"
else
  fail "another seed did not change the weights (or changed the layout)"
fi
"$PIPEDEC" mkmodel --mmproj "$T/f16.gguf" --hidden 96 --dtype f16 --sam-layers 4 --sam-width 48 --sam-heads 3 \
  --window 8 --clip-layers 1 --clip-width 32 --clip-heads 2 >"$T/out" 2>&1 \
  && grep -q "SAM 4 layers x 48, 3 heads, window 8; CLIP 1 layers x 32, 2 heads; f16" "$T/out" \
  && pass "every size flag and --dtype f16 are taken" || fail "size flags: $(cat "$T/out")"

# bad FLAG... : exit 2, the message names FLAG, no file left
bad() {
  local want="$1" rc=0
  shift
  rm -f "$T/bad.gguf"
  "$PIPEDEC" mkmodel "$@" >"$T/out" 2>"$T/err" || rc=$?
  if [ $rc -eq 2 ] && grep -q -- "$want" "$T/err" && [ ! -e "$T/bad.gguf" ] && ! ls "$T"/bad.gguf.tmp.* >/dev/null 2>&1; then
    pass "refused naming $want: $(head -1 "$T/err")"
  else
    fail "mkmodel $*: exit $rc, $(head -1 "$T/err") (want a message naming $want)"
  fi
}
bad "--hidden" --mmproj "$T/bad.gguf"
bad "--hidden" --mmproj "$T/bad.gguf" --hidden 0
bad "--sam-width" --mmproj "$T/bad.gguf" --hidden 64 --sam-width 30 --sam-heads 4
bad "--clip-width" --mmproj "$T/bad.gguf" --hidden 64 --clip-width 66 --clip-heads 2
bad "--clip-width" --mmproj "$T/bad.gguf" --hidden 64 --clip-width 64 --clip-heads 3
bad "--window" --mmproj "$T/bad.gguf" --hidden 64 --window 65
bad "--sam-layers" --mmproj "$T/bad.gguf" --hidden 64 --sam-layers x
bad "--dtype" --mmproj "$T/bad.gguf" --hidden 64 --dtype q8_0
bad "--mmproj does not take --layers" --mmproj "$T/bad.gguf" --hidden 64 --layers 2
bad "--mmproj does not take --out" --mmproj "$T/bad.gguf" --hidden 64 --out "$T/bad.gguf"
bad "--clip-layers describes a vision projector" --out "$T/bad.gguf" --clip-layers 2
bad "unexpected argument" --mmproj "$T/bad.gguf" --hidden 64 stray
finish
