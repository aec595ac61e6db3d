"""How meshes lie on nodes: what a mesh learns of its nodes (ranks per node, the
dims that stay inside a node), ranks_per_node() and the (nodes, local) mesh built
from it, show_config's node lines, and the errors of layouts that such a mesh
cannot use (nodes of unequal or interleaved ranks), raised on every rank.

Every test holds on any layout, checked against mpi4py's own view of the nodes
(mpi_helpers.node_of_each_rank): on one machine all ranks share one node;
tests/multinode/run.sh runs this file on simulated hosts of 2x2, 1x4, 4x1, 3+1 and
2x2 round-robin ranks.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, init_device_mesh
from mpitensor import _show_config
from mpitensor.device_mesh import ranks_per_node
from mpi_helpers import (Problems, gather_global, node_of_each_rank, outcome, raised,
                         ref_ranks_per_node)

COMM = MPI.COMM_WORLD
N, RANK = COMM.Get_size(), COMM.Get_rank()


@pytest.fixture(scope="module")
def nodes():
    """The node of every rank, by rank (0, 1, ... in the order of their first rank)."""
    return node_of_each_rank()


def blocks_of(nodes) -> int | None:
    """The ranks per node when the nodes hold equal, consecutive blocks; else None."""
    k = nodes.count(nodes[0])
    ok = N % k == 0 and all(nodes[i] == i // k for i in range(N))
    return k if ok else None


def shapes():
    out = [(N,), (1, N), (N, 1)]
    if N == 4:
        out += [(2, 2), (2, 1, 2)]
    return out


def groups_inside(nodes, shape, dim) -> bool:
    """Whether every group along `dim` of a mesh of `shape` over ranks 0..N-1 lies on
    one node (the truth, from the node of each rank)."""
    ranks = np.arange(N).reshape(shape)
    lines = np.moveaxis(ranks, dim, -1).reshape(-1, shape[dim])
    return all(len({nodes[r] for r in line}) == 1 for line in lines)


@pytest.mark.parametrize("shape", shapes(), ids=str)
def test_a_mesh_learns_its_nodes(nodes, shape):
    """The C mesh's ranks per node is the one its definition gives for this layout,
    and the dims it takes to stay inside a node are those whose groups do, wherever
    the nodes hold equal consecutive blocks (elsewhere it plans every dim as
    crossing nodes)."""
    mesh = init_device_mesh("cpu", shape)
    layout = mesh._node_layout()
    p = Problems()
    p.expect(layout["ranks_per_node"] == ref_ranks_per_node(nodes),
             f"ranks per node {layout['ranks_per_node']}, nodes {nodes}")
    for d in range(len(shape)):
        truth = groups_inside(nodes, shape, d)
        said = d in layout["inside"]
        p.expect(said != (d in layout["across"]), f"dim {d} in both or neither: {layout}")
        if blocks_of(nodes) is not None:
            p.expect(said == truth, f"dim {d}: inside {said}, its groups: {truth}")
        else:
            p.expect(said == (shape[d] == 1), f"dim {d} of irregular nodes: {layout}")
    assert p == []


def node_kind(nodes) -> tuple[str, int, int, int]:
    """(kind, count, smallest, largest) of the nodes of ranks 0..N-1 in order, as
    the C mesh tells them apart (mt_mesh_nodes_of), from the truth."""
    sizes = [nodes.count(x) for x in sorted(set(nodes))]
    if len(sizes) == 1:
        return "one", 1, N, N
    if any(nodes[i] != nodes[i - 1] and nodes[i] in nodes[:i] for i in range(1, N)):
        return "interleaved", len(sizes), 0, 0
    kind = "blocks" if min(sizes) == max(sizes) else "unequal"
    return kind, len(sizes), min(sizes), max(sizes)


@pytest.mark.parametrize("shape", shapes(), ids=str)
def test_the_mesh_tells_unequal_and_interleaved_nodes_from_one_rank_each(nodes, shape):
    """The mesh learns the node layout with the one gather of node ids it makes
    anyway: one node, equal blocks (one rank per node among them), unequal blocks
    with their sizes, or interleaved ranks; the last two are planned as one rank
    per node, and show_config says which it is."""
    mesh = init_device_mesh("cpu", shape)
    layout = mesh._node_layout()
    kind, count, smallest, largest = node_kind(nodes)
    got = (layout["nodes"], layout["count"], layout["smallest"], layout["largest"])
    assert got == (kind, count, smallest, largest), (got, nodes)
    line = _show_config._mesh_line(mesh)
    words = {"one": "on one node", "blocks": f"{count} nodes",
             "unequal": f"{count} nodes of {smallest} to {largest} consecutive ranks",
             "interleaved": "ranks are not consecutive"}
    assert words[kind] in line, line
    if kind in ("unequal", "interleaved"):
        assert layout["ranks_per_node"] == 1 and "planned as one rank per node" in line
    assert all(COMM.allgather(got == COMM.bcast(got)))


def test_ranks_per_node_or_the_reason_on_every_rank(nodes):
    """The ranks on each node where the nodes hold equal consecutive blocks; else
    the same RuntimeError on every rank, naming each node and its ranks."""
    k = blocks_of(nodes)
    got = COMM.allgather(outcome(ranks_per_node))
    if k is not None:
        assert got == [None] * N and ranks_per_node() == k, got
        return
    assert all(o is not None and o == got[0] for o in got), got
    kind, message = got[0]
    assert kind == "RuntimeError" and message.startswith("ranks_per_node: "), got[0]
    assert all(h in message for h in COMM.allgather(MPI.Get_processor_name())), message
    equal = len({nodes.count(x) for x in set(nodes)}) == 1
    assert ("not consecutive" if equal else "different numbers of ranks") in message


def test_node_and_local_mesh(nodes):
    """The mesh torch users build on a cluster, (nodes, ranks per node) named
    ("node", "local"): its "local" groups are the nodes, its "node" groups take one
    rank of each node, the mesh knows it, and DTensors move over both dims as on
    one machine."""
    k = blocks_of(nodes)
    if k is None:
        pytest.skip(f"nodes {nodes} hold no equal consecutive blocks (tested above)")
    mesh = init_device_mesh("cpu", (-1, ranks_per_node()), mesh_dim_names=("node", "local"))
    p = Problems()
    p.expect(mesh.shape == (N // k, k), f"shape {mesh.shape}")
    local = mesh.get_group("local").allgather(RANK)
    across = mesh.get_group("node").allgather(RANK)
    p.expect({nodes[r] for r in local} == {nodes[RANK]}, f"local group {local}")
    p.expect(len({nodes[r] for r in across}) == len(across), f"node group {across}")
    layout = mesh._node_layout()
    one_node = len(set(nodes)) == 1
    p.expect(layout["inside"] == (["node", "local"] if one_node else ["local"]), str(layout))
    p.expect(mesh["local"]._node_layout()["ranks_per_node"] == 0, "a node's slice")
    g = np.arange(8.0 * N * 3).reshape(4 * N, 6)
    for src, dst in [([Shard(0), Shard(1)], [Replicate(), Replicate()]),
                     ([Shard(0), Replicate()], [Shard(1), Shard(0)]),
                     ([Replicate(), Shard(0)], [Shard(0), Shard(1)])]:
        full, wrong = gather_global(mt.distribute_tensor(g, mesh, src).redistribute(mesh, dst))
        p.expect(np.array_equal(full, g) and not wrong, f"{src} -> {dst}: {wrong}")
    x = mt.distribute_tensor(g, mesh, [Shard(0), Replicate()])
    w = mt.distribute_tensor(np.ones((6, 2 * k)), mesh, [Replicate(), Shard(1)])
    p.expect(np.allclose((x @ w).full_tensor(), g @ np.ones((6, 2 * k))), "matmul")
    assert p == []


def test_meshes_made_from_each_nodes_own_size_are_refused_everywhere(nodes):
    """Each rank takes its own node's size for a (nodes, local) mesh, as from the
    launcher's local size: where the nodes differ, ranks pass different shapes and
    every rank raises the same error instead of waiting for the others."""
    local = nodes.count(nodes[RANK])
    shape = (N // local, local)
    if len({(N // nodes.count(x), nodes.count(x)) for x in nodes}) == 1:
        assert init_device_mesh("cpu", shape).shape == shape
        return
    got = raised(lambda: init_device_mesh("cpu", shape), ValueError, "different meshes")
    assert all(COMM.allgather(got is True)), got


def test_show_config_prints_the_node_layout(nodes):
    mesh = init_device_mesh("cpu", (N,), mesh_dim_names=("all",))
    info = _show_config.config()["nodes"]
    assert info["this process"] == f"rank {RANK} of {N} on {MPI.Get_processor_name()}"
    line = info["meshes (ranks per node, dims inside a node)"][0]
    k = mesh._node_layout()["ranks_per_node"]
    assert line.startswith(f"mesh ({N},) ('all',): ")
    if k == 0:
        assert "on one node; inside a node: all; across nodes: none" in line
    elif k == 1 and mesh._node_layout()["nodes"] == "blocks":
        assert "one rank per node" in line and "across nodes: all" in line
    elif k == 1:
        assert "planned as one rank per node" in line and "across nodes: all" in line
    else:
        assert f"nodes of {k} consecutive ranks, {N // k} nodes" in line
    if N > 1:
        assert any(v.startswith(("OMPI_COMM_WORLD_SIZE=", "PMI_SIZE="))
                   for v in info["launcher"]), info["launcher"]
