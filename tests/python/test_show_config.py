"""mpitensor.show_config() prints every field, and the check before the first mesh
that mpi4py and mpitensor._C use one MPI library (mpitensor._mpi_library): the
comparison on made-up version strings, and a mesh refused on every rank, naming
both libraries, when the extension reports another MPI or the process has loaded
two; and a process started by another MPI's launcher (each one alone in its world)
refused with the launcher named, as is a mesh too big for srun without PMI."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys

import pytest
from mpi4py import MPI

import mpitensor as mt
from mpitensor import _mpi_library, _show_config
from mpi_helpers import Problems, kill_job, raised, stacks, start_job

_C_LIBRARY = _mpi_library.first_line(mt._comm.mpi_library_version())
OPEN_MPI = "Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4, repo rev: v4.1.4, May 26, 2022"
MPICH = "MPICH Version:      4.2.0\nMPICH Release date: Fri Feb  9 12:29:21 CST 2024\n"


def test_comparison_of_library_versions():
    assert _mpi_library.same_mpi_library(OPEN_MPI, OPEN_MPI + "\0")  # Open MPI's counted NUL
    assert _mpi_library.same_mpi_library(MPICH, MPICH.rstrip())
    assert not _mpi_library.same_mpi_library(OPEN_MPI, MPICH)
    assert not _mpi_library.same_mpi_library(OPEN_MPI, OPEN_MPI.replace("4.1.4", "5.0.3"))
    message = _mpi_library.mismatch_message(OPEN_MPI, MPICH)
    assert "mpi4py:       MPICH Version:      4.2.0\n" in message
    assert f"mpitensor._C: {OPEN_MPI}\n" in message
    assert "--no-binary=mpi4py" in message and "show_config()" in message


def test_the_libraries_of_this_build_agree():
    _mpi_library.check_mpi_library()
    assert _show_config.config()["MPI of mpitensor._C"]["same as mpi4py's"] is True


def test_a_mesh_over_another_mpi_is_refused(monkeypatch):
    monkeypatch.setattr(_mpi_library, "_checked", False)
    monkeypatch.setattr(_mpi_library._comm, "mpi_library_version", lambda: MPICH)
    p = Problems()
    p.expect(raised(lambda: mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),)),
                    RuntimeError, "mpitensor._C: MPICH Version"), "mesh on another MPI")
    monkeypatch.undo()
    p.expect(mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),)).size()
             == MPI.COMM_WORLD.Get_size(), "a mesh once the libraries agree")
    assert p == []


def test_a_process_with_two_mpi_libraries_is_refused(monkeypatch):
    """Two libraries loaded side by side may report one version (the first loaded
    may export its symbols to the other's callers): the files loaded decide."""
    two = ["/usr/lib/x86_64-linux-gnu/libmpi.so.40.30.4", "/opt/mpich/lib/libmpi.so.12.4.0"]
    monkeypatch.setattr(_mpi_library, "_checked", False)
    monkeypatch.setattr(_mpi_library, "loaded_libmpi", lambda: two)
    got = raised(lambda: mt.init_device_mesh("cpu", (MPI.COMM_WORLD.Get_size(),)),
                 RuntimeError, "several MPI libraries")
    monkeypatch.undo()
    assert MPI.COMM_WORLD.allgather(got) == [True] * MPI.COMM_WORLD.Get_size()


def test_the_launchers_own_count_against_the_world():
    pmi = _mpi_library.launcher_mismatch(1, {"PMI_SIZE": "4"})
    assert "PMI launcher" in pmi and "one of 4 (PMI_SIZE=4)" in pmi
    assert _C_LIBRARY in pmi and "show_config()" in pmi
    ompi = _mpi_library.launcher_mismatch(1, {"OMPI_COMM_WORLD_SIZE": "8"})
    assert "Open MPI's mpiexec" in ompi and "one of 8" in ompi
    for size, env in [(4, {"PMI_SIZE": "4"}), (1, {}), (1, {"PMI_SIZE": "1"}),
                      (1, {"PMI_SIZE": "x"}), (1, {"SLURM_STEP_NUM_TASKS": "4"})]:
        assert _mpi_library.launcher_mismatch(size, env) is None, (size, env)
    hint = _mpi_library.slurm_hint(1, {"SLURM_STEP_NUM_TASKS": "8"})
    assert "srun started 8 tasks" in hint and "--mpi=pmix" in hint
    assert _mpi_library.slurm_hint(8, {"SLURM_STEP_NUM_TASKS": "8"}) == ""


# Run by rank 0 without the MPI job's environment: Open MPI makes it a world of
# one, which is what each process sees when another MPI's launcher starts it.
ALONE = """
import os, sys
import mpitensor as mt
from mpi4py import MPI
try:
    mt.init_device_mesh("cpu", (int(sys.argv[1]),))
except RuntimeError as e:
    print(e)
"""


def alone(size, **env):
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("OMPI_", "PMIX_", "PMI_", "SLURM_"))}
    clean.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **env)
    hangs = []
    # Under load a child can print its refusal and then hang in Open MPI's singleton
    # teardown (MPI_Finalize of a world of one, after mpitensor's part has ended),
    # which mpitensor cannot reach: each child runs in a session of its own with a
    # time limit, a hung one is killed whole with its stacks kept, one more is run,
    # and a second hang fails the test with both stacks, within the per-test timeout.
    for _ in range(2):
        child = start_job([sys.executable, "-c", ALONE, str(size)], env=clean)
        try:
            out, err = child.communicate(timeout=30)
            return child.returncode, out, err
        except subprocess.TimeoutExpired:
            where = stacks(child)
            out, err = kill_job(child)
            hangs.append(f"stdout {out!r}, stderr {err!r}, stacks:\n{where}")
    raise AssertionError(f"the child {env} hung twice:\n" + "\n".join(hangs))


@pytest.mark.np(1)  # each child is a world of one, whatever the suite's size
def test_processes_started_by_another_mpis_launcher_are_refused():
    """MPICH's mpiexec (PMI_SIZE) starting a program built on Open MPI: each
    process is a world of one; its first mesh says why, not what follows. A mesh
    bigger than that world under srun names srun's PMI plugins."""
    found = None
    if MPI.COMM_WORLD.Get_rank() == 0:
        # A failure to run them (a timeout under load) reaches every rank, so that
        # no rank waits in the bcast for one that raised.
        try:
            found = [alone(1, PMI_SIZE="4"), alone(4, SLURM_STEP_NUM_TASKS="4"), alone(1)]
        except Exception as e:  # a hang's message keeps what the child wrote, and where
            found = f"{type(e).__name__}: {e}"
    found = MPI.COMM_WORLD.bcast(found)
    assert not isinstance(found, str), found
    pmi, slurm, fine = found
    assert pmi[0] == 0 and "started this process as one of 4 (PMI_SIZE=4)" in pmi[1], pmi
    assert slurm[0] == 0 and "bigger than the communicator size 1" in slurm[1], slurm
    assert "srun started 4 tasks" in slurm[1], slurm
    assert fine == (0, "", fine[2]), fine


def test_show_config_prints_every_field(monkeypatch):
    monkeypatch.setenv("MPITENSOR_POOL_BYTES", "12345")
    monkeypatch.setenv("MPITENSOR_MISSPELT", "1")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert mt.show_config() is None
    text = out.getvalue()
    sections = _show_config.config()
    for title, fields in sections.items():
        assert f"{title}:\n" in text
        for name in fields:
            assert f"\n  {name}:" in text, name
    assert f"  version: {mt.__version__}\n" in text
    assert "  MPITENSOR_POOL_BYTES: 12345\n" in text and "  MPITENSOR_MISSPELT: 1\n" in text
    assert f"  MPI library: {MPI.Get_library_version().rstrip(chr(0)).splitlines()[0]}" in text
    assert f"  nn kernels: {mt.nn._kernels.blas_provider()}\n" in text
    assert "libmpi.so" in text
    with pytest.raises(ValueError, match="mode must be"):
        mt.show_config("html")
