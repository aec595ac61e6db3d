"""mpitensor.testing: assert_close / assert_equal compare DTensors shard by shard
against arrays or DTensors, raise the same AssertionError on every rank of the mesh,
and say which global index, which rank and which placements."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard
from mpitensor.testing import assert_close, assert_equal
from mpi_helpers import Problems, all_ranks, raised

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
G = np.arange(32.0).reshape(8, 4)


def failure(call) -> str | None:
    """The AssertionError message of call(), or None when it passed. Collective
    calls run to the end on every rank either way."""
    try:
        call()
    except AssertionError as e:
        return str(e)
    return None


@pytest.mark.parametrize("placements", [[Shard(0)], [Shard(1)], [Replicate()]],
                         ids=["S0", "S1", "R"])
def test_equal_values_pass_against_arrays_and_dtensors(mesh, placements):
    x = mt.distribute_tensor(G, mesh, placements)
    assert_equal(x, G)
    assert_close(x, G)
    assert_equal(G, x)  # the DTensor may stand on either side
    assert_equal(x, x.redistribute(mesh, [Shard(1)]))
    assert_close(x * (1 + 1e-9), G)  # within float64's default rtol of 1e-7


def test_partial_is_reduced_before_comparing(mesh):
    x = DTensor.from_local(np.ones((3, 2)), mesh, [Partial()])
    assert_equal(x, np.full((3, 2), float(W)))
    assert all_ranks(failure(lambda: assert_equal(x, np.ones((3, 2)))) is not None or W == 1)


def test_one_wrong_element_fails_on_every_rank_naming_index_rank_placements(mesh):
    x = mt.distribute_tensor(G, mesh, [Shard(0)])
    expected = G.copy()
    expected[7, 2] += 1.0  # row 7 is on the last rank that holds rows
    holder = min(W - 1, 7 // -(-8 // W))
    text = failure(lambda: assert_close(x, expected))
    problems = Problems()
    problems.expect(text is not None, "no AssertionError on this rank")
    text = text or ""
    for piece in ("Not equal to tolerance rtol=1e-07, atol=1e-07", "[Shard(dim=0)]",
                  "Mismatched elements: 1 / 32 (3.12%)", f"global index (7, 2) on rank {holder}",
                  "actual 30.0, expected 31.0", "Max absolute difference among violations: 1"):
        problems.expect(piece in text, f"{piece!r} not in:\n{text}")
    assert problems == []


def test_expected_that_differs_on_one_rank_still_fails_everywhere(mesh):
    x = mt.distribute_tensor(G, mesh, [Replicate()])
    expected = G + (1.0 if RANK == 0 else 0.0)
    text = failure(lambda: assert_equal(x, expected))
    assert all_ranks(text is not None and "on rank 0" in text)


def test_dtensor_against_dtensor_on_another_placement(mesh):
    x = mt.distribute_tensor(G, mesh, [Shard(0)])
    y = mt.distribute_tensor(G + np.eye(8, 4), mesh, [Shard(1)])
    text = failure(lambda: assert_equal(x, y)) or ""
    assert all_ranks("Mismatched elements: 4 / 32" in text and "[Shard(dim=1)]" in text)


def test_shape_and_dtype_mismatches(mesh):
    x = mt.distribute_tensor(G, mesh, [Shard(0)])
    problems = Problems()
    problems.expect(raised(lambda: assert_equal(x, G[:3]), AssertionError,
                           r"shapes \(8, 4\), \(3, 4\) mismatch"), "shape")
    problems.expect(raised(lambda: assert_equal(x, G.astype(np.float32)), AssertionError,
                           "dtypes float64, float32 mismatch"), "dtype")
    problems.expect(raised(lambda: assert_equal(x, mt.distribute_tensor(G[:4], mesh, [Shard(0)])),
                           AssertionError, "mismatch"), "DTensor shape")
    assert_equal(x, G.astype(np.int64), check_dtype=False)
    assert_equal(x, G.tolist())  # a list takes the DTensor's dtype
    assert_equal(mt.zeros(5, device_mesh=mesh, placements=[Shard(0)]), 0.0)  # 0-d broadcasts
    problems.expect(raised(lambda: assert_close(x, G, rtol=1e-3), ValueError,
                           "both rtol and atol"), "rtol without atol")
    assert problems == []


def test_tolerances_follow_the_dtype(mesh):
    x = mt.distribute_tensor(G.astype(np.float32), mesh, [Shard(0)])
    near = (G * (1 + 1e-6)).astype(np.float32)
    assert_close(x, near)  # float32: rtol 1.3e-6
    text = failure(lambda: assert_close(x, near, rtol=0, atol=0)) or ""
    assert all_ranks("rtol=0, atol=0" in text)
    assert all_ranks(failure(lambda: assert_equal(x, near)) is not None)


def test_nan(mesh):
    g = G.copy()
    g[3, 1] = np.nan
    x = mt.distribute_tensor(g, mesh, [Shard(0)])
    assert_equal(x, g)  # NaNs in the same places are equal, as in numpy.testing
    assert_close(x, g, equal_nan=True)
    text = failure(lambda: assert_close(x, g)) or ""
    assert all_ranks("global index (3, 1)" in text)


def test_ranks_outside_the_mesh_return_at_once():
    one = mt.DeviceMesh("cpu", [0])
    x = mt.distribute_tensor(G, one, [Replicate()])
    text = failure(lambda: assert_equal(x, G + 1))
    assert (text is not None) == (RANK == 0)


def test_without_dtensors_it_is_a_local_numpy_comparison():
    assert_close(np.ones(3), np.ones(3) + 1e-9)
    with pytest.raises(AssertionError, match=r"global index \(1,\): actual 1.0, expected 2.0"):
        assert_close(np.ones(3), np.array([1.0, 2.0, 1.0]))


@pytest.mark.mpi(ranks=4, mesh_shape=(2, 2))
def test_a_wrong_replica_is_named_by_rank(mesh):
    # [Shard(0), Replicate()] on a (2, 2) mesh: ranks 0 and 1 hold rows 0..3, ranks 2
    # and 3 rows 4..7; rank 3's copy is wrong.
    local = G[4 * mesh.get_coordinate()[0]:][:4].copy()
    if RANK == 3:
        local[1, 1] = -1.0
    x = DTensor.from_local(local, mesh, [Shard(0), Replicate()])
    text = failure(lambda: assert_equal(x, G)) or ""
    problems = Problems()
    for piece in ("Replicas differ", "rank 3: 1 of 16", "global index (5, 1) on rank 3",
                  "mesh coordinate [1, 1]", "[Shard(dim=0), Replicate()]"):
        problems.expect(piece in text, f"{piece!r} not in:\n{text}")
    assert problems == []


@pytest.mark.mpi(ranks=2)
def test_mesh_fixture_spans_the_ranks_of_the_marker(mesh):
    assert mesh.shape == (2,) and W == 2
    assert_equal(mt.ones(3, 4, device_mesh=mesh, placements=[Shard(1)]), np.ones((3, 4)))


def test_a_tensor_that_records_compares_with_its_own_full_tensor(mesh):
    """In grad mode full_tensor() of a tensor that requires grad is a local array
    that records (a DTensor on the local mesh): compared as that array."""
    full = np.arange(12.0).reshape(4, 3)
    w = mt.distribute_tensor(full, mesh, [Shard(0)], requires_grad=True)
    whole = w.full_tensor()
    assert whole.requires_grad
    assert_equal(w, whole)
    assert_close(whole * 2.0, 2 * full)
    with pytest.raises(AssertionError):
        assert_equal(w, whole + 1.0)
