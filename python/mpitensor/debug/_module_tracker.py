"""Which module is running: the module half of CommDebugMode.

As torch's ``_CommModeModuleTracker``: while attached, global forward hooks of
``mpitensor.nn`` (``register_module_forward_pre_hook``) see every module call, so
``with CommDebugMode(): model(x)`` traces the model without naming it.

FQNs are torch's: a module first seen running is named after its class (``MLP``)
and names its submodules under it (``MLP.net1``); what runs outside every module
is ``Global``. Naming a root up front (``track``) names its tree before anything
runs, so a submodule called on its own is still ``MLP.net1``.

A module leaves the stack in a forward hook that its pre-hook appends for that
call, so the module's own forward hooks (a parallel style's ``output_fn``, such as
RowwiseParallel's all-reduce) run, and are counted, inside it, as in torch.
"""

from __future__ import annotations

import weakref

from .._dtensor import DTensor
from ..nn import Module, register_module_forward_pre_hook


class ModuleTracker:
    """Keeps the stack of running modules and what is known about each; the owner
    is told at every module boundary (``on_boundary``) so it can attribute
    collectives to the module that was running."""

    def __init__(self, on_boundary):
        self._on_boundary = on_boundary
        self._known: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> fqn
        self._seen: weakref.WeakSet = weakref.WeakSet()  # modules whose children are named
        self._handles: list = []
        self._exits: dict = {}  # per-call exit hooks not yet run, by handle id
        self.reset()

    def reset(self) -> None:
        """Forgets what ran (entering a CommDebugMode again starts afresh); the
        names of modules stay."""
        self.module_helper_dict: dict = {"Global": {"depth": 0}}
        self.module_parameters_dict: dict = {}
        self.sharding_dict: dict = {}
        self.parent_dict: dict = {}
        self.parent_list: list = ["Global"]

    @property
    def name(self) -> str:
        """The FQN of the innermost running module, ``Global`` outside all."""
        return self.parent_list[-1]

    # -- names -----------------------------------------------------------------------
    def track(self, module) -> None:
        """Names ``module`` after its class and its submodules under it."""
        if not isinstance(module, Module):
            raise TypeError(f"CommDebugMode traces mpitensor.nn modules, got "
                            f"{type(module).__name__}")
        self.fqn(module)

    def fqn(self, module) -> str:
        if module not in self._known:
            self._known[module] = type(module).__name__
        name = self._known[module]
        if module not in self._seen:
            self._seen.add(module)
            for child_name, child in module.named_children():
                self._known[child] = f"{name}.{child_name}"
                self.fqn(child)
        return name

    # -- attaching -------------------------------------------------------------------
    def attach(self) -> None:
        self._handles.append(register_module_forward_pre_hook(self._pre_hook))

    def detach(self) -> None:
        for handle in self._handles + list(self._exits.values()):
            handle.remove()
        self._handles.clear()
        self._exits.clear()

    # -- hooks -----------------------------------------------------------------------
    def _pre_hook(self, module, args) -> None:
        self._on_boundary()
        fqn = self.fqn(module)
        info = self.module_helper_dict.setdefault(fqn, {})
        info["module_type"] = str(type(module)).replace("<", "").replace(">", "")
        info["depth"] = len(self.parent_list)
        self._record_parameters(fqn, module, info)
        children = self.parent_dict.setdefault(self.name, [])
        if fqn not in children:
            children.append(fqn)
        self.parent_list.append(fqn)
        self._add_exit(module, fqn)

    def _add_exit(self, module, fqn: str) -> None:
        """A forward hook after the module's own, for this call only."""
        handle = None

        def leave(mod, args, output) -> None:
            self._exits.pop(handle.id, None)
            handle.remove()
            self._on_boundary()
            if len(self.parent_list) > 1 and self.parent_list[-1] == fqn:
                self.parent_list.pop()

        handle = module.register_forward_hook(leave)
        self._exits[handle.id] = handle

    def _record_parameters(self, fqn: str, module, info: dict) -> None:
        for pname, param in module.named_parameters(recurse=False):
            self.module_parameters_dict.setdefault(fqn, {})[pname] = param
            if isinstance(param, DTensor):
                self.sharding_dict[f"{fqn}.{pname}"] = param.placements
                info.setdefault("parameters", {})[pname] = str(param.placements)
