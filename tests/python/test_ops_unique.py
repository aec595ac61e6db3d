"""np.unique of DTensors (values, return_index, return_inverse, return_counts) and
np.union1d:
NumPy's values and dtypes on every rank for every layout of the suite's meshes
(Partial included) on corner and uneven shapes, NaNs counted once; a sharded
input is never gathered: past the sample sort's gather threshold the all-gathers
carry a few numbers per rank, not the array."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor
from mpitensor import Replicate, Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import CORNER_SHAPES, W, corner_layouts, make, mesh_of

R, S0 = Replicate(), Shard(0)
FLAGS = [(False, False, False), (True, True, True), (False, False, True), (True, False, False),
         (False, True, False)]


def same(got, want):
    got = got if isinstance(got, tuple) else (got,)
    want = want if isinstance(want, tuple) else (want,)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        f = g.full_tensor()
        assert f.dtype == w.dtype and f.shape == w.shape, (f.dtype, w.dtype, f.shape, w.shape)
        np.testing.assert_array_equal(f, w)


def one_mesh_dim(mesh, pls):
    return sum(1 for m, p in enumerate(pls) if p.is_shard() and mesh.shape[m] > 1) <= 1


@pytest.mark.parametrize("shape", CORNER_SHAPES + ((7,), (5, 4), (3, 5, 2)), ids=str)
def test_unique_every_layout(shape):
    rng = np.random.default_rng(len(shape))
    full = rng.integers(-2, 3, size=shape).astype(np.int64)
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        with warnings.catch_warnings():
            if one_mesh_dim(mesh, pls):
                warnings.simplefilter("error", GatherWarning)
            else:
                warnings.simplefilter("ignore", GatherWarning)
            for flags in FLAGS:
                same(np.unique(dt, *flags), np.unique(full, *flags))


@pytest.mark.parametrize("n", [0, 1, 4, 13, 5000])
def test_unique_floats_with_nans(n):
    rng = np.random.default_rng(n)
    full = np.where(rng.random(n) < 0.3, np.nan, rng.integers(0, 3, n).astype(np.float32))
    mesh = mesh_of((W,))
    for pls in [(S0,), (R,)]:
        dt = make(full, mesh, pls)
        with warnings.catch_warnings(), mpitensor.strict():
            warnings.simplefilter("error", GatherWarning)
            for flags in FLAGS:
                same(np.unique(dt, *flags), np.unique(full, *flags))


def test_unique_of_a_large_array_gathers_only_numbers_per_rank():
    mesh = mesh_of((W,))
    full = np.random.default_rng(5).integers(0, 50, 40000)
    dt = make(full, mesh, [S0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        with CommDebugMode() as mode:
            got = np.unique(dt, return_index=True, return_inverse=True, return_counts=True)
    same(got, np.unique(full, return_index=True, return_inverse=True, return_counts=True))
    gathered = sum(b for k, b in mode.get_comm_bytes().items() if "gather" in k)
    assert gathered < 64 * W * W, mode.get_comm_bytes()
    if W > 1:
        assert got[0].placements == (S0,)


@pytest.mark.parametrize("n", [0, 1, 5, 13])
def test_union1d(n):
    full = np.arange(n) % 4 * 2
    other = np.arange(3 * n).reshape(n, 3) % 5
    for mesh, pls in corner_layouts(1):
        a = make(full, mesh, pls)
        b = make(other, mesh, pls)
        with warnings.catch_warnings():
            if one_mesh_dim(mesh, pls):
                warnings.simplefilter("error", GatherWarning)
            else:
                warnings.simplefilter("ignore", GatherWarning)
            same(np.union1d(a, [1, 9]), np.union1d(full, [1, 9]))
            same(np.union1d(a, b), np.union1d(full, other))


def test_forms_without_a_rule_give_numpys_answer():
    mesh = mesh_of((W,))
    full = np.array([3, 1, 2, 1, 3, 0])
    dt = make(full, mesh, [S0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", GatherWarning)
        same(np.unique(dt, sorted=False), np.unique(full, sorted=False))
        same(np.unique(make(full.reshape(2, 3), mesh, [S0]), axis=1),
             np.unique(full.reshape(2, 3), axis=1))
