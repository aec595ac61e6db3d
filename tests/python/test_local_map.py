"""mpitensor.experimental.local_map and implicit_replication: the seeds' example
(local matmul of [Shard(1)] x [Shard(0)] reduced to Replicate, and left Partial),
in_placements checks and redistribute_inputs, tuple/dict/non-array outputs, global
shapes of uneven shards on 1-D and 2-D meshes (against the brute-force torch.chunk
reference), layouts that do not fit (ValueError on every rank), and every error the
torch documentation lists.

Every rank runs every call; failed expectations are collected and asserted after
the last collective, so a failure never leaves a rank waiting."""

from __future__ import annotations

import re

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import _modes
from mpitensor._bind.core import chunk_sizes
from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from mpitensor.experimental import implicit_replication, local_map
from mpi_helpers import (Problems, chunk, gather_global, outcome, raised, ref_box,
                         same_everywhere)

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
R, S0, S1 = Replicate(), Shard(0), Shard(1)

_MESHES: dict = {}


def mesh_of(shape):
    shape = tuple(shape)
    if shape not in _MESHES:
        _MESHES[shape] = init_device_mesh("cpu", shape)
    return _MESHES[shape]


def data(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def mm_allreduce_forward(device_mesh, W_, X):
    partial_sum = W_ @ X
    out = np.empty_like(partial_sum)
    device_mesh.get_group().Allreduce(partial_sum, out, op=MPI.SUM)
    return out


def test_an_empty_output_has_the_spec_of_any_empty_result():
    # One rule for strides: a dim of size 0 counts as 1, for local_map's outputs as
    # for the results of operations.
    mesh = mesh_of((W,))
    x = distribute_tensor(np.zeros((4, 0)), mesh, [R])
    y = local_map(lambda a: a * 2, out_placements=[R])(x)
    z = x * 2
    assert y.stride() == z.stride() == (1, 1)
    assert y._spec == z._spec


def test_mm_allreduce_forward_seed_example():
    mesh = mesh_of((W,))
    Wg, Xg = data(12, 8, seed=1), data(8, 16, seed=2)
    f = local_map(mm_allreduce_forward, out_placements=[R],
                  in_placements=(None, [S1], [S0]), device_mesh=mesh)
    Y = f(mesh, distribute_tensor(Wg, mesh, [S1]), distribute_tensor(Xg, mesh, [S0]))
    p = Problems()
    p.expect(isinstance(Y, DTensor) and Y.placements == (R,), f"got {Y!r}")
    p.expect(Y.shape == (12, 16), f"shape {Y.shape}")
    p.expect(np.allclose(Y.to_local(), Wg @ Xg), "Y != W @ X")
    assert p == []


def test_local_matmul_partial_output():
    mesh = mesh_of((W,))
    Wg, Xg = data(12, 8, seed=3), data(8, 16, seed=4)

    @local_map(out_placements=[Partial()], in_placements=([S1], [S0]))
    def mm(a, b):
        return a @ b

    Y = mm(distribute_tensor(Wg, mesh, [S1]), distribute_tensor(Xg, mesh, [S0]))
    full = Y.full_tensor()  # collective, every rank
    p = Problems()
    p.expect(Y.placements == (Partial(),), f"placements {Y.placements}")
    p.expect(Y.shape == (12, 16), f"shape {Y.shape}")
    p.expect(np.allclose(full, Wg @ Xg), "full_tensor != W @ X")
    assert p == []


def test_mismatched_placements_raise_value_error():
    mesh = mesh_of((W,))
    Wg, Xg = data(12, 8), data(8, 16)
    f = local_map(lambda a, b: a @ b, out_placements=[Partial()],
                  in_placements=([S1], [S0]))
    wr, x0 = distribute_tensor(Wg, mesh, [R]), distribute_tensor(Xg, mesh, [S0])
    assert raised(lambda: f(wr, x0), ValueError, "redistribute_inputs=True") is True


def test_redistribute_inputs_true():
    mesh = mesh_of((W,))
    Wg, Xg = data(12, 8, seed=5), data(8, 16, seed=6)
    f = local_map(lambda a, b: a @ b, out_placements=[Partial()],
                  in_placements=([S1], [S0]), redistribute_inputs=True)
    seen = []

    def spy(a, b):
        seen.append((a.shape, b.shape))
        return a @ b

    g = local_map(spy, out_placements=[Partial()], in_placements=([S1], [S0]),
                  redistribute_inputs=True)
    wr, xr = distribute_tensor(Wg, mesh, [R]), distribute_tensor(Xg, mesh, [R])
    Y = f(wr, xr)
    g(wr, xr)
    full = Y.full_tensor()
    k = mesh.get_coordinate()[0]
    p = Problems()
    p.expect(np.allclose(full, Wg @ Xg), "full_tensor != W @ X after redistribution")
    cols = len(chunk(np.arange(8), W, k))
    p.expect(seen == [((12, cols), (cols, 16))], f"func saw {seen}")
    p.expect(wr.placements == (R,), "the input DTensor itself changed")
    assert p == []


def test_replicate_output_and_passthrough_args():
    mesh = mesh_of((W,))
    x = distribute_tensor(data(5, 3), mesh, [R])
    f = local_map(lambda a, s, *, k: a * s + k, out_placements=[R],
                  in_placements=([R], None))
    y = f(x, 2.0, k=1.0)
    assert y.placements == (R,) and y.shape == (5, 3)
    assert np.allclose(y.to_local(), x.to_local() * 2 + 1)


def test_no_dtensor_returns_plain_output():
    f = local_map(lambda a: a + 1, out_placements=[S0])
    out = f(np.zeros(3))
    assert type(out) is np.ndarray and np.array_equal(out, np.ones(3))


@pytest.mark.parametrize("n", [1, 5, 10, 13])
def test_uneven_shards_global_shape(n):
    mesh = mesh_of((W,))
    g = data(n, 3, seed=n)
    x = distribute_tensor(g, mesh, [S0])
    p = Problems()
    y = local_map(lambda a: 2 * a, out_placements=[S0])(x)
    z = local_map(lambda a: a[:, :2], out_placements=[S0])(x)
    s = local_map(lambda a: a.sum(1), out_placements=[S0])(x)
    for name, dt, want in (("2x", y, 2 * g), ("cols", z, g[:, :2]), ("rowsum", s, g.sum(1))):
        p.expect(dt.shape == want.shape, f"{name}: shape {dt.shape}, want {want.shape}")
        full, probs = gather_global(dt) if dt.shape == want.shape else (None, ["skipped"])
        p.extend(f"{name}: {q}" for q in probs)
        if not probs:
            p.expect(np.allclose(full, want), f"{name}: values differ")
    assert p == []


def test_more_sharded_outputs_than_one_size_exchange_carries():
    """The sizes of 70 sharded outputs travel in batches of at most 64: output k,
    torch.chunk's share of k + 1 columns on each rank, gets k + 1 columns."""
    mesh = mesh_of((W,))
    x = distribute_tensor(data(W, 2), mesh, [S0])
    rank = COMM.Get_rank()
    outs = local_map(lambda a: tuple(np.ones((1, chunk_sizes(k + 1, W)[rank]))
                                     for k in range(70)),
                     out_placements=tuple([S1] for _ in range(70)))(x)
    shapes = [o.shape for o in outs]
    assert shapes == [(1, k + 1) for k in range(70)], shapes


def test_uneven_shards_2d_mesh():
    if W != 4:
        pytest.skip("needs 4 ranks for a 2x2 mesh")
    mesh = mesh_of((2, 2))
    p = Problems()
    for pl, gshape in (((S0, S0), (7, 5)), ((S0, S1), (7, 5)), ((S1, S0), (3, 7)),
                       ((R, S1), (4, 5)), ((Partial(), S0), (5, 2))):
        g = data(*gshape, seed=7)
        src = [R if isinstance(q, Partial) else q for q in pl]
        x = distribute_tensor(g, mesh, src)
        y = local_map(lambda a: a + 1, out_placements=[*pl])(x)
        p.expect(y.shape == gshape, f"{pl}: shape {y.shape}, want {gshape}")
        want_local, _ = ref_box(gshape, (2, 2), mesh.get_coordinate(), pl)
        p.expect(y.to_local().shape == want_local, f"{pl}: local {y.to_local().shape}")
    assert p == []


def test_layout_that_does_not_fit_raises_on_every_rank():
    mesh = mesh_of((W,))
    x = distribute_tensor(data(10, 3), mesh, [S0])
    f = local_map(lambda a: np.concatenate([a, a]), out_placements=[S0])
    sizes = [2 * len(chunk(np.arange(10), W, k)) for k in range(W)]
    fits = sizes == [len(chunk(np.arange(sum(sizes)), W, k)) for k in range(W)]
    if fits:
        assert f(x).shape == (20, 3)
    else:
        assert raised(lambda: f(x), ValueError, "torch.chunk") is True
    # a rank-dependent misfit (only the last rank's output is short) also agrees
    g = local_map(lambda a: a[:0] if mesh.get_rank() == W - 1 and W > 1 else a,
                  out_placements=[S0])
    x2 = distribute_tensor(data(4 * W, 3), mesh, [S0])
    if W > 1:
        assert raised(lambda: g(x2), ValueError, "torch.chunk|another rank") is True
    else:
        assert g(x2).shape == (4, 3)


ODD_OUTPUTS = {  # what the last rank's func returns for a [Shard(1)] output, and the error
    "float32": (lambda a: a.astype(np.float32), "differ in dtype or number of dims"),
    "fewer dims": (lambda a: a[0], "torch.chunk|out of range|differ in dtype"),
    "not an array": (lambda a: 3, "torch.chunk|Non-array output"),
    "two outputs": (lambda a: (a, a), "torch.chunk|one PlacementType"),
}


@pytest.mark.skipif(W < 2, reason="an output that differs on one rank")
@pytest.mark.parametrize("odd", sorted(ODD_OUTPUTS))
def test_an_output_that_differs_on_one_rank_raises_on_every_rank(odd):
    """The last rank's func returns another dtype, fewer dims, a non-array or another
    number of outputs: every rank raises the same error (the first failing rank's;
    IndexError for a Shard dim its output lacks). Before, that rank
    raised alone (or not at all: another dtype gave a DTensor whose bytes the next
    collective misread) while the others waited in the exchange of the sizes."""
    mesh = mesh_of((W,))
    change, words = ODD_OUTPUTS[odd]
    f = local_map(lambda a: change(a) if mesh.get_rank() == W - 1 else a,
                  out_placements=[S1])
    x = distribute_tensor(data(3, 2 * W), mesh, [S1])
    got = same_everywhere(outcome(lambda: f(x)))
    assert got is not None and got[0] in ("ValueError", "IndexError"), got
    assert re.search(words, got[1]), got


def test_tuple_dict_and_non_array_outputs():
    mesh = mesh_of((W,))
    g = data(2 * W + 1, 4, seed=9)
    x = distribute_tensor(g, mesh, [S0])

    def f(a):
        return a * 2, a.shape[1], a.sum(0)  # ndarray, int, ndarray partial sum

    y, k, s = local_map(f, out_placements=([S0], None, [Partial()]))(x)
    d = local_map(lambda a: {"v": a, "n": "x"}, out_placements=([S0], None))(x)
    full = s.full_tensor()
    p = Problems()
    p.expect(y.shape == g.shape and k == 4, f"{y.shape}, {k}")
    p.expect(s.shape == (4,) and np.allclose(full, g.sum(0)), "partial sum wrong")
    p.expect(isinstance(d, dict) and d["n"] == "x" and d["v"].shape == g.shape, f"{d!r}")
    assert p == []


def test_errors():
    mesh = mesh_of((W,))
    other = mesh_of((1, W))
    x = distribute_tensor(data(4, 4), mesh, [R])
    xo = distribute_tensor(data(4, 4), other, [R, R])
    p = Problems()
    cases = {
        "non-array output with placements": (
            lambda: local_map(lambda a: (a, 1), out_placements=([R], [R]))(x),
            AssertionError, "Non-array output"),
        "array output with None": (
            lambda: local_map(lambda a: (a, 1), out_placements=(None, None))(x),
            AssertionError, "expects placements"),
        "output count": (
            lambda: local_map(lambda a: (a, a), out_placements=([R],))(x),
            AssertionError, "one PlacementType"),
        "in_placements length": (
            lambda: local_map(lambda a: a, out_placements=[R], in_placements=([R], [R]))(x),
            AssertionError, "in_placements length"),
        "in_grad_placements length": (
            lambda: local_map(lambda a: a, out_placements=[R],
                              in_grad_placements=([R], [R]))(x),
            AssertionError, "in_grad_placements length"),
        "DTensor input with None placements": (
            lambda: local_map(lambda a: a, out_placements=[R], in_placements=(None,))(x),
            AssertionError, "expects placements"),
        "non-array input with placements": (
            lambda: local_map(lambda a, s: a, out_placements=[R],
                              in_placements=([R], [R]))(x, 3),
            AssertionError, "Non-array input"),
        "inputs on two meshes": (
            lambda: local_map(lambda a, b: a, out_placements=[R])(x, xo),
            AssertionError, "same mesh"),
        "inputs not on device_mesh": (
            lambda: local_map(lambda a: a, out_placements=[R], device_mesh=other)(x),
            AssertionError, "same mesh"),
        "returned a DTensor": (
            lambda: local_map(lambda a: x, out_placements=[R])(x),
            AssertionError, "DTensor"),
        "wrong placement count": (
            lambda: local_map(lambda a: a, out_placements=[R, R])(x),
            ValueError, "placements for a 1-d"),
        "not callable": (lambda: local_map(3, out_placements=[R]), TypeError, "callable"),
    }
    for name, (call, exc, match) in cases.items():
        r = raised(call, exc, match)
        p.expect(r is True, f"{name}: {r}")
    assert p == []


def test_plain_ndarray_input_passes_unchecked_and_with_mesh_default():
    mesh = mesh_of((W,))
    x = distribute_tensor(data(3, 2), mesh, [R])
    with mesh:
        f = local_map(lambda a, b: a + b, out_placements=[R], in_placements=([R], [S0]))
        y = f(x, np.ones((3, 2)))
    assert y.device_mesh == mesh and np.allclose(y.to_local(), x.to_local() + 1)


def test_implicit_replication_flag():
    assert not _modes.state.implicit_replication
    with implicit_replication():
        assert _modes.state.implicit_replication
        with implicit_replication():
            assert _modes.state.implicit_replication
        assert _modes.state.implicit_replication
    assert not _modes.state.implicit_replication
    with pytest.raises(RuntimeError):
        with implicit_replication():
            raise RuntimeError("boom")
    assert not _modes.state.implicit_replication
