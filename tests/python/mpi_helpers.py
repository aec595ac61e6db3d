"""Ground truth for the MPI tests, written independently of mpitensor's layout code.

`ref_box` is a brute-force reference of where a shard lies (index arrays cut with
torch.chunk's rule), and `gather_global` rebuilds a DTensor's global array on every
rank from every rank's local array with mpi4py, checking replicas bit for bit.

Fixtures shared by several test files live here too, imported by name
(`from mpi_helpers import cp_mesh, rotate`): the context-parallel mesh and the
rotate methods of ring attention.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
import pytest
from mpi4py import MPI

import mpitensor
from mpitensor import Shard
from mpitensor.experimental import set_rotate_method

COMM = MPI.COMM_WORLD


def fresh_job_env() -> dict:
    """The environment for a new mpiexec job that a test starts: none of the running
    job's Open MPI or PMIx variables, which would make mpiexec think it runs inside
    that job; root allowed, more ranks than cores, one BLAS thread.

    Example, a job with a variable more: ``start_job(["mpiexec", "-n", "2",
    sys.executable, "job.py"], env={**fresh_job_env(), "MPITENSOR_TIMEOUT": "2"})``.
    """
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "OPAL_", "ORTE_"))}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OPENBLAS_NUM_THREADS="1")
    return env


def start_job(cmd, env: dict | None = None) -> subprocess.Popen:
    """Starts an mpiexec job a test starts (in ``env``, by default
    ``fresh_job_env``) in a session of its own, with stdout and stderr piped and
    no stdin (under mpiexec, this rank's stdin is the launcher's forwarding pipe,
    which a job must not hold), and returns at once: for a test that acts on the
    job while it runs. End it with ``finish_job`` or ``kill_job``, never with
    ``proc.kill()``, which ends mpiexec alone and leaves each rank to notice.

    Example: ``job = start_job(["mpiexec", "-n", "2", sys.executable, "job.py"])``.
    """
    return subprocess.Popen(cmd, env=fresh_job_env() if env is None else env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)


def session_members(sid: int) -> list[int]:
    """The pids of the live processes (zombies left out) in the session ``sid``,
    read from /proc (Linux)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:  # ended while we looked
            continue
        # The fields after the command's closing parenthesis: state, ppid, pgrp, session.
        state, _, _, session = stat[stat.rindex(")") + 2:].split()[:4]
        if int(session) == sid and state != "Z":
            found.append(int(name))
    return found


def stacks(proc: subprocess.Popen) -> str:
    """The native stack of every thread of every live process in the session of a
    job ``start_job`` began, by gdb (when the machine has it): what a hung job
    was doing, for the failure's message.

    Example: ``print(stacks(job))``.
    """
    if shutil.which("gdb") is None:
        return "(no gdb: no stacks)"
    out = []
    for pid in session_members(proc.pid):
        run = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt"],
                             capture_output=True, text=True, timeout=10)
        frames = [ln for ln in run.stdout.splitlines() if ln.startswith(("#", "Thread"))]
        out.append(f"pid {pid}:\n" + "\n".join(frames))
    return "\n".join(out)


def kill_job(proc: subprocess.Popen) -> tuple[str, str]:
    """Kills the whole session of a job ``start_job`` began, mpiexec and every rank
    (whatever is left of it: nothing, when it has ended), and returns its
    (stdout, stderr).

    Example: ``try: ... finally: kill_job(job)``.
    """
    # Open MPI gives each rank a process group of its own inside mpiexec's session,
    # so killing mpiexec's group would leave the ranks to notice on their own: each
    # member of the session is killed, until none is left (mpiexec may be forking).
    for _ in range(100):
        members = session_members(proc.pid)
        if not members:
            break
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)
    return proc.communicate()


def finish_job(proc: subprocess.Popen, timeout: float) -> subprocess.CompletedProcess:
    """Waits for a job ``start_job`` began; on ``timeout`` kills its whole session
    and raises AssertionError naming the command. A test runner that times out
    first would leave the job running, so ``timeout`` stays below the suite's
    per-test timeout.

    Example: ``run = finish_job(job, 100); assert run.returncode == 0, run.stderr``.
    """
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = kill_job(proc)
        raise AssertionError(f"{' '.join(map(str, proc.args))} ran past {timeout} s "
                             f"and was killed with its ranks\n{out}\n{err}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def run_job(cmd, timeout: float) -> subprocess.CompletedProcess:
    """Runs an mpiexec job a test starts to its end: ``start_job`` then
    ``finish_job``, which kills mpiexec and every rank on ``timeout``.

    Example: ``run_job(["mpiexec", "-n", "8", sys.executable, "job.py"], 100)``.
    """
    return finish_job(start_job(cmd), timeout)


def run_script(source: str, ranks: int, timeout: float, **env) -> subprocess.CompletedProcess:
    """Runs the program ``source``, written to ``job.py`` in a temporary directory,
    as a job of ``ranks`` ranks (more than cores allowed) in ``fresh_job_env`` with
    ``env``'s variables added, to its end: ``finish_job``'s terms.

    Example: ``run_script("print(1)", 2, 30, MPITENSOR_TIMEOUT="3").stdout``.
    """
    with tempfile.TemporaryDirectory() as where:
        script = os.path.join(where, "job.py")
        with open(script, "w") as f:
            f.write(source)
        return finish_job(start_job(["mpiexec", "--oversubscribe", "-n", str(ranks),
                                     sys.executable, script],
                                    env={**fresh_job_env(), **env}), timeout)


@pytest.fixture(scope="module", name="mesh")
def cp_mesh():
    """The 1-D mesh of every rank with its dim named "cp", as `mesh`."""
    return mpitensor.init_device_mesh("cpu", (COMM.Get_size(),), mesh_dim_names=("cp",))


@pytest.fixture(params=["allgather", "alltoall"])
def rotate(request):
    """Each rotate method of ring attention in turn; the default after."""
    set_rotate_method(request.param)
    yield request.param
    set_rotate_method("allgather")


def chunk(indices: np.ndarray, k: int, i: int) -> np.ndarray:
    """Piece i of k of `indices` by torch.chunk's rule: pieces of ceil(n/k), the
    trailing ones short or empty (numpy.array_split would spread the remainder)."""
    size = -(-len(indices) // k)
    return indices[i * size:(i + 1) * size]


def ref_box(global_shape, mesh_shape, coord, placements):
    """(local shape, global offset) of the shard at mesh coordinate `coord`.

    Each tensor dim starts as the index array arange(n); every Shard mesh dim, left
    to right, keeps its chunk of the indices that are left. An empty extent reports
    the global size as offset."""
    ndim = len(global_shape)
    idx = [np.arange(n) for n in global_shape]
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            d = p.dim + ndim if p.dim < 0 else p.dim
            idx[d] = chunk(idx[d], mesh_shape[m], coord[m])
    shape = tuple(len(i) for i in idx)
    offset = tuple(int(i[0]) if len(i) else n for i, n in zip(idx, global_shape))
    return shape, offset


def ref_index(global_shape, mesh_shape, coord, placements):
    """The slices of the global array that the shard at `coord` holds."""
    shape, offset = ref_box(global_shape, mesh_shape, coord, placements)
    return tuple(slice(o, o + s) for o, s in zip(offset, shape))


def coordinates(mesh_shape):
    """Every coordinate of a mesh, row-major."""
    return itertools.product(*(range(s) for s in mesh_shape))


def bits_equal(a, b) -> bool:
    """Same shape, dtype and bytes (NaN-safe, -0.0 differs from 0.0)."""
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def gather_global(dt, comm=COMM):
    """Collective on `comm`. Rebuilds the global array of a Shard/Replicate DTensor.

    Returns (array, problems): `problems` lists, identically on every rank, the ranks
    whose local array is not the shape/dtype of its reference box, replicas that
    disagree, and elements nobody holds. The test asserts `problems == []`."""
    mesh = dt.device_mesh
    coord = mesh.get_coordinate()
    mine = None if coord is None else (tuple(coord), dt.to_local())
    items = comm.allgather(mine)
    out = np.zeros(dt.shape, dt.dtype)
    seen = np.zeros(dt.shape, bool)
    problems = []
    for r, item in enumerate(items):
        if item is None:
            continue
        c, local = item
        shape, _ = ref_box(dt.shape, mesh.shape, c, dt.placements)
        if local.shape != shape or local.dtype != dt.dtype:
            problems.append(f"rank {r} at {c}: local {local.shape} {local.dtype}, "
                            f"expected {shape} {dt.dtype}")
            continue
        index = ref_index(dt.shape, mesh.shape, c, dt.placements)
        held = seen[index]
        if held.any() and not bits_equal(out[index][held], local[held]):
            problems.append(f"rank {r} at {c}: replica differs from another rank's")
        out[index] = local
        seen[index] = True
    if not seen.all():
        problems.append(f"{int((~seen).sum())} elements are held by no rank")
    return out, problems


def all_ranks(flag: bool, comm=COMM) -> bool:
    """Collective: True when `flag` is true on every rank."""
    return bool(comm.allreduce(bool(flag), op=MPI.LAND))


def outcome(call):
    """(exception type name, message) of call(), or None when it returned."""
    try:
        call()
    except Exception as e:  # noqa: BLE001 - compared across ranks by the caller
        return type(e).__name__, str(e)
    return None


def same_everywhere(got, comm=COMM):
    """Collective: every rank's outcome, gathered; asserts they are all equal."""
    every = comm.allgather(got)
    assert all(o == every[0] for o in every), every
    return every[0]


class Problems(list):
    """Failed expectations, collected instead of raised, so that a test finishes
    all its collective calls on every rank before it asserts `problems == []`."""

    def expect(self, ok, what: str) -> None:
        if not ok:
            self.append(what)


def expect_same_error(p: Problems, what: str, call, exc, match: str) -> None:
    """Collective. call() must raise ``exc`` (a message matching ``match``) on every
    rank, with the same type and message everywhere; a failure goes into ``p``."""
    seen = COMM.allgather(outcome(call))
    ok = (all(s == seen[0] for s in seen) and seen[0] is not None
          and seen[0][0] == exc.__name__ and re.search(match, seen[0][1]) is not None)
    p.expect(ok, f"{what}: expected the same {exc.__name__} matching {match!r} on every "
                 f"rank, got {seen}")


def raised(call, exc, match=None):
    """True when call() raises `exc` (whose message contains the regex `match`),
    else a description of what happened instead. Never raises."""
    try:
        call()
    except exc as e:
        if match is None or re.search(match, str(e)):
            return True
        return f"{type(e).__name__} without {match!r}: {e}"
    except Exception as e:  # noqa: BLE001 - reported to the test
        return f"{type(e).__name__} instead of {exc.__name__}: {e}"
    return f"no exception instead of {exc.__name__}"


def node_of_each_rank(comm=COMM) -> list[int]:
    """The node of every rank of `comm`, by rank, numbered 0, 1, ... in the order of
    their first ranks, from mpi4py's own MPI_COMM_TYPE_SHARED split (not
    mpitensor's code). Collective."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    try:
        leader = node.allreduce(comm.Get_rank(), op=MPI.MIN)
    finally:
        node.Free()
    leaders = comm.allgather(leader)
    order = sorted(set(leaders))
    return [order.index(x) for x in leaders]


def ref_ranks_per_node(nodes: list[int]) -> int:
    """What a mesh over these ranks in this order learns as its ranks per node,
    written from the C header's definition (timemodel.h): 0 when all share one
    node; k when they fill nodes of k consecutive positions each; 1 for any other
    layout (planned as one rank per node)."""
    n = len(nodes)
    if len(set(nodes)) == 1:
        return 0
    k = nodes.count(nodes[0])
    blocks = [nodes[i:i + k] for i in range(0, n, k)]
    fits = n % k == 0 and all(len(set(b)) == 1 for b in blocks) \
        and len({b[0] for b in blocks}) == len(blocks)
    return k if fits else 1
