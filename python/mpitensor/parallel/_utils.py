"""Argument checks shared by the parallel styles and parallelize_module."""

from __future__ import annotations

import numpy as np

from .. import _C
from .._dtensor import DTensor
from .._dtensor_spec import contiguous_strides
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

    Unlike a bare ``DTensor.from_local`` (which assumes even shards, as torch
    does), the sizes along each sharded dim are exchanged on that mesh dim (one
    small all-gather of integers through the C layer, which CommDebugMode counts):
    uneven shards get their true global shape, and
    sizes that do not fit torch.chunk's rule raise ValueError on every rank
    instead of leaving some ranks waiting in the next collective; so does a
    non-array, a 0-d array or another ndim on some ranks only (agreed first).

    Example: ``annotate(np.ones((3, 4)), mesh, [Shard(0)])`` on 2 ranks is a
    DTensor of global shape (6, 4).
    """
    placements = tuple(placements)
    sharded = [p for m, p in enumerate(placements) if p.is_shard() and mesh.size(m) > 1]
    problem = None
    if not isinstance(local, np.ndarray):
        problem = TypeError(f"expecting the {what} to be an ndarray or a DTensor, got "
                            f"{type(local).__name__}")
    elif local.ndim == 0 and sharded:
        problem = ValueError(f"cannot shard a 0-d {what} on dim {sharded[0].dim}")
    if mesh.get_coordinate() is not None and sharded:
        # A problem, or another ndim, on some ranks only must not leave the others
        # in the size exchange below.
        _C.agree(mesh._handle, problem is None, getattr(local, "ndim", -1),
                 str(problem) if problem else
                 f"the local {what}s have {local.ndim} dims on the mesh's first rank and "
                 f"another number on another rank", type(problem or ValueError()))
    if problem is not None:
        raise problem
    if not sharded or mesh.get_coordinate() is None:
        return DTensor.from_local(local, mesh, placements, run_check=False)
    shape = list(local.shape)
    for m, p in enumerate(placements):
        if not p.is_shard() or mesh.size(m) == 1:
            continue
        d = p.dim % local.ndim
        sizes = list(mesh._handle.allgather_int(int(local.shape[d]), m))
        total = sum(sizes)
        expect = list(_C.chunk_sizes(total, len(sizes)))
        if sizes != expect:
            raise ValueError(
                f"the local {what}s along dim {d} have sizes {sizes} over mesh dim {m}, "
                f"which are not the shards of a dim of {total} (torch.chunk gives "
                f"{expect}); pass a DTensor for other layouts")
        shape[d] = total
    shape = tuple(shape)
    return DTensor.from_local(local, mesh, placements, shape=shape,
                              stride=contiguous_strides(shape))
