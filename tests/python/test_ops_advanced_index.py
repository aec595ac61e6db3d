"""Boolean masks and integer arrays as DTensor keys: equal to NumPy on the full
array for even and uneven shapes, dtypes and placements; a sharded dim 0 gives a
``Shard(0)`` output in the usual layout by one all-to-all of the selected rows, and
an unsharded masked dim moves nothing (CommDebugMode)."""

from __future__ import annotations

import numpy as np
import pytest

from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, make, mesh_of, mesh_shapes

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")


def layouts(mesh):
    if mesh.ndim == 1:
        return [(S0,), (S1,), (R,), (PS,)]
    return [(S0, R), (R, S0), (S0, S1), (S1, S0), (PS, S0), (S0, S0)]


@pytest.mark.parametrize("rows", [1, W, 3 * W + 1])
@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.complex64])
def test_masks_and_integer_arrays_match_numpy(rows, dtype):
    full = (np.random.default_rng(rows).normal(size=(rows, 5)) * 4).astype(dtype)
    for mesh_shape in mesh_shapes():
        mesh = mesh_of(mesh_shape)
        for pls in layouts(mesh):
            dt = make(full, mesh, pls)
            ref = dt.full_tensor()
            keys = [np.abs(ref) > 2, np.abs(ref[:, 0]) > 2, np.zeros(rows, bool),
                    [rows - 1, 0, rows - 1, 0], np.array([-1] * 3 + list(range(rows))),
                    np.array([], np.int64)]
            for key in keys:
                assert_matches(dt[key], ref[key])
            assert_matches(dt[np.abs(dt) > 2], ref[np.abs(ref) > 2])
            first = [p.is_shard() and p.dim == 0 for p in pls]
            if sum(first) == 1 and mesh.shape[first.index(True)] > 1:
                got = dt[[0, rows - 1]]
                assert got.placements[first.index(True)] == S0


@pytest.mark.skipif(W == 1, reason="one rank moves nothing")
def test_mask_on_sharded_rows_moves_only_the_selected_rows():
    mesh = mesh_of((W,))
    full = np.random.default_rng(1).normal(size=(2 ** 12 + 1, 4))
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        mask = dt[:, 0] > 0.5
        got = dt[mask]
    sent = mode.get_comm_bytes()
    assert got.placements == (S0,)
    # Each rank's row count, to every peer; no gather of the data.
    assert sent["all_gather_into_tensor"] <= 8 * (W - 1)
    assert sent["all_to_all_single"] <= dt.to_local().nbytes + 2 * 8 * W
    assert_matches(got, full[full[:, 0] > 0.5])
    local = got.to_local().shape[0]
    assert local in (-(-got.shape[0] // W), got.shape[0] // W) or got.shape[0] < W


@pytest.mark.skipif(W == 1, reason="one rank moves nothing")
def test_integer_array_on_sharded_rows_sends_each_picked_row_once():
    mesh = mesh_of((W,))
    full = np.arange(4.0 * (8 * W + 3)).reshape(-1, 4)
    dt = make(full, mesh, [S0])
    idx = np.arange(full.shape[0])[::-3]
    with CommDebugMode() as mode:
        got = dt[idx]
    assert got.placements == (S0,)
    assert "all_gather_into_tensor" not in mode.get_comm_counts()
    assert mode.get_comm_bytes()["all_to_all_single"] <= len(idx) * 32 + 2 * 8 * W
    assert_matches(got, full[idx])


def test_masks_along_unsharded_dims_move_nothing():
    mesh = mesh_of((W,))
    full = np.random.default_rng(2).normal(size=(6, 2 * W + 1))
    dt = make(full, mesh, [S1])
    with CommDebugMode() as mode:
        got = dt[full[:, 0] > 0]
        taken = dt[[5, 1, 1]]
    assert mode.get_total_counts() == 0
    assert got.placements == (S1,) and taken.placements == (S1,)
    assert_matches(got, full[full[:, 0] > 0])
    assert_matches(taken, full[[5, 1, 1]])
