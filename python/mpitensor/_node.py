"""Autograd's node: what recorded one operation. On the ground floor because the
executor (csrc/ext) makes the nodes of the operations it runs, and the engine
(:mod:`mpitensor.autograd`) walks them."""

from __future__ import annotations

__all__ = ["Node"]


class Node:
    """What recorded one operation, made only by the extension's ``mt_ext_record``
    (from Python: ``_C.record``), which fills its slots: its ``name``, the
    ``inputs`` that need a gradient (None for the others, in operand order) and
    ``backward_fn(grad, node, output)`` -> one gradient per input (None for no
    gradient), as the engine calls every node's. A
    node the executor made holds the call's operands in ``saved`` (an operand the
    forward all-reduced, as that reduced value) and the rest of the call in ``aux``
    (a reduction's (axis, keepdims), a function's keywords); one made for a
    function written in Python (``_C.record``) holds a closure and saves nothing.
    ``backward_fn`` is None once the graph is freed (a backward without
    ``retain_graph``). Local.

    Example: ``(w * 2).grad_fn.name == "multiply"``.
    """

    __slots__ = ("name", "inputs", "backward_fn", "saved", "aux")

    def __repr__(self) -> str:
        return f"<{self.name} backward>"
