"""Module: torch.nn.Module's shape for NumPy arrays and DTensors.

A module holds parameters and buffers (ndarrays or DTensors) and child modules as
attributes, and runs ``forward`` when called, between its forward pre-hooks and
forward hooks. Hooks are the one place where the parallel styles (and tracing
tools such as a module-level CommDebugMode) plug in: ``distribute_module``
installs its ``input_fn`` as a pre-hook and its ``output_fn`` as a hook.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from typing import Any, Callable, Iterator

import numpy as np

from .. import _dtypes
from .._dtensor import DTensor
from .._hooks import RemovableHandle, add_hook
from .._layout import compute_local_shape_and_global_offset
from ._backward_hook import BackwardHook
from ._state_load import _agree_load, _load_layout, _load_problem, _same_ranks

__all__ = ["Module", "Parameter", "RemovableHandle", "register_module_forward_pre_hook",
           "register_module_forward_hook", "register_module_full_backward_pre_hook",
           "register_module_full_backward_hook"]

# Hooks that run around every module's forward (before the module's own), for
# tools that trace whole models, such as a module-level CommDebugMode; and in every
# module's backward, before the module's own, as torch's global backward hooks.
_global_forward_pre_hooks: OrderedDict = OrderedDict()
_global_forward_hooks: OrderedDict = OrderedDict()
_global_backward_pre_hooks: OrderedDict = OrderedDict()
_global_backward_hooks: OrderedDict = OrderedDict()


def register_module_forward_pre_hook(hook: Callable) -> "RemovableHandle":
    """Run ``hook(module, args)`` before every module's forward, as torch's global
    hook of the same name (a non-None result replaces the inputs). Local.

    Example::

        >>> h = register_module_forward_pre_hook(lambda m, args: print(type(m).__name__))
        >>> h.remove()
    """
    return Module._add_hook(_global_forward_pre_hooks, hook, False, False)


def register_module_forward_hook(hook: Callable) -> "RemovableHandle":
    """Run ``hook(module, args, output)`` after every module's forward (a non-None
    result replaces the output). Local.

    Example: ``h = register_module_forward_hook(lambda m, args, out: print(type(m)))``,
    later ``h.remove()``.
    """
    return Module._add_hook(_global_forward_hooks, hook, False, False)


def register_module_full_backward_pre_hook(hook: Callable) -> "RemovableHandle":
    """Run ``hook(module, grad_output)`` in every module's backward, before the
    module's own backward pre-hooks (see :meth:`Module.register_full_backward_pre_hook`).
    Local to register; collective in the backward as the module's own.

    Example: ``h = register_module_full_backward_pre_hook(lambda m, go: print(type(m)))``,
    later ``h.remove()``.
    """
    return Module._add_hook(_global_backward_pre_hooks, hook, False, False)


def register_module_full_backward_hook(hook: Callable) -> "RemovableHandle":
    """Run ``hook(module, grad_input, grad_output)`` in every module's backward,
    before the module's own full backward hooks (see
    :meth:`Module.register_full_backward_hook`). Local to register; collective in
    the backward as the module's own.

    Example: ``h = register_module_full_backward_hook(lambda m, gi, go: None)``, later
    ``h.remove()``.
    """
    return Module._add_hook(_global_backward_hooks, hook, False, False)


class Parameter:
    """Marks an array or DTensor as a parameter when assigned to a module attribute:
    ``self.weight = Parameter(np.zeros((4, 4)))``. The module stores the array
    itself (reading ``self.weight`` gives the ndarray or DTensor back). A
    floating-point DTensor parameter is a leaf that requires grad, as torch's
    nn.Parameter, unless ``requires_grad=False``. Local.

    Example::

        >>> m = Module(); m.w = Parameter(np.ones(3)); [n for n, _ in m.named_parameters()]
        ['w']
    """

    __slots__ = ("data", "requires_grad")

    def __init__(self, data, requires_grad: bool = True):
        self.data = data
        self.requires_grad = bool(requires_grad)

    def __repr__(self) -> str:
        return f"Parameter({self.data!r})"


def _is_tensor(value) -> bool:
    return isinstance(value, (np.ndarray, DTensor))


def _on_mesh(dt, mesh):
    """``dt`` relabelled onto ``mesh`` (same ranks, same shape): no data moves."""
    if dt.device_mesh == mesh:
        return dt
    return DTensor(dt.to_local(), dt._spec._replace(mesh=mesh))


def _as_parameter(value, old, requires_grad):
    """``value`` as a parameter: a floating-point DTensor is a leaf (detached if it
    was computed) that requires grad, as torch's nn.Parameter, unless
    ``requires_grad`` says otherwise or (``requires_grad`` None) it replaces a
    DTensor parameter that did not: a frozen parameter stays frozen when a
    parallel style or fully_shard puts it in new placements."""
    if type(value) is not DTensor or not _dtypes.is_inexact(value.dtype):
        return value
    if requires_grad is None:
        requires_grad = old._requires_grad if type(old) is DTensor else True
    if value.grad_fn is not None:
        value = value.detach()
    if value._requires_grad != requires_grad:
        value.requires_grad_(requires_grad)
    return value


# torch's device names: a str argument of Module.to that is one is a device.
_DEVICES = frozenset({"cpu", "cuda", "mps", "meta", "xpu", "hpu", "xla", "mtia"})


def _cast(value, dtype: np.dtype):
    """``value`` in ``dtype`` if it is floating point: an ndarray is replaced, a
    DTensor keeps its identity (its local data and spec change) and its gradient
    is cast alike."""
    if not _dtypes.is_inexact(value.dtype) or value.dtype == dtype:
        return value
    if isinstance(value, np.ndarray):
        return value.astype(dtype)
    value._local_tensor = value._data().astype(dtype)
    value._spec = value._spec._replace(dtype=dtype)
    if value.grad is not None:
        _cast(value.grad, dtype)
    return value


class Module:
    """Base class of every layer, as torch.nn.Module.

    Assigning a :class:`Parameter` registers a parameter, a Module registers a child;
    ``register_buffer`` registers a buffer. Calling the module runs the forward
    pre-hooks, ``forward`` and the forward hooks. Local unless ``forward`` or a hook
    communicates (DTensor parameters and inputs make it collective on their mesh).

    Example::

        >>> class Affine(Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.w = Parameter(np.ones(3))
        ...     def forward(self, x):
        ...         return x * self.w
        >>> Affine()(np.arange(3.0))
        array([0., 1., 2.])
    """

    training: bool

    def __init__(self) -> None:
        d = self.__dict__
        d["training"] = True
        d["_parameters"] = OrderedDict()
        d["_buffers"] = OrderedDict()
        d["_modules"] = OrderedDict()
        d["_forward_pre_hooks"] = OrderedDict()
        d["_forward_hooks"] = OrderedDict()
        d["_backward_pre_hooks"] = OrderedDict()
        d["_backward_hooks"] = OrderedDict()

    # -- attributes ------------------------------------------------------------------
    def __setattr__(self, name: str, value) -> None:
        d = self.__dict__
        if "_parameters" not in d:
            raise AttributeError(
                f"cannot assign {name!r} before Module.__init__() call "
                f"(call super().__init__() first in {type(self).__name__}.__init__)"
            )
        if isinstance(value, Parameter):
            self.register_parameter(name, value)
        elif isinstance(value, Module):
            self.register_module(name, value)
        elif name in d["_parameters"]:
            self._check_slot("parameter", name, value)
            d["_parameters"][name] = _as_parameter(value, d["_parameters"][name], None)
        elif name in d["_buffers"]:
            self._check_slot("buffer", name, value)
            d["_buffers"][name] = value
        elif name in d["_modules"]:
            if value is not None:
                raise TypeError(f"cannot assign {type(value).__name__} as child module "
                                f"{name!r} (a Module or None is expected)")
            d["_modules"][name] = None
        else:
            object.__setattr__(self, name, value)

    @staticmethod
    def _check_slot(kind: str, name: str, value) -> None:
        if value is not None and not _is_tensor(value):
            raise TypeError(f"cannot assign {type(value).__name__} as {kind} {name!r} "
                            f"(an ndarray, a DTensor or None is expected)")

    def _forget(self, name: str) -> None:
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            d[table].pop(name, None)
        d.pop(name, None)

    def __getattr__(self, name: str):
        # Called only when normal lookup fails: parameters, buffers and children.
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if table in d and name in d[table]:
                return d[table][name]
        raise AttributeError(f"'{type(self).__name__}' object has no attribute '{name}'")

    def __delattr__(self, name: str) -> None:
        d = self.__dict__
        for table in ("_parameters", "_buffers", "_modules"):
            if name in d[table]:
                del d[table][name]
                return
        object.__delattr__(self, name)

    def register_parameter(self, name: str, param) -> None:
        """Add (or replace) parameter ``name``: an ndarray, a DTensor, a
        :class:`Parameter` or None. Local.

        Example: ``m.register_parameter("scale", np.ones(4))``, then ``m.scale``.
        """
        self._check_name(name, "parameter")
        flag = None
        if isinstance(param, Parameter):
            param, flag = param.data, param.requires_grad
        self._check_slot("parameter", name, param)
        old = self._parameters.get(name)
        if name not in self._parameters:  # replacing keeps the registration order
            self._forget(name)
        self.__dict__["_parameters"][name] = _as_parameter(param, old, flag)

    def register_buffer(self, name: str, tensor, persistent: bool = True) -> None:
        """Add (or replace) buffer ``name`` (state that is not a parameter, such as
        a mask). All buffers are saved by ``state_dict``. Local.

        Example: ``m.register_buffer("mask", np.tril(np.ones((4, 4))))``.
        """
        self._check_name(name, "buffer")
        self._check_slot("buffer", name, tensor)
        if name not in self._buffers:
            self._forget(name)
        self.__dict__["_buffers"][name] = tensor

    def register_module(self, name: str, module: "Module | None") -> None:
        """Add (or replace) child module ``name``. Local.

        Example: ``m.register_module("proj", Linear(4, 4))``, then ``m.proj``.
        """
        self._check_name(name, "module")
        if module is not None and not isinstance(module, Module):
            raise TypeError(f"{type(module).__name__} is not a Module subclass")
        if name not in self._modules:
            self._forget(name)
        self.__dict__["_modules"][name] = module

    add_module = register_module

    @staticmethod
    def _check_name(name, kind) -> None:
        if not isinstance(name, str) or not name or "." in name:
            raise KeyError(f"{kind} name must be a non-empty string without '.', got {name!r}")

    # -- traversal -------------------------------------------------------------------
    def named_children(self) -> Iterator[tuple[str, "Module"]]:
        """Direct children as (name, module), in registration order. Local.

        Example: ``[n for n, _ in Sequential(Linear(2, 2), ReLU()).named_children()]``
        is ``['0', '1']``.
        """
        for name, m in self._modules.items():
            if m is not None:
                yield name, m

    def children(self) -> Iterator["Module"]:
        """The direct children, in registration order. Local.

        Example: ``len(list(Sequential(Linear(2, 2), ReLU()).children())) == 2``.
        """
        for _, m in self.named_children():
            yield m

    def named_modules(self, memo=None, prefix: str = "") -> Iterator[tuple[str, "Module"]]:
        """This module (name ``""``) and every descendant, each once, by dotted path.
        Local.

        Example::

            >>> [n for n, _ in Sequential(Linear(2, 2), ReLU()).named_modules()]
            ['', '0', '1']
        """
        memo = set() if memo is None else memo
        if id(self) in memo:
            return
        memo.add(id(self))
        yield prefix, self
        for name, m in self.named_children():
            yield from m.named_modules(memo, f"{prefix}.{name}" if prefix else name)

    def modules(self) -> Iterator["Module"]:
        """This module and every descendant, each once. Local.

        Example: ``len(list(Sequential(Linear(2, 2), ReLU()).modules())) == 3``.
        """
        for _, m in self.named_modules():
            yield m

    def _named_members(self, table: str, prefix: str, recurse: bool):
        seen = set()
        mods = self.named_modules(prefix=prefix) if recurse else [(prefix, self)]
        for mod_prefix, m in mods:
            for name, value in getattr(m, table).items():
                if value is None or id(value) in seen:
                    continue
                seen.add(id(value))
                yield (f"{mod_prefix}.{name}" if mod_prefix else name), value

    def named_parameters(self, prefix: str = "", recurse: bool = True):
        """(dotted name, parameter) for every parameter, shared ones once. Local.

        Example: ``[n for n, _ in Sequential(Linear(2, 2)).named_parameters()]`` is
        ``['0.weight', '0.bias']``.
        """
        return self._named_members("_parameters", prefix, recurse)

    def parameters(self, recurse: bool = True):
        """Every parameter (ndarray or DTensor), shared ones once. Local.

        Example: ``sum(p.size for p in Linear(2, 3).parameters()) == 9``.
        """
        for _, p in self.named_parameters(recurse=recurse):
            yield p

    def named_buffers(self, prefix: str = "", recurse: bool = True):
        """(dotted name, buffer) for every buffer. Local.

        Example: ``dict(m.named_buffers())["mask"]`` after
        ``m.register_buffer("mask", ...)``.
        """
        return self._named_members("_buffers", prefix, recurse)

    def buffers(self, recurse: bool = True):
        """Every buffer. Local.

        Example: ``list(Linear(2, 2).buffers()) == []``.
        """
        for _, b in self.named_buffers(recurse=recurse):
            yield b

    def get_submodule(self, target: str) -> "Module":
        """The descendant at dotted path ``target`` (``""`` is this module). Local.

        Example: ``model.get_submodule("layers.0.attention.q_proj")``.
        """
        m = self
        for atom in target.split(".") if target else []:
            if atom not in m._modules or m._modules[atom] is None:
                raise AttributeError(f"{type(m).__name__} has no submodule {atom!r} "
                                     f"(looking up {target!r})")
            m = m._modules[atom]
        return m

    # -- state -----------------------------------------------------------------------
    def state_dict(self, prefix: str = "") -> "OrderedDict[str, Any]":
        """Every parameter and buffer by dotted name (the objects themselves, not
        copies: ndarrays or DTensors). Local.

        Example::

            >>> list(Linear(2, 3).state_dict())
            ['weight', 'bias']
        """
        out: OrderedDict = OrderedDict()
        for mod_prefix, m in self.named_modules(prefix=prefix):
            for table in (m._parameters, m._buffers):
                for name, value in table.items():
                    if value is not None:
                        out[f"{mod_prefix}.{name}" if mod_prefix else name] = value
        return out

    def load_state_dict(self, state_dict, strict: bool = True):
        """Copy values into the parameters and buffers of the same names, each
        keeping its own placements.

        A plain array loads into a DTensor parameter as the global value: each rank
        keeps its own shard (local; every rank must pass the same array). A DTensor
        in any placements loads into a DTensor parameter by redistribution to the
        parameter's placements (collective on its mesh); one on another mesh (such
        as what ``mpitensor.load(dir)`` returns on its default mesh) is gathered
        whole first (collective on its mesh: ``mpitensor.load(dir,
        like=model.state_dict())`` reads each rank's box directly instead). A
        DTensor into a plain array parameter is gathered. Every rank checks its
        state dict first (missing or unexpected keys with ``strict``, shapes,
        dtypes that cannot be cast), then the ranks agree once on each mesh
        involved (no communication when nothing is distributed), so a problem on
        one rank only is a RuntimeError, in torch's words, on every rank. Returns
        ``(missing_keys, unexpected_keys)``.

        Example::

            >>> sd = mpitensor.load("ckpt")             # saved with another plan
            >>> model.load_state_dict(sd)
            ([], [])
        """
        own = self.state_dict()
        missing = [k for k in own if k not in state_dict]
        unexpected = [k for k in state_dict if k not in own]
        errors = []
        if strict and missing:
            errors.append("Missing key(s) in state_dict: "
                          + ", ".join(f'"{k}"' for k in missing) + ". ")
        if strict and unexpected:
            errors.append("Unexpected key(s) in state_dict: "
                          + ", ".join(f'"{k}"' for k in unexpected) + ". ")
        meshes, layout = [], []
        for key, target in own.items():
            if isinstance(target, DTensor):
                meshes.append(target.device_mesh)
            if key in state_dict:
                value = state_dict[key]
                problem = _load_problem(key, target, value)
                if problem is not None:
                    errors.append(problem)
                if isinstance(value, DTensor):
                    meshes.append(value.device_mesh)
                    layout.append((key, _load_layout(value)))
        _agree_load(meshes, errors, layout,
                    f"Error(s) in loading state_dict for {type(self).__name__}:\n\t",
                    RuntimeError)
        for key, target in own.items():
            if key in state_dict:
                self._load_one(key, target, state_dict[key])
        return missing, unexpected

    @staticmethod
    def _load_one(key: str, target, value) -> None:
        # Loading writes data: no autograd on either side (torch loads under no_grad).
        if isinstance(value, DTensor):
            value = value.detach()
        if isinstance(target, DTensor):
            target = target.detach()
        # _load_problem(key, target, value) is None: checked and agreed on before.
        if not isinstance(target, DTensor):
            src = value.full_tensor() if isinstance(value, DTensor) else np.asarray(value)
            np.copyto(target, src, casting="same_kind")
            return
        mesh = target.device_mesh
        if isinstance(value, DTensor) and _same_ranks(value.device_mesh, mesh):
            value = _on_mesh(value, mesh)
            local = value.redistribute(mesh, target.placements).to_local()
        else:
            whole = value.full_tensor() if isinstance(value, DTensor) else np.asarray(value)
            shape, offset = compute_local_shape_and_global_offset(
                target.shape, mesh, target.placements)
            local = whole[tuple(slice(o, o + s) for o, s in zip(offset, shape))]
        np.copyto(target.to_local(), local, casting="same_kind")

    # -- modes -----------------------------------------------------------------------
    def train(self, mode: bool = True) -> "Module":
        """Training mode for this module and its descendants (Dropout drops). Local.

        Example: ``model.train()`` before training steps; returns ``model``.
        """
        for m in self.modules():
            m.__dict__["training"] = bool(mode)
        return self

    def eval(self) -> "Module":
        """Evaluation mode (Dropout is the identity). Local.

        Example: ``model.eval()`` before checking outputs; returns ``model``.
        """
        return self.train(False)

    # -- dtype and device -----------------------------------------------------------
    def to(self, *args, dtype=None, device=None) -> "Module":
        """Casts every floating-point parameter and buffer (and gradient) to
        ``dtype``, as torch's ``Module.to``; returns this module. A DTensor stays
        the same object with the same placements and ``requires_grad`` (its data
        is replaced, as torch's ``param.data = ...``), so build optimizers after
        casting; an ndarray is replaced by its cast. Integer and bool tensors are
        kept. ``"cpu"`` is the only device: NumPy arrays live there already.
        Local: every rank casts its own shards.

        Example::

            >>> model.to(np.float32)          # also model.float(); model.to("cpu")
            >>> next(model.parameters()).dtype
            dtype('float32')
        """
        for arg in args:
            if isinstance(arg, str) and arg.split(":")[0] in _DEVICES:
                device = arg
            elif dtype is None:
                dtype = arg
            else:
                raise TypeError(f"Module.to() got an unexpected argument {arg!r}")
        if device is not None and str(device).split(":")[0] != "cpu":
            raise ValueError(f"mpitensor modules live on 'cpu', not {device!r}")
        if dtype is None:
            return self
        dtype = _dtypes.as_dtype(dtype)
        if not _dtypes.is_inexact(dtype):
            raise TypeError(f"Module.to only accepts floating point or complex dtypes, "
                            f"but got desired dtype={dtype}")
        seen: set = set()
        for m in self.modules():
            for table in (m._parameters, m._buffers):
                for name, value in table.items():
                    if value is not None and id(value) not in seen:
                        seen.add(id(value))
                        table[name] = _cast(value, dtype)
        return self

    def float(self) -> "Module":
        """Casts floating-point parameters and buffers to float32. Local.

        Example: ``model.float()``.
        """
        return self.to(np.float32)

    def double(self) -> "Module":
        """Casts floating-point parameters and buffers to float64. Local.

        Example: ``model.double()``.
        """
        return self.to(np.float64)

    # -- hooks and calling -------------------------------------------------------------
    def register_forward_pre_hook(self, hook: Callable, *, prepend: bool = False,
                                  with_kwargs: bool = False) -> RemovableHandle:
        """Run ``hook(module, args)`` before ``forward``; a non-None result replaces
        the positional inputs (a non-tuple is wrapped in a 1-tuple). With
        ``with_kwargs=True`` it is ``hook(module, args, kwargs)`` returning None or
        ``(args, kwargs)``. Local.

        Example::

            >>> h = m.register_forward_pre_hook(lambda mod, args: (args[0] * 2,))
            >>> h.remove()
        """
        return self._add_hook(self._forward_pre_hooks, hook, with_kwargs, prepend)

    def register_forward_hook(self, hook: Callable, *, prepend: bool = False,
                              with_kwargs: bool = False, always_call: bool = False
                              ) -> RemovableHandle:
        """Run ``hook(module, args, output)`` after ``forward``; a non-None result
        replaces the output. With ``with_kwargs=True`` it is
        ``hook(module, args, kwargs, output)``. With ``always_call=True`` it also
        runs (with ``output`` None) when ``forward`` or an earlier hook raised; an
        exception of its own is then a warning, as torch's. Local.

        Example: ``h = m.register_forward_hook(lambda mod, args, out: out * 2)``.
        """
        handle = self._add_hook(self._forward_hooks, hook, with_kwargs, prepend)
        if always_call:
            self.__dict__.setdefault("_forward_hooks_always_called", set()).add(handle.id)
        return handle

    def register_full_backward_pre_hook(self, hook: Callable, prepend: bool = False
                                        ) -> RemovableHandle:
        """Run ``hook(module, grad_output)`` in the backward, once the gradients of
        this call's outputs are known and before they go into the module; a
        non-None result (a tuple as long) replaces ``grad_output``. Entries are
        DTensors, or None for an output that is not a DTensor or got no gradient.
        Hooks of a module called inside another fire in torch's order (the
        backward's: the outer module's pre-hook first). Registering is local; in the
        backward each call is agreed on across the outputs' mesh, so a hook that
        raises on one rank raises on every rank.

        Example::

            >>> h = m.register_full_backward_pre_hook(lambda mod, go: (go[0] * 0.5,))
            >>> m(x).sum().backward()     # the gradient into m is halved
            >>> h.remove()
        """
        return self._add_hook(self._backward_pre_hooks, hook, False, prepend)

    def register_full_backward_hook(self, hook: Callable, prepend: bool = False
                                    ) -> RemovableHandle:
        """Run ``hook(module, grad_input, grad_output)`` in the backward, once the
        gradients of this call's positional inputs are known; a non-None result
        (a tuple as long) replaces ``grad_input``. ``grad_input`` holds a DTensor
        per positional input that requires grad (None for the others); when no
        input requires grad, the hook fires with the outputs' gradients and must
        return None. As torch's: collective in the backward as
        :meth:`register_full_backward_pre_hook`.

        Example::

            >>> grads = []
            >>> h = m.register_full_backward_hook(lambda mod, gi, go: grads.append(gi))
            >>> m(x).sum().backward()     # grads[0] == (x's gradient,)
            >>> h.remove()
        """
        return self._add_hook(self._backward_hooks, hook, False, prepend)

    @staticmethod
    def _add_hook(table: OrderedDict, hook, with_kwargs: bool, prepend: bool):
        if not callable(hook):
            raise TypeError(f"a hook must be callable, got {type(hook).__name__}")
        return add_hook(table, (hook, bool(with_kwargs)), prepend)

    def _backward_hook(self):
        """The BackwardHook for one call, or None when the module has no backward
        hooks (also for a module made before they existed, unpickled say)."""
        d = self.__dict__
        hooks = [*_global_backward_hooks.values(), *d.get("_backward_hooks", {}).values()]
        pre = [*_global_backward_pre_hooks.values(),
               *d.get("_backward_pre_hooks", {}).values()]
        if not hooks and not pre:
            return None
        return BackwardHook(self, [h for h, _ in hooks], [h for h, _ in pre])

    def __call__(self, *args, **kwargs):
        called = set()  # the always-called forward hooks that ran
        try:
            return self._call(args, kwargs, called)
        except Exception:
            always = self.__dict__.get("_forward_hooks_always_called")
            if always:
                self._run_always_called(args, kwargs, always - called)
            raise

    def _run_always_called(self, args, kwargs, ids) -> None:
        """The forward hooks registered with ``always_call=True`` that did not run
        before the call raised; their own errors are warnings (torch's)."""
        for hid, (hook, with_kwargs) in list(self._forward_hooks.items()):
            if hid not in ids:
                continue
            try:
                if with_kwargs:
                    hook(self, args, kwargs, None)
                else:
                    hook(self, args, None)
            except Exception as e:  # noqa: BLE001 - the call's own error is raised
                warnings.warn("module forward hook with ``always_call=True`` raised an "
                              "exception that was silenced as another error was raised "
                              f"in forward: {e}", stacklevel=3)

    def _call(self, args, kwargs, called: set):
        pre = self._forward_pre_hooks
        if _global_forward_pre_hooks:
            pre = OrderedDict(list(_global_forward_pre_hooks.items()) + list(pre.items()))
        for hook, with_kwargs in list(pre.values()):
            if with_kwargs:
                result = hook(self, args, kwargs)
                if result is not None:
                    if not (isinstance(result, tuple) and len(result) == 2):
                        raise RuntimeError("forward pre-hook must return None or a tuple "
                                           f"of (new_args, new_kwargs), but got {result}.")
                    args, kwargs = result
            else:
                result = hook(self, args)
                if result is not None:
                    args = result if isinstance(result, tuple) else (result,)
        backward_hook = self._backward_hook()
        if backward_hook is not None:
            args = backward_hook.setup_input_hook(args)
        output = self.forward(*args, **kwargs)
        post = self._forward_hooks
        if _global_forward_hooks:
            post = OrderedDict(list(_global_forward_hooks.items()) + list(post.items()))
        for hid, (hook, with_kwargs) in list(post.items()):
            called.add(hid)
            result = hook(self, args, kwargs, output) if with_kwargs else hook(self, args, output)
            if result is not None:
                output = result
        if backward_hook is not None:
            if not isinstance(output, (DTensor, tuple)):
                warnings.warn("For backward hooks to be called, module output should be a "
                              f"DTensor or a tuple of DTensors but received {type(output)}",
                              stacklevel=2)
            output = backward_hook.setup_output_hook(output)
        return output

    def forward(self, *args, **kwargs):
        """The computation; subclasses define it, callers call the module (which
        runs the hooks around ``forward``). Local unless the module is
        parallelized: then collective on the mesh of its DTensor parameters.

        Example: ``Linear(2, 3)(np.ones((4, 2))).shape == (4, 3)``.
        """
        raise NotImplementedError(f"{type(self).__name__} has no forward()")

    # -- printing ----------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The text inside the parentheses of this module's ``repr``. Local.

        Example: ``Linear(2, 3).extra_repr()`` names its in and out features.
        """
        return ""

    def __repr__(self) -> str:
        lines = []
        for name, m in self._modules.items():
            child = repr(m).replace("\n", "\n  ")
            lines.append(f"({name}): {child}")
        head = f"{type(self).__name__}({self.extra_repr()}"
        if not lines:
            return head + ")"
        return head + "\n  " + "\n  ".join(lines) + "\n)"
