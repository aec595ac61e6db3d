"""The reverse-mode engine: define-by-run recording and topological backward.

Each operation on DTensors that require grad, in grad mode, gives its output a
:class:`Node`: the inputs that need a gradient and a backward function from the
output's gradient to theirs. ``backward`` orders the tensors reachable from the
roots (outputs before inputs), calls each node once with the sum of the gradients
that reached its output, and accumulates into the leaves' ``.grad``.

Gradients are DTensors computed with DTensor operations with grad mode off, so
they go through the same dispatch as the forward: their placements come from the
same C decisions and their redistributions are the same plans. A leaf's gradient
is redistributed to the leaf's placements (a Partial one's: Replicate) before it is
stored. Every check here depends on global shapes and placements only, so every
rank raises the same error.
"""

from __future__ import annotations

import numpy as np

from .. import _C, _modes
from .._dtensor import DTensor, _grad_placements
from ..placement_types import Replicate

__all__ = ["Node", "record", "backward", "grad"]


# What recorded one operation: ``name``, the ``inputs`` that need a gradient (None
# for the others, in operand order) and ``backward_fn(grad) -> grads``, one per
# input (None for no gradient). The C dispatch makes the nodes of the operations it
# takes itself: they hold the operands in ``saved`` (and a reduction's (axis,
# keepdims) in ``aux``) instead of a closure, and their ``backward_fn(grad, node,
# output)`` is the operation's rule, one function per operation
# (csrc/ext/ext_autograd.c, _rules.install).
Node = _C.Node


# record(name, out, inputs, backward_fn) -> out: makes ``out`` the result of a
# recorded operation when one of ``inputs`` requires grad (grad mode is the
# caller's check) and ``out`` is floating point or complex. In C: every operation
# the Python entries record pays it.
record = _C.record


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


def _seed(t: DTensor, gradient) -> DTensor:
    if gradient is None:
        if t.shape != ():
            raise RuntimeError(
                f"grad can be implicitly created only for scalar outputs; pass a "
                f"gradient DTensor of shape {t.shape}")
        mesh = t.device_mesh
        return DTensor.from_local(np.ones((), t.dtype), mesh, [Replicate()] * mesh.ndim)
    if type(gradient) is not DTensor or gradient.shape != t.shape:
        raise RuntimeError(
            f"the gradient must be a DTensor of shape {t.shape}, got "
            f"{getattr(gradient, 'shape', type(gradient).__name__)}")
    return gradient


def _as_stored(t: DTensor, g: DTensor) -> DTensor:
    """``g`` as ``t``'s ``.grad``: ``t``'s placements (a Partial's: Replicate) and
    dtype, in an array of its own (a gradient may be another tensor's array)."""
    pl = _grad_placements(t._spec.placements)
    if g._spec.placements != pl:
        g = g.redistribute(t._spec.mesh, pl)
    if g._spec.dtype != t._spec.dtype:
        return g.astype(t._spec.dtype)
    return g.copy()


def _run(roots, gradients, retain_graph, wanted=None) -> dict:
    """Backward from ``roots``. With ``wanted`` (id -> tensor), the gradients of
    those tensors are returned (id -> gradient) and no ``.grad`` is touched;
    otherwise leaves (and retain_grad tensors) accumulate theirs."""
    for i, r in enumerate(roots):
        if type(r) is not DTensor or not r._requires_grad:
            raise RuntimeError(
                f"element {i} of tensors does not require grad and does not have a grad_fn")
    grads = {}
    for r, g in zip(roots, gradients):
        g = _seed(r, g)
        grads[id(r)] = g if id(r) not in grads else grads[id(r)] + g
    found = {}
    was = _modes.set_grad_enabled(False)
    was_backward = _modes.set_backward(True)
    try:
        for t in _order(roots):
            g = grads.pop(id(t), None)
            if g is None:
                continue
            fn = t.grad_fn
            if wanted is not None:
                if id(t) in wanted:
                    found[id(t)] = g
            elif fn is None or getattr(t, "_retains_grad", False):
                if t._requires_grad:
                    g_t = _as_stored(t, g)
                    t._grad = g_t if t.grad is None else t._grad + g_t
            if fn is None:
                continue
            backward_fn = fn.backward_fn
            if backward_fn is None:
                raise RuntimeError(
                    "Trying to backward through the graph a second time; specify "
                    "retain_graph=True on the first backward")
            gs = backward_fn(g) if fn.saved is None else backward_fn(g, fn, t)
            inputs = fn.inputs
            if not retain_graph:
                # Frees what the node saved and the inputs, so a kept output (the
                # loss) no longer holds the forward's arrays.
                fn.backward_fn, fn.inputs, fn.saved, fn.aux = None, (), None, None
            for x, gx in zip(inputs, gs):
                if x is None or gx is None:
                    continue
                if gx.shape != x.shape:
                    raise RuntimeError(
                        f"{fn.name}'s backward gave a gradient of shape {gx.shape} for "
                        f"an input of shape {x.shape}")
                prev = grads.get(id(x))
                grads[id(x)] = gx if prev is None else prev + gx
    finally:
        _modes.set_backward(was_backward)
        _modes.set_grad_enabled(was)
    return found


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
                result.append(_as_stored(x, g))
            finally:
                _modes.set_grad_enabled(was)
    return tuple(result)
