"""Matrices on LAPACK instead of ScaLAPACK: small row-sharded ones (``eigh``/
``eigvalsh`` on one rank, ``svd``/``svdvals`` of stacked QR factors on every rank),
and any matrix ScaLAPACK must not see (:func:`on_root`).

ScaLAPACK's eigensolvers and SVD pay for their reductions (tridiagonal, bidiagonal)
with messages of several times the matrix on a P x 1 grid, and on a small matrix
that traffic, not the flops, sets their time: NumPy's LAPACK on one rank, side by
side, took less time than pXsyevr and far less than pXgesvd (docs/linalg.md says
where). So a matrix whose rows are sharded
over one mesh dim (its columns whole, a ``[Shard(0)]``-like layout) and that is
small by the rule below takes these paths; larger ones keep ScaLAPACK, which never
holds the matrix on one rank, so a matrix larger than one rank's memory still
works. The rule is the matrix's size alone, known alike on every rank:
``eigh``/``eigvalsh`` at most :data:`EIGH_MAX_N` rows, ``svd`` at most
:data:`SVD_MAX_ELEMENTS` elements of the stacked factors. The placements are
ScaLAPACK's (eigenvectors, U and Vh laid out as A; eigenvalues and singular values
Replicate), so the engine never shows in the layout of a result.

``eigh``: NumPy's eigh reads one triangle (``UPLO``), so each rank sends one rank
(the root: the one holding most of that triangle) only its rows' part of it; the
root runs LAPACK and sends every rank the eigenvalues and its rows of the
eigenvectors. Only the root computes, so no two ranks can disagree on an
eigenvector's sign.

``svd``: each rank factors its block A_i = Q_i R_i (R_i upper trapezoidal, at most
as many rows as A has columns), the ranks exchange the R_i (upper triangles and
trapezoids only), and each runs NumPy's SVD of the stack R = U_R S Vh, the same
bytes on every rank, as TSQR's SVD of R does; A's U is diag(Q_i) U_R, so each
rank's rows of U are Q_i times its rows of U_R, with no further message.
"""

from __future__ import annotations

import numpy as np

from .. import _comm, _trace
from .._bind import core
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate, Shard
from . import _dispatch as D
from ._alike import alike, same_along

__all__ = ["EIGH_MAX_N", "SVD_MAX_ELEMENTS", "eigen", "svd_takes", "svd", "on_root"]

# The largest n eigh solves on one rank. The root's time grows as n^3 on one rank,
# while pXsyevr's is split over the ranks and its extra traffic grows as n^2, so
# past some n ScaLAPACK wins, the sooner the more ranks: this is where one rank
# was still ahead side by side at two ranks.
EIGH_MAX_N = 1024
# Elements of the stacked R every rank holds and decomposes: the whole matrix
# of a square one, so this bounds each rank's memory as well as its time.
SVD_MAX_ELEMENTS = 2048 * 2048


def _wrap(mesh, local, placements, shape):
    """A DTensor of this (member) rank's ``local`` and its global layout."""
    local = np.array(local, order="C", copy=None)  # 0-d stays 0-d
    return DTensor(local, DTensorSpec(mesh, tuple(placements), tuple(shape), local.dtype,
                                      contiguous_strides(tuple(shape))))


def _replicated(mesh, value):
    return _wrap(mesh, value, (Replicate(),) * mesh.ndim, np.shape(value))


def _offsets(sizes):
    return np.concatenate([[0], np.cumsum(sizes)]).astype(int)


def _triangle_mask(n, start, rows, upper):
    """Which entries of rows [start, start + rows) of an n x n matrix lie in its
    upper (or lower) triangle, the diagonal included."""
    i = np.arange(start, start + rows)[:, None]
    j = np.arange(n)[None, :]
    return j >= i if upper else j <= i


def eigen(name, a, rows, dtype, UPLO, vectors):
    """(w, v), or w alone without ``vectors``, of the stack ``a`` on one rank's
    LAPACK: ``a``'s rows sharded on mesh dim ``rows``, its columns on no mesh dim
    of more than one rank, its batch replicated, this rank a member; None when the
    matrices are not small. LinAlgError on every rank when LAPACK does not
    converge. Collective on the mesh."""
    n = a.shape[-1]
    if n > EIGH_MAX_N:
        return None
    mesh = a._spec.mesh
    p, me = mesh.shape[rows], mesh._coordinate[rows]
    sizes = core.chunk_sizes(n, p)
    at = _offsets(sizes)
    upper = UPLO == "U"
    masks = [_triangle_mask(n, at[c], sizes[c], upper) for c in range(p)]
    counts = [int(m.sum()) for m in masks]
    root = int(np.argmax(counts))
    local = a.to_local().astype(dtype, copy=False)
    batch = local.shape[:-2]
    _trace.collective(f"{name}: LAPACK on one rank", mesh, a._spec.placements,
                      a._spec.shape, a._spec.dtype)
    send = np.ascontiguousarray(local[..., masks[me]]).reshape(-1) if me != root else \
        np.empty(0, dtype)
    got, _ = _comm.alltoallv(mesh, send, [send.size if c == root else 0 for c in range(p)], rows)
    out, ok = None, True
    if me == root:
        out, ok = _root_eigen(local, got, at, masks, me, batch, upper, vectors)
    try:
        _comm.agree(mesh, ok, 0, "Eigenvalues did not converge", ValueError)
    except ValueError:
        raise np.linalg.LinAlgError("Eigenvalues did not converge") from None
    back = [np.empty(0, dtype)] * p
    if me == root:
        w, v = out
        for c in range(p):
            if c != me:
                part = [w.astype(dtype).reshape(-1)]
                if vectors:
                    part.append(v[..., at[c]:at[c + 1], :].reshape(-1))
                back[c] = np.concatenate(part)
    got, _ = _comm.alltoallv(mesh, np.concatenate(back), [x.size for x in back], rows)
    return _eigen_result(a, me, root, out, got, at, dtype, vectors)


def _root_eigen(local, got, at, masks, me, batch, upper, vectors):
    """The root's ((w, v), ok): the matrices put together from its own rows and the
    triangle parts received (in coordinate order), then NumPy's eigh."""
    n = local.shape[-1]
    full = np.zeros(batch + (n, n), local.dtype)
    pos = 0
    for c, mask in enumerate(masks):
        rows = full[..., at[c]:at[c + 1], :]
        if c == me:
            rows[...] = local
            continue
        k = int(mask.sum()) * int(np.prod(batch, dtype=int))
        rows[..., mask] = got[pos:pos + k].reshape(batch + (-1,))
        pos += k
    uplo = "U" if upper else "L"
    try:
        if vectors:
            w, v = np.linalg.eigh(full, UPLO=uplo)
        else:
            w, v = np.linalg.eigvalsh(full, UPLO=uplo), None
    except np.linalg.LinAlgError:
        return None, False
    return (w, v), True


def _eigen_result(a, me, root, out, got, at, dtype, vectors):
    """The DTensors of w (Replicate) and v (this rank's rows, laid out as ``a``)
    from the root's results or what it sent here."""
    mesh, n = a._spec.mesh, a.shape[-1]
    batch = a.shape[:-2]
    real = np.finfo(dtype).dtype
    if me == root:
        w, v = out
        v = None if v is None else v[..., at[me]:at[me + 1], :]
    else:
        nw = int(np.prod(batch, dtype=int)) * n
        w = got[:nw].real.reshape(batch + (n,))
        v = got[nw:].reshape(batch + (at[me + 1] - at[me], n)) if vectors else None
    # Each group of the mesh dims other than the rows' had a root of its own.
    w = np.array(w, real, order="C")
    v = None if v is None else np.array(v, order="C")
    same_along(mesh, [w], range(mesh.ndim))
    same_along(mesh, [v] if vectors else [], _others(mesh, a))
    w = _replicated(mesh, w)
    if not vectors:
        return w
    v = _wrap(mesh, v, a._spec.placements, a.shape)
    return type(np.linalg.eigh(np.eye(1)))(w, v)


def _others(mesh, a) -> list:
    """The mesh dims on which ``a``'s placement is Replicate: each group of ranks
    that differ only there computed its own copy of a result laid out as ``a``."""
    return [m for m, p in enumerate(a._spec.placements) if isinstance(p, Replicate)]


def _stack_rows(m, n, p):
    """The rows each of ``p`` ranks adds to the stacked R of an m x n matrix."""
    return [min(x, n) for x in core.chunk_sizes(m, p)]


def svd_takes(a, rows, compute_uv, full_matrices) -> bool:
    """Whether :func:`svd` takes the 2-D ``a`` whose rows are sharded on mesh dim
    ``rows`` (its columns on none): a member's small matrix, and no complete U of
    a tall one (``full_matrices`` with more rows than columns). From the global
    spec alone, so alike on every rank."""
    m, n = a.shape
    if 0 in a.shape or a._spec.mesh._coordinate is None or full_matrices and compute_uv \
            and m > n:
        return False
    return sum(_stack_rows(m, n, a._spec.mesh.shape[rows])) * n <= SVD_MAX_ELEMENTS


def svd(name, a, rows, dtype, compute_uv, full_matrices):
    """(U, S, Vh), or S alone without ``compute_uv``, of a 2-D ``a`` that
    :func:`svd_takes`, in ``dtype``, from the SVD of the stacked R factors of its
    blocks: U (m x k, or m x m) and Vh (k x n, or n x n) laid out as ``a``, S
    Replicate, descending. LinAlgError on every rank for a matrix holding a NaN or
    an infinity, as NumPy's. Collective on the mesh."""
    m, n = a.shape
    mesh = a._spec.mesh
    p, me = mesh.shape[rows], mesh._coordinate[rows]
    ks = _stack_rows(m, n, p)
    block = a.to_local().astype(dtype, copy=False)
    q, r = np.linalg.qr(block) if block.shape[0] else (None, np.zeros((0, n), dtype))
    _trace.collective(f"{name}: QR of each block, SVD of the stacked R", mesh,
                      a._spec.placements, a._spec.shape, a._spec.dtype)
    stack = _stacked_r(mesh, rows, p, me, r, ks, n)
    if not np.isfinite(stack).all():  # the same bytes on every rank: all raise
        raise np.linalg.LinAlgError("SVD did not converge")
    if not compute_uv:
        return _replicated(mesh, alike(mesh, (np.linalg.svd(stack, compute_uv=False),),
                                       name)[0])
    u_r, s, vh = alike(mesh, np.linalg.svd(stack, full_matrices=full_matrices), name)
    at = _offsets(ks)
    u = q @ u_r[at[me]:at[me + 1]] if q is not None else np.zeros((0, u_r.shape[1]), dtype)
    u = np.array(u, order="C")
    same_along(mesh, [u], _others(mesh, a))  # each replica's Q was its own
    vrows = _offsets(core.chunk_sizes(vh.shape[0], p))
    pls = a._spec.placements
    return type(np.linalg.svd(np.eye(1)))(
        _wrap(mesh, u, pls, (m, u_r.shape[1])), _replicated(mesh, s),
        _wrap(mesh, vh[vrows[me]:vrows[me + 1]], pls, vh.shape))


def _stacked_r(mesh, dim, p, me, r, ks, n):
    """The R factors of the ranks of mesh dim ``dim`` stacked in coordinate order
    (``ks[c]`` rows from coordinate c), on every rank: each sends the others its
    upper trapezoid only. Collective on the dim."""
    masks = [np.triu(np.ones((k, n), bool)) for k in ks]
    mine = np.ascontiguousarray(r[masks[me]])
    send = np.concatenate([mine] * (p - 1)) if p > 1 else mine[:0]
    got, _ = _comm.alltoallv(mesh, send, [0 if c == me else mine.size for c in range(p)], dim)
    stack = np.zeros((sum(ks), n), r.dtype)
    at, pos = _offsets(ks), 0
    for c in range(p):
        rows = stack[at[c]:at[c + 1]]
        if c == me:
            rows[...] = r
            continue
        k = int(masks[c].sum())
        rows[masks[c]] = got[pos:pos + k]
        pos += k
    return stack


# -- NumPy on the root -----------------------------------------------------------------

# The most dims of a result on_root sends back (lstsq's x of a stack is 3-D at most).
_MAX_NDIM = 8


def _is_root(mesh) -> bool:
    return all(c == 0 for c in mesh._coordinate)


def _gather_root(name, x, dtype):
    """The whole of DTensor ``x`` (Shard and Replicate placements; a Partial is
    reduced first) in ``dtype`` on the mesh's root, None on the other members:
    along each mesh dim, the last first (a dim sharded twice is cut by the first
    mesh dim, then the second), coordinate 0 receives its group's blocks in
    order. Collective on the mesh."""
    mesh, spec = x._spec.mesh, x._spec
    if any(p.is_partial() for p in spec.placements):
        x = D.relayout(name, x, tuple(Replicate() if p.is_partial() else p
                                      for p in spec.placements))
        spec = x._spec
    local = np.asarray(x.to_local(), dtype=dtype)
    coord, holds = mesh._coordinate, True
    for m in reversed(range(mesh.ndim)):
        p = spec.placements[m]
        if mesh.shape[m] > 1 and isinstance(p, Shard):
            d = p.dim % x.ndim
            rows = np.ascontiguousarray(np.moveaxis(local, d, 0))
            if not holds:
                rows = rows[:0]
            counts = [rows.shape[0] if c == 0 else 0 for c in range(mesh.shape[m])]
            got, _ = _comm.alltoallv(mesh, rows, counts, m)
            if holds and coord[m] == 0:
                local = np.moveaxis(got, 0, d)
        holds = holds and (coord[m] == 0 or mesh.shape[m] == 1)
    return local if holds else None


def _scatter_root(mesh, full, placements, shape, dtype):
    """This rank's block, laid out by ``placements``, of the ``shape`` array that
    the root holds as ``full`` (None elsewhere): cut along each sharded mesh dim
    in order by the ranks holding it, then broadcast along the others.
    Collective on the mesh."""
    coord, ndim = mesh._coordinate, mesh.ndim
    shard = [mesh.shape[m] > 1 and isinstance(p, Shard) for m, p in enumerate(placements)]
    cur, cur_shape = full, list(shape)
    for m in range(ndim):
        if not shard[m]:
            continue
        d = placements[m].dim % len(shape)
        sizes = core.chunk_sizes(cur_shape[d], mesh.shape[m])
        # Coordinate 0 of this rank's group along m holds the part: zero on every
        # dim not yet cut, as the root is.
        line = all(coord[k] == 0 for k in range(ndim)
                   if k != m and not (k < m and shard[k]))
        rest = cur_shape[:d] + cur_shape[d + 1:]
        if line and coord[m] == 0:
            rows = np.ascontiguousarray(np.moveaxis(cur, d, 0))
            counts = list(sizes)
        else:
            rows, counts = np.empty([0] + rest, dtype), [0] * mesh.shape[m]
        got, _ = _comm.alltoallv(mesh, rows, counts, m)
        cur_shape[d] = sizes[coord[m]]
        cur = np.moveaxis(got.reshape([cur_shape[d]] + rest), 0, d) if line else None
    out = np.array(cur, dtype, order="C") if cur is not None else np.empty(cur_shape, dtype)
    for m in range(ndim):
        if mesh.shape[m] > 1 and not shard[m]:
            _comm.bcast(mesh, out, m)
    return out


def on_root(name, func, operands, outs):
    """NumPy's ``func`` of the whole arrays of ``operands`` ((DTensor, dtype)
    pairs, on one mesh, each cast to its dtype) run on the mesh's root alone; a
    LinAlgError there is raised on every rank. ``outs`` gives each result's (dtype,
    placements): its shape comes from the root, and each rank gets its block of
    it (a Replicate result: the root's bytes everywhere). Returns the results'
    DTensors as a tuple. Collective on the mesh.

    Example: ``(x,) = on_root(name, np.linalg.inv, [(a, np.float64)],
    [(np.float64, a.placements)])``.
    """
    mesh = operands[0][0]._spec.mesh
    if mesh._coordinate is None:
        return tuple(_outside(mesh, dtype, pls) for dtype, pls in outs)
    spec = operands[0][0]._spec
    _trace.collective(f"{name}: LAPACK on one rank", mesh, spec.placements, spec.shape,
                      spec.dtype)
    whole = [_gather_root(name, x, dtype) for x, dtype in operands]
    root = _is_root(mesh)
    ok, message, error, parts = True, "", ValueError, ()
    header = np.full(len(outs) * (_MAX_NDIM + 1), -1, np.int64)
    if root:
        try:
            out = func(*whole)
            parts = tuple(out) if isinstance(out, tuple) else (out,)
            parts = tuple(np.asarray(x, dtype) for x, (dtype, _) in zip(parts, outs))
            for i, x in enumerate(parts):
                header[i * (_MAX_NDIM + 1)] = x.ndim
                header[i * (_MAX_NDIM + 1) + 1:i * (_MAX_NDIM + 1) + 1 + x.ndim] = x.shape
        except Exception as e:  # noqa: BLE001 -- every rank raises it, below
            ok, message = False, str(e)
            error = ValueError if isinstance(e, np.linalg.LinAlgError) else type(e)
    try:
        _comm.agree(mesh, ok, 0, message, error)
    except ValueError as e:
        if type(e) is ValueError:
            raise np.linalg.LinAlgError(str(e)) from None
        raise
    for m in range(mesh.ndim):
        if mesh.shape[m] > 1:
            _comm.bcast(mesh, header, m)
    results = []
    for i, (dtype, placements) in enumerate(outs):
        at = i * (_MAX_NDIM + 1)
        shape = tuple(int(v) for v in header[at + 1:at + 1 + int(header[at])])
        local = _scatter_root(mesh, parts[i] if root else None, tuple(placements), shape,
                              np.dtype(dtype))
        results.append(_wrap(mesh, local, placements, shape))
    return tuple(results)


def svd_of_any(x, full_matrices=True, compute_uv=True):
    """``np.linalg.svd`` of the stack ``x`` as NumPy gives it, but for a matrix
    holding an infinity and no NaN, of which NumPy's LAPACK gives all-NaN
    singular values and arbitrary singular vectors, or on some matrices never
    returns: its singular values are NumPy's (all NaN) and U and Vh NaN. A NaN
    raises NumPy's LinAlgError, as NumPy does. Local.

    Example: ``u, s, vh = svd_of_any(np.array([[np.inf, 1.0], [2.0, 3.0]]))``.
    """
    if not compute_uv or np.isfinite(x).all() or np.isnan(x).any():
        return np.linalg.svd(x, full_matrices=full_matrices, compute_uv=compute_uv)
    u, s, vh = np.linalg.svd(np.zeros_like(x), full_matrices=full_matrices)
    bad = ~np.isfinite(x).all(axis=(-2, -1))
    if not bad.all():
        good = np.linalg.svd(x[~bad], full_matrices=full_matrices)
        u[~bad], s[~bad], vh[~bad] = good
    u[bad], vh[bad] = np.nan, np.nan
    s[bad] = np.linalg.svd(x[bad], compute_uv=False)
    return type(np.linalg.svd(np.eye(1)))(u, s, vh)


def lstsq_of_any(a, b, rcond=None):
    """``np.linalg.lstsq(a, b, rcond=rcond)``, but LinAlgError("SVD did not
    converge in Linear Least Squares") for an ``a`` holding a NaN or an infinity
    without calling LAPACK: NumPy's answer there, which its LAPACK gives after
    printing complaints, or on some matrices with an infinity never gives. Local.

    Example: ``x, res, rank, s = lstsq_of_any(np.eye(2), np.ones(2))``.
    """
    if not np.isfinite(a).all():
        raise np.linalg.LinAlgError("SVD did not converge in Linear Least Squares")
    return np.linalg.lstsq(a, b, rcond=rcond)


def _outside(mesh, dtype, placements):
    """A result's DTensor on a rank outside the mesh, which takes no part: empty,
    its global shape unknown there (0-d)."""
    return DTensor(D.outside_local((), np.dtype(dtype)),
                   DTensorSpec(mesh, tuple(placements), (), np.dtype(dtype), ()))
