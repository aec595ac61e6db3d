"""Every public NumPy name that the namespace does not define itself, as
array-api-compat's NumPy namespace offers them: scikit-learn, SciPy and xarray call
NumPy's functions on the array's namespace (``xp.pad``, ``xp.einsum``,
``xp.nanmean``, ...), not only the standard's.

A NumPy function is handed out through :func:`arrays_out`: called on DTensors it
dispatches through ``DTensor.__array_function__`` as ``np.<name>(dt)`` does (a
distributed rule where one exists, else NumPy on the gathered arrays with a
GatherWarning), and its results are DTensors; called on plain data (``logspace``,
``fromfunction``, ``loadtxt``, ...) it makes DTensors as the creation functions do.
Ufuncs, classes (dtypes, ``errstate``, ``ndarray``, ...) and constants are NumPy's
own objects: a ufunc keeps its methods and attributes and reaches DTensors through
``__array_ufunc__``. ``mgrid``, ``ogrid``, ``r_`` and ``c_`` make DTensors, and
``vectorize``'s functions give them.
"""

from __future__ import annotations

import types
import warnings

import numpy as np

from ._funcs import arrays_out

__all__ = ["LEFT_OUT", "numpy_names", "vectorize"]

# NumPy's public names the namespace does not offer, each with why.
LEFT_OUT = {
    "test": "runs NumPy's own test suite, not a function of arrays",
    # NumPy's submodules but exceptions and dtypes (types only): their functions
    # make NumPy arrays rather than DTensors, or are NumPy's own tooling. linalg and
    # fft are the namespace's, with every NumPy name of theirs.
    **{name: "a NumPy submodule whose functions make NumPy arrays, or NumPy's tooling"
       for name in ("char", "core", "ctypeslib", "emath", "f2py", "lib", "ma",
                    "polynomial", "random", "rec", "strings", "testing", "typing")},
}

_MODULES_OFFERED = ("exceptions", "dtypes")


class _ArraysOutIndex:
    """NumPy's ``mgrid``/``ogrid``/``r_``/``c_``, whose arrays are DTensors (cut as
    the creation functions cut; of DTensors, NumPy's gathered values replicated).
    Local."""

    def __init__(self, maker):
        self._maker = maker
        self.__doc__ = type(maker).__doc__

    def __getitem__(self, key):
        return arrays_out(type(self._maker).__getitem__)(self._maker, key)

    def __len__(self):
        return len(self._maker)

    def __repr__(self):
        return f"mpitensor.array_api's {self._maker!r}"


class vectorize(np.vectorize):
    """NumPy's ``vectorize``, whose calls give DTensors: NumPy calls the Python
    function on each element of the gathered arrays (a warned gather; the result
    is replicated) and arrays of plain data are cut as the creation functions cut.
    Collective when an argument is a DTensor.

    Example: ``vectorize(lambda a, b: a if a > b else b)(x, 2.0)``.
    """

    def __call__(self, *args, **kwargs):
        return arrays_out(super().__call__)(*args, **kwargs)


def numpy_names(defined) -> dict:
    """``{name: object}`` for each public NumPy name not in ``defined`` (the
    namespace's own) nor in :data:`LEFT_OUT`, as the namespace hands it out. Local.

    Example: ``numpy_names(set())["pad"](x, 1)`` pads a DTensor ``x``.
    """
    names = {}
    for name in dir(np):
        if name.startswith("_") or name in defined or name in LEFT_OUT:
            continue
        # Some names of older NumPy versions warn when read (deprecated aliases).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                obj = getattr(np, name)
            except AttributeError:
                continue
        if isinstance(obj, types.ModuleType):
            if name in _MODULES_OFFERED:
                names[name] = obj
        elif name in ("mgrid", "ogrid", "r_", "c_"):
            names[name] = _ArraysOutIndex(obj)
        elif obj is np.vectorize:
            names[name] = vectorize
        elif isinstance(obj, (type, np.ufunc)) or not callable(obj):
            names[name] = obj
        else:
            names[name] = arrays_out(obj)
    return names
