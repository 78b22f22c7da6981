"""Seeded mutations of valid inputs for the fuzz targets.

Byte-level mutations (bit flips, overwrites with boundary numbers, inserts, deletes, duplicated ranges,
truncation) reach little behind a checksum, so the format-aware ones rewrite a field and then fix what
guards it: a tar header's fields with its checksum recomputed, a PNG chunk with its CRC.  Everything
is drawn from the `random.Random` passed in, so an input is reproduced from its seed.
"""

from __future__ import annotations

import random
import struct
import zlib

BOUNDARY_NUMBERS = [
    0,
    1,
    2,
    7,
    8,
    0x7F,
    0x80,
    0xFF,
    0x100,
    0x7FFF,
    0x8000,
    0xFFFF,
    0x10000,
    0x7FFFFFFF,
    0x80000000,
    0xFFFFFFFF,
    1 << 33,
    (1 << 63) - 1,
]


def _span(rng: random.Random, data: bytearray, longest: int = 64) -> tuple[int, int]:
    start = rng.randrange(len(data) + 1)
    return start, min(len(data), start + rng.randint(1, longest))


def mutate_bytes(data: bytes, rng: random.Random, rounds: int | None = None) -> bytes:
    """1-8 random byte-level edits of `data`."""
    out = bytearray(data)
    for _ in range(rounds or rng.randint(1, 8)):
        kind = rng.randrange(8)
        if not out and kind not in (3, 7):
            kind = 3
        if kind == 0:  # flip a bit
            at = rng.randrange(len(out))
            out[at] ^= 1 << rng.randrange(8)
        elif kind == 1:  # a random byte
            out[rng.randrange(len(out))] = rng.randrange(256)
        elif kind == 2:  # a boundary number, 1/2/4/8 bytes, either byte order
            width = rng.choice([1, 2, 4, 8])
            value = rng.choice(BOUNDARY_NUMBERS) % (1 << (8 * width))
            at = rng.randrange(len(out))
            out[at : at + width] = value.to_bytes(width, rng.choice(["big", "little"]))
        elif kind == 3:  # insert random bytes
            at = rng.randrange(len(out) + 1)
            out[at:at] = rng.randbytes(rng.randint(1, 64))
        elif kind == 4:  # delete a range
            start, end = _span(rng, out)
            del out[start:end]
        elif kind == 5:  # duplicate a range somewhere else
            start, end = _span(rng, out, 512)
            at = rng.randrange(len(out) + 1)
            out[at:at] = out[start:end]
        elif kind == 6:  # truncate
            del out[rng.randrange(len(out) + 1) :]
        else:  # ASCII digits (sizes and counts written as text)
            at = rng.randrange(len(out) + 1)
            out[at : at + 12] = str(rng.choice(BOUNDARY_NUMBERS + [10 ** rng.randint(1, 30)])).encode()
    return bytes(out)


# ------------------------------------------------------------------------------ tar
TAR_FIELDS = {
    "name": (0, 100),
    "mode": (100, 8),
    "size": (124, 12),
    "mtime": (136, 12),
    "type": (156, 1),
    "linkname": (157, 100),
    "magic": (257, 6),
    "prefix": (345, 155),
}
TAR_TYPES = b"0\x0012345677LKxgSVMD?\xff"


def tar_headers(data: bytes) -> list[int]:
    """Offsets of the headers of a tar, walked by their octal size fields up to the first one that is not."""
    offsets, position = [], 0
    while position + 512 <= len(data) and data[position : position + 512].strip(b"\0"):
        text = data[position + 124 : position + 136].split(b"\0")[0].strip()
        if text and not text.isdigit() or b"8" in text or b"9" in text:
            break
        offsets.append(position)
        position += 512 + -(-int(text or b"0", 8) // 512) * 512
    return offsets


def _size_field(rng: random.Random) -> bytes:
    value = rng.choice(BOUNDARY_NUMBERS + [8 << 30, rng.randrange(1 << 20)])
    choice = rng.randrange(4)
    if choice == 0 and value < 8**11:
        return b"%011o\0" % value
    if choice == 1:  # GNU base-256, positive or negative
        return bytes([rng.choice([0x80, 0xFF])]) + (value % (1 << 88)).to_bytes(11, "big")
    if choice == 2:  # text that is not octal
        texts = [b"-0000001000\0", b"00000000009\0", b" 1 2 3     \0", b"1_000      \0", b"+17\0\0\0\0\0\0\0\0\0"]
        return rng.choice(texts)
    return rng.randbytes(12)


def fix_tar_checksum(header: bytearray) -> None:
    header[148:156] = b" " * 8
    header[148:156] = b"%06o\0 " % sum(header)


def mutate_tar(data: bytes, rng: random.Random) -> bytes:
    """Rewrite fields of 1-3 headers (checksums recomputed), sometimes followed by byte-level edits."""
    out, headers = bytearray(data), tar_headers(data)
    for _ in range(rng.randint(1, 3)):
        if not headers:
            break
        at = rng.choice(headers)
        header = out[at : at + 512]
        field = rng.choice(list(TAR_FIELDS))
        start, width = TAR_FIELDS[field]
        if field == "size":
            header[start : start + width] = _size_field(rng)
        elif field == "type":
            header[start] = rng.choice(TAR_TYPES)
        elif field in ("name", "prefix", "linkname"):
            text = rng.choice(
                [
                    rng.randbytes(rng.randint(0, width)),
                    b"x" * width,
                    "é/ü.png".encode(),
                    b"a.b.c.cls",
                    b"../../etc/passwd",
                    b".png",
                    b"noext",
                    b"\xff\xfe.png",
                ]
            )
            header[start : start + width] = text[:width].ljust(width, b"\0")
        else:
            header[start : start + width] = rng.randbytes(width)
        if rng.random() < 0.9:
            fix_tar_checksum(header)
        out[at : at + 512] = header
    if rng.random() < 0.2:
        out = bytearray(_extended_header(rng)) + out
    return mutate_bytes(bytes(out), rng, rng.randint(1, 3)) if rng.random() < 0.3 else bytes(out)


def _extended_header(rng: random.Random) -> bytes:
    """A GNU long-name ('L') or pax ('x') header with random or hostile records, in front of the first member."""
    kind = rng.choice([b"L", b"x"])
    records = rng.choice(
        [
            b"0 path=x.png\n",
            b"99999 path=a\n",
            b"12 path=x.png\n",
            rng.randbytes(rng.randint(1, 900)),
            b"a" * 600,
            b"13 path=\xff.png\n",
        ]
    )
    header = bytearray(512)
    header[:9], header[156:157] = b"././@Long", kind
    header[124:136] = b"%011o\0" % len(records)
    fix_tar_checksum(header)
    return bytes(header) + records + bytes(-len(records) % 512)


# ------------------------------------------------------------------------------ PNG
def png_chunks(data: bytes) -> list[tuple[bytes, bytes]] | None:
    """[(type, data)] of a well-formed PNG, or None."""
    if not data.startswith(b"\x89PNG\r\n\x1a\n"):
        return None
    chunks, position = [], 8
    while position + 12 <= len(data):
        length, kind = struct.unpack(">I4s", data[position : position + 8])
        chunks.append((kind, data[position + 8 : position + 8 + length]))
        position += 12 + length
    return chunks


def png_bytes(chunks: list[tuple[bytes, bytes]]) -> bytes:
    out = [b"\x89PNG\r\n\x1a\n"]
    for kind, body in chunks:
        out.append(struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body)))
    return b"".join(out)


def mutate_png(data: bytes, rng: random.Random) -> bytes:
    """Edit one chunk (IHDR's fields often), drop or repeat one, or inflate the image data; CRCs recomputed."""
    chunks = png_chunks(data)
    if not chunks:
        return mutate_bytes(data, rng)
    index = rng.randrange(len(chunks))
    kind, body = chunks[index]
    choice = rng.randrange(5)
    if choice == 0 or kind == b"IHDR" and choice < 3:
        ihdr = bytearray(chunks[0][1])
        field = rng.choice([(0, 4), (4, 4), (8, 1), (9, 1), (10, 1), (11, 1), (12, 1)])
        value = rng.choice(BOUNDARY_NUMBERS + [rng.randrange(1 << 16), 1, 2, 3, 4, 6, 16])
        ihdr[field[0] : field[0] + field[1]] = (value % (1 << (8 * field[1]))).to_bytes(field[1], "big")
        chunks[0] = (b"IHDR", bytes(ihdr))
    elif choice == 1:
        chunks[index] = (kind, mutate_bytes(body, rng))
    elif choice == 2:
        del chunks[index]
    elif choice == 3:
        chunks.insert(index, (kind, body))
    else:  # IDAT that inflates to far more than the header allows, or a text chunk with a zlib bomb
        bomb = zlib.compress(b"\0" * rng.choice([1 << 10, 1 << 20, 16 << 20]), 9)
        chunks.insert(max(1, index), (rng.choice([b"IDAT", b"zTXt", b"iCCP"]), b"k\0\0" + bomb))
    return png_bytes(chunks)
