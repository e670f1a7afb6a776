#!/usr/bin/env bash
# PDF documents -> page images and a page manifest for image pages (issue 38).
# pipedec reads images (PNG, JPEG, PPM), not PDFs: this splits each PDF into
# one PNG per page with poppler's pdftoppm (Debian package poppler-utils) and
# writes a manifest whose pages are {"image": ...} then the prompt as text,
# ready for `pipedec run --mmproj MM` or `pipedec encode`.
#
# usage: scripts/pdf_pages.sh [options] OUTDIR FILE.pdf...
#   --dpi N          render resolution (default 144: an A4 page is 1191 x 1684,
#                    which DeepSeek-OCR's preprocessing tiles; 200+ for small print)
#   --prompt TEXT    the prompt after the image (default DeepSeek-OCR's
#                    "<|grounding|>Convert the document to markdown."; the
#                    "\n" after "<image>" is the encoder's own)
#   --max-new N      max_new_tokens per page (default 4096)
#   --model M        the decoder GGUF: when its tokenizer adds BOS (as
#                    llama.cpp does for it), each page starts with that token
# Writes OUTDIR/<pdf name>/page-<n>.png (n from 1, zero-padded as pdftoppm
# pads them) and OUTDIR/pages.jsonl, one line per page in document order with
# the id "<pdf name>/p<n>". Existing page images are rendered again.
# exit: 0 done, 1 a PDF could not be rendered (named), 2 usage.
set -euo pipefail

dpi=144
prompt="<|grounding|>Convert the document to markdown."
max_new=4096
model=""
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dpi) dpi="${2:?--dpi needs a value}"; shift 2 ;;
    --prompt) prompt="${2?--prompt needs a value}"; shift 2 ;;
    --max-new) max_new="${2:?--max-new needs a value}"; shift 2 ;;
    --model) model="${2:?--model needs a value}"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) echo "pdf_pages.sh: unknown option $1" >&2; usage >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || { usage >&2; exit 2; }
[[ "$dpi" =~ ^[0-9]+$ ]] && [ "$dpi" -ge 36 ] && [ "$dpi" -le 1200 ] \
  || { echo "pdf_pages.sh: --dpi $dpi: expected 36..1200" >&2; exit 2; }
[[ "$max_new" =~ ^[0-9]+$ ]] || { echo "pdf_pages.sh: --max-new $max_new: expected an integer" >&2; exit 2; }
command -v pdftoppm >/dev/null \
  || { echo "pdf_pages.sh: pdftoppm is required (Debian: apt-get install poppler-utils)" >&2; exit 1; }
out="$1"; shift
mkdir -p "$out"

bos=""
if [ -n "$model" ]; then
  pipedec="${PIPEDEC:-$(cd "$(dirname "$0")/.." && pwd)/build/pipedec}"
  [ -x "$pipedec" ] || pipedec="$(command -v pipedec || true)"
  [ -n "$pipedec" ] || { echo "pdf_pages.sh: --model needs the pipedec binary (build/pipedec or PIPEDEC)" >&2; exit 2; }
  with=$("$pipedec" tokenize --model "$model" --text a --ids) || exit 1
  without=$("$pipedec" tokenize --model "$model" --text a --ids --no-bos) || exit 1
  if [ "$with" != "$without" ]; then
    bos=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])[0])' "$with")
  fi
fi

manifest="$out/pages.jsonl"
tmp="$manifest.tmp.$$"
trap 'rm -f "$tmp"' EXIT
: >"$tmp"
for pdf in "$@"; do
  name=$(basename "$pdf" .pdf)
  mkdir -p "$out/$name"
  rm -f "$out/$name"/page-*.png
  if ! pdftoppm -r "$dpi" -png "$pdf" "$out/$name/page" 2>"$out/$name/pdftoppm.err"; then
    echo "pdf_pages.sh: $pdf: pdftoppm could not render it: $(head -c 300 "$out/$name/pdftoppm.err")" >&2
    exit 1
  fi
  python3 - "$out" "$name" "$prompt" "$max_new" "$bos" >>"$tmp" <<'PY'
import json, os, re, sys
out, name, prompt, max_new, bos = sys.argv[1:]
pages = sorted((int(m.group(1)), f) for f in os.listdir(os.path.join(out, name))
               if (m := re.fullmatch(r"page-(\d+)\.png", f)))
if not pages:
    sys.exit(f"pdf_pages.sh: {name}.pdf: no pages rendered")
for n, f in pages:
    pre = [{"tokens": [int(bos)]}] if bos else []
    seg = pre + [{"image": f"{name}/{f}"}] + ([{"text": prompt}] if prompt else [])
    print(json.dumps({"id": f"{name}/p{n}", "prefill": seg, "max_new_tokens": int(max_new)},
                     ensure_ascii=False))
PY
  echo "pdf_pages.sh: $pdf: $(ls "$out/$name"/page-*.png | wc -l) pages at $dpi dpi" >&2
done
mv "$tmp" "$manifest"
trap - EXIT
echo "$manifest"
