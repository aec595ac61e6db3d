"""NumPy functions that read only an array's shape and dtype, on DTensors:
``np.ndim``, ``np.shape``, ``np.size``, ``np.iscomplexobj``, ``np.isrealobj``,
``np.common_type``, ``np.result_type``, ``np.can_cast``, ``np.min_scalar_type``,
``np.broadcast_arrays``, and ``np.may_share_memory`` / ``np.shares_memory``.

Every rank knows the global shape and dtype, so these answer without
communicating: NumPy runs on a stand-in of each DTensor, a zero-strided
broadcast of one element to its global shape (no memory of that size), and so
gives NumPy's answer and NumPy's errors alike on every rank. The exceptions are
named where they are: ``min_scalar_type`` of a 0-d DTensor reads its value (a
Partial one is reduced first), ``shares_memory`` asks every rank about its own
blocks (one all-reduce of a flag), and ``broadcast_arrays`` moves what
``np.broadcast_to`` moves, nothing unless a sharded dim of length one widens.
"""

from __future__ import annotations

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from ..placement_types import Replicate
from .._algorithms import _dispatch as D
from ._select import _everywhere
from ._shape import broadcast_to

__all__ = ["stand_in", "ndim", "shape", "size", "iscomplexobj", "isrealobj", "common_type",
           "result_type", "can_cast", "min_scalar_type", "broadcast_arrays",
           "may_share_memory", "shares_memory"]


def stand_in(x):
    """A read-only ndarray of ``x``'s global shape and dtype that holds one element
    (zero strides), for a DTensor ``x``; anything else as it is. Local.

    Example: ``stand_in(dt).shape == dt.shape``.
    """
    if type(x) is not DTensor:
        return x
    return np.broadcast_to(np.zeros((), x.dtype), x.shape)


@_registry.implements(np.ndim)
def ndim(a):
    """``np.ndim`` of a DTensor: its global number of dims. Local.

    Example: ``np.ndim(dt) == dt.ndim``.
    """
    return np.ndim(stand_in(a))


@_registry.implements(np.shape)
def shape(a):
    """``np.shape`` of a DTensor: its global shape. Local.

    Example: ``np.shape(dt) == dt.shape``.
    """
    return np.shape(stand_in(a))


@_registry.implements(np.size)
def size(a, axis=None):
    """``np.size`` of a DTensor: the global count of elements (along ``axis``).
    Local.

    Example: ``np.size(dt, 0) == dt.shape[0]``.
    """
    return np.size(stand_in(a), axis)


@_registry.implements(np.iscomplexobj)
def iscomplexobj(x):
    """``np.iscomplexobj`` of a DTensor: whether its dtype is complex. Local.

    Example: ``np.iscomplexobj(dt)``.
    """
    return np.iscomplexobj(stand_in(x))


@_registry.implements(np.isrealobj)
def isrealobj(x):
    """``np.isrealobj`` of a DTensor: whether its dtype is not complex. Local.

    Example: ``np.isrealobj(dt)``.
    """
    return np.isrealobj(stand_in(x))


@_registry.implements(np.common_type)
def common_type(*arrays):
    """``np.common_type`` of DTensors (and arrays): from their dtypes, NumPy's
    TypeError for non-numeric ones. Local.

    Example: ``np.common_type(dt) is np.float64``.
    """
    return np.common_type(*(stand_in(a) for a in arrays))


@_registry.implements(np.result_type)
def result_type(*arrays_and_dtypes):
    """``np.result_type`` of DTensors, dtypes and scalars: from the DTensors'
    dtypes, as NumPy 2 promotes arrays. Local.

    Example: ``np.result_type(dt, np.float32)``.
    """
    return np.result_type(*(stand_in(a) for a in arrays_and_dtypes))


@_registry.implements(np.can_cast)
def can_cast(from_, to, casting="safe"):
    """``np.can_cast`` from a DTensor's dtype; NumPy's TypeError for a DTensor as
    ``to``. Local.

    Example: ``np.can_cast(dt, np.float32, "same_kind")``.
    """
    return np.can_cast(stand_in(from_), stand_in(to), casting)


@_registry.implements(np.min_scalar_type)
def min_scalar_type(a, /):
    """``np.min_scalar_type`` of a DTensor: its dtype when it has dims, as NumPy;
    of a 0-d DTensor, the smallest type that holds its value (a Partial is
    reduced first: one element moves). Local otherwise.

    Example: ``np.min_scalar_type(dt) == dt.dtype`` for ``dt.ndim > 0``.
    """
    if type(a) is not DTensor or a.ndim > 0:
        return np.min_scalar_type(stand_in(a))
    pls = a._spec.placements
    if any(p.is_partial() for p in pls):
        a = D.relayout("numpy.min_scalar_type", a, [Replicate()] * len(pls))
    return np.min_scalar_type(a.to_local())


@_registry.implements(np.broadcast_arrays)
def broadcast_arrays(*args, subok=False):
    """``np.broadcast_arrays`` of DTensors: each one ``np.broadcast_to`` the shape
    they broadcast to (the arrays themselves when they have it already, as
    NumPy's). Local unless a sharded dim of length one must widen.

    Example: ``a2, b2 = np.broadcast_arrays(a, b)`` with ``a.shape == (4, 1)``.
    """
    args = D.implicit(args)
    for x in args:
        if type(x) is not DTensor:
            if isinstance(x, np.ndarray) or D.is_scalar(x):
                raise D.mixed_error("numpy.broadcast_arrays", x)
            raise TypeError(f"numpy.broadcast_arrays: expected DTensors, got "
                            f"{type(x).__name__}")
    if args:
        D.same_mesh("numpy.broadcast_arrays", args)
    target = np.broadcast_shapes(*(x.shape for x in args))
    return tuple(x if x.shape == target else broadcast_to(x, target) for x in args)


def _local(x):
    return x.to_local() if type(x) is DTensor else x


def _root(x):
    while isinstance(x, np.ndarray) and x.base is not None:
        x = x.base
    return x


@_registry.implements(np.may_share_memory)
def may_share_memory(a, b, /, max_work=0):
    """``np.may_share_memory`` of DTensors: True when their local arrays are views
    of one buffer (a DTensor and its views, its ``.T``, its slices that are views),
    the same answer on every rank whatever its block holds. Local.

    Example: ``np.may_share_memory(dt, dt.T)`` is True.
    """
    # Bounds of local blocks would answer differently on a rank whose block is empty.
    return _root(_local(a)) is _root(_local(b))


@_registry.implements(np.shares_memory)
def shares_memory(a, b, /, max_work=-1):
    """``np.shares_memory`` of DTensors: True when on some rank their local arrays
    share an element. Collective on the mesh (one all-reduce of a flag).

    Example: ``np.shares_memory(dt, dt[1:])`` is True when ``dt`` has two rows.
    """
    mesh = next(x.device_mesh for x in (a, b) if type(x) is DTensor)
    mine = bool(np.shares_memory(_local(a), _local(b), max_work=max_work))
    return not _everywhere(mesh, not mine)
