"""Custom differentiable operations, as torch.autograd.Function.

A subclass defines ``forward(ctx, *args)`` and ``backward(ctx, *grad_outputs)``
as static methods; ``Subclass.apply(*args)`` runs the forward with grad mode off
(so ``to_local()`` inside gives plain ndarrays) and, when an argument requires
grad in grad mode, records the output with a node that calls ``backward``. That
is how a function that computes on local arrays (mpitensor.nn's layers) keeps
its gradient: the forward and the backward each wrap their local results in
DTensors with the placements they have.
"""

from __future__ import annotations

from .. import _dtypes, _modes
from .._dtensor import DTensor
from ._engine import record

__all__ = ["Function", "FunctionCtx"]


class FunctionCtx:
    """What ``forward`` hands to ``backward``: ``save_for_backward(*tensors)`` /
    ``saved_tensors``, ``needs_input_grad`` (one bool per positional argument of
    ``apply``) and any attribute set on it. Local.

    Example: ``ctx.save_for_backward(x, w)`` in forward, ``x, w = ctx.saved_tensors``
    in backward.
    """

    def __init__(self, needs_input_grad: tuple) -> None:
        self.needs_input_grad = needs_input_grad
        self._saved = ()

    def save_for_backward(self, *tensors) -> None:
        """Keeps ``tensors`` (DTensors, ndarrays or None) for ``backward``. Local.

        Example: ``ctx.save_for_backward(input, weight)``.
        """
        self._saved = tensors

    @property
    def saved_tensors(self) -> tuple:
        """What ``save_for_backward`` kept, in its order. Local.

        Example: ``input, weight = ctx.saved_tensors``.
        """
        return self._saved


class Function:
    """Base class of a differentiable operation written by hand (torch.autograd.Function).

    ``forward(ctx, *args, **kwargs)`` returns one DTensor (or anything that is not
    floating point, which is not recorded); ``backward(ctx, grad)`` returns one
    gradient per positional argument of ``apply``: a DTensor of that argument's
    shape, or None (for a non-DTensor argument or one that needs no gradient,
    see ``ctx.needs_input_grad``). Both run with grad mode off. The gradient's
    placements are whatever ``backward`` gives; the engine redistributes a leaf's
    to the leaf's placements. Local unless ``forward``/``backward`` communicate.

    What ``backward`` returns may be kept by it, so autograd's engine copies a
    gradient it stores as ``.grad`` rather than write into memory it does not own.

    Example::

        >>> class Cube(mpitensor.autograd.Function):
        ...     @staticmethod
        ...     def forward(ctx, x):
        ...         ctx.save_for_backward(x)
        ...         return x * x * x
        ...     @staticmethod
        ...     def backward(ctx, g):
        ...         (x,) = ctx.saved_tensors
        ...         return g * 3 * x * x
        >>> Cube.apply(w).sum().backward()     # w.grad == 3 w**2
    """

    # mpitensor's own Functions keep nothing they return: the engine may then own
    # the gradients they make.
    _gives_up_results = False

    @staticmethod
    def forward(ctx, *args, **kwargs):
        """The operation, with grad mode off. Override it.

        Example: ``return x * 2``.
        """
        raise NotImplementedError("a Function subclass must define forward(ctx, ...)")

    @staticmethod
    def backward(ctx, *grad_outputs):
        """The gradients of the positional arguments from the output's. Override it.

        Example: ``return g * 2``.
        """
        raise NotImplementedError("a Function subclass must define backward(ctx, grad)")

    @classmethod
    def apply(cls, *args, **kwargs):
        """Runs ``forward`` and records it when an argument requires grad in grad
        mode. Local unless the forward communicates.

        Example: ``y = Cube.apply(x)``.
        """
        needs = tuple(type(a) is DTensor and a._requires_grad for a in args) \
            if _modes.state.grad_enabled else (False,) * len(args)
        ctx = FunctionCtx(needs)
        was, priced = _modes.set_grad_enabled(False), _modes.state.grad_priced
        _modes.state.grad_priced = priced or any(needs)
        try:
            out = cls.forward(ctx, *args, **kwargs)
        finally:
            _modes.set_grad_enabled(was)
            _modes.state.grad_priced = priced
        if not any(needs):
            return out
        if type(out) is not DTensor:
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if any(type(o) is DTensor and _dtypes.is_inexact(o._spec.dtype)
                   for o in outs):
                raise NotImplementedError(
                    f"{cls.__name__}.forward returned several DTensors; a Function "
                    f"records one output (the gradient would be lost)")
            return out
        if any(out is a for a in args):
            # Recording marks the output: an input handed back must stay what it was.
            out = out.__copy__()
        name = cls.__name__

        def backward_fn(g, node, output):
            grads = cls.backward(ctx, g)
            if not isinstance(grads, tuple):
                grads = (grads,)
            if len(grads) < len(args) or any(x is not None for x in grads[len(args):]):
                raise RuntimeError(
                    f"{name}.backward returned {len(grads)} gradients; expected one per "
                    f"positional input ({len(args)})")
            for i, (gx, need) in enumerate(zip(grads, needs)):
                if need and gx is not None and type(gx) is not DTensor:
                    raise TypeError(
                        f"{name}.backward returned a {type(gx).__name__} for input {i}; "
                        f"gradients are DTensors")
                if type(gx) is DTensor and not cls._gives_up_results:
                    gx._fresh = False  # the Function may hold it
            return tuple(gx if need else None for gx, need in zip(grads, needs))
        return record(name, out, args, backward_fn)
