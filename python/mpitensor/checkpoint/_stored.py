"""A stored array loaded as a DTensor, each rank reading its own box of it (or of
the region ``index=`` names), whatever the format: the steps every format shares.

A format hands in a reader: how to allocate a box (``allocate``) and how to fill
it (``read``), either collectively (the core's parallel read of a contiguous
array) or by each rank on its own (h5py's hyperslabs, Zarr's chunks). Every rank
allocates before any reads, and the ranks agree on the allocation first; a read
that fails on some ranks only (a corrupt chunk) raises the same exception on
every rank, since the reads of a library are not collective.
"""

from __future__ import annotations

import numpy as np

from .. import _args, _strided
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from . import _agree, _region


class Reader:
    """Reads boxes of a stored array on each rank alone, from the file (or store)
    ``opened`` (an _opened.Opened) holds. Subclasses set ``read``; a collective
    reader (every member calls ``read``, empty boxes included) sets
    ``collective``."""

    collective = False
    opened = None

    def allocate(self, sizes: tuple, dtype: np.dtype):
        """Room for a box of ``sizes`` in the result's dtype (and any staging the
        read needs); what ``read`` receives."""
        return np.empty(sizes, dtype)

    def read(self, room, offsets: tuple, sizes: tuple) -> np.ndarray:
        """The box at ``offsets`` of ``sizes`` in the file, in ``room``, as an
        array of ``sizes``."""
        raise NotImplementedError


def _travels(e: Exception) -> Exception:
    """What a failed local read raises on every rank: its own type where the
    agreement carries it, an OSError naming it otherwise."""
    if isinstance(e, (ValueError, TypeError, IndexError, MemoryError, OSError)):
        return e
    return OSError(f"{type(e).__name__}: {e}")


def read_box(path: str, shape: tuple, mesh, pl, region, reader: Reader) -> np.ndarray:
    """Collective on the mesh (of whose members this rank is one). This rank's
    box, in layout ``pl`` (no strided shards) of the region of the stored array of
    ``shape``, as a C-contiguous array."""
    sizes, offsets = compute_local_shape_and_global_offset(region.shape, mesh, pl)
    sizes = tuple(sizes)
    # Every rank checks here, with its allocation, that it holds the file the
    # others hold (_opened.py): the check costs no message of its own.
    file, unopened = reader.opened.check()

    def allocate():
        if unopened is not None:
            raise unopened
        return reader.allocate(sizes, reader.dtype)

    def failure():
        return unopened if unopened is not None else MemoryError(
            f"cannot load {path!r}: some rank of the mesh cannot allocate its part of "
            f"the {region.shape} {reader.dtype} array as {list(pl)}")

    try:
        room = _agree.everywhere(mesh, allocate, failure, file, reader.opened.replaced())
    except ValueError as e:
        if str(e) != reader.opened.replaced():
            raise
        raise OSError(str(e)) from None
    file_offsets, file_sizes = region.box(sizes, offsets)
    if reader.collective:
        return reader.read(room, file_offsets, file_sizes).reshape(sizes)
    failed = []

    def attempt():
        try:
            return reader.read(room, file_offsets, file_sizes)
        except Exception as e:  # noqa: BLE001 - raised on every rank just below
            failed.append(_travels(e))
            raise

    out = _agree.everywhere(mesh, attempt, lambda: failed[0])
    return out.reshape(sizes)


def load(path: str, shape: tuple, mesh, placements, reader: Reader,
         region=None) -> DTensor:
    """Collective on the mesh. The stored array of ``shape`` (or its ``region``)
    as a DTensor with ``placements`` (Shard and Replicate, strided shards, any
    mesh, even or not), each rank reading its box through ``reader``, which has
    the result's dtype as ``reader.dtype``.

    Example::

        >>> load(path, (4, 6), mesh, [Shard(1)], MyReader(np.dtype("f8")))
    """
    region = region if region is not None else _region.whole(shape)
    pl = _args.normalize_placements(placements, mesh, len(region.shape))
    _args.reject_partial(pl, "load")
    dtype = _args.check_dtype(reader.dtype)
    spec = DTensorSpec(mesh, pl, region.shape, dtype, contiguous_strides(region.shape))
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), dtype), spec)
    if _strided.has_strided(pl):
        plain = load(path, shape, mesh, _strided.plain_of(pl), reader, region)
        return plain.redistribute(mesh, pl)
    return DTensor(read_box(path, shape, mesh, pl, region, reader), spec)
