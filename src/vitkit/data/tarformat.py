"""The tar format, read as untrusted input: member headers of an uncompressed tar, checked and bounded.

Every field a header claims is checked against the file before it is used: a member's size against
the bytes left after its header (a forged 8 GiB size is an error at once, nothing is allocated for
it), numbers must be non-negative octal or GNU base-256, long names (GNU 'L' records) and pax headers
are at most MAX_EXTENDED bytes, pax records must each move forward, and member types other than
regular files are passed over by their (bounded) size.  Any violation is a `TarFormatError` naming the
byte where it was found; the reader never goes backwards, so a damaged file ends, it never loops.  A file
that stops before tar's end-of-archive zero block (inside a header, a member's data or its padding, or
at a header boundary) is a `TarTruncatedError`: every tar writer ends an archive with zero blocks, and a
copy cut short at a member boundary would otherwise read as a smaller, whole shard.

A small reader of our own rather than the standard library's `tarfile`: listing members is header
reads and seeks only, about 3.5 times cheaper per member (benchmarks/data_pipeline.py), and a
stream resuming mid-epoch seeks straight to a member.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

BLOCK = 512  # tar's record unit: every header, and every member's data padded to a multiple
MAX_EXTENDED = 1 << 20  # bytes of a GNU long name or a pax header at most (real ones are far smaller)
REGULAR = (b"0", b"\0", b"7")  # regular file, old-style regular file, contiguous file
EXTENDED = (b"L", b"x")  # the next member's long name (GNU) or pax records


class TarFormatError(ValueError):
    """A shard whose tar structure does not parse: a damaged or forged header, or the file ends inside a member."""


class TarTruncatedError(TarFormatError):
    """A shard that ends before its end-of-archive block: the file was cut short (a copy or write interrupted)."""


@dataclass(frozen=True)
class Member:
    name: str
    offset: int  # where the data starts
    size: int


def file_size(handle: BinaryIO) -> int:
    """The size of the open file, in bytes (the bound on every offset and size a header claims)."""
    try:
        return os.fstat(handle.fileno()).st_size
    except (AttributeError, OSError, ValueError):  # an in-memory file
        here = handle.tell()
        end = handle.seek(0, os.SEEK_END)
        handle.seek(here)
        return end


def _number(field: bytes, position: int) -> int:
    """A tar numeric field: octal text, or GNU base-256 (top bit set) for large values; never negative."""
    if field[:1] and field[0] & 0x80:
        if field[0] == 0xFF:  # base-256 negative numbers: meaningless for sizes and checksums
            raise TarFormatError(f"negative number field in the header at byte {position}")
        return int.from_bytes(field[1:], "big")
    text = field.split(b"\0", 1)[0].strip(b" ")  # as tarfile: up to the first NUL
    if text and not text.isdigit() or any(char in text for char in b"89"):
        raise TarFormatError(f"bad number field {bytes(field)!r} in the header at byte {position}")
    return int(text or b"0", 8)


def _pax_path(records: bytes, position: int) -> bytes | None:
    """The `path` of a pax extended header ("<length> <key>=<value>\\n" records, each length > 0)."""
    start = 0
    while start < len(records):
        space = records.find(b" ", start)
        if space < 0:
            break
        length = records[start:space]
        if not length.isdigit() or int(length) <= space - start or start + int(length) > len(records):
            raise TarFormatError(f"damaged pax header at byte {position} (record length {bytes(length[:20])!r})")
        key, _, value = records[space + 1 : start + int(length) - 1].partition(b"=")
        if key == b"path":
            return value
        start += int(length)
    return None


def _header_name(header: bytes, long_name: bytes | None) -> bytes:
    name = header[:100].split(b"\0", 1)[0]
    prefix = header[345:500].split(b"\0", 1)[0] if header[257:262] == b"ustar" else b""
    return long_name or (prefix + b"/" + name if prefix else name)


def _cut_after(position: int, end: int, name: bytes) -> str:
    """What a file that stops where the header at `position` should be, after member `name`, lost."""
    where = "inside the padding of" if position > end else "right after"
    return (
        f"truncated: the file ends at byte {end:,}, {where} member {name.decode('utf-8', 'replace')!r}, "
        "without tar's end-of-archive block"
    )


def tar_members(handle: BinaryIO) -> Iterator[Member]:
    """The regular files of an uncompressed tar, front to back: header reads and seeks, no data read.

    Reads ustar, GNU (long names in 'L' records, base-256 sizes) and pax ('path' records) headers.
    Raises TarFormatError at the first header whose checksum fails or whose fields do not fit the file,
    TarTruncatedError where the file stops before the end-of-archive block.
    """
    end, position, long_name, name = file_size(handle), 0, None, b""
    while True:
        handle.seek(position)
        header = handle.read(BLOCK)
        if not header:  # no end-of-archive block: the file was cut at or after a member, or is empty (tar refuses it)
            raise TarTruncatedError(
                _cut_after(position, end, name) if position else "empty (0 bytes), not even an end-of-archive block"
            )
        if not header.strip(b"\0"):  # the end-of-archive zero blocks
            return
        if len(header) < BLOCK:
            raise TarTruncatedError(f"the file ends inside a header at byte {position}")
        if position == 0 and header[:2] == b"\x1f\x8b":
            raise TarFormatError("gzip-compressed (a .tar.gz), which is not read: decompress it with gunzip")
        if _number(header[148:156], position) != sum(header[:148]) + 256 + sum(header[156:]):
            raise TarFormatError(f"header checksum mismatch at byte {position}")
        size, kind = _number(header[124:136], position), header[156:157]
        name, data = _header_name(header, long_name), position + BLOCK
        if size > end - data:
            raise TarTruncatedError(
                f"member {name.decode('utf-8', 'replace')!r} (type {kind!r}) at byte {position} "
                f"claims {size:,} bytes, but the file has {end - data:,} bytes after its header"
            )
        position = data + -(-size // BLOCK) * BLOCK
        if kind in EXTENDED:
            if size > MAX_EXTENDED:
                raise TarFormatError(
                    f"extended header of {size:,} bytes at byte {data - BLOCK} (limit {MAX_EXTENDED:,})"
                )
            extra = read_member(handle, Member("(extended header)", data, size))
            long_name = extra.split(b"\0", 1)[0] if kind == b"L" else (_pax_path(extra, data) or long_name)
            continue
        if kind in REGULAR:
            yield Member(name.decode("utf-8", "surrogateescape"), data, size)
        long_name = None


def read_member(handle: BinaryIO, member: Member) -> bytes:
    """The data of `member` (its size was bounded by the file when its header was read)."""
    handle.seek(member.offset)
    data = handle.read(member.size)
    if len(data) != member.size:
        raise TarTruncatedError(f"the file ends inside member {member.name!r}")
    return data
