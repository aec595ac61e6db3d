"""Optional (skipped without torch): DeviceMesh's _flatten, _unflatten, _concatenate
and from_group beside torch 2.13's on gloo: the same ranks, sizes, names and
coordinates, and DTensors on a flattened mesh holding the same shards."""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest
from mpi4py import MPI

torch = pytest.importorskip("torch")

import mpitensor as mt  # noqa: E402
from mpitensor import DeviceMesh, Shard  # noqa: E402
from torch_helpers import init_gloo  # noqa: E402

COMM = MPI.COMM_WORLD
N = COMM.Get_size()
NAMES = ("a", "b", "c")


def shapes():
    out = [(N, 1), (1, N)]
    if N == 4:
        out += [(2, 2), (2, 1, 2)]
    return out


def both(shape):
    from torch.distributed.device_mesh import init_device_mesh

    init_gloo()
    names = NAMES[:len(shape)]
    return (mt.init_device_mesh("cpu", shape, mesh_dim_names=names),
            init_device_mesh("cpu", shape, mesh_dim_names=names))


def same(ours, theirs, what: str) -> list:
    """What differs between a mesh of ours and torch's."""
    facts = [("mesh", ours.mesh.tolist(), theirs.mesh.tolist()),
             ("names", ours.mesh_dim_names, theirs.mesh_dim_names),
             ("shape", tuple(ours.shape), tuple(theirs.shape)),
             ("size", ours.size(), theirs.size()),
             ("coordinate", list(ours.get_coordinate()), list(theirs.get_coordinate())),
             ("group sizes", [g.Get_size() for g in ours.get_all_groups()],
              [g.size() for g in theirs.get_all_groups()]),
             ("local ranks", [ours.get_local_rank(d) for d in range(ours.ndim)],
              [theirs.get_local_rank(d) for d in range(theirs.ndim)])]
    return [f"{what}: {name} {a} != torch's {b}" for name, a, b in facts if a != b]


@pytest.mark.parametrize("shape", shapes(), ids=str)
def test_flatten_as_torch(shape):
    ours, theirs = both(shape)
    names = NAMES[:len(shape)]
    problems = []
    for k in range(2, len(shape) + 1):
        for dims in itertools.combinations(names, k):
            a, b = ours[dims]._flatten(), theirs[dims]._flatten()
            problems += same(a, b, f"{dims} flattened")
            name = "_".join(dims)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                problems += same(ours[name], theirs[name], f"root[{name}]")
                if k < len(shape):
                    rest = [n for n in names if n not in dims]
                    order = (name, rest[0]) if names.index(dims[0]) < names.index(rest[0]) \
                        else (rest[0], name)
                    problems += same(ours[order], theirs[order], f"root[{order}]")
            if ours.get_group(name).Get_size() != theirs.get_group(name).size():
                problems.append(f"get_group({name})")
    assert problems == []


@pytest.mark.parametrize("sizes", [(N, 1), (1, N)] + ([(2, 2), (2, 1, 2)] if N == 4 else []),
                         ids=str)
def test_unflatten_as_torch(sizes):
    ours, theirs = both((N,))
    names = tuple(f"u{k}" for k in range(len(sizes)))
    a, b = ours._unflatten(0, sizes, names), theirs._unflatten(0, sizes, names)
    problems = same(a, b, "unflattened")
    for n in names:
        problems += same(a[n], b[n], f"unflattened[{n}]")
    assert problems == []


def test_unflatten_a_flattened_dim_as_torch():
    if N != 4:
        pytest.skip("a (2, 1, 2) mesh")
    ours, theirs = both((2, 1, 2))
    a = ours["a", "c"]._flatten("ac")._unflatten(0, (2, 2), ("x", "y"))
    b = theirs["a", "c"]._flatten("ac")._unflatten(0, (2, 2), ("x", "y"))
    assert same(a, b, "unflattened") + same(a["y"], b["y"], "[y]") == []


@pytest.mark.parametrize("shape", [(N, 1)] + ([(2, 2), (2, 1, 2)] if N == 4 else []),
                         ids=str)
def test_concatenate_as_torch(shape):
    ours, theirs = both(shape)
    first, last = NAMES[0], NAMES[len(shape) - 1]
    problems = []
    for order in ((first, last), (last, first)):
        a = DeviceMesh._concatenate([ours[n] for n in order])
        b = type(theirs)._concatenate([theirs[n] for n in order])
        problems += same(a, b, f"concatenate {order}")
    assert problems == []


def test_from_group_as_torch():
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh as TorchMesh

    init_gloo()
    a = DeviceMesh.from_group(COMM, "cpu", mesh_dim_names=("w",))
    b = TorchMesh.from_group(dist.group.WORLD, "cpu", mesh_dim_names=("w",))
    problems = same(a, b, "from_group")
    if N == 4:
        ours, theirs = both((2, 2))
        a = DeviceMesh.from_group(ours.get_all_groups(), "cpu", ours.mesh,
                                  mesh_dim_names=("p", "q"))
        b = TorchMesh.from_group(theirs.get_all_groups(), "cpu", theirs.mesh,
                                 mesh_dim_names=("p", "q"))
        problems += same(a, b, "from_group of two")
    assert problems == []


def test_dtensors_on_a_flattened_mesh_as_torch():
    from torch.distributed.tensor import Shard as TS, distribute_tensor as tdist

    shape = (2, 1, 2) if N == 4 else (N, 1)
    ours, theirs = both(shape)
    dims = ("a", "b")
    a, b = ours[dims]._flatten(), theirs[dims]._flatten()
    g = np.arange(30.0).reshape(6, 5)
    x = mt.distribute_tensor(g, a, [Shard(0)])
    t = tdist(torch.from_numpy(g.copy()), b, [TS(0)])
    assert np.array_equal(x.to_local(), t.to_local().numpy())
    x, t = x.redistribute(a, [Shard(1)]), t.redistribute(b, [TS(1)])
    assert np.array_equal(x.to_local(), t.to_local().numpy())
    assert np.array_equal(x.full_tensor(), t.full_tensor().numpy())


def test_torchtitans_meshes_as_torch():
    """torchtitan's parallel dims: dp, dp_shard_cp and dp_cp flattened, then the
    HSDP mesh (dp_replicate, dp_shard_cp) and the TP mesh sliced from the root."""
    from torch.distributed.device_mesh import init_device_mesh

    init_gloo()
    shape = (1, 2, 1, 2) if N == 4 else (1, N, 1, 1)
    names = ("dp_replicate", "dp_shard", "cp", "tp")
    ours = mt.init_device_mesh("cpu", shape, mesh_dim_names=names)
    theirs = init_device_mesh("cpu", shape, mesh_dim_names=names)
    problems = []
    for dims, name in ((("dp_replicate", "dp_shard"), "dp"),
                       (("dp_shard", "cp"), "dp_shard_cp"),
                       (("dp_replicate", "dp_shard", "cp"), "dp_cp")):
        problems += same(ours[dims]._flatten(name), theirs[dims]._flatten(name), name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for key in (("dp_replicate", "dp_shard_cp"), "dp_cp", ("dp_shard_cp", "tp"), "tp"):
            problems += same(ours[key], theirs[key], f"root[{key}]")
    assert problems == []
