"""NumPy operations on DTensors: the dispatch from ``__array_ufunc__`` and
``__array_function__`` to sharding decisions made by the C engine (see
_dispatch.py), and the dim maps of each family of operations."""

from ._dispatch import array_function
from ._elementwise import array_ufunc
from ._reductions import method as reduction_method
from . import _linalg  # noqa: F401  (registers dot, einsum, tensordot, inner, outer)
from . import _shape  # noqa: F401  (registers transpose, concatenate, ...)
from . import _select  # noqa: F401  (registers where, clip, copy)
from . import _indexing  # noqa: F401  (DTensor.__getitem__)

from ._fast import install as install_fast_path

__all__ = ["array_function", "array_ufunc", "reduction_method", "install_fast_path"]
