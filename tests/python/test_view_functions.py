"""NumPy's functions whose result is a view of their argument give views of
DTensors too, in every layout, also where the elements had to move: ``reshape``,
``ravel``, ``DTensor.view``, ``flip``, ``flipud``, ``fliplr``, the pieces of
``split``, ``array_split``, ``hsplit``, ``vsplit`` and ``dsplit``, ``rot90`` write
through to their base and show the writes into it; ``diagonal`` and ``diag`` of a
matrix are read-only and show them;
where NumPy's result is a copy (a transpose reshaped), ours shares nothing with
the base. Every rank checks the whole arrays against the same NumPy code on the
gathered ones."""

from __future__ import annotations


import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from ops_helpers import W, assert_matches, layout_fixture, make, mesh_of, quiet  # noqa: F401

R, S0, S1, S2, PS = Replicate(), Shard(0), Shard(1), Shard(2), Partial("sum")
# Every placement of a (4, 6, 5) array on each mesh dim, uneven at 3 ranks.
layout = layout_fixture((R, S0, S1, S2, PS), (R, S0, S1, PS))
pytestmark = pytest.mark.usefixtures("quiet")


def _full():
    return np.arange(120.0).reshape(4, 6, 5) - 50.0


# (name, the view NumPy gives): each of a function whose result is a view.
VIEWS = [
    ("reshape", lambda x: np.reshape(x, (8, 15))),
    ("reshape-method", lambda x: x.reshape(24, 5)),
    ("reshape-flat", lambda x: x.reshape(-1)),
    ("reshape-split-dim", lambda x: x.reshape(2, 2, 30)),
    ("ravel", lambda x: np.ravel(x)),
    ("ravel-method", lambda x: x.ravel()),
    ("view-shape", lambda x: x.view(-1) if isinstance(x, mt.DTensor) else x.reshape(-1)),
    ("flip0", lambda x: np.flip(x, 0)),
    ("flip1", lambda x: np.flip(x, 1)),
    ("flip-all", lambda x: np.flip(x)),
    ("flipud", lambda x: np.flipud(x)),
    ("fliplr", lambda x: np.fliplr(x)),
    ("split0", lambda x: np.split(x, 2, axis=0)[1]),
    ("split1", lambda x: np.split(x, 3, axis=1)[0]),
    ("array_split", lambda x: np.array_split(x, 3, axis=0)[0]),
    ("hsplit", lambda x: np.hsplit(x, 2)[1]),
    ("vsplit", lambda x: np.vsplit(x, [1])[1]),
    ("dsplit", lambda x: np.dsplit(x, [2])[0]),
    ("rot90", lambda x: np.rot90(x)),
    ("rot90-axes", lambda x: np.rot90(x, 3, (1, 2))),
    ("view-of-view", lambda x: np.split(np.flip(x, 0), 2, axis=0)[1][:, 1:4]),
]

# Writes into a view, each as a program makes them.
WRITES = [
    ("item", lambda v: v.__setitem__((1,) * v.ndim, 500.0)),
    ("iadd", lambda v: v.__iadd__(1.0)),
    ("slice", lambda v: v.__setitem__((slice(0, 2),), -9.0)),
    ("multiply-out", lambda v: np.multiply(v, 2.0, out=v)),
]


def _after_each(writes, into, a, full, ours, numpys):
    """Each write into ``into(ours, a)`` and ``into(numpys, full)``: the bases and
    the views agree with NumPy's after each."""
    for write in writes:
        write(into(numpys, full))
        write(into(ours, a))
        assert_matches(a, full)
        assert_matches(ours, numpys)


@pytest.mark.parametrize("name,view", VIEWS, ids=[v[0] for v in VIEWS])
def test_a_write_into_the_view_reaches_the_base(layout, name, view):
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    ours, numpys = view(a), view(full)
    assert np.shares_memory(numpys, full)
    assert_matches(ours, numpys)
    _after_each([w for _, w in WRITES], lambda v, base: v, a, full, ours, numpys)


@pytest.mark.parametrize("name,view", VIEWS, ids=[v[0] for v in VIEWS])
def test_the_view_shows_later_writes_into_its_base(layout, name, view):
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    _after_each([lambda x: x.__setitem__((1, 2, 3), 700.0),
                 lambda x: x.__setitem__((slice(None), 0), -1.0),
                 lambda x: x.__imul__(3.0)], lambda v, base: base, a, full, view(a), view(full))


def _strided_base():
    """(x, a): a (4, 3, 2, 5) DTensor sharded on dim 2 and ``a``, its reshape to
    (4, 6, 5), whose dim 1 merges a sharded dim into the one before: strided,
    read through a plain copy where more than one rank shares that dim (empty
    blocks from 3 ranks)."""
    x = make(_full().reshape(4, 3, 2, 5), mesh_of((W,)), (S2,))
    a = np.reshape(x, (4, 6, 5))
    assert type(a.placements[0]) is mt.placement_types._StridedShard
    return x, a


@pytest.mark.parametrize("name,view", VIEWS, ids=[v[0] for v in VIEWS])
def test_a_view_of_a_strided_dtensor_writes_through_and_shows_later_writes(name, view):
    """As NumPy's view of the array it is a reshape of: each write into the view
    reaches the strided DTensor and the DTensor it is a reshape of, and each write
    into either is seen in the view."""
    x, a = _strided_base()
    full = _full()
    ours, numpys = view(a), view(full)
    assert_matches(ours, numpys)
    _after_each([w for _, w in WRITES], lambda v, base: v, a, full, ours, numpys)
    assert_matches(x, full.reshape(4, 3, 2, 5))
    _after_each([lambda b: b.__setitem__((1, 2, 3), 700.0),
                 lambda b: b.__imul__(3.0)], lambda v, base: base, a, full, ours, numpys)
    x[2, 1, 1, 4] = -70.0
    full.reshape(4, 3, 2, 5)[2, 1, 1, 4] = -70.0
    assert_matches(ours, numpys)


@pytest.mark.parametrize("diagonal", [lambda x: np.diagonal(x, 1, 1, 2),
                                      lambda x: np.diag(x[1], -1)],
                         ids=["diagonal", "diag-of-a-matrix"])
def test_a_diagonal_is_read_only_and_shows_the_writes_into_its_base(layout, diagonal):
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    ours, numpys = diagonal(a), diagonal(full)
    assert_matches(ours, numpys)
    for x in (numpys, ours):
        with pytest.raises(ValueError, match="read-only"):
            x[(0,) * x.ndim] = 1.0
    assert_matches(a, full)
    full[1, 2, 1] = 99.0
    a[1, 2, 1] = 99.0
    assert_matches(ours, numpys)


def test_a_reshape_numpy_copies_shares_nothing_with_its_base(layout):
    """The reshape of a transpose is a copy in NumPy: a write into it stays there,
    on every rank, whatever rank holds which elements."""
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    ours, numpys = a.T.reshape(-1), full.T.reshape(-1)
    assert not np.shares_memory(numpys, full)
    ours[...] = 0.0
    numpys[...] = 0.0
    assert_matches(a, full)
    a[0, 0, 0] = 5.0
    full[0, 0, 0] = 5.0
    assert_matches(ours, numpys)


@pytest.mark.parametrize("fortran_on", ["none", "last", "all"])
def test_a_reshape_is_a_view_only_where_every_ranks_block_allows_it(fortran_on):
    """Blocks laid out in Fortran order on some ranks (``from_local`` of each rank's
    own array): NumPy's reshape of such a block is a copy, so the DTensor's is one on
    every rank (a write into it reaches no base); with C-ordered blocks everywhere
    it is a view on every rank. The same answer on every rank, and no rank waits."""
    mesh = mesh_of((W,))
    rank = mesh.get_coordinate()[0]
    full = np.arange(W * 4 * 3.0).reshape(W * 4, 3)
    # The same layout reshaped before, from C-ordered blocks: each mesh files such a
    # reshape, and the next one of the layout must still look at the blocks.
    before = mt.DTensor.from_local(full[4 * rank:4 * rank + 4].copy(), mesh, [S0])
    before.reshape(-1)[0] = 5.0
    assert_matches(before, np.where(np.arange(full.size).reshape(full.shape) == 0, 5.0, full))
    local = full[4 * rank:4 * rank + 4].copy()
    if fortran_on == "all" or fortran_on == "last" and rank == W - 1:
        local = np.asfortranarray(local)
    a = mt.DTensor.from_local(local, mesh, [S0])
    ours = a.reshape(-1)
    assert_matches(ours, full.reshape(-1))
    ours[...] = -1.0
    if fortran_on == "none":
        full[...] = -1.0
    assert_matches(a, full)
    a[0, 0] = 9.0
    full[0, 0] = 9.0
    assert_matches(ours, full.reshape(-1) if fortran_on == "none" else np.full(full.size, -1.0))


@pytest.mark.parametrize("order", ["C", "F", "A", "K"])
@pytest.mark.parametrize("of", ["array", "transpose", "flipped"])
def test_ravel_in_each_order_is_numpys(layout, order, of):
    """np.ravel's orders as NumPy's: F by a transpose, A and K by how every rank's
    memory runs (a transpose's backwards); a view where NumPy's is one (each write
    into it reaching the base, and each write into the base shown in it), else a
    copy that shares nothing."""
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    pick = {"array": lambda x: x, "transpose": lambda x: x.T,
            "flipped": lambda x: np.flip(x, 1)}[of]
    ours, numpys = np.ravel(pick(a), order=order), np.ravel(pick(full), order=order)
    assert_matches(ours, numpys)
    ours[5] = 300.0
    numpys[5] = 300.0
    assert_matches(a, full)
    a[1, 2, 3] = -300.0
    full[1, 2, 3] = -300.0
    assert_matches(ours, numpys)


def test_ravel_k_of_memory_in_another_order_raises_on_every_rank():
    a = make(_full(), mesh_of((W,)), (S0,))
    with pytest.raises(ValueError, match="order='K'"):
        np.ravel(np.transpose(a, (1, 0, 2)), order="K")


def test_the_pieces_of_a_split_are_made_again_by_one_exchange():
    """A write into the base of a split's live pieces moves what making one piece
    moves: one exchange makes them all, however many live."""
    mesh = mesh_of((W,))
    full = _full()
    a = make(full, mesh, (S0,))
    pieces = np.array_split(a, 4, axis=0)
    with mt.debug.CommDebugMode() as every:
        a[0, 0, 0] = 1.0
    full[0, 0, 0] = 1.0
    for got, want in zip(pieces, np.array_split(full, 4, axis=0)):
        assert_matches(got, want)
    del pieces[1:]
    a[0, 0, 0] = 2.0  # finds the others gone everywhere, and forgets them
    with mt.debug.CommDebugMode() as one:
        a[0, 0, 0] = 3.0
    assert every.get_comm_counts() == one.get_comm_counts()
    assert sum(one.get_comm_counts().values()) == (1 if W > 1 else 0)


def test_calls_inside_mpitensor_keep_their_own_arrays():
    """mpitensor's own reshapes inside an operation are not views of their
    argument: a flip that moves elements links only the program's result."""
    from mpitensor._algorithms import _views
    mesh = mesh_of((W,))
    a = make(_full(), mesh, (S0,))
    before = len(_views._links)
    out = np.flip(a)  # reshapes and flips inside, one result
    assert len(_views._links) - before == (1 if W > 1 else 0)
    assert_matches(out, np.flip(_full()))


def test_view_as_another_dtype_reads_the_same_bits(layout):
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    if any(p.is_partial() for p in pls):
        with pytest.raises(TypeError, match="Partial"):
            a.view(np.int64)
        return
    assert_matches(a.view(np.int64), full.view(np.int64))
    same = a.view()
    mine = same.to_local()
    assert same.placements == a.placements
    assert mine.size == 0 or np.shares_memory(mine, a.to_local())  # an empty block shares none
    sharded_last = any(type(p) is Shard and p.dim == 2 for p in pls) and max(
        n for n, p in zip(mesh.shape, pls) if type(p) is Shard and p.dim == 2) > 1
    if sharded_last:
        with pytest.raises(TypeError, match="last dim"):
            a.view(np.float32)
    else:
        assert_matches(a.view(np.float32), full.view(np.float32))


def test_view_with_a_dtype_that_differs_by_rank_raises_on_every_rank():
    if W == 1:
        pytest.skip("one rank agrees with itself")
    a = make(_full(), mesh_of((W,)), (S0,))
    dtype = np.int64 if MPI.COMM_WORLD.rank == 0 else np.uint64
    with pytest.raises(ValueError):
        a.view(dtype)


@pytest.mark.parametrize("axis", [None, ()])
def test_a_flip_of_a_0d_dtensor_is_its_value(axis):
    """NumPy's flip of a 0-d array is its scalar, a new value: the DTensor's is a
    0-d DTensor holding an array, which indexing reads."""
    mesh = mesh_of((W,))
    z = mt.distribute_tensor(np.array(2.5), mesh, [R])
    f = np.flip(z, axis)
    assert isinstance(f.to_local(), np.ndarray) and f.shape == ()
    assert float(f[()].full_tensor()) == 2.5
