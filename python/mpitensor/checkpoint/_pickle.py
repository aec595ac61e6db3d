"""Pickling a DTensor, as torch.save(dtensor) does: its local array and spec go
into the pickle, and unpickling puts them back onto an equal DeviceMesh.

A mesh's communicators cannot travel in a pickle and creating them is collective,
which pickle.load must never be; so unpickling looks the mesh up among the meshes
alive on the receiving rank (the innermost ``with mesh:`` first).
"""

from __future__ import annotations

import numpy as np

from .._api import DTensor
from .._dtensor_spec import DTensorSpec
from .._layout import compute_local_shape_and_global_offset
from ..device_mesh import _live_meshes, _mesh_stack


def reduce_dtensor(dt: DTensor):
    """``DTensor.__reduce__``: everything but the communicators. Local."""
    mesh = dt.device_mesh
    return rebuild_dtensor, (dt.to_local(), dt.placements, dt.shape, dt.stride(),
                             dt.dtype, mesh.device_type, mesh.mesh.copy(),
                             mesh.mesh_dim_names)


def _find_mesh(device_type, ranks: np.ndarray, names):
    def fits(m):
        return (m.device_type == device_type and m.mesh_dim_names == names
                and m.mesh.shape == ranks.shape and np.array_equal(m.mesh, ranks))

    for m in [*reversed(_mesh_stack), *list(_live_meshes)]:
        if fits(m):
            return m
    raise RuntimeError(
        f"cannot unpickle a DTensor of DeviceMesh('{device_type}', {ranks.tolist()}, "
        f"mesh_dim_names={names}): no equal mesh exists on this rank; create it first, "
        f"e.g. init_device_mesh('{device_type}', {tuple(ranks.shape)}, "
        f"mesh_dim_names={names})")


def rebuild_dtensor(local, placements, shape, stride, dtype, device_type, ranks, names):
    """Unpickles a DTensor onto an equal live mesh. Local. ValueError when the local
    array is not this rank's shard (a pickle made on another rank)."""
    mesh = _find_mesh(device_type, ranks, names)
    spec = DTensorSpec(mesh, tuple(placements), tuple(shape), np.dtype(dtype), tuple(stride))
    if mesh.get_coordinate() is not None:
        expect, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
        if tuple(local.shape) != tuple(expect):
            raise ValueError(
                f"the pickled local array of shape {local.shape} is not rank "
                f"{mesh.get_rank()}'s shard {tuple(expect)} of the DTensor of shape "
                f"{tuple(shape)}: unpickle each rank's pickle on that rank")
    return DTensor(local, spec)
