"""The local kernels along one axis (csrc/core/lanes.c) for the dtypes they know:
running sums and products, and the first extreme; and equal-bin and per-value
counts (csrc/core/histogram.c), in one pass where NumPy's histogram and bincount
make several. Each reads a C-contiguous array
once, row by row, where NumPy walks each lane with the axis's stride (and its
argmax along an axis that is not the last copies the array with that axis moved
last first). Arrays of a non-native byte order are swapped first; argmax and argmin
of a dtype the kernels do not know (long double) are NumPy's.
"""

from __future__ import annotations

import math
import operator

import numpy as np

from .. import _C, _clib, _dtypes
from .._clib import I64
from .._bind.core import mt_cumulate, mt_arg_extreme, mt_histogram_uniform, mt_bincount

__all__ = ["kernel_dtype", "scan", "arg_extreme", "extreme", "uniform_counts",
           "bincount"]

# The element types of mt_dtype, in this machine's byte order, but bfloat16
# (kernel_dtype).
_KERNEL_DTYPES = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128))


def kernel_dtype(dtype: np.dtype) -> bool:
    """Whether the core's kernels know ``dtype`` (an mt_dtype, native order). Local.

    Example: ``kernel_dtype(np.dtype(np.float32))`` is True.
    """
    return dtype in _KERNEL_DTYPES or _dtypes.is_bfloat16(dtype)


def scan(x, ax, op, init=None, out=True):
    """(running sums (``op`` REDUCE_SUM) or products of ``x`` along ``ax``, each lane
    starting from ``init`` (its first element when None), or None unless ``out``;
    each lane's last value, or ``init`` or the identity when ``ax`` is empty).
    Native byte order; TypeError for a dtype the kernel does not know. Local.

    Example: ``scan(np.ones((3, 2)), 0, REDUCE_SUM)[1]`` is ``array([3., 3.])``.
    """
    x = _native(x)
    lanes, rest = _lanes_of(x, ax)
    if init is not None and not (isinstance(init, np.ndarray) and init.flags.c_contiguous
                                 and init.dtype == x.dtype
                                 and init.size == lanes.outer * lanes.inner):
        raise ValueError("init must be a C-contiguous array of one element per lane, "
                         "of the input's dtype")
    scanned = _C.empty(x.shape, x.dtype) if out else None
    last = _C.empty(rest, x.dtype)
    _clib.call(mt_cumulate, scanned, last, x, init, lanes, _clib.dtype_code(x.dtype), op)
    return scanned, last


_Lanes = _clib.struct("mt_lanes")
_E = _clib.E
# The dtypes the counting kernel reads (double holds each exactly), and how many
# bins it takes (csrc/include/mpitensor/core/histogram.h).
_COUNTED = frozenset(np.dtype(t) for t in (np.float32, np.float64, np.int8, np.int16,
                                           np.int32, np.uint8, np.uint16, np.uint32))
_MAX_BINS = 65536


def _lanes_of(x, axis):
    """The lanes of C-contiguous ``x`` along ``axis``, and the shape without it."""
    if not (isinstance(x, np.ndarray) and x.flags.c_contiguous and x.dtype.isnative
            and _clib.dtype_code(x.dtype) >= 0):
        raise TypeError("expected a C-contiguous array of a numeric dtype in native "
                        "byte order")
    axis = operator.index(axis)
    if not 0 <= axis < x.ndim:
        raise ValueError(f"axis {axis} is out of range for {x.ndim} dims")
    shape = x.shape
    return (_Lanes(outer=math.prod(shape[:axis]), n=shape[axis],
                   inner=math.prod(shape[axis + 1:])), shape[:axis] + shape[axis + 1:])


def _native(x):
    """``x`` C-contiguous in this machine's byte order (no copy when it is)."""
    if x.ndim and x.dtype.isnative and x.flags.c_contiguous:
        return x  # the common case, without making the dtype anew
    return np.ascontiguousarray(x, x.dtype.newbyteorder("="))


def arg_extreme(x, axis, largest):
    """(index, value) of the first maximum (``largest``) or minimum of ``x`` along
    ``axis`` (> 0 elements long), as numpy.argmax and numpy.argmin find it (a NaN
    is the extreme), both with ``axis`` kept (length 1). Local.

    Example: ``arg_extreme(np.array([[1, 5], [4, 2]]), 0, True)[0]`` is
    ``array([[1, 0]])``.
    """
    x = _native(x)
    if not kernel_dtype(x.dtype) or math.prod(x.shape[axis + 1:]) == 1:
        # Lanes that are contiguous: NumPy's own search runs along them in vectors.
        func = np.argmax if largest else np.argmin
        idx = func(x, axis=axis, keepdims=True)
        return idx, np.take_along_axis(x, idx, axis)
    idx, value = _first_extreme(x, axis, largest)
    return np.expand_dims(idx.astype(np.intp, copy=False), axis), np.expand_dims(value, axis)


def extreme(x, axis, largest):
    """Each lane's maximum (``largest``) or minimum of ``x`` (C-contiguous, native,
    of a dtype :func:`kernel_dtype` takes) along ``axis`` (> 0 elements long), that axis
    removed: the element numpy.argmax (argmin) picks, so a NaN is the extreme. One
    pass row by row, where NumPy's reduce down the rows of a block of few columns
    walks it one short row at a time. Local.

    Example: ``extreme(np.array([[1, 5], [4, 2]]), 0, True)`` is ``array([4, 5])``.
    """
    return _first_extreme(x, axis, largest)[1]


def _first_extreme(x, axis, largest):
    """(index, value) of each lane's first extreme by the kernel, ``axis`` removed."""
    lanes, rest = _lanes_of(x, axis)
    idx, value = _C.empty(rest, np.int64), _C.empty(rest, x.dtype)
    _clib.call(mt_arg_extreme, idx, value, x, lanes, _clib.dtype_code(x.dtype), bool(largest))
    return idx, value


def uniform_counts(x, edges):
    """The counts of ``x``'s elements in the equal bins ``edges`` (``bins + 1``
    increasing finite values, as ``np.histogram_bin_edges`` makes them for a number
    of bins), by numpy.histogram's rule (each bin closed on the left, the last on
    both sides); None where the kernel does not apply (another dtype, too many
    bins), for the caller to ask NumPy. Local.

    Example: ``uniform_counts(np.array([0.1, 0.9, 1.0]), np.linspace(0, 1, 3))`` is
    ``array([1, 2])``.
    """
    edges = np.asarray(edges)
    bins = edges.size - 1
    if x.dtype not in _COUNTED or not 1 <= bins <= _MAX_BINS:
        return None
    x = _native(x)
    edges = np.ascontiguousarray(edges, np.float64)
    counts = np.zeros(bins, np.int64)
    _clib.call(mt_histogram_uniform, _clib.dtype_code(x.dtype), x.size, x, bins, edges, counts)
    return counts.astype(np.intp, copy=False)


# Below this many values NumPy's extremes pass is short and its call cheaper than
# the kernel's.
_BINCOUNT_MIN = 16384
# The first table's length: values past it grow the table as the count goes.
_BINCOUNT_TABLE = 256


def bincount(x, weights=None, minlength=0):
    """``np.bincount(x, weights, minlength)`` of a 1-D ``x`` that casts safely to
    intp: the same array and dtype (intp counts, float64 sums of the weights added
    in element order) and NumPy's ValueError for a negative value, counted in one
    pass that tracks the largest value (NumPy finds the extremes in a pass first),
    the table grown where a value does not fit. Local.

    Example: ``bincount(np.array([0, 2, 2]))`` is ``array([1, 0, 2])``.
    """
    x = np.asarray(x)
    if x.size < _BINCOUNT_MIN:
        return np.bincount(x, weights, minlength)
    # Anything else NumPy answers itself, its exceptions included.
    least = int(minlength) if isinstance(minlength, (int, np.integer)) else -1
    if (x.ndim != 1 or least < 0 or np.dtype(np.intp) != np.int64
            or not np.can_cast(x.dtype, np.int64, "safe")
            or (weights is not None and (np.shape(weights) != x.shape or not np.can_cast(
                np.asarray(weights).dtype, np.float64, "safe")))):
        return np.bincount(x, weights, minlength)
    x = np.ascontiguousarray(x, np.int64)
    w = None if weights is None else np.ascontiguousarray(weights, np.float64)
    size = max(least, _BINCOUNT_TABLE)
    table = np.zeros(size, np.int64 if w is None else np.float64)
    n, stop, top = x.size, I64(0), I64(-1)  # where the count stopped, the largest value
    while True:
        _clib.call(mt_bincount, n, x, w, table.size, table if w is None else None,
                   None if w is None else table, stop, top)
        if stop.value == n:
            break
        if x[stop.value] < 0:
            raise ValueError("'list' argument must have no negative elements")
        grown = np.zeros(max(int(x[stop.value]) + 1, 2 * table.size), table.dtype)
        grown[:table.size] = table
        table = grown
    length = max(top.value + 1, least)
    return table if length == table.size else table[:length].copy()
