"""Where DTensor finds its operations: a dask-style registry that mpitensor._ops
fills when it is imported.

``implements(np.func)`` registers the DTensor version of a NumPy function (or of
an ndarray method, or ``operator.getitem``): its entry, which normalises the
arguments and runs the operation's steps through the C executor. The executor
calls it for ``__array_function__``, and DTensor's methods (``reshape``,
``__getitem__``, ...) through :func:`call`, so the ground floor names no
operation module. A NumPy function nobody registered runs on the gathered arrays
(:func:`gather_call`, with a warning), or is a TypeError that names it under
``mpitensor.strict()``.

``backwards`` holds the backward of each registered function: function -> (name,
backward(grad, node, output)[, supports]), with None as the backward of a
function that writes in place (its name is then the message's), and True for one
composed of operations that record themselves (``np.linalg.norm``). Only
``mpitensor.autograd._engine.register_backward`` fills it (through
``_C.register_grad``, which also registers the executor's own ufuncs and
reductions). The executor records a call with it when grad mode is on and an
argument requires grad.

``rules`` holds the sharding rules a user registers
(``mpitensor.experimental.register_sharding``): NumPy function or ufunc -> a
callable ``rule(args, kwargs)`` that runs the call; they override the built-in
operations.
"""

from __future__ import annotations

from . import _C

__all__ = ["implements", "lookup", "call", "call_or_gather", "gather_call", "NoRule", "no_rule", "qualified_name",
           "op_label", "functions", "rules", "backwards"]

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


def call_or_gather(func, args: tuple, kwargs: dict | None = None, name: str | None = None):
    """``func(*args, **kwargs)`` as NumPy's function answers for DTensor arguments:
    the registered entry through the executor (:func:`call`'s step), or, where the
    rule does not cover these arguments (it raised NoRule before anything moved, on
    every rank alike), NumPy on the gathered arrays (:func:`gather_call`, under
    ``name``). The one such step of ``__array_function__``, indexing and DTensor's
    NumPy methods. Collective on the mesh when the operation moves data.

    Example: ``call_or_gather(np.put, (dt, [0], [1.0]))`` on a Partial ``dt``.
    """
    try:
        return _C.call(func, args, kwargs or None)
    except NoRule as e:
        return gather_call(func, args, kwargs or {}, name, cause=e)


def implements(*np_funcs, takes_strided=False):
    """Registers the decorated function as the DTensor version of ``np_funcs``;
    ``takes_strided``: it reads strided-shard operands itself (otherwise the
    executor moves them to plain layouts first). Local (at import).

    Example::

        >>> @implements(np.transpose)
        ... def transpose(a, axes=None): ...
    """
    def register(impl):
        for f in np_funcs:
            functions[f] = impl
        if takes_strided:
            impl.takes_strided = True
        return impl
    return register


# The fallback for a call with no rule (mpitensor._ops._fallback.gather_call, set at
# import): gather_call(func, args, kwargs, name) runs NumPy on the gathered arrays.
fallback = None
# The basic index of a strided DTensor is read through its plain copy:
# strided_view(view, plain, dt, key) links the view to ``dt`` so that a write into
# it reaches ``dt`` (mpitensor._ops._indexing.strided_view, set at import).
strided_view = None
# The array API namespace DTensor.__array_namespace__ returns (mpitensor.array_api,
# which sets it at import).
array_namespace = None


def gather_call(func, args: tuple, kwargs: dict, name: str | None = None,
                cause: Exception | None = None):
    """``func`` with no rule for these arguments (``cause``: the NoRule its rule
    raised): the fallback's answer, or that TypeError when there is none.
    Collective on the DTensors' mesh.

    Example: ``gather_call(np.kron, (a, b), {})``.
    """
    if fallback is None:
        raise cause or no_rule(func if name is None else name)
    return fallback(func, args, kwargs, name, cause)


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
        raise no_rule(func)
    return impl


class NoRule(TypeError):
    """An operation's rule does not cover these arguments (a keyword, an order, a
    form it has no distributed algorithm for): the call runs on the gathered arrays
    instead (:func:`gather_call`), and is this TypeError under
    ``mpitensor.strict()``. Raised before anything moves, on every rank alike.

    Example: ``raise NoRule(f"{name}: where= is not supported on DTensors")``.
    """


def no_rule(func) -> NoRule:
    """The NoRule error of a call with no rule (``func``: a function or a name)."""
    label = func if isinstance(func, str) and func.startswith("numpy") else op_label(func)
    return NoRule(
        f"{label} has no sharding rule for DTensors in mpitensor; call "
        f".full_tensor() to work on the whole array, or .to_local() for this "
        f"rank's shard")


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


def op_label(key) -> str:
    """The name a user writes for an operation's function or op key (whose first
    item names a NumPy function). Local.

    Example: ``op_label(("reshape", (2, -1))) == "numpy.reshape"``.
    """
    if isinstance(key, tuple) and key:
        key = key[0]
    return f"numpy.{key}" if isinstance(key, str) else qualified_name(key)


def mixed_error(op_name: str, obj) -> TypeError:
    """The error of an operation given a DTensor and ``obj``, a plain ndarray (or
    anything else) that is no DTensor operand: the executor's and every rule's.
    Local.

    Example: ``raise mixed_error("numpy.dot", np.ones(3))``.
    """
    what = (f"a plain ndarray of shape {obj.shape!r}" if hasattr(obj, "shape")
            else f"a {type(obj).__name__}")
    return TypeError(
        f"{op_name}: mixing a DTensor with {what} is not supported; wrap it with "
        f"mpitensor.distribute_tensor(array, mesh, placements) first, or, when every "
        f"rank holds the same array, run the operation inside "
        f"mpitensor.experimental.implicit_replication()")


def mesh_error(op_name: str, a, b) -> ValueError:
    """The error of an operation on DTensors of two meshes: the executor's (its
    error hook's "mesh") and every rule's. Local.

    Example: ``raise mesh_error("numpy.concatenate", mesh, other)``.
    """
    return ValueError(f"{op_name}: the DTensors live on different device meshes ({a!r} "
                      f"and {b!r}); redistribute them onto one mesh first")


def executor_error(kind: str, key, arg) -> None:
    """Raises what the executor refuses (its error hook: mt_ext_error in
    csrc/ext/ext_hooks.c): ``kind`` of the operation ``key``, with ``arg``.
    Local.

    Example: ``executor_error("no_rule", np.fft.fft, None)`` raises TypeError.
    """
    if kind == "no_rule":
        raise no_rule(key)
    if kind == "no_backward":
        raise NotImplementedError(
            f"{op_label(key)} has no backward rule in mpitensor.autograd yet; run it "
            "under mpitensor.no_grad() or on .detach()ed DTensors (the gradient through "
            "it would be lost)")
    if kind == "mixed":
        raise mixed_error(op_label(key), arg)
    if kind == "mesh":  # arg: the two meshes
        raise mesh_error(op_label(key), *arg)
    if kind == "in_place_grad":  # key: the function that writes in place, or its name
        raise RuntimeError(
            f"{key if isinstance(key, str) else op_label(key)}: a DTensor that requires grad cannot be written in place while grad "
            "mode is on (the write would not be recorded and a gradient would be lost); "
            "write under mpitensor.no_grad(), or build a new DTensor (e.g. numpy.where)")
    if kind == "out_grad":
        raise RuntimeError(
            f"{key!r}: out= (or an in-place operator) with DTensors that require grad is "
            "not supported in grad mode; write the result to a new DTensor, or run the "
            "update under mpitensor.no_grad()")
    if kind == "keyword_grad":  # arg: the keyword
        raise NotImplementedError(
            f"{op_label(key)}: the DTensor passed as {arg}= requires grad, and only "
            "positional arguments carry gradients through it (the keyword's gradient "
            "would be lost); pass it positionally, or run under mpitensor.no_grad()")
    raise RuntimeError(f"the executor refused {op_label(key)} ({kind})")


_C.set_hook("error", executor_error)
