"""The one executor (csrc/ext/ext_exec.c): every door into it (operators,
__array_ufunc__, reduction methods, registered functions) gives NumPy's result on
the whole arrays, bit for bit, with NumPy's dtypes and exceptions; a cached
operation runs once in the executor, with one call of its local function and no
Python entry, redistributing decisions included, also under implicit
replication, for pending async data, on ranks outside the mesh, while a
debugging tool listens and while autograd records; what only Python normalises
(out=, other keywords, merged reductions, register_sharding rules) takes the
function's Python entry, which runs the executor again; one memo serves every
door, so a miss is counted once; the memo and the layout table stay within their
bounds; nothing leaks references and a dropped mesh is freed at once."""

import copy
import gc
import logging
import operator
import pickle
import sys

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DTensor, Partial, Replicate, Shard, _C, _modes, _comm, _plan, _trace
from mpitensor._clib import CORE
from mpitensor._algorithms import _dispatch as D
from mpitensor.placement_types import from_code
from mpitensor.debug import CommDebugMode, set_logs
from mpitensor.experimental import (clear_sharding_registry, implicit_replication,
                                    register_sharding)

from mpi_helpers import bits_equal
from ops_helpers import make

W = MPI.COMM_WORLD.Get_size()


def runs():
    """Operations the executor ran."""
    return _trace.hook_stats()["runs"]


def entries():
    """Python entries of registered functions the executor called."""
    return _trace.hook_stats()["entry"]


def memo(mesh):
    return mesh._dispatch_stats()


def like_numpy(result, expected):
    """The executor's result is NumPy's on the whole arrays: type, dtype, shape,
    contiguous strides and every bit."""
    assert type(result) is DTensor
    full = result.full_tensor()
    expected = np.asarray(expected)
    assert result.shape == expected.shape and result.dtype == expected.dtype
    assert result.stride() == mt._dtensor_spec.contiguous_strides(result.shape)
    assert bits_equal(full, expected)


def one_run(call):
    """(result, runs, entries) of a call made a second time: a memo hit."""
    call()
    before = (runs(), entries())
    out = call()
    return out, runs() - before[0], entries() - before[1]


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
def test_binary_float_like_numpy(mesh, op, pl):
    g = np.arange(1.0, 49.0).reshape(8, 6) / 7
    h = g[::-1].copy() + 0.5
    a = mt.distribute_tensor(g, mesh, [pl])
    b = mt.distribute_tensor(h, mesh, [pl])
    out, n, e = one_run(lambda: op(a, b))
    like_numpy(out, op(g, h))
    assert out.placements == (pl,) and (n, e) == (1, 0)


@pytest.mark.parametrize("op", INT_BINARY, ids=lambda f: f.__name__)
def test_binary_int_like_numpy(mesh, op):
    g = np.arange(48, dtype=np.int64).reshape(8, 6) % 5
    a = mt.distribute_tensor(g, mesh, [Shard(0)])
    b = mt.distribute_tensor(g % 3, mesh, [Shard(0)])
    out, n, e = one_run(lambda: op(a, b))
    like_numpy(out, op(g, g % 3))
    assert (n, e) == (1, 0)


@pytest.mark.parametrize("op", UNARY, ids=lambda f: getattr(f, "__name__", str(f)))
def test_unary_like_numpy(mesh, op):
    g = np.linspace(0.1, 3.0, 40).reshape(8, 5)
    a = mt.distribute_tensor(g, mesh, [Shard(0)])
    out, n, e = one_run(lambda: op(a))
    like_numpy(out, op(g))
    assert (n, e) == (1, 0)


SCALARS = [2, 2.5, True, 1j, np.float32(1.5), np.int8(3), np.float64(0.25)]


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.int64, np.bool_])
@pytest.mark.parametrize("scalar", SCALARS, ids=repr)
def test_scalars_keep_numpy_promotion(mesh, dtype, scalar):
    g = (np.arange(24).reshape(8, 3) % 4).astype(dtype)
    a = mt.distribute_tensor(g, mesh, [Shard(0)])
    for op in (lambda x: x * scalar, lambda x: scalar * x, lambda x: x + scalar,
               lambda x: np.maximum(scalar, x)):
        try:
            expected = op(g)
        except Exception as e:  # NumPy refuses (e.g. bool - bool): so does the executor
            with pytest.raises(type(e)):
                op(a)
            with pytest.raises(type(e)):
                op(a)
            continue
        like_numpy(op(a), expected)
        like_numpy(op(a), expected)


def test_one_rule_says_what_a_scalar_operand_is():
    """Python numbers (exactly), NumPy scalars and 0-d ndarrays are scalar operands,
    for the executor and the Python entries alike (one rule, in C); a Fraction, a
    list, None, a str or an array of one element are not."""
    from fractions import Fraction
    assert D.is_scalar is _C.is_scalar
    for v in (1, 2.5, True, 1j, np.float32(1), np.int8(3), np.array(2.0)):
        assert D.is_scalar(v), v
    for v in (Fraction(1, 2), [1.0], None, "a", np.ones(1), np.ones((2, 2))):
        assert not D.is_scalar(v), v


def test_one_rule_says_which_dtypes_carry_gradients():
    """Floating point, complex and bfloat16 values carry gradients, for the
    executor and the Python side alike (one rule, in C); bools, ints and other
    2-byte void dtypes do not."""
    from mpitensor import _dtypes
    inexact = [np.float16, np.float32, "f8", np.complex64]
    try:
        import ml_dtypes
        inexact.append(ml_dtypes.bfloat16)
    except ImportError:
        pass
    for t in inexact:
        assert _dtypes.is_inexact(t) and _C.inexact(np.dtype(t)), t
    for t in (bool, np.int8, np.uint64, "V2"):
        assert not _dtypes.is_inexact(t) and not _C.inexact(np.dtype(t)), t
    with pytest.raises(TypeError):
        _C.inexact("f8")


def test_a_rank_outside_the_mesh_holds_the_executors_stand_in():
    """The entries that wrap a result themselves give a rank outside the mesh the
    executor's local array: empty, a 0-d zero for a 0-d result, of the dtype."""
    assert D.outside_local is _C.outside_local
    zero = D.outside_local((), np.float32)
    assert zero.shape == () and zero == 0 and zero.dtype == np.float32
    empty = D.outside_local([3, 4], np.dtype(np.int8))
    assert empty.shape == (0,) and empty.dtype == np.int8


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
        i8 + 1000  # NEP 50: a Python int out of range, on the C path too
    assert (i8 + 1.5).dtype == np.float64


@pytest.mark.parametrize("name", ["sum", "mean", "prod", "max", "min", "all", "any",
                                  "std", "var", "argmax", "argmin"])
@pytest.mark.parametrize("pl", [Shard(0), Shard(1), Replicate()])
def test_reduction_methods_like_numpy(mesh, name, pl):
    g = np.arange(1.0, 33.0).reshape(8, 4) / 3
    a = mt.distribute_tensor(g, mesh, [pl])
    calls = [((0,), {}), ((1,), {}), ((-1,), {"keepdims": True}), ((), {"axis": 0}),
             ((), {"axis": 1, "keepdims": True}), ((), {})]
    if not name.startswith("arg"):
        calls.append(((), {"axis": (0, 1)}))
    for args, kwargs in calls:
        fast, n, e = one_run(lambda: getattr(a, name)(*args, **kwargs))
        expected = getattr(g, name)(*args, **kwargs)
        np.testing.assert_allclose(fast.full_tensor(), expected, rtol=1e-12)
        assert fast.shape == np.shape(expected) and fast.dtype == np.asarray(expected).dtype
        # Over a sharded axis the reductions without a reduce op merge per-rank
        # results in their Python entry (mpitensor._algorithms._merge), not gather in C.
        axis = args[0] if args else kwargs.get("axis")
        reduced = (0, 1) if axis is None else np.atleast_1d(axis) % 2
        merged = name in ("std", "var", "argmax", "argmin")
        # max and min over a shard left empty (4 columns over 3 ranks: 2, 2, 0)
        # reduce with the dtype's identity in their Python entry too.
        k = mesh.shape[0]
        size = g.shape[pl.dim] if pl.is_shard() else 0
        empty = pl.is_shard() and k > 1 and -(-size // k) * (k - 1) >= size
        merged = merged or (name in ("max", "min") and empty)
        if merged and pl.is_shard() and pl.dim in reduced and mesh.shape[0] > 1:
            assert e == 1  # merged in the Python entry, its steps in the executor
        else:
            assert (n, e) == (1, 0)


def test_reduction_keywords_take_the_python_entry(mesh):
    a = mt.distribute_tensor(np.arange(32.0).reshape(8, 4), mesh, [Shard(1)])
    a.sum(0)
    before = entries()
    r = a.sum(0, dtype=np.float32)
    assert r.dtype == np.float32 and entries() == before + 1
    assert a.sum(0).dtype == np.float64  # and a dtype= call did not change the decision
    s1 = a.std(0, ddof=1)
    np.testing.assert_allclose(s1.full_tensor(), np.arange(32.0).reshape(8, 4).std(0, ddof=1))
    np.testing.assert_allclose(a.std(0).full_tensor(), np.arange(32.0).reshape(8, 4).std(0))
    with pytest.raises(TypeError):
        a.sum(0, axis=0)  # NumPy's own error for a doubled axis
    with pytest.raises(np.exceptions.AxisError):
        a.sum(2)
    with pytest.raises(TypeError):
        a.argmax(axis=(0, 1))


def test_matmul_like_numpy(mesh):
    gx, gw = np.arange(64.0).reshape(8, 8), np.arange(32.0).reshape(8, 4)
    x = mt.distribute_tensor(gx, mesh, [Shard(0)])
    w = mt.distribute_tensor(gw, mesh, [Replicate()])
    out, n, e = one_run(lambda: x @ w)
    like_numpy(out, gx @ gw)
    assert (n, e) == (1, 0)
    out, n, e = one_run(lambda: np.matmul(x, w))
    like_numpy(out, gx @ gw)
    v = mt.distribute_tensor(np.arange(8.0), mesh, [Shard(0)])
    like_numpy(v @ x, np.arange(8.0) @ gx)  # a 1-D operand
    with pytest.raises(ValueError, match="numpy.matmul"):
        x @ mt.distribute_tensor(np.ones((3, 4)), mesh, [Replicate()])


def test_a_miss_is_counted_once_whichever_door_meets_it(mesh):
    a = mt.distribute_tensor(np.ones((8, 4)), mesh, [Shard(0)])
    b = mt.distribute_tensor(np.ones((8, 4)), mesh, [Shard(0)])
    s0 = memo(mesh)
    np.subtract(a, b, casting="same_kind")  # __array_ufunc__'s miss ...
    s1 = memo(mesh)
    a - b  # ... is the operator's hit
    s2 = memo(mesh)
    a * b  # the operator's miss ...
    np.multiply(a, b)  # ... is __array_ufunc__'s hit
    s3 = memo(mesh)
    # The result's dtype decides which Partials stay exact, so dtype= is decided
    # apart: once.
    np.multiply(a, b, dtype=np.float32)
    np.multiply(a, b, dtype=np.float32)
    s4 = memo(mesh)
    assert (s1["misses"] - s0["misses"], s1["hits"] - s0["hits"]) == (1, 0)
    assert (s2["misses"] - s1["misses"], s2["hits"] - s1["hits"]) == (0, 1)
    assert (s3["misses"] - s2["misses"], s3["hits"] - s2["hits"]) == (1, 1)
    assert (s4["misses"] - s3["misses"], s4["hits"] - s3["hits"]) == (1, 1)
    assert s4["decisions"] == s0["decisions"] + 3


def test_a_cached_operation_calls_python_once(mesh):
    a = mt.distribute_tensor(np.ones((8, 11)), mesh, [Shard(0)])
    b = mt.distribute_tensor(np.ones((8, 11)), mesh, [Shard(0)])
    a - b  # NumPy's error state, asked once per state the executor sees
    for miss in (True, False):  # a miss, then a hit: both stay in the executor
        before = _trace.hook_stats()
        a + b
        a.sum(0)
        after = _trace.hook_stats()
        # The program's reduction method is agreed on, as np.sum is, where the mesh
        # has more than one rank: in C, without a call into Python.
        assert {k: after[k] - before[k] for k in after} == {
            "local": 2, "build": 0, "entry": 0, "event": 0, "placements": 0,
            "error": 0, "dtype": 2 * miss, "errstate": 0, "deferred": 0, "runs": 2}


def entries_entered(monkeypatch, *funcs):
    """The list to which each call of a Python entry of ``funcs`` appends its
    function, while the test runs."""
    from mpitensor import _registry
    entered = []
    for func in funcs:
        entry = _registry.functions[func]
        monkeypatch.setitem(_registry.functions, func, lambda *a, _e=entry, _f=func, **k: (
            entered.append(_f), _e(*a, **k))[1])
    return entered


def in_c_or_entry(in_c, in_entry, entered, exact=True):
    """Each (call, NumPy's answer) of ``in_c`` runs in C, none of ``in_entry``
    does, once the decision is made: an entry enters (``entered`` lists them) only
    for the second, and no C door hands a call back to Python. The answer is
    NumPy's, its dtype too; bit for bit from C (``exact``), and from an entry too
    unless its blocks add in another order."""
    for calls, enters in ((in_c, False), (in_entry, True)):
        for call, want in calls:
            call()  # the decision made
            before, entered[:] = _trace.hook_stats(), []
            got = call()
            assert bool(entered) == enters, want
            assert _trace.hook_stats()["entry"] == before["entry"]
            full = got.full_tensor()
            assert full.dtype == want.dtype
            if exact and not enters:
                assert bits_equal(full, want), want
            else:
                np.testing.assert_allclose(full, want, rtol=1e-12, atol=1e-12)


def test_a_reduction_function_runs_in_c_or_its_rule_in_python_without_a_round_trip(mesh):
    """np.sum(x, axis=1) as the method takes it is agreed and run in one C call
    (no call into Python but the local function); with a user's rule for np.sum,
    the Python door runs the rule itself, never handed back from C."""
    from mpitensor import _registry
    a = mt.distribute_tensor(np.ones((2 * W, 6)), mesh, [Shard(0)])
    np.sum(a, axis=1)  # the decision made
    before = _trace.hook_stats()
    np.testing.assert_array_equal(np.sum(a, axis=1).full_tensor(), np.full(2 * W, 6.0))
    after = _trace.hook_stats()
    assert after["entry"] == before["entry"] and after["local"] == before["local"] + 1
    seen = []
    _registry.set_rule(np.sum, lambda args, kwargs: seen.append(kwargs) or "ruled")
    try:
        before = _trace.hook_stats()
        assert np.sum(a, axis=1) == "ruled" and seen == [{"axis": 1}]
        assert _trace.hook_stats()["entry"] == before["entry"]
    finally:
        _registry.set_rule(np.sum, None)


def test_a_function_the_executor_leaves_reaches_its_entry_after_one_c_call(mesh, monkeypatch):
    """np.flip, which the executor does not take, goes from DTensor.__array_function__
    to its Python entry after one C call (the executor's attempt and the agreement
    together), and nothing in C hands it back to Python."""
    from mpitensor import _registry
    a = mt.distribute_tensor(np.arange(12.0 * W).reshape(2 * W, 6), mesh, [Shard(0)])
    np.flip(a, 1)
    enter, entered = _C.door_enter, []
    monkeypatch.setattr(_C, "door_enter", lambda *args: entered.append(args[0]) or enter(*args))
    before = _trace.hook_stats()["entry"]
    got = np.flip(a, 1)
    assert entered == [np.flip] and _trace.hook_stats()["entry"] == before
    np.testing.assert_array_equal(got.full_tensor(), np.flip(a.full_tensor(), 1))
    assert np.flip in _registry._viewers and np.cumsum not in _registry._viewers


def test_another_librarys_type_answers_the_call(mesh):
    """NEP 18: DTensor's __array_function__ declines a call in which a type other
    than DTensor and ndarrays takes part, so that the other library answers."""
    class Other:
        def __array_function__(self, func, types, args, kwargs):
            return ("other", func)

    a = mt.distribute_tensor(np.ones((2 * W, 3)), mesh, [Shard(0)])
    assert np.concatenate([a, Other()]) == ("other", np.concatenate)
    assert np.concatenate([a, np.ones((1, 3))]).shape == (2 * W + 1, 3)


def test_only_an_entry_registered_to_view_asks_whether_a_program_called():
    """The door keeps the agreement's flags only for the entries registered with
    implements(..., views=True): any other entry that asked would be told 0 where
    a program called it, so it is an error, not a silent copy."""
    from mpitensor import _registry
    assert _registry.program_call(np.flip) == 0
    with pytest.raises(RuntimeError, match="views=True"):
        _registry.program_call(np.cumsum)


def test_where_and_clip_of_dtensors_and_scalars_run_in_c_else_in_their_entries(
        mesh, monkeypatch):
    """np.where(m, x, y) and np.clip(x, lo, hi) (and x.clip(lo, hi)) of DTensors and
    scalars are agreed and run in one C call, their Python entries never entered,
    a Partial reduced first as the entries reduce it (a plain ndarray of one
    element replicated, as the executor takes it); a None bound, a keyword, a
    larger plain ndarray (replicated once the agreement has found it alike on
    every rank) or a gradient wanted leaves the call to the entry, before C
    agrees on it (no hand-back through the door hook). Either way, NumPy's
    answer."""
    entered = entries_entered(monkeypatch, np.where, np.clip)
    a = np.arange(4.0 * W * 3).reshape(4 * W, 3) - 5
    x = mt.distribute_tensor(a, mesh, [Shard(0)])
    r = mt.distribute_tensor(a[::-1].copy(), mesh, [Replicate()])
    p = make(a, mesh, [Partial("sum")])  # the sum of every rank's block is a
    in_c = [(lambda: np.where(x > 2, x, 0.0), np.where(a > 2, a, 0.0)),
            (lambda: np.where(x > 2, x, r), np.where(a > 2, a, a[::-1])),
            (lambda: np.where(x > 2, 1, 2), np.where(a > 2, 1, 2)),
            (lambda: np.where(x > 2, x, np.array(0.5)), np.where(a > 2, a, 0.5)),
            (lambda: np.where(x > 2, x, np.full(1, 0.5)), np.where(a > 2, a, 0.5)),
            (lambda: np.clip(x, -1, 3), np.clip(a, -1, 3)),
            (lambda: np.clip(x, r, 9.5), np.clip(a, a[::-1], 9.5)),
            (lambda: x.clip(-1, 3), a.clip(-1, 3)),
            (lambda: np.clip(p, 0, 20), np.clip(a, 0, 20))]
    in_entry = [(lambda: np.clip(x, -1, None), np.clip(a, -1, None)),
                (lambda: np.clip(x, a_min=-1, a_max=3), np.clip(a, -1, 3)),
                (lambda: np.clip(x, -1, 3, out=None), np.clip(a, -1, 3)),
                (lambda: np.where(x > 2, x, np.arange(3.0)), np.where(a > 2, a, np.arange(3.0)))]
    in_c_or_entry(in_c, in_entry, entered)
    g = mt.distribute_tensor(a, mesh, [Shard(0)], requires_grad=True)
    entered[:], before = [], _trace.hook_stats()["entry"]
    np.testing.assert_array_equal(np.clip(g, -1, 3).detach().full_tensor(), np.clip(a, -1, 3))
    assert entered == [np.clip] and _trace.hook_stats()["entry"] == before


def test_all_and_any_run_in_c_leaving_a_bool_partial(mesh, monkeypatch):
    """np.all and np.any (and their methods) of masks, floats and complex values,
    over any axes, keepdims too, are agreed and run in one C call, their Python
    entries never entered: a reduced sharded dim leaves a bool Partial("min") for
    all, Partial("max") for any, as torch keeps one; a Partial input is reduced
    first; a block left empty (fewer rows than ranks) gives the identity. out=
    takes the entry. Either way, NumPy's answer."""
    entered = entries_entered(monkeypatch, np.all, np.any)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((2 * W, 3))
    m = a > 0.5
    c = a + 1j * a[::-1]
    x, xm, xc = (mt.distribute_tensor(v, mesh, [Shard(0)]) for v in (a, m, c))
    rm = mt.distribute_tensor(m, mesh, [Replicate()])
    p = make(a, mesh, [Partial("sum")])
    few = mt.distribute_tensor(m[:1], mesh, [Shard(0)])  # a block or more left empty
    in_c = []
    for func in (np.all, np.any):
        in_c += [(lambda f=func: f(xm), func(m)),
                 (lambda f=func: f(xm, axis=0), func(m, axis=0)),
                 (lambda f=func: f(xm, 1, keepdims=True), func(m, 1, keepdims=True)),
                 (lambda f=func: f(x, (0, 1)), func(a, (0, 1))),
                 (lambda f=func: f(xc, 0), func(c, 0)),
                 (lambda f=func: f(rm, 0), func(m, 0)),
                 (lambda f=func: f(p > 1.0), func(a > 1.0)),
                 (lambda f=func: f(few, 0), func(m[:1], 0)),
                 (lambda f=func: getattr(xm, f.__name__)(axis=0), func(m, axis=0))]
    out = mt.distribute_tensor(np.zeros(3, bool), mesh, [Replicate()])
    in_entry = [(lambda: np.any(xm, 0, out=out), np.any(m, 0))]
    in_c_or_entry(in_c, in_entry, entered)
    assert np.any(xm).placements == (Partial("max"),)
    assert np.all(xm, 0).placements == (Partial("min"),)
    assert np.all(xm, 1).placements == (Shard(0),) and np.any(rm).placements == (Replicate(),)
    np.testing.assert_array_equal(out.full_tensor(), np.any(m, 0))


def test_sort_cumsum_and_flip_along_an_unsharded_axis_run_in_c_else_in_their_entries(
        mesh, monkeypatch):
    """np.sort, np.cumsum and np.flip of a DTensor along an int axis that no mesh
    dim shards, without Partials, are agreed and run in one C call on each block,
    their Python entries never entered, NumPy's dtype kept (an int8 cumsum is an
    int64) and np.flip's result a view that writes through; along a sharded
    axis, the flattened array, with another keyword, of a Partial, or with a
    gradient wanted, the entry runs, C agreeing on nothing first. Either way,
    NumPy's answer (bit for bit from C)."""
    entered = entries_entered(monkeypatch, np.sort, np.cumsum, np.flip)
    rng = np.random.default_rng(7)
    a = rng.standard_normal((4 * W, 5))
    i8 = rng.integers(-100, 100, (4 * W, 5)).astype(np.int8)
    x = mt.distribute_tensor(a, mesh, [Shard(0)])
    xi = mt.distribute_tensor(i8, mesh, [Shard(0)])
    r = mt.distribute_tensor(a, mesh, [Replicate()])
    p = make(a, mesh, [Partial("sum")])
    in_c = [(lambda: np.sort(x, 1), np.sort(a, 1)),
            (lambda: np.sort(x), np.sort(a)),
            (lambda: np.sort(x, axis=-1), np.sort(a, axis=-1)),
            (lambda: np.sort(r, 0), np.sort(a, 0)),
            (lambda: np.cumsum(x, 1), np.cumsum(a, 1)),
            (lambda: np.cumsum(xi, axis=1), np.cumsum(i8, axis=1)),
            (lambda: np.flip(x, 1), np.flip(a, 1)),
            (lambda: np.flip(x, -1), np.flip(a, -1))]
    in_entry = [(lambda: np.sort(x, 0), np.sort(a, 0)),
                (lambda: np.sort(x, 1, kind="stable"), np.sort(a, 1, kind="stable")),
                (lambda: np.cumsum(x), np.cumsum(a)),
                (lambda: np.cumsum(x, 1, np.float32), np.cumsum(a, 1, np.float32)),
                (lambda: np.cumsum(p, 1), np.cumsum(a, 1)),
                (lambda: np.flip(x), np.flip(a)),
                (lambda: np.flip(x, (1,)), np.flip(a, (1,)))]
    in_c_or_entry(in_c, in_entry, entered)
    assert np.sort(x, 1).placements == (Shard(0),) and np.sort(r, 0).placements == (Replicate(),)
    y = np.flip(x, 1)
    y += 1.0
    np.testing.assert_array_equal(x.full_tensor(), a + 1.0)
    g = mt.distribute_tensor(a, mesh, [Shard(0)], requires_grad=True)
    entered[:] = []
    np.sort(g, 1).sum().backward()
    assert entered == [np.sort]
    np.testing.assert_array_equal(g.grad.full_tensor(), np.ones_like(a))


def test_concatenate_along_an_unsharded_axis_runs_in_c_else_in_its_entry(mesh, monkeypatch):
    """np.concatenate of DTensors of one mesh along an int axis that no mesh dim
    shards, without Partials, is agreed and run in one C call, the entry never
    entered, NumPy's promotion kept; along a sharded axis, with another keyword, of
    a Partial or of other dims that differ (NumPy's ValueError, on every rank), the
    entry runs, C agreeing on nothing first."""
    entered = entries_entered(monkeypatch, np.concatenate)
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((4 * W, 3)), rng.standard_normal((4 * W, 2))
    f = rng.standard_normal((4 * W, 1)).astype(np.float32)
    x, y = (mt.distribute_tensor(v, mesh, [Shard(0)]) for v in (a, b))
    z = mt.distribute_tensor(f, mesh, [Shard(0)])
    r = mt.distribute_tensor(a, mesh, [Replicate()])
    p = make(a, mesh, [Partial("sum")])
    in_c = [(lambda: np.concatenate((x, y), axis=1), np.concatenate((a, b), axis=1)),
            (lambda: np.concatenate([x, y, z], 1), np.concatenate([a, b, f], 1)),
            (lambda: np.concatenate((x, y), axis=-1), np.concatenate((a, b), axis=-1)),
            (lambda: np.concatenate((r, r)), np.concatenate((a, a)))]
    in_entry = [(lambda: np.concatenate((x, x)), np.concatenate((a, a))),
                (lambda: np.concatenate((x, y), axis=1, out=None),
                 np.concatenate((a, b), axis=1, out=None)),
                (lambda: np.concatenate((p, p), 1), np.concatenate((a, a), 1)),
                (lambda: np.concatenate((x, y), axis=None), np.concatenate((a, b), axis=None))]
    in_c_or_entry(in_c, in_entry, entered)
    assert np.concatenate((x, y), axis=1).placements == (Shard(0),)
    entered[:] = []
    with pytest.raises(ValueError, match="must match exactly"):
        np.concatenate((x, mt.distribute_tensor(a[:2 * W], mesh, [Shard(0)])), axis=1)
    assert entered == [np.concatenate]


def test_diff_along_an_unsharded_axis_runs_in_c_else_in_its_entry(mesh, monkeypatch):
    """np.diff of a DTensor without Partials along an int axis that no mesh dim
    shards, n an int of at least 1, is agreed and run in one C call on each block,
    the entry never entered: the axis n shorter (down to 0), the placements kept,
    NumPy's dtype (not_equal for bools, int8 stays int8); along a sharded axis,
    with n=0, prepend= or append=, of a Partial, or with a gradient wanted, the
    entry runs, C agreeing on nothing first. Either way, NumPy's answer."""
    entered = entries_entered(monkeypatch, np.diff)
    rng = np.random.default_rng(9)
    a = rng.standard_normal((2 * W, 6))
    i8 = rng.integers(-100, 100, (2 * W, 6)).astype(np.int8)
    m = a > 0
    x, xi, xm = (mt.distribute_tensor(v, mesh, [Shard(0)]) for v in (a, i8, m))
    r = mt.distribute_tensor(a, mesh, [Replicate()])
    p = make(a, mesh, [Partial("sum")])
    in_c = [(lambda: np.diff(x), np.diff(a)),
            (lambda: np.diff(x, 2), np.diff(a, 2)),
            (lambda: np.diff(x, axis=1), np.diff(a, axis=1)),
            (lambda: np.diff(x, n=3, axis=-1), np.diff(a, n=3, axis=-1)),
            (lambda: np.diff(x, 9), np.diff(a, 9)),
            (lambda: np.diff(xi), np.diff(i8)),
            (lambda: np.diff(xm), np.diff(m)),
            (lambda: np.diff(r, 1, 0), np.diff(a, 1, 0))]
    in_entry = [(lambda: np.diff(x, axis=0), np.diff(a, axis=0)),
                (lambda: np.diff(x, 0), np.diff(a, 0)),
                (lambda: np.diff(x, prepend=0.0), np.diff(a, prepend=0.0)),
                (lambda: np.diff(p), np.diff(a))]
    in_c_or_entry(in_c, in_entry, entered)
    assert np.diff(x).placements == (Shard(0),) and np.diff(r, 1, 0).placements == (Replicate(),)
    g = mt.distribute_tensor(a, mesh, [Shard(0)], requires_grad=True)
    entered[:] = []
    np.diff(g).sum().backward()
    assert entered == [np.diff]
    want = np.zeros_like(a)
    want[:, 0], want[:, -1] = -1.0, 1.0
    np.testing.assert_array_equal(g.grad.full_tensor(), want)


def test_stack_of_one_layout_runs_in_c_else_in_its_entry(mesh, monkeypatch):
    """np.stack of DTensors of one mesh, one shape and one layout, without Partials,
    along any new axis, is agreed and run in one C call, the entry never entered,
    NumPy's promotion kept and the inputs' Shards kept on their dims; with another
    keyword, of a Partial or of a single array, the entry runs, C agreeing on
    nothing first; of shapes that differ, NumPy's ValueError on every rank. Either
    way, NumPy's answer."""
    entered = entries_entered(monkeypatch, np.stack)
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((2 * W, 3)), rng.standard_normal((2 * W, 3))
    f = b.astype(np.float32)
    x, y = (mt.distribute_tensor(v, mesh, [Shard(0)]) for v in (a, b))
    z = mt.distribute_tensor(f, mesh, [Shard(0)])
    r = mt.distribute_tensor(a, mesh, [Replicate()])
    p = make(a, mesh, [Partial("sum")])
    in_c = [(lambda: np.stack((x, y)), np.stack((a, b))),
            (lambda: np.stack([x, y, z], 1), np.stack([a, b, f], 1)),
            (lambda: np.stack((x, y), axis=-1), np.stack((a, b), axis=-1)),
            (lambda: np.stack((x, y), axis=2), np.stack((a, b), axis=2)),
            (lambda: np.stack((r, r), -3), np.stack((a, a), -3))]
    in_entry = [(lambda: np.stack((x, y), out=None), np.stack((a, b), out=None)),
                (lambda: np.stack((p, p), 1), np.stack((a, a), 1)),
                (lambda: np.stack((x,)), np.stack((a,)))]
    in_c_or_entry(in_c, in_entry, entered)
    assert np.stack((x, y)).placements == (Shard(1),)
    assert np.stack((x, y), 2).placements == (Shard(0),)
    entered[:] = []
    with pytest.raises(ValueError, match="same shape"):
        np.stack((x, mt.distribute_tensor(a[:, :2], mesh, [Shard(0)])))
    assert entered == [np.stack]


def test_astype_that_moves_nothing_runs_in_c_else_in_its_entry(mesh, monkeypatch):
    """x.astype(dtype) of a bool or number dtype is agreed and run in one C call
    when nothing moves, each dtype decided apart; a Partial (which an exact cast
    keeps, and another is reduced first), copy=False, a dtype of another byte
    order or a gradient wanted leave the call to the entry.
    Either way, NumPy's answer and the entry's placements."""
    entered = entries_entered(monkeypatch, np.ndarray.astype)
    a = np.arange(4.0 * W * 3).reshape(4 * W, 3) - 5.5
    x = mt.distribute_tensor(a, mesh, [Shard(0)])
    r = mt.distribute_tensor(a, mesh, [Replicate()])
    p = make(a, mesh, [Partial("sum")])  # the sum of every rank's block is a
    cases = [(lambda: x.astype(np.float32), a.astype(np.float32), x.placements, False),
             (lambda: x.astype("i4"), a.astype("i4"), x.placements, False),
             (lambda: x.astype(bool), a.astype(bool), x.placements, False),
             (lambda: r.astype(np.complex64), a.astype(np.complex64), r.placements, False),
             (lambda: x.astype(np.float64), a.copy(), x.placements, False),
             (lambda: p.astype(np.float64), a, p.placements, True),
             (lambda: p.astype(np.int64), a.astype(np.int64), None, True),
             (lambda: x.astype(np.float32, copy=False), a.astype(np.float32), x.placements,
              True),
             (lambda: x.astype(">f4"), a.astype(">f4"), x.placements, True)]
    for call, want, placements, enters in cases:
        call()  # the decision made
        entered[:], before = [], _trace.hook_stats()["entry"]
        got = call()
        assert bool(entered) == enters, want.dtype
        assert _trace.hook_stats()["entry"] == before  # no hand-back from C
        assert got.dtype == want.dtype
        if placements is None:  # reduced first
            assert not any(pl.is_partial() for pl in got.placements)
        else:
            assert got.placements == tuple(placements)
        if not want.dtype.isnative:  # moved by no collective: each rank's block
            np.testing.assert_array_equal(got.to_local(), x.to_local().astype(want.dtype))
            continue
        full = got.full_tensor()
        assert full.dtype == want.dtype
        np.testing.assert_array_equal(full, want)
    g = mt.distribute_tensor(a, mesh, [Shard(0)], requires_grad=True)
    entered[:], before = [], _trace.hook_stats()["entry"]
    assert g.astype(np.float32).requires_grad and entered == [np.ndarray.astype]
    assert _trace.hook_stats()["entry"] == before


def test_numpy_decides_a_result_dtype_through_the_hook_table_once_per_decision(mesh):
    """The dtype of the result (NumPy's: ufunc.resolve_dtypes, a reduction of a
    stand-in) is asked on a miss only, and counted as C's other calls into Python."""
    a = mt.distribute_tensor(np.ones((2 * W, 13)), mesh, [Shard(0)])
    asked = []
    for _ in range(2):
        before = _trace.hook_stats()["dtype"]
        a * 3
        a.sum(0)
        asked.append(_trace.hook_stats()["dtype"] - before)
    assert asked == [2, 0]


def test_chained_results_hit(mesh):
    a = mt.distribute_tensor(np.ones((8, 4)), mesh, [Shard(0)])
    b = mt.distribute_tensor(np.ones((8, 4)), mesh, [Shard(0)])
    c1 = a + b
    c2 = a + b
    assert c1._spec == c2._spec
    (c1 * 2) + b
    before = memo(mesh)["hits"]
    d = (c2 * 2) + b
    assert memo(mesh)["hits"] - before == 2
    assert np.array_equal(d.full_tensor(), np.full((8, 4), 5.0))


def test_register_sharding_after_a_cached_decision(mesh):
    g = np.arange(32.0).reshape(8, 4)
    a = mt.distribute_tensor(g, mesh, [Shard(0)])
    b = mt.distribute_tensor(g, mesh, [Shard(0)])
    a + b
    calls = []

    @register_sharding(np.add)
    def add_rule(x, y):
        calls.append(1)
        return [([Replicate()], [Replicate(), Replicate()])]

    try:
        before = entries()
        r = a + b
        assert calls, "the registered rule was not consulted"
        assert entries() == before + 1
        assert r.placements == (Replicate(),)
        assert np.array_equal(r.full_tensor(), g + g)
    finally:
        clear_sharding_registry(np.add)
    before = (runs(), entries())
    r = a + b
    assert (runs() - before[0], entries() - before[1]) == (1, 0)
    assert r.placements == (Shard(0),) if W > 1 else (Replicate(),)


def test_implicit_replication_with_cached_decisions(mesh):
    g = np.arange(12.0).reshape(4, 3)
    a = mt.distribute_tensor(g, mesh, [Shard(0)])
    b = mt.distribute_tensor(g, mesh, [Shard(0)])
    a + b
    bias = np.array([1.0, 2.0, 3.0])
    with implicit_replication():
        r1 = a + b
        r2 = a + bias
        r3 = a + bias
    assert np.array_equal(r1.full_tensor(), g + g)
    assert np.array_equal(r2.full_tensor(), g + bias)
    assert np.array_equal(r3.full_tensor(), g + bias)
    # Outside it, the same calls are agreed first (the Python entry) and replicate.
    assert np.array_equal((a + bias).full_tensor(), g + bias)
    assert np.array_equal(np.add(a, bias).full_tensor(), g + bias)


def test_redistributing_decisions_run_their_collectives_every_time(mesh):
    if W == 1:
        pytest.skip("needs a Partial over more than one rank")
    p = make(np.arange(8.0), mesh, [Partial("sum")])
    p + 1.0  # P + c reduces the Partial first: a decision holding a plan
    assert memo(mesh)["plans"] >= 1
    for _ in range(2):
        before, calls = _comm.comm_counters(), runs()
        r = p + 1.0
        after = _comm.comm_counters()
        assert runs() - calls == 1  # from the memo, in the executor
        assert sum(after[k][0] - before[k][0] for k in after) >= 1
        assert np.array_equal(r.full_tensor(), np.arange(8.0) + 1)
    q = p * 2.0  # P * c stays Partial: local
    before = _comm.comm_counters()
    q = p * 2.0
    assert _comm.comm_counters() == before
    assert q.placements == (Partial("sum"),)
    assert np.array_equal(q.full_tensor(), np.arange(8.0) * 2)


def test_a_reduction_the_dtype_lacks_is_refused_on_a_size_1_mesh_dim():
    # Nothing is reduced over one rank, but every rank refuses alike (mt_plan_check).
    mesh = mt.init_device_mesh("cpu", (1, W))
    c = mt.DTensor.from_local(np.ones(4, np.complex128), mesh, [Partial("max"), Replicate()])
    for _ in range(2):
        with pytest.raises(TypeError, match="complex numbers have no order"):
            np.exp(c)


def test_out_of_the_results_layout_runs_in_the_executor_other_keywords_too(mesh):
    a = mt.distribute_tensor(np.arange(16.0).reshape(4, 4), mesh, [Shard(0)])
    b = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    a + b
    out = mt.distribute_tensor(np.zeros((4, 4)), mesh, [Shard(0)])
    o0 = out.to_local()
    before = (runs(), entries())
    r = np.add(a, b, out=(out,))
    assert r is out and out.to_local() is o0
    assert (runs() - before[0], entries() - before[1]) == (1, 0)
    assert np.array_equal(out.full_tensor(), np.arange(16.0).reshape(4, 4) + 1)
    # an output of another layout: the Python entry moves the result into it
    rep = mt.distribute_tensor(np.zeros((4, 4)), mesh, [Replicate()])
    before = entries()
    assert np.add(a, b, out=(rep,)) is rep and entries() == before + 1
    assert rep.placements == (Replicate(),)
    assert np.array_equal(rep.full_tensor(), np.arange(16.0).reshape(4, 4) + 1)
    before = (runs(), entries())
    r = np.add(a, b, dtype=np.float32)
    assert r.dtype == np.float32 and (runs() - before[0], entries() - before[1]) == (1, 0)
    a0 = a.to_local()
    a * 2.0  # decided: the executor knows the result's layout
    before = (runs(), entries())
    a += b  # in place, into a's own local array
    a *= 2.0
    assert a.to_local() is a0 and (runs() - before[0], entries() - before[1]) == (2, 0)
    assert np.array_equal(a.full_tensor(), (np.arange(16.0).reshape(4, 4) + 1) * 2)
    q, r = divmod(a, b)  # two outputs
    assert np.array_equal(q.full_tensor(), (np.arange(16.0).reshape(4, 4) + 1) * 2)
    with pytest.raises(TypeError):
        pow(a, b, 3)
    with pytest.raises(TypeError):
        a.__ipow__(b, 3)
    # what the ufunc does not take is x = x op y, as for any Python object: a
    # TypeError here, and a stays
    c = a
    for bad in ("x", [1.0], object()):
        with pytest.raises(TypeError, match="unsupported operand"):
            c += bad
        with pytest.raises(TypeError, match="unsupported operand"):
            c **= bad
        assert c is a


def test_a_number_written_through_a_kept_basic_key_is_written_in_c(mesh, monkeypatch):
    """dt[key] = number, for a basic key whose plan the mesh keeps, into a DTensor
    without Partials, is agreed and written in C, the entry never entered; the
    first write (which makes the plan), a NumPy scalar or array value, a Partial
    and a read-only local array take the entry. Into a view basic indexing made,
    the write reaches the base; a Python int out of the dtype's range raises
    NumPy's OverflowError on every rank. Either way, NumPy's answer."""
    entered = entries_entered(monkeypatch, operator.setitem)
    g = np.arange(6.0 * W * 4).reshape(2 * W, 12)
    want = g.copy()
    x = mt.distribute_tensor(g, mesh, [Shard(0)])
    r = mt.distribute_tensor(g, mesh, [Replicate()])
    i8 = mt.distribute_tensor(np.zeros((2 * W, 3), np.int8), mesh, [Shard(0)])
    for key, value in (((slice(None), 3), 1.0), (0, 2), ((slice(1, None), slice(None, None, 2)),
                                                          True), ((-1, -1), -0.5)):
        entered[:] = []
        x[key] = value  # makes the plan, through the entry
        r[key] = value
        want[key] = value
        assert len(entered) == 2
        x[key] = value
        r[key] = value
        assert entered == [operator.setitem] * 2, key  # written in C
        np.testing.assert_array_equal(x.full_tensor(), want)
        np.testing.assert_array_equal(r.full_tensor(), want)
    entered[:] = []
    x[0] = np.float64(3.0)
    x[0] = np.zeros(12)
    want[0] = 0.0
    assert len(entered) == 2
    view = x[:, :4]
    view[:, 1] = 9.0
    view[:, 1] = 9.0
    want[:, 1] = 9.0
    np.testing.assert_array_equal(x.full_tensor(), want)
    p = make(g, mesh, [Partial("sum")])
    p[0, 0] = 5.0
    entered[:] = []
    p[0, 0] = 5.0
    assert entered == [operator.setitem]
    ro = np.zeros((2, 3))
    ro.flags.writeable = False
    y = DTensor.from_local(ro, mesh, [Shard(0)])
    entered[:] = []
    for _ in range(2):
        with pytest.raises(ValueError, match="read-only"):
            y[0] = 1.0
    assert entered == [operator.setitem] * 2
    i8[0] = 1
    for _ in range(2):
        with pytest.raises(OverflowError):
            i8[0] = 1000
    np.testing.assert_array_equal(i8.full_tensor()[0], np.ones(3, np.int8))


def test_a_user_rule_beats_the_views_and_writes_made_in_c(mesh):
    """A user's rule for operator.getitem, operator.setitem or np.reshape runs in
    place of the view, write or reshape C makes from what the mesh keeps, once
    those are cached: each fast path asks _registry.ruled, the door's rule."""
    from mpitensor import _registry
    x = mt.distribute_tensor(np.arange(8.0 * W).reshape(2 * W, 4), mesh, [Shard(0)])
    for _ in range(2):  # the plans kept, the C paths taken
        x[:, :2]
        x[:, 1] = 1.0
        x.reshape(-1, 2)
    funcs, seen = (operator.getitem, operator.setitem, np.reshape), []
    assert not any(map(_registry.ruled, funcs))
    for func in funcs:
        _registry.set_rule(func, lambda args, kwargs, f=func: seen.append(f) or "ruled")
    try:
        assert _registry.ruled(np.reshape) and not _registry.ruled(np.add)
        assert x[:, :2] == "ruled"
        x[:, 1] = 5.0
        assert x.reshape(-1, 2) == "ruled"
    finally:
        for func in funcs:
            _registry.set_rule(func, None)
    assert seen == list(funcs)
    assert (x.full_tensor()[:, 1] == 1.0).all()  # the rule wrote nothing


def test_a_write_into_a_base_of_copy_views_reaches_them_by_the_python_entry(mesh):
    """While a copy-view lives (a basic index NumPy's view of a local array cannot
    hold), an in-place operator takes the Python entry, whose write makes the
    view again; once every rank learnt that none lives, the executor writes
    alone."""
    g = np.arange(24.0).reshape(6, 4)
    base = mt.distribute_tensor(g, mesh, [Shard(0)])
    one = mt.distribute_tensor(np.ones((6, 4)), mesh, [Shard(0)])
    base + one
    view = base[1:5:3]
    before = entries()
    base += one
    assert entries() == before + (1 if W > 1 else 0)
    assert np.array_equal(view.full_tensor(), (g + 1)[1:5:3])
    assert np.array_equal(base.full_tensor(), g + 1)
    del view
    base += one  # the ranks learn that the view is gone
    before = entries()
    base += one
    assert entries() == before
    assert np.array_equal(base.full_tensor(), g + 3)


def test_pending_async_data_is_completed(mesh):
    g = np.arange(16.0).reshape(4, 4)
    a = mt.distribute_tensor(g, mesh, [Shard(0)])
    a2 = a.redistribute(mesh, [Replicate()])
    a2 + a2
    pending = a.redistribute(mesh, [Replicate()], async_op=True)
    r = pending + a2
    assert np.array_equal(r.full_tensor(), g + g)


def test_plain_arrays_take_the_python_entry_other_objects_are_refused(mesh):
    a = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    a + a
    python = entries()
    assert np.array_equal((a + np.ones((4, 4))).full_tensor(), np.full((4, 4), 2.0))
    assert np.array_equal((np.ones((4, 4)) + a).full_tensor(), np.full((4, 4), 2.0))
    assert entries() == python + 2
    with pytest.raises(TypeError):
        a + "x"
    with pytest.raises(TypeError):
        a + [1.0]
    r = a + np.array(2.0)  # a 0-d array counts as a scalar
    assert np.array_equal(r.full_tensor(), np.full((4, 4), 3.0))


def test_no_reference_leaks(mesh):
    # 12 rows: even shards at 1..4 ranks, so every op here is local
    a = mt.distribute_tensor(np.ones((12, 4)), mesh, [Shard(0)])
    b = mt.distribute_tensor(np.ones((12, 4)), mesh, [Shard(0)])
    la, lb = a.to_local(), b.to_local()
    for _ in range(3):
        a + b, a.sum(0), -a, a * 2.0, a < b, np.add(a, b), a @ b.T
    objs = (a, b, la, lb, a._spec, b._spec, 2.0)
    counts = [sys.getrefcount(o) for o in objs]
    h = runs()
    for _ in range(2000):
        a + b, a.sum(0), -a, a * 2.0, a < b, np.add(a, b)
    assert runs() - h == 2000 * 6
    assert [sys.getrefcount(o) for o in objs] == counts
    r = a + b
    assert sys.getrefcount(r) == 2 and sys.getrefcount(r.to_local()) == 2 + 1
    spec = r._spec
    n = sys.getrefcount(spec)
    del r
    assert sys.getrefcount(spec) == n - 1


def test_a_cleared_memo(mesh):
    a = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    a + a
    mesh._dispatch_clear()
    before = memo(mesh)
    a + a
    assert memo(mesh)["misses"] - before["misses"] == 1  # decided again
    a + a
    assert memo(mesh)["hits"] - before["hits"] == 1


def test_the_spec_can_be_replaced(mesh):
    a = mt.distribute_tensor(np.ones((8, 4)), mesh, [Shard(0)])
    a + a
    r = mt.distribute_tensor(np.ones((8, 4)), mesh, [Replicate()])
    b = mt.distribute_tensor(np.ones((8, 4)), mesh, [Shard(0)])
    b + b
    b._spec = r._spec  # now b claims Replicate: it must use that layout's decisions
    b._local_tensor = r.to_local()
    c = b + b
    assert c.placements == (Replicate(),) and c.shape == (8, 4)
    assert np.array_equal(c.to_local(), np.full((8, 4), 2.0))


def test_a_spec_is_a_named_tuple_made_by_c(mesh):
    """DTensorSpec's constructor is the extension's: positional or keyword fields,
    NamedTuple's methods and pickling, and a TypeError for a missing, an extra or
    an unknown argument."""
    from mpitensor._dtensor_spec import DTensorSpec
    a = mt.distribute_tensor(np.ones((4 * W, 2)), mesh, [Shard(0)])
    s = a._spec
    again = DTensorSpec(s.mesh, s.placements, s.shape, s.dtype, s.stride)
    assert type(again) is DTensorSpec and again == s and again._fields == s._fields
    assert DTensorSpec(stride=s.stride, dtype=s.dtype, shape=s.shape, placements=s.placements,
                       mesh=s.mesh) == s
    assert s._replace(shape=(1, 2)).shape == (1, 2) and DTensorSpec._make(s) == s
    assert pickle.loads(pickle.dumps(DTensorSpec(None, (), (3,), None, (1,)))) == (
        None, (), (3,), None, (1,))
    for args, kwargs, words in [((s.mesh,), {}, "missing"), (tuple(s) + (1,), {}, "positional"),
                                (tuple(s), {"size": 1}, "unexpected"),
                                (tuple(s), {"mesh": s.mesh}, "multiple")]:
        with pytest.raises(TypeError, match=words):
            DTensorSpec(*args, **kwargs)
    assert (mt.DTensor(a.to_local(), again) + 1.0).placements == (Shard(0),)


def test_execute_takes_its_arguments_by_position_or_name(mesh):
    """D.execute is the extension's function: operands as any sequence, the local
    function's extra and keyword arguments, keepdims passed on; an unknown or a
    repeated argument is a TypeError."""
    a = mt.distribute_tensor(np.arange(8.0 * W).reshape(4 * W, 2), mesh, [Shard(0)])
    full = a.full_tensor()
    got = D.execute(("test_scale",), [a], lambda: D.dimmap([[0, 1]], [0, 1], [D.KEEP] * 2),
                    local=lambda x, k, *, offset: x * k + offset, extra=[3.0],
                    kwargs={"offset": 1.0})
    np.testing.assert_array_equal(got.full_tensor(), full * 3.0 + 1.0)
    total = D.execute(np.sum, (a,), axis=1, keepdims=True)
    np.testing.assert_array_equal(total.full_tensor(), full.sum(axis=1, keepdims=True))
    with pytest.raises(TypeError, match="unexpected or repeated argument 'scale'"):
        D.execute(("test_scale",), (a,), scale=2)
    with pytest.raises(TypeError, match="repeated argument 'build'"):
        D.execute(("test_scale",), (a,), None, build=None)
    with pytest.raises(TypeError, match="kwargs must be a dict"):
        D.execute(("test_scale",), (a,), kwargs=[1])


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
    b = pickle.loads(pickle.dumps(a))  # onto the equal live mesh
    assert b.placements == a.placements and np.array_equal(b.to_local(), a.to_local())
    assert isinstance(mesh, _C.MeshBase) and mesh._as_parameter_ != 0  # it owns its communicators


def test_fresh_dtensors_of_a_known_layout_hit(mesh):
    w = mt.distribute_tensor(np.ones((4, 3)), mesh, [Replicate()])
    x0 = DTensor.from_local(np.ones((2, 4)), mesh, [Shard(0)])
    x0 @ w
    x1 = DTensor.from_local(np.full((2, 4), 2.0), mesh, [Shard(0)])
    before = memo(mesh)  # x1 is new, its layout is known: a hit on its first op
    y = x1 @ w
    assert memo(mesh)["hits"] - before["hits"] == 1
    assert memo(mesh)["misses"] == before["misses"]
    assert np.array_equal(y.to_local(), x1.to_local() @ w.to_local())
    before = memo(mesh)
    z = x1.redistribute(mesh, [Shard(0)]) @ w  # a redistribute result, same layout
    assert memo(mesh)["hits"] - before["hits"] == 1 and z.placements == y.placements


def test_a_dropped_mesh_frees_its_communicators_and_memo():
    gc.collect()
    before = _comm.comm_live_count()
    m = mt.init_device_mesh("cpu", (W,))
    a = mt.distribute_tensor(np.ones((12, 4)), m, [Shard(0)])  # even at 1..4 ranks
    for _ in range(2):
        a + a, a.sum(0), a * 2
    assert m._dispatch_stats()["decisions"] >= 3
    during = _comm.comm_live_count()
    del a, m  # no reference cycle: freed at once, without the garbage collector
    assert during > before
    assert _comm.comm_live_count() == before


@pytest.mark.skipif(W < 2, reason="needs a rank outside the mesh")
def test_ranks_outside_the_mesh_run_in_the_executor():
    m = mt.DeviceMesh("cpu", list(range(W - 1)))
    outsider = MPI.COMM_WORLD.Get_rank() == W - 1
    a = mt.distribute_tensor(np.arange(12.0).reshape(6, 2), m, [Replicate()])
    a + a, a.sum(0)
    before = (runs(), entries())
    r, s = a + a, a.sum(0)
    assert r.shape == (6, 2) and s.shape == (2,) and r.dtype == np.float64
    assert (runs() - before[0], entries() - before[1]) == (2, 0)
    if outsider:
        assert r.to_local().size == 0 and s.to_local().size == 0
    else:
        assert np.array_equal(r.to_local(), np.arange(12.0).reshape(6, 2) * 2)


def test_a_listening_tool_sees_every_decision(mesh, capsys):
    a = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    a + a
    with CommDebugMode() as comm:
        before = _trace.hook_stats()
        a + a
        after = _trace.hook_stats()
        assert (after["runs"] - before["runs"], after["entry"] - before["entry"]) == (1, 0)
        assert after["event"] > before["event"]  # the same run, with its events
    assert comm.comm_module_operation_counts["Global"]["operations_list"][0]["name"] == \
        "numpy.add"
    set_logs(dtensor=logging.DEBUG)
    try:
        a.sum(0)
    finally:
        set_logs(dtensor=None)
    assert "numpy.sum: inputs [S(0)] (4, 4) float64" in capsys.readouterr().err


def test_a_tensor_that_requires_grad_is_recorded_by_the_executor(mesh):
    """In grad mode the executor computes the forward (one run, its cached decision)
    and records its node itself: no Python entry runs."""
    a = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    a + a
    a._requires_grad = True
    try:
        before, python = runs(), entries()
        out = a + a
        assert out.grad_fn is not None and runs() == before + 1
        assert entries() == python
        was = _modes.set_grad_enabled(False)
        out = a + a
        assert out.grad_fn is None and runs() == before + 2
        _modes.set_grad_enabled(was)
    finally:
        a._requires_grad = False


def test_a_dtensor_made_in_the_memory_of_a_freed_one_starts_blank(mesh):
    """The executor reuses the memory of freed DTensors: a new one has none of the
    freed one's fields (autograd's bit and node, its Python slots)."""
    a = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    for _ in range(40):  # fill the free list with DTensors that had every field set
        x = (a + a).requires_grad_()
        x._grad, x._retains_grad, x._grad_owned, x._grad_fn = a, True, True, a
        x._fresh = True
        del x
    for _ in range(40):
        y = a + a
        assert not y.requires_grad and y._grad_fn is None and not y._fresh
        assert not any(hasattr(y, s) for s in ("_grad", "_retains_grad", "_grad_owned"))
        assert y._spec is a._spec and y.to_local().sum() == 2 * a.to_local().size


def test_a_ufunc_registered_after_a_call_runs_in_the_executor(mesh):
    """The executor remembers the last ufunc's signature; registering one forgets
    it, so a ufunc first called unregistered runs in the executor once its first
    call has registered it."""
    a = mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])
    u = np.frompyfunc(lambda x, y: x + y, 2, 1)
    # Another library's ufunc: its first call is the Python entry's, which
    # registers it (scipy.special's ufuncs come this way).
    python = entries()
    assert (u(a, a).to_local() == 2.0).all() and entries() == python + 1
    before, python = runs(), entries()
    out = u(a, a)
    assert runs() == before + 1 and entries() == python
    assert out.to_local().dtype == object and (out.to_local() == 2.0).all()


def test_the_memo_and_layouts_stay_within_their_bounds():
    m = mt.init_device_mesh("cpu", (W,))
    limits = mt.set_cache_limits()
    try:
        mt.set_cache_limits(decisions=16, layouts=8, plans=2)
        stats = m._dispatch_stats()
        assert (stats["decision_limit"], stats["layout_limit"], stats["plan_limit"]) == \
            (16, 8, 2)
        for n in range(1, 60):
            x = DTensor.from_local(np.full((2, n), float(n)), m, [Shard(0)])
            y = (x + x).sum(0)
            assert np.array_equal(y.full_tensor(), np.full(n, 4.0 * n * W))
            y = x.redistribute(m, [Replicate()])
            stats = m._dispatch_stats()
            assert stats["decisions"] <= 16 and stats["layouts"] <= 8
            assert stats["plans"] <= 2
        with pytest.raises(ValueError):
            mt.set_cache_limits(plans=0)
    finally:
        mt.set_cache_limits(**limits)
    assert m._dispatch_stats()["decision_limit"] == limits["decisions"]


def test_enums_come_from_c():
    # Read through ctypes from the core's table (mt_enum_at), which the extension's
    # own checks agree with: dispatch_init takes MAX_NDIM shards and a Partial per
    # reduce op, register_ufunc only the two families.
    assert (D.KEEP, D.CONTRACT, D.REDUCE, D.REPLICATE) == (0, 1, 2, 3)
    assert (CORE.PLACEMENT_REPLICATE, CORE.PLACEMENT_SHARD, CORE.PLACEMENT_PARTIAL) == (0, 1, 2)
    assert (CORE.FAMILY_ELEMENTWISE, CORE.FAMILY_MATMUL) == (0, 1)
    assert (CORE.MAX_NDIM, CORE.MAX_MESH_NDIM, CORE.PROP_MAX_INPUTS) == (16, 8, 8)
    assert CORE.REDUCE_OPS == ("sum", "avg", "product", "max", "min")
    assert CORE.REDUCE_COUNT == len(CORE.REDUCE_OPS)
    assert Shard(3)._code == (CORE.PLACEMENT_SHARD, 3, 0)
    assert from_code((CORE.PLACEMENT_PARTIAL, 0, CORE.REDUCE_MAX)) is Partial("max")
    assert _plan.STEP_KINDS[0] == "all_gather"


def test_code_run_by_numpy_may_clear_the_memo(mesh):
    # The C path reads a decision without plans in place; NumPy's error callback
    # runs Python code inside the call, here clearing the decision and the layouts
    # the result's wrap needs: it finds (here: makes) them again.
    big = np.full((4 * W, 4), 1e308)
    a = mt.distribute_tensor(big, mesh, [Shard(0)])
    with np.errstate(over="ignore"):
        a.sum(0)  # decided; the next call's output layout is known
        a.sum(0)
    cleared = []

    def clear(kind, flag):
        mesh._dispatch_clear()
        cleared.append(kind)

    before, calls = memo(mesh), runs()
    with np.errstate(over="call"):
        old = np.seterrcall(clear)
        try:
            s = a.sum(0)
        finally:
            np.seterrcall(old)
    assert cleared and runs() - calls == 1
    assert memo(mesh)["misses"] - before["misses"] == 1  # the wrap decided it again
    assert s.placements == (Partial(),) and s.shape == (4,)
    assert np.all(np.isinf(s.to_local()))
    with np.errstate(over="ignore"):
        t = a.sum(0)  # and the memo serves the next call
    assert t._spec == s._spec

