"""The rectangular linear algebra of ``np.linalg`` on ScaLAPACK, which the
entries of ``_ops/_tsqr.py`` call: ``qr`` (pXgeqrf,
then pXorgqr or pXungqr; mode 'raw' pXgeqrf's reflectors themselves),
``svd``/``svdvals`` (pXgesvd; NumPy's ``full_matrices`` by completing U to a basis
with the QR of U) and ``lstsq`` (on that SVD) of DTensors that TSQR does not take:
square and wide matrices, tall ones whose row blocks are shorter than the matrix
is wide, the modes TSQR has no form for (a complete Q or U, the raw reflectors),
and stacks of them (one call per matrix, the batch replicated; lstsq takes one
matrix, as NumPy's).

The matrix is described to ScaLAPACK as it lies, as in ``_scalapack`` (rows over
one mesh dim, columns over another, a Pr x Pc grid), and never gathered; each
factor comes back in torch.chunk's blocks on the same grid, so it is a DTensor
with A's placements (after any redistribution to a grid): Q, R, U and Vh are laid
out as A, singular values are Replicate. Each entry point answers None when the
matrix is not its to take (no sharded matrix dim, an empty matrix or stack, a rank
outside the mesh): the caller keeps its replicate-and-NumPy path for those.
A small matrix whose rows alone are sharded takes ``_small_linalg``'s SVD of its
blocks' stacked R factors instead of pXgesvd, with the same placements. As in
``_scalapack``, a matrix no grid fits (a process would hold no row or column, or
one) and one holding a NaN or an infinity are NumPy's on one rank, in the same
placements, and replica groups' results are made the same bytes.
"""

from __future__ import annotations

import functools

import numpy as np

from .._bind import core
from .._clib import I, call
from .._dtensor import DTensor
from ..placement_types import Replicate, Shard
from . import _dispatch as D
from . import _scalapack as S
from . import _small_linalg
from .._bind.linalg import mt_scalapack_qr, mt_scalapack_svd, mt_scalapack_geqrf


class _Grid:
    """A DTensor of matrices on its process grid: the DTensor (redistributed to a
    grid when it was on none, its batch dims replicated), the mesh dims of its
    rows and columns, the computing dtype, the ScaLAPACK table and this rank's
    block of each matrix of the stack as ScaLAPACK takes it."""

    def __init__(self, name, a, rows, cols, dtype, sl, finite):
        self.name, self.a, self.rows, self.cols, self.dtype = name, a, rows, cols, dtype
        self.home = (rows, cols)  # the grid the results are laid out on
        self.mesh = a._spec.mesh
        self.sl, self.finite = sl, finite
        self.letter = S.LETTERS[dtype][0]
        self.batch, self.blocks = None, None

    def fitted(self):
        """This grid, or the one ``a`` is redistributed to that fits its matrix
        (``_scalapack._fitting``), ready for the drivers; None when the matrix is
        NumPy's on one rank (no grid fits, or it is not finite)."""
        found = S.fitting(self.name, self.a, self.rows, self.cols) if self.finite else None
        if found is None:
            return None
        self.a, self.rows, self.cols = found
        # Read only, but for the raw QR's, which takes copies itself.
        self.batch, self.blocks = S.local_stack(self.a, self.dtype, copy=False)
        return self

    def placements(self, nd=None):
        """The placements of a result laid out on A's own grid (``nd`` dims: A's)."""
        return S.placements(self.mesh, self.a.ndim if nd is None else nd, *self.home)

    def root(self, func, outs, extra=()):
        """NumPy's ``func`` of the matrix (and of ``extra``: (DTensor, dtype) pairs)
        on one rank, laid out by ``outs``. Collective on the mesh."""
        return _small_linalg.on_root(self.name, func, [(self.a, self.dtype), *extra],
                                     outs)

    def settle(self, laid=(), replicated=()):
        """The results made the same bytes where Replicate (``_scalapack._settle``)."""
        S.settle(self.a, self.rows, self.cols, laid, replicated)

    def empty(self, shape, dtype=None):
        """This rank's block of a ``shape`` matrix on the grid, C-ordered."""
        coord = self.mesh._coordinate
        local = []
        for size, m in zip(shape, (self.rows, self.cols)):
            local.append(size if m < 0 else
                         core.chunk_sizes(size, self.mesh.shape[m])[coord[m]])
        return np.zeros(local, dtype or self.dtype)

    def wrap(self, blocks, shape):
        """A DTensor of the stack of ``shape`` matrices whose blocks here are
        ``blocks``, laid out on A's own grid (rows over the row mesh dim, columns
        over the column one, the batch replicated): moved there from the grid that
        fits, where that is another."""
        nd = len(self.batch) + 2
        local = S.stack(self.batch, blocks)
        self.settle(laid=[local])
        out = S.wrap(self.mesh, local, S.placements(self.mesh, nd, self.rows, self.cols),
                      self.batch + tuple(shape))
        return S.home(self.name, out, S.placements(self.mesh, nd, *self.home))

    def replicated(self, values):
        """A Replicate DTensor of one array per matrix of the stack, the same
        bytes on every rank."""
        stacked = np.stack(values)
        stacked = stacked.reshape(self.batch + stacked.shape[1:])
        self.settle(replicated=[stacked])
        return S.replicated(self.mesh, stacked)

    def address(self, routine):
        return S.announced_mesh(self.a, self.name, routine)


def _grid(name, a, extra=()):
    """A :class:`_Grid` of ``a`` on its grid (not yet :meth:`_Grid.fitted`), with
    whether it and ``extra`` (DTensors) are finite everywhere, or None when
    ScaLAPACK is not the engine for it. Decided from the global spec alone, so
    alike on every rank of the mesh. Collective on the mesh (one all-reduce)."""
    if type(a) is not DTensor or a.ndim < 2 or 0 in a.shape:
        return None
    if a._spec.mesh._coordinate is None:
        return None
    dtype = S.inexact(name, a.dtype)
    if S.grid(a) is not None and S.grid(a) == (-1, -1):
        return None  # the matrices are whole on every rank: NumPy's LAPACK
    a, rows, cols = S.on_grid(name, a)
    if rows < 0 and cols < 0:
        return None
    sl, finite = S.engine(name, a._spec.mesh, [x.to_local() for x in (a, *extra)])
    return _Grid(name, a, rows, cols, dtype, sl, finite)


def _swapped(placements, nd):
    """Placements of the transpose of a stack laid out by ``placements``."""
    swap = {nd - 2: nd - 1, nd - 1: nd - 2}
    return tuple(Shard(swap.get(p.dim, p.dim)) if isinstance(p, Shard) else p
                 for p in placements)


def qr(a, mode):
    """np.linalg.qr on ScaLAPACK for every mode (a stack: one call per matrix): Q
    and R laid out as A; for 'raw', NumPy's (h, tau): h the transpose of pXgeqrf's
    factored A (R and the Householder vectors, as LAPACK's geqrf leaves them,
    laid out as A's transpose) and tau Replicate. None for a matrix it does not
    take. Collective on the mesh."""
    if mode not in ("reduced", "complete", "r", "raw"):
        return None
    g = _grid("numpy.linalg.qr", a)
    if g is None:
        return None
    if g.fitted() is None:
        return _qr_root(g, mode)
    m, n = g.a.shape[-2:]
    k = min(m, n)
    if mode == "raw":
        return _qr_raw(g, m, n, k)
    rrows, qcols = (m, m) if mode == "complete" else (k, k)
    rs, qs = [], []
    address = g.address("pXgeqrf" if mode == "r" else "pXgeqrf, pXorgqr")
    for block in g.blocks:
        r = g.empty((rrows, n))
        q = g.empty((m, qcols)) if mode != "r" else None
        call(mt_scalapack_qr, g.sl, address, g.rows, g.cols, g.letter, m, n, block, rrows, r,
             qcols, q)
        rs.append(r)
        qs.append(q)
    r = g.wrap(rs, (rrows, n))
    q = g.wrap(qs, (m, qcols)) if mode != "r" else None
    if mode == "r":
        return r
    return type(np.linalg.qr(np.eye(1)))(q, r)


def _qr_root(g, mode):
    """qr of a matrix that is NumPy's on one rank, in the grid's placements."""
    laid, every = g.placements(), (Replicate(),) * g.mesh.ndim
    func = lambda x: np.linalg.qr(x, mode=mode)  # noqa: E731
    if mode == "r":
        return g.root(func, [(g.dtype, laid)])[0]
    if mode == "raw":
        h, tau = g.root(func, [(g.dtype, _swapped(laid, g.a.ndim)), (g.dtype, every)])
        return h, tau
    return type(np.linalg.qr(np.eye(1)))(*g.root(func, [(g.dtype, laid)] * 2))


def _qr_raw(g, m, n, k):
    """NumPy's qr(mode='raw') of the grid's matrices: pXgeqrf overwrites each
    block with R and the reflectors, the same Householder reflectors (sign and
    scaling) as LAPACK's geqrf, and NumPy hands back that matrix transposed."""
    address = g.address("pXgeqrf")
    taus, blocks = [], [b.copy() for b in g.blocks]  # overwritten by the factors
    for block in blocks:
        tau = np.zeros(k, g.dtype)
        call(mt_scalapack_geqrf, g.sl, address, g.rows, g.cols, g.letter, m, n, block, tau)
        taus.append(tau)
    return np.swapaxes(g.wrap(blocks, (m, n)), -1, -2), g.replicated(taus)


def svd(a, compute_uv=True, full_matrices=False):
    """The SVD on ScaLAPACK (a stack: one call per matrix): (U, S, Vh) with U and
    Vh laid out as A and S Replicate, descending; S alone without ``compute_uv``;
    None for a matrix it does not take. The thin U (m x k) and Vh (k x n), or with
    ``full_matrices`` NumPy's m x m U and n x n Vh: a tall A's U completed to a
    basis in C, a wide A's as the SVD of A^H (a local transpose: its U is A's Vh^H).
    LinAlgError on every rank when it does not converge. Collective on the mesh."""
    name = "numpy.linalg.svd" if compute_uv else "numpy.linalg.svdvals"
    g = _grid(name, a)
    if g is None:
        return None
    if g.finite:
        out = _small(g, compute_uv, full_matrices)
        if out is not None:
            return out
    if g.fitted() is None:
        return _svd_root(g, compute_uv, full_matrices)
    m, n = g.a.shape[-2:]
    if compute_uv and full_matrices and m < n:
        out = svd(_adjoint(g.a), compute_uv=True, full_matrices=True)
        u, s, vh = out
        home = g.placements()
        return type(out)(S.home(name, _adjoint(vh), home), s,
                         S.home(name, _adjoint(u), home))
    k = min(m, n)
    ucols = m if full_matrices else k
    ss, us, vts = [], [], []
    info = I()
    address = g.address("pXgesvd, pXgeqrf, pXorgqr" if compute_uv and ucols > k
                        else "pXgesvd")
    for block in g.blocks:
        s = np.zeros(k, np.finfo(g.dtype).dtype)
        u = g.empty((m, ucols)) if compute_uv else None
        vt = g.empty((k, n)) if compute_uv else None
        call(mt_scalapack_svd, g.sl, address, g.rows, g.cols, g.letter, m, n, block, s, u,
             ucols, vt, info)
        S.check_info(S.agreed_info(g.a, g.rows, g.cols, info.value),
                      "SVD did not converge")
        ss.append(s)
        us.append(u)
        vts.append(vt)
    s = g.replicated(ss)
    if not compute_uv:
        return s
    return type(np.linalg.svd(np.eye(1)))(g.wrap(us, (m, ucols)), s, g.wrap(vts, (k, n)))


def _svd_root(g, compute_uv, full_matrices):
    """The SVD of a matrix that is NumPy's on one rank (NumPy's answer for a NaN
    or an infinity too, ``_small_linalg.svd_of_any``), in the grid's placements."""
    real = np.finfo(g.dtype).dtype
    every = (Replicate(),) * g.mesh.ndim
    func = lambda x: _small_linalg.svd_of_any(x, full_matrices,  # noqa: E731
                                              compute_uv)
    if not compute_uv:
        return g.root(func, [(real, every)])[0]
    laid = g.placements()
    return type(np.linalg.svd(np.eye(1)))(
        *g.root(func, [(g.dtype, laid), (real, every), (g.dtype, laid)]))


def _small(g, compute_uv, full_matrices):
    """The SVD of a small 2-D matrix whose rows alone are sharded, from the stacked
    R factors of its blocks (``_small_linalg``), or None for any other matrix."""
    a = g.a
    if a.ndim != 2 or g.rows < 0 or g.cols >= 0 or \
            not _small_linalg.svd_takes(a, g.rows, compute_uv, full_matrices):
        return None
    return _small_linalg.svd(g.name, a, g.rows, g.dtype, compute_uv, full_matrices)


def _adjoint(x):
    """The conjugate transpose of a stack of matrices: local, the placements
    following the dims."""
    x = np.swapaxes(x, -1, -2)
    return np.conjugate(x) if x.dtype.kind == "c" else x


def lstsq(a, b, rcond):
    """np.linalg.lstsq on ScaLAPACK's SVD, as NumPy's gelsd: x = V diag(1/s) U^H b
    over the singular values above ``rcond`` times the largest, NumPy's rank,
    residuals (given when the rank is n and m > n) and singular values; all
    Replicate (the rank NumPy's integer). U^H b and V (1/s) U^H b are DTensor
    matmuls: A is never gathered, b only as its k columns. A matrix no grid fits,
    or operands holding a NaN or an infinity, are NumPy's lstsq on one rank. None
    when ScaLAPACK does not take ``a``. Collective on the mesh."""
    if type(b) is not DTensor or b.ndim not in (1, 2) or b._spec.mesh is not \
            getattr(getattr(a, "_spec", None), "mesh", None) or b.shape[0] != a.shape[0]:
        return None
    if type(a) is not DTensor or a.ndim != 2 or 0 in a.shape or 0 in b.shape:
        return None  # NumPy's lstsq takes one matrix
    dtype = np.result_type(S.inexact("numpy.linalg.lstsq", a.dtype),
                           S.inexact("numpy.linalg.lstsq", b.dtype))
    if a._spec.mesh._coordinate is None:
        return None
    if S.grid(a) == (-1, -1):  # every rank holds A: NumPy's LAPACK, no message
        return _local_lstsq(a, b, rcond, dtype)
    g = _grid("numpy.linalg.lstsq", a, extra=(b,))
    if g is None:
        return None
    if not g.finite or S.fit_grid(g.mesh, g.a.shape, g.rows, g.cols) is None:
        return _lstsq_root(g, b, rcond, dtype)
    a = g.a  # svd takes it to a grid that fits, or to the stacked R's small SVD
    u, s, vh = svd(a.astype(dtype) if a.dtype != dtype else a)
    m, n = a.shape
    mesh = a._spec.mesh
    sv = s.full_tensor()
    if rcond is None:
        rcond = np.finfo(dtype).eps * max(m, n)
    keep = sv > rcond * sv.max(initial=0.0)
    rank = rank_type()(np.count_nonzero(keep))
    inv = np.where(keep, 1.0 / np.where(keep, sv, 1.0), 0.0).astype(sv.dtype)
    rhs = b if b.dtype == dtype else b.astype(dtype)
    c = np.matmul(u.conj().T, rhs if rhs.ndim == 2 else rhs[:, None])
    c = D.relayout("numpy.linalg.lstsq", c, (Replicate(),) * mesh.ndim)
    y = S.replicated(mesh, c.to_local() * inv[:, None])
    x = np.matmul(vh.conj().T, y)
    x = D.relayout("numpy.linalg.lstsq", x, (Replicate(),) * mesh.ndim)
    real = np.finfo(dtype).dtype
    if rank == n and m > n:
        r = np.matmul(a.astype(dtype), x) - (rhs if rhs.ndim == 2 else rhs[:, None])
        res = np.sum(np.abs(r) ** 2, axis=0)
        residuals = D.relayout("numpy.linalg.lstsq", res, (Replicate(),) * mesh.ndim)
        residuals = S.replicated(mesh, residuals.to_local().astype(real))
    else:
        residuals = S.replicated(mesh, np.empty(0, real))
    xl = np.array(x.to_local()[:, 0] if b.ndim == 1 else x.to_local(), order="C")
    res = np.array(residuals.to_local(), order="C")
    S.settle(a, g.rows, g.cols, replicated=[xl, res])
    return S.replicated(mesh, xl), S.replicated(mesh, res), rank, s


@functools.cache
def rank_type():
    """The type of NumPy's lstsq rank (its gufunc's integer)."""
    return type(np.linalg.lstsq(np.eye(1), np.ones(1), rcond=None)[2])


def _lstsq_root(g, b, rcond, dtype):
    """lstsq of operands that are NumPy's on one rank (no grid fits A, or they
    hold a NaN or an infinity): NumPy's results, Replicate."""
    every = (Replicate(),) * g.mesh.ndim
    real = np.finfo(dtype).dtype
    g.dtype = np.dtype(dtype)
    x, res, rank, s = g.root(lambda a, b: _small_linalg.lstsq_of_any(a, b, rcond),
                             [(dtype, every), (real, every), (rank_type(), every),
                              (real, every)], extra=[(b, dtype)])
    return x, res, rank.to_local()[()], s


def _local_lstsq(a, b, rcond, dtype):
    """lstsq of a matrix every rank holds, on NumPy's LAPACK; ``b`` is replicated
    first. Results Replicate, the same bytes on every rank."""
    mesh = a._spec.mesh
    b = D.relayout("numpy.linalg.lstsq", b, (Replicate(),) * mesh.ndim)
    out = S.agreed(mesh, lambda: _small_linalg.lstsq_of_any(
        a.to_local().astype(dtype), b.to_local().astype(dtype), rcond))
    x, res, rank, s = (np.array(v, order="C", copy=None) for v in out)
    S.same_along(mesh, [x, res, rank, s], S.everywhere(mesh))
    return (S.replicated(mesh, x), S.replicated(mesh, res), rank[()],
            S.replicated(mesh, s))
