"""CommDebugMode: counts of the collectives the C executor really ran, keyed by
torch's functional-collective names, and the bytes this rank sent: reset on
entering, visible while inside, frozen after leaving, nested contexts, missing
keys reading 0, and RuntimeError when it was never entered."""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from mpitensor.debug import CommDebugMode
from mpi_helpers import Problems, raised, ref_box

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
R, S0, S1 = Replicate(), Shard(0), Shard(1)
NAMES = {"all_gather_into_tensor", "all_reduce", "reduce_scatter_tensor",
         "all_to_all_single", "broadcast", "scatter"}
ONE = 1 if W > 1 else 0  # a world of one rank is a mesh dim of size 1: no collective


def sharded(mesh, shape=(8, 4)):
    """A Shard(0) DTensor of `shape` (rows cut by torch.chunk's rule)."""
    rows = ref_box(shape, (W,), (RANK,), [S0])[0][0]
    return DTensor.from_local(np.full((rows, shape[1]), float(RANK)), mesh, [S0],
                              shape=shape, stride=(shape[1], 1))


def gather(mesh):
    """One all-gather (W > 1)."""
    return sharded(mesh).redistribute(mesh, [R])


def test_counts_reset_on_entering(mesh):
    gather(mesh)
    mode = CommDebugMode()
    with mode:
        before = mode.get_total_counts()
        gather(mesh)
    first = dict(mode.get_comm_counts())
    with mode:  # entering again starts from zero
        inside = mode.get_total_counts()
    assert before == 0
    assert first == ({"all_gather_into_tensor": 1} if W > 1 else {})
    assert inside == 0 and mode.get_total_counts() == 0


def test_counts_visible_inside_and_frozen_after(mesh):
    with CommDebugMode() as mode:
        seen = [mode.get_total_counts()]
        gather(mesh)
        seen.append(mode.get_comm_counts()["all_gather_into_tensor"])
        gather(mesh)
        seen.append(mode.get_comm_counts()["all_gather_into_tensor"])
        bytes_inside = mode.get_comm_bytes()["all_gather_into_tensor"]
    gather(mesh)
    gather(mesh)
    assert seen == [0, ONE, 2 * ONE]
    assert mode.get_comm_counts()["all_gather_into_tensor"] == 2 * ONE
    assert mode.get_comm_bytes()["all_gather_into_tensor"] == bytes_inside
    assert mode.get_total_counts() == 2 * ONE


def test_nested_contexts(mesh):
    """The inner context sees its own collectives; the outer one sees all of them,
    as nested torch dispatch modes do."""
    with CommDebugMode() as outer:
        gather(mesh)
        with CommDebugMode() as inner:
            sharded(mesh).redistribute(mesh, [S1])
        gather(mesh)
    assert dict(inner.get_comm_counts()) == ({"all_to_all_single": 1} if W > 1 else {})
    assert dict(outer.get_comm_counts()) == ({"all_gather_into_tensor": 2,
                                              "all_to_all_single": 1} if W > 1 else {})
    assert outer.get_total_counts() == 3 * ONE
    assert inner.get_total_counts() == ONE


def test_every_kind_is_named_as_in_torch(mesh):
    """Each transition lands under its torch name; get_total_counts is the sum."""
    part = DTensor.from_local(np.ones((4, 4)), mesh, [Partial()])
    problems = Problems()
    for what, call, kind in [
        ("gather", lambda: gather(mesh), "all_gather_into_tensor"),
        ("all-to-all", lambda: sharded(mesh).redistribute(mesh, [S1]), "all_to_all_single"),
        ("all-reduce", lambda: part.redistribute(mesh, [R]), "all_reduce"),
        ("reduce-scatter", lambda: part.redistribute(mesh, [S0]), "reduce_scatter_tensor"),
        ("broadcast", lambda: distribute_tensor(np.ones((4, 4)), mesh, [R]), "broadcast"),
        ("scatter", lambda: distribute_tensor(np.ones((4, 4)), mesh, [S0]), "scatter"),
    ]:
        with CommDebugMode() as mode:
            call()
        counts = dict(mode.get_comm_counts())
        problems.expect(set(counts) <= NAMES, f"{what}: unknown keys {counts}")
        if W > 1:
            problems.expect(counts == {kind: 1}, f"{what}: {counts}")
        problems.expect(mode.get_total_counts() == sum(counts.values()), f"{what}: total")
    assert problems == []


def test_missing_keys_read_zero(mesh):
    with CommDebugMode() as mode:
        sharded(mesh).redistribute(mesh, [S0])  # same placements: nothing
    counts, nbytes = mode.get_comm_counts(), mode.get_comm_bytes()
    assert mode.get_total_counts() == 0
    for name in NAMES:
        assert counts[name] == 0 and nbytes[name] == 0
    assert counts == {} and nbytes == {}  # reading a missing key adds nothing


def test_counts_show_as_a_dict(mesh):
    with CommDebugMode() as mode:
        gather(mesh)
    want = {"all_gather_into_tensor": 1} if W > 1 else {}
    assert repr(mode.get_comm_counts()) == repr(want) and isinstance(mode.get_comm_counts(), dict)


def test_comm_bytes_are_what_this_rank_sent(mesh):
    """All-gather of 8x4 float64 rows: each rank sends its shard to W-1 others, and
    the bytes of all ranks add up to every rank receiving what it lacks."""
    shape = (8, 4)
    with CommDebugMode() as mode:
        out = sharded(mesh, shape).redistribute(mesh, [R])
    mine = ref_box(shape, (W,), (RANK,), [S0])[0][0] * shape[1] * 8
    sent = mode.get_comm_bytes()["all_gather_into_tensor"]
    total = COMM.allreduce(sent)
    with CommDebugMode() as mode32:
        sharded(mesh, shape).redistribute(mesh, [R], forward_dtype=np.float32)
    assert sent == mine * (W - 1)
    assert total == (W - 1) * 8 * 4 * 8
    assert out.to_local().shape == shape
    assert mode32.get_comm_bytes()["all_gather_into_tensor"] == sent // 2


def test_counts_are_per_rank_and_equal_on_every_rank(mesh):
    with CommDebugMode() as mode:
        gather(mesh)
        DTensor.from_local(np.ones(3), mesh, [Partial("max")]).full_tensor()
    counts = COMM.allgather(dict(mode.get_comm_counts()))
    assert all(c == counts[0] for c in counts)


def test_not_entered_raises(mesh):
    mode = CommDebugMode()
    problems = Problems()
    for call in (mode.get_comm_counts, mode.get_comm_bytes, mode.get_total_counts):
        r = raised(call, RuntimeError, "entered")
        problems.expect(r is True, f"{call.__name__}: {r}")
    assert problems == []
