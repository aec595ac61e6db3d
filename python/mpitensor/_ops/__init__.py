"""NumPy operations on DTensors: each family's dim maps and implementations,
registered in mpitensor._registry when this package is imported, and the C
dispatch connected to them (see _dispatch.py, _fast.py)."""

from .._dtensor import DTensor
from . import _elementwise, _linalg, _shape, _select, _indexing, _reductions, _fast

_fast.install(DTensor)

__all__: list = []
