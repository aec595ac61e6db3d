"""One DTensor as one .npy file: every byte written once and read once, each rank
reading about a 1/N share of the file.

The header is made and parsed here; the data moves through csrc/core/io.c, so a
file saved by N ranks is what numpy.save would have written, and M ranks in any
layout read it back. Each rank hands the core its own box. A layout whose boxes
are each one run of the file (Shard(0) of a C-order array) goes straight to the
file. One whose boxes interleave in it in short runs (Shard(1)) is saved by two
writers when every rank shares one node, reading the boxes from the ranks' memory
(csrc/core/io_gather.c); otherwise, and for loads, it is
exchanged in memory into row slabs, one run per rank, chunk by chunk while an I/O
thread writes (reads) the previous chunk (csrc/core/io_slabs.c): what two-phase
collective I/O does inside MPI-IO, which on ext4 with Open MPI's OMPIO measured
several times slower (see docs/benchmarks.md, "Checkpoints").
"""

from __future__ import annotations

import os

import numpy as np

from .. import _C, _args
from .._api import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Partial, Replicate
from . import _agree, _npy

_NOTHING = np.empty(0, np.uint8)


def _writes(mesh, placements) -> bool:
    """Of the replicas of a box, only the one at coordinate 0 of every Replicate
    mesh dim writes it, so each byte reaches the file once."""
    coord = mesh.get_coordinate()
    return all(coord[m] == 0 for m, p in enumerate(placements) if not p.is_shard())


def _check_target(path: str) -> bytes:
    """On the first rank, after a failed save: a missing directory or a directory
    in the way, as FileNotFoundError or IsADirectoryError."""
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"cannot save to {path!r}: the directory {parent!r} "
                                f"does not exist")
    if os.path.isdir(path):
        raise IsADirectoryError(f"cannot save to {path!r}: it is a directory")
    return b""


def written_placements(placements) -> tuple:
    """What a save writes for ``placements``: a Partial is reduced to Replicate."""
    return tuple(Replicate() if isinstance(p, Partial) else p for p in placements)


def save_dtensor(dt: DTensor, path: str) -> tuple:
    """Collective on ``dt``'s mesh. Writes ``dt`` as the .npy file ``path``; a
    Partial is reduced first. Returns the placements that were written."""
    mesh = dt.device_mesh
    placements = written_placements(dt.placements)
    if placements != dt.placements:
        dt = dt.redistribute(mesh, placements)
    if mesh.get_coordinate() is None:
        return placements
    local = np.ascontiguousarray(dt.to_local())
    sizes, offsets = compute_local_shape_and_global_offset(dt.shape, mesh, placements)
    # A 0-d array travels as shape (1,), where a rank can also hold nothing.
    shape = dt.shape or (1,)
    sizes, offsets = (tuple(sizes), tuple(offsets)) if dt.ndim else ((1,), (0,))
    if not _writes(mesh, placements):
        sizes, offsets, local = (0,) * len(shape), (0,) * len(shape), _NOTHING
    header = _npy.encode(dt.shape, dt.dtype)
    try:
        _C.io_save(mesh._handle, path, header, shape, dt.dtype.itemsize, len(header),
                   offsets, sizes, local.reshape(-1).view(np.uint8))
    except OSError:
        # Every rank got the error; the first rank finds the plainer reason.
        _agree.first_rank(mesh, lambda: _check_target(path))
        raise
    return placements


def read_prefix(path: str) -> bytes:
    """The file's first bytes: its whole .npy header when it has one. Local."""
    with open(path, "rb") as f:
        prefix = f.read(4000)
        end = min(_npy.header_end(prefix), _npy.PREFIX_BYTES)
        return prefix + f.read(max(0, end - len(prefix)))


def read_header(mesh, path: str) -> _npy.NpyHeader:
    """Collective on the mesh. The header of the .npy file ``path``, read by the
    first rank; the same exception on every rank when there is none."""
    return _npy.decode(_agree.first_rank(mesh, lambda: read_prefix(path), outsiders=True),
                       path)


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
    out = _read_box(head, path, mesh, pl)
    return DTensor(out if out.dtype == dtype else out.astype(dtype), spec)


def _read_box(head: _npy.NpyHeader, path: str, mesh, pl) -> np.ndarray:
    """Collective. This rank's box of the file in layout ``pl``, C-order, in the
    file's dtype; straight from the file in place."""
    sizes, offsets = compute_local_shape_and_global_offset(head.shape, mesh, pl)
    order = slice(None, None, -1) if head.fortran_order else slice(None)
    # A Fortran-order file holds the transpose in C order: read the mirrored box.
    out = np.empty(tuple(sizes)[order], head.dtype)
    shape, sizes, offsets = ((head.shape[order], tuple(sizes)[order], tuple(offsets)[order])
                             if head.shape else ((1,), (1,), (0,)))
    _C.io_load(mesh._handle, path, shape, head.dtype.itemsize, head.offset, offsets, sizes,
               out.reshape(-1).view(np.uint8))
    return np.ascontiguousarray(out.T) if head.fortran_order else out


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
