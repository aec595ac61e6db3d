"""The standard's ``linalg`` extension, and every other public function of
``numpy.linalg`` (``norm``, ``lstsq``, ``cond``, ``multi_dot``, ...), as
array-api-compat offers them: NumPy's functions, which DTensors reach through the
same registry as every NumPy call (a distributed rule where one exists, else NumPy
on the gathered arrays), their results DTensors. ``eig`` and ``eigvals`` give the
standard's complex results where NumPy gives real ones for real eigenvalues."""

from __future__ import annotations

import types
from typing import NamedTuple

import numpy as np

from .._dtensor import DTensor
from . import _funcs
from ._funcs import arrays_out

# Left out of numpy.linalg's public names: its test runner.
LEFT_OUT = {"test": "runs NumPy's own test suite, not a function of arrays"}


class EigResult(NamedTuple):
    """What :func:`eig` gives: the eigenvalues and the eigenvectors (the columns).
    Local.

    Example: ``w, v = eig(x)``.
    """

    eigenvalues: DTensor
    eigenvectors: DTensor


def _complex(x):
    """``x`` in the complex dtype of its precision (complex64 for float32 and
    complex64, else complex128), as the standard's ``eig`` gives."""
    dtype = np.result_type(x.dtype, np.complex64)
    return x if x.dtype == dtype else x.astype(dtype)


def eig(x, /):
    """The standard's ``eig``: the eigenvalues and right eigenvectors of each square
    matrix of ``x``, always complex (NumPy's are real when every eigenvalue is).
    Collective: NumPy's ``eig`` on the gathered matrices (a warned gather where
    mpitensor has no distributed rule), the results replicated.

    Example: ``eig(x).eigenvalues.dtype == complex128`` for a float64 ``x``.
    """
    w, v = arrays_out(np.linalg.eig)(x)
    return EigResult(_complex(w), _complex(v))


def eigvals(x, /):
    """The standard's ``eigvals``: the eigenvalues of each square matrix of ``x``,
    always complex. Collective, as :func:`eig`.

    Example: ``eigvals(x).shape == x.shape[:-1]``.
    """
    return _complex(arrays_out(np.linalg.eigvals)(x))


tensordot = _funcs.tensordot
__all__ = ["EigResult", "eig", "eigvals", "tensordot"]
for _name in dir(np.linalg):
    _obj = getattr(np.linalg, _name)
    if _name.startswith("_") or _name in __all__ or _name in LEFT_OUT or \
            isinstance(_obj, types.ModuleType):
        continue
    # matmul and vecdot give DTensors of every shape as they are, 0-d included.
    globals()[_name] = (_obj if isinstance(_obj, type) or _name in ("matmul", "vecdot")
                        else arrays_out(_obj))
    __all__.append(_name)
