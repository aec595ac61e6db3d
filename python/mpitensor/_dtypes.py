"""The element types beyond NumPy's own: bfloat16, from ml_dtypes when it is
installed (an optional dependency; NumPy has no bfloat16). ml_dtypes' bfloat16 is
a NumPy dtype of kind ``'V'``, so the checks "is this floating point?" that NumPy
answers with ``dtype.kind`` go through :func:`is_inexact` here.

Every function here is Local.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _C

# ml_dtypes is imported when bfloat16 is first asked for by name, not with
# mpitensor: its import costs several times mpitensor's own, and every process of
# an MPI job pays it at start. A bfloat16 array cannot exist before ml_dtypes is
# imported, so a dtype is only compared with bfloat16 once some code imported it.

# ml_dtypes' bfloat16 dtype once loaded_bfloat16 has seen ml_dtypes imported.
_bfloat16 = None


def loaded_bfloat16() -> np.dtype | None:
    """ml_dtypes' bfloat16 dtype when ml_dtypes is imported in this process, else
    None (no array of it can exist yet). Imports nothing.

    Example: ``loaded_bfloat16()`` is None until ``import ml_dtypes``.
    """
    global _bfloat16
    if _bfloat16 is None:
        module = sys.modules.get("ml_dtypes")
        # A module still being imported has no bfloat16 yet.
        kind = getattr(module, "bfloat16", None)
        if kind is not None:
            _bfloat16 = np.dtype(kind)
    return _bfloat16


_MISSING = ("bfloat16 needs the ml_dtypes package (NumPy has no bfloat16): "
            "pip install ml_dtypes")


def require_bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16 dtype; ImportError naming ml_dtypes without it.

    Example::

        >>> require_bfloat16().name
        'bfloat16'
    """
    if loaded_bfloat16() is None:
        try:
            import ml_dtypes  # noqa: F401 - registers bfloat16 with NumPy
        except ImportError:
            raise ImportError(_MISSING) from None
    return loaded_bfloat16()


def as_dtype(value) -> np.dtype:
    """``np.dtype(value)``, where the name ``"bfloat16"`` is ml_dtypes' bfloat16
    (ImportError naming ml_dtypes without it).

    Example::

        >>> as_dtype("float16"), as_dtype(np.float32)
        (dtype('float16'), dtype('float32'))
    """
    if isinstance(value, str) and value == "bfloat16":
        return require_bfloat16()
    return np.dtype(value)


def is_bfloat16(dtype) -> bool:
    """Whether ``dtype`` is ml_dtypes' bfloat16 (the name ``"bfloat16"`` too, which
    imports ml_dtypes as :func:`as_dtype` does).

    Example: ``is_bfloat16(np.float16)`` is False.
    """
    dtype = as_dtype(dtype)
    if dtype.kind != "V":
        return False
    bf16 = loaded_bfloat16()
    return bf16 is not None and dtype == bf16


def is_floating(dtype) -> bool:
    """Real floating point: NumPy's float kinds and bfloat16.

    Example: ``is_floating(np.float32)`` is True, ``is_floating(np.complex64)`` False.
    """
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or is_bfloat16(dtype)


def is_inexact(dtype) -> bool:
    """Floating point or complex (bfloat16 too): the dtypes whose values carry
    gradients, by the executor's own rule (``_C.inexact``).

    Example: ``is_inexact(np.int64)`` is False.
    """
    return _C.inexact(dtype if isinstance(dtype, np.dtype) else np.dtype(dtype))


def is_narrow_float(dtype) -> bool:
    """float16 or bfloat16: 2-byte floats, which NumPy multiplies without BLAS.

    Example: ``is_narrow_float(np.float16)`` is True.
    """
    dtype = np.dtype(dtype)
    return dtype == np.float16 or is_bfloat16(dtype)
