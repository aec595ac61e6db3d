"""Every C struct Python reads is laid out from C: the extension's table
(csrc/ext/ext_structs.c) names each field its header declares, in order, its rows
written from the headers at build time (csrc/tools/struct_fields.py), so a field
added to a header reaches Python with no other edit; every ctypes Structure of the
package is built from that table; and a layout ctypes would place differently
from C fails at import, naming the struct and the field. The headers are read
here a second way, not through the generator, so that each checks the other.

No MPI is needed; under the MPI runner every rank reaches the same verdict.
"""

from __future__ import annotations

import ast
import ctypes
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from mpitensor import _C, _clib, _modes

# No MPI: the same at every rank count.
pytestmark = pytest.mark.np(1)

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "python" / "mpitensor"
HEADERS = sorted((ROOT / "csrc" / "include").rglob("*.h")) + sorted(
    (ROOT / "csrc" / "ext").glob("*.h"))
GENERATOR = ROOT / "csrc" / "tools" / "struct_fields.py"
LISTING = ROOT / "csrc" / "ext" / "ext_structs.c"


def declared_fields(text: str) -> dict[str, list[str]]:
    """{struct name: its members' names in order} of every ``typedef struct NAME
    {...} NAME;`` of a C header's ``text``."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    out = {}
    for name, body in re.findall(r"typedef struct (\w+) \{(.*?)\} \1;", text, re.S):
        names = []
        for decl in filter(None, (d.strip() for d in body.split(";"))):
            decl = re.sub(r"\[[^\]]*\]", "", decl)  # array extents
            first, *rest = decl.split(",")
            names.append(re.findall(r"\w+", first)[-1])
            names += [re.findall(r"\w+", r)[-1] for r in rest]
        out[name] = names
    return out


def missing_fields(structs: dict) -> list[str]:
    """Where the table ``structs`` (as _clib.STRUCTS) differs from the headers."""
    declared = {}
    for path in HEADERS:
        declared.update(declared_fields(path.read_text()))
    problems = []
    for name, (_, fields) in structs.items():
        table = [f[0] for f in fields]
        if name not in declared:
            problems.append(f"{name}: no 'typedef struct {name} {{...}} {name};' in the headers")
        elif table != declared[name]:
            problems.append(f"{name}: the header declares {declared[name]}, the table "
                            f"names {table}")
    return problems


def test_the_table_names_every_field_each_header_declares():
    assert not missing_fields(_clib.STRUCTS), "\n".join(missing_fields(_clib.STRUCTS))


def test_a_field_missing_from_the_table_is_caught():
    size, fields = _clib.STRUCTS["mt_mesh_nodes"]
    # A field that fits in padding moves no offset: only the header can tell.
    assert missing_fields({"mt_mesh_nodes": (size, fields[1:])})
    assert missing_fields({"mt_mesh_nodes": (size, fields[:1] + fields[2:])})
    assert declared_fields("typedef struct s {\n  int a, *b; /* x; y */\n"
                           "  double c[4][2];\n  void (*f);\n} s;") == {
        "s": ["a", "b", "c", "f"]}


def _generator():
    """csrc/tools/struct_fields.py as a module (it is a build tool, not installed)."""
    spec = importlib.util.spec_from_file_location("struct_fields", GENERATOR)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(text: str) -> dict[str, list[str]]:
    """{struct: its row macros} of a generated rows file's ``text``."""
    out = {}
    for name, body in re.findall(r"static const field fields_(\w+)\[\] = \{(.*?)END\};",
                                 text, re.S):
        out[name] = re.findall(r"^ +(\w+\(\w+, \w+\)),", body, re.M)
    return out


def test_the_generator_writes_a_row_for_each_declarator():
    header = ("typedef struct s {\n  int a, *b; /* x; y */\n  double c[4][2];\n"
              "  void (*f)(int, double);\n  PyObject *o, **oo; // z;\n"
              "  unsigned long long u[N + 1];\n  const void *v;\n} s;\n"
              "typedef struct t { int a; } t;\n")
    text = _generator().generate(["s"], {"h.h": header})
    assert _rows(text) == {"s": [
        "SCALAR(s, a)", "POINTER(s, b)", "ARRAY2(s, c)", "POINTER(s, f)",
        "OBJECT(s, o)", "POINTER(s, oo)", "ARRAY(s, u)", "POINTER(s, v)"]}
    # A pointer's row tells clang-tidy its size is the pointer's; no other row does.
    nolint = [line.split(",")[1].strip(" )") for line in text.splitlines() if "NOLINT" in line]
    assert nolint == ["b", "f", "o", "oo", "v"]


@pytest.mark.parametrize("member, why", [
    ("int a : 3;", "a bit-field"), ("union { int i; double d; } u;", "nested"),
    ("int *p[4];", "an array of pointers"), ("int x[2][3][4];", "more than two"),
    ("int (*fs[2])(void);", "cannot read")])
def test_the_generator_refuses_a_member_it_cannot_lay_out(member, why):
    with pytest.raises(ValueError, match=re.escape(why)):
        _generator().generate(["s"], {"h.h": f"typedef struct s {{ int n; {member} }} s;"})


def _generate(tmp_path, headers: list[Path]):
    """Run the generator as the build does; (status, rows, its error output)."""
    out = tmp_path / "struct_fields.inc"
    done = subprocess.run([sys.executable, GENERATOR, out, LISTING, *headers],
                          capture_output=True, text=True)
    return done.returncode, _rows(out.read_text()) if out.exists() else {}, done.stderr


def test_a_field_added_to_a_header_reaches_the_rows(tmp_path):
    copies = []
    for path in HEADERS:
        copy = tmp_path / "h" / path.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(path.read_text())
        copies.append(copy)
    status, rows, _ = _generate(tmp_path, copies)
    assert status == 0 and list(rows) == list(_clib.STRUCTS)
    nodes = next(c for c in copies if "typedef struct mt_mesh_nodes {" in c.read_text())
    text = nodes.read_text()
    nodes.write_text(text.replace("typedef struct mt_mesh_nodes {",
                                  "typedef struct mt_mesh_nodes {\n  int added[3], *also;"))
    status, added, _ = _generate(tmp_path, copies)
    assert status == 0
    assert added["mt_mesh_nodes"] == ["ARRAY(mt_mesh_nodes, added)",
                                      "POINTER(mt_mesh_nodes, also)"] + rows["mt_mesh_nodes"]
    assert {k: v for k, v in added.items() if k != "mt_mesh_nodes"} == {
        k: v for k, v in rows.items() if k != "mt_mesh_nodes"}
    # Every struct's rows name what the independent reading finds in its header.
    declared = {}
    for copy in copies:
        declared.update(declared_fields(copy.read_text()))
    for name, macros in added.items():
        assert [m.split(", ")[1][:-1] for m in macros] == declared[name], name
    # A struct the list names and no header declares stops the build, saying which.
    nodes.write_text(text.replace("} mt_mesh_nodes;", "} mt_mesh_nodez;"))
    status, _, err = _generate(tmp_path / "gone", copies)
    assert status == 1 and "mt_mesh_nodes: no 'typedef struct mt_mesh_nodes" in err


def _class_problems(path: Path) -> list[str]:
    """Hand-written ctypes layouts in a module's source: a ``_fields_`` or a class
    deriving from a ctypes Structure or Union by name."""
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "_fields_" for t in targets):
                out.append(f"line {node.lineno}: _fields_ written by hand")
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                text = ast.unparse(base)
                if re.search(r"\b(\w*Structure|Union)$", text):
                    out.append(f"line {node.lineno}: class {node.name}({text})")
    return out


def test_no_module_writes_a_layout_by_hand():
    problems = [f"{path.relative_to(PACKAGE.parent)}: {p}"
                for path in sorted(PACKAGE.rglob("*.py")) for p in _class_problems(path)]
    assert not problems, ("ctypes layouts must come from _clib.struct:\n"
                          + "\n".join(problems))


def test_the_source_check_catches_a_hand_written_structure(tmp_path):
    path = tmp_path / "probe.py"
    path.write_text("import ctypes\nclass _S(ctypes.Structure):\n"
                    "    _fields_ = [('a', ctypes.c_int)]\n")
    assert len(_class_problems(path)) == 2


def _structures():
    """Every ctypes Structure class the package's imported modules hold."""
    import mpitensor.checkpoint._io  # noqa: F401  (binding modules not imported at once)
    import mpitensor.nn._ckernels  # noqa: F401
    seen = {}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] != "mpitensor":
            continue
        for value in vars(module).values():
            if isinstance(value, type) and issubclass(value, ctypes.Structure):
                seen[f"{name}.{getattr(value, '__qualname__', value)}"] = value
    return seen


def test_every_structure_of_the_package_is_the_tables():
    found = _structures()
    assert len(found) >= 19
    for where, cls in found.items():
        made = next((c for c in cls.__mro__ if c.__module__ == _clib.__name__), None)
        assert made is not None and made is _clib.struct(made.__name__), where
        # A subclass may add behaviour (properties), never fields or a __dict__.
        for c in cls.__mro__[:cls.__mro__.index(made)]:
            assert "_fields_" not in vars(c) and vars(c).get("__slots__") == (), where


def test_every_struct_of_the_table_builds_at_its_c_size():
    for name, (size, fields) in _clib.STRUCTS.items():
        cls = _clib.struct(name)
        assert ctypes.sizeof(cls) == size
        assert [f[0] for f in cls._fields_] == [f[0] for f in fields]


def test_a_layout_ctypes_would_misplace_fails_at_import():
    size, fields = _clib.STRUCTS["mt_box"]
    moved = [f if f[0] != "shape" else (f[0], f[1], f[2] + 8, f[3], f[4]) for f in fields]
    with pytest.raises(ImportError, match=r"mt_box\.shape: ctypes lays it out at byte"):
        _clib.build("mt_box", size, moved)
    resized = [f if f[0] != "offset" else (f[0], f[1], f[2], f[3] - 8, f[4])
               for f in fields]
    with pytest.raises(ImportError, match=r"mt_box\.offset"):
        _clib.build("mt_box", size, resized)
    with pytest.raises(ImportError, match=r"mt_box: ctypes makes it \d+ bytes, C 999"):
        _clib.build("mt_box", 999, fields)
    with pytest.raises(ImportError, match=r"odd\.x: no ctypes type for C type 'float128'"):
        _clib.build("odd", 16, [("x", "float128", 0, 16, ())])
    with pytest.raises(ImportError, match="mt_nothing is not in the extension's table"):
        _clib.struct("mt_nothing")


def test_a_struct_takes_only_its_fields():
    box = _clib.struct("mt_box")(ndim=2)
    assert box.ndim == 2 and box.shape[1] == 0
    with pytest.raises(AttributeError):
        _clib.struct("mt_box")(ndims=2)
    with pytest.raises(AttributeError):
        box.extra = 1


def test_the_modes_are_the_extensions():
    state = _modes.state
    assert ctypes.addressof(state) == _clib.capsule_pointer(_C.MODES, b"mpitensor._C.modes")
    assert isinstance(state.grad_enabled, bool) and state.want is None


def test_an_export_is_read_only_as_its_table_row_says():
    assert set(_clib.EXPORTS) == {"mpitensor._C." + n for n in (
        "modes", "hook_calls", "comm_counters", "io_counters", "memo", "layout_table")}
    calls = _clib.exported(_C.HOOK_CALLS, "mpitensor._C.hook_calls")
    assert len(calls) == _C.HOOK_COUNT and ctypes.sizeof(calls) == _C.HOOK_COUNT * 8
    assert isinstance(_clib.exported(_C.COMM_COUNTERS, "mpitensor._C.comm_counters"), int)


def test_a_capsule_of_another_name_is_refused():
    # The I/O counters read as the communication counters: the capsule's name says no.
    with pytest.raises(ValueError, match="incorrect name"):
        _clib.exported(_C.IO_COUNTERS, "mpitensor._C.comm_counters")
    with pytest.raises(ValueError):
        _clib.exported(_clib.capsule_pointer(_C.MODES, b"mpitensor._C.modes"),
                       "mpitensor._C.modes")  # a bare address is no capsule
    with pytest.raises(ImportError, match="mpitensor._C.gone is not in the extension's"):
        _clib.exported(_C.MODES, "mpitensor._C.gone")
    with pytest.raises(ImportError, match="points to mt_ext_modes, not mt_box"):
        _clib.exported(_C.MODES, "mpitensor._C.modes", _clib.struct("mt_box"))
    with pytest.raises(ImportError, match="opaque"):
        _clib.exported(_C.IO_COUNTERS, "mpitensor._C.io_counters", _clib.struct("mt_box"))
