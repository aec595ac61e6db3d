"""DTensor: a NumPy array sharded over a DeviceMesh, mirroring torch's DTensor.

This is the ground floor's DTensor: its data, its spec, construction,
redistribution, metadata and pickling. Its NumPy entry points (operators, ufuncs,
``__array_function__``, ``reshape``, ``__getitem__``, the reductions, ...) reach
the operations through mpitensor._registry, which mpitensor._ops fills at import.
"""

from __future__ import annotations

import copyreg
import operator
import zlib
from typing import NamedTuple, Sequence

import numpy as np

from . import _C, _args, _iterate, _modes, _redistribute, _registry, _trace
from ._dtensor_spec import DTensorSpec, contiguous_strides
from ._layout import _codes, compute_local_shape_and_global_offset
from .device_mesh import DeviceMesh, find_live_mesh
from .placement_types import Partial, Placement, Replicate, Shard
from ._shard import DTensorShard

__all__ = ["DTensor", "ChunkStorageMetadata"]


class ChunkStorageMetadata(NamedTuple):
    """One rank's chunk of a DTensor: where it starts and how large it is."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


class DTensor(_C.DTensorBase):
    """A global NumPy array laid out over a :class:`DeviceMesh` by placements.

    Each rank holds its local ndarray (its shard, replica or partial value) and the
    spec that is the same on every rank: mesh, placements, global shape and dtype.
    Build one with :meth:`from_local`, :func:`mpitensor.distribute_tensor` or a
    factory such as :func:`mpitensor.zeros`.

    Example (``mpiexec -n 2``)::

        >>> mesh = init_device_mesh("cpu", (2,))
        >>> dt = DTensor.from_local(np.ones((2, 3)), mesh, [Shard(0)])
        >>> dt.shape, dt.to_local().shape
        ((4, 3), (2, 3))
    """

    # The C base holds the fields, ``_local_tensor`` and ``_spec`` (its
    # ``__init__(local_tensor, spec)`` sets them), and the entry points of NumPy
    # operations: the operators (in place too), ``__array_ufunc__`` and the
    # reduction methods sum, mean, prod, max, min, all, any, std, var, argmax and
    # argmin (csrc/ext/ext_dtensor.c, ext_dispatch.c). The comparison operators
    # make DTensors, so keep identity hashing.
    __slots__ = ()
    __hash__ = object.__hash__

    def __array_function__(self, func, types, args, kwargs):
        for t in types:
            if t is not DTensor and not issubclass(t, np.ndarray):
                return NotImplemented
        return _registry.lookup(func)(*args, **kwargs)

    @property
    def T(self) -> "DTensor":
        """The DTensor with its dims reversed; Shards follow their dims. Local.

        Example: ``dt.T.placements`` is ``(Shard(1),)`` when ``dt``'s is ``(Shard(0),)``.
        """
        return _registry.lookup(np.transpose)(self)

    def transpose(self, *axes) -> "DTensor":
        """numpy.ndarray.transpose: ``dt.transpose()``, ``dt.transpose(1, 0)`` or
        ``dt.transpose((1, 0))``. Shards follow their dims. Local.

        Example: ``dt.transpose(1, 0).shape == dt.shape[::-1]`` for a 2-D ``dt``.
        """
        if len(axes) == 0 or (len(axes) == 1 and axes[0] is None):
            axes = None
        elif len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = axes[0]
        return _registry.lookup(np.transpose)(self, axes)

    def reshape(self, *shape, order: str = "C") -> "DTensor":
        """numpy.ndarray.reshape: ``dt.reshape(2, -1)`` or ``dt.reshape((2, -1))``;
        see :func:`numpy.reshape` on DTensors (mpitensor._ops._shape.reshape).
        Collective on the mesh when the input must move first, else local.

        Example: ``dt.reshape(2, -1)`` of a ``(4, 6)`` DTensor has shape ``(2, 12)``.
        """
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        return _registry.lookup(np.reshape)(self, shape, order)

    def ravel(self, order: str = "C") -> "DTensor":
        """numpy.ndarray.ravel: ``dt.reshape(-1)``; see :func:`numpy.ravel` on
        DTensors. Collective on the mesh when the input must move first.

        Example::

            >>> distribute_tensor(np.ones((2, 3)), mesh, [Shard(0)]).ravel().shape
            (6,)
        """
        return _registry.lookup(np.ravel)(self, order)

    def flatten(self, order: str = "C") -> "DTensor":
        """numpy.ndarray.flatten: a copy as ``dt.reshape(-1)``. Collective on the
        mesh when the input must move first.

        Example::

            >>> distribute_tensor(np.ones((2, 3)), mesh, [Shard(0)]).flatten().shape
            (6,)
        """
        if order not in ("C", "A"):
            raise TypeError(f"DTensor.flatten: order={order!r} is not supported; only "
                            f"order='C' (and 'A', which is 'C' for DTensors)")
        return _registry.lookup(np.reshape)(self, -1, copy=True)

    def __getitem__(self, key) -> "DTensor":
        """Basic indexing (ints, slices with any step, None, ...), placements as
        torch's select/slice: a Shard of a dim the key cuts becomes Replicate, and
        only the picked elements move. Collective on the mesh when a sharded dim is
        cut, else local. Example: ``dt[1:, ::2]``, ``dt[..., 0, None]``."""
        return _registry.lookup(operator.getitem)(self, key)

    def __setitem__(self, key, value) -> None:
        raise TypeError("DTensor does not support item assignment; build the new value "
                        "with NumPy operations (e.g. numpy.where) or assign into "
                        "dt.to_local() for this rank's shard")

    def astype(self, dtype, copy: bool = True) -> "DTensor":
        """numpy.ndarray.astype, placements kept; a Partial is reduced first unless
        the cast is float/complex to equal or wider (see mpitensor._ops._select).
        Local unless a Partial must be reduced (then collective on the mesh).

        Example: ``dt.astype(np.float32).dtype == np.float32``.
        """
        return _registry.lookup(np.ndarray.astype)(self, dtype, copy=copy)

    def copy(self) -> "DTensor":
        """A DTensor with its own copy of the local data, placements kept. Local.

        Example: ``dt.copy().to_local() is not dt.to_local()``.
        """
        return _registry.lookup(np.copy)(self)

    # -- construction ------------------------------------------------------------
    @staticmethod
    def from_local(local_tensor, device_mesh: DeviceMesh | None = None,
                   placements: Sequence[Placement] | None = None, *,
                   run_check: bool = False, shape=None, stride=None) -> "DTensor":
        """Wrap each rank's local ndarray as the shards of one global DTensor.

        Local unless ``run_check=True``, which is collective on the mesh: it checks
        that dtypes, shapes and placements agree across ranks (ValueError on every
        rank when they do not) and broadcasts Replicate mesh dims from their first rank.
        Without ``shape`` the global shape assumes even sharding; for uneven shards
        pass both ``shape`` and ``stride``.

        Example (``mpiexec -n 2``)::

            >>> mesh = init_device_mesh("cpu", (2,))
            >>> local = np.arange(3.0) + 3 * mesh.get_rank()
            >>> DTensor.from_local(local, mesh, [Shard(0)]).shape
            (6,)
        """
        if not isinstance(local_tensor, np.ndarray):
            raise TypeError(
                f"from_local takes a NumPy ndarray, got {type(local_tensor).__name__}"
            )
        dtype = _args.check_dtype(local_tensor.dtype)
        mesh = _args.resolve_mesh(device_mesh)
        pl = _args.normalize_placements(placements, mesh, local_tensor.ndim)
        gshape, gstride = _global_shape_and_stride(local_tensor, mesh, pl, shape, stride)
        spec = DTensorSpec(mesh, pl, gshape, dtype, gstride)
        if mesh.get_coordinate() is None:
            return DTensor(np.empty((0,), dtype), spec)
        if run_check:
            local_tensor = _check_across_ranks(local_tensor, spec, shape is not None)
        return DTensor(local_tensor, spec)

    # -- data --------------------------------------------------------------------
    def to_local(self) -> np.ndarray:
        """This rank's local ndarray (shard, replica or partial value).

        Local, except after ``redistribute(..., async_op=True)``: then the first
        call completes the pending MPI request (collective) and returns the plain
        ndarray; later calls return it at once.

        Example::

            >>> dt.to_local().shape
            (2, 3)
        """
        local = self._local_tensor
        if type(local) is _redistribute.AsyncLocal:
            local = self._local_tensor = local.wait()
        return local

    def wait(self) -> "DTensor":
        """Completes a pending asynchronous redistribute; returns self. Collective.

        Example::

            >>> dt.redistribute(mesh, [Replicate()], async_op=True).wait()
        """
        self.to_local()
        return self

    def redistribute(self, device_mesh: DeviceMesh | None = None,
                     placements: Sequence[Placement] | None = None, *,
                     async_op: bool = False, forward_dtype=None) -> "DTensor":
        """The same global tensor with new placements. Collective on the mesh.

        ``placements`` is required (RuntimeError without it, as in torch; write
        ``[Replicate()] * mesh.ndim`` or use :meth:`full_tensor`). Each change runs as
        the cheapest plan the C planner finds: one MPI collective on one mesh dim
        where that does the job (Shard->Replicate all-gather, Shard->Shard
        all-to-all, Replicate->Shard local chunk, Partial->Replicate all-reduce,
        Partial->Shard reduce-scatter), or one direct all-to-all over the mesh that
        moves each element at most once. Uneven shards are never padded.
        ``forward_dtype`` casts before communicating. With ``async_op=True`` the
        first collective is started nonblocking and the call returns at once; the
        data is completed on first use (see :meth:`to_local`) or by :meth:`wait`.
        Partial placements may be kept but not created: RuntimeError. A reduction
        the dtype lacks (complex max/min, bool or integer avg) is a TypeError on
        every rank, whatever the mesh size.

        Example (``mpiexec -n 4``)::

            >>> mesh = init_device_mesh("cpu", (4,))
            >>> dt = distribute_tensor(np.arange(16.0).reshape(4, 4), mesh, [Shard(0)])
            >>> dt.redistribute(mesh, [Shard(1)]).to_local().shape   # one all-to-all
            (4, 1)
        """
        mesh = self.device_mesh if device_mesh is None else device_mesh
        if mesh is not self.device_mesh and mesh != self.device_mesh:
            raise NotImplementedError(
                "redistribute between different device meshes is not supported; the "
                f"DTensor lives on {self.device_mesh}, the target is {mesh}"
            )
        if placements is None:
            raise RuntimeError("placements is needed for redistribute!")
        # Every line here runs on each call: keep it to plain lookups (the
        # overhead over the MPI call itself is a benchmarked target).
        mesh, src = self._spec.mesh, self._spec.placements
        dst = _args.normalize_placements(placements, mesh, len(self._spec.shape))
        dtype = self._spec.dtype if forward_dtype is None else _args.check_dtype(forward_dtype)
        # Made (and checked: no Partial created, no reduction the dtype lacks) on
        # every rank alike, members of the mesh or not, before anything moves.
        plan = _redistribute.plan_for(mesh, self._spec.shape, src, dst, dtype)
        local = self.to_local()
        if forward_dtype is not None:
            local = local.astype(dtype, copy=False)
        spec = DTensorSpec(mesh, dst, self._spec.shape, dtype, self._spec.stride)
        if dst == src or mesh._coordinate is None:
            return DTensor(local, spec)
        if _modes.tracing:
            _trace.redistribute("DTensor.redistribute", mesh, plan, spec.shape, dtype)
        return DTensor(_redistribute.run(mesh, plan, local, async_op), spec)

    def full_tensor(self) -> np.ndarray:
        """The whole global array, on every rank of the mesh. Collective on the mesh.

        The same as ``redistribute(placements=[Replicate()] * mesh.ndim).to_local()``.
        A rank outside the mesh gets an empty array.

        Example (``mpiexec -n 2``)::

            >>> dt = DTensor.from_local(np.ones(2), mesh, [Shard(0)])
            >>> dt.full_tensor()
            array([1., 1., 1., 1.])
        """
        mesh = self._spec.mesh
        return self.redistribute(mesh, _args.normalize_placements(None, mesh, 0)).to_local()

    # -- metadata (all local) ------------------------------------------------------
    @property
    def device_mesh(self) -> DeviceMesh:
        """The mesh this tensor lives on (read-only). Local.

        Example: ``dt.device_mesh.shape`` is ``(2, 2)`` on a 2 x 2 mesh.
        """
        return self._spec.mesh

    @property
    def placements(self) -> tuple[Placement, ...]:
        """One placement per mesh dim (read-only). Local.

        Example: ``distribute_tensor(a, mesh, [Shard(0)]).placements == (Shard(0),)``.
        """
        return self._spec.placements

    @property
    def shape(self) -> tuple[int, ...]:
        """Global shape (the whole tensor's, not this rank's shard). Local.

        Example: ``distribute_tensor(np.ones((8, 6)), mesh, [Shard(0)]).shape == (8, 6)``.
        """
        return self._spec.shape

    @property
    def dtype(self) -> np.dtype:
        """The NumPy dtype of the elements. Local.

        Example: ``distribute_tensor(np.ones(4), mesh).dtype == np.float64``.
        """
        return self._spec.dtype

    @property
    def ndim(self) -> int:
        """Number of dims of the global tensor. Local.

        Example: ``distribute_tensor(np.ones((8, 6)), mesh, [Shard(0)]).ndim == 2``.
        """
        return len(self._spec.shape)

    @property
    def size(self) -> int:
        """Number of elements of the global tensor (NumPy's meaning of size; torch's
        ``size()`` is this package's ``shape``). Local.

        Example: ``distribute_tensor(np.ones((8, 6)), mesh, [Shard(0)]).size == 48``.
        """
        return int(np.prod(self._spec.shape, dtype=np.int64))

    @property
    def nbytes(self) -> int:
        """Bytes of the global tensor. Local.

        Example: ``distribute_tensor(np.ones((8, 6)), mesh, [Shard(0)]).nbytes == 384``.
        """
        return self.size * self._spec.dtype.itemsize

    def stride(self) -> tuple[int, ...]:
        """Global strides in elements, as torch's ``Tensor.stride()``. Local.

        Example: ``distribute_tensor(np.ones((8, 6)), mesh, [Shard(0)]).stride() == (6, 1)``.
        """
        return self._spec.stride

    __iter__ = _iterate.iterate  # rows along dim 0, gathered once: collective

    def __len__(self) -> int:
        if not self._spec.shape:
            raise TypeError("len() of a 0-d DTensor")
        return self._spec.shape[0]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        """This rank's chunk as one entry, as torch's sharded-checkpoint hook. Local."""
        sizes, offsets = compute_local_shape_and_global_offset(
            self.shape, self.device_mesh, self.placements)
        return [ChunkStorageMetadata(offsets=tuple(offsets), sizes=tuple(sizes))]

    def __copy__(self) -> "DTensor":
        """copy.copy: a new DTensor around the same local array and spec. Local."""
        return type(self)(self._local_tensor, self._spec)

    def __reduce__(self):
        """Pickles the local array and the spec, as torch.save(dtensor) does: a
        mesh's communicators cannot travel, so unpickling puts them back onto an
        equal mesh alive on the receiving rank, else gives a DTensorShard (see
        :func:`_rebuild`). Local."""
        mesh = self.device_mesh
        coordinate = mesh.get_coordinate()
        return _rebuild, (self.to_local(), self.placements, self.shape, self.stride(),
                          self.dtype, mesh.device_type, mesh.mesh.copy(),
                          mesh.mesh_dim_names,
                          None if coordinate is None else tuple(coordinate))

    def __array__(self, dtype=None, copy=None):
        raise TypeError(
            "a DTensor holds only this rank's shard; call .full_tensor() for the whole "
            "array on every rank, or .to_local() for this rank's shard"
        )

    def __repr__(self) -> str:
        # Never communicates: printing on one rank must not wait for the others.
        return (f"DTensor(local_tensor={self._local_tensor!r}, "
                f"device_mesh={self.device_mesh!r}, placements={self.placements!r}, "
                f"shape={self.shape}, dtype={self.dtype})")


# The dispatch makes DTensors, specs and placements of these types, and finds the
# operations in the registry mpitensor._ops fills.
_C.dispatch_init(DTensor, DTensorSpec, Replicate, Shard, Partial, _registry.functions,
                 _registry.rules)


def _rebuild(local, placements, shape, stride, dtype, device_type, ranks, names,
             coordinate=None):
    """Unpickles a DTensor onto an equal live mesh (creating one would be collective,
    which pickle.load must never be), else gives a :class:`DTensorShard`, since
    unpickling may run where no mesh can exist (a Jupyter client) inside a callback
    that cannot report an error. Local. ValueError when the local array is not this
    rank's shard (a pickle made on another rank)."""
    ranks = np.asarray(ranks)
    mesh = find_live_mesh(device_type, ranks, names)
    if mesh is None:
        return DTensorShard(local, placements, shape, stride, dtype, device_type, ranks,
                            names, None if coordinate is None else tuple(coordinate))
    spec = DTensorSpec(mesh, tuple(placements), tuple(shape), np.dtype(dtype), tuple(stride))
    here = mesh.get_coordinate()
    if here is not None:
        expect, _ = compute_local_shape_and_global_offset(shape, mesh, placements)
        if tuple(local.shape) != tuple(expect) or (
                coordinate is not None and tuple(coordinate) != tuple(here)):
            raise ValueError(
                f"the pickled local array of shape {local.shape} (from mesh coordinate "
                f"{coordinate}) is not rank {mesh.get_rank()}'s shard {tuple(expect)} at "
                f"coordinate {tuple(here)} of the DTensor of shape {tuple(shape)}: "
                f"unpickle each rank's pickle on that rank")
    return DTensor(local, spec)


# A shard pickled again (pushed back to its engine) is a DTensor where its mesh exists.
copyreg.pickle(DTensorShard, lambda shard: (_rebuild, shard._pickle_args()))


def _global_shape_and_stride(local, mesh, placements, shape, stride):
    if (shape is None) != (stride is None):
        raise ValueError(
            "from_local needs both `shape` and `stride` or neither: pass both when the "
            "local shards are uneven"
        )
    if shape is not None:
        gshape = _args.check_shape(shape, local.ndim)
        gstride = tuple(int(s) for s in stride)
        if len(gstride) != len(gshape):
            raise ValueError(f"stride {gstride} does not match shape {gshape}")
        return gshape, gstride
    gshape = tuple(_C.even_global_shape(local.shape, mesh.shape, _codes(placements)))
    return gshape, contiguous_strides(gshape)


def _check_across_ranks(local: np.ndarray, spec: DTensorSpec, shape_given: bool):
    """run_check: compare with the mesh's first rank, agree on a verdict, then
    broadcast Replicate dims. Collective on the mesh."""
    mesh = spec.mesh
    if _modes.tracing:
        # No shape here: a shape that differs is what run_check itself reports.
        _trace.collective("DTensor.from_local(run_check=True)", mesh, spec.placements,
                          None, None)
    mine = _meta_record(local, spec.shape, spec.placements)
    root = mine.copy()
    for d in range(mesh.ndim):
        mesh._handle.bcast(root, d)
    problem = _meta_problem(local, spec, mine, root, shape_given)
    if mesh._handle.any(problem is not None):
        raise ValueError(
            "DTensor.from_local(run_check=True): the local tensors do not fit one "
            "global tensor: " + (problem or "another rank's local tensor differs")
        )
    copied = False
    for d, p in enumerate(spec.placements):
        if p.is_replicate() and mesh.shape[d] > 1:
            if not copied:
                local, copied = np.array(local, order="C", copy=True), True
            mesh._handle.bcast(local, d)
    return local


def _meta_record(local: np.ndarray, gshape, placements) -> np.ndarray:
    """dtype, ndim, local shape, global shape and a checksum of the placements
    packed as int64 for a broadcast. Placements that differ across ranks would make
    the ranks' next collectives differ, i.e. hang, so they are checked too."""
    rec = np.zeros(3 + 2 * _C.MAX_NDIM, dtype=np.int64)
    rec[-1] = zlib.crc32(repr(tuple(placements)).encode())
    rec[0] = int.from_bytes(local.dtype.str.encode().ljust(8)[:8], "little", signed=True)
    rec[1] = local.ndim
    rec[2:2 + local.ndim] = local.shape
    rec[2 + _C.MAX_NDIM:2 + _C.MAX_NDIM + len(gshape)] = gshape
    return rec


def _meta_problem(local, spec, mine, root, shape_given):
    if mine[0] != root[0] or mine[1] != root[1]:
        return f"dtype {local.dtype} or ndim {local.ndim} differs from the first rank's"
    if mine[-1] != root[-1]:
        return (f"placements {list(spec.placements)} on rank {spec.mesh.get_rank()} "
                f"differ from the first rank's")
    if shape_given:
        if not np.array_equal(mine[2 + _C.MAX_NDIM:-1], root[2 + _C.MAX_NDIM:-1]):
            return f"shape {spec.shape} differs from the first rank's"
        expect, _ = compute_local_shape_and_global_offset(
            spec.shape, spec.mesh, spec.placements)
        if tuple(local.shape) != tuple(expect):
            return (f"local shape {local.shape} on rank {spec.mesh.get_rank()} is not "
                    f"its shard {tuple(expect)} of the global shape {spec.shape}")
    elif not np.array_equal(mine[2:2 + _C.MAX_NDIM], root[2:2 + _C.MAX_NDIM]):
        return (f"local shape {local.shape} on rank {spec.mesh.get_rank()} differs from "
                f"the first rank's; pass shape= and stride= for uneven shards")
    return None
