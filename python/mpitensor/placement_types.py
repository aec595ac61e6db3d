"""Placements: how a tensor lies along one dim of a device mesh.

Mirrors ``torch.distributed.tensor.placement_types``. Placements are frozen,
hashable and equal by value, with torch's reprs (``Shard(dim=0)``) and short
strings (``S(0)``, ``R``, ``P(sum)``).

Each distinct placement exists once (``Shard(0) is Shard(0)``): equal values are the
same object, so comparing and hashing placements, which every redistribute and
every cached sharding decision does, runs at the speed of identity.
"""

from __future__ import annotations

import numpy as np

from ._clib import CORE

__all__ = ["Placement", "Shard", "Replicate", "Partial"]

# The C core's codes (mt_placement_kind, mt_reduce_op in layout.h).
_REPLICATE, _SHARD, _PARTIAL, _STRIDED = (CORE.PLACEMENT_REPLICATE, CORE.PLACEMENT_SHARD,
                                          CORE.PLACEMENT_PARTIAL, CORE.PLACEMENT_STRIDED)
_REDUCE_OPS = CORE.REDUCE_OPS


class Placement:
    """Base class of :class:`Shard`, :class:`Replicate` and :class:`Partial`.
    Placements are local values: making or comparing one never communicates.

    Example::

        >>> Shard(0).is_shard(), Replicate().is_shard()
        (True, False)
    """

    __slots__ = ()

    def is_shard(self, dim: int | None = None) -> bool:
        """True for a :class:`Shard` (on ``dim`` when given). Local.

        Example: ``Shard(1).is_shard()``, ``Shard(1).is_shard(dim=1)`` are True;
        ``Shard(1).is_shard(0)`` and ``Replicate().is_shard()`` are False.
        """
        return False

    def is_replicate(self) -> bool:
        """True for :class:`Replicate`. Local.

        Example: ``Replicate().is_replicate()`` is True, ``Shard(0).is_replicate()``
        False.
        """
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        """True for a :class:`Partial` (with ``reduce_op`` when given). Local.

        Example: ``Partial().is_partial()`` and ``Partial("max").is_partial("max")``
        are True, ``Partial().is_partial("max")`` is False.
        """
        return False

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __delattr__(self, name):
        raise AttributeError(f"{type(self).__name__} is immutable")

    def __reduce__(self):
        return (type(self), self._args())

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self

    def _args(self) -> tuple:
        return ()


# One instance per value; object's identity equality and hash are value semantics.
_interned: dict = {}


def _intern(cls, key, fields: dict, code: tuple):
    obj = _interned.get((cls, key))
    if obj is None:
        obj = object.__new__(cls)
        for name, value in fields.items():
            object.__setattr__(obj, name, value)
        object.__setattr__(obj, "_code", code)
        obj = _interned.setdefault((cls, key), obj)
    return obj


class Shard(Placement):
    """The tensor is cut along tensor dim ``dim`` over the ranks of a mesh dim.

    Cuts follow ``torch.chunk`` with chunks of ``ceil(n/k)`` (not
    ``numpy.array_split``): trailing ranks may hold short or empty shards. Negative
    dims are allowed and are normalised against the tensor when the placement is
    used. Local (a value; no communication).

    Example::

        >>> Shard(1), str(Shard(1))
        (Shard(dim=1), 'S(1)')
    """

    __slots__ = ("dim", "_code")

    def __new__(cls, dim: int = 0):
        if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
            raise TypeError(f"Shard dim must be an int, got {dim!r}")
        dim = int(dim)
        return _intern(cls, dim, {"dim": dim}, (_SHARD, dim, 0))

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def _args(self) -> tuple:
        return (self.dim,)

    def __repr__(self) -> str:
        return f"Shard(dim={self.dim})"

    def __str__(self) -> str:
        return f"S({self.dim})"


class Replicate(Placement):
    """Every rank of the mesh dim holds the whole tensor. Local (a value).

    Example::

        >>> Replicate(), str(Replicate())
        (Replicate(), 'R')
    """

    __slots__ = ("_code",)

    def __new__(cls):
        return _intern(cls, None, {}, (_REPLICATE, 0, 0))

    def is_replicate(self) -> bool:
        return True

    def __repr__(self) -> str:
        return "Replicate()"

    def __str__(self) -> str:
        return "R"


class Partial(Placement):
    """Each rank holds a partial value; the tensor is their reduction.

    ``reduce_op`` is one of ``"sum"``, ``"avg"``, ``"product"``, ``"max"``,
    ``"min"``. Partial tensors come from :meth:`DTensor.from_local` and from
    operators. Local (a value; reducing happens in :meth:`DTensor.redistribute`).

    Example::

        >>> Partial(), str(Partial("max"))
        (Partial(sum), 'P(max)')
    """

    __slots__ = ("reduce_op", "_code")

    def __new__(cls, reduce_op: str = "sum"):
        if not isinstance(reduce_op, str) or reduce_op not in _REDUCE_OPS:
            raise ValueError(
                f"Partial reduce_op must be one of {', '.join(_REDUCE_OPS)}; "
                f"got {reduce_op!r}"
            )
        code = (_PARTIAL, 0, _REDUCE_OPS.index(reduce_op))
        return _intern(cls, reduce_op, {"reduce_op": reduce_op}, code)

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return reduce_op is None or reduce_op == self.reduce_op

    def _args(self) -> tuple:
        return (self.reduce_op,)

    def __repr__(self) -> str:
        return f"Partial({self.reduce_op})"

    def __str__(self) -> str:
        return f"P({self.reduce_op})"


class _StridedShard(Placement):
    """Sharded along tensor dim ``dim`` with a stride: torch's ``_StridedShard``.

    The dim is first cut into ``split_factor`` equal pieces; each piece is cut over
    the mesh dim's ranks as :class:`Shard` cuts (``torch.chunk``), and a rank holds
    its part of every piece, in order. Flattening an array sharded on a dim that is
    not the first of the flattened group makes one (``x.reshape(-1)`` of an (8, 6)
    array placed ``[Shard(1)]`` is placed ``[_StridedShard(0, split_factor=8)]``), so
    the flatten moves no data. Like torch's, it is not a :class:`Shard` and
    ``is_shard()`` is True. Local (a value; no communication).

    Example::

        >>> _StridedShard(0, split_factor=8), str(_StridedShard(0, sf=8))
        (_StridedShard(dim=0, sf=8), '_S(0, 8)')
    """

    __slots__ = ("dim", "split_factor", "_code")

    def __new__(cls, dim: int = 0, *, split_factor: int = 1, sf: int | None = None):
        if sf is not None:
            if split_factor != 1:
                raise TypeError("_StridedShard received both split_factor and sf")
            split_factor = sf
        for name, v in (("dim", dim), ("split_factor", split_factor)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
                raise TypeError(f"_StridedShard {name} must be an int, got {v!r}")
        if split_factor < 1:
            raise ValueError(f"_StridedShard split_factor must be >= 1, got {split_factor}")
        dim, split_factor = int(dim), int(split_factor)
        if split_factor >= 2**31:
            raise ValueError(f"_StridedShard split_factor must be below 2**31, got "
                             f"{split_factor}")
        return _intern(cls, (dim, split_factor),
                       {"dim": dim, "split_factor": split_factor},
                       (_STRIDED, dim, 0, split_factor))

    def is_shard(self, dim: int | None = None) -> bool:
        return dim is None or dim == self.dim

    def _args(self) -> tuple:
        return (self.dim,)

    def __reduce__(self):
        return (_strided_shard, (self.dim, self.split_factor))

    def __hash__(self) -> int:
        return hash((self.dim, self.split_factor))

    def __repr__(self) -> str:
        return f"_StridedShard(dim={self.dim}, sf={self.split_factor})"

    def __str__(self) -> str:
        return f"_S({self.dim}, {self.split_factor})"


def _strided_shard(dim: int, split_factor: int) -> _StridedShard:
    """Unpickles a :class:`_StridedShard` (its factor is a keyword). Local.

    Example: ``_strided_shard(0, 8) is _StridedShard(0, sf=8)``.
    """
    return _StridedShard(dim, split_factor=split_factor)


def from_code(code) -> Placement:
    """The placement of a C placement code ``(kind, dim, reduce_op[,
    split_factor])``. Local.

    Example: ``from_code((1, 0, 0)) is Shard(0)``.
    """
    kind, dim, op = code[:3]
    if kind == _REPLICATE:
        return Replicate()
    if kind == _SHARD:
        return Shard(dim)
    if kind == _STRIDED:
        return _StridedShard(dim, split_factor=code[3])
    return Partial(_REDUCE_OPS[op])
