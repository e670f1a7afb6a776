#!/usr/bin/env bash
# Installs the Debian packages pipedec builds and tests with. Idempotent: does
# nothing when everything is present. Needs root (or sudo) only to install.
# usage: scripts/setup.sh [--tests] [--llama]
#   --tests  also what only the test suite needs: git and npm (llama.cpp's
#            source comes from an npm package, scripts/llama_cpp.sh), cjpeg
#            (test page images) and pdftoppm (scripts/pdf_pages.sh)
#   --llama  also provide llama.cpp's ggml, llama and mtmd libraries, which
#            image pages (run --mmproj, encode) need: built from the source
#            bundled in the npm package node-llama-cpp (pinned, checksum
#            verified) into $HOME/.cache/pipedec, once per machine
#            (scripts/llama_cpp.sh --libs: about 12 minutes on two busy
#            cores the first time, nothing after). Prints the install
#            prefix on stdout:
#            configure with -DPD_LLAMA_PREFIX=PREFIX or put it in
#            CMAKE_PREFIX_PATH. Without it (the default, and scripts/demo.sh)
#            nothing of llama.cpp is fetched or built.
set -euo pipefail
src="$(cd "$(dirname "$0")/.." && pwd)"
tests=0 llama=0
for a in "$@"; do
  case "$a" in
    --tests) tests=1 ;;
    --llama) llama=1 ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: scripts/setup.sh [--tests] [--llama]" >&2; exit 2 ;;
  esac
done

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
if [ "$tests" = 1 ]; then
  PKGS+=(git libjpeg-turbo-progs poppler-utils)
fi
if [ "$llama" = 1 ]; then
  PKGS+=(git openssl)                                          # the bundle, its checksum
fi
if [ "$tests" = 1 ] || [ "$llama" = 1 ]; then
  command -v npm >/dev/null || PKGS+=(npm)                     # node's own npm counts
fi

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}" >&2
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
if [ "$llama" = 1 ]; then
  prefix=$("$src/scripts/llama_cpp.sh" --libs)
  echo "setup: llama.cpp (ggml, llama, mtmd) is in $prefix: configure pipedec with" >&2
  echo "setup:   scripts/build.sh build -DPD_LLAMA_PREFIX=$prefix   (or CMAKE_PREFIX_PATH=$prefix)" >&2
  echo "$prefix"
fi
