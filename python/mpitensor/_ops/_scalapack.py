"""The square linear algebra of ``np.linalg`` on sharded DTensors, on ScaLAPACK:
``solve``, ``inv``, ``det``, ``slogdet``, ``cholesky``, ``eigh`` and ``eigvalsh``.

Each entry lays its matrix out on a process grid and picks where it runs through
the engine (``_algorithms/_scalapack.py``: ScaLAPACK on the grid as the matrix
lies, NumPy on each rank's local stack, or NumPy on one rank), then calls its
driver (csrc/linalg/scalapack.c). The matrix is never gathered. A small matrix
whose rows alone are sharded takes ``_small_linalg``'s eigh on one rank.
``eig``/``eigvals`` have no ScaLAPACK driver and keep the gathering fallback.
"""

from __future__ import annotations

import numpy as np

from .. import _comm, _registry
from .._clib import D as _D, I, call
from .._dtensor import DTensor
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _scalapack as S
from .._algorithms import _small_linalg
from .._algorithms._alike import same_along
from .._bind.linalg import (mt_scalapack_solve, mt_scalapack_inv, mt_scalapack_slogdet,
                            mt_scalapack_cholesky, mt_scalapack_eigh)

__all__ = ["inv", "slogdet", "det", "cholesky", "eigh", "eigvalsh", "solve"]


@_registry.implements(np.linalg.inv)
def inv(a):
    """np.linalg.inv of a DTensor: ScaLAPACK's pXgetrf and pXgetri on the matrix as
    it is sharded (rows and columns over up to two mesh dims); the inverse is laid
    out as ``a`` (after any redistribution to a grid). LinAlgError on every rank for
    a singular matrix. Collective on the mesh.

    Example::

        >>> x = distribute_tensor(np.eye(4) * 2, mesh, [Shard(0)])
        >>> np.linalg.inv(x).full_tensor()[0, 0]
        0.5
    """
    name = "numpy.linalg.inv"
    a, rows, cols, dtype, sl, home = S.prepare(name, a)
    if sl is None:
        return S.local_numpy(a, np.linalg.inv, dtype, (a.ndim,))
    if sl is S.ROOT:
        return S.on_root(name, np.linalg.inv, a, dtype, [(dtype, a._spec.placements)])[0]
    n, info, letter = a.shape[-1], I(), S.LETTERS[dtype][0]
    batch, blocks = S.local_stack(a, dtype)
    address = S.announced_mesh(a, name, "pXgetrf, pXgetri")
    for block in blocks:
        call(mt_scalapack_inv, sl, address, rows, cols, letter, n, block, info)
        S.check_info(S.agreed_info(a, rows, cols, info.value), "Singular matrix")
    local = S.stack(batch, blocks)
    S.settle(a, rows, cols, laid=[local])
    return S.home(name, S.wrap(a._spec.mesh, local, a._spec.placements, a.shape), home)


def _slogdet_values(name, a):
    """(a, dtype, engine, values): the (sign, logabsdet) arrays of ``a``'s batch,
    replicated, from ScaLAPACK; values None where the engine is not ScaLAPACK's
    (None: the local case; S.ROOT)."""
    a, rows, cols, dtype, sl, home = S.prepare(name, a)
    if sl is None or sl is S.ROOT:
        return a, dtype, sl, None
    n, letter, out = a.shape[-1], S.LETTERS[dtype][0], (_D * 2)()
    batch, blocks = S.local_stack(a, dtype, copy=False)
    signs, logs = [], []
    address = S.announced_mesh(a, name, "pXgetrf")
    for block in blocks:
        call(mt_scalapack_slogdet, sl, address, rows, cols, letter, n, block, out)
        logs.append(out[0])
        if out[0] == -np.inf:
            signs.append(0.0)
        elif dtype.kind == "c":
            signs.append(np.exp(1j * out[1]))
        else:
            signs.append(1.0 if np.cos(out[1]) > 0 else -1.0)
    real = np.finfo(dtype).dtype
    sign = np.asarray(signs, dtype=dtype).reshape(batch)
    logabs = np.asarray(logs, dtype=real).reshape(batch)
    S.settle(a, rows, cols, replicated=[sign, logabs])
    return a, dtype, sl, (sign, logabs)


@_registry.implements(np.linalg.slogdet)
def slogdet(a):
    """np.linalg.slogdet of a DTensor: ScaLAPACK's pXgetrf on the sharded matrix,
    then each rank's share of the diagonal's logs and the pivots' signs, summed in
    one all-reduce; sign and logabsdet are Replicate. Collective on the mesh.

    Example::

        >>> x = distribute_tensor(np.diag([2.0, -3.0]), mesh, [Shard(0)])
        >>> [float(v.full_tensor()) for v in np.linalg.slogdet(x)]
        [-1.0, 1.791759469228055]
    """
    name = "numpy.linalg.slogdet"
    a, dtype, sl, values = _slogdet_values(name, a)
    if sl is None:
        return S.local_numpy(a, np.linalg.slogdet, dtype, (a.ndim - 2, a.ndim - 2))
    mesh = a._spec.mesh
    if sl is S.ROOT:
        every = (Replicate(),) * mesh.ndim
        values = S.on_root(name, np.linalg.slogdet, a, dtype,
                       [(dtype, every), (np.finfo(dtype).dtype, every)])
        return type(np.linalg.slogdet(np.eye(1)))(*values)
    return type(np.linalg.slogdet(np.eye(1)))(*(S.replicated(mesh, v) for v in values))


@_registry.implements(np.linalg.det)
def det(a):
    """np.linalg.det of a DTensor: sign * exp(logabsdet) of :func:`slogdet`'s
    ScaLAPACK path, Replicate. Collective on the mesh.

    Example::

        >>> x = distribute_tensor(np.diag([2.0, -3.0]), mesh, [Shard(0)])
        >>> float(np.linalg.det(x).full_tensor())
        -6.0
    """
    name = "numpy.linalg.det"
    a, dtype, sl, values = _slogdet_values(name, a)
    if sl is None:
        return S.local_numpy(a, np.linalg.det, dtype, (a.ndim - 2,))
    if sl is S.ROOT:
        every = (Replicate(),) * a._spec.mesh.ndim
        return S.on_root(name, np.linalg.det, a, dtype, [(dtype, every)])[0]
    sign, logabs = values
    return S.replicated(a._spec.mesh, (sign * np.exp(logabs)).astype(dtype))


@_registry.implements(np.linalg.cholesky)
def cholesky(a, /, *, upper=False):
    """np.linalg.cholesky of a DTensor: ScaLAPACK's pXpotrf on the sharded matrix;
    the factor (lower, or upper with ``upper=True``; the other triangle zero) is
    laid out as ``a``. LinAlgError on every rank for a matrix that is not positive
    definite. Collective on the mesh.

    Example::

        >>> x = distribute_tensor(np.eye(4) * 4, mesh, [Shard(0)])
        >>> np.linalg.cholesky(x).full_tensor()[0, 0]
        2.0
    """
    name = "numpy.linalg.cholesky"
    a, rows, cols, dtype, sl, home = S.prepare(name, a)
    kw = {"upper": True} if upper else {}
    if sl is None:
        return S.local_numpy(a, lambda x: np.linalg.cholesky(x, **kw), dtype, (a.ndim,))
    if sl is S.ROOT:
        return S.on_root(name, lambda x: np.linalg.cholesky(x, **kw), a, dtype,
                     [(dtype, a._spec.placements)])[0]
    n, info, letter = a.shape[-1], I(), S.LETTERS[dtype][0]
    batch, blocks = S.local_stack(a, dtype)
    address = S.announced_mesh(a, name, "pXpotrf")
    for block in blocks:
        call(mt_scalapack_cholesky, sl, address, rows, cols, letter, n, block, int(bool(upper)),
             info)
        S.check_info(S.agreed_info(a, rows, cols, info.value),
                    "Matrix is not positive definite")
    local = S.stack(batch, blocks)
    S.settle(a, rows, cols, laid=[local])
    return S.home(name, S.wrap(a._spec.mesh, local, a._spec.placements, a.shape), home)


def _eigen(name, a, UPLO, vectors):
    if UPLO not in ("L", "U"):
        raise ValueError("UPLO argument must be 'L' or 'U'")
    a, rows, cols, dtype, sl, home = S.prepare(name, a)
    func = np.linalg.eigh if vectors else np.linalg.eigvalsh
    if sl is None:
        nd = (a.ndim - 1, a.ndim) if vectors else (a.ndim - 1,)
        return S.local_numpy(a, lambda x: func(x, UPLO=UPLO), dtype, nd)
    real = np.finfo(dtype).dtype
    if sl is S.ROOT:
        outs = [(real, (Replicate(),) * a._spec.mesh.ndim)]
        if not vectors:
            return S.on_root(name, lambda x: func(x, UPLO=UPLO), a, dtype, outs)[0]
        outs.append((dtype, a._spec.placements))
        return type(np.linalg.eigh(np.eye(1)))(
            *S.on_root(name, lambda x: func(x, UPLO=UPLO), a, dtype, outs))
    if cols < 0:  # a small row-sharded matrix: LAPACK on one rank (_small_linalg)
        out = _small_linalg.eigen(name, a, rows, dtype, UPLO, vectors)
        if out is not None and vectors:
            return type(out)(out[0], S.home(name, out[1], home))
        if out is not None:
            return out
    # MKL's band reduction (pdsyrdb, under its symmetric eigensolvers) hands MPI
    # the grid's communicator cut to 32 bits, which Open MPI's pointer handles do
    # not survive: the call crashes the job, a plain C program's as well.
    _comm.agree(a._spec.mesh, S.load()[1] != "mkl", 0,
                f"{name} of a sharded matrix does not run on MKL's ScaLAPACK, whose "
                "eigensolvers crash with Open MPI: install Debian's "
                f"{S.PACKAGE} and unset MPITENSOR_SCALAPACK", RuntimeError)
    n, info, letter = a.shape[-1], I(), S.LETTERS[dtype][0]
    batch, blocks = S.local_stack(a, dtype, copy=vectors)
    ws = []
    routine = ("pXsyevd" if vectors else "pXsyevr") if dtype.kind == "f" else (
        "pXheevd" if vectors else "pXheevr")
    address = S.announced_mesh(a, name, routine)
    for block in blocks:
        w = np.empty(n, real)
        call(mt_scalapack_eigh, sl, address, rows, cols, letter, n, block, int(UPLO == "U"),
             int(vectors), w, info)
        S.check_info(S.agreed_info(a, rows, cols, info.value), "Eigenvalues did not converge")
        ws.append(w)
    mesh = a._spec.mesh
    w = np.stack(ws).reshape(batch + (n,))
    local = S.stack(batch, blocks) if vectors else None
    S.settle(a, rows, cols, laid=[local], replicated=[w])
    w = S.replicated(mesh, w)
    if not vectors:
        return w
    v = S.home(name, S.wrap(mesh, local, a._spec.placements, a.shape), home)
    return type(np.linalg.eigh(np.eye(1)))(w, v)


@_registry.implements(np.linalg.eigh)
def eigh(a, UPLO="L"):
    """np.linalg.eigh of a DTensor: ScaLAPACK's divide and conquer (pXsyevd,
    pXheevd; LAPACK's own method in NumPy's eigh) on the sharded matrix; eigenvalues ascending and Replicate, the
    eigenvectors laid out as ``a``. A small matrix whose rows alone are sharded
    (n up to ``_small_linalg.EIGH_MAX_N``) is solved by NumPy's LAPACK on one
    rank instead, which receives the ``UPLO`` triangle's parts and sends back
    each rank's rows of the eigenvectors. Collective on the mesh.

    Example::

        >>> x = distribute_tensor(np.diag([3.0, 1.0, 2.0]), mesh, [Shard(0)])
        >>> np.linalg.eigh(x).eigenvalues.full_tensor()
        array([1., 2., 3.])
    """
    return _eigen("numpy.linalg.eigh", a, UPLO, True)


@_registry.implements(np.linalg.eigvalsh)
def eigvalsh(a, UPLO="L"):
    """np.linalg.eigvalsh of a DTensor: ScaLAPACK's pXsyevr or pXheevr asked for
    the eigenvalues alone (the tridiagonal reduction's messages, no eigenvectors
    computed or moved), ascending and Replicate; a small matrix whose rows alone
    are sharded on NumPy's LAPACK on one rank, as :func:`eigh`'s. Collective on
    the mesh.

    Example::

        >>> x = distribute_tensor(np.diag([3.0, 1.0, 2.0]), mesh, [Shard(0)])
        >>> np.linalg.eigvalsh(x).full_tensor()
        array([1., 2., 3.])
    """
    return _eigen("numpy.linalg.eigvalsh", a, UPLO, False)


def _as_dtensor(b, mesh):
    """``b`` as a DTensor on ``mesh``: an ndarray every rank holds is Replicate."""
    if type(b) is DTensor:
        return b
    b = np.asarray(b)
    return S.wrap(mesh, b, (Replicate(),) * mesh.ndim, b.shape)


@_registry.implements(np.linalg.solve)
def solve(a, b):
    """np.linalg.solve of DTensors: ScaLAPACK's pXgesv on A as it is sharded, or
    with its rows alone sharded pXgetrf of A's transpose (which each rank's rows
    already are, column-major) and pXgetrs with TRANS='T'; b (a vector, or a matrix of right-hand sides; batched as NumPy's, the batch
    replicated) is laid out with its rows as A's rows and its columns over A's
    column mesh dim, and x comes back in that layout (a vector: rows as A's rows).
    LinAlgError on every rank for a singular A. Collective on the mesh.

    Example::

        >>> A = distribute_tensor(np.eye(4) * 2, mesh, [Shard(0)])
        >>> np.linalg.solve(A, np.ones(4)).full_tensor()
        array([0.5, 0.5, 0.5, 0.5])
    """
    name = "numpy.linalg.solve"
    a = D.implicit((a, b))[0]
    if type(a) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(a).__name__}")
    mesh = a._spec.mesh
    b = _as_dtensor(b, mesh)
    S.square(name, a)
    dtype = np.result_type(S.inexact(name, a.dtype), S.inexact(name, b.dtype))
    vector = b.ndim == 1
    if vector and b.shape[0] != a.shape[-1] or not vector and b.shape[-2] != a.shape[-1]:
        raise ValueError(f"{name}: b's rows ({b.shape}) do not match A's "
                         f"({a.shape}) (NumPy's gufunc would raise too)")
    if vector and a.ndim > 2:
        raise _registry.NoRule(f"{name}: a vector b with a stack of matrices A")
    if not vector and b.shape[:-2] != a.shape[:-2]:
        raise ValueError(f"{name}: A's batch {a.shape[:-2]} and b's {b.shape[:-2]} "
                         "differ; broadcast them first")
    a, rows, cols = S.on_grid(name, a)
    if rows < 0 and cols < 0 or 0 in a.shape + b.shape or mesh._coordinate is None:
        a = D.relayout(name, a, (Replicate(),) * mesh.ndim)
        b = D.relayout(name, b, (Replicate(),) * mesh.ndim)
        return _local_solve(a, b, dtype)
    sl, finite = S.engine(name, mesh, [a.to_local(), b.to_local()])
    fitted = S.fitting(name, a, rows, cols) if finite else None
    if fitted is None:  # NumPy on one rank; x laid out as ScaLAPACK's would be
        pls = (tuple(Shard(0) if m == rows else Replicate() for m in range(mesh.ndim))
               if vector else S.placements(mesh, b.ndim, rows, cols))
        return _small_linalg.on_root(name, np.linalg.solve, [(a, dtype), (b, dtype)],
                                     [(dtype, pls)])[0]
    home = (tuple(Shard(0) if m == rows else Replicate() for m in range(mesh.ndim))
            if vector else S.placements(mesh, b.ndim, rows, cols))
    a, rows, cols = fitted
    if vector:
        return S.home(name, _solve_vector(name, sl, a, b, rows, cols, dtype), home)
    b = D.relayout(name, b, S.placements(mesh, b.ndim, rows, cols))
    return S.home(name, _solve_blocks(sl, a, b, rows, cols, dtype, b._spec.placements,
                                     b.shape), home)


def _local_solve(a, b, dtype):
    mesh = a._spec.mesh
    if mesh._coordinate is None:
        x = np.zeros(b.shape, dtype)
    else:
        x = S.agreed(mesh, lambda: np.linalg.solve(a.to_local().astype(dtype),
                                                  b.to_local().astype(dtype)))
        x = np.array(x, order="C", copy=None)
        same_along(mesh, [x], S.everywhere(mesh))
    return S.replicated(mesh, x)


def _solve_blocks(sl, a, b, rows, cols, dtype, placements, shape):
    """x of A x = B on the grid, B's local blocks given as ``b`` (a DTensor laid
    out with rows as A's and columns over ``cols``)."""
    n, info, letter = a.shape[-1], I(), S.LETTERS[dtype][0]
    batch, blocks = S.local_stack(a, dtype, copy=False)
    _, rhs = S.local_stack(b, dtype)
    address = S.announced_mesh(a, "numpy.linalg.solve",
                       "pXgetrf, pXgetrs" if cols < 0 else "pXgesv")
    for block, r in zip(blocks, rhs):
        call(mt_scalapack_solve, sl, address, rows, cols, letter, n, block, b.shape[-1], r, info)
        S.check_info(S.agreed_info(a, rows, cols, info.value), "Singular matrix")
    local = S.stack(batch, rhs)
    S.settle(a, rows, cols, laid=[local])
    return S.wrap(a._spec.mesh, local, placements, shape)


def _solve_vector(name, sl, a, b, rows, cols, dtype):
    """A vector b as the n x 1 matrix ScaLAPACK takes (its one column on the first
    grid column), and x back as a vector with A's rows' placement."""
    mesh = a._spec.mesh
    pls = tuple(Shard(0) if m == rows else Replicate() for m in range(mesh.ndim))
    b = D.relayout(name, b, pls)
    local = b.to_local()[:, None]
    if cols >= 0 and mesh._coordinate[cols] != 0:
        local = local[:, :0]
    mat = S.placements(mesh, 2, rows, cols)
    b2 = S.wrap(mesh, local, mat, (b.shape[0], 1))
    x2 = _solve_blocks(sl, a, b2, rows, cols, dtype, mat, (b.shape[0], 1))
    x2 = D.relayout(name, x2, tuple(Shard(0) if m == rows else Replicate()
                                    for m in range(mesh.ndim)))
    return S.wrap(mesh, x2.to_local()[:, 0], pls, (b.shape[0],))
