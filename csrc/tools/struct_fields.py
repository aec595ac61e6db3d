"""The field rows of every C struct Python reads, written from the headers at
build time, so that a field exists in one place, its header, and Python never
reads a layout written by hand that the C compiler could change under it.

csrc/ext/ext_structs.c lists the structs Python reads (``STRUCT(mt_box),`` lines)
and defines the row macros; this script finds each listed ``typedef struct NAME
{ ... } NAME;`` in the headers and writes, for each, the array the list points
to, one row per member in declaration order:

    a plain member ``int a``                  SCALAR(T, a)
    an array ``int64_t shape[MT_MAX_NDIM]``   ARRAY(T, shape)
    an array of arrays ``int x[N][M]``        ARRAY2(T, x)
    a data or function pointer ``*p``, ``(*f)(int)``   POINTER(T, p)
    a Python object ``PyObject *o``           OBJECT(T, o)

The C compiler then measures each row (offset, size, element type through
ext_structs.c's CTYPE, which fails the build for a type it does not name). A
member it cannot write a row for (a bit-field, a nested struct or union, an array
of pointers) stops the build with the header's text, rather than a guess.

Example (what CMake runs; the output is included by ext_structs.c):

    python csrc/tools/struct_fields.py build/struct_fields.inc \\
        csrc/ext/ext_structs.c csrc/include/mpitensor/core/status.h csrc/ext/ext.h

writes, for ``typedef struct mt_error { int code; char msg[MT_ERROR_LEN]; }
mt_error;``::

    static const field fields_mt_error[] = {
        SCALAR(mt_error, code),
        ARRAY(mt_error, msg),
        END};
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
TYPEDEF = re.compile(r"typedef\s+struct\s+(\w+)\s*\{")
# The structs ext_structs.c lists, one per line of its table (not its #define).
LISTED = re.compile(r"^\s+STRUCT\((\w+)\),?\s*$", re.M)
FUNCTION_POINTER = re.compile(r"^[\w\s*]+\(\s*\*\s*(\w+)\s*\)\s*\([^()]*\)$")
FIRST = re.compile(r"^([A-Za-z_][\w\s]*?)\s*((?:\*\s*)*)\b(\w+)\s*((?:\[[^\]]+\]\s*)*)$")
MORE = re.compile(r"^((?:\*\s*)*)\b(\w+)\s*((?:\[[^\]]+\]\s*)*)$")
# Rows that take the size of a pointer, which clang-tidy would question where the
# pointee is a struct (bugprone-sizeof-expression): a pointer's size is the row's.
NOLINT = "  // NOLINT(bugprone-sizeof-expression)"


def struct_bodies(text: str) -> dict[str, str]:
    """{name: body, comments out} of each ``typedef struct NAME {...} NAME;`` of a
    header's ``text``."""
    text, out = COMMENT.sub(" ", text), {}
    for m in TYPEDEF.finditer(text):
        depth, end = 1, m.end()
        while depth and end < len(text):  # the closing brace, past nested ones
            depth += {"{": 1, "}": -1}.get(text[end], 0)
            end += 1
        if re.match(rf"\s*{m.group(1)}\s*;", text[end:]):
            out[m.group(1)] = text[m.end():end - 1]
    return out


def _row(struct: str, base: str, stars: str, name: str, extents: str) -> str:
    """The row macro of one declarator: ``base`` the type's words, ``stars`` its
    pointer marks, ``extents`` its ``[N]`` suffixes."""
    ndims = extents.count("[")
    if stars and ndims:
        raise ValueError(f"{struct}.{name}: an array of pointers has no row")
    if stars:
        one_object = base.split() == ["PyObject"] and stars.count("*") == 1
        return f"{'OBJECT' if one_object else 'POINTER'}({struct}, {name})"
    if ndims > 2:
        raise ValueError(f"{struct}.{name}: arrays of more than two dimensions have no row")
    return f"{('SCALAR', 'ARRAY', 'ARRAY2')[ndims]}({struct}, {name})"


def rows(struct: str, body: str) -> list[str]:
    """The row macros of a struct's members, in declaration order."""
    out = []
    for decl in (" ".join(d.split()) for d in body.split(";")):
        if not decl:
            continue
        if "{" in decl or ":" in decl or "#" in decl:
            raise ValueError(f"{struct}: no row for '{decl}' (a nested struct or union, "
                             "a bit-field or a preprocessor line)")
        pointer = FUNCTION_POINTER.match(decl)
        if pointer:
            out.append(f"POINTER({struct}, {pointer.group(1)})")
            continue
        first, *more = decl.split(",")
        m = FIRST.match(first.strip())
        if m is None or not m.group(1).strip():
            raise ValueError(f"{struct}: cannot read the member '{decl}'")
        base = m.group(1)
        out.append(_row(struct, base, *m.group(2, 3, 4)))
        for part in more:
            n = MORE.match(part.strip())
            if n is None:
                raise ValueError(f"{struct}: cannot read the member '{decl}'")
            out.append(_row(struct, base, *n.groups()))
    return out


def generate(listed: list[str], headers: dict[str, str]) -> str:
    """The text of the rows file: a ``fields_NAME[]`` array for each struct of
    ``listed``, read from ``headers`` ({path: text}); ValueError names a struct no
    header declares or a member that has no row."""
    bodies, found_in = {}, {}
    for path, text in headers.items():
        for name, body in struct_bodies(text).items():
            bodies[name], found_in[name] = body, path
    parts = ["/* Generated at build time by csrc/tools/struct_fields.py from the "
             "headers named\n * below: edit the header, never this file. */"]
    for name in listed:
        if name not in bodies:
            raise ValueError(f"{name}: no 'typedef struct {name} {{...}} {name};' "
                             "in the headers")
        lines = [f"    {r},{NOLINT if r.startswith(('POINTER', 'OBJECT')) else ''}"
                 for r in rows(name, bodies[name])]
        parts.append(f"/* {Path(found_in[name]).name} */\n"
                     f"static const field fields_{name}[] = {{\n"
                     + "\n".join(lines) + "\n    END};")
    return "\n".join(parts) + "\n"


def main(argv: list[str]) -> int:
    """``struct_fields.py OUT LIST.c HEADER...``: write OUT, the rows of each
    struct LIST.c lists; status 1 with the reason when one has none."""
    if len(argv) < 3:
        print(main.__doc__, file=sys.stderr)
        return 2
    out, listing, *headers = (Path(a) for a in argv)
    listed = LISTED.findall(listing.read_text())
    try:
        if not listed:
            raise ValueError(f"{listing} lists no struct (no 'STRUCT(name),' line)")
        text = generate(listed, {str(h): h.read_text() for h in headers})
    except ValueError as e:
        print(f"struct_fields.py: {e}", file=sys.stderr)
        return 1
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
