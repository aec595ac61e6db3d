"""``mt.save(..., durable=False)`` skips the syncs, as numpy.save
makes none; ``durable=True`` (the default) makes a save durable with the fewest
syncs: each rank writes back the bytes it wrote (sync_file_range of its range),
then one rank fsyncs the file; a Zarr store's chunk files are synced by their
writers and each of its folders once. A sync that fails on one rank raises on
every rank. An LD_PRELOAD spy (test_checkpoint_safety.SPY) logs the syncs of a
2- or 3-rank job started from the np=1 run, and fails the ones it is told to.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
import sys

import h5py
import pytest
from mpi4py import MPI

from mpi_helpers import run_job
from test_checkpoint_safety import SPY

N = MPI.COMM_WORLD.Get_size()

JOB = """
import os, sys
import h5py
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Shard

folder, durable = sys.argv[1], sys.argv[2] == "1"
mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
x = mt.distribute_tensor(np.arange(24.0).reshape(6, 4) + 1, mesh, [Shard(0)])
mt.save(x, os.path.join(folder, "x.zarr"), durable=durable)
mt.save(x, os.path.join(folder, "x.zarr"), durable=durable)  # replacing a store
if MPI.COMM_WORLD.Get_rank() == 0:
    with h5py.File(os.path.join(folder, "f.h5"), "w") as f:
        f.create_dataset("a", data=np.arange(3))
    os.mkdir(os.path.join(folder, "n"))
MPI.COMM_WORLD.Barrier()
mt.save(x, os.path.join(folder, "f.h5"), dataset="x", mode="a", durable=durable)
mt.save({"w": x}, os.path.join(folder, "sd"), durable=durable)
mt.save(x, os.path.join(folder, "n", "x.npy"), durable=durable)
mt.save(x.redistribute(mesh, [Shard(1)]), os.path.join(folder, "n", "cols.npy"),
        durable=durable)  # row slabs after an exchange
mt.save(x, os.path.join(folder, "n", "x.h5"), dataset="x", durable=durable)
"""


def run_spied(tmp_path, job: str, args: list, ranks: int = 2, fail: str = "") -> tuple:
    """Runs ``job`` on ``ranks`` ranks under the spy (failing what ``fail`` names,
    MT_SPY_FAIL) with a new folder as its first argument: (folder, the spy's
    events, the job's output)."""
    spy = tmp_path / "spy.so"
    (tmp_path / "spy.c").write_text(SPY)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(spy),
                    str(tmp_path / "spy.c"), "-ldl"], check=True)
    (tmp_path / "job.py").write_text(job)
    folder = os.path.realpath(tmp_path / "out")
    os.mkdir(folder)
    log = tmp_path / "log"
    cmd = ["mpiexec", "--oversubscribe", "-n", str(ranks), "-x", f"LD_PRELOAD={spy}",
           "-x", f"MT_SPY_LOG={log}", "-x", f"MT_SPY_FAIL={fail}", sys.executable,
           str(tmp_path / "job.py"), folder, *args]
    run = run_job(cmd, 100)
    assert run.returncode == 0, run.stdout + run.stderr
    return folder, spy_events(log), run.stdout


def spied_syncs(tmp_path, durable: bool) -> list:
    """The paths that a 2-rank job of JOB synced or started writing back."""
    folder, events, _ = run_spied(tmp_path, JOB, ["1" if durable else "0"])
    # a started write-back (sync_file_range) counts as a sync: numpy.save starts none
    return [os.path.relpath(path, folder) for _, what, path, _ in events
            if what in ("fsync", "sync_file_range")]


def spy_events(log) -> list:
    """The spy's log as (rank, call, path, range): range is (at, len) for
    sync_file_range, writeback_start, fallocate and dontneed, else None (and path
    the first of a rename's two)."""
    out = []
    for line in log.read_text().splitlines() if log.exists() else []:
        rank, what, args = line.split(" ", 2)
        if what in ("sync_file_range", "writeback_start", "fallocate", "dontneed"):
            path, at, n = args.rsplit(" ", 2)
            out.append((int(rank), what, path, (int(at), int(n))))
        else:
            out.append((int(rank), what, args.split(" ")[0], None))
    return out


needs_a_job = [pytest.mark.np(1),
               pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")]


@needs_a_job[0]
@needs_a_job[1]
def test_durable_saves_sync_what_they_write(tmp_path):
    synced = spied_syncs(tmp_path, True)
    chunks = [s for s in synced if ".tmp/c." in s and s.startswith("x.zarr.")]
    assert len(chunks) >= 2, synced  # both ranks' chunks, in both saves
    assert any(s.startswith("x.zarr.") and s.endswith("zarr.json") for s in synced), synced
    assert "." in synced, synced  # the folder, after the store's rename
    assert "f.h5" in synced, synced
    assert any(s.startswith("sd/index.json.") for s in synced), synced


@needs_a_job[0]
@needs_a_job[1]
def test_saves_that_are_not_durable_sync_nothing_that_python_writes(tmp_path):
    synced = spied_syncs(tmp_path, False)
    # the core's: the .npy file and the entry (and their folders)
    ours = [s for s in synced if not s.startswith(("n/", "sd/w")) and s not in ("n", "sd")]
    assert ours == [], synced


@needs_a_job[0]
@needs_a_job[1]
def test_a_npy_save_that_is_not_durable_syncs_nothing(tmp_path):
    assert spied_syncs(tmp_path, False) == []


# -- what each rank syncs: its own bytes, then one fsync of the whole file -----------

RANGES = """
import os, sys
import h5py
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Shard

folder = sys.argv[1]
mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
rows = mt.distribute_tensor(np.arange(7.0 * 512).reshape(7, 512), mesh, [Shard(0)])
cols = mt.distribute_tensor(np.arange(48.0).reshape(8, 6), mesh, [Shard(1)])
mt.save(rows, os.path.join(folder, "rows.npy"))  # uneven shards: 3, 3 and 1 rows
mt.save(cols, os.path.join(folder, "cols.npy"))  # row slabs after an exchange
mt.save(rows, os.path.join(folder, "x.h5"), dataset="x")
if MPI.COMM_WORLD.Get_rank() == 0:
    with h5py.File(os.path.join(folder, "f.h5"), "w") as f:
        f.create_dataset("a", data=np.arange(3))
MPI.COMM_WORLD.Barrier()
mt.save(rows, os.path.join(folder, "f.h5"), dataset="y", mode="a")
z = mt.distribute_tensor(np.arange(1.0, 97.0).reshape(4, 6, 4), mesh, [Shard(1)])
mt.save(z, os.path.join(folder, "z.zarr"))
mt.save({"a": rows, "b": rows, "c": cols}, os.path.join(folder, "sd"))
"""


def data_offset(folder: str, name: str, nbytes: int) -> int:
    if name.endswith(".npy"):
        return os.path.getsize(os.path.join(folder, name)) - nbytes
    with h5py.File(os.path.join(folder, name), "r") as f:
        return f["x" if name == "x.h5" else "y"].id.get_offset()


def syncs_of(events: list, path: str) -> tuple:
    """The sync_file_range calls ({rank: (at, len)}) and the ranks of the fsyncs
    of ``path`` or of a temporary file of it, and whether every fsync followed
    every range."""
    temp = re.compile(re.escape(path) + r"(\.[0-9a-f]+-[0-9a-f]+\.tmp)?")
    mine = [(i, e) for i, e in enumerate(events) if temp.fullmatch(e[2])]
    ranges = [(r, span) for _, (r, what, _, span) in mine if what == "sync_file_range"]
    fsyncs = [(i, r) for i, (r, what, _, _) in mine if what == "fsync"]
    last_range = max((i for i, e in mine if e[1] == "sync_file_range"), default=-1)
    return (dict(ranges), len(ranges), [r for _, r in fsyncs],
            all(i > last_range for i, _ in fsyncs))


@pytest.fixture(scope="module", name="ranges")
def ranges_job(tmp_path_factory):
    """(folder, events) of one 3-rank job of RANGES under the spy."""
    folder, events, _ = run_spied(tmp_path_factory.mktemp("ranges"), RANGES, [], ranks=3)
    return folder, events


@needs_a_job[0]
@needs_a_job[1]
def test_each_rank_syncs_its_own_bytes_and_one_rank_the_file(ranges):
    """A 3-rank job saves .npy files (uneven rows, and columns through row slabs),
    a new HDF5 file and a dataset added to one: each rank writes back exactly the
    bytes it wrote (its rows, or its slab of rows), and then one rank fsyncs the
    file once, before the rename."""
    folder, events = ranges
    row = 512 * 8
    # (name, bytes of a row, rows per rank as each rank wrote them)
    cases = [("rows.npy", row, (3, 3, 1)), ("cols.npy", 6 * 8, (2, 3, 3)),
             ("x.h5", row, (3, 3, 1)), ("f.h5", row, (3, 3, 1))]
    for name, size, counts in cases:
        at = data_offset(folder, name, size * sum(counts))
        want = {}
        for r, n in enumerate(counts):
            want[r] = (at, n * size)
            at += n * size
        ranges, calls, fsyncs, after = syncs_of(events, os.path.join(folder, name))
        assert (ranges, calls) == (want, 3), (name, ranges, want)
        assert fsyncs == [0] and after, (name, fsyncs, events)


@needs_a_job[0]
@needs_a_job[1]
def test_zarr_chunks_and_the_store_folder_are_each_synced_once(ranges):
    """Each chunk file by the rank that wrote it; the store's folder, which names
    them all (no folder per chunk), once after every rank's chunks."""
    folder, events = ranges
    store = re.compile(re.escape(os.path.join(folder, "z.zarr."))
                       + r"[0-9a-f]+-[0-9a-f]+\.tmp")
    synced = [(i, r, path) for i, (r, what, path, _) in enumerate(events)
              if what == "fsync" and store.match(path)]
    root = store.match(synced[0][2]).group(0)
    rel = [(i, r, os.path.relpath(p, root)) for i, r, p in synced]
    chunks = {p: r for _, r, p in rel if p.startswith("c.")}
    assert chunks == {f"c.0.{j}.0": j for j in range(3)}, synced
    others = [p for _, _, p in rel if p not in chunks]
    assert sorted(others) == [".", "zarr.json"], synced
    last_chunk = max(i for i, _, p in rel if p in chunks)
    assert all(i > last_chunk for i, _, p in rel if p in others), synced


@needs_a_job[0]
@needs_a_job[1]
def test_a_state_dict_syncs_its_directory_once_for_all_entries(ranges):
    """Each entry's file is synced once, and the directory once after every
    entry is in place (before the index's rename) and once after that rename:
    not once per entry (the list of pending files, written first, has its own)."""
    folder, events = ranges
    sd = os.path.join(folder, "sd")
    renames = [i for i, (_, what, path, _) in enumerate(events)
               if what in ("rename", "exchange") and os.path.dirname(path) == sd
               and not os.path.basename(path).startswith(".pending")]
    dir_syncs = [i for i, (_, what, path, _) in enumerate(events)
                 if what == "fsync" and path == sd and i > renames[0]]
    assert len(renames) == 4 and len(dir_syncs) == 2, events  # 3 entries, the index
    assert renames[2] < dir_syncs[0] < renames[3] < dir_syncs[1], events
    for name in ("a", "b", "c"):
        _, _, fsyncs, _ = syncs_of(events, os.path.join(sd, name + ".npy"))
        assert fsyncs == [0], (name, events)


# -- a durable save allocates its file, and writes back behind its writes -----------

PIECES = """
import os, sys
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Shard

folder = sys.argv[1]
mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
x = mt.distribute_tensor(np.ones((4609, 512)), mesh, [Shard(0)])  # 2305 and 2304 rows
mt.save(x, os.path.join(folder, "x.npy"))
mt.save(x, os.path.join(folder, "x.h5"), dataset="x")
mt.save(x, os.path.join(folder, "loose.npy"), durable=False)
for _ in range(2):  # the second save replaces a file whose pages are cached and clean
    mt.save(x, os.path.join(folder, "again.npy"))
"""

def cachestat_known() -> bool:
    """Whether the core can count a file's dirty pages here (mt_io_release_cache)."""
    release = tuple(int(v) for v in platform.release().split("-")[0].split(".")[:2])
    return (platform.system() == "Linux" and release >= (6, 5)
            and platform.machine() in ("x86_64", "aarch64", "riscv64"))


# csrc/io/io.c's WRITEBACK_PIECE: the file offsets a durable write-back starts at
PIECE = 4 << 20


def pieces(start: int, end: int) -> list:
    """The (at, len) of every piece of the run [start, end) but the last, cut at
    multiples of PIECE."""
    out = []
    while (cut := (start // PIECE + 1) * PIECE) < end:
        out.append((start, cut - start))
        start = cut
    return out


@pytest.fixture(scope="module", name="pieces_job")
def pieces_job_events(tmp_path_factory):
    """(folder, events) of one 2-rank job of PIECES under the spy."""
    folder, events, _ = run_spied(tmp_path_factory.mktemp("pieces"), PIECES, [])
    return folder, events


@needs_a_job[0]
@needs_a_job[1]
def test_a_durable_save_allocates_its_file_and_writes_back_piece_by_piece(pieces_job):
    """Rank 0 asks for the temporary file's blocks at once, for its final size;
    each rank starts the write-back of each piece of its rows as soon as it is
    written, and then waits for its whole run as before. A save that is not
    durable does neither."""
    folder, events = pieces_job
    row, rows = 512 * 8, 4609
    for name in ("x.npy", "x.h5"):
        at = data_offset(folder, name, row * rows)
        temp = re.compile(re.escape(os.path.join(folder, name))
                          + r"\.[0-9a-f]+-[0-9a-f]+\.tmp")
        mine = [(r, what, span) for r, what, path, span in events
                if temp.fullmatch(path)]
        allocated = [(r, span) for r, what, span in mine if what == "fallocate"]
        assert allocated == [(0, (0, at + row * rows))], (name, mine)
        for r, n in enumerate((2305, 2304)):
            calls = [(what, span) for q, what, span in mine
                     if q == r and what in ("writeback_start", "sync_file_range")]
            want = [("writeback_start", p) for p in pieces(at, at + n * row)]
            waited = [("sync_file_range", (at, n * row))]
            assert len(want) == 2 and calls == want + waited, (name, r, calls)
            at += n * row
    loose = [e for e in events
             if "loose.npy" in e[2] and e[1] not in ("rename", "exchange")]
    assert loose == [], loose


@needs_a_job[0]
@needs_a_job[1]
@pytest.mark.skipif(not cachestat_known(), reason="the core counts dirty pages with "
                    "cachestat (Linux 6.5)")
def test_the_ranks_of_a_node_release_the_replaced_file_s_cache_a_share_each(pieces_job):
    """Before a save writes, each rank drops the cached pages of its share of the
    file it replaces (cut on pages; the last share to the end of the file), not
    the first rank all of them while the others wait."""
    folder, events = pieces_job
    path = os.path.join(folder, "again.npy")
    size = os.path.getsize(path)
    half = size // 2 // 4096 * 4096
    dropped = sorted((r, span) for r, what, p, span in events
                     if what == "dontneed" and p == path)
    assert dropped == [(0, (0, half)), (1, (half, 0))], (size, dropped)


# -- a sync that fails on one rank raises on every rank ------------------------------

FAILING = """
import os, sys
import h5py
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Shard

folder = sys.argv[1]
rank = MPI.COMM_WORLD.Get_rank()
said = open(os.path.join(folder, "..", f"said.{rank}"), "w", buffering=1)


def say(*words):
    said.write(" ".join(str(w).replace(chr(10), " ") for w in words) + chr(10))


mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
new = mt.distribute_tensor(np.arange(7.0 * 64).reshape(7, 64), mesh, [Shard(0)])
old = new * 0 - 1
for name in ("bad.npy", "badcols.npy", "bad.h5", "bad.zarr"):
    path, kw = os.path.join(folder, name), {"dataset": "x"} if ".h5" in name else {}
    for x, durable in ((old, False), (new.redistribute(mesh, [Shard(1)]) if "cols" in name
                                      else new, True)):
        try:
            mt.save(x, path, durable=durable, **kw)
            say(name, "saved")
        except Exception as e:
            say(name, type(e).__name__, e)
    back = mt.load(path, mesh, [Shard(0)], **kw)
    say(name, "holds", "old" if np.array_equal(back.full_tensor(), old.full_tensor())
        else "new")
if rank == 0:
    with h5py.File(os.path.join(folder, "add_bad.h5"), "w") as f:
        f.create_dataset("a", data=np.arange(3))
MPI.COMM_WORLD.Barrier()
try:
    mt.save(new, os.path.join(folder, "add_bad.h5"), dataset="badrows", mode="a")
    say("add_bad.h5", "saved")
except Exception as e:
    say("add_bad.h5", type(e).__name__, e)
say("left", ",".join(sorted(n for n in os.listdir(folder) if n.endswith(".tmp"))))
"""


def outcomes(folder) -> dict:
    """What each rank of FAILING said, by (name, what): {rank: the rest}."""
    got = {}
    for rank in range(2):
        for line in (folder / f"said.{rank}").read_text().splitlines():
            name, rest = (line.split(" ", 1) + [""])[:2]
            kind = ("holds" if rest.startswith("holds") else "left" if name == "left"
                    else "save")
            got.setdefault((name, kind), {})[rank] = rest
    return got


@needs_a_job[0]
@needs_a_job[1]
@pytest.mark.parametrize("fail", ["sync_file_range:1:bad", "fsync:0:bad"])
def test_a_failed_sync_on_one_rank_raises_on_every_rank(tmp_path, fail):
    """A rank's write-back of its bytes (rank 1) or the one fsync of the file
    (rank 0; for Zarr, its chunk files) fails with EIO: the save raises OSError on
    both ranks, the previous file or store stays and loads, and no temporary file
    is left; a dataset added to an existing HDF5 file raises on both ranks too."""
    run_spied(tmp_path, FAILING, [], fail=fail)
    got = outcomes(tmp_path)
    names = ["bad.npy", "badcols.npy", "bad.h5", "bad.zarr"]
    if fail.startswith("sync_file_range"):
        names.remove("bad.zarr")  # its chunk files are fsynced whole, not by range
    for name in names + ["add_bad.h5"]:
        said = got[(name, "save")]
        assert sorted(said) == [0, 1] and len(set(said.values())) == 1, (name, got)
        assert said[0].startswith("OSError"), (name, got)
    for name in names:
        assert got[(name, "holds")] == {0: "holds old", 1: "holds old"}, (name, got)
    assert got[("left", "left")] == {0: "", 1: ""}, got
