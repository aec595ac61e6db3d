"""The few standard functions whose NumPy form would not do on DTensors as it is:
the data-type functions, which take arrays only for their dtypes (NumPy would send a
DTensor through ``__array_function__`` and gather it for a dtype), ``astype``, which
is the DTensor's own method (placements kept, nothing moves), and those whose
arguments or results the standard has other than NumPy (``sort``'s
``descending``, ``isin`` of a scalar, ``clip``'s array bounds); and
:func:`arrays_out`, through which every other NumPy function reaches the namespace."""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from .._dtensor import DTensor
from .. import _args
from .._registry import first_mesh
from ..placement_types import Replicate
from ._creation import _distributed

__all__ = ["argsort", "arrays_out", "astype", "broadcast_arrays", "broadcast_shapes",
           "can_cast", "clip", "finfo", "iinfo", "isin", "meshgrid", "result_type", "sort",
           "tensordot"]


def _dtype_of(x):
    return x.dtype if isinstance(x, DTensor) else x


def astype(x, dtype, /, *, copy=True, device=None):
    """The standard's ``astype``: ``x`` cast to ``dtype``, placements kept; with
    ``copy=False`` ``x`` itself when it has that dtype already. Local.

    Example: ``astype(x, float32).placements == x.placements``.
    """
    if device is not None and device != x.device and device != x.device_mesh:
        raise ValueError(f"astype cannot move an array to {device!r}")
    if not copy and np.dtype(dtype) == x.dtype:
        return x
    return x.astype(dtype, copy=True)


def can_cast(from_, to, /) -> bool:
    """The standard's ``can_cast``, on the dtype of an array. Local.

    Example: ``can_cast(x, float64)`` for an ``int32`` array ``x`` is True.
    """
    return bool(np.can_cast(_dtype_of(from_), to))


def result_type(*arrays_and_dtypes):
    """The standard's ``result_type``: NumPy's promotion of the arrays' dtypes (and
    Python scalars as NumPy weakly takes them). Local.

    Example: ``result_type(x, 1.0)`` for a ``float32`` array is ``float32``.
    """
    return np.result_type(*(_dtype_of(a) for a in arrays_and_dtypes))


class _finfo(NamedTuple):
    bits: int
    eps: float
    max: float
    min: float
    smallest_normal: float
    dtype: np.dtype


def finfo(type, /):  # noqa: A002
    """The standard's ``finfo`` of a floating dtype or array: NumPy's values as
    Python floats (NumPy gives scalars of the dtype), and the real dtype. Local.

    Example: ``finfo(float32).bits == 32``.
    """
    f = np.finfo(_dtype_of(type))
    return _finfo(int(f.bits), float(f.eps), float(f.max), float(f.min),
                  float(f.smallest_normal), f.dtype)


def iinfo(type, /):  # noqa: A002
    """The standard's ``iinfo`` of an integer dtype or array. Local.

    Example: ``iinfo(int8).max == 127``.
    """
    return np.iinfo(_dtype_of(type))


def tensordot(x1, x2, /, *, axes=2):
    """The standard's ``tensordot`` (``axes`` keyword-only), NumPy's on DTensors.
    Collective when a contracted dim is sharded.

    Example: ``tensordot(a, b, axes=1)`` of two matrices is their product.
    """
    return arrays_out(np.tensordot)(x1, x2, axes=axes)


def _as_arrays(obj, mesh):
    """``obj`` with its NumPy scalars and arrays made DTensors: where NumPy gives a
    scalar for a 0-d result, the standard gives an array; and an ndarray that a
    function computed from DTensors (one NumPy runs on their gathered values
    without asking ``__array_function__``) is the same whole array on every rank.
    With no ``mesh`` (no DTensor went in) the arrays are new ones, cut as the
    creation functions cut them. Values a DTensor cannot hold (dates, strings) stay
    NumPy's, as ``asarray`` leaves them."""
    if (type(obj) is np.ndarray or isinstance(obj, np.generic)) and not _args.holds(obj.dtype):
        return obj
    if type(obj) is np.ndarray or isinstance(obj, np.generic):
        if mesh is None:
            return _distributed(np.asarray(obj), None)
        return DTensor.from_local(np.asarray(obj), mesh, [Replicate()] * mesh.ndim)
    if isinstance(obj, tuple):
        items = [_as_arrays(o, mesh) for o in obj]
        return type(obj)(items) if type(obj) is tuple else type(obj)(*items)
    if isinstance(obj, list):
        return [_as_arrays(o, mesh) for o in obj]
    return obj


def _holds_arrays(obj) -> bool:
    if type(obj) is np.ndarray or isinstance(obj, np.generic):
        return True
    return isinstance(obj, (list, tuple)) and any(_holds_arrays(o) for o in obj)


def arrays_out(func):
    """NumPy's ``func`` as the namespace hands it out: what it gives is made of
    DTensors, never NumPy's arrays or scalars. Called on DTensors it dispatches
    through ``DTensor.__array_function__`` (a distributed rule where one exists,
    else NumPy on the gathered arrays, warned), and a 0-d result is a 0-d DTensor
    on the mesh of the first DTensor argument; called on plain data (a creation
    function: ``logspace``, ``identity``, ``fromfunction``, ``loadtxt``, ...) its
    arrays are cut along their first dim as the creation functions cut them.
    Local (the call itself is whatever ``func`` is on DTensors; making the world
    mesh the first time is collective, as for the creation functions).

    Example: ``arrays_out(np.linalg.det)(a)`` is a 0-d DTensor for a 2-D ``a``;
    ``arrays_out(np.logspace)(0, 2, 3)`` is a DTensor of ``[1., 10., 100.]``.
    """
    @functools.wraps(func)
    def call(*args, **kwargs):
        out = func(*args, **kwargs)
        if not _holds_arrays(out):
            return out
        mesh = first_mesh(args)
        if mesh is None:
            mesh = first_mesh(tuple(kwargs.values()))
        return _as_arrays(out, mesh)
    return call


def sort(x, /, *, axis=-1, descending=False, stable=True):
    """The standard's ``sort``: NumPy's ascending sort, flipped for ``descending``.
    Collective along a sharded axis.

    Example: ``sort(x, descending=True)[0]`` is the largest value.
    """
    out = np.sort(x, axis=axis, kind="stable" if stable else None)
    return np.flip(out, axis=axis) if descending else out


def argsort(x, /, *, axis=-1, descending=False, stable=True):
    """The standard's ``argsort``. Descending and stable (equal values keep their
    order) is the ascending stable argsort of the flipped array, flipped back.
    Collective along a sharded axis.

    Example: ``argsort(asarray([3, 1, 2]))`` gives ``[1, 2, 0]``.
    """
    kind = "stable" if stable else None
    if not descending:
        return np.argsort(x, axis=axis, kind=kind)
    n = x.shape[axis] if x.ndim else 1
    flipped = np.argsort(np.flip(x, axis=axis), axis=axis, kind=kind)
    return (n - 1) - np.flip(flipped, axis=axis)


def clip(x, /, min=None, max=None):  # noqa: A002
    """The standard's ``clip``: NumPy's, where either bound may be None (both None
    gives a copy) or an array (then NumPy's maximum and minimum, in ``x``'s dtype).
    Local where the bounds are laid out as ``x``.

    Example: ``clip(x, min=0)``.
    """
    if min is None and max is None:
        return x.copy()
    if isinstance(min, DTensor) or isinstance(max, DTensor):
        # NumPy's clip is maximum then minimum; mpitensor's clip rule takes scalar
        # bounds only, and these two are elementwise rules of their own.
        out = x if min is None else np.maximum(x, min)
        out = out if max is None else np.minimum(out, max)
        return out.astype(x.dtype, copy=False)
    return np.clip(x, min, max)


def meshgrid(*arrays, indexing="xy"):
    """The standard's ``meshgrid``: NumPy's, a tuple of arrays (the standard's
    2025.12 form and NumPy's; 2024.12 and before asked a list). Collective as
    ``np.meshgrid`` on DTensors is.

    Example: ``xx, yy = meshgrid(x, y)``.
    """
    return tuple(arrays_out(np.meshgrid)(*arrays, indexing=indexing))


def broadcast_arrays(*arrays):
    """The standard's ``broadcast_arrays``: NumPy's, a tuple of arrays (as
    :func:`meshgrid`). Local or collective as ``np.broadcast_arrays`` on DTensors is.

    Example: ``a, b = broadcast_arrays(x, y)``.
    """
    return tuple(arrays_out(np.broadcast_arrays)(*arrays))


def broadcast_shapes(*shapes):
    """The standard's ``broadcast_shapes``: the shape that arrays of ``shapes``
    broadcast to, ``()`` for none; ValueError when they do not broadcast. NumPy's.
    Local: shapes only, no array.

    Example: ``broadcast_shapes((3, 1), (4,)) == (3, 4)``.
    """
    return np.broadcast_shapes(*shapes)


def isin(x1, x2, /, *, invert=False):
    """The standard's ``isin``: whether each element of ``x1`` is among the
    elements of ``x2``, an array of ``x1``'s shape (0-d for a scalar ``x1``);
    ``invert=True`` gives the opposite. Either may be a Python scalar. NumPy's
    ``isin`` (elements looked up where ``x2``'s values lie) for an array ``x1``; a
    scalar ``x1`` is compared with every element of ``x2``, an elementwise test
    and one all-reduce. Collective when ``x2`` is sharded.

    Example: ``isin(asarray([1, 2, 3]), asarray([2, 5]))`` is ``[False, True, False]``.
    """
    if isinstance(x1, DTensor) or not isinstance(x2, DTensor):
        return arrays_out(np.isin)(x1, x2, invert=invert)
    # One value needs no lookup table of x2's values: an elementwise test where
    # x2's elements lie and one all-reduce, whose result is 0-d as x1 is.
    found = np.any(x2 == x1)
    return ~found if invert else found
