#!/usr/bin/env bash
# Configures and builds pipedec into a build directory.
# usage: scripts/build.sh [BUILD_DIR] [extra cmake args...]   (default BUILD_DIR: build)
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
build="${1:-$src/build}"
shift || true
cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE="${PD_BUILD_TYPE:-RelWithDebInfo}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
