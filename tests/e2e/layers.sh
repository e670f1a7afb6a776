#!/usr/bin/env bash
# The include order of docs/ARCHITECTURE.md §3 holds (scripts/check_layers.py),
# and the check can fail: a copy of the tree with one include against the
# order (a pipeline file including a drain-point operation) is refused,
# naming the file, the line and both layers.
source "$(dirname "$0")/lib.bash"
T="$E2E_TMP"
out=$(python3 "$PD_SRC/scripts/check_layers.py" "$PD_SRC") && pass "the tree keeps the include order: ${out##*check_layers: }" \
  || { fail "includes against the order:"; echo "$out" | head -10; }
mkdir -p "$T/tree"
cp -r "$PD_SRC/base" "$PD_SRC/cache" "$PD_SRC/comm" "$PD_SRC/cluster" "$T/tree/"
f="$T/tree/cluster/runtime/pipeline/stage.c"
sed -i '0,/^#include "cluster\/runtime\/pipeline\/stage.h"/s//#include "cluster\/runtime\/pipeline\/stage.h"\n#include "cluster\/runtime\/ops\/ckpt.h"/' "$f"
rc=0; out=$(python3 "$PD_SRC/scripts/check_layers.py" "$T/tree") || rc=$?
[ "$rc" -eq 1 ] && echo "$out" | grep -q "cluster/runtime/pipeline/stage.c:[0-9]*: includes cluster/runtime/ops/ckpt.h (cluster/runtime/ops), a layer above cluster/runtime/pipeline" \
  && pass "negative control: an upward include is refused, naming file, line and layers" \
  || { fail "negative control: exit $rc"; echo "$out" | tail -3; }
finish
