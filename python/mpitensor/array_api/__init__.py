"""mpitensor's namespace of the Python array API standard (2024.12).

``DTensor.__array_namespace__()`` returns this module, so array-API consumers
(scikit-learn with ``array_api_dispatch=True``, array-api-extra, SciPy's array-API
paths) take DTensors. It is thin: each function is NumPy's own (NumPy 2's main
namespace is itself the standard's), which DTensors reach through the operations
registry as every NumPy call does: a distributed rule where one exists, else NumPy
on the gathered arrays with a GatherWarning. The dtypes are NumPy's.

The creation functions build DTensors on the mesh given as ``device=``, else on the
innermost ``with mesh:``, else on the world as a 1-D mesh (see ``_creation``), cut
along their first dim (``Shard(0)``; 0-d arrays replicated). ``device=`` takes the
standard's device too (``"cpu"``, ``x.device``), the CPU every array lives on.

Example (``mpiexec -n 2 python script.py``)::

    import mpitensor as mt
    import mpitensor.array_api as xp

    with mt.init_device_mesh("cpu", (2,)) as mesh:
        x = xp.arange(8.0)            # rows 0-3 on rank 0, 4-7 on rank 1
    print(xp.sum(x * x))              # 140.0 on every rank: local sums, one all-reduce
    assert x.__array_namespace__() is xp
"""

import sys

import numpy as np

from .. import _registry
from . import fft, linalg
from ._creation import (arange, asarray, empty, empty_like, eye, from_dlpack, full,
                        full_like, linspace, ones, ones_like, zeros, zeros_like)
from ._funcs import (argsort, arrays_out, astype, broadcast_arrays, can_cast, clip, finfo,
                     iinfo, meshgrid, result_type, sort, tensordot)
from ._info import __array_namespace_info__

__array_api_version__ = "2024.12"

# The dtypes and constants are NumPy's objects.
bool = np.bool_  # noqa: A001
int8, int16, int32, int64 = np.int8, np.int16, np.int32, np.int64
uint8, uint16, uint32, uint64 = np.uint8, np.uint16, np.uint32, np.uint64
float32, float64 = np.float32, np.float64
complex64, complex128 = np.complex64, np.complex128
e, inf, nan, newaxis, pi = np.e, np.inf, np.nan, np.newaxis, np.pi

# NumPy's functions of the standard's names: a DTensor argument sends each through
# DTensor.__array_ufunc__ / __array_function__, so the registry decides.
_FROM_NUMPY = (
    # element-wise
    "abs acos acosh add asin asinh atan atan2 atanh bitwise_and bitwise_left_shift "
    "bitwise_invert bitwise_or bitwise_right_shift bitwise_xor ceil conj copysign "
    "cos cosh divide equal exp expm1 floor floor_divide greater greater_equal hypot imag "
    "isfinite isinf isnan less less_equal log log1p log2 log10 logaddexp logical_and "
    "logical_not logical_or logical_xor maximum minimum multiply negative nextafter "
    "not_equal positive pow real reciprocal remainder round sign signbit sin sinh square "
    "sqrt subtract tan tanh trunc "
    # utility, statistical, sorting, set, searching
    "all any diff cumulative_sum cumulative_prod max mean min prod std sum var "
    "unique_all unique_counts unique_inverse unique_values "
    "argmax argmin count_nonzero nonzero searchsorted where "
    # data types, creation from arrays, manipulation, indexing, linear algebra
    "isdtype tril triu broadcast_to concat expand_dims flip "
    "moveaxis permute_dims repeat reshape roll squeeze stack tile unstack take "
    "take_along_axis matmul matrix_transpose vecdot").split()
# Ufuncs keep their DTensors 0-d; the other functions may give NumPy scalars, which
# become 0-d arrays. NumPy 1.x lacks some of the names (they came with NumPy 2):
# those are left out there, so the namespace is whole with NumPy 2.1 and later.
_FROM_NUMPY = [name for name in _FROM_NUMPY if hasattr(np, name)]
globals().update({name: (getattr(np, name) if isinstance(getattr(np, name), np.ufunc)
                         else arrays_out(getattr(np, name))) for name in _FROM_NUMPY})

__all__ = ["__array_api_version__", "__array_namespace_info__", "fft", "linalg",
           "arange", "asarray", "empty", "empty_like", "eye", "from_dlpack", "full",
           "full_like", "linspace", "ones", "ones_like", "zeros", "zeros_like", "astype",
           "can_cast", "finfo", "iinfo", "result_type", "tensordot", "sort", "argsort",
           "clip", "meshgrid", "broadcast_arrays", "bool", "int8",
           "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32",
           "float64", "complex64", "complex128", "e", "inf", "nan", "newaxis", "pi",
           *_FROM_NUMPY]

# DTensor.__array_namespace__ returns what is here (the ground floor reads it; this
# module, above it, sets it).
_registry.array_namespace = sys.modules[__name__]
