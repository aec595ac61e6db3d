"""distribute_tensor: a whole NumPy array on every rank -> a DTensor."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from . import _args, _comm, _modes, _strided, _trace
from ._dtensor import DTensor
from ._dtensor_spec import DTensorSpec, contiguous_strides
from ._layout import _codes, compute_local_shape_and_global_offset
from .device_mesh import DeviceMesh
from .placement_types import Partial, Placement

__all__ = ["distribute_tensor"]

_IDENTITY = {"sum": 0, "product": 1}


def distribute_tensor(tensor, device_mesh: DeviceMesh | None = None,
                      placements: Sequence[Placement] | None = None, *,
                      src_data_rank: int | None = 0, requires_grad: bool = False
                      ) -> DTensor:
    """Shard or replicate a whole array, given on every rank, over a mesh.

    Collective on the mesh (with the default ``src_data_rank=0``): the copy on the
    first rank of each mesh dim is the source of truth, scattered along Shard dims
    and broadcast along Replicate dims, so each rank receives only its own shard.
    ``src_data_rank=k`` takes the copy at coordinate ``k`` of every mesh dim
    instead (torch's group rank ``k`` of each mesh dim), ``Partial(sum|product)``
    putting the value there.
    With ``src_data_rank=None`` every rank cuts its own copy: no communication,
    and where that cut is contiguous (a ``Shard(0)`` of a C-ordered array, a
    ``Replicate``) the local array is a view of the input, as in torch.
    ``requires_grad=True`` makes the result a leaf that autograd records; a
    DTensor given with its own mesh and placements comes back as itself, keeping
    its flag (and ``requires_grad=True`` sets it).
    ``Partial(sum)``/``Partial(product)`` put the value on the first rank of that
    mesh dim and the identity on the others; ``Partial(avg|max|min)`` everywhere.

    Example (``mpiexec -n 2``)::

        >>> mesh = init_device_mesh("cpu", (2,))
        >>> dt = distribute_tensor(np.arange(6.0).reshape(3, 2), mesh, [Shard(0)])
        >>> dt.to_local()        # rank 0: rows 0-1, rank 1: row 2
    """
    if isinstance(tensor, DTensor):
        dt = _already_distributed(tensor, device_mesh, placements)
        return dt.requires_grad_() if requires_grad else dt
    # Without a mesh there is nothing to agree over: that error stays local.
    mesh = _args.resolve_mesh(device_mesh)
    try:
        array, pl = _checked(tensor, mesh, placements, src_data_rank)
    except Exception as e:
        # The other ranks' first collective is the scatter's agreement: this rank's
        # failure goes there, so that every rank raises it.
        if src_data_rank is not None and mesh.get_coordinate() is not None:
            _args.raise_on_every_rank(mesh, e)
        raise
    return _distribute_array(array, mesh, pl, src_data_rank).requires_grad_(requires_grad)


def _checked(tensor, mesh, placements, src_data_rank):
    """distribute_tensor's local checks: (the array, its placements). Local."""
    _args.reject_masked(tensor, "distribute_tensor")
    array = np.asarray(tensor)
    _args.check_dtype(array.dtype)
    pl = _args.normalize_placements(placements, mesh, array.ndim)
    if src_data_rank is not None and (
            isinstance(src_data_rank, bool) or not isinstance(src_data_rank, (int, np.integer))
            or not 0 <= src_data_rank < min(mesh.shape)):
        raise ValueError(
            f"src_data_rank must be a rank of every mesh dim's group (0 to "
            f"{min(mesh.shape) - 1} on a mesh of shape {tuple(mesh.shape)}: the copy "
            f"at that coordinate of each mesh dim is the source) or None (every rank "
            f"uses its own copy); got {src_data_rank!r}"
        )
    return array, pl


def _distribute_array(array, mesh, pl, src_data_rank) -> DTensor:
    dtype = array.dtype
    spec = DTensorSpec(mesh, pl, array.shape, dtype, contiguous_strides(array.shape))
    if mesh.get_coordinate() is None:
        return DTensor(np.empty((0,), dtype), spec)
    if _strided.has_strided(pl):
        # Distributed as the plain layout of its expansion, then read back.
        eshape, epl, _ = _strided.expand(array.shape, pl, mesh.shape)
        plain = _distribute_array(array.reshape(eshape), mesh, epl, src_data_rank)
        local = plain._data().reshape(
            _strided.local_shape(array.shape, pl, mesh.shape, mesh.get_coordinate()))
        return DTensor(local, spec)
    if src_data_rank is None:
        return DTensor(_own_chunk(array, mesh, pl), spec)
    if _modes.tracing:
        _trace.collective("distribute_tensor", mesh, pl, array.shape, dtype)
    return DTensor(_comm.distribute(mesh, _codes(pl), array, int(src_data_rank)),
                   spec)


def _already_distributed(dt: DTensor, device_mesh, placements) -> DTensor:
    """The DTensor itself when it already has this mesh and these placements
    (None means Replicate, as for an array, and as in torch), else ValueError."""
    mesh = dt.device_mesh if device_mesh is None else _args.resolve_mesh(device_mesh)
    pl = _args.normalize_placements(placements, mesh, dt.ndim)
    if mesh == dt.device_mesh and pl == dt.placements:
        return dt
    raise ValueError(
        f"Cannot distribute a DTensor with device mesh {dt.device_mesh} and placements "
        f"{dt.placements} to device mesh {mesh} and placements {pl}; use "
        f"DTensor.redistribute to change the placements of a DTensor"
    )


def _own_chunk(array: np.ndarray, mesh: DeviceMesh, pl) -> np.ndarray:
    """This rank's cut of its own copy: a view of ``array`` where the cut is
    C-contiguous and keeps its values (a dim-0 cut of a C-ordered array, a
    Replicate), as torch keeps it, so that nothing is copied; a new C-ordered array
    otherwise, and for the identity that Partial(sum|product) puts on every rank
    but the first of its mesh dim (never written into the caller's array)."""
    shape, offset = compute_local_shape_and_global_offset(array.shape, mesh, pl)
    cut = array[tuple(slice(o, o + s) for o, s in zip(offset, shape)) or ...]
    coord = mesh.get_coordinate()
    for m, p in enumerate(pl):
        if isinstance(p, Partial) and p.reduce_op in _IDENTITY and coord[m] != 0:
            return np.full(shape, _IDENTITY[p.reduce_op], array.dtype)
    # A read-only input is copied: in-place operations on the DTensor must work.
    if cut.flags.c_contiguous and array.flags.writeable:
        return cut
    return np.array(cut, order="C", copy=True)
