"""np.linalg on ScaLAPACK: solve, inv, det, slogdet, cholesky, eigh and
eigvalsh of square DTensors sharded over one or two mesh dims, compared with NumPy
on the gathered matrix: eigenvalues to 1e-10 of the largest in float64, solve's,
inv's, cholesky's and eigh's residuals backward-stable (a small multiple of the
precision's epsilon times n); a singular matrix (solve, inv) or one that is not
positive definite (cholesky) raises numpy.linalg.LinAlgError on every rank.
float32, float64, complex64, complex128; uneven shards, a rank with no rows, a
1-rank mesh, 2-D meshes, non-contiguous locals, batches. Open MPI's pml
monitoring counts what a 512 x 512 solve, eigh, eigvalsh and svd send at np 2
(eigh and svd of that size on LAPACK, _small_linalg.py). Run under mpiexec at 1 to
4 ranks."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import DTensor, Replicate, Shard, distribute_tensor
from mpitensor._algorithms import _scalapack as engine
from mpitensor._algorithms import _small_linalg
from mpitensor._ops import _scalapack
from mpitensor._ops._fallback import GatherWarning
from mpitensor._algorithms._scalapack import scalapack_library
from mpitensor.debug import CommDebugMode
from mpitensor.device_mesh import init_device_mesh

sys.path.insert(0, os.path.dirname(__file__))
from mpi_helpers import run_job, run_script  # noqa: E402

COMM = MPI.COMM_WORLD
P = COMM.size
R, S0, S1 = Replicate(), Shard(0), Shard(1)
DTYPES = (np.float32, np.float64, np.complex64, np.complex128)

pytestmark = pytest.mark.skipif(scalapack_library() is None,
                                reason="ScaLAPACK (libscalapack-openmpi-dev) is not installed")


def eps(dtype) -> float:
    return float(np.finfo(dtype).eps)


def matrix(n, dtype, seed=0, spd=False):
    """A well-conditioned n x n matrix of ``dtype``; Hermitian positive definite
    with ``spd``."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal((n, n))
    if spd:
        return (a @ a.conj().T + n * np.eye(n)).astype(dtype)
    return (a + 2 * np.sqrt(n) * np.eye(n)).astype(dtype)


def layouts():
    """(mesh shape, placements) of the matrix: rows, columns, both, neither."""
    out = [((P,), [S0]), ((P,), [S1]), ((P,), [R])]
    if P == 4:
        out += [((2, 2), [S0, S1]), ((2, 2), [S1, S0]), ((2, 2), [S0, R]),
                ((2, 2), [R, S1])]
    if P >= 2:
        out += [((1, P), [S0, S1]), ((P, 1), [S1, S0])]
    return out


# Sizes: uneven shards, and a rank without rows (n < P).
SIZES = sorted({max(P - 1, 1), 2 * P + 1})


def dist(a, layout):
    mesh = init_device_mesh("cpu", layout[0])
    return distribute_tensor(a, mesh, layout[1])


def resid(a, x, b) -> float:
    """||A x - b|| / (||A|| ||x|| + ||b||): small for a backward-stable solve."""
    return float(np.linalg.norm(a @ x - b) /
                 (np.linalg.norm(a) * np.linalg.norm(x) + np.linalg.norm(b)))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_solve_matrix_and_vector(layout, n, dtype):
    a = matrix(n, dtype)
    rng = np.random.default_rng(1)
    b = rng.standard_normal((n, 3)).astype(dtype)
    da = dist(a, layout)
    mesh = da.device_mesh
    x = np.linalg.solve(da, distribute_tensor(b, mesh, [R] * mesh.ndim))
    assert type(x) is DTensor and x.shape == (n, 3) and x.dtype == np.dtype(dtype)
    assert resid(a, x.full_tensor(), b) < 20 * n * eps(dtype)
    v = np.linalg.solve(da, distribute_tensor(b[:, 0], mesh, [R] * mesh.ndim))
    assert v.shape == (n,) and resid(a, v.full_tensor(), b[:, 0]) < 20 * n * eps(dtype)
    # x keeps A's rows' placement (on the mesh dim that shards A's rows).
    rows = [m for m, p in enumerate(da.placements) if p == Shard(0) and mesh.shape[m] > 1]
    for m in rows:
        assert v.placements[m] == Shard(0)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_inv_det_slogdet(layout, dtype):
    n = 2 * P + 3
    a = matrix(n, dtype, seed=2)
    da = dist(a, layout)
    ai = np.linalg.inv(da)
    assert ai.placements == da.placements or all(isinstance(p, (Shard, Replicate))
                                                 for p in ai.placements)
    got = ai.full_tensor()
    assert got.dtype == np.dtype(dtype)
    assert np.linalg.norm(a @ got - np.eye(n)) < 50 * n * eps(dtype) * np.linalg.cond(a)
    d = np.linalg.det(da)
    assert d.shape == () and all(p == R for p in d.placements)
    np.testing.assert_allclose(d.full_tensor(), np.linalg.det(a), rtol=100 * n * eps(dtype))
    sign, logabs = np.linalg.slogdet(-da)
    want_sign, want_log = np.linalg.slogdet(-a)
    np.testing.assert_allclose(sign.full_tensor(), want_sign, rtol=100 * n * eps(dtype))
    np.testing.assert_allclose(logabs.full_tensor(), want_log, rtol=100 * n * eps(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_cholesky_lower_and_upper(layout, n, dtype):
    a = matrix(n, dtype, seed=3, spd=True)
    da = dist(a, layout)
    low = np.linalg.cholesky(da)
    assert low.shape == (n, n) and low.placements == da.placements
    got = low.full_tensor()
    assert np.array_equal(got, np.tril(got))
    np.testing.assert_allclose(got, np.linalg.cholesky(a), rtol=0,
                               atol=50 * n * eps(dtype) * np.sqrt(np.abs(a).max()))
    assert np.linalg.norm(got @ got.conj().T - a) < 50 * n * eps(dtype) * np.linalg.norm(a)
    if np.lib.NumpyVersion(np.__version__) >= "2.0.0":
        up = np.linalg.cholesky(da, upper=True).full_tensor()
        assert np.array_equal(up, np.triu(up))
        assert np.linalg.norm(up.conj().T @ up - a) < 50 * n * eps(dtype) * np.linalg.norm(a)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_eigh_and_eigvalsh(layout, n, dtype):
    a = matrix(n, dtype, seed=4, spd=True)
    a = a - 1.5 * n * np.eye(n, dtype=dtype)  # eigenvalues of both signs
    da = dist(a, layout)
    want = np.linalg.eigvalsh(a.astype(np.complex128 if np.dtype(dtype).kind == "c"
                                       else np.float64))
    # float64's bound is 1e-10 of the largest, as the docstring says; float32's its
    # precision's.
    tol = 1e-10 if np.finfo(dtype).dtype == np.float64 else 50 * n * eps(dtype)
    for uplo in ("L", "U"):
        w, v = np.linalg.eigh(da, UPLO=uplo)
        assert all(p == R for p in w.placements) and v.placements == da.placements
        wf, vf = w.full_tensor(), v.full_tensor()
        assert wf.dtype == np.finfo(dtype).dtype and np.all(np.diff(wf) >= 0)
        assert np.abs(wf - want).max() <= tol * np.abs(want).max()
        assert np.linalg.norm(a @ vf - vf * wf) < 50 * n * eps(dtype) * np.linalg.norm(a)
        assert np.linalg.norm(vf.conj().T @ vf - np.eye(n)) < 50 * n * eps(dtype)
        wv = np.linalg.eigvalsh(da, UPLO=uplo).full_tensor()
        assert np.abs(wv - want).max() <= tol * np.abs(want).max()


def test_uplo_reads_one_triangle():
    """UPLO="U" reads the upper triangle only, as NumPy's: garbage below is ignored."""
    n = 3 * P + 1
    a = matrix(n, np.float64, seed=5, spd=True)
    junk = np.triu(a) + np.tril(np.full((n, n), 7.0), -1)
    dj = dist(junk, ((P,), [S0]))
    np.testing.assert_allclose(np.linalg.eigvalsh(dj, UPLO="U").full_tensor(),
                               np.linalg.eigvalsh(a), rtol=1e-10, atol=1e-10 * n)


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_singular_one_by_one_raises_on_every_rank(layout):
    """A singular 1 x 1 matrix (a grid with empty blocks, whose pXgesv missed the
    zero pivot and gave inf): "Singular matrix" on every rank, as NumPy."""
    da = dist(np.zeros((1, 1)), layout)
    b = distribute_tensor(np.ones(1), da.device_mesh, [R] * da.device_mesh.ndim)
    for f in (lambda: np.linalg.solve(da, b), lambda: np.linalg.inv(da),
              lambda: np.linalg.solve(da, da)):
        with pytest.raises(np.linalg.LinAlgError, match="Singular matrix"):
            f()
    assert float(np.linalg.det(da).full_tensor()) == 0.0


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_singular_raises_linalgerror_on_every_rank(layout):
    n = 2 * P + 2
    a = matrix(n, np.float64, seed=6)
    # A zero row stays exactly zero through the elimination (its multipliers are
    # zero), so some pivot is exactly zero: singular in floating point too, as a
    # repeated column would not be.
    a[n // 2] = 0.0
    da = dist(a, layout)
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.inv(da)
    b = distribute_tensor(np.ones(n), da.device_mesh, [R] * da.device_mesh.ndim)
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.solve(da, b)
    # The ranks agree still: the next collective pairs.
    assert np.linalg.det(da).full_tensor() == pytest.approx(0.0, abs=1e-8)
    sign, logabs = np.linalg.slogdet(dist(np.zeros((n, n)), layout))
    assert float(sign.full_tensor()) == 0.0 and float(logabs.full_tensor()) == -np.inf


@pytest.mark.parametrize("layout", layouts(), ids=str)
def test_not_positive_definite_raises_on_every_rank(layout):
    n = 2 * P + 2
    a = matrix(n, np.float64, seed=7, spd=True)
    a[-1, -1] = -1.0
    da = dist(a, layout)
    with pytest.raises(np.linalg.LinAlgError, match="positive definite"):
        np.linalg.cholesky(da)
    assert np.linalg.cholesky(dist(matrix(n, np.float64, spd=True), layout)).shape == (n, n)


def test_non_contiguous_locals():
    """A DTensor whose locals are views (a transpose) is read as the matrix it is."""
    n = 3 * P + 2
    a = matrix(n, np.float64, seed=8)
    mesh = init_device_mesh("cpu", (P,))
    dt = distribute_tensor(a.T.copy(), mesh, [S0]).T  # A, columns sharded, views
    x = np.linalg.solve(dt, distribute_tensor(np.ones(n), mesh, [R]))
    assert resid(a, x.full_tensor(), np.ones(n)) < 20 * n * eps(np.float64)
    np.testing.assert_allclose(np.linalg.eigvalsh(dt + dt.T).full_tensor(),
                               np.linalg.eigvalsh(a + a.T), rtol=1e-10, atol=1e-10 * n)


def test_inputs_are_not_overwritten():
    """The drivers write their results into the blocks they are given: the DTensor
    passed in keeps its values, its C-ordered block being passed as it is where a
    driver only reads it."""
    n = P + 1 if P > 1 else 3
    a = matrix(n, np.float64, seed=9, spd=True)
    da = dist(a, ((P,), [S0]))
    calls = (np.linalg.inv, np.linalg.det, np.linalg.cholesky, np.linalg.eigh,
             np.linalg.eigvalsh, np.linalg.svd, lambda x: np.linalg.solve(x, np.ones(n)),
             lambda x: np.linalg.qr(x, mode="complete"), lambda x: np.linalg.qr(x, "raw"))
    for k, f in enumerate(calls):
        f(da)
        assert np.array_equal(da.full_tensor(), a), k


def test_batched():
    """A stack of matrices, each sharded: one ScaLAPACK call per matrix."""
    n, k = 2 * P + 1, 3
    a = np.stack([matrix(n, np.float64, seed=s) for s in range(k)])
    spd = np.stack([matrix(n, np.float64, seed=s, spd=True) for s in range(k)])
    b = np.random.default_rng(0).standard_normal((k, n, 2))
    mesh = init_device_mesh("cpu", (P,))
    da, ds = distribute_tensor(a, mesh, [Shard(1)]), distribute_tensor(spd, mesh, [Shard(2)])
    x = np.linalg.solve(da, distribute_tensor(b, mesh, [R])).full_tensor()
    np.testing.assert_allclose(x, np.linalg.solve(a, b), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.linalg.det(da).full_tensor(), np.linalg.det(a), rtol=1e-10)
    np.testing.assert_allclose(np.linalg.eigvalsh(ds).full_tensor(), np.linalg.eigvalsh(spd),
                               rtol=1e-10)
    np.testing.assert_allclose(np.linalg.inv(da).full_tensor(), np.linalg.inv(a),
                               rtol=1e-9, atol=1e-12)


def test_batch_sharded_stack_stays_local():
    """A stack sharded along its batch dim with whole matrices per rank runs NumPy's
    LAPACK on each rank's matrices: the results keep the batch's Shard."""
    k, n = 2 * P, 5
    spd = np.stack([matrix(n, np.float64, seed=s, spd=True) for s in range(k)])
    mesh = init_device_mesh("cpu", (P,))
    ds = distribute_tensor(spd, mesh, [S0])
    w = np.linalg.eigvalsh(ds)
    assert w.placements == (S0,) and w.shape == (k, n)
    np.testing.assert_allclose(w.full_tensor(), np.linalg.eigvalsh(spd), rtol=1e-12)
    c = np.linalg.cholesky(ds)
    assert c.placements == (S0,)
    np.testing.assert_allclose(c.full_tensor(), np.linalg.cholesky(spd), rtol=1e-12)


# ---- what moves: Open MPI's pml monitoring counts every byte a rank sends ----

_JOB = """
import sys
import numpy as np
import mpitensor as mt
from mpitensor import Shard, distribute_tensor
n = int(sys.argv[2])
mesh = mt.init_device_mesh("cpu", (2,))
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n)) + n * np.eye(n)
a = a + a.T
da = distribute_tensor(a, mesh, [Shard(0)])
db = distribute_tensor(rng.standard_normal(n), mesh, [Shard(0)])
if sys.argv[1] == "solve":
    np.linalg.solve(da, db)
elif sys.argv[1] == "eigh":
    np.linalg.eigh(da)
elif sys.argv[1] == "eigvalsh":
    np.linalg.eigvalsh(da)
elif sys.argv[1] == "svd":
    np.linalg.svd(da)
"""


@functools.cache
def _monitoring() -> bool:
    try:
        out = subprocess.run(["ompi_info"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return re.search(r"MCA pml: monitoring", out.stdout) is not None


@pytest.fixture
def monitoring():
    """Skips the test where Open MPI has no pml monitoring: asked of ompi_info once,
    when such a test runs, not by every rank of every pass as it collects."""
    if not _monitoring():
        pytest.skip("Open MPI without the pml monitoring")


def _bytes_sent(op: str, where: str, n: int = 512) -> int:
    """Bytes the two ranks of a fresh job on an n x n matrix send in all (point to
    point, which carries the collectives too), by the pml monitoring's profile
    files."""
    prefix = os.path.join(where, f"{op}{n}")
    script = os.path.join(where, "job.py")
    with open(script, "w") as f:
        f.write(_JOB)
    # Each test runs two such jobs, so each is killed whole with its ranks before
    # half the suite's per-test timeout.
    run = run_job(["mpiexec", "-n", "2", "--mca", "pml_monitoring_enable", "1",
                   "--mca", "pml_monitoring_enable_output", "3",
                   "--mca", "pml_monitoring_filename", prefix,
                   sys.executable, script, op, str(n)], 50)
    assert run.returncode == 0, run.stdout + run.stderr
    total = 0
    for rank in (0, 1):
        with open(f"{prefix}.{rank}.prof") as f:
            total += sum(int(m.group(1)) for m in
                         re.finditer(r"^E\t\d+\t\d+\t(\d+) bytes", f.read(), re.M))
    return total


_MATRIX_BYTES = 8 * 512 * 512


# A job stuck inside ScaLAPACK: the routing that keeps a 1 x 2 matrix cut by
# columns out of pdgesvd (where it never returns) is turned off, and the
# collective watchdog, which watches the ScaLAPACK routines mpitensor calls, must
# end the job within the timeout, each rank naming the routine and its stack.
_STUCK = """
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Shard
from mpitensor._algorithms import _scalapack
_scalapack.MIN_BLOCK = 0  # every grid to ScaLAPACK, as before the routing
mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
a = mt.distribute_tensor(np.array([[1.0, 2.0]]), mesh, [Shard(1)])
np.linalg.svd(a, full_matrices=False)
print("svd came back", flush=True)
"""


@pytest.mark.np(1)
def test_a_job_stuck_in_scalapack_ends_with_each_ranks_routine_and_stack():
    run = run_script(_STUCK, 3, 50, MPITENSOR_TIMEOUT="3")
    out = run.stdout + run.stderr
    assert run.returncode != 0 and "svd came back" not in out, out[-3000:]
    assert out.count("in ScaLAPACK's pdgesvd for") == 3, out[-3000:]
    assert out.count("MPITENSOR_TIMEOUT=3 seconds") == 3, out[-3000:]
    # Each rank's Python stack, down to the program's line.
    assert len(re.findall(r'job\.py", line 10 in <module>', out)) == 3, out[-3000:]


_AFTER_MKL = """
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Shard
from mpitensor.nn import _blas
assert _blas.provider() == "mkl", _blas.provider()
mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
rng = np.random.default_rng(0)
for dtype in (np.complex64, np.complex128):
    n = 6
    a = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    a = (a @ a.conj().T + n * np.eye(n)).astype(dtype)
    got = np.linalg.cholesky(mt.distribute_tensor(a, mesh, [Shard(0)])).full_tensor()
    tol = 1e-4 if dtype == np.complex64 else 1e-10
    ok = np.allclose(got, np.linalg.cholesky(a), atol=tol)
    print(f"{np.dtype(dtype).name} {ok}", flush=True)
"""


@pytest.mark.np(1)
@pytest.mark.skipif(not __import__("mpitensor")._clib.mkl_library("libmkl_rt.so"),
                    reason="the mkl package is not installed")
def test_complex_factorizations_after_the_kernels_loaded_mkl():
    """MKL loaded first (the nn kernels' BLAS, the default on Intel CPUs) puts its
    Fortran BLAS in the global namespace, with Intel's convention for functions
    that return a complex; Debian's ScaLAPACK, built with gfortran, must still call
    its own: a complex Cholesky crashed on every Intel machine."""
    run = run_script(_AFTER_MKL, 2, 60, MPITENSOR_BLAS="mkl")
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-3000:]
    assert out.count("complex64 True") == 2 and out.count("complex128 True") == 2, out[-3000:]


@pytest.mark.np(1)
@pytest.mark.usefixtures("monitoring")
def test_solve_512_sends_less_than_the_matrix():
    with tempfile.TemporaryDirectory() as where:
        setup = _bytes_sent("none", where)
        solve = _bytes_sent("solve", where)
    assert 0 < solve - setup < _MATRIX_BYTES, (setup, solve)


@pytest.mark.np(1)
@pytest.mark.usefixtures("monitoring")
def test_row_sharded_solve_sends_the_lu_panels_alone():
    """Rows of 512 per rank, too many to factor as they lie: A's rows, relabelled,
    are the LU's columns where they are (no block-cyclic copy, which would send
    half the matrix before the LU's panels, about half of it again)."""
    n = 1024
    with tempfile.TemporaryDirectory() as where:
        setup = _bytes_sent("none", where, n)
        solve = _bytes_sent("solve", where, n)
    assert 0 < solve - setup < 0.6 * 8 * n * n, (setup, solve)


@pytest.mark.np(1)
@pytest.mark.usefixtures("monitoring")
def test_eigh_512_sends_less_than_the_matrix():
    with tempfile.TemporaryDirectory() as where:
        setup = _bytes_sent("none", where)
        eigh = _bytes_sent("eigh", where)
    assert 0 < eigh - setup < _MATRIX_BYTES, (setup, eigh)


@pytest.mark.np(1)
@pytest.mark.usefixtures("monitoring")
def test_eigvalsh_512_sends_less_than_the_matrix():
    """Without eigenvectors only the tridiagonal reduction communicates: no
    eigenvector is computed, moved or transformed back."""
    with tempfile.TemporaryDirectory() as where:
        setup = _bytes_sent("none", where)
        eigvalsh = _bytes_sent("eigvalsh", where)
    assert 0 < eigvalsh - setup < _MATRIX_BYTES, (setup, eigvalsh)


@pytest.mark.np(1)
@pytest.mark.usefixtures("monitoring")
def test_svd_512_sends_less_than_the_matrix():
    with tempfile.TemporaryDirectory() as where:
        setup = _bytes_sent("none", where)
        svd = _bytes_sent("svd", where)
    assert 0 < svd - setup < _MATRIX_BYTES, (setup, svd)


@pytest.fixture
def no_scalapack(monkeypatch):
    """mpitensor as on a machine without ScaLAPACK: the library it is told to load
    does not exist."""
    monkeypatch.setenv("MPITENSOR_SCALAPACK", "/nonexistent/libscalapack.so")
    engine.load.cache_clear()
    yield
    monkeypatch.delenv("MPITENSOR_SCALAPACK")
    engine.load.cache_clear()


@pytest.mark.skipif(P == 1, reason="a 1-rank mesh runs NumPy's LAPACK")
def test_without_scalapack_every_rank_raises_naming_the_package(no_scalapack):
    n = 2 * P
    a = matrix(n, np.float64)
    da = dist(a, ((P,), [S0]))
    for f in (np.linalg.inv, np.linalg.eigh, np.linalg.cholesky):
        # MKL's is tried only when asked for, so the message says how to ask.
        with pytest.raises(RuntimeError,
                           match="libscalapack-openmpi-dev.*MPITENSOR_SCALAPACK=mkl"):
            f(da)
    # Replicated matrices are the small case: NumPy's LAPACK, no ScaLAPACK needed.
    np.testing.assert_allclose(np.linalg.inv(dist(a, ((P,), [R]))).full_tensor(),
                               np.linalg.inv(a))


@pytest.mark.skipif(P == 1, reason="a 1-rank mesh runs NumPy's LAPACK")
def test_without_scalapack_a_tall_matrix_still_gets_every_form(no_scalapack):
    """TSQR needs no ScaLAPACK; the forms it has none of (qr's 'complete' and
    'raw', svd's complete U) replicate a tall matrix rather than raise."""
    a = np.random.default_rng(3).standard_normal((6 * P, 2))
    da = dist(a, ((P,), [S0]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GatherWarning)
        h, tau = np.linalg.qr(da, mode="raw")
        q, r = np.linalg.qr(da, mode="complete")
        u, s, vh = np.linalg.svd(da)
    np.testing.assert_allclose(h.full_tensor(), np.linalg.qr(a, mode="raw")[0], atol=1e-12)
    assert q.shape == u.shape == (6 * P, 6 * P)
    np.testing.assert_allclose(q.full_tensor() @ r.full_tensor(), a, atol=1e-12)
    np.testing.assert_allclose(s.full_tensor(), np.linalg.svdvals(a), rtol=1e-12)


@pytest.mark.skipif(P == 1, reason="a 1-rank mesh runs NumPy's LAPACK")
def test_comm_debug_mode_lists_each_call():
    n = 3 * P  # every rank holds three rows: a grid ScaLAPACK takes
    a = matrix(n, np.float64, spd=True)
    da = dist(a, ((P,), [S0]))
    b = distribute_tensor(np.ones(n), da.device_mesh, [R])
    calls = {"numpy.linalg.solve": lambda: np.linalg.solve(da, b),
             "numpy.linalg.inv": lambda: np.linalg.inv(da),
             "numpy.linalg.det": lambda: np.linalg.det(da),
             "numpy.linalg.slogdet": lambda: np.linalg.slogdet(da),
             "numpy.linalg.cholesky": lambda: np.linalg.cholesky(da),
             "numpy.linalg.eigh": lambda: np.linalg.eigh(da),
             "numpy.linalg.eigvalsh": lambda: np.linalg.eigvalsh(da)}
    for name, f in calls.items():
        # A small row-sharded eigh runs on one rank's LAPACK (_small_linalg).
        engine = "LAPACK on one rank" if "eig" in name else "ScaLAPACK"
        with CommDebugMode() as comm_mode:
            f()
        listed = [op["name"] for op in
                  comm_mode.comm_module_operation_counts["Global"]["operations_list"]]
        assert any(x.startswith(f"{name}: {engine}") for x in listed), (name, listed)


def test_small_row_sharded_stack_eigh_on_one_rank():
    """A stack whose matrices' rows are sharded, small: each rank's rows of every
    eigenvector matrix come back laid out as A, the eigenvalues Replicate."""
    k, n = 3, 2 * P + 1
    a = np.stack([matrix(n, np.complex128, seed=s, spd=True) for s in range(k)])
    mesh = init_device_mesh("cpu", (P,))
    ds = distribute_tensor(a, mesh, [Shard(1)])
    for uplo in ("L", "U"):
        w, v = np.linalg.eigh(ds, UPLO=uplo)
        assert w.placements == (R,) and v.placements == (Shard(1),)
        want = np.linalg.eigvalsh(a)
        assert np.abs(w.full_tensor() - want).max() <= 1e-10 * np.abs(want).max()
        vf = v.full_tensor()
        resid = np.linalg.norm(a @ vf - vf * w.full_tensor()[:, None, :])
        assert resid < 50 * n * eps(np.float64) * np.linalg.norm(a)
        np.testing.assert_allclose(np.linalg.eigvalsh(ds, UPLO=uplo).full_tensor(), want,
                                   rtol=1e-10)


def test_lapack_failure_on_the_root_raises_on_every_rank(monkeypatch):
    """Only the root runs LAPACK: its LinAlgError is agreed, so every rank raises
    and the ranks go on together."""
    n = 2 * P + 1
    da = dist(matrix(n, np.float64, spd=True), ((P,), [S0]))

    def fails(*args, **kwargs):
        raise np.linalg.LinAlgError("Eigenvalues did not converge")

    with monkeypatch.context() as patch:
        patch.setattr(np.linalg, "eigh", fails)
        with pytest.raises(np.linalg.LinAlgError, match="did not converge"):
            _scalapack.eigh(da)
    assert np.linalg.eigvalsh(da).shape == (n,)


@pytest.mark.skipif(P == 1, reason="a 1-rank mesh runs NumPy's LAPACK")
def test_row_sharded_eigh_above_the_small_size_keeps_scalapack(monkeypatch):
    """Past EIGH_MAX_N a row-sharded eigh is ScaLAPACK's (pXsyevd on a P x 1
    grid), which never holds the matrix on one rank: the same answers."""
    monkeypatch.setattr(_small_linalg, "EIGH_MAX_N", 2)
    n = 3 * P  # three rows a rank: a grid ScaLAPACK takes
    a = matrix(n, np.float64, seed=12, spd=True)
    da = dist(a, ((P,), [S0]))
    with CommDebugMode() as comm_mode:
        w, v = np.linalg.eigh(da)
    listed = [op["name"] for op in
              comm_mode.comm_module_operation_counts["Global"]["operations_list"]]
    assert any(x.startswith("numpy.linalg.eigh: ScaLAPACK") for x in listed), listed
    want = np.linalg.eigvalsh(a)
    assert np.abs(w.full_tensor() - want).max() <= 1e-10 * want.max()
    vf = v.full_tensor()
    bound = 50 * n * eps(np.float64) * np.linalg.norm(a)
    assert np.linalg.norm(a @ vf - vf * w.full_tensor()) < bound


def test_layouts_no_grid_describes_are_laid_out_first():
    """A Partial matrix, and two mesh dims on one matrix dim, are first laid out as
    rows on the first mesh dim and columns on the second: NumPy's answer still."""
    from mpitensor import Partial
    n = 2 * P + 1
    a = matrix(n, np.float64, seed=10, spd=True)
    mesh = init_device_mesh("cpu", (P,))
    partial = DTensor.from_local(a / P, mesh, [Partial()])
    np.testing.assert_allclose(np.linalg.eigvalsh(partial).full_tensor(),
                               np.linalg.eigvalsh(a), rtol=1e-10)
    if P == 4:
        both = dist(a, ((2, 2), [S0, S0]))
        np.testing.assert_allclose(np.linalg.inv(both).full_tensor(), np.linalg.inv(a),
                                   rtol=1e-9, atol=1e-12)


def test_empty_matrices_and_stacks():
    """0 x 0 matrices and empty stacks answer as NumPy, with no ScaLAPACK call."""
    mesh = init_device_mesh("cpu", (P,))
    for shape in ((0, 0), (0, 3, 3)):
        a = np.zeros(shape)
        da = distribute_tensor(a, mesh, [Shard(len(shape) - 2)])
        assert np.linalg.inv(da).shape == np.linalg.inv(a).shape
        np.testing.assert_array_equal(np.linalg.det(da).full_tensor(), np.linalg.det(a))
        assert np.linalg.eigvalsh(da).shape == np.linalg.eigvalsh(a).shape


@pytest.mark.skipif(P == 1, reason="a 1-rank mesh runs NumPy's LAPACK")
@pytest.mark.parametrize("layout", [((2, 2), [S0, S1])] if P == 4 else
                         [((P,), [S0]), ((P,), [S1])], ids=str)
def test_blocks_too_large_to_factor_in_place_go_block_cyclic(layout):
    """Blocks of more than 256 rows go to a block-cyclic copy and back,
    a solve's of rows alone on the 1 x P grid: the same answers."""
    n = 257 * max(layout[0]) + 3
    a = matrix(n, np.float64, seed=11, spd=True)
    da = dist(a, layout)
    b = np.random.default_rng(2).standard_normal(n)
    mesh = da.device_mesh
    x = np.linalg.solve(da, distribute_tensor(b, mesh, [R] * mesh.ndim)).full_tensor()
    assert resid(a, x, b) < 20 * n * eps(np.float64)
    bs = np.random.default_rng(3).standard_normal((n, 3))
    xs = np.linalg.solve(da, distribute_tensor(bs, mesh, [R] * mesh.ndim)).full_tensor()
    assert np.linalg.norm(a @ xs - bs) < 20 * n * eps(np.float64) * np.linalg.norm(a) * \
        np.linalg.norm(xs)
    inv = np.linalg.inv(da).full_tensor()
    assert np.linalg.norm(a @ inv - np.eye(n)) < 50 * n * eps(np.float64) * np.linalg.cond(a)
    low = np.linalg.cholesky(da).full_tensor()
    np.testing.assert_allclose(low, np.linalg.cholesky(a), atol=1e-10 * np.sqrt(n))
    w, v = np.linalg.eigh(da)
    want = np.linalg.eigvalsh(a)
    assert np.abs(w.full_tensor() - want).max() <= 1e-10 * want.max()
    vf = v.full_tensor()
    bound = 50 * n * eps(np.float64) * np.linalg.norm(a)
    assert np.linalg.norm(a @ vf - vf * w.full_tensor()) < bound
    np.testing.assert_allclose(np.linalg.slogdet(da)[1].full_tensor(), np.linalg.slogdet(a)[1],
                               rtol=1e-10)


@pytest.mark.skipif(P == 1, reason="a 1-rank mesh runs NumPy's LAPACK")
@pytest.mark.parametrize("dtype", (np.float32, np.complex128),
                         ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("layout", [((P,), [S0]), ((P,), [S1])] +
                         ([((2, 2), [S1, S0])] if P == 4 else []), ids=str)
def test_block_cyclic_copy_of_other_types_and_uneven_blocks(layout, dtype):
    """The pieces each rank packs for the block-cyclic copy and unpacks on the way
    back (csrc/linalg/scalapack_exchange.c), in 4- and 16-byte elements, from
    uneven blocks larger than the drivers take as they lie: solve (columns of b
    over no mesh dim), inv, eigh's vectors and cholesky as NumPy's."""
    n = 257 * max(layout[0]) + 3
    a = matrix(n, dtype, seed=5, spd=True)
    da = dist(a, layout)
    mesh = da.device_mesh
    tol = 50 * n * eps(dtype)
    bs = matrix(n, dtype, seed=6)[:, :3]
    xs = np.linalg.solve(da, distribute_tensor(bs, mesh, [R] * mesh.ndim)).full_tensor()
    assert np.linalg.norm(a @ xs - bs) < tol * np.linalg.norm(a) * np.linalg.norm(xs)
    inv = np.linalg.inv(da)
    assert inv.placements == da.placements
    assert np.linalg.norm(a @ inv.full_tensor() - np.eye(n)) < tol * np.linalg.cond(a)
    w, v = np.linalg.eigh(da)
    vf, wf = v.full_tensor(), w.full_tensor()
    assert np.linalg.norm(a @ vf - vf * wf) < tol * np.linalg.norm(a)
    low = np.linalg.cholesky(da).full_tensor()
    assert np.linalg.norm(low @ low.conj().T - a) < tol * np.linalg.norm(a)
    assert np.all(np.triu(low, 1) == 0)


def pivoting(n, dtype, seed):
    """A well-conditioned n x n matrix whose largest entry of each row and column
    lies on the anti-diagonal, so partial pivoting of it or its transpose swaps
    rows between panels (and between the ranks that own them) at every step."""
    a = matrix(n, dtype, seed=seed) - 2 * np.sqrt(n) * np.eye(n, dtype=dtype)
    return a + (4 * np.sqrt(n) * np.eye(n)[::-1]).astype(dtype)


@pytest.mark.skipif(P == 1, reason="a 1-rank mesh runs NumPy's LAPACK")
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda t: np.dtype(t).name)
@pytest.mark.parametrize("layout", [((P,), [S0]), ((P,), [S1])], ids=str)
def test_lu_of_one_process_row_pivots_across_panels(layout, dtype):
    """The LU of a grid of one process row (csrc/linalg/scalapack_lu.c: solve of
    rows, every LU of columns) over many panels, each owned by the next rank, on
    a matrix that pivots at every step: solve, inv and slogdet as NumPy's; a
    zero pivot in a late panel is singular on every rank."""
    n = 257 * P + 3
    a = pivoting(n, dtype, seed=7)
    da = dist(a, layout)
    mesh = da.device_mesh
    tol = 50 * n * eps(dtype)
    b = matrix(n, dtype, seed=8)[:, :2]
    x = np.linalg.solve(da, distribute_tensor(b, mesh, [R])).full_tensor()
    assert np.linalg.norm(a @ x - b) < tol * np.linalg.norm(a) * np.linalg.norm(x)
    inv = np.linalg.inv(da).full_tensor()
    assert np.linalg.norm(a @ inv - np.eye(n)) < tol * np.linalg.cond(a)
    sign, logabs = np.linalg.slogdet(da)
    want_sign, want_log = np.linalg.slogdet(a.astype(np.complex128 if a.dtype.kind == "c"
                                                     else np.float64))
    assert abs(complex(sign.full_tensor()) - want_sign) < 1e-3
    assert float(logabs.full_tensor()) == pytest.approx(want_log, rel=1e3 * eps(dtype))
    late = n - 5  # a zero row of A, a zero column of its transpose: either LU
    a[late] = 0   # meets an exactly zero pivot in the last panels
    da = dist(a, layout)
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.solve(da, distribute_tensor(b, mesh, [R]))
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.inv(da)
    assert float(np.linalg.slogdet(da)[1].full_tensor()) == -np.inf
