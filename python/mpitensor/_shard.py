"""What unpickling a DTensor gives where no equal DeviceMesh exists: one rank's
shard with its layout, and `assemble`, which puts every rank's shards together
without MPI.

A Jupyter client that pulls DTensors from its MPI engines has no mesh, and
unpickling there may run inside a library's callback that cannot report an
exception (ipyparallel's), so it must give something usable instead of raising.
Pickling a shard again gives the DTensor back on the rank it came from (the rule is
registered beside DTensor's own pickling, in mpitensor._dtensor).
"""

from __future__ import annotations

import numpy as np

from ._layout import local_shape_and_global_offset
from .placement_types import Partial, Replicate

__all__ = ["DTensorShard", "assemble"]

# What a DTensor has and a DTensorShard lacks; using one names the reason.
_DTENSOR_ONLY = frozenset({
    "device_mesh", "full_tensor", "redistribute", "spec", "requires_grad", "grad",
    "backward", "sum", "mean", "max", "min", "reshape", "transpose", "T", "astype",
    "wait", "stride", "size", "ndim"})


class DTensorShard:
    """One rank's shard of a DTensor, unpickled where no equal DeviceMesh exists
    (in a Jupyter client that pulls DTensors from its MPI engines, say). Local.

    It holds the local array (:meth:`to_local`), the placements, the global
    ``shape``, ``dtype``, the mesh's ranks (``mesh``, ``mesh_dim_names``) and the
    ``coordinate`` of the rank it came from. :func:`assemble` puts the shards of
    every rank together into the global array. Pickled again (pushed back to the
    engines), it becomes a DTensor on the rank it came from, whose mesh exists.
    It communicates nothing, so it has no ``full_tensor``, ``redistribute`` or
    NumPy operations.

    Example (in the notebook's kernel, with 4 engines holding ``x``)::

        >>> shards = rc[:]["x"]           # one DTensorShard per engine
        >>> shards[1].to_local()          # engine 1's rows
        array([2., 3.])
        >>> mpitensor.checkpoint.assemble(shards)
        array([0., 1., 2., 3., 4., 5., 6., 7.])
        >>> for engine, shard in zip(rc, shards):
        ...     engine["y"] = shard       # a DTensor again on each engine
    """

    __slots__ = ("_local", "placements", "shape", "_stride", "dtype", "device_type",
                 "mesh", "mesh_dim_names", "coordinate", "requires_grad")

    def __init__(self, local, placements, shape, stride, dtype, device_type, ranks,
                 names, coordinate, requires_grad=False):
        self._local = local
        self.placements = tuple(placements)
        self.shape = tuple(shape)
        self._stride = tuple(stride)
        self.dtype = np.dtype(dtype)
        self.device_type = device_type
        self.mesh = np.asarray(ranks)
        self.mesh_dim_names = names
        self.coordinate = coordinate
        self.requires_grad = bool(requires_grad)  # the DTensor's flag, kept for the trip back

    @property
    def rank(self) -> int | None:
        """The rank this shard came from (None: a rank outside the mesh). Local.

        Example: ``[s.rank for s in rc[:]["x"]]`` gives ``[0, 1, 2, 3]``."""
        return None if self.coordinate is None else int(self.mesh[self.coordinate])

    def to_local(self) -> np.ndarray:
        """The rank's local array, as ``DTensor.to_local()`` gave it there. Local.

        Example: ``rc[:]["x"][1].to_local()`` is engine 1's rows of ``x``."""
        return self._local

    def _pickle_args(self) -> tuple:
        """The arguments DTensor's pickling gives its rebuild function. Local."""
        return (self._local, self.placements, self.shape, self._stride, self.dtype,
                self.device_type, self.mesh, self.mesh_dim_names, self.coordinate,
                self.requires_grad)

    def __repr__(self) -> str:
        return (f"DTensorShard(rank={self.rank}, coordinate={self.coordinate}, "
                f"local_shape={tuple(self._local.shape)}, shape={self.shape}, "
                f"dtype={self.dtype}, placements={self.placements}, "
                f"mesh={self.mesh.tolist()})")

    def _not_a_dtensor(self) -> str:
        return (f"{self!r} is one rank's shard of a DTensor, unpickled where no equal "
                f"DeviceMesh exists (e.g. in a Jupyter client), so it cannot "
                f"communicate: use .to_local() for this rank's array, "
                f"mpitensor.checkpoint.assemble(shards) for the global array from "
                f"every rank's shard, or send it back to its rank to get the DTensor")

    def __getattr__(self, name):
        if name in _DTENSOR_ONLY:
            raise AttributeError(f"no attribute {name!r}: {self._not_a_dtensor()}")
        raise AttributeError(f"'DTensorShard' object has no attribute {name!r}")

    def __array__(self, dtype=None, copy=None):
        raise TypeError(self._not_a_dtensor())

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        raise TypeError(self._not_a_dtensor())

    def __array_function__(self, func, types, args, kwargs):
        raise TypeError(self._not_a_dtensor())


def assemble(shards) -> np.ndarray:
    """The global array of a DTensor from the :class:`DTensorShard` of every rank
    of its mesh (any order; extra replicas are ignored). Local, no MPI.

    Replicated mesh dims take the shard at coordinate 0, Partial ones are reduced
    with their ``reduce_op``. ValueError when the shards are of different DTensors
    or a part of the array has no shard.

    Example::

        >>> x_global = mpitensor.checkpoint.assemble(rc[:]["x"])
    """
    shards = [s for s in shards if s.coordinate is not None]
    if not shards:
        raise ValueError("assemble needs the DTensorShard of every rank of the mesh, got none")
    first = shards[0]
    key = _identity(first)
    if any(_identity(s) != key for s in shards):
        raise ValueError("assemble got shards of different DTensors (shape, dtype, "
                         "placements or mesh differ)")
    partial = {p.reduce_op for p in first.placements if isinstance(p, Partial)}
    if len(partial) > 1:
        raise NotImplementedError(f"assemble of a DTensor Partial over several reduce "
                                  f"ops {sorted(partial)}")
    op = partial.pop() if partial else None
    out = np.zeros(first.shape, first.dtype)
    for (offset, shape), arrays in _contributions(shards).items():
        out[tuple(slice(o, o + n) for o, n in zip(offset, shape))] = _reduce(arrays, op)
    return out


def _identity(s: DTensorShard):
    return (s.shape, s.dtype, s.placements, s.mesh.shape, s.mesh.tolist(), s.mesh_dim_names)


def _contributions(shards) -> dict:
    """Box (offset, shape) -> the local arrays of the Replicate-coordinate-0 shards
    that hold it, checking that every coordinate needed is there."""
    mesh_shape = shards[0].mesh.shape
    placements = shards[0].placements
    have = {}
    for s in shards:
        have.setdefault(tuple(s.coordinate), s)
    needed = [c for c in np.ndindex(*mesh_shape)
              if all(c[d] == 0 for d, p in enumerate(placements) if isinstance(p, Replicate))]
    missing = [c for c in needed if c not in have]
    if missing:
        raise ValueError(f"assemble is missing the shards at mesh coordinates {missing}")
    boxes: dict = {}
    for c in needed:
        shape, offset = local_shape_and_global_offset(shards[0].shape, mesh_shape, c,
                                                      placements)
        boxes.setdefault((tuple(offset), tuple(shape)), []).append(have[c].to_local())
    return boxes


def _reduce(arrays, op):
    if op is None:
        return arrays[0]
    if op in ("sum", "avg"):
        total = np.sum(arrays, axis=0, dtype=arrays[0].dtype)
        return total / len(arrays) if op == "avg" else total
    return {"product": np.prod, "max": np.max, "min": np.min}[op](arrays, axis=0)
