"""Basic indexing ``dt[...]``: full_tensor() equals NumPy's indexing of the full
array for random shapes, placements (uneven, Partial, 1-D and 2-D meshes) and keys
(ints, slices with any step, None, ...); placements follow torch's select/slice
rules; cutting replicated or whole dims is local, cutting a sharded dim moves only
the picked elements; bad keys fail on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import (CORNER_SHAPES, W, assert_matches, corner_layouts, make,
                         matches_or_raises_alike, mesh_of, mesh_shapes, placements)

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")


def _index(draw, size):
    kind = draw(st.sampled_from(["int", "slice", "slice", "full"]))
    if kind == "int":
        return draw(st.integers(-size, size - 1)) if size else slice(None)
    if kind == "full":
        return slice(None)
    bound = st.one_of(st.none(), st.integers(-size - 2, size + 2))
    step = draw(st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0)))
    return slice(draw(bound), draw(bound), step)


def _key(draw, shape):
    """A basic key: an index per dim (some trailing ones left out), None sprinkled
    in, maybe an Ellipsis standing for a run of dims."""
    items = [_index(draw, n) for n in shape]
    items = items[:draw(st.integers(0, len(items)))] if draw(st.booleans()) else items
    if items and draw(st.booleans()):
        a = draw(st.integers(0, len(items) - 1))
        b = draw(st.integers(a, len(items)))
        items = items[:a] + [Ellipsis] + items[b:]
    for _ in range(draw(st.integers(0, 2))):
        items.insert(draw(st.integers(0, len(items))), None)
    if len(items) == 1 and draw(st.booleans()):
        return items[0]
    return tuple(items)


def _expected_placements(pls, shape, key, out_ndim):
    """torch's rules, worked out independently: which output dim each input dim
    becomes, and whether the key leaves it whole."""
    key = key if isinstance(key, tuple) else (key,)
    used = sum(k is not None and k is not Ellipsis for k in key)
    if Ellipsis in key:
        at = key.index(Ellipsis)
        key = key[:at] + (slice(None),) * (len(shape) - used) + key[at + 1:]
    else:
        key = key + (slice(None),) * (len(shape) - used)
    where, d, j = {}, 0, 0
    for k in key:
        if k is None:
            j += 1
            continue
        if isinstance(k, slice):
            whole = range(*k.indices(shape[d])) == range(shape[d])
            where[d] = j if whole else None
            j += 1
        else:
            where[d] = None
        d += 1
    assert j == out_ndim
    return tuple((Shard(where[p.dim]) if where[p.dim] is not None else R)
                 if isinstance(p, Shard) else p for p in pls)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_indexing_matches_numpy(data):
    shape = tuple(data.draw(st.lists(st.integers(0, 6), min_size=1, max_size=3)))
    mesh = mesh_of(data.draw(st.sampled_from(mesh_shapes())))
    full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) * 3 - 7
    pls = placements(data.draw, len(shape), mesh.ndim)
    dt = make(full, mesh, pls)
    key = _key(data.draw, shape)
    out = dt[key]
    assert_matches(out, full[key])
    assert out.placements == _expected_placements(pls, shape, key, out.ndim)


# Keys for every corner shape: slices that keep a dim whole, cut it, reverse it
# or empty it, a new axis, and ints that NumPy refuses on a dim of size 0.
CORNER_KEYS = [slice(1, None), slice(None, None, -1), (Ellipsis, slice(None, 1)),
               (None, Ellipsis), (slice(None), None), 0, -1, (Ellipsis, 0)]


@pytest.mark.parametrize("shape", CORNER_SHAPES, ids=str)
def test_indexing_matches_numpy_on_empty_shards(shape):
    """The corners the property test may not draw, every time: sizes 0 and 1 and
    dims shorter than the mesh, in every layout of every mesh (Partial included);
    NumPy's value and torch's placements, or NumPy's IndexError on every rank."""
    full = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) * 3 - 7
    for mesh, pls in corner_layouts(len(shape)):
        dt = make(full, mesh, pls)
        for key in CORNER_KEYS:
            def ours(key=key):
                out = dt[key]
                assert out.placements == _expected_placements(pls, shape, key, out.ndim)
                return out
            matches_or_raises_alike(ours, lambda key=key: full[key])


def _bytes(mode):
    """Payload bytes all ranks sent inside `mode`."""
    return MPI.COMM_WORLD.allreduce(sum(mode.get_comm_bytes().values()))


def test_cutting_replicated_or_whole_dims_is_local():
    mesh = mesh_of((W,))
    full = np.arange(8.0 * W * 6).reshape(8 * W, 6)
    dt, dr, dp = make(full, mesh, [S0]), make(full, mesh, [R]), make(full, mesh, [PS])
    with CommDebugMode() as mode:
        a = dt[:, 1:5:2]
        b = dt[..., -1]
        c = dt[None, :, ::-1]
        d = dr[3:1:-1, 2]
        e = dp[1:, None, 0]
    assert mode.get_total_counts() == 0
    assert (a.placements, b.placements, c.placements) == ((S0,), (S0,), (S1,))
    assert d.placements == (R,) and e.placements == (PS,)
    for got, key in ((a, np.s_[:, 1:5:2]), (b, np.s_[..., -1]), (c, np.s_[None, :, ::-1]),
                     (d, np.s_[3:1:-1, 2]), (e, np.s_[1:, None, 0])):
        assert_matches(got, full[key])


def test_slicing_a_sharded_dim_moves_only_the_slice():
    mesh = mesh_of((W,))
    rows, cols = 4 * W, 6
    full = np.arange(float(rows * cols)).reshape(rows, cols)
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        out = dt[1:3]
    assert out.placements == (R,)
    assert_matches(out, full[1:3])
    assert dict(mode.get_comm_counts()) == ({"all_to_all_single": 1} if W > 1 else {})
    # Rows 1 and 2 live on rank 0: every other rank receives those 2 rows, no more
    # (an all-gather of the dim would move W - 1 times the whole tensor).
    assert _bytes(mode) == 2 * cols * 8 * (W - 1)


def test_int_on_a_sharded_dim_is_sent_by_its_owner_alone():
    mesh = mesh_of((W,))
    full = np.arange(4.0 * W * 3).reshape(4 * W, 3)
    dt = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        row = dt[-1]
    assert row.placements == (R,) and row.shape == (3,)
    assert_matches(row, full[-1])
    sent = sum(mode.get_comm_bytes().values())
    owner = mesh.get_coordinate()[0] == W - 1
    assert sent == (3 * 8 * (W - 1) if owner else 0)


def test_uneven_and_empty():
    mesh = mesh_of((W,))
    full = np.arange(5 * 3).reshape(5, 3)   # 5 rows over up to 4 ranks: uneven
    dt = make(full, mesh, [S0])
    for key in (np.s_[::-2], np.s_[4, 1:], np.s_[3:], np.s_[2:2], np.s_[7:]):
        assert_matches(dt[key], full[key])
    empty = make(np.zeros((0, 4)), mesh, [S1])
    assert_matches(empty[:, 1:3], np.zeros((0, 4))[:, 1:3])


def test_2d_mesh_cut_on_one_mesh_dim():
    if W != 4:
        pytest.skip("needs 4 ranks")
    mesh = mesh_of((2, 2))
    full = np.arange(8.0 * 6).reshape(8, 6)
    dt = make(full, mesh, [S0, S1])
    with CommDebugMode() as mode:
        out = dt[2:7, :]
    assert out.placements == (R, S1)
    assert_matches(out, full[2:7])
    assert dict(mode.get_comm_counts()) == {"all_to_all_single": 1}
    dp = make(full, mesh, [PS, S0])
    out = dp[::3, 1]
    assert out.placements == (PS, R)
    assert_matches(out, full[::3, 1])


def test_0d():
    dt = make(np.array(5.0), mesh_of((W,)), [R])
    assert_matches(dt[()], np.array(5.0))
    assert_matches(dt[None, ...], np.array([5.0]))


@pytest.mark.parametrize("key, exc, words", [
    ([0, 9], IndexError, "index 9 is out of bounds"),
    (np.array([True, False, True]), IndexError, "boolean index of shape"),
    (True, TypeError, "bool"),
    (4, IndexError, "out of bounds"),
    ((0, 0, 0), IndexError, "too many indices"),
    ((Ellipsis, 0, Ellipsis), IndexError, "single ellipsis"),
    (slice(None, None, 0), ValueError, "zero"),
    ("a", TypeError, "str"),
])
def test_bad_keys_fail_on_every_rank(key, exc, words):
    dt = make(np.arange(16.0).reshape(4, 4), mesh_of((W,)), [S0])
    with pytest.raises(exc, match=words):
        dt[key]


def test_integer_dtensor_key_gives_numpys_value():
    """A key with an integer DTensor gives NumPy's value: alone it is picked where
    the indices lie (_pick.py, no gather even under strict); in a tuple key, the
    fallback's."""
    full = np.arange(16.0).reshape(4, 4)
    dt = make(full, mesh_of((W,)), [S0])
    key = make(np.array([3, 0, 3]), mesh_of((W,)), [S0])
    got = dt[key, 1:]
    np.testing.assert_array_equal(got.full_tensor(), full[[3, 0, 3], 1:])
    for numpy_key in (np.array([[0, 1]]), (slice(None), [1])):
        np.testing.assert_array_equal(dt[numpy_key].full_tensor(), full[numpy_key])
    with mt.strict():
        got = dt[make(np.array([1, 3, 0, 3]), mesh_of((W,)), [S0])]
    np.testing.assert_array_equal(got.full_tensor(), full[[1, 3, 0, 3]])


@pytest.mark.parametrize("rest", [(Ellipsis,), (slice(None),), (Ellipsis, slice(None)),
                                  (slice(None), Ellipsis)], ids=str)
@pytest.mark.parametrize("pls", [[S0], [S1], [R]], ids=str)
def test_a_dtensor_key_followed_by_whole_slices_is_the_key_alone(rest, pls):
    """``dt[idx, ...]`` and ``dt[mask, :]`` (xarray's orthogonal indexing writes
    them so) are NumPy's ``dt[idx]`` and ``dt[mask]``: picked where the indices lie,
    nothing gathered even under strict(); a key NumPy refuses still raises."""
    full = np.arange(35.0).reshape(7, 5)
    mesh = mesh_of((W,))
    dt = make(full, mesh, pls)
    idx, mask = np.array([6, 0, 3, 3, -1]), full[:, 0] > 10
    with mt.strict():
        for key in (idx, mask):
            got = dt[(make(key, mesh, [S0]),) + rest]
            np.testing.assert_array_equal(got.full_tensor(), full[(key,) + rest])
    with pytest.raises(IndexError):
        dt[(make(idx, mesh, [S0]),) + rest + (slice(None), slice(None))]


def test_repeated_keys_reuse_the_plan_on_new_data():
    mesh = mesh_of((W,))
    full = np.arange(30.0).reshape(6, 5)
    a, b = make(full, mesh, [S0]), make(-full, mesh, [S0])
    for _ in range(2):
        assert_matches(a[1:4, ::2], full[1:4, ::2])
        assert_matches(b[1:4, ::2], -full[1:4, ::2])
        assert_matches(a[np.int64(2), 1:], full[2, 1:])    # NumPy ints: uncached path
        assert_matches(a[(slice(np.int64(1), None), 0)], full[1:, 0])


def test_keys_alike_to_a_cache_are_told_apart():
    """The plan cache's key (_C.index_key) keeps what NumPy tells apart: True is
    not 1 and a float is no int (both take the uncached path), a NumPy integer is
    its int, ``k`` and ``(k,)`` are one key; whatever the order the keys come in,
    each result is NumPy's, and a bool key the TypeError DTensor indexing gives it
    (NumPy's reading of it, a new axis, is never taken for 1)."""
    from mpitensor import _C
    assert _C.index_key((slice(1, None, 2), np.int64(3), None, Ellipsis)) == (
        (1, None, 2), 3, None, Ellipsis)
    assert _C.index_key(1) == _C.index_key((1,)) == (1,) and _C.index_key(()) == ()
    for key in (True, np.True_, 1.0, (slice(1.0, None),), (slice(None, True),), [1],
                (1, [0])):
        assert _C.index_key(key) is None, key
    mesh = mesh_of((W,))
    full = np.arange(30.0).reshape(6, 5)
    dt = make(full, mesh, [S0])
    keys = [1, (1,), np.int64(1), True, (True, 0), (slice(1, 3), 0), (slice(1, 3), False),
            (Ellipsis, 1), (None, 1), (1, None)]
    for key in keys + keys[::-1]:
        if any(type(k) is bool for k in (key if type(key) is tuple else (key,))):
            with pytest.raises(TypeError, match="bool"):
                dt[key]
        else:
            assert_matches(dt[key], full[key])


def test_zero_d_integer_arrays_are_ints():
    dt = make(np.arange(12.0).reshape(3, 4), mesh_of((W,)), [S0])
    key = (np.array(2), Ellipsis, np.array(-1))
    assert_matches(dt[key], np.arange(12.0).reshape(3, 4)[2, ..., -1])


@pytest.mark.parametrize("pl", [[R], [Shard(0)]], ids=str)
def test_a_basic_slice_that_moves_nothing_is_a_view(pl):
    """As NumPy's and torch's: writing into the slice, or into it as out=, writes
    into the DTensor it was cut from, when no sharded dim is cut."""
    g = np.arange(8.0 * W).reshape(4 * W, 2)
    a = make(g, mesh_of((W,)), pl)
    v = a[:, :1]
    v[...] = -1.0
    want = g.copy()
    want[:, :1] = -1.0
    np.testing.assert_array_equal(a.full_tensor(), want)
    b = make(g, mesh_of((W,)), pl)
    np.sum(b, axis=1, keepdims=True, out=b[:, :1])
    want = g.copy()
    np.sum(want, axis=1, keepdims=True, out=want[:, :1])
    np.testing.assert_array_equal(b.full_tensor(), want)


def test_a_slice_that_cuts_a_sharded_dim_is_a_view_too():
    """One whose elements move is still NumPy's view (test_views.py has the rest):
    a write into it reaches the DTensor it was cut from, and its local array,
    new memory, is read-only."""
    g = np.arange(8.0 * W).reshape(2, 4 * W)
    a = make(g, mesh_of((W,)), [Shard(1)])
    v = a[:, 1:]
    v[...] = -1.0
    want = g.copy()
    want[:, 1:] = -1.0
    np.testing.assert_array_equal(a.full_tensor(), want)
    if W > 1:
        assert not v.to_local().flags.writeable
