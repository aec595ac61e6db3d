"""plot_sharding and plot_redistribute: PNG files written (non-empty, PNG
signature) and visible to every rank on return; the transfers plot_redistribute
draws, against a brute-force reference; errors on every rank (missing matplotlib,
3-D, Partial targets, an unwritable path)."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from mpitensor.debug import plot_redistribute, plot_sharding
from mpi_helpers import Problems, coordinates, raised, ref_box

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()
R, S0, S1 = Replicate(), Shard(0), Shard(1)
PNG = b"\x89PNG\r\n\x1a\n"

# matplotlib's FreeType module throws C++ exceptions internally, and ASan's
# __cxa_throw interceptor (libasan preloaded into an uninstrumented interpreter)
# fails a CHECK on them: the process dies inside matplotlib, not in mpitensor.
pytestmark = pytest.mark.skipif(bool(os.environ.get("MT_SANITIZED")),
                                reason="matplotlib's C++ exceptions abort under preloaded ASan")


@pytest.fixture
def shared_dir(tmp_path):
    """One directory for all ranks (rank 0's), since one rank writes the file."""
    return COMM.bcast(str(tmp_path) if RANK == 0 else None)


def is_png(path) -> bool:
    with open(path, "rb") as f:
        head = f.read(8)
    return head == PNG and os.path.getsize(path) > 1000


def mesh2d():
    return init_device_mesh("cpu", (2, W // 2)) if W % 2 == 0 else init_device_mesh("cpu", (W, 1))


@pytest.mark.parametrize("shape, placements", [
    ((4, 4), [S0]), ((4, 4), [S1]), ((5, 3), [S0]), ((7,), [S0]), ((4, 4), [Partial()]),
])
def test_plot_sharding_writes_png(shared_dir, shape, placements):
    mesh = init_device_mesh("cpu", (W,))
    path = os.path.join(shared_dir, "layout.png")
    plot_sharding(distribute_tensor(np.zeros(shape), mesh, placements), path)
    assert is_png(path)  # on every rank: the call is collective
    COMM.Barrier()  # nobody removes the directory before all have looked


def test_plot_sharding_2d_mesh(shared_dir):
    mesh = mesh2d()
    path = os.path.join(shared_dir, "layout2d.png")
    plot_sharding(distribute_tensor(np.zeros((6, 4)), mesh, [S0, S1]), path)
    assert is_png(path)
    COMM.Barrier()


def reference_transfers(shape, mesh_shape, src, dst):
    """Brute force: every element a receiver needs and lacks, from the source
    holder whose coordinate matches the receiver's most (ties: lowest rank), or
    from every other holder for a Partial source; grouped into the source boxes."""
    coords = list(coordinates(mesh_shape))
    partial = any(isinstance(p, Partial) for p in src)
    boxes = [ref_box(shape, mesh_shape, c, src) for c in coords]
    out = []
    for receiver, c in enumerate(coords):
        size, off = ref_box(shape, mesh_shape, c, dst)
        if 0 in size:
            continue
        seen = []
        for holder, (ssize, soff) in enumerate(boxes):
            key = (ssize, soff)
            if 0 in ssize or key in seen:
                continue
            seen.append(key)
            lo = [max(a, b) for a, b in zip(off, soff)]
            hi = [min(a + n, b + m) - 1 for a, n, b, m in zip(off, size, soff, ssize)]
            if any(l > h for l, h in zip(lo, hi)):
                continue
            holders = [h for h, b in enumerate(boxes) if b == key]
            if partial:
                senders = [h for h in holders if h != receiver]
            elif receiver in holders:
                senders = []
            else:
                senders = [max(holders, key=lambda h: (
                    sum(x == y for x, y in zip(coords[h], c)), -h))]
            box = tuple(zip(lo, hi)) if len(shape) == 2 else ((lo[0], hi[0]), (0, 0))
            out += [(s, receiver, box) for s in senders]
    return out


@pytest.mark.parametrize("shape, src, dst", [
    ((4, 4), [S0], [R]), ((4, 4), [S0], [S1]), ((4, 4), [R], [S0]),
    ((5, 3), [S0], [R]), ((4, 4), [Partial()], [R]), ((4, 4), [Partial()], [S0]),
    ((6,), [S0], [R]),
])
def test_plot_redistribute_transfers(shared_dir, shape, src, dst):
    mesh = init_device_mesh("cpu", (W,))
    path = os.path.join(shared_dir, "plan.png")
    dt = distribute_tensor(np.zeros(shape), mesh, src)
    moves = plot_redistribute(dt, dst, path)
    assert is_png(path)
    assert moves == reference_transfers(shape, (W,), src, dst)
    if src == [R]:
        assert moves == []  # Replicate -> Shard is a local chunk
    COMM.Barrier()


def test_plot_redistribute_2d_mesh(shared_dir):
    mesh = mesh2d()
    path = os.path.join(shared_dir, "plan2d.png")
    dt = distribute_tensor(np.zeros((4, 4)), mesh, [S0, S1])
    moves = plot_redistribute(dt, [R, S0], path)
    assert is_png(path)
    assert moves == reference_transfers((4, 4), mesh.shape, [S0, S1], [R, S0])
    if W == 4:
        assert moves == [(1, 0, ((0, 1), (2, 3))), (2, 1, ((2, 3), (0, 1))),
                         (3, 1, ((2, 3), (2, 3))), (0, 2, ((0, 1), (0, 1))),
                         (1, 2, ((0, 1), (2, 3))), (2, 3, ((2, 3), (0, 1)))]
    COMM.Barrier()


def test_errors_on_every_rank(shared_dir, monkeypatch):
    mesh = init_device_mesh("cpu", (W,))
    dt = distribute_tensor(np.zeros((4, 4)), mesh, [S0])
    problems = Problems()
    cube = distribute_tensor(np.zeros((2, 2, 2)), mesh, [R])
    for call in (lambda: plot_sharding(cube, "x.png"),
                 lambda: plot_redistribute(cube, [R], "x.png")):
        r = raised(call, RuntimeError, "1D or 2D")
        problems.expect(r is True, f"3-D: {r}")
    r = raised(lambda: plot_redistribute(dt, [Partial()], "x.png"), RuntimeError, "Partial")
    problems.expect(r is True, f"to Partial: {r}")
    missing = os.path.join(shared_dir, "no", "such", "dir", "x.png")
    r = raised(lambda: plot_sharding(dt, missing), OSError,
               "failed on the mesh's first rank.*No such file")
    problems.expect(r is True, f"unwritable path: {r}")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    r = raised(lambda: plot_sharding(dt, "x.png"), ImportError, "pip install matplotlib")
    problems.expect(r is True, f"no matplotlib: {r}")
    assert problems == []
