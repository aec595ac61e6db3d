"""Zarr v3 arrays saved and loaded in parallel: chunks aligned with the
shards, stores that zarr-python reads with the right values and attributes, stores
that zarr-python writes (any chunks, compressed, with absent chunks) loaded onto
any mesh and placements, a slice loaded from its chunks alone, a store replaced
whole or not at all, and bad stores that raise the same exception on every rank.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time

import numpy as np
import pytest
import zarr
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, init_device_mesh
from mpitensor.checkpoint import _zarr
from mpi_helpers import (Problems, bits_equal, expect_same_error, finish_job, kill_job,
                         start_job)
from io_helpers import (DTYPES, N, RANK, array, check_dtensor, layouts, on_first)

COMM = MPI.COMM_WORLD



def read_zarr(path: str):
    """Rank 0's plain zarr-python read (values, dtype, chunks, attributes, the
    chunk files), broadcast."""
    got = None
    if RANK == 0:
        a = zarr.open_array(path, mode="r")
        files = sorted(os.path.relpath(os.path.join(d, f), path)
                       for d, _, fs in os.walk(path) for f in fs if f != "zarr.json")
        got = (a[()], a.dtype, a.chunks, dict(a.attrs), files, a.metadata.zarr_format)
    return COMM.bcast(got)


def listing(folder: str) -> list:
    return COMM.bcast(sorted(os.listdir(folder)) if RANK == 0 else None)


# -- written by mpitensor ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES)
def test_every_dtype_round_trips_in_chunks_of_the_shards(tmp, dtype):
    path = os.path.join(tmp, f"dt_{dtype}.zarr")
    g = array((2 * N + 1, 3), dtype)
    mesh = init_device_mesh("cpu", (N,))
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), path)
    values, stored, chunks, _, files, version = read_zarr(path)
    rows = -(-(2 * N + 1) // N)  # torch.chunk's piece
    p = Problems()
    p.expect(version == 3 and stored == g.dtype, f"v{version} {stored}")
    p.expect(bits_equal(values, g), "zarr-python reads other values")
    p.expect(chunks == (rows, 3), f"chunks {chunks}, shards of {rows} rows")
    back = mt.load(path, mesh, [Shard(1)])
    p.expect(back.dtype == g.dtype, f"dtype {back.dtype}")
    check_dtensor(p, back, g, f"{dtype} as Shard(1)")
    assert p == []


@pytest.mark.parametrize("shape", [(), (5,), (2 * N + 1, 3), (3, 2 * N, 2), (2, 3, N + 1, 2),
                                   (0, 4), (1, 3)])
def test_every_shape_from_and_into_every_layout(tmp, shape):
    g = array(shape, "float64", 3) + 1  # no zero: every chunk is stored
    p = Problems()
    for k, (mesh_shape, pl) in enumerate(layouts(len(shape))):
        path = os.path.join(tmp, f"shape{len(shape)}_{k}.zarr")
        mesh = init_device_mesh("cpu", mesh_shape)
        mt.save(mt.distribute_tensor(g, mesh, pl), path)
        p.expect(bits_equal(read_zarr(path)[0], g), f"{shape} saved as {pl}: zarr differs")
        for mesh2, pl2 in layouts(len(shape))[::2]:
            back = mt.load(path, init_device_mesh("cpu", mesh2), pl2)
            check_dtensor(p, back, g, f"{shape}: saved {pl} on {mesh_shape}, loaded {pl2}")
    assert p == []


def test_a_rank_encodes_its_chunks_from_its_own_memory(tmp, monkeypatch):
    """Each chunk is encoded alone, from the rank's memory: a save holds one or two
    encoded chunks beside the data, never a copy of the rank's part (as it did
    when the part went in whole to zarr-python, chunk copies and all)."""
    import tracemalloc

    monkeypatch.setattr(_zarr, "CHUNK_BYTES", 256 << 10)
    mesh = init_device_mesh("cpu", (N,))
    g = np.random.default_rng(1).standard_normal((512 * N, 256))  # 1 MiB a rank, 4 chunks
    dt = mt.distribute_tensor(g, mesh, [Shard(0)])
    path = os.path.join(tmp, "in_place.zarr")
    mt.save(dt, path, durable=False)  # imports and caches, untraced
    tracemalloc.start()
    try:
        mt.save(dt, path, durable=False)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    p = Problems()
    # zarr-python may hold two encoded chunks at once when its event loop runs
    # late (a loaded machine); a copy of the part would be all four and more.
    p.expect(peak < 3 * dt.to_local().nbytes // 4, f"rank {RANK} allocated {peak} bytes at "
             f"most, saving {dt.to_local().nbytes}")
    p.expect(bits_equal(read_zarr(path)[0], g), "values")
    assert p == []


@pytest.mark.parametrize("dtype,encoder", [("float64", "ours"), ("bool", "ours"),
                                           ("float64", "zarr-python's")])
def test_the_files_are_byte_for_byte_zarr_pythons(tmp, monkeypatch, dtype, encoder):
    """A save encodes its chunks itself, or has zarr-python encode them for codecs
    it does not know: either way the store holds the files zarr-python writes for
    the same array, an edge chunk padded with the fill value, an all-fill chunk
    absent and a chunk of -0.0 present."""
    monkeypatch.setattr(_zarr, "CHUNK_BYTES", 2 * np.dtype(dtype).itemsize)  # 1 x 2
    if encoder != "ours":
        monkeypatch.setattr(_zarr, "_encoder", lambda arr, dtype: None)
    g = array((2 * N + 1, 5), dtype, 2)
    g[0] = 0
    g[1, :2] = -0.0
    mesh = init_device_mesh("cpu", (N,))
    path, ref = os.path.join(tmp, f"bytes_{dtype}.zarr"), os.path.join(tmp, "ref.zarr")
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), path, durable=False)
    chunks = read_zarr(path)[2]

    def files(store):
        return {os.path.relpath(os.path.join(d, f), store):
                open(os.path.join(d, f), "rb").read()
                for d, _, fs in os.walk(store) for f in fs}

    def reference():
        shutil.rmtree(ref, ignore_errors=True)
        zarr.create_array(zarr.storage.LocalStore(ref), shape=g.shape, chunks=chunks,
                          dtype=g.dtype, zarr_format=3,
                          chunk_key_encoding={"name": "default", "separator": "."})[...] = g

    on_first(reference)
    ours, theirs = COMM.bcast((files(path), files(ref)) if RANK == 0 else None)
    p = Problems()
    p.expect(chunks == (1, 2), f"chunks {chunks}")
    p.expect("c.0.0" not in ours, f"an all-fill chunk stored: {sorted(ours)}")
    # bool's values hold whole chunks of False (the fill value); float64's none
    p.expect(dtype == "bool" or {"c.1.0", "c.2.2"} <= set(ours),
             f"a chunk of -0.0 or an edge chunk not stored: {sorted(ours)}")
    p.expect(sorted(ours) == sorted(theirs), f"{sorted(ours)} != {sorted(theirs)}")
    p.expect(all(ours[k] == theirs[k] for k in set(ours) & set(theirs)),
             f"other bytes in {[k for k in set(ours) & set(theirs) if ours[k] != theirs[k]]}")
    assert p == []


def test_each_rank_writes_whole_chunks_of_its_own(tmp, monkeypatch):
    """Chunks as the shards, cut further when large, never across two ranks:
    each rank writes exactly the chunk files of its own box."""
    monkeypatch.setattr(_zarr, "CHUNK_BYTES", 8 * 5 * 4)  # a chunk: 4 rows of 5
    mesh = init_device_mesh("cpu", (N,))
    g = array((8 * N, 5), "float64", 1) + 1
    written = []
    real = _zarr._write

    def spy(tmp_, local, offsets, chunks, *rest):
        written.append((offsets, local.shape, list(chunks)))
        return real(tmp_, local, offsets, chunks, *rest)

    monkeypatch.setattr(_zarr, "_write", spy)
    path = os.path.join(tmp, "own.zarr")
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), path)
    values, _, chunks, _, files, _ = read_zarr(path)
    p = Problems()
    p.expect(bits_equal(values, g), "values")
    p.expect(chunks == (4, 5), f"chunks {chunks}")
    p.expect(len(files) == 2 * N, f"{len(files)} chunk files")
    mine = written[0] if written else None
    p.expect(mine is not None and mine[0][0] % 4 == 0 and mine[1][0] % 4 == 0,
             f"rank {RANK} wrote {mine}: not whole chunks")
    assert p == []


def test_attributes_are_kept(tmp):
    path = os.path.join(tmp, "attrs.zarr")
    mesh = init_device_mesh("cpu", (N,))
    mt.save(mt.distribute_tensor(array((N, 2), "float32"), mesh, [Shard(0)]), path,
            attrs={"units": "K", "axes": ["y", "x"]})
    attrs = read_zarr(path)[3]
    assert attrs == {"units": "K", "axes": ["y", "x"]}, attrs


# -- written by zarr-python -------------------------------------------------------------

@pytest.mark.parametrize("kind", ["one chunk", "small chunks", "flat keys", "uncompressed",
                                  "gzip", "zarr v2", "sharded"])
def test_stores_that_zarr_writes_load_in_every_layout(tmp, kind):
    g = array((2 * N + 3, 5), "float64", 1)
    path = os.path.join(tmp, f"zarr_{kind.replace(' ', '_')}.zarr")
    options = {"one chunk": {"chunks": g.shape},
               "small chunks": {"chunks": (2, 3)},
               "flat keys": {"chunks": (2, 3), "chunk_key_encoding": {"name": "default",
                                                                      "separator": "."}},
               "uncompressed": {"chunks": (3, 5), "compressors": None},
               "gzip": {"chunks": (4, 2), "compressors": zarr.codecs.GzipCodec()},
               "zarr v2": {"chunks": (3, 3), "zarr_format": 2},
               "sharded": {"chunks": (1, 5), "shards": (4, 5)}}[kind]

    def action():
        a = zarr.create_array(path, shape=g.shape, dtype=g.dtype, **options)
        a[...] = g
    on_first(action)
    p = Problems()
    for mesh_shape, pl in layouts(2):
        back = mt.load(path, init_device_mesh("cpu", mesh_shape), pl)
        check_dtensor(p, back, g, f"{kind} as {pl} on {mesh_shape}")
    assert p == []


def test_an_absent_chunk_reads_as_the_fill_value(tmp):
    path = os.path.join(tmp, "sparse.zarr")
    g = np.full((3 * N, 4), 7, np.int32)
    g[:N] = array((N, 4), "int32", 2)

    def action():
        a = zarr.create_array(path, shape=g.shape, dtype=g.dtype, chunks=(N, 4),
                              fill_value=7)
        a[:N] = g[:N]
    on_first(action)
    p = Problems()
    p.expect(len(read_zarr(path)[4]) == 1, "one chunk stored")
    check_dtensor(p, mt.load(path, init_device_mesh("cpu", (N,)), [Shard(0)]), g,
                  "fill value where no chunk is")
    assert p == []


def test_index_reads_only_the_chunks_it_needs(tmp):
    """The chunks outside the slice are made garbage: the slice still loads, the
    whole array raises on every rank."""
    path = os.path.join(tmp, "slice.zarr")
    g = array((4 * N, 6), "float32") + 1
    mesh = init_device_mesh("cpu", (N,))

    def make():
        a = zarr.create_array(path, shape=g.shape, dtype=g.dtype, chunks=(2, 6))
        a[...] = g
        for i in range(N, 2 * N):  # rows from 2N on
            with open(os.path.join(path, "c", str(i), "0"), "wb") as f:
                f.write(b"\x00garbage" * 5)
    on_first(make)
    p = Problems()
    check_dtensor(p, mt.load(path, mesh, [Shard(1)], index=np.s_[:2 * N, 1:5]),
                  g[:2 * N, 1:5], "the unspoiled rows")
    check_dtensor(p, mt.load(path, mesh, [Replicate()], index=np.s_[1]), g[1], "one row")
    expect_same_error(p, "the spoiled chunks", lambda: mt.load(path, mesh, [Shard(0)]),
                      ValueError, "damaged")
    assert p == []


# -- whole or not at all ----------------------------------------------------------------

def test_a_save_replaces_the_store_whole(tmp):
    path = os.path.join(tmp, "replace.zarr")
    mesh = init_device_mesh("cpu", (N,))
    big, small = array((6 * N, 3), "float64") + 1, array((N, 2), "int16", 1) + 1
    mt.save(mt.distribute_tensor(big, mesh, [Shard(0)]), path, attrs={"old": 1})
    mt.save(mt.distribute_tensor(small, mesh, [Shard(1)]), path)
    values, stored, _, attrs, files, _ = read_zarr(path)
    p = Problems()
    p.expect(bits_equal(values, small) and attrs == {}, f"{stored} {attrs}")
    p.expect(len(files) <= N, f"the old store's chunks stayed: {files}")
    p.expect(listing(tmp).count("replace.zarr") == 1
             and not [f for f in listing(tmp) if f.startswith("replace.zarr.")],
             f"leftovers: {listing(tmp)}")
    assert p == []


def test_a_failed_save_leaves_the_old_store(tmp, monkeypatch):
    path = os.path.join(tmp, "keep.zarr")
    mesh = init_device_mesh("cpu", (N,))
    old = array((2 * N, 3), "float64") + 1
    mt.save(mt.distribute_tensor(old, mesh, [Shard(0)]), path)
    real = _zarr._write

    def failing(*args):
        if RANK == N - 1:
            raise PermissionError("cannot write the last rank's chunk")
        return real(*args)

    monkeypatch.setattr(_zarr, "_write", failing)
    p = Problems()
    expect_same_error(p, "failed save", lambda: mt.save(
        mt.distribute_tensor(old * 2, mesh, [Shard(0)]), path), OSError, "last rank")
    monkeypatch.undo()
    p.expect(bits_equal(read_zarr(path)[0], old), "the old store is whole")
    p.expect(not [f for f in listing(tmp) if f.startswith("keep.zarr.")],
             f"leftovers: {listing(tmp)}")
    # what a killed save leaves, a temporary store, goes with the next save
    on_first(lambda: os.mkdir(os.path.join(tmp, "keep.zarr.1a2b-3c4d.tmp")))
    mt.save(mt.distribute_tensor(old * 3, mesh, [Shard(0)]), path)
    p.expect(not [f for f in listing(tmp) if f.startswith("keep.zarr.")],
             f"a killed save's store stayed: {listing(tmp)}")
    p.expect(bits_equal(read_zarr(path)[0], old * 3), "the next save")
    assert p == []


def old_store_of_many_chunks(path: str, mesh, placements, monkeypatch) -> tuple:
    """A store at ``path`` of many small chunks (as a large array has), saved with a
    smaller CHUNK_BYTES; its array and the number of its chunk files."""
    g = array((16 * N, 8), "float64") + 1
    monkeypatch.setattr(_zarr, "CHUNK_BYTES", 2 * 8 * 8)
    mt.save(mt.distribute_tensor(g, mesh, placements), path)
    monkeypatch.undo()
    return g, len(read_zarr(path)[4])


def test_the_ranks_that_wrote_share_the_removal_of_the_old_store(tmp, monkeypatch):
    """Each rank that writes the new store unlinks a share of the old store's
    files; a replica that wrote nothing unlinks none; nothing of the old store is
    left when the save returns."""
    path = os.path.join(tmp, "shared.zarr")
    mesh_shapes = [((N,), [Shard(0)])]
    if N % 2 == 0:
        mesh_shapes.append(((N // 2, 2), [Shard(0), Replicate()]))
    p = Problems()
    for shape, placements in mesh_shapes:
        mesh = init_device_mesh("cpu", shape)
        g, files = old_store_of_many_chunks(path, mesh, placements, monkeypatch)
        p.expect(files == 8 * N, f"the old store has {files} chunk files")
        mine, real = [], os.unlink

        def counting(name, *args, **kw):
            real(name, *args, **kw)
            if os.fsdecode(name).startswith(path + "."):
                mine.append(name)

        monkeypatch.setattr(os, "unlink", counting)
        mt.save(mt.distribute_tensor(g * 2, mesh, placements), path)
        monkeypatch.undo()
        counts = COMM.allgather(len(mine))
        writes = COMM.allgather(all(c == 0 for c, pl in zip(mesh.get_coordinate(),
                                                            placements) if not pl.is_shard()))
        p.expect(sum(counts) == files + 1,  # the chunks and zarr.json
                 f"{shape}: the ranks unlinked {counts} of {files + 1} files")
        p.expect(all((c > 0) == w for c, w in zip(counts, writes)),
                 f"{shape}: unlinks {counts}, writers {writes}")
        p.expect(listing(tmp).count("shared.zarr") == 1
                 and not [f for f in listing(tmp) if f.startswith("shared.zarr.")],
                 f"{shape}: leftovers {listing(tmp)}")
        values, *_ = read_zarr(path)
        p.expect(bits_equal(values, g * 2), f"{shape}: the new store")
    assert p == []


def test_files_of_the_old_store_that_are_no_chunk_go_too(tmp, monkeypatch):
    """Files in the old store that are no chunk of its array, and a folder of
    them, are removed with it."""
    path = os.path.join(tmp, "strays.zarr")
    mesh = init_device_mesh("cpu", (N,))
    g, files = old_store_of_many_chunks(path, mesh, [Shard(0)], monkeypatch)

    def strays():
        open(os.path.join(path, "notes.txt"), "w").write("stray")
        os.mkdir(os.path.join(path, "extra"))
        open(os.path.join(path, "extra", "notes"), "w").write("stray")
    on_first(strays)
    mt.save(mt.distribute_tensor(g * 2, mesh, [Shard(0)]), path)
    p = Problems()
    p.expect(files == 8 * N, f"the old store has {files} chunk files")
    values, _, chunks, _, kept, _ = read_zarr(path)
    p.expect(bits_equal(values, g * 2), "the new store")
    p.expect(len(kept) == N and "notes.txt" not in kept, f"left: {kept}")
    p.expect(not [f for f in listing(tmp) if f.startswith("strays.zarr.")],
             f"leftovers: {listing(tmp)}")
    assert p == []


@pytest.mark.parametrize("kind", ["folders", "v2"])
def test_a_store_of_another_layout_is_released_and_removed_whole(tmp, monkeypatch, kind):
    """A store of chunk keys c/0/1 (folders per chunk row, as saves made before
    the '.' separator) or a Zarr v2 store, of smaller chunks: the first save over
    it releases the cache of the old chunks that hold each new chunk's elements,
    by their own names, and removes every file and folder of it."""
    path = os.path.join(tmp, f"{kind}.zarr")
    mesh = init_device_mesh("cpu", (N,))
    g = array((16 * N, 8), "float64") + 1

    def old():
        shutil.rmtree(path, ignore_errors=True)
        fmt = {"zarr_format": 2} if kind == "v2" else {
            "zarr_format": 3, "chunk_key_encoding": {"name": "default", "separator": "/"}}
        z = zarr.create_array(zarr.storage.LocalStore(path), shape=g.shape, chunks=(2, 8),
                              dtype=g.dtype, **fmt)
        z[...] = g
        return sorted(os.path.relpath(os.path.join(d, f), path)
                      for d, _, fs in os.walk(path) for f in fs)
    before = COMM.bcast(old() if RANK == 0 else None)
    released = []
    monkeypatch.setattr(_zarr._io, "release_cache", released.append)
    mt.save(mt.distribute_tensor(g * 2, mesh, [Shard(0)]), path)
    monkeypatch.undo()
    p = Problems()
    values, _, chunks, _, kept, _ = read_zarr(path)
    p.expect(len(before) > 8 * N, f"the old store: {before}")
    p.expect(bits_equal(values, g * 2) and kept == [f"c.{r}.0" for r in range(N)],
             f"{kind}: left {kept}")
    p.expect(not os.path.exists(os.path.join(path, "c")), "a folder of the old store")
    names = [os.path.relpath(n, path) for n in released]
    # the new chunk of a rank holds 8 of the old chunks' rows
    key = "c/{}/0" if kind == "folders" else "{}.0"
    p.expect(names == [key.format(i) for i in range(8 * RANK, 8 * RANK + 8)],
             f"rank {RANK} released {names}")
    assert p == []


KILLED = """
import os, signal, sys
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Shard
from mpitensor.checkpoint import _zarr

mode, path = sys.argv[1], sys.argv[2]
comm = MPI.COMM_WORLD
mesh = mt.init_device_mesh("cpu", (comm.Get_size(),))
_zarr.CHUNK_BYTES = 4 * 64 * 8  # many chunks: their removal takes a while


def save(gen):
    g = np.full((1024, 64), float(gen))
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), path)


save(1)
if mode == "removing":
    real = _zarr._remove_share

    def killing(old, share, shares):
        if share == shares - 1:  # the last rank, once its share is half gone
            names = [os.path.join(d, f) for d, _, fs in os.walk(old) for f in fs]
            for name in names[:len(names) // 2]:
                os.unlink(name)
            os.kill(os.getpid(), signal.SIGKILL)
        real(old, share, shares)

    _zarr._remove_share = killing
    save(2)
else:
    open(f"{path}.pid.{comm.Get_rank()}", "w").write(str(os.getpid()))
    gen = 2
    while True:
        save(gen)
        gen += 1
"""


def start_killed(folder: str, mode: str):
    script = os.path.join(folder, "job.py")
    with open(script, "w") as f:
        f.write(KILLED)
    cmd = ["mpiexec", "--oversubscribe", "-n", "2", sys.executable, script, mode,
           os.path.join(folder, "s.zarr")]
    return start_job(cmd)


def generation(path: str) -> set:
    """The values of the store at ``path``, as mpitensor loads it on one rank."""
    back = mt.load(path, init_device_mesh("cpu", (1,)), [Shard(0)]).to_local()
    return set(np.unique(back).tolist())


def saved_again(path: str) -> list:
    """Saves generation 9 over ``path``; what is left beside it."""
    mesh = init_device_mesh("cpu", (1,))
    mt.save(mt.distribute_tensor(np.full((1024, 64), 9.0), mesh, [Shard(0)]), path)
    folder = os.path.dirname(path)
    return [f for f in os.listdir(folder) if f.startswith("s.zarr.") and ".pid." not in f]


@pytest.mark.np(1)
def test_a_save_killed_while_removing_the_old_store_leaves_the_new_one(tmp_path):
    """One rank is killed with SIGKILL halfway through its share of the old store's
    files: the new store loads whole, and the next save removes the rest."""
    run = finish_job(start_killed(str(tmp_path), "removing"), 100)
    out = run.stdout + run.stderr
    path = str(tmp_path / "s.zarr")
    assert run.returncode != 0, out
    left = [f for f in os.listdir(tmp_path) if f.startswith("s.zarr.")]
    assert generation(path) == {2.0}, out
    assert left, "the killed save left nothing of the old store: it was not killed midway"
    assert saved_again(path) == [] and generation(path) == {9.0}


@pytest.mark.np(1)
@pytest.mark.timeout(300)
def test_saves_killed_at_any_moment_leave_one_whole_store(tmp_path):
    """Both ranks of a job that saves over its store again and again are killed
    with SIGKILL, eight times a little later each: the store loads as one save's,
    whole, and the next save removes what the killed one left. The eight share a
    budget below the test's own timeout, after which the job is killed whole (a
    loaded machine makes each job's start several times longer than alone)."""
    path, left_any = str(tmp_path / "s.zarr"), 0
    until = time.monotonic() + 270
    for attempt in range(8):
        shutil.rmtree(path, ignore_errors=True)
        job = start_killed(str(tmp_path), "loop")
        try:
            pids = [tmp_path / f"s.zarr.pid.{r}" for r in range(2)]
            while not all(p.exists() and p.read_text() for p in pids):
                assert job.poll() is None, "\n".join(job.communicate())
                assert time.monotonic() < until, "the job never saved within the budget"
                time.sleep(0.001)
            time.sleep(0.05 + attempt * 0.037)
            for pid in pids:
                os.kill(int(pid.read_text()), signal.SIGKILL)
                pid.unlink()
            finish_job(job, max(1.0, until - time.monotonic()))
        finally:
            kill_job(job)
        got = generation(path)
        assert len(got) == 1, f"values of several saves: {sorted(got)}"
        left_any += any(f.startswith("s.zarr.") for f in os.listdir(tmp_path))
        assert saved_again(path) == [] and generation(path) == {9.0}
    assert left_any, "no kill left a temporary store: the test did not test it"


def test_what_a_save_does_not_replace(tmp):
    mesh = init_device_mesh("cpu", (N,))
    dt = mt.distribute_tensor(array((N, 2), "float32"), mesh, [Shard(0)])
    folder, file = os.path.join(tmp, "notes.zarr"), os.path.join(tmp, "file.zarr")

    def make():
        os.mkdir(folder)
        open(os.path.join(folder, "notes.txt"), "w").write("mine")
        open(file, "w").write("a file")
    on_first(make)
    p = Problems()
    expect_same_error(p, "a directory of other things", lambda: mt.save(dt, folder),
                      IsADirectoryError, "no Zarr store")
    expect_same_error(p, "a file", lambda: mt.save(dt, file), NotADirectoryError, "a file")
    expect_same_error(p, "no parent", lambda: mt.save(dt, os.path.join(tmp, "no", "x.zarr")),
                      FileNotFoundError, "does not exist")
    p.expect(listing(folder) == ["notes.txt"], "the directory was changed")
    assert p == []


# -- bad stores -------------------------------------------------------------------------

def test_bad_stores_raise_the_same_error_everywhere(tmp):
    mesh = init_device_mesh("cpu", (N,))
    g = array((4 * N, 3), "float64") + 1

    def store(name, **options):
        path = os.path.join(tmp, name)
        a = zarr.create_array(path, shape=g.shape, dtype=g.dtype, chunks=(4, 3), **options)
        a[...] = g
        return path

    def make():
        store("json.zarr")
        with open(os.path.join(tmp, "json.zarr", "zarr.json"), "w") as f:
            f.write("{not json")
        store("size.zarr", compressors=None)
        chunk = os.path.join(tmp, "size.zarr", "c", "0", "0")
        with open(chunk, "r+b") as f:
            f.truncate(os.path.getsize(chunk) - 8)
        store("zstd.zarr")
        with open(os.path.join(tmp, "zstd.zarr", "c", "0", "0"), "wb") as f:
            f.write(os.urandom(64))
        zarr.create_group(os.path.join(tmp, "group.zarr"))
        store("strings.zarr")
        meta = json.load(open(os.path.join(tmp, "strings.zarr", "zarr.json")))
        meta["data_type"] = "no_such_type"
        json.dump(meta, open(os.path.join(tmp, "strings.zarr", "zarr.json"), "w"))
        os.mkdir(os.path.join(tmp, "empty.zarr"))
        zarr.create_array(os.path.join(tmp, "huge.zarr"), shape=(1 << 40, 1 << 20),
                          dtype="f8", chunks=(1, 8))
    on_first(make)
    p = Problems()
    cases = [("missing store", "nothing.zarr", FileNotFoundError, "no Zarr store"),
             ("garbage zarr.json", "json.zarr", ValueError, "no valid Zarr array"),
             ("a chunk of the wrong size", "size.zarr", ValueError, "damaged"),
             ("a garbage chunk", "zstd.zarr", ValueError, "damaged"),
             ("a group", "group.zarr", ValueError, "no valid Zarr array"),
             ("an unknown data type", "strings.zarr", ValueError, "no valid Zarr array"),
             ("no metadata", "empty.zarr", FileNotFoundError, "no Zarr array"),
             ("a huge shape", "huge.zarr", MemoryError, "cannot allocate")]
    for what, name, exc, match in cases:
        expect_same_error(p, what, lambda: mt.load(os.path.join(tmp, name), mesh,
                                                   [Shard(0)]), exc, match)
    good = os.path.join(tmp, "good.zarr")
    mt.save(mt.distribute_tensor(g, mesh, [Shard(0)]), good)
    check_dtensor(p, mt.load(good, mesh, [Shard(1)]), g, "after the errors")
    assert p == []
