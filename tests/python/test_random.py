"""rand/randn and manual_seed: the global tensor is bit-identical for every mesh
shape, placement and number of ranks (compared with a one-rank mesh over
MPI.COMM_SELF computed locally), streams advance per call, manual_seed restarts
them, and the values look like the distributions they claim."""

import itertools

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DeviceMesh, Replicate, Shard, init_device_mesh
from mpi_helpers import bits_equal, gather_global

N = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()
DTYPES = [np.float16, np.float32, np.float64, np.complex64, np.complex128]
DISTS = ["rand", "randn"]


@pytest.fixture(scope="module")
def solo():
    """A one-rank mesh of this process alone: the reference, computed locally."""
    return init_device_mesh("cpu", (1,), comm=MPI.COMM_SELF)


@pytest.fixture(scope="module")
def meshes():
    """Meshes of every shape this world size allows, including one that leaves a
    rank out and one with the ranks in reverse order."""
    out = [init_device_mesh("cpu", s) for s in [(N,), (1, N), (N, 1)]]
    if N == 4:
        out += [init_device_mesh("cpu", (2, 2)), DeviceMesh("cpu", [[3, 1], [2, 0]])]
    if N >= 2:
        out.append(DeviceMesh("cpu", list(range(N - 1))[::-1]))
    out.append(DeviceMesh("cpu", np.arange(N)[::-1]))
    return out


def draw(dist, shape, dtype, mesh, placements=None, seed=1234, skip=0):
    """manual_seed(seed), `skip` throwaway draws, then the tensor asked for."""
    mt.manual_seed(seed)
    f = getattr(mt, dist)
    for _ in range(skip):
        f(2, device_mesh=mesh)
    return f(*shape, dtype=dtype, device_mesh=mesh, placements=placements)


def reference(dist, shape, dtype, solo, seed=1234, skip=0):
    return draw(dist, shape, dtype, solo, seed=seed, skip=skip).to_local()


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dist", DISTS)
def test_bit_identical_on_every_mesh_and_placement(dist, dtype, meshes, solo):
    problems = []
    for shape in [(7, 5), (3, 1, 4), (2 * N + 1,)]:
        ref = reference(dist, shape, dtype, solo)
        ndim = len(shape)
        for mesh in meshes:
            choices = [Replicate()] + [Shard(d) for d in range(ndim)] + [Shard(-1)]
            for pl in itertools.product(choices, repeat=mesh.ndim):
                dt = draw(dist, shape, dtype, mesh, pl)
                got, bad = gather_global(dt)
                problems += [f"{mesh} {pl}: {b}" for b in bad]
                if not bits_equal(got, ref):
                    problems.append(f"{mesh!r} {pl} {shape}: differs from the 1-rank tensor")
    assert problems == []


@pytest.mark.parametrize("dist", DISTS)
def test_later_streams_are_identical_too(dist, meshes, solo):
    """The third draw after a seed matches on every mesh, so streams advance in step
    (members and non-members alike)."""
    ref = reference(dist, (6, 4), np.float64, solo, seed=99, skip=2)
    problems = []
    for mesh in meshes:
        dt = draw(dist, (6, 4), np.float64, mesh, [Shard(1)] + [Shard(0)] * (mesh.ndim - 1),
                  seed=99, skip=2)
        got, bad = gather_global(dt)
        problems += bad
        if not bits_equal(got, ref):
            problems.append(f"{mesh!r}: third draw differs")
    assert problems == []


@pytest.mark.skipif(N < 2, reason="needs a rank outside the mesh")
def test_non_members_advance_the_stream(meshes, comm):
    small = DeviceMesh("cpu", list(range(1, N)))
    world = meshes[0]
    mt.manual_seed(5)
    mt.rand(3, device_mesh=small)  # rank 0 is not in it, but must advance too
    dt = mt.rand(4, device_mesh=world)  # replicated: equal everywhere
    values = comm.allgather(dt.to_local().tobytes())
    assert all(v == values[0] for v in values)


def test_zero_dim_and_empty_tensors(solo, meshes):
    for dist in DISTS:
        ref = reference(dist, (), np.float64, solo)
        got, problems = gather_global(draw(dist, (), np.float64, meshes[0]))
        assert ref.shape == ()
        assert problems == [] and bits_equal(got, ref)
        if dist == "rand":
            assert 0.0 <= float(ref) < 1.0
        # A 0-d tensor is drawn too, not left uninitialised: seeds change it.
        values = {float(reference(dist, (), np.float64, solo, seed=s)) for s in range(8)}
        assert len(values) == 8
        empty = draw(dist, (0, 3), np.float64, meshes[0], [Shard(0)])
        assert empty.to_local().shape == (0, 3)


def test_successive_draws_differ_and_manual_seed_restarts(solo):
    mt.manual_seed(7)
    a, b = mt.rand(64, device_mesh=solo).to_local(), mt.rand(64, device_mesh=solo).to_local()
    mt.manual_seed(7)
    a2, b2 = mt.rand(64, device_mesh=solo).to_local(), mt.rand(64, device_mesh=solo).to_local()
    mt.manual_seed(8)
    c = mt.rand(64, device_mesh=solo).to_local()
    assert not np.array_equal(a, b)
    assert bits_equal(a, a2) and bits_equal(b, b2)
    assert not np.array_equal(a, c)
    assert abs(np.corrcoef(a, b)[0, 1]) < 0.5


def test_seed_is_not_a_function_of_the_rank(comm, meshes):
    mt.manual_seed(11)
    dt = mt.randn(8, device_mesh=meshes[0])  # Replicate
    values = comm.allgather(dt.to_local().tobytes())
    assert all(v == values[0] for v in values)


def test_seed_bounds_and_integer_types(solo):
    for seed in [0, 1, 2**64 - 1, np.uint64(2**64 - 1), np.int32(3)]:
        mt.manual_seed(seed)
        assert mt.random.initial_seed() == int(seed)
        x = mt.rand(4, device_mesh=solo).to_local()
        assert np.all((0 <= x) & (x < 1))
    mt.manual_seed(2**64 - 1)
    top = mt.rand(8, device_mesh=solo).to_local()
    mt.manual_seed(0)
    assert not np.array_equal(top, mt.rand(8, device_mesh=solo).to_local())


def test_rejected_calls_do_not_advance_the_stream(solo):
    ref = reference("rand", (5,), np.float64, solo, seed=3)
    mt.manual_seed(3)
    with pytest.raises(TypeError):
        mt.rand(5, dtype=np.int32, device_mesh=solo)
    with pytest.raises(ValueError):
        mt.rand(-5, device_mesh=solo)
    assert bits_equal(mt.rand(5, device_mesh=solo).to_local(), ref)


@pytest.mark.parametrize("dtype", [np.bool_, np.int8, np.int32, np.int64, np.uint8,
                                   np.uint64, np.longdouble, np.clongdouble],
                         ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("dist", DISTS)
def test_rejects_non_floating_dtypes(dist, dtype, meshes):
    with pytest.raises(TypeError):
        getattr(mt, dist)(3, dtype=dtype, device_mesh=meshes[0])


# -- statistics: a sanity check of the distributions, with a fixed seed ---------------

@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64],
                         ids=lambda d: np.dtype(d).name)
def test_rand_is_uniform_on_zero_one(dtype, solo):
    x = reference("rand", (200_000,), dtype, solo, seed=2024).astype(np.float64)
    assert x.min() >= 0.0 and x.max() < 1.0
    assert abs(x.mean() - 0.5) < 0.01
    assert abs(x.var() - 1 / 12) < 0.005
    hist, _ = np.histogram(x, bins=10, range=(0, 1))
    assert np.all(np.abs(hist / len(x) - 0.1) < 0.01)
    assert len(np.unique(x)) > (100 if dtype == np.float16 else 100_000)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64],
                         ids=lambda d: np.dtype(d).name)
def test_randn_is_standard_normal(dtype, solo):
    x = reference("randn", (200_000,), dtype, solo, seed=2025).astype(np.float64)
    assert np.all(np.isfinite(x))
    assert abs(x.mean()) < 0.02
    assert abs(x.std() - 1) < 0.02
    assert abs(np.mean(np.abs(x) < 1) - 0.6827) < 0.01
    assert abs(np.mean(x > 0) - 0.5) < 0.01
    assert abs(np.mean(x ** 4) - 3) < 0.1  # normal kurtosis


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128],
                         ids=lambda d: np.dtype(d).name)
def test_complex_rand_and_randn(dtype, solo):
    u = reference("rand", (100_000,), dtype, solo, seed=31)
    assert u.dtype == dtype
    for part in (u.real, u.imag):
        assert part.min() >= 0 and part.max() < 1 and abs(part.mean() - 0.5) < 0.01
    assert abs(np.corrcoef(u.real, u.imag)[0, 1]) < 0.02
    z = reference("randn", (100_000,), dtype, solo, seed=32)
    assert abs(np.mean(np.abs(z) ** 2) - 1) < 0.02  # unit variance, like torch
    assert abs(z.real.var() - 0.5) < 0.02 and abs(z.imag.var() - 0.5) < 0.02
    assert abs(np.corrcoef(z.real, z.imag)[0, 1]) < 0.02


def test_float32_and_float64_draws_are_different_precisions(solo):
    x32 = reference("rand", (1000,), np.float32, solo)
    x64 = reference("rand", (1000,), np.float64, solo)
    assert x32.dtype == np.float32 and x64.dtype == np.float64
    # float32 values are multiples of 2**-24; float64 ones use finer bits.
    assert np.all((x32.astype(np.float64) * 2**24) % 1 == 0)
    assert np.any((x64 * 2**24) % 1 != 0)
