"""visualize_sharding: the exact tables for (4, 4) on 4 ranks with [Shard(0)],
[Shard(1)], [Shard(0), Replicate()] on a 2-D mesh and uneven cases; at any size
the table against a reference built from ref_box; printed by one rank only;
header, rich, and the errors (3-D, missing packages) on every rank."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from mpitensor.debug import visualize_sharding
from mpi_helpers import Problems, coordinates, raised, ref_box

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
R, S0, S1 = Replicate(), Shard(0), Shard(1)
at4 = pytest.mark.world(4, reason="the written-out tables are for 4 ranks")


def shown(capsys, dt, **kw) -> str:
    visualize_sharding(dt, **kw)
    return capsys.readouterr().out


def printer(mesh) -> bool:
    return not any(mesh.get_coordinate())


@at4
@pytest.mark.parametrize("mesh_shape, shape, placements, table", [
    ((4,), (4, 4), [S0],
     "         Col 0-3\n"
     "-------  ---------\n"
     "Row 0-0  cpu:0\n"
     "Row 1-1  cpu:1\n"
     "Row 2-2  cpu:2\n"
     "Row 3-3  cpu:3\n"),
    ((4,), (4, 4), [S1],
     "         Col 0-0    Col 1-1    Col 2-2    Col 3-3\n"
     "-------  ---------  ---------  ---------  ---------\n"
     "Row 0-3  cpu:0      cpu:1      cpu:2      cpu:3\n"),
    ((2, 2), (4, 4), [S0, R],
     "         Col 0-3\n"
     "-------  ---------\n"
     "Row 0-1  cpu:0,1\n"
     "Row 2-3  cpu:2,3\n"),
    # Uneven: 5 rows cut in 3 + 2, then each part in two again (torch.chunk).
    ((2, 2), (5, 3), [S0, S0],
     "         Col 0-2\n"
     "-------  ---------\n"
     "Row 0-1  cpu:0\n"
     "Row 2-2  cpu:1\n"
     "Row 3-3  cpu:2\n"
     "Row 4-4  cpu:3\n"),
    # Uneven, 1-D: rank 3's shard is empty and appears nowhere.
    ((4,), (3,), [S0],
     "         Col 0-0\n"
     "-------  ---------\n"
     "Row 0-0  cpu:0\n"
     "Row 1-1  cpu:1\n"
     "Row 2-2  cpu:2\n"),
    ((2, 2), (4, 6), [S1, S0],
     "         Col 0-2    Col 3-5\n"
     "-------  ---------  ---------\n"
     "Row 0-1  cpu:0      cpu:2\n"
     "Row 2-3  cpu:1      cpu:3\n"),
])
def test_tables_on_four_ranks(capsys, mesh_shape, shape, placements, table):
    mesh = init_device_mesh("cpu", mesh_shape)
    out = shown(capsys, distribute_tensor(np.zeros(shape), mesh, placements))
    assert out == (table if printer(mesh) else "")


def reference_table(shape, mesh_shape, placements) -> str:
    """The table from ref_box (brute-force layout) and tabulate."""
    from tabulate import tabulate

    owners: dict = {}
    for rank, coord in enumerate(coordinates(mesh_shape)):
        size, offset = ref_box(shape, mesh_shape, coord, placements)
        if len(shape) == 1:
            size, offset = (size[0], 1), (offset[0], 0)
        if 0 in size:
            continue
        key = ((offset[0], offset[0] + size[0] - 1), (offset[1], offset[1] + size[1] - 1))
        owners.setdefault(key, []).append(rank)
    rows, cols = sorted({k[0] for k in owners}), sorted({k[1] for k in owners})
    cells = [["cpu:" + ",".join(map(str, owners[(r, c)])) if (r, c) in owners else ""
              for c in cols] for r in rows]
    return tabulate(cells, headers=[f"Col {a}-{b}" for a, b in cols],
                    showindex=[f"Row {a}-{b}" for a, b in rows]) + "\n"


@pytest.mark.parametrize("shape, placements", [
    ((4, 4), [S0]), ((4, 4), [S1]), ((4, 4), [R]), ((7, 5), [S0]), ((2, 9), [S1]),
    ((5,), [S0]), ((6,), [R]), ((3, 3), [Partial()]),
])
def test_tables_match_the_reference(capsys, shape, placements):
    mesh = init_device_mesh("cpu", (W,))
    dt = distribute_tensor(np.zeros(shape), mesh, placements)
    out = shown(capsys, dt)
    assert out == (reference_table(shape, (W,), placements) if printer(mesh) else "")


def test_header_comes_first(capsys):
    mesh = init_device_mesh("cpu", (W,))
    out = shown(capsys, distribute_tensor(np.zeros((4, 4)), mesh, [S0]), header="weights")
    if printer(mesh):
        assert out == "weights\n" + reference_table((4, 4), (W,), [S0])
    else:
        assert out == ""


def test_rich_table(capsys):
    mesh = init_device_mesh("cpu", (W,))
    out = shown(capsys, distribute_tensor(np.zeros((4, 4)), mesh, [S1]), use_rich=True,
                header="cols")
    if not printer(mesh):
        assert out == ""
        return
    assert "cols" in out and "Row 0-3" in out
    for r in range(W):
        size, offset = ref_box((4, 4), (W,), (r,), [S1])
        if size[1]:
            assert f"cpu:{r}" in out and f"Col {offset[1]}-{offset[1] + size[1] - 1}" in out
        else:
            assert f"cpu:{r}" not in out


def test_empty_prints_nothing(capsys):
    mesh = init_device_mesh("cpu", (W,))
    assert shown(capsys, distribute_tensor(np.zeros((0, 4)), mesh, [S0])) == ""


def test_errors_on_every_rank(monkeypatch):
    mesh = init_device_mesh("cpu", (W,))
    problems = Problems()
    for shape in ((2, 2, 2), ()):
        dt = distribute_tensor(np.zeros(shape), mesh, [R])
        r = raised(lambda: visualize_sharding(dt), RuntimeError, "1D or 2D")
        problems.expect(r is True, f"{shape}: {r}")
    dt = distribute_tensor(np.zeros((4, 4)), mesh, [S0])
    monkeypatch.setitem(sys.modules, "tabulate", None)
    monkeypatch.setitem(sys.modules, "rich", None)
    r = raised(lambda: visualize_sharding(dt), ImportError, "pip install tabulate")
    problems.expect(r is True, f"no tabulate: {r}")
    r = raised(lambda: visualize_sharding(dt, use_rich=True), ImportError, "pip install rich")
    problems.expect(r is True, f"no rich: {r}")
    assert problems == []
