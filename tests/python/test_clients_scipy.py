"""SciPy on DTensors gives SciPy's answers on NumPy.

SciPy takes DTensors through the array API (``SCIPY_ARRAY_API=1``, set by the
conftest before SciPy is imported): ``scipy.special``'s ufuncs run on the local
arrays as NumPy's do, ``scipy.stats`` and ``scipy.fft`` call the namespace's
functions, and what SciPy computes in compiled code reaches it through
``np.asarray`` (the warned gather). Each case is the same call on the gathered
NumPy array, to 1e-8.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
import mpitensor.array_api as xp
from client_helpers import recording_gathers

assert os.environ.get("SCIPY_ARRAY_API") == "1"
sps = pytest.importorskip("scipy.special")
st = pytest.importorskip("scipy.stats")
sfft = pytest.importorskip("scipy.fft")

X = np.random.default_rng(0).uniform(0.1, 0.9, (13, 5))


def _plain(obj):
    if isinstance(obj, mt.DTensor):
        return obj.full_tensor()
    if isinstance(obj, tuple):
        return tuple(_plain(o) for o in obj)
    return np.asarray(obj)


def _same(got, want):
    got = _plain(got)
    if isinstance(want, tuple):
        assert len(got) == len(want)
        for g, w in zip(got, want):
            _same(g, w)
        return
    np.testing.assert_allclose(np.asarray(got, dtype=np.asarray(want).dtype), want,
                               rtol=1e-8, atol=1e-300, equal_nan=True)


def _compare(call, record_property):
    want = call(X)
    with recording_gathers(record_property):
        got = call(xp.asarray(X))
    _same(got, want)


_UFUNCS = sorted(n for n in dir(sps) if not n.startswith("_")
                 and isinstance(getattr(sps, n), np.ufunc) and getattr(sps, n).nin == 1)


@pytest.mark.parametrize("name", _UFUNCS)
def test_special_ufunc(record_property, name):
    _compare(getattr(sps, name), record_property)


@pytest.mark.parametrize("name", ["logsumexp", "softmax", "log_softmax"])
def test_special_function(record_property, name):
    f = getattr(sps, name)
    _compare(lambda a: f(a, axis=0), record_property)
    _compare(f, record_property)


_STATS = {
    "describe": lambda f, a: f(a, axis=0), "moment": lambda f, a: f(a, 3, axis=0),
    "skew": None, "kurtosis": None, "zscore": None, "sem": None, "tmean": None,
    "tvar": None, "tstd": None, "tsem": None, "tmin": None, "tmax": None,
    "variation": None, "gmean": None, "hmean": None,
    "pmean": lambda f, a: f(a, 2.0, axis=0), "entropy": None, "iqr": None,
    "trim_mean": lambda f, a: f(a, 0.1, axis=0), "rankdata": None,
    "ttest_1samp": lambda f, a: f(a, 0.5, axis=0),
    "ttest_ind": lambda f, a: f(a, a ** 2, axis=0),
    "bartlett": lambda f, a: f(a, a ** 2, axis=0),
    "circmean": None, "circvar": None, "circstd": None,
    "boxcox_llf": lambda f, a: f(0.5, a, axis=0),
    "pearsonr": lambda f, a: f(a[:, 0], a[:, 1]),
}


@pytest.mark.parametrize("name", list(_STATS))
def test_stats_function(record_property, name):
    f = getattr(st, name)
    call = _STATS[name] or (lambda f, a: f(a, axis=0))
    _compare(lambda a: call(f, a), record_property)


@pytest.mark.parametrize("name", ["fft", "ifft", "rfft", "irfft", "hfft", "dct", "dst",
                                  "idct", "idst", "fftn", "fftshift", "ifftshift"])
def test_fft_function(record_property, name):
    f = getattr(sfft, name)
    if name in ("fftn", "fftshift", "ifftshift"):
        _compare(f, record_property)
    else:
        _compare(lambda a: f(a, axis=0), record_property)
        _compare(lambda a: f(a, axis=1), record_property)


def test_trimmed_statistics_in_a_row_on_a_program_mesh(record_property):
    """tvar, tstd and tsem one after another on a DTensor of the program's own mesh:
    SciPy makes some operands on the namespace's default mesh (an equal mesh
    object), and a result that took the other operand's spec kept the first
    mesh's layout id, so the next operation read another layout (tsem raised
    IndexError, or ran a Partial as a Shard)."""
    mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
    g = np.random.default_rng(0).normal(size=(11, 3))
    np.mean(mt.distribute_tensor(g, mesh, [mt.Shard(0)]), axis=0)
    x = mt.distribute_tensor(g, mesh, [mt.Shard(0)])
    with recording_gathers(record_property):
        for kw in ({"axis": 0}, {"axis": 0, "limits": (-1, 1)}):
            for f in (st.tvar, st.tstd, st.tsem):
                _same(f(x, **kw), f(g, **kw))


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() % 2, reason="a (2, W // 2) mesh")
@pytest.mark.parametrize("name", ["zscore", "skew", "kurtosis", "moment", "variation",
                                  "tvar", "sem", "gmean", "ttest_1samp", "ttest_ind",
                                  "pearsonr"])
@pytest.mark.parametrize("placements", ["S0S1", "S0R", "RS0"])
def test_stats_on_a_2d_mesh(record_property, name, placements):
    """SciPy makes some constants with ``device=x.device``: they land on ``x``'s
    mesh, a 2-D one here, whose arrays SciPy then combines with them; others
    without a device, on the default mesh, whose replicas then join ``x``'s."""
    mesh = mt.init_device_mesh("cpu", (2, MPI.COMM_WORLD.Get_size() // 2))
    f = getattr(st, name)
    call = _STATS[name] or (lambda f, a: f(a, axis=0))
    pls = {"S0S1": [mt.Shard(0), mt.Shard(1)], "S0R": [mt.Shard(0), mt.Replicate()],
           "RS0": [mt.Replicate(), mt.Shard(0)]}[placements]
    with recording_gathers(record_property):
        got = call(f, mt.distribute_tensor(X, mesh, pls))
    _same(got, call(f, X))


@pytest.mark.skipif(MPI.COMM_WORLD.Get_size() % 2, reason="a (2, W // 2) mesh")
@pytest.mark.parametrize("name", ["iqr", "rankdata"])
def test_stats_on_a_2d_mesh_made_the_default_one(record_property, name):
    """SciPy makes some arrays with neither data nor a device (``xp.ones``,
    ``xp.arange``), sharded on the default mesh: under ``with mesh:`` that is the
    data's mesh, where they join it."""
    mesh = mt.init_device_mesh("cpu", (2, MPI.COMM_WORLD.Get_size() // 2))
    f = getattr(st, name)
    with recording_gathers(record_property), mesh:
        got = f(mt.distribute_tensor(X, mesh, [mt.Shard(0), mt.Shard(1)]), axis=0)
    _same(got, f(X, axis=0))
