# Shared helpers for the end-to-end scripts (sourced, not run).
# Needs PD_BUILD (build dir) and PD_SRC (source dir); ctest sets both.
set -euo pipefail
: "${PD_BUILD:?PD_BUILD must name the build directory}"
: "${PD_SRC:?PD_SRC must name the source directory}"
# a private session directory per singleton run: see helpers/pipedec
PIPEDEC="$PD_SRC/tests/e2e/helpers/pipedec"
PIPEDEC_BIN="$PD_BUILD/pipedec"   # what pgrep sees once the helper has exec-ed
export PD_BUILD
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_pml="${OMPI_MCA_pml:-ob1}" # see PD_MPI_ENV in tests/CMakeLists.txt
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_btl_vader_single_copy_mechanism="${OMPI_MCA_btl_vader_single_copy_mechanism:-none}"
export OMPI_MCA_rmaps_base_oversubscribe=1
E2E_TMP="$(mktemp -d "${TMPDIR:-/tmp}/pd-e2e.XXXXXX")"
trap 'rm -rf "$E2E_TMP"' EXIT
# Open MPI's session directories go under TMPDIR: a private one per script so
# concurrent mpiruns (ctest -j) never share or clean up each other's.
export TMPDIR="$E2E_TMP"
E2E_FAILS=0
E2E_PASSES=0

pass() { E2E_PASSES=$((E2E_PASSES + 1)); echo "ok   - $*"; }
fail() { E2E_FAILS=$((E2E_FAILS + 1)); echo "FAIL - $*"; }

# has_digests FILE: every line of an output file carries a logit digest
has_digests() {
  [ -s "$1" ] && ! grep -qv '"digest":"[0-9a-f]\{16\}"}$' "$1"
}

# same_bytes FILE_A FILE_B WHAT: plain byte comparison (a file left untouched)
same_bytes() {
  if cmp -s "$1" "$2"; then pass "$3"; else fail "$3 ($1 vs $2 differ)"; fi
}

# same FILE_A FILE_B WHAT: byte-compare two outputs written with --digest, so
# the check sees every bit of every logits row, not only the tokens
same() {
  if ! has_digests "$1" || ! has_digests "$2"; then
    fail "$3 (an output lacks digests: an identity check must compare them)"
  elif cmp -s "$1" "$2"; then
    pass "$3"
  else
    fail "$3 ($1 vs $2 differ)"; diff <(head -c 2000 "$1") <(head -c 2000 "$2") | head -5 || true
  fi
}

# differ FILE_A FILE_B WHAT: the negative control of an identity check. Both
# outputs have a digest on every line and at least one page's digest differs;
# says how many pages differ in digest, and in tokens.
differ() {
  local msg rc=0
  msg=$(python3 - "$1" "$2" <<'PY'
import json, sys
a, b = ({(j := json.loads(l))["id"]: j for l in open(p)} for p in sys.argv[1:3])
if set(a) != set(b) or not a:
    print(f"page sets differ ({len(a)} vs {len(b)} pages)"); sys.exit(1)
if any("digest" not in x for x in list(a.values()) + list(b.values())):
    print("an output lacks digests"); sys.exit(1)
nd = sum(a[k]["digest"] != b[k]["digest"] for k in a)
nt = sum(a[k]["tokens"] != b[k]["tokens"] for k in a)
print(f"{nd} of {len(a)} digests differ, {nt} in tokens")
sys.exit(0 if nd else 1)
PY
) || rc=$?
  if [ "$rc" -eq 0 ]; then pass "$3: $msg"; else fail "$3: $msg"; fi
}

# expect_fail NAME PATTERN CMD...: CMD exits non-zero within 60 s and its
# stderr contains PATTERN (an extended regex)
expect_fail() {
  local name="$1" pat="$2"; shift 2
  local log="$E2E_TMP/expect_fail.log" rc=0
  timeout 60 "$@" >"$log.out" 2>"$log" || rc=$?
  if [ "$rc" -eq 0 ]; then fail "$name: exit 0, expected failure"; return; fi
  if [ "$rc" -eq 124 ]; then fail "$name: still running after 60 s (hang)"; return; fi
  if grep -Eq -e "$pat" "$log"; then pass "$name (exit $rc)"; else fail "$name: stderr lacks /$pat/:"; head -5 "$log"; fi
}

# rank_pid OUT R: the pid of rank R of a job run with --pid-file OUT.pids
# (the job writes it once every rank started; never a process-table search).
# Prints nothing, and succeeds, once the job has ended and removed the file:
# callers run under set -e and may ask just as the job ends.
rank_pid() {
  awk -v r="$2" '$1 == r { print $2 }' "$1.pids" 2>/dev/null || true
}

finish() {
  echo "$E2E_PASSES passed, $E2E_FAILS failed"
  [ "$E2E_FAILS" -eq 0 ]
}
