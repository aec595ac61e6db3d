"""np.take, np.searchsorted, np.repeat, np.kron, np.delete, np.compress and
np.extract of DTensors: NumPy's value and dtype on every rank for every layout of
the suite's meshes (Partial included) on corner and uneven lengths, with nothing
gathered (strict mode, GatherWarning as an error); along a sharded axis the
picked, repeated, kept or Kronecker rows move once (one exchange), searchsorted
moves nothing and answers with a Partial(sum) of local searches."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import mpitensor
from mpitensor import Partial, Replicate, Shard
from mpitensor._ops._fallback import GatherWarning
from mpitensor.debug import CommDebugMode
from ops_helpers import (W, assert_matches, corner_layouts, make, matches_or_raises_alike,
                         mesh_of)

R, S0, S1 = Replicate(), Shard(0), Shard(1)
LENGTHS = (1, 2, 3, 5, 9)


def strictly(check):
    with warnings.catch_warnings(), mpitensor.strict():
        warnings.simplefilter("error", GatherWarning)
        check()


@pytest.mark.parametrize("n", LENGTHS)
def test_take(n):
    vec = (np.arange(n) ** 2).astype(np.int32)
    mat = np.arange(n * 4.0).reshape(n, 4)
    for mesh, pls in corner_layouts(1):
        dv = make(vec, mesh, pls)

        def check():
            for idx in ([0], [n - 1, 0, n - 1], np.array([[0, 1], [1, 0]]) % n, [], -1, [-n]):
                assert_matches(np.take(dv, idx), np.take(vec, idx))
            for mode in ("wrap", "clip"):
                assert_matches(np.take(dv, [n + 3, -7], mode=mode),
                               np.take(vec, [n + 3, -7], mode=mode))
        strictly(check)
    for mesh, pls in corner_layouts(2):
        dm = make(mat, mesh, pls)

        def check2():
            assert_matches(np.take(dm, [3, 0], axis=1), np.take(mat, [3, 0], axis=1))
            assert_matches(np.take(dm, [[0, n - 1]], axis=0), np.take(mat, [[0, n - 1]], axis=0))
            assert_matches(np.take(dm, [0, n - 1]), np.take(mat, [0, n - 1]))
        strictly(check2)


def test_take_errors_on_every_rank():
    mesh = mesh_of((W,))
    full = np.arange(5.0)
    dt = make(full, mesh, [S0])
    matches_or_raises_alike(lambda: np.take(dt, [5]), lambda: np.take(full, [5]))
    matches_or_raises_alike(lambda: np.take(dt, [1], mode="bogus"),
                            lambda: np.take(full, [1], mode="bogus"))
    empty = make(np.zeros(0), mesh, [S0])
    matches_or_raises_alike(lambda: np.take(empty, [0]), lambda: np.take(np.zeros(0), [0]))


@pytest.mark.parametrize("n", LENGTHS + (0,))
def test_searchsorted(n):
    full = np.sort(np.random.default_rng(n).integers(0, 5, n)).astype(np.float64)
    queries = np.arange(-1.0, 7.0).reshape(2, 4)
    for mesh, pls in corner_layouts(1):
        dt = make(full, mesh, pls)
        dq = make(queries.reshape(-1), mesh, pls[::-1])

        def check():
            for side in ("left", "right"):
                for v in (2.0, [0.0, 1.0, 4.0, 9.0], queries):
                    assert_matches(np.searchsorted(dt, v, side), np.searchsorted(full, v, side))
                assert_matches(np.searchsorted(dt, dq, side=side),
                               np.searchsorted(full, queries.reshape(-1), side=side))
        strictly(check)


def test_searchsorted_moves_nothing():
    mesh = mesh_of((W,))
    full = np.sort(np.random.default_rng(0).random(1000))
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        got = np.searchsorted(dt, [0.1, 0.5, 0.9])
    assert mode.get_total_counts() == 0
    assert got.placements == ((Partial("sum"),) if W > 1 else (R,))
    assert_matches(got, np.searchsorted(full, [0.1, 0.5, 0.9]))


@pytest.mark.parametrize("n", LENGTHS + (0,))
def test_repeat(n):
    vec = np.arange(n, dtype=np.int16) - 2
    mat = np.arange(n * 3.0).reshape(n, 3)
    for mesh, pls in corner_layouts(1):
        dv = make(vec, mesh, pls)

        def check():
            for r in (0, 1, 3, np.arange(n) % 3):
                assert_matches(np.repeat(dv, r), np.repeat(vec, r))
            counts = make(np.arange(n) % 3, mesh, pls[::-1])
            assert_matches(np.repeat(dv, counts), np.repeat(vec, np.arange(n) % 3))
        strictly(check)
    for mesh, pls in corner_layouts(2):
        dm = make(mat, mesh, pls)

        def check2():
            for axis in (0, 1, None):
                assert_matches(np.repeat(dm, 2, axis=axis), np.repeat(mat, 2, axis=axis))
            assert_matches(np.repeat(dm, np.arange(n) % 2, axis=0),
                           np.repeat(mat, np.arange(n) % 2, axis=0))
        strictly(check2)


def test_repeat_errors_on_every_rank():
    mesh = mesh_of((W,))
    full = np.arange(3.0)
    dt = make(full, mesh, [S0])
    matches_or_raises_alike(lambda: np.repeat(dt, -1), lambda: np.repeat(full, -1))
    matches_or_raises_alike(lambda: np.repeat(dt, [1, 2]), lambda: np.repeat(full, [1, 2]))


@pytest.mark.parametrize("shape", [(1,), (5,), (3, 2), (0, 2), (5, 3)], ids=str)
def test_kron(shape):
    full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) - 1
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)

        def check():
            for other in (np.ones((2, 3)), np.arange(3), np.array([[1.5]])):
                if other.ndim <= len(shape):
                    assert_matches(np.kron(dt, other), np.kron(full, other))
            assert_matches(np.kron(dt, make(np.arange(2), mesh, [R] * mesh.ndim)),
                           np.kron(full, np.arange(2)))
        strictly(check)


def test_rows_move_once():
    mesh = mesh_of((W,))
    full = np.arange(1000.0)
    dt = make(full, mesh, [S0])
    def chunks(n):
        size = -(-n // W)
        return [min(size, max(0, n - i * size)) for i in range(W)]

    # A repeat whose repeated blocks are already torch.chunk's blocks of the output
    # moves nothing at all.
    aligned = [2 * c for c in chunks(1000)] == chunks(2000)
    cases = [(lambda x: np.repeat(x, 2), lambda x: np.repeat(x, 2), 0 if aligned else 2),
             (lambda x: np.kron(x, np.ones(2)), lambda x: np.kron(x, np.ones(2)), 2),
             (lambda x: np.take(x, np.arange(999, -1, -2)), lambda x: x[999::-2], 2)]
    for ours, numpys, collectives in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("error", GatherWarning)
            with CommDebugMode() as mode:
                got = ours(dt)
        assert_matches(got, numpys(full))
        # Each output row at most once (plus counts and indices), never the whole.
        assert sum(mode.get_comm_bytes().values()) <= 2 * dt.to_local().nbytes + 8 * W
        if W > 1:
            assert got.placements == (S0,)
            assert mode.get_total_counts() == collectives


@pytest.mark.parametrize("n", LENGTHS + (0,))
def test_delete_and_compress(n):
    vec = np.arange(n, dtype=np.float32) * 2
    mat = np.arange(n * 3).reshape(n, 3)
    objs = [0, -1, [0, 0, n - 1], slice(1, None, 2), np.arange(n) % 2 == 0, []]
    for mesh, pls in corner_layouts(1):
        dv = make(vec, mesh, pls)

        def check():
            for obj in objs:
                matches_or_raises_alike(lambda: np.delete(dv, obj), lambda: np.delete(vec, obj))
            cond = np.arange(n) % 3 != 1
            assert_matches(np.compress(cond, dv), np.compress(cond, vec))
            assert_matches(np.compress(cond[:2], dv, axis=0), np.compress(cond[:2], vec, axis=0))
            assert_matches(np.extract(cond, dv), np.extract(cond, vec))
            assert_matches(np.extract(dv > 2, dv), np.extract(vec > 2, vec))
        strictly(check)
    for mesh, pls in corner_layouts(2):
        dm = make(mat, mesh, pls)

        def check2():
            for axis in (0, 1, None):
                matches_or_raises_alike(lambda: np.delete(dm, [0], axis=axis),
                                        lambda: np.delete(mat, [0], axis=axis))
            assert_matches(np.compress([True, False, True], dm, axis=1),
                           np.compress([True, False, True], mat, axis=1))
            assert_matches(np.extract(dm % 2, dm), np.extract(mat % 2, mat))
        strictly(check2)
    mesh = mesh_of((W,))
    dv = make(vec, mesh, [S0])
    matches_or_raises_alike(lambda: np.delete(dv, n + 2), lambda: np.delete(vec, n + 2))
    matches_or_raises_alike(lambda: np.compress([True] * (n + 1), dv),
                            lambda: np.compress([True] * (n + 1), vec))


def test_delete_moves_only_kept_rows():
    mesh = mesh_of((W,))
    full = np.arange(1000.0)
    dt = make(full, mesh, [S0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", GatherWarning)
        with CommDebugMode() as mode:
            got = np.delete(dt, slice(0, 100))
    assert_matches(got, full[100:])
    assert sum(mode.get_comm_bytes().values()) <= dt.to_local().nbytes + 8 * W
    if W > 1:
        assert got.placements == (S0,)
        assert mode.get_total_counts() == 2
