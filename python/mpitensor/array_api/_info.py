"""``__array_namespace_info__``: what the standard's inspection functions report.
The dtypes are NumPy's (the namespace's dtype objects are NumPy's own); the one
device is the CPU, whatever mesh an array lives on."""

from __future__ import annotations

import numpy as np

from .. import _clib, _device

__all__ = ["__array_namespace_info__"]


class __array_namespace_info__:
    """The standard's inspection namespace. Local.

    Example::

        >>> info = mpitensor.array_api.__array_namespace_info__()
        >>> info.default_dtypes()["real floating"]
        dtype('float64')
    """

    __module__ = "mpitensor.array_api"

    def __init__(self):
        if not hasattr(np, "__array_namespace_info__"):
            raise NotImplementedError("the array API inspection functions need NumPy 2")
        self._numpy = np.__array_namespace_info__()

    def capabilities(self) -> dict:
        """Boolean indexing and data-dependent shapes are supported (a sharded
        array's mask or result is laid out across the mesh); arrays have at most
        the core's number of dims. Local.

        Example: ``info.capabilities()["boolean indexing"] is True``.
        """
        return {"boolean indexing": True, "data-dependent shapes": True,
                "max dimensions": _clib.MAX_NDIM}

    def default_device(self):
        """The CPU, the one device. Local.

        Example: ``info.default_device() == "cpu"``.
        """
        return _device.CPU

    def devices(self) -> list:
        """``[mpitensor.device("cpu")]``. Local.

        Example: ``info.devices()[0].type == "cpu"``.
        """
        return [_device.CPU]

    def default_dtypes(self, *, device=None) -> dict:
        """NumPy's default dtypes. Local.

        Example: ``info.default_dtypes()["integral"] == np.int64`` on Linux.
        """
        _check(device)
        return self._numpy.default_dtypes()

    def dtypes(self, *, device=None, kind=None) -> dict:
        """NumPy's dtypes by name, those of ``kind`` if given (the standard's kinds).
        Local.

        Example: ``"float32" in info.dtypes(kind="real floating")``.
        """
        _check(device)
        return self._numpy.dtypes(kind=kind)


def _check(device) -> None:
    if device is not None and not hasattr(device, "mesh"):
        _device.device(device)
