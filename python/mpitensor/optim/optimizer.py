"""Optimizer: torch.optim.Optimizer's shape (param_groups, state, zero_grad, step,
state_dict) for DTensor parameters.

Every state tensor is a DTensor with its parameter's mesh and placements, so an
update reads and writes local shards only. A gradient that backward left in other
placements (a Partial one of a Replicate weight, as torch's) is moved to its
parameter's once per step, as torch's in-place update moves it; nothing else
moves. A step agrees,
once per step and mesh, that every rank updates the same parameters alike (see
:meth:`Optimizer.step`), since a Replicate parameter updated differently on one
rank would silently stop being replicated.
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any, Callable, Iterable

import numpy as np

from .. import _comm
from .._dtensor import DTensor
from .._fingerprint import fingerprint
from ..autograd import enable_grad
from ..nn._state_load import _agree_load, _load_layout, _load_problem, _same_ranks
from ..nn.module import Module, Parameter

__all__ = ["Optimizer"]


class _Required:
    """The default of a hyperparameter that has none (torch's ``required``)."""

    def __repr__(self) -> str:
        return "<required parameter>"


required = _Required()


def _as_param(p) -> DTensor:
    """A parameter as the optimizer keeps it: the DTensor itself (a
    :class:`~mpitensor.nn.Parameter` gives its data)."""
    if isinstance(p, Parameter):
        p = p.data
    if isinstance(p, DTensor):
        if any(pl.is_partial() for pl in p.placements):
            # A Partial leaf's gradient is Replicate: adding it to every rank's
            # partial value would count the update once per rank.
            raise ValueError(f"an optimizer cannot update a Partial DTensor "
                             f"({p.placements}); redistribute it to Replicate first")
        return p
    if isinstance(p, np.ndarray):
        raise TypeError("an optimizer updates DTensors; an ndarray parameter has no "
                        "gradient (distribute the module first, e.g. with "
                        "mpitensor.distribute_module)")
    raise TypeError(f"optimizer parameters must be DTensors, got {type(p).__name__}")


def local_grad(p: DTensor):
    """This rank's part of ``p.grad`` as an ndarray in ``p``'s dtype, or None when
    ``p`` has no gradient. A gradient in other placements than ``p`` (backward
    leaves it where it made it, as torch's: Partial for a Replicate weight and a
    sharded batch) is moved to ``p``'s first, as torch's in-place update moves
    it, once: collective on ``p``'s mesh then (the step's agreement covers the
    gradients' placements, so every rank moves alike); ``p.grad`` itself stays
    as it was. ValueError when the gradient lives on another mesh."""
    g = p.grad
    if g is None:
        return None
    if g.device_mesh == p.device_mesh and g.placements != p.placements:
        g = g.redistribute(p.device_mesh, p.placements)
    if g.device_mesh != p.device_mesh:
        raise ValueError(f"a gradient with placements {g.placements} on {g.device_mesh} "
                         f"cannot update a parameter with placements {p.placements} on "
                         f"{p.device_mesh} without communication")
    local = g._data()
    return local if local.dtype == p.dtype else local.astype(p.dtype)


def _grad_layout(p: DTensor, g) -> tuple:
    """What of a gradient decides how a step moves it: nothing when it is laid out
    as its parameter (the common case costs no more than a comparison), else its
    placements."""
    if g is None or g._spec.placements == p._spec.placements:
        return ()
    return tuple(g._spec.placements)


def zeros_like_param(p: DTensor) -> DTensor:
    """A zero DTensor with ``p``'s mesh, placements, shape and dtype; its local
    array is C-contiguous whatever ``p``'s is (Adam views complex state as reals)."""
    local = p._data()
    return DTensor(np.zeros(local.shape, local.dtype), p._spec)


def check_implementation(foreach, fused, differentiable) -> None:
    """torch's ``foreach=`` and ``fused=`` choose among implementations of one
    update; there is one here, so both are accepted and change nothing (torch's
    refusal of both at once kept). ``differentiable=True`` asks for a step that
    autograd records, which there is not: NotImplementedError."""
    if fused and foreach:
        raise RuntimeError("`fused` and `foreach` cannot be `True` together.")
    if differentiable:
        raise NotImplementedError("differentiable=True: an optimizer step is not "
                                  "recorded by mpitensor.autograd")


def lerp_(a: np.ndarray, b: np.ndarray, weight: float) -> None:
    """``a`` moved towards ``b`` by ``weight`` in place, by torch's two formulas
    (either side of one half), so that the rounding is torch's."""
    if abs(weight) < 0.5:
        a += weight * (b - a)
    else:
        np.subtract(b, (b - a) * (1 - weight), out=a)


def _is_state_tensor(key: str, value) -> bool:
    return key != "step" and isinstance(value, (DTensor, np.ndarray))


def _plain(value):
    """What of a hyperparameter or a state value every rank must hold alike, in a
    form whose ``repr`` is the same in every process: numbers, strings, None and
    tuples or lists of them as they are, anything else by its type only (its
    ``repr`` may hold an address)."""
    if value is None or isinstance(value, (bool, int, float, str, np.number, np.bool_)):
        return value.item() if isinstance(value, (np.number, np.bool_)) else value
    if isinstance(value, (tuple, list)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    if isinstance(value, DTensor) and value.shape == ():
        return _plain(value._data())  # this rank's copy: a 0-d step, say
    return type(value).__name__


def _hyper(group: dict) -> tuple:
    """A group's hyperparameters (all but its parameters) in key order."""
    return tuple((k, _plain(group[k])) for k in sorted(group) if k != "params")


def _param_layout(p: DTensor) -> tuple:
    """What of a parameter decides its update: its global shape, dtype,
    placements and ranks."""
    return (tuple(p.shape), p.dtype.str, tuple(p.placements),
            np.asarray(p.device_mesh.mesh).tolist())


_STEP_MISMATCH = (
    "the ranks' optimizers differ: their parameter groups (the parameters' shapes, "
    "dtypes, placements or meshes, or hyperparameters such as lr), which parameters "
    "have a gradient and in which placements, or the zero_grad calls since the last "
    "step; every rank must "
    "step the same optimizer alike, or the copies of a replicated parameter diverge")


class Optimizer:
    """Base class of the optimizers, as torch.optim.Optimizer.

    ``params`` is an iterable of DTensors (such as ``model.parameters()`` of a
    distributed module, or :class:`~mpitensor.nn.Parameter` objects holding
    DTensors), or of dicts that each define a parameter group with its own
    hyperparameters (``{"params": [...], "lr": 0.01}``); ``defaults`` fills what
    a group leaves out. ``state[p]`` holds a parameter's state (DTensors with its
    placements). A subclass defines ``_update``. Making one is Local. An update
    works on each rank's shards; :meth:`step` agrees with the other ranks first.
    A gradient in other placements than its parameter is moved to them once
    per step (:func:`local_grad`).

    Example::

        >>> opt = mpitensor.optim.SGD([{"params": [w1]}, {"params": [w2], "lr": 0.01}],
        ...                           lr=0.1)
        >>> [g["lr"] for g in opt.param_groups]
        [0.1, 0.01]
    """

    def __init__(self, params: Iterable, defaults: dict) -> None:
        self.defaults = dict(defaults)
        self.state: defaultdict = defaultdict(dict)
        self.param_groups: list[dict] = []
        # The zero_grad calls since the last step, as a running fingerprint that
        # the next step's agreement carries; and, per group, the fingerprint of
        # its hyperparameters and layouts with what it was made from (a step
        # recomputes it only when that changes): one entry a group.
        self._zeroed = 0
        self._layouts: dict = {}
        if isinstance(params, (DTensor, Parameter, np.ndarray)):
            raise TypeError("params argument given to the optimizer should be an iterable "
                            "of DTensors or dicts, but got " + type(params).__name__)
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group: dict) -> None:
        """Adds a group of parameters with its own hyperparameters (the defaults
        fill the others), as when fine-tuning adds layers. Local.

        Example: ``opt.add_param_group({"params": [head.weight], "lr": 1e-3})``.
        """
        if not isinstance(param_group, dict):
            raise TypeError(f"a parameter group must be a dict, got "
                            f"{type(param_group).__name__}")
        group = dict(param_group)
        params = group["params"]
        if isinstance(params, (DTensor, Parameter)):
            params = [params]
        elif isinstance(params, set):
            raise TypeError("optimizer parameters need to be organized in ordered "
                            "collections, but the ordering of sets is not the same on "
                            "every rank; use a list instead")
        group["params"] = [_as_param(p) for p in params]
        for name, default in self.defaults.items():
            if default is required and name not in group:
                raise ValueError(f"parameter group didn't specify a value of required "
                                 f"optimization parameter {name}")
            group.setdefault(name, default)
        ids = [id(p) for p in group["params"]]
        if len(set(ids)) != len(ids):
            raise ValueError("optimizer contains a parameter group with duplicate "
                             "parameters")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if seen & set(ids):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clears every parameter's gradient: ``None`` (the default, as torch), or
        zeros in place with ``set_to_none=False``. Local: which gradients it
        cleared is checked by the next :meth:`step`'s agreement, so a rank that
        cleared others (or skipped the call) raises there, on every rank, before
        any parameter is updated.

        Example: ``opt.zero_grad()`` before the next backward.
        """
        cleared = []
        for group in self.param_groups:
            for p in group["params"]:
                cleared.append(p.grad is not None)
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad._data()[...] = 0
        self._zeroed = fingerprint((self._zeroed, bool(set_to_none), bytes(cleared)))

    def step(self, closure: Callable | None = None):
        """One update of every parameter that has a gradient; returns what
        ``closure`` (re-evaluating the loss, run with grad mode on) returns, or
        None. Collective on the parameters' meshes: a gradient that backward left in
        other placements than its parameter (Partial, as torch's) is moved to
        them, once, and nothing else moves. Before
        any update the ranks agree, in one all-reduce of three int64 per mesh,
        that they hold the same parameter groups (each parameter's shape, dtype,
        placements and mesh, and the hyperparameters), that the same parameters
        have a gradient, in the same placements, and that they made the same ``zero_grad`` calls since
        the last step; otherwise every rank raises the same ValueError and
        nothing is updated.

        Example: ``loss.backward(); opt.step(); opt.zero_grad()``.
        """
        # Read by a learning-rate scheduler, which warns when it steps first.
        self._opt_called = True
        loss = None
        if closure is not None:
            with enable_grad():
                loss = closure()
        self._agree_on_step()
        for group in self.param_groups:
            for p in group["params"]:
                g = local_grad(p)
                if g is not None:
                    self._update(p, g, self.state[p], group)
        return loss

    def _update(self, p: DTensor, g: np.ndarray, state: dict, group: dict) -> None:
        raise NotImplementedError(f"{type(self).__name__} defines no update")

    def _group_layout(self, i: int, group: dict) -> tuple:
        """(the fingerprint of group ``i``'s hyperparameters and its parameters'
        layouts, the distinct meshes of its parameters), recomputed only when the
        hyperparameters, the parameters or their specs changed since the last
        step: a step pays a few attribute reads per parameter."""
        params = group["params"]
        specs = [p._spec for p in params]
        hyper = _hyper(group)
        hit = self._layouts.get(i)
        if hit is not None and hit[1] == hyper and len(hit[0]) == len(specs) and all(
                a is b for a, b in zip(hit[0], specs)):
            return hit[2], hit[3]
        meshes: list = []
        for p in params:
            if not any(m is p.device_mesh or _same_ranks(m, p.device_mesh) for m in meshes):
                meshes.append(p.device_mesh)
        fp = fingerprint((hyper, [_param_layout(p) for p in params]))
        self._layouts[i] = (specs, hyper, fp, meshes)
        return fp, meshes

    def _agree_on_step(self) -> None:
        """The step's agreement (see :meth:`step`): one `_comm.agree` per mesh of the
        parameters (meshes of the same ranks once), the zero_grad record reset
        after it whatever its outcome, so that the next step starts afresh."""
        for i in [i for i in self._layouts if i >= len(self.param_groups)]:
            del self._layouts[i]  # groups replaced by fewer: keep one entry a group
        parts, meshes = [self._zeroed], []
        for i, group in enumerate(self.param_groups):
            fp, group_meshes = self._group_layout(i, group)
            parts.append(fp)
            grads = [p.grad for p in group["params"]]
            parts.append(bytes([g is not None for g in grads]))
            parts.append(tuple(_grad_layout(p, g) for p, g in zip(group["params"], grads)))
            for mesh in group_meshes:
                if not any(m is mesh or _same_ranks(m, mesh) for m in meshes):
                    meshes.append(mesh)
        mine, error = fingerprint(parts), None
        self._zeroed = 0
        for mesh in meshes:
            try:
                _comm.agree(mesh, error is None, mine, error or _STEP_MISMATCH,
                         ValueError)
            except ValueError as agreed:  # the same on every rank of that mesh
                # Carried to the other meshes, so that no rank of those waits.
                error = str(agreed)
        if error is not None:
            raise ValueError(error)

    # -- state -------------------------------------------------------------------
    def state_dict(self) -> dict:
        """The optimizer's state in torch's format: ``"state"`` maps each
        parameter's index (in the order of the groups) to its state (DTensors with
        the parameter's placements, and ``"step"``), ``"param_groups"`` lists each
        group's hyperparameters with ``"params"`` as indices. The tensors are the
        optimizer's own, not copies. ``mpitensor.save`` writes it (nested dicts
        included) and ``load_state_dict`` takes it back, on any mesh. Local.

        Example::

            >>> mpitensor.save({"model": model.state_dict(), "optim": opt.state_dict()},
            ...                "ckpt")
        """
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            packed = {k: v for k, v in group.items() if k != "params"}
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            packed["params"] = [index[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index[id(p)]: dict(s) for p, s in self.state.items()
                 if id(p) in index and s}
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: dict) -> None:
        """Takes back what :meth:`state_dict` gave, also after ``mpitensor.load``
        on another mesh: each state tensor (a DTensor in any layout, or the global
        ndarray) is copied into a DTensor with its parameter's mesh and placements.
        The groups must hold as many parameters as the optimizer's and each state
        tensor must have its parameter's shape, and every rank must load the same
        hyperparameters, steps and layouts: every rank checks, then the ranks agree
        once on each mesh of the parameters and state (ValueError, the same on
        every rank). Collective on those meshes (and on a state DTensor's mesh
        when it has to move, as :meth:`Module.load_state_dict`).

        Example::

            >>> opt.load_state_dict(mpitensor.load("ckpt")["optim"])
        """
        groups = state_dict["param_groups"]
        saved = list(state_dict["state"].items()) if state_dict.get("state") else []
        errors, by_index = [], {}
        if len(groups) != len(self.param_groups):
            errors.append("loaded state dict has a different number of parameter groups")
        elif any(len(g["params"]) != len(own["params"])
                 for g, own in zip(groups, self.param_groups)):
            errors.append("loaded state dict contains a parameter group that doesn't "
                          "match the size of optimizer's group")
        else:
            for g, own in zip(groups, self.param_groups):
                for i, p in zip(g["params"], own["params"]):
                    by_index[int(i)] = p
        meshes = [p.device_mesh for own in self.param_groups for p in own["params"]]
        # The hyperparameters and the steps count too: a rank that loads another
        # lr or step would update a Replicate parameter differently from the next
        # step on.
        layout: list = [("param_groups", [_hyper(g) for g in groups])]
        for i, entries in saved:
            p = by_index.get(int(i))
            if p is None and not errors:
                errors.append(f"loaded state dict has state for parameter {i}, which "
                              f"no group names")
            for key, value in entries.items():
                name = f"state.{i}.{key}"
                if isinstance(value, DTensor):
                    meshes.append(value.device_mesh)
                    layout.append((name, _load_layout(value)))
                if not _is_state_tensor(key, value):
                    layout.append((name, _plain(value)))
                problem = (_load_problem(name, p, value)
                           if p is not None and _is_state_tensor(key, value) else None)
                if problem is not None:
                    errors.append(problem)
        # Checked on every rank, then agreed on, before any state moves: a rank
        # raising alone would leave the others in the next state tensor's
        # redistribution.
        _agree_load(meshes, errors, layout, "", ValueError,  # torch's bare wording
                    "the loaded state dict differs across the ranks of the mesh (its "
                    "hyperparameters such as lr, its steps, or its DTensors' keys, "
                    "shapes, dtypes or placements); every rank must load the same state")
        state: defaultdict = defaultdict(dict)
        for i, entries in saved:
            p = by_index[int(i)]
            state[p] = {key: self._state_value(p, f"state.{i}.{key}", key, value)
                        for key, value in entries.items()}
        new_groups = []
        for g, own in zip(groups, self.param_groups):
            group = copy.deepcopy({k: v for k, v in g.items() if k != "params"})
            group["params"] = own["params"]
            new_groups.append(group)
        self.state, self.param_groups = state, new_groups

    @staticmethod
    def _state_value(p: DTensor, name: str, key: str, value) -> Any:
        if isinstance(value, DTensor) and value.shape == () and key == "step":
            value = value.full_tensor()
        if not _is_state_tensor(key, value):
            return float(value) if key == "step" else copy.deepcopy(value)
        target = zeros_like_param(p)
        Module._load_one(name, target, value)
        return target

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            lines += [f"    {k}: {v}" for k, v in sorted(group.items()) if k != "params"]
        return "\n".join(lines) + "\n)"
