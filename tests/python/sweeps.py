"""Which instances of a parametrised test run at a rank count.

A sweep (a test parametrised over layouts times calls, say) runs whole at two ranks,
where every layout splits the array. At one rank every layout is the whole array;
three ranks add uneven shards and more peers in each exchange, which each layout
value exercises with any call. So at one and three ranks, and at four, a sweep runs a
covering subset: every value of every parameter at least once, in collection order.
The one kind of layout only four ranks have, a mesh with two dims larger than one
((2, 2), (2, 1, 2)), meets every call: an instance whose parameters hold such a mesh
shape always runs, and so does every instance of a test that runs at some rank counts
only (a ``world``, ``np`` or ``mpi(ranks=N)`` marker), whose product may run nowhere
else. A condition on the world size is therefore a ``world`` marker, never a
``skipif``: a skipif's condition is a value the sweeps cannot read at another size
(test_sweeps.py checks that none skips a sweep at two ranks). ``MT_FULL_SWEEPS=1``
runs every instance at every rank count.

The choice depends only on the collected items and the world size, so every rank
makes the same one.
"""

from __future__ import annotations

import math
import os

__all__ = ["covering", "full_sweep_at", "runs_at_some_sizes"]

# The rank count at which every instance runs.
_FULL_AT = 2


def full_sweep_at(size: int) -> bool:
    """Whether every instance of each sweep runs at ``size`` ranks.

    Example: ``full_sweep_at(4)`` is False unless ``MT_FULL_SWEEPS=1``.
    """
    return size == _FULL_AT or os.environ.get("MT_FULL_SWEEPS") == "1"


def runs_at_some_sizes(item) -> bool:
    """Whether a collected test is marked to run at some world sizes only: ``world``,
    ``np`` or ``mpi`` (its ``ranks``).

    Example: ``covering(items, 4, keep=runs_at_some_sizes)``.
    """
    return any(item.get_closest_marker(name) is not None for name in ("world", "np", "mpi"))


def _holds_grid(value, size: int, depth: int = 0) -> bool:
    """Whether ``value`` (a parameter's value: tuples and lists looked into, a few
    levels deep) holds a mesh shape of ``size`` ranks with two dims larger than one.
    A tensor shape that looks like one counts too, which only keeps an instance."""
    if not isinstance(value, (tuple, list)) or depth > 4:
        return False
    if len(value) >= 2 and all(type(n) is int for n in value):
        return sum(n > 1 for n in value) >= 2 and math.prod(value) == size
    return any(_holds_grid(v, size, depth + 1) for v in value[:16])


def covering(items: list, size: int, keep=lambda item: False) -> tuple[list, list]:
    """``(kept, dropped)``: of the parametrised instances of each test function, the
    first that brings a parameter value not yet run is kept, and every one whose
    parameters hold a mesh shape of ``size`` ranks with two dims larger than one, or
    for which ``keep(item)`` is true; the others are dropped. Items without
    parameters are kept. Both lists keep the collection order.

    A value is the object the parametrisation passed (the same object in every
    instance that uses it), so values that print alike stay distinct.

    Example: for ``test_f[a-x]``, ``test_f[a-y]``, ``test_f[b-x]``, ``test_f[b-y]``
    (layouts a, b times calls x, y) the first three are kept: a, x, y and b each run.
    """
    seen: dict = {}
    kept, dropped = [], []
    for item in items:
        spec = getattr(item, "callspec", None)
        if spec is None or keep(item) or any(_holds_grid(v, size) for v in spec.params.values()):
            kept.append(item)
            continue
        values = {(name, id(value)) for name, value in spec.params.items()}
        done = seen.setdefault((item.path, item.originalname), set())
        if values <= done:
            dropped.append(item)
        else:
            done |= values
            kept.append(item)
    return kept, dropped
