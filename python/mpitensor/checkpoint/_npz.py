"""``np.savez`` and ``np.savez_compressed`` of DTensors to a path: the archive NumPy
writes, each rank writing its own bytes of each DTensor member.

A DTensor member is laid out so that each rank holds whole rows (a mesh dim that
cuts another dim cuts dim 0 instead, one all-to-all; a Partial is reduced), so
each rank's part is one run of the member's C-order bytes. Its CRC-32 and, for
``savez_compressed``, its deflate stream are made in parts on the ranks and
joined (:mod:`._zip`); one all-gather of a few numbers per member and rank tells
every rank each part's CRC, length and place, so every rank lays out the whole
archive alike. The first rank writes the zip records, the .npy headers and the
members that are plain arrays (NumPy's own ``write_array``, so object arrays and
``allow_pickle`` are NumPy's); every rank writes its parts into a temporary file
renamed over the path once every rank is done, so the path holds the old archive
or the whole new one, and a failure on any rank raises on every rank.

``savez`` writes NumPy's archive byte for byte. ``savez_compressed`` writes
members that decompress to NumPy's bytes at zipfile's default level, in deflate
blocks of their own. A file object keeps the gathered fallback.
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import zlib

import numpy as np
from numpy.lib import format as npformat

from .. import _registry
from .._dtensor import DTensor
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Replicate, Shard
from . import _agree, _npy, _paths, _tensor, _zip
from ._numpy import _path

__all__ = ["savez", "savez_compressed"]

# What zipfile compresses with when given no level, as numpy.savez_compressed.
_LEVEL = zlib.Z_DEFAULT_COMPRESSION
_NOTHING = np.empty(0, np.uint8)
# Per rank and DTensor member: offset in the member's data, length, CRC-32,
# length as stored.
_PART_FIELDS = 4


def _named(args: tuple, kwds: dict) -> dict:
    """The members as NumPy names them: the keywords, then ``arr_0``, ``arr_1``,
    ... for the positional arrays."""
    named = dict(kwds)
    for i, val in enumerate(args):
        key = f"arr_{i}"
        if key in named:
            raise ValueError(f"Cannot use un-named variables and keyword {key}")
        named[key] = val
    return named


def _holds_dtensor(obj) -> bool:
    if type(obj) is DTensor:
        return True
    if isinstance(obj, (list, tuple)):
        return any(_holds_dtensor(o) for o in obj)
    return isinstance(obj, dict) and any(_holds_dtensor(o) for o in obj.values())


def _rows(dt: DTensor) -> DTensor:
    """``dt`` laid out so that each rank holds whole rows, a run of its C-order
    bytes."""
    dt = dt.detach()
    pls = tuple(Shard(0) if p.is_shard() else Replicate() for p in dt.placements)
    return dt if pls == dt.placements else dt.redistribute(dt.device_mesh, pls)


def _part(dt: DTensor) -> tuple[int, np.ndarray]:
    """Where this rank's bytes of the rows layout ``dt`` start in its data, and
    those bytes; none on a replica that another rank writes."""
    mesh = dt.device_mesh
    local = np.ascontiguousarray(dt.to_local()).reshape(-1).view(np.uint8)
    if not local.size or not _tensor._writes(mesh, dt.placements):
        return 0, _NOTHING
    if dt.ndim == 0:
        return 0, local
    _, starts = compute_local_shape_and_global_offset(dt.shape, mesh, dt.placements)
    return starts[0] * math.prod(dt.shape[1:]) * dt.dtype.itemsize, local


def _stored(data, compress: bool, last: bool):
    return _zip.deflate_part(data, _LEVEL, last) if compress else data


class _Tensor:
    """A DTensor member on this rank: its .npy header as stored, and this rank's
    part (its offset in the data, raw and as stored)."""

    def __init__(self, dt: DTensor, compress: bool):
        self.head = _npy.encode(tuple(dt.shape), dt.dtype)
        self.nbytes = dt.size * dt.dtype.itemsize
        self.stored_head = _stored(self.head, compress, self.nbytes == 0)
        self.at, self.raw = _part(dt)
        end = self.at + self.raw.size
        self.part = _stored(self.raw, compress, end == self.nbytes) if self.raw.size else b""

    def row(self) -> list:
        return [self.at, self.raw.size, zlib.crc32(self.raw), len(self.part)]


def _plain_members(values: list, allow_pickle: bool, compress: bool, out: list) -> bytes:
    """On the first rank: each plain member as NumPy writes it (appended to
    ``out``, as stored), and their raw lengths, CRCs and stored lengths."""
    table = []
    for val in values:
        buf = io.BytesIO()
        npformat.write_array(buf, np.asanyarray(val), allow_pickle=allow_pickle,
                             pickle_kwargs=None)
        raw = buf.getvalue()
        out.append(_stored(raw, compress, True))
        table.append([len(raw), zlib.crc32(raw), len(out[-1])])
    return np.array(table, np.int64).tobytes()


def _allgather(mesh, row: list) -> np.ndarray:
    """Every rank's ``row`` of ints, one row per rank. Collective on the mesh."""
    n = len(row)
    local = np.array(row, np.int64).reshape(1, n)
    return DTensor.from_local(local, mesh, [Shard(0)] * mesh.ndim, run_check=False,
                              shape=(mesh.size(), n), stride=(n, 1)).full_tensor()


def _tensor_entry(t: _Tensor, parts: np.ndarray, compress: bool) -> tuple:
    """The CRC-32 and stored length of a DTensor member, from every rank's part of
    it, and where this rank's part starts in the member's stored bytes."""
    crc, before = zlib.crc32(t.head), 0
    for at, length, part_crc, stored in sorted(map(tuple, parts[parts[:, 1] > 0])):
        crc = _zip.crc32_combine(crc, int(part_crc), int(length))
        before += int(stored) if compress and at < t.at else 0
    size = len(t.head) + t.nbytes
    stored = len(t.stored_head) + int(parts[:, 3].sum()) if compress else size
    return crc, stored, len(t.stored_head) + (before if compress else t.at)


def _layout(members: list, table: np.ndarray, plain: np.ndarray, compress: bool) -> tuple:
    """The entries of the members (``(name, flags, _Tensor or None)``), this rank's
    parts as ``(offset in the archive, bytes)``, and where the directory starts."""
    method = _zip.DEFLATED if compress else _zip.STORED
    entries, mine, pos, t_i, p_i = [], [], 0, 0, 0
    for name, flags, t in members:
        data = pos + _zip.local_header_size(name)
        if t is not None:
            parts = table[:, _PART_FIELDS * t_i:_PART_FIELDS * (t_i + 1)]
            crc, stored, mine_at = _tensor_entry(t, parts, compress)
            size, t_i = len(t.head) + t.nbytes, t_i + 1
            if t.raw.size:
                mine.append((data + mine_at, t.part))
        else:
            size, crc, stored = (int(v) for v in plain[p_i])
            p_i += 1
        entries.append(_zip.Member(name, flags, method, crc, stored, size, pos))
        pos = data + stored
    return entries, mine, pos


def _first_pieces(entries: list, members: list, plain_bytes: list, start: int) -> list:
    """The first rank's pieces: every local header followed by the member's .npy
    header (or the whole plain member), then the directory."""
    out, plain = [], iter(plain_bytes)
    for entry, (_, _, t) in zip(entries, members):
        head = _zip.local_header(entry)
        out.append((entry.offset, head))
        out.append((entry.offset + len(head), t.stored_head if t is not None else next(plain)))
    out.append((start, _zip.directory(entries, start)))
    return out


def _everywhere(mesh, step):
    """``step()`` on every rank, and its result; an exception it raised on any
    rank raised on every rank (of its type, with its message)."""
    failed: list = []

    def attempt():
        try:
            return step()
        except Exception as e:  # noqa: BLE001 - raised on every rank by everywhere
            failed.append(e)
            raise

    return _agree.everywhere(mesh, attempt, lambda: failed[0])


def _pwrite_all(fd: int, data, at: int) -> None:
    view = memoryview(data).cast("B")
    while view:
        n = os.pwrite(fd, view, at)
        view, at = view[n:], at + n


def _create(path: str, size: int) -> bytes:
    """On the first rank: a new temporary file of ``size`` bytes beside ``path``;
    its name."""
    tmp = _paths.temp_name(path)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    try:
        os.ftruncate(fd, size)
    except BaseException:
        os.unlink(tmp)
        raise
    finally:
        os.close(fd)
    return os.fsencode(tmp)


def _write_pieces(tmp: str, pieces: list) -> None:
    fd = os.open(tmp, os.O_WRONLY | os.O_CLOEXEC)
    try:
        for at, data in pieces:
            _pwrite_all(fd, data, at)
    finally:
        os.close(fd)


def _write(mesh, path: str, pieces: list, size: int) -> None:
    """Collective on the mesh. The file ``path`` of ``size`` bytes, each rank
    writing its ``pieces`` into a temporary file that replaces ``path`` once every
    rank is done; on any failure, the same exception on every rank and no file."""
    first = not any(mesh.get_coordinate())
    tmp = os.fsdecode(_agree.first_rank(mesh, lambda: _create(path, size)))
    try:
        _everywhere(mesh, lambda: _write_pieces(tmp, pieces))
        _agree.first_rank(mesh, lambda: os.replace(tmp, path) or b"")
    except BaseException:
        if first:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        raise


def _signature(named: dict, compress: bool) -> str:
    """What every rank must pass alike, beside the path."""
    return repr((compress, [(k, (v.shape, str(v.dtype), v.placements))
                            if type(v) is DTensor else (k,) for k, v in named.items()]))


def _prepare(named: dict, compress: bool) -> list:
    """This rank's ``(name, flags, _Tensor or None)`` of each member, its part
    deflated when ``compress``."""
    members = []
    for key, val in named.items():
        name, flags = _zip.name_of(key + ".npy")
        members.append((name, flags, _Tensor(val, compress) if type(val) is DTensor
                        else None))
    return members


def _savez(fname: str, file, args: tuple, kwds: dict, allow_pickle: bool,
           compress: bool) -> None:
    path = _path(fname, file)
    named = _named(args, kwds)
    tensors = [v for v in named.values() if type(v) is DTensor]
    if not tensors or any(_holds_dtensor(v) for v in named.values() if type(v) is not DTensor):
        raise _registry.NoRule(f"{fname}: only DTensor and array members are written "
                               f"in parts")
    mesh = tensors[0].device_mesh
    for t in tensors[1:]:
        if t.device_mesh != mesh:
            raise _registry.mesh_error(fname, mesh, t.device_mesh)
    if mesh.get_coordinate() is None:
        return
    path = os.path.realpath(path if path.endswith(".npz") else path + ".npz")
    _agree.same_path(mesh, path, lambda: _paths.check_target(path),
                     layout=_signature(named, compress))
    named = {k: _rows(v) if type(v) is DTensor else v for k, v in named.items()}
    members = _everywhere(mesh, lambda: _prepare(named, compress))
    plain_bytes: list = []
    plain_values = [v for v in named.values() if type(v) is not DTensor]
    plain = np.frombuffer(_agree.first_rank(
        mesh, lambda: _plain_members(plain_values, allow_pickle, compress, plain_bytes)),
        np.int64).reshape(-1, 3)
    table = _allgather(mesh, sum((t.row() for _, _, t in members if t is not None), []))
    entries, pieces, start = _layout(members, table, plain, compress)
    if not any(mesh.get_coordinate()):
        pieces += _first_pieces(entries, members, plain_bytes, start)
    size = start + len(_zip.directory(entries, start))
    _write(mesh, path, pieces, size)


@_registry.implements(np.savez)
def savez(file, *args, allow_pickle=True, **kwds):
    """``np.savez`` of DTensors (and arrays) to a path: NumPy's .npz archive byte
    for byte, each rank writing its own rows of each DTensor member. Collective on
    the DTensors' mesh (one mesh for all of them).

    Example: ``np.savez("run", u=dt, step=np.int64(3))`` writes ``run.npz``;
    ``np.load("run.npz")["u"]`` is the whole array.
    """
    _savez("numpy.savez", file, args, kwds, allow_pickle, False)


@_registry.implements(np.savez_compressed)
def savez_compressed(file, *args, allow_pickle=True, **kwds):
    """``np.savez_compressed`` of DTensors (and arrays) to a path: each rank
    deflates and writes its own rows of each DTensor member, the parts joined into
    one deflate stream per member. Collective on the DTensors' mesh.

    Example: ``np.savez_compressed("run", dt)``; ``np.load("run.npz")["arr_0"]``
    is the whole array.
    """
    _savez("numpy.savez_compressed", file, args, kwds, allow_pickle, True)
