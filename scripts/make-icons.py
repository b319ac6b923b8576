#!/usr/bin/env python3
"""Draws Postern's app icon (an arched gate in a rounded square) into icons/.

Pure standard library: shapes are sampled 4x4 per pixel for anti-aliasing and written
as RGBA PNG. Run from the repository root: python3 scripts/make-icons.py
"""
import struct
import zlib
from pathlib import Path

BG = (28, 36, 52)
GATE = (242, 177, 52)
DOOR = (20, 26, 38)


def inside_rounded(x, y, r):
    # Unit square [0,1]^2 with corner radius r.
    cx = min(max(x, r), 1 - r)
    cy = min(max(y, r), 1 - r)
    return (x - cx) ** 2 + (y - cy) ** 2 <= r * r


def inside_arch(x, y, left, right, top, bottom):
    # A rectangle topped by a half circle spanning left..right.
    if x < left or x > right or y > bottom:
        return False
    mid = (left + right) / 2
    radius = (right - left) / 2
    spring = top + radius
    if y >= spring:
        return True
    return (x - mid) ** 2 + (y - spring) ** 2 <= radius * radius


def color_at(x, y):
    if not inside_rounded(x, y, 0.22):
        return None
    if inside_arch(x, y, 0.30, 0.70, 0.20, 0.80):
        if inside_arch(x, y, 0.39, 0.61, 0.31, 0.80):
            # The open door, with a keyhole of the gate colour.
            if (x - 0.5) ** 2 + (y - 0.55) ** 2 <= 0.035 ** 2 or (
                abs(x - 0.5) <= 0.017 and 0.55 <= y <= 0.66
            ):
                return GATE
            return DOOR
        return GATE
    return BG


def render(size):
    rows = []
    n = 4
    for py in range(size):
        row = bytearray([0])
        for px in range(size):
            acc = [0, 0, 0, 0]
            for sy in range(n):
                for sx in range(n):
                    c = color_at((px + (sx + 0.5) / n) / size, (py + (sy + 0.5) / n) / size)
                    if c is not None:
                        acc[0] += c[0]
                        acc[1] += c[1]
                        acc[2] += c[2]
                        acc[3] += 255
            covered = acc[3] // 255
            if covered == 0:
                row += bytes(4)
            else:
                row += bytes([acc[0] // covered, acc[1] // covered, acc[2] // covered, acc[3] // (n * n)])
        rows.append(bytes(row))
    raw = b"".join(rows)

    def chunk(kind, data):
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", size, size, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(raw, 9))
        + chunk(b"IEND", b"")
    )


def main():
    out = Path("icons")
    out.mkdir(exist_ok=True)
    for name, size in [("32x32.png", 32), ("128x128.png", 128), ("128x128@2x.png", 256), ("icon.png", 512)]:
        (out / name).write_bytes(render(size))


if __name__ == "__main__":
    main()
