"""NumPy functions that NumPy writes in Python over operations DTensors have, here
run on the DTensors step by step (each step by its own rule, so nothing is gathered
and the gradient flows through the steps that record themselves):

* ``np.block``: NumPy's depth checks, each piece given NumPy's leading 1s by a
  reshape, then nested ``concatenate`` calls, innermost list along the last axis;
* ``np.ix_``: each 1-D DTensor reshaped to stand along its own axis (a boolean one
  becomes its ``nonzero`` positions first); plain sequences become Replicate
  DTensors of the same mesh, as the fallback would return them;
* ``np.apply_over_axes``: NumPy's loop, ``func(val, axis)`` on the DTensor and
  ``expand_dims`` where the function dropped the axis;
* ``np.diagflat``: the flattened input, padded by ``concatenate`` with ``|k|``
  zeros so that its element ``r`` is the one on row ``r``, laid out as the rows of
  the result: each rank writes its own rows' diagonal elements into zeros (no
  backward: NotImplementedError in grad mode).
"""

from __future__ import annotations

import operator

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from .._layout import compute_local_shape_and_global_offset
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D

__all__ = ["block", "ix_", "apply_over_axes", "diagflat"]


def _depth(x) -> int:
    """The list depth of ``x`` with NumPy's checks (tuples and empty lists refused,
    depths equal)."""
    if type(x) is tuple:
        raise TypeError("arrays is a tuple. Only lists can be used to arrange blocks, "
                        "and np.block does not allow implicit conversion from tuple to "
                        "ndarray.")
    if type(x) is not list:
        return 0
    if not x:
        raise ValueError("List at arrays cannot be empty")
    depths = {_depth(item) for item in x}
    if len(depths) > 1:
        raise ValueError("List depths are mismatched.")
    return 1 + depths.pop()


def _leaves(x, found: list) -> None:
    if type(x) is list:
        for item in x:
            _leaves(item, found)
    else:
        found.append(x)


def _as_dtensor(x, mesh) -> DTensor:
    """``x`` as a DTensor of ``mesh``: a plain value made Replicate (no move)."""
    if type(x) is DTensor:
        return x
    local = np.ascontiguousarray(x)
    return DTensor.from_local(local, mesh, [Replicate()] * mesh.ndim)


@_registry.implements(np.block)
def block(arrays):
    """``np.block`` of nested lists holding DTensors: each piece reshaped to the
    result's ndim, then ``concatenate`` along the axis of each list depth (each
    concatenate by its rule: pieces cut along the joined axis move their rows, no
    piece is gathered). Plain pieces join as Replicate DTensors. Collective on the
    mesh when a concatenate moves rows.

    Example: ``np.block([[a, b], [c, d]])`` of four (2, 2) ``[Shard(0)]`` DTensors is
    a (4, 4) DTensor.
    """
    depth = _depth(arrays)
    leaves: list = []
    _leaves(arrays, leaves)
    dts = [x for x in leaves if type(x) is DTensor]
    if not dts:
        raise _registry.NoRule("numpy.block: no DTensor piece")
    mesh = dts[0].device_mesh
    ndim = max([depth] + [np.ndim(x) for x in leaves])

    def build(x, d):
        if type(x) is not list:
            x = _as_dtensor(x, mesh)
            return x.reshape((1,) * (ndim - x.ndim) + tuple(x.shape))
        return np.concatenate([build(item, d + 1) for item in x], axis=-(depth - d))

    if depth == 0:
        return np.copy(build(arrays, 0))
    return build(arrays, 0)


@_registry.implements(np.ix_)
def ix_(*args):
    """``np.ix_`` of 1-D DTensors (and plain sequences): the k-th reshaped to lie
    along axis k, a boolean one replaced by its ``nonzero`` positions first (one
    scan when it is sharded). Each keeps its layout: a Shard(0) input gives a Shard
    of its own axis. Local except for boolean inputs.

    Example: ``np.ix_(rows, cols)`` of two ``[Shard(0)]`` DTensors gives a (n, 1)
    ``[Shard(0)]`` and a (1, m) ``[Shard(1)]`` DTensor.
    """
    dts = [x for x in args if type(x) is DTensor]
    if not dts:
        raise _registry.NoRule("numpy.ix_: no DTensor argument")
    mesh, nd, out = dts[0].device_mesh, len(args), []
    for k, new in enumerate(args):
        if type(new) is not DTensor:
            new = np.asarray(new)
            if new.size == 0:
                new = new.astype(np.intp)
            new = _as_dtensor(new, mesh)
        if new.ndim != 1:
            raise ValueError("Cross index must be 1 dimensional")
        if new.dtype == np.bool_:
            new, = np.nonzero(new)
        out.append(new.reshape((1,) * k + (new.shape[0],) + (1,) * (nd - k - 1)))
    return tuple(out)


@_registry.implements(np.apply_over_axes)
def apply_over_axes(func, a, axes):
    """``np.apply_over_axes`` of a DTensor: NumPy's loop, ``func(val, axis)`` called
    with the DTensor (so its reductions run by their own rules) and the axis
    restored by ``expand_dims`` where ``func`` dropped it. Collective as ``func``'s
    operations are.

    Example: ``np.apply_over_axes(np.sum, dt, [0, 2])`` is ``dt.sum((0, 2),
    keepdims=True)``.
    """
    if type(a) is not DTensor:
        raise _registry.NoRule("numpy.apply_over_axes: the DTensor rule takes a DTensor")
    val, n = a, a.ndim
    if np.ndim(axes) == 0:
        axes = (axes,)
    for axis in axes:
        if axis < 0:
            axis = n + axis
        res = func(val, axis)
        if res.ndim != val.ndim:
            res = np.expand_dims(res, axis)
            if res.ndim != val.ndim:
                raise ValueError("function is not returning an array of the correct shape")
        val = res
    return val


@_registry.implements(np.diagflat)
def diagflat(v, k=0):
    """``np.diagflat`` of a DTensor: the (n, n) array, ``n = v.size + |k|``, with
    the flattened ``v`` on diagonal ``k``, its rows laid out as ``v``'s elements
    (a Shard of the flattened ``v`` gives Shard(0); a Partial is reduced first).
    Each rank writes the
    diagonal elements of its own rows; the flattened ``v`` moves only where the
    ``|k|`` zeros shift its blocks. Collective on the mesh when ``v`` moves.

    Example: ``np.diagflat(dt)`` of a (4,) ``[Shard(0)]`` DTensor is a (4, 4)
    ``[Shard(0)]`` DTensor, without communication.
    """
    name = "numpy.diagflat"
    if type(v) is not DTensor:
        raise _registry.NoRule(f"{name}: the DTensor rule takes a DTensor")
    k = operator.index(k)
    flat = np.ravel(v)
    mesh, base = flat.device_mesh, flat._spec.placements
    if k:
        pad = DTensor.from_local(np.zeros(abs(k), flat.dtype), mesh,
                                 [Replicate()] * mesh.ndim)
        flat = np.concatenate([flat, pad] if k > 0 else [pad, flat])
    # Partial is reduced: the zeros a rank writes would not be a Partial's parts.
    pls = tuple(p if type(p) is Shard else Replicate() for p in base)
    flat = D.relayout(name, flat, pls)
    n = flat.shape[0]
    shape = (n, n)
    out_pls = pls
    if mesh.get_coordinate() is None:
        local = D.outside_local(shape, flat.dtype)
    else:
        (rows, _), (start, _) = compute_local_shape_and_global_offset(shape, mesh, out_pls)
        local = np.zeros((rows, n), flat.dtype)
        r = np.arange(rows)
        keep = (r + start + k >= 0) & (r + start + k < n)
        local[r[keep], r[keep] + start + k] = flat.to_local()[keep]
    return DTensor(local, DTensorSpec(mesh, out_pls, shape, flat.dtype,
                                      contiguous_strides(shape)))
