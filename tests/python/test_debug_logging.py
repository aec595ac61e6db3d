"""MPITENSOR_LOGS / mpitensor.debug.set_logs: +dtensor gives a rank-prefixed debug
line for every redistribute (source, target, steps, bytes) and every sharding
decision (op, input specs, output spec, cache hit or miss); nothing by default or
at INFO, and the debug hooks are then off."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

from mpitensor import DTensor, Replicate, Shard, _logging, _modes, init_device_mesh
from mpitensor.debug import set_logs
from mpi_helpers import ref_box

COMM = MPI.COMM_WORLD
W = COMM.Get_size()
RANK = COMM.Get_rank()


@pytest.fixture(autouse=True)
def logs_restored():
    yield
    set_logs(dtensor=None)


def sharded(mesh):
    rows = ref_box((8, 4), (W,), (RANK,), [Shard(0)])[0][0]
    return DTensor.from_local(np.ones((rows, 4)), mesh, [Shard(0)], shape=(8, 4),
                              stride=(4, 1))


def test_parse():
    assert _logging.parse("+dtensor") == logging.DEBUG
    assert _logging.parse("dtensor") == logging.INFO
    assert _logging.parse("-dtensor") == logging.WARNING
    assert _logging.parse(" +all ") == logging.DEBUG
    assert _logging.parse("") is None
    with pytest.raises(ValueError, match=r"Invalid MPITENSOR_LOGS setting '\+dynamo'"):
        _logging.parse("+dynamo")


def test_debug_lines(capsys):
    mesh = init_device_mesh("cpu", (W,))
    m = repr(mesh)
    set_logs(dtensor=logging.DEBUG)
    x = sharded(mesh)
    x.redistribute(mesh, [Replicate()])
    x + x
    x + x
    lines = capsys.readouterr().err.splitlines()
    p = f"[rank{RANK}]:DEBUG:mpitensor: "
    gather = ("0 step(s), 0 B received over all ranks: no step" if W == 1 else
              f"1 step(s), {(W - 1) * 8 * 4 * 8} B received over all ranks: "
              f"all_gather(mesh dim 0, {(W - 1) * 8 * 4 * 8} B)")
    assert lines == [
        f"{p}DTensor.redistribute [S(0)] -> [R], shape (8, 4), float64 on {m}: {gather}",
        f"{p}numpy.add: inputs [S(0)] (8, 4) float64; [S(0)] (8, 4) float64 -> output "
        f"[S(0)] (8, 4) (cache miss)",
        f"{p}numpy.add: inputs [S(0)] (8, 4) float64; [S(0)] (8, 4) float64 -> output "
        f"[S(0)] (8, 4) (cache hit)",
    ]


def test_c_path_steps_aside_while_logging(capsys):
    # A decision made before logging was on must still be logged: while a tool
    # listens, every call takes the Python entry, where the hook sites are.
    mesh = init_device_mesh("cpu", (W,))
    x = sharded(mesh)
    x + x
    x + x
    set_logs(dtensor=logging.DEBUG)
    x + x
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and lines[0].endswith("(cache hit)"), lines
    set_logs(dtensor=None)
    x + x
    assert capsys.readouterr().err == ""


def test_operation_redistribution_is_named(capsys):
    mesh = init_device_mesh("cpu", (W,))
    set_logs(dtensor=logging.DEBUG)
    x = sharded(mesh)
    x @ x.T
    err = capsys.readouterr().err
    assert "numpy.transpose: inputs [S(0)] (8, 4) float64 -> output [S(1)] (4, 8)" in err
    if W > 1:
        # x's rows land in place when gathered, y's columns would need a copy
        assert "numpy.matmul: redistribute an input [S(0)] -> [R], shape (8, 4)" in err


def test_absent_by_default_and_at_info(capsys):
    mesh = init_device_mesh("cpu", (W,))
    for level in (None, logging.INFO, logging.WARNING):
        set_logs(dtensor=level)
        assert _modes.tracing is False
        x = sharded(mesh)
        x.redistribute(mesh, [Replicate()])
        x + x
    assert capsys.readouterr().err == ""


def test_set_logs_checks_its_argument():
    with pytest.raises(TypeError, match="logging level"):
        set_logs(dtensor="debug")


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    """A fresh interpreter (MPI not started: importing mpitensor does not)."""
    return subprocess.run([sys.executable, "-c", code], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=60)


@pytest.mark.np(1)  # fresh interpreters without MPI: the same at every rank count
def test_environment_variables():
    code = ("import logging, mpitensor; from mpitensor import _modes; "
            "print(logging.getLogger('mpitensor').level, _modes.state.log_debug, _modes.state.checks)")
    assert run_python(code, MPITENSOR_LOGS="+dtensor").stdout.split() == ["10", "True", "False"]
    assert run_python(code, MPITENSOR_LOGS="dtensor").stdout.split() == ["20", "False", "False"]
    assert run_python(code, MPITENSOR_LOGS="-dtensor").stdout.split() == ["30", "False", "False"]
    assert run_python(code, MPITENSOR_CHECK="1").stdout.split() == ["0", "False", "True"]
    bad = run_python(code, MPITENSOR_LOGS="+nothing")
    assert bad.returncode != 0 and "Invalid MPITENSOR_LOGS setting" in bad.stderr
    bad = run_python(code, MPITENSOR_CHECK="yes")
    assert bad.returncode != 0 and "MPITENSOR_CHECK must be 0 or 1" in bad.stderr


@pytest.mark.np(1)
def test_rank_prefix_before_mpi_starts():
    code = ("import logging, mpitensor; "
            "logging.getLogger('mpitensor.x').debug('hello')")
    out = run_python(code, MPITENSOR_LOGS="+dtensor")
    assert out.stderr == "[rank-]:DEBUG:mpitensor.x: hello\n"
