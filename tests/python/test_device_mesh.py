"""DeviceMesh: structure, this rank's place in it, its communicators, slicing,
the default mesh, identity, repr and the lifetime of the communicators."""

import gc
import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DeviceMesh, init_device_mesh, _comm
from mpi_helpers import Problems

N = MPI.COMM_WORLD.Get_size()
RANK = MPI.COMM_WORLD.Get_rank()


def world_shapes():
    """Mesh shapes over the whole world at this world size."""
    shapes = [(N,), (1, N), (N, 1), (1, N, 1)]
    if N == 4:
        shapes += [(2, 2), (2, 1, 2)]
    return shapes


def expected_line(mesh_array, coord, dim):
    """The ranks of the line along `dim` through `coord`, in coordinate order."""
    index = tuple(slice(None) if d == dim else c for d, c in enumerate(coord))
    return mesh_array[index].tolist()


def check_member(mesh, ranks):
    """Every local fact of a member rank against the rank array `ranks`; returns
    (coordinate, problems)."""
    ranks = np.asarray(ranks)
    coord = [int(c) for c in np.argwhere(ranks == RANK)[0]]
    p = Problems()
    p.expect(mesh.ndim == ranks.ndim, f"ndim {mesh.ndim}")
    p.expect(mesh.shape == ranks.shape, f"shape {mesh.shape}")
    p.expect(mesh.size() == ranks.size, f"size {mesh.size()}")
    p.expect([mesh.size(d) for d in range(mesh.ndim)] == list(ranks.shape), "size(d)")
    p.expect(np.array_equal(mesh.mesh, ranks) and mesh.mesh.shape == ranks.shape,
             f"mesh {mesh.mesh}")
    p.expect(mesh.get_rank() == RANK, f"get_rank {mesh.get_rank()}")
    p.expect(mesh.get_coordinate() == coord, f"coordinate {mesh.get_coordinate()}")
    p.expect([mesh.get_local_rank(d) for d in range(mesh.ndim)] == coord, "local ranks")
    if mesh.ndim == 1:
        p.expect(mesh.get_local_rank() == coord[0], "get_local_rank()")
    groups = mesh.get_all_groups()
    p.expect(len(groups) == mesh.ndim, f"{len(groups)} groups")
    for d, g in enumerate(groups):
        p.expect(isinstance(g, MPI.Intracomm), f"group {d} is {type(g)}")
        p.expect(g == mesh.get_group(d), f"get_all_groups()[{d}] != get_group({d})")
        p.expect(g.Get_size() == ranks.shape[d], f"group {d} size {g.Get_size()}")
        p.expect(g.Get_rank() == coord[d], f"group {d} rank {g.Get_rank()}")
    return coord, p


def check_groups_communicate(mesh, ranks):
    """Collective on the mesh: each dim communicator reduces over its line, and its
    ranks are ordered by their coordinate on that dim. Returns problems."""
    coord = mesh.get_coordinate()
    p = Problems()
    for d in range(mesh.ndim):
        g = mesh.get_group(d)
        line = expected_line(np.asarray(ranks), coord, d)
        total, order = g.allreduce(RANK, op=MPI.SUM), g.allgather(RANK)
        p.expect(total == sum(line), f"dim {d}: allreduce gave {total}, not {sum(line)}")
        p.expect(order == line, f"dim {d}: group ranks {order}, not {line}")
    return p


def test_groups_are_made_once_per_mesh(world_size):
    mesh = init_device_mesh("cpu", (1, world_size), mesh_dim_names=("a", "b"))
    # Meshes of earlier tests left in reference cycles would give their
    # communicators back whenever the collector runs: collect them now, and not
    # while counting.
    gc.collect()
    gc.disable()
    try:
        before = _comm.comm_live_count()
        first = mesh.get_all_groups()
        again = [mesh.get_group(0), mesh.get_group("b")] + mesh.get_all_groups()
        sub = mesh["b"]
        sub_groups = sub.get_all_groups()
        after = _comm.comm_live_count()
    finally:
        gc.enable()
    assert after == before
    assert again[:2] == first == again[2:]
    assert sub_groups == [first[1]]


@pytest.mark.parametrize("shape", world_shapes(), ids=str)
def test_init_device_mesh_structure_and_groups(shape):
    mesh = init_device_mesh("cpu", shape)
    ranks = np.arange(N).reshape(shape)
    coord, problems = check_member(mesh, ranks)
    problems += check_groups_communicate(mesh, ranks)
    assert problems == []
    assert mesh.device_type == "cpu"
    assert mesh.mesh_dim_names is None
    assert coord == list(np.unravel_index(RANK, shape))


def test_one_d_mesh_with_name(world_size, rank):
    mesh = init_device_mesh("cpu", (world_size,), mesh_dim_names=("x",))
    assert mesh.mesh_dim_names == ("x",)
    assert mesh.size("x") == world_size
    assert mesh.get_local_rank() == mesh.get_local_rank("x") == mesh.get_local_rank(0) == rank
    assert mesh.get_group() == mesh.get_group("x") == mesh.get_group(0)
    assert mesh.get_group(-1) == mesh.get_group(0)
    assert mesh.get_coordinate() == [rank]


@pytest.mark.parametrize("shape", [(-1,), (-1, 1), (1, -1), (-1, 2), (2, -1, 1)], ids=str)
def test_minus_one_takes_the_ranks_the_other_sizes_leave(shape):
    """As numpy.reshape's -1: the communicator's ranks divided by the other sizes."""
    rest = -np.prod(shape)
    if N % rest:
        pytest.skip(f"{rest} does not divide {N} ranks (test_bad_input.py checks the error)")
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=tuple("abc"[:len(shape)]))
    expect = tuple(N // rest if s == -1 else s for s in shape)
    assert mesh.shape == expect
    assert np.array_equal(mesh.mesh, np.arange(N).reshape(expect))


def test_int_mesh_shape_and_list_names(world_size):
    mesh = init_device_mesh("cpu", world_size, mesh_dim_names=["only"])
    assert mesh.shape == (world_size,)
    assert mesh.mesh_dim_names == ("only",)


def test_mesh_array_is_read_only(world_size):
    mesh = init_device_mesh("cpu", (world_size,))
    with pytest.raises(ValueError):
        mesh.mesh[0] = 7
    assert mesh.mesh.tolist() == list(range(world_size))


@pytest.mark.parametrize("order", ["reversed", "rolled"])
def test_explicit_permuted_mesh(order, world_size):
    ranks = np.arange(world_size)
    ranks = ranks[::-1] if order == "reversed" else np.roll(ranks, 1)
    mesh = DeviceMesh("cpu", ranks.reshape(1, world_size), mesh_dim_names=("a", "b"))
    _, problems = check_member(mesh, ranks.reshape(1, world_size))
    problems += check_groups_communicate(mesh, ranks.reshape(1, world_size))
    assert problems == []


@pytest.mark.world(4, reason="needs 4 ranks")
def test_explicit_two_by_two_column_major():
    ranks = [[0, 2], [1, 3]]
    mesh = DeviceMesh("cpu", ranks, mesh_dim_names=("dp", "tp"))
    coord, problems = check_member(mesh, ranks)
    problems += check_groups_communicate(mesh, ranks)
    assert problems == []
    assert coord == {0: [0, 0], 1: [1, 0], 2: [0, 1], 3: [1, 1]}[RANK]
    assert mesh["tp"].mesh.tolist() == ranks[coord[0]]
    assert mesh["dp"].mesh.tolist() == [row[coord[1]] for row in ranks]


@pytest.mark.skipif(N < 2, reason="needs a rank outside the mesh")
@pytest.mark.parametrize("members", ["first", "last"])
def test_non_member_rank(members):
    ranks = list(range(N - 1)) if members == "first" else list(range(1, N))
    outsider = N - 1 if members == "first" else 0
    mesh = DeviceMesh("cpu", ranks, mesh_dim_names=("x",))
    total = None if RANK == outsider else mesh.get_group().allreduce(1)
    assert mesh.size() == N - 1 and mesh.shape == (N - 1,)
    assert mesh.get_rank() == RANK
    if RANK == outsider:
        assert mesh.get_coordinate() is None
        assert mesh.get_group() == MPI.COMM_NULL
        assert mesh.get_all_groups() == [MPI.COMM_NULL]
        with pytest.raises(RuntimeError):
            mesh.get_local_rank()
    else:
        assert mesh.get_coordinate() == [ranks.index(RANK)]
        assert total == N - 1


@pytest.mark.skipif(N < 2, reason="needs a rank outside the mesh")
def test_non_member_of_a_two_d_mesh():
    mesh = init_device_mesh("cpu", (1, N - 1), mesh_dim_names=("a", "b"))
    total = None if RANK == N - 1 else mesh.get_group("b").allreduce(1)
    if RANK == N - 1:
        assert mesh.get_coordinate() is None
        assert mesh.get_all_groups() == [MPI.COMM_NULL, MPI.COMM_NULL]
    else:
        assert mesh.get_coordinate() == [0, RANK]
        assert total == N - 1


def test_mesh_on_a_user_communicator(world_size, rank):
    sub = MPI.COMM_WORLD.Split(rank % 2, rank)
    mesh = init_device_mesh("cpu", (sub.Get_size(),), comm=sub)
    facts = (mesh.get_rank(), mesh.get_coordinate(), sub.Get_rank())
    total = mesh.get_group().allreduce(rank)
    expected = sum(r for r in range(world_size) if r % 2 == rank % 2)
    del mesh
    gc.collect()
    sub.Free()
    assert facts[0] == facts[2] and facts[1] == [facts[2]]
    assert total == expected


def test_mesh_on_comm_self(rank):
    mesh = init_device_mesh("cpu", (1,), comm=MPI.COMM_SELF)
    assert mesh.get_rank() == 0
    assert mesh.get_coordinate() == [0]
    assert mesh.get_group().Get_size() == 1
    assert mesh.get_group().allreduce(rank) == rank


# -- slicing ---------------------------------------------------------------------

def check_slice(mesh, names):
    """mesh[names] holds this rank, keeps the named dims in order, reuses the
    parent's communicators and creates none."""
    gc.collect()
    before = _comm.comm_live_count()
    sub = mesh[names if len(names) > 1 else names[0]]
    created = _comm.comm_live_count() - before
    dims = [mesh.mesh_dim_names.index(n) for n in names]
    coord = mesh.get_coordinate()
    index = tuple(slice(None) if d in dims else coord[d] for d in range(mesh.ndim))
    p = Problems()
    p.expect(created == 0, f"{names}: {created} communicators created")
    p.expect(sub.mesh_dim_names == tuple(names), f"names {sub.mesh_dim_names}")
    p.expect(np.array_equal(sub.mesh, mesh.mesh[index]), f"{names}: mesh {sub.mesh}")
    p.expect(sub.get_coordinate() == [coord[d] for d in dims], f"{names}: coordinate")
    p.expect(sub.get_rank() == mesh.get_rank(), "get_rank")
    for i, d in enumerate(dims):
        p.expect(sub.get_group(i) == mesh.get_group(d), f"{names}: group {i} not reused")
        p.expect(sub.get_group(names[i]) == mesh.get_group(names[i]), "group by name")
        p.expect(sub.size(i) == mesh.size(d), f"size({i})")
    return sub, p


@pytest.mark.parametrize("shape", [s for s in world_shapes() if len(s) > 1], ids=str)
def test_slice_by_one_name(shape):
    names = ("a", "b", "c")[:len(shape)]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    problems = Problems()
    for name in names:
        sub, p = check_slice(mesh, [name])
        problems += p + check_groups_communicate(sub, sub.mesh)
        problems.expect(sub.ndim == 1, f"{name}: ndim {sub.ndim}")
    assert problems == []


@pytest.mark.parametrize("shape", [s for s in world_shapes() if len(s) == 3], ids=str)
def test_slice_by_several_names(shape):
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("a", "b", "c"))
    problems = Problems()
    for names in (["a", "b"], ["a", "c"], ["b", "c"]):
        sub, p = check_slice(mesh, names)
        problems += p + check_groups_communicate(sub, sub.mesh)
        problems.expect(sub.ndim == 2, f"{names}: ndim {sub.ndim}")
        # A slice of a slice still reuses the root's communicators.
        problems += check_slice(sub, [names[1]])[1]
    assert problems == []
    assert mesh["a", "b", "c"] is mesh


@pytest.mark.world(4, reason="needs 4 ranks")
def test_slice_two_by_two_rows_and_columns():
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp, dp = mesh["tp"], mesh["dp"]
    tp_total, dp_total = tp.get_group().allreduce(RANK), dp.get_group().allreduce(RANK)
    assert tp.mesh.tolist() == [[0, 1], [2, 3]][RANK // 2]
    assert dp.mesh.tolist() == [[0, 2], [1, 3]][RANK % 2]
    assert tp.get_local_rank() == RANK % 2 and dp.get_local_rank() == RANK // 2
    assert tp_total == sum([[0, 1], [2, 3]][RANK // 2])
    assert dp_total == sum([[0, 2], [1, 3]][RANK % 2])


def test_slice_keeps_parent_communicators_alive(world_size):
    gc.collect()
    before = _comm.comm_live_count()
    mesh = init_device_mesh("cpu", (1, world_size), mesh_dim_names=("a", "b"))
    with_mesh = _comm.comm_live_count()
    sub = mesh["b"]
    del mesh
    gc.collect()
    kept = _comm.comm_live_count()
    total = sub.get_group().allreduce(1)
    del sub
    gc.collect()
    after = _comm.comm_live_count()
    assert with_mesh > before
    assert kept == with_mesh
    assert total == world_size
    assert after == before


# -- the default mesh ------------------------------------------------------------

def test_with_mesh_is_the_default(world_size):
    outer = init_device_mesh("cpu", (world_size,))
    inner = init_device_mesh("cpu", (1, world_size))
    local = np.ones((2, 3))
    with outer as entered:
        assert entered is outer
        assert mt.DTensor.from_local(local).device_mesh is outer
        assert mt.zeros(4).device_mesh is outer
        with inner:
            assert mt.DTensor.from_local(local).device_mesh is inner
            assert mt.ones(4, 2).device_mesh is inner
            assert mt.rand(3).device_mesh is inner
        assert mt.full((2,), 1.5).device_mesh is outer
        assert mt.randn(2).device_mesh is outer
        assert mt.empty(2).device_mesh is outer
    with pytest.raises(RuntimeError):
        mt.DTensor.from_local(local)
    with pytest.raises(RuntimeError):
        mt.zeros(4)


def test_with_mesh_unwinds_on_exceptions(world_size):
    mesh = init_device_mesh("cpu", (world_size,))
    with pytest.raises(ZeroDivisionError):
        with mesh:
            1 / 0
    with pytest.raises(RuntimeError):
        mt.ones(2)


def test_no_default_mesh_error_mentions_device_mesh():
    with pytest.raises(RuntimeError, match="device mesh"):
        mt.empty(3)


# -- identity and repr -------------------------------------------------------------

def test_equality_and_hash(world_size):
    a = init_device_mesh("cpu", (world_size,), mesh_dim_names=("x",))
    b = init_device_mesh("cpu", (world_size,), mesh_dim_names=("x",))
    c = init_device_mesh("cpu", (world_size,), mesh_dim_names=("y",))
    d = init_device_mesh("cpu", (world_size,))
    e = init_device_mesh("cpu", (1, world_size), mesh_dim_names=("x", "y"))
    f = DeviceMesh("cpu", np.arange(world_size)[::-1], mesh_dim_names=("x",))
    assert a is not b and a == b and hash(a) == hash(b)
    assert len({a, b}) == 1 and {a: 1}[b] == 1
    for other in (c, d, e):
        assert a != other
    assert (a == f) == (world_size == 1)
    assert a != "cpu" and a != a.mesh.tolist()
    assert e["y"] == e["y"] and hash(e["y"]) == hash(e["y"])


def test_meshes_on_different_communicators_differ():
    world = DeviceMesh("cpu", [0])
    own = DeviceMesh("cpu", [0], comm=MPI.COMM_SELF)
    again = DeviceMesh("cpu", [0])
    assert world != own
    assert world == again


@pytest.mark.timeout(60)
def test_repr_does_not_communicate(comm, rank, world_size):
    """repr on one rank only: if it communicated, that rank would wait for the
    others, which wait in the allgather below, and the test would hang."""
    mesh = init_device_mesh("cpu", (1, world_size), mesh_dim_names=("dp", "tp"))
    sub = mesh["tp"]
    texts = (repr(mesh), repr(sub), str(mesh)) if rank == world_size - 1 else None
    texts = comm.allgather(texts)[-1]
    assert texts[0].startswith("DeviceMesh(")
    assert "cpu" in texts[0] and "dp" in texts[0] and "tp" in texts[0]
    assert str(list(range(world_size))) in texts[0]
    assert "tp" in texts[1]


# -- communicator lifetime -----------------------------------------------------------

@pytest.mark.parametrize("shape", world_shapes(), ids=str)
def test_communicators_freed_with_the_mesh(shape):
    gc.collect()
    before = _comm.comm_live_count()
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=tuple("abc"[:len(shape)]))
    groups = mesh.get_all_groups()  # materialise the mpi4py wrappers too
    sub = mesh["a"]
    during = _comm.comm_live_count()
    del mesh, groups, sub
    gc.collect()
    after = _comm.comm_live_count()
    assert during > before
    assert after == before


@pytest.mark.skipif(N < 2, reason="needs a rank outside the mesh")
def test_non_member_communicators_freed():
    gc.collect()
    before = _comm.comm_live_count()
    mesh = DeviceMesh("cpu", list(range(1, N)))
    during = _comm.comm_live_count()
    del mesh
    gc.collect()
    after = _comm.comm_live_count()
    assert during >= before and after == before


def test_two_hundred_meshes_leave_the_count_flat(world_size):
    gc.collect()
    before = _comm.comm_live_count()
    peak = before
    for i in range(200):
        if i % 2:
            mesh = init_device_mesh("cpu", (world_size,))
        else:
            mesh = init_device_mesh("cpu", (1, world_size), mesh_dim_names=("a", "b"))
            mesh["b"].get_group()
        peak = max(peak, _comm.comm_live_count())
        del mesh
    gc.collect()
    after = _comm.comm_live_count()
    assert after == before
    # Dropped meshes give their communicators back at once, not at some later
    # garbage collection: at most one mesh's worth (3 for a 2-D mesh) is alive.
    assert peak - before <= 3


EXIT_SCRIPT = """
import gc
import mpitensor as mt
from mpi4py import MPI
mesh = mt.init_device_mesh("cpu", (1, 1), mesh_dim_names=("a", "b"))
sub = mesh["b"]
groups = sub.get_all_groups() + mesh.get_all_groups()
dt = mt.zeros(3, device_mesh=mesh)
kept = mt.init_device_mesh("cpu", (1,), comm=MPI.COMM_SELF)  # left for exit
cycle = [mt.init_device_mesh("cpu", (1,))]
cycle.append(cycle)  # left for the interpreter's last collection
alive = mt._comm.comm_live_count()
MPI.Finalize()
del mesh, sub, groups, dt
gc.collect()
print(alive, mt._comm.comm_live_count(), flush=True)
"""


def test_meshes_dropped_after_mpi_finalize_are_freed_safely():
    """Meshes that die after MPI_Finalize (explicitly, or at interpreter exit)
    must not call MPI to free their communicators: no error, no abort."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "PMI_"))}
    out = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True,
                         text=True, env=env, timeout=90)
    assert out.returncode == 0, out.stderr
    alive, after = map(int, out.stdout.split())
    # The communicators died with MPI; none was freed (or counted) afterwards.
    assert alive > 0 and after == alive
    assert "MPI_" not in out.stderr and "rror" not in out.stderr, out.stderr
