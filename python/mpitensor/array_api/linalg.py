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

cholesky = arrays_out(np.linalg.cholesky)
cross = arrays_out(np.linalg.cross)
det = arrays_out(np.linalg.det)
diagonal = arrays_out(np.linalg.diagonal)
eigh = arrays_out(np.linalg.eigh)
eigvalsh = arrays_out(np.linalg.eigvalsh)
inv = arrays_out(np.linalg.inv)
matmul = np.linalg.matmul
matrix_norm = arrays_out(np.linalg.matrix_norm)
matrix_power = arrays_out(np.linalg.matrix_power)
matrix_rank = arrays_out(np.linalg.matrix_rank)
matrix_transpose = arrays_out(np.linalg.matrix_transpose)
outer = arrays_out(np.linalg.outer)
pinv = arrays_out(np.linalg.pinv)
qr = arrays_out(np.linalg.qr)
slogdet = arrays_out(np.linalg.slogdet)
solve = arrays_out(np.linalg.solve)
svd = arrays_out(np.linalg.svd)
svdvals = arrays_out(np.linalg.svdvals)
tensordot = _funcs.tensordot
trace = arrays_out(np.linalg.trace)
vecdot = np.linalg.vecdot
vector_norm = arrays_out(np.linalg.vector_norm)
