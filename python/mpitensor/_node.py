"""Autograd's node: what recorded one operation. On the ground floor because the
executor (csrc/ext) makes the nodes of the operations it runs, and the engine
(:mod:`mpitensor.autograd`) walks them."""

from __future__ import annotations

__all__ = ["Node"]


class Node:
    """``Node(name, inputs, backward_fn, saved=None, aux=None)``: what recorded one
    operation: its ``name``, the ``inputs`` that need a gradient (None for the
    others, in operand order) and ``backward_fn(grad, node, output)`` -> one
    gradient per input (None for no gradient), as the engine calls every node's. A
    node the executor made holds the call's operands in ``saved`` (an operand the
    forward all-reduced, as that reduced value) and the rest of the call in ``aux``
    (a reduction's (axis, keepdims), a function's keywords); one made for a
    function written in Python (``_C.record``) holds a closure and saves nothing.
    ``backward_fn`` is None once the graph is freed (a backward without
    ``retain_graph``). Local.

    Example: ``(w * 2).grad_fn.name == "multiply"``.
    """

    __slots__ = ("name", "inputs", "backward_fn", "saved", "aux")

    def __init__(self, name, inputs, backward_fn, saved=None, aux=None):
        self.name, self.inputs, self.backward_fn = name, inputs, backward_fn
        self.saved, self.aux = saved, aux

    def __repr__(self) -> str:
        return f"<{self.name} backward>"
