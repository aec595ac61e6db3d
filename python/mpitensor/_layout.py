"""Where each rank's shard lies: thin Python entry points to the C layout math
(:mod:`._clib`)."""

from __future__ import annotations

from typing import Sequence

from . import _comm, _plan, _strided
from ._bind import core
from .device_mesh import DeviceMesh
from .placement_types import Placement, Shard

__all__ = ["compute_local_shape_and_global_offset", "local_shape_and_global_offset", "plan"]


def _codes(placements: Sequence[Placement]) -> tuple:
    """The core's codes of the placements: a strided shard's the core refuses where
    a plain layout is needed, with its own message."""
    for p in placements:
        if not isinstance(p, Placement):
            raise TypeError(f"placements must be Shard, Replicate or Partial, got {p!r}")
    return tuple(p._code for p in placements)


def local_shape_and_global_offset(global_shape: Sequence[int], mesh_shape: Sequence[int],
                                  coordinate: Sequence[int],
                                  placements: Sequence[Placement]):
    """Shape and global offset of the shard at ``coordinate`` of a mesh. Local, no MPI.

    Shards follow ``torch.chunk`` and nest left to right over mesh dims; an empty
    shard reports the global size of its dim as offset.

    Example::

        >>> local_shape_and_global_offset((5,), (4,), (3,), [Shard(0)])
        ((0,), (5,))
        >>> local_shape_and_global_offset((5, 3), (2, 2), (1, 0), [Shard(0), Shard(0)])
        ((1, 3), (3, 0))
    """
    shape = tuple(global_shape)
    if _strided.has_strided(placements):
        return _strided.local_box(shape, placements, mesh_shape, coordinate)
    # Dims below -ndim stay as given, so the core's IndexError names the user's dim.
    placements = tuple(Shard(p.dim + len(shape))
                       if isinstance(p, Shard) and -len(shape) <= p.dim < 0 else p
                       for p in placements)
    return core.local_box(shape, tuple(mesh_shape), tuple(coordinate), _codes(placements))


def compute_local_shape_and_global_offset(global_shape: Sequence[int], mesh,
                                          placements: Sequence[Placement]):
    """Shape and global offset of this rank's shard. Local.

    A rank outside the mesh gets ``((0,), ())``, as in torch.

    Example (rank 1 of ``mpiexec -n 4``)::

        >>> mesh = init_device_mesh("cpu", (4,))
        >>> compute_local_shape_and_global_offset((10, 2), mesh, [Shard(0)])
        ((3, 2), (3, 0))
    """
    if not isinstance(mesh, DeviceMesh):
        raise TypeError(f"mesh must be a DeviceMesh, got {type(mesh).__name__}")
    coord = mesh.get_coordinate()
    if coord is None:
        return ((0,), ())
    return local_shape_and_global_offset(global_shape, mesh.shape, coord, placements)


def plan(mesh, shape, src, dst, dtype) -> "_plan.Plan":
    """The plan of moving a ``dtype`` tensor of ``shape`` from ``src`` to ``dst``
    placements on ``mesh``, as data (steps, bytes, messages, predicted time),
    ranked by the mesh's time model and checked first (RuntimeError for a Partial
    the source lacks, TypeError for a reduction the dtype lacks). Not cached: the
    plans that run live in the mesh's memo. Local.

    Example: ``plan(mesh, (8, 8), (Shard(0),), (Replicate(),), np.dtype("f8")).bytes``.
    """
    return _plan.Plan(tuple(shape), mesh.shape, _codes(src), _codes(dst), dtype,
                   _comm.mesh_time_model(mesh))
