"""The .npy header: written here byte for byte as numpy.save writes it, and read
with numpy's own parser, so files go both ways between mpitensor and NumPy.

bfloat16 is the one exception: numpy.save describes it as ``'<V2'``, raw bytes
that nothing can load back as numbers. Its header names it ``'bfloat16'``, which
``numpy.load`` turns into ml_dtypes' bfloat16 when ml_dtypes is imported (without
it numpy.load says the dtype is not understood, rather than giving raw bytes).

Only the header is handled in Python; the data bytes after it travel through the
C core (mpitensor.checkpoint._io: POSIX I/O per rank, or MPI-IO).
"""

from __future__ import annotations

import ast
import io
import re
import math
from typing import NamedTuple

import numpy as np
from numpy.lib import format as npformat

from .. import _dtypes

MAGIC = b"\x93NUMPY"
# numpy.load refuses headers above 10000 bytes unless told otherwise; a prefix
# this long holds every header it accepts.
PREFIX_BYTES = 16384


class NpyHeader(NamedTuple):
    """What a .npy header says: the array's shape and dtype, whether its data is
    in Fortran order, and the byte offset where the data starts."""

    shape: tuple[int, ...]
    dtype: np.dtype
    fortran_order: bool
    offset: int

    @property
    def nbytes(self) -> int:
        # Python integers: a header may claim more bytes than an int64 counts.
        return math.prod(self.shape) * self.dtype.itemsize


def encode(shape: tuple[int, ...], dtype: np.dtype) -> bytes:
    """The header numpy.save writes for a C-order array, byte for byte: NumPy's own
    writer. Local.

    Version 1.0 always fits: its 16-bit length holds the header of any numeric dtype
    and any shape of at most 64 dims (numpy.save moves to 2.0 only beyond)."""
    out = io.BytesIO()
    npformat.write_array_header_1_0(out, {"descr": descr(dtype),
                                          "fortran_order": False,
                                          "shape": tuple(int(s) for s in shape)})
    return out.getvalue()


def header_end(prefix: bytes) -> int:
    """Where the data starts by the length field of a .npy prefix (0 when
    ``prefix`` is not one), so a reader knows how much to read. Local."""
    if not prefix.startswith(MAGIC) or len(prefix) < 12:
        return 0
    if prefix[6] == 1:
        return 10 + int.from_bytes(prefix[8:10], "little")
    return 12 + int.from_bytes(prefix[8:12], "little")


def decode(prefix: bytes, path: str) -> NpyHeader:
    """Parses the header at the start of ``prefix`` (the file's first bytes).
    ValueError that names ``path`` for anything that is not a .npy file of a
    numeric dtype. Local."""
    if not prefix.startswith(MAGIC):
        raise ValueError(f"{path!r} is not a .npy file: it does not start with the "
                         f"NumPy magic string")
    if b"'bfloat16'" in prefix[:header_end(prefix)]:
        # NumPy reads the name once ml_dtypes is imported, which mpitensor does
        # only when bfloat16 is asked for.
        try:
            _dtypes.require_bfloat16()
        except ImportError:
            pass  # NumPy's error below names it
    f = io.BytesIO(prefix)
    try:
        version = npformat.read_magic(f)
        reader = {(1, 0): npformat.read_array_header_1_0,
                  (2, 0): npformat.read_array_header_2_0}.get(version)
        if reader is None:
            raise ValueError(f"format version {version} is not supported")
        shape, fortran_order, dtype = reader(f, max_header_size=PREFIX_BYTES)
    except (ValueError, SyntaxError, EOFError) as e:
        if "'bfloat16'" in str(e):  # NumPy knows the name only once ml_dtypes is imported
            raise TypeError(f"{path!r} holds bfloat16, which needs the ml_dtypes "
                            f"package: pip install ml_dtypes") from None
        # NumPy's parser names an AST node by its address, which differs by rank:
        # every rank must raise the same words.
        why = re.sub(r" at 0x[0-9a-fA-F]+", "", str(e))
        raise ValueError(f"{path!r} is not a valid .npy file: {why}") from None
    if (dtype.kind not in "biufc" and not _dtypes.is_bfloat16(dtype)) or dtype.hasobject \
            or dtype.fields is not None:
        raise TypeError(f"{path!r} holds dtype {dtype}; DTensors hold numeric data "
                        f"(bool, int, uint, float, complex)")
    return NpyHeader(tuple(int(s) for s in shape), dtype, bool(fortran_order), f.tell())


def descr(dtype: np.dtype) -> str:
    """The dtype as the .npy format names it ("<f4"; bfloat16 by its name), for
    headers and index files."""
    if _dtypes.is_bfloat16(dtype):
        return "bfloat16"
    return npformat.dtype_to_descr(dtype)


def dtype_of(text: str) -> np.dtype:
    """Inverse of :func:`descr`."""
    if text == "bfloat16":
        return _dtypes.require_bfloat16()
    return npformat.descr_to_dtype(ast.literal_eval(repr(text)))
