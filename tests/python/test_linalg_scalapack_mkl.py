"""np.linalg on MKL's ScaLAPACK (MPITENSOR_SCALAPACK=mkl): the tests of
solve, inv, det, slogdet and cholesky of test_linalg_scalapack.py and those
of svd and svdvals of test_linalg_scalapack_rect.py run again here, on MKL's
libraries, compared with NumPy as there; eigh and eigvalsh, whose MKL drivers
crash under Open MPI, raise on every rank instead; show_config names MKL's; loading it
leaves what NumPy and the nn kernels compute bit for bit as it was; a missing MKL
raises one error on every rank saying what to install. Run under mpiexec at 1 to
4 ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from mpitensor import _clib
from mpitensor._algorithms import _scalapack
from mpitensor._show_config import config

sys.path.insert(0, os.path.dirname(__file__))
from mpi_helpers import fresh_job_env  # noqa: E402

# The tests run again: pytest collects them here, where the fixture below puts
# them on MKL's ScaLAPACK (and test_linalg_scalapack_rect's no_gather with them).
from test_linalg_scalapack import (  # noqa: E402, F401
    P, S0, S1, dist, matrix, test_cholesky_lower_and_upper,
    test_inv_det_slogdet, test_not_positive_definite_raises_on_every_rank,
    test_singular_raises_linalgerror_on_every_rank, test_solve_matrix_and_vector)
from test_linalg_scalapack_rect import no_gather, test_svd_and_svdvals  # noqa: E402, F401

pytestmark = pytest.mark.skipif(_clib.mkl_library("libmkl_scalapack_lp64.so") is None,
                                reason="the mkl package (pip install mpitensor[mkl]) is not "
                                       "installed")


@pytest.fixture(autouse=True, scope="module")
def on_mkl():
    """Every test of this module on MKL's ScaLAPACK, the default restored after."""
    patch = pytest.MonkeyPatch()
    patch.setenv("MPITENSOR_SCALAPACK", "mkl")
    _scalapack.load.cache_clear()
    assert os.path.basename(_scalapack.scalapack_library()) == "libmkl_scalapack_lp64.so.2"
    yield
    patch.undo()
    _scalapack.load.cache_clear()


@pytest.mark.parametrize("func", [np.linalg.eigh, np.linalg.eigvalsh], ids=lambda f: f.__name__)
def test_eigh_raises_on_every_rank_on_mkl(func):
    """MKL's band reduction cuts Open MPI's communicator handles (a large eigh killed
    the job): a sharded eigh refuses on every rank, naming Debian's package; a
    matrix on one rank still answers from NumPy's LAPACK."""
    n = 3 * P  # three columns a rank: a grid ScaLAPACK would take
    a = matrix(n, np.float64, seed=4, spd=True)
    da = dist(a, ((P,), [S1]))
    if P == 1:
        np.testing.assert_allclose(np.linalg.eigvalsh(da).full_tensor(), np.linalg.eigvalsh(a))
        return
    with pytest.raises(RuntimeError, match="MKL's ScaLAPACK.*libscalapack-openmpi-dev"):
        func(da)


def test_show_config_names_mkls():
    line = config()["linear algebra"]["ScaLAPACK"]
    assert line.startswith("MKL's ScaLAPACK: ") and line.endswith("libmkl_scalapack_lp64.so.2")
    assert _scalapack.scalapack_source() == "MKL's ScaLAPACK"


@pytest.mark.skipif(P == 1, reason="a 1-rank mesh runs NumPy's LAPACK")
def test_missing_mkl_raises_on_every_rank_saying_what_to_install(monkeypatch):
    monkeypatch.setattr(_clib, "mkl_library", lambda stem: f"/nonexistent/{stem}.3")
    _scalapack.load.cache_clear()
    try:
        assert _scalapack.scalapack_library() is None
        da = dist(matrix(2 * P, np.float64), ((P,), [S0]))
        with pytest.raises(RuntimeError, match=r"(?s)/nonexistent/libmkl_core\.so\.3.*"
                                               r"MPITENSOR_SCALAPACK=mkl.*pip install mkl"):
            np.linalg.inv(da)
    finally:
        monkeypatch.undo()
        _scalapack.load.cache_clear()


# Computes NumPy's products and factorizations and the nn kernels' gemm, loads
# MKL's ScaLAPACK, computes them again and prints whether each came out the same.
_SAME_SCRIPT = """
import json, os
import numpy as np
from mpitensor.nn import _blas, _ckernels
from mpitensor._algorithms import _scalapack

def compute():
    rng = np.random.default_rng(0)
    out = []
    for dtype in (np.float32, np.float64):
        a, b = rng.standard_normal((2, 97, 97)).astype(dtype)
        c = np.zeros((97, 97), dtype)
        _ckernels.gemm(a, b, c, True, 1.0, 0.0)
        out += [a @ b, c, np.linalg.solve(a, b), *np.linalg.eigh(a + a.T),
                np.linalg.svd(a)[1], np.linalg.qr(a)[1]]
    return out

before = compute()
_scalapack.load()
after = compute()
print(json.dumps({"provider": _blas.provider(), "source": _scalapack.scalapack_source(),
                  "same": [bool(np.array_equal(x, y)) for x, y in zip(before, after)]}))
"""


@pytest.mark.np(1)
@pytest.mark.parametrize("blas", ["mkl", "openblas"])
def test_loading_mkl_leaves_numpy_and_the_nn_kernels_as_they_were(blas):
    """MKL's libraries go into the global namespace; NumPy's OpenBLAS (whose
    symbols are prefixed) and the nn kernels' BLAS (MKL's libmkl_rt too, or
    NumPy's OpenBLAS) keep computing what they did, to the bit."""
    env = {**fresh_job_env(), "MPITENSOR_SCALAPACK": "mkl", "MPITENSOR_BLAS": blas}
    out = subprocess.run([sys.executable, "-c", _SAME_SCRIPT], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["provider"] == blas and got["source"] == "MKL's ScaLAPACK", got
    assert all(got["same"]) and len(got["same"]) == 14, got
