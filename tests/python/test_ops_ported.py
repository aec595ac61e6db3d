"""What torch's own DTensor tests (test_dtensor, test_tensor_ops, test_view_ops,
test_math_ops, test_pointwise_ops, test_comm_mode) check, ported to NumPy where it
applies: DTensor.device, CommDebugMode's "Global" entry, np.split /
np.array_split and np.diag, a one-element ndarray mixed with DTensors, a
histogram with range= on a Replicate input, log-sum-exp along a sharded axis and
cumsum of the flattened array or of an axis two mesh dims cut. Values equal
NumPy's on the full arrays (uneven shards included), placements and collective
counts as stated."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard
from mpitensor._ops._along_axis import lanes_layout
from mpitensor.debug import CommDebugMode
from ops_helpers import W, assert_matches, make, mesh_of, mesh_shapes

R, S0, S1, PS = Replicate(), Shard(0), Shard(1), Partial("sum")


def counts(mode) -> dict:
    return {k: v for k, v in mode.get_comm_counts().items() if v}


# -- DTensor.device (test_dtensor) ----------------------------------------------------

def test_device_is_an_object_with_type_cpu():
    d = make(np.ones((4, 2)), mesh_of((W,)), [S0])
    assert d.device.type == "cpu" and d.device.index is None
    assert str(d.device) == "cpu" and repr(d.device) == "device(type='cpu')"
    assert d.device == "cpu" and d.device == mt.device("cpu") and d.device == mt.device(d.device)
    assert hash(d.device) == hash(mt.device("cpu"))
    assert pickle.loads(pickle.dumps(d.device)) == d.device
    with pytest.raises(ValueError, match="cpu"):
        mt.device("cuda")
    with pytest.raises(AttributeError):
        d.device.type = "cuda"


# -- CommDebugMode (test_comm_mode) ---------------------------------------------------

def test_comm_module_counts_has_global_from_entry():
    d = make(np.ones((4, 2)), mesh_of((W,)), [S0])
    with CommDebugMode() as mode:
        assert mode.comm_module_counts == {"Global": {"forward": {}, "backward": {}}}
        d.full_tensor()
    want = {"all_gather_into_tensor": 1} if W > 1 else {}
    assert dict(mode.comm_module_counts["Global"]["forward"]) == want


# -- np.split, np.array_split (test_view_ops) -------------------------------------------

SPLITS = [(2, 0), ([1, 3], 0), (3, 1), ([2], 1), ([0, 9], 1), (1, 0)]


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
@pytest.mark.parametrize("sections,axis", SPLITS, ids=str)
def test_array_split_values_placements_and_one_move(mesh_shape, sections, axis):
    mesh = mesh_of(mesh_shape)
    full = np.arange(35.0).reshape(7, 5)
    choices = ([[R], [S0], [S1], [PS]] if len(mesh_shape) == 1
               else [[R, S1], [S0, S1], [S1, S0], [PS, S0], [S0, S0]])
    for pls in choices:
        d = make(full, mesh, pls)
        with CommDebugMode() as mode:
            pieces = np.array_split(d, sections, axis=axis)
        ref = np.array_split(full, sections, axis=axis)
        assert len(pieces) == len(ref)
        for p, r in zip(pieces, ref):
            assert_matches(p, r)
        # The other dims keep their Shards and every Partial stays (a Replicate
        # mesh dim may be cut for free); the split axis is whole in every piece,
        # made so by one collective for all of them, unless that would gather it
        # (no other dim free to take the shard): then the pieces stay sharded
        # along it, re-chunked by one exchange.
        sharded = [m for m, q in enumerate(pls) if q.is_shard() and q.dim == axis
                   and mesh_shape[m] > 1]
        whole = lanes_layout(d, (axis,), True)
        kept = sharded and all(whole[m].is_replicate() for m in sharded)
        for p in pieces:
            assert kept or not any(q.is_shard() and q.dim == axis for q in p.placements)
            for q, q0 in zip(p.placements, pls):
                if not (q0.is_shard() and q0.dim == axis):
                    assert q == q0 or (q0.is_replicate() and q.is_shard()), (q, q0)
        # The exchange is two collectives: the counts, then the rows.
        assert mode.get_total_counts() <= len(sharded) + (1 if kept else 0)


def test_split_needs_an_equal_division_and_gives_views_locally():
    mesh = mesh_of((W,))
    d = make(np.arange(12.0).reshape(6, 2), mesh, [S0])
    with pytest.raises(ValueError, match="equal division"):
        np.split(d, 4)
    with CommDebugMode() as mode:
        left, right = np.split(d, 2, axis=1)
    assert mode.get_total_counts() == 0
    assert left.placements == right.placements == (S0,)
    assert_matches(right, np.arange(12.0).reshape(6, 2)[:, 1:])


@pytest.mark.parametrize("pls", [[S0], [S1], [R]], ids=str)
def test_split_backward_places_each_piece(pls):
    mesh = mesh_of((W,))
    full = np.arange(35.0).reshape(7, 5)
    w = make(full, mesh, pls).requires_grad_()
    a, b, c = np.array_split(w, [1, 3], axis=1)
    ((a * 2.0).sum() + (c * c).sum()).backward()   # b unused: zeros there
    want = np.zeros_like(full)
    want[:, :1], want[:, 3:] = 2.0, 2 * full[:, 3:]
    assert_matches(w.grad, want)
    w.grad = None
    q, k, v = np.split(w[:6], 3, axis=0)                 # a qkv-style split
    (q * k + v).sum().backward()
    want = np.zeros_like(full)
    want[0:2], want[2:4], want[4:6] = full[2:4], full[0:2], 1.0
    assert_matches(w.grad, want)


# -- np.diag (test_tensor_ops) ---------------------------------------------------------

@pytest.mark.parametrize("k", [0, 1, -2])
@pytest.mark.parametrize("pls", [[R], [S0], [S1], [PS]], ids=str)
def test_diag_values_placements_and_gather(pls, k):
    mesh = mesh_of((W,))
    m = np.arange(20.0).reshape(4, 5)
    d = make(m, mesh, pls)
    with CommDebugMode() as mode:
        diagonal = np.diag(d, k)
    assert_matches(diagonal, np.diag(m, k))
    assert diagonal.placements == ((PS,) if pls == [PS] else (R,))
    sharded = pls[0].is_shard() and W > 1
    assert counts(mode) == ({"all_gather_into_tensor": 1} if sharded else {})
    v = np.arange(1.0, 5.0)
    dv = make(v, mesh, [S0] if pls[0].is_shard() else pls)
    assert_matches(np.diag(dv, k), np.diag(v, k))


def test_diag_backward():
    mesh = mesh_of((W,))
    m = np.arange(20.0).reshape(4, 5)
    w = make(m, mesh, [S0]).requires_grad_()
    (np.diag(w, 1) ** 2).sum().backward()
    want = np.zeros_like(m)
    i = np.arange(4)
    want[i, i + 1] = 2 * m[i, i + 1]
    assert_matches(w.grad, want)
    u = make(np.arange(1.0, 5.0), mesh, [S0]).requires_grad_()
    (np.diag(u, -1) * 3.0).sum().backward()
    assert_matches(u.grad, np.full(4, 3.0))


# -- a one-element ndarray with a DTensor (test_dtensor, torch's dispatch) --------------

@pytest.mark.parametrize("one", [np.array([2.0]), np.array([[2.0]]), np.array([[[2.0]]])],
                         ids=lambda a: str(a.shape))
def test_one_element_ndarray_is_replicated_as_torch(one):
    """torch replicates a tensor of one element (any dims) mixed with DTensors
    (_try_replicate_spec_for_scalar_tensor), with no communication; any other size
    is replicated too once the ranks agree on it (torch refuses it)."""
    mesh = mesh_of((W,))
    full = np.arange(16.0).reshape(8, 2)
    d = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        results = [d * one, one + d, np.maximum(d, one), np.multiply(d, one, dtype=np.float32),
                   np.where(d > 3, d, one)]
    assert mode.get_total_counts() == 0
    refs = [full * one, one + full, np.maximum(full, one),
            np.multiply(full, one, dtype=np.float32), np.where(full > 3, full, one)]
    for got, want in zip(results, refs):
        assert_matches(got, want)
    lead = one.ndim - 2
    assert results[0].placements == (Shard(max(lead, 0)),)
    assert_matches(d + np.ones(2), full + np.ones(2))
    w = make(full, mesh, [S0]).requires_grad_()
    (w * one).sum().backward()
    assert_matches(w.grad, np.full_like(full, 2.0))


# -- np.histogram with range= (test_math_ops: histc) -------------------------------------

@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_histogram_with_range_communicates_only_over_sharding_dims(mesh_shape):
    mesh = mesh_of(mesh_shape)
    full = np.arange(35.0).reshape(7, 5)
    choices = ([[R], [S0], [S1]] if len(mesh_shape) == 1
               else [[R, R], [S0, R], [R, S1], [S0, S1]])
    for pls in choices:
        d = make(full, mesh, pls)
        sharding = sum(p.is_shard() and mesh_shape[m] > 1 for m, p in enumerate(pls))
        for bins, range_ in ((5, (0, 30)), (np.array([0.0, 3.0, 10.0, 40.0]), None)):
            with CommDebugMode() as mode:
                got, edges = np.histogram(d, bins=bins, range=range_)
            want, want_edges = np.histogram(full, bins=bins, range=range_)
            assert np.array_equal(got, want) and np.allclose(edges, want_edges)
            assert mode.get_total_counts() == sharding, (pls, counts(mode))
        with CommDebugMode() as mode:
            got, _ = np.histogram(d, bins=4)
        assert np.array_equal(got, np.histogram(full, bins=4)[0])
        assert mode.get_total_counts() == 2 * sharding


# -- log-sum-exp (test_math_ops: logsumexp) ----------------------------------------------

@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_logaddexp_reduce_along_a_sharded_axis_is_one_all_gather(mesh_shape):
    mesh = mesh_of(mesh_shape)
    full = np.linspace(-30.0, 40.0, 35).reshape(7, 5)
    full[3, :] = -np.inf
    choices = ([[S0], [S1]] if len(mesh_shape) == 1 else [[S0, S1], [S0, S0], [R, S0]])
    for pls in choices:
        d = make(full, mesh, pls)
        for axis in (0, 1):
            with CommDebugMode() as mode, np.errstate(invalid="ignore"):
                got = np.logaddexp.reduce(d, axis=axis)
            assert_matches(got, np.logaddexp.reduce(full, axis=axis))
            # One all-gather per mesh dim that shards the axis (torch gathers the
            # whole input the same way); before, two all-reduces per mesh dim.
            sharded = sum(p.is_shard() and p.dim == axis and mesh_shape[m] > 1
                          for m, p in enumerate(pls))
            assert counts(mode) == ({"all_gather_into_tensor": sharded} if sharded else {})
            assert_matches(np.logaddexp2.reduce(d, axis=axis),
                           np.logaddexp2.reduce(full, axis=axis))


# -- cumsum of the flattened array (test_math_ops: cumsum) -------------------------------

@pytest.mark.parametrize("shape", [(8,), (7,), (8, 3), (4, 2, 3)], ids=str)
def test_cumsum_flattened_rows_scans_without_gathering(shape):
    mesh = mesh_of((W,))
    full = np.arange(1.0, np.prod(shape) + 1).reshape(shape)
    d = make(full, mesh, [S0])
    with CommDebugMode() as mode:
        got = np.cumsum(d)
        prod = np.cumprod(d / 8.0)
    assert_matches(got, np.cumsum(full))
    assert_matches(prod, np.cumprod(full / 8.0))
    if len(shape) == 1 or shape[0] % W == 0:
        assert got.placements == (S0,)
        if W > 1:
            assert counts(mode) == {"exscan": 2}
    else:  # uneven rows reach the flat blocks by one exchange each, then the scan
        assert counts(mode) == {"all_to_all_single": 4, "exscan": 2}


@pytest.mark.world(4, reason="a (2, 2) mesh")
@pytest.mark.parametrize("shape", [(8,), (7,), (8, 3), (7, 3)], ids=str)
def test_cumsum_of_an_axis_sharded_twice_scans_without_gathering(shape):
    """Dim 0 cut by both mesh dims, nested: a scan per mesh dim and an all-reduce of
    each inner pair's totals, lane cross sections only; the flattened array too
    where the rows split evenly."""
    mesh = mesh_of((2, 2))
    full = np.arange(1.0, np.prod(shape) + 1).reshape(shape)
    d = make(full, mesh, [S0, S0])
    scans = {"exscan": 2, "all_reduce": 1}
    with CommDebugMode() as mode:
        along = np.cumsum(d, axis=0)
        prod = np.cumprod(d / 8.0, axis=0)
    assert_matches(along, np.cumsum(full, axis=0))
    assert_matches(prod, np.cumprod(full / 8.0, axis=0))
    assert along.placements == (S0, S0)
    assert counts(mode) == {k: 2 * v for k, v in scans.items()}
    with CommDebugMode() as mode:
        flat = np.cumsum(d)
    assert_matches(flat, np.cumsum(full))
    if len(shape) == 1 or shape[0] % 4 == 0:
        assert flat.placements == (S0, S0) and counts(mode) == scans


def test_cumsum_flattened_of_columns_gathers_nothing():
    # Sharded columns reach flat order by exchanges (_flatten), then the scan.
    mesh = mesh_of((W,))
    full = np.arange(35.0).reshape(7, 5)
    for pls in ([S1], [R]):
        d = make(full, mesh, pls)
        with CommDebugMode() as mode:
            got = np.cumsum(d)
        assert_matches(got, np.cumsum(full))
        assert not any("gather" in k for k in mode.get_comm_counts()), mode.get_comm_counts()
        if pls == [R] or W == 1:
            assert mode.get_total_counts() == 0
