"""``np.save`` and ``np.savetxt`` of DTensors to a path (_save.py): the file is
NumPy's, byte for byte, for Shard(0), Shard(1), Replicate and a 2-D mesh, uneven
shapes where a rank holds no rows; a Shard(0) layout gathers nothing (only the
small collectives of the path check and the scan of lengths); a file object keeps
the gathered fallback."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Shard
from mpitensor.debug import CommDebugMode
from ops_helpers import W, make, mesh_layouts, mesh_of

S0, S1 = Shard(0), Shard(1)
COMM = MPI.COMM_WORLD
SMALL = {"all_reduce", "broadcast", "exscan"}



def _same_bytes(path, write_expected):
    """The bytes at ``path`` are those NumPy's ``write_expected(file)`` writes."""
    want = io.BytesIO()
    write_expected(want)
    with open(path, "rb") as f:
        got = f.read()
    assert got == want.getvalue()


@pytest.mark.parametrize("layout", mesh_layouts((S0, S1), (S1, S0)), ids=str)
@pytest.mark.parametrize("shape", [(2, 3), (7, 5)])
def test_save_writes_numpys_npy(folder, layout, shape):
    full = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) - 3
    a = make(full, mesh_of(layout[0]), layout[1])
    with mt.strict():
        np.save(os.path.join(folder, "w"), a)
    COMM.barrier()
    _same_bytes(os.path.join(folder, "w.npy"), lambda f: np.save(f, full))
    np.testing.assert_array_equal(np.load(os.path.join(folder, "w.npy")), full)


@pytest.mark.parametrize("layout", mesh_layouts((S0, S1), (S0, S0)), ids=str)
@pytest.mark.parametrize("shape", [(2, 3), (7, 2), (5,)])
def test_savetxt_writes_numpys_text(folder, layout, shape):
    full = np.arange(np.prod(shape), dtype=np.float64).reshape(shape) / 7
    pls = tuple(p if not (type(p) is Shard and p.dim >= len(shape)) else S0
                for p in layout[1])
    a = make(full, mesh_of(layout[0]), pls)
    kw = dict(fmt="%.4f", delimiter=",", header="first\nsecond", footer="end",
              comments="// ", newline=";\n")
    path = os.path.join(folder, "x.txt")
    with mt.strict():
        np.savetxt(path, a, **kw)
        np.savetxt(path + ".plain", a)
    COMM.barrier()
    _same_bytes(path, lambda f: np.savetxt(f, full, **kw))
    _same_bytes(path + ".plain", lambda f: np.savetxt(f, full))


def test_savetxt_of_no_rows_writes_header_and_footer(folder):
    a = make(np.zeros((0, 3)), mesh_of((W,)), [S0])
    path = os.path.join(folder, "empty.txt")
    np.savetxt(path, a, header="h", footer="f")
    COMM.barrier()
    _same_bytes(path, lambda f: np.savetxt(f, np.zeros((0, 3)), header="h", footer="f"))


def test_row_layouts_gather_nothing(folder):
    full = np.arange(60, dtype=np.int64).reshape(20, 3)
    a = make(full, mesh_of((W,)), [S0])
    with mt.strict(), CommDebugMode() as comm:
        np.save(os.path.join(folder, "r.npy"), a)
        np.savetxt(os.path.join(folder, "r.txt"), a, fmt="%d")
    assert set(comm.get_comm_counts()) <= SMALL
    columns = make(full, mesh_of((W,)), [S1])
    with CommDebugMode() as comm:
        np.savetxt(os.path.join(folder, "c.txt"), columns, fmt="%d")
    assert set(comm.get_comm_counts()) <= SMALL | {"all_to_all_single"}
    COMM.barrier()
    _same_bytes(os.path.join(folder, "c.txt"), lambda f: np.savetxt(f, full, fmt="%d"))


def test_file_objects_and_bad_arguments_answer_as_numpy(folder):
    full = np.arange(6.0).reshape(2, 3)
    a = make(full, mesh_of((W,)), [S0])
    out = io.BytesIO()
    with pytest.warns(mt.GatherWarning):
        np.save(out, a)
    # The fallback writes a file object on one rank (as a program writing from
    # rank 0 would).
    wrote = bool(out.getvalue())
    assert not wrote or np.array_equal(np.load(io.BytesIO(out.getvalue())), full)
    assert COMM.allreduce(int(wrote)) == 1
    with pytest.raises(ValueError):
        np.savetxt(os.path.join(folder, "bad.txt"), a, fmt="%d %d")
    with pytest.raises(ValueError):
        np.savetxt(os.path.join(folder, "bad.txt"), make(np.zeros((2, 2, 2)), mesh_of((W,)), [S0]))
