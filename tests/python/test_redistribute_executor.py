"""DTensor.redistribute in the executor (csrc/ext/ext_move.c): every move gives the
global array it was given, bit for bit, with the target spec, and a repeated move
is a hit of the mesh's memo that runs the same collectives and bytes (the C
counters CommDebugMode reads) without any Python; async_op, forward_dtype,
autograd recording and debugging tools run there too, and only placements that
are not the interned objects pass the placements hook, which raises every error;
a cached decision is never reused for another mesh, dtype, shape or stride.

Every rank runs every redistribute; expectations are collected and asserted after
the last collective, so a failure never leaves a rank waiting."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, _C, _modes, _comm, _trace
from mpitensor.debug import CommDebugMode
from mpi_helpers import Problems, bits_equal, raised

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
R, S0, S1 = Replicate(), Shard(0), Shard(1)
PSUM, PMAX = Partial("sum"), Partial("max")


def runs() -> int:
    return _trace.hook_stats()["runs"]


def pythons() -> int:
    """Calls from the executor into Python other than trace events."""
    st = _trace.hook_stats()
    return st["local"] + st["build"] + st["entry"] + st["placements"]


def counters() -> dict:
    return dict(_comm.comm_counters())


def moved(before: dict, after: dict) -> dict:
    """{collective: (calls, bytes)} counted between two counter readings."""
    out = {}
    for k, (calls, nbytes) in after.items():
        d = (calls - before[k][0], nbytes - before[k][1])
        if d != (0, 0):
            out[k] = d
    return out


def source(mesh, placements, shape, dtype=np.float64):
    """A DTensor of `shape` on `mesh`: distributed from one global array, each rank
    scaling its part by rank + 1 where the placements hold a Partial."""
    full = (np.arange(int(np.prod(shape))).reshape(shape) % 7 + 1).astype(dtype)
    if not any(p.is_partial() for p in placements):
        return mt.distribute_tensor(full, mesh, placements)
    kept = [R if p.is_partial() else p for p in placements]
    local = mt.distribute_tensor(full, mesh, kept).to_local() * (RANK + 1)
    return DTensor.from_local(local.astype(dtype), mesh, placements, shape=shape,
                              stride=tuple(int(s) // full.itemsize for s in full.strides))


def both(x, placements, problems: Problems, what: str):
    """x.redistribute twice (a decision, then a memo hit): one run each, the same
    result, spec and collectives, the global array x holds. Returns the first."""
    full = x.full_tensor()
    calls, k0 = runs(), counters()
    first = x.redistribute(x.device_mesh, placements)
    k1, took = counters(), runs() - calls
    second = x.redistribute(x.device_mesh, placements)
    k2 = counters()
    problems.expect(took == 1 and runs() - calls == 2, f"{what}: {took} runs")
    problems.expect(bits_equal(first.to_local(), second.to_local()), f"{what}: local differs")
    problems.expect(first._spec == second._spec, f"{what}: {first._spec} != {second._spec}")
    problems.expect(tuple(first.placements) == tuple(placements) and
                    first.shape == x.shape and first.dtype == x.dtype and
                    first.stride() == x.stride(), f"{what}: spec {first._spec}")
    problems.expect(type(first) is DTensor, f"{what}: {type(first)}")
    problems.expect(moved(k0, k1) == moved(k1, k2),
                    f"{what}: collectives {moved(k0, k1)} != {moved(k1, k2)}")
    problems.expect(bits_equal(first.full_tensor(), full), f"{what}: global values")
    return first


TRANSITIONS = [(src, dst) for src in (S0, S1, R, PSUM, PMAX) for dst in (S0, S1, R)] + \
    [(PSUM, PSUM), (S0, S0)]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int32])
def test_every_move_gives_the_global_array_it_was_given(mesh, dtype):
    problems = Problems()
    for shape in ((2 * W + 1, 3), (4 * W, 2 * W)):
        for src, dst in TRANSITIONS:
            x = source(mesh, [src], shape, dtype)
            what = f"{src}->{dst} {shape} {np.dtype(dtype)}"
            both(x, [dst], problems, what)
            both(x, [dst], problems, what + " (again)")
    assert problems == []


def test_a_repeated_move_is_a_memo_hit_and_runs_no_python(mesh):
    x = source(mesh, [S0], (2 * W, 3))
    x.redistribute(mesh, [R])
    hits, calls, python = mesh._dispatch_stats()["hits"], runs(), pythons()
    for _ in range(3):
        x.redistribute(mesh, [R])
        x.redistribute(placements=(R,))  # a tuple, by keyword, no mesh
    assert mesh._dispatch_stats()["hits"] - hits == 6
    assert runs() - calls == 6
    assert pythons() == python


def test_every_move_on_a_2d_mesh():
    if W % 2:
        pytest.skip("needs an even number of ranks")
    mesh2 = mt.init_device_mesh("cpu", (2, W // 2))
    problems = Problems()
    for src in ([S0, S1], [R, S0], [PSUM, S1], [S0, S0], [PSUM, PSUM]):
        for dst in ([R, R], [S1, S0], [R, S1], [S0, R], src):
            x = source(mesh2, src, (2 * W + 3, 2 * W))
            both(x, dst, problems, f"{src}->{dst}")
    assert problems == []


def test_a_cached_move_is_not_reused_for_another_shape_dtype_stride_or_mesh(mesh):
    other = mt.init_device_mesh("cpu", (W,))
    problems = Problems()
    cases = [(mesh, (2 * W, 3), np.float64), (mesh, (2 * W + 1, 3), np.float64),
             (mesh, (2 * W, 3), np.float32), (mesh, (2 * W, 3), np.int64),
             (other, (2 * W, 3), np.float64), (other, (2 * W, 5), np.float64)]
    for m, shape, dtype in cases:
        full = (np.arange(int(np.prod(shape))).reshape(shape) % 5).astype(dtype)
        for _ in range(2):
            out = mt.distribute_tensor(full, m, [S0]).redistribute(m, [R])
            problems.expect(bits_equal(out.to_local(), full), f"{shape} {dtype}: values")
            problems.expect(out.device_mesh is m and out.shape == shape,
                            f"{shape} {dtype}: mesh or shape")
    # Same shape and placements, other strides: the output keeps its own.
    a = mt.distribute_tensor(np.arange(6.0 * W).reshape(3 * W, 2), mesh, [S1])
    t = a.T  # Shard(0) of a (2, 3W) tensor with strides (1, 2)
    c = mt.distribute_tensor(np.ascontiguousarray(a.full_tensor().T), mesh, [S0])
    for y, ref in ((t, t), (c, c)):
        out = y.redistribute(mesh, [R])
        problems.expect(out.stride() == ref.stride(), f"stride {out.stride()}")
        problems.expect(bits_equal(out.to_local(), c.full_tensor()), "transposed values")
    assert problems == []


def test_async_dtypes_tools_and_autograd_run_in_the_executor(mesh):
    problems = Problems()
    x = source(mesh, [S0], (2 * W, 4))
    full = x.full_tensor()
    x.redistribute(mesh, [R])
    calls, python = runs(), pythons()
    out = x.redistribute(mesh, [R], async_op=True)
    problems.expect(type(out._local_tensor) is (_comm.Request if W > 1 else np.ndarray),
                    "async_op")
    problems.expect(bits_equal(out.to_local(), full), "async_op values")
    out = x.redistribute(mesh, [R], forward_dtype=np.float32)
    problems.expect(out.dtype == np.float32 and bits_equal(out.to_local(),
                                                           full.astype(np.float32)),
                    "forward_dtype")
    with CommDebugMode() as comm:
        x.redistribute(mesh, [R])
    problems.expect(comm.get_total_counts() == (1 if W > 1 else 0),
                    f"CommDebugMode saw {comm.get_total_counts()}")
    g = source(mesh, [S0], (2 * W, 4)).requires_grad_()
    out = g.redistribute(mesh, [R])
    problems.expect(out.grad_fn is not None, "recorded for autograd")
    problems.expect(runs() == calls + 4, f"{runs() - calls} runs")
    was = _modes.set_grad_enabled(False)
    try:
        out = g.redistribute(mesh, [R])
    finally:
        _modes.set_grad_enabled(was)
    problems.expect(out.grad_fn is None and runs() == calls + 5, "no_grad")
    # forward_dtype alone took the placements hook (a dtype to normalise).
    problems.expect(pythons() == python + 1, f"{pythons() - python} calls into Python")
    # Placements that are not the interned objects: the hook normalises or refuses.
    out = x.redistribute(mesh, [Shard(-1)])
    problems.expect(out.placements == (S1,), f"Shard(-1): {out.placements}")
    for call, exc, what in ((lambda: x.redistribute(mesh, [PSUM]), RuntimeError, "S0->P"),
                            (lambda: x.redistribute(mesh, [Shard(2)]), IndexError, "S(2)"),
                            (lambda: x.redistribute(mesh), RuntimeError, "no placements"),
                            (lambda: x.redistribute(mesh, [R], bogus=1), TypeError, "kw")):
        problems.expect(raised(call, exc) is True, what)
    assert problems == []


def test_a_refused_move_raises_on_every_call(mesh):
    """A move the core refuses is never stored: each call raises again."""
    x = source(mesh, [PMAX], (W, 2), np.complex128)
    for _ in range(2):
        assert raised(lambda: x.redistribute(mesh, [R]), TypeError) is True
