"""The element types beyond NumPy's own: bfloat16, from ml_dtypes when it is
installed (an optional dependency; NumPy has no bfloat16). ml_dtypes' bfloat16 is
a NumPy dtype of kind ``'V'``, so the checks "is this floating point?" that NumPy
answers with ``dtype.kind`` go through :func:`is_inexact` here.

Every function here is Local.
"""

from __future__ import annotations

import numpy as np

try:
    import ml_dtypes as _ml_dtypes
except ImportError:  # mixed precision in bfloat16 then raises, naming ml_dtypes
    _ml_dtypes = None

#: ml_dtypes' bfloat16 dtype, or None when ml_dtypes is not installed.
bfloat16 = None if _ml_dtypes is None else np.dtype(_ml_dtypes.bfloat16)

_MISSING = ("bfloat16 needs the ml_dtypes package (NumPy has no bfloat16): "
            "pip install ml_dtypes")


def require_bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16 dtype; ImportError naming ml_dtypes without it.

    Example::

        >>> require_bfloat16().name
        'bfloat16'
    """
    if bfloat16 is None:
        raise ImportError(_MISSING)
    return bfloat16


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
    """Whether ``dtype`` is ml_dtypes' bfloat16.

    Example: ``is_bfloat16(np.float16)`` is False.
    """
    return bfloat16 is not None and np.dtype(dtype) == bfloat16


def is_floating(dtype) -> bool:
    """Real floating point: NumPy's float kinds and bfloat16.

    Example: ``is_floating(np.float32)`` is True, ``is_floating(np.complex64)`` False.
    """
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or is_bfloat16(dtype)


def is_inexact(dtype) -> bool:
    """Floating point or complex: the dtypes whose values carry gradients.

    Example: ``is_inexact(np.int64)`` is False.
    """
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or is_bfloat16(dtype)


def is_narrow_float(dtype) -> bool:
    """float16 or bfloat16: 2-byte floats, which NumPy multiplies without BLAS.

    Example: ``is_narrow_float(np.float16)`` is True.
    """
    dtype = np.dtype(dtype)
    return dtype == np.float16 or is_bfloat16(dtype)
