#!/usr/bin/env python3
"""Compares the tokenizer identity test's outputs: one line per corpus string
from pipedec (tok_batch), llama.cpp (llama_tok) and Hugging Face (tok_hf.cjs),
each "[ids]<TAB>roundtrip". Prints the counts and the first differences;
exits 1 when pipedec differs from llama.cpp on any string, or from Hugging
Face on a string where llama.cpp and Hugging Face agree, or when pipedec does
not round-trip a string both references round-trip.
usage: tok_compare.py CORPUS.jsonl PIPEDEC.out LLAMA.out HF.out
"""
import json
import sys


def load(p):
    rows = []
    for line in open(p, encoding="utf-8"):
        line = line.rstrip("\n")
        if line.startswith("refused:"):
            rows.append((None, False))
            continue
        ids, rt = line.split("\t")
        rows.append((json.loads(ids), rt == "1"))
    return rows


def main():
    corpus = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
    pd, ll, hf = (load(p) for p in sys.argv[2:5])
    n = len(corpus)
    assert len(pd) == len(ll) == len(hf) == n, (len(pd), len(ll), len(hf), n)
    same_ll = sum(pd[i][0] == ll[i][0] for i in range(n))
    same_hf = sum(pd[i][0] == hf[i][0] for i in range(n))
    ll_hf = sum(ll[i][0] == hf[i][0] for i in range(n))
    bad_hf = [i for i in range(n) if ll[i][0] == hf[i][0] and pd[i][0] != hf[i][0]]
    refs_rt = [i for i in range(n) if ll[i][1] and hf[i][1]]
    pd_rt = sum(pd[i][1] for i in refs_rt)
    ntok = sum(len(x[0]) for x in ll if x[0] is not None)
    print("corpus: %d strings, %d bytes, %d tokens (llama.cpp)" %
          (n, sum(len(s.encode()) for s in corpus), ntok))
    print("identical ids: pipedec = llama.cpp %d/%d, pipedec = Hugging Face %d/%d, "
          "llama.cpp = Hugging Face %d/%d" % (same_ll, n, same_hf, n, ll_hf, n))
    print("round trip: pipedec %d/%d of the strings both references round-trip "
          "(pipedec alone %d/%d)" % (pd_rt, len(refs_rt), sum(x[1] for x in pd), n))
    shown = 0
    for i in range(n):
        if (pd[i][0] != ll[i][0] or pd[i][0] != hf[i][0]) and shown < 8:
            shown += 1
            print("  #%d %r\n    pipedec %s\n    llama   %s\n    hf      %s" %
                  (i, corpus[i][:80], str(pd[i][0])[:160], str(ll[i][0])[:160], str(hf[i][0])[:160]))
    ok = same_ll == n and not bad_hf and pd_rt == len(refs_rt)
    print("PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
