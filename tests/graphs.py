"""Graph helpers shared by the checks of the house: the C libraries' walls
(tests/core/check_walls.py) and the Python floors (tests/python/test_imports.py)."""

from __future__ import annotations


def strongly_connected(edges: dict) -> list[list]:
    """Every strongly connected component of the graph ``{node: successors}``, each
    sorted, in a deterministic order (Tarjan). A caller keeps those it calls cycles.

    Example::

        >>> strongly_connected({"a": {"b"}, "b": {"a"}, "c": set()})
        [['a', 'b'], ['c']]
    """
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out
