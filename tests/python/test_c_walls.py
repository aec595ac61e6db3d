"""check_walls' reading of the extension's calls (csrc/ext), which ctest's c_walls
runs on the tree: it finds no cycle there, and finds one written into a copy; no
file but the hook table calls Python, and a call written into a copy is found."""

from __future__ import annotations

import os
import shutil
import sys

import pytest

# Reads csrc/: the same at every rank count.
pytestmark = pytest.mark.np(1)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "tests", "core"), os.path.join(ROOT, "tests")]
import check_walls  # noqa: E402  (tests/core/check_walls.py)


def test_the_extension_calls_down_only():
    edges = check_walls.ext_edges(os.path.join(ROOT, "csrc"))
    assert "ext_entry.c" in edges["module.c"] and "ext_exec.c" in edges["ext_entry.c"]
    assert check_walls.cycles(edges) == []


def test_a_call_up_from_the_bottom_is_a_cycle(tmp_path):
    shutil.copytree(os.path.join(ROOT, "csrc", "ext"), tmp_path / "ext")
    bottom = tmp_path / "ext" / "ext_args.c"
    head = "int mt_ext_import_numpy(void) {"
    text = bottom.read_text()
    assert head in text
    bottom.write_text(text.replace(head, head + " mt_ext_ufunc(NULL, NULL, NULL, 0, NULL);"))
    found = check_walls.cycles(check_walls.ext_edges(str(tmp_path)))
    assert len(found) == 1 and {"ext_args.c", "ext_entry.c"} <= set(found[0]), found


def test_only_the_hook_table_calls_python():
    assert check_walls.python_calls(os.path.join(ROOT, "csrc")) == []


def test_a_python_call_outside_the_hook_table_is_found(tmp_path):
    shutil.copytree(os.path.join(ROOT, "csrc", "ext"), tmp_path / "ext")
    decide = tmp_path / "ext" / "ext_decide.c"
    text = decide.read_text()
    head = "static PyObject *ufunc_result("
    assert head in text
    decide.write_text(text.replace(head, "static PyObject *sneak(PyObject *f) {\n"
                                   "  return PyObject_CallNoArgs(f);\n}\n\n" + head))
    assert check_walls.python_calls(str(tmp_path)) == [
        "ext_decide.c: PyObject_CallNoArgs"]
