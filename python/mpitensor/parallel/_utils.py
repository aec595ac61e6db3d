"""Argument checks shared by the parallel styles and parallelize_module."""

from __future__ import annotations

import numpy as np

from .. import _modes
from .._dtensor import DTensor
from ..placement_types import Placement


def validate_tp_mesh_dim(device_mesh) -> None:
    """Tensor parallelism takes a 1-D mesh (ValueError on every rank otherwise)."""
    if device_mesh.ndim != 1:
        raise ValueError(
            f"Tensor Parallel only accepts a 1D DeviceMesh, but found {device_mesh.ndim}D! "
            f"If you have a 2-D or N-D device_mesh, consider passing in device_mesh[\"tp\"]"
        )


def check_placement(value, what: str, optional: bool = True):
    """``value`` itself when it is a Placement (or None when ``optional``)."""
    if value is None and optional:
        return None
    if not isinstance(value, Placement):
        raise TypeError(f"{what} must be a Placement such as Shard(0) or Replicate(), got "
                        f"{value!r}")
    return value


def layouts(value, what: str):
    """A Placement or a tuple of optional Placements, as a tuple (None stays None)."""
    if value is None:
        return None
    if isinstance(value, Placement):
        return (value,)
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{what} must be a Placement or a tuple of Placements/None, got "
                        f"{value!r}")
    return tuple(check_placement(v, what) for v in value)


def annotate(local, mesh, placements, what: str = "input"):
    """A rank's local array as the DTensor it is a piece of, by ``placements``.

    As torch (and ``DTensor.from_local`` without ``shape``), the shards are taken
    as even: the global size of a sharded dim is the local size times the mesh
    dim's size, with no communication. With collective checks on
    (``MPITENSOR_CHECK=1``) the local sizes are compared across each sharded mesh
    dim first (one small all-gather of integers) and unequal ones raise ValueError
    on every rank; uneven shards are passed as a DTensor with its global shape.

    Example: ``annotate(np.ones((2, 3)), mesh, (Shard(0),)).shape == (2 * W, 3)``.
    """
    if not isinstance(local, np.ndarray):
        raise TypeError(f"expecting the {what} to be an ndarray or a DTensor, got "
                        f"{type(local).__name__}")
    placements = tuple(placements)
    if _modes.checks and mesh.get_coordinate() is not None:
        _check_even(local, mesh, placements, what)
    return DTensor.from_local(local, mesh, placements, run_check=False)


def _check_even(local, mesh, placements, what: str) -> None:
    """Every rank's size along each sharded dim is the same (collective)."""
    for m, p in enumerate(placements):
        if not p.is_shard() or mesh.size(m) == 1:
            continue
        if local.ndim == 0:
            raise ValueError(f"cannot shard a 0-d {what} on dim {p.dim}")
        d = p.dim % local.ndim
        sizes = list(mesh._handle.allgather_int(int(local.shape[d]), m))
        if len(set(sizes)) > 1:
            raise ValueError(
                f"the local {what}s along dim {d} have sizes {sizes} over mesh dim {m}; "
                f"a local input is taken as an even shard (as in torch): pass a DTensor "
                f"with its global shape (DTensor.from_local(..., shape=, stride=)) for "
                f"uneven shards")
