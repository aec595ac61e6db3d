"""Which module is running: the module half of CommDebugMode.

Attaches to modules through the small part of the torch ``nn.Module`` interface
that ``mpitensor.nn`` mirrors, and nothing else:

* ``named_modules()`` -> iterable of ``(name, module)``, the module itself first
  with name ``""`` (gives every submodule its FQN);
* ``named_parameters(recurse=False)`` -> iterable of ``(name, parameter)``, where a
  parameter is a DTensor, an ndarray, or has either as ``.data`` (optional: a
  module without the method has no parameters listed);
* ``register_forward_pre_hook(hook)``, called as ``hook(module, args)`` before
  ``forward``, and ``register_forward_hook(hook)``, called as
  ``hook(module, args, output)`` after it; each returns a handle with ``remove()``.

FQNs are torch's: the root module is named after its class (``MLP``), its
submodules ``MLP.net1``, and what runs outside every tracked module is ``Global``.
"""

from __future__ import annotations

from .._api import DTensor


class ModuleTracker:
    """Keeps the stack of running modules and what is known about each; the owner
    is told at every module boundary (``on_boundary``) so it can attribute
    collectives to the module that was running."""

    def __init__(self, on_boundary):
        self._on_boundary = on_boundary
        self._roots: list = []
        self._handles: list = []
        self._names: dict = {}  # id(module) -> (module, fqn)
        self.reset()

    def reset(self) -> None:
        """Forgets what ran (entering a CommDebugMode again starts afresh)."""
        self.module_helper_dict: dict = {"Global": {"depth": 0}}
        self.module_parameters_dict: dict = {}
        self.sharding_dict: dict = {}
        self.parent_dict: dict = {}
        self.parent_list: list = ["Global"]

    @property
    def name(self) -> str:
        """The FQN of the innermost running module, ``Global`` outside all."""
        return self.parent_list[-1]

    # -- attaching -------------------------------------------------------------------
    def track(self, module, attached: bool) -> None:
        self._roots.append(module)
        if attached:
            self._attach(module)

    def attach(self) -> None:
        for module in self._roots:
            self._attach(module)

    def _attach(self, root) -> None:
        root_name = self._names.get(id(root), (None, type(root).__name__))[1]
        for sub_name, sub in root.named_modules():
            if id(sub) in self._names:  # tracked already, maybe under another root
                continue
            fqn = f"{root_name}.{sub_name}" if sub_name else root_name
            self._names[id(sub)] = (sub, fqn)
            self._handles.append(sub.register_forward_pre_hook(self._pre_hook))
            self._handles.append(sub.register_forward_hook(self._post_hook))

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._names.clear()

    # -- hooks -----------------------------------------------------------------------
    def _pre_hook(self, module, args) -> None:
        self._on_boundary()
        fqn = self._names[id(module)][1]
        info = self.module_helper_dict.setdefault(fqn, {})
        info["module_type"] = str(type(module)).replace("<", "").replace(">", "")
        info["depth"] = len(self.parent_list)
        self._record_parameters(fqn, module, info)
        children = self.parent_dict.setdefault(self.name, [])
        if fqn not in children:
            children.append(fqn)
        self.parent_list.append(fqn)

    def _post_hook(self, module, args, output) -> None:
        self._on_boundary()
        if len(self.parent_list) > 1 and self.parent_list[-1] == self._names[id(module)][1]:
            self.parent_list.pop()

    def _record_parameters(self, fqn: str, module, info: dict) -> None:
        named = getattr(module, "named_parameters", None)
        if named is None:
            return
        for pname, param in named(recurse=False):
            data = param if isinstance(param, DTensor) else getattr(param, "data", param)
            self.module_parameters_dict.setdefault(fqn, {})[pname] = data
            if isinstance(data, DTensor):
                self.sharding_dict[f"{fqn}.{pname}"] = data.placements
                info.setdefault("parameters", {})[pname] = str(data.placements)
