"""A basic index of a DTensor is a view, as NumPy's: whatever writes into it
(item assignment, the in-place operators, ``out=``, ``ufunc.at``, ``fill``,
``np.copyto``, ``np.put`` and its kin, views of views) writes into the base on every
rank, in every layout, also where the key cuts a sharded dim and the view's
elements had to move; an advanced index stays a copy; where a write cannot reach
the base it raises alike on every rank; a view shows every later write into its
base, as NumPy's does, whatever memory the write went through; a key that differs
by rank raises alike instead of handing back elements nobody wrote. Every rank checks the whole array
against the same NumPy code on the gathered one."""

from __future__ import annotations


import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
import mpitensor.array_api as xp
from mpitensor import Partial, Replicate, Shard, distribute_tensor
from ops_helpers import W, assert_matches, layout_fixture, make, mesh_of, quiet  # noqa: F401

COMM = MPI.COMM_WORLD
R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")
# Every placement of a 3-D array on each mesh dim (a Shard of the dim the keys
# cut, of a dim they keep, Partial).
layout = layout_fixture((R, S0, S1, PS))
pytestmark = pytest.mark.usefixtures("quiet")


def _full():
    return np.arange(60.0).reshape(4, 3, 5) - 20.0


def _add_to_diagonal(array, value, _):
    """scikit-learn's ``_add_to_diagonal`` for a namespace that is not NumPy's."""
    value = np.diagonal(array) + value
    for i in range(min(array.shape)):
        array[i, i] = value[i]


def test_add_to_diagonal_of_a_view(layout):
    """scikit-learn's GaussianMixture: ``_add_to_diagonal(cov[k, :, :], reg, xp)``
    on an array of covariances, which writes ``array[i, i]`` into the view (its
    own function on the 1-D mesh: its namespace makes the value on that one)."""
    mesh, pls = layout
    add = _add_to_diagonal
    if mesh.ndim == 1:
        add = pytest.importorskip("sklearn.utils._array_api")._add_to_diagonal
    full = np.zeros((4, 3, 3))
    cov = make(full, mesh, pls)
    for k in range(4):
        m = np.arange(9.0).reshape(3, 3) * (k + 1)
        full[k, :, :] = m
        cov[k, :, :] = m
        full[k].flat[::4] += 0.25
        add(cov[k, :, :], 0.25, xp)
    assert_matches(cov, full)


def test_gaussian_mixture_fit_matches_numpy():
    """GaussianMixture(covariance_type="full").fit on a sharded X: the regularised
    covariances NumPy gives (the regularisation goes through a view)."""
    sklearn = pytest.importorskip("sklearn")
    from sklearn.mixture import GaussianMixture
    rng = np.random.default_rng(0)
    x = np.concatenate([rng.normal(0, 1, (40, 3)), rng.normal(4, 0.5, (40, 3))])
    kw = dict(n_components=3, covariance_type="full", random_state=0,
              init_params="random_from_data", reg_covar=1e-3)
    ref = GaussianMixture(**kw).fit(x)
    for pls in ([Shard(0)], [Replicate()]):
        xd = distribute_tensor(x, mesh_of((W,)), pls)
        with sklearn.config_context(array_api_dispatch=True):
            got = GaussianMixture(**kw).fit(xd)
        np.testing.assert_allclose(got.means_.full_tensor(), ref.means_, atol=1e-8)
        np.testing.assert_allclose(got.covariances_.full_tensor(), ref.covariances_,
                                   atol=1e-8)


def test_views_of_views(layout):
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    other = np.arange(15.0).reshape(3, 5) * 7
    for ours, numpys in [
            (lambda x: x[1][0].__setitem__(2, 7.0), None),
            (lambda x: x[1:3].__setitem__(0, -1.0), None),
            (lambda x: x[2].T.__setitem__((1, 0), 5.0), None),
            (lambda x: x[3][:, ::-2].__setitem__(1, 9.0), None),
            (lambda x: x[None, 0, ..., 1].__setitem__((0, 2), 4.0), None),
            (lambda x: x[:, 1].__setitem__((2, 3), 8.0), None),
            (lambda x: x[0][1:, 1:].__setitem__((0, slice(None)), -3.0), None),
            (lambda x: x[3][...].__setitem__(..., make(other, mesh, pls[:0] or
                                                       (R,) * mesh.ndim)),
             lambda x: x[3][...].__setitem__(..., other))]:
        ours(a)
        (numpys or ours)(full)
        assert_matches(a, full)
    if not any(p.is_shard() for p in pls):
        # a reshape that is local on the view's layout is a view of the view
        a[1].reshape(15)[7] = 6.0
        full[1].reshape(15)[7] = 6.0
        assert_matches(a, full)


def test_in_place_operators(layout):
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    for x in (a, full):
        v = x[1]
        v += 1
        v *= 2
        v -= x[2]
        x[3] += 10
        w = x[0, 1:]
        w /= 4
    assert_matches(a, full)


def test_out_of_ufuncs_and_functions(layout):
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    for x in (a, full):
        np.add(x[1], 1, out=x[2])
        np.multiply(x[0], x[3], out=x[0])
        np.negative(x[1, :, 2], out=x[1, :, 2])
        np.sum(x[0:2], axis=0, out=x[3])
        np.clip(x[2], -5, 20, out=x[2])
        np.divmod(x[1, ::2], 3, out=(x[2, ::2], x[0, ::2]))
    assert_matches(a, full)


def test_ufunc_at(layout):
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    for x in (a, full):
        np.add.at(x[1], (np.array([0, 2, 0]), np.array([1, 4, 1])), 5.0)
        np.multiply.at(x[2, 1:], (np.array([1, 1]), np.array([0, 2])), 3.0)
    assert_matches(a, full)


def test_fill_and_copyto(layout):
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    mask = (np.arange(15).reshape(3, 5) % 3) == 0
    for x in (a, full):
        x[1].fill(7.0)
        np.copyto(x[2], np.arange(15.0).reshape(3, 5), where=mask)
        np.copyto(x[3][1:], 2.5)
        x[0][1].fill(-1)
    assert_matches(a, full)


def test_put_and_its_kin(layout):
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    mask = (np.arange(15).reshape(3, 5) % 4) == 1
    for x in (a, full):
        np.put(x[1], [0, 7, 14], [1.0, 2.0, 3.0])
        np.putmask(x[2], mask, -3.0)
        np.fill_diagonal(x[3], 9.0)
        np.place(x[0], mask, [4.0, 5.0])
    assert_matches(a, full)


def test_advanced_index_stays_a_copy(layout):
    """A write into an advanced index's result does not reach the base, as in
    NumPy, beside a basic index's that does."""
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    for x in (a, full):
        b = x[[0, 2]]
        b[0] = -9.0
        x[[0, 2]][1] = -9.0
        x[0, [1, 2]][...] = -9.0
        x[1][[0, 2]][0] = -9.0
        x[0:3:2][1] = -7.0
    assert_matches(a, full)


def test_a_view_writes_only_what_it_is_told(layout):
    """A write through a view reaches the base element by element: what it was not
    told to write stays, also what the base was written since the view was made."""
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    for x in (a, full):
        v = x[1]
        x[1, 0, 0] = 3.0
        v[2, 2] = 1.0
        lo, hi = x[1:3], x[2:4]
        lo[1, 0] = 5.0
        hi[0, 1] = 6.0
    assert_matches(a, full)


def test_a_write_into_the_local_array_raises_or_reaches_the_base(layout):
    """The local array of a view is the base's memory, or read-only: a write that
    bypasses the DTensor raises (alike on every rank), never goes astray."""
    mesh, pls = layout
    a = make(_full(), mesh, pls)
    v = a[1]
    try:
        v.to_local()[...] = 1.0
        raised = False
    except ValueError as e:
        assert "read-only" in str(e)
        raised = True
    assert len(set(COMM.allgather(raised))) == 1
    if not raised:
        assert v.to_local().size == 0 or np.shares_memory(v.to_local(), a.to_local())


def test_a_key_that_differs_by_rank_raises_on_every_rank():
    """A key computed from the rank, on a sharded dim: the exchange agrees on the
    key first, so every rank raises the same error (no element nobody wrote)."""
    if W == 1:
        pytest.skip("one rank: no key can differ")
    meshes = [((W,), [Shard(0)])] + ([((2, W // 2), [Shard(0), Shard(1)])]
                                      if W % 2 == 0 else [])
    for shape, pls in meshes:
        mesh = mesh_of(shape)
        x = distribute_tensor(np.arange(8.0 * W).reshape(2 * W, 4), mesh, pls)
        r = mesh.get_rank()
        for key in (slice(0, 2) if r == 0 else slice(0, 3), r,
                    (slice(1, 2 * W - 1), slice(0, 3 if r else 2))):
            with pytest.raises(ValueError, match="different keys"):
                x[key]
        # the same key on every rank still works
        assert_matches(x[1:3], np.arange(8.0 * W).reshape(2 * W, 4)[1:3])


def test_a_view_of_a_strided_dtensor_writes_through():
    """``reshape`` of an inner shard is strided; its basic index is read through a
    plain copy, and a write into it still reaches the strided DTensor (and the
    array it is a reshape of, as NumPy's views)."""
    layouts = [((W,), [Shard(1)])] + ([((2, W // 2), [Shard(1), Shard(1)]),
                                       ((2, W // 2), [Replicate(), Shard(1)])]
                                      if W % 2 == 0 else [])
    for shape, pls in layouts:
        f = np.arange(48.0).reshape(8, 6)
        x = distribute_tensor(f, mesh_of(shape), pls)
        y = np.reshape(x, 48)
        g = f.reshape(48)
        for z in (y, g):
            z[4:20][0] = -1.0
            z[10:][::3][1] = -2.0
            v = z[30:40]
            v += 100
            z[41:][2:5][1] = -3.0
        assert_matches(y, g)
        assert_matches(x, f)


@pytest.mark.parametrize("pl", [[Replicate()], [Shard(1)]], ids=["R", "S1"])
def test_broadcast_to_is_read_only_as_numpys(pl):
    """NumPy's broadcast_to is a read-only view: a write into the DTensor's (a
    copy) would be lost, so it raises NumPy's ValueError on every rank."""
    mesh = mesh_of((W,))
    x = make(np.arange(3.0 * W), mesh, [Replicate()]).redistribute(
        mesh, [pl[0] if isinstance(pl[0], Replicate) else Shard(0)])
    b = np.broadcast_to(x, (4, 3 * W))
    assert_matches(b, np.broadcast_to(np.arange(3.0 * W), (4, 3 * W)))
    with pytest.raises(ValueError, match="read-only"):
        b[0, 0] = 5.0
    with pytest.raises(ValueError, match="read-only"):
        b += 1.0
    assert_matches(b + 1.0, np.broadcast_to(np.arange(3.0 * W), (4, 3 * W)) + 1.0)


# Every write entry point, into the base, a view, or a view of the base's memory:
# each view taken before must show it, as NumPy's do.
BASE_WRITES = [
    lambda x: x.__setitem__((1, 0, 0), 100.0),
    lambda x: x.__setitem__((slice(None), 1), -2.0),
    lambda x: x.__iadd__(1.0),
    lambda x: np.multiply(x, 2.0, out=x),
    lambda x: np.copyto(x, x[::-1].copy() if type(x) is np.ndarray else x[::-1]),
    lambda x: x[2].fill(4.0),
    lambda x: np.put(x, [5, 17, 40], [1.0, 2.0, 3.0]),
    lambda x: np.add.at(x, (np.array([1, 1]), np.array([0, 2]), np.array([3, 3])), 5.0),
    lambda x: x[:, :2].__setitem__((1, 1), -7.0),  # through a local view
    lambda x: x[1].__setitem__((2, 4), 9.0),        # through a view of this view
]


def _views_of(x):
    v = x[1]
    return [v, x[:, 1], x[1:3, 0], x[..., 2], v[0], v[1:], x[3][::-1]]


def _views_follow_the_writes(a, full):
    """Every write of BASE_WRITES into ``a`` and into its NumPy twin ``full``: the
    views taken before show each, as NumPy's do."""
    ours, numpys = _views_of(a), _views_of(full)
    for i, write in enumerate(BASE_WRITES):
        write(a)
        write(full)
        assert_matches(a, full)
        for got, want in zip(ours, numpys):
            np.testing.assert_allclose(got.full_tensor(), want, rtol=0, atol=1e-10,
                                       err_msg=f"after write {i}")


def test_a_key_read_again_is_made_by_c_as_the_same_view(layout):
    """A basic key read again, on the layout its plan was made for, is made by C
    (``_C.basic_view``, from the plan the mesh keeps) wherever nothing moves: the
    same values, a view that writes into its base and sees the base's later writes,
    as the first read's. Where the key cuts a sharded dim, the Python path keeps it."""
    from mpitensor import _C
    mesh, pls = layout
    full = _full()
    a = make(full, mesh, pls)
    key = (slice(None), 1, slice(1, None, 2))
    first = a[key]
    # A copy-view alive elsewhere (its key cut a sharded dim) changes nothing here.
    held = distribute_tensor(np.arange(8.0 * W), mesh_of((W,)), [S0])[1:]
    moves = any(p.is_shard() and p.dim != 0 and mesh.shape[m] > 1
                for m, p in enumerate(pls))
    again = _C.basic_view(a, key)
    assert (again is NotImplemented) == moves
    for got in (first, a[key]):
        assert_matches(got, full[key])
    if moves:
        return
    again[1] = -7.0
    full[key][1] = -7.0
    assert_matches(a, full)
    a[2] = 3.0
    full[2] = 3.0
    assert_matches(again, full[key])
    assert_matches(first, full[key])
    assert_matches(held, np.arange(8.0 * W)[1:])


def test_a_reshape_made_again_is_made_by_c_as_the_same_view(monkeypatch):
    """A reshape of a layout that reshaped each rank's block in place before is made
    by C (``_C.block_reshape``): a view that writes into its base. Where some
    rank's block is not C-contiguous (here the last rank's), every rank goes on
    through the Python door from C's agreement, and gets NumPy's reshape."""
    import sys
    from mpitensor import _C
    mesh = mesh_of((W,))
    full = np.arange(16.0 * W).reshape(4 * W, 4)
    a = distribute_tensor(full.copy(), mesh, [S0])
    a.reshape(-1, 2)
    again = _C.block_reshape(np.reshape, a, (-1, 2), "C", sys._getframe(0))
    assert again is not NotImplemented
    assert_matches(again, full.reshape(-1, 2))
    again[1] = -5.0
    full.reshape(-1, 2)[1] = -5.0
    assert_matches(a, full)
    local = a.to_local().copy()
    if COMM.rank == W - 1:
        local = np.asfortranarray(local)
    b = mt.DTensor.from_local(local, mesh, [S0], shape=full.shape, stride=a.stride())
    from mpitensor import _call_agreement, _registry
    went_on, agreed_again = [], []
    agreed, agree_call = _registry._agreed, _call_agreement.agree_call
    monkeypatch.setattr(_registry, "_agreed", lambda func, args, kwargs, name, flags, cf: (
        went_on.append(func), agreed(func, args, kwargs, name, flags, cf))[1])
    monkeypatch.setattr(_call_agreement, "agree_call", lambda name, *rest: (
        agreed_again.append(name), agree_call(name, *rest))[1])
    got = b.reshape(-1, 2)
    monkeypatch.undo()
    # The Python door went on once, from C's agreement, and agreed on nothing more.
    assert went_on == [np.reshape] and "numpy.reshape" not in agreed_again, (
        went_on, agreed_again)
    assert_matches(got, full.reshape(-1, 2))


def test_a_key_read_again_is_still_seen_by_the_debug_tools():
    """C leaves a kept key to the Python path while a tool listens: DebugMode
    writes its line, and a gradient flows back through it."""
    from mpitensor.debug import DebugMode
    mesh = mesh_of((W,))
    x = distribute_tensor(np.arange(16.0).reshape(8, 2), mesh, [S0])
    key = (slice(None), slice(None, 1))
    for _ in range(2):
        x[key]
    with DebugMode() as mode:
        x[key]
    assert mode.debug_string().strip().startswith("_operator.getitem("), mode.debug_string()
    y = distribute_tensor(np.arange(16.0).reshape(8, 2), mesh, [S0])
    y.requires_grad_(True)
    (y[key] * 2.0).sum().backward()
    want = np.zeros((8, 2))
    want[:, 0] = 2.0
    assert_matches(y.grad, want)


def test_a_view_sees_later_writes_into_its_base(layout):
    mesh, pls = layout
    full = _full()
    _views_follow_the_writes(make(full, mesh, pls), full)


@pytest.mark.skipif(W % 2, reason="a Shard beside a Partial needs a 2-D mesh")
@pytest.mark.parametrize("pls", [(S0, Partial("avg")), (Partial("avg"), S0),
                                 (S0, Partial("max"))], ids=["S0-Pavg", "Pavg-S0", "S0-Pmax"])
def test_a_view_sees_the_write_that_resolved_its_base_and_later_ones(pls):
    """A write into a Partial(avg) base first resolves it to Replicate in place (the
    mean of copies is no exact value to write into): its copy-views, made by an
    exchange of the Partial layout, still show that write and the later ones."""
    mesh = mesh_of((2, W // 2))
    full = _full()
    r = make(full, mesh, [R if p.is_partial() else p for p in pls])
    a = mt.DTensor.from_local(r.to_local().copy(), mesh, pls, shape=full.shape,
                              stride=r.stride())
    _views_follow_the_writes(a, full)


def test_a_view_held_by_one_rank_only_sees_the_write_and_nothing_hangs():
    """A view that one rank still holds (a cycle its collector has not broken yet)
    where the others let theirs go: every rank makes it again, and that rank's
    shows the write; the next write finds it gone everywhere."""
    mesh = mesh_of((W,))
    full = _full()
    a = make(full, mesh, (S0,))
    v = a[1]
    held = [v] if COMM.rank == 0 else []
    del v
    a[1, 2, 3] = 50.0
    full[1, 2, 3] = 50.0
    if held:
        assert held[0].placements == (R,)
        np.testing.assert_array_equal(held[0].to_local(), full[1])
    held.clear()
    a[1, 2, 3] = 51.0
    full[1, 2, 3] = 51.0
    assert_matches(a, full)


def test_a_write_communicates_only_for_the_views_that_live():
    """A write into memory no view of which lives moves nothing more than before;
    one with a live view makes that view again."""
    mesh = mesh_of((W,))
    a = make(_full(), mesh, (S0,))
    with mt.debug.CommDebugMode() as comm:
        a[0, 0, 0] = 1.0
    assert comm.get_total_counts() == 0
    v = a[1]
    with mt.debug.CommDebugMode() as comm:
        a[0, 0, 0] = 2.0
    assert comm.get_total_counts() == (1 if W > 1 else 0)  # the view's exchange
    del v
    a[0, 0, 0] = 3.0  # finds the view gone everywhere, and forgets it
    with mt.debug.CommDebugMode() as comm:
        a[0, 0, 0] = 4.0
    assert comm.get_total_counts() == 0


def test_a_view_does_not_keep_its_base_alive_once_gone():
    import gc
    import weakref
    a = make(_full(), mesh_of((W,)), (S0,))
    memory = weakref.ref(a._data())
    v = a[1]
    a[1, 0, 0] = 3.0
    del v, a
    gc.collect()
    assert memory() is None
