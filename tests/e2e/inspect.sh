#!/usr/bin/env bash
# e2e: `pipedec inspect` on the hand-made golden files of tests/data (written
# from docs/wire.md by tests/data/make_golden.py, not by the C encoder):
# valid files exit 0 and describe themselves, invalid ones exit 1 naming the
# byte offset, unreadable ones exit 2; --json prints one parseable object.
# usage: PD_BUILD=<build dir> PD_SRC=<source dir> tests/e2e/inspect.sh
set -euo pipefail
: "${PD_BUILD:?set PD_BUILD to the build directory}"
: "${PD_SRC:?set PD_SRC to the source directory}"
bin="$PD_BUILD/pipedec"
data="$PD_SRC/tests/data"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "inspect.sh: FAIL: $*" >&2; exit 1; }

# The committed golden files are exactly what the documented generator writes.
python3 "$data/make_golden.py" "$tmp"
for f in "$tmp"/*; do
  cmp -s "$f" "$data/$(basename "$f")" || fail "$(basename "$f") differs from make_golden.py output"
done

# expect FILE EXIT [extra args...]: runs inspect (text and JSON), checks the exit
# status both ways and leaves the JSON in $tmp/out.json.
expect() {
  local file="$1" want="$2"; shift 2
  local rc=0
  "$bin" inspect "$file" "$@" >"$tmp/out.txt" 2>"$tmp/err.txt" || rc=$?
  [ "$rc" -eq "$want" ] || fail "$file: text exit $rc, expected $want: $(cat "$tmp/err.txt")"
  rc=0
  "$bin" inspect "$file" --json "$@" >"$tmp/out.json" 2>/dev/null || rc=$?
  [ "$rc" -eq "$want" ] || fail "$file: json exit $rc, expected $want"
}

# jq-like field check with python: jget KEY -> prints the value as JSON
jget() { python3 -c 'import json,sys; print(json.dumps(json.load(open(sys.argv[1]))[sys.argv[2]]))' "$tmp/out.json" "$1"; }
want() { local got; got="$(jget "$1")"; [ "$got" = "$2" ] || fail "$3: $1 = $got, expected $2"; }

expect "$data/full_f32.cmfs" 0
grep -q '^kind: full (0)$' "$tmp/out.txt" || fail "full_f32: text lacks the kind"
grep -q '^identity: 1122334455667788$' "$tmp/out.txt" || fail "full_f32: text lacks the identity"
grep -q '^geometry: 2 kv heads x 2 channels, 1 holding rows$' "$tmp/out.txt" || fail "full_f32: geometry"
want valid true full_f32; want kind '"full"' full_f32; want layer 3 full_f32
want identity '"1122334455667788"' full_f32; want position 2 full_f32; want error null full_f32
want dtype '"f32"' full_f32; want bytes 116 full_f32

expect "$data/full_f16.cmfs" 0
want dtype '"f16"' full_f16
expect "$data/full_tail.cmfs" 0
want kind '"full_tail"' full_tail; want position 7 full_tail; want base 5 full_tail
expect "$data/ring.cmfs" 0
want kind '"ring"' ring; want position 4 ring

expect "$data/two_streams.cmfb" 0
want kind '"bundle"' bundle; want n_streams 2 bundle; want valid true bundle
python3 - "$tmp/out.json" <<'PY' || fail "bundle: streams in JSON"
import json, sys
o = json.load(open(sys.argv[1]))
s = o["streams"]
assert [x["stream"] for x in s] == [7, 1 << 40], s
assert [x["kind"] for x in s] == ["full", "full_tail"], s
assert s[0]["offset"] == 52 and s[0]["bytes"] == 116, s[0]
PY
[ "$(grep -c '^stream ' "$tmp/out.txt")" -eq 2 ] || fail "bundle: one text line per stream"

expect "$data/bad_version.cmfs" 1
want valid false bad_version; want error_offset 4 bad_version
grep -q 'offset 4: wire version 3' "$tmp/err.txt" || fail "bad_version: stderr names offset and reason"
expect "$data/bad_count.cmfs" 1
want error_offset 68 bad_count; want kind '"full"' bad_count
expect "$data/bad_crc.cmfb" 1
want error_offset 296 bad_crc
jget error | grep -q 'crc' || fail "bad_crc: reason"

# legacy bodies only with --legacy
expect "$data/legacy_full.bin" 1
expect "$data/legacy_full.bin" 0 --legacy
want legacy true legacy

# unreadable / unusable input
expect "$tmp/does-not-exist" 2
want valid false missing
printf 'GGUFxxxx' >"$tmp/other.bin"
expect "$tmp/other.bin" 1
: >"$tmp/empty.bin"
expect "$tmp/empty.bin" 1
rc=0; "$bin" inspect >/dev/null 2>&1 || rc=$?; [ "$rc" -eq 2 ] || fail "missing FILE: exit $rc"
rc=0; "$bin" inspect a b >/dev/null 2>&1 || rc=$?; [ "$rc" -eq 2 ] || fail "two FILEs: exit $rc"
rc=0; "$bin" nosuchcommand >/dev/null 2>&1 || rc=$?; [ "$rc" -eq 2 ] || fail "unknown command: exit $rc"
"$bin" --help | grep -q inspect || fail "--help lists inspect"
"$bin" inspect - <"$data/ring.cmfs" >/dev/null || fail "stdin input"
echo "inspect.sh: ok"
