#!/usr/bin/env python3
"""Compares two `pipedec run --trace-hidden` traces and prints where they first
differ: the page, the position and the layer boundary.

usage: scripts/trace_diff.py TRACE_A TRACE_B

Each trace is the path given to --trace-hidden: rank 0 wrote that file, rank r
wrote PATH.r; the header line of rank 0's file says how many ranks there were,
so the parts of a run are merged whatever its rank count or layer map (format:
docs/digests.md). A record repeated for the same (page, position, boundary) --
a row computed again after a rollback -- counts with its last value.

Exit status: 0 identical, 1 different, 2 bad usage or an unreadable trace.
"""
import re
import sys

HEADER = re.compile(r"^# pipedec trace-hidden 1 rank (\d+) of (\d+)$")


def die(msg):
    print(f"trace_diff: {msg}", file=sys.stderr)
    sys.exit(2)


def read_part(path, want_rank, want_size, rows, names, order):
    try:
        f = open(path, encoding="utf-8", errors="replace")
    except OSError as e:
        die(f"{path}: {e.strerror}")
    with f:
        first = f.readline().rstrip("\n")
        m = HEADER.match(first)
        if not m:
            die(f"{path}:1: not a pipedec trace (header {first[:60]!r})")
        rank, size = int(m.group(1)), int(m.group(2))
        if rank != want_rank or (want_size is not None and size != want_size):
            die(f"{path}:1: says rank {rank} of {size}, expected rank {want_rank}"
                + (f" of {want_size}" if want_size is not None else "")
                + " (a part left over from another run?)")
        for no, line in enumerate(f, start=2):
            parts = line.rstrip("\n").split(" ", 2 if line.startswith("p ") else 5)
            if parts[0] == "p" and len(parts) == 3:
                key = int(parts[1], 16)
                if key not in names:
                    order[key] = len(order)
                names[key] = parts[2]
            elif parts[0] == "t" and len(parts) == 5:
                try:
                    key, pos, b, h = int(parts[1], 16), int(parts[2]), int(parts[3]), parts[4]
                except ValueError:
                    die(f"{path}:{no}: malformed record {line.strip()[:80]!r}")
                rows[(key, pos, b)] = h
            else:
                die(f"{path}:{no}: malformed record {line.strip()[:80]!r}")
    return size


def read_trace(path):
    rows, names, order = {}, {}, {}
    size = read_part(path, 0, None, rows, names, order)
    for r in range(1, size):
        read_part(f"{path}.{r}", r, size, rows, names, order)
    return rows, names, order, size


def main(argv):
    if len(argv) != 3:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    a, names, order, na = read_trace(argv[1])
    b, names_b, order_b, nb = read_trace(argv[2])
    for k, v in names_b.items():
        names.setdefault(k, v)
        order.setdefault(k, len(order) + order_b[k])
    keys = set(a) | set(b)
    diff = sorted((k for k in keys if a.get(k) != b.get(k)),
                  key=lambda k: (order.get(k[0], 1 << 62), k[1], k[2]))
    print(f"trace_diff: {argv[1]} ({na} rank{'s' * (na != 1)}, {len(a)} rows) vs "
          f"{argv[2]} ({nb} rank{'s' * (nb != 1)}, {len(b)} rows)")
    if not diff:
        print("trace_diff: identical: every residual row at every layer boundary has the same bits")
        return 0
    key, pos, bd = diff[0]
    page = names.get(key, f"key {key:016x}")
    where = "the input rows (embeddings)" if bd == 0 else f"the output of layer {bd - 1}"
    print(f"trace_diff: first difference: page {page}, position {pos}, boundary {bd} ({where}):")
    print(f"  {argv[1]}: {a.get((key, pos, bd), 'absent')}")
    print(f"  {argv[2]}: {b.get((key, pos, bd), 'absent')}")
    pages = {k[0] for k in diff}
    print(f"trace_diff: {len(diff)} of {len(keys)} rows differ, in {len(pages)} page{'s' * (len(pages) != 1)}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
