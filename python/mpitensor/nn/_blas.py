"""The BLAS whose gemm the nn kernels call (nn.Linear's product and attention's),
chosen at import and handed to the C kernels (:mod:`._ckernels`; they link no BLAS).

``MPITENSOR_BLAS`` picks it: ``mkl`` (the ``mkl`` package's libmkl_rt, as
``pip install mpitensor[mkl]`` brings it), ``openblas`` or ``numpy`` (the OpenBLAS
NumPy loaded, found by threadpoolctl (``_clib.numpy_openblas``), called through its CBLAS symbols: the same
library and functions as np.matmul's), the path of a
library that exports ``cblas_sgemm``/``cblas_dgemm`` (LP64), or ``none`` (NumPy
computes). Unset, on an Intel CPU MKL when it is installed, else NumPy's OpenBLAS
when its symbols are found, else none; on other CPUs NumPy's OpenBLAS first, then
MKL (which takes a generic, slower code path on CPUs that are not Intel's). A library that cannot be loaded gives a RuntimeWarning
saying why, and the next choice is taken (for an explicit choice: none); results
are the same either way, only the speed differs.

Each library is loaded with RTLD_LOCAL, so its symbols do not take the place of
another's (NumPy's, or torch's MKL). MKL runs one thread per rank (its sequential
layer), as OPENBLAS_NUM_THREADS=1 does for NumPy, unless MKL_NUM_THREADS asks for
more (then its OpenMP layer) or MKL_THREADING_LAYER names a layer itself.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from .. import _clib
from . import _ckernels

# MKL's service-function constants (mkl_service.h).
_MKL_THREADING_INTEL, _MKL_THREADING_SEQUENTIAL = 0, 1
_MKL_INTERFACE_LP64 = 0

# What is installed: (name, library path); the loaded library is kept so that the
# addresses given to the core stay valid.
_active = ("none", None)
_library = None


class _LoadError(Exception):
    pass


def provider() -> str:
    """The BLAS the kernels call: ``"mkl"``, ``"openblas"``, a library path or
    ``"none"`` (NumPy computes the products). Local."""
    return _active[0]


def library() -> str | None:
    """The path of the loaded BLAS library, None when there is none. Local."""
    return _active[1]


def _mkl_path() -> str:
    """libmkl_rt of the ``mkl`` package (its file list, else sys.prefix/lib)."""
    path = _clib.mkl_library("libmkl_rt.so")
    if path is None:
        raise _LoadError("the mkl package is not installed (pip install mpitensor[mkl])")
    return os.path.realpath(path)


def _load(path: str):
    try:
        return _clib.load(path)
    except OSError as e:
        raise _LoadError(f"cannot load {path}: {e}") from None


def _symbols(lib, names):
    """The addresses of the first pair of ``names`` (sgemm, dgemm) that ``lib``
    exports, with its index."""
    for i, (s, d) in enumerate(names):
        if hasattr(lib, s) and hasattr(lib, d):
            return i, [_clib.address(lib, n) for n in (s, d)]
    raise _LoadError(f"{lib._name} exports none of {', '.join(s for s, _ in names)}")


def _open_mkl():
    path = _mkl_path()
    lib = _load(path)
    if lib.MKL_Set_Interface_Layer(_MKL_INTERFACE_LP64) != _MKL_INTERFACE_LP64:
        raise _LoadError(f"{path}: MKL keeps an ILP64 interface (MKL_INTERFACE_LAYER)")
    if "MKL_THREADING_LAYER" not in os.environ:
        try:
            many = int(os.environ.get("MKL_NUM_THREADS", "1")) > 1
        except ValueError:
            many = False
        lib.MKL_Set_Threading_Layer(_MKL_THREADING_INTEL if many else
                                    _MKL_THREADING_SEQUENTIAL)
    _, (s, d) = _symbols(lib, [("cblas_sgemm", "cblas_dgemm")])
    return "mkl", path, lib, s, d, False


# CBLAS gemm names an OpenBLAS exports: scipy-openblas prefixes "scipy_", and an
# ILP64 build (64-bit integers, as NumPy's wheel's) suffixes "64_".
_OPENBLAS_GEMMS = [(f"{prefix}cblas_sgemm{suffix}", f"{prefix}cblas_dgemm{suffix}")
                   for prefix in ("scipy_", "") for suffix in ("64_", "")]


def _open_openblas():
    path = _clib.numpy_openblas()
    if path is None:
        raise _LoadError("NumPy loaded no OpenBLAS")
    lib = _load(path)
    i, (s, d) = _symbols(lib, _OPENBLAS_GEMMS)
    return "openblas", path, lib, s, d, _OPENBLAS_GEMMS[i][0].endswith("64_")


def _open_path(path: str):
    lib = _load(path)
    _, (s, d) = _symbols(lib, [("cblas_sgemm", "cblas_dgemm")])
    return path, path, lib, s, d, False


def _open(spec: str):
    if spec == "mkl":
        return _open_mkl()
    if spec in ("openblas", "numpy"):
        return _open_openblas()
    return _open_path(spec)


def use(spec: str | None = None) -> str:
    """Installs the BLAS named by ``spec`` (as ``MPITENSOR_BLAS``; None: that
    variable, else the default order) and returns :func:`provider`. Local; call
    it when no kernel runs (tests switch providers with it)."""
    global _active, _library
    spec = os.environ.get("MPITENSOR_BLAS", "").strip() if spec is None else spec.strip()
    _ckernels.set_blas(0, 0, False)
    _active, _library = ("none", None), None
    order = ["mkl", "openblas"] if _cpu_vendor() == "GenuineIntel" else ["openblas", "mkl"]
    for choice in [spec] if spec else order:
        if choice.lower() == "none":
            break
        try:
            name, path, lib, s, d, ilp64 = _open(
                choice.lower() if choice.lower() in ("mkl", "openblas", "numpy") else choice)
        except (_LoadError, AttributeError) as e:
            # Unasked, a missing library is no news; a broken one (or any asked for) is.
            if spec or (choice == "mkl" and _mkl_installed()):
                then = ("NumPy computes the products" if spec or choice == order[-1]
                        else "trying NumPy's OpenBLAS")
                warnings.warn(f"mpitensor BLAS {choice!r} unusable: {e}; {then}",
                              RuntimeWarning, stacklevel=2)
            continue
        _ckernels.set_blas(s, d, ilp64)
        _active, _library = (name, path), lib
        _warm_up()
        break
    return _active[0]


def _cpu_vendor() -> str:
    """The CPU's vendor id as Linux reports it ("GenuineIntel", "AuthenticAMD"), ""
    where /proc/cpuinfo does not say."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""


def _warm_up():
    """One tiny product of each dtype, so that the library loads what it loads
    lazily (MKL its kernels and threading layer) now, before torch may be imported
    with MKL symbols of its own that a later load could bind to."""
    for dtype in (np.float32, np.float64):
        one = np.ones((1, 1), dtype)
        _ckernels.gemm(one, one, np.empty((1, 1), dtype), False, 1.0, 0.0)


def _mkl_installed() -> bool:
    try:
        _mkl_path()
        return True
    except _LoadError:
        return False
