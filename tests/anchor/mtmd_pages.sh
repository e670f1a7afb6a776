#!/usr/bin/env bash
# Anchor (issue 38): a page image reaches pipedec's decoder exactly as
# llama.cpp feeds its own, and decodes to the same tokens.
#
# Models: a random DeepSeek-OCR mmproj (`pipedec mkmodel --mmproj`) and a
# random `deepseek2-ocr` decoder of the same hidden size (3 layers: one per
# rank at most). Pages: three images
# from tests/anchor/mkimages.py (300x200 PPM: overview only; 900x700 PNG and
# 640x800 JPEG: tiles + overview), both DeepSeek-OCR prompts.
#
#  1. `pipedec encode`'s manifest equals, piece for piece, what
#     tests/anchor/mtmd_embed.c (libmtmd's C API as llama-mtmd-cli uses it)
#     feeds the decoder: the same text ids, the image rows bit for bit, in the
#     same order and positions. anchor.mtmd_ocr ties mtmd_embed to
#     llama-mtmd-cli itself (its greedy text equals the CLI's).
#  2. `pipedec run` on that manifest generates mtmd_embed's greedy tokens
#     (llama.cpp decoding the same rows), token for token.
#  3. `run --mmproj` (the head encodes) on 1, 2 and 3 ranks, and with
#     encoder ranks (--encoder-ranks 1 and 2 beside 1 or 2 decoding ranks)
#     writes the same bytes, digests included, as encode + run; the encoder's rows do not
#     depend on its thread count (1 vs 2); a rerun does not encode the pages
#     already in the output (--stats images_encoded), and a job stopped by
#     SIGUSR2 to mpirun (forwarded to every rank, the encoder rank included:
#     checkpoint) resumes to the same bytes, encoding only the pages not yet
#     out.
#  4. Bad pages (issue 38 section 3): empty, not an image, a header claiming
#     60000x60000, a cut PNG, a cut JPEG, a corrupt zlib stream, a missing
#     file: each gets its {"id","error"} line naming the file and the cause,
#     the good pages decode as before, the job exits 4. An mmproj whose rows
#     are not the decoder's width is refused at start-up naming both widths.
source "$(dirname "$0")/../e2e/lib.bash"
T="$E2E_TMP"

prefix="${PD_LLAMA:-}"
[ -n "$prefix" ] || prefix=$("$PD_SRC/scripts/llama_cpp.sh") || { fail "scripts/llama_cpp.sh failed"; finish; exit 1; }
[ -e "$prefix/lib/libmtmd.so" ] && [ -e "$prefix/include/mtmd.h" ] \
  || { fail "$prefix lacks libmtmd or mtmd.h (run scripts/llama_cpp.sh)"; finish; exit 1; }
"$PIPEDEC" encode --help | grep -q "llama.cpp mtmd" \
  || { fail "this pipedec was built without llama.cpp's mtmd (configure with PD_LLAMA_PREFIX=$prefix)"; finish; exit 1; }
EMBED="$T/mtmd_embed"
cc -O2 -std=c11 -Wall -Wextra -Werror -I"$prefix/include" "$PD_SRC/tests/anchor/mtmd_embed.c" -L"$prefix/lib" \
  -lmtmd -lllama -lggml -lggml-base -lm -Wl,-rpath,"$prefix/lib" -o "$EMBED" 2>"$T/cc.log" \
  || { fail "mtmd_embed: $(head -5 "$T/cc.log")"; finish; exit 1; }
MPIRUN=(mpirun --oversubscribe --bind-to none)

H=64
DEC="$T/dec.gguf" MM="$T/mm.gguf"
"$PIPEDEC" mkmodel --arch deepseek2-ocr --layers 3 --hidden $H --heads 4 --kv-heads 4 --ffn 128 --vocab 1024 \
  --ctx 4096 --dense-layers 1 --experts 4 --experts-used 2 --expert-ffn 32 --shared 1 --seed 5 --out "$DEC" \
  >"$T/mk.log" 2>&1 || { fail "mkmodel deepseek2-ocr: $(tail -2 "$T/mk.log")"; finish; exit 1; }
"$PIPEDEC" mkmodel --mmproj "$MM" --hidden $H --seed 3 >>"$T/mk.log" 2>&1 \
  && "$PIPEDEC" mkmodel --mmproj "$T/mm48.gguf" --hidden 48 --seed 3 >>"$T/mk.log" 2>&1 \
  || { fail "mkmodel --mmproj: $(tail -2 "$T/mk.log")"; finish; exit 1; }
python3 "$PD_SRC/tests/anchor/mkimages.py" "$T/img" || { fail "mkimages.py"; finish; exit 1; }

# the pages: BOS when the model's tokenizer adds one (as mtmd does with
# add_special), the image, then the prompt DeepSeek-OCR writes after
# "<image>\n" (mtmd puts the "\n" after the image rows itself)
bos=""
if [ "$("$PIPEDEC" tokenize --model "$DEC" --text a --ids)" != "$("$PIPEDEC" tokenize --model "$DEC" --text a --ids --no-bos)" ]; then
  bos="$("$PIPEDEC" tokenize --model "$DEC" --text a --ids | python3 -c 'import json,sys; print(json.load(sys.stdin)[0])')"
fi
PA="<|grounding|>Convert the document to markdown."
PB="Free OCR."
python3 - "$T" "$bos" "$PA" "$PB" <<'PY'
import json, sys
d, bos, pa, pb = sys.argv[1:]
pages = [("a-md", "page-a.ppm", pa), ("a-free", "page-a.ppm", pb), ("b-md", "page-b.png", pa),
         ("c-free", "page-c.jpg", pb)]
with open(f"{d}/pages.jsonl", "w") as f:
    for pid, img, prompt in pages:
        pre = [{"tokens": [int(bos)]}] if bos else []
        f.write(json.dumps({"id": pid, "prefill": pre + [{"image": f"img/{img}"}, {"text": prompt}],
                            "max_new_tokens": 8}) + "\n")
with open(f"{d}/refs.txt", "w") as f:
    for pid, img, prompt in pages:
        f.write(f"{pid}\t{img}\t{prompt}\n")
PY

# 1. encode, against mtmd_embed's dump of the same page
"$PIPEDEC" encode --mmproj "$MM" --model "$DEC" --pages "$T/pages.jsonl" --out "$T/enc" --threads 2 \
  2>"$T/enc.err" && pass "encode: $(tail -1 "$T/enc.err")" || { fail "encode: $(tail -3 "$T/enc.err")"; finish; exit 1; }
while IFS=$'\t' read -r pid img prompt; do
  mkdir -p "$T/ref-$pid"
  "$EMBED" "$DEC" "$MM" "$T/img/$img" "$prompt" "$T/ref-$pid" 8 2 >"$T/ref-$pid.log" 2>&1 \
    || fail "mtmd_embed $pid: $(tail -2 "$T/ref-$pid.log")"
done <"$T/refs.txt"
check_pieces() {
  python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
def npy_data(path):
    b = open(path, "rb").read()
    assert b[:6] == b"\x93NUMPY", path
    hl = int.from_bytes(b[8:10], "little") if b[6] == 1 else int.from_bytes(b[8:12], "little")
    return b[(10 if b[6] == 1 else 12) + hl:]
bad = []
for line in open(f"{d}/enc/pages.jsonl"):
    pg = json.loads(line)
    ours = []  # ("text", ids) / ("image", bytes), text runs merged as mtmd merges them
    for s in pg["prefill"]:
        if "text" in s:
            continue  # the prompt: compared through the tokens that follow
        if "tokens" in s:
            if ours and ours[-1][0] == "text":
                ours[-1] = ("text", ours[-1][1] + s["tokens"])
            else:
                ours.append(("text", s["tokens"]))
        else:
            ours.append(("image", npy_data(f"{d}/enc/{s['embeddings']}")))
    ref = []
    chunks = [json.loads(l) for l in open(f"{d}/ref-{pg['id']}/chunks.jsonl")]
    for c in chunks:
        if c["type"] == "text":
            ref.append(("text", c["tokens"]))
        elif c["type"] == "image":
            ref.append(("image", npy_data(f"{d}/ref-{pg['id']}/{c['npy']}")))
    # mtmd tokenizes the prompt into the last text chunk: the manifest keeps it
    # as text, so compare the prompt's ids separately (pipedec tokenize)
    prompt_ids = json.load(open(f"{d}/prompt-{pg['id']}.json"))
    if ours and ours[-1][0] == "text":
        ours[-1] = ("text", ours[-1][1] + prompt_ids)
    else:
        ours.append(("text", prompt_ids))
    if [k for k, _ in ours] != [k for k, _ in ref]:
        bad.append(f"{pg['id']}: pieces {[k for k, _ in ours]} vs mtmd {[k for k, _ in ref]}")
        continue
    for i, ((k, a), (_, b)) in enumerate(zip(ours, ref)):
        if a != b:
            bad.append(f"{pg['id']}: piece {i} ({k}) differs" + (f": {a} vs {b}" if k == "text" else
                       f" ({len(a)} vs {len(b)} bytes)"))
    n_img = sum(1 for k, _ in ours if k == "image")
    print(f"  {pg['id']}: {len(ours)} pieces ({n_img} image chunks) identical")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY
}
while IFS=$'\t' read -r pid img prompt; do
  "$PIPEDEC" tokenize --model "$DEC" --text "$prompt" --ids --no-bos >"$T/prompt-$pid.json"
done <"$T/refs.txt"
check_pieces >"$T/pieces.log" 2>&1 && pass "encode: every page's ids and image rows (bit for bit) equal libmtmd's" \
  || fail "encode vs mtmd_embed: $(cat "$T/pieces.log")"
cat "$T/pieces.log"

# the encoder's thread count does not change a bit
printf '%s\n' "$(grep '"b-md"' "$T/pages.jsonl")" >"$T/one.jsonl"
"$PIPEDEC" encode --mmproj "$MM" --model "$DEC" --pages "$T/one.jsonl" --out "$T/enc1" --threads 1 2>/dev/null \
  && "$PIPEDEC" encode --mmproj "$MM" --model "$DEC" --pages "$T/one.jsonl" --out "$T/enc2" --threads 2 2>/dev/null \
  || fail "encode --threads 1/2"
same=1
for f in "$T"/enc1/rows/*.npy; do cmp -s "$f" "$T/enc2/rows/$(basename "$f")" || same=0; done
[ "$same" = 1 ] && [ -n "$(ls "$T"/enc1/rows/)" ] && pass "encode: 1 and 2 encoder threads give the same rows" \
  || fail "encode: rows depend on the encoder's thread count"

# 2. the decode: pipedec's greedy tokens are llama.cpp's on the same rows
"$PIPEDEC" run --model "$DEC" --pages "$T/enc/pages.jsonl" --out "$T/ref.jsonl" --digest >/dev/null 2>"$T/run.err" \
  || fail "run on the encoded manifest: $(tail -2 "$T/run.err")"
if python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
bad = 0
for line in open(f"{d}/ref.jsonl"):
    o = json.loads(line)
    gen = [json.loads(l) for l in open(f"{d}/ref-{o['id']}/chunks.jsonl") if '"generated"' in l][0]
    want = gen["tokens"]
    got = o.get("tokens")
    # pipedec stops at EOS without emitting it; llama.cpp's loop prints it last
    if got != want[:len(got)] or (len(got) < len(want) and len(want) != len(got) + 1):
        print(f"  {o['id']}: pipedec {got} llama.cpp {want} (margins {gen['margins']})")
        bad += 1
    else:
        print(f"  {o['id']}: {len(got)} tokens equal (smallest logit margin {min(gen['margins']):.3g})")
sys.exit(1 if bad else 0)
PY
then pass "run: greedy tokens equal llama.cpp's on every page"; else fail "run: tokens differ from llama.cpp's"; fi

# 3. run --mmproj: the head encodes (1, 2, 3 decoding ranks), or E encoder
# ranks do while the others decode: identical output
for cfg in 1:0 2:0 3:0 2:1 3:1 4:2; do
  np=${cfg%%:*} e=${cfg##*:}
  pre=(); [ "$np" -gt 1 ] && pre=("${MPIRUN[@]}" -np "$np")
  extra=(); [ "$e" -gt 0 ] && extra=(--encoder-ranks "$e")
  "${pre[@]}" "$PIPEDEC" run --model "$DEC" --mmproj "$MM" --pages "$T/pages.jsonl" --out "$T/mm$np-$e.jsonl" \
    --digest --batch 2 "${extra[@]}" >/dev/null 2>"$T/mm$np-$e.err" || fail "run --mmproj np $np E $e: $(tail -2 "$T/mm$np-$e.err")"
  same_bytes "$T/ref.jsonl" "$T/mm$np-$e.jsonl" "run --mmproj, $((np - e)) decoding rank(s) + $e encoder rank(s) = encode + run (digests)"
done

# a rerun resumes: pages already in the output are not encoded again
head -n 2 "$T/mm1-0.jsonl" >"$T/re.jsonl"
"$PIPEDEC" run --model "$DEC" --mmproj "$MM" --pages "$T/pages.jsonl" --out "$T/re.jsonl" --digest \
  --stats "$T/re.json" >/dev/null 2>"$T/re.err" || fail "rerun: $(tail -2 "$T/re.err")"
enc=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["images_encoded"])' "$T/re.json" 2>/dev/null || echo "?")
[ "$enc" = 2 ] && cmp -s "$T/re.jsonl" "$T/ref.jsonl" \
  && pass "rerun over 2 finished pages of 4: 2 images encoded, output identical" \
  || fail "rerun: images_encoded $enc, output $(cmp "$T/re.jsonl" "$T/ref.jsonl" 2>&1 || true)"

# checkpoint and resume with image pages and an encoder rank: SIGUSR2 after
# the first page is out (checkpoint, exit 75), the same command resumes; the
# output equals an uninterrupted run's and the resumed job encodes only the
# pages not yet out. A decoder that never stops early (--repeat) keeps the
# job running long enough (batch 1: one page at a time).
"$PIPEDEC" mkmodel --arch deepseek2-ocr --layers 3 --hidden $H --heads 4 --kv-heads 4 --ffn 128 --vocab 1024 \
  --ctx 4096 --dense-layers 1 --experts 4 --experts-used 2 --expert-ffn 32 --shared 1 --seed 5 --repeat 16 \
  --out "$T/long.gguf" >/dev/null
python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
with open(f"{d}/long.jsonl", "w") as f:
    for i in range(6):
        img = ["page-a.ppm", "page-c.jpg"][i % 2]
        f.write(json.dumps({"id": f"l{i}", "prefill": [{"image": f"img/{img}"}, {"text": "Free OCR."}],
                            "max_new_tokens": 1500}) + "\n")
PY
long=(--model "$T/long.gguf" --mmproj "$MM" --pages "$T/long.jsonl" --batch 1 --digest --encoder-ranks 1)
"${MPIRUN[@]}" -np 3 "$PIPEDEC" run "${long[@]}" --out "$T/long-ref.jsonl" >/dev/null 2>"$T/long-ref.err" \
  || fail "long reference run: $(tail -2 "$T/long-ref.err")"
# the signal goes to mpirun, which forwards it to every rank, the encoder
# rank included (as srun does for slurm/pipedec.sbatch): it must not die of it
"${MPIRUN[@]}" -np 3 "$PIPEDEC" run "${long[@]}" --out "$T/long.jsonl.out" --checkpoint-dir "$T/ck" \
  >/dev/null 2>"$T/long1.err" &
launcher=$!
for _ in $(seq 1 6000); do [ -s "$T/long.jsonl.out" ] && break; sleep 0.01; done
kill -USR2 "$launcher" 2>/dev/null || true
c=0; wait "$launcher" || c=$?; echo "$c" >"$T/long1.rc"
n1=$(wc -l <"$T/long.jsonl.out")
rc=0
"${MPIRUN[@]}" -np 3 "$PIPEDEC" run "${long[@]}" --out "$T/long.jsonl.out" --checkpoint-dir "$T/ck" \
  --stats "$T/long2.json" >/dev/null 2>"$T/long2.err" || rc=$?
enc=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["images_encoded"])' "$T/long2.json" 2>/dev/null || echo "?")
if [ "$(cat "$T/long1.rc")" = 75 ] && [ "$rc" = 0 ] && cmp -s "$T/long.jsonl.out" "$T/long-ref.jsonl" \
   && [ "$enc" != "?" ] && [ "$enc" -le $((6 - n1)) ]; then
  pass "SIGUSR2 after $n1 of 6 pages: checkpointed (75), resumed, output identical; $enc images encoded on resume"
else
  fail "checkpoint/resume: first exit $(cat "$T/long1.rc"), $n1 pages out, resume exit $rc, $enc encoded, output $(cmp "$T/long.jsonl.out" "$T/long-ref.jsonl" 2>&1 || true)"
fi

# 4. bad pages: each fails alone, naming the file and the cause
python3 - "$T" "$bos" <<'PY'
import json, sys
d, bos = sys.argv[1:]
pre = [{"tokens": [int(bos)]}] if bos else []
rows = [("a-md", "page-a.ppm"), ("empty", "empty.png"), ("text", "text.png"), ("huge", "huge.png"),
        ("cut-png", "cut.png"), ("cut-jpg", "cut.jpg"), ("flip", "flip.png"), ("missing", "missing.png")]
with open(f"{d}/bad.jsonl", "w") as f:
    for pid, img in rows:
        f.write(json.dumps({"id": pid, "prefill": pre + [{"image": f"img/{img}"},
                            {"text": "<|grounding|>Convert the document to markdown."}],
                            "max_new_tokens": 8}) + "\n")
PY
rc=0
"${MPIRUN[@]}" -np 2 "$PIPEDEC" run --model "$DEC" --mmproj "$MM" --pages "$T/bad.jsonl" --out "$T/bad.out" \
  --digest >/dev/null 2>"$T/bad.err" || rc=$?
rc2=0
"${MPIRUN[@]}" -np 3 "$PIPEDEC" run --model "$DEC" --mmproj "$MM" --pages "$T/bad.jsonl" --out "$T/bad-enc.out" \
  --digest --encoder-ranks 1 >/dev/null 2>"$T/bad-enc.err" || rc2=$?
[ "$rc2" -eq 4 ] && same_bytes "$T/bad.out" "$T/bad-enc.out" "bad pages: with an encoder rank, the same lines and exit 4" \
  || fail "bad pages with an encoder rank: exit $rc2 ($(tail -2 "$T/bad-enc.err"))"
[ "$rc" -eq 4 ] && pass "bad pages: the job ran to its end and exited 4" || fail "bad pages: exit $rc ($(tail -2 "$T/bad.err"))"
if python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
want = {
    "empty": "img/empty.png: empty file (0 bytes), not an image",
    "text": "img/text.png: offset 0: not a PNG, JPEG or PPM image (starts with 74 68 69 73",
    "huge": "img/huge.png: offset 16: width 60000 x height 60000 exceeds the page limit",
    "cut-png": "img/cut.png: cannot decode the png image",
    "cut-jpg": "img/cut.jpg: offset",
    "flip": "img/flip.png: cannot decode the png image",
    "missing": "img/missing.png: cannot open: No such file or directory",
}
ref = {json.loads(l)["id"]: l for l in open(f"{d}/ref.jsonl")}
got = [json.loads(l) for l in open(f"{d}/bad.out")]
bad = 0
print("  | page | error line |")
for o in got:
    if o["id"] == "a-md":
        ok = json.dumps(o, separators=(",", ":")) + "\n" == ref["a-md"] or json.loads(ref["a-md"]) == o
        print(f"  | a-md | (decoded{'' if ok else ', DIFFERS from the clean run'}) |")
        bad += not ok
        continue
    e = o.get("error", "")
    ok = want[o["id"]] in e
    print(f"  | {o['id']} | {e} |")
    bad += not ok
if len(got) != 8:
    print(f"  {len(got)} lines, want 8")
    bad += 1
sys.exit(1 if bad else 0)
PY
then pass "bad pages: each error line names the file and the cause; the good page is unchanged"
else fail "bad pages: see the table above"; fi

# an mmproj of another width: refused at start-up, naming both
rc=0
"$PIPEDEC" run --model "$DEC" --mmproj "$T/mm48.gguf" --pages "$T/pages.jsonl" --out "$T/w.jsonl" >/dev/null \
  2>"$T/w.err" || rc=$?
grep -q "makes rows 48 wide (mm.model.fc.weight), the model .* has hidden size 64" "$T/w.err" && [ "$rc" -ne 0 ] \
  && [ ! -s "$T/w.jsonl" ] && pass "an mmproj of width 48 for a decoder of 64: refused naming both" \
  || fail "width mismatch: exit $rc, $(cat "$T/w.err")"

# an mmproj with no vision encoder (clip.has_vision_encoder false, as an
# audio-only projector has it): refused at start-up, no page decoded
python3 - "$T/mm.gguf" "$T/novis.gguf" <<'PY'
import sys
d = bytearray(open(sys.argv[1], "rb").read())
key = b"clip.has_vision_encoder"
at = d.find(key) + len(key)
assert at > len(key) and d[at:at + 5] == bytes([7, 0, 0, 0, 1]), "no clip.has_vision_encoder = true"
d[at + 4] = 0
open(sys.argv[2], "wb").write(d)
PY
rc=0
"$PIPEDEC" run --model "$DEC" --mmproj "$T/novis.gguf" --pages "$T/pages.jsonl" --out "$T/nv.jsonl" >/dev/null \
  2>"$T/nv.err" || rc=$?
grep -q "novis.gguf: .*Failed to load CLIP model\|novis.gguf: this mmproj has no vision encoder" "$T/nv.err" \
  && [ "$rc" -ne 0 ] && [ ! -s "$T/nv.jsonl" ] \
  && pass "an mmproj without a vision encoder: refused at start-up, naming the file" \
  || fail "no vision encoder: exit $rc, $(cat "$T/nv.err")"
finish
