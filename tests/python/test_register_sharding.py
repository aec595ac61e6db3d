"""experimental.register_sharding: a function with no built-in rule (np.nancumsum) works
once a rule is registered; a registered rule overrides a built-in one; the cheapest
reachable strategy is chosen on 1-D and 2-D meshes; results equal NumPy on the full
arrays."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor import _registry
from mpitensor.debug import CommDebugMode
from mpitensor.experimental import clear_sharding_registry, register_sharding
from ops_helpers import W, assert_matches, make, mesh_of, mesh_shapes

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")


@pytest.fixture(autouse=True)
def _clean_registry():
    clear_sharding_registry()
    yield
    clear_sharding_registry()


def register_cumsum():
    calls = []

    @register_sharding(np.nancumsum)
    def cumsum_sharding(x, axis=None):
        calls.append(axis)
        rules = [([R], [R])]
        for d in range(x.ndim):
            if axis is not None and d != axis % x.ndim:
                rules.append(([Shard(d)], [Shard(d)]))
        return rules

    return calls


def full(shape, dtype=np.float64):
    return np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape) + 1


def test_no_rule_then_rule(monkeypatch):
    mesh = mesh_of((W,))
    a = full((8, 6))
    x = make(a, mesh, (S0,))
    # Without mpitensor's own rule, as a function nobody wrote a rule for.
    monkeypatch.delitem(_registry.functions, np.nancumsum, raising=False)
    with mt.strict(), pytest.raises(TypeError, match="nancumsum"):
        np.nancumsum(x, axis=1)
    calls = register_cumsum()
    with CommDebugMode() as comm:
        y = np.nancumsum(x, axis=1)
    assert comm.get_total_counts() == 0
    assert y.placements == ((S0,) if W > 1 else (R,))
    assert_matches(y, np.nancumsum(a, axis=1))
    np.nancumsum(x, axis=1)
    assert calls == [1]  # cached on the second call


@pytest.mark.parametrize("shape", [(5, 7), (3, 4), (W * 2, 3)])
@pytest.mark.parametrize("pl", [S0, S1, R, PS])
def test_cumsum_matches_numpy_1d(shape, pl):
    mesh = mesh_of((W,))
    register_cumsum()
    a = full(shape)
    x = make(a, mesh, (pl,))
    for axis in (0, 1, -1):
        y = np.nancumsum(x, axis=axis)
        assert_matches(y, np.nancumsum(a, axis=axis))
        if W > 1 and pl == S0 and axis != 0:
            assert y.placements == (S0,)  # kept: no communication
        if W > 1 and pl == S0 and axis == 0:
            assert y.placements != (S0,)  # S1 (an all-to-all) or R, the cheaper


@pytest.mark.parametrize("mesh_shape", mesh_shapes())
def test_cumsum_all_placements(mesh_shape):
    mesh = mesh_of(mesh_shape)
    register_cumsum()
    a = full((5, 6))
    options = [R, S0, S1, PS]
    for pls in itertools.product(options, repeat=mesh.ndim):
        x = make(a, mesh, pls)
        for axis in (0, 1):
            assert_matches(np.nancumsum(x, axis=axis), np.nancumsum(a, axis=axis))


def test_uneven_sharded_output_shape():
    mesh = mesh_of((W,))
    register_cumsum()
    a = full((2 * W + 1, 3))
    y = np.nancumsum(make(a, mesh, (S0,)), axis=1)
    assert y.shape == a.shape
    assert_matches(y, np.nancumsum(a, axis=1))


def test_override_builtin_add():
    mesh = mesh_of((W,))
    a, b = full((8, 4)), full((8, 4)) * 2
    x, y = make(a, mesh, (S0,)), make(b, mesh, (S0,))
    with CommDebugMode() as comm:
        z = x + y
    assert comm.get_total_counts() == 0
    builtin = z.placements

    @register_sharding(np.add)
    def add_sharding(a, b, **kwargs):
        return [([R], [R, R])]

    with CommDebugMode() as comm:
        z = x + y
    if W > 1:
        assert comm.get_total_counts() > 0
    assert z.placements == (R,)
    assert_matches(z, a + b)
    assert_matches(np.add(x, 3.0), a + 3.0)  # scalar argument: entry count by DTensors
    clear_sharding_registry(np.add)
    assert (x + y).placements == builtin  # built-in rule again


def test_concatenate_list_argument():
    mesh = mesh_of((W,))
    a, b = full((4, 3)), full((4, 5))

    @register_sharding(np.concatenate)
    def cat_sharding(arrays, axis=0):
        n = len(arrays)
        rules = [([R], [R] * n)]
        if axis != 0:
            rules.append(([S0], [S0] * n))
        return rules

    x, y = make(a, mesh, (S0,)), make(b, mesh, (S0,))
    with CommDebugMode() as comm:
        z = np.concatenate([x, y], axis=1)
    assert comm.get_total_counts() == 0
    assert_matches(z, np.concatenate([a, b], axis=1))
    assert_matches(np.concatenate((x, x), axis=0), np.concatenate([a, a], axis=0))


def test_partial_only_when_already_partial():
    mesh = mesh_of((W,))
    a = full((4, 4))

    @register_sharding(np.negative)
    def neg_sharding(x, **kwargs):
        return [([PS], [PS]), ([R], [R])]

    y = -make(a, mesh, (R,))
    assert y.placements == (R,)
    assert_matches(y, -a)
    x = make(a, mesh, (PS,))
    with CommDebugMode() as comm:
        y = -x
    assert comm.get_total_counts() == 0
    assert y.placements == (PS,)
    assert_matches(y, -a)


def test_errors():
    mesh = mesh_of((W,))
    x = make(full((4, 4)), mesh, (S0,))

    @register_sharding(np.nancumsum)
    def bad(x, axis=None):
        return [([R], [R, R, R])]

    with pytest.raises(ValueError, match="input placements"):
        np.nancumsum(x, axis=1)
    register_sharding(np.add)(lambda a, b, **k: [([R], [R, R])])
    # A plain operand is replicated once the ranks agree on it, the user's rule too.
    assert_matches(np.add(x, np.ones((4, 4))), full((4, 4)) + 1.0)
