"""A module's full backward hooks and backward pre-hooks (torch.utils.hooks.BackwardHook).

Each call of a module with such hooks puts an identity in front of its DTensor
inputs and behind its DTensor outputs, as torch's BackwardHookFunction does, so
that the engine hands the hooks the gradients of the module's outputs and of its
inputs. torch's identity is one node with an output per tensor, which the engine
runs once, when every output's gradient is known. Ours is the same with the
engine's one-output nodes: each tensor gets an alias whose node keeps its gradient
and passes a scalar zero on to one shared hub; the hub's node, whose inputs are the
wrapped tensors, runs after every alias (they were computed from it) and before
anything the wrapped tensors came from, so it sees all the gradients at once, calls
the hooks, and hands on what they return (fully_shard's token works the same way).

The hooks run inside the backward, each call agreed on across the hub's mesh
(autograd._hooks.agreed): a hook that raises on one rank raises on every rank.
"""

from __future__ import annotations

import warnings

import numpy as np

from .. import _modes
from .._dtensor import DTensor
from ..autograd._engine import expose, record
from ..autograd._hooks import agreed
from ..placement_types import Replicate

__all__ = ["BackwardHook"]


def _layout(grads) -> tuple:
    return tuple(None if g is None else g._spec.placements for g in grads)


def _checked(grads: tuple, tensors: list) -> tuple:
    """``grads``, what the hooks made of the gradients of ``tensors``, checked."""
    for g, t in zip(grads, tensors):
        if g is not None and (type(g) is not DTensor or g.shape != t.shape):
            raise RuntimeError(
                f"a module backward hook gave a gradient "
                f"{getattr(g, 'shape', type(g).__name__)} for a DTensor of shape {t.shape}")
    return grads


def _pack(index, values, size) -> tuple:
    out = [None] * size
    for i, v in zip(index, values):
        out[i] = v
    return tuple(out)


class BackwardHook:
    """One call of ``module``: wraps its inputs (``setup_input_hook``) and outputs
    (``setup_output_hook``) and runs ``hooks`` (full backward hooks) and
    ``pre_hooks`` (backward pre-hooks) on their gradients, as torch's."""

    def __init__(self, module, hooks: list, pre_hooks: list) -> None:
        self.module, self.hooks, self.pre_hooks = module, hooks, pre_hooks
        self.grad_outputs = None
        self.n_inputs = self.n_outputs = -1
        self.input_index = self.output_index = None

    def setup_input_hook(self, args: tuple) -> tuple:
        """``args`` with their DTensors wrapped; the hooks fire when their
        gradients are known."""
        out, self.input_index = self._wrap(args, self._on_input_grads)
        self.n_inputs = len(args)
        return out

    def setup_output_hook(self, output):
        """``output`` (a DTensor or a tuple) with its DTensors wrapped; the
        pre-hooks fire when their gradients are known."""
        is_tuple = isinstance(output, tuple)
        items = output if is_tuple else (output,)
        out, self.output_index = self._wrap(items, self._on_output_grads)
        self.n_outputs = len(items)
        return out if is_tuple else out[0]

    def _wrap(self, items: tuple, on_grads):
        """``items`` with each DTensor that requires grad replaced by an alias
        that reports its gradient to one hub, and the positions of the DTensors
        (None when none requires grad or grad mode is off: nothing to hook)."""
        index = [i for i, x in enumerate(items) if type(x) is DTensor]
        tensors = [items[i] for i in index]
        need = [t._requires_grad for t in tensors]
        if not (any(need) and _modes.state.grad_enabled):
            return items, None
        first = tensors[need.index(True)]
        mesh = first._spec.mesh
        zero = DTensor.from_local(np.zeros((), first._spec.dtype), mesh,
                                  [Replicate()] * mesh.ndim)
        hub = DTensor.from_local(np.zeros((), first._spec.dtype), mesh,
                                 [Replicate()] * mesh.ndim)
        got = [None] * len(tensors)

        def hub_backward(g, node, out):
            grads = tuple(got)
            got[:] = [None] * len(got)
            # The hooks may keep what they are given and what they return: the
            # engine must never write into those.
            for g in grads:
                expose(g)
            result = agreed(mesh, lambda: _checked(on_grads(grads), tensors), _layout,
                            "a module backward hook")
            for g in result:
                expose(g)
            return tuple(g if n else None for g, n in zip(result, need))

        record("BackwardHookFunctionBackward", hub, tensors, hub_backward)
        out = list(items)
        for j, (i, t) in enumerate(zip(index, tensors)):
            if need[j]:
                out[i] = record("BackwardHookFunctionBackward", DTensor(t._data(), t._spec),
                                (hub,), self._collector(got, j, zero))
        return (tuple(out) if type(items) is tuple else type(items)(*out)), index

    @staticmethod
    def _collector(got: list, j: int, zero: DTensor):
        def backward_fn(g, node, out):
            got[j] = g
            return (zero,)
        return backward_fn

    def _on_output_grads(self, grads: tuple) -> tuple:
        """The outputs' gradients through the pre-hooks; with no input to wait
        for, the full hooks too (with None for every input's gradient)."""
        self.grad_outputs = _pack(self.output_index, grads, self.n_outputs)
        for hook in self.pre_hooks:
            new = hook(self.module, self.grad_outputs)
            if new is None:
                continue
            if len(new) != len(self.grad_outputs):
                raise RuntimeError(
                    f"Backward pre hook returned an invalid number of grad_output, got "
                    f"{len(new)}, but expected {len(self.grad_outputs)}")
            self.grad_outputs = tuple(new)
        local = self.grad_outputs
        if self.input_index is None:
            warnings.warn("Full backward hook is firing when gradients are computed with "
                          "respect to module outputs since no inputs require gradients",
                          stacklevel=2)
            grad_inputs = (None,) * self.n_inputs
            for hook in self.hooks:
                res = hook(self.module, grad_inputs, self.grad_outputs)
                if res is not None and not (isinstance(res, tuple)
                                            and all(x is None for x in res)):
                    raise RuntimeError(
                        "Backward hook for Modules where no input requires gradient "
                        "should always return None or None for all gradients.")
            self.grad_outputs = None
        return tuple(local[i] for i in self.output_index)

    def _on_input_grads(self, grads: tuple) -> tuple:
        """The inputs' gradients through the full hooks, given the outputs'."""
        if self.grad_outputs is None:
            # The gradient reached the inputs without passing the outputs.
            return grads
        res = _pack(self.input_index, grads, self.n_inputs)
        for hook in self.hooks:
            new = hook(self.module, res, self.grad_outputs)
            if new is None:
                continue
            if len(new) != len(res):
                raise RuntimeError(
                    f"Backward hook returned an invalid number of grad_input, got "
                    f"{len(new)}, but expected {len(res)}")
            res = tuple(new)
        self.grad_outputs = None
        return tuple(res[i] for i in self.input_index)
