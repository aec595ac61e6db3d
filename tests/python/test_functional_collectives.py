"""mpitensor.distributed._functional_collectives, as torch 2.13's: values against
NumPy on every kind of group (a 1-D mesh, (mesh, dim), the mesh's own
communicator, any mpi4py communicator), gradients against their closed forms (the
backward of each collective is its reverse), inside local_map, the collectives
CommDebugMode counts, and bad arguments raising alike on every rank."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
import mpitensor.distributed._functional_collectives as funcol
from mpitensor import DTensor, Replicate, Shard, init_device_mesh
from mpitensor.debug import CommDebugMode
from mpitensor.device_mesh import local_mesh
from mpitensor.experimental import local_map
from mpi_helpers import Problems, expect_same_error

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()


def groups():
    """(label, group, the world ranks of this rank's group in order), every kind."""
    out = [("mesh", lambda: init_device_mesh("cpu", (N,)), list(range(N)))]
    if N == 4:
        out += [("(mesh, 0)", lambda: (init_device_mesh("cpu", (2, 2)), 0),
                 [RANK % 2, RANK % 2 + 2]),
                ("(mesh, 1)", lambda: (init_device_mesh("cpu", (2, 2)), 1),
                 [RANK // 2 * 2, RANK // 2 * 2 + 1]),
                ("mesh group", lambda: _keep(init_device_mesh("cpu", (2, 2))).get_group(1),
                 [RANK // 2 * 2, RANK // 2 * 2 + 1])]
    out.append(("communicator", lambda: COMM, list(range(N))))
    return out


# A mesh owns its communicators: one whose group a test passes on must live on.
_kept: list = []


def _keep(mesh):
    _kept.append(mesh)
    return mesh


GROUPS = groups()


def make(maker):
    return maker()


def value(rank, shape=(4, 6)):
    """Rank `rank`'s input."""
    return np.arange(float(np.prod(shape))).reshape(shape) + 100.0 * rank


def block(a, dim, i, n):
    size = a.shape[dim] // n
    return np.take(a, range(i * size, (i + 1) * size), axis=dim)


@pytest.mark.parametrize("label,maker,ranks", GROUPS, ids=[g[0] for g in GROUPS])
def test_values_match_numpy(label, maker, ranks):
    group = make(maker)
    n, me = len(ranks), ranks.index(RANK)
    xs = [value(r) for r in ranks]
    x = xs[me]
    for dim in (0, 1, -1):
        got = funcol.all_gather_single(x, dim, group)
        assert np.array_equal(got, np.concatenate(xs, axis=dim)), dim
    for op, reduce in (("sum", np.sum), ("max", np.max), ("min", np.min),
                       ("avg", np.mean), ("product", np.prod)):
        want = reduce(np.stack(xs), axis=0)
        assert np.allclose(funcol.all_reduce(x, op, group), want), op
        if 4 % n == 0:
            assert np.allclose(funcol.reduce_scatter_single(x, op, 0, group),
                               block(want, 0, me, n)), op
        if 6 % n == 0:
            assert np.allclose(funcol.reduce_scatter_single(x, op, 1, group),
                               block(want, 1, me, n)), op
    rows = value(RANK, (2 * n, 3))
    got = funcol.all_to_all_single(rows, None, None, group)
    assert np.array_equal(got, np.concatenate([value(r, (2 * n, 3))[2 * me:2 * me + 2]
                                               for r in ranks]))
    # Uneven splits: rank i sends i + j + 1 rows to rank j.
    ins = [me + j + 1 for j in range(n)]
    outs = [i + me + 1 for i in range(n)]
    mine = value(RANK, (sum(ins), 2))
    got = funcol.all_to_all_single(mine, outs, ins, group)
    parts = []
    for i, r in enumerate(ranks):
        theirs = value(r, (sum(i + j + 1 for j in range(n)), 2))
        start = sum(i + j + 1 for j in range(me))
        parts.append(theirs[start:start + i + me + 1])
    assert np.array_equal(got, np.concatenate(parts))
    assert funcol.wait_tensor(got) is got


def leaf(a):
    """A local array that requires grad, as to_local() gives one."""
    return DTensor.from_local(a, local_mesh(), [Replicate()]).requires_grad_()


@pytest.mark.parametrize("label,maker,ranks", GROUPS, ids=[g[0] for g in GROUPS])
def test_gradients_are_the_reverse_collectives(label, maker, ranks):
    group = make(maker)
    n, me = len(ranks), ranks.index(RANK)
    weights = [value(r, (4 * n, 6)) * 0.01 + 1 for r in ranks]  # dL/dy on each rank

    def grad(call, x, w):
        x = leaf(x)
        (call(x) * w).sum().backward()
        return x.grad.to_local()

    g = grad(lambda x: funcol.all_gather_single(x, 0, group), value(RANK), weights[me])
    assert np.allclose(g, sum(block(w, 0, me, n) for w in weights))
    g = grad(lambda x: funcol.all_reduce(x, "sum", group), value(RANK, (4 * n, 6)),
             weights[me])
    assert np.allclose(g, sum(weights))
    w4 = [block(w, 0, 0, n) for w in weights]
    g = grad(lambda x: funcol.reduce_scatter_single(x, "sum", 0, group),
             value(RANK, (4 * n, 6)), w4[me])
    assert np.allclose(g, np.concatenate(w4))
    g = grad(lambda x: funcol.all_to_all_single(x, None, None, group),
             value(RANK, (4 * n, 6)), weights[me])
    want = np.concatenate([block(w, 0, me, n) for w in weights])
    assert np.allclose(g, want)
    # Uneven: the gradient goes back by the swapped splits.
    ins, outs = [me + j + 1 for j in range(n)], [i + me + 1 for i in range(n)]
    ws = [value(r, (sum(i + ranks.index(r) + 1 for i in range(n)), 2)) for r in ranks]
    g = grad(lambda x: funcol.all_to_all_single(x, outs, ins, group),
             value(RANK, (sum(ins), 2)), ws[me])
    parts = []
    for j in range(n):
        start = sum(i + j + 1 for i in range(me))
        parts.append(ws[j][start:start + me + j + 1])
    assert np.allclose(g, np.concatenate(parts))


def test_to_local_and_local_map_keep_the_gradient():
    mesh = init_device_mesh("cpu", (N,))
    full = np.arange(8.0 * N).reshape(2 * N, 4)
    x = mt.distribute_tensor(full, mesh, [Shard(0)]).requires_grad_()
    w = np.linspace(0.5, 1.5, full.size).reshape(full.shape)
    # On to_local()'s array: every rank gathers the whole and weighs it.
    gathered = funcol.all_gather_single(x.to_local(), 0, mesh)
    (gathered * w).sum().backward()
    assert np.allclose(x.grad.full_tensor(), N * w)

    def gather_rows(local):
        return funcol.all_gather_single(local, 0, mesh) * 2.0

    x.grad = None
    y = local_map(gather_rows, out_placements=[Replicate()], in_placements=([Shard(0)],))(x)
    assert np.allclose(y.full_tensor(), 2 * full)
    (y * w).sum().backward()
    assert np.allclose(x.grad.full_tensor(), 2 * N * w)


def test_comm_debug_mode_counts_forward_and_backward():
    mesh = init_device_mesh("cpu", (N,))
    x = leaf(value(RANK, (2 * N, 2)))
    with CommDebugMode() as cm:
        y = funcol.all_gather_single(x, 0, mesh)
        z = funcol.reduce_scatter_single(y, "sum", 0, mesh)
        a = funcol.all_to_all_single(funcol.all_reduce(z, "sum", mesh), None, None, mesh)
        a.sum().backward()
    expect = {"all_gather_into_tensor": 2, "reduce_scatter_tensor": 2, "all_reduce": 2,
              "all_to_all_single": 2} if N > 1 else {}
    assert dict(cm.get_comm_counts()) == expect
    forward = {k: v // 2 for k, v in expect.items()}
    counts = cm.comm_module_counts["Global"]
    assert dict(counts["forward"]) == forward and dict(counts["backward"]) == forward


def test_plain_arrays_give_plain_arrays_and_the_old_names_warn():
    mesh = init_device_mesh("cpu", (N,))
    out = funcol.all_reduce(np.ones(3), "sum", mesh)
    assert type(out) is np.ndarray and np.array_equal(out, np.full(3, N))
    out = funcol.all_reduce(np.array(2.0), "max", mesh)
    assert out.shape == () and out == 2.0
    out = funcol.all_gather_single(np.ones((2, 4), np.float32)[:, ::2], 1, mesh)
    assert out.shape == (2, 2 * N) and out.dtype == np.float32
    with pytest.warns(FutureWarning, match="all_gather_single"):
        assert funcol.all_gather_tensor(np.ones(2), 0, mesh).shape == (2 * N,)
    with pytest.warns(FutureWarning, match="reduce_scatter_single"):
        funcol.reduce_scatter_tensor_autograd(np.ones(2 * N), "sum", 0, mesh)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        funcol.all_gather_single_autograd(np.ones(2), 0, mesh)
        funcol.all_to_all_single_autograd(np.ones(N), None, None, mesh)


def test_bad_arguments_raise_alike_on_every_rank():
    mesh = init_device_mesh("cpu", (N, 1))
    p = Problems()
    expect_same_error(p, "2-D mesh", lambda: funcol.all_reduce(np.ones(2), "sum", mesh),
                      AssertionError, "Only 1D mesh")
    expect_same_error(p, "a name for a dim",
                      lambda: funcol.all_reduce(np.ones(2), "sum", (mesh, "x")), ValueError,
                      "Invalid tuple")
    expect_same_error(p, "a list of ranks",
                      lambda: funcol.all_reduce(np.ones(2), "sum", list(range(N))),
                      ValueError, "Unsupported group type")
    expect_same_error(p, "reduceOp",
                      lambda: funcol.all_reduce(np.ones(2), "band", (mesh, 0)), ValueError,
                      "reduceOp")
    expect_same_error(p, "a DTensor", lambda: funcol.all_reduce(
        mt.distribute_tensor(np.ones(2), mesh), "sum", (mesh, 0)), TypeError, "to_local")
    if N > 1:
        expect_same_error(p, "not a multiple",
                          lambda: funcol.reduce_scatter_single(np.ones(N + 1), "sum", 0,
                                                               (mesh, 0)),
                          AssertionError, "multiple of group_size")
        expect_same_error(p, "a rank's other shape",
                          lambda: funcol.all_gather_single(np.ones(2 + (RANK == 1)), 0,
                                                           (mesh, 0)),
                          ValueError, "different arguments")
        expect_same_error(p, "a rank's other dim",
                          lambda: funcol.all_gather_single(np.ones((2, 2)), RANK % 2,
                                                           (mesh, 0)),
                          ValueError, "different arguments")
        expect_same_error(p, "a rank's bad dim",
                          lambda: funcol.all_gather_single(np.ones((2, 2)),
                                                           5 if RANK == 1 else 0, (mesh, 0)),
                          IndexError, "out of range")
        expect_same_error(p, "output splits that are not what is sent",
                          lambda: funcol.all_to_all_single(np.ones(N), [2] + [0] * (N - 1),
                                                           [1] * N, (mesh, 0)),
                          ValueError, "output_split_sizes")
    x = leaf(np.ones(2))
    y = funcol.all_reduce(x, "max", (mesh, 0))
    expect_same_error(p, "max has no backward", lambda: y.sum().backward(), RuntimeError,
                      "only supports 'sum'")
    assert p == []
