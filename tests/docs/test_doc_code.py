"""The code in the README and on the tutorial pages of docs/ runs, and prints what
the pages say it prints.

Each page's ```python blocks, joined in order, form one program (a block whose
first line is ``# name.py`` is a script of its own) that must exit 0 as one
process and under ``mpiexec -n 4`` (the pages promise both). A ``print(...)``
statement followed by a comment line shows its output: under ``mpiexec -n 4`` rank
0 must print exactly the text of that comment (the first comment line; further
comment lines are prose). The asserts on the pages check the results they describe.

Run with plain pytest (it starts its own MPI jobs): `python -m pytest tests/docs`."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
# Pages written as one runnable program (their introductions say so) with the rank
# counts they run at (the README's example needs a 2 x 2 mesh), and pages holding
# scripts of their own.
PROGRAMS = {"README.md": [4], "docs/tensor_parallel.md": [1, 4], "docs/checkpoints.md": [1, 4],
            "docs/spmd_mistakes.md": [1, 4], "docs/clusters.md": [1, 4],
            "docs/array_api.md": [1, 4]}
SCRIPT_PAGES = ["docs/getting_started.md"]

pytestmark = pytest.mark.skipif(
    any(v in os.environ for v in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE")),
    reason="starts its own MPI jobs: run with plain pytest, not under mpiexec")

# Records what each instrumented print wrote; rank 0 writes it out at exit.
PRELUDE = '''\
import atexit as _doc_atexit, json as _doc_json, os as _doc_os
_doc_printed = {}
def _doc_print(_doc_line, *args, sep=" ", **kwargs):
    print(*args, sep=sep, **kwargs)
    _doc_printed[_doc_line] = sep.join(str(a) for a in args)
def _doc_dump():
    rank = _doc_os.environ.get("OMPI_COMM_WORLD_RANK", _doc_os.environ.get("PMI_RANK", "0"))
    if rank == "0" and "MT_DOC_PRINTED" in _doc_os.environ:
        with open(_doc_os.environ["MT_DOC_PRINTED"], "w") as f:
            _doc_json.dump(_doc_printed, f)
_doc_atexit.register(_doc_dump)
'''


def blocks(page: str) -> list[str]:
    found = re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), re.S)
    assert found, f"{page} has no python code blocks"
    return found


def program(page: str) -> str:
    return "\n".join(blocks(page))


def scripts(page: str) -> dict[str, str]:
    """The blocks of ``page`` that start with ``# name.py``."""
    return {m.group(1): b for b in blocks(page) if (m := re.match(r"# (\w+\.py)\n", b))}


def instrument(source: str) -> tuple[str, dict[str, str]]:
    """``source`` with each print that a comment line follows recording its output,
    and {line: the output the comment shows}."""
    lines = source.splitlines()
    expected = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "print"):
            continue
        below = lines[node.end_lineno].strip() if node.end_lineno < len(lines) else ""
        if not below.startswith("# "):
            continue
        expected[str(node.end_lineno)] = below[2:]
        row, col = node.lineno - 1, node.value.func.col_offset
        lines[row] = (lines[row][:col] + f"_doc_print({node.end_lineno}, "
                      + lines[row][col + len("print("):])
    return PRELUDE + "\n".join(lines) + "\n", expected


def run(source: str, nranks: int, tmp_path) -> tuple[subprocess.CompletedProcess, dict, dict]:
    code, expected = instrument(source)
    script = tmp_path / "doc_program.py"
    script.write_text(code)
    printed_file = tmp_path / "printed.json"
    cmd = [sys.executable, "-m", "mpi4py", str(script)]
    if nranks > 1:
        cmd = ["mpiexec", "--oversubscribe", "-n", str(nranks)] + cmd
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OPENBLAS_NUM_THREADS="1", MT_DOC_PRINTED=str(printed_file), NO_COLOR="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    printed = json.loads(printed_file.read_text()) if printed_file.exists() else {}
    return proc, expected, printed


def check(what: str, source: str, nranks: int, tmp_path) -> None:
    proc, expected, printed = run(source, nranks, tmp_path)
    assert proc.returncode == 0, (f"{what} at {nranks} rank(s):\n{proc.stdout[-3000:]}\n"
                                  f"{proc.stderr[-3000:]}")
    if nranks == 4:
        wrong = {line: (printed.get(line), want) for line, want in expected.items()
                 if printed.get(line) != want}
        assert wrong == {}, f"{what}: printed (got, the page says) by line: {wrong}"


def test_a_failing_block_fails(tmp_path):
    source = program("docs/checkpoints.md") + "\nassert False, 'the page lies'\n"
    proc, _, _ = run(source, 1, tmp_path)
    assert proc.returncode != 0 and "the page lies" in proc.stderr


def test_a_wrong_printed_comment_fails(tmp_path):
    source = "x = 6 * 7\nprint('x is', x)\n# x is 41\nprint(x)  # not checked\n"
    with pytest.raises(AssertionError, match=r"'2': \('x is 42', 'x is 41'\)"):
        check("a page", source, 4, tmp_path)


def test_every_page_shows_some_printed_output():
    for page in PROGRAMS:
        assert instrument(program(page))[1], f"{page} shows no printed output to check"


@pytest.mark.parametrize("page, nranks", [(p, n) for p, ns in PROGRAMS.items() for n in ns])
def test_page_runs(page, nranks, tmp_path):
    check(page, program(page), nranks, tmp_path)


@pytest.mark.parametrize("nranks", [1, 4])
@pytest.mark.parametrize("page", SCRIPT_PAGES)
def test_scripts_on_page_run(page, nranks, tmp_path):
    found = {n: b for n, b in scripts(page).items() if not n.startswith("test_")}
    assert found, f"{page} has no '# name.py' script"
    for name, source in found.items():
        check(f"{page}: {name}", source, nranks, tmp_path)


@pytest.mark.parametrize("page", SCRIPT_PAGES)
def test_test_files_on_page_pass_under_plain_pytest(page, tmp_path):
    """A ``# test_x.py`` block is a test file: plain pytest runs it as the page says."""
    found = {n: b for n, b in scripts(page).items() if n.startswith("test_")}
    for name, source in found.items():
        (tmp_path / name).write_text(source)
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        proc = subprocess.run([sys.executable, "-m", "pytest", name, "-p", "no:cacheprovider",
                               "-W", "ignore::pytest.PytestAssertRewriteWarning"],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0 and " passed" in proc.stdout, proc.stdout + proc.stderr
