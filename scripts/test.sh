#!/usr/bin/env bash
# The README's test command: installs what is missing, builds, and runs every
# test (Check unit suites, MPI suites, end-to-end scripts) through ctest.
# usage: scripts/test.sh [BUILD_DIR]        (default: build)
# env:   PD_TEST_LABEL=unit|mpi|e2e|anchor|slurm|netns to run one kind only (slurm, netns: root)
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
"$src/scripts/setup.sh" --tests
# the reference implementation the anchor tests compare against: built once
# per machine into a cache outside the repository (about 15-25 minutes the
# first time on two cores, nothing after)
llama="$("$src/scripts/llama_cpp.sh")"
"$src/scripts/build.sh" "$build" -DPD_WERROR=ON -DPD_LLAMA_PREFIX="$llama"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
args=(--test-dir "$build" --output-on-failure -j "$(nproc)")
[ -n "${PD_TEST_LABEL:-}" ] && args+=(-L "$PD_TEST_LABEL")
ctest "${args[@]}"
