#!/usr/bin/env bash
# Installs the Debian packages pipedec builds and tests with. Idempotent: does
# nothing when everything is present. Needs root (or sudo) only to install.
# usage: scripts/setup.sh [--tests]
#   --tests  also what only the test suite needs: git and npm (llama.cpp's
#            source comes from an npm package, scripts/llama_cpp.sh), cjpeg
#            (test page images) and pdftoppm (scripts/pdf_pages.sh)
set -euo pipefail

PKGS=(build-essential cmake pkg-config
      libopenmpi-dev openmpi-bin
      libhwloc-dev hwloc
      libopenblas-dev
      check libsubunit-dev
      libcjson-dev
      libsimde-dev                                                # tests: AVX-512 kernels on any CPU
      python3
      slurmctld slurmd slurm-client slurm-wlm-basic-plugins munge  # tests/slurm: a private Slurm
      iproute2)                                                   # tests/netns: network namespaces
if [ "${1:-}" = "--tests" ]; then
  PKGS+=(git libjpeg-turbo-progs poppler-utils)
  command -v npm >/dev/null || PKGS+=(npm)                     # node's own npm counts
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
echo "setup: installing ${missing[*]}" >&2
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
