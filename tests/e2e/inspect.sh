#!/usr/bin/env bash
# e2e: `pipedec inspect` on the hand-made golden files of tests/data (written
# from docs/wire.md by tests/data/make_golden.py, not by the C encoder):
# valid files exit 0 and describe themselves, invalid ones exit 1 naming the
# byte offset, unreadable ones exit 2; --json prints one parseable object.
# usage: PD_BUILD=<build dir> PD_SRC=<source dir> tests/e2e/inspect.sh
set -euo pipefail
: "${PD_BUILD:?set PD_BUILD to the build directory}"
: "${PD_SRC:?set PD_SRC to the source directory}"
export PD_BUILD
bin="$PD_SRC/tests/e2e/helpers/pipedec"   # private session dir per run
data="$PD_SRC/tests/data"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "inspect.sh: FAIL: $*" >&2; exit 1; }

# The committed golden files are exactly what the documented generator writes.
mkdir "$tmp/gold"
python3 "$data/make_golden.py" "$tmp/gold"
for f in "$tmp/gold"/*; do
  cmp -s "$f" "$data/$(basename "$f")" || fail "$(basename "$f") differs from make_golden.py output"
done

# expect LABEL FILE EXIT [extra args...]: runs inspect as text and as JSON,
# checks the exit status both ways; keeps $tmp/LABEL.txt, .err and .json.
expect() {
  local label="$1" file="$2" want="$3"; shift 3
  local rc=0
  "$bin" inspect "$file" "$@" >"$tmp/$label.txt" 2>"$tmp/$label.err" || rc=$?
  [ "$rc" -eq "$want" ] || fail "$label: text exit $rc, expected $want: $(cat "$tmp/$label.err")"
  rc=0
  "$bin" inspect "$file" --json "$@" >"$tmp/$label.json" 2>/dev/null || rc=$?
  [ "$rc" -eq "$want" ] || fail "$label: json exit $rc, expected $want"
}

expect full_f32 "$data/full_f32.cmfs" 0
grep -q '^kind: full (0)$' "$tmp/full_f32.txt" || fail "full_f32: text lacks the kind"
grep -q '^identity: 1122334455667788$' "$tmp/full_f32.txt" || fail "full_f32: text lacks the identity"
grep -q '^geometry: 2 kv heads x 2 channels, 1 holding rows$' "$tmp/full_f32.txt" || fail "full_f32: geometry"
expect full_f16 "$data/full_f16.cmfs" 0
expect full_tail "$data/full_tail.cmfs" 0
expect ring "$data/ring.cmfs" 0
grep -q '^storage: f32' "$tmp/ring.txt" && fail "ring: an f32 ring has no storage line" || true
expect ring_q8 "$data/ring_q8.cmfs" 0
grep -q '^kind: ring_q8 (6)$' "$tmp/ring_q8.txt" || fail "ring_q8: text lacks the kind"
grep -q '^storage: q8k, k_group 32$' "$tmp/ring_q8.txt" || fail "ring_q8: text lacks the storage"
python3 -c "import json,sys; j=json.load(open(sys.argv[1])); r=j['ring']; assert j['valid'] and j['kind']=='ring_q8' and r['storage']=='q8k' and r['k_group']==32 and r['writes']==3 and j['dtype']=='f16', j" \
  "$tmp/ring_q8.json" || fail "ring_q8: json lacks the storage"
expect bundle "$data/two_streams.cmfb" 0
[ "$(grep -c '^stream ' "$tmp/bundle.txt")" -eq 2 ] || fail "bundle: one text line per stream"
expect bad_version "$data/bad_version.cmfs" 1
grep -q 'offset 4: wire version 3' "$tmp/bad_version.err" || fail "bad_version: stderr names offset and reason"
expect bad_count "$data/bad_count.cmfs" 1
# fuzz_wire's finding (issue 41): a v2 full record of 2 rows without their
# importance values; import refuses it, so inspect must not call it valid
python3 -c 'import sys; sys.stdout.buffer.write(bytes.fromhex(sys.argv[1]))' 434d4653020000008877665544332211030000000001000002000000000000000100000002000000010000000200000003000000000000000100403f0000c03f0000003f04000000003c00c000383400040000004400000032000000 \
  > "$tmp/no_imp.cmfs"
expect no_imp "$tmp/no_imp.cmfs" 1
grep -q "offset 52: n_importance 0, expected 2" "$tmp/no_imp.err" "$tmp/no_imp.txt" || fail "no_imp: the offset and field are not named"
expect bad_crc "$data/bad_crc.cmfb" 1
expect legacy_refused "$data/legacy_full.bin" 1
expect legacy "$data/legacy_full.bin" 0 --legacy
expect missing "$tmp/does-not-exist" 2
printf 'GGUFxxxx' >"$tmp/other.bin"
expect other "$tmp/other.bin" 1
: >"$tmp/empty.bin"
expect empty "$tmp/empty.bin" 1

# Every JSON output is one object with the documented fields (one python run).
python3 - "$tmp" <<'PY' || fail "JSON fields"
import json, sys, os
d = sys.argv[1]
def j(label):
    text = open(os.path.join(d, label + ".json")).read()
    assert text.count("\n") == 1, (label, "one line")
    return json.loads(text)
def want(label, **kv):
    o = j(label)
    for k in ("valid", "kind", "layer", "identity", "position", "error"):
        assert k in o, (label, "missing", k)
    for k, v in kv.items():
        assert o.get(k) == v, (label, k, o.get(k), v)
    return o
want("full_f32", valid=True, kind="full", layer=3, identity="1122334455667788", position=2,
     error=None, dtype="f32", bytes=116)
want("full_f16", valid=True, dtype="f16")
want("full_tail", valid=True, kind="full_tail", position=7, base=5)
want("ring", valid=True, kind="ring", position=4)
b = want("bundle", valid=True, kind="bundle", n_streams=2, layer=3)
s = b["streams"]
assert [x["stream"] for x in s] == [7, 1 << 40], s
assert [x["kind"] for x in s] == ["full", "full_tail"], s
assert s[0]["offset"] == 52 and s[0]["bytes"] == 116, s[0]
want("bad_version", valid=False, error_offset=4)
want("bad_count", valid=False, error_offset=68, kind="full")
o = want("bad_crc", valid=False, error_offset=296)
assert "crc" in o["error"], o
want("legacy_refused", valid=False, error_offset=0)
want("legacy", valid=True, legacy=True, kind="full")
o = want("missing", valid=False)
assert "cannot open" in o["error"], o
# a file with the GGUF magic is inspected as a model (issue 36): the reader's
# error names the offset and field
o = j("other")
assert o["valid"] is False and o["kind"] == "gguf" and "offset 4" in o["error"], o
want("empty", valid=False, error_offset=0)
PY

rc=0; "$bin" inspect >/dev/null 2>&1 || rc=$?; [ "$rc" -eq 2 ] || fail "missing FILE: exit $rc"
rc=0; "$bin" inspect a b >/dev/null 2>&1 || rc=$?; [ "$rc" -eq 2 ] || fail "two FILEs: exit $rc"
rc=0; "$bin" nosuchcommand >/dev/null 2>&1 || rc=$?; [ "$rc" -eq 2 ] || fail "unknown command: exit $rc"
"$bin" --help | grep -q inspect || fail "--help lists inspect"
"$bin" inspect - <"$data/ring.cmfs" >/dev/null || fail "stdin input"

# Only regular files are read: a device has no meaningful size (/dev/zero
# would be read until memory runs out; /dev/null stands for it here), a fifo
# blocks for a writer. Both exit 2 at once, naming the path.
notreg() {
  local file="$1" rc=0
  timeout 10 "$bin" inspect "$file" >/dev/null 2>"$tmp/notreg.err" || rc=$?
  [ "$rc" -eq 2 ] || fail "$file: exit $rc, expected 2: $(head -c 300 "$tmp/notreg.err")"
  grep -qF "$file: not a regular file" "$tmp/notreg.err" || fail "$file: stderr: $(head -c 300 "$tmp/notreg.err")"
}
notreg /dev/null
mkfifo "$tmp/fifo"
notreg "$tmp/fifo"
echo "inspect.sh: ok"
