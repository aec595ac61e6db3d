"""The package's floors (docs/design.md, "The layers"): every module of
python/mpitensor is parsed with ``ast``, its imports of the package's own modules
become a graph, and the graph must have no cycle and no edge that goes up a floor.
An import inside a function is allowed only for an optional dependency.

No MPI is needed: nothing here imports mpitensor. Under the MPI runner every rank
parses the same files and reaches the same verdict.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

# Reads the source tree: the same at every rank count.
pytestmark = pytest.mark.np(1)

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from graphs import strongly_connected  # noqa: E402  (tests/graphs.py)

PACKAGE = "mpitensor"
ROOT = Path(__file__).resolve().parents[2] / "python" / PACKAGE

# Calls go down, never up: a module may import modules of its own floor or lower.
# A package's entry covers every module inside it; a longer entry wins.
FLOORS = {
    "_C": 0, "_clib": 0,  # the extension, and the one loader of its ctypes bindings
    "_bind": 0,  # the bindings, a module per C folder (core, comm, io, linalg, kernels)
    "_comm": 0, "_plan": 0,  # the Python face of meshes and their collectives, of plans
    "_lapack": 0,  # TSQR on the LAPACK NumPy loaded
    # Ground floor: the DTensor model, its modes and the registry _ops fills.
    "_modes": 1, "_registry": 1, "placement_types": 1, "device_mesh": 1,
    "_dtensor_spec": 1, "_layout": 1, "_args": 1, "_trace": 1, "_logging": 1,
    "random": 1, "_dtensor": 1, "_factories": 1, "_distribute": 1,
    "_iterate": 1, "_flat": 1, "_shard": 1, "_mpi_library": 1, "_version": 1, "_timemodel": 1,
    "_departure": 1, "_strided": 1,
    "_fingerprint": 1, "_allgather_bytes": 1, "_device": 1, "_dtypes": 1, "_hooks": 1,
    "_node": 1, "_call_agreement": 1, "_mesh_layout": 1, "_deferred": 1,
    # Distributed algorithms and the executor's Python face: called by the entries,
    # they register nothing and import no entry module.
    "_algorithms": 2,
    "_ops": 3,  # the NumPy entries: each op's dim map, registered once; NumPy protocols
    "autograd": 4,  # the tape and backward rules
    "nn": 5, "optim": 5,  # training pieces
    # Features.
    "parallel": 6, "fsdp": 6, "experimental": 6, "debug": 6, "checkpoint": 6,
    "testing": 6, "_distribute_module": 6, "_show_config": 6,
    "distributed": 6,  # torch.distributed's names on local arrays: functional collectives
    "utils": 6,  # torch.utils' names: activation checkpointing
    "array_api": 6,  # the array API standard's namespace, over the registry
    "_coverage": 6,  # the NumPy coverage page, read from the registry
    "__init__": 7,  # mpitensor/__init__.py: the public names; imports everything
}

# Imported inside functions because they are optional, heavy, or (mpi4py's MPI)
# start MPI when imported.
LAZY_OK = {"matplotlib", "ipyparallel", "torch", "tabulate", "rich", "mpi4py", "h5py",
           "zarr", "numcodecs", "xarray", "h5netcdf", "ml_dtypes"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE,) + parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def floor_of(module: str) -> int:
    """The floor of a module of the package; KeyError for one FLOORS misses."""
    if module == PACKAGE:
        return FLOORS["__init__"]
    parts = module.split(".")[1:]
    for n in range(len(parts), 0, -1):
        key = ".".join(parts[:n])
        if key in FLOORS:
            return FLOORS[key]
    raise KeyError(module)


def _resolve(importer: str, is_pkg: bool, level: int, target: str | None) -> str:
    """The absolute name of a relative import's base."""
    base = importer.split(".")
    drop = level - 1 if is_pkg else level
    base = base[:len(base) - drop]
    return ".".join(base + ([target] if target else []))


def _within_function(tree: ast.AST):
    """(import node, inside a function) for every import of a module's tree."""
    out = []

    def visit(node, inside):
        for child in ast.iter_child_nodes(node):
            nested = inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                  ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.append((child, nested))
            visit(child, nested)

    visit(tree, False)
    return out


def imports_of(name: str, path: Path, known: set[str]):
    """(targets within the package, every imported top-level name, lazy imports) of
    one module. Importing a.b.c also runs a.b's __init__ unless it is one of the
    importer's own packages, already running."""
    tree = ast.parse(path.read_text(), str(path))
    is_pkg = path.name == "__init__.py"
    targets, lazy = set(), []
    ancestors = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    if is_pkg:
        ancestors.add(name)
    for node, inside in _within_function(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif node.level:
            base = _resolve(name, is_pkg, node.level, node.module)
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                     for a in node.names]
        else:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in known
                     else node.module for a in node.names]
        for full in names:
            if inside and (node.lineno, full) not in lazy:
                lazy.append((node.lineno, full))
            if full.split(".")[0] != PACKAGE:
                continue
            parts = full.split(".")
            for i in range(2, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in known and prefix not in ancestors:
                    targets.add(prefix)
    return targets, lazy


def graph():
    mods = modules()
    known = set(mods)
    edges, lazy = {}, {}
    for name, path in mods.items():
        edges[name], lazy[name] = imports_of(name, path, known)
    return mods, edges, lazy


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module, or a module that
    imports itself."""
    return [comp for comp in strongly_connected(edges)
            if len(comp) > 1 or comp[0] in edges.get(comp[0], ())]


def test_every_module_has_a_floor():
    missing = []
    for name in modules():
        try:
            floor_of(name)
        except KeyError:
            missing.append(name)
    assert not missing, f"modules without a floor in FLOORS: {missing}"


def test_every_floor_names_a_module():
    names = set(modules())  # and the extension, by its stub
    stale = [key for key in FLOORS if key != "__init__"
             and f"{PACKAGE}.{key}" not in names and not (ROOT / f"{key}.pyi").exists()]
    assert not stale, f"FLOORS names modules that do not exist: {stale}"


def test_no_import_cycles():
    _, edges, _ = graph()
    found = cycles(edges)
    assert not found, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_upward_imports():
    _, edges, _ = graph()
    up = [f"{a} (floor {floor_of(a)}) imports {b} (floor {floor_of(b)})"
          for a in sorted(edges) for b in sorted(edges[a]) if floor_of(b) > floor_of(a)]
    assert not up, "upward imports:\n" + "\n".join(up)


def registrations(source: str) -> list[str]:
    """What a module's code registers: calls of ``implements`` or of a name starting
    with ``register``, and assignments to an attribute of ``_registry``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name == "implements" or name.startswith("register"):
                out.append((node.lineno, f"{name}() at line {node.lineno}"))
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            out += [(node.lineno, f"_registry.{t.attr} = at line {node.lineno}") for t in targets
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                    and t.value.id == "_registry"]
    return [text for _, text in sorted(out)]


def test_the_algorithms_floor_registers_nothing():
    """An algorithm is called by the entries of _ops, which register it; on its own
    floor it neither registers a NumPy function nor reaches an entry module."""
    floor = f"{PACKAGE}._algorithms"
    mods, edges, _ = graph()
    found = {name: registrations(path.read_text()) for name, path in mods.items()
             if name == floor or name.startswith(floor + ".")}
    assert len(found) > 1, "the algorithms floor has no module"
    bad = {name: regs for name, regs in found.items() if regs}
    assert not bad, f"registrations on the algorithms floor: {bad}"
    up = [f"{a} imports {b}" for a in found for b in sorted(edges[a])
          if b == f"{PACKAGE}._ops" or b.startswith(f"{PACKAGE}._ops.")]
    assert not up, "the algorithms floor imports entries:\n" + "\n".join(up)
    assert registrations('@_registry.implements(np.put)\ndef f(): ...\n'
                         'register_backward(np.sum)\n_registry.fallback = g\n'
                         '"""@implements(np.x)"""\n') == [
        "implements() at line 1", "register_backward() at line 3",
        "_registry.fallback = at line 4"]


def test_imports_inside_functions_are_optional_dependencies():
    mods, _, lazy = graph()
    bad = [f"{mods[name].relative_to(ROOT.parent)}:{line}: {target}"
           for name in sorted(lazy) for line, target in lazy[name]
           if target.split(".")[0] not in LAZY_OK]
    assert not bad, "imports inside functions:\n" + "\n".join(bad)


def imports_ctypes(source: str) -> bool:
    """Whether a module's source imports ctypes (or a module of it) anywhere."""
    for node in ast.walk(ast.parse(source)):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level
                 else [])
        if any(n == "ctypes" or n.startswith("ctypes.") for n in names):
            return True
    return False


def test_only_the_one_door_imports_ctypes():
    """Every binding goes through _clib (docs/design.md, "The one door"): its
    ``fn``, ``call``, ``struct``, ``A`` and ``load``, never ctypes itself."""
    found = sorted(name for name, path in modules().items()
                   if name != f"{PACKAGE}._clib" and imports_ctypes(path.read_text()))
    assert not found, f"modules importing ctypes besides _clib: {found}"


def bound_functions(source: str) -> list[str]:
    """The C functions a module binds: the first argument of each call of ``fn``
    (``_clib.fn``, or ``fn`` imported under any name ending in it)."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name.endswith("fn") and isinstance(node.args[0].value, str):
                out.append(node.args[0].value)
    return out


def test_each_c_function_is_bound_once():
    """One binding a function: two would be two prototypes that can disagree."""
    seen: dict = {}
    for name, path in modules().items():
        for c in bound_functions(path.read_text()):
            seen.setdefault(c, []).append(name)
    twice = {c: where for c, where in seen.items() if len(where) > 1}
    assert not twice, f"bound more than once: {twice}"
    assert bound_functions('_x = fn("mt_a", I)\ny = _clib.fn("mt_b")\n"fn(\'mt_c\')"') == [
        "mt_a", "mt_b"]


# The C folder each binding module mirrors (csrc/<folder>), and the functions the
# loader binds for itself: the names it reads its constants, statuses and dtypes by.
ROOMS = {"core", "comm", "io", "linalg", "kernels"}
LOADER_OWN = {"mt_enum_at", "mt_reduce_op_name", "mt_dtype_name", "mt_status_name",
              "mt_strerror"}


def test_every_c_function_is_bound_in_the_binding_room_of_its_folder():
    """mpitensor._bind.<folder> binds the functions of csrc/<folder>'s headers
    (csrc/include/mpitensor/<folder>/), and nothing else binds any: a newcomer
    finds a binding, and binds a new function, by the folder of its C source."""
    headers = ROOT.parents[1] / "csrc" / "include" / "mpitensor"
    folder_of = {}
    for h in sorted(headers.rglob("*.h")):
        for c in set(re.findall(r"\b(mt_\w+)\s*\(", h.read_text())):
            folder_of.setdefault(c, h.parent.name)
    assert {d.name for d in headers.iterdir() if d.is_dir()} == ROOMS
    wrong = {}
    for name, path in modules().items():
        room = name.split(".")[2] if name.startswith(f"{PACKAGE}._bind.") else None
        for c in bound_functions(path.read_text()):
            if name == f"{PACKAGE}._clib" and c in LOADER_OWN:
                continue
            if room is None or folder_of.get(c, room) != room:
                wrong[c] = (name, folder_of.get(c))
    assert not wrong, f"bound outside the room of its folder (module, folder): {wrong}"
    assert set(ROOMS) == {p.stem for p in (ROOT / "_bind").glob("*.py")} - {"__init__"}


@pytest.mark.parametrize("source, expect", [
    ("import ctypes\n", True), ("import ctypes.util\n", True),
    ("from ctypes import c_int\n", True), ("def f():\n    import ctypes\n", True),
    ("from . import ctypes_like\n", False), ("import numpy\n", False)])
def test_a_ctypes_import_is_seen(source, expect):
    assert imports_ctypes(source) is expect


@pytest.mark.parametrize("importer, source, expect", [
    ("mpitensor.m", "from .a import x\n", {"mpitensor.a"}),
    ("mpitensor.m", "from . import b\n", {"mpitensor.b"}),
    ("mpitensor.sub.m", "from ..a import x\n", {"mpitensor.a"}),
    ("mpitensor.m", "import mpitensor.p.q\n", {"mpitensor.p", "mpitensor.p.q"}),
    ("mpitensor.sub.m", "from ..p import q\n", {"mpitensor.p", "mpitensor.p.q"}),
    ("mpitensor.sub.m", "from . import n\n", set()),  # its own package: running
])
def test_the_parser_resolves_imports(tmp_path, importer, source, expect):
    known = {"mpitensor.a", "mpitensor.b", "mpitensor.p", "mpitensor.p.q",
             "mpitensor.sub", "mpitensor.sub.m"}
    path = tmp_path / "m.py"
    path.write_text(source)
    targets, _ = imports_of(importer, path, known)
    assert targets == expect


def test_the_checks_catch_a_cycle_and_a_lazy_import(tmp_path):
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    path = tmp_path / "m.py"
    path.write_text("def f():\n    import numpy\n    from mpi4py import MPI\n")
    _, lazy = imports_of("mpitensor.m", path, set())
    assert lazy == [(2, "numpy"), (3, "mpi4py")]
