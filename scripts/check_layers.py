#!/usr/bin/env python3
"""Fails when a source file includes a header of a layer above its own.

The layers, lowest first (docs/ARCHITECTURE.md §3 states the same order):
a file may include headers of its own layer and of layers below it, never
above. Within cluster/runtime/ each sub-folder is a layer of its own.

usage: scripts/check_layers.py [SOURCE_ROOT]     (default: the repository)
"""
import os
import re
import sys

LAYERS = [
    "base",
    "cache",
    "comm",
    "cluster/format",
    "cluster/model",
    "cluster/vision",
    "cluster/runtime/plan",
    "cluster/runtime/pipeline",
    "cluster/runtime/spec",
    "cluster/runtime/sched",
    "cluster/runtime/rank",
    "cluster/runtime/loop",
    "cluster/runtime/ops",
    "cluster/runtime/job",
    "cluster/cli",
]
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_of(path):
    """The index of the layer a repository path belongs to, or None."""
    best = None
    for i, layer in enumerate(LAYERS):
        if path == layer or path.startswith(layer + "/"):
            if best is None or len(layer) > len(LAYERS[best]):
                best = i
    return best


def main():
    root = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), ".."))
    bad, files = [], 0
    for top in ("base", "cache", "comm", "cluster"):
        for d, _, names in os.walk(os.path.join(root, top)):
            for n in sorted(names):
                if not n.endswith((".c", ".h")):
                    continue
                path = os.path.relpath(os.path.join(d, n), root)
                mine = layer_of(path)
                if mine is None:
                    bad.append(f"{path}: in no layer (add its folder to scripts/check_layers.py and docs/ARCHITECTURE.md)")
                    continue
                files += 1
                text = open(os.path.join(root, path), encoding="utf-8").read()
                for m in INCLUDE.finditer(text):
                    inc = m.group(1)
                    theirs = layer_of(inc)
                    if theirs is None:
                        continue  # a header of the same folder by bare name, or a system-like one
                    if theirs > mine:
                        line = text.count("\n", 0, m.start()) + 1
                        bad.append(f"{path}:{line}: includes {inc} ({LAYERS[theirs]}), a layer above {LAYERS[mine]}")
    for b in bad:
        print(b)
    print(f"check_layers: {files} files, {len(bad)} include(s) against the order {' < '.join(LAYERS)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
