"""DeviceMesh's derived meshes, as torch 2.13's: _flatten (registered on the root, so
that root[name] and root.get_group(name) find it), _unflatten, _concatenate and
from_group over mpi4py communicators; the ranks each gives, checked against NumPy's
reshapes of the rank array; errors raised alike on every rank; DTensors on them."""

from __future__ import annotations

import gc
import itertools
import math
import warnings

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import DeviceMesh, Replicate, Shard, _comm, init_device_mesh
from mpi_helpers import Problems, expect_same_error

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()
NAMES = ("a", "b", "c")


def shapes():
    """Meshes of 2 and 3 dims over the world at this size."""
    out = [(N, 1), (1, N), (1, N, 1)]
    if N == 4:
        out += [(2, 2), (2, 1, 2)]
    return out


def flattened_ranks(shape, dims):
    """The ranks of the flattened dims `dims` (ascending) that hold this rank."""
    ranks = np.arange(math.prod(shape)).reshape(shape)
    rest = [d for d in range(len(shape)) if d not in dims]
    table = ranks.transpose(rest + list(dims)).reshape(-1, math.prod(shape[d] for d in dims))
    return table[np.nonzero((table == RANK).any(axis=1))[0][0]].tolist()


def made(call):
    """(what ``call()`` returns, how many communicators it made); meshes of earlier
    tests in reference cycles are collected first, and not while counting."""
    gc.collect()
    gc.disable()
    try:
        before = _comm.comm_live_count()
        out = call()
        return out, _comm.comm_live_count() - before
    finally:
        gc.enable()


def quiet(call):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return call()


@pytest.mark.parametrize("shape", shapes())
def test_flatten_gives_the_ranks_of_the_dims_and_registers_on_the_root(shape):
    names = NAMES[:len(shape)]
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
    p = Problems()
    for k in range(2, len(shape) + 1):
        for dims in itertools.combinations(range(len(shape)), k):
            sub = mesh[tuple(names[d] for d in dims)]
            flat = sub._flatten()
            name = "_".join(names[d] for d in dims)
            want = flattened_ranks(shape, dims)
            p.expect(flat.mesh.tolist() == want, f"{dims}: {flat.mesh.tolist()} != {want}")
            p.expect(flat.mesh_dim_names == (name,), f"{dims}: {flat.mesh_dim_names}")
            p.expect(flat.get_coordinate() == [want.index(RANK)], f"{dims}: coordinate")
            group = flat.get_group()
            p.expect(group.Get_size() == len(want) and group.Get_rank() == want.index(RANK),
                     f"{dims}: group")
            p.expect(flat._get_root_mesh() is mesh, f"{dims}: root")
            p.expect(quiet(lambda: mesh[name]) is flat, f"{dims}: root[{name}]")
            p.expect(mesh.get_group(name).Get_size() == len(want), f"{dims}: get_group")
            p.expect(mesh.get_local_rank(name) == want.index(RANK), f"{dims}: local rank")
            again, count = made(lambda: sub._flatten(name))
            p.expect(again is flat and count == 0,
                     f"{dims}: flattening again made another mesh")
    assert p == []


def test_a_flattened_dim_slices_with_the_roots_other_dims():
    if N != 4:
        pytest.skip("a (2, 1, 2) mesh")
    mesh = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("dp", "cp", "tp"))
    flat = mesh["dp", "tp"]._flatten("dp_tp")
    both = mesh["dp", "cp"]._flatten()
    with pytest.warns(UserWarning, match="flattened dim from root"):
        mixed = mesh["dp_tp", "cp"]
    assert mixed.mesh.tolist() == [[0], [1], [2], [3]]
    assert mixed.mesh_dim_names == ("dp_tp", "cp")
    assert mixed.get_coordinate() == [RANK, 0]
    assert flat.mesh.tolist() == [0, 1, 2, 3]
    with pytest.warns(UserWarning):
        assert mesh["dp_cp", "tp"].mesh.tolist() == [[0, 1], [2, 3]]
    with pytest.raises(RuntimeError, match="overlapping"):
        quiet(lambda: mesh["dp_tp", "tp"])
    assert both.mesh.tolist() == [RANK % 2, RANK % 2 + 2]


def test_flatten_bad_arguments_raise_on_every_rank():
    mesh = init_device_mesh("cpu", (N, 1), mesh_dim_names=("dp", "tp"))
    p = Problems()
    expect_same_error(p, "root name", lambda: mesh._flatten("tp"), ValueError,
                      "already exists")
    mesh["dp", "tp"]._flatten("x")
    if N > 1:
        expect_same_error(p, "name taken by other dims", lambda: mesh["tp"]._flatten("x"),
                          ValueError, "has been created before")
    unnamed = init_device_mesh("cpu", (N, 1))
    expect_same_error(p, "no names", lambda: unnamed._flatten(), RuntimeError,
                      "without mesh_dim_names")
    if N > 1:
        expect_same_error(p, "a rank's other name",
                          lambda: mesh["dp", "tp"]._flatten("y" if RANK else "z"),
                          ValueError, "different arguments")
    expect_same_error(p, "backend_override", lambda: mesh._flatten("w", "gloo"),
                      NotImplementedError, "backend_override")
    assert p == []
    one = mesh["dp"]
    assert one._flatten("dp") is one


@pytest.mark.parametrize("sizes", [(N,), (N, 1), (1, N)] + ([(2, 2)] if N == 4 else []))
def test_unflatten_splits_a_dim_row_major(sizes):
    world = init_device_mesh("cpu", (N,), mesh_dim_names=("world",))
    names = tuple(f"u{k}" for k in range(len(sizes)))
    mesh = world._unflatten(0, sizes, names)
    ranks = np.arange(N).reshape(sizes)
    coord = [int(c) for c in np.argwhere(ranks == RANK)[0]]
    assert mesh.mesh.tolist() == ranks.tolist()
    assert mesh.mesh_dim_names == names and mesh.shape == sizes
    assert mesh.get_coordinate() == coord
    assert mesh._get_root_mesh() is world
    for d in range(len(sizes)):
        line = ranks[tuple(slice(None) if k == d else c for k, c in enumerate(coord))]
        assert mesh[names[d]].mesh.tolist() == line.tolist()
        assert mesh.get_group(d).Get_size() == sizes[d]
    # The dims of a mesh made before are sliced, not made again.
    again, count = made(lambda: world._unflatten("world", sizes, names))
    assert again.mesh.tolist() == ranks.tolist() and count == 0


def test_unflatten_then_flatten_gives_the_dims_back():
    world = init_device_mesh("cpu", (N,), mesh_dim_names=("world",))
    mesh = world._unflatten(0, (1, N, 1), ("a", "b", "c"))
    flat = mesh["a", "b"]._flatten()
    assert flat.mesh.tolist() == list(range(N)) and flat.mesh_dim_names == ("a_b",)
    back = mesh._flatten("all")
    assert back.mesh.tolist() == list(range(N))


def test_unflatten_bad_arguments_raise_on_every_rank():
    world = init_device_mesh("cpu", (N,), mesh_dim_names=("world",))
    p = Problems()
    expect_same_error(p, "product", lambda: world._unflatten(0, (N + 1,), ("x",)),
                      ValueError, "product of mesh_sizes")
    expect_same_error(p, "lengths", lambda: world._unflatten(0, (N,), ("x", "y")),
                      RuntimeError, "same length")
    expect_same_error(p, "dim", lambda: world._unflatten(1, (N,), ("x",)), ValueError,
                      "out of range")
    expect_same_error(p, "name", lambda: world._unflatten("nope", (N,), ("x",)),
                      ValueError, "is not in")
    if N > 1:
        expect_same_error(p, "a rank's other sizes",
                          lambda: world._unflatten(0, (N, 1) if RANK else (1, N),
                                                   ("x", "y")),
                          ValueError, "different arguments")
    assert p == []


def test_concatenate_slices_the_root_when_its_dims_are_in_order():
    shape = (2, 1, 2) if N == 4 else (N, 1, 1)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=NAMES)
    both, count = made(lambda: DeviceMesh._concatenate([mesh["a"], mesh["c"]]))
    assert count == 0
    assert both.mesh.tolist() == mesh["a", "c"].mesh.tolist()
    assert both.mesh_dim_names == ("a", "c")
    turned = DeviceMesh._concatenate([mesh["c"], mesh["a"]])
    assert turned.mesh.tolist() == mesh["a", "c"].mesh.T.tolist()
    assert turned.get_coordinate() == mesh["a", "c"].get_coordinate()[::-1]
    assert turned.get_group("a").Get_size() == shape[0]


def test_concatenate_bad_meshes_raise_on_every_rank():
    mesh = init_device_mesh("cpu", (N, 1), mesh_dim_names=("dp", "tp"))
    other = init_device_mesh("cpu", (1, N), mesh_dim_names=("x", "y"))
    p = Problems()
    if N > 1:
        expect_same_error(p, "overlap", lambda: DeviceMesh._concatenate([mesh["dp"], mesh]),
                          RuntimeError, "overlapping")
    expect_same_error(p, "roots",
                      lambda: DeviceMesh._concatenate([mesh["dp"], other["x"]]),
                      RuntimeError, "different device mesh")
    assert p == []


def test_from_group_of_one_communicator():
    mesh = DeviceMesh.from_group(COMM, "cpu", mesh_dim_names=("world",))
    assert mesh.mesh.tolist() == list(range(N)) and mesh.get_coordinate() == [RANK]
    assert mesh.mesh_dim_names == ("world",)
    half = COMM.Split(RANK % 2, RANK)
    try:
        sub = DeviceMesh.from_group(half, "cpu", list(range(half.Get_size())))
        assert sub.shape == (half.Get_size(),) and sub.get_coordinate() == [half.Get_rank()]
        assert sub.get_group().Get_size() == half.Get_size()
        p = Problems()
        expect_same_error(p, "mesh", lambda: DeviceMesh.from_group(COMM, "cpu", [N]),
                          ValueError, "Invalid mesh")
        assert p == []
    finally:
        half.Free()


def test_from_group_of_one_communicator_per_dim():
    shape = (2, 2) if N == 4 else (N, 1)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "tp"))
    made = DeviceMesh.from_group(mesh.get_all_groups(), "cpu", mesh.mesh,
                                 mesh_dim_names=("dp", "tp"))
    assert made.mesh.tolist() == mesh.mesh.tolist()
    assert made.get_coordinate() == mesh.get_coordinate()
    assert [g.Get_size() for g in made.get_all_groups()] == list(shape)
    p = Problems()
    expect_same_error(p, "no mesh",
                      lambda: DeviceMesh.from_group([COMM, COMM], "cpu",
                                                    mesh_dim_names=("a", "b")),
                      ValueError, "Must pass mesh")
    expect_same_error(p, "no names",
                      lambda: DeviceMesh.from_group([COMM], "cpu", [list(range(N))]),
                      ValueError, "mesh_dim_names")
    expect_same_error(p, "ndim",
                      lambda: DeviceMesh.from_group([COMM], "cpu", mesh.mesh,
                                                    mesh_dim_names=("a",)),
                      ValueError, "ndim equal")
    if N > 1:
        expect_same_error(p, "a mesh the groups do not hold",
                          lambda: DeviceMesh.from_group(mesh.get_all_groups(), "cpu",
                                                        mesh.mesh[::-1],
                                                        mesh_dim_names=("dp", "tp")),
                          ValueError, "holds the world ranks")
    assert p == []


def test_dtensors_on_a_flattened_mesh():
    shape = (2, 1, 2) if N == 4 else (N, 1, 1)
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=("dp", "cp", "tp"))
    flat = mesh["dp", "cp"]._flatten()
    g = np.arange(24.0).reshape(6, 4)
    x = mt.distribute_tensor(g, flat, [Shard(0)])
    n, at = flat.size(), flat.get_local_rank()
    assert np.array_equal(x.to_local(), np.array_split(g, n)[at])
    assert np.array_equal(x.full_tensor(), g)
    y = x.redistribute(flat, [Shard(1)])
    step = -(-g.shape[1] // n)  # torch.chunk's blocks
    assert np.array_equal(y.to_local(), g[:, at * step:(at + 1) * step])
    assert np.array_equal((y * 2).full_tensor(), 2 * g)
    two = quiet(lambda: mesh["dp_cp", "tp"])
    z = mt.distribute_tensor(g, two, [Shard(0), Shard(1)])
    assert np.array_equal(z.full_tensor(), g)
    assert np.array_equal(z.redistribute(two, [Replicate(), Replicate()]).to_local(), g)
