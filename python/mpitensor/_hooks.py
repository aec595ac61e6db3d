"""The handle every ``register_*hook`` returns (torch.utils.hooks.RemovableHandle).

It lives on the ground floor because DTensor's ``register_hook`` returns one, and
nn.Module's hooks return the same class.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

__all__ = ["RemovableHandle", "add_hook"]


class RemovableHandle:
    """What a ``register_*hook`` call returns: ``handle.remove()`` takes the hook
    out again; also a context manager that removes it on exit. Local.

    Example: ``with m.register_forward_hook(hook): m(x)`` runs ``hook`` once.
    """

    _ids = itertools.count()

    def __init__(self, hooks: OrderedDict):
        self._hooks = hooks
        self.id = next(RemovableHandle._ids)

    def remove(self) -> None:
        """Takes the hook out; removing twice is harmless. Local.

        Example: ``h = m.register_forward_hook(hook); h.remove()``.
        """
        self._hooks.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def add_hook(table: OrderedDict, entry, prepend: bool = False) -> RemovableHandle:
    """Adds ``entry`` to ``table`` (last, or first with ``prepend``) under a new
    handle's id and returns the handle."""
    handle = RemovableHandle(table)
    table[handle.id] = entry
    if prepend:
        table.move_to_end(handle.id, last=False)
    return handle
