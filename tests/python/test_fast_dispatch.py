"""The C fast path of NumPy operations (csrc/ext/ext_dispatch.c, mpitensor._ops._fast)
gives what the Python slow path gives: the same local arrays (bit for bit), placements,
shapes and dtypes, and the same exceptions; it is really taken on a cached decision;
it steps aside for everything the slow path must see (register_sharding rules,
implicit_replication, redistributions, out=, keywords, pending async data); and it
leaks no references."""

import copy
import gc
import operator
import pickle
import sys

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, _C
from mpitensor._ops import _fast
from mpitensor.debug import CommDebugMode
from mpitensor.experimental import (clear_sharding_registry, implicit_replication,
                                    register_sharding)

from mpi_helpers import bits_equal
from ops_helpers import make

W = MPI.COMM_WORLD.Get_size()


@pytest.fixture
def mesh():
    return mt.init_device_mesh("cpu", (W,))


def hits():
    return _fast.stats()[0]


def same(fast, slow):
    """Fast and slow results agree in type, spec and local bytes."""
    assert type(fast) is DTensor and type(slow) is DTensor
    assert fast.placements == slow.placements
    assert fast.shape == slow.shape
    assert fast.dtype == slow.dtype
    assert fast.stride() == slow.stride()
    assert bits_equal(fast.to_local(), slow.to_local())


def slow_then_fast(call):
    """(slow result, fast result, fast-path hits of the second call). The slow call
    records the decision; the second call may then take the fast path."""
    with _fast.enabled(False):
        slow = call()
    before = hits()
    fast = call()
    return slow, fast, hits() - before


BINARY = [operator.add, operator.sub, operator.mul, operator.truediv,
          operator.floordiv, operator.mod, operator.pow, operator.lt, operator.le,
          operator.eq, operator.ne, operator.gt, operator.ge, np.add, np.multiply,
          np.maximum, np.minimum, np.arctan2, np.hypot]
INT_BINARY = [operator.and_, operator.or_, operator.xor, operator.lshift,
              operator.rshift, np.bitwise_and]
UNARY = [operator.neg, operator.pos, abs, np.exp, np.sqrt, np.negative, np.sin,
         np.isnan, np.floor]


@pytest.mark.parametrize("pl", [Shard(0), Shard(1), Replicate()])
@pytest.mark.parametrize("op", BINARY, ids=lambda f: getattr(f, "__name__", str(f)))
def test_binary_float_same_as_slow_path(mesh, op, pl):
    g = np.arange(1.0, 49.0).reshape(8, 6) / 7
    a = mt.distribute_tensor(g, mesh, [pl])
    b = mt.distribute_tensor(g[::-1].copy() + 0.5, mesh, [pl])
    slow, fast, n = slow_then_fast(lambda: op(a, b))
    same(fast, slow)
    assert n == 1


@pytest.mark.parametrize("op", INT_BINARY, ids=lambda f: f.__name__)
def test_binary_int_same_as_slow_path(mesh, op):
    g = np.arange(48, dtype=np.int64).reshape(8, 6) % 5
    a = mt.distribute_tensor(g, mesh, [Shard(0)])
    b = mt.distribute_tensor(g % 3, mesh, [Shard(0)])
    slow, fast, n = slow_then_fast(lambda: op(a, b))
    same(fast, slow)
    assert n == 1


@pytest.mark.parametrize("op", UNARY, ids=lambda f: getattr(f, "__name__", str(f)))
def test_unary_same_as_slow_path(mesh, op):
    a = mt.distribute_tensor(np.linspace(0.1, 3.0, 40).reshape(8, 5), mesh, [Shard(0)])
    slow, fast, n = slow_then_fast(lambda: op(a))
    same(fast, slow)
    assert n == 1


SCALARS = [2, 2.5, True, 1j, np.float32(1.5), np.int8(3), np.float64(0.25)]


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.int64, np.bool_])
@pytest.mark.parametrize("scalar", SCALARS, ids=repr)
def test_scalars_keep_numpy_promotion(mesh, dtype, scalar):
    a = mt.distribute_tensor((np.arange(24).reshape(8, 3) % 4).astype(dtype), mesh,
                             [Shard(0)])
    for op in (lambda: a * scalar, lambda: scalar * a, lambda: a + scalar,
               lambda: np.maximum(scalar, a)):
        try:
            with _fast.enabled(False):
                slow = op()
        except Exception as e:  # NumPy refuses (e.g. bool - bool): so must the fast path
            with pytest.raises(type(e)):
                op()
            with pytest.raises(type(e)):
                op()
            continue
        fast = op()
        same(fast, slow)
        same(op(), slow)


def test_scalar_types_are_separate_decisions(mesh):
    a = mt.distribute_tensor(np.ones((4, 4), np.float32), mesh, [Shard(0)])
    assert (a * 2).dtype == np.float32
    assert (a * 2).dtype == np.float32
    assert (a * np.float64(2)).dtype == np.float64  # a NumPy scalar is a strong type
    assert (a * 2).dtype == np.float32
    i8 = mt.distribute_tensor(np.ones((4, 4), np.int8), mesh, [Shard(0)])
    assert (i8 + 1).dtype == np.int8
    assert (i8 + 1).dtype == np.int8
    with pytest.raises(OverflowError):
        i8 + 1000  # NEP 50: a Python int out of range, on the fast path too
    assert (i8 + 1.5).dtype == np.float64


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "max", "min", "all", "any",
                                  "std", "var"])
@pytest.mark.parametrize("pl", [Shard(0), Shard(1), Replicate()])
def test_reduction_methods_same_as_slow_path(mesh, name, pl):
    g = np.arange(1.0, 33.0).reshape(8, 4) / 3
    a = mt.distribute_tensor(g, mesh, [pl])
    for args, kwargs in [((0,), {}), ((1,), {}), ((-1,), {"keepdims": True}),
                         ((), {"axis": 0}), ((), {"axis": 1, "keepdims": True})]:
        slow, fast, n = slow_then_fast(lambda: getattr(a, name)(*args, **kwargs))
        same(fast, slow)
        np.testing.assert_allclose(fast.full_tensor(),
                                   getattr(g, name)(*args, **kwargs), rtol=1e-12)
        if fast.placements[0].is_partial() or slow.placements == (Replicate(),):
            assert n == 1  # no redistribution was needed: the fast path ran


def test_reduction_keywords_take_the_slow_path(mesh):
    a = mt.distribute_tensor(np.arange(32.0).reshape(8, 4), mesh, [Shard(1)])
    a.sum(0)
    a.sum(0)
    before = hits()
    r = a.sum(0, dtype=np.float32)
    assert r.dtype == np.float32 and hits() == before
    assert a.sum(0).dtype == np.float64  # and a dtype= call did not replace the entry
    s1 = a.std(0, ddof=1)
    assert s1.dtype == np.float64
    np.testing.assert_allclose(s1.full_tensor(), np.arange(32.0).reshape(8, 4).std(0, ddof=1))
    np.testing.assert_allclose(a.std(0).full_tensor(), np.arange(32.0).reshape(8, 4).std(0))
    with pytest.raises(TypeError):
        a.sum(0, axis=0)  # the slow path's own error for a doubled axis


def test_matmul_same_as_slow_path(mesh):
    x = mt.distribute_tensor(np.arange(64.0).reshape(8, 8), mesh, [Shard(0)])
    w = mt.distribute_tensor(np.arange(32.0).reshape(8, 4), mesh, [Replicate()])
    slow, fast, n = slow_then_fast(lambda: x @ w)
    same(fast, slow)
    assert n == 1
    slow, fast, n = slow_then_fast(lambda: np.matmul(x, w))
    same(fast, slow)


def test_chained_results_hit(mesh):
    a = mt.distribute_tensor(np.ones((8, 4)), mesh, [Shard(0)])
    b = mt.distribute_tensor(np.ones((8, 4)), mesh, [Shard(0)])
    c1 = a + b
    c2 = a + b
    assert c1._spec == c2._spec
    (c1 * 2) + b
    before = hits()
    d = (c2 * 2) + b
    assert hits() - before == 2
    assert np.array_equal(d.full_tensor(), np.full((8, 4), 5.0))


def test_register_sharding_after_a_cached_decision(mesh):
    g = np.arange(32.0).reshape(8, 4)
    a = mt.distribute_tensor(g, mesh, [Shard(0)])
    b = mt.distribute_tensor(g, mesh, [Shard(0)])
    a + b
    a + b  # recorded and hit
    calls = []

    @register_sharding(np.add)
    def add_rule(x, y):
        calls.append(1)
        return [([Replicate()], [Replicate(), Replicate()])]

    try:
        before = hits()
        r = a + b
        assert calls, "the registered rule was not consulted"
        assert hits() == before
        assert r.placements == (Replicate(),)
        assert np.array_equal(r.full_tensor(), g + g)
    finally:
        clear_sharding_registry(np.add)
    before = hits()
    r = a + b
    assert hits() - before == 1
    assert r.placements == (Shard(0),) if W > 1 else (Replicate(),)


def test_implicit_replication_with_cached_decisions(mesh):
    g = np.arange(12.0).reshape(4, 3)
    a = mt.distribute_tensor(g, mesh, [Shard(0)])
    b = mt.distribute_tensor(g, mesh, [Shard(0)])
    a + b
    a + b
    bias = np.array([1.0, 2.0, 3.0])
    with implicit_replication():
        r1 = a + b
        r2 = a + bias
        r3 = a + bias
    assert np.array_equal(r1.full_tensor(), g + g)
    assert np.array_equal(r2.full_tensor(), g + bias)
    assert np.array_equal(r3.full_tensor(), g + bias)
    with pytest.raises(TypeError, match="distribute_tensor"):
        a + bias
    with pytest.raises(TypeError, match="distribute_tensor"):
        np.add(a, bias)


def test_redistributing_decisions_are_never_fast(mesh):
    if W == 1:
        pytest.skip("needs a Partial over more than one rank")
    p = make(np.arange(8.0), mesh, [Partial("sum")])
    for _ in range(2):
        before = hits()
        with CommDebugMode() as comm:
            r = p + 1.0  # P + c reduces the Partial first, every time
        assert comm.get_total_counts() >= 1
        assert hits() == before
        assert np.array_equal(r.full_tensor(), np.arange(8.0) + 1)
    q = p * 2.0  # P * c stays Partial: local, so fast on the second call
    before = hits()
    q = p * 2.0
    assert hits() - before == 1
    with CommDebugMode() as comm:  # which the slow path, traced, confirms: no collective
        p * 2.0
    assert comm.get_total_counts() == 0 and hits() - before == 1
    assert q.placements == (Partial("sum"),)
    assert np.array_equal(q.full_tensor(), np.arange(8.0) * 2)


def test_out_and_keywords_take_the_slow_path(mesh):
    a = mt.distribute_tensor(np.arange(16.0).reshape(4, 4), mesh, [Shard(0)])
    b = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    a + b
    a + b
    out = mt.distribute_tensor(np.zeros((4, 4)), mesh, [Shard(0)])
    before = hits()
    r = np.add(a, b, out=(out,))
    assert r is out and hits() == before
    assert np.array_equal(out.full_tensor(), np.arange(16.0).reshape(4, 4) + 1)
    r = np.add(a, b, dtype=np.float32)
    assert r.dtype == np.float32 and hits() == before
    a += b  # in place: the mixin's __iadd__ with out=
    assert np.array_equal(a.full_tensor(), np.arange(16.0).reshape(4, 4) + 1)
    with pytest.raises(TypeError):
        pow(a, b, 3)  # as the mixin's two-argument __pow__ always did


def test_pending_async_data_is_completed(mesh):
    g = np.arange(16.0).reshape(4, 4)
    a = mt.distribute_tensor(g, mesh, [Shard(0)])
    a2 = a.redistribute(mesh, [Replicate()])
    a2 + a2
    a2 + a2
    pending = a.redistribute(mesh, [Replicate()], async_op=True)
    r = pending + a2
    assert np.array_equal(r.full_tensor(), g + g)


def test_plain_arrays_and_other_objects_are_refused_as_before(mesh):
    a = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    a + a
    a + a
    with pytest.raises(TypeError, match="distribute_tensor"):
        a + np.ones((4, 4))
    with pytest.raises(TypeError, match="distribute_tensor"):
        np.ones((4, 4)) + a
    with pytest.raises(TypeError):
        a + "x"
    with pytest.raises(TypeError):
        a + [1.0]
    r = a + np.array(2.0)  # a 0-d array counts as a scalar (the slow path)
    assert np.array_equal(r.full_tensor(), np.full((4, 4), 3.0))


def test_no_reference_leaks(mesh):
    # 12 rows: even shards at 1..4 ranks, so every op here is local (fast)
    a = mt.distribute_tensor(np.ones((12, 4)), mesh, [Shard(0)])
    b = mt.distribute_tensor(np.ones((12, 4)), mesh, [Shard(0)])
    la, lb = a.to_local(), b.to_local()
    for _ in range(3):
        a + b, a.sum(0), -a, a * 2.0, a < b, np.add(a, b), a @ b.T
    objs = (a, b, la, lb, a._spec, b._spec, 2.0)
    counts = [sys.getrefcount(o) for o in objs]
    h = hits()
    for _ in range(2000):
        a + b, a.sum(0), -a, a * 2.0, a < b, np.add(a, b)
    assert hits() - h >= 2000 * 6
    assert [sys.getrefcount(o) for o in objs] == counts
    r = a + b
    assert sys.getrefcount(r) == 2 and sys.getrefcount(r.to_local()) == 2 + 1
    spec = r._spec
    n = sys.getrefcount(spec)
    del r
    assert sys.getrefcount(spec) == n - 1


def test_disabled_fast_path_never_hits(mesh):
    a = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    a + a
    with _fast.enabled(False):
        before = hits()
        for _ in range(5):
            a + a, a.sum(0)
        assert hits() == before
    _fast.clear(mesh)
    before = hits()
    a + a
    assert hits() == before  # cleared: decided again by the slow path
    a + a
    assert hits() - before == 1


def test_the_spec_can_be_replaced(mesh):
    a = mt.distribute_tensor(np.ones((8, 4)), mesh, [Shard(0)])
    a + a
    a + a
    r = mt.distribute_tensor(np.ones((8, 4)), mesh, [Replicate()])
    b = mt.distribute_tensor(np.ones((8, 4)), mesh, [Shard(0)])
    b._spec = r._spec  # now b claims Replicate: it must use that layout's decisions
    b._local_tensor = r.to_local()
    c = b + b
    assert c.placements == (Replicate(),) and c.shape == (8, 4)
    assert np.array_equal(c.to_local(), np.full((8, 4), 2.0))


def test_the_base_keeps_the_dtensor_api(mesh):
    a = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    assert not hasattr(a, "__dict__")
    with pytest.raises(AttributeError):
        a.foo = 1
    assert DTensor.sum.__doc__.startswith("numpy.sum of this DTensor")
    assert hash(a) == object.__hash__(a)
    d = DTensor(a.to_local(), a._spec)
    assert d._spec is a._spec and d.to_local() is a.to_local()
    d = DTensor(local_tensor=a.to_local(), spec=a._spec)
    assert d.shape == (4, 4)
    with pytest.raises(TypeError):
        DTensor(a.to_local())
    c = copy.copy(a)
    assert type(c) is DTensor and c._spec is a._spec and c.to_local() is a.to_local()
    b = pickle.loads(pickle.dumps(a))  # onto the equal live mesh (mpitensor.checkpoint)
    assert b.placements == a.placements and np.array_equal(b.to_local(), a.to_local())


def test_fresh_dtensors_of_a_known_layout_hit(mesh):
    w = mt.distribute_tensor(np.ones((4, 3)), mesh, [Replicate()])
    x0 = DTensor.from_local(np.ones((2, 4)), mesh, [Shard(0)])
    x0 @ w
    x1 = DTensor.from_local(np.full((2, 4), 2.0), mesh, [Shard(0)])
    before = hits()  # x1 is new, its layout is known: fast on its first op
    y = x1 @ w
    assert hits() - before == 1
    assert np.array_equal(y.to_local(), x1.to_local() @ w.to_local())
    before = hits()
    z = x1.redistribute(mesh, [Shard(0)]) @ w  # a redistribute result, same layout
    assert hits() - before == 1 and z.placements == y.placements


def test_a_dropped_mesh_frees_its_communicators_and_table():
    gc.collect()
    before = _C.comm_live_count()
    m = mt.init_device_mesh("cpu", (W,))
    a = mt.distribute_tensor(np.ones((12, 4)), m, [Shard(0)])  # even at 1..4 ranks
    for _ in range(2):
        a + a, a.sum(0), a * 2
    assert len(m._dispatch) >= 3
    during = _C.comm_live_count()
    del a, m  # no reference cycle: freed at once, without the garbage collector
    assert during > before
    assert _C.comm_live_count() == before


@pytest.mark.skipif(W < 2, reason="needs a rank outside the mesh")
def test_ranks_outside_the_mesh_take_the_python_path():
    m = mt.DeviceMesh("cpu", list(range(W - 1)))
    outsider = MPI.COMM_WORLD.Get_rank() == W - 1
    a = mt.distribute_tensor(np.arange(12.0).reshape(6, 2), m, [Replicate()])
    a + a, a.sum(0)
    before = hits()
    r, s = a + a, a.sum(0)
    assert r.shape == (6, 2) and s.shape == (2,)
    if outsider:
        assert hits() == before and len(m._dispatch) == 0
        assert r.to_local().size == 0
    else:
        assert hits() - before == 2
        assert np.array_equal(r.to_local(), np.arange(12.0).reshape(6, 2) * 2)
