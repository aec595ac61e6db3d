"""``np.savez`` and ``np.savez_compressed`` of DTensors to a path (checkpoint/_npz.py):
savez writes NumPy's archive byte for byte, savez_compressed one whose members
decompress to NumPy's bytes, for Shard(0), Shard(1), Replicate, Partial and a 2-D
mesh, with uneven, empty and 0-d members beside plain arrays and scalars; a Shard(0)
member gathers nothing; a failure on any rank raises on every rank and leaves the
old file; a file object keeps the gathered fallback."""

from __future__ import annotations

import io
import os
import zipfile
import zlib

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Partial, Replicate, Shard, init_device_mesh
from mpitensor.checkpoint import _npz, _zip
from mpitensor.debug import CommDebugMode
from mpi_helpers import outcome, same_everywhere
from ops_helpers import W, make, mesh_layouts, mesh_of

S0, S1 = Shard(0), Shard(1)
COMM = MPI.COMM_WORLD
LAYOUTS = mesh_layouts((S0, S1), (S1, S0)) + [((W,), (Partial(),))]



def _numpys(write, *args, **kwds) -> bytes:
    out = io.BytesIO()
    write(out, *args, **kwds)
    return out.getvalue()


def _members(data: bytes) -> dict:
    with zipfile.ZipFile(io.BytesIO(data)) as z:
        assert z.testzip() is None
        return {name: z.read(name) for name in z.namelist()}


def test_crc32_combine_is_the_crc_of_the_whole():
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, 5000, dtype=np.uint8).tobytes()
    for cuts in ([], [0], [5000], [1, 2, 2, 4999], list(rng.integers(0, 5000, 6))):
        edges = [0, *sorted(int(c) for c in cuts), len(data)]
        crc = 0
        for a, b in zip(edges, edges[1:]):
            crc = _zip.crc32_combine(crc, zlib.crc32(data[a:b]), b - a)
        assert crc == zlib.crc32(data)


def test_zip64_records_read_back():
    """Every size and offset past the limit: the ZIP64 extra fields of the central
    directory and the ZIP64 end records, as zipfile writes them past 2 GiB."""
    arrays = {"a": np.arange(6.0), "b": np.zeros((2, 0)), "c": np.arange(3)}
    out, entries = bytearray(), []
    for key, value in arrays.items():
        raw = _numpys(np.lib.format.write_array, value)
        name, flags = _zip.name_of(key + ".npy")
        packed = _zip.deflate_part(raw, -1, True)
        entry = _zip.Member(name, flags, _zip.DEFLATED, zlib.crc32(raw), len(packed),
                            len(raw), len(out))
        entries.append(entry)
        out += _zip.local_header(entry) + packed
    out += _zip.directory(entries, len(out), limit=0)
    assert b"PK\x06\x06" in out and b"PK\x06\x07" in out
    loaded = np.load(io.BytesIO(bytes(out)))
    for key, value in arrays.items():
        np.testing.assert_array_equal(loaded[key], value)
    assert _members(bytes(out)).keys() == {k + ".npy" for k in arrays}


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
def test_savez_writes_numpys_archive(folder, layout):
    mesh = mesh_of(layout[0])
    full = np.arange(35, dtype=np.float32).reshape(7, 5) - 3
    a = make(full, mesh, layout[1])
    vec = np.arange(2 * W + 1, dtype=np.int16)
    v = make(vec, mesh, [S0] * mesh.ndim)
    cube = np.arange(24.0).reshape(2, 3, 4)
    c = make(cube, mesh, [Shard(2)] + [Replicate()] * (mesh.ndim - 1))
    empty = make(np.zeros((0, 3)), mesh, [S0] * mesh.ndim)
    scalar = make(np.array(2.5), mesh, [Replicate()] * mesh.ndim)
    plain = {"step": 7, "names": np.array(["u", "v"])}
    path = os.path.join(folder, "w")
    with mt.strict():
        np.savez(path, a, v, c, empty=empty, scalar=scalar, **plain)
        np.savez_compressed(path + "-z.npz", a, v, c, empty=empty, scalar=scalar, **plain)
    COMM.barrier()
    args = (full, vec, cube)
    kwds = dict(empty=np.zeros((0, 3)), scalar=np.array(2.5), **plain)
    with open(path + ".npz", "rb") as f:
        assert f.read() == _numpys(np.savez, *args, **kwds)
    with open(path + "-z.npz", "rb") as f:
        got = f.read()
    assert _members(got) == _members(_numpys(np.savez_compressed, *args, **kwds))
    loaded = np.load(path + "-z.npz")
    np.testing.assert_array_equal(loaded["arr_0"], full)
    assert loaded["scalar"].shape == () and loaded["step"] == 7


def test_row_layouts_gather_nothing(folder):
    """What a Shard(0) member moves (the path check, the table of parts, the
    temporary name) does not grow with the array."""
    moved = []
    for rows in (16, 400):
        full = np.arange(rows * 8, dtype=np.float64).reshape(rows, 8)
        a = make(full, mesh_of((W,)), [S0])
        with mt.strict(), CommDebugMode() as comm:
            np.savez_compressed(os.path.join(folder, "r.npz"), a)
        assert "all_to_all_single" not in comm.get_comm_counts()
        moved.append(comm.get_comm_bytes())
        COMM.barrier()
        np.testing.assert_array_equal(np.load(os.path.join(folder, "r.npz"))["arr_0"], full)
    assert moved[0] == moved[1]


def test_a_failing_rank_leaves_the_old_file(folder, monkeypatch):
    path = os.path.join(folder, "keep.npz")
    a = make(np.arange(40.0).reshape(10, 4), mesh_of((W,)), [S0])
    if COMM.rank == 0:
        np.savez(path, old=np.zeros(1))
    COMM.barrier()
    if COMM.rank == W - 1:
        def refuse(tmp, pieces):
            raise OSError("no space left on device")
        monkeypatch.setattr(_npz, "_write_pieces", refuse)
    got = same_everywhere(outcome(lambda: np.savez(path, a)))
    assert got == ("OSError", "no space left on device")
    COMM.barrier()
    assert list(np.load(path).keys()) == ["old"]
    assert sorted(os.listdir(folder)) == ["keep.npz"]


def test_errors_and_file_objects_answer_as_numpy(folder):
    mesh = mesh_of((W,))
    a = make(np.arange(6.0).reshape(3, 2), mesh, [S0])
    objects = np.array([{"k": 1}, None], dtype=object)
    refused = outcome(lambda: np.savez(os.path.join(folder, "o"), a, objects,
                                       allow_pickle=False))
    assert same_everywhere(refused)[0] == "ValueError"
    missing = outcome(lambda: np.savez(os.path.join(folder, "no", "x"), a))
    assert same_everywhere(missing)[0] == "FileNotFoundError"
    with pytest.raises(ValueError, match="arr_0"):
        np.savez(os.path.join(folder, "c"), a, arr_0=a)
    other = make(np.arange(3.0), init_device_mesh("cpu", (1, W)), [Replicate(), S0])
    with pytest.raises(ValueError, match="different device meshes"):
        np.savez(os.path.join(folder, "m"), a, other)
    np.savez(os.path.join(folder, "p"), a, objects)
    out = io.BytesIO()
    with pytest.warns(mt.GatherWarning):
        np.savez_compressed(out, a)
    assert COMM.allreduce(int(bool(out.getvalue()))) == 1
    COMM.barrier()
    assert sorted(os.listdir(folder)) == ["p.npz"]
    assert np.load(os.path.join(folder, "p.npz"), allow_pickle=True)["arr_1"][0] == {"k": 1}
