"""The C kernels behind mpitensor.nn (GELU and its backward, softmax, layer norm,
attention) against
NumPy written out here (float64 rtol 1e-12, float32 1e-5) over odd shapes, leading
batch dims, empty and non-contiguous arrays, causal and plain attention with
L != S; the NumPy fallback (kernels off, or no BLAS) giving the same;
and tensor-parallel models equal to one process with the kernels on and off."""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, distribute_tensor, nn
from mpitensor.nn import _ckernels, _kernels
from mpitensor.nn import functional as F
from mpitensor.parallel import SequenceParallel, parallelize_module
from tp_models import build, heads_for, model_plan

W = MPI.COMM_WORLD.Get_size()
RNG = np.random.default_rng(11)
TOL = {np.float64: dict(rtol=1e-12, atol=1e-13), np.float32: dict(rtol=1e-5, atol=1e-6)}
SHAPES = [(7,), (3, 5), (2, 3, 17), (1, 4, 2, 33), (0, 5), (3, 0)]


# Forward values and communication only (conftest.forward_only).
pytestmark = pytest.mark.usefixtures("forward_only")


@pytest.fixture(params=["c", "numpy"])
def path(request, monkeypatch):
    """Each test once through the C kernels and once with them off (the NumPy path
    no BLAS, or another dtype, takes)."""
    if request.param == "numpy":
        monkeypatch.setattr(_kernels, "enabled", False)
    return request.param


def data(shape, dtype, scale=3.0, strided=False):
    x = (RNG.standard_normal(shape) * scale).astype(dtype)
    if strided and x.ndim:  # a non-contiguous view with the same values
        wide = np.zeros(shape[:-1] + (2 * shape[-1],), dtype)
        wide[..., ::2] = x
        return wide[..., ::2]
    return x


def ref_gelu(x, approximate):
    v = x.astype(np.float64)
    if approximate == "tanh":  # 0.5 v (1 + tanh u), without its cancellation
        return v / (1.0 + np.exp(-2.0 * math.sqrt(2 / math.pi) * (v + 0.044715 * v ** 3)))
    return 0.5 * v * np.vectorize(math.erfc)(-v / math.sqrt(2.0)) if v.size else v


def ref_softmax(x, axis, log):
    v = x.astype(np.float64)
    s = v - v.max(axis=axis, keepdims=True)
    lse = np.log(np.exp(s).sum(axis=axis, keepdims=True))
    return s - lse if log else np.exp(s - lse)


def ref_layer_norm(x, k, w, b, eps):
    v = x.astype(np.float64)
    axes = tuple(range(v.ndim - k, v.ndim))
    mean = v.mean(axis=axes, keepdims=True)
    var = ((v - mean) ** 2).mean(axis=axes, keepdims=True)
    y = (v - mean) / np.sqrt(var + eps)
    return y * (1.0 if w is None else w) + (0.0 if b is None else b)


def ref_attention(q, k, v, mask=None, causal=False, scale=None):
    q, k, v = (a.astype(np.float64) for a in (q, k, v))
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        mask = np.tri(q.shape[-2], k.shape[-2], dtype=bool)
    if mask is not None and mask.dtype == bool:
        s = np.where(mask, s, -np.inf)
    elif mask is not None:
        s = s + mask
    if s.shape[-1] == 0:
        return np.zeros(q.shape[:-1] + v.shape[-1:])
    return ref_softmax(s, -1, False) @ v


def check(got, want, dtype):
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, **TOL[dtype])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(path, dtype, shape, approximate):
    for strided in (False, True):
        x = data(shape, dtype, 4.0, strided)
        check(F.gelu(x, approximate), ref_gelu(x, approximate), dtype)


def ref_gelu_grad(x, approximate):
    v = x.astype(np.float64)
    if approximate == "tanh":  # s + 2 v s (1 - s) u' with s = sigmoid(2u)
        c = math.sqrt(2 / math.pi)
        e = np.exp(-2.0 * c * (v + 0.044715 * v ** 3))
        s = 1.0 / (1.0 + e)
        return s + 2.0 * v * (e * s) * s * c * (1.0 + 3 * 0.044715 * v * v)
    phi = np.exp(-0.5 * v * v) / math.sqrt(2 * math.pi)
    return 0.5 * np.vectorize(math.erfc)(-v / math.sqrt(2.0)) + v * phi if v.size else v


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_backward(path, dtype, shape, approximate):
    for strided in (False, True):
        x, g = data(shape, dtype, 4.0, strided), data(shape, dtype, 1.0, strided)
        check(_kernels.gelu_backward(x, g, approximate),
              g.astype(np.float64) * ref_gelu_grad(x, approximate), dtype)


def test_gelu_backward_in_the_tails():
    # Far below 0 the derivative vanishes (no NaN from inf * 0); far above it is 1.
    x = np.array([-200.0, -60.0, -9.0, 0.0, 9.0, 60.0, 200.0])
    for dtype in (np.float32, np.float64):
        for approximate in ("none", "tanh"):
            got = _kernels.gelu_backward(x.astype(dtype), np.ones(7, dtype), approximate)
            assert np.isfinite(got).all(), (dtype, approximate, got)
            np.testing.assert_allclose(got, [0, 0, 0, 0.5, 1, 1, 1], atol=1e-14)
            want = ref_gelu_grad(x.astype(dtype)[2:3], approximate)
            np.testing.assert_allclose(got[2], want[0], rtol=1e-5)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_and_log_softmax(path, dtype, shape):
    for strided in (False, True):
        x = data(shape, dtype, 10.0, strided)
        for axis in range(-1, -len(shape) - 1, -1):
            if x.size == 0:
                continue
            check(F.softmax(x, axis), ref_softmax(x, axis, False), dtype)
            check(F.log_softmax(x, axis), ref_softmax(x, axis, True), dtype)


def test_softmax_masked_entries_are_exact_zeros(path):
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, 2.0, -np.inf]], np.float32)
    y = F.softmax(x, -1)
    assert y[0, 1] == 0 and y[1, 0] == 0 and y[1, 1] == 1


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape,k", [((5, 9), 1), ((2, 3, 33), 1), ((2, 3, 4), 2),
                                     ((4, 1), 1), ((0, 8), 1)])
def test_layer_norm(path, dtype, shape, k):
    norm = shape[len(shape) - k:]
    # A mean far from zero for the kernel, which centers in double; NumPy's float32
    # centering loses an ulp of the mean, so its path gets a small one.
    x = data(shape, dtype, 2.0) + dtype(50.0 if path == "c" else 1.0)
    w, b = data(norm, dtype), data(norm, dtype)
    for wb in ((None, None), (w, None), (None, b), (w, b)):
        check(F.layer_norm(x, norm, *wb, eps=1e-5), ref_layer_norm(x, k, *wb, 1e-5), dtype)
    xs = data(shape, dtype, 2.0, strided=True) + dtype(1.0)
    check(F.layer_norm(xs, norm, w, b), ref_layer_norm(xs, k, w, b, 1e-5), dtype)


# (batch dims, query rows, key rows, head width, value width): ragged blocks, L < S
# and L > S, one row, no keys, no batch.
ATTENTION_SHAPES = [((), 5, 5, 4, 4), ((2,), 70, 70, 8, 8), ((2, 3), 130, 67, 9, 5),
                    ((1, 2), 67, 130, 16, 3), ((2,), 1, 1, 3, 2), ((2,), 4, 0, 3, 2),
                    ((0, 3), 4, 5, 3, 2)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("lead,L,S,E,Ev", ATTENTION_SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention(path, dtype, lead, L, S, E, Ev, causal):
    q, k, v = data(lead + (L, E), dtype, 1.0), data(lead + (S, E), dtype, 1.0), \
        data(lead + (S, Ev), dtype, 1.0)
    check(F.scaled_dot_product_attention(q, k, v, is_causal=causal),
          ref_attention(q, k, v, causal=causal), dtype)
    # Strided heads, as attention's projections are laid out: (..., L, heads, E).
    qs = np.swapaxes(data(lead[:-1] + (L,) + lead[-1:] + (E,), dtype, 1.0), -2, -3) \
        if lead else q
    check(F.scaled_dot_product_attention(qs, k, v, is_causal=causal, scale=0.3),
          ref_attention(qs, k, v, causal=causal, scale=0.3), dtype)


def ref_attention_grads(q, k, v, g, causal, scale):
    """Attention's gradients (dq, dk, dv) in float64, from the formula."""
    q, k, v, g = (a.astype(np.float64) for a in (q, k, v, g))
    if k.shape[-2] == 0:
        return np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    s = q @ np.swapaxes(k, -1, -2) * scale
    if causal:
        s = np.where(np.tri(q.shape[-2], k.shape[-2], dtype=bool), s, -np.inf)
    p = ref_softmax(s, -1, False)
    dp = g @ np.swapaxes(v, -1, -2)
    ds = p * (dp - np.sum(dp * p, axis=-1, keepdims=True)) * scale
    return ds @ k, np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ g


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("lead,L,S,E,Ev", ATTENTION_SHAPES)
@pytest.mark.parametrize("causal", [False, True])
def test_attention_backward(path, dtype, lead, L, S, E, Ev, causal):
    """The gradients attention's backward computes (one C pass per block of query
    rows, or NumPy's weights), on contiguous and on strided heads."""
    q, k, v = data(lead + (L, E), dtype, 1.0), data(lead + (S, E), dtype, 1.0), \
        data(lead + (S, Ev), dtype, 1.0)
    g = data(lead + (L, Ev), dtype, 1.0)
    tol = TOL[dtype] if dtype == np.float64 else dict(rtol=1e-4, atol=2e-5)
    # Strided heads, as a projection's output is laid out: (..., L, heads, E).
    heads = [(np.swapaxes(np.swapaxes(q, -2, -3).copy(), -2, -3),
              np.swapaxes(np.swapaxes(g, -2, -3).copy(), -2, -3))] if lead else []
    for qs, gs in [(q, g)] + heads:
        grads = F._sdpa_backward(qs, k, v, gs, None, 0.0, causal, 0.3, None)
        for got, want in zip(grads, ref_attention_grads(q, k, v, g, causal, 0.3)):
            assert got.dtype == dtype and got.shape == want.shape
            np.testing.assert_allclose(got, want, **tol)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_attention_masks_and_broadcast_heads_take_numpy(path, dtype):
    q, k, v = (data((2, 6, 4), dtype, 1.0) for _ in range(3))
    keep = np.tri(6, 6, 1, dtype=bool)
    add = data((6, 6), dtype, 1.0)
    check(F.scaled_dot_product_attention(q, k, v, keep), ref_attention(q, k, v, keep), dtype)
    check(F.scaled_dot_product_attention(q, k, v, add), ref_attention(q, k, v, add), dtype)
    k1, v1 = k[:1], v[:1]  # broadcast over the leading dim
    check(F.scaled_dot_product_attention(q, k1, v1), ref_attention(q, k1, v1), dtype)
    with pytest.raises(ValueError, match="not both"):
        F.scaled_dot_product_attention(q, k, v, keep, is_causal=True)


def test_other_dtypes_take_numpy(path):
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.testing.assert_allclose(F.gelu(x), ref_gelu(x, "none"), rtol=1e-12)
    np.testing.assert_allclose(F.softmax(x), ref_softmax(x, -1, False), rtol=1e-12)
    h = np.linspace(-2, 2, 12, dtype=np.float16).reshape(3, 4)
    assert F.gelu(h, "tanh").dtype == np.float16
    assert F.layer_norm(h, (4,)).dtype == np.float16


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_linear_bias_in_place_equals_sum(path, dtype):
    x, w, b = data((2, 3, 7), dtype), data((5, 7), dtype), data((5,), dtype)
    want = x.astype(np.float64) @ w.T.astype(np.float64) + b
    check(F.linear(x, w, b), want, dtype)
    # A bias that broadcasts to more than the product, or promotes: a new array.
    y = F.linear(x, w, data((4, 1, 1, 5), dtype))
    assert y.shape == (4, 2, 3, 5)
    assert F.linear(x.astype(np.float32), w.astype(np.float32), b.astype(np.float64)).dtype \
        == np.float64


def test_the_c_path_runs_when_it_applies(monkeypatch):
    calls = []
    for name in ("gelu", "gelu_backward", "softmax", "layer_norm", "attention",
                 "attention_backward"):
        real = getattr(_ckernels, name)
        monkeypatch.setattr(_ckernels, name,
                            lambda *a, _f=real, _n=name: calls.append(_n) or _f(*a))
    x = data((4, 8), np.float32)
    F.gelu(x)
    _kernels.gelu_backward(x, x, "none")
    _kernels.gelu_backward(x, x.astype(np.float64), "tanh")  # two dtypes: NumPy
    F.softmax(x)
    F.layer_norm(x, (8,))
    F.softmax(x, 0)  # not the last dim: NumPy
    q = data((2, 5, 8), np.float32)
    F.scaled_dot_product_attention(q, q, q, is_causal=True)
    F._sdpa_backward(q, q, q, q, None, 0.0, True, None, None)
    F._sdpa_backward(q, q, q, q, np.tri(5, 5, dtype=bool), 0.0, False, None, None)  # NumPy
    expect = ["gelu", "gelu_backward", "softmax", "layer_norm"] + (
        ["attention", "attention_backward"] if _ckernels.have_blas() else [])
    assert calls == expect


def test_without_blas_attention_is_numpy(monkeypatch):
    monkeypatch.setattr(_ckernels, "have_blas", lambda: False)
    monkeypatch.setattr(_ckernels, "attention", None)  # would raise if called
    q = data((3, 6, 4), np.float64)
    check(F.scaled_dot_product_attention(q, q, q, is_causal=True),
          ref_attention(q, q, q, causal=True), np.float64)


def test_kernels_reject_what_python_filters():
    x = data((3, 4), np.float32)
    with pytest.raises(TypeError, match="float32 or float64"):
        _ckernels.gelu(x.astype(np.int32), 0)
    with pytest.raises(ValueError, match="C-contiguous"):
        _ckernels.softmax(x.T, 0)
    with pytest.raises(ValueError, match="neither erf"):
        _ckernels.gelu(x, 7)
    with pytest.raises(ValueError, match="elements"):
        _ckernels.layer_norm(x, 4, np.ones(3, np.float32), None, 1e-5)
    with pytest.raises(TypeError, match="one dtype"):
        _ckernels.layer_norm(x, 4, np.ones(4, np.float64), None, 1e-5)
    q = data((1, 1, 3, 4), np.float32)
    with pytest.raises(ValueError, match="expected"):
        _ckernels.attention(q, q, q[..., :2], np.empty((1, 1, 3, 4), np.float32), 1.0, False)
    with pytest.raises(ValueError, match="4-D"):
        _ckernels.attention(q[0], q[0], q[0], q[0].copy(), 1.0, False)
    p = np.zeros(4)
    p.flags.writeable = False
    with pytest.raises(ValueError, match="param is read-only"):
        _ckernels.adam_update(p, p, p, p, None, 1.0, 0.0, 0.9, 0.99, 0.1, 1.0, 1e-8, False)
    with pytest.raises(ValueError, match="sgemm and dgemm"):  # half a pair: MT_EINVAL
        _ckernels.set_blas(1, 0, False)


# -- the same models, sharded, with the kernels on and off --------------------------

@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_gpt_tensor_parallel_matches_one_process(mesh, path, sequence_parallel):
    heads, head_dim = heads_for(W)
    cfg = dict(vocab=29, dim=heads * head_dim, heads=heads, layers=2,
               hidden=3 * heads * head_dim + 1)
    tokens = np.random.default_rng(3).integers(0, 29, size=(2, 12))
    ref = build(**cfg)(tokens)
    model = parallelize_module(build(**cfg), mesh, model_plan(sequence_parallel=
                                                               sequence_parallel))
    np.testing.assert_allclose(model(tokens), ref, rtol=1e-10, atol=1e-12)


def test_sharded_layer_norm_keeps_placements(mesh, path):
    x = data((2, 4 * W + 1, 6), np.float64)
    ln = nn.LayerNorm(6)
    ref = ln(x)
    sp = parallelize_module(nn.LayerNorm(6), mesh, SequenceParallel(use_local_output=False))
    y = sp(distribute_tensor(x, mesh, [Shard(1)]))
    assert y.placements == (Shard(1),)
    np.testing.assert_allclose(y.full_tensor(), ref, rtol=1e-12)
    # Sharded on the normalized dim: reduced across ranks, same values.
    z = F.layer_norm(distribute_tensor(x, mesh, [Shard(2)]), (6,))
    np.testing.assert_allclose(z.full_tensor(), ref, rtol=1e-12, atol=1e-14)
    r = F.layer_norm(distribute_tensor(x, mesh, [Replicate()]), (6,))
    assert r.placements == (Replicate(),)
    np.testing.assert_allclose(r.to_local(), ref, rtol=1e-12)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("fused", [False, True])
def test_multihead_attention_reads_heads_in_place(monkeypatch, causal, fused):
    mt.manual_seed(5)
    attn = nn.MultiheadAttention(12, 3, fused_qkv=fused, causal=causal)
    x = data((2, 7, 12), np.float64, 1.0)
    mask = np.tri(7, 7, dtype=bool)
    got = [attn(x), attn(x, mask)]
    monkeypatch.setattr(_kernels, "enabled", False)
    want = [attn(x), attn(x, mask)]
    for g, w in zip(got, want):
        assert g.shape == (2, 7, 12) and g.flags.c_contiguous
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-14)


def test_attention_of_no_heads_or_no_rows(path):
    """A rank that holds no head (3 heads over 4 ranks) gets an empty result."""
    for shape in ((2, 12, 0, 2), (2, 0, 3, 2), (0, 12, 3, 2)):
        q = data(shape, np.float64)
        out = _kernels.attention_heads(q, q, q, 0.5, True)
        assert out is None or out.shape == shape[:-2] + (shape[-2] * shape[-1],)
        check(F.scaled_dot_product_attention(np.moveaxis(q, -2, -3), np.moveaxis(q, -2, -3),
                                             np.moveaxis(q, -2, -3), is_causal=True),
              np.zeros(np.moveaxis(q, -2, -3).shape), np.float64)


@pytest.mark.skipif(not _ckernels.have_blas(), reason="attention runs in C only with a BLAS")
def test_attention_checks_the_extents_of_outputs():
    """The core's attention operands carry strides only: a gradient or output of
    the wrong extent, or a read-only one, must be refused before the kernel would
    write past it."""
    q, k, v = (data(s, np.float64) for s in ((1, 2, 4, 8), (1, 2, 5, 8), (1, 2, 5, 3)))
    g = data((1, 2, 4, 3), np.float64)
    dq, dk = np.empty_like(q), np.empty_like(k)
    with pytest.raises(ValueError, match="dv must have the shape"):
        _ckernels.attention_backward(q, k, v, g, dq, dk, np.empty((1, 2, 4, 3)), 1.0, False)
    readonly = np.empty((1, 2, 4, 3))
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="out must be writable"):
        _ckernels.attention(q, k, v, readonly, 1.0, False)
    dq.flags.writeable = False
    with pytest.raises(ValueError, match="dq must be writable"):
        _ckernels.attention_backward(q, k, v, g, dq, dk, np.empty_like(v), 1.0, False)
