"""Strided shards (torch's ``_StridedShard``): flattening an array sharded on a
dim that is not the first of the flattened group moves no data and gives torch's
placement; every operation, redistribute and checkpoint takes the result and
gives NumPy's values, at any number of ranks. The expected local arrays come
from torch's definition (cut into split_factor pieces, cut each over the ranks,
concatenate), written here apart from mpitensor's own translation."""

from __future__ import annotations

import io
import pickle
from contextlib import redirect_stdout

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from mpitensor.debug import CommDebugMode, visualize_sharding
from mpitensor.placement_types import _StridedShard
from strided_helpers import ref_local

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
R, S0, S1 = Replicate(), Shard(0), Shard(1)
_MESHES: dict = {}


def mesh_of(shape):
    if shape not in _MESHES:
        _MESHES[shape] = mt.init_device_mesh("cpu", shape)
    return _MESHES[shape]


def meshes_2d():
    return [(2, 2)] if W == 4 else [(1, W), (W, 1)]


def counts(fn):
    with CommDebugMode() as c:
        out = fn()
    return out, c.get_total_counts()


def flat_placements(pls, mesh_shape):
    """torch's placements of (8, 6) placed `pls`, flattened."""
    out, rows = [], 8
    for m, p in enumerate(pls):
        if p == S0:
            out.append(S0)
            rows //= mesh_shape[m]
        elif p == S1:
            out.append(_StridedShard(0, split_factor=rows))
        else:
            out.append(p)
    return tuple(out)


def even(mesh_shape, pls):
    """Whether the rows cut evenly wherever a cut of the columns follows them."""
    return all(8 % mesh_shape[m] == 0 for m, p in enumerate(pls) if p == S0)


CASES = [((W,), (S1,))] + [(ms, pls) for ms in meshes_2d()
                           for pls in ((S0, S1), (S1, S0), (R, S1))]
FULL = np.arange(48.0).reshape(8, 6) - 7.5


@pytest.mark.parametrize("mesh_shape,pls", CASES, ids=str)
@pytest.mark.parametrize("how", ["reshape", "view", "np.reshape", "ravel"])
def test_flatten_moves_nothing(mesh_shape, pls, how):
    mesh = mesh_of(mesh_shape)
    x = distribute_tensor(FULL, mesh, pls)
    run = {"reshape": lambda: x.reshape(-1), "view": lambda: x.view(-1),
           "np.reshape": lambda: np.reshape(x, (48,)), "ravel": lambda: np.ravel(x)}[how]
    y, n = counts(run)
    assert y.shape == (48,)
    np.testing.assert_array_equal(y.full_tensor(), FULL.reshape(-1))
    if not even(mesh_shape, pls):
        # torch refuses this view (an uneven cut of a dim with a cut after it in
        # the group); the data moves instead.
        np.testing.assert_array_equal(y.reshape(8, 6).full_tensor(), FULL)
        return
    assert n == 0
    assert y.placements == flat_placements(pls, mesh_shape)
    coord = mesh.get_coordinate()
    np.testing.assert_array_equal(y.to_local(),
                                  ref_local(FULL.reshape(-1), mesh_shape, coord,
                                            y.placements))
    assert y.to_local().size == 0 or np.shares_memory(y.to_local(), x.to_local())
    back, n = counts(lambda: y.reshape(8, 6))
    assert n == 0 and back.placements == tuple(pls)
    np.testing.assert_array_equal(back.full_tensor(), FULL)
    np.testing.assert_array_equal(y.full_tensor(), FULL.reshape(-1))


@pytest.mark.parametrize("shape", [(7, 6), (8, 5), (5, 3), (3, 7, 4)])
def test_uneven_flatten(shape):
    full = np.arange(float(np.prod(shape))).reshape(shape)
    mesh = mesh_of((W,))
    x = distribute_tensor(full, mesh, [Shard(len(shape) - 1)])
    y, n = counts(lambda: x.reshape(-1))
    np.testing.assert_array_equal(y.full_tensor(), full.reshape(-1))
    if isinstance(y.placements[0], _StridedShard):
        assert n == 0
        np.testing.assert_array_equal(
            y.to_local(), ref_local(full.reshape(-1), (W,), mesh.get_coordinate(),
                                    y.placements))
    np.testing.assert_array_equal(y.reshape(shape).full_tensor(), full)
    np.testing.assert_array_equal((y * 2).full_tensor(), 2 * full.reshape(-1))


@pytest.mark.parametrize("mesh_shape", meshes_2d(), ids=str)
@pytest.mark.parametrize("pls", [(S0, Shard(2)), (S0, S1), (S1, Shard(2))], ids=str)
def test_flatten_after_a_shard_left_empty(mesh_shape, pls):
    """A dim of size 1 cut over several ranks leaves some empty, so the dims before
    a later Shard of the group have no one local size and no split factor
    describes the shares (a factor of zero was built and refused): the data moves
    instead, with NumPy's values."""
    mesh = mesh_of(mesh_shape)
    full = np.arange(2.0).reshape(1, 1, 2) - 0.5
    x = distribute_tensor(full, mesh, pls)
    y = x.reshape(-1)
    np.testing.assert_array_equal(y.full_tensor(), full.reshape(-1))
    np.testing.assert_array_equal(y.to_local(), ref_local(full.reshape(-1), mesh_shape,
                                                          mesh.get_coordinate(),
                                                          y.placements))
    np.testing.assert_array_equal(y.reshape(1, 1, 2).full_tensor(), full)


def test_no_strided_view_after_an_uneven_cut():
    """The view's placements are None (move the data) when a dim before a later
    Shard of its group is cut unevenly, at any number of ranks: the metadata
    alone decides."""
    from mpitensor._strided import view_placements
    assert view_placements((1, 1, 2), (S0, Shard(2)), (2,), (2, 2)) is None
    assert view_placements((1, 3), (S0, S1), (3,), (2, 1)) is None
    assert view_placements((3, 4), (S0, S1), (12,), (2, 2)) is None
    assert view_placements((4, 4), (S0, S1), (16,), (2, 2)) == (
        S0, _StridedShard(0, split_factor=2))


def test_a_size_one_dim_is_a_group_of_its_own():
    """A size-1 dim facing a larger one is a reshape group of its own, in the views
    as in reshape's dim map (torch's view_groups): a Shard of the dim after it
    stays a plain Shard, and a merge past it is a strided view, not a move."""
    from mpitensor._strided import reshape_groups, view_placements
    assert reshape_groups((2, 1, 4), (1, 8)) == [((), (0,)), ((0, 1, 2), (1,))]
    assert view_placements((1, 8), (S1,), (8,), (2,)) == (S0,)
    assert view_placements((4,), (S0,), (1, 4), (2,)) == (S1,)
    assert view_placements((2, 1, 4), (Shard(2),), (1, 8), (2,)) == (
        _StridedShard(1, split_factor=2),)


@pytest.mark.parametrize("mesh_shape", meshes_2d())
def test_uneven_2d_values(mesh_shape):
    full = np.arange(42.0).reshape(7, 6)
    mesh = mesh_of(mesh_shape)
    for pls in ((S0, S1), (S1, S0)):
        y = distribute_tensor(full, mesh, pls).reshape(-1)
        np.testing.assert_array_equal(y.full_tensor(), full.reshape(-1))
        np.testing.assert_array_equal(y.reshape(7, 6).full_tensor(), full)


@pytest.mark.parametrize("mesh_shape,pls", CASES, ids=str)
def test_redistribute(mesh_shape, pls):
    mesh = mesh_of(mesh_shape)
    y = distribute_tensor(FULL, mesh, pls).reshape(-1)
    flat = FULL.reshape(-1)
    targets = [(R,) * mesh.ndim, (S0,) + (R,) * (mesh.ndim - 1),
               (R,) * (mesh.ndim - 1) + (S0,), (S0,) * mesh.ndim, y.placements]
    for t in targets:
        z, n = counts(lambda: y.redistribute(mesh, t))
        assert z.placements == t
        assert n <= mesh.ndim
        np.testing.assert_array_equal(z.full_tensor(), flat)
        np.testing.assert_array_equal(
            z.to_local(), ref_local(flat, mesh_shape, mesh.get_coordinate(), t))
        # and back to the strided layout
        w = z.redistribute(mesh, y.placements)
        assert w.placements == y.placements
        np.testing.assert_array_equal(w.to_local(), y.to_local())


def test_strided_moves_never_call_python():
    """A move from, to or between strided layouts is the executor's: once its
    plans are made, it calls into Python for nothing (no hook of any kind)."""
    from mpitensor._trace import hook_stats
    mesh = mesh_of((W,))
    x = distribute_tensor(np.arange(96.0).reshape(8, 12), mesh, [S1])
    y = x.reshape(-1)                        # _S(0, 8)
    sf4 = (_StridedShard(0, split_factor=4),)
    moves = [lambda: y.redistribute(mesh, (R,)), lambda: y.redistribute(mesh, (S0,)),
             lambda: y.redistribute(mesh, sf4),
             lambda: y.redistribute(mesh, sf4).redistribute(mesh, y.placements)]
    for move in moves:
        move()
        before = hook_stats()
        out = move()
        after = hook_stats()
        calls = {k: after[k] - before[k] for k in after if k != "runs"}
        assert not any(calls.values()), calls
        np.testing.assert_array_equal(out.full_tensor(), np.arange(96.0))


def test_strided_elementwise_and_whole_reductions_cost_what_plain_ones_do():
    """Operands strided alike (and replicated ones, and scalars) run elementwise on
    their expansions, and reductions over every element on the expansion, in the
    executor: each call makes the same calls into Python as on a plain DTensor
    (the local NumPy call; an entry where the reduction has one). With a gradient
    wanted too (test_strided_calls_that_record_cost_what_plain_ones_do)."""
    from mpitensor._trace import hook_stats
    mesh = mesh_of((W,))
    full = np.arange(96.0).reshape(8, 12) - 40.5
    p = distribute_tensor(full, mesh, [S1])
    x, y = p.reshape(-1), (p * 2.0).reshape(-1)          # _S(0, 8)
    flat = full.ravel()
    calls = [(lambda a, b: a + b, flat * 3), (lambda a, b: np.exp(a) - 1.5, np.exp(flat) - 1.5),
             (lambda a, b: -a, -flat), (lambda a, b: np.maximum(a, 0.0), np.maximum(flat, 0)),
             (lambda a, b: a < b, flat < 2 * flat), (lambda a, b: a.sum(), full.sum()),
             (lambda a, b: a.max(), full.max()), (lambda a, b: a.argmin(), full.argmin()),
             (lambda a, b: a.std(), full.std())]

    def spent(a, b, call):
        call(a, b)
        before = hook_stats()
        got = call(a, b)
        after = hook_stats()
        return got, {k: after[k] - before[k] for k in after}

    for call, want in calls:
        got, strided = spent(x, y, call)
        _, plain = spent(p, p * 2.0, call)
        assert strided == plain, (strided, plain)
        if np.ndim(want):
            assert got.placements == x.placements
            np.testing.assert_array_equal(
                got.to_local(), ref_local(want, (W,), mesh.get_coordinate(), x.placements))
        np.testing.assert_allclose(got.full_tensor(), want)
    # A replicated operand of the same shape is read as the expansion's, either side.
    rx, rp = distribute_tensor(flat, mesh, [R]), distribute_tensor(full, mesh, [R])
    for call in (lambda a, b: a - b, lambda a, b: np.multiply(b, a)):
        got, strided = spent(x, rx, call)
        _, plain = spent(p, rp, call)
        assert strided == plain, (strided, plain)
        assert got.placements == x.placements
        np.testing.assert_allclose(got.full_tensor(), call(flat, flat))
    quot, rem = np.divmod(x, 4.0)
    assert quot.placements == rem.placements == x.placements
    np.testing.assert_array_equal(rem.full_tensor(), np.mod(flat, 4.0))


def test_strided_calls_that_record_cost_what_plain_ones_do():
    """With a gradient wanted, the executor records the views it reads strided
    operands through (as restride's nodes) around the plain call's node: the
    forward calls into Python as on plain DTensors, and the gradients are exact,
    a replicated operand's too."""
    from mpitensor._trace import hook_stats
    mesh = mesh_of((W,))
    full = np.arange(96.0).reshape(8, 12) / 50 - 0.9
    flat = full.ravel()
    p = distribute_tensor(full, mesh, [S1]).requires_grad_()
    q = distribute_tensor(flat, mesh, [R]).requires_grad_()
    x = p.reshape(-1)                                    # _S(0, 8)

    def spent(call, *args):
        before = hook_stats()
        got = call(*args)
        after = hook_stats()
        return got, {k: after[k] - before[k] for k in after if k != "runs"}

    def forward(a, b):
        return (np.sin(a) * a - b * a).sum()

    forward(x, q)
    loss, strided = spent(forward, x, q)
    _, plain = spent(forward, p, distribute_tensor(full, mesh, [R]).requires_grad_())
    assert strided["entry"] == plain["entry"] == 0, (strided, plain)
    assert strided == plain, (strided, plain)
    np.testing.assert_allclose(loss.detach().full_tensor(),
                               np.sum(np.sin(flat) * flat - flat * flat))
    p.grad = q.grad = None
    loss.backward()
    np.testing.assert_allclose(p.grad.full_tensor().ravel(),
                               np.cos(flat) * flat + np.sin(flat) - flat)
    assert p.grad.placements == p.placements
    np.testing.assert_allclose(q.grad.full_tensor(), -flat)


def test_matmul_of_operands_strided_alike_is_no_elementwise_call():
    """np.matmul is a ufunc but not an elementwise one: its operands' expansions
    (a batch of smaller matrices) must not stand for them. It moves them to plain
    layouts first, as any call without a strided rule."""
    mesh = mesh_of((W,))
    a = np.arange(16.0).reshape(4, 2, 2)
    b = a[::-1] + 1
    x = distribute_tensor(a, mesh, [Shard(2)]).reshape(4, 4)        # _S(1, 2)
    y = distribute_tensor(b, mesh, [Shard(2)]).reshape(4, 4)
    np.testing.assert_array_equal((x @ y).full_tensor(), a.reshape(4, 4) @ b.reshape(4, 4))
    f = np.arange(48.0).reshape(8, 6)
    v = distribute_tensor(f, mesh, [S1]).reshape(-1)                 # _S(0, 8)
    np.testing.assert_array_equal((v @ v).full_tensor(), f.ravel() @ f.ravel())
    np.testing.assert_array_equal(np.matmul(x, y, dtype=np.float32).full_tensor(),
                                  (a.reshape(4, 4) @ b.reshape(4, 4)).astype(np.float32))


@pytest.mark.filterwarnings("ignore::mpitensor.GatherWarning")
@pytest.mark.parametrize("first", [Partial(), R], ids=str)
def test_a_gathered_write_into_a_strided_destination_lands_in_place(first):
    """A write with no distributed rule (an index list assigned to) runs gathered
    on the destination's plain copy, which is read back: written into the strided
    DTensor itself, its local array is no box to index (with a Partial kept,
    once per reduction)."""
    mesh = mesh_of((1, W))
    a = np.arange(12.0)
    pls = (first, _StridedShard(0, split_factor=3))
    local = ref_local(a, (1, W), mesh.get_coordinate(), (R, pls[1])).copy()
    x = DTensor.from_local(local, mesh, pls, shape=(12,), stride=(1,))
    x[[0, 2, -1]] = 7.0
    want = a.copy()
    want[[0, 2, -1]] = 7.0
    assert x.placements == pls
    np.testing.assert_array_equal(x.full_tensor(), want)


@pytest.mark.filterwarnings("ignore::mpitensor.GatherWarning")
@pytest.mark.parametrize("call", [
    lambda x: np.add.at(x, [0, 2, 2, -1], 1.0), lambda x: np.maximum.at(x, [0, 1], 1.5),
    lambda x: np.negative.at(x, [1, 3]), lambda x: np.place(x, x > 0, [1.0, 2.0]),
    lambda x: np.putmask(x, x > 0, x * 10), lambda x: np.put(x, [0, 3], [5.0, 6.0]),
    lambda x: np.copyto(x, -1.0, where=x > 0)],
    ids=["add.at", "maximum.at", "negative.at", "place", "putmask", "put", "copyto"])
def test_functions_that_write_into_a_strided_argument_write_it(call):
    """NumPy's writers into their first argument (ufunc.at, put, place, putmask,
    copyto) run on a plain copy of a strided one, whose written values come back."""
    mesh = mesh_of((W,))
    f = np.arange(12.0) - 5
    want = f.copy()
    call(want)
    x = distribute_tensor(f, mesh, [_StridedShard(0, split_factor=3)])
    call(x)
    assert x.placements == (_StridedShard(0, split_factor=3),)
    np.testing.assert_array_equal(x.full_tensor(), want)


@pytest.mark.filterwarnings("ignore::mpitensor.GatherWarning")
def test_whole_reductions_of_a_strided_dtensor_take_their_keywords():
    """A reduction over every element reads the expansion only when its keywords
    fit any shape: where= (an array of the input's shape) takes the plain path."""
    mesh = mesh_of((W,))
    f = np.arange(48.0).reshape(8, 6) - 10
    x = distribute_tensor(f, mesh, [S1]).reshape(-1)                 # _S(0, 8)
    flat = f.ravel()

    def value(r):  # a gathered call gives NumPy's scalar
        return r.full_tensor() if isinstance(r, DTensor) else r

    assert value(np.sum(x, where=x > 0)) == np.sum(flat, where=flat > 0)
    assert value(np.max(x, initial=100.0)) == 100.0
    np.testing.assert_array_equal(np.sum(x, keepdims=True).full_tensor(),
                                  np.sum(flat, keepdims=True))
    assert np.sum(x, dtype=np.float32).full_tensor().dtype == np.float32


def test_a_replicated_0d_operand_broadcasts_over_a_strided_one():
    """A 0-d DTensor replicated on the mesh is a scalar to the expansion: the call
    keeps the strided placements and moves nothing, and both get their gradients."""
    mesh = mesh_of((W,))
    f = np.arange(48.0).reshape(8, 6) / 10
    p = distribute_tensor(f, mesh, [S1]).requires_grad_()
    s = distribute_tensor(np.array(2.0), mesh, [R]).requires_grad_()
    x = p.reshape(-1)                                                  # _S(0, 8)
    with CommDebugMode() as comm:
        y = x * s - s
    assert comm.get_total_counts() == 0
    assert y.placements == x.placements
    np.testing.assert_allclose(y.detach().full_tensor(), f.ravel() * 2.0 - 2.0)
    y.sum().backward()
    np.testing.assert_allclose(p.grad.full_tensor(), np.full((8, 6), 2.0))
    np.testing.assert_allclose(s.grad.full_tensor(), f.sum() - 48)


RANDOM_MESHES = [(W,)] + ([(2, 2)] if W == 4 else [(1, W), (W, 1)] if W > 1 else [])


@pytest.mark.parametrize("mesh_shape", RANDOM_MESHES, ids=str)
def test_random_strided_moves(mesh_shape):
    """Moves between random layouts, strided or not, on uneven shapes too: every
    rank's local array is torch's (the reference below, apart from the core), and
    the values survive a round trip."""
    rng = np.random.default_rng(5)
    mesh = mesh_of(mesh_shape)
    coord = mesh.get_coordinate()
    shapes = [(8, 6), (12,), (6, 4, 2), (5, 6)]

    def layout(shape):
        out = []
        for _ in mesh_shape:
            d = int(rng.integers(len(shape)))
            r = rng.random()
            out.append(R if r < 0.25 else Shard(d) if r < 0.5 else
                       _StridedShard(d, split_factor=int(rng.choice([2, 3, 4]))))
        return tuple(out)

    def valid(full, pls):
        # torch's meaning holds on every rank (each split divides the local dim).
        try:
            for c in np.ndindex(*mesh_shape):
                ref_local(full, mesh_shape, c, pls)
        except ValueError:
            return False
        return True

    moved = 0
    for _ in range(120):
        shape = shapes[int(rng.integers(len(shapes)))]
        full = np.arange(float(np.prod(shape))).reshape(shape)
        a, b = layout(shape), layout(shape)
        if not (valid(full, a) and valid(full, b)):
            continue
        try:
            x = DTensor.from_local(ref_local(full, mesh_shape, coord, a), mesh, a,
                                         shape=shape, stride=strides(shape))
            y = x.redistribute(mesh, b)
        except ValueError as e:  # a layout with no plain form, refused everywhere
            assert "into whole pieces" in str(e)
            continue
        moved += 1
        np.testing.assert_array_equal(y.to_local(),
                                      ref_local(full, mesh_shape, coord, b), err_msg=f"{a}->{b}")
        np.testing.assert_array_equal(y.redistribute(mesh, a).to_local(), x.to_local())
    assert moved >= 30


def strides(shape):
    return tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))


@pytest.mark.parametrize("mesh_shape,pls", CASES, ids=str)
def test_elementwise_and_reductions(mesh_shape, pls):
    mesh = mesh_of(mesh_shape)
    flat = FULL.reshape(-1)
    y = distribute_tensor(FULL, mesh, pls).reshape(-1)
    y2 = distribute_tensor(FULL * 3, mesh, pls).reshape(-1)
    rep = distribute_tensor(flat + 1, mesh, [R] * mesh.ndim)
    for fn, expect in ((lambda: y * y2, flat * flat * 3), (lambda: y + rep, 2 * flat + 1),
                       (lambda: rep - y, np.ones(48)), (lambda: np.exp(y), np.exp(flat)),
                       (lambda: y + 1.5, flat + 1.5), (lambda: np.maximum(y, y2),
                                                       np.maximum(flat, 3 * flat))):
        z, n = counts(fn)
        assert n == 0 and z.placements == y.placements
        np.testing.assert_allclose(z.full_tensor(), expect)
    s, n = counts(lambda: y.sum())
    assert n == 0
    assert s.full_tensor() == flat.sum()
    assert np.sum(y * y).full_tensor() == (flat * flat).sum()
    assert y.max().full_tensor() == flat.max()
    np.testing.assert_allclose(np.mean(y).full_tensor(), flat.mean())


@pytest.mark.parametrize("mesh_shape,pls", CASES, ids=str)
def test_other_ops_take_plain_layout(mesh_shape, pls):
    mesh = mesh_of(mesh_shape)
    flat = FULL.reshape(-1)
    y = distribute_tensor(FULL, mesh, pls).reshape(-1)
    np.testing.assert_array_equal(np.cumsum(y).full_tensor(), np.cumsum(flat))
    np.testing.assert_array_equal(y[3:20].full_tensor(), flat[3:20])
    np.testing.assert_array_equal(np.sort(-y).full_tensor(), np.sort(-flat))
    np.testing.assert_array_equal(y.sum(axis=0).full_tensor(), flat.sum(axis=0))
    np.testing.assert_array_equal(y.reshape(4, 12).full_tensor(), flat.reshape(4, 12))
    np.testing.assert_array_equal(np.outer(y, y[:3]).full_tensor(),
                                  np.outer(flat, flat[:3]))
    np.testing.assert_array_equal((y + y.reshape(8, 6).reshape(-1)).full_tensor(), 2 * flat)
    np.testing.assert_array_equal(y.astype(np.float32).full_tensor(),
                                  flat.astype(np.float32))


def test_from_local_and_repr():
    mesh = mesh_of((W,))
    pl = (_StridedShard(0, split_factor=8),)
    coord = mesh.get_coordinate()
    local = ref_local(FULL.reshape(-1), (W,), coord, pl).copy()
    y = DTensor.from_local(local, mesh, pl, shape=(48,), stride=(1,))
    np.testing.assert_array_equal(y.full_tensor(), FULL.reshape(-1))
    assert "_StridedShard(dim=0, sf=8)" in repr(y)
    assert y.to_local() is local
    if 6 % W == 0:
        even = DTensor.from_local(local, mesh, pl)
        assert even.shape == (48,)
        np.testing.assert_array_equal(even.full_tensor(), FULL.reshape(-1))
    neg = DTensor.from_local(local, mesh, (_StridedShard(-1, sf=8),), shape=(48,),
                             stride=(1,))
    assert neg.placements == pl


def test_bad_split_factor_refused_on_every_rank():
    mesh = mesh_of((W,))
    local = np.zeros(48 // W if 48 % W == 0 else 0)
    y = DTensor.from_local(local, mesh, (_StridedShard(0, split_factor=5),),
                           shape=(48,), stride=(1,))
    with pytest.raises(ValueError, match="does not cut dim 0 into whole pieces"):
        y.full_tensor()


def test_visualize_sharding():
    mesh = mesh_of((W,))
    y = distribute_tensor(np.zeros((4, 6)), mesh, [S1]).reshape(-1)
    out = io.StringIO()
    with redirect_stdout(out):
        visualize_sharding(y)
    if mesh.get_coordinate() == [0] or tuple(mesh.get_coordinate()) == (0,):
        text = out.getvalue()
        assert "Row 0-" in text and "cpu:0" in text
        if W == 2:
            assert "Row 3-5" in text and "cpu:1" in text


def test_placement_value_semantics():
    a = _StridedShard(0, split_factor=8)
    assert a == _StridedShard(0, sf=8) and a is _StridedShard(dim=0, split_factor=8)
    assert a != _StridedShard(0, split_factor=4) and a != Shard(0)
    assert hash(a) == hash((0, 8))
    assert repr(a) == "_StridedShard(dim=0, sf=8)" and str(a) == "_S(0, 8)"
    assert a.is_shard() and a.is_shard(0) and not a.is_shard(1)
    assert not isinstance(a, Shard) and not a.is_replicate() and not a.is_partial()
    assert pickle.loads(pickle.dumps(a)) is a
    with pytest.raises(TypeError):
        _StridedShard(0, split_factor=2, sf=3)
    with pytest.raises(ValueError):
        _StridedShard(0, split_factor=0)


def test_backward_of_flatten():
    mesh = mesh_of((W,))
    x = distribute_tensor(FULL, mesh, [S1]).requires_grad_()

    def step():
        y = x.reshape(-1)
        (y * y).sum().backward()

    _, n = counts(step)
    assert n == 0
    assert x.grad.placements == (S1,)
    np.testing.assert_allclose(x.grad.full_tensor(), 2 * FULL)


@pytest.mark.parametrize("mesh_shape,pls", CASES, ids=str)
def test_backward_2d(mesh_shape, pls):
    mesh = mesh_of(mesh_shape)
    x = distribute_tensor(FULL, mesh, pls).requires_grad_()
    w = distribute_tensor(FULL * 0.5, mesh, pls).reshape(-1)
    y = x.reshape(-1)
    (np.exp(y * 0.1) * w).sum().backward()
    # the gradient stays where backward made it (torch's), a plain layout of x's shape
    assert x.grad.shape == x.shape and not any(
        type(p).__name__ == "_StridedShard" for p in x.grad.placements)
    np.testing.assert_allclose(x.grad.full_tensor(),
                               0.1 * np.exp(0.1 * FULL) * FULL * 0.5)


@pytest.mark.parametrize("mesh_shape,pls", CASES, ids=str)
def test_checkpoint_round_trip(tmp_path_factory, mesh_shape, pls):
    from mpitensor import checkpoint
    mesh = mesh_of(mesh_shape)
    base = COMM.bcast(str(tmp_path_factory.mktemp("strided")) if COMM.rank == 0 else None)
    y = distribute_tensor(FULL, mesh, pls).reshape(-1)
    path = f"{base}/strided.npy"
    checkpoint.save(y, path, device_mesh=mesh)
    if COMM.rank == 0:
        np.testing.assert_array_equal(np.load(path), FULL.reshape(-1))
    for target in ((R,) * mesh.ndim, (S0,) * mesh.ndim, y.placements):
        z = checkpoint.load(path, mesh, target)
        assert z.placements == target
        np.testing.assert_array_equal(z.full_tensor(), FULL.reshape(-1))
        np.testing.assert_array_equal(
            z.to_local(), ref_local(FULL.reshape(-1), mesh_shape, mesh.get_coordinate(),
                                    target))
    plain = f"{base}/plain.npy"
    checkpoint.save(distribute_tensor(FULL.reshape(-1), mesh, (S0,) * mesh.ndim), plain,
                    device_mesh=mesh)
    z = checkpoint.load(plain, mesh, y.placements)
    np.testing.assert_array_equal(z.to_local(), y.to_local())


def test_partial_strided_reduces():
    mesh = mesh_of((W,) if W < 4 else (2, 2))
    if mesh.ndim == 1:
        pytest.skip("needs a second mesh dim for a Partial beside the strided shard")
    x = distribute_tensor(FULL, mesh, [S1, R]).reshape(-1)
    local = x.to_local() / mesh.shape[1]
    p = DTensor.from_local(local, mesh, (x.placements[0], Partial()), shape=(48,),
                           stride=(1,))
    np.testing.assert_allclose(p.full_tensor(), FULL.reshape(-1))
    np.testing.assert_allclose(p.redistribute(mesh, x.placements).to_local(),
                               x.to_local())


# -- against torch, when it is installed ---------------------------------------------

@pytest.mark.parametrize("mesh_shape,pls", CASES, ids=str)
@pytest.mark.parametrize("how", ["reshape", "view"])
def test_torch_agrees(mesh_shape, pls, how):
    torch = pytest.importorskip("torch")
    if mesh_shape == (1, W) or mesh_shape == (W, 1):
        pytest.skip("torch is compared on meshes (W,) and (2, 2)")
    from torch.distributed.device_mesh import init_device_mesh as tinit
    from torch.distributed.tensor import Replicate as TR, Shard as TS
    from torch.distributed.tensor import distribute_tensor as tdist
    from torch.distributed.tensor.debug import CommDebugMode as TC
    from torch_helpers import init_gloo
    init_gloo()
    tmesh = tinit("cpu", mesh_shape)
    tpl = [TS(p.dim) if p.is_shard() else TR() for p in pls]
    t = tdist(torch.from_numpy(FULL.copy()), tmesh, tpl)
    with TC() as tc:
        ty = getattr(t, how)(-1)
    mesh = mesh_of(mesh_shape)
    x = distribute_tensor(FULL, mesh, pls)
    y, n = counts(lambda: getattr(x, how)(-1))
    assert n == tc.get_total_counts() == 0
    assert [repr(p) for p in y.placements] == [repr(p) for p in ty.placements]
    np.testing.assert_array_equal(y.to_local(), ty.to_local().numpy())
    back = getattr(y, how)(8, 6)
    assert back.placements == tuple(pls)


@pytest.mark.parametrize("mesh_shape,pls", CASES, ids=str)
def test_in_place_writes_reach_the_strided_tensor(mesh_shape, pls):
    """In-place writes into a reshape write into its base, as NumPy's: with no
    communication where the reshape is a view of the local arrays (strided),
    by the reshape back where its elements had to move (a copy-view)."""
    mesh = mesh_of(mesh_shape)
    full = FULL.copy()
    flat = full.reshape(-1)
    x = distribute_tensor(FULL, mesh, pls)
    y = x.reshape(-1)
    other = distribute_tensor(FULL, mesh, pls).reshape(-1)
    _, n = counts(lambda: np.add(y, other, out=y))
    assert (n == 0) == y.to_local().flags.writeable  # a copy-view is read-only memory
    flat += flat
    y *= 0.5
    flat *= 0.5
    y[3:7] = -1.0
    flat[3:7] = -1.0
    np.copyto(other, y)
    np.testing.assert_array_equal(y.full_tensor(), flat)
    np.testing.assert_array_equal(other.full_tensor(), flat)
    np.testing.assert_array_equal(x.full_tensor(), full)
    assert y.placements == other.placements
    y.fill(2.0)
    np.testing.assert_array_equal(y.full_tensor(), np.full(48, 2.0))
    np.testing.assert_array_equal(x.full_tensor(), np.full((8, 6), 2.0))


def test_pickle_and_local_box():
    mesh = mesh_of((W,))
    y = distribute_tensor(FULL, mesh, [S1]).reshape(-1)
    z = pickle.loads(pickle.dumps(y))
    assert z.placements == y.placements
    np.testing.assert_array_equal(z.to_local(), y.to_local())
    sizes, offsets = mt.compute_local_shape_and_global_offset((48,), mesh, y.placements)
    assert sizes == (y.to_local().size,)
    if sizes[0]:
        assert offsets == (int(np.flatnonzero(FULL.reshape(-1) == y.to_local()[0])[0]),)


def test_strided_leaf_gets_its_gradient_in_place():
    mesh = mesh_of((W,))
    pl = (_StridedShard(0, split_factor=8),)
    flat = FULL.reshape(-1)
    local = ref_local(flat, (W,), mesh.get_coordinate(), pl).copy()
    x = DTensor.from_local(local, mesh, pl, shape=(48,), stride=(1,)).requires_grad_()
    _, n = counts(lambda: (x * x + np.sin(x)).sum().backward())
    assert n == 0
    assert x.grad.placements == pl
    np.testing.assert_allclose(x.grad.full_tensor(), 2 * flat + np.cos(flat))
    (x.reshape(8, 6)[:, 1] * 3.0).sum().backward()
    expect = 2 * flat + np.cos(flat)
    expect.reshape(8, 6)[:, 1] += 3.0
    np.testing.assert_allclose(x.grad.full_tensor(), expect)


def test_factories():
    mesh = mesh_of((W,))
    pl = (_StridedShard(0, split_factor=8),)
    for make, expect in ((lambda: mt.zeros(48, device_mesh=mesh, placements=pl), 0.0),
                         (lambda: mt.full((48,), 3.0, device_mesh=mesh, placements=pl), 3.0)):
        z = make()
        assert z.placements == pl
        np.testing.assert_array_equal(z.full_tensor(), np.full(48, expect))
    # Random values do not depend on the layout.
    mt.manual_seed(7)
    a = mt.rand(48, device_mesh=mesh, placements=pl).full_tensor()
    mt.manual_seed(7)
    b = mt.rand(48, device_mesh=mesh, placements=[R]).full_tensor()
    np.testing.assert_array_equal(a, b)
