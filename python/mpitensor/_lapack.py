"""The LAPACK routines of TSQR (csrc/linalg/tsqr.c), taken from the OpenBLAS that
NumPy loaded and handed to C as function pointers (an ``mt_lapack``, laid out from
the extension's table), for ``mt_tsqr`` (bound in :mod:`mpitensor._bind.linalg`).

NumPy's wheel bundles scipy-openblas, whose Fortran symbols carry a ``scipy_``
prefix and, being ILP64, a ``64_`` suffix (``scipy_dgeqrf_64_``); a NumPy built
against a system OpenBLAS exports ``dgeqrf_`` with 32-bit integers. The library is
found by :func:`mpitensor._clib.numpy_openblas`, as :mod:`mpitensor.nn._blas` finds it for gemm, and loaded
with RTLD_LOCAL; where none is found, :func:`available` is False and TSQR's callers
take NumPy's own path.
"""

from __future__ import annotations

import functools

import numpy as np

from ._clib import address, call, dtype_code, load, numpy_openblas
from ._bind.linalg import Lapack as _Lapack, mt_tsqr, mt_lapack_supports

# (prefix, suffix, ILP64) of the Fortran names an OpenBLAS may export.
_NAMINGS = (("scipy_", "_64_", True), ("", "_64_", True), ("scipy_", "_", False),
            ("", "_", False))
_ROUTINES = ("geqrf", "tpqrt", "tpmqrt", "ormqr")
_TYPES = "sdcz"
_SLAB_BYTES = 1 << 17


def _fortran_name(prefix, t, routine, suffix):
    # complex types take unmqr where real ones take ormqr
    name = "unmqr" if routine == "ormqr" and t in "cz" else routine
    return f"{prefix}{t}{name}{suffix}"


@functools.cache
def lapack():
    """The ``mt_lapack`` of NumPy's OpenBLAS, with the library kept alive beside
    it, or None when NumPy loaded no OpenBLAS exporting these routines. Local."""
    path = numpy_openblas()
    if path is None:
        return None
    try:
        lib = load(path)
    except OSError:
        return None
    for prefix, suffix, ilp64 in _NAMINGS:
        names = {f"{t}{r}": _fortran_name(prefix, t, r, suffix)
                 for t in _TYPES for r in _ROUTINES}
        if all(hasattr(lib, n) for n in names.values()):
            out = _Lapack(ilp64=int(ilp64))
            for field, name in names.items():
                setattr(out, field, address(lib, name))
            return out, lib
    return None


def available(dtype) -> bool:
    """Whether TSQR runs in C for ``dtype`` here. Local.

    Example: ``available(np.float64)`` is True with NumPy's wheel.
    """
    found = lapack()
    code = dtype_code(np.dtype(dtype))
    return found is not None and code >= 0 and bool(mt_lapack_supports(found[0], code))


def _fortran_copy(block: np.ndarray) -> np.ndarray:
    """A column-major copy of ``block``. NumPy transposes a whole row-major matrix
    in one pass whose writes stride across all of memory; a slab of rows at a time
    stays in cache, several times faster on a tall block."""
    if block.ndim != 2 or not block.flags.c_contiguous:
        return np.array(block, order="F", copy=True)
    out = np.empty(block.shape, block.dtype, order="F")
    step = max(1, _SLAB_BYTES // max(1, block.shape[1] * block.itemsize))
    for start in range(0, block.shape[0], step):
        out[start:start + step] = block[start:start + step]
    return out


def tsqr(mesh, dim: int, block: np.ndarray, want_q: bool):
    """(q, r) of the TSQR of the matrix whose rows are the blocks of the ranks of
    mesh dim ``dim`` (in coordinate order), this rank's being ``block`` (m x n,
    m >= n on every rank): ``q`` this rank's m x n rows of the reduced Q (None
    unless ``want_q``), ``r`` the n x n R, the same on every rank. Both are
    Fortran-ordered. Collective on the dim; counted as one all-reduce.

    Example: ``q, r = tsqr(_comm.checked(mesh), 0, local, True)``.
    """
    found = lapack()
    if found is None:
        raise NotImplementedError("TSQR: NumPy loaded no OpenBLAS with LAPACK's "
                                  "geqrf/tpqrt/tpmqrt/ormqr")
    # Column-major, as geqrf wants it: a row-major block is its transpose in memory,
    # whose LQ (gelqf) would save this copy but walks each reflector with a stride
    # of the row length, which costs OpenBLAS far more time than the copy.
    a = _fortran_copy(block)
    m, n = a.shape
    r = np.zeros((n, n), a.dtype, order="F")
    q = np.empty((m, n), a.dtype, order="F") if want_q else None
    call(mt_tsqr, mesh, dim, found[0], dtype_code(a.dtype), m, n, a, max(m, 1), r,
         max(n, 1), q, max(m, 1))
    return q, r
