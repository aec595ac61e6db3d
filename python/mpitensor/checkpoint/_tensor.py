"""One DTensor as one .npy file: every byte written once and read once, each rank
reading about a 1/N share of the file.

The header is made and parsed here; the data moves through csrc/io/io.c, so a
file saved by N ranks is what numpy.save would have written, and M ranks in any
layout read it back. Each rank hands the core its own box. A layout whose boxes
are each one run of the file (Shard(0) of a C-order array) goes straight to the
file. One whose boxes interleave in it in short runs (Shard(1)) is exchanged in
memory into row slabs, one run per rank, chunk by chunk while an I/O thread
writes (reads) the previous chunk (csrc/io/io_slabs.c): what two-phase
collective I/O does inside MPI-IO, which on ext4 with Open MPI's OMPIO was
several times slower.
"""

from __future__ import annotations

import os

import numpy as np

from .. import _args, _strided
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Partial, Replicate
from . import _agree, _io, _npy, _paths

_NOTHING = np.empty(0, np.uint8)


def _writes(mesh, placements) -> bool:
    """Of the replicas of a box, only the one at coordinate 0 of every Replicate
    mesh dim writes it, so each byte reaches the file once."""
    coord = mesh.get_coordinate()
    return all(coord[m] == 0 for m, p in enumerate(placements) if not p.is_shard())


def written_placements(placements) -> tuple:
    """What a save writes for ``placements``: a Partial is reduced to Replicate."""
    return tuple(Replicate() if isinstance(p, Partial) else p for p in placements)


def save_dtensor(dt: DTensor, path: str) -> tuple:
    """Collective on ``dt``'s mesh. Writes ``dt`` as the .npy file ``path``, which
    every rank passes alike and the first rank has checked (_paths.check_target); a
    Partial is reduced first. Returns the placements that were written."""
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
    header = _npy.encode(dt.shape, dt.dtype)
    _io.io_save(mesh._handle, path, header, shape, dt.dtype.itemsize, len(header),
               offsets, sizes, local.reshape(-1).view(np.uint8))
    return placements


def look_file(path: str) -> bytes:
    """The file's size (8 bytes) and first bytes: its whole .npy header when it has
    one. OSError for anything but a regular file. Local."""
    with _paths.open_regular(path) as f:
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


def read_header(mesh, path: str) -> _npy.NpyHeader:
    """Collective on the mesh. The header of the .npy file ``path``, read by the
    first rank; the same exception on every rank when there is none."""
    return header_of(_agree.first_rank(mesh, lambda: look_file(path), outsiders=True), path)


def check_expected(head: _npy.NpyHeader, path: str, shape=None, dtype=None) -> None:
    """ValueError / TypeError when the file is not the array the caller asked for.
    Local: the header is the same on every rank."""
    if shape is not None and tuple(shape) != head.shape:
        raise ValueError(f"{path!r} holds an array of shape {head.shape}, not the "
                         f"requested {tuple(shape)}")
    if dtype is not None and np.dtype(dtype) != head.dtype.newbyteorder("="):
        raise TypeError(f"{path!r} holds dtype {head.dtype}, not the requested "
                        f"{np.dtype(dtype)}")


def load_dtensor(head: _npy.NpyHeader, path: str, mesh, placements) -> DTensor:
    """Collective on the mesh. This rank's box of the file, as a DTensor with
    ``placements`` (Shard and Replicate, any mesh, even or not)."""
    pl = _args.normalize_placements(placements, mesh, len(head.shape))
    _args.reject_partial(pl, "load")
    dtype = _args.check_dtype(head.dtype.newbyteorder("="))
    spec = DTensorSpec(mesh, pl, head.shape, dtype, contiguous_strides(head.shape))
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), dtype), spec)
    if _strided.has_strided(pl):
        # Read as the plain layout of the expansion (the same bytes in C order);
        # a Fortran-order file holds them in another order, so it is read plain.
        if head.fortran_order:
            plain = load_dtensor(head, path, mesh, None)
            return plain.redistribute(mesh, pl)
        eshape, eplacements, _ = _strided.expand(head.shape, pl, mesh.shape)
        box = _read_box(head._replace(shape=eshape), path, mesh, eplacements, dtype)
        return DTensor(box.reshape(_strided.local_shape(head.shape, pl, mesh.shape,
                                                        mesh.get_coordinate())), spec)
    return DTensor(_read_box(head, path, mesh, pl, dtype), spec)


def _allocate(head: _npy.NpyHeader, sizes: tuple, dtype: np.dtype) -> tuple:
    """Room for a box of ``sizes``: as the file holds it (a Fortran-order file
    holds the transpose) and, when that is not the result, the result."""
    raw = np.empty(sizes[::-1] if head.fortran_order else sizes, head.dtype)
    if not head.fortran_order and head.dtype == dtype:
        return raw, raw
    return raw, np.empty(sizes, dtype)


def _read_box(head: _npy.NpyHeader, path: str, mesh, pl, dtype: np.dtype) -> np.ndarray:
    """Collective. This rank's box of the file in layout ``pl``, C-order, in
    ``dtype`` (the file's in native byte order); straight from the file in place.
    Every array is allocated before the read and the ranks agree on it first: a
    rank that cannot allocate its part (MemoryError, or a ValueError for a size
    beyond any address space) must not leave the others in the read."""
    sizes, offsets = compute_local_shape_and_global_offset(head.shape, mesh, pl)
    raw, out = _agree.everywhere(
        mesh, lambda: _allocate(head, tuple(sizes), dtype),
        lambda: MemoryError(f"cannot load {path!r}: some rank of the mesh cannot allocate "
                            f"its part of the {head.shape} {head.dtype} array as "
                            f"{list(pl)}"))
    # A Fortran-order file holds the transpose in C order: read the mirrored box.
    order = slice(None, None, -1) if head.fortran_order else slice(None)
    shape, sizes, offsets = ((head.shape[order], tuple(sizes)[order], tuple(offsets)[order])
                             if head.shape else ((1,), (1,), (0,)))
    _io.io_load(mesh._handle, path, shape, head.dtype.itemsize, head.offset, offsets, sizes,
               raw.reshape(-1).view(np.uint8))
    if out is not raw:
        np.copyto(out, raw.T if head.fortran_order else raw)
    return out


def load_like(head: _npy.NpyHeader, path: str, like, mesh):
    """Collective. The file as ``like`` is: a DTensor on its mesh and placements, or
    an ndarray (read whole on every rank of ``mesh``). ValueError / TypeError when
    the shape or dtype differs."""
    if not isinstance(like, (DTensor, np.ndarray)):
        raise TypeError(f"like= takes DTensors and ndarrays, got {type(like).__name__}")
    check_expected(head, path, like.shape, like.dtype)
    if isinstance(like, np.ndarray):
        return load_dtensor(head, path, mesh, None).to_local()
    return load_dtensor(head, path, like.device_mesh, like.placements)
