"""The zip records of a .npz archive, made by hand so that ranks can write the
members' bytes in parts: local file headers, the central directory and the end
records, as Python's ``zipfile`` writes them for ``numpy.savez`` (every member
with a ZIP64 extra field in its local header, NumPy's ``force_zip64``; ZIP64 in
the central directory and the end records only where a size or offset needs it).

A member's CRC-32 is combined from its parts' CRCs (:func:`crc32_combine`), and a
compressed member is one raw deflate stream made of parts compressed apart, as
pigz makes it: each part ends on a byte boundary with a sync flush, the last one
with the final block (:func:`deflate_part`).

Every function here is Local.
"""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

STORED, DEFLATED = 0, 8
# zipfile's threshold for ZIP64 records (zipfile.ZIP64_LIMIT), and its counts'.
ZIP64_LIMIT = (1 << 31) - 1
COUNT_LIMIT = 0xFFFF
_ZIP64_VERSION = 45
_UNIX = 3
_MODE_600 = 0o600 << 16
_UTF8_NAME = 0x800
# zipfile dates a member written through ZipFile.open() 1980-01-01 00:00:00.
_DOS_DATE, _DOS_TIME = (0 << 9) | (1 << 5) | 1, 0
_LOCAL = struct.Struct("<4s2B4HL2L2H")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_END = struct.Struct("<4s4H2LH")
_END64 = struct.Struct("<4sQ2H2L4Q")
_LOCATOR = struct.Struct("<4sLQL")

# CRC-32 (reflected) arithmetic modulo its polynomial, as zlib's crc32_combine.
_POLY = 0xEDB88320
_ONE = 1 << 31  # the polynomial 1 in reflected bit order


class Member(NamedTuple):
    """One member's entry: its name as stored, the general-purpose flags that
    name needs, the compression method, CRC-32, sizes, and where its local header
    starts in the archive."""

    name: bytes
    flags: int
    method: int
    crc: int
    compressed: int
    size: int
    offset: int


def _multmodp(a: int, b: int) -> int:
    """The product of two polynomials modulo the CRC-32 polynomial."""
    m, p = _ONE, 0
    while m:
        if a & m:
            p ^= b
        b = (b >> 1) ^ _POLY if b & 1 else b >> 1
        m >>= 1
    return p


def _x_to_8n(n: int) -> int:
    """x to the power 8 * ``n`` (``n`` zero bytes) modulo the polynomial."""
    power, square = _ONE, _ONE >> 8  # x^8
    while n:
        if n & 1:
            power = _multmodp(square, power)
        square = _multmodp(square, square)
        n >>= 1
    return power


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC-32 of ``A + B`` from ``crc1`` of ``A``, ``crc2`` of ``B`` and
    ``len2``, the length of ``B``: zlib's ``crc32_combine``, which Python's zlib
    does not expose.

    Example: ``crc32_combine(zlib.crc32(a), zlib.crc32(b), len(b)) ==
    zlib.crc32(a + b)``.
    """
    return _multmodp(_x_to_8n(len2), crc1) ^ crc2


def name_of(key: str) -> tuple[bytes, int]:
    """The stored name of the member ``key`` and its flags, as ``zipfile.ZipInfo``
    makes them: cut at a NUL, ASCII where it can be, else UTF-8 with the flag
    that says so."""
    name = key.split("\0", 1)[0]
    try:
        return name.encode("ascii"), 0
    except UnicodeEncodeError:
        return name.encode("utf-8"), _UTF8_NAME


def local_header_size(name: bytes) -> int:
    """The length of a member's local header (with its ZIP64 extra field)."""
    return _LOCAL.size + len(name) + 20


def local_header(m: Member) -> bytes:
    """The local file header of ``m``, as ``ZipFile.open(name, "w",
    force_zip64=True)`` writes it once the member is closed: its sizes in the
    ZIP64 extra field."""
    extra = struct.pack("<HHQQ", 1, 16, m.size, m.compressed)
    return _LOCAL.pack(b"PK\x03\x04", _ZIP64_VERSION, 0, m.flags, m.method, _DOS_TIME,
                       _DOS_DATE, m.crc, 0xFFFFFFFF, 0xFFFFFFFF, len(m.name),
                       len(extra)) + m.name + extra


def _central_entry(m: Member, limit: int) -> bytes:
    extra = []
    compressed, size, offset = m.compressed, m.size, m.offset
    if size > limit or compressed > limit:
        extra += [size, compressed]
        compressed = size = 0xFFFFFFFF
    if offset > limit:
        extra.append(offset)
        offset = 0xFFFFFFFF
    field = struct.pack(f"<HH{len(extra)}Q", 1, 8 * len(extra), *extra) if extra else b""
    return _CENTRAL.pack(b"PK\x01\x02", _ZIP64_VERSION, _UNIX, _ZIP64_VERSION, 0, m.flags,
                         m.method, _DOS_TIME, _DOS_DATE, m.crc, compressed, size,
                         len(m.name), len(field), 0, 0, 0, _MODE_600, offset) + m.name + field


def directory(members: list, start: int, limit: int = ZIP64_LIMIT) -> bytes:
    """The central directory of ``members``, starting at byte ``start`` of the
    archive, and the end records after it: ZIP64 ones where the count, the
    directory's size or its offset exceed what zipfile writes without them
    (``limit``, zipfile's; smaller in tests)."""
    body = b"".join(_central_entry(m, limit) for m in members)
    count, size = len(members), len(body)
    end64 = b""
    if count > COUNT_LIMIT or start > limit or size > limit:
        end64 = (_END64.pack(b"PK\x06\x06", 44, _ZIP64_VERSION, _ZIP64_VERSION, 0, 0, count,
                             count, size, start)
                 + _LOCATOR.pack(b"PK\x06\x07", 0, start + size, 1))
        count, size, start = (min(count, COUNT_LIMIT), min(size, 0xFFFFFFFF),
                              min(start, 0xFFFFFFFF))
    return body + end64 + _END.pack(b"PK\x05\x06", 0, 0, count, count, size, start, 0)


def deflate_part(data, level: int, last: bool) -> bytes:
    """``data`` as raw deflate blocks that a following part can continue: ended by
    a sync flush on a byte boundary, or with the final block when ``last``. The
    parts of a member, each from its own compressor, joined in order, are one
    valid deflate stream (the last part must be ``last``)."""
    c = zlib.compressobj(level, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(zlib.Z_FINISH if last else zlib.Z_SYNC_FLUSH)
