"""The code on the tutorial pages of docs/ runs: each page's ```python blocks,
joined in order, form one program that must exit 0 as one process and under
`mpiexec -n 4` (the pages promise both). Their asserts check the results they
describe, so a page that no longer tells the truth fails here.

Run with plain pytest (it starts its own MPI jobs): `python -m pytest tests/docs`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).parents[2] / "docs"
# Pages written as one runnable program (their introductions say so).
PROGRAMS = ["tensor_parallel.md", "checkpoints.md"]

pytestmark = pytest.mark.skipif(
    any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")),
    reason="starts its own MPI jobs: run with plain pytest, not under mpiexec")


def program(page: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", (DOCS / page).read_text(), re.S)
    assert blocks, f"{page} has no python code blocks"
    return "\n".join(blocks)


def test_a_failing_block_fails(tmp_path):
    script = tmp_path / "bad.py"
    script.write_text(program("checkpoints.md") + "\nassert False, 'the page lies'\n")
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode != 0 and "the page lies" in run.stderr


@pytest.mark.parametrize("nranks", [1, 4])
@pytest.mark.parametrize("page", PROGRAMS)
def test_page_runs(page, nranks, tmp_path):
    script = tmp_path / page.replace(".md", ".py")
    script.write_text(program(page))
    cmd = [sys.executable, "-m", "mpi4py", str(script)]
    if nranks > 1:
        cmd = ["mpiexec", "--oversubscribe", "-n", str(nranks)] + cmd
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1")
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, f"{page} at {nranks} rank(s):\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
