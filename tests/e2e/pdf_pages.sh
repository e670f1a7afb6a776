#!/usr/bin/env bash
# scripts/pdf_pages.sh (issue 38 section 2): a PDF becomes one PNG per page
# (poppler's pdftoppm) and a manifest of image pages that pipedec loads:
# ids "<name>/p<n>" in document order, the image path relative to the
# manifest, the prompt as a text segment, BOS first when the model's
# tokenizer adds one. Bad input: a file that is not a PDF is named, nothing
# is written.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
command -v pdftoppm >/dev/null || { fail "pdftoppm is missing (scripts/setup.sh --tests installs poppler-utils)"; finish; exit 1; }

# a two-page PDF written here (Helvetica text; offsets computed)
python3 - "$T/doc.pdf" <<'PY'
import sys
objs = [b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R 5 0 R] /Count 2 >>"]
def page(content_obj):
    return (b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 400] /Contents %d 0 R "
            b"/Resources << /Font << /F1 7 0 R >> >> >>" % content_obj)
def stream(text):
    s = b"BT /F1 18 Tf 30 350 Td (" + text + b") Tj ET"
    return b"<< /Length %d >>\nstream\n" % len(s) + s + b"\nendstream"
objs += [page(4), stream(b"Page one: hello"), page(6), stream(b"Page two: 12345")]
objs.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
out, offs = b"%PDF-1.4\n", []
for i, o in enumerate(objs, 1):
    offs.append(len(out))
    out += b"%d 0 obj\n" % i + o + b"\nendobj\n"
x = len(out)
out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
out += b"".join(b"%010d 00000 n \n" % o for o in offs)
out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, x)
open(sys.argv[1], "wb").write(out)
PY

"$PIPEDEC" mkmodel --arch deepseek2-ocr --layers 2 --hidden 64 --heads 2 --kv-heads 2 --ffn 96 --vocab 300 \
  --dense-layers 1 --experts 4 --experts-used 2 --expert-ffn 32 --shared 1 --out "$T/dec.gguf" >/dev/null
PIPEDEC="$PIPEDEC" "$PD_SRC/scripts/pdf_pages.sh" --dpi 72 --max-new 16 --model "$T/dec.gguf" "$T/out" "$T/doc.pdf" \
  >"$T/pp.out" 2>"$T/pp.err" && pass "pdf_pages.sh: $(tail -1 "$T/pp.err")" || fail "pdf_pages.sh: $(cat "$T/pp.err")"
if python3 - "$T/out" <<'PY'
import json, os, struct, sys
d = sys.argv[1]
pages = [json.loads(l) for l in open(f"{d}/pages.jsonl")]
assert [p["id"] for p in pages] == ["doc/p1", "doc/p2"], [p["id"] for p in pages]
for p in pages:
    img = [s["image"] for s in p["prefill"] if "image" in s][0]
    b = open(os.path.join(d, img), "rb").read(24)
    assert b[:8] == b"\x89PNG\r\n\x1a\n", img
    w, h = struct.unpack(">II", b[16:24])
    assert (w, h) == (300, 400), (img, w, h)      # 300 x 400 pt at 72 dpi
    assert p["prefill"][-1] == {"text": "<|grounding|>Convert the document to markdown."}
    assert p["max_new_tokens"] == 16
print("ok")
PY
then pass "two pages, 300x400 PNGs, ids in order, the DeepSeek-OCR prompt"; else fail "manifest: see above"; fi
# the manifest loads (shard validates it as run does, without the images' rows)
"$PIPEDEC" shard --pages "$T/out/pages.jsonl" --shards 1 --out "$T/sh" >/dev/null 2>"$T/sh.err" \
  && pass "the manifest loads (pipedec shard)" || fail "shard: $(cat "$T/sh.err")"
# bad input: not a PDF
echo "not a pdf" >"$T/bad.pdf"
rc=0
"$PD_SRC/scripts/pdf_pages.sh" "$T/out2" "$T/bad.pdf" >/dev/null 2>"$T/bad.err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "bad.pdf: pdftoppm could not render it" "$T/bad.err" && [ ! -e "$T/out2/pages.jsonl" ] \
  && pass "a file that is not a PDF: named, no manifest" || fail "bad pdf: exit $rc, $(cat "$T/bad.err")"
rc=0
"$PD_SRC/scripts/pdf_pages.sh" --dpi 5 "$T/out3" "$T/doc.pdf" >/dev/null 2>"$T/dpi.err" || rc=$?
[ "$rc" -eq 2 ] && grep -q "dpi 5: expected 36..1200" "$T/dpi.err" && pass "--dpi 5: refused" || fail "--dpi 5: exit $rc"
finish
