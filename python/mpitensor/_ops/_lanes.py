"""The local kernels along one axis (csrc/core/lanes.c) for the dtypes they know:
running sums and products, and the first extreme. Each reads a C-contiguous array
once, row by row, where NumPy walks each lane with the axis's stride (and its
argmax along an axis that is not the last copies the array with that axis moved
last first). Arrays of a non-native byte order are swapped first; argmax and argmin
of a dtype the kernels do not know (long double) are NumPy's.
"""

from __future__ import annotations

import math

import numpy as np

from .. import _C, _dtypes

__all__ = ["KERNEL_DTYPES", "scan", "arg_extreme"]

# The element types of mt_dtype, in this machine's byte order.
KERNEL_DTYPES = frozenset(np.dtype(t) for t in (
    np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32,
    np.uint64, np.float16, np.float32, np.float64, np.complex64, np.complex128)) | (
    frozenset() if _dtypes.bfloat16 is None else frozenset((_dtypes.bfloat16,)))


def scan(x, ax, op, init=None, out=True):
    """(running sums (``op`` REDUCE_SUM) or products of ``x`` along ``ax``, each lane
    starting from ``init`` (its first element when None), or None unless ``out``;
    each lane's last value, or ``init`` or the identity when ``ax`` is empty).
    Native byte order; TypeError for a dtype the kernel does not know. Local.

    Example: ``scan(np.ones((3, 2)), 0, _C.REDUCE_SUM)[1]`` is ``array([3., 3.])``.
    """
    return _C.cumulate(_native(x), ax, op, init, out)


def _native(x):
    """``x`` C-contiguous in this machine's byte order (no copy when it is)."""
    return np.ascontiguousarray(x, x.dtype.newbyteorder("="))


def arg_extreme(x, axis, largest):
    """(index, value) of the first maximum (``largest``) or minimum of ``x`` along
    ``axis`` (> 0 elements long), as numpy.argmax and numpy.argmin find it (a NaN
    is the extreme), both with ``axis`` kept (length 1). Local.

    Example: ``arg_extreme(np.array([[1, 5], [4, 2]]), 0, True)[0]`` is
    ``array([[1, 0]])``.
    """
    x = _native(x)
    if x.dtype not in KERNEL_DTYPES or math.prod(x.shape[axis + 1:]) == 1:
        # Lanes that are contiguous: NumPy's own search runs along them in vectors.
        func = np.argmax if largest else np.argmin
        idx = func(x, axis=axis, keepdims=True)
        return idx, np.take_along_axis(x, idx, axis)
    idx, value = _C.arg_extreme(x, axis, largest)
    return np.expand_dims(idx.astype(np.intp, copy=False), axis), np.expand_dims(value, axis)
