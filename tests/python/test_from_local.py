"""DTensor.from_local and the DTensor's local metadata: global shape inference,
shape/stride for uneven shards, run_check (verdicts on every rank, Replicate dims
broadcast from the first rank), non-member ranks, and the properties, repr,
chunk list and __array__ of the result."""

import itertools
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import (DTensor, DeviceMesh, Partial, Replicate, Shard, distribute_tensor,
                       init_device_mesh)
from mpitensor.debug import CommDebugMode
from mpi_helpers import Problems, all_ranks, gather_global, raised, ref_box, ref_index

N = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()


def mesh_shapes():
    return [(N,), (1, N), (N, 1)] + ([(2, 2)] if N == 4 else [])


@pytest.fixture(scope="module")
def meshes():
    return {s: init_device_mesh("cpu", s) for s in mesh_shapes()}


def sample(shape, dtype=np.float64):
    """A global array whose every element tells where it is."""
    return np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape).astype(dtype)


def shard_of(global_array, mesh, placements):
    return global_array[ref_index(global_array.shape, mesh.shape, mesh.get_coordinate(),
                                  placements)]


def even_placements(mesh_ndim):
    return list(itertools.product([Replicate(), Shard(0), Shard(1), Shard(-1)],
                                  repeat=mesh_ndim))


# -- construction ----------------------------------------------------------------------

def test_default_placements_are_replicate(meshes):
    for mesh in meshes.values():
        local = np.ones((2, 3))
        dt = DTensor.from_local(local, mesh)
        assert dt.placements == (Replicate(),) * mesh.ndim
        assert dt.shape == (2, 3)


def test_negative_shard_dims_are_normalised(meshes):
    mesh = meshes[(N,)]
    local = np.zeros((2, 3, 4))
    assert DTensor.from_local(local, mesh, [Shard(-1)]).placements == (Shard(2),)
    assert DTensor.from_local(local, mesh, [Shard(-3)]).placements == (Shard(0),)
    dt = DTensor.from_local(local, mesh, (Shard(-2),))
    assert dt.placements == (Shard(1),) and dt.shape == (2, 3 * N, 4)


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_global_shape_by_even_sharding(mesh_shape, meshes):
    mesh = meshes[mesh_shape]
    local_shape = (2, 3)
    for pl in even_placements(len(mesh_shape)):
        expect = list(local_shape)
        for m, p in enumerate(pl):
            if isinstance(p, Shard):
                expect[p.dim % 2] *= mesh_shape[m]
        dt = DTensor.from_local(np.zeros(local_shape), mesh, pl)
        assert dt.shape == tuple(expect)
        assert dt.stride() == (expect[1], 1)


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_even_shards_rebuild_the_global_array(mesh_shape, meshes):
    mesh = meshes[mesh_shape]
    problems = []
    for pl in even_placements(len(mesh_shape)):
        gshape = [4, 6]
        for m, p in enumerate(pl):
            if isinstance(p, Shard):
                gshape[p.dim % 2] *= mesh_shape[m]
        full = sample(tuple(gshape))
        local = shard_of(full, mesh, pl)
        dt = DTensor.from_local(local, mesh, pl, run_check=True)
        got, bad = gather_global(dt)
        problems += bad
        if not np.array_equal(got, full):
            problems.append(f"{pl}: wrong global array")
    assert problems == []


def test_nested_shards_of_one_dim(meshes):
    problems = Problems()
    for mesh_shape, mesh in meshes.items():
        if len(mesh_shape) != 2:
            continue
        dt = DTensor.from_local(np.zeros((2, 3)), mesh, [Shard(0), Shard(0)])
        problems.expect(dt.shape == (2 * mesh_shape[0] * mesh_shape[1], 3), f"{dt.shape}")
        full = sample((2 * mesh_shape[0] * mesh_shape[1], 3))
        local = shard_of(full, mesh, dt.placements)
        got, bad = gather_global(DTensor.from_local(local, mesh, [Shard(0), Shard(0)]))
        problems += bad
        problems.expect(np.array_equal(got, full), f"{mesh_shape}: wrong global array")
    assert problems == []


@pytest.mark.world(4, reason="needs 4 ranks")
def test_nested_shards_on_two_by_two_in_rank_order(meshes):
    mesh = meshes[(2, 2)]
    local = np.full((2, 3), float(RANK))
    dt = DTensor.from_local(local, mesh, [Shard(0), Shard(0)])
    got, problems = gather_global(dt)
    assert problems == []
    assert dt.shape == (8, 3)
    assert got[:, 0].tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_uneven_shards_with_shape_and_stride(mesh_shape, meshes):
    mesh = meshes[mesh_shape]
    problems = []
    for gshape in [(5, 3), (1, 7), (0, 2), (2 * N + 1, N + 1)]:
        for pl in even_placements(len(mesh_shape)):
            full = sample(gshape, np.float32)
            local = shard_of(full, mesh, pl)
            stride = (gshape[1], 1)
            dt = DTensor.from_local(local, mesh, pl, shape=gshape, stride=stride,
                                    run_check=True)
            if dt.shape != gshape or dt.stride() != stride or dt.dtype != np.float32:
                problems.append(f"{pl} {gshape}: metadata {dt.shape} {dt.stride()}")
            got, bad = gather_global(dt)
            problems += bad
            if not np.array_equal(got, full):
                problems.append(f"{pl} {gshape}: wrong global array")
    assert problems == []


def test_shape_and_stride_are_taken_as_given(meshes):
    mesh = meshes[(N,)]
    local = np.zeros(ref_box((5, 3), (N,), mesh.get_coordinate(), [Shard(1)])[0])
    dt = DTensor.from_local(local, mesh, [Shard(1)], shape=[5, 3], stride=[1, 5])
    assert dt.shape == (5, 3) and dt.stride() == (1, 5)
    assert isinstance(dt.shape, tuple) and isinstance(dt.stride(), tuple)


def test_partial_keeps_the_local_shape(meshes):
    mesh = meshes[(N,)]
    local = np.full((3, 2), float(RANK))
    dt = DTensor.from_local(local, mesh, [Partial("max")], run_check=True)
    assert dt.shape == (3, 2) and dt.placements == (Partial("max"),)
    assert np.all(dt.to_local() == RANK)  # nothing is broadcast for Partial


def test_mixed_partial_reduce_types_are_refused_as_torch(meshes):
    """Sum then max differs from max then sum: torch refuses the mix (sum with avg
    commutes and passes); every rank raises, before any communication."""
    mesh = meshes[(1, N)]
    local = np.full((2,), 1.0 + RANK)
    for pl in ([Partial("sum"), Partial("max")], [Partial("min"), Partial("avg")]):
        with pytest.raises(ValueError, match="Mixed Partial reduce types"):
            DTensor.from_local(local, mesh, pl)
        with pytest.raises(ValueError, match="Mixed Partial reduce types"):
            distribute_tensor(local, mesh, pl)
    ok = DTensor.from_local(local, mesh, [Partial("sum"), Partial("avg")])
    assert ok.placements == (Partial("sum"), Partial("avg"))
    with pytest.raises(ValueError, match="Mixed Partial reduce types"):
        ok.redistribute(mesh, [Partial("sum"), Partial("max")])


# -- run_check -----------------------------------------------------------------------------

@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_run_check_broadcasts_replicate_dims_from_the_first_rank(mesh_shape, meshes):
    mesh = meshes[mesh_shape]
    coord = mesh.get_coordinate()
    problems = []
    for pl in itertools.product([Replicate(), Shard(0), Partial()], repeat=len(mesh_shape)):
        user = np.full((2, 3), float(RANK))
        user.setflags(write=False)
        dt = DTensor.from_local(user, mesh, pl, run_check=True)
        # The source: this rank's coordinate with every Replicate dim at 0.
        src = tuple(0 if isinstance(p, Replicate) else c for p, c in zip(pl, coord))
        expect = float(mesh.mesh[src])
        if not np.all(dt.to_local() == expect) or dt.to_local().shape != (2, 3):
            problems.append(f"{pl}: rank {RANK} holds {dt.to_local()[0, 0]}, not {expect}")
        if not np.all(user == RANK):
            problems.append(f"{pl}: the user's array was modified")
    assert problems == []


def test_run_check_does_not_modify_a_writable_input(meshes):
    mesh = meshes[(N,)]
    user = np.full((4,), float(RANK))
    view = user[::2]  # non-contiguous
    dt = DTensor.from_local(view, mesh, [Replicate()], run_check=True)
    assert np.all(user == RANK)
    assert np.all(dt.to_local() == 0.0) and dt.to_local().shape == (2,)


def test_run_check_accepts_matching_shards(meshes):
    dtypes = [DTensor.from_local(np.zeros((2, 2), np.int32), mesh,
                                 [Shard(0)] + [Replicate()] * (mesh.ndim - 1),
                                 run_check=True).dtype for mesh in meshes.values()]
    assert dtypes == [np.int32] * len(meshes)


def rank_odd(default, odd, odd_rank):
    return odd if RANK == odd_rank else default


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
@pytest.mark.parametrize("odd_rank", [0, N - 1])
def test_run_check_different_local_shapes_fail_everywhere(odd_rank, meshes):
    mesh = meshes[(N,)]
    local = np.zeros(rank_odd((2, 3), (3, 3), odd_rank))
    with pytest.raises(ValueError, match="do not fit one global tensor"):
        DTensor.from_local(local, mesh, [Shard(0)], run_check=True)


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
@pytest.mark.parametrize("odd_rank", [0, N - 1])
@pytest.mark.parametrize("odd_dtype", [np.float32, np.int64, np.complex128])
def test_run_check_different_dtypes_fail_everywhere(odd_rank, odd_dtype, meshes):
    mesh = meshes[(N,)]
    local = np.zeros((2, 3), rank_odd(np.float64, odd_dtype, odd_rank))
    with pytest.raises(ValueError, match="do not fit one global tensor"):
        DTensor.from_local(local, mesh, [Shard(0)], run_check=True)


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
def test_run_check_different_ndims_fail_everywhere(meshes):
    mesh = meshes[(N,)]
    local = np.zeros((6,) if RANK == N - 1 else (2, 3))
    with pytest.raises(ValueError, match="do not fit one global tensor"):
        DTensor.from_local(local, mesh, [Replicate()], run_check=True)


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
def test_run_check_local_shape_that_is_not_its_shard_fails_everywhere(meshes):
    mesh = meshes[(N,)]
    # (5, 3) over N ranks: give the last rank one row too many.
    shape, _ = ref_box((5, 3), (N,), mesh.get_coordinate(), [Shard(0)])
    local = np.zeros((shape[0] + (RANK == N - 1), 3))
    with pytest.raises(ValueError, match="do not fit one global tensor"):
        DTensor.from_local(local, mesh, [Shard(0)], run_check=True, shape=(5, 3),
                           stride=(3, 1))


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
def test_run_check_different_global_shapes_fail_everywhere(meshes):
    mesh = meshes[(N,)]
    gshape = (N, 3) if RANK else (N, 4)
    local = np.zeros(ref_box(gshape, (N,), mesh.get_coordinate(), [Shard(0)])[0])
    with pytest.raises(ValueError, match="do not fit one global tensor"):
        DTensor.from_local(local, mesh, [Shard(0)], run_check=True, shape=gshape,
                           stride=(gshape[1], 1))


@pytest.mark.skipif(N < 2, reason="needs two ranks to disagree")
def test_ranks_stay_in_step_after_a_failed_run_check(meshes, comm):
    mesh = meshes[(N,)]
    failed = raised(lambda: DTensor.from_local(np.zeros((RANK + 1,)), mesh, [Shard(0)],
                                               run_check=True), ValueError)
    dt = DTensor.from_local(np.full((2,), float(RANK)), mesh, [Replicate()], run_check=True)
    assert comm.allgather(dt.to_local().tolist()) == [[0.0, 0.0]] * N
    assert failed is True


def test_without_run_check_nothing_is_compared(meshes):
    mesh = meshes[(N,)]
    local = np.zeros((RANK + 1, 2))  # inconsistent, but run_check is off
    dt = DTensor.from_local(local, mesh, [Shard(0)])
    assert dt.shape == ((RANK + 1) * N, 2)
    assert np.shares_memory(dt.to_local(), local)


# -- non-member ranks ---------------------------------------------------------------------

@pytest.mark.skipif(N < 2, reason="needs a rank outside the mesh")
@pytest.mark.parametrize("run_check", [False, True])
def test_non_member_gets_an_empty_local(run_check):
    mesh = DeviceMesh("cpu", list(range(1, N)))
    local = np.full((2, 3), float(RANK), np.float32)
    dt = DTensor.from_local(local, mesh, [Shard(0)], run_check=run_check)
    assert dt.shape == (2 * (N - 1), 3)
    assert dt.dtype == np.float32 and dt.size == 6 * (N - 1)
    if RANK == 0:
        assert dt.to_local().shape == (0,) and dt.to_local().dtype == np.float32
    else:
        assert dt.to_local().shape == (2, 3)
        assert np.all(dt.to_local() == RANK)


# -- properties --------------------------------------------------------------------------------

def test_properties(meshes):
    mesh = meshes[(N,)]
    local = np.ones((2, 3, 4), np.float32)
    dt = DTensor.from_local(local, mesh, [Shard(1)])
    assert dt.to_local() is local
    assert dt.shape == (2, 3 * N, 4)
    assert dt.dtype == np.dtype(np.float32)
    assert dt.ndim == 3
    assert dt.size == 24 * N
    assert dt.nbytes == 24 * N * 4
    assert dt.placements == (Shard(1),) and isinstance(dt.placements, tuple)
    assert dt.device_mesh is mesh
    assert dt.stride() == (3 * N * 4, 4, 1)
    assert len(dt) == 2


def test_stride_of_empty_dims_matches_torch(meshes):
    mesh = meshes[(N,)]
    dt = DTensor.from_local(np.zeros((4, 0, 2)), mesh)
    assert dt.stride() == (2, 2, 1)  # torch.empty(4, 0, 2).stride()
    assert dt.size == 0 and dt.nbytes == 0


def test_zero_dim_dtensor(meshes):
    mesh = meshes[(N,)]
    dt = DTensor.from_local(np.array(3.5), mesh, run_check=True)
    assert dt.shape == () and dt.ndim == 0 and dt.size == 1 and dt.stride() == ()
    assert dt.to_local() == 3.5


@pytest.mark.parametrize("attr, value", [("device_mesh", None), ("placements", ()),
                                         ("shape", (1,)), ("dtype", np.int8)])
def test_metadata_is_read_only(attr, value, meshes):
    dt = DTensor.from_local(np.ones(2), meshes[(N,)])
    with pytest.raises(AttributeError):
        setattr(dt, attr, value)


@pytest.mark.timeout(60)
def test_repr_shows_the_local_array_and_does_not_communicate(meshes, comm):
    mesh = meshes[(N,)]
    dt = DTensor.from_local(np.full((2,), 7.0), mesh, [Shard(0)])
    text = repr(dt) if RANK == N - 1 else None  # one rank only: must not wait for others
    text = comm.allgather(text)[-1]
    assert text.startswith("DTensor(local_tensor=")
    assert "array([7., 7.])" in text
    assert "placements=(Shard(dim=0),)" in text


@pytest.mark.parametrize("mesh_shape", mesh_shapes(), ids=str)
def test_chunk_list_matches_layout(mesh_shape, meshes, comm):
    mesh = meshes[mesh_shape]
    for pl in even_placements(len(mesh_shape)):
        full_shape = (5, 3)
        local = np.zeros(ref_box(full_shape, mesh_shape, mesh.get_coordinate(), pl)[0])
        dt = DTensor.from_local(local, mesh, pl, shape=full_shape, stride=(3, 1))
        chunks = dt.__create_chunk_list__()
        sizes, offsets = mt.compute_local_shape_and_global_offset(full_shape, mesh, pl)
        assert len(chunks) == 1
        assert tuple(chunks[0].offsets) == tuple(offsets)
        assert tuple(chunks[0].sizes) == tuple(sizes) == local.shape


def test_numpy_conversion_is_the_warned_gather(meshes):
    """np.asarray / np.array of a DTensor are the whole array on every rank, a new
    ndarray, through the counted and warned gather; strict() refuses them, and
    copy=False is NumPy's ValueError (the array is always new)."""
    dt = DTensor.from_local(np.arange(2.0) + 2 * MPI.COMM_WORLD.Get_rank(), meshes[(N,)],
                           [Shard(0)])
    want = dt.full_tensor()
    for convert in (np.asarray, np.array):
        with warnings.catch_warnings(record=True) as seen, CommDebugMode() as mode:
            warnings.simplefilter("always")
            got = convert(dt)
        assert type(got) is np.ndarray and got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        assert mode.get_total_counts() >= (1 if N > 1 else 0)
        got[0] = -1.0  # a new array: the DTensor keeps its values
        np.testing.assert_array_equal(dt.full_tensor(), want)
    assert np.asarray(dt, dtype=np.float32).dtype == np.float32
    with pytest.raises(ValueError, match="copy"):
        np.asarray(dt, copy=False)
    with mt.strict(), pytest.raises(TypeError, match="full_tensor"):
        np.asarray(dt)


def test_dtypes_are_kept(meshes):
    mesh = meshes[(N,)]
    for dtype in [np.bool_, np.int8, np.uint16, np.int64, np.float16, np.complex128]:
        dt = DTensor.from_local(np.zeros((2,), dtype), mesh, [Shard(0)], run_check=True)
        assert dt.dtype == dtype and dt.to_local().dtype == dtype
        assert dt.nbytes == 2 * N * np.dtype(dtype).itemsize


def test_all_ranks_agree_on_the_spec(meshes, comm):
    mesh = meshes[(N,)]
    dt = DTensor.from_local(np.zeros((3, 2)), mesh, [Shard(1)])
    specs = comm.allgather((dt.shape, dt.placements, str(dt.dtype), dt.stride()))
    assert all_ranks(all(s == specs[0] for s in specs))
