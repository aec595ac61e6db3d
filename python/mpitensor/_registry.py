"""Where DTensor finds its operations: a dask-style registry that mpitensor._ops
fills when it is imported.

``implements(np.func)`` registers the DTensor version of a NumPy function (or of
an ndarray method, or ``operator.getitem``): its entry, which normalises the
arguments and runs the operation's steps through the C executor. The executor
calls it for ``__array_function__``, and DTensor's methods (``reshape``,
``__getitem__``, ...) through :func:`call`, so the ground floor names no
operation module. A NumPy function nobody registered is a TypeError that names
it, never a silent gather.

``backwards`` holds the backward of each registered function (mpitensor.autograd
fills it): function -> (name, backward(grad, node, output)), with None as the
backward of a function that writes in place (its name is then the message's),
and True for one composed of operations that record themselves
(``np.linalg.norm``).
The executor records a call with it when grad mode is on and an argument
requires grad.

``rules`` holds the sharding rules a user registers
(``mpitensor.experimental.register_sharding``): NumPy function or ufunc -> a
callable ``rule(args, kwargs)`` that runs the call; they override the built-in
operations.
"""

from __future__ import annotations

from . import _C

__all__ = ["implements", "lookup", "call", "qualified_name", "functions", "rules",
           "backwards"]

# NumPy function (or ndarray method, operator.getitem) -> its DTensor version.
functions: dict = {}
rules: dict = {}
backwards: dict = {}


def call(func, *args, **kwargs):
    """``func(*args, **kwargs)`` on DTensors through the executor: the registered
    entry (a user's rule first), recorded for autograd with its backward.
    Collective on the mesh when the operation moves data.

    Example: ``call(np.reshape, dt, (2, -1))``.
    """
    return _C.call(func, args, kwargs or None)


def implements(*np_funcs):
    """Registers the decorated function as the DTensor version of ``np_funcs``.
    Local (at import).

    Example::

        >>> @implements(np.transpose)
        ... def transpose(a, axes=None): ...
    """
    def register(impl):
        for f in np_funcs:
            functions[f] = impl
        return impl
    return register


def lookup(func):
    """The DTensor version of ``func``: a user's rule first, then the built-in one;
    TypeError when there is none. Local.

    Example: ``lookup(np.reshape)(dt, (2, -1))``.
    """
    if rules:
        rule = rules.get(func)
        if rule is not None:
            return lambda *args, **kwargs: rule(args, kwargs)
    impl = functions.get(func)
    if impl is None:
        raise TypeError(
            f"{qualified_name(func)} has no sharding rule for DTensors in mpitensor; call "
            f".full_tensor() to work on the whole array, or .to_local() for this "
            f"rank's shard")
    return impl


def qualified_name(func) -> str:
    """The name a user writes for ``func``: ``numpy.linalg.norm``, ``numpy.sum``,
    ``numpy.ndarray.astype``. Local.

    Example: ``qualified_name(np.fft.fft) == "numpy.fft.fft"``.
    """
    module = getattr(func, "__module__", None) or "numpy"
    # NumPy's private modules (numpy._core...) are not where users find a function.
    if module.startswith("numpy._") or module == "builtins":
        module = "numpy"
    name = getattr(func, "__qualname__", None) or getattr(func, "__name__", repr(func))
    return f"{module}.{name}"
