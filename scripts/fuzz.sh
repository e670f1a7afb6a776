#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang
# (-fsanitize=fuzzer,address,undefined) straight from the sources, seeds each
# corpus from tests/data, runs each target for a bounded time, and prints the
# executions and findings of each. Exits non-zero when any target found a
# crash, leak, timeout or sanitizer report (the reproducer is kept and named).
#
# usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#   SECONDS_PER_TARGET  default 60; TARGET e.g. fuzz_wire (default: all of tests/fuzz)
# env:  PD_FUZZ_DIR   work directory (binaries, corpora, findings); default build-fuzz
#       PD_FUZZ_JOBS   parallel fuzzing processes per target (default 1)
#       CC             clang to use (default clang)
# Each tests/fuzz/<target>.c names its sources on a line "PD_FUZZ_SOURCES: a.c b.c"
# (paths relative to the source root); without one, the file must be self-contained.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
secs="${1:-60}"
shift || true
case "$secs" in ''|*[!0-9]*) echo "usage: scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]" >&2; exit 2;; esac
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

total_execs=0
findings=0
for t in "${targets[@]}"; do
  file="$src/tests/fuzz/$t.c"
  [ -f "$file" ] || { echo "fuzz.sh: no such target $file" >&2; exit 2; }
  srcs=()
  line="$(grep -m1 -o 'PD_FUZZ_SOURCES:.*' "$file" || true)"
  if [ -n "$line" ]; then
    read -r -a words <<<"${line#PD_FUZZ_SOURCES:}"
    for s in "${words[@]}"; do
      case "$s" in *.c) srcs+=("$src/$s");; esac
    done
  fi
  libs=(-lm -lpthread)
  libline="$(grep -m1 -o 'PD_FUZZ_LIBS:.*' "$file" || true)"
  if [ -n "$libline" ]; then read -r -a extra <<<"${libline#PD_FUZZ_LIBS:}"; libs+=("${extra[@]}"); fi
  bin="$work/$t"
  echo "fuzz.sh: building $t" >&2
  t0=$(date +%s)
  "$cc" -g -O1 -std=c11 -D_GNU_SOURCE -fsanitize=fuzzer,address,undefined \
        -fno-sanitize-recover=all -include "$compat" -I"$src" "$file" "${srcs[@]}" "${libs[@]}" -o "$bin"

  corpus="$work/corpus_$t"
  found="$work/findings_$t"
  mkdir -p "$corpus" "$found"
  cp -n "$src"/tests/data/*.cmf* "$src"/tests/data/*.pdss "$src"/tests/data/*.pdck "$src"/tests/data/*.bin "$src"/tests/data/*.gguf "$corpus"/ 2>/dev/null || true
  log="$work/$t.log"
  rc=0
  t1=$(date +%s)
  # -rss_limit / -malloc_limit keep a hostile count from eating the machine;
  # -timeout flags a slow input as a finding.
  # run inside $work: with -jobs libFuzzer writes fuzz-N.log to the current directory
  (cd "$work" && "$bin" "$corpus" -max_total_time="$secs" -print_final_stats=1 -timeout=10 \
         -rss_limit_mb=2048 -malloc_limit_mb=1024 -max_len=8192 \
         -jobs="$jobs" -workers="$jobs" -artifact_prefix="$found/") >"$log" 2>&1 || rc=$?
  t2=$(date +%s)
  # $log alone: with -jobs, libFuzzer copies each job's fuzz-N.log into its
  # own output once the job ends (counting both doubled every figure)
  execs="$( (grep -h 'stat::number_of_executed_units' "$log" || true) | awk '{s += $2} END {print s + 0}')"
  rm -f "$work"/fuzz-*.log
  crashes="$(find "$found" -type f | wc -l)"
  total_execs=$((total_execs + execs))
  if [ "$rc" -ne 0 ] || [ "$crashes" -gt 0 ]; then
    findings=$((findings + 1))
    echo "$t: $execs executions in $((t2 - t1)) s (built in $((t1 - t0)) s), FINDING (exit $rc, $crashes reproducer(s) in $found, log $log)"
    grep -m5 -E 'ERROR|runtime error|fuzz_[a-z]+: ' "$log" || true
  else
    echo "$t: $execs executions in $((t2 - t1)) s (built in $((t1 - t0)) s), no findings (corpus $(ls "$corpus" | wc -l) inputs)"
  fi
done
echo "fuzz.sh: ${#targets[@]} target(s), $total_execs executions, $findings target(s) with findings, $(( $(date +%s) - t_all )) s"
[ "$findings" -eq 0 ]
