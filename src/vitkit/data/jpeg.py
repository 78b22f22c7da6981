"""A JPEG's structure, read from its bytes before any pixel is decoded: the scans of its first frame.

A progressive JPEG's every scan decodes the whole image again, so a file of repeated scans is small and
slow: 125 KB of them took 20 s (decoders of every image vitkit reads refuse more than MAX_JPEG_SCANS).
"""

from __future__ import annotations

import re

MAX_JPEG_SCANS = 100  # real files have 1 (baseline) to about 12 (progressive)
_ENTROPY_END = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")  # where a scan's entropy-coded data ends: the next marker


def jpeg_scans(data: bytes | bytearray | memoryview, stop: int = MAX_JPEG_SCANS) -> int:
    """The scans of a JPEG's first frame, up to `stop` + 1: its markers walked from SOI to EOI, each segment skipped
    by its length and each scan's entropy-coded data to the next marker (what other segments, an EXIF thumbnail or
    data after EOI hold is not counted)."""
    position, scans = 2, 0
    while scans <= stop and position + 4 <= len(data):
        if data[position] != 0xFF:  # damaged: the decoder judges it
            return scans
        marker = data[position + 1]
        if marker == 0xFF or 0xD0 <= marker <= 0xD7 or marker == 0x01:  # fill byte, restart, TEM: no length
            position += 1 if marker == 0xFF else 2
            continue
        if marker == 0xD9:  # EOI
            return scans
        position += 2 + int.from_bytes(data[position + 2 : position + 4], "big")
        if marker == 0xDA:
            scans += 1
            found = _ENTROPY_END.search(data, position)
            position = found.start() if found else len(data)
    return scans
