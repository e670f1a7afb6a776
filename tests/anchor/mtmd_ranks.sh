#!/usr/bin/env bash
# Image pages and the ranks that run them (issue 38 leftovers), with llama.cpp's
# mtmd (anchor label: it needs the install anchor.mtmd_pages uses):
#
#  1. The work mix weighs image pages by the rows they prefill: the default
#     layer map of 2 decoding ranks is "balanced for a mean page of N prefill
#     rows", N the mean of what the pages really prefill (--stats
#     prefill_rows / pages of a one-rank run), image rows included, with and
#     without encoder ranks. (Before, an image segment counted 0 rows.) The
#     prompt's text segment counts its tokens, as the head tokenizes it for
#     the prefill: --stats "work_agreed".prefill_rows equals the rows the run
#     prefilled, exactly. (Before, text segments counted 0 rows there.)
#  1b. The head counts each image size's rows once (--stats images_counted):
#     the pages are images of 2 sizes, so 2 counts, on 1 rank and on 2
#     decoding ranks with and without an encoder rank, although the manifest
#     is loaded twice there (the work-mix agreement, then the head's load).
#     Before, every image was counted at each load: 6 counts on 2 ranks, each
#     costing mtmd's preprocessing of a page (about 0.3 s for a 900x700 PNG
#     on this VM, under load: 300 such pages took 90 s to start on 1 rank,
#     231 s on 2).
#  1c. With an encoder rank the head encodes the first page's image itself
#     (--stats images_head 1 of images_encoded 3), while the encoder warms
#     up and takes the next pages.
#  2. Encoder ranks are placed by the decoding ranks' rule (cache/numa.h), at
#     their slot among every rank of the launch on the node, and the report
#     lists them: a "placement: encoder K, rank R on HOST: ..." line after
#     the decoding ranks' lines (its cpus, mode, binding), and --stats
#     "encoders"[k] with the rank and the placement JSON. The output equals
#     the one-rank run's.
#  3. A start-up failure with encoder ranks (a manifest that is not there)
#     ends the launch with the head's message and a failing exit status: the
#     head tells the encoders to stop (before, they waited for it forever).
source "$(dirname "$0")/../e2e/lib.bash"
T="$E2E_TMP"

prefix="${PD_LLAMA:-}"
[ -n "$prefix" ] || prefix=$("$PD_SRC/scripts/llama_cpp.sh") || { fail "scripts/llama_cpp.sh failed"; finish; exit 1; }
"$PIPEDEC" encode --help | grep -q "llama.cpp mtmd" \
  || { fail "this pipedec was built without llama.cpp's mtmd (configure with PD_LLAMA_PREFIX=$prefix)"; finish; exit 1; }
MPIRUN=(mpirun --oversubscribe --bind-to none)

DEC="$T/dec.gguf" MM="$T/mm.gguf"
"$PIPEDEC" mkmodel --arch deepseek2-ocr --layers 4 --hidden 64 --heads 4 --kv-heads 4 --ffn 128 --vocab 1024 \
  --ctx 4096 --dense-layers 1 --experts 4 --experts-used 2 --expert-ffn 32 --shared 1 --seed 5 --out "$DEC" \
  >"$T/mk.log" 2>&1 && "$PIPEDEC" mkmodel --mmproj "$MM" --hidden 64 --seed 3 >>"$T/mk.log" 2>&1 \
  || { fail "mkmodel: $(tail -2 "$T/mk.log")"; finish; exit 1; }
python3 "$PD_SRC/tests/anchor/mkimages.py" "$T/img" >/dev/null || { fail "mkimages.py"; finish; exit 1; }
python3 - "$T/pages.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i, img in enumerate(["page-a.ppm", "page-b.png", "page-a.ppm"]):
        f.write(json.dumps({"id": f"p{i}", "prefill": [{"image": f"img/{img}"}, {"text": "Free OCR."}],
                            "max_new_tokens": 4}) + "\n")
PY

# the mean page as a one-rank run prefills it
"$PIPEDEC" run --model "$DEC" --mmproj "$MM" --pages "$T/pages.jsonl" --out "$T/one.jsonl" --digest \
  --stats "$T/one.json" >/dev/null 2>"$T/one.err" || { fail "run np 1: $(tail -2 "$T/one.err")"; finish; exit 1; }
text=$("$PIPEDEC" tokenize --model "$DEC" --text "Free OCR." --ids --no-bos | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
mean=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print("%.0f" % (s["prefill_rows"] / s["pages_total"]))' "$T/one.json")
[ "$text" -gt 0 ] && [ "$mean" -gt $((100 + text)) ] && pass "one rank: a mean page prefills $mean rows (image rows and $text prompt tokens)" \
  || fail "one rank: a mean page of $mean rows, $text prompt tokens (the images should bring hundreds)"

counted=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["images_counted"])' "$T/one.json" 2>&1)
[ "$counted" = 2 ] && pass "one rank: the rows of the 2 image sizes counted once each (3 pages)" \
  || fail "one rank: images_counted $counted, want 2"

# 1. two decoding ranks (the head encodes), and two beside an encoder rank
for cfg in 2:0 3:1; do
  np=${cfg%%:*} e=${cfg##*:}
  extra=(); [ "$e" -gt 0 ] && extra=(--encoder-ranks "$e")
  "${MPIRUN[@]}" -np "$np" "$PIPEDEC" run --model "$DEC" --mmproj "$MM" --pages "$T/pages.jsonl" \
    --out "$T/o$np.jsonl" --digest --micro-batches pipeline --stats "$T/s$np.json" "${extra[@]}" \
    >"$T/o$np.out" 2>"$T/o$np.err" || fail "run np $np E $e: $(tail -2 "$T/o$np.err")"
  grep -q "balanced for a mean page of $mean prefill rows" "$T/o$np.out" \
    && pass "np $np, $e encoder rank(s): the layer map is balanced for the mean page of $mean rows" \
    || fail "np $np, $e encoder rank(s): want a mean page of $mean rows: $(grep -o 'balanced for [^)]*' "$T/o$np.out")"
  same "$T/one.jsonl" "$T/o$np.jsonl" "np $np, $e encoder rank(s): the same bytes as one rank"
  counted=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["images_counted"])' "$T/s$np.json" 2>&1)
  [ "$counted" = 2 ] && pass "np $np, $e encoder rank(s): the head counted the rows of the 2 image sizes once each" \
    || fail "np $np, $e encoder rank(s): images_counted $counted, want 2 (3 pages, 2 sizes, the manifest loaded twice)"
  agreed=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); w=s["work_agreed"]; print(w["prefill_rows"], s["prefill_rows"], w["pages"], s["pages_total"])' "$T/s$np.json" 2>&1)
  read -r wr pr wp pt <<<"$agreed" || true
  [ "$wr" = "$pr" ] && [ "$wp" = "$pt" ] && [ "$pr" = "$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["prefill_rows"])' "$T/one.json")" ] \
    && pass "np $np, $e encoder rank(s): the agreed work is the $pr rows prefilled ($wp pages, image + text segments)" \
    || fail "np $np, $e encoder rank(s): agreed rows / prefilled rows / agreed pages / pages: $agreed"
done

# 2. the encoder rank's placement: in the start-up lines (after the decoding
# ranks', slot 3 of the 3 ranks on this node) and in --stats
grep '^pipedec: placement:' "$T/o3.out" >"$T/pl.txt" || true
if [ "$(wc -l <"$T/pl.txt")" = 3 ] && sed -n 3p "$T/pl.txt" \
    | grep -q "^pipedec: placement: encoder 0, rank 2 on [^:]*: numa node [0-9]* (os [0-9]*) of [0-9]*, cpus [0-9,-]*, spread (3 of 3 ranks on the node[^)]*), binding [a-z]"; then
  pass "the report lists the encoder rank's placement: $(sed -n 3p "$T/pl.txt" | cut -c 21-)"
else
  fail "placement lines: $(cat "$T/pl.txt")"
fi
sed -n 1,2p "$T/pl.txt" | grep -q "(. of 3 ranks on the node" \
  && pass "the decoding ranks are placed among the 3 ranks of the launch on the node" \
  || fail "decoding ranks' placement: $(sed -n 1,2p "$T/pl.txt")"
if python3 - "$T/s3.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
enc = s["encoders"]
assert len(enc) == 1 and enc[0]["encoder"] == 0 and enc[0]["rank"] == 2, enc
pl = enc[0]["placement"]
assert pl["rank"] == 2 and pl["cpuset"] and pl["mode"] == "spread" and pl["binding"], pl
assert "bytes_placed" not in pl, pl  # an encoder places no memory of its own
assert len(s["stages"]) == 2 and all("placement" in x for x in s["stages"]), s["stages"]
print(pl)
PY
then pass "--stats lists the encoder rank with its placement"; else fail "--stats encoders: see above"; fi
python3 -c 'import json,sys; assert "encoders" not in json.load(open(sys.argv[1]))' "$T/s2.json" \
  && pass "without encoder ranks --stats has no \"encoders\"" || fail "np 2 without encoders lists encoders"

# 1c. with an encoder rank the head encodes the first page's image itself
# (it has nothing else to do: before, it waited about a second for the
# encoder's warm-up and first encode) and the encoder the other two; the
# bytes are the one-rank run's (checked above)
heads=$(python3 -c 'import json,sys; s=json.load(open(sys.argv[1])); print(s["images_head"], s["images_encoded"], s["images_head_s"] > 0)' "$T/s3.json" 2>&1)
[ "$heads" = "1 3 True" ] && pass "np 3, 1 encoder rank: the head encoded the first page's image, the encoder rank the other 2" \
  || fail "np 3, 1 encoder rank: images_head / images_encoded / images_head_s > 0: $heads, want 1 3 True"

# 3. a start-up failure with an encoder rank ends the launch
rc=0
timeout 120 "${MPIRUN[@]}" -np 3 "$PIPEDEC" run --model "$DEC" --mmproj "$MM" --pages "$T/none.jsonl" \
  --out "$T/none.out" --encoder-ranks 1 >/dev/null 2>"$T/none.err" || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "none.jsonl: cannot open" "$T/none.err" \
  && pass "a start-up failure with an encoder rank ends the launch (exit $rc), naming the manifest" \
  || fail "start-up failure with an encoder rank: exit $rc (124: still running after 120 s), $(head -2 "$T/none.err")"
finish
