"""Collective mismatch detection (set_collective_checks / MPITENSOR_CHECK=1): off
by default; matching programs run unchanged; a rank that calls another
redistribute, skips a collective, calls from another line, or needs an input
redistribution the others do not, makes every rank of the mesh raise a
RuntimeError naming the ranks and what each called, instead of hanging."""

from __future__ import annotations

import re

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
from mpitensor.debug import CommDebugMode, collective_checks_enabled, set_collective_checks
from mpi_helpers import Problems, raised, ref_box

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
R, S0, S1 = Replicate(), Shard(0), Shard(1)
multi = pytest.mark.skipif(W == 1, reason="one rank cannot disagree with itself")


@pytest.fixture
def checks():
    set_collective_checks(True)
    yield
    set_collective_checks(False)


def sharded(mesh, dim=0, shape=(8, 8)):
    size, _ = ref_box(shape, (W,), (RANK,), [Shard(dim)])
    return DTensor.from_local(np.full(size, float(RANK)), mesh, [Shard(dim)], shape=shape,
                              stride=(shape[1], 1))


def ranks_text(ranks) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def test_off_by_default():
    assert collective_checks_enabled() is False


def test_matching_programs_run_unchanged(mesh, checks):
    """Every hooked collective passes its check when all ranks agree, and the
    checks themselves are not counted as collectives of the program."""
    x = sharded(mesh)
    with CommDebugMode() as mode:
        full = x.redistribute(mesh, [R]).to_local()
        y = (x @ x.T).full_tensor()
        z = distribute_tensor(np.arange(16.0).reshape(4, 4), mesh, [S1])
        w = DTensor.from_local(np.ones(3), mesh, [R], run_check=True)
    expect = np.concatenate([np.full((ref_box((8, 8), (W,), (r,), [S0])[0][0], 8), float(r))
                             for r in range(W)])
    np.testing.assert_array_equal(full, expect)
    np.testing.assert_allclose(y, expect @ expect.T)
    assert z.full_tensor().tolist() == np.arange(16.0).reshape(4, 4).tolist()
    assert w.to_local().tolist() == [1.0, 1.0, 1.0]
    if W > 1:
        assert mode.get_comm_counts()["all_gather_into_tensor"] >= 2


@multi
def test_different_targets_raise_on_every_rank(mesh, checks):
    x = sharded(mesh)
    target = [S1] if RANK == 0 else [R]
    try:
        x.redistribute(mesh, target)
        text = "no error"
    except RuntimeError as e:
        text = str(e)
    assert text.startswith("collective mismatch"), text
    site = re.search(r"at (test_collective_check\.py:\d+)", text).group(1)
    assert text == (
        f"collective mismatch on {mesh!r}: rank 0 called DTensor.redistribute [S(0)] -> "
        f"[S(1)], shape (8, 8), float64 at {site}; {ranks_text(range(1, W))} called "
        f"DTensor.redistribute [S(0)] -> [R], shape (8, 8), float64 at {site}. Every "
        f"rank of the mesh must make the same collective calls in the same order.")


@multi
def test_skipped_collective_raises_on_every_rank(mesh, checks):
    """Rank 0 skips a gather: its next collective meets the others' gather."""
    x = sharded(mesh)

    def program():
        if RANK != 0:
            x.full_tensor()
        x.redistribute(mesh, [S1])

    r = raised(program, RuntimeError, r"rank 0 called DTensor.redistribute \[S\(0\)\] -> \[S\(1\)\]")
    assert r is True, r
    # Afterwards every rank is in step again.
    assert x.full_tensor().shape == (8, 8)


@multi
def test_same_call_from_another_line_raises(mesh, checks):
    x = sharded(mesh)

    def program():
        if RANK == 0:
            return x.full_tensor()
        return x.full_tensor()

    r = raised(program, RuntimeError, r"ranks? [\d, ]+ called DTensor.redistribute .* at "
               r"test_collective_check.py:\d+; ranks? [\d, ]+ called")
    assert r is True, r


@multi
def test_operation_needing_a_redistribution_on_one_rank(mesh, checks):
    """On rank 0 the add must move an input (all-to-all); the others need no
    communication and go on to a gather: all of them raise."""
    x = sharded(mesh)
    other = sharded(mesh, dim=1) if RANK == 0 else x

    def program():
        return (x + other).full_tensor()

    r = raised(program, RuntimeError, r"rank 0 called numpy.add: redistribute an input "
               r"\[S\(1\)\] -> \[S\(0\)\]")
    assert r is True, r


@pytest.mark.world(4, reason="a 2 x 2 mesh")
def test_mismatch_on_a_sub_mesh_stays_in_that_sub_mesh(checks):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"]
    x = DTensor.from_local(np.ones((2, 4)), tp, [S0])
    target = [S1] if RANK == 0 else [R]
    problems = Problems()
    if RANK in (0, 1):
        r = raised(lambda: x.redistribute(tp, target), RuntimeError,
                   r"on DeviceMesh\('cpu', \[0, 1\], mesh_dim_names=\('tp',\)\): rank 0 "
                   r"called .* -> \[S\(1\)\].*; rank 1 called .* -> \[R\]")
        problems.expect(r is True, f"rank {RANK}: {r}")
    else:
        problems.expect(x.redistribute(tp, target).to_local().shape == (4, 4), "other row")
    assert problems == []


def test_distribute_and_from_local_are_checked(mesh, checks):
    problems = Problems()
    shape = (4, 4) if RANK == 0 else (4, 5)
    r = raised(lambda: distribute_tensor(np.zeros(shape), mesh, [S0]), RuntimeError,
               r"called distribute_tensor \[S\(0\)\], shape \(4, 4\)")
    problems.expect(r is True if W > 1 else r != True, f"distribute_tensor: {r}")
    pl = [S0] if RANK == 0 else [R]
    r = raised(lambda: DTensor.from_local(np.ones(4), mesh, pl, run_check=True),
               RuntimeError, r"DTensor.from_local\(run_check=True\) \[S\(0\)\]")
    problems.expect(r is True if W > 1 else r != True, f"from_local: {r}")
    assert problems == []


@multi
def test_a_long_call_text_is_named_whole(mesh, checks):
    """The texts of a mismatch travel as int64 words, at most 64 a call: texts of
    over 512 bytes (UTF-8, of other lengths on other ranks) take several rounds."""
    from mpitensor.debug import _collective_check

    whats = [f"call {'é' * (250 + 40 * r)} from rank {r % 2}" for r in range(W)]
    try:
        _collective_check.agree(whats[RANK], mesh)
        text = "no error"
    except RuntimeError as e:
        text = str(e)
    site = re.search(r"at (test_collective_check\.py:\d+)", text).group(1)
    assert text == _collective_check.mismatch_message(
        mesh, [f"{w} at {site}" for w in whats]), text


@multi
def test_indexing_with_a_key_that_differs_by_rank_raises_on_every_rank(mesh, checks):
    # a[rank:] cuts the sharded dim differently on every rank: some ranks would
    # join the selection's exchange and others not. Every rank checks first.
    a = distribute_tensor(np.arange(8.0 * W), mesh, [S0])
    r = raised(lambda: a[RANK:].full_tensor(), RuntimeError, "DTensor.__getitem__")
    assert r is True, r
    assert np.array_equal(a[1:].full_tensor(), np.arange(1.0, 8.0 * W))  # and goes on
