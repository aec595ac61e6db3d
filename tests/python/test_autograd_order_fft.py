"""Optional (skipped without torch): the backward of np.sort, np.cumprod,
np.take_along_axis, the quantiles (nan-variants too) and np.fft's transforms
equal torch's.

Each case runs ``loss = sum(c * f(x))`` (for a complex output, the weighted sum of
its real and imaginary parts) on DTensor leaves of every layout of a 1-D mesh
(Replicate, Shard of each dim: uneven at 7 x 5 over 2, 3 and 4 ranks) and, at np
4, of a 2 x 2 mesh, and compares each leaf's gradient with plain torch's on the
full arrays, to 1e-12 in float64. torch runs in each process on its own (no
process group), so the reference needs no network. Inputs of the order
statistics have no ties.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import mpitensor as mt  # noqa: E402
from mpitensor import Replicate, Shard  # noqa: E402

W = MPI.COMM_WORLD.Get_size()
SHAPE = (7, 5)


def _mesh_layouts():
    out = []
    for pls in ([Replicate()], [Shard(0)], [Shard(1)]):
        out.append(((W,), pls))
    if W == 4:
        out += [((2, 2), [Shard(0), Shard(1)]), ((2, 2), [Shard(1), Replicate()])]
    return out


_MESHES: dict = {}


def mesh_of(shape):
    if shape not in _MESHES:
        _MESHES[shape] = mt.init_device_mesh("cpu", shape)
    return _MESHES[shape]


def _values(shape, complex_=False, seed=3):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape)
    if complex_:
        x = x + 1j * rng.standard_normal(shape)
    return x


def _weights(shape, seed=11):
    rng = np.random.default_rng(seed)
    return rng.uniform(0.5, 1.5, shape), rng.uniform(-1.5, -0.5, shape)


def _ours(f, arrays, mesh, pls):
    """Leaves' gradients (gathered) of sum(c * f(*leaves)), each checked to have its
    leaf's placements."""
    xs = [mt.distribute_tensor(a, mesh, pls, requires_grad=True)
          if np.issubdtype(a.dtype, np.inexact) else mt.distribute_tensor(a, mesh, pls)
          for a in arrays]
    y = f(*xs)
    c1, c2 = _weights(y.shape)
    rep = [Replicate()] * mesh.ndim
    w1 = mt.distribute_tensor(c1, mesh, rep)
    w2 = mt.distribute_tensor(c2, mesh, rep)
    loss = (np.real(y) * w1 + np.imag(y) * w2).sum() if y.dtype.kind == "c" else (y * w1).sum()
    loss.backward()
    out = []
    for i, x in enumerate(xs):
        if not x.requires_grad:
            continue
        assert x.grad is not None, f"input {i} got no gradient"
        assert x.grad.dtype == x.dtype
        out.append(x.grad.full_tensor())
    return out


def _theirs(f, arrays):
    ts = [torch.tensor(a, requires_grad=bool(np.issubdtype(a.dtype, np.inexact)))
          for a in arrays]
    y = f(*ts)
    c1, c2 = (torch.tensor(c) for c in _weights(tuple(y.shape)))
    loss = (y.real * c1 + y.imag * c2).sum() if y.is_complex() else (y * c1).sum()
    loss.backward()
    return [t.grad.resolve_conj().numpy() for t in ts if t.requires_grad]


def check(f_ours, f_torch, arrays, mesh_shape, pls):
    mesh = mesh_of(mesh_shape)
    ours = _ours(f_ours, arrays, mesh, pls)
    theirs = _theirs(f_torch, arrays)
    for i, (o, t) in enumerate(zip(ours, theirs)):
        np.testing.assert_allclose(o, t, rtol=1e-12, atol=1e-12, err_msg=f"leaf {i}")


LAYOUTS = _mesh_layouts()
IDS = [f"{'x'.join(map(str, m))}-{''.join(str(p) for p in pls)}" for m, pls in LAYOUTS]
layouts = pytest.mark.parametrize("mesh_shape,pls", LAYOUTS, ids=IDS)


# -- sort, cumprod, take_along_axis ------------------------------------------------------

SORTS = {
    "axis0": (lambda x: np.sort(x, axis=0), lambda x: torch.sort(x, 0)[0]),
    "axis1": (lambda x: np.sort(x, axis=1), lambda x: torch.sort(x, 1)[0]),
    "axis-1-default": (np.sort, lambda x: torch.sort(x, -1)[0]),
    "flat": (lambda x: np.sort(x, axis=None), lambda x: torch.sort(x.reshape(-1))[0]),
}


@layouts
@pytest.mark.parametrize("name", list(SORTS))
def test_sort(mesh_shape, pls, name):
    check(*SORTS[name], [_values(SHAPE)], mesh_shape, pls)


CUMPRODS = {
    "axis0": (lambda x: np.cumprod(x, axis=0), lambda x: torch.cumprod(x, 0)),
    "axis1": (lambda x: np.cumprod(x, axis=1), lambda x: torch.cumprod(x, 1)),
    "flat": (np.cumprod, lambda x: torch.cumprod(x.reshape(-1), 0)),
}


def _with_zeros():
    """Lanes (along both dims) with no zero, one zero, and two zeros."""
    x = _values(SHAPE)
    x[2, 1] = 0.0
    x[4, 1] = 0.0
    x[0, 3] = 0.0
    x[0, 0] = 0.0
    return x


@layouts
@pytest.mark.parametrize("zeros", [False, True], ids=["nonzero", "zeros"])
@pytest.mark.parametrize("name", list(CUMPRODS))
def test_cumprod(mesh_shape, pls, name, zeros):
    x = _with_zeros() if zeros else _values(SHAPE) * 0.5 + np.sign(_values(SHAPE))
    check(*CUMPRODS[name], [x], mesh_shape, pls)


def _indices(shape, n, seed=5):
    """Indices into a length n, some repeated, some negative (NumPy's wrap)."""
    rng = np.random.default_rng(seed)
    return rng.integers(-n, n, size=shape)


@layouts
@pytest.mark.parametrize("axis", [0, 1])
def test_take_along_axis(mesh_shape, pls, axis):
    x = _values(SHAPE)
    ishape = (9, 5) if axis == 0 else (7, 6)
    idx = _indices(ishape, SHAPE[axis])

    def theirs(a, i):
        n = a.shape[axis]
        return torch.take_along_dim(a, torch.remainder(i, n), axis)
    check(lambda a, i: np.take_along_axis(a, i, axis=axis), theirs, [x, idx], mesh_shape,
          pls)


# -- quantiles -----------------------------------------------------------------------------

def _tq(q):
    return torch.tensor(q, dtype=torch.float64)


QUANTILES = {
    "flat": (lambda x: np.quantile(x, 0.3), lambda x: torch.quantile(x, _tq(0.3))),
    "axis0": (lambda x: np.quantile(x, 0.3, axis=0),
              lambda x: torch.quantile(x, _tq(0.3), dim=0)),
    "axis1-q-list": (lambda x: np.quantile(x, [0.1, 0.5, 1.0], axis=1),
                     lambda x: torch.quantile(x, _tq([0.1, 0.5, 1.0]), dim=1)),
    "axis1-keepdims": (lambda x: np.quantile(x, [0.25, 0.7], axis=1, keepdims=True),
                       lambda x: torch.quantile(x, _tq([0.25, 0.7]), dim=1, keepdim=True)),
    "axes01": (lambda x: np.quantile(x, 0.66, axis=(0, 1)),
               lambda x: torch.quantile(x.reshape(-1), _tq(0.66))),
    "percentile": (lambda x: np.percentile(x, [30.0, 95.0], axis=0),
                   lambda x: torch.quantile(x, _tq([0.3, 0.95]), dim=0)),
    "median-flat": (np.median, lambda x: torch.quantile(x, _tq(0.5))),
    "median-axis0": (lambda x: np.median(x, axis=0),
                     lambda x: torch.quantile(x, _tq(0.5), dim=0)),
    "median-axis1": (lambda x: np.median(x, axis=1),
                     lambda x: torch.quantile(x, _tq(0.5), dim=1)),
}
for _m in ("lower", "higher", "midpoint", "nearest"):
    QUANTILES[f"method-{_m}"] = (
        (lambda m: lambda x: np.quantile(x, [0.1, 0.375, 0.5, 0.8], axis=0, method=m))(_m),
        (lambda m: lambda x: torch.quantile(x, _tq([0.1, 0.375, 0.5, 0.8]), dim=0,
                                            interpolation=m))(_m))


@layouts
@pytest.mark.parametrize("name", list(QUANTILES))
def test_quantile(mesh_shape, pls, name):
    check(*QUANTILES[name], [_values(SHAPE)], mesh_shape, pls)


# 7 x 7: where the forward moves a shard to the other dim, every rank still holds
# part of it; np.nanquantile of an empty block drops q's dim, which the forward
# (_ops/_along_axis) does not handle yet (a rank-dependent IndexError at np 4).
NAN_SHAPE = (7, 7)


def _with_nans():
    """A few NaNs, never a whole lane of them."""
    x = _values(NAN_SHAPE)
    x[1, 2] = x[5, 2] = x[3, 0] = x[6, 4] = np.nan
    return x


NANQUANTILES = {
    "flat": (lambda x: np.nanquantile(x, 0.3), lambda x: torch.nanquantile(x, _tq(0.3))),
    "axis0-q-list": (lambda x: np.nanquantile(x, [0.2, 0.5, 0.9], axis=0),
                     lambda x: torch.nanquantile(x, _tq([0.2, 0.5, 0.9]), dim=0)),
    "axis1-keepdims": (lambda x: np.nanquantile(x, 0.7, axis=1, keepdims=True),
                       lambda x: torch.nanquantile(x, _tq(0.7), dim=1, keepdim=True)),
    "nanpercentile": (lambda x: np.nanpercentile(x, [40.0], axis=1),
                      lambda x: torch.nanquantile(x, _tq([0.4]), dim=1)),
    "nanmedian-axis0": (lambda x: np.nanmedian(x, axis=0),
                        lambda x: torch.nanquantile(x, _tq(0.5), dim=0)),
    "nanmedian-flat": (np.nanmedian, lambda x: torch.nanquantile(x, _tq(0.5))),
}
for _m in ("lower", "higher", "midpoint", "nearest"):
    NANQUANTILES[f"method-{_m}"] = (
        (lambda m: lambda x: np.nanquantile(x, [0.1, 0.375, 0.5, 0.8], axis=0,
                                            method=m))(_m),
        (lambda m: lambda x: torch.nanquantile(x, _tq([0.1, 0.375, 0.5, 0.8]), dim=0,
                                               interpolation=m))(_m))


@layouts
@pytest.mark.parametrize("name", list(NANQUANTILES))
def test_nanquantile(mesh_shape, pls, name):
    check(*NANQUANTILES[name], [_with_nans()], mesh_shape, pls)


def test_quantile_method_without_rule_raises():
    x = mt.distribute_tensor(_values(SHAPE), mesh_of((W,)), [Shard(0)], requires_grad=True)
    with pytest.raises(NotImplementedError):
        np.quantile(x, 0.3, method="weibull")


# -- fft -----------------------------------------------------------------------------------

TF = torch.fft
FFTS = {
    # real input
    "fft-real": (False, lambda x: np.fft.fft(x), lambda x: TF.fft(x)),
    "fft-axis0-n9-ortho": (False, lambda x: np.fft.fft(x, 9, axis=0, norm="ortho"),
                           lambda x: TF.fft(x, 9, dim=0, norm="ortho")),
    "rfft": (False, lambda x: np.fft.rfft(x), lambda x: TF.rfft(x)),
    "rfft-axis0-n4-forward": (False, lambda x: np.fft.rfft(x, 4, axis=0, norm="forward"),
                              lambda x: TF.rfft(x, 4, dim=0, norm="forward")),
    "rfft-n8": (False, lambda x: np.fft.rfft(x, 8), lambda x: TF.rfft(x, 8)),
    "ihfft": (False, lambda x: np.fft.ihfft(x, axis=0), lambda x: TF.ihfft(x, dim=0)),
    "fft2-real": (False, np.fft.fft2, TF.fft2),
    "rfft2": (False, np.fft.rfft2, TF.rfft2),
    "rfftn-s": (False, lambda x: np.fft.rfftn(x, s=(6, 8), axes=(0, 1)),
                lambda x: TF.rfftn(x, s=(6, 8), dim=(0, 1))),
    "fftn-axis1": (False, lambda x: np.fft.fftn(x, axes=(1,), norm="ortho"),
                   lambda x: TF.fftn(x, dim=(1,), norm="ortho")),
    # complex input
    "fft": (True, lambda x: np.fft.fft(x, axis=0), lambda x: TF.fft(x, dim=0)),
    "ifft": (True, lambda x: np.fft.ifft(x), lambda x: TF.ifft(x)),
    "ifft-n3": (True, lambda x: np.fft.ifft(x, 3), lambda x: TF.ifft(x, 3)),
    "irfft": (True, lambda x: np.fft.irfft(x), lambda x: TF.irfft(x)),
    "irfft-axis0-n7-ortho": (True, lambda x: np.fft.irfft(x, 7, axis=0, norm="ortho"),
                             lambda x: TF.irfft(x, 7, dim=0, norm="ortho")),
    "irfft-n12": (True, lambda x: np.fft.irfft(x, 12), lambda x: TF.irfft(x, 12)),
    "hfft": (True, lambda x: np.fft.hfft(x), lambda x: TF.hfft(x)),
    "hfft-n5-forward": (True, lambda x: np.fft.hfft(x, 5, norm="forward"),
                        lambda x: TF.hfft(x, 5, norm="forward")),
    "fft2": (True, np.fft.fft2, TF.fft2),
    "ifft2-s": (True, lambda x: np.fft.ifft2(x, s=(8, 4)), lambda x: TF.ifft2(x, s=(8, 4))),
    "ifftn": (True, np.fft.ifftn, TF.ifftn),
    "irfft2": (True, np.fft.irfft2, TF.irfft2),
    "irfftn-s": (True, lambda x: np.fft.irfftn(x, s=(5, 9), axes=(0, 1)),
                 lambda x: TF.irfftn(x, s=(5, 9), dim=(0, 1))),
}


@layouts
@pytest.mark.parametrize("name", list(FFTS))
def test_fft(mesh_shape, pls, name):
    complex_, fo, ft = FFTS[name]
    check(fo, ft, [_values(SHAPE, complex_)], mesh_shape, pls)
