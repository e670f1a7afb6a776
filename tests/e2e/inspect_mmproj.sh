#!/usr/bin/env bash
# `pipedec inspect MMPROJ.gguf [--json]` (issue 38): a vision projector is
# described from its header alone (no llama.cpp): projector type, image and
# patch size, SAM / CLIP shapes, the width of the rows it makes
# (mm.model.fc.weight ne[1], the decoder hidden size it fits), tensors and
# bytes by type. A truncated file (cut at several offsets), a projector type
# pipedec does not read and a missing mm.model.fc.weight are invalid (exit 1)
# with the reason.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
mm="$T/mm.gguf" mm16="$T/mm16.gguf"
"$PIPEDEC" mkmodel --mmproj "$mm" --hidden 64 --seed 3 >/dev/null
"$PIPEDEC" mkmodel --mmproj "$mm16" --hidden 48 --dtype f16 --sam-layers 2 --clip-layers 1 --seed 4 >/dev/null

"$PIPEDEC" inspect "$mm" >"$T/text" 2>"$T/err" && pass "inspect mmproj (text) exits 0" \
  || fail "inspect mmproj: $(cat "$T/err")"
grep -q "^kind: mmproj" "$T/text" && grep -q "^projector: deepseekocr" "$T/text" \
  && grep -q "^image size: 1024, patch size: 16" "$T/text" && grep -q "^sam: 3 layers x 32 (2 heads), window 14" "$T/text" \
  && grep -q "^rows: 64 wide (mm.model.fc.weight, from 128): fits a decoder of hidden size 64" "$T/text" \
  && grep -q "^valid: yes" "$T/text" \
  && pass "inspect mmproj (text): projector, image/patch size, SAM, row width = decoder hidden 64" \
  || { fail "inspect mmproj (text)"; cat "$T/text"; }

# check_json FILE JSON WIDTH DTYPES SAM_LAYERS CLIP_LAYERS
check_json() {
  python3 - "$@" <<'PY'
import json, os, sys
path, js, width, dtypes, sam_l, clip_l = sys.argv[1:]
o = json.load(open(js))
assert o["valid"] is True and o["kind"] == "mmproj" and o["error"] is None, o
assert o["projector_type"] == "deepseekocr" and o["has_vision_encoder"] is True, o
assert (o["image_size"], o["patch_size"]) == (1024, 16), o
assert o["embedding_width"] == int(width) and o["fits_decoder_hidden"] == int(width), o
assert o["projector_input"] == 2 * o["clip"]["width"], o
assert o["sam"]["layers"] == int(sam_l) and o["clip"]["layers"] == int(clip_l), o
assert sorted(t["type"] for t in o["by_type"]) == sorted(dtypes.split(",")), o["by_type"]
assert sum(t["tensors"] for t in o["by_type"]) == o["tensor_count"]
assert sum(t["bytes"] for t in o["by_type"]) == o["tensor_bytes"]
assert o["bytes"] == os.path.getsize(path) and o["tensor_bytes"] < o["bytes"], o
PY
}
"$PIPEDEC" inspect --json "$mm" >"$T/mm.json" 2>"$T/err" || fail "inspect --json: $(cat "$T/err")"
check_json "$mm" "$T/mm.json" 64 f32 3 2 && pass "inspect mmproj --json: f32, width 64, counts and bytes add up" \
  || fail "inspect mmproj --json: $(cat "$T/mm.json")"
"$PIPEDEC" inspect --json "$mm16" >"$T/mm16.json" 2>"$T/err" || fail "inspect --json f16: $(cat "$T/err")"
check_json "$mm16" "$T/mm16.json" 48 f16,f32 2 1 \
  && pass "inspect mmproj --json: f16 matrices beside f32 vectors, width 48, 2 SAM / 1 CLIP layers" \
  || fail "inspect mmproj --json f16: $(cat "$T/mm16.json")"

# truncated: in the header, in the tensor directory, in the data, one byte short
size=$(stat -c %s "$mm")
for cut in 0 3 30 400 2000 $((size / 2)) $((size - 1)); do
  head -c "$cut" "$mm" >"$T/cut.gguf"
  rc=0
  "$PIPEDEC" inspect --json "$T/cut.gguf" >"$T/cut.json" 2>"$T/cut.err" || rc=$?
  if [ "$rc" -eq 1 ] && python3 -c '
import json, sys
o = json.load(open(sys.argv[1]))
assert o["valid"] is False and o["error"], o' "$T/cut.json" 2>/dev/null && grep -q "invalid: .*\(offset\|bytes\)" "$T/cut.err"; then
    pass "mmproj cut to $cut of $size bytes: invalid (exit 1): $(sed 's/.*invalid: //' "$T/cut.err" | cut -c1-110)"
  else
    fail "mmproj cut to $cut bytes: exit $rc, $(cat "$T/cut.json") $(cat "$T/cut.err")"
  fi
done

# patch NAME OLD NEW [AFTER]: a copy of mm.gguf with the same-length string
# OLD replaced by NEW (its first occurrence after the string AFTER)
patch() {
  python3 - "$mm" "$T/$1" "$2" "$3" "${4:-}" <<'PY'
import sys
src, dst, old, new, after = sys.argv[1:]
b = bytearray(open(src, "rb").read()); i = b.index(old.encode(), b.index(after.encode()))
b[i:i + len(old)] = new.encode()
open(dst, "wb").write(b)
PY
}
patch other.gguf deepseekocr qwen2vl_xyz clip.projector_type
rc=0; "$PIPEDEC" inspect --json "$T/other.gguf" >"$T/other.json" 2>"$T/other.err" || rc=$?
[ "$rc" -eq 1 ] && grep -q 'projector type "qwen2vl_xyz": pipedec reads DeepSeek-OCR' "$T/other.err" \
  && grep -q '"kind":"mmproj".*"projector_type":"qwen2vl_xyz"' "$T/other.json" \
  && pass "another projector type: described as an mmproj, invalid for pipedec, named (exit 1)" \
  || fail "another projector type: exit $rc: $(cat "$T/other.err") $(cat "$T/other.json")"
patch nofc.gguf mm.model.fc.weight mm.model.fx.weight
rc=0; "$PIPEDEC" inspect "$T/nofc.gguf" >"$T/nofc.txt" 2>"$T/nofc.err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "mm.model.fc.weight is missing" "$T/nofc.err" && grep -q "^valid: no" "$T/nofc.txt" \
  && pass "no mm.model.fc.weight: invalid, the tensor named (exit 1)" \
  || fail "no fc: exit $rc: $(cat "$T/nofc.err")"
# a decoder is still a model, not an mmproj
"$PIPEDEC" mkmodel --arch deepseek2-ocr --layers 1 --hidden 64 --heads 4 --kv-heads 4 --ffn 128 --vocab 320 \
  --dense-layers 1 --experts 4 --experts-used 2 --expert-ffn 32 --shared 1 --out "$T/dec.gguf" >/dev/null
"$PIPEDEC" inspect --json "$T/dec.gguf" 2>/dev/null | grep -q '"kind":"gguf","architecture":"deepseek2-ocr"' \
  && pass "a deepseek2-ocr decoder is still inspected as a model" || fail "the decoder is not inspected as a model"
finish
