"""Activation checkpointing, as ``torch.utils.checkpoint``: a block's forward runs
without recording, and its backward runs the forward again, recording, to get the
gradients. The activations inside the block live only during its backward; what
stays between forward and backward is the block's inputs and output.

The recomputation sees the random state of the forward (dropout draws the same
mask) and, inside ``fully_shard``, gathers the block's parameters again as torch's
does (no prefetch while it recomputes). The gradients reach the block's inputs
through this node and its parameters' ``.grad`` through the backward of the
recomputed forward.
"""

from __future__ import annotations

from .. import random
from .._dtensor import DTensor
from ..autograd import backward, enable_grad, is_grad_enabled, no_grad
from ..autograd._engine import record
from ..nn.module import Module

__all__ = ["checkpoint", "checkpoint_wrapper", "CheckpointWrapper"]


def checkpoint(function, *args, use_reentrant=None, preserve_rng_state: bool = True,
               **kwargs):
    """``function(*args, **kwargs)``, its activations recomputed in backward instead
    of kept (torch's ``torch.utils.checkpoint.checkpoint``). The result is one
    DTensor. It records a gradient when an argument requires grad, or when
    ``function`` is a Module (or a bound method of one) with a parameter that
    does. ``use_reentrant`` is accepted for torch's scripts (both of torch's
    variants give the same gradients here). Collective as ``function`` is, and
    again in backward.

    Example::

        >>> from mpitensor.utils.checkpoint import checkpoint
        >>> h = checkpoint(block, h, use_reentrant=False)
        >>> loss_fn(h).backward()   # block's forward runs again here
    """
    if not is_grad_enabled():
        return function(*args, **kwargs)
    state = random.get_rng_state() if preserve_rng_state else None
    owner = _owner(function)
    # The parameters the forward saw: inside fully_shard, the gathered views of
    # this forward, which the recomputation must use (and send gradients to) again.
    params = [] if owner is None else [
        (m, name, t) for m in owner.modules() for name, t in m._parameters.items()]
    with no_grad():
        out = function(*args, **kwargs)
    needs = tuple(type(a) is DTensor and a.requires_grad for a in args)
    trainable = any(getattr(t, "requires_grad", False) for _, _, t in params)
    if not (any(needs) or trainable):
        return out
    if type(out) is not DTensor:
        raise TypeError(f"checkpoint: the function must return one DTensor, got "
                        f"{type(out).__name__}")
    if any(out is a for a in args):
        out = out.__copy__()

    def backward_fn(g, node, out):
        inputs = [a.detach().requires_grad_(n) if n else a for a, n in zip(args, needs)]
        saved_state = random.get_rng_state() if state is not None else None
        current = [(m, name, m._parameters.get(name)) for m, name, _ in params]
        if state is not None:
            random.set_rng_state(state)
        for m, name, t in params:
            m._parameters[name] = t
        try:
            with enable_grad():
                again = function(*inputs, **kwargs)
            if type(again) is DTensor and again.requires_grad:
                backward([again], [g])
        finally:
            for m, name, t in current:
                m._parameters[name] = t
            if saved_state is not None:
                random.set_rng_state(saved_state)
        return tuple(x.grad if n else None for x, n in zip(inputs, needs))

    # always: the recomputation's backward reaches trainable parameters that are no
    # input of the node, so it is recorded even when no argument requires grad.
    return record("CheckpointFunctionBackward", out, args, backward_fn, True)


def _owner(function):
    """The Module that ``function`` is, or whose bound method it is; else None."""
    owner = function if isinstance(function, Module) else getattr(function, "__self__", None)
    return owner if isinstance(owner, Module) else None


class CheckpointWrapper(Module):
    """A module whose forward is its wrapped module's under :func:`checkpoint`
    (torch's ``checkpoint_wrapper``); its state dict keys are the wrapped module's
    under ``_checkpoint_wrapped_module.``, as torch's. Local to make."""

    def __init__(self, module: Module, preserve_rng_state: bool = True):
        super().__init__()
        self._checkpoint_wrapped_module = module
        self.preserve_rng_state = preserve_rng_state

    def forward(self, *args, **kwargs):
        return checkpoint(self._checkpoint_wrapped_module, *args, use_reentrant=False,
                          preserve_rng_state=self.preserve_rng_state, **kwargs)


def checkpoint_wrapper(module: Module, preserve_rng_state: bool = True) -> CheckpointWrapper:
    """``module`` wrapped so that each forward is checkpointed (torch's
    ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper``).
    Local.

    Example::

        >>> for i, block in enumerate(model.layers):
        ...     model.layers[i] = checkpoint_wrapper(block)
    """
    if not isinstance(module, Module):
        raise TypeError(f"checkpoint_wrapper takes a Module, got {type(module).__name__}")
    return CheckpointWrapper(module, preserve_rng_state)
