"""Linear algebra of tall-skinny matrices on TSQR (csrc/linalg/tsqr.c): ``qr``,
``svd``, ``svdvals``, ``lstsq``, ``matrix_rank``, ``pinv``, ``norm`` (ord 2, -2,
'nuc') and ``cond`` (p None, 2, -2) of a 2-D DTensor with more rows than columns
whose rows are sharded on one mesh dim (``Shard(0)`` there, ``Replicate`` on any
other), with at least as many rows as columns in every rank's block.

Each rank factors its block with LAPACK; the ranks of that mesh dim combine their
n x n R factors as a butterfly (one triangle per rank per level, log2 P levels), so
that every rank holds R, and each rank's rows of Q follow from the tree with no
further message (but to the ranks folded in where P is not a power of two). Only
n x n triangles move, never the matrix; CommDebugMode counts each TSQR as one
all_reduce. Everything else (the SVD of R, the solve of R) is n x n work repeated
on every rank, its results checked alike (``_alike``: one small all-reduce).

Placements: Q and U keep A's (rows sharded), ``pinv``'s columns are sharded as
A's rows; R, singular values, Vh, the solution of ``lstsq`` and norms are
Replicate; ``matrix_rank`` and ``cond`` are NumPy scalars, as on the gathered path.
A 2-D matrix outside that form (square, wide, sharded on its columns or on two mesh
dims, a block shorter than it is wide) with a sharded matrix dim goes to ScaLAPACK
for ``qr``, ``svd``, ``svdvals`` and ``lstsq`` (``_scalapack_rect``); what neither
engine takes (a stack, NumPy's modes that have no distributed form) keeps the
replicate-and-NumPy path (``_stats._decomposition``) or, for ``norm``, the
partial-norm rules.

A NaN or an infinity anywhere in A (or lstsq's b) leaves R, the same on every
rank, not finite: then ``qr``, ``svd``, ``svdvals`` and ``lstsq`` give NumPy's
answer from NumPy's function on one rank (``_small_linalg.on_root``), at no
cost to finite matrices. Where a mesh dim replicates A, each replica group runs
its own tree, so Q (and U, and pinv's columns) are made the same bytes along it
(``_alike.same_along``).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.array_utils import normalize_axis_tuple

from .. import _comm, _lapack, _registry, _trace
from .._bind import core
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate, Shard
from .._algorithms import _dispatch as D
from .._algorithms import _merge
from .._algorithms import _small_linalg
from .._algorithms._alike import alike, same_along
from .._algorithms import _scalapack_rect as _rect
from .._algorithms._scalapack import scalapack_library
from ._stats import _decomposition, _wrap_replicate

_DTYPES = (np.float32, np.float64, np.complex64, np.complex128)


class _Tall:
    """A DTensor TSQR takes: its mesh, the mesh dim that shards its rows, its
    global shape and this rank's block (None outside the mesh)."""

    def __init__(self, a, dim):
        self.a, self.spec, self.dim = a, a._spec, dim
        self.mesh = a._spec.mesh
        self.shape = tuple(a._spec.shape)
        inside = self.mesh._coordinate is not None
        self.block = a.to_local() if inside else None

    def factor(self, name, want_q, block=None):
        """(q, r) of TSQR over the mesh dim (q None unless ``want_q``) for the
        operation ``name``, which the collective checks, logs and CommDebugMode's
        operation list see; outside the mesh, zeros of the right shapes.
        Collective on the mesh dim."""
        block = self.block if block is None else block
        n = block.shape[1] if block is not None else self.shape[1]
        if self.mesh._coordinate is None:
            return np.zeros((0, n), self.spec.dtype), np.zeros((n, n), self.spec.dtype)
        _trace.collective(f"{name}: TSQR's tree of R factors", self.mesh,
                          self.spec.placements, (self.shape[0], n), self.spec.dtype)
        q, r = _lapack.tsqr(_comm.checked(self.mesh), self.dim, block, want_q)
        # Every rank's R, a Replicate result, from its own tree: made alike. Q stays
        # each rank's own, which is its R's to rounding.
        (r,) = alike(self.mesh, (r,), name)
        return q, r

    def rows_like_a(self, local, ncols):
        """A DTensor of global shape (rows, ncols) whose rows are laid out as A's,
        this rank's block ``local``."""
        shape = (self.shape[0], ncols)
        local = self.settled(local) if self.mesh._coordinate is not None else \
            D.outside_local(shape, local.dtype)
        return DTensor(local, DTensorSpec(self.mesh, self.spec.placements, shape,
                                          np.dtype(local.dtype), contiguous_strides(shape)))

    def settled(self, local):
        """``local`` (a result laid out as A's rows), C-ordered, the same bytes in
        every replica group: each ran its own tree. Collective on the mesh when a
        mesh dim of more than one rank replicates A."""
        local = np.array(local, order="C")
        same_along(self.mesh, [local],
                   [m for m, p in enumerate(self.spec.placements) if p == Replicate()])
        return local

    def replicate(self, x):
        return _wrap_replicate(self.mesh, x)

    def finite(self, r) -> bool:
        """Whether R, the same on every rank, is finite: a NaN or an infinity
        anywhere in the matrix leaves it not."""
        return bool(np.isfinite(r).all())

    def root(self, name, func, outs, extra=()):
        """NumPy's ``func`` of the matrix (and ``extra``: (DTensor, dtype) pairs)
        on one rank, its results laid out by ``outs`` ((dtype, placements) or
        "rows": as A's rows, "all": Replicate). Collective on the mesh."""
        every = (Replicate(),) * self.mesh.ndim
        outs = [(dtype, self.spec.placements if pls == "rows" else every)
                for dtype, pls in outs]
        return _small_linalg.on_root(name, func, [(self.a, self.spec.dtype), *extra], outs)


def _tall(a, extra_columns=0):
    """A :class:`_Tall` of ``a`` when TSQR can factor it (with ``extra_columns``
    more columns beside it, as lstsq's right-hand sides), else None. Decided from
    the global spec alone, so alike on every rank."""
    if type(a) is not DTensor or a.ndim != 2:
        return None
    spec = a._spec
    if np.dtype(spec.dtype).type not in _DTYPES or not _lapack.available(spec.dtype):
        return None
    shards = [m for m, p in enumerate(spec.placements) if p != Replicate()]
    if len(shards) != 1 or spec.placements[shards[0]] != Shard(0):
        return None
    dim = shards[0]
    rows, n = spec.shape
    # A square matrix is no tall one: it is ScaLAPACK's, or NumPy's on one rank.
    if n == 0 or rows <= n:
        return None
    n += extra_columns
    if min(core.chunk_sizes(rows, spec.mesh.shape[dim])) < n:
        return None
    return _Tall(a, dim)


# -- qr ------------------------------------------------------------------------------

def _same_everywhere(out):
    """A replicated path's Replicate results, the same bytes on every rank (each
    ran NumPy on its own copy). Collective on the mesh."""
    parts = out if isinstance(out, tuple) else (out,)
    mesh = parts[0]._spec.mesh
    same_along(mesh, [x._local_tensor for x in parts], range(mesh.ndim))
    return out


def _replicated(func):
    """``_decomposition(func)`` (replicate, NumPy on every rank) whose results are
    the same bytes everywhere."""
    run = _decomposition(func)

    def impl(a, *args, **kwargs):
        return _same_everywhere(run(a, *args, **kwargs))
    return impl


def _numpy_svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    """NumPy's svd, through ``_small_linalg.svd_of_any`` for a matrix holding an
    infinity, on which NumPy's LAPACK may never return."""
    if hermitian:
        return np.linalg.svd(a, full_matrices, compute_uv, hermitian=True)
    return _small_linalg.svd_of_any(a, full_matrices, compute_uv)


_numpy_svd.__name__ = "svd"
_replicated_qr = _replicated(np.linalg.qr)


@_registry.implements(np.linalg.qr)
def qr(a, mode="reduced"):
    """np.linalg.qr of a DTensor. A tall matrix with its rows sharded on one mesh
    dim (every block at least as tall as it is wide) takes TSQR: ``mode``
    'reduced' gives Q laid out as A (each rank its rows) and R Replicate; 'r' R
    alone. Signs may differ from NumPy's (a QR is unique up to the signs of R's
    rows): Q @ R is A and Q's columns are orthonormal. Any other 2-D matrix with
    a sharded dim, and mode 'complete' (an m x m Q), take ScaLAPACK's pXgeqrf and
    pXorgqr: Q and R laid out as A. Mode 'raw' (LAPACK's reflectors of the whole
    matrix) is pXgeqrf's factored matrix, the same reflectors as LAPACK's geqrf:
    h (NumPy's transpose of it) laid out as A's transpose, tau Replicate. A
    matrix no mesh dim shards, and a tall one's 'complete' and 'raw' where
    ScaLAPACK is not installed, are replicated and NumPy runs on every rank.
    Collective on the mesh.

    Example::

        >>> a = distribute_tensor(np.random.rand(1000, 8), mesh, [Shard(0)])
        >>> q, r = np.linalg.qr(a)   # q: [Shard(0)], r: [Replicate()]
        >>> q, r = np.linalg.qr(a[:8])   # square: ScaLAPACK, q and r [Shard(0)]
    """
    t = _tall(a) if mode in ("reduced", "r") else None
    if t is None and _tall(a) is not None and not _scalapack_found(a):
        return _replicated_qr(a, mode=mode)  # without ScaLAPACK a tall matrix still runs
    if t is None:
        out = _rect.qr(a, mode)
        return out if out is not None else _replicated_qr(a, mode=mode)
    q, r = t.factor("numpy.linalg.qr", want_q=mode == "reduced")
    if not t.finite(r):
        dtype = t.spec.dtype
        out = t.root("numpy.linalg.qr", lambda x: np.linalg.qr(x, mode=mode),
                     [(dtype, "rows"), (dtype, "all")] if mode == "reduced" else
                     [(dtype, "all")])
        return out[0] if mode == "r" else type(np.linalg.qr(np.eye(1)))(*out)
    if mode == "r":
        return t.replicate(r)
    n = t.shape[1]
    return type(np.linalg.qr(np.eye(1)))(t.rows_like_a(q, n), t.replicate(r))


# -- singular values ---------------------------------------------------------------

_replicated_svd = _replicated(_numpy_svd)
_replicated_svdvals = (_replicated(np.linalg.svdvals)
                       if hasattr(np.linalg, "svdvals") else None)


def _scalapack_found(a) -> bool:
    """Whether ScaLAPACK loaded, agreed on by ``a``'s mesh (ValueError on every
    member when the members differ). Collective on the mesh."""
    found = scalapack_library() is not None
    _comm.agree(a._spec.mesh, True, int(found),
                "numpy.linalg: ScaLAPACK was found on some ranks and not on others")
    return found


def _singular_values(t, name):
    """The singular values of the matrix of ``t`` (those of its R), descending, as
    NumPy gives them: real, on every rank. Collective on the mesh dim."""
    _, r = t.factor(name, want_q=False)
    return alike(t.mesh, (np.linalg.svd(r, compute_uv=False),), name)[0]


def _values_or_root(t, name):
    """The singular values of the matrix of ``t`` as a Replicate DTensor: R's,
    or NumPy's on one rank for a matrix that is not finite. Collective on the
    mesh."""
    _, r = t.factor(name, want_q=False)
    if not t.finite(r):
        real = np.finfo(t.spec.dtype).dtype
        return t.root(name, lambda x: np.linalg.svd(x, compute_uv=False),
                      [(real, "all")])[0]
    return t.replicate(alike(t.mesh, (np.linalg.svd(r, compute_uv=False),), name)[0])


@_registry.implements(np.linalg.svd)
def svd(a, full_matrices=True, compute_uv=True, hermitian=False):
    """np.linalg.svd of a DTensor. A tall matrix with its rows sharded on one mesh
    dim takes TSQR and the SVD of R = U_R S Vh: U = Q U_R is laid out as A, S and
    Vh are Replicate (with ``compute_uv=False``, S alone). ``full_matrices=True``
    (NumPy's default) asks for an m x m U, which has no distributed form here:
    it takes ScaLAPACK (pXgesvd, U completed to a basis of the whole space by
    its own QR; a wide matrix's Vh likewise, through A^H), as does any other 2-D
    matrix with a sharded dim: U and Vh laid out as A, S Replicate. A small
    one whose rows alone are sharded and whose blocks are not tall takes the SVD
    of its blocks' stacked R factors (``_small_linalg``) instead, with the same
    placements.
    ``hermitian=True``, and a complete U where ScaLAPACK is not installed, are
    replicated first and NumPy runs on every rank. Singular vectors are unique
    up to a phase per pair, as in NumPy. Collective on the mesh.

    Example::

        >>> u, s, vh = np.linalg.svd(a, full_matrices=False)  # a: [Shard(0)], tall
    """
    full = bool(compute_uv and full_matrices)
    t = _tall(a) if not (hermitian or full) else None
    if full and not hermitian and _tall(a) is not None and not _scalapack_found(a):
        t = None  # without ScaLAPACK, a tall matrix's complete U is NumPy's
    elif t is None and not hermitian:
        out = _rect.svd(a, compute_uv, full_matrices=full)
        if out is not None:
            return out
    if t is None:
        return _replicated_svd(a, full_matrices=full_matrices, compute_uv=compute_uv,
                               hermitian=hermitian)
    if not compute_uv:
        return _values_or_root(t, "numpy.linalg.svd")
    q, r = t.factor("numpy.linalg.svd", want_q=True)
    if not t.finite(r):
        dtype, real = t.spec.dtype, np.finfo(t.spec.dtype).dtype
        return type(np.linalg.svd(np.eye(1)))(*t.root(
            "numpy.linalg.svd", lambda x: _small_linalg.svd_of_any(x, False),
            [(dtype, "rows"), (real, "all"), (dtype, "all")]))
    u_r, s, vh = alike(t.mesh, np.linalg.svd(r), "numpy.linalg.svd")
    u = t.rows_like_a(q @ u_r, t.shape[1])
    return type(np.linalg.svd(np.eye(1)))(u, t.replicate(s), t.replicate(vh))


if _replicated_svdvals is not None:
    @_registry.implements(np.linalg.svdvals)
    def svdvals(x, /):
        """np.linalg.svdvals of a DTensor: for a tall matrix with its rows sharded
        on one mesh dim, the singular values of TSQR's R (one triangle per rank
        per tree level moves), Replicate; another 2-D matrix with a sharded dim
        takes ScaLAPACK's pXgesvd, and a stack is replicated first. Collective on
        the mesh.

        Example: ``np.linalg.svdvals(a)`` of a ``[Shard(0)]`` 10000 x 16 DTensor.
        """
        t = _tall(x)
        if t is None:
            out = _rect.svd(x, compute_uv=False)
            return out if out is not None else _replicated_svdvals(x)
        return _values_or_root(t, "numpy.linalg.svdvals")


# -- least squares -------------------------------------------------------------------

@_registry.implements(np.linalg.lstsq)
def lstsq(a, b, rcond=None):
    """np.linalg.lstsq of a tall DTensor ``a`` with its rows sharded on one mesh
    dim and a DTensor ``b`` (m or m x k) on the same mesh: TSQR of [A | b] gives R
    and Q^H b at once (nothing but the tree's triangles moves; ``b`` is first laid
    out as ``a``'s rows, which moves nothing when it already is), then every rank
    solves the small problem alike: the SVD of R's n x n block (A's singular
    values) decides the rank by NumPy's ``rcond`` (None: double's machine
    precision times max(m, n)), and a rank-deficient A gets NumPy's minimum-norm
    solution from it. Residuals (the squared norms of the trailing block of R) are
    given when A has full rank and m > n. ``b`` may be an ndarray, the same on
    every rank (each rank keeps its rows). As NumPy, single precision computes in
    double and the results come back in the operands' type. Results are
    Replicate (the rank NumPy's integer type). A NaN or an infinity in ``a`` or
    ``b`` gives NumPy's own answer (its LinAlgError) from one rank. Another 2-D
    ``a`` with a sharded dim (square,
    wide, short blocks) takes ScaLAPACK's SVD, as NumPy's gelsd; any other
    operands take the gathered path.
    Collective on the mesh.

    Example::

        >>> x, res, rank, s = np.linalg.lstsq(a, b)   # a: [Shard(0)] 10000 x 8, b: 10000
    """
    a, b, result = _lstsq_operands(a, b)
    k = (b.shape[1] if b.ndim == 2 else 1) if type(b) is DTensor and b.ndim in (1, 2) else 0
    t = _tall(a, extra_columns=k) if k else None
    if t is None or b._spec.mesh is not t.mesh or b.shape[0] != t.shape[0]:
        out = _rect.lstsq(a, b, rcond) if t is None else None
        if out is not None:
            return _lstsq_result(out, result)
        return _registry.gather_call(np.linalg.lstsq, (a, b), {"rcond": rcond})
    b = D.relayout("numpy.linalg.lstsq", b, t.spec.placements)
    m, n = t.shape
    if t.mesh._coordinate is not None:
        rhs = b.to_local().reshape(-1, k)
        block = np.concatenate([t.block, rhs], axis=1)
    else:
        block = np.zeros((0, n + k), a.dtype)
    _, r = t.factor("numpy.linalg.lstsq", want_q=False, block=block)
    if not t.finite(r):
        real = np.finfo(a.dtype).dtype
        x, res, rank, s = t.root(
            "numpy.linalg.lstsq", lambda x, y: _small_linalg.lstsq_of_any(x, y, rcond),
            [(a.dtype, "all"), (real, "all"), (_rect.rank_type(), "all"), (real, "all")],
            extra=[(b, a.dtype)])
        return _lstsq_result((x, res, rank.to_local()[()], s), result)
    if rcond is None:
        rcond = np.finfo(a.dtype).eps * max(m, n)
    x, _, rank, s = np.linalg.lstsq(r[:n, :n], r[:n, n:], rcond=rcond)
    x, rank, s = alike(t.mesh, (x, np.array(rank), s), "numpy.linalg.lstsq")
    if rank == n and m > n:
        residuals = np.sum(np.abs(r[n:, n:]) ** 2, axis=0)
    else:
        residuals = np.empty(0, np.finfo(a.dtype).dtype)
    if b.ndim == 1:
        x = x[:, 0]
    return _lstsq_result((t.replicate(x), t.replicate(residuals),
                          _rect.rank_type()(rank), t.replicate(s)), result)


def _lstsq_operands(a, b):
    """(a, b, the result's dtype): lstsq's operands as the engines take them, in the
    precision NumPy computes in (double: its lite LAPACK runs float32 in float64,
    and its rcond and rank are double's), cast locally. An ndarray (or list)
    ``b`` beside a DTensor ``a`` is the same on every rank, as the gathered path
    reads it, so it becomes a Replicate DTensor (each rank then keeps its rows,
    moving nothing). Anything else is left as it is (result None), for the
    gathered path."""
    if (type(a) is not DTensor and type(b) is DTensor and b.ndim in (1, 2)
            and isinstance(a, (np.ndarray, list, tuple)) and np.ndim(a) == 2):
        # A matrix every rank holds alike beside a DTensor b (xarray's polyfit:
        # the Vandermonde matrix and the series): each rank keeps its rows of it,
        # moving nothing, and the DTensor engines take the pair.
        mesh = b._spec.mesh
        a = D.relayout("numpy.linalg.lstsq", _wrap_replicate(mesh, np.asarray(a)),
                       [Shard(0)] + [Replicate()] * (mesh.ndim - 1))
    if type(a) is not DTensor or a.ndim != 2:
        return a, b, None
    if type(b) is not DTensor:
        if not (isinstance(b, (np.ndarray, list, tuple)) and np.ndim(b) in (1, 2)):
            return a, b, None
        b = _wrap_replicate(a._spec.mesh, np.asarray(b))
    kinds = [np.float64 if x.dtype.kind in "biu" else x.dtype for x in (a, b)]
    result = np.result_type(*kinds)
    if result.type not in _DTYPES or b._spec.mesh is not a._spec.mesh:
        return a, b, None
    common = np.dtype(np.complex128 if result.kind == "c" else np.float64)
    return (a if a.dtype == common else a.astype(common),
            b if b.dtype == common else b.astype(common), result)


def _lstsq_result(out, result):
    """lstsq's (x, residuals, rank, s) in NumPy's result types for ``result``."""
    x, residuals, rank, s = out
    if result is None:
        return out
    real = np.finfo(result).dtype
    return (x if x.dtype == result else x.astype(result),
            residuals if residuals.dtype == real else residuals.astype(real), rank,
            s if s.dtype == real else s.astype(real))


# -- what the singular values give ---------------------------------------------------

@_registry.implements(np.linalg.matrix_rank)
def matrix_rank(A, tol=None, hermitian=False, *, rtol=None):
    """np.linalg.matrix_rank of a DTensor: for a tall matrix with its rows
    sharded on one mesh dim, the count of R's singular values above NumPy's
    tolerance (``tol``, else ``rtol`` times the largest, ``rtol`` defaulting to
    machine precision times max(m, n)), a NumPy integer alike on every rank, as
    NumPy returns it; any other matrix takes the gathered path. Collective on the mesh.

    Example: ``int(np.linalg.matrix_rank(a))`` of a ``[Shard(0)]`` DTensor.
    """
    t = _tall(A) if not hermitian else None
    if t is None:
        return _registry.gather_call(np.linalg.matrix_rank, (A,),
                                     {"tol": tol, "hermitian": hermitian, "rtol": rtol})
    s = _singular_values(t, "numpy.linalg.matrix_rank")
    if tol is None:
        if rtol is None:
            rtol = max(t.shape) * np.finfo(s.dtype).eps
        tol = s.max(initial=0.0) * rtol
    return np.intp(np.count_nonzero(s > tol))


@_registry.implements(np.linalg.pinv)
def pinv(a, rcond=None, hermitian=False, *, rtol=np._NoValue):
    """np.linalg.pinv of a DTensor: for a tall matrix with its rows sharded on one
    mesh dim, A+ = R+ Q^H from TSQR, each rank its columns of the n x m result
    (``Shard(1)`` where A has ``Shard(0)``), with NumPy's cutoff (``rtol``, else
    ``rcond``, else machine precision times max(m, n), times the largest singular
    value). Any other matrix takes the gathered path. Collective on the mesh.

    Example: ``p = np.linalg.pinv(a)``  # a: [Shard(0)] 10000 x 8 -> p: [Shard(1)]
    """
    t = _tall(a) if not hermitian else None
    if t is None:
        kwargs = {"rcond": rcond, "hermitian": hermitian}
        if rtol is not np._NoValue:
            kwargs["rtol"] = rtol
        return _registry.gather_call(np.linalg.pinv, (a,), kwargs)
    m, n = t.shape
    cut = rtol if rtol is not np._NoValue and rtol is not None else rcond
    if cut is None:
        cut = np.finfo(a.dtype).eps * max(m, n)
    q, r = t.factor("numpy.linalg.pinv", want_q=True)
    (r_plus,) = alike(t.mesh, (np.linalg.pinv(r, rcond=cut),), "numpy.linalg.pinv")
    local = r_plus @ q.conj().T
    placements = tuple(Shard(1) if p == Shard(0) else p for p in t.spec.placements)
    shape = (n, m)
    if t.mesh._coordinate is None:
        local = D.outside_local(shape, local.dtype)
    else:
        local = t.settled(local)
    return DTensor(np.ascontiguousarray(local),
                   DTensorSpec(t.mesh, placements, shape, np.dtype(local.dtype),
                               contiguous_strides(shape)))


def _whole_matrix(axis) -> bool:
    """Whether ``axis`` of a matrix norm names a 2-D array's (rows, columns) in
    that order; anything else (a vector norm, the transpose, a wrong axis) is left
    to the partial-norm rule, which raises NumPy's error where NumPy does."""
    if axis is None:
        return True
    try:
        return tuple(normalize_axis_tuple(axis, 2)) == (0, 1)
    except (TypeError, ValueError):
        return False


@_registry.implements(np.linalg.norm)
def norm(x, ord=None, axis=None, keepdims=False):
    """np.linalg.norm of a DTensor. The matrix norms that need singular values
    (``ord`` 2, -2, 'nuc') of a tall 2-D matrix with its rows sharded on one mesh
    dim take TSQR (the largest, the smallest, the sum of R's singular values), a
    0-d Replicate DTensor (or 1 x 1 with ``keepdims``); every other norm is the
    partial-norm rule (``_merge.norm``). Collective on the mesh.

    Example: ``np.linalg.norm(a, 2)`` of a ``[Shard(0)]`` 10000 x 8 DTensor.
    """
    t = None
    singular = (ord == "nuc") if isinstance(ord, str) else ord in (2, -2)
    if singular and type(x) is DTensor and x.ndim == 2 and _whole_matrix(axis):
        t = _tall(x)
    if t is None:
        return _merge.norm(x, ord=ord, axis=axis, keepdims=keepdims)
    s = _singular_values(t, "numpy.linalg.norm")
    value = s.sum() if ord == "nuc" else (s.max() if ord == 2 else s.min())
    out = np.asarray(value, s.dtype)
    return t.replicate(out.reshape(1, 1) if keepdims else out)


@_registry.implements(np.linalg.cond)
def cond(x, p=None):
    """np.linalg.cond of a DTensor: with ``p`` None, 2 or -2 and a tall matrix with
    its rows sharded on one mesh dim, the ratio of R's largest and smallest
    singular values (inf for a singular matrix, as NumPy), a NumPy float alike on
    every rank, as NumPy returns it; other norms and matrices take the gathered path. Collective on the
    mesh.

    Example: ``float(np.linalg.cond(a))`` of a ``[Shard(0)]`` DTensor.
    """
    t = _tall(x) if p in (None, 2, -2) and not isinstance(p, str) else None
    if t is None:
        return _registry.gather_call(np.linalg.cond, (x,), {"p": p})
    s = _singular_values(t, "numpy.linalg.cond")
    with np.errstate(divide="ignore", invalid="ignore"):
        value = s[0] / s[-1] if p in (None, 2) else s[-1] / s[0]
    if np.isnan(value):
        value = np.inf
    return s.dtype.type(value)
