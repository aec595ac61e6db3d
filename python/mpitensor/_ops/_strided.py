"""Operations on DTensors placed with ``_StridedShard`` that the executor leaves.

The executor runs a strided DTensor as the plain layout of its expansion
(mpitensor/core/strided.h, csrc/ext/ext_strided.c): redistribute, elementwise
ufuncs between operands strided alike, replicated ones of their shape or scalars
(recording their views as :func:`restride` when a gradient is wanted), and
reduction methods over every element never come here. It hands every other call
with a strided operand to :func:`run` (its "strided" hook). A strided DTensor is
the plain layout of a reshaped view (mpitensor._strided), so the calls that only
need that view run on it with no communication: ufuncs with ``out=`` and NumPy's
reduction functions over every element (reshape and ravel read it so in their
own entry, _shape.py). Any other operation
gets its strided operands redistributed to plain placements first (the strided
mesh dims to Replicate, as torch does: a planned move that CommDebugMode counts),
then runs as usual.
"""

from __future__ import annotations

import numpy as np

from .. import _C, _registry, _strided
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ._fallback import MUTATORS

__all__ = ["expanded", "restride", "run"]


def _is_strided(o) -> bool:
    return isinstance(o, DTensor) and _strided.has_strided(o._spec.placements)


def restride(a, shape, placements, copy=False):
    """The same local elements read as the layout ``(shape, placements)``: a local
    reshape, checked to hold the same elements on every rank (ValueError if not).
    Local; the local array is a view where NumPy's reshape gives one. Recorded for
    autograd (the gradient comes back the same way).

    Example (``mpiexec -n 2``)::

        >>> x = distribute_tensor(np.arange(48.0).reshape(8, 6), mesh, [Shard(1)])
        >>> restride(x, (48,), (_StridedShard(0, sf=8),)).placements
        (_StridedShard(dim=0, sf=8),)
    """
    return _registry.call(restride, a, layout=(tuple(shape), tuple(placements)),
                          copy=copy)


@_registry.implements(restride)
def _restride(a, *, layout, copy=False):
    shape, placements = layout
    spec = a._spec
    mesh = spec.mesh
    if not _strided.same_elements(spec.shape, spec.placements, shape, placements,
                                  mesh.shape):
        raise ValueError(
            f"the layout {spec.placements} of shape {spec.shape} is not a view of "
            f"{placements} of shape {tuple(shape)}")
    local = a._data()
    coord = mesh.get_coordinate()
    if coord is not None:
        box = _strided.local_shape(shape, placements, mesh.shape, coord)
        local = local.reshape(box)
        if copy:
            local = local.copy()
    return DTensor(local, DTensorSpec(mesh, tuple(placements), tuple(shape), spec.dtype,
                                      contiguous_strides(tuple(shape))))


def expanded(a):
    """``a`` read as its plain expansion: a local reshape, recorded as
    :func:`restride`, no communication.

    Example (``mpiexec -n 2``)::

        >>> y = np.reshape(distribute_tensor(np.ones((8, 6)), mesh, [Shard(1)]), 48)
        >>> expanded(y).placements, expanded(y).shape
        ((Shard(dim=1),), (8, 6))
    """
    shape, placements, _ = _strided.expand(a._spec.shape, a._spec.placements,
                                           a._spec.mesh.shape)
    return restride(a, shape, placements)


def _back(r, shape):
    """The plain result ``r`` read back as ``shape``: a view when torch's reshape
    would be one (a strided shard where it merges a cut dim), else a reshape that
    moves what it must."""
    view = _strided.view_placements(r._spec.shape, r._spec.placements, shape,
                                    r._spec.mesh.shape)
    if view is not None:
        return restride(r, shape, view)
    return _registry.call(np.reshape, r, shape)


def _ufunc(ufunc, method, *ops, **kwargs):
    """An elementwise call on operands strided alike, or replicated, or scalars:
    on their plain views, then read back."""
    out = kwargs.pop("out", None)
    if method != "__call__" or ufunc.signature is not None or set(kwargs) - {
            "dtype", "casting"}:
        return None
    outs = () if out is None else out if isinstance(out, tuple) else (out,)
    if not all(_is_strided(o) for o in outs):
        return None
    ref = next(o for o in ops + outs if _is_strided(o))
    spec = ref._spec
    if any(o._spec[1:3] != spec[1:3] or o._spec.mesh is not spec.mesh for o in outs):
        return None
    for o in ops:
        if isinstance(o, DTensor):
            s = o._spec
            if s.mesh is not spec.mesh or s.shape != spec.shape or not (
                    s.placements == spec.placements
                    or all(p.is_replicate() for p in s.placements)):
                return None
        elif np.ndim(o) != 0:
            return None
    shape, placements, _ = _strided.expand(spec.shape, spec.placements, spec.mesh.shape)
    views = [restride(o, shape, placements if o._spec.placements == spec.placements
                      else o._spec.placements) if isinstance(o, DTensor) else o
             for o in ops]
    if outs:
        # Written through views of the outputs' own local arrays.
        targets = tuple(restride(o, shape, placements) for o in outs)
        if not all(t._data().size == 0 or np.shares_memory(t._data(), o._data())
                   for t, o in zip(targets, outs)):
            return None
        ufunc(*views, out=targets, **kwargs)
        return outs[0] if len(outs) == 1 else outs
    res = ufunc(*views, **kwargs)
    if isinstance(res, tuple):
        return tuple(_back(r, spec.shape) for r in res)
    return _back(res, spec.shape)


# Calls whose own entry reads a strided operand as its expansion (_shape.py).
_OWN = {restride, np.reshape, np.ravel}

# Reductions over every element, which the plain view gives as they are.
_WHOLE = {np.sum, np.prod, np.mean, np.max, np.min, np.amax, np.amin, np.all, np.any,
          np.nansum, np.nanmax, np.nanmin}


def _whole(func, a, axis=None, *rest, **kwargs):
    # where= is an array of the input's shape, which the expansion has not.
    if axis is not None or rest or set(kwargs) - {"dtype", "keepdims"} or kwargs.get(
            "keepdims", False):
        return None
    return _registry.call(func, expanded(a), None, **kwargs)


def _plain(o):
    if _is_strided(o):
        return o.redistribute(o._spec.mesh, _strided.plain_of(o._spec.placements))
    if isinstance(o, (list, tuple)) and any(_is_strided(x) for x in o):
        return type(o)(_plain(x) for x in o)
    return o


def run(what, args, kwargs):
    """The "strided" hook: runs ``what(*args, **kwargs)`` whose
    arguments hold a strided DTensor; NotImplemented hands :func:`restride` back to
    the dispatch. Collective on the mesh when data moves.

    Example: ``run(np.reshape, (x, (8, 6)), None)`` for a flattened ``x``.
    """
    if what in _OWN:
        return NotImplemented
    kwargs = kwargs or {}
    out = None
    if what is np.ufunc:
        out = _ufunc(*args, **kwargs)
    elif what in _WHOLE and args and _is_strided(args[0]):
        out = _whole(what, *args, **kwargs)
    if out is not None:
        return out
    return _through_plain(what, args, kwargs)


def _through_plain(what, args, kwargs):
    """``what`` on plain copies of the strided operands; a strided destination
    (``out=``, or the first argument of a function that writes into it: setitem,
    copyto, put, ``ufunc.at``, ...) gets the written values back."""
    plain: dict = {}

    def swap(o):
        if _is_strided(o):
            if id(o) not in plain:
                plain[id(o)] = (o, _plain(o))
            return plain[id(o)][1]
        if isinstance(o, (list, tuple)) and any(_is_strided(x) for x in o):
            return type(o)(swap(x) for x in o)
        return o

    dests = list(args[:1]) if what in MUTATORS else [args[2]] if (
        what is np.ufunc and args[1] == "at") else []
    out = kwargs.get("out")
    dests += list(out) if isinstance(out, tuple) else [out]
    args, kwargs = tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()}
    res = _C.call(what, args, kwargs or None)
    for d in dests:
        if not _is_strided(d):
            continue
        written = plain[id(d)][1]
        np.copyto(d._data(), written.redistribute(d._spec.mesh, d._spec.placements)._data())
        res = d if res is written else tuple(d if r is written else r for r in res) \
            if isinstance(res, tuple) else res
    return res


_C.set_hook("strided", run)
_C.set_hook("view", restride)
