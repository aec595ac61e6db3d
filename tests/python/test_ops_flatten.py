"""roll, flip, cumsum, cumprod and concatenate with ``axis=None`` (NumPy's
flattened array) on n-D DTensors: NumPy's values on every rank for every layout
of the suite's meshes (Partial included) on corner and uneven shapes, the flat
order reached by exchanges of runs of elements (``_flatten``), never a gather:
no GatherWarning, nothing reported gathered, and the collectives counted."""

from __future__ import annotations

import contextlib
import warnings

import numpy as np
import pytest

import mpitensor
from mpitensor import Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make,
                         matches_or_raises_alike, mesh_of)
from test_ops_unique import one_mesh_dim

R, S0, S1 = Replicate(), Shard(0), Shard(1)
SHAPES = tuple(s for s in CORNER_SHAPES if len(s) > 1) + ((7, 5), (3, 5, 2), (2, 9))


@contextlib.contextmanager
def no_gather(mesh, pls):
    """Strict mode, and every gather an operation reports made an error, unless
    two mesh dims shard the input (then one of them is gathered along)."""
    before = mpitensor.set_gather_warning(True)
    try:
        with warnings.catch_warnings(), mpitensor.strict():
            warnings.simplefilter("error" if one_mesh_dim(mesh, pls) else "ignore",
                                  UserWarning)
            yield
    finally:
        mpitensor.set_gather_warning(before)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_flattened_forms_every_layout(shape):
    full = (np.arange(int(np.prod(shape))) % 7 + 1).reshape(shape).astype(np.float64)
    other = np.arange(4.0)
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        do = make(other, mesh, [S0 if p.is_shard() else R for p in pls])
        with no_gather(mesh, pls):
            for shift in (0, 3, -11, (2, 5)):
                assert_matches(np.roll(dt, shift), np.roll(full, shift))
            assert_matches(np.flip(dt), np.flip(full))
            assert_matches(np.cumsum(dt), np.cumsum(full))
            # Integer products wrap alike in any grouping: exact against NumPy.
            assert_matches(np.cumprod(dt, dtype=np.int64), np.cumprod(full, dtype=np.int64))
            assert_matches(np.concatenate([dt, do, dt], axis=None),
                           np.concatenate([full, other, full], axis=None))


@pytest.mark.parametrize("pl", [S0, S1], ids=str)
def test_flattened_roll_and_flip_count_their_exchanges(pl):
    full = np.arange(7 * 5.0).reshape(7, 5)
    dt = make(full, mesh_of((W,)), [pl])
    with CommDebugMode() as mode:
        rolled = np.roll(dt, 4)
    assert_matches(rolled, np.roll(full, 4))
    if W > 1:
        assert rolled.placements == (pl,)
    with CommDebugMode() as flip_mode:
        flipped = np.flip(dt)
    assert_matches(flipped, np.flip(full))
    counts = mode.get_comm_counts()
    assert not any("gather" in k for k in counts), counts
    assert dict(flip_mode.get_comm_counts()) == dict(counts)
    if W > 1 and pl == S0:
        # To flat order, the roll, and back: one exchange (two all-to-alls) each.
        assert dict(counts) == {"all_to_all_single": 6}
    if W == 1:
        assert mode.get_total_counts() == 0


def test_flattened_scan_of_uneven_rows_is_one_exchange_and_the_scan():
    full = np.arange(7 * 3, dtype=np.int64).reshape(7, 3) % 5
    dt = make(full, mesh_of((W,)), [S0])
    with CommDebugMode() as mode:
        got = np.cumsum(dt)
    assert_matches(got, np.cumsum(full))
    counts = mode.get_comm_counts()
    assert not any("gather" in k for k in counts), counts
    if W > 1 and 7 % W:
        assert got.placements == (S0,)
        assert counts["all_to_all_single"] == 2


def test_bad_arguments_raise_numpys_errors_on_every_rank():
    full = np.arange(12.0).reshape(3, 4)
    dt = make(full, mesh_of((W,)), [S1])
    for shift in (1.5, "a", [[1, 2]]):
        matches_or_raises_alike(lambda: np.roll(dt, shift), lambda: np.roll(full, shift))
    with pytest.raises(ValueError), warnings.catch_warnings():
        # out= has no rule: the fallback answers, with NumPy's error.
        warnings.simplefilter("ignore", UserWarning)
        np.concatenate([dt, make(full, mesh_of((W,)), [S0])], axis=None, out=np.zeros(3))
