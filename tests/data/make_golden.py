#!/usr/bin/env python3
"""Writes the golden CMFS records, bundles and stream record of tests/data from
the byte tables in docs/wire.md and cluster/runtime/pipeline/stream.h, independently of the C encoder (so the e2e test
checks the decoder against the documentation, not against itself).
usage: tests/data/make_golden.py [OUT_DIR]   (default: the script's folder)"""
import os
import struct
import sys

IDENTITY = 0x1122334455667788
LAYER = 3


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def header(kind, f16, position, identity=IDENTITY, layer=LAYER, version=2):
    return b"CMFS" + struct.pack("<IQIBBHQ", version, identity, layer, kind, f16, 0, position)


def full_body(f16):
    # 2 rows, 2 kv heads x 2 channels, head 1 dead, 1 linear value, importance
    out = struct.pack("<6I", f16, 2, 2, 2, 1, 2)
    out += struct.pack("<3f", 0.75, 1.5, 0.5)
    k = [1.0, -2.0, 0.5, 0.25]
    v = [-1.0, 2.0, -0.5, 4.0]
    fmt = "<4e" if f16 else "<4f"
    out += struct.pack("<I", 4) + struct.pack(fmt, *k)
    out += struct.pack("<I", 4) + struct.pack(fmt, *v)
    out += struct.pack("<2I", 0, 0)
    return out


def ring_record():
    # 1 head x 1 channel, window 2, 1 reference row, 3 writes: len 2, pos 1
    body = struct.pack("<6IQBBH", 1, 1, 2, 1, 2, 1, 3, 1, 0, 0)
    body += struct.pack("<If", 1, 1.0) + struct.pack("<If", 1, 2.0)
    body += struct.pack("<I2f", 2, 3.0, 4.0) + struct.pack("<I2f", 2, 5.0, 6.0)
    return header(4, 0, 4) + body


def ring_q8_record():
    # kind 6: 1 head x 2 channels, window 2, k_group 32, 1 reference row,
    # 3 writes (len 2, pos 1), mode 1 (q8k: K int8 + scales, V in the f16 payload)
    body = struct.pack("<4I", 1, 2, 2, 32) + struct.pack("<3IQBBH", 1, 2, 1, 3, 1, 1, 0)
    body += struct.pack("<I2b", 2, 127, -64) + struct.pack("<If", 1, 0.5)
    body += struct.pack("<I2e", 2, 1.0, -2.0) + struct.pack("<I", 0)
    body += struct.pack("<I4b", 4, 1, 127, -127, 0) + struct.pack("<I2f", 2, 1.0, 2.0)
    body += struct.pack("<I4e", 4, 0.5, 0.25, -4.0, 8.0) + struct.pack("<I", 0)
    return header(6, 1, 4) + body


def bundle(entries, identity=IDENTITY, layer=LAYER):
    head = b"CMFB" + struct.pack("<IQIIQ", 1, identity, layer, 0, len(entries))
    out = head + struct.pack("<I", crc32c(head))
    for sid, rec in entries:
        e = struct.pack("<QQ", sid, len(rec)) + rec
        out += e + struct.pack("<I", crc32c(e))
    return out


def fnv1a64(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def stream_record():
    # the per-stream state record of cluster/runtime/pipeline/stream.h, version 1
    page_id = b"p00001"
    tokens = [17, 4, 299]
    out = b"PDSS" + struct.pack("<HH", 1, 0)
    out += struct.pack("<5Q", 3, 1, fnv1a64(page_id), 12, 12)
    out += struct.pack("<IIQI", 20, len(tokens), 0x0123456789ABCDEF, len(page_id))
    return out + page_id + struct.pack("<%dI" % len(tokens), *tokens)


def ckpt_manifest():
    # the checkpoint manifest of cluster/runtime/ops/ckpt_manifest.h, version 1:
    # 2 layers, one stream (stream_record's)
    rec = stream_record()
    settings, lmap = b"policy attn=full; seed 0", b"0-1"
    out = b"PDCK" + struct.pack("<HH", 1, 0)
    out += struct.pack("<5Q", 1, 0x1111, 0x2222, 0, 4) + struct.pack("<II", 2, 1)
    out += struct.pack("<I", len(settings)) + settings + struct.pack("<I", len(lmap)) + lmap
    for layer in range(2):
        out += struct.pack("<IQI", layer, 36, 0x1234 + layer)
    out += struct.pack("<I", len(rec)) + rec
    return out + struct.pack("<I", crc32c(out))


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    full32 = header(0, 0, 2) + full_body(0)
    full16 = header(0, 1, 2) + full_body(1)
    tail = header(3, 0, 7) + struct.pack("<Q", 5) + full_body(0)
    files = {
        "full_f32.cmfs": full32,
        "full_f16.cmfs": full16,
        "full_tail.cmfs": tail,
        "ring.cmfs": ring_record(),
        "ring_q8.cmfs": ring_q8_record(),
        "legacy_full.bin": full_body(0),
        "bad_version.cmfs": header(0, 0, 2, version=3) + full_body(0),
        "bad_count.cmfs": full32[:32 + 36] + struct.pack("<I", 3) + full32[32 + 40:],
        "two_streams.cmfb": bundle([(7, full32), (1 << 40, tail)]),
        "bad_crc.cmfb": bytearray(bundle([(7, full32), (9, ring_record())])),
        "stream.pdss": stream_record(),
        "manifest.pdck": ckpt_manifest(),
    }
    files["bad_crc.cmfb"][-1] ^= 0x40
    for name, data in files.items():
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(bytes(data))


if __name__ == "__main__":
    main()
