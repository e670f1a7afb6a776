#!/usr/bin/env bash
# Anchor (issue 38, the vision stage): llama.cpp's libmtmd takes the random
# DeepSeek-OCR mmproj `pipedec mkmodel --mmproj` writes together with a
# random `deepseek2-ocr` decoder of the same hidden size from `pipedec
# mkmodel`: llama-mtmd-cli loads both, encodes page images (overview only;
# a row of two tiles + overview; two rows of one tile + overview) and
# generates 8 greedy tokens for both DeepSeek-OCR prompts, without error.
# tests/anchor/mtmd_embed.c (compiled here against the prefix) dumps what the
# decoder is fed, chunk by chunk (text ids, image rows as .npy): the rows
# must be finite, the chunk layout the one clip's deepseekocr graph gives,
# and its own greedy continuation must equal llama-mtmd-cli's text. That dump
# is the reference pipedec's vision stage is compared against; its taps
# (PD_MTMD_TAPS) write the graph's intermediate tensors (pixels, SAM, CLIP).
#
# DeepSeek-OCR's "<image>\n" is mtmd's media marker "<__media__>": for this
# projector mtmd itself puts the text "\n" after the image rows.
#
# Negative controls: a decoder of another hidden size is refused; another
# image, and another mmproj seed, give other rows; another image, another
# greedy text.
#
# llama.cpp: the prefix in PD_LLAMA (ctest passes PD_LLAMA_PREFIX), else
# scripts/llama_cpp.sh (built once per machine into a cache outside the
# repository; 25-40 minutes the first time).
source "$(dirname "$0")/../e2e/lib.bash"
T="$E2E_TMP"

prefix="${PD_LLAMA:-}"
[ -n "$prefix" ] || prefix=$("$PD_SRC/scripts/llama_cpp.sh") || { fail "scripts/llama_cpp.sh failed"; finish; exit 1; }
CLI="$prefix/bin/llama-mtmd-cli"
[ -x "$CLI" ] && [ -e "$prefix/lib/libmtmd.so" ] && [ -e "$prefix/include/mtmd.h" ] \
  || { fail "$prefix lacks llama-mtmd-cli, libmtmd or mtmd.h (run scripts/llama_cpp.sh)"; finish; exit 1; }
EMBED="$T/mtmd_embed"
cc -O2 -std=c11 -Wall -Wextra -Werror -I"$prefix/include" "$PD_SRC/tests/anchor/mtmd_embed.c" -L"$prefix/lib" \
  -lmtmd -lllama -lggml -lggml-base -lm -Wl,-rpath,"$prefix/lib" -o "$EMBED" 2>"$T/cc.log" \
  || { fail "mtmd_embed: $(head -5 "$T/cc.log")"; finish; exit 1; }

H=64
DEC="$T/dec.gguf" MM="$T/mm.gguf"
"$PIPEDEC" mkmodel --arch deepseek2-ocr --layers 2 --hidden $H --heads 4 --kv-heads 4 --ffn 128 --vocab 1024 \
  --ctx 4096 --dense-layers 1 --experts 4 --experts-used 2 --expert-ffn 32 --shared 1 --seed 5 --out "$DEC" \
  >"$T/mk.log" 2>&1 || { fail "mkmodel deepseek2-ocr: $(tail -2 "$T/mk.log")"; finish; exit 1; }
for args in "--seed 3:$MM" "--seed 3:$T/mm_again.gguf" "--seed 4:$T/mm_seed4.gguf" \
            "--seed 3 --dtype f16:$T/mm_f16.gguf" "--seed 3 --hidden 48:$T/mm_h48.gguf"; do
  # shellcheck disable=SC2086
  set -- ${args%%:*}
  [[ " $* " == *" --hidden "* ]] || set -- "$@" --hidden $H
  "$PIPEDEC" mkmodel --mmproj "${args##*:}" "$@" >>"$T/mk.log" 2>&1 \
    || { fail "mkmodel --mmproj ${args%%:*}: $(tail -2 "$T/mk.log")"; finish; exit 1; }
done
same_bytes "$MM" "$T/mm_again.gguf" "mkmodel --mmproj: the same seed writes the same bytes"

# page images, written here: 200x280 (overview only), 1300x660 (a 2x1 grid of
# 640 tiles), 600x1300 (1x2); PPM and PNG, both read by mtmd's stb_image
python3 - "$T" <<'PY'
import struct, sys, zlib
d = sys.argv[1]
def pixels(w, h, f):
    return [f(x, y) for y in range(h) for x in range(w)]
def ppm(path, w, h, f):
    with open(path, "wb") as o:
        o.write(b"P6\n%d %d\n255\n" % (w, h))
        o.write(bytes(v for p in pixels(w, h, f) for v in p))
def png(path, w, h, f):
    px = pixels(w, h, f)
    raw = b"".join(b"\0" + bytes(v for p in px[y * w:(y + 1) * w] for v in p) for y in range(h))
    def chunk(t, b):
        return struct.pack(">I", len(b)) + t + b + struct.pack(">I", zlib.crc32(t + b) & 0xffffffff)
    with open(path, "wb") as o:
        o.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
                + chunk(b"IDAT", zlib.compress(raw, 6)) + chunk(b"IEND", b""))
# dark "text lines" on white, like a page
page = lambda x, y: (20, 20, 20) if (y // 12) % 3 == 0 and (x // 7) % 5 != 4 else (250, 250, 245)
png(f"{d}/small.png", 200, 280, page)
ppm(f"{d}/wide.ppm", 1300, 660, lambda x, y: (255 if (x // 40 + y // 22) % 2 else 30, (x ^ y) % 256, (x * y) % 251))
ppm(f"{d}/tall.ppm", 600, 1300, lambda x, y: ((x * 7 + y) % 256, (y * 3) % 256, 255 if (x // 10 + y // 14) % 2 else 0))
PY
# image: the image rows of each image chunk, in order (overview last)
declare -A LAYOUT=([small.png]="273" [wide.ppm]="210 273" [tall.ppm]="110 110 273")
PROMPTS=("<image>
<|grounding|>Convert the document to markdown." "<image>
Free OCR.")

# check_dump DIR WHAT WANT_IMAGE_ROWS: the dump's chunk layout
check_dump() {
  python3 - "$1" "$3" "$H" <<'PY'
import json, struct, sys
d, want, width = sys.argv[1], [int(x) for x in sys.argv[2].split()], int(sys.argv[3])
lines = [json.loads(l) for l in open(d + "/chunks.jsonl")]
chunks = [c for c in lines if c["type"] in ("text", "image")]
gen = [c for c in lines if c["type"] == "generated"]
imgs = [c for c in chunks if c["type"] == "image"]
err = []
if [c["rows"] for c in imgs] != want:
    err.append(f"image rows {[c['rows'] for c in imgs]}, want {want}")
pos = 0
for c in chunks:
    if c["pos"] != pos or c["n_pos"] != c["n_tokens"]:
        err.append(f"chunk {c['i']}: pos {c['pos']} n_pos {c['n_pos']} n_tokens {c['n_tokens']}")
    pos += c["n_pos"]
for c in imgs:
    if c["width"] != width or c["nonfinite"] != 0 or not 0 < c["max_abs"] < 100:
        err.append(f"chunk {c['i']}: width {c['width']}, {c['nonfinite']} non-finite, max |x| {c['max_abs']}")
    b = open(f"{d}/{c['npy']}", "rb").read()
    hl = struct.unpack("<H", b[8:10])[0]
    if b[:6] != b"\x93NUMPY" or len(b) != 10 + hl + 4 * c["rows"] * width or f"({c['rows']}, {width})" not in b[10:10 + hl].decode():
        err.append(f"{c['npy']}: not a ({c['rows']}, {width}) f32 .npy")
# the images come first, then one text chunk starting with the "\n" mtmd adds
if chunks[-1]["type"] != "text" or any(c["type"] != "image" for c in chunks[:-1]):
    err.append("layout: " + " ".join(c["type"] for c in chunks))
if len(gen) != 1 or len(gen[0]["tokens"]) != 8:
    err.append("no 8 generated tokens")
print("; ".join(err))
sys.exit(1 if err else 0)
PY
}

# run_cli OUT ARGS...: llama-mtmd-cli ARGS > OUT 2> OUT.err. Its log (the
# generated text included) goes through an asynchronous queue that may lose
# its tail when the process exits on a loaded machine, so it runs at
# verbosity 4 and a run whose log lacks its last line (llama_perf's "total
# time") is run again, up to three times; 99 if the log never came out
# whole, else the exit status.
run_cli() {
  local out="$1" rc attempt
  shift
  for attempt in 1 2 3; do
    rc=0
    nice -n 5 "$CLI" "$@" -lv 4 >"$out" 2>"$out.err" </dev/null || rc=$?
    [ $rc -ne 0 ] && return $rc
    grep -q 'total time' "$out.err" && return 0
    echo "# llama-mtmd-cli: log incomplete (attempt $attempt), running again"
  done
  return 99
}

for img in small.png wide.ppm tall.ppm; do
  for p in "${PROMPTS[@]}"; do
    tag="$img.$(printf '%s' "$p" | md5sum | cut -c1-6)"
    prompt="<__media__>${p#<image>
}"
    out="$T/$tag.cli" dump="$T/$tag.dump"
    mkdir -p "$dump"
    start=$(date +%s%N) rc=0
    run_cli "$out" -m "$DEC" --mmproj "$MM" --image "$T/$img" -p "$prompt" -n 8 --temp 0 \
      --chat-template deepseek-ocr -t 2 -c 4096 --no-warmup || rc=$?
    ms=$((($(date +%s%N) - start) / 1000000))
    cli_ok=0
    if [ $rc -ne 0 ]; then
      fail "llama-mtmd-cli $img '${p//$'\n'/\\n}': exit status $rc ($(tail -2 "$out.err"))"
    elif grep -qi 'failed\|error' "$out.err" || ! grep -q 'batch encoding done' "$out.err"; then
      fail "llama-mtmd-cli $img: $(grep -i -m2 'error\|fail' "$out.err")"
    else
      pass "llama-mtmd-cli $img '${p//$'\n'/\\n}': loaded, encoded, generated in ${ms} ms ($(grep -o 'encoding done in [0-9]* ms' "$out.err" | head -1))"
      cli_ok=1
    fi
    rc=0
    nice -n 5 "$EMBED" "$DEC" "$MM" "$T/$img" "$prompt" "$dump" 8 2 >"$dump.log" 2>&1 || rc=$?
    if [ $rc -eq 3 ]; then
      fail "mtmd_embed $img: non-finite embedding values"
    elif [ $rc -ne 0 ]; then
      fail "mtmd_embed $img: exit status $rc: $(tail -2 "$dump.log")"
    elif msg=$(check_dump "$dump" "$img" "${LAYOUT[$img]}"); then
      pass "mtmd_embed $img: chunks [${LAYOUT[$img]}] image rows x $H + text, finite, .npy well formed"
    else
      fail "mtmd_embed $img: $msg"
    fi
    # llama-mtmd-cli prints the generated pieces between a newline before
    # and one after
    [ $cli_ok -eq 1 ] && [ -e "$dump/generated.txt" ] || continue
    if python3 - "$out" "$dump/generated.txt" <<'PY'
import sys
cli = open(sys.argv[1], "rb").read().strip(b"\n")
dump = open(sys.argv[2], "rb").read()
sys.exit(0 if cli == dump else 1)
PY
    then
      pass "mtmd_embed $img: its greedy text equals llama-mtmd-cli's"
    else
      fail "mtmd_embed $img: greedy text $(od -c "$T/$tag.dump/generated.txt" | head -2) differs from llama-mtmd-cli's $(od -c "$out" | head -2)"
    fi
  done
done

# the f16 mmproj loads and encodes finite rows too
mkdir -p "$T/f16"
if "$EMBED" "$DEC" "$T/mm_f16.gguf" "$T/wide.ppm" "<__media__>Free OCR." "$T/f16" 8 2 >"$T/f16.log" 2>&1 \
    && msg=$(check_dump "$T/f16" wide.ppm "${LAYOUT[wide.ppm]}"); then
  pass "f16 mmproj: encoded, finite, the same layout"
else
  fail "f16 mmproj: ${msg:-$(tail -2 "$T/f16.log")}"
fi

# taps (PD_MTMD_TAPS): the graph's own tensors of each image chunk; they
# leave the dump unchanged, and the last one is the rows themselves
mkdir -p "$T/taps"
W1="$T/wide.ppm.$(printf '%s' "${PROMPTS[1]}" | md5sum | cut -c1-6).dump"
if PD_MTMD_TAPS=inp_raw,sam_output,layer_out-1,dsocr_output "$EMBED" "$DEC" "$MM" "$T/wide.ppm" \
      "<__media__>Free OCR." "$T/taps" 8 2 >"$T/taps.log" 2>&1 \
    && cmp -s "$T/taps/chunks.jsonl" "$W1/chunks.jsonl" && cmp -s "$T/taps/chunk_000.npy" "$W1/chunk_000.npy" \
    && python3 - "$T/taps" "$H" <<'PY'
import array, struct, sys
d, h = sys.argv[1], int(sys.argv[2])
def rd(name):
    b = open(f"{d}/{name}", "rb").read()
    hl = struct.unpack("<H", b[8:10])[0]
    return b[10:10 + hl].decode(), b[10 + hl:]
want = {  # chunk 0: one row of 2 tiles (640 x 1280 pixels); chunk 1: the overview
    "chunk_000.inp_raw.npy": "(1, 3, 1280, 640)", "chunk_001.inp_raw.npy": "(1, 3, 1024, 1024)",
    "chunk_000.sam_output.npy": "(2, 64, 10, 10)", "chunk_001.sam_output.npy": "(1, 64, 16, 16)",
    "chunk_001.layer_out-1.npy": "(1, 1, 257, 64)", "chunk_001.dsocr_output.npy": f"(1, 1, 273, {h})"}
for name, shape in want.items():
    assert shape in rd(name)[0], (name, rd(name)[0])
for i in (0, 1):
    assert rd(f"chunk_00{i}.dsocr_output.npy")[1] == rd(f"chunk_00{i}.npy")[1], i
px = array.array("f"); px.frombytes(rd("chunk_001.inp_raw.npy")[1])
assert -1.0 <= min(px) and max(px) <= 1.0 and abs(px[0] - (127 / 255 - 0.5) / 0.5) < 1e-6, (min(px), max(px), px[0])
PY
then
  pass "taps: inp_raw, sam_output, CLIP layer_out-1 and dsocr_output of each chunk, with their shapes; the dump unchanged"
else
  fail "taps: $(tail -3 "$T/taps.log")"
fi

# negative controls
# (through mtmd_embed, whose errors are written at once: llama-mtmd-cli's
# asynchronous log may lose them when it exits)
mkdir -p "$T/h48"
rc=0
"$EMBED" "$DEC" "$T/mm_h48.gguf" "$T/small.png" "<__media__>Free OCR." "$T/h48" 0 2 >"$T/h48.out" 2>&1 || rc=$?
if [ $rc -eq 0 ]; then
  fail "an mmproj of width 48 was accepted by a decoder of hidden $H"
elif grep -q 'mismatch between text model (n_embd = 64) and mmproj (n_embd = 48)' "$T/h48.out"; then
  pass "negative control: an mmproj of width 48 is refused by a decoder of hidden $H"
else
  fail "mmproj of width 48: refused for another reason: $(tail -3 "$T/h48.out")"
fi
G="$T/small.png.$(printf '%s' "${PROMPTS[1]}" | md5sum | cut -c1-6).dump"
W="$T/wide.ppm.$(printf '%s' "${PROMPTS[1]}" | md5sum | cut -c1-6).dump"
mkdir -p "$T/seed4"
"$EMBED" "$DEC" "$T/mm_seed4.gguf" "$T/small.png" "<__media__>Free OCR." "$T/seed4" 0 2 >"$T/seed4.log" 2>&1 \
  || fail "mtmd_embed seed 4: $(tail -2 "$T/seed4.log")"
if [ -e "$G/chunk_000.npy" ] && [ -e "$W/chunk_001.npy" ] && [ -e "$T/seed4/chunk_000.npy" ] \
    && ! cmp -s "$G/chunk_000.npy" "$W/chunk_001.npy" && ! cmp -s "$G/chunk_000.npy" "$T/seed4/chunk_000.npy"; then
  pass "negative control: another image and another mmproj seed give other overview rows"
else
  fail "the overview rows do not depend on the image or the mmproj seed"
fi
# the decoder sees the image: the text-equality check above is not met by
# text the image does not change
if [ -s "$G/generated.txt" ] && [ -s "$W/generated.txt" ] && ! cmp -s "$G/generated.txt" "$W/generated.txt"; then
  pass "negative control: another image, another greedy text"
else
  fail "the greedy text does not depend on the image"
fi
finish
