"""The standard's ``linalg`` extension: NumPy's ``numpy.linalg`` functions, which
DTensors reach through the same registry as every NumPy call (a distributed rule
where one exists, else NumPy on the gathered arrays)."""

import numpy as np

from . import _funcs
from ._funcs import arrays_out

__all__ = ["cholesky", "cross", "det", "diagonal", "eigh", "eigvalsh", "inv", "matmul",
           "matrix_norm", "matrix_power", "matrix_rank", "matrix_transpose", "outer",
           "pinv", "qr", "slogdet", "solve", "svd", "svdvals", "tensordot", "trace",
           "vecdot", "vector_norm"]

# NumPy 1.x lacks some of them (the standard's names came with NumPy 2): those are
# left out there.
globals().update({name: (getattr(np.linalg, name) if name in ("matmul", "vecdot")
                         else arrays_out(getattr(np.linalg, name)))
                  for name in __all__ if name != "tensordot" and hasattr(np.linalg, name)})
tensordot = _funcs.tensordot
__all__ = [name for name in __all__ if name in globals()]
