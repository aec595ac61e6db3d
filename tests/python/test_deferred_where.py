"""An isnan and a where whose blocks wait (mpitensor._deferred): the reduction that
reads their operands gives the eager bits, and a block something still holds is
the one the eager call gives, whatever the program writes afterwards and by
whichever way; operands another object could write are never deferred."""

from __future__ import annotations

import numpy as np
import pytest

import mpitensor as mt
import mpitensor.array_api as xp
from mpitensor import Replicate, Shard, _C, _deferred
from mpitensor._ops import _deferring
from ops_helpers import W, mesh_of

R, S0, S1 = Replicate(), Shard(0), Shard(1)
# Rows enough that every rank's block is deferred (mpitensor._ops._select) at 4 ranks.
ROWS = 20_003


@pytest.fixture
def computed(monkeypatch):
    """The names of the deferred blocks NumPy computed (an isnan known to hold no
    True is made without it)."""
    _C.settle_deferred()  # the one an earlier test left waiting
    seen = []
    compute = _deferred.Deferred._compute

    def record(self):
        if not self.nan_free:
            seen.append(self.func.__name__)
        return compute(self)
    monkeypatch.setattr(_deferred.Deferred, "_compute", record)
    return seen


def data(case, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((ROWS, 7))
    if case == "nan":
        a[rng.random(a.shape) < 0.1] = np.nan
    elif case == "zeros":
        a[rng.random(a.shape) < 0.3] = 0.0
        a[rng.random(a.shape) < 0.3] = -0.0
    elif case == "all-nan column":
        a[:, 3] = np.nan
    return a


def extreme_of_selection(x, largest, axis):
    """scikit-learn's _nanmin and _nanmax: the selection held by nothing but the call."""
    s = -np.inf if largest else np.inf
    scalar = xp.asarray(s, dtype=x.dtype, device=x.device)
    return (xp.max if largest else xp.min)(xp.where(xp.isnan(x), scalar, x),
                                           axis=axis).full_tensor()


@pytest.mark.parametrize("placement", [S0, R, S1], ids=str)
@pytest.mark.parametrize("case", ["plain", "nan", "zeros", "all-nan column"])
@pytest.mark.parametrize("largest", [False, True], ids=["min", "max"])
@pytest.mark.parametrize("axis", [0, None, 1], ids=str)
def test_the_extreme_of_a_selection_is_the_eager_one(placement, case, largest, axis,
                                                     computed, monkeypatch):
    mesh = mesh_of((W,))
    a = data(case)
    x = mt.distribute_tensor(a, mesh, [placement])
    got = extreme_of_selection(x, largest, axis)
    s = -np.inf if largest else np.inf
    want = (np.max if largest else np.min)(np.where(np.isnan(a), s, a), axis=axis)
    assert got.dtype == want.dtype and np.array_equal(got, want)
    if placement != S1:  # a shard of one column is too small to defer
        assert sorted(computed) == ([] if case in ("plain", "zeros") else ["isnan", "where"])
    # The bits are the eager where's and reduction's, the zeros' signs too (whose
    # order across ranks is the all-reduce's, not NumPy's).
    monkeypatch.setattr(_deferring, "MIN_SIZE", 1 << 62)
    assert got.tobytes() == extreme_of_selection(x, largest, axis).tobytes()


@pytest.mark.parametrize("largest", [False, True], ids=["min", "max"])
def test_the_scalar_second_and_the_method(largest, computed):
    mesh = mesh_of((W,))
    a = data("nan")
    x = mt.distribute_tensor(a, mesh, [S0])
    s = -np.inf if largest else np.inf
    picked = xp.where(~xp.isnan(x), x, s)
    extreme = (picked.max if largest else picked.min)(axis=0)
    del picked  # held, the selection is made before the next operation
    want = np.where(~np.isnan(a), a, s)
    assert np.array_equal(extreme.full_tensor(), want.max(0) if largest else want.min(0))
    assert computed == ["isnan"]  # by the ~, which takes a computed mask


def test_another_scalar_is_computed_first(computed):
    mesh = mesh_of((W,))
    a = data("nan")
    x = mt.distribute_tensor(a, mesh, [S0])
    got = xp.min(xp.where(xp.isnan(x), 5.0, x), axis=0).full_tensor()
    assert got.tobytes() == np.where(np.isnan(a), 5.0, a).min(0).tobytes()
    assert sorted(computed) == ["isnan", "where"]


WRITES = {
    "setitem": lambda x, m: x.__setitem__((slice(0, 3),), 7.0),
    "in-place operator": lambda x, m: x.__iadd__(1.0),
    "out=": lambda x, m: np.multiply(x, 2.0, out=x),
    "copyto": lambda x, m: np.copyto(x, 0.0),
    "to_local": lambda x, m: x.to_local().__setitem__(0, 9.0),
    "_local_tensor": lambda x, m: x._local_tensor.__setitem__(0, 9.0),
    "a view": lambda x, m: x[1:4].__setitem__(Ellipsis, -1.0),
    "the mask": lambda x, m: m.__setitem__(Ellipsis, True),
    "fill": lambda x, m: x.fill(2.0),
    "ufunc.at": lambda x, m: np.add.at(x, (np.array([0, 1]),), 1.0),
    "put": lambda x, m: np.put(x, [0, 5], [1.0, 2.0]),
}


@pytest.mark.parametrize("write", list(WRITES))
def test_a_held_selection_is_the_eager_one_after_any_write(write, computed):
    mesh = mesh_of((W,))
    a = data("nan")
    x = mt.distribute_tensor(a, mesh, [S0])
    mask = xp.isnan(x)
    picked = xp.where(mask, np.inf, x)
    xp.min(picked, axis=0)
    WRITES[write](x, mask)
    assert picked.full_tensor().tobytes() == np.where(np.isnan(a), np.inf, a).tobytes()
    assert sorted(computed) == ["isnan", "where"]
    assert x._local_tensor.flags.writeable and mask._local_tensor.flags.writeable
    x[0] = 3.0  # the operands take writes again
    assert x.full_tensor()[0, 0] == 3.0


def test_a_dropped_selection_is_never_made(computed):
    mesh = mesh_of((W,))
    x = mt.distribute_tensor(data("plain"), mesh, [S0])
    picked = xp.where(xp.isnan(x), np.inf, x)
    del picked
    x += 1.0
    assert computed == ["isnan"]  # a Deferred's mask is made in case it is held
    assert x._local_tensor.flags.writeable


def test_a_view_made_while_it_waits_writes_through(computed):
    mesh = mesh_of((W,))
    a = data("plain")
    x = mt.distribute_tensor(a, mesh, [S0])
    picked = xp.where(xp.isnan(x), np.inf, x)
    view = x[:5]
    view[...] = 0.0
    a[:5] = 0.0
    assert x.full_tensor().tobytes() == a.tobytes()
    assert picked.full_tensor().tobytes() == data("plain").tobytes()


def test_memory_another_array_shares_is_never_deferred(computed):
    mesh = mesh_of((W,))
    a = data("plain")
    with mesh:
        x = xp.asarray(a)  # each rank's rows are a view of a
    picked = xp.where(xp.isnan(x), np.inf, x)
    a[...] = 0.0
    assert picked.full_tensor().tobytes() == data("plain").tobytes()
    assert computed == []


def test_a_copy_by_asarray_is_deferred_on(computed):
    mesh = mesh_of((W,))
    a = data("plain")
    with mesh:
        x = xp.asarray(a, copy=True)
    got = xp.min(xp.where(xp.isnan(x), np.inf, x), axis=0).full_tensor()
    assert got.tobytes() == a.min(0).tobytes()
    assert computed == []


def test_a_raising_error_state_computes_it_now(computed):
    mesh = mesh_of((W,))
    a = data("nan")
    x = mt.distribute_tensor(a, mesh, [S0])
    with np.errstate(all="raise"):
        got = xp.min(xp.where(xp.isnan(x), np.inf, x), axis=0).full_tensor()
    assert got.tobytes() == np.where(np.isnan(a), np.inf, a).min(0).tobytes()
    assert computed == []


def test_copy_views_and_a_waiting_selection(computed):
    mesh = mesh_of((W,))
    a = data("plain")
    x = mt.distribute_tensor(a, mesh, [S0])
    picked = xp.where(xp.isnan(x), np.inf, x)
    cut = x[3:-3]  # cuts the sharded rows: at several ranks, a copy-view
    cut[...] = 0.0
    a[3:-3] = 0.0
    assert x.full_tensor().tobytes() == a.tobytes()
    assert picked.full_tensor().tobytes() == data("plain").tobytes()
    computed.clear()
    picked = xp.where(xp.isnan(x), np.inf, x)  # of memory with copy-views: made now
    cut[...] = 1.0
    assert picked.full_tensor().tobytes() == a.tobytes()
    assert computed == []  # a view or a copy-view of x: never deferred


def test_isnan_waits_by_either_name_and_gives_numpys_mask(computed):
    mesh = mesh_of((W,))
    a = data("nan")
    x = mt.distribute_tensor(a, mesh, [S0])
    for mask in (np.isnan(x), xp.isnan(x)):
        assert mask.dtype == np.bool_ and mask.placements == x.placements
        assert (mask.full_tensor() == np.isnan(a)).all()
    assert computed == ["isnan", "isnan"]


def test_a_mask_of_another_array_is_made_first(computed):
    mesh = mesh_of((W,))
    a, b = data("nan", 1), data("plain", 2)
    x, z = (mt.distribute_tensor(v, mesh, [S0]) for v in (a, b))
    got = xp.min(xp.where(xp.isnan(x), np.inf, z), axis=0).full_tensor()
    assert got.tobytes() == np.where(np.isnan(a), np.inf, b).min(0).tobytes()
    assert computed == ["isnan"]


def test_nan_to_num_by_where(computed):
    mesh = mesh_of((W,))
    a = data("nan")
    x = mt.distribute_tensor(a, mesh, [S0])
    y = np.where(np.isnan(x), 0.0, x)
    assert y.sum(axis=0).full_tensor().tobytes() == \
        mt.distribute_tensor(np.where(np.isnan(a), 0.0, a), mesh, [S0]).sum(
            axis=0).full_tensor().tobytes()
    assert sorted(computed) == ["isnan", "where"]
