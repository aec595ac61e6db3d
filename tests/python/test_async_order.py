"""Asynchronous redistributes: the result never depends on when, or in what order,
they are waited on.

Multi-step plans (two or more collectives, which only meshes with two dims of size
above 1 have) used to post their later steps from inside `wait()`, so two pending
redistributes waited in orders 0,1 on some ranks and 1,0 on others paired one
tensor's messages with the other's: wrong values on every rank, no error. Every
rank here draws its own wait order; every result must still equal NumPy's.

A posted collective used to read the source's local array when it was waited on,
so a write to that array between the call and the wait changed the result; the
result must be that of the values at the call, as torch's functional collectives
give."""

from __future__ import annotations

import functools
import itertools
import random

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import DTensor, _comm, _plan, init_device_mesh
from mpitensor._layout import _codes
from mpi_helpers import Problems
from redistribute_ref import (PLACEMENTS, expected_local, mixed_partials, name, source_local,
                              strides)

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
SHAPE = (7, 5)

pytestmark = pytest.mark.skipif(W == 1, reason="one rank: no plan communicates")

_MESHES: dict = {}


def mesh_of(shape):
    if shape not in _MESHES:
        _MESHES[shape] = init_device_mesh("cpu", shape)
    return _MESHES[shape]


def communicating_steps(ms, src, dst) -> int:
    try:
        plan = _plan.Plan(SHAPE, ms, _codes(src), _codes(dst), np.dtype("f8"))
    except (RuntimeError, TypeError):  # a Partial target, or avg of a mesh dim of 1
        return -1
    return sum(kind != "chunk" for kind, *_ in plan.steps())


@functools.cache  # planning every pair of placements takes longer than the tests
def cases():
    """(mesh shape, src, dst) for every multi-step plan of the (2, 2) mesh and a
    fixed sample of the 3-D meshes' (the same on every rank); on meshes without
    multi-step plans (np 1..3), every one-step plan, so pending requests on one
    communicator are still waited in per-rank orders."""
    found = []
    meshes = [(2, 2), (1, 2, 2), (2, 1, 2)] if W == 4 else [(W,)]
    for ms in meshes:
        mine = [(ms, s, d) for s in itertools.product(PLACEMENTS, repeat=len(ms))
                for d in itertools.product(PLACEMENTS, repeat=len(ms))
                if not mixed_partials(s)  # refused, as torch
                and communicating_steps(ms, s, d) >= (2 if W == 4 else 1)]
        if len(ms) == 3:
            mine = random.Random(len(mine)).sample(mine, 40)
        found += mine
    return tuple(found)


def source(ms, src, scale, shape=SHAPE):
    """A DTensor of `scale` times the base array placed by `src`, and the array."""
    mesh = mesh_of(ms)
    base = (np.arange(np.prod(shape)) % 89 + 1).reshape(shape) * scale
    local = source_local(base, ms, mesh.get_coordinate(), src, np.float64)
    return DTensor.from_local(local, mesh, src, shape=shape, stride=strides(shape)), base


def start(ms, src, dst, scale):
    """A pending redistribute of `scale` times the base array, and what this rank's
    local result must be."""
    dt, base = source(ms, src, scale)
    mesh = mesh_of(ms)
    return dt.redistribute(mesh, dst, async_op=True), expected_local(
        base, ms, mesh.get_coordinate(), src, dst, np.float64)


def test_multi_step_plans_are_found():
    found = cases()
    # (2, 2): 165 pairs of placements plan two collectives, 36 of them from mixed
    # Partials, which from_local refuses
    assert sum(ms == (2, 2) for ms, _, _ in found) == (129 if W == 4 else 0)
    assert len(found) == (129 + 80 if W == 4 else len(found)) and found


def test_two_pending_redistributes_waited_in_per_rank_order():
    rng = random.Random(1000 + RANK)
    problems = Problems()
    for ms, src, dst in cases():
        pending = [start(ms, src, dst, k + 1) for k in range(3)]
        for k in rng.sample(range(3), 3):
            out, want = pending[k]
            out.wait()
            problems.expect(np.array_equal(out.to_local(), want),
                            f"{ms} {name(src)}->{name(dst)} #{k}: {out.to_local()} != {want}")
    assert problems == []


def test_every_plan_pending_at_once_waited_in_per_rank_order():
    """All the cases in flight together, over every communicator of the mesh, then
    completed in a per-rank order, some by wait(), some by first use, some dropped."""
    rng = random.Random(2000 + RANK)
    problems = Problems()
    all_cases = cases()
    pending = [start(ms, src, dst, 1 + i % 5) for i, (ms, src, dst) in enumerate(all_cases)]
    order = rng.sample(range(len(pending)), len(pending))
    for i in order:
        out, want = pending[i]
        ms, src, dst = all_cases[i]
        if i % 7 == 3:  # dropped unwaited: freed (and completed) in this rank's order
            pending[i] = None
            continue
        local = out.to_local() if i % 2 else out.wait().to_local()
        problems.expect(np.array_equal(local, want), f"{ms} {name(src)}->{name(dst)}")
    assert problems == []


def test_polled_with_test_in_per_rank_order():
    """``Request.test()`` (MPI_Test: what fully_shard's hooks call to move a
    prefetched all-gather between pieces of compute) polled a different number
    of times on every rank, in a per-rank order, changes no result; once it says
    True, or after wait(), the request has completed."""
    rng = random.Random(3000 + RANK)
    problems = Problems()
    all_cases = cases()
    pending = [start(ms, src, dst, 1 + i % 5) for i, (ms, src, dst) in enumerate(all_cases)]
    for _ in range(rng.randrange(1, 4)):
        for i in rng.sample(range(len(pending)), len(pending)):
            req = pending[i][0]._local_tensor
            if type(req) is _comm.Request:
                problems.expect(type(req.test()) is bool, "test() is a bool")
    for i in rng.sample(range(len(pending)), len(pending)):
        out, want = pending[i]
        req = out._local_tensor
        out.wait()
        if type(req) is _comm.Request:
            problems.expect(req.test() and req.done, "completed after wait()")
        ms, src, dst = all_cases[i]
        problems.expect(np.array_equal(out.to_local(), want), f"{ms} {name(src)}->{name(dst)}")
    assert problems == []


def one_step_cases(ms):
    """(mesh shape, src, dst) for every plan of one collective on mesh `ms`."""
    return [(ms, s, d) for s in itertools.product(PLACEMENTS, repeat=len(ms))
            for d in itertools.product(PLACEMENTS, repeat=len(ms))
            if not mixed_partials(s) and communicating_steps(ms, s, d) == 1]


# Small messages, which MPI may copy when it posts them, and larger ones, which it
# reads as they go.
@pytest.mark.parametrize("shape", [SHAPE, (96, 40)], ids=["small", "large"])
def test_writing_the_source_before_wait_changes_no_result(shape):
    """Every collective kind posted straight on the source (all-gather along the
    first and an inner dim, all-to-all, all-reduce, reduce-scatter into slabs and
    into packed blocks), and at np 4 the multi-step plans: the source's local
    array is overwritten after the call and before wait(), and the result is
    still the one of the values at the call."""
    found = one_step_cases((W,)) + (list(cases()) if W == 4 and shape == SHAPE else [])
    kinds = set()
    problems = Problems()
    for ms, src, dst in found:
        plan = _plan.Plan(shape, ms, _codes(src), _codes(dst), np.dtype("f8"))
        kinds.update(kind for kind, *_ in plan.steps())
        dt, base = source(ms, src, 1, shape)
        mesh = mesh_of(ms)
        want = expected_local(base, ms, mesh.get_coordinate(), src, dst, np.float64)
        out = dt.redistribute(mesh, dst, async_op=True)
        dt.to_local()[...] = -1000.0 - RANK
        local = out.wait().to_local()
        problems.expect(np.array_equal(local, want), f"{ms} {name(src)}->{name(dst)}")
    assert {"all_gather", "all_to_all", "all_reduce", "reduce_scatter"} <= kinds
    assert problems == []
