"""One DTensor as one .npy file: every byte written once and read once, each rank
reading about a 1/N share of the file.

The header is made and parsed here; the data moves through csrc/io/io.c, so a
file saved by N ranks is what numpy.save would have written, and M ranks in any
layout read it back. Each rank hands the core its own box. A layout whose boxes
are each one run of the file (Shard(0) of a C-order array) goes straight to the
file. One whose boxes interleave in it in short runs (Shard(1)) is exchanged in
memory into row slabs, one run per rank, chunk by chunk while an I/O thread
writes (reads) the previous chunk (csrc/io/io_slabs.c): what two-phase
collective I/O does inside MPI-IO, but with the exchange overlapping the writes
and every rank writing its own slab.
"""

from __future__ import annotations

import os

import numpy as np

from .. import _args, _strided
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Partial, Replicate
from . import _agree, _io, _npy, _opened, _region, _stored

_NOTHING = np.empty(0, np.uint8)


def _writes(mesh, placements) -> bool:
    """Of the replicas of a box, only the one at coordinate 0 of every Replicate
    mesh dim writes it, so each byte reaches the file once."""
    coord = mesh.get_coordinate()
    return all(coord[m] == 0 for m, p in enumerate(placements) if not p.is_shard())


def written_placements(placements) -> tuple:
    """What a save writes for ``placements``: a Partial is reduced to Replicate."""
    return tuple(Replicate() if isinstance(p, Partial) else p for p in placements)


def _npy_layout(shape: tuple, dtype: np.dtype) -> tuple:
    header = _npy.encode(shape, dtype)
    return header, len(header)


def save_dtensor(dt: DTensor, path: str, layout=_npy_layout,
                 durable: bool | int = True) -> tuple:
    """Collective on ``dt``'s mesh. Writes ``dt`` as the .npy file ``path``, which
    every rank passes alike and the first rank has checked (_paths.check_target); a
    Partial is reduced first; synced to the device when ``durable`` (with its
    directory, unless it is _io.DURABLE_FILE). Returns the placements that were
    written.

    ``layout(shape, dtype)`` gives the bytes before the data and where the data
    starts (by default the .npy header and its length); it is called on every
    member of the mesh and may be collective (an HDF5 file's structure, made on
    the first rank)."""
    dt = dt.detach()  # a parameter that requires grad is saved as its data
    mesh = dt.device_mesh
    placements = written_placements(dt.placements)
    if placements != dt.placements:
        dt = dt.redistribute(mesh, placements)
    if mesh.get_coordinate() is None:
        return placements
    local = np.ascontiguousarray(dt.to_local())
    # A strided layout's file is its expansion's: the same bytes in C order, where
    # each rank's part is a box again.
    eshape, eplacements, _ = _strided.expand(dt.shape, placements, mesh.shape)
    sizes, offsets = compute_local_shape_and_global_offset(eshape, mesh, eplacements)
    # A 0-d array travels as shape (1,), where a rank can also hold nothing.
    shape = eshape or (1,)
    sizes, offsets = (tuple(sizes), tuple(offsets)) if dt.ndim else ((1,), (0,))
    if not _writes(mesh, placements):
        sizes, offsets, local = (0,) * len(shape), (0,) * len(shape), _NOTHING
    header, data_offset = layout(tuple(dt.shape), dt.dtype)
    _io.io_save(mesh, path, header, shape, dt.dtype.itemsize, data_offset,
               offsets, sizes, local.reshape(-1).view(np.uint8), durable=durable)
    return placements


def look_file(opened: _opened.Opened) -> bytes:
    """The size (8 bytes) and first bytes of the file ``opened`` holds (opening
    it): its whole .npy header when it has one. OSError for anything but a
    regular file. Local."""
    with opened.file() as f:
        size = os.fstat(f.fileno()).st_size
        prefix = f.read(4000)
        end = min(_npy.header_end(prefix), _npy.PREFIX_BYTES)
        prefix += f.read(max(0, end - len(prefix)))
    return size.to_bytes(8, "little") + prefix


def header_of(look: bytes, path: str) -> _npy.NpyHeader:
    """The header in what look_file returned. The same bytes reach every rank, so
    every rank raises alike: OSError when the file is too short for the array its
    header describes, before any rank allocates room for a part of it. Local."""
    head = _npy.decode(look[8:], path)
    size, need = int.from_bytes(look[:8], "little"), head.offset + head.nbytes
    if size < need:
        raise OSError(f"{path!r} is truncated: it has {size} bytes, the array needs "
                      f"{need}")
    return head


def read_header(mesh, opened: _opened.Opened) -> _npy.NpyHeader:
    """Collective on the mesh. The header of the .npy file ``opened``, read by the
    first rank; the same exception on every rank when there is none."""
    return header_of(_agree.first_rank(mesh, lambda: look_file(opened), outsiders=True),
                     opened.path)


def check_expected(head: _npy.NpyHeader, path: str, shape=None, dtype=None) -> None:
    """ValueError / TypeError when the file is not the array the caller asked for.
    Local: the header is the same on every rank."""
    if shape is not None and tuple(shape) != head.shape:
        raise ValueError(f"{path!r} holds an array of shape {head.shape}, not the "
                         f"requested {tuple(shape)}")
    if dtype is not None and np.dtype(dtype) != head.dtype.newbyteorder("="):
        raise TypeError(f"{path!r} holds dtype {head.dtype}, not the requested "
                        f"{np.dtype(dtype)}")


def _allocate(head: _npy.NpyHeader, sizes: tuple, dtype: np.dtype) -> tuple:
    """Room for a box of ``sizes``: as the file holds it (a Fortran-order file
    holds the transpose) and, when that is not the result, the result."""
    raw = np.empty(sizes[::-1] if head.fortran_order else sizes, head.dtype)
    if not head.fortran_order and head.dtype == dtype:
        return raw, raw
    return raw, np.empty(sizes, dtype)


class RawReader(_stored.Reader):
    """Boxes of the array a .npy header describes (C or Fortran order, any byte
    order, at a byte offset of the file ``opened`` holds), read by the core in
    parallel: each rank reads its box in place, or one row slab that the ranks
    exchange into their boxes. A contiguous HDF5 dataset is read the same way."""

    collective = True

    def __init__(self, head: _npy.NpyHeader, opened: _opened.Opened, mesh, region):
        self.head, self.opened, self.mesh, self.region = head, opened, mesh, region
        self.dtype = _args.check_dtype(head.dtype.newbyteorder("="))

    def allocate(self, sizes: tuple, dtype: np.dtype):
        # The box in the file keeps a 1 where an integer index dropped a dim.
        return _allocate(self.head, self.region.box(sizes, (0,) * len(sizes))[1], dtype)

    def read(self, room, offsets: tuple, sizes: tuple) -> np.ndarray:
        raw, out = room
        head = self.head
        # A Fortran-order file holds the transpose in C order: read the mirrored box.
        order = slice(None, None, -1) if head.fortran_order else slice(None)
        shape, sizes, offsets = ((head.shape[order], sizes[order], offsets[order])
                                 if head.shape else ((1,), (1,), (0,)))
        try:
            _io.io_load(self.mesh, self.opened.name, shape, head.dtype.itemsize,
                        head.offset, offsets, sizes, raw.reshape(-1).view(np.uint8))
        except Exception as e:  # noqa: BLE001 - the same on every rank, renamed
            raise type(e)(self.opened.local(str(e))) from None
        if out is not raw:
            np.copyto(out, raw.T if head.fortran_order else raw)
        return out


def load_dtensor(head: _npy.NpyHeader, opened: _opened.Opened, mesh, placements,
                 region=None) -> DTensor:
    """Collective on the mesh. This rank's box of the array (or of its ``region``)
    in the file ``opened`` holds, which the ranks have agreed on, as a DTensor with
    ``placements`` (Shard and Replicate, any mesh, even or not)."""
    whole = region is None
    region = _region.whole(head.shape) if whole else region
    reader = RawReader(head, opened, mesh, region)
    pl = _args.normalize_placements(placements, mesh, len(region.shape))
    if (whole and not head.fortran_order and _strided.has_strided(pl)
            and mesh.get_coordinate() is not None):
        # Read as the plain layout of the expansion (the same bytes in C order).
        _args.reject_partial(pl, "load")
        spec = DTensorSpec(mesh, pl, head.shape, reader.dtype,
                           contiguous_strides(head.shape))
        eshape, eplacements, _ = _strided.expand(head.shape, pl, mesh.shape)
        reader.head, reader.region = head._replace(shape=eshape), _region.whole(eshape)
        box = _stored.read_box(opened.path, eshape, mesh, eplacements, reader.region,
                               reader)
        return DTensor(box.reshape(_strided.local_shape(head.shape, pl, mesh.shape,
                                                        mesh.get_coordinate())), spec)
    return _stored.load(opened.path, head.shape, mesh, pl, reader, region)


def load_like(head: _npy.NpyHeader, opened: _opened.Opened, like, mesh, region=None):
    """Collective. The file as ``like`` is: a DTensor on its mesh and placements, or
    an ndarray (read whole on every rank of ``mesh``). ValueError / TypeError when
    the shape or dtype differs."""
    check_like(like, opened.path, region.shape if region is not None else head.shape,
               head.dtype)
    if isinstance(like, np.ndarray):
        return load_dtensor(head, opened, mesh, None, region).to_local()
    return load_dtensor(head, opened, like.device_mesh, like.placements, region)


def check_like(like, path: str, shape: tuple, dtype: np.dtype) -> None:
    """TypeError unless ``like`` is a DTensor or an ndarray; ValueError / TypeError
    when the stored array (or the part ``index=`` names) differs from it in shape
    or dtype. Local."""
    if not isinstance(like, (DTensor, np.ndarray)):
        raise TypeError(f"like= takes DTensors and ndarrays, got {type(like).__name__}")
    check_expected(_npy.NpyHeader(tuple(shape), dtype, False, 0), path, like.shape,
                   like.dtype)
