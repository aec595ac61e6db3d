"""Every NumPy call that NumPy accepts answers with NumPy's value:
a function or ufunc method with no distributed rule gathers its DTensor arguments,
runs NumPy once per rank and returns Replicate DTensors, with one GatherWarning per
function, the gathers counted by CommDebugMode, a MemoryError on every rank when a
rank cannot hold them, and mpitensor.strict() turning it back into a TypeError."""

from __future__ import annotations

import os
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, distribute_tensor, init_device_mesh
from mpitensor._ops import _fallback
from mpitensor.debug import CommDebugMode
from mpi_helpers import outcome, same_everywhere

COMM = MPI.COMM_WORLD
W, RANK = COMM.Get_size(), COMM.Get_rank()

# (id, call on arrays (a (9, 5) matrix "m" and a (13,) vector "v", DTensors or
# ndarrays alike)): everyday calls that have no distributed rule.
CALLS = [
    ("unique_counts", lambda m, v: np.unique(v, return_counts=True, return_index=True,
                                              return_inverse=True)),
    ("pad", lambda m, v: np.pad(m, ((1, 2), (0, 1)))),
    ("vstack", lambda m, v: np.vstack([m, m])),
    ("hstack", lambda m, v: np.hstack([v, v])),
    ("column_stack", lambda m, v: np.column_stack([v, v])),
    ("nonzero", lambda m, v: np.nonzero(m)),
    ("argwhere", lambda m, v: np.argwhere(m)),
    ("flatnonzero", lambda m, v: np.flatnonzero(v)),
    ("count_nonzero", lambda m, v: np.count_nonzero(m, axis=0)),
    ("repeat", lambda m, v: np.repeat(v, 2)),
    ("take", lambda m, v: np.take(v, [1, 5, 12])),
    ("searchsorted", lambda m, v: np.searchsorted(np.sort(v), [0.5, 2.0])),
    ("bincount", lambda m, v: np.bincount(v.astype(np.int64))),
    ("cov", lambda m, v: np.cov(m)),
    ("corrcoef", lambda m, v: np.corrcoef(m[:, :4])),
    ("triu", lambda m, v: np.triu(m)),
    ("trace", lambda m, v: np.trace(m)),
    ("nanmean", lambda m, v: np.nanmean(m, axis=1)),
    ("isin", lambda m, v: np.isin(v, [1.0, 3.0])),
    ("interp", lambda m, v: np.interp(v, [0.0, 4.0], [0.0, 1.0])),
    ("average", lambda m, v: np.average(m, axis=0, weights=np.arange(1.0, 10.0))),
    ("ptp", lambda m, v: np.ptp(m, axis=0)),
    ("kron", lambda m, v: np.kron(v, v)),
    ("convolve", lambda m, v: np.convolve(v, np.array([1.0, -1.0, 2.0]))),
    ("gradient", lambda m, v: np.gradient(v)),
    ("meshgrid", lambda m, v: np.meshgrid(v, v)),
    ("add_reduce", lambda m, v: np.add.reduce(m, axis=0)),
    ("add_accumulate", lambda m, v: np.add.accumulate(v)),
    ("multiply_outer", lambda m, v: np.multiply.outer(v, v)),
    ("maximum_reduceat", lambda m, v: np.maximum.reduceat(v, [0, 4, 9])),
    ("histogram", lambda m, v: np.histogram(v, bins=4)),
    ("percentile", lambda m, v: np.percentile(m, [10, 90], axis=0)),
    ("linalg_det", lambda m, v: np.linalg.det(m[:5])),
    ("vecdot_gufunc", lambda m, v: np.vecdot(m, m)),
]


# Forms of registered functions that their rules do not cover (a keyword, an order,
# a flattening axis): they answer too, on the gathered arrays.
FORMS = [
    ("reshape_order_f", lambda m, v: np.reshape(m, (5, 9), order="F")),
    ("ravel_order_f", lambda m, v: np.ravel(m, order="F")),
    ("where_one_argument", lambda m, v: np.where(m > 2)),
    ("einsum_ellipsis", lambda m, v: np.einsum("...i->...", m)),
    ("norm_nuc", lambda m, v: np.linalg.norm(m, "nuc")),
    ("sum_initial", lambda m, v: np.sum(m, axis=0, initial=5.0)),
    ("sum_where", lambda m, v: np.sum(m, axis=1, where=m > 0)),
    ("add_where_out", lambda m, v: np.add(m, m, where=m > 0, out=np.zeros_like(m))),
    ("percentile_weights", lambda m, v: np.percentile(v, 50, weights=v + 1,
                                                      method="inverted_cdf")),
    ("concatenate_flat", lambda m, v: np.concatenate([m, m], axis=None)),
    ("sort_flat", lambda m, v: np.sort(m, axis=None)),
]


def global_arrays():
    m = (np.arange(45.0).reshape(9, 5) * 7) % 11 - 3
    v = (np.arange(13.0) * 5) % 7
    return m, v


def same(got, want) -> bool:
    """``got`` (DTensors, or what NumPy gives) equals NumPy's ``want``. Collective."""
    if isinstance(want, tuple) or isinstance(want, list):
        return (type(got) is type(want) or isinstance(got, type(want))) and \
            len(got) == len(want) and all([same(g, w) for g, w in zip(got, want)])
    if isinstance(want, np.ndarray):
        whole = got.full_tensor() if type(got) is mt.DTensor else got
        return isinstance(whole, np.ndarray) and whole.dtype == want.dtype and \
            whole.shape == want.shape and np.array_equal(whole, want, equal_nan=True)
    if type(got) is mt.DTensor and isinstance(want, np.generic):
        # A reduction's scalar is a 0-d DTensor, as np.sum's is.
        got = got.full_tensor()
        return got.shape == () and same(got[()], want)
    return type(got) is type(want) and (got == want or (got != got and want != want))


def meshes_and_placements():
    out = [((W,), [Shard(0)]), ((W,), [Replicate()])]
    if W >= 4:
        out += [((2, W // 2), [Shard(0), Replicate()])]
    return out


@pytest.fixture(autouse=True)
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.GatherWarning)
        yield


@pytest.mark.parametrize("case", CALLS, ids=[c[0] for c in CALLS])
@pytest.mark.parametrize("layout", meshes_and_placements(), ids=str)
def test_every_call_gives_numpys_value_on_every_rank(case, layout):
    _, call = case
    mesh = init_device_mesh("cpu", layout[0])
    m, v = global_arrays()
    pl_v = [Replicate() if isinstance(p, Shard) and p.dim > 0 else p for p in layout[1]]
    dm = distribute_tensor(m, mesh, layout[1])
    dv = distribute_tensor(v, mesh, pl_v)
    want = call(m, v)
    got = call(dm, dv)
    assert same(got, want), (got, want)


@pytest.mark.parametrize("case", FORMS, ids=[c[0] for c in FORMS])
def test_forms_no_rule_covers_give_numpys_value(case):
    _, call = case
    mesh = init_device_mesh("cpu", (W,))
    m, v = global_arrays()
    dm, dv = distribute_tensor(m, mesh, [Shard(0)]), distribute_tensor(v, mesh, [Shard(0)])
    want = call(m, v)
    # An ndarray that NumPy writes into is the DTensor's part here.
    got = call(dm, dv) if "out" not in case[0] else np.add(
        dm, dm, where=dm > 0, out=mt.zeros(*m.shape, device_mesh=mesh, placements=[Shard(0)]))
    assert same(got, want), (got, want)


def test_what_numpy_writes_into_is_written_back():
    mesh = init_device_mesh("cpu", (W,))
    m, v = global_arrays()
    dm, dv = distribute_tensor(m, mesh, [Shard(0)]), distribute_tensor(v, mesh, [Shard(0)])
    out = mt.zeros(*m.shape, device_mesh=mesh, placements=[Shard(1)])
    assert np.cumsum(dm, axis=1, out=out) is out
    assert np.array_equal(out.full_tensor(), np.cumsum(m, axis=1))
    np.add.at(dv, [0, 1, 1], 1.0)
    np.put(dm, [0, 7], [-9.0, -8.0])
    want_v, want_m = v.copy(), m.copy()
    np.add.at(want_v, [0, 1, 1], 1.0)
    np.put(want_m, [0, 7], [-9.0, -8.0])
    assert np.array_equal(dv.full_tensor(), want_v)
    assert np.array_equal(dm.full_tensor(), want_m)
    assert dv.placements == (Shard(0),) and dm.placements == (Shard(0),)


def test_the_result_is_replicated_on_the_mesh():
    mesh = init_device_mesh("cpu", (W,))
    v = distribute_tensor(np.arange(8.0 * W), mesh, [Shard(0)])
    out = np.kron(v, v)
    assert type(out) is mt.DTensor and out.device_mesh == mesh
    assert out.placements == (Replicate(),)


def test_the_gather_is_counted_and_warned_once_per_function():
    mesh = init_device_mesh("cpu", (W,))
    v = distribute_tensor(np.arange(8.0 * W), mesh, [Shard(0)])
    _fallback._warned.discard("numpy.kron")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with CommDebugMode() as comm:
            out = np.kron(v, v)
        np.kron(v, v)
    kinds = [w for w in caught if issubclass(w.category, mt.GatherWarning)]
    assert len(kinds) == 1 and "numpy.kron" in str(kinds[0].message)
    assert kinds[0].filename == __file__  # the program's line, not mpitensor's
    assert f"{8 * W * 8} bytes" in str(kinds[0].message)
    if W > 1:
        assert comm.get_comm_counts().get("all_gather_into_tensor", 0) >= 1
    assert np.array_equal(out.full_tensor(), np.kron(np.arange(8.0 * W), np.arange(8.0 * W)))


@pytest.mark.parametrize("door", ["ufunc", "method", "item assignment"])
def test_the_gather_warning_names_the_programs_line_through_every_door(door):
    """The GatherWarning of a call that came through the ufuncs' door (``a += v``
    into an ndarray), a method (``v.round(1, out)``) or item assignment names the
    line of the program, not one of mpitensor's."""
    mesh = init_device_mesh("cpu", (W,))
    v = distribute_tensor(np.arange(8.0 * W), mesh, [Shard(0)])
    o = distribute_tensor(np.zeros(8 * W), mesh, [Shard(0)])
    calls = {"ufunc": lambda: np.zeros(8 * W).__iadd__(v),
             "method": lambda: v.round(1, o),
             "item assignment": lambda: o.__setitem__(np.array([[0, 1]]), 5.0)}
    names = {"ufunc": "numpy.add", "method": "numpy.round",
             "item assignment": "DTensor item assignment"}
    _fallback._warned.discard(names[door])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        calls[door]()
    kinds = [w for w in caught if issubclass(w.category, mt.GatherWarning)]
    assert len(kinds) == 1 and names[door] in str(kinds[0].message)
    assert kinds[0].filename == __file__


def test_strict_turns_the_gather_into_a_type_error(monkeypatch):
    mesh = init_device_mesh("cpu", (W,))
    v = distribute_tensor(np.arange(4.0 * W), mesh, [Shard(0)])
    with CommDebugMode() as comm, mt.strict(), pytest.raises(TypeError, match="numpy.kron"):
        np.kron(v, v)
    with mt.strict(), pytest.raises(TypeError, match=r"numpy.arctan2.accumulate"):
        np.arctan2.accumulate(v)
    assert comm.get_total_counts() == 0
    monkeypatch.setattr(_fallback, "_STRICT_ENV", True)
    # kron has a rule, whose NoRule for a sharded second factor names the call.
    with pytest.raises(TypeError, match=r"numpy\.kron"):
        np.kron(v, v)
    with pytest.raises(TypeError, match="no sharding rule"):
        np.roots(v)


def test_a_gather_that_one_rank_cannot_hold_is_a_memory_error_everywhere(monkeypatch):
    mesh = init_device_mesh("cpu", (W,))
    v = distribute_tensor(np.arange(4.0 * W), mesh, [Shard(0)])
    if RANK == W - 1:
        monkeypatch.setattr(_fallback, "_available_bytes", lambda: 16)
    with CommDebugMode() as comm:
        got = same_everywhere(outcome(lambda: np.kron(v, v)))
    assert got is not None and got[0] == "MemoryError" and "numpy.kron" in got[1], got
    assert comm.get_total_counts() == 0  # nothing moved
    assert np.array_equal(v.full_tensor(), np.arange(4.0 * W))


@pytest.mark.skipif(W < 2, reason="a rank that differs needs two of them")
def test_another_function_on_one_rank_raises_everywhere():
    mesh = init_device_mesh("cpu", (W,))
    v = distribute_tensor(np.arange(4.0 * W), mesh, [Shard(0)])
    got = same_everywhere(outcome(
        lambda: np.kron(v, v) if RANK == 0 else np.convolve(v, v)))
    assert got is not None and got[0] == "ValueError", got
    assert np.array_equal(v.full_tensor(), np.arange(4.0 * W))


def test_grad_mode_refuses_a_gather_that_would_lose_the_gradient():
    mesh = init_device_mesh("cpu", (W,))
    v = distribute_tensor(np.arange(4.0 * W), mesh, [Shard(0)], requires_grad=True)
    with pytest.raises(NotImplementedError, match="numpy.kron"):
        np.kron(v, v)
    with mt.no_grad():
        assert np.kron(v, v).shape == (16 * W * W,)


def test_numpy_save_writes_the_file_once(tmp_path_factory):
    mesh = init_device_mesh("cpu", (W,))
    v = distribute_tensor(np.arange(4.0 * W), mesh, [Shard(0)])
    folder = COMM.bcast(str(tmp_path_factory.mktemp("save")) if RANK == 0 else None)
    path = os.path.join(folder, "v.npy")
    assert np.save(path, v) is None
    assert np.array_equal(np.load(path), np.arange(4.0 * W))


def test_a_gathered_scalar_is_a_0d_replicated_dtensor():
    """A NumPy scalar of a gathered call comes back as a reduction's does, so that
    array API clients (SciPy's) keep to one namespace."""
    mesh = init_device_mesh("cpu", (W,))
    v = distribute_tensor(np.arange(9.0), mesh, [Shard(0)])
    for got, want in [(np.polyval(v, 2.0), np.polyval(np.arange(9.0), 2.0)),
                      (np.linalg.matrix_rank(v.reshape(3, 3)),
                       np.linalg.matrix_rank(np.arange(9.0).reshape(3, 3)))]:
        assert type(got) is mt.DTensor and got.shape == () and got.dtype == want.dtype
        assert got.placements == (Replicate(),) and got.full_tensor()[()] == want


# (name, call on (matrix, complex matrix, row, column, complex row)).
GUFUNCS = [
    ("vecdot", lambda m, c, r, k, cr: np.vecdot(m, m)),
    ("vecdot-axis0", lambda m, c, r, k, cr: np.vecdot(m, m, axis=0)),
    ("vecdot-complex", lambda m, c, r, k, cr: np.vecdot(c, c)),
    ("matvec", lambda m, c, r, k, cr: np.matvec(m, r)),
    ("vecmat", lambda m, c, r, k, cr: np.vecmat(k, m)),
    ("matvec-complex", lambda m, c, r, k, cr: np.matvec(c, cr)),
    ("vecmat-complex", lambda m, c, r, k, cr: np.vecmat(cr[:5], c.T)),
]


@pytest.mark.usefixtures("strict_numpy")  # a gather would be a TypeError
@pytest.mark.parametrize("case", GUFUNCS, ids=[g[0] for g in GUFUNCS])
@pytest.mark.parametrize("pl", [Shard(0), Shard(1), Replicate()], ids=str)
def test_the_linear_algebra_gufuncs_are_distributed_contractions(case, pl):
    """np.vecdot runs as np.linalg.vecdot does, np.matvec and np.vecmat as matmul
    with a column or a row: no gather, NumPy's values (a complex vector conjugated
    where NumPy conjugates it)."""
    mesh = init_device_mesh("cpu", (W,))
    m, _ = global_arrays()
    c = m[:5] + 1j * m[4:]
    numpys = (m, c, m[0], m[:, 0], c[0])
    ours = (distribute_tensor(m, mesh, [pl]), distribute_tensor(c, mesh, [pl])) + tuple(
        distribute_tensor(v, mesh, [Replicate()]) for v in numpys[2:])
    got = case[1](*ours)
    assert type(got) is mt.DTensor
    np.testing.assert_allclose(got.full_tensor(), case[1](*numpys), rtol=1e-12, atol=1e-12)


def test_results_that_a_dtensor_cannot_hold_come_back_as_numpy_gives_them():
    mesh = init_device_mesh("cpu", (W,))
    v = distribute_tensor(np.arange(3.0 * W), mesh, [Shard(0)])
    text = np.array2string(v)
    assert text == np.array2string(np.arange(3.0 * W))
    assert np.array_equal(np.array_split(v, 2)[1].full_tensor(),
                          np.array_split(np.arange(3.0 * W), 2)[1])


# ufunc methods that equal a distributed operation run as it, without a gather.
METHODS = [
    ("add_reduce", lambda a: np.add.reduce(a)),
    ("add_reduce_axis1", lambda a: np.add.reduce(a, axis=1, keepdims=True)),
    ("add_reduce_positional", lambda a: np.add.reduce(a, 1, np.float32)),
    ("multiply_reduce_none", lambda a: np.multiply.reduce(a / 10 + 1, axis=None)),
    ("maximum_reduce", lambda a: np.maximum.reduce(a, axis=0)),
    ("minimum_reduce", lambda a: np.minimum.reduce(a, axis=1)),
    ("logical_and_reduce", lambda a: np.logical_and.reduce(a > -3, axis=0)),
    ("logical_or_reduce", lambda a: np.logical_or.reduce(a > 5, axis=1)),
    ("add_accumulate", lambda a: np.add.accumulate(a)),
    ("multiply_accumulate", lambda a: np.multiply.accumulate(a / 10 + 1, axis=1)),
    ("multiply_outer", lambda a: np.multiply.outer(a, a[0])),
    ("subtract_outer", lambda a: np.subtract.outer(a[:, 0], a[1])),
    ("greater_outer_scalar", lambda a: np.greater.outer(a, 2.0)),
]


@pytest.mark.parametrize("case", METHODS, ids=[c[0] for c in METHODS])
@pytest.mark.parametrize("layout", meshes_and_placements() + [((W,), [Shard(1)])], ids=str)
def test_ufunc_methods_run_as_the_operation_they_equal(case, layout):
    _, call = case
    mesh = init_device_mesh("cpu", layout[0])
    m, _ = global_arrays()
    dm = distribute_tensor(m, mesh, layout[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", mt.GatherWarning)
        got = call(dm)
    want = np.asarray(call(m))
    whole = got.full_tensor()
    assert whole.dtype == want.dtype and whole.shape == want.shape
    np.testing.assert_allclose(whole, want, rtol=1e-13)
