#!/usr/bin/env bash
# `pipedec inspect MODEL.gguf [--json]` (issue 36): architecture,
# hyperparameters, bytes by tensor type, default layer maps, tokenizer and
# unused keys of a deepseek2-ocr file with K-quant matrices; a file whose
# tensors disagree with its keys is invalid (exit 1) naming the tensor.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
m="$T/ocr.gguf"
"$PIPEDEC" mkmodel --arch deepseek2-ocr --layers 3 --hidden 256 --heads 2 --kv-heads 2 --ffn 512 --vocab 320 \
  --dense-layers 1 --experts 8 --experts-used 2 --expert-ffn 64 --shared 1 --dtype q4_k --out "$m" >/dev/null
"$PIPEDEC" inspect "$m" >"$T/text" 2>"$T/err" && pass "inspect text exits 0" || fail "inspect text: $(cat "$T/err")"
grep -q "^architecture: deepseek2-ocr" "$T/text" && grep -q "rope: neox" "$T/text" && grep -q "q4_K" "$T/text" \
  && grep -q "layers over 3 ranks: 0-0,1-1,2-2" "$T/text" && grep -q "unused keys:.*tokenizer.ggml.merges" "$T/text" \
  && pass "inspect text: architecture, rope, types, layer maps, unused keys" || { fail "inspect text"; cat "$T/text"; }
"$PIPEDEC" inspect --json "$m" >"$T/json" 2>"$T/err" || fail "inspect --json: $(cat "$T/err")"
python3 - "$T/json" <<'PY' && pass "inspect --json fields" || fail "inspect --json fields: $(cat "$T/json")"
import json, sys
o = json.load(open(sys.argv[1]))
assert o["valid"] and o["kind"] == "gguf" and o["architecture"] == "deepseek2-ocr", o
h = o["hparams"]
assert (h["block_count"], h["embedding_length"], h["head_dim"], h["expert_count"], h["expert_used_count"]) == (3, 256, 128, 8, 2), h
assert h["rope"] == "neox" and h["expert_gating_func"] == "softmax"
types = {t["type"]: t for t in o["by_type"]}
assert "q4_K" in types and types["q4_K"]["supported"] and "f32" in types, types
assert sum(t["tensors"] for t in o["by_type"]) == o["tensor_count"]
assert sum(t["bytes"] for t in o["by_type"]) == o["tensor_bytes"]
assert o["default_layer_maps"]["1"] == "0-2", o["default_layer_maps"]
assert o["tokenizer"] == {"model": "gpt2", "size": 320, "bos_token_id": 0, "eos_token_id": 1}, o["tokenizer"]
assert "deepseek2-ocr.rope.dimension_count" in o["unused_keys"] and "deepseek2-ocr.block_count" not in o["unused_keys"]
assert o["error"] is None
PY
# a tensor renamed: missing where the keys say it is
cp "$m" "$T/bad.gguf"
python3 - "$T/bad.gguf" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read())
k = b"blk.2.ffn_up_shexp.weight"; i = b.index(k)
b[i:i + len(k)] = b"blk.2.ffn_up_shexq.weight"
open(p, "wb").write(b)
PY
rc=0; "$PIPEDEC" inspect --json "$T/bad.gguf" >"$T/bad.json" 2>"$T/bad.err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "shexq\|ffn_up_shexp" "$T/bad.err" && pass "a renamed tensor: invalid, named (exit 1)" \
  || fail "renamed tensor: exit $rc: $(cat "$T/bad.err")"
finish
