"""The ScaLAPACK engine of the square and rectangular linear algebra of
``np.linalg`` on sharded DTensors: which library runs it, the process grids a
matrix is laid out on, and running NumPy where ScaLAPACK must not (the local case,
one rank). The square entries (``_ops/_scalapack.py``) and the rectangular
engine (``_scalapack_rect.py``, which ``_ops/_tsqr.py``'s entries call) use it; it
registers nothing.

A torch.chunk shard is a ScaLAPACK block distribution (one block of ceil(n/P) rows
or columns per process), so a matrix whose rows are sharded over one mesh dim and
its columns (or not) over another is described to ScaLAPACK as it lies, on a
Pr x Pc process grid made of those two mesh dims (csrc/linalg/scalapack.c): each
rank hands over its own block as NumPy holds it (C-ordered), and the C side packs
from it, column-major, the pieces each rank owns in the block-cyclic layout the
factorizations want, one message per pair of ranks, and back.
The matrix is never gathered. Other layouts (a Partial, a mesh dim sharding a
batch dim, two mesh dims on one matrix dim) are first redistributed to rows on the
first mesh dim of more than one rank and columns on the second; batch dims are
replicated and each matrix of the stack is one ScaLAPACK call. A matrix that no
mesh dim shards (replicated, or on a one-rank mesh) is the local case: each rank
runs NumPy's LAPACK on its local stack, and the results keep the stack's
placements.

ScaLAPACK sees only what its drivers get right. A grid on which some process
would hold no row or column of the matrix, or a single one, is first traded for
one that fits it (another pair of mesh dims, or one of them); where none fits
(the matrix is small in both dims) NumPy runs on one rank
(``_small_linalg.on_root``). So does a matrix holding a NaN or an infinity, which
ScaLAPACK's drivers reject or answer otherwise than NumPy: every rank learns it
from the all-reduce that agrees on the library, at no extra message. Results are
the same bytes on every rank where their placements say Replicate: a matrix
replicated over a mesh dim its grid does not use is factored by each replica
group, whose results may round differently, so they are made alike
(``_alike.same_along``).

ScaLAPACK is loaded at the first call that needs it: Debian's
``libscalapack-openmpi-dev``, or MKL's (the ``mkl`` extra, without eigh) or a library
by path where ``MPITENSOR_SCALAPACK`` asks (``debian``, ``mkl``, a path). Without it
those calls raise RuntimeError on every rank, naming the package.
"""

from __future__ import annotations

import functools
import os

import numpy as np

from .. import _clib, _comm, _trace
from .._bind import core
from .._clib import P, S, call, find_library
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec, contiguous_strides
from ..placement_types import Replicate, Shard
from . import _dispatch as D
from . import _small_linalg
from ._alike import same_along
from .._bind.linalg import mt_scalapack_open_libraries

__all__ = ["scalapack_library", "scalapack_source", "load", "prepare", "ROOT",
           "local_numpy", "on_root", "wrap", "home", "settle", "MIN_BLOCK"]


# Debian's ScaLAPACK for Open MPI (BLACS included), one library: each of these is
# tried, by its soname and its dev link.
_DEBIAN = ("libscalapack-openmpi.so.2.2", "libscalapack-openmpi.so.2",
           "libscalapack-openmpi.so")
PACKAGE = "libscalapack-openmpi-dev"
# MKL's ScaLAPACK as the mkl package ships it, in the order its libraries are loaded
# (each finds its symbols in those before it; the routines are in the last two):
# its sequential layer, one thread per rank as OPENBLAS_NUM_THREADS=1 gives NumPy;
# 32-bit integers, as Debian's; BLACS over Open MPI, the MPI mpitensor is built on.
MKL = ("libmkl_core.so.3", "libmkl_sequential.so.3", "libmkl_intel_lp64.so.3",
        "libmkl_blacs_openmpi_lp64.so.2", "libmkl_scalapack_lp64.so.2")
_MKL_PACKAGE = "pip install mkl, as pip install mpitensor[mkl] does"
# What each source is called in messages and show_config.
_NAMES = {"debian": f"Debian's {PACKAGE}", "mkl": "MKL's ScaLAPACK"}
# LAPACK's letter of each element type ScaLAPACK computes in.
LETTERS = {np.dtype(np.float32): b"s", np.dtype(np.float64): b"d",
            np.dtype(np.complex64): b"c", np.dtype(np.complex128): b"z"}


def _mkl_libraries() -> tuple:
    """MKL's libraries, each from the mkl package (beside this Python's prefix) or,
    when it is not there, by its soname (a system MKL on the loader's path)."""
    return tuple(_clib.mkl_library(name.partition(".so")[0] + ".so") or name
                 for name in MKL)


def _sources(choice: str) -> list:
    """(source, libraries) of each ScaLAPACK to try, in order, for a value of
    ``MPITENSOR_SCALAPACK``: ``debian``, ``mkl``, a library's path, or empty for
    Debian's. MKL's only when asked for: its eigensolvers crash with Open MPI
    (_eigen), and it goes into the global namespace for good once loaded
    (csrc/linalg/scalapack_table.c)."""
    found = find_library("scalapack-openmpi")
    named = {"debian": [("debian", (path,)) for path in _DEBIAN + ((found,) if found else ())],
             "mkl": [("mkl", _mkl_libraries())]}
    if not choice:
        return named["debian"]
    return named.get(choice, [("path", (choice,))])


@functools.cache
def load():
    """(table handle, source, the ScaLAPACK library's path) of the ScaLAPACK found,
    or (None, None, why not). Local."""
    why = []
    for source, paths in _sources(os.environ.get("MPITENSOR_SCALAPACK", "")):
        handle = P()
        try:
            call(mt_scalapack_open_libraries, (S * len(paths))(*(p.encode() for p in paths)),
                 len(paths), handle)
        except NotImplementedError as e:
            why.append(f"{_NAMES.get(source, paths[-1])}: {e}")
            continue
        return handle, source, paths[-1]
    return None, None, "; ".join(why)


def scalapack_library() -> str | None:
    """The ScaLAPACK library mpitensor's square linear algebra runs on, or None when
    none was found (then ``np.linalg.solve`` and its kind raise on sharded
    DTensors): Debian's, MKL's (``MPITENSOR_SCALAPACK=mkl``) or the one ``MPITENSOR_SCALAPACK`` names by path. Local; loads the library on
    the first call.

    Example: ``scalapack_library()`` -> ``'libscalapack-openmpi.so.2.2'``, or with
    MKL ``'/venv/lib/libmkl_scalapack_lp64.so.2'``.
    """
    handle, _, path = load()
    return path if handle is not None else None


def scalapack_source() -> str:
    """Which ScaLAPACK :func:`scalapack_library` is, in words: Debian's, MKL's or the
    library named by path; ``"none"`` without one. Local; loads it on the first
    call.

    Example: ``scalapack_source()`` -> ``"Debian's libscalapack-openmpi-dev"``.
    """
    handle, source, path = load()
    return "none" if handle is None else _NAMES.get(source, path)


def _install_hint() -> str:
    """What to install for the ScaLAPACK ``MPITENSOR_SCALAPACK`` asks for."""
    debian = f"install Debian's {PACKAGE} (apt-get install {PACKAGE})"
    mkl = f"install MKL's ({_MKL_PACKAGE})"
    choice = os.environ.get("MPITENSOR_SCALAPACK", "")
    if choice in ("debian", "mkl"):
        return f"MPITENSOR_SCALAPACK={choice} asks for it: " + (
            debian if choice == "debian" else mkl)
    # Unset, only Debian's is tried: MKL's must be asked for by name.
    return (f"{debian}, or {mkl} and set MPITENSOR_SCALAPACK=mkl (no eigh there), or "
            "set MPITENSOR_SCALAPACK to the library's path")


def engine(name: str, mesh, locals_) -> tuple:
    """(ScaLAPACK table, whether every member's ``locals_`` are finite), agreed on by
    the mesh's members in one all-reduce: RuntimeError on every rank, naming the
    package, when some member has no ScaLAPACK. Collective on the mesh."""
    handle = load()[0]
    finite = all(np.isfinite(x).all() for x in locals_)
    if not _comm.any_member(mesh, handle is None or not finite):
        return handle, True
    library(name, mesh)  # raises on every rank when some member has none
    return handle, False


# The fewest rows or columns of a matrix that a process of a grid may hold:
# ScaLAPACK's drivers, given a process with none or one (pXgesvd above all, but
# pXgesv too on a 1 x 1 matrix), hang, fail to converge or miss a zero pivot.
MIN_BLOCK = 2


def _fits(mesh, shape, rows: int, cols: int) -> bool:
    """Whether each process of the grid (rows over mesh dim ``rows``, columns over
    ``cols``; -1: none) holds at least MIN_BLOCK of the matrix's rows and columns
    of its torch.chunk block."""
    return all(m < 0 or min(core.chunk_sizes(size, mesh.shape[m])) >= MIN_BLOCK
               for size, m in zip(shape[-2:], (rows, cols)))


def fit_grid(mesh, shape, rows: int, cols: int):
    """(rows, cols) of a grid that fits a matrix of ``shape``: the given one, else
    the one of the most processes among the mesh's dims; None when none fits.
    From the global spec alone, so alike on every rank."""
    if _fits(mesh, shape, rows, cols):
        return rows, cols
    dims = [m for m in range(mesh.ndim) if mesh.shape[m] > 1] + [-1]
    grids = [(r, c) for r in dims for c in dims if (r != c or r < 0) and (r, c) != (-1, -1)]
    grids.sort(key=lambda g: -(mesh.shape[g[0]] if g[0] >= 0 else 1) *
               (mesh.shape[g[1]] if g[1] >= 0 else 1))
    return next(((r, c) for r, c in grids if _fits(mesh, shape, r, c)), None)


def fitting(name: str, a, rows: int, cols: int):
    """(a, rows, cols) on a grid that fits its matrix (:func:`fit_grid`), ``a``
    redistributed to it where that is another; None when none fits."""
    mesh = a._spec.mesh
    found = fit_grid(mesh, a.shape, rows, cols)
    if found is None or found == (rows, cols):
        return None if found is None else (a, rows, cols)
    return D.relayout(name, a, placements(mesh, a.ndim, *found)), *found


def _replicas(mesh, rows: int, cols: int) -> list:
    """The mesh dims of more than one rank that the grid does not use: each group
    of ranks that differ only there holds the whole matrix and factors it."""
    return [m for m in range(mesh.ndim) if mesh.shape[m] > 1 and m not in (rows, cols)]


def everywhere(mesh) -> list:
    return [m for m in range(mesh.ndim) if mesh.shape[m] > 1]


def settle(a, rows: int, cols: int, laid=(), replicated=()) -> None:
    """Makes a grid call's results the same bytes wherever their placements say
    Replicate: ``laid`` (local arrays laid out on the grid) along the replica dims,
    ``replicated`` (arrays every rank holds) along every mesh dim. Collective on
    the mesh."""
    mesh = a._spec.mesh
    same_along(mesh, [x for x in laid if x is not None], _replicas(mesh, rows, cols))
    same_along(mesh, list(replicated), everywhere(mesh))


def agreed_info(a, rows: int, cols: int, info: int) -> int:
    """A driver's INFO as every rank of the mesh sees it: the grid agreed on it,
    and replica groups (which may round differently) agree with each other.
    Collective on the mesh when there are replica groups."""
    mesh = a._spec.mesh
    if not _replicas(mesh, rows, cols):
        return info
    try:
        _comm.agree(mesh, info == 0, 0, str(info), ValueError)
    except ValueError as e:
        return int(str(e)) if str(e).lstrip("-").isdigit() else 1
    return info


def on_root(name: str, func, a, dtype, outs) -> tuple:
    """NumPy's ``func`` of ``a``'s matrices (in ``dtype``) on one rank, its results
    laid out by ``outs`` ((dtype, placements) each). Collective on the mesh."""
    return _small_linalg.on_root(name, func, [(a, dtype)], outs)


def library(name: str, mesh):
    """The ScaLAPACK table, agreed on by the mesh's members: RuntimeError on every
    rank, naming the package, when some member has none. Collective on the mesh."""
    handle, _, why = load()
    _comm.agree(mesh, handle is not None, 0,
                f"{name} of a sharded matrix runs on ScaLAPACK, which was not found "
                f"({why}): {_install_hint()}", RuntimeError)
    return handle


def inexact(name: str, dtype) -> np.dtype:
    """The type NumPy's linalg computes ``dtype`` in; TypeError as NumPy for one it
    does not take."""
    dtype = np.dtype(dtype)
    if dtype.kind in "biu":
        return np.dtype(np.float64)
    if dtype not in LETTERS:
        raise TypeError(f"{name}: array type {dtype} is unsupported in linalg")
    return dtype


def square(name: str, a) -> None:
    if a.ndim < 2:
        raise np.linalg.LinAlgError(f"{a.ndim}-dimensional array given. Array must be at "
                                    "least two-dimensional")
    if a.shape[-1] != a.shape[-2]:
        raise np.linalg.LinAlgError("Last 2 dimensions of the array must be square")


def grid(a):
    """(row mesh dim, column mesh dim) of a DTensor's matrix dims, -1 for a dim no
    mesh dim of more than one rank shards; None when some mesh dim holds it in a
    way no grid describes (Partial, two on one dim). A sharded batch dim is left
    to the caller."""
    spec, nd = a._spec, a.ndim
    dims = [-1, -1]
    for m, p in enumerate(spec.placements):
        if spec.mesh.shape[m] == 1 or isinstance(p, Replicate):
            continue
        if not isinstance(p, Shard):
            return None
        k = p.dim % nd - (nd - 2)
        if k >= 0 and dims[k] >= 0:
            return None
        if k >= 0:
            dims[k] = m
    return tuple(dims)


def _canonical(a) -> tuple:
    """Placements putting ``a``'s rows on the first mesh dim of more than one rank
    and its columns on the second, every other dim replicated."""
    mesh, nd = a._spec.mesh, a.ndim
    out, free = [Replicate()] * mesh.ndim, [nd - 2, nd - 1]
    for m in range(mesh.ndim):
        if mesh.shape[m] > 1 and free:
            out[m] = Shard(free.pop(0))
    return tuple(out)


def placements(mesh, nd: int, rows: int, cols: int) -> tuple:
    """Rows of an nd-dim array on mesh dim ``rows``, columns on ``cols``."""
    return tuple(Shard(nd - 2) if m == rows else Shard(nd - 1) if m == cols else Replicate()
                 for m in range(mesh.ndim))


def on_grid(name: str, a):
    """``a`` laid out on a process grid: (a, row mesh dim, column mesh dim), or
    (a, -1, -1) when no mesh dim shards its matrix dims (the local case)."""
    dims = grid(a)
    if dims is None:
        a = D.relayout(name, a, _canonical(a))
        dims = grid(a)
    if dims == (-1, -1):
        return a, -1, -1
    batch = any(isinstance(p, Shard) and p.dim % a.ndim < a.ndim - 2
                for p in a._spec.placements)
    if batch:  # a sharded batch dim with sharded matrix dims: the batch replicates
        a = D.relayout(name, a, placements(a._spec.mesh, a.ndim, *dims))
    return a, dims[0], dims[1]


def wrap(mesh, local, placements, shape):
    """A DTensor of this rank's ``local`` (C-ordered here) and its global layout."""
    local = np.array(local, order="C", copy=None)  # 0-d stays 0-d
    if mesh._coordinate is None:
        local = D.outside_local(shape, local.dtype)
    return DTensor(local, DTensorSpec(mesh, tuple(placements), tuple(shape), local.dtype,
                                      contiguous_strides(tuple(shape))))


def replicated(mesh, value):
    value = np.asarray(value)
    return wrap(mesh, value, (Replicate(),) * mesh.ndim, value.shape)


def batch_placements(a, nd_out: int) -> tuple:
    """``a``'s placements for a result whose leading dims are ``a``'s batch dims
    (its matrix dims replicated)."""
    out = []
    for p in a._spec.placements:
        keep = isinstance(p, Shard) and p.dim % a.ndim < nd_out and p.dim % a.ndim < a.ndim - 2
        out.append(Shard(p.dim % a.ndim) if keep else Replicate())
    return tuple(out)


def local_stack(a, dtype, copy=True):
    """``a``'s local stack as C-ordered matrices of ``dtype``, one per batch index:
    the blocks the drivers take; copies (the drivers write their results into
    them) unless ``copy`` is False, for a driver that only reads them."""
    local = a.to_local()
    batch = local.shape[:-2]
    return batch, [np.array(local[i], dtype=dtype, order="C", copy=copy or None)
                   for i in np.ndindex(*batch)]


def stack(batch, blocks):
    """The matrices of a batch back as one C-ordered local array."""
    if not batch:
        return np.ascontiguousarray(blocks[0])
    return np.stack(blocks).reshape(batch + blocks[0].shape)


def announced_mesh(a, name: str, routine: str):
    """The C mesh under ``a``'s mesh, as the drivers take it; first announces the
    ScaLAPACK ``routine`` as a collective of the operation ``name``, so the
    collective checks, the debug log and CommDebugMode's operation list see it."""
    spec = a._spec
    _trace.collective(f"{name}: ScaLAPACK {routine}", spec.mesh, spec.placements,
                      spec.shape, spec.dtype)
    return _comm.checked(spec.mesh)


def check_info(info: int, message: str) -> None:
    if info > 0:
        raise np.linalg.LinAlgError(message)
    if info < 0:
        raise RuntimeError(f"ScaLAPACK rejected argument {-info}")


# prepare's answer for a matrix ScaLAPACK must not see: NumPy on one rank.
ROOT = "root"


def prepare(name: str, a):
    """(a on its grid, row dim, column dim, computing dtype, engine, home) for a
    square DTensor ``a``: the engine is the ScaLAPACK table, None for the local
    case, or ROOT for NumPy on one rank (no grid fits the matrix, or it holds a
    NaN or an infinity); ``home`` is the placements of ``a`` on its own grid,
    which results laid out as A keep (:func:`home`) when the engine ran on a
    grid that fits better. Collective on the mesh."""
    if type(a) is not DTensor:
        raise TypeError(f"{name}: expected a DTensor, got {type(a).__name__}")
    square(name, a)
    dtype = inexact(name, a.dtype)
    a, rows, cols = on_grid(name, a)
    if 0 in a.shape and (rows >= 0 or cols >= 0):  # nothing to move: the local case
        a, rows, cols = D.relayout(name, a, (Replicate(),) * a._spec.mesh.ndim), -1, -1
    home = a._spec.placements
    if rows < 0 and cols < 0 or a._spec.mesh._coordinate is None:
        return a, rows, cols, dtype, None, home
    sl, finite = engine(name, a._spec.mesh, [a.to_local()])
    fitted = fitting(name, a, rows, cols) if finite else None
    if fitted is None:
        return a, rows, cols, dtype, ROOT, home
    return (*fitted, dtype, sl, home)


def home(name: str, x, placements):
    """``x`` laid out by ``placements`` (A's on its own grid), where the engine ran
    on another grid: a result's layout never shows which grid computed it.
    Collective on the mesh when it moves."""
    return x if x._spec.placements == tuple(placements) else D.relayout(name, x, placements)


def local_numpy(a, func, dtype, results_nd):
    """NumPy's ``func`` on each rank's local stack; each result keeps ``a``'s batch
    placements (``results_nd``: each result's number of dims). A LinAlgError on
    one rank's part of a stack is raised on every rank, and each result is the
    same bytes wherever it is Replicate. Collective on the mesh (one small
    agreement, and one per set of replicated dims)."""
    mesh = a._spec.mesh
    # A rank outside the mesh computes on identities, which every routine takes.
    local = (a.to_local() if mesh._coordinate is not None
             else np.broadcast_to(np.eye(a.shape[-1]), a.shape))
    out = agreed(mesh, lambda: func(local.astype(dtype, copy=False)))
    parts = tuple(out) if isinstance(out, tuple) else (out,)
    wrapped = []
    for x, nd in zip(parts, results_nd):
        x = np.array(x, order="C", copy=None)
        pls = batch_placements(a, nd) if nd < a.ndim else local_placements(a)
        same_along(mesh, [x], [m for m, p in enumerate(pls) if isinstance(p, Replicate)])
        wrapped.append(wrap(mesh, x, pls, global_shape(a, x.shape, pls)))
    if isinstance(out, tuple):
        return type(out)(*wrapped)
    return wrapped[0]


def agreed(mesh, func):
    """``func()``, whose LinAlgError on some member (a matrix of its part of a
    stack) is raised on every member. Collective on the mesh."""
    ok, message, out = True, "", None
    try:
        out = func()
    except np.linalg.LinAlgError as e:
        ok, message = False, str(e)
    try:
        _comm.agree(mesh, ok, 0, message, ValueError)
    except ValueError as e:
        raise np.linalg.LinAlgError(str(e)) from None
    return out


def local_placements(a) -> tuple:
    return tuple(Shard(p.dim % a.ndim) if isinstance(p, Shard) else Replicate()
                 for p in a._spec.placements)


def global_shape(a, local_shape, placements) -> tuple:
    """The global shape of a result whose leading dims are ``a``'s."""
    shape = list(local_shape)
    for p in placements:
        if isinstance(p, Shard):
            shape[p.dim] = a.shape[p.dim]
    return tuple(shape)
