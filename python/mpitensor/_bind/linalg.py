"""The linear algebra of ``csrc/linalg`` (mpitensor/linalg/tsqr.h, scalapack.h): TSQR
on the LAPACK NumPy loaded, and ScaLAPACK's factorizations on a block-cyclic grid.
Callers: :mod:`mpitensor._lapack`, :mod:`mpitensor._algorithms._scalapack`,
:mod:`mpitensor._algorithms._scalapack_rect`, :mod:`mpitensor._ops._scalapack`."""

from __future__ import annotations

from .._clib import A, D, E, I, I64, P, S, fn, ptr, struct

Lapack = struct("mt_lapack")

# TSQR
mt_tsqr = fn("mt_tsqr", I, P, I, Lapack, I, I64, I64, A, I64, A, I64, A, I64, E)
mt_lapack_supports = fn("mt_lapack_supports", I, Lapack, I)

# ScaLAPACK: its libraries, the rectangular factorizations, the square ones
mt_scalapack_open_libraries = fn("mt_scalapack_open_libraries", I, ptr(S), I, ptr(P), E)

mt_scalapack_qr = fn("mt_scalapack_qr", I, P, P, I, I, I, I64, I64, A, I64, A, I64, A, E)
mt_scalapack_svd = fn("mt_scalapack_svd", I, P, P, I, I, I, I64, I64, A, A, A, I64, A, ptr(I), E)
mt_scalapack_geqrf = fn("mt_scalapack_geqrf", I, P, P, I, I, I, I64, I64, A, A, E)

mt_scalapack_solve = fn("mt_scalapack_solve", I, P, P, I, I, I, I64, A, I64, A, ptr(I), E)
mt_scalapack_inv = fn("mt_scalapack_inv", I, P, P, I, I, I, I64, A, ptr(I), E)
mt_scalapack_slogdet = fn("mt_scalapack_slogdet", I, P, P, I, I, I, I64, A, D * 2, E)
mt_scalapack_cholesky = fn("mt_scalapack_cholesky", I, P, P, I, I, I, I64, A, I, ptr(I), E)
mt_scalapack_eigh = fn("mt_scalapack_eigh", I, P, P, I, I, I, I64, A, I, I, A, ptr(I), E)
