"""Factories zeros, ones, empty, full, rand, randn: size forms, each rank allocating
exactly its own box, dtypes, non-member ranks, and no communication. arange,
linspace, logspace, eye, identity, tri and full's array fill: every rank's part
bit-identical to NumPy's array there, on every layout, and NumPy's exception types.
The *_like factories: the layout they take and what overrides it."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DeviceMesh, Partial, Replicate, Shard, init_device_mesh
from mpitensor.debug import CommDebugMode
from mpitensor.placement_types import _StridedShard
from mpi_helpers import bits_equal, gather_global, ref_box

N = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()

NUMERIC = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
           np.uint32, np.uint64, np.float16, np.float32, np.float64,
           np.complex64, np.complex128]


def factory(name):
    """Every factory as f(size_tuple, **kw); full fills with 2."""
    if name == "full":
        return lambda size, **kw: mt.full(size, 2, **kw)
    return lambda size, **kw: getattr(mt, name)(*size, **kw)


FACTORIES = ["zeros", "ones", "empty", "full", "rand", "randn"]


def mesh_shapes():
    return [(N,), (1, N), (N, 1)] + ([(2, 2)] if N == 4 else [])


@pytest.fixture(scope="module")
def meshes():
    return {s: init_device_mesh("cpu", s) for s in mesh_shapes()}


def test_size_as_varargs_list_or_tuple(meshes):
    mesh = meshes[(N,)]
    for name in ["zeros", "ones", "empty", "rand", "randn"]:
        f = getattr(mt, name)
        shapes = {f(5, 3, device_mesh=mesh).shape, f((5, 3), device_mesh=mesh).shape,
                  f([5, 3], device_mesh=mesh).shape,
                  f(np.int64(5), np.int32(3), device_mesh=mesh).shape}
        assert shapes == {(5, 3)}
    assert mt.zeros(7, device_mesh=mesh).shape == (7,)
    assert {mt.full((5, 3), 1, device_mesh=mesh).shape,
            mt.full([5, 3], 1, device_mesh=mesh).shape} == {(5, 3)}
    assert mt.full(4, 1, device_mesh=mesh).shape == (4,)


@pytest.mark.parametrize("name", FACTORIES)
def test_zero_dim(name, meshes):
    dt = factory(name)((), device_mesh=meshes[(N,)])
    assert dt.shape == () and dt.to_local().shape == ()


@pytest.mark.parametrize("name", FACTORIES)
def test_default_dtype_is_float64(name, meshes):
    dt = factory(name)((3,), device_mesh=meshes[(N,)])
    if name == "full":
        dt = mt.full((3,), 2.0, device_mesh=meshes[(N,)])
    assert dt.dtype == np.float64 and dt.to_local().dtype == np.float64


@pytest.mark.parametrize("name", ["zeros", "ones", "empty", "full"])
@pytest.mark.parametrize("dtype", NUMERIC, ids=lambda d: np.dtype(d).name)
def test_every_numeric_dtype(name, dtype, meshes):
    dt = factory(name)((5, 2), dtype=dtype, device_mesh=meshes[(N,)], placements=[Shard(0)])
    local = dt.to_local()
    assert dt.dtype == np.dtype(dtype) and local.dtype == np.dtype(dtype)
    assert local.shape == ref_box((5, 2), (N,), (RANK,), [Shard(0)])[0]
    expect = {"zeros": 0, "ones": 1, "full": 2}.get(name)
    if expect is not None:
        assert np.all(local == np.array(expect).astype(dtype))


@pytest.mark.parametrize("fill, dtype", [
    (7, np.asarray(7).dtype), (7.5, np.float64), (True, np.bool_), (1 + 2j, np.complex128),
    (np.float32(1.5), np.float32), (np.int8(-3), np.int8), (np.uint16(9), np.uint16),
])
def test_full_infers_the_dtype_like_numpy(fill, dtype, meshes):
    dt = mt.full((3, 2), fill, device_mesh=meshes[(N,)], placements=[Shard(1)])
    assert dt.dtype == np.dtype(dtype) == np.full((1,), fill).dtype
    assert np.all(dt.to_local() == fill)


def test_full_with_an_explicit_dtype(meshes):
    dt = mt.full((4,), 3, dtype=np.float32, device_mesh=meshes[(N,)])
    assert dt.dtype == np.float32 and np.all(dt.to_local() == 3.0)


@pytest.mark.parametrize("name", FACTORIES)
def test_uneven_rows_each_rank_allocates_its_box(name, meshes, comm):
    dt = factory(name)((5, 3), device_mesh=meshes[(N,)], placements=[Shard(0)])
    rows = comm.allgather(dt.to_local().shape[0])
    assert rows == [ref_box((5,), (N,), (r,), [Shard(0)])[0][0] for r in range(N)]
    assert dt.to_local().shape[1:] == (3,)
    if N == 4:
        assert rows == [2, 2, 1, 0]
    assert dt.shape == (5, 3)


@pytest.mark.parametrize("name", ["zeros", "ones", "full"])
@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_values_rebuild_the_global_array(name, mesh_shape, meshes):
    mesh = meshes[mesh_shape]
    problems = []
    for pl in itertools.product([Replicate(), Shard(0), Shard(1)], repeat=len(mesh_shape)):
        dt = factory(name)((5, 3), device_mesh=mesh, placements=pl)
        got, bad = gather_global(dt)
        problems += bad
        expect = {"zeros": 0.0, "ones": 1.0, "full": 2}[name]
        if not np.array_equal(got, np.full((5, 3), expect)):
            problems.append(f"{pl}: wrong values")
    assert problems == []


@pytest.mark.parametrize("name", FACTORIES)
def test_spec(name, meshes):
    mesh = meshes[(N,)]
    dt = factory(name)((4, 6), device_mesh=mesh, placements=(Shard(-1),))
    assert dt.placements == (Shard(1),)
    assert dt.device_mesh is mesh
    assert dt.stride() == (6, 1)
    assert dt.size == 24 and dt.ndim == 2
    default = factory(name)((4, 6), device_mesh=mesh)
    assert default.placements == (Replicate(),)
    assert default.to_local().shape == (4, 6)


@pytest.mark.skipif(N < 2, reason="needs a rank outside the mesh")
@pytest.mark.parametrize("name", FACTORIES)
def test_non_member_gets_an_empty_local(name):
    mesh = DeviceMesh("cpu", list(range(N - 1)))
    dt = factory(name)((4, 3), dtype=np.float32, device_mesh=mesh, placements=[Shard(0)])
    assert dt.shape == (4, 3) and dt.dtype == np.float32
    if RANK == N - 1:
        assert dt.to_local().shape == (0,) and dt.to_local().dtype == np.float32
    else:
        assert dt.to_local().shape == ref_box((4, 3), (N - 1,), (RANK,), [Shard(0)])[0]


@st.composite
def cases(draw):
    mesh_shape = draw(st.sampled_from(mesh_shapes()))
    ndim = draw(st.integers(0, 3))
    shape = tuple(draw(st.lists(st.integers(0, 7), min_size=ndim, max_size=ndim)))
    choices = [Replicate()] + [Shard(d) for d in range(-ndim, ndim)]
    pl = tuple(draw(st.lists(st.sampled_from(choices), min_size=len(mesh_shape),
                             max_size=len(mesh_shape))))
    name = draw(st.sampled_from(FACTORIES))
    dtype = draw(st.sampled_from([np.float32, np.float64, np.complex64]))
    return mesh_shape, shape, pl, name, dtype


@given(cases())
@settings(max_examples=150)
def test_local_shape_is_this_ranks_box(meshes, case):
    # Factories do not communicate, so this property test is local to each rank.
    mesh_shape, shape, pl, name, dtype = case
    mesh = meshes[mesh_shape]
    dt = factory(name)(shape, dtype=dtype, device_mesh=mesh, placements=pl)
    assert dt.shape == shape and dt.dtype == dtype
    assert dt.to_local().shape == ref_box(shape, mesh_shape, mesh.get_coordinate(), pl)[0]
    assert dt.to_local().dtype == dtype


@pytest.mark.timeout(60)
def test_factories_do_not_communicate(meshes, comm):
    """One rank calls every factory alone; if any communicated, that rank would wait
    for the others, which wait in the allgather below."""
    mesh = meshes[(N,)]
    shapes = None
    if RANK == N - 1:
        shapes = [factory(name)((9, 2), device_mesh=mesh, placements=[Shard(0)])
                  .to_local().shape for name in FACTORIES]
    shapes = comm.allgather(shapes)[-1]
    mt.manual_seed(0)  # that rank drew random streams alone; put all back in step
    assert shapes == [ref_box((9, 2), (N,), (N - 1,), [Shard(0)])[0]] * len(FACTORIES)


@pytest.mark.parametrize("name", FACTORIES)
def test_partial_placements_are_rejected(name, meshes):
    with pytest.raises(ValueError):
        factory(name)((4,), device_mesh=meshes[(N,)], placements=[Partial()])


# -- arange, linspace, logspace, eye, identity, tri: NumPy's values, each rank its part


def _chunk(a, n, i, axis):
    size = -(-a.shape[axis] // n)
    stop = a.shape[axis]
    return a.take(range(min(i * size, stop), min((i + 1) * size, stop)), axis)


def ref_local(full, mesh, placements):
    """This rank's local array of `full` by torch's definitions, mesh dim by mesh
    dim (torch.chunk pieces; a strided shard chunks each of its equal pieces)."""
    coord = mesh.get_coordinate()
    if coord is None:
        return np.empty((0,), full.dtype)
    a = full
    for m, p in enumerate(placements):
        n, i = mesh.shape[m], coord[m]
        if isinstance(p, _StridedShard):
            pieces = np.split(a, p.split_factor, axis=p.dim)
            a = np.concatenate([_chunk(q, n, i, p.dim) for q in pieces], axis=p.dim)
        elif isinstance(p, Shard):
            a = _chunk(a, n, i, p.dim % a.ndim)
    return a


def layouts(ndim):
    """(mesh shape, placements) pairs for an ndim-D tensor: every mix of Replicate
    and Shard of each dim on 1-D and 2-D meshes, both mesh dims sharding dim 0 too."""
    choices = [Replicate()] + [Shard(d) for d in range(ndim)]
    out = []
    for shape in mesh_shapes():
        out += [(shape, pl) for pl in itertools.product(choices, repeat=len(shape))]
    return out


def check_parts(make, ref, meshes):
    """make(mesh, placements) on every layout: the global spec is NumPy's and each
    rank's part holds NumPy's bits at its place. Returns the mismatches."""
    problems = []
    for shape, pl in layouts(ref.ndim):
        mesh = meshes[shape]
        dt = make(mesh, list(pl))
        local, expect = dt.to_local(), ref_local(ref, mesh, pl)
        if dt.shape != ref.shape or dt.dtype != ref.dtype or dt.placements != pl:
            problems.append(f"{shape} {pl}: spec {dt.shape} {dt.dtype} {dt.placements}")
        elif not bits_equal(local, expect):
            problems.append(f"{shape} {pl}: part {local!r}, NumPy's {expect!r}")
    return problems


ARANGE = [  # (args, kwargs) of np.arange
    ((10,), {}), ((0,), {}), ((-3,), {}), ((2,), {}), ((5,), {}), ((13,), {}),
    ((1, 10), {}), ((10, 1, -1), {}), ((3, 3), {}), ((2, 3, 5), {}),
    ((0, 1, 0.1), {}), ((0.5, 100.3, 0.7), {}), ((-5.5, 5.5, 1.1), {}),
    ((0.1, 70.3, 0.037), {}), ((1e10, 1e10 + 300, 0.3), {}), ((7.25, -3.0, -0.15), {}),
    ((0, 10, 0.1), {"dtype": np.float32}), ((np.float32(0.1), 50, np.float32(0.3)), {}),
    ((0, 300, 0.7), {"dtype": np.float16}), ((-2.0, 2.0, 0.3), {"dtype": np.float32}),
    ((250, 260), {"dtype": np.uint8}), ((-7, 20, 3), {"dtype": np.int8}),
    ((100, -100, -7), {"dtype": np.int16}), ((5, 1, -1), {"dtype": np.uint32}),
    ((0, 3, 0.5), {"dtype": int}), ((0.5, 9.5, 1.5), {"dtype": np.int32}),
    ((0, 2), {"dtype": bool}), ((1, 0, -1), {"dtype": bool}),
    ((1 + 1j, 10 + 5j, 1 + 0.5j), {}), ((0, 10, 1 + 0j), {}),
    ((0, 5, 0.5), {"dtype": np.complex64}), ((0, 1e-320, 1), {}), ((0, 1, np.inf), {}),
    ((np.int8(3), np.int8(100), np.int8(5)), {}), ((2**63, 2**63 + 3), {}),
]


@pytest.mark.parametrize("args, kw", ARANGE, ids=str)
def test_arange_is_numpys_on_every_part(args, kw, meshes):
    ref = np.arange(*args, **kw)
    assert check_parts(lambda mesh, pl: mt.arange(*args, **kw, device_mesh=mesh,
                                                  placements=pl), ref, meshes) == []


def test_arange_argument_forms(meshes):
    mesh = meshes[(N,)]
    for got, ref in [(mt.arange(stop=5, device_mesh=mesh), np.arange(stop=5)),
                     (mt.arange(3, step=2, device_mesh=mesh), np.arange(3, step=2)),
                     (mt.arange(2, 5, None, device_mesh=mesh), np.arange(2, 5, None)),
                     (mt.arange(0, 5, 1, np.int16, device_mesh=mesh),
                      np.arange(0, 5, 1, np.int16))]:
        assert bits_equal(got.to_local(), ref)


LINSPACE = [  # (args, kwargs) of np.linspace
    ((0, 1, 5), {}), ((0, 1), {}), ((0, 1, 50), {"endpoint": False}),
    ((-2.5, 7.1, 13), {}), ((1e-3, 1e3, 97), {}), ((3.0, -3.0, 10), {}),
    ((1, 2, 1), {}), ((1, 2, 0), {}), ((1, 2, 1), {"endpoint": False}), ((1, 2, 2), {}),
    ((np.float32(0.1), np.float32(0.9), 37), {}), ((0, 1, 11), {"dtype": np.float32}),
    ((0, np.float32(1), 7), {}), ((np.float16(-1), np.float16(1), 9), {}),
    ((-3, 7.5, 40), {"dtype": int}), ((5, -5, 9), {"dtype": np.int8}),
    ((0, 100, 7), {"dtype": np.uint16, "endpoint": False}),
    ((1 + 2j, -3 + 0.5j, 9), {}), ((0, 1e-323, 10), {}), ((0, 5e-324, 3), {}),
    ((np.array([0, 1, 2]), np.array([5, 9, 3]), 7), {}),
    ((np.array([0, 1, 2]), np.array([5, 9, 3]), 7), {"axis": 1}),
    ((np.array([0.0, 1.0]), np.array([[5.0], [9.0]]), 6), {"axis": -1}),
    (([0, 1e-323], [1, 1e-323], 5), {}),
]


@pytest.mark.parametrize("args, kw", LINSPACE, ids=str)
def test_linspace_is_numpys_on_every_part(args, kw, meshes):
    ref, step = np.linspace(*args, **kw, retstep=True)
    assert check_parts(lambda mesh, pl: mt.linspace(*args, **kw, device_mesh=mesh,
                                                    placements=pl), ref, meshes) == []
    got, got_step = mt.linspace(*args, **kw, retstep=True, device_mesh=meshes[(N,)])
    assert bits_equal(np.asarray(got_step), np.asarray(step))


LOGSPACE = [  # (args, kwargs) of np.logspace
    ((0, 3, 4), {}), ((0, 2, 9), {"base": 2}), ((-1, 1, 7), {"endpoint": False}),
    ((-1, 1, 7), {"base": np.float32(3)}), ((np.float32(0), np.float32(1), 11), {}),
    ((1, 2, 0), {}), ((1, 2, 1), {}), ((0, 3, 4), {"dtype": int}),
    ((0, 2, 5), {"base": [2, 3, 10]}), ((0, 2, 5), {"base": [2, 3, 10], "axis": 1}),
    ((np.array([0, 1]), 2, 6), {"axis": -1}),
]


@pytest.mark.parametrize("args, kw", LOGSPACE, ids=str)
def test_logspace_is_numpys_on_every_part(args, kw, meshes):
    ref = np.logspace(*args, **kw)
    assert check_parts(lambda mesh, pl: mt.logspace(*args, **kw, device_mesh=mesh,
                                                    placements=pl), ref, meshes) == []


MATRICES = [  # (name, args, kwargs) of np.eye, np.identity, np.tri
    ("eye", (5,), {}), ("eye", (4, 6, 1), {}), ("eye", (6, 4, -2), {}),
    ("eye", (3, 5, 7), {}), ("eye", (5,), {"k": -9}), ("eye", (4,), {"dtype": int}),
    ("eye", (4,), {"dtype": bool}), ("eye", (0,), {}), ("eye", (1, 3), {}),
    ("eye", (7, 7, 10**30), {}),
    ("eye", (3, None, np.int64(-1)), {"dtype": np.complex64}),
    ("identity", (5,), {}), ("identity", (3, np.complex64), {}),
    ("tri", (5,), {}), ("tri", (4, 6, 1), {}), ("tri", (6, 4, -2), {}),
    ("tri", (3, 5, -9), {}), ("tri", (3, 5, 9), {}), ("tri", (-1, 3), {}),
    ("tri", (3, -2), {}), ("tri", (4,), {"dtype": np.int8}), ("tri", (5, 3, -2**62), {}),
    ("tri", (5, 3, 2**63), {}),
]


@pytest.mark.parametrize("name, args, kw", MATRICES, ids=str)
def test_matrices_are_numpys_on_every_part(name, args, kw, meshes):
    ref = getattr(np, name)(*args, **kw)
    f = getattr(mt, name)
    assert check_parts(lambda mesh, pl: f(*args, **kw, device_mesh=mesh, placements=pl),
                       ref, meshes) == []


@pytest.mark.parametrize("mesh_shape", [(N,)] + ([(2, 2)] if N == 4 else []), ids=str)
def test_strided_shards_take_numpys_values(mesh_shape, meshes):
    mesh = meshes[mesh_shape]
    pl = [_StridedShard(0, split_factor=2)] + [Shard(0)] * (len(mesh_shape) - 1)
    cases = [(mt.arange(0.5, 24.5, device_mesh=mesh, placements=pl),
              np.arange(0.5, 24.5)),
             (mt.linspace(-1, 1, 24, device_mesh=mesh, placements=pl),
              np.linspace(-1, 1, 24)),
             (mt.eye(8, 3, -1, device_mesh=mesh, placements=pl), np.eye(8, 3, -1)),
             (mt.full((8, 2), np.arange(8.0)[:, None], device_mesh=mesh, placements=pl),
              np.full((8, 2), np.arange(8.0)[:, None]))]
    for dt, ref in cases:
        assert bits_equal(dt.to_local(), ref_local(ref, mesh, pl))


def test_requires_grad_and_dtype_checks(meshes):
    mesh = meshes[(N,)]
    assert mt.linspace(0, 1, 4, device_mesh=mesh, requires_grad=True).requires_grad
    assert not mt.eye(3, device_mesh=mesh).requires_grad
    with pytest.raises(RuntimeError):
        mt.arange(4, device_mesh=mesh, requires_grad=True)  # int64: no gradients
    with pytest.raises(TypeError):
        mt.arange(4, dtype=object, device_mesh=mesh)


@pytest.mark.skipif(N < 2, reason="needs a rank outside the mesh")
def test_ranges_on_a_rank_outside_the_mesh():
    mesh = DeviceMesh("cpu", list(range(N - 1)))
    for dt, ref in [(mt.arange(7.0, device_mesh=mesh, placements=[Shard(0)]),
                     np.arange(7.0)),
                    (mt.tri(5, device_mesh=mesh, placements=[Shard(1)]), np.tri(5))]:
        assert dt.shape == ref.shape and dt.dtype == ref.dtype
        assert bits_equal(dt.to_local(), ref_local(ref, mesh, dt.placements))


def _every_new_factory(mesh, pl):
    """One call of each factory this file adds, on 1-D placements `pl`."""
    a = mt.arange(12.0, device_mesh=mesh, placements=pl)
    return [a, mt.linspace(0, 1, 9, device_mesh=mesh, placements=pl),
            mt.logspace(0, 1, 9, device_mesh=mesh, placements=pl),
            mt.eye(9, 3, device_mesh=mesh, placements=pl),
            mt.identity(9, device_mesh=mesh, placements=pl),
            mt.tri(9, 2, device_mesh=mesh, placements=pl),
            mt.full((9, 3), np.arange(3), device_mesh=mesh, placements=pl),
            mt.zeros_like(a), mt.ones_like(a), mt.empty_like(a), mt.full_like(a, 3),
            mt.rand_like(a), mt.randn_like(a)]


def test_new_factories_count_no_communication(meshes):
    with CommDebugMode() as mode:
        made = _every_new_factory(meshes[(N,)], [Shard(0)])
    assert mode.get_total_counts() == 0 and len(made) == 13


@pytest.mark.timeout(60)
def test_new_factories_do_not_communicate(meshes, comm):
    """One rank calls every factory alone; if any communicated, that rank would wait
    for the others, which wait in the allgather below."""
    shapes = None
    if RANK == N - 1:
        made = _every_new_factory(meshes[(N,)], [Shard(0)])
        shapes = [d.to_local().shape for d in made]
    shapes = comm.allgather(shapes)[-1]
    mt.manual_seed(0)  # that rank drew random streams alone; put all back in step
    assert shapes[0] == ref_box((12,), (N,), (N - 1,), [Shard(0)])[0]
    assert shapes[3] == ref_box((9, 3), (N,), (N - 1,), [Shard(0)])[0]


BAD = [  # (name, args, kwargs): NumPy raises, and mt.name must raise the same type
    ("arange", (0, 10, 0), {}), ("arange", (0.0, 1.0, 0.0), {}), ("arange", (), {}),
    ("arange", (np.nan,), {}), ("arange", (0, np.inf), {}),
    ("arange", (0, 5), {"dtype": bool}),
    ("arange", (-3, 3, 2), {"dtype": np.uint8}), ("arange", (0, 10**400), {}),
    ("arange", ((1, 2),), {}),
    ("linspace", (0, 1, -1), {}), ("linspace", (0, 1, 2.5), {}),
    ("linspace", (0, 1, 5), {"axis": 1}), ("linspace", ([0, 1], 1, 5), {"axis": -3}),
    ("linspace", (0, 1, 5), {"axis": 0.5}), ("linspace", (1j, 2, 5), {"dtype": int}),
    ("logspace", (0, 1, -2), {}), ("logspace", (0, 1, 5), {"base": [2, 3], "axis": 2}),
    ("eye", (-1,), {}), ("eye", (2.5,), {}), ("eye", (3, -1), {}),
    ("eye", (3,), {"k": 1.5}),
    ("identity", (-2,), {}), ("identity", (2.5,), {}),
    ("tri", (5, 3, 10**30), {}), ("tri", (5, 3, -10**30), {}),
]


@pytest.mark.parametrize("name, args, kw", BAD, ids=str)
def test_bad_arguments_raise_numpys_exception(name, args, kw, meshes):
    with pytest.raises(Exception) as theirs:
        getattr(np, name)(*args, **kw)
    with pytest.raises(theirs.type):
        getattr(mt, name)(*args, **kw, device_mesh=meshes[(N,)])


def test_tri_takes_integers_only(meshes):
    # NumPy's tri(3, k=0.5) makes column numbers of arange(-0.5, 2.5) cast to int8;
    # tri, like eye, takes integer sizes and offsets.
    for kw in [{"k": 0.5}, {"N": 2.5}, {"M": 3.0}]:
        with pytest.raises(TypeError):
            mt.tri(**{"N": 3, **kw}, device_mesh=meshes[(N,)])


@pytest.mark.parametrize("call", [
    lambda mesh, pl: mt.arange(4, device_mesh=mesh, placements=pl),
    lambda mesh, pl: mt.linspace(0, 1, 4, device_mesh=mesh, placements=pl),
    lambda mesh, pl: mt.logspace(0, 1, 4, device_mesh=mesh, placements=pl),
    lambda mesh, pl: mt.eye(4, device_mesh=mesh, placements=pl),
    lambda mesh, pl: mt.identity(4, device_mesh=mesh, placements=pl),
    lambda mesh, pl: mt.tri(4, device_mesh=mesh, placements=pl),
    lambda mesh, pl: mt.full((4,), [1, 2, 3, 4], device_mesh=mesh, placements=pl),
    lambda mesh, pl: mt.zeros_like(np.ones(4), device_mesh=mesh, placements=pl),
], ids=["arange", "linspace", "logspace", "eye", "identity", "tri", "full", "zeros_like"])
def test_new_factories_refuse_partial(call, meshes):
    with pytest.raises(ValueError):
        call(meshes[(N,)], [Partial()])


# -- full's NumPy forms, and the NumPy positional dtype of zeros/ones/empty --------

@pytest.mark.parametrize("fill", [[1, 2, 3], [[1.5], [2.5], [3.5], [4.5], [5.5]],
                                  np.arange(15).reshape(5, 3) * 0.25, np.int8(-2)],
                         ids=["row", "column", "whole", "scalar"])
def test_full_takes_an_array_fill_value_like_numpy(fill, meshes):
    ref = np.full((5, 3), fill)
    assert check_parts(lambda mesh, pl: mt.full((5, 3), fill, device_mesh=mesh,
                                                placements=pl), ref, meshes) == []
    ref = np.full((5, 3), fill, np.float32)
    assert check_parts(lambda mesh, pl: mt.full((5, 3), fill, np.float32,
                                                device_mesh=mesh, placements=pl),
                       ref, meshes) == []


def test_full_refuses_a_fill_value_that_does_not_broadcast(meshes):
    with pytest.raises(ValueError):
        np.full((5, 3), [1, 2])
    with pytest.raises(ValueError):
        mt.full((5, 3), [1, 2], device_mesh=meshes[(N,)])


@pytest.mark.parametrize("name", ["zeros", "ones", "empty"])
def test_numpy_positional_dtype(name, meshes):
    mesh = meshes[(N,)]
    f = getattr(mt, name)
    assert f((4, 3), np.int32, device_mesh=mesh).dtype == np.int32
    assert f(4, "f4", device_mesh=mesh).shape == (4,)
    assert f(4, "f4", device_mesh=mesh).dtype == np.float32
    assert f(4, 3, device_mesh=mesh).shape == (4, 3)  # torch's varargs sizes
    with pytest.raises(TypeError):
        f((4, 3), np.int32, dtype=np.int64, device_mesh=mesh)


# -- *_like ---------------------------------------------------------------------------

@pytest.fixture
def sharded(meshes):
    mesh = meshes[(N,)]
    return mt.distribute_tensor(np.arange(15.0).reshape(5, 3), mesh, [Shard(0)])


@pytest.mark.parametrize("name, fill", [("zeros_like", 0), ("ones_like", 1),
                                        ("empty_like", None), ("full_like", 7)])
def test_like_keeps_the_layout_and_gives_numpys_values(name, fill, sharded):
    f = getattr(mt, name)
    dt = f(sharded, fill) if name == "full_like" else f(sharded)
    assert dt.shape == sharded.shape and dt.dtype == sharded.dtype
    assert dt.placements == sharded.placements and dt.device_mesh is sharded.device_mesh
    assert dt.to_local().shape == sharded.to_local().shape and not dt.requires_grad
    if fill is not None:
        assert bits_equal(dt.to_local(), np.full(sharded.to_local().shape, float(fill)))


def test_like_overrides(sharded, meshes):
    dt = mt.zeros_like(sharded, np.int32, placements=[Replicate()])
    assert dt.dtype == np.int32 and dt.placements == (Replicate(),)
    assert dt.to_local().shape == (5, 3)
    dt = mt.ones_like(sharded, shape=(4, 6))
    assert dt.shape == (4, 6) and dt.placements == (Shard(0),)
    assert dt.to_local().shape == ref_box((4, 6), (N,), (RANK,), [Shard(0)])[0]
    dt = mt.ones_like(sharded, shape=(7,))  # another ndim: Replicate
    assert dt.placements == (Replicate(),) and dt.to_local().shape == (7,)
    for f, value in ((np.zeros_like, 0.0), (np.ones_like, 1.0)):  # NumPy's shape= alike
        dt = f(sharded, shape=(4, 6))
        assert dt.shape == (4, 6) and dt.placements == (Shard(0),)
        assert bits_equal(dt.full_tensor(), np.full((4, 6), value))
        dt = f(sharded, shape=7)
        assert dt.placements == (Replicate(),) and bits_equal(dt.to_local(), np.full(7, value))
    assert np.full_like(sharded, 2, shape=(2, 2, 2)).full_tensor().sum() == 16
    if N >= 2:
        mesh2 = meshes[(1, N)]
        dt = mt.zeros_like(sharded, device_mesh=mesh2)  # another mesh: Replicate
        assert dt.device_mesh is mesh2 and dt.placements == (Replicate(), Replicate())
    assert mt.full_like(sharded, 1.5, requires_grad=True).requires_grad


def test_full_like_casts_as_numpy(meshes):
    mesh = meshes[(N,)]
    a = mt.distribute_tensor(np.arange(6).reshape(3, 2), mesh, [Shard(1)])
    dt = mt.full_like(a, 2.7)
    assert dt.dtype == np.int64
    assert bits_equal(dt.to_local(), np.full_like(a.to_local(), 2.7))
    assert mt.full_like(a, 2.7, dtype=np.float32).to_local().dtype == np.float32


def test_like_of_a_partial_is_replicate(meshes):
    mesh = meshes[(N,)]
    p = mt.DTensor.from_local(np.ones(3), mesh, [Partial()])
    for dt in (mt.zeros_like(p), mt.full_like(p, 2), mt.rand_like(p)):
        assert dt.placements == (Replicate(),) and dt.to_local().shape == (3,)


def test_like_of_an_ndarray(meshes):
    mesh = meshes[(N,)]
    dt = mt.zeros_like(np.ones((4, 2), np.float32), device_mesh=mesh,
                       placements=[Shard(1)])
    assert dt.shape == (4, 2) and dt.dtype == np.float32 and dt.placements == (Shard(1),)
    assert dt.to_local().shape == ref_box((4, 2), (N,), (RANK,), [Shard(1)])[0]
    assert mt.ones_like([1, 2, 3], device_mesh=mesh).dtype == np.asarray([1]).dtype


def test_rand_like_is_rand_of_the_same_layout(sharded):
    mt.manual_seed(3)
    a = mt.rand_like(sharded)
    mt.manual_seed(3)
    b = mt.rand(5, 3, device_mesh=sharded.device_mesh, placements=[Shard(0)])
    assert bits_equal(a.to_local(), b.to_local()) and a.placements == b.placements
    mt.manual_seed(3)
    c = mt.randn_like(sharded, np.float32)
    mt.manual_seed(3)
    d = mt.randn(5, 3, dtype=np.float32, device_mesh=sharded.device_mesh,
                 placements=[Shard(0)])
    assert bits_equal(c.to_local(), d.to_local())
    with pytest.raises(TypeError):
        mt.rand_like(mt.zeros_like(sharded, np.int32))
