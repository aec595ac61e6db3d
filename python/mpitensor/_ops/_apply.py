"""``np.apply_along_axis`` of a DTensor: each rank applies the function to its own
rows.

The function sees what NumPy's loop passes it: a 1-D NumPy array (a view of the
rank's block along ``axis``), one call per row, in C order within the block. The
axis must be whole on each rank: a mesh dim that cuts it cuts another dim instead
(one all-to-all), or is made Replicate when no other dim is free (a gather of that
axis, reported by ``_trace.report_move``); either is counted by CommDebugMode. A
Partial is reduced first (the function need not be linear). NumPy sizes its
result by the function's value on the first row: here the rank at the mesh's origin,
which holds that row, computes it, and its shape and dtype are broadcast (a few
bytes) so that every rank builds its block alike; any rank's failure is every
rank's. The result's Shards follow their dims (the function's dims take the axis's
place, unsharded).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import normalize_axis_index

from .. import _comm, _registry
from .._clib import MAX_NDIM
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _row_exchange as X

__all__ = ["apply_along_axis", "whole_axis"]

def _encode(res) -> np.ndarray:
    """The first result's dtype and shape as one int64 array to broadcast."""
    code = res.dtype.str.encode().ljust(8, b"\0")
    if len(code) > 8 or res.ndim > MAX_NDIM:
        raise _registry.NoRule("numpy.apply_along_axis: a result of this dtype or ndim "
                               "has no distributed rule")
    head = np.zeros(2 + MAX_NDIM, np.int64)
    head[0] = np.frombuffer(code, np.int64)[0]
    head[1] = res.ndim
    head[2:2 + res.ndim] = res.shape
    return head


def _decode(head: np.ndarray):
    dtype = np.dtype(head[:1].tobytes().rstrip(b"\0").decode())
    return dtype, tuple(int(n) for n in head[2:2 + int(head[1])])


def _call(func1d, row, args, kwargs):
    try:
        return np.asanyarray(func1d(row, *args, **kwargs)), None
    except Exception as e:  # noqa: BLE001 - every rank raises it below
        return None, e


def _agree(mesh, error) -> None:
    _comm.agree(mesh, error is None, 0,
                "" if error is None else f"numpy.apply_along_axis: {error}",
                ValueError if error is None else type(error))


def whole_axis(spec, ax, keep=lambda m: False) -> tuple:
    """Placements of ``spec`` under which axis ``ax`` is whole on each rank: a
    mesh dim that cuts it (unless ``keep(m)``) cuts instead the longest other dim
    no mesh dim cuts (one all-to-all), or is Replicate when there is none (a
    gather); Partial and strided placements become Replicate. Local."""
    cut = {p.dim for p in spec.placements if type(p) is Shard}
    out = []
    for m, p in enumerate(spec.placements):
        if type(p) is Shard and (p.dim != ax or keep(m)):
            out.append(p)
        elif type(p) is Shard and spec.mesh.shape[m] > 1:
            free = [d for d in range(len(spec.shape)) if d != ax and d not in cut]
            if free:
                d = max(free, key=lambda d: (spec.shape[d], -d))
                cut.add(d)
                out.append(Shard(d))
            else:
                out.append(Replicate())
        else:
            out.append(p if p.is_replicate() or type(p) is Shard else Replicate())
    return tuple(out)


@_registry.implements(np.apply_along_axis)
def apply_along_axis(func1d, axis, arr, *args, **kwargs):
    """``np.apply_along_axis`` of a DTensor: ``func1d`` called on each rank's own
    rows (1-D NumPy arrays, as NumPy passes them), the result's Shards kept on the
    other dims. Collective on the mesh (a few bytes, and where a mesh dim cuts
    ``axis``, an all-to-all that moves that cut to another dim).

    Example: ``np.apply_along_axis(np.sort, 1, dt)`` of a ``[Shard(0)]`` matrix
    sorts each rank's rows where they are.
    """
    name = "numpy.apply_along_axis"
    if type(arr) is not DTensor:
        raise _registry.NoRule(f"{name}: the DTensor rule takes a DTensor array")
    ax = normalize_axis_index(axis, arr.ndim)
    spec = arr._spec
    mesh = spec.mesh
    if mesh.get_coordinate() is None:
        raise _registry.NoRule(f"{name}: a rank outside the mesh cannot size the result")
    pls = whole_axis(spec, ax)
    arr = D.relayout(name, arr, pls)
    outer = spec.shape[:ax] + spec.shape[ax + 1:]
    if 0 in outer:
        raise ValueError("Cannot apply_along_axis when any iteration dimensions are 0")
    view = np.moveaxis(arr.to_local(), ax, -1)
    first, error = None, None
    origin = not any(mesh.get_coordinate())
    if origin:
        first, error = _call(func1d, view[(0,) * len(outer) + (Ellipsis,)], args, kwargs)
    header = np.zeros(2 + MAX_NDIM, np.int64)
    if origin and error is None:
        try:
            header = _encode(first)
        except _registry.NoRule as e:
            error = e
    _agree(mesh, error)
    for m in range(mesh.ndim):
        _comm.bcast(mesh, header, m)
    dtype, res_shape = _decode(header)
    X.check_movable(name, dtype)
    buff = np.zeros(view.shape[:-1] + res_shape, dtype)
    try:
        for i, ind in enumerate(np.ndindex(view.shape[:-1])):
            ind = ind + (Ellipsis,)
            if i == 0 and origin:
                buff[ind] = first
                continue
            res, error = _call(func1d, view[ind], args, kwargs)
            if error is not None:
                break
            buff[ind] = res
    except Exception as e:  # noqa: BLE001 - a result of another shape: every rank's
        error = e
    _agree(mesh, error)
    k, nres = len(outer), len(res_shape)
    order = list(range(ax)) + list(range(k, k + nres)) + list(range(ax, k))
    local = np.ascontiguousarray(np.transpose(buff, order))
    shape = spec.shape[:ax] + res_shape + spec.shape[ax + 1:]
    # A Shard of the axis is left only on a mesh dim of one rank: Replicate there.
    out_pls = tuple(p if type(p) is not Shard else Replicate() if p.dim == ax else
                    Shard(p.dim if p.dim < ax else p.dim - 1 + nres) for p in pls)
    return DTensor(local, DTensorSpec(mesh, out_pls, shape, dtype,
                                      contiguous_strides(shape)))
