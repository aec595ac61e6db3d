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
``vectorize``'s functions give them. NumPy's submodules of functions on arrays
(``lib``, whose ``stride_tricks.sliding_window_view`` xarray's rolling calls,
``emath``, ``polynomial``, ``testing``) are offered the same way, each function
through :func:`arrays_out`.
"""

from __future__ import annotations

import types
import warnings

import numpy as np

from ._funcs import arrays_out

__all__ = ["LEFT_OUT", "numpy_names", "vectorize"]

# NumPy's public names the namespace does not offer, each with why. (linalg and fft
# are the namespace's own modules, with every NumPy name of theirs.)
LEFT_OUT = {
    "test": "runs NumPy's own test suite, not a function of arrays",
    "random": "each rank would draw its own numbers; mpitensor.random is the "
              "distributed generator",
    "ma": "masked arrays, a NumPy subclass that DTensors do not carry",
    "rec": "record arrays, a NumPy subclass that DTensors do not carry",
    "strings": "functions of string arrays, which DTensors do not hold",
    "char": "functions of string arrays, which DTensors do not hold",
    "ctypeslib": "pointers into NumPy's memory, which a DTensor does not have whole",
    "core": "NumPy's private core (deprecated as a public name)",
    "f2py": "NumPy's Fortran wrapper generator, a build tool",
    "typing": "NumPy's static type annotations",
}

# NumPy's submodules of types only, offered as they are; and those of functions on
# arrays, whose functions go through arrays_out as the main namespace's do.
_MODULES_AS_THEY_ARE = ("exceptions", "dtypes")
_MODULES_OF_FUNCTIONS = ("lib", "emath", "polynomial", "testing")


class _Module(types.ModuleType):
    """A NumPy submodule as the namespace offers it: its functions through
    :func:`arrays_out`, its submodules the same way, its types and constants as
    they are (each made once, on first use). NumPy's module itself is read on first
    use too: NumPy imports some of its submodules only then, and every process of a
    job would otherwise pay for them at ``import mpitensor``. Local."""

    def __init__(self, load, name):
        super().__init__(name)
        self._load = load

    @property
    def _numpy_module(self):
        module = self.__dict__.get("_loaded")
        if module is None:
            module = self.__dict__["_loaded"] = self._load()
        return module

    @property
    def __doc__(self):
        return self._numpy_module.__doc__

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        obj = getattr(self._numpy_module, name)
        if isinstance(obj, types.ModuleType):
            obj = _Module(lambda module=obj: module, f"{self.__name__}.{name}")
        elif callable(obj) and not isinstance(obj, (type, np.ufunc)):
            obj = arrays_out(obj)
        setattr(self, name, obj)
        return obj

    def __dir__(self):
        return dir(self._numpy_module)

    def __repr__(self):
        return f"<mpitensor.array_api's NumPy module {self._numpy_module.__name__}>"


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
        if name in _MODULES_OF_FUNCTIONS:
            names[name] = _Module(lambda name=name: getattr(np, name),
                                  f"mpitensor.array_api.{name}")
            continue
        # Some names of older NumPy versions warn when read (deprecated aliases).
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            try:
                obj = getattr(np, name)
            except AttributeError:
                continue
        if isinstance(obj, types.ModuleType):
            if name in _MODULES_AS_THEY_ARE:
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
