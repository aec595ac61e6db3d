"""The reverse-mode engine: define-by-run recording and topological backward.

Each operation on DTensors that require grad, in grad mode, gives its output a
:class:`Node`: the inputs that need a gradient and a backward function from the
output's gradient to theirs. ``backward`` orders the tensors reachable from the
roots (outputs before inputs), calls each node once with the sum of the gradients
that reached its output, and accumulates into the leaves' ``.grad``.

Gradients are DTensors computed with DTensor operations with grad mode off, so
they go through the same executor as the forward: their placements come from the
same C decisions and their redistributions are the same plans. A leaf keeps its
gradient where backward made it, as torch's AccumulateGrad does (a Replicate
weight times a batch sharded over the mesh: a Partial gradient, reduced by
whoever reads it next, once per accumulation rather than once per backward); a
later backward's gradient is added into it in the placements it has, as torch's
in-place ``grad += new``. Every check here depends on global shapes and
placements only, so every rank raises the same error. A rule makes a gradient where it goes next (past the
redistributes that made its input, ``_rules._headed``), except at a tensor that
several gradients reach (``y`` of ``y * y``; the engine counts them, as torch's
dependency counts): there they are summed first and move on once.

Hooks: a tensor's ``register_hook`` hooks run when the engine reaches it with its
summed gradient, before the gradient goes on (to its node, its ``.grad``); a leaf's
post-accumulate-grad hooks after its ``.grad`` is accumulated. Each call is agreed
on across the tensor's mesh (``_hooks``), so a hook that raises on one rank raises
on all of them.
"""

from __future__ import annotations

import numpy as np

from .. import _C, _modes, _registry
from .._dtensor import DTensor
from .._dtensor_spec import DTensorSpec
from .._node import Node
from ..placement_types import Replicate
from . import _hooks

__all__ = ["Node", "record", "register_backward", "backward", "grad"]


# record(name, out, inputs, backward_fn) -> out: makes ``out`` the result of a
# recorded operation when one of ``inputs`` requires grad (grad mode is the
# caller's check) and ``out`` is floating point or complex; the engine calls
# ``backward_fn(grad, node, out)`` as every node's. In C: every operation the
# Python entries record pays it.
record = _C.record


def register_backward(func, name: str, backward, supports=None, *,
                      operands: bool = False) -> None:
    """Registers how the executor records ``func``: a node named ``name`` whose
    ``backward(grad, node, output)`` returns one gradient per input (None for none),
    as the engine calls every node's. The one way a backward is registered. Local
    (at import).

    ``operands=True``: ``func`` is what the executor runs and records itself: a
    ufunc or reduction (the node's ``saved`` holds the operands, ``aux`` a
    reduction's ``(axis, keepdims)``), ``"redistribute"`` or ``"view"`` (the views
    it reads strided operands through, as restride). Otherwise ``func`` is a
    registered NumPy function, which the Python door records
    (mpitensor._registry): ``saved`` holds its positional arguments as called,
    ``aux`` its keywords, and the node's inputs are the positional arguments with
    lists and tuples flattened once; ``supports(args, kwargs)`` says whether a call
    has a rule (a diagonal einsum does not); ``backward`` None says the function
    writes in place (``name`` is then the error's message) and True that it is
    composed of operations that record themselves (``np.linalg.norm``).

    Example: ``register_backward(np.flipud, "flipud", lambda g, node, out: (np.flipud(g),))``.
    """
    if operands:
        if supports is not None:
            raise TypeError("an operand backward is a callable, for every call")
        _C.register_grad(func, name, backward)
        return
    if backward is not None and backward is not True and not callable(backward):
        raise TypeError("backward must be callable, None or True")
    if supports is not None and not callable(supports):
        raise TypeError("supports must be callable or None")
    _registry.backwards[func] = ((name, backward) if supports is None
                                 else (name, backward, supports))


def _order(roots) -> list:
    """The tensors reachable from ``roots`` through recorded nodes, each after
    every tensor computed from it (outputs first)."""
    seen, order = set(), []
    stack = [(r, False) for r in roots]
    while stack:
        t, done = stack.pop()
        if done:
            order.append(t)
            continue
        if id(t) in seen:
            continue
        seen.add(id(t))
        stack.append((t, True))
        fn = t.grad_fn
        if fn is not None:
            stack.extend((x, False) for x in fn.inputs if x is not None and id(x) not in seen)
    order.reverse()
    return order


def _seed(t: DTensor, gradient) -> tuple:
    """The gradient backward starts ``t`` from, and whether it is the engine's own
    (a user's ``gradient=`` never is)."""
    if gradient is None:
        if t.shape != ():
            raise RuntimeError(
                f"grad can be implicitly created only for scalar outputs; pass a "
                f"gradient DTensor of shape {t.shape}")
        mesh = t.device_mesh
        return DTensor.from_local(np.ones((), t.dtype), mesh, [Replicate()] * mesh.ndim), True
    if type(gradient) is not DTensor or gradient.shape != t.shape:
        raise RuntimeError(
            f"the gradient must be a DTensor of shape {t.shape}, got "
            f"{getattr(gradient, 'shape', type(gradient).__name__)}")
    return gradient, False


# Ownership. The engine writes into a gradient's memory (summing the gradients that
# reach a tensor, accumulating into ``.grad``) and stores a gradient as ``.grad``
# without a copy only when that memory is its own, which it knows without counting
# references: it allocated it (a sum, a copy, the seed), or the executor did for
# this gradient alone while the backward ran (``_fresh``: a new array, not a view,
# made by a rule's operation or redistribution), or a node that allocated it says
# so (fully_shard's reduce-scattered parts). A gradient handed out twice (add's
# ``(g, g)``) or passed through unchanged (an identity backward's ``g``) is owned
# at most once; a user's ``gradient=`` never, nor a gradient a hook was given or
# returned (the hook may keep it: ``exposed`` in ``_run``). A stored ``.grad`` stays the
# engine's until someone reads it (the ``grad`` property): from then on the next
# backward sums into a new array, so a ``.grad`` someone may hold never changes.
# The flag travels with the gradient in ``_run``'s table.

def _fresh(x: DTensor) -> bool:
    """Whether the engine may write into ``x``'s local array: the executor made it
    during this backward, and it is writable (a read-only one is a view NumPy
    would not write into either, such as broadcast_to's)."""
    return bool(x._fresh) and x._local_tensor.flags.writeable


def _owned_results(gs, g, g_owned) -> list:
    """Whether each gradient a rule returned is the engine's own: made fresh for it
    (or the rule's input ``g`` handed back, when that was), and not seen before in
    this result."""
    seen, owned = set(), []
    for x in gs:
        if type(x) is not DTensor or id(x) in seen:
            owned.append(False)
            continue
        seen.add(id(x))
        owned.append(g_owned if x is g else _fresh(x))
    return owned


def _summable(a: DTensor, b: DTensor) -> bool:
    """Whether ``a + b`` is the sum of the local arrays: one spec, and no Partial
    whose reduction is not a sum (or its average). Global: every rank agrees, so
    the ranks that add in place and those that do not make the same (no)
    communication."""
    return a._spec == b._spec and all(
        not p.is_partial() or p.is_partial("sum") or p.is_partial("avg")
        for p in a._spec.placements)


def _add(a: DTensor, a_owned: bool, b: DTensor, b_owned: bool) -> tuple:
    """``a + b`` and whether it is the engine's own: written into an owned one of
    them when their local arrays add up to it, else a new DTensor."""
    if _summable(a, b):
        if a_owned:
            np.add(a._local_tensor, b._data(), out=a._local_tensor)
            return a, True
        if b_owned:
            np.add(b._local_tensor, a._data(), out=b._local_tensor)
            return b, True
        return _local_sum(a, b), True
    out = a + b
    return out, _fresh(out)


def _local_sum(a: DTensor, b: DTensor) -> DTensor:
    """``a + b`` of two summable gradients (see ``_summable``), added locally."""
    # np.add of two 0-d arrays gives a NumPy scalar: the engine keeps an array.
    return DTensor(np.asarray(np.add(a._data(), b._data())), a._spec)


def _converted(t: DTensor, g: DTensor, owned: bool) -> tuple:
    """``g`` in ``t``'s dtype, in the placements backward gave it (torch's
    AccumulateGrad moves no leaf gradient)."""
    if g._spec.dtype != t._spec.dtype:
        g, owned = g.astype(t._spec.dtype), True
    return g, owned


def _as_stored(t: DTensor, g: DTensor, owned: bool) -> DTensor:
    """``g`` as ``t``'s gradient, in memory nothing else reaches, laid out as
    ``t`` (as torch's AccumulateGrad: a gradient is kept when it is the engine's
    own and has the parameter's strides, else copied). A gradient in other
    placements than ``t`` has other local shapes: kept when contiguous."""
    g, owned = _converted(t, g, owned)
    local = g._local_tensor
    if owned and g._spec.stride == t._spec.stride:
        if g._spec.placements == t._spec.placements:
            if local.strides == getattr(t._local_tensor, "strides", None):
                return g
        elif local.flags.c_contiguous:
            return g
    return DTensor(np.array(g._data(), order="K"), g._spec)


def _accumulate(t: DTensor, g: DTensor, owned: bool) -> None:
    """Adds ``g`` into ``t.grad``: in place when ``t.grad`` is the engine's own
    (nothing but ``t`` reaches it; torch accumulates in place too), else into a new
    DTensor, so a ``.grad`` someone kept a reference to is never changed. The sum
    has ``t.grad``'s placements, as torch's in-place ``grad += g``: ``g`` is
    moved to them first when backward made it elsewhere (a Replicate ``t.grad``
    and a Partial ``g``: one all-reduce; a Partial ``t.grad`` takes a Replicate
    ``g`` without communication)."""
    if getattr(t, "_grad", None) is None:
        t._grad, t._grad_owned = _as_stored(t, g, owned), True
        return
    g, owned = _converted(t, g, owned)
    held = t._grad._spec
    if g._spec.mesh == held.mesh and g._spec.placements != held.placements:
        g = _as_placed(g, held.placements)
    if not _summable(t._grad, g):
        t._grad, t._grad_owned = t._grad + g, False
    elif getattr(t, "_grad_owned", False):
        np.add(t._grad._local_tensor, g._data(), out=t._grad._local_tensor)
    else:
        t._grad, t._grad_owned = _local_sum(t._grad, g), True


def _as_placed(g: DTensor, placements) -> DTensor:
    """``g`` in ``placements``, as torch's in-place add moves its operand: a
    redistribute, but where ``placements`` is Partial and ``g`` is not, ``g``
    made Replicate there and partitioned without communication (torch's
    ``_partition_value``: a sum's value divided by the mesh dim's size, the
    other reductions' kept). Collective on ``g``'s mesh."""
    mesh = g._spec.mesh
    mid = tuple(Replicate() if q.is_partial() and not p.is_partial() else q
                for p, q in zip(g._spec.placements, placements))
    if mid != g._spec.placements:
        g = g.redistribute(mesh, mid)
    if mid == tuple(placements):
        return g
    local = g._data()
    for d, (p, q) in enumerate(zip(mid, placements)):
        if q.is_partial("sum") and not p.is_partial():
            local = local / mesh.size(d)
    s = g._spec
    return DTensor(np.asarray(local), DTensorSpec(s.mesh, tuple(placements), s.shape,
                                                  s.dtype, s.stride))


def _leading_to(order, wanted) -> set:
    """The ids of the tensors in ``order`` from which a gradient reaches one of
    ``wanted``: only their hooks fire in ``grad()``, as torch runs only the nodes
    on a path to the inputs."""
    lead = set(wanted)
    for t in reversed(order):  # inputs before the tensors computed from them
        fn = t.grad_fn
        if fn is not None and any(x is not None and id(x) in lead for x in fn.inputs):
            lead.add(id(t))
    return lead


def _run(roots, gradients, retain_graph, wanted=None) -> dict:
    """Backward from ``roots``. With ``wanted`` (id -> tensor), the gradients of
    those tensors are returned (id -> (gradient, owned)) and no ``.grad`` is
    touched; otherwise leaves (and retain_grad tensors) accumulate theirs."""
    for i, r in enumerate(roots):
        if type(r) is not DTensor or not r._requires_grad:
            raise RuntimeError(
                f"element {i} of tensors does not require grad and does not have a grad_fn")
    grads = {}  # id -> [gradient, owned]: the sum of what reached the tensor so far
    found = {}
    # The gradients handed to a hook (and what hooks returned), by id: a hook may keep
    # one, so the engine never writes into them, even where another entry of the
    # table holds the same DTensor as its own. Holding them keeps the ids unique.
    exposed = {}
    stored = {}  # id -> leaf: gradients this backward stored as a .grad without a copy
    was = _modes.set_grad_enabled(False)
    was_backward = _modes.set_backward(True)
    _exposures.append((exposed, stored))
    _callbacks.append([])
    _dependencies.append({})
    try:
        for r, g in zip(roots, gradients):
            g, owned = _seed(r, g)
            prev = grads.get(id(r))
            grads[id(r)] = (g, owned) if prev is None else _add(*prev, g, owned)
        order = _order(roots)
        _dependencies[-1] = _count_dependencies(order, roots)
        needed = None if wanted is None else _leading_to(order, wanted)
        for t in order:
            entry = grads.pop(id(t), None)
            if entry is None:
                continue
            g, owned = entry
            del entry
            owned = owned and id(g) not in exposed
            fn = t.grad_fn
            if getattr(t, "_backward_hooks", None) and (needed is None or id(t) in needed):
                _expose(g, exposed, stored)
                g, owned = _hooks.tensor_hooks(t, g), False
                _expose(g, exposed, stored)
            if wanted is not None:
                if id(t) in wanted:
                    found[id(t)] = (g, owned)
                    owned = False
            elif fn is None or getattr(t, "_retains_grad", False):
                if t._requires_grad:
                    _accumulate(t, g, owned)
                    if t._grad is g:
                        stored[id(g)] = t
                    owned = False  # given away as a .grad (or copied into one)
                    if fn is None and getattr(t, "_post_accumulate_grad_hooks", None):
                        _hooks.post_accumulate_grad_hooks(t)
            if fn is None:
                continue
            if not owned:
                g._fresh = False  # what the rule hands back of g is not the engine's
            backward_fn = fn.backward_fn
            if backward_fn is None:
                raise RuntimeError(
                    "Trying to backward through the graph a second time; specify "
                    "retain_graph=True on the first backward")
            gs = backward_fn(g, fn, t)
            if not isinstance(gs, tuple):
                gs = tuple(gs)
            owned = _owned_results(gs, g, owned)
            del g
            inputs = fn.inputs
            if not retain_graph:
                # Frees what the node saved and the inputs, so a kept output (the
                # loss) no longer holds the forward's arrays.
                fn.backward_fn, fn.inputs, fn.saved, fn.aux = None, (), None, None
            for x, gx, ox in zip(inputs, gs, owned):
                if x is None or gx is None:
                    continue
                if gx.shape != x.shape:
                    raise RuntimeError(
                        f"{fn.name}'s backward gave a gradient of shape {gx.shape} for "
                        f"an input of shape {x.shape}")
                prev = grads.get(id(x))
                if prev is None:
                    grads[id(x)] = (gx, ox and id(gx) not in exposed)
                else:
                    grads[id(x)] = _add(prev[0], prev[1] and id(prev[0]) not in exposed,
                                        gx, ox and id(gx) not in exposed)
            gs = gx = prev = None
        _run_callbacks(_callbacks[-1])
    finally:
        _dependencies.pop()
        _callbacks.pop()
        _exposures.pop()
        _modes.set_backward(was_backward)
        _modes.set_grad_enabled(was)
    if exposed:
        found = {k: (g, o and id(g) not in exposed) for k, (g, o) in found.items()}
    return found


def _count_dependencies(order, roots) -> dict:
    """How many gradients reach each tensor of ``order`` (by id): one per place it
    is an input of a recorded node, and one per time it is a root (torch's
    dependency counts)."""
    deps: dict = {}
    for r in roots:
        deps[id(r)] = deps.get(id(r), 0) + 1
    for t in order:
        fn = t.grad_fn
        if fn is not None:
            for x in fn.inputs:
                if x is not None:
                    deps[id(x)] = deps.get(id(x), 0) + 1
    return deps


# The running backwards' dependency counts, innermost last.
_dependencies: list = []


def gathers(t) -> bool:
    """Whether the running backward sums more than one gradient at ``t`` before it
    goes on: then each of them is best left where it is made and the sum moved
    once, as torch does. Local (global shapes and the graph only).

    Example (in a rule): ``if not gathers(x): ...move x's gradient on...``.
    """
    return bool(_dependencies) and _dependencies[-1].get(id(t), 0) > 1


# The running backwards' (exposed, stored) tables, innermost last: a hook may run
# a backward of its own.
_exposures: list = []


# The running backwards' final callbacks (queue_callback), innermost last.
_callbacks: list = []


def queue_callback(fn) -> None:
    """Runs ``fn()`` once the running backward has gone through its whole graph
    (torch's ``Variable._execution_engine.queue_callback``), still in backward mode;
    a callback queued twice in one backward (an equal callable: the same bound
    method) runs once. Not run when the backward raises. Local (``fn`` decides).

    Example (inside a node's backward or a hook): ``queue_callback(state.settle)``.
    """
    if not _callbacks:
        raise RuntimeError("Final callbacks can only be installed during backward pass.")
    if fn not in _callbacks[-1]:
        _callbacks[-1].append(fn)


def _run_callbacks(queued: list) -> None:
    # a callback may queue another: run until none is left
    i = 0
    while i < len(queued):
        queued[i]()
        i += 1


def expose(g) -> None:
    """Tells the running backward that user code (a node that calls hooks: a
    module's backward hooks) was given or returned ``g``: the engine never writes
    into it afterwards. Local."""
    if _exposures and type(g) is DTensor:
        _expose(g, *_exposures[-1])


def _expose(g: DTensor, exposed: dict, stored: dict) -> None:
    """Notes that a hook is given (or gave) ``g``: from now on the engine writes into
    it nowhere, also not as the ``.grad`` of a leaf that already stored it (the
    same DTensor reached two tensors)."""
    exposed[id(g)] = g
    leaf = stored.get(id(g))
    if leaf is not None and getattr(leaf, "_grad", None) is g:
        leaf._grad_owned = False


def backward(tensors, grad_tensors=None, retain_graph=None) -> None:
    """Accumulates the gradients of ``tensors`` (weighted by ``grad_tensors``; a
    scalar needs none) into the leaves' ``.grad``. Collective on the meshes.

    Example: ``backward([loss])`` is ``loss.backward()``.
    """
    tensors = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    if grad_tensors is None:
        grad_tensors = [None] * len(tensors)
    elif not isinstance(grad_tensors, (list, tuple)):
        grad_tensors = [grad_tensors]
    _run(tensors, list(grad_tensors), bool(retain_graph))


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, allow_unused=False):
    """The gradients of ``outputs`` with respect to ``inputs`` (a tuple of DTensors,
    with their own placements), leaving every ``.grad`` alone (torch.autograd.grad).
    An input ``outputs`` does not depend on is a RuntimeError, or None with
    ``allow_unused=True``. Collective on the meshes.

    Example::

        >>> (gw,) = mpitensor.autograd.grad((w * w).sum(), [w])   # 2 * w
    """
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    inputs = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif not isinstance(grad_outputs, (list, tuple)):
        grad_outputs = [grad_outputs]
    for x in inputs:
        if type(x) is not DTensor or not x._requires_grad:
            raise RuntimeError("One of the differentiated DTensors does not require grad")
    found = _run(outputs, list(grad_outputs), bool(retain_graph),
                 {id(x): x for x in inputs})
    result = []
    for x in inputs:
        g = found.get(id(x))
        if g is None:
            if not allow_unused:
                raise RuntimeError(
                    "One of the differentiated DTensors appears to not have been used in "
                    "the graph; set allow_unused=True if this is the desired behavior")
            result.append(None)
        else:
            was = _modes.set_grad_enabled(False)
            try:
                result.append(_as_stored(x, *g))
            finally:
                _modes.set_grad_enabled(was)
    return tuple(result)
