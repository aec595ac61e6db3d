"""The walls between mpitensor's C libraries, read from the built archives.

Usage: check_walls.py src=CSRC core=LIB kernels=LIB comm=LIB io=LIB linalg=LIB   (ctest runs it)

Fails, naming what it found, when
- a source of a library includes another library's private header, or the public
  header of a library that is not below its own;
- a public header (csrc/include/mpitensor/LIBRARY/) includes a private header, or
  the public header of a library that is not below its own;
- the same holds for the extension (csrc/ext), which sits above every library and
  has no public header: it may include any library's public headers and its own
  private ones, and nothing includes its headers;
- a file outside the extension includes Python's, NumPy's or mpi4py's headers;
- an object file calls into a library that is not below its own (calls go down:
  core <- kernels, core <- comm <- io, comm <- linalg);
- object files call each other in a cycle (within or across libraries), or the
  extension's files do (read from their sources: a file uses what another
  defines of the names mt_ext_*);
- a file of the extension but its hook table (ext_hooks.c) calls a Python
  callable: C reaches Python only through the hook table, which counts each call;
- the core or the kernels use MPI, threads or file I/O;
- an object holds process-wide mutable state (a writable global or static) that
  is not one of the few documented at their definition (the block pool, the live
  communicator count, MPI's user-defined operations, the process token, the
  collective watchdog's and its listening for ranks that leave).
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from graphs import strongly_connected  # noqa: E402  (tests/graphs.py)

BELOW = {"core": {"core"}, "kernels": {"kernels", "core"}, "comm": {"comm", "core"},
         "io": {"io", "comm", "core"}, "linalg": {"linalg", "comm", "core"}}
# Whose headers each directory may include: the libraries', and the extension's. The
# extension is no archive of the C build (only of the Python one), so only its
# includes are checked.
INCLUDES = {**BELOW, "ext": {"ext", "io", "linalg", "comm", "kernels", "core"}}
# Headers only the extension may include: it is the one floor that knows Python.
PYTHON_HEADER = re.compile(r'^#include [<"](Python\.h|numpy/[^>"]+|mpi4py/[^>"]+)[>"]', re.M)

# Symbols the pure libraries (core, kernels) must not use.
FORBIDDEN = re.compile(
    r"^(P?MPI_\w+|ompi_\w+|pthread_\w+|f?open(64)?|fclose|fread|fwrite|fseek|read|write|"
    r"p(read|write)(64)?|close|f?truncate(64)?|f?stat(64)?|rename|remove|unlink|mmap|"
    r"process_vm_readv)$")
PURE = {"core", "kernels"}

# The process-wide mutable state that must stay, each documented where it is
# defined with its thread-safety: (object file, symbol).
ALLOWED_STATE = {
    ("pool.c.o", "lock"), ("pool.c.o", "slots"), ("pool.c.o", "cached"),
    ("pool.c.o", "limit"), ("mesh.c.o", "live_comms"), ("mesh.c.o", "threads_numbered"),
    ("mpi_types.c.o", "user_ops"),
    ("mpi_types.c.o", "user_state"), ("direct.c.o", "token"),
    ("direct.c.o", "failures_asked"),
    ("watchdog.c.o", "mt__waiting_in"), ("watchdog.c.o", "mt__waits"),
    ("watchdog.c.o", "mt__routine_in"), ("watchdog.c.o", "dumper"),
    ("watchdog.c.o", "dump_arg"), ("mpi_error.c.o", "mt__mpi_failure_hook"),
    ("watchdog.c.o", "timeout_ms"), ("watchdog.c.o", "state"), ("departure.c.o", "ear"),
}

# Each library's public headers are the folder csrc/include/mpitensor/LIBRARY/; the
# umbrella mpitensor/mpitensor.h gathers the core's.
UMBRELLA = {"mpitensor/mpitensor.h": "core"}

LINE = re.compile(r"^[0-9a-f]+ (.{7}) (\S+)\s+[0-9a-f]+\s+(?:\S+\s+)?(\S+)$")


def symbols(archive: str):
    """{member: (defined globals, undefined, writable data objects)} of an archive."""
    out = subprocess.run(["objdump", "-t", archive], check=True, capture_output=True,
                         text=True).stdout
    members, cur = {}, None
    for line in out.splitlines():
        head = re.match(r"^(\S+\.o):\s+file format", line)
        if head:
            cur = members.setdefault(head.group(1), (set(), set(), set()))
            continue
        m = LINE.match(line)
        if cur is None or m is None:
            continue
        flags, section, name = m.groups()
        if section == "*UND*":
            cur[1].add(name)
        elif flags[0] == "g" and section != "*ABS*":
            cur[0].add(name)
        writable = section in (".data", ".bss", ".tdata", ".tbss") or (
            section.startswith((".data.", ".bss.")) and ".rel.ro" not in section)
        if writable and flags[6] == "O":
            cur[2].add(name.split(".")[0])
    return members


def header_owner(src: str, name: str):
    """The library whose public header `name` ("mpitensor/comm/mesh.h") is, or None
    when it is none's or does not exist."""
    if not os.path.exists(os.path.join(src, "include", name)):
        return None
    folder = re.fullmatch(r"mpitensor/(\w+)/\w+\.h", name)
    if folder:
        return folder.group(1) if folder.group(1) in BELOW else None
    return UMBRELLA.get(name)


def include_problems(src: str) -> list[str]:
    """Includes that cross a wall, in every library's and the extension's sources,
    private headers and public headers."""
    problems = []
    for lib in INCLUDES:
        own = sorted(glob.glob(os.path.join(src, lib, "*.[ch]")))
        public = sorted(glob.glob(os.path.join(src, "include", "mpitensor", lib, "*.h")))
        public += [os.path.join(src, "include", u) for u, o in UMBRELLA.items() if o == lib]
        for path in own + public:
            text, where = open(path).read(), os.path.relpath(path, src)
            for name in re.findall(r'^#include "([^"]+)"', text, re.M):
                if name.startswith("mpitensor/"):
                    ok = header_owner(src, name) in INCLUDES[lib]
                else:  # a private header: only the library's own sources have them
                    ok = path in own and os.path.exists(os.path.join(src, lib, name))
                if not ok:
                    problems.append(f"{where} includes {name}")
            if lib != "ext":
                problems += [f"{where} includes {name}: only csrc/ext knows Python"
                             for name in PYTHON_HEADER.findall(text)]
    return problems


def ext_edges(src: str) -> dict:
    """{file: files whose mt_ext_* functions or objects it uses} of csrc/ext, from
    the sources with their comments taken out: a definition starts a line (not
    static) and goes on to a body or an initialiser."""
    texts = {os.path.basename(p): re.sub(r"/\*.*?\*/|//[^\n]*", "", open(p).read(), flags=re.S)
             for p in sorted(glob.glob(os.path.join(src, "ext", "*.c")))}
    definition = re.compile(r"^(?!static)[A-Za-z][^;{}()=]*?\b(mt_ext_\w+)"
                            r"\s*(?:\([^;]*?\)\s*\{|(?:\[\w*\])?\s*=)", re.M)
    owner = {name: f for f, text in texts.items() for name in definition.findall(text)}
    return {f: {owner[n] for n in re.findall(r"\bmt_ext_\w+\b", text)
                if owner.get(n, f) != f} for f, text in texts.items()}


# CPython's ways to call a callable (PyObject_Call, _CallMethod, _CallOneArg,
# _Vectorcall, ..., and PyObject_VectorcallMethod).
PYTHON_CALL = re.compile(r"\b(PyObject_(?:Call\w*|Vectorcall\w*)|PyEval_Call\w*)\s*\(")


def python_calls(src: str) -> list[str]:
    """Where a file of csrc/ext other than the hook table calls a Python callable:
    "file: function" for each, from the sources with their comments taken out."""
    found = []
    for path in sorted(glob.glob(os.path.join(src, "ext", "*.c"))):
        name = os.path.basename(path)
        if name == "ext_hooks.c":
            continue
        text = re.sub(r"/\*.*?\*/|//[^\n]*", "", open(path).read(), flags=re.S)
        found += [f"{name}: {call}" for call in sorted(set(PYTHON_CALL.findall(text)))]
    return found


def cycles(edges: dict) -> list:
    """The strongly connected components of more than one object file (a file that
    calls itself is no cycle)."""
    return [comp for comp in strongly_connected(edges) if len(comp) > 1]


def main(argv: list[str]) -> int:
    libs = dict(arg.split("=", 1) for arg in argv)
    src = libs.pop("src", None)
    if set(libs) != set(BELOW) or src is None:
        print(f"expected src=CSRC and {sorted(BELOW)}=archive arguments", file=sys.stderr)
        return 2
    where, members = {}, {}
    for lib, path in libs.items():
        for member, table in symbols(path).items():
            members[(lib, member)] = table
            for name in table[0]:
                where[name] = (lib, member)
    problems, edges, calls = include_problems(src), {}, []
    for (lib, member), (_, undefined, state) in sorted(members.items()):
        for name in sorted(undefined):
            if lib in PURE and FORBIDDEN.match(name):
                problems.append(f"{lib}/{member} uses {name}: no MPI, threads or files "
                                f"in the {lib} library")
            target = where.get(name)
            if target is None or target == (lib, member):
                continue
            calls.append(f"{lib}/{member} -> {target[0]}/{target[1]}: {name}")
            edges.setdefault((lib, member), set()).add(target)
            if target[0] not in BELOW[lib]:
                problems.append(f"{lib}/{member} calls {name} of {target[0]}/{target[1]}: "
                                f"{target[0]} is not below {lib}")
        for name in sorted(state):
            # AddressSanitizer's own markers of globals are not the program's state.
            if (member, name) not in ALLOWED_STATE and not name.startswith("__odr_asan"):
                problems.append(f"{lib}/{member} holds process-wide mutable state "
                                f"'{name}'")
    for comp in cycles(edges):
        problems.append("call cycle between " + ", ".join(f"{l}/{m}" for l, m in comp))
    for comp in cycles(ext_edges(src)):
        problems.append("call cycle between " + ", ".join(f"ext/{f}" for f in comp))
    problems += [f"{where} calls Python outside the hook table (mt_ext_hook)"
                 for where in python_calls(src)]
    if "-v" in sys.argv or problems:
        print("\n".join(calls))
    for p in problems:
        print("WALL BROKEN:", p)
    print(f"check_walls: {len(members)} object files, {len(calls)} cross-file calls, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main([a for a in sys.argv[1:] if a != "-v"]))
