#!/usr/bin/env python3
"""Deterministic page images for the image-page tests, and broken ones.

usage: mkimages.py OUTDIR

Writes, from a seeded generator (no downloads, nothing committed):
  page-a.ppm   300 x 200 RGB (smaller than a tile: mtmd's overview only)
  page-b.png   900 x 700 RGB (larger than a tile: tiles + overview)
  page-c.jpg   640 x 800 (cjpeg from a PPM; grey-ish text lines)
and the bad pages of issue 38's table:
  empty.png    0 bytes
  text.png     a text file named .png
  huge.png     a valid PNG header claiming 60000 x 60000 pixels
  cut.png      page-b.png cut in the middle of its image data
  cut.jpg      page-c.jpg cut in the middle of its scan
  flip.png     page-b.png with its zlib stream's header byte flipped
"""
import os
import random
import struct
import subprocess
import sys
import zlib


def page_pixels(w, h, seed):
    """Light paper with dark 'text' strokes in lines, some colour."""
    rnd = random.Random(seed)
    px = bytearray()
    lines = [(y0, rnd.randrange(8, 18)) for y0 in range(20, h - 20, rnd.randrange(28, 40))]
    strokes = {}
    for y0, lh in lines:
        x = 20
        while x < w - 30:
            ww = rnd.randrange(6, 40)
            strokes.setdefault(y0, []).append((x, x + ww, lh))
            x += ww + rnd.randrange(4, 14)
    ink = [[False] * w for _ in range(h)]
    for y0, segs in strokes.items():
        for x0, x1, lh in segs:
            for y in range(y0, min(h, y0 + lh)):
                for x in range(x0, min(w, x1)):
                    if (x * 7 + y * 3 + seed) % 5 != 0:
                        ink[y][x] = True
    for y in range(h):
        for x in range(w):
            if ink[y][x]:
                px += bytes((20 + (x % 17), 25, 30 + (y % 23)))
            else:
                px += bytes((235 - (y * 10 // h), 232, 225 + (x * 20 // w)))
    return bytes(px)


def write_ppm(path, w, h, px):
    with open(path, "wb") as f:
        f.write(b"P6\n# pipedec test page\n%d %d\n255\n" % (w, h))
        f.write(px)


def png_chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def png_bytes(w, h, px):
    raw = b"".join(b"\x00" + px[y * w * 3:(y + 1) * w * 3] for y in range(h))
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(raw, 6)) + png_chunk(b"IEND", b""))


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    a = page_pixels(300, 200, 1)
    write_ppm(os.path.join(out, "page-a.ppm"), 300, 200, a)
    b = png_bytes(900, 700, page_pixels(900, 700, 2))
    open(os.path.join(out, "page-b.png"), "wb").write(b)
    c_ppm = os.path.join(out, "page-c-src.ppm")
    write_ppm(c_ppm, 640, 800, page_pixels(640, 800, 3))
    with open(os.path.join(out, "page-c.jpg"), "wb") as f:
        subprocess.run(["cjpeg", "-quality", "90", c_ppm], stdout=f, check=True)
    os.unlink(c_ppm)
    open(os.path.join(out, "empty.png"), "wb").close()
    open(os.path.join(out, "text.png"), "w").write("this is not an image\n")
    huge = (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", struct.pack(">IIBBBBB", 60000, 60000, 8, 2, 0, 0, 0))
            + png_chunk(b"IDAT", zlib.compress(b"\x00" * 64)) + png_chunk(b"IEND", b""))
    open(os.path.join(out, "huge.png"), "wb").write(huge)
    open(os.path.join(out, "cut.png"), "wb").write(b[: len(b) // 2])
    c = open(os.path.join(out, "page-c.jpg"), "rb").read()
    open(os.path.join(out, "cut.jpg"), "wb").write(c[: len(c) // 2])
    flip = bytearray(b)
    idat = flip.index(b"IDAT") + 4  # the zlib stream's first byte (CMF)
    flip[idat] ^= 0xFF
    open(os.path.join(out, "flip.png"), "wb").write(bytes(flip))


if __name__ == "__main__":
    main()
