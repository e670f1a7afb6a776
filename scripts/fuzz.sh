#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang
# (-fsanitize=fuzzer,address,undefined) straight from the sources, seeds each
# corpus from tests/data, runs each target for a bounded time, and prints the
# executions and findings of each. Exits non-zero when any target found a
# crash, leak, timeout or sanitizer report (the reproducer is kept and named).
#
# usage: scripts/fuzz.sh [SECONDS_PER_TARGET | --long] [TARGET...]
#   SECONDS_PER_TARGET  default 60; TARGET e.g. fuzz_wire (default: all of tests/fuzz)
#   --long              the long mode: 600 s per target, the targets two at a
#                       time (PD_FUZZ_PARALLEL, default 2); the corpora grow
#                       in PD_FUZZ_DIR and are kept, so a later run goes on
#                       from them. CI's few seconds per target catch what a
#                       change breaks at once; run --long before a release
#                       and after changing a decoder (about 45 minutes for
#                       every target on two cores).
# env:  PD_FUZZ_DIR   work directory (binaries, corpora, findings); default build-fuzz
#       PD_FUZZ_JOBS   parallel fuzzing processes per target (default 1)
#       CC             clang to use (default clang)
# Each tests/fuzz/<target>.c names its sources on a line "PD_FUZZ_SOURCES: a.c b.c"
# (paths relative to the source root); without one, the file must be self-contained.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
secs="${1:-60}"
shift || true
parallel=1
if [ "$secs" = "--long" ]; then secs=600; parallel="${PD_FUZZ_PARALLEL:-2}"; fi
case "$secs" in ''|*[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET | --long] [TARGET...]" >&2; exit 2;; esac
work="${PD_FUZZ_DIR:-$src/build-fuzz}"
cc="${CC:-clang}"
jobs="${PD_FUZZ_JOBS:-1}"
if ! command -v "$cc" >/dev/null || [ -z "$(find /usr/lib/llvm-*/lib/clang -name 'libclang_rt.fuzzer*.a' 2>/dev/null | head -1)" ]; then
  echo "fuzz.sh: installing clang and libclang-rt-14-dev" >&2
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
fi
mkdir -p "$work"
work="$(cd "$work" && pwd)" # absolute: the fuzzer runs inside it
t_all=$(date +%s)

# clang 14 rejects __builtin_cpu_supports("f16c") (gcc accepts it; base/fp16.c
# uses it). A forced include maps the feature names the sources use onto ones
# clang knows (F16C ships with every AVX2 CPU), without touching the sources.
compat="$work/pd_fuzz_compat.h"
cat >"$compat" <<'H'
#include <string.h>
static inline int pd_fuzz_cpu_supports(const char *f)
{
    if (strcmp(f, "avx2") == 0 || strcmp(f, "f16c") == 0)
        return __builtin_cpu_supports("avx2");
    if (strcmp(f, "fma") == 0)
        return __builtin_cpu_supports("fma");
    if (strcmp(f, "sse4.2") == 0)
        return __builtin_cpu_supports("sse4.2");
    return 0;
}
#define __builtin_cpu_supports(x) pd_fuzz_cpu_supports(x)
H

targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for f in "$src"/tests/fuzz/fuzz_*.c; do targets+=("$(basename "$f" .c)"); done
fi

# fuzz_one TARGET: builds and runs one target; its summary line goes to
# $work/TARGET.summary, its executions to $work/TARGET.execs; returns 1 on a finding.
fuzz_one() {
  local t="$1"
  local file="$src/tests/fuzz/$t.c"
  [ -f "$file" ] || { echo "fuzz.sh: no such target $file" >&2; return 2; }
  local srcs=() words=() extra=() line libline s
  line="$(grep -m1 -o 'PD_FUZZ_SOURCES:.*' "$file" || true)"
  if [ -n "$line" ]; then
    read -r -a words <<<"${line#PD_FUZZ_SOURCES:}"
    for s in "${words[@]}"; do
      case "$s" in *.c) srcs+=("$src/$s");; esac
    done
  fi
  local libs=(-lm -lpthread)
  libline="$(grep -m1 -o 'PD_FUZZ_LIBS:.*' "$file" || true)"
  if [ -n "$libline" ]; then read -r -a extra <<<"${libline#PD_FUZZ_LIBS:}"; libs+=("${extra[@]}"); fi
  local bin="$work/$t"
  echo "fuzz.sh: building $t" >&2
  local t0 t1 t2 rc=0
  t0=$(date +%s)
  "$cc" -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
        -fno-sanitize-recover=all -include "$compat" -I"$src" "$file" "${srcs[@]}" "${libs[@]}" -o "$bin"

  local corpus="$work/corpus_$t" found="$work/findings_$t" log="$work/$t.log"
  mkdir -p "$corpus" "$found"
  cp -n "$src"/tests/data/*.cmf* "$src"/tests/data/*.pdss "$src"/tests/data/*.pdck "$src"/tests/data/*.bin "$src"/tests/data/*.gguf "$corpus"/ 2>/dev/null || true
  t1=$(date +%s)
  # -rss_limit / -malloc_limit keep a hostile count from eating the machine;
  # -timeout flags a slow input as a finding.
  # run inside a directory of its own: with -jobs libFuzzer writes fuzz-N.log
  # to the current directory
  mkdir -p "$work/run_$t"
  (cd "$work/run_$t" && "$bin" "$corpus" -max_total_time="$secs" -print_final_stats=1 -timeout=10 \
         -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=8192 \
         -jobs="$jobs" -workers="$jobs" -artifact_prefix="$found/") >"$log" 2>&1 || rc=$?
  t2=$(date +%s)
  # $log alone: with -jobs, libFuzzer copies each job's fuzz-N.log into its
  # own output once the job ends (counting both doubled every figure)
  local execs crashes
  execs="$( (grep -h 'stat::number_of_executed_units' "$log" || true) | awk '{s += $2} END {print s + 0}')"
  rm -rf "$work/run_$t"
  crashes="$(find "$found" -type f | wc -l)"
  echo "$execs" > "$work/$t.execs"
  if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    { echo "$t: $execs executions in $((t2 - t1)) s (built in $((t1 - t0)) s), FINDING (exit $rc, $crashes reproducer(s) in $found, log $log)"
      grep -m5 -E 'ERROR|runtime error|fuzz_[a-z]+: ' "$log" || true; } > "$work/$t.summary"
    return 1
  fi
  echo "$t: $execs executions in $((t2 - t1)) s (built in $((t1 - t0)) s), no findings (corpus $(ls "$corpus" | wc -l) inputs)" \
    > "$work/$t.summary"
}

total_execs=0
findings=0
running=0
for t in "${targets[@]}"; do
  rm -f "$work/$t.summary" "$work/$t.execs"
  fuzz_one "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$parallel" ]; then wait -n || true; running=$((running - 1)); fi
done
wait || true
for t in "${targets[@]}"; do
  if [ ! -f "$work/$t.summary" ]; then
    echo "$t: did not run (build failed?)"; findings=$((findings + 1)); continue
  fi
  cat "$work/$t.summary"
  grep -q FINDING "$work/$t.summary" && findings=$((findings + 1))
  total_execs=$((total_execs + $(cat "$work/$t.execs" 2>/dev/null || echo 0)))
done
echo "fuzz.sh: ${#targets[@]} target(s), $total_execs executions, $findings target(s) with findings, $(( $(date +%s) - t_all )) s"
[ "$findings" -eq 0 ]
