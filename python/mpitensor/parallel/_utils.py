"""Argument checks shared by the parallel styles and parallelize_module."""

from __future__ import annotations

import numpy as np

from .. import _modes, _comm
from .._dtensor import DTensor
from .._fingerprint import fingerprint
from ..device_mesh import local_mesh
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


def is_local(x) -> bool:
    """Whether ``x`` is a DTensor on the local mesh: what ``to_local()`` of a tensor
    that requires grad gives in grad mode, a rank's local array that autograd
    follows. Styles take it where they take an ndarray. Local.

    Example: ``is_local(dt.to_local())`` when ``dt.requires_grad``.
    """
    return type(x) is DTensor and x._spec.mesh is local_mesh()


def is_local_array(x) -> bool:
    """An ndarray or a local DTensor (:func:`is_local`): a rank's own values. Local.

    Example: ``is_local_array(np.ones(2)) is True``.
    """
    return isinstance(x, np.ndarray) or is_local(x)


def annotate(local, mesh, placements, what: str = "input"):
    """A rank's local array as the DTensor it is a piece of, by ``placements``.

    As torch (and ``DTensor.from_local`` without ``shape``), the shards are taken
    as even: the global size of a sharded dim is the local size times the mesh
    dim's size. Even shards all have one shape, so when a mesh dim shards the
    input the ranks agree on their local shapes first (one agreement, an
    all-reduce of three integers): an uneven split (a sequence of 5 on 2 ranks,
    handed on as local arrays by a style's ``use_local_output``), a non-array or a
    0-d array on some ranks raise the same error on every rank, where torch's
    next collective would fail on some ranks and wait forever on the others, or
    compute with a global shape that differs between ranks. With collective
    checks on (``MPITENSOR_CHECK=1``) the ranks exchange their sizes instead (one
    small all-gather of integers per sharded mesh dim; on a mesh of several dims
    an agreement before and after), so that the error names every rank's size.
    Uneven shards are passed as a DTensor with its global shape.

    Example: ``annotate(np.ones((2, 3)), mesh, (Shard(0),)).shape == (2 * W, 3)``.
    """
    placements = tuple(placements)
    sharded = [m for m, p in enumerate(placements) if p.is_shard() and mesh.size(m) > 1]
    problem = None
    if not is_local_array(local):
        problem = TypeError(f"expecting the {what} to be an ndarray or a DTensor, got "
                            f"{type(local).__name__}")
    elif local.ndim == 0 and sharded:
        problem = ValueError(f"cannot shard a 0-d {what} on dim {placements[sharded[0]].dim}")
    if sharded and mesh.get_coordinate() is not None:
        if not _modes.state.checks:
            _agree_shapes(local, mesh, problem, what)
        elif mesh.ndim == 1:
            _exchange_1d(local, mesh, placements[0].dim, problem, what)
        else:
            _exchange_nd(local, mesh, placements, sharded, problem, what)
    elif problem is not None:
        raise problem
    return DTensor.from_local(local, mesh, placements, run_check=False)


def _agree_shapes(local, mesh, problem, what: str) -> None:
    """Every rank's local shape must be the same for an even split: one agreement on
    a fingerprint of it, which also carries a rank's ``problem``. Collective."""
    shape = (local.ndim,) + tuple(local.shape) if problem is None else ()
    _comm.agree(mesh, problem is None, fingerprint(shape),
             str(problem) if problem is not None else
             f"the local {what}s differ in shape across the ranks of the mesh "
             f"({tuple(local.shape)} on rank {mesh.get_rank()}); a local input is taken "
             f"as an even shard (as in torch), whose shape is the same on every rank: "
             f"for uneven shards pass a DTensor with its global shape "
             f"(DTensor.from_local(..., shape=, stride=)), or keep the producing "
             f"module's output a DTensor (use_local_output=False)",
             type(problem or ValueError()))


# A 1-D mesh's one size exchange carries each rank's verdict: size * _NDIMS + ndim,
# or minus the index of its problem's kind.
_NDIMS = 128
_KINDS = (None, TypeError, ValueError)


def _misfit(what: str, d: int, sizes: list, m: int):
    """The ValueError for shard sizes that are not even, or None."""
    if len(set(sizes)) == 1:
        return None
    return ValueError(
        f"the local {what}s along dim {d} have sizes {sizes} over mesh dim {m}; "
        f"a local input is taken as an even shard (as in torch): pass a DTensor "
        f"with its global shape (DTensor.from_local(..., shape=, stride=)) for "
        f"uneven shards")


def _exchange_1d(local, mesh, dim: int, problem, what: str) -> None:
    """Checks the sizes with one all-gather that also carries every rank's verdict,
    so every rank raises the same error (on the first failing rank's kind)."""
    d = dim % local.ndim if problem is None else 0
    mine = (-_KINDS.index(type(problem)) if problem is not None
            else int(local.shape[d]) * _NDIMS + local.ndim)
    got = list(_comm.allgather_int(mesh, mine, 0))
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


def _exchange_nd(local, mesh, placements, sharded, problem, what: str) -> None:
    """The check on a mesh of several dims: each mesh dim's exchange reaches only
    its group, so the ranks agree on the inputs first and on the sizes after."""
    _comm.agree(mesh, problem is None, getattr(local, "ndim", -1),
             str(problem) if problem else
             f"the local {what}s have {getattr(local, 'ndim', -1)} dims on the mesh's "
             f"first rank and another number on another rank",
             type(problem or ValueError()))
    error = None
    for m in sharded:
        d = placements[m].dim % local.ndim
        sizes = list(_comm.allgather_int(mesh, int(local.shape[d]), m))
        error = error or _misfit(what, d, sizes, m)
    _comm.agree(mesh, error is None, 0, str(error), ValueError)
