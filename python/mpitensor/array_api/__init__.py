"""mpitensor's namespace of the Python array API standard, and of all of NumPy.

``DTensor.__array_namespace__()`` returns this module, so array-API consumers
(scikit-learn with ``array_api_dispatch=True``, array-api-extra, SciPy's array-API
paths, xarray) take DTensors. It is thin: each function is NumPy's own (NumPy 2's
main namespace is itself the standard's), which DTensors reach through the
operations registry as every NumPy call does: a distributed rule where one exists,
else NumPy on the gathered arrays with a GatherWarning. The dtypes are NumPy's.

Its version is NumPy's: ``__array_api_version__`` is "2024.12", as NumPy 2.4's, and
``__array_namespace__(api_version="2025.12")`` gives it too, for it has the 2025.12
functions (``isin``, ``broadcast_shapes``, ``linalg.eig``/``eigvals``, tuple axes of
``expand_dims``, scalars in ``searchsorted``) and NumPy's tuples from ``meshgrid``
and ``broadcast_arrays``, which are 2025.12's (2024.12 asked lists).

Beside the standard's names it offers every public NumPy name, as
array-api-compat's NumPy namespace does (``pad``, ``einsum``, ``gradient``,
``nanmean``, ``percentile``, ``interp``, ``polyfit``, ...; see ``_numpy_names``),
because its clients call them on the array's namespace: where the standard has a
name, the standard's function stays (``astype``, ``sort``, ``concat``,
``unique_values``, ...). Whatever a function of this namespace gives is made of
DTensors, never NumPy arrays: the ufuncs alone are NumPy's own objects, which give
DTensors of DTensors.

The creation functions build DTensors on the mesh given as ``device=``, else on the
innermost ``with mesh:``, else on the world as a 1-D mesh (see ``_creation``), cut
along their first dim (``Shard(0)``; 0-d arrays replicated). ``device=`` takes the
standard's device too (``"cpu"``, ``x.device``), the CPU every array lives on.
NumPy's other functions of plain data (``logspace``, ``identity``, ``loadtxt``) make
their DTensors the same way.

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
from ._creation import (arange, array, asanyarray, asarray, asarray_chkfinite,
                        ascontiguousarray, asfortranarray, empty, empty_like, eye,
                        from_dlpack, full, full_like, identity, linspace, ones, ones_like,
                        require, zeros, zeros_like)
from ._funcs import (argsort, arrays_out, astype, broadcast_arrays, broadcast_shapes,
                     can_cast, clip, finfo, iinfo, isin, meshgrid, result_type, sort,
                     tensordot)
from ._info import __array_namespace_info__
from ._numpy_names import numpy_names

# NumPy 2.4's: the 2025.12 functions are here too (__array_namespace__ takes
# api_version="2025.12"), but a client asking the version finds NumPy's.
__array_api_version__ = "2024.12"

# The dtypes and constants are NumPy's objects.
bool = np.bool_  # noqa: A001

_OWN = ["__array_api_version__", "__array_namespace_info__", "fft", "linalg", "arange",
        "array", "asanyarray", "asarray", "asarray_chkfinite", "ascontiguousarray",
        "asfortranarray", "empty", "empty_like", "eye", "from_dlpack", "full",
        "full_like", "identity", "linspace", "ones", "ones_like", "require", "zeros",
        "zeros_like", "argsort", "astype", "broadcast_arrays", "broadcast_shapes",
        "can_cast", "clip", "finfo", "iinfo", "isin", "meshgrid", "result_type", "sort",
        "tensordot", "bool"]
# Every other public NumPy name: its functions through arrays_out (DTensors in,
# DTensors out; NumPy 1.x lacks the standard's names that came with NumPy 2, so the
# namespace is whole with NumPy 2.1 and later), its ufuncs, types and constants as
# they are.
_NUMPY = numpy_names(set(_OWN))
globals().update(_NUMPY)
__all__ = sorted(set(_OWN) | set(_NUMPY))
del _NUMPY

# DTensor.__array_namespace__ returns what is here (the ground floor reads it; this
# module, above it, sets it).
_registry.array_namespace = sys.modules[__name__]
