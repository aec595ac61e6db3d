"""Where DTensor finds its operations, and the one door of every call written in
Python.

A dask-style registry that mpitensor._ops fills when it is imported:
``implements(np.func)`` registers the DTensor version of a NumPy function (or of
an ndarray method, or ``operator.getitem``): its entry, which normalises the
arguments and runs the operation's steps through the C executor.

:func:`door` is how every such call is made: ``DTensor.__array_function__``,
DTensor's NumPy methods, indexing, and the calls the executor's own doors (the
operators, ``__array_ufunc__``, the reduction methods) leave to Python (the hook
"door"). It agrees on the call when a program makes it
(mpitensor._call_agreement), runs a user's rule before the built-in one, moves
strided operands to plain layouts for an entry that does not read them, and
records the call for autograd (the node is made by ``_C.record``, the one
maker). A NumPy function nobody registered runs on the gathered arrays
(:func:`gather_call`, with a warning), or is a TypeError that names it under
``mpitensor.strict()``. So a call crosses into C once, to the executor.

``backwards`` holds the backward of each registered function: function -> (name,
backward(grad, node, output)[, supports]), with None as the backward of a
function that writes in place (its name is then the message's), and True for one
composed of operations that record themselves (``np.linalg.norm``). Only
``mpitensor.autograd._engine.register_backward`` fills it. The door records a
call with it when grad mode is on and an argument requires grad.

``rules`` holds the sharding rules a user registers
(``mpitensor.experimental.register_sharding``, through :func:`set_rule`): NumPy
function or ufunc -> a callable ``rule(args, kwargs)`` that runs the call; they
override the built-in operations, here and in the executor's doors.
"""

from __future__ import annotations

import sys

import numpy as np

from . import _C, _call_agreement, _comm, _dtypes, _modes, _strided, _trace
from .placement_types import _StridedShard

__all__ = ["implements", "lookup", "call", "door", "array_function", "door_from_c",
           "call_label", "gather_call", "NoRule",
           "no_rule", "qualified_name", "op_label", "functions", "rules", "backwards",
           "set_rule", "ruled", "clear_rules", "forward_unrecorded", "first_mesh"]

# NumPy function (or ndarray method, operator.getitem) -> its DTensor version.
functions: dict = {}
rules: dict = {}
backwards: dict = {}

# The DTensor class (mpitensor._dtensor sets it at import): the operand the C
# reduction methods take.
dtensor_type = None


def set_rule(func, rule) -> None:
    """Makes ``rule(args, kwargs)`` run every call of ``func`` on DTensors in place
    of the built-in operation (None: the built-in one again), in the Python door
    and the executor's. Local.

    Example: ``set_rule(np.cumsum, lambda args, kwargs: ...)``.
    """
    if rule is None:
        rules.pop(func, None)
    else:
        rules[func] = rule
    _C.set_user_rule(func, rule is not None)


# ruled(func): whether a user's rule (set_rule) runs in place of the built-in
# operation ``func``. A fast path that skips the door asks it and steps aside, so
# that the rule beats the built-in one everywhere; it is the dict's own lookup
# because the commonest calls (a basic key) ask it.
ruled = rules.__contains__


def clear_rules() -> None:
    """Removes every user rule (:func:`set_rule`). Local.

    Example: ``clear_rules()``.
    """
    for func in list(rules):
        set_rule(func, None)


def call(func, *args, **kwargs):
    """``func(*args, **kwargs)`` on DTensors, as mpitensor calls it inside an
    operation: :func:`door`'s steps without the agreement (the package makes its
    own calls alike on every rank) and without the gather. Collective on the mesh
    when the operation moves data.

    Example: ``call(np.reshape, dt, (2, -1))``.
    """
    return _run(func, args, kwargs, False)


def door(func, args: tuple, kwargs: dict, name: str | None = None, caller=None):
    """``func(*args, **kwargs)`` on DTensors, the one door of the calls written in
    Python: a call the executor takes as it is (``np.sum(x, axis=1)``,
    ``np.where(m, x, 0)``) is agreed and run by C in one call; any other call is
    agreed first when the frame ``caller`` is a program's (every rank raises the
    same ValueError when the calls differ), each plain ndarray beside DTensors
    taken as replicated once agreed; then a user's rule, or the registered entry,
    with strided operands moved to plain layouts and the call recorded for
    autograd; where the rule does not cover these arguments (it raised NoRule
    before anything moved, on every rank alike), NumPy on the gathered arrays
    (:func:`gather_call`, under ``name``). Collective on the mesh when the call is
    agreed or moves data.

    Example: ``door(np.concatenate, ([a, b],), {"axis": 1}, None, sys._getframe(1))``.
    """
    # Every call a program makes pays for this function: the executor's attempt
    # and the agreement are one C call (C alone knows which calls the executor
    # takes), and the usual call (no DebugMode, no user's rule, no flag of
    # _C.call_flags, no error state to agree on) runs the entry itself.
    out = _C.door_enter(func, args, kwargs, caller, name, None)
    if out is None:
        # A program's first call of a function not yet named.
        out = _C.door_enter(func, args, kwargs, caller, call_label(func, args), None)
    if type(out) is not int:
        return out
    if caller is None:
        return _agreed(func, args, kwargs, name, 0, out >> _CALL_FLAGS)
    return _agreed(func, args, kwargs, name, out, out >> _CALL_FLAGS)


def array_function(self, func, types, args, kwargs):
    """``DTensor.__array_function__`` (NEP 18): NumPy's ``func(*args, **kwargs)``
    with a DTensor among the arguments, through :func:`door` as the program made
    it; NotImplemented when another type than DTensor and ndarrays takes part, so
    that its library answers. Collective on the mesh when the call is agreed or
    moves data.

    Example: ``np.flip(dt, 1)`` reaches ``array_function(dt, np.flip, (DTensor,),
    (dt, 1), {})``.
    """
    # The door's first C call, and its usual steps, made here: a NumPy function is
    # the call a program makes most, and each Python frame between NumPy and the
    # entry costs it.
    out = _C.door_enter(func, args, kwargs, sys._getframe(1), None, types)
    if type(out) is not int:
        return door(func, args, kwargs, None, sys._getframe(1)) if out is None else out
    entry = (None if out & _UNUSUAL or rules or _modes.recorders or func in _viewers
             else functions.get(func))
    if entry is None:
        return _agreed(func, args, kwargs, None, out, out >> _CALL_FLAGS)
    try:
        return entry(*args, **kwargs)
    except NoRule as e:
        return gather_call(func, args, kwargs, None, cause=e)


def _agreed(func, args: tuple, kwargs: dict, name, flags: int, call_flags: int):
    """The door's steps once the ranks agreed on the call (``flags``, the
    agreement's; ``call_flags``, its bits from CALL_FLAGS on)."""
    global viewing
    # Only an entry that asks program_call needs the flags kept meanwhile.
    viewer = func in _viewers
    if viewer:
        outer = viewing
        viewing = (func, flags) if flags & _PROGRAM else None
    try:
        if flags & _RAISES:
            return _errors_agreed(func, args, kwargs, name, lambda: _door_run(
                func, args, kwargs, name, flags, call_flags))
        entry = None if call_flags or rules or _modes.recorders else functions.get(func)
        if entry is None:
            return _door_run(func, args, kwargs, name, flags, call_flags)
        try:
            return entry(*args, **kwargs)
        except NoRule as e:
            return gather_call(func, args, kwargs, name, cause=e)
    finally:
        if viewer:
            viewing = outer


def _door_run(func, args: tuple, kwargs: dict, name, flags: int, call_flags: int):
    """The door's steps after the agreement."""
    if flags & _call_agreement.PLAIN:
        _modes.push_implicit_replication()
        try:
            return _traced(func, args, kwargs, name, False)
        finally:
            _modes.pop_implicit_replication()
    if _modes.recorders:
        return _traced(func, args, kwargs, name, False)
    return _entry(func, args, kwargs, name, False, call_flags)


# The words NumPy gives an error-state callback (np.seterrcall) for each category
# of np.errstate.
_CATEGORIES = {"divide by zero": "divide", "overflow": "over", "underflow": "under",
               "invalid value": "invalid"}


def _errors_agreed(func, args: tuple, kwargs: dict, name, run):
    """``run()``, a call written in Python, where NumPy's error state raises (or
    calls a function) on some floating-point error: NumPy raises for the whole
    array, but the offending elements lie on some ranks only, and a rank that
    raised in the middle would leave the others in the call's next collective. So
    each such error is recorded (the program's own callback called for "call")
    and the call goes on; once it returns, the ranks agree, and every rank raises
    the first failing rank's FloatingPointError (or what the callback raised).
    Collective on the mesh of the first DTensor argument when it has more than one
    rank.
    """
    mesh = first_mesh(args) or first_mesh(tuple(kwargs.values()))
    if mesh is None or mesh.size() == 1:
        return run()
    state = np.geterr()
    callback = np.geterrcall()
    failed = []

    def record(kind, flag):
        mode = state.get(_CATEGORIES.get(kind), "raise")
        where = f"{kind} encountered in {call_label(func, args, name)}"
        if mode == "log":
            # The program's log object is replaced by this function meanwhile.
            if hasattr(callback, "write"):
                callback.write(f"Warning: {where}\n")
        elif failed:
            return
        elif mode == "call":
            try:
                callback(kind, flag)
            except Exception as e:  # noqa: BLE001 - raised on every rank once agreed
                failed.append(e)
        else:
            failed.append(FloatingPointError(where))

    with np.errstate(call=record, **{k: "call" if v in ("raise", "call", "log") else v
                                     for k, v in state.items()}):
        result = run()
    _comm.agree_float_errors(mesh, failed[0] if failed else None)
    return result


def first_mesh(values):
    """The mesh of the first DTensor among ``values`` (a tuple or list) and their
    lists and tuples, or None. Local.

    Example: ``first_mesh(([a, b], 1))`` is ``a.device_mesh``.
    """
    for v in values:
        if isinstance(v, dtensor_type):
            return v.device_mesh
        if isinstance(v, (list, tuple)):
            mesh = first_mesh(v)
            if mesh is not None:
                return mesh
    return None


# The NumPy function a program called through the door and the flags of its
# agreement, until its entry takes them (program_call): whose result NumPy makes a
# view of an argument, the entry makes one for the program; calls mpitensor makes
# inside keep their own new arrays. Kept only for the functions registered with
# ``implements(..., views=True)`` (``_viewers``), whose entries ask; every other
# call leaves it alone.
viewing = None
_viewers: set = set()


def program_call(func) -> int:
    """The agreement's flags (``_call_agreement.PROGRAM`` set, so true) when the
    entry running is ``func`` as a program called it (not a call mpitensor makes
    inside an operation), else 0; nonzero once per door call. Local.

    Example: ``if program_call(np.reshape): out = _views.keep(a, out, ...)``.
    """
    global viewing
    if func not in _viewers:
        raise RuntimeError(f"program_call: {qualified_name(func)} is not registered "
                           "with implements(..., views=True)")
    v = viewing
    if v is None or v[0] is not func:
        return 0
    viewing = None
    return v[1]


def _traced(func, args: tuple, kwargs: dict, name, from_c: bool, flags: int = -1):
    """:func:`_entry`, opened and closed in the trace of each entered DebugMode, so
    that the operations it runs nest under the call."""
    if not _modes.recorders:
        return _entry(func, args, kwargs, name, from_c, flags)
    token = _trace.call_enter(call_label(func, args, name), args, kwargs)
    result = None
    try:
        result = _entry(func, args, kwargs, name, from_c, flags)
        return result
    finally:
        _trace.call_exit(token, result)


def _entry(func, args: tuple, kwargs: dict, name, from_c: bool, flags: int = -1):
    """The registered entry; where its rule does not cover the arguments, NumPy on
    the gathered arrays, except for the ufunc calls of the C doors (their NoRule is
    raised: the ufuncs' entry gathers itself). ``flags``: ``_C.call_flags`` of the
    arguments when known (-1 otherwise)."""
    if from_c and func is np.ufunc:
        return _run(func, args, kwargs, True, flags)
    try:
        return _run(func, args, kwargs, from_c, flags)
    except NoRule as e:
        return gather_call(func, args, kwargs, name, cause=e)


def door_from_c(func, args: tuple, kwargs: dict, agreed: bool | int = False):
    """The Python door of a call the executor's doors leave to Python (the hook
    "door"): a ufunc call or method as ``(numpy.ufunc, (ufunc, method,
    *operands), kwargs)``, a reduction method as NumPy's function (``agreed``:
    by the C door already). Agreed as :func:`door` agrees, on the frame
    that called the C door; a ufunc's NoRule is raised, not gathered (the ufuncs'
    entry gathers itself), a reduction method's gathers as its function does.
    ``agreed`` an int: the flags of the agreement a C door made on a call written
    in Python (a DTensor method), whose steps go on as :func:`door`'s.
    Collective on the mesh when the call is agreed or moves data.

    Example: ``door_from_c(np.sum, (dt,), {"dtype": np.float32})``.
    """
    if type(agreed) is int:
        return _agreed(func, args, kwargs, None, agreed, agreed >> _call_agreement.CALL_FLAGS)
    if agreed:
        flags = _C.call_flags(args, kwargs)
    else:
        flags = (_call_agreement.agree_call(call_label(func, args), args, kwargs,
                                            sys._getframe(1))
                 >> _call_agreement.CALL_FLAGS)
    if _C.errstate_raises():
        return _errors_agreed(func, args, kwargs, None,
                              lambda: _door_from_c_run(func, args, kwargs, flags))
    return _door_from_c_run(func, args, kwargs, flags)


def _door_from_c_run(func, args: tuple, kwargs: dict, flags: int):
    """door_from_c's steps after the agreement."""
    if not flags & _PLAIN:
        return _traced(func, args, kwargs, None, True, flags)
    _modes.push_implicit_replication()
    try:
        return _traced(func, args, kwargs, None, True, flags)
    finally:
        _modes.pop_implicit_replication()


# The name a user writes of each function called through the door, which C reads
# as it agrees on a program's call; a ufunc's call is named by its ufunc.
_names: dict = _C.call_names


def call_label(func, args: tuple = (), name: str | None = None) -> str:
    """The call's name as the agreement and the traces write it (``name`` when
    given), cached per function; the executor's doors agree by the one given at
    registration. Local.

    Example: ``call_label(np.ufunc, (np.add, "__call__")) == "numpy.add"``.
    """
    if name is not None:
        return name
    found = _names.get(func)
    if found is not None:
        return found
    if func is np.ufunc and len(args) > 1:
        key = args[0], args[1]
        name = _names.get(key)
        if name is None:
            if len(_names) > 4096:
                _names.clear()
            name = _names[key] = (f"numpy.{args[0].__name__}"
                                  + ("" if args[1] == "__call__" else f".{args[1]}"))
        return name
    name = _names[func] = qualified_name(func)
    return name


_STRIDED, _GRAD, _MESHES, _PLAIN = (_call_agreement.CALL_STRIDED, _call_agreement.CALL_GRAD,
                                    _call_agreement.CALL_MESHES, _call_agreement.CALL_PLAIN)
_PROGRAM, _RAISES, _DOOR_PLAIN = (_call_agreement.PROGRAM, _call_agreement.RAISES,
                                  _call_agreement.PLAIN)
_CALL_FLAGS = _call_agreement.CALL_FLAGS
# The agreement's flags of a call that needs more than its entry: an error state
# to agree on, or any flag of _C.call_flags.
_UNUSUAL = _RAISES | -1 << _CALL_FLAGS


def _run(func, args: tuple, kwargs: dict, from_c: bool, flags: int = -1):
    """The door's steps after the agreement: the user's rule or the entry, with
    strided operands made plain and the call recorded. ``flags``: ``_C.call_flags``
    of the arguments when the agreement gave them (-1 otherwise)."""
    rule = _rule_of(func, args) if rules else None
    entry = None
    if rule is None:
        if not from_c:
            # The executor runs what it takes as it is without a Python entry (and
            # comes back here, from_c, for what it does not take).
            out = _C.executor_call(func, args, kwargs, None)
            if out is not NotImplemented:
                return out
        entry = functions.get(func)
        if entry is None:
            raise no_rule(func)
    if flags < 0:
        flags = _C.call_flags(args, kwargs)
    if flags & _MESHES:
        # Replicate DTensors of another mesh of the same ranks join the call's mesh
        # as the executor takes them; any other mesh is the entry's error.
        args, kwargs = _C.one_mesh(args, kwargs)
        flags = _C.call_flags(args, kwargs) & ~_MESHES
    if not flags:
        return entry(*args, **kwargs) if rule is None else rule(*_rule_args(func, args),
                                                                   kwargs)
    if flags & _STRIDED and not hasattr(functions.get(func), "takes_strided"):
        return _plain_call(func, args, kwargs)
    if flags & _GRAD:
        return _recorded(func, args, kwargs, rule, entry)
    if rule is not None:
        return rule(*_rule_args(func, args), kwargs)
    return entry(*args, **kwargs)


def _rule_of(func, args: tuple):
    """A user's rule for this call: of the ufunc itself for a ufunc's call."""
    if func is np.ufunc:
        return rules.get(args[0]) if len(args) > 1 and args[1] == "__call__" else None
    return rules.get(func)


def _rule_args(func, args: tuple) -> tuple:
    return (args[2:],) if func is np.ufunc else (args,)


def _is_strided(v) -> bool:
    return type(v) is dtensor_type and any(type(p) is _StridedShard
                                           for p in v._spec.placements)


def _plain_of(v, moved: dict):
    """``v``, or each item of a list or tuple ``v``, with a strided DTensor moved
    to its plain layout (the strided mesh dims replicated, as torch passes through
    Replicate), each once; ``moved``: id -> (original, plain copy)."""
    if type(v) in (list, tuple):
        return type(v)(_plain_of(item, moved) for item in v)
    if not _is_strided(v):
        return v
    hit = moved.get(id(v))
    if hit is None:
        hit = moved[id(v)] = (v, plain_copy(v))
    return hit[1]


def plain_copy(dt):
    """A strided DTensor in its plain layout (``_strided.plain_of``), whose local
    array is, where it is new memory, all of that memory in C order on every rank:
    the views of it a call or a key makes are then linked back to ``dt`` through
    the copy as a whole (``_views.relink``), alike everywhere. Collective on the
    mesh.

    Example: ``plain = plain_copy(np.reshape(x, 48))`` for ``x`` sharded on dim 1.
    """
    spec = dt._spec
    plain = dt.redistribute(spec.mesh, _strided.plain_of(spec.placements))
    local = plain._data()
    if _strided.copies(spec.placements, spec.mesh.shape) and not owns_all(local):
        plain._local_tensor = local.copy()
    return plain


def memory_of(a: np.ndarray) -> np.ndarray:
    """The ndarray that owns ``a``'s memory (``a`` itself, or the last ndarray of
    its chain of bases). Local.

    Example: ``memory_of(x[1:].T) is x`` for an ``x`` that owns its data.
    """
    while type(a.base) is np.ndarray:
        a = a.base
    return a


def owns_all(local: np.ndarray) -> bool:
    """Whether ``local`` is all of its memory (:func:`memory_of`), in C order and as
    that array's dtype. Local.

    Example: ``owns_all(np.zeros(4))`` is True, ``owns_all(np.zeros(4)[1:])`` False.
    """
    memory = memory_of(local)
    return (memory.nbytes == local.nbytes and memory.dtype == local.dtype
            and memory.flags.c_contiguous and local.flags.c_contiguous)


def _plain_call(func, args: tuple, kwargs: dict):
    """A call with a strided operand that its entry does not read: a reduction over
    every element of one on its expansion, which gives it as it is; any other on
    the strided operands moved to plain layouts, what it wrote into a plain copy
    written back into the strided original. Collective on the mesh when data
    moves."""
    view = _C.whole_view(func, args, kwargs)
    if view is not None:
        return _run(func, (view,), kwargs, True)
    moved: dict = {}
    pargs = tuple(_plain_of(a, moved) for a in args)
    pkwargs = {k: _plain_of(v, moved) for k, v in kwargs.items()}
    res = _run(func, pargs, pkwargs, True)
    out = pkwargs.get("out")
    first = 2 if func is np.ufunc else 0
    if func is np.ufunc:
        writer = len(args) > 2 and args[1] == "at"
    else:
        bw = backwards.get(func)
        writer = bw is not None and bw[1] is None
    for orig, copy in moved.values():
        if (out is copy or (type(out) is tuple and any(o is copy for o in out))
                or (writer and len(args) > first and args[first] is orig)):
            back = copy.redistribute(orig._spec.mesh, orig._spec.placements)
            np.copyto(orig._data(), back._data())
            written(orig)
            if res is copy:
                res = orig
            elif type(res) is tuple:
                res = tuple(orig if r is copy else r for r in res)
    relink_plain(res, list(moved.values()))
    return res


def forward_unrecorded(run, *args, **kwargs):
    """``run(*args, **kwargs)`` as a recorded operation's forward: grad mode off
    (its steps record nothing), its decisions priced for the gradients its inputs
    will get. Local unless ``run`` communicates.

    Example: ``out = forward_unrecorded(entry, x, axis=0)``.
    """
    was, priced = _modes.set_grad_enabled(False), _modes.state.grad_priced
    _modes.state.grad_priced = True
    try:
        return run(*args, **kwargs)
    finally:
        _modes.set_grad_enabled(was)
        _modes.state.grad_priced = priced


def _grad_keyword(kwargs: dict):
    """The first keyword but out= (a write, refused as such) whose argument needs a
    gradient, or None."""
    for k, v in kwargs.items():
        if k != "out" and _C.call_flags((v,), {}) & _GRAD:
            return k
    return None


def _flat_args(args: tuple) -> list:
    """The positional arguments with lists and tuples among them flattened once:
    the inputs of a registered function's node, in the order its backward returns."""
    flat: list = []
    for a in args:
        if type(a) in (list, tuple):
            flat.extend(a)
        else:
            flat.append(a)
    return flat


def _inexact_dtensor(v) -> bool:
    return type(v) is dtensor_type and _dtypes.is_inexact(v._spec.dtype)


def _recorded(func, args: tuple, kwargs: dict, rule, entry):
    """The call, grad mode on and an argument needing a gradient: its entry with
    grad mode off, then one node with its backward (one per output when it gives
    several), or the error of a gradient it would lose."""
    bw = backwards.get(func)
    backward = bw[1] if bw is not None else None
    run = (lambda *a, **k: rule(*_rule_args(func, a), k)) if rule is not None else entry
    if backward is True:  # composed of operations that record themselves
        return run(*args, **kwargs)
    key = _grad_keyword(kwargs)
    if key is not None:  # a node's inputs are the positional arguments
        executor_error("keyword_grad", func, key)
    if bw is not None and backward is not None and len(bw) > 2 and not bw[2](args, kwargs):
        bw = backward = None  # no rule for this call (a diagonal einsum)
    if bw is not None and backward is None:  # a function that writes in place
        executor_error("in_place_grad", bw[0], None)
    if kwargs.get("out") is not None:
        executor_error("out_grad", func, None)
    res = forward_unrecorded(run, *args, **kwargs)
    if res is None and bw is None:
        # A writer missing from autograd's table of writes, refused after the fact
        # rather than losing the gradient silently.
        executor_error("in_place_grad", func, None)
    several = isinstance(res, (tuple, list)) and len(res) > 0
    if not _inexact_dtensor(res[0] if several else res):
        return res
    if backward is None:
        executor_error("no_backward", args[0] if func is np.ufunc and args else func, None)
    flat, name = _flat_args(args), bw[0]
    if not several:
        return _C.record(name, res, flat, backward, False, args, kwargs or None)
    for i, item in enumerate(res):
        if _inexact_dtensor(item):
            _C.record(name, item, flat, backward, False, args, (kwargs or None, i))
    return res


def implements(*np_funcs, takes_strided=False, views=False):
    """Registers the decorated function as the DTensor version of ``np_funcs``;
    ``takes_strided``: it reads strided-shard operands itself (otherwise the
    executor moves them to plain layouts first); ``views``: it asks
    :func:`program_call` whether a program made the call, to give the program
    NumPy's view. Local (at import).

    Example::

        >>> @implements(np.transpose)
        ... def transpose(a, axes=None): ...
    """
    def register(impl):
        for f in np_funcs:
            functions[f] = impl
            if views:
                _viewers.add(f)
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
# written(dt): a write went into ``dt``'s memory by NumPy directly (a strided
# DTensor's plain copy written back): the views of that memory are made again
# (mpitensor._algorithms._views.written, which mpitensor._ops._indexing sets at
# import).
written = None
# relink_plain(res, pairs): the results of a call on the plain copies of strided
# DTensors ((original, copy) pairs) made views of the originals, as NumPy's views
# of its arguments are (mpitensor._algorithms._views.relink_plain, which
# mpitensor._ops._indexing sets at import).
relink_plain = None
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


def errstate_raises() -> bool:
    """Whether NumPy's error state here raises (or calls a function) on some
    floating-point error: the executor then raises an error of one rank's local
    compute on every rank, as NumPy raises for the whole array. Local.

    Example: ``with np.errstate(divide="raise"): assert errstate_raises()``.
    """
    return any(v in ("raise", "call") for v in np.geterr().values())


_C.set_hook("error", executor_error)
_C.set_hook("door", door_from_c)
# NumPy 2 keeps its error state in a context variable; without it (another NumPy)
# each rank raises its own errors, as before.
_errstate_var = getattr(getattr(getattr(np, "_core", None), "umath", None),
                        "_extobj_contextvar", None)
if _errstate_var is not None:
    _C.watch_errstate(_errstate_var, errstate_raises)
