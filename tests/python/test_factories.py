"""Factories zeros, ones, empty, full, rand, randn: size forms, each rank allocating
exactly its own box, dtypes, non-member ranks, and no communication."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DeviceMesh, Partial, Replicate, Shard, init_device_mesh
from mpi_helpers import gather_global, ref_box

N = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()

NUMERIC = [np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
           np.uint32, np.uint64, np.float16, np.float32, np.float64, np.longdouble,
           np.complex64, np.complex128, np.clongdouble]


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
