"""Checkpoints that never lose data and never leave a rank waiting:
ranks that pass different paths, directory saves that fail or are
killed midway, what may stand at the target of a save (symlinks, FIFOs, devices,
long names), data and directory synced before a save returns, index files that
point outside their checkpoint or are malformed, and a part of a load that some
rank cannot allocate. Every failure raises the same exception, with the same
message, on every rank, and the job goes on.

The jobs killed with SIGKILL and the job traced for fsync are started from the
np=1 run only, as in test_failing_ranks.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import Replicate, Shard, init_device_mesh
from mpi_helpers import (Problems, all_ranks, bits_equal, expect_same_error, finish_job,
                         kill_job, run_job, start_job)
import checkpoint_files as cf
from mpitensor.checkpoint import _io

COMM = MPI.COMM_WORLD
N = COMM.Get_size()
RANK = COMM.Get_rank()



def on_first(action) -> None:
    """Collective: ``action()`` on rank 0, then a barrier."""
    if RANK == 0:
        action()
    COMM.Barrier()


def rows(mesh, salt: int, shape=None) -> mt.DTensor:
    g = cf.global_array(shape or (2 * N + 1, 3), "float32", salt)
    return mt.distribute_tensor(g, mesh, [Shard(0)])


def listing(path: str) -> list:
    return sorted(os.listdir(path))


# -- item 4: every rank must pass the same path ----------------------------------------

@pytest.mark.skipif(N < 2, reason="needs ranks that can pass different paths")
def test_save_with_a_path_per_rank_raises_everywhere_and_writes_nothing(tmp):
    mesh = init_device_mesh("cpu", (N,))
    dt = rows(mesh, 1)
    own_dir = tempfile.mkdtemp(dir=tmp)  # a per-rank mkdtemp(), as a program would make
    p = Problems()
    expect_same_error(p, "file", lambda: mt.save(dt, os.path.join(tmp, f"rank{RANK}.npy")),
                      ValueError, "same path")
    expect_same_error(p, "pid in the name", lambda: mt.save(dt, os.path.join(
        tmp, f"x-{os.getpid()}.npy")), ValueError, "same path")
    expect_same_error(p, "state_dict", lambda: mt.save({"w": dt}, os.path.join(own_dir, "sd")),
                      ValueError, "same path")
    COMM.Barrier()
    p.expect(not any(os.path.exists(os.path.join(tmp, f"rank{r}.npy")) for r in range(N)),
             "a rank's file was written")
    p.expect(not any(f.endswith(".tmp") for f in os.listdir(tmp)), "temporary files left")
    p.expect(os.listdir(own_dir) == [], f"the state_dict wrote {os.listdir(own_dir)}")
    assert p == []


@pytest.mark.skipif(N < 2, reason="needs ranks that can pass different paths")
def test_load_with_a_path_per_rank_raises_everywhere(tmp):
    mesh = init_device_mesh("cpu", (N,))
    for r in range(N):
        mt.save(rows(mesh, r), os.path.join(tmp, f"load{r}.npy"))
        mt.save({"w": rows(mesh, r)}, os.path.join(tmp, f"load{r}"))
    p = Problems()
    expect_same_error(p, "file", lambda: mt.load(os.path.join(tmp, f"load{RANK}.npy"), mesh,
                                                 [Shard(0)]), ValueError, "same path")
    expect_same_error(p, "directory", lambda: mt.load(os.path.join(tmp, f"load{RANK}"), mesh),
                      ValueError, "same path")
    assert p == []


@pytest.mark.skipif(N < 2, reason="needs ranks that can pass different arguments")
def test_load_with_other_placements_or_like_on_one_rank_raises_everywhere(tmp, monkeypatch):
    """The last rank asks for another layout (placements, or a like= entry of another
    shape or placements): every rank raises the same ValueError in the agreement on
    the path, which carries the layout too (no collective is added). Before, each
    rank read the boxes of its own layout and the next collective found the ranks
    in different ones (or, for like=, that rank raised while the others waited)."""
    monkeypatch.setattr(mt._comm, "agree", counted(mt._comm.agree, calls := []))
    mesh = init_device_mesh("cpu", (N,))
    mt.save(rows(mesh, 7), os.path.join(tmp, "layout.npy"))
    mt.save({"w": rows(mesh, 7)}, os.path.join(tmp, "layout"))
    last = RANK == N - 1
    p = Problems()
    expect_same_error(p, "placements", lambda: mt.load(
        os.path.join(tmp, "layout.npy"), mesh, [Replicate()] if last else [Shard(0)]),
        ValueError, "same path, placements and like=")
    expect_same_error(p, "dict placements", lambda: mt.load(
        os.path.join(tmp, "layout"), mesh, {"w": [Replicate()] if last else [Shard(1)]}),
        ValueError, "same path, placements and like=")
    base = rows(mesh, 0)  # the last rank's like= entries below are its own, made locally
    for what, odd in (("like= shape", mt.DTensor.from_local(
            np.zeros((3, 3), np.float32), mesh, [Shard(0)])),
            ("like= placements", mt.DTensor.from_local(
                np.zeros(base.shape, np.float32), mesh, [Replicate()]))):
        like = {"w": odd if last else base}
        expect_same_error(p, what, lambda: mt.load(os.path.join(tmp, "layout"), like=like),
                          ValueError, "same path, placements and like=")
    calls.clear()
    back = mt.load(os.path.join(tmp, "layout.npy"), mesh, [Shard(0)])
    p.expect(all_ranks(bits_equal(back.full_tensor(), rows(mesh, 7).full_tensor())),
             "the same layout everywhere loads")
    # the path's, which carries the layout, and the allocation's: as many as before
    p.expect(len(calls) == 2, f"{len(calls)} agreements in a load of one file")
    assert p == []


def counted(fn, calls: list):
    """fn, appending its arguments to ``calls`` at each call."""
    def wrapper(*args):
        calls.append(args)
        return fn(*args)
    return wrapper


def test_the_same_file_named_differently_on_each_rank_is_the_same_path(tmp):
    """Paths are compared with symlinks resolved: a link on some ranks and the
    file itself on the others name one file."""
    mesh = init_device_mesh("cpu", (N,))
    real = os.path.join(tmp, "named.npy")
    link = os.path.join(tmp, "named-link.npy")
    on_first(lambda: os.symlink("named.npy", link))
    dt = rows(mesh, 3)
    mt.save(dt, link if RANK % 2 else real)
    back = mt.load(real if RANK % 2 else link, mesh, [Replicate()])
    assert all_ranks(bits_equal(back.to_local(), dt.full_tensor()) and os.path.islink(link))


# -- item 5: a state_dict save is all or nothing -------------------------------------

def four(mesh, salt: int) -> dict:
    return {k: rows(mesh, salt * 10 + i) for i, k in enumerate("abcd")}


def check_loads_as(p: Problems, path: str, state: dict, what: str) -> None:
    back = mt.load(path, like=state)
    for k, v in state.items():
        p.expect(bits_equal(back[k].full_tensor(), v.full_tensor()), f"{what}: {k} differs")


def test_a_failure_on_one_entry_leaves_the_previous_checkpoint(tmp, monkeypatch):
    """The second entry's save fails (a bad box on the last rank, which the core
    refuses on every rank): load still returns the previous save, whole, and no
    file of the failed save is left."""
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "entry_b")
    old = four(mesh, 1)
    mt.save(old, path)
    before = listing(path)
    real, calls = mt.checkpoint._io.io_save, []

    def fail_on_b(mesh_, path_, header, shape, itemsize, offset, box_offset, box_shape, buf, **kw):
        calls.append(path_)
        if len(calls) == 2 and RANK == N - 1:
            box_offset = (shape[0],) + tuple(box_offset[1:])
            box_shape = (1,) + tuple(box_shape[1:])
            buf = np.zeros(int(np.prod(box_shape)) * itemsize, np.uint8)
        return real(mesh_, path_, header, shape, itemsize, offset, box_offset, box_shape, buf, **kw)

    monkeypatch.setattr(mt.checkpoint._io, "io_save", fail_on_b)
    p = Problems()
    expect_same_error(p, "entry b", lambda: mt.save(four(mesh, 2), path), IndexError,
                      "outside")
    monkeypatch.undo()
    check_loads_as(p, path, old, "after the failed save")
    p.expect(listing(path) == before, f"{before} became {listing(path)}")
    assert p == []


def test_a_failed_save_over_an_index_that_does_not_parse_removes_nothing(tmp, monkeypatch):
    """With no index to tell which files are the checkpoint's, a failed save must
    not remove the files it did not write (c and d, of the earlier save)."""
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "unparsed")
    old = four(mesh, 4)
    mt.save(old, path)
    write_index(path, "{broken")
    real, calls = mt.checkpoint._io.io_save, []

    def fail_on_b(mesh_, path_, header, shape, itemsize, offset, box_offset, box_shape, buf, **kw):
        calls.append(path_)
        if len(calls) == 2:
            box_offset = (shape[0],) + tuple(box_offset[1:])
        return real(mesh_, path_, header, shape, itemsize, offset, box_offset, box_shape, buf, **kw)

    monkeypatch.setattr(mt.checkpoint._io, "io_save", fail_on_b)
    p = Problems()
    expect_same_error(p, "entry b", lambda: mt.save(four(mesh, 5), path), IndexError,
                      "outside")
    for k in "cd":
        p.expect(bits_equal(np.load(os.path.join(path, f"{k}.npy")), old[k].full_tensor()),
                 f"{k}.npy was removed or changed")
    assert p == []


def test_saves_alternate_names_and_remove_the_previous_files(tmp):
    """Each save writes names the current index does not use, then removes the
    previous save's files, those of keys it no longer has too; files that are not
    the checkpoint's stay."""
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "alternate")
    p = Problems()
    for salt, keys in ((1, "abcd"), (2, "abc"), (3, "abcd")):
        state = {k: v for k, v in four(mesh, salt).items() if k in keys}
        mt.save(state, path)
        on_first(lambda: open(os.path.join(path, "notes.txt"), "w").close())
        with open(os.path.join(path, "index.json")) as f:
            files = sorted(e["file"] for e in json.load(f)["entries"].values())
        p.expect(listing(path) == sorted(["index.json", "notes.txt", *files]),
                 f"save {salt}: {listing(path)}")
        check_loads_as(p, path, state, f"save {salt}")
    p.expect(files == ["a.npy", "b.npy", "c.npy", "d.npy"], f"third save: {files}")
    assert p == []


KILLED = """
import os, signal, sys
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Shard
from mpitensor.checkpoint import _tensor

mode, target, cols = sys.argv[1], sys.argv[2], int(sys.argv[3])
comm = MPI.COMM_WORLD
mesh = mt.init_device_mesh("cpu", (comm.Get_size(),))


def state(gen):
    return {k: mt.distribute_tensor(np.full((64, cols), gen * 10 + i, np.float64), mesh,
                                    [Shard(0)]) for i, k in enumerate("abcd")}


mt.save(state(0), target)
comm.Barrier()
if mode == "between":
    real, count = _tensor.save_dtensor, [0]

    def killing(dt, file, **kw):
        count[0] += 1
        if count[0] == 3 and comm.Get_rank() == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(dt, file, **kw)

    _tensor.save_dtensor = killing
    mt.save(state(1), target)
else:
    folder = os.path.dirname(target)
    open(os.path.join(folder, f"pid.{comm.Get_rank()}"), "w").write(str(os.getpid()))
    gen = 1
    while True:
        mt.save(state(gen), target)
        gen += 1
"""


def start_killed(folder: str, mode: str, cols: int) -> subprocess.Popen:
    script = os.path.join(folder, "job.py")
    with open(script, "w") as f:
        f.write(KILLED)
    cmd = ["mpiexec", "--oversubscribe", "-n", "2", sys.executable, script, mode,
           os.path.join(folder, "ckpt"), str(cols)]
    return start_job(cmd)


def generations(path: str) -> list:
    """The generation each entry of the checkpoint at ``path`` holds, as loaded."""
    back = mt.load(path, init_device_mesh("cpu", (1,)))
    return [int(back[k].to_local()[0, 0]) // 10 for k in "abcd"]


def stale(path: str) -> list:
    """What a save left that the index does not name."""
    with open(os.path.join(path, "index.json")) as f:
        named = {e["file"] for e in json.load(f)["entries"].values()}
    return sorted(set(os.listdir(path)) - named - {"index.json"})


def save_again(path: str) -> None:
    mesh = init_device_mesh("cpu", (1,))
    mt.save({k: mt.distribute_tensor(np.full((64, 8), 90.0 + i), mesh, [Shard(0)])
             for i, k in enumerate("abcd")}, path)


@pytest.mark.np(1)
def test_a_save_killed_between_entries_leaves_the_previous_checkpoint(tmp_path):
    """Rank 0 is killed with SIGKILL after two of the four new entries are written:
    load returns the previous save whole, and the next save removes the rest."""
    run = finish_job(start_killed(str(tmp_path), "between", 8), 100)
    path = str(tmp_path / "ckpt")
    assert run.returncode != 0, run.stdout + run.stderr
    left = stale(path)
    assert generations(path) == [0, 0, 0, 0]
    assert left, "the killed save left nothing: it was not killed midway"
    save_again(path)
    assert stale(path) == [] and generations(path) == [9, 9, 9, 9]


@pytest.mark.np(1)
@pytest.mark.timeout(300)
def test_saves_killed_while_writing_leave_a_whole_checkpoint(tmp_path):
    """Both ranks are killed with SIGKILL while an entry of 4 MiB is being written
    (its temporary file exists), four times at different points: load returns one
    save's entries, all of them, and the next save removes the temporary file and
    the other leftovers. The four share a budget below the test's own timeout,
    after which the job is killed whole: a machine that runs clang-tidy beside this
    pass, as make test does, makes each job's start and catch take several times
    longer than alone."""
    path, left_a_temp = str(tmp_path / "ckpt"), 0
    until = time.monotonic() + 270
    for attempt in range(4):
        shutil.rmtree(path, ignore_errors=True)
        for f in tmp_path.glob("pid.*"):
            f.unlink()
        job = start_killed(str(tmp_path), "loop", 8192)
        try:
            pids = wait_for_temp(tmp_path, path, job, attempt, until)
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
            finish_job(job, max(1.0, until - time.monotonic()))
        finally:
            kill_job(job)
        gens = generations(path)
        assert len(set(gens)) == 1, f"entries of different saves: {gens}"
        left_a_temp += any(f.endswith(".tmp") for f in os.listdir(path))
        save_again(path)
        assert stale(path) == [], stale(path)
        assert generations(path) == [9, 9, 9, 9]
    assert left_a_temp, "no kill left a temporary file: the test did not test it"


def wait_for_temp(folder, path: str, job, attempt: int, until: float) -> list:
    """The ranks' pids, once a temporary file of a later save holds data, before the
    time ``until`` (time.monotonic's)."""
    while time.monotonic() < until:
        assert job.poll() is None, "\n".join(job.communicate())
        pids = [folder / f"pid.{r}" for r in range(2)]
        names = os.listdir(path) if os.path.isdir(path) else []
        busy = [n for n in names if ".npy." in n and n.endswith(".tmp")]
        if all(p.exists() and p.read_text() for p in pids) and busy:
            # A little later each time, to kill at other points of the write.
            time.sleep(attempt * 0.003)
            return [int(p.read_text()) for p in pids]
        time.sleep(0.0005)
    raise AssertionError("no temporary file appeared within the test's budget")


# -- item 6: what may stand at the target of a save -----------------------------------

def test_saving_through_a_symlink_replaces_its_target(tmp):
    """As numpy.save: the link stays and its target gets the new data, also a
    target that does not exist yet."""
    mesh = init_device_mesh("cpu", (N,))
    target, link = os.path.join(tmp, "target.npy"), os.path.join(tmp, "link.npy")
    made, dangling = os.path.join(tmp, "made.npy"), os.path.join(tmp, "dangling.npy")

    def setup():
        np.save(target, np.zeros(3))
        os.symlink("target.npy", link)
        os.symlink("made.npy", dangling)

    on_first(setup)
    dt, other = rows(mesh, 4), rows(mesh, 5)
    mt.save(dt, link)
    mt.save(other, dangling)
    p = Problems()
    p.expect(os.path.islink(link) and os.path.islink(dangling), "a link was replaced")
    p.expect(bits_equal(np.load(target), dt.full_tensor()), "the target was not written")
    p.expect(bits_equal(np.load(made), other.full_tensor()), "the new target is wrong")
    assert p == []


def test_anything_but_a_regular_file_is_refused_on_every_rank(tmp):
    mesh = init_device_mesh("cpu", (N,))
    fifo, device = os.path.join(tmp, "fifo.npy"), os.path.join(tmp, "null.npy")
    is_root = os.geteuid() == 0

    def setup():
        os.mkfifo(fifo)
        if is_root:  # a copy of /dev/null, which a save as root used to replace
            os.mknod(device, stat.S_IFCHR | 0o666, os.makedev(1, 3))

    on_first(setup)
    dt = rows(mesh, 6)
    p = Problems()
    expect_same_error(p, "FIFO", lambda: mt.save(dt, fifo), OSError, "FIFO")
    expect_same_error(p, "state_dict entry onto a FIFO", lambda: mt.save(
        {"fifo": dt}, tmp), OSError, "FIFO")
    expect_same_error(p, "load a FIFO", lambda: mt.load(fifo, mesh), OSError, "FIFO")
    p.expect(stat.S_ISFIFO(os.stat(fifo).st_mode), "the FIFO was replaced")
    if is_root:
        expect_same_error(p, "device", lambda: mt.save(dt, device), OSError,
                          "character device")
        p.expect(stat.S_ISCHR(os.stat(device).st_mode), "the device node was replaced")
    expect_same_error(p, "directory", lambda: mt.save(dt, tmp), IsADirectoryError,
                      "directory")
    assert p == []


def test_a_name_of_251_characters_saves(tmp):
    """numpy.save takes it; the temporary name beside it must fit too."""
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "n" * 247 + ".npy")
    on_first(lambda: np.save(path, np.zeros(1)))  # NumPy accepts the name
    dt = rows(mesh, 7)
    mt.save(dt, path)
    back = mt.load(path, mesh, [Shard(1)])
    assert all_ranks(bits_equal(np.load(path), dt.full_tensor())
                     and bits_equal(back.full_tensor(), dt.full_tensor()))


def test_the_next_save_removes_what_a_killed_save_of_its_file_left(tmp):
    """Temporary files of the same target, in this version's form and the earlier
    one, go; those of other files and other names stay."""
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "left.npy")
    theirs = ["left.npy.7b-17f0a3c2d.tmp", "left.npy.mpitensor-123-456.tmp"]
    others = ["left.npy2.7b-17f0a3c2d.tmp", "left.npy.notes.tmp", "right.npy.7b-1.tmp"]

    def setup():
        for name in theirs + others:
            with open(os.path.join(tmp, name), "wb") as f:
                f.write(b"x" * 100)

    on_first(setup)
    mt.save(rows(mesh, 8), path)
    names = set(os.listdir(tmp))
    assert all_ranks(not names & set(theirs) and set(others) <= names), names


@pytest.mark.np(1)
@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_data_and_directory_are_synced_around_the_rename(tmp_path):
    """An LD_PRELOAD spy logs fsync and rename in a 2-rank job: for each file
    saved, its temporary file is synced before it is renamed into place, and the
    directory after (the four ways a save writes: independent runs, the gathered
    or slab path, collective MPI-IO, and index.json), and so is a file saved over
    an existing one, which the save swaps into place (renameat2's exchange)."""
    spy = tmp_path / "spy.so"
    (tmp_path / "spy.c").write_text(SPY)
    subprocess.run(["cc", "-shared", "-fPIC", "-O1", "-o", str(spy),
                    str(tmp_path / "spy.c"), "-ldl"], check=True)
    (tmp_path / "job.py").write_text(SPIED)
    log, folder = tmp_path / "log", os.path.realpath(tmp_path)
    cmd = ["mpiexec", "--oversubscribe", "-n", "2", "-x", f"LD_PRELOAD={spy}", "-x",
           f"MT_SPY_LOG={log}", sys.executable, str(tmp_path / "job.py"), folder]
    run = run_job(cmd, 100)
    assert run.returncode == 0, run.stdout + run.stderr
    events = [line.split(" ", 2)[1:] for line in log.read_text().splitlines()]
    for name in ("rows.npy", "cols.npy", "long.npy", "sd/w.npy", "sd/index.json",
                 "twice.npy"):
        target = os.path.join(folder, name)
        saves = 2 if name == "twice.npy" else 1
        assert synced_around_rename(events, target, saves), (name, events)
    if can_exchange(tmp_path):
        assert any(what == "exchange" for what, _ in events), events


def test_exchange_swaps_two_names_or_changes_nothing():
    """The one swap every save uses (mt_io_exchange): two folders trade names
    where the file system can; a missing name is False with nothing changed."""
    with tempfile.TemporaryDirectory() as tmp:
        a, b = os.path.join(tmp, "a"), os.path.join(tmp, "b")
        for name in (a, b):
            os.mkdir(name)
            open(os.path.join(name, os.path.basename(name)), "w").close()
        if _io.exchange(a, b):
            assert os.listdir(a) == ["b"] and os.listdir(b) == ["a"]
        else:
            assert not can_exchange(tmp)
        assert _io.exchange(a, os.path.join(tmp, "missing")) is False
        assert sorted(os.listdir(tmp)) == ["a", "b"]


def can_exchange(folder) -> bool:
    """Whether the file system of ``folder`` swaps two names (renameat2)."""
    import ctypes

    a, b = os.path.join(folder, "swap_a"), os.path.join(folder, "swap_b")
    for name in (a, b):
        open(name, "w").close()
    renameat2 = getattr(ctypes.CDLL(None), "renameat2", None)
    return renameat2 is not None and renameat2(-100, a.encode(), -100, b.encode(), 2) == 0


def synced_around_rename(events: list, target: str, saves: int = 1) -> bool:
    """Each of the ``saves`` renames (or swaps) of a temporary onto ``target`` has
    the temporary synced before it and the directory after it."""
    temp = re.compile(re.escape(target) + r"\.[0-9a-f]+-[0-9a-f]+\.tmp")
    renames = [i for i, (what, args) in enumerate(events)
               if what in ("rename", "exchange") and args.split(" ")[1] == target
               and temp.fullmatch(args.split(" ")[0])]
    if len(renames) != saves:
        return False
    return all(any(what == "fsync" and args == events[i][1].split(" ")[0]
                   for what, args in events[:i])
               and any(what == "fsync" and args == os.path.dirname(target)
                       for what, args in events[i:]) for i in renames)


SPIED = """
import os, sys
import numpy as np
from mpi4py import MPI
import mpitensor as mt
from mpitensor import Shard

folder = sys.argv[1]
mesh = mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),))
for name, shape, dim in (("rows.npy", (8, 4), 0), ("cols.npy", (8, 6), 1),
                         ("long.npy", (2, 1 << 20), 1)):
    mt.save(mt.distribute_tensor(np.ones(shape), mesh, [Shard(dim)]),
            os.path.join(folder, name))
mt.save({"w": mt.distribute_tensor(np.ones((4, 4)), mesh, [Shard(0)])},
        os.path.join(folder, "sd"))
for _ in range(2):
    mt.save(mt.distribute_tensor(np.ones((8, 4)), mesh, [Shard(0)]),
            os.path.join(folder, "twice.npy"))
"""

# Logs "<rank> fsync <path>", "<rank> sync_file_range <path> <at> <len>" (or
# "writeback_start" for one that only starts the write-back), "<rank> fallocate
# <path> <at> <len>", "<rank> dontneed <path> <at> <len>" (posix_fadvise dropping
# cached pages), "<rank> rename <from> <to>" and "<rank> exchange <from> <to>"
# (renameat2 swapping two names) after each call returns (<rank> in
# MPI_COMM_WORLD, -1 outside mpiexec; fallocate before it is made).
# MT_SPY_FAIL="<call>:<rank>:<text>" makes that call (fsync, which fdatasync is
# too, or sync_file_range) fail with EIO on that rank for paths containing <text>.
SPY = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *rank(void) {
  const char *r = getenv("OMPI_COMM_WORLD_RANK");
  return r ? r : "-1";
}

static void note(const char *what, const char *a, const char *b) {
  const char *log = getenv("MT_SPY_LOG");
  char line[3 * PATH_MAX];
  int n = snprintf(line, sizeof line, "%s %s %s%s%s\n", rank(), what, a,
                   b ? " " : "", b ? b : "");
  int fd = log ? open(log, O_WRONLY | O_APPEND | O_CREAT, 0644) : -1;
  if (fd >= 0 && write(fd, line, (size_t)n) >= 0) close(fd);
}

static void path_of(int fd, char *path) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, path, PATH_MAX - 1);
  path[n > 0 ? n : 0] = 0;
}

/* Whether MT_SPY_FAIL names this call on this rank for this path. */
static int failing(const char *what, const char *path) {
  const char *spec = getenv("MT_SPY_FAIL");
  char call[64], who[16], text[PATH_MAX];
  if (!spec || sscanf(spec, "%63[^:]:%15[^:]:%4095s", call, who, text) != 3) return 0;
  return !strcmp(call, what) && !strcmp(who, rank()) && strstr(path, text) != NULL;
}

static int synced(int fd, int (*real)(int)) {
  char path[PATH_MAX];
  path_of(fd, path);
  if (failing("fsync", path)) {
    errno = EIO;
    return -1;
  }
  int rc = real(fd);
  if (rc == 0) note("fsync", path, NULL);
  return rc;
}

int sync_file_range(int fd, off_t at, off_t len, unsigned flags) {
  int (*real)(int, off_t, off_t, unsigned) =
      (int (*)(int, off_t, off_t, unsigned))dlsym(RTLD_NEXT, "sync_file_range");
  char path[PATH_MAX], range[64];
  path_of(fd, path);
  if (failing("sync_file_range", path)) {
    errno = EIO;
    return -1;
  }
  int rc = real(fd, at, len, flags);
  snprintf(range, sizeof range, "%lld %lld", (long long)at, (long long)len);
  /* a write-back only started, not waited for, makes nothing durable */
  if (rc == 0)
    note(flags == SYNC_FILE_RANGE_WRITE ? "writeback_start" : "sync_file_range", path, range);
  return rc;
}

int posix_fadvise(int fd, off_t at, off_t len, int advice) {
  int (*real)(int, off_t, off_t, int) =
      (int (*)(int, off_t, off_t, int))dlsym(RTLD_NEXT, "posix_fadvise");
  char path[PATH_MAX], range[64];
  path_of(fd, path);
  int rc = real(fd, at, len, advice);
  snprintf(range, sizeof range, "%lld %lld", (long long)at, (long long)len);
  if (rc == 0 && advice == POSIX_FADV_DONTNEED) note("dontneed", path, range);
  return rc;
}

int fallocate(int fd, int mode, off_t at, off_t len) {
  int (*real)(int, int, off_t, off_t) =
      (int (*)(int, int, off_t, off_t))dlsym(RTLD_NEXT, "fallocate");
  char path[PATH_MAX], range[64];
  path_of(fd, path);
  snprintf(range, sizeof range, "%lld %lld", (long long)at, (long long)len);
  note("fallocate", path, range); /* asked for, whether the file system can or not */
  return real(fd, mode, at, len);
}

int fsync(int fd) { return synced(fd, (int (*)(int))dlsym(RTLD_NEXT, "fsync")); }

int fdatasync(int fd) { return synced(fd, (int (*)(int))dlsym(RTLD_NEXT, "fdatasync")); }

int rename(const char *from, const char *to) {
  int (*real)(const char *, const char *) =
      (int (*)(const char *, const char *))dlsym(RTLD_NEXT, "rename");
  int rc = real(from, to);
  if (rc == 0) note("rename", from, to);
  return rc;
}

int renameat2(int dfrom, const char *from, int dto, const char *to, unsigned flags) {
  int (*real)(int, const char *, int, const char *, unsigned) =
      (int (*)(int, const char *, int, const char *, unsigned))dlsym(RTLD_NEXT,
                                                                     "renameat2");
  int rc = real(dfrom, from, dto, to, flags);
  if (rc == 0) note((flags & RENAME_EXCHANGE) ? "exchange" : "rename", from, to);
  return rc;
}
"""


# -- item 7: what index.json may name ----------------------------------------------

def test_index_entries_outside_the_checkpoint_are_refused(tmp):
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "hostile")
    mt.save({"w": rows(mesh, 9)}, path)
    secret = os.path.join(tmp, "secret.npy")
    on_first(lambda: (np.save(secret, np.arange(3.0)),
                      os.symlink("../secret.npy", os.path.join(path, "out.npy")),
                      os.mkfifo(os.path.join(path, "fifo.npy"))))
    with open(os.path.join(path, "index.json")) as f:
        good = json.load(f)
    COMM.Barrier()  # read everywhere before rank 0 rewrites it
    p = Problems()
    for what, file, exc, match in (
            ("relative", "../secret.npy", ValueError, "outside"),
            ("absolute", secret, ValueError, "outside"),
            ("symlink out", "out.npy", ValueError, "outside"),
            ("the directory", ".", ValueError, "outside"),
            ("a FIFO", "fifo.npy", OSError, "FIFO"),
            ("missing", "gone.npy", FileNotFoundError, "does not exist")):
        index = json.loads(json.dumps(good))
        index["entries"]["w"]["file"] = file
        write_index(path, json.dumps(index))
        expect_same_error(p, what, lambda: mt.load(path, mesh), exc,
                          re.escape(repr(path)) + ".*" + match)
    write_index(path, json.dumps(good))
    check_loads_as(p, path, {"w": rows(mesh, 9)}, "the good index")
    assert p == []


def write_index(path: str, text: str) -> None:
    def write():
        with open(os.path.join(path, "index.json"), "w") as f:
            f.write(text)

    on_first(write)


def test_a_malformed_index_raises_a_clear_error_naming_the_checkpoint(tmp):
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "malformed")
    mt.save({"w": rows(mesh, 10)}, path)
    with open(os.path.join(path, "index.json")) as f:
        good = json.load(f)
    COMM.Barrier()  # read everywhere before rank 0 rewrites it

    def entry(**change):
        index = json.loads(json.dumps(good))
        index["entries"]["w"].update(change)
        for k, v in change.items():
            if v is None:
                del index["entries"]["w"][k]
        return json.dumps(index)

    p = Problems()
    for what, text in (("not JSON", "{not json"), ("a list", "[1, 2]"),
                       ("entries a list", json.dumps({**good, "entries": [1]})),
                       ("entry a string", json.dumps({**good, "entries": {"w": "w.npy"}})),
                       ("no file", entry(file=None)), ("file a number", entry(file=3)),
                       ("no shape", entry(shape=None)), ("shape text", entry(shape="4")),
                       ("negative size", entry(shape=[-1, 3])),
                       ("bad dtype", entry(dtype="<x9")), ("bad kind", entry(kind="list")),
                       ("bad placement", entry(placements=["X"])),
                       ("no mesh shape", entry(mesh_shape=None))):
        write_index(path, text)
        expect_same_error(p, what, lambda: mt.load(path, mesh), ValueError,
                          re.escape(repr(path)) + ".*index.json")
    assert p == []


# -- item 8 (load): a part that some rank cannot allocate -----------------------------

def resume_or_start_fresh(path: str, mesh):
    """The usual pattern: resume from the checkpoint, else start afresh."""
    try:
        return mt.load(path, mesh, [Shard(0)]), "resumed"
    except (OSError, MemoryError, ValueError):
        return mt.zeros((4, 4), device_mesh=mesh, placements=[Shard(0)]), "fresh"


def huge_header(shape) -> bytes:
    from mpitensor.checkpoint import _npy

    return _npy.encode(shape, np.dtype(np.float64))


def test_a_truncated_file_claiming_a_huge_shape_raises_everywhere(tmp):
    """The header says (1, 5e11) float64 (4 TB) and the file holds a few bytes: the
    rank holding the row must not try to allocate it while the others read."""
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "huge-truncated.npy")

    def write():
        with open(path, "wb") as f:
            f.write(huge_header((1, 5 * 10**11)) + b"\0" * 64)

    on_first(write)
    p = Problems()
    expect_same_error(p, "load", lambda: mt.load(path, mesh, [Shard(0)]), OSError,
                      "truncated")
    w, how = resume_or_start_fresh(path, mesh)
    p.expect(how == "fresh" and np.array_equal(w.full_tensor(), np.zeros((4, 4))), how)
    assert p == []


def overcommits() -> bool:
    try:
        with open("/proc/sys/vm/overcommit_memory") as f:
            return f.read().strip() == "1"
    except OSError:
        return True


@pytest.mark.skipif(overcommits(), reason="an allocation of 4 TiB would succeed lazily")
def test_a_part_too_large_to_allocate_raises_everywhere(tmp):
    """A sparse file of 4 TiB that holds the array its header describes: the rank
    holding the row cannot allocate it; every rank raises MemoryError."""
    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "huge-sparse.npy")
    head, cols = huge_header((1, 1 << 39)), 1 << 39

    def write():
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(len(head) + 8 * cols)

    on_first(write)
    p = Problems()
    expect_same_error(p, "load", lambda: mt.load(path, mesh, [Shard(0)]), MemoryError,
                      "cannot allocate")
    w, how = resume_or_start_fresh(path, mesh)
    p.expect(how == "fresh" and np.array_equal(w.full_tensor(), np.zeros((4, 4))), how)
    on_first(lambda: os.unlink(path))
    assert p == []


def test_an_allocation_failing_on_the_last_rank_only_raises_everywhere(tmp, monkeypatch):
    from mpitensor.checkpoint import _tensor

    mesh = init_device_mesh("cpu", (N,))
    path = os.path.join(tmp, "alloc.npy")
    dt = rows(mesh, 11)
    mt.save(dt, path)
    real = _tensor._allocate

    def failing(*args):
        if RANK == N - 1:
            raise MemoryError("no room on this rank")
        return real(*args)

    monkeypatch.setattr(_tensor, "_allocate", failing)
    p = Problems()
    for pl in ([Shard(0)], [Shard(1)], [Replicate()]):
        expect_same_error(p, f"{pl}", lambda: mt.load(path, mesh, pl), MemoryError,
                          "cannot allocate")
    monkeypatch.undo()
    back = mt.load(path, mesh, [Shard(1)])
    p.expect(bits_equal(back.full_tensor(), dt.full_tensor()), "the next load differs")
    assert p == []
