"""np.linalg's rectangular factorizations on ScaLAPACK: qr (pXgeqrf and
pXorgqr/pXungqr, every mode NumPy has; 'raw' NumPy's own h and tau), svd
(pXgesvd, full_matrices too) and svdvals, and lstsq (on that SVD, as NumPy's gelsd) of square, wide, and tall-but-short-blocked DTensors
sharded over one or two mesh dims, compared with NumPy on the gathered matrix:
||A - QR|| / ||A|| and ||Q^H Q - I|| within 1e-12 in float64, singular values
within 1e-10 of the largest; float32 and the complex types within their
precision's. Uneven shards, a rank with no rows, 2-D meshes, stacks; no gather
(a GatherWarning is an error here). Run under mpiexec at 1 to 4 ranks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import Replicate, Shard, distribute_tensor
from mpitensor._algorithms import _small_linalg
from mpitensor._ops._fallback import GatherWarning
from mpitensor._algorithms._scalapack import scalapack_library
from mpitensor.debug import CommDebugMode
from mpitensor.device_mesh import init_device_mesh

P = MPI.COMM_WORLD.size
R, S0, S1 = Replicate(), Shard(0), Shard(1)
DTYPES = (np.float32, np.float64, np.complex64, np.complex128)

pytestmark = pytest.mark.skipif(scalapack_library() is None,
                                reason="ScaLAPACK (libscalapack-openmpi-dev) is not installed")


def layouts():
    """(mesh shape, placements): rows, columns, both (2-D meshes)."""
    out = [((P,), [S0]), ((P,), [S1])]
    if P == 4:
        out += [((2, 2), [S0, S1]), ((2, 2), [S1, S0]), ((2, 2), [S0, R])]
    if P >= 2:
        out += [((1, P), [S0, S1]), ((P, 1), [S1, S0])]
    return out


# Square, wide, tall with blocks shorter than wide (TSQR's form at P = 1 only),
# and a matrix with fewer rows than ranks (a rank with no rows).
SHAPES = sorted({(2 * P + 1, 2 * P + 1), (P + 2, 3 * P + 2), (2 * P + 3, 2 * P + 1),
                 (max(P - 1, 1), 4)})


def tol(dtype, base=1e-12):
    return base if np.finfo(dtype).dtype == np.float64 else 1e3 * np.finfo(dtype).eps


def matrix(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal(shape)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dtype)


def dist(a, layout):
    mesh = init_device_mesh("cpu", layout[0])
    return distribute_tensor(a, mesh, layout[1])


def same_layout(x, da) -> bool:
    """Whether ``x`` is laid out as A on every mesh dim of more than one rank (a
    dim of one rank holds everything either way)."""
    sizes = da.device_mesh.shape
    return all(p == q for p, q, size in zip(x.placements, da.placements, sizes) if size > 1)


@pytest.fixture(autouse=True)
def no_gather():
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        yield


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_qr_every_mode(layout, shape, dtype):
    a = matrix(shape, dtype)
    da = dist(a, layout)
    m, n = shape
    k = min(m, n)
    for mode, (qcols, rrows) in (("reduced", (k, k)), ("complete", (m, m))):
        q, r = np.linalg.qr(da, mode=mode)
        assert q.shape == (m, qcols) and r.shape == (rrows, n) and q.dtype == np.dtype(dtype)
        qf, rf = q.full_tensor(), r.full_tensor()
        assert np.array_equal(rf, np.triu(rf))
        assert np.linalg.norm(a - qf @ rf) <= tol(dtype) * np.linalg.norm(a)
        assert np.linalg.norm(qf.conj().T @ qf - np.eye(qcols)) <= tol(dtype) * max(1, qcols)
        # R's rows agree with NumPy's up to a sign (a phase): |R| is unique.
        np.testing.assert_allclose(np.abs(rf[:k]), np.abs(np.linalg.qr(a, mode=mode)[1][:k]),
                                   atol=tol(dtype, 1e-10) * np.abs(a).max() * n)
    rr = np.linalg.qr(da, mode="r")
    assert rr.shape == (k, n)
    np.testing.assert_allclose(np.abs(rr.full_tensor()), np.abs(np.linalg.qr(a, mode="r")),
                               atol=tol(dtype, 1e-10) * np.abs(a).max() * n)
    # 'raw': pXgeqrf's reflectors are LAPACK's geqrf's (signs and scaling), so h and
    # tau are NumPy's themselves, h laid out as A's transpose.
    h, tau = np.linalg.qr(da, mode="raw")
    wh, wtau = np.linalg.qr(a, mode="raw")
    assert h.shape == wh.shape and tau.shape == wtau.shape
    assert h.dtype == wh.dtype and tau.dtype == wtau.dtype
    assert all(p == R for p in tau.placements) and same_layout(h.mT, da)
    np.testing.assert_allclose(h.full_tensor(), wh, rtol=0,
                               atol=tol(dtype, 1e-12) * 10 * max(1.0, np.abs(wh).max()))
    np.testing.assert_allclose(tau.full_tensor(), wtau, rtol=0, atol=tol(dtype, 1e-12) * 10)


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_qr_placements_follow_a(layout):
    """Q and R are laid out on A's grid: A's placements when A is on one."""
    n = 2 * P + 1
    da = dist(matrix((n, n + 2), np.float64), layout)
    q, r = np.linalg.qr(da)
    assert same_layout(q, da) and same_layout(r, da)


def test_qr_raw_of_a_stack_one_call_per_matrix():
    """'raw' of a stack with sharded matrix dims: NumPy's h (each matrix's factored
    A transposed) and tau, no gather."""
    a = np.stack([matrix((2 * P + 1, P + 2), np.float64, seed=s) for s in range(2)])
    da = distribute_tensor(a, init_device_mesh("cpu", (P,)), [Shard(1)])
    h, tau = np.linalg.qr(da, mode="raw")
    wh, wtau = np.linalg.qr(a, mode="raw")
    np.testing.assert_allclose(h.full_tensor(), wh, rtol=0, atol=1e-12 * np.abs(wh).max())
    np.testing.assert_allclose(tau.full_tensor(), wtau, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_svd_and_svdvals(layout, shape, dtype):
    a = matrix(shape, dtype, seed=1)
    da = dist(a, layout)
    m, n = shape
    k = min(m, n)
    want = np.linalg.svd(a.astype(np.complex128 if np.dtype(dtype).kind == "c"
                                  else np.float64), compute_uv=False)
    bound = tol(dtype, 1e-10) * want.max()
    u, s, vh = np.linalg.svd(da, full_matrices=False)
    assert u.shape == (m, k) and s.shape == (k,) and vh.shape == (k, n)
    assert all(p == R for p in s.placements)
    assert same_layout(u, da) and same_layout(vh, da)
    sf, uf, vf = s.full_tensor(), u.full_tensor(), vh.full_tensor()
    assert sf.dtype == np.finfo(dtype).dtype and np.all(np.diff(sf) <= 0)
    assert np.abs(sf - want).max() <= bound
    assert np.linalg.norm(a - (uf * sf) @ vf) <= tol(dtype) * 10 * np.linalg.norm(a)
    assert np.linalg.norm(uf.conj().T @ uf - np.eye(k)) <= tol(dtype) * 10 * k
    assert np.linalg.norm(vf @ vf.conj().T - np.eye(k)) <= tol(dtype) * 10 * k
    assert np.abs(np.linalg.svd(da, compute_uv=False).full_tensor() - want).max() <= bound
    if hasattr(np.linalg, "svdvals"):
        assert np.abs(np.linalg.svdvals(da).full_tensor() - want).max() <= bound
    # full_matrices=True (NumPy's default): U m x m and Vh n x n, the columns past
    # k an orthonormal basis of the rest of the space (a wide A's through A^H).
    u2, s2, vh2 = np.linalg.svd(da)
    assert u2.shape == (m, m) and vh2.shape == (n, n)
    assert same_layout(u2, da) and same_layout(vh2, da)
    uf, sf, vf = u2.full_tensor(), s2.full_tensor(), vh2.full_tensor()
    assert np.abs(sf - want).max() <= bound
    assert np.linalg.norm(a - (uf[:, :k] * sf) @ vf[:k]) <= tol(dtype) * 10 * np.linalg.norm(a)
    assert np.linalg.norm(uf.conj().T @ uf - np.eye(m)) <= tol(dtype) * 10 * m
    assert np.linalg.norm(vf @ vf.conj().T - np.eye(n)) <= tol(dtype) * 10 * n


def lstsq_case(m, n, rank, k, seed):
    """An m x n matrix of the given rank and a right-hand side of k columns (a
    vector when k is 0)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, rank)) @ rng.standard_normal((rank, n))
    b = rng.standard_normal((m, k) if k else m)
    return a, b


@pytest.mark.parametrize("dtype", [np.float64, np.complex128], ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("k", [0, 2])
@pytest.mark.parametrize("case", ["square", "wide", "deficient", "tall"])
@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_lstsq_as_numpy(layout, case, k, dtype):
    n = 2 * P + 2
    m, cols, rank = {"square": (n, n, n), "wide": (P + 1, n, P + 1),
                     "deficient": (n, n, n - 2), "tall": (n + 1, n, n)}[case]
    a, b = lstsq_case(m, cols, rank, k, seed=3)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * lstsq_case(m, cols, rank, k, seed=4)[0]
    da = dist(a, layout)
    db = distribute_tensor(b, da.device_mesh, [R] * da.device_mesh.ndim)
    x, res, r, s = np.linalg.lstsq(da, db, rcond=None)
    wx, wres, wr, ws = np.linalg.lstsq(a, b, rcond=None)
    assert r == wr and type(r) is type(wr)  # NumPy's integer type, np.int32
    assert x.dtype == wx.dtype and res.dtype == wres.dtype and s.dtype == ws.dtype
    assert x.shape == wx.shape and res.shape == wres.shape and s.shape == ws.shape
    np.testing.assert_allclose(s.full_tensor(), ws, rtol=0, atol=1e-10 * ws.max())
    np.testing.assert_allclose(x.full_tensor(), wx, rtol=0,
                               atol=1e-9 * max(1.0, np.abs(wx).max()))
    np.testing.assert_allclose(res.full_tensor(), wres, rtol=1e-9, atol=1e-12)
    for t in (x, res, s):
        assert all(p == R for p in t.placements)


def test_lstsq_rcond_cuts_small_singular_values():
    """A singular value under rcond times the largest counts as zero, as NumPy's."""
    n = 2 * P + 2
    rng = np.random.default_rng(4)
    uq, _ = np.linalg.qr(rng.standard_normal((n, n)))
    vq, _ = np.linalg.qr(rng.standard_normal((n, n)))
    sv = np.logspace(0, -8, n)
    a = (uq * sv) @ vq.T
    b = rng.standard_normal(n)
    da = dist(a, ((P,), [S0]))
    db = distribute_tensor(b, da.device_mesh, [R])
    x, _, r, _ = np.linalg.lstsq(da, db, rcond=1e-5)
    wx, _, wr, _ = np.linalg.lstsq(a, b, rcond=1e-5)
    assert r == wr < n
    np.testing.assert_allclose(x.full_tensor(), wx, atol=1e-8 * np.abs(wx).max())


@pytest.mark.parametrize("dtype", [np.float32, np.complex64], ids=lambda t: np.dtype(t).name)
def test_lstsq_single_precision(dtype):
    """float32 and complex64 compute in their own precision, as NumPy's."""
    m, n = P + 2, 2 * P + 3
    a, b = matrix((m, n), dtype, seed=5), matrix((m, 2), dtype, seed=6)
    da = dist(a, ((P,), [S1]))
    x, res, r, s = np.linalg.lstsq(da, distribute_tensor(b, da.device_mesh, [R]))
    wx, wres, wr, ws = np.linalg.lstsq(a, b)
    assert x.dtype == wx.dtype and s.dtype == ws.dtype and r == wr
    np.testing.assert_allclose(x.full_tensor(), wx, atol=1e3 * np.finfo(dtype).eps * np.abs(wx).max())


def test_integers_and_non_contiguous_locals():
    """An integer matrix factors as float64, as NumPy's; a DTensor whose locals are
    views (a transpose) is read as the matrix it is."""
    n = 2 * P + 1
    ai = np.random.default_rng(7).integers(-5, 5, (n, n + 1))
    mesh = init_device_mesh("cpu", (P,))
    di = distribute_tensor(ai, mesh, [S0])
    q, r = np.linalg.qr(di)
    assert q.dtype == np.float64
    assert np.linalg.norm(q.full_tensor() @ r.full_tensor() - ai) <= 1e-12 * np.linalg.norm(ai)
    a = matrix((n + 1, n), np.float64, seed=8)
    dt = distribute_tensor(a.T.copy(), mesh, [S0]).T  # A, columns sharded, views
    want = np.linalg.svd(a, compute_uv=False)
    got = np.linalg.svd(dt, compute_uv=False).full_tensor()
    assert np.abs(got - want).max() <= 1e-10 * want.max()


def test_stacks_one_call_per_matrix():
    """A stack with its matrix dims sharded: each matrix factored where it lies,
    the batch replicated; the factors keep the matrix dims' placements."""
    k, m, n = 3, 2 * P + 1, P + 3
    a = np.stack([matrix((m, n), np.float64, seed=s) for s in range(k)])
    mesh = init_device_mesh("cpu", (P,))
    da = distribute_tensor(a, mesh, [Shard(1)])
    q, r = np.linalg.qr(da)
    assert q.shape == (k, m, min(m, n)) and r.shape == (k, min(m, n), n)
    qf, rf = q.full_tensor(), r.full_tensor()
    assert np.linalg.norm(qf @ rf - a) <= 1e-12 * np.linalg.norm(a)
    u, s, vh = np.linalg.svd(da, full_matrices=False)
    want = np.linalg.svd(a, compute_uv=False)
    assert s.shape == want.shape and np.abs(s.full_tensor() - want).max() <= 1e-10 * want.max()
    uf, vf = u.full_tensor(), vh.full_tensor()
    assert np.linalg.norm((uf * s.full_tensor()[:, None, :]) @ vf - a) <= 1e-11 * np.linalg.norm(a)
    if P > 1:
        assert q.placements == (Shard(1),) and u.placements == (Shard(1),)
    sq = np.stack([matrix((m, m), np.complex128, seed=s) for s in range(k)])
    got = np.linalg.svd(distribute_tensor(sq, mesh, [Shard(2)]), compute_uv=False)
    want = np.linalg.svd(sq, compute_uv=False)
    assert np.abs(got.full_tensor() - want).max() <= 1e-10 * want.max()


def condition_37():
    """A 3 x 3 matrix of condition 3.7: well conditioned, and small enough that
    some process of a 2 x 2 grid holds one row or column of it."""
    q1, _ = np.linalg.qr(np.random.default_rng(5).standard_normal((3, 3)))
    q2, _ = np.linalg.qr(np.random.default_rng(6).standard_normal((3, 3)))
    return (q1 * [3.7, 2.0, 1.0]) @ q2


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_small_grids_converge(layout):
    """Grids on which a process would hold no row or column of the matrix, or one
    (pXgesvd did not converge there, or never returned), take a grid that fits or
    NumPy on one rank: NumPy's singular values, U laid out as A, and lstsq's
    solution, in every layout."""
    for a in (condition_37(), matrix((2, 2), np.float64, seed=1),
              matrix((1, 2), np.float64, seed=2), matrix((2, 1), np.float64, seed=3)):
        da = dist(a, layout)
        want = np.linalg.svd(a, compute_uv=False)
        for full in (False, True):
            u, s, vh = np.linalg.svd(da, full_matrices=full)
            uf, sf, vf = u.full_tensor(), s.full_tensor(), vh.full_tensor()
            np.testing.assert_allclose(sf, want, rtol=1e-12)
            k = len(sf)
            assert np.linalg.norm((uf[:, :k] * sf) @ vf[:k] - a) <= 1e-12 * np.linalg.norm(a)
            assert same_layout(u, da)  # Vh too, but TSQR's, Replicate, on a tall one
        np.testing.assert_allclose(np.linalg.svd(da, compute_uv=False).full_tensor(), want,
                                   rtol=1e-12)
        b = np.arange(1.0, a.shape[0] + 1)
        x, res, rank, sv = np.linalg.lstsq(da, distribute_tensor(b, da.device_mesh,
                                                                  [R] * da.device_mesh.ndim))
        wx, wres, wrank, _ = np.linalg.lstsq(a, b)
        np.testing.assert_allclose(x.full_tensor(), wx, rtol=1e-12, atol=1e-14)
        assert rank == wrank and type(rank) is type(wrank)


@pytest.mark.parametrize("dim", [1, 2])
def test_small_stacks_sharded_on_a_matrix_dim(dim):
    """A (5, 2, 2) stack sharded on a matrix dim: blocks of one row or column, or
    none, at every P > 1; NumPy's singular values, on a 2-D mesh too."""
    a = np.stack([matrix((2, 2), np.float64, seed=s) for s in range(5)])
    want = np.linalg.svd(a, compute_uv=False)
    meshes = [((P,), [Shard(dim)])] + ([((2, 2), [Shard(dim), Shard(3 - dim)])]
                                       if P == 4 else [])
    for layout in meshes:
        da = dist(a, layout)
        np.testing.assert_allclose(np.linalg.svd(da, compute_uv=False).full_tensor(), want,
                                   rtol=1e-12)
        u, s, vh = np.linalg.svd(da)
        got = (u.full_tensor() * s.full_tensor()[:, None, :]) @ vh.full_tensor()
        assert np.linalg.norm(got - a) <= 1e-12 * np.linalg.norm(a)


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_svd_of_nan_raises_linalgerror_on_every_rank(layout):
    """NumPy's SVD fails on a NaN; so does this one, on every rank (the NaN lives in
    one rank's block), and the ranks go on together."""
    n = 2 * P + 1
    a = matrix((n, n + 1), np.float64)
    a[-1, -1] = np.nan
    da = dist(a, layout)
    with pytest.raises(np.linalg.LinAlgError, match="SVD did not converge"):
        np.linalg.svd(da, full_matrices=False)
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.lstsq(da, distribute_tensor(np.ones(n), da.device_mesh,
                                              [R] * da.device_mesh.ndim))
    ok = np.linalg.svd(dist(matrix((n, n), np.float64), layout), compute_uv=False)
    assert ok.shape == (n,)


@pytest.mark.skipif(P == 1, reason="a 1-rank mesh runs NumPy's LAPACK")
def test_comm_debug_mode_lists_each_call():
    n = 3 * P  # three rows a rank: a grid ScaLAPACK takes
    da = dist(matrix((n, n + 1), np.float64), ((P,), [S0]))
    b = distribute_tensor(np.ones(n), da.device_mesh, [R])
    calls = {"numpy.linalg.qr": lambda: np.linalg.qr(da),
             "numpy.linalg.svd": lambda: np.linalg.svd(da, full_matrices=False),
             "numpy.linalg.lstsq": lambda: np.linalg.lstsq(da, b)}
    for name, f in calls.items():
        with CommDebugMode() as comm_mode:
            f()
        listed = [op["name"] for op in
                  comm_mode.comm_module_operation_counts["Global"]["operations_list"]]
        # A small row-sharded matrix's SVD is the stacked R's (_small_linalg).
        engine = ": QR of each block" if name != "numpy.linalg.qr" else ": ScaLAPACK"
        assert any(engine in x for x in listed), (name, listed)


@pytest.mark.skipif(P == 1, reason="a 1-rank mesh runs NumPy's LAPACK")
def test_row_sharded_svd_above_the_small_size_keeps_scalapack(monkeypatch):
    """Past SVD_MAX_ELEMENTS a row-sharded SVD is pXgesvd's, which never holds the
    matrix on one rank: the same answers."""
    monkeypatch.setattr(_small_linalg, "SVD_MAX_ELEMENTS", 1)
    n = 2 * P + 1
    a = matrix((n, n + 2), np.float64, seed=3)
    da = dist(a, ((P,), [S0]))
    with CommDebugMode() as comm_mode:
        u, s, vh = np.linalg.svd(da, full_matrices=False)
    listed = [op["name"] for op in
              comm_mode.comm_module_operation_counts["Global"]["operations_list"]]
    assert any(": ScaLAPACK" in x for x in listed), listed
    want = np.linalg.svd(a, compute_uv=False)
    assert np.abs(s.full_tensor() - want).max() <= 1e-10 * want.max()
    uf, vf = u.full_tensor(), vh.full_tensor()
    assert np.linalg.norm(a - (uf * s.full_tensor()) @ vf) <= 1e-11 * np.linalg.norm(a)


@pytest.mark.skipif(P == 1, reason="a 1-rank mesh runs NumPy's LAPACK")
@pytest.mark.parametrize("case", [((P,), [S0], (257 * P + 3, 300), np.complex128),
                                  ((P,), [S1], (300, 257 * P + 3), np.float32)] +
                         ([((2, 2), [S0, S1], (1, 9), np.float64),
                           ((2, 2), [S0, S1], (9, 1), np.complex128)] if P == 4 else []),
                         ids=str)
def test_factors_through_the_block_cyclic_copy(case):
    """QR and SVD whose factors come back from the block-cyclic copy into blocks
    of other shapes than A's (csrc/linalg/scalapack_exchange.c): row blocks too
    large to take as they lie, and 2-D grids with a rank holding no rows or no
    columns."""
    mesh_shape, placements, shape, dtype = case
    a = matrix(shape, dtype, seed=4)
    da = dist(a, (mesh_shape, placements))
    m, n = shape
    t = 50 * max(m, n) * float(np.finfo(dtype).eps) * np.linalg.norm(a)
    q, r = np.linalg.qr(da, mode="complete")
    assert same_layout(q, da) and same_layout(r, da)
    qf, rf = q.full_tensor(), r.full_tensor()
    assert np.linalg.norm(qf @ rf - a) < t and np.all(np.tril(rf, -1) == 0)
    u, s, vh = np.linalg.svd(da, full_matrices=False)
    uf, sf, vf = u.full_tensor(), s.full_tensor(), vh.full_tensor()
    assert np.linalg.norm((uf * sf) @ vf - a) < t
    np.testing.assert_allclose(sf, np.linalg.svd(a, compute_uv=False), atol=t)
