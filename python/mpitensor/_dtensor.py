"""DTensor: a NumPy array sharded over a DeviceMesh, mirroring torch's DTensor.

This is the ground floor's DTensor: its data, its spec, construction,
redistribution, metadata and pickling. Its NumPy entry points (operators, ufuncs,
``__array_function__``, ``reshape``, ``__getitem__``, the reductions, ...) reach
the operations through mpitensor._registry, which mpitensor._ops fills at import.
"""

from __future__ import annotations

import copyreg
import operator
import sys
from collections import OrderedDict
from typing import NamedTuple, Sequence

import numpy as np

from . import (_C, _args, _call_agreement, _clib, _comm, _deferred, _device, _dtypes, _flat,
               _iterate, _modes, _registry, _trace)
from ._bind import core
from ._dtensor_spec import DTensorSpec, contiguous_strides
from ._fingerprint import fingerprint
from ._hooks import RemovableHandle, add_hook
from ._layout import _codes, compute_local_shape_and_global_offset
from ._node import Node
from .device_mesh import DeviceMesh, find_live_mesh, local_mesh
from .placement_types import Partial, Placement, Replicate, Shard, _StridedShard, _strided_shard
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
    # operations: the operators (in place too: the ufunc into the left operand,
    # as NumPy's out=), ``__array_ufunc__``,
    # ``redistribute`` and the reduction methods sum, mean, prod, max, min, all,
    # any, std, var, argmax and argmin (csrc/ext/ext_dtensor.c), and autograd's
    # ``_requires_grad`` bit and ``_grad_fn`` node (None for a leaf), which the
    # executor records into, and autograd's other attributes: the accumulated
    # ``_grad``, whether it is still the engine's own (``_grad_owned``: nobody read
    # it since it was stored), retain_grad()'s flag, the hooks ``register_hook`` and
    # ``register_post_accumulate_grad_hook`` add (tables the engine reads when it
    # reaches this tensor); unset until used. They are C
    # fields rather than slots here, which CPython would clear one by one at every
    # free of the DTensors the executor makes. The comparison operators make
    # DTensors, so keep identity hashing.
    __slots__ = ()
    __hash__ = object.__hash__

    __array_function__ = _registry.array_function

    @property
    def T(self) -> "DTensor":
        """The DTensor with its dims reversed; Shards follow their dims. Local.

        Example: ``dt.T.placements`` is ``(Shard(1),)`` when ``dt``'s is ``(Shard(0),)``.
        """
        return _method(np.transpose, (self,))

    @property
    def flat(self) -> "_flat.FlatIter":
        """numpy.ndarray.flat: the elements in C order; reading gives new DTensors,
        writing (``dt.flat[k] = v``, ``dt.flat[::n + 1] += v``) reaches ``dt``.
        Collective on the mesh when used. Example: ``dt.flat[::4] += 1.0`` adds 1 to
        the diagonal of a (3, 3) ``dt``."""
        return _flat.FlatIter(self)

    @flat.setter
    def flat(self, value) -> None:
        _flat.assign(self, value, sys._getframe(1))

    def transpose(self, *axes) -> "DTensor":
        """numpy.ndarray.transpose: ``dt.transpose()``, ``dt.transpose(1, 0)`` or
        ``dt.transpose((1, 0))``; on more than 2 dims, two ints swap those dims as
        torch's ``transpose(dim0, dim1)`` (NumPy would refuse them). On 2 dims NumPy's
        meaning stays: ``transpose(0, 1)`` is the identity permutation. Shards follow
        their dims. Local.

        Example: ``dt.transpose(1, 0).shape == dt.shape[::-1]`` for a 2-D ``dt``.
        """
        if len(axes) == 0 or (len(axes) == 1 and axes[0] is None):
            axes = None
        elif len(axes) == 1 and not isinstance(axes[0], (int, np.integer)):
            axes = axes[0]
        elif len(axes) == 2 and self.ndim > 2:
            return _method(np.swapaxes, (self, axes[0], axes[1]))
        return _method(np.transpose, (self, axes))

    def swapaxes(self, axis1: int, axis2: int) -> "DTensor":
        """numpy.ndarray.swapaxes (torch's ``transpose(d0, d1)``); Shards follow
        their dims. Local.

        Example: ``dt.swapaxes(0, 2).shape == (4, 3, 2)`` for a ``(2, 3, 4)`` ``dt``.
        """
        return _method(np.swapaxes, (self, axis1, axis2))

    def view(self, *shape) -> "DTensor":
        """torch's ``Tensor.view(*shape)``: :meth:`reshape`, a view of this DTensor
        as NumPy's reshape is. With no argument or a dtype, NumPy's
        ``ndarray.view``: the same elements (read as ``dtype``), sharing this
        DTensor's memory. Collective on the mesh when the elements must move first,
        or for a dtype (the ranks agree on it).

        Example: ``dt.view(-1, 4)`` of an ``(8, 2)`` DTensor has shape ``(4, 4)``;
        ``dt.view(np.int64)`` of a float64 one its bits.
        """
        if not shape or len(shape) == 1 and (shape[0] is None or isinstance(
                shape[0], (type, np.dtype, str))):
            return self._view_as(shape[0] if shape else None, sys._getframe(1))
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        return _method(np.reshape, (self, shape))

    def _view_as(self, dtype, caller) -> "DTensor":
        """NumPy's ``ndarray.view(dtype)``: this DTensor's local array read as
        ``dtype`` (itself for None), the global shape's last dim scaled by the
        itemsizes as NumPy scales it. TypeError for a Partial (the bits of a sum
        are no sum of bits) or a last dim that a mesh dim shards or whose bytes do
        not divide; raised on every rank alike (agreed first)."""
        to = self.dtype if dtype is None else np.dtype(dtype)
        spec = self._spec
        _call_agreement.agree_call("DTensor.view", (self, to.str), {}, caller)
        last = spec.shape[-1] * spec.dtype.itemsize if spec.shape else spec.dtype.itemsize
        if to.itemsize != spec.dtype.itemsize and (
                not spec.shape or last % to.itemsize
                or any(type(p) is Shard and p.dim % len(spec.shape) == len(spec.shape) - 1
                       and spec.mesh.shape[m] > 1 for m, p in enumerate(spec.placements))):
            raise TypeError(f"DTensor.view({to}): a {spec.dtype} DTensor's last dim is "
                            f"sharded or does not hold whole {to} elements; NumPy's view "
                            f"would change its length")
        if to != spec.dtype and any(p.is_partial() for p in spec.placements):
            raise TypeError(f"DTensor.view({to}) of a Partial DTensor: the bits of a sum "
                            f"are not the sum of the bits; redistribute it first")
        if to.itemsize == spec.dtype.itemsize:
            shape, stride = spec.shape, spec.stride
        else:
            shape = spec.shape[:-1] + (last // to.itemsize,)
            stride = contiguous_strides(shape)
        return DTensor(self._data().view(to), DTensorSpec(spec.mesh, spec.placements,
                                                          shape, to, stride))

    def contiguous(self) -> "DTensor":
        """torch's ``Tensor.contiguous()``: itself when its global strides are
        C-contiguous, else a copy whose local array and strides are. Local.

        Example: ``dt.contiguous().stride() == (6, 1)`` for an ``(8, 6)`` ``dt``.
        """
        spec = self._spec
        stride = contiguous_strides(spec.shape)
        if spec.stride == stride and self._data().flags.c_contiguous:
            return self
        return DTensor(np.ascontiguousarray(self._data()),
                       DTensorSpec(spec.mesh, spec.placements, spec.shape, spec.dtype,
                                   stride))

    def float(self) -> "DTensor":
        """torch's ``Tensor.float()``: ``astype(np.float32)``; see :meth:`astype`. Local
        unless a Partial must be reduced first (then collective on the mesh).

        Example: ``dt.float().dtype == np.float32``.
        """
        return self.astype(np.float32)

    def double(self) -> "DTensor":
        """torch's ``Tensor.double()``: ``astype(np.float64)``; see :meth:`astype`. Local
        unless a Partial must be reduced first (then collective on the mesh).

        Example: ``dt.double().dtype == np.float64``.
        """
        return self.astype(np.float64)

    def half(self) -> "DTensor":
        """torch's ``Tensor.half()``: ``astype(np.float16)``; see :meth:`astype`. Local
        unless a Partial must be reduced first (then collective on the mesh).

        Example: ``dt.half().dtype == np.float16``.
        """
        return self.astype(np.float16)

    def type_as(self, other) -> "DTensor":
        """torch's ``Tensor.type_as(other)``: ``astype(other.dtype)``; see
        :meth:`astype`. Local unless a Partial must be reduced first (then
        collective on the mesh).

        Example: ``dt.type_as(other).dtype == other.dtype``.
        """
        return self.astype(other.dtype)

    def pow(self, exponent) -> "DTensor":
        """torch's ``Tensor.pow``: ``numpy.power(self, exponent)``. Collective on
        the mesh when an input must move first, else local.

        Example: ``dt.pow(2)`` equals ``dt * dt``.
        """
        return np.power(self, exponent)

    def expand(self, *sizes) -> "DTensor":
        """torch's ``Tensor.expand(*sizes)``: ``numpy.broadcast_to``, where ``-1``
        keeps a dim's size. Local unless a Shard of a widened dim must be gathered.

        Example: ``dt.expand(3, -1)`` of a ``(1, 4)`` DTensor has shape ``(3, 4)``.
        """
        if len(sizes) == 1 and not isinstance(sizes[0], (int, np.integer)):
            sizes = tuple(sizes[0])
        lead = len(sizes) - self.ndim
        if lead < 0:
            raise ValueError(f"expand: {len(sizes)} sizes for a DTensor of {self.ndim} "
                             f"dims; give at least one per dim")
        shape = tuple(self.shape[d - lead] if n == -1 and d >= lead else int(n)
                      for d, n in enumerate(sizes))
        if any(n < 0 for n in shape):
            raise ValueError(f"expand: -1 is only allowed for an existing dim, got "
                             f"{tuple(sizes)}")
        return _method(np.broadcast_to, (self, shape))

    @property
    def real(self) -> "DTensor":
        """numpy.ndarray.real: the real part, a view as NumPy's (itself for a real
        dtype); placements kept, a Partial(sum|avg) too. Local and not agreed: an
        attribute read, which libraries probe in an order that differs by rank
        (typing's Protocol checks walk a set of names).

        Example: ``z.real[0] = 1.0`` writes into a complex ``z``.
        """
        return _registry.door(np.real, (self,), {})

    @property
    def imag(self) -> "DTensor":
        """numpy.ndarray.imag: the imaginary part, a view as NumPy's (read-only
        zeros for a real dtype); placements kept, a Partial(sum|avg) too. Local
        and not agreed, as :attr:`real`.

        Example: ``(dt * 1j).imag`` equals ``dt`` for a real ``dt``.
        """
        return _registry.door(np.imag, (self,), {})

    def conj(self) -> "DTensor":
        """numpy.ndarray.conj: ``numpy.conjugate(self)`` of a complex DTensor, and
        of any other the DTensor itself, as NumPy returns the array itself (its
        dtype kept, writes into it writing into ``self``). Local unless a
        Partial(max|min) must be reduced.

        Example: ``(dt * 1j).conj().imag`` equals ``-dt``; ``dt.conj() is dt``
        for a real ``dt``.
        """
        if self._spec.dtype.kind != "c":
            return self
        return np.conjugate(self)

    conjugate = conj

    @property
    def device(self) -> _device.device:
        """torch's ``Tensor.device``: a :class:`mpitensor.device` whose ``type`` is
        ``"cpu"`` (``str(dt.device) == "cpu"``); it remembers this DTensor's mesh, so
        that the array API's ``asarray(v, device=dt.device)`` builds on it. Local.

        Example: ``dt.device.type == "cpu"``.
        """
        return _device.on(self._spec.mesh)

    def reshape(self, *shape, order: str = "C") -> "DTensor":
        """numpy.ndarray.reshape: ``dt.reshape(2, -1)`` or ``dt.reshape((2, -1))``;
        see :func:`numpy.reshape` on DTensors (mpitensor._ops._shape.reshape).
        Collective on the mesh when the input must move first, else local.

        Example: ``dt.reshape(2, -1)`` of a ``(4, 6)`` DTensor has shape ``(2, 12)``.
        """
        if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)):
            shape = shape[0]
        if not _registry.ruled(np.reshape):
            # A reshape of this layout that reshaped each rank's block in place
            # before: C agrees on it and makes the view.
            out = _C.block_reshape(np.reshape, self, shape, order, sys._getframe(1))
            if out is not NotImplemented:
                return out
        return _method(np.reshape, (self, shape, order))

    def ravel(self, order: str = "C") -> "DTensor":
        """numpy.ndarray.ravel: ``dt.reshape(-1)``; see :func:`numpy.ravel` on
        DTensors. Collective on the mesh when the input must move first.

        Example::

            >>> distribute_tensor(np.ones((2, 3)), mesh, [Shard(0)]).ravel().shape
            (6,)
        """
        return _method(np.ravel, (self, order))

    def flatten(self, order="C", end_dim: int = -1) -> "DTensor":
        """numpy.ndarray.flatten: a copy as ``dt.reshape(-1)``; with int arguments
        torch's ``flatten(start_dim=0, end_dim=-1)``, which merges the dims from
        ``start_dim`` to ``end_dim`` (a str ``order`` is NumPy's). Collective on the
        mesh when the input must move first.

        Example::

            >>> distribute_tensor(np.ones((2, 3)), mesh, [Shard(0)]).flatten().shape
            (6,)
            >>> distribute_tensor(np.ones((2, 3, 4)), mesh, [Shard(0)]).flatten(1).shape
            (2, 12)
        """
        if isinstance(order, (int, np.integer)) and not isinstance(order, bool):
            n = max(self.ndim, 1)
            start, end = int(order) % n, int(end_dim) % n
            if start > end:
                raise ValueError(f"flatten: start_dim {order} comes after end_dim "
                                 f"{end_dim}")
            shape = self.shape[:start] + (-1,) + self.shape[end + 1:]
            return _method(np.reshape, (self, shape if self.ndim else (1,)))
        if order != "C":
            # NumPy's ravel, which agrees the call before it reads the order (an
            # order one rank alone passes raises on every rank), copied: flatten's
            # result is never a view.
            return _method(np.ravel, (self, order)).copy()
        return _method(np.reshape, (self, -1), {"copy": True})

    def __getitem__(self, key) -> "DTensor":
        """Basic indexing (ints, slices with any step, None, ...), placements as
        torch's select/slice: a Shard of a dim the key cuts becomes Replicate, and
        only the picked elements move. The result is a view, as NumPy's: whatever
        writes into it (item assignment, in-place operators, ``out=``, ``fill``,
        ...) writes into this DTensor on every rank, also where its elements had to
        move (a copy-view, whose local array is read-only; a later write into this
        DTensor is exchanged into it again, so it shows the write as NumPy's view
        would). Collective on the mesh when a sharded dim is
        cut, else local. Other advanced keys (integer DTensors, several arrays) are
        NumPy's indexing on the gathered arrays, copies. Example: ``dt[1:, ::2]``,
        ``dt[..., 0, None]``; ``dt[1][0, 0] = 5.0`` writes ``dt[1, 0, 0]``."""
        if not _registry.ruled(operator.getitem):
            # A key this mesh has seen on this layout, that moves nothing: C agrees
            # on it and makes the view from the kept plan.
            out = _C.basic_view(self, key)
            if out is not NotImplemented:
                return out
        for p in self._spec.placements:  # every key pays for this: no generator
            if type(p) is _StridedShard:
                # Read through a plain copy, as the executor reads a strided operand,
                # and linked back so that a write into a view reaches this DTensor.
                plain = _registry.plain_copy(self)
                out = _registry.door(operator.getitem, (plain, key), {})
                _registry.strided_view(out, plain, self, key)
                return out
        return _registry.door(operator.getitem, (self, key), {})

    def __setitem__(self, key, value) -> None:
        """``dt[key] = value`` in place, placements kept: a basic key (ints, slices,
        None, ...) with a scalar, an ndarray every rank holds or a DTensor value; a
        boolean mask with a scalar or the masked values; a list or integer array
        along one dim (whole slices elsewhere) with a scalar or an ndarray, each
        rank writing the rows it holds. Other keys run NumPy's assignment on the
        gathered arrays, with a GatherWarning. Collective on the mesh: the write is
        agreed, and a DTensor value or mask moves to follow this layout where it
        must.

        Example: ``dt[1:3] = 0.0``; ``dt[dt < 0] = 0``; ``dt[[0, 5]] = 1.0``.
        """
        if not _registry.ruled(operator.setitem) and _C.basic_write(self, key, value) is None:
            # A number through a key this mesh has seen on this layout: C agrees on
            # the write and makes it on each rank's cut.
            return
        # Where the rule does not cover the key, NumPy's assignment on the gathered
        # arrays, written back (a mask with an array of values).
        _registry.door(operator.setitem, (self, key, value), {}, "DTensor item assignment")

    def fill(self, value) -> None:
        """numpy.ndarray.fill: every element set to ``value`` (cast as NumPy
        casts), placements kept. Local.

        Example: ``dt.fill(0.0)``.
        """
        _method(np.copyto, (self, value), {"casting": "unsafe"})

    def astype(self, dtype, copy: bool = True) -> "DTensor":
        """numpy.ndarray.astype, placements kept; a Partial is reduced first unless
        the cast is float/complex to equal or wider (see mpitensor._ops._select).
        Local unless a Partial must be reduced (then collective on the mesh).

        Example: ``dt.astype(np.float32).dtype == np.float32``.
        """
        return _method(np.ndarray.astype, (self, dtype), {"copy": copy})

    def copy(self, order="C") -> "DTensor":
        """numpy.ndarray.copy: a DTensor with its own copy of the local data,
        placements kept. ``order`` is checked as NumPy checks it; every order gives
        the one layout DTensors have (C order on each rank). Local.

        Example: ``dt.copy().to_local() is not dt.to_local()``.
        """
        return _method(np.copy, (self, order))

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
        # Without a mesh there is nothing to agree over: that error stays local.
        mesh = _args.resolve_mesh(device_mesh)
        try:
            source, local_tensor, spec = _from_local_spec(local_tensor, mesh, placements,
                                                          shape, stride)
        except Exception as e:
            # run_check=True is collective: this rank's failure is every rank's.
            if run_check and mesh.get_coordinate() is not None:
                _check_across_ranks(mesh, None, None, False, failure=e)
            raise
        if mesh.get_coordinate() is None:
            out = DTensor(np.empty((0,), spec.dtype), spec)
        else:
            if run_check:
                local_tensor = _check_across_ranks(mesh, local_tensor, spec,
                                                   shape is not None)
            out = DTensor(local_tensor, spec)
        if source is not None and _modes.state.grad_enabled and source._requires_grad:
            _C.record("FromLocal", out, (source,),
                      lambda g, node, output: (_from_local_grad(g, spec, source),))
        return out

    # -- data --------------------------------------------------------------------
    def to_local(self, *, grad_placements: Sequence[Placement] | None = None):
        """This rank's local ndarray (shard, replica or partial value).

        Local, except after ``redistribute(..., async_op=True)``: then the first
        call completes the pending MPI request (collective) and returns the plain
        ndarray; later calls return it at once.

        NumPy arrays carry no autograd graph, so for a tensor that requires grad,
        while grad mode is on, the local data comes back as a DTensor on
        :func:`~mpitensor.device_mesh.local_mesh` (this rank alone, Replicate):
        operations on it are recorded, and :meth:`from_local` takes it back, so
        the gradient flows through the round trip. Its gradient becomes this
        tensor's with ``grad_placements`` (default: this tensor's placements), as
        torch's ``to_local(grad_placements=...)``. ``.detach().to_local()`` or
        ``mpitensor.no_grad()`` give the plain ndarray.

        Example::

            >>> dt.to_local().shape
            (2, 3)
        """
        if _modes.state.grad_enabled and self._requires_grad:
            return self._local_view(grad_placements)
        return self._data()

    # ``_data()`` (the local ndarray, a pending redistribute completed first) is
    # DTensorBase's: the executor's one completion (csrc/ext/ext_request.c).

    def wait(self) -> "DTensor":
        """Completes a pending asynchronous redistribute; returns self. Collective.

        Example::

            >>> dt.redistribute(mesh, [Replicate()], async_op=True).wait()
        """
        self._data()
        return self

    # ``redistribute`` is DTensorBase's (csrc/ext/ext_dtensor.c, with the public
    # docstring): a move decided in the mesh's memo and run by the executor.

    def full_tensor(self, *, grad_placements: Sequence[Placement] | None = None):
        """The whole global array, on every rank of the mesh. Collective on the mesh.

        The same as ``redistribute(placements=[Replicate()] * mesh.ndim)
        .to_local(grad_placements=grad_placements)``: for a tensor that requires
        grad, in grad mode, a DTensor on the local mesh whose gradient comes back
        with ``grad_placements`` (default Replicate; ``[Partial()]`` when each
        rank's gradient is a partial sum) and then to this tensor's placements.
        A rank outside the mesh gets an empty array.

        Example (``mpiexec -n 2``)::

            >>> dt = DTensor.from_local(np.ones(2), mesh, [Shard(0)])
            >>> dt.full_tensor()
            array([1., 1., 1., 1.])
        """
        mesh = self._spec.mesh
        return self.redistribute(mesh, _args.normalize_placements(None, mesh, 0)).to_local(
            grad_placements=grad_placements)

    # -- autograd (the engine is mpitensor.autograd's) ----------------------------
    @property
    def requires_grad(self) -> bool:
        """Whether autograd records operations on this tensor. Local.

        Example: ``zeros(4, requires_grad=True).requires_grad is True``.
        """
        return bool(self._requires_grad)

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        self.requires_grad_(value)

    def requires_grad_(self, requires_grad: bool = True) -> "DTensor":
        """Sets whether autograd records operations on this leaf; returns self. Local.

        Only floating-point and complex tensors can require grad, and only a leaf
        can stop requiring it (RuntimeError otherwise, as torch).

        Example: ``w = distribute_tensor(a, mesh, [Shard(0)]).requires_grad_()``.
        """
        requires_grad = bool(requires_grad)
        if requires_grad and not _dtypes.is_inexact(self._spec.dtype):
            raise RuntimeError(
                f"only DTensors of floating point or complex dtype can require "
                f"gradients, this one has dtype {self._spec.dtype}")
        if not requires_grad and self.grad_fn is not None:
            raise RuntimeError(
                "you can only change requires_grad flags of leaf DTensors; use "
                ".detach() for a DTensor that does not require grad")
        self._requires_grad = requires_grad
        return self

    @property
    def grad(self) -> "DTensor | None":
        """The gradient that backward accumulated into this leaf (or this tensor
        after :meth:`retain_grad`): a DTensor with this tensor's placements (a
        Partial one's is Replicate), or None. Settable (None clears it). Local.

        Example: ``(w * w).sum().backward(); w.grad`` is ``2 * w``.
        """
        grad = getattr(self, "_grad", None)
        if grad is not None:
            self._grad_owned = False  # handed out: the engine no longer writes into it
        return grad

    @grad.setter
    def grad(self, value) -> None:
        if value is not None and (type(value) is not DTensor or value.shape != self.shape):
            raise TypeError(f"grad must be None or a DTensor of shape {self.shape}")
        self._grad, self._grad_owned = value, False

    @property
    def grad_fn(self):
        """The autograd node that made this tensor, or None for a leaf. Local.

        Example: ``(w * 2).grad_fn`` names ``multiply`` when ``w`` requires grad.
        """
        return self._grad_fn

    @property
    def is_leaf(self) -> bool:
        """True unless an operation recorded by autograd made this tensor. Local.

        Example: ``w.is_leaf and not (w * 2).is_leaf`` when ``w`` requires grad.
        """
        return self._grad_fn is None

    def retain_grad(self) -> None:
        """Keeps this non-leaf tensor's gradient in ``.grad`` on backward. Local.

        Example: ``h = w * 2; h.retain_grad(); h.sum().backward(); h.grad``.
        """
        if not self._requires_grad:
            raise RuntimeError("can't retain_grad on a DTensor that has requires_grad=False")
        if self.grad_fn is not None:
            self._retains_grad = True

    def register_hook(self, hook) -> RemovableHandle:
        """Calls ``hook(grad)`` each time backward has computed this tensor's gradient
        (the sum of what reached it), before the gradient goes on (for a leaf: before
        it is accumulated into ``.grad``); a non-None result, a DTensor of the same
        shape and dtype, replaces the gradient. Hooks run in the order registered,
        each given the previous one's result (torch's ``Tensor.register_hook``).
        Returns a handle whose ``remove()`` takes the hook out. Registering is
        local; a backward that runs hooks agrees on their outcome on the tensor's
        mesh, so a hook that raises on one rank raises on every rank (see
        docs/training.md). The hook may keep the gradient it is given: the engine
        never writes into it afterwards.

        Example::

            >>> w = distribute_tensor(np.ones(4), mesh, [Shard(0)], requires_grad=True)
            >>> h = w.register_hook(lambda g: g * 2)
            >>> (w * w).sum().backward()
            >>> w.grad.full_tensor()
            array([4., 4., 4., 4.])
            >>> h.remove()
        """
        if not self._requires_grad:
            raise RuntimeError(
                "cannot register a hook on a tensor that doesn't require gradient")
        if not callable(hook):
            raise TypeError(f"a hook must be callable, got {type(hook).__name__}")
        hooks = getattr(self, "_backward_hooks", None)
        if hooks is None:
            hooks = self._backward_hooks = OrderedDict()
        return add_hook(hooks, hook)

    def register_post_accumulate_grad_hook(self, hook) -> RemovableHandle:
        """Calls ``hook(tensor)`` on this leaf after backward has accumulated its
        gradient into ``.grad`` (torch's hook of the same name: an optimizer can
        step the parameter there). The hook returns None. Only leaves accept it.
        Local to register; the backward agrees on the hooks' outcome on the mesh
        as for :meth:`register_hook`.

        Example::

            >>> seen = []
            >>> h = w.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad))
            >>> (w * w).sum().backward()       # seen holds w.grad
            >>> h.remove()
        """
        if not self._requires_grad:
            raise RuntimeError(
                "cannot register a hook on a tensor that doesn't require gradient")
        if self._grad_fn is not None:
            raise RuntimeError(
                "post accumulate grad hooks cannot be registered on non-leaf tensors")
        if not callable(hook):
            raise TypeError(f"a hook must be callable, got {type(hook).__name__}")
        hooks = getattr(self, "_post_accumulate_grad_hooks", None)
        if hooks is None:
            hooks = self._post_accumulate_grad_hooks = OrderedDict()
        return add_hook(hooks, hook)

    def detach(self) -> "DTensor":
        """The same data and spec, out of the graph: a leaf that does not require
        grad. Shares the local array. Local (unless a redistribute is pending).

        Example: ``loss.detach().to_local()`` is the plain ndarray.
        """
        return DTensor(self._data(), self._spec)

    def backward(self, gradient: "DTensor | None" = None, retain_graph: bool | None = None
                 ) -> None:
        """Accumulates the gradient of this tensor into the ``.grad`` of the leaves
        that require grad. A scalar needs no ``gradient``; otherwise pass a DTensor
        of this shape. Collective on the mesh (the backward's redistributions).
        ``retain_graph=True`` keeps the graph for another backward.

        Example::

            >>> w = distribute_tensor(np.ones(4), mesh, [Shard(0)]).requires_grad_()
            >>> (w * w).sum().backward()
            >>> w.grad.full_tensor()
            array([2., 2., 2., 2.])
        """
        _modes.autograd.backward([self], [gradient], retain_graph)

    def _local_view(self, grad_placements) -> "DTensor":
        """to_local() in grad mode: the local array on the local mesh, recorded."""
        spec = self._spec
        grad_pl = spec.placements if grad_placements is None else \
            _args.normalize_placements(grad_placements, spec.mesh, len(spec.shape))
        local = self._data()
        lmesh = local_mesh()
        out = DTensor(local, DTensorSpec(lmesh, (Replicate(),), local.shape, local.dtype,
                                         contiguous_strides(local.shape)))
        _C.record("ToLocal", out, (self,),
                  lambda g, node, output: (_to_local_grad(g, spec, grad_pl),))
        return out

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

    # -- NumPy methods that have a function form ------------------------------------
    def cumsum(self, axis=None, dtype=None, out=None) -> "DTensor":
        """numpy.ndarray.cumsum; see numpy.cumsum on DTensors. Local along an
        unsharded axis, else collective (one exclusive scan along a sharded one).

        Example: ``dt.cumsum(0).placements == dt.placements`` for a Shard(0) ``dt``.
        """
        return _method(np.cumsum, (self, axis, dtype, out))

    def cumprod(self, axis=None, dtype=None, out=None) -> "DTensor":
        """numpy.ndarray.cumprod; see numpy.cumprod on DTensors. Local along an
        unsharded axis, else collective on the mesh.

        Example: ``dt.cumprod(1)`` of a Shard(0) DTensor moves nothing.
        """
        return _method(np.cumprod, (self, axis, dtype, out))

    def argsort(self, axis=-1, kind=None, order=None, **kwargs) -> "DTensor":
        """numpy.ndarray.argsort; see numpy.argsort on DTensors. Local along an
        unsharded axis, else collective on the mesh (the shard moves to a free dim).

        Example: ``dt.argsort(axis=1)`` of a Shard(0) DTensor moves nothing.
        """
        return _method(np.argsort, (self, axis, kind, order), kwargs)

    def round(self, decimals=0, out=None) -> "DTensor":
        """numpy.ndarray.round, placements kept (a Partial is reduced first). Local
        otherwise.

        Example: ``dt.round(2).placements == dt.placements`` for a Shard ``dt``.
        """
        return _method(np.round, (self, decimals, out))

    def clip(self, min=None, max=None, out=None, **kwargs) -> "DTensor":  # noqa: A002
        """numpy.ndarray.clip; see numpy.clip on DTensors. Local (a Partial is
        reduced first).

        Example: ``dt.clip(0, 1).placements == dt.placements`` for a Shard ``dt``.
        """
        return _method(np.clip, (self, min, max, out), kwargs)

    def take(self, indices, axis=None, out=None, mode="raise") -> "DTensor":
        """numpy.ndarray.take; see numpy.take on DTensors. Collective on the mesh
        when the taken axis is sharded.

        Example: ``dt.take([0, 2], axis=1)``.
        """
        return _method(np.take, (self, indices, axis, out, mode))

    def compress(self, condition, axis=None, out=None) -> "DTensor":
        """numpy.ndarray.compress: ``numpy.compress(condition, self, axis, out)``.
        Collective on the mesh when the selected axis is sharded.

        Example: ``dt.compress([True, False, True], axis=0)``.
        """
        return _method(np.compress, (condition, self, axis, out))

    def choose(self, choices, out=None, mode="raise") -> "DTensor":
        """numpy.ndarray.choose; see numpy.choose on DTensors. Local when the choices
        are laid out as this DTensor, else collective on the mesh.

        Example: ``dt.choose([a, b])`` for a ``dt`` of zeros and ones.
        """
        return _method(np.choose, (self, choices, out, mode))

    def nonzero(self) -> tuple:
        """numpy.ndarray.nonzero: the indices of the nonzero elements, a tuple of
        one DTensor per dim, as NumPy's. Collective on the mesh.

        Example: ``dt.nonzero()[0]`` holds the rows of the nonzero elements.
        """
        return _method(np.nonzero, (self,))

    def searchsorted(self, v, side="left", sorter=None) -> "DTensor":
        """numpy.ndarray.searchsorted; see numpy.searchsorted on DTensors.
        Collective on the mesh when this DTensor is sharded.

        Example: ``dt.searchsorted(2.5)`` for a sorted 1-D ``dt``.
        """
        return _method(np.searchsorted, (self, v, side, sorter))

    def repeat(self, repeats, axis=None) -> "DTensor":
        """numpy.ndarray.repeat (each element repeated, as NumPy's; torch's
        ``repeat`` is ``numpy.tile``). Local along an unsharded axis.

        Example: ``dt.repeat(2, axis=1).shape == (dt.shape[0], 2 * dt.shape[1])``.
        """
        return _method(np.repeat, (self, repeats, axis))

    def squeeze(self, axis=None) -> "DTensor":
        """numpy.ndarray.squeeze; see numpy.squeeze on DTensors. Local.

        Example: ``dt.squeeze(0).shape == dt.shape[1:]`` when ``dt.shape[0] == 1``.
        """
        return _method(np.squeeze, (self, axis))

    def diagonal(self, offset=0, axis1=0, axis2=1) -> "DTensor":
        """numpy.ndarray.diagonal; see numpy.diagonal on DTensors. Collective on
        the mesh when the two axes' shards must meet.

        Example: ``dt.diagonal()`` of a square ``dt``.
        """
        return _method(np.diagonal, (self, offset, axis1, axis2))

    def trace(self, offset=0, axis1=0, axis2=1, dtype=None, out=None) -> "DTensor":
        """numpy.ndarray.trace; see numpy.trace on DTensors. Collective on the
        mesh when the two axes' shards must meet or a sum is reduced.

        Example: ``float(dt.trace())`` is the sum of the diagonal.
        """
        return _method(np.trace, (self, offset, axis1, axis2, dtype, out))

    def dot(self, b, out=None) -> "DTensor":
        """numpy.ndarray.dot; see numpy.dot on DTensors. Collective on the mesh
        when an operand moves or a Partial sum is reduced.

        Example: ``a.dot(b)`` equals ``a @ b`` for 2-D DTensors.
        """
        return _method(np.dot, (self, b, out))

    def argpartition(self, kth, axis=-1, kind="introselect", order=None) -> "DTensor":
        """numpy.ndarray.argpartition; see numpy.argpartition on DTensors. Local
        along an unsharded axis, else collective on the mesh.

        Example: ``dt.argpartition(1, axis=1)``.
        """
        return _method(np.argpartition, (self, kth, axis, kind, order))

    def sort(self, axis=-1, kind=None, order=None, *, stable=None) -> None:
        """numpy.ndarray.sort: sorts in place (numpy.sort written back into this
        DTensor, its placements kept). Collective on the mesh when the sorted axis
        is sharded.

        Example: ``dt.sort(axis=0)``.
        """
        kwargs = {} if stable is None else {"stable": stable}
        self[...] = _method(np.sort, (self, axis, kind, order), kwargs)

    def partition(self, kth, axis=-1, kind="introselect", order=None) -> None:
        """numpy.ndarray.partition: partitions in place (numpy.partition written
        back into this DTensor, its placements kept). Local along an unsharded
        axis, else collective on the mesh.

        Example: ``dt.partition(2)`` puts the third smallest of each row third.
        """
        self[...] = _method(np.partition, (self, kth, axis, kind, order))

    def put(self, indices, values, mode="raise") -> None:
        """numpy.ndarray.put; see numpy.put on DTensors (in place). Collective on
        the mesh when the values move to their owners.

        Example: ``dt.put([0, 5], [1.0, 2.0])``.
        """
        _method(np.put, (self, indices, values, mode))

    def tobytes(self, order="C") -> bytes:
        """numpy.ndarray.tobytes of the whole array on every rank: gathered, as the
        fallback gathers (counted and warned). Collective on the mesh.

        Example: ``np.frombuffer(dt.tobytes(), dt.dtype)``.
        """
        return _registry.gather_call(np.ndarray.tobytes, (self.detach(),),
                                     {"order": order}, "numpy.ndarray.tobytes")

    @property
    def itemsize(self) -> int:
        """Bytes of one element, as numpy.ndarray.itemsize. Local.

        Example: ``dt.astype(np.float32).itemsize == 4``.
        """
        return self._spec.dtype.itemsize

    def __contains__(self, value) -> bool:
        """``value in dt``: ``bool((dt == value).any())``, as NumPy's. Collective.

        Example: ``3.0 in distribute_tensor(np.arange(4.0), mesh, [Shard(0)])``.
        """
        return bool((self == value).any())

    # -- conversions to Python values (collective) ----------------------------------
    def _scalar(self, convert):
        """``convert`` (float, int, bool, complex) of the one element, by NumPy's
        rule for an array of this shape: a shape NumPy refuses raises NumPy's own
        error on every rank alike (the global shape decides) before anything moves."""
        if self.size != 1 or self.ndim > 0:
            # NumPy's rules for float/int/complex (0-d only) and bool (size 1).
            convert(np.broadcast_to(np.zeros((), self.dtype), self.shape))
        # A Python number carries no graph (torch's item() neither): detached, the
        # whole tensor is an ndarray even for a tensor that records in grad mode.
        value = self.detach().full_tensor()
        if self.device_mesh.get_coordinate() is None:
            raise RuntimeError(f"{getattr(convert, '__name__', 'item')}() of a DTensor "
                               f"on a rank outside its mesh: this rank holds no data")
        return convert(value)

    def __float__(self) -> float:
        """float(dt) of a 0-d DTensor, on every rank (NumPy's rule: other shapes are
        a TypeError). Collective on the mesh.

        Example: ``float(distribute_tensor(np.arange(4.0), mesh, [Shard(0)]).sum()) == 6.0``.
        """
        return self._scalar(float)

    def __int__(self) -> int:
        """int(dt) of a 0-d DTensor, on every rank. Collective on the mesh.

        Example: ``int(distribute_tensor(np.arange(4), mesh, [Shard(0)]).max()) == 3``.
        """
        return self._scalar(int)

    def __complex__(self) -> complex:
        """complex(dt) of a 0-d DTensor, on every rank. Collective on the mesh.

        Example: ``complex(distribute_tensor(np.array([1j, 2]), mesh).sum()) == 2 + 1j``.
        """
        return self._scalar(complex)

    def __bool__(self) -> bool:
        """bool(dt) of a one-element DTensor, on every rank; ValueError for more
        elements, as NumPy. Collective on the mesh.

        Example: ``bool(distribute_tensor(np.array([0.0]), mesh)) is False``.
        """
        return self._scalar(bool)

    def item(self, *args):
        """numpy.ndarray.item: the element as a Python scalar on every rank; with an
        index (flat int, or one int per dim) only that element moves. Collective on
        the mesh.

        Example: ``distribute_tensor(np.arange(6.0), mesh, [Shard(0)]).item(4) == 4.0``.
        """
        if not args:
            return self._scalar(lambda x: x.item())
        index = args[0] if len(args) == 1 else args
        if isinstance(index, (int, np.integer)):
            if self.size == 0 or not -self.size <= index < self.size:
                raise IndexError(f"index {index} is out of bounds for size {self.size}")
            index = np.unravel_index(int(index) % self.size, self.shape)
        index = tuple(int(i) for i in index)
        if len(index) != self.ndim:
            raise ValueError("incorrect number of indices for array")
        return self[index]._scalar(lambda x: x.item())

    def tolist(self):
        """numpy.ndarray.tolist of the whole array, on every rank: the array is
        gathered (all of it has to become Python objects on each rank). Collective
        on the mesh.

        Example: ``distribute_tensor(np.arange(4), mesh, [Shard(0)]).tolist() == [0, 1, 2, 3]``.
        """
        spec = self._spec
        dims = [m for m, p in enumerate(spec.placements)
                if p.is_shard() and spec.mesh.shape[m] > 1]
        if dims:
            _trace.report_gather("DTensor.tolist", spec,
                                 (Replicate(),) * len(spec.placements), dims)
        # detached: in grad mode full_tensor records and gives a DTensor, whose
        # tolist would call this again
        full = self.detach().full_tensor()
        if self.device_mesh.get_coordinate() is None:
            raise RuntimeError("tolist() of a DTensor on a rank outside its mesh: this "
                               "rank holds no data")
        return full.tolist()

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
        :func:`_rebuild`). A leaf that requires grad comes back as one. Local."""
        mesh = self.device_mesh
        coordinate = mesh.get_coordinate()
        return _rebuild, (self._data(), self.placements, self.shape, self.stride(),
                          self.dtype, mesh.device_type, mesh.mesh.copy(),
                          mesh.mesh_dim_names,
                          None if coordinate is None else tuple(coordinate),
                          bool(self._requires_grad))

    def __array__(self, dtype=None, copy=None):
        """``np.asarray(dt)``, ``np.array(dt)``: the whole global array on every rank,
        a new ndarray, through the fallback's gather (agreed, counted by
        CommDebugMode, a ``GatherWarning`` once), as SciPy, xarray, pandas and
        matplotlib expect of an array they do not know. ``mpitensor.strict()``
        makes it a TypeError; ``copy=False`` is NumPy's ValueError (the array is
        always new). Collective on the mesh: every rank must convert.

        Example: ``np.asarray(dt)`` equals ``dt.full_tensor()``.
        """
        if copy is False:
            raise ValueError("a DTensor's global array is gathered into a new ndarray: "
                             "it cannot be returned without a copy (copy=False)")
        if _modes.state.grad_enabled and self._requires_grad:
            # An ndarray would drop the gradient with no error, as torch refuses
            # .numpy() of a tensor that requires grad.
            raise TypeError("np.asarray of a DTensor that requires grad would lose its "
                            "gradient; call .detach() first, or .full_tensor() for the "
                            "whole array as a DTensor")
        name = "numpy.asarray"
        try:
            got = _registry.gather_call(np.array, (self,), {} if dtype is None
                                        else {"dtype": dtype}, name)
        except _registry.NoRule:
            raise TypeError(
                "np.asarray(dt) would gather the whole array, which mpitensor.strict() "
                "refuses: call .full_tensor() for the whole array on every rank, or "
                ".to_local() for this rank's shard") from None
        return got.to_local() if type(got) is DTensor else got

    # -- the array API standard (the namespace is mpitensor.array_api) -----------------
    def __array_namespace__(self, *, api_version: str | None = None):
        """The array API namespace, ``mpitensor.array_api``: standard 2024.12, as
        NumPy's, and 2025.12 (whose functions it has: ``isin``, ``broadcast_shapes``,
        ``linalg.eig``, ...) for ``api_version="2025.12"``; an older
        ``api_version`` is served by the same functions. Local.

        Example: ``xp = dt.__array_namespace__(api_version="2025.12"); xp.isin(dt, 3)``.
        """
        if api_version not in (None, "2021.12", "2022.12", "2023.12", "2024.12", "2025.12"):
            raise ValueError(f"api_version {api_version!r} is not one of the standard's")
        return _registry.array_namespace

    @property
    def mT(self) -> "DTensor":
        """The standard's ``mT``: the last two dims swapped. Local.

        Example: ``dt.mT.shape == (3, 2)`` for a (2, 3) ``dt``.
        """
        return self.swapaxes(-1, -2)

    def to_device(self, device, /, *, stream=None) -> "DTensor":
        """The standard's ``to_device``: the CPU (or this DTensor's own mesh) is where
        it is already, so it comes back as itself. Local.

        Example: ``dt.to_device("cpu") is dt``.
        """
        if not (device is self._spec.mesh or device == self._spec.mesh):
            _device.device(device)  # ValueError for another device
        return self

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # DLPack's kDLCPU: every array lives in host memory

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """DLPack of the whole array, so that a consumer sees the global values on
        every rank, as ``np.from_dlpack(dt)``: the local array of a replicated
        DTensor (no copy), else the array gathered on every rank. Collective on the
        mesh unless replicated.

        Example: ``np.from_dlpack(dt)`` equals ``dt.full_tensor()``.
        """
        whole = self._data() if all(p.is_replicate() for p in self.placements) \
            else self.redistribute(self._spec.mesh, [Replicate()] * self._spec.mesh.ndim)._data()
        kwargs = {} if max_version is None else {"max_version": max_version}
        return whole.__dlpack__(stream=stream, dl_device=dl_device, copy=copy, **kwargs)

    def __index__(self) -> int:
        if self.dtype.kind not in "iu" or self.ndim:
            raise TypeError("only 0-d integer arrays can be converted to an index")
        return int(self)

    def __repr__(self) -> str:
        # Never communicates: printing on one rank must not wait for the others.
        return (f"DTensor(local_tensor={self._local_tensor!r}, "
                f"device_mesh={self.device_mesh!r}, placements={self.placements!r}, "
                f"shape={self.shape}, dtype={self.dtype})")


# The executor makes DTensors, specs, autograd nodes and placements of these types
# (placements are interned: these are the objects Replicate(), Shard(d) and
# Partial(op) return); the Python door takes DTensor operands of this class.
_C.dispatch_init(DTensor, DTensorSpec, Node, _comm.Request, _deferred.Deferred, Replicate(),
                 tuple(Shard(d) for d in range(_clib.MAX_NDIM)),
                 tuple(Partial(op) for op in _clib.CORE.REDUCE_OPS), _strided_shard)
_registry.dtensor_type = DTensor


def _method(func, args: tuple, kwargs: dict | None = None, name: str | None = None):
    """One of DTensor's NumPy methods: ``func(*args, **kwargs)`` as
    NumPy's function is called, agreed first when the program calls it (the frame
    two up, the method's caller), then its rule, else the warned gather under
    ``name``. So ``x.cumsum(axis=a)`` with another ``a`` on some rank is the same
    ValueError on every rank, as ``np.cumsum`` is. Collective on the mesh when the
    call is agreed or moves data.

    Example: ``_method(np.cumsum, (dt, 0, None, None))``.
    """
    return _registry.door(func, args, kwargs or {}, name, sys._getframe(2))


def _rebuild(local, placements, shape, stride, dtype, device_type, ranks, names,
             coordinate=None, requires_grad=False):
    """Unpickles a DTensor onto an equal live mesh (creating one would be collective,
    which pickle.load must never be), else gives a :class:`DTensorShard`, since
    unpickling may run where no mesh can exist (a Jupyter client) inside a callback
    that cannot report an error. Local. ValueError when the local array is not this
    rank's shard (a pickle made on another rank)."""
    ranks = np.asarray(ranks)
    mesh = find_live_mesh(device_type, ranks, names)
    if mesh is None:
        return DTensorShard(local, placements, shape, stride, dtype, device_type, ranks,
                            names, None if coordinate is None else tuple(coordinate),
                            requires_grad)
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
    out = DTensor(local, spec)
    if requires_grad:  # a leaf again, as torch.load gives a parameter back
        out._requires_grad = True
    return out


# A shard pickled again (pushed back to its engine) is a DTensor where its mesh exists.
copyreg.pickle(DTensorShard, lambda shard: (_rebuild, shard._pickle_args()))


# -- backward rules of DTensor's own differentiable methods (run by the engine in
# mpitensor.autograd with grad mode off) ---------------------------------------------

def _redistribute_args(dt, mesh, placements, forward_dtype, backward_dtype) -> tuple:
    """redistribute's arguments that are not the interned placements of its mesh,
    normalised for the executor (its "placements" hook): (placements, forward
    dtype, backward dtype), or torch's errors. Local."""
    if mesh is not None and mesh is not dt.device_mesh and mesh != dt.device_mesh:
        raise NotImplementedError(
            "redistribute between different device meshes is not supported; the "
            f"DTensor lives on {dt.device_mesh}, the target is {mesh}")
    if placements is None:
        raise RuntimeError("placements is needed for redistribute!")
    spec = dt._spec
    dst = _args.normalize_placements(placements, spec.mesh, len(spec.shape))
    fwd = None if forward_dtype is None else _args.check_dtype(forward_dtype)
    bwd = None if backward_dtype is None else _args.check_dtype(backward_dtype)
    return dst, fwd, bwd


_C.set_hook("placements", _redistribute_args)

def _grad_placements(placements) -> tuple:
    """Where a gradient goes back to: the forward placements, but a Partial's
    gradient is Replicate (the same value reaches every term of the sum; torch's
    rule, and no communication)."""
    return tuple(Replicate() if p.is_partial() else p for p in placements)


def _redistribute_grad(g: "DTensor", node, out) -> tuple:
    """redistribute's backward: the gradient back to the input's placements (a
    Partial input's: Replicate) and dtype; with ``backward_dtype`` (node.aux),
    each rank's part is cast before (a Partial's parts too: torch's rule, so the
    collective moves that dtype)."""
    spec, (backward_dtype,) = node.saved[0]._spec, node.aux
    return (_redistribute_back(g, spec, backward_dtype),)


def _redistribute_back(g: "DTensor", spec: DTensorSpec, backward_dtype) -> "DTensor":
    if backward_dtype is not None and g.dtype != backward_dtype:
        s = g._spec
        g = DTensor(g._data().astype(backward_dtype),
                    DTensorSpec(s.mesh, s.placements, s.shape, backward_dtype, s.stride))
    g = _moved_back(g, spec)
    return g if g.dtype == spec.dtype else g.astype(spec.dtype)


def _moved_back(g: "DTensor", spec: DTensorSpec) -> "DTensor":
    """``g`` redistributed to the gradient placements of ``spec``; ``g`` itself when
    it is there already (a decision on the specs, so every rank takes it), without
    the agreement over the mesh that an explicit redistribute makes."""
    target = _grad_placements(spec.placements)
    if g._spec.mesh is spec.mesh and g._spec.placements == target:
        return g
    return g.redistribute(spec.mesh, target)


def _to_local_grad(g: "DTensor", spec: DTensorSpec, grad_placements) -> "DTensor":
    """to_local's backward: the local gradient is this rank's part of a DTensor
    with ``grad_placements``. No communication."""
    local = g._data()
    if local.dtype != spec.dtype:
        local = local.astype(spec.dtype)
    return DTensor.from_local(local, spec.mesh, grad_placements, shape=spec.shape,
                              stride=spec.stride)


def _from_local_grad(g: "DTensor", spec: DTensorSpec, source: "DTensor") -> "DTensor":
    """from_local's backward: the gradient redistributed to the forward placements
    (a Partial's: Replicate), this rank's part as a DTensor on the local mesh."""
    if spec.mesh.get_coordinate() is None:
        local = np.zeros(source.shape, source.dtype)
    else:
        local = _moved_back(g, spec)._data().astype(source.dtype, copy=False)
    return DTensor(local, source._spec)


def _from_local_spec(local_tensor, mesh, placements, shape, stride):
    """from_local's local checks: (the local DTensor it came from or None, the
    local ndarray, the spec). Local."""
    source = None
    if type(local_tensor) is DTensor:
        if local_tensor._spec.mesh is not local_mesh():
            raise TypeError(
                "from_local takes a NumPy ndarray, or the local DTensor that "
                "to_local() gives of a tensor that requires grad (it lives on "
                f"mpitensor's local mesh); got a DTensor on {local_tensor.device_mesh}")
        source, local_tensor = local_tensor, local_tensor._data()
    elif not isinstance(local_tensor, np.ndarray):
        raise TypeError(
            f"from_local takes a NumPy ndarray, got {type(local_tensor).__name__}"
        )
    _args.reject_masked(local_tensor, "DTensor.from_local")
    dtype = _args.check_dtype(local_tensor.dtype)
    pl = _args.normalize_placements(placements, mesh, local_tensor.ndim)
    gshape, gstride = _global_shape_and_stride(local_tensor, mesh, pl, shape, stride)
    _args.check_extent(gshape, gstride, dtype)
    return source, local_tensor, DTensorSpec(mesh, pl, gshape, dtype, gstride)


def _global_shape_and_stride(local, mesh, placements, shape, stride):
    if (shape is None) != (stride is None):
        raise ValueError(
            "from_local needs both `shape` and `stride` or neither: pass both when the "
            "local shards are uneven"
        )
    if shape is not None:
        gshape = _args.check_shape(shape, local.ndim)
        return gshape, _args.check_stride(stride, len(gshape))
    # An even strided shard scales its dim as a Shard of it does.
    even = tuple(Shard(p.dim) if isinstance(p, _StridedShard) else p for p in placements)
    gshape = core.even_global_shape(local.shape, tuple(mesh.shape), _codes(even))
    return gshape, _global_stride(local, mesh, placements, gshape)


def _global_stride(local, mesh, placements, gshape):
    """torch's from_local strides: the local array's element strides, each stride at
    least a shard dim's own scaled by that mesh dim's size (so a permuted local
    layout gives the permuted global one); C-contiguous (or negative, or not whole
    elements) strides give contiguous global strides."""
    size = local.itemsize
    if local.flags.c_contiguous or any(s <= 0 or s % size for s in local.strides):
        return contiguous_strides(gshape)
    stride = [s // size for s in local.strides]
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            for i in range(len(stride)):
                if i != p.dim and stride[i] >= stride[p.dim]:
                    stride[i] *= mesh.shape[m]
    return tuple(stride)


def _check_across_ranks(mesh, local, spec, shape_given: bool, failure=None):
    """run_check: compare with the mesh's first rank, agree on a verdict, then
    broadcast Replicate dims. ``failure``: this rank's local checks raised it (no
    ``local`` or ``spec`` then), and it becomes every rank's exception. Collective on
    the mesh."""
    if _modes.tracing:
        # No shape here: a shape that differs is what run_check itself reports.
        _trace.collective("DTensor.from_local(run_check=True)", mesh,
                          None if spec is None else spec.placements, None, None)
    mine = (np.full(3 + 2 * _clib.MAX_NDIM, -1, np.int64) if failure is not None
            else _meta_record(local, spec.shape, spec.placements))
    root = mine.copy()
    for d in range(mesh.ndim):
        _comm.bcast(mesh, root, d)
    if failure is not None:
        _args.raise_on_every_rank(mesh, failure)
    problem = _meta_problem(local, spec, mine, root, shape_given)
    # The first rank that found a problem tells every rank what it is.
    _comm.agree(mesh, problem is None, 0,
             "DTensor.from_local(run_check=True): the local tensors do not fit one "
             "global tensor: " + (problem or ""), ValueError)
    copied = False
    for d, p in enumerate(spec.placements):
        if p.is_replicate() and mesh.shape[d] > 1:
            if not copied:
                local, copied = np.array(local, order="C", copy=True), True
            _comm.bcast(mesh, local, d)
    return local


def _meta_record(local: np.ndarray, gshape, placements) -> np.ndarray:
    """dtype, ndim, local shape, global shape and a checksum of the placements
    packed as int64 for a broadcast. Placements that differ across ranks would make
    the ranks' next collectives differ, i.e. hang, so they are checked too."""
    rec = np.zeros(3 + 2 * _clib.MAX_NDIM, dtype=np.int64)
    rec[-1] = fingerprint(tuple(placements))
    rec[0] = int.from_bytes(local.dtype.str.encode().ljust(8)[:8], "little", signed=True)
    rec[1] = local.ndim
    rec[2:2 + local.ndim] = local.shape
    rec[2 + _clib.MAX_NDIM:2 + _clib.MAX_NDIM + len(gshape)] = gshape
    return rec


def _meta_problem(local, spec, mine, root, shape_given):
    if mine[0] != root[0] or mine[1] != root[1]:
        return f"dtype {local.dtype} or ndim {local.ndim} differs from the first rank's"
    if mine[-1] != root[-1]:
        return (f"placements {list(spec.placements)} on rank {spec.mesh.get_rank()} "
                f"differ from the first rank's")
    if shape_given:
        if not np.array_equal(mine[2 + _clib.MAX_NDIM:-1], root[2 + _clib.MAX_NDIM:-1]):
            return f"shape {spec.shape} differs from the first rank's"
        expect, _ = compute_local_shape_and_global_offset(
            spec.shape, spec.mesh, spec.placements)
        if tuple(local.shape) != tuple(expect):
            return (f"local shape {local.shape} on rank {spec.mesh.get_rank()} is not "
                    f"its shard {tuple(expect)} of the global shape {spec.shape}")
    elif not np.array_equal(mine[2:2 + _clib.MAX_NDIM], root[2:2 + _clib.MAX_NDIM]):
        return (f"local shape {local.shape} on rank {spec.mesh.get_rank()} differs from "
                f"the first rank's; pass shape= and stride= for uneven shards")
    return None

