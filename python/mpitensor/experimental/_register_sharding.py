"""register_sharding: user sharding strategies for a NumPy function on DTensors.

Port of ``torch.distributed.tensor.experimental.register_sharding`` (torch 2.8) for
NumPy functions reached through ``__array_function__`` (``np.cumsum``,
``np.concatenate``, ...) and NumPy ufuncs (``np.add``, ...).
"""

from __future__ import annotations

import itertools

import numpy as np

from .. import _registry
from .._dtensor import DTensor
from .._algorithms import _dispatch as D
from .._layout import plan as plan_for
from ..placement_types import Partial, Placement
from .._dtensor_spec import contiguous_strides
from ._local_map import _global_shapes

__all__ = ["register_sharding", "clear_sharding_registry"]


def register_sharding(func):
    """Decorator registering the sharding strategies of the NumPy function ``func``
    (or a list of them) on DTensors; it overrides the built-in rule, if any.

    The decorated ``custom_sharding(*args, **kwargs)`` is called with the arguments
    of the NumPy call (DTensor arguments as they are: only their ``shape``,
    ``ndim``, ``dtype`` and ``placements`` should be used) and returns a list of
    acceptable ``(output placements, input placements)`` pairs for ONE mesh dim:
    output placements is a list with one Placement (one output); input placements
    has one entry per positional argument, the elements of a list/tuple argument
    counting one each (``np.concatenate([a, b])``), a Placement for a DTensor and
    None for anything else.

    On a call, the strategies are expanded to the full mesh (one strategy per mesh
    dim, every combination), combinations that need an input to become Partial
    where it is not already that Partial (or that shard past an input's ndim) are
    dropped, and the one whose input redistributions move the fewest bytes is
    picked (ties: no communication first, then enumeration order). The inputs are
    redistributed, ``func`` runs on the local arrays and the result is wrapped with
    the chosen output placements. The decision, including the output's global
    shape, is cached per (function, static arguments, input placements, shapes,
    dtypes) on the mesh, and ``custom_sharding`` is only called on a miss.

    Collective on the mesh when an input is redistributed, and on a cache miss when
    the output is sharded (its global shape is assembled from every rank's local
    shape, as ``local_map`` does). Non-hashable non-DTensor arguments disable the
    cache for that call.

    Example::

        >>> @register_sharding(np.cumsum)
        ... def cumsum_sharding(x, axis=None):
        ...     rules = [([Replicate()], [Replicate()])]
        ...     for d in range(x.ndim):
        ...         if axis is not None and d != axis % x.ndim:
        ...             rules.append(([Shard(d)], [Shard(d)]))
        ...     return rules
    """
    funcs = list(func) if isinstance(func, (list, tuple)) else [func]
    for f in funcs:
        if not callable(f):
            raise TypeError(f"register_sharding needs a NumPy function, got {f!r}")

    def decorator(custom_sharding):
        for f in funcs:
            _registry.set_rule(f, _Rule(f, custom_sharding))
        return custom_sharding

    return decorator


def clear_sharding_registry(func=None) -> None:
    """Removes the strategies registered for ``func`` (all of them when None); the
    built-in rule, if any, applies again. Local, but do it on every rank alike:
    ranks with different rules would make different collective calls.

    Example: ``clear_sharding_registry(np.linalg.norm)`` after a
    ``@register_sharding(np.linalg.norm)`` rule.
    """
    if func is None:
        _registry.clear_rules()
    else:
        _registry.set_rule(func, None)


def _flat_operands(args):
    """(flat operands, rebuild) where a list/tuple positional argument contributes
    its elements and rebuild(new flat) gives the positional arguments back."""
    flat, shape = [], []
    for a in args:
        if type(a) in (list, tuple):
            shape.append((type(a), len(a)))
            flat.extend(a)
        else:
            shape.append(None)
            flat.append(a)

    def rebuild(values):
        it = iter(values)
        return [next(it) if s is None else s[0](next(it) for _ in range(s[1]))
                for s in shape]

    return flat, rebuild


def _static_key(flat, kwargs):
    """A hashable key of the non-DTensor arguments, or None when one is not hashable."""
    parts = tuple(("dt",) if type(o) is DTensor else (type(o), o) for o in flat)
    key = (parts, tuple(sorted(kwargs.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _Choice:
    __slots__ = ("targets", "out_placements", "out_shape")


# Choices a rule keeps, by its static arguments and input layouts (oldest first out).
_CHOICES = 256


class _Rule:
    """The registered strategies of one NumPy function and its dispatch."""

    def __init__(self, func, custom_sharding):
        self.func = func
        self.custom = custom_sharding
        self.name = f"numpy.{getattr(func, '__name__', repr(func))}"
        self.choices: dict = {}

    def __call__(self, args, kwargs):
        name = self.name
        if "out" in kwargs:
            raise TypeError(f"{name}: out= is not supported with register_sharding rules")
        flat, rebuild = _flat_operands(args)
        flat = list(D.implicit(flat))
        dts = [i for i, o in enumerate(flat) if type(o) is DTensor]
        for o in flat:
            if isinstance(o, np.ndarray) and o.ndim > 0:
                raise D.mixed_error(name, o)
        inputs = [flat[i] for i in dts]
        mesh = D.same_mesh(name, inputs)
        # The choice is kept when the call has a key: its static arguments hashable.
        static = _static_key(flat, kwargs)
        key = None if static is None else (static, tuple(x._spec for x in inputs))
        choice = self.choices.get(key) if key is not None else None
        if choice is None:
            choice = self._choose(mesh, flat, dts, args, kwargs)
        moved = [x.redistribute(mesh, t) for x, t in zip(inputs, choice.targets)]
        new_flat = list(flat)
        for i, x in zip(dts, moved):
            new_flat[i] = x.to_local()
        result = self.func(*rebuild(new_flat), **kwargs)
        if not isinstance(result, np.ndarray):
            result = np.asarray(result)
        if choice.out_shape is None:
            choice.out_shape = _global_shapes([result], [choice.out_placements], mesh)[0]
            if key is not None:
                if len(self.choices) >= _CHOICES:
                    del self.choices[next(iter(self.choices))]
                self.choices[key] = choice
        shape = choice.out_shape
        if mesh._coordinate is None:
            result = np.empty((0,), result.dtype)
        return DTensor.from_local(result, mesh, choice.out_placements,
                                  shape=shape, stride=contiguous_strides(shape))

    def _choose(self, mesh, flat, dts, args, kwargs) -> _Choice:
        name = self.name
        strategies = list(self.custom(*args, **kwargs))
        if not strategies:
            raise ValueError(f"{name}: the registered sharding function returned no "
                             f"strategy")
        parsed = []
        for s in strategies:
            out, ins = s
            out = [out] if isinstance(out, Placement) else list(out)
            if len(out) != 1 or not isinstance(out[0], Placement):
                raise ValueError(f"{name}: a strategy's output placements must be one "
                                 f"Placement (one output), got {out!r}")
            ins = list(ins)
            if len(ins) == len(flat):
                ins = [ins[i] for i in dts]
            elif len(ins) != len(dts):
                raise ValueError(
                    f"{name}: a strategy's input placements have {len(ins)} entries "
                    f"for {len(flat)} arguments ({len(dts)} DTensors)")
            for p in ins:
                if not isinstance(p, Placement):
                    raise ValueError(f"{name}: a DTensor argument's input placement must "
                                     f"be a Placement, got {p!r}")
            parsed.append((out[0], ins))
        specs = [flat[i]._spec for i in dts]
        best, best_cost = None, None
        for order, combo in enumerate(itertools.product(parsed, repeat=mesh.ndim)):
            targets = [tuple(c[1][j] for c in combo) for j in range(len(dts))]
            ok, total, comm = True, 0, False
            for s, dst in zip(specs, targets):
                if not self._valid(s, dst):
                    ok = False
                    break
                if dst == s.placements:
                    continue
                try:  # a reduction the dtype lacks rules the strategy out
                    p = plan_for(mesh, s.shape, s.placements, dst, s.dtype)
                except (RuntimeError, TypeError):
                    ok = False
                    break
                total += p.bytes
                comm = comm or p.messages > 0
            if not ok:
                continue
            cost = (total, comm, order)
            if best_cost is None or cost < best_cost:
                best_cost = cost
                best = _Choice()
                best.targets = targets
                best.out_placements = tuple(c[0] for c in combo)
                best.out_shape = None
        if best is None:
            raise ValueError(f"{name}: no registered strategy is reachable from the "
                             f"inputs' placements {[s.placements for s in specs]}")
        return best

    @staticmethod
    def _valid(spec, dst) -> bool:
        ndim = len(spec.shape)
        for m, p in enumerate(dst):
            if isinstance(p, Partial):
                if spec.placements[m] != p:
                    return False
            elif p.is_shard() and not -ndim <= p.dim < ndim:
                return False
        return True
