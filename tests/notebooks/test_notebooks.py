"""Every notebook in examples/notebooks runs headless from top to bottom (nbclient,
the `python3` kernel of this environment): a cell that raises, including a failed
check inside a `%%px` cell on any engine, fails the test. Notebooks are committed
without outputs.

Run with plain pytest (the notebooks start their own MPI engines):
`python -m pytest tests/notebooks`."""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).parents[2] / "examples" / "notebooks").glob("*.ipynb"))

pytestmark = pytest.mark.skipif(
    any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")),
    reason="the notebooks start their own MPI job: run with plain pytest, not under mpiexec")


def test_there_are_notebooks():
    assert [p.name for p in NOTEBOOKS] and "quickstart.ipynb" in [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_without_outputs(path):
    nb = nbformat.read(path, as_version=4)
    dirty = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"
             and (cell.outputs or cell.execution_count is not None)]
    assert dirty == [], f"{path.name}: code cells {dirty} hold outputs; clear them before committing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_runs_headless(path):
    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute()  # raises CellExecutionError naming the cell and its traceback
    errors = [out for cell in nb.cells if cell.cell_type == "code"
              for out in cell.outputs if out.output_type == "error"]
    assert errors == []
