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
    uneven shards get their true global shape, and sizes that do not fit
    torch.chunk's rule raise ValueError on every rank instead of leaving some ranks
    waiting in the next collective; so does a non-array, a 0-d array or another
    ndim on some ranks only. On a 1-D mesh that verdict rides along the size
    exchange; on others, where one mesh dim's exchange does not reach every rank,
    the ranks agree (``_C.agree``) before and after it.

    Example: ``annotate(np.ones((3, 4)), mesh, [Shard(0)])`` on 2 ranks is a
    DTensor of global shape (6, 4).
    """
    placements = tuple(placements)
    sharded = [m for m, p in enumerate(placements) if p.is_shard() and mesh.size(m) > 1]
    problem = None
    if not isinstance(local, np.ndarray):
        problem = TypeError(f"expecting the {what} to be an ndarray or a DTensor, got "
                            f"{type(local).__name__}")
    elif local.ndim == 0 and sharded:
        problem = ValueError(f"cannot shard a 0-d {what} on dim {placements[sharded[0]].dim}")
    if mesh.get_coordinate() is None or not sharded:
        if problem is not None:
            raise problem
        return DTensor.from_local(local, mesh, placements, run_check=False)
    if mesh.ndim == 1:
        shape = _exchange_1d(local, mesh, placements[0].dim, problem, what)
    else:
        shape = _exchange_nd(local, mesh, placements, sharded, problem, what)
    return DTensor.from_local(local, mesh, placements, shape=shape,
                              stride=contiguous_strides(shape))


# A 1-D mesh's one size exchange carries each rank's verdict: size * _NDIMS + ndim,
# or minus the index of its problem's kind.
_NDIMS = 128
_KINDS = (None, TypeError, ValueError)


def _misfit(what: str, d: int, sizes: list, m: int):
    """The ValueError for shard sizes that are not torch.chunk's, or None."""
    total = sum(sizes)
    expect = list(_C.chunk_sizes(total, len(sizes)))
    if sizes == expect:
        return None
    return ValueError(f"the local {what}s along dim {d} have sizes {sizes} over mesh dim "
                      f"{m}, which are not the shards of a dim of {total} (torch.chunk "
                      f"gives {expect}); pass a DTensor for other layouts")


def _exchange_1d(local, mesh, dim: int, problem, what: str) -> tuple:
    """The global shape, from one all-gather that also carries every rank's verdict,
    so every rank raises the same error (on the first failing rank's kind)."""
    d = dim % local.ndim if problem is None else 0
    mine = (-_KINDS.index(type(problem)) if problem is not None
            else int(local.shape[d]) * _NDIMS + local.ndim)
    got = list(mesh._handle.allgather_int(mine, 0))
    bad = [r for r, v in enumerate(got) if v < 0]
    if bad:
        kind = _KINDS[-got[bad[0]]]
        who = [r for r in bad if got[r] == got[bad[0]]]
        if kind is TypeError:
            raise TypeError(f"expecting the {what} to be an ndarray or a DTensor; on "
                            f"rank(s) {who} of the mesh it is not")
        raise ValueError(f"cannot shard a 0-d {what} on dim {dim} (rank(s) {who} of the "
                         f"mesh passed one)")
    ndims = [v % _NDIMS for v in got]
    if len(set(ndims)) > 1:
        raise ValueError(f"the local {what}s have {ndims} dims on the ranks of the mesh; "
                         f"they must have the same number")
    sizes = [v // _NDIMS for v in got]
    error = _misfit(what, d, sizes, 0)
    if error is not None:
        raise error
    shape = list(local.shape)
    shape[d] = sum(sizes)
    return tuple(shape)


def _exchange_nd(local, mesh, placements, sharded, problem, what: str) -> tuple:
    """The global shape on a mesh of several dims: each mesh dim's exchange reaches
    only its group, so the ranks agree on the inputs first and on the sizes after."""
    _C.agree(mesh._handle, problem is None, getattr(local, "ndim", -1),
             str(problem) if problem else
             f"the local {what}s have {getattr(local, 'ndim', -1)} dims on the mesh's "
             f"first rank and another number on another rank",
             type(problem or ValueError()))
    shape, error = list(local.shape), None
    for m in sharded:
        d = placements[m].dim % local.ndim
        sizes = list(mesh._handle.allgather_int(int(local.shape[d]), m))
        error = error or _misfit(what, d, sizes, m)
        shape[d] = sum(sizes)
    _C.agree(mesh._handle, error is None, 0, str(error), ValueError)
    return tuple(shape)
