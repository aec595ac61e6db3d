"""Nested state dicts: a dict whose values are dicts, lists or tuples of arrays
and plain values (an optimizer's ``state_dict()``, or ``{"model": ..., "optim":
..., "step": 3}``) saved as the flat entries the directory format holds.

Each array is one entry named by its path, the keys joined by dots
(``optim.state.0.exp_avg``); the structure, with the key types and the plain
values (None, bool, int, float, str), is the index's ``"tree"``. A flat dict of
str keys to arrays has no tree, so its index is what earlier versions wrote.
"""

from __future__ import annotations

import numpy as np

from .._dtensor import DTensor

_PLAIN = (type(None), bool, int, float, str)


def _is_array(value) -> bool:
    return isinstance(value, (DTensor, np.ndarray, np.generic))


def is_flat(obj: dict) -> bool:
    return all(isinstance(k, str) and _is_array(v) for k, v in obj.items())


def flatten(obj: dict):
    """(entries: dotted name -> array, tree or None). ValueError when two paths give
    one name, TypeError for a key or value the format cannot hold. Local."""
    if is_flat(obj):
        return dict(obj), None
    entries: dict = {}

    def walk(value, path):
        if isinstance(value, dict):
            items = []
            for k, v in value.items():
                if isinstance(k, bool) or not isinstance(k, (str, int, np.integer)):
                    raise TypeError(f"a saved dict's keys must be str or int, got "
                                    f"{k!r} at {'.'.join(path) or 'the top'}")
                k = k if isinstance(k, str) else int(k)
                items.append([k, walk(v, path + [str(k)])])
            return {"d": items}
        if isinstance(value, (list, tuple)):
            kind = "l" if isinstance(value, list) else "t"
            return {kind: [walk(v, path + [str(i)]) for i, v in enumerate(value)]}
        name = ".".join(path)
        if _is_array(value):
            if name in entries:
                raise ValueError(f"two entries of the state dict are both named {name!r}")
            entries[name] = value
            return {"e": name}
        if isinstance(value, _PLAIN):
            return {"v": value}
        raise TypeError(f"state dict entry {name!r} is of type {type(value).__name__}; "
                        f"save takes DTensors, NumPy arrays, dicts, lists, tuples and None, "
                        f"bool, int, float, str")

    return entries, walk(obj, [])


def rebuild(tree, entries: dict):
    """The nested object ``tree`` describes, with the loaded ``entries``. Local."""
    if "d" in tree:
        return {k: rebuild(v, entries) for k, v in tree["d"]}
    if "l" in tree:
        return [rebuild(v, entries) for v in tree["l"]]
    if "t" in tree:
        return tuple(rebuild(v, entries) for v in tree["t"])
    if "e" in tree:
        return entries[tree["e"]]
    return tree["v"]


def check(tree, names) -> bool:
    """Whether ``tree`` (parsed JSON) is a well-formed tree whose entries are
    ``names``, each once. Local."""
    seen: list = []

    def ok(node) -> bool:
        if not isinstance(node, dict) or len(node) != 1:
            return False
        (kind, body), = node.items()
        if kind == "d":
            return isinstance(body, list) and all(
                isinstance(p, list) and len(p) == 2 and isinstance(p[0], (str, int))
                and not isinstance(p[0], bool) and ok(p[1]) for p in body)
        if kind in ("l", "t"):
            return isinstance(body, list) and all(ok(v) for v in body)
        if kind == "e":
            seen.append(body)
            return isinstance(body, str)
        return kind == "v" and isinstance(body, _PLAIN)

    return ok(tree) and sorted(seen) == sorted(names) and len(set(seen)) == len(seen)
