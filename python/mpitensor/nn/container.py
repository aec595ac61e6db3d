"""Sequential and ModuleList: children by position."""

from __future__ import annotations

from collections import OrderedDict

from .module import Module

__all__ = ["Sequential", "ModuleList"]


class Sequential(Module):
    """Runs its children in order, each on the previous one's output. Children are
    named "0", "1", ... (or by the keys of an OrderedDict), as torch.

    Construction is local; the forward is whatever its children's are (local, or
    collective on the mesh once they are parallelized).

    Example::

        >>> Sequential(Linear(4, 8), ReLU(), Linear(8, 4))(np.ones((2, 4))).shape
        (2, 4)
    """

    def __init__(self, *args):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for name, m in args[0].items():
                self.register_module(name, m)
        else:
            for i, m in enumerate(args):
                self.register_module(str(i), m)

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, idx):
        items = list(self._modules.values())
        if isinstance(idx, slice):
            return Sequential(*items[idx])
        return items[idx]

    def __iter__(self):
        return iter(self._modules.values())

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input


class ModuleList(Module):
    """A list of modules, registered as children "0", "1", ... (for ``layers.*``
    plan keys). Indexing, ``len``, iteration and ``append``, as torch.

    Construction is local; the forward is whatever its children's are (local, or
    collective on the mesh once they are parallelized).

    Example::

        >>> layers = ModuleList([Linear(4, 4) for _ in range(2)]); len(layers)
        2
    """

    def __init__(self, modules=None):
        super().__init__()
        for m in modules or ():
            self.append(m)

    def append(self, module: Module) -> "ModuleList":
        """Adds ``module`` as the next child. Local.

        Example: ``layers.append(TransformerBlock(16, 4))``.
        """
        self.register_module(str(len(self._modules)), module)
        return self

    def extend(self, modules) -> "ModuleList":
        """Appends each of ``modules``. Local.

        Example: ``layers.extend([Linear(4, 4), ReLU()])``.
        """
        for m in modules:
            self.append(m)
        return self

    def __len__(self) -> int:
        return len(self._modules)

    def __getitem__(self, idx):
        items = list(self._modules.values())
        if isinstance(idx, slice):
            return ModuleList(items[idx])
        return items[idx]

    def __setitem__(self, idx: int, module: Module) -> None:
        names = list(self._modules)
        self.register_module(names[idx], module)

    def __iter__(self):
        return iter(self._modules.values())
