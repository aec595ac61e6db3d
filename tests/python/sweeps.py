"""Which instances of a parametrised test run at a rank count.

A sweep (a test parametrised over layouts times calls, say) runs whole at two ranks,
where every layout splits the array. At one rank every layout is the whole array; what
three and four ranks add is the layout (uneven shards, a 2-D mesh, more peers in each
exchange), which each value of each parameter exercises, while the product of the
values was checked at two. So at one, three and four ranks a sweep runs a covering
subset: every value of every parameter at least once, in collection order.
``MT_FULL_SWEEPS=1`` runs every instance at every rank count.

The choice depends only on the collected items, so every rank makes the same one.
"""

from __future__ import annotations

import os

__all__ = ["covering", "full_sweep_at"]

# The rank counts at which every instance runs.
_FULL_AT = (2,)


def full_sweep_at(size: int) -> bool:
    """Whether every instance of each sweep runs at ``size`` ranks.

    Example: ``full_sweep_at(4)`` is False unless ``MT_FULL_SWEEPS=1``.
    """
    return size in _FULL_AT or os.environ.get("MT_FULL_SWEEPS") == "1"


def covering(items: list) -> tuple[list, list]:
    """``(kept, dropped)``: of the parametrised instances of each test function, the
    first that brings a parameter value not yet run is kept, the others dropped;
    items without parameters are all kept. Both lists keep the collection order.

    A value is the object the parametrisation passed (the same object in every
    instance that uses it), so values that print alike stay distinct.

    Example: for ``test_f[a-x]``, ``test_f[a-y]``, ``test_f[b-x]``, ``test_f[b-y]``
    (layouts a, b times calls x, y) the first three are kept: a, x, y and b each run.
    """
    seen: dict = {}
    kept, dropped = [], []
    for item in items:
        spec = getattr(item, "callspec", None)
        if spec is None:
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
