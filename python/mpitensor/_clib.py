"""The C functions that take no Python object and touch no MPI, called through
ctypes in libmpitensor_local.so, which is installed beside mpitensor._C: the core's
layout math, random fills and the names of its constants (``CORE``) here, the nn
kernels in :mod:`mpitensor.nn._ckernels`, the kernels along an axis in
:mod:`mpitensor._ops._lanes`.

This is the one loader of that library: it gives every binding the library, the
C prototypes, the array checks and the status -> exception rule the extension
uses, so a failing call raises what ``_C`` would raise; :mod:`mpitensor._comm`
binds the functions ``_C`` itself exports with the same helpers. ctypes releases
the GIL while a function runs. Every function here is Local.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import operator
import os
import types

import numpy as np

from . import _C

lib = ctypes.CDLL(os.path.join(os.path.dirname(_C.__file__), "libmpitensor_local.so"))

P, I, I64, D = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64, ctypes.c_double


def fn(name, restype, *argtypes, library=lib):
    """The function ``name`` of ``library`` (this one unless given) with its C
    prototype."""
    f = getattr(library, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


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


class Error(ctypes.Structure):  # mt_error
    _fields_ = [("code", I), ("msg", ctypes.c_char * 512)]  # MT_ERROR_LEN


class _Placement(ctypes.Structure):  # mt_placement
    _fields_ = [("kind", I), ("dim", I), ("reduce_op", I)]


class _Box(ctypes.Structure):  # mt_box
    _fields_ = [("ndim", I), ("offset", I64 * MAX_NDIM), ("shape", I64 * MAX_NDIM)]


class _Layout(ctypes.Structure):  # mt_layout
    _fields_ = [("ndim", I), ("shape", I64 * MAX_NDIM), ("mesh_ndim", I),
                ("mesh_shape", I64 * MAX_MESH_NDIM),
                ("placements", _Placement * MAX_MESH_NDIM)]


_E = ctypes.POINTER(Error)
_dtype_name = fn("mt_dtype_name", ctypes.c_char_p, I)
_status_name = fn("mt_status_name", ctypes.c_char_p, I)
_strerror = fn("mt_strerror", ctypes.c_char_p, I)
_chunk = fn("mt_chunk", None, I64, I64, I64, ctypes.POINTER(I64), ctypes.POINTER(I64))
_strides = fn("mt_layout_contiguous_strides", None, I, P, P)
_layout_init = fn("mt_layout_init", I, ctypes.POINTER(_Layout), I, P, I, P, P, _E)
_local_box = fn("mt_layout_local_box", I, ctypes.POINTER(_Layout), P,
                ctypes.POINTER(_Box), _E)
_even_global = fn("mt_layout_even_global_shape", I, I, P, I, P, P, P, _E)
_rng_fill_box = fn("mt_rng_fill_box", I, P, I, I, ctypes.c_uint64, ctypes.c_uint64, P,
                   ctypes.POINTER(_Box), _E)

# The core's element type codes (mpitensor/core/dtype.h) by NumPy's dtype names.
_DTYPE_CODES = {_dtype_name(i).decode(): i for i in range(64)
                if _dtype_name(i) != b"unknown"}
# The codes of the two element types the library computes in.
CODES = {np.dtype(t).type: _DTYPE_CODES[t] for t in ("float32", "float64")}
# The exception of each status, as the extension raises them (csrc/ext/ext_args.c).
_STATUS_CODES = {_status_name(c).decode(): c for c in range(0, -64, -1)}
_EXCEPTIONS = {b"MT_EINVAL": ValueError, b"MT_EINDEX": IndexError, b"MT_ETYPE": TypeError,
               b"MT_ENOMEM": MemoryError, b"MT_ENOTSUP": NotImplementedError,
               b"MT_EOVERFLOW": OverflowError, b"MT_EIO": OSError}


# The status of each exception class, subclasses before their bases
# (NotImplementedError is a RuntimeError): the inverse of _EXCEPTIONS.
_STATUSES = tuple(sorted(((kind, _STATUS_CODES[name.decode()])
                         for name, kind in _EXCEPTIONS.items()),
                        key=lambda pair: -len(pair[0].__mro__)))


def check(rc: int, err: Error) -> None:
    """Raises the exception of status ``rc`` with the message in ``err``."""
    if rc != 0:
        kind = _EXCEPTIONS.get(_status_name(rc), RuntimeError)
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


def _layout(shape, mesh_shape, codes) -> _Layout:
    """The checked layout of ``shape`` over ``mesh_shape`` by placement codes
    ((kind, dim, reduce_op) triples)."""
    sh, nd = _int64s(shape, MAX_NDIM, "shape")
    ms, nm = _int64s(mesh_shape, MAX_MESH_NDIM, "mesh shape")
    pl, npl = _placements(codes)
    if npl != nm:
        raise ValueError(f"{npl} placements were given for a {nm}-D mesh")
    out = _Layout()
    call(_layout_init, ctypes.byref(out), nd, sh, nm, ms, pl)
    return out


def _placements(codes):
    """A C array of placements of (kind, dim, reduce_op) codes, and their count."""
    codes = tuple(codes)
    if len(codes) > MAX_MESH_NDIM:
        raise ValueError(f"at most {MAX_MESH_NDIM} placements are supported")
    return (_Placement * MAX_MESH_NDIM)(*(_Placement(*map(operator.index, c))
                                          for c in codes)), len(codes)


@functools.lru_cache(maxsize=4096)
def chunk_sizes(n: int, k: int) -> tuple[int, ...]:
    """The sizes of the ``k`` chunks torch.chunk cuts ``n`` items into (the shards
    of a dim of n over k ranks; mt_chunk).

    Example: ``chunk_sizes(10, 4) == (3, 3, 3, 1)``.
    """
    n, k = operator.index(n), operator.index(k)
    if n < 0 or k < 1 or k > 1 << 24 or n >= 2**63:
        raise ValueError("chunk_sizes(n, k) needs n >= 0 and k >= 1")
    size, offset = I64(), I64()
    out = []
    for i in range(k):
        _chunk(n, k, i, ctypes.byref(size), ctypes.byref(offset))
        out.append(size.value)
    return tuple(out)


@functools.lru_cache(maxsize=4096)
def _strides_of(shape: tuple) -> tuple[int, ...]:
    sh, n = _int64s(shape, MAX_NDIM, "shape")
    st = (I64 * max(n, 1))()
    _strides(n, sh, st)
    return tuple(st[:n])


def contiguous_strides(shape) -> tuple[int, ...]:
    """torch's strides of a contiguous tensor of ``shape`` (a dim of size 0 counts
    as 1; mt_layout_contiguous_strides).

    Example: ``contiguous_strides((4, 0)) == (1, 1)``.
    """
    return _strides_of(tuple(shape))


@functools.lru_cache(maxsize=4096)
def local_box(global_shape: tuple, mesh_shape: tuple, coordinate: tuple, codes: tuple):
    """(shape, offset) of the box at mesh ``coordinate`` of a tensor laid out by
    placement ``codes`` (mt_layout_local_box).

    Example: ``local_box((5,), (4,), (3,), ((1, 0, 0),)) == ((0,), (5,))``.
    """
    layout = _layout(global_shape, mesh_shape, codes)
    coord, n = _int64s(coordinate, MAX_MESH_NDIM, "coordinate")
    if n != layout.mesh_ndim:
        raise ValueError(f"a coordinate of {n} entries on a {layout.mesh_ndim}-D mesh")
    box = _Box()
    call(_local_box, ctypes.byref(layout), coord, ctypes.byref(box))
    return tuple(box.shape[:box.ndim]), tuple(box.offset[:box.ndim])


@functools.lru_cache(maxsize=4096)
def even_global_shape(local_shape: tuple, mesh_shape: tuple, codes: tuple):
    """The global shape evenly sharded local shards of ``local_shape`` make
    (mt_layout_even_global_shape).

    Example: ``even_global_shape((3,), (4,), ((1, 0, 0),)) == (12,)``.
    """
    local, nd = _int64s(local_shape, MAX_NDIM, "local shape")
    ms, nm = _int64s(mesh_shape, MAX_MESH_NDIM, "mesh shape")
    pl, npl = _placements(codes)
    if npl != nm:
        raise ValueError(f"{npl} placements were given for a {nm}-D mesh")
    out = (I64 * max(nd, 1))()
    call(_even_global, nd, local, nm, ms, pl, out)
    return tuple(out[:nd])


def rng_fill(out: np.ndarray, global_shape, offset, seed: int, stream: int,
             dist: int) -> None:
    """Fills ``out``, the box at ``offset`` of a tensor of ``global_shape``, with
    its Philox values (``dist`` 0 uniform, 1 normal; mt_rng_fill_box).

    Example: ``rng_fill(np.empty(3), (6,), (3,), 0, 0, 0)``.
    """
    if not isinstance(out, np.ndarray):
        raise TypeError("rng_fill(out: ndarray, global_shape, offset, seed, stream, dist)")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError("rng_fill needs a writable C-contiguous array")
    dtype = CODES.get(out.dtype.type, -1) if out.dtype.isnative else -1
    glob, nd = _int64s(global_shape, MAX_NDIM, "global shape")
    off, noff = _int64s(offset, MAX_NDIM, "offset")
    if noff != nd or out.ndim != nd:
        raise ValueError("out, global_shape and offset need equal ndim")
    box = _Box(nd, (I64 * MAX_NDIM)(*off[:nd]), (I64 * MAX_NDIM)(*out.shape))
    call(_rng_fill_box, out.ctypes.data, dtype, operator.index(dist),
         operator.index(seed) & (2**64 - 1), operator.index(stream) & (2**64 - 1), glob,
         ctypes.byref(box))
