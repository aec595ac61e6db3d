"""``np.save`` and ``np.savetxt`` of a DTensor to a path: each rank writes its own
part of the one file NumPy would write, through the sharded writer of
:mod:`mpitensor.checkpoint` (a temporary file swapped into place).

``np.save`` is ``mpitensor.save``'s .npy file, the name completed with
``.npy`` as NumPy completes it, and without syncs, as NumPy makes none.
``np.savetxt`` formats each rank's rows with NumPy's own ``savetxt``; a scan of
the lengths of the ranks' texts places each in the file, so the file is NumPy's
byte for byte. A layout whose ranks do not hold whole rows (Shard(1)) has them
moved into rows first (one all-to-all, or a gather of the columns where the rows
are cut too); the scan and its total are two small collectives. A file object, a
compressed name (``.gz``, ...) or an encoding whose parts cannot be encoded
apart keep the gathered fallback. ``savez`` and ``savez_compressed`` are
:mod:`._npz`'s.
"""

from __future__ import annotations

import io
import locale
import os

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._ops._apply import whole_axis
from ..placement_types import Replicate, Shard
from . import _agree, _io, _paths, _tensor

__all__ = ["save", "savetxt"]

_COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lzma")


def _path(name, file) -> str:
    """``file`` as a str path, or NoRule (a file object keeps the fallback)."""
    if not isinstance(file, (str, os.PathLike)):
        raise _registry.NoRule(f"{name}: only a path (str or PathLike) is written in parts")
    path = os.fspath(file)
    if not isinstance(path, str):
        raise _registry.NoRule(f"{name}: only a str path is written in parts")
    return path


@_registry.implements(np.save)
def save(file, arr, allow_pickle=True, fix_imports=np._NoValue):
    """``np.save`` of a DTensor to a path: the .npy file NumPy writes, each rank
    writing its own part (as ``mpitensor.save``). Collective on the DTensor's mesh.

    Example: ``np.save("w", dt)`` writes ``w.npy``; ``np.load("w.npy")`` is the
    whole array.
    """
    path = _path("numpy.save", file)
    if type(arr) is not DTensor:
        raise _registry.NoRule("numpy.save: the DTensor rule takes a DTensor array")
    if not path.endswith(".npy"):
        path += ".npy"
    path = os.path.realpath(path)
    if arr.device_mesh.get_coordinate() is not None:
        _agree.same_path(arr.device_mesh, path, lambda: _paths.check_target(path))
    _tensor.save_dtensor(arr, path, durable=False)


def _encoding(name, encoding) -> str:
    """The encoding NumPy's text file to a path uses, when parts encoded apart join
    into the whole's encoding (not one that starts with a byte-order mark)."""
    enc = encoding if encoding is not None else locale.getpreferredencoding(False)
    if "aa".encode(enc) != "a".encode(enc) * 2:
        raise _registry.NoRule(f"{name}: the encoding {enc!r} is not written in parts")
    return enc


def _text(X, **kw) -> str:
    out = io.StringIO()
    np.savetxt(out, X, **kw)
    return out.getvalue()


def _rows(X):
    """``X`` laid out so that each rank holds whole rows (a Partial reduced)."""
    spec = X._spec
    if X.ndim == 2:
        pls = whole_axis(spec, 1)
    else:
        pls = tuple(p if type(p) is Shard else Replicate() for p in spec.placements)
    return X if pls == spec.placements else X.redistribute(spec.mesh, pls)


def _start_and_total(X, nbytes: int, writes: bool) -> tuple[int, int]:
    """Where this rank's text starts in the body and the body's length: a scan of
    the text lengths, each put on the rank's last row. Collective on the mesh."""
    rows = X.to_local().shape[0]
    lengths = np.zeros(rows, np.int64)
    if rows:
        lengths[-1] = nbytes if writes else 0
    spec = X._spec
    # A mesh dim that still cuts the columns has one coordinate (_rows moved the rest).
    pls = [p if p == Shard(0) else Replicate() for p in spec.placements]
    lens = DTensor.from_local(lengths, spec.mesh, pls, run_check=False,
                              shape=(X.shape[0],), stride=(1,))
    ends = np.cumsum(lens).to_local()
    total = int(np.sum(lens).full_tensor())
    return (int(ends[-1]) - int(lengths[-1]) if rows else 0), total


@_registry.implements(np.savetxt)
def savetxt(fname, X, fmt="%.18e", delimiter=" ", newline="\n", header="", footer="",
            comments="# ", encoding=None):
    """``np.savetxt`` of a 1-D or 2-D DTensor to a path: each rank formats its own
    rows with NumPy's ``savetxt`` and writes them where a scan of the lengths puts
    them, so the file is NumPy's byte for byte. Collective on the DTensor's mesh;
    a Shard(1) layout moves into rows first.

    Example: ``np.savetxt("x.txt", dt, fmt="%d", delimiter=",")``.
    """
    name = "numpy.savetxt"
    path = _path(name, fname)
    if type(X) is not DTensor:
        raise _registry.NoRule(f"{name}: the DTensor rule takes a DTensor array")
    if path.endswith(_COMPRESSED):
        raise _registry.NoRule(f"{name}: a compressed file is not written in parts")
    if X.ndim not in (1, 2):
        raise ValueError(f"Expected 1D or 2D array, got {X.ndim}D array instead")
    enc = _encoding(name, encoding)
    kw = dict(fmt=fmt, delimiter=delimiter, newline=newline, comments=comments,
              encoding=encoding)
    X = _rows(X.detach())
    mesh = X.device_mesh
    inside = mesh.get_coordinate() is not None
    empty = np.zeros((0,) + X.shape[1:], X.dtype)
    # Every rank formats (its rows, or none) so a bad fmt raises on every rank alike.
    local = X.to_local() if inside else empty
    head = _text(empty, header=header, **kw).encode(enc)
    foot = _text(empty, footer=footer, **kw).encode(enc)
    body = _text(local, **kw).encode(enc)
    if not inside:
        return
    writes = _tensor._writes(mesh, X.placements)
    start, total = _start_and_total(X, len(body), writes)
    path = os.path.realpath(path)
    _agree.same_path(mesh, path, lambda: _paths.check_target(path))
    mine = body if writes else b""
    last = start + len(mine) == total and (len(mine) > 0 or (
        total == 0 and all(c == 0 for c in mesh.get_coordinate())))
    if last:
        mine += foot
    data = np.frombuffer(mine, np.uint8) if mine else np.zeros(0, np.uint8)
    _io.io_save(mesh, path, head, (total + len(foot),), 1, len(head),
                (start if mine else 0,), (len(mine),), data, durable=False)
