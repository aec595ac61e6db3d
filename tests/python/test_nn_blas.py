"""The BLAS the nn kernels call, chosen at run time (mpitensor.nn._blas): linear and
attention under each provider this machine has (MKL, NumPy's OpenBLAS, none)
against float64 NumPy written out here, over odd shapes, leading batch dims,
non-contiguous and transposed operands, empty sizes and broadcast biases; the
choice by MPITENSOR_BLAS and a library path, and the warning when a library is
unusable; a tensor-parallel model equal to one process under each provider."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import _clib
from mpitensor.nn import _blas, _ckernels, _kernels
from mpitensor.nn import functional as F
from mpitensor.parallel import parallelize_module
from tp_models import build, heads_for, model_plan

W = MPI.COMM_WORLD.Get_size()
RNG = np.random.default_rng(23)
TOL = {np.float64: dict(rtol=1e-12, atol=1e-12), np.float32: dict(rtol=2e-5, atol=2e-5)}


# Forward values and communication only (conftest.forward_only).
pytestmark = pytest.mark.usefixtures("forward_only")


@pytest.fixture
def restore_blas(monkeypatch):
    """Puts back the provider the import chose (the environment's) after a test."""
    yield
    monkeypatch.undo()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        _blas.use()


@pytest.fixture(params=["mkl", "openblas", "none"])
def provider(request, restore_blas):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        got = _blas.use(request.param)
    if got != request.param:
        pytest.skip(f"{request.param} is not installed here")
    return got


def data(shape, dtype, scale=2.0):
    return (RNG.standard_normal(shape) * scale).astype(dtype)


def strided(a):
    """A view of ``a``'s values whose rows are not contiguous (every other column)."""
    wide = np.zeros(a.shape[:-1] + (2 * a.shape[-1],), a.dtype)
    wide[..., ::2] = a
    return wide[..., ::2]


def ref_linear(x, w, b):
    y = x.astype(np.float64) @ w.astype(np.float64).T
    return y if b is None else y + b.astype(np.float64)


# x shape, (n, k), bias shape (None: no bias)
CASES = [((3, 5), (7, 5), (7,)), ((2, 3, 17), (9, 17), (9,)), ((5,), (4, 5), (4,)),
         ((33, 65), (31, 65), None), ((2, 3, 4), (6, 4), (3, 1)),
         ((2, 3, 4), (6, 4), (5, 1, 1, 6)), ((0, 5), (4, 5), (4,)), ((3, 5), (0, 5), (0,)),
         ((3, 0), (4, 0), (4,)), ((3, 0), (4, 0), None), ((1, 1), (1, 1), (1,))]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("xs,ws,bs", CASES)
@pytest.mark.parametrize("layout", ["c", "strided", "transposed_w"])
def test_linear_under_each_provider(provider, dtype, xs, ws, bs, layout):
    x, w = data(xs, dtype), data(ws, dtype)
    b = None if bs is None else data(bs, dtype)
    if layout == "strided":
        x, w = strided(x), strided(w)
    elif layout == "transposed_w":
        w = np.asfortranarray(w)
    got = F.linear(x, w, b)
    want = ref_linear(x, w, b)
    assert got.shape == want.shape and got.dtype == dtype
    np.testing.assert_allclose(got, want, **TOL[dtype])


def test_linear_calls_the_gemm_under_a_blas(provider, monkeypatch):
    calls = []
    real = _ckernels.gemm
    monkeypatch.setattr(_ckernels, "gemm", lambda *a: calls.append(a) or real(*a))
    # A batched input too: one gemm over the rows of every leading index.
    x, w, b = data((2, 4, 6), np.float32), data((3, 6), np.float32), data((3,), np.float32)
    np.testing.assert_allclose(F.linear(x, w, b), ref_linear(x, w, b), **TOL[np.float32])
    assert len(calls) == (0 if provider == "none" else 1)
    if calls:
        assert calls[0][3] is True and calls[0][5] == 1.0  # w transposed, bias as beta
        assert calls[0][0].shape == (8, 6)
    # What the gemm cannot do (a bias that promotes or widens the output, ints) is
    # NumPy's.
    x = x[0]
    calls.clear()
    assert F.linear(x, w, b.astype(np.float64)).dtype == np.float64
    assert F.linear(x, w, data((2, 1, 3), np.float32)).shape == (2, 4, 3)
    assert F.linear(x.astype(np.int64), w.astype(np.int64)).dtype == np.int64
    assert calls == []


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_under_each_provider(provider, dtype, causal):
    q, k, v = data((2, 70, 8), dtype, 1.0), data((2, 70, 8), dtype, 1.0), data((2, 70, 5),
                                                                                dtype, 1.0)
    s = q.astype(np.float64) @ np.swapaxes(k, -1, -2).astype(np.float64) / np.sqrt(8)
    if causal:
        s = np.where(np.tri(70, dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    want = (p / p.sum(-1, keepdims=True)) @ v.astype(np.float64)
    got = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    np.testing.assert_allclose(got, want, **TOL[dtype])
    assert _kernels.attention_fits(q, k, v) == (provider != "none")


def test_gpt_tensor_parallel_matches_one_process_under_each_provider(provider):
    mesh = mt.init_device_mesh("cpu", (W,))
    heads, head_dim = heads_for(W)
    cfg = dict(vocab=29, dim=heads * head_dim, heads=heads, layers=2,
               hidden=3 * heads * head_dim + 1)
    tokens = np.random.default_rng(3).integers(0, 29, size=(2, 12))
    ref = build(**cfg)(tokens)
    model = parallelize_module(build(**cfg), mesh, model_plan(sequence_parallel=True))
    np.testing.assert_allclose(model(tokens), ref, rtol=1e-10, atol=1e-12)


def test_environment_variable_chooses(monkeypatch, restore_blas):
    monkeypatch.setenv("MPITENSOR_BLAS", "none")
    assert _blas.use() == "none" and _blas.library() is None
    assert not _ckernels.have_blas()
    with pytest.raises(NotImplementedError, match="no BLAS"):
        _ckernels.gemm(np.ones((2, 2)), np.ones((2, 2)), np.ones((2, 2)), False, 1.0, 0.0)
    monkeypatch.setenv("MPITENSOR_BLAS", "numpy")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        name = _blas.use()
    assert name in ("openblas", "none")
    if name == "openblas":
        assert "openblas" in _blas.library() and _ckernels.have_blas()


@pytest.mark.parametrize("vendor", ["GenuineIntel", "AuthenticAMD", ""])
def test_default_is_mkl_on_intel_cpus_only(monkeypatch, restore_blas, vendor):
    """Unset, MKL comes first on Intel CPUs, NumPy's OpenBLAS first on others."""
    monkeypatch.delenv("MPITENSOR_BLAS", raising=False)
    monkeypatch.setattr(_blas, "_cpu_vendor", lambda: vendor)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        have = {name for name in ("mkl", "openblas") if _blas.use(name) == name}
        got = _blas.use()
    order = ["mkl", "openblas"] if vendor == "GenuineIntel" else ["openblas", "mkl"]
    assert got == next((name for name in order if name in have), "none")


def test_unusable_library_warns_and_numpy_computes(monkeypatch, restore_blas):
    monkeypatch.setenv("MPITENSOR_BLAS", "/nonexistent/libblas.so")
    with pytest.warns(RuntimeWarning, match="cannot load /nonexistent/libblas.so.*NumPy"):
        assert _blas.use() == "none"
    x, w = data((3, 4), np.float64), data((5, 4), np.float64)
    np.testing.assert_allclose(F.linear(x, w), ref_linear(x, w, None), **TOL[np.float64])
    # A library without the CBLAS names (NumPy's OpenBLAS prefixes its symbols).
    path = _clib.numpy_openblas()
    if path is None:
        pytest.skip("this NumPy bundles no OpenBLAS")
    with pytest.warns(RuntimeWarning, match="exports none of cblas_sgemm"):
        assert _blas.use(path) == "none"


def test_openblas_is_the_library_numpy_loaded(restore_blas):
    """Found through threadpoolctl, not NumPy's wheel's file layout: the same file
    as NumPy's BLAS, so its gemm is np.matmul's."""
    from threadpoolctl import threadpool_info

    numpy_blas = [i["filepath"] for i in threadpool_info()
                  if i["user_api"] == "blas" and i["internal_api"] == "openblas"]
    if _blas.use("openblas") != "openblas":
        assert numpy_blas == []
        pytest.skip("this NumPy loaded no OpenBLAS")
    assert _blas.library() in numpy_blas
    x, w = data((4, 9), np.float64), data((6, 9), np.float64)
    assert _ckernels.have_blas()
    out = np.empty((4, 6))
    _ckernels.gemm(x, w, out, True, 1.0, 0.0)
    np.testing.assert_allclose(out, ref_linear(x, w, None), **TOL[np.float64])


def test_a_library_path_with_lp64_cblas(restore_blas):
    """MKL's runtime library named by its path: the plain LP64 cblas_sgemm."""
    try:
        path = _blas._mkl_path()
    except _blas._LoadError:
        pytest.skip("mkl is not installed here")
    assert _blas.use(path) == path == _blas.library()
    x, w, b = data((2, 5, 7), np.float32), data((3, 7), np.float32), data((3,), np.float32)
    np.testing.assert_allclose(F.linear(x, w, b), ref_linear(x, w, b), **TOL[np.float32])


def test_gemm_checks_its_operands(provider):
    a = np.ones((2, 3))
    with pytest.raises(ValueError, match="2-D"):
        _ckernels.gemm(np.ones((2, 3, 1)), a, np.ones((2, 3)), True, 1.0, 0.0)
    with pytest.raises(ValueError, match="contiguous last dim"):
        _ckernels.gemm(np.ones((3, 2)).T, a, np.ones((2, 2)), True, 1.0, 0.0)
    with pytest.raises(ValueError, match="shapes"):
        _ckernels.gemm(a, a, np.ones((2, 3)), True, 1.0, 0.0)
    with pytest.raises(TypeError, match="one dtype"):
        _ckernels.gemm(a, a.astype(np.float32), np.ones((2, 2)), True, 1.0, 0.0)
    c = np.ones((2, 2))
    c.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        _ckernels.gemm(a, a, c, True, 1.0, 0.0)
