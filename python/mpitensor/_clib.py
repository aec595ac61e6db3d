"""The one door into C by ctypes: the binding modules (:mod:`mpitensor._bind`, one
per folder of csrc) load the ``_C`` shared object through ``lib`` here, bind each
function once at import with :func:`fn`, and lay out each C struct they read with
:func:`struct`, from the table the extension exports (csrc/ext/ext_structs.c),
never from a copy. They import no ctypes: a prototype names a struct for a pointer
to one and :class:`A` for an array's data, so a call passes structs and ndarrays
as they are; the libraries loaded beside (BLAS, LAPACK) come through :func:`load`.
This module binds only what it reads itself: the names of the core's constants
(``CORE``), statuses and dtypes.

It also gives them the array checks and the status -> exception rule the
extension uses, so a failing call raises what ``_C`` would raise. ctypes releases
the GIL while a function runs. Every function here is Local.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import glob
import importlib.metadata
import itertools
import operator
import os
import sys
import types

import numpy as np
from threadpoolctl import threadpool_info

from . import _C

lib = ctypes.CDLL(_C.__file__)  # the loaded extension itself: one object, one state

P, I, I64, D = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_double
U32, U64, SIZE, S = ctypes.c_uint32, ctypes.c_uint64, ctypes.c_size_t, ctypes.c_char_p
# For the modules that bind through here.
ptr, sizeof, find_library = ctypes.POINTER, ctypes.sizeof, ctypes.util.find_library


class A:
    """An argument type: an ndarray passes its data pointer, ``None`` NULL, an int
    that address; so a call passes arrays as they are."""

    @staticmethod
    def from_param(a):
        # The extension reads the address: NumPy's .ctypes makes an object per read.
        return P(_C.data_address(a) if isinstance(a, np.ndarray) else a)


def _arg_type(t):
    """A struct or a C array type in a prototype is a pointer to one: ctypes then
    passes an instance by reference."""
    by_ref = isinstance(t, type) and issubclass(t, (ctypes.Structure, ctypes.Array))
    return ctypes.POINTER(t) if by_ref else t


def fn(name, restype, *argtypes):
    """The exported C function ``name`` with its prototype, a struct or C array
    type standing for a pointer to one (see :func:`_arg_type`); bind it once, at
    import.

    Example: ``fn("mt_mesh_check", I, P, E)``.
    """
    f = getattr(lib, name)
    f.restype, f.argtypes = restype, [_arg_type(t) for t in argtypes]
    return f


# The pointer in a capsule of the given name (the executor hands plans over as
# capsules, the extension its counters, modes and tables: see :func:`exported`);
# ValueError for another capsule or an object that is none.
capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
capsule_pointer.restype, capsule_pointer.argtypes = P, (ctypes.py_object, S)


def load(path: str):
    """The shared library at ``path``, its symbols kept to itself (RTLD_LOCAL), all
    bound at once; OSError when it does not load.

    Example: ``address(load(path), "cblas_dgemm")``.
    """
    return ctypes.CDLL(path, mode=os.RTLD_LOCAL | os.RTLD_NOW)


def mkl_library(stem: str) -> str | None:
    """The path of the ``mkl`` package's library whose file name starts with
    ``stem``: from the package's file list, else in sys.prefix/lib (where pip puts
    it); None when it is not installed.

    Example: ``mkl_library("libmkl_core.so")`` -> ``'/venv/lib/libmkl_core.so.3'``.
    """
    found = []
    try:
        found = [str(f.locate()) for f in importlib.metadata.files("mkl") or ()
                 if os.path.basename(str(f)).startswith(stem)]
    except importlib.metadata.PackageNotFoundError:
        pass
    found += sorted(glob.glob(os.path.join(sys.prefix, "lib", glob.escape(stem) + "*")))
    return next((os.path.normpath(path) for path in found if os.path.exists(path)), None)


def numpy_openblas() -> str | None:
    """The path of the OpenBLAS NumPy loaded, as threadpoolctl finds it among this
    process's libraries, or None. NumPy's wheel bundles scipy-openblas, whose build
    comes first (its prefix names the symbols the callers try); a NumPy built
    against a system OpenBLAS loads that. NumPy's wheel's own file layout is no API.

    Example: ``numpy_openblas()`` -> ``'.../numpy.libs/libscipy_openblas64_-....so'``.
    """
    found = [i for i in threadpool_info()
             if i.get("user_api") == "blas" and i.get("internal_api") == "openblas"]
    found.sort(key=lambda i: i.get("prefix") != "libscipy_openblas")
    return found[0]["filepath"] if found else None


def address(lib_, name: str) -> int:
    """The address of symbol ``name`` of a loaded library; AttributeError when it
    has none.

    Example: ``address(lib, "mt_chunk") > 0``.
    """
    return ctypes.cast(getattr(lib_, name), P).value


def traceback_dumper():
    """(the address of CPython's dumper of every thread's traceback, that of the
    main interpreter): what a C thread calls, without the GIL, to print where each
    Python thread is, as faulthandler's watchdog thread does; None where this
    Python exports neither.

    Example: ``dump, interpreter = traceback_dumper()``.
    """
    try:
        dump = address(ctypes.pythonapi, "_Py_DumpTracebackThreads")
        main = ctypes.pythonapi.PyInterpreterState_Main
    except AttributeError:
        return None
    main.restype = P
    return dump, main()


def text_buffer(size: int):
    """A writable C string of ``size`` bytes, for a function that writes text.

    Example: ``call(f, text_buffer(256), 256); text.value.decode()``.
    """
    return ctypes.create_string_buffer(size)


def _constants() -> types.SimpleNamespace:
    """The core's constants by name (mt_enum_at: LABEL_KEEP, REDUCE_SUM, MAX_NDIM,
    ...), with ``REDUCE_OPS``, torch's names of the reduce ops by code."""
    enum_at = fn("mt_enum_at", ctypes.c_char_p, I, ctypes.POINTER(I))
    op_name = fn("mt_reduce_op_name", ctypes.c_char_p, I)
    value, names = I(), {}
    for i in itertools.count():
        name = enum_at(i, ctypes.byref(value))
        if name is None:
            break
        names[name.decode()] = value.value
    ops = tuple(op_name(op).decode() for op in range(names["REDUCE_COUNT"]))
    return types.SimpleNamespace(**names, REDUCE_OPS=ops)


# What Python knows of the core's enums and limits: read here, never copied.
CORE = _constants()
MAX_NDIM, MAX_MESH_NDIM = CORE.MAX_NDIM, CORE.MAX_MESH_NDIM  # the sizes of mt_layout's arrays


# {C struct name: (sizeof, ((field, element type, offset, size, extents), ...))} and
# {capsule name: (element type, size, extents)}: the extension's tables.
STRUCTS, EXPORTS = types.MappingProxyType(_C.STRUCTS), types.MappingProxyType(_C.EXPORTS)
# The ctypes type of each scalar type the table names.
_SCALARS = {"bool": ctypes.c_bool, "char": ctypes.c_char, "int": I,
            "unsigned int": ctypes.c_uint, "long": ctypes.c_long,
            "unsigned long": ctypes.c_ulong, "long long": ctypes.c_longlong,
            "unsigned long long": ctypes.c_ulonglong, "double": D, "void *": P,
            "PyObject *": ctypes.py_object}


def build(name: str, sizeof: int, fields) -> type:
    """A ctypes Structure of ``fields`` (rows of :data:`STRUCTS`), ImportError
    naming the struct and the field where ctypes would not lay it out at C's
    offsets and sizes. Its instances take no attribute but the fields, so a
    misspelt or vanished field name raises instead of being set aside."""
    def ctype(field, kind, dims):
        if kind not in _SCALARS and kind not in STRUCTS:
            raise ImportError(f"{name}.{field}: no ctypes type for C type {kind!r}")
        t = _SCALARS.get(kind) or struct(kind)
        for n in reversed(dims):
            t = t * n
        return t

    cls = type(name, (ctypes.Structure,), {
        "__slots__": (), "__module__": __name__,
        "_fields_": [(f, ctype(f, kind, dims)) for f, kind, _, _, dims in fields]})
    for f, _, offset, size, _ in fields:
        got = getattr(cls, f)
        if (got.offset, got.size) != (offset, size):
            raise ImportError(f"{name}.{f}: ctypes lays it out at byte {got.offset} "
                              f"({got.size} bytes), C at byte {offset} ({size} bytes)")
    if ctypes.sizeof(cls) != sizeof:
        raise ImportError(f"{name}: ctypes makes it {ctypes.sizeof(cls)} bytes, C "
                          f"{sizeof}")
    return cls


@functools.cache
def struct(name: str) -> type:
    """The ctypes Structure of C struct ``name``, laid out from the extension's
    table and checked against it (:func:`build`); fill it by field name.

    Example: ``struct("mt_box")(ndim=1).shape[0] == 0``.
    """
    try:
        return build(name, *STRUCTS[name])
    except KeyError:
        raise ImportError(f"{name} is not in the extension's table of structs "
                          "(csrc/ext/ext_structs.c)") from None


def exported(capsule, name: str, kind: type | None = None):
    """What the extension's ``capsule`` points to, read as the extension's table of
    exports says (csrc/ext/ext_structs.c): a ctypes view of its struct or array,
    read and written in place (``kind``, a subclass of that struct, when given), or
    the address of an object Python only passes back to C. ValueError for a
    capsule of another name, ImportError when the table has no such export or its
    type is not ``kind``'s: a renamed or retyped export fails at import instead of
    misreading memory. Read each once, at import.

    Example: ``exported(_C.HOOK_CALLS, "mpitensor._C.hook_calls")[0] >= 0``.
    """
    try:
        elem, size, dims = EXPORTS[name]
    except KeyError:
        raise ImportError(f"{name} is not in the extension's table of exports "
                          "(csrc/ext/ext_structs.c)") from None
    address_ = capsule_pointer(capsule, name.encode())
    if elem == "opaque":
        if kind is not None:
            raise ImportError(f"{name} is opaque: it cannot be read as {kind.__name__}")
        return address_
    t = _SCALARS.get(elem) or struct(elem)
    for n in reversed(dims):
        t = t * n
    if kind is not None:
        if not (isinstance(kind, type) and issubclass(kind, t)) or dims:
            raise ImportError(f"{name} points to {elem}, not {kind.__name__}")
        t = kind
    if ctypes.sizeof(t) != size:
        raise ImportError(f"{name}: ctypes makes it {ctypes.sizeof(t)} bytes, C {size}")
    return t.from_address(address_)


Error, _Placement, _Box, _Layout, _Selection = map(struct, (
    "mt_error", "mt_placement", "mt_box", "mt_layout", "mt_selection"))
E = ctypes.POINTER(Error)  # the last argument of every fallible function
_dtype_name = fn("mt_dtype_name", ctypes.c_char_p, I)
_status_name = fn("mt_status_name", ctypes.c_char_p, I)
_strerror = fn("mt_strerror", ctypes.c_char_p, I)

# The core's element type codes (mpitensor/core/dtype.h) by NumPy's dtype names.
_DTYPE_CODES = {_dtype_name(i).decode(): i for i in range(64)
                if _dtype_name(i) != b"unknown"}
# The codes of the two element types the library computes in.
CODES = {np.dtype(t).type: _DTYPE_CODES[t] for t in ("float32", "float64")}
_STATUS_CODES = {_status_name(c).decode(): c for c in range(0, -64, -1)}
# The exception of each status and back, most specific first: the extension's one
# table (csrc/ext/ext_args.c), read, never copied.
_EXCEPTIONS = dict(_C.STATUS_EXCEPTIONS)
_STATUSES = tuple((kind, code) for code, kind in _C.STATUS_EXCEPTIONS)


def check(rc: int, err: Error) -> None:
    """Raises the exception of status ``rc`` with the message in ``err``."""
    if rc != 0:
        kind = _EXCEPTIONS.get(rc, RuntimeError)
        raise kind(err.msg.decode(errors="replace") or _strerror(rc).decode())


def call(f, *args) -> None:
    """f(*args, &err), raising the exception of the status it returns."""
    err = Error()
    check(f(*args, ctypes.byref(err)), err)


def status_of(kind: type) -> int:
    """The status that :func:`check` turns back into the exception class ``kind``
    (or its closest base); the core's invalid-state status for any other."""
    return next((code for k, code in _STATUSES if issubclass(kind, k)),
                _STATUS_CODES["MT_ESTATE"])


def message(text: str) -> bytes:
    """``text`` as UTF-8 that fits an mt_error's message, cut at a character
    boundary when it is too long."""
    return text.encode()[:Error.msg.size - 1].decode(errors="ignore").encode()


# dtype object -> its code, for the dtypes the core knows (a few objects each): a
# dtype's name is built anew on each read, which would cost every ctypes call that
# moves an array more than the call itself.
_CODE_OF: dict = {}


def dtype_code(dtype) -> int:
    """The core's code of NumPy ``dtype``, or -2 for one the core does not know.

    Example: ``dtype_code(np.dtype("float64")) == dtype_code("f8")``.
    """
    code = _CODE_OF.get(dtype) if isinstance(dtype, np.dtype) else None
    if code is None:
        code = _DTYPE_CODES.get(np.dtype(dtype).name, -2)
        if isinstance(dtype, np.dtype) and code >= 0:
            _CODE_OF[dtype] = code
    return code


def array(a, name: str, dtype: int | None = None, strided: bool = False,
          out: bool = False) -> int:
    """The element type code of ``a``: an aligned, native float32 or float64
    ndarray (of code ``dtype`` when given), C-contiguous unless ``strided``,
    writable when it is an ``out``put."""
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be an ndarray, got {type(a).__name__}")
    code = CODES.get(a.dtype.type)
    if code is None or dtype not in (None, code):
        raise TypeError(f"{name}: float32 or float64 of one dtype, got {a.dtype!r}")
    if not (a.flags.aligned and a.dtype.isnative and (strided or a.flags.c_contiguous)):
        raise ValueError(f"{name} must be an aligned C-contiguous array")
    if out and not a.flags.writeable:
        raise ValueError(f"{name} must be writable")
    return code


def _int64s(seq, cap: int, what: str):
    """A C array of the ints of ``seq`` (at most ``cap``) and their count."""
    values = [operator.index(v) for v in seq]
    if len(values) > cap:
        raise ValueError(f"{what} has {len(values)} entries; at most {cap} are supported")
    if any(not -2**63 <= v < 2**63 for v in values):
        raise OverflowError(f"{what}: an entry does not fit in 64 bits")
    return (I64 * max(len(values), 1))(*values), len(values)
