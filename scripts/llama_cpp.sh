#!/usr/bin/env bash
# Obtains and builds llama.cpp: the libraries pipedec's image pages use
# (ggml, llama, mtmd) and the reference tools the anchor tests and
# benchmarks compare pipedec against. Its source comes from the npm package
# node-llama-cpp (a git bundle of a pinned llama.cpp release, the tarball's
# sha512 checked before use); it is built once per machine into a cache
# outside the repository and never vendored. Prints the install prefix on
# stdout (bin/, lib/, include/).
# usage: scripts/llama_cpp.sh [--print-prefix | --libs]
#   --print-prefix  only print where the build would be, building nothing
#   --libs          build and install ggml, llama and mtmd only (what pipedec
#                   links for image pages; scripts/setup.sh --llama): a
#                   fraction of the full set; a later full build reuses it
# env:   PD_CACHE          cache root (default: $HOME/.cache/pipedec)
#        PD_LLAMA_NPM      npm package spec (default: node-llama-cpp@3.22.1)
#        PD_LLAMA_JOBS     build jobs (default: nproc)
set -euo pipefail

spec="${PD_LLAMA_NPM:-node-llama-cpp@3.22.1}"
# the package's sha512 as the npm registry publishes it (dist.integrity):
# the tarball npm pack fetched is checked against it before anything in it
# is used (PD_LLAMA_NPM_SHA512 overrides it with PD_LLAMA_NPM)
sha512="${PD_LLAMA_NPM_SHA512:-bltIipuWmc123H7tMIgDGKSsSrhmhlQYeVUC48XTjVW7XGJJiJJyCdlTMzQ/LiWoPkGDpcL4FviDpgw7qfTiDw==}"
cache="${PD_CACHE:-$HOME/.cache/pipedec}"
tag="${spec//[@\/]/_}"
root="$cache/llama.cpp-$tag"
prefix="$root/install"
if [ "${1:-}" = "--print-prefix" ]; then
  echo "$prefix"
  exit 0
fi
libs_only=0
case "${1:-}" in
  --libs) libs_only=1; shift ;;
esac
[ $# -eq 0 ] || { echo "usage: scripts/llama_cpp.sh [--print-prefix | --libs]" >&2; exit 2; }

# Everything the checks use; one stamp per set, so adding a target rebuilds.
# The libraries alone have their own stamp; the full set includes them.
full=(llama ggml mtmd llama-quantize llama-batched-bench llama-tokenize
      llama-simple llama-mtmd-cli llama-gguf-split)
libs=(llama ggml mtmd)
stamp_of() { echo "$prefix/.built-$(printf '%s\n' "$@" | md5sum | cut -c1-12)"; }
full_stamp=$(stamp_of "${full[@]}")
if [ "$libs_only" = 1 ]; then targets=("${libs[@]}"); else targets=("${full[@]}"); fi
stamp=$(stamp_of "${targets[@]}")
done_already() { [ -f "$stamp" ] || [ -f "$full_stamp" ]; }
if done_already; then
  echo "$prefix"
  exit 0
fi

mkdir -p "$root"
exec 9>"$root/.lock"
flock 9                                   # one build per machine at a time
if done_already; then echo "$prefix"; exit 0; fi

for tool in npm git cmake openssl; do
  command -v "$tool" >/dev/null || { echo "llama_cpp.sh: $tool is required" >&2; exit 1; }
done
if [ ! -d "$root/src/.git" ]; then
  rm -rf "$root/pkg" "$root/src"
  mkdir -p "$root/pkg"
  (cd "$root/pkg" && npm pack --silent "$spec" >/dev/null)
  got=$(openssl dgst -sha512 -binary "$root"/pkg/*.tgz | base64 -w0)
  if [ "$got" != "$sha512" ]; then
    echo "llama_cpp.sh: $spec: the tarball's sha512 is $got, expected $sha512; refusing it" >&2
    rm -rf "$root/pkg"
    exit 1
  fi
  (cd "$root/pkg" && tar xzf ./*.tgz)
  bundle="$root/pkg/package/llama/gitRelease.bundle"
  [ -f "$bundle" ] || { echo "llama_cpp.sh: $spec has no llama/gitRelease.bundle" >&2; exit 1; }
  git -c advice.detachedHead=false clone -q "$bundle" "$root/src"
  cp "$root/pkg/package/llama/llama.cpp.info.json" "$root/llama.cpp.info.json"
  rm -rf "$root/pkg"
fi
echo "llama_cpp.sh: building llama.cpp ($(cat "$root/llama.cpp.info.json" | tr -d '\n ')): ${targets[*]} into $prefix" >&2
cmake -S "$root/src" -B "$root/build" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_INSTALL_PREFIX="$prefix" -DCMAKE_INSTALL_RPATH="$prefix/lib" \
  -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON \
  -DGGML_NATIVE=ON >"$root/configure.log" 2>&1 \
  || { tail -30 "$root/configure.log" >&2; exit 1; }
cmake --build "$root/build" -j "${PD_LLAMA_JOBS:-$(nproc)}" --target "${targets[@]}" \
  >"$root/build.log" 2>&1 || { tail -40 "$root/build.log" >&2; exit 1; }
# Install the libraries and headers (for helpers that link libllama / mtmd)
# and the tools that were built.
mkdir -p "$prefix/bin" "$prefix/lib" "$prefix/include"
find "$root/build/bin" -maxdepth 1 -type f -perm -u+x -exec cp -f {} "$prefix/bin/" \;
find "$root/build" -name '*.so*' \( -type f -o -type l \) -exec cp -Pf {} "$prefix/lib/" \;
cp -f "$root/src/include/"*.h "$root/src/ggml/include/"*.h "$prefix/include/"
cp -f "$root/src/tools/mtmd/mtmd.h" "$root/src/tools/mtmd/mtmd-helper.h" "$prefix/include/" 2>/dev/null || true
ln -sfn "$root/src/gguf-py" "$prefix/gguf-py"
touch "$stamp"
echo "$prefix"
