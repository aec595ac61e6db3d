"""Writes into DTensors: ``dt[key] = v`` (scalar, ndarray, DTensor; boolean masks),
``np.copyto(dt, v, where=)``, ``dt.fill``, in-place operators and ``out=``. The full
tensor equals NumPy's after the same writes, for random shapes (uneven shards),
keys and placements (Partial(sum) too); placements never change, but for a
Partial(avg) (or mixed-op) destination, resolved to Replicate first; the bytes moved
are only what the value needs to follow the destination."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from mpitensor.experimental import implicit_replication
from mpi_helpers import outcome, same_everywhere
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make, mesh_of,
                         mesh_shapes, mesh_shapes_1d_2d, next_layout, placements)

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")
COMM = MPI.COMM_WORLD


def total_bytes(mode) -> float:
    return COMM.allreduce(sum(mode.get_comm_bytes().values()))


@st.composite
def index_key(draw, shape):
    key = []
    for n in shape:
        kind = draw(st.sampled_from(["all", "int", "slice"]))
        if kind == "int":
            key.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            start = draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
            stop = draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
            step = draw(st.sampled_from([None, 1, 2, -1, -2, 3]))
            key.append(slice(start, stop, step))
        else:
            key.append(slice(None))
    if draw(st.booleans()):
        key.insert(draw(st.integers(0, len(key))), None)
    return tuple(key)


@settings(max_examples=60)
@given(data=st.data())
def test_setitem_matches_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=1, max_size=3)))
    dtype = data.draw(st.sampled_from([np.float64, np.int64]))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    full = rng.integers(-5, 6, size=shape).astype(dtype)
    pls = placements(data.draw, len(shape), mesh.ndim)
    dt = make(full, mesh, pls)
    key = data.draw(index_key(shape))
    region = full[key].shape
    kind = data.draw(st.sampled_from(["scalar", "ndarray", "dtensor", "broadcast"]))
    if kind == "scalar":
        value = dtype(7)
        dvalue = value
    else:
        vshape = region if kind != "broadcast" else region[len(region) // 2:]
        value = rng.integers(10, 20, size=vshape).astype(dtype)
        dvalue = value
        if kind == "dtensor":
            dvalue = make(value, mesh, placements(data.draw, value.ndim, mesh.ndim))
    dt[key] = dvalue
    full[key] = value
    assert dt.placements == pls
    assert_matches(dt, full)


@settings(max_examples=30)
@given(data=st.data())
def test_copyto_where_and_inplace_operators_match_numpy(data):
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=2, max_size=2)))
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    full = rng.integers(-5, 6, size=shape).astype(np.float64)
    other = rng.integers(1, 6, size=shape).astype(np.float64)
    pls = placements(data.draw, 2, mesh.ndim, partial=False)
    dt = make(full, mesh, pls)
    dother = make(other, mesh, placements(data.draw, 2, mesh.ndim))
    mask = other > 3
    dmask = make(mask, mesh, placements(data.draw, 2, mesh.ndim, partial=False))
    np.copyto(dt, dother, where=dmask)
    np.copyto(full, other, where=mask)
    dt += dother
    full += other
    dt *= 2
    full *= 2
    dt[dmask] = -1.5
    full[mask] = -1.5
    with implicit_replication():  # a plain row every rank holds, broadcast
        dt -= other[0]
    full -= other[0]
    assert dt.placements == pls
    assert_matches(dt, full)


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_writes_match_numpy_on_empty_shards(shape):
    """The corners the property tests may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, every Shard/Replicate destination of every mesh:
    a scalar into all and into a slice, a DTensor value laid out otherwise (Partial
    included) into a reversed view, copyto where a mask, in-place operators; the
    destination keeps its placements."""
    ndim = len(shape)
    base = np.arange(float(np.prod(shape))).reshape(shape) % 5 - 2
    other = base[::-1] * 2 + 1
    for mesh, pls in corner_layouts(ndim, partial=False):
        dt, full = make(base, mesh, pls), base.copy()
        dother = make(other, mesh, next_layout(pls, ndim))
        dmask = make(other > 0, mesh, next_layout(pls, ndim, partial=False))
        dt[...] = 5
        full[...] = 5
        dt[:1] = 3
        full[:1] = 3
        dt[::-1] = dother
        full[::-1] = other
        np.copyto(dt, dother, where=dmask)
        np.copyto(full, other, where=other > 0)
        dt += dother
        full += other
        dt *= 2
        full *= 2
        assert dt.placements == pls
        assert_matches(dt, full)


ROW_KEYS = [([4, 5], -1.0), ((np.array([4, 5]), slice(None)), np.array([[-1.0]])),
            ([0, 6, -1], 3.0), ((slice(None), [1, 3]), np.arange(7.0)[:, None]),
            ((slice(None), np.array([4, 0, 4])), np.array([1.0, 2.0, 3.0])),
            ([1, 1, 2], np.arange(15.0).reshape(3, 5)),
            (np.array([2, 3], np.uint8), 2.5)]


@pytest.mark.parametrize("key, value", ROW_KEYS, ids=str)
def test_rows_listed_by_an_integer_array_are_written_where_they_live(key, value):
    """``dt[[4, 5]] = v``, ``dt[:, idx] = v`` (one list or integer array, whole
    slices elsewhere: xarray's ``.loc`` writes) with a scalar or an ndarray: each
    rank writes the listed rows it holds, repeated ones last as NumPy, nothing
    moves and nothing is gathered, in every Shard/Replicate layout; into a view, the
    write reaches its base."""
    full = np.arange(35.0).reshape(7, 5)
    for mesh, pls in corner_layouts(2, partial=False):
        dt, want = make(full, mesh, pls), full.copy()
        with warnings.catch_warnings():
            warnings.simplefilter("error", mt.GatherWarning)
            with CommDebugMode() as mode:
                dt[key] = value
        want[key] = value
        assert total_bytes(mode) == 0 and dt.placements == tuple(pls)
        assert_matches(dt, want)
        view, want_view = dt[1:6], want[1:6]
        view[[0, 4]] = -7.0
        want_view[[0, 4]] = -7.0
        assert_matches(dt, want)


@pytest.mark.parametrize("key, value, error", [([7], 1.0, IndexError), ([-8], 1.0, IndexError),
                                               ([0, 1], np.ones(3), ValueError),
                                               ([0, 1], "abc", ValueError)], ids=str)
def test_a_bad_row_list_write_raises_numpys_error_on_every_rank(key, value, error):
    full = np.arange(35.0).reshape(7, 5)
    with pytest.raises(error):
        full.copy()[key] = value
    for pls in ([S0], [S1], [R]):
        dt = make(full, mesh_of((W,)), pls)
        got = same_everywhere(outcome(lambda: dt.__setitem__(key, value)))
        assert got is not None and got[0] == error.__name__
        assert_matches(dt, full)


@pytest.mark.parametrize("pls", [[S0], [S1], [R], [PS]], ids=str)
def test_scalar_and_ndarray_writes_move_nothing(pls):
    mesh = mesh_of((W,))
    full = np.arange(35.0).reshape(7, 5)
    dt = make(full, mesh, pls)
    high, low = full > 30, full < 3
    with CommDebugMode() as mode:
        dt[2] = 2.4
        dt[1:3] = np.arange(5.0)
        dt[::-2, 1] = np.arange(4.0)
        dt[high] = 0
        np.copyto(dt, 9.0, where=low)
    full[2] = 2.4
    full[1:3] = np.arange(5.0)
    full[::-2, 1] = np.arange(4.0)
    full[high] = 0
    np.copyto(full, 9.0, where=low)
    assert mode.get_total_counts() == 0
    assert dt.placements == tuple(pls)
    assert_matches(dt, full)
    with CommDebugMode() as mode:
        dt.fill(4)
    assert mode.get_total_counts() == 0
    assert_matches(dt, np.full((7, 5), 4.0))


def test_aligned_dtensor_value_moves_nothing():
    mesh = mesh_of((W,))
    dt = make(np.zeros((9, 4)), mesh, [S0])
    v = make(np.arange(36.0).reshape(9, 4), mesh, [S0])
    row = make(np.arange(4.0), mesh, [R])
    col = make(np.arange(9.0), mesh, [S0])
    with CommDebugMode() as mode:
        dt[:] = v
        dt[:, 2] = col
        dt[3] = row
    assert mode.get_total_counts() == 0
    want = np.arange(36.0).reshape(9, 4)
    want[:, 2] = np.arange(9.0)
    want[3] = np.arange(4.0)
    assert_matches(dt, want)


@pytest.mark.parametrize("mesh_shape", mesh_shapes_1d_2d(), ids=str)
@pytest.mark.parametrize("key", [np.s_[None, ::2], np.s_[None, :, 1:], np.s_[1::2, None, :],
                                 np.s_[None, ..., None]], ids=str)
def test_a_dtensor_value_under_a_key_with_new_axes_matches_numpy(mesh_shape, key):
    """A new axis shifts the value's dims from the destination's, so the dims the
    value follows are counted in the value's (the backward of ``x[None, ::2]``
    writes its gradient so)."""
    mesh = mesh_of(mesh_shape)
    full = np.arange(35.0).reshape(7, 5)
    region = full[key].shape
    value = np.arange(100.0, 100.0 + np.prod(region)).reshape(region)
    want = full.copy()
    want[key] = value
    for pls in itertools.product([R, S0, S1], repeat=mesh.ndim):
        for vp in [R] + [Shard(d) for d in range(len(region))]:
            dt, dv = make(full, mesh, pls), make(value, mesh, (vp,) * mesh.ndim)
            # compared across ranks first: a rank that raised alone leaves no other
            # waiting in the comparison below
            assert same_everywhere(outcome(lambda: dt.__setitem__(key, dv))) is None
            assert dt.placements == pls
            assert_matches(dt, want)


def test_inplace_operator_follows_the_destination():
    """a += b with a Shard(0) and b Shard(1): b moves once to Shard(0) (torch's rule
    for in-place ops), no more than b's bytes that change rank, and a keeps its
    placements."""
    mesh = mesh_of((W,))
    x, y = np.arange(64.0).reshape(8, 8), np.ones((8, 8))
    a, b = make(x, mesh, [S0]), make(y, mesh, [S1])
    with CommDebugMode() as mode:
        a += b
    assert a.placements == (S0,)
    if W > 1:
        assert dict(mode.get_comm_counts()) == {"all_to_all_single": 1}
        assert total_bytes(mode) <= y.nbytes * (W - 1) / W + 8 * W
    assert_matches(a, x + y)
    # the operator form's decision fits already: nothing moves
    with CommDebugMode() as mode:
        a *= 3.0
    assert mode.get_total_counts() == 0
    assert_matches(a, (x + y) * 3)


def test_inplace_into_a_partial_keeps_it_and_gives_numpys_value():
    """An in-place op or out= whose result is not the destination's Partial writes
    the result into it (torch refuses): the placements stay, the value is NumPy's."""
    mesh = mesh_of((W,))
    a, b = make(np.ones((4, 4)), mesh, [PS]), make(np.ones((4, 4)), mesh, [PS])
    np.exp(a, out=a)  # exp needs the Partial reduced: the result is not Partial
    assert a.placements == (PS,)
    assert_matches(a, np.exp(np.ones((4, 4))))
    np.maximum(a, b, out=a)
    assert_matches(a, np.full((4, 4), np.e))
    a *= b  # P(sum) * P(sum): one operand is reduced, the Partial stays
    assert a.placements == (PS,)
    assert_matches(a, np.full((4, 4), np.e))
    c = make(np.full((4, 4), 7.0), mesh, [PS])
    np.clip(make(np.full((4, 4), 3.0), mesh, [R]), 0, 1, out=c)
    assert c.placements == (PS,)
    assert_matches(c, np.ones((4, 4)))
    # the pattern of a column mean taken by hand (scikit-learn's StandardScaler)
    x = np.arange(24.0).reshape(6, 4)
    s = make(x, mesh, [S0]).sum(axis=0)
    s -= 1.0
    s /= 6
    assert s.placements == (PS,)
    assert_matches(s, (x.sum(axis=0) - 1.0) / 6)


@pytest.mark.parametrize("write", [
    lambda src, out: np.exp(src, out=out), lambda src, out: np.copyto(out, src),
    lambda src, out: np.copyto(out, 1.5)], ids=["exp_out", "copyto", "copyto_scalar"])
def test_a_cast_numpy_refuses_into_a_partial_fails_on_every_rank(write):
    """A rank that writes the Partial's identity, not the value, still refuses the
    value NumPy would not cast: every rank raises, none goes on alone to hang in
    the next collective."""
    mesh = mesh_of((W,))
    out = make(np.zeros((4, 4), np.int64), mesh, [PS])
    src = make(np.linspace(0, 1, 16).reshape(4, 4), mesh, [R])
    got = same_everywhere(outcome(lambda: write(src, out)))
    assert got is not None and got[0].endswith("Error") and "cast" in got[1], got
    np.testing.assert_array_equal(out.full_tensor(), np.zeros((4, 4)))


def _avg_layouts():
    """(mesh, placements) with a Partial(avg) mesh dim: alone, beside a Shard, and
    beside a Partial(sum) (mixed ops) on the 2 x 2 mesh."""
    out = [(mesh_of((W,)), (Partial("avg"),))]
    if W == 4:
        out += [(mesh_of((2, 2)), (Partial("avg"), S0)),
                (mesh_of((2, 2)), (S1, Partial("avg"))),
                (mesh_of((2, 2)), (PS, Partial("avg")))]
    return out


def _avg_of(full, mesh, pls):
    """A DTensor of ``full`` whose Partial(avg) mesh dims hold it on every rank (the
    mean of P copies of a small integer is that integer: exact), Partial(sum)
    ones on their first rank (the others 0), Shards their blocks."""
    rep = mt.distribute_tensor(full, mesh, [Shard(p.dim) if p.is_shard() else R
                                            for p in pls])
    local = rep.to_local().copy()
    coord = mesh.get_coordinate()
    if any(p == PS and coord[m] for m, p in enumerate(pls)):
        local[...] = 0
    return mt.DTensor.from_local(local, mesh, list(pls), shape=full.shape,
                                 stride=rep.stride())


def _dtensor_like(d, value):
    """``value`` as a DTensor on ``d``'s mesh (Shard(0) on its first dim), or as
    is when ``d`` is the NumPy array the write is checked against."""
    if not isinstance(d, mt.DTensor):
        return value
    return make(value, d.device_mesh, [S0] + [R] * (d.device_mesh.ndim - 1))


# A write of each form, applied alike to the DTensor and to NumPy's array.
WRITES = {
    "copyto": lambda d, full: np.copyto(d, 0.25),
    "copyto where": lambda d, full: np.copyto(d, -1.5, where=full > 5),
    "copyto DTensor": lambda d, full: np.copyto(d, _dtensor_like(d, full * 3)),
    "setitem": lambda d, full: d.__setitem__((slice(1, 3),), 0.1),
    "setitem DTensor": lambda d, full: d.__setitem__((slice(None), 1),
                                                     _dtensor_like(d, full[:, 2])),
    "setitem mask": lambda d, full: d.__setitem__(full > 4, 7.0),
    "fill": lambda d, full: d.fill(2.5),
    "out": lambda d, full: np.exp(d, out=d),
    "iadd": lambda d, full: d.__iadd__(0.5),
}


@pytest.mark.parametrize("write", sorted(WRITES))
def test_writes_into_partial_avg_resolve_it_and_give_numpys_value(write):
    """No locals reduce exactly to a written float under a mean: the destination
    is redistributed to Replicate on its Partial(avg) mesh dims first (a counted
    collective), in place, then written; the value is NumPy's on every rank.
    Partials of mixed ops resolve alike; a Partial(avg) value is still written as
    its own locals, moving nothing."""
    full = np.arange(24.0).reshape(6, 4)
    ours = WRITES[write]
    for mesh, pls in _avg_layouts():
        d = _avg_of(full, mesh, pls)
        assert_matches(d, full)
        want = full.copy()
        ours(want, full)
        with CommDebugMode() as mode:
            ours(d, full)
        assert_matches(d, want)
        if W > 1:
            assert mode.get_total_counts() >= 1
        assert not any(p.is_partial("avg") for p in d.placements), d.placements
        if PS in pls:  # mixed ops: every Partial is resolved
            assert not any(p.is_partial() for p in d.placements), d.placements
    mesh = mesh_of((W,))
    a = _avg_of(np.zeros(4), mesh, (Partial("avg"),))
    b = _avg_of(np.full(4, 3.0), mesh, (Partial("avg"),))
    with CommDebugMode() as mode:
        np.copyto(a, b)
    assert mode.get_total_counts() == 0 and a.placements == (Partial("avg"),)
    assert_matches(a, np.full(4, 3.0))


def test_a_write_through_a_view_of_a_partial_avg_reaches_its_base():
    """A basic index of a Partial(avg) DTensor is a view of its memory: the
    resolved view writes into that memory, so the base sees the write (its own
    mean of the written copies)."""
    mesh = mesh_of((W,))
    full = np.arange(12.0).reshape(3, 4)
    base = _avg_of(full, mesh, (Partial("avg"),))
    view = base[1:]
    view[...] = 9.0
    full[1:] = 9.0
    assert_matches(view, full[1:])
    assert_matches(base, full)


def test_an_int_partial_avg_refuses_a_write_on_every_rank():
    """An int Partial(avg) has no value to resolve to: redistribute's TypeError,
    on every rank, before anything is written."""
    if W == 1:
        pytest.skip("a Partial over one rank is already reduced")
    mesh = mesh_of((W,))
    a = mt.DTensor.from_local(np.zeros(4, np.int64), mesh, [Partial("avg")])
    got = same_everywhere(outcome(lambda: np.copyto(a, 1)))
    assert got is not None and got[0] == "TypeError", got
    assert a.placements == (Partial("avg"),)


def test_scipy_trimmed_variance_of_a_sharded_dtensor_is_numpys():
    """scipy.stats.tvar, tstd and tsem of a Shard(0) DTensor through the array API
    (SCIPY_ARRAY_API=1, which the conftest sets before scipy is imported) give
    NumPy's values; the pattern they use, a mean written into in place
    (``var *= factor``), is NumPy's on a Partial(avg) mean too."""
    stats = pytest.importorskip("scipy.stats")
    full = np.random.default_rng(0).normal(size=(4 * W + 3, 3))
    x = make(full, mesh_of((W,)), [S0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.GatherWarning)
        for f in (stats.tvar, stats.tstd, stats.tsem):
            got = f(x, axis=0)
            got = got.full_tensor() if isinstance(got, mt.DTensor) else np.asarray(got)
            np.testing.assert_allclose(got, f(full, axis=0), rtol=1e-12)
    var = _avg_of(np.arange(3.0), mesh_of((W,)), (Partial("avg"),))
    var *= make(np.array([1.1, 2.0, 0.5]), mesh_of((W,)), [S0])
    assert_matches(var, np.arange(3.0) * np.array([1.1, 2.0, 0.5]))


def test_partial_destination_writes_reduce_to_the_value():
    mesh = mesh_of((W,))
    full = np.arange(12.0).reshape(3, 4)
    dt = make(full, mesh, [PS])
    high, low = full > 9, full < 2
    dt[1] = 100.0
    dt[high] = -1.0
    np.copyto(dt, make(np.full((3, 4), 5.0), mesh, [PS]), where=low)
    full[1] = 100.0
    full[high] = -1.0
    np.copyto(full, 5.0, where=low)
    assert dt.placements == (PS,)
    assert_matches(dt, full)


def test_clip_out():
    mesh = mesh_of((W,))
    full = np.arange(-6.0, 6.0).reshape(3, 4)
    a = make(full, mesh, [S1])
    out = make(np.zeros((3, 4)), mesh, [S1])
    with CommDebugMode() as mode:
        got = np.clip(a, -2, 3, out=out)
    assert got is out and mode.get_total_counts() == 0
    assert_matches(out, np.clip(full, -2, 3))


@pytest.mark.parametrize("pls", [[Replicate()], [Shard(0)], [Partial("sum")]])
def test_a_ufunc_of_numbers_into_dtensors_writes_numpys_value(pls):
    """``np.add(1.0, 2.0, out=dt)``: NumPy broadcasts the value into the output;
    so does every rank (a Partial keeps its layout and reads as the value), two
    outputs too; a cast NumPy refuses raises as NumPy's does."""
    mesh = mesh_of((W,))
    if pls[0] == Partial("sum"):
        dt = np.sum(make(np.zeros((2, 2 * W + 1, 3)), mesh, [Shard(0)]), axis=0)
        assert dt.placements == (Partial("sum"),)
    else:
        dt = make(np.zeros((2 * W + 1, 3)), mesh, pls)
    got = np.add(1.0, 2.0, out=dt)
    assert got is dt and dt.placements == tuple(pls)
    assert_matches(dt, np.full((2 * W + 1, 3), 3.0))
    q = make(np.zeros(W + 1), mesh, [Shard(0)])
    r = make(np.zeros(W + 1), mesh, [Shard(0)])
    np.divmod(7.0, 2.0, out=(q, r))
    assert_matches(q, np.full(W + 1, 3.0))
    assert_matches(r, np.full(W + 1, 1.0))
    ints = make(np.zeros(W + 1, np.int64), mesh, [Shard(0)])
    with pytest.raises(TypeError):
        np.add(1.5, 2.0, out=ints)
    with pytest.raises(TypeError):
        np.add(1.5, 2.0, out=np.zeros(W + 1, np.int64))


def test_grad_mode_writes_raise():
    mesh = mesh_of((W,))
    a = make(np.ones((4, 4)), mesh, [S0])
    a.requires_grad_()
    for write in (lambda: a.__setitem__(0, 1.0), lambda: a.fill(0.0),
                  lambda: np.copyto(a, 2.0)):
        with pytest.raises(RuntimeError, match="requires grad"):
            write()
    b = make(np.zeros((4, 4)), mesh, [S0])
    with pytest.raises(RuntimeError, match="requires grad"):
        b[:] = a
    with mt.no_grad():
        a[0] = 5.0
    want = np.ones((4, 4))
    want[0] = 5.0
    assert_matches(a.detach(), want)


def test_bad_writes_raise_on_every_rank():
    mesh = mesh_of((W,))
    dt = make(np.zeros((4, 5)), mesh, [S0])
    with pytest.raises(ValueError, match="could not broadcast"):
        dt[1:3] = np.ones((3, 5))
    with pytest.raises(ValueError, match="could not broadcast"):
        np.copyto(dt, make(np.ones((4, 4)), mesh, [R]))
    with pytest.raises(ValueError, match="cannot assign 3 input values"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.GatherWarning)
        dt[np.zeros((4, 5), bool)] = np.ones(3)
    with pytest.raises(IndexError):
        dt[7] = 1.0


@pytest.mark.parametrize("pls", [[S0], [S1], [R], [PS]], ids=str)
def test_masked_write_of_an_array_of_values_is_numpys(pls):
    """dt[mask] = values (values in C order of the Trues): NumPy's assignment,
    written in dt's placements, nothing gathered."""
    full = np.arange(35.0).reshape(7, 5)
    mask = full % 3 == 1
    _assert_masked_write(full, pls, mask, -np.arange(mask.sum(), dtype=float), [S0])


def _assert_masked_write(full, pls, mask, values, value_pls):
    """``dt[mask] = values`` on the DTensors of ``full`` (placed ``pls``), ``mask``
    (Shard(0)) and ``values`` (``value_pls``) is NumPy's, placements kept, and
    gathers nothing."""
    mesh = mesh_of((W,))
    dt = make(full, mesh, pls)
    with warnings.catch_warnings():
        warnings.simplefilter("error", mt.GatherWarning)
        dt[make(mask, mesh, [S0])] = make(values, mesh, value_pls)
    full[mask] = values
    assert dt.placements == tuple(pls)
    assert_matches(dt, full)


LEADING_VALUES = {  # name: the values' shape, from the Trues' count and a row's shape
    "one_row_per_true": lambda count, row: (count,) + row,
    "a_column_per_true": lambda count, row: (count,) + (1,) * len(row),
    "one_row_for_all": lambda count, row: row,
    "one_row_with_a_leading_one": lambda count, row: (1,) + row,
    "extra_leading_ones": lambda count, row: (1, 1) + row,
}


@pytest.mark.parametrize("pls", [[S0], [S1], [R], [PS]], ids=str)
@pytest.mark.parametrize("values", list(LEADING_VALUES), ids=list(LEADING_VALUES))
@pytest.mark.parametrize("lead", [1, 2])
def test_a_mask_of_leading_dims_writes_rows_as_numpy(pls, values, lead):
    """dt[mask] = values for a mask of dt's leading dims (scikit-learn's Ridge:
    ``d[idx] = s_nnz / (s_nnz**2 + alpha)``): the rows NumPy writes, placements
    kept, nothing gathered."""
    full = np.arange(2.0 * W + 3, 2.0 * W + 3 + (2 * W + 1) * 3 * 4).reshape(2 * W + 1, 3, 4)
    if lead == 1:
        full = full.reshape(2 * W + 1, 12)
    mask = (np.arange(full[..., 0].size).reshape(full.shape[:lead]) % 3) != 1
    row = full.shape[lead:]
    count = int(mask.sum())
    vals = -np.arange(float(np.prod(LEADING_VALUES[values](count, row)))).reshape(
        LEADING_VALUES[values](count, row))
    _assert_masked_write(full, pls, mask, vals, [R])


def test_a_mask_of_leading_dims_takes_a_list_of_rows_as_numpy():
    mesh = mesh_of((W,))
    full = np.zeros((2 * W + 1, 4))
    mask = np.arange(2 * W + 1) % 2 == 0
    dt = make(full, mesh, [S0])
    dt[make(mask, mesh, [S0])] = [[1.0, 2.0, 3.0, 4.0]]
    full[mask] = [[1.0, 2.0, 3.0, 4.0]]
    assert_matches(dt, full)


@pytest.mark.parametrize("shape", [(2, 3), (2, 13, 12), (3,)], ids=str)
def test_a_mask_of_leading_dims_with_values_of_another_shape_raises_numpys_error(shape):
    mesh = mesh_of((W,))
    full = np.zeros((2 * W + 1, 12))
    mask = np.arange(2 * W + 1) % 2 == 0
    got = outcome(lambda: make(full, mesh, [S0]).__setitem__(make(mask, mesh, [S0]),
                                                             np.ones(shape)))
    want = outcome(lambda: full.__setitem__(mask, np.ones(shape)))
    assert same_everywhere(got) == want


def test_out_takes_the_cheaper_of_following_and_moving_the_result():
    """np.add(a, b, out=c) with a and b Shard(0) and c Replicate: moving the result
    (one all-gather) beats moving both inputs to Replicate (two)."""
    mesh = mesh_of((W,))
    x, y = np.arange(24.0).reshape(6, 4), np.ones((6, 4))
    a, b, c = make(x, mesh, [S0]), make(y, mesh, [S0]), make(np.zeros((6, 4)), mesh, [R])
    with CommDebugMode() as mode:
        got = np.add(a, b, out=c)
    assert got is c and c.placements == (R,)
    if W > 1:
        assert dict(mode.get_comm_counts()) == {"all_gather_into_tensor": 1}
    assert_matches(c, x + y)


def _moved_rows(n, key, p):
    """Rows of the region whose piece of a Shard(0) value (torch.chunk's rule) is
    on another rank than the destination row's owner: what must move."""
    rows = np.arange(n)[key]
    size, vsize = -(-n // p), -(-len(rows) // p)
    return int(sum(1 for k, r in enumerate(rows) if r // size != k // vsize))


@pytest.mark.parametrize("dtype", [np.float64, np.int8])
@pytest.mark.parametrize("key", [
    slice(2, None), slice(-1, 1, -2), slice(3, 3 + max(W - 1, 1)), slice(1, -1, 3)],
    ids=["tail", "reversed_step_2", "fewer_rows_than_ranks", "step_3"])
def test_a_value_sharded_along_cut_rows_sends_each_row_to_its_owner(key, dtype):
    """``x[key] = y`` with x Shard(0), a slice cutting dim 0 and y Shard(0): one
    all-to-all of variable parts sends each row that is not already in place to
    its owner; before, y was all-gathered to every rank (torch's layout for the
    slice). 4W + 1 rows leave uneven shards; fewer region rows than ranks leave
    some of y's shards empty."""
    mesh = mesh_of((W,))
    n = 4 * W + 1
    full = np.arange(n * 3).reshape(n, 3).astype(dtype)
    region = full[key].shape
    value = -np.arange(np.prod(region)).reshape(region).astype(dtype)
    for vkey, vfull in ((key, value), ((None, key, slice(None)), value[None])):
        x = make(full, mesh, [S0])
        y = make(vfull, mesh, [Shard(vfull.ndim - 2)])
        with CommDebugMode() as mode:
            x[vkey] = y
        counts = dict(mode.get_comm_counts())
        assert "all_gather_into_tensor" not in counts, counts
        row = 3 * np.dtype(dtype).itemsize
        # the moved rows, and the counts each rank tells each other rank
        assert total_bytes(mode) <= _moved_rows(n, key, W) * row + 8 * W * W, counts
        want = full.copy()
        want[vkey] = vfull
        assert x.placements == (S0,)
        assert_matches(x, want)


@pytest.mark.world(4, reason="a (2, 2) mesh")
def test_a_value_sharded_along_cut_rows_on_a_2d_mesh():
    mesh = mesh_of((2, 2))
    full = np.arange(9.0 * 6).reshape(9, 6)
    for xp, yp in (((S0, S1), (S0, S1)), ((S1, S0), (S1, S0)), ((R, S0), (S1, S0))):
        x = make(full, mesh, list(xp))
        v = -np.arange(5.0 * 6).reshape(5, 6)
        x[2:7] = make(v, mesh, list(yp))
        want = full.copy()
        want[2:7] = v
        assert_matches(x, want)


INTO_AN_NDARRAY = {
    "copyto": lambda a, dt: np.copyto(a, dt),
    "add_out": lambda a, dt: np.add(dt, 1, out=a),
    "iadd": lambda a, dt: a.__iadd__(dt),
    "sum_out": lambda a, dt: np.sum(dt, axis=1, out=a[:, 0]),
}


@pytest.mark.skipif(COMM.Get_size() < 2, reason="ranks that differ")
@pytest.mark.parametrize("write", list(INTO_AN_NDARRAY))
@pytest.mark.parametrize("differs", ["shape", "dtype"])
def test_ndarray_destinations_that_differ_by_rank_raise_on_every_rank(write, differs):
    """A write into an ndarray whose shape or dtype differs by rank is refused
    with the same ValueError on every rank, before anything is gathered."""
    dt = make(np.arange(35.0).reshape(7, 5), mesh_of((W,)), [S0])
    first = COMM.Get_rank() == 0
    if differs == "shape":
        a = np.zeros((7, 5) if first else (6, 5))
    else:
        a = np.zeros((7, 5), np.float64 if first else np.float32)
    got = same_everywhere(outcome(lambda: INTO_AN_NDARRAY[write](a, dt)))
    assert got is not None and got[0] == "ValueError" and "different calls" in got[1]


def test_a_write_into_an_ndarray_takes_the_whole_result_as_numpy_writes_it():
    """`a += dt`, `np.add(a, dt, out=a)`, a two-output ufunc into ndarrays: NumPy's
    values in the caller's own arrays (not a DTensor in their place), the DTensor
    gathered as np.asarray gathers it, counted; strict() refuses; a cast NumPy
    refuses is NumPy's error on every rank."""
    mesh = mesh_of((W,))
    full = np.arange(5.0 * W + 1)
    d = make(full, mesh, [S0])
    a = np.ones_like(full)
    mine = a
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.GatherWarning)
        with CommDebugMode() as mode:
            a += d
        assert a is mine and np.array_equal(a, 1 + full)
        if W > 1:
            assert mode.get_comm_counts().get("all_gather_into_tensor", 0) >= 1
        assert np.add(a, d, out=a) is a and np.array_equal(a, 1 + 2 * full)
        q, r = np.empty_like(full), np.empty_like(full)
        got = np.divmod(d, 3.0, out=(q, r))
        assert got[0] is q and got[1] is r
        assert np.array_equal(q, full // 3) and np.array_equal(r, full % 3)
        ints = np.ones(full.shape, dtype=np.int64)
        with pytest.raises(TypeError, match="Cannot cast"):
            ints += d
        assert (ints == 1).all()
    with mt.strict(), pytest.raises(TypeError, match="numpy.add"):
        a += d
    assert np.array_equal(a, 1 + 2 * full)


# (call, whether NumPy refuses a target of another shape: put, putmask and place
# write by flat positions)
INTO_NDARRAY = {
    "copyto": (lambda x, o: np.copyto(o, x), True),
    "copyto-where": (lambda x, o: np.copyto(o, x, where=np.arange(x.shape[1]) % 2 == 0), True),
    "clip": (lambda x, o: np.clip(x, 2.0, 5.0, out=o), True),
    "clip-where": (lambda x, o: np.clip(x, 2.0, 5.0, out=o, where=np.arange(4) < 2), True),
    "sum": (lambda x, o: np.sum(x, axis=0, out=o[0]), True),
    "sum-method": (lambda x, o: x.sum(axis=0, out=o[0]), True),
    "mean": (lambda x, o: np.mean(x, axis=0, out=o[0]), True),
    "std": (lambda x, o: np.std(x, axis=0, ddof=1, out=o[0]), True),
    "max": (lambda x, o: np.max(x, axis=0, keepdims=True, out=o[:1]), True),
    "logaddexp.reduce": (lambda x, o: np.logaddexp.reduce(x, axis=0, out=o[0]), True),
    "round-out-by-position": (lambda x, o: np.round(x, 1, o), True),
    "round-method-out-by-position": (lambda x, o: x.round(1, o), True),
    "einsum": (lambda x, o: np.einsum("ij->ij", x, out=o), True),
    # the reduction methods' C door: their NoRule gathered as the function's is
    "std-method-out-by-position": (lambda x, o: x.std(0, None, o[0], 1), True),
    "var-method": (lambda x, o: x.var(axis=1, out=o[:, 0]), True),
    "max-method-out-by-position": (lambda x, o: x.max(0, o[0]), True),
    "put": (lambda x, o: np.put(o, [0, 5, 9], x[1, :3]), False),
    "putmask": (lambda x, o: np.putmask(o, np.arange(o.size).reshape(o.shape) % 3 == 0, x),
                False),
    "place": (lambda x, o: np.place(o, np.arange(o.size).reshape(o.shape) % 3 == 0, x[0]),
              False),
}


@pytest.mark.parametrize("case", list(INTO_NDARRAY))
def test_numpy_functions_write_their_whole_answer_into_an_ndarray(case):
    """A NumPy function whose destination is an ndarray (np.copyto's dst, out=)
    writes NumPy's values into it and returns it, whatever the DTensor's layout;
    a destination of the wrong shape is NumPy's error on every rank."""
    call, shaped = INTO_NDARRAY[case]
    full = np.arange(3.0 * (W + 1) * 4).reshape(3 * (W + 1), 4) % 7
    for mesh, pls in corner_layouts(2):
        x = make(full, mesh, pls)
        got, want = np.full_like(full, -1.0), np.full_like(full, -1.0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mt.GatherWarning)
            r = call(x, got)
        r_want = call(full, want)
        assert np.array_equal(got, want), pls
        assert (r is None and r_want is None) or r is got or r.base is got
    if not shaped:
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.GatherWarning)
        with pytest.raises(ValueError):
            call(x, np.zeros((2, 2, 2)))


@pytest.mark.parametrize("call", [
    lambda x, o: np.round(x, 1, o),
    lambda x, o: x.round(1, o),
    lambda x, o: np.cumsum(x, 0, None, o),
    lambda x, o: np.add(x, 1.0, o),
], ids=["round", "round-method", "cumsum", "add"])
def test_an_out_given_by_position_is_written(call):
    """``out`` passed in its place, not by keyword, into a DTensor: written, also
    where the call runs on the gathered arrays (round's out= has no rule); it was
    left unchanged there, without a word."""
    full = np.arange(3.0 * (W + 1) * 4).reshape(3 * (W + 1), 4) / 3
    for mesh, pls in corner_layouts(2):
        x = make(full, mesh, pls)
        o = make(np.zeros_like(full), mesh, [R] * mesh.ndim)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", mt.GatherWarning)
            r = call(x, o)
        want = np.zeros_like(full)
        call(full, want)
        assert r is o
        assert_matches(o, want)
