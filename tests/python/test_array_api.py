"""The array API namespace (mpitensor.array_api): DTensor.__array_namespace__ gives
it, its creation functions build on the mesh of ``with mesh:`` (else the world) cut
along the first dim, its functions give NumPy's values through the registry, and
its DTensor protocol pieces (mT, to_device, DLPack, __index__) answer as the standard
says; and it has every public NumPy name, whose functions give NumPy's values as
DTensors. The standard's own suite runs beside these (make test-array-api)."""

import types
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
import mpitensor.array_api as xp
from mpitensor import Replicate, Shard, init_device_mesh
from mpitensor.debug import CommDebugMode

N = MPI.COMM_WORLD.Get_size()


@pytest.fixture(scope="module")
def mesh():
    return init_device_mesh("cpu", (N,))


def test_namespace_is_the_module_and_the_standards_version(mesh):
    x = xp.asarray([1.0, 2.0], device=mesh)
    assert x.__array_namespace__() is xp
    assert x.__array_namespace__(api_version="2024.12") is xp
    # NumPy 2.4's version is reported; 2025.12's functions are there too.
    assert xp.__array_api_version__ == "2024.12"
    assert x.__array_namespace__(api_version="2025.12") is xp
    assert mt.array_api is xp
    with pytest.raises(ValueError):
        x.__array_namespace__(api_version="2019.01")


def test_creation_under_with_mesh_is_cut_along_the_first_dim(mesh):
    with mesh:
        made = [xp.zeros((7, 3)), xp.ones(5, dtype=xp.int32), xp.empty((4, 2)),
                xp.full((6,), 2.5), xp.arange(9), xp.linspace(0, 1, 11), xp.eye(5, 3),
                xp.asarray(np.arange(12.0).reshape(6, 2)), xp.asarray([[1, 2], [3, 4]]),
                xp.fft.fftfreq(8)]
        scalar = xp.asarray(3.0)
    for a in made:
        assert a.device_mesh is mesh and a.placements == (Shard(0),), a
    assert scalar.placements == (Replicate(),) and scalar.shape == ()
    assert made[1].dtype == np.int32 and made[3].dtype == np.float64
    assert made[4].dtype == np.arange(9).dtype
    np.testing.assert_array_equal(made[6].full_tensor(), np.eye(5, 3))
    np.testing.assert_array_equal(made[5].full_tensor(), np.linspace(0, 1, 11))
    np.testing.assert_array_equal(made[9].full_tensor(), np.fft.fftfreq(8))


def test_device_takes_a_mesh_or_the_cpu(mesh):
    sub = init_device_mesh("cpu", (1, N))
    a = xp.zeros((4, 4), device=sub)
    assert a.device_mesh is sub and a.placements == (Shard(0), Shard(0))
    b = xp.ones(3, device="cpu")
    assert b.device == "cpu" and xp.ones(3, device=b.device).shape == (3,)
    assert b.to_device(b.device) is b and b.to_device(b.device_mesh) is b
    with pytest.raises(ValueError):
        xp.zeros(3, device="cuda")
    with pytest.raises(ValueError):
        b.to_device("cuda")


def test_an_arrays_device_builds_on_its_mesh():
    """``x.device`` is the CPU and remembers ``x``'s mesh: what a client makes
    with ``device=x.device`` (SciPy's constants) meets ``x`` on one mesh."""
    sub = init_device_mesh("cpu", (1, N))
    x = xp.zeros((4, 4), device=sub)
    assert x.device == "cpu" and x.device == xp.ones(3).device and hash(x.device) == hash("cpu")
    made = [xp.asarray(0.5, device=x.device), xp.zeros(3, device=x.device),
            xp.full((2,), 1.0, device=x.device), xp.zeros_like(np.ones(3), device=x.device)]
    for a in made:
        assert a.device_mesh is sub, a
    np.testing.assert_array_equal((x - made[0]).full_tensor(), np.full((4, 4), -0.5))
    assert x.to_device(xp.ones(3).device) is x


def test_creation_outside_any_mesh_uses_the_world():
    a = xp.arange(2 * N + 1)
    assert a.device_mesh.shape == (N,) and a.placements == (Shard(0),)
    assert a.device_mesh is xp.arange(3).device_mesh


def test_creation_moves_nothing(mesh):
    ref = np.arange(20.0).reshape(10, 2)
    with mesh, CommDebugMode() as mode:
        a = xp.asarray(ref)
        xp.zeros_like(a), xp.full_like(a, 1), xp.arange(10), xp.eye(4)
    assert mode.get_total_counts() == 0
    np.testing.assert_array_equal(a.full_tensor(), ref)


def test_asarray_copy_semantics(mesh):
    ref = np.arange(8.0)
    with mesh:
        shared = xp.asarray(ref)
        own = xp.asarray(ref, copy=True)
    assert np.shares_memory(shared.to_local(), ref)
    assert not np.shares_memory(own.to_local(), ref)
    assert own.to_local().base is None  # this rank's part copied alone
    assert xp.asarray(shared) is shared and xp.asarray(shared, copy=True) is not shared
    assert xp.asarray(shared, dtype=xp.float32).dtype == np.float32
    with pytest.raises(ValueError):
        xp.asarray(shared, dtype=xp.float32, copy=False)


@pytest.mark.parametrize("name, args, kwargs", [
    ("concat", "two", {"axis": 0}),
    ("permute_dims", "one", {"axes": (1, 0)}),
    ("matrix_transpose", "one", {}),
    ("clip", "one", {"min": 2.0, "max": 9.0}),
    ("cumulative_sum", "one", {"axis": 0}),
    ("sum", "one", {"axis": 0}),
    ("mean", "one", {}),
    ("tensordot", "square", {"axes": 1}),
    ("vecdot", "two", {}),
    ("sort", "one", {"axis": 0}),
    ("take", "take", {"axis": 0}),
    ("searchsorted", "sorted", {}),
    ("unique_values", "one", {}),
    ("tril", "one", {"k": 1}),
])
def test_functions_give_numpys_values(mesh, name, args, kwargs):
    a = np.arange(24.0).reshape(6, 4) % 7
    b = np.arange(24.0).reshape(6, 4)[::-1].copy()
    with mesh:
        da, db = xp.asarray(a), xp.asarray(b)
    calls = {"one": ((da,), (a,)), "two": (((da, db),), ((a, b),)) if name == "concat"
             else ((da, db), (a, b)),
             "square": ((da, xp.asarray(a.T.copy(), device=mesh)), (a, a.T)),
             "take": ((da, xp.asarray([0, 5, 2], device=mesh)), (a, np.array([0, 5, 2]))),
             "sorted": ((xp.arange(10.0, device=mesh), xp.asarray([2.5, 0.0, 9.0],
                                                                   device=mesh)),
                        (np.arange(10.0), np.array([2.5, 0.0, 9.0])))}[args]
    got = getattr(xp, name)(*calls[0], **kwargs)
    want = getattr(np, name)(*calls[1], **kwargs)
    if name == "unique_values":  # the order of unique values is not specified
        got, want = np.sort(got.full_tensor()), np.sort(want)
    else:
        assert isinstance(got, mt.DTensor) and got.dtype == np.asarray(want).dtype
        got = got.full_tensor()
    np.testing.assert_allclose(got, want)


def test_zero_d_results_are_arrays(mesh):
    with mesh:
        m = xp.asarray(np.eye(3) * 2.0)
        v = xp.arange(5.0)
    for got in (xp.linalg.det(m), xp.linalg.vector_norm(v), xp.max(v)):
        assert isinstance(got, mt.DTensor) and got.shape == ()
    assert float(xp.linalg.det(m)) == pytest.approx(8.0)
    sign, logdet = xp.linalg.slogdet(m)
    assert isinstance(logdet, mt.DTensor) and float(logdet) == pytest.approx(np.log(8.0))


def test_a_sharded_sum_keeps_its_rows_and_reduces_once(mesh):
    with mesh:
        x = xp.arange(4.0 * N)
    with CommDebugMode() as mode:
        total = float(xp.sum(x * x))
    assert total == float(np.sum(np.arange(4.0 * N) ** 2))
    assert mode.get_total_counts() == (1 if N > 1 else 0)


def test_data_type_functions_do_not_gather(mesh):
    with mesh:
        x = xp.zeros((4 * N,), dtype=xp.int32)
    with CommDebugMode() as mode:
        assert xp.result_type(x, xp.float32) == np.float64
        assert xp.can_cast(x, xp.int64) and xp.iinfo(x).bits == 32
        assert xp.astype(x, xp.int32, copy=False) is x
        assert xp.astype(x, xp.float32).placements == (Shard(0),)
    assert mode.get_total_counts() == 0


def test_array_object_pieces(mesh):
    a = np.arange(12).reshape(3, 4)
    with mesh:
        x = xp.asarray(a)
        i = xp.asarray(2)
    np.testing.assert_array_equal(x.mT.full_tensor(), a.T)
    assert [0, 1, 2, 3][i] == 2 and x.__dlpack_device__() == (1, 0)
    assert [int(v) for v in xp.asarray([3, 1, 4], device=mesh)] == [3, 1, 4]
    with pytest.raises(TypeError):
        [0, 1][xp.asarray(1.0, device=mesh)]
    np.testing.assert_array_equal(np.from_dlpack(x), a)
    back = xp.from_dlpack(a)
    assert back.placements == (Shard(0),)
    np.testing.assert_array_equal(back.full_tensor(), a)


def test_info(mesh):
    info = xp.__array_namespace_info__()
    assert info.default_device() == "cpu" and info.devices() == [mt.device("cpu")]
    assert info.default_dtypes() == np.__array_namespace_info__().default_dtypes()
    assert info.dtypes(kind="bool") == {"bool": np.dtype(bool)}
    assert info.capabilities()["boolean indexing"]


def test_clip_takes_array_bounds_and_stack_many_arrays(mesh):
    a = np.arange(12.0).reshape(6, 2)
    with mesh:
        x, lo = xp.asarray(a), xp.asarray(np.full((6, 2), 3.0))
    got = xp.clip(x, min=lo, max=8.0)
    np.testing.assert_array_equal(got.full_tensor(), np.clip(a, 3.0, 8.0))
    assert got.dtype == a.dtype
    many = [xp.asarray(a + k, device=mesh) for k in range(9)]
    np.testing.assert_array_equal(xp.stack(many).full_tensor(),
                                  np.stack([a + k for k in range(9)]))


def test_masked_write_of_a_zero_d_array(mesh):
    a = np.arange(10.0)
    with mesh:
        x, v = xp.asarray(a), xp.asarray(-1.0)
    x[x > 4.0] = v
    np.testing.assert_array_equal(x.full_tensor(), np.where(a > 4.0, -1.0, a))


def test_scikit_learns_standard_scaler_gives_numpys_statistics(mesh, monkeypatch):
    """StandardScaler with array_api_dispatch on a sharded array: its column sums are
    Partials that it corrects in place (x -= c) and a masked copy of an array of
    values (NumPy's on the gathered statistics): the result stays sharded and equals
    NumPy's."""
    sklearn = pytest.importorskip("sklearn")
    if not getattr(sklearn.utils._array_api, "_check_array_api_dispatch", None):
        pytest.skip("this scikit-learn has no array API dispatch")
    monkeypatch.setenv("SCIPY_ARRAY_API", "1")
    from sklearn.preprocessing import StandardScaler

    data = np.random.default_rng(0).standard_normal((41, 3)) * [1.0, 10.0, 100.0] + 5.0
    with mesh:
        x = xp.asarray(data)
    # (the gather's warning comes once per process: another test may have had it)
    with sklearn.config_context(array_api_dispatch=True), warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.GatherWarning)
        scaler = StandardScaler().fit(x)
        y = scaler.transform(x)
    want = StandardScaler().fit(data)
    assert y.placements == (Shard(0),)
    np.testing.assert_allclose(y.full_tensor(), want.transform(data), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(scaler.var_.full_tensor(), want.var_, rtol=1e-12)


# NumPy's public callables the namespace leaves out, each with why.
LEFT_OUT = {"test": "NumPy's own test runner"}
# NumPy's submodules the namespace leaves out, each with why.
MODULES_LEFT_OUT = {
    "random": "each rank would draw its own numbers (mpitensor.random is distributed)",
    "ma": "masked arrays", "rec": "record arrays",  # NumPy subclasses
    "strings": "string arrays", "char": "string arrays",  # DTensors hold numbers
    "ctypeslib": "pointers into a whole array's memory",
    "core": "private", "f2py": "a build tool", "typing": "annotations",
}
# The standard's functions whose form differs from NumPy's: the namespace's own.
STANDARDS_OWN = ["astype", "sort", "argsort", "clip", "meshgrid", "broadcast_arrays",
                 "isin", "tensordot", "can_cast", "result_type", "finfo", "iinfo",
                 "asarray", "zeros", "ones", "empty", "full", "arange", "linspace", "eye",
                 "zeros_like", "ones_like", "empty_like", "full_like", "from_dlpack"]


def _public_callables(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name for name in dir(module) if not name.startswith("_")
                and callable(getattr(module, name, None))}


def test_every_public_numpy_callable_is_on_the_namespace():
    missing = {n for n in _public_callables(np) if not hasattr(xp, n)}
    assert missing <= set(LEFT_OUT), sorted(missing - set(LEFT_OUT))
    for sub in ("linalg", "fft"):
        missing = {n for n in _public_callables(getattr(np, sub))
                   if not hasattr(getattr(xp, sub), n)}
        assert missing <= set(LEFT_OUT), (sub, sorted(missing - set(LEFT_OUT)))
    # Ufuncs, types and constants are NumPy's own objects; functions are NumPy's,
    # wrapped so that they give DTensors.
    assert xp.add is np.add and xp.float32 is np.float32 and xp.errstate is np.errstate
    assert xp.pi == np.pi and xp.newaxis is None and xp.linalg.LinAlgError is np.linalg.LinAlgError
    assert xp.pad.__wrapped__ is np.pad and xp.linalg.norm.__wrapped__ is np.linalg.norm
    for name in STANDARDS_OWN:
        assert getattr(xp, name).__module__.startswith("mpitensor."), name
    assert set(xp.__all__) >= _public_callables(np) - set(LEFT_OUT) - {"fft", "linalg"}


def test_numpys_submodules_are_on_the_namespace_but_a_few():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        modules = {name for name in dir(np) if not name.startswith("_")
                   and isinstance(getattr(np, name, None), types.ModuleType)}
    missing = {name for name in modules if not hasattr(xp, name)}
    assert missing <= set(MODULES_LEFT_OUT), sorted(missing - set(MODULES_LEFT_OUT))
    assert xp.exceptions is np.exceptions and xp.lib.NumpyVersion is np.lib.NumpyVersion
    assert xp.lib.stride_tricks is xp.lib.stride_tricks
    assert "sliding_window_view" in dir(xp.lib.stride_tricks)


def test_numpys_submodule_functions_give_dtensors(mesh):
    """xarray's rolling takes xp.lib.stride_tricks.sliding_window_view."""
    with mesh:
        x = xp.asarray(_A)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.GatherWarning)
        windows = xp.lib.stride_tricks.sliding_window_view(x, 3, axis=0)
        roots = xp.emath.sqrt(x - 5.0)
        values = xp.polynomial.polynomial.polyval(x, [1.0, 0.5])
    _assert_same(_values(windows), np.lib.stride_tricks.sliding_window_view(_A, 3, axis=0))
    _assert_same(_values(roots), np.emath.sqrt(_A - 5.0))
    _assert_same(_values(values), np.polynomial.polynomial.polyval(_A, [1.0, 0.5]))


def _values(got):
    """NumPy's form of a result: its DTensors' whole arrays (a NumPy array out of the
    namespace is an error)."""
    assert not isinstance(got, np.ndarray), type(got)
    if isinstance(got, mt.DTensor):
        return got.full_tensor()
    if isinstance(got, (tuple, list)):
        return type(got)(_values(g) for g in got) if type(got) in (tuple, list) \
            else tuple(_values(g) for g in got)
    return got


def _assert_same(got, want):
    if isinstance(want, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(want)
        for g, w in zip(got, want):
            _assert_same(g, w)
        return
    want = np.asarray(want)
    assert np.shape(got) == want.shape and np.asarray(got).dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, equal_nan=True)


_A = (np.arange(42.0).reshape(7, 6) ** 1.5) % 11.0
_NAN = np.where(_A > 8.0, np.nan, _A)
_V = np.cos(np.arange(13.0))


@pytest.mark.parametrize("name, args, kwargs", [
    ("pad", ("a", ((1, 2), (0, 1))), {}),
    ("pad", ("a", 2), {"mode": "edge"}),
    ("transpose", ("a",), {}),
    ("einsum", ("ij,kj->ik", "a", "a"), {}),
    ("einsum", ("ij,ij->j", "a", "a"), {}),
    ("gradient", ("a",), {"axis": 0}),
    ("gradient", ("a",), {}),
    ("diff", ("a",), {"axis": 0}),
    ("diff", ("v",), {"n": 2}),
    ("cumsum", ("a",), {"axis": 0}),
    ("cumsum", ("a",), {}),
    ("nanmean", ("nan",), {"axis": 0}),
    ("nanmean", ("nan",), {}),
    ("nanstd", ("nan",), {"axis": 1}),
    ("nanmax", ("nan",), {"axis": 0}),
    ("percentile", ("a", 30), {}),
    ("percentile", ("a", [10, 90]), {"axis": 0}),
    ("quantile", ("a", 0.5), {"axis": 1}),
    ("median", ("a",), {"axis": 0}),
    ("interp", ("v", [-1.0, 0.0, 1.0], [3.0, 5.0, 4.0]), {}),
    ("polyfit", ("v", "v2", 2), {}),
    ("polyval", ([1.0, -2.0, 0.5], "v"), {}),
    ("roll", ("a", 3), {"axis": 0}),
    ("average", ("a",), {"axis": 0}),
    ("histogram", ("v",), {"bins": 4}),
    ("where", ("mask", "a", 0.0), {}),
    ("nan_to_num", ("nan",), {}),
    ("tile", ("v", 2), {}),
    ("atleast_3d", ("v",), {}),
    ("cov", ("a",), {}),
    ("convolve", ("v", [1.0, 2.0, 1.0]), {}),
    ("trapezoid" if hasattr(np, "trapezoid") else "trapz", ("v",), {}),
])
def test_numpys_functions_on_the_namespace_give_numpys_values(mesh, name, args, kwargs):
    data = {"a": _A, "nan": _NAN, "v": _V, "v2": _V ** 2 + 1.0, "mask": _A > 3.0}
    with mesh:
        dist = {key: xp.asarray(value) for key, value in data.items()}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.GatherWarning)
        got = getattr(xp, name)(*[dist.get(a, a) if isinstance(a, str) else a
                                  for a in args], **kwargs)
    want = getattr(np, name)(*[data.get(a, a) if isinstance(a, str) else a for a in args],
                             **kwargs)
    if not isinstance(want, (tuple, list)):
        assert isinstance(got, mt.DTensor), type(got)
    _assert_same(_values(got), want)


@pytest.mark.parametrize("name, args, kwargs", [
    ("logspace", (0, 2, 5), {}),
    ("geomspace", (1, 1000, 4), {}),
    ("identity", (5,), {}),
    ("tri", (5, 3), {}),
    ("fromfunction", (lambda i, j: i + 10 * j, (5, 3)), {}),
    ("indices", ((4, 3),), {}),
    ("array", ([[1, 2], [3, 4], [5, 6]],), {}),
    ("array", ([1, 2],), {"ndmin": 3}),
    ("asanyarray", ([1.0, 2.0, 3.0],), {}),
    ("ascontiguousarray", (5,), {}),
    ("asfortranarray", ([[1, 2], [3, 4]],), {}),
    ("require", ([1, 2, 3],), {"dtype": np.float32}),
    ("asarray_chkfinite", ([1.0, 2.0],), {}),
    ("fromiter", (range(7),), {"dtype": np.int64}),
    ("diag", ([1, 2, 3],), {}),
    ("vander", ([1, 2, 3],), {}),
    ("hanning", (6,), {}),
    ("tril_indices", (4,), {}),
])
def test_numpys_creation_functions_make_dtensors(mesh, name, args, kwargs):
    with mesh:
        got = getattr(xp, name)(*args, **kwargs)
    want = getattr(np, name)(*args, **kwargs)
    for g in (got if isinstance(got, tuple) else (got,)):
        assert isinstance(g, mt.DTensor) and g.device_mesh is mesh
        assert g.placements == ((Shard(0),) if g.ndim else (Replicate(),))
    _assert_same(_values(got), want)


def test_index_makers_and_vectorize_give_dtensors(mesh):
    with mesh:
        grid, open_grid = xp.mgrid[0:4, 0:3], xp.ogrid[0:4, 0:3]
        joined = xp.r_[1:4, 0, 8]
        x = xp.asarray(_V)
    _assert_same(_values(grid), np.mgrid[0:4, 0:3])
    _assert_same(_values(open_grid), np.ogrid[0:4, 0:3])
    _assert_same(_values(joined), np.r_[1:4, 0, 8])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.GatherWarning)
        got = xp.vectorize(lambda a, b: a if a > b else b)(x, 0.25)
        stacked = xp.c_[x, x]
    _assert_same(_values(got), np.vectorize(lambda a, b: a if a > b else b)(_V, 0.25))
    _assert_same(_values(stacked), np.c_[_V, _V])
    assert isinstance(xp.vectorize(abs), np.vectorize)


def test_the_2025_12_functions(mesh):
    a = np.arange(24).reshape(6, 4) % 7
    with mesh:
        x, t = xp.asarray(a), xp.asarray([2, 5, 11])
        m = xp.asarray(np.array([[2.0, 1.0], [1.0, 3.0]]))
        r = xp.asarray(np.array([[0.0, -1.0], [1.0, 0.0]], dtype=np.float32))
    _assert_same(_values(xp.isin(x, t)), np.isin(a, [2, 5, 11]))
    _assert_same(_values(xp.isin(x, 5, invert=True)), np.isin(a, 5, invert=True))
    for value in (5, 9):
        got = xp.isin(value, x)
        assert isinstance(got, mt.DTensor) and got.shape == ()
        assert bool(got) == bool(np.isin(value, a))
        assert bool(xp.isin(value, x, invert=True)) != bool(np.isin(value, a))
    assert xp.broadcast_shapes((6, 1), (4,), ()) == (6, 4) and xp.broadcast_shapes() == ()
    mesh_grid = xp.meshgrid(xp.arange(3, device=mesh), xp.arange(2, device=mesh))
    assert type(mesh_grid) is tuple and type(xp.broadcast_arrays(x, t[:1])) is tuple
    _assert_same(_values(mesh_grid), np.meshgrid(np.arange(3), np.arange(2)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mt.GatherWarning)
        w, v = xp.linalg.eig(m)
        rot = xp.linalg.eigvals(r)
    assert w.dtype == np.complex128 and v.dtype == np.complex128
    assert rot.dtype == np.complex64
    np.testing.assert_allclose(np.sort_complex(_values(w)), np.sort_complex(
        np.linalg.eigvals(np.array([[2.0, 1.0], [1.0, 3.0]]))), rtol=1e-12)
    np.testing.assert_allclose(np.sort_complex(_values(rot)), [-1j, 1j], atol=1e-6)
    _assert_same(_values(xp.expand_dims(x, axis=(0, -1))), np.expand_dims(a, (0, -1)))
    _assert_same(_values(xp.permute_dims(x, (-1, 0))), np.transpose(a, (-1, 0)))
    flat = xp.sort(xp.reshape(x, (-1,)))
    got = xp.searchsorted(flat, 3.5)
    assert isinstance(got, mt.DTensor) and got.shape == ()
    assert int(got) == np.searchsorted(np.sort(a.ravel()), 3.5)


def _numpys_error(call):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            call()
    except Exception as e:  # noqa: BLE001 - the type is what is compared
        return type(e)
    return None


@pytest.mark.parametrize("call", [
    lambda m, x: m.broadcast_shapes((6, 2), (4,)),
    lambda m, x: m.expand_dims(x, axis=(0, 0)),
    lambda m, x: m.expand_dims(x, axis=(5,)),
    lambda m, x: m.permute_dims(x, (0, 0)),
    lambda m, x: m.linalg.eig(x),
    lambda m, x: m.pad(x, ((1, 2, 3),)),
    lambda m, x: m.asarray_chkfinite(x / 0.0),
    lambda m, x: m.einsum("ij,jk->ik", x, x),
], ids=["broadcast_shapes", "expand_dims dup", "expand_dims axis", "permute_dims",
        "eig non-square", "pad", "asarray_chkfinite", "einsum"])
def test_bad_input_gets_numpys_error_on_every_rank(mesh, call):
    a = np.arange(24.0).reshape(6, 4)
    with mesh:
        x = xp.asarray(a)
    want = _numpys_error(lambda: call(np, a))
    assert want is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(want):
            call(xp, x)
