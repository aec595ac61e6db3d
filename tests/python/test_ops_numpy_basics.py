"""Scalars and conversions (float/int/bool/complex, item, tolist), the *_like
factories, np.round, np.isclose/allclose/array_equal on DTensors, and the TypeErrors
that name the right function: each equal to NumPy on the full array at any mesh,
even and uneven shards, with the communication each claims."""

from __future__ import annotations

import numpy as np
import pytest

from mpitensor import DTensor, Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from mpitensor.experimental import implicit_replication
from mpi_helpers import raised
from ops_helpers import W, assert_matches, make, mesh_of, mesh_shapes

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")
LAYOUTS = [(S0,), (R,), (PS,)]
SHAPES = [(W * 2, 3), (W + 1, 3), (1, 5), (3, 1)]


@pytest.mark.parametrize("pls", LAYOUTS)
@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.complex128])
def test_scalar_conversions(pls, dtype):
    mesh = mesh_of((W,))
    full = (np.arange(W + 3) * 3 - 4).astype(dtype)
    dt = make(full, mesh, pls)
    for i in (0, W, -1):
        assert dt.item(i) == full.item(i)
        assert type(dt.item(i)) is type(full.item(i))
    assert dt.tolist() == full.tolist()
    if np.dtype(dtype).kind == "f":  # in grad mode too: a Python list, no recursion
        assert make(full, mesh, pls).requires_grad_(True).tolist() == full.tolist()
    total = dt.sum()
    assert total.item() == full.sum().item()
    assert complex(total) == complex(full.sum())
    if dtype is not np.complex128:
        assert float(total) == float(full.sum())
        assert int(dt.max()) == int(full.max())
    one = dt[W:W + 1]
    assert bool(one) == bool(full[W:W + 1])
    # NumPy's rules for the other shapes, on every rank alike, before anything moves.
    with CommDebugMode() as mode:
        assert raised(lambda: float(dt), TypeError, "0-dimensional") is True
        assert raised(lambda: float(one), TypeError, "0-dimensional") is True
        assert raised(lambda: bool(dt), ValueError, "ambiguous") is True
        assert raised(lambda: dt.item(), ValueError, "size 1") is True
        assert raised(lambda: dt.item(W + 3), IndexError) is True
    assert mode.get_total_counts() == 0


def test_scalar_of_a_sharded_element_moves_one_element():
    mesh = mesh_of((W,))
    dt = make(np.arange(4.0 * W), mesh, [S0])
    with CommDebugMode() as mode:
        assert dt.item(4 * W - 1) == 4.0 * W - 1
    assert sum(mode.get_comm_bytes().values()) <= 8 * W


@pytest.mark.parametrize("name", ["zeros_like", "ones_like", "empty_like", "full_like"])
@pytest.mark.parametrize("shape", SHAPES)
def test_like_factories_keep_placements_without_communication(name, shape):
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        pls = (S0,) if mesh.ndim == 1 else (S1, PS)
        full = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
        dt = make(full, mesh, pls)
        func = getattr(np, name)
        args = (7,) if name == "full_like" else ()
        with CommDebugMode() as mode:
            out = func(dt, *args)
            out64 = func(dt, *args, dtype=np.int64)
        assert mode.get_total_counts() == 0
        assert out.placements == tuple(R if p.is_partial() else p for p in pls)
        assert out.to_local().shape == dt.to_local().shape
        assert out.dtype == np.float32 and out64.dtype == np.int64
        if name != "empty_like":
            assert_matches(out, func(full, *args))
            assert_matches(out64, func(full, *args, dtype=np.int64))
        else:
            assert out.full_tensor().shape == shape


@pytest.mark.parametrize("pls", LAYOUTS)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_and_comparisons_match_numpy(pls, shape):
    mesh = mesh_of((W,))
    rng = np.random.default_rng(7)
    # Dyadic values: Partial parts (see ops_helpers.make) sum to them exactly.
    full = rng.integers(-8000, 8000, size=shape) / 64
    dt = make(full, mesh, pls)
    for decimals in (0, 2, -1):
        assert_matches(np.round(dt, decimals), np.round(full, decimals))
        assert_matches(np.around(dt, decimals), np.around(full, decimals))
    near = make(full * (1 + 1e-9), mesh, pls)
    far = full.copy()
    far[-1, -1] += 1.0
    far_dt = make(far, mesh, [S0])
    assert_matches(np.isclose(dt, near), np.isclose(full, full * (1 + 1e-9)))
    assert_matches(np.isclose(dt, 0.5, atol=100), np.isclose(full, 0.5, atol=100))
    assert np.allclose(dt, near) is True
    assert np.allclose(dt, far_dt) is False
    assert np.allclose(dt, far_dt, atol=2.0) is True
    assert np.array_equal(dt, make(full, mesh, [R])) is True
    assert np.array_equal(dt, far_dt) is False
    assert np.array_equal(dt, make(np.zeros((shape[0] + 1, shape[1])), mesh, [R])) is False


def test_array_equal_nan_and_flag_cost():
    mesh = mesh_of((W,))
    full = np.arange(3.0 * W + 1)
    full[1] = np.nan
    a, b = make(full, mesh, [S0]), make(full, mesh, [S0])
    with CommDebugMode() as mode:
        assert np.array_equal(a, b) is False
        assert np.array_equal(a, b, equal_nan=True) is True
        assert np.allclose(a, b, equal_nan=True) is True
    counts = mode.get_comm_counts()
    # Same layouts: nothing moves but one int32 flag per call.
    assert set(counts) <= {"all_reduce"}
    assert sum(mode.get_comm_bytes().values()) <= 3 * 4 * (1 if W > 1 else 0) * 2


@pytest.mark.usefixtures("strict_numpy")
def test_errors_name_the_function_and_implicit_replication():
    mesh = mesh_of((W,))
    dt = make(np.ones((W, 2)), mesh, [S0])
    sq = make(np.eye(2 * W), mesh, [S0])  # eig has no distributed engine
    assert raised(lambda: np.linalg.eig(sq), TypeError, r"numpy\.linalg\.eig") is True
    assert raised(lambda: np.roots(make(np.ones(3), mesh, [S0])), TypeError,
                  r"numpy\.roots has no") is True
    assert raised(lambda: dt + np.array([object(), object()]), TypeError,
                  r"implicit_replication\(\)") is True
    with implicit_replication():
        assert_matches(make(np.ones((W, 2)), mesh, [R]) + np.ones((W, 2)),
                       np.full((W, 2), 2.0))


def test_methods_with_a_function_form():
    mesh = mesh_of((W,))
    full = np.random.default_rng(9).integers(-50, 50, size=(W + 2, 4)) / 8
    dt = make(full, mesh, [S0])
    assert_matches(dt.cumsum(0), full.cumsum(0))
    assert_matches(dt.cumprod(1), full.cumprod(1))
    assert_matches(dt.argsort(axis=1, kind="stable"), full.argsort(axis=1, kind="stable"))
    assert_matches(dt.round(1), full.round(1))
