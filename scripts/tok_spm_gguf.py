#!/usr/bin/env python3
"""Writes a small SentencePiece-style ("llama") vocabulary GGUF for the
tokenizer identity test against llama.cpp: <unk>, <s>, </s>, the 256
<0xNN> byte tokens, then pieces learnt crudely from a corpus of JSON strings
(every character seen at least MIN times, frequent character pairs and
triples, frequent "▁word"s; score = log frequency, so merges have a real
order), a CONTROL "<image>" and a USER_DEFINED "<u>". Characters seen less
often have no piece and fall back to byte tokens. A minimal "llama"
architecture header lets llama.cpp load it vocab-only.
usage: scripts/tok_spm_gguf.py CORPUS.jsonl OUT.gguf [ADD_SPACE_PREFIX 0|1]
"""
import collections
import json
import math
import sys

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from tok_gguf import T_ARR, T_BOOL, T_F32, T_I32, T_STR, T_U32, kv  # noqa: E402

SP = "\u2581"


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit(__doc__.strip().splitlines()[-1])
    corpus = [json.loads(l) for l in open(sys.argv[1], encoding="utf-8") if l.strip()]
    prefix = len(sys.argv) < 4 or sys.argv[3] != "0"
    chars, grams, words = collections.Counter(), collections.Counter(), collections.Counter()
    for s in corpus:
        t = s.replace(" ", SP)
        chars.update(t)
        for n in (2, 3):
            grams.update(t[i:i + n] for i in range(len(t) - n + 1))
        words.update(SP + w for w in s.split() if len(w) < 16)
    toks = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    scores = [0.0, 0.0, 0.0] + [0.0] * 256
    seen = set(toks)

    def add(t, c, ty=1):
        if t not in seen:
            seen.add(t)
            toks.append(t)
            types.append(ty)
            scores.append(math.log(c) if ty == 1 else 0.0)

    for c, n in sorted(chars.items(), key=lambda x: (-x[1], x[0])):
        if n >= 3:
            add(c, n)
    for g, n in sorted(grams.items(), key=lambda x: (-x[1], x[0]))[:1500]:
        add(g, n)
    for w, n in sorted(words.items(), key=lambda x: (-x[1], x[0]))[:1500]:
        add(w, n)
    add("<image>", 1, 3)
    add("<u>", 1, 4)
    kvs = [
        kv("general.architecture", T_STR, "llama"),
        kv("general.name", T_STR, "spm-tokenizer-only"),
        kv("llama.context_length", T_U32, 4096),
        kv("llama.embedding_length", T_U32, 64),
        kv("llama.block_count", T_U32, 1),
        kv("llama.feed_forward_length", T_U32, 128),
        kv("llama.attention.head_count", T_U32, 1),
        kv("llama.attention.head_count_kv", T_U32, 1),
        kv("llama.attention.layer_norm_rms_epsilon", T_F32, 1e-6),
        kv("llama.rope.dimension_count", T_U32, 64),
        kv("llama.vocab_size", T_U32, len(toks)),
        kv("tokenizer.ggml.model", T_STR, "llama"),
        kv("tokenizer.ggml.tokens", T_ARR, (T_STR, toks)),
        kv("tokenizer.ggml.token_type", T_ARR, (T_I32, types)),
        kv("tokenizer.ggml.scores", T_ARR, (T_F32, scores)),
        kv("tokenizer.ggml.bos_token_id", T_U32, 1),
        kv("tokenizer.ggml.eos_token_id", T_U32, 2),
        kv("tokenizer.ggml.unknown_token_id", T_U32, 0),
        kv("tokenizer.ggml.add_space_prefix", T_BOOL, prefix),
    ]
    import struct
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
    body += b"\0" * (-len(body) % 32)
    with open(sys.argv[2], "wb") as f:
        f.write(body)


if __name__ == "__main__":
    main()
