"""np.linalg on TSQR: qr, svd, svdvals, lstsq, matrix_rank, pinv, norm
and cond of tall DTensors whose rows are sharded on one mesh dim, compared with
NumPy on the gathered matrix: ||A - QR|| / ||A|| and ||Q^H Q - I|| within 1e-12 in
float64 (up to a condition number of 1e12), singular values to 1e-10 of the
largest; float32, float64, complex64 and complex128; uneven shards, blocks shorter
than the matrix is wide (and a rank without rows), which take the replicated path
and are still NumPy's answer; a 1-rank mesh, 2-D meshes, non-contiguous locals.
Only the tree's triangles move: CommDebugMode sees one all_reduce per TSQR and no
all-gather. Run under mpiexec at 1 to 4 ranks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import (DTensor, DeviceMesh, GatherWarning, Replicate, Shard, _comm, _lapack,
                       distribute_tensor)
from mpitensor._bind.core import chunk_sizes
from mpitensor.debug import CommDebugMode
from mpitensor.device_mesh import init_device_mesh

COMM = MPI.COMM_WORLD
P = COMM.size
R, S0 = Replicate(), Shard(0)
DTYPES = (np.float32, np.float64, np.complex64, np.complex128)
# The bound on ||A - QR|| / ||A|| and ||Q^H Q - I|| per real precision.
TOL = {np.float32: 2e-5, np.float64: 1e-12}


def tol(dtype):
    return TOL[np.finfo(dtype).dtype.type]


def matrix(m, n, dtype, seed=0, cond=None):
    """An m x n matrix of ``dtype``, with condition number ``cond`` when given."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal((m, n))
    if cond is not None:
        u, _, vh = np.linalg.svd(a, full_matrices=False)
        a = (u * np.logspace(0, -np.log10(cond), n)) @ vh
    return a.astype(dtype)


def meshes():
    """(mesh, placements sharding the rows on one dim) of every mesh of the test."""
    out = [(init_device_mesh("cpu", (P,)), [S0])]
    if P % 2 == 0:
        two = init_device_mesh("cpu", (2, P // 2))
        out += [(two, [S0, R]), (two, [R, S0])]
    return out


def one_rank_mesh():
    return DeviceMesh("cpu", [0], comm=MPI.COMM_SELF)


def check_qr(a, q, r, dtype, replicated_r=True):
    whole_q, whole_r = q.full_tensor(), r.full_tensor()
    n = a.shape[1]
    assert whole_q.dtype == np.dtype(dtype) and whole_r.dtype == np.dtype(dtype)
    assert whole_q.shape == a.shape and whole_r.shape == (n, n)
    assert np.array_equal(whole_r, np.triu(whole_r))
    assert np.linalg.norm(a - whole_q @ whole_r) <= tol(dtype) * np.linalg.norm(a)
    assert np.linalg.norm(whole_q.conj().T @ whole_q - np.eye(n)) <= tol(dtype)
    if not replicated_r:
        return
    # R is Replicate: the very same triangle on every rank
    same = COMM.allgather(r.to_local().tobytes())
    assert all(x == same[0] for x in same)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("shape", [(40, 5), (97, 3), (33, 1), (64, 16)], ids=str)
def test_qr_matches_numpy_on_every_mesh(dtype, shape):
    a = matrix(*shape, dtype, seed=sum(shape))
    for mesh, pls in meshes():
        dt = distribute_tensor(a, mesh, pls)
        with CommDebugMode() as comm_mode:
            q, r = np.linalg.qr(dt)
        check_qr(a, q, r, dtype)
        assert q.placements == tuple(pls) and r.placements == (R,) * mesh.ndim
        counts = comm_mode.get_comm_counts()
        assert "all_gather_into_tensor" not in counts
        sharded = mesh.shape[[p == S0 for p in pls].index(True)] > 1
        assert counts == ({"all_reduce": 1} if sharded else {})
        listed = [op["name"] for op in
                  comm_mode.comm_module_operation_counts["Global"]["operations_list"]]
        assert any(name.startswith("numpy.linalg.qr: TSQR") for name in listed), listed
        only_r = np.linalg.qr(dt, mode="r")
        assert np.array_equal(only_r.full_tensor(), r.full_tensor())


@pytest.mark.parametrize("dtype", [np.float32, np.complex128], ids=lambda t: np.dtype(t).name)
def test_blocks_of_several_cache_chunks(dtype):
    # Every rank's block spans several of the chunks its leaf factors one at a time
    # (csrc/linalg/tsqr.c, chunking), the last of them short; Q and U come from
    # every chunk's reflectors.
    a = matrix(2100 * P + 1, 64, dtype, seed=3)
    dt = distribute_tensor(a, init_device_mesh("cpu", (P,)), [S0])
    q, r = np.linalg.qr(dt)
    check_qr(a, q, r, dtype)
    u, s, vh = np.linalg.svd(dt, full_matrices=False)
    assert np.allclose(s.full_tensor(), np.linalg.svd(a, compute_uv=False), rtol=tol(dtype))
    whole = (u.full_tensor() * s.full_tensor()) @ vh.full_tensor()
    assert np.linalg.norm(a - whole) <= tol(dtype) * np.linalg.norm(a)


@pytest.mark.parametrize("cond", [1e4, 1e8, 1e12])
def test_qr_of_ill_conditioned_matrices(cond):
    a = matrix(300, 12, np.float64, seed=7, cond=cond)
    mesh = init_device_mesh("cpu", (P,))
    q, r = np.linalg.qr(distribute_tensor(a, mesh, [S0]))
    check_qr(a, q, r, np.float64)


def test_uneven_and_short_blocks_are_numpys_answer():
    # blocks of 4, ..., 4, 3 rows for 4 columns: one is shorter than wide, and
    # a 5-row matrix on 4 ranks leaves one rank without rows
    mesh = init_device_mesh("cpu", (P,))
    shapes = [(5, 1), (5, 2), (4 * P + 3, 4)] + ([(4 * P - 1, 4)] if P > 1 else [])
    for m, n in shapes:
        a = matrix(m, n, np.float64, seed=m)
        dt = distribute_tensor(a, mesh, [S0])
        q, r = np.linalg.qr(dt)
        # A block shorter than wide is ScaLAPACK's, whose R is laid out as A.
        tall = m > n and min(chunk_sizes(m, P)) >= n
        check_qr(a, q, r, np.float64, replicated_r=tall or P == 1)
        s = np.linalg.svdvals(dt).full_tensor()
        np.testing.assert_allclose(s, np.linalg.svdvals(a), rtol=1e-10)
    if P > 1:
        assert min(chunk_sizes(4 * P - 1, P)) < 4  # the short block was there


def test_one_rank_mesh():
    a = matrix(30, 4, np.float64, seed=3)
    dt = distribute_tensor(a, one_rank_mesh(), [S0])
    q, r = np.linalg.qr(dt)
    check_qr(a, q, r, np.float64)


def test_non_contiguous_locals():
    mesh = init_device_mesh("cpu", (P,))
    m, n = 12 * P, 3
    a = matrix(m, 2 * n, np.float64, seed=11)
    rows = chunk_sizes(m, P)
    start = sum(rows[:COMM.rank])
    local = a[start:start + rows[COMM.rank], ::2]  # a strided view
    assert not local.flags.c_contiguous
    dt = DTensor.from_local(local, mesh, [S0], shape=(m, n), stride=(n, 1))
    q, r = np.linalg.qr(dt)
    check_qr(a[:, ::2], q, r, np.float64)
    np.testing.assert_allclose(np.linalg.svdvals(dt).full_tensor(),
                               np.linalg.svdvals(a[:, ::2]), rtol=1e-10)


def test_qr_modes_past_tsqr_are_scalapacks_without_a_gather():
    # 'complete' (an m x m Q) and 'raw' (geqrf's reflectors of the whole matrix)
    # have no TSQR form: ScaLAPACK's pXgeqrf gives them, nothing gathered.
    a = matrix(10 * P, 3, np.float64, seed=5)
    dt = distribute_tensor(a, init_device_mesh("cpu", (P,)), [S0])
    with CommDebugMode() as comm_mode:
        q, r = np.linalg.qr(dt, mode="complete")
        h, tau = np.linalg.qr(dt, mode="raw")
    assert "all_gather_into_tensor" not in comm_mode.get_comm_counts()
    assert q.shape == (10 * P, 10 * P) and r.shape == (10 * P, 3)
    np.testing.assert_allclose(q.full_tensor() @ r.full_tensor(), a, atol=1e-12)
    want_h, want_tau = np.linalg.qr(a, mode="raw")
    assert h.placements == ((Shard(1),) if P > 1 else (R,)) and tau.placements == (R,)
    np.testing.assert_allclose(h.full_tensor(), want_h, rtol=0, atol=1e-12)
    np.testing.assert_allclose(tau.full_tensor(), want_tau, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_svd_and_svdvals(dtype):
    a = matrix(25 * P + 3, 6, dtype, seed=2)
    real = np.finfo(dtype).dtype
    rtol = 1e-10 if real == np.float64 else 1e-4
    want = np.linalg.svd(a, compute_uv=False)
    for mesh, pls in meshes():
        dt = distribute_tensor(a, mesh, pls)
        u, s, vh = np.linalg.svd(dt, full_matrices=False)
        assert u.placements == tuple(pls) and s.placements == vh.placements == (R,) * mesh.ndim
        whole_u, whole_s, whole_vh = u.full_tensor(), s.full_tensor(), vh.full_tensor()
        assert whole_s.dtype == real and whole_u.dtype == np.dtype(dtype)
        np.testing.assert_allclose(whole_s, want, rtol=rtol)
        assert np.linalg.norm((whole_u * whole_s) @ whole_vh - a) <= tol(dtype) * 10 * np.linalg.norm(a)
        assert np.linalg.norm(whole_u.conj().T @ whole_u - np.eye(6)) <= tol(dtype) * 10
        np.testing.assert_allclose(np.linalg.svd(dt, compute_uv=False).full_tensor(), want,
                                   rtol=rtol)
        np.testing.assert_allclose(np.linalg.svdvals(dt).full_tensor(), want, rtol=rtol)


def test_singular_values_of_an_ill_conditioned_matrix():
    a = matrix(200, 10, np.float64, seed=9, cond=1e12)
    dt = distribute_tensor(a, init_device_mesh("cpu", (P,)), [S0])
    s, want = np.linalg.svdvals(dt).full_tensor(), np.linalg.svdvals(a)
    assert np.abs(s - want).max() <= 1e-10 * want[0]
    assert float(np.linalg.cond(dt)) == pytest.approx(np.linalg.cond(a), rel=1e-3)


@pytest.mark.parametrize("dtype", [np.float32, np.complex128], ids=lambda t: np.dtype(t).name)
def test_svd_with_full_matrices_completes_u_without_a_gather(dtype):
    # NumPy's default full_matrices=True: the m x m U of ScaLAPACK's SVD, its
    # columns past n completing an orthonormal basis; laid out as A.
    m, n = 6 * P + 1, 2
    a = matrix(m, n, dtype, seed=4)
    for mesh, pls in meshes() + [(one_rank_mesh(), [S0])]:
        dt = distribute_tensor(a, mesh, pls)
        with CommDebugMode() as comm_mode:
            u, s, vh = np.linalg.svd(dt)
        assert "all_gather_into_tensor" not in comm_mode.get_comm_counts()
        assert u.shape == (m, m) and vh.shape == (n, n) and u.dtype == np.dtype(dtype)
        uf, sf, vf = u.full_tensor(), s.full_tensor(), vh.full_tensor()
        np.testing.assert_allclose(sf, np.linalg.svdvals(a), rtol=10 * tol(dtype))
        assert np.linalg.norm((uf[:, :n] * sf) @ vf - a) <= 10 * tol(dtype) * np.linalg.norm(a)
        assert np.linalg.norm(uf.conj().T @ uf - np.eye(m)) <= 10 * tol(dtype) * m
        assert np.linalg.norm(vf @ vf.conj().T - np.eye(n)) <= 10 * tol(dtype) * n


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
def test_lstsq_full_rank(dtype):
    m, n = 20 * P + 1, 4
    a = matrix(m, n, dtype, seed=12)
    real = np.finfo(dtype).dtype
    rtol = 1e-10 if real == np.float64 else 1e-3
    for rhs in [(m,), (m, 3)]:
        b = matrix(*(rhs if len(rhs) == 2 else (m, 1)), dtype, seed=13).reshape(rhs)
        want = np.linalg.lstsq(a, b)
        for mesh, pls in meshes():
            got = np.linalg.lstsq(distribute_tensor(a, mesh, pls),
                                  distribute_tensor(b, mesh, pls))
            x, res, rank, s = got
            assert x.placements == (R,) * mesh.ndim
            assert rank == want[2] == n
            np.testing.assert_allclose(x.full_tensor(), want[0], rtol=rtol, atol=rtol)
            assert res.full_tensor().shape == want[1].shape
            np.testing.assert_allclose(res.full_tensor(), want[1], rtol=rtol * 10)
            np.testing.assert_allclose(s.full_tensor(), want[3], rtol=rtol)


def test_lstsq_rank_deficient_and_rcond():
    m = 15 * P + 2
    a = matrix(m, 4, np.float64, seed=21)
    a[:, 3] = a[:, 0] + a[:, 1]
    b = matrix(m, 1, np.float64, seed=22)[:, 0]
    mesh = init_device_mesh("cpu", (P,))
    da, db = distribute_tensor(a, mesh, [S0]), distribute_tensor(b, mesh, [S0])
    x, res, rank, s = np.linalg.lstsq(da, db)
    want = np.linalg.lstsq(a, b)
    assert rank == want[2] == 3
    assert res.full_tensor().shape == (0,)
    np.testing.assert_allclose(x.full_tensor(), want[0], rtol=1e-9, atol=1e-9)
    # a cutoff above the second largest singular value keeps one
    cut = want[3][1] / want[3][0] * 1.01
    x, _, rank, _ = np.linalg.lstsq(da, db, rcond=cut)
    want = np.linalg.lstsq(a, b, rcond=cut)
    assert rank == want[2] == 1
    np.testing.assert_allclose(x.full_tensor(), want[0], rtol=1e-9, atol=1e-9)
    # b replicated: laid out as a's rows first, the same answer
    x, _, _, _ = np.linalg.lstsq(da, distribute_tensor(b, mesh, [R]))
    np.testing.assert_allclose(x.full_tensor(), np.linalg.lstsq(a, b)[0], rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex128],
                         ids=lambda t: np.dtype(t).name)
def test_lstsq_of_an_ndarray_b_without_a_gather(dtype):
    # b an ndarray, the same on every rank: each rank keeps its rows of it, so
    # TSQR of [A | b] moves triangles alone. Single precision computes in double,
    # as NumPy's, so even a float32 rank-deficient A gets NumPy's rank and x.
    m = 9 * P + 2
    rng = np.random.default_rng(71)
    for rank in (3, 2):
        a = (rng.standard_normal((m, rank)) @ rng.standard_normal((rank, 3))).astype(dtype)
        b = rng.standard_normal((m, 2)).astype(dtype)
        want = np.linalg.lstsq(a, b)
        for mesh, pls in meshes() + [(one_rank_mesh(), [S0])]:
            with CommDebugMode() as comm_mode:
                x, res, r, s = np.linalg.lstsq(distribute_tensor(a, mesh, pls), b)
            assert "all_gather_into_tensor" not in comm_mode.get_comm_counts()
            assert r == want[2] and x.dtype == want[0].dtype and s.dtype == want[3].dtype
            assert res.dtype == want[1].dtype and res.shape == want[1].shape
            rtol = 1e-9 if np.finfo(dtype).dtype == np.float64 else 1e-4
            np.testing.assert_allclose(x.full_tensor(), want[0], rtol=rtol, atol=rtol)
            np.testing.assert_allclose(res.full_tensor(), want[1], rtol=rtol)
            np.testing.assert_allclose(s.full_tensor(), want[3], rtol=rtol, atol=rtol)
    # uneven rows (a rank with none at P = 4) and columns sharded: ScaLAPACK's path,
    # the ndarray b taken as a Replicate DTensor, no gather of A
    a = matrix(P + 1, 3, np.float64, seed=72)
    b = np.arange(P + 1.0)
    for pls in ([S0], [Shard(1)]):
        x, res, r, s = np.linalg.lstsq(distribute_tensor(a, init_device_mesh("cpu", (P,)), pls), b)
        want = np.linalg.lstsq(a, b)
        assert r == want[2] and res.shape == want[1].shape
        np.testing.assert_allclose(x.full_tensor(), want[0], rtol=1e-9, atol=1e-12)


def test_matrix_rank_pinv_norm_cond():
    m = 18 * P + 5
    a = matrix(m, 5, np.float64, seed=31)
    low = a.copy()
    low[:, 4] = 2 * low[:, 2]
    for mesh, pls in meshes():
        dt, dlow = distribute_tensor(a, mesh, pls), distribute_tensor(low, mesh, pls)
        assert int(np.linalg.matrix_rank(dt)) == np.linalg.matrix_rank(a) == 5
        assert int(np.linalg.matrix_rank(dlow)) == np.linalg.matrix_rank(low) == 4
        assert int(np.linalg.matrix_rank(dt, tol=1e9)) == 0
        for x, w in [(dt, a), (dlow, low)]:
            p = np.linalg.pinv(x)
            assert p.shape == (5, m)
            assert p.placements == tuple(Shard(1) if q == S0 else q for q in pls)
            np.testing.assert_allclose(p.full_tensor(), np.linalg.pinv(w), rtol=1e-9,
                                       atol=1e-12)
        for order in (2, -2, "nuc"):
            got = np.linalg.norm(dt, order)
            assert got.placements == (R,) * mesh.ndim
            assert float(got.full_tensor()) == pytest.approx(np.linalg.norm(a, order),
                                                             rel=1e-12)
        for p_ in (None, 2, -2):
            assert float(np.linalg.cond(dt, p_)) == pytest.approx(np.linalg.cond(a, p_),
                                                                  rel=1e-10)
        assert float(np.linalg.cond(dlow)) > 1e12


def test_norms_without_singular_values_keep_their_rule():
    a = matrix(9 * P, 3, np.float64, seed=41)
    dt = distribute_tensor(a, init_device_mesh("cpu", (P,)), [S0])
    for order in (None, "fro", 1, np.inf):
        np.testing.assert_allclose(float(np.linalg.norm(dt, order).full_tensor()),
                                   np.linalg.norm(a, order), rtol=1e-12)


def test_wide_and_column_sharded_matrices_are_numpys():
    mesh = init_device_mesh("cpu", (P,))
    wide = matrix(3, 8 * P, np.float64, seed=51)
    q, r = np.linalg.qr(distribute_tensor(wide, mesh, [Shard(1)]))
    np.testing.assert_allclose(q.full_tensor() @ r.full_tensor(), wide, atol=1e-12)
    tall = matrix(8 * P, 3, np.float64, seed=52)
    s = np.linalg.svdvals(distribute_tensor(tall, mesh, [Shard(1)]))
    np.testing.assert_allclose(s.full_tensor(), np.linalg.svdvals(tall), rtol=1e-10)


def test_integer_matrices_are_factored_in_float64():
    a = np.arange(12 * P * 2, dtype=np.int64).reshape(12 * P, 2) % 7
    dt = distribute_tensor(a, init_device_mesh("cpu", (P,)), [S0])
    q, r = np.linalg.qr(dt)
    assert q.dtype == np.float64
    np.testing.assert_allclose(q.full_tensor() @ r.full_tensor(), a, atol=1e-12)


def test_ranks_that_disagree_fail_together_and_the_next_call_pairs():
    # The C tree agrees on every rank's verdict before anything moves: one rank's
    # short block (or another column count) is the same ValueError everywhere.
    mesh = init_device_mesh("cpu", (P,))
    m = _comm.checked(mesh)
    last = COMM.rank == P - 1
    block = np.ones((2 if last else 6, 4))
    with pytest.raises(ValueError, match="at least as many rows as columns; this rank has 2 x 4"):
        _lapack.tsqr(m, 0, block, True)
    if P > 1:
        with pytest.raises(ValueError, match="different column counts"):
            _lapack.tsqr(m, 0, np.ones((8, 3 if last else 2)), False)
    a = matrix(9 * P, 3, np.float64, seed=61)
    q, r = np.linalg.qr(distribute_tensor(a, mesh, [S0]))
    check_qr(a, q, r, np.float64)


@pytest.mark.parametrize("m, n, k", [(20, 3, 6), (20, 3, None), (5, 8, 2), (3, 3, 4)])
@pytest.mark.parametrize("b_layout", [S0, R, Shard(1)], ids=str)
def test_lstsq_of_an_ndarray_matrix_and_dtensor_rhs(m, n, k, b_layout):
    """xarray's polyfit: lstsq(ndarray Vandermonde, DTensor series) runs on the
    DTensor engines (each rank keeps its rows of the matrix), NumPy's results, no
    gather."""
    if k is None and b_layout == Shard(1):
        pytest.skip("a vector has no second dim")
    rng = np.random.default_rng(m + n)
    a = rng.standard_normal((m, n))
    b = rng.standard_normal((m, k) if k else m)
    mesh = init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
    db = distribute_tensor(b, mesh, [b_layout])
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        got = np.linalg.lstsq(a, db, rcond=None)
    for g, e in zip(got, np.linalg.lstsq(a, b, rcond=None)):
        g = g.full_tensor() if isinstance(g, DTensor) else g
        assert np.shape(g) == np.shape(e) and np.asarray(g).dtype == np.asarray(e).dtype
        np.testing.assert_allclose(g, e, rtol=1e-10, atol=1e-10)
