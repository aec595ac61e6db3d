"""The C benchmarks that benchmarks/README.md tells readers to build and run still
build without warnings and print their figures. Plain pytest:
`python -m pytest tests/docs`."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
sys.path.insert(0, str(ROOT / "tests" / "python"))
from mpi_helpers import fresh_job_env  # noqa: E402  (tests/python is not a package)

BENCH = ROOT / "benchmarks"
TIMEOUT = 120  # seconds; each run takes about one


def build(compiler: str, source: str, out: Path) -> Path:
    subprocess.run([compiler, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(out),
                    str(BENCH / source)], check=True, timeout=TIMEOUT)
    return out


def test_cross_copy_prints_each_means_ratio_to_raw(tmp_path):
    exe = build("cc", "cross_copy.c", tmp_path / "cross_copy")
    out = subprocess.run([str(exe), "2", "1"], capture_output=True, text=True, check=True,
                         timeout=TIMEOUT).stdout
    for means in ("writev", "mapped", "remap"):
        assert re.search(rf"{means} \d+ us \(\d+\.\d\d[ )]", out), out
    assert re.search(r"raw \d+ us", out), out


def test_inner_gather_times_each_way_against_the_raw_allgather(tmp_path):
    """check=True: the run fails if a way put a row where the raw call's would not be."""
    exe = build("mpicc", "inner_gather.c", tmp_path / "inner_gather")
    out = subprocess.run(["mpiexec", "-n", "2", str(exe), "1"], capture_output=True,
                         text=True, check=True, timeout=TIMEOUT, env=fresh_job_env()).stdout
    assert re.search(r"1 MiB  staged +[\d.]+  raw +[\d.]+  ratio [\d.]+ \[[\d.]+\.\.[\d.]+\]",
                     out), out
    # a machine without ptrace permission between processes says so instead
    assert re.search(r"1 MiB  direct +([\d.]+  raw|unavailable: process_vm_readv)", out), out
    assert re.search(r"1 MiB  get +[\d.]+  raw +[\d.]+  ratio", out), out


def test_inner_gather_refuses_other_sizes_of_job(tmp_path):
    exe = build("mpicc", "inner_gather.c", tmp_path / "inner_gather")
    run = subprocess.run(["mpiexec", "-n", "3", str(exe), "1"], capture_output=True,
                         text=True, timeout=TIMEOUT, env=fresh_job_env())
    assert run.returncode != 0
    assert "inner_gather runs at np 2" in run.stderr + run.stdout
